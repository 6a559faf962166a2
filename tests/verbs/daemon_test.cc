// The daemon as a resource manager: it releases what a dead client held, and
// a client that speaks raw, malformed or forged messages gets errors, never
// a crash, and never another client's objects.
#include <gtest/gtest.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <sys/socket.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "common/paths.h"
#include "common/protocol.h"
#include "common/sys.h"
#include "harness.h"

namespace svtest {
namespace {

using namespace sv;

class RawClient {
 public:
  RawClient() { EXPECT_EQ(0, connect_seqpacket(socket_path(runtime_dir()), sock_)); }

  // Sends raw bytes; returns the reply's status (or -1 if the daemon hung up).
  int send_raw(const void* msg, size_t len, std::span<const int> fds = {}, std::vector<Fd>* got = nullptr,
               void* reply = nullptr, size_t reply_len = 0) {
    if (send_message(sock_.get(), msg, len, fds) != 0) return -1;
    uint8_t buf[proto::kMaxMessage];
    size_t n = 0;
    std::vector<Fd> fdv;
    if (recv_message(sock_.get(), buf, sizeof(buf), &n, fdv) != 0 || n < sizeof(proto::Header)) return -1;
    if (got) *got = std::move(fdv);
    if (reply) std::memcpy(reply, buf, std::min(n, reply_len));
    proto::Header h;
    std::memcpy(&h, buf, sizeof(h));
    return h.status;
  }
  template <class Req>
  int send(proto::Op op, Req& r, std::span<const int> fds = {}) {
    proto::init_header(r, op, 7);
    return send_raw(&r, sizeof(r), fds);
  }
  proto::StatusReply status() {
    proto::Empty req{};
    proto::init_header(req, proto::Op::Status, 1);
    proto::StatusReply rep{};
    send_raw(&req, sizeof(req), {}, nullptr, &rep, sizeof(rep));
    return rep;
  }

