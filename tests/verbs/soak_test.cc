// Soak (issue "Robustness", item 6): kProcs real processes and kConns
// connections (RC, UC and UD) run every opcode -- SEND, SEND_WITH_IMM,
// RDMA_WRITE, RDMA_WRITE_WITH_IMM, RDMA_READ, CMP_AND_SWP, FETCH_AND_ADD,
// inline, signaled and unsignaled -- at random sizes up to 1 MiB with random
// SGE lists, for SOFTVERBS_SOAK_SECONDS (default 20) seconds. The seed is
// printed and can be replayed with SOFTVERBS_SOAK_SEED (the interleaving of
// processes is not replayed, only their choices).
//
// What is checked, and could fail:
// * every received message byte for byte against a known pattern, in order,
//   and every receive completion once (wr_ids are consecutive);
// * every signaled send completion once, in order, with the right opcode;
//   an unsignaled request never completes on its own;
// * every message sent is received (UC and UD send only against receive
//   credits published by the receiver, so nothing may be dropped);
// * RDMA READ returns what the reader's earlier WRITEs put there;
// * each target's write regions end up equal to the writers' shadow copies;
// * atomics: each process's FETCH_AND_ADD word equals the sum of every add
//   aimed at it, its CMP_AND_SWP word the number of successful swaps.
//
// Processes meet on a shared anonymous mapping (Board) created before fork.
#include <gtest/gtest.h>
#include <infiniband/verbs.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <random>
#include <thread>
#include <vector>

namespace svtest {
namespace {

constexpr int kProcs = 4;
constexpr uint64_t kMaxMsg = 1 << 20;              // RC and UC messages: 0 .. 1 MiB
constexpr uint64_t kUdMax = 4096;                  // UD: the path MTU
constexpr uint64_t kPatLen = kMaxMsg + (64 << 10);  // the source pattern G
constexpr uint64_t kSlot = kMaxMsg + 64 + 4 * 4096;  // one receive: 1 MiB + GRH + gaps
constexpr uint64_t kRegion = kMaxMsg;              // write/read target per direction
constexpr uint32_t kRecvDepth = 4;
constexpr uint32_t kSendDepth = 32;
constexpr uint32_t kMaxSge = 4;
constexpr uint32_t kInline = 256;

struct ConnSpec {
  ibv_qp_type type;
  int a, b;
};
// 8 RC connections (every pair, two pairs twice), 2 UC and 2 UD pairs.
constexpr ConnSpec kConnSpecs[] = {
    {IBV_QPT_RC, 0, 1}, {IBV_QPT_RC, 0, 2}, {IBV_QPT_RC, 0, 3}, {IBV_QPT_RC, 1, 2},
    {IBV_QPT_RC, 1, 3}, {IBV_QPT_RC, 2, 3}, {IBV_QPT_RC, 0, 1}, {IBV_QPT_RC, 2, 3},
    {IBV_QPT_UC, 0, 2}, {IBV_QPT_UC, 1, 3}, {IBV_QPT_UD, 0, 3}, {IBV_QPT_UD, 1, 2},
};
constexpr int kConns = sizeof(kConnSpecs) / sizeof(kConnSpecs[0]);

// One end of a connection, as its peer needs to know it.
struct EndInfo {
  uint32_t qpn;
  uint32_t region_rkey;
  uint64_t region_addr;
};

struct ConnBoard {
  EndInfo end[2];
  std::atomic<uint64_t> recv_posted[2];  // receives end i has posted so far (credits)
  std::atomic<uint64_t> sent[2];         // messages end i sent that consume a receive
  std::atomic<uint64_t> received[2];     // receive completions end i got
  std::atomic<uint64_t> shadow_sum[2];   // hash of what end i wrote into the other end's region
};

struct Board {
  std::atomic<int> barrier[8];
  std::atomic<int> abort;
  std::atomic<int> msg_len;
  uint64_t atom_addr[kProcs];
  uint32_t atom_rkey[kProcs];
  std::atomic<uint64_t> faa_added[kProcs];  // sum of adds aimed at process p
  std::atomic<uint64_t> cas_ok[kProcs];     // successful swaps on process p's word
  std::atomic<uint64_t> ops[16];            // per opcode, for the report
  std::atomic<uint64_t> bytes;
  ConnBoard conn[kConns];
  char msg[8192];
};

Board* board;

void report(const char* fmt, ...) {
  char line[512];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(line, sizeof(line), fmt, ap);
  va_end(ap);
  if (n <= 0) return;
  n = std::min<int>(n, int(sizeof(line)) - 2);
  line[n++] = '\n';
  int at = board->msg_len.fetch_add(n);
  if (at + n < int(sizeof(board->msg))) std::memcpy(board->msg + at, line, size_t(n));
}

// The source pattern: every message is a run G(o) .. G(o + len - 1).
inline uint8_t G(uint64_t j) { return uint8_t((uint32_t(j) * 2654435761u) >> 24) ^ uint8_t(j >> 16); }

uint64_t mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  return x ^ (x >> 33);
}
// Where message k of connection c, direction d starts in G, and its immediate.
uint64_t msg_offset(int c, int d, uint64_t k, uint64_t len) {
  return mix((uint64_t(c) << 40) ^ (uint64_t(d) << 39) ^ k) % (kPatLen - len + 1);
}
uint32_t msg_imm(int c, int d, uint64_t k) { return uint32_t(mix(k * 31 + uint64_t(c * 2 + d) + 7)); }

struct Hash {
  uint64_t h = 1469598103934665603ull;
  void add(const uint8_t* p, uint64_t n) {
    for (uint64_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  }
};

enum Kind : int { kSend, kSendImm, kWrite, kWriteImm, kRead, kCas, kFaa, kKinds };
const char* kKindName[] = {"SEND", "SEND_IMM", "WRITE", "WRITE_IMM", "READ", "CAS", "FAA"};

struct Posted {
  uint64_t wr_id;
  bool signaled;
  Kind kind;
  uint64_t len;
  uint64_t expect;  // READ: hash of the expected bytes; CAS: the compare value
  int target;       // atomics: the target process
};

double now_s() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return double(t.tv_sec) + double(t.tv_nsec) * 1e-9;
}

class Worker {
 public:
  Worker(int id, uint64_t seed, double seconds) : id_(id), rng_(seed * 1000003 + uint64_t(id)), seconds_(seconds) {}
  int run();

