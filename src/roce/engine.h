// engine.h: the IBTA transport of one queue pair (RC, UC, UD, or the two
// ends of XRC: initiator and target, IBTA annex A14) as a pure
// engine: no sockets, no threads, no clock of its own. It is driven by
//   - post_send / post_recv (what a QP's send and receive queues hold),
//   - receive(packet) for each arriving transport packet (BTH .. pad, the
//     ICRC already checked and stripped by the packet I/O),
//   - progress() after a batch of receives and when next_deadline() passes,
// and it acts through four interfaces the owner provides: PacketSink (send a
// datagram to an address handle), CompletionSink (a CQ), Memory (local keys
// and remote keys, i.e. the MR tables), Clock.
//
// Roles, one file each as in rxe: requester.cc (send queue -> request
// packets, PSNs, segmentation, AckReq), responder.cc (request packets ->
// memory, receive completions, ACK/NAK/RNR, read responses, duplicate
// detection with the saved read/atomic resources), completer.cc (ACKs,
// read responses and atomic ACKs -> send completions, retransmission timer,
// RNR wait, retry counters, errors and flush).
//
// Contract: an EngineQp is not thread-safe; its owner serialises every call (one
// lock per QP, or one thread per set of QPs). The interfaces are called
// synchronously from inside those calls and must not call back into the EngineQp.
// The EngineQp keeps references to the interfaces, which must outlive it.
// Completions of one queue are delivered in order, each exactly once; an
// unsignaled send completes silently unless it fails.
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <optional>
#include <span>
#include <vector>

#include "common/opcode_rules.h"
#include "common/responder_core.h"
#include "roce/headers.h"
#include "roce/psn.h"

