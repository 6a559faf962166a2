// qp.cc: queue pairs (ibv_create_qp(3), ibv_modify_qp(3), IBTA 11.2.4),
// their connections to peers on this host, multicast (UD), and what
// becomes of the peers of QPs that die.
#include "daemon/qp.h"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "common/completion.h"
#include "common/mgid.h"
#include "common/qp_state.h"
#include "common/trace.h"

namespace sv::daemon {

using namespace sv::shm;

QueuePairs::QueuePairs(ObjectHost& host, DeviceTables& tables, CompletionQueues& cqs, SharedReceiveQueues& srqs)
    : host_(host), tables_(tables), cqs_(cqs), srqs_(srqs), gen_(kQpTableSize, 0) {}

QpEntry& QueuePairs::slot(uint32_t qpn) const { return const_cast<DeviceTables&>(tables_).qp_at(qpn); }

const QpEntry* QueuePairs::entry(uint32_t qpn) const {
  const QpEntry& e = slot(qpn);
  return e.qpn.load() == qpn ? &e : nullptr;
}

Qp* QueuePairs::find(uint32_t client, uint32_t qpn) {
  ++owner_lookups();
  return held(host_.context_of(client), qpn);
}

bool QueuePairs::holds(const Qp& q, uint32_t c) {
  return c && (q.owner == c || std::find(q.holders.begin(), q.holders.end(), c) != q.holders.end());
}

Qp* QueuePairs::held(uint32_t c, uint32_t qpn) {
  auto it = qps_.find(qpn);
  return it != qps_.end() && holds(it->second, c) ? &it->second : nullptr;
}

// The checks of ibv_create_qp(3) on the request: its PD, CQs and SRQ must
// be the client's, its sizes within the device's. An XRC target QP has no
// PD, CQs or queues: it belongs to its XRC domain (*xrcd), and receives go
// to the XRC SRQ each message names (IBTA annex A14).
int QueuePairs::check_create(const Objects& o, const proto::CreateQpReq& req) {
  const bool tgt = req.qp_type == IBV_QPT_XRC_RECV;
  if (tgt) {
    if (!o.xrcd || req.pd || req.send_cq || req.recv_cq || req.srq) return EINVAL;
  } else if (req.xrcd) {
    return EINVAL;
  }
  if (!tgt && (!req.pd || !req.send_cq || !req.recv_cq)) return EINVAL;
  if (o.srq) {
    if (req.qp_type == IBV_QPT_UD || req.qp_type == IBV_QPT_XRC_SEND || o.srq->type != IBV_SRQT_BASIC) return EINVAL;
  }
  if (req.qp_type != IBV_QPT_RC && req.qp_type != IBV_QPT_UC && req.qp_type != IBV_QPT_UD &&
      req.qp_type != IBV_QPT_XRC_SEND && !tgt)
    return EOPNOTSUPP;  // raw packet: not on this device
  if (req.max_send_wr > kMaxQpWr || req.max_recv_wr > kMaxQpWr) return EINVAL;
  if (req.max_send_sge > kMaxSge || req.max_recv_sge > kMaxSge) return EINVAL;
  if (req.max_inline_data > kMaxInline) return EINVAL;
  return 0;
}

// A free QP-table slot (0 if none), round robin from 2: QPN 0 and 1 are the
// special QPs.
uint32_t QueuePairs::alloc_slot() {
  for (uint32_t n = 0; n < kQpTableSize; ++n) {
    uint32_t s = next_slot_;
    next_slot_ = next_slot_ + 1 >= kQpTableSize ? 2 : next_slot_ + 1;
    if (tables_.qp_at(s).qpn.load(std::memory_order_relaxed) == 0) return s;
  }
  return 0;
}

// The QP's entry in its user's device segment, in RESET; the QPN is
// published last.
void QueuePairs::init_entry(uint32_t client, uint32_t slot, uint32_t qpn, const proto::CreateQpReq& req) {
  QpEntry& e = tables_.qp_at(slot);
  e.state.store(IBV_QPS_RESET, std::memory_order_relaxed);
  e.qp_type = req.qp_type;
  e.pd = req.pd;
  e.dest_qpn.store(0, std::memory_order_relaxed);
  e.access.store(0, std::memory_order_relaxed);
  e.send_cq = req.send_cq;
  e.recv_cq = req.recv_cq;
  e.min_rnr_timer = 0;
  e.timeout = 0;
  e.retry_cnt = 0;
  e.rnr_retry = 0;
  e.owner_pid = uint32_t(host_.client_view(client).pid);
  e.qkey.store(0, std::memory_order_relaxed);
  e.qpn.store(qpn, std::memory_order_release);
}

namespace {

// The states in which a QP carries its connection's traffic (IBTA 10.3.1).
bool qp_connected(ibv_qp_state s) {
  return s == IBV_QPS_RTR || s == IBV_QPS_RTS || s == IBV_QPS_SQD || s == IBV_QPS_SQE;
}

// A QP's segment: its header and its two rings.
int make_qp_segment(uint32_t qpn, const QpLayout& layout, Fd& fd, Mapping& map) {
  if (int e = make_memfd("softverbs-qp", layout.size(), fd)) return e;
  if (int e = map_shared(fd.get(), 0, layout.size(), PROT_READ | PROT_WRITE, false, map)) return e;
  auto* h = map.as<QpSegmentHeader>();
  h->magic = kQpMagic;
  h->qpn = qpn;
  h->size = layout.size();
  h->sq_offset = layout.sq_offset();
  h->rq_offset = layout.rq_offset();
  h->sq_capacity = layout.sq_capacity;
  h->rq_capacity = layout.rq_capacity;
  auto* sqh = reinterpret_cast<RingHeader*>(map.as<char>() + layout.sq_offset());
  Ring<SendWqe>::init(sqh, reinterpret_cast<RingSlot<SendWqe>*>(sqh + 1), layout.sq_capacity);
  auto* rqh = reinterpret_cast<RingHeader*>(map.as<char>() + layout.rq_offset());
  Ring<RecvWqe>::init(rqh, reinterpret_cast<RingSlot<RecvWqe>*>(rqh + 1), layout.rq_capacity);
  return 0;
}

}  // namespace

int QueuePairs::create(uint32_t client, const Objects& o, const proto::CreateQpReq& req,
                        proto::CreateQpReply& rep, std::vector<int>& out_fds) {
  if (int e = host_.quotas().admit(Quotas::kQp, host_.client_uid(client))) return e;
  if (int e = check_create(o, req)) return e;
  const uint32_t xrcd = o.xrcd ? o.xrcd->xrcd : 0;
  uint32_t slot = alloc_slot();
  if (!slot) return ENOMEM;
  if (int err = tables_.claim_qp(slot, host_.context_uid(host_.context_of(client)))) return err;
  uint32_t qpn = ((uint32_t(++gen_[slot]) << 16) | slot) & 0xffffff;

  // At least two slots: a one-slot ring (Vyukov's sequence scheme) takes a
  // second element over the first and then spins in pop().
  QpLayout layout{round_up_pow2(std::max(req.max_send_wr, 2u)), recv_ring_capacity(req.max_recv_wr)};
  Qp qp;
  qp.owner = host_.context_of(client);
  qp.uid = uint32_t(host_.context_uid(qp.owner));
  qp.type = ibv_qp_type(req.qp_type);
  qp.slot = slot;
  if (int e = make_qp_segment(qpn, layout, qp.fd, qp.map)) return e;
  init_entry(client, slot, qpn, req);

  if (xrcd) {
    qp.xrcd = xrcd;
    qp.holders.push_back(host_.context_of(client));
  } else {
    qp.pd = req.pd;
    qp.send_cq = req.send_cq;
    qp.recv_cq = req.recv_cq;
  }
  qp.sq_capacity = layout.sq_capacity;
  qp.rq_capacity = layout.rq_capacity;
  qp.srq = req.srq;
  qp.sq_sig_all = req.sq_sig_all;
  rep.qpn = qpn;
  rep.sq_capacity = layout.sq_capacity;
  rep.rq_capacity = layout.rq_capacity;
  rep.segment_size = layout.size();
  out_fds.push_back(qp.fd.get());
  host_.quotas().charge(Quotas::kQp, qpn, host_.client_uid(client));
  // Its PD, CQs and SRQ, or a target QP's domain.
  host_.hold(qps_.insert(qpn, std::move(qp)).held());
  if (xrcd) xrc_handles_.insert({host_.context_of(client), qpn});
  return 0;
}

int QueuePairs::modify(Qp& qp, const proto::ModifyQpReq& r) {
  QpEntry& e = slot(r.qpn);
  auto cur = ibv_qp_state(e.state.load());
  uint32_t mask = r.attr_mask;
  if (mask & IBV_QP_CUR_STATE) {
    // IBTA 11.2.4.2: the current state, if given, must be the QP's state.
    if (r.cur_qp_state != cur) return EINVAL;
  }
  auto next = (mask & IBV_QP_STATE) ? ibv_qp_state(r.qp_state) : cur;
  if (int(next) < IBV_QPS_RESET || int(next) > IBV_QPS_ERR) return EINVAL;
  if (int err = check_qp_transition(qp.type, cur, next, mask)) return err;

  // Attribute ranges (ibv_modify_qp(3), IBTA 11.2.4.2).
  if ((mask & IBV_QP_PORT) && r.port_num != 1) return EINVAL;
  if ((mask & IBV_QP_PKEY_INDEX) && r.pkey_index != 0) return EINVAL;
  // Local write, MW bind and on-demand paging in qp_access_flags are
  // accepted and mean nothing for a QP, as with rdma-core's kernel drivers
  // (rdma-core's test_odp sets its MR's flags on its QPs); unknown bits are refused.
  if ((mask & IBV_QP_ACCESS_FLAGS) && (r.qp_access_flags & ~(kKnownAccess | IBV_ACCESS_ON_DEMAND))) return EINVAL;
  if ((mask & IBV_QP_PATH_MTU) && (r.path_mtu < IBV_MTU_256 || r.path_mtu > IBV_MTU_4096)) return EINVAL;
  if ((mask & IBV_QP_DEST_QPN) && r.dest_qp_num > 0xffffff) return EINVAL;
  if ((mask & IBV_QP_RQ_PSN) && r.rq_psn > 0xffffff) return EINVAL;
  if ((mask & IBV_QP_SQ_PSN) && r.sq_psn > 0xffffff) return EINVAL;
  if ((mask & IBV_QP_MIN_RNR_TIMER) && r.min_rnr_timer > 31) return EINVAL;
  if ((mask & IBV_QP_TIMEOUT) && r.timeout > 31) return EINVAL;
  if ((mask & IBV_QP_RETRY_CNT) && r.retry_cnt > 7) return EINVAL;
  if ((mask & IBV_QP_RNR_RETRY) && r.rnr_retry > 7) return EINVAL;
  if ((mask & IBV_QP_MAX_QP_RD_ATOMIC) && r.max_rd_atomic > kMaxRdAtomic) return EINVAL;
  if ((mask & IBV_QP_MAX_DEST_RD_ATOMIC) && r.max_dest_rd_atomic > kMaxRdAtomic) return EINVAL;
  if (mask & IBV_QP_AV) {
    if (r.ah_port_num != 1 && r.ah_port_num != 0) return EINVAL;
  }

  if (mask & IBV_QP_ACCESS_FLAGS) e.access.store(r.qp_access_flags & kQpAccess, std::memory_order_relaxed);
  if (mask & IBV_QP_DEST_QPN) set_dest(r.qpn, r.dest_qp_num);
  if (mask & IBV_QP_MIN_RNR_TIMER) e.min_rnr_timer = r.min_rnr_timer;
  if (mask & IBV_QP_TIMEOUT) e.timeout = r.timeout;
  if (mask & IBV_QP_RETRY_CNT) e.retry_cnt = r.retry_cnt;
  if (mask & IBV_QP_RNR_RETRY) e.rnr_retry = r.rnr_retry;
  if (mask & IBV_QP_QKEY) e.qkey.store(r.qkey, std::memory_order_relaxed);
  if (mask & IBV_QP_RQ_PSN) qp.rq_psn = r.rq_psn;  // as given (`rdma resource show`)
  if (mask & IBV_QP_SQ_PSN) qp.sq_psn = r.sq_psn;
  if (next == IBV_QPS_RESET) {
    set_dest(r.qpn, 0);
    e.access.store(0, std::memory_order_relaxed);
  }
  e.state.store(next, std::memory_order_release);
  // A wire QP's responder found the error (IBTA 11.6.3.1): its holders get
  // the affiliated event, once (a QP already in ERR raises nothing more).
  const auto rs = ibv_wc_status(r.responder_status);
  if (next == IBV_QPS_ERR && cur != IBV_QPS_ERR &&
      (rs == IBV_WC_REM_INV_REQ_ERR || rs == IBV_WC_REM_ACCESS_ERR || rs == IBV_WC_REM_OP_ERR))
    responder_error_event(r.qpn, rs);
  return 0;
}

void QueuePairs::release(uint32_t qpn) {
  auto it = qps_.find(qpn);
  if (it == qps_.end()) return;
  host_.retire_counters(it->second);
  QpEntry& e = slot(qpn);
  e.state.store(IBV_QPS_ERR, std::memory_order_release);
  e.qpn.store(0, std::memory_order_release);
  by_dest_.erase({e.dest_qpn.load(), qpn});
  host_.forget(ObjKind::kQp, qpn);
  // A destroyed QP leaves its multicast groups (as the kernel detaches them).
  for (const auto& ch : tables_.mcg_remove_qp(qpn)) mcg_release(ch, qpn);
}

// A context's release frees its QPs and the XRC target QPs whose last
// handle it held; a target QP another context still holds moves to it.
std::vector<uint32_t> QueuePairs::to_release(uint32_t owner) {
  std::set<uint32_t> ids;  // in QPN order
  for (uint32_t qpn : qps_.of(owner))
    if (qps_.at(qpn).type != IBV_QPT_XRC_RECV) ids.insert(qpn);
  std::set<uint32_t> targets;  // the target QPs it holds a handle of (its own among them)
  for (auto h = xrc_handles_.lower_bound({owner, 0}); h != xrc_handles_.end() && h->first == owner;)
    targets.insert(h->second), h = xrc_handles_.erase(h);
  for (uint32_t qpn : targets) {
    auto it = qps_.find(qpn);
    if (it == qps_.end() || it->second.type != IBV_QPT_XRC_RECV) continue;
    Qp& q = it->second;
    if (std::find(q.holders.begin(), q.holders.end(), owner) == q.holders.end()) continue;
    std::erase(q.holders, owner);
    if (!q.holders.empty()) {
      qps_.set_owner(qpn, q.holders.front());  // another context still holds the target QP
      continue;
    }
    ids.insert(qpn);
  }
  return {ids.begin(), ids.end()};
}

void QueuePairs::set_dest(uint32_t qpn, uint32_t dest) {
  QpEntry& e = slot(qpn);
  by_dest_.erase({e.dest_qpn.load(), qpn});
  e.dest_qpn.store(dest, std::memory_order_relaxed);
  if (dest) by_dest_.insert({dest, qpn});
}

// Before they go: receives their processes were delivering when they died
// complete (complete_torn_receive), and the QPs still connected are noted
// (their state is about to be ERR); after, the peers of those fail
// (fail_peers_of).
void QueuePairs::before_release(const std::vector<uint32_t>& qpns) {
  for (uint32_t id : qpns) {
    complete_torn_receive(id);
    if (qp_connected(ibv_qp_state(slot(id).state.load(std::memory_order_acquire)))) died_connected_.insert(id);
  }
}

// The destroy hook of a QP (ibv_destroy_qp(3)), for a holder in context `c`.
int QueuePairs::destroy_handle(uint32_t c, uint32_t qpn) {
  Qp* qp = held(c, qpn);
  if (!qp) return EINVAL;
  if (qp->type == IBV_QPT_XRC_RECV) {
    // A target QP lives while some handle of it exists (ibv_open_qp(3)).
    if (auto h = std::find(qp->holders.begin(), qp->holders.end(), c); h != qp->holders.end()) {
      qp->holders.erase(h);
      if (auto x = xrc_handles_.find({c, qpn}); x != xrc_handles_.end()) xrc_handles_.erase(x);
    }
    if (!qp->holders.empty()) {
      qps_.set_owner(qpn, qp->holders.front());
      return 0;
    }
  }
  release(qpn);
  return 0;
}

// Attach QP to multicast group (IBTA verbs chapter 11; ibv_attach_mcast(3)): UD QPs only, and the
// GID must be a multicast GID (first byte 0xFF, or an IPv4 group's ::ffff:224.0.0.0/4 as
// RoCEv2 has it: common/mgid.h). The link layer is Ethernet,
// so the LID is not checked, as the kernel does for RoCE.
int QueuePairs::attach_mcast(uint32_t client, const Qp& qp, const proto::McastReq& req) {
  if (qp.type != IBV_QPT_UD || !gid_is_multicast(req.gid)) return EINVAL;
  // The groups are daemon-private (device_tables.h): ENOMEM past
  // max_mcast_grp groups or max_mcast_qp_attach QPs in one group. Every
  // user's share is bounded (quota.h): the groups it creates (MCG), its
  // attachments (MCGATTACH), and, where those quotas are on, half of one
  // group's places, so that no other user fills the table or a group.
  const uid_t uid = host_.client_uid(client);
  std::vector<uint32_t> members;
  const bool exists = tables_.mcg_members(req.gid, members);
  if (std::find(members.begin(), members.end(), req.qpn) != members.end()) return 0;
  int err = exists ? 0 : host_.quotas().admit(Quotas::kMcg, uid);
  if (!err) err = host_.quotas().admit(Quotas::kMcgAttach, uid);
  if (!err && host_.quotas().limit(Quotas::kMcgAttach)) {
    uint32_t mine = 0;
    for (uint32_t m : members) mine += qp_uid(m) == uid;
    if (mine >= shm::kMcgMaxQps / 2) err = ENOMEM;
  }
  if (err) {
    std::fprintf(stderr,
                 "softverbsd: uid %u attaches QP %u to a multicast group beyond its quota "
                 "(SOFTVERBSD_QUOTA_MCG, _MCGATTACH, or half of a group): %s\n",
                 unsigned(uid), req.qpn, std::strerror(err));
    return err;
  }
  DeviceTables::McgChange ch;
  err = tables_.mcg_attach(req.gid, req.lid, req.qpn, &ch);
  if (err || !ch.added) return err;
  host_.quotas().charge(Quotas::kMcgAttach, (ch.slot << 24) | (req.qpn & 0xffffff), uid);
  if (ch.created) host_.quotas().charge(Quotas::kMcg, ch.slot, uid);
  return 0;
}

// Releases the charges of one attachment that ended (and of its group if it
// emptied).
void QueuePairs::mcg_release(const DeviceTables::McgChange& ch, uint32_t qpn) {
  host_.quotas().release(Quotas::kMcgAttach, (ch.slot << 24) | (qpn & 0xffffff));
  if (ch.emptied) host_.quotas().release(Quotas::kMcg, ch.slot);
}

// The user of the context that holds QP `qpn` (uid_t(-1): none).
uid_t QueuePairs::qp_uid(uint32_t qpn) const {
  auto q = qps_.find(qpn);
  if (q == qps_.end()) return uid_t(-1);
  return host_.context_uid(q->second.owner);
}

int QueuePairs::detach_mcast(const Qp& qp, const proto::McastReq& req) {
  if (qp.type != IBV_QPT_UD || !gid_is_multicast(req.gid)) return EINVAL;
  DeviceTables::McgChange ch;
  int err = tables_.mcg_detach(req.gid, req.qpn, &ch);
  if (!err) mcg_release(ch, req.qpn);
  return err;
}

int QueuePairs::peer_reply(uint32_t client, uint32_t dest, proto::ConnectPeerReply& rep, std::vector<int>& out_fds) {
  auto peer = qps_.find(dest);
  if (peer == qps_.end()) return ENOENT;
  // The peer's queues and, through its keys, its memory are mapped by the
  // requester: not across users (see same_user). Between users the daemon
  // carries out each operation itself (Op::Mediate, mediate.cc); UD is not
  // mediated yet. The peer's QP entry is in its own user's device segment
  // (device_tables.h), which the requester does not map: a mediated
  // requester learns what it needs from this reply and the daemon checks
  // the peer's state at each operation.
  if (!host_.same_user(client, peer->second.owner) || !host_.same_tables(client, peer->second.owner)) {
    if (peer->second.type == IBV_QPT_UD) return EACCES;
    rep.peer_qpn = dest;
    rep.mediated = 1;
    rep.min_rnr_timer = slot(dest).min_rnr_timer;
    return 0;
  }
  auto rcq = cqs_.table().find(peer->second.recv_cq);
  if (rcq == cqs_.table().end()) return ENOENT;
  rep.peer_qpn = dest;
  rep.peer_recv_cq = peer->second.recv_cq;
  rep.qp_segment_size = peer->second.map.size();
  rep.cq_segment_size = rcq->second.map.size();
  out_fds.push_back(peer->second.fd.get());
  out_fds.push_back(rcq->second.fd.get());
  rep.has_srq = 0;
  if (auto q = srqs_.table().find(peer->second.srq); q != srqs_.table().end()) {
    out_fds.push_back(q->second.fd.get());
    rep.has_srq = 1;
    rep.srq_segment_size = q->second.map.size();
    rep.srq_handle = q->first;
  }
  rep.has_channel = 0;
  if (rcq->second.channel) {
    if (auto ch = cqs_.channels().find(rcq->second.channel); ch != cqs_.channels().end()) {
      out_fds.push_back(ch->second.wake.get());
      rep.has_channel = 1;
    }
  }
  return 0;
}

int QueuePairs::connect_peer(uint32_t client, const Qp& qp, uint32_t qpn, proto::ConnectPeerReply& rep,
                           std::vector<int>& out_fds) {
  const QpEntry& mine = slot(qpn);
  uint32_t dest = mine.dest_qpn.load();
  auto peer = qps_.find(dest);
  if (peer == qps_.end()) return ENOENT;  // nobody listens at that QPN on this host
  const QpEntry& pe = slot(dest);
  auto st = ibv_qp_state(pe.state.load());
  if (st != IBV_QPS_RTR && st != IBV_QPS_RTS && st != IBV_QPS_SQD && st != IBV_QPS_SQE)
    return EAGAIN;  // not ready to receive: the requester retries
  if (peer->second.type != qp.type) return EAGAIN;  // an RC QP does not talk to a UC one
  if (pe.dest_qpn.load() != qpn) return EAGAIN;
  return peer_reply(client, dest, rep, out_fds);
}

// UD has no connection: any UD QP may send to any UD QP whose Q_Key it
// knows (checked per message by the sender against the QP table).
int QueuePairs::connect_ud(uint32_t client, const Qp& qp, uint32_t dest, proto::ConnectPeerReply& rep,
                         std::vector<int>& out_fds) {
  if (qp.type != IBV_QPT_UD) return EINVAL;
  auto peer = qps_.find(dest);
  if (peer == qps_.end() || peer->second.type != IBV_QPT_UD) return ENOENT;
  return peer_reply(client, dest, rep, out_fds);
}

int QueuePairs::peer_error(uint32_t qpn, uint32_t wc_status) {
  uint32_t dest = slot(qpn).dest_qpn.load();
  auto peer = qps_.find(dest);
  if (peer == qps_.end()) return 0;
  QpEntry& pe = slot(dest);
  if (pe.dest_qpn.load() != qpn) return EINVAL;
  SV_TRACE("daemon: QP 0x%x reports a responder error: peer QP 0x%x to ERR", qpn, dest);
  if (pe.state.exchange(IBV_QPS_ERR, std::memory_order_acq_rel) != IBV_QPS_ERR)
    responder_error_event(dest, ibv_wc_status(wc_status));
  return 0;
}

// The responder QP's holders learn why it went to ERR (IBTA 11.6.3.1), once
// per error: a QP already in ERR raises nothing more.
void QueuePairs::responder_error_event(uint32_t qpn, ibv_wc_status requester_status) {
  auto q = qps_.find(qpn);
  if (q == qps_.end()) return;
  const ibv_event_type ev = access::responder_event(requester_status);
  host_.context_event(q->second.owner, ev, qpn);
}

// A process killed while its QP was delivering a message (pop_peer_recv in
// the library) leaves the responder's receive taken but not completed.
// Complete it now, before fail_peers_of flushes the rest of that queue, so
// the responder sees every receive once and in order: flushed, as a receive
// whose message never fully arrived is (IBTA 10.3.1, the QP goes to ERR).
//
// The record is in the dead QP's segment, which its holders could write at
// will: every field of it is a claim, checked against the daemon's own
// records before anything is done (torn_record_allowed). The responder it
// names must be one the dead QP's holders were given to map (same user,
// peer_reply), so whatever the daemon does with the record they could have
// done to that responder's queues and CQ themselves.
void QueuePairs::complete_torn_receive(uint32_t dead_qpn) {
  auto dq = qps_.find(dead_qpn);
  if (dq == qps_.end()) return;
  auto* dh = dq->second.map.as<QpSegmentHeader>();
  uint32_t qpn = dh->torn_qpn.exchange(0, std::memory_order_acquire);
  if (qpn == 0) return;
  auto q = qps_.find(qpn);
  if (q == qps_.end() || !torn_record_allowed(dq->second, dead_qpn, q->second, qpn)) return;
  uint64_t wr_id = dh->torn_wr_id;
  if (!dh->torn_taken.load(std::memory_order_acquire)) {
    // Killed between the record and the copy: the receive is still in the
    // slot if the claim was made. The position indexes the ring with the
    // capacity the daemon recorded (receive_queue), so any value is safe.
    RecvQueue rq;
    RecvWqe w{};
    // Every process that held the dead QP has gone from here (some may
    // not be reaped yet): the claimer takes nothing more.
    if (!receive_queue(qpn, rq) || !rq.ring.reclaim_take(dh->torn_pos, dh->torn_pid, w)) return;
    wr_id = w.wr_id;
  }
  ibv_wc wc{};
  wc.wr_id = wr_id;
  // A UD responder stays usable: its receive was aborted, not flushed.
  wc.status = q->second.type == IBV_QPT_UD ? IBV_WC_REM_ABORT_ERR : IBV_WC_WR_FLUSH_ERR;
  wc.opcode = IBV_WC_RECV;
  wc.qp_num = qpn;
  wc.src_qp = dead_qpn;
  cqs_.push(q->second.recv_cq, wc, true);
}

// May the dead QP's torn record name responder `peer`? Only a QP its holders
// could have delivered to through shared memory, as the daemon recorded it:
// of the same user (peer_reply hands a peer's segments only within a user;
// between users the daemon delivers, Op::Mediate, and no record is kept),
// of the same type, and for a connected type the pair connected both ways
// (the dead QP's destination is the responder and the responder's is the
// dead QP, as connect_peer demands). A record naming anything else is
// ignored: it is a forgery, or the pair changed since, and then the
// responder's holders were never reached through it.
bool QueuePairs::torn_record_allowed(const Qp& dead, uint32_t dead_qpn, const Qp& peer, uint32_t peer_qpn) const {
  if (dead.uid == uint32_t(-1) || dead.uid != peer.uid) return false;
  if (peer.type != dead.type || peer.type == IBV_QPT_XRC_RECV) return false;
  if (!cqs_.table().count(peer.recv_cq)) return false;
  if (peer.type == IBV_QPT_UD) return true;
  return slot(dead_qpn).dest_qpn.load() == peer_qpn && slot(peer_qpn).dest_qpn.load() == dead_qpn;
}

// The peers of QPs that just died (their last holder exited) while still
// connected: connected QPs go to ERR at once, their posted receives
// complete with flush errors, and every process holding them gets
// IBV_EVENT_QP_FATAL. (On a wire the peers would find out by their retries
// running out; on one host the daemon knows.) Their send queues are flushed
// by their holders, which see the ERR state on their next post or retry.
//
// A QP its holder had already taken out of the connection (to ERR, as
// rdma_disconnect does before its DREQ, or to RESET) left in order: the CM
// told the peer (DISCONNECTED), and the peer's requests already went
// unanswered, as a QP in the Error state on a wire answers nothing (IBTA
// 10.3.1): the peer's requester learns it when its retries run out
// (IBV_WC_RETRY_EXC_ERR, IBTA 9.7.6.1.3), with no asynchronous event. Its
// going changes nothing the peer could see, so the peer is left as it is:
// no QP_FATAL at an orderly disconnect, whether the peer reads DISCONNECTED
// before or after the other process exits.
void QueuePairs::fail_peers_of(const std::vector<uint32_t>& released) {
  std::vector<uint32_t> dead;  // the released QPs that were still connected
  for (uint32_t d : released)
    if (died_connected_.erase(d)) dead.push_back(d);
  if (dead.empty()) return;
  std::set<uint32_t> peers;  // the QPs whose entry names a dead QP, in QPN order
  for (uint32_t d : dead)
    for (auto it = by_dest_.lower_bound({d, 0}); it != by_dest_.end() && it->first == d; ++it) peers.insert(it->second);
  for (uint32_t qpn : peers) {
    auto found = qps_.find(qpn);
    if (found == qps_.end()) continue;
    Qp& q = found->second;
    QpEntry& e = slot(qpn);
    uint32_t dest = e.dest_qpn.load();
    if (q.type == IBV_QPT_UD || std::find(dead.begin(), dead.end(), dest) == dead.end()) continue;
    auto st = ibv_qp_state(e.state.load());
    if (st == IBV_QPS_RESET || st == IBV_QPS_INIT || st == IBV_QPS_ERR) continue;
    SV_TRACE("daemon: QP 0x%x to ERR: its peer QP 0x%x is gone", qpn, dest);
    e.state.store(IBV_QPS_ERR, std::memory_order_release);
    if (cqs_.table().count(q.recv_cq)) flush_rq(q, qpn);
    host_.context_event(q.owner, IBV_EVENT_QP_FATAL, qpn);
  }
}

// IBTA annex A14: an XRC message names the SRQ that takes it; the SRQ must be in
// the target QP's domain. EAGAIN: the target is not ready (the requester
// retries); ENOENT: no such SRQ there (an invalid request).
int QueuePairs::connect_xrc(uint32_t client, const Qp& my_qp, const proto::ConnectXrcReq& req,
                          proto::ConnectPeerReply& rep, std::vector<int>& out_fds) {
  const Qp* qp = &my_qp;
  if (qp->type != IBV_QPT_XRC_SEND && qp->type != IBV_QPT_XRC_RECV) return EINVAL;
  // An XRC target whose initiator is on another host (docs/ROCE.md, XRC on
  // the wire): the caller runs the target's transport and asks for the SRQ
  // a request names, in the target's own XRC domain (IBTA annex A14).
  const bool wire_target = qp->type == IBV_QPT_XRC_RECV;
  uint32_t dest = wire_target ? req.qpn : slot(req.qpn).dest_qpn.load();
  auto tgt = qps_.find(dest);
  if (tgt == qps_.end()) return EAGAIN;
  const QpEntry& te = slot(dest);
  auto st = ibv_qp_state(te.state.load());
  if (tgt->second.type != IBV_QPT_XRC_RECV || (!wire_target && te.dest_qpn.load() != req.qpn)) return EAGAIN;
  // XRC is not mediated between users; the requester reads the target's
  // entry in its own user's device segment.
  if (!host_.same_user(client, tgt->second.owner) || !host_.same_tables(client, tgt->second.owner)) return EACCES;
  if (st != IBV_QPS_RTR && st != IBV_QPS_RTS) return EAGAIN;
  auto srq = srqs_.table().find(req.srqn);
  if (srq == srqs_.table().end() || srq->second.type != IBV_SRQT_XRC || srq->second.xrcd != tgt->second.xrcd) return ENOENT;
  auto cq = cqs_.table().find(srq->second.cq);
  if (cq == cqs_.table().end()) return ENOENT;
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
  if (auto ch = cqs_.channels().find(cq->second.channel); ch != cqs_.channels().end()) {
    out_fds.push_back(ch->second.wake.get());
    rep.has_channel = 1;
  }
  return 0;
}

// ibv_open_qp(3): another handle of an XRC target QP, for a context that
// opened the QP's domain.
int QueuePairs::open_qp(uint32_t client, const XrcdHandle& xh, const proto::OpenQpReq& req, proto::ImportQpReply& rep,
                      std::vector<int>& out_fds) {
  const uint32_t xrcd = xh.xrcd;
  auto it = qps_.find(req.qpn);
  if (it == qps_.end() || it->second.type != IBV_QPT_XRC_RECV || it->second.xrcd != xrcd) return EINVAL;
  Qp& q = it->second;
  q.holders.push_back(host_.context_of(client));  // one entry per handle: each is destroyed on its own
  xrc_handles_.insert({host_.context_of(client), req.qpn});
  rep.qp_type = q.type;
  rep.segment_size = q.map.size();
  out_fds.push_back(q.fd.get());
  return 0;
}

// The rings are located by the capacities recorded when they were made,
// not by the segment header's offsets, which the peer's process can write.
bool QueuePairs::receive_queue(uint32_t qpn, RecvQueue& out) {
  auto it = qps_.find(qpn);
  if (it == qps_.end()) return false;
  Qp& q = it->second;
  if (q.srq) {
    auto s = srqs_.table().find(q.srq);
    if (s == srqs_.table().end()) return false;
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

// The QP's own posted receives complete with flush errors (IBTA 10.3.1);
// an SRQ's receives belong to its other QPs too and stay. At most one ring's
// worth (the capacity the daemon recorded): a holder that goes on posting
// into the ring while it is flushed does not keep the daemon here.
void QueuePairs::flush_rq(Qp& q, uint32_t qpn) {
  RecvQueue rq;
  if (q.srq || !receive_queue(qpn, rq)) return;
  RecvWqe w{};
  for (uint32_t n = 0; n < q.rq_capacity && rq.ring.pop(w); ++n) {
    ibv_wc wc{};
    wc.wr_id = w.wr_id;
    wc.status = IBV_WC_WR_FLUSH_ERR;
    wc.opcode = IBV_WC_RECV;
    wc.qp_num = qpn;
    cqs_.push(q.recv_cq, wc, true);
  }
}

}  // namespace sv::daemon
