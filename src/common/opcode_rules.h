// opcode_rules.h: what each send work-request opcode is, in one table (as
// rxe's rxe_wr_opcode_info[]): the QP types that have it, what it does at
// the responder, the completions it makes at both ends, the rights its
// R_Key needs. The library (verbs/wr_rules.h: validation, the fast path,
// the RoCE engine's opcode), the daemon's mediation between users and the
// responder core (common/responder_core.h) all read this table; none has
// a switch of its own over the opcodes.
#pragma once
#include <infiniband/verbs.h>

#include <cstdint>

#include "common/verbs_current.h"

namespace sv::rules {

// QP types as bits of OpcodeRule::qp_types.
enum : uint8_t { kRcBit = 1, kUcBit = 2, kUdBit = 4, kXrcBit = 8 };

// One nibble per ibv_qp_type value below 16: no branch on the post path.
constexpr uint64_t kQpTypeBits = uint64_t(kRcBit) << (4 * IBV_QPT_RC) | uint64_t(kUcBit) << (4 * IBV_QPT_UC) |
                                 uint64_t(kUdBit) << (4 * IBV_QPT_UD) | uint64_t(kXrcBit) << (4 * IBV_QPT_XRC_SEND);
constexpr uint8_t qp_type_bit(ibv_qp_type t) {
  return uint32_t(t) < 16 ? uint8_t((kQpTypeBits >> (4 * uint32_t(t))) & 0xf) : 0;
}
static_assert(qp_type_bit(IBV_QPT_RC) == kRcBit && qp_type_bit(IBV_QPT_UC) == kUcBit &&
              qp_type_bit(IBV_QPT_UD) == kUdBit && qp_type_bit(IBV_QPT_XRC_SEND) == kXrcBit &&
              qp_type_bit(IBV_QPT_XRC_RECV) == 0 && qp_type_bit(IBV_QPT_RAW_PACKET) == 0);

// What a request of an opcode does at the responder (kLocal: nothing; it
// acts on the requester's side only). kAtomicWrite and kFlush are IBTA
// annex A19's memory placement operations: an 8-byte store that is one
// single-copy atomic store, and a FLUSH of a range or of a whole region
// to a placement type.
enum class WrKind : uint8_t { kSend, kWrite, kRead, kAtomic, kLocal, kAtomicWrite, kFlush, kNone };

enum WrFlag : uint8_t {
  kWrImm = 1,         // carries immediate data (IBV_WC_WITH_IMM at the responder)
  kWrRecv = 2,        // consumes a receive WQE at the responder
  kWrNoInline = 4,    // IBV_SEND_INLINE refused: the SGE is a destination (READ, atomics)
  kWrFast = 8,        // the shared-memory fast path may carry it (verbs/requester.cc fast_post)
  kWrInvalidate = 16, // invalidates an R_Key at the responder (IBV_WC_WITH_INV there)
};

// The values of roce::WrOpcode (roce/engine.h; the engine has no
// libibverbs types). verbs/wr_rules.h checks that they agree.
enum class WireOp : uint8_t {
  kSend, kSendImm, kSendInv, kWrite, kWriteImm, kRead, kCompareSwap, kFetchAdd, kLocalInv, kBindMw, kFlush, kAtomicWrite
};
constexpr uint32_t kWireOpCount = 12;

struct OpcodeRule {
  bool known;               // an opcode softverbs implements
  WrKind kind;
  uint8_t qp_types;         // kRcBit | ...: the QP types it is allowed on
  uint8_t flags;            // WrFlag
  ibv_wc_opcode send_wc;    // the requester's completion
  ibv_wc_opcode recv_wc;    // the responder's receive completion (when kWrRecv)
  uint32_t remote_need;     // what its R_Key must grant (IBV_ACCESS_REMOTE_*; 0: no R_Key)
  uint64_t ex_flag;         // IBV_QP_EX_WITH_*: the ibv_wr_* builder's op
  WireOp wire;              // the RoCEv2 engine's opcode
};

// IBTA 9.8 / table 38 (and rdma-core's ibv_create_qp_ex send_ops_flags):
// RC and XRC initiators have every operation; UC has SENDs and RDMA WRITEs
// (no READ, atomics, remote invalidation, bind or local invalidation); UD
// has SENDs only (9.8.2). Type 1 windows are bound with ibv_bind_mw(3),
// type 2 through the send queue (IBTA 10.6.7.2.5). Completion opcodes:
// ibv_poll_cq(3); R_Key rights: IBTA 10.6.7.2 (9.4.3 WRITE, 9.4.4 READ,
// 9.4.5 atomics). FLUSH and ATOMIC WRITE (IBTA annex A19; rdma-core's
// ibv_wr_flush, ibv_wr_atomic_write) are on RC only, as Linux rxe has them:
// ATOMIC WRITE's R_Key needs remote write (rxe's check), FLUSH's the
// FLUSH rights of its placement type (flush_need(), not the table's).
constexpr uint8_t kConnected = kRcBit | kUcBit | kXrcBit;
constexpr uint8_t kReliable = kRcBit | kXrcBit;
constexpr ibv_wc_opcode kNoRecv = IBV_WC_RECV;  // recv_wc of opcodes that take no receive (unused)
constexpr OpcodeRule kOpcodeRules[] = {
    /* IBV_WR_RDMA_WRITE */
    {true, WrKind::kWrite, kConnected, kWrFast, IBV_WC_RDMA_WRITE, kNoRecv, IBV_ACCESS_REMOTE_WRITE,
     IBV_QP_EX_WITH_RDMA_WRITE, WireOp::kWrite},
    /* IBV_WR_RDMA_WRITE_WITH_IMM */
    {true, WrKind::kWrite, kConnected, kWrImm | kWrRecv | kWrFast, IBV_WC_RDMA_WRITE, IBV_WC_RECV_RDMA_WITH_IMM,
     IBV_ACCESS_REMOTE_WRITE, IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM, WireOp::kWriteImm},
    /* IBV_WR_SEND */
    {true, WrKind::kSend, kConnected | kUdBit, kWrRecv | kWrFast, IBV_WC_SEND, IBV_WC_RECV, 0, IBV_QP_EX_WITH_SEND,
     WireOp::kSend},
    /* IBV_WR_SEND_WITH_IMM */
    {true, WrKind::kSend, kConnected | kUdBit, kWrImm | kWrRecv | kWrFast, IBV_WC_SEND, IBV_WC_RECV, 0,
     IBV_QP_EX_WITH_SEND_WITH_IMM, WireOp::kSendImm},
    /* IBV_WR_RDMA_READ */
    {true, WrKind::kRead, kReliable, kWrNoInline | kWrFast, IBV_WC_RDMA_READ, kNoRecv, IBV_ACCESS_REMOTE_READ,
     IBV_QP_EX_WITH_RDMA_READ, WireOp::kRead},
    /* IBV_WR_ATOMIC_CMP_AND_SWP */
    {true, WrKind::kAtomic, kReliable, kWrNoInline, IBV_WC_COMP_SWAP, kNoRecv, IBV_ACCESS_REMOTE_ATOMIC,
     IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP, WireOp::kCompareSwap},
    /* IBV_WR_ATOMIC_FETCH_AND_ADD */
    {true, WrKind::kAtomic, kReliable, kWrNoInline, IBV_WC_FETCH_ADD, kNoRecv, IBV_ACCESS_REMOTE_ATOMIC,
     IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD, WireOp::kFetchAdd},
    /* IBV_WR_LOCAL_INV */
    {true, WrKind::kLocal, kReliable, 0, IBV_WC_LOCAL_INV, kNoRecv, 0, IBV_QP_EX_WITH_LOCAL_INV, WireOp::kLocalInv},
    /* IBV_WR_BIND_MW */
    {true, WrKind::kLocal, kReliable, 0, IBV_WC_BIND_MW, kNoRecv, 0, IBV_QP_EX_WITH_BIND_MW, WireOp::kBindMw},
    /* IBV_WR_SEND_WITH_INV */
    {true, WrKind::kSend, kReliable, kWrRecv | kWrInvalidate, IBV_WC_SEND, IBV_WC_RECV, 0,
     IBV_QP_EX_WITH_SEND_WITH_INV, WireOp::kSendInv},
    /* IBV_WR_TSO, IBV_WR_DRIVER1, 12, 13: not operations of this device */
    {false, WrKind::kNone, 0, 0, IBV_WC_SEND, kNoRecv, 0, 0, WireOp::kSend},
    {false, WrKind::kNone, 0, 0, IBV_WC_SEND, kNoRecv, 0, 0, WireOp::kSend},
    {false, WrKind::kNone, 0, 0, IBV_WC_SEND, kNoRecv, 0, 0, WireOp::kSend},
    {false, WrKind::kNone, 0, 0, IBV_WC_SEND, kNoRecv, 0, 0, WireOp::kSend},
    /* IBV_WR_FLUSH (rdma-core v58 on) */
    {true, WrKind::kFlush, kRcBit, kWrNoInline, ibv_wc_opcode(abi::kWcFlush), kNoRecv, 0, abi::kQpExWithFlush,
     WireOp::kFlush},
    /* IBV_WR_ATOMIC_WRITE */
    {true, WrKind::kAtomicWrite, kRcBit, 0, IBV_WC_ATOMIC_WRITE, kNoRecv, IBV_ACCESS_REMOTE_WRITE,
     IBV_QP_EX_WITH_ATOMIC_WRITE, WireOp::kAtomicWrite},
};
constexpr uint32_t kOpcodeCount = sizeof(kOpcodeRules) / sizeof(kOpcodeRules[0]);
static_assert(IBV_WR_RDMA_WRITE == 0 && IBV_WR_SEND_WITH_INV == 9 && abi::kWrFlush == 14 &&
                  IBV_WR_ATOMIC_WRITE == 15 && kOpcodeCount == 16,
              "kOpcodeRules is indexed by ibv_wr_opcode");

constexpr OpcodeRule kUnknownOpcode{false, WrKind::kNone, 0, 0, IBV_WC_SEND, kNoRecv, 0, 0, WireOp::kSend};

// What a FLUSH's R_Key (and the responder QP's access flags) must grant for
// its placement type (IBTA A19.4.3; rxe's check_rkey): the FLUSH right of
// each type it names.
constexpr uint32_t flush_need(uint8_t placement) {
  return ((placement & abi::kFlushGlobal) ? abi::kAccessFlushGlobal : 0) |
         ((placement & abi::kFlushPersistent) ? abi::kAccessFlushPersistent : 0);
}

// The rule of `opcode` (any integer a caller may have put there).
constexpr const OpcodeRule& rule_of(uint32_t opcode) {
  return opcode < kOpcodeCount ? kOpcodeRules[opcode] : kUnknownOpcode;
}

// Is `opcode` one that QPs of `type` have (IBTA 9.8)?
constexpr bool allowed_on(uint32_t opcode, ibv_qp_type type) {
  const OpcodeRule& r = rule_of(opcode);
  return r.known && (r.qp_types & qp_type_bit(type)) != 0;
}

// The requester's completion opcode of a request (ibv_poll_cq(3)).
constexpr ibv_wc_opcode send_completion_opcode(uint32_t opcode) { return rule_of(opcode).send_wc; }

// The rule of the RoCE engine's request opcode.
struct WireIndex {
  uint8_t opcode_of[kWireOpCount];
};
constexpr WireIndex make_wire_index() {
  WireIndex w{};
  for (uint32_t op = 0; op < kOpcodeCount; ++op)
    if (kOpcodeRules[op].known) w.opcode_of[uint8_t(kOpcodeRules[op].wire)] = uint8_t(op);
  return w;
}
inline constexpr WireIndex kWireIndex = make_wire_index();
constexpr const OpcodeRule& rule_of_wire(WireOp op) {
  return uint8_t(op) < kWireOpCount ? kOpcodeRules[kWireIndex.opcode_of[uint8_t(op)]] : kUnknownOpcode;
}
static_assert(rule_of_wire(WireOp::kCompareSwap).send_wc == IBV_WC_COMP_SWAP &&
              rule_of_wire(WireOp::kWriteImm).send_wc == IBV_WC_RDMA_WRITE &&
              rule_of_wire(WireOp::kSend).send_wc == IBV_WC_SEND &&
              rule_of_wire(WireOp::kBindMw).send_wc == IBV_WC_BIND_MW &&
              rule_of_wire(WireOp::kFlush).send_wc == abi::kWcFlush &&
              rule_of_wire(WireOp::kAtomicWrite).send_wc == IBV_WC_ATOMIC_WRITE);

// The request's local SGEs are written (the destination of a READ, the
// result of an atomic), so their L_Keys need local write (IBTA 10.6.7.1).
constexpr bool writes_local(uint32_t opcode) {
  const WrKind k = rule_of(opcode).kind;
  return k == WrKind::kRead || k == WrKind::kAtomic;
}

}  // namespace sv::rules
