// The registry's tables as mediation sees them (MediationTables in
// mediation.h): the few lookups and actions a mediated operation needs, so
// that daemon/mediation.cc never touches the registry's maps.
#include "daemon/registry.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>

#include "common/opcode_rules.h"

namespace sv::daemon {

using namespace shm;

bool Registry::requester_qp(uint32_t client, uint32_t qpn, QpView& out) {
  const Qp* q = qp_.find(client, qpn);
  if (!q) return false;
  out = {q->type, q->pd, q->recv_cq};
  return true;
}

bool Registry::responder_qp(uint32_t qpn, QpView& out) {
  auto it = qp_.table().find(qpn);
  if (it == qp_.table().end()) return false;
  out = {it->second.type, it->second.pd, it->second.recv_cq};
  return true;
}

uint32_t Registry::mr_backing(uint32_t client, uint32_t handle) const {
  const Mr* m = mr_.table().owned(handle, ctx(client));
  return m ? m->backing : 0;
}

// The registrant is named by its pid and the identity of its struct pid
// (MrEntry::owner_identity): a later client at the same pid is another.
std::shared_ptr<const OdpMemory> Registry::odp_memory(uint32_t pid, uint64_t identity, int* pidfd, uid_t* uid) const {
  for (const auto& [id, c] : clients_) {
    if (uint32_t(c.pid) != pid || c.identity != identity || !c.odp_memory) continue;
    if (!c.pidfd.valid() || !pidfd_alive(c.pidfd.get())) return nullptr;
    if (pidfd) *pidfd = c.pidfd.get();
    if (uid) *uid = c.uid;
    return c.odp_memory;
  }
  return nullptr;
}

// The file the library of user `uid` locks for RDMA atomics on ODP memory
// (verbs/context.cc, open_odp_lock): the user's device segment, which is
// the user's own (device_tables.cc), opened anew (a flock belongs to an
// open file description).
int Registry::odp_lock(uid_t uid, Fd& out) {
  int err = 0;
  const int seg = tables_.segment_fd(uid, err);
  if (seg < 0) return err ? err : ENOLCK;
  char path[64];
  std::snprintf(path, sizeof path, "/proc/self/fd/%d", seg);
  out.reset(::open(path, O_RDONLY | O_CLOEXEC));
  return out.valid() ? 0 : ENOLCK;
}

uint32_t Registry::mr_odp_owner(uint32_t client, uint32_t handle) const {
  const Mr* m = mr_.table().owned(handle, ctx(client));
  if (!m) return 0;
  const MrEntry& e = tables_.mr_at(handle);
  return e.backing == kOdpBacking ? e.owner_pid : 0;
}

int Registry::backing_fd(uint32_t backing) const {
  auto b = backings_.table().find(backing);
  return b == backings_.table().end() ? -1 : b->second.fd.get();
}

bool Registry::receive_queue(uint32_t qpn, RecvQueue& out) { return qp_.receive_queue(qpn, out); }

void Registry::srq_limit_reached(uint32_t srq) {
  auto s = srq_.table().find(srq);
  if (s == srq_.table().end()) return;
  for (uint32_t id : clients_of(s->second.owner)) events_.push_back({id, IBV_EVENT_SRQ_LIMIT_REACHED, srq});
}

void Registry::flush_receives(uint32_t qpn) {
  auto it = qp_.table().find(qpn);
  if (it != qp_.table().end()) qp_.flush_rq(it->second, qpn);
}

int Registry::invalidate_remote(uint32_t client, uint32_t qpn, uint32_t key) {
  proto::InvalidateReq r{};
  r.key = key;
  r.qpn = qpn;
  r.remote = 1;
  if (!qp_.find(client, qpn)) return EINVAL;
  return mr_.invalidate(client, r);
}

// ---- Pipelined requests (Op::MediatePost) -----------------------------------
//
// The library sends a QP's requests one after another without waiting
// (verbs/requester_daemon.cc); this connection's requests are read and run
// in order, so a QP's run in order too. What a reply would say goes to the
// QP's segment (the counts, which only the daemon writes and never reads
// back) and to its send CQ (a completion where one is due: every error, a
// signaled success). A request that fails stops the rest of its run
// (its epoch): they complete flushed, the QP being in ERR (IBTA 10.3.1); one
// that stalls (RNR, responder not ready) sends the rest back unexecuted, so
// the library retries them in order. Every check is mediate()'s.

namespace {

enum MedStop : uint8_t { kRunGoes = 0, kRunReturns = 1, kRunFlushes = 2 };

proto::MediateReply posted_error(ibv_wc_status st) {
  proto::MediateReply rep{};
  rep.outcome = proto::kMediateError;
  rep.wc_status = st;
  return rep;
}

}  // namespace

int Registry::mediate_posted(uint32_t client, Qp& qp, const proto::MediateReq& req,
                             std::unique_ptr<MediationJob>* defer) {
  Qp* q = &qp;
  if (q->type != IBV_QPT_RC) return EINVAL;  // nothing to count it against: the sender's own loss
  const bool signaled = (req.send_flags & IBV_SEND_SIGNALED) || q->sq_sig_all;
  if (q->med_stop != kRunGoes && q->med_stop_epoch == req.epoch) {
    proto::MediateReply rep = posted_error(IBV_WC_WR_FLUSH_ERR);
    if (q->med_stop == kRunReturns) rep.outcome = proto::kMediateRetry;
    posted_outcome(*q, req.qpn, req.wr_id, req.opcode, signaled, req.epoch, rep);
    return 0;
  }
  q->med_stop = kRunGoes;
  if (ibv_qp_state(qp_.slot(req.qpn).state.load()) == IBV_QPS_ERR) {
    posted_outcome(*q, req.qpn, req.wr_id, req.opcode, signaled, req.epoch, posted_error(IBV_WC_WR_FLUSH_ERR));
    return 0;
  }
  proto::MediateReply rep{};
  if (mediation_.mediate_as(client, {q->type, q->pd, q->recv_cq}, req, rep, defer) != 0)
    rep = posted_error(IBV_WC_LOC_QP_OP_ERR);
  if (defer && *defer) {  // its copy goes to the worker: finish_posted() ends it
    MediationJob& job = **defer;
    job.posted = true;
    job.epoch = req.epoch;
    job.wr_id = req.wr_id;
    job.signaled = signaled;
    return 0;
  }
  posted_outcome(*q, req.qpn, req.wr_id, req.opcode, signaled, req.epoch, rep);
  return 0;
}

void Registry::finish_posted(MediationJob& job) {
  proto::MediateReply rep{};
  if (mediation_.finish(job, rep) != 0) rep = posted_error(IBV_WC_LOC_QP_OP_ERR);
  Qp* q = qp_.find(job.client, job.requester_qpn);
  if (!q) return;  // the QP is gone, and whoever would count on it
  posted_outcome(*q, job.requester_qpn, job.wr_id, job.opcode, job.signaled, job.epoch, rep);
}

// Whether `sender` can still finish requests on the QP: not once its
// connection is gone (remove_client ran; a copy still at the worker finds
// no QP in finish_posted) or it holds the QP no more. The loop answers this
// between two requests, so a "gone" follows every outcome the sender's
// requests will ever have (registry_mediation's posted_outcome).
int Registry::mediate_gone(const Qp& q, uint32_t sender) { return QueuePairs::holds(q, ctx(sender)) ? EBUSY : 0; }

// The slot first, then the completion, then the run's end: a request's
// slot is free before its completion can be polled (an application posts
// again as soon as it has polled one, ibv_poll_cq(3): the completion once
// came first and that post found the queue full), and a requester that
// sees its run finished finds every completion of it in the CQ.
void Registry::posted_outcome(Qp& q, uint32_t qpn, uint64_t wr_id, uint32_t opcode, bool signaled, uint32_t epoch,
                              const proto::MediateReply& rep) {
  auto* h = q.map.as<QpSegmentHeader>();
  count_mediated(qpn, opcode, rep);
  ++q.med_finished;
  const bool error = rep.outcome == proto::kMediateError;
  if (rep.outcome == proto::kMediateDone || error) {
    ++q.med_done;
    h->med_done.store(q.med_done, std::memory_order_release);
    if (error || signaled) {
      ibv_wc wc{};
      wc.wr_id = wr_id;
      wc.status = error ? ibv_wc_status(rep.wc_status) : IBV_WC_SUCCESS;
      wc.opcode = rules::send_completion_opcode(opcode);
      wc.byte_len = error ? 0 : rep.byte_len;
      wc.qp_num = qpn;
      cq_.push(q.send_cq, wc, true);
    }
    if (error) {
      qp_.slot(qpn).state.store(IBV_QPS_ERR, std::memory_order_release);
      q.med_stop = kRunFlushes;
      q.med_stop_epoch = epoch;
    }
  } else {  // RNR, or the responder not ready: back to the requester, with the rest of the run
    q.med_stop = kRunReturns;
    q.med_stop_epoch = epoch;
  }
  h->med_finished.store(q.med_finished, std::memory_order_release);
}

}  // namespace sv::daemon
