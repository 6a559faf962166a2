// Shared receive queues (ibv_create_srq(3)): a ring of receive WQEs in a
// daemon-created segment that several QPs' senders take from, with the
// limit event of IBTA 11.5.2.4. Also the receive side of a peer as a
// requester sees it.
#include <sys/mman.h>

#include <cerrno>
#include <csignal>
#include <cstring>
#include <cstdlib>

#include "verbs/fault_events.h"
#include "verbs/provider.h"

namespace sv::verbs {
namespace {

int attach_srq_segment(Mapping& seg, shm::SrqSegmentHeader*& hdr, shm::Ring<shm::RecvWqe>& ring, int fd,
                       uint64_t size) {
  if (int e = map_shared(fd, 0, size, PROT_READ | PROT_WRITE, false, seg)) return e;
  auto* h = seg.as<shm::SrqSegmentHeader>();
  uint32_t cap = h->capacity;
  if (h->magic != shm::kSrqMagic || h->size != size || cap == 0 || (cap & (cap - 1)) ||
      shm::SrqLayout{cap}.size() > size)
    return EPROTO;
  auto* rh = reinterpret_cast<shm::RingHeader*>(seg.as<char>() + shm::SrqLayout{cap}.ring_offset());
  if (rh->capacity != cap) return EPROTO;
  hdr = h;
  ring = shm::Ring<shm::RecvWqe>(rh, reinterpret_cast<shm::RingSlot<shm::RecvWqe>*>(rh + 1));
  return 0;
}

int attach_srq(SrqSegment& s, int fd, uint64_t size) { return attach_srq_segment(s.seg, s.hdr, s.ring, fd, size); }

// A sender's view of a peer's SRQ that a resize moved: the new segment, the
// old one kept mapped (Peer::srq_old). Only a receive taken from the old
// ring before the move can still name it (its torn record).
bool follow_peer_srq(ProcessQp& q, Peer& p) {
  proto::HandleReq req{};
  req.handle = p.srq_handle;
  proto::ImportSrqReply rep{};
  std::vector<Fd> fds;
  if (q.ctx->st->conn.call<proto::Op::GetSrq>(req, rep, {}, &fds)) return false;
  Mapping seg;
  shm::SrqSegmentHeader* hdr = nullptr;
  shm::Ring<shm::RecvWqe> ring;
  if (attach_srq_segment(seg, hdr, ring, fds[0].get(), rep.segment_size)) return false;
  p.srq_old.push_back(std::move(p.srq_seg));
  p.srq_seg = std::move(seg);
  p.srq_hdr = hdr;
  p.srq = ring;
  return true;
}

}  // namespace

// The SRQ's current segment, for the calls that read or write its header
// (its size, its armed limit): another holder's resize is followed first.
void follow_if_moved(SrqState& st) {
  SrqSegment* s = &st.now();
  if (s->hdr->moved.load(std::memory_order_acquire)) follow_srq(st, s);
}

bool follow_srq(SrqState& st, SrqSegment* from) {
  std::lock_guard<std::mutex> g(st.mu);
  if (st.cur.load(std::memory_order_acquire) != from) return true;  // another thread followed already
  proto::HandleReq req{};
  req.handle = st.handle;
  proto::ImportSrqReply rep{};
  std::vector<Fd> fds;
  if (st.ctx->st->conn.call<proto::Op::GetSrq>(req, rep, {}, &fds)) return false;
  auto s = std::make_unique<SrqSegment>();
  if (attach_srq(*s, fds[0].get(), rep.segment_size)) return false;
  st.cur.store(s.get(), std::memory_order_release);
  st.segs.push_back(std::move(s));
  return true;
}

int attach_peer(ContextState& cs, Peer& p, const proto::ConnectPeerReply& rep, std::vector<Fd>& fds) {
  // fds: as many as the reply says (checked by DaemonConn::call, proto::reply_fds).
  p.qpn = rep.peer_qpn;
  p.entry = cs.qp_slot(rep.peer_qpn);
  if (int e = map_shared(fds[0].get(), 0, rep.qp_segment_size, PROT_READ | PROT_WRITE, false, p.seg)) return e;
  auto* h = p.seg.as<shm::QpSegmentHeader>();
  shm::QpLayout l{h->sq_capacity, h->rq_capacity};
  if (h->magic != shm::kQpMagic || h->size != rep.qp_segment_size || l.size() > rep.qp_segment_size) return EPROTO;
  auto* rqh = reinterpret_cast<shm::RingHeader*>(p.seg.as<char>() + l.rq_offset());
  if (rqh->capacity != h->rq_capacity) return EPROTO;
  p.hdr = h;
  p.rq = shm::Ring<shm::RecvWqe>(rqh, reinterpret_cast<shm::RingSlot<shm::RecvWqe>*>(rqh + 1));
  p.pd = rep.pd;
  p.recv_cq.cs = &cs;
  p.recv_cq.handle = rep.peer_recv_cq;
  if (int e = p.recv_cq.attach(fds[1].get(), rep.cq_segment_size)) return e;
  size_t next = 2;
  if (rep.has_srq) {
    if (int e = attach_srq_segment(p.srq_seg, p.srq_hdr, p.srq, fds[next].get(), rep.srq_segment_size)) return e;
    p.srq_handle = rep.srq_handle;
    ++next;
  }
  if (rep.has_channel) {
    p.recv_cq.channel_owned = std::move(fds[next]);
    p.recv_cq.channel_fd = p.recv_cq.channel_owned.get();
  }
  return 0;
}

// Takes a receive and records it as torn until push_recv_completion: a
// poster killed in between leaves the record for whoever recovers (a dead
// requester must not make the responder lose a receive). The
// record names the position before the slot is claimed, so that a kill at
// any instruction after the claim leaves it: until the copy is done the
// element is still in the slot (torn_taken 0), after it in torn_wr_id.
// Test hook (tests/verbs/kill_test.cc, Kill.*DiesRightAfter*): with
// SOFTVERBS_TEST_DIE=recv-claimed (recv-copied) the process kills itself
// right after it claimed a peer's receive (after it copied it out); with
// sq-taken, right after it took a request it carried out off its send queue
// (requester.cc progress_qp): windows a kill at a random instruction
// hits only by chance, made certain. Read once at load; one predictable branch per
// receive (queued request) otherwise.
const int g_die_at = [] {
  const char* e = std::getenv("SOFTVERBS_TEST_DIE");
  if (!e) return 0;
  if (std::strcmp(e, "recv-claimed") == 0) return 1;
  if (std::strcmp(e, "recv-copied") == 0) return 2;
  return std::strcmp(e, "sq-taken") == 0 ? 3 : 0;
}();

SV_HOT bool pop_peer_recv(ProcessQp& q, Peer& p, shm::RecvWqe& out) {
  auto* h = q.hdr;
  auto before = [h, qpn = p.qpn](uint64_t pos) {
    h->torn_taken.store(0, std::memory_order_relaxed);
    h->torn_pos = pos;
    h->torn_pid = self_pid();
    h->torn_qpn.store(qpn, std::memory_order_release);
  };
  auto take = [h](shm::RecvWqe& o, const shm::RecvWqe& in) {
    if (__builtin_expect(g_die_at == 1, 0)) ::raise(SIGKILL);
    copy_recv_wqe(o, in);
    h->torn_wr_id = o.wr_id;
    h->torn_taken.store(1, std::memory_order_release);
    if (__builtin_expect(g_die_at == 2, 0)) ::raise(SIGKILL);
  };
  // One call site, so that the ring's fast path is inlined here (two cost a
  // call with six saved registers per receive, as callgrind counts).
  if (!p.srq_hdr) {
    if (p.rq.pop_recorded(out, before, take)) return true;
    h->torn_qpn.store(0, std::memory_order_release);  // nothing taken
    return false;
  }
  auto pop = [&] { return p.srq.pop_recorded(out, before, take); };
  if (!shm::take_srq_receive(p.srq_hdr, pop)) {
    h->torn_qpn.store(0, std::memory_order_release);  // nothing taken
    // A resized SRQ: its receives wait in the segment it moved to.
    if (!p.srq_hdr->moved.load(std::memory_order_acquire) || !follow_peer_srq(q, p)) return false;
    if (!shm::take_srq_receive(p.srq_hdr, pop)) {
      h->torn_qpn.store(0, std::memory_order_release);
      return false;
    }
  }
  uint32_t limit = p.srq_hdr->limit.load(std::memory_order_relaxed);
  if (limit && p.srq.size() < limit && p.srq_hdr->limit.exchange(0) != 0) {
    // Below the armed limit: the SRQ's holders get IBV_EVENT_SRQ_LIMIT_REACHED
    // (the limit disarms itself).
    proto::HandleReq req{};
    req.handle = p.srq_handle;
    proto::Empty rep{};
    q.ctx->st->conn.call<proto::Op::SrqLimit>(req, rep);
  }
  return true;
}

}  // namespace sv::verbs

