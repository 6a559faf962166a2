// dm.h: device memory (ibv_alloc_dm(3), ibv_reg_dm_mr, ibv_import_dm): the
// DM table and the bytes each user holds, and the DM verbs (dm.cc); an MR
// over device memory is made by MemoryRegions (mr.h). The
// registry composes it and reaches the table for resolve, destroy and a
// context's release; it reaches the registry through ObjectHost.
//
// Contract: single-threaded (the daemon's loop), as the registry.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <vector>

#include "common/protocol.h"
#include "daemon/mr.h"
#include "daemon/object_host.h"
#include "daemon/pd.h"
#include "daemon/objects.h"

namespace sv::daemon {

class DeviceMemory {
 public:
  // `mrs`: where an MR over device memory is made; `backings`: where a
  // DM's file is kept.
  DeviceMemory(ObjectHost& host, MemoryRegions& mrs, MemoryBackings& backings)
      : host_(host), mrs_(mrs), backings_(backings) {}

  // ibv_alloc_dm(3): a DM of the client's context, its memfd in out_fds.
  int alloc(uint32_t client, const proto::AllocDmReq& req, proto::DmReply& rep, std::vector<int>& out_fds);
  // ibv_import_dm(3): DM `handle` (resolved by the command layer) and its memfd.
  int import(uint32_t handle, const Dm& dm, proto::DmReply& rep, std::vector<int>& out_fds);
  // ibv_reg_dm_mr: an MR over DM `dm` in PD `pd` (both the client's).
  int reg_mr(uint32_t client, uint32_t pd, const Dm& dm, const proto::RegDmMrReq& req, proto::RegMrReply& rep);
  // The end of a DM (its type's cleanup: ibv_free_dm, or its context's release).
  void release(uint32_t handle);
  // Bytes of device memory `uid` holds (whole pages).
  uint64_t bytes(uid_t uid) const {
    auto it = bytes_.find(uid);
    return it == bytes_.end() ? 0 : it->second;
  }

  ObjectTable<Dm>& table() { return dms_; }
  const ObjectTable<Dm>& table() const { return dms_; }

 private:
  ObjectHost& host_;
  MemoryRegions& mrs_;
  MemoryBackings& backings_;
  ObjectTable<Dm> dms_;
  std::map<uid_t, uint64_t> bytes_;  // device memory per user (whole pages)
};

}  // namespace sv::daemon
