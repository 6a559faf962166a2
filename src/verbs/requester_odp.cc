// The shared-memory requester on on-demand-paging memory (docs/MEMORY.md,
// "On-demand paging"). An ODP MR (shm::kOdpBacking) has no backing file:
// its bytes are the registering process's address space as it is now, so
// they are read and written through that process's pinned address space
// (common/odp_memory.h: /proc/PID/mem of the registrant, opened once and
// confirmed to be its; this process's own for its own SGEs), never through
// a pointer: an address with no mapping, or none that allows the access,
// fails the copy, and the request completes in error
// (IBTA 10.6.7: a local protection error for a local SGE, a remote access
// error for an R_Key, the responder's local protection error for a receive
// buffer), with no signal in either process.
//
// requester.cc sends a request here only when one of its keys named ODP
// memory (ProcessQp::odp_seen, set where the plain resolution met an ODP
// entry on its rare branch); everything is resolved again here, plain keys
// as requester.cc resolves them.
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/uio.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

#include <map>
#include <memory>
#include <mutex>
#include <utility>

#include "common/fence.h"
#include "common/access.h"
#include "common/odp_memory.h"
#include "common/responder_core.h"
#include "verbs/odp.h"
#include "verbs/provider.h"
#include "verbs/requester_internal.h"
#include "verbs/wr_rules.h"