namespace sv::verbs {

// One constructor of a process's SRQ handle, for create and import.
ibv_srq* new_srq_handle(ibv_pd* pd, uint32_t handle, uint32_t max_sge, void* srq_context, int fd, uint64_t size) {
  ContextState& cs = ctx_state(pd->context);
  auto st = std::make_unique<SrqState>();
  st->ctx = to_ctx(pd->context);
  st->handle = handle;
  st->max_sge = std::min(max_sge, shm::kMaxSge);  // the ring slot's room, whatever a daemon says
  auto seg = std::make_unique<SrqSegment>();
  if (int e = attach_srq(*seg, fd, size)) {
    errno = e;
    return nullptr;
  }
  st->cur.store(seg.get(), std::memory_order_release);
  st->segs.push_back(std::move(seg));
  auto* srq = static_cast<Srq*>(std::calloc(1, sizeof(Srq)));
  if (!srq) {
    errno = ENOMEM;
    return nullptr;
  }
  srq->srq.context = pd->context;
  srq->srq.srq_context = srq_context;
  srq->srq.pd = pd;
  srq->srq.handle = handle;
  pthread_mutex_init(&srq->srq.mutex, nullptr);
  pthread_cond_init(&srq->srq.cond, nullptr);
  st->plan_ordinal = planned_ordinal(faults::Timed::kSrqLimit);
  srq->st = st.release();
  std::lock_guard<std::mutex> g(cs.mu);
  cs.srq_handles[handle] = &srq->srq;
  return &srq->srq;
}

}  // namespace sv::verbs