 private:
  struct End {
    int conn, dir;  // dir: 0 = I am conn's a, 1 = b
    ibv_qp_type type;
    ibv_qp* qp = nullptr;
    ibv_ah* ah = nullptr;
    uint8_t* slots = nullptr;  // kRecvDepth receive slots
    ibv_mr* slots_mr = nullptr;
    uint8_t* region = nullptr;  // the peer writes and reads here
    ibv_mr* region_mr = nullptr;
    std::vector<uint8_t> shadow;  // what I wrote into the peer's region
    std::vector<std::vector<ibv_sge>> recv_sges;
    uint64_t recv_posted = 0, recv_done = 0;
    uint64_t seq = 0, consumed_sent = 0;
    std::deque<Posted> sq;
    bool read_busy = false, atomic_busy = false;
    uint64_t* atomic_result = nullptr;  // in rdbuf_mr
    uint8_t* rdbuf = nullptr;           // READ destination, 1 MiB
    uint64_t cas_cache = 0;
  };

  bool fail(const char* fmt, ...);
  bool setup();
  bool connect(End& e);
  bool post_recv(End& e);
  bool replenish();
  bool post_one(End& e);
  bool poll_send();
  bool poll_recv();
  bool service();
  bool barrier(int n);
  uint64_t rnd(uint64_t n) { return n ? rng_() % n : 0; }
  uint64_t rnd_size(uint64_t max);
  int split(uint64_t len, uint32_t max_pieces, uint64_t* pieces);

  int id_;
  std::mt19937_64 rng_;
  double seconds_;
  bool failed_ = false;
  ibv_context* ctx_ = nullptr;
  ibv_pd* pd_ = nullptr;
  ibv_cq* scq_ = nullptr;
  ibv_cq* rcq_ = nullptr;
  uint8_t* src_ = nullptr;  // 4 copies of G, two MRs
  ibv_mr* src_mr_[2] = {};
  uint64_t* atom_ = nullptr;  // [0]: FETCH_AND_ADD word, [1]: CMP_AND_SWP word
  ibv_mr* atom_mr_ = nullptr;
  ibv_mr* rd_mr_ = nullptr;
  uint8_t* rd_ = nullptr;
  std::vector<End> ends_;
  uint8_t scratch_[kInline];
};

bool Worker::fail(const char* fmt, ...) {
  char line[400];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof(line), fmt, ap);
  va_end(ap);
  report("proc %d: %s", id_, line);
  failed_ = true;
  board->abort.store(1);
  return false;
}

uint64_t Worker::rnd_size(uint64_t max) {
  uint64_t r = rnd(100), lim;
  if (r < 35) lim = 64;
  else if (r < 65) lim = 4096;
  else if (r < 88) lim = 64 << 10;
  else lim = kMaxMsg;
  return rnd(std::min(lim, max) + 1);
}

