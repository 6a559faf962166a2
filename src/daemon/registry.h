// registry.h: the daemon's authoritative registry of every softverbs object.
//
// Contract: single-threaded (the daemon's event loop owns it). Every entry
// point takes the id of the calling client and a request whose fields have
// not been trusted yet. The handle fields an op declares (common/
// op_handles.h) were resolved before the call by the command layer
// (commands.cc, through resolve()), which passes the objects; the entry
// point validates everything else (lengths, keys, attributes, handles
// reached some other way) and answers with a positive errno on any
// violation. Destroying a declared handle is destroy(), per type. The registry writes the device segments (MR, QP
// and multicast tables, one per user: device_tables.h) that clients map
// read-only; they are sealed, so what it reads back from them is its own. Objects are released when their
// holder destroys them or when the holder's connection closes.
//
// The objects are kept in typed tables (objects.h: handle, owning context,
// references, destroy order). This class is the composition root: it keeps
// the clients, the contexts, the quotas and the device tables, resolves
// and destroys by type, and holds one class per object type that owns
// that type's table and carries out its verbs (pd.h, mr.h, dm.h, cq.h,
// qp.h, srq.h, xrc.h, names.h), which reaches it through ObjectHost
// (object_host.h). Its own functions: registry.cc (clients, contexts,
// references, a context's release), qp_reach.cc (what a client's QPs
// reach, for resolve),
// sharing.cc (import, named regions, what the namespace reaches),
// registry_mediation.cc (the tables as mediation sees them), counters.cc,
// resources.cc.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <array>
#include <map>
#include <set>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "common/odp_memory.h"
#include "common/op_handles.h"
#include "common/protocol.h"
#include "common/shm_layout.h"
#include "common/sys.h"
#include "daemon/device_tables.h"
#include "daemon/dm.h"
#include "daemon/mr.h"
#include "daemon/mediation.h"
#include "daemon/name_space.h"
#include "daemon/names.h"
#include "daemon/object_host.h"
#include "daemon/objects.h"
#include "daemon/pd.h"
#include "daemon/cm_ports.h"
#include "daemon/cq.h"
#include "daemon/qp.h"
#include "daemon/quota.h"
#include "daemon/srq.h"
#include "daemon/xrc.h"

namespace sv::daemon {

struct Counts {
  uint32_t clients, pds, mrs, cqs, qps, channels, backings;
};

class Registry : private MediationTables, private ObjectHost {
 public:
  Registry();
  int init();

  // The command layer's access to the object tables (commands.cc, as the
  // kernel's uverbs core looks up each handle a method declares). The
  // object `handle` of kind `kind` when the client may use it: one of its
  // context's (a QP: also an XRC target QP it holds a handle of); else null.
  Object* resolve(ObjKind kind, uint32_t client, uint32_t handle);
  // The same under a declared field's rule (proto::HandleRule): 0 and the
  // object in `out`, or EINVAL (EACCES: an SRQ that exists but that the
  // caller does not reach, kReachable).
  int resolve(ObjKind kind, proto::HandleRule rule, uint32_t client, uint32_t handle, Object*& out);
  // Destroys an object resolve() gave the client, by its type's destroy
  // hook (kTypeOps): EBUSY while other objects use it (ibv_dealloc_pd(3)
  // and the other destroy verbs).
  int destroy(ObjKind kind, uint32_t client, uint32_t handle);
  // The read-only device segment for the client's user (device_tables.h),
  // made on first use; the descriptor stays the registry's.
  int device_fd(uint32_t client, int& fd);
  uint64_t boot_id() const { return boot_id_; }
  // How this daemon was started (proto::kServedAs* bits, for Status).
  void set_served_as(uint32_t how) { served_as_ = how; }
  uint32_t served_as() const { return served_as_; }

