// verbs_bench: RDMA WRITE, RDMA READ and SEND/RECV latency and bandwidth over
// one RC QP pair, using only the public libibverbs API.  The program forks: the child
// is the server, the parent the client; both open the first (or --dev) device,
// exchange {qpn, psn, lid, gid, addr, rkey, mtu} over a socketpair created
// before fork() and connect their QPs (INIT -> RTR -> RTS).
//
//  write_lat: ping-pong of RDMA WRITEs like perftest's ib_write_lat: each side
//             writes into the peer's buffer and busy-polls the last byte of its
//             own buffer for the iteration tag.  Reports one-way (RTT/2).
//  write_bw:  the client keeps a window of WRITEs in flight (signalled every
//             `chunk` WRs) for >= --time seconds per size; reports GB/s.
//  send_lat:  SEND/RECV ping-pong, completion detected by polling the recv CQ.
//  read_lat:  the client RDMA-READs from the server's buffer, one at a time,
//             and polls its CQ for the completion.  A READ is a round trip by
//             nature, so this reports the whole round trip, not half.
//  read_bw:   like write_bw with RDMA READs (up to the device's max_qp_rd_atom
//             outstanding on the wire).
//  send_bw:   like write_bw with SENDs; the server keeps receives posted and
//             polls its receive CQ; the client stops the server by telling it
//             over the socket how many messages it sent.
//
// Latency tests scale the iteration count down for large sizes (--lat-bytes),
// so that 4 MiB ping-pongs do not take minutes.
//
// Output: one JSON object per line on stdout (client only); errors on stderr.
#include <infiniband/verbs.h>
#include <sched.h>
#include <signal.h>
#include <grp.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench_common.h"