using namespace sv;
using namespace sv::verbs;

extern "C" {

ibv_srq* ibv_create_srq(ibv_pd* pd, ibv_srq_init_attr* attr) {
  if (!pd || !attr) {
    errno = EINVAL;
    return nullptr;
  }
  return create_srq(pd->context, pd, attr->attr, attr->srq_context, IBV_SRQT_BASIC, 0, nullptr);
}

}  // extern "C"

ibv_srq* sv::verbs::create_srq(ibv_context* c, ibv_pd* pd, ibv_srq_attr& attr, void* srq_context, uint32_t type,
                               uint32_t xrcd, ibv_cq* cq) {
  if (pd->context != c || (cq && cq->context != c)) {
    errno = EINVAL;
    return nullptr;
  }
  ContextState& cs = ctx_state(pd->context);
  proto::CreateSrqReq req{};
  req.pd = to_pd(pd)->handle;
  req.max_wr = attr.max_wr;
  req.max_sge = attr.max_sge;
  req.srq_limit = attr.srq_limit;
  req.srq_type = type;
  req.xrcd = xrcd;
  req.cq = cq ? to_cq(cq)->st->handle : 0;
  proto::CreateSrqReply rep{};
  std::vector<Fd> fds;
  if (int e = cs.conn.call<proto::Op::CreateSrq>(req, rep, {}, &fds)) {
    errno = e;
    return nullptr;
  }
  ibv_srq* srq = new_srq_handle(pd, rep.handle, attr.max_sge, srq_context, fds[0].get(), rep.segment_size);
  if (srq) {
    reinterpret_cast<Srq*>(srq)->st->srq_type = type;
    attr.max_wr = rep.capacity;  // what it really holds
  }
  return srq;
}

