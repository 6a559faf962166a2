// pd.cc: protection domains and memory backings (ibv_alloc_pd(3); the
// descriptors MRs are registered from; see pd.h).
#include "daemon/pd.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/statfs.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/trace.h"

#ifndef F_SEAL_FUTURE_WRITE
#define F_SEAL_FUTURE_WRITE 0x0010  // Linux 5.1
#endif

namespace sv::daemon {

using namespace sv::shm;

int ProtectionDomains::alloc(uint32_t client, uint32_t& pd) {
  if (int e = host_.quotas().admit(Quotas::kPd, host_.client_uid(client))) return e;
  pd = host_.take_handle();
  host_.quotas().charge(Quotas::kPd, pd, host_.client_uid(client));
  Pd obj;
  obj.owner = host_.context_of(client);
  pds_.insert(pd, std::move(obj));
  return 0;
}

// A backing is mapped by the registrant's peers (same user) and, a page at
// a time, by the daemon (mediated atomics): a file its holder could shrink
// would turn their next access into SIGBUS. Accepted: a memfd (tmpfs,
// not hugetlbfs, whose faults can SIGBUS when the pool runs dry) sealed
// against shrinking for good (F_SEAL_SHRINK | F_SEAL_SEAL, fcntl(2)), open
// for writing and not write-sealed (the daemon writes mediated data into it
// and peers map it writable), and created by the registering user: not a
// segment of the daemon's (the device, a CQ granted by another user), which
// the daemon would then write as that user's memory. Its size is checked at
// each registration.
int MemoryBackings::reg(uint32_t client, Fd fd, uint32_t& id) {
  if (!fd.valid()) return EINVAL;
  struct stat st {};
  struct statfs sfs {};
  if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode) || ::fstatfs(fd.get(), &sfs) != 0 ||
      sfs.f_type != TMPFS_MAGIC)
    return EINVAL;
  if (st.st_uid != host_.client_uid(client)) return EPERM;
  const int seals = ::fcntl(fd.get(), F_GET_SEALS);
  if (seals < 0 || (seals & (F_SEAL_SHRINK | F_SEAL_SEAL)) != (F_SEAL_SHRINK | F_SEAL_SEAL)) return EINVAL;
  const int fl = ::fcntl(fd.get(), F_GETFL);
  if (fl < 0 || (fl & O_ACCMODE) != O_RDWR || (seals & (F_SEAL_WRITE | F_SEAL_FUTURE_WRITE))) return EPERM;
  if (int e = host_.quotas().admit(Quotas::kBacking, host_.client_uid(client))) return e;
  id = host_.take_handle();
  host_.quotas().charge(Quotas::kBacking, id, host_.client_uid(client));
  Backing b;
  b.owner = host_.context_of(client);
  b.fd = std::move(fd);
  backings_.insert(id, std::move(b));
  return 0;
}

// A backing the daemon made (device memory's memfd), charged to `uid`.
uint32_t MemoryBackings::add(Backing&& b, uid_t uid) {
  const uint32_t id = host_.take_handle();
  backings_.insert(id, std::move(b));
  host_.quotas().charge(Quotas::kBacking, id, uid);
  return id;
}

void MemoryBackings::unreferenced(uint32_t id) {
  const Backing& b = backings_.at(id);
  if (!b.region.empty() || b.dm) drop(id);
}

void MemoryBackings::drop(uint32_t id) {
  auto b = backings_.find(id);
  if (b == backings_.end()) return;
  host_.forget_backing_windows(id);  // the daemon's windows of it
  if (!b->second.region.empty()) {
    auto r = regions_.find(RegionKey{b->second.region_uid, b->second.region});
    if (r != regions_.end() && --r->second.backings == 0) regions_.erase(r);
  }
  host_.forget(ObjKind::kBacking, id);
}

// Seed 000: register memory under a byte-array id. The first caller creates
// the region, later callers attach, in any order; no caller is the master.
// An id names a region of the caller's user only: the same id asked by
// another user is another region (no attach across users, no squatting).
int MemoryBackings::reg_shmid(uint32_t client, const proto::RegShmidReq& req, proto::RegShmidReply& rep,
                              std::vector<int>& out_fds) {
  if (req.id_len == 0 || req.id_len > proto::kMaxShmidLen) return EINVAL;
  const uint32_t owner = host_.context_of(client);
  if (!host_.context_open(owner)) return EINVAL;
  uid_t uid = host_.context_uid(owner);  // the context's user: its memory is that user's
  if (int e = host_.quotas().admit(Quotas::kBacking, host_.client_uid(client))) return e;  // a region comes with a backing
  std::string id(reinterpret_cast<const char*>(req.id), req.id_len);
  RegionKey key{uid, id};
  auto r = regions_.find(key);
  rep.created = 0;
  if (r == regions_.end()) {
    if (req.length == 0 || req.length > kMaxMrSize) return EINVAL;
    Region region{Fd(), page_up(req.length), 0};
    if (int e = make_memfd("softverbs-region", region.length, region.fd)) return e;
    r = regions_.emplace(key, std::move(region)).first;
    rep.created = 1;
  } else if (req.length > r->second.length) {
    return EINVAL;  // attaching callers may not ask for more than the region holds
  }
  Fd dup;
  if (int e = dup_fd(r->second.fd.get(), dup)) {
    if (rep.created) regions_.erase(r);
    return e;
  }
  uint32_t handle = host_.take_handle();
  Backing b;
  b.owner = host_.context_of(client);
  b.fd = std::move(dup);
  b.region = id;
  b.limit = r->second.length;
  b.region_uid = uid;
  backings_.insert(handle, std::move(b));
  host_.quotas().charge(Quotas::kBacking, handle, host_.client_uid(client));
  r->second.backings++;
  rep.backing = handle;
  rep.length = r->second.length;
  out_fds.push_back(r->second.fd.get());
  return 0;
}


}  // namespace sv::daemon
