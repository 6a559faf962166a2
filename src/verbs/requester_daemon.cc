// The requester's requests that the daemon carries out: binds of type 2
// windows and local invalidations (IBTA 10.6.7.2.5, 10.6.7.3), which act on
// this side only, and every request of a QP whose peer belongs to another
// user (the mediated path, transport.h), which the daemon executes between
// the two processes' memory with every key checked (daemon/mediation.cc).
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/trace.h"

#include "verbs/provider.h"
#include "verbs/requester_internal.h"
#include "verbs/transport.h"
#include "verbs/wr_rules.h"

namespace sv::verbs {

// Binds and local invalidations act on this side only (no peer needed).
Outcome execute_local(ProcessQp& q, const shm::SendWqe& w) {
  ContextState& cs = *q.ctx->st;
  if (w.opcode == IBV_WR_BIND_MW) {
    const MrEntry* me = cs.mr(w.mr_key);
    ibv_mw_bind_info b{};
    b.addr = w.remote_addr;
    b.length = w.compare_add;
    b.mw_access_flags = w.mw_access;
    ibv_mr fake{};
    fake.lkey = w.mr_key;
    b.mr = me ? &fake : nullptr;
    if (daemon_bind(q, w.mw_handle, w.rkey, b, nullptr)) return {Step::kError, IBV_WC_MW_BIND_ERR};
    return {Step::kDone};
  }
  proto::InvalidateReq req{};
  req.key = w.invalidate_rkey;
  req.qpn = q.qpn;
  proto::Empty rep{};
  if (cs.conn.call<proto::Op::InvalidateKey>(req, rep)) return {Step::kError, IBV_WC_MW_BIND_ERR};
  return {Step::kDone};
}

namespace {

// The request for `w`: false when its inline payload (not captured yet)
// is longer than a request carries.
bool mediate_request(ProcessQp& q, const shm::SendWqe& w, proto::MediateReq& req) {
  req.qpn = q.qpn;
  req.opcode = w.opcode;
  req.send_flags = w.send_flags & ~kInlineCaptured;
  req.imm_data = w.imm_data;
  req.remote_addr = w.remote_addr;
  req.rkey = w.rkey;
  req.compare_add = w.compare_add;
  req.swap = w.swap;
  req.num_sge = w.num_sge;
  std::memcpy(req.sge, w.sge, sizeof(req.sge));
  if (!(w.send_flags & IBV_SEND_INLINE)) return true;
  // The payload travels in the request: it need not be registered.
  if (w.send_flags & kInlineCaptured) {
    req.inline_len = w.inline_len;
    std::memcpy(req.inline_data, w.inline_data, w.inline_len);
    return true;
  }
  for (uint32_t i = 0; i < w.num_sge; ++i) {
    if (req.inline_len + w.sge[i].length > shm::kMaxInline) return false;
    std::memcpy(req.inline_data + req.inline_len, reinterpret_cast<const void*>(w.sge[i].addr), w.sge[i].length);
    req.inline_len += w.sge[i].length;
  }
  return true;
}

}  // namespace

// A peer of another user (system daemon): the daemon carries the operation
// out between the two processes' memory with every key checked
// (daemon/mediation.cc); one round trip for this work request.
Outcome execute_mediated(ProcessQp& q, const shm::SendWqe& w) {
  proto::MediateReq req{};
  if (!mediate_request(q, w, req)) return {Step::kError, IBV_WC_LOC_LEN_ERR};
  proto::MediateReply rep{};
  if (q.ctx->st->conn.call<proto::Op::Mediate>(req, rep)) return {Step::kRetry};
  switch (rep.outcome) {
    case proto::kMediateDone: return {Step::kDone, IBV_WC_SUCCESS, false, rep.byte_len};
    case proto::kMediateRnr: return {Step::kRnr};
    case proto::kMediateRetry: return {Step::kRetry};
    default: return {Step::kError, ibv_wc_status(rep.wc_status), rep.peer_error != 0};
  }
}

// ---- Pipelined requests (Op::MediatePost; docs/PERFORMANCE.md) -------------
//
// A mediated RC QP's requests are sent without waiting for the daemon, a
// run of them at a time, and stay at the head of the send queue (counted
// against its depth) until the daemon's counts in the QP segment say they
// are finished; their completions the daemon pushes into the send CQ
// itself. The connection keeps them in order. A run belongs to the process
// that sent it (med_pid): another sharer's requests wait until it is over,
// since they would travel on another connection. All of it under send_lock.

uint64_t mediated_in_flight(const ProcessQp& q) {
  const shm::QpSegmentHeader& h = *q.hdr;
  return h.med_pid.load(std::memory_order_relaxed) ? h.med_sent - h.med_popped : 0;
}

uint64_t mediated_reap(ProcessQp& q) {
  shm::QpSegmentHeader& h = *q.hdr;
  if (!h.med_pid.load(std::memory_order_relaxed)) return 0;
  // The daemon counts a request done before it pushes its completion
  // (Registry::posted_outcome): a slot whose completion was polled is free.
  // `finished` (the run's end) it counts after.
  const uint64_t finished = h.med_finished.load(std::memory_order_acquire) - h.med_base_finished;
  const uint64_t done = h.med_done.load(std::memory_order_acquire) - h.med_base_done;
  for (shm::SendWqe gone; h.med_popped < std::min(done, h.med_sent) && q.sq.pop(gone);) ++h.med_popped;
  if (finished < h.med_sent) return h.med_sent - h.med_popped;
  // The run is over. What the daemon sent back unexecuted (RNR, responder
  // not ready) is at the head of the queue, unsent again: the head goes
  // alone, with its retry timer (execute_mediated), before another run.
  q.med_sync_head = h.med_popped < h.med_sent;
  if (!q.med_sync_head) q.next_try_ns = 0;
  h.med_pid.store(0, std::memory_order_relaxed);
  if (q.entry->state.load(std::memory_order_acquire) == IBV_QPS_ERR) {
    // A request of the run failed and the daemon moved the QP to ERR: what
    // waits in its queues is flushed, as after a failure on the other paths.
    bool known;
    {
      std::lock_guard<std::mutex> g(q.attr_mu);
      known = q.attr.qp_state == IBV_QPS_ERR;
    }
    if (!known) move_to_error(q);
  }
  return 0;
}

int mediated_send(ProcessQp& q, const shm::SendWqe& w) {
  shm::QpSegmentHeader& h = *q.hdr;
  proto::MediateReq req{};
  if (!mediate_request(q, w, req)) return EINVAL;
  DaemonConn& conn = q.ctx->st->conn;
  if (!h.med_pid.load(std::memory_order_relaxed)) {  // a new run (nothing in flight: the counts stand still)
    // The connection is named before anything of the run is sent on it (a
    // forked child's own is made here): a sharer that finds us dead asks
    // the daemon about this one (reclaim_dead_run).
    const uint32_t client = conn.client_id();
    if (!client) return ENODEV;
    ++h.med_epoch;
    h.med_base_finished = h.med_finished.load(std::memory_order_acquire);
    h.med_base_done = h.med_done.load(std::memory_order_relaxed);
    h.med_sent = h.med_popped = 0;
    h.med_client = client;
    h.med_pid.store(self_pid(), std::memory_order_relaxed);
  }
  req.epoch = h.med_epoch;
  req.wr_id = w.wr_id;
  if (int e = conn.post<proto::Op::MediatePost>(req)) {
    if (h.med_sent == 0) h.med_pid.store(0, std::memory_order_relaxed);
    return e;
  }
  ++h.med_sent;
  return 0;
}

// How often a sharer asks the daemon whether a dead sender's run can
// still finish (Op::MediateGone).
constexpr uint64_t kGoneAskNs = 1'000'000;

// A run whose sender died (another process sharing the QP) never finishes
// what the daemon dropped with its connection. Once the daemon says that
// connection can finish nothing more (it has dropped it: every outcome of
// the run the daemon will ever write is in the counts and the CQ), the
// rest completes in error, as a request a killed poster was running does
// (complete_dead_run), and the other holders go on. Asking the daemon, not
// waiting a while, is what keeps a completion from coming twice when the
// daemon is slow to work through the dead connection's requests
// (MediationPipeline.ASharerKilledMidRunWhileTheDaemonStalls...).
void reclaim_dead_run(ProcessQp& q) {
  shm::QpSegmentHeader& h = *q.hdr;
  const uint32_t pid = h.med_pid.load(std::memory_order_relaxed);
  if (!pid || pid == self_pid() || ::kill(pid_t(pid), 0) == 0 || errno != ESRCH) return;
  const uint64_t now = monotonic_ns();
  if (now - q.med_asked_ns < kGoneAskNs || mediated_reap(q) == 0) return;
  q.med_asked_ns = now;
  proto::MediateGoneReq req{};
  req.qpn = q.qpn;
  req.client = h.med_client;
  proto::Empty rep{};
  if (q.ctx->st->conn.call<proto::Op::MediateGone>(req, rep) != 0) return;  // EBUSY: it still may
  if (mediated_reap(q) == 0) return;  // what it finished meanwhile
  for (shm::SendWqe w; h.med_popped < h.med_sent && q.sq.pop(w); ++h.med_popped) {
    ibv_wc wc{};
    wc.wr_id = w.wr_id;
    wc.status = IBV_WC_GENERAL_ERR;
    wc.opcode = send_wc_opcode(w.opcode);
    wc.qp_num = q.qpn;
    q.send_cq->st->view.push(wc, true);
  }
  h.med_pid.store(0, std::memory_order_relaxed);
}

void mediated_drain(ProcessQp& q) {
  if (!mediated_reap(q)) return;
  if (q.hdr->med_pid.load(std::memory_order_relaxed) == self_pid()) {
    // Our own run: the reply to any later request of this connection comes
    // after the daemon has finished it.
    proto::NetnsMsg req{};
    req.flags = proto::kNetnsQuery;
    proto::NetnsMsg rep{};
    q.ctx->st->conn.call<proto::Op::Netns>(req, rep);
  }
  // Another sharer's run: its daemon works through it on its connection.
  ContextState& cs = *q.ctx->st;
  for (uint64_t until = monotonic_ns() + 5'000'000'000ull;
       mediated_reap(q) && !cs.dead.load(std::memory_order_relaxed) && monotonic_ns() < until;) {
    reclaim_dead_run(q);
    ::usleep(50);
  }
  if (mediated_in_flight(q)) {  // the daemon or the run's sender is gone: left to the caller as unsent
    SV_TRACE("QP 0x%x: %llu pipelined requests never finished", q.qpn, (unsigned long long)mediated_in_flight(q));
    q.hdr->med_pid.store(0, std::memory_order_relaxed);
  }
}

// ---- Posting --------------------------------------------------------------

// Pipelined requests (requester_daemon.cc): a mediated RC QP's request `w`
// may be sent without waiting for the daemon when its peer is attached,
// nothing of the QP waits for a retry, the run in flight (if any) is this
// process's, and the QP is not in ERR. Local operations (binds, local
// invalidations) go alone, once the run is over.
bool may_pipeline(ProcessQp& q, const shm::SendWqe& w) {
  if (q.type != IBV_QPT_RC || q.ops.load(std::memory_order_relaxed)->execute != execute_rc_mediated) return false;
  const Peer* p = q.peer.get();
  if (!p || !p->mediated || p->qpn != q.entry->dest_qpn.load(std::memory_order_relaxed)) return false;
  if (wr_rule(w.opcode).kind == WrKind::kLocal || q.med_sync_head || q.head_started) return false;
  const uint32_t pid = q.hdr->med_pid.load(std::memory_order_relaxed);
  if (pid && pid != self_pid()) return false;
  return q.entry->state.load(std::memory_order_acquire) != IBV_QPS_ERR;
}

// How long the progress thread leaves a run in flight before it looks
// again (a returned request waits this long at most for its retry).
constexpr uint64_t kRunLookNs = 1'000'000;

// The progress thread's part: what the daemon finished leaves the queue,
// what waits behind the run is sent when it may be. True while requests
// are in flight (look again later).
bool pipeline_queued(ProcessQp& q) {
  if (mediated_reap(q)) reclaim_dead_run(q);
  for (uint64_t n; (n = mediated_in_flight(q)) < q.sq.size();) {
    const shm::SendWqe& w = q.sq.at(q.sq.head() + n);
    if (!may_pipeline(q, w) || mediated_send(q, w) != 0) break;
  }
  if (!mediated_in_flight(q)) return false;
  q.next_try_ns = monotonic_ns() + kRunLookNs;
  return true;
}

bool pipelines_now(ProcessQp& q, const shm::SendWqe& w) {
  if (!may_pipeline(q, w)) return false;
  if (q.sq.size() >= q.cap.max_send_wr) mediated_reap(q);  // full: what the daemon finished makes room
  return may_pipeline(q, w) && q.sq.size() == mediated_in_flight(q);  // nothing unsent waits before it
}

// A request sent to the daemon without waiting (may_pipeline), in the send
// queue until the daemon has finished it: the queue's depth counts it.
int post_pipelined(ProcessQp& q, shm::SendWqe& w, bool& queued) {
  if (q.sq.size() >= q.cap.max_send_wr) return ENOMEM;
  capture_inline(w);
  if (int e = mediated_send(q, w)) return e;
  if (!q.sq.push(w)) return ENOMEM;  // not reached: room was checked
  // The progress thread looks at the run now and then: a request the
  // daemon sends back (RNR) is retried even if nothing more is posted.
  queued = true;
  return 0;
}

}  // namespace sv::verbs
