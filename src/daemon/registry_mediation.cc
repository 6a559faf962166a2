// The registry's tables as mediation sees them (MediationTables in
// mediation.h): the few lookups and actions a mediated operation needs, so
// that daemon/mediation.cc never touches the registry's maps.
#include "daemon/registry.h"

namespace sv::daemon {

using namespace shm;

bool Registry::requester_qp(uint32_t client, uint32_t qpn, QpView& out) {
  const Qp* q = find_qp(client, qpn);
  if (!q) return false;
  out = {q->type, q->pd, q->recv_cq};
  return true;
}

bool Registry::responder_qp(uint32_t qpn, QpView& out) {
  auto it = qps_.find(qpn);
  if (it == qps_.end()) return false;
  out = {it->second.type, it->second.pd, it->second.recv_cq};
  return true;
}

uint32_t Registry::mr_backing(uint32_t client, uint32_t handle) const {
  const Mr* m = mrs_.owned(handle, ctx(client));
  return m ? m->backing : 0;
}

int Registry::backing_fd(uint32_t backing) const {
  auto b = backings_.find(backing);
  return b == backings_.end() ? -1 : b->second.fd.get();
}

// The rings are located by the capacities recorded when they were made,
// not by the segment header's offsets, which the peer's process can write.
bool Registry::receive_queue(uint32_t qpn, RecvQueue& out) {
  auto it = qps_.find(qpn);
  if (it == qps_.end()) return false;
  Qp& q = it->second;
  if (q.srq) {
    auto s = srqs_.find(q.srq);
    if (s == srqs_.end()) return false;
    const uint32_t cap = s->second.capacity;
    auto* rh = reinterpret_cast<RingHeader*>(s->second.map.as<char>() + SrqLayout{cap}.ring_offset());
    out.ring = Ring<RecvWqe>(rh, reinterpret_cast<RingSlot<RecvWqe>*>(rh + 1), cap);
    out.srq = q.srq;
    out.srq_header = s->second.map.as<SrqSegmentHeader>();
    return true;
  }
  const QpLayout layout{q.sq_capacity, q.rq_capacity};
  auto* rqh = reinterpret_cast<RingHeader*>(q.map.as<char>() + layout.rq_offset());
  out.ring = Ring<RecvWqe>(rqh, reinterpret_cast<RingSlot<RecvWqe>*>(rqh + 1), layout.rq_capacity);
  out.srq = 0;
  out.srq_header = nullptr;
  return true;
}

void Registry::srq_limit_reached(uint32_t srq) {
  auto s = srqs_.find(srq);
  if (s == srqs_.end()) return;
  for (auto& [id, c] : clients_)
    if (c.ctx == s->second.owner) events_.push_back({id, IBV_EVENT_SRQ_LIMIT_REACHED, srq});
}

void Registry::flush_receives(uint32_t qpn) {
  auto it = qps_.find(qpn);
  if (it != qps_.end()) flush_rq(it->second, qpn);
}

int Registry::invalidate_remote(uint32_t client, uint32_t qpn, uint32_t key) {
  proto::InvalidateReq r{};
  r.key = key;
  r.qpn = qpn;
  r.remote = 1;
  return invalidate(client, r);
}

// The QP's own posted receives complete with flush errors (IBTA 10.3.1);
// an SRQ's receives belong to its other QPs too and stay.
void Registry::flush_rq(Qp& q, uint32_t qpn) {
  RecvQueue rq;
  if (q.srq || !receive_queue(qpn, rq)) return;
  RecvWqe w{};
  while (rq.ring.pop(w)) {
    ibv_wc wc{};
    wc.wr_id = w.wr_id;
    wc.status = IBV_WC_WR_FLUSH_ERR;
    wc.opcode = IBV_WC_RECV;
    wc.qp_num = qpn;
    push_cq(q.recv_cq, wc, true);
  }
}

}  // namespace sv::daemon
