// The one check of a send work request against the opcode rules
// (wr_rules.h), and its translation into the send queue's SendWqe.
#include "verbs/wr_rules.h"

#include <atomic>
#include <cerrno>
#include <cstdio>

#include "common/responder_core.h"
#include "verbs/provider.h"

namespace sv::verbs {

namespace {

// IBTA annex A19: a FLUSH as ibv_wr_flush built it (kFlushBuilt; ibv_post_send
// has no way to name its placement type), with a known placement type and
// selectivity level and, for a range, a length a RETH holds; an ATOMIC WRITE
// carries exactly 8 bytes.
int validate_a19(const ibv_send_wr* wr, uint32_t opcode) {
  if (opcode == uint32_t(abi::kWrFlush)) {
    if (!(wr->send_flags & kFlushBuilt)) {
      static std::atomic<bool> said{false};
      if (!said.exchange(true, std::memory_order_relaxed))
        std::fprintf(stderr, "softverbs: IBV_WR_FLUSH needs ibv_wr_flush(3): ibv_post_send has no fields for its "
                             "placement type\n");
      return EINVAL;
    }
    const FlushFields f = flush_fields(wr->wr.atomic.remote_addr, wr->wr.atomic.rkey, wr->wr.atomic.compare_add,
                                       wr->wr.atomic.swap);
    if (f.placement == 0 || core::check_flush(f.placement, f.level) != core::Check::kOk) return EINVAL;
    if (f.level == abi::kFlushRange && f.len > UINT32_MAX) return EINVAL;
    return 0;
  }
  uint64_t len = 0;
  for (int i = 0; i < wr->num_sge; ++i) len += wr->sg_list[i].length;
  return len == access::kAtomicBytes ? 0 : EINVAL;
}

}  // namespace

int validate_wr(const ProcessQp& q, const ibv_send_wr* wr) {
  const uint32_t opcode = opcode_of(wr);
  const WrRule& r = wr_rule(opcode);
  if (!r.known || !(r.qp_types & qp_type_bit(q.type))) return EINVAL;
  const ibv_context* ctx = q.self->qpx.qp_base.context;
  // IBTA 9.8.2: a UD request carries its destination, an address handle of this device.
  if (q.type == IBV_QPT_UD && (!wr->wr.ud.ah || wr->wr.ud.ah->context != ctx)) return EINVAL;
  if (r.kind == WrKind::kAtomic) {
    // IBTA 9.4.5: the original remote quadword lands in one 8-byte buffer.
    if (wr->num_sge != 1 || wr->sg_list[0].length < 8) return EINVAL;
    if (wr->send_flags & IBV_SEND_INLINE) return EINVAL;
  } else if (r.kind == WrKind::kFlush || r.kind == WrKind::kAtomicWrite) {
    if (wr->num_sge < 0 || uint32_t(wr->num_sge) > q.cap.max_send_sge) return EINVAL;
    return validate_a19(wr, opcode);  // ATOMIC WRITE's 8 bytes may be inline, whatever max_inline_data
  } else if (r.kind == WrKind::kLocal) {
    // Local operations have no scatter list. Type 1 windows are bound with
    // ibv_bind_mw(3), not through the send queue.
    if (opcode == IBV_WR_BIND_MW &&
        (!wr->bind_mw.mw || wr->bind_mw.mw->type != IBV_MW_TYPE_2 || wr->bind_mw.mw->context != ctx))
      return EINVAL;
    return 0;
  }
  if (wr->num_sge < 0 || uint32_t(wr->num_sge) > q.cap.max_send_sge) return EINVAL;
  if (wr->send_flags & IBV_SEND_INLINE) {
    if (r.flags & kWrNoInline) return EINVAL;
    uint64_t len = 0;
    for (int i = 0; i < wr->num_sge; ++i) len += wr->sg_list[i].length;
    if (len > q.cap.max_inline_data) return EINVAL;
  }
  return 0;
}

void to_send_wqe(const ProcessQp& q, const ibv_send_wr* wr, shm::SendWqe& w) {
  const uint32_t opcode = opcode_of(wr);
  w.wr_id = wr->wr_id;
  w.opcode = opcode;
  w.send_flags = wr->send_flags & ~(kInlineCaptured | kFlushBuilt);
  w.imm_data = wr->imm_data;
  w.num_sge = 0;
  w.inline_len = 0;
  w.invalidate_rkey = wr->invalidate_rkey;
  w.xrc_srqn = q.type == IBV_QPT_XRC_SEND ? wr->qp_type.xrc.remote_srqn : 0;
  if (opcode == IBV_WR_BIND_MW) {
    const ibv_mw_bind_info& b = wr->bind_mw.bind_info;
    w.mw_handle = wr->bind_mw.mw->handle;
    w.rkey = wr->bind_mw.rkey;
    w.mr_key = b.mr ? b.mr->lkey : 0;
    w.remote_addr = b.addr;
    w.compare_add = b.length;
    w.mw_access = b.mw_access_flags;
    return;
  }
  if (opcode == IBV_WR_LOCAL_INV) return;
  if (opcode == uint32_t(abi::kWrFlush)) {  // no scatter list; compare_add the length, swap the FETH's fields
    w.remote_addr = wr->wr.atomic.remote_addr;
    w.rkey = wr->wr.atomic.rkey;
    w.compare_add = wr->wr.atomic.compare_add;
    w.swap = wr->wr.atomic.swap;
    return;
  }
  // Only requests that carry data have a scatter list; validate_wr() bounded
  // num_sge for them. (Found by fuzz/wr_fuzz.cc: LOCAL_INV with a large
  // num_sge overflowed w.sge.)
  w.num_sge = uint32_t(wr->num_sge);
  for (int i = 0; i < wr->num_sge; ++i) w.sge[i] = {wr->sg_list[i].addr, wr->sg_list[i].length, wr->sg_list[i].lkey};
  if (q.type == IBV_QPT_UD) {  // UD work requests carry an address, not an rkey
    const Ah* ah = reinterpret_cast<const Ah*>(wr->wr.ud.ah);
    w.ud_qpn = wr->wr.ud.remote_qpn & 0xffffff;
    w.ud_qkey = wr->wr.ud.remote_qkey;
    w.ud_grh = ah->attr.is_global;
    w.ud_dlid = ah->attr.dlid;
    std::memcpy(w.ud_dgid, ah->attr.grh.dgid.raw, 16);
    w.remote_addr = 0;
    w.rkey = 0;
    return;
  }
  if (wr_rule(opcode).kind == WrKind::kAtomic) {
    w.remote_addr = wr->wr.atomic.remote_addr;
    w.rkey = wr->wr.atomic.rkey;
    w.compare_add = wr->wr.atomic.compare_add;
    w.swap = wr->wr.atomic.swap;
  } else {
    w.remote_addr = wr->wr.rdma.remote_addr;
    w.rkey = wr->wr.rdma.rkey;
  }
}

uint64_t supported_send_ops(ibv_qp_type type) {
  uint64_t ops = 0;
  for (const WrRule& r : rules::kOpcodeRules)
    if (r.qp_types & qp_type_bit(type)) ops |= r.ex_flag;
  return ops;
}

ibv_wc_opcode send_wc_opcode(uint32_t op) { return rules::send_completion_opcode(op); }

}  // namespace sv::verbs
