// The requester's UD part (IBTA 9.8.2): datagrams to a QP of this host
// named in each work request, or to every QP of this host attached to a
// multicast group (11.4.1.1), through shared memory. A datagram that
// cannot be delivered is dropped without an error at the sender. A wire UD
// QP's sends to another host, and a copy of its multicast sends, go to the
// RoCEv2 engine instead (post_ud_on_wire, roce_link.h).
#include <cstring>
#include <vector>

#include "common/counters.h"
#include "common/mgid.h"
#include "verbs/requester_internal.h"
#include "verbs/roce_link.h"
#include "verbs/wr_rules.h"

namespace sv::verbs {

bool gid_is_local(const uint8_t* gid) {
  for (uint32_t i = 0; i < kGidTableLen; ++i) {
    ibv_gid g{};
    if (ibv_query_gid(nullptr, 1, int(i), &g) != 0) break;
    bool zero = true;
    for (int k = 0; k < 16; ++k) zero &= g.raw[k] == 0;
    if (zero) break;
    if (std::memcmp(g.raw, gid, 16) == 0) return true;
  }
  return false;
}

Peer* ud_peer(ProcessQp& q, uint32_t dest) {
  auto it = q.ud_peers.find(dest);
  if (it != q.ud_peers.end()) {
    if (it->second->entry->qpn.load(std::memory_order_acquire) == dest) return it->second.get();
    q.ud_peers.erase(it);
  }
  ContextState& cs = *q.ctx->st;
  proto::ConnectUdReq req{};
  req.qpn = q.qpn;
  req.dest = dest;
  proto::ConnectPeerReply rep{};
  std::vector<Fd> fds;
  if (cs.conn.call<proto::Op::ConnectUd>(req, rep, {}, &fds) != 0) return nullptr;
  auto np = std::make_unique<Peer>();
  if (attach_peer(cs, *np, rep, fds)) return nullptr;
  Peer* p = np.get();
  q.ud_peers[dest] = std::move(np);
  return p;
}

namespace {

// Delivers one UD message to the QP `p` if its Q_Key matches and a receive
// is posted; the receive buffer starts with 40 bytes for the GRH. Returns
// false when it was dropped.
bool deliver_ud(ProcessQp& q, Peer& p, const shm::SendWqe& w, const Seg* local, int nl, uint64_t total) {
  auto st = p.entry->state.load(std::memory_order_acquire);
  if (st != IBV_QPS_RTR && st != IBV_QPS_RTS && st != IBV_QPS_SQD) return false;
  uint32_t qkey = (w.ud_qkey & 0x80000000u) ? q.entry->qkey.load() : w.ud_qkey;
  if (qkey != p.entry->qkey.load(std::memory_order_relaxed)) return false;  // Q_Key violation: dropped
  shm::RecvWqe r;
  if (!pop_peer_recv(q, p, r)) return false;  // no receive posted: dropped (no RNR on UD)
  // The GRH (an IPv6-style header carrying the GIDs) precedes the payload.
  uint8_t grh[40] = {};
  grh[0] = 0x60;
  grh[4] = uint8_t(total >> 8);
  grh[5] = uint8_t(total);
  grh[6] = 0x1b;  // next header: IBA transport
  grh[7] = 64;
  const uint8_t loopback[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, 1};
  std::memcpy(grh + 8, loopback, 16);
  std::memcpy(grh + 24, w.ud_grh ? w.ud_dgid : loopback, 16);
  Seg src[shm::kMaxSge + 1];
  src[0] = {grh, 40};
  for (int i = 0; i < nl; ++i) src[i + 1] = local[i];
  Seg remote[shm::kMaxSge];
  uint32_t nr = 0;
  if (core::Check c = resolve_recv(q, p, r, total + 40, remote, nr); c != core::Check::kOk) {
    if (q.odp_seen) c = odp_scatter(q, p, r, src, nl + 1, total + 40);  // a buffer in ODP memory
    if (c != core::Check::kOk) {
      push_recv_completion(q, p, r, core::verdict(c).receive_status, 0, w);  // the responder's error; the sender never knows
      return false;
    }
  } else {
    copy_segments(remote, int(nr), src, nl + 1, total + 40);
  }
  ibv_wc wc = core::receive_completion(r.wr_id, IBV_WC_SUCCESS, w.opcode, uint32_t(total + 40), p.qpn, q.qpn,
                                       w.imm_data, 0);
  if (w.ud_grh) wc.wc_flags |= IBV_WC_GRH;
  if (!p.recv_cq.push(wc, (w.send_flags & IBV_SEND_SOLICITED) != 0, &q.hdr->torn_qpn))  // as push_recv_completion
    q.hdr->torn_qpn.store(0, std::memory_order_release);
  counters::add(p.hdr->rsp_counts[counters::kRspRecvs], 1);  // several senders may reach it at once
  counters::add(p.hdr->rsp_counts[counters::kRspRcvdBytes], total);
  return true;
}

// IBTA multicast (UD only, 9.8.2): a multicast destination is a GRH with a multicast
// DGID (first byte 0xFF, or RoCEv2's IPv4 group ::ffff:224.0.0.0/4: common/mgid.h) or, without a GRH, a DLID in the multicast range
// (0xC000..0xFFFE); the destination QP is then 0xFFFFFF.
constexpr uint32_t kMulticastQpn = 0xffffff;
bool is_multicast(const shm::SendWqe& w) {
  return w.ud_grh ? gid_is_multicast(w.ud_dgid) : (w.ud_dlid >= 0xc000 && w.ud_dlid < 0xffff);
}

}  // namespace

// IBTA 9.8.2 and 11.4.1.1: a UD message goes to the QP named in the work
// request (or to every QP attached to the multicast group it names, on this
// host) if its Q_Key matches. Whatever cannot be delivered is dropped
// without an error at the sender.
Outcome execute_ud(ProcessQp& q, const shm::SendWqe& w) {
  Seg local[shm::kMaxSge];
  int nl = 0;
  uint64_t total = 0;
  ibv_wc_status err = IBV_WC_SUCCESS;
  std::vector<uint8_t> stage;  // a source in ODP memory, read first
  q.odp_seen = false;
  if (!gather(q, w, local, nl, total, err) && !(q.odp_seen && odp_source(q, w, stage, local, nl, total)))
    return {Step::kError, q.odp_seen ? IBV_WC_LOC_PROT_ERR : err};
  if (total > 4096) return {Step::kError, IBV_WC_LOC_LEN_ERR};  // larger than the path MTU
  // Sent, whether or not anyone receives it (counting.h).
  counters::bump(q.hdr->req_counts[counters::kReqOps], 1);
  counters::bump(q.hdr->req_counts[counters::kReqSends], 1);
  counters::bump(q.hdr->req_counts[counters::kReqSentBytes], total);
  if (is_multicast(w)) {
    std::vector<uint32_t> members;
    if (w.ud_qpn != kMulticastQpn || !mcast_members(*q.ctx->st, w.ud_grh ? w.ud_dgid : nullptr,
                                                    uint16_t(w.ud_dlid), members))
      return {Step::kDone, IBV_WC_SUCCESS, false, uint32_t(total)};  // nobody listens: dropped
    for (uint32_t m : members) {
      if (m == q.qpn && q.block_self_mcast) continue;  // IBV_QP_CREATE_BLOCK_SELF_MCAST_LB
      if (Peer* p = ud_peer(q, m)) deliver_ud(q, *p, w, local, nl, total);
    }
    return {Step::kDone, IBV_WC_SUCCESS, false, uint32_t(total)};
  }
  if (w.ud_grh && !gid_is_local(w.ud_dgid)) return {Step::kDone};  // another host: not on this wire yet
  Peer* p = ud_peer(q, w.ud_qpn);
  if (!p) return {Step::kDone};
  if (!deliver_ud(q, *p, w, local, nl, total)) return {Step::kDone};
  return {Step::kDone, IBV_WC_SUCCESS, false, uint32_t(total)};
}

int post_ud_on_wire(ProcessQp& q, ibv_send_wr* wr, ibv_send_wr** bad, bool all_or_nothing, PostFn local) {
  // wr.ud shares its bytes with wr.rdma and wr.atomic: the AH is read only
  // for an opcode a UD QP takes (IBTA 9.7.1 / ibv_post_send(3): SEND and
  // SEND_WITH_IMM); any other is refused by post_queue's checks (the
  // work-request fuzzer read a WRITE's remote address as an AH pointer).
  auto ours = [&q](const ibv_send_wr* w) {
    return (opcode_of(w) == IBV_WR_SEND || opcode_of(w) == IBV_WR_SEND_WITH_IMM) && w->wr.ud.ah &&
           w->wr.ud.ah->context == q.self->qpx.qp_base.context;
  };
  if (!wr || !ours(wr) || !roce_ud_multicast(q, wr))
    return wr && ours(wr) && roce_ud_remote(q, wr) ? roce_post_send(q, wr, bad) : local(q, wr, bad, all_or_nothing);
  // Multicast: each request to a group goes on the wire (unsignaled,
  // roce_post_mcast) and then, through shared memory, to this host's
  // members, which completes it; in order, one by one.
  for (; wr; wr = wr->next) {
    ibv_send_wr one = *wr;
    one.next = nullptr;
    ibv_send_wr* b = nullptr;
    const bool mcast = ours(wr) && roce_ud_multicast(q, wr);
    if (mcast) roce_post_mcast(q, &one);  // the local path goes on whatever the wire said
    const int rc = !mcast && ours(wr) && roce_ud_remote(q, wr) ? roce_post_send(q, &one, &b) : local(q, &one, &b, false);
    if (rc) {
      *bad = wr;
      return rc;
    }
  }
  return 0;
}

}  // namespace sv::verbs
