// dm.cc: device memory (ibv_alloc_dm(3), ibv_reg_dm_mr, ibv_import_dm).
//
// A hardware device's memory (mlx5's MEMIC) is a window of on-chip memory
// the process maps and that MRs can be registered over. softverbs' device
// memory is the daemon's: a memfd it makes at the DM's size (in whole
// pages) and seals against resizing, so no holder's mapping can fault. The
// DM holds it as a backing of its context; the caller, and any process of
// that context that imports the DM by handle, maps it. An MR over a DM
// (RegDmMr) is an ordinary MR-table entry whose backing is the DM's, at file
// offset `offset`, zero-based (ibv_alloc_dm(3): "the MR's address is
// considered to start from zero"), so peers reach it as any MR: mapped by a
// process of the same user, mediated for another user, or over RoCEv2.
//
// Limits: proto::kMaxDmSize bytes per user (whole pages), which is what
// ibv_query_device_ex reports as max_dm_size; ENOMEM beyond, as a device
// out of device memory. Device memory is the daemon's file, not a
// process's pages: it is bounded by that limit and charged to no
// process's RLIMIT_MEMLOCK.
#include "daemon/dm.h"

#include <algorithm>
#include <cerrno>

#include "common/trace.h"

#include "common/sys.h"

namespace sv::daemon {

int DeviceMemory::alloc(uint32_t client, const proto::AllocDmReq& req, proto::DmReply& rep,
                        std::vector<int>& out_fds) {
  // ibv_alloc_dm(3): no comp_mask bit is defined for the request.
  if (req.comp_mask || req.length == 0 || req.log_align_req > proto::kMaxDmLogAlign) return EINVAL;
  if (req.length > proto::kMaxDmSize) return ENOMEM;
  const uint32_t owner = host_.context_of(client);
  if (!host_.context_open(owner)) return EINVAL;
  const uid_t uid = host_.client_uid(client);
  const uint64_t charged = page_up(req.length);
  if (bytes(uid) + charged > proto::kMaxDmSize) {
    SV_TRACE("daemon: uid %u: device memory %llu + %llu beyond %llu: ENOMEM", unsigned(uid),
             (unsigned long long)bytes(uid), (unsigned long long)charged,
             (unsigned long long)proto::kMaxDmSize);
    return ENOMEM;
  }
  Quotas& quotas = host_.quotas();
  if (int e = quotas.admit(Quotas::kDm, uid)) return e;
  if (int e = quotas.admit(Quotas::kBacking, uid)) return e;  // a DM comes with a backing
  Fd fd;
  if (int e = make_memfd("softverbs-dm", charged, fd)) return e;
  const int map_fd = fd.get();

  Backing b;
  b.owner = owner;
  b.fd = std::move(fd);
  b.limit = req.length;
  b.dm = true;
  const uint32_t backing = backings_.add(std::move(b), uid);

  const uint32_t handle = host_.take_handle();
  Dm dm;
  dm.owner = owner;
  dm.backing = backing;
  dm.length = req.length;
  dm.charged = charged;
  dm.uid = uid;
  host_.hold(dms_.insert(handle, std::move(dm)).held());
  quotas.charge(Quotas::kDm, handle, uid);
  bytes_[uid] += charged;

  rep.handle = handle;
  rep.backing = backing;
  rep.length = req.length;
  rep.map_size = charged;
  out_fds.push_back(map_fd);
  return 0;
}

// The end of a DM (ibv_free_dm, or its context's release after its MRs):
// its bytes go back to its user; its backing goes with it (drop()).
void DeviceMemory::release(uint32_t handle) {
  auto it = dms_.find(handle);
  if (it == dms_.end()) return;
  if (auto u = bytes_.find(it->second.uid); u != bytes_.end()) {
    u->second -= std::min(u->second, it->second.charged);
    if (u->second == 0) bytes_.erase(u);
  }
  host_.forget(ObjKind::kDm, handle);
}

// ibv_import_dm(3): "imports a device memory from a context that is shared
// with the current one" (ibv_import_device): a DM of the caller's context
// only. Any other handle, another context's included, is EINVAL.
int DeviceMemory::import(uint32_t handle, const Dm& dm, proto::DmReply& rep, std::vector<int>& out_fds) {
  const Backing* b = backings_.get(dm.backing);
  if (!b) return EINVAL;
  rep.handle = handle;
  rep.backing = dm.backing;
  rep.length = dm.length;
  rep.map_size = dm.charged;
  out_fds.push_back(b->fd.get());
  return 0;
}

// ibv_reg_dm_mr (ibv_alloc_dm(3)): an MR over [offset, offset + length) of
// the DM, with IBV_ACCESS_ZERO_BASED (its addresses are offsets from the
// MR's start); the access rules of ibv_reg_mr(3) otherwise. A zero length
// is accepted (a key for no byte; mlx5 takes it, rdma-core's tests use it).
int DeviceMemory::reg_mr(uint32_t client, uint32_t pd, const Dm& dm, const proto::RegDmMrReq& req,
                         proto::RegMrReply& rep) {
  if (!(req.access & IBV_ACCESS_ZERO_BASED) || (req.access & ~kKnownAccess)) return EINVAL;
  if ((req.access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) && !(req.access & IBV_ACCESS_LOCAL_WRITE))
    return EINVAL;
  if (req.offset > dm.length || req.length > dm.length - req.offset) return EINVAL;
  proto::RegMrReq r{};
  r.pd = pd;
  r.backing = dm.backing;
  r.addr = req.offset;  // the backing's file offset
  r.length = req.length;
  r.iova = 0;
  r.access = req.access;
  return mrs_.install(client, r, false, req.dm, rep);
}

}  // namespace sv::daemon
