// transport.h: which path a QP's send work requests take, chosen when the
// QP is created, modified (RTR, RESET) or connected to its peer, and held as
// the QP's operations (ProcessQp::ops), as rdma-core's providers set their
// per-QP post functions when a QP is created or modified. ibv_post_send
// calls the QP's post_send without deciding anything per call.
//
//   shared memory  the peer is a QP of this user on this host: the posting
//                  process copies straight into its memory (requester.cc)
//   mediated       the peer is another user's QP: the daemon carries each
//                  request out with every key checked (requester_daemon.cc)
//   wire           the peer is on another host: the RoCEv2 engine carries
//                  it (roce_link.cc); a UD QP on the wire still reaches
//                  local destinations through shared memory
//   none           an XRC target QP has no send queue
//
// Every path validates each request once against the opcode rules of
// wr_rules.h.
#pragma once
#include <infiniband/verbs.h>

#include <cstdint>

namespace sv::shm {
struct SendWqe;
}

namespace sv::verbs {

struct ProcessQp;

// What carrying out one request did. kWait: nothing yet, and nothing
// reached the responder; the request stays at the head until
// ProcessQp::next_try_ns, which the execute set (a fault plan's delay), and
// no retry is counted.
enum class Step { kDone, kRnr, kRetry, kError, kWait };

struct Outcome {
  Step step;
  ibv_wc_status status = IBV_WC_SUCCESS;
  bool peer_error = false;  // the responder detected the error: it goes to ERR too
  uint32_t byte_len = 0;
};

struct QpOps {
  const char* path;  // "shared memory", "mediated", "wire", "none": for traces and tests
  // ibv_post_send; all_or_nothing: ibv_wr_complete (every request checked,
  // and room for all, before any runs).
  int (*post_send)(ProcessQp& q, ibv_send_wr* wr, ibv_send_wr** bad, bool all_or_nothing);
  // Carries out one request of the send queue (at post time or later, from
  // the progress thread), with the send lock held.
  Outcome (*execute)(ProcessQp& q, const shm::SendWqe& w);
};

// Sets q.ops from the QP's type, whether it is on the wire (roce_attached)
// and whether its peer is another user's (Peer::mediated). Called at
// create/import, by ibv_modify_qp at RTR and RESET, and when the requester
// (re)connects the QP to its peer (with the send lock held).
void choose_transport(ProcessQp& q);

// The daemon's part of the requester (requester_daemon.cc): binds and
// local invalidations, and every request to a mediated peer.
Outcome execute_local(ProcessQp& q, const shm::SendWqe& w);
Outcome execute_mediated(ProcessQp& q, const shm::SendWqe& w);

// Pipelined requests of a mediated RC QP (requester_daemon.cc), all with
// the send lock held. How many are in flight (sent, not yet off the send
// queue); reaping takes those the daemon finished off the queue and returns
// how many are still in flight; mediated_send sends `w` (already in the
// send queue after those in flight, or about to be pushed there) as the
// next of this process's run: 0 or an errno; draining waits for the
// daemon to finish them all (at most seconds, for a dead sharer's run).
uint64_t mediated_in_flight(const ProcessQp& q);
uint64_t mediated_reap(ProcessQp& q);
int mediated_send(ProcessQp& q, const shm::SendWqe& w);
void mediated_drain(ProcessQp& q);

}  // namespace sv::verbs