// Random split of len into 1..max_pieces pieces (zero-length pieces allowed).
int split(std::mt19937_64& g, uint64_t len, uint32_t max_pieces, uint64_t* pieces) {
  int n = 1 + int(g() % max_pieces);
  uint64_t left = len;
  for (int i = 0; i < n - 1; ++i) {
    pieces[i] = left ? g() % (left + 1) : 0;
    left -= pieces[i];
  }
  pieces[n - 1] = left;
  return n;
}
int Worker::split(uint64_t len, uint32_t max_pieces, uint64_t* pieces) {
  return svtest::split(rng_, len, max_pieces, pieces);
}

bool Worker::setup() {
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (!list || n < 1) return fail("no device");
  ctx_ = ibv_open_device(list[0]);
  ibv_free_device_list(list);
  if (!ctx_) return fail("open_device: %d", errno);
  pd_ = ibv_alloc_pd(ctx_);
  scq_ = ibv_create_cq(ctx_, 1024, nullptr, nullptr, 0);
  rcq_ = ibv_create_cq(ctx_, 1024, nullptr, nullptr, 0);
  if (!pd_ || !scq_ || !rcq_) return fail("pd/cq: %d", errno);
  const int lw = IBV_ACCESS_LOCAL_WRITE;
  const int all = lw | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
  // Four copies of G; pieces of one message come from different copies and
  // from two MRs, so an SGE list is neither contiguous nor of one key.
  if (posix_memalign(reinterpret_cast<void**>(&src_), 4096, 4 * kPatLen)) return fail("alloc");
  for (uint64_t j = 0; j < kPatLen; ++j) src_[j] = G(j);
  for (int c = 1; c < 4; ++c) std::memcpy(src_ + c * kPatLen, src_, kPatLen);
  src_mr_[0] = ibv_reg_mr(pd_, src_, 2 * kPatLen, 0);  // read-only source is enough
  src_mr_[1] = ibv_reg_mr(pd_, src_ + 2 * kPatLen, 2 * kPatLen, lw);
  if (posix_memalign(reinterpret_cast<void**>(&atom_), 4096, 4096)) return fail("alloc");
  std::memset(atom_, 0, 4096);
  atom_mr_ = ibv_reg_mr(pd_, atom_, 4096, all | IBV_ACCESS_REMOTE_ATOMIC);
  if (!src_mr_[0] || !src_mr_[1] || !atom_mr_) return fail("reg_mr: %d", errno);
  board->atom_addr[id_] = reinterpret_cast<uint64_t>(atom_);
  board->atom_rkey[id_] = atom_mr_->rkey;

  for (int c = 0; c < kConns; ++c) {
    const ConnSpec& s = kConnSpecs[c];
    if (s.a != id_ && s.b != id_) continue;
    End e;
    e.conn = c;
    e.dir = s.a == id_ ? 0 : 1;
    e.type = s.type;
    ends_.push_back(std::move(e));
  }
  size_t rd_len = ends_.size() * (kRegion + 4096);
  if (posix_memalign(reinterpret_cast<void**>(&rd_), 4096, rd_len)) return fail("alloc");
  std::memset(rd_, 0, rd_len);
  rd_mr_ = ibv_reg_mr(pd_, rd_, rd_len, lw);
  if (!rd_mr_) return fail("reg_mr: %d", errno);
  for (size_t i = 0; i < ends_.size(); ++i) {
    End& e = ends_[i];
    e.rdbuf = rd_ + i * (kRegion + 4096);
    e.atomic_result = reinterpret_cast<uint64_t*>(e.rdbuf + kRegion);
    uint64_t slot = e.type == IBV_QPT_UD ? kUdMax + 64 + 4 * 256 : kSlot;
    if (posix_memalign(reinterpret_cast<void**>(&e.slots), 4096, kRecvDepth * slot)) return fail("alloc");
    std::memset(e.slots, 0, kRecvDepth * slot);
    e.slots_mr = ibv_reg_mr(pd_, e.slots, kRecvDepth * slot, lw);
    if (!e.slots_mr) return fail("reg_mr: %d", errno);
    // Each slot is split once into a random SGE list with gaps.
    for (uint32_t k = 0; k < kRecvDepth; ++k) {
      uint64_t pieces[kMaxSge];
      uint64_t cap = e.type == IBV_QPT_UD ? kUdMax + 40 : kMaxMsg;
      int n = split(cap, kMaxSge, pieces);
      std::vector<ibv_sge> sg;
      uint64_t at = k * slot;
      uint64_t gap_max = e.type == IBV_QPT_UD ? 256 : 4096;
      for (int p = 0; p < n; ++p) {
        at += rnd(gap_max);
        sg.push_back({reinterpret_cast<uint64_t>(e.slots + at), uint32_t(pieces[p]), e.slots_mr->lkey});
        at += pieces[p];
      }
      e.recv_sges.push_back(sg);
    }
    if (e.type != IBV_QPT_UD) {
      if (posix_memalign(reinterpret_cast<void**>(&e.region), 4096, kRegion)) return fail("alloc");
      std::memset(e.region, 0, kRegion);
      e.region_mr = ibv_reg_mr(pd_, e.region, kRegion, all);
      if (!e.region_mr) return fail("reg_mr: %d", errno);
      e.shadow.assign(kRegion, 0);
    }
    ibv_qp_init_attr ia{};
    ia.send_cq = scq_;
    ia.recv_cq = rcq_;
    ia.qp_type = e.type;
    ia.cap.max_send_wr = kSendDepth;
    ia.cap.max_recv_wr = kRecvDepth;
    ia.cap.max_send_sge = kMaxSge;
    ia.cap.max_recv_sge = kMaxSge;
    ia.cap.max_inline_data = kInline;
    ia.sq_sig_all = 0;
    e.qp = ibv_create_qp(pd_, &ia);
    if (!e.qp) return fail("create_qp: %d", errno);
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.port_num = 1;
    int mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT;
    if (e.type == IBV_QPT_UD) {
      a.qkey = 0x11110000u + uint32_t(e.conn);
      mask |= IBV_QP_QKEY;
    } else {
      a.qp_access_flags = e.type == IBV_QPT_RC
                              ? IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC
                              : IBV_ACCESS_REMOTE_WRITE;
      mask |= IBV_QP_ACCESS_FLAGS;
    }
    if (int r = ibv_modify_qp(e.qp, &a, mask)) return fail("INIT: %d", r);
    ConnBoard& cb = board->conn[e.conn];
    cb.end[e.dir] = {e.qp->qp_num, e.region_mr ? e.region_mr->rkey : 0, reinterpret_cast<uint64_t>(e.region)};
    for (uint32_t k = 0; k < kRecvDepth; ++k)
      if (!post_recv(e)) return false;
  }
  return true;
}

