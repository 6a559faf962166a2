// post_ring.h: a connection's request ring as the daemon reads it
// (Op::PostRing; docs/PROTOCOL.md, "The request ring"). A client writes
// its pipelined requests (MediatePost) into shared memory instead of its
// socket: reading one there costs the daemon a copy of a slot, where
// recvmsg costs more than the 64 KiB copy the request asked for
// (docs/PERFORMANCE.md, "Between users").
//
// Trust: the daemon made the memfd and sealed its size (the client cannot
// shrink it under the daemon's mapping), and the client can write every
// byte of it at any time. So the daemon keeps its own head, reads the
// client's tail once per look and refuses one that is behind the head or
// more than the capacity ahead (kCorrupt: the connection is dropped), and
// copies each slot out before anything looks at it; the request is then
// checked as one read from the socket is (commands.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "common/protocol.h"
#include "common/sys.h"

namespace sv::daemon {

class PostRing {
 public:
  static constexpr size_t kSlotSize = sizeof(proto::MediateReq);
  // A new ring: its memfd (sealed at size()), mapped here, and its wake-up
  // socket pair (sys.h, make_wake_pair): the client sends a byte on its end
  // (theirs) to wake the daemon, which reads its own (wake) without ever
  // sleeping on it (wake_drain, MSG_DONTWAIT), whatever the client does to
  // the descriptors it holds.
  static int create(std::unique_ptr<PostRing>& out);
  static constexpr uint32_t kFds = 3;  // the descriptors a ring holds, charged to its user

  int memfd() const { return memfd_.get(); }
  int wake() const { return wake_.get(); }
  int theirs() const { return theirs_.get(); }
  uint32_t capacity() const { return proto::kPostRingSlots; }
  static size_t size() { return proto::kPostRingHeaderSize + size_t(proto::kPostRingSlots) * kSlotSize; }

  enum class Take { kNone, kOne, kCorrupt };
  // Copies the next request into `out` (kSlotSize bytes) and publishes the
  // new head.
  Take take(uint8_t* out);
  // Whether the client's tail says something waits (or is corrupt: take()
  // tells). Cheap: one load.
  bool pending() const;
  // Before the daemon sleeps: the client must signal its wake-up after its
  // next request. Returns pending() as seen after saying so.
  bool may_sleep();
  void awake();

 private:
  proto::PostRingHeader* hdr() const { return map_.as<proto::PostRingHeader>(); }
  Mapping map_;
  Fd memfd_, wake_, theirs_;
  uint64_t head_ = 0;       // the daemon's own
  uint64_t tail_seen_ = 0;  // the client's tail, as last read and found sound
};

}  // namespace sv::daemon