  // `pidfd` refers to the process that connected (peer_pidfd); without one
  // the registry opens one for `pid`. The process's credentials, capability
  // and limit are read now: RLIMIT_MEMLOCK is charged to it as it was.
  uint32_t add_client(pid_t pid, uid_t uid, gid_t gid = 0, Fd pidfd = Fd());
  // The inode of the daemon's end of the client's connection (claim_socket).
  void set_connection_inode(uint32_t client, uint64_t inode) {
    if (auto c = clients_.find(client); c != clients_.end()) c->second.conn_inode = inode;
  }
  // Detaches the client from its context; the last one out releases the
  // context's objects, whichever process created them.
  void remove_client(uint32_t client);
  // The client says which socket (by inode) is its end of the connection,
  // so that another process can import its context by passing that socket.
  // Verified against /proc/PID/fd.
  int claim_socket(uint32_t client, uint64_t inode);
  // ibv_import_device(3): attach the client to the context of the
  // connection whose client end `fd` is: a real socket (sockfs device and
  // inode) claimed by a client of the same user as the context (EPERM for
  // any other user, root included).
  int import_context(uint32_t client, Fd fd);
  // The objects of one kind the client may see, from handle req.after on
  // (resources.cc): its own user's; every user's for root. EINVAL for an
  // unknown kind.
  int res_list(uint32_t client, const proto::ResListReq& req, proto::ResListReply& rep) const;
  // The port counters of the QPs the client may see (as res_list), live
  // and destroyed (counters.cc): the first 15 named ones (rxe's).
  void wire_counters(uint32_t client, proto::WireCountersReply& rep) const;
  // Op::Counters: the same sums, every named counter, and a page of the
  // live QPs' own from QPN req.after on (counters.cc).
  int counters_page(uint32_t client, const proto::CountersReq& req, proto::CountersReply& rep) const;
  // A request between users the daemon finished (Op::Mediate, MediatePost):
  // counted against requester QP `qpn` and its destination (counters.cc).
  void count_mediated(uint32_t qpn, uint32_t opcode, const proto::MediateReply& rep);
  uint32_t region_count() const { return backings_.region_count(); }
  Counts counts() const;
  // Per-user limits (quota.h); the server charges connections here too.
  Quotas& quotas() override { return quotas_; }
  CmPorts& cm_ports() { return cm_ports_; }
  // Op::CmBind / CmUnbind for `client` (cm_ports.h).
  int cm_bind(uint32_t client, const proto::CmBindReq& req, proto::CmBindReply& rep, int& fd) {
    return cm_ports_.bind(client, client_uid(client), req, rep.port, fd);
  }
  int cm_unbind(uint32_t client, const proto::CmBindReq& req) { return cm_ports_.unbind(client, req); }

  // One call per protocol op. `in_fds` are the descriptors that came with the
  // request (already checked to be the number the op expects); `out_fds`
  // receives borrowed descriptors to send with the reply.
  // The client's process exited (or, `left`, its connection closed): its
  // ODP MRs are deregistered (MemoryRegions::registrant_gone).
  void odp_owner_gone(uint32_t client, bool left = false);
  // The pidfd of the client's process (-1 if none).
  int client_pidfd(uint32_t client) const;
  // Operations towards a peer of another user: the registry's Mediation
  // (mediation.h) carries them out on its tables.
  // `qp`: requester QP req.qpn, which the client holds (resolved by the command layer).
  int mediate(uint32_t client, const daemon::Qp& qp, const proto::MediateReq& req, proto::MediateReply& rep,
              std::unique_ptr<MediationJob>* defer = nullptr) {
    const int e = mediation_.mediate_as(client, {qp.type, qp.pd, qp.recv_cq}, req, rep, defer);
    if (e == 0 && !(defer && *defer)) count_mediated(req.qpn, req.opcode, rep);
    return e;
  }
  int finish_mediation(MediationJob& job, proto::MediateReply& rep) {
    const int e = mediation_.finish(job, rep);
    if (e == 0) count_mediated(job.requester_qpn, job.opcode, rep);
    return e;
  }
  // Op::MediatePost: one pipelined request, checked and carried out as
  // mediate() does, in the order of its connection; no reply. Its outcome
  // goes to the QP segment's counts and, where due, to the send CQ. An
  // errno only for a request whose QP `q` (req.qpn, which the client holds:
  // resolved by the command layer) is not RC.
  int mediate_posted(uint32_t client, daemon::Qp& q, const proto::MediateReq& req,
                     std::unique_ptr<MediationJob>* defer = nullptr);
  // Op::MediateGone: 0 when connection `sender` can no longer finish
  // anything on the client's QP `q` (gone, or no longer a holder of it),
  // EBUSY while it can.
  int mediate_gone(const daemon::Qp& q, uint32_t sender);
  // The end of a deferred MediatePost (its copy done), on the loop.
  void finish_posted(MediationJob& job);
  // Bytes mediated copies have moved on the loop so far (the server's budget per turn).
  uint64_t mediated_on_loop() const { return mediation_.copied_on_loop(); }
  // The backing of the client's MR `handle`, 0 if there is none.
  uint32_t mr_backing(uint32_t client, uint32_t handle) const;
  // The registrant's pid of the client's ODP MR `handle` (0: not one).
  uint32_t mr_odp_owner(uint32_t client, uint32_t handle) const;
  // Copies from this size on go to the copy worker (when there is one).
  void set_mediation_offload(uint64_t bytes) { mediation_.set_offload(bytes); }
  // The object types' classes, which own their tables (object_host.h).
  ProtectionDomains& pd() { return pd_; }
  MemoryBackings& backings() { return backings_; }
  MemoryRegions& mr() { return mr_; }
  DeviceMemory& dm() { return dm_; }
  XrcDomains& xrc() { return xrc_; }
  SharedReceiveQueues& srq() { return srq_; }
  CompletionQueues& cq() { return cq_; }
  Names& names() { return names_; }
  QueuePairs& qp() { return qp_; }

