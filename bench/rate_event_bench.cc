// rate_event_bench: message rate over several QPs, and latency when both
// sides sleep in ibv_get_cq_event, each beside its raw limit.
//
//   rate   --qps N: one client thread keeps 8 B inline RDMA WRITEs in flight
//          on N RC QPs (round robin, one WR per ibv_post_send, every 16th
//          signalled per QP, up to --window outstanding per QP), one shared
//          send CQ; messages completed per second.  The server does nothing.
//   event  SEND/RECV ping-pong of 8 B where each side waits for its receive
//          in ibv_get_cq_event (completion channel on the receive CQ), then
//          the same ping-pong with busy polling.  The library reads
//          SOFTVERBS_SPIN_US once: run the program once per setting.
//   wake   the limits for blocking wake-ups between two processes: a futex
//          ping-pong on a shared word and an eventfd ping-pong (blocking
//          read/write on two eventfds).
// All latencies are one-way (RTT/2).  Output: JSON lines on stdout.
// Processes: fork() gives client (parent) and server (child); a socketpair
// created before fork carries the QP numbers and the barriers.
#include <infiniband/verbs.h>
#include <linux/futex.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench_common.h"

namespace {

const char *g_role = "client";
bool g_pin = false;  // --pin: client (parent) on CPU 0, server (child) on CPU 1

void pin_to(int cpu) {
  if (!g_pin) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  if (sched_setaffinity(0, sizeof set, &set)) std::perror("sched_setaffinity");
}

[[noreturn]] void die(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void die(const char *fmt, ...) {
  char msg[512];
  int n = std::snprintf(msg, sizeof msg, "rate_event_bench %s: ", g_role);
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(msg + n, sizeof msg - static_cast<size_t>(n) - 1, fmt, ap);
  va_end(ap);
  std::strcat(msg, "\n");
  std::fflush(stdout);
  ssize_t r = write(2, msg, std::strlen(msg));
  (void)r;
  _exit(1);
}

void xfer(int fd, void *p, size_t n, bool out) {
  char *c = static_cast<char *>(p);
  while (n) {
    ssize_t r = out ? write(fd, c, n) : read(fd, c, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) die("socket %s failed (peer failed?)", out ? "write" : "read");
    c += r;
    n -= static_cast<size_t>(r);
  }
}

void barrier(int fd) {
  char b = 'b';
  xfer(fd, &b, 1, true);
  xfer(fd, &b, 1, false);
}

// Runs `fn(client, sock)` in a forked server and in this process (client);
// returns when both are done, dies if the server failed.
template <class F>
void two_processes(F fn) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv)) die("socketpair: %s", std::strerror(errno));
  std::fflush(stdout);
  pid_t pid = fork();
  if (pid < 0) die("fork: %s", std::strerror(errno));
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    g_role = "server";
    pin_to(1);
    close(sv[0]);
    fn(false, sv[1]);
    std::fflush(stdout);
    _exit(0);
  }
  close(sv[1]);
  pin_to(0);
  fn(true, sv[0]);
  close(sv[0]);
  int st = 0;
  if (waitpid(pid, &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) die("server process failed");
}

// ------------------------------------------------------------ verbs setup --

struct Side {
  ibv_context *ctx = nullptr;
  ibv_pd *pd = nullptr;
  ibv_mr *mr = nullptr;
  ibv_comp_channel *ch = nullptr;
  ibv_cq *scq = nullptr, *rcq = nullptr;
  std::vector<ibv_qp *> qps;
  char *buf = nullptr;
  size_t len = 0;
  unsigned max_inline = 0;
  uint64_t raddr = 0;
  uint32_t rkey = 0;
};

