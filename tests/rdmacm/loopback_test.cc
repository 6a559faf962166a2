// loopback_test.cc: rdma_cm on the loopback addresses (docs/RDMACM.md,
// "Addresses"). As in Linux (whose CM counts a loopback address as a
// wildcard, cma_any_addr), a bind to 127.0.0.1 or ::1 gives the id no
// device; rdma_resolve_addr to it gives sv0 with GID index 0
// (::ffff:127.0.0.1, the GID ibv_devinfo lists first), and a server bound
// there serves clients that dial it, its connections on sv0 with GID 0. The
// client is a real process: this binary run again as `--child lo-client-4
// PORT` or `lo-client-6` (rdmacm_test.cc's main dispatches to
// loopback_child).
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

int loopback_child(const std::string& mode, uint16_t port);

namespace {

using Clock = std::chrono::steady_clock;
constexpr size_t kMsgLen = 64;

rdma_cm_event* lo_event(rdma_event_channel* ch, int ms = 10000) {
  pollfd p{ch->fd, POLLIN, 0};
  if (::poll(&p, 1, ms) <= 0) return nullptr;
  rdma_cm_event* e = nullptr;
  return rdma_get_cm_event(ch, &e) == 0 ? e : nullptr;
}

// The next event must be `type`; its id is returned through `id`.
bool lo_expect(rdma_event_channel* ch, rdma_cm_event_type type, rdma_cm_id** id = nullptr) {
  rdma_cm_event* e = lo_event(ch);
  if (!e) {
    std::fprintf(stderr, "[%d] no event (wanted %s)\n", ::getpid(), rdma_event_str(type));
    return false;
  }
  bool ok = e->event == type;
  if (!ok)
    std::fprintf(stderr, "[%d] got %s (status %d), wanted %s\n", ::getpid(), rdma_event_str(e->event), e->status,
                 rdma_event_str(type));
  if (id) *id = e->id;
  rdma_ack_cm_event(e);
  return ok;
}

// The loopback address of a family, with a port.
sockaddr_storage lo_addr(int family, uint16_t port) {
  sockaddr_storage s{};
  if (family == AF_INET) {
    auto* a = reinterpret_cast<sockaddr_in*>(&s);
    a->sin_family = AF_INET;
    a->sin_port = htons(port);
    a->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  } else {
    auto* a = reinterpret_cast<sockaddr_in6*>(&s);
    a->sin6_family = AF_INET6;
    a->sin6_port = htons(port);
    a->sin6_addr = in6addr_loopback;
  }
  return s;
}

// GID 0 of sv0's port 1 (::ffff:127.0.0.1), as ibv_query_gid reads it.
bool gid0(ibv_context* c, ibv_gid* g) { return c && ibv_query_gid(c, 1, 0, g) == 0; }

bool same_gid(const ibv_gid& a, const ibv_gid& b) { return std::memcmp(a.raw, b.raw, 16) == 0; }

// Polls `cq` for one completion, up to `ms`.
bool poll_one(ibv_cq* cq, ibv_wc* wc, int ms = 10000) {
  auto end = Clock::now() + std::chrono::milliseconds(ms);
  while (Clock::now() < end) {
    int n = ibv_poll_cq(cq, 1, wc);
    if (n < 0) return false;
    if (n == 1) return true;
    ::usleep(1000);
  }
  return false;
}

ibv_qp_init_attr lo_qp_attr() {
  ibv_qp_init_attr a{};
  a.qp_type = IBV_QPT_RC;
  a.cap.max_send_wr = a.cap.max_recv_wr = 4;
  a.cap.max_send_sge = a.cap.max_recv_sge = 1;
  a.sq_sig_all = 1;
  return a;
}

// The client: resolves the loopback address of the family, checks what the
// resolution gave (the device, GID 0 at both ends), connects, receives
// "ping", answers "pong", and waits for the server's disconnect.
// Exit code: 0, or the number of the step that went wrong.
int client(int family, uint16_t port) {
  rdma_event_channel* ch = rdma_create_event_channel();
  rdma_cm_id* id = nullptr;
  if (!ch || rdma_create_id(ch, &id, nullptr, RDMA_PS_TCP)) return 2;
  sockaddr_storage dst = lo_addr(family, port);
  if (rdma_resolve_addr(id, nullptr, reinterpret_cast<sockaddr*>(&dst), 2000)) return 3;
  if (!lo_expect(ch, RDMA_CM_EVENT_ADDR_RESOLVED)) return 4;
  ibv_gid g{};
  if (!gid0(id->verbs, &g) || id->port_num != 1) return 5;
  if (!same_gid(id->route.addr.addr.ibaddr.sgid, g) || !same_gid(id->route.addr.addr.ibaddr.dgid, g)) return 6;
  if (rdma_get_local_addr(id)->sa_family != family) return 7;
  if (rdma_resolve_route(id, 2000) || !lo_expect(ch, RDMA_CM_EVENT_ROUTE_RESOLVED)) return 8;
  if (id->route.num_paths != 1 || !same_gid(id->route.path_rec->sgid, g) || !same_gid(id->route.path_rec->dgid, g))
    return 9;
  ibv_qp_init_attr qa = lo_qp_attr();
  if (rdma_create_qp(id, nullptr, &qa)) return 10;
  char* buf = static_cast<char*>(std::calloc(1, kMsgLen));
  ibv_mr* mr = rdma_reg_msgs(id, buf, kMsgLen);
  if (!mr || rdma_post_recv(id, nullptr, buf, kMsgLen, mr)) return 11;
  rdma_conn_param p{};
  p.retry_count = 7;
  p.rnr_retry_count = 7;
  if (rdma_connect(id, &p) || !lo_expect(ch, RDMA_CM_EVENT_ESTABLISHED)) return 12;
  ibv_wc wc{};
  if (rdma_get_recv_comp(id, &wc) != 1 || wc.status != IBV_WC_SUCCESS || std::strcmp(buf, "ping") != 0) return 13;
  std::strcpy(buf, "pong");
  if (rdma_post_send(id, nullptr, buf, 5, mr, 0) || rdma_get_send_comp(id, &wc) != 1 || wc.status != IBV_WC_SUCCESS)
    return 14;
  if (!lo_expect(ch, RDMA_CM_EVENT_DISCONNECTED)) return 15;
  rdma_disconnect(id);
  rdma_dereg_mr(mr);
  rdma_destroy_qp(id);
  rdma_destroy_id(id);
  rdma_destroy_event_channel(ch);
  std::free(buf);
  return 0;
}

pid_t spawn_client(int family, uint16_t port) {
  pid_t pid = ::fork();
  if (pid == 0) {
    const char* self = "/proc/self/exe";
    std::string p = std::to_string(port);
    ::execl(self, self, "--child", family == AF_INET ? "lo-client-4" : "lo-client-6", p.c_str(), nullptr);
    ::_exit(127);
  }
  return pid;
}

int reap_client(pid_t pid, int ms = 20000) {
  auto end = Clock::now() + std::chrono::milliseconds(ms);
  while (Clock::now() < end) {
    int st = 0;
    if (::waitpid(pid, &st, WNOHANG) == pid) return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    ::usleep(10000);
  }
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
  return -1;
}

class Loopback : public ::testing::TestWithParam<int> {};

std::string family_name(const ::testing::TestParamInfo<int>& i) { return i.param == AF_INET ? "ipv4" : "ipv6"; }

// A bind to loopback is a bind to "any address" of the host (Linux's
// cma_any_addr): no device. libfabric's verbs provider relies on it: an
// fi_getinfo without an address binds "localhost" and, finding no device
// there, offers the device's own addresses, which other hosts can reach
// (roce.wire.cm.fi_pingpong). rdma_resolve_addr to the same address then
// gives the id sv0, port 1, GID index 0 at both ends, with a PD.
TEST_P(Loopback, BindIsAnyAddressResolveGivesGidZero) {
  const char* node = GetParam() == AF_INET ? "127.0.0.1" : "::1";
  rdma_addrinfo hints{};
  hints.ai_flags = RAI_PASSIVE;
  hints.ai_port_space = RDMA_PS_TCP;
  hints.ai_qp_type = IBV_QPT_RC;
  rdma_addrinfo* rai = nullptr;
  ASSERT_EQ(0, rdma_getaddrinfo(node, nullptr, &hints, &rai)) << std::strerror(errno);
  rdma_cm_id* id = nullptr;
  ASSERT_EQ(0, rdma_create_id(nullptr, &id, nullptr, RDMA_PS_TCP));
  ASSERT_EQ(0, rdma_bind_addr(id, rai->ai_src_addr)) << std::strerror(errno);
  EXPECT_EQ(nullptr, id->verbs) << "a bind to " << node << " gave a device";
  EXPECT_EQ(GetParam(), rdma_get_local_addr(id)->sa_family);
  sockaddr_storage dst = lo_addr(GetParam(), 9);
  ASSERT_EQ(0, rdma_resolve_addr(id, nullptr, reinterpret_cast<sockaddr*>(&dst), 2000)) << std::strerror(errno);
  ASSERT_NE(nullptr, id->verbs);
  EXPECT_STREQ("sv0", ibv_get_device_name(id->verbs->device));
  EXPECT_EQ(1, id->port_num);
  EXPECT_NE(nullptr, id->pd);
  ibv_gid g{};
  ASSERT_TRUE(gid0(id->verbs, &g));
  EXPECT_TRUE(same_gid(g, id->route.addr.addr.ibaddr.sgid)) << "the source GID is not GID 0";
  EXPECT_TRUE(same_gid(g, id->route.addr.addr.ibaddr.dgid)) << "the destination GID is not GID 0";
  rdma_destroy_id(id);
  rdma_freeaddrinfo(rai);
}

// SOFTVERBS_CM_LOOPBACK_DEVICE=1 for the life of a test.
struct LoopbackDeviceOptIn {
  LoopbackDeviceOptIn() { ::setenv("SOFTVERBS_CM_LOOPBACK_DEVICE", "1", 1); }
  ~LoopbackDeviceOptIn() { ::unsetenv("SOFTVERBS_CM_LOOPBACK_DEVICE"); }
};

// librpma's rpma_utils_get_ibv_context(addr, RPMA_UTIL_IBV_CONTEXT_LOCAL):
// rdma_getaddrinfo (passive), a synchronous id, a bind, the id's verbs, the
// id destroyed. libfabric's verbs provider makes the same calls on
// "localhost" for an fi_getinfo without an address.
ibv_context* context_of_bind(const char* node, ibv_gid* sgid = nullptr, rdma_cm_id** keep = nullptr) {
  rdma_addrinfo hints{};
  hints.ai_flags = RAI_PASSIVE;
  hints.ai_port_space = RDMA_PS_TCP;
  hints.ai_qp_type = IBV_QPT_RC;
  rdma_addrinfo* rai = nullptr;
  if (rdma_getaddrinfo(node, nullptr, &hints, &rai)) return nullptr;
  rdma_cm_id* id = nullptr;
  ibv_context* ctx = nullptr;
  if (rdma_create_id(nullptr, &id, nullptr, RDMA_PS_TCP) == 0) {
    if (rdma_bind_addr(id, rai->ai_src_addr) == 0) {
      ctx = id->verbs;
      if (sgid) *sgid = id->route.addr.addr.ibaddr.sgid;
    }
    if (keep && ctx) *keep = id;
    else rdma_destroy_id(id);
  }
  rdma_freeaddrinfo(rai);
  return ctx;
}

// A server bound to the loopback address (not the wildcard) and listening:
// the client in another process resolves the same address, connects, and
// they exchange a message each way; the connection is on sv0, GID 0. With
// `ctx` (the device a bind gave, as librpma finds it), the PD and the
// memory are made from it before any client comes, and the connection
// request must be on that device.
void serve_one_loopback_client(int family, ibv_context* ctx) {
  rdma_event_channel* ch = rdma_create_event_channel();
  ASSERT_NE(nullptr, ch);
  char* buf = static_cast<char*>(std::calloc(1, kMsgLen));
  ibv_pd* pd = ctx ? ibv_alloc_pd(ctx) : nullptr;
  ibv_mr* mr = pd ? ibv_reg_mr(pd, buf, kMsgLen, IBV_ACCESS_LOCAL_WRITE) : nullptr;
  if (ctx) {
    ASSERT_NE(nullptr, mr) << "no PD or MR on the device the bind gave: " << std::strerror(errno);
  }
  rdma_cm_id* l = nullptr;
  ASSERT_EQ(0, rdma_create_id(ch, &l, nullptr, RDMA_PS_TCP));
  sockaddr_storage a = lo_addr(family, 0);
  ASSERT_EQ(0, rdma_bind_addr(l, reinterpret_cast<sockaddr*>(&a))) << std::strerror(errno);
  ASSERT_EQ(0, rdma_listen(l, 4));
  const uint16_t port = ntohs(rdma_get_src_port(l));
  ASSERT_NE(0, port);
  pid_t pid = spawn_client(family, port);
  rdma_cm_id* id = nullptr;
  ASSERT_TRUE(lo_expect(ch, RDMA_CM_EVENT_CONNECT_REQUEST, &id));
  ASSERT_NE(nullptr, id->verbs);
  EXPECT_STREQ("sv0", ibv_get_device_name(id->verbs->device));
  if (ctx) {
    EXPECT_EQ(ctx, id->verbs) << "the request is on another device than the bind gave";
  }
  if (!pd) pd = ibv_alloc_pd(id->verbs);
  ASSERT_NE(nullptr, pd);
  if (!mr) mr = ibv_reg_mr(pd, buf, kMsgLen, IBV_ACCESS_LOCAL_WRITE);
  ASSERT_NE(nullptr, mr);
  ibv_gid g{};
  ASSERT_TRUE(gid0(id->verbs, &g));
  EXPECT_TRUE(same_gid(g, id->route.addr.addr.ibaddr.sgid));
  EXPECT_EQ(family, rdma_get_peer_addr(id)->sa_family);
  ibv_qp_init_attr qa = lo_qp_attr();
  ASSERT_EQ(0, rdma_create_qp(id, pd, &qa)) << std::strerror(errno);
  ASSERT_EQ(0, rdma_post_recv(id, nullptr, buf + 8, kMsgLen - 8, mr));
  ASSERT_EQ(0, rdma_accept(id, nullptr));
  ASSERT_TRUE(lo_expect(ch, RDMA_CM_EVENT_ESTABLISHED));
  std::strcpy(buf, "ping");
  ASSERT_EQ(0, rdma_post_send(id, nullptr, buf, 5, mr, 0));
  ibv_wc wc{};
  ASSERT_TRUE(poll_one(id->send_cq, &wc));
  EXPECT_EQ(IBV_WC_SUCCESS, wc.status);
  ASSERT_TRUE(poll_one(id->recv_cq, &wc));
  EXPECT_EQ(IBV_WC_SUCCESS, wc.status);
  EXPECT_STREQ("pong", buf + 8);
  ASSERT_EQ(0, rdma_disconnect(id));
  EXPECT_TRUE(lo_expect(ch, RDMA_CM_EVENT_DISCONNECTED));
  EXPECT_EQ(0, reap_client(pid)) << "the client failed at that step";
  ibv_dereg_mr(mr);
  rdma_destroy_qp(id);
  rdma_destroy_id(id);
  ibv_dealloc_pd(pd);
  rdma_destroy_id(l);
  rdma_destroy_event_channel(ch);
  std::free(buf);
}

TEST_P(Loopback, ServerBoundToLoopbackServesALoopbackClient) { serve_one_loopback_client(GetParam(), nullptr); }

// The opt-in: a bind to 127.0.0.1, 127.0.0.2 or ::1 gives sv0, port 1, GID
// index 0 (::ffff:127.0.0.1), with a PD, at once; the bound address stays
// what was bound. Without it the same calls give no device (the test
// above), which libfabric's address-less servers need.
TEST_P(Loopback, OptInBindGivesTheDeviceWithGidZero) {
  LoopbackDeviceOptIn opt_in;
  const char* node = GetParam() == AF_INET ? "127.0.0.1" : "::1";
  rdma_cm_id* id = nullptr;
  ibv_gid sgid{};
  ibv_context* ctx = context_of_bind(node, &sgid, &id);
  ASSERT_NE(nullptr, ctx) << "a bind to " << node << " gave no device";
  EXPECT_STREQ("sv0", ibv_get_device_name(ctx->device));
  EXPECT_EQ(1, id->port_num);
  EXPECT_NE(nullptr, id->pd);
  EXPECT_EQ(GetParam(), rdma_get_local_addr(id)->sa_family);
  sockaddr_storage want = lo_addr(GetParam(), 0);
  sockaddr_storage got{};
  std::memcpy(&got, rdma_get_local_addr(id), sizeof(got));
  if (GetParam() == AF_INET)
    EXPECT_EQ(reinterpret_cast<sockaddr_in*>(&want)->sin_addr.s_addr,
              reinterpret_cast<sockaddr_in*>(&got)->sin_addr.s_addr);
  else
    EXPECT_TRUE(IN6_IS_ADDR_LOOPBACK(&reinterpret_cast<sockaddr_in6*>(&got)->sin6_addr));
  ibv_gid g{};
  ASSERT_TRUE(gid0(ctx, &g));
  EXPECT_TRUE(same_gid(g, sgid)) << "the source GID is not GID 0";
  rdma_destroy_id(id);
  if (GetParam() == AF_INET) {
    ibv_gid other{};
    EXPECT_EQ(ctx, context_of_bind("127.0.0.2", &other)) << "127.0.0.2 gave no device";
    EXPECT_TRUE(same_gid(g, other));
  }
}

// librpma's server on loopback with the opt-in: the device of a bind to
// the address, a PD and registered memory on it, then a listener bound
// there that serves a client process dialling the same address.
TEST_P(Loopback, OptInServerUsesTheBindsDevice) {
  LoopbackDeviceOptIn opt_in;
  ibv_context* ctx = context_of_bind(GetParam() == AF_INET ? "127.0.0.1" : "::1");
  ASSERT_NE(nullptr, ctx) << "the bind gave no device";
  serve_one_loopback_client(GetParam(), ctx);
}

INSTANTIATE_TEST_SUITE_P(RdmaCm, Loopback, ::testing::Values(AF_INET, AF_INET6), family_name);

}  // namespace

int loopback_child(const std::string& mode, uint16_t port) {
  return client(mode == "lo-client-6" ? AF_INET6 : AF_INET, port);
}