  int reg_async(uint32_t client, Fd wake);
  // Async events waiting to be sent: (client, event type, element). The
  // server sends them after each request or disconnection.
  struct PendingEvent {
    uint32_t client;
    uint32_t type;
    uint32_t element;
  };
  std::vector<PendingEvent> take_events() { return std::exchange(events_, {}); }
  int async_fd_of(uint32_t client) const {
    auto it = clients_.find(client);
    return it == clients_.end() ? -1 : it->second.async_fd;
  }

  // Multicast groups, for the RoCEv2 port (device_tables.h).
  uint64_t mcast_generation() const { return tables_.mcg_generation(); }
  std::vector<std::array<uint8_t, 16>> mcast_gids() const { return tables_.mcg_gids(); }
  bool mcast_members(const uint8_t* gid, std::vector<uint32_t>& out) const { return tables_.mcg_members(gid, out); }

  // Is `qpn` a QP of the client's context? (RoCE attach)
  bool holds_qp(uint32_t client, uint32_t qpn) { return qp_.find(client, qpn) != nullptr; }

  // The user of a client's process (uid_t(-1) if unknown).
  uid_t client_uid(uint32_t client) const override;
  // The context a connection is attached to (0: none).
  uint32_t context_of(uint32_t client) const override { return ctx(client); }
  // The process of a connection (as it connected; 0: none).
  uint32_t client_pid(uint32_t client) const {
    auto c = clients_.find(client);
    return c == clients_.end() ? 0 : uint32_t(c->second.pid);
  }
  // Read access for tests.
  const shm::QpEntry* qp_entry(uint32_t qpn) const { return qp_.entry(qpn); }
  const shm::MrEntry* mr_entry(uint32_t key) const { return mr_.entry(key); }

  // The clients (processes) of a context, from the registry's index.
  std::vector<uint32_t> clients_of(uint32_t context) const;
  // The process that opened a context: its first connection still there (0: none).
  uint32_t context_pid(uint32_t context) const;

 private:
  // The object types (objects.h), by the names the registry's files use.
  using Pd = daemon::Pd;
  using Backing = daemon::Backing;
  using Region = daemon::Region;
  using RegionKey = daemon::RegionKey;
  using Mr = daemon::Mr;
  using Mw = daemon::Mw;
  using Dm = daemon::Dm;
  using Channel = daemon::Channel;
  using Cq = daemon::Cq;
  using Srq = daemon::Srq;
  using Xrcd = daemon::Xrcd;
  using XrcdHandle = daemon::XrcdHandle;
  using Qp = daemon::Qp;

