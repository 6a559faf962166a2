// cq.cc: completion queues and completion channels (ibv_create_cq(3),
// ibv_resize_cq(3), ibv_create_comp_channel(3)); the daemon's own
// completions; CQs granted to another user by name.
#include "daemon/cq.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/completion.h"
#include "common/trace.h"

namespace sv::daemon {

using namespace sv::shm;

namespace cq_segments {

// A fresh CQ segment for at least `cqe` entries (its capacity a power of
// two), its header written from the daemon's record.
int make_cq_segment(uint32_t handle, uint32_t cqe, uint32_t channel, Fd& fd, Mapping& map, uint32_t& capacity) {
  CqLayout layout{round_up_pow2(cqe + 1)};
  capacity = layout.capacity;
  if (int e = make_memfd("softverbs-cq", layout.size(), fd)) return e == EINVAL ? ENOMEM : e;
  if (int e = map_shared(fd.get(), 0, layout.size(), PROT_READ | PROT_WRITE, false, map)) return e;
  auto* h = map.as<CqSegmentHeader>();
  h->magic = kCqMagic;
  h->handle = handle;
  h->size = layout.size();
  h->ring_offset = layout.ring_offset();
  h->capacity = layout.capacity;
  h->channel = channel;
  auto* rh = reinterpret_cast<RingHeader*>(map.as<char>() + layout.ring_offset());
  Ring<Cqe>::init(rh, reinterpret_cast<RingSlot<Cqe>*>(rh + 1), layout.capacity);
  return 0;
}

}  // namespace cq_segments

int CompletionQueues::create_channel(uint32_t client, Fd fd, Fd wake, uint32_t& handle) {
  if (!fd.valid() || !wake.valid()) return EINVAL;
  Quotas& quotas = host_.quotas();
  if (int e = quotas.admit(Quotas::kChannel, host_.client_uid(client))) return e;
  handle = host_.take_handle();
  quotas.charge(Quotas::kChannel, handle, host_.client_uid(client));
  Channel ch;
  ch.owner = host_.context_of(client);
  ch.fd = std::move(fd);
  ch.wake = std::move(wake);
  channels_.insert(handle, std::move(ch));
  return 0;
}

int CompletionQueues::create(uint32_t client, uint32_t channel, const proto::CreateCqReq& req,
                             proto::CreateCqReply& rep, std::vector<int>& out_fds) {
  if (req.cqe == 0 || req.cqe > kMaxCqe) return EINVAL;
  Quotas& quotas = host_.quotas();
  if (int e = quotas.admit(Quotas::kCq, host_.client_uid(client))) return e;
  Cq cq;
  cq.owner = host_.context_of(client);
  cq.channel = channel;
  uint32_t handle = host_.next_handle();
  if (int e = cq_segments::make_cq_segment(handle, req.cqe, channel, cq.fd, cq.map, cq.capacity)) return e;
  host_.take_handle();
  rep.handle = handle;
  rep.capacity = cq.capacity;
  rep.segment_size = cq.map.size();
  out_fds.push_back(cq.fd.get());
  quotas.charge(Quotas::kCq, handle, host_.client_uid(client));
  host_.hold(cqs_.insert(handle, std::move(cq)).held());
  return 0;
}
// ibv_resize_cq moves a CQ to a new segment. The daemon makes the segment;
// the resizing process closes the old ring to producers, moves the waiting
// completions over in order and commits. Producers that meet the closed
// ring wait for `moved` and fetch the new segment with GetCq.
int CompletionQueues::resize(Cq& cq, const proto::ResizeCqReq& req, proto::CreateCqReply& rep,
                             std::vector<int>& out_fds) {
  if (req.cqe == 0 || req.cqe > kMaxCqe - 1) return EINVAL;
  if (cq.next_fd.valid()) return EBUSY;  // another holder is resizing it
  if (int e = cq_segments::make_cq_segment(req.handle, req.cqe, cq.channel, cq.next_fd, cq.next_map, cq.next_capacity)) {
    cq.next_fd = Fd();
    cq.next_map = Mapping();
    return e;
  }
  rep.handle = req.handle;
  rep.capacity = cq.next_capacity;
  rep.segment_size = cq.next_map.size();
  out_fds.push_back(cq.next_fd.get());
  return 0;
}

int CompletionQueues::resize_done(Cq& cq, const proto::ResizeCqDoneReq& req) {
  if (req.commit > 1) return EINVAL;
  if (!cq.next_fd.valid()) return EINVAL;
  if (req.commit) {
    Mapping old = std::move(cq.map);
    cq.fd = std::move(cq.next_fd);
    cq.map = std::move(cq.next_map);
    cq.capacity = cq.next_capacity;
    // Producers and pollers follow now (GetCq answers with the new segment).
    old.as<CqSegmentHeader>()->moved.store(1, std::memory_order_release);
  }
  cq.next_fd = Fd();
  cq.next_map = Mapping();
  return 0;
}

int CompletionQueues::get(const Cq& cq, proto::ImportCqReply& rep, std::vector<int>& out_fds) {
  rep.capacity = cq.capacity;
  rep.segment_size = cq.map.size();
  out_fds.push_back(cq.fd.get());
  return 0;
}

// IBTA 11.4.2.1 and 10.10.2.3: a CQ overrun is a CQ error. The CQ's holders
// get IBV_EVENT_CQ_ERR and every QP completing into it goes to ERR.
int CompletionQueues::error(Cq& cq, uint32_t handle) {
  if (cq.failed) return 0;
  cq.failed = true;
  host_.context_event(cq.owner, IBV_EVENT_CQ_ERR, handle);
  host_.qps_error_on_cq(cq.owner, handle);
  return 0;
}

// The daemon's own completions (flushes, torn receives, mediated
// operations). While a resize is moving the CQ (its ring closed) they go to
// the segment it moves to, so none is lost.
void CompletionQueues::push(uint32_t handle, const ibv_wc& wc, bool solicited) {
  auto cq = cqs_.find(handle);
  if (cq == cqs_.end()) return;
  int channel_fd = -1;
  if (auto chn = channels_.find(cq->second.channel); chn != channels_.end()) channel_fd = chn->second.wake.get();
  const std::pair<Mapping*, uint32_t> segments[] = {{&cq->second.map, cq->second.capacity},
                                                     {&cq->second.next_map, cq->second.next_capacity}};
  for (auto [m, capacity] : segments) {
    if (!m->get()) continue;
    auto* ch = m->as<CqSegmentHeader>();
    auto* crh = reinterpret_cast<RingHeader*>(m->as<char>() + CqLayout{capacity}.ring_offset());
    Ring<Cqe> ring(crh, reinterpret_cast<RingSlot<Cqe>*>(crh + 1), capacity);
    if (push_completion(ch, ring, wc, solicited, channel_fd) || !ring.closed()) return;
  }
}

bool CompletionQueues::granted(uint32_t client, uint32_t handle) const {
  for (auto [g, end] = grants_.equal_range(client); g != end; ++g)
    if (g->second == handle) return true;
  return false;
}

void CompletionQueues::grant(uint32_t client, uint32_t handle) {
  if (!granted(client, handle)) grants_.emplace(client, handle);
}

int CompletionQueues::import(uint32_t client, const Cq& cq, proto::ImportCqReply& rep, std::vector<int>& out_fds) {
  rep.capacity = cq.capacity;
  if (cq.owner != host_.context_of(client)) {
    // Granted (another user opened it by name): no descriptor at all. Any
    // mapping of the segment, even a read-only one reopened through
    // /proc/self/fd, would let the grantee forge completions or hold the
    // owner's poll lock; polling consumes, so the daemon polls for it.
    // Nor its channel (an eventfd of the owner's context).
    rep.channel = 0;
    rep.segment_size = 0;
    return 0;
  }
  rep.channel = cq.channel;
  rep.segment_size = cq.map.size();
  out_fds.push_back(cq.fd.get());
  return 0;
}

int CompletionQueues::poll_granted(Cq& cq, const proto::PollCqReq& req, proto::PollCqReply& rep) {
  rep.count = 0;
  if (req.max == 0 || req.max > proto::kPollCqMax) return EINVAL;
  // The current segment as the daemon made it (a committed resize moved
  // cq.map); its geometry is the daemon's, never the header's.
  auto* h = cq.map.as<CqSegmentHeader>();
  auto* rh = reinterpret_cast<RingHeader*>(cq.map.as<char>() + CqLayout{cq.capacity}.ring_offset());
  Ring<Cqe> ring(rh, reinterpret_cast<RingSlot<Cqe>*>(rh + 1), cq.capacity);
  // Try-lock: a poller (or a resize) of the owner holds it, or a hostile
  // owner keeps it: "nothing now", the grantee polls again.
  uint32_t free_ = 0;
  static const uint32_t self = uint32_t(::getpid());
  if (!h->poll_lock.owner.compare_exchange_strong(free_, self, std::memory_order_acquire)) return 0;
  // The owner's last poll may hold back one slot (verbs/cq.cc release_taken):
  // give it back first, as any poller does.
  // release_if_taken gives it back only if the slot still holds what was
  // taken (the owner's rings skip slots of dead producers, shm_ring.h).
  if (uint64_t t = h->taken.load(std::memory_order_relaxed)) {
    ring.release_if_taken(t - 1);
    h->taken.store(0, std::memory_order_relaxed);
  }
  Cqe e;
  while (rep.count < req.max && ring.pop_exclusive(e)) rep.wc[rep.count++] = e.wc;
  h->poll_lock.unlock();
  return 0;
}

}  // namespace sv::daemon
