// libFuzzer target: work-request and SGE validation. Arbitrary lists of
// ibv_send_wr / ibv_recv_wr (any opcode, flags, num_sge, addresses, lengths,
// keys, remote addresses, immediates, atomic operands, UD fields) are posted
// to connected loopback QP pairs (RC, UC, UD) of one process, over MRs that
// each input registers afresh at random offsets, lengths and access flags.
//
// Checked (a failure traps, so libFuzzer keeps the input):
// * no crash and no sanitizer report;
// * no access outside registered memory: every MR sits in its own slot
//   between PROT_NONE guard pages, and the slot bytes outside the MR are a
//   canary that must be intact after the input;
// * every accepted work request completes at most once, and exactly once if
//   it is a receive or a signaled send (after the input the QPs are moved to
//   ERR, which flushes whatever is left), with a legal status, on its QP;
// * post_send/post_recv report the first refused request in bad_wr.
// The application contract is kept: inline data and sg_list pointers are
// readable (inline SGEs are clamped into a slot), ud.ah is NULL or ours.
//
// A type 2 memory window is bound, used and invalidated through the same
// requests (BIND_MW, SEND_WITH_INV, LOCAL_INV). Inputs may also move a QP to
// any state between requests, and post to an extended RC pair through the
// ibv_wr_* API (all-or-nothing batches).
//
// Environment: SOFTVERBS_DIR is set to a private directory; the daemon is
// started on demand from the build tree.
#include <fuzzer/FuzzedDataProvider.h>
#include <infiniband/verbs.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <vector>

namespace {

constexpr int kSlots = 4;
constexpr size_t kPage = 4096;
constexpr size_t kSlotLen = 2 * kPage;  // an MR lives in [off, off + len) of its slot
constexpr uint8_t kCanary = 0xC5;
// RC a/b, UC a/b, UD a/b, and an RC pair of extended QPs (ibv_create_qp_ex,
// posted to with ibv_wr_* as well): a and b are connected to each other.
constexpr int kQps = 8;
constexpr int kFirstEx = 6;
constexpr uint32_t kQkey = 0x1234;

[[noreturn]] void die(const char* what, unsigned long long a = 0, unsigned long long b = 0) {
  fprintf(stderr, "wr_fuzz: %s (%llu, %llu)\n", what, a, b);
  __builtin_trap();
}

struct Expect {
  int qp;
  bool recv;
  bool must;  // must complete (receive, or signaled send)
  int seen = 0;
  uint32_t opcode = 0, flags = 0;  // for the report
};

struct Harness {
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  ibv_cq* cq = nullptr;
  ibv_qp* qp[kQps] = {};
  ibv_ah* ah = nullptr;
  ibv_mw* mw = nullptr;  // a type 2 window for BIND_MW, SEND_WITH_INV and LOCAL_INV
  uint8_t* arena = nullptr;  // guard, slot, guard, slot, ..., guard
  uint8_t* slot[kSlots] = {};
  ibv_mr* mr[kSlots] = {};
  size_t mr_off[kSlots] = {}, mr_len[kSlots] = {};
  std::map<uint64_t, Expect> expect;
  uint64_t next_id = 1;

