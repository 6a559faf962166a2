// requester.cc: turns the send queue into request packets (IBTA 9.7.2 and
// 9.5): assigns PSNs, segments to the path MTU, chooses First/Middle/Last/
// Only opcodes, sets AckReq, limits READs/atomics in flight to the
// initiator depth and unacknowledged PSNs to a window. Retransmission is the
// completer moving (sq_next_, sq_next_off_, next_psn_) back; this file then
// simply sends from there again.
#include <algorithm>
#include <cstring>

#include "roce/engine.h"

namespace sv::roce {

// READs, atomics and IBTA annex A19's FLUSH and ATOMIC WRITE: each waits
// for a response of its own (an RDMA READ response Only of no payload for
// A19's, as rxe answers them) and takes one of the initiator depth.
bool EngineQp::is_read_or_atomic(const SendWqe& w) const {
  return w.wr.opcode == WrOpcode::kRead || w.wr.opcode == WrOpcode::kCompareSwap ||
         w.wr.opcode == WrOpcode::kFetchAdd || w.wr.opcode == WrOpcode::kFlush ||
         w.wr.opcode == WrOpcode::kAtomicWrite;
}

uint32_t EngineQp::packets_of(const SendWqe& w) const {
  if (w.wr.opcode == WrOpcode::kCompareSwap || w.wr.opcode == WrOpcode::kFetchAdd ||
      w.wr.opcode == WrOpcode::kFlush || w.wr.opcode == WrOpcode::kAtomicWrite)
    return 1;
  // A zero-length message is one packet; a READ's responses use its PSNs (9.7.2).
  return std::max<uint32_t>(1, (w.len + cfg_.pmtu - 1) / cfg_.pmtu);
}

void EngineQp::requester_run() {
  while (requester_step() == ReqStep::kSent) {
  }
}

EngineQp::ReqStep EngineQp::requester_step() {
  if (state_ != EngineState::kReady || sq_next_ >= sq_.size()) return ReqStep::kIdle;
  if (rnr_until_ != 0) return ReqStep::kBlocked;  // waiting out an RNR NAK's timer
  SendWqe& w = sq_[sq_next_];
  if (is_local(w)) return local_step(w);
  if (w.wr.fails_with != WcStatus::kSuccess) [[unlikely]] return planned_failure_step();
  if (reliable() && psn_diff(next_psn_, una_) >= int32_t(cfg_.max_window)) return ReqStep::kBlocked;
  if (!w.started && !start_wqe(w)) return state_ == EngineState::kReady ? ReqStep::kBlocked : ReqStep::kIdle;
  send_request_packet(w);
  return state_ == EngineState::kReady ? ReqStep::kSent : ReqStep::kIdle;
}

// LOCAL_INV and BIND_MW (IBTA 10.6.7.2): no packet. They wait until every
// earlier WQE has completed (stricter than a fence, and what keeps a
// retransmission from reading memory they just invalidated), then act and
// complete in order; a failure is a local error that ends the QP.
EngineQp::ReqStep EngineQp::local_step(SendWqe& w) {
  if (sq_next_ != 0) return ReqStep::kBlocked;  // retire() moves the queue on
  const WcStatus st = mem_.execute_local(w.wr);
  if (st != WcStatus::kSuccess) {
    enter_error(0, st);
    return ReqStep::kIdle;
  }
  complete_send(w, WcStatus::kSuccess);
  sq_.pop_front();
  return ReqStep::kSent;
}

// A request the process's fault plan fails: it waits, as a local operation
// does, until every earlier request has completed, then fails as a real
// error would (IBTA 10.3.1: the QP to the error state, the rest flushed).
EngineQp::ReqStep EngineQp::planned_failure_step() {
  if (sq_next_ != 0) return ReqStep::kBlocked;  // retire() moves the queue on
  enter_error(0, sq_[0].wr.fails_with);
  return ReqStep::kIdle;
}

bool EngineQp::start_wqe(SendWqe& w) {
  const bool atomic = w.wr.opcode == WrOpcode::kCompareSwap || w.wr.opcode == WrOpcode::kFetchAdd;
  if (atomic && w.len != 8) {  // the original value lands in one 8-byte local buffer
    enter_error(sq_next_, WcStatus::kLocLenErr);
    return false;
  }
  // ATOMIC WRITE carries exactly 8 bytes (IBTA A19.4.4), from its SGEs or
  // (none) already in compare_add.
  if (w.wr.opcode == WrOpcode::kAtomicWrite && !w.wr.sg.empty() && w.len != 8) {
    enter_error(sq_next_, WcStatus::kLocLenErr);
    return false;
  }
  if (cfg_.type == QpType::kUD && w.len > cfg_.pmtu) {  // UD messages are one packet (IBTA 9.8)
    enter_error(sq_next_, WcStatus::kLocLenErr);
    return false;
  }
  // A fenced WR (the verbs' fence indicator) waits until every earlier READ
  // and atomic has its response, so that it cannot overtake what they read.
  if (w.wr.fence && rd_atomic_in_flight_ > 0) return false;
  if (is_read_or_atomic(w)) {
    if (rd_atomic_in_flight_ >= cfg_.max_rd_atomic) return false;  // initiator depth (IBTA 9.7.6)
    rd_atomic_in_flight_++;
  }
  w.started = true;
  w.first_psn = next_psn_;
  w.last_psn = psn_add(next_psn_, packets_of(w) - 1);
  return true;
}

bool EngineQp::gather(const SendWqe& w, uint32_t off, std::span<uint8_t> out) {
  size_t done = 0;
  for (const Sge& s : w.wr.sg) {
    if (done == out.size()) break;
    if (off >= s.length) { off -= s.length; continue; }
    size_t n = std::min<size_t>(s.length - off, out.size() - done);
    if (!mem_.local_read(s.lkey, s.addr + off, out.subspan(done, n))) return false;
    done += n;
    off = 0;
  }
  return done == out.size();
}

size_t EngineQp::gather_views(const SendWqe& w, uint32_t off, uint32_t len,
                        std::array<std::span<const uint8_t>, kMaxPayloadPieces>& out) {
  size_t n = 0, done = 0;
  for (const Sge& s : w.wr.sg) {
    if (done == len) break;
    if (off >= s.length) { off -= s.length; continue; }
    const size_t k = std::min<size_t>(s.length - off, len - done);
    if (n == kMaxPayloadPieces) return 0;
    const uint8_t* p = mem_.local_view(s.lkey, s.addr + off, k);
    if (!p) return 0;
    out[n++] = std::span<const uint8_t>(p, k);
    done += k;
    off = 0;
  }
  return done == len ? n : 0;
}

namespace {

// The opcode (low five bits, IBTA 9.2 table 38) of a SEND or WRITE packet:
// where it lies in its message (first, middle, last, only) and what the
// message carries (immediate data, an R_Key to invalidate).
uint8_t payload_opcode(WrOpcode wr, bool first, bool last) {
  const bool write = wr == WrOpcode::kWrite || wr == WrOpcode::kWriteImm;
  const bool imm = wr == WrOpcode::kSendImm || wr == WrOpcode::kWriteImm;
  const bool inv = wr == WrOpcode::kSendInv;
  if (write) {
    if (first && last) return imm ? op::kWriteOnlyImm : op::kWriteOnly;
    if (first) return op::kWriteFirst;
    if (last) return imm ? op::kWriteLastImm : op::kWriteLast;
    return op::kWriteMiddle;
  }
  if (first && last) return imm ? op::kSendOnlyImm : inv ? op::kSendOnlyInv : op::kSendOnly;
  if (first) return op::kSendFirst;
  if (last) return imm ? op::kSendLastImm : inv ? op::kSendLastInv : op::kSendLast;
  return op::kSendMiddle;
}

}  // namespace

// Fills p with the next packet of SEND or WRITE w, from sq_next_off_ on,
// and moves sq_next_off_ past it. Its payload is left where it lies, in
// views[0, nviews), or copied into payload_. last: the message's last packet.
// False after a local protection error (the QP has entered the error state).
bool EngineQp::build_payload_packet(SendWqe& w, Packet& p, PayloadViews& views, size_t& nviews, bool& last) {
  const uint32_t off = sq_next_off_;
  const bool rel = reliable();
  const uint32_t chunk = std::min(cfg_.pmtu, w.len - off);
  const bool first = off == 0;
  last = off + chunk >= w.len;
  // RC payloads of some size go from where they lie (no copy): an RC
  // WQE completes only after its ACK, long after the sink's flush. UC
  // and UD complete as they are sent, and their buffers could be
  // reused before the flush: those are copied, as are short payloads.
  if (rel && chunk >= kGatherMin) nviews = gather_views(w, off, chunk, views);
  if (nviews == 0) {
    std::span<uint8_t> data(payload_.data(), chunk);
    if (!gather(w, off, data)) {
      enter_error(sq_next_, WcStatus::kLocProtErr);
      return false;
    }
    p.payload = data;
  }
  const bool write = w.wr.opcode == WrOpcode::kWrite || w.wr.opcode == WrOpcode::kWriteImm;
  if (write && first) p.reth = Reth{w.wr.remote_addr, w.wr.rkey, w.len};
  p.bth.opcode = uint8_t(opcode_base() | payload_opcode(w.wr.opcode, first, last));
  p.imm = w.wr.imm;
  p.ieth_rkey = w.wr.invalidate_rkey;
  if (cfg_.type == QpType::kUD) {
    // A Q_Key with its high-order bit set in the WR means "use the QP's own"
    // (IBTA 11.4.1, Post Send Request).
    p.deth = Deth{(w.wr.remote_qkey & 0x80000000u) ? cfg_.qkey : w.wr.remote_qkey, cfg_.qpn};
  }
  p.bth.se = last && w.wr.solicited;
  if (rel) {
    // AckReq on the last packet of a message, every ack_req_every packets
    // and when the window is about to close, so that ACKs keep it open.
    p.bth.ack_req = last || ++since_ack_req_ >= cfg_.ack_req_every ||
                    psn_diff(psn_add(next_psn_, 1), una_) >= int32_t(cfg_.max_window);
    if (p.bth.ack_req) since_ack_req_ = 0;
  }
  sq_next_off_ += chunk;
  return true;
}

// IBTA annex A19's requests, one packet each: FLUSH is FETH and RETH with
// no payload (A19.4.3, oA19-2), ATOMIC WRITE a RETH and its 8 bytes
// (A19.4.4). False after a local protection error.
bool EngineQp::build_a19_packet(SendWqe& w, Packet& p) {
  p.bth.ack_req = true;
  if (w.wr.opcode == WrOpcode::kFlush) {
    p.bth.opcode = uint8_t(opcode_base() | op::kFlush);
    p.feth = Feth{w.wr.placement, w.wr.level};
    p.reth = Reth{w.wr.remote_addr, w.wr.rkey, w.wr.flush_len};
    return true;
  }
  std::span<uint8_t> data(payload_.data(), 8);
  if (w.wr.sg.empty()) {
    std::memcpy(data.data(), &w.wr.compare_add, 8);
  } else if (!gather(w, 0, data)) {
    enter_error(sq_next_, WcStatus::kLocProtErr);
    return false;
  }
  p.bth.opcode = uint8_t(opcode_base() | op::kAtomicWrite);
  p.reth = Reth{w.wr.remote_addr, w.wr.rkey, 8};
  p.payload = data;
  return true;
}

void EngineQp::send_request_packet(SendWqe& w) {
  const QpType t = cfg_.type;
  Packet p;
  p.bth.pkey = cfg_.pkey;
  p.bth.psn = next_psn_;
  p.bth.dest_qp = t == QpType::kUD ? w.wr.remote_qpn : cfg_.dest_qpn;
  const uint64_t ah = t == QpType::kUD ? w.wr.ah : cfg_.dest_ah;
  const uint8_t base = opcode_base();
  const bool rel = reliable();
  p.xrc_srqn = w.wr.xrc_srqn;  // XRC: every request names the SRQ (IBTA A14); others have no XRCETH
  const uint32_t off = sq_next_off_;
  bool finished = false;  // the WQE's last packet has gone out
  uint32_t npsn = 1;
  PayloadViews views;
  size_t nviews = 0;
  switch (w.wr.opcode) {
    case WrOpcode::kRead: {
      // After a retransmission point inside a READ the request asks only for
      // what is missing, at the PSN of the first missing response (9.7.5).
      p.bth.opcode = uint8_t(base | op::kReadRequest);
      p.reth = Reth{w.wr.remote_addr + off, w.wr.rkey, w.len - off};
      npsn = std::max<uint32_t>(1, (w.len - off + cfg_.pmtu - 1) / cfg_.pmtu);
      p.bth.ack_req = true;
      finished = true;
      break;
    }
    case WrOpcode::kCompareSwap:
    case WrOpcode::kFetchAdd: {
      const bool cas = w.wr.opcode == WrOpcode::kCompareSwap;
      p.bth.opcode = uint8_t(base | (cas ? op::kCompareSwap : op::kFetchAdd));
      p.atomic = AtomicEth{w.wr.remote_addr, w.wr.rkey, cas ? w.wr.swap : w.wr.compare_add,
                           cas ? w.wr.compare_add : 0};
      p.bth.ack_req = true;
      finished = true;
      break;
    }
    case WrOpcode::kFlush:
    case WrOpcode::kAtomicWrite:
      if (!build_a19_packet(w, p)) return;
      finished = true;
      break;
    default:
      if (!build_payload_packet(w, p, views, nviews, finished)) return;
      break;
  }
  if (nviews) {
    emit_packet_gather(ah, p, std::span<const std::span<const uint8_t>>(views.data(), nviews));
  } else {
    emit_packet(ah, p);
  }
  next_psn_ = psn_add(next_psn_, npsn);
  if (psn_diff(next_psn_, sent_end_) > 0) sent_end_ = next_psn_;
  if (rel && retransmit_at_ == UINT64_MAX && timeout_ns() != UINT64_MAX) {
    retransmit_at_ = clock_.now_ns() + timeout_ns();  // IBTA 9.7.6.1.3: runs while requests are unacknowledged
  }
  if (!finished) return;
  sq_next_off_ = 0;
  if (rel) {
    sq_next_++;
  } else {
    // UC and UD are unacknowledged: done once sent (IBTA 9.8).
    complete_send(w, WcStatus::kSuccess);
    sq_.pop_front();
    una_ = next_psn_;
  }
}

}  // namespace sv::roce