namespace sv::verbs {
namespace {

// A run of bytes: in this process's view (pid 0: p is a mapping that is
// there), or at address p of process pid (ODP memory, reached by syscalls).
struct OSeg {
  uint8_t* p;
  uint64_t len;
  pid_t pid;
  uint64_t identity = 0;  // with pid: the registrant's (OdpOwner)
  OdpOwner owner() const { return {pid, identity}; }
};

enum class Fail : uint8_t { kNone, kSource, kTarget };

bool is_odp(const MrEntry& e) { return e.backing == shm::kOdpBacking; }

// Says once per process why ODP memory of another process was refused to
// us (EACCES/EPERM opening its /proc/PID/mem: this process may not
// ptrace-attach it, proc(5): Yama ptrace_scope, a non-dumpable target;
// EOPNOTSUPP: the daemon's kernel names no registrant's identity). A hole
// (EFAULT) and a registrant that is gone (ESRCH) are the request's errors,
// not said.
void say_refused(int err, pid_t pid) {
  static std::atomic<bool> said{false};
  if (err == EFAULT || err == ESRCH || said.exchange(true)) return;
  std::fprintf(stderr, "softverbs: on-demand-paging memory of process %d cannot be reached: %s\n", int(pid),
               std::strerror(err));
}

// The registrants' pinned address spaces this process opened, by owner.
// An entry stays while its process lives; one whose process is gone fails
// every access and is dropped when another is opened.
struct OdpHandles {
  struct Entry {
    std::shared_ptr<const OdpMemory> mem;
    Fd pidfd;
  };
  std::mutex mu;
  std::map<std::pair<pid_t, uint64_t>, Entry> by_owner;
};
OdpHandles& odp_handles() {
  static OdpHandles* h = new OdpHandles;  // outlives every thread's last access
  return *h;
}

// Opens the registrant's address space: the process at o.pid is the
// registrant only if its struct pid has the identity the daemon recorded
// (pidfd_identity); then OdpMemory::open confirms, after its opens, that
// this process had not exited, so the number still named it.
int open_registrant(const OdpOwner& o, OdpHandles::Entry& out) {
  if (o.identity == 0) {
    // The daemon's kernel has no pidfs identities (Linux < 6.9): only this
    // process's own registrations are reached, by the number alone.
    if (uint32_t(o.pid) != self_pid()) return EOPNOTSUPP;
    return OdpMemory::open_self(out.mem);
  }
  if (int e = pidfd_open(o.pid, out.pidfd)) return e;
  if (pidfd_identity(out.pidfd.get()) != o.identity) return ESRCH;
  if (uint32_t(o.pid) == self_pid()) return OdpMemory::open_self(out.mem);
  return OdpMemory::open(o.pid, out.pidfd.get(), out.mem);
}

// The pinned address space of registrant `o`, or null with *err.
std::shared_ptr<const OdpMemory> registrant_memory(const OdpOwner& o, int* err) {
  OdpHandles& h = odp_handles();
  std::lock_guard<std::mutex> g(h.mu);
  const auto k = std::make_pair(o.pid, o.identity);
  if (auto it = h.by_owner.find(k); it != h.by_owner.end()) return it->second.mem;
  OdpHandles::Entry fresh;
  if ((*err = open_registrant(o, fresh)) != 0) return nullptr;
  for (auto it = h.by_owner.begin(); it != h.by_owner.end();)
    it = it->second.pidfd.valid() && !pidfd_alive(it->second.pidfd.get()) ? h.by_owner.erase(it) : std::next(it);
  return h.by_owner.emplace(k, std::move(fresh)).first->second.mem;
}

// n bytes between this process's `here` and address `there` of registrant
// `o`'s memory. false: the ODP side failed.
bool odp_copy(const OdpOwner& o, uint64_t there, uint8_t* here, uint64_t n, bool to_registrant) {
  int err = 0;
  std::shared_ptr<const OdpMemory> mem = registrant_memory(o, &err);
  if (mem) err = to_registrant ? mem->write(there, here, n) : mem->read(there, here, n);
  if (err) say_refused(err, o.pid);
  return err == 0;
}

// n bytes from `from` to `to`, at most one of them ODP memory (a non-zero
// pid). false: the ODP side failed.
bool move_bytes(uint8_t* to, const OdpOwner& to_owner, const uint8_t* from, const OdpOwner& from_owner, uint64_t n) {
  if (to_owner.pid) return odp_copy(to_owner, uint64_t(uintptr_t(to)), const_cast<uint8_t*>(from), n, true);
  return odp_copy(from_owner, uint64_t(uintptr_t(from)), to, n, false);
}

// One piece of a copy; both sides ODP go through a bounce buffer.
Fail copy_piece(const OSeg& d, uint64_t doff, const OSeg& s, uint64_t soff, uint64_t n) {
  uint8_t* to = d.p + doff;
  const uint8_t* from = s.p + soff;
  if (!d.pid && !s.pid) {
    std::memcpy(to, from, n);
    return Fail::kNone;
  }
  if (!d.pid || !s.pid) {
    if (move_bytes(to, d.owner(), from, s.owner(), n)) return Fail::kNone;
    return d.pid ? Fail::kTarget : Fail::kSource;
  }
  static thread_local uint8_t bounce[64 * 1024];
  for (uint64_t at = 0; at < n;) {
    const uint64_t k = std::min<uint64_t>(n - at, sizeof(bounce));
    if (!move_bytes(bounce, {}, from + at, s.owner(), k)) return Fail::kSource;
    if (!move_bytes(to + at, d.owner(), bounce, {}, k)) return Fail::kTarget;
    at += k;
  }
  return Fail::kNone;
}

// Copies between two scatter lists in order (copy_segments, with ODP sides).
Fail copy_odp(const OSeg* dst, int nd, const OSeg* src, int ns, uint64_t total) {
  int di = 0, si = 0;
  uint64_t doff = 0, soff = 0, done = 0;
  while (done < total) {
    while (di < nd && doff == dst[di].len) di++, doff = 0;
    while (si < ns && soff == src[si].len) si++, soff = 0;
    const uint64_t n = std::min({dst[di].len - doff, src[si].len - soff, total - done});
    if (Fail f = copy_piece(dst[di], doff, src[si], soff, n); f != Fail::kNone) return f;
    doff += n;
    soff += n;
    done += n;
  }
  return Fail::kNone;
}

// A local SGE (IBTA 10.6.7.1): an ODP MR's bytes are its owner's (this
// process, or the one whose context registered it).
bool local_oseg(ProcessQp& q, const shm::Sge& sge, bool write, OSeg& out) {
  if (sge.length == 0) {
    out = {nullptr, 0, 0};
    return true;
  }
  const MrEntry* e = q.ctx->st->mr(sge.lkey);
  if (e && is_odp(*e)) {
    if (!access::permits(e, access::Use::kLocal, {q.pd->handle, q.qpn, 0}, write ? IBV_ACCESS_LOCAL_WRITE : 0,
                         sge.addr, sge.length))
      return false;
    out = {reinterpret_cast<uint8_t*>(access::file_offset(*e, sge.addr)), sge.length, pid_t(e->owner_pid),
           e->owner_identity};
    return true;
  }
  Seg s;
  if (!plain_local_segment(q, sge, write, s)) return false;
  out = {s.p, s.len, 0};
  return true;
}

// The local SGEs of a request: its source (write false) or its destination.
bool local_list(ProcessQp& q, const shm::SendWqe& w, bool write, OSeg* segs, int& n, uint64_t& total) {
  n = 0;
  total = 0;
  if ((w.send_flags & IBV_SEND_INLINE) && !write) {
    Seg s[shm::kMaxSge];
    ibv_wc_status err;
    if (!gather(q, w, s, n, total, err)) return false;
    for (int i = 0; i < n; ++i) segs[i] = {s[i].p, s[i].len, 0};
    return true;
  }
  for (uint32_t i = 0; i < w.num_sge; ++i) {
    if (!local_oseg(q, w.sge[i], write, segs[n])) return false;
    total += segs[n++].len;
  }
  return total <= (1ull << 31);
}

// A range of the peer's memory under `key` (IBTA 10.6.7.2).
bool peer_oseg(ProcessQp& q, const Peer& p, uint32_t key, uint64_t addr, uint64_t len, uint32_t need, OSeg& out) {
  const MrEntry* e = checked_peer_key(q, p, key, addr, len, need);
  if (!e) return false;
  if (is_odp(*e)) {
    out = {reinterpret_cast<uint8_t*>(access::file_offset(*e, addr)), len, pid_t(e->owner_pid), e->owner_identity};
    return true;
  }
  uint8_t* d = plain_peer_address(q, p, key, addr, len, need);
  out = {d, len, 0};
  return d != nullptr;
}

Outcome odp_write(ProcessQp& q, Peer& p, const shm::SendWqe& w) {
  OSeg local[shm::kMaxSge];
  int nl = 0;
  uint64_t total = 0;
  if (!local_list(q, w, false, local, nl, total)) return {Step::kError, IBV_WC_LOC_PROT_ERR};
  OSeg dst{nullptr, 0, 0};
  if (total && !peer_oseg(q, p, w.rkey, w.remote_addr, total, IBV_ACCESS_REMOTE_WRITE, dst))
    return {Step::kError, IBV_WC_REM_ACCESS_ERR, true};
  shm::RecvWqe r;
  const bool imm = w.opcode == IBV_WR_RDMA_WRITE_WITH_IMM;
  if (imm && !pop_peer_recv(q, p, r)) return {Step::kRnr};
  if (Fail f = copy_odp(&dst, 1, local, nl, total); f != Fail::kNone) {
    if (imm) push_recv_completion(q, p, r, IBV_WC_REM_ACCESS_ERR, 0, w);
    if (f == Fail::kSource) return {Step::kError, IBV_WC_LOC_PROT_ERR};
    return {Step::kError, IBV_WC_REM_ACCESS_ERR, true};
  }
  if (imm) push_recv_completion(q, p, r, IBV_WC_SUCCESS, uint32_t(total), w);
  return {Step::kDone, IBV_WC_SUCCESS, false, uint32_t(total)};
}

Outcome odp_read(ProcessQp& q, Peer& p, const shm::SendWqe& w) {
  OSeg local[shm::kMaxSge];
  int nl = 0;
  uint64_t total = 0;
  if (!local_list(q, w, true, local, nl, total)) return {Step::kError, IBV_WC_LOC_PROT_ERR};
  if (!total) return {Step::kDone};
  OSeg src;
  if (!peer_oseg(q, p, w.rkey, w.remote_addr, total, IBV_ACCESS_REMOTE_READ, src))
    return {Step::kError, IBV_WC_REM_ACCESS_ERR, true};
  if (Fail f = copy_odp(local, nl, &src, 1, total); f != Fail::kNone) {
    if (f == Fail::kTarget) return {Step::kError, IBV_WC_LOC_PROT_ERR};
    return {Step::kError, IBV_WC_REM_ACCESS_ERR, true};
  }
  return {Step::kDone, IBV_WC_SUCCESS, false, uint32_t(total)};
}

// Holds the lock every RDMA atomic on ODP memory of this user takes: a
// flock(2) of the user's device segment (ContextState::odp_lock).
class AtomicLock {
 public:
  explicit AtomicLock(int fd) : fd_(fd) {
    while (fd_ >= 0 && ::flock(fd_, LOCK_EX) != 0 && errno == EINTR) {
    }
  }
  ~AtomicLock() {
    if (fd_ >= 0) ::flock(fd_, LOCK_UN);
  }
  AtomicLock(const AtomicLock&) = delete;
  AtomicLock& operator=(const AtomicLock&) = delete;