  // ---- Clients and contexts (registry.cc) ----
  struct Client {
    pid_t pid;
    uid_t uid;
    gid_t gid;
    uint32_t ctx;           // the context this connection works in
    uint64_t socket_inode;  // claimed and verified client end of the connection
    int async_fd = -1;      // the client's async wake-up socket (owned by async_fds_)
    Fd pidfd{};             // the process that connected (not one that reused its pid)
    ConnectIdentity at_connect{};
    uint64_t conn_inode = 0;  // the daemon's end of the connection (its peer: the client's end)
    uint64_t identity = 0;    // pidfd_identity of pidfd (common/odp_memory.h)
    // Its address space, pinned (common/odp_memory.h): opened at its first
    // on-demand-paging registration; every copy of its ODP memory goes
    // through it.
    std::shared_ptr<const OdpMemory> odp_memory{};
  };
  // A device context: objects belong to it; processes attach to it (by
  // opening a device, or by importing another's context). All are equal.
  struct Context {
    uint32_t attached;
    uid_t uid;  // the user whose process opened it: its memory is that user's
  };
  // May `client` receive descriptors that map the memory or queues of
  // context `owner`? Only a process of the same user (or root): a backing
  // memfd maps a process's whole address space, more than any key grants.
  bool same_user(uint32_t client, uint32_t owner) const override;
  uint32_t ctx(uint32_t client) const;
  // The user of a context (uid_t(-1) if none).
  uid_t context_uid(uint32_t context) const override;
  // Are the client's user and the context's user the same, so that their
  // objects' entries are in one device segment? (Strictly equal uids.)
  bool same_tables(uint32_t client, uint32_t owner) const override;
  void remove_context_if_unused(uint32_t ctx);
  // Moves the client into context `target` (ibv_import_device, or opening a
  // name): EBUSY if its own context already holds objects.
  int join_context(Client& me, uint32_t target);

  // ---- The object tables (objects.h) ----
  // What a context's release does with one type, in kDestroyOrder: which
  // of its objects go (`collect`, default: those it owns), what happens
  // before and after, and each object's cleanup (revoke what it published,
  // then forget it; default: forget it).
  struct TypeOps {
    ObjKind kind;
    std::vector<uint32_t> (*collect)(Registry& r, uint32_t ctx);
    void (*before)(Registry& r, uint32_t ctx, const std::vector<uint32_t>& ids);
    // The cleanup and the destroy reach the type's class, where it has one.
    void (*cleanup)(Registry& r, uint32_t handle);
    void (*after)(Registry& r, const std::vector<uint32_t>& ids);
    // What a holder's destroy does (null: EBUSY while referenced, else the
    // cleanup), given the holder's context.
    int (*destroy)(Registry& r, uint32_t ctx, uint32_t handle);
  };
  static const TypeOps kTypeOps[];
  // Calls f(table) with the table of `kind` (registry.cc only).
  template <class F>
  decltype(auto) with_table(ObjKind kind, F&& f);
  // Frees every object of a context no process holds any more: one loop
  // over the types in destroy order.
  void release_context(uint32_t ctx);
  // References move only through here: the ones an object declares
  // (held()) are taken when it is made and dropped when it goes.
  void hold(const Held& refs) override;
  void hold(Ref r) override;
  void drop(const Held& refs) override;
  void drop(Ref r) override;
  // The end of every object of a context-owned kind, once its type's own
  // cleanup revoked what it published: its quota charge released, its
  // entry erased, then the references it held dropped.
  void forget(ObjKind kind, uint32_t handle) override;

  // The rest of ObjectHost (registry.cc, pd.cc).
  bool context_open(uint32_t context) const override { return contexts_.count(context) != 0; }
  uint32_t next_handle() const override { return next_handle_; }
  uint32_t take_handle() override { return next_handle_++; }
  void context_event(uint32_t context, uint32_t type, uint32_t element) override;
  void qps_error_on_cq(uint32_t context, uint32_t cq) override;
  ClientView client_view(uint32_t client) override;
  int open_odp_memory(uint32_t client) override;
  bool has_qp(uint32_t qpn) const override { return qp_.table().count(qpn) != 0; }
  void forget_backing_windows(uint32_t backing) override { mediation_.forget_backing(backing); }

  // ---- What a client's QPs reach (qp_reach.cc) ----
  bool may_complete_into(uint32_t client, uint32_t cq);
  // The MR a key names for the client (HandleRule::kOwnKey, or kReachableKey
  // when `reach`): 0, EINVAL or EACCES.
  int mr_by_key(uint32_t client, uint32_t key, bool reach, Object*& out);
  // Whether the client's QPs reach SRQ `handle` (its own, XRC, or a peer's connected both ways).
  bool srq_reachable(uint32_t client, const daemon::Srq& srq, uint32_t handle);

  // Whether one of the context's XRC_SEND QPs reaches the XRC SRQ.
  bool xrc_reaches_srq(uint32_t context, const Srq& srq);

