// qp_reach.cc: what a client's QPs reach across the types' tables: the CQs
// it may complete into (HandleRule::kCompletable), the SRQs (kReachable,
// and through XRC: IBTA annex A14), the MR a key names (kOwnKey,
// kReachableKey), and the QPs a CQ error ends. The registry's part of
// resolve: it reads the QP, CQ, SRQ, MR and PD tables, which their classes own.
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
  for (uint32_t qpn : qp_.table().of(c)) {
    has_ud |= qp_.table().at(qpn).type == IBV_QPT_UD;
    auto peer = qp_.table().find(qp_.slot(qpn).dest_qpn.load());
    if (peer != qp_.table().end() && peer->second.recv_cq == handle) return true;
  }
  const uint32_t cq_owner = it->second.owner;
  if (has_ud)
    for (uint32_t qpn : qp_.table().of(cq_owner))
      if (const Qp& q = qp_.table().at(qpn); q.type == IBV_QPT_UD && q.recv_cq == handle) return true;
  for (uint32_t h : srq_.table().of(cq_owner))
    if (const Srq& srq = srq_.table().at(h); srq.cq == handle && xrc_reaches_srq(c, srq)) return true;
  return false;
}

// IBTA 11.4.2.1 and 10.10.2.3: a CQ overrun is a CQ error; every QP
// completing into the CQ goes to ERR. A QP completes only into CQs of its
// own context (check_create_qp), and such a QP keeps its context.
void Registry::qps_error_on_cq(uint32_t context, uint32_t cq) {
  for (uint32_t qpn : qp_.table().of(context)) {
    const Qp& q = qp_.table().at(qpn);
    if (q.send_cq != cq && q.recv_cq != cq) continue;
    QpEntry& e = qp_.slot(qpn);
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
  const Pd* pd = pd_.table().get(mr->second.pd);
  bool allowed = pd && pd->owner == ctx(client);
  bool has_ud = false;
  for (uint32_t qpn : qp_.table().of(ctx(client))) {
    if (allowed) break;
    has_ud |= qp_.table().at(qpn).type == IBV_QPT_UD;
    auto peer = qp_.table().find(qp_.slot(qpn).dest_qpn.load());
    if (peer != qp_.table().end() && peer->second.pd == mr->second.pd) allowed = true;
  }
  // The QPs and SRQs of a PD are of the PD's context: only those are looked at.
  const uint32_t pd_owner = pd ? pd->owner : 0;
  // A UD sender scatters into receive buffers of any UD QP of that PD.
  for (uint32_t qpn : pd && has_ud ? qp_.table().of(pd_owner) : std::vector<uint32_t>{}) {
    const Qp& q = qp_.table().at(qpn);
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
  for (uint32_t qpn : qp_.table().of(context)) {
    if (qp_.table().at(qpn).type != IBV_QPT_XRC_SEND) continue;
    auto t = qp_.table().find(qp_.slot(qpn).dest_qpn.load());
    if (t != qp_.table().end() && t->second.type == IBV_QPT_XRC_RECV && t->second.xrcd == srq.xrcd) return true;
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
  for (uint32_t qpn : qp_.table().of(c)) {
    const uint32_t dest = qp_.slot(qpn).dest_qpn.load();
    auto peer = qp_.table().find(dest);
    if (peer != qp_.table().end() && peer->second.srq == handle && qp_.slot(dest).dest_qpn.load() == qpn) return true;
  }
  return false;
}

}  // namespace sv::daemon
