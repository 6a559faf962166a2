// Queue pairs: creation, the modify/query verbs (the state machine itself
// is checked by the daemon, src/common/qp_state.cc), receive posting and
// flushing. The requester (post_send) is in requester.cc.
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "verbs/provider.h"
#include "verbs/transport.h"
#include "verbs/roce_link.h"

namespace sv::verbs {

int attach_qp_segment(ProcessQp& q, int fd, uint64_t size) {
  if (int e = map_shared(fd, 0, size, PROT_READ | PROT_WRITE, false, q.seg)) return e;
  auto* h = q.seg.as<shm::QpSegmentHeader>();
  shm::QpLayout l{h->sq_capacity, h->rq_capacity};
  if (h->magic != shm::kQpMagic || h->size != size || l.size() > size) return EPROTO;
  q.hdr = h;
  auto* sqh = reinterpret_cast<shm::RingHeader*>(q.seg.as<char>() + l.sq_offset());
  auto* rqh = reinterpret_cast<shm::RingHeader*>(q.seg.as<char>() + l.rq_offset());
  q.sq = shm::Ring<shm::SendWqe>(sqh, reinterpret_cast<shm::RingSlot<shm::SendWqe>*>(sqh + 1));
  q.rq = shm::Ring<shm::RecvWqe>(rqh, reinterpret_cast<shm::RingSlot<shm::RecvWqe>*>(rqh + 1));
  return 0;
}

namespace {

void flush_rq_into(shm::Ring<shm::RecvWqe>& rq, CqView& cq, uint32_t qpn) {
  shm::RecvWqe w;
  while (rq.pop(w)) {
    ibv_wc wc{};
    wc.wr_id = w.wr_id;
    wc.status = IBV_WC_WR_FLUSH_ERR;
    wc.opcode = IBV_WC_RECV;
    wc.qp_num = qpn;
    cq.push(wc, true);
  }
}

}  // namespace

void flush_sq_locked(ProcessQp& q) {
  if (!q.send_cq) return;  // an XRC target: no send queue
  // Pipelined requests in flight complete through the daemon first (their
  // completions come before the flushed ones).
  mediated_drain(q);
  // Each flushed request is recorded as the one being carried out
  // (sq_running, cleared as its completion is published): a flusher killed
  // after taking it off the queue leaves it to the next holder of the send
  // lock, which completes it in error (complete_dead_run).
  complete_dead_run(q);
  for (const shm::SendWqe* head; (head = q.sq.front());) {
    shm::SendWqe w = *head;
    q.hdr->sq_running.store(q.sq.head() + 1, std::memory_order_relaxed);
    shm::SendWqe gone;
    q.sq.pop(gone);
    ibv_wc wc{};
    wc.wr_id = w.wr_id;
    wc.status = IBV_WC_WR_FLUSH_ERR;
    wc.opcode = send_wc_opcode(w.opcode);
    wc.qp_num = q.qpn;
    if (!q.send_cq->st->view.push(wc, true, &q.hdr->sq_running)) q.hdr->sq_running.store(0, std::memory_order_relaxed);
  }
  q.head_started = false;
}

void flush_rq(ProcessQp& q) {
  if (q.recv_cq) flush_rq_into(q.rq, q.recv_cq->st->view, q.qpn);
}

void flush_peer_rq(Peer& p) { flush_rq_into(p.rq, p.recv_cq, p.qpn); }

void flush_qp(ProcessQp& q) {
  q.hdr->send_lock.lock(self_pid());
  flush_sq_locked(q);
  q.hdr->send_lock.unlock();
  flush_rq(q);
}

// Moves the QP to ERR after an error completion (IBTA 10.3.1: a requester
// error takes the QP to the error state); the caller holds the send lock.
void enter_error_state(ProcessQp& q) {
  ContextState& cs = *q.ctx->st;
  proto::ModifyQpReq req{};
  req.qpn = q.qpn;
  req.attr_mask = IBV_QP_STATE;
  req.qp_state = IBV_QPS_ERR;
  proto::Empty rep{};
  cs.conn.call<proto::Op::ModifyQp>(req, rep);
  {
    // ibv_qp::state too: ibv_modify_qp writes it from the application's thread.
    std::lock_guard<std::mutex> g(q.attr_mu);
    q.attr.qp_state = IBV_QPS_ERR;
    reinterpret_cast<ibv_qp*>(&to_qp_from_state(q)->qpx)->state = IBV_QPS_ERR;
  }
}

void flush_queues(ProcessQp& q) {
  flush_sq_locked(q);
  flush_rq(q);
}

void move_to_error(ProcessQp& q) {
  enter_error_state(q);
  flush_queues(q);
}

namespace {

// 0, or the errno for which ibv_create_qp_ex(3) refuses these attributes.
// An XRC initiator without a receive CQ gets its send CQ as one.
int check_qp_init_attr(ibv_context* c, ibv_qp_init_attr_ex* a) {
  if (a->comp_mask & ~uint32_t(IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_XRCD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS |
                               IBV_QP_INIT_ATTR_CREATE_FLAGS))
    return EOPNOTSUPP;
  // The mask bit with no flag set asks for nothing (rdma-core's tests set it
  // at random); a flag softverbs does not implement is refused, as rxe does.
  // The one flag offered: a UD QP's multicast sends skip the QP itself
  // (IBV_QP_CREATE_BLOCK_SELF_MCAST_LB, mckey -l; execute_ud).
  if ((a->comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS) &&
      (a->create_flags & ~uint32_t(IBV_QP_CREATE_BLOCK_SELF_MCAST_LB) ||
       (a->create_flags && a->qp_type != IBV_QPT_UD)))
    return EOPNOTSUPP;
  if (a->qp_type != IBV_QPT_RC && a->qp_type != IBV_QPT_UC && a->qp_type != IBV_QPT_UD &&
      a->qp_type != IBV_QPT_XRC_SEND && a->qp_type != IBV_QPT_XRC_RECV) return EOPNOTSUPP;
  // An XRC target QP (IBTA A14) has an XRC domain instead of a PD, CQs and
  // queues; an XRC initiator has no receive side (its receive CQ is optional).
  const bool tgt = a->qp_type == IBV_QPT_XRC_RECV;
  if (tgt) {
    if (!(a->comp_mask & IBV_QP_INIT_ATTR_XRCD) || !a->xrcd || a->xrcd->context != c || a->srq) return EINVAL;
  } else {
    if (a->qp_type == IBV_QPT_XRC_SEND && !a->recv_cq) a->recv_cq = a->send_cq;
    if (!(a->comp_mask & IBV_QP_INIT_ATTR_PD) || !a->pd || !a->send_cq || !a->recv_cq) return EINVAL;
    if (a->qp_type == IBV_QPT_XRC_SEND && a->srq) return EINVAL;
  }
  // ibv_create_qp_ex(3): an op the device cannot do on this QP type fails
  // the create (EOPNOTSUPP, as rdma-core's providers answer).
  const bool extended = a->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
  if (extended && (a->send_ops_flags & ~supported_send_ops(a->qp_type))) return EOPNOTSUPP;
  if (a->srq && (a->srq->context != c || a->qp_type == IBV_QPT_UD)) return EINVAL;
  ibv_qp_cap& cap = a->cap;
  if (cap.max_send_wr > shm::kMaxQpWr || cap.max_recv_wr > shm::kMaxQpWr || cap.max_send_sge > shm::kMaxSge ||
      cap.max_recv_sge > shm::kMaxSge || cap.max_inline_data > shm::kMaxInline) return EINVAL;
  if (!tgt && (a->pd->context != c || a->send_cq->context != c || a->recv_cq->context != c)) return EINVAL;
  return 0;
}

// The daemon's CreateQp request for attributes check_qp_init_attr accepted
// (and create_qp_ex trimmed to the QP type's queues).
proto::CreateQpReq create_qp_request(const ibv_qp_init_attr_ex* a) {
  const bool tgt = a->qp_type == IBV_QPT_XRC_RECV;
  const ibv_qp_cap& cap = a->cap;
  proto::CreateQpReq req{};
  req.pd = tgt ? 0 : to_pd(a->pd)->handle;
  req.send_cq = tgt ? 0 : to_cq(a->send_cq)->st->handle;
  req.recv_cq = tgt ? 0 : to_cq(a->recv_cq)->st->handle;
  req.xrcd = tgt ? xrcd_handle(a->xrcd) : 0;
  req.srq = a->srq ? reinterpret_cast<Srq*>(a->srq)->st->handle : 0;
  req.qp_type = a->qp_type;
  req.max_send_wr = cap.max_send_wr;
  req.max_recv_wr = cap.max_recv_wr;
  req.max_send_sge = cap.max_send_sge;
  req.max_recv_sge = cap.max_recv_sge;
  req.max_inline_data = cap.max_inline_data;
  req.sq_sig_all = a->sq_sig_all;
  return req;
}

// The application's ibv_qp for the daemon's QP number qpn, in RESET, its
// private state not yet attached; nullptr when out of memory.
QpHandle* new_qp_object(ibv_context* c, const ibv_qp_init_attr_ex* a, uint32_t qpn) {
  const bool tgt = a->qp_type == IBV_QPT_XRC_RECV;
  auto* qp = static_cast<QpHandle*>(std::calloc(1, sizeof(QpHandle)));
  if (!qp) return nullptr;
  ibv_qp& q = qp->qpx.qp_base;
  q.context = c;
  q.qp_context = a->qp_context;
  q.pd = tgt ? nullptr : a->pd;
  q.send_cq = tgt ? nullptr : a->send_cq;
  q.recv_cq = tgt ? nullptr : a->recv_cq;
  q.srq = a->srq;
  q.handle = qpn;
  q.qp_num = qpn;
  q.state = IBV_QPS_RESET;
  q.qp_type = a->qp_type;
  pthread_mutex_init(&q.mutex, nullptr);
  pthread_cond_init(&q.cond, nullptr);
  return qp;
}

}  // namespace

ibv_qp* create_qp_ex(ibv_context* c, ibv_qp_init_attr_ex* a) {
  if (int e = check_qp_init_attr(c, a)) {
    errno = e;
    return nullptr;
  }
  const bool tgt = a->qp_type == IBV_QPT_XRC_RECV;
  const bool extended = a->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
  ibv_qp_cap& cap = a->cap;
  if (a->qp_type == IBV_QPT_XRC_SEND || tgt) cap.max_recv_wr = cap.max_recv_sge = 0;
  if (tgt) cap.max_send_wr = cap.max_send_sge = cap.max_inline_data = 0;
  ContextState& cs = ctx_state(c);
  proto::CreateQpReq req = create_qp_request(a);
  proto::CreateQpReply rep{};
  std::vector<Fd> fds;
  if (int e = cs.conn.call<proto::Op::CreateQp>(req, rep, {}, &fds)) {
    errno = e;
    return nullptr;
  }
  auto st = std::make_unique<ProcessQp>();
  st->ctx = to_ctx(c);
  st->qpn = rep.qpn;
  st->type = a->qp_type;
  // A parent domain stands for its protection domain, whose lifetime the
  // daemon ties to the QP's; a thread domain in it makes the QP lockless.
  Pd* qp_pd = tgt ? nullptr : to_pd(a->pd);
  st->pd = qp_pd && qp_pd->protection ? qp_pd->protection : qp_pd;
  st->lockless = qp_pd && qp_pd->td;
  st->send_cq = tgt ? nullptr : to_cq(a->send_cq);
  st->recv_cq = tgt ? nullptr : to_cq(a->recv_cq);
  st->srq = a->srq ? reinterpret_cast<Srq*>(a->srq) : nullptr;
  for (Cq* cq : {st->send_cq, st->recv_cq})
    if (cq) keep_qp_completions(cq, rep.qpn);
  st->entry = cs.qp_slot(rep.qpn);
  if (int e = attach_qp_segment(*st, fds[0].get(), rep.segment_size)) {
    errno = e;
    return nullptr;
  }
  // Report what the QP really holds (ibv_create_qp(3): at least what was asked).
  cap.max_send_wr = rep.sq_capacity;
  cap.max_recv_wr = rep.rq_capacity;
  cap.max_send_sge = shm::kMaxSge;
  cap.max_recv_sge = shm::kMaxSge;
  cap.max_inline_data = shm::kMaxInline;
  st->cap = cap;
  st->sq_sig_all = a->sq_sig_all != 0;
  st->block_self_mcast =
      (a->comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS) && (a->create_flags & IBV_QP_CREATE_BLOCK_SELF_MCAST_LB);
  // Before anyone learns the QP number: importers refuse such a QP.
  if (st->lockless) st->hdr->exclusive.store(1, std::memory_order_release);
  if (extended) st->hdr->send_ops.store(a->send_ops_flags | shm::kSendOpsExtended, std::memory_order_release);
  st->attr.qp_state = IBV_QPS_RESET;
  st->attr.cap = cap;

  QpHandle* qp = new_qp_object(c, a, rep.qpn);
  if (!qp) {
    errno = ENOMEM;
    return nullptr;
  }
  ibv_qp& q = qp->qpx.qp_base;
  st->self = qp;
  choose_transport(*st);
  qp->st = st.release();
  if (extended) init_qp_ex(qp, a->send_ops_flags);
  std::lock_guard<std::mutex> g(cs.mu);
  cs.qp_handles[rep.qpn] = qp;
  return &q;
}

SV_HOT int post_recv(ibv_qp* ibqp, ibv_recv_wr* wr, ibv_recv_wr** bad) {
  ProcessQp& q = *to_qp(ibqp)->st;
  auto state = ibv_qp_state(q.entry->state.load(std::memory_order_acquire));
  // Destroyed by another sharer: the handle is stale.
  if (q.ctx->st->dead.load(std::memory_order_relaxed)) {
    *bad = wr;
    return EIO;
  }
  // A QP attached to an SRQ takes its receives from there (ibv_post_recv(3):
  // EINVAL); XRC QPs have no receive queue (their SRQs do).
  if (state == IBV_QPS_RESET || q.srq || q.type == IBV_QPT_XRC_SEND || q.type == IBV_QPT_XRC_RECV ||
      q.entry->qpn.load(std::memory_order_relaxed) != q.qpn) {
    *bad = wr;
    return EINVAL;
  }
  for (; wr; wr = wr->next) {
    const int num_sge = wr->num_sge;  // read once (push_recv_wqe)
    if (num_sge < 0 || uint32_t(num_sge) > q.cap.max_recv_sge) {
      *bad = wr;
      return EINVAL;
    }
    if (!push_recv_wqe(q.rq, *wr, uint32_t(num_sge))) {
      *bad = wr;
      return ENOMEM;
    }
  }
  // Receives posted to a QP in ERR complete at once with a flush error.
  if (q.entry->state.load(std::memory_order_acquire) == IBV_QPS_ERR) flush_rq(q);
  // The slot of the next receive was last written by the sender that took
  // it (its sequence): fetch it now rather than in the next post's path.
  q.rq.prefetch_next_push();
  return 0;
}


}  // namespace sv::verbs

