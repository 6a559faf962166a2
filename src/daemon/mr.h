// mr.h: memory regions, memory windows and their keys (IBTA 10.6;
// ibv_reg_mr(3), ibv_alloc_mw(3), ibv_bind_mw(3)): the MR and window
// tables (by MR-table slot), the key bytes of the slots, the windows bound
// to each MR, the registrants' locked-memory accounts, and the MR and
// window verbs (mr.cc). Their entries are written in the device tables
// (device_tables.h), which the registry owns and lends it. The registry
// composes it and reaches the tables for resolve, destroy and a context's
// release; it reaches the registry through ObjectHost. Which MRs a key
// reaches for a client is the QPs' (qp_reach.cc).
//
// Contract: single-threaded (the daemon's loop), as the registry.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "common/protocol.h"
#include "common/shm_layout.h"
#include "daemon/device_tables.h"
#include "daemon/object_host.h"
#include "daemon/objects.h"
#include "daemon/pd.h"

namespace sv::daemon {

class MemoryRegions {
 public:
  MemoryRegions(ObjectHost& host, DeviceTables& tables, MemoryBackings& backings);

  // The registrations: `b` is backing req.backing (the client's).
  int reg(uint32_t client, const Backing& b, const proto::RegMrReq& req, proto::RegMrReply& rep);
  // An on-demand-paging MR (IBV_ACCESS_ON_DEMAND): over the registrant's
  // address space as it is at each access; no backing, no charge.
  int reg_odp(uint32_t client, const proto::RegMrReq& req, proto::RegMrReply& rep);
  // Makes the MR `req` describes (checked); `charge`: count its pages as
  // the registrant's locked memory (not for device memory); `dm`: the DM
  // it is registered over (DeviceMemory::reg_mr).
  int install(uint32_t client, const proto::RegMrReq& req, bool charge, uint32_t dm, proto::RegMrReply& rep);
  // ibv_rereg_mr(3): `backing`: the new one of a move (null: none named).
  int rereg(uint32_t client, Mr& mr, const Backing* backing, const proto::ReregMrReq& req, proto::RegMrReply& rep);
  // A new registration of MR `mr`'s pages (the client's MR of key req.key).
  int reg_shared(uint32_t client, const Mr& mr, const proto::RegSharedReq& req, proto::RegMrReply& rep);
  // ibv_query_mr: what MR `handle` covers.
  void query(uint32_t handle, const Mr& mr, proto::QueryMrReply& rep) const;
  // The backing of MR `mr`, which the key of the request reaches (resolved
  // by the command layer, HandleRule::kReachableKey).
  int get_backing(const Mr& mr, proto::GetMrBackingReply& rep, std::vector<int>& out_fds);
  // The ODP MRs of context `ctx` that process `pid` registered go (its
  // process exited or its connection closed), with the windows over them.
  void registrant_gone(uint32_t ctx, pid_t pid);
  // The end of an MR (its type's cleanup: dereg, or its context's release).
  void release(uint32_t slot);

  int alloc_mw(uint32_t client, uint32_t pd, const proto::AllocMwReq& req, proto::KeyReply& rep);
  // Window `mw` (req.mw) through QP `qp` (req.qpn), both the client's.
  int bind_mw(Mw& mw, const Qp& qp, const proto::BindMwReq& req, proto::KeyReply& rep);
  // QP req.qpn is the client's (resolved by the command layer, or checked by
  // Registry::invalidate_remote); the key names the window.
  int invalidate(uint32_t client, const proto::InvalidateReq& req);
  // Windows of other contexts bound to the MRs about to go die with them
  // (the MR type's `before` hook of a context's release).
  void unbind_windows_of(const std::vector<uint32_t>& mrs);
  // The end of a window (its type's cleanup).
  void release_mw(uint32_t slot);

  // The entry a key names (null: none, or a stale key).
  const shm::MrEntry* entry(uint32_t key) const;
  // Locked-memory accounts (pid -> charge), for `softverbs status`.
  void accounts(proto::AccountsReply& rep) const;

  ObjectTable<Mr>& table() { return mrs_; }
  const ObjectTable<Mr>& table() const { return mrs_; }
  ObjectTable<Mw>& windows() { return mws_; }
  const ObjectTable<Mw>& windows() const { return mws_; }

 private:
  struct Account {
    uid_t uid;
    uint64_t locked_bytes = 0;
    uint64_t limit_bytes = 0;
  };
  int check(const Backing& b, const proto::RegMrReq& req);
  void fill_entry(shm::MrEntry& e, const proto::RegMrReq& req, uint32_t client);
  int charge_memlock(uint32_t client, uint64_t addr, uint64_t length, uint64_t credit, uint64_t& bytes);
  void uncharge_memlock(pid_t pid, uint64_t bytes);
  uint32_t alloc_key_slot();
  void unbind_mw(uint32_t slot, Mw& mw);

  ObjectHost& host_;
  DeviceTables& tables_;
  MemoryBackings& backings_;
  ObjectTable<Mr> mrs_;  // by slot in the MR table
  ObjectTable<Mw> mws_;  // by slot in the MR table
  // (MR slot, window slot) of every bound window: the windows of the MRs a
  // context's release frees without a walk over every window.
  std::set<std::pair<uint32_t, uint32_t>> mw_bound_;
  std::map<pid_t, Account> accounts_;
  std::vector<uint8_t> key_byte_;  // per MR slot: last key byte used
  uint32_t next_slot_ = 1;
};

}  // namespace sv::daemon
