// Extended QPs: the ibv_wr_* post API (ibv_wr_post(3)) of QPs created by
// ibv_create_qp_ex with IBV_QP_INIT_ATTR_SEND_OPS_FLAGS.
//
// The builders only record work requests, as ibv_send_wr chains, in a batch
// owned by the QP; ibv_wr_complete hands the chain to the ordinary requester
// (post_send_all in requester.cc), so both post APIs run the same checks and
// the same execution. A builder cannot return an error: the first error is
// remembered and ibv_wr_complete returns it with nothing posted.
//
// Thread safety: ibv_wr_start takes the batch lock of the QP (process-local)
// and ibv_wr_complete/ibv_wr_abort release it, so threads of one process
// building batches on one QP are serialised, as rdma-core's providers do
// with their QP lock. Other processes sharing the QP build their own batch;
// the send lock in shared memory orders the posts.
#include <cerrno>
#include <cstring>
#include <deque>

#include "verbs/provider.h"
#include "verbs/wr_rules.h"

namespace sv::verbs {

struct WrBatch {
  struct Entry {
    ibv_send_wr wr{};
    ibv_sge sge[shm::kMaxSge]{};
    std::vector<uint8_t> inline_data;
  };
  std::mutex mu;     // held from wr_start to wr_complete/wr_abort
  bool open = false;
  int err = 0;       // the first error of the batch being built
  std::deque<Entry> wrs;  // deque: entries do not move while the batch grows
};

namespace {

ProcessQp& state(ibv_qp_ex* qx) { return *reinterpret_cast<QpHandle*>(qx)->st; }

void set_error(WrBatch& b, int e) {
  if (!b.err) b.err = e;
}

// Starts a new WR of opcode `op` (allowed by `flag`) from the QP's wr_id
// and wr_flags; NULL when the batch is not open or the op not allowed.
WrBatch::Entry* begin(ibv_qp_ex* qx, ibv_wr_opcode op, uint64_t flag) {
  ProcessQp& q = state(qx);
  WrBatch& b = *q.batch;
  if (!b.open) return nullptr;  // no wr_start: nothing to attach the WR to
  if (!(q.send_ops & flag)) {
    set_error(b, EINVAL);
    return nullptr;
  }
  if (b.wrs.size() >= q.cap.max_send_wr) {  // more than the send queue holds
    set_error(b, ENOMEM);
    return nullptr;
  }
  WrBatch::Entry& e = b.wrs.emplace_back();
  e.wr.wr_id = qx->wr_id;
  e.wr.send_flags = qx->wr_flags;
  e.wr.opcode = op;
  return &e;
}

// The WR the setters (wr_set_*) apply to: the last one built.
WrBatch::Entry* last(ibv_qp_ex* qx) {
  WrBatch& b = *state(qx).batch;
  if (!b.open || b.wrs.empty()) {
    if (b.open) set_error(b, EINVAL);
    return nullptr;
  }
  return &b.wrs.back();
}

void wr_start(ibv_qp_ex* qx) {
  WrBatch& b = *state(qx).batch;
  b.mu.lock();
  b.open = true;
  b.err = 0;
  b.wrs.clear();
}

int wr_complete(ibv_qp_ex* qx) {
  ProcessQp& q = state(qx);
  WrBatch& b = *q.batch;
  if (!b.open) return EINVAL;
  int rc = b.err;
  if (!rc && !b.wrs.empty()) {
    ibv_send_wr* prev = nullptr;
    for (auto& e : b.wrs) {
      if (prev) prev->next = &e.wr;
      prev = &e.wr;
    }
    prev->next = nullptr;
    rc = post_send_all(&qx->qp_base, &b.wrs.front().wr);
  }
  b.wrs.clear();
  b.open = false;
  b.mu.unlock();
  return rc;
}

void wr_abort(ibv_qp_ex* qx) {
  WrBatch& b = *state(qx).batch;
  if (!b.open) return;
  b.wrs.clear();
  b.open = false;
  b.mu.unlock();
}

void wr_send(ibv_qp_ex* qx) { begin(qx, IBV_WR_SEND, IBV_QP_EX_WITH_SEND); }

void wr_send_imm(ibv_qp_ex* qx, __be32 imm) {
  if (auto* e = begin(qx, IBV_WR_SEND_WITH_IMM, IBV_QP_EX_WITH_SEND_WITH_IMM)) e->wr.imm_data = imm;
}

void wr_send_inv(ibv_qp_ex* qx, uint32_t rkey) {
  if (auto* e = begin(qx, IBV_WR_SEND_WITH_INV, IBV_QP_EX_WITH_SEND_WITH_INV)) e->wr.invalidate_rkey = rkey;
}

void wr_send_tso(ibv_qp_ex* qx, void*, uint16_t, uint16_t) {
  begin(qx, IBV_WR_TSO, IBV_QP_EX_WITH_TSO);  // never allowed: records the error
}

void wr_rdma_write(ibv_qp_ex* qx, uint32_t rkey, uint64_t addr) {
  if (auto* e = begin(qx, IBV_WR_RDMA_WRITE, IBV_QP_EX_WITH_RDMA_WRITE)) e->wr.wr.rdma = {addr, rkey};
}

void wr_rdma_write_imm(ibv_qp_ex* qx, uint32_t rkey, uint64_t addr, __be32 imm) {
  if (auto* e = begin(qx, IBV_WR_RDMA_WRITE_WITH_IMM, IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM)) {
    e->wr.wr.rdma = {addr, rkey};
    e->wr.imm_data = imm;
  }
}

void wr_rdma_read(ibv_qp_ex* qx, uint32_t rkey, uint64_t addr) {
  if (auto* e = begin(qx, IBV_WR_RDMA_READ, IBV_QP_EX_WITH_RDMA_READ)) e->wr.wr.rdma = {addr, rkey};
}

void wr_atomic_cmp_swp(ibv_qp_ex* qx, uint32_t rkey, uint64_t addr, uint64_t compare, uint64_t swap) {
  if (auto* e = begin(qx, IBV_WR_ATOMIC_CMP_AND_SWP, IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP))
    e->wr.wr.atomic = {addr, compare, swap, rkey};
}

void wr_atomic_fetch_add(ibv_qp_ex* qx, uint32_t rkey, uint64_t addr, uint64_t add) {
  if (auto* e = begin(qx, IBV_WR_ATOMIC_FETCH_AND_ADD, IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD))
    e->wr.wr.atomic = {addr, add, 0, rkey};
}

void wr_bind_mw(ibv_qp_ex* qx, ibv_mw* mw, uint32_t rkey, const ibv_mw_bind_info* info) {
  auto* e = begin(qx, IBV_WR_BIND_MW, IBV_QP_EX_WITH_BIND_MW);
  if (!e) return;
  if (!mw || !info) {
    set_error(*state(qx).batch, EINVAL);
    return;
  }
  e->wr.bind_mw.mw = mw;
  e->wr.bind_mw.rkey = rkey;
  e->wr.bind_mw.bind_info = *info;
}

void wr_local_inv(ibv_qp_ex* qx, uint32_t rkey) {
  if (auto* e = begin(qx, IBV_WR_LOCAL_INV, IBV_QP_EX_WITH_LOCAL_INV)) e->wr.invalidate_rkey = rkey;
}

// IBTA annex A19 ATOMIC WRITE: the 8 bytes at `data` are copied now
// (ibv_wr_post(3)) and go as inline data.
void wr_atomic_write(ibv_qp_ex* qx, uint32_t rkey, uint64_t addr, const void* data) {
  auto* e = begin(qx, IBV_WR_ATOMIC_WRITE, IBV_QP_EX_WITH_ATOMIC_WRITE);
  if (!e) return;
  if (!data) {
    set_error(*state(qx).batch, EINVAL);
    return;
  }
  e->wr.wr.rdma = {addr, rkey};
  e->inline_data.assign(static_cast<const uint8_t*>(data), static_cast<const uint8_t*>(data) + 8);
  e->sge[0] = {reinterpret_cast<uint64_t>(e->inline_data.data()), 8, 0};
  e->wr.sg_list = e->sge;
  e->wr.num_sge = 1;
  e->wr.send_flags |= IBV_SEND_INLINE;
}

// IBTA annex A19 FLUSH of [addr, addr + len) (level IBV_FLUSH_RANGE) or of
// the whole region `rkey` names (IBV_FLUSH_MR) to the placement types in
// `type`; its fields travel in wr.atomic (wr_rules.h, kFlushBuilt).
void wr_flush(ibv_qp_ex* qx, uint32_t rkey, uint64_t addr, size_t len, uint8_t type, uint8_t level) {
  auto* e = begin(qx, ibv_wr_opcode(abi::kWrFlush), abi::kQpExWithFlush);
  if (!e) return;
  e->wr.wr.atomic = {addr, uint64_t(len), flush_code(type, level), rkey};
  e->wr.send_flags |= kFlushBuilt;
}

void wr_set_ud_addr(ibv_qp_ex* qx, ibv_ah* ah, uint32_t remote_qpn, uint32_t remote_qkey) {
  if (auto* e = last(qx)) e->wr.wr.ud = {ah, remote_qpn, remote_qkey};
}

void wr_set_xrc_srqn(ibv_qp_ex* qx, uint32_t remote_srqn) {
  if (auto* e = last(qx)) e->wr.qp_type.xrc.remote_srqn = remote_srqn;
}

void wr_set_sge_list(ibv_qp_ex* qx, size_t n, const ibv_sge* list) {
  auto* e = last(qx);
  if (!e) return;
  if (n > state(qx).cap.max_send_sge || (n && !list)) {
    set_error(*state(qx).batch, EINVAL);
    return;
  }
  std::copy(list, list + n, e->sge);
  e->wr.sg_list = e->sge;
  e->wr.num_sge = int(n);
  e->wr.send_flags &= ~unsigned(IBV_SEND_INLINE);
}

void wr_set_sge(ibv_qp_ex* qx, uint32_t lkey, uint64_t addr, uint32_t length) {
  ibv_sge s{addr, length, lkey};
  wr_set_sge_list(qx, 1, &s);
}

// The data is copied now (ibv_wr_post(3): the buffers may be reused as soon
// as the call returns) into one buffer, sent as IBV_SEND_INLINE.
void wr_set_inline_data_list(ibv_qp_ex* qx, size_t n, const ibv_data_buf* bufs) {
  auto* e = last(qx);
  if (!e) return;
  uint64_t total = 0;
  for (size_t i = 0; i < n; ++i) total += bufs[i].length;
  if (total > state(qx).cap.max_inline_data) {
    set_error(*state(qx).batch, EINVAL);
    return;
  }
  e->inline_data.resize(total);
  uint64_t off = 0;
  for (size_t i = 0; i < n; ++i) {
    if (bufs[i].length) std::memcpy(e->inline_data.data() + off, bufs[i].addr, bufs[i].length);
    off += bufs[i].length;
  }
  e->sge[0] = {reinterpret_cast<uint64_t>(e->inline_data.data()), uint32_t(total), 0};
  e->wr.sg_list = e->sge;
  e->wr.num_sge = total ? 1 : 0;
  e->wr.send_flags |= IBV_SEND_INLINE;
}

void wr_set_inline_data(ibv_qp_ex* qx, void* addr, size_t length) {
  ibv_data_buf b{addr, length};
  wr_set_inline_data_list(qx, 1, &b);
}

}  // namespace

void init_qp_ex(QpHandle* qp, uint64_t send_ops) {
  ProcessQp& q = *qp->st;
  q.send_ops = send_ops;
  q.batch = std::make_shared<WrBatch>();
  ibv_qp_ex& x = qp->qpx;
  x.wr_atomic_cmp_swp = wr_atomic_cmp_swp;
  x.wr_atomic_fetch_add = wr_atomic_fetch_add;
  x.wr_bind_mw = wr_bind_mw;
  x.wr_local_inv = wr_local_inv;
  x.wr_rdma_read = wr_rdma_read;
  x.wr_rdma_write = wr_rdma_write;
  x.wr_rdma_write_imm = wr_rdma_write_imm;
  x.wr_send = wr_send;
  x.wr_send_imm = wr_send_imm;
  x.wr_send_inv = wr_send_inv;
  x.wr_send_tso = wr_send_tso;
  x.wr_set_ud_addr = wr_set_ud_addr;
  x.wr_set_xrc_srqn = wr_set_xrc_srqn;
  x.wr_set_inline_data = wr_set_inline_data;
  x.wr_set_inline_data_list = wr_set_inline_data_list;
  x.wr_set_sge = wr_set_sge;
  x.wr_set_sge_list = wr_set_sge_list;
  x.wr_start = wr_start;
  x.wr_complete = wr_complete;
  x.wr_abort = wr_abort;
  x.wr_atomic_write = wr_atomic_write;
  qp->wr_flush = wr_flush;
}

}  // namespace sv::verbs

extern "C" {

// rdma-core returns the extended QP only for QPs created as such.
ibv_qp_ex* ibv_qp_to_qp_ex(ibv_qp* qp) {
  auto* q = reinterpret_cast<sv::verbs::QpHandle*>(qp);
  if (!qp || !q->st->batch) return nullptr;
  return &q->qpx;
}

}  // extern "C"