using namespace sv;
using namespace sv::verbs;

namespace {

// The daemon's request for ibv_modify_qp: the attributes `mask` names.
int modify_request(const ProcessQp& q, const ibv_qp_attr& attr, int mask, proto::ModifyQpReq& req) {
  req.qpn = q.qpn;
  req.attr_mask = uint32_t(mask);
  req.qp_state = attr.qp_state;
  req.cur_qp_state = attr.cur_qp_state;
  req.path_mtu = attr.path_mtu;
  req.qkey = attr.qkey;
  req.rq_psn = attr.rq_psn;
  req.sq_psn = attr.sq_psn;
  req.dest_qp_num = attr.dest_qp_num;
  req.qp_access_flags = uint32_t(attr.qp_access_flags);
  req.pkey_index = attr.pkey_index;
  req.port_num = attr.port_num;
  req.max_rd_atomic = attr.max_rd_atomic;
  req.max_dest_rd_atomic = attr.max_dest_rd_atomic;
  req.min_rnr_timer = attr.min_rnr_timer;
  req.timeout = attr.timeout;
  req.retry_cnt = attr.retry_cnt;
  req.rnr_retry = attr.rnr_retry;
  if (mask & IBV_QP_AV) {
    const ibv_ah_attr& ah = attr.ah_attr;
    req.ah_port_num = ah.port_num;
    req.ah_is_global = ah.is_global;
    req.ah_dlid = ah.dlid;
    if (ah.is_global) {
      if (ah.grh.sgid_index >= kGidTableLen) return EINVAL;
      req.ah_sgid_index = ah.grh.sgid_index;
      std::memcpy(req.ah_dgid, ah.grh.dgid.raw, 16);
    }
  }
  if ((mask & IBV_QP_CAP) != 0) return EINVAL;  // resizing a QP's queues is not supported
  return 0;
}

// What ibv_query_qp answers, once the daemon accepted the change.
void remember_attr(ProcessQp& q, const ibv_qp_attr& attr, int mask, ibv_qp_state next) {
  std::lock_guard<std::mutex> g(q.attr_mu);
  ibv_qp_attr& s = q.attr;
  if (mask & IBV_QP_PKEY_INDEX) s.pkey_index = attr.pkey_index;
  if (mask & IBV_QP_PORT) s.port_num = attr.port_num;
  if (mask & IBV_QP_ACCESS_FLAGS) s.qp_access_flags = attr.qp_access_flags;
  if (mask & IBV_QP_AV) s.ah_attr = attr.ah_attr;
  if (mask & IBV_QP_PATH_MTU) s.path_mtu = attr.path_mtu;
  if (mask & IBV_QP_DEST_QPN) s.dest_qp_num = attr.dest_qp_num;
  if (mask & IBV_QP_RQ_PSN) s.rq_psn = attr.rq_psn;
  if (mask & IBV_QP_SQ_PSN) s.sq_psn = attr.sq_psn;
  if (mask & IBV_QP_MAX_DEST_RD_ATOMIC) s.max_dest_rd_atomic = attr.max_dest_rd_atomic;
  if (mask & IBV_QP_MAX_QP_RD_ATOMIC) s.max_rd_atomic = attr.max_rd_atomic;
  if (mask & IBV_QP_MIN_RNR_TIMER) s.min_rnr_timer = attr.min_rnr_timer;
  if (mask & IBV_QP_TIMEOUT) s.timeout = attr.timeout;
  if (mask & IBV_QP_RETRY_CNT) s.retry_cnt = attr.retry_cnt;
  if (mask & IBV_QP_RNR_RETRY) s.rnr_retry = attr.rnr_retry;
  if (mask & IBV_QP_QKEY) s.qkey = attr.qkey;
  s.qp_state = next;
}

// RESET discards both queues without completions (IBTA 10.3.1).
void reset_queues(ProcessQp& q, ibv_qp_state was) {
  q.hdr->send_lock.lock(self_pid());
  mediated_drain(q);  // nothing of a pipelined run lands after the reset
  q.med_sync_head = false;
  shm::SendWqe sw;
  while (q.sq.pop(sw)) {
  }
  q.hdr->sq_running.store(0, std::memory_order_relaxed);  // nothing is owed for a discarded request
  q.head_started = false;
  q.peer.reset();
  q.last_window.reset();
  choose_transport(q);  // off the wire, no peer
  q.hdr->send_lock.unlock();
  shm::RecvWqe rw;
  while (q.rq.pop(rw)) {
  }
  // Restarted from an error state: its completions still in its CQs
  // (flushed work requests, mostly) go too (cq.cc clean_cq).
  if (was == IBV_QPS_ERR || was == IBV_QPS_SQE) {
    if (q.send_cq) clean_cq(ibv_cq_ex_to_cq(&q.send_cq->cq), q.qpn);
    if (q.recv_cq && q.recv_cq != q.send_cq) clean_cq(ibv_cq_ex_to_cq(&q.recv_cq->cq), q.qpn);
  }
}

}  // namespace

