// Memory windows (ibv_alloc_mw(3), ibv_bind_mw(3)): windows are entries of
// the daemon's key table like MRs; binding and invalidating them are daemon
// calls, made in work-request order by the requester for type 2 windows.
#include <cerrno>
#include <cstdlib>

#include "verbs/provider.h"

namespace sv::verbs {

ibv_mw* alloc_mw(ibv_pd* pd, ibv_mw_type type) {
  ContextState& st = ctx_state(pd->context);
  proto::AllocMwReq req{};
  req.pd = to_pd(pd)->handle;
  req.type = type;
  proto::KeyReply rep{};
  if (int e = st.conn.call<proto::Op::AllocMw>(req, rep)) {
    errno = e;
    return nullptr;
  }
  auto* mw = static_cast<ibv_mw*>(std::calloc(1, sizeof(ibv_mw)));
  if (!mw) {
    errno = ENOMEM;
    return nullptr;
  }
  mw->context = pd->context;
  mw->pd = pd;
  mw->rkey = rep.key;
  mw->handle = rep.handle;
  mw->type = type;
  return mw;
}

int dealloc_mw(ibv_mw* mw) {
  ContextState& st = ctx_state(mw->context);
  proto::HandleReq req{};
  req.handle = mw->handle;
  proto::Empty rep{};
  if (int e = destroy_result(st, st.conn.call<proto::Op::DeallocMw>(req, rep))) return e;
  std::free(mw);
  return 0;
}

int daemon_bind(ProcessQp& q, uint32_t mw_handle, uint32_t new_key, const ibv_mw_bind_info& b, uint32_t* key_out) {
  proto::BindMwReq req{};
  req.mw = mw_handle;
  req.qpn = q.qpn;
  req.mr_key = b.mr ? b.mr->lkey : 0;
  req.new_key = new_key;
  req.addr = b.addr;
  req.length = b.length;
  req.access = b.mw_access_flags;
  proto::KeyReply rep{};
  int e = q.ctx->st->conn.call<proto::Op::BindMw>(req, rep);
  if (!e && key_out) *key_out = rep.key;
  return e;
}

// Type 1 bind: takes effect at once and, if signaled, completes on the send
// CQ with IBV_WC_BIND_MW; the window's new key is in mw->rkey.
int bind_mw(ibv_qp* ibqp, ibv_mw* mw, ibv_mw_bind* bind) {
  ProcessQp& q = *to_qp(ibqp)->st;
  if (q.entry->state.load(std::memory_order_acquire) != IBV_QPS_RTS) return EINVAL;
  uint32_t key = 0;
  q.hdr->send_lock.lock(self_pid());
  int e = daemon_bind(q, mw->handle, 0, bind->bind_info, &key);
  if (!e) {
    mw->rkey = key;
    if ((bind->send_flags & IBV_SEND_SIGNALED) || q.sq_sig_all) {
      ibv_wc wc{};
      wc.wr_id = bind->wr_id;
      wc.status = IBV_WC_SUCCESS;
      wc.opcode = IBV_WC_BIND_MW;
      wc.qp_num = q.qpn;
      q.send_cq->st->view.push(wc, true);
    }
  }
  q.hdr->send_lock.unlock();
  return e;
}

}  // namespace sv::verbs
