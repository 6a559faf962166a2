// identity.cc: a client's credentials, capability and RLIMIT_MEMLOCK, read
// through /proc and confirmed through its pidfd.
#include "daemon/identity.h"

#include <fcntl.h>
#include <linux/capability.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cstdint>
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
// daemon). Unreadable counts as another namespace. The link's text names
// the namespace's inode, "user:[4026531837]" (namespaces(7)): reading it
// costs half of a stat(2) through it, which makes the kernel build the
// namespace's inode (4 against 7-9 us here, at each registration of a
// client with CAP_IPC_LOCK). The link is readable only with ptrace's
// access to the process, which a daemon in a user namespace (started inside
// `softverbs run`'s view) has to none outside it, nor a daemon outside to a
// process in another user's namespace: then the process's uid_map, which
// anyone may read, says (common/sys.h identity_uid_map).
bool in_initial_userns(pid_t pid) {
  static const ino_t initial = [] {
    struct stat st {};
    if (::stat("/proc/1/ns/user", &st) != 0 && ::stat("/proc/self/ns/user", &st) != 0) st = {};
    return st.st_ino;
  }();
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%d/ns/user", int(pid));
  char link[64];
  const ssize_t n = ::readlink(path, link, sizeof(link) - 1);
  if (n < 0 && (errno == EACCES || errno == EPERM)) return identity_uid_map(pid);
  if (n <= 0 || initial == 0) return false;
  link[n] = '\0';
  unsigned long long ino = 0;
  char end = 0;
  return std::sscanf(link, "user:[%llu%c", &ino, &end) == 2 && end == ']' && ino == uint64_t(initial);
}

// CAP_IPC_LOCK in `pid`'s effective set (capget(2): any process's sets,
// no privilege needed), in whatever user namespace it lives in.
bool has_ipc_lock(pid_t pid) {
  __user_cap_header_struct h{};
  h.version = _LINUX_CAPABILITY_VERSION_3;
  h.pid = pid;
  __user_cap_data_struct d[2]{};
  return ::syscall(SYS_capget, &h, d) == 0 && (d[CAP_IPC_LOCK / 32].effective & (1u << (CAP_IPC_LOCK % 32)));
}

// PIDFD_GET_INFO (Linux 6.13, include/uapi/linux/pidfd.h): the
// credentials of the process behind a pidfd, in this daemon's user
// namespace as /proc/PID/status shows them, in one ioctl that fails with
// ESRCH once the process is gone (the pidfd names one process: no pid
// reuse). The first version of the kernel's struct pidfd_info.
struct PidfdInfo {
  uint64_t mask;
  uint64_t cgroupid;
  uint32_t pid, tgid, ppid;
  uint32_t ruid, rgid, euid, egid, suid, sgid, fsuid, fsgid;
  int32_t exit_code;
};
static_assert(sizeof(PidfdInfo) == 64, "PIDFD_INFO_SIZE_VER0");
constexpr uint64_t kPidfdInfoCreds = 1u << 1;  // PIDFD_INFO_CREDS
constexpr unsigned long kPidfdGetInfo = _IOWR(0xFF, 11, PidfdInfo);

// 0 (ids read, the process alive), ESRCH (gone), or another errno (the
// kernel has no such ioctl: ENOTTY, EINVAL).
int pidfd_ids(int pidfd, uid_t uids[4], gid_t gids[4]) {
  PidfdInfo info{};
  info.mask = kPidfdInfoCreds;
  if (::ioctl(pidfd, kPidfdGetInfo, &info) != 0) return errno;
  if (!(info.mask & kPidfdInfoCreds)) return ENOTTY;
  const uid_t u[4] = {info.ruid, info.euid, info.suid, info.fsuid};
  const gid_t g[4] = {info.rgid, info.egid, info.sgid, info.fsgid};
  std::copy(u, u + 4, uids);
  std::copy(g, g + 4, gids);
  return 0;
}

// "\t1000\t1000\t1000\t1000" (proc(5), /proc/PID/status Uid: and Gid:):
// the four ids, nothing else on the line.
bool parse_ids(const char* p, unsigned ids[4]) {
  for (int i = 0; i < 4; ++i) {
    while (*p == ' ' || *p == '\t') ++p;
    if (*p < '0' || *p > '9') return false;
    char* end = nullptr;
    errno = 0;
    const unsigned long v = std::strtoul(p, &end, 10);
    if (errno != 0 || v > UINT32_MAX) return false;
    ids[i] = unsigned(v);
    p = end;
  }
  while (*p == ' ' || *p == '\t') ++p;
  return *p == '\0';
}

