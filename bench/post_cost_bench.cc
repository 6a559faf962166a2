// post_cost_bench: what one work request costs the posting thread, in TSC
// ticks, measured in a single process so that the number barely depends on
// other load (no second process, no cache line crossing CPUs).
//
// Two RC QPs of one process are connected to each other (loopback), and
//   write  8 B inline RDMA WRITEs into the other QP's buffer, every 64th
//          signalled (its completion reaped right away): ticks per WRITE.
//   send   8 B inline SEND, the receive CQ polled for its completion and
//          the receive reposted: ticks per SEND + poll + repost.
//   read   8 B RDMA READ, every 64th signalled: ticks per READ.
// Each test runs --trials trials of --iters operations; the median trial is
// reported (and the minimum). --td creates the QPs in a parent domain with
// a thread domain (ibv_alloc_td + ibv_alloc_parent_domain), where a
// provider may skip the send queue's lock.
// Output: one JSON object per line on stdout.
#include <infiniband/verbs.h>

#include <algorithm>
#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench_common.h"

namespace {

[[noreturn]] void die(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void die(const char *fmt, ...) {
  std::fputs("post_cost_bench: ", stderr);
  va_list ap;
  va_start(ap, fmt);
  std::vfprintf(stderr, fmt, ap);
  va_end(ap);
  std::fputc('\n', stderr);
  std::exit(1);
}

struct Options {
  uint64_t iters = 200000;
  unsigned trials = 15;
  bool td = false;
  bool write = true, send = true, read = true;
};

struct Loop {
  ibv_context *ctx = nullptr;
  ibv_pd *pd = nullptr;
  ibv_td *td = nullptr;
  ibv_pd *qp_pd = nullptr;  // the parent domain with --td, else pd
  ibv_mr *mr = nullptr;
  ibv_cq *scq[2] = {}, *rcq[2] = {};
  ibv_qp *qp[2] = {};
  char *buf = nullptr;
  static constexpr size_t kRegion = 4096;  // per QP: [send | recv]
  char *send_buf(int i) { return buf + i * 2 * kRegion; }
  char *recv_buf(int i) { return buf + i * 2 * kRegion + kRegion; }
};

// The device, a PD (under a parent domain with a thread domain, with --td)
// and the registered buffer.
void open_resources(Loop &l, const Options &o) {
  int num = 0;
  ibv_device **list = ibv_get_device_list(&num);
  if (!list || num == 0) die("no RDMA devices found");
  l.ctx = ibv_open_device(list[0]);
  if (!l.ctx) die("ibv_open_device failed: %s", std::strerror(errno));
  ibv_free_device_list(list);
  l.pd = ibv_alloc_pd(l.ctx);
  if (!l.pd) die("ibv_alloc_pd failed");
  l.qp_pd = l.pd;
  if (o.td) {
    ibv_td_init_attr ta{};
    l.td = ibv_alloc_td(l.ctx, &ta);
    if (!l.td) die("ibv_alloc_td failed: %s", std::strerror(errno));
    ibv_parent_domain_init_attr pa{};
    pa.pd = l.pd;
    pa.td = l.td;
    l.qp_pd = ibv_alloc_parent_domain(l.ctx, &pa);
    if (!l.qp_pd) die("ibv_alloc_parent_domain failed: %s", std::strerror(errno));
  }
  void *mem = nullptr;
  if (posix_memalign(&mem, 4096, 4 * Loop::kRegion)) die("posix_memalign failed");
  l.buf = static_cast<char *>(mem);
  std::memset(l.buf, 0, 4 * Loop::kRegion);
  l.mr = ibv_reg_mr(l.pd, l.buf, 4 * Loop::kRegion,
                    IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
  if (!l.mr) die("ibv_reg_mr failed: %s", std::strerror(errno));
}

// Two RC QPs, each with its own send and receive CQ.
void create_qps(Loop &l) {
  for (int i = 0; i < 2; ++i) {
    l.scq[i] = ibv_create_cq(l.ctx, 256, nullptr, nullptr, 0);
    l.rcq[i] = ibv_create_cq(l.ctx, 256, nullptr, nullptr, 0);
    if (!l.scq[i] || !l.rcq[i]) die("ibv_create_cq failed");
    ibv_qp_init_attr qa{};
    qa.send_cq = l.scq[i];
    qa.recv_cq = l.rcq[i];
    qa.cap.max_send_wr = 128;
    qa.cap.max_recv_wr = 128;
    qa.cap.max_send_sge = 1;
    qa.cap.max_recv_sge = 1;
    qa.cap.max_inline_data = 64;
    qa.qp_type = IBV_QPT_RC;
    l.qp[i] = ibv_create_qp(l.qp_pd, &qa);
    if (!l.qp[i]) die("ibv_create_qp failed: %s", std::strerror(errno));
  }
}

// The two QPs connected to each other: INIT, RTR, RTS.
void connect_qps(Loop &l) {
  ibv_port_attr port{};
  if (ibv_query_port(l.ctx, 1, &port)) die("ibv_query_port failed");
  ibv_gid gid{};
  ibv_query_gid(l.ctx, 1, 0, &gid);
  bool grh = false;
  for (uint8_t b : gid.raw) grh |= b != 0;
  for (int i = 0; i < 2; ++i) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.port_num = 1;
    a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
    if (int e = ibv_modify_qp(l.qp[i], &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
      die("modify QP to INIT failed: %s", std::strerror(e));
  }
  for (int i = 0; i < 2; ++i) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = port.active_mtu;
    a.dest_qp_num = l.qp[1 - i]->qp_num;
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 1;
    a.ah_attr.dlid = port.lid;
    a.ah_attr.port_num = 1;
    a.ah_attr.is_global = grh ? 1 : 0;
    if (grh) {
      a.ah_attr.grh.dgid = gid;
      a.ah_attr.grh.hop_limit = 64;
    }
    if (int e = ibv_modify_qp(l.qp[i], &a,
                              IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                  IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
      die("modify QP to RTR failed: %s", std::strerror(e));
    std::memset(&a, 0, sizeof a);
    a.qp_state = IBV_QPS_RTS;
    a.timeout = 14;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.max_rd_atomic = 1;
    if (int e = ibv_modify_qp(l.qp[i], &a,
                              IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                                  IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC))
      die("modify QP to RTS failed: %s", std::strerror(e));
  }
}

void setup(Loop &l, const Options &o) {
  open_resources(l, o);
  create_qps(l);
  connect_qps(l);
}

void reap(ibv_cq *cq, int want, const char *what) {
  ibv_wc wc[16];
  int got = 0;
  while (got < want) {
    int n = ibv_poll_cq(cq, 16, wc);
    if (n < 0) die("ibv_poll_cq(%s) failed", what);
    for (int i = 0; i < n; ++i)
      if (wc[i].status != IBV_WC_SUCCESS) die("%s completion failed: %s", what, ibv_wc_status_str(wc[i].status));
    got += n;
  }
}

// One trial of `iters` one-sided operations (WRITE or READ) from QP 0.
uint64_t one_sided_trial(Loop &l, uint64_t iters, ibv_wr_opcode op) {
  ibv_sge sge{reinterpret_cast<uintptr_t>(op == IBV_WR_RDMA_READ ? l.recv_buf(0) : l.send_buf(0)), 8, l.mr->lkey};
  ibv_send_wr wr{};
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = op;
  wr.wr.rdma.remote_addr = reinterpret_cast<uintptr_t>(l.recv_buf(1));
  wr.wr.rdma.rkey = l.mr->rkey;
  const unsigned inl = op == IBV_WR_RDMA_WRITE ? unsigned(IBV_SEND_INLINE) : 0u;
  uint64_t t0 = bench::ticks();
  for (uint64_t i = 0; i < iters; ++i) {
    wr.wr_id = i;
    const bool sig = (i & 63) == 63;
    wr.send_flags = inl | (sig ? unsigned(IBV_SEND_SIGNALED) : 0u);
    ibv_send_wr *bad = nullptr;
    if (int e = ibv_post_send(l.qp[0], &wr, &bad)) die("ibv_post_send failed: %s", std::strerror(e));
    if (sig) reap(l.scq[0], 1, "send");
  }
  return bench::ticks() - t0;
}

// One trial of `iters` SENDs from QP 0 to QP 1, each received (poll) and
// its receive reposted.
uint64_t send_trial(Loop &l, uint64_t iters) {
  ibv_sge sge{reinterpret_cast<uintptr_t>(l.send_buf(0)), 8, l.mr->lkey};
  ibv_send_wr wr{};
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_SEND;
  ibv_sge rsge{reinterpret_cast<uintptr_t>(l.recv_buf(1)), 64, l.mr->lkey};
  ibv_recv_wr rwr{};
  rwr.sg_list = &rsge;
  rwr.num_sge = 1;
  uint64_t t0 = bench::ticks();
  for (uint64_t i = 0; i < iters; ++i) {
    wr.wr_id = i;
    const bool sig = (i & 63) == 63;
    wr.send_flags = IBV_SEND_INLINE | (sig ? unsigned(IBV_SEND_SIGNALED) : 0u);
    ibv_send_wr *bad = nullptr;
    if (int e = ibv_post_send(l.qp[0], &wr, &bad)) die("ibv_post_send(SEND) failed: %s", std::strerror(e));
    ibv_wc wc;
    int n;
    while ((n = ibv_poll_cq(l.rcq[1], 1, &wc)) == 0) {
    }
    if (n < 0 || wc.status != IBV_WC_SUCCESS) die("receive completion failed");
    ibv_recv_wr *rbad = nullptr;
    rwr.wr_id = wc.wr_id;
    if (int e = ibv_post_recv(l.qp[1], &rwr, &rbad)) die("ibv_post_recv failed: %s", std::strerror(e));
    if (sig) reap(l.scq[0], 1, "send");
  }
  return bench::ticks() - t0;
}

void report(const char *test, const Options &o, std::vector<double> per_op) {
  std::sort(per_op.begin(), per_op.end());
  const double tpn = bench::ticks_per_ns();
  bench::JsonLine()
      .str("bench", "post_cost")
      .str("test", test)
      .num("td", o.td ? 1 : 0)
      .num("iters", o.iters)
      .num("trials", o.trials)
      .real("median_ticks", per_op[per_op.size() / 2])
      .real("min_ticks", per_op.front())
      .real("median_ns", per_op[per_op.size() / 2] / tpn)
      .emit();
}

}  // namespace

int main(int argc, char **argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> const char * {
      if (i + 1 >= argc) die("%s needs a value", a.c_str());
      return argv[++i];
    };
    if (a == "--iters") {
      o.iters = std::strtoull(next(), nullptr, 10);
    } else if (a == "--trials") {
      o.trials = unsigned(std::strtoul(next(), nullptr, 10));
    } else if (a == "--td") {
      o.td = true;
    } else if (a == "--test") {
      std::string t = next();
      o.write = t.find("write") != std::string::npos;
      o.send = t.find("send") != std::string::npos;
      o.read = t.find("read") != std::string::npos;
    } else if (a == "-h" || a == "--help") {
      std::printf("usage: post_cost_bench [--test write,send,read] [--iters N] [--trials N] [--td]\n");
      return 0;
    } else {
      die("unknown option %s", a.c_str());
    }
  }
  if (o.iters < 64 || o.trials == 0) die("--iters must be >= 64 and --trials >= 1");
  bench::ticks_per_ns();
  Loop l;
  setup(l, o);
  {
    // Receives for the SEND test, and a warm-up of every path.
    ibv_sge rsge{reinterpret_cast<uintptr_t>(l.recv_buf(1)), 64, l.mr->lkey};
    ibv_recv_wr rwr{};
    rwr.sg_list = &rsge;
    rwr.num_sge = 1;
    for (int i = 0; i < 64; ++i) {
      ibv_recv_wr *bad = nullptr;
      rwr.wr_id = uint64_t(i);
      if (ibv_post_recv(l.qp[1], &rwr, &bad)) die("ibv_post_recv failed");
    }
  }
  struct T {
    bool on;
    const char *name;
    int kind;
  };
  for (T t : {T{o.write, "write", 0}, T{o.send, "send", 1}, T{o.read, "read", 2}}) {
    if (!t.on) continue;
    auto trial = [&](uint64_t n) {
      return t.kind == 0   ? one_sided_trial(l, n, IBV_WR_RDMA_WRITE)
             : t.kind == 1 ? send_trial(l, n)
                           : one_sided_trial(l, n, IBV_WR_RDMA_READ);
    };
    trial(std::min<uint64_t>(o.iters, 20000) & ~uint64_t(63));  // warm-up
    std::vector<double> per_op;
    for (unsigned k = 0; k < o.trials; ++k) per_op.push_back(double(trial(o.iters & ~uint64_t(63))) /
                                                             double(o.iters & ~uint64_t(63)));
    report(t.name, o, per_op);
  }
  for (ibv_qp *q : l.qp) ibv_destroy_qp(q);
  for (int i = 0; i < 2; ++i) {
    ibv_destroy_cq(l.scq[i]);
    ibv_destroy_cq(l.rcq[i]);
  }
  ibv_dereg_mr(l.mr);
  if (l.td) {
    ibv_dealloc_pd(l.qp_pd);
    ibv_dealloc_td(l.td);
  }
  ibv_dealloc_pd(l.pd);
  ibv_close_device(l.ctx);
  std::free(l.buf);
  return 0;
}