bool Worker::connect(End& e) {
  const EndInfo& peer = board->conn[e.conn].end[1 - e.dir];
  ibv_ah_attr ah{};
  ah.is_global = 1;
  ah.grh.sgid_index = 0;
  ah.grh.hop_limit = 1;
  ibv_query_gid(ctx_, 1, 0, &ah.grh.dgid);
  ah.port_num = 1;
  if (e.type == IBV_QPT_UD) {
    ibv_qp_attr u{};
    u.qp_state = IBV_QPS_RTR;
    if (int r = ibv_modify_qp(e.qp, &u, IBV_QP_STATE)) return fail("UD RTR: %d", r);
    u.qp_state = IBV_QPS_RTS;
    if (int r = ibv_modify_qp(e.qp, &u, IBV_QP_STATE | IBV_QP_SQ_PSN)) return fail("UD RTS: %d", r);
    e.ah = ibv_create_ah(pd_, &ah);
    if (!e.ah) return fail("create_ah: %d", errno);
    return true;
  }
  bool uc = e.type == IBV_QPT_UC;
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = IBV_MTU_4096;
  a.dest_qp_num = peer.qpn;
  a.max_dest_rd_atomic = 4;
  a.min_rnr_timer = 1;
  a.ah_attr = ah;
  int mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
  if (!uc) mask |= IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
  if (int r = ibv_modify_qp(e.qp, &a, mask)) return fail("RTR: %d", r);
  ibv_qp_attr r{};
  r.qp_state = IBV_QPS_RTS;
  r.timeout = 14;
  r.retry_cnt = 7;
  r.rnr_retry = 7;  // infinite: a busy receiver must never fail the soak
  r.max_rd_atomic = 4;
  mask = IBV_QP_STATE | IBV_QP_SQ_PSN;
  if (!uc) mask |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
  if (int rc = ibv_modify_qp(e.qp, &r, mask)) return fail("RTS: %d", rc);
  return true;
}

bool Worker::post_recv(End& e) {
  uint32_t slot = uint32_t(e.recv_posted % kRecvDepth);
  auto& sg = e.recv_sges[slot];
  ibv_recv_wr wr{};
  wr.wr_id = (uint64_t(e.conn) << 48) | e.recv_posted;
  wr.sg_list = sg.data();
  wr.num_sge = int(sg.size());
  ibv_recv_wr* bad = nullptr;
  if (int r = ibv_post_recv(e.qp, &wr, &bad)) return fail("post_recv conn %d: %d", e.conn, r);
  e.recv_posted++;
  board->conn[e.conn].recv_posted[e.dir].store(e.recv_posted, std::memory_order_release);
  return true;
}

bool Worker::replenish() {
  for (End& e : ends_)
    while (e.recv_posted - e.recv_done < kRecvDepth)
      if (!post_recv(e)) return false;
  return true;
}

