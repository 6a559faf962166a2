// capture.h: `softverbs capture` seen from the library. While a capture
// ring of this user's exists (common/capture_ring.h), the QPs of every
// context take captured ops (transport.h choose_transport): the same
// requests, then each one carried out rendered into the ring as the RoCEv2
// packets an RDMA NIC would have sent for it (IBTA vol. 1 9.2-9.3, Annex
// A17). With no ring, nothing here runs on the post path.
//
// The watchdog thread (context.cc) watches /dev/shm with inotify for the
// ring appearing or going, and chooses every QP's ops again.
#pragma once
#include <span>

#include "common/sys.h"
#include "roce/udp.h"

namespace sv::shm {
struct SendWqe;
}

namespace sv::verbs {

struct ProcessQp;
struct ContextState;
struct Outcome;

// Starts watching for this context's capture ring: an inotify descriptor
// for the watchdog (invalid if none could be made), and maps the ring if a
// capture is on already.
Fd capture_watch(ContextState& st);
// The watchdog saw /dev/shm change: maps or drops the ring and chooses the
// ops of the context's QPs again.
void capture_changed(ContextState& st, int inotify_fd);
// Whether the QP's requests are to be captured now.
bool capture_on(const ProcessQp& q);
// Renders request `w`, which `o` says was carried out, into the ring.
void capture_request(ProcessQp& q, const shm::SendWqe& w, const Outcome& o);
// The wire path's datagrams as they are: the tap of the context's UDP
// endpoints (roce/udp.h), writing into the ring while there is one.
roce::UdpEndpoint::Tap capture_tap(ContextState& st, uint32_t qpn);

}  // namespace sv::verbs
