// reg_atomic_bench: what registration costs and how fast RDMA atomics run,
// each beside a baseline measured in the same run.
//
//   reg    ibv_reg_mr + ibv_dereg_mr per size (small buffers: per
//          registration; large: per MiB), beside memcpy of the same size
//          (softverbs copies the pages once in and once out) and
//          mlock+munlock of the same range (what pinning costs the kernel).
//   odp    reg+dereg of an on-demand-paging MR at 4 KiB, 1 MiB, 1 GiB beside
//          a regular MR's, mlock+munlock and two control round trips; 64 KiB
//          WRITE bandwidth into an ODP MR beside a regular MR (two QPs of
//          one process).
//   odp-bw PATH [thp]
//          64 KiB and 1 MiB WRITE bandwidth into an ODP MR beside a regular
//          MR, where the MR's owner is this process (PATH self: two QPs),
//          a child of the same user (peer), or a child running as uid
//          65534 (user: through the daemon; run as root against a system
//          daemon). The ODP buffer is 2 MiB-aligned anonymous memory with
//          MADV_HUGEPAGE (thp) or MADV_NOHUGEPAGE, touched before.
//   atomic FETCH_AND_ADD rate between two processes (one RC QP pair, a
//          window of WRs in flight), beside the rate of __atomic_fetch_add
//          on one cache line bounced between the same two processes.
// Output: JSON lines on stdout, like shm_pingpong and verbs_bench.
#include <infiniband/verbs.h>
#include <grp.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench_common.h"

