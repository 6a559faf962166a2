// pd.cc: protection domains and memory backings (ibv_alloc_pd(3); the
// descriptors MRs are registered from).
#include "daemon/registry.h"

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

int Registry::alloc_pd(uint32_t client, uint32_t& pd) {
  if (int e = quotas_.admit(Quotas::kPd, client_uid(client))) return e;
  pd = next_handle_++;
  quotas_.charge(Quotas::kPd, pd, client_uid(client));
  Pd obj;
  obj.owner = ctx(client);
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
int Registry::reg_backing(uint32_t client, Fd fd, uint32_t& id) {
  if (!fd.valid()) return EINVAL;
  struct stat st {};
  struct statfs sfs {};
  if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode) || ::fstatfs(fd.get(), &sfs) != 0 ||
      sfs.f_type != TMPFS_MAGIC)
    return EINVAL;
  if (st.st_uid != client_uid(client)) return EPERM;
  const int seals = ::fcntl(fd.get(), F_GET_SEALS);
  if (seals < 0 || (seals & (F_SEAL_SHRINK | F_SEAL_SEAL)) != (F_SEAL_SHRINK | F_SEAL_SEAL)) return EINVAL;
  const int fl = ::fcntl(fd.get(), F_GETFL);
  if (fl < 0 || (fl & O_ACCMODE) != O_RDWR || (seals & (F_SEAL_WRITE | F_SEAL_FUTURE_WRITE))) return EPERM;
  if (int e = quotas_.admit(Quotas::kBacking, client_uid(client))) return e;
  id = next_handle_++;
  quotas_.charge(Quotas::kBacking, id, client_uid(client));
  Backing b;
  b.owner = ctx(client);
  b.fd = std::move(fd);
  backings_.insert(id, std::move(b));
  return 0;
}

// A backing the daemon made (device memory's memfd), charged to `uid`.
uint32_t Registry::add_backing(Backing&& b, uid_t uid) {
  const uint32_t id = next_handle_++;
  backings_.insert(id, std::move(b));
  quotas_.charge(Quotas::kBacking, id, uid);
  return id;
}

void Registry::drop_backing(uint32_t id) {
  auto b = backings_.find(id);
  if (b == backings_.end()) return;
  mediation_.forget_backing(id);  // the daemon's windows of it
  if (!b->second.region.empty()) {
    auto r = regions_.find(RegionKey{b->second.region_uid, b->second.region});
    if (r != regions_.end() && --r->second.backings == 0) regions_.erase(r);
  }
  forget(ObjKind::kBacking, id);
}

}  // namespace sv::daemon
