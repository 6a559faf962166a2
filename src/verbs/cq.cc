// Completion queues and completion channels. A CQ is a ring in a shared
// segment: any process whose operations complete into it pushes entries
// (requesters for their sends, peers for receives), and pollers pop them.
// An armed CQ signals its channel's wake-up pair once per arming (IBTA 11.4.2.2).
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "common/completion.h"
#include "verbs/fault_events.h"
#include "verbs/provider.h"
#include "verbs/roce_link.h"

namespace sv::verbs {

namespace {

int map_cq_segment(int fd, uint64_t size, CqSegment& s) {
  if (size < 4096) return EINVAL;
  if (int e = map_shared(fd, 0, size, PROT_READ | PROT_WRITE, false, s.map)) return e;
  auto* h = s.map.as<shm::CqSegmentHeader>();
  // The segment is writable by other processes: check its geometry once.
  uint32_t cap = h->capacity;
  if (h->magic != shm::kCqMagic || h->size != size || cap == 0 || (cap & (cap - 1)) ||
      h->ring_offset != shm::CqLayout{cap}.ring_offset() || shm::CqLayout{cap}.size() > size)
    return EPROTO;
  auto* rh = reinterpret_cast<shm::RingHeader*>(s.map.as<char>() + h->ring_offset);
  if (rh->capacity != cap || rh->mask != cap - 1) return EPROTO;
  s.hdr = h;
  s.ring = shm::Ring<Cqe>(rh, reinterpret_cast<shm::RingSlot<Cqe>*>(rh + 1));
  return 0;
}

}  // namespace

int CqView::attach(int fd, uint64_t size) {
  auto s = std::make_unique<CqSegment>();
  if (int e = map_cq_segment(fd, size, *s)) return e;
  if (!handle) handle = s->hdr->handle;
  std::lock_guard<std::mutex> g(mu);
  cur.store(s.get(), std::memory_order_release);
  segs.push_back(std::move(s));
  return 0;
}

bool CqView::follow(CqSegment* from) {
  std::lock_guard<std::mutex> g(mu);
  if (cur.load(std::memory_order_acquire) != from) return true;  // another thread followed already
  if (!cs) return false;
  proto::HandleReq req{};
  req.handle = handle;
  proto::ImportCqReply rep{};
  std::vector<Fd> fds;
  if (cs->conn.call<proto::Op::GetCq>(req, rep, {}, &fds)) return false;
  auto s = std::make_unique<CqSegment>();
  if (map_cq_segment(fds[0].get(), rep.segment_size, *s)) return false;
  cur.store(s.get(), std::memory_order_release);
  segs.push_back(std::move(s));
  return true;
}

SV_HOT bool CqView::push(const ibv_wc& wc, bool solicited, shm::OwedRecord clear) {
  uint64_t deadline = 0;
  for (;;) {
    CqSegment* s = cur.load(std::memory_order_acquire);
    if (shm::push_completion(s->hdr, s->ring, wc, solicited, channel_fd, clear)) return true;
    if (s->hdr->moved.load(std::memory_order_acquire)) {
      if (!follow(s)) return false;
      continue;
    }
    if (!s->ring.closed()) {
      // IBTA 11.4.2.1: an overrun is a CQ error (the daemon raises the
      // event and takes the CQ's QPs to ERR), unless the CQ ignores it.
      if (cs && !s->hdr->ignore_overrun.load(std::memory_order_relaxed) && !error_reported.exchange(true)) {
        proto::HandleReq req{};
        req.handle = handle;
        proto::Empty rep{};
        cs->conn.call<proto::Op::CqError>(req, rep);
      }
      return false;
    }
    // A resize is moving the ring: wait for its commit (or its abort, which
    // reopens the ring). A resizer that died mid-way loses this completion.
    uint64_t now = monotonic_ns();
    if (!deadline) deadline = now + 2'000'000'000ull;
    if (now > deadline) return false;
    sched_yield();
  }
}

namespace {

// Gives the slot the last poll took back to the producers (see CqView::poll);
// the caller holds the poll lock.
void release_taken(CqSegment* s) {
  uint64_t t = s->hdr->taken.load(std::memory_order_relaxed);
  if (!t) return;
  // The slot of position t - 1, if it still holds what we took (the head
  // may have moved past further slots that dead producers left: voided).
  // Anything else was written by someone who does not follow the protocol.
  s->ring.release_if_taken(t - 1);
  s->hdr->taken.store(0, std::memory_order_relaxed);
}

}  // namespace

// Pollers hold the segment's poll lock, which a resize holds while it moves
// the completions, so no poller takes a newer completion from the old ring
// while an older one is in transit to the new.
//
// An empty ring is reported without taking the lock: ready() reads the head
// and the head slot, then the pollers' line (lock and `moved`), so a
// busy-polling application costs the producers nothing but the slot line
// they publish in. If the head slot was empty and the lock free afterwards,
// no resize was moving completions at the moment the slot was read (the
// resizer holds the lock from before it takes the first one until after
// `moved` is set), so "empty" is what a locked poll would have answered.
//
// Giving a slot back to the producers writes its sequence, on the line the
// producer wrote and the poller just read from the other CPU: a transfer,
// which the poller's next locked instruction waits for. In a ping-pong that
// is the application's next post (its receive repost, or send lock), right
// on the critical path. So a poll gives back every slot it took but the
// last, and the last only at the next poll, an idle one first (a busy
// poller finds an empty ring between messages). At most one slot is held
// back, the one behind the head: a producer meets it only when the ring
// holds `capacity - 1` = ibv_cq.cqe completions, so the CQ still holds cqe.
namespace {

// CqView::poll's work, with `copy(slot element, i)` storing the i-th taken
// completion where the caller wants it.
template <class Copy>
[[gnu::always_inline]] inline int poll_segments(CqView& v, int n, Copy copy) {
  for (int round = 0; round < 2; ++round) {
    CqSegment* s = v.cur.load(std::memory_order_acquire);
    if (!s->ring.ready() && s->hdr->poll_lock.owner.load(std::memory_order_acquire) == 0 &&
        !s->hdr->moved.load(std::memory_order_acquire)) {
      if (s->hdr->taken.load(std::memory_order_relaxed)) {  // idle: give the last slot back now
        if (s->hdr->poll_lock.lock(self_pid())) s->ring.recover_exclusive();
        release_taken(s);
        s->hdr->poll_lock.unlock();
      }
      return 0;
    }
    // A poller killed with the lock may have left the slot behind the head
    // taken but not given back: give it back.
    if (s->hdr->poll_lock.lock(self_pid())) s->ring.recover_exclusive();
    release_taken(s);
    int got = 0;
    uint64_t pos = 0, last = 0;
    // The poll lock excludes other consumers.
    while (got < n && s->ring.take_exclusive_with(pos, [&copy, got](const Cqe& c) { copy(c, got); })) {
      if (got) s->ring.release(last);
      last = pos;
      ++got;
    }
    if (got) s->hdr->taken.store(last + 1, std::memory_order_relaxed);
    s->hdr->poll_lock.unlock();
    if (got || !s->hdr->moved.load(std::memory_order_acquire) || !v.follow(s)) return got;
  }
  return 0;
}

}  // namespace

SV_HOT int CqView::poll(Cqe* out, int n) {
  return poll_segments(*this, n, [out](const Cqe& c, int i) { std::memcpy(&out[i], &c, sizeof(Cqe)); });
}

// ibv_poll_cq's copy: the work completion only, into the application's
// array (a copy of the whole entry to the stack first would cost every
// poll about 20 instructions, as callgrind counts).
SV_HOT int CqView::poll_wc(ibv_wc* out, int n) {
  return poll_segments(*this, n, [out](const Cqe& c, int i) { std::memcpy(&out[i], &c.wc, sizeof(ibv_wc)); });
}

bool CqView::pop(Cqe& out) { return poll(&out, 1) == 1; }

namespace {

// Moves the CQ to a new segment of `cqe` entries with the completions that
// wait in it, in order, but those of QP `drop_qpn` (0: none).
int move_cq(ibv_cq* ibcq, int cqe, uint32_t drop_qpn) {
  CqState* st = to_cq(ibcq)->st;
  ContextState& cs = ctx_state(ibcq->context);
  if (cqe <= 0 || uint32_t(cqe) > shm::kMaxCqe - 1) return EINVAL;
  proto::ResizeCqReq req{};
  req.handle = st->handle;
  req.cqe = uint32_t(cqe);
  proto::CreateCqReply rep{};
  std::vector<Fd> fds;
  if (int e = cs.conn.call<proto::Op::ResizeCq>(req, rep, {}, &fds)) return e;
  auto done = [&](uint32_t commit) {
    proto::ResizeCqDoneReq d{};
    d.handle = st->handle;
    d.commit = commit;
    proto::Empty r{};
    return cs.conn.call<proto::Op::ResizeCqDone>(d, r);
  };
  auto ns = std::make_unique<CqSegment>();
  if (int e = map_cq_segment(fds[0].get(), rep.segment_size, *ns)) {
    done(0);
    return e;
  }
  CqView& v = st->view;
  std::lock_guard<std::mutex> g(v.mu);
  CqSegment* old = v.cur.load(std::memory_order_acquire);
  if (old->hdr->moved.load(std::memory_order_acquire)) {  // another holder resized it: start from its segment
    done(0);
    return EAGAIN;
  }
  if (old->hdr->poll_lock.lock(self_pid())) old->ring.recover_exclusive();
  release_taken(old);
  uint64_t tail = old->ring.close();
  // ibv_resize_cq(3): cqe must hold every completion not yet polled.
  if (tail - old->ring.head() > uint64_t(cqe)) {
    old->ring.reopen();
    old->hdr->poll_lock.unlock();
    done(0);
    return EINVAL;
  }
  // Move the waiting completions in order. A slot reserved before the close
  // may still be being written: wait for it.
  Cqe e;
  while (old->ring.head() < tail) {
    if (old->ring.pop(e)) {
      if (!drop_qpn || e.wc.qp_num != drop_qpn) ns->ring.push(e);
    } else {
      __builtin_ia32_pause();
    }
  }
  ns->hdr->armed.store(old->hdr->armed.load());
  ns->hdr->notified.store(old->hdr->notified.load());
  ns->hdr->overrun.store(old->hdr->overrun.load());
  ns->hdr->ignore_overrun.store(old->hdr->ignore_overrun.load());
  int rc = done(1);  // the daemon sets old->moved: producers and pollers follow
  if (rc) {
    // Not committed: the completions are in a segment nobody else sees. Put
    // them back in the old ring (it has room: they came from there).
    old->ring.reopen();
    while (ns->ring.pop(e)) old->ring.push(e);
    old->hdr->poll_lock.unlock();
    return rc;
  }
  v.cur.store(ns.get(), std::memory_order_release);
  v.segs.push_back(std::move(ns));
  old->hdr->poll_lock.unlock();
  ibcq->cqe = int(rep.capacity - 1);
  return 0;
}

}  // namespace

int resize_cq(ibv_cq* ibcq, int cqe) { return move_cq(ibcq, cqe, 0); }

// A QP moved to RESET takes its completions that still wait in the CQ with
// it, as mlx4's and mlx5's providers clean a reset QP's CQs: a QP restarted
// from ERR (rdma-core's tests do, test_mr.py) does not poll its old flushed
// work requests. The completions move to a new segment, as for a resize
// (which this process keeps mapped until the CQ goes), so the caller does
// it only for a QP reset from an error state. Best effort: a CQ this
// process may not resize keeps them.
void clean_cq(ibv_cq* ibcq, uint32_t qpn) {
  CqState* st = to_cq(ibcq)->st;
  if (st->granted || !st->view.ring().ready()) return;  // nothing waits
  move_cq(ibcq, ibcq->cqe, qpn);
}

// A destroyed QP's completions leave its CQs with it (IBTA 11.2.5.4: its
// outstanding work requests leave the scope of the channel interface), as
// mlx4's and mlx5's providers clean the CQs at ibv_destroy_qp. Programs
// count on it: libfabric 1.17's verbs provider, closing an endpoint (RxM
// does when the peer disconnects), destroys the QP, polls the CQ dry and
// hands what it found to RxM, which reposts the receive buffer of such a
// completion on the endpoint just closed and crashes (SIGSEGV); the
// receives it still holds complete as canceled instead, and are freed.
// Both kinds are dropped by the pollers: those waiting in the ring, and
// those a peer on this host pushes after the destroy (it took the receive
// just before, IBTA 9.7.5.2: the push is its last step). A QP is forgotten
// once the CQ was seen empty kGoneGraceNs after its destroy, or after
// kMaxGone later ones.
constexpr uint64_t kGoneGraceNs = 100'000'000;
constexpr size_t kMaxGone = 1024;

void forget_qp_completions(Cq* cq, uint32_t qpn) {
  CqState& st = *cq->st;
  std::lock_guard<std::mutex> g(st.gone_mu);
  if (st.gone.size() >= kMaxGone) st.gone.erase(st.gone.begin());
  st.gone.push_back({qpn, monotonic_ns()});
  st.gone_n.store(uint32_t(st.gone.size()), std::memory_order_release);
}

// A new QP of that number completes here: its completions are its own.
void keep_qp_completions(Cq* cq, uint32_t qpn) {
  CqState& st = *cq->st;
  if (st.gone_n.load(std::memory_order_acquire) == 0) return;
  std::lock_guard<std::mutex> g(st.gone_mu);
  std::erase_if(st.gone, [qpn](const CqState::GoneQp& q) { return q.qpn == qpn; });
  st.gone_n.store(uint32_t(st.gone.size()), std::memory_order_release);
}

namespace {

bool of_gone_qp(const CqState& st, uint32_t qpn) {
  for (const auto& q : st.gone)
    if (q.qpn == qpn) return true;
  return false;
}

// Drops the completions of destroyed QPs from e[0..k); returns how many remain.
int drop_gone(CqState& st, ibv_wc* wc, int k) {
  if (st.gone_n.load(std::memory_order_acquire) == 0) [[likely]] return k;
  std::lock_guard<std::mutex> g(st.gone_mu);
  int kept = 0;
  for (int i = 0; i < k; ++i)
    if (!of_gone_qp(st, wc[i].qp_num)) wc[kept++] = wc[i];
  return kept;
}

// The CQ was found empty: destroyed QPs older than the grace period can
// have nothing more on its way.
void prune_gone(CqState& st) {
  if (st.gone_n.load(std::memory_order_acquire) == 0) [[likely]] return;
  std::lock_guard<std::mutex> g(st.gone_mu);
  uint64_t now = monotonic_ns();
  std::erase_if(st.gone, [now](const CqState::GoneQp& q) { return now - q.since_ns > kGoneGraceNs; });
  st.gone_n.store(uint32_t(st.gone.size()), std::memory_order_release);
}

}  // namespace

// A CQ another user granted by name: the daemon pops the completions for
// this process (it holds no mapping of the CQ, so it can neither write
// entries nor hold the owner's poll lock).
static int poll_granted(CqState* st, int n, ibv_wc* wc) {
  int got = 0;
  while (got < n) {
    proto::PollCqReq req{};
    req.handle = st->handle;
    req.max = uint32_t(std::min(n - got, int(proto::kPollCqMax)));
    proto::PollCqReply rep{};
    if (int e = st->view.cs->conn.call<proto::Op::PollCq>(req, rep)) return got ? got : -e;
    uint32_t k = std::min(rep.count, req.max);
    std::memcpy(wc + got, rep.wc, k * sizeof(ibv_wc));
    got += int(k);
    if (k < req.max) break;
  }
  return got;
}

SV_HOT int poll_cq(ibv_cq* ibcq, int n, ibv_wc* wc) {
  if (n < 0) return -EINVAL;
  CqState* st = to_cq(ibcq)->st;
  if (st->granted) [[unlikely]] return poll_granted(st, n, wc);
  int got = 0;
  while (got < n) {
    int want = n - got;
    int k = st->view.poll_wc(wc + got, want);
    if (k == 0) prune_gone(*st);
    got += drop_gone(*st, wc + got, k);
    if (k < want) break;
  }
  // Empty, and a wire QP completes here: the polling thread receives and
  // runs the engines itself (no wake-up of the RoCE thread), then looks again.
  if (got == 0 && n > 0 && st->wire.load(std::memory_order_relaxed) && roce_poll())
    got = drop_gone(*st, wc, st->view.poll_wc(wc, n));
  return got;
}

int req_notify_cq(ibv_cq* ibcq, int solicited_only) {
  CqState* st = to_cq(ibcq)->st;
  if (st->granted) return EOPNOTSUPP;  // a granted CQ comes without its channel
  uint32_t want = solicited_only ? shm::kArmSolicited : shm::kArmAny;
  // Arming for any completion overrides an earlier solicited-only arming.
  shm::CqSegmentHeader* h = st->view.hdr();
  // A read-modify-write either way: the caller polls the CQ next, and the
  // arming must be ordered before that poll reads the ring (see
  // push_completion in common/completion.h).
  uint32_t cur = h->armed.load(std::memory_order_relaxed);
  if (cur != shm::kArmAny) h->armed.exchange(want, std::memory_order_acq_rel);
  else h->armed.fetch_or(0, std::memory_order_acq_rel);
  // About to sleep on the channel: the RoCE thread must serve the wire again.
  if (st->wire.load(std::memory_order_relaxed)) roce_notify_armed();
  return 0;
}

ibv_cq* create_cq(ibv_context* c, int cqe, void* cq_context, ibv_comp_channel* channel, int comp_vector) {
  if (cqe <= 0 || uint32_t(cqe) > shm::kMaxCqe - 1 || comp_vector < 0 || comp_vector >= c->num_comp_vectors) {
    errno = EINVAL;
    return nullptr;
  }
  if (channel && channel->context != c) {
    errno = EINVAL;
    return nullptr;
  }
  ContextState& cs = ctx_state(c);
  proto::CreateCqReq req{};
  req.cqe = uint32_t(cqe);
  req.channel = channel ? to_channel(channel)->handle : 0;
  proto::CreateCqReply rep{};
  std::vector<Fd> fds;
  if (int e = cs.conn.call<proto::Op::CreateCq>(req, rep, {}, &fds)) {
    errno = e;
    return nullptr;
  }
  auto st = std::make_unique<CqState>();
  st->ctx = to_ctx(c);
  st->handle = rep.handle;
  st->channel = channel ? to_channel(channel) : nullptr;
  st->view.cs = &cs;
  st->view.handle = rep.handle;
  if (int e = st->view.attach(fds[0].get(), rep.segment_size)) {
    errno = e;
    return nullptr;
  }
  if (channel) st->view.channel_fd = to_channel(channel)->wake;
  return new_cq_handle(c, std::move(st), rep.capacity, channel, cq_context);
}

ibv_cq* new_cq_handle(ibv_context* c, std::unique_ptr<CqState> st, uint32_t capacity, ibv_comp_channel* channel,
                      void* cq_context) {
  auto* cq = static_cast<Cq*>(std::calloc(1, sizeof(Cq)));
  if (!cq) {
    errno = ENOMEM;
    return nullptr;
  }
  ibv_cq& q = *reinterpret_cast<ibv_cq*>(&cq->cq);
  q.context = c;
  q.channel = channel;
  q.cq_context = cq_context;
  q.handle = st->handle;
  q.cqe = int(capacity - 1);
  pthread_mutex_init(&q.mutex, nullptr);
  pthread_cond_init(&q.cond, nullptr);
  st->ibcq = &q;
  cq->st = st.release();
  if (channel) __atomic_add_fetch(&channel->refcnt, 1, __ATOMIC_RELAXED);
  ContextState& cs = ctx_state(c);
  std::lock_guard<std::mutex> g(cs.mu);
  cq->st->plan_ordinal = planned_ordinal(faults::Timed::kCqErr);
  cs.cqs.push_back(cq->st);
  cs.cq_handles[q.handle] = cq;
  return &q;
}


// ---- Extended CQs (ibv_create_cq_ex(3)) -------------------------------------

namespace {

CqState& ex_state(ibv_cq_ex* cq) { return *to_cq(reinterpret_cast<ibv_cq*>(cq))->st; }

int ex_take(ibv_cq_ex* cq) {
  CqState& st = ex_state(cq);
  do {
    if (!st.view.pop(st.cur)) {
      prune_gone(st);
      return ENOENT;
    }
  } while (drop_gone(st, &st.cur.wc, 1) == 0);  // a destroyed QP's (forget_qp_completions)
  timespec ts;
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  st.cur_ns = uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
  cq->status = st.cur.wc.status;
  cq->wr_id = st.cur.wc.wr_id;
  return 0;
}
int ex_start_poll(ibv_cq_ex* cq, ibv_poll_cq_attr* attr) {
  if (attr && attr->comp_mask) return EINVAL;
  int rc = ex_take(cq);
  // As poll_cq: an empty wire CQ's poller receives and runs the engines.
  if (rc == ENOENT && ex_state(cq).wire.load(std::memory_order_relaxed) && roce_poll()) rc = ex_take(cq);
  return rc;
}
int ex_next_poll(ibv_cq_ex* cq) { return ex_take(cq); }
void ex_end_poll(ibv_cq_ex*) {}
ibv_wc_opcode ex_opcode(ibv_cq_ex* cq) { return ex_state(cq).cur.wc.opcode; }
uint32_t ex_vendor_err(ibv_cq_ex* cq) { return ex_state(cq).cur.wc.vendor_err; }
uint32_t ex_byte_len(ibv_cq_ex* cq) { return ex_state(cq).cur.wc.byte_len; }
__be32 ex_imm(ibv_cq_ex* cq) { return ex_state(cq).cur.wc.imm_data; }
uint32_t ex_qp_num(ibv_cq_ex* cq) { return ex_state(cq).cur.wc.qp_num; }
uint32_t ex_src_qp(ibv_cq_ex* cq) { return ex_state(cq).cur.wc.src_qp; }
unsigned int ex_wc_flags(ibv_cq_ex* cq) { return ex_state(cq).cur.wc.wc_flags; }
uint32_t ex_slid(ibv_cq_ex* cq) { return ex_state(cq).cur.wc.slid; }
uint8_t ex_sl(ibv_cq_ex* cq) { return ex_state(cq).cur.wc.sl; }
uint8_t ex_dlid_path_bits(ibv_cq_ex* cq) { return ex_state(cq).cur.wc.dlid_path_bits; }
uint64_t ex_ts(ibv_cq_ex* cq) { return ex_state(cq).cur_ns; }  // 1 tick = 1 ns (hca_core_clock 1 GHz)
uint64_t ex_wallclock(ibv_cq_ex* cq) {
  timespec ts;
  ::clock_gettime(CLOCK_REALTIME, &ts);
  (void)cq;
  return uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
}

constexpr uint64_t kSupportedWcFlags = uint64_t(IBV_WC_STANDARD_FLAGS) |
                                       uint64_t(IBV_WC_EX_WITH_COMPLETION_TIMESTAMP) |
                                       uint64_t(IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK);

}  // namespace

ibv_cq_ex* create_cq_ex(ibv_context* c, ibv_cq_init_attr_ex* attr) {
  if (!attr || (attr->comp_mask & ~uint32_t(IBV_CQ_INIT_ATTR_MASK_FLAGS | IBV_CQ_INIT_ATTR_MASK_PD))) {
    errno = EINVAL;
    return nullptr;
  }
  if (attr->wc_flags & ~kSupportedWcFlags) {
    errno = EOPNOTSUPP;
    return nullptr;
  }
  if ((attr->comp_mask & IBV_CQ_INIT_ATTR_MASK_FLAGS) &&
      (attr->flags & ~uint32_t(IBV_CREATE_CQ_ATTR_SINGLE_THREADED | IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN))) {
    errno = EOPNOTSUPP;
    return nullptr;
  }
  ibv_cq* q = create_cq(c, int(attr->cqe), attr->cq_context, attr->channel, int(attr->comp_vector));
  if (!q) return nullptr;
  if ((attr->comp_mask & IBV_CQ_INIT_ATTR_MASK_FLAGS) && (attr->flags & IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN))
    to_cq(q)->st->view.hdr()->ignore_overrun.store(1, std::memory_order_relaxed);
  auto* ex = reinterpret_cast<ibv_cq_ex*>(q);
  ex->start_poll = ex_start_poll;
  ex->next_poll = ex_next_poll;
  ex->end_poll = ex_end_poll;
  ex->read_opcode = ex_opcode;
  ex->read_vendor_err = ex_vendor_err;
  ex->read_byte_len = ex_byte_len;
  ex->read_imm_data = ex_imm;
  ex->read_qp_num = ex_qp_num;
  ex->read_src_qp = ex_src_qp;
  ex->read_wc_flags = ex_wc_flags;
  ex->read_slid = ex_slid;
  ex->read_sl = ex_sl;
  ex->read_dlid_path_bits = ex_dlid_path_bits;
  ex->read_completion_ts = ex_ts;
  ex->read_completion_wallclock_ns = ex_wallclock;
  return ex;
}

}  // namespace sv::verbs

