// counters.h: the device's counters (docs/LAB.md, "Counters"), per QP and
// summed per port: their names, the slots each path counts them in, and
// how the slots add up to the named values.
//
// Three sources, per QP:
//  - the wire (RoCEv2): QpSegmentHeader::wire (shm::WireCounter), copied
//    from the engine by the process that carries the QP there;
//  - shared memory: QpSegmentHeader::req_counts (ShmReq, the QP as
//    requester, written by its holders under its send lock) and
//    rsp_counts (ShmRsp, the QP as responder, written by the requesters of
//    the same user that reach it);
//  - between users: the daemon's own counts (Mediated), kept in its memory.
// The segment's slots are client-writable: whatever they hold is shown only
// to the QP's own user (and root).
#pragma once

#include <atomic>
#include <cstdint>
#include <iterator>

#include "common/shm_layout.h"

namespace sv::counters {

// The named counters, in this order everywhere (`rdma statistic`, the sysfs
// view's hw_counters, `softverbs status --json`). The first fifteen are
// Linux rxe's (drivers/infiniband/sw/rxe/rxe_hw_counters.h), in its order;
// sent_bytes and rcvd_bytes are the names rxe's later counters use; the
// rest are softverbs' own.
enum Counter : uint32_t {
  kSentPkts,
  kRcvdPkts,
  kDuplicateRequest,
  kOutOfSeqRequest,
  kRcvdRnrErr,
  kSendRnrErr,
  kRcvdSeqErr,
  kAckDeferred,
  kRetryExceededErr,
  kRetryRnrExceededErr,
  kCompleterRetryErr,
  kSendErr,
  kLinkDowned,
  kRdmaSends,
  kRdmaRecvs,
  kSentBytes,
  kRcvdBytes,
  kShmOps,
  kMediatedOps,
  kShmErrors,
  kMediatedErrors,
  kCount
};

inline constexpr const char* kNames[] = {
    "sent_pkts",          "rcvd_pkts",     "duplicate_request", "out_of_seq_request", "rcvd_rnr_err",
    "send_rnr_err",       "rcvd_seq_err",  "ack_deferred",      "retry_exceeded_err", "retry_rnr_exceeded_err",
    "completer_retry_err", "send_err",     "link_downed",       "rdma_sends",         "rdma_recvs",
    "sent_bytes",         "rcvd_bytes",    "shm_ops",           "mediated_ops",       "shm_errors",
    "mediated_errors"};
static_assert(std::size(kNames) == kCount);
static_assert(uint32_t(kRdmaRecvs) + 1 == shm::kWireCounterCount, "the wire's counters are the first ones");

// The requester's slots on the shared-memory path (QpSegmentHeader::req_counts).
enum ShmReq : uint32_t {
  kReqSends,         // SENDs carried out (rdma_sends)
  kReqOps,           // every request carried out, SENDs included (shm_ops)
  kReqSentBytes,     // SEND and WRITE payload (sent_bytes)
  kReqReadBytes,     // READ payload that came back (rcvd_bytes)
  kReqErrors,        // requests completed in error, flushes aside (shm_errors)
  kReqRetryExc,      // of those: IBV_WC_RETRY_EXC_ERR (retry_exceeded_err)
  kReqRnrRetryExc,   // of those: IBV_WC_RNR_RETRY_EXC_ERR (retry_rnr_exceeded_err)
  kReqCount
};
static_assert(kReqCount <= shm::kReqCounterSlots);
// The responder's slots (QpSegmentHeader::rsp_counts), written by the
// requesters that reach the QP.
enum ShmRsp : uint32_t {
  kRspRecvs,       // receives completed in success (rdma_recvs)
  kRspRcvdBytes,   // SEND and WRITE payload placed here (rcvd_bytes)
  kRspReadBytes,   // READ payload taken from here (sent_bytes)
  kRspCount
};
static_assert(kRspCount <= shm::kRspCounterSlots);

// The daemon's slots for a QP between users (Op::Mediate, Op::MediatePost).
enum Mediated : uint32_t {
  kMedSends,       // as kReqSends
  kMedOps,         // as kReqOps
  kMedSentBytes,   // as kReqSentBytes
  kMedReadBytes,   // as kReqReadBytes
  kMedErrors,      // as kReqErrors
  kMedRecvs,       // as kRspRecvs, the QP as responder
  kMedRcvdBytes,   // as kRspRcvdBytes
  kMedServedBytes, // as kRspReadBytes
  kMedCount
};

using Values = uint64_t[kCount];

// Adds one QP's slots to `out` (the sums wrap: the segment's slots are any
// value its holders wrote). `h` (no segment) and `med` may be null.
inline void add_qp(const shm::QpSegmentHeader* hp, const uint64_t* med, Values& out) {
  auto at = [](const std::atomic<uint64_t>& a) { return a.load(std::memory_order_relaxed); };
  if (hp) {
    const shm::QpSegmentHeader& h = *hp;
    for (uint32_t i = 0; i < shm::kWireCounterCount; ++i) out[i] += at(h.wire[i]);
    out[kRdmaSends] += at(h.req_counts[kReqSends]);
    out[kRdmaRecvs] += at(h.rsp_counts[kRspRecvs]);
    out[kSentBytes] += at(h.req_counts[kReqSentBytes]) + at(h.rsp_counts[kRspReadBytes]);
    out[kRcvdBytes] += at(h.req_counts[kReqReadBytes]) + at(h.rsp_counts[kRspRcvdBytes]);
    out[kShmOps] += at(h.req_counts[kReqOps]);
    out[kShmErrors] += at(h.req_counts[kReqErrors]);
    out[kRetryExceededErr] += at(h.req_counts[kReqRetryExc]);
    out[kRetryRnrExceededErr] += at(h.req_counts[kReqRnrRetryExc]);
  }
  if (!med) return;
  out[kRdmaSends] += med[kMedSends];
  out[kRdmaRecvs] += med[kMedRecvs];
  out[kSentBytes] += med[kMedSentBytes] + med[kMedServedBytes];
  out[kRcvdBytes] += med[kMedReadBytes] + med[kMedRcvdBytes];
  out[kMediatedOps] += med[kMedOps];
  out[kMediatedErrors] += med[kMedErrors];
}

// Adds `n` to a counter only one writer at a time updates (a requester's
// slots, under the QP's send lock): a plain add, whose 8-byte store readers
// see whole (x86-64: one unlocked instruction). Elsewhere, and under
// ThreadSanitizer, a relaxed load and store.
inline void bump(std::atomic<uint64_t>& c, uint64_t n) {
#if defined(__x86_64__) && !defined(__SANITIZE_THREAD__)
  static_assert(sizeof(std::atomic<uint64_t>) == 8);
  asm("addq %1, %0" : "+m"(c) : "er"(n));
#else
  c.store(c.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
#endif
}

// A slot several writers may update at once (a responder's, reached by more
// than one requester: UD, or the general path).
inline void add(std::atomic<uint64_t>& c, uint64_t n) { c.fetch_add(n, std::memory_order_relaxed); }

}  // namespace sv::counters
