// responder.cc: request packets -> memory and receive completions (IBTA
// 9.7.4, 9.7.5.1): PSN checks, duplicate detection, RNR, NAKs, READ
// responses, atomics, and the saved resources that let duplicates of READs
// and atomics be answered without executing anything twice. UC and UD have
// their own, simpler entry points at the end.
#include <algorithm>

#include "roce/engine.h"

namespace sv::roce {

// The responder core's NAK codes are the AETH's (IBTA 9.7.5.2.4).
static_assert(uint8_t(NakCode::kInvalidRequest) == uint8_t(core::Nak::kInvalidRequest) &&
              uint8_t(NakCode::kRemoteAccess) == uint8_t(core::Nak::kRemoteAccess) &&
              uint8_t(NakCode::kRemoteOperational) == uint8_t(core::Nak::kRemoteOperational));

void EngineQp::send_ack(uint8_t syndrome, uint32_t psn) {
  rx_since_ack_ = 0;
  Packet p;
  p.bth.opcode = uint8_t(opcode_base() | op::kAck);  // XRC: no XRCETH on responses (IBTA A14)
  p.bth.pkey = cfg_.pkey;
  p.bth.dest_qp = cfg_.dest_qpn;
  p.bth.psn = psn;
  p.aeth = Aeth{syndrome, msn_ & kPsnMask};
  stats_.acks_sent++;
  emit_packet(cfg_.dest_ah, p);
}

// ACK coalescing: the AckReqs of one batch of receives get one ACK, for the
// newest PSN (IBTA 9.7.5 lets one ACK acknowledge every earlier PSN).
void EngineQp::flush_pending_ack() {
  if (!ack_pending_) return;
  ack_pending_ = false;
  send_ack(syndrome_ack(), psn_add(epsn_, -1));
}

void EngineQp::send_atomic_ack(uint32_t psn, uint64_t orig) {
  Packet p;
  p.bth.opcode = uint8_t(opcode_base() | op::kAtomicAck);
  p.bth.pkey = cfg_.pkey;
  p.bth.dest_qp = cfg_.dest_qpn;
  p.bth.psn = psn;
  p.aeth = Aeth{syndrome_ack(), msn_ & kPsnMask};
  p.atomic_ack.orig = orig;
  emit_packet(cfg_.dest_ah, p);
}

void EngineQp::send_read_response(const Reth& reth, uint32_t first_psn) {
  const uint32_t n = std::max<uint32_t>(1, (reth.dma_len + cfg_.pmtu - 1) / cfg_.pmtu);
  for (uint32_t k = 0; k < n; k++) {
    const uint32_t off = k * cfg_.pmtu;
    const uint32_t chunk = std::min(cfg_.pmtu, reth.dma_len - off);
    // Read at send time: a replayed READ returns memory as it is now (9.7.5).
    // Larger chunks go from where they lie (no copy).
    const uint8_t* view = chunk >= kGatherMin ? rmem().remote_view(reth.rkey, reth.va + off, chunk) : nullptr;
    std::span<uint8_t> data(payload_.data(), chunk);
    if (!view && chunk && !rmem().remote_read(reth.rkey, reth.va + off, data)) return;
    Packet p;
    p.bth.opcode = uint8_t(opcode_base() | (n == 1 ? op::kReadRespOnly : k == 0 ? op::kReadRespFirst
                                            : k == n - 1 ? op::kReadRespLast : op::kReadRespMiddle));
    p.bth.pkey = cfg_.pkey;
    p.bth.dest_qp = cfg_.dest_qpn;
    p.bth.psn = psn_add(first_psn, k);
    p.aeth = Aeth{syndrome_ack(), msn_ & kPsnMask};
    if (view) {
      const std::span<const uint8_t> piece(view, chunk);
      emit_packet_gather(cfg_.dest_ah, p, std::span<const std::span<const uint8_t>>(&piece, 1));
    } else {
      p.payload = data;
      emit_packet(cfg_.dest_ah, p);
    }
  }
}

core::Check EngineQp::scatter(const RecvWr& r, uint32_t off, std::span<const uint8_t> data) {
  return core::scatter_receive(r.sg.data(), uint32_t(r.sg.size()), off, data.size(),
                               [&](const Sge& s, uint64_t at, uint64_t n, uint64_t msg_at) {
                                 return rmem().local_write(s.lkey, s.addr + at, data.subspan(msg_at, n));
                               });
}

void EngineQp::responder_receive(const Packet& p, uint64_t from, std::span<const uint8_t> grh) {
  if (cfg_.type == QpType::kUD) return responder_ud(p, from, grh);
  if (cfg_.type == QpType::kUC) return responder_uc(p);
  // XRC target (IBTA annex A14): the request's XRCETH names the XRC SRQ
  // that gives its receive WQE and whose PD its keys are checked in; one
  // not of the target QP's XRC domain makes the request invalid.
  xrc_srq_ = nullptr;
  if (cfg_.type == QpType::kXrcRecv) xrc_srq_ = xrc_ ? xrc_->find_srq(p.xrc_srqn) : nullptr;
  responder_rc(p);
  xrc_srq_ = nullptr;
}

void EngineQp::responder_rc(const Packet& p) {
  const bool no_srq = cfg_.type == QpType::kXrcRecv && !xrc_srq_;
  const int32_t d = psn_diff(p.bth.psn, epsn_);
  if (d > 0) {
    // A gap: one PSN sequence error NAK per gap, with the PSN expected
    // (IBTA 9.7.5.2); later packets of the same gap are dropped silently.
    stats_.dropped++;
    if (!nak_sent_) {
      nak_sent_ = true;
      flush_pending_ack();
      stats_.seq_naks_sent++;
      send_ack(syndrome_nak(NakCode::kPsnSeqError), epsn_);
    }
    return;
  }
  if (d < 0) {
    stats_.duplicates++;
    if (no_srq && p.info().kind == OpKind::kReadRequest) {
      stats_.dropped++;  // nothing to read its memory with
      return;
    }
    responder_duplicate(p);
    return;
  }
  const RespResult r = no_srq ? refuse(core::Check::kMalformedRequest) : responder_execute(p);
  switch (r) {
    case RespResult::kDone:
      nak_sent_ = false;
      return;
    case RespResult::kRnr:
      // IBTA 9.7.5.2.8: nothing was consumed; the requester comes back with
      // this PSN after our timer. Until then a gap is not worth a NAK.
      nak_sent_ = true;
      flush_pending_ack();
      stats_.rnr_naks_sent++;
      send_ack(syndrome_rnr(cfg_.min_rnr_timer), p.bth.psn);
      return;
    case RespResult::kDrop:
      stats_.dropped++;
      return;
    case RespResult::kNak: {
      // Invalid request, remote access and remote operational errors are
      // fatal to the connection at both ends (IBTA 9.7.5.2); what the check
      // that failed means is core::verdict's.
      const core::Verdict v = core::verdict(resp_check_);
      flush_pending_ack();
      send_ack(syndrome_nak(NakCode(v.nak)), p.bth.psn);
      if (state_ == EngineState::kReady) resp_fault_ = to_engine(access::status(v.fault));
      set_error();
      return;
    }
  }
}

// IBTA 9.7.5 (duplicate requests): a duplicate SEND or WRITE is
// acknowledged again and not executed; a duplicate READ is answered again
// from memory; a duplicate atomic gets the result saved when it ran.
void EngineQp::responder_duplicate(const Packet& p) {
  const uint32_t psn = p.bth.psn;
  switch (p.info().kind) {
    case OpKind::kReadRequest:
      for (const Resource& res : resources_) {
        if (!res.atomic && !res.ack_only && psn_le(res.first_psn, psn) && psn_le(psn, res.last_psn)) {
          if (p.reth.dma_len && !rmem().remote_check(p.reth.rkey, p.reth.va, p.reth.dma_len, kRemoteRead)) return;
          flush_pending_ack();
          stats_.read_replays++;
          send_read_response(p.reth, psn);
          return;
        }
      }
      stats_.dropped++;  // older than what we kept: the requester has moved on
      return;
    case OpKind::kCompareSwap:
    case OpKind::kFetchAdd:
      for (const Resource& res : resources_) {
        if (res.atomic && res.first_psn == psn) {
          flush_pending_ack();
          stats_.atomic_replays++;
          send_atomic_ack(psn, res.orig);
          return;
        }
      }
      stats_.dropped++;
      return;
    case OpKind::kFlush:
    case OpKind::kAtomicWrite:
      // Done once (oA19-14, oA19-15 for FLUSH): a duplicate is answered again.
      for (const Resource& res : resources_) {
        if (res.ack_only && res.first_psn == psn) {
          flush_pending_ack();
          send_read_response(Reth{}, psn);
          return;
        }
      }
      stats_.dropped++;
      return;
    default:
      ack_pending_ = true;
      return;
  }
}

EngineQp::RespResult EngineQp::responder_execute(const Packet& p) {
  const OpcodeInfo& i = p.info();
  // XRC: the packets of one message name one SRQ (their receive WQE, their
  // R_Key's PD).
  if (cfg_.type == QpType::kXrcRecv) {
    if (resp_msg_ != RespMsg::kNone && p.xrc_srqn != xrc_msg_srqn_) return refuse(core::Check::kMalformedRequest);
    xrc_msg_srqn_ = p.xrc_srqn;
  }
  // Opcode sequence (IBTA 9.7.4): Middle/Last only continue a message of
  // the same kind; anything else only starts one.
  switch (resp_msg_) {
    case RespMsg::kNone:
      if (!i.starts_message()) return refuse(core::Check::kMalformedRequest);
      break;
    case RespMsg::kSend:
      if (i.kind != OpKind::kSend || i.starts_message()) return refuse(core::Check::kMalformedRequest);
      break;
    case RespMsg::kWrite:
      if (i.kind != OpKind::kWrite || i.starts_message()) return refuse(core::Check::kMalformedRequest);
      break;
  }
  switch (i.kind) {
    case OpKind::kSend: return respond_send(p);
    case OpKind::kWrite: return respond_write(p);
    case OpKind::kReadRequest: return respond_read(p);
    case OpKind::kCompareSwap:
    case OpKind::kFetchAdd: return respond_atomic(p);
    case OpKind::kFlush: return respond_flush(p);
    case OpKind::kAtomicWrite: return respond_atomic_write(p);
    default: return RespResult::kDrop;
  }
}

EngineQp::RespResult EngineQp::respond_send(const Packet& p) {
  const OpcodeInfo& i = p.info();
  // Every packet but the last of a message is exactly one path MTU (9.7.4).
  if (p.payload.size() > cfg_.pmtu || (!i.ends_message() && p.payload.size() != cfg_.pmtu)) {
    return refuse(core::Check::kMalformedRequest);
  }
  if (i.starts_message()) {
    if (!have_recv()) return RespResult::kRnr;
    cur_recv_ = std::move(rq_.front());
    rq_.pop_front();
    recv_off_ = 0;
    resp_msg_ = RespMsg::kSend;
  }
  if (core::Check c = scatter(*cur_recv_, recv_off_, p.payload); c != core::Check::kOk) {
    // Too long for the receive buffer, or a bad L_Key there: the receive
    // completes in error, the requester gets the NAK (core::verdict).
    complete_recv(*cur_recv_, to_engine(core::verdict(c).receive_status), 0, nullptr);
    cur_recv_.reset();
    resp_msg_ = RespMsg::kNone;
    return refuse(c);
  }
  recv_off_ += uint32_t(p.payload.size());
  if (i.ends_message()) {
    if (i.has(kHasIeth) && !rmem().invalidate(p.ieth_rkey)) {
      constexpr core::Check c = core::Check::kInvalidateRefused;
      complete_recv(*cur_recv_, to_engine(core::verdict(c).receive_status), 0, nullptr);
      cur_recv_.reset();
      resp_msg_ = RespMsg::kNone;
      return refuse(c);
    }
    complete_recv(*cur_recv_, WcStatus::kSuccess, recv_off_, &p);
    cur_recv_.reset();
    resp_msg_ = RespMsg::kNone;
    msn_++;
  }
  epsn_ = psn_add(epsn_, 1);
  if (p.bth.ack_req) ack_pending_ = true;
  return RespResult::kDone;
}

EngineQp::RespResult EngineQp::respond_write(const Packet& p) {
  const OpcodeInfo& i = p.info();
  const bool imm = i.has(kHasImmDt);
  // WRITE with Immediate consumes a receive WQE: check before touching
  // anything, so that the retry after an RNR NAK finds the state unchanged.
  if (imm && !have_recv()) return RespResult::kRnr;
  if (p.payload.size() > cfg_.pmtu || (!i.ends_message() && p.payload.size() != cfg_.pmtu)) {
    return refuse(core::Check::kMalformedRequest);
  }
  Reth cur = cur_write_;
  if (i.starts_message()) {
    cur = p.reth;
    // IBTA 9.7.4 / 10.6.7: the QP must allow remote writes and the
    // R_Key must cover the whole length; a zero-length WRITE checks nothing.
    if (cur.dma_len != 0 &&
        (!(cfg_.access & kRemoteWrite) || !rmem().remote_check(cur.rkey, cur.va, cur.dma_len, kRemoteWrite))) {
      return refuse(core::Check::kRemoteKey);
    }
    write_total_ = cur.dma_len;
  }
  if (p.payload.size() > cur.dma_len || (i.ends_message() && p.payload.size() != cur.dma_len)) {
    return refuse(core::Check::kMalformedRequest);  // more or less data than the RETH announced
  }
  if (!p.payload.empty() && !rmem().remote_write(cur.rkey, cur.va, p.payload)) return refuse(core::Check::kRemoteKey);
  cur.va += p.payload.size();
  cur.dma_len -= uint32_t(p.payload.size());
  cur_write_ = cur;
  resp_msg_ = i.ends_message() ? RespMsg::kNone : RespMsg::kWrite;
  if (i.ends_message()) {
    if (imm) {
      RecvWr r = std::move(rq_.front());
      rq_.pop_front();
      complete_recv(r, WcStatus::kSuccess, write_total_, &p, 0, true);
    }
    msn_++;
  }
  epsn_ = psn_add(epsn_, 1);
  if (p.bth.ack_req) ack_pending_ = true;
  return RespResult::kDone;
}

EngineQp::RespResult EngineQp::respond_read(const Packet& p) {
  const Reth& reth = p.reth;
  if (reth.dma_len > (1u << 31)) return refuse(core::Check::kMalformedRequest);
  if (reth.dma_len != 0 &&
      (!(cfg_.access & kRemoteRead) || !rmem().remote_check(reth.rkey, reth.va, reth.dma_len, kRemoteRead))) {
    return refuse(core::Check::kRemoteKey);
  }
  const uint32_t n = std::max<uint32_t>(1, (reth.dma_len + cfg_.pmtu - 1) / cfg_.pmtu);
  Resource res;
  res.first_psn = p.bth.psn;
  res.last_psn = psn_add(p.bth.psn, n - 1);
  res.reth = reth;
  resources_.push_back(res);
  // max_dest_rd_atomic resources (IBTA 9.7.5); the oldest is forgotten.
  while (resources_.size() > std::max<uint8_t>(cfg_.max_dest_rd_atomic, 1)) resources_.pop_front();
  flush_pending_ack();
  epsn_ = psn_add(epsn_, n);  // the responses use the READ's PSNs (9.7.2)
  msn_++;
  send_read_response(reth, p.bth.psn);
  return RespResult::kDone;
}

EngineQp::RespResult EngineQp::respond_atomic(const Packet& p) {
  const AtomicEth& a = p.atomic;
  // The aligned quadword first (IBTA 9.4.5), as the other paths check it
  // before the key (core::check_atomic).
  if (core::Check c = core::check_atomic_target(a.va); c != core::Check::kOk) return refuse(c);
  if (!(cfg_.access & kRemoteAtomic)) return refuse(core::Check::kRemoteKey);
  uint64_t orig = 0;
  const bool cas = p.info().kind == OpKind::kCompareSwap;
  if (!rmem().remote_check(a.rkey, a.va, 8, kRemoteAtomic) ||
      !rmem().remote_atomic(a.rkey, a.va, cas, cas ? a.compare : a.swap_add, a.swap_add, &orig)) {
    return refuse(core::Check::kRemoteKey);
  }
  Resource res;
  res.atomic = true;
  res.first_psn = res.last_psn = p.bth.psn;
  res.orig = orig;
  resources_.push_back(res);
  while (resources_.size() > std::max<uint8_t>(cfg_.max_dest_rd_atomic, 1)) resources_.pop_front();
  flush_pending_ack();
  epsn_ = psn_add(epsn_, 1);
  msn_++;
  send_atomic_ack(p.bth.psn, orig);
  return RespResult::kDone;
}

// IBTA annex A19 FLUSH: the FETH's placement type and selectivity level,
// the QP's and the R_Key's FLUSH rights for that type (rxe's check_rkey;
// a key that lacks them is a remote access error), over the RETH's range or
// the key's whole region; then the flush (core::apply_flush).
EngineQp::RespResult EngineQp::respond_flush(const Packet& p) {
  if (core::Check c = core::check_flush(p.feth.placement, p.feth.level); c != core::Check::kOk) return refuse(c);
  const uint32_t need = rules::flush_need(p.feth.placement);
  if ((cfg_.access & need) != need) return refuse(core::Check::kRemoteKey);
  const core::Check c = rmem().remote_flush(p.reth.rkey, p.reth.va, p.reth.dma_len, need, p.feth.placement, p.feth.level);
  if (c != core::Check::kOk) return refuse(c);
  return respond_a19(p);
}

// IBTA annex A19 ATOMIC WRITE: exactly 8 bytes (RETH and payload) to an
// aligned quadword, under an R_Key with remote write (as rxe).
EngineQp::RespResult EngineQp::respond_atomic_write(const Packet& p) {
  if (p.payload.size() != access::kAtomicBytes) return refuse(core::Check::kMalformedRequest);
  if (core::Check c = core::check_atomic_write(p.reth.dma_len, p.reth.va); c != core::Check::kOk) return refuse(c);
  if (!(cfg_.access & kRemoteWrite)) return refuse(core::Check::kRemoteKey);
  uint8_t value[8];
  std::copy(p.payload.begin(), p.payload.end(), value);
  if (!rmem().remote_atomic_write(p.reth.rkey, p.reth.va, value)) return refuse(core::Check::kRemoteKey);
  return respond_a19(p);
}

// What FLUSH and ATOMIC WRITE share once carried out: a resource, so that a
// duplicate is answered without acting twice, and the answer, an RDMA READ
// response Only of no payload (rxe's send_read_response_ack).
EngineQp::RespResult EngineQp::respond_a19(const Packet& p) {
  Resource res;
  res.ack_only = true;
  res.first_psn = res.last_psn = p.bth.psn;
  resources_.push_back(res);
  while (resources_.size() > std::max<uint8_t>(cfg_.max_dest_rd_atomic, 1)) resources_.pop_front();
  flush_pending_ack();
  epsn_ = psn_add(epsn_, 1);
  msn_++;
  send_read_response(Reth{}, p.bth.psn);
  return RespResult::kDone;
}

// UC (IBTA 9.8): no ACKs and no retransmission. A PSN gap loses the
// message in progress; the responder resynchronises on the next First or
// Only packet, and the receive WQE the lost message had taken is reused.
void EngineQp::responder_uc(const Packet& p) {
  const bool starts = p.info().starts_message();
  if (psn_diff(p.bth.psn, epsn_) != 0 || uc_resync_) {
    if (resp_msg_ == RespMsg::kSend && cur_recv_) rq_.push_front(std::move(*cur_recv_));
    cur_recv_.reset();
    resp_msg_ = RespMsg::kNone;
    if (!starts) {
      uc_resync_ = true;
      stats_.dropped++;
      return;
    }
    uc_resync_ = false;
    epsn_ = p.bth.psn;
  }
  const RespResult r = responder_execute(p);
  if (r == RespResult::kDone) return;
  // Anything else drops the message: no RNR and no NAK on UC.
  stats_.dropped++;
  if (resp_msg_ == RespMsg::kSend && cur_recv_) rq_.push_front(std::move(*cur_recv_));
  cur_recv_.reset();
  resp_msg_ = RespMsg::kNone;
  uc_resync_ = true;
}

// UD (IBTA 9.8): one packet per message; a Q_Key mismatch or no receive
// WQE drops it silently. The first 40 bytes of the receive buffer are the
// GRH's (IBTA 11.4.1), filled from `grh` when the packet I/O gives one.
void EngineQp::responder_ud(const Packet& p, uint64_t from, std::span<const uint8_t> grh) {
  if (p.deth.qkey != cfg_.qkey || !have_recv()) {
    stats_.dropped++;
    return;
  }
  RecvWr r = std::move(rq_.front());
  rq_.pop_front();
  const bool with_grh = grh.size() == 40;
  core::Check c = scatter(r, 40, p.payload);
  if (c == core::Check::kOk && with_grh) c = scatter(r, 0, grh);
  if (c != core::Check::kOk) {
    complete_recv(r, to_engine(core::verdict(c).receive_status), 0, nullptr);
    return;
  }
  complete_recv(r, WcStatus::kSuccess, uint32_t(p.payload.size()) + 40, &p, from, false, with_grh);
}

}  // namespace sv::roce
