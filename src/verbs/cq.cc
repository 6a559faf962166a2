// Completion queues and completion channels. A CQ is a ring in a shared
// segment: any process whose operations complete into it pushes entries
// (requesters for their sends, peers for receives), and pollers pop them.
// An armed CQ raises its channel's eventfd once per arming (IBTA 11.4.2.2).
#include <sched.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "common/completion.h"
#include "verbs/provider.h"

namespace sv::verbs {

int CqView::attach(int fd, uint64_t size) {
  if (size < 4096) return EINVAL;
  if (int e = map_shared(fd, 0, size, PROT_READ | PROT_WRITE, false, map)) return e;
  auto* h = map.as<shm::CqSegmentHeader>();
  // The segment is writable by other processes: check its geometry once.
  uint32_t cap = h->capacity;
  if (h->magic != shm::kCqMagic || h->size != size || cap == 0 || (cap & (cap - 1)) ||
      h->ring_offset != shm::CqLayout{cap}.ring_offset() || shm::CqLayout{cap}.size() > size)
    return EPROTO;
  auto* rh = reinterpret_cast<shm::RingHeader*>(map.as<char>() + h->ring_offset);
  if (rh->capacity != cap || rh->mask != cap - 1) return EPROTO;
  hdr = h;
  ring = shm::Ring<Cqe>(rh, reinterpret_cast<shm::RingSlot<Cqe>*>(rh + 1));
  return 0;
}

bool CqView::push(const ibv_wc& wc, bool solicited) {
  return shm::push_completion(hdr, ring, wc, solicited, channel_fd);
}

int poll_cq(ibv_cq* ibcq, int n, ibv_wc* wc) {
  if (n < 0) return -EINVAL;
  CqState* st = to_cq(ibcq)->st;
  int got = 0;
  Cqe e;
  while (got < n && st->view.ring.pop(e)) wc[got++] = e.wc;
  return got;
}

int req_notify_cq(ibv_cq* ibcq, int solicited_only) {
  CqState* st = to_cq(ibcq)->st;
  uint32_t want = solicited_only ? shm::kArmSolicited : shm::kArmAny;
  // Arming for any completion overrides an earlier solicited-only arming.
  uint32_t cur = st->view.hdr->armed.load(std::memory_order_relaxed);
  if (cur != shm::kArmAny) st->view.hdr->armed.store(want, std::memory_order_release);
  // The caller polls the CQ next: the arming must be visible before that
  // poll reads the ring (see push_completion in common/completion.h).
  std::atomic_thread_fence(std::memory_order_seq_cst);
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
  if (int e = cs.conn.call(proto::Op::CreateCq, req, rep, {}, &fds); e || fds.size() != 1) {
    errno = e ? e : EPROTO;
    return nullptr;
  }
  auto st = std::make_unique<CqState>();
  st->ctx = to_ctx(c);
  st->handle = rep.handle;
  st->channel = channel ? to_channel(channel) : nullptr;
  if (int e = st->view.attach(fds[0].get(), rep.segment_size)) {
    errno = e;
    return nullptr;
  }
  if (channel) st->view.channel_fd = channel->fd;
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
  cs.cqs.push_back(cq->st);
  cs.cq_handles[q.handle] = cq;
  return &q;
}


// ---- Extended CQs (ibv_create_cq_ex(3)) -------------------------------------

namespace {

CqState& ex_state(ibv_cq_ex* cq) { return *to_cq(reinterpret_cast<ibv_cq*>(cq))->st; }

int ex_take(ibv_cq_ex* cq) {
  CqState& st = ex_state(cq);
  if (!st.view.ring.pop(st.cur)) return ENOENT;
  timespec ts;
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  st.cur_ns = uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
  cq->status = st.cur.wc.status;
  cq->wr_id = st.cur.wc.wr_id;
  return 0;
}
int ex_start_poll(ibv_cq_ex* cq, ibv_poll_cq_attr* attr) {
  if (attr && attr->comp_mask) return EINVAL;
  return ex_take(cq);
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
  sv::Fd efd;
  if (int e = sv::make_eventfd(efd)) {
    errno = e;
    return nullptr;
  }
  proto::Empty req{};
  proto::HandleReply rep{};
  int fds[1] = {efd.get()};
  if (int e = cs.conn.call(proto::Op::CreateChannel, req, rep, fds)) {
    errno = e;
    return nullptr;
  }
  auto* ch = static_cast<Channel*>(std::calloc(1, sizeof(Channel)));
  if (!ch) {
    errno = ENOMEM;
    return nullptr;
  }
  ch->ch.context = c;
  ch->ch.fd = efd.release();
  ch->ch.refcnt = 0;
  ch->handle = rep.handle;
  ch->ctx = to_ctx(c);
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
  if (int e = destroy_result(cs, cs.conn.call(proto::Op::DestroyChannel, req, rep))) {
    errno = e;
    return e;
  }
  ::close(channel->fd);
  std::free(ch);
  return 0;
}

ibv_cq* ibv_create_cq(ibv_context* c, int cqe, void* cq_context, ibv_comp_channel* channel, int comp_vector) {
  return create_cq(c, cqe, cq_context, channel, comp_vector);
}

int ibv_destroy_cq(ibv_cq* ibcq) {
  Cq* cq = to_cq(ibcq);
  ContextState& cs = ctx_state(ibcq->context);
  proto::HandleReq req{};
  req.handle = cq->st->handle;
  proto::Empty rep{};
  if (int e = destroy_result(cs, cs.conn.call(proto::Op::DestroyCq, req, rep))) return e;
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

int ibv_resize_cq(ibv_cq*, int) { return EOPNOTSUPP; }

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
    if (s->channel == ch && s->view.hdr->notified.load(std::memory_order_acquire)) return true;
  return false;
}

// Spins up to the budget for an event before the caller blocks. Adaptive:
// after 8 waits in a row that the spin did not catch quickly (the partner
// is slow, spinning only burns a CPU), it spins on one wait in 16 only, to
// notice when the partner is fast again. The spin yields the CPU between
// rounds: when the CPUs are oversubscribed the partner may be waiting for
// this very CPU, and a spin that holds it would delay the event it awaits.
static void spin_for_event(ContextState& cs, Channel* ch) {
  uint64_t budget = spin_budget_ns();
  if (budget == 0) return;
  // Relaxed atomics: threads sharing a channel only need a rough count.
  uint32_t waits = __atomic_add_fetch(&ch->waits, 1, __ATOMIC_RELAXED);
  uint32_t misses = __atomic_load_n(&ch->spin_misses, __ATOMIC_RELAXED);
  if (misses >= 8 && (waits & 15) != 0) return;
  uint64_t start = sv::monotonic_ns();
  uint64_t waited = 0;
  do {
    for (int i = 0; i < 32; ++i) {
      if (channel_has_event(cs, ch)) {
        // Caught, but only a quick catch counts as one.
        bool quick = waited < budget / 4;
        __atomic_store_n(&ch->spin_misses, quick ? 0 : std::min(misses + 1, 8u), __ATOMIC_RELAXED);
        return;
      }
      __builtin_ia32_pause();
    }
    ::sched_yield();
    waited = sv::monotonic_ns() - start;
  } while (waited < budget);
  if (misses < 8) __atomic_store_n(&ch->spin_misses, misses + 1, __ATOMIC_RELAXED);
}

// Waits for an event on `channel` (ibv_get_cq_event(3)). The eventfd is
// drained first and the CQs' notified flags scanned after, so a flag set
// while we scan is never lost; if more than one CQ fired, the fd is raised
// again so that it stays readable. A flag is set before its eventfd is
// raised (completion.h), so a drain after the spin saw a flag returns at once.
int ibv_get_cq_event(ibv_comp_channel* channel, ibv_cq** cq_out, void** cq_context) {
  ContextState& cs = ctx_state(channel->context);
  Channel* ch = to_channel(channel);
  spin_for_event(cs, ch);
  for (;;) {
    uint64_t v;
    int e = sv::eventfd_drain(channel->fd, &v);
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
          if (s->view.hdr->notified.exchange(0, std::memory_order_acq_rel)) hit = s;
        } else if (s->view.hdr->notified.load(std::memory_order_acquire)) {
          more = true;
        }
      }
    }
    if (hit) {
      if (more) sv::eventfd_signal(channel->fd);
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
