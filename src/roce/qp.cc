// qp.cc: what the three roles share: construction, posting, the receive
// dispatch, progress, the error state and completions.
#include <cerrno>

#include "roce/engine.h"

namespace sv::roce {

const char* wc_status_name(WcStatus s) {
  switch (s) {
    case WcStatus::kSuccess: return "success";
    case WcStatus::kLocLenErr: return "local length error";
    case WcStatus::kLocQpOpErr: return "local QP operation error";
    case WcStatus::kLocProtErr: return "local protection error";
    case WcStatus::kWrFlushErr: return "WR flushed";
    case WcStatus::kRemInvReqErr: return "remote invalid request";
    case WcStatus::kRemAccessErr: return "remote access error";
    case WcStatus::kRemOpErr: return "remote operation error";
    case WcStatus::kRetryExcErr: return "transport retry counter exceeded";
    case WcStatus::kRnrRetryExcErr: return "RNR retry counter exceeded";
    case WcStatus::kMwBindErr: return "memory window bind error";
  }
  return "?";
}

EngineQp::EngineQp(const QpConfig& cfg, PacketSink& net, CompletionSink& cq, Memory& mem, Clock& clock)
    : cfg_(cfg), net_(net), cq_(cq), mem_(mem), clock_(clock) {
  cfg_.sq_psn &= kPsnMask;
  cfg_.rq_psn &= kPsnMask;
  if (cfg_.max_window == 0 || cfg_.max_window >= (1u << 23)) cfg_.max_window = 256;
  if (cfg_.ack_req_every == 0) cfg_.ack_req_every = 16;
  if (cfg_.max_rd_atomic == 0) cfg_.max_rd_atomic = 1;
  next_psn_ = sent_end_ = una_ = cfg_.sq_psn;
  last_acked_ = psn_add(cfg_.sq_psn, -1);
  epsn_ = cfg_.rq_psn;
  retry_left_ = cfg_.retry_cnt & 7;
  rnr_left_ = cfg_.rnr_retry & 7;
  tx_.resize(cfg_.pmtu + 64);
  payload_.resize(cfg_.pmtu);
}

void EngineQp::set_requester(uint32_t sq_psn, uint8_t timeout, uint8_t retry_cnt, uint8_t rnr_retry,
                       uint8_t max_rd_atomic) {
  cfg_.sq_psn = sq_psn & kPsnMask;
  cfg_.timeout = timeout;
  cfg_.retry_cnt = retry_cnt;
  cfg_.rnr_retry = rnr_retry;
  cfg_.max_rd_atomic = max_rd_atomic ? max_rd_atomic : 1;
  next_psn_ = sent_end_ = una_ = cfg_.sq_psn;
  last_acked_ = psn_add(cfg_.sq_psn, -1);
  retry_left_ = cfg_.retry_cnt & 7;
  rnr_left_ = cfg_.rnr_retry & 7;
}

uint64_t EngineQp::timeout_ns() const {
  // IBTA 9.7.6.1.3: 4.096 us x 2^timeout; 0 means the timer is disabled.
  return cfg_.timeout == 0 ? UINT64_MAX : 4096ull << (cfg_.timeout & 31);
}

uint8_t EngineQp::opcode_base() const {
  switch (cfg_.type) {
    case QpType::kUC: return op::kUC;
    case QpType::kUD: return op::kUD;
    case QpType::kXrcSend: case QpType::kXrcRecv: return op::kXRC;
    default: return op::kRC;
  }
}

int EngineQp::post_send(SendWr wr) {
  if (cfg_.type == QpType::kXrcRecv) return EINVAL;  // an XRC target has no send queue (IBTA A14)
  const bool rc = cfg_.type == QpType::kRC || cfg_.type == QpType::kXrcSend, ud = cfg_.type == QpType::kUD;
  switch (wr.opcode) {
    case WrOpcode::kSend: case WrOpcode::kSendImm: break;
    case WrOpcode::kWrite: case WrOpcode::kWriteImm: if (ud) return EINVAL; break;
    // Table 38: READ, atomics and SEND with Invalidate exist for RC (and XRC) only.
    case WrOpcode::kSendInv: case WrOpcode::kRead: case WrOpcode::kCompareSwap: case WrOpcode::kFetchAdd:
      if (!rc) return EINVAL;
      break;
    // IBTA annex A19's operations: RC only, as rxe has them.
    case WrOpcode::kFlush: case WrOpcode::kAtomicWrite:
      if (cfg_.type != QpType::kRC) return EINVAL;
      if (wr.opcode == WrOpcode::kFlush) wr.sg.clear();
      break;
    // Binding a type 2 window and local invalidation: connected QPs (UD
    // QPs cannot use type 2 windows, IBTA 10.6.7.2.5).
    case WrOpcode::kLocalInv: case WrOpcode::kBindMw:
      if (ud) return EINVAL;
      wr.sg.clear();
      break;
  }
  SendWqe w;
  uint64_t len = 0;
  for (const Sge& s : wr.sg) len += s.length;
  if (len > (1u << 31)) return EINVAL;  // IBTA 9.4: a message is at most 2^31 bytes
  w.len = uint32_t(len);
  w.wr = std::move(wr);
  if (state_ == EngineState::kError) {
    complete_send(w, WcStatus::kWrFlushErr);
    return 0;
  }
  sq_.push_back(std::move(w));
  return 0;
}

bool EngineQp::have_recv() {
  if (!rq_.empty()) return true;
  RecvWr r;
  // An XRC target has no receive queue: the request's XRC SRQ (IBTA A14).
  RecvSource* src = cfg_.type == QpType::kXrcRecv ? (xrc_srq_ ? xrc_srq_->recvs : nullptr) : recv_source_;
  if (!src || !src->take(r)) return false;
  rq_.push_back(std::move(r));
  return true;
}

int EngineQp::post_recv(RecvWr wr) {
  if (state_ == EngineState::kError) {
    complete_recv(wr, WcStatus::kWrFlushErr, 0, nullptr);
    return 0;
  }
  rq_.push_back(std::move(wr));
  return 0;
}

void EngineQp::receive(std::span<const uint8_t> packet, uint64_t from, std::span<const uint8_t> grh) {
  stats_.packets_received++;
  Packet p;
  if (state_ == EngineState::kError || parse_packet(packet, false, &p) != ParseError::kOk) {
    stats_.dropped++;
    return;
  }
  const Transport want = Transport(opcode_base() >> 5);
  // IBTA 9.6: header checks; a packet failing them is silently dropped.
  // A UD QP also takes the multicast QPN: its caller (UdpEndpoint::
  // deliver_multicast) found it attached to the packet's group.
  const bool mcast = cfg_.type == QpType::kUD && p.bth.dest_qp == kMulticastQpn;
  if ((p.bth.dest_qp != cfg_.qpn && !mcast) || p.info().transport != want ||
      ((p.bth.pkey & 0x7fff) != (cfg_.pkey & 0x7fff))) {
    stats_.dropped++;
    return;
  }
  // A connected QP (RC, UC, both ends of XRC) takes packets from its peer
  // only: the source address must be the one its address vector names
  // (IBTA 9.6, header validation: a connected QP's packets come from the
  // destination of its path, SLID / SGID checked; Linux
  // rxe, rxe_recv.c check_addr, compares the IP source with the QP's
  // destination GID and the IP destination with its source GID). The
  // owner maps the packet's source IP address to `from` (UdpEndpoint: the
  // UDP source port is RoCEv2's entropy and is not compared) and delivers
  // only what came to the QP's own address. UD takes any source (its
  // receives report it). A packet from elsewhere is silently dropped and counted.
  if (cfg_.type != QpType::kUD && from != cfg_.dest_ah) {
    stats_.wrong_source++;
    stats_.dropped++;
    return;
  }
  // An XRC initiator has no responder and an XRC target no requester
  // (IBTA A14): what goes the other way is dropped.
  if (p.info().request && cfg_.type != QpType::kXrcSend) {
    rx_since_ack_++;
    responder_receive(p, from, grh);
  } else if (!p.info().request && reliable() && cfg_.type != QpType::kXrcRecv) {
    completer_receive(p);
  } else {
    stats_.dropped++;
  }
}

void EngineQp::progress(bool flush_ack) {
  if (state_ != EngineState::kReady) return;
  on_timers();
  if (state_ != EngineState::kReady) return;
  if (flush_ack) flush_pending_ack();
  requester_run();
}

uint64_t EngineQp::next_deadline() const {
  if (state_ != EngineState::kReady) return UINT64_MAX;
  uint64_t t = retransmit_at_;
  if (rnr_until_ != 0 && rnr_until_ < t) t = rnr_until_;
  return t;
}

void EngineQp::set_error() { enter_error(SIZE_MAX, WcStatus::kWrFlushErr); }

// IBTA 10.3.1: in the error state every outstanding WR completes,
// with `st` for the one that failed and WR_FLUSH_ERR for the rest; the send
// queue in order first, then the receives.
void EngineQp::enter_error(size_t idx, WcStatus st) {
  if (state_ == EngineState::kError) return;
  state_ = EngineState::kError;
  retransmit_at_ = UINT64_MAX;
  rnr_until_ = 0;
  std::deque<SendWqe> sq;
  sq.swap(sq_);
  for (size_t i = 0; i < sq.size(); i++) complete_send(sq[i], i == idx ? st : WcStatus::kWrFlushErr);
  sq_next_ = 0;
  if (cur_recv_) {
    complete_recv(*cur_recv_, WcStatus::kWrFlushErr, 0, nullptr);
    cur_recv_.reset();
  }
  std::deque<RecvWr> rq;
  rq.swap(rq_);
  for (const RecvWr& r : rq) complete_recv(r, WcStatus::kWrFlushErr, 0, nullptr);
}

void EngineQp::complete_send(const SendWqe& w, WcStatus st) {
  if (st == WcStatus::kSuccess && rules::rule_of_wire(w.wr.opcode).kind == rules::WrKind::kSend)
    stats_.sends_completed++;
  if (st == WcStatus::kSuccess && !w.wr.signaled) return;
  Completion c;
  c.wr_id = w.wr.wr_id;
  c.status = st;
  c.qp_num = cfg_.qpn;
  c.byte_len = w.len;
  // The completion's opcode is the opcode rules' (common/opcode_rules.h);
  // an atomic completes with its 8 bytes, a local operation with none.
  const rules::OpcodeRule& rule = rules::rule_of_wire(w.wr.opcode);
  c.opcode = WcOpcode(rule.send_wc);
  if (rule.kind == rules::WrKind::kAtomic) c.byte_len = uint32_t(access::kAtomicBytes);
  if (rule.kind == rules::WrKind::kLocal) c.byte_len = 0;
  if (rule.kind == rules::WrKind::kAtomicWrite) c.byte_len = uint32_t(access::kAtomicBytes);
  if (rule.kind == rules::WrKind::kFlush) c.byte_len = w.wr.flush_len;  // as rxe: the length it was given
  cq_.complete(c);
}

void EngineQp::complete_recv(const RecvWr& r, WcStatus st, uint32_t byte_len, const Packet* p, uint64_t from,
                       bool write_imm, bool grh) {
  Completion c;
  c.wr_id = r.wr_id;
  c.status = st;
  c.is_recv = true;
  c.qp_num = cfg_.qpn;
  c.opcode = write_imm ? WcOpcode::kRecvWriteImm : WcOpcode::kRecv;
  c.xrc_srqn = r.xrc_srqn;
  if (st == WcStatus::kSuccess) stats_.recvs_completed++;
  if (st == WcStatus::kSuccess && p) {
    c.byte_len = byte_len;
    c.has_imm = p->info().has(kHasImmDt);
    c.imm = p->imm;
    c.has_inv = p->info().has(kHasIeth);
    c.invalidated_rkey = p->ieth_rkey;
    if (p->info().has(kHasDeth)) c.src_qp = p->deth.src_qp;
    c.src_ah = from;
    c.grh = grh;
  }
  cq_.complete(c);
}

void PacketSink::send_gather(uint64_t ah, std::span<const uint8_t> headers,
                             std::span<const std::span<const uint8_t>> payload) {
  std::vector<uint8_t> packet(headers.begin(), headers.end());
  size_t n = 0;
  for (auto piece : payload) {
    packet.insert(packet.end(), piece.begin(), piece.end());
    n += piece.size();
  }
  packet.resize(packet.size() + ((4 - (n & 3)) & 3), 0);
  send(ah, packet);
}

void EngineQp::emit_packet_gather(uint64_t ah, const Packet& p, std::span<const std::span<const uint8_t>> pieces) {
  size_t len = 0;
  for (auto piece : pieces) len += piece.size();
  const size_t n = build_headers(p, len, tx_);
  if (n == 0) return;  // cannot happen: tx_ holds the longest headers
  stats_.packets_sent++;
  net_.send_gather(ah, std::span<const uint8_t>(tx_.data(), n), pieces);
}

void EngineQp::emit_packet(uint64_t ah, const Packet& p) {
  size_t n = build_packet(p, tx_);
  if (n == 0) return;  // cannot happen: tx_ holds pmtu + the longest headers
  stats_.packets_sent++;
  net_.send(ah, std::span<const uint8_t>(tx_.data(), n));
}

}  // namespace sv::roce
