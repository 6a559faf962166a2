// pd.h: protection domains (ibv_alloc_pd(3)) and the memory backings MRs
// are registered over: descriptors a client registers (RegBacking), the
// named shared regions of seed 000 (RegShmid), and the files the daemon
// makes for device memory (pd.cc). The registry composes them and reaches
// their tables for resolve, destroy, references and a context's release;
// they reach the registry through ObjectHost.
//
// Contract: single-threaded (the daemon's loop), as the registry.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <vector>

#include "common/protocol.h"
#include "common/sys.h"
#include "daemon/object_host.h"
#include "daemon/objects.h"

namespace sv::daemon {

class ProtectionDomains {
 public:
  explicit ProtectionDomains(ObjectHost& host) : host_(host) {}

  int alloc(uint32_t client, uint32_t& pd);

  ObjectTable<Pd>& table() { return pds_; }
  const ObjectTable<Pd>& table() const { return pds_; }

 private:
  ObjectHost& host_;
  ObjectTable<Pd> pds_;
};

class MemoryBackings {
 public:
  explicit MemoryBackings(ObjectHost& host) : host_(host) {}

  // A descriptor the client registers (a sealed memfd of its user).
  int reg(uint32_t client, Fd fd, uint32_t& id);
  // Seed 000: a backing of the region an id names, made by the first caller.
  int reg_shmid(uint32_t client, const proto::RegShmidReq& req, proto::RegShmidReply& rep, std::vector<int>& out_fds);
  // A backing the daemon made (device memory's memfd), charged to `uid`.
  uint32_t add(Backing&& b, uid_t uid);
  // Backing `id` (null: none).
  const Backing* get(uint32_t id) const {
    auto it = backings_.find(id);
    return it == backings_.end() ? nullptr : &it->second;
  }
  // The end of a backing (its type's cleanup), and what the last reference
  // to one going does: a region's backing goes with its last MR, device
  // memory's with its DM.
  void drop(uint32_t id);
  void unreferenced(uint32_t id);
  uint32_t region_count() const { return uint32_t(regions_.size()); }

  ObjectTable<Backing>& table() { return backings_; }
  const ObjectTable<Backing>& table() const { return backings_; }

 private:
  ObjectHost& host_;
  ObjectTable<Backing> backings_;
  std::map<RegionKey, Region> regions_;
};

}  // namespace sv::daemon