namespace sv::roce {

// kXrcSend: an XRC initiator (IBV_QPT_XRC_SEND), RC's requester whose
// requests name the responder's XRC SRQ (SendWr::xrc_srqn); kXrcRecv: an
// XRC target (IBV_QPT_XRC_RECV), RC's responder with no queues of its own,
// whose receive WQEs and memory checks come from the XRC SRQ each request
// names (XrcDomain). IBTA annex A14.
enum class QpType : uint8_t { kRC, kUC, kUD, kXrcSend, kXrcRecv };

// kLocalInv and kBindMw (a type 2 window) act on this side only, through
// Memory::execute_local, in send-queue order.
// The request opcodes: the opcode rules' (common/opcode_rules.h), which
// say each one's completion opcode and kind.
using WrOpcode = rules::WireOp;

// The ibv_wc_status values the transport produces (the same values).
enum class WcStatus : uint8_t {
  kSuccess = IBV_WC_SUCCESS,
  kLocLenErr = IBV_WC_LOC_LEN_ERR,
  kLocQpOpErr = IBV_WC_LOC_QP_OP_ERR,
  kLocProtErr = IBV_WC_LOC_PROT_ERR,
  kWrFlushErr = IBV_WC_WR_FLUSH_ERR,
  kRemInvReqErr = IBV_WC_REM_INV_REQ_ERR,
  kRemAccessErr = IBV_WC_REM_ACCESS_ERR,
  kRemOpErr = IBV_WC_REM_OP_ERR,
  kRetryExcErr = IBV_WC_RETRY_EXC_ERR,
  kRnrRetryExcErr = IBV_WC_RNR_RETRY_EXC_ERR,
  kMwBindErr = IBV_WC_MW_BIND_ERR,
};
constexpr WcStatus to_engine(ibv_wc_status s) { return WcStatus(uint8_t(s)); }
const char* wc_status_name(WcStatus s);

// The ibv_wc_opcode values of the completions (the same values).
enum class WcOpcode : uint8_t {
  kSend = IBV_WC_SEND,
  kWrite = IBV_WC_RDMA_WRITE,
  kRead = IBV_WC_RDMA_READ,
  kCompareSwap = IBV_WC_COMP_SWAP,
  kFetchAdd = IBV_WC_FETCH_ADD,
  kRecv = IBV_WC_RECV,
  kRecvWriteImm = IBV_WC_RECV_RDMA_WITH_IMM,
  kLocalInv = IBV_WC_LOCAL_INV,
  kBindMw = IBV_WC_BIND_MW,
  kFlush = abi::kWcFlush,
  kAtomicWrite = IBV_WC_ATOMIC_WRITE,
};

// Access bits, the values of ibv_access_flags.
enum : uint32_t {
  kLocalWrite = 1, kRemoteWrite = 2, kRemoteRead = 4, kRemoteAtomic = 8,
  kFlushGlobal = abi::kAccessFlushGlobal, kFlushPersistent = abi::kAccessFlushPersistent,
};

struct Sge {
  uint64_t addr = 0;
  uint32_t length = 0;
  uint32_t lkey = 0;
};

struct SendWr {
  uint64_t wr_id = 0;
  WrOpcode opcode = WrOpcode::kSend;
  std::vector<Sge> sg;
  bool signaled = true;
  bool solicited = false;
  bool fence = false;            // wait for earlier READs and atomics (IBV_SEND_FENCE)
  uint32_t imm = 0;              // kSendImm, kWriteImm: ImmDt's 4 bytes read big-endian (ntohl of imm_data)
  uint32_t invalidate_rkey = 0;  // kSendInv, kLocalInv
  struct MwBind {                // kBindMw: what ibv_mw_bind_info says, opaque to the engine
    uint32_t mw_handle = 0, rkey = 0, mr_lkey = 0, access = 0;
    uint64_t addr = 0, length = 0;
  } bind;
  uint64_t remote_addr = 0;      // write, read, atomics, A19's FLUSH and ATOMIC WRITE
  uint32_t rkey = 0;
  uint64_t compare_add = 0;      // compare (CmpSwap) or add (FetchAdd); ATOMIC WRITE without sg: its 8 bytes
  uint8_t placement = 0;         // kFlush: the FETH's placement type and selectivity level, and the
  uint8_t level = 0;             //   RETH's length (IBTA annex A19)
  uint32_t flush_len = 0;
  uint64_t swap = 0;
  uint32_t remote_qpn = 0;       // UD
  uint32_t remote_qkey = 0;      // UD; high bit set = use the QP's Q_Key
  uint32_t xrc_srqn = 0;         // XRC initiator: the responder's XRC SRQ (the XRCETH)
  uint64_t ah = 0;               // UD: destination, opaque to the engine
  // A fault plan's completion in error (docs/LAB.md "Faults"): the request
  // sends no packet; once every earlier one has completed it completes with
  // this status and the QP enters the error state, as after a real error.
  WcStatus fails_with = WcStatus::kSuccess;
};

struct RecvWr {
  uint64_t wr_id = 0;
  std::vector<Sge> sg;
  uint32_t xrc_srqn = 0;  // XRC target: the SRQ it came from (its completion goes to that SRQ's CQ)
};

struct Completion {
  uint64_t wr_id = 0;
  WcStatus status = WcStatus::kSuccess;
  WcOpcode opcode = WcOpcode::kSend;
  bool is_recv = false;
  uint32_t byte_len = 0;
  bool has_imm = false;
  uint32_t imm = 0;
  bool has_inv = false;
  uint32_t invalidated_rkey = 0;
  uint32_t src_qp = 0;  // UD receives
  uint64_t src_ah = 0;  // UD receives: where it came from (the `from` of receive())
  bool grh = false;     // UD receives: the first 40 bytes hold a GRH (IBV_WC_GRH)
  uint32_t qp_num = 0;
  uint32_t xrc_srqn = 0;  // XRC target receives: the SRQ whose WQE this is (RecvWr::xrc_srqn)
};

// Zero-copy sends (PacketSink::send_gather): a packet's payload in at most
// this many pieces; payloads shorter than kGatherMin bytes are copied, which
// costs less than a piece.
constexpr size_t kMaxPayloadPieces = 4;
constexpr uint32_t kGatherMin = 256;

class PacketSink {
 public:
  virtual ~PacketSink() = default;
  // Send one transport packet (BTH .. pad; the I/O adds IP/UDP and ICRC).
  virtual void send(uint64_t ah, std::span<const uint8_t> packet) = 0;
  // The same packet with its payload in pieces, gathered where it lies
  // (Memory::local_view / remote_view): `headers` is BTH (pad count set)
  // and the extension headers, copied during the call; `payload` the
  // pieces in order, followed on the wire by the pad's zero bytes. The
  // pieces are registered memory: a sink may keep pointing at them until
  // the owner's next flush, which comes before the call into the engine
  // returns. The default copies them into one packet and calls send().
  virtual void send_gather(uint64_t ah, std::span<const uint8_t> headers,
                           std::span<const std::span<const uint8_t>> payload);
};

class CompletionSink {
 public:
  virtual ~CompletionSink() = default;
  virtual void complete(const Completion& c) = 0;
};

class Clock {
 public:
  virtual ~Clock() = default;
  virtual uint64_t now_ns() const = 0;
};

// Registered memory as the transport needs it. Local keys check the local
// SGEs of a work request (IBTA 10.6.3); remote keys check and carry out
// the responder's accesses (IBTA 10.6.7: key, PD, bounds, access rights).
// Each returns false on a protection violation, having touched nothing.
class Memory {
 public:
  virtual ~Memory() = default;
  virtual bool local_read(uint32_t lkey, uint64_t addr, std::span<uint8_t> out) = 0;
  virtual bool local_write(uint32_t lkey, uint64_t addr, std::span<const uint8_t> in) = 0;
  virtual bool remote_check(uint32_t rkey, uint64_t va, uint64_t len, uint32_t access) = 0;
  virtual bool remote_write(uint32_t rkey, uint64_t va, std::span<const uint8_t> in) = 0;
  virtual bool remote_read(uint32_t rkey, uint64_t va, std::span<uint8_t> out) = 0;
  // Zero-copy sends: where [addr, addr + len) lies in this process, if the
  // key grants reading it (local_view: an L_Key, as local_read; remote_view:
  // an R_Key with remote read, as remote_read) and the bytes stay mapped as
  // long as the registration does; nullptr otherwise, and the engine copies
  // with local_read / remote_read, which decide about violations.
  virtual const uint8_t* local_view(uint32_t lkey, uint64_t addr, size_t len) {
    (void)lkey, (void)addr, (void)len;
    return nullptr;
  }
  virtual const uint8_t* remote_view(uint32_t rkey, uint64_t va, size_t len) {
    (void)rkey, (void)va, (void)len;
    return nullptr;
  }
  // 8 bytes at va, naturally aligned (checked by the responder): compare and
  // swap when `cas`, else fetch and add. Atomic with respect to every other
  // access to that memory (other QPs, local CPUs).
  virtual bool remote_atomic(uint32_t rkey, uint64_t va, bool cas, uint64_t compare_add, uint64_t swap,
                             uint64_t* orig) = 0;
  // IBTA annex A19. ATOMIC WRITE: the 8 bytes `value` (as they were on the
  // wire) at va, aligned (checked by the responder), with an R_Key granting
  // remote write, as one store (core::store_atomic_write). FLUSH: the R_Key
  // grants `need` over [va, va + len), or over its whole region when `level`
  // is IBV_FLUSH_MR, and the flush to `placement` is done (core::apply_flush):
  // kOk, kRemoteKey, or kResponderFault when it could not be.
  virtual bool remote_atomic_write(uint32_t rkey, uint64_t va, const uint8_t (&value)[8]) {
    (void)rkey, (void)va, (void)value;
    return false;
  }
  virtual core::Check remote_flush(uint32_t rkey, uint64_t va, uint64_t len, uint32_t need, uint8_t placement,
                                   uint8_t level) {
    (void)rkey, (void)va, (void)len, (void)need, (void)placement, (void)level;
    return core::Check::kRemoteKey;
  }
  // SEND with Invalidate (IBTA 10.6.7): false if the key cannot be invalidated.
  virtual bool invalidate(uint32_t rkey) { (void)rkey; return false; }
  // A LOCAL_INV or BIND_MW work request, carried out when the send queue
  // reaches it: kSuccess, or the status its completion gets.
  virtual WcStatus execute_local(const SendWr& wr) { (void)wr; return WcStatus::kLocQpOpErr; }
};

// Where receive WQEs come from when the EngineQp's own receive queue is empty:
// a queue shared with others (an SRQ, or a ring that other paths also
// consume), taken from one WQE at a time, only when a message needs one.
class RecvSource {
 public:
  virtual ~RecvSource() = default;
  virtual bool take(RecvWr& out) = 0;
};

// An XRC target's receive side (IBTA annex A14): the XRC SRQs of its XRC
// domain. A SEND (or WRITE with Immediate) takes its receive WQE from the
// SRQ its XRCETH names, and every key of the request (receive buffers,
// R_Keys of RDMA and atomics) is checked in that SRQ's PD.
struct XrcSrq {
  RecvSource* recvs = nullptr;
  Memory* mem = nullptr;
};
class XrcDomain {
 public:
  virtual ~XrcDomain() = default;
  // The XRC SRQ `srqn` if it belongs to the target QP's XRC domain, else
  // nullptr (the request is then an invalid request). The pointer stays
  // valid as long as the EngineQp.
  virtual const XrcSrq* find_srq(uint32_t srqn) = 0;
};

// The attributes ibv_modify_qp gives a QP on its way to RTS.
struct QpConfig {
  QpType type = QpType::kRC;
  uint32_t qpn = 0;
  uint32_t dest_qpn = 0;       // RC, UC
  uint64_t dest_ah = 0;        // RC, UC: the peer's address, opaque to the engine
  uint32_t sq_psn = 0;
  uint32_t rq_psn = 0;
  uint32_t pmtu = 1024;        // bytes: 256, 512, 1024, 2048 or 4096
  uint8_t timeout = 14;        // ACK timeout 4.096 us x 2^timeout, 0 = infinite (IBTA 9.7.6.1.3)
  uint8_t retry_cnt = 7;       // transport retries after a timeout or sequence NAK (7 is 7)
  uint8_t rnr_retry = 7;       // RNR retries, 7 = infinite (IBTA 9.7.5.2.8)
  uint8_t min_rnr_timer = 12;  // table 45 code this responder sends in an RNR NAK
  uint32_t qkey = 0;           // UD
  uint32_t access = 0;         // kRemoteWrite | kRemoteRead | kRemoteAtomic the QP allows
  uint8_t max_rd_atomic = 16;       // initiator depth: READs and atomics in flight
  uint8_t max_dest_rd_atomic = 16;  // responder resources: saved READs and atomics
  uint16_t pkey = kDefaultPkey;
  uint32_t max_window = 256;   // unacknowledged PSNs the requester allows itself (< 2^23)
  uint32_t ack_req_every = 16; // AckReq at least every this many packets of a long message
  uint32_t ack_urgent_after = 0;  // packets after which a pending ACK is not held (0: max_window / 4)
};

// The engine's own state, not the verbs QP state of common/qp_state.h:
// kError once a fatal error or set_error() has flushed the queues (the ERR
// state of IBTA 10.3.1); every later post completes with kWrFlushErr.
enum class EngineState : uint8_t { kReady, kError };

struct QpStats {
  uint64_t packets_sent = 0, packets_received = 0, retransmit_timeouts = 0, seq_naks_sent = 0,
           seq_naks_received = 0, rnr_naks_sent = 0, rnr_naks_received = 0, acks_sent = 0, duplicates = 0,
           dropped = 0, read_replays = 0, atomic_replays = 0;
  uint64_t wrong_source = 0;  // connected QPs: from an address other than the peer's (also in dropped)
  // Messages: SENDs completed in success (signaled or not) and receives
  // completed in success (a SEND, or a WRITE with immediate), as rxe's
  // rdma_sends and rdma_recvs.
  uint64_t sends_completed = 0, recvs_completed = 0;
};

// The RoCEv2 transport of one QP (requester, responder, completer).
class EngineQp {
 public:
  EngineQp(const QpConfig& cfg, PacketSink& net, CompletionSink& cq, Memory& mem, Clock& clock);
  EngineQp(const EngineQp&) = delete;
  EngineQp& operator=(const EngineQp&) = delete;