extern "C" {

ibv_qp* ibv_create_qp(ibv_pd* pd, ibv_qp_init_attr* attr) {
  if (!pd || !attr) {
    errno = EINVAL;
    return nullptr;
  }
  ibv_qp_init_attr_ex ex{};
  ex.qp_context = attr->qp_context;
  ex.send_cq = attr->send_cq;
  ex.recv_cq = attr->recv_cq;
  ex.srq = attr->srq;
  ex.cap = attr->cap;
  ex.qp_type = attr->qp_type;
  ex.sq_sig_all = attr->sq_sig_all;
  ex.comp_mask = IBV_QP_INIT_ATTR_PD;
  ex.pd = pd;
  ibv_qp* qp = create_qp_ex(pd->context, &ex);
  if (qp) attr->cap = ex.cap;
  return qp;
}

int ibv_modify_qp(ibv_qp* ibqp, ibv_qp_attr* attr, int mask) {
  ProcessQp& q = *to_qp(ibqp)->st;
  proto::ModifyQpReq req{};
  if (int e = modify_request(q, *attr, mask, req)) return e;
  const auto was = ibv_qp_state(q.entry->state.load(std::memory_order_acquire));
  proto::Empty rep{};
  if (int e = q.ctx->st->conn.call<proto::Op::ModifyQp>(req, rep)) return e;

  ibv_qp_state next;
  {
    // ibv_qp::state is also written by the progress thread (move_to_error).
    std::lock_guard<std::mutex> g(q.attr_mu);
    next = (mask & IBV_QP_STATE) ? attr->qp_state : ibqp->state;
    ibqp->state = next;
  }
  remember_attr(q, *attr, mask, next);
  if (mask & IBV_QP_STATE) {
    // A peer on another host: the QP goes on the wire at RTR (roce_link.h).
    ibv_qp_attr now;
    {
      std::lock_guard<std::mutex> g(q.attr_mu);
      now = q.attr;
    }
    if (int e = roce_on_modify(q, now, mask, next)) return e;
  }
  if (next == IBV_QPS_RTR) {
    // The path is chosen here: on the wire or not (roce_on_modify above).
    // RTR comes from INIT, after RESET: no peer is connected yet.
    q.hdr->send_lock.lock(self_pid());
    choose_transport(q);
    q.hdr->send_lock.unlock();
  } else if (next == IBV_QPS_ERR) {
    flush_qp(q);
  } else if (next == IBV_QPS_RESET) {
    reset_queues(q, was);
  }
  return 0;
}

int ibv_query_qp(ibv_qp* ibqp, ibv_qp_attr* attr, int, ibv_qp_init_attr* init) {
  ProcessQp& q = *to_qp(ibqp)->st;
  {
    std::lock_guard<std::mutex> g(q.attr_mu);
    *attr = q.attr;
  }
  attr->qp_state = ibv_qp_state(q.entry->state.load(std::memory_order_acquire));
  attr->cur_qp_state = attr->qp_state;
  attr->cap = q.cap;
  if (init) {
    std::memset(init, 0, sizeof(*init));
    init->qp_context = ibqp->qp_context;
    init->send_cq = ibqp->send_cq;
    init->recv_cq = ibqp->recv_cq;
    init->srq = ibqp->srq;
    init->cap = q.cap;
    init->qp_type = ibqp->qp_type;
    init->sq_sig_all = q.sq_sig_all;
  }
  return 0;
}

int ibv_destroy_qp(ibv_qp* ibqp) {
  QpHandle* qp = to_qp(ibqp);
  ProcessQp& q = *qp->st;
  ContextState& cs = *q.ctx->st;
  proto::HandleReq req{};
  req.handle = q.qpn;
  proto::Empty rep{};
  if (int e = destroy_result(cs, cs.conn.call<proto::Op::DestroyQp>(req, rep))) return e;
  {
    std::lock_guard<std::mutex> g(cs.mu);
    cs.qp_handles.erase(q.qpn);
  }
  progress_unregister(&q);
  roce_detach(q);
  // Its completions go with it, those waiting and any still on their way.
  if (q.send_cq) forget_qp_completions(q.send_cq, q.qpn);
  if (q.recv_cq && q.recv_cq != q.send_cq) forget_qp_completions(q.recv_cq, q.qpn);
  pthread_cond_destroy(&ibqp->cond);
  pthread_mutex_destroy(&ibqp->mutex);
  delete qp->st;
  std::free(qp);
  return 0;
}

}  // extern "C"
