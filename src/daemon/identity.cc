// identity.cc: a client's credentials, capability and RLIMIT_MEMLOCK, read
// through /proc and confirmed through its pidfd.
#include "daemon/identity.h"

#include <sys/resource.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>

#include "common/sys.h"

namespace sv::daemon {

namespace {

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

}  // namespace

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

}  // namespace sv::daemon