using namespace sv;
using namespace sv::verbs;

extern "C" {

ibv_comp_channel* ibv_create_comp_channel(ibv_context* c) {
  ContextState& cs = ctx_state(c);
  // A wake-up pair, not an eventfd: the daemon signals it too, and its
  // signal must never sleep whatever a holder does to the descriptor.
  sv::Fd rd, wake;
  if (int e = sv::make_wake_pair(rd, wake)) {
    errno = e;
    return nullptr;
  }
  proto::Empty req{};
  proto::HandleReply rep{};
  int fds[2] = {rd.get(), wake.get()};
  if (int e = cs.conn.call<proto::Op::CreateChannel>(req, rep, fds)) {
    errno = e;
    return nullptr;
  }
  auto* ch = static_cast<Channel*>(std::calloc(1, sizeof(Channel)));
  if (!ch) {
    errno = ENOMEM;
    return nullptr;
  }
  ch->ch.context = c;
  ch->ch.fd = rd.release();
  ch->wake = wake.release();
  ch->ch.refcnt = 0;
  ch->handle = rep.handle;
  ch->ctx = to_ctx(c);
  std::lock_guard<std::mutex> g(cs.mu);
  cs.channel_handles[ch->handle] = ch;
  return &ch->ch;
}

int ibv_destroy_comp_channel(ibv_comp_channel* channel) {
  Channel* ch = to_channel(channel);
  // ibv_create_comp_channel(3): "returns 0 on success, or the value of errno
  // on failure"; rdma-core returns EBUSY itself while a CQ uses the channel.
  if (__atomic_load_n(&channel->refcnt, __ATOMIC_RELAXED) != 0) {
    errno = EBUSY;
    return EBUSY;
  }
  ContextState& cs = ctx_state(channel->context);
  proto::HandleReq req{};
  req.handle = ch->handle;
  proto::Empty rep{};
  if (int e = destroy_result(cs, cs.conn.call<proto::Op::DestroyChannel>(req, rep))) {
    errno = e;
    return e;
  }
  {
    std::lock_guard<std::mutex> g(cs.mu);
    if (auto it = cs.channel_handles.find(ch->handle); it != cs.channel_handles.end() && it->second == ch)
      cs.channel_handles.erase(it);
  }
  ::close(channel->fd);
  ::close(ch->wake);
  std::free(ch);
  return 0;
}

// svx_import_comp_channel (softverbs.h): a completion channel of a shared
// context. Its wake-up pair is the same one in every holder: each event wakes
// one waiter, and ibv_get_cq_event hands it to whoever takes the CQ's
// notified flag first.
ibv_comp_channel* svx_import_comp_channel(ibv_context* c, uint32_t handle) {
  ContextState& cs = ctx_state(c);
  {
    std::lock_guard<std::mutex> g(cs.mu);
    if (auto it = cs.channel_handles.find(handle); it != cs.channel_handles.end()) return &it->second->ch;
  }
  proto::HandleReq req{};
  req.handle = handle;
  proto::Empty rep{};
  std::vector<sv::Fd> fds;
  if (int e = cs.conn.call<proto::Op::ImportChannel>(req, rep, {}, &fds)) {
    errno = e;
    return nullptr;
  }
  auto* ch = static_cast<Channel*>(std::calloc(1, sizeof(Channel)));
  if (!ch) {
    errno = ENOMEM;
    return nullptr;
  }
  ch->ch.context = c;
  ch->ch.fd = fds[0].release();
  ch->wake = fds[1].release();
  ch->handle = handle;
  ch->ctx = to_ctx(c);
  std::lock_guard<std::mutex> g(cs.mu);
  cs.channel_handles[handle] = ch;
  return &ch->ch;
}

// Releases this process's handle only (EBUSY while CQs of this process use it).
int svx_unimport_comp_channel(ibv_comp_channel* channel) {
  if (__atomic_load_n(&channel->refcnt, __ATOMIC_RELAXED) != 0) return EBUSY;
  Channel* ch = to_channel(channel);
  ContextState& cs = ctx_state(channel->context);
  {
    std::lock_guard<std::mutex> g(cs.mu);
    if (auto it = cs.channel_handles.find(ch->handle); it != cs.channel_handles.end() && it->second == ch)
      cs.channel_handles.erase(it);
  }
  ::close(channel->fd);
  ::close(ch->wake);
  std::free(ch);
  return 0;
}

uint32_t svx_comp_channel_handle(ibv_comp_channel* channel) { return to_channel(channel)->handle; }

ibv_cq* ibv_create_cq(ibv_context* c, int cqe, void* cq_context, ibv_comp_channel* channel, int comp_vector) {
  return create_cq(c, cqe, cq_context, channel, comp_vector);
}

int ibv_destroy_cq(ibv_cq* ibcq) {
  Cq* cq = to_cq(ibcq);
  ContextState& cs = ctx_state(ibcq->context);
  proto::HandleReq req{};
  req.handle = cq->st->handle;
  proto::Empty rep{};
  if (int e = destroy_result(cs, cs.conn.call<proto::Op::DestroyCq>(req, rep))) return e;
  {
    std::lock_guard<std::mutex> g(cs.mu);
    std::erase(cs.cqs, cq->st);
    cs.cq_handles.erase(cq->st->handle);
  }
  if (ibcq->channel) __atomic_sub_fetch(&ibcq->channel->refcnt, 1, __ATOMIC_RELAXED);
  pthread_cond_destroy(&ibcq->cond);
  pthread_mutex_destroy(&ibcq->mutex);
  delete cq->st;
  std::free(cq);
  return 0;
}

int ibv_resize_cq(ibv_cq* cq, int cqe) { return resize_cq(cq, cqe); }

// How long ibv_get_cq_event spins before it sleeps. A blocking wake-up
// across vCPUs costs tens of microseconds on a VM (docs/PERFORMANCE.md),
// while a ping-pong partner usually answers within a few: spinning that long
// buys the difference back. SOFTVERBS_SPIN_US overrides it (0: never spin).
static uint64_t spin_budget_ns() {
  static const uint64_t ns = [] {
    const char* e = std::getenv("SOFTVERBS_SPIN_US");
    long us = e && *e ? std::strtol(e, nullptr, 10) : 50;
    return uint64_t(us < 0 ? 0 : us > 100000 ? 100000 : us) * 1000;
  }();
  return ns;
}

// True if some CQ on `ch` has a pending event. Reads only shared memory.
static bool channel_has_event(ContextState& cs, Channel* ch) {
  std::lock_guard<std::mutex> g(cs.mu);
  for (CqState* s : cs.cqs)
    if (s->channel == ch && s->view.hdr()->notified.load(std::memory_order_acquire)) return true;
  return false;
}

// Spins up to the budget for an event before the caller blocks. Adaptive:
// after 8 waits in a row that the spin did not catch quickly (the partner
// is slow, spinning only burns a CPU), it spins on one wait in 16 only, to
// notice when the partner is fast again. The spin yields the CPU between
// rounds: when the CPUs are oversubscribed the partner may be waiting for
// this very CPU, and a spin that holds it would delay the event it awaits.
// spin_wanted: whether this wait spins (the adaptive choice; relaxed
// atomics: threads sharing a channel need only a rough count).
static bool spin_wanted(Channel* ch) {
  if (spin_budget_ns() == 0) return false;
  uint32_t waits = __atomic_add_fetch(&ch->waits, 1, __ATOMIC_RELAXED);
  uint32_t misses = __atomic_load_n(&ch->spin_misses, __ATOMIC_RELAXED);
  return misses < 8 || (waits & 15) == 0;
}

// The spin; true if an event came.
static bool spin_for_event(ContextState& cs, Channel* ch) {
  uint64_t budget = spin_budget_ns();
  uint32_t misses = __atomic_load_n(&ch->spin_misses, __ATOMIC_RELAXED);
  uint64_t start = sv::monotonic_ns();
  uint64_t waited = 0;
  do {
    for (int i = 0; i < 32; ++i) {
      if (channel_has_event(cs, ch)) {
        // Caught, but only a quick catch counts as one.
        bool quick = waited < budget / 4;
        __atomic_store_n(&ch->spin_misses, quick ? 0 : std::min(misses + 1, 8u), __ATOMIC_RELAXED);
        return true;
      }
      __builtin_ia32_pause();
    }
    ::sched_yield();
    waited = sv::monotonic_ns() - start;
  } while (waited < budget);
  if (misses < 8) __atomic_store_n(&ch->spin_misses, misses + 1, __ATOMIC_RELAXED);
  return false;
}

// The signals a spin holds off: all but those a fault raises (delivered at
// once whatever the mask; blocking them would only obscure a crash).
static const sigset_t& spin_held_signals() {
  static const sigset_t set = [] {
    sigset_t m;
    sigfillset(&m);
    for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP}) sigdelset(&m, sig);
    return m;
  }();
  return set;
}

