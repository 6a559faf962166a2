// addrinfo.cc: the calls of RDMACM_1.4 (rdma-core v64):
//   rdma_resolve_addrinfo(3)  rdma_getaddrinfo on an id, its result told by
//                             an event (RDMA_CM_EVENT_ADDRINFO_RESOLVED, or
//                             _ADDRINFO_ERROR with the errno as status); a
//                             sync id (created without a channel) waits for
//                             that event in the call, as its other calls do;
//   rdma_query_addrinfo(3)    hands the resolved list to the caller (freed
//                             with rdma_freeaddrinfo);
//   rdma_write_cm_event(3)    puts an RDMA_CM_EVENT_USER event with the
//                             caller's status and 64-bit argument on the
//                             id's channel (to wake a thread waiting there).
// Resolution is by name (RAI_DNS, the default). RAI_SA asks an InfiniBand
// subnet administrator for a service record: the device is RoCE and has
// none, so that is refused at the call (no event), as on a RoCE port.
#include <rdma/rdma_cma.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <mutex>

#include "common/verbs_current.h"
#include "rdmacm/cm_state.h"
#include "rdmacm/device.h"

using namespace sv::rdmacm;
using namespace sv::rdmacm::detail;

namespace {

// Posts `type` for d (g.mu held) and lets a sync id wait for it.
int post_and_complete(Id* d, Event* e, std::unique_lock<std::mutex>& lk) {
  post(d, e);
  if (!d->sync) return 0;
  lk.unlock();  // complete() blocks in rdma_get_cm_event, which takes g.mu
  return complete(d);
}

int refuse(const char* why, int e) {
  std::fprintf(stderr, "softverbs: rdma_resolve_addrinfo: %s\n", why);
  return fail(e);
}

}  // namespace

extern "C" {

int rdma_resolve_addrinfo(rdma_cm_id* id, const char* node, const char* service, const rdma_addrinfo* hints) {
  if (!id) return fail(EINVAL);
  Id* d = id_of(id);
  const int flags = hints ? hints->ai_flags : 0;
  if ((flags & sv::abi::kRaiSa) && (flags & sv::abi::kRaiDns)) return refuse("RAI_SA and RAI_DNS exclude each other", ENOTSUP);
  if (flags & sv::abi::kRaiSa) {
    if (node) return refuse("RAI_SA resolves a service, not a node name", ENOTSUP);
    return refuse("RAI_SA needs an InfiniBand subnet administrator; this RoCE device has none", EOPNOTSUPP);
  }
  uint64_t serial;
  {
    std::lock_guard<std::mutex> lk(g.mu);
    if (d->resolving_ai) return fail(EBUSY);
    d->resolving_ai = true;
    serial = d->serial;
  }
  rdma_addrinfo* res = nullptr;
  int err = 0;
  errno = 0;
  if (rdma_getaddrinfo(node, service, hints, &res) != 0) err = errno ? errno : ENODEV;
  std::unique_lock<std::mutex> lk(g.mu);
  if (find(serial) != d) {  // destroyed meanwhile by another thread
    rdma_freeaddrinfo(res);
    return fail(EINVAL);
  }
  Event* e;
  if (err) {
    d->resolving_ai = false;
    e = new_event(d, rdma_cm_event_type(sv::abi::kCmEventAddrinfoError), err);
  } else {
    d->resolved_ai = res;
    e = new_event(d, rdma_cm_event_type(sv::abi::kCmEventAddrinfoResolved), 0);
  }
  return post_and_complete(d, e, lk);
}

int rdma_query_addrinfo(rdma_cm_id* id, rdma_addrinfo** info) {
  if (!id || !info) return fail(EINVAL);
  Id* d = id_of(id);
  std::lock_guard<std::mutex> lk(g.mu);
  if (!d->resolving_ai || !d->resolved_ai) return fail(ENOENT);
  *info = d->resolved_ai;
  d->resolved_ai = nullptr;
  d->resolving_ai = false;
  return 0;
}

int rdma_write_cm_event(rdma_cm_id* id, rdma_cm_event_type event, int status, uint64_t arg) {
  if (!id || int(event) != sv::abi::kCmEventUser) {
    std::fprintf(stderr, "softverbs: rdma_write_cm_event: only RDMA_CM_EVENT_USER may be written\n");
    return fail(EINVAL);
  }
  Id* d = id_of(id);
  std::lock_guard<std::mutex> lk(g.mu);
  if (!d->id.channel) return fail(EINVAL);
  Event* e = new_event(d, event, status);
  static_assert(sizeof(e->ev.param) >= sizeof(arg));
  std::memcpy(&e->ev.param, &arg, sizeof(arg));  // param.arg in v64's rdma_cm_event
  post(d, e);
  return 0;
}

}  // extern "C"