extern "C" {

// svx_import_srq (softverbs.h): the SRQ of a shared context, by handle. Any
// holder may post receives to it; QPs of any holder take from it.
ibv_srq* svx_import_srq(ibv_context* c, uint32_t handle) {
  ContextState& cs = ctx_state(c);
  proto::HandleReq req{};
  req.handle = handle;
  proto::ImportSrqReply rep{};
  std::vector<Fd> fds;
  if (int e = cs.conn.call<proto::Op::ImportSrq>(req, rep, {}, &fds)) {
    errno = e;
    return nullptr;
  }
  ibv_pd* pd = import_pd_handle(c, rep.pd);
  if (!pd) return nullptr;
  return new_srq_handle(pd, handle, rep.max_sge, nullptr, fds[0].get(), rep.segment_size);
}

// Releases this process's handle only; the SRQ lives on for its other holders.
void svx_unimport_srq(ibv_srq* ibsrq) {
  ContextState& cs = ctx_state(ibsrq->context);
  {
    std::lock_guard<std::mutex> g(cs.mu);
    if (auto it = cs.srq_handles.find(ibsrq->handle); it != cs.srq_handles.end() && it->second == ibsrq)
      cs.srq_handles.erase(it);
  }
  pthread_cond_destroy(&ibsrq->cond);
  pthread_mutex_destroy(&ibsrq->mutex);
  delete reinterpret_cast<Srq*>(ibsrq)->st;
  std::free(ibsrq);
}

int ibv_modify_srq(ibv_srq* ibsrq, ibv_srq_attr* attr, int mask) {
  SrqState& st = *reinterpret_cast<Srq*>(ibsrq)->st;
  if (mask & ~(IBV_SRQ_MAX_WR | IBV_SRQ_LIMIT)) {
    std::fprintf(stderr, "softverbs: ibv_modify_srq: attribute mask 0x%x has bits beyond IBV_SRQ_MAX_WR and "
                         "IBV_SRQ_LIMIT\n", unsigned(mask));
    return EINVAL;
  }
  follow_if_moved(st);  // another holder may have resized it
  if (mask & IBV_SRQ_MAX_WR) {
    const uint32_t limit = (mask & IBV_SRQ_LIMIT) ? attr->srq_limit : st.now().hdr->limit.load();
    if (int e = resize_srq(st, attr->max_wr, limit)) return e;
  }
  if (mask & IBV_SRQ_LIMIT) {
    SrqSegment& s = st.now();
    if (attr->srq_limit >= s.ring.capacity()) {
      std::fprintf(stderr, "softverbs: ibv_modify_srq: srq_limit %u is not below the SRQ's size %u\n",
                   attr->srq_limit, s.ring.capacity());
      return EINVAL;
    }
    s.hdr->limit.store(attr->srq_limit, std::memory_order_release);  // arms it (0 disarms)
  }
  return 0;
}

int ibv_query_srq(ibv_srq* ibsrq, ibv_srq_attr* attr) {
  SrqState& st = *reinterpret_cast<Srq*>(ibsrq)->st;
  follow_if_moved(st);
  SrqSegment& s = st.now();
  attr->max_wr = s.ring.capacity();
  attr->max_sge = st.max_sge;
  attr->srq_limit = s.hdr->limit.load(std::memory_order_relaxed);
  return 0;
}

int ibv_destroy_srq(ibv_srq* ibsrq) {
  Srq* srq = reinterpret_cast<Srq*>(ibsrq);
  ContextState& cs = ctx_state(ibsrq->context);
  proto::HandleReq req{};
  req.handle = srq->st->handle;
  proto::Empty rep{};
  if (int e = destroy_result(cs, cs.conn.call<proto::Op::DestroySrq>(req, rep))) return e;
  {
    std::lock_guard<std::mutex> g(cs.mu);
    cs.srq_handles.erase(srq->st->handle);
  }
  pthread_cond_destroy(&ibsrq->cond);
  pthread_mutex_destroy(&ibsrq->mutex);
  delete srq->st;
  std::free(srq);
  return 0;
}

}  // extern "C"

