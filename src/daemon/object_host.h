// object_host.h: what an object type's class (pd.h, mr.h, dm.h, cq.h,
// qp.h, srq.h, xrc.h, names.h) reaches of the registry, which composes them: the caller's
// context, user and process, the quotas, fresh handles, the references
// between objects and the end of an object (objects.h), and the few verbs
// of other types a type's verb uses.
// The registry implements it; a type's class sees nothing else of it, as
// the kernel's uverbs types reach the core only through its uobject calls.
//
// Contract: single-threaded (the daemon's loop), as the registry.
#pragma once

#include <sys/types.h>

#include <cstdint>

#include "common/protocol.h"
#include "daemon/name_space.h"
#include "daemon/objects.h"
#include "daemon/quota.h"

namespace sv::daemon {

// What decides a client's locked-memory limit, read when its process
// connected and confirmed through its pidfd (memlock_limit in identity.cc).
struct ConnectIdentity {
  bool known = false;     // read, and the process was alive throughout
  bool ipc_lock = false;  // CAP_IPC_LOCK in the initial user namespace
  uint64_t memlock = 0;   // RLIMIT_MEMLOCK (soft) in bytes
  uid_t uids[4]{};        // real, effective, saved, filesystem
  gid_t gids[4]{};
};

// A client's process as it connected (registry.cc): what a registration
// records of its registrant and charges to it.
struct ClientView {
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
  uint32_t ctx = 0;  // the context it works in
  uint64_t identity = 0;  // pidfd_identity of its pidfd (common/odp_memory.h)
  int pidfd = -1;
  const ConnectIdentity* at_connect = nullptr;
};

class ObjectHost {
 public:
  // The context a connection works in (0: none), and whether a context is open.
  virtual uint32_t context_of(uint32_t client) const = 0;
  virtual bool context_open(uint32_t context) const = 0;
  // The user of a client's process (uid_t(-1) if unknown), of a context
  // (uid_t(-1) if none), and the client's process.
  virtual uid_t client_uid(uint32_t client) const = 0;
  virtual uid_t context_uid(uint32_t context) const = 0;
  virtual ClientView client_view(uint32_t client) = 0;
  // The same without making one: false for a client not there.
  virtual bool find_client(uint32_t client, ClientView& out) const = 0;
  // Its credentials with its supplementary groups, read now (name_space.h).
  virtual Credentials credentials(uint32_t client) const = 0;
  // May the client receive descriptors of context `owner`'s objects (the
  // same user, root no exception)?
  virtual bool same_user(uint32_t client, uint32_t owner) const = 0;
  // Are the client's user and the context's user the same, so that their
  // objects' entries are in one device segment? (Strictly equal uids.)
  virtual bool same_tables(uint32_t client, uint32_t owner) const = 0;
  // Moves the client into context `target` (ibv_import_device, or opening
  // a name): EBUSY if its own context already holds objects.
  virtual int attach_client(uint32_t client, uint32_t target) = 0;
  // Does the object a name's entry names exist in the entry's context?
  virtual bool names_live_object(const NsEntry& e) const = 0;
  // The client's pinned address space for on-demand paging (registry.cc),
  // opened at its first ODP registration: 0, or EOPNOTSUPP (no pidfd), the
  // quota's errno, ESRCH or EACCES.
  virtual int open_odp_memory(uint32_t client) = 0;
  virtual Quotas& quotas() = 0;
  // The handle the next object gets, and taking it.
  virtual uint32_t next_handle() const = 0;
  virtual uint32_t take_handle() = 0;
  // Takes the references an object declares (held()), as it is made, and
  // drops them (a reference's last drop may free what lives only while
  // referenced: a region's backing, an XRC domain).
  virtual void hold(const Held& refs) = 0;
  virtual void hold(Ref r) = 0;
  virtual void drop(const Held& refs) = 0;
  virtual void drop(Ref r) = 0;
  // The end of an object once its type's cleanup is done: its quota charge
  // released, its entry erased, the references it held dropped.
  virtual void forget(ObjKind kind, uint32_t handle) = 0;
  // An async event (ibv_get_async_event(3)) for every process of a context.
  virtual void context_event(uint32_t context, uint32_t type, uint32_t element) = 0;
  // QPs (qp_reach.cc): the QPs of a context that complete into CQ `cq`
  // go to ERR (a CQ error, IBTA 11.4.2.1), those in RESET excepted.
  virtual void qps_error_on_cq(uint32_t context, uint32_t cq) = 0;

  // Mediation's mappings of a backing that goes (backing_windows.h).
  virtual void forget_backing_windows(uint32_t backing) = 0;
  // QPs: whether QP `qpn` exists; a QP going: its counts join its user's
  // totals (counters.cc).
  virtual bool has_qp(uint32_t qpn) const = 0;
  virtual void retire_counters(const Qp& q) = 0;

 protected:
  ~ObjectHost() = default;
};

}  // namespace sv::daemon
