// roce_link.h: QPs whose peer is on another host, over RoCEv2 (docs/ROCE.md).
//
// When a RC or UC QP moves to RTR with an address vector whose destination
// GID is not one of this host's, or a UD QP moves to RTR while the daemon
// owns the RoCEv2 port, the QP is attached to the daemon's UDP port 4791
// (RoceAttach) and from then on runs the transport engine of src/roce in
// this process: post_send hands work requests to the engine (which sends
// directly on the daemon's socket), the daemon forwards arriving datagrams
// for the QPN to this process, and one thread here (the RoCE thread) feeds
// them to the engine, runs its timers and pushes its completions into the
// CQ rings. Receive WQEs are still posted to the QP's receive ring; the
// engine takes them from there. QPs whose peer is local keep the
// shared-memory path unchanged.
//
// Thread safety: every function may be called from any thread; one mutex
// (per process) serialises all engines, the RoCE thread included. An
// attached QP must be detached (roce_detach) before its ProcessQp is freed.
#pragma once
#include <infiniband/verbs.h>

#include <cstdint>

namespace sv::verbs {

struct ProcessQp;

// Called by ibv_modify_qp after the daemon accepted the transition to
// `next`, with the QP's attributes as they now are. Returns 0 or an errno.
int roce_on_modify(ProcessQp& q, const ibv_qp_attr& attr, int mask, ibv_qp_state next);
// Destroy or RESET: the QP leaves the wire.
void roce_detach(ProcessQp& q);
// Is this QP's traffic on the wire? (post_send then calls roce_post_send.)
bool roce_attached(const ProcessQp& q);
// For UD: does this work request go to another host?
bool roce_ud_remote(const ProcessQp& q, const ibv_send_wr* wr);
// For UD: is this a multicast SEND (a multicast DGID, DestQP 0xFFFFFF)?
bool roce_ud_multicast(const ProcessQp& q, const ibv_send_wr* wr);
// Its copy for the wire (the IP group), without a completion: 0 or an errno
// (the local path goes on regardless).
int roce_post_mcast(ProcessQp& q, const ibv_send_wr* wr);
int roce_post_send(ProcessQp& q, ibv_send_wr* wr, ibv_send_wr** bad);
// ibv_poll_cq found a wire CQ empty: receive what waits and run the engines
// in the caller's thread, unless another thread is at it. True if anything
// was done (the CQ may have completions now).
bool roce_poll();
// ibv_req_notify_cq on a wire CQ: its poller may go to sleep, so the RoCE
// thread watches the sockets again.
void roce_notify_armed();

bool gid_is_local(const uint8_t* gid);  // requester.cc

}  // namespace sv::verbs
