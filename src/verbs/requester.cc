// The requester: ibv_post_send carries out each work request itself, in
// the posting process, straight into the responder's memory through shared
// memory (docs/ARCHITECTURE.md, "Data path"). A request that must wait (RNR,
// responder not reachable yet) stays in the QP's send queue, with the ones
// after it, until the progress thread retries it (IBTA 9.7.5.2.8 RNR, 9.7.6.1.3
// timeouts). Responder-side checks follow IBTA 9.7.4.1 (validation of
// incoming requests) and 10.6.7 (memory access rights).
//
// Also here: the per-QP operations of every path (transport.h: the ops
// tables and choose_transport, at the end). UD is in requester_ud.cc; what
// the daemon carries out (binds, local invalidation, mediated peers) in
// requester_daemon.cc; the work-request rules in wr_rules.h.
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/access.h"
#include "common/responder_core.h"
#include "common/trace.h"
#include "verbs/capture.h"
#include "verbs/counting.h"
#include "verbs/fault_ops.h"
#include "verbs/provider.h"
#include "verbs/requester_internal.h"
#include "verbs/roce_link.h"
#include "verbs/transport.h"
#include "verbs/wr_rules.h"

namespace sv::verbs {
namespace {

constexpr uint64_t kMaxMessage = 1ull << 31;

}  // namespace

// Copies between two scatter lists in order, the final piece with its last
// byte stored last (core::store_tail_last), so a poller watching the final
// byte of the target (as perftest's latency tests do) sees a complete message.
void copy_segments(const Seg* dst, int nd, const Seg* src, int ns, uint64_t total) {
  int di = 0, si = 0;
  uint64_t doff = 0, soff = 0, done = 0;
  while (done < total) {
    while (di < nd && doff == dst[di].len) di++, doff = 0;
    while (si < ns && soff == src[si].len) si++, soff = 0;
    uint64_t n = std::min(dst[di].len - doff, src[si].len - soff);
    n = std::min(n, total - done);
    uint8_t* d = dst[di].p + doff;
    const uint8_t* s = src[si].p + soff;
    if (done + n == total) {
      core::store_tail_last(d, s, n);
    } else {
      std::memcpy(d, s, n);
    }
    doff += n;
    soff += n;
    done += n;
  }
}

namespace {

// Resolves a local SGE (IBTA 10.6.7.1: L_Key, PD, bounds, local write).
bool local_segment(ProcessQp& q, const shm::Sge& sge, bool write, Seg& out) {
  ContextState& cs = *q.ctx->st;
  if (sge.length == 0) {
    out = {nullptr, 0};
    return true;
  }
  const MrEntry* e = cs.mr(sge.lkey);
  if (!access::permits(e, access::Use::kLocal, {q.pd->handle, q.qpn, 0}, write ? IBV_ACCESS_LOCAL_WRITE : 0, sge.addr,
                       sge.length))
    return false;
  uint64_t off = access::file_offset(*e, sge.addr);
  if (e->backing == cs.backing) {
    out = {reinterpret_cast<uint8_t*>(off), sge.length};  // our own memory: file offset == address
    return true;
  }
  if (e->backing == shm::kOdpBacking) return !(q.odp_seen = true);  // requester_odp.cc carries it out
  if (e->owner_pid == self_pid()) {
    // Memory this process mapped itself (a named region): no second mapping.
    std::lock_guard<std::mutex> g(cs.mu);
    if (auto v = cs.local_views.find(e->backing); v != cs.local_views.end()) {
      out = {v->second.first + (off - v->second.second), sge.length};
      return true;
    }
  }
  auto w = window_for(cs, *e, sge.lkey);
  if (!w) return false;
  out = {w->at(off), sge.length};
  return true;
}

// Resolves an address in a peer's memory through its key (IBTA 10.6.7.2:
// R_Key or L_Key, PD of the responder's QP, bounds, access rights, and for
// an R_Key the responder QP's remote access flags; common/access.h).
[[gnu::always_inline]] inline const MrEntry* peer_key(const ContextState& cs, const Peer& p, uint32_t key, uint64_t addr, uint64_t len,
                               uint32_t need) {
  // Receive buffers (local write) are named by L_Key, the rest by R_Key.
  const access::Use use = need == IBV_ACCESS_LOCAL_WRITE ? access::Use::kLocal : access::Use::kRemote;
  const access::User who{p.pd ? p.pd : p.entry->pd, p.qpn, p.entry->access.load(std::memory_order_relaxed)};
  const MrEntry* e = cs.mr(key);
  return access::permits(e, use, who, need, addr, len) ? e : nullptr;
}

uint8_t* peer_address(ProcessQp& q, const Peer& p, uint32_t key, uint64_t addr, uint64_t len, uint32_t need) {
  ContextState& cs = *q.ctx->st;
  const MrEntry* e = peer_key(cs, p, key, addr, len, need);
  if (!e) return nullptr;
  // The hot path uses the QP's last window without touching its reference
  // count; only a different key goes to the context's window cache.
  Window* w = q.last_window.get();
  if (!w || !w->current(key, *e)) {
    if (e->backing == shm::kOdpBacking) return (q.odp_seen = true, nullptr);  // requester_odp.cc carries it out
    std::shared_ptr<Window> sp = window_for(cs, *e, key);
    if (!sp) return nullptr;
    q.last_window = std::move(sp);
    w = q.last_window.get();
  }
  return w->at(access::file_offset(*e, addr));
}

}  // namespace

// The plain resolutions, for requester_odp.cc.
bool plain_local_segment(ProcessQp& q, const shm::Sge& sge, bool write, Seg& out) {
  return local_segment(q, sge, write, out);
}
uint8_t* plain_peer_address(ProcessQp& q, const Peer& p, uint32_t key, uint64_t addr, uint64_t len, uint32_t need) {
  return peer_address(q, p, key, addr, len, need);
}
const MrEntry* checked_peer_key(ProcessQp& q, const Peer& p, uint32_t key, uint64_t addr, uint64_t len, uint32_t need) {
  return peer_key(*q.ctx->st, p, key, addr, len, need);
}

Peer* resolve_peer(ProcessQp& q) {
  uint32_t dest = q.entry->dest_qpn.load(std::memory_order_relaxed);
  Peer* p = q.peer.get();
  // A mediated peer (another user's QP) has no entry in this user's device
  // segment: the daemon checks its state at each operation (Op::Mediate).
  if (!p || p->qpn != dest || (!p->mediated && p->entry->qpn.load(std::memory_order_acquire) != dest)) {
    q.peer.reset();
    q.last_window.reset();
    ContextState& cs = *q.ctx->st;
    proto::HandleReq req{};
    req.handle = q.qpn;
    proto::ConnectPeerReply rep{};
    std::vector<Fd> fds;
    if (cs.conn.call<proto::Op::ConnectPeer>(req, rep, {}, &fds) != 0) return nullptr;
    auto np = std::make_unique<Peer>();
    if (rep.mediated) {
      np->qpn = rep.peer_qpn;
      np->entry = nullptr;  // not in our device segment: never read
      np->mediated = true;
      np->min_rnr_timer = uint8_t(rep.min_rnr_timer);
    } else if (attach_peer(cs, *np, rep, fds)) {
      return nullptr;
    }
    q.peer = std::move(np);
    p = q.peer.get();
    choose_transport(q);  // shared memory, or through the daemon for another user's QP
  }
  if (p->mediated) return p;
  auto st = p->entry->state.load(std::memory_order_acquire);
  if (st != IBV_QPS_RTR && st != IBV_QPS_RTS && st != IBV_QPS_SQD && st != IBV_QPS_SQE) return nullptr;
  if (p->entry->dest_qpn.load(std::memory_order_relaxed) != q.qpn) return nullptr;
  return p;
}

// Gathers the local source of a send, write or atomic.
bool gather(ProcessQp& q, const shm::SendWqe& w, Seg* segs, int& n, uint64_t& total, ibv_wc_status& err) {
  n = 0;
  total = 0;
  if (w.send_flags & IBV_SEND_INLINE) {
    if (w.send_flags & kInlineCaptured) {
      segs[n++] = {const_cast<uint8_t*>(w.inline_data), w.inline_len};
      total = w.inline_len;
    } else {
      for (uint32_t i = 0; i < w.num_sge; ++i) {
        segs[n++] = {reinterpret_cast<uint8_t*>(w.sge[i].addr), w.sge[i].length};
        total += w.sge[i].length;
      }
    }
    return true;
  }
  for (uint32_t i = 0; i < w.num_sge; ++i) {
    if (!local_segment(q, w.sge[i], false, segs[n])) {
      err = IBV_WC_LOC_PROT_ERR;
      return false;
    }
    total += segs[n++].len;
  }
  if (total > kMaxMessage) {
    err = IBV_WC_LOC_LEN_ERR;
    return false;
  }
  return true;
}

// Resolves a receive WQE's scatter list in the responder's memory for a
// message of `len` bytes (core::scatter_receive: the length, then the
// L_Keys, in its PD with local write, of the buffers the message reaches):
// Check::kOk with `remote` filled (nr pieces), or the check that failed.
SV_HOT core::Check resolve_recv(ProcessQp& q, Peer& p, const shm::RecvWqe& r, uint64_t len, Seg* remote, uint32_t& nr) {
  uint32_t k = 0;
  const core::Check c =
      core::scatter_receive(r.sge, r.num_sge, 0, len, [&](const shm::Sge& s, uint64_t at, uint64_t n, uint64_t) {
        uint8_t* d = peer_address(q, p, s.lkey, s.addr + at, n, IBV_ACCESS_LOCAL_WRITE);
        remote[k++] = {d, n};
        return d != nullptr;
      });
  nr = k;
  return c;
}

namespace {

// The receive completion (core::receive_completion) into the responder's CQ;
// inlined into the fast path.
[[gnu::always_inline]] inline void deliver_recv_completion(ProcessQp& q, Peer& p, uint64_t recv_wr_id,
                                                           ibv_wc_status status, uint32_t len, uint32_t opcode,
                                                           uint32_t send_flags, uint32_t imm_data,
                                                           uint32_t invalidate_rkey) {
  const ibv_wc wc = core::receive_completion(recv_wr_id, status, opcode, len, p.qpn, q.qpn, imm_data, invalidate_rkey);
  // The torn record goes when the completion is written, before it can be
  // polled: a kill at any point leaves one of them, never both (a duplicate)
  // nor neither (a receive lost).
  if (!p.recv_cq.push(wc, (send_flags & IBV_SEND_SOLICITED) || status != IBV_WC_SUCCESS, &q.hdr->torn_qpn))
    q.hdr->torn_qpn.store(0, std::memory_order_release);  // see pop_peer_recv
}

}  // namespace

SV_HOT void push_recv_completion(ProcessQp& q, Peer& p, uint64_t recv_wr_id, ibv_wc_status status, uint32_t len,
                                 uint32_t opcode, uint32_t send_flags, uint32_t imm_data, uint32_t invalidate_rkey) {
  deliver_recv_completion(q, p, recv_wr_id, status, len, opcode, send_flags, imm_data, invalidate_rkey);
}

void push_recv_completion(ProcessQp& q, Peer& p, const shm::RecvWqe& r, ibv_wc_status status, uint32_t len,
                          const shm::SendWqe& w) {
  push_recv_completion(q, p, r.wr_id, status, len, w.opcode, w.send_flags, w.imm_data, w.invalidate_rkey);
}

namespace {

// XRC (IBTA annex A14): the message goes through the target QP to the XRC SRQ
// it names, whose CQ takes the receive completion. One Peer per SRQ number.
// Null with `invalid` set when the target's domain has no such SRQ.
Peer* xrc_peer(ProcessQp& q, uint32_t srqn, bool& invalid) {
  uint32_t dest = q.entry->dest_qpn.load(std::memory_order_relaxed);
  auto it = q.ud_peers.find(srqn);
  Peer* p = it == q.ud_peers.end() ? nullptr : it->second.get();
  if (!p || p->qpn != dest || p->entry->qpn.load(std::memory_order_acquire) != dest) {
    if (p) q.ud_peers.erase(it);
    q.last_window.reset();
    ContextState& cs = *q.ctx->st;
    proto::ConnectXrcReq req{};
    req.qpn = q.qpn;
    req.srqn = srqn;
    proto::ConnectPeerReply rep{};
    std::vector<Fd> fds;
    int e = cs.conn.call<proto::Op::ConnectXrc>(req, rep, {}, &fds);
    if (e == ENOENT) invalid = true;
    if (e) return nullptr;
    auto np = std::make_unique<Peer>();
    if (attach_peer(cs, *np, rep, fds)) return nullptr;
    p = np.get();
    q.ud_peers[srqn] = std::move(np);
  }
  auto st = p->entry->state.load(std::memory_order_acquire);
  if (st != IBV_QPS_RTR && st != IBV_QPS_RTS) return nullptr;
  if (p->entry->dest_qpn.load(std::memory_order_relaxed) != q.qpn) return nullptr;
  return p;
}

// The request of a SEND to a shared-memory peer: the responder's receive
// takes the message (IBTA 9.7.5.2 for its errors).
Outcome send_to(ProcessQp& q, Peer& p, const shm::SendWqe& w) {
  Seg local[shm::kMaxSge];
  int nl = 0;
  uint64_t total = 0;
  ibv_wc_status err = IBV_WC_SUCCESS;
  if (!gather(q, w, local, nl, total, err)) return {Step::kError, err};
  shm::RecvWqe r;
  if (!pop_peer_recv(q, p, r)) return {Step::kRnr};
  Seg remote[shm::kMaxSge];
  uint32_t nr = 0;
  if (core::Check c = resolve_recv(q, p, r, total, remote, nr); c != core::Check::kOk) {
    if (q.odp_seen) return odp_send_into(q, p, w, r);
    // The responder's receive completes in error; what the requester sees
    // is the same check's (core::verdict, IBTA 9.7.5.2).
    push_recv_completion(q, p, r, core::verdict(c).receive_status, 0, w);
    return {Step::kError, core::requester_status(c), true};
  }
  copy_segments(remote, int(nr), local, nl, total);
  if (w.opcode == IBV_WR_SEND_WITH_INV) {
    // Remote invalidation of the responder's type 2 window (IBTA 9.4.1.2.1).
    proto::InvalidateReq req{};
    req.key = w.invalidate_rkey;
    req.qpn = q.qpn;
    req.remote = 1;
    proto::Empty rep{};
    if (q.ctx->st->conn.call<proto::Op::InvalidateKey>(req, rep)) {
      constexpr core::Check c = core::Check::kInvalidateRefused;
      push_recv_completion(q, p, r, core::verdict(c).receive_status, 0, w);
      return {Step::kError, core::requester_status(c), true};
    }
  }
  push_recv_completion(q, p, r, IBV_WC_SUCCESS, uint32_t(total), w);
  return {Step::kDone, IBV_WC_SUCCESS, false, uint32_t(total)};
}

// RDMA WRITE (with immediate: it takes a receive too), IBTA 9.4.3.
Outcome write_to(ProcessQp& q, Peer& p, const shm::SendWqe& w) {
  Seg local[shm::kMaxSge];
  int nl = 0;
  uint64_t total = 0;
  ibv_wc_status err = IBV_WC_SUCCESS;
  if (!gather(q, w, local, nl, total, err)) return {Step::kError, err};
  uint8_t* d = nullptr;
  if (total) {
    d = peer_address(q, p, w.rkey, w.remote_addr, total, IBV_ACCESS_REMOTE_WRITE);
    if (!d) return {Step::kError, IBV_WC_REM_ACCESS_ERR, true};
  }
  shm::RecvWqe r;
  if (w.opcode == IBV_WR_RDMA_WRITE_WITH_IMM && !pop_peer_recv(q, p, r)) return {Step::kRnr};
  Seg dst{d, total};
  if (total) copy_segments(&dst, 1, local, nl, total);
  if (w.opcode == IBV_WR_RDMA_WRITE_WITH_IMM)
    push_recv_completion(q, p, r, IBV_WC_SUCCESS, uint32_t(total), w);
  return {Step::kDone, IBV_WC_SUCCESS, false, uint32_t(total)};
}

// RDMA READ, IBTA 9.4.4: the local SGEs are the destination.
Outcome read_from(ProcessQp& q, Peer& p, const shm::SendWqe& w) {
  Seg local[shm::kMaxSge];
  int nl = 0;
  uint64_t total = 0;
  for (uint32_t i = 0; i < w.num_sge; ++i) {
    if (!local_segment(q, w.sge[i], true, local[nl])) return {Step::kError, IBV_WC_LOC_PROT_ERR};
    total += local[nl++].len;
  }
  if (total > kMaxMessage) return {Step::kError, IBV_WC_LOC_LEN_ERR};
  if (total) {
    uint8_t* s = peer_address(q, p, w.rkey, w.remote_addr, total, IBV_ACCESS_REMOTE_READ);
    if (!s) return {Step::kError, IBV_WC_REM_ACCESS_ERR, true};
    Seg src{s, total};
    copy_segments(local, nl, &src, 1, total);
  }
  return {Step::kDone, IBV_WC_SUCCESS, false, uint32_t(total)};
}

// Compare-and-swap and fetch-and-add on the responder's quadword, IBTA 9.4.5.
Outcome atomic_at(ProcessQp& q, Peer& p, const shm::SendWqe& w) {
  Seg res;
  if (!local_segment(q, w.sge[0], true, res)) return {Step::kError, IBV_WC_LOC_PROT_ERR};
  // IBTA 9.4.5: atomics act on an 8-byte aligned remote quadword.
  if (access::Fault f = core::check_atomic(w.opcode, res.len, w.remote_addr); f != access::Fault::kNone)
    return {Step::kError, access::status(f), access::responder_detected(f)};
  uint8_t* t = peer_address(q, p, w.rkey, w.remote_addr, 8, IBV_ACCESS_REMOTE_ATOMIC);
  if (!t) return {Step::kError, IBV_WC_REM_ACCESS_ERR, true};
  const uint64_t old = core::apply_atomic(reinterpret_cast<uint64_t*>(t), w.opcode == IBV_WR_ATOMIC_CMP_AND_SWP,
                                         w.compare_add, w.swap);
  std::memcpy(res.p, &old, 8);
  return {Step::kDone, IBV_WC_SUCCESS, false, 8};
}

// ATOMIC WRITE (IBTA annex A19): the 8 bytes as one aligned store.
Outcome atomic_write_at(ProcessQp& q, Peer& p, const shm::SendWqe& w) {
  Seg local[shm::kMaxSge];
  int nl = 0;
  uint64_t total = 0;
  ibv_wc_status err = IBV_WC_SUCCESS;
  if (!gather(q, w, local, nl, total, err)) return {Step::kError, err};
  if (core::Check c = core::check_atomic_write(total, w.remote_addr); c != core::Check::kOk)
    return {Step::kError, core::requester_status(c), true};
  uint8_t* t = peer_address(q, p, w.rkey, w.remote_addr, 8, IBV_ACCESS_REMOTE_WRITE);
  if (!t) return {Step::kError, IBV_WC_REM_ACCESS_ERR, true};
  uint64_t v = 0;
  const Seg dst{reinterpret_cast<uint8_t*>(&v), 8};
  copy_segments(&dst, 1, local, nl, 8);
  core::store_atomic_write(reinterpret_cast<uint64_t*>(t), v);
  return {Step::kDone, IBV_WC_SUCCESS, false, 8};
}

// FLUSH (IBTA annex A19): the R_Key must grant the FLUSH rights of its
// placement type over the range, or over the whole region for selectivity
// MR (core::flush_extent); then core::apply_flush. Its completion carries
// the length it was given, as rxe's.
Outcome flush_at(ProcessQp& q, Peer& p, const shm::SendWqe& w) {
  const uint8_t placement = uint8_t(w.swap), level = uint8_t(w.swap >> 8);
  if (core::Check c = core::check_flush(placement, level); c != core::Check::kOk)
    return {Step::kError, core::requester_status(c), true};
  const MrEntry* e = q.ctx->st->mr(w.rkey);
  if (!e) return {Step::kError, IBV_WC_REM_ACCESS_ERR, true};
  const core::Extent x = core::flush_extent(*e, level, w.remote_addr, w.compare_add);
  const uint32_t need = rules::flush_need(placement);
  uint8_t* t = nullptr;
  if (x.len ? !(t = peer_address(q, p, w.rkey, x.addr, x.len, need)) : !peer_key(*q.ctx->st, p, w.rkey, x.addr, 0, need))
    return {Step::kError, IBV_WC_REM_ACCESS_ERR, true};
  if (!core::apply_flush(t, x.len, placement))
    return {Step::kError, core::requester_status(core::Check::kResponderFault), true};
  return {Step::kDone, IBV_WC_SUCCESS, false, uint32_t(w.compare_add)};
}

// A request to a peer in shared memory, by the kind its opcode rule names
// (wr_rules.h; validate_wr() accepted it for this QP type).
Outcome execute_plain(ProcessQp& q, Peer& p, const shm::SendWqe& w) {
  switch (wr_rule(w.opcode).kind) {
    case WrKind::kSend: return send_to(q, p, w);
    case WrKind::kWrite: return write_to(q, p, w);
    case WrKind::kRead: return read_from(q, p, w);
    case WrKind::kAtomic: return atomic_at(q, p, w);
    case WrKind::kAtomicWrite: return atomic_write_at(q, p, w);
    case WrKind::kFlush: return flush_at(q, p, w);
    default: return {Step::kError, IBV_WC_LOC_QP_OP_ERR};
  }
}

// A key that names ODP memory stops the plain path before it changed
// anything (odp_seen); the request is then carried out by requester_odp.cc.
// Either way it is counted (counting.h) when it was carried out.
Outcome execute_at(ProcessQp& q, Peer& p, const shm::SendWqe& w) {
  q.odp_seen = false;
  Outcome o = execute_plain(q, p, w);
  if (o.step == Step::kError && q.odp_seen) [[unlikely]] o = execute_odp(q, p, w);
  const WrRule& r = wr_rule(w.opcode);
  if (o.step == Step::kDone) count_done<false>(*q.hdr, *p.hdr, r.kind, r.flags & kWrRecv, o.byte_len);
  return o;
}

// The execute operation of RC (and, through execute_uc, UC) QPs. A local
// operation needs no peer. resolve_peer() (re)connects the QP when its
// destination changed and chooses its ops again (choose_transport): when a
// reconnection changed the path, the request takes the new one.
Outcome execute_rc(ProcessQp& q, const shm::SendWqe& w) {
  if (wr_rule(w.opcode).kind == WrKind::kLocal) return execute_local(q, w);
  Peer* p = resolve_peer(q);
  if (!p) return {Step::kRetry};
  if (p->mediated) return execute_mediated(q, w);
  return execute_at(q, *p, w);
}

// XRC initiators reach the target's SRQ the request names.
Outcome execute_xrc(ProcessQp& q, const shm::SendWqe& w) {
  if (wr_rule(w.opcode).kind == WrKind::kLocal) return execute_local(q, w);
  bool invalid = false;
  Peer* p = xrc_peer(q, w.xrc_srqn, invalid);
  if (invalid) return {Step::kError, IBV_WC_REM_INV_REQ_ERR};
  if (!p) return {Step::kRetry};
  return execute_at(q, *p, w);
}

}  // namespace

void fail(ProcessQp& q, const shm::SendWqe& w, const Outcome& o) {
  SV_TRACE("QP 0x%x: wr_id %llu failed: %s", q.qpn, (unsigned long long)w.wr_id, ibv_wc_status_str(o.status));
  if (!q.peer || !q.peer->mediated) count_error(*q.hdr, o.status);  // the daemon counts a mediated one
  enter_error_state(q);  // before the completion: a poller's ibv_query_qp then says ERR
  complete(q, w, o.status, 0);
  if (o.peer_error && q.peer) {
    proto::PeerErrorReq req{};
    req.handle = q.qpn;
    req.wc_status = o.status;
    proto::Empty rep{};
    q.ctx->st->conn.call<proto::Op::PeerError>(req, rep);
    if (!q.peer->mediated) flush_peer_rq(*q.peer);  // else the daemon flushed it
  }
  flush_queues(q);
}

Outcome execute_rc_mediated(ProcessQp& q, const shm::SendWqe& w) {
  if (wr_rule(w.opcode).kind == WrKind::kLocal) return execute_local(q, w);
  Peer* p = resolve_peer(q);
  if (!p) return {Step::kRetry};
  if (!p->mediated) return execute_at(q, *p, w);
  return execute_mediated(q, w);
}

// IBTA 9.8: an unreliable connection has no acknowledgements. A message the
// responder cannot take (no receive posted, peer not ready, bad key or
// length) is dropped there, and the requester completes it successfully;
// a receive that was consumed completes with its error at the responder.
Outcome uc_outcome(const Outcome& o) {
  if (o.step == Step::kRnr || o.step == Step::kRetry) return {Step::kDone};
  if (o.step == Step::kError && o.peer_error) return {Step::kDone};
  return o;
}

Outcome execute_uc(ProcessQp& q, const shm::SendWqe& w) { return uc_outcome(execute_rc(q, w)); }
Outcome execute_uc_mediated(ProcessQp& q, const shm::SendWqe& w) { return uc_outcome(execute_rc_mediated(q, w)); }

Outcome run(ProcessQp& q, const shm::SendWqe& w) { return q.ops.load(std::memory_order_relaxed)->execute(q, w); }

namespace {

// ---- The fast path ----------------------------------------------------------
//
// Most work requests are an RDMA WRITE, READ or SEND of at most one SGE on a
// connected QP whose peer is attached already, with nothing queued before
// them. fast_post() carries those out straight from the ibv_send_wr, with
// every check of the general path (validate_wr(), resolve_peer(), gather(),
// peer_address(), IBTA 10.6.7 key checks) but without building a SendWqe,
// without a call per step, and with a single store for small payloads.
// Anything else -- an error to report, a key whose window is not the QP's
// last one, a peer to (re)connect, an empty receive queue -- makes it return
// false *before it changed anything*, and the general path handles the
// request from scratch, so the outcome is the same either way.

// The peer as resolve_peer() accepts it, without (re)connecting.
inline Peer* attached_peer(ProcessQp& q) {
  Peer* p = q.peer.get();
  if (!p || p->mediated) return nullptr;
  uint32_t dest = q.entry->dest_qpn.load(std::memory_order_relaxed);
  if (p->qpn != dest || p->entry->qpn.load(std::memory_order_acquire) != dest) return nullptr;
  auto st = p->entry->state.load(std::memory_order_acquire);
  if (st != IBV_QPS_RTR && st != IBV_QPS_RTS && st != IBV_QPS_SQD && st != IBV_QPS_SQE) return nullptr;
  if (p->entry->dest_qpn.load(std::memory_order_relaxed) != q.qpn) return nullptr;
  return p;
}

// The local source of a request of at most one SGE (gather() + local_segment():
// L_Key, PD, bounds, IBTA 10.6.7.1), for this process's own registered memory.
// With `local_write` (RDMA READ: the SGE is the destination) the MR must allow
// local write, and inline data is not allowed.
[[gnu::always_inline]] inline bool fast_source(ProcessQp& q, const ibv_send_wr* wr, const uint8_t*& src, uint64_t& len,
                        bool local_write = false) {
  if (wr->num_sge == 0) {
    src = nullptr;
    len = 0;
    return true;
  }
  const ibv_sge& sge = wr->sg_list[0];
  len = sge.length;
  src = reinterpret_cast<const uint8_t*>(sge.addr);
  if (wr->send_flags & IBV_SEND_INLINE) return !local_write && len <= q.cap.max_inline_data;  // the L_Key is not used
  if (len == 0) return true;
  if (len > kMaxMessage) return false;
  const ContextState& cs = *q.ctx->st;
  const MrEntry* e = cs.mr(sge.lkey);
  if (!access::permits(e, access::Use::kLocal, {q.pd->handle, q.qpn, 0}, local_write ? IBV_ACCESS_LOCAL_WRITE : 0,
                       sge.addr, len))
    return false;
  if (e->backing != cs.backing) return false;  // a named region or another process's memory
  src = reinterpret_cast<const uint8_t*>(access::file_offset(*e, sge.addr));  // file offset == address
  return true;
}

// The target of an RDMA WRITE (or source of a READ) through the QP's last
// window (peer_address()).
[[gnu::always_inline]] inline uint8_t* fast_remote(ProcessQp& q, const Peer& p, uint32_t key, uint64_t addr, uint64_t len,
                            uint32_t need = IBV_ACCESS_REMOTE_WRITE) {
  const MrEntry* e = peer_key(*q.ctx->st, p, key, addr, len, need);
  if (!e) return nullptr;
  Window* w = q.last_window.get();
  if (!w || !w->current(key, *e)) return nullptr;  // the MR may have moved (ibv_rereg_mr)
  return w->at(access::file_offset(*e, addr));
}

// fast_post's RDMA WRITE (with immediate or not): false when the general
// path must decide (a key the fast check does not grant, no receive for the
// immediate).
[[gnu::always_inline]] inline bool fast_write(ProcessQp& q, Peer& p, const ibv_send_wr* wr, uint32_t opcode,
                                              const uint8_t* src, uint64_t len) {
  uint8_t* dst = nullptr;
  if (len) {
    dst = fast_remote(q, p, wr->wr.rdma.rkey, wr->wr.rdma.remote_addr, len);
    if (!dst) return false;
  }
  shm::RecvWqe r;
  if (opcode == IBV_WR_RDMA_WRITE_WITH_IMM) {
    p.recv_cq.prefetch_push();  // as for a SEND (fast_post): the completion is what the responder waits for
    if (!pop_peer_recv(q, p, r)) return false;
  }
  count_done<true>(*q.hdr, *p.hdr, WrKind::kWrite, opcode == IBV_WR_RDMA_WRITE_WITH_IMM, len);  // nothing fails now
  core::store_tail_last(dst, src, len);
  // Bookkeeping after the data store, which is what the responder waits for.
  if (len) {
    q.hint_rkey.store(wr->wr.rdma.rkey, std::memory_order_relaxed);
    q.hint_delta.store(reinterpret_cast<uintptr_t>(dst) - uintptr_t(wr->wr.rdma.remote_addr),
                       std::memory_order_relaxed);
  }
  if (opcode == IBV_WR_RDMA_WRITE_WITH_IMM)
    deliver_recv_completion(q, p, r.wr_id, IBV_WC_SUCCESS, uint32_t(len), opcode, wr->send_flags, wr->imm_data, 0);
  return true;
}

// A SEND whose receive the responder core refused (`c`): as execute()
// (IBTA 9.7.5.2), and execute_uc() for UC, the receive completes in error
// at the responder; the requester fails on RC only.
[[gnu::noinline]] void fast_receive_fault(ProcessQp& q, Peer& p, const shm::RecvWqe& r, core::Check c,
                                          const ibv_send_wr* wr, uint32_t opcode) {
  shm::SendWqe w;
  to_send_wqe(q, wr, w);
  if (q.odp_seen) {  // a receive buffer in ODP memory
    const Outcome o = odp_send_into(q, p, w, r);
    if (o.step == Step::kDone) complete(q, w, IBV_WC_SUCCESS, o.byte_len);
    else if (q.type == IBV_QPT_UC) complete(q, w, IBV_WC_SUCCESS, 0);
    else fail(q, w, o);
    return;
  }
  push_recv_completion(q, p, r.wr_id, core::verdict(c).receive_status, 0, opcode, wr->send_flags, wr->imm_data, 0);
  if (q.type == IBV_QPT_UC)
    complete(q, w, IBV_WC_SUCCESS, 0);
  else
    fail(q, w, {Step::kError, core::requester_status(c), true});
}

// Called with the send lock held. True when the request was carried out
// (and completed); false when the general path must take it, nothing done.
// Only the shared-memory ops of RC and UC QPs take it (post_shm<true>).
[[gnu::always_inline]] inline bool fast_post(ProcessQp& q, const ibv_send_wr* wr) {
  const uint32_t opcode = opcode_of(wr);
  // The opcode rules (wr_rules.h) say whether this path takes it (SEND,
  // RDMA WRITE, READ; with immediate or not) and whether the QP type has
  // it: READ is not on UC (IBTA 9.8).
  if (!fast_opcode(q.type, opcode)) return false;
  const WrRule& rule = wr_rule(opcode);
  const bool send = rule.kind == WrKind::kSend;
  const bool read = rule.kind == WrKind::kRead;
  const bool write = !send && !read;
  if (uint32_t(wr->num_sge) > 1 || uint32_t(wr->num_sge) > q.cap.max_send_sge) return false;
  if (q.entry->state.load(std::memory_order_acquire) == IBV_QPS_ERR || !q.sq.empty()) return false;
  Peer* p = attached_peer(q);
  if (!p) return false;
  const uint8_t* src;
  uint64_t len;
  if (!fast_source(q, wr, src, len, read)) return false;

  if (read) {
    // As execute(): the local SGE is the destination, the peer's memory the source.
    if (len) {
      const uint8_t* from =
          fast_remote(q, *p, wr->wr.rdma.rkey, wr->wr.rdma.remote_addr, len, IBV_ACCESS_REMOTE_READ);
      if (!from) return false;
      count_done<true>(*q.hdr, *p->hdr, WrKind::kRead, false, len);  // nothing fails from here on
      core::store_tail_last(const_cast<uint8_t*>(src), from, len);
    } else {
      count_done<true>(*q.hdr, *p->hdr, WrKind::kRead, false, 0);
    }
  } else if (write) {
    if (!fast_write(q, *p, wr, opcode, src, len)) return false;
  } else {
    // The receive completion ends this SEND and the responder is polling
    // for it: start taking its CQ slot now, so that the transfer overlaps
    // taking the receive, the checks and the copy.
    p->recv_cq.prefetch_push();
    shm::RecvWqe r;
    if (!pop_peer_recv(q, *p, r)) return false;  // RNR (or a UC drop): the general path decides
    Seg remote[shm::kMaxSge];
    uint32_t nr = 0;
    if (core::Check c = resolve_recv(q, *p, r, len, remote, nr); c != core::Check::kOk) {
      fast_receive_fault(q, *p, r, c, wr, opcode);
      return true;
    }
    if (nr == 1) {
      core::store_tail_last(remote[0].p, src, len);
    } else {
      Seg local{const_cast<uint8_t*>(src), len};
      copy_segments(remote, int(nr), &local, 1, len);
    }
    deliver_recv_completion(q, *p, r.wr_id, IBV_WC_SUCCESS, uint32_t(len), opcode, wr->send_flags, wr->imm_data, 0);
    count_done<true>(*q.hdr, *p->hdr, WrKind::kSend, true, len);
  }
  if (q.sq_sig_all || (wr->send_flags & IBV_SEND_SIGNALED))
    push_send_completion(q, wr->wr_id, send ? IBV_WC_SEND : read ? IBV_WC_RDMA_READ : IBV_WC_RDMA_WRITE,
                         IBV_WC_SUCCESS, uint32_t(len));
  // The receive the next SEND takes was written by the responder's process:
  // fetch it now, while the responder handles this message, not on the next
  // post's critical path.
  if (send) (p->srq_hdr ? p->srq : p->rq).prefetch_next_pop();
  return true;
}

// ---- The post operations of each path (transport.h) --------------------------

// An RDMA WRITE through the same key as the last one most likely lands
// where that translation says: start taking its last line for writing now,
// so that the transfer overlaps the checks and the lock (first thing: the
// transfer is the longest part of a WRITE). A prefetch never faults and
// changes nothing but timing; the checks decide.
inline void prefetch_write_target(ProcessQp& q, const ibv_send_wr* wr) {
  if (wr && wr->num_sge == 1 && (opcode_of(wr) == IBV_WR_RDMA_WRITE || opcode_of(wr) == IBV_WR_RDMA_WRITE_WITH_IMM)) {
    uint32_t key = q.hint_rkey.load(std::memory_order_relaxed);
    if (key && wr->wr.rdma.rkey == key && wr->sg_list[0].length) {
      uintptr_t last = uintptr_t(wr->wr.rdma.remote_addr) + wr->sg_list[0].length - 1 +
                       q.hint_delta.load(std::memory_order_relaxed);
      asm volatile("prefetchw %0" ::"m"(*reinterpret_cast<const char*>(last)));
    }
  }
}

// 0, or the errno of a send queue that takes no request now (with *bad set).
inline int refuse_post(ProcessQp& q, ibv_send_wr* wr, ibv_send_wr** bad) {
  if (q.ctx->st->dead.load(std::memory_order_relaxed)) {  // IBV_EVENT_DEVICE_FATAL happened
    *bad = wr;
    return EIO;
  }
  auto state = ibv_qp_state(q.entry->state.load(std::memory_order_acquire));
  // IBTA 10.8.2: the send queue accepts work requests in RTS, SQD and SQE
  // (and in ERR, where they are flushed); earlier states refuse them.
  if (state == IBV_QPS_RESET || state == IBV_QPS_INIT || state == IBV_QPS_RTR ||
      q.entry->qpn.load(std::memory_order_relaxed) != q.qpn) {  // or destroyed by another sharer
    *bad = wr;
    return EINVAL;
  }
  return 0;
}

// ibv_wr_complete(3): the whole batch is posted or none of it. Every WR
// might have to wait in the send queue, so all of them must fit there.
int check_batch(ProcessQp& q, ibv_send_wr* wr, ibv_send_wr** bad) {
  uint64_t n = 0;
  for (ibv_send_wr* w = wr; w; w = w->next, ++n) {
    if (int e = validate_wr(q, w)) {
      *bad = w;
      return e;
    }
  }
  mediated_reap(q);
  if (q.sq.size() + n > q.cap.max_send_wr) {
    *bad = wr;
    return ENOMEM;
  }
  return 0;
}

// One request on the general path, with the send lock held: carried out
// now if nothing waits before it, else queued for the progress thread
// (`queued`). 0, or the errno for which it was refused.
int post_one(ProcessQp& q, const ibv_send_wr* wr, bool& queued) {
  if (int e = validate_wr(q, wr)) return e;
  shm::SendWqe w;
  to_send_wqe(q, wr, w);
  // Behind pipelined requests in flight, even a flushed one waits its turn.
  const bool behind = q.hdr->med_pid.load(std::memory_order_relaxed) != 0;
  if (!behind && q.entry->state.load(std::memory_order_acquire) == IBV_QPS_ERR) {
    complete(q, w, IBV_WC_WR_FLUSH_ERR, 0);
    return 0;
  }
  if (q.peer && pipelines_now(q, w)) return post_pipelined(q, w, queued);
  if (q.sq.empty()) {
    Outcome o = run(q, w);
    if (o.step == Step::kDone) {
      complete(q, w, IBV_WC_SUCCESS, o.byte_len);
      return 0;
    }
    if (o.step == Step::kError) {
      fail(q, w, o);
      return 0;
    }
    q.head_started = false;
    if (!stall(q, o.step)) {
      fail(q, w, {Step::kError, o.step == Step::kRnr ? IBV_WC_RNR_RETRY_EXC_ERR : IBV_WC_RETRY_EXC_ERR});
      return 0;
    }
  }
  capture_inline(w);
  if (!q.sq.push(w)) return ENOMEM;
  queued = true;
  return 0;
}

// The shared-memory (and mediated) post: under the send lock, each request
// through the fast path if kFast and it qualifies, else the general path.
template <bool kFast>
[[gnu::always_inline]] inline int post_queue(ProcessQp& q, ibv_send_wr* wr, ibv_send_wr** bad, bool all_or_nothing) {
  int rc = 0;
  bool need_progress = false;
  // A QP of a thread domain is posted to by one thread at a time (the
  // application's promise, ibv_alloc_td(3)), and by no other process (it
  // cannot be imported): no lock, unless the progress thread has the QP.
  // That thread leaves the QP (in_progress_list false) only after its last
  // access to it, and only a poster puts the QP back on its list.
  const bool locked = !q.lockless || q.in_progress_list.load(std::memory_order_acquire);
  if (locked) q.hdr->send_lock.lock(self_pid());
  q.hdr->progress_pid.store(self_pid(), std::memory_order_relaxed);  // carries the queue now (progress_adopt)
  if (q.hdr->torn_qpn.load(std::memory_order_relaxed)) complete_torn_receive(q);
  // A request whose holder died carrying it out may look gone from the
  // queue (taken off, not completed): settled before anything runs.
  if (q.hdr->sq_running.load(std::memory_order_relaxed)) complete_dead_run(q);
  if (q.hdr->med_pid.load(std::memory_order_relaxed)) mediated_reap(q);
  if (all_or_nothing) {
    if (int e = check_batch(q, wr, bad)) {
      if (locked) q.hdr->send_lock.unlock();
      return e;
    }
  }
  for (; wr; wr = wr->next) {
    if (kFast && fast_post(q, wr)) continue;
    if ((rc = post_one(q, wr, need_progress))) {
      *bad = wr;
      break;
    }
  }
  if (!need_progress && !q.sq.empty()) need_progress = true;  // as progress_pid says, even if this queued nothing
  if (locked) q.hdr->send_lock.unlock();
  // A full send queue is drained by someone's progress thread: ours too (the
  // holder that queued those requests may have been killed since).
  if ((need_progress || rc == ENOMEM) && !q.in_progress_list) progress_register(&q);
  return rc;
}

template <bool kFast>
SV_HOT int post_shm(ProcessQp& q, ibv_send_wr* wr, ibv_send_wr** bad, bool all_or_nothing) {
  // First thing on the QP's path (in post_send, before the ops, it cost
  // READs 25 % in post_cost_bench).
  if (kFast) prefetch_write_target(q, wr);
  if (int e = refuse_post(q, wr, bad)) return e;
  return post_queue<kFast>(q, wr, bad, all_or_nothing);
}

// The peer is on another host: the RoCEv2 engine carries the requests
// (roce_link.h), which validates each with validate_wr().
int post_wire(ProcessQp& q, ibv_send_wr* wr, ibv_send_wr** bad, bool all_or_nothing) {
  if (int e = refuse_post(q, wr, bad)) return e;
  if (!wr) return post_queue<false>(q, wr, bad, all_or_nothing);
  return roce_post_send(q, wr, bad);
}

// A UD QP on the wire still reaches this host's QPs through shared memory
// (requester_ud.cc).
int post_wire_ud(ProcessQp& q, ibv_send_wr* wr, ibv_send_wr** bad, bool all_or_nothing) {
  if (int e = refuse_post(q, wr, bad)) return e;
  return post_ud_on_wire(q, wr, bad, all_or_nothing, post_queue<false>);
}

// An XRC target QP has no send queue.
int post_none(ProcessQp&, ibv_send_wr* wr, ibv_send_wr** bad, bool) {
  *bad = wr;
  return EINVAL;
}

Outcome execute_none(ProcessQp&, const shm::SendWqe&) { return {Step::kError, IBV_WC_LOC_QP_OP_ERR}; }

// The paths, per QP type. A QP on the wire queues nothing in shared memory
// (its send queue is the engine's), but its execute is its type's, for
// what might wait there from before it went on the wire.
constexpr QpOps kShmRc{"shared memory", post_shm<true>, execute_rc};
constexpr QpOps kShmUc{"shared memory", post_shm<true>, execute_uc};
constexpr QpOps kShmUd{"shared memory", post_shm<false>, execute_ud};
constexpr QpOps kShmXrc{"shared memory", post_shm<false>, execute_xrc};
constexpr QpOps kMediatedRc{"mediated", post_shm<false>, execute_rc_mediated};
constexpr QpOps kMediatedUc{"mediated", post_shm<false>, execute_uc_mediated};
constexpr QpOps kWireRc{"wire", post_wire, execute_rc};
constexpr QpOps kWireUc{"wire", post_wire, execute_uc};
constexpr QpOps kWireUd{"wire", post_wire_ud, execute_ud};
constexpr QpOps kWireXrc{"wire", post_wire, execute_xrc};
constexpr QpOps kNoSend{"none", post_none, execute_none};

// While a capture is on (capture.h), shared-memory and mediated QPs take
// these: no fast path, and each request carried out is rendered.
template <Outcome (*kExecute)(ProcessQp&, const shm::SendWqe&)>
Outcome execute_captured(ProcessQp& q, const shm::SendWqe& w) {
  Outcome o = kExecute(q, w);
  capture_request(q, w, o);
  return o;
}
constexpr QpOps kCapRc{"shared memory", post_shm<false>, execute_captured<execute_rc>};
constexpr QpOps kCapUc{"shared memory", post_shm<false>, execute_captured<execute_uc>};
constexpr QpOps kCapUd{"shared memory", post_shm<false>, execute_captured<execute_ud>};
constexpr QpOps kCapXrc{"shared memory", post_shm<false>, execute_captured<execute_xrc>};
constexpr QpOps kCapWireUd{"wire", post_wire_ud, execute_captured<execute_ud>};  // its local destinations
constexpr QpOps kCapMediatedRc{"mediated", post_shm<false>, execute_captured<execute_rc_mediated>};
constexpr QpOps kCapMediatedUc{"mediated", post_shm<false>, execute_captured<execute_uc_mediated>};

}  // namespace

void choose_transport(ProcessQp& q) {
  const bool wire = roce_attached(q);
  const bool mediated = q.peer && q.peer->mediated;
  const bool cap = capture_on(q);  // on the wire, the UDP endpoint's tap has the datagrams
  const QpOps* ops = &kNoSend;
  switch (q.type) {
    case IBV_QPT_RC: ops = wire ? &kWireRc : mediated ? (cap ? &kCapMediatedRc : &kMediatedRc) : cap ? &kCapRc : &kShmRc; break;
    case IBV_QPT_UC: ops = wire ? &kWireUc : mediated ? (cap ? &kCapMediatedUc : &kMediatedUc) : cap ? &kCapUc : &kShmUc; break;
    case IBV_QPT_UD: ops = wire ? (cap ? &kCapWireUd : &kWireUd) : cap ? &kCapUd : &kShmUd; break;
    case IBV_QPT_XRC_SEND: ops = wire ? &kWireXrc : cap ? &kCapXrc : &kShmXrc; break;
    default: break;
  }
  if (process_plan().plans_sends()) [[unlikely]] ops = planned_ops(q, ops, post_shm<false>);
  if (q.ops.load(std::memory_order_relaxed) != ops)
    SV_TRACE("QP 0x%x: %s path", q.qpn, ops->path);
  q.ops.store(ops, std::memory_order_release);
}

SV_HOT int post_send(ibv_qp* ibqp, ibv_send_wr* wr, ibv_send_wr** bad) {
  ProcessQp& q = *to_qp(ibqp)->st;
  return q.ops.load(std::memory_order_acquire)->post_send(q, wr, bad, false);
}

int post_send_all(ibv_qp* ibqp, ibv_send_wr* wr) {
  ProcessQp& q = *to_qp(ibqp)->st;
  ibv_send_wr* bad = nullptr;
  return q.ops.load(std::memory_order_acquire)->post_send(q, wr, &bad, true);
}

}  // namespace sv::verbs
