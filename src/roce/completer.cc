// completer.cc: the requester's receive side (IBTA 9.7.5.1 and 9.7.6):
// ACKs, NAKs, READ responses and atomic ACKs complete send WQEs in order;
// the ACK timer and NAKs move the requester back to the oldest
// unacknowledged PSN (go-back-N), counting retry_cnt and rnr_retry.
#include <algorithm>
#include <cstring>

#include "roce/engine.h"

namespace sv::roce {

void EngineQp::completer_receive(const Packet& p) {
  switch (p.info().kind) {
    case OpKind::kAck: on_ack(p); break;
    case OpKind::kReadResponse: on_read_response(p); break;
    case OpKind::kAtomicAck: on_atomic_ack(p); break;
    default: stats_.dropped++; break;
  }
  if (state_ == EngineState::kReady && psn_lt(next_psn_, una_)) position(una_);
}

EngineQp::SendWqe* EngineQp::oldest_pending_read_or_atomic() {
  for (SendWqe& w : sq_) {
    if (!w.started) break;
    if (is_read_or_atomic(w) && !w.done) return &w;
  }
  return nullptr;
}

// The responder has executed everything up to `psn`. Returns whether that is
// forward progress. An acknowledgement that covers a READ or atomic whose
// response has not arrived means the response was lost: an implied NAK
// (IBTA 9.7.5), so the request is sent again, once per such PSN.
bool EngineQp::acknowledge_through(uint32_t psn) {
  // Forward progress, for the retry counters, is the responder acknowledging
  // a newer PSN, even while a lost READ response still holds una_ back.
  if (psn_lt(last_acked_, psn)) {
    last_acked_ = psn;
    retry_left_ = cfg_.retry_cnt & 7;
    rnr_left_ = cfg_.rnr_retry & 7;
  }
  uint32_t new_una = psn_add(psn, 1);
  SendWqe* r = oldest_pending_read_or_atomic();
  bool implied = false;
  if (r && psn_le(r->first_psn, psn) && psn_le(una_, psn)) {
    new_una = psn_add(r->first_psn, r->resp_pkts);
    implied = true;
  }
  const bool moved = psn_diff(new_una, una_) > 0;
  if (moved) {
    una_ = new_una;
    retire();
    arm_retransmit_timer();
  }
  if (implied && implied_nak_psn_ != una_) {
    implied_nak_psn_ = una_;
    go_back(una_);
  }
  return moved;
}

void EngineQp::go_back(uint32_t psn) {
  if (psn_lt(psn, next_psn_)) position(psn);
}

// Completes, in order, the WQEs at the head of the send queue that are
// finished: SEND/WRITE wholly below una_, READ/atomic with their response.
void EngineQp::retire() {
  while (!sq_.empty()) {
    SendWqe& w = sq_.front();
    if (!w.started) break;
    if (is_read_or_atomic(w)) {
      if (!w.done) break;
    } else if (!psn_lt(w.last_psn, una_)) {
      break;
    }
    complete_send(w, WcStatus::kSuccess);
    sq_.pop_front();
    if (sq_next_ > 0) {
      sq_next_--;
    } else {
      sq_next_off_ = 0;  // it was being (re)sent: the next one is due instead
    }
  }
}

// Make the requester send next the packet with PSN `psn` (go-back-N).
void EngineQp::position(uint32_t psn) {
  size_t i = 0;
  for (; i < sq_.size() && sq_[i].started; i++) {
    const SendWqe& w = sq_[i];
    if (psn_le(w.first_psn, psn) && psn_le(psn, w.last_psn)) {
      sq_next_ = i;
      sq_next_off_ = is_read_or_atomic(w) && w.wr.opcode != WrOpcode::kRead
                         ? 0
                         : uint32_t(psn_diff(psn, w.first_psn)) * cfg_.pmtu;
      next_psn_ = psn;
      since_ack_req_ = 0;
      return;
    }
  }
  sq_next_ = i;  // psn is sent_end_: continue with the first WQE not yet started
  sq_next_off_ = 0;
  next_psn_ = psn;
}

void EngineQp::arm_retransmit_timer() {
  if (psn_diff(sent_end_, una_) <= 0 || timeout_ns() == UINT64_MAX) {
    retransmit_at_ = UINT64_MAX;
  } else {
    retransmit_at_ = clock_.now_ns() + timeout_ns();
  }
}

void EngineQp::fail_wqe_at(uint32_t psn, WcStatus st) {
  size_t idx = 0;
  for (size_t i = 0; i < sq_.size() && sq_[i].started; i++) {
    if (psn_le(sq_[i].first_psn, psn) && psn_le(psn, sq_[i].last_psn)) {
      idx = i;
      break;
    }
  }
  enter_error(idx, st);
}

void EngineQp::on_ack(const Packet& p) {
  const uint32_t psn = p.bth.psn;
  const uint32_t last_sent = psn_add(sent_end_, -1);
  if (psn_diff(psn, last_sent) > 0) {  // acknowledges what was never sent: ignore
    stats_.dropped++;
    return;
  }
  const uint8_t syn = p.aeth.syndrome;
  switch (syndrome_type(syn)) {
    case AckType::kAck:
      acknowledge_through(psn);
      return;
    case AckType::kRnrNak: {
      if (psn_lt(psn, una_)) return;  // stale
      stats_.rnr_naks_received++;
      acknowledge_through(psn_add(psn, -1));
      // IBTA 9.7.5.2.8: wait the responder's timer, then resend from psn;
      // rnr_retry 7 means retry for ever.
      if ((cfg_.rnr_retry & 7) != 7) {
        if (rnr_left_ == 0) {
          fail_wqe_at(psn, WcStatus::kRnrRetryExcErr);
          return;
        }
        rnr_left_--;
      }
      rnr_until_ = clock_.now_ns() + rnr_timer_ns(syndrome_value(syn));
      retransmit_at_ = UINT64_MAX;
      go_back(psn);
      return;
    }
    case AckType::kNak: {
      if (psn_lt(psn, una_)) return;  // stale
      acknowledge_through(psn_add(psn, -1));
      if (state_ != EngineState::kReady) return;
      switch (NakCode(syndrome_value(syn))) {
        case NakCode::kPsnSeqError:
          // IBTA 9.7.5.2: resend from the PSN the responder expects; this
          // counts against retry_cnt as a timeout does (as rxe does).
          stats_.seq_naks_received++;
          // The responder NAKs a gap once; the same NAK again is a duplicate.
          if (psn == last_seq_nak_ && !timed_out_since_nak_) return;
          last_seq_nak_ = psn;
          timed_out_since_nak_ = false;
          if (retry_left_ == 0) {
            fail_wqe_at(psn, WcStatus::kRetryExcErr);
            return;
          }
          retry_left_--;
          go_back(psn);
          arm_retransmit_timer();
          return;
        case NakCode::kInvalidRequest: fail_wqe_at(psn, WcStatus::kRemInvReqErr); return;
        case NakCode::kRemoteAccess: fail_wqe_at(psn, WcStatus::kRemAccessErr); return;
        default: fail_wqe_at(psn, WcStatus::kRemOpErr); return;
      }
    }
    case AckType::kReserved:
      stats_.dropped++;
      return;
  }
}

// FLUSH and ATOMIC WRITE (IBTA annex A19) are answered with an RDMA READ
// response Only that carries no payload (as rxe answers them): it ends the
// request and acknowledges everything before it.
void EngineQp::on_a19_response(SendWqe& r, const Packet& p) {
  if (p.bth.psn != r.first_psn || !p.payload.empty() || !p.info().ends_message()) {
    stats_.duplicates++;
    return;
  }
  acknowledge_through(psn_add(r.first_psn, -1));
  r.done = true;
  rd_atomic_in_flight_--;
  responded_through(p.bth.psn);
}

void EngineQp::on_read_response(const Packet& p) {
  SendWqe* r = oldest_pending_read_or_atomic();
  const uint32_t psn = p.bth.psn;
  if (r && (r->wr.opcode == WrOpcode::kFlush || r->wr.opcode == WrOpcode::kAtomicWrite)) return on_a19_response(*r, p);
  if (!r || r->wr.opcode != WrOpcode::kRead || psn != psn_add(r->first_psn, r->resp_pkts)) {
    stats_.duplicates++;  // a duplicate, or one past a gap that the timer will repair
    return;
  }
  const uint32_t off = r->resp_pkts * cfg_.pmtu;
  const uint32_t want = std::min(cfg_.pmtu, r->len - off);
  const bool ends = p.info().ends_message();
  // A response must fill whole MTUs except the last (IBTA 9.7.5).
  if (p.payload.size() != want || ends != (off + want >= r->len)) {
    stats_.dropped++;
    return;
  }
  // It implicitly acknowledges everything before the READ (IBTA 9.7.5).
  acknowledge_through(psn_add(r->first_psn, -1));
  size_t done = 0;
  uint32_t skip = off;
  for (const Sge& s : r->wr.sg) {
    if (done == p.payload.size()) break;
    if (skip >= s.length) { skip -= s.length; continue; }
    size_t n = std::min<size_t>(s.length - skip, p.payload.size() - done);
    if (!mem_.local_write(s.lkey, s.addr + skip, p.payload.subspan(done, n))) {
      fail_wqe_at(r->first_psn, WcStatus::kLocProtErr);
      return;
    }
    done += n;
    skip = 0;
  }
  r->resp_pkts++;
  if (ends) {
    r->done = true;
    rd_atomic_in_flight_--;
  }
  responded_through(psn);
}

// A response (READ, atomic, A19) at `psn` moved the requester on: what it
// acknowledges retires, the retry budgets start again (IBTA 9.7.5.1.6).
void EngineQp::responded_through(uint32_t psn) {
  una_ = psn_add(psn, 1);
  last_acked_ = psn;
  retry_left_ = cfg_.retry_cnt & 7;
  rnr_left_ = cfg_.rnr_retry & 7;
  retire();
  arm_retransmit_timer();
}

void EngineQp::on_atomic_ack(const Packet& p) {
  SendWqe* r = oldest_pending_read_or_atomic();
  if (!r || (r->wr.opcode != WrOpcode::kCompareSwap && r->wr.opcode != WrOpcode::kFetchAdd) ||
      p.bth.psn != r->first_psn) {
    stats_.duplicates++;
    return;
  }
  acknowledge_through(psn_add(r->first_psn, -1));
  uint64_t orig = p.atomic_ack.orig;  // lands in host order, as verbs returns it
  uint8_t bytes[8];
  std::memcpy(bytes, &orig, 8);
  const Sge& s = r->wr.sg.front();
  if (!mem_.local_write(s.lkey, s.addr, std::span<const uint8_t>(bytes, 8))) {
    fail_wqe_at(r->first_psn, WcStatus::kLocProtErr);
    return;
  }
  r->done = true;
  rd_atomic_in_flight_--;
  responded_through(p.bth.psn);
}

void EngineQp::on_timers() {
  const uint64_t now = clock_.now_ns();
  if (rnr_until_ != 0 && now >= rnr_until_) rnr_until_ = 0;
  if (now < retransmit_at_) return;
  if (psn_diff(sent_end_, una_) <= 0) {
    retransmit_at_ = UINT64_MAX;
    return;
  }
  // IBTA 9.7.6.1.3: the ACK timer expired; retry_cnt more attempts (C9-140).
  stats_.retransmit_timeouts++;
  if (retry_left_ == 0) {
    fail_wqe_at(una_, WcStatus::kRetryExcErr);
    return;
  }
  retry_left_--;
  implied_nak_psn_ = UINT32_MAX;
  timed_out_since_nak_ = true;
  position(una_);
  retransmit_at_ = now + timeout_ns();
}

}  // namespace sv::roce