  // Queue a work request. In the error state it completes at once with
  // kWrFlushErr (as a QP in ERR flushes what is posted). Returns 0, or
  // EINVAL for a request the QP type cannot carry (e.g. READ on UC).
  int post_send(SendWr wr);
  int post_recv(RecvWr wr);
  // Receive WQEs are also taken from `src` (not owned; nullptr: none).
  void set_recv_source(RecvSource* src) { recv_source_ = src; }
  // XRC target: where the SRQs its requests name are found (not owned).
  void set_xrc_domain(XrcDomain* d) { xrc_ = d; }
  // One arriving transport packet; `from` is the sender's address handle
  // (reported in UD receive completions; for RC, UC and XRC it must be
  // QpConfig::dest_ah). Malformed packets, packets for another QP or
  // transport, and a connected QP's packets from another address are
  // dropped and counted. `grh`, if 40 bytes, is
  // what a UD receive gets in the first 40 bytes of its buffer (RoCEv2: the
  // IPv6 header, or 20 zero bytes then the IPv4 header).
  void receive(std::span<const uint8_t> packet, uint64_t from = 0, std::span<const uint8_t> grh = {});
  // Timers, the coalesced ACK of the last batch of receives, new packets.
  // With flush_ack false the ACK stays pending (ack_pending()): the owner
  // may hold it a little so that it leaves with the next request, and must
  // then call progress() or flush_ack() in time.
  void progress(bool flush_ack = true);
  bool ack_pending() const { return ack_pending_; }
  // A pending ACK that should not be held: a stream has brought a quarter
  // of the requester's window (as this side's own window, max_window) since
  // the last ACK, and the requester may be about to stall on its window.
  bool ack_urgent() const {
    return ack_pending_ && rx_since_ack_ >= (cfg_.ack_urgent_after ? cfg_.ack_urgent_after : cfg_.max_window / 4);
  }
  void flush_ack() {
    if (state_ == EngineState::kReady) flush_pending_ack();
  }
  // When progress() next has timer work (ns on the Clock), or UINT64_MAX.
  uint64_t next_deadline() const;
  // RTR -> RTS (ibv_modify_qp): the requester's attributes, given before
  // anything was posted; the responder's state is kept.
  void set_requester(uint32_t sq_psn, uint8_t timeout, uint8_t retry_cnt, uint8_t rnr_retry, uint8_t max_rd_atomic);
  // Move to the error state: flush both queues (IBTA 10.3.1).
  void set_error();

