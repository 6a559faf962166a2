#include "common/sys.h"

#include <fcntl.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <linux/sock_diag.h>
#include <linux/unix_diag.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <linux/magic.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <pthread.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace sv {

void Fd::reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

void Mapping::reset() {
  if (addr_) ::munmap(addr_, len_);
  addr_ = nullptr;
  len_ = 0;
}

size_t page_size() {
  static const size_t ps = size_t(::sysconf(_SC_PAGESIZE));
  return ps;
}

static_assert(kFixedSizeSeals == (F_SEAL_SHRINK | F_SEAL_GROW) && kFinalSeals == (kFixedSizeSeals | F_SEAL_SEAL));

int make_memfd(const char* name, size_t size, Fd& out, unsigned seals) {
  int fd = ::memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return errno;
  Fd f(fd);
  if (::fchmod(fd, 0600) != 0) return errno;
  if (size && ::ftruncate(fd, off_t(size)) != 0) return errno;
  if (seals && ::fcntl(fd, F_ADD_SEALS, int(seals)) != 0) return errno;
  out = std::move(f);
  return 0;
}

int make_eventfd(Fd& out) {
  int fd = ::eventfd(0, EFD_CLOEXEC);
  if (fd < 0) return errno;
  out.reset(fd);
  return 0;
}

int map_shared(int fd, uint64_t offset, size_t len, int prot, bool populate, Mapping& out) {
  if (len == 0) return EINVAL;
  int flags = MAP_SHARED | (populate ? MAP_POPULATE : 0);
  void* p = ::mmap(nullptr, len, prot, flags, fd, off_t(offset));
  if (p == MAP_FAILED) return errno;
  out = Mapping(p, len);
  return 0;
}

int dup_fd(int fd, Fd& out) {
  int d = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (d < 0) return errno;
  out.reset(d);
  return 0;
}

int set_nonblocking(int fd, bool on) {
  int fl = ::fcntl(fd, F_GETFL);
  if (fl < 0) return errno;
  fl = on ? (fl | O_NONBLOCK) : (fl & ~O_NONBLOCK);
  if (::fcntl(fd, F_SETFL, fl) < 0) return errno;
  return 0;
}

int send_message(int sock, const void* data, size_t len, std::span<const int> fds, bool dontwait) {
  if (fds.size() > size_t(kMaxFdsPerMessage)) return EINVAL;
  iovec iov{const_cast<void*>(data), len};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char ctrl[CMSG_SPACE(sizeof(int) * kMaxFdsPerMessage)];
  if (!fds.empty()) {
    std::memset(ctrl, 0, sizeof(ctrl));
    msg.msg_control = ctrl;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  }
  for (;;) {
    ssize_t n = ::sendmsg(sock, &msg, MSG_NOSIGNAL | (dontwait ? MSG_DONTWAIT : 0));
    if (n >= 0) return size_t(n) == len ? 0 : EMSGSIZE;
    if (errno != EINTR) return errno;
  }
}

int recv_message(int sock, void* buf, size_t cap, size_t* len, std::vector<Fd>& fds, bool dontwait) {
  iovec iov{buf, cap};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char ctrl[CMSG_SPACE(sizeof(int) * kMaxFdsPerMessage)];
  msg.msg_control = ctrl;
  msg.msg_controllen = sizeof(ctrl);
  ssize_t n;
  for (;;) {
    n = ::recvmsg(sock, &msg, MSG_CMSG_CLOEXEC | (dontwait ? MSG_DONTWAIT : 0));
    if (n >= 0) break;
    if (errno != EINTR) return errno;
  }
  fds.clear();
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
      size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < count; ++i) {
        int fd;
        std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        fds.emplace_back(fd);
      }
    }
  }
  *len = size_t(n);
  if (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) return EMSGSIZE;
  return 0;
}

