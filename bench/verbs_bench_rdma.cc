// verbs_bench_rdma.cc: verbs_bench's RC QP pair (device, memory, QP, the
// exchange of addresses over the socket), its teardown and completions.
#include <unistd.h>

#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "verbs_bench.h"

namespace verbs_bench {

const char *g_role = "client";
bool g_verbose = false;

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

namespace {

// Opens the first device (or --dev) and queries it, its port (into r.port)
// and the GID of --gid-idx.
void open_device(Rdma &r, const Options &o, ibv_device_attr &dattr, ibv_gid &gid) {
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

  dattr = ibv_device_attr{};
  if (ibv_query_device(r.ctx, &dattr)) die("ibv_query_device failed");
  if (ibv_query_port(r.ctx, static_cast<uint8_t>(o.ib_port), &r.port))
    die("ibv_query_port(%d) failed", o.ib_port);
  if (r.port.state != IBV_PORT_ACTIVE)
    std::fprintf(stderr, "verbs_bench %s: warning: port %d is not ACTIVE (state %d)\n", g_role,
                 o.ib_port, r.port.state);

  std::memset(&gid, 0, sizeof gid);
  if (ibv_query_gid(r.ctx, static_cast<uint8_t>(o.ib_port), o.gid_idx, &gid))
    std::fprintf(stderr, "verbs_bench %s: warning: ibv_query_gid(%d) failed\n", g_role, o.gid_idx);
}

// The PD (under a parent domain with a thread domain, with --td) and the
// registered buffer: a receive and a send region of at least max_size each.
void alloc_memory(Rdma &r, const Options &o, uint64_t max_size) {
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
}

// The CQs and the RC QP, as deep as the device allows, in INIT; with the
// requested inline size if the provider grants it, else none.
void create_qp(Rdma &r, const Options &o, const ibv_device_attr &dattr) {
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
}

// Exchanges addresses with the peer over the socket and brings the QP to
// RTR and RTS, connected to the peer's; ends at a barrier.
void connect_qp(Rdma &r, const Options &o, const ibv_gid &gid) {
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

  ibv_qp_attr a{};
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

}  // namespace

void setup(Rdma &r, const Options &o, uint64_t max_size) {
  ibv_device_attr dattr;
  ibv_gid gid;
  open_device(r, o, dattr, gid);
  alloc_memory(r, o, max_size);
  create_qp(r, o, dattr);
  connect_qp(r, o, gid);
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

int poll_send(Rdma &r, int max) {
  ibv_wc wc[16];
  int n = ibv_poll_cq(r.scq, std::min(max, 16), wc);
  if (n < 0) die("ibv_poll_cq(send) failed");
  for (int i = 0; i < n; ++i) check_wc(wc[i], "send");
  return n;
}

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

}  // namespace verbs_bench
