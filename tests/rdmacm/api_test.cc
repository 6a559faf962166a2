// api_test.cc: the calls of librdmacm's symbol map that no Debian program
// in tests/compat reaches and no other test names (issue 21, item 4; the
// list is in docs/RDMACM.md, "Every exported call"): SRQs on an id, options,
// rdma_notify, enhanced connection establishment (ECE), the device list,
// rdma_getaddrinfo's passive and active forms, endpoints from
// rdma_create_ep with rdma_get_request, and the rsocket calls read/write and
// sendmsg/recvmsg. Each is held to what rdma-core's librdmacm answers,
// bad arguments included.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>
#include <rdma/rsocket.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <thread>

namespace rdmacm_api {
namespace {

// A synchronous id with 127.0.0.1 resolved (it then has its device and
// PD; a bind to loopback gives none, as on Linux).
struct BoundId {
  rdma_cm_id* id = nullptr;
  BoundId() {
    if (rdma_create_id(nullptr, &id, nullptr, RDMA_PS_TCP)) return;
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(9);
    if (rdma_resolve_addr(id, nullptr, reinterpret_cast<sockaddr*>(&a), 2000)) {
      rdma_destroy_id(id);
      id = nullptr;
    }
  }
  ~BoundId() {
    if (!id) return;
    if (id->qp) rdma_destroy_qp(id);
    rdma_destroy_srq(id);
    rdma_destroy_id(id);
  }
};

ibv_qp_init_attr rc_attr() {
  ibv_qp_init_attr a{};
  a.qp_type = IBV_QPT_RC;
  a.cap.max_send_wr = a.cap.max_recv_wr = 4;
  a.cap.max_send_sge = a.cap.max_recv_sge = 1;
  return a;
}

TEST(RdmaCmApi, SrqOnAnIdIsMadeUsedAndDestroyed) {
  BoundId b;
  ASSERT_NE(nullptr, b.id);
  ASSERT_NE(nullptr, b.id->verbs);
  // Bad arguments, and a kind of SRQ this call does not make.
  errno = 0;
  EXPECT_EQ(-1, rdma_create_srq(nullptr, nullptr, nullptr));
  EXPECT_EQ(EINVAL, errno);
  ibv_srq_init_attr_ex xrc{};
  xrc.srq_type = IBV_SRQT_XRC;
  xrc.attr.max_wr = 4;
  xrc.attr.max_sge = 1;
  errno = 0;
  EXPECT_EQ(-1, rdma_create_srq_ex(b.id, &xrc));
  EXPECT_EQ(EOPNOTSUPP, errno);
  EXPECT_EQ(nullptr, b.id->srq);
  // The id's own PD when none is given; the SRQ takes receives.
  ibv_srq_init_attr a{};
  a.attr.max_wr = 8;
  a.attr.max_sge = 1;
  ASSERT_EQ(0, rdma_create_srq(b.id, nullptr, &a)) << std::strerror(errno);
  ASSERT_NE(nullptr, b.id->srq);
  EXPECT_GE(a.attr.max_wr, 8u);
  static char buf[64];
  ibv_mr* mr = ibv_reg_mr(b.id->srq->pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE);
  ASSERT_NE(nullptr, mr);
  EXPECT_EQ(0, rdma_post_recv(b.id, nullptr, buf, sizeof buf, mr)) << "rdma_post_recv goes to the id's SRQ";
  // A QP made on the id after it uses that SRQ.
  ibv_qp_init_attr qa = rc_attr();
  ASSERT_EQ(0, rdma_create_qp(b.id, nullptr, &qa)) << std::strerror(errno);
  EXPECT_EQ(b.id->srq, b.id->qp->srq);
  rdma_destroy_qp(b.id);
  ibv_dereg_mr(mr);
  rdma_destroy_srq(b.id);
  EXPECT_EQ(nullptr, b.id->srq);
  rdma_destroy_srq(b.id);  // again: nothing, no crash
  rdma_destroy_srq(nullptr);
}

TEST(RdmaCmApi, OptionsAreCheckedAsLibrdmacmChecksThem) {
  BoundId b;
  ASSERT_NE(nullptr, b.id);
  uint8_t tos = 32;
  EXPECT_EQ(0, rdma_set_option(b.id, RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, &tos, sizeof tos));
  int on = 1;
  EXPECT_EQ(0, rdma_set_option(b.id, RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR, &on, sizeof on));
  EXPECT_EQ(0, rdma_set_option(b.id, RDMA_OPTION_ID, RDMA_OPTION_ID_AFONLY, &on, sizeof on));
  uint8_t timeout = 14;
  EXPECT_EQ(0, rdma_set_option(b.id, RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT, &timeout, sizeof timeout));
  ibv_path_data paths[2]{};
  EXPECT_EQ(0, rdma_set_option(b.id, RDMA_OPTION_IB, RDMA_OPTION_IB_PATH, paths, sizeof paths));
  // A wrong length is EINVAL; an option this device does not know, ENOSYS.
  errno = 0;
  EXPECT_EQ(-1, rdma_set_option(b.id, RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, &on, sizeof on));
  EXPECT_EQ(EINVAL, errno);
  errno = 0;
  EXPECT_EQ(-1, rdma_set_option(b.id, RDMA_OPTION_IB, RDMA_OPTION_IB_PATH, paths, sizeof paths - 1));
  EXPECT_EQ(EINVAL, errno);
  errno = 0;
  EXPECT_EQ(-1, rdma_set_option(b.id, RDMA_OPTION_ID, 999, &on, sizeof on));
  EXPECT_EQ(ENOSYS, errno);
  errno = 0;
  EXPECT_EQ(-1, rdma_set_option(b.id, 999, 0, &on, sizeof on));
  EXPECT_EQ(ENOSYS, errno);
  // rdma_notify: accepted (the RTU already told the CM), an id required.
  EXPECT_EQ(0, rdma_notify(b.id, IBV_EVENT_COMM_EST));
  errno = 0;
  EXPECT_EQ(-1, rdma_notify(nullptr, IBV_EVENT_COMM_EST));
  EXPECT_EQ(EINVAL, errno);
}

// ECE (rdma_set_local_ece(3)): checked and kept before the QP exists; this
// device has no vendor options, so the peer's are none (vendor_id 0).
TEST(RdmaCmApi, EceIsCheckedAndThePeerOffersNone) {
  BoundId b;
  ASSERT_NE(nullptr, b.id);
  ibv_ece ece{};
  errno = 0;
  EXPECT_EQ(-1, rdma_set_local_ece(b.id, &ece)) << "vendor_id 0";
  EXPECT_EQ(EINVAL, errno);
  ece.vendor_id = 0x02c9;
  ece.options = 0x5;
  ece.comp_mask = 1;
  errno = 0;
  EXPECT_EQ(-1, rdma_set_local_ece(b.id, &ece)) << "an unknown comp_mask bit";
  EXPECT_EQ(EINVAL, errno);
  ece.comp_mask = 0;
  errno = 0;
  EXPECT_EQ(-1, rdma_set_local_ece(nullptr, &ece));
  EXPECT_EQ(EINVAL, errno);
  errno = 0;
  EXPECT_EQ(-1, rdma_set_local_ece(b.id, nullptr));
  EXPECT_EQ(EINVAL, errno);
  EXPECT_EQ(0, rdma_set_local_ece(b.id, &ece));
  ibv_ece remote{};
  remote.vendor_id = 0xdead;
  remote.options = 0xbeef;
  EXPECT_EQ(0, rdma_get_remote_ece(b.id, &remote));
  EXPECT_EQ(0u, remote.vendor_id);
  EXPECT_EQ(0u, remote.options);
  errno = 0;
  EXPECT_EQ(-1, rdma_get_remote_ece(b.id, nullptr));
  EXPECT_EQ(EINVAL, errno);
  // Once the id has its QP, both are refused.
  ibv_qp_init_attr qa = rc_attr();
  ASSERT_EQ(0, rdma_create_qp(b.id, nullptr, &qa)) << std::strerror(errno);
  errno = 0;
  EXPECT_EQ(-1, rdma_set_local_ece(b.id, &ece));
  EXPECT_EQ(EINVAL, errno);
  errno = 0;
  EXPECT_EQ(-1, rdma_get_remote_ece(b.id, &remote));
  EXPECT_EQ(EINVAL, errno);
}

TEST(RdmaCmApi, DeviceListHoldsTheDevice) {
  int n = -1;
  ibv_context** l = rdma_get_devices(&n);
  ASSERT_NE(nullptr, l);
  ASSERT_EQ(1, n);
  ASSERT_NE(nullptr, l[0]);
  EXPECT_EQ(nullptr, l[1]) << "the list ends with a null";
  EXPECT_STREQ("sv0", ibv_get_device_name(l[0]->device));
  rdma_free_devices(l);
  ibv_context** again = rdma_get_devices(nullptr);  // the count is optional
  ASSERT_NE(nullptr, again);
  rdma_free_devices(again);
}

// A passive endpoint on 127.0.0.1 (rdma_getaddrinfo with RAI_PASSIVE, a
// port the CM picks), listening; `qa` (may be null) makes each accepted
// id's QP at rdma_get_request. Null, with the failure recorded, if not.
rdma_cm_id* listening_ep(ibv_qp_init_attr* qa) {
  rdma_addrinfo hints{};
  hints.ai_flags = RAI_PASSIVE;
  hints.ai_port_space = RDMA_PS_TCP;
  rdma_addrinfo* pres = nullptr;
  if (rdma_getaddrinfo("127.0.0.1", "0", &hints, &pres) || !pres) {
    ADD_FAILURE() << "rdma_getaddrinfo (passive): " << std::strerror(errno);
    return nullptr;
  }
  EXPECT_EQ(RDMA_PS_TCP, pres->ai_port_space);
  rdma_cm_id* id = nullptr;
  int r = rdma_create_ep(&id, pres, nullptr, qa);
  rdma_freeaddrinfo(pres);
  if (r) {
    ADD_FAILURE() << "rdma_create_ep (passive): " << std::strerror(errno);
    return nullptr;
  }
  EXPECT_EQ(0, rdma_listen(id, 4));
  return id;
}

// An active endpoint to 127.0.0.1:PORT (rdma_getaddrinfo, rdma_create_ep:
// address and route resolved, the QP of `qa` made). Null, with the failure
// recorded, if not.
rdma_cm_id* active_ep(uint16_t port, ibv_qp_init_attr* qa) {
  rdma_addrinfo h{};
  h.ai_port_space = RDMA_PS_TCP;
  rdma_addrinfo* res = nullptr;
  if (rdma_getaddrinfo("127.0.0.1", std::to_string(port).c_str(), &h, &res)) {
    ADD_FAILURE() << "rdma_getaddrinfo (active): " << std::strerror(errno);
    return nullptr;
  }
  rdma_cm_id* id = nullptr;
  int r = rdma_create_ep(&id, res, nullptr, qa);
  rdma_freeaddrinfo(res);
  if (r) {
    ADD_FAILURE() << "rdma_create_ep (active): " << std::strerror(errno);
    return nullptr;
  }
  return id;
}

// rdma_getaddrinfo's passive form, rdma_create_ep on it with a QP's
// attributes, rdma_get_request for the connection, and the active form's
// rdma_create_ep with its QP: rdma_server/rdma_client's pattern, checked
// through a message both ways.
TEST(RdmaCmApi, EndpointsFromGetaddrinfoConnectAndCarryMessages) {
  ibv_qp_init_attr qa = rc_attr();
  qa.sq_sig_all = 1;
  rdma_cm_id* listen_id = listening_ep(&qa);
  ASSERT_NE(nullptr, listen_id);
  const uint16_t port = ntohs(rdma_get_src_port(listen_id));
  ASSERT_NE(0, port);

  // The active side's endpoint, here (a failure must not leave the passive
  // side waiting for a request); its connect and messages in a thread.
  // Not on the stack, which softverbs does not register (docs/MEMORY.md).
  static char sbuf[32], cbuf[32];
  ibv_qp_init_attr ca = rc_attr();
  ca.sq_sig_all = 1;
  rdma_cm_id* cid = active_ep(port, &ca);
  ASSERT_NE(nullptr, cid);
  ASSERT_NE(nullptr, cid->qp) << "an active endpoint gets its QP at once";
  ibv_mr* cmr = rdma_reg_msgs(cid, cbuf, sizeof cbuf);
  ASSERT_NE(nullptr, cmr) << std::strerror(errno) << " pd " << cid->pd << " verbs " << cid->verbs;
  ASSERT_EQ(0, rdma_post_recv(cid, nullptr, cbuf, 16, cmr));
  int client_ok = -1;
  std::thread client([&] {
    if (rdma_connect(cid, nullptr)) return;
    std::strcpy(cbuf + 16, "from client");
    ibv_wc wc{};
    if (!rdma_post_send(cid, nullptr, cbuf + 16, 12, cmr, 0) && rdma_get_send_comp(cid, &wc) == 1 &&
        wc.status == IBV_WC_SUCCESS && rdma_get_recv_comp(cid, &wc) == 1 && wc.status == IBV_WC_SUCCESS)
      client_ok = 0;
  });
  rdma_cm_id* conn = nullptr;
  ASSERT_EQ(0, rdma_get_request(listen_id, &conn)) << std::strerror(errno);
  ASSERT_NE(nullptr, conn);
  ASSERT_NE(nullptr, conn->qp) << "the endpoint's QP attributes make the QP at rdma_get_request";
  ibv_mr* mr = rdma_reg_msgs(conn, sbuf, sizeof sbuf);
  ASSERT_NE(nullptr, mr);
  ASSERT_EQ(0, rdma_post_recv(conn, nullptr, sbuf, 16, mr));
  ASSERT_EQ(0, rdma_accept(conn, nullptr));
  ibv_wc wc{};
  ASSERT_EQ(1, rdma_get_recv_comp(conn, &wc));
  EXPECT_EQ(IBV_WC_SUCCESS, wc.status);
  EXPECT_STREQ("from client", sbuf);
  std::strcpy(sbuf + 16, "from server");
  ASSERT_EQ(0, rdma_post_send(conn, nullptr, sbuf + 16, 12, mr, 0));
  ASSERT_EQ(1, rdma_get_send_comp(conn, &wc));
  EXPECT_EQ(IBV_WC_SUCCESS, wc.status);
  client.join();
  EXPECT_EQ(0, client_ok);
  EXPECT_STREQ("from server", cbuf);
  rdma_disconnect(cid);
  rdma_dereg_mr(cmr);
  rdma_destroy_ep(cid);
  rdma_disconnect(conn);
  rdma_dereg_mr(mr);
  rdma_destroy_ep(conn);
  rdma_destroy_ep(listen_id);
}

// rdma_reject_ece: a connection request refused with it is refused, as with
// rdma_reject (there are no vendor options to say why).
TEST(RdmaCmApi, RejectEceRefusesTheRequest) {
  rdma_cm_id* listen_id = listening_ep(nullptr);
  ASSERT_NE(nullptr, listen_id);
  const uint16_t port = ntohs(rdma_get_src_port(listen_id));
  ibv_qp_init_attr ca = rc_attr();
  rdma_cm_id* cid = active_ep(port, &ca);
  ASSERT_NE(nullptr, cid);
  int rc = 0, err = 0;
  std::thread client([&] {
    rc = rdma_connect(cid, nullptr);
    err = errno;
  });
  rdma_cm_id* conn = nullptr;
  ASSERT_EQ(0, rdma_get_request(listen_id, &conn)) << std::strerror(errno);
  errno = 0;
  EXPECT_EQ(-1, rdma_reject_ece(nullptr, nullptr, 0));
  EXPECT_EQ(EINVAL, errno);
  EXPECT_EQ(0, rdma_reject_ece(conn, "no", 3));
  client.join();
  EXPECT_EQ(-1, rc) << "the connect was refused";
  EXPECT_EQ(ECONNREFUSED, err);
  rdma_destroy_ep(conn);
  rdma_destroy_ep(cid);
  rdma_destroy_ep(listen_id);
}

// rread/rwrite and rsendmsg/rrecvmsg (scatter and gather) on a stream rsocket.
TEST(RdmaCmApi, RsocketReadWriteAndMsgCalls) {
  int l = rsocket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(l, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(0, rbind(l, reinterpret_cast<sockaddr*>(&a), sizeof a));
  ASSERT_EQ(0, rlisten(l, 2));
  socklen_t len = sizeof a;
  ASSERT_EQ(0, rgetsockname(l, reinterpret_cast<sockaddr*>(&a), &len));
  int c = -1;
  std::thread t([&] {
    int s = rsocket(AF_INET, SOCK_STREAM, 0);
    if (s >= 0 && rconnect(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) c = s;
  });
  int s = raccept(l, nullptr, nullptr);
  t.join();
  ASSERT_GE(s, 0);
  ASSERT_GE(c, 0);
  EXPECT_EQ(5, rwrite(c, "hello", 5));
  char got[16] = {};
  size_t have = 0;
  while (have < 5) {
    ssize_t n = rread(s, got + have, 5 - have);
    ASSERT_GT(n, 0);
    have += size_t(n);
  }
  EXPECT_EQ(0, std::memcmp(got, "hello", 5));
  // Gathered from three pieces, scattered into two.
  char p1[] = "ab", p2[] = "cdef", p3[] = "g";
  iovec out[3] = {{p1, 2}, {p2, 4}, {p3, 1}};
  msghdr m{};
  m.msg_iov = out;
  m.msg_iovlen = 3;
  EXPECT_EQ(7, rsendmsg(s, &m, 0));
  char q1[3] = {}, q2[5] = {};
  iovec in[2] = {{q1, 3}, {q2, 4}};
  have = 0;
  while (have < 7) {
    msghdr r{};
    // Continue where the last call stopped.
    iovec rest[2];
    int k = 0;
    if (have < 3) rest[k++] = {q1 + have, 3 - have};
    size_t off2 = have > 3 ? have - 3 : 0;
    rest[k++] = {q2 + off2, 4 - off2};
    r.msg_iov = rest;
    r.msg_iovlen = size_t(k);
    ssize_t n = rrecvmsg(c, &r, 0);
    ASSERT_GT(n, 0);
    have += size_t(n);
  }
  (void)in;
  EXPECT_EQ(std::string("abc"), std::string(q1, 3));
  EXPECT_EQ(std::string("defg"), std::string(q2, 4));
  // Bad descriptors are EBADF, as for the kernel's calls.
  errno = 0;
  EXPECT_EQ(-1, rwrite(-1, "x", 1));
  EXPECT_EQ(EBADF, errno);
  rclose(c);
  rclose(s);
  rclose(l);
}

}  // namespace
}  // namespace rdmacm_api