int peer_credentials(int sock, PeerCred& out) {
  ucred c{};
  socklen_t l = sizeof(c);
  if (::getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &c, &l) != 0) return errno;
  out = {c.pid, c.uid, c.gid};
  return 0;
}

#ifndef SO_PEERPIDFD
#define SO_PEERPIDFD 77
#endif

int pidfd_open(pid_t pid, Fd& out) {
  long fd = ::syscall(SYS_pidfd_open, pid, 0);
  if (fd < 0) return errno;
  out.reset(int(fd));
  return 0;
}

bool pidfd_alive(int pidfd) {
  if (pidfd < 0) return false;
  // EPERM: alive, only not ours to signal.
  return ::syscall(SYS_pidfd_send_signal, pidfd, 0, nullptr, 0) == 0 || errno == EPERM;
}

uint64_t boottime_ns() {
  timespec ts{};
  ::clock_gettime(CLOCK_BOOTTIME, &ts);
  return uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
}

int peer_pidfd(int sock, const PeerCred& cred, uint64_t accepted_ns, Fd& out) {
  int fd = -1;
  socklen_t l = sizeof(fd);
  if (::getsockopt(sock, SOL_SOCKET, SO_PEERPIDFD, &fd, &l) == 0 && fd >= 0) {
    out.reset(fd);
    return 0;
  }
  if (cred.pid <= 0) return ESRCH;
  Fd p;
  if (int e = pidfd_open(cred.pid, p)) return e;
  // The process now behind cred.pid must have started before the accept:
  // field 22 of /proc/PID/stat, in clock ticks since boot.
  char path[64], buf[1024];
  std::snprintf(path, sizeof(path), "/proc/%d/stat", int(cred.pid));
  Fd st(::open(path, O_RDONLY | O_CLOEXEC));
  ssize_t n = st.valid() ? ::read(st.get(), buf, sizeof(buf) - 1) : -1;
  if (n <= 0) return ESRCH;
  buf[n] = 0;
  const char* q = std::strrchr(buf, ')');  // the command name may hold anything but ends at the last ')'
  unsigned long long start = 0;
  if (!q || std::sscanf(q + 1, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d %*d %*d %*d %llu",
                        &start) != 1)
    return ESRCH;
  const uint64_t hz = uint64_t(::sysconf(_SC_CLK_TCK));
  if (start * (1000000000ull / hz) > accepted_ns || !pidfd_alive(p.get())) return ESRCH;
  out = std::move(p);
  return 0;
}

namespace {

// The pid namespace of the process behind `pidfd`, by the pidfd itself
// (PIDFD_GET_PID_NAMESPACE, Linux 6.11: _IO(PIDFS_IOCTL_MAGIC 0xFF, 5)), so
// that no /proc is needed, nor one that belongs to another namespace (a
// process that unshared its pid namespace and kept the old /proc names
// other processes by every number). 0, ENOTTY/EINVAL where the kernel has
// no such ioctl, or another errno.
int pid_namespace_by_pidfd(int pidfd, struct stat& out) {
  Fd ns(::ioctl(pidfd, _IO(0xFF, 5), 0));
  if (!ns.valid()) return errno;
  return ::fstat(ns.get(), &out) == 0 ? 0 : errno;
}

// The entries of the NSpid: line of a /proc/PID/status (proc(5)): the
// process's pid in each pid namespace from that /proc's down to its own.
// The count (the first entry in `first`), or 0 when the file cannot be
// read, is not a procfs file or has no such line (a kernel before 4.1).
int nspid_entries(const char* path, pid_t& first) {
  Fd f(::open(path, O_RDONLY | O_CLOEXEC));
  if (!f.valid()) return 0;
  struct statfs fs {};
  if (::fstatfs(f.get(), &fs) != 0 || fs.f_type != PROC_SUPER_MAGIC) return 0;
  std::string text;
  char chunk[4096];
  for (ssize_t n; (n = ::read(f.get(), chunk, sizeof chunk)) != 0;) {
    if (n < 0) {
      if (errno == EINTR) continue;
      return 0;
    }
    text.append(chunk, size_t(n));
  }
  const size_t at = text.find("\nNSpid:");
  if (at == std::string::npos) return 0;
  const char* p = text.c_str() + at + 7;
  int count = 0;
  for (;;) {
    while (*p == ' ' || *p == '\t') ++p;
    if (*p < '0' || *p > '9') break;
    char* end = nullptr;
    const long v = std::strtol(p, &end, 10);
    if (count++ == 0) first = pid_t(v);
    p = end;
  }
  return *p == '\n' || *p == '\0' ? count : 0;
}

}  // namespace