  EngineState state() const { return state_; }
  // Why the responder took the QP to the error state, as the requester's
  // completion names it (kRemInvReqErr, kRemAccessErr, kRemOpErr; IBTA
  // 9.7.5.2); kSuccess if it did not. The owner raises the responder's
  // affiliated asynchronous error from it (IBTA 11.6.3.1).
  WcStatus responder_fault() const { return resp_fault_; }
  const QpConfig& config() const { return cfg_; }
  const QpStats& stats() const { return stats_; }
  size_t send_queue_depth() const { return sq_.size(); }

 private:
  // ---- requester (requester.cc)
  struct SendWqe {
    SendWr wr;
    uint32_t len = 0;
    bool started = false;    // PSNs assigned
    bool done = false;       // READ/atomic response arrived
    uint32_t first_psn = 0, last_psn = 0;
    uint32_t resp_pkts = 0;  // READ response packets received in order
  };
  enum class ReqStep : uint8_t { kSent, kBlocked, kIdle };
  ReqStep requester_step();
  bool start_wqe(SendWqe& w);
  ReqStep planned_failure_step();
  void send_request_packet(SendWqe& w);
  bool build_a19_packet(SendWqe& w, Packet& p);
  using PayloadViews = std::array<std::span<const uint8_t>, kMaxPayloadPieces>;
  bool build_payload_packet(SendWqe& w, Packet& p, PayloadViews& views, size_t& nviews, bool& last);
  void requester_run();
  bool gather(const SendWqe& w, uint32_t off, std::span<uint8_t> out);
  // The pieces of [off, off + len) of `w`'s data where they lie in memory,
  // or 0 if some piece cannot be viewed (then gather copies); at most
  // kMaxPayloadPieces pieces.
  size_t gather_views(const SendWqe& w, uint32_t off, uint32_t len,
                      std::array<std::span<const uint8_t>, kMaxPayloadPieces>& out);
  uint32_t packets_of(const SendWqe& w) const;
  bool is_read_or_atomic(const SendWqe& w) const;
  static bool is_local(const SendWqe& w) {
    return w.wr.opcode == WrOpcode::kLocalInv || w.wr.opcode == WrOpcode::kBindMw;
  }
  ReqStep local_step(SendWqe& w);