bool Worker::post_one(End& e) {
  if (e.sq.size() >= kSendDepth - 1) return true;
  ConnBoard& cb = board->conn[e.conn];
  const EndInfo& peer = cb.end[1 - e.dir];
  // What this transport allows (IBTA 9.8: UC has no READ nor atomics; UD only sends).
  Kind kind;
  uint64_t r = rnd(100);
  if (e.type == IBV_QPT_UD) kind = r < 50 ? kSend : kSendImm;
  else if (e.type == IBV_QPT_UC) kind = Kind(r % 4);
  else kind = r < 20 ? kSend : r < 35 ? kSendImm : r < 55 ? kWrite : r < 70 ? kWriteImm : r < 82 ? kRead : r < 91 ? kCas : kFaa;
  bool consumes = kind == kSend || kind == kSendImm || kind == kWriteImm;
  if (consumes && e.type != IBV_QPT_RC &&
      e.consumed_sent >= cb.recv_posted[1 - e.dir].load(std::memory_order_acquire))
    return true;  // UC/UD: no receive posted at the peer, the message would be dropped
  if (kind == kRead && e.read_busy) return true;
  if ((kind == kCas || kind == kFaa) && e.atomic_busy) return true;

  uint64_t len = kind == kCas || kind == kFaa ? 8 : rnd_size(e.type == IBV_QPT_UD ? kUdMax : kMaxMsg);
  // Force a signaled request before too many unsignaled ones pile up at the tail.
  int tail = 0;
  for (auto it = e.sq.rbegin(); it != e.sq.rend() && !it->signaled; ++it) tail++;
  bool signaled = kind == kRead || kind == kCas || kind == kFaa || tail >= 8 || rnd(100) < 60;
  bool inl = (kind == kSend || kind == kSendImm || kind == kWrite || kind == kWriteImm) && len <= kInline && rnd(2);

  ibv_sge sge[kMaxSge];
  ibv_send_wr wr{};
  wr.wr_id = (uint64_t(id_) << 56) | (uint64_t(e.conn) << 48) | e.seq;
  wr.sg_list = sge;
  wr.send_flags = (signaled ? IBV_SEND_SIGNALED : 0) | (inl ? IBV_SEND_INLINE : 0);
  Posted p{wr.wr_id, signaled, kind, len, 0, -1};
  uint64_t k = e.consumed_sent;
  uint64_t o = consumes ? msg_offset(e.conn, e.dir, k, len) : rnd(kPatLen - len + 1);
  uint64_t roff = 0;
  if (kind == kWrite || kind == kWriteImm || kind == kRead) roff = rnd(kRegion - len + 1);

  if (kind == kRead) {
    uint64_t pieces[kMaxSge];
    int n = split(len, kMaxSge, pieces);
    uint64_t at = 0;
    for (int i = 0; i < n; ++i) {
      sge[i] = {reinterpret_cast<uint64_t>(e.rdbuf + at), uint32_t(pieces[i]), rd_mr_->lkey};
      at += pieces[i];
    }
    wr.num_sge = n;
    wr.opcode = IBV_WR_RDMA_READ;
    wr.wr.rdma.remote_addr = peer.region_addr + roff;
    wr.wr.rdma.rkey = peer.region_rkey;
    Hash h;
    h.add(e.shadow.data() + roff, len);
    p.expect = h.h;
    e.read_busy = true;
  } else if (kind == kCas || kind == kFaa) {
    int target = kConnSpecs[e.conn].a == id_ ? kConnSpecs[e.conn].b : kConnSpecs[e.conn].a;
    sge[0] = {reinterpret_cast<uint64_t>(e.atomic_result), 8, rd_mr_->lkey};
    wr.num_sge = 1;
    wr.wr.atomic.rkey = board->atom_rkey[target];
    p.target = target;
    if (kind == kFaa) {
      wr.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
      wr.wr.atomic.remote_addr = board->atom_addr[target];
      wr.wr.atomic.compare_add = 1 + rnd(1000);
      board->faa_added[target].fetch_add(wr.wr.atomic.compare_add);
    } else {
      wr.opcode = IBV_WR_ATOMIC_CMP_AND_SWP;
      wr.wr.atomic.remote_addr = board->atom_addr[target] + 8;
      wr.wr.atomic.compare_add = e.cas_cache;
      wr.wr.atomic.swap = e.cas_cache + 1;
      p.expect = e.cas_cache;
    }
    e.atomic_busy = true;
  } else if (inl) {
    // Inline: the payload is copied at post time, so the buffer is scribbled
    // over right after; a library that read it later would deliver garbage.
    std::memcpy(scratch_, src_ + o, len);
    sge[0] = {reinterpret_cast<uint64_t>(scratch_), uint32_t(len), 0xdeadbeef};  // lkey ignored for inline
    wr.num_sge = len ? 1 : 0;
  } else {
    uint64_t pieces[kMaxSge];
    int n = split(len, kMaxSge, pieces);
    uint64_t at = o;
    for (int i = 0; i < n; ++i) {
      int copy = int(rnd(4));
      sge[i] = {reinterpret_cast<uint64_t>(src_ + copy * kPatLen + at), uint32_t(pieces[i]), src_mr_[copy / 2]->lkey};
      at += pieces[i];
    }
    wr.num_sge = n;
  }
  if (kind == kSend || kind == kSendImm) {
    wr.opcode = kind == kSend ? IBV_WR_SEND : IBV_WR_SEND_WITH_IMM;
    if (e.type == IBV_QPT_UD) {
      wr.wr.ud.ah = e.ah;
      wr.wr.ud.remote_qpn = peer.qpn;
      wr.wr.ud.remote_qkey = 0x11110000u + uint32_t(e.conn);
    }
  } else if (kind == kWrite || kind == kWriteImm) {
    wr.opcode = kind == kWrite ? IBV_WR_RDMA_WRITE : IBV_WR_RDMA_WRITE_WITH_IMM;
    wr.wr.rdma.remote_addr = peer.region_addr + roff;
    wr.wr.rdma.rkey = peer.region_rkey;
    std::memcpy(e.shadow.data() + roff, src_ + o, len);
  }
  if (kind == kSendImm || kind == kWriteImm) wr.imm_data = msg_imm(e.conn, e.dir, k);
  ibv_send_wr* bad = nullptr;
  if (int rc = ibv_post_send(e.qp, &wr, &bad))
    return fail("post_send conn %d %s len %llu: %d", e.conn, kKindName[kind], (unsigned long long)len, rc);
  if (inl) std::memset(scratch_, 0xA5, sizeof(scratch_));
  e.seq++;
  if (consumes) {
    e.consumed_sent++;
    cb.sent[e.dir].store(e.consumed_sent, std::memory_order_release);
  }
  e.sq.push_back(p);
  board->ops[kind].fetch_add(1, std::memory_order_relaxed);
  board->bytes.fetch_add(len, std::memory_order_relaxed);
  return true;
}


