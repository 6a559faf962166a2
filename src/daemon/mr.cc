// mr.cc: memory regions, memory windows and their keys (IBTA 10.6;
// ibv_reg_mr(3), ibv_alloc_mw(3), ibv_bind_mw(3)), and who may map an MR's
// backing (see mr.h).
#include "daemon/mr.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "common/access.h"
#include "common/trace.h"
#include "daemon/identity.h"

namespace sv::daemon {

using namespace sv::shm;

MemoryRegions::MemoryRegions(ObjectHost& host, DeviceTables& tables, MemoryBackings& backings)
    : host_(host), tables_(tables), backings_(backings), key_byte_(kMrTableSize, 0) {}

// Is `req` over backing `b` a registration that may be made (ibv_reg_mr(3))?
// The one check for a new registration (RegMr, RegShared) and for what a
// re-registration would make of an existing one (ReregMr); its PD and
// backing are the registrant's (resolved by the command layer, or the MR's own).
int MemoryRegions::check(const Backing& backing, const proto::RegMrReq& req) {
  const Backing* b = &backing;
  if (b->dm) return EINVAL;  // device memory is registered by RegDmMr alone (dm.cc)
  if (req.access & ~kKnownAccess) return EINVAL;
  // ibv_reg_mr(3): remote write or remote atomic access needs local write.
  if ((req.access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) &&
      !(req.access & IBV_ACCESS_LOCAL_WRITE))
    return EINVAL;
  if (req.length == 0 || req.length > kMaxMrSize) return EINVAL;
  if (req.addr + req.length < req.addr || req.addr + req.length > (1ull << 57)) return EINVAL;
  if (req.iova + req.length < req.iova) return EINVAL;
  if (!b->region.empty() && req.addr + req.length > b->limit) return EINVAL;
  // The file must hold the whole range now; sealed, it cannot shrink later
  // (reg_backing), so no holder of a mapping of it meets SIGBUS.
  struct stat st {};
  if (::fstat(b->fd.get(), &st) != 0 || uint64_t(st.st_size) < req.addr + req.length) return EINVAL;
  return 0;
}

// The ODP MRs a registrant made in context `ctx` (Registry::odp_owner_gone).
void MemoryRegions::registrant_gone(uint32_t ctx, pid_t pid) {
  std::vector<uint32_t> gone;
  for (uint32_t h : mrs_.of(ctx)) {
    const MrEntry& e = tables_.mr_at(h);
    if (e.backing == kOdpBacking && e.owner_pid == uint32_t(pid)) gone.push_back(h);
  }
  unbind_windows_of(gone);  // a window over them dies with them
  for (uint32_t h : gone) release(h);
}

// Writes an MR's entry from `req`; the caller publishes its key after.
void MemoryRegions::fill_entry(MrEntry& e, const proto::RegMrReq& req, uint32_t client) {
  const ClientView c = host_.client_view(client);
  e.access = req.access;
  e.pd = req.pd;
  e.backing = req.backing;
  e.iova = req.iova;
  e.length = req.length;
  e.file_offset = req.addr;
  e.owner_pid = uint32_t(c.pid);
  e.owner_identity = c.identity;
  e.kind = kKindMr;
  e.bound_qpn = 0;
  e.generation++;
}

int MemoryRegions::reg(uint32_t client, const Backing& b, const proto::RegMrReq& req, proto::RegMrReply& rep) {
  if (req.flags) return EINVAL;
  if (int e = check(b, req)) return e;
  return install(client, req, true, 0, rep);
}

// ibv_reg_mr(3) with IBV_ACCESS_ON_DEMAND: the entry names the registrant's
// addresses (file_offset = addr in that process, owner_pid its pid), with
// no backing and no RLIMIT_MEMLOCK charge (nothing is pinned, as with the
// kernel's ODP). Implicit ODP: addr 0, length SIZE_MAX, iova 0 (the MR's
// addresses are the process's). Whether a page is there is decided at
// each access, by the kernel, in the accessor's copy through the
// registrant's pinned address space (common/odp_memory.h), which the
// daemon opens here once per client.
// With proto::kRegThroughOwner, the same for memory the registrant cannot
// share otherwise: not ON_DEMAND, not implicit, and charged as pinned.
int MemoryRegions::reg_odp(uint32_t client, const proto::RegMrReq& req, proto::RegMrReply& rep) {
  constexpr uint32_t kOdpAccess = kKnownAccess | IBV_ACCESS_ON_DEMAND;
  const bool through_owner = req.flags == proto::kRegThroughOwner;
  if (req.flags & ~proto::kRegThroughOwner) return EINVAL;
  if (through_owner ? (req.access & ~kKnownAccess) || req.length == kImplicitOdpLength
                    : !(req.access & IBV_ACCESS_ON_DEMAND) || (req.access & ~kOdpAccess))
    return EINVAL;
  // The MR dies with its process, and every copy of its memory goes
  // through its pinned address space (Registry::open_odp_memory).
  if (int e = host_.open_odp_memory(client)) return e;
  if ((req.access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) && !(req.access & IBV_ACCESS_LOCAL_WRITE))
    return EINVAL;
  proto::RegMrReq r = req;
  r.backing = kOdpBacking;
  if (req.addr == 0 && req.length == kImplicitOdpLength) {
    if (req.iova != 0 || (req.access & IBV_ACCESS_ZERO_BASED)) return EINVAL;
  } else {
    if (req.length == 0 || req.length > kMaxMrSize) return EINVAL;
    if (req.addr + req.length < req.addr || req.addr + req.length > (1ull << 57)) return EINVAL;
    if (req.iova + req.length < req.iova) return EINVAL;
  }
  return install(client, r, through_owner, 0, rep);
}

// The MR's key slot, entry and object; `charge`: its pages count as the
// registrant's locked memory; `dm`: the device memory it is registered over.
int MemoryRegions::install(uint32_t client, const proto::RegMrReq& req, bool charge, uint32_t dm,
                           proto::RegMrReply& rep) {
  if (int e = host_.quotas().admit(Quotas::kMr, host_.client_uid(client))) return e;

  uint32_t slot = alloc_key_slot();
  if (!slot) return ENOMEM;
  // The entry goes to the registrant's user's device segment.
  if (int err = tables_.claim_mr(slot, host_.context_uid(host_.context_of(client)))) return err;
  uint64_t bytes = 0;
  if (charge) {
    if (int err = charge_memlock(client, req.addr, req.length, 0, bytes)) return err;
  }

  uint8_t kb = ++key_byte_[slot];
  // An implicit ODP MR's key byte is even (nonzero). UCX 1.13's
  // uct_ib_md_close hands its global ODP memory handle (lkey, rkey, ...,
  // flags) to uct_ib_mem_dereg as a uct_md_mem_dereg_params_t, whose
  // field_mask is then the lkey and rkey: with the lkey's bit 0 (the memh
  // field's bit) set, it takes the handle's flags word for the handle and
  // crashes; clear, it returns at once. Keys are opaque to applications
  // (ibv_reg_mr(3)), so any byte will do; the slot's stale keys still
  // fail, the byte cycling through 127 values instead of 255.
  if (req.backing == kOdpBacking && req.addr == 0 && req.length == kImplicitOdpLength) {
    kb = uint8_t(kb + (kb & 1));
    key_byte_[slot] = kb = kb ? kb : 2;
  }
  uint32_t key = (slot << 8) | kb;
  if (key == 0) key = (slot << 8) | ++key_byte_[slot];

  MrEntry& e = tables_.mr_at(slot);
  fill_entry(e, req, client);
  e.key.store(key, std::memory_order_release);  // publish last

  host_.quotas().charge(Quotas::kMr, slot, host_.client_uid(client));
  Mr mr;
  mr.owner = host_.context_of(client);
  mr.key = key;
  mr.pd = req.pd;
  mr.backing = req.backing == kOdpBacking ? 0 : req.backing;  // ODP: holds no backing
  mr.charged_pid = host_.client_view(client).pid;
  mr.charged_bytes = bytes;
  mr.dm = dm;
  host_.hold(mrs_.insert(slot, std::move(mr)).held());
  rep.handle = slot;
  rep.key = key;
  return 0;
}

// ibv_rereg_mr(3) as one change of the MR's entry: its lkey and rkey stay
// (a peer holding the rkey goes on using it), what `flags` names changes,
// and the result is checked as a new registration is. Refused (EBUSY, as
// dereg_mr is) while memory windows are bound to it: their entries were
// cut from its range and rights. Any refusal leaves the MR exactly as it
// was.
int MemoryRegions::rereg(uint32_t client, Mr& the_mr, const Backing* backing, const proto::ReregMrReq& req,
                         proto::RegMrReply& rep) {
  constexpr uint32_t kFlags = IBV_REREG_MR_CHANGE_TRANSLATION | IBV_REREG_MR_CHANGE_PD | IBV_REREG_MR_CHANGE_ACCESS;
  Mr* mr = &the_mr;
  if (req.flags == 0 || (req.flags & ~kFlags)) return EINVAL;
  if (mr->dm) return EINVAL;  // an MR over device memory is not re-registered (as mlx5)
  if (mr->refs) return EBUSY;
  MrEntry& e = tables_.mr_at(req.handle);
  if (e.backing == kOdpBacking) return EOPNOTSUPP;  // an ODP MR is registered anew
  const bool moves = req.flags & IBV_REREG_MR_CHANGE_TRANSLATION;
  proto::RegMrReq n{};
  n.pd = (req.flags & IBV_REREG_MR_CHANGE_PD) ? req.pd : mr->pd;
  n.access = (req.flags & IBV_REREG_MR_CHANGE_ACCESS) ? req.access : e.access;
  n.backing = moves ? req.backing : mr->backing;
  n.addr = moves ? req.addr : e.file_offset;
  n.length = moves ? req.length : e.length;
  n.iova = moves ? req.iova : e.iova;
  // A new PD or backing is named (and resolved as the caller's); else the MR's own.
  if (!n.pd || !n.backing || (moves && !backing)) return EINVAL;
  if (int err = check(moves ? *backing : *backings_.get(mr->backing), n)) return err;
  // New pages are charged to the caller, the old charge counted as gone
  // when the caller holds it; then the old charge is released.
  uint64_t bytes = mr->charged_bytes;
  if (moves) {
    const pid_t pid = host_.client_view(client).pid;
    const uint64_t credit = mr->charged_pid == pid ? mr->charged_bytes : 0;
    if (int err = charge_memlock(client, n.addr, n.length, credit, bytes)) return err;
    uncharge_memlock(mr->charged_pid, mr->charged_bytes);
    mr->charged_pid = pid;
    mr->charged_bytes = bytes;
  }
  // Revoke the key, change the entry, publish the same key again.
  const uint32_t key = mr->key;
  e.key.store(0, std::memory_order_release);
  const uint32_t owner_pid = e.owner_pid;
  fill_entry(e, n, client);
  if (!moves) e.owner_pid = owner_pid;  // whose addresses the range names
  const Held before = mr->held();
  mr->pd = n.pd;
  mr->backing = n.backing;
  host_.hold(mr->held());
  host_.drop(before);  // a region's backing may go with its last registration
  e.key.store(key, std::memory_order_release);
  rep.handle = req.handle;
  rep.key = key;
  return 0;
}

// Charges the pages a registration covers to the registrant (IBTA leaves
// the resource manager to the OS; we follow the kernel's RLIMIT_MEMLOCK rule).
// `credit`: bytes of the client's process's charge that are about to be
// released (a re-registration's old range).
int MemoryRegions::charge_memlock(uint32_t client, uint64_t addr, uint64_t length, uint64_t credit,
                                  uint64_t& bytes) {
  const ClientView c = host_.client_view(client);
  pid_t pid = c.pid;
  bytes = page_up(addr + length) - page_down(addr);
  Account& acct = accounts_[pid];
  acct.uid = c.uid;
  const uint64_t total = acct.locked_bytes - std::min(credit, acct.locked_bytes) + bytes;
  acct.limit_bytes = memlock_limit(pid, c.pidfd, *c.at_connect, total);
  if (acct.limit_bytes != UINT64_MAX && total > acct.limit_bytes) {
    SV_TRACE("daemon: pid %d: RLIMIT_MEMLOCK %llu, locked %llu, asks %llu: ENOMEM", int(pid),
             (unsigned long long)acct.limit_bytes, (unsigned long long)acct.locked_bytes, (unsigned long long)bytes);
    if (acct.locked_bytes == 0) accounts_.erase(pid);
    return ENOMEM;
  }
  acct.locked_bytes += bytes;
  return 0;
}

void MemoryRegions::uncharge_memlock(pid_t pid, uint64_t bytes) {
  if (auto a = accounts_.find(pid); a != accounts_.end()) {
    a->second.locked_bytes -= std::min(bytes, a->second.locked_bytes);
    if (a->second.locked_bytes == 0) accounts_.erase(a);
  }
}

// A free MR-table slot, round robin so that a freed key is not reused at once.
uint32_t MemoryRegions::alloc_key_slot() {
  for (uint32_t n = 0; n < kMrTableSize - 1; ++n) {
    uint32_t s = next_slot_;
    next_slot_ = next_slot_ + 1 >= kMrTableSize ? 1 : next_slot_ + 1;
    if (tables_.mr_at(s).key.load(std::memory_order_relaxed) == 0 && !mrs_.count(s) && !mws_.count(s)) return s;
  }
  return 0;
}

void MemoryRegions::release(uint32_t handle) {
  auto it = mrs_.find(handle);
  if (it == mrs_.end()) return;
  tables_.mr_at(handle).key.store(0, std::memory_order_release);  // revoke first
  uncharge_memlock(it->second.charged_pid, it->second.charged_bytes);
  host_.forget(ObjKind::kMr, handle);  // a region's backing goes with its last registration (seed 000)
}

// Seed 000's reg_shared: a new registration of an existing MR's pages.
int MemoryRegions::reg_shared(uint32_t client, const Mr& mr, const proto::RegSharedReq& req, proto::RegMrReply& rep) {
  const MrEntry* e = entry(req.key);
  if (!e || mr.dm || e->backing == kOdpBacking) return EINVAL;  // device memory: RegDmMr; ODP: no pages
  proto::RegMrReq r{};
  r.pd = req.pd;
  r.backing = mr.backing;
  r.addr = e->file_offset;
  r.length = e->length;
  r.iova = req.iova;
  r.access = req.access;
  return reg(client, *backings_.get(r.backing), r, rep);  // req.pd: resolved as the client's
}

void MemoryRegions::query(uint32_t handle, const Mr& mr, proto::QueryMrReply& rep) const {
  const MrEntry& e = tables_.mr_at(handle);
  rep.pd = mr.pd;
  rep.key = mr.key;
  rep.addr = e.file_offset;  // the registrant's address
  rep.length = e.length;
  rep.access = e.access;
}

const MrEntry* MemoryRegions::entry(uint32_t key) const {
  return access::lookup(key, [this](uint32_t slot) -> const MrEntry& { return tables_.mr_at(slot); });
}

int MemoryRegions::get_backing(const Mr& mr, proto::GetMrBackingReply& rep, std::vector<int>& out_fds) {
  const Backing* b = backings_.get(mr.backing);
  if (!b) return EINVAL;
  rep.backing = mr.backing;
  out_fds.push_back(b->fd.get());
  return 0;
}

int MemoryRegions::alloc_mw(uint32_t client, uint32_t pd, const proto::AllocMwReq& req, proto::KeyReply& rep) {
  if (req.type != IBV_MW_TYPE_1 && req.type != IBV_MW_TYPE_2) return EINVAL;
  if (int e = host_.quotas().admit(Quotas::kMw, host_.client_uid(client))) return e;
  uint32_t slot = alloc_key_slot();
  if (!slot) return ENOMEM;
  const uint32_t owner = host_.context_of(client);
  if (int err = tables_.claim_mr(slot, host_.context_uid(owner))) return err;
  uint32_t key = (slot << 8) | ++key_byte_[slot];
  MrEntry& e = tables_.mr_at(slot);
  e.access = 0;
  e.pd = pd;
  e.backing = 0;
  e.iova = 0;
  e.length = 0;
  e.file_offset = 0;
  const pid_t pid = host_.client_view(client).pid;
  e.owner_pid = uint32_t(pid);
  e.kind = req.type == IBV_MW_TYPE_1 ? kKindMw1 : kKindMw2;
  e.bound_qpn = 0;
  e.generation++;
  // A type 1 window's key is valid (unbound, zero length) from the start; a
  // type 2 window is invalid until its first bind.
  if (req.type == IBV_MW_TYPE_1) e.key.store(key, std::memory_order_release);
  host_.quotas().charge(Quotas::kMw, slot, host_.client_uid(client));
  Mw mw;
  mw.owner = owner;
  mw.pd = pd;
  mw.type = req.type;
  mw.key = key;
  mw.alloc_pid = uint32_t(pid);
  host_.hold(mws_.insert(slot, std::move(mw)).held());
  rep.handle = slot;
  rep.key = key;
  return 0;
}

void MemoryRegions::unbind_mw(uint32_t slot, Mw& mw) {
  MrEntry& e = tables_.mr_at(slot);
  if (mw.type == IBV_MW_TYPE_2) e.key.store(0, std::memory_order_release);  // invalid
  e.length = 0;
  e.access = 0;
  e.backing = 0;
  e.generation++;
  mw_bound_.erase({mw.bound_mr, slot});
  host_.drop(Ref{ObjKind::kMr, mw.bound_mr});
  mw.bound_mr = 0;
}

// Windows of other contexts bound to the MRs of a context that goes die
// with them (their own context's windows went just before).
void MemoryRegions::unbind_windows_of(const std::vector<uint32_t>& mrs) {
  std::set<uint32_t> bound;  // the windows bound to them, in slot order
  for (uint32_t mr : mrs)
    for (auto it = mw_bound_.lower_bound({mr, 0}); it != mw_bound_.end() && it->first == mr; ++it)
      bound.insert(it->second);
  for (uint32_t h : bound)
    if (auto w = mws_.find(h); w != mws_.end()) unbind_mw(h, w->second);
}

void MemoryRegions::release_mw(uint32_t slot) {
  auto it = mws_.find(slot);
  if (it == mws_.end()) return;
  unbind_mw(slot, it->second);
  tables_.mr_at(slot).key.store(0, std::memory_order_release);
  host_.forget(ObjKind::kMw, slot);
}

int MemoryRegions::bind_mw(Mw& mw, const Qp& binder, const proto::BindMwReq& r, proto::KeyReply& rep) {
  const Qp* qp = &binder;
  if (ibv_qp_state(tables_.qp_at(r.qpn).state.load()) != IBV_QPS_RTS) return EINVAL;
  constexpr uint32_t kWindowAccess = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                                     IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_ZERO_BASED;
  // A window grants remote access only (IBTA 10.6.7.2.2): local rights in the
  // bind (rdma-core's own tests pass IBV_ACCESS_LOCAL_WRITE, which rxe takes)
  // are ignored, not refused; anything else is invalid.
  if (r.access & ~(kWindowAccess | IBV_ACCESS_LOCAL_WRITE)) return EINVAL;
  uint32_t new_key;
  if (mw.type == IBV_MW_TYPE_2) {
    // IBTA 10.6.7.2.5: a type 2 window is bound through a QP of its PD, only
    // while invalid, with a key of the same index whose key byte changed.
    if (mw.bound_mr) return EINVAL;
    if (qp->pd != mw.pd) return EPERM;
    if ((r.new_key >> 8) != r.mw || r.new_key == mw.key) return EINVAL;
    if (r.length == 0) return EINVAL;
    new_key = r.new_key;
    key_byte_[r.mw] = uint8_t(new_key);
  } else {
    new_key = (r.mw << 8) | ++key_byte_[r.mw];
  }
  MrEntry& e = tables_.mr_at(r.mw);
  if (r.length == 0) {  // type 1 unbind
    e.key.store(0, std::memory_order_release);
    unbind_mw(r.mw, mw);
    mw.key = new_key;
    e.key.store(new_key, std::memory_order_release);
    rep.handle = r.mw;
    rep.key = new_key;
    return 0;
  }
  const MrEntry* me = entry(r.mr_key);
  auto mr = mrs_.find(r.mr_key >> 8);
  if (!me || mr == mrs_.end() || me->kind != kKindMr) return EINVAL;
  if (mr->second.pd != mw.pd) return EPERM;
  if (!(me->access & IBV_ACCESS_MW_BIND)) return EACCES;
  // A window may not grant writes or atomics its MR does not allow locally.
  if ((r.access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) && !(me->access & IBV_ACCESS_LOCAL_WRITE))
    return EACCES;
  if (!access::in_bounds(*me, r.addr, r.length)) return EINVAL;  // the window lies within its MR
  // Revoke the old binding first, then publish the new one.
  e.key.store(0, std::memory_order_release);
  unbind_mw(r.mw, mw);
  e.access = r.access & ~uint32_t(IBV_ACCESS_ZERO_BASED | IBV_ACCESS_LOCAL_WRITE);
  e.backing = me->backing;
  e.iova = (r.access & IBV_ACCESS_ZERO_BASED) ? 0 : r.addr;
  e.length = r.length;
  e.file_offset = access::file_offset(*me, r.addr);
  // Over ODP memory the window names the MR's registrant (its addresses,
  // reached through its pinned address space while it lives), as the MR.
  const bool odp = me->backing == kOdpBacking;
  e.owner_pid = odp ? me->owner_pid : mw.alloc_pid;
  e.owner_identity = odp ? me->owner_identity : 0;
  e.bound_qpn = mw.type == IBV_MW_TYPE_2 ? r.qpn : 0;
  e.generation++;
  mw.bound_mr = r.mr_key >> 8;
  mw_bound_.insert({mw.bound_mr, r.mw});
  mw.key = new_key;
  host_.hold(Ref{ObjKind::kMr, mw.bound_mr});
  e.key.store(new_key, std::memory_order_release);
  rep.handle = r.mw;
  rep.key = new_key;
  return 0;
}

int MemoryRegions::invalidate(uint32_t client, const proto::InvalidateReq& r) {
  uint32_t slot = r.key >> 8;
  auto it = mws_.find(slot);
  // Only type 2 windows are invalidated by work requests (IBTA 10.6.7.2.6).
  if (it == mws_.end() || it->second.type != IBV_MW_TYPE_2 || it->second.key != r.key || !it->second.bound_mr)
    return EINVAL;
  if (r.remote) {
    uint32_t peer = tables_.qp_at(r.qpn).dest_qpn.load();
    if (!host_.has_qp(peer) || tables_.mr_at(slot).bound_qpn != peer) return EACCES;
  } else if (it->second.owner != host_.context_of(client) || tables_.mr_at(slot).bound_qpn != r.qpn) {
    return EACCES;
  }
  unbind_mw(slot, it->second);
  return 0;
}

void MemoryRegions::accounts(proto::AccountsReply& rep) const {
  rep.count = 0;
  rep.others_bytes = 0;
  for (auto& [pid, a] : accounts_) {
    if (rep.count < proto::kMaxAccounts) {
      rep.entries[rep.count++] = {uint32_t(pid), uint32_t(a.uid), a.locked_bytes, a.limit_bytes};
    } else {
      rep.others_bytes += a.locked_bytes;
    }
  }
}

}  // namespace sv::daemon