  bool init();
  bool to_rts(int i);
  bool reset_all();
  void poll_once();
};

Harness* h;
// Printed at exit with WR_FUZZ_STATS=1: how much of what was posted got through.
uint64_t n_posted, n_accepted, n_success, n_error, n_status[32];

ibv_qp_type type_of(int i) { return i < 2 || i >= kFirstEx ? IBV_QPT_RC : i < 4 ? IBV_QPT_UC : IBV_QPT_UD; }

bool Harness::to_rts(int i) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.port_num = 1;
  ibv_qp_type t = type_of(i);
  int mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT;
  if (t == IBV_QPT_UD) {
    a.qkey = kQkey;
    mask |= IBV_QP_QKEY;
  } else {
    a.qp_access_flags = t == IBV_QPT_RC ? IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC
                                        : IBV_ACCESS_REMOTE_WRITE;
    mask |= IBV_QP_ACCESS_FLAGS;
  }
  if (ibv_modify_qp(qp[i], &a, mask)) return false;
  ibv_qp_attr r{};
  r.qp_state = IBV_QPS_RTR;
  if (t == IBV_QPT_UD) {
    if (ibv_modify_qp(qp[i], &r, IBV_QP_STATE)) return false;
  } else {
    r.path_mtu = IBV_MTU_1024;
    r.dest_qp_num = qp[i ^ 1]->qp_num;
    r.max_dest_rd_atomic = 1;
    r.min_rnr_timer = 1;  // 10 us: RNR retries are quick
    r.ah_attr.is_global = 1;
    r.ah_attr.grh.hop_limit = 1;
    ibv_query_gid(ctx, 1, 0, &r.ah_attr.grh.dgid);
    r.ah_attr.port_num = 1;
    mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
    if (t == IBV_QPT_RC) mask |= IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
    if (ibv_modify_qp(qp[i], &r, mask)) return false;
  }
  ibv_qp_attr s{};
  s.qp_state = IBV_QPS_RTS;
  s.timeout = 1;
  s.retry_cnt = 1;
  s.rnr_retry = 2;
  s.max_rd_atomic = 1;
  mask = IBV_QP_STATE | IBV_QP_SQ_PSN;
  if (t == IBV_QPT_RC) mask |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
  return ibv_modify_qp(qp[i], &s, mask) == 0;
}

