#include "common/paths.h"

#include <sys/socket.h>
#include <sys/time.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
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

// --- directories held by a descriptor ---------------------------------------

namespace {

constexpr int kDirFlags = O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC;

bool proc_mounted() {
  static const bool mounted = ::access("/proc/self/fd", X_OK) == 0;
  return mounted;
}

// How a message names the directory.
std::string dir_label(const std::string& path, DirRule rule) {
  if (rule != DirRule::User) return "system daemon directory " + path;
  const char* d = std::getenv("SOFTVERBS_DIR");
  if (d && *d && path == d) return "SOFTVERBS_DIR=" + path;
  return "runtime directory " + path;
}

// What the user can do about a directory refused as `rule`'s.
std::string dir_fix(const std::string& path, DirRule rule) {
  if (rule != DirRule::User) return "it must be root's and writable by no one else (see softverbsd(8))";
  const char* d = std::getenv("SOFTVERBS_DIR");
  if (d && *d && path == d) return "set SOFTVERBS_DIR to a directory of yours with mode 0700";
  return "remove it, or set XDG_RUNTIME_DIR or SOFTVERBS_DIR to a directory of yours with mode 0700";
}

int refuse(int e, std::string* why, const std::string& text) {
  if (why) *why = text;
  return e;
}

// The checks of `rule` on an open directory; its owner in *owner.
int check_dir_fd(int fd, const std::string& path, DirRule rule, uid_t* owner, std::string* why) {
  struct stat st;
  if (::fstat(fd, &st) != 0) return refuse(errno, why, dir_label(path, rule) + ": " + std::strerror(errno));
  const std::string label = dir_label(path, rule);
  if (!S_ISDIR(st.st_mode)) return refuse(ENOTDIR, why, label + " is not a directory: " + dir_fix(path, rule));
  const uid_t me = ::getuid();
  const bool owner_ok = st.st_uid == me || (rule == DirRule::SystemClient && st.st_uid == 0);
  if (!owner_ok) {
    const std::string whom = rule == DirRule::SystemClient ? "not root" : "not you";
    return refuse(EPERM, why,
                  label + " is owned by uid " + std::to_string(st.st_uid) + ", " + whom + " (uid " +
                      std::to_string(me) + "): " + dir_fix(path, rule));
  }
  char mode[8];
  std::snprintf(mode, sizeof mode, "%04o", unsigned(st.st_mode & 07777));
  if (rule == DirRule::User && (st.st_mode & 0077) != 0)
    return refuse(EPERM, why, label + " has mode " + mode + "; it must be 0700 (chmod 700 " + path + ")");
  if (rule == DirRule::SystemClient && (st.st_mode & 0022) != 0)
    return refuse(EPERM, why,
                  label + " has mode " + mode + "; no one but its owner may write it (chmod 755 " + path + ")");
  *owner = st.st_uid;
  return 0;
}

// open_dir() and open_subdir(): `name` relative to `at`, `path` for messages.
int open_dir_at(int at, const std::string& name, const std::string& path, DirRule rule, bool create, RunDir& out,
                std::string* why) {
  const mode_t mode = rule == DirRule::SystemDaemon ? 0755 : 0700;
  if (create && ::mkdirat(at, name.c_str(), mode) != 0 && errno != EEXIST)
    return refuse(errno, why, dir_label(path, rule) + " cannot be created: " + std::strerror(errno));
  Fd fd(::openat(at, name.c_str(), kDirFlags));
  if (!fd.valid()) {
    const int e = errno;
    struct stat st;
    if ((e == ENOTDIR || e == ELOOP) && ::fstatat(at, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0)
      return refuse(e, why,
                    dir_label(path, rule) + (S_ISLNK(st.st_mode) ? " is a symbolic link" : " is not a directory") +
                        ": " + dir_fix(path, rule));
    return refuse(e, why, dir_label(path, rule) + " cannot be opened: " + std::strerror(e));
  }
  uid_t owner = 0;
  if (int e = check_dir_fd(fd.get(), path, rule, &owner, why)) return e;
  if (rule == DirRule::SystemDaemon) {
    // Every user reaches the socket inside: searchable by all, writable
    // by nobody else. fchmod(2) needs a descriptor opened for reading.
    Fd rd(::openat(fd.get(), ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!rd.valid() || ::fchmod(rd.get(), 0755) != 0)
      return refuse(errno, why, dir_label(path, rule) + ": chmod 0755: " + std::strerror(errno));
  }
  out.path = path;
  out.fd = std::move(fd);
  out.owner = owner;
  return 0;
}

}  // namespace

// proc(5), /proc/[pid]/fd: each entry is a link to the open file itself,
// which path resolution follows to the very directory held.
std::string RunDir::via() const {
  if (proc_mounted()) {
    // The /proc mounted here may be another pid namespace's, where "self"
    // is not this process: used only when it leads to this very directory.
    const std::string p = "/proc/self/fd/" + std::to_string(fd.get());
    struct stat a, b;
    if (::stat(p.c_str(), &a) == 0 && ::fstat(fd.get(), &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino)
      return p;
  }
  return path;
}

std::string RunDir::at(const char* name) const { return via() + "/" + name; }

int open_dir(const std::string& path, DirRule rule, bool create, RunDir& out, std::string* why) {
  return open_dir_at(AT_FDCWD, path, path, rule, create, out, why);
}

int open_subdir(const RunDir& parent, const std::string& name, bool create, RunDir& out, std::string* why) {
  if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..")
    return refuse(EINVAL, why, "runtime directory " + parent.path + "/" + name + ": not a plain name");
  return open_dir_at(parent.fd.get(), name, parent.path + "/" + name, DirRule::User, create, out, why);
}

int connect_in(const RunDir& dir, Fd& out) {
  Fd s;
  if (int e = connect_seqpacket(dir.at("control"), s)) return e;
  // Without /proc the name was resolved again; with it this is a second
  // lock: only the directory's owner (or root) can bind a socket in it.
  PeerCred peer{};
  if (int e = peer_credentials(s.get(), peer)) return e;
  if (peer.uid != dir.owner) return EPERM;
  out = std::move(s);
  return 0;
}

void say_dir_problem(const std::string& why) {
  static std::atomic<bool> said{false};
  if (!said.exchange(true)) std::fprintf(stderr, "softverbs: %s (softverbs doctor checks the set-up)\n", why.c_str());
}

// --- the per-user directories ------------------------------------------------

bool runtime_dir_explicit() {
  const char* d = std::getenv("SOFTVERBS_DIR");
  return d && *d;
}

std::string runtime_base_dir() {
  if (const char* x = std::getenv("XDG_RUNTIME_DIR"); x && *x) return std::string(x) + "/softverbs";
  const std::string uid = std::to_string(::getuid());
  // logind's directory for the user (pam_systemd(8)): used when it is the
  // user's own, as XDG_RUNTIME_DIR would name it.
  RunDir run;
  if (open_dir("/run/user/" + uid, DirRule::User, false, run) == 0) return run.path + "/softverbs";
  return "/tmp/softverbs-" + uid;
}

std::string netns_dir_name(NetnsId id) { return "net-" + std::to_string(id.ino) + "-" + std::to_string(id.dev); }

std::string netns_dir(const std::string& base, NetnsId id) { return base + "/" + netns_dir_name(id); }

std::string netns_record_path(const std::string& dir) { return dir + "/netns"; }

bool read_netns_record(const RunDir& dir, NetnsId* out) {
  Fd fd(::openat(dir.fd.get(), "netns", O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY));
  if (!fd.valid()) return false;
  struct stat st;
  if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != dir.owner) return false;
  char buf[64];
  ssize_t n = ::read(fd.get(), buf, sizeof buf - 1);
  if (n <= 0) return false;
  return parse_netns_record(std::string(buf, size_t(n)), out);
}

bool read_netns_record(const std::string& dir, NetnsId* out) {
  RunDir d;
  return open_dir(dir, DirRule::User, false, d) == 0 && read_netns_record(d, out);
}

int write_netns_record(const RunDir& dir, NetnsId id) {
  // renameat(2) replaces the record atomically: a reader sees the old or the new one.
  const int at = dir.fd.get();
  Fd fd(::openat(at, "netns.tmp", O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!fd.valid()) return errno;
  const std::string text = format_netns_record(id);
  bool ok = ::write(fd.get(), text.data(), text.size()) == ssize_t(text.size());
  int e = ok ? 0 : (errno ? errno : EIO);
  fd.reset();
  if (e == 0 && ::renameat(at, "netns.tmp", at, "netns") != 0) e = errno;
  if (e) ::unlinkat(at, "netns.tmp", 0);
  return e;
}

int write_netns_record(const std::string& dir, NetnsId id) {
  RunDir d;
  if (int e = open_dir(dir, DirRule::User, false, d)) return e;
  return write_netns_record(d, id);
}

std::string choose_runtime_dir(const std::string& base, const NetnsId* recorded, NetnsId self) {
  if (!recorded || *recorded == self) return base;
  return netns_dir(base, self);
}

std::string runtime_dir() {
  if (const char* d = std::getenv("SOFTVERBS_DIR"); d && *d) return d;
  const std::string base = runtime_base_dir();
  RunDir b;
  NetnsId recorded;
  const bool have = open_dir(base, DirRule::User, false, b) == 0 && read_netns_record(b, &recorded);
  return choose_runtime_dir(base, have ? &recorded : nullptr, netns_self());
}

// The daemon of BASE serves namespace `out`? false if none answers.
static bool base_daemon_netns(const RunDir& base, NetnsId* out) {
  Fd s;
  if (connect_in(base, s) != 0) return false;
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
  RunDir b;
  NetnsId served;
  if (open_dir(base, DirRule::User, false, b) == 0 && base_daemon_netns(b, &served))
    return choose_runtime_dir(base, &served, netns_self());
  return runtime_dir();
}

int ensure_runtime_dir(const std::string& dir, RunDir& out, std::string* why) {
  // A namespace's directory under BASE is made with BASE, and reached
  // through BASE's descriptor (only there: an explicit directory's parent
  // is the user's business).
  if (!runtime_dir_explicit()) {
    const std::string base = runtime_base_dir();
    if (dir.size() > base.size() + 1 && dir.compare(0, base.size() + 1, base + "/") == 0) {
      RunDir b;
      if (int e = open_dir(base, DirRule::User, true, b, why)) return e;
      return open_subdir(b, dir.substr(base.size() + 1), true, out, why);
    }
  }
  return open_dir(dir, DirRule::User, true, out, why);
}

int ensure_runtime_dir(const std::string& dir) {
  RunDir d;
  return ensure_runtime_dir(dir, d);
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
  RunDir d;
  return open_dir(dir, DirRule::SystemClient, false, d);
}

int ensure_system_dir(const std::string& dir) {
  RunDir d;
  return open_dir(dir, DirRule::SystemDaemon, true, d);
}

}  // namespace sv
