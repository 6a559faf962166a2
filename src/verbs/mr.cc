// Protection domains and memory regions. Registration makes the pages
// reachable by peers through the process's backing file (mem_backing.h,
// docs/MEMORY.md) and records the region in the daemon's MR table.
#include <sys/mman.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "verbs/mem_backing.h"
#include "verbs/provider.h"

#undef ibv_reg_mr
#undef ibv_reg_mr_iova

namespace sv::verbs {

Mr* new_mr_handle(ibv_pd* pd, void* addr, size_t length, uint32_t handle, uint32_t key) {
  auto* mr = static_cast<Mr*>(std::calloc(1, sizeof(Mr)));
  if (!mr) return nullptr;
  mr->mr.context = pd->context;
  mr->mr.pd = pd;
  mr->mr.addr = addr;
  mr->mr.length = length;
  mr->mr.handle = handle;
  mr->mr.lkey = key;
  mr->mr.rkey = key;
  mr->handle = handle;
  return mr;
}

ibv_pd* new_pd_handle(ibv_context* c, uint32_t handle) {
  auto* pd = static_cast<Pd*>(std::calloc(1, sizeof(Pd)));
  if (!pd) {
    errno = ENOMEM;
    return nullptr;
  }
  pd->pd.context = c;
  pd->pd.handle = handle;
  pd->handle = handle;
  ContextState& st = ctx_state(c);
  std::lock_guard<std::mutex> g(st.mu);
  st.pds.emplace(handle, pd);
  return &pd->pd;
}

int get_backing(ContextState& st) {
  std::lock_guard<std::mutex> g(st.mu);
  // A forked child has a backing file of its own (mem_backing.h): the one
  // registered by its parent holds the parent's pages, not the child's.
  if (st.backing && st.backing_pid == self_pid()) return 0;
  int fd = MemBacking::instance().fd();
  if (fd < 0) return EINVAL;
  proto::Empty req{};
  proto::HandleReply rep{};
  int fds[1] = {fd};
  if (int e = st.conn.call<proto::Op::RegBacking>(req, rep, fds)) return e;
  st.backing = rep.handle;
  st.backing_pid = self_pid();
  return 0;
}

namespace {

// Bits rdma-core lets a provider ignore (ibv_reg_mr(3): "optional" access).
constexpr int kOptionalAccess = IBV_ACCESS_OPTIONAL_RANGE;

// The access flags the MR's entry holds now (0 if its key is gone).
int current_access(const ContextState& st, const ibv_mr& mr) {
  const MrEntry* e = st.mr(mr.lkey);
  return e ? int(e->access) : 0;
}

// The backing of this process, registered with the daemon already?
bool backing_known(ContextState& st) {
  std::lock_guard<std::mutex> g(st.mu);
  return st.backing && st.backing_pid == self_pid();
}

void deregister_handle(ContextState& st, uint32_t handle) {
  proto::HandleReq req{};
  req.handle = handle;
  proto::Empty rep{};
  st.conn.call<proto::Op::DeregMr>(req, rep);
}

// Backs [addr, addr + length) and records the registration `req` with the
// daemon: 0 (the pages are backed, `rep` holds the MR) or an errno
// (nothing is left). Once the process's backing is known to the daemon,
// the pages are converted while the daemon records the registration
// (DaemonConn::call_during): the daemon checks only the file's length,
// made sufficient first, and peers cannot know the key before this
// returns, so nothing reaches the pages before they are converted (a
// peer that guesses the key meanwhile reaches the file's range, not the
// application's memory: docs/MEMORY.md). The errno is the conversion's
// if it failed (as when it came first), else the daemon's.
int backed_registration(ContextState& st, void* addr, size_t length, proto::RegMrReq& req,
                        proto::RegMrReply& rep) {
  MemBacking& mb = MemBacking::instance();
  if (backing_known(st) && mb.reserve(addr, length) == 0) {
    req.backing = st.backing;
    int conv = -1;  // not run: nothing was sent
    const int e = st.conn.call_during<proto::Op::RegMr>(req, rep, [&] { return mb.acquire(addr, length); }, &conv);
    if (conv > 0) {
      if (e == 0) deregister_handle(st, rep.handle);
      return conv;
    }
    if (e && conv == 0) mb.release(addr, length);
    return e;
  }
  if (int e = mb.acquire(addr, length)) return e;
  int e = get_backing(st);
  if (e == 0) {
    req.backing = st.backing;
    e = st.conn.call<proto::Op::RegMr>(req, rep);
  }
  if (e) mb.release(addr, length);
  return e;
}

}  // namespace

// ibv_reg_mr(3) with IBV_ACCESS_ON_DEMAND: one round trip, nothing pinned,
// nothing converted (docs/MEMORY.md, "On-demand paging"). Implicit ODP:
// addr NULL and length SIZE_MAX name the whole address space (iova ==
// address). Whether the pages are there is decided at each access.
// Also (flags kRegThroughOwner) memory that cannot become the backing
// file's: an MR reached through this process's address space as an ODP
// MR is, charged as pinned (docs/MEMORY.md, "Every kind of memory").
ibv_mr* reg_odp_mr(ibv_pd* ibpd, void* addr, size_t length, uint64_t iova, int access, uint32_t flags) {
  const bool implicit = !addr && length == SIZE_MAX;
  if (!implicit && (length == 0 || length > shm::kMaxMrSize || (!addr && !(access & IBV_ACCESS_ZERO_BASED)))) {
    errno = EINVAL;
    return nullptr;
  }
  if (implicit && (access & IBV_ACCESS_ZERO_BASED)) {
    std::fprintf(stderr, "softverbs: ibv_reg_mr: an implicit ODP MR cannot be zero-based\n");
    errno = EINVAL;
    return nullptr;
  }
  ContextState& st = ctx_state(ibpd->context);
  proto::RegMrReq req{};
  req.pd = to_pd(ibpd)->handle;
  req.addr = reinterpret_cast<uint64_t>(addr);
  req.length = implicit ? shm::kImplicitOdpLength : length;
  req.iova = implicit ? 0 : (access & IBV_ACCESS_ZERO_BASED) ? 0 : iova;
  req.access = uint32_t(access);
  req.flags = flags;
  proto::RegMrReply rep{};
  if (int e = st.conn.call<proto::Op::RegOdpMr>(req, rep)) {
    if (e == EOPNOTSUPP)
      std::fprintf(stderr, "softverbs: ibv_reg_mr: %s needs a pidfd of this process in the daemon (Linux 5.3), "
                           "which it does not have\n",
                   flags ? "memory other processes map too (or huge pages, or a stack)" : "on-demand paging");
    errno = e;
    return nullptr;
  }
  Mr* mr = new_mr_handle(ibpd, addr, length, rep.handle, rep.key);
  if (!mr) {
    deregister_handle(st, rep.handle);
    errno = ENOMEM;
    return nullptr;
  }
  return &mr->mr;
}

ibv_mr* reg_mr(ibv_pd* ibpd, void* addr, size_t length, uint64_t iova, int access) {
  if (!ibpd) {
    errno = EINVAL;
    return nullptr;
  }
  access &= ~kOptionalAccess;
  access &= ~IBV_ACCESS_HUGETLB;  // a hint only
  if (access & IBV_ACCESS_ON_DEMAND) return reg_odp_mr(ibpd, addr, length, iova, access, 0);
  // Beyond the max_mr_size ibv_query_device reports is EINVAL, checked
  // before the (absent) memory is looked at, which would say EFAULT.
  if (length == 0 || length > shm::kMaxMrSize || (!addr && !(access & IBV_ACCESS_ZERO_BASED))) {
    errno = EINVAL;
    return nullptr;
  }
  if (access & IBV_ACCESS_ZERO_BASED) iova = 0;
  ContextState& st = ctx_state(ibpd->context);
  proto::RegMrReq req{};
  req.pd = to_pd(ibpd)->handle;
  req.addr = reinterpret_cast<uint64_t>(addr);
  req.length = length;
  req.iova = iova;
  req.access = uint32_t(access);
  proto::RegMrReply rep{};
  auto fail = [&](int e) -> ibv_mr* {
    MemBacking::instance().release(addr, length);
    errno = e;
    return nullptr;
  };
  if (int e = backed_registration(st, addr, length, req, rep)) {
    // Memory whose pages cannot become the backing file's (shared with
    // other mappings, huge pages, a stack) is reached through this process.
    if (e == EOPNOTSUPP) return reg_odp_mr(ibpd, addr, length, iova, access, proto::kRegThroughOwner);
    errno = e;
    return nullptr;
  }
  Mr* mr = new_mr_handle(ibpd, addr, length, rep.handle, rep.key);
  if (!mr) {
    deregister_handle(st, rep.handle);
    return fail(ENOMEM);
  }
  mr->reg_addr = addr;
  mr->reg_len = length;
  return &mr->mr;
}

// ibv_alloc_td(3): no attributes are defined yet.
ibv_td* alloc_td(ibv_context* c, ibv_td_init_attr* attr) {
  if (!attr || attr->comp_mask) {
    errno = EINVAL;
    return nullptr;
  }
  auto* td = static_cast<Td*>(std::calloc(1, sizeof(Td)));
  if (!td) {
    errno = ENOMEM;
    return nullptr;
  }
  td->td.context = c;
  return &td->td;
}

int dealloc_td(ibv_td* ibtd) {
  Td* td = to_td(ibtd);
  if (td->users.load(std::memory_order_relaxed)) return EBUSY;  // a parent domain still holds it
  std::free(td);
  return 0;
}

// ibv_alloc_parent_domain(3): a PD of this process that stands for attr->pd
// with a thread domain. Custom allocators are refused: softverbs' queues
// live in segments the daemon creates, not in application memory.
ibv_pd* alloc_parent_domain(ibv_context* c, ibv_parent_domain_init_attr* attr) {
  if (!attr || !attr->pd || attr->pd->context != c || (attr->td && attr->td->context != c) ||
      to_pd(attr->pd)->protection) {
    errno = EINVAL;
    return nullptr;
  }
  if (attr->comp_mask & ~uint32_t(IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT)) {
    errno = EOPNOTSUPP;
    return nullptr;
  }
  auto* pd = static_cast<Pd*>(std::calloc(1, sizeof(Pd)));
  if (!pd) {
    errno = ENOMEM;
    return nullptr;
  }
  Pd* prot = to_pd(attr->pd);
  pd->pd.context = c;
  pd->pd.handle = prot->handle;
  pd->handle = prot->handle;
  pd->protection = prot;
  pd->td = attr->td ? to_td(attr->td) : nullptr;
  prot->parents.fetch_add(1, std::memory_order_relaxed);
  if (pd->td) pd->td->users.fetch_add(1, std::memory_order_relaxed);
  return &pd->pd;
}

}  // namespace sv::verbs