  // ---- responder (responder.cc)
  enum class RespMsg : uint8_t { kNone, kSend, kWrite };  // the multi-packet message in progress
  // kNak: a check failed (resp_check_ says which; core::verdict says what
  // it means at both ends).
  enum class RespResult : uint8_t { kDone, kRnr, kNak, kDrop };
  RespResult refuse(core::Check c) {
    resp_check_ = c;
    return RespResult::kNak;
  }
  struct Resource {  // IBTA 9.7.5: a READ or atomic kept for duplicates
    bool atomic = false;
    bool ack_only = false;  // FLUSH, ATOMIC WRITE: a duplicate is answered, not executed (A19)
    uint32_t xrc_srqn = 0;  // XRC target: the SRQ whose PD the READ's key was checked in
    uint32_t first_psn = 0, last_psn = 0;
    Reth reth;
    uint64_t orig = 0;
  };
  bool have_recv();  // rq_ has a WQE, pulled from recv_source_ (XRC: the request's SRQ) if need be
  // RC and both ends of XRC: acknowledged, with PSN windows and retries.
  bool reliable() const { return cfg_.type != QpType::kUC && cfg_.type != QpType::kUD; }
  uint8_t opcode_base() const;  // the transport's top three opcode bits
  // The memory the responder checks keys in: the QP's, or (XRC target) the
  // SRQ's of the request being executed.
  Memory& rmem() { return xrc_srq_ ? *xrc_srq_->mem : mem_; }
  void responder_receive(const Packet& p, uint64_t from, std::span<const uint8_t> grh);
  void responder_rc(const Packet& p);  // RC and XRC targets
  void responder_duplicate(const Packet& p);
  RespResult responder_execute(const Packet& p);
  RespResult respond_send(const Packet& p);
  RespResult respond_write(const Packet& p);
  RespResult respond_read(const Packet& p);
  RespResult respond_atomic(const Packet& p);
  RespResult respond_flush(const Packet& p);
  RespResult respond_atomic_write(const Packet& p);
  RespResult respond_a19(const Packet& p);  // what FLUSH and ATOMIC WRITE share once done
  void responder_ud(const Packet& p, uint64_t from, std::span<const uint8_t> grh);
  void responder_uc(const Packet& p);
  void send_read_response(const Reth& reth, uint32_t first_psn);
  void send_ack(uint8_t syndrome, uint32_t psn);
  void send_atomic_ack(uint32_t psn, uint64_t orig);
  void flush_pending_ack();
  // `data` into the receive `r` at `off` (core::scatter_receive's checks).
  core::Check scatter(const RecvWr& r, uint32_t off, std::span<const uint8_t> data);
  void complete_recv(const RecvWr& r, WcStatus st, uint32_t byte_len, const Packet* p, uint64_t from = 0,
                     bool write_imm = false, bool grh = false);

