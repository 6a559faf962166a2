// registry.cc: the registry's clients and contexts, and the object tables
// (objects.h): references between objects, and the release of a context's
// objects in one loop over the types in destroy order. Each object type's
// verbs are in its own file: pd.cc, mr.cc, cq.cc, qp.cc, srq.cc, xrc.cc,
// sharing.cc (contexts across processes, regions, the namespace).
#include "daemon/registry.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <random>

#include "common/trace.h"
#include "daemon/identity.h"

namespace sv::daemon {

using namespace sv::shm;

Registry::Registry() = default;

int Registry::init() {
  std::random_device rd;
  boot_id_ = (uint64_t(rd()) << 32) | rd();
  tables_.set_boot_id(boot_id_);
  // The device of the socket file system, which every socket's inode is on
  // (import_context tells a real socket from a socket file by it).
  int sp[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp) != 0) return errno;
  struct stat st {};
  int r = ::fstat(sp[0], &st);
  ::close(sp[0]);
  ::close(sp[1]);
  if (r != 0) return EIO;
  sockfs_dev_ = uint64_t(st.st_dev);
  return 0;
}

// The device segment of the client's user (device_tables.h): the MR and QP
// entries of that user's objects, and the multicast groups.
int Registry::device_fd(uint32_t client, int& fd) {
  auto c = clients_.find(client);
  if (c == clients_.end()) return EINVAL;
  int err = 0;
  fd = tables_.segment_fd(c->second.uid, err);
  return fd < 0 ? err : 0;
}

uid_t Registry::context_uid(uint32_t context) const {
  auto it = contexts_.find(context);
  return it == contexts_.end() ? uid_t(-1) : it->second.uid;
}

bool Registry::same_tables(uint32_t client, uint32_t owner) const {
  auto c = clients_.find(client);
  return c != clients_.end() && context_uid(owner) == c->second.uid && context_uid(c->second.ctx) == c->second.uid;
}

uint32_t Registry::add_client(pid_t pid, uid_t uid, gid_t gid, Fd pidfd) {
  uint32_t id = next_client_++;
  uint32_t context = next_handle_++;
  Client c{pid, uid, gid, context, 0};
  if (!pidfd.valid()) pidfd_open(pid, pidfd);
  // Credentials that differ from those the socket recorded at connect()
  // (SO_PEERCRED: the effective ids) changed since: the process exec'd a
  // setuid binary before we got here. Its capabilities are not its own.
  if (read_identity(pid, pidfd.get(), c.at_connect) && (c.at_connect.uids[1] != uid || c.at_connect.gids[1] != gid))
    c.at_connect.ipc_lock = false;
  c.pidfd = std::move(pidfd);
  c.identity = pidfd_identity(c.pidfd.get());
  clients_[id] = std::move(c);
  ctx_clients_.insert({context, id});
  contexts_[context] = Context{1, uid};
  user_contexts_.insert({uid, context});
  return id;
}

uid_t Registry::client_uid(uint32_t client) const {
  auto c = clients_.find(client);
  return c == clients_.end() ? uid_t(-1) : c->second.uid;
}

bool Registry::same_user(uint32_t client, uint32_t owner) const {
  auto c = clients_.find(client);
  auto o = contexts_.find(owner);
  if (c == clients_.end() || o == contexts_.end()) return false;
  // Strictly the same user: root is not special here. Descriptors of a
  // context map its holder's memory and queues; a root process that got a
  // descriptor of another user's context (or gave one of its own) would mix
  // the two users' memory, which is what a hostile user wants root to do.
  // Between users, work goes through the daemon.
  return c->second.uid == o->second.uid;
}

std::vector<uint32_t> Registry::clients_of(uint32_t context) const {
  std::vector<uint32_t> ids;
  for (auto it = ctx_clients_.lower_bound({context, 0}); it != ctx_clients_.end() && it->first == context; ++it)
    ids.push_back(it->second);
  return ids;
}

uint32_t Registry::ctx(uint32_t client) const {
  auto it = clients_.find(client);
  return it == clients_.end() ? 0 : it->second.ctx;
}