namespace sv::verbs {

// The SRQ's ring refused a receive: full, or closed by a resize. A resize
// being moved is waited for (its commit, then the new segment; its abort
// reopens the ring); a resizer that died mid-way fails the post.
bool push_after_resize(SrqState& st, const ibv_recv_wr& wr, uint32_t num_sge) {
  uint64_t deadline = 0;
  for (;;) {
    SrqSegment* s = &st.now();
    if (push_recv_wqe(s->ring, wr, num_sge)) return true;
    if (s->hdr->moved.load(std::memory_order_acquire)) {
      if (!follow_srq(st, s)) return false;
      continue;
    }
    if (!s->ring.closed()) return false;  // full
    uint64_t now = monotonic_ns();
    if (!deadline) deadline = now + 2'000'000'000ull;
    if (now > deadline) return false;
    sched_yield();
  }
}

// ibv_modify_srq(3), IBV_SRQ_MAX_WR: the SRQ moves to a new segment of at
// least max_wr receives with the receives posted to it, in order. Refused
// (EINVAL) below the receives outstanding or the armed limit, as rxe.
int resize_srq(SrqState& st, uint32_t max_wr, uint32_t limit) {
  ContextState& cs = *st.ctx->st;
  if (max_wr == 0 || max_wr > shm::kMaxQpWr || (limit && max_wr < limit)) {
    std::fprintf(stderr, "softverbs: ibv_modify_srq: max_wr %u is 0, above the device's %u or below srq_limit %u\n",
                 max_wr, shm::kMaxQpWr, limit);
    return EINVAL;
  }
  proto::ResizeSrqReq req{};
  req.handle = st.handle;
  req.max_wr = max_wr;
  proto::CreateSrqReply rep{};
  std::vector<Fd> fds;
  if (int e = cs.conn.call<proto::Op::ResizeSrq>(req, rep, {}, &fds)) return e;
  auto done = [&](uint32_t commit) {
    proto::ResizeSrqDoneReq d{};
    d.handle = st.handle;
    d.commit = commit;
    proto::Empty r{};
    return cs.conn.call<proto::Op::ResizeSrqDone>(d, r);
  };
  auto ns = std::make_unique<SrqSegment>();
  if (int e = attach_srq(*ns, fds[0].get(), rep.segment_size)) {
    done(0);
    return e;
  }
  std::lock_guard<std::mutex> g(st.mu);
  SrqSegment* old = st.cur.load(std::memory_order_acquire);
  if (old->hdr->moved.load(std::memory_order_acquire)) {  // another holder resized it: start from its segment
    done(0);
    return EAGAIN;
  }
  // Takers first keep off the ring (take_srq_receive), then posters.
  old->hdr->moving.store(1, std::memory_order_seq_cst);
  const uint64_t until = monotonic_ns() + 1'000'000'000ull;
  while (old->hdr->takers.load(std::memory_order_seq_cst) != 0 && monotonic_ns() < until) sched_yield();
  uint64_t tail = old->ring.close();
  if (tail - old->ring.head() > max_wr) {
    old->ring.reopen();
    old->hdr->moving.store(0, std::memory_order_release);
    done(0);
    std::fprintf(stderr, "softverbs: ibv_modify_srq: max_wr %u is below the %llu receives posted to the SRQ\n",
                 max_wr, (unsigned long long)(tail - old->ring.head()));
    return EINVAL;
  }
  // Move the posted receives in order (takers are off the ring; one past
  // the bounded wait above still takes from its head). A slot reserved
  // before the close may still be being written: wait for it (one of a
  // dead poster is voided by the pop).
  shm::RecvWqe w;
  while (old->ring.head() < tail) {
    if (old->ring.pop(w))
      ns->ring.push(w);
    else
      __builtin_ia32_pause();
  }
  ns->hdr->limit.store(old->hdr->limit.load());
  if (int rc = done(1)) {  // the daemon sets old->moved: posters and senders follow
    // Not committed: put the receives back in the old ring (they came from there).
    old->ring.reopen();
    while (ns->ring.pop(w)) old->ring.push(w);
    old->hdr->moving.store(0, std::memory_order_release);
    return rc;
  }
  st.cur.store(ns.get(), std::memory_order_release);
  st.segs.push_back(std::move(ns));
  return 0;
}

int post_srq_recv(ibv_srq* ibsrq, ibv_recv_wr* wr, ibv_recv_wr** bad) {
  SrqState& st = *reinterpret_cast<Srq*>(ibsrq)->st;
  if (st.ctx->st->dead.load(std::memory_order_relaxed)) {
    *bad = wr;
    return EIO;
  }
  for (; wr; wr = wr->next) {
    const int num_sge = wr->num_sge;  // read once (push_recv_wqe)
    if (num_sge < 0 || uint32_t(num_sge) > st.max_sge) {
      *bad = wr;
      return EINVAL;
    }
    if (!push_recv_wqe(st.now().ring, *wr, uint32_t(num_sge)) && !push_after_resize(st, *wr, uint32_t(num_sge))) {
      *bad = wr;
      return ENOMEM;
    }
  }
  st.now().ring.prefetch_next_push();  // as post_recv (qp.cc)
  return 0;
}

}  // namespace sv::verbs