bool Harness::init() {
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (!list || n < 1) return false;
  ctx = ibv_open_device(list[0]);
  ibv_free_device_list(list);
  if (!ctx) return false;
  pd = ibv_alloc_pd(ctx);
  cq = ibv_create_cq(ctx, 8192, nullptr, nullptr, 0);
  if (!pd || !cq) return false;
  for (int i = 0; i < kQps; ++i) {
    ibv_qp_init_attr ia{};
    ia.send_cq = cq;
    ia.recv_cq = cq;
    ia.qp_type = type_of(i);
    ia.cap = {64, 64, 4, 4, 64};
    if (i >= kFirstEx) {
      ibv_qp_init_attr_ex ix{};
      ix.send_cq = cq;
      ix.recv_cq = cq;
      ix.qp_type = IBV_QPT_RC;
      ix.cap = ia.cap;
      ix.pd = pd;
      ix.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
      ix.send_ops_flags = IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM | IBV_QP_EX_WITH_SEND |
                          IBV_QP_EX_WITH_SEND_WITH_IMM | IBV_QP_EX_WITH_RDMA_READ |
                          IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP | IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD |
                          IBV_QP_EX_WITH_LOCAL_INV | IBV_QP_EX_WITH_BIND_MW | IBV_QP_EX_WITH_SEND_WITH_INV;
      qp[i] = ibv_create_qp_ex(ctx, &ix);
    } else {
      qp[i] = ibv_create_qp(pd, &ia);
    }
    if (!qp[i]) return false;
  }
  for (int i = 0; i < kQps; ++i)
    if (!to_rts(i)) return false;
  ibv_ah_attr ah_attr{};
  ah_attr.is_global = 1;
  ah_attr.grh.hop_limit = 1;
  ibv_query_gid(ctx, 1, 0, &ah_attr.grh.dgid);
  ah_attr.port_num = 1;
  ah = ibv_create_ah(pd, &ah_attr);
  if (!ah) return false;
  mw = ibv_alloc_mw(pd, IBV_MW_TYPE_2);
  if (!mw) return false;
  size_t total = kPage + kSlots * (kSlotLen + kPage);
  void* m = mmap(nullptr, total, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return false;
  arena = static_cast<uint8_t*>(m);
  for (int s = 0; s < kSlots; ++s) {
    slot[s] = arena + kPage + s * (kSlotLen + kPage);
    if (mprotect(slot[s], kSlotLen, PROT_READ | PROT_WRITE)) return false;
  }
  return true;
}

void Harness::poll_once() {
  ibv_wc wc[32];
  int n = ibv_poll_cq(cq, 32, wc);
  if (n < 0) die("poll_cq failed", uint64_t(-n));
  for (int i = 0; i < n; ++i) {
    auto it = expect.find(wc[i].wr_id);
    if (it == expect.end()) die("completion of a work request never accepted", wc[i].wr_id, wc[i].status);
    Expect& e = it->second;
    if (++e.seen > 1) die("work request completed twice", wc[i].wr_id);
    if (wc[i].status > IBV_WC_GENERAL_ERR) die("illegal completion status", wc[i].status);
    if (wc[i].qp_num != qp[e.qp]->qp_num) die("completion on the wrong QP", wc[i].qp_num, qp[e.qp]->qp_num);
    (wc[i].status == IBV_WC_SUCCESS ? n_success : n_error)++;
    n_status[wc[i].status & 31]++;
    if (wc[i].status == IBV_WC_SUCCESS) {
      bool recv_op = wc[i].opcode & IBV_WC_RECV;
      if (recv_op != e.recv) die("completion opcode of the wrong queue", wc[i].opcode, e.recv);
      if (!e.recv && !(e.flags & IBV_SEND_SIGNALED))
        die("an unsignaled request completed successfully", e.opcode, uint64_t(e.qp) << 32 | e.flags);
    }
  }
}

// After an input: ERR flushes both queues of every QP (IBTA 10.3.1); every
// receive and every signaled send then has completed. RESET and back to
// RTS for the next input.
bool Harness::reset_all() {
  for (int i = 0; i < kQps; ++i) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_ERR;
    if (ibv_modify_qp(qp[i], &a, IBV_QP_STATE)) die("modify to ERR failed", i);
  }
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  for (;;) {
    poll_once();
    bool missing = false;
    for (auto& [id, e] : expect) missing |= e.must && e.seen == 0;
    if (!missing) break;
    if (std::chrono::steady_clock::now() > deadline) {
      for (auto& [id, e] : expect)
        if (e.must && !e.seen) die("work request never completed", id, e.qp);
    }
  }
  usleep(0);
  poll_once();
  expect.clear();
  for (int i = 0; i < kQps; ++i) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RESET;
    if (ibv_modify_qp(qp[i], &a, IBV_QP_STATE)) die("modify to RESET failed", i);
  }
  for (int i = 0; i < kQps; ++i)
    if (!to_rts(i)) die("back to RTS failed", i);
  return true;
}

// An address: mostly near a registered MR (in or just outside its bounds),
// sometimes anywhere. *slot tells which MR, for a matching key.
uint64_t pick_addr(FuzzedDataProvider& in, int64_t* len_hint, int* slot) {
  int s = in.ConsumeIntegralInRange(0, kSlots - 1);
  *slot = s;
  switch (in.ConsumeIntegralInRange(0, 3)) {
    case 0:
    case 1: {
      int64_t d = in.ConsumeIntegralInRange<int64_t>(-64, int64_t(kSlotLen) + 64);
      if (in.ConsumeBool()) d = in.ConsumeIntegralInRange<int64_t>(0, 16);  // near the start: mostly valid
      if (len_hint) *len_hint = int64_t(h->mr_len[s]) - d;
      return reinterpret_cast<uint64_t>(h->slot[s] + h->mr_off[s]) + uint64_t(d);
    }
    case 2: return in.ConsumeIntegral<uint64_t>();
    default: return 0;
  }
}