  // ---- completer (completer.cc)
  void completer_receive(const Packet& p);
  void on_ack(const Packet& p);
  void on_read_response(const Packet& p);
  void on_atomic_ack(const Packet& p);
  void on_a19_response(SendWqe& r, const Packet& p);
  void responded_through(uint32_t psn);
  bool acknowledge_through(uint32_t psn);
  void retire();
  void position(uint32_t psn);
  void go_back(uint32_t psn);
  void enter_error(size_t idx, WcStatus st);
  uint64_t timeout_ns() const;
  void arm_retransmit_timer();
  void on_timers();
  void fail_wqe_at(uint32_t psn, WcStatus st);
  SendWqe* oldest_pending_read_or_atomic();
  void complete_send(const SendWqe& w, WcStatus st);
  void emit_packet(uint64_t ah, const Packet& p);
  // p's headers, then `pieces` as its payload (p.payload unused).
  void emit_packet_gather(uint64_t ah, const Packet& p, std::span<const std::span<const uint8_t>> pieces);

  QpConfig cfg_;
  PacketSink& net_;
  CompletionSink& cq_;
  Memory& mem_;
  Clock& clock_;
  EngineState state_ = EngineState::kReady;
  WcStatus resp_fault_ = WcStatus::kSuccess;  // responder_fault()
  core::Check resp_check_ = core::Check::kOk;  // the check that made the last kNak
  QpStats stats_;
  std::vector<uint8_t> tx_;       // one packet being built
  std::vector<uint8_t> payload_;  // one packet's payload being gathered

