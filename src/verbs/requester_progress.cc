// The send queue's progress (ibv_post_send(3)'s requests that wait): a
// stalled head request's retries (IBTA 9.7.5.2.8 RNR, 9.7.6.1.3 timeouts),
// the progress thread's run over a queue, and what a sharer killed while
// holding the send lock left behind (a torn receive, a request carried out
// but not completed), and how a request's completion is published. The
// requests themselves are requester.cc's.
#include <csignal>
#include <cstring>

#include "common/trace.h"
#include "verbs/provider.h"
#include "verbs/requester_internal.h"
#include "verbs/transport.h"
#include "verbs/wr_rules.h"

namespace sv::verbs {
namespace {

// IBTA 9.7.5.2.8 table 45: RNR NAK timer field (min_rnr_timer) in microseconds x 100.
constexpr uint32_t kRnrTimer10us[32] = {65536, 1,    2,    3,    4,    6,    8,     12,    16,   24,   32,
                                        48,    64,   96,   128,  192,  256,  384,   512,   768,  1024, 1536,
                                        2048,  3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768, 49152};

uint64_t retry_delay_ns(ProcessQp& q, Step s) {
  if (s == Step::kRnr) {
    uint32_t code = !q.peer ? 0 : q.peer->mediated ? q.peer->min_rnr_timer : q.peer->entry->min_rnr_timer;
    return uint64_t(kRnrTimer10us[code & 31]) * 10'000;
  }
  uint32_t t = q.entry->timeout;
  if (t == 0) return 1'000'000;  // "infinite": keep trying every millisecond
  return 4096ull << std::min<uint32_t>(t, 31);  // 4.096 us x 2^timeout (IBTA 9.7.6.1.3)
}

}  // namespace

// `owed`: a record of this completion (sq_running), cleared as it is
// published, or at once when it cannot be.
void push_send_completion(ProcessQp& q, uint64_t wr_id, ibv_wc_opcode op, ibv_wc_status status, uint32_t len,
                          shm::OwedRecord owed) {
  ibv_wc wc{};
  wc.wr_id = wr_id;
  wc.status = status;
  wc.opcode = op;
  wc.byte_len = len;
  wc.qp_num = q.qpn;
  if (!q.send_cq->st->view.push(wc, true, owed)) owed.clear();
}

// Completes a request. The record that the request at the head of the send
// queue is being carried out (sq_running) is cleared as its completion is
// published (no completion for an unsignaled success: at once), so that a
// poster killed at any instruction leaves the next holder of the send lock
// either the completion or the record (complete_dead_run), not neither.
// Requests that never entered the queue have no record: sq_running is 0.
void complete(ProcessQp& q, const shm::SendWqe& w, ibv_wc_status status, uint32_t len) {
  bool signaled = q.sq_sig_all || (w.send_flags & IBV_SEND_SIGNALED);
  if (status == IBV_WC_SUCCESS && !signaled) {
    q.hdr->sq_running.store(0, std::memory_order_relaxed);
    return;
  }
  push_send_completion(q, w.wr_id, send_wc_opcode(w.opcode), status, len, &q.hdr->sq_running);
}

// Decides what a stalled head request does next; returns false when it failed for good.
bool stall(ProcessQp& q, Step s) {
  uint64_t now = monotonic_ns();
  SV_TRACE("QP 0x%x: %s stall (rnr left %u, retry left %u)", q.qpn,
           s == Step::kRnr ? "RNR" : s == Step::kWait ? "planned delay" : "transport",
           q.rnr_left, q.retry_left);
  if (!q.head_started) {
    q.head_started = true;
    q.rnr_left = q.entry->rnr_retry;
    q.retry_left = q.entry->retry_cnt;
  }
  if (s == Step::kWait) [[unlikely]]
    return true;  // the execute set next_try_ns
  if (s == Step::kRnr) {
    if (q.rnr_left != 7) {  // 7 means retry forever (IBTA 9.7.5.2.8)
      if (q.rnr_left == 0) return false;
      q.rnr_left--;
    }
  } else if (q.entry->timeout != 0) {
    if (q.retry_left == 0) return false;
    q.retry_left--;
  }
  q.next_try_ns = now + retry_delay_ns(q, s);
  return true;
}

// Called with the send lock held. A torn receive (see pop_peer_recv) under
// a lock we hold means its previous holder, another process sharing this QP,
// was killed mid-delivery and we took the lock over: the responder gets that
// receive back as aborted rather than never.
void complete_torn_receive(ProcessQp& q) {
  uint32_t qpn = q.hdr->torn_qpn.load(std::memory_order_acquire);
  if (qpn == 0) return;
  Peer* p = q.type == IBV_QPT_UD ? ud_peer(q, qpn) : resolve_peer(q);
  if (p && !p->mediated && p->qpn == qpn) {
    uint64_t wr_id = q.hdr->torn_wr_id;
    if (!q.hdr->torn_taken.load(std::memory_order_acquire)) {
      // Killed between the record and the copy: the receive is still in
      // the slot if the claim was made (else nothing was taken).
      shm::RecvWqe r;
      uint64_t pos = q.hdr->torn_pos;
      uint32_t pid = q.hdr->torn_pid;
      if (!(p->srq_hdr ? p->srq.reclaim_dead_take(pos, pid, r) : p->rq.reclaim_dead_take(pos, pid, r))) {
        q.hdr->torn_qpn.store(0, std::memory_order_release);
        return;
      }
      wr_id = r.wr_id;
    }
    ibv_wc wc{};
    wc.wr_id = wr_id;
    wc.status = IBV_WC_REM_ABORT_ERR;
    wc.opcode = IBV_WC_RECV;
    wc.qp_num = qpn;
    wc.src_qp = q.qpn;
    if (p->recv_cq.push(wc, true, &q.hdr->torn_qpn)) return;  // as push_recv_completion
  }
  q.hdr->torn_qpn.store(0, std::memory_order_release);
}

// Called with the send lock held: a queued request whose execution the
// previous holder of the lock did not finish (it was killed: sq_running) is
// completed in error, not carried out twice.
// The holder may have died before it took the request off the queue (it is
// still the head), or after (the head moved past it, or front() passes over
// its claim now): the slot still holds the request either way, as no
// producer reaches it before the next lap.
void complete_dead_run(ProcessQp& q) {
  uint64_t r = q.hdr->sq_running.load(std::memory_order_relaxed);
  if (!r) return;
  const shm::SendWqe* head = q.sq.front();
  shm::SendWqe w;
  if (head && q.sq.head() + 1 == r) {
    w = *head;
    shm::SendWqe gone;
    q.sq.pop(gone);
  } else if (q.sq.head() == r) {
    w = q.sq.at(r - 1);
  } else {
    q.hdr->sq_running.store(0, std::memory_order_relaxed);
    return;
  }
  q.head_started = false;
  q.next_try_ns = 0;
  push_send_completion(q, w.wr_id, send_wc_opcode(w.opcode), IBV_WC_GENERAL_ERR, 0, &q.hdr->sq_running);
}

// Runs queued requests in order; the caller holds the send lock.
bool progress_qp(ProcessQp& q) {
  complete_torn_receive(q);
  complete_dead_run(q);
  for (;;) {
    if ((q.hdr->med_pid.load(std::memory_order_relaxed) || q.peer) && pipeline_queued(q)) return true;
    const shm::SendWqe* head = q.sq.front();
    if (!head) return false;
    if (q.entry->state.load(std::memory_order_acquire) == IBV_QPS_ERR) {
      flush_sq_locked(q);
      return false;
    }
    if (monotonic_ns() < q.next_try_ns) return true;
    shm::SendWqe w = *head;
    q.hdr->sq_running.store(q.sq.head() + 1, std::memory_order_relaxed);
    Outcome o = run(q, w);
    if (o.step == Step::kRnr || o.step == Step::kRetry || o.step == Step::kWait) {
      // Nothing reached the responder: the request stays at the head.
      q.hdr->sq_running.store(0, std::memory_order_relaxed);
      if (stall(q, o.step)) return true;
      shm::SendWqe gone;
      q.sq.pop(gone);
      fail(q, w, {Step::kError, o.step == Step::kRnr ? IBV_WC_RNR_RETRY_EXC_ERR : IBV_WC_RETRY_EXC_ERR});
      return false;
    }
    shm::SendWqe gone;
    q.sq.pop(gone);
    if (__builtin_expect(g_die_at == 3, 0)) ::raise(SIGKILL);  // test hook (srq.cc)
    q.head_started = false;
    q.med_sync_head = false;
    q.next_try_ns = 0;
    // sq_running is cleared as the completion is published (complete()).
    if (o.step == Step::kError) {
      fail(q, w, o);
      return false;
    }
    complete(q, w, IBV_WC_SUCCESS, o.byte_len);
  }
}

// IBV_SEND_INLINE's payload, copied into the WQE before it waits.
void capture_inline(shm::SendWqe& w) {
  if (!(w.send_flags & IBV_SEND_INLINE) || (w.send_flags & kInlineCaptured)) return;
  uint32_t off = 0;
  for (uint32_t i = 0; i < w.num_sge; ++i) {
    std::memcpy(w.inline_data + off, reinterpret_cast<const void*>(w.sge[i].addr), w.sge[i].length);
    off += w.sge[i].length;
  }
  w.inline_len = off;
  w.send_flags |= kInlineCaptured;
}

}  // namespace sv::verbs
