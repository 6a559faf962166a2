// The daemon's side of a connection's request ring (post_ring.h).
#include "daemon/post_ring.h"

#include <sys/mman.h>

#include <atomic>
#include <cstring>

namespace sv::daemon {

int PostRing::create(std::unique_ptr<PostRing>& out) {
  auto r = std::make_unique<PostRing>();
  if (int e = make_memfd("softverbs-post-ring", size(), r->memfd_)) return e;
  if (int e = map_shared(r->memfd_.get(), 0, size(), PROT_READ | PROT_WRITE, true, r->map_)) return e;
  if (int e = make_wake_pair(r->wake_, r->theirs_)) return e;
  proto::PostRingHeader* h = r->hdr();
  h->magic = proto::kPostRingMagic;
  h->capacity = proto::kPostRingSlots;
  out = std::move(r);
  return 0;
}

bool PostRing::pending() const { return hdr()->tail.load(std::memory_order_acquire) != head_; }

PostRing::Take PostRing::take(uint8_t* out) {
  if (head_ == tail_seen_) {
    const uint64_t tail = hdr()->tail.load(std::memory_order_acquire);
    if (tail == head_) return Take::kNone;
    // Unsigned: a tail behind the head wraps to a huge distance.
    if (tail - head_ > capacity()) return Take::kCorrupt;
    tail_seen_ = tail;
  }
  const uint8_t* slot = map_.as<uint8_t>() + proto::kPostRingHeaderSize + (head_ % capacity()) * kSlotSize;
  std::memcpy(out, slot, kSlotSize);
  ++head_;
  hdr()->head.store(head_, std::memory_order_release);
  return Take::kOne;
}

bool PostRing::may_sleep() {
  hdr()->wake.store(1, std::memory_order_seq_cst);
  return hdr()->tail.load(std::memory_order_seq_cst) != head_;
}

void PostRing::awake() { hdr()->wake.store(0, std::memory_order_relaxed); }

}  // namespace sv::daemon