// A key: mostly the one of the MR the address points into.
uint32_t pick_key(FuzzedDataProvider& in, int slot) {
  int s = in.ConsumeIntegralInRange(0, 3) != 3 ? slot : in.ConsumeIntegralInRange(0, kSlots - 1);
  switch (in.ConsumeIntegralInRange(0, 3)) {
    case 0:
    case 1: return h->mr[s] ? h->mr[s]->lkey : 0;  // lkey == rkey for an MR here, but not by contract
    case 2: return h->mr[s] ? h->mr[s]->rkey : 0;
    default: return in.ConsumeIntegral<uint32_t>();
  }
}

uint32_t pick_len(FuzzedDataProvider& in, int64_t hint) {
  switch (in.ConsumeIntegralInRange(0, 3)) {
    case 0: return hint > 0 ? uint32_t(hint) : 0;
    case 1: return in.ConsumeIntegralInRange<uint32_t>(0, 64);
    case 2: return in.ConsumeIntegralInRange<uint32_t>(0, 3 * kSlotLen);
    default: return in.ConsumeIntegral<uint32_t>();
  }
}

void fill_sges(FuzzedDataProvider& in, std::vector<ibv_sge>& sg, bool inline_data) {
  for (auto& s : sg) {
    int64_t hint = 0;
    int slot = 0;
    s.addr = pick_addr(in, &hint, &slot);
    s.length = pick_len(in, hint);
    s.lkey = pick_key(in, slot);
    if (inline_data) {
      // Inline data is read from the application's pointer, unchecked (as
      // in every provider): keep it readable.
      int sl = in.ConsumeIntegralInRange(0, kSlots - 1);
      size_t off = in.ConsumeIntegralInRange<size_t>(0, kSlotLen);
      s.addr = reinterpret_cast<uint64_t>(h->slot[sl] + off);
      s.length = uint32_t(std::min<uint64_t>(s.length, kSlotLen - off));
    }
  }
}

int sge_count(FuzzedDataProvider& in) {
  switch (in.ConsumeIntegralInRange(0, 3)) {
    case 0:
    case 1: return in.ConsumeIntegralInRange(0, 4);
    case 2: return in.ConsumeIntegralInRange(-3, 40);
    default: return int(in.ConsumeIntegral<int8_t>());
  }
}

