// The daemon never blocks on, spins for, or holds uncounted resources for a
// client (docs/PROTOCOL.md, "Descriptors", "Flow control and fairness",
// "Quotas"). Nobody, a raw client of the system daemon, gives it
// descriptors it would block on (an eventfd at its maximum count, a full
// pipe, a full FIFO, a full socket, each cleared of O_NONBLOCK) and raises
// async events to them; makes it hold descriptors by every means it has
// (queued replies it never reads, rings, async sockets, connections); and
// moves its ring's tail while its replies wait unread, then shuts its
// sending half down. Root is served throughout, the daemon's CPU time and
// descriptors stay small, and SIGTERM stops it within a second.
#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "attack.h"

namespace svsec {
namespace {

using sv::proto::Op;

// A request sent without waiting for room (the daemon may have stopped
// reading); false once it does not fit.
template <class Req>
bool send_nowait(int sock, const Req& r) {
  return ::send(sock, &r, sizeof r, MSG_DONTWAIT | MSG_NOSIGNAL) == ssize_t(sizeof r);
}

long ticks_over_two_seconds(pid_t pid) {
  const long before = cpu_ticks_of(pid);
  usleep(2000000);
  const long after = cpu_ticks_of(pid);
  return before < 0 || after < 0 ? 1 << 30 : after - before;
}

int open_fds(pid_t pid) {
  DIR* d = opendir(("/proc/" + std::to_string(pid) + "/fd").c_str());
  if (!d) return -1;
  int n = 0;
  while (dirent* e = readdir(d))
    if (e->d_name[0] != '.') ++n;
  closedir(d);
  return n;
}

// Root's device, a PD, an MR and a QP, within `seconds` (a child: a daemon
// that never answers leaves it to its alarm). 0 or the step that failed.
int root_is_served(unsigned seconds) {
  Child root(false, [seconds](int) {
    alarm(seconds);
    ibv_context* c = open_dev();
    if (!c) return 2;
    ibv_pd* pd = ibv_alloc_pd(c);
    if (!pd) return 3;
    static char buf[4096];
    ibv_mr* mr = ibv_reg_mr(pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE);
    if (!mr) return 4;
    ibv_cq* cq = ibv_create_cq(c, 4, nullptr, nullptr, 0);
    if (!cq) return 5;
    ibv_qp_init_attr ia{};
    ia.send_cq = ia.recv_cq = cq;
    ia.qp_type = IBV_QPT_RC;
    ia.cap.max_send_wr = ia.cap.max_recv_wr = 2;
    ia.cap.max_send_sge = ia.cap.max_recv_sge = 1;
    ibv_qp* qp = ibv_create_qp(pd, &ia);
    if (!qp || qp_to_init(qp, 0) != 0) return 6;
    ibv_destroy_qp(qp);
    ibv_destroy_cq(cq);
    ibv_dereg_mr(mr);
    ibv_dealloc_pd(pd);
    ibv_close_device(c);
    return 0;
  });
  root.start();
  return root.wait();
}

// SIGTERM stops the daemon within a second; one that does not is killed
// (and the answer is false).
bool stops_on_sigterm(SystemDaemon& d) {
  kill(d.pid, SIGTERM);
  for (int i = 0; i < 100; ++i) {
    int st = 0;
    if (waitpid(d.pid, &st, WNOHANG) == d.pid) {
      d.pid = -1;
      return true;
    }
    usleep(10000);
  }
  kill(d.pid, SIGKILL);
  wait_for(d.pid);
  d.pid = -1;
  return false;
}

// ---- Descriptors the daemon would block on ----------------------------------

enum class Trap { kEventfdAtMax, kFullPipe, kFullFifo, kFullSocket };

// A descriptor whose write would sleep for good: its object full, and
// O_NONBLOCK cleared on the description the daemon will share.
sv::Fd make_trap(Trap t, std::vector<sv::Fd>& keep) {
  int w = -1;
  switch (t) {
    case Trap::kEventfdAtMax: {
      w = eventfd(0, EFD_CLOEXEC);
      uint64_t max = 0xfffffffffffffffeull;
      if (w < 0 || write(w, &max, sizeof max) != sizeof max) return sv::Fd();
      return sv::Fd(w);
    }
    case Trap::kFullPipe: {
      int p[2];
      if (pipe2(p, O_CLOEXEC) != 0) return sv::Fd();
      keep.emplace_back(p[0]);
      w = p[1];
      break;
    }
    case Trap::kFullFifo: {
      const std::string path = "/tmp/svblock-fifo-" + std::to_string(getpid());
      unlink(path.c_str());
      if (mkfifo(path.c_str(), 0600) != 0) return sv::Fd();
      w = open(path.c_str(), O_RDWR | O_CLOEXEC);  // O_RDWR: no wait for a reader
      unlink(path.c_str());
      break;
    }
    case Trap::kFullSocket: {
      int p[2];
      if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, p) != 0) return sv::Fd();
      keep.emplace_back(p[0]);
      w = p[1];
      break;
    }
  }
  if (w < 0) return sv::Fd();
  sv::set_nonblocking(w, true);
  char junk[4096] = {};
  while (write(w, junk, sizeof junk) > 0) {
  }
  while (write(w, junk, 1) > 0) {
  }
  sv::set_nonblocking(w, false);
  return sv::Fd(w);
}