void open_side(Side &s, unsigned nqp, unsigned sq, unsigned rq, bool channel) {
  int n = 0;
  ibv_device **l = ibv_get_device_list(&n);
  if (!l || !n) die("no RDMA devices found (is softverbs on LD_LIBRARY_PATH?)");
  s.ctx = ibv_open_device(l[0]);
  ibv_free_device_list(l);
  if (!s.ctx) die("ibv_open_device failed: %s", std::strerror(errno));
  s.pd = ibv_alloc_pd(s.ctx);
  s.len = 4096 + 64 * static_cast<size_t>(nqp);
  if (posix_memalign(reinterpret_cast<void **>(&s.buf), 4096, s.len)) die("posix_memalign");
  std::memset(s.buf, 0, s.len);
  s.mr = s.pd ? ibv_reg_mr(s.pd, s.buf, s.len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE) : nullptr;
  if (!s.mr) die("ibv_alloc_pd/ibv_reg_mr failed: %s", std::strerror(errno));
  if (channel && !(s.ch = ibv_create_comp_channel(s.ctx))) die("ibv_create_comp_channel failed");
  s.scq = ibv_create_cq(s.ctx, static_cast<int>(std::max(256u, nqp * 16)), nullptr, nullptr, 0);
  s.rcq = ibv_create_cq(s.ctx, static_cast<int>(std::max(64u, rq)), nullptr, s.ch, 0);
  if (!s.scq || !s.rcq) die("ibv_create_cq failed: %s", std::strerror(errno));
  for (unsigned i = 0; i < nqp; ++i) {
    ibv_qp_init_attr qa{};
    qa.send_cq = s.scq;
    qa.recv_cq = s.rcq;
    qa.cap.max_send_wr = sq;
    qa.cap.max_recv_wr = rq;
    qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
    qa.cap.max_inline_data = 64;
    qa.qp_type = IBV_QPT_RC;
    ibv_qp *qp = ibv_create_qp(s.pd, &qa);
    if (!qp) die("ibv_create_qp #%u failed: %s", i, std::strerror(errno));
    s.max_inline = qa.cap.max_inline_data;
    s.qps.push_back(qp);
  }
}

