// sharing.cc: what crosses contexts: importing a context
// (ibv_import_device(3)), and what the namespace (names.h) reaches of
// clients and contexts. Named shared memory regions (seed 000) are
// MemoryBackings' (pd.h).
#include "daemon/registry.h"

#include <dirent.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "common/trace.h"

namespace sv::daemon {

using namespace sv::shm;


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
  // /proc/PID/fd is readable only with ptrace's access to the process,
  // which a daemon in a user namespace (started inside `softverbs run`'s
  // view) has to none outside it: the kernel's sock_diag then names the
  // peer of the daemon's end of this connection, the client's end.
  uint64_t peer = 0;
  if (!found && c->second.conn_inode && unix_peer_inode(c->second.conn_inode, peer) == 0 && peer == inode)
    found = true;
  if (!found) return EPERM;
  if (auto s = socket_client_.find(inode); s != socket_client_.end() && s->second != client) return EEXIST;
  if (auto old = socket_client_.find(c->second.socket_inode); old != socket_client_.end() && old->second == client)
    socket_client_.erase(old);
  c->second.socket_inode = inode;
  socket_client_[inode] = client;
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
  // Identity: (sockfs device, inode) of a socket the owner's process was
  // seen to hold when it claimed it (claim_socket).
  if (auto s = socket_client_.find(uint64_t(st.st_ino)); s != socket_client_.end() && s->second != client) {
    const Client& other = clients_.at(s->second);
    // Credentials are checked at every import: only the context's own user
    // joins it (strictly the same uid; root is not special). A socket that
    // reached another user (passed, inherited) is not a grant.
    auto oc = contexts_.find(other.ctx);
    if (oc == contexts_.end() || oc->second.uid != me->second.uid || other.uid != me->second.uid) return EPERM;
    // ibv_import_device(3): this connection now shares that context.
    return join_context(me->second, other.ctx);
  }
  return ENOENT;
}

// Moves a connection into another context (ibv_import_device, or a name
// opened): it must not hold objects of its own yet (every object hangs off
// a PD or a backing), and leaves its own context.
int Registry::join_context(Client& me, uint32_t target) {
  const uint32_t mine = me.ctx;
  if (pd_.table().any_of(mine) || backings_.table().any_of(mine)) return EBUSY;
  remove_context_if_unused(mine);
  for (auto it = ctx_clients_.lower_bound({mine, 0}); it != ctx_clients_.end() && it->first == mine; ++it)
    if (&clients_.at(it->second) == &me) {
      ctx_clients_.insert({target, it->second});
      ctx_clients_.erase(it);
      break;
    }
  me.ctx = target;
  contexts_[target].attached++;
  return 0;
}

int Registry::attach_client(uint32_t client, uint32_t target) { return join_context(clients_[client], target); }

bool Registry::find_client(uint32_t client, ClientView& out) const {
  auto c = clients_.find(client);
  if (c == clients_.end()) return false;
  out = {c->second.pid, c->second.uid, c->second.gid, c->second.ctx, c->second.identity, c->second.pidfd.get(),
         &c->second.at_connect};
  return true;
}

Credentials Registry::credentials(uint32_t client) const {
  auto c = clients_.find(client);
  if (c == clients_.end()) return Credentials{uid_t(-1), gid_t(-1), {}};
  return Credentials{c->second.uid, c->second.gid, supplementary_groups(c->second.pid)};
}

// An entry names an object only while that object exists in that context;
// names of destroyed objects disappear (lazily, before each namespace op:
// names.cc).
bool Registry::names_live_object(const NsEntry& e) const {
  switch (e.kind) {
    case proto::kNsPd: return pd_.table().owned(e.handle, e.ctx) != nullptr;
    case proto::kNsMr: return mr_.table().owned(e.handle, e.ctx) != nullptr;
    case proto::kNsCq: return cq_.table().owned(e.handle, e.ctx) != nullptr;
    case proto::kNsQp: return qp_.table().owned(e.handle, e.ctx) != nullptr;
    case proto::kNsSrq: return srq_.table().owned(e.handle, e.ctx) != nullptr;
    case proto::kNsChannel: return cq_.channels().owned(e.handle, e.ctx) != nullptr;
    default: return false;
  }
}

}  // namespace sv::daemon