// True if a signal held off during the spin would have interrupted a read(2)
// of the channel's fd had the wait been asleep in it: one pending now, not
// blocked by the caller's own mask, caught by a handler installed without
// SA_RESTART (signal(7), "Interruption of system calls and library functions
// by signal handlers": such a read fails with EINTR; with SA_RESTART, or
// ignored, or stopping the process, it goes on).
static bool held_signal_interrupts(const sigset_t& caller_mask) {
  sigset_t pending;
  if (sigpending(&pending) != 0) return false;
  for (int sig = 1; sig < NSIG; ++sig) {
    if (sigismember(&pending, sig) != 1 || sigismember(&caller_mask, sig) == 1) continue;
    struct sigaction sa {};
    if (sigaction(sig, nullptr, &sa) != 0) continue;
    bool caught = (sa.sa_flags & SA_SIGINFO) || (sa.sa_handler != SIG_DFL && sa.sa_handler != SIG_IGN);
    if (caught && !(sa.sa_flags & SA_RESTART)) return true;
  }
  return false;
}

// Spins for an event with the caller's signals held off; EINTR if one that
// came meanwhile would have ended a read(2), else 0 (the caller goes on to
// read the fd). Without holding them, a signal taken during the spin ran its
// handler there and was gone, and the read after the spin slept on: a
// program that bounds its wait with one alarm(2), or whose handler sets the
// flag that ends its loop, waited for an event that might never come.
// rdma-core's plain read has that window too, but for the few instructions
// between the caller's last check and the read, not a 50 us spin (qperf
// covers that window by re-arming its SIGALRM every 10 ms after the first).
// Held off, the signal stays pending and is seen here; it is delivered when
// the mask is restored.
static int spin_with_signals_held(ContextState& cs, Channel* ch) {
  sigset_t caller;
  if (pthread_sigmask(SIG_BLOCK, &spin_held_signals(), &caller) != 0) return 0;
  bool caught = spin_for_event(cs, ch);
  bool interrupted = !caught && held_signal_interrupts(caller);
  pthread_sigmask(SIG_SETMASK, &caller, nullptr);  // a held signal is delivered here
  return interrupted ? EINTR : 0;
}