namespace {

using bench::JsonLine;
using bench::now_ns_steady;

ibv_context* open_dev() {
  int n = 0;
  ibv_device** l = ibv_get_device_list(&n);
  ibv_context* c = (l && n) ? ibv_open_device(l[0]) : nullptr;
  if (l) ibv_free_device_list(l);
  return c;
}

int reg_bench() {
  ibv_context* ctx = open_dev();
  if (!ctx) return std::fprintf(stderr, "reg: no device\n"), 1;
  ibv_pd* pd = ibv_alloc_pd(ctx);
  for (uint64_t size : {64ull, 4096ull, 1ull << 20, 64ull << 20}) {
    int reps = size <= 4096 ? 2000 : size <= (1 << 20) ? 200 : 10;
    void* buf = nullptr;
    if (posix_memalign(&buf, 4096, size)) return 1;
    std::memset(buf, 1, size);
    std::vector<uint8_t> dst(size);
    uint64_t t0 = now_ns_steady();
    for (int i = 0; i < reps; ++i) {
      ibv_mr* mr = ibv_reg_mr(pd, buf, size, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
      if (!mr) return std::fprintf(stderr, "reg_mr %llu failed\n", (unsigned long long)size), 1;
      ibv_dereg_mr(mr);
    }
    double reg_ns = double(now_ns_steady() - t0) / reps;
    // The registration cache's pattern (UCX's rcache, MPI): the same memory
    // registered again while a registration of it is held, so its pages are
    // already backed and only counted (the target: at most one control
    // round trip).
    ibv_mr* held = ibv_reg_mr(pd, buf, size, IBV_ACCESS_LOCAL_WRITE);
    if (!held) return std::fprintf(stderr, "reg_mr %llu failed\n", (unsigned long long)size), 1;
    t0 = now_ns_steady();
    for (int i = 0; i < reps; ++i) {
      ibv_mr* mr = ibv_reg_mr(pd, buf, size, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
      if (!mr) return std::fprintf(stderr, "reg_mr (held) %llu failed\n", (unsigned long long)size), 1;
      ibv_dereg_mr(mr);
    }
    double held_ns = double(now_ns_steady() - t0) / reps;
    ibv_dereg_mr(held);
    t0 = now_ns_steady();
    for (int i = 0; i < reps; ++i) {
      std::memcpy(dst.data(), buf, size);
      asm volatile("" ::"r"(dst.data()) : "memory");
    }
    double copy_ns = double(now_ns_steady() - t0) / reps;
    t0 = now_ns_steady();
    bool locked = true;
    for (int i = 0; i < reps && locked; ++i) {
      locked = mlock(buf, size) == 0;
      munlock(buf, size);
    }
    double lock_ns = locked ? double(now_ns_steady() - t0) / reps : -1;
    JsonLine()
        .str("bench", "reg")
        .num("size", size)
        .num("reps", reps)
        .real("reg_dereg_ns", reg_ns)
        .real("reg_dereg_held_ns", held_ns)
        .real("memcpy_ns", copy_ns)
        .real("mlock_munlock_ns", lock_ns)
        .emit();
    std::free(buf);
  }
  ibv_dealloc_pd(pd);
  ibv_close_device(ctx);
  return 0;
}

// The baseline: two processes hammer one shared cache line with fetch-add.
double raw_atomic_rate(uint64_t ops) {
  auto* word = static_cast<std::atomic<uint64_t>*>(
      mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  word[0] = 0;
  word[8] = 0;  // start flag, another line
  pid_t pid = fork();
  if (pid == 0) {
    while (word[8].load() == 0) {
    }
    for (uint64_t i = 0; i < ops; ++i) word[0].fetch_add(1);
    _exit(0);
  }
  uint64_t t0 = now_ns_steady();
  word[8] = 1;
  for (uint64_t i = 0; i < ops; ++i) word[0].fetch_add(1);
  int st;
  waitpid(pid, &st, 0);
  double s = double(now_ns_steady() - t0) / 1e9;
  munmap(word, 4096);
  return double(2 * ops) / s;
}

// Brings qp to RTS, connected to QP dest_qpn of the same device, with
// remote atomics allowed and 16 of them in flight each way.
bool connect_rc(ibv_qp* qp, uint32_t dest_qpn, int access = IBV_ACCESS_REMOTE_ATOMIC) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.port_num = 1;
  a.qp_access_flags = access;
  ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
  a = {};
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = IBV_MTU_4096;
  a.dest_qp_num = dest_qpn;
  a.max_dest_rd_atomic = 16;
  a.min_rnr_timer = 12;
  a.ah_attr.port_num = 1;
  ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                            IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
  a = {};
  a.qp_state = IBV_QPS_RTS;
  a.timeout = 14;
  a.retry_cnt = 7;
  a.rnr_retry = 7;
  a.max_rd_atomic = 16;
  return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                                   IBV_QP_MAX_QP_RD_ATOMIC) == 0;
}

// Seconds for ops fetch-adds of wr on qp, at most window in flight, one in
// 8 signalled; -1 (said on stderr) if one fails.
double time_fetch_adds(ibv_qp* qp, ibv_cq* cq, ibv_send_wr& wr, uint64_t ops, uint64_t window) {
  uint64_t posted = 0, done = 0;
  uint64_t t0 = now_ns_steady();
  while (done < ops) {
    while (posted < ops && posted - done < window) {
      wr.send_flags = (posted % 8 == 7 || posted + 1 == ops) ? IBV_SEND_SIGNALED : 0;
      ibv_send_wr* bad;
      if (ibv_post_send(qp, &wr, &bad)) return std::fprintf(stderr, "atomic: post failed\n"), -1;
      ++posted;
    }
    ibv_wc wc[16];
    int n = ibv_poll_cq(cq, 16, wc);
    for (int i = 0; i < n; ++i) {
      if (wc[i].status != IBV_WC_SUCCESS) return std::fprintf(stderr, "atomic: %s\n", ibv_wc_status_str(wc[i].status)), -1;
      done = std::min(ops, (done / 8 + 1) * 8);
    }
  }
  return double(now_ns_steady() - t0) / 1e9;
}

int atomic_bench() {
  int sv[2];
  socketpair(AF_UNIX, SOCK_STREAM, 0, sv);
  constexpr uint64_t kOps = 500000;
  constexpr int kWindow = 32;
  pid_t pid = fork();
  bool server = pid == 0;
  int sock = server ? sv[1] : sv[0];
  ibv_context* ctx = open_dev();
  if (!ctx) return std::fprintf(stderr, "atomic: no device\n"), 1;
  ibv_pd* pd = ibv_alloc_pd(ctx);
  void* buf = nullptr;
  if (posix_memalign(&buf, 4096, 4096)) return 1;
  std::memset(buf, 0, 4096);
  ibv_mr* mr = ibv_reg_mr(pd, buf, 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_ATOMIC);
  ibv_cq* cq = ibv_create_cq(ctx, 256, nullptr, nullptr, 0);
  ibv_qp_init_attr ia{};
  ia.send_cq = ia.recv_cq = cq;
  ia.qp_type = IBV_QPT_RC;
  ia.cap = {128, 16, 1, 1, 0};
  ibv_qp* qp = ibv_create_qp(pd, &ia);
  if (!pd || !mr || !cq || !qp) return std::fprintf(stderr, "atomic: setup failed\n"), 1;
  struct Info {
    uint32_t qpn, rkey;
    uint64_t addr;
  } mine{qp->qp_num, mr->rkey, reinterpret_cast<uint64_t>(buf)}, theirs{};
  if (write(sock, &mine, sizeof(mine)) != sizeof(mine) || read(sock, &theirs, sizeof(theirs)) != sizeof(theirs))
    return 1;
  if (!connect_rc(qp, theirs.qpn))
    return std::fprintf(stderr, "atomic: connect failed\n"), 1;
  char c = 0;
  if (write(sock, &c, 1) != 1 || read(sock, &c, 1) != 1) return 1;
  if (server) {
    if (read(sock, &c, 1) != 1) _exit(1);  // until the client is done
    _exit(0);
  }
  ibv_sge sge{reinterpret_cast<uint64_t>(buf) + 64, 8, mr->lkey};
  ibv_send_wr wr{};
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
  wr.wr.atomic.remote_addr = theirs.addr;
  wr.wr.atomic.rkey = theirs.rkey;
  wr.wr.atomic.compare_add = 1;
  double s = time_fetch_adds(qp, cq, wr, kOps, kWindow);
  if (s < 0) return 1;
  if (write(sock, &c, 1) != 1) return 1;
  int st;
  waitpid(pid, &st, 0);
  double raw = raw_atomic_rate(kOps);
  JsonLine()
      .str("bench", "atomic")
      .str("op", "fetch_add")
      .num("ops", kOps)
      .real("softverbs_ops_per_s", double(kOps) / s)
      .real("raw_shared_line_ops_per_s", raw)
      .emit();
  return 0;
}

// Resident memory of a process in KiB (VmRSS), 0 if unknown.
uint64_t rss_kib(pid_t pid) {
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%d/status", int(pid));
  FILE* f = std::fopen(path, "r");
  if (!f) return 0;
  char line[256];
  unsigned long long kib = 0;
  while (std::fgets(line, sizeof(line), f))
    if (std::sscanf(line, "VmRSS: %llu", &kib) == 1) break;
  std::fclose(f);
  return kib;
}

// The daemon's pid, from its status reply (protocol.h's StatusReply).
pid_t daemon_pid() {
  const char* d = std::getenv("SOFTVERBS_DIR");
  std::string dir = d && *d ? d : "/tmp/softverbs-" + std::to_string(getuid());
  if (const char* x = std::getenv("XDG_RUNTIME_DIR"); !(d && *d) && x && *x) dir = std::string(x) + "/softverbs";
  int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::snprintf(a.sun_path, sizeof(a.sun_path), "%s/control", dir.c_str());
  if (connect(s, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    close(s);
    return 0;
  }
  struct {
    uint32_t magic;
    uint16_t version, op;
    uint32_t seq;
    int32_t status;
  } req{0x53565250, 1, 17 /* Status */, 1, 0};
  uint32_t rep[16] = {};
  pid_t pid = 0;
  if (send(s, &req, sizeof(req), 0) == sizeof(req) && recv(s, rep, sizeof(rep), 0) >= 52) pid = pid_t(rep[12]);
  close(s);
  return pid;
}

// Scale: many QPs and many MRs in one process, with the memory each costs
// this process and the daemon.
int scale_bench(uint32_t nqp, uint32_t nmr) {
  ibv_context* ctx = open_dev();
  if (!ctx) return std::fprintf(stderr, "scale: no device\n"), 1;
  ibv_pd* pd = ibv_alloc_pd(ctx);
  ibv_cq* cq = ibv_create_cq(ctx, 1024, nullptr, nullptr, 0);
  pid_t dpid = daemon_pid();
  uint64_t me0 = rss_kib(getpid()), d0 = dpid ? rss_kib(dpid) : 0;
  std::vector<ibv_qp*> qps;
  uint64_t t0 = now_ns_steady();
  for (uint32_t i = 0; i < nqp; ++i) {
    ibv_qp_init_attr ia{};
    ia.send_cq = ia.recv_cq = cq;
    ia.qp_type = IBV_QPT_RC;
    ia.cap = {16, 16, 1, 1, 0};
    ibv_qp* qp = ibv_create_qp(pd, &ia);
    if (!qp) return std::fprintf(stderr, "scale: QP %u: %s\n", i, std::strerror(errno)), 1;
    qps.push_back(qp);
  }
  double qp_ns = double(now_ns_steady() - t0) / nqp;
  uint64_t me1 = rss_kib(getpid()), d1 = dpid ? rss_kib(dpid) : 0;
  void* buf = nullptr;
  if (posix_memalign(&buf, 4096, 65536)) return 1;
  std::vector<ibv_mr*> mrs;
  t0 = now_ns_steady();
  for (uint32_t i = 0; i < nmr; ++i) {
    ibv_mr* mr = ibv_reg_mr(pd, static_cast<char*>(buf) + (i % 4096), 4096, IBV_ACCESS_LOCAL_WRITE);
    if (!mr) return std::fprintf(stderr, "scale: MR %u: %s\n", i, std::strerror(errno)), 1;
    mrs.push_back(mr);
  }
  double mr_ns = double(now_ns_steady() - t0) / nmr;
  uint64_t me2 = rss_kib(getpid()), d2 = dpid ? rss_kib(dpid) : 0;
  JsonLine()
      .str("bench", "scale")
      .num("qps", nqp)
      .num("mrs", nmr)
      .real("create_qp_ns", qp_ns)
      .real("reg_mr_ns", mr_ns)
      .real("process_bytes_per_qp", double(me1 - me0) * 1024 / nqp)
      .real("daemon_bytes_per_qp", dpid ? double(d1 - d0) * 1024 / nqp : -1)
      .real("process_bytes_per_mr", double(me2 - me1) * 1024 / nmr)
      .real("daemon_bytes_per_mr", dpid ? double(d2 - d1) * 1024 / nmr : -1)
      .emit();
  for (ibv_mr* mr : mrs) ibv_dereg_mr(mr);
  for (ibv_qp* qp : qps) ibv_destroy_qp(qp);
  ibv_destroy_cq(cq);
  ibv_dealloc_pd(pd);
  ibv_close_device(ctx);
  std::free(buf);
  return 0;
}

}  // namespace

// ---- On-demand paging (docs/MEMORY.md) ------------------------------------

// Nanoseconds per call of fn, over reps calls.
template <class F>
double per_call_ns(int reps, F fn) {
  const uint64_t t0 = now_ns_steady();
  for (int i = 0; i < reps; ++i)
    if (!fn()) return -1;
  return double(now_ns_steady() - t0) / reps;
}

// reg+dereg of an ODP MR, of a regular MR and mlock+munlock of the same
// buffer (touched), and a pair of control round trips (ibv_alloc_pd +
// ibv_dealloc_pd: what an ODP reg+dereg is made of), at 4 KiB, 1 MiB, 1 GiB.
int odp_reg_bench(ibv_pd* pd) {
  constexpr int kAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
  for (uint64_t size : {4096ull, 1ull << 20, 1ull << 30}) {
    auto* buf = static_cast<uint8_t*>(mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    if (buf == MAP_FAILED) return 1;
    std::memset(buf, 1, size);
    const int reps = size <= (1 << 20) ? 1000 : 3;
    auto cycle = [&](int access) {
      ibv_mr* mr = ibv_reg_mr(pd, buf, size, access);
      return mr && ibv_dereg_mr(mr) == 0;
    };
    const double odp = per_call_ns(1000, [&] { return cycle(kAccess | IBV_ACCESS_ON_DEMAND); });
    const double reg = per_call_ns(reps, [&] { return cycle(kAccess); });
    const double lock = per_call_ns(reps, [&] { return mlock(buf, size) == 0 && munlock(buf, size) == 0; });
    const double rtt = per_call_ns(1000, [&] {
      ibv_pd* p = ibv_alloc_pd(pd->context);
      return p && ibv_dealloc_pd(p) == 0;
    });
    JsonLine()
        .str("bench", "odp_reg")
        .num("size", size)
        .real("odp_reg_dereg_ns", odp)
        .real("reg_dereg_ns", reg)
        .real("mlock_munlock_ns", lock)
        .real("alloc_dealloc_pd_ns", rtt)
        .emit();
    munmap(buf, size);
  }
  return 0;
}

// GB/s of RDMA WRITEs of `msg` bytes (32 in flight) between two QPs of this
// process into `dst`'s MR; -1 if one fails.
double write_gbps(ibv_qp* qp, ibv_cq* cq, ibv_mr* src, ibv_mr* dst, uint64_t ops, uint32_t msg) {
  ibv_sge sge{uint64_t(uintptr_t(src->addr)), msg, src->lkey};
  ibv_send_wr wr{};
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.wr.rdma.remote_addr = uint64_t(uintptr_t(dst->addr));
  wr.wr.rdma.rkey = dst->rkey;
  const double s = time_fetch_adds(qp, cq, wr, ops, 32);
  return s > 0 ? double(ops) * msg / s / 1e9 : -1;
}

int odp_bw_bench(ibv_pd* pd) {
  ibv_cq* cq = ibv_create_cq(pd->context, 256, nullptr, nullptr, 0);
  ibv_qp_init_attr ia{};
  ia.send_cq = ia.recv_cq = cq;
  ia.qp_type = IBV_QPT_RC;
  ia.cap = {64, 64, 1, 1, 0};
  ibv_qp* a = ibv_create_qp(pd, &ia);
  ibv_qp* b = ibv_create_qp(pd, &ia);
  if (!a || !b || !connect_rc(a, b->qp_num, IBV_ACCESS_REMOTE_WRITE) || !connect_rc(b, a->qp_num, IBV_ACCESS_REMOTE_WRITE))
    return std::fprintf(stderr, "odp bw: QPs\n"), 1;
  constexpr size_t kLen = 1 << 20;
  static uint8_t src_buf[kLen], plain_buf[kLen], odp_buf[kLen];
  std::memset(src_buf, 3, kLen);
  constexpr int kAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
  ibv_mr* src = ibv_reg_mr(pd, src_buf, kLen, kAccess);
  ibv_mr* plain = ibv_reg_mr(pd, plain_buf, kLen, kAccess);
  ibv_mr* odp = ibv_reg_mr(pd, odp_buf, kLen, kAccess | IBV_ACCESS_ON_DEMAND);
  if (!src || !plain || !odp) return std::fprintf(stderr, "odp bw: reg_mr\n"), 1;
  for (uint32_t msg : {64u * 1024, 1u << 20}) {
    const uint64_t ops = msg < kLen ? 20000 : 2000;
    write_gbps(a, cq, src, odp, ops / 10, msg);  // warm-up
    const double odp_gbps = write_gbps(a, cq, src, odp, ops, msg);
    write_gbps(a, cq, src, plain, ops / 10, msg);
    const double plain_gbps = write_gbps(a, cq, src, plain, ops, msg);
    JsonLine().str("bench", "odp_write_bw").num("size", msg).real("odp_gbps", odp_gbps).real("regular_gbps", plain_gbps).emit();
  }
  ibv_dereg_mr(odp);
  ibv_dereg_mr(plain);
  ibv_dereg_mr(src);
  ibv_destroy_qp(a);
  ibv_destroy_qp(b);
  ibv_destroy_cq(cq);
  return 0;
}

// ---- ODP WRITE bandwidth by path ----------------------------------------

constexpr size_t kBwLen = 4u << 20;

// kBwLen bytes of anonymous memory, 2 MiB-aligned, with transparent huge
// pages asked for (MADV_HUGEPAGE) or refused, every page touched.
uint8_t* bw_region(bool thp) {
  constexpr size_t kAlign = 2u << 20;
  void* p = mmap(nullptr, kBwLen + kAlign, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  auto* a = reinterpret_cast<uint8_t*>((uintptr_t(p) + kAlign - 1) & ~uintptr_t(kAlign - 1));
  madvise(a, kBwLen, thp ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
  std::memset(a, 1, kBwLen);
  return a;
}

// AnonHugePages of this process in KiB (/proc/self/smaps_rollup).
uint64_t anon_huge_kib() {
  FILE* f = std::fopen("/proc/self/smaps_rollup", "r");
  char line[256];
  uint64_t kib = 0;
  while (f && std::fgets(line, sizeof line, f))
    if (std::sscanf(line, "AnonHugePages: %lu kB", &kib) == 1) break;
  if (f) std::fclose(f);
  return kib;
}

// The MRs written into: an ODP MR over a bw_region, a regular MR beside it.
struct BwTarget {
  uint32_t qpn = 0, odp_rkey = 0, plain_rkey = 0;
  uint64_t odp_addr = 0, plain_addr = 0, huge_kib = 0;
};

struct BwSide {
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  ibv_cq* cq = nullptr;
  ibv_qp* qp = nullptr;
  ibv_mr* mr = nullptr;  // the client's source, or the owner's regular MR
  ibv_mr* odp = nullptr;
  bool open(bool owner, bool thp) {
    ctx = open_dev();
    pd = ctx ? ibv_alloc_pd(ctx) : nullptr;
    cq = pd ? ibv_create_cq(ctx, 256, nullptr, nullptr, 0) : nullptr;
    if (!cq) return false;
    ibv_qp_init_attr ia{};
    ia.send_cq = ia.recv_cq = cq;
    ia.qp_type = IBV_QPT_RC;
    ia.cap = {64, 64, 1, 1, 0};
    qp = ibv_create_qp(pd, &ia);
    constexpr int kAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
    void* plain = nullptr;
    if (!qp || posix_memalign(&plain, 4096, kBwLen)) return false;
    std::memset(plain, 3, kBwLen);
    mr = ibv_reg_mr(pd, plain, kBwLen, kAccess);
    if (!owner) return mr != nullptr;
    uint8_t* r = bw_region(thp);
    odp = r ? ibv_reg_mr(pd, r, kBwLen, kAccess | IBV_ACCESS_ON_DEMAND) : nullptr;
    return mr && odp;
  }
  BwTarget target() const {
    return {qp->qp_num, odp->rkey, mr->rkey, uint64_t(uintptr_t(odp->addr)), uint64_t(uintptr_t(mr->addr)),
            anon_huge_kib()};
  }
};

// WRITE bandwidth from `c` into the target's two MRs, one JSON line a size.
int bw_rounds(BwSide& c, const BwTarget& t, const char* path, bool thp) {
  for (uint32_t msg : {64u * 1024, 1u << 20}) {
    const uint64_t ops = msg < (1u << 20) ? 20000 : 2000;
    ibv_mr odp{}, plain{};
    odp.addr = reinterpret_cast<void*>(t.odp_addr);
    odp.rkey = t.odp_rkey;
    plain.addr = reinterpret_cast<void*>(t.plain_addr);
    plain.rkey = t.plain_rkey;
    write_gbps(c.qp, c.cq, c.mr, &odp, ops / 10, msg);  // warm-up
    const double o = write_gbps(c.qp, c.cq, c.mr, &odp, ops, msg);
    write_gbps(c.qp, c.cq, c.mr, &plain, ops / 10, msg);
    const double r = write_gbps(c.qp, c.cq, c.mr, &plain, ops, msg);
    if (o < 0 || r < 0) return 1;
    JsonLine()
        .str("bench", "odp_write_bw")
        .str("path", path)
        .str("thp", thp ? "madvise" : "no")
        .num("owner_anon_huge_kib", t.huge_kib)
        .num("size", msg)
        .real("odp_gbps", o)
        .real("regular_gbps", r)
        .real("ratio", o / r)
        .emit();
  }
  return 0;
}

int odp_bw_path(const char* path, bool thp) {
  const bool self = std::strcmp(path, "self") == 0, user = std::strcmp(path, "user") == 0;
  if (!self && !user && std::strcmp(path, "peer") != 0) return std::fprintf(stderr, "odp-bw: self|peer|user\n"), 2;
  if (self) {
    BwSide a, b;
    if (!a.open(false, thp) || !b.open(true, thp)) return std::fprintf(stderr, "odp-bw: setup\n"), 1;
    if (!connect_rc(a.qp, b.qp->qp_num, IBV_ACCESS_REMOTE_WRITE) || !connect_rc(b.qp, a.qp->qp_num, IBV_ACCESS_REMOTE_WRITE))
      return std::fprintf(stderr, "odp-bw: connect\n"), 1;
    return bw_rounds(a, b.target(), path, thp);
  }
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv)) return 1;
  const pid_t pid = fork();
  if (pid == 0) {  // the owner
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (user && (setgroups(0, nullptr) || setresgid(65534, 65534, 65534) || setresuid(65534, 65534, 65534)))
      _exit(3);
    BwSide o;
    if (!o.open(true, thp)) _exit(4);
    BwTarget t = o.target();
    uint32_t peer = 0;
    char c = 0;
    if (write(sv[1], &t, sizeof t) != sizeof t || read(sv[1], &peer, 4) != 4) _exit(5);
    if (!connect_rc(o.qp, peer, IBV_ACCESS_REMOTE_WRITE) || write(sv[1], &c, 1) != 1) _exit(6);
    if (read(sv[1], &c, 1) != 1) _exit(7);  // until the client is done
    _exit(0);
  }
  BwSide c;
  BwTarget t;
  if (!c.open(false, thp) || read(sv[0], &t, sizeof t) != sizeof t) return std::fprintf(stderr, "odp-bw: owner\n"), 1;
  char x = 0;
  if (write(sv[0], &c.qp->qp_num, 4) != 4 || read(sv[0], &x, 1) != 1 || !connect_rc(c.qp, t.qpn, IBV_ACCESS_REMOTE_WRITE))
    return std::fprintf(stderr, "odp-bw: connect\n"), 1;
  const int rc = bw_rounds(c, t, path, thp);
  if (write(sv[0], &x, 1) != 1) return 1;
  int st = 0;
  waitpid(pid, &st, 0);
  return rc;
}

int odp_bench() {
  ibv_context* ctx = open_dev();
  if (!ctx) return std::fprintf(stderr, "odp: no device\n"), 1;
  ibv_pd* pd = ibv_alloc_pd(ctx);
  const int rc = odp_reg_bench(pd) || odp_bw_bench(pd);
  ibv_dealloc_pd(pd);
  ibv_close_device(ctx);
  return rc;
}

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "scale") == 0) {
    uint32_t nqp = argc > 2 ? uint32_t(std::atoi(argv[2])) : 10000;
    uint32_t nmr = argc > 3 ? uint32_t(std::atoi(argv[3])) : 100000;
    return scale_bench(nqp, nmr);
  }
  if (argc > 1 && std::strcmp(argv[1], "odp") == 0) return odp_bench();
  if (argc > 2 && std::strcmp(argv[1], "odp-bw") == 0)
    return odp_bw_path(argv[2], argc > 3 && std::strcmp(argv[3], "thp") == 0);
  bool reg = true, atomic = true;
  if (argc > 1) {
    reg = std::strcmp(argv[1], "reg") == 0 || std::strcmp(argv[1], "all") == 0;
    atomic = std::strcmp(argv[1], "atomic") == 0 || std::strcmp(argv[1], "all") == 0;
  }
  if (reg && reg_bench()) return 1;
  if (atomic && atomic_bench()) return 1;
  return 0;
}