void post_send(FuzzedDataProvider& in) {
  int q = in.ConsumeIntegralInRange(0, kQps - 1);
  int nwr = in.ConsumeIntegralInRange(1, 4);
  std::vector<ibv_send_wr> wrs(static_cast<size_t>(nwr));
  std::vector<std::vector<ibv_sge>> sgs(static_cast<size_t>(nwr));
  for (int i = 0; i < nwr; ++i) {
    ibv_send_wr& w = wrs[size_t(i)];
    std::memset(&w, 0, sizeof(w));
    w.wr_id = h->next_id++;
    w.next = i + 1 < nwr ? &wrs[size_t(i) + 1] : nullptr;
    uint8_t b = in.ConsumeIntegral<uint8_t>();
    uint32_t op = b < 240 ? b % 12 : in.ConsumeIntegral<uint32_t>();
    std::memcpy(&w.opcode, &op, sizeof(op));  // any value a C caller could store
    w.send_flags = in.ConsumeIntegral<uint8_t>() & 0x1f;
    int n = sge_count(in);
    // sg_list holds exactly num_sge entries: reading more is a bug ASan sees.
    sgs[size_t(i)].resize(size_t(std::max(n, 1)));
    fill_sges(in, sgs[size_t(i)], w.send_flags & IBV_SEND_INLINE);
    w.sg_list = n > 0 ? sgs[size_t(i)].data() : (in.ConsumeBool() ? nullptr : sgs[size_t(i)].data());
    w.num_sge = n;
    w.imm_data = in.ConsumeIntegral<uint32_t>();
    if (op == IBV_WR_ATOMIC_CMP_AND_SWP || op == IBV_WR_ATOMIC_FETCH_AND_ADD) {
      int slot = 0;
      w.wr.atomic.remote_addr = pick_addr(in, nullptr, &slot) & ~uint64_t(in.ConsumeBool() ? 7 : 0);
      w.wr.atomic.compare_add = in.ConsumeIntegral<uint64_t>();
      w.wr.atomic.swap = in.ConsumeIntegral<uint64_t>();
      w.wr.atomic.rkey = pick_key(in, slot);
    } else if (type_of(q) == IBV_QPT_UD) {
      w.wr.ud.ah = in.ConsumeIntegralInRange(0, 7) ? h->ah : nullptr;
      w.wr.ud.remote_qpn = in.ConsumeIntegralInRange(0, 7) ? h->qp[q ^ 1]->qp_num : in.ConsumeIntegral<uint32_t>();
      w.wr.ud.remote_qkey = in.ConsumeIntegralInRange(0, 3) ? kQkey : in.ConsumeIntegral<uint32_t>();
    } else {
      int slot = 0;
      w.wr.rdma.remote_addr = pick_addr(in, nullptr, &slot);
      w.wr.rdma.rkey = pick_key(in, slot);
    }
    // SEND_WITH_INV, LOCAL_INV: a key of ours, the window's, or anything.
    w.invalidate_rkey = in.ConsumeBool() ? h->mw->rkey : pick_key(in, in.ConsumeIntegralInRange(0, kSlots - 1));
    if (op == IBV_WR_BIND_MW) {
      // The window and MR pointers must be NULL or real (the application's
      // side of the contract); everything else is arbitrary.
      w.bind_mw.mw = in.ConsumeIntegralInRange(0, 7) ? h->mw : nullptr;
      w.bind_mw.rkey = in.ConsumeBool() ? ibv_inc_rkey(h->mw->rkey) : in.ConsumeIntegral<uint32_t>();
      int slot = 0;
      int64_t hint = 0;
      w.bind_mw.bind_info.addr = pick_addr(in, &hint, &slot);
      w.bind_mw.bind_info.mr = in.ConsumeIntegralInRange(0, 7) ? h->mr[slot] : nullptr;
      w.bind_mw.bind_info.length = pick_len(in, hint);
      w.bind_mw.bind_info.mw_access_flags = in.ConsumeIntegral<uint8_t>() & 0x1f;
    }
  }
  ibv_send_wr* bad = nullptr;
  int rc = ibv_post_send(h->qp[q], wrs.data(), &bad);
  int accepted = nwr;
  if (rc) {
    accepted = -1;
    for (int i = 0; i < nwr; ++i)
      if (bad == &wrs[size_t(i)]) accepted = i;
    if (accepted < 0) die("post_send failed without naming the bad request", uint64_t(rc));
  }
  n_posted += uint64_t(nwr);
  n_accepted += uint64_t(accepted);
  for (int i = 0; i < accepted; ++i) {
    const ibv_send_wr& w = wrs[size_t(i)];
    uint32_t op;
    std::memcpy(&op, &w.opcode, sizeof(op));
    h->expect[w.wr_id] = {q, false, (w.send_flags & IBV_SEND_SIGNALED) != 0, 0, op, w.send_flags};
  }
}

void post_recv(FuzzedDataProvider& in) {
  int q = in.ConsumeIntegralInRange(0, kQps - 1);
  int nwr = in.ConsumeIntegralInRange(1, 4);
  std::vector<ibv_recv_wr> wrs(static_cast<size_t>(nwr));
  std::vector<std::vector<ibv_sge>> sgs(static_cast<size_t>(nwr));
  for (int i = 0; i < nwr; ++i) {
    ibv_recv_wr& w = wrs[size_t(i)];
    std::memset(&w, 0, sizeof(w));
    w.wr_id = h->next_id++;
    w.next = i + 1 < nwr ? &wrs[size_t(i) + 1] : nullptr;
    int n = sge_count(in);
    sgs[size_t(i)].resize(size_t(std::max(n, 1)));
    fill_sges(in, sgs[size_t(i)], false);
    w.sg_list = sgs[size_t(i)].data();
    w.num_sge = n;
  }
  ibv_recv_wr* bad = nullptr;
  int rc = ibv_post_recv(h->qp[q], wrs.data(), &bad);
  int accepted = nwr;
  if (rc) {
    accepted = -1;
    for (int i = 0; i < nwr; ++i)
      if (bad == &wrs[size_t(i)]) accepted = i;
    if (accepted < 0) die("post_recv failed without naming the bad request", uint64_t(rc));
  }
  n_posted += uint64_t(nwr);
  n_accepted += uint64_t(accepted);
  for (int i = 0; i < accepted; ++i) h->expect[wrs[size_t(i)].wr_id] = {q, true, true};
}