void Registry::remove_context_if_unused(uint32_t context) {
  auto ct = contexts_.find(context);
  if (ct != contexts_.end() && --ct->second.attached == 0) {
    user_contexts_.erase({ct->second.uid, context});
    contexts_.erase(ct);
    release_context(context);
  }
}

void Registry::remove_client(uint32_t client) {
  auto c = clients_.find(client);
  if (c == clients_.end()) return;
  uint32_t context = c->second.ctx;
  SV_TRACE("daemon: client %u (pid %d) left context %u", client, int(c->second.pid), context);
  cm_ports_.release_client(client);
  ctx_clients_.erase({context, client});
  if (auto s = socket_client_.find(c->second.socket_inode); s != socket_client_.end() && s->second == client)
    socket_client_.erase(s);
  clients_.erase(c);
  async_fds_.erase(client);
  quotas_.release_fds(Quotas::fd_key(client, Quotas::kAsyncFd));
  quotas_.release_fds(Quotas::fd_key(client, Quotas::kOdpFds));
  cq_.drop_grants(client);
  auto ct = contexts_.find(context);
  if (ct != contexts_.end() && --ct->second.attached > 0) return;  // other processes still hold it
  if (ct != contexts_.end()) user_contexts_.erase({ct->second.uid, context});
  contexts_.erase(context);
  release_context(context);
}

// ---- The object tables ---------------------------------------------------

// Each type's part in a context's release, indexed by kind (objects.h:
// the context-owned kinds are numbered in destroy order). A null `collect`
// means the objects the context owns; a null `cleanup`, forget() alone.
const Registry::TypeOps Registry::kTypeOps[] = {
    {ObjKind::kQp, [](Registry& r, uint32_t ctx) { return r.qp_.to_release(ctx); },
     [](Registry& r, uint32_t, const std::vector<uint32_t>& qpns) { r.qp_.before_release(qpns); },
     [](Registry& r, uint32_t qpn) { r.qp_.release(qpn); },
     [](Registry& r, const std::vector<uint32_t>& qpns) { r.qp_.fail_peers_of(qpns); },
     [](Registry& r, uint32_t ctx, uint32_t qpn) { return r.qp_.destroy_handle(ctx, qpn); }},
    {ObjKind::kSrq, nullptr, nullptr, nullptr, nullptr, nullptr},
    {ObjKind::kXrcdHandle, nullptr, nullptr, [](Registry& r, uint32_t h) { r.xrc_.release(h); }, nullptr,
     [](Registry& r, uint32_t, uint32_t h) { return r.xrc_.close(h); }},
    {ObjKind::kMw, nullptr, nullptr, [](Registry& r, uint32_t slot) { r.mr_.release_mw(slot); }, nullptr, nullptr},
    {ObjKind::kMr, nullptr, [](Registry& r, uint32_t, const std::vector<uint32_t>& mrs) { r.mr_.unbind_windows_of(mrs); },
     [](Registry& r, uint32_t slot) { r.mr_.release(slot); }, nullptr, nullptr},
    {ObjKind::kDm, nullptr, nullptr, [](Registry& r, uint32_t h) { r.dm_.release(h); }, nullptr, nullptr},
    {ObjKind::kCq, nullptr, nullptr, nullptr, nullptr, nullptr},
    {ObjKind::kChannel, nullptr, nullptr, nullptr, nullptr, nullptr},
    {ObjKind::kBacking, nullptr, nullptr, [](Registry& r, uint32_t id) { r.backings_.drop(id); }, nullptr, nullptr},
    {ObjKind::kPd, nullptr, nullptr, nullptr, nullptr, nullptr},
};

template <class F>
decltype(auto) Registry::with_table(ObjKind kind, F&& f) {
  switch (kind) {
    case ObjKind::kQp: return f(qp_.table());
    case ObjKind::kSrq: return f(srq_.table());
    case ObjKind::kXrcdHandle: return f(xrc_.handles());
    case ObjKind::kMw: return f(mr_.windows());
    case ObjKind::kMr: return f(mr_.table());
    case ObjKind::kDm: return f(dm_.table());
    case ObjKind::kCq: return f(cq_.table());
    case ObjKind::kChannel: return f(cq_.channels());
    case ObjKind::kBacking: return f(backings_.table());
    case ObjKind::kPd: return f(pd_.table());
    case ObjKind::kXrcd:
    case ObjKind::kCount: break;
  }
  return f(xrc_.domains());
}

