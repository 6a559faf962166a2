// requester_internal.h: the pieces of the shared-memory requester
// (requester.cc) that its UD part (requester_ud.cc) uses too. Not an API.
#pragma once
#include <cstdint>
#include <vector>

#include "common/responder_core.h"
#include "verbs/provider.h"
#include "verbs/transport.h"

namespace sv::verbs {

// A run of bytes in this process's view of some memory.
struct Seg {
  uint8_t* p;
  uint64_t len;
};

// Copies between two scatter lists in order, the last bytes last.
void copy_segments(const Seg* dst, int nd, const Seg* src, int ns, uint64_t total);
// Gathers the local source of a send, write or atomic (IBTA 10.6.7.1).
bool gather(ProcessQp& q, const shm::SendWqe& w, Seg* segs, int& n, uint64_t& total, ibv_wc_status& err);
// Resolves a receive WQE's scatter list in the responder's memory
// (core::scatter_receive's checks).
core::Check resolve_recv(ProcessQp& q, Peer& p, const shm::RecvWqe& r, uint64_t len, Seg* remote, uint32_t& nr);
// Completes the responder's receive `r` for the request `w`.
void push_recv_completion(ProcessQp& q, Peer& p, const shm::RecvWqe& r, ibv_wc_status status, uint32_t len,
                          const shm::SendWqe& w);
// The same from its parts (`opcode`: the sender's ibv_wr_opcode, for the
// immediate / invalidate flags); also for an XRC target on the wire.
void push_recv_completion(ProcessQp& q, Peer& p, uint64_t recv_wr_id, ibv_wc_status status, uint32_t len,
                          uint32_t opcode, uint32_t send_flags, uint32_t imm_data, uint32_t invalidate_rkey);

// The pieces the send queue's progress (requester_progress.cc) shares with
// the requests (requester.cc): the connected peer, (re)attached when the
// destination changed (null while it is not ready); a send completion
// (`owed`: a record of it, sq_running, cleared as it is published); a
// request's completion, and its failure (the QP to ERR, the peer told);
// carrying a request out on the QP's path; what a stalled head request does
// next (false: it failed for good).
Peer* resolve_peer(ProcessQp& q);
void push_send_completion(ProcessQp& q, uint64_t wr_id, ibv_wc_opcode op, ibv_wc_status status, uint32_t len,
                          shm::OwedRecord owed = {});
void complete(ProcessQp& q, const shm::SendWqe& w, ibv_wc_status status, uint32_t len);
void fail(ProcessQp& q, const shm::SendWqe& w, const Outcome& o);
Outcome run(ProcessQp& q, const shm::SendWqe& w);
bool stall(ProcessQp& q, Step s);
// With the send lock held: a receive that a killed sharer took and did not
// complete completes aborted.
void complete_torn_receive(ProcessQp& q);

// UD (requester_ud.cc): the peer QP `dest` of a datagram, attached on first
// use; the execute operation of UD QPs.
Peer* ud_peer(ProcessQp& q, uint32_t dest);
Outcome execute_ud(ProcessQp& q, const shm::SendWqe& w);
// A wire UD QP's post: a list to another host goes to the engine, one to
// this host's QPs to `local` (the shared-memory queue): the first request's
// destination decides for the list; a list that starts with a multicast
// SEND is taken one by one, each multicast SEND both on the wire and to
// `local` (docs/ROCE.md, "Multicast").
using PostFn = int (*)(ProcessQp&, ibv_send_wr*, ibv_send_wr**, bool);
int post_ud_on_wire(ProcessQp& q, ibv_send_wr* wr, ibv_send_wr** bad, bool all_or_nothing, PostFn local);

// An IBV_SEND_INLINE request's payload, copied into the WQE (it may wait
// in the send queue after the caller's buffer is reused).
void capture_inline(shm::SendWqe& w);
// The execute operation of RC QPs whose peer may be another user's.
Outcome execute_rc_mediated(ProcessQp& q, const shm::SendWqe& w);

// Pipelined requests to another user's QP, with the send lock held
// (requester_daemon.cc): whether `w` may be sent without waiting; the
// progress thread's look at a run (true while requests are in flight);
// a posted request sent so and queued (`queued`: the progress thread is
// to look at it), 0 or an errno.
bool may_pipeline(ProcessQp& q, const shm::SendWqe& w);
bool pipelines_now(ProcessQp& q, const shm::SendWqe& w);  // and nothing waits before it (room made)
bool pipeline_queued(ProcessQp& q);
int post_pipelined(ProcessQp& q, shm::SendWqe& w, bool& queued);

// On-demand-paging memory (requester_odp.cc): the plain resolutions it
// uses for the other keys; a request one of whose keys named ODP memory
// (the plain path stopped with odp_seen set, having changed nothing); a
// SEND whose receive `r`, already taken, has a buffer in ODP memory.
bool plain_local_segment(ProcessQp& q, const shm::Sge& sge, bool write, Seg& out);
uint8_t* plain_peer_address(ProcessQp& q, const Peer& p, uint32_t key, uint64_t addr, uint64_t len, uint32_t need);
const MrEntry* checked_peer_key(ProcessQp& q, const Peer& p, uint32_t key, uint64_t addr, uint64_t len, uint32_t need);
Outcome execute_odp(ProcessQp& q, Peer& p, const shm::SendWqe& w);
Outcome odp_send_into(ProcessQp& q, Peer& p, const shm::SendWqe& w, const shm::RecvWqe& r);
// UD (requester_ud.cc): a message's receive `r` with an ODP buffer, from
// `src` in this process's view (the check that failed, or kOk); a source
// list with ODP pieces, read into `stage` (false: a local protection error).
core::Check odp_scatter(ProcessQp& q, Peer& p, const shm::RecvWqe& r, const Seg* src, int ns, uint64_t total);
bool odp_source(ProcessQp& q, const shm::SendWqe& w, std::vector<uint8_t>& stage, Seg* out, int& n, uint64_t& total);

}  // namespace sv::verbs