namespace {

constexpr unsigned kInline = IBV_SEND_INLINE;
constexpr unsigned kSignaled = IBV_SEND_SIGNALED;

enum class Test { WriteLat, WriteBw, SendLat, Verify, ReadLat, ReadBw, SendBw };

bool is_bw(Test t) { return t == Test::WriteBw || t == Test::ReadBw || t == Test::SendBw || t == Test::Verify; }

const char *test_name(Test t) {
  switch (t) {
    case Test::WriteLat: return "write_lat";
    case Test::WriteBw: return "write_bw";
    case Test::SendLat: return "send_lat";
    case Test::Verify: return "verify";
    case Test::ReadLat: return "read_lat";
    case Test::ReadBw: return "read_bw";
    case Test::SendBw: return "send_bw";
  }
  return "?";
}

struct Options {
  std::vector<Test> tests{Test::WriteLat, Test::WriteBw, Test::SendLat};
  std::vector<uint64_t> lat_sizes{8};
  std::vector<uint64_t> bw_sizes;
  uint64_t iters = 100000;
  uint64_t warmup = 2000;
  uint64_t lat_bytes = 1ull << 30;  // latency: at most this many bytes per size and side
  uint64_t min_iters = 100;
  double seconds = 0.2;  // per bw size
  double warm_seconds = 0.02;
  unsigned window = 64;
  unsigned chunk = 0;  // bw: signal every `chunk` WRs; 0 = window/4
  unsigned cq_mod = 64;  // latency tests: signal every `cq_mod` WRs
  unsigned inline_req = 64;
  std::string dev_name;
  int ib_port = 1;
  int gid_idx = 0;
  int mtu = 0;  // bytes; 0 = port's active MTU
  bool pin = false;
  bool td = false;  // QP in a parent domain with a thread domain (ibv_alloc_td)
  unsigned timeout = 300;
  long server_uid = -1;  // the server drops to this uid (and gid) after fork: another user
};

const char *g_role = "client";

[[noreturn]] void die(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void die(const char *fmt, ...) {
  char msg[512];
  int n = std::snprintf(msg, sizeof msg, "verbs_bench %s: ", g_role);
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(msg + n, sizeof msg - static_cast<size_t>(n) - 1, fmt, ap);
  va_end(ap);
  std::strcat(msg, "\n");
  std::fflush(stdout);
  ssize_t r = write(2, msg, std::strlen(msg));  // one write: no interleaving
  (void)r;
  _exit(1);
}

// The client learns about a failed server through SIGCHLD, even while it
// busy-polls memory that the dead server would have written.
volatile sig_atomic_t g_child_pid = 0;
volatile sig_atomic_t g_child_done = 0;
volatile sig_atomic_t g_child_status = 0;

void on_sigchld(int) {
  int saved = errno;
  int st = 0;
  pid_t p = waitpid(static_cast<pid_t>(g_child_pid), &st, WNOHANG);
  if (p > 0) {
    g_child_status = st;
    g_child_done = 1;
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
      static const char msg[] = "verbs_bench client: server process failed; aborting\n";
      ssize_t r = write(2, msg, sizeof msg - 1);
      (void)r;
      _exit(1);
    }
  }
  errno = saved;
}

bool g_verbose = false;

void vlog(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void vlog(const char *fmt, ...) {
  if (!g_verbose) return;
  char msg[512];
  int n = std::snprintf(msg, sizeof msg, "verbs_bench %s: ", g_role);
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(msg + n, sizeof msg - static_cast<size_t>(n) - 1, fmt, ap);
  va_end(ap);
  std::strcat(msg, "\n");
  ssize_t r = write(2, msg, std::strlen(msg));
  (void)r;
}

void on_alarm(int) {
  static const char msg[] = "verbs_bench: watchdog timeout (peer hung or device too slow)\n";
  ssize_t r = write(2, msg, sizeof msg - 1);
  (void)r;
  _exit(3);
}

// ------------------------------------------------------------ socket sync --

void write_all(int fd, const void *p, size_t n) {
  const char *c = static_cast<const char *>(p);
  while (n) {
    ssize_t r = write(fd, c, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) die("socket write failed: %s", r < 0 ? std::strerror(errno) : "closed");
    c += r;
    n -= static_cast<size_t>(r);
  }
}

void read_all(int fd, void *p, size_t n) {
  char *c = static_cast<char *>(p);
  while (n) {
    ssize_t r = read(fd, c, n);
    if (r < 0 && errno == EINTR) continue;
    if (r == 0) die("peer closed the socket (peer failed?)");
    if (r < 0) die("socket read failed: %s", std::strerror(errno));
    c += r;
    n -= static_cast<size_t>(r);
  }
}

void barrier(int fd) {
  char b = 'b';
  write_all(fd, &b, 1);
  read_all(fd, &b, 1);
  if (b != 'b') die("barrier out of sync");
}

// -------------------------------------------------------------- RDMA setup --

struct PeerInfo {
  uint32_t qpn;
  uint32_t psn;
  uint32_t rkey;
  uint32_t mtu;  // enum ibv_mtu
  uint64_t addr;
  uint16_t lid;
  uint8_t gid[16];
  uint8_t pad[6];
};

struct Rdma {
  ibv_context *ctx = nullptr;
  ibv_pd *pd = nullptr;
  ibv_td *td = nullptr;
  ibv_pd *qp_pd = nullptr;  // the parent domain with --td, else pd
  ibv_mr *mr = nullptr;
  ibv_cq *scq = nullptr;
  ibv_cq *rcq = nullptr;
  ibv_qp *qp = nullptr;
  char *buf = nullptr;
  size_t region = 0;  // buf = [recv region | send region], each `region` bytes
  unsigned sq_depth = 0;
  unsigned rq_depth = 0;
  unsigned rd_atom = 1;  // RDMA READs this QP may have outstanding
  unsigned max_inline = 0;
  unsigned recv_posted = 0;
  ibv_port_attr port{};
  PeerInfo local{}, remote{};
  std::string dev;
  int sock = -1;

  char *recv_buf() const { return buf; }
  char *send_buf() const { return buf + region; }
  uint64_t remote_recv() const { return remote.addr; }
};

int mtu_bytes(uint32_t m) { return m >= IBV_MTU_256 && m <= IBV_MTU_4096 ? 128 << m : 0; }

ibv_mtu mtu_enum(int bytes) {
  switch (bytes) {
    case 256: return IBV_MTU_256;
    case 512: return IBV_MTU_512;
    case 1024: return IBV_MTU_1024;
    case 2048: return IBV_MTU_2048;
    case 4096: return IBV_MTU_4096;
  }
  die("bad MTU %d (256..4096)", bytes);
}

void setup(Rdma &r, const Options &o, uint64_t max_size) {
  int num = 0;
  ibv_device **list = ibv_get_device_list(&num);
  if (!list || num == 0) die("no RDMA devices found (is softverbs on LD_LIBRARY_PATH?)");
  ibv_device *dev = nullptr;
  for (int i = 0; i < num; ++i) {
    if (o.dev_name.empty() || o.dev_name == ibv_get_device_name(list[i])) {
      dev = list[i];
      break;
    }
  }
  if (!dev) die("device '%s' not found", o.dev_name.c_str());
  r.dev = ibv_get_device_name(dev);
  vlog("opening %s", r.dev.c_str());
  r.ctx = ibv_open_device(dev);
  if (!r.ctx) die("ibv_open_device(%s) failed: %s", r.dev.c_str(), std::strerror(errno));
  ibv_free_device_list(list);

  ibv_device_attr dattr{};
  if (ibv_query_device(r.ctx, &dattr)) die("ibv_query_device failed");
  if (ibv_query_port(r.ctx, static_cast<uint8_t>(o.ib_port), &r.port))
    die("ibv_query_port(%d) failed", o.ib_port);
  if (r.port.state != IBV_PORT_ACTIVE)
    std::fprintf(stderr, "verbs_bench %s: warning: port %d is not ACTIVE (state %d)\n", g_role,
                 o.ib_port, r.port.state);

  union ibv_gid gid;
  std::memset(&gid, 0, sizeof gid);
  if (ibv_query_gid(r.ctx, static_cast<uint8_t>(o.ib_port), o.gid_idx, &gid))
    std::fprintf(stderr, "verbs_bench %s: warning: ibv_query_gid(%d) failed\n", g_role, o.gid_idx);

  r.pd = ibv_alloc_pd(r.ctx);
  if (!r.pd) die("ibv_alloc_pd failed: %s", std::strerror(errno));
  r.qp_pd = r.pd;
  if (o.td) {
    // One thread posts to the QP: tell the provider, which may then skip
    // the send queue's lock (rdma-core's mlx5 does; so does softverbs).
    ibv_td_init_attr ta{};
    r.td = ibv_alloc_td(r.ctx, &ta);
    if (!r.td) die("ibv_alloc_td failed: %s", std::strerror(errno));
    ibv_parent_domain_init_attr pa{};
    pa.pd = r.pd;
    pa.td = r.td;
    r.qp_pd = ibv_alloc_parent_domain(r.ctx, &pa);
    if (!r.qp_pd) die("ibv_alloc_parent_domain failed: %s", std::strerror(errno));
  }

  r.region = (std::max<uint64_t>(max_size, 64) + 4095) & ~uint64_t{4095};
  void *mem = nullptr;
  if (posix_memalign(&mem, 4096, 2 * r.region)) die("posix_memalign(%zu) failed", 2 * r.region);
  r.buf = static_cast<char *>(mem);
  std::memset(r.buf, 0, 2 * r.region);
  r.mr = ibv_reg_mr(r.pd, r.buf, 2 * r.region,
                    IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
  if (!r.mr) die("ibv_reg_mr(%zu bytes) failed: %s", 2 * r.region, std::strerror(errno));

  unsigned want_sq = std::max(o.window, 16u) * 2;
  unsigned max_wr = dattr.max_qp_wr > 0 ? static_cast<unsigned>(dattr.max_qp_wr) : want_sq;
  r.sq_depth = std::min(want_sq, max_wr);
  // send_bw needs at least a window of receives posted, else the sender
  // stalls on RNR.
  r.rq_depth = std::min(std::max(64u, 2 * o.window), max_wr);
  r.rd_atom = static_cast<unsigned>(std::clamp(std::min(dattr.max_qp_init_rd_atom, dattr.max_qp_rd_atom), 1, 16));
  unsigned max_cqe = dattr.max_cqe > 0 ? static_cast<unsigned>(dattr.max_cqe) : r.sq_depth;
  r.scq = ibv_create_cq(r.ctx, static_cast<int>(std::min(r.sq_depth, max_cqe)), nullptr, nullptr, 0);
  r.rcq = ibv_create_cq(r.ctx, static_cast<int>(std::min(r.rq_depth, max_cqe)), nullptr, nullptr, 0);
  if (!r.scq || !r.rcq) die("ibv_create_cq failed: %s", std::strerror(errno));

  for (unsigned inl : {o.inline_req, 0u}) {
    ibv_qp_init_attr qa{};
    qa.send_cq = r.scq;
    qa.recv_cq = r.rcq;
    qa.cap.max_send_wr = r.sq_depth;
    qa.cap.max_recv_wr = r.rq_depth;
    qa.cap.max_send_sge = 1;
    qa.cap.max_recv_sge = 1;
    qa.cap.max_inline_data = inl;
    qa.qp_type = IBV_QPT_RC;
    qa.sq_sig_all = 0;
    r.qp = ibv_create_qp(r.qp_pd, &qa);
    if (r.qp) {
      r.max_inline = qa.cap.max_inline_data;  // provider reports what it granted
      r.sq_depth = std::min(r.sq_depth, qa.cap.max_send_wr);
      r.rq_depth = std::min(r.rq_depth, qa.cap.max_recv_wr);
      break;
    }
  }
  if (!r.qp) die("ibv_create_qp(RC) failed: %s", std::strerror(errno));

  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.pkey_index = 0;
  a.port_num = static_cast<uint8_t>(o.ib_port);
  a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
  if (int e = ibv_modify_qp(r.qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
    die("modify QP to INIT failed: %s", std::strerror(e));

  r.local.qpn = r.qp->qp_num;
  r.local.psn = static_cast<uint32_t>(lrand48()) & 0xffffff;
  r.local.rkey = r.mr->rkey;
  r.local.mtu = o.mtu ? mtu_enum(o.mtu) : r.port.active_mtu;
  r.local.addr = reinterpret_cast<uintptr_t>(r.recv_buf());
  r.local.lid = r.port.lid;
  std::memcpy(r.local.gid, gid.raw, 16);

  vlog("QP %u in INIT, psn %u, exchanging addresses", r.local.qpn, r.local.psn);
  write_all(r.sock, &r.local, sizeof r.local);
  read_all(r.sock, &r.remote, sizeof r.remote);

  uint32_t mtu = std::min(r.local.mtu, r.remote.mtu);
  if (mtu < IBV_MTU_256 || mtu > IBV_MTU_4096) mtu = IBV_MTU_1024;

  bool grh = false;
  for (uint8_t b : r.remote.gid) grh |= b != 0;

  std::memset(&a, 0, sizeof a);
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = static_cast<ibv_mtu>(mtu);
  a.dest_qp_num = r.remote.qpn;
  a.rq_psn = r.remote.psn;
  a.max_dest_rd_atomic = static_cast<uint8_t>(r.rd_atom);
  // The shortest RNR NAK timer (IBTA 9.7.5.2.8 table 45: code 1 = 0.01 ms):
  // in send_bw the client can outrun the server's reposting, and a sender
  // then waits this long before it retries.
  a.min_rnr_timer = 1;
  a.ah_attr.dlid = r.remote.lid;
  a.ah_attr.sl = 0;
  a.ah_attr.src_path_bits = 0;
  a.ah_attr.port_num = static_cast<uint8_t>(o.ib_port);
  a.ah_attr.is_global = grh ? 1 : 0;
  if (grh) {
    std::memcpy(a.ah_attr.grh.dgid.raw, r.remote.gid, 16);
    a.ah_attr.grh.sgid_index = static_cast<uint8_t>(o.gid_idx);
    a.ah_attr.grh.hop_limit = 64;
    a.ah_attr.grh.flow_label = 0;
    a.ah_attr.grh.traffic_class = 0;
  }
  if (int e = ibv_modify_qp(r.qp, &a,
                            IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
    die("modify QP to RTR failed: %s", std::strerror(e));

  std::memset(&a, 0, sizeof a);
  a.qp_state = IBV_QPS_RTS;
  a.timeout = 14;
  a.retry_cnt = 7;
  a.rnr_retry = 7;
  a.sq_psn = r.local.psn;
  a.max_rd_atomic = static_cast<uint8_t>(r.rd_atom);
  if (int e = ibv_modify_qp(r.qp, &a,
                            IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                                IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC))
    die("modify QP to RTS failed: %s", std::strerror(e));

  vlog("QP %u -> peer QP %u in RTS (mtu %d, max_inline %u, grh %d)", r.local.qpn, r.remote.qpn,
       mtu_bytes(mtu), r.max_inline, grh ? 1 : 0);
  barrier(r.sock);
  r.local.mtu = mtu;
}

void teardown(Rdma &r) {
  if (r.qp && ibv_destroy_qp(r.qp)) die("ibv_destroy_qp failed");
  if (r.scq && ibv_destroy_cq(r.scq)) die("ibv_destroy_cq failed");
  if (r.rcq && ibv_destroy_cq(r.rcq)) die("ibv_destroy_cq failed");
  if (r.mr && ibv_dereg_mr(r.mr)) die("ibv_dereg_mr failed");
  if (r.td) {
    if (ibv_dealloc_pd(r.qp_pd)) die("ibv_dealloc_pd(parent domain) failed");
    if (ibv_dealloc_td(r.td)) die("ibv_dealloc_td failed");
  }
  if (r.pd && ibv_dealloc_pd(r.pd)) die("ibv_dealloc_pd failed");
  if (r.ctx && ibv_close_device(r.ctx)) die("ibv_close_device failed");
  std::free(r.buf);
}

// ------------------------------------------------------------- completions --

void check_wc(const ibv_wc &wc, const char *what) {
  if (wc.status != IBV_WC_SUCCESS)
    die("%s completion failed: %s (status %d, vendor_err 0x%x, wr_id %llu)", what,
        ibv_wc_status_str(wc.status), wc.status, wc.vendor_err,
        static_cast<unsigned long long>(wc.wr_id));
}

// Non-blocking: reap up to `max` send completions; returns how many.
int poll_send(Rdma &r, int max = 16) {
  ibv_wc wc[16];
  int n = ibv_poll_cq(r.scq, std::min(max, 16), wc);
  if (n < 0) die("ibv_poll_cq(send) failed");
  for (int i = 0; i < n; ++i) check_wc(wc[i], "send");
  return n;
}

// Tracks unsignalled WRs so the SQ never overflows: a signalled WR retires
// itself and every unsignalled WR posted before it.
struct SendTracker {
  unsigned sig_every;
  unsigned sq_depth;
  unsigned since_sig = 0;  // unsignalled WRs posted since the last signalled one
  unsigned pending = 0;    // signalled WRs whose completion is not reaped yet

  unsigned outstanding() const { return since_sig + pending * sig_every; }
  // Decide the signal flag for the next WR (force = last WR of a test).
  bool next_signaled(Rdma &r, bool force) {
    while (outstanding() + 1 > sq_depth) pending -= static_cast<unsigned>(poll_send(r));
    bool sig = force || since_sig + 1 >= sig_every;
    if (sig) {
      since_sig = 0;
      ++pending;
    } else {
      ++since_sig;
    }
    return sig;
  }
  void reap(Rdma &r) {
    if (pending) pending -= static_cast<unsigned>(poll_send(r));
  }
  void drain(Rdma &r) {
    while (pending) pending -= static_cast<unsigned>(poll_send(r));
  }
};

// Receives always cover the whole receive region, so receives left posted by
// an earlier send_lat size still fit a larger message.
void post_recvs(Rdma &r) {
  while (r.recv_posted < r.rq_depth) {
    ibv_sge sge{reinterpret_cast<uintptr_t>(r.recv_buf()), static_cast<uint32_t>(r.region), r.mr->lkey};
    ibv_recv_wr wr{};
    wr.wr_id = r.recv_posted;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    ibv_recv_wr *bad = nullptr;
    if (int e = ibv_post_recv(r.qp, &wr, &bad)) die("ibv_post_recv failed: %s", std::strerror(e));
    ++r.recv_posted;
  }
}

// ------------------------------------------------------------------- tests --

// Latency iterations for one size: fewer for large messages (at most
// --lat-bytes moved per side), never fewer than --min-iters.
struct LatIters {
  uint64_t iters, warmup;
};
LatIters lat_iters(const Options &o, uint64_t size) {
  uint64_t it = std::min(o.iters, std::max(o.min_iters, o.lat_bytes / std::max<uint64_t>(size, 1)));
  uint64_t w = std::min(o.warmup, std::max<uint64_t>(16, it / 10));
  return {it, w};
}

void emit_lat(Rdma &r, Test t, uint64_t size, LatIters n, bool inl, std::vector<uint64_t> &stamps,
              double div = 2.0) {
  bench::LatStats s = bench::one_way_stats(stamps, n.warmup, div);
  bench::JsonLine()
      .str("bench", "verbs")
      .str("test", test_name(t))
      .str("device", r.dev)
      .num("size", size)
      .num("iters", n.iters)
      .num("inline", inl ? 1 : 0)
      .num("td", r.td ? 1 : 0)
      .real("median_ns", s.median_ns)
      .real("median_iter_ns", s.median_iter_ns)
      .real("p99_ns", s.p99_ns)
      .real("mean_ns", s.mean_ns)
      .real("min_ns", s.min_ns)
      .emit();
}

void write_lat(Rdma &r, const Options &o, bool client, uint64_t size) {
  const LatIters li = lat_iters(o, size);
  const uint64_t total = li.iters + li.warmup;
  std::memset(r.recv_buf(), 0, size);
  std::memset(r.send_buf(), 0, size);
  const bool inl = size <= r.max_inline;
  SendTracker tr{std::max(1u, std::min(o.cq_mod, r.sq_depth / 2)), r.sq_depth};

  ibv_sge sge{reinterpret_cast<uintptr_t>(r.send_buf()), static_cast<uint32_t>(size), r.mr->lkey};
  ibv_send_wr wr{};
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.wr.rdma.remote_addr = r.remote_recv();
  wr.wr.rdma.rkey = r.remote.rkey;
  volatile uint8_t *poll_byte = reinterpret_cast<volatile uint8_t *>(r.recv_buf() + size - 1);
  volatile uint8_t *post_byte = reinterpret_cast<volatile uint8_t *>(r.send_buf() + size - 1);

  auto post = [&](uint64_t i, uint8_t tag) {
    *post_byte = tag;
    wr.wr_id = i;
    wr.send_flags = (inl ? kInline : 0u) |
                    (tr.next_signaled(r, i + 1 == total) ? kSignaled : 0u);
    ibv_send_wr *bad = nullptr;
    if (int e = ibv_post_send(r.qp, &wr, &bad)) die("ibv_post_send(WRITE) failed: %s", std::strerror(e));
  };
  auto wait = [&](uint8_t tag) {
    bench::Spinner sp;
    while (*poll_byte != tag) sp.spin();
    tr.reap(r);
  };

  std::vector<uint64_t> stamps(client ? total + 1 : 0);
  barrier(r.sock);
  for (uint64_t i = 0; i < total; ++i) {
    const uint8_t tag = static_cast<uint8_t>(i + 1);
    if (client) {
      stamps[i] = bench::ticks();
      post(i, tag);
      wait(tag);
    } else {
      wait(tag);
      post(i, tag);
    }
  }
  if (client) stamps[total] = bench::ticks();
  tr.drain(r);
  barrier(r.sock);
  if (client) emit_lat(r, Test::WriteLat, size, li, inl, stamps);
}

void send_lat(Rdma &r, const Options &o, bool client, uint64_t size) {
  const LatIters li = lat_iters(o, size);
  const uint64_t total = li.iters + li.warmup;
  const bool inl = size <= r.max_inline;
  SendTracker tr{std::max(1u, std::min(o.cq_mod, r.sq_depth / 2)), r.sq_depth};
  post_recvs(r);

  ibv_sge sge{reinterpret_cast<uintptr_t>(r.send_buf()), static_cast<uint32_t>(size), r.mr->lkey};
  ibv_send_wr wr{};
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_SEND;
  ibv_sge rsge{reinterpret_cast<uintptr_t>(r.recv_buf()), static_cast<uint32_t>(r.region), r.mr->lkey};
  ibv_recv_wr rwr{};
  rwr.sg_list = &rsge;
  rwr.num_sge = 1;

  auto post = [&](uint64_t i) {
    wr.wr_id = i;
    wr.send_flags = (inl ? kInline : 0u) |
                    (tr.next_signaled(r, i + 1 == total) ? kSignaled : 0u);
    ibv_send_wr *bad = nullptr;
    if (int e = ibv_post_send(r.qp, &wr, &bad)) die("ibv_post_send(SEND) failed: %s", std::strerror(e));
  };
  auto wait = [&]() {
    ibv_wc wc;
    int n;
    bench::Spinner sp;
    while ((n = ibv_poll_cq(r.rcq, 1, &wc)) == 0) sp.spin();
    if (n < 0) die("ibv_poll_cq(recv) failed");
    check_wc(wc, "recv");
    if (wc.byte_len != size) die("recv byte_len %u != %llu", wc.byte_len, static_cast<unsigned long long>(size));
    --r.recv_posted;
    ibv_recv_wr *bad = nullptr;
    rwr.wr_id = wc.wr_id;
    if (int e = ibv_post_recv(r.qp, &rwr, &bad)) die("ibv_post_recv failed: %s", std::strerror(e));
    ++r.recv_posted;
    tr.reap(r);
  };

  std::vector<uint64_t> stamps(client ? total + 1 : 0);
  barrier(r.sock);
  for (uint64_t i = 0; i < total; ++i) {
    if (client) {
      stamps[i] = bench::ticks();
      post(i);
      wait();
    } else {
      wait();
      post(i);
    }
  }
  if (client) stamps[total] = bench::ticks();
  tr.drain(r);
  barrier(r.sock);
  if (client) emit_lat(r, Test::SendLat, size, li, inl, stamps);
}

// verify: RDMA WRITE a pattern and have the target compare it with what it
// computes itself.  Three passes: inline (if the size fits), non-inline, and
// one where the initiator does not poll its CQ until the target has seen the
// data (as in write_lat: an RDMA WRITE must reach the target without the
// requester calling ibv_poll_cq).  A broken data path then fails with a clear
// message instead of a hang in the latency test.
uint8_t pattern_byte(uint64_t i, uint64_t size, unsigned pass) {
  return static_cast<uint8_t>((i * 131 + size * 7 + pass * 29 + 1) & 0xff);
}

void verify(Rdma &r, bool client, uint64_t size) {
  barrier(r.sock);
  for (unsigned pass = 0; pass < 3; ++pass) {
    const bool unpolled = pass == 2;
    const bool inl = pass == 1 ? false : size <= r.max_inline;
    if (pass == 0 && !inl) continue;
    const char *kind = unpolled ? "unpolled" : inl ? "inline" : "non-inline";
    auto wait_completion = [&]() {
      ibv_wc wc;
      int n;
      const uint64_t t0 = bench::ticks();
      while ((n = ibv_poll_cq(r.scq, 1, &wc)) == 0) {
        if (bench::elapsed_s(t0, bench::ticks()) > 5.0)
          die("verify: no completion for a %s %llu B WRITE within 5 s", kind,
              static_cast<unsigned long long>(size));
      }
      if (n < 0) die("verify: ibv_poll_cq failed");
      check_wc(wc, "verify WRITE");
      if (wc.wr_id != 0x7e57 || wc.opcode != IBV_WC_RDMA_WRITE)
        die("verify: bad completion (wr_id %llu, opcode %d)",
            static_cast<unsigned long long>(wc.wr_id), wc.opcode);
    };
    if (client) {
      for (uint64_t i = 0; i < size; ++i)
        r.send_buf()[i] = static_cast<char>(pattern_byte(i, size, pass));
      ibv_sge sge{reinterpret_cast<uintptr_t>(r.send_buf()), static_cast<uint32_t>(size), r.mr->lkey};
      ibv_send_wr wr{};
      wr.wr_id = 0x7e57;
      wr.sg_list = &sge;
      wr.num_sge = 1;
      wr.opcode = IBV_WR_RDMA_WRITE;
      wr.send_flags = kSignaled | (inl ? kInline : 0u);
      wr.wr.rdma.remote_addr = r.remote_recv();
      wr.wr.rdma.rkey = r.remote.rkey;
      ibv_send_wr *bad = nullptr;
      if (int e = ibv_post_send(r.qp, &wr, &bad)) die("verify: ibv_post_send failed: %s", std::strerror(e));
      if (!unpolled) wait_completion();  // completion => data placed at the target
    }
    barrier(r.sock);
    char verdict[200] = "ok";
    if (!client) {
      const volatile uint8_t *p = reinterpret_cast<const volatile uint8_t *>(r.recv_buf());
      if (unpolled) {  // wait for the last byte, as write_lat does
        const uint8_t last = pattern_byte(size - 1, size, pass);
        const uint64_t t0 = bench::ticks();
        bench::Spinner sp;
        while (p[size - 1] != last && bench::elapsed_s(t0, bench::ticks()) < 2.0) sp.spin();
      }
      for (uint64_t i = 0; i < size; ++i) {
        uint8_t want = pattern_byte(i, size, pass);
        if (p[i] != want) {
          std::snprintf(verdict, sizeof verdict, "%s WRITE of %llu B: target byte %llu is 0x%02x, expected 0x%02x%s",
                        kind, static_cast<unsigned long long>(size), static_cast<unsigned long long>(i), p[i],
                        want, unpolled ? " after 2 s (data must arrive while the initiator does not poll its CQ)" : "");
          break;
        }
      }
      write_all(r.sock, verdict, sizeof verdict);
    } else {
      read_all(r.sock, verdict, sizeof verdict);
      verdict[sizeof verdict - 1] = 0;
      if (std::strcmp(verdict, "ok") != 0) die("verify failed: %s", verdict);
      if (unpolled) wait_completion();
    }
  }
  if (client)
    bench::JsonLine()
        .str("bench", "verbs")
        .str("test", "verify")
        .str("device", r.dev)
        .num("size", size)
        .num("ok", 1)
        .emit();
}

struct BwResult {
  uint64_t msgs = 0;
  double seconds = 0;
};

// Flow control of send_bw: the server RDMA-WRITEs how many receives it has
// reposted into `*credit`; the client keeps at most `limit` SENDs beyond that.
struct Credits {
  const volatile uint64_t *credit = nullptr;
  uint64_t limit = 0;
  uint64_t posted = 0;  // SENDs posted so far, over all bw_loop calls of one size
};

// Client side of the bandwidth tests: keep `window` WRs of `op` in flight for
// `secs` seconds.  RDMA READ cannot be inline (its data flows the other way).
BwResult bw_loop(Rdma &r, uint64_t size, unsigned window, unsigned chunk, double secs,
                 ibv_wr_opcode op = IBV_WR_RDMA_WRITE, Credits *cr = nullptr) {
  const bool inl = op != IBV_WR_RDMA_READ && size <= r.max_inline;
  const unsigned max_chunks = window / chunk;
  std::vector<ibv_send_wr> wrs(chunk);
  ibv_sge sge{reinterpret_cast<uintptr_t>(r.send_buf()), static_cast<uint32_t>(size), r.mr->lkey};
  for (unsigned j = 0; j < chunk; ++j) {
    ibv_send_wr &w = wrs[j];
    w = ibv_send_wr{};
    w.wr_id = j;
    w.sg_list = &sge;
    w.num_sge = 1;
    w.opcode = op;
    w.send_flags = (inl ? kInline : 0u) | (j + 1 == chunk ? kSignaled : 0u);
    w.wr.rdma.remote_addr = r.remote_recv();
    w.wr.rdma.rkey = r.remote.rkey;
  }
  BwResult res;
  unsigned in_flight = 0;
  uint64_t chunks_done = 0;
  const uint64_t t0 = bench::ticks();
  uint64_t t1 = t0;
  for (;;) {
    t1 = bench::ticks();
    if (bench::elapsed_s(t0, t1) < secs) {
      while (in_flight < max_chunks && (!cr || cr->posted + chunk <= *cr->credit + cr->limit)) {
        if (cr) cr->posted += chunk;
        for (unsigned j = 0; j < chunk; ++j) {
          ibv_send_wr *bad = nullptr;
          if (int e = ibv_post_send(r.qp, &wrs[j], &bad))
            die("ibv_post_send(WRITE %llu B) failed: %s", static_cast<unsigned long long>(size),
                std::strerror(e));
        }
        ++in_flight;
      }
    } else if (in_flight == 0) {
      break;
    }
    int n = poll_send(r);
    in_flight -= static_cast<unsigned>(n);
    chunks_done += static_cast<uint64_t>(n);
  }
  res.msgs = chunks_done * chunk;
  res.seconds = bench::elapsed_s(t0, t1);
  return res;
}

void bw_window(const Options &o, const Rdma &r, unsigned &window, unsigned &chunk) {
  window = std::max(1u, std::min(o.window, r.sq_depth));
  chunk = o.chunk ? o.chunk : std::max(1u, window / 4);
  chunk = std::min(chunk, window);
  window = window / chunk * chunk;
}

// write_bw and read_bw: the server has nothing to do, a one-sided operation
// needs no responder CPU.
void write_bw(Rdma &r, const Options &o, bool client, uint64_t size, Test t = Test::WriteBw) {
  const ibv_wr_opcode op = t == Test::ReadBw ? IBV_WR_RDMA_READ : IBV_WR_RDMA_WRITE;
  barrier(r.sock);
  if (client) {
    unsigned window, chunk;
    bw_window(o, r, window, chunk);
    std::memset(r.send_buf(), 0x5a, size);
    if (o.warm_seconds > 0) bw_loop(r, size, window, chunk, o.warm_seconds, op);
    BwResult res = bw_loop(r, size, window, chunk, o.seconds, op);
    double bytes = static_cast<double>(res.msgs) * static_cast<double>(size);
    bench::JsonLine()
        .str("bench", "verbs")
        .str("test", test_name(t))
        .str("device", r.dev)
        .num("size", size)
        .num("msgs", res.msgs)
        .real("seconds", res.seconds)
        .real("gbps", bytes / res.seconds / 1e9)
        .real("mmsgs_per_s", static_cast<double>(res.msgs) / res.seconds / 1e6)
        .num("window", window)
        .num("signal_every", chunk)
        .num("inline", op != IBV_WR_RDMA_READ && size <= r.max_inline ? 1 : 0)
        .emit();
  }
  barrier(r.sock);
}

// send_bw: the client streams SENDs like write_bw; the server reposts each
// consumed receive at once and, since it cannot know when the client's timed
// loop ends, learns the total from the socket (checked between polls).
void send_bw(Rdma &r, const Options &o, bool client, uint64_t size) {
  post_recvs(r);
  if (client) *reinterpret_cast<volatile uint64_t *>(r.recv_buf()) = 0;  // the credit word
  barrier(r.sock);
  if (client) {
    unsigned window, chunk;
    bw_window(o, r, window, chunk);
    window = std::min(window, r.rq_depth / chunk * chunk);  // never outrun the receives
    if (window == 0) window = chunk = 1;
    std::memset(r.send_buf(), 0x3c, size);
    // Never more SENDs unconsumed than the server has receives: a sender
    // that runs out of them waits out RNR NAK timers (IBTA 9.7.5.2.8), and
    // that would measure the back-off, not the data path.
    Credits cr{reinterpret_cast<const volatile uint64_t *>(r.recv_buf()), r.rq_depth, 0};
    uint64_t sent = 0;
    if (o.warm_seconds > 0) sent += bw_loop(r, size, window, chunk, o.warm_seconds, IBV_WR_SEND, &cr).msgs;
    BwResult res = bw_loop(r, size, window, chunk, o.seconds, IBV_WR_SEND, &cr);
    sent += res.msgs;
    write_all(r.sock, &sent, sizeof sent);
    uint64_t got = 0;
    read_all(r.sock, &got, sizeof got);
    if (got != sent) die("send_bw: server received %llu of %llu messages", static_cast<unsigned long long>(got),
                         static_cast<unsigned long long>(sent));
    double bytes = static_cast<double>(res.msgs) * static_cast<double>(size);
    bench::JsonLine()
        .str("bench", "verbs")
        .str("test", "send_bw")
        .str("device", r.dev)
        .num("size", size)
        .num("msgs", res.msgs)
        .real("seconds", res.seconds)
        .real("gbps", bytes / res.seconds / 1e9)
        .real("mmsgs_per_s", static_cast<double>(res.msgs) / res.seconds / 1e6)
        .num("window", window)
        .num("signal_every", chunk)
        .num("inline", size <= r.max_inline ? 1 : 0)
        .emit();
  } else {
    ibv_sge rsge{reinterpret_cast<uintptr_t>(r.recv_buf()), static_cast<uint32_t>(r.region), r.mr->lkey};
    ibv_recv_wr rwr{};
    rwr.sg_list = &rsge;
    rwr.num_sge = 1;
    uint64_t got = 0, want = UINT64_MAX;
    unsigned idle = 0;
    // Credits: every 16 reposted receives, an inline RDMA WRITE of the count
    // into the client's credit word.
    SendTracker tr{16, r.sq_depth};
    ibv_sge csge{reinterpret_cast<uintptr_t>(r.send_buf()), 8, r.mr->lkey};
    ibv_send_wr cwr{};
    cwr.sg_list = &csge;
    cwr.num_sge = 1;
    cwr.opcode = IBV_WR_RDMA_WRITE;
    cwr.wr.rdma.remote_addr = r.remote_recv();
    cwr.wr.rdma.rkey = r.remote.rkey;
    uint64_t credited = 0;
    while (got < want) {
      ibv_wc wc[16];
      int n = ibv_poll_cq(r.rcq, 16, wc);
      if (n < 0) die("ibv_poll_cq(recv) failed");
      for (int i = 0; i < n; ++i) {
        check_wc(wc[i], "recv");
        if (wc[i].byte_len != size) die("recv byte_len %u != %llu", wc[i].byte_len,
                                        static_cast<unsigned long long>(size));
        rwr.wr_id = wc[i].wr_id;
        ibv_recv_wr *bad = nullptr;
        if (int e = ibv_post_recv(r.qp, &rwr, &bad)) die("ibv_post_recv failed: %s", std::strerror(e));
      }
      got += static_cast<uint64_t>(n);
      if (got - credited >= 16 || (n == 0 && got != credited)) {
        credited = got;
        std::memcpy(r.send_buf(), &credited, 8);
        cwr.send_flags = (r.max_inline >= 8 ? kInline : 0u) | (tr.next_signaled(r, false) ? kSignaled : 0u);
        ibv_send_wr *bad = nullptr;
        if (int e = ibv_post_send(r.qp, &cwr, &bad)) die("ibv_post_send(credit) failed: %s", std::strerror(e));
        tr.reap(r);
      }
      if (n == 0 && want == UINT64_MAX && (++idle & 255) == 0) {
        uint64_t v;
        ssize_t k = recv(r.sock, &v, sizeof v, MSG_DONTWAIT | MSG_PEEK);
        if (k == static_cast<ssize_t>(sizeof v)) read_all(r.sock, &want, sizeof want);
        else if (k == 0) die("peer closed the socket (peer failed?)");
      }
      if (n == 0) bench::cpu_relax();
    }
    if (got != want) die("send_bw: received %llu messages, client sent %llu", static_cast<unsigned long long>(got),
                         static_cast<unsigned long long>(want));
    tr.drain(r);
    write_all(r.sock, &got, sizeof got);
  }
  barrier(r.sock);
}

// read_lat: one RDMA READ at a time from the server's buffer into the
// client's; the time from post to polled completion.  Always signalled: the
// completion is the only sign the data has arrived.
void read_lat(Rdma &r, const Options &o, bool client, uint64_t size) {
  const LatIters li = lat_iters(o, size);
  const uint64_t total = li.iters + li.warmup;
  std::vector<uint64_t> stamps(client ? total + 1 : 0);
  barrier(r.sock);
  if (client) {
    ibv_sge sge{reinterpret_cast<uintptr_t>(r.send_buf()), static_cast<uint32_t>(size), r.mr->lkey};
    ibv_send_wr wr{};
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_RDMA_READ;
    wr.send_flags = kSignaled;
    wr.wr.rdma.remote_addr = r.remote_recv();
    wr.wr.rdma.rkey = r.remote.rkey;
    for (uint64_t i = 0; i < total; ++i) {
      stamps[i] = bench::ticks();
      wr.wr_id = i;
      ibv_send_wr *bad = nullptr;
      if (int e = ibv_post_send(r.qp, &wr, &bad)) die("ibv_post_send(READ) failed: %s", std::strerror(e));
      ibv_wc wc;
      int n;
      bench::Spinner sp;
      while ((n = ibv_poll_cq(r.scq, 1, &wc)) == 0) sp.spin();
      if (n < 0) die("ibv_poll_cq(send) failed");
      check_wc(wc, "READ");
    }
    stamps[total] = bench::ticks();
  }
  barrier(r.sock);
  if (client) emit_lat(r, Test::ReadLat, size, li, false, stamps, 1.0);
}

int run_role(const Options &o, bool client, int sock) {
  g_role = client ? "client" : "server";
  srand48(getpid() * 7919L + (client ? 1 : 2));
  if (o.pin) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(client ? 0 : 1, &set);
    if (sched_setaffinity(0, sizeof set, &set)) std::perror("sched_setaffinity");
  }
  uint64_t max_size = 64;
  for (Test t : o.tests)
    max_size = std::max(max_size, bench::max_of(is_bw(t) ? o.bw_sizes : o.lat_sizes));

  Rdma r;
  r.sock = sock;
  setup(r, o, max_size);
  if (client)
    bench::JsonLine()
        .str("bench", "verbs")
        .str("test", "info")
        .str("device", r.dev)
        .num("mtu", mtu_bytes(r.local.mtu))
        .num("max_inline", r.max_inline)
        .num("sq_depth", r.sq_depth)
        .str("link_layer", r.port.link_layer == IBV_LINK_LAYER_ETHERNET ? "ethernet"
                           : r.port.link_layer == IBV_LINK_LAYER_INFINIBAND ? "infiniband"
                                                                           : "unspecified")
        .emit();

  for (Test t : o.tests) {
    const auto &sizes = is_bw(t) ? o.bw_sizes : o.lat_sizes;
    for (uint64_t size : sizes) {
      vlog("%s %llu B: start", test_name(t), static_cast<unsigned long long>(size));
      switch (t) {
        case Test::WriteLat: write_lat(r, o, client, size); break;
        case Test::WriteBw: write_bw(r, o, client, size); break;
        case Test::SendLat: send_lat(r, o, client, size); break;
        case Test::Verify: verify(r, client, size); break;
        case Test::ReadLat: read_lat(r, o, client, size); break;
        case Test::ReadBw: write_bw(r, o, client, size, Test::ReadBw); break;
        case Test::SendBw: send_bw(r, o, client, size); break;
      }
    }
  }
  barrier(sock);
  vlog("tests done, tearing down");
  teardown(r);
  vlog("done");
  return 0;
}

void usage() {
  std::fprintf(stderr,
               "usage: verbs_bench [options]\n"
               "  --test LIST       write_lat,write_bw,send_lat,read_lat,read_bw,send_bw,verify\n"
               "                    (aliases lat,bw,send; all = every test but verify;\n"
               "                    verify checks that WRITE data arrives intact, for each bw size)\n"
               "  --sizes LIST      sizes for all tests, e.g. 8-4M (powers of 2) or 8,64K,1M\n"
               "  --lat-sizes LIST  sizes for latency tests (default 8)\n"
               "  --bw-sizes LIST   sizes for the bandwidth tests (default 8-4M)\n"
               "  --iters N         latency iterations (default 100000)\n"
               "  --lat-bytes SIZE  latency: at most SIZE bytes per message size (default 1G),\n"
               "                    i.e. fewer iterations for large messages\n"
               "  --min-iters N     latency: but at least N iterations (default 100)\n"
               "  --warmup N        latency warm-up iterations (default 2000)\n"
               "  --time SEC        write_bw seconds per size (default 0.2)\n"
               "  --window N        write_bw WRs in flight (default 64)\n"
               "  --signal-every N  write_bw signal period (default window/4)\n"
               "  --cq-mod N        latency tests: signal every Nth WR (default 64)\n"
               "  --inline N        requested max_inline_data (default 64)\n"
               "  --dev NAME --ib-port N --gid-idx N --mtu BYTES\n"
               "  --pin             pin client to CPU 0, server to CPU 1\n"
               "  --td              create the QP in a parent domain with a thread domain\n"
               "                    (ibv_alloc_td: one thread per QP, the provider may skip locks)\n"
               "  --server-uid UID  the server process runs as UID (gid UID, no groups): with a\n"
               "                    system daemon (SOFTVERBS_SYSTEM=1), the path between users\n"
               "  --timeout SEC     watchdog (default 300)\n"
               "  -v, --verbose     log setup and test progress to stderr\n");
}

bool parse_tests(const std::string &v, std::vector<Test> &out) {
  out.clear();
  size_t pos = 0;
  while (pos <= v.size()) {
    size_t c = v.find(',', pos);
    if (c == std::string::npos) c = v.size();
    std::string t = v.substr(pos, c - pos);
    if (t == "all") {
      out = {Test::WriteLat, Test::WriteBw, Test::SendLat, Test::ReadLat, Test::ReadBw, Test::SendBw};
    } else if (t == "write_lat" || t == "lat") {
      out.push_back(Test::WriteLat);
    } else if (t == "write_bw" || t == "bw") {
      out.push_back(Test::WriteBw);
    } else if (t == "send_lat" || t == "send") {
      out.push_back(Test::SendLat);
    } else if (t == "verify") {
      out.push_back(Test::Verify);
    } else if (t == "read_lat") {
      out.push_back(Test::ReadLat);
    } else if (t == "read_bw") {
      out.push_back(Test::ReadBw);
    } else if (t == "send_bw") {
      out.push_back(Test::SendBw);
    } else if (!t.empty()) {
      return false;
    }
    pos = c + 1;
  }
  return !out.empty();
}

}  // namespace

int main(int argc, char **argv) {
  Options o;
  bench::parse_size_list("8-4M", o.bw_sizes);
  bench::Args a(argc, argv);
  for (; a.valid(); a.next()) {
    std::string v;
    if (a.flag("-h") || a.flag("--help")) {
      usage();
      return 0;
    } else if (a.take("--test", v)) {
      if (!parse_tests(v, o.tests)) {
        std::fprintf(stderr, "bad --test '%s'\n", v.c_str());
        return 2;
      }
    } else if (a.take("--sizes", v)) {
      if (!bench::parse_size_list(v, o.bw_sizes) || !bench::parse_size_list(v, o.lat_sizes)) {
        std::fprintf(stderr, "bad --sizes '%s'\n", v.c_str());
        return 2;
      }
    } else if (a.take("--lat-sizes", v)) {
      if (!bench::parse_size_list(v, o.lat_sizes)) {
        std::fprintf(stderr, "bad --lat-sizes '%s'\n", v.c_str());
        return 2;
      }
    } else if (a.take("--bw-sizes", v)) {
      if (!bench::parse_size_list(v, o.bw_sizes)) {
        std::fprintf(stderr, "bad --bw-sizes '%s'\n", v.c_str());
        return 2;
      }
    } else if (a.take("--iters", v)) {
      o.iters = bench::to_u64(v, "--iters");
    } else if (a.take("--lat-bytes", v)) {
      if (!bench::parse_size(v, o.lat_bytes)) {
        std::fprintf(stderr, "bad --lat-bytes '%s'\n", v.c_str());
        return 2;
      }
    } else if (a.take("--min-iters", v)) {
      o.min_iters = std::max<uint64_t>(1, bench::to_u64(v, "--min-iters"));
    } else if (a.take("--warmup", v)) {
      o.warmup = bench::to_u64(v, "--warmup");
    } else if (a.take("--time", v)) {
      o.seconds = bench::to_double(v, "--time");
    } else if (a.take("--window", v)) {
      o.window = static_cast<unsigned>(bench::to_u64(v, "--window"));
    } else if (a.take("--signal-every", v)) {
      o.chunk = static_cast<unsigned>(bench::to_u64(v, "--signal-every"));
    } else if (a.take("--cq-mod", v)) {
      o.cq_mod = static_cast<unsigned>(bench::to_u64(v, "--cq-mod"));
    } else if (a.take("--inline", v)) {
      o.inline_req = static_cast<unsigned>(bench::to_u64(v, "--inline"));
    } else if (a.take("--dev", v)) {
      o.dev_name = v;
    } else if (a.take("--ib-port", v)) {
      o.ib_port = static_cast<int>(bench::to_u64(v, "--ib-port"));
    } else if (a.take("--gid-idx", v)) {
      o.gid_idx = static_cast<int>(bench::to_u64(v, "--gid-idx"));
    } else if (a.take("--mtu", v)) {
      o.mtu = static_cast<int>(bench::to_u64(v, "--mtu"));
      mtu_enum(o.mtu);
    } else if (a.take("--timeout", v)) {
      o.timeout = static_cast<unsigned>(bench::to_u64(v, "--timeout"));
    } else if (a.take("--server-uid", v)) {
      o.server_uid = static_cast<long>(bench::to_u64(v, "--server-uid"));
    } else if (a.flag("--pin")) {
      o.pin = true;
    } else if (a.flag("--td")) {
      o.td = true;
    } else if (a.flag("-v") || a.flag("--verbose")) {
      g_verbose = true;
    } else {
      std::fprintf(stderr, "unknown argument '%s'\n", a.cur());
      usage();
      return 2;
    }
  }
  if (o.iters == 0 || o.window == 0) {
    std::fprintf(stderr, "--iters and --window must be > 0\n");
    return 2;
  }
  for (uint64_t s : o.bw_sizes)
    if (s > (1u << 30)) die("size %llu too large", static_cast<unsigned long long>(s));
  for (uint64_t s : o.lat_sizes)
    if (s > (1u << 30)) die("size %llu too large", static_cast<unsigned long long>(s));

  bench::ticks_per_ns();  // calibrate once, before fork
  signal(SIGALRM, on_alarm);
  signal(SIGPIPE, SIG_IGN);

  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv)) die("socketpair: %s", std::strerror(errno));
  std::fflush(stdout);
  pid_t pid = fork();
  if (pid < 0) die("fork: %s", std::strerror(errno));
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    close(sv[0]);
    if (o.server_uid >= 0) {
      const gid_t g = static_cast<gid_t>(o.server_uid);
      const uid_t u = static_cast<uid_t>(o.server_uid);
      if (setgroups(0, nullptr) || setresgid(g, g, g) || setresuid(u, u, u))
        die("--server-uid %ld: %s (run as root)", o.server_uid, std::strerror(errno));
      prctl(PR_SET_PDEATHSIG, SIGKILL);  // cleared by the change of credentials
    }
    if (o.timeout) alarm(o.timeout);
    run_role(o, false, sv[1]);
    std::fflush(stdout);
    _exit(0);
  }
  close(sv[1]);
  g_child_pid = pid;
  {
    struct sigaction sa {};
    sa.sa_handler = on_sigchld;
    sa.sa_flags = SA_RESTART | SA_NOCLDSTOP;
    sigaction(SIGCHLD, &sa, nullptr);
  }
  // The child may have died before the handler was installed.
  if (!g_child_done) raise(SIGCHLD);
  if (o.timeout) alarm(o.timeout);
  int rc = run_role(o, true, sv[0]);
  close(sv[0]);
  int status = 0;
  if (waitpid(pid, &status, 0) < 0) {
    if (errno != ECHILD || !g_child_done) die("waitpid: %s", std::strerror(errno));
    status = g_child_status;
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    if (WIFSIGNALED(status))
      die("server process killed by signal %d", WTERMSIG(status));
    die("server process failed (exit %d)", WEXITSTATUS(status));
  }
  return rc;
}
