// rdma_cm ports between users (daemon/cm_ports.h, docs/RDMACM.md "Users"):
// the system daemon holds every port and writes the rendezvous directory
// alone. nobody, skipping librdmacm (its own unix socket in the directory,
// or CmBind spoken raw), can neither take a privileged port nor plant a
// listener for a port root holds; root's connect and private data reach
// root's listener only.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "attack.h"
#include "rdmacm/rendezvous.h"

namespace svsec {
namespace {

using sv::proto::Op;

// A listening unix socket of nobody's own at `path` (what a user could do
// in a directory writable by all): 0 with the fd, or the errno of bind.
int plant(const std::string& path, int& fd) {
  fd = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  sockaddr_un sun{};
  sun.sun_family = AF_UNIX;
  std::strncpy(sun.sun_path, path.c_str(), sizeof(sun.sun_path) - 1);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&sun), sizeof sun) != 0) {
    int e = errno;
    ::close(fd);
    fd = -1;
    return e;
  }
  ::chmod(path.c_str(), 0666);
  ::listen(fd, 16);
  return 0;
}

// CmBind spoken raw: 0 with the held socket in *held, or the status.
int raw_bind(RawConn& raw, uint16_t port, const char* ip, std::vector<sv::Fd>* held) {
  sv::proto::CmBindReq req{};
  req.ps = RDMA_PS_TCP;
  req.port = port;
  req.family = AF_INET;
  ::inet_pton(AF_INET, ip, req.addr);
  sv::proto::CmBindReply rep{};
  return raw.call(Op::CmBind, req, rep, {}, held);
}

// Waits up to 5 s for the next event of `ch`; its type, or -1.
int next_event(rdma_event_channel* ch, rdma_cm_event** ev) {
  pollfd p{ch->fd, POLLIN, 0};
  if (::poll(&p, 1, 5000) != 1) return -1;
  if (rdma_get_cm_event(ch, ev) != 0) return -1;
  return (*ev)->event;
}

sockaddr_in v4(const char* ip, uint16_t port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  ::inet_pton(AF_INET, ip, &a.sin_addr);
  return a;
}

// Root connects to 127.0.0.1:port with `secret` as private data; true if
// root's listener `lch` saw exactly that request (it rejects it).
bool root_connect_reaches(rdma_event_channel* lch, uint16_t port, const char* secret) {
  rdma_event_channel* ch = rdma_create_event_channel();
  rdma_cm_id* id = nullptr;
  if (!ch || rdma_create_id(ch, &id, nullptr, RDMA_PS_TCP) != 0) return false;
  sockaddr_in dst = v4("127.0.0.1", port);
  rdma_cm_event* ev = nullptr;
  bool ok = rdma_resolve_addr(id, nullptr, reinterpret_cast<sockaddr*>(&dst), 1000) == 0 &&
            next_event(ch, &ev) == RDMA_CM_EVENT_ADDR_RESOLVED;
  if (ok) rdma_ack_cm_event(ev);
  ok = ok && rdma_resolve_route(id, 1000) == 0 && next_event(ch, &ev) == RDMA_CM_EVENT_ROUTE_RESOLVED;
  if (ok) rdma_ack_cm_event(ev);
  rdma_conn_param cp{};
  cp.private_data = secret;
  cp.private_data_len = uint8_t(std::strlen(secret) + 1);
  cp.qp_num = 1;
  ok = ok && rdma_connect(id, &cp) == 0;
  bool seen = false;
  if (ok && next_event(lch, &ev) == RDMA_CM_EVENT_CONNECT_REQUEST) {
    seen = ev->param.conn.private_data_len >= cp.private_data_len &&
           std::memcmp(ev->param.conn.private_data, secret, cp.private_data_len) == 0;
    rdma_cm_id* child = ev->id;
    rdma_ack_cm_event(ev);
    rdma_reject(child, nullptr, 0);
    rdma_destroy_id(child);
  }
  if (ok && next_event(ch, &ev) >= 0) rdma_ack_cm_event(ev);  // REJECTED
  rdma_destroy_id(id);
  rdma_destroy_event_channel(ch);
  return seen;
}

// Root listens on 0.0.0.0:port; the listener's id, or nullptr with *err.
rdma_cm_id* root_listen(rdma_event_channel* ch, uint16_t port, int* err) {
  rdma_cm_id* id = nullptr;
  if (rdma_create_id(ch, &id, nullptr, RDMA_PS_TCP) != 0) return nullptr;
  sockaddr_in a = v4("0.0.0.0", port);
  if (rdma_bind_addr(id, reinterpret_cast<sockaddr*>(&a)) != 0 || rdma_listen(id, 8) != 0) {
    *err = errno;
    rdma_destroy_id(id);
    return nullptr;
  }
  *err = 0;
  return id;
}