// nobody registers the trap as its connection's async descriptor and
// raises async events to itself (SrqLimit on its own SRQ: the daemon
// sends IBV_EVENT_SRQ_LIMIT_REACHED and signals the async descriptor).
// It keeps the trap open until told. Reports RegAsync's status.
void blocking_attack(Trap trap) {
  SystemDaemon sysd;
  ASSERT_TRUE(sysd.alive());
  const std::string socket = sysd.socket();
  Child nobody(true, [socket, trap](int sock) {
    std::vector<sv::Fd> keep;
    sv::Fd fd = make_trap(trap, keep);
    if (!fd.valid()) return 2;
    RawConn raw(socket);
    if (!raw.ok() || !raw_hello(raw)) return 3;
    sv::proto::Empty e{};
    sv::proto::HandleReply pd{};
    if (raw.call(Op::AllocPd, e, pd) != 0) return 4;
    sv::proto::CreateSrqReq sreq{};
    sreq.pd = pd.handle;
    sreq.max_wr = 4;
    sreq.max_sge = 1;
    sreq.srq_type = IBV_SRQT_BASIC;
    sv::proto::CreateSrqReply srq{};
    std::vector<sv::Fd> seg;
    if (raw.call(Op::CreateSrq, sreq, srq, {}, &seg) != 0) return 5;
    sv::proto::Empty reg{};
    const int fds[1] = {fd.get()};
    const int reg_status = raw.call(Op::RegAsync, reg, std::span<const int>(fds));
    if (!send_val(sock, reg_status)) return 6;
    // Events, the daemon's reply to each not awaited (it may never come).
    for (int i = 0; i < 16; ++i) {
      sv::proto::HandleReq lim{};
      sv::proto::init_header(lim, Op::SrqLimit, 100 + uint32_t(i));
      lim.handle = srq.handle;
      if (!send_nowait(raw.fd(), lim)) break;
    }
    int done = 0;
    recv_val(sock, done);
    return 0;
  });
  nobody.start();
  int reg_status = -2;
  ASSERT_TRUE(recv_val(nobody.sock(), reg_status)) << "nobody: exit " << nobody.wait();
  usleep(200000);  // the events are raised
  std::fprintf(stderr, "nobody's RegAsync: %d\n", reg_status);
  EXPECT_EQ(0, root_is_served(5)) << "root is not served (RegAsync was " << reg_status << ")";
  EXPECT_TRUE(stops_on_sigterm(sysd)) << "SIGTERM did not stop the daemon (RegAsync was " << reg_status << ")";
  int done = 1;
  send_val(nobody.sock(), done);
  EXPECT_EQ(0, nobody.wait());
  if (trap != Trap::kFullSocket) {
    EXPECT_EQ(EBADF, reg_status) << "a descriptor other than a socketpair end was taken as the async descriptor";
  }
}

TEST(DaemonBlocking, AsyncEventfdAtItsMaximumCount) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run a child as another user";
  blocking_attack(Trap::kEventfdAtMax);
}