bool Worker::poll_send() {
  ibv_wc wc[16];
  int n = ibv_poll_cq(scq_, 16, wc);
  if (n < 0) return fail("poll send cq: %d", n);
  for (int i = 0; i < n; ++i) {
    End* e = nullptr;
    for (End& x : ends_)
      if (x.qp->qp_num == wc[i].qp_num) e = &x;
    if (!e) return fail("send completion for unknown qp %u", wc[i].qp_num);
    if (wc[i].status != IBV_WC_SUCCESS)
      return fail("conn %d wr_id %llx: status %s", e->conn, (unsigned long long)wc[i].wr_id,
                  ibv_wc_status_str(wc[i].status));
    // Completions come in order (IBTA 10.8.3.2); requests before a signaled
    // one that are not signaled retire silently; anything else is a lost or
    // duplicated completion.
    for (;;) {
      if (e->sq.empty())
        return fail("conn %d: completion %llx matches no outstanding request (duplicate?)", e->conn,
                    (unsigned long long)wc[i].wr_id);
      Posted p = e->sq.front();
      e->sq.pop_front();
      if (p.wr_id != wc[i].wr_id) {
        if (p.signaled)
          return fail("conn %d: signaled %llx lost (got %llx)", e->conn, (unsigned long long)p.wr_id,
                      (unsigned long long)wc[i].wr_id);
        continue;
      }
      if (!p.signaled) return fail("conn %d: unsignaled %llx completed", e->conn, (unsigned long long)p.wr_id);
      static const ibv_wc_opcode want[] = {IBV_WC_SEND, IBV_WC_SEND, IBV_WC_RDMA_WRITE, IBV_WC_RDMA_WRITE,
                                           IBV_WC_RDMA_READ, IBV_WC_COMP_SWAP, IBV_WC_FETCH_ADD};
      if (wc[i].opcode != want[p.kind])
        return fail("conn %d %s: wc opcode %d", e->conn, kKindName[p.kind], wc[i].opcode);
      if (p.kind == kRead) {
        if (wc[i].byte_len != p.len) return fail("READ byte_len %u want %llu", wc[i].byte_len, (unsigned long long)p.len);
        Hash h;
        h.add(e->rdbuf, p.len);  // the pieces were consecutive in rdbuf
        if (h.h != p.expect) return fail("conn %d: READ of %llu bytes differs from what was written", e->conn, (unsigned long long)p.len);
        e->read_busy = false;
      } else if (p.kind == kCas) {
        uint64_t got = *e->atomic_result;
        if (got == p.expect) {
          board->cas_ok[p.target].fetch_add(1);
          e->cas_cache = p.expect + 1;
        } else {
          if (got < p.expect) return fail("CAS word went backwards: %llu < %llu", (unsigned long long)got, (unsigned long long)p.expect);
          e->cas_cache = got;
        }
        e->atomic_busy = false;
      } else if (p.kind == kFaa) {
        e->atomic_busy = false;
      }
      break;
    }
  }
  return true;
}