// A connection waiting on nobody's planted socket (it must get none).
int pending(int fd) {
  if (fd < 0) return 0;
  int c = ::accept4(fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
  if (c < 0) return 0;
  ::close(c);
  return 1;
}

// Port 999: nobody can take it neither by its own socket in the directory
// nor through the daemon; root's bind then works and root's request (with
// its private data) reaches root's listener and nothing of nobody's.
TEST(CmPorts, PrivilegedPortIsRootsAndConnectsReachRootOnly) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run a child as another user";
  SystemDaemon sysd;
  const std::string dir = sysd.dir, sock = sysd.socket();
  Child nobody(true, [dir, sock](int s) {
    int planted = -1;
    int res[3] = {plant(dir + "/cm/" + sv::rdmacm::rendezvous_name(RDMA_PS_TCP, 999, "0.0.0.0"), planted), -1, 0};
    RawConn raw(sock);
    std::vector<sv::Fd> held;
    res[1] = raw.ok() ? raw_bind(raw, 999, "0.0.0.0", &held) : -2;
    if (!send_bytes(s, res, sizeof res)) return 2;
    char go = 0;
    if (!recv_val(s, go)) return 3;  // root has connected
    int got = pending(planted) + (held.empty() ? 0 : pending(held[0].get()));
    return send_val(s, got) ? 0 : 4;
  });
  nobody.start();
  int res[3] = {-1, -1, -1};
  ASSERT_TRUE(recv_bytes(nobody.sock(), res, sizeof res));
  EXPECT_EQ(EACCES, res[0]) << "nobody made a socket in the rendezvous directory";
  EXPECT_EQ(EACCES, res[1]) << "the daemon let nobody hold port 999";
  rdma_event_channel* lch = rdma_create_event_channel();
  ASSERT_NE(nullptr, lch);
  int err = -1;
  rdma_cm_id* l = root_listen(lch, 999, &err);
  EXPECT_NE(nullptr, l) << "root's rdma_bind_addr to 999: " << std::strerror(err);
  if (l) {
    EXPECT_TRUE(root_connect_reaches(lch, 999, "root-secret"));
  }
  ASSERT_TRUE(send_val(nobody.sock(), char(1)));
  int got = -1;
  ASSERT_TRUE(recv_val(nobody.sock(), got));
  EXPECT_EQ(0, got) << "root's connect reached nobody";
  EXPECT_EQ(0, nobody.wait());
  if (l) rdma_destroy_id(l);
  rdma_destroy_event_channel(lch);
  EXPECT_TRUE(sysd.alive());
}

// An unprivileged port is first come, first served (as TCP): nobody holds
// 20000 and root's bind is EADDRINUSE. Root holds 20001: nobody can hold
// neither its address nor a wildcard of it, nor plant a socket for
// 127.0.0.1:20001 that root's connect would reach first; root's bind under
// nobody's wildcard is EADDRINUSE too.
TEST(CmPorts, HeldPortsAreNotStolen) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run a child as another user";
  SystemDaemon sysd;
  const std::string dir = sysd.dir, sock = sysd.socket();
  Child nobody(true, [dir, sock](int s) {
    RawConn raw(sock);
    std::vector<sv::Fd> mine, stolen1, stolen2;
    int first = raw.ok() ? raw_bind(raw, 20000, "0.0.0.0", &mine) : -2;
    if (!send_val(s, first)) return 2;
    char go = 0;
    if (!recv_val(s, go)) return 3;  // root holds 20001
    int planted = -1;
    int res[3] = {plant(dir + "/cm/" + sv::rdmacm::rendezvous_name(RDMA_PS_TCP, 20001, "127.0.0.1"), planted),
                  raw_bind(raw, 20001, "127.0.0.1", &stolen1), 0};
    sv::proto::CmBindReq req{};
    req.ps = RDMA_PS_TCP;
    req.port = 20001;
    req.family = AF_INET6;  // "::": another user's wildcard on the port
    sv::proto::CmBindReply rep{};
    res[2] = raw.call(Op::CmBind, req, rep, {}, &stolen2);
    if (!send_bytes(s, res, sizeof res)) return 4;
    if (!recv_val(s, go)) return 5;  // root has connected
    int got = pending(planted) + (stolen1.empty() ? 0 : pending(stolen1[0].get())) +
              (stolen2.empty() ? 0 : pending(stolen2[0].get()));
    return send_val(s, got) ? 0 : 6;
  });
  nobody.start();
  int first = -1;
  ASSERT_TRUE(recv_val(nobody.sock(), first));
  EXPECT_EQ(0, first) << "nobody's CmBind of 20000: " << std::strerror(first);
  rdma_event_channel* lch = rdma_create_event_channel();
  ASSERT_NE(nullptr, lch);
  int err = 0;
  rdma_cm_id* taken = root_listen(lch, 20000, &err);
  EXPECT_EQ(nullptr, taken);
  EXPECT_EQ(EADDRINUSE, err);
  rdma_cm_id* specific = nullptr;
  ASSERT_EQ(0, rdma_create_id(lch, &specific, nullptr, RDMA_PS_TCP));
  sockaddr_in lo = v4("127.0.0.1", 20000);
  EXPECT_NE(0, rdma_bind_addr(specific, reinterpret_cast<sockaddr*>(&lo)));
  EXPECT_EQ(EADDRINUSE, errno);
  rdma_destroy_id(specific);
  rdma_cm_id* l = root_listen(lch, 20001, &err);
  ASSERT_NE(nullptr, l) << std::strerror(err);
  ASSERT_TRUE(send_val(nobody.sock(), char(1)));
  int res[3] = {-1, -1, -1};
  ASSERT_TRUE(recv_bytes(nobody.sock(), res, sizeof res));
  EXPECT_EQ(EACCES, res[0]) << "nobody made a socket in the rendezvous directory";
  EXPECT_EQ(EADDRINUSE, res[1]);
  EXPECT_EQ(EADDRINUSE, res[2]);
  EXPECT_TRUE(root_connect_reaches(lch, 20001, "for-root-only"));
  ASSERT_TRUE(send_val(nobody.sock(), char(1)));
  int got = -1;
  ASSERT_TRUE(recv_val(nobody.sock(), got));
  EXPECT_EQ(0, got) << "root's connect reached nobody";
  EXPECT_EQ(0, nobody.wait());
  rdma_destroy_id(l);
  rdma_destroy_event_channel(lch);
  EXPECT_TRUE(sysd.alive());
}

}  // namespace
}  // namespace svsec
