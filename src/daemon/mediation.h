// mediation.h: operations between users, carried out by the daemon.
//
// A requester may not map a peer's memory when the peer belongs to another
// user (a backing memfd maps its holder's whole address space, more than any
// key grants). For such a connection the library sends each work request
// here (Op::Mediate) and the daemon carries it out between the two backings
// with memcpy through its cached windows of them (backing_windows.h), after
// the checks of common/access.h, the same the library makes on one user's
// path. A third responder beside the library's shared-memory one
// (verbs/requester.cc) and the RoCE engine's (roce/responder.cc), written as
// a chain of checks and an execute step per operation, as rxe's responder.
//
// Mediation owns no objects: it reads and acts on the registry's tables
// through MediationTables, which the registry implements.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "common/access.h"
#include "common/odp_memory.h"
#include "common/protocol.h"
#include "common/responder_core.h"
#include "common/shm_layout.h"
#include "common/shm_ring.h"
#include "common/sys.h"
#include "daemon/backing_windows.h"

namespace sv::daemon {

// One mediated copy handed to the server's copy worker: the spans (with
// their own descriptors), how far it got, and what completes it on the loop
// (Mediation::finish). step() is the only part that runs off the loop.
struct MediationJob {
  struct OwnedSpan {
    Fd fd;
    uint64_t off;
    uint64_t len;
    uint32_t backing;
    // On-demand-paging memory: that process's addresses (Span::pid), its
    // pinned address space, and its pidfd, re-checked before every piece
    // (the MR dies with it).
    pid_t pid = 0;
    Fd pidfd;
    std::shared_ptr<const OdpMemory> mem{};
    uid_t owner_uid = 0;  // the registrant's user
  };
  std::vector<OwnedSpan> dst, src;
  std::vector<uint8_t> inline_data;  // the source when the payload was inline
  uint64_t total = 0, left = 0;
  size_t di = 0, si = 0;
  uint64_t doff = 0, soff = 0;
  bool failed = false;
  std::shared_ptr<BackingWindows> windows;
  // Set (under the server's copy lock) when an MR of a backing it touches
  // is deregistered: its next step fails it without copying.
  std::atomic<bool> revoked{false};
  // Held while a piece lands in a destination, which happens only while
  // the job is not revoked: whoever sets `revoked` and then takes this
  // lock knows no byte lands afterwards. Reads of ODP memory (which may
  // wait on a fault for ever) are made without it.
  std::timed_mutex land_mu;
  bool touches(uint32_t backing) const;
  bool touches_odp_of(pid_t pid) const;
  // The first process whose ODP memory it copies (0: none), and its user.
  pid_t odp_pid() const;
  uid_t odp_uid() const;
  // A job with this one's request, failed, that never copies (what
  // completes a copy whose thread is stuck on a fault).
  std::unique_ptr<MediationJob> failed_copy() const;
  // Which side's ODP memory failed the copy (1: destination, 2: source;
  // 0: none or not ODP): finish() maps it to the key's error as the loop does.
  int odp_fault = 0;
  // An RDMA atomic on ODP memory (src[0], 8 bytes): carried out by step()
  // under `lock` (the target user's flock), its original value then landing
  // in dst like an inline payload.
  bool atomic = false;
  // With atomic: an ATOMIC WRITE of `swap` (or of the 8 bytes of the
  // requester's spans in dst, when they are ODP memory) into src[0].
  bool store = false;
  bool cas = false;
  uint64_t compare_add = 0, swap = 0;
  Fd lock;
  uid_t uid = 0;  // whose copy (fairness between users)
  uint32_t client = 0;  // the requester's connection
  uint32_t requester_qpn = 0, dest = 0, opcode = 0, imm_data = 0;
  bool solicited = false;
  ibv_qp_type type = IBV_QPT_RC;
  bool has_recv = false;
  shm::RecvWqe recv{};
  // Op::MediatePost: completed into the QP segment's counts and the send
  // CQ (Registry::finish_posted), not with a reply.
  bool posted = false;
  uint32_t epoch = 0;
  uint64_t wr_id = 0;
  bool signaled = false;
  // Copies up to max_bytes more; true while bytes remain (false when done or failed).
  bool step(uint64_t max_bytes);
  bool step_atomic();
  bool step_store();
};

// What mediation needs of the registry, and nothing more.
class MediationTables {
 public:
  struct QpView {
    ibv_qp_type type = IBV_QPT_RC;
    uint32_t pd = 0;
    uint32_t recv_cq = 0;  // where its receives complete (an SRQ's too)
  };
  // A QP's receive queue (its SRQ's, if it has one), located by the
  // capacity recorded when the ring was made, never by a segment header
  // the peer's process can write.
  struct RecvQueue {
    shm::Ring<shm::RecvWqe> ring;
    uint32_t srq = 0;                          // the SRQ's handle, 0 for the QP's own queue
    shm::SrqSegmentHeader* srq_header = nullptr;  // its armed limit
  };

