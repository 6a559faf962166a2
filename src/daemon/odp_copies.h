// odp_copies.h: mediated copies that touch on-demand-paging memory
// (docs/MEMORY.md, "On-demand paging"). Such a copy faults on mappings its
// registrant controls and may wait for as long as the registrant wants (a
// FUSE page whose READ is never answered), so none runs on the daemon's
// loop or on the copy worker that other users' copies share: each runs on
// a thread of its own, and the loop never waits for one. A thread that
// finished its copy waits a while for the next one (of any registrant)
// before it ends, so that a stream of copies does not make a thread each
// (at most kIdleThreads wait). A copy whose
// registrant exits, or whose MR is deregistered, completes in error at once
// (revoke); its thread, if it is stuck, is left to end when the fault does,
// and its result is dropped.
//
// What this costs the daemon is bounded by the registrants' users: a thread
// (with the job's descriptors: the registrant's pidfd, the ODP lock, and
// through the pinned address space its four descriptors) per copy, at most
// kPerUser copies over the memory of one user's processes, stuck ones
// counted until their threads end, and kMaxThreads in all. A user whose
// pages never fault in stalls only copies into or out of its own memory;
// beyond the bounds a copy fails at once (remote operation error).
#pragma once

#include <sys/types.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <utility>

#include "common/protocol.h"
#include "common/sys.h"
#include "daemon/mediation.h"

namespace sv::daemon {

// A deferred mediated operation: its request's header (for the reply) and
// its copy.
struct MediatedCopy {
  uint32_t client;
  proto::Header h;
  std::unique_ptr<MediationJob> job;
};

class OdpCopies {
 public:
  // Copy threads over the memory of one user's processes at most, stuck
  // ones included, and in all; more copies fail at once.
  static constexpr int kPerUser = 4;
  static constexpr int kMaxThreads = 256;
  // `done_fd`: an eventfd signalled when copies are done (duplicated).
  explicit OdpCopies(int done_fd);
  // Starts the copy on a thread of its own (or fails it at once, beyond the
  // bound or if no thread can be made).
  void start(MediatedCopy c, uint64_t piece);
  // Every running copy `hit` names is revoked and completes in error now;
  // no byte of it lands after this returns, save in ODP memory whose own
  // fault holds the copy (that registrant's own memory, docs/MEMORY.md).
  void revoke(const std::function<bool(const MediationJob&)>& hit);
  // The copies done (or failed) since the last call.
  std::deque<MediatedCopy> take_done();

 private:
  struct Run {
    MediatedCopy c;
    uid_t uid = 0;  // the registrant's user
    bool abandoned = false;  // completed in error by revoke(); the thread's result is dropped
  };
  // What the threads share with the loop; it outlives the server for a
  // thread still stuck when the daemon stops.
  struct Shared {
    std::mutex mu;
    std::deque<MediatedCopy> done;
    std::list<std::shared_ptr<Run>> runs;
    Fd done_fd;
    // Threads waiting for a copy, and the copies handed to them.
    std::condition_variable more;
    int idle = 0;
    std::deque<std::pair<std::shared_ptr<Run>, uint64_t>> handed;
  };
  // Threads that wait for another copy at most, and for how long.
  static constexpr int kIdleThreads = 8;
  static constexpr int kIdleMs = 2000;
  static void thread_body(std::shared_ptr<Shared> s, std::shared_ptr<Run> r, uint64_t piece);
  static void run(Shared& s, const std::shared_ptr<Run>& r, uint64_t piece);
  std::shared_ptr<Shared> s_;
};

}  // namespace sv::daemon