TEST(DaemonBlocking, AsyncFullBlockingPipe) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run a child as another user";
  blocking_attack(Trap::kFullPipe);
}

TEST(DaemonBlocking, AsyncFullBlockingFifo) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run a child as another user";
  blocking_attack(Trap::kFullFifo);
}

TEST(DaemonBlocking, AsyncFullBlockingSocket) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run a child as another user";
  blocking_attack(Trap::kFullSocket);
}

// ---- Descriptors the daemon holds for a user ---------------------------------

constexpr int kFdQuota = 200;

TEST(DaemonBlocking, DescriptorsHeldForAUserStayWithinItsQuota) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run a child as another user";
  setenv("SOFTVERBSD_QUOTA_FD", std::to_string(kFdQuota).c_str(), 1);
  SystemDaemon sysd;
  unsetenv("SOFTVERBSD_QUOTA_FD");
  ASSERT_TRUE(sysd.alive());
  ASSERT_EQ(0, root_is_served(10));
  const int before = open_fds(sysd.pid);
  ASSERT_GT(before, 0);
  const std::string socket = sysd.socket();
  Child nobody(true, [socket](int sock) {
    // Connections, each with a ring, an async socket, and Hello replies
    // (a descriptor each) it never reads, as many as the daemon takes.
    std::vector<std::unique_ptr<RawConn>> conns;
    std::vector<sv::Fd> keep;
    for (int i = 0; i < 80; ++i) {
      auto raw = std::make_unique<RawConn>(socket);
      if (!raw->ok() || !raw_hello(*raw)) break;
      sv::proto::Empty e{};
      sv::proto::PostRingReply ring{};
      std::vector<sv::Fd> got;
      raw->call(Op::PostRing, e, ring, {}, &got);  // its descriptors closed here, the daemon's kept
      int p[2];
      if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, p) != 0) return 2;
      keep.emplace_back(p[0]);
      sv::Fd theirs(p[1]);
      const int fds[1] = {p[1]};
      sv::proto::Empty reg{};
      raw->call(Op::RegAsync, reg, std::span<const int>(fds));
      for (int n = 0; n < 2000; ++n) {
        sv::proto::Empty h{};
        sv::proto::init_header(h, Op::Hello, 1000 + uint32_t(n));
        if (!send_nowait(raw->fd(), h)) break;
      }
      conns.push_back(std::move(raw));
    }
    const int n = int(conns.size());
    if (!send_val(sock, n)) return 3;
    int done = 0;
    recv_val(sock, done);
    return 0;
  });
  nobody.start();
  int conns = 0;
  ASSERT_TRUE(recv_val(nobody.sock(), conns)) << "nobody: exit " << nobody.wait();
  usleep(500000);  // the daemon has read what it will read
  const int held = open_fds(sysd.pid) - before;
  std::fprintf(stderr, "nobody: %d connections; the daemon holds %d more descriptors\n", conns, held);
  // The quota, one reply's descriptors beyond it at most, and a few of the
  // daemon's own it may have opened meanwhile.
  EXPECT_LE(held, kFdQuota + 16) << "over " << conns << " connections of nobody";
  EXPECT_EQ(0, root_is_served(10)) << "root is not served while nobody holds its quota";
  int done = 1;
  send_val(nobody.sock(), done);
  EXPECT_EQ(0, nobody.wait());
  EXPECT_TRUE(stops_on_sigterm(sysd));
}

