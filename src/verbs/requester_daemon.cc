// The requester's requests that the daemon carries out: binds of type 2
// windows and local invalidations (IBTA 10.6.7.2.5, 10.6.7.3), which act on
// this side only, and every request of a QP whose peer belongs to another
// user (the mediated path, transport.h), which the daemon executes between
// the two processes' memory with every key checked (daemon/mediation.cc).
#include <cstring>

#include "verbs/provider.h"
#include "verbs/transport.h"
#include "verbs/wr_rules.h"

namespace sv::verbs {

// Binds and local invalidations act on this side only (no peer needed).
Outcome execute_local(QpState& q, const shm::SendWqe& w) {
  ContextState& cs = *q.ctx->st;
  if (w.opcode == IBV_WR_BIND_MW) {
    const MrEntry* me = cs.mr(w.mr_key);
    ibv_mw_bind_info b{};
    b.addr = w.remote_addr;
    b.length = w.compare_add;
    b.mw_access_flags = w.mw_access;
    ibv_mr fake{};
    fake.lkey = w.mr_key;
    b.mr = me ? &fake : nullptr;
    if (daemon_bind(q, w.mw_handle, w.rkey, b, nullptr)) return {Step::kError, IBV_WC_MW_BIND_ERR};
    return {Step::kDone};
  }
  proto::InvalidateReq req{};
  req.key = w.invalidate_rkey;
  req.qpn = q.qpn;
  proto::Empty rep{};
  if (cs.conn.call<proto::Op::InvalidateKey>(req, rep)) return {Step::kError, IBV_WC_MW_BIND_ERR};
  return {Step::kDone};
}

// A peer of another user (system daemon): the daemon carries the operation
// out between the two processes' memory with every key checked
// (daemon/mediation.cc); one round trip per work request.
Outcome execute_mediated(QpState& q, const shm::SendWqe& w) {
  proto::MediateReq req{};
  req.qpn = q.qpn;
  req.opcode = w.opcode;
  req.send_flags = w.send_flags & ~kInlineCaptured;
  req.imm_data = w.imm_data;
  req.remote_addr = w.remote_addr;
  req.rkey = w.rkey;
  req.compare_add = w.compare_add;
  req.swap = w.swap;
  req.num_sge = w.num_sge;
  std::memcpy(req.sge, w.sge, sizeof(req.sge));
  if (w.send_flags & IBV_SEND_INLINE) {
    // The payload travels in the request: it need not be registered.
    if (w.send_flags & kInlineCaptured) {
      req.inline_len = w.inline_len;
      std::memcpy(req.inline_data, w.inline_data, w.inline_len);
    } else {
      for (uint32_t i = 0; i < w.num_sge; ++i) {
        if (req.inline_len + w.sge[i].length > shm::kMaxInline) return {Step::kError, IBV_WC_LOC_LEN_ERR};
        std::memcpy(req.inline_data + req.inline_len, reinterpret_cast<const void*>(w.sge[i].addr), w.sge[i].length);
        req.inline_len += w.sge[i].length;
      }
    }
  }
  proto::MediateReply rep{};
  if (q.ctx->st->conn.call<proto::Op::Mediate>(req, rep)) return {Step::kRetry};
  switch (rep.outcome) {
    case proto::kMediateDone: return {Step::kDone, IBV_WC_SUCCESS, false, rep.byte_len};
    case proto::kMediateRnr: return {Step::kRnr};
    case proto::kMediateRetry: return {Step::kRetry};
    default: return {Step::kError, ibv_wc_status(rep.wc_status), rep.peer_error != 0};
  }
}

}  // namespace sv::verbs