Object* Registry::resolve(ObjKind kind, uint32_t client, uint32_t handle) {
  const uint32_t c = ctx(client);
  if (kind == ObjKind::kQp) return qp_.held(c, handle);
  if (kind >= ObjKind::kXrcd) return nullptr;  // a domain is named by a handle of it
  return with_table(kind, [&](auto& t) -> Object* {
    Object* o = t.get(handle);
    return o && c && o->owner == c ? o : nullptr;
  });
}

// The rules other than kOwned are each for one kind (proto::rule_fits).
int Registry::resolve(ObjKind kind, proto::HandleRule rule, uint32_t client, uint32_t handle, Object*& out) {
  using proto::HandleRule;
  out = nullptr;
  switch (rule) {
    case HandleRule::kOwned: out = resolve(kind, client, handle); break;
    case HandleRule::kOwnedOrGranted:
      out = resolve(kind, client, handle);
      if (!out && kind == ObjKind::kCq && cq_.granted(client, handle)) out = cq_.table().get(handle);
      break;
    case HandleRule::kGranted:
      if (kind == ObjKind::kCq && cq_.granted(client, handle)) out = cq_.table().get(handle);
      break;
    case HandleRule::kCompletable:
      if (kind == ObjKind::kCq && may_complete_into(client, handle)) out = cq_.table().get(handle);
      break;
    case HandleRule::kReachable:
      if (kind != ObjKind::kSrq) break;
      if (Srq* s = srq_.table().get(handle)) {
        if (!srq_reachable(client, *s, handle)) return EACCES;
        out = s;
      }
      break;
    case HandleRule::kOwnKey:
    case HandleRule::kReachableKey:
      if (kind == ObjKind::kMr) return mr_by_key(client, handle, rule == HandleRule::kReachableKey, out);
      break;
  }
  return out ? 0 : EINVAL;
}

int Registry::destroy(ObjKind kind, uint32_t client, uint32_t handle) {
  if (kind >= ObjKind::kXrcd) return EINVAL;
  const TypeOps& t = kTypeOps[size_t(kind)];
  if (t.destroy) return t.destroy(*this, ctx(client), handle);
  const uint32_t refs = with_table(kind, [&](auto& table) {
    const auto* o = table.get(handle);
    return o ? o->refs : 0;
  });
  if (refs) return EBUSY;  // still used by other objects
  if (t.cleanup) {
    t.cleanup(*this, handle);
  } else {
    forget(kind, handle);
  }
  return 0;
}

void Registry::hold(Ref r) {
  if (r.handle) with_table(r.kind, [&](auto& t) { t.ref(r.handle); });
}

void Registry::hold(const Held& refs) {
  for (Ref r : refs) hold(r);
}

// Dropping the last reference frees the objects that live only while
// referenced: a region's backing with its last MR (seed 000), device
// memory's backing with its DM, an XRC domain nobody opened or uses any
// more.
void Registry::drop(Ref r) {
  if (!r.handle) return;
  const int64_t left = with_table(r.kind, [&](auto& t) { return t.unref(r.handle); });
  if (r.kind == ObjKind::kBacking && left == 0) backings_.unreferenced(r.handle);
  if (r.kind == ObjKind::kXrcd) xrc_.drop_if_unused(r.handle);
}

void Registry::drop(const Held& refs) {
  for (Ref r : refs) drop(r);
}

void Registry::forget(ObjKind kind, uint32_t handle) {
  const Held held = with_table(kind, [&](auto& t) {
    const Held h = t.held_by(handle);
    t.remove(handle);
    return h;
  });
  quotas_.release(type_info(kind).quota, handle);
  drop(held);
}

