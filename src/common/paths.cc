#include "common/paths.h"

#include <sys/socket.h>
#include <sys/time.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "common/protocol.h"
#include "common/sys.h"

namespace sv {

NetnsId netns_self() {
  // namespaces(7): "/proc/[pid]/ns/net ... if two processes are in the same
  // namespace, then the device IDs and inode numbers of their
  // /proc/[pid]/ns/xxx symbolic links will be the same".
  struct stat st;
  if (::stat("/proc/self/ns/net", &st) != 0) return {};
  return {uint64_t(st.st_dev), uint64_t(st.st_ino)};
}

std::string netns_text(NetnsId id) {
  return "net:[" + std::to_string(id.ino) + "] (device " + std::to_string(id.dev) + ")";
}

std::string format_netns_record(NetnsId id) { return std::to_string(id.dev) + " " + std::to_string(id.ino) + "\n"; }

bool parse_netns_record(const std::string& text, NetnsId* out) {
  unsigned long long dev = 0, ino = 0;
  char nl = 0;
  if (std::sscanf(text.c_str(), "%llu %llu%c", &dev, &ino, &nl) != 3 || nl != '\n') return false;
  *out = {uint64_t(dev), uint64_t(ino)};
  return true;
}

bool runtime_dir_explicit() {
  const char* d = std::getenv("SOFTVERBS_DIR");
  return d && *d;
}

std::string runtime_base_dir() {
  if (const char* x = std::getenv("XDG_RUNTIME_DIR"); x && *x) return std::string(x) + "/softverbs";
  return "/tmp/softverbs-" + std::to_string(::getuid());
}

std::string netns_dir(const std::string& base, NetnsId id) {
  return base + "/net-" + std::to_string(id.ino) + "-" + std::to_string(id.dev);
}

std::string netns_record_path(const std::string& dir) { return dir + "/netns"; }

bool read_netns_record(const std::string& dir, NetnsId* out) {
  int fd = ::open(netns_record_path(dir).c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return false;
  char buf[64];
  ssize_t n = ::read(fd, buf, sizeof buf - 1);
  ::close(fd);
  if (n <= 0) return false;
  return parse_netns_record(std::string(buf, size_t(n)), out);
}

int write_netns_record(const std::string& dir, NetnsId id) {
  // rename(2) replaces the record atomically: a reader sees the old or the new one.
  const std::string tmp = netns_record_path(dir) + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return errno;
  const std::string text = format_netns_record(id);
  bool ok = ::write(fd, text.data(), text.size()) == ssize_t(text.size());
  int e = ok ? 0 : (errno ? errno : EIO);
  ::close(fd);
  if (e == 0 && ::rename(tmp.c_str(), netns_record_path(dir).c_str()) != 0) e = errno;
  if (e) ::unlink(tmp.c_str());
  return e;
}

std::string choose_runtime_dir(const std::string& base, const NetnsId* recorded, NetnsId self) {
  if (!recorded || *recorded == self) return base;
  return netns_dir(base, self);
}

std::string runtime_dir() {
  if (const char* d = std::getenv("SOFTVERBS_DIR"); d && *d) return d;
  const std::string base = runtime_base_dir();
  NetnsId recorded;
  const bool have = read_netns_record(base, &recorded);
  return choose_runtime_dir(base, have ? &recorded : nullptr, netns_self());
}

// The daemon of BASE serves namespace `out`? false if none answers.
static bool base_daemon_netns(const std::string& base, NetnsId* out) {
  Fd s;
  if (connect_seqpacket(socket_path(base), s) != 0) return false;
  timeval tv{5, 0};
  ::setsockopt(s.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  proto::NetnsMsg req{};
  proto::init_header(req, proto::Op::Netns, 1);
  req.flags = proto::kNetnsQuery;
  proto::NetnsMsg rep{};
  std::vector<Fd> fds;
  size_t len = 0;
  if (send_message(s.get(), &req, sizeof req, {}) != 0 || recv_message(s.get(), &rep, sizeof rep, &len, fds) != 0 ||
      len != sizeof rep || rep.h.status != 0)
    return false;
  *out = {rep.dev, rep.ino};
  return true;
}

std::string resolve_runtime_dir() {
  if (runtime_dir_explicit()) return runtime_dir();
  const std::string base = runtime_base_dir();
  NetnsId served;
  if (base_daemon_netns(base, &served)) return choose_runtime_dir(base, &served, netns_self());
  return runtime_dir();
}

namespace {

int check_runtime_dir(const std::string& dir) {
  struct stat st;
  if (::lstat(dir.c_str(), &st) != 0) return errno;
  if (!S_ISDIR(st.st_mode)) return ENOTDIR;
  if (st.st_uid != ::getuid()) return EPERM;
  if ((st.st_mode & 0077) != 0) return EPERM;
  return 0;
}

}  // namespace

int ensure_runtime_dir(const std::string& dir) {
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    // A namespace's directory under a base that does not exist yet (only
    // there: an explicit directory's parent is the user's business).
    if (errno != ENOENT || runtime_dir_explicit()) return errno;
    const std::string base = runtime_base_dir();
    if (dir.compare(0, base.size() + 1, base + "/") != 0) return ENOENT;
    if (int e = ensure_runtime_dir(base)) return e;
    if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) return errno;
  }
  return check_runtime_dir(dir);
}

std::string system_dir() {
  if (const char* d = std::getenv("SOFTVERBS_SYSTEM_DIR"); d && *d) return d;
  return "/run/softverbs";
}

bool use_system_daemon() {
  const char* e = std::getenv("SOFTVERBS_SYSTEM");
  return e && *e && *e != '0';
}

int check_system_dir(const std::string& dir) {
  struct stat st;
  if (::lstat(dir.c_str(), &st) != 0) return errno;
  if (!S_ISDIR(st.st_mode)) return ENOTDIR;
  if (st.st_uid != 0 && st.st_uid != ::getuid()) return EPERM;
  if ((st.st_mode & 0022) != 0) return EPERM;
  return 0;
}

int ensure_system_dir(const std::string& dir) {
  if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) return errno;
  struct stat st;
  if (::lstat(dir.c_str(), &st) != 0) return errno;
  if (!S_ISDIR(st.st_mode)) return ENOTDIR;
  if (st.st_uid != ::getuid()) return EPERM;
  // Every user reaches the socket inside: the directory must be searchable
  // by all and writable by nobody else.
  if (::chmod(dir.c_str(), 0755) != 0) return errno;
  return 0;
}

}  // namespace sv
