// Device memory (ibv_alloc_dm(3)): ibv_alloc_dm, ibv_free_dm,
// ibv_memcpy_to_dm/ibv_memcpy_from_dm, ibv_reg_dm_mr, ibv_import_dm and
// ibv_unimport_dm.
//
// The daemon owns a DM (src/daemon/dm.cc): a memfd sealed at its size,
// which this process maps. Copies to and from it are memcpy on that
// mapping; an MR over it is a zero-based MR-table entry whose backing is the
// DM's, and this process reaches it through the same mapping (a local view,
// as for named regions), peers through the backing like any MR.
//
// Access to device memory is in 4-byte words, as on the devices rdma-core's
// DM API was made for (mlx5's MEMIC): ibv_memcpy_*_dm refuses an offset or a
// length that is not a multiple of 4 (EINVAL), as it refuses a range beyond
// the allocation (EINVAL).
#include <sys/mman.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <new>

#include "verbs/provider.h"

namespace sv::verbs {
namespace {

struct Dm {
  ibv_dm dm;  // first: what the application holds
  Mapping map;
  uint64_t length = 0;
  uint32_t backing = 0;
};

Dm* to_dm(ibv_dm* dm) { return reinterpret_cast<Dm*>(dm); }

constexpr uint64_t kDmWord = 4;

// Is [offset, offset + length) a run of whole words within the DM?
bool dm_range_ok(const Dm& d, uint64_t offset, size_t length) {
  if (offset % kDmWord || length % kDmWord) return false;
  return offset <= d.length && length <= d.length - offset;
}

int memcpy_to_dm(ibv_dm* ibdm, uint64_t offset, const void* host, size_t length) {
  Dm* d = to_dm(ibdm);
  if (!dm_range_ok(*d, offset, length) || (length && !host)) return EINVAL;
  std::memcpy(d->map.as<uint8_t>() + offset, host, length);
  return 0;
}

int memcpy_from_dm(void* host, ibv_dm* ibdm, uint64_t offset, size_t length) {
  Dm* d = to_dm(ibdm);
  if (!dm_range_ok(*d, offset, length) || (length && !host)) return EINVAL;
  std::memcpy(host, d->map.as<const uint8_t>() + offset, length);
  return 0;
}

// A DM handle of this process from a DmReply and its descriptor: mapped,
// and recorded as a local view of its backing so this process's MRs over
// it are reached through this mapping. NULL with errno on failure.
ibv_dm* new_dm_handle(ibv_context* c, const proto::DmReply& rep, std::vector<Fd>& fds) {
  Mapping map;
  if (int e = map_shared(fds[0].get(), 0, rep.map_size, PROT_READ | PROT_WRITE, false, map)) {
    errno = e;
    return nullptr;
  }
  auto* d = new (std::nothrow) Dm{};
  if (!d) {
    errno = ENOMEM;
    return nullptr;
  }
  d->dm.context = c;
  d->dm.memcpy_to_dm = memcpy_to_dm;
  d->dm.memcpy_from_dm = memcpy_from_dm;
  d->dm.comp_mask = IBV_DM_MASK_HANDLE;
  d->dm.handle = rep.handle;
  d->map = std::move(map);
  d->length = rep.length;
  d->backing = rep.backing;
  ContextState& st = ctx_state(c);
  std::lock_guard<std::mutex> g(st.mu);
  st.local_views[rep.backing] = {d->map.as<uint8_t>(), 0};
  return &d->dm;
}

// Unmaps the DM here and forgets its local view (if it is this mapping's).
void delete_dm_handle(Dm* d) {
  ContextState& st = ctx_state(d->dm.context);
  {
    std::lock_guard<std::mutex> g(st.mu);
    auto v = st.local_views.find(d->backing);
    if (v != st.local_views.end() && v->second.first == d->map.as<uint8_t>()) st.local_views.erase(v);
  }
  delete d;
}

}  // namespace

ibv_dm* alloc_dm(ibv_context* c, ibv_alloc_dm_attr* attr) {
  if (!attr) {
    errno = EINVAL;
    return nullptr;
  }
  ContextState& st = ctx_state(c);
  proto::AllocDmReq req{};
  req.length = attr->length;
  req.log_align_req = attr->log_align_req;
  req.comp_mask = attr->comp_mask;
  proto::DmReply rep{};
  std::vector<Fd> fds;
  if (int e = st.conn.call<proto::Op::AllocDm>(req, rep, {}, &fds)) {
    errno = e;
    return nullptr;
  }
  ibv_dm* dm = new_dm_handle(c, rep, fds);
  if (!dm) {
    const int e = errno;
    proto::HandleReq f{};
    f.handle = rep.handle;
    proto::Empty frep{};
    st.conn.call<proto::Op::FreeDm>(f, frep);
    errno = e;
  }
  return dm;
}

// ibv_free_dm: EBUSY while MRs are registered over it (the daemon says).
int free_dm(ibv_dm* ibdm) {
  Dm* d = to_dm(ibdm);
  ContextState& st = ctx_state(ibdm->context);
  proto::HandleReq req{};
  req.handle = ibdm->handle;
  proto::Empty rep{};
  if (int e = destroy_result(st, st.conn.call<proto::Op::FreeDm>(req, rep))) return e;
  delete_dm_handle(d);
  return 0;
}

// ibv_reg_dm_mr: IBV_ACCESS_ZERO_BASED is required (ibv_alloc_dm(3)); the
// MR's addresses are offsets from its start, so its addr is NULL, as
// rdma-core's ibv_cmd_reg_dm_mr leaves it.
ibv_mr* reg_dm_mr(ibv_pd* pd, ibv_dm* ibdm, uint64_t offset, size_t length, unsigned int access) {
  if (!pd || !ibdm || pd->context != ibdm->context) {
    errno = EINVAL;
    return nullptr;
  }
  ContextState& st = ctx_state(pd->context);
  proto::RegDmMrReq req{};
  req.pd = to_pd(pd)->handle;
  req.dm = ibdm->handle;
  req.offset = offset;
  req.length = length;
  req.access = access & ~uint32_t(IBV_ACCESS_OPTIONAL_RANGE);
  proto::RegMrReply rep{};
  if (int e = st.conn.call<proto::Op::RegDmMr>(req, rep)) {
    errno = e;
    return nullptr;
  }
  Mr* mr = new_mr_handle(pd, nullptr, length, rep.handle, rep.key);
  if (!mr) {
    proto::HandleReq d{};
    d.handle = rep.handle;
    proto::Empty drep{};
    st.conn.call<proto::Op::DeregMr>(d, drep);
    errno = ENOMEM;
    return nullptr;
  }
  return &mr->mr;
}

}  // namespace sv::verbs

using namespace sv;
using namespace sv::verbs;

#pragma GCC visibility push(default)
extern "C" {

// ibv_import_dm(3): a DM of a context this one shares (ibv_import_device),
// by its handle. The DM stays the context's: ibv_unimport_dm only drops
// this process's handle; one holder frees it with ibv_free_dm.
ibv_dm* ibv_import_dm(ibv_context* c, uint32_t dm_handle) {
  if (!c) {
    errno = EINVAL;
    return nullptr;
  }
  ContextState& st = ctx_state(c);
  proto::HandleReq req{};
  req.handle = dm_handle;
  proto::DmReply rep{};
  std::vector<Fd> fds;
  if (int e = st.conn.call<proto::Op::ImportDm>(req, rep, {}, &fds)) {
    errno = e;
    return nullptr;
  }
  return new_dm_handle(c, rep, fds);
}

void ibv_unimport_dm(ibv_dm* dm) {
  if (dm) delete_dm_handle(to_dm(dm));
}

}  // extern "C"
#pragma GCC visibility pop
