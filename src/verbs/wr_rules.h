// wr_rules.h: the library's use of the opcode rules (common/opcode_rules.h):
// the one check of an ibv_send_wr against them (validate_wr). Every post path --
// shared memory, mediated by the daemon, RoCEv2 wire, ibv_wr_* batches --
// validates through here, once per work request, before it carries it out.
#pragma once
#include <infiniband/verbs.h>

#include <cstdint>
#include <cstring>

#include "common/opcode_rules.h"
#include "common/shm_layout.h"
#include "roce/engine.h"

namespace sv::verbs {

struct ProcessQp;

// Internal send flag of a queued SendWqe: inline_data holds the payload
// (captured when the request was queued; ibv_post_send(3) lets the caller
// reuse the buffer at once).
constexpr uint32_t kInlineCaptured = 1u << 31;

// Internal send flag of an ibv_send_wr that ibv_wr_flush built: a FLUSH
// (IBV_WR_FLUSH). ibv_send_wr has no fields for a FLUSH's placement type
// and selectivity level, so ibv_post_send(3) cannot express one (rdma-core
// offers FLUSH through ibv_wr_flush only); the builder carries them in
// wr.atomic: remote_addr, rkey, compare_add the length, swap the placement
// type and (bits 8 on) the selectivity level (flush_fields).
constexpr uint32_t kFlushBuilt = 1u << 30;
struct FlushFields {
  uint64_t addr, len;
  uint32_t rkey;
  uint8_t placement, level;
};
constexpr uint64_t flush_code(uint8_t placement, uint8_t level) { return placement | uint64_t(level) << 8; }
constexpr FlushFields flush_fields(uint64_t addr, uint32_t rkey, uint64_t len, uint64_t code) {
  return {addr, len, rkey, uint8_t(code), uint8_t(code >> 8)};
}

// The opcode rules themselves are common/opcode_rules.h, shared with the
// daemon's mediation and the responder core; the library's names for them.
using rules::kRcBit;
using rules::kUcBit;
using rules::kUdBit;
using rules::kXrcBit;
using rules::qp_type_bit;
using rules::WrKind;
using rules::kWrImm;
using rules::kWrRecv;
using rules::kWrNoInline;
using rules::kWrFast;
using WrRule = rules::OpcodeRule;
constexpr const WrRule& wr_rule(uint32_t opcode) { return rules::rule_of(opcode); }

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
    for (uint32_t op = 0; op < rules::kOpcodeCount; ++op)
      if ((rules::kOpcodeRules[op].flags & kWrFast) && rules::allowed_on(op, ibv_qp_type(t)))
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
int validate_wr(const ProcessQp& q, const ibv_send_wr* wr);

// The SendWqe of a validated request (what the send queue holds).
void to_send_wqe(const ProcessQp& q, const ibv_send_wr* wr, shm::SendWqe& w);

// The IBV_QP_EX_WITH_* ops a QP type allows (ibv_create_qp_ex send_ops_flags).
uint64_t supported_send_ops(ibv_qp_type type);

}  // namespace sv::verbs