// Frees every object of a context no process holds any more, type by type
// in destroy order (referrers first: QPs, SRQs, XRC domain handles,
// windows, MRs, device memory, CQs, channels, backings, PDs), so that each object's
// cleanup only drops references to objects still there.
void Registry::release_context(uint32_t owner) {
  for (const TypeInfo& type : kDestroyOrder) {
    const TypeOps& t = kTypeOps[size_t(type.kind)];
    std::vector<uint32_t> ids =
        t.collect ? t.collect(*this, owner) : with_table(t.kind, [&](auto& table) { return table.of(owner); });
    if (t.before) t.before(*this, owner, ids);
    for (uint32_t id : ids) {
      if (t.cleanup) {
        t.cleanup(*this, id);
      } else {
        forget(t.kind, id);
      }
    }
    if (t.after) t.after(*this, ids);
  }
}

// The registrant of ODP MRs exited (its pidfd, which the server watches
// once the client registered one, became readable) or left (`left`: its
// connection closed: exit, exec, ibv_close_device): its ODP MRs go now,
// whoever else holds the context, so that no key reaches a later process
// that reuses the pid, nor the program an exec put in its place. A client
// whose process is alive and connected is left alone.
void Registry::odp_owner_gone(uint32_t client, bool left) {
  auto it = clients_.find(client);
  if (it == clients_.end()) return;
  const Client& c = it->second;
  if (!left && c.pidfd.valid() && pidfd_alive(c.pidfd.get())) return;
  mr_.registrant_gone(ctx(client), c.pid);
}

int Registry::client_pidfd(uint32_t client) const {
  auto it = clients_.find(client);
  return it == clients_.end() ? -1 : it->second.pidfd.get();
}

// The registrant as a registration records it; a client not there is made
// (as a registration of one always did: never reached, the command layer
// serves connected clients only).
ClientView Registry::client_view(uint32_t client) {
  const Client& c = clients_[client];
  return {c.pid, c.uid, c.gid, c.ctx, c.identity, c.pidfd.get(), &c.at_connect};
}

// An ODP MR dies with its process: without a pidfd (Linux 5.3) the daemon
// could not tell when (odp_owner_gone). Every copy of its memory goes
// through its pinned address space, opened once (the process behind the
// pidfd held since connect). Its four descriptors (/proc/PID/mem, maps and
// pagemap, a pidfd) are charged to the user while the client lasts.
int Registry::open_odp_memory(uint32_t client) {
  auto c = clients_.find(client);
  if (c == clients_.end() || !c->second.pidfd.valid()) return EOPNOTSUPP;
  if (!c->second.odp_memory) {
    if (int e = quotas_.admit_fds(c->second.uid, 4)) return e;
    if (int e = OdpMemory::open(c->second.pid, c->second.pidfd.get(), c->second.odp_memory)) {
      std::fprintf(stderr, "softverbsd: the address space of process %d cannot be opened for on-demand paging: %s\n",
                   int(c->second.pid), std::strerror(e));
      return e == ESRCH ? ESRCH : EACCES;
    }
    quotas_.charge_fds(Quotas::fd_key(client, Quotas::kOdpFds), c->second.uid, 4);
  }
  return 0;
}

Counts Registry::counts() const {
  return {uint32_t(clients_.size()), uint32_t(pd_.table().size()),      uint32_t(mr_.table().size()),
          uint32_t(cq_.table().size()),     uint32_t(qp_.table().size()),      uint32_t(cq_.channels().size()),
          uint32_t(backings_.table().size())};
}

void Registry::context_event(uint32_t context, uint32_t type, uint32_t element) {
  for (uint32_t id : clients_of(context)) events_.push_back({id, type, element});
}

// The connection's async wake-up socket (proto::FdKind::kWakeSocket, checked
// by run_command): signalled with wake_signal, which never sleeps. One per
// connection (a second replaces the first), a descriptor of its user's quota.
int Registry::reg_async(uint32_t client, Fd wake) {
  auto c = clients_.find(client);
  if (c == clients_.end() || !wake.valid()) return EINVAL;
  if (!async_fds_.count(client)) {
    if (int e = quotas_.admit_fds(c->second.uid, 1)) return e;
    quotas_.charge_fds(Quotas::fd_key(client, Quotas::kAsyncFd), c->second.uid, 1);
  }
  c->second.async_fd = wake.get();
  async_fds_[client] = std::move(wake);
  return 0;
}

}  // namespace sv::daemon