  // ---- Sharing: namespace, regions (sharing.cc) ----
  Credentials credentials(uint32_t client) const override;
  bool names_live_object(const NsEntry& e) const override;
  bool find_client(uint32_t client, ClientView& out) const override;
  int attach_client(uint32_t client, uint32_t target) override;

  // The tables as mediation sees them (MediationTables, registry_mediation.cc).
  bool requester_qp(uint32_t client, uint32_t qpn, QpView& out) override;
  bool responder_qp(uint32_t qpn, QpView& out) override;
  shm::QpEntry& qp_state_entry(uint32_t qpn) override { return qp_.slot(qpn); }
  const shm::MrEntry& mr_slot(uint32_t slot) const override { return tables_.mr_at(slot); }
  int backing_fd(uint32_t backing) const override;
  bool receive_queue(uint32_t qpn, RecvQueue& out) override;
  void srq_limit_reached(uint32_t srq) override;
  void push_cq_entry(uint32_t cq, const ibv_wc& wc, bool solicited) override { cq_.push(cq, wc, solicited); }
  void flush_receives(uint32_t qpn) override;
  void responder_error_event(uint32_t qpn, ibv_wc_status requester_status) override {
    qp_.responder_error_event(qpn, requester_status);
  }
  uid_t uid_of_client(uint32_t client) const override { return client_uid(client); }
  std::shared_ptr<const OdpMemory> odp_memory(uint32_t pid, uint64_t identity, int* pidfd, uid_t* uid) const override;
  int odp_lock(uid_t uid, Fd& out) override;
  int invalidate_remote(uint32_t client, uint32_t qpn, uint32_t key) override;
  Mediation mediation_{*this};

  void posted_outcome(Qp& q, uint32_t qpn, uint64_t wr_id, uint32_t opcode, bool signaled, uint32_t epoch,
                      const proto::MediateReply& rep);
  // A QP going: its counts join its user's totals (counters.cc).
  void retire_counters(const Qp& q) override;
  void qp_counters(const Qp& q, counters::Values& out) const;
  void port_counters(uid_t me, counters::Values& out) const;
  std::map<uid_t, std::array<uint64_t, counters::kCount>> retired_counters_;

  uint64_t boot_id_ = 0;

  uint32_t served_as_ = 0;
  uint64_t sockfs_dev_ = 0;  // st_dev of every socket (sockfs)
  // The device segments, one per user; every MR/QP entry and multicast
  // group the daemon publishes goes through it.
  DeviceTables tables_;

  uint32_t next_client_ = 1;
  uint32_t next_handle_ = 1;
  std::map<uint32_t, Client> clients_;
  // (context, client) of every client: the processes of one context
  // without a walk over every connection of the daemon.
  std::set<std::pair<uint32_t, uint32_t>> ctx_clients_;
  // Each claimed socket's client, by inode (claim_socket: at most one).
  std::map<uint64_t, uint32_t> socket_client_;
  std::map<uint32_t, Fd> async_fds_;  // by client
  std::map<uint32_t, Context> contexts_;
  // (user, context) of every context: a user's contexts without a walk over
  // every user's (resources.cc lists a user's objects by them).
  std::set<std::pair<uid_t, uint32_t>> user_contexts_;
  // The contexts of user `uid`.
  std::vector<uint32_t> contexts_of_user(uid_t uid) const;
  ProtectionDomains pd_{*this};                 // the PD table (pd.h)
  MemoryBackings backings_{*this};               // the backing table and the named regions (pd.h)
  MemoryRegions mr_{*this, tables_, backings_};  // MRs, windows, keys, locked-memory accounts (mr.h)
  DeviceMemory dm_{*this, mr_, backings_};       // the DM table (dm.h)
  CompletionQueues cq_{*this};  // the CQ and channel tables, CQ grants (cq.h)
  SharedReceiveQueues srq_{*this};  // the SRQ table (srq.h)
  QueuePairs qp_{*this, tables_, cq_, srq_};  // the QP table, peers, XRC target handles (qp.h)
  XrcDomains xrc_{*this};  // XRC domains and their handles (xrc.h)
  Names names_{*this, cq_};  // the namespace (names.h)
  std::vector<PendingEvent> events_;
  Quotas quotas_;
  CmPorts cm_ports_{quotas_};  // rdma_cm ports (system daemon)
};

}  // namespace sv::daemon