  // requester
  std::deque<SendWqe> sq_;
  size_t sq_next_ = 0;         // index in sq_ of the WQE the next packet comes from
  uint32_t sq_next_off_ = 0;   // byte offset in it
  uint32_t next_psn_;          // PSN of the next packet to send (moves back on retransmission)
  uint32_t sent_end_;          // one past the highest PSN ever sent
  uint32_t una_;               // oldest unacknowledged PSN
  uint32_t since_ack_req_ = 0;
  uint32_t rd_atomic_in_flight_ = 0;

  // completer
  uint64_t retransmit_at_ = UINT64_MAX;
  uint64_t rnr_until_ = 0;     // no sending before this (RNR wait)
  uint8_t retry_left_;
  uint8_t rnr_left_;
  uint32_t implied_nak_psn_ = UINT32_MAX;  // the read already re-requested for an implied NAK
  uint32_t last_acked_;                     // newest PSN the responder acknowledged
  uint32_t last_seq_nak_ = UINT32_MAX;
  bool timed_out_since_nak_ = false;

  // responder
  std::deque<RecvWr> rq_;
  RecvSource* recv_source_ = nullptr;
  uint32_t epsn_;
  uint32_t msn_ = 0;
  RespMsg resp_msg_ = RespMsg::kNone;
  std::optional<RecvWr> cur_recv_;
  uint32_t recv_off_ = 0;
  Reth cur_write_;             // the WRITE in progress: va advanced, dma_len = bytes left
  uint32_t write_total_ = 0;
  bool nak_sent_ = false;      // one sequence NAK per gap (IBTA 9.7.5)
  bool ack_pending_ = false;
  uint32_t rx_since_ack_ = 0;  // request packets accepted since the last ACK went
  bool uc_resync_ = false;     // UC: dropping until the next First/Only
  std::deque<Resource> resources_;
  XrcDomain* xrc_ = nullptr;
  const XrcSrq* xrc_srq_ = nullptr;  // XRC target: the SRQ of the request being handled
  uint32_t xrc_msg_srqn_ = 0;        // XRC target: the SRQ of the multi-packet message in progress
};

}  // namespace sv::roce