// The extended post API (ibv_wr_post(3)): a batch of builders and setters
// with fuzzed operands, then ibv_wr_complete (all or nothing: if it fails,
// none of the batch was posted) or ibv_wr_abort.
void post_ex(FuzzedDataProvider& in) {
  int q = in.ConsumeIntegralInRange(kFirstEx, kQps - 1);
  ibv_qp_ex* qx = ibv_qp_to_qp_ex(h->qp[q]);
  if (!qx) die("ibv_qp_to_qp_ex failed");
  struct Built {
    uint64_t id;
    uint32_t op, flags;
  };
  std::vector<Built> built;
  ibv_wr_start(qx);
  int nwr = in.ConsumeIntegralInRange(0, 4);
  for (int i = 0; i < nwr; ++i) {
    qx->wr_id = h->next_id++;
    qx->wr_flags = in.ConsumeIntegral<uint8_t>() & 0x1f;
    int slot = 0;
    int64_t hint = 0;
    uint64_t raddr = pick_addr(in, &hint, &slot);
    uint32_t rkey = pick_key(in, slot);
    uint32_t op;
    switch (in.ConsumeIntegralInRange(0, 9)) {
      case 0: ibv_wr_send(qx); op = IBV_WR_SEND; break;
      case 1: ibv_wr_send_imm(qx, in.ConsumeIntegral<uint32_t>()); op = IBV_WR_SEND_WITH_IMM; break;
      case 2: ibv_wr_send_inv(qx, in.ConsumeBool() ? h->mw->rkey : rkey); op = IBV_WR_SEND_WITH_INV; break;
      case 3: ibv_wr_rdma_write(qx, rkey, raddr); op = IBV_WR_RDMA_WRITE; break;
      case 4: ibv_wr_rdma_write_imm(qx, rkey, raddr, in.ConsumeIntegral<uint32_t>()); op = IBV_WR_RDMA_WRITE_WITH_IMM; break;
      case 5: ibv_wr_rdma_read(qx, rkey, raddr); op = IBV_WR_RDMA_READ; break;
      case 6:
        ibv_wr_atomic_cmp_swp(qx, rkey, raddr, in.ConsumeIntegral<uint64_t>(), in.ConsumeIntegral<uint64_t>());
        op = IBV_WR_ATOMIC_CMP_AND_SWP;
        break;
      case 7: ibv_wr_atomic_fetch_add(qx, rkey, raddr, in.ConsumeIntegral<uint64_t>()); op = IBV_WR_ATOMIC_FETCH_AND_ADD; break;
      case 8: ibv_wr_local_inv(qx, in.ConsumeBool() ? h->mw->rkey : rkey); op = IBV_WR_LOCAL_INV; break;
      default: {
        ibv_mw_bind_info b{};
        b.mr = in.ConsumeIntegralInRange(0, 7) ? h->mr[slot] : nullptr;
        b.addr = raddr;
        b.length = pick_len(in, hint);
        b.mw_access_flags = in.ConsumeIntegral<uint8_t>() & 0x1f;
        ibv_wr_bind_mw(qx, h->mw, in.ConsumeBool() ? ibv_inc_rkey(h->mw->rkey) : in.ConsumeIntegral<uint32_t>(), &b);
        op = IBV_WR_BIND_MW;
        break;
      }
    }
    switch (in.ConsumeIntegralInRange(0, 3)) {
      case 0: {
        int64_t lh = 0;
        int ls = 0;
        uint64_t a = pick_addr(in, &lh, &ls);
        uint32_t len = pick_len(in, lh);
        ibv_wr_set_sge(qx, pick_key(in, ls), a, len);
        break;
      }
      case 1: {
        size_t n = in.ConsumeIntegralInRange<size_t>(0, 6);
        std::vector<ibv_sge> sg(std::max<size_t>(n, 1));
        fill_sges(in, sg, false);
        ibv_wr_set_sge_list(qx, n, sg.data());
        break;
      }
      case 2: {
        size_t n = in.ConsumeIntegralInRange<size_t>(0, 3);
        std::vector<ibv_sge> sg(std::max<size_t>(n, 1));
        fill_sges(in, sg, true);  // readable buffers, as the contract wants
        std::vector<ibv_data_buf> bufs;
        for (size_t k = 0; k < n; ++k) bufs.push_back({reinterpret_cast<void*>(sg[k].addr), sg[k].length});
        ibv_wr_set_inline_data_list(qx, n, bufs.data());
        break;
      }
      default: break;  // no scatter list at all
    }
    built.push_back({qx->wr_id, op, qx->wr_flags});
  }
  if (in.ConsumeIntegralInRange(0, 7) == 0) {
    ibv_wr_abort(qx);
    return;
  }
  n_posted += built.size();
  if (ibv_wr_complete(qx) != 0) return;  // nothing of the batch was posted
  n_accepted += built.size();
  for (const Built& b : built)
    h->expect[b.id] = {q, false, (b.flags & IBV_SEND_SIGNALED) != 0, 0, b.op, b.flags};
}