bool Worker::poll_recv() {
  ibv_wc wc[16];
  int n = ibv_poll_cq(rcq_, 16, wc);
  if (n < 0) return fail("poll recv cq: %d", n);
  for (int i = 0; i < n; ++i) {
    End* e = nullptr;
    for (End& x : ends_)
      if (x.qp->qp_num == wc[i].qp_num) e = &x;
    if (!e) return fail("recv completion for unknown qp %u", wc[i].qp_num);
    if (wc[i].status != IBV_WC_SUCCESS)
      return fail("conn %d recv %llx: status %s", e->conn, (unsigned long long)wc[i].wr_id, ibv_wc_status_str(wc[i].status));
    uint64_t k = e->recv_done;
    if (wc[i].wr_id != ((uint64_t(e->conn) << 48) | k))
      return fail("conn %d: receive completion %llx, expected #%llu", e->conn, (unsigned long long)wc[i].wr_id,
                  (unsigned long long)k);
    int sd = 1 - e->dir;  // the sender's direction
    bool with_imm = wc[i].wc_flags & IBV_WC_WITH_IMM;
    if (with_imm && wc[i].imm_data != msg_imm(e->conn, sd, k))
      return fail("conn %d msg %llu: imm %x", e->conn, (unsigned long long)k, wc[i].imm_data);
    if (wc[i].opcode == IBV_WC_RECV) {
      uint64_t len = wc[i].byte_len;
      uint64_t skip = 0;
      if (e->type == IBV_QPT_UD) {
        if (len < 40) return fail("UD byte_len %llu", (unsigned long long)len);
        if (wc[i].src_qp != board->conn[e->conn].end[sd].qpn) return fail("UD src_qp %u", wc[i].src_qp);
        skip = 40;
        len -= 40;
      }
      if (len > kMaxMsg) return fail("conn %d msg %llu: byte_len %llu", e->conn, (unsigned long long)k, (unsigned long long)len);
      uint64_t o = msg_offset(e->conn, sd, k, len);
      // Compare the scattered message with G(o ..).
      uint64_t pos = 0;  // logical position including the GRH
      for (const ibv_sge& s : e->recv_sges[k % kRecvDepth]) {
        uint64_t a = pos, b = pos + s.length;
        uint64_t from = std::max(a, skip), to = std::min(b, skip + len);
        if (from < to &&
            std::memcmp(reinterpret_cast<uint8_t*>(s.addr) + (from - a), src_ + o + (from - skip), to - from) != 0)
          return fail("conn %d msg %llu (%llu bytes): data differs in [%llu, %llu)", e->conn, (unsigned long long)k,
                      (unsigned long long)len, (unsigned long long)(from - skip), (unsigned long long)(to - skip));
        pos = b;
      }
    } else if (wc[i].opcode != IBV_WC_RECV_RDMA_WITH_IMM || !with_imm) {
      return fail("conn %d msg %llu: receive opcode %d", e->conn, (unsigned long long)k, wc[i].opcode);
    }
    e->recv_done++;
    board->conn[e->conn].received[e->dir].store(e->recv_done, std::memory_order_release);
  }
  return true;
}

bool Worker::service() {
  if (board->abort.load()) return false;
  return poll_recv() && replenish() && poll_send();
}

bool Worker::barrier(int n) {
  board->barrier[n].fetch_add(1);
  double deadline = now_s() + 60;
  while (board->barrier[n].load() < kProcs) {
    if (!service()) return false;
    if (now_s() > deadline) return fail("barrier %d timed out", n);
    std::this_thread::yield();
  }
  return true;
}

