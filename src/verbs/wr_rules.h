// wr_rules.h: the rules of each send work-request opcode, per QP type, in
// one table (as rxe's rxe_wr_opcode_info[] in rdma-core/the kernel), and the
// one check of an ibv_send_wr against them (validate_wr). Every post path --
// shared memory, mediated by the daemon, RoCEv2 wire, ibv_wr_* batches --
// validates through here, once per work request, before it carries it out.
#pragma once
#include <infiniband/verbs.h>

#include <cstdint>
#include <cstring>

#include "common/shm_layout.h"
#include "roce/engine.h"

namespace sv::verbs {

struct QpState;

// Internal send flag of a queued SendWqe: inline_data holds the payload
// (captured when the request was queued; ibv_post_send(3) lets the caller
// reuse the buffer at once).
constexpr uint32_t kInlineCaptured = 1u << 31;

// QP types as bits of WrRule::qp_types.
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

// What a request of an opcode does, as the requester carries it out.
enum class WrKind : uint8_t { kSend, kWrite, kRead, kAtomic, kLocal, kNone };

enum WrFlag : uint8_t {
  kWrImm = 1,       // carries immediate data
  kWrRecv = 2,      // consumes a receive WQE at the responder
  kWrNoInline = 4,  // IBV_SEND_INLINE refused: the SGE is a destination (READ, atomics)
  kWrFast = 8,      // the shared-memory fast path may carry it (requester.cc fast_post)
};

struct WrRule {
  bool known;          // an opcode softverbs implements
  WrKind kind;
  uint8_t qp_types;    // kRcBit | ...: the QP types it is allowed on
  uint8_t flags;       // WrFlag
  ibv_wc_opcode wc;    // the send completion's opcode
  uint64_t ex_flag;    // IBV_QP_EX_WITH_*: the ibv_wr_* builder's op
  roce::WrOpcode wire; // the RoCEv2 engine's opcode
};

// IBTA 9.8 / table 38 (and rdma-core's ibv_create_qp_ex send_ops_flags):
// RC and XRC initiators have every operation; UC has SENDs and RDMA WRITEs
// (no READ, atomics, remote invalidation, bind or local invalidation); UD
// has SENDs only (9.8.2). Type 1 windows are bound with ibv_bind_mw(3),
// type 2 through the send queue (IBTA 10.6.7.2.5).
constexpr uint8_t kConnected = kRcBit | kUcBit | kXrcBit;
constexpr uint8_t kReliable = kRcBit | kXrcBit;
constexpr WrRule kWrRules[] = {
    /* IBV_WR_RDMA_WRITE */
    {true, WrKind::kWrite, kConnected, kWrFast, IBV_WC_RDMA_WRITE, IBV_QP_EX_WITH_RDMA_WRITE, roce::WrOpcode::kWrite},
    /* IBV_WR_RDMA_WRITE_WITH_IMM */
    {true, WrKind::kWrite, kConnected, kWrImm | kWrRecv | kWrFast, IBV_WC_RDMA_WRITE,
     IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM, roce::WrOpcode::kWriteImm},
    /* IBV_WR_SEND */
    {true, WrKind::kSend, kConnected | kUdBit, kWrRecv | kWrFast, IBV_WC_SEND, IBV_QP_EX_WITH_SEND,
     roce::WrOpcode::kSend},
    /* IBV_WR_SEND_WITH_IMM */
    {true, WrKind::kSend, kConnected | kUdBit, kWrImm | kWrRecv | kWrFast, IBV_WC_SEND, IBV_QP_EX_WITH_SEND_WITH_IMM,
     roce::WrOpcode::kSendImm},
    /* IBV_WR_RDMA_READ */
    {true, WrKind::kRead, kReliable, kWrNoInline | kWrFast, IBV_WC_RDMA_READ, IBV_QP_EX_WITH_RDMA_READ,
     roce::WrOpcode::kRead},
    /* IBV_WR_ATOMIC_CMP_AND_SWP */
    {true, WrKind::kAtomic, kReliable, kWrNoInline, IBV_WC_COMP_SWAP, IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP,
     roce::WrOpcode::kCompareSwap},
    /* IBV_WR_ATOMIC_FETCH_AND_ADD */
    {true, WrKind::kAtomic, kReliable, kWrNoInline, IBV_WC_FETCH_ADD, IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD,
     roce::WrOpcode::kFetchAdd},
    /* IBV_WR_LOCAL_INV */
    {true, WrKind::kLocal, kReliable, 0, IBV_WC_LOCAL_INV, IBV_QP_EX_WITH_LOCAL_INV, roce::WrOpcode::kLocalInv},
    /* IBV_WR_BIND_MW */
    {true, WrKind::kLocal, kReliable, 0, IBV_WC_BIND_MW, IBV_QP_EX_WITH_BIND_MW, roce::WrOpcode::kBindMw},
    /* IBV_WR_SEND_WITH_INV */
    {true, WrKind::kSend, kReliable, kWrRecv, IBV_WC_SEND, IBV_QP_EX_WITH_SEND_WITH_INV, roce::WrOpcode::kSendInv},
};
static_assert(IBV_WR_RDMA_WRITE == 0 && IBV_WR_SEND_WITH_INV == 9, "kWrRules is indexed by ibv_wr_opcode");

constexpr WrRule kUnknownWr{false, WrKind::kNone, 0, 0, IBV_WC_SEND, 0, roce::WrOpcode::kSend};

// The rule of `opcode` (any integer a caller may have put there).
constexpr const WrRule& wr_rule(uint32_t opcode) {
  return opcode < sizeof(kWrRules) / sizeof(kWrRules[0]) ? kWrRules[opcode] : kUnknownWr;
}

// Per ibv_qp_type value (its low four bits; every type a QP is created
// with is below 16, and 0xff, IBV_QPT_DRIVER, gets 15: none), the opcodes
// the shared-memory fast path takes on it, as bit `opcode`: the rules'
// kWrFast and qp_types folded into one table, so that a post tests one bit
// (two table lookups and a shift cost every post ten instructions more,
// as callgrind counts).
struct FastOpcodes {
  uint32_t by_type[16];
};
constexpr FastOpcodes make_fast_opcodes() {
  FastOpcodes f{};
  for (uint32_t t = 0; t < 16; ++t)
    for (uint32_t op = 0; op < sizeof(kWrRules) / sizeof(kWrRules[0]); ++op)
      if ((kWrRules[op].flags & kWrFast) && (kWrRules[op].qp_types & qp_type_bit(ibv_qp_type(t))))
        f.by_type[t] |= 1u << op;
  return f;
}
inline constexpr FastOpcodes kFastOpcodes = make_fast_opcodes();
static_assert(kFastOpcodes.by_type[IBV_QPT_RC] == 0x1f && kFastOpcodes.by_type[IBV_QPT_UC] == 0x0f &&
              kFastOpcodes.by_type[IBV_QPT_UD] == 0x0c && kFastOpcodes.by_type[15] == 0);
constexpr bool fast_opcode(ibv_qp_type t, uint32_t opcode) {
  return opcode < 32 && ((kFastOpcodes.by_type[uint32_t(t) & 15] >> opcode) & 1);
}

// The opcode as the integer a C caller may have put there: an out-of-range
// value must be refused, and loading it as the enum would be undefined.
inline uint32_t opcode_of(const ibv_send_wr* wr) {
  uint32_t op;
  static_assert(sizeof(wr->opcode) == sizeof(op));
  std::memcpy(&op, &wr->opcode, sizeof(op));
  return op;
}

// 0, or EINVAL for a work request the QP cannot take (ibv_post_send(3)):
// an opcode its type does not have, a bad address handle or window, more
// SGEs than the QP has, inline data it cannot hold, an atomic without one
// 8-byte result buffer (IBTA 9.4.5).
int validate_wr(const QpState& q, const ibv_send_wr* wr);

// The SendWqe of a validated request (what the send queue holds).
void to_send_wqe(const QpState& q, const ibv_send_wr* wr, shm::SendWqe& w);

// The IBV_QP_EX_WITH_* ops a QP type allows (ibv_create_qp_ex send_ops_flags).
uint64_t supported_send_ops(ibv_qp_type type);

}  // namespace sv::verbs