  // A QP the client holds.
  virtual bool requester_qp(uint32_t client, uint32_t qpn, QpView& out) = 0;
  // Any QP.
  virtual bool responder_qp(uint32_t qpn, QpView& out) = 0;
  virtual shm::QpEntry& qp_state_entry(uint32_t qpn) = 0;  // the QP's entry in its user's device table
  // The MR table's entry of a slot (access::lookup).
  virtual const shm::MrEntry& mr_slot(uint32_t slot) const = 0;
  // The descriptor of a backing file, -1 if there is none.
  virtual int backing_fd(uint32_t backing) const = 0;
  virtual bool receive_queue(uint32_t qpn, RecvQueue& out) = 0;
  // An SRQ fell below its armed limit: the event to its context.
  virtual void srq_limit_reached(uint32_t srq) = 0;
  virtual void push_cq_entry(uint32_t cq, const ibv_wc& wc, bool solicited) = 0;
  // The QP's posted receives complete with flush errors (IBTA 10.3.1).
  virtual void flush_receives(uint32_t qpn) = 0;
  // The responder QP went to ERR for an error it detected: its holders get
  // the affiliated async event (access::responder_event).
  virtual void responder_error_event(uint32_t qpn, ibv_wc_status requester_status) = 0;
  // SEND with Invalidate: the key, a type 2 window bound to the QP the
  // client's QP `qpn` is connected to, is invalidated (0, or an errno).
  virtual int invalidate_remote(uint32_t client, uint32_t qpn, uint32_t key) = 0;
  virtual uid_t uid_of_client(uint32_t client) const = 0;
  // The pinned address space (common/odp_memory.h) of the live client
  // (alive by its pidfd) that registered on-demand-paging MRs as process
  // `pid` with struct pid `identity` (MrEntry::owner_identity), and its
  // pidfd (borrowed) in *pidfd; null if there is none. Only then are its
  // addresses reached, and only through that handle.
  virtual std::shared_ptr<const OdpMemory> odp_memory(uint32_t pid, uint64_t identity, int* pidfd = nullptr,
                                                      uid_t* uid = nullptr) const {
    (void)pid, (void)identity, (void)pidfd, (void)uid;
    return nullptr;
  }
  // A file description of the file whose flock(2) every RDMA atomic on ODP
  // memory of user `uid` takes (the library's ContextState::odp_lock): 0
  // and `out`, or an errno.
  virtual int odp_lock(uid_t uid, Fd& out) {
    (void)uid, (void)out;
    return ENOLCK;
  }

 protected:
  ~MediationTables() = default;
};

class Mediation {
 public:
  explicit Mediation(MediationTables& tables) : t_(tables), windows_(std::make_shared<BackingWindows>()) {}
  Mediation(const Mediation&) = delete;  // bound to its registry's tables
  Mediation& operator=(const Mediation&) = delete;