 private:
  int fd_;
};

// Compare-and-swap and fetch-and-add (IBTA 9.4.5) where the quadword or the
// result buffer is ODP memory. The target's read-modify-write runs under
// AtomicLock (odp_atomic, below): atomic with respect to every other RDMA
// atomic on ODP memory of this user (IBV_ATOMIC_HCA), not to the target
// process's own stores.
Outcome atomic_on_odp(ProcessQp& q, Peer& p, const shm::SendWqe& w) {
  OSeg res;
  if (!local_oseg(q, w.sge[0], true, res)) return {Step::kError, IBV_WC_LOC_PROT_ERR};
  if (access::Fault f = core::check_atomic(w.opcode, res.len, w.remote_addr); f != access::Fault::kNone)
    return {Step::kError, access::status(f), access::responder_detected(f)};
  OSeg t;
  if (!peer_oseg(q, p, w.rkey, w.remote_addr, 8, IBV_ACCESS_REMOTE_ATOMIC, t))
    return {Step::kError, IBV_WC_REM_ACCESS_ERR, true};
  const bool cas = w.opcode == IBV_WR_ATOMIC_CMP_AND_SWP;
  uint64_t old = 0;
  if (!t.pid) {
    old = core::apply_atomic(reinterpret_cast<uint64_t*>(t.p), cas, w.compare_add, w.swap);
  } else if (!odp_atomic(*q.ctx->st, t.owner(), uint64_t(uintptr_t(t.p)), cas, w.compare_add, w.swap, &old)) {
    return {Step::kError, IBV_WC_REM_ACCESS_ERR, true};
  }
  const OSeg from{reinterpret_cast<uint8_t*>(&old), 8, 0};
  if (copy_piece(res, 0, from, 0, 8) != Fail::kNone) return {Step::kError, IBV_WC_LOC_PROT_ERR};
  return {Step::kDone, IBV_WC_SUCCESS, false, 8};
}

// ATOMIC WRITE (IBTA annex A19) where the target or a source SGE is ODP
// memory: the checks and errors of atomic_write_at (requester.cc), then the
// 8 bytes as one aligned store, on ODP memory under AtomicLock
// (odp_atomic_write).
Outcome atomic_write_on_odp(ProcessQp& q, Peer& p, const shm::SendWqe& w) {
  OSeg local[shm::kMaxSge];
  int nl = 0;
  uint64_t total = 0;
  if (!local_list(q, w, false, local, nl, total)) return {Step::kError, IBV_WC_LOC_PROT_ERR};
  if (core::Check c = core::check_atomic_write(total, w.remote_addr); c != core::Check::kOk)
    return {Step::kError, core::requester_status(c), true};
  uint64_t v = 0;
  const OSeg value{reinterpret_cast<uint8_t*>(&v), 8, 0};
  if (copy_odp(&value, 1, local, nl, 8) != Fail::kNone) return {Step::kError, IBV_WC_LOC_PROT_ERR};
  OSeg t;
  if (!peer_oseg(q, p, w.rkey, w.remote_addr, 8, IBV_ACCESS_REMOTE_WRITE, t))
    return {Step::kError, IBV_WC_REM_ACCESS_ERR, true};
  if (!t.pid)
    core::store_atomic_write(reinterpret_cast<uint64_t*>(t.p), v);
  else if (!odp_atomic_write(*q.ctx->st, t.owner(), uint64_t(uintptr_t(t.p)), v))
    return {Step::kError, IBV_WC_REM_ACCESS_ERR, true};
  return {Step::kDone, IBV_WC_SUCCESS, false, 8};
}

// FLUSH on ODP memory: the pages are ordinary process memory with no
// persistent medium; global visibility is a fence (docs/MEMORY.md, FLUSH).
Outcome odp_flush(ProcessQp& q, Peer& p, const shm::SendWqe& w) {
  const uint8_t placement = uint8_t(w.swap), level = uint8_t(w.swap >> 8);
  if (core::Check c = core::check_flush(placement, level); c != core::Check::kOk)
    return {Step::kError, core::requester_status(c), true};
  const MrEntry* e = q.ctx->st->mr(w.rkey);
  if (!e) return {Step::kError, IBV_WC_REM_ACCESS_ERR, true};
  const core::Extent x = core::flush_extent(*e, level, w.remote_addr, w.compare_add);
  if (!checked_peer_key(q, p, w.rkey, x.addr, x.len, rules::flush_need(placement)))
    return {Step::kError, IBV_WC_REM_ACCESS_ERR, true};
  fence_seq_cst();
  return {Step::kDone, IBV_WC_SUCCESS, false, uint32_t(w.compare_add)};
}

// The source of a SEND, with its ODP pieces read into `stage` first, so
// that a fault in them fails the request before a receive is taken.
bool send_source(ProcessQp& q, const shm::SendWqe& w, OSeg* local, int& nl, uint64_t& total,
                 std::vector<uint8_t>& stage) {
  if (!local_list(q, w, false, local, nl, total)) return false;
  bool odp = false;
  for (int i = 0; i < nl; ++i) odp |= local[i].pid != 0;
  if (!odp) return true;
  stage.resize(total);
  OSeg whole{stage.data(), total, 0};
  if (copy_odp(&whole, 1, local, nl, total) != Fail::kNone) return false;
  local[0] = whole;
  nl = 1;
  return true;
}

// The receive `r` (popped) takes a message of `total` bytes from `local`
// (in this process's view): core::scatter_receive's checks, then the copy,
// whose failure is the responder's buffer's (its protection error).
core::Check scatter_odp(ProcessQp& q, Peer& p, const shm::RecvWqe& r, const OSeg* local, int nl, uint64_t total) {
  OSeg remote[shm::kMaxSge];
  uint32_t k = 0;
  const core::Check c =
      core::scatter_receive(r.sge, r.num_sge, 0, total, [&](const shm::Sge& s, uint64_t at, uint64_t n, uint64_t) {
        return peer_oseg(q, p, s.lkey, s.addr + at, n, IBV_ACCESS_LOCAL_WRITE, remote[k++]);
      });
  if (c != core::Check::kOk) return c;
  return copy_odp(remote, int(k), local, nl, total) == Fail::kNone ? c : core::Check::kReceiveBadKey;
}

// The receive `r` (popped) takes the SEND whose source is `local`.
Outcome deliver_send(ProcessQp& q, Peer& p, const shm::SendWqe& w, const shm::RecvWqe& r, const OSeg* local, int nl,
                     uint64_t total) {
  if (core::Check c = scatter_odp(q, p, r, local, nl, total); c != core::Check::kOk) {
    push_recv_completion(q, p, r, core::verdict(c).receive_status, 0, w);
    return {Step::kError, core::requester_status(c), true};
  }
  push_recv_completion(q, p, r, IBV_WC_SUCCESS, uint32_t(total), w);
  return {Step::kDone, IBV_WC_SUCCESS, false, uint32_t(total)};
}

}  // namespace

// The receive `r`, popped by the plain path, takes a SEND one of whose
// receive buffers is ODP memory (the source was plain: it resolved first).
Outcome odp_send_into(ProcessQp& q, Peer& p, const shm::SendWqe& w, const shm::RecvWqe& r) {
  q.odp_seen = false;
  OSeg local[shm::kMaxSge];
  int nl = 0;
  uint64_t total = 0;
  std::vector<uint8_t> stage;
  if (!send_source(q, w, local, nl, total, stage)) {  // its entry changed since
    push_recv_completion(q, p, r, core::verdict(core::Check::kResponderFault).receive_status, 0, w);
    return {Step::kError, IBV_WC_LOC_PROT_ERR};
  }
  return deliver_send(q, p, w, r, local, nl, total);
}

// A UD message's receive `r` with a buffer in ODP memory (requester_ud.cc).
core::Check odp_scatter(ProcessQp& q, Peer& p, const shm::RecvWqe& r, const Seg* src, int ns, uint64_t total) {
  q.odp_seen = false;
  OSeg local[shm::kMaxSge + 1];
  for (int i = 0; i < ns; ++i) local[i] = {src[i].p, src[i].len, 0};
  return scatter_odp(q, p, r, local, ns, total);
}

// A source list with ODP pieces, read into `stage` (requester_ud.cc): false
// if a key fails or a piece is not there (a local protection error).
bool odp_source(ProcessQp& q, const shm::SendWqe& w, std::vector<uint8_t>& stage, Seg* out, int& n, uint64_t& total) {
  q.odp_seen = false;
  OSeg local[shm::kMaxSge];
  if (!send_source(q, w, local, n, total, stage)) return false;
  for (int i = 0; i < n; ++i) out[i] = {local[i].p, local[i].len};
  return true;
}

// A request one of whose keys named ODP memory, carried out from scratch
// (nothing was done by the plain path: it stops at the first key).
Outcome execute_odp(ProcessQp& q, Peer& p, const shm::SendWqe& w) {
  q.odp_seen = false;
  switch (wr_rule(w.opcode).kind) {
    case WrKind::kSend: {
      OSeg local[shm::kMaxSge];
      int nl = 0;
      uint64_t total = 0;
      std::vector<uint8_t> stage;
      if (!send_source(q, w, local, nl, total, stage)) return {Step::kError, IBV_WC_LOC_PROT_ERR};
      shm::RecvWqe r;
      if (!pop_peer_recv(q, p, r)) return {Step::kRnr};
      return deliver_send(q, p, w, r, local, nl, total);
    }
    case WrKind::kWrite: return odp_write(q, p, w);
    case WrKind::kRead: return odp_read(q, p, w);
    case WrKind::kFlush: return odp_flush(q, p, w);
    case WrKind::kAtomic: return atomic_on_odp(q, p, w);
    case WrKind::kAtomicWrite: return atomic_write_on_odp(q, p, w);
    default: return {Step::kError, IBV_WC_LOC_QP_OP_ERR};
  }
}

// ibv_advise_mr(3): PREFETCH / PREFETCH_WRITE populate the range in the
// MR's process (MADV_POPULATE_READ / _WRITE, Linux 5.14); PREFETCH_NO_FAULT
// has nothing to do (a software device has no page table of its own).
// Each SGE must name an ODP MR of `pd` (its L_Key), in bounds, with local
// write for PREFETCH_WRITE.
int advise_mr(ibv_pd* pd, ibv_advise_mr_advice advice, uint32_t flags, ibv_sge* sg, uint32_t n) {
  if (advice != IBV_ADVISE_MR_ADVICE_PREFETCH && advice != IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE &&
      advice != IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT)
    return EOPNOTSUPP;
  if ((flags & ~uint32_t(IBV_ADVISE_MR_FLAG_FLUSH)) || !sg || n == 0) return EINVAL;
  ContextState& st = ctx_state(pd->context);
  const uint32_t need = advice == IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE ? IBV_ACCESS_LOCAL_WRITE : 0;
  for (uint32_t i = 0; i < n; ++i) {
    const MrEntry* e = st.mr(sg[i].lkey);
    if (!e || !is_odp(*e) || !access::permits(e, access::Use::kLocal, {to_pd(pd)->handle, 0, 0}, need, sg[i].addr,
                                              sg[i].length))
      return EINVAL;
  }
  if (advice == IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT) return 0;
  const int how = need ? MADV_POPULATE_WRITE : MADV_POPULATE_READ;
  for (uint32_t i = 0; i < n; ++i) {
    const MrEntry* e = st.mr(sg[i].lkey);
    if (!e || e->owner_pid != uint32_t(self_pid())) continue;  // another process's pages: its own faults bring them
    const uint64_t a = page_down(sg[i].addr), end = page_up(sg[i].addr + sg[i].length);
    // A range with a hole is populated up to it: prefetch is advice.
    if (end > a) (void)::madvise(reinterpret_cast<void*>(a), end - a, how);
  }
  return 0;
}

bool odp_read(const OdpOwner& o, uint64_t addr, uint8_t* out, size_t n) { return odp_copy(o, addr, out, n, false); }

bool odp_write(const OdpOwner& o, uint64_t addr, const uint8_t* in, size_t n) {
  return odp_copy(o, addr, const_cast<uint8_t*>(in), n, true);
}

bool odp_atomic_write(ContextState& cs, const OdpOwner& o, uint64_t addr, uint64_t value) {
  if (!cs.odp_lock.valid()) {
    say_refused(ENOLCK, o.pid);
    return false;
  }
  AtomicLock lock(cs.odp_lock.get());
  int err = 0;
  std::shared_ptr<const OdpMemory> mem = registrant_memory(o, &err);
  if (mem) err = mem->store_word(addr, value);
  if (err) say_refused(err, o.pid);
  return err == 0;
}

bool odp_atomic(ContextState& cs, const OdpOwner& o, uint64_t addr, bool cas, uint64_t compare_add, uint64_t swap,
                uint64_t* orig) {
  if (!cs.odp_lock.valid()) {
    say_refused(ENOLCK, o.pid);
    return false;
  }
  AtomicLock lock(cs.odp_lock.get());
  uint64_t old = 0;
  if (!odp_read(o, addr, reinterpret_cast<uint8_t*>(&old), 8)) return false;
  const uint64_t now = cas ? (old == compare_add ? swap : old) : old + compare_add;
  if (now != old && !odp_write(o, addr, reinterpret_cast<const uint8_t*>(&now), 8)) return false;
  *orig = old;
  return true;
}

}  // namespace sv::verbs