int same_pid_namespace(pid_t pid, int pidfd, bool& same) {
  if (pid <= 0 || pidfd < 0) return ESRCH;
  // NSpid: counts the namespaces from /proc's down to the process's own.
  // This process's line with one entry, its own pid, says that /proc is its
  // namespace's (not an ancestor's, as after unshare -p without a new
  // /proc); then a process named PID there with one entry is of the same
  // namespace (pid PID here: SO_PEERCRED's), and one with more is in a
  // namespace below it.
  pid_t self_first = 0, first = 0;
  if (nspid_entries("/proc/self/status", self_first) == 1 && self_first == ::getpid()) {
    char path[64];
    std::snprintf(path, sizeof(path), "/proc/%d/status", int(pid));
    if (const int n = nspid_entries(path, first); n > 0) {
      // Read through the pid: only an answer about the process behind the
      // pidfd, not one that reused its number meanwhile.
      if (!pidfd_alive(pidfd)) return ESRCH;
      same = n == 1 && first == pid;
      return 0;
    }
  }
  // Read through the pidfd, or through the pid and confirmed by the pidfd.
  struct stat theirs {}, mine {};
  Fd self;
  int e = pid_namespace_by_pidfd(pidfd, theirs);
  if (e == 0) {
    if (int e2 = pidfd_open(::getpid(), self)) return e2;
    if (int e2 = pid_namespace_by_pidfd(self.get(), mine)) return e2;
  } else if (e == ENOTTY || e == EINVAL) {
    char path[64];
    std::snprintf(path, sizeof(path), "/proc/%d/ns/pid", int(pid));
    if (::stat(path, &theirs) != 0) return errno == ENOENT ? ESRCH : errno;
    if (::stat("/proc/self/ns/pid", &mine) != 0) return errno;
  } else {
    return e == ESRCH ? ESRCH : e;
  }
  if (!pidfd_alive(pidfd)) return ESRCH;
  same = theirs.st_dev == mine.st_dev && theirs.st_ino == mine.st_ino;
  return 0;
}

bool identity_uid_map(pid_t pid) {
  char path[64];
  if (pid == 0) std::snprintf(path, sizeof(path), "/proc/self/uid_map");
  else std::snprintf(path, sizeof(path), "/proc/%d/uid_map", int(pid));
  Fd f(::open(path, O_RDONLY | O_CLOEXEC));
  char buf[256];
  const ssize_t n = f.valid() ? ::read(f.get(), buf, sizeof buf - 1) : -1;
  if (n <= 0) return false;
  buf[n] = 0;
  unsigned long long inside = 1, outside = 1, count = 0;
  int used = 0;
  return std::sscanf(buf, " %llu %llu %llu %n", &inside, &outside, &count, &used) == 3 && buf[used] == 0 &&
         inside == 0 && outside == 0 && count == 4294967295ull;
}

