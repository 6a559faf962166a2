// completion.h: appending a completion to a CQ ring in shared memory, and
// raising the CQ's event if it is armed (IBTA 11.4.2.2: one event per
// arming). Used by requesters (library) and by the daemon when it flushes
// the queues of a QP whose peer died.
//
// Contract: thread- and process-safe (the ring is multi-producer).
#pragma once

#include <infiniband/verbs.h>

#include <atomic>
#include <cstring>

#include "common/shm_layout.h"
#include "common/sys.h"

namespace sv::shm {

// A record of a completion owed, zeroed once the completion is written and
// before it can be polled, so that a producer killed at any point leaves
// either the record or the completion, never both: a torn receive
// (torn_qpn) or a request being carried out (sq_running), see shm_layout.h.
struct OwedRecord {
  OwedRecord() = default;
  OwedRecord(std::atomic<uint32_t>* r) : u32(r) {}  // NOLINT: implicit on purpose
  OwedRecord(std::atomic<uint64_t>* r) : u64(r) {}  // NOLINT
  std::atomic<uint32_t>* u32 = nullptr;
  std::atomic<uint64_t>* u64 = nullptr;
  void clear() const {
    if (u32) u32->store(0, std::memory_order_relaxed);
    if (u64) u64->store(0, std::memory_order_relaxed);
  }
};

// Returns false on overrun: the ring was full and the completion is lost
// (IBTA 11.4.2.1 CQ overrun; recorded in hdr->overrun).
// `clear` is cleared as the completion is published (OwedRecord); not
// touched when the push fails.
inline bool push_completion(CqSegmentHeader* hdr, Ring<Cqe>& ring, const ibv_wc& wc, bool solicited,
                            int channel_fd, OwedRecord clear = {}) {
  // Written straight into the slot (every byte a poller reads: the work
  // completion and `solicited`). (`clear` by reference: a copy of the
  // two-pointer record into the closure would be two 8-byte stores read
  // back as one 16-byte load, a stalled store forwarding on every
  // completion, as perf shows.)
  auto write = [&wc, solicited](Cqe& slot) {
    std::memcpy(&slot.wc, &wc, sizeof(wc));
    slot.solicited = solicited;
  };
  if (!ring.push_write_then(write, [&clear] { clear.clear(); })) {
    // A closed ring is being moved (resize), not full: the caller follows it.
    if (!ring.closed()) hdr->overrun.store(1, std::memory_order_relaxed);
    return false;
  }
  // A CQ without a completion channel raises no event (ibv_create_cq(3),
  // ibv_req_notify_cq(3): events are read from the channel), so there is no
  // arming to read and no barrier to pay for it: a polled CQ's push has one
  // locked instruction, the ring's claim (which keeps it within 5 % of
  // rings that are not robust to death). `channel` is set when the segment
  // is made and never changes.
  if (hdr->channel == 0) return true;
  // Dekker-style handshake with req_notify_cq, which arms and then polls
  // the ring: each side writes, then reads what the other wrote. With plain
  // stores and loads both reads may see old values (x86 lets a load pass an
  // earlier store): the poller misses the entry, we miss the arming, and the
  // event is lost. Both sides therefore access `armed` with a read-modify-
  // write (acq_rel): the two RMWs are ordered, and whichever comes second
  // sees what the first side wrote before it (a full barrier on x86; TSan
  // understands it, which it does not a fence).
  uint32_t armed = hdr->armed.fetch_or(0, std::memory_order_acq_rel);
  if (armed == kArmAny || (armed == kArmSolicited && solicited)) {
    if (hdr->armed.exchange(kArmNone, std::memory_order_acq_rel) != kArmNone) {
      hdr->notified.store(1, std::memory_order_release);
      if (channel_fd >= 0) wake_signal(channel_fd);  // never sleeps (sys.h)
    }
  }
  return true;
}

}  // namespace sv::shm