// Contexts of nobody that each register an implicit ODP MR: the daemon
// keeps each registrant's address space pinned (four descriptors),
// which count in the user's quota like every other descriptor it holds.
TEST(DaemonBlocking, OdpRegistrantsDescriptorsStayWithinItsQuota) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run a child as another user";
  setenv("SOFTVERBSD_QUOTA_FD", std::to_string(kFdQuota).c_str(), 1);
  SystemDaemon sysd;
  unsetenv("SOFTVERBSD_QUOTA_FD");
  ASSERT_TRUE(sysd.alive());
  ASSERT_EQ(0, root_is_served(10));
  const int before = open_fds(sysd.pid);
  ASSERT_GT(before, 0);
  Child nobody(true, [](int sock) {
    int n = 0;
    for (; n < 150; ++n) {
      ibv_context* ctx = open_dev();
      ibv_pd* pd = ctx ? ibv_alloc_pd(ctx) : nullptr;
      if (!pd || !ibv_reg_mr(pd, nullptr, SIZE_MAX, IBV_ACCESS_ON_DEMAND | IBV_ACCESS_LOCAL_WRITE)) break;
    }
    if (!send_val(sock, n)) return 3;
    int done = 0;
    recv_val(sock, done);
    return 0;
  });
  nobody.start();
  int registrants = 0;
  ASSERT_TRUE(recv_val(nobody.sock(), registrants)) << "nobody: exit " << nobody.wait();
  usleep(300000);
  const int held = open_fds(sysd.pid) - before;
  std::fprintf(stderr, "nobody: %d ODP registrants; the daemon holds %d more descriptors\n", registrants, held);
  EXPECT_GT(registrants, 0) << "no ODP registration succeeded";
  EXPECT_LE(held, kFdQuota + 16) << "over " << registrants << " ODP registrants of nobody";
  EXPECT_EQ(0, root_is_served(10)) << "root is not served while nobody holds its quota";
  int done = 1;
  send_val(nobody.sock(), done);
  EXPECT_EQ(0, nobody.wait());
  EXPECT_TRUE(stops_on_sigterm(sysd));
}

// ---- A ring that must not spin the daemon ------------------------------------

TEST(DaemonBlocking, RingMovedWithRepliesUnreadDoesNotSpinTheDaemon) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run a child as another user";
  SystemDaemon sysd;
  ASSERT_TRUE(sysd.alive());
  const std::string socket = sysd.socket();
  Child nobody(true, [socket](int sock) {
    RawConn raw(socket);
    if (!raw.ok() || !raw_hello(raw)) return 2;
    sv::proto::Empty e{};
    sv::proto::PostRingReply rep{};
    std::vector<sv::Fd> fds;
    if (raw.call(Op::PostRing, e, rep, {}, &fds) != 0 || fds.size() != 2) return 3;
    void* map = mmap(nullptr, rep.size, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0].get(), 0);
    if (map == MAP_FAILED) return 4;
    auto* hdr = static_cast<sv::proto::PostRingHeader*>(map);
    // Requests whose replies it never reads, until the daemon stops reading.
    for (int n = 0; n < 4000; ++n) {
      sv::proto::Empty s{};
      sv::proto::init_header(s, Op::Status, 1000 + uint32_t(n));
      if (!send_nowait(raw.fd(), s)) break;
    }
    usleep(300000);
    // The tail moves (a slot of nothing the daemon would run), and it is woken.
    hdr->tail.store(1, std::memory_order_release);
    const uint64_t one = 1;
    if (write(fds[1].get(), &one, sizeof one) != sizeof one) return 5;
    if (!send_val(sock, 1)) return 6;
    int step = 0;
    recv_val(sock, step);
    // Its sending half shut down, its replies still unread.
    shutdown(raw.fd(), SHUT_WR);
    if (!send_val(sock, 2)) return 7;
    recv_val(sock, step);
    return 0;
  });
  nobody.start();
  int step = 0;
  ASSERT_TRUE(recv_val(nobody.sock(), step)) << "nobody: exit " << nobody.wait();
  usleep(200000);
  const long hz = sysconf(_SC_CLK_TCK);
  EXPECT_LT(ticks_over_two_seconds(sysd.pid), hz / 5) << "the daemon spins on a ring it does not serve";
  EXPECT_EQ(0, root_is_served(5));
  send_val(nobody.sock(), 1);
  ASSERT_TRUE(recv_val(nobody.sock(), step));
  usleep(200000);
  EXPECT_LT(ticks_over_two_seconds(sysd.pid), hz / 5) << "the daemon spins on a half-closed connection";
  EXPECT_EQ(0, root_is_served(5));
  send_val(nobody.sock(), 1);
  EXPECT_EQ(0, nobody.wait());
  EXPECT_TRUE(stops_on_sigterm(sysd));
}

}  // namespace
}  // namespace svsec