 private:
  Fd sock_;
};

// Makes sure a daemon runs (opening a device starts it).
void ensure_daemon() {
  Side s;
  ASSERT_EQ(0, s.open({}));
}

TEST(Daemon, ReleasesEverythingADeadClientHeld) {
  ensure_daemon();
  RawClient probe;
  auto before = probe.status();
  {
    Peer p;
    ASSERT_NE(0u, p.open({}).qpn);
    auto during = probe.status();
    EXPECT_EQ(before.qps + 1, during.qps);
    EXPECT_EQ(before.mrs + 1, during.mrs);
    p.kill9();
  }
  proto::StatusReply after{};
  for (int i = 0; i < 3000; ++i) {  // up to 30 s for the daemon to see the deaths
    after = probe.status();
    if (after.qps == before.qps && after.clients == before.clients) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(before.clients, after.clients);
  EXPECT_EQ(before.pds, after.pds);
  EXPECT_EQ(before.mrs, after.mrs);
  EXPECT_EQ(before.cqs, after.cqs);
  EXPECT_EQ(before.qps, after.qps);
  EXPECT_EQ(before.backings, after.backings);
}

TEST(Daemon, MalformedMessagesGetErrors) {
  ensure_daemon();
  RawClient c;
  proto::Empty hello{};
  proto::init_header(hello, proto::Op::AllocPd);
  hello.h.magic = 0x12345678;
  EXPECT_EQ(EPROTO, c.send_raw(&hello, sizeof(hello)));
  proto::init_header(hello, proto::Op::AllocPd);
  hello.h.version = 99;
  EXPECT_EQ(EPROTO, c.send_raw(&hello, sizeof(hello)));
  uint8_t tiny[3] = {1, 2, 3};
  EXPECT_EQ(EPROTO, c.send_raw(tiny, sizeof(tiny)));
  // Truncated and oversized bodies.
  proto::RegMrReq mr{};
  proto::init_header(mr, proto::Op::RegMr);
  EXPECT_EQ(EINVAL, c.send_raw(&mr, sizeof(mr) - 4));
  uint8_t big[proto::kMaxMessage] = {};
  std::memcpy(big, &mr, sizeof(mr));
  EXPECT_EQ(EINVAL, c.send_raw(big, sizeof(mr) + 8));
  // Unknown op.
  proto::init_header(hello, proto::Op(999));
  EXPECT_EQ(EOPNOTSUPP, c.send_raw(&hello, sizeof(hello)));
  // A descriptor the op does not take.
  int efd = ::eventfd(0, EFD_CLOEXEC);
  proto::init_header(hello, proto::Op::AllocPd);
  int fds[1] = {efd};
  EXPECT_EQ(EBADF, c.send_raw(&hello, sizeof(hello), fds));
  // An op that needs a descriptor, without one.
  proto::Empty ch{};
  EXPECT_EQ(EBADF, c.send(proto::Op::CreateChannel, ch));
  ::close(efd);
  // The daemon still serves.
  proto::Empty pd{};
  EXPECT_EQ(0, c.send(proto::Op::AllocPd, pd));
}

TEST(Daemon, ForgedAndForeignHandlesAreRefused) {
  ensure_daemon();
  Peer p;
  PeerInfo info = p.open({});
  ASSERT_NE(0u, info.qpn);
  RawClient c;
  // Another process's QP, and a made-up one.
  proto::HandleReq h{};
  h.handle = info.qpn;
  EXPECT_EQ(EINVAL, c.send(proto::Op::DestroyQp, h));
  h.handle = 0xdeadbe;
  EXPECT_EQ(EINVAL, c.send(proto::Op::DestroyQp, h));
  // Another process's MR by handle (slot = key >> 8).
  h.handle = info.rkey >> 8;
  EXPECT_EQ(EINVAL, c.send(proto::Op::DeregMr, h));
  // Its memory by key: we own no QP connected to it.
  proto::GetMrBackingReq g{};
  g.key = info.rkey;
  EXPECT_EQ(EACCES, c.send(proto::Op::GetMrBacking, g));
  // Registering with a PD and backing we do not hold.
  proto::RegMrReq mr{};
  mr.pd = 1;
  mr.backing = 1;
  mr.addr = 4096;
  mr.length = 4096;
  EXPECT_EQ(EINVAL, c.send(proto::Op::RegMr, mr));
  // Absurd sizes.
  proto::CreateCqReq cq{};
  cq.cqe = 0xffffffff;
  EXPECT_EQ(EINVAL, c.send(proto::Op::CreateCq, cq));
  // The peer's objects are untouched.
  EXPECT_EQ(0, p.post_recv(1, 0, 8));
}

// UDP 4791 belongs to a per-user daemon by default, but never with
// SOFTVERBS_ROCE=0 (docs/ROCE.md; the tests' daemons run so, tests/verbs/main.cc):
// then no QP can be attached to the wire.
TEST(Daemon, RoceAttachRefusedWithRoceOff) {
  if (const char* e = std::getenv("SOFTVERBS_ROCE"); !e || std::strcmp(e, "0") != 0) GTEST_SKIP();
  ensure_daemon();
  Side s;
  ASSERT_EQ(0, s.open({}));
  RawClient c;
  proto::RoceAttachReq r{};
  r.qpn = s.qp->qp_num;
  r.sgid[10] = r.sgid[11] = 0xff;
  EXPECT_EQ(EOPNOTSUPP, c.send(proto::Op::RoceAttach, r));
}

// The daemon serves its own network namespace only (common/paths.h): it
// answers EXDEV to a caller of another one, and says which it serves.
TEST(Daemon, NetnsCheck) {
  ensure_daemon();
  RawClient c;
  const NetnsId self = netns_self();
  proto::NetnsMsg m{};
  m.dev = self.dev;
  m.ino = self.ino;
  EXPECT_EQ(0, c.send(proto::Op::Netns, m));
  proto::NetnsMsg other = m;
  other.ino ^= 1;
  EXPECT_EQ(EXDEV, c.send(proto::Op::Netns, other));
  other.flags = proto::kNetnsQuery;  // only asking
  EXPECT_EQ(0, c.send(proto::Op::Netns, other));
}

// SOFTVERBS_DIR set to `dir` (a directory made for one test) while this
// lives; then the variable as it was, and the directory removed.
class OwnDir {
 public:
  explicit OwnDir(const std::string& dir) : dir_(dir) {
    const char* old = getenv("SOFTVERBS_DIR");
    had_ = old != nullptr;
    if (old) old_ = old;
    setenv("SOFTVERBS_DIR", dir.c_str(), 1);
  }
  ~OwnDir() {
    if (had_) setenv("SOFTVERBS_DIR", old_.c_str(), 1);
    else unsetenv("SOFTVERBS_DIR");
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

 private:
  std::string dir_, old_;
  bool had_ = false;
};

ibv_context* open_first_device() {
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (!list) return nullptr;
  ibv_context* ctx = n > 0 ? ibv_open_device(list[0]) : nullptr;
  ibv_free_device_list(list);
  return ctx;
}

// The daemon a process starts stays in that process's session: under
// autogroup scheduling (sched(7)) a session is a scheduling group, and a
// daemon alone in a group of its own was left runnable but unrun for over
// 30 s while its clients (another group) spun on every CPU waiting for it
// (KillSharedQp.ThreeWritersFiftyKillsNothingLostNothingWedged on 2 CPUs).
// It leads a process group of its own, so that a signal to the starter's
// group (Ctrl-C, timeout(1)) does not reach it.
TEST(Daemon, StartedInTheStartersSessionInAProcessGroupOfItsOwn) {
  // A directory of our own: the daemon there is started by this process.
  char dir[] = "/tmp/softverbs-session-XXXXXX";
  ASSERT_NE(nullptr, mkdtemp(dir));
  OwnDir own(dir);
  ibv_context* ctx = open_first_device();
  ASSERT_NE(nullptr, ctx) << "no daemon started in " << dir;
  Fd sock;
  ASSERT_EQ(0, connect_seqpacket(socket_path(dir), sock));
  PeerCred daemon{};
  ASSERT_EQ(0, peer_credentials(sock.get(), daemon));
  Fd pidfd;
  ASSERT_EQ(0, pidfd_open(daemon.pid, pidfd));
  EXPECT_EQ(getsid(0), getsid(daemon.pid)) << "the daemon left the session of the process that started it";
  EXPECT_EQ(daemon.pid, getpgid(daemon.pid)) << "the daemon does not lead a process group of its own";
  EXPECT_NE(getpgid(0), getpgid(daemon.pid));
  auto autogroup = [](const std::string& pid) {  // "/autogroup-N nice K": the group's name
    std::ifstream f("/proc/" + pid + "/autogroup");
    std::string name;
    f >> name;
    return name;
  };
  if (const std::string mine = autogroup("self"); !mine.empty()) {
    EXPECT_EQ(mine, autogroup(std::to_string(daemon.pid)));
  }
  sock.reset();
  ibv_close_device(ctx);
  // Ours to stop (it would linger for SOFTVERBSD_IDLE): SIGTERM, then its exit.
  ASSERT_EQ(0, kill(daemon.pid, SIGTERM));
  pollfd p{pidfd.get(), POLLIN, 0};
  EXPECT_EQ(1, poll(&p, 1, 60000)) << "the daemon did not exit on SIGTERM";
}

// A reply that comes after its caller stopped waiting for it (the call
// timed out: a daemon held up on a loaded machine) is dropped by the call
// that reads it next, which waits for its own. Taken as that call's, it put
// every later call of the connection one reply out of step (EPROTO: a
// KillSharedQp writer's svx_unpack failed so after a timed-out import).
// A proxy between the library and the daemon plays the late reply: before
// the daemon's reply to the second AllocPd it delivers a copy of the first's.
TEST(Daemon, ALateReplyIsDroppedNotTakenForTheNextCallsReply) {
  ensure_daemon();
  const std::string daemon_dir = runtime_dir();
  char dir[] = "/tmp/softverbs-late-XXXXXX";
  ASSERT_NE(nullptr, mkdtemp(dir));
  Fd listener;
  ASSERT_EQ(0, listen_seqpacket(socket_path(dir), listener));
  std::atomic<int> late{0};
  std::thread proxy([&] {
    pollfd l{listener.get(), POLLIN, 0};
    if (::poll(&l, 1, 30000) != 1) return;  // the library never came
    Fd lib(::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
    Fd daemon;
    if (!lib.valid() || connect_seqpacket(socket_path(daemon_dir), daemon) != 0) return;
    std::vector<uint8_t> first;  // the first AllocPd reply
    pollfd p[2] = {{lib.get(), POLLIN, 0}, {daemon.get(), POLLIN, 0}};
    while (::poll(p, 2, 30000) > 0) {
      for (int i = 0; i < 2; ++i) {
        if (!p[i].revents) continue;
        uint8_t buf[proto::kMaxMessage];
        size_t len = 0;
        std::vector<Fd> fds;
        if (recv_message(p[i].fd, buf, sizeof buf, &len, fds) != 0 || len < sizeof(proto::Header)) return;
        const int to = i == 0 ? daemon.get() : lib.get();
        proto::Header h;
        std::memcpy(&h, buf, sizeof h);
        if (i == 1 && h.seq != 0 && h.op == uint16_t(proto::Op::AllocPd)) {
          if (first.empty()) {
            first.assign(buf, buf + len);
          } else if (!late.exchange(1) && send_message(to, first.data(), first.size(), {}) != 0) {
            return;
          }
        }
        std::vector<int> raw;
        for (const Fd& f : fds) raw.push_back(f.get());
        if (send_message(to, buf, len, raw) != 0) return;
      }
    }
  });
  {
    OwnDir own(dir);
    ibv_context* ctx = open_first_device();
    EXPECT_NE(nullptr, ctx);
    if (ctx) {
      ibv_pd* a = ibv_alloc_pd(ctx);
      ibv_pd* b = ibv_alloc_pd(ctx);  // reads the late copy of a's reply first
      const int b_errno = errno;
      ibv_pd* c = ibv_alloc_pd(ctx);  // in step after it
      EXPECT_NE(nullptr, a);
      EXPECT_NE(nullptr, b) << "the late reply was taken for this call's: " << std::strerror(b_errno);
      EXPECT_NE(nullptr, c);
      EXPECT_EQ(1, late.load()) << "the proxy never delivered the late reply";
      for (ibv_pd* pd : {a, b, c}) {
        if (pd) {
          EXPECT_EQ(0, ibv_dealloc_pd(pd));
        }
      }
      ibv_close_device(ctx);  // the proxy sees the connection closed, and ends
    }
  }
  proxy.join();
}

}  // namespace
}  // namespace svtest