// Waits for an event on `channel` (ibv_get_cq_event(3)). The channel's socket is
// drained first and the CQs' notified flags scanned after, so a flag set
// while we scan is never lost; if more than one CQ fired, the fd is raised
// again so that it stays readable. A flag is set before its socket is
// raised (completion.h), so a drain after the spin saw a flag returns at once.
int ibv_get_cq_event(ibv_comp_channel* channel, ibv_cq** cq_out, void** cq_context) {
  ContextState& cs = ctx_state(channel->context);
  Channel* ch = to_channel(channel);
  if (spin_wanted(ch)) {
    if (int e = spin_with_signals_held(cs, ch)) {
      errno = e;
      return -1;
    }
  }
  for (;;) {
    int e = sv::wake_wait_once(channel->fd);  // EINTR ends the wait
    if (e && e != EAGAIN) {
      errno = e;
      return -1;
    }
    CqState* hit = nullptr;
    bool more = false;
    {
      std::lock_guard<std::mutex> g(cs.mu);
      for (CqState* s : cs.cqs) {
        if (s->channel != ch) continue;
        if (!hit) {
          if (s->view.hdr()->notified.exchange(0, std::memory_order_acq_rel)) hit = s;
        } else if (s->view.hdr()->notified.load(std::memory_order_acquire)) {
          more = true;
        }
      }
    }
    if (hit) {
      if (more) sv::wake_signal(ch->wake);
      *cq_out = hit->ibcq;
      *cq_context = hit->ibcq->cq_context;
      return 0;
    }
    if (cs.dead.load()) {
      errno = EIO;  // the device is gone
      return -1;
    }
    if (e == EAGAIN) {
      errno = EAGAIN;
      return -1;
    }
  }
}

void ibv_ack_cq_events(ibv_cq* cq, unsigned int nevents) {
  pthread_mutex_lock(&cq->mutex);
  cq->comp_events_completed += nevents;
  pthread_cond_signal(&cq->cond);
  pthread_mutex_unlock(&cq->mutex);
}

}  // extern "C"