// Exchanges QP numbers, buffer address and rkey, then takes every QP to RTS
// (RoCE: GID index 0 is ::ffff:127.0.0.1 on softverbs).
void connect_side(Side &s, int sock) {
  ibv_port_attr port{};
  if (ibv_query_port(s.ctx, 1, &port)) die("ibv_query_port failed");
  ibv_gid gid{};
  ibv_query_gid(s.ctx, 1, 0, &gid);
  struct Hdr {
    uint64_t addr;
    uint32_t rkey, nqp;
    uint16_t lid;
    uint8_t gid[16];
  } mine{reinterpret_cast<uintptr_t>(s.buf), s.mr->rkey, static_cast<uint32_t>(s.qps.size()), port.lid, {}},
      theirs{};
  std::memcpy(mine.gid, gid.raw, 16);
  std::vector<uint32_t> qpn, rqpn(s.qps.size());
  for (ibv_qp *q : s.qps) qpn.push_back(q->qp_num);
  xfer(sock, &mine, sizeof mine, true);
  xfer(sock, qpn.data(), qpn.size() * 4, true);
  xfer(sock, &theirs, sizeof theirs, false);
  if (theirs.nqp != s.qps.size()) die("peer has %u QPs, we have %zu", theirs.nqp, s.qps.size());
  xfer(sock, rqpn.data(), rqpn.size() * 4, false);
  s.raddr = theirs.addr;
  s.rkey = theirs.rkey;
  bool grh = false;
  for (uint8_t b : theirs.gid) grh |= b != 0;
  for (size_t i = 0; i < s.qps.size(); ++i) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.port_num = 1;
    a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
    if (ibv_modify_qp(s.qps[i], &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
      die("modify QP to INIT failed");
    a = {};
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = IBV_MTU_1024;
    a.dest_qp_num = rqpn[i];
    a.rq_psn = 0;
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 12;
    a.ah_attr.dlid = theirs.lid;
    a.ah_attr.port_num = 1;
    a.ah_attr.is_global = grh;
    if (grh) {
      std::memcpy(a.ah_attr.grh.dgid.raw, theirs.gid, 16);
      a.ah_attr.grh.hop_limit = 64;
    }
    if (ibv_modify_qp(s.qps[i], &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                        IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
      die("modify QP to RTR failed");
    a = {};
    a.qp_state = IBV_QPS_RTS;
    a.timeout = 14;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.sq_psn = 0;
    a.max_rd_atomic = 1;
    if (ibv_modify_qp(s.qps[i], &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                                        IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC))
      die("modify QP to RTS failed");
  }
  barrier(sock);
}

void close_side(Side &s) {
  for (ibv_qp *q : s.qps)
    if (ibv_destroy_qp(q)) die("ibv_destroy_qp failed");
  if (ibv_destroy_cq(s.scq) || ibv_destroy_cq(s.rcq)) die("ibv_destroy_cq failed");
  if (s.ch && ibv_destroy_comp_channel(s.ch)) die("ibv_destroy_comp_channel failed");
  ibv_dereg_mr(s.mr);
  ibv_dealloc_pd(s.pd);
  ibv_close_device(s.ctx);
  std::free(s.buf);
}

void check(const ibv_wc &wc, const char *what) {
  if (wc.status != IBV_WC_SUCCESS)
    die("%s completion failed: %s (wr_id %llu)", what, ibv_wc_status_str(wc.status),
        static_cast<unsigned long long>(wc.wr_id));
}

// ---------------------------------------------------------- message rate --

constexpr unsigned kSigEvery = 16;

// The client of the message rate test: 8 B inline WRITEs over nqp QPs,
// round robin, at most `window` WRs in flight per QP, one in kSigEvery
// signalled.
struct RateClient {
  RateClient(Side &side, unsigned n, unsigned window)
      : s(side), nqp(n), max_sig(window / kSigEvery), posted(n, 0), in_flight(n, 0) {
    sge = ibv_sge{reinterpret_cast<uintptr_t>(&value), 8, 0};
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_RDMA_WRITE;
    wr.wr.rdma.rkey = s.rkey;
  }

  void post(unsigned q, unsigned flags) {
    wr.wr_id = q;
    wr.send_flags = IBV_SEND_INLINE | flags;
    wr.wr.rdma.remote_addr = s.raddr + 4096 + 64 * q;
    ibv_send_wr *bad = nullptr;
    if (int e = ibv_post_send(s.qps[q], &wr, &bad)) die("ibv_post_send failed: %s", std::strerror(e));
  }

  // Posts at most one signalling period per QP: round robin. Returns the
  // signalled WRs in flight before it.
  unsigned post_round(bool posting) {
    unsigned busy = 0;
    for (unsigned q = 0; q < nqp; ++q) {
      busy += in_flight[q];
      while (posting && in_flight[q] < max_sig) {
        ++value;
        const bool sig = ++posted[q] == kSigEvery;
        post(q, sig ? unsigned{IBV_SEND_SIGNALED} : 0u);
        if (sig) {
          posted[q] = 0;
          ++in_flight[q];
          break;
        }
      }
    }
    return busy;
  }

  // Reaps send completions; returns the messages they stand for.
  uint64_t reap() {
    ibv_wc wc[16];
    int n = ibv_poll_cq(s.scq, 16, wc);
    if (n < 0) die("ibv_poll_cq failed");
    for (int i = 0; i < n; ++i) {
      check(wc[i], "WRITE");
      --in_flight[wc[i].wr_id];
    }
    return uint64_t(n) * kSigEvery;
  }

  // Ends each partial period with one signalled WR; returns the messages
  // its completion will count too many.
  uint64_t flush_partial() {
    uint64_t over = 0;
    for (unsigned q = 0; q < nqp; ++q) {
      if (posted[q] == 0) continue;
      post(q, IBV_SEND_SIGNALED);
      over += kSigEvery - posted[q] - 1;  // this period had posted[q] + 1 WRs
      posted[q] = 0;
      ++in_flight[q];
    }
    return over;
  }

  // Posts for t seconds, then drains: the messages and the seconds taken.
  std::pair<uint64_t, double> run(double t) {
    uint64_t msgs = 0;
    const uint64_t t0 = bench::ticks();
    uint64_t t1 = t0;
    bool posting = true;
    for (;;) {
      if (posting) {
        t1 = bench::ticks();
        posting = bench::elapsed_s(t0, t1) < t;
      }
      const unsigned busy = post_round(posting);
      if (!posting && busy == 0 && std::all_of(posted.begin(), posted.end(), [](unsigned p) { return p == 0; }))
        break;
      msgs += reap();
      if (!posting) msgs -= flush_partial();
    }
    t1 = bench::ticks();
    return {msgs, bench::elapsed_s(t0, t1)};
  }

  Side &s;
  const unsigned nqp;
  const unsigned max_sig;
  std::vector<unsigned> posted;     // WRs posted since the last signalled one
  std::vector<unsigned> in_flight;  // signalled WRs not reaped, x kSigEvery WRs each
  uint64_t value = 0;
  ibv_sge sge{};
  ibv_send_wr wr{};
};

void rate(unsigned nqp, unsigned window, double secs) {
  window = std::max(kSigEvery, window / kSigEvery * kSigEvery);
  two_processes([&](bool client, int sock) {
    Side s;
    open_side(s, nqp, window + kSigEvery, 16, false);
    connect_side(s, sock);
    if (client) {
      if (s.max_inline < 8) die("max_inline_data %u < 8", s.max_inline);
      RateClient c(s, nqp, window);
      c.run(std::min(0.02, secs));
      auto [msgs, sec] = c.run(secs);
      bench::JsonLine()
          .str("bench", "rate")
          .str("test", "msg_rate")
          .num("qps", nqp)
          .num("size", 8)
          .num("window_per_qp", window)
          .num("signal_every", kSigEvery)
          .num("msgs", msgs)
          .real("seconds", sec)
          .real("mmsgs_per_s", static_cast<double>(msgs) / sec / 1e6)
          .emit();
    }
    barrier(sock);
    close_side(s);
  });
}

// ----------------------------------------------------------- event mode --

// Waits for one receive completion: busy polling, or sleeping in
// ibv_get_cq_event.  In event mode the CQ is armed before the peer can send
// (see below), so the event for this completion cannot be missed.
void wait_recv(Side &s, bool event, ibv_wc &wc) {
  if (!event) {
    bench::Spinner sp;
    int n;
    while ((n = ibv_poll_cq(s.rcq, 1, &wc)) == 0) sp.spin();
    if (n < 0) die("ibv_poll_cq failed");
  } else {
    for (;;) {
      ibv_cq *cq = nullptr;
      void *cq_ctx = nullptr;
      if (ibv_get_cq_event(s.ch, &cq, &cq_ctx)) die("ibv_get_cq_event failed: %s", std::strerror(errno));
      ibv_ack_cq_events(cq, 1);
      // Re-arm before polling: a completion after the poll raises an event.
      if (ibv_req_notify_cq(s.rcq, 0)) die("ibv_req_notify_cq failed");
      int n = ibv_poll_cq(s.rcq, 1, &wc);
      if (n < 0) die("ibv_poll_cq failed");
      if (n == 1) break;
    }
  }
  check(wc, "recv");
}

void post_recv(Side &s, uint64_t id) {
  ibv_sge sge{reinterpret_cast<uintptr_t>(s.buf), 64, s.mr->lkey};
  ibv_recv_wr wr{};
  wr.wr_id = id;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  ibv_recv_wr *bad = nullptr;
  if (int e = ibv_post_recv(s.qps[0], &wr, &bad)) die("ibv_post_recv failed: %s", std::strerror(e));
}

void event_lat(uint64_t ev_iters, uint64_t poll_iters) {
  const char *spin = std::getenv("SOFTVERBS_SPIN_US");
  two_processes([&](bool client, int sock) {
    Side s;
    open_side(s, 1, 128, 64, true);
    connect_side(s, sock);
    for (int i = 0; i < 32; ++i) post_recv(s, static_cast<uint64_t>(i));
    uint64_t msg = 0;
    ibv_sge sge{reinterpret_cast<uintptr_t>(&msg), 8, 0};
    ibv_send_wr wr{};
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_SEND;
    unsigned unsig = 0;
    auto send = [&]() {
      // Every 32nd send signalled, reaped by polling the send CQ (no channel).
      const bool sig = ++unsig == 32;
      wr.send_flags = IBV_SEND_INLINE | (sig ? unsigned{IBV_SEND_SIGNALED} : 0u);
      ibv_send_wr *bad = nullptr;
      if (int e = ibv_post_send(s.qps[0], &wr, &bad)) die("ibv_post_send failed: %s", std::strerror(e));
      if (sig) {
        unsig = 0;
        ibv_wc wc;
        int n;
        while ((n = ibv_poll_cq(s.scq, 1, &wc)) == 0) bench::cpu_relax();
        if (n < 0) die("ibv_poll_cq(send) failed");
        check(wc, "SEND");
      }
    };
    for (bool event : {true, false}) {
      const uint64_t iters = event ? ev_iters : poll_iters;
      const uint64_t warm = std::max<uint64_t>(16, iters / 10);
      const uint64_t total = iters + warm;
      if (event && ibv_req_notify_cq(s.rcq, 0)) die("ibv_req_notify_cq failed");
      std::vector<uint64_t> stamps(client ? total + 1 : 0);
      barrier(sock);
      ibv_wc wc;
      for (uint64_t i = 0; i < total; ++i) {
        if (client) {
          stamps[i] = bench::ticks();
          send();
          wait_recv(s, event, wc);
        } else {
          wait_recv(s, event, wc);
          send();
        }
        post_recv(s, wc.wr_id);
      }
      if (client) stamps[total] = bench::ticks();
      barrier(sock);
      if (client) {
        bench::LatStats st = bench::one_way_stats(stamps, warm);
        bench::JsonLine()
            .str("bench", "event")
            .str("test", event ? "event_lat" : "poll_lat")
            .str("spin_us", spin ? spin : "default")
            .num("size", 8)
            .num("iters", iters)
            .real("median_ns", st.median_ns)
            .real("median_iter_ns", st.median_iter_ns)
            .real("p99_ns", st.p99_ns)
            .real("mean_ns", st.mean_ns)
            .emit();
      }
    }
    barrier(sock);
    close_side(s);
  });
}

// ------------------------------------------------------ raw wake-up limits --

long futex(std::atomic<uint32_t> *addr, int op, uint32_t val) {
  // FUTEX_WAIT/FUTEX_WAKE without _PRIVATE: the word is shared between processes.
  return syscall(SYS_futex, reinterpret_cast<uint32_t *>(addr), op, val, nullptr, nullptr, 0);
}

void emit_wake(const char *test, const std::vector<uint64_t> &stamps, uint64_t iters, uint64_t warm) {
  bench::LatStats st = bench::one_way_stats(stamps, warm);
  bench::JsonLine()
      .str("bench", "wake")
      .str("test", test)
      .num("iters", iters)
      .real("median_ns", st.median_ns)
      .real("median_iter_ns", st.median_iter_ns)
      .real("p99_ns", st.p99_ns)
      .real("mean_ns", st.mean_ns)
      .emit();
}

// Futex ping-pong: the word holds whose turn it is (odd: the child's); each
// side sleeps in FUTEX_WAIT until it changes, the other wakes it.  Always
// blocking: no spinning before the wait.
void futex_pingpong(uint64_t iters) {
  auto *w = static_cast<std::atomic<uint32_t> *>(
      mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  if (w == MAP_FAILED) die("mmap: %s", std::strerror(errno));
  w->store(0);
  const uint64_t warm = std::max<uint64_t>(16, iters / 10), total = iters + warm;
  std::vector<uint64_t> stamps(total + 1);
  auto wait_for = [&](uint32_t v) {
    uint32_t cur;
    while ((cur = w->load(std::memory_order_acquire)) != v) futex(w, FUTEX_WAIT, cur);
  };
  auto set = [&](uint32_t v) {
    w->store(v, std::memory_order_release);
    futex(w, FUTEX_WAKE, 1);
  };
  std::fflush(stdout);
  pid_t pid = fork();
  if (pid < 0) die("fork");
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    pin_to(1);
    for (uint64_t i = 0; i < total; ++i) {
      wait_for(static_cast<uint32_t>(2 * i + 1));
      set(static_cast<uint32_t>(2 * i + 2));
    }
    _exit(0);
  }
  for (uint64_t i = 0; i < total; ++i) {
    stamps[i] = bench::ticks();
    set(static_cast<uint32_t>(2 * i + 1));
    wait_for(static_cast<uint32_t>(2 * i + 2));
  }
  stamps[total] = bench::ticks();
  int st = 0;
  waitpid(pid, &st, 0);
  munmap(w, 4096);
  emit_wake("futex_lat", stamps, iters, warm);
}

// eventfd ping-pong: a completion channel is an eventfd, so this is the
// kernel's share of a blocking completion event.
void eventfd_pingpong(uint64_t iters) {
  int to_child = eventfd(0, EFD_CLOEXEC), to_parent = eventfd(0, EFD_CLOEXEC);
  if (to_child < 0 || to_parent < 0) die("eventfd: %s", std::strerror(errno));
  const uint64_t warm = std::max<uint64_t>(16, iters / 10), total = iters + warm;
  std::vector<uint64_t> stamps(total + 1);
  auto ping = [](int fd) {
    uint64_t one = 1;
    if (write(fd, &one, 8) != 8) die("eventfd write: %s", std::strerror(errno));
  };
  auto wait = [](int fd) {
    uint64_t v;
    ssize_t r;
    while ((r = read(fd, &v, 8)) < 0 && errno == EINTR) {
    }
    if (r != 8) die("eventfd read: %s", std::strerror(errno));
  };
  std::fflush(stdout);
  pid_t pid = fork();
  if (pid < 0) die("fork");
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    pin_to(1);
    for (uint64_t i = 0; i < total; ++i) {
      wait(to_child);
      ping(to_parent);
    }
    _exit(0);
  }
  for (uint64_t i = 0; i < total; ++i) {
    stamps[i] = bench::ticks();
    ping(to_child);
    wait(to_parent);
  }
  stamps[total] = bench::ticks();
  int st = 0;
  waitpid(pid, &st, 0);
  close(to_child);
  close(to_parent);
  emit_wake("eventfd_lat", stamps, iters, warm);
}

void on_alarm(int) {
  static const char msg[] = "rate_event_bench: watchdog timeout\n";
  ssize_t r = write(2, msg, sizeof msg - 1);
  (void)r;
  _exit(3);
}

void usage() {
  std::fprintf(stderr,
               "usage: rate_event_bench [options] TEST...\n"
               "  rate     8 B WRITE message rate over --qps N QPs\n"
               "  event    8 B SEND/RECV ping-pong in event mode, then polling\n"
               "  wake     futex and eventfd ping-pong between two processes\n"
               "options:\n"
               "  --qps LIST     QP counts for rate (default 1,4,16)\n"
               "  --window N     rate: WRs outstanding per QP (default 64)\n"
               "  --time SEC     rate: seconds per QP count (default 0.3)\n"
               "  --iters N      event and wake iterations (default 5000)\n"
               "  --poll-iters N event: polling-mode iterations (default 50000)\n"
               "  --pin          client on CPU 0, server on CPU 1\n"
               "  --timeout SEC  watchdog (default 120)\n");
}

}  // namespace

int main(int argc, char **argv) {
  std::vector<uint64_t> qps{1, 4, 16};
  unsigned window = 64;
  double secs = 0.3;
  uint64_t iters = 5000, poll_iters = 50000;
  unsigned timeout = 120;
  std::vector<std::string> tests;
  bench::Args a(argc, argv);
  for (; a.valid(); a.next()) {
    std::string v;
    if (a.flag("-h") || a.flag("--help")) {
      usage();
      return 0;
    } else if (a.take("--qps", v)) {
      qps.clear();
      size_t pos = 0;
      while (pos <= v.size()) {
        size_t c = v.find(',', pos);
        if (c == std::string::npos) c = v.size();
        uint64_t q = bench::to_u64(v.substr(pos, c - pos), "--qps");
        if (q == 0 || q > 1024) die("--qps: 1..1024");
        qps.push_back(q);
        pos = c + 1;
      }
    } else if (a.take("--window", v)) {
      window = static_cast<unsigned>(bench::to_u64(v, "--window"));
    } else if (a.take("--time", v)) {
      secs = bench::to_double(v, "--time");
    } else if (a.take("--iters", v)) {
      iters = std::max<uint64_t>(32, bench::to_u64(v, "--iters"));
    } else if (a.take("--poll-iters", v)) {
      poll_iters = std::max<uint64_t>(32, bench::to_u64(v, "--poll-iters"));
    } else if (a.flag("--pin")) {
      g_pin = true;
      pin_to(0);
    } else if (a.take("--timeout", v)) {
      timeout = static_cast<unsigned>(bench::to_u64(v, "--timeout"));
    } else if (a.cur()[0] == '-') {
      std::fprintf(stderr, "unknown option '%s'\n", a.cur());
      usage();
      return 2;
    } else {
      tests.emplace_back(a.cur());
    }
  }
  if (tests.empty()) {
    usage();
    return 2;
  }
  bench::ticks_per_ns();  // calibrate before fork
  signal(SIGALRM, on_alarm);
  signal(SIGPIPE, SIG_IGN);
  if (timeout) alarm(timeout);
  for (const std::string &t : tests) {
    if (t == "rate") {
      for (uint64_t q : qps) rate(static_cast<unsigned>(q), window, secs);
    } else if (t == "event") {
      event_lat(iters, poll_iters);
    } else if (t == "wake") {
      futex_pingpong(iters);
      eventfd_pingpong(iters);
    } else {
      std::fprintf(stderr, "unknown test '%s'\n", t.c_str());
      return 2;
    }
  }
  return 0;
}