// "\t000001ffffffffff" (CapEff:): one hexadecimal number.
bool parse_hex(const char* p, unsigned long long& out) {
  while (*p == ' ' || *p == '\t') ++p;
  if (!std::isxdigit(static_cast<unsigned char>(*p))) return false;
  char* end = nullptr;
  errno = 0;
  out = std::strtoull(p, &end, 16);
  while (*end == ' ' || *end == '\t') ++end;
  return errno == 0 && *end == '\0';
}

// "pid:[4026531836]" (namespaces(7)): the inode; 0 if not such a link.
uint64_t pid_ns_link_inode(const char* path) {
  char link[64];
  const ssize_t n = ::readlink(path, link, sizeof(link) - 1);
  if (n <= 0) return 0;
  link[n] = '\0';
  unsigned long long ino = 0;
  char end = 0;
  return std::sscanf(link, "pid:[%llu%c", &ino, &end) == 2 && end == ']' ? uint64_t(ino) : 0;
}

// The inode of this daemon's pid namespace, where this process's /proc is
// that namespace's: its own NSpid: line (proc(5)) has one entry, its own
// pid (after unshare -p without a new /proc it has two, and /proc names
// processes by another namespace's numbers). 0 otherwise: then no link is
// read by a client's pid.
uint64_t own_pid_ns_via_proc() {
  static const uint64_t ino = [] {
    Fd f(::open("/proc/self/status", O_RDONLY | O_CLOEXEC));
    if (!f.valid()) return uint64_t(0);
    std::string text;
    char chunk[4096];
    for (ssize_t n; (n = ::read(f.get(), chunk, sizeof chunk)) != 0;) {
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return uint64_t(0);
      text.append(chunk, size_t(n));
    }
    const size_t at = text.find("\nNSpid:");
    if (at == std::string::npos) return uint64_t(0);
    const size_t eol = text.find('\n', at + 1);
    unsigned long first = 0;
    char extra = 0;
    const std::string line = text.substr(at + 7, eol == std::string::npos ? std::string::npos : eol - at - 7);
    if (std::sscanf(line.c_str(), " %lu %c", &first, &extra) != 1 || first != unsigned(::getpid())) return uint64_t(0);
    return pid_ns_link_inode("/proc/self/ns/pid");
  }();
  return ino;
}

}  // namespace

int client_in_pid_namespace(pid_t pid, int pidfd, bool& same) {
  if (pid <= 0 || pidfd < 0) return ESRCH;
  if (const uint64_t mine = own_pid_ns_via_proc()) {
    char path[64];
    std::snprintf(path, sizeof(path), "/proc/%d/ns/pid", int(pid));
    if (const uint64_t theirs = pid_ns_link_inode(path)) {
      // Read through the pid: only an answer about the process behind the
      // pidfd, not one that reused its number meanwhile.
      if (!pidfd_alive(pidfd)) return ESRCH;
      same = theirs == mine;
      return 0;
    }
  }
  return same_pid_namespace(pid, pidfd, same);
}

// The same through /proc/PID/status alone: for kernels without
// PIDFD_GET_INFO (before 6.13).
bool read_identity_proc(pid_t pid, int pidfd, ConnectIdentity& out) {
  if (!pidfd_alive(pidfd)) return false;
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%d/status", int(pid));
  // One read of the whole file, then the three lines looked up by their
  // prefix (a stdio parse with three sscanf(3) per line was most of the
  // daemon's time in a 4 KiB reg + dereg). The whole file,
  // whatever its length: a process in many groups has a long Groups: line
  // before CapEff:.
  std::string text;
  {
    Fd f(::open(path, O_RDONLY | O_CLOEXEC));
    if (!f.valid()) return false;
    char chunk[4096];
    for (ssize_t n; (n = ::read(f.get(), chunk, sizeof(chunk))) != 0;) {
      if (n < 0) {
        if (errno == EINTR) continue;
        return false;
      }
      text.append(chunk, size_t(n));
    }
  }
  char* buf = text.data();
  unsigned long long capeff = 0;
  int fields = 0;
  for (char* line = buf; line && *line;) {
    char* nl = std::strchr(line, '\n');
    if (nl) *nl = '\0';
    if (std::strncmp(line, "CapEff:", 7) == 0) {
      fields |= parse_hex(line + 7, capeff) ? 1 : 0;
    } else if (std::strncmp(line, "Uid:", 4) == 0) {
      fields |= parse_ids(line + 4, out.uids) ? 2 : 0;
    } else if (std::strncmp(line, "Gid:", 4) == 0) {
      fields |= parse_ids(line + 4, out.gids) ? 4 : 0;
    }
    line = nl ? nl + 1 : nullptr;
  }
  if (fields != 7 || !read_rlimit_memlock(pid, out.memlock)) return false;
  out.ipc_lock = (capeff & (1ull << 14)) && in_initial_userns(pid);  // CAP_IPC_LOCK
  if (!pidfd_alive(pidfd)) return false;
  out.known = true;
  return true;
}

