// shm_layout.h: the plain-data formats softverbs keeps in shared memory.
// The formats are documented in docs/SHARED_MEMORY.md.
//
// Three kinds of segment, each a memfd created by the daemon:
//  - the device segment: the MR table and the QP table. The daemon alone
//    writes it; clients map it read-only, so a client cannot forge a key or
//    a QP's state.
//  - a QP segment: the QP's send queue (work requests waiting for a
//    receiver) and receive queue. Mapped read-write by the QP's holders and
//    by the processes of QPs connected to it.
//  - a CQ segment: the completion ring and its notification state. Mapped
//    read-write by its holders and by the processes whose operations
//    complete into it.
// Offsets, never pointers. Every field a reader takes from a read-write
// segment is validated before use.
#pragma once

#include <infiniband/verbs.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>

#include "common/shm_ring.h"

namespace sv::shm {

constexpr uint32_t kDeviceMagic = 0x53564456;  // "SVDV"
constexpr uint32_t kQpMagic = 0x53565150;      // "SVQP"
constexpr uint32_t kCqMagic = 0x53564351;      // "SVCQ"
// 2: CQ header lines split (producers / pollers), torn record on the send lock line
// 3: ring slots claimed with the claimer's pid (shm_ring.h), sq_running
// 4: the torn record is written before the claim (torn_pos, torn_pid, torn_taken);
//    MrEntry.generation (a peer's cached view of an MR is checked against it)
// 5: a ring's claim is the move of its index, which names the claimer
//    (RingHeader.tail_by, head_by; shm_ring.h)
// 6: QpSegmentHeader.progress_pid (who carries out the send queue)
// 7: QpSegmentHeader.wire (the QP's RoCEv2 counts, `rdma statistic show`)
// 8: QpSegmentHeader.req_counts, rsp_counts (the shared-memory path's counts)
// 9: MrEntry.owner_identity; backing kOdpBacking (on-demand paging)
constexpr uint32_t kLayoutVersion = 9;

// Device capabilities, reported by ibv_query_device and enforced.
constexpr uint32_t kMrTableSize = 1u << 20;   // MR slots (index = key >> 8)
constexpr uint32_t kQpTableSize = 1u << 16;   // QP slots (index = qpn & 0xffff)
constexpr uint32_t kMaxQpWr = 16384;
constexpr uint32_t kMaxCqe = 1u << 20;
constexpr uint32_t kMaxSge = 16;
constexpr uint32_t kMaxInline = 256;
constexpr uint32_t kMaxRdAtomic = 128;  // as rxe: perftest sets max_rd_atomic to the peer's out_reads
constexpr uint64_t kMaxMrSize = 1ull << 40;

// ---- Device segment ----------------------------------------------------

struct alignas(64) MrEntry {
  std::atomic<uint32_t> key;  // lkey == rkey; 0 = free. Written last on create, first on destroy.
  uint32_t access;            // IBV_ACCESS_* of the MR
  uint32_t pd;                // daemon PD handle
  uint32_t backing;           // daemon backing-file id
  uint64_t iova;              // first byte's address as keys see it
  uint64_t length;
  uint64_t file_offset;       // offset of iova in the backing file
  uint32_t owner_pid;
  uint32_t kind;       // kKindMr, kKindMw1, kKindMw2
  uint32_t bound_qpn;  // type 2 windows: the only QP through which the window may be used
  // Changes with every write of the entry (registration, ibv_rereg_mr, bind,
  // unbind): a view of the memory a process made for (key, generation)
  // still holds what the entry says (ibv_rereg_mr keeps the key).
  uint32_t generation;
  // An on-demand-paging MR: the identity of its registrant's struct pid
  // (pidfd_identity, common/odp_memory.h), which no later process at
  // owner_pid has; 0 where the daemon's kernel has none (Linux < 6.9).
  uint64_t owner_identity;
};
static_assert(sizeof(MrEntry) == 64);
enum : uint32_t { kKindMr = 0, kKindMw1 = 1, kKindMw2 = 2 };
// MrEntry.backing of an on-demand-paging MR (IBV_ACCESS_ON_DEMAND): none.
// Its range is the address space of the process owner_pid as it is at each
// access (file_offset: the address of iova there); it is reached through
// the registrant's pinned address space (common/odp_memory.h), never
// mapped (docs/MEMORY.md, "On-demand paging"). No backing id is ever this value, so no view of a file and no
// "own memory" test (backing == the process's own) matches it.
constexpr uint32_t kOdpBacking = ~0u;
// The length of an implicit ODP MR (ibv_reg_mr(pd, NULL, SIZE_MAX, ...)):
// the whole address space, iova == address.
constexpr uint64_t kImplicitOdpLength = ~uint64_t(0);

struct alignas(64) QpEntry {
  std::atomic<uint32_t> qpn;    // 0 = free
  std::atomic<uint32_t> state;  // enum ibv_qp_state
  uint32_t qp_type;             // enum ibv_qp_type
  uint32_t pd;
  std::atomic<uint32_t> dest_qpn;
  std::atomic<uint32_t> access;  // qp_access_flags (remote access allowed as responder)
  uint32_t send_cq;
  uint32_t recv_cq;
  uint8_t min_rnr_timer;
  uint8_t timeout;
  uint8_t retry_cnt;
  uint8_t rnr_retry;
  uint32_t owner_pid;
  std::atomic<uint32_t> qkey;  // UD: the Q_Key incoming messages must carry
  uint32_t reserved[5];
};
static_assert(sizeof(QpEntry) == 64);

// Multicast groups (ibv_attach_mcast): written by the daemon under a
// sequence lock, read by UD senders without a control round trip.
constexpr uint32_t kMcgTableSize = 256;  // max_mcast_grp
constexpr uint32_t kMcgMaxQps = 32;      // max_mcast_qp_attach
struct alignas(64) McgEntry {
  std::atomic<uint32_t> seq;  // odd while the daemon rewrites the entry
  uint32_t count;             // attached QPs; 0 = free slot
  uint16_t lid;               // the multicast LID given at the first attach
  uint16_t reserved;
  uint32_t reserved2;
  uint8_t gid[16];
  uint32_t qpns[kMcgMaxQps];
};

struct DeviceHeader {
  uint32_t magic;
  uint32_t version;
  uint64_t size;
  uint64_t mr_table_offset;
  uint64_t qp_table_offset;
  uint32_t mr_capacity;
  uint32_t qp_capacity;
  uint64_t boot_id;  // random per daemon start
};

struct DeviceLayout {
  static constexpr uint64_t mr_offset() { return 4096; }
  static constexpr uint64_t qp_offset() { return mr_offset() + uint64_t(kMrTableSize) * sizeof(MrEntry); }
  static constexpr uint64_t mcg_offset() { return qp_offset() + uint64_t(kQpTableSize) * sizeof(QpEntry); }
  static constexpr uint64_t size() { return mcg_offset() + uint64_t(kMcgTableSize) * sizeof(McgEntry); }
};

// ---- QP segment --------------------------------------------------------

struct Sge {
  uint64_t addr;
  uint32_t length;
  uint32_t lkey;
};

// A send work request waiting in the send queue (RNR or retry stall).
struct SendWqe {
  uint64_t wr_id;
  uint32_t opcode;      // enum ibv_wr_opcode
  uint32_t send_flags;  // IBV_SEND_*
  uint32_t imm_data;    // network order, as in ibv_send_wr
  uint32_t num_sge;
  uint64_t remote_addr;
  uint32_t rkey;
  uint32_t inline_len;  // bytes of inline_data valid when IBV_SEND_INLINE
  uint64_t compare_add;
  uint64_t swap;
  uint32_t mw_handle;   // IBV_WR_BIND_MW: the window, its access, the MR key;
  uint32_t mw_access;   // remote_addr/compare_add carry the address and length,
  uint32_t mr_key;      // rkey the new window key
  uint32_t invalidate_rkey;  // IBV_WR_LOCAL_INV, IBV_WR_SEND_WITH_INV
  uint32_t ud_qpn;           // UD: destination QP, Q_Key, and whether the AH
  uint32_t ud_qkey;          //     carries a GRH (with its destination GID)
  uint32_t ud_grh;
  uint32_t ud_dlid;          // UD without a GRH: the destination LID (multicast range: a group)
  uint32_t xrc_srqn;         // XRC_SEND: the remote XRC SRQ that takes the message
  uint32_t reserved3;
  uint8_t ud_dgid[16];
  Sge sge[kMaxSge];
  uint8_t inline_data[kMaxInline];
};

struct RecvWqe {
  uint64_t wr_id;
  uint32_t num_sge;
  uint32_t reserved;
  Sge sge[kMaxSge];
};

// The port counters `rdma statistic show` lists, by Linux rxe's names and
// in its order (drivers/infiniband/sw/rxe/rxe_hw_counters.h): sent_pkts,
// rcvd_pkts, duplicate_request, out_of_seq_request, rcvd_rnr_err,
// send_rnr_err, rcvd_seq_err, ack_deferred, retry_exceeded_err,
// retry_rnr_exceeded_err, completer_retry_err, send_err, link_downed,
// rdma_sends, rdma_recvs. Counted on the wire (RoCEv2) only; the other
// paths' counts are common/counters.h's.
enum WireCounter : uint32_t {
  kWireSentPkts,
  kWireRcvdPkts,
  kWireDuplicateRequest,
  kWireOutOfSeqRequest,
  kWireRcvdRnrErr,
  kWireSendRnrErr,
  kWireRcvdSeqErr,
  kWireAckDeferred,
  kWireRetryExceededErr,
  kWireRetryRnrExceededErr,
  kWireCompleterRetryErr,
  kWireSendErr,
  kWireLinkDowned,
  kWireRdmaSends,
  kWireRdmaRecvs,
  kWireCounterCount
};

constexpr uint32_t kReqCounterSlots = 8;
constexpr uint32_t kRspCounterSlots = 8;

struct QpSegmentHeader {
  uint32_t magic;
  uint32_t qpn;
  uint64_t size;
  uint64_t sq_offset;  // RingHeader, then slots
  uint64_t rq_offset;
  uint32_t sq_capacity;
  uint32_t rq_capacity;
  alignas(64) ShmLock send_lock;  // serialises posters (threads or processes)
  // A receive this QP's requester takes from a peer's queue and has not
  // completed yet (written under send_lock, see pop_peer_recv). Non-zero
  // only while a message is being delivered, or if its poster was killed in
  // between: then whoever recovers (the next holder of send_lock, or the
  // daemon when the QP died with its context) completes that receive, so
  // the responder does not lose it. Written before the slot is claimed: a
  // kill right after the claim leaves the record, and the element is still
  // in the slot (torn_taken 0: Ring::reclaim_dead_take at torn_pos for
  // torn_pid) or was copied out (torn_taken 1: torn_wr_id). On the lock's
  // line: every post reads it right after taking the lock.
  std::atomic<uint32_t> torn_qpn;  // the responder QP, 0 = none
  // Non-zero: the QP was created in a thread domain (ibv_alloc_td): its
  // creator posts without send_lock, so no other process or context may
  // import it. Set by the creator before ibv_create_qp returns.
  std::atomic<uint32_t> exclusive;
  uint64_t torn_wr_id;
  // Position + 1 of the queued request (send queue head) a holder of
  // send_lock is carrying out, 0 = none (written under send_lock). Found
  // non-zero by the next holder, the previous one died in the middle: that
  // request may or may not have reached the responder, so it is completed
  // in error (IBV_WC_GENERAL_ERR) rather than carried out a second time.
  std::atomic<uint64_t> sq_running;
  uint64_t torn_pos;                   // the position claimed (or about to be) in the peer's RQ or SRQ
  uint32_t torn_pid;                   // who claims it
  std::atomic<uint32_t> torn_taken;    // 1: copied out, torn_wr_id holds its wr_id
  // The process that last took send_lock to post or to carry out queued
  // requests (written right after taking it): the one whose progress thread
  // has what waits in the send queue. When a process leaves the QP's
  // context, the others take the QP over only if this names it, or a
  // process that is gone (progress_adopt in the library).
  std::atomic<uint32_t> progress_pid;
  alignas(64) ShmLock recv_lock;
  alignas(64) std::atomic<uint32_t> flushed;  // RQ flushed after ERR
  // Created as an extended QP (ibv_create_qp_ex with send_ops_flags): those
  // IBV_QP_EX_WITH_* ops | kSendOpsExtended, 0 for a plain QP. Set by the
  // creator before ibv_create_qp_ex returns; an importer's handle gets the
  // same ibv_qp_ex form (ibv_qp_to_qp_ex).
  std::atomic<uint64_t> send_ops;
  // Pipelined requests to another user's QP (Op::MediatePost). Written by
  // the daemon alone, from its own counts (never read back): how many it
  // has finished (med_finished) and, of those, how many it carried out or
  // failed (med_done); the others came back unexecuted (RNR, responder not
  // ready), at the end of a run. A request is counted done before its send
  // completion is pushed (its slot is free once that can be polled), and
  // finished after (a run seen finished has all its completions in the CQ).
  alignas(64) std::atomic<uint64_t> med_finished;
  std::atomic<uint64_t> med_done;
  // The requester's side (under send_lock): the current run (epoch), the
  // process that sent it, the daemon's counts when it began, and how many
  // of it were sent and have left the send queue since.
  alignas(64) uint32_t med_epoch;
  std::atomic<uint32_t> med_pid;  // 0: no run in flight
  uint32_t med_client;            // the sender's connection (Op::MediateGone asks the daemon about it)
  uint64_t med_base_finished;
  uint64_t med_base_done;
  uint64_t med_sent;
  uint64_t med_popped;
  // The QP's counts on the wire (RoCEv2; WireCounter), as the process that
  // carries it there last copied its engine's (after each pass of it). The
  // daemon sums them for `rdma statistic show` (Op::WireCounters), for the
  // QP's own user: whatever a holder writes here, it shows only to itself.
  alignas(64) std::atomic<uint64_t> wire[kWireCounterCount];
  // The QP's counts on the shared-memory path (common/counters.h): as
  // requester (ShmReq), written by its holders under send_lock; as
  // responder (ShmRsp), written by the requesters of its own user that
  // reach it, on their own line. Shown, as `wire`, only to the QP's user.
  alignas(64) std::atomic<uint64_t> req_counts[kReqCounterSlots];
  alignas(64) std::atomic<uint64_t> rsp_counts[kRspCounterSlots];
};
static_assert(sizeof(QpSegmentHeader) <= 4096);
constexpr uint64_t kSendOpsExtended = 1ull << 63;

struct QpLayout {
  uint32_t sq_capacity;
  uint32_t rq_capacity;
  uint64_t sq_offset() const { return 4096; }
  uint64_t rq_offset() const {
    return sq_offset() + sizeof(RingHeader) + uint64_t(sq_capacity) * sizeof(RingSlot<SendWqe>);
  }
  uint64_t size() const {
    uint64_t end = rq_offset() + sizeof(RingHeader) + uint64_t(rq_capacity) * sizeof(RingSlot<RecvWqe>);
    return (end + 4095) & ~uint64_t(4095);
  }
};

// ---- SRQ segment -------------------------------------------------------

constexpr uint32_t kSrqMagic = 0x53565352;  // "SVSR"

struct SrqSegmentHeader {
  uint32_t magic;
  uint32_t handle;
  uint64_t size;
  uint64_t ring_offset;
  uint32_t capacity;
  uint32_t max_sge;
  alignas(64) std::atomic<uint32_t> limit;  // armed limit (IBV_SRQ_LIMIT), 0 = not armed
  // Set by the daemon when a resize committed: the SRQ lives in another
  // segment now (GetSrq), its posted receives moved there in order.
  alignas(64) std::atomic<uint32_t> moved;
  // A resize about to move the receives (set by the resizer): takers keep
  // off the ring (take_srq_receive), so that none takes a receive posted
  // after one the resizer moved, which would complete out of order.
  std::atomic<uint32_t> moving;
  // Takers between their check of `moving` and the end of their take; the
  // resizer waits for none (a bounded wait: a taker killed in between
  // leaves it raised, as anyone can write it).
  alignas(64) std::atomic<uint32_t> takers;
};

// One take from an SRQ's ring, `pop()`, unless a resize is moving its
// receives (then: none, as from an empty ring). The increment of `takers`
// and the load of `moving` pair with the resizer's store of `moving` and
// load of `takers` (both sequentially consistent): either the taker sees
// the resize, or the resizer sees the taker and waits for it.
template <class Pop>
inline bool take_srq_receive(SrqSegmentHeader* h, Pop pop) {
  h->takers.fetch_add(1, std::memory_order_seq_cst);
  const bool ok = h->moving.load(std::memory_order_seq_cst) == 0 && pop();
  h->takers.fetch_sub(1, std::memory_order_release);
  return ok;
}

struct SrqLayout {
  uint32_t capacity;
  uint64_t ring_offset() const { return 4096; }
  uint64_t size() const {
    uint64_t end = ring_offset() + sizeof(RingHeader) + uint64_t(capacity) * sizeof(RingSlot<RecvWqe>);
    return (end + 4095) & ~uint64_t(4095);
  }
};

// ---- CQ segment --------------------------------------------------------

enum : uint32_t { kArmNone = 0, kArmSolicited = 1, kArmAny = 2 };

struct Cqe {
  ibv_wc wc;
  uint32_t solicited;
};

struct CqSegmentHeader {
  uint32_t magic;
  uint32_t handle;
  uint64_t size;
  uint64_t ring_offset;
  uint32_t capacity;
  uint32_t channel;                   // daemon channel handle, 0 = none
  // Written by producers (every push to a CQ with a completion channel
  // reads-modifies-writes `armed`; see push_completion).
  alignas(64) std::atomic<uint32_t> armed;     // kArm*
  std::atomic<uint32_t> notified;     // set when an event was raised, cleared by get_cq_event
  std::atomic<uint32_t> overrun;      // a completion was lost because the ring was full
  std::atomic<uint32_t> ignore_overrun;  // IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN: no CQ error on overrun
  // Pollers' line: an idle poller reads `moved` on every empty poll, so it
  // must not share a line with what producers write on every push.
  alignas(64) ShmLock poll_lock;      // serialises pollers
  std::atomic<uint32_t> moved;        // set by the daemon once a resize moved the CQ to a new segment
  // Position + 1 of the slot the last poll took and did not give back to
  // the producers yet (0: none); the next poll gives it back, an idle one
  // first (verbs/cq.cc). Written under poll_lock.
  std::atomic<uint64_t> taken;
};

struct CqLayout {
  uint32_t capacity;
  uint64_t ring_offset() const { return 4096; }
  uint64_t size() const {
    uint64_t end = ring_offset() + sizeof(RingHeader) + uint64_t(capacity) * sizeof(RingSlot<Cqe>);
    return (end + 4095) & ~uint64_t(4095);
  }
};

inline uint32_t round_up_pow2(uint32_t v) {
  uint32_t p = 1;
  while (p < v) p <<= 1;
  return p;
}

// Slots of a receive queue (or SRQ) ring for `wr` requested receives: a
// power of two with room beyond the request (an eighth, at least two). An
// application typically keeps as many receives posted as it asked for; in a
// ring with no room beyond that, each repost fills the very slot the sender
// has just taken (and written), so every receive repost waits for that line
// to come back from the sender's CPU, on the critical path of a SEND/RECV
// ping-pong. With room, the slot a repost fills was taken long before.
// At least two slots (a one-slot ring cannot tell "free" from "full").
inline uint32_t recv_ring_capacity(uint32_t wr) {
  if (wr == 0) return 2;
  return round_up_pow2(wr + std::max<uint32_t>(2, wr / 8));
}

}  // namespace sv::shm
