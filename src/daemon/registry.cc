#include "daemon/registry.h"

#include "common/trace.h"

#include <dirent.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <linux/magic.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <random>

#include "common/completion.h"
#include "common/qp_state.h"

#ifndef F_SEAL_FUTURE_WRITE
#define F_SEAL_FUTURE_WRITE 0x0010  // Linux 5.1
#endif

namespace sv::daemon {

using namespace sv::shm;

namespace {

constexpr uint32_t kKnownAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                                  IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC |
                                  IBV_ACCESS_MW_BIND | IBV_ACCESS_ZERO_BASED;
constexpr uint32_t kQpAccess = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;

// RLIMIT_MEMLOCK (soft) of `pid` in bytes, as read now.
bool read_rlimit_memlock(pid_t pid, uint64_t& out) {
  rlimit rl{};
  if (::prlimit(pid, RLIMIT_MEMLOCK, nullptr, &rl) == 0) {
    out = rl.rlim_cur == RLIM_INFINITY ? UINT64_MAX : uint64_t(rl.rlim_cur);
    return true;
  }
  // prlimit(2) on another user's process needs CAP_SYS_RESOURCE, which a
  // system daemon in a container may lack: /proc/PID/limits says the same.
  FILE* f = std::fopen((std::string("/proc/") + std::to_string(pid) + "/limits").c_str(), "r");
  if (!f) return false;
  char line[256];
  bool found = false;
  while (std::fgets(line, sizeof(line), f)) {
    if (std::strncmp(line, "Max locked memory", 17) != 0) continue;
    char soft[64] = {0};
    if (std::sscanf(line + 17, "%63s", soft) == 1) {
      out = std::strcmp(soft, "unlimited") == 0 ? UINT64_MAX : std::strtoull(soft, nullptr, 10);
      found = true;
    }
    break;
  }
  std::fclose(f);
  return found;
}

// Whether `pid` lives in the initial user namespace, where the kernel's
// capable() looks for CAP_IPC_LOCK (capabilities(7), user_namespaces(7)):
// a process that holds every capability in a namespace of its own (unshare
// -Ur) holds none there. The initial namespace is pid 1's as this daemon
// sees it, or the daemon's own where pid 1's is not readable (a per-user
// daemon). Unreadable counts as another namespace.
bool in_initial_userns(pid_t pid) {
  static const std::pair<dev_t, ino_t> initial = [] {
    struct stat st {};
    if (::stat("/proc/1/ns/user", &st) != 0 && ::stat("/proc/self/ns/user", &st) != 0) st = {};
    return std::pair{st.st_dev, st.st_ino};
  }();
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%d/ns/user", int(pid));
  struct stat st {};
  return initial.second != 0 && ::stat(path, &st) == 0 && st.st_dev == initial.first && st.st_ino == initial.second;
}

// What decides `pid`'s locked-memory limit now, read through /proc. True
// only if the process behind `pidfd` was alive until everything was read,
// so that the pid was not reused by another process meanwhile.
bool read_identity(pid_t pid, int pidfd, ConnectIdentity& out) {
  if (!pidfd_alive(pidfd)) return false;
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%d/status", int(pid));
  FILE* f = std::fopen(path, "r");
  if (!f) return false;
  char line[256];
  unsigned long long capeff = 0;
  int fields = 0;
  while (std::fgets(line, sizeof(line), f)) {
    unsigned a, b, c, d;
    if (std::sscanf(line, "CapEff: %llx", &capeff) == 1) {
      fields |= 1;
    } else if (std::sscanf(line, "Uid: %u %u %u %u", &a, &b, &c, &d) == 4) {
      out.uids[0] = a, out.uids[1] = b, out.uids[2] = c, out.uids[3] = d;
      fields |= 2;
    } else if (std::sscanf(line, "Gid: %u %u %u %u", &a, &b, &c, &d) == 4) {
      out.gids[0] = a, out.gids[1] = b, out.gids[2] = c, out.gids[3] = d;
      fields |= 4;
    }
  }
  std::fclose(f);
  if (fields != 7 || !read_rlimit_memlock(pid, out.memlock)) return false;
  out.ipc_lock = (capeff & (1ull << 14)) && in_initial_userns(pid);  // CAP_IPC_LOCK
  if (!pidfd_alive(pidfd)) return false;
  out.known = true;
  return true;
}

// The locked-memory limit of a client in bytes: RLIMIT_MEMLOCK, or
// unlimited with CAP_IPC_LOCK (as ib_umem_get charges pinned pages in the
// kernel), decided for the process that connected: the capability must
// have been held at connect time and still be held, and once the process
// is gone or its credentials changed (the exec of a setuid binary), the
// limit is no larger than it was at connect time.
uint64_t memlock_limit(pid_t pid, int pidfd, const ConnectIdentity& at_connect) {
  if (!at_connect.known) return 0;
  ConnectIdentity now;
  const bool live = read_identity(pid, pidfd, now);
  if (at_connect.ipc_lock && (!live || now.ipc_lock)) return UINT64_MAX;
  if (!live) return at_connect.memlock;
  const bool same = std::equal(now.uids, now.uids + 4, at_connect.uids) &&
                    std::equal(now.gids, now.gids + 4, at_connect.gids);
  return same ? now.memlock : std::min(now.memlock, at_connect.memlock);
}

}  // namespace

Registry::Registry() : mr_key_byte_(kMrTableSize, 0), qp_gen_(kQpTableSize, 0) {}

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

uid_t Registry::ctx_uid(uint32_t context) const {
  auto it = contexts_.find(context);
  return it == contexts_.end() ? uid_t(-1) : it->second.uid;
}

bool Registry::same_tables(uint32_t client, uint32_t owner) const {
  auto c = clients_.find(client);
  return c != clients_.end() && ctx_uid(owner) == c->second.uid && ctx_uid(c->second.ctx) == c->second.uid;
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
  clients_[id] = std::move(c);
  contexts_[context] = Context{1, uid};
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
  // the two users' memory, which is what a hostile user wants root to do
  // (issue 18, finding 4). Between users, work goes through the daemon.
  return c->second.uid == o->second.uid;
}

uint32_t Registry::ctx(uint32_t client) const {
  auto it = clients_.find(client);
  return it == clients_.end() ? 0 : it->second.ctx;
}

int Registry::claim_socket(uint32_t client, uint64_t inode) {
  auto c = clients_.find(client);
  if (c == clients_.end() || inode == 0) return EINVAL;
  // The claim must be true: the client process holds that socket.
  char dir[64];
  std::snprintf(dir, sizeof(dir), "/proc/%d/fd", int(c->second.pid));
  bool found = false;
  if (DIR* d = ::opendir(dir)) {
    char want[64];
    std::snprintf(want, sizeof(want), "socket:[%llu]", (unsigned long long)inode);
    while (dirent* e = ::readdir(d)) {
      char path[320], target[64];
      std::snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
      ssize_t n = ::readlink(path, target, sizeof(target) - 1);
      if (n <= 0) continue;
      target[n] = 0;
      if (std::strcmp(target, want) == 0) {
        found = true;
        break;
      }
    }
    ::closedir(d);
  }
  if (!found) return EPERM;
  for (auto& [id, other] : clients_)
    if (id != client && other.socket_inode == inode) return EEXIST;
  c->second.socket_inode = inode;
  return 0;
}

int Registry::import_context(uint32_t client, Fd fd) {
  auto me = clients_.find(client);
  if (me == clients_.end()) return EINVAL;
  // The descriptor must be a socket in fact, of the socket file system: an
  // O_PATH descriptor of a socket *file* (S_ISSOCK too, any inode number)
  // fails getsockopt, and its st_dev is its file system's, not sockfs'.
  struct stat st {};
  int type = 0;
  socklen_t tl = sizeof(type);
  if (!fd.valid() || ::fstat(fd.get(), &st) != 0 || !S_ISSOCK(st.st_mode)) return EINVAL;
  if (::getsockopt(fd.get(), SOL_SOCKET, SO_TYPE, &type, &tl) != 0 || uint64_t(st.st_dev) != sockfs_dev_)
    return EINVAL;
  for (auto& [id, other] : clients_) {
    // Identity: (sockfs device, inode) of a socket the owner's process was
    // seen to hold when it claimed it (claim_socket).
    if (id == client || other.socket_inode != uint64_t(st.st_ino)) continue;
    // Credentials are checked at every import: only the context's own user
    // joins it (strictly the same uid; root is not special). A socket that
    // reached another user (passed, inherited) is not a grant.
    auto oc = contexts_.find(other.ctx);
    if (oc == contexts_.end() || oc->second.uid != me->second.uid || other.uid != me->second.uid) return EPERM;
    // ibv_import_device(3): this connection now shares that context. It must
    // not hold objects of its own yet.
    uint32_t mine = me->second.ctx;
    for (auto& [h, p] : pds_)
      if (p.owner == mine) return EBUSY;
    for (auto& [h, b] : backings_)
      if (b.owner == mine) return EBUSY;
    remove_context_if_unused(mine);
    me->second.ctx = other.ctx;
    contexts_[other.ctx].attached++;
    return 0;
  }
  return ENOENT;
}

int Registry::query_pd(uint32_t client, uint32_t pd) {
  auto it = pds_.find(pd);
  return (it == pds_.end() || it->second.owner != ctx(client)) ? EINVAL : 0;
}

int Registry::query_mr(uint32_t client, uint32_t handle, proto::QueryMrReply& rep) {
  auto it = mrs_.find(handle);
  if (it == mrs_.end() || it->second.owner != ctx(client)) return EINVAL;
  const MrEntry& e = tables_.mr_at(handle);
  rep.pd = it->second.pd;
  rep.key = it->second.key;
  rep.addr = e.file_offset;  // the registrant's address
  rep.length = e.length;
  rep.access = e.access;
  return 0;
}

bool Registry::cq_granted(uint32_t client, uint32_t handle) const {
  for (auto [g, end] = cq_grants_.equal_range(client); g != end; ++g)
    if (g->second == handle) return true;
  return false;
}

int Registry::import_cq(uint32_t client, uint32_t handle, proto::ImportCqReply& rep, std::vector<int>& out_fds) {
  auto it = cqs_.find(handle);
  if (it == cqs_.end()) return EINVAL;
  rep.capacity = it->second.capacity;
  if (it->second.owner != ctx(client)) {
    if (!cq_granted(client, handle)) return EINVAL;
    // Granted (another user opened it by name): no descriptor at all. Any
    // mapping of the segment, even a read-only one reopened through
    // /proc/self/fd, would let the grantee forge completions or hold the
    // owner's poll lock; polling consumes, so the daemon polls for it.
    // Nor its channel (an eventfd of the owner's context).
    rep.channel = 0;
    rep.segment_size = 0;
    return 0;
  }
  rep.channel = it->second.channel;
  rep.segment_size = it->second.map.size();
  out_fds.push_back(it->second.fd.get());
  return 0;
}

int Registry::poll_granted_cq(uint32_t client, const proto::PollCqReq& req, proto::PollCqReply& rep) {
  rep.count = 0;
  if (req.max == 0 || req.max > proto::kPollCqMax) return EINVAL;
  auto it = cqs_.find(req.handle);
  if (it == cqs_.end() || !cq_granted(client, req.handle)) return EINVAL;
  Cq& cq = it->second;
  // The current segment as the daemon made it (a committed resize moved
  // cq.map); its geometry is the daemon's, never the header's.
  auto* h = cq.map.as<CqSegmentHeader>();
  auto* rh = reinterpret_cast<RingHeader*>(cq.map.as<char>() + CqLayout{cq.capacity}.ring_offset());
  Ring<Cqe> ring(rh, reinterpret_cast<RingSlot<Cqe>*>(rh + 1), cq.capacity);
  // Try-lock: a poller (or a resize) of the owner holds it, or a hostile
  // owner keeps it: "nothing now", the grantee polls again.
  uint32_t free_ = 0;
  static const uint32_t self = uint32_t(::getpid());
  if (!h->poll_lock.owner.compare_exchange_strong(free_, self, std::memory_order_acquire)) return 0;
  // The owner's last poll may hold back one slot (verbs/cq.cc release_taken):
  // give it back first, as any poller does.
  // release_if_taken gives it back only if the slot still holds what was
  // taken (the owner's rings skip slots of dead producers, shm_ring.h).
  if (uint64_t t = h->taken.load(std::memory_order_relaxed)) {
    ring.release_if_taken(t - 1);
    h->taken.store(0, std::memory_order_relaxed);
  }
  Cqe e;
  while (rep.count < req.max && ring.pop_exclusive(e)) rep.wc[rep.count++] = e.wc;
  h->poll_lock.unlock();
  return 0;
}

int Registry::import_qp(uint32_t client, uint32_t qpn, proto::ImportQpReply& rep, std::vector<int>& out_fds) {
  Qp* qp = find_qp(client, qpn);
  if (!qp) return EINVAL;
  rep.pd = qp->pd;
  rep.send_cq = qp->send_cq;
  rep.recv_cq = qp->recv_cq;
  rep.qp_type = qp->type;
  rep.max_send_wr = qp->sq_capacity;
  rep.max_recv_wr = qp->rq_capacity;
  rep.sq_sig_all = qp->sq_sig_all;
  rep.segment_size = qp->map.size();
  out_fds.push_back(qp->fd.get());
  return 0;
}

int Registry::import_channel(uint32_t client, uint32_t handle, std::vector<int>& out_fds) {
  auto it = channels_.find(handle);
  if (it == channels_.end() || it->second.owner != ctx(client)) return EINVAL;
  out_fds.push_back(it->second.eventfd.get());
  return 0;
}

int Registry::import_srq(uint32_t client, uint32_t handle, proto::ImportSrqReply& rep, std::vector<int>& out_fds) {
  auto it = srqs_.find(handle);
  if (it == srqs_.end() || it->second.owner != ctx(client)) return EINVAL;
  rep.pd = it->second.pd;
  rep.max_sge = it->second.map.as<SrqSegmentHeader>()->max_sge;
  rep.segment_size = it->second.map.size();
  out_fds.push_back(it->second.fd.get());
  return 0;
}

void Registry::remove_context_if_unused(uint32_t context) {
  auto ct = contexts_.find(context);
  if (ct != contexts_.end() && --ct->second.attached == 0) {
    contexts_.erase(ct);
    release_context(context);
  }
}

void Registry::remove_client(uint32_t client) {
  auto c = clients_.find(client);
  if (c == clients_.end()) return;
  uint32_t context = c->second.ctx;
  SV_TRACE("daemon: client %u (pid %d) left context %u", client, int(c->second.pid), context);
  clients_.erase(c);
  async_fds_.erase(client);
  cq_grants_.erase(client);
  auto ct = contexts_.find(context);
  if (ct != contexts_.end() && --ct->second.attached > 0) return;  // other processes still hold it
  contexts_.erase(context);
  release_context(context);
}

// Frees every object of a context no process holds any more, in dependency
// order: QPs use CQs and PDs; windows and MRs use PDs and backings.
void Registry::release_context(uint32_t owner) {
  std::vector<uint32_t> ids;
  for (auto& [qpn, q] : qps_) {
    if (q.type == IBV_QPT_XRC_RECV) {
      std::erase(q.holders, owner);
      if (!q.holders.empty()) {
        q.owner = q.holders.front();  // another context still holds the target QP
        continue;
      }
      ids.push_back(qpn);
    } else if (q.owner == owner) {
      ids.push_back(qpn);
    }
  }
  for (uint32_t id : ids) complete_torn_receive(id);
  for (uint32_t id : ids) release_qp(id);
  fail_peers_of(ids);
  ids.clear();
  for (auto& [h, q] : srqs_)
    if (q.owner == owner) ids.push_back(h);
  for (uint32_t h : ids) {
    release_srq_refs(srqs_[h]);
    quotas_.release(Quotas::kSrq, h);
    srqs_.erase(h);
  }
  ids.clear();
  for (auto& [h, x] : xrcd_handles_)
    if (x.owner == owner) ids.push_back(h);
  for (uint32_t h : ids) {
    uint32_t id = xrcd_handles_[h].xrcd;
    quotas_.release(Quotas::kXrcd, h);
    xrcd_handles_.erase(h);
    if (auto x = xrcds_.find(id); x != xrcds_.end()) x->second.opens--;
    xrcd_drop_if_unused(id);
  }
  ids.clear();
  for (auto& [h, w] : mws_)
    if (w.owner == owner) ids.push_back(h);
  for (uint32_t id : ids) {
    unbind_mw(id, mws_[id]);
    tables_.mr_at(id).key.store(0, std::memory_order_release);
    quotas_.release(Quotas::kMw, id);
    mws_.erase(id);
  }
  ids.clear();
  // Windows of other contexts bound to this context's MRs die with them.
  for (auto& [h, w] : mws_)
    if (w.bound_mr && mrs_.count(w.bound_mr) && mrs_[w.bound_mr].owner == owner) unbind_mw(h, w);
  for (auto& [h, m] : mrs_)
    if (m.owner == owner) ids.push_back(h);
  for (uint32_t id : ids) release_mr(id);
  ids.clear();
  for (auto& [h, cq] : cqs_)
    if (cq.owner == owner) ids.push_back(h);
  for (uint32_t id : ids) release_cq(id);
  std::erase_if(channels_, [&](auto& kv) {
    if (kv.second.owner != owner) return false;
    quotas_.release(Quotas::kChannel, kv.first);
    return true;
  });
  ids.clear();
  for (auto& [h, b] : backings_)
    if (b.owner == owner) ids.push_back(h);
  for (uint32_t id : ids) drop_backing(id);
  std::erase_if(pds_, [&](auto& kv) {
    if (kv.second.owner != owner) return false;
    quotas_.release(Quotas::kPd, kv.first);
    return true;
  });
}

void Registry::accounts(proto::AccountsReply& rep) const {
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

// ---- Memory windows (IBTA 10.6.7.2.4 ff.; ibv_alloc_mw(3), ibv_bind_mw(3)) --

int Registry::alloc_mw(uint32_t client, const proto::AllocMwReq& req, proto::KeyReply& rep) {
  auto pd = pds_.find(req.pd);
  if (pd == pds_.end() || pd->second.owner != ctx(client)) return EINVAL;
  if (req.type != IBV_MW_TYPE_1 && req.type != IBV_MW_TYPE_2) return EINVAL;
  if (int e = quotas_.admit(Quotas::kMw, client_uid(client))) return e;
  uint32_t slot = alloc_key_slot();
  if (!slot) return ENOMEM;
  if (int err = tables_.claim_mr(slot, ctx_uid(ctx(client)))) return err;
  uint32_t key = (slot << 8) | ++mr_key_byte_[slot];
  MrEntry& e = tables_.mr_at(slot);
  e.access = 0;
  e.pd = req.pd;
  e.backing = 0;
  e.iova = 0;
  e.length = 0;
  e.file_offset = 0;
  e.owner_pid = uint32_t(clients_[client].pid);
  e.kind = req.type == IBV_MW_TYPE_1 ? kKindMw1 : kKindMw2;
  e.bound_qpn = 0;
  // A type 1 window's key is valid (unbound, zero length) from the start; a
  // type 2 window is invalid until its first bind.
  if (req.type == IBV_MW_TYPE_1) e.key.store(key, std::memory_order_release);
  quotas_.charge(Quotas::kMw, slot, client_uid(client));
  mws_[slot] = Mw{ctx(client), req.pd, req.type, key, 0};
  pd->second.refs++;
  rep.handle = slot;
  rep.key = key;
  return 0;
}

void Registry::unbind_mw(uint32_t slot, Mw& mw) {
  MrEntry& e = tables_.mr_at(slot);
  if (mw.type == IBV_MW_TYPE_2) e.key.store(0, std::memory_order_release);  // invalid
  e.length = 0;
  e.access = 0;
  e.backing = 0;
  if (mw.bound_mr) {
    if (auto m = mrs_.find(mw.bound_mr); m != mrs_.end()) m->second.windows--;
  }
  mw.bound_mr = 0;
}

int Registry::dealloc_mw(uint32_t client, uint32_t handle) {
  auto it = mws_.find(handle);
  if (it == mws_.end() || it->second.owner != ctx(client)) return EINVAL;
  unbind_mw(handle, it->second);
  tables_.mr_at(handle).key.store(0, std::memory_order_release);
  if (auto p = pds_.find(it->second.pd); p != pds_.end()) p->second.refs--;
  quotas_.release(Quotas::kMw, handle);
  mws_.erase(it);
  return 0;
}

int Registry::bind_mw(uint32_t client, const proto::BindMwReq& r, proto::KeyReply& rep) {
  auto it = mws_.find(r.mw);
  if (it == mws_.end() || it->second.owner != ctx(client)) return EINVAL;
  Mw& mw = it->second;
  Qp* qp = find_qp(client, r.qpn);
  if (!qp) return EINVAL;
  if (ibv_qp_state(qp_slot(r.qpn).state.load()) != IBV_QPS_RTS) return EINVAL;
  constexpr uint32_t kWindowAccess = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                                     IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_ZERO_BASED;
  if (r.access & ~kWindowAccess) return EINVAL;
  uint32_t new_key;
  if (mw.type == IBV_MW_TYPE_2) {
    // IBTA 10.6.7.2.5: a type 2 window is bound through a QP of its PD, only
    // while invalid, with a key of the same index whose key byte changed.
    if (mw.bound_mr) return EINVAL;
    if (qp->pd != mw.pd) return EPERM;
    if ((r.new_key >> 8) != r.mw || r.new_key == mw.key) return EINVAL;
    if (r.length == 0) return EINVAL;
    new_key = r.new_key;
    mr_key_byte_[r.mw] = uint8_t(new_key);
  } else {
    new_key = (r.mw << 8) | ++mr_key_byte_[r.mw];
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
  const MrEntry* me = mr_entry(r.mr_key);
  auto mr = mrs_.find(r.mr_key >> 8);
  if (!me || mr == mrs_.end() || me->kind != kKindMr) return EINVAL;
  if (mr->second.pd != mw.pd) return EPERM;
  if (!(me->access & IBV_ACCESS_MW_BIND)) return EACCES;
  // A window may not grant writes or atomics its MR does not allow locally.
  if ((r.access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) && !(me->access & IBV_ACCESS_LOCAL_WRITE))
    return EACCES;
  if (r.addr < me->iova || r.addr - me->iova > me->length || me->length - (r.addr - me->iova) < r.length)
    return EINVAL;
  // Revoke the old binding first, then publish the new one.
  e.key.store(0, std::memory_order_release);
  unbind_mw(r.mw, mw);
  e.access = r.access & ~uint32_t(IBV_ACCESS_ZERO_BASED);
  e.backing = me->backing;
  e.iova = (r.access & IBV_ACCESS_ZERO_BASED) ? 0 : r.addr;
  e.length = r.length;
  e.file_offset = me->file_offset + (r.addr - me->iova);
  e.bound_qpn = mw.type == IBV_MW_TYPE_2 ? r.qpn : 0;
  mw.bound_mr = r.mr_key >> 8;
  mw.key = new_key;
  mr->second.windows++;
  e.key.store(new_key, std::memory_order_release);
  rep.handle = r.mw;
  rep.key = new_key;
  return 0;
}

int Registry::invalidate(uint32_t client, const proto::InvalidateReq& r) {
  Qp* qp = find_qp(client, r.qpn);
  if (!qp) return EINVAL;
  uint32_t slot = r.key >> 8;
  auto it = mws_.find(slot);
  // Only type 2 windows are invalidated by work requests (IBTA 10.6.7.2.6).
  if (it == mws_.end() || it->second.type != IBV_MW_TYPE_2 || it->second.key != r.key || !it->second.bound_mr)
    return EINVAL;
  if (r.remote) {
    uint32_t peer = qp_slot(r.qpn).dest_qpn.load();
    auto pq = qps_.find(peer);
    if (pq == qps_.end() || tables_.mr_at(slot).bound_qpn != peer) return EACCES;
  } else if (it->second.owner != ctx(client) || tables_.mr_at(slot).bound_qpn != r.qpn) {
    return EACCES;
  }
  unbind_mw(slot, it->second);
  return 0;
}

Counts Registry::counts() const {
  return {uint32_t(clients_.size()), uint32_t(pds_.size()),      uint32_t(mrs_.size()),
          uint32_t(cqs_.size()),     uint32_t(qps_.size()),      uint32_t(channels_.size()),
          uint32_t(backings_.size())};
}

// ---- SRQs (ibv_create_srq(3)) ---------------------------------------------

int Registry::create_srq(uint32_t client, const proto::CreateSrqReq& req, proto::CreateSrqReply& rep,
                         std::vector<int>& out_fds) {
  if (int e = quotas_.admit(Quotas::kSrq, client_uid(client))) return e;
  auto pd = pds_.find(req.pd);
  if (pd == pds_.end() || pd->second.owner != ctx(client)) return EINVAL;
  if (req.max_wr == 0 || req.max_wr > kMaxQpWr || req.max_sge == 0 || req.max_sge > kMaxSge) return EINVAL;
  if (req.reserved) return EINVAL;
  uint32_t xrcd = 0;
  if (req.srq_type == IBV_SRQT_XRC) {
    // An XRC SRQ belongs to an XRC domain and has its own CQ.
    xrcd = xrcd_of(client, req.xrcd);
    auto cq = cqs_.find(req.cq);
    if (!xrcd || cq == cqs_.end() || cq->second.owner != ctx(client)) return EINVAL;
  } else if (req.srq_type != IBV_SRQT_BASIC) {
    return req.srq_type == IBV_SRQT_TM ? EOPNOTSUPP : EINVAL;
  } else if (req.xrcd || req.cq) {
    return EINVAL;
  }
  SrqLayout layout{recv_ring_capacity(req.max_wr)};  // room beyond max_wr, as QPs
  // ibv_create_srq(3): the limit must be below the queue's size.
  if (req.srq_limit >= layout.capacity) return EINVAL;
  Srq srq{ctx(client), req.pd, Fd(), Mapping(), 0};
  srq.type = req.srq_type;
  srq.capacity = layout.capacity;
  if (xrcd) {
    srq.xrcd = xrcd;
    srq.cq = req.cq;
    xrcds_[xrcd].users++;
    cqs_[req.cq].refs++;
  }
  if (int e = make_memfd("softverbs-srq", layout.size(), srq.fd)) return e;
  if (int e = map_shared(srq.fd.get(), 0, layout.size(), PROT_READ | PROT_WRITE, false, srq.map)) return e;
  uint32_t handle = next_handle_++;
  auto* h = srq.map.as<SrqSegmentHeader>();
  h->magic = kSrqMagic;
  h->handle = handle;
  h->size = layout.size();
  h->ring_offset = layout.ring_offset();
  h->capacity = layout.capacity;
  h->max_sge = req.max_sge;
  h->limit.store(req.srq_limit, std::memory_order_relaxed);
  auto* rh = reinterpret_cast<RingHeader*>(srq.map.as<char>() + layout.ring_offset());
  Ring<RecvWqe>::init(rh, reinterpret_cast<RingSlot<RecvWqe>*>(rh + 1), layout.capacity);
  pd->second.refs++;
  rep.handle = handle;
  rep.capacity = layout.capacity;
  rep.segment_size = layout.size();
  out_fds.push_back(srq.fd.get());
  quotas_.charge(Quotas::kSrq, handle, client_uid(client));
  srqs_[handle] = std::move(srq);
  return 0;
}

int Registry::destroy_srq(uint32_t client, uint32_t handle) {
  auto it = srqs_.find(handle);
  if (it == srqs_.end() || it->second.owner != ctx(client)) return EINVAL;
  if (it->second.refs) return EBUSY;  // QPs still use it
  release_srq_refs(it->second);
  quotas_.release(Quotas::kSrq, handle);
  srqs_.erase(it);
  return 0;
}

void Registry::release_srq_refs(const Srq& srq) {
  if (auto p = pds_.find(srq.pd); p != pds_.end()) p->second.refs--;
  if (srq.cq)
    if (auto c = cqs_.find(srq.cq); c != cqs_.end()) c->second.refs--;
  if (srq.xrcd) xrcd_unuse(srq.xrcd);
}

// ---- XRC (IBTA A14) -----------------------------------------------------------

uint32_t Registry::xrcd_of(uint32_t client, uint32_t handle) {
  auto it = xrcd_handles_.find(handle);
  if (it == xrcd_handles_.end() || it->second.owner != ctx(client)) return 0;
  return it->second.xrcd;
}

void Registry::xrcd_drop_if_unused(uint32_t id) {
  auto it = xrcds_.find(id);
  if (it != xrcds_.end() && it->second.opens == 0 && it->second.users == 0) xrcds_.erase(it);
}

void Registry::xrcd_unuse(uint32_t id) {
  if (auto it = xrcds_.find(id); it != xrcds_.end() && it->second.users) it->second.users--;
  xrcd_drop_if_unused(id);
}

// ibv_open_xrcd(3), as the kernel does it: a file names a domain by its
// inode, shared by every opener; without O_CREAT the domain must exist, with
// O_EXCL it must not. No file (fd -1): a new private domain.
int Registry::open_xrcd(uint32_t client, const proto::OpenXrcdReq& req, Fd fd, uint32_t& handle) {
  if (req.has_fd > 1 || bool(req.has_fd) != fd.valid()) return EINVAL;
  if (int e = quotas_.admit(Quotas::kXrcd, client_uid(client))) return e;
  uint32_t id = 0;
  if (fd.valid()) {
    struct stat st;
    if (::fstat(fd.get(), &st) != 0) return EBADF;
    // Per user too: under the system daemon no object is shared between
    // users unless mediated, and a target QP would be (ibv_open_qp).
    uint32_t uid = clients_[client].uid;
    for (auto& [xid, x] : xrcds_)
      if (x.ino && x.dev == uint64_t(st.st_dev) && x.ino == uint64_t(st.st_ino) && x.uid == uid) id = xid;
    if (id && (req.oflags & O_EXCL)) return EINVAL;
    if (!id && !(req.oflags & O_CREAT)) return EINVAL;
    if (!id) {
      id = next_xrcd_++;
      xrcds_[id] = Xrcd{uint64_t(st.st_dev), uint64_t(st.st_ino), uid, 0, 0};
    }
  } else {
    id = next_xrcd_++;
    xrcds_[id] = Xrcd{};
  }
  xrcds_[id].opens++;
  handle = next_handle_++;
  quotas_.charge(Quotas::kXrcd, handle, client_uid(client));
  xrcd_handles_[handle] = XrcdHandle{ctx(client), id};
  return 0;
}

int Registry::close_xrcd(uint32_t client, uint32_t handle) {
  uint32_t id = xrcd_of(client, handle);
  if (!id) return EINVAL;
  Xrcd& x = xrcds_[id];
  // The last handle of a domain that SRQs or target QPs still use.
  if (x.opens == 1 && x.users) return EBUSY;
  x.opens--;
  quotas_.release(Quotas::kXrcd, handle);
  xrcd_handles_.erase(handle);
  xrcd_drop_if_unused(id);
  return 0;
}

// Whether one of the context's XRC_SEND QPs is connected to a target QP of
// the SRQ's domain, i.e. may deliver into that SRQ.
bool Registry::xrc_reaches_srq(uint32_t context, const Srq& srq) {
  if (srq.type != IBV_SRQT_XRC) return false;
  for (auto& [qpn, q] : qps_) {
    if (q.owner != context || q.type != IBV_QPT_XRC_SEND) continue;
    auto t = qps_.find(qp_slot(qpn).dest_qpn.load());
    if (t != qps_.end() && t->second.type == IBV_QPT_XRC_RECV && t->second.xrcd == srq.xrcd) return true;
  }
  return false;
}

// IBTA annex A14: an XRC message names the SRQ that takes it; the SRQ must be in
// the target QP's domain. EAGAIN: the target is not ready (the requester
// retries); ENOENT: no such SRQ there (an invalid request).
int Registry::connect_xrc(uint32_t client, const proto::ConnectXrcReq& req, proto::ConnectPeerReply& rep,
                          std::vector<int>& out_fds) {
  Qp* qp = find_qp(client, req.qpn);
  if (!qp || qp->type != IBV_QPT_XRC_SEND) return EINVAL;
  uint32_t dest = qp_slot(req.qpn).dest_qpn.load();
  auto tgt = qps_.find(dest);
  if (tgt == qps_.end()) return EAGAIN;
  const QpEntry& te = qp_slot(dest);
  auto st = ibv_qp_state(te.state.load());
  if (tgt->second.type != IBV_QPT_XRC_RECV || te.dest_qpn.load() != req.qpn) return EAGAIN;
  // XRC is not mediated between users; the requester reads the target's
  // entry in its own user's device segment.
  if (!same_user(client, tgt->second.owner) || !same_tables(client, tgt->second.owner)) return EACCES;
  if (st != IBV_QPS_RTR && st != IBV_QPS_RTS) return EAGAIN;
  auto srq = srqs_.find(req.srqn);
  if (srq == srqs_.end() || srq->second.type != IBV_SRQT_XRC || srq->second.xrcd != tgt->second.xrcd) return ENOENT;
  auto cq = cqs_.find(srq->second.cq);
  if (cq == cqs_.end()) return ENOENT;
  rep.peer_qpn = dest;
  rep.peer_recv_cq = srq->second.cq;
  rep.qp_segment_size = tgt->second.map.size();
  rep.cq_segment_size = cq->second.map.size();
  out_fds.push_back(tgt->second.fd.get());
  out_fds.push_back(cq->second.fd.get());
  out_fds.push_back(srq->second.fd.get());
  rep.has_srq = 1;
  rep.srq_segment_size = srq->second.map.size();
  rep.srq_handle = req.srqn;
  rep.pd = srq->second.pd;
  rep.has_channel = 0;
  if (auto ch = channels_.find(cq->second.channel); ch != channels_.end()) {
    out_fds.push_back(ch->second.eventfd.get());
    rep.has_channel = 1;
  }
  return 0;
}

// ibv_open_qp(3): another handle of an XRC target QP, for a context that
// opened the QP's domain.
int Registry::open_qp(uint32_t client, const proto::OpenQpReq& req, proto::ImportQpReply& rep,
                      std::vector<int>& out_fds) {
  uint32_t xrcd = xrcd_of(client, req.xrcd);
  auto it = qps_.find(req.qpn);
  if (!xrcd || it == qps_.end() || it->second.type != IBV_QPT_XRC_RECV || it->second.xrcd != xrcd) return EINVAL;
  Qp& q = it->second;
  q.holders.push_back(ctx(client));  // one entry per handle: each is destroyed on its own
  rep.qp_type = q.type;
  rep.segment_size = q.map.size();
  out_fds.push_back(q.fd.get());
  return 0;
}

// IBTA 11.5.2.4: the SRQ limit event goes to the SRQ's holders. A sender
// that saw the queue fall below the armed limit (and disarmed it: the event
// is one-shot per arm, IBTA 10.2.9.4) asks for it. Only a sender that can
// see the SRQ may: one mapping it (a process of its owner's user) whose QP
// is connected to a QP of that SRQ both ways - pointing a QP at another's
// QP is no connection. Between users the daemon itself takes the receives
// (mediate.cc) and raises the event there. Repeats of a pending event are
// coalesced by the server.
int Registry::srq_limit(uint32_t client, uint32_t handle) {
  auto it = srqs_.find(handle);
  if (it == srqs_.end()) return EINVAL;
  bool allowed = it->second.owner == ctx(client) || xrc_reaches_srq(ctx(client), it->second);
  for (auto& [qpn, q] : qps_) {
    if (allowed || !same_user(client, it->second.owner)) break;
    if (q.owner != ctx(client)) continue;
    const uint32_t dest = qp_slot(qpn).dest_qpn.load();
    auto peer = qps_.find(dest);
    if (peer != qps_.end() && peer->second.srq == handle && qp_slot(dest).dest_qpn.load() == qpn) allowed = true;
  }
  if (!allowed) return EACCES;
  for (auto& [id, c] : clients_)
    if (c.ctx == it->second.owner) events_.push_back({id, IBV_EVENT_SRQ_LIMIT_REACHED, handle});
  return 0;
}

int Registry::reg_async(uint32_t client, Fd eventfd) {
  auto c = clients_.find(client);
  if (c == clients_.end() || !eventfd.valid()) return EINVAL;
  c->second.async_fd = eventfd.get();
  async_fds_[client] = std::move(eventfd);
  return 0;
}

// The peers of QPs that just died (their last holder exited): connected
// QPs go to ERR at once, their posted receives complete with flush errors,
// and every process holding them gets IBV_EVENT_QP_FATAL. (On a wire the
// peers would find out by their retries running out; on one host the
// daemon knows.) Their send queues are flushed by their holders, which see
// the ERR state on their next post or retry.
// A process killed while its QP was delivering a message (pop_peer_recv in
// the library) leaves the responder's receive taken but not completed.
// Complete it now, before fail_peers_of flushes the rest of that queue, so
// the responder sees every receive once and in order: flushed, as a receive
// whose message never fully arrived is (IBTA 10.3.1, the QP goes to ERR).
void Registry::complete_torn_receive(uint32_t dead_qpn) {
  auto dq = qps_.find(dead_qpn);
  if (dq == qps_.end()) return;
  auto* dh = dq->second.map.as<QpSegmentHeader>();
  uint32_t qpn = dh->torn_qpn.exchange(0, std::memory_order_acquire);
  if (qpn == 0) return;
  auto q = qps_.find(qpn);
  if (q == qps_.end()) return;
  // Only a QP this one could have delivered to (a client can write anything here).
  if (q->second.type != dq->second.type) return;
  if (q->second.type != IBV_QPT_UD && qp_slot(dead_qpn).dest_qpn.load() != qpn) return;
  ibv_wc wc{};
  wc.wr_id = dh->torn_wr_id;
  // A UD responder stays usable: its receive was aborted, not flushed.
  wc.status = q->second.type == IBV_QPT_UD ? IBV_WC_REM_ABORT_ERR : IBV_WC_WR_FLUSH_ERR;
  wc.opcode = IBV_WC_RECV;
  wc.qp_num = qpn;
  wc.src_qp = dead_qpn;
  push_cq(q->second.recv_cq, wc, true);
}

// The daemon's own completions (flushes, torn receives, mediated
// operations). While a resize is moving the CQ (its ring closed) they go to
// the segment it moves to, so none is lost.
void Registry::push_cq(uint32_t handle, const ibv_wc& wc, bool solicited) {
  auto cq = cqs_.find(handle);
  if (cq == cqs_.end()) return;
  int channel_fd = -1;
  if (auto chn = channels_.find(cq->second.channel); chn != channels_.end()) channel_fd = chn->second.eventfd.get();
  const std::pair<Mapping*, uint32_t> segments[] = {{&cq->second.map, cq->second.capacity},
                                                     {&cq->second.next_map, cq->second.next_capacity}};
  for (auto [m, capacity] : segments) {
    if (!m->get()) continue;
    auto* ch = m->as<CqSegmentHeader>();
    auto* crh = reinterpret_cast<RingHeader*>(m->as<char>() + CqLayout{capacity}.ring_offset());
    Ring<Cqe> ring(crh, reinterpret_cast<RingSlot<Cqe>*>(crh + 1), capacity);
    if (push_completion(ch, ring, wc, solicited, channel_fd) || !ring.closed()) return;
  }
}

void Registry::fail_peers_of(const std::vector<uint32_t>& dead) {
  if (dead.empty()) return;
  for (auto& [qpn, q] : qps_) {
    QpEntry& e = qp_slot(qpn);
    uint32_t dest = e.dest_qpn.load();
    if (q.type == IBV_QPT_UD || std::find(dead.begin(), dead.end(), dest) == dead.end()) continue;
    auto st = ibv_qp_state(e.state.load());
    if (st == IBV_QPS_RESET || st == IBV_QPS_INIT || st == IBV_QPS_ERR) continue;
    SV_TRACE("daemon: QP 0x%x to ERR: its peer QP 0x%x is gone", qpn, dest);
    e.state.store(IBV_QPS_ERR, std::memory_order_release);
    if (cqs_.count(q.recv_cq)) flush_rq(q, qpn);
    for (auto& [id, c] : clients_)
      if (c.ctx == q.owner) events_.push_back({id, IBV_EVENT_QP_FATAL, qpn});
  }
}

// ---- PD ------------------------------------------------------------------

int Registry::alloc_pd(uint32_t client, uint32_t& pd) {
  if (int e = quotas_.admit(Quotas::kPd, client_uid(client))) return e;
  pd = next_handle_++;
  quotas_.charge(Quotas::kPd, pd, client_uid(client));
  pds_[pd] = Pd{ctx(client), 0};
  return 0;
}

int Registry::dealloc_pd(uint32_t client, uint32_t pd) {
  auto it = pds_.find(pd);
  if (it == pds_.end() || it->second.owner != ctx(client)) return EINVAL;
  if (it->second.refs) return EBUSY;  // ibv_dealloc_pd(3): still in use
  quotas_.release(Quotas::kPd, pd);
  pds_.erase(it);
  return 0;
}

// ---- Memory --------------------------------------------------------------

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
  backings_[id] = Backing{ctx(client), std::move(fd), 0, {}, 0};
  return 0;
}

int Registry::reg_mr(uint32_t client, const proto::RegMrReq& req, proto::RegMrReply& rep) {
  auto pd = pds_.find(req.pd);
  if (pd == pds_.end() || pd->second.owner != ctx(client)) return EINVAL;
  auto b = backings_.find(req.backing);
  if (b == backings_.end() || b->second.owner != ctx(client)) return EINVAL;
  if (req.access & ~kKnownAccess) return EINVAL;
  // ibv_reg_mr(3): remote write or remote atomic access needs local write.
  if ((req.access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) &&
      !(req.access & IBV_ACCESS_LOCAL_WRITE))
    return EINVAL;
  if (req.length == 0 || req.length > kMaxMrSize) return EINVAL;
  if (req.addr + req.length < req.addr || req.addr + req.length > (1ull << 57)) return EINVAL;
  if (req.iova + req.length < req.iova) return EINVAL;
  if (!b->second.region.empty() && req.addr + req.length > b->second.limit) return EINVAL;
  // The file must hold the whole range now; sealed, it cannot shrink later
  // (reg_backing), so no holder of a mapping of it meets SIGBUS.
  struct stat st {};
  if (::fstat(b->second.fd.get(), &st) != 0 || uint64_t(st.st_size) < req.addr + req.length) return EINVAL;
  if (int e = quotas_.admit(Quotas::kMr, client_uid(client))) return e;

  uint32_t slot = alloc_key_slot();
  if (!slot) return ENOMEM;
  // The entry goes to the registrant's user's device segment.
  if (int err = tables_.claim_mr(slot, ctx_uid(ctx(client)))) return err;
  // Charge the pages the registration covers to the registrant (IBTA leaves
  // the resource manager to the OS; we follow the kernel's RLIMIT_MEMLOCK rule).
  pid_t pid = clients_[client].pid;
  uint64_t bytes = page_up(req.addr + req.length) - page_down(req.addr);
  Account& acct = accounts_[pid];
  acct.uid = clients_[client].uid;
  acct.limit_bytes = memlock_limit(pid, clients_[client].pidfd.get(), clients_[client].at_connect);
  if (acct.limit_bytes != UINT64_MAX && acct.locked_bytes + bytes > acct.limit_bytes) {
    SV_TRACE("daemon: pid %d: RLIMIT_MEMLOCK %llu, locked %llu, asks %llu: ENOMEM", int(pid),
             (unsigned long long)acct.limit_bytes, (unsigned long long)acct.locked_bytes, (unsigned long long)bytes);
    if (acct.locked_bytes == 0) accounts_.erase(pid);
    return ENOMEM;
  }
  acct.locked_bytes += bytes;

  uint8_t kb = ++mr_key_byte_[slot];
  uint32_t key = (slot << 8) | kb;
  if (key == 0) key = (slot << 8) | ++mr_key_byte_[slot];

  MrEntry& e = tables_.mr_at(slot);
  e.access = req.access;
  e.pd = req.pd;
  e.backing = req.backing;
  e.iova = req.iova;
  e.length = req.length;
  e.file_offset = req.addr;
  e.owner_pid = uint32_t(clients_[client].pid);
  e.kind = kKindMr;
  e.bound_qpn = 0;
  e.key.store(key, std::memory_order_release);  // publish last

  quotas_.charge(Quotas::kMr, slot, client_uid(client));
  mrs_[slot] = Mr{ctx(client), key, req.pd, req.backing, pid, bytes};
  pd->second.refs++;
  b->second.refs++;
  rep.handle = slot;
  rep.key = key;
  return 0;
}

// A free MR-table slot, round robin so that a freed key is not reused at once.
uint32_t Registry::alloc_key_slot() {
  for (uint32_t n = 0; n < kMrTableSize - 1; ++n) {
    uint32_t s = next_mr_slot_;
    next_mr_slot_ = next_mr_slot_ + 1 >= kMrTableSize ? 1 : next_mr_slot_ + 1;
    if (tables_.mr_at(s).key.load(std::memory_order_relaxed) == 0 && !mrs_.count(s) && !mws_.count(s)) return s;
  }
  return 0;
}

void Registry::release_mr(uint32_t handle) {
  auto it = mrs_.find(handle);
  if (it == mrs_.end()) return;
  tables_.mr_at(handle).key.store(0, std::memory_order_release);  // revoke first
  if (auto a = accounts_.find(it->second.charged_pid); a != accounts_.end()) {
    a->second.locked_bytes -= it->second.charged_bytes;
    if (a->second.locked_bytes == 0) accounts_.erase(a);
  }
  if (auto p = pds_.find(it->second.pd); p != pds_.end()) p->second.refs--;
  uint32_t backing = it->second.backing;
  quotas_.release(Quotas::kMr, handle);
  mrs_.erase(it);
  if (auto b = backings_.find(backing); b != backings_.end()) {
    // A region is freed with its last registration (seed 000).
    if (--b->second.refs == 0 && !b->second.region.empty()) drop_backing(backing);
  }
}

void Registry::drop_backing(uint32_t id) {
  auto b = backings_.find(id);
  if (b == backings_.end()) return;
  if (!b->second.region.empty()) {
    auto r = regions_.find(RegionKey{b->second.region_uid, b->second.region});
    if (r != regions_.end() && --r->second.backings == 0) regions_.erase(r);
  }
  quotas_.release(Quotas::kBacking, id);
  backings_.erase(b);
}

// Seed 000: register memory under a byte-array id. The first caller creates
// the region, later callers attach, in any order; no caller is the master.
// An id names a region of the caller's user only: the same id asked by
// another user is another region (no attach across users, no squatting).
int Registry::reg_shmid(uint32_t client, const proto::RegShmidReq& req, proto::RegShmidReply& rep,
                        std::vector<int>& out_fds) {
  auto pd = pds_.find(req.pd);
  if (pd == pds_.end() || pd->second.owner != ctx(client)) return EINVAL;
  if (req.id_len == 0 || req.id_len > proto::kMaxShmidLen) return EINVAL;
  auto owner = contexts_.find(ctx(client));
  if (owner == contexts_.end()) return EINVAL;
  uid_t uid = owner->second.uid;  // the context's user: its memory is that user's
  if (int e = quotas_.admit(Quotas::kBacking, client_uid(client))) return e;  // a region comes with a backing
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
  uint32_t handle = next_handle_++;
  backings_[handle] = Backing{ctx(client), std::move(dup), 0, id, r->second.length, uid};
  quotas_.charge(Quotas::kBacking, handle, client_uid(client));
  r->second.backings++;
  rep.backing = handle;
  rep.length = r->second.length;
  out_fds.push_back(r->second.fd.get());
  return 0;
}

// Seed 000's reg_shared: a new registration of an existing MR's pages.
int Registry::reg_shared(uint32_t client, const proto::RegSharedReq& req, proto::RegMrReply& rep) {
  const MrEntry* e = mr_entry(req.key);
  auto mr = mrs_.find(req.key >> 8);
  if (!e || mr == mrs_.end() || e->kind != kKindMr || mr->second.owner != ctx(client)) return EINVAL;
  proto::RegMrReq r{};
  r.pd = req.pd;
  r.backing = mr->second.backing;
  r.addr = e->file_offset;
  r.length = e->length;
  r.iova = req.iova;
  r.access = req.access;
  return reg_mr(client, r, rep);
}

int Registry::dereg_mr(uint32_t client, uint32_t handle) {
  auto it = mrs_.find(handle);
  if (it == mrs_.end() || it->second.owner != ctx(client)) return EINVAL;
  if (it->second.windows) return EBUSY;  // memory windows are still bound to it
  release_mr(handle);
  return 0;
}

// ---- Channels and CQs ----------------------------------------------------

int Registry::create_channel(uint32_t client, Fd eventfd, uint32_t& handle) {
  if (!eventfd.valid()) return EINVAL;
  if (int e = quotas_.admit(Quotas::kChannel, client_uid(client))) return e;
  handle = next_handle_++;
  quotas_.charge(Quotas::kChannel, handle, client_uid(client));
  channels_[handle] = Channel{ctx(client), std::move(eventfd), 0};
  return 0;
}

int Registry::destroy_channel(uint32_t client, uint32_t handle) {
  auto it = channels_.find(handle);
  if (it == channels_.end() || it->second.owner != ctx(client)) return EINVAL;
  if (it->second.refs) return EBUSY;  // ibv_destroy_comp_channel(3): CQs still attached
  quotas_.release(Quotas::kChannel, handle);
  channels_.erase(it);
  return 0;
}

int Registry::create_cq(uint32_t client, const proto::CreateCqReq& req, proto::CreateCqReply& rep,
                        std::vector<int>& out_fds) {
  if (req.cqe == 0 || req.cqe > kMaxCqe) return EINVAL;
  if (int e = quotas_.admit(Quotas::kCq, client_uid(client))) return e;
  if (req.channel) {
    auto ch = channels_.find(req.channel);
    if (ch == channels_.end() || ch->second.owner != ctx(client)) return EINVAL;
  }
  Cq cq{ctx(client), req.channel, Fd(), Mapping(), 0, Fd(), Mapping(), false};
  uint32_t handle = next_handle_;
  if (int e = make_cq_segment(handle, req.cqe, req.channel, cq.fd, cq.map, cq.capacity)) return e;
  next_handle_++;
  if (req.channel) channels_[req.channel].refs++;
  rep.handle = handle;
  rep.capacity = cq.capacity;
  rep.segment_size = cq.map.size();
  out_fds.push_back(cq.fd.get());
  quotas_.charge(Quotas::kCq, handle, client_uid(client));
  cqs_[handle] = std::move(cq);
  return 0;
}

int Registry::make_cq_segment(uint32_t handle, uint32_t cqe, uint32_t channel, Fd& fd, Mapping& map,
                              uint32_t& capacity) {
  CqLayout layout{round_up_pow2(cqe + 1)};
  capacity = layout.capacity;
  if (int e = make_memfd("softverbs-cq", layout.size(), fd)) return e == EINVAL ? ENOMEM : e;
  if (int e = map_shared(fd.get(), 0, layout.size(), PROT_READ | PROT_WRITE, false, map)) return e;
  auto* h = map.as<CqSegmentHeader>();
  h->magic = kCqMagic;
  h->handle = handle;
  h->size = layout.size();
  h->ring_offset = layout.ring_offset();
  h->capacity = layout.capacity;
  h->channel = channel;
  auto* rh = reinterpret_cast<RingHeader*>(map.as<char>() + layout.ring_offset());
  Ring<Cqe>::init(rh, reinterpret_cast<RingSlot<Cqe>*>(rh + 1), layout.capacity);
  return 0;
}

// ibv_resize_cq moves a CQ to a new segment. The daemon makes the segment;
// the resizing process closes the old ring to producers, moves the waiting
// completions over in order and commits. Producers that meet the closed
// ring wait for `moved` and fetch the new segment with GetCq.
int Registry::resize_cq(uint32_t client, const proto::ResizeCqReq& req, proto::CreateCqReply& rep,
                        std::vector<int>& out_fds) {
  auto it = cqs_.find(req.handle);
  if (it == cqs_.end() || it->second.owner != ctx(client)) return EINVAL;
  if (req.cqe == 0 || req.cqe > kMaxCqe - 1) return EINVAL;
  Cq& cq = it->second;
  if (cq.next_fd.valid()) return EBUSY;  // another holder is resizing it
  if (int e = make_cq_segment(req.handle, req.cqe, cq.channel, cq.next_fd, cq.next_map, cq.next_capacity)) {
    cq.next_fd = Fd();
    cq.next_map = Mapping();
    return e;
  }
  rep.handle = req.handle;
  rep.capacity = cq.next_capacity;
  rep.segment_size = cq.next_map.size();
  out_fds.push_back(cq.next_fd.get());
  return 0;
}

int Registry::resize_cq_done(uint32_t client, const proto::ResizeCqDoneReq& req) {
  auto it = cqs_.find(req.handle);
  if (it == cqs_.end() || it->second.owner != ctx(client)) return EINVAL;
  if (req.commit > 1) return EINVAL;
  Cq& cq = it->second;
  if (!cq.next_fd.valid()) return EINVAL;
  if (req.commit) {
    Mapping old = std::move(cq.map);
    cq.fd = std::move(cq.next_fd);
    cq.map = std::move(cq.next_map);
    cq.capacity = cq.next_capacity;
    // Producers and pollers follow now (GetCq answers with the new segment).
    old.as<CqSegmentHeader>()->moved.store(1, std::memory_order_release);
  }
  cq.next_fd = Fd();
  cq.next_map = Mapping();
  return 0;
}

bool Registry::may_complete_into(uint32_t client, uint32_t handle) {
  auto it = cqs_.find(handle);
  if (it == cqs_.end()) return false;
  uint32_t c = ctx(client);
  if (it->second.owner == c) return true;
  if (!same_user(client, it->second.owner)) return false;  // another user's peers are mediated
  // A requester pushes receive completions into the CQ of the QP it reaches:
  // its connected peer, or (UD) any UD QP.
  bool has_ud = false;
  for (auto& [qpn, q] : qps_) {
    if (q.owner != c) continue;
    has_ud |= q.type == IBV_QPT_UD;
    auto peer = qps_.find(qp_slot(qpn).dest_qpn.load());
    if (peer != qps_.end() && peer->second.recv_cq == handle) return true;
  }
  if (has_ud)
    for (auto& [qpn, q] : qps_)
      if (q.type == IBV_QPT_UD && q.recv_cq == handle) return true;
  for (auto& [h, srq] : srqs_)
    if (srq.cq == handle && xrc_reaches_srq(c, srq)) return true;
  return false;
}

int Registry::get_cq(uint32_t client, uint32_t handle, proto::ImportCqReply& rep, std::vector<int>& out_fds) {
  if (!may_complete_into(client, handle)) return EINVAL;
  Cq& cq = cqs_.at(handle);
  rep.capacity = cq.capacity;
  rep.segment_size = cq.map.size();
  out_fds.push_back(cq.fd.get());
  return 0;
}

// IBTA 11.4.2.1 and 10.10.2.3: a CQ overrun is a CQ error. The CQ's holders
// get IBV_EVENT_CQ_ERR and every QP completing into it goes to ERR.
int Registry::cq_error(uint32_t client, uint32_t handle) {
  if (!may_complete_into(client, handle)) return EINVAL;
  Cq& cq = cqs_.at(handle);
  if (cq.failed) return 0;
  cq.failed = true;
  for (auto& [id, c] : clients_)
    if (c.ctx == cq.owner) events_.push_back({id, IBV_EVENT_CQ_ERR, handle});
  for (auto& [qpn, q] : qps_) {
    if (q.send_cq != handle && q.recv_cq != handle) continue;
    QpEntry& e = qp_slot(qpn);
    if (ibv_qp_state(e.state.load()) == IBV_QPS_RESET) continue;
    e.state.store(IBV_QPS_ERR, std::memory_order_release);
  }
  return 0;
}

void Registry::release_cq(uint32_t handle) {
  auto it = cqs_.find(handle);
  if (it == cqs_.end()) return;
  if (it->second.channel) {
    if (auto ch = channels_.find(it->second.channel); ch != channels_.end()) ch->second.refs--;
  }
  quotas_.release(Quotas::kCq, handle);
  cqs_.erase(it);
}

int Registry::destroy_cq(uint32_t client, uint32_t handle) {
  auto it = cqs_.find(handle);
  if (it == cqs_.end() || it->second.owner != ctx(client)) return EINVAL;
  if (it->second.refs) return EBUSY;  // ibv_destroy_cq(3): QPs still attached
  release_cq(handle);
  return 0;
}

// ---- QPs -----------------------------------------------------------------

QpEntry& Registry::qp_slot(uint32_t qpn) const { return const_cast<DeviceTables&>(tables_).qp_at(qpn); }

const QpEntry* Registry::qp_entry(uint32_t qpn) const {
  const QpEntry& e = qp_slot(qpn);
  return e.qpn.load() == qpn ? &e : nullptr;
}

const MrEntry* Registry::mr_entry(uint32_t key) const {
  uint32_t slot = key >> 8;
  if (slot == 0 || slot >= kMrTableSize) return nullptr;
  const MrEntry& e = tables_.mr_at(slot);
  return e.key.load() == key ? &e : nullptr;
}

Registry::Qp* Registry::find_qp(uint32_t client, uint32_t qpn) {
  auto it = qps_.find(qpn);
  if (it == qps_.end()) return nullptr;
  uint32_t c = ctx(client);
  const auto& h = it->second.holders;
  if (it->second.owner != c && std::find(h.begin(), h.end(), c) == h.end()) return nullptr;
  return &it->second;
}

int Registry::create_qp(uint32_t client, const proto::CreateQpReq& req, proto::CreateQpReply& rep,
                        std::vector<int>& out_fds) {
  // An XRC target QP has no PD, CQs or queues: it belongs to its XRC
  // domain, and receives go to the XRC SRQ each message names.
  const bool tgt = req.qp_type == IBV_QPT_XRC_RECV;
  if (int e = quotas_.admit(Quotas::kQp, client_uid(client))) return e;
  uint32_t xrcd = 0;
  if (tgt) {
    xrcd = xrcd_of(client, req.xrcd);
    if (!xrcd || req.pd || req.send_cq || req.recv_cq || req.srq) return EINVAL;
  } else if (req.xrcd) {
    return EINVAL;
  }
  auto pd = pds_.find(req.pd);
  auto scq = cqs_.find(req.send_cq);
  auto rcq = cqs_.find(req.recv_cq);
  if (!tgt) {
    if (pd == pds_.end() || pd->second.owner != ctx(client)) return EINVAL;
    if (scq == cqs_.end() || scq->second.owner != ctx(client)) return EINVAL;
    if (rcq == cqs_.end() || rcq->second.owner != ctx(client)) return EINVAL;
  }
  auto srq = srqs_.end();
  if (req.srq) {
    srq = srqs_.find(req.srq);
    if (srq == srqs_.end() || srq->second.owner != ctx(client) || req.qp_type == IBV_QPT_UD ||
        req.qp_type == IBV_QPT_XRC_SEND || srq->second.type != IBV_SRQT_BASIC)
      return EINVAL;
  }
  if (req.qp_type != IBV_QPT_RC && req.qp_type != IBV_QPT_UC && req.qp_type != IBV_QPT_UD &&
      req.qp_type != IBV_QPT_XRC_SEND && !tgt)
    return EOPNOTSUPP;  // raw packet: not on this device
  if (req.max_send_wr > kMaxQpWr || req.max_recv_wr > kMaxQpWr) return EINVAL;
  if (req.max_send_sge > kMaxSge || req.max_recv_sge > kMaxSge) return EINVAL;
  if (req.max_inline_data > kMaxInline) return EINVAL;

  uint32_t slot = 0;
  for (uint32_t n = 0; n < kQpTableSize; ++n) {
    uint32_t s = next_qp_slot_;
    next_qp_slot_ = next_qp_slot_ + 1 >= kQpTableSize ? 2 : next_qp_slot_ + 1;
    if (tables_.qp_at(s).qpn.load(std::memory_order_relaxed) == 0) {
      slot = s;
      break;
    }
  }
  if (!slot) return ENOMEM;
  if (int err = tables_.claim_qp(slot, ctx_uid(ctx(client)))) return err;
  uint32_t qpn = ((uint32_t(++qp_gen_[slot]) << 16) | slot) & 0xffffff;

  // At least two slots: a one-slot ring (Vyukov's sequence scheme) takes a
  // second element over the first and then spins in pop().
  QpLayout layout{round_up_pow2(std::max(req.max_send_wr, 2u)), recv_ring_capacity(req.max_recv_wr)};
  Qp qp{ctx(client), req.pd, req.send_cq, req.recv_cq, ibv_qp_type(req.qp_type), Fd(), Mapping(), slot};
  if (int e = make_memfd("softverbs-qp", layout.size(), qp.fd)) return e;
  if (int e = map_shared(qp.fd.get(), 0, layout.size(), PROT_READ | PROT_WRITE, false, qp.map))
    return e;
  auto* h = qp.map.as<QpSegmentHeader>();
  h->magic = kQpMagic;
  h->qpn = qpn;
  h->size = layout.size();
  h->sq_offset = layout.sq_offset();
  h->rq_offset = layout.rq_offset();
  h->sq_capacity = layout.sq_capacity;
  h->rq_capacity = layout.rq_capacity;
  auto* sqh = reinterpret_cast<RingHeader*>(qp.map.as<char>() + layout.sq_offset());
  Ring<SendWqe>::init(sqh, reinterpret_cast<RingSlot<SendWqe>*>(sqh + 1), layout.sq_capacity);
  auto* rqh = reinterpret_cast<RingHeader*>(qp.map.as<char>() + layout.rq_offset());
  Ring<RecvWqe>::init(rqh, reinterpret_cast<RingSlot<RecvWqe>*>(rqh + 1), layout.rq_capacity);

  QpEntry& e = tables_.qp_at(slot);
  e.state.store(IBV_QPS_RESET, std::memory_order_relaxed);
  e.qp_type = req.qp_type;
  e.pd = req.pd;
  e.dest_qpn.store(0, std::memory_order_relaxed);
  e.access.store(0, std::memory_order_relaxed);
  e.send_cq = req.send_cq;
  e.recv_cq = req.recv_cq;
  e.min_rnr_timer = 0;
  e.timeout = 0;
  e.retry_cnt = 0;
  e.rnr_retry = 0;
  e.owner_pid = uint32_t(clients_[client].pid);
  e.qkey.store(0, std::memory_order_relaxed);
  e.qpn.store(qpn, std::memory_order_release);

  if (tgt) {
    qp.xrcd = xrcd;
    qp.holders.push_back(ctx(client));
    xrcds_[xrcd].users++;
  } else {
    pd->second.refs++;
    scq->second.refs++;
    rcq->second.refs++;
  }
  qp.sq_capacity = layout.sq_capacity;
  qp.rq_capacity = layout.rq_capacity;
  if (srq != srqs_.end()) {
    qp.srq = req.srq;
    srq->second.refs++;
  }
  qp.sq_sig_all = req.sq_sig_all;
  rep.qpn = qpn;
  rep.sq_capacity = layout.sq_capacity;
  rep.rq_capacity = layout.rq_capacity;
  rep.segment_size = layout.size();
  out_fds.push_back(qp.fd.get());
  quotas_.charge(Quotas::kQp, qpn, client_uid(client));
  qps_[qpn] = std::move(qp);
  return 0;
}

int Registry::modify_qp(uint32_t client, const proto::ModifyQpReq& r) {
  Qp* qp = find_qp(client, r.qpn);
  if (!qp) return EINVAL;
  QpEntry& e = qp_slot(r.qpn);
  auto cur = ibv_qp_state(e.state.load());
  uint32_t mask = r.attr_mask;
  if (mask & IBV_QP_CUR_STATE) {
    // IBTA 11.2.4.2: the current state, if given, must be the QP's state.
    if (r.cur_qp_state != cur) return EINVAL;
  }
  auto next = (mask & IBV_QP_STATE) ? ibv_qp_state(r.qp_state) : cur;
  if (int(next) < IBV_QPS_RESET || int(next) > IBV_QPS_ERR) return EINVAL;
  if (int err = check_qp_transition(qp->type, cur, next, mask)) return err;

  // Attribute ranges (ibv_modify_qp(3), IBTA 11.2.4.2).
  if ((mask & IBV_QP_PORT) && r.port_num != 1) return EINVAL;
  if ((mask & IBV_QP_PKEY_INDEX) && r.pkey_index != 0) return EINVAL;
  // Local write (and MW bind) in qp_access_flags are accepted and mean
  // nothing for a QP, as with rdma-core's kernel drivers; unknown bits are refused.
  if ((mask & IBV_QP_ACCESS_FLAGS) && (r.qp_access_flags & ~kKnownAccess)) return EINVAL;
  if ((mask & IBV_QP_PATH_MTU) && (r.path_mtu < IBV_MTU_256 || r.path_mtu > IBV_MTU_4096)) return EINVAL;
  if ((mask & IBV_QP_DEST_QPN) && r.dest_qp_num > 0xffffff) return EINVAL;
  if ((mask & IBV_QP_RQ_PSN) && r.rq_psn > 0xffffff) return EINVAL;
  if ((mask & IBV_QP_SQ_PSN) && r.sq_psn > 0xffffff) return EINVAL;
  if ((mask & IBV_QP_MIN_RNR_TIMER) && r.min_rnr_timer > 31) return EINVAL;
  if ((mask & IBV_QP_TIMEOUT) && r.timeout > 31) return EINVAL;
  if ((mask & IBV_QP_RETRY_CNT) && r.retry_cnt > 7) return EINVAL;
  if ((mask & IBV_QP_RNR_RETRY) && r.rnr_retry > 7) return EINVAL;
  if ((mask & IBV_QP_MAX_QP_RD_ATOMIC) && r.max_rd_atomic > kMaxRdAtomic) return EINVAL;
  if ((mask & IBV_QP_MAX_DEST_RD_ATOMIC) && r.max_dest_rd_atomic > kMaxRdAtomic) return EINVAL;
  if (mask & IBV_QP_AV) {
    if (r.ah_port_num != 1 && r.ah_port_num != 0) return EINVAL;
  }

  if (mask & IBV_QP_ACCESS_FLAGS) e.access.store(r.qp_access_flags & kQpAccess, std::memory_order_relaxed);
  if (mask & IBV_QP_DEST_QPN) e.dest_qpn.store(r.dest_qp_num, std::memory_order_relaxed);
  if (mask & IBV_QP_MIN_RNR_TIMER) e.min_rnr_timer = r.min_rnr_timer;
  if (mask & IBV_QP_TIMEOUT) e.timeout = r.timeout;
  if (mask & IBV_QP_RETRY_CNT) e.retry_cnt = r.retry_cnt;
  if (mask & IBV_QP_RNR_RETRY) e.rnr_retry = r.rnr_retry;
  if (mask & IBV_QP_QKEY) e.qkey.store(r.qkey, std::memory_order_relaxed);
  if (next == IBV_QPS_RESET) {
    e.dest_qpn.store(0, std::memory_order_relaxed);
    e.access.store(0, std::memory_order_relaxed);
  }
  e.state.store(next, std::memory_order_release);
  return 0;
}

void Registry::release_qp(uint32_t qpn) {
  auto it = qps_.find(qpn);
  if (it == qps_.end()) return;
  QpEntry& e = qp_slot(qpn);
  e.state.store(IBV_QPS_ERR, std::memory_order_release);
  e.qpn.store(0, std::memory_order_release);
  if (auto p = pds_.find(it->second.pd); p != pds_.end()) p->second.refs--;
  if (auto q = srqs_.find(it->second.srq); q != srqs_.end()) q->second.refs--;
  if (auto c = cqs_.find(it->second.send_cq); c != cqs_.end()) c->second.refs--;
  if (auto c = cqs_.find(it->second.recv_cq); c != cqs_.end()) c->second.refs--;
  uint32_t xrcd = it->second.xrcd;
  quotas_.release(Quotas::kQp, qpn);
  qps_.erase(it);
  if (xrcd) xrcd_unuse(xrcd);
  // A destroyed QP leaves its multicast groups (as the kernel detaches them).
  tables_.mcg_remove_qp(qpn);
}

// ---- Multicast (UD) ---------------------------------------------------------

// Attach QP to multicast group (IBTA verbs chapter 11; ibv_attach_mcast(3)): UD QPs only, and the
// GID must be a multicast GID (first byte 0xFF). The link layer is Ethernet,
// so the LID is not checked, as the kernel does for RoCE.
int Registry::attach_mcast(uint32_t client, const proto::McastReq& req) {
  Qp* qp = find_qp(client, req.qpn);
  if (!qp || qp->type != IBV_QPT_UD || req.gid[0] != 0xff) return EINVAL;
  // The groups are daemon-private (device_tables.h): ENOMEM past
  // max_mcast_grp groups or max_mcast_qp_attach QPs in one group.
  return tables_.mcg_attach(req.gid, req.lid, req.qpn);
}

int Registry::detach_mcast(uint32_t client, const proto::McastReq& req) {
  Qp* qp = find_qp(client, req.qpn);
  if (!qp || qp->type != IBV_QPT_UD || req.gid[0] != 0xff) return EINVAL;
  return tables_.mcg_detach(req.gid, req.qpn);
}

int Registry::destroy_qp(uint32_t client, uint32_t qpn) {
  Qp* qp = find_qp(client, qpn);
  if (!qp) return EINVAL;
  if (qp->type == IBV_QPT_XRC_RECV) {
    // A target QP lives while some handle of it exists (ibv_open_qp(3)).
    if (auto h = std::find(qp->holders.begin(), qp->holders.end(), ctx(client)); h != qp->holders.end())
      qp->holders.erase(h);
    if (!qp->holders.empty()) {
      qp->owner = qp->holders.front();
      return 0;
    }
  }
  release_qp(qpn);
  return 0;
}

int Registry::peer_reply(uint32_t client, uint32_t dest, proto::ConnectPeerReply& rep, std::vector<int>& out_fds) {
  auto peer = qps_.find(dest);
  if (peer == qps_.end()) return ENOENT;
  // The peer's queues and, through its keys, its memory are mapped by the
  // requester: not across users (see same_user). Between users the daemon
  // carries out each operation itself (Op::Mediate, mediate.cc); UD is not
  // mediated yet. The peer's QP entry is in its own user's device segment
  // (device_tables.h), which the requester does not map: a mediated
  // requester learns what it needs from this reply and the daemon checks
  // the peer's state at each operation.
  if (!same_user(client, peer->second.owner) || !same_tables(client, peer->second.owner)) {
    if (peer->second.type == IBV_QPT_UD) return EACCES;
    rep.peer_qpn = dest;
    rep.mediated = 1;
    rep.min_rnr_timer = qp_slot(dest).min_rnr_timer;
    return 0;
  }
  auto rcq = cqs_.find(peer->second.recv_cq);
  if (rcq == cqs_.end()) return ENOENT;
  rep.peer_qpn = dest;
  rep.peer_recv_cq = peer->second.recv_cq;
  rep.qp_segment_size = peer->second.map.size();
  rep.cq_segment_size = rcq->second.map.size();
  out_fds.push_back(peer->second.fd.get());
  out_fds.push_back(rcq->second.fd.get());
  rep.has_srq = 0;
  if (auto q = srqs_.find(peer->second.srq); q != srqs_.end()) {
    out_fds.push_back(q->second.fd.get());
    rep.has_srq = 1;
    rep.srq_segment_size = q->second.map.size();
    rep.srq_handle = q->first;
  }
  rep.has_channel = 0;
  if (rcq->second.channel) {
    if (auto ch = channels_.find(rcq->second.channel); ch != channels_.end()) {
      out_fds.push_back(ch->second.eventfd.get());
      rep.has_channel = 1;
    }
  }
  return 0;
}

int Registry::connect_peer(uint32_t client, uint32_t qpn, proto::ConnectPeerReply& rep,
                           std::vector<int>& out_fds) {
  Qp* qp = find_qp(client, qpn);
  if (!qp) return EINVAL;
  const QpEntry& mine = qp_slot(qpn);
  uint32_t dest = mine.dest_qpn.load();
  auto peer = qps_.find(dest);
  if (peer == qps_.end()) return ENOENT;  // nobody listens at that QPN on this host
  const QpEntry& pe = qp_slot(dest);
  auto st = ibv_qp_state(pe.state.load());
  if (st != IBV_QPS_RTR && st != IBV_QPS_RTS && st != IBV_QPS_SQD && st != IBV_QPS_SQE)
    return EAGAIN;  // not ready to receive: the requester retries
  if (peer->second.type != qp->type) return EAGAIN;  // an RC QP does not talk to a UC one
  if (pe.dest_qpn.load() != qpn) return EAGAIN;
  return peer_reply(client, dest, rep, out_fds);
}

// UD has no connection: any UD QP may send to any UD QP whose Q_Key it
// knows (checked per message by the sender against the QP table).
int Registry::connect_ud(uint32_t client, uint32_t qpn, uint32_t dest, proto::ConnectPeerReply& rep,
                         std::vector<int>& out_fds) {
  Qp* qp = find_qp(client, qpn);
  if (!qp || qp->type != IBV_QPT_UD) return EINVAL;
  auto peer = qps_.find(dest);
  if (peer == qps_.end() || peer->second.type != IBV_QPT_UD) return ENOENT;
  return peer_reply(client, dest, rep, out_fds);
}

int Registry::get_mr_backing(uint32_t client, uint32_t key, proto::GetMrBackingReply& rep,
                             std::vector<int>& out_fds) {
  const MrEntry* e = mr_entry(key);
  if (!e) return EINVAL;
  uint32_t mr_slot = key >> 8;
  if (auto w = mws_.find(mr_slot); w != mws_.end()) mr_slot = w->second.bound_mr;  // a window: its MR
  auto mr = mrs_.find(mr_slot);
  if (mr == mrs_.end()) return EINVAL;
  if (!same_user(client, mr->second.owner)) return EACCES;
  // A key grants access only to a process that owns the MR's PD, or that
  // holds a QP connected to a QP of that PD.
  bool allowed = false;
  if (auto pd = pds_.find(mr->second.pd); pd != pds_.end() && pd->second.owner == ctx(client)) allowed = true;
  bool has_ud = false;
  for (auto it = qps_.begin(); !allowed && it != qps_.end(); ++it) {
    if (it->second.owner != ctx(client)) continue;
    has_ud |= it->second.type == IBV_QPT_UD;
    auto peer = qps_.find(qp_slot(it->first).dest_qpn.load());
    if (peer != qps_.end() && peer->second.pd == mr->second.pd) allowed = true;
  }
  // A UD sender scatters into receive buffers of any UD QP of that PD.
  for (auto it = qps_.begin(); !allowed && has_ud && it != qps_.end(); ++it)
    if (it->second.type == IBV_QPT_UD && it->second.pd == mr->second.pd) allowed = true;
  // An XRC sender, into buffers posted to an XRC SRQ of that PD it reaches.
  for (auto it = srqs_.begin(); !allowed && it != srqs_.end(); ++it)
    if (it->second.pd == mr->second.pd && xrc_reaches_srq(ctx(client), it->second)) allowed = true;
  if (!allowed) return EACCES;
  auto b = backings_.find(mr->second.backing);
  if (b == backings_.end()) return EINVAL;
  rep.backing = mr->second.backing;
  out_fds.push_back(b->second.fd.get());
  return 0;
}

int Registry::peer_error(uint32_t client, uint32_t qpn) {
  if (!find_qp(client, qpn)) return EINVAL;
  uint32_t dest = qp_slot(qpn).dest_qpn.load();
  auto peer = qps_.find(dest);
  if (peer == qps_.end()) return 0;
  QpEntry& pe = qp_slot(dest);
  if (pe.dest_qpn.load() != qpn) return EINVAL;
  SV_TRACE("daemon: QP 0x%x reports a responder error: peer QP 0x%x to ERR", qpn, dest);
  pe.state.store(IBV_QPS_ERR, std::memory_order_release);
  return 0;
}

}  // namespace sv::daemon

// ---- The namespace -----------------------------------------------------------

namespace sv::daemon {

namespace {
// A name field from a client: NUL-terminated within its array, else empty
// (which no valid name is).
std::string field_name(const char (&name)[proto::kMaxNsName]) {
  size_t n = ::strnlen(name, proto::kMaxNsName);
  return n == proto::kMaxNsName ? std::string() : std::string(name, n);
}
}  // namespace

Credentials Registry::credentials(uint32_t client) const {
  auto c = clients_.find(client);
  if (c == clients_.end()) return Credentials{uid_t(-1), gid_t(-1), {}};
  return Credentials{c->second.uid, c->second.gid, supplementary_groups(c->second.pid)};
}

// An entry names an object only while that object exists in that context;
// names of destroyed objects disappear (lazily, before each namespace op).
bool Registry::ns_alive(const NsEntry& e) const {
  switch (e.kind) {
    case proto::kNsPd: {
      auto it = pds_.find(e.handle);
      return it != pds_.end() && it->second.owner == e.ctx;
    }
    case proto::kNsMr: {
      auto it = mrs_.find(e.handle);
      return it != mrs_.end() && it->second.owner == e.ctx;
    }
    case proto::kNsCq: {
      auto it = cqs_.find(e.handle);
      return it != cqs_.end() && it->second.owner == e.ctx;
    }
    case proto::kNsQp: {
      auto it = qps_.find(e.handle);
      return it != qps_.end() && it->second.owner == e.ctx;
    }
    case proto::kNsSrq: {
      auto it = srqs_.find(e.handle);
      return it != srqs_.end() && it->second.owner == e.ctx;
    }
    case proto::kNsChannel: {
      auto it = channels_.find(e.handle);
      return it != channels_.end() && it->second.owner == e.ctx;
    }
    default: return false;
  }
}

void Registry::ns_collect() {
  std::vector<std::string> gone;
  for (const auto& [name, e] : ns_.entries())
    if (!ns_alive(e)) gone.push_back(name);
  Credentials root{0, 0, {}};
  for (const auto& n : gone) ns_.unpublish(n, root);
}

int Registry::ns_publish(uint32_t client, const proto::NsPublishReq& req) {
  auto c = clients_.find(client);
  if (c == clients_.end()) return EINVAL;
  std::string name = field_name(req.name);
  if (!NameSpace::valid_name(name) || (req.mode & ~0777u)) return EINVAL;
  NsEntry e{req.kind, req.handle, c->second.ctx, c->second.uid, c->second.gid, req.mode};
  if (!ns_alive(e)) return EINVAL;  // not an object of the caller's context
  if (req.group != -1) {
    // As chgrp(1): only to a group the caller is in, unless root.
    Credentials who = credentials(client);
    gid_t g = gid_t(req.group);
    if (req.group < 0) return EINVAL;
    if (who.uid != 0 && g != who.gid && std::find(who.groups.begin(), who.groups.end(), g) == who.groups.end())
      return EPERM;
    e.group = g;
  }
  ns_collect();
  return ns_.publish(name, e);
}

int Registry::ns_unpublish(uint32_t client, const proto::NsNameReq& req) {
  std::string name = field_name(req.name);
  if (!NameSpace::valid_name(name)) return EINVAL;
  ns_collect();
  return ns_.unpublish(name, credentials(client));
}

int Registry::ns_open(uint32_t client, const proto::NsNameReq& req, proto::NsOpenReply& rep) {
  auto me = clients_.find(client);
  if (me == clients_.end()) return EINVAL;
  if (req.access == 0 || (req.access & ~(proto::kNsRead | proto::kNsWrite))) return EINVAL;
  if (req.flags & ~proto::kNsOwn) return EINVAL;
  ns_collect();
  std::string name = field_name(req.name);
  if (req.flags & proto::kNsOwn) {
    // The caller names an object it expects to be its own user's: a name
    // another user published (squatting it first) is refused before the
    // mode is looked at, and grants nothing.
    auto it = ns_.entries().find(name);
    if (it != ns_.entries().end()) {
      auto owner = contexts_.find(it->second.ctx);
      if (it->second.owner != me->second.uid || owner == contexts_.end() || owner->second.uid != me->second.uid)
        return EPERM;
    }
  }
  NsEntry e{};
  if (int err = ns_.lookup(name, credentials(client), req.access, e)) return err;
  // The mode allowed it. Between users the daemon never joins the caller to
  // the owner's context: its descriptors would map more than the named
  // object (its holder's whole backing memory), and a joined root process
  // would register its own memory in the other user's context. Root is no
  // exception (same_user). A CQ is granted by itself, for polling through
  // the daemon (poll_granted_cq); PDs, MRs, QPs and SRQs of another user
  // are reached through keys over a connection instead (mediate.cc).
  if (!same_user(client, e.ctx)) {
    if (e.kind != proto::kNsCq) return EPERM;
    // Once per client and CQ: opening the same name again adds nothing (a
    // client repeating NsOpen must not grow the daemon's table).
    if (!cq_granted(client, e.handle)) cq_grants_.emplace(client, e.handle);
    rep.kind = e.kind;
    rep.handle = e.handle;
    return 0;
  }
  uint32_t mine = me->second.ctx;
  if (mine != e.ctx) {
    // As ibv_import_device: this connection must not hold objects of its own.
    for (auto& [h, p] : pds_)
      if (p.owner == mine) return EBUSY;
    for (auto& [h, b] : backings_)
      if (b.owner == mine) return EBUSY;
    remove_context_if_unused(mine);
    me->second.ctx = e.ctx;
    contexts_[e.ctx].attached++;
  }
  rep.kind = e.kind;
  rep.handle = e.handle;
  return 0;
}

void Registry::ns_list(uint32_t start, proto::NsListReply& rep) {
  ns_collect();
  const auto& all = ns_.entries();
  rep.total = uint32_t(all.size());
  rep.count = 0;
  uint32_t i = 0;
  for (const auto& [name, e] : all) {
    if (i++ < start) continue;
    if (rep.count == proto::kNsListPage) break;
    proto::NsListEntry& out = rep.entries[rep.count++];
    std::memset(&out, 0, sizeof(out));
    std::memcpy(out.name, name.data(), std::min(name.size(), proto::kMaxNsName - 1));
    out.kind = e.kind;
    out.handle = e.handle;
    out.uid = uint32_t(e.owner);
    out.gid = uint32_t(e.group);
    out.mode = e.mode;
  }
}

}  // namespace sv::daemon