// What decides `pid`'s locked-memory limit now. True only if the process
// behind `pidfd` was alive until everything was read, so that the pid was
// not reused by another process meanwhile: what is read by pid (the limit,
// the capability, the namespace) comes first, the pidfd's answer last.
// This runs at every registration, as the kernel checks the limit at each
// ib_umem_get: one prlimit(2) and one ioctl on the pidfd (1-2 us here,
// where a read of /proc/PID/status takes 11-17 us); capget(2)
// and the namespace's link besides only where `want_caps`.
bool read_identity(pid_t pid, int pidfd, ConnectIdentity& out, bool want_caps) {
  if (pidfd < 0) return false;
  if (!read_rlimit_memlock(pid, out.memlock)) return false;
  const bool ipc_lock = want_caps && has_ipc_lock(pid) && in_initial_userns(pid);
  switch (pidfd_ids(pidfd, out.uids, out.gids)) {
    case 0:
      out.ipc_lock = ipc_lock;
      out.known = true;
      return true;
    case ESRCH:
      // Gone, or alive but not named by the kernel here: a pid namespace
      // that does not see the process's parent (a process entered into a
      // container from outside, `docker exec`) gives it ppid 0, for which
      // some versions of pidfs answer ESRCH. /proc still says.
      if (!pidfd_alive(pidfd)) return false;
      return read_identity_proc(pid, pidfd, out);
    default:
      return read_identity_proc(pid, pidfd, out);
  }
}

// The locked-memory limit that a client's charge of `total` bytes meets:
// RLIMIT_MEMLOCK, or unlimited with CAP_IPC_LOCK (as ib_umem_get charges
// pinned pages in the kernel), decided for the process that connected: the
// capability must have been held at connect time and still be held, and
// once the process is gone or its credentials changed (the exec of a setuid
// binary), the limit is no larger than it was at connect time.
// In ib_umem_get's order (drivers/infiniband/core/umem.c): the limit
// first, and the capability only for a charge beyond it (`capable()` comes
// after the comparison). A registration within the limit then costs no
// capget(2) and no read of the namespace's link (about 5 us a
// registration/deregistration pair here), and for a client with
// CAP_IPC_LOCK the answer is its RLIMIT_MEMLOCK until a charge exceeds it.
uint64_t memlock_limit(pid_t pid, int pidfd, const ConnectIdentity& at_connect, uint64_t total) {
  if (!at_connect.known) return 0;
  ConnectIdentity now;
  const bool live = read_identity(pid, pidfd, now, false);
  if (!live) return at_connect.ipc_lock ? UINT64_MAX : at_connect.memlock;
  const bool same = std::equal(now.uids, now.uids + 4, at_connect.uids) &&
                    std::equal(now.gids, now.gids + 4, at_connect.gids);
  const uint64_t limit = same ? now.memlock : std::min(now.memlock, at_connect.memlock);
  if (total <= limit || !at_connect.ipc_lock) return limit;
  // Beyond the limit: does the capability hold now? Read by pid, then the
  // pidfd asked whether the process is still the one that connected (as
  // read_identity orders its reads); a process gone meanwhile is treated
  // as gone above.
  const bool ipc_lock = has_ipc_lock(pid) && in_initial_userns(pid);
  if (!pidfd_alive(pidfd) || ipc_lock) return UINT64_MAX;
  return limit;
}

}  // namespace sv::daemon
