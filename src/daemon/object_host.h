// object_host.h: what an object type's class (dm.h, xrc.h, srq.h) reaches
// of the registry, which composes them: the caller's context and user, the
// quotas, fresh handles, the references between objects and the end of an
// object (objects.h), and the few verbs of other types a type's verb uses.
// The registry implements it; a type's class sees nothing else of it, as
// the kernel's uverbs types reach the core only through its uobject calls.
//
// Contract: single-threaded (the daemon's loop), as the registry.
#pragma once

#include <sys/types.h>

#include <cstdint>

#include "common/protocol.h"
#include "daemon/objects.h"
#include "daemon/quota.h"

namespace sv::daemon {

class ObjectHost {
 public:
  // The context a connection works in (0: none), and whether a context is open.
  virtual uint32_t context_of(uint32_t client) const = 0;
  virtual bool context_open(uint32_t context) const = 0;
  // The user of a client's process (uid_t(-1) if unknown).
  virtual uid_t client_uid(uint32_t client) const = 0;
  virtual Quotas& quotas() = 0;
  // The handle the next object gets, and taking it.
  virtual uint32_t next_handle() const = 0;
  virtual uint32_t take_handle() = 0;
  // Takes the references an object declares (held()), as it is made.
  virtual void hold(const Held& refs) = 0;
  // The end of an object once its type's cleanup is done: its quota charge
  // released, its entry erased, the references it held dropped.
  virtual void forget(ObjKind kind, uint32_t handle) = 0;
  // An async event (ibv_get_async_event(3)) for every process of a context.
  virtual void context_event(uint32_t context, uint32_t type, uint32_t element) = 0;
  // QPs (qp_reach.cc): the QPs of a context that complete into CQ `cq`
  // go to ERR (a CQ error, IBTA 11.4.2.1), those in RESET excepted.
  virtual void qps_error_on_cq(uint32_t context, uint32_t cq) = 0;

  // Backings (pd.cc): a new one, charged to `uid` (its handle), and one by id.
  virtual uint32_t add_backing(Backing&& b, uid_t uid) = 0;
  virtual const Backing* backing(uint32_t id) const = 0;
  // MRs (mr.cc): makes the MR `req` describes, checked; `charge`: count its
  // pages as the registrant's locked memory; `dm`: the DM it is over.
  virtual int install_mr(uint32_t client, const proto::RegMrReq& req, bool charge, uint32_t dm,
                         proto::RegMrReply& rep) = 0;

 protected:
  ~ObjectHost() = default;
};

}  // namespace sv::daemon