int Worker::run() {
  if (!setup() || !barrier(0)) return 1;
  for (End& e : ends_)
    if (!connect(e)) return 1;
  if (!barrier(1)) return 1;
  double end = now_s() + seconds_;
  while (now_s() < end) {
    for (int round = 0; round < 8; ++round) {
      End& e = ends_[rnd(ends_.size())];
      if (!post_one(e)) return 1;
    }
    if (!service()) return 1;
  }
  // Drain: every signaled request completes (unsignaled ones at a queue's
  // tail never report, by design).
  double deadline = now_s() + 60;
  for (;;) {
    bool pending = false;
    for (End& e : ends_)
      for (const Posted& p : e.sq) pending |= p.signaled;
    if (!pending) break;
    if (!service()) return 1;
    if (now_s() > deadline) return fail("send completions missing after 60 s"), 1;
  }
  for (End& e : ends_)
    if (e.type != IBV_QPT_UD) {
      Hash h;
      h.add(e.shadow.data(), kRegion);
      board->conn[e.conn].shadow_sum[e.dir].store(h.h);
    }
  if (!barrier(2)) return 1;
  // Every message sent to me arrives, exactly once.
  for (;;) {
    bool missing = false;
    for (End& e : ends_)
      missing |= e.recv_done < board->conn[e.conn].sent[1 - e.dir].load();
    if (!missing) break;
    if (!service()) return 1;
    if (now_s() > deadline) {
      for (End& e : ends_)
        if (e.recv_done != board->conn[e.conn].sent[1 - e.dir].load())
          fail("conn %d: received %llu of %llu messages", e.conn, (unsigned long long)e.recv_done,
               (unsigned long long)board->conn[e.conn].sent[1 - e.dir].load());
      return 1;
    }
  }
  if (!barrier(3)) return 1;
  for (End& e : ends_) {
    if (e.recv_done != board->conn[e.conn].sent[1 - e.dir].load())
      return fail("conn %d: received %llu messages, %llu sent", e.conn, (unsigned long long)e.recv_done,
                  (unsigned long long)board->conn[e.conn].sent[1 - e.dir].load()), 1;
    if (e.type == IBV_QPT_UD) continue;
    Hash h;
    h.add(e.region, kRegion);
    if (h.h != board->conn[e.conn].shadow_sum[1 - e.dir].load())
      return fail("conn %d: my write region differs from the writer's copy", e.conn), 1;
  }
  if (atom_[0] != board->faa_added[id_].load())
    return fail("FETCH_AND_ADD word %llu, adds sum to %llu", (unsigned long long)atom_[0],
                (unsigned long long)board->faa_added[id_].load()), 1;
  if (atom_[1] != board->cas_ok[id_].load())
    return fail("CMP_AND_SWP word %llu, %llu swaps succeeded", (unsigned long long)atom_[1],
                (unsigned long long)board->cas_ok[id_].load()), 1;
  // Nothing more may complete.
  ibv_wc wc;
  if (ibv_poll_cq(scq_, 1, &wc) != 0 || ibv_poll_cq(rcq_, 1, &wc) != 0) return fail("a stray completion"), 1;
  if (!barrier(4)) return 1;
  return 0;
}

TEST(Soak, EveryOpcodeManyProcessesNoLossNoDuplicateDataVerified) {
  double seconds = 20;
  if (const char* s = getenv("SOFTVERBS_SOAK_SECONDS")) seconds = atof(s);
  uint64_t seed = uint64_t(time(nullptr)) ^ uint64_t(getpid());
  if (const char* s = getenv("SOFTVERBS_SOAK_SEED")) seed = strtoull(s, nullptr, 0);
  printf("soak: %d processes, %d connections, %.0f s, seed %llu (SOFTVERBS_SOAK_SEED to replay)\n", kProcs, kConns,
         seconds, (unsigned long long)seed);
  fflush(stdout);
  void* m = mmap(nullptr, sizeof(Board), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(MAP_FAILED, m);
  board = new (m) Board();
  pid_t pids[kProcs];
  for (int i = 0; i < kProcs; ++i) {
    pids[i] = fork();
    if (pids[i] == 0) {
      Worker w(i, seed, seconds);
      _exit(w.run());
    }
  }
  double deadline = now_s() + seconds + 200;
  int failed = 0;
  for (int i = 0; i < kProcs; ++i) {
    int st = 0;
    while (waitpid(pids[i], &st, WNOHANG) == 0) {
      if (now_s() > deadline) {
        for (int j = 0; j < kProcs; ++j) kill(pids[j], SIGKILL);
        ADD_FAILURE() << "soak: workers hung";
      }
      usleep(20000);
    }
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) failed++;
  }
  std::string msg(board->msg, std::min<size_t>(size_t(board->msg_len.load()), sizeof(board->msg)));
  EXPECT_EQ(0, failed) << "seed " << seed << "\n" << msg;
  uint64_t total = 0;
  for (int k = 0; k < kKinds; ++k) {
    printf("  %-9s %llu\n", kKindName[k], (unsigned long long)board->ops[k].load());
    total += board->ops[k].load();
    EXPECT_GT(board->ops[k].load(), 0u) << kKindName[k] << " never ran";
  }
  printf("  %llu work requests, %.1f MiB\n", (unsigned long long)total, double(board->bytes.load()) / (1 << 20));
  munmap(m, sizeof(Board));
}

}  // namespace
}  // namespace svtest