  // Carries out one operation of `client`'s QP towards a peer of another
  // user. An errno for a request that is not one (no such QP, not RC/UC,
  // sizes); otherwise 0 with rep saying the outcome. With `defer`, a large
  // copy is not made here: *defer receives the job (rep is then unset), to
  // be run by the caller and completed with finish() on the loop.
  int mediate(uint32_t client, const proto::MediateReq& req, proto::MediateReply& rep,
              std::unique_ptr<MediationJob>* defer = nullptr);
  // The same for the requester QP req.qpn, `me`, which the caller found the
  // client holds (the command layer's declared field).
  int mediate_as(uint32_t client, const MediationTables::QpView& me, const proto::MediateReq& req,
                 proto::MediateReply& rep, std::unique_ptr<MediationJob>* defer = nullptr);
  // The end of a deferred operation, on the loop: what mediate() would have
  // done after its copy.
  int finish(MediationJob& job, proto::MediateReply& rep);

  // Takes the next receive of QP `qpn` (its SRQ's, raising the SRQ's limit
  // event as the library does on one user's path).
  bool pop_recv(uint32_t qpn, shm::RecvWqe& out);

  // A backing is released: the daemon's windows of it go.
  void forget_backing(uint32_t backing) { windows_->forget(backing); }
  const BackingWindows& windows() const { return *windows_; }
  // Bytes copied by mediate() itself (not deferred) so far.
  uint64_t copied_on_loop() const { return copied_on_loop_; }
  // Deferred copies (mediate's `defer`) are those of this size and more.
  void set_offload(uint64_t bytes) { offload_bytes_ = bytes; }

  // A byte range in a backing file; or, with `pid`, of on-demand-paging
  // memory: [off, off + len) of that process's address space, copied
  // through its pinned handle `mem` (common/odp_memory.h).
  struct Span {
    int fd;
    uint64_t off;
    uint64_t len;
    uint32_t backing;
    pid_t pid = 0;
    std::shared_ptr<const OdpMemory> mem{};  // with `pid`: its pinned address space
    int pidfd = -1;                        // and its pidfd (borrowed)
    uid_t owner_uid = 0;                   // and its user
  };
  // The key check (common/access.h) and where the bytes are: the span, or
  // false. `who` is the QP the key is used through.
  bool resolve_key(uint32_t key, access::Use use, const access::User& who, uint32_t need, uint64_t addr, uint64_t len,
                   Span& out) const;

 private:
  struct Delivery;
  struct Op;
  // The chain of checks (each an errno, a retry, or an access::Fault).
  bool check_responder(Op& op);
  access::Fault check_opcode(const Op& op) const;
  access::Fault resolve_local(Op& op);
  // The execute step per operation.
  int execute_send(Op& op);
  int execute_write(Op& op);
  int execute_read(Op& op);
  int execute_atomic(Op& op);
  int defer_odp_atomic(Op& op, const Span& target);
  bool defer_result(Op& op, const uint8_t (&bytes)[8]);
  void hand_off(Op& op, std::unique_ptr<MediationJob> job);
  int execute_atomic_write(Op& op);
  int defer_odp_atomic_write(Op& op, const Span& target, const uint8_t* value);
  int execute_flush(Op& op);
  // What the executes share.
  access::Fault resolve_remote(const Op& op, uint64_t len, Span& out) const;
  core::Check recv_spans(const Op& op, const shm::RecvWqe& r, std::vector<Span>& out) const;
  bool copy_to(const Op& op, const std::vector<Span>& dst) const;
  bool copy_spans(const std::vector<Span>& dst, const std::vector<Span>& src, uint64_t total) const;
  bool defer_copy(Op& op, const std::vector<Span>& dst, const std::vector<Span>& src);
  void push_recv(uint32_t qpn, const ibv_wc& wc, bool solicited);
  void recv_completion(const Delivery& d, const shm::RecvWqe& r, ibv_wc_status st, uint64_t len);
  int deliver_send(const Delivery& d, const shm::RecvWqe& r, uint64_t len, proto::MediateReply& rep);
  int fail(const Delivery& d, access::Fault f, proto::MediateReply& rep);
  int fail(Op& op, access::Fault f);
  int complete(Op& op, uint64_t len);

  MediationTables& t_;
  std::shared_ptr<BackingWindows> windows_;  // shared with the copy worker's jobs
  mutable uint64_t copied_on_loop_ = 0;
  uint64_t offload_bytes_ = 64 << 10;
};

}  // namespace sv::daemon
