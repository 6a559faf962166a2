// counting.h: the shared-memory path's counts (common/counters.h), as the
// requester carries out a request: its own (QpSegmentHeader::req_counts,
// under its send lock) and the responder's (rsp_counts). Inlined into the
// fast path, where each is one unlocked add (counters::bump).
//
// On this path no packet exists: a request is one copy between two
// processes' memories, so sent_pkts and rcvd_pkts stay the wire's. What is
// counted is what the application's requests did: operations, messages
// sent and received, and payload bytes.
#pragma once

#include <cstdint>

#include "common/counters.h"
#include "common/opcode_rules.h"
#include "common/shm_layout.h"

namespace sv::verbs {

// One request carried out in success from QP `me` to QP `peer` (kind and
// immediate-with-receive as its opcode rule says), `len` its payload bytes.
// kOneWriter: the peer's slots have no other writer now (a connected QP's
// responder, whose only requester holds its send lock: the fast path);
// else they are added to atomically (UD and XRC responders have several).
template <bool kOneWriter>
[[gnu::always_inline]] inline void count_done(shm::QpSegmentHeader& me, shm::QpSegmentHeader& peer,
                                              rules::WrKind kind, bool takes_recv, uint64_t len) {
  using namespace counters;
  auto rsp = [&](uint32_t i, uint64_t n) {
    if constexpr (kOneWriter)
      bump(peer.rsp_counts[i], n);
    else
      add(peer.rsp_counts[i], n);
  };
  bump(me.req_counts[kReqOps], 1);
  switch (kind) {
    case rules::WrKind::kSend:
      bump(me.req_counts[kReqSends], 1);
      [[fallthrough]];
    case rules::WrKind::kWrite:
      bump(me.req_counts[kReqSentBytes], len);
      rsp(kRspRcvdBytes, len);
      if (takes_recv) rsp(kRspRecvs, 1);
      break;
    case rules::WrKind::kRead:
      bump(me.req_counts[kReqReadBytes], len);
      rsp(kRspReadBytes, len);
      break;
    default:  // atomics, ATOMIC WRITE, FLUSH: operations, not payload
      break;
  }
}

// One request this QP completed in error on the shared-memory path
// (flushes aside: they never ran).
inline void count_error(shm::QpSegmentHeader& me, ibv_wc_status status) {
  using namespace counters;
  if (status == IBV_WC_WR_FLUSH_ERR) return;
  bump(me.req_counts[kReqErrors], 1);
  if (status == IBV_WC_RETRY_EXC_ERR) bump(me.req_counts[kReqRetryExc], 1);
  if (status == IBV_WC_RNR_RETRY_EXC_ERR) bump(me.req_counts[kReqRnrRetryExc], 1);
}

}  // namespace sv::verbs