using namespace sv;
using namespace sv::verbs;

extern "C" {

ibv_pd* ibv_alloc_pd(ibv_context* c) {
  ContextState& st = ctx_state(c);
  proto::Empty req{};
  proto::HandleReply rep{};
  if (int e = st.conn.call<proto::Op::AllocPd>(req, rep)) {
    errno = e;
    return nullptr;
  }
  return new_pd_handle(c, rep.handle);
}

int ibv_dealloc_pd(ibv_pd* ibpd) {
  Pd* pd = to_pd(ibpd);
  if (pd->protection) {  // a parent domain: this process's object only
    pd->protection->parents.fetch_sub(1, std::memory_order_relaxed);
    if (pd->td) pd->td->users.fetch_sub(1, std::memory_order_relaxed);
    std::free(pd);
    return 0;
  }
  if (pd->parents.load(std::memory_order_relaxed)) return EBUSY;
  ContextState& st = ctx_state(ibpd->context);
  proto::HandleReq req{};
  req.handle = to_pd(ibpd)->handle;
  proto::Empty rep{};
  if (int e = destroy_result(st, st.conn.call<proto::Op::DeallocPd>(req, rep))) return e;
  {
    std::lock_guard<std::mutex> g(st.mu);
    st.pds.erase(to_pd(ibpd)->handle);
  }
  std::free(to_pd(ibpd));
  return 0;
}

ibv_mr* ibv_reg_mr(ibv_pd* pd, void* addr, size_t length, int access) {
  return reg_mr(pd, addr, length, reinterpret_cast<uint64_t>(addr), access);
}

ibv_mr* ibv_reg_mr_iova(ibv_pd* pd, void* addr, size_t length, uint64_t iova, int access) {
  return reg_mr(pd, addr, length, iova, access);
}

ibv_mr* ibv_reg_mr_iova2(ibv_pd* pd, void* addr, size_t length, uint64_t iova, unsigned int access) {
  return reg_mr(pd, addr, length, iova, int(access));
}

int ibv_dereg_mr(ibv_mr* ibmr) {
  Mr* mr = to_mr(ibmr);
  ContextState& st = ctx_state(ibmr->context);
  proto::HandleReq req{};
  req.handle = mr->handle;
  proto::Empty rep{};
  if (int e = destroy_result(st, st.conn.call<proto::Op::DeregMr>(req, rep))) {
    // Already deregistered by another holder (all holders are equal): our
    // pages need not stay shared any more; the handle stays until
    // ibv_unimport_mr().
    if (e == EINVAL && mr->reg_addr) {
      MemBacking::instance().release(mr->reg_addr, mr->reg_len);
      mr->reg_addr = nullptr;
    }
    return e;
  }
  {
    std::lock_guard<std::mutex> g(st.mu);
    st.windows.erase(ibmr->rkey);
  }
  if (mr->reg_addr) MemBacking::instance().release(mr->reg_addr, mr->reg_len);
  if (mr->map_addr) ::munmap(mr->map_addr, mr->map_len);
  if (mr->dmah) release_dmah(mr->dmah);
  std::free(mr);
  return 0;
}

// ibv_rereg_mr(3) - re-register a memory region, in place.
//
//   int ibv_rereg_mr(struct ibv_mr *mr, int flags, struct ibv_pd *pd,
//                    void *addr, size_t length, int access);
//
// Changes what `flags` names: IBV_REREG_MR_CHANGE_PD (to `pd`, of the MR's
// context), IBV_REREG_MR_CHANGE_ACCESS (to `access`, checked as ibv_reg_mr
// checks it), IBV_REREG_MR_CHANGE_TRANSLATION (to [addr, addr + length);
// iova = addr, or 0 for a zero-based MR). One daemon op (ReregMr) rewrites
// the MR's entry in the device's MR table: lkey and rkey stay, so a peer
// holding the rkey goes on using it, as with the kernel's rereg. The change
// holds for every request checked after the call returns: a receive posted
// before it that names the MR by its old PD or range fails when a message
// lands (the sender sees IBV_WC_REM_OP_ERR).
//
// RETURN VALUE: 0, or
//   IBV_REREG_MR_ERR_INPUT  what libibverbs itself refuses: unknown flags,
//                           a translation without addr or length, access
//                           bits without CHANGE_ACCESS, a PD of another
//                           context (errno EINVAL);
//   IBV_REREG_MR_ERR_CMD    what the device refuses (errno): EINVAL (no
//                           flag, bad access, range), EBUSY (memory windows
//                           are bound to the MR), EFAULT (the new range is
//                           not accessible memory), ENOMEM (RLIMIT_MEMLOCK;
//                           the old range's charge counts as released),
//                           EOPNOTSUPP (IBV_ACCESS_ON_DEMAND).
// On either error the MR is exactly as it was, and usable (the man page
// allows it to be unusable after ERR_CMD; softverbs keeps it). The MR must
// still be deregistered with ibv_dereg_mr(3) in every case.
int ibv_rereg_mr(ibv_mr* ibmr, int flags, ibv_pd* pd, void* addr, size_t length, int access) {
  auto input_error = [] {
    errno = EINVAL;
    return int(IBV_REREG_MR_ERR_INPUT);
  };
  // What rdma-core's libibverbs checks before calling a provider.
  if (!ibmr || (flags & ~IBV_REREG_MR_FLAGS_SUPPORTED)) return input_error();
  const bool moves = flags & IBV_REREG_MR_CHANGE_TRANSLATION;
  if ((moves && (!length || !addr)) || (access && !(flags & IBV_REREG_MR_CHANGE_ACCESS))) return input_error();
  if ((flags & IBV_REREG_MR_CHANGE_PD) && (!pd || pd->context != ibmr->context))
    return input_error();
  Mr* mr = to_mr(ibmr);
  ContextState& st = ctx_state(ibmr->context);
  if (const MrEntry* e = st.mr(ibmr->lkey); e && e->backing == shm::kOdpBacking) {
    std::fprintf(stderr, "softverbs: ibv_rereg_mr: an MR reached through its process's address space (ODP, or "
                         "memory other mappings share) is not re-registered; register it anew\n");
    errno = EOPNOTSUPP;
    return int(IBV_REREG_MR_ERR_CMD);
  }
  proto::ReregMrReq req{};
  req.handle = mr->handle;
  req.flags = uint32_t(flags);
  auto cmd_error = [](int e) {
    errno = e;
    return int(IBV_REREG_MR_ERR_CMD);
  };
  if (flags & IBV_REREG_MR_CHANGE_PD) req.pd = to_pd(pd)->handle;
  if (flags & IBV_REREG_MR_CHANGE_ACCESS) {
    access &= ~(kOptionalAccess | IBV_ACCESS_HUGETLB);  // as ibv_reg_mr
    if (access & IBV_ACCESS_ON_DEMAND) {
      std::fprintf(stderr, "softverbs: ibv_rereg_mr: on-demand paging is chosen at ibv_reg_mr only\n");
      return cmd_error(EOPNOTSUPP);
    }
    req.access = uint32_t(access);
  }
  if (moves) {
    if (length > shm::kMaxMrSize) return cmd_error(EINVAL);
    // The new pages are made shareable first; the old ones stay until the
    // daemon has moved the MR.
    if (int e = MemBacking::instance().acquire(addr, length)) return cmd_error(e);
    if (int e = get_backing(st)) {
      MemBacking::instance().release(addr, length);
      return cmd_error(e);
    }
    const int new_access = (flags & IBV_REREG_MR_CHANGE_ACCESS) ? access : current_access(st, *ibmr);
    req.backing = st.backing;
    req.addr = reinterpret_cast<uint64_t>(addr);
    req.length = length;
    req.iova = (new_access & IBV_ACCESS_ZERO_BASED) ? 0 : req.addr;
  }
  proto::RegMrReply rep{};
  if (int e = st.conn.call<proto::Op::ReregMr>(req, rep)) {
    if (moves) MemBacking::instance().release(addr, length);
    return cmd_error(e);
  }
  if (flags & IBV_REREG_MR_CHANGE_PD) ibmr->pd = pd;
  if (moves) {
    if (mr->reg_addr) MemBacking::instance().release(mr->reg_addr, mr->reg_len);
    mr->reg_addr = addr;
    mr->reg_len = length;
    ibmr->addr = addr;
    ibmr->length = length;
  }
  return 0;
}

}  // extern "C"