int unix_peer_inode(uint64_t inode, uint64_t& peer) {
  if (inode == 0 || inode > UINT32_MAX) return EINVAL;  // udiag_ino is 32 bits
  Fd nl(::socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG));
  if (!nl.valid()) return errno;
  struct {
    nlmsghdr h;
    unix_diag_req r;
  } req{};
  req.h.nlmsg_len = sizeof req;
  req.h.nlmsg_type = SOCK_DIAG_BY_FAMILY;
  req.h.nlmsg_flags = NLM_F_REQUEST;
  req.r.sdiag_family = AF_UNIX;
  req.r.udiag_ino = uint32_t(inode);
  req.r.udiag_show = UDIAG_SHOW_PEER;
  req.r.udiag_cookie[0] = req.r.udiag_cookie[1] = ~0u;  // INET_DIAG_NOCOOKIE: any socket of that inode
  sockaddr_nl to{};
  to.nl_family = AF_NETLINK;
  if (::sendto(nl.get(), &req, sizeof req, 0, reinterpret_cast<sockaddr*>(&to), sizeof to) != ssize_t(sizeof req))
    return errno;
  alignas(nlmsghdr) char buf[8192];
  const ssize_t got = ::recv(nl.get(), buf, sizeof buf, 0);
  if (got < 0) return errno;
  int n = int(got);
  for (auto* h = reinterpret_cast<nlmsghdr*>(buf); NLMSG_OK(h, n); h = NLMSG_NEXT(h, n)) {
    if (h->nlmsg_type == NLMSG_ERROR) {
      const auto* err = static_cast<const nlmsgerr*>(NLMSG_DATA(h));
      return err->error ? -err->error : ENOENT;
    }
    if (h->nlmsg_type != SOCK_DIAG_BY_FAMILY || h->nlmsg_len < NLMSG_LENGTH(sizeof(unix_diag_msg))) continue;
    const auto* m = static_cast<const unix_diag_msg*>(NLMSG_DATA(h));
    if (m->udiag_ino != uint32_t(inode)) continue;
    int left = int(h->nlmsg_len - NLMSG_LENGTH(sizeof *m));
    for (auto* a = reinterpret_cast<const rtattr*>(m + 1); RTA_OK(a, left); a = RTA_NEXT(a, left)) {
      if (a->rta_type == UNIX_DIAG_PEER && RTA_PAYLOAD(a) >= sizeof(uint32_t)) {
        uint32_t v = 0;
        std::memcpy(&v, RTA_DATA(a), sizeof v);
        peer = v;
        return 0;
      }
    }
    return ENOTCONN;
  }
  return ENOENT;
}

uint64_t pid_namespace_inode(pid_t pid, int pidfd) {
  struct stat st {};
  if (pid == 0) return ::stat("/proc/self/ns/pid", &st) == 0 ? uint64_t(st.st_ino) : 0;
  if (pidfd >= 0 && pid_namespace_by_pidfd(pidfd, st) == 0) return uint64_t(st.st_ino);
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%d/ns/pid", int(pid));
  if (pid <= 0 || ::stat(path, &st) != 0 || (pidfd >= 0 && !pidfd_alive(pidfd))) return 0;
  return uint64_t(st.st_ino);
}

static int fill_addr(const std::string& path, sockaddr_un& a) {
  if (path.size() >= sizeof(a.sun_path)) return ENAMETOOLONG;
  std::memset(&a, 0, sizeof(a));
  a.sun_family = AF_UNIX;
  std::memcpy(a.sun_path, path.c_str(), path.size() + 1);
  return 0;
}

int kernel_socket(int domain, int type, int protocol) {
  return int(::syscall(SYS_socket, domain, type, protocol));
}

