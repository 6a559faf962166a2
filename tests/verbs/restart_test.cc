// Daemon restart while clients run (issue "Robustness", item 2): the daemon
// is killed with SIGKILL in the middle of traffic, three times in a row,
// with three kinds of client running:
// * a requester posting WRITEs and SENDs to a responder process,
// * that responder, reposting receives, with a thread asleep in
//   ibv_get_cq_event,
// * a control-heavy client (register/deregister, PDs, CQs: daemon calls).
// Each must see IBV_EVENT_DEVICE_FATAL, then errors (EIO) from its verbs,
// never a hang (every wait is bounded; a client still alive after 30 s is
// reported hung), and must still be able to tear everything down. Meanwhile
// a new daemon starts on demand in the same SOFTVERBS_DIR (the stale socket
// and lock must not block it) and a new pair of processes works through it
// while the old clients still hold their dead contexts. Round 0 uses a
// daemon started by hand; later rounds kill the one the clients started.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>

#include "common/paths.h"
#include "common/protocol.h"
#include "common/sys.h"
#include "harness.h"

namespace svtest {
namespace {

enum Role : int { kRequester, kResponder, kControl, kRoles };
const char* kRoleName[] = {"requester", "responder", "control"};

// What a client saw after the daemon died.
struct Result {
  int32_t fatal_event;   // 1: IBV_EVENT_DEVICE_FATAL arrived
  int32_t stopped_by;    // the error that ended its work loop (0: it saw the event first)
  int32_t post_send;     // ibv_post_send afterwards
  int32_t post_recv;     // ibv_post_recv afterwards
  int32_t alloc_pd_errno;
  int32_t reg_mr_errno;
  int32_t create_cq_errno;
  int32_t cq_event_errno;  // responder: its sleeping ibv_get_cq_event (EIO)
  int32_t teardown;        // 0 if every destroy and close succeeded
};

struct Shared {
  std::atomic<uint64_t> work[kRoles];  // progress counters, to kill during traffic
};

bool fatal_arrived(ibv_context* c, int ms) {
  int flags = fcntl(c->async_fd, F_GETFL);
  fcntl(c->async_fd, F_SETFL, flags | O_NONBLOCK);
  pollfd p{c->async_fd, POLLIN, 0};
  for (int waited = 0;; waited += 10) {
    ibv_async_event ev;
    if (ibv_get_async_event(c, &ev) == 0) {
      bool fatal = ev.event_type == IBV_EVENT_DEVICE_FATAL;
      ibv_ack_async_event(&ev);
      if (fatal) return true;
      continue;
    }
    if (waited >= ms) return false;
    ::poll(&p, 1, 10);
  }
}

[[noreturn]] void client(Role role, int sock, Shared* sh) {
  alarm(30);  // a hang ends as SIGALRM, which the test reports
  Side s;
  Side::Options o;
  o.len = 1 << 20;
  if (s.open(o)) _exit(2);
  PeerInfo me{s.qp->qp_num, s.mr->rkey, reinterpret_cast<uint64_t>(s.buf), s.len};
  if (!put(sock, me)) _exit(3);
  PeerInfo peer{};
  if (!get(sock, peer)) _exit(4);
  if (role != kControl && s.connect(peer.qpn, o)) _exit(5);
  ibv_comp_channel* ch = ibv_create_comp_channel(s.ctx);
  ibv_cq* ev_cq = ch ? ibv_create_cq(s.ctx, 4, nullptr, ch, 0) : nullptr;
  if (!ev_cq || ibv_req_notify_cq(ev_cq, 0)) _exit(6);
  std::atomic<int> cq_event_errno{-1};
  std::thread sleeper;
  if (role == kResponder) {
    sleeper = std::thread([&] {
      ibv_cq* got;
      void* cq_ctx;
      int rc = ibv_get_cq_event(ch, &got, &cq_ctx);
      cq_event_errno = rc == 0 ? 0 : errno;
    });
  }
  uint32_t go = 0;
  if (!put(sock, uint32_t(1)) || !get(sock, go)) _exit(7);

  Result r{};
  r.cq_event_errno = -1;
  bool dead = false;
  uint64_t n = 0;
  auto post_recv = [&](uint64_t i) {
    ibv_sge sge{reinterpret_cast<uint64_t>(s.buf) + 4096 * (i % 64), 4096, s.mr->lkey};
    ibv_recv_wr wr{};
    wr.wr_id = i;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    ibv_recv_wr* bad;
    return ibv_post_recv(s.qp, &wr, &bad);
  };
  if (role == kResponder)
    for (uint64_t i = 0; i < 32 && !r.stopped_by; ++i) r.stopped_by = post_recv(i);
  uint64_t posted = 32;
  while (!dead && !r.stopped_by) {
    switch (role) {
      case kRequester: {
        // A WRITE and a SEND (the responder keeps receives posted), signaled.
        for (ibv_wr_opcode op : {IBV_WR_RDMA_WRITE, IBV_WR_SEND}) {
          ibv_sge sge{reinterpret_cast<uint64_t>(s.buf), 4096, s.mr->lkey};
          ibv_send_wr wr{};
          wr.wr_id = n;
          wr.sg_list = &sge;
          wr.num_sge = 1;
          wr.opcode = op;
          wr.send_flags = IBV_SEND_SIGNALED;
          wr.wr.rdma.remote_addr = peer.addr + (n % 64) * 4096;
          wr.wr.rdma.rkey = peer.rkey;
          ibv_send_wr* bad;
          if (int e = ibv_post_send(s.qp, &wr, &bad)) {
            r.stopped_by = e;
            break;
          }
          auto wc = poll(s.cq, 1, 100);  // RNR waits are short; a lost peer is not waited for
          (void)wc;
        }
        break;
      }
      case kResponder: {
        ibv_wc wc[8];
        int got = ibv_poll_cq(s.cq, 8, wc);
        if (got < 0) r.stopped_by = EIO;
        for (int i = 0; i < got && !r.stopped_by; ++i) r.stopped_by = post_recv(posted++);
        break;
      }
      case kControl: {
        void* p = nullptr;
        if (posix_memalign(&p, 4096, 1 << 16)) _exit(8);
        ibv_mr* mr = ibv_reg_mr(s.pd, p, 1 << 16, IBV_ACCESS_LOCAL_WRITE);
        ibv_pd* pd = ibv_alloc_pd(s.ctx);
        ibv_cq* cq = ibv_create_cq(s.ctx, 64, nullptr, nullptr, 0);
        if (!mr || !pd || !cq) r.stopped_by = errno ? errno : EIO;
        if (cq) ibv_destroy_cq(cq);
        if (pd) ibv_dealloc_pd(pd);
        if (mr) ibv_dereg_mr(mr);
        free(p);
        break;
      }
      default:
        break;
    }
    sh->work[role].fetch_add(1, std::memory_order_relaxed);
    n++;
    // Without an error, the event says the daemon is gone.
    if ((n & 15) == 0) {
      ibv_async_event ev;
      int flags = fcntl(s.ctx->async_fd, F_GETFL);
      fcntl(s.ctx->async_fd, F_SETFL, flags | O_NONBLOCK);
      if (ibv_get_async_event(s.ctx, &ev) == 0) {
        dead = ev.event_type == IBV_EVENT_DEVICE_FATAL;
        r.fatal_event = dead;
        ibv_ack_async_event(&ev);
      }
    }
  }
  if (!r.fatal_event) r.fatal_event = fatal_arrived(s.ctx, 5000);
  // After IBV_EVENT_DEVICE_FATAL, verbs fail instead of hanging.
  ibv_sge sge{reinterpret_cast<uint64_t>(s.buf), 8, s.mr->lkey};
  ibv_send_wr swr{};
  swr.sg_list = &sge;
  swr.num_sge = 1;
  swr.opcode = IBV_WR_RDMA_WRITE;
  swr.wr.rdma.remote_addr = peer.addr;
  swr.wr.rdma.rkey = peer.rkey;
  ibv_send_wr* sbad;
  r.post_send = role == kControl ? EIO : ibv_post_send(s.qp, &swr, &sbad);
  r.post_recv = post_recv(0);
  errno = 0;
  ibv_pd* pd = ibv_alloc_pd(s.ctx);
  r.alloc_pd_errno = pd ? 0 : errno;
  errno = 0;
  ibv_mr* mr = ibv_reg_mr(s.pd, s.buf + 8192, 4096, IBV_ACCESS_LOCAL_WRITE);
  r.reg_mr_errno = mr ? 0 : errno;
  errno = 0;
  ibv_cq* cq = ibv_create_cq(s.ctx, 8, nullptr, nullptr, 0);
  r.create_cq_errno = cq ? 0 : errno;
  if (sleeper.joinable()) sleeper.join();
  r.cq_event_errno = cq_event_errno.load();
  if (!put(sock, r)) _exit(9);
  // Stay alive, holding the dead context, while the test starts a new
  // daemon; then tear down.
  uint32_t teardown = 0;
  if (!get(sock, teardown, 20000)) _exit(10);
  int bad = 0;
  bad |= ibv_destroy_cq(ev_cq);
  bad |= ibv_destroy_comp_channel(ch);
  bad |= ibv_destroy_qp(s.qp);
  s.qp = nullptr;
  bad |= ibv_destroy_cq(s.cq);
  s.cq = nullptr;
  bad |= ibv_dereg_mr(s.mr);
  s.mr = nullptr;
  bad |= ibv_dealloc_pd(s.pd);
  s.pd = nullptr;
  bad |= ibv_close_device(s.ctx);
  s.ctx = nullptr;
  put(sock, int32_t(bad));
  _exit(0);
}

std::string daemon_binary() {
  char buf[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return "softverbsd";
  buf[n] = 0;
  std::string p(buf);
  return p.substr(0, p.rfind('/')) + "/../bin/softverbsd";
}

bool daemon_status(sv::proto::StatusReply& rep) {
  sv::Fd sock;
  if (sv::connect_seqpacket(sv::socket_path(sv::runtime_dir()), sock) != 0) return false;
  sv::proto::Empty req{};
  sv::proto::init_header(req, sv::proto::Op::Status, 1);
  if (sv::send_message(sock.get(), &req, sizeof(req), {}) != 0) return false;
  uint8_t buf[sv::proto::kMaxMessage];
  size_t n = 0;
  std::vector<sv::Fd> fds;
  if (sv::recv_message(sock.get(), buf, sizeof(buf), &n, fds) != 0 || n < sizeof(rep)) return false;
  std::memcpy(&rep, buf, sizeof(rep));
  return rep.h.status == 0;
}

TEST(Restart, DaemonKilledDuringTrafficClientsGetErrorsNewDaemonServes) {
  char tmpl[] = "/tmp/softverbs-restart-XXXXXX";
  ASSERT_NE(nullptr, mkdtemp(tmpl));
  std::string dir = tmpl;
  std::string old = getenv("SOFTVERBS_DIR") ? getenv("SOFTVERBS_DIR") : "";
  setenv("SOFTVERBS_DIR", dir.c_str(), 1);
  void* page = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(MAP_FAILED, page);
  Shared* sh = new (page) Shared();
  uint32_t last_daemon = 0;

  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    pid_t by_hand = -1;
    if (round == 0) {
      std::string bin = daemon_binary();
      by_hand = fork();
      if (by_hand == 0) {
        execl(bin.c_str(), "softverbsd", "--foreground", "--idle", "0", "--dir", dir.c_str(), nullptr);
        _exit(127);
      }
      setenv("SOFTVERBS_NO_SPAWN", "1", 1);  // that daemon only
    }
    int socks[kRoles];
    pid_t pids[kRoles];
    for (int r = 0; r < kRoles; ++r) {
      int sv[2];
      ASSERT_EQ(0, socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv));
      pids[r] = fork();
      if (pids[r] == 0) {
        close(sv[0]);
        client(Role(r), sv[1], sh);
      }
      close(sv[1]);
      socks[r] = sv[0];
    }
    PeerInfo info[kRoles];
    for (int r = 0; r < kRoles; ++r) ASSERT_TRUE(get(socks[r], info[r])) << kRoleName[r] << " did not start";
    ASSERT_TRUE(put(socks[kRequester], info[kResponder]));
    ASSERT_TRUE(put(socks[kResponder], info[kRequester]));
    ASSERT_TRUE(put(socks[kControl], info[kControl]));
    uint32_t ready;
    for (int r = 0; r < kRoles; ++r) ASSERT_TRUE(get(socks[r], ready)) << kRoleName[r] << " not ready";
    sv::proto::StatusReply st{};
    ASSERT_TRUE(daemon_status(st));
    pid_t daemon = pid_t(st.daemon_pid);
    EXPECT_NE(last_daemon, st.daemon_pid) << "the same daemon serves again";
    last_daemon = st.daemon_pid;
    uint64_t before[kRoles];
    for (int r = 0; r < kRoles; ++r) before[r] = sh->work[r].load();
    for (int r = 0; r < kRoles; ++r) ASSERT_TRUE(put(socks[r], uint32_t(1)));
    // Kill only once every client is busy.
    auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    for (;;) {
      bool busy = true;
      for (int r = 0; r < kRoles; ++r) busy &= sh->work[r].load() > before[r] + 20;
      if (busy) break;
      ASSERT_LT(std::chrono::steady_clock::now(), until) << "no traffic";
      usleep(1000);
    }
    ASSERT_EQ(0, kill(daemon, SIGKILL));
    if (by_hand > 0) {
      int s;
      waitpid(by_hand, &s, 0);
    }
    for (int r = 0; r < kRoles; ++r) {
      SCOPED_TRACE(kRoleName[r]);
      Result res{};
      ASSERT_TRUE(get(socks[r], res, 20000)) << "no answer: hung?";
      EXPECT_EQ(1, res.fatal_event) << "no IBV_EVENT_DEVICE_FATAL";
      if (r != kControl) {
        EXPECT_EQ(EIO, res.post_send);
      }
      EXPECT_EQ(EIO, res.post_recv);
      EXPECT_NE(0, res.alloc_pd_errno);
      EXPECT_NE(0, res.reg_mr_errno);
      EXPECT_NE(0, res.create_cq_errno);
      if (r == kResponder) {
        EXPECT_EQ(EIO, res.cq_event_errno) << "the sleeper in ibv_get_cq_event";
      }
    }
    // A new daemon starts on demand in the same directory, while the old
    // clients still hold their dead contexts, and serves a new pair.
    unsetenv("SOFTVERBS_NO_SPAWN");
    {
      Side me;
      Peer peer;
      PeerInfo pi;
      ASSERT_EQ(0, connect_pair(me, peer, pi));
      for (uint64_t i = 0; i < 4096; ++i) me.buf[i] = pattern(uint8_t(round), i);
      ibv_sge sge{reinterpret_cast<uint64_t>(me.buf), 4096, me.mr->lkey};
      ibv_send_wr wr{};
      wr.sg_list = &sge;
      wr.num_sge = 1;
      wr.opcode = IBV_WR_RDMA_WRITE;
      wr.send_flags = IBV_SEND_SIGNALED;
      wr.wr.rdma.remote_addr = pi.addr;
      wr.wr.rdma.rkey = pi.rkey;
      ibv_send_wr* bad;
      ASSERT_EQ(0, ibv_post_send(me.qp, &wr, &bad));
      auto wc = poll(me.cq, 1);
      ASSERT_EQ(1u, wc.size());
      EXPECT_EQ(IBV_WC_SUCCESS, wc[0].status);
      EXPECT_EQ(checksum(me.buf, 4096), peer.checksum(0, 4096));
      sv::proto::StatusReply now{};
      ASSERT_TRUE(daemon_status(now));
      EXPECT_NE(uint32_t(daemon), now.daemon_pid);
    }
    for (int r = 0; r < kRoles; ++r) {
      SCOPED_TRACE(kRoleName[r]);
      int32_t teardown = -1;
      ASSERT_TRUE(put(socks[r], uint32_t(1)));
      ASSERT_TRUE(get(socks[r], teardown));
      EXPECT_EQ(0, teardown) << "destroying objects of a dead device failed";
      int s = 0;
      waitpid(pids[r], &s, 0);
      EXPECT_TRUE(WIFEXITED(s) && WEXITSTATUS(s) == 0)
          << (WIFSIGNALED(s) && WTERMSIG(s) == SIGALRM ? "hung" : "failed") << " status " << s;
      close(socks[r]);
    }
  }
  munmap(page, 4096);
  if (old.empty()) unsetenv("SOFTVERBS_DIR");
  else setenv("SOFTVERBS_DIR", old.c_str(), 1);
}

}  // namespace
}  // namespace svtest