// A state change in the middle of the traffic: to any state, with the mask
// the transition needs or a random one (the library and daemon must refuse
// what IBTA 11.2.4.2 does not allow). RESET discards outstanding requests
// without completions (IBTA 10.3.1): they may no longer complete... but
// still at most once.
void modify(FuzzedDataProvider& in) {
  int q = in.ConsumeIntegralInRange(0, kQps - 1);
  auto target = ibv_qp_state(in.ConsumeIntegralInRange(0, 6));  // RESET .. ERR
  ibv_qp_type t = type_of(q);
  ibv_qp_attr a{};
  a.qp_state = target;
  a.port_num = 1;
  a.qkey = kQkey;
  a.qp_access_flags = in.ConsumeIntegral<uint8_t>() & 0xf;
  a.path_mtu = IBV_MTU_1024;
  a.dest_qp_num = in.ConsumeBool() ? h->qp[q ^ 1]->qp_num : in.ConsumeIntegral<uint32_t>() & 0xffffff;
  a.max_dest_rd_atomic = 1;
  a.max_rd_atomic = 1;
  a.min_rnr_timer = 1;
  a.timeout = 1;
  a.retry_cnt = 1;
  a.rnr_retry = 2;
  a.ah_attr.is_global = 1;
  a.ah_attr.grh.hop_limit = 1;
  ibv_query_gid(h->ctx, 1, 0, &a.ah_attr.grh.dgid);
  a.ah_attr.port_num = 1;
  int mask = IBV_QP_STATE;
  switch (target) {
    case IBV_QPS_INIT:
      mask |= IBV_QP_PKEY_INDEX | IBV_QP_PORT | (t == IBV_QPT_UD ? IBV_QP_QKEY : IBV_QP_ACCESS_FLAGS);
      break;
    case IBV_QPS_RTR:
      if (t != IBV_QPT_UD) mask |= IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
      if (t == IBV_QPT_RC) mask |= IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
      break;
    case IBV_QPS_RTS:
      mask |= IBV_QP_SQ_PSN;
      if (t == IBV_QPT_RC) mask |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
      break;
    default:
      break;
  }
  if (in.ConsumeIntegralInRange(0, 3) == 0) mask = int(in.ConsumeIntegral<uint32_t>() & ((1u << 21) - 1));
  if (ibv_modify_qp(h->qp[q], &a, mask) == 0 && (mask & IBV_QP_STATE) && target == IBV_QPS_RESET)
    for (auto& [id, e] : h->expect)
      if (e.qp == q) e.must = false;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  char tmpl[] = "/tmp/softverbs-wrfuzz-XXXXXX";
  if (!getenv("SOFTVERBS_DIR") && mkdtemp(tmpl)) setenv("SOFTVERBS_DIR", tmpl, 1);
  setenv("SOFTVERBSD_IDLE", "2", 0);
  if (getenv("WR_FUZZ_STATS"))
    atexit([] {
      fprintf(stderr, "wr_fuzz: %llu requests posted, %llu accepted, %llu completed ok, %llu with an error\n",
              (unsigned long long)n_posted, (unsigned long long)n_accepted, (unsigned long long)n_success,
              (unsigned long long)n_error);
      for (int i = 0; i < 32; ++i)
        if (n_status[i]) fprintf(stderr, "  %s: %llu\n", ibv_wc_status_str(ibv_wc_status(i)), (unsigned long long)n_status[i]);
    });
  h = new Harness();
  if (!h->init()) die("setup failed (is softverbsd built?)");
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  // This input's MRs: each in its slot, the rest of the slot a canary.
  // (Choice 0 is what FuzzedDataProvider returns once the input is used up:
  // make it the permissive one, here and below.)
  static const int kAccess[] = {IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                                    IBV_ACCESS_REMOTE_ATOMIC,
                                IBV_ACCESS_LOCAL_WRITE,
                                IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE,
                                IBV_ACCESS_REMOTE_READ,
                                0};
  for (int s = 0; s < kSlots; ++s) {
    size_t off = in.ConsumeIntegralInRange<size_t>(0, kSlotLen - 1);
    size_t len = kSlotLen - off - in.ConsumeIntegralInRange<size_t>(0, kSlotLen - off - 1);
    int access = kAccess[in.ConsumeIntegralInRange(0, 4)];
    std::memset(h->slot[s], kCanary, kSlotLen);
    for (size_t i = 0; i < len; ++i) h->slot[s][off + i] = uint8_t(i * 7 + 1);
    h->mr[s] = ibv_reg_mr(h->pd, h->slot[s] + off, len, access);
    if (!h->mr[s]) std::memset(h->slot[s] + off, kCanary, len);  // refused: all canary
    h->mr_off[s] = off;
    h->mr_len[s] = h->mr[s] ? len : 0;
  }
  for (int cmds = 0; cmds < 24 && in.remaining_bytes() > 0; ++cmds) {
    switch (in.ConsumeIntegralInRange(0, 5)) {
      case 0:
      case 1: post_send(in); break;
      case 2: post_recv(in); break;
      case 3: h->poll_once(); break;
      case 4: modify(in); break;
      default: post_ex(in); break;
    }
  }
  h->reset_all();
  // A window bound to an MR keeps it from being deregistered (EBUSY): a
  // fresh window for the next input.
  if (ibv_dealloc_mw(h->mw)) die("dealloc_mw failed");
  h->mw = ibv_alloc_mw(h->pd, IBV_MW_TYPE_2);
  if (!h->mw) die("alloc_mw failed");
  for (int s = 0; s < kSlots; ++s) {
    size_t off = h->mr_off[s], len = h->mr[s] ? h->mr_len[s] : 0;
    for (size_t i = 0; i < kSlotLen; ++i)
      if ((i < off || i >= off + len) && h->slot[s][i] != kCanary)
        die("a byte outside every MR was written", uint64_t(s), i);
    if (h->mr[s] && ibv_dereg_mr(h->mr[s])) die("dereg_mr failed", uint64_t(s));
    h->mr[s] = nullptr;
    h->mr_len[s] = 0;
  }
  return 0;
}
