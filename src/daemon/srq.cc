// srq.cc: shared receive queues (ibv_create_srq(3)) and their limit event.
#include "daemon/srq.h"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/trace.h"

namespace sv::daemon {

using namespace sv::shm;

namespace srq_segments {

// A fresh SRQ segment of `capacity` slots (a power of two), its header
// written from the daemon's record.
int make_srq_segment(uint32_t handle, uint32_t capacity, uint32_t max_sge, Fd& fd, Mapping& map) {
  SrqLayout layout{capacity};
  if (int e = make_memfd("softverbs-srq", layout.size(), fd)) return e;
  if (int e = map_shared(fd.get(), 0, layout.size(), PROT_READ | PROT_WRITE, false, map)) return e;
  auto* h = map.as<SrqSegmentHeader>();
  h->magic = kSrqMagic;
  h->handle = handle;
  h->size = layout.size();
  h->ring_offset = layout.ring_offset();
  h->capacity = layout.capacity;
  h->max_sge = max_sge;
  auto* rh = reinterpret_cast<RingHeader*>(map.as<char>() + layout.ring_offset());
  Ring<RecvWqe>::init(rh, reinterpret_cast<RingSlot<RecvWqe>*>(rh + 1), layout.capacity);
  return 0;
}

}  // namespace srq_segments

int SharedReceiveQueues::create(uint32_t client, const XrcdHandle* xh, const proto::CreateSrqReq& req,
                                proto::CreateSrqReply& rep, std::vector<int>& out_fds) {
  if (int e = host_.quotas().admit(Quotas::kSrq, host_.client_uid(client))) return e;
  if (req.max_wr == 0 || req.max_wr > kMaxQpWr || req.max_sge == 0 || req.max_sge > kMaxSge) return EINVAL;
  if (req.reserved) return EINVAL;
  uint32_t xrcd = 0;
  if (req.srq_type == IBV_SRQT_XRC) {
    // An XRC SRQ belongs to an XRC domain and has its own CQ.
    xrcd = xh ? xh->xrcd : 0;
    if (!xrcd || !req.cq) return EINVAL;
  } else if (req.srq_type != IBV_SRQT_BASIC) {
    return req.srq_type == IBV_SRQT_TM ? EOPNOTSUPP : EINVAL;
  } else if (req.xrcd || req.cq) {
    return EINVAL;
  }
  SrqLayout layout{recv_ring_capacity(req.max_wr)};  // room beyond max_wr, as QPs
  // ibv_create_srq(3): the limit must be below the queue's size.
  if (req.srq_limit >= layout.capacity) return EINVAL;
  Srq srq;
  srq.owner = host_.context_of(client);
  srq.pd = req.pd;
  srq.type = req.srq_type;
  srq.capacity = layout.capacity;
  srq.max_sge = req.max_sge;
  if (xrcd) {
    srq.xrcd = xrcd;
    srq.cq = req.cq;
  }
  uint32_t handle = host_.next_handle();
  if (int e = srq_segments::make_srq_segment(handle, layout.capacity, req.max_sge, srq.fd, srq.map)) return e;
  host_.take_handle();
  srq.map.as<SrqSegmentHeader>()->limit.store(req.srq_limit, std::memory_order_relaxed);
  rep.handle = handle;
  rep.capacity = layout.capacity;
  rep.segment_size = layout.size();
  out_fds.push_back(srq.fd.get());
  host_.quotas().charge(Quotas::kSrq, handle, host_.client_uid(client));
  host_.hold(srqs_.insert(handle, std::move(srq)).held());  // its PD, and an XRC SRQ's CQ and domain
  return 0;
}

// ibv_modify_srq(3) with IBV_SRQ_MAX_WR moves an SRQ to a new segment, as
// ibv_resize_cq moves a CQ (cq.cc): the daemon makes the segment, sized and
// headed from its own record (capacity from max_wr, the SRQ's max_sge: never
// the old header's, which every holder can write); the resizing process
// closes the old ring to posters, moves the posted receives over in order
// and commits. Posters that meet the closed ring wait for `moved` and fetch
// the new segment (GetSrq), as do the senders taking from it; the daemon's
// own takers (mediation) read the SRQ's current segment each time.
int SharedReceiveQueues::resize(Srq& srq, uint32_t handle, const proto::ResizeSrqReq& req, proto::CreateSrqReply& rep,
                                std::vector<int>& out_fds) {
  if (req.max_wr == 0 || req.max_wr > kMaxQpWr) return EINVAL;
  if (srq.next_fd.valid()) return EBUSY;  // another holder is resizing it
  uint32_t capacity = recv_ring_capacity(req.max_wr);
  if (int e = srq_segments::make_srq_segment(handle, capacity, srq.max_sge, srq.next_fd, srq.next_map)) {
    srq.next_fd = Fd();
    srq.next_map = Mapping();
    return e;
  }
  srq.next_capacity = capacity;
  rep.handle = handle;
  rep.capacity = capacity;
  rep.segment_size = srq.next_map.size();
  out_fds.push_back(srq.next_fd.get());
  return 0;
}

int SharedReceiveQueues::resize_done(Srq& srq, const proto::ResizeSrqDoneReq& req) {
  if (req.commit > 1 || !srq.next_fd.valid()) return EINVAL;
  if (req.commit) {
    Mapping old = std::move(srq.map);
    srq.fd = std::move(srq.next_fd);
    srq.map = std::move(srq.next_map);
    srq.capacity = srq.next_capacity;
    old.as<SrqSegmentHeader>()->moved.store(1, std::memory_order_release);  // its holders follow now
  }
  srq.next_fd = Fd();
  srq.next_map = Mapping();
  srq.next_capacity = 0;
  return 0;
}

// IBTA 11.5.2.4: the SRQ limit event goes to the SRQ's holders. A sender
// that saw the queue fall below the armed limit (and disarmed it: the event
// is one-shot per arm, IBTA 10.2.9.4) asks for it. Only a sender that can
// see the SRQ may: one mapping it (a process of its owner's user) whose QP
// is connected to a QP of that SRQ both ways - pointing a QP at another's
// QP is no connection. Between users the daemon itself takes the receives
// (mediate.cc) and raises the event there. Repeats of a pending event are
// coalesced by the server.
int SharedReceiveQueues::limit(const Srq& srq, uint32_t handle) {
  host_.context_event(srq.owner, IBV_EVENT_SRQ_LIMIT_REACHED, handle);
  return 0;
}

}  // namespace sv::daemon
