// qp_reach.cc: which CQs and SRQs a client's QPs reach, the QPs a CQ error
// ends, and XRC QPs (IBTA annex A14;
// ibv_open_qp(3)): the target's SRQ a request names, and further handles of
// a target QP. The domains are XrcDomains' (xrc.h), the SRQs
// SharedReceiveQueues' (srq.h).
#include "daemon/registry.h"

#include <cerrno>

namespace sv::daemon {

using namespace sv::shm;

bool Registry::may_complete_into(uint32_t client, uint32_t handle) {
  auto it = cq_.table().find(handle);
  if (it == cq_.table().end()) return false;
  uint32_t c = ctx(client);
  if (it->second.owner == c) return true;
  if (!same_user(client, it->second.owner)) return false;  // another user's peers are mediated
  // A requester pushes receive completions into the CQ of the QP it reaches:
  // its connected peer, or (UD) any UD QP.
  // Only the caller's QPs, and the QPs and SRQs of the CQ's context (a QP's
  // or an XRC SRQ's CQ is of its own context) are looked at.
  bool has_ud = false;
  for (uint32_t qpn : qps_.of(c)) {
    has_ud |= qps_.at(qpn).type == IBV_QPT_UD;
    auto peer = qps_.find(qp_slot(qpn).dest_qpn.load());
    if (peer != qps_.end() && peer->second.recv_cq == handle) return true;
  }
  const uint32_t cq_owner = it->second.owner;
  if (has_ud)
    for (uint32_t qpn : qps_.of(cq_owner))
      if (const Qp& q = qps_.at(qpn); q.type == IBV_QPT_UD && q.recv_cq == handle) return true;
  for (uint32_t h : srq_.table().of(cq_owner))
    if (const Srq& srq = srq_.table().at(h); srq.cq == handle && xrc_reaches_srq(c, srq)) return true;
  return false;
}

// IBTA 11.4.2.1 and 10.10.2.3: a CQ overrun is a CQ error; every QP
// completing into the CQ goes to ERR. A QP completes only into CQs of its
// own context (check_create_qp), and such a QP keeps its context.
void Registry::qps_error_on_cq(uint32_t context, uint32_t cq) {
  for (uint32_t qpn : qps_.of(context)) {
    const Qp& q = qps_.at(qpn);
    if (q.send_cq != cq && q.recv_cq != cq) continue;
    QpEntry& e = qp_slot(qpn);
    if (ibv_qp_state(e.state.load()) == IBV_QPS_RESET) continue;
    e.state.store(IBV_QPS_ERR, std::memory_order_release);
  }
}

// The MR a key names for the client: its own MR by its own key, or (`reach`)
// the MR of an MR's or a bound window's key that the client's QPs reach.
int Registry::mr_by_key(uint32_t client, uint32_t key, bool reach, Object*& out) {
  out = nullptr;
  const MrEntry* e = mr_.entry(key);
  if (!e) return EINVAL;
  if (!reach) {  // the caller's own MR, by its own key
    Mr* mr = mr_.table().get(key >> 8);
    if (e->kind != kKindMr || !mr || mr->owner != ctx(client)) return EINVAL;
    out = mr;
    return 0;
  }
  uint32_t mr_slot = key >> 8;
  const ObjectTable<Mw>& windows = mr_.windows();
  if (auto w = windows.find(mr_slot); w != windows.end()) mr_slot = w->second.bound_mr;  // a window: its MR
  auto mr = mr_.table().find(mr_slot);
  if (mr == mr_.table().end()) return EINVAL;
  if (!same_user(client, mr->second.owner)) return EACCES;
  // A key grants access only to a process that owns the MR's PD, or that
  // holds a QP connected to a QP of that PD.
  const Pd* pd = pds_.get(mr->second.pd);
  bool allowed = pd && pd->owner == ctx(client);
  bool has_ud = false;
  for (uint32_t qpn : qps_.of(ctx(client))) {
    if (allowed) break;
    has_ud |= qps_.at(qpn).type == IBV_QPT_UD;
    auto peer = qps_.find(qp_slot(qpn).dest_qpn.load());
    if (peer != qps_.end() && peer->second.pd == mr->second.pd) allowed = true;
  }
  // The QPs and SRQs of a PD are of the PD's context: only those are looked at.
  const uint32_t pd_owner = pd ? pd->owner : 0;
  // A UD sender scatters into receive buffers of any UD QP of that PD.
  for (uint32_t qpn : pd && has_ud ? qps_.of(pd_owner) : std::vector<uint32_t>{}) {
    const Qp& q = qps_.at(qpn);
    if (!allowed && q.type == IBV_QPT_UD && q.pd == mr->second.pd) allowed = true;
  }
  // An XRC sender, into buffers posted to an XRC SRQ of that PD it reaches.
  for (uint32_t h : pd ? srq_.table().of(pd_owner) : std::vector<uint32_t>{}) {
    const Srq& s = srq_.table().at(h);
    if (!allowed && s.pd == mr->second.pd && xrc_reaches_srq(ctx(client), s)) allowed = true;
  }
  if (!allowed) return EACCES;
  out = &mr->second;
  return 0;
}

// Whether one of the context's XRC_SEND QPs is connected to a target QP of
// the SRQ's domain, i.e. may deliver into that SRQ.
bool Registry::xrc_reaches_srq(uint32_t context, const Srq& srq) {
  if (srq.type != IBV_SRQT_XRC) return false;
  for (uint32_t qpn : qps_.of(context)) {
    if (qps_.at(qpn).type != IBV_QPT_XRC_SEND) continue;
    auto t = qps_.find(qp_slot(qpn).dest_qpn.load());
    if (t != qps_.end() && t->second.type == IBV_QPT_XRC_RECV && t->second.xrcd == srq.xrcd) return true;
  }
  return false;
}

// Whether the client's QPs reach SRQ `handle`: its own, one an XRC QP of
// its context reaches, or a peer's connected both ways (a process of the
// SRQ owner's user). The SRQ limit event (SharedReceiveQueues::limit) is
// for such a sender only.
bool Registry::srq_reachable(uint32_t client, const Srq& srq, uint32_t handle) {
  const uint32_t c = ctx(client);
  if (srq.owner == c || xrc_reaches_srq(c, srq)) return true;
  if (!same_user(client, srq.owner)) return false;
  for (uint32_t qpn : qps_.of(c)) {
    const uint32_t dest = qp_slot(qpn).dest_qpn.load();
    auto peer = qps_.find(dest);
    if (peer != qps_.end() && peer->second.srq == handle && qp_slot(dest).dest_qpn.load() == qpn) return true;
  }
  return false;
}

// IBTA annex A14: an XRC message names the SRQ that takes it; the SRQ must be in
// the target QP's domain. EAGAIN: the target is not ready (the requester
// retries); ENOENT: no such SRQ there (an invalid request).
int Registry::connect_xrc(uint32_t client, const Qp& my_qp, const proto::ConnectXrcReq& req,
                          proto::ConnectPeerReply& rep, std::vector<int>& out_fds) {
  const Qp* qp = &my_qp;
  if (qp->type != IBV_QPT_XRC_SEND && qp->type != IBV_QPT_XRC_RECV) return EINVAL;
  // An XRC target whose initiator is on another host (docs/ROCE.md, XRC on
  // the wire): the caller runs the target's transport and asks for the SRQ
  // a request names, in the target's own XRC domain (IBTA annex A14).
  const bool wire_target = qp->type == IBV_QPT_XRC_RECV;
  uint32_t dest = wire_target ? req.qpn : qp_slot(req.qpn).dest_qpn.load();
  auto tgt = qps_.find(dest);
  if (tgt == qps_.end()) return EAGAIN;
  const QpEntry& te = qp_slot(dest);
  auto st = ibv_qp_state(te.state.load());
  if (tgt->second.type != IBV_QPT_XRC_RECV || (!wire_target && te.dest_qpn.load() != req.qpn)) return EAGAIN;
  // XRC is not mediated between users; the requester reads the target's
  // entry in its own user's device segment.
  if (!same_user(client, tgt->second.owner) || !same_tables(client, tgt->second.owner)) return EACCES;
  if (st != IBV_QPS_RTR && st != IBV_QPS_RTS) return EAGAIN;
  auto srq = srq_.table().find(req.srqn);
  if (srq == srq_.table().end() || srq->second.type != IBV_SRQT_XRC || srq->second.xrcd != tgt->second.xrcd) return ENOENT;
  auto cq = cq_.table().find(srq->second.cq);
  if (cq == cq_.table().end()) return ENOENT;
  rep.peer_qpn = dest;
  rep.peer_recv_cq = srq->second.cq;
  rep.qp_segment_size = tgt->second.map.size();
  rep.cq_segment_size = cq->second.map.size();
  out_fds.push_back(tgt->second.fd.get());
  out_fds.push_back(cq->second.fd.get());
  out_fds.push_back(srq->second.fd.get());
  rep.has_srq = 1;
  rep.srq_segment_size = srq->second.map.size();
  rep.srq_handle = req.srqn;
  rep.pd = srq->second.pd;
  rep.has_channel = 0;
  if (auto ch = cq_.channels().find(cq->second.channel); ch != cq_.channels().end()) {
    out_fds.push_back(ch->second.wake.get());
    rep.has_channel = 1;
  }
  return 0;
}

// ibv_open_qp(3): another handle of an XRC target QP, for a context that
// opened the QP's domain.
int Registry::open_qp(uint32_t client, const XrcdHandle& xh, const proto::OpenQpReq& req, proto::ImportQpReply& rep,
                      std::vector<int>& out_fds) {
  const uint32_t xrcd = xh.xrcd;
  auto it = qps_.find(req.qpn);
  if (it == qps_.end() || it->second.type != IBV_QPT_XRC_RECV || it->second.xrcd != xrcd) return EINVAL;
  Qp& q = it->second;
  q.holders.push_back(ctx(client));  // one entry per handle: each is destroyed on its own
  xrc_handles_.insert({ctx(client), req.qpn});
  rep.qp_type = q.type;
  rep.segment_size = q.map.size();
  out_fds.push_back(q.fd.get());
  return 0;
}

}  // namespace sv::daemon
