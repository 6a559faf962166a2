// addrinfo_test.cc: RDMACM_1.4 (rdma-core v64) as its man pages describe
// it: rdma_resolve_addrinfo's result as an event (ADDRINFO_RESOLVED, or
// ADDRINFO_ERROR with the errno) on an async id and inside the call on a
// sync id, rdma_query_addrinfo handing the list over once, EBUSY while one
// is pending, RAI_SA refused at the call; rdma_write_cm_event's
// RDMA_CM_EVENT_USER with its status and argument, and nothing else.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <rdma/rdma_cma.h>

#include <cerrno>
#include <cstring>

#include "common/verbs_current.h"

extern "C" {
int rdma_resolve_addrinfo(rdma_cm_id* id, const char* node, const char* service, const rdma_addrinfo* hints);
int rdma_query_addrinfo(rdma_cm_id* id, rdma_addrinfo** info);
int rdma_write_cm_event(rdma_cm_id* id, rdma_cm_event_type event, int status, uint64_t arg);
}

namespace rdmacm_addrinfo {
namespace {

namespace abi = ::sv::abi;
const auto kResolved = rdma_cm_event_type(abi::kCmEventAddrinfoResolved);
const auto kError = rdma_cm_event_type(abi::kCmEventAddrinfoError);
const auto kUser = rdma_cm_event_type(abi::kCmEventUser);

struct AsyncId {
  rdma_event_channel* ch = rdma_create_event_channel();
  rdma_cm_id* id = nullptr;
  AsyncId() {
    if (ch) rdma_create_id(ch, &id, nullptr, RDMA_PS_TCP);
  }
  ~AsyncId() {
    if (id) rdma_destroy_id(id);
    if (ch) rdma_destroy_event_channel(ch);
  }
  // The next event's type and status (-1: none).
  int next(int* status = nullptr, uint64_t* arg = nullptr) {
    rdma_cm_event* e = nullptr;
    if (rdma_get_cm_event(ch, &e)) return -1;
    int t = sv::abi::cm_event_type(*e);
    if (status) *status = e->status;
    if (arg) std::memcpy(arg, &e->param, sizeof(*arg));
    EXPECT_EQ(id, e->id);
    rdma_ack_cm_event(e);
    return t;
  }
};

uint32_t dst_ipv4(const rdma_addrinfo* ai) {
  if (!ai || !ai->ai_dst_addr || ai->ai_dst_addr->sa_family != AF_INET) return 0;
  return ntohl(reinterpret_cast<const sockaddr_in*>(ai->ai_dst_addr)->sin_addr.s_addr);
}

TEST(ResolveAddrinfo, AsyncResultByEvent) {
  AsyncId a;
  ASSERT_NE(nullptr, a.id);
  rdma_addrinfo hints{};
  hints.ai_flags = RAI_NUMERICHOST;
  ASSERT_EQ(0, rdma_resolve_addrinfo(a.id, "127.0.0.1", "7471", &hints));
  errno = 0;
  EXPECT_EQ(-1, rdma_resolve_addrinfo(a.id, "127.0.0.1", "7471", &hints));  // one at a time
  EXPECT_EQ(EBUSY, errno);
  int status = -1;
  EXPECT_EQ(int(kResolved), a.next(&status));
  EXPECT_EQ(0, status);
  rdma_addrinfo* ai = nullptr;
  ASSERT_EQ(0, rdma_query_addrinfo(a.id, &ai));
  EXPECT_EQ(INADDR_LOOPBACK, dst_ipv4(ai));
  EXPECT_EQ(7471, ntohs(reinterpret_cast<sockaddr_in*>(ai->ai_dst_addr)->sin_port));
  rdma_freeaddrinfo(ai);
  errno = 0;
  EXPECT_EQ(-1, rdma_query_addrinfo(a.id, &ai));  // handed over already
  EXPECT_EQ(ENOENT, errno);
  // Free again: a second resolution may start.
  ASSERT_EQ(0, rdma_resolve_addrinfo(a.id, "127.0.0.1", nullptr, &hints));
  EXPECT_EQ(int(kResolved), a.next());
}

TEST(ResolveAddrinfo, FailureByEvent) {
  AsyncId a;
  ASSERT_NE(nullptr, a.id);
  rdma_addrinfo hints{};
  hints.ai_flags = RAI_NUMERICHOST;
  ASSERT_EQ(0, rdma_resolve_addrinfo(a.id, "300.1.2.3", "7471", &hints));
  int status = 0;
  EXPECT_EQ(int(kError), a.next(&status));
  EXPECT_NE(0, status);
  rdma_addrinfo* ai = nullptr;
  errno = 0;
  EXPECT_EQ(-1, rdma_query_addrinfo(a.id, &ai));
  EXPECT_EQ(ENOENT, errno);
  ASSERT_EQ(0, rdma_resolve_addrinfo(a.id, "127.0.0.1", "1", &hints));  // not busy after an error
  EXPECT_EQ(int(kResolved), a.next());
}

TEST(ResolveAddrinfo, SyncIdWaitsInTheCall) {
  rdma_cm_id* id = nullptr;
  ASSERT_EQ(0, rdma_create_id(nullptr, &id, nullptr, RDMA_PS_TCP));
  rdma_addrinfo hints{};
  hints.ai_flags = RAI_NUMERICHOST;
  ASSERT_EQ(0, rdma_resolve_addrinfo(id, "127.0.0.1", "7471", &hints));
  rdma_addrinfo* ai = nullptr;
  ASSERT_EQ(0, rdma_query_addrinfo(id, &ai));
  EXPECT_EQ(INADDR_LOOPBACK, dst_ipv4(ai));
  rdma_freeaddrinfo(ai);
  errno = 0;
  EXPECT_EQ(-1, rdma_resolve_addrinfo(id, "300.1.2.3", "7471", &hints));
  EXPECT_NE(0, errno);
  ASSERT_EQ(0, rdma_resolve_addrinfo(id, "127.0.0.1", "7471", &hints));  // resolving ended with the error
  EXPECT_EQ(0, rdma_destroy_id(id));  // with its result not taken
}

TEST(ResolveAddrinfo, RefusedAtTheCall) {
  AsyncId a;
  ASSERT_NE(nullptr, a.id);
  rdma_addrinfo hints{};
  hints.ai_flags = abi::kRaiSa;
  errno = 0;
  EXPECT_EQ(-1, rdma_resolve_addrinfo(a.id, nullptr, "1234", &hints));  // no SA on RoCE
  EXPECT_EQ(EOPNOTSUPP, errno);
  errno = 0;
  EXPECT_EQ(-1, rdma_resolve_addrinfo(a.id, "127.0.0.1", "1234", &hints));
  EXPECT_EQ(ENOTSUP, errno);
  hints.ai_flags = abi::kRaiSa | abi::kRaiDns;
  errno = 0;
  EXPECT_EQ(-1, rdma_resolve_addrinfo(a.id, nullptr, "1234", &hints));
  EXPECT_EQ(ENOTSUP, errno);
  errno = 0;
  EXPECT_EQ(-1, rdma_resolve_addrinfo(nullptr, "127.0.0.1", "1", nullptr));
  EXPECT_EQ(EINVAL, errno);
  rdma_addrinfo* ai = nullptr;
  errno = 0;
  EXPECT_EQ(-1, rdma_query_addrinfo(a.id, &ai));  // nothing was started
  EXPECT_EQ(ENOENT, errno);
  errno = 0;
  EXPECT_EQ(-1, rdma_query_addrinfo(a.id, nullptr));
  EXPECT_EQ(EINVAL, errno);
}

TEST(WriteCmEvent, UserEventWithArg) {
  AsyncId a;
  ASSERT_NE(nullptr, a.id);
  ASSERT_EQ(0, rdma_write_cm_event(a.id, kUser, 42, 0x1122334455667788ull));
  int status = 0;
  uint64_t arg = 0;
  EXPECT_EQ(int(kUser), a.next(&status, &arg));
  EXPECT_EQ(42, status);
  EXPECT_EQ(0x1122334455667788ull, arg);
  errno = 0;
  EXPECT_EQ(-1, rdma_write_cm_event(a.id, RDMA_CM_EVENT_ESTABLISHED, 0, 0));  // only USER
  EXPECT_EQ(EINVAL, errno);
  errno = 0;
  EXPECT_EQ(-1, rdma_write_cm_event(a.id, rdma_cm_event_type(abi::kCmEventInternal), 0, 0));
  EXPECT_EQ(EINVAL, errno);
}

TEST(WriteCmEvent, EventNames) {
  EXPECT_STREQ("RDMA_CM_EVENT_ADDRINFO_RESOLVED", rdma_event_str(kResolved));
  EXPECT_STREQ("RDMA_CM_EVENT_ADDRINFO_ERROR", rdma_event_str(kError));
  EXPECT_STREQ("RDMA_CM_EVENT_USER", rdma_event_str(kUser));
}

}  // namespace
}  // namespace rdmacm_addrinfo