int listen_seqpacket(const std::string& path, Fd& out, mode_t mode) {
  // With a mode, the socket is made under a temporary name, given its mode
  // and set listening there, then renamed into place: a client finds the
  // path only once it accepts connections with its final mode. Bound at the
  // path and chmod-ed after, another user's connect in between got EACCES
  // from a daemon that was already answering root (a test that let nobody
  // in first failed on it under load).
  const std::string bound = mode ? path + "~" : path;
  sockaddr_un a;
  if (int e = fill_addr(bound, a)) return e;
  Fd s(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!s.valid()) return errno;
  ::unlink(bound.c_str());
  if (::bind(s.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) return errno;
  int e = 0;
  if (mode && ::chmod(bound.c_str(), mode) != 0) e = errno;
  if (!e && ::listen(s.get(), 128) != 0) e = errno;
  if (!e && mode && ::rename(bound.c_str(), path.c_str()) != 0) e = errno;
  if (e) {
    ::unlink(bound.c_str());
    return e;
  }
  out = std::move(s);
  return 0;
}

int connect_seqpacket(const std::string& path, Fd& out) {
  sockaddr_un a;
  if (int e = fill_addr(path, a)) return e;
  Fd s(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  if (!s.valid()) return errno;
  for (;;) {
    if (::connect(s.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) break;
    if (errno != EINTR) return errno;
  }
  out = std::move(s);
  return 0;
}

int eventfd_signal(int fd) {
  uint64_t one = 1;
  for (;;) {
    if (::write(fd, &one, sizeof(one)) == sizeof(one)) return 0;
    if (errno != EINTR) return errno;
  }
}

int eventfd_drain(int fd, uint64_t* value) {
  uint64_t v = 0;
  for (;;) {
    ssize_t n = ::read(fd, &v, sizeof(v));
    if (n == sizeof(v)) break;
    if (n < 0 && errno == EINTR) continue;
    return n < 0 ? errno : EIO;
  }
  if (value) *value = v;
  return 0;
}

int eventfd_wait_once(int fd, uint64_t* value) {
  uint64_t v = 0;
  ssize_t n = ::read(fd, &v, sizeof(v));
  if (n != sizeof(v)) return n < 0 ? errno : EIO;
  if (value) *value = v;
  return 0;
}

int make_wake_pair(Fd& reader, Fd& writer) {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) return errno;
  reader.reset(sv[0]);
  writer.reset(sv[1]);
  return 0;
}

int wake_signal(int fd) {
  const uint8_t one = 1;
  for (;;) {
    if (::send(fd, &one, 1, MSG_DONTWAIT | MSG_NOSIGNAL) == 1) return 0;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;  // full: a wake-up waits already
    if (errno != EINTR) return errno;
  }
}

int wake_drain(int fd) {
  uint8_t buf[256];
  bool got = false;
  for (;;) {
    const ssize_t n = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n > 0) {
      got = true;
      continue;
    }
    if (n == 0) return got ? 0 : EPIPE;
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return got ? 0 : EAGAIN;
    return errno;
  }
}

int wake_wait_once(int fd) {
  uint8_t buf[64];
  const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
  if (n < 0) return errno;
  if (n == 0) return EPIPE;
  const int e = wake_drain(fd);
  return e == EAGAIN ? 0 : e;
}

bool is_wake_socket(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) return false;
  int v = 0;
  socklen_t l = sizeof v;
  if (::getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &v, &l) != 0 || v != AF_UNIX) return false;
  l = sizeof v;
  if (::getsockopt(fd, SOL_SOCKET, SO_TYPE, &v, &l) != 0 || v != SOCK_STREAM) return false;
  // An unnamed address is the family alone (unix(7), "unnamed").
  sockaddr_un a{};
  socklen_t al = sizeof a;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &al) != 0 || al != sizeof(sa_family_t)) return false;
  al = sizeof a;
  return ::getpeername(fd, reinterpret_cast<sockaddr*>(&a), &al) == 0 && al == sizeof(sa_family_t);
}

namespace detail {
std::atomic<uint32_t> g_pid{0};
}  // namespace detail
using detail::g_pid;
namespace {
void refresh_pid() { g_pid.store(uint32_t(::getpid()), std::memory_order_relaxed); }
}  // namespace

uint32_t self_pid_slow() {
  static const int once = [] { return ::pthread_atfork(nullptr, nullptr, refresh_pid); }();
  (void)once;
  refresh_pid();
  return g_pid.load(std::memory_order_relaxed);
}

uint64_t monotonic_ns() {
  timespec ts;
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
}

}  // namespace sv
