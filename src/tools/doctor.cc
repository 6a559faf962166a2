// softverbs doctor: see doctor.h.
#include "tools/doctor.h"

#include <dirent.h>
#include <fcntl.h>
#include <pwd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <cctype>
#include <string>
#include <vector>

#include "common/device_info.h"
#include "common/paths.h"
#include "common/port_holder.h"
#include "common/protocol.h"
#include "common/sys.h"

namespace sv::tools {
namespace {

constexpr uint16_t kRocePort = 4791;  // RoCEv2 (IBTA RoCEv2 annex A17.4.5.2)
// What registrations need by default: Linux's own default RLIMIT_MEMLOCK
// since 5.16 (8 MiB), which the usual test programs fit in (perftest's
// ib_write_bw with its defaults registers less).
constexpr uint64_t kDefaultMemlockNeed = 8ull << 20;

enum class Verdict { Ok, Warn, Fail };

struct Report {
  int failures = 0;
  int warnings = 0;
  void line(Verdict v, const std::string& what, const std::string& detail, const std::string& fix = "") {
    const char* tag = v == Verdict::Ok ? "ok  " : v == Verdict::Warn ? "warn" : "FAIL";
    if (v == Verdict::Fail) failures++;
    if (v == Verdict::Warn) warnings++;
    std::printf("%s  %s: %s%s%s\n", tag, what.c_str(), detail.c_str(), fix.empty() ? "" : "; fix: ", fix.c_str());
    std::fflush(stdout);
  }
};

std::string read_text(const std::string& path, size_t cap = 1 << 20) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return {};
  std::string out;
  char buf[4096];
  ssize_t n;
  while (out.size() < cap && (n = ::read(fd, buf, sizeof buf)) > 0) out.append(buf, size_t(n));
  ::close(fd);
  return out;
}

std::string user_text(uid_t uid) {
  const passwd* pw = ::getpwuid(uid);
  return "uid " + std::to_string(uid) + (pw ? " (" + std::string(pw->pw_name) + ")" : "");
}

std::string mode_text(mode_t m) {
  char b[8];
  std::snprintf(b, sizeof b, "%04o", unsigned(m & 07777));
  return b;
}

std::string real_path(const std::string& p) {
  char* r = ::realpath(p.c_str(), nullptr);
  if (!r) return p;
  std::string s(r);
  std::free(r);
  return s;
}

// A namespace link's identity (namespaces(7): device and inode); false if unreadable.
bool ns_of(const std::string& link, NetnsId* out) {
  struct stat st {};
  if (::stat(link.c_str(), &st) != 0) return false;
  *out = {uint64_t(st.st_dev), uint64_t(st.st_ino)};
  return true;
}

std::string ns_text(const char* kind, NetnsId id) { return std::string(kind) + ":[" + std::to_string(id.ino) + "]"; }

// ---- The runtime directory -------------------------------------------------

// One directory the library uses: a real directory, the user's, 0700.
void check_dir(Report& r, const std::string& what, const std::string& dir) {
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0) {
    const int e = errno;
    const std::string parent = dir.substr(0, dir.rfind('/'));
    struct stat ps {};
    if (e == ENOENT && !parent.empty() && ::stat(parent.c_str(), &ps) != 0) {
      r.line(Verdict::Fail, what, dir + " cannot be made: its parent " + parent + " does not exist",
             "unset XDG_RUNTIME_DIR (then /tmp/softverbs-UID is used) or set SOFTVERBS_DIR to a directory of yours");
    } else if (e == ENOENT) {
      r.line(Verdict::Ok, what, dir + " does not exist yet (the library makes it, 0700, on first use)");
    } else {
      r.line(Verdict::Fail, what, dir + ": " + std::strerror(e), "check the permissions of its parent");
    }
    return;
  }
  if (S_ISLNK(st.st_mode)) {
    char target[PATH_MAX] = {};
    const ssize_t n = ::readlink(dir.c_str(), target, sizeof target - 1);
    r.line(Verdict::Fail, what, dir + " is a symbolic link (to " + (n > 0 ? std::string(target, size_t(n)) : "?") +
           "): the library refuses it", "rm " + dir + " (the library makes a real directory)");
  } else if (!S_ISDIR(st.st_mode)) {
    r.line(Verdict::Fail, what, dir + " is not a directory", "rm " + dir + " (the library makes it)");
  } else if (st.st_uid != ::getuid()) {
    r.line(Verdict::Fail, what, dir + " belongs to " + user_text(st.st_uid) + ", not to you (" +
           user_text(::getuid()) + ")", "use a directory of your own: export SOFTVERBS_DIR=$(mktemp -d)");
  } else if (st.st_mode & 0077) {
    r.line(Verdict::Fail, what, dir + " has mode " + mode_text(st.st_mode) + ", must be 0700 (the daemon's socket "
           "and shared memory live there)", "chmod 0700 " + dir);
  } else {
    r.line(Verdict::Ok, what, dir + " (" + user_text(st.st_uid) + ", mode " + mode_text(st.st_mode) + ")");
  }
}

// The daemon's directory, as a program here would find it.
std::string check_runtime_dir(Report& r) {
  if (use_system_daemon()) {
    const std::string dir = system_dir();
    if (int e = check_system_dir(dir)) {
      r.line(Verdict::Fail, "system directory", dir + ": " + std::strerror(e) +
             " (must be a directory of root's that nobody else may write)", "as root: softverbsd --system makes it");
    } else {
      r.line(Verdict::Ok, "system directory", dir + " (SOFTVERBS_SYSTEM=1: the host-wide daemon's)");
    }
    return dir;
  }
  const std::string dir = resolve_runtime_dir();
  const std::string base = runtime_base_dir();
  if (!runtime_dir_explicit() && dir != base) check_dir(r, "runtime directory (base)", base);
  check_dir(r, runtime_dir_explicit() ? "runtime directory (SOFTVERBS_DIR)" : "runtime directory", dir);
  return dir;
}

// ---- The daemon ------------------------------------------------------------

struct DaemonFacts {
  bool reachable = false;
  pid_t pid = 0;  // as this process's pid namespace names it (0: none)
};

// The daemon's pid and user namespaces against this process's; false if
// the daemon will refuse this process (another pid namespace).
bool check_daemon_namespaces(Report& r, const std::string& sock, const PeerCred& cred) {
  NetnsId mine{}, its{};
  const std::string fix = "run the program in the daemon's pid namespace, or give it a daemon of its own: "
                          "export SOFTVERBS_DIR=$(mktemp -d)";
  if (cred.pid == 0) {
    r.line(Verdict::Fail, "daemon pid namespace", "the daemon at " + sock + " is in another pid namespace (SO_PEERCRED "
           "gives pid 0: one this process cannot see); a daemon serves only processes of its own", fix);
    return false;
  } else if (!ns_of("/proc/self/ns/pid", &mine) || !ns_of("/proc/" + std::to_string(cred.pid) + "/ns/pid", &its)) {
    r.line(Verdict::Warn, "daemon pid namespace", "pid " + std::to_string(cred.pid) + "'s namespace is not readable");
  } else if (!(mine == its)) {
    r.line(Verdict::Fail, "daemon pid namespace", "the daemon (pid " + std::to_string(cred.pid) + " here) is in " +
           ns_text("pid", its) + ", this process in " + ns_text("pid", mine) + "; a daemon serves only processes "
           "of its own", fix);
    return false;
  } else {
    r.line(Verdict::Ok, "daemon pid namespace", "the same as this process's, " + ns_text("pid", mine) + " (daemon pid " +
           std::to_string(cred.pid) + ")");
  }
  if (!ns_of("/proc/self/ns/user", &mine) || !ns_of("/proc/" + std::to_string(cred.pid) + "/ns/user", &its)) {
    r.line(Verdict::Warn, "daemon user namespace", "pid " + std::to_string(cred.pid) + "'s namespace is not readable");
  } else {
    r.line(Verdict::Ok, "daemon user namespace",
           mine == its ? "the same as this process's, " + ns_text("user", mine)
                       : ns_text("user", its) + ", this process's is " + ns_text("user", mine) +
                             " (as under softverbs run: the uid decides, capabilities of a user namespace count "
                             "for nothing)");
  }
  return true;
}

// One request and its reply of `rep_len` bytes; false if none came.
bool ask(int s, const void* req, size_t req_len, void* rep, size_t rep_len) {
  std::vector<Fd> fds;
  size_t len = 0;
  return send_message(s, req, req_len, {}) == 0 && recv_message(s, rep, rep_len, &len, fds) == 0 && len == rep_len;
}

DaemonFacts check_daemon(Report& r, const std::string& dir) {
  DaemonFacts f;
  const std::string sock = socket_path(dir);
  Fd s;
  if (int e = connect_seqpacket(sock, s)) {
    const bool absent = e == ENOENT || e == ECONNREFUSED;
    r.line(absent ? Verdict::Warn : Verdict::Fail, "daemon",
           "none answers at " + sock + " (" + std::strerror(e) + ")" +
               (absent ? "; it starts with the first program run under softverbs run" : ""),
           absent ? "" : "check " + dir + "'s owner and mode (above)");
    return f;
  }
  f.reachable = true;
  timeval tv{5, 0};
  ::setsockopt(s.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  PeerCred cred{};
  if (peer_credentials(s.get(), cred) == 0) {
    f.pid = cred.pid;
    if (!use_system_daemon() && cred.uid != ::getuid())
      r.line(Verdict::Fail, "daemon user", "the daemon at " + sock + " runs as " + user_text(cred.uid) + ", not you",
             "use a directory of your own: export SOFTVERBS_DIR=$(mktemp -d)");
    if (!check_daemon_namespaces(r, sock, cred)) return f;  // it answers nothing to this process
  }
  proto::Empty req{};
  proto::init_header(req, proto::Op::Status, 1);
  proto::StatusReply rep{};
  if (!ask(s.get(), &req, sizeof req, &rep, sizeof rep) || rep.h.status) {
    // The daemon says why in its log: its last line.
    std::string log = read_text(dir + "/daemon.log");
    while (!log.empty() && log.back() == '\n') log.pop_back();
    log = log.substr(log.rfind('\n') == std::string::npos ? 0 : log.rfind('\n') + 1);
    r.line(Verdict::Fail, "daemon", "the daemon at " + sock + " refused this process (" +
           (log.empty() ? "see " + dir + "/daemon.log" : dir + "/daemon.log: " + log) + ")",
           f.pid ? "stop it (kill " + std::to_string(f.pid) + "): the next program starts another"
                 : "stop the daemon; the next program starts another");
    return f;
  }
  r.line(Verdict::Ok, "daemon", "softverbsd answers at " + sock + " (pid " + std::to_string(rep.daemon_pid) +
         " in its own namespace, " + std::to_string(rep.clients) + " clients)");
  proto::NetnsMsg nreq{};
  proto::init_header(nreq, proto::Op::Netns, 2);
  nreq.flags = proto::kNetnsQuery;
  proto::NetnsMsg nrep{};
  if (!ask(s.get(), &nreq, sizeof nreq, &nrep, sizeof nrep) || nrep.h.status) {
    r.line(Verdict::Warn, "daemon network namespace", "the daemon did not say which it serves");
    return f;
  }
  const NetnsId served{nrep.dev, nrep.ino};
  if (served == netns_self()) {
    r.line(Verdict::Ok, "daemon network namespace", "serves this one, " + netns_text(served));
  } else {
    r.line(Verdict::Warn, "daemon network namespace",
           "serves " + netns_text(served) + ", not this one (" + netns_text(netns_self()) +
               "): its GIDs and UDP 4791 are that namespace's",
           "unset SOFTVERBS_DIR: a program of this namespace then gets this namespace's own daemon");
  }
  return f;
}

// ---- RLIMIT_MEMLOCK --------------------------------------------------------

// CAP_IPC_LOCK in the effective set, in the initial user namespace (where
// the daemon counts it, as the kernel's capable() does): beyond the limit
// it still lets registrations through. The initial namespace as the daemon
// takes it (src/daemon/identity.cc): pid 1's, or its own where pid 1's is
// not readable.
bool has_initial_ipc_lock() {
  const std::string status = read_text("/proc/self/status");
  const size_t at = status.find("CapEff:");
  if (at == std::string::npos) return false;
  const unsigned long long eff = std::strtoull(status.c_str() + at + 7, nullptr, 16);
  NetnsId mine{}, init{};
  if (!ns_of("/proc/self/ns/user", &mine)) return false;
  if (!ns_of("/proc/1/ns/user", &init)) init = mine;
  return (eff >> 14 & 1) && mine == init;
}

std::string bytes_text(rlim_t v) {
  if (v == RLIM_INFINITY) return "unlimited";
  return std::to_string(v) + " bytes (ulimit -l " + std::to_string(v / 1024) + ")";
}

void check_memlock(Report& r, uint64_t need) {
  rlimit lim{};
  if (::getrlimit(RLIMIT_MEMLOCK, &lim) != 0) {
    r.line(Verdict::Warn, "RLIMIT_MEMLOCK", std::string("getrlimit: ") + std::strerror(errno));
    return;
  }
  const std::string need_text = std::to_string(need) + " bytes";
  if (lim.rlim_cur == RLIM_INFINITY || lim.rlim_cur >= need) {
    r.line(Verdict::Ok, "RLIMIT_MEMLOCK", bytes_text(lim.rlim_cur) + ", at least the " + need_text +
           " registrations are taken to need (--memlock BYTES)");
    return;
  }
  if (has_initial_ipc_lock()) {
    r.line(Verdict::Ok, "RLIMIT_MEMLOCK", bytes_text(lim.rlim_cur) + ", below " + need_text +
           ", but CAP_IPC_LOCK lets registrations go beyond it");
    return;
  }
  const unsigned long long kib = (need + 1023) / 1024;
  std::string fix = "raise it to at least " + std::to_string(kib) + " KiB: ulimit -l " + std::to_string(kib);
  if (lim.rlim_max != RLIM_INFINITY && lim.rlim_max < need)
    fix += " (the hard limit, " + std::to_string(lim.rlim_max / 1024) + " KiB, needs root to raise)";
  fix += "; for good: '* - memlock " + std::to_string(kib) + "' in /etc/security/limits.conf, LimitMEMLOCK=" +
         std::to_string(kib) + "K in a systemd unit, podman run --ulimit memlock=" + std::to_string(need);
  r.line(Verdict::Fail, "RLIMIT_MEMLOCK", bytes_text(lim.rlim_cur) + " is below the " + need_text +
         " registrations are taken to need: registrations are charged to it, as the kernel charges pinned pages, "
         "and fail with ENOMEM beyond it", fix);
}

// ---- UDP 4791 --------------------------------------------------------------

void check_port(Report& r, const std::string& dir, const DaemonFacts& d) {
  const PortHolder h = find_udp_port_holder(kRocePort);
  const char* what = "UDP 4791 (RoCEv2)";
  if (!h.bound) {
    r.line(Verdict::Ok, what, "free in this network namespace (the daemon takes it for QPs to other hosts)");
    return;
  }
  const bool ours = (d.pid != 0 && h.pid == d.pid) ||
                    (h.comm == "softverbsd" && !h.softverbs_dir.empty() && real_path(h.softverbs_dir) == real_path(dir));
  if (ours) {
    r.line(Verdict::Ok, what, "held by this daemon (pid " + std::to_string(h.pid) + ")");
    return;
  }
  std::string fix;
  if (!h.softverbs_dir.empty())
    fix = "share that daemon (export SOFTVERBS_DIR=" + h.softverbs_dir + ") or stop it (kill " + std::to_string(h.pid) + ")";
  else if (h.pid)
    fix = "stop it (kill " + std::to_string(h.pid) + "), or run softverbs in a network namespace of its own";
  else
    fix = "the kernel's rxe: rdma link delete; another user's program: have it stopped, or use the system daemon";
  r.line(Verdict::Fail, what, "held by " + describe(h) + ": QPs on this host work, QPs to other hosts fail in "
         "ibv_modify_qp", fix);
}

// ---- The device view -------------------------------------------------------

std::string capture(const std::vector<std::string>& args, bool with_stderr = false);

// Whether this process runs under `softverbs run`: softverbs' library
// directory first on LD_LIBRARY_PATH, as run puts it.
bool under_run(const DoctorPaths& p) {
  const char* ld = std::getenv("LD_LIBRARY_PATH");
  if (!ld || !*ld) return false;
  std::string first(ld);
  first = first.substr(0, first.find(':'));
  return real_path(first) == real_path(p.lib_dir);
}

// Outside `softverbs run`: whether run can show the view (it needs a mount
// namespace: root, or unprivileged user namespaces).
void check_run_view(Report& r, const DoctorPaths& p) {
  const std::string node = std::string("/dev/infiniband/") + dev::kUverbsName;
  const std::string sys = std::string("/sys/class/infiniband/") + dev::kName;
  std::string out = capture({p.tool, "run", "--", "sh", "-c",
                             "test -c " + node + " && test -d " + sys + " && echo view-ok"}, true);
  if (out.find("view-ok") != std::string::npos) {
    r.line(Verdict::Ok, "view under softverbs run", node + " and " + sys + " are there");
    return;
  }
  while (!out.empty() && out.back() == '\n') out.pop_back();
  r.line(Verdict::Warn, "view under softverbs run", "softverbs run shows no " + node + " or " + sys + " (" +
         (out.empty() ? std::string("no reason given") : out) + "): programs that look for them (UCX, ibstat) "
         "do not find the device", "allow unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1, "
         "user.max_user_namespaces), or softverbs enable for the node");
}

void check_view(Report& r, bool in_run) {
  const std::string node = std::string("/dev/infiniband/") + dev::kUverbsName;
  const std::string sys = std::string("/sys/class/infiniband/") + dev::kName;
  const std::string absent_fix = in_run ? "softverbs run's warning says why it made no view (it needs unprivileged "
                                          "user namespaces or root; --no-view leaves it out)"
                                        : "";
  const std::string absent_why = in_run ? " under softverbs run" : " (programs see it under softverbs run)";
  struct stat st {};
  if (::stat(node.c_str(), &st) != 0) {
    r.line(in_run ? Verdict::Fail : Verdict::Warn, "device node", node + " absent" + absent_why, absent_fix);
  } else if (!S_ISCHR(st.st_mode)) {
    r.line(Verdict::Warn, "device node", node + " is not a character device");
  } else {
    const bool null = major(st.st_rdev) == 1 && minor(st.st_rdev) == 3;
    r.line(Verdict::Ok, "device node", node + " (" + std::to_string(major(st.st_rdev)) + ":" +
           std::to_string(minor(st.st_rdev)) + (null ? ", softverbs': /dev/null's numbers)" : ", a kernel driver's)"));
  }
  if (::stat(sys.c_str(), &st) != 0) {
    r.line(in_run ? Verdict::Fail : Verdict::Warn, "sysfs device", sys + " absent" + absent_why, absent_fix);
    return;
  }
  std::string fw = read_text(sys + "/fw_ver", 256);
  while (!fw.empty() && fw.back() == '\n') fw.pop_back();
  if (fw.rfind("softverbs", 0) == 0)
    r.line(Verdict::Ok, "sysfs device", sys + " (firmware " + fw + ")");
  else
    r.line(Verdict::Warn, "sysfs device", sys + " is not softverbs' (fw_ver '" + fw + "')");
}

// ---- CDI specs -------------------------------------------------------------

// A domain directory a spec mounts: a trust domain's (0700, one owner) or
// a users' domain's (root's, 0755: a system daemon's).
void check_domain_dir(Report& r, const std::string& name, const std::string& dir, bool users) {
  struct stat st {};
  const std::string what = std::string(users ? "CDI users' domain " : "CDI domain ") + name;
  if (::lstat(dir.c_str(), &st) != 0) {
    r.line(Verdict::Fail, what, dir + ": " + std::strerror(errno), "make it again: sudo softverbs cdi " +
           std::string(users ? "--users-domain " : "--domain ") + name + " ... --output FILE");
    return;
  }
  const std::string got = dir + " (" + user_text(st.st_uid) + ", mode " + mode_text(st.st_mode) + ")";
  if (!S_ISDIR(st.st_mode)) {
    r.line(Verdict::Fail, what, dir + " is not a directory", "rm it and run softverbs cdi again");
  } else if (users && (st.st_uid != 0 || (st.st_mode & 0777) != 0755)) {
    r.line(Verdict::Fail, what, got + ": a users' domain's directory must be root's, mode 0755",
           "chown root " + dir + " && chmod 0755 " + dir);
  } else if (!users && (st.st_mode & 0077)) {
    r.line(Verdict::Fail, what, got + ": a domain's directory must be 0700", "chmod 0700 " + dir);
  } else {
    r.line(Verdict::Ok, what, got + (users ? ", a system daemon's" : ", the domain's processes run as its owner"));
  }
}

// Each string value of `"key": "VALUE"` in a JSON text, with the offset of
// its key: enough of JSON for the specs softverbs writes (no escapes in
// the names and paths it puts there).
std::vector<std::pair<std::string, size_t>> json_values(const std::string& text, const std::string& key) {
  std::vector<std::pair<std::string, size_t>> out;
  const std::string pat = "\"" + key + "\":";
  for (size_t at = text.find(pat); at != std::string::npos; at = text.find(pat, at + pat.size())) {
    size_t p = at + pat.size();
    while (p < text.size() && std::isspace(static_cast<unsigned char>(text[p]))) ++p;
    if (p >= text.size() || text[p] != '"') continue;
    const size_t end = text.find('"', p + 1);
    if (end == std::string::npos) break;
    out.emplace_back(text.substr(p + 1, end - p - 1), at);
  }
  return out;
}

// One spec file: its kind, devices, the host files it mounts and the domains' directories.
void check_cdi_spec(Report& r, const std::string& file, const std::string& text) {
  const auto kinds = json_values(text, "kind");
  const std::string kind = kinds.empty() ? "?" : kinds.front().first;
  const auto devices = json_values(text, "name");  // name, offset of its entry
  struct stat st {};
  ::stat(file.c_str(), &st);
  std::string names;
  for (auto& d : devices) names += (names.empty() ? "" : ", ") + d.first;
  r.line(Verdict::Ok, "CDI spec", file + ": kind " + kind + ", devices " + (names.empty() ? "none" : names) + " (" +
         user_text(st.st_uid) + ", mode " + mode_text(st.st_mode) + ")");
  for (size_t i = 0; i < devices.size(); ++i) {
    const size_t end = i + 1 < devices.size() ? devices[i + 1].second : text.size();
    const std::string entry = text.substr(devices[i].second, end - devices[i].second);
    const bool users = entry.find("SOFTVERBS_SYSTEM=1") != std::string::npos;
    const auto hosts = json_values(entry, "hostPath");
    const auto ins = json_values(entry, "containerPath");
    for (const auto& [host, at] : hosts) {
      // Its containerPath: the first one after it.
      auto in_it = std::find_if(ins.begin(), ins.end(), [at = at](const auto& c) { return c.second > at; });
      if (in_it == ins.end()) continue;
      const std::string& in = in_it->first;
      if (in == "/run/softverbs-domain") {
        check_domain_dir(r, devices[i].first, host, users);
      } else if (::access(host.c_str(), F_OK) != 0) {
        r.line(Verdict::Fail, "CDI spec", file + " mounts " + host + " (at " + in + "), which does not exist: moved "
               "or upgraded since the spec was written", "write it again: sudo softverbs cdi --output " + file +
               " (with its --domain options)");
      }
    }
  }
}

void check_cdi(Report& r) {
  int found = 0;
  for (const char* dir : {"/etc/cdi", "/var/run/cdi"}) {
    DIR* d = ::opendir(dir);
    if (!d) continue;
    std::vector<std::string> files;
    while (dirent* e = ::readdir(d)) {
      const std::string n = e->d_name;
      auto ends = [&](const char* x) { return n.size() > std::strlen(x) && n.rfind(x) == n.size() - std::strlen(x); };
      if (ends(".json") || ends(".yaml") || ends(".yml")) files.push_back(std::string(dir) + "/" + n);
    }
    ::closedir(d);
    for (const std::string& f : files) {
      const std::string text = read_text(f);
      if (text.find("/opt/softverbs/") == std::string::npos) continue;  // not a softverbs spec
      found++;
      check_cdi_spec(r, f, text);
    }
  }
  if (!found)
    r.line(Verdict::Warn, "CDI spec", "no softverbs spec in /etc/cdi or /var/run/cdi (only containers need one)",
           "sudo softverbs cdi --output /etc/cdi/softverbs.json");
}

// ---- The library a verbs program loads -------------------------------------

std::string find_program(const std::string& prog) {
  if (prog.find('/') != std::string::npos) return ::access(prog.c_str(), X_OK) == 0 ? prog : "";
  const char* path = std::getenv("PATH");
  std::string p = path ? path : "/usr/bin:/bin";
  size_t pos = 0;
  while (pos <= p.size()) {
    size_t end = p.find(':', pos);
    if (end == std::string::npos) end = p.size();
    const std::string cand = (end > pos ? p.substr(pos, end - pos) : ".") + "/" + prog;
    if (::access(cand.c_str(), X_OK) == 0) return cand;
    pos = end + 1;
  }
  return "";
}

// The standard output of `argv` (and its standard error if `with_stderr`,
// else /dev/null), run with stdin on /dev/null.
std::string capture(const std::vector<std::string>& args, bool with_stderr) {
  int pipefd[2];
  if (::pipe2(pipefd, O_CLOEXEC) != 0) return {};
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int null = ::open("/dev/null", O_RDWR);
    ::dup2(null, 0);
    ::dup2(with_stderr ? pipefd[1] : null, 2);
    ::dup2(pipefd[1], 1);
    std::vector<char*> av;
    for (auto& a : args) av.push_back(const_cast<char*>(a.c_str()));
    av.push_back(nullptr);
    ::execvp(av[0], av.data());
    ::_exit(127);
  }
  ::close(pipefd[1]);
  std::string out;
  char buf[4096];
  ssize_t n;
  while (pid > 0 && (n = ::read(pipefd[0], buf, sizeof buf)) != 0) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    out.append(buf, size_t(n));
  }
  ::close(pipefd[0]);
  int st = 0;
  while (pid > 0 && ::waitpid(pid, &st, 0) < 0 && errno == EINTR) {
  }
  return out;
}

// ldd(1)'s answer for libibverbs.so.1: its path, "not found", or "" if the
// program does not link it.
std::string resolved_libibverbs(const std::string& ldd_out) {
  const size_t at = ldd_out.find("libibverbs.so.1 =>");
  if (at == std::string::npos) return "";
  size_t start = ldd_out.find_first_not_of(" \t", at + std::strlen("libibverbs.so.1 =>"));
  if (start == std::string::npos) return "";
  const size_t end = ldd_out.find_first_of(" \t\n", start);
  std::string path = ldd_out.substr(start, end - start);
  return path == "not" ? "not found" : path;
}

void check_library(Report& r, const DoctorPaths& p, const std::string& prog, bool in_run) {
  const std::string ours = real_path(p.lib_dir);
  if (::access((p.lib_dir + "/libibverbs.so.1").c_str(), R_OK) != 0) {
    r.line(Verdict::Fail, "library", "no libibverbs.so.1 in " + p.lib_dir, "set SOFTVERBS_LIB to softverbs' library "
           "directory, or install softverbs again");
    return;
  }
  const std::string path = find_program(prog);
  if (path.empty()) {
    r.line(Verdict::Warn, "library", prog + " not found (on PATH)", prog == "ibv_devinfo"
           ? "apt install ibverbs-utils, or name a verbs program: softverbs doctor --program PROGRAM" : "");
    return;
  }
  auto whose = [&](const std::string& lib) {
    if (lib == "not found") return std::string("none (not found)");
    const std::string real = real_path(lib);
    const std::string dir = real.substr(0, real.rfind('/'));
    return lib + (dir == ours ? " (softverbs')" : " (the system's)");
  };
  const std::string under = resolved_libibverbs(capture({p.tool, "run", "--no-view", "--", "ldd", path}));
  const std::string now = resolved_libibverbs(capture({"ldd", path}));
  if (under.empty() && now.empty()) {
    r.line(Verdict::Warn, "library", path + " does not link libibverbs.so.1 (ldd): a static or dlopen()ing "
           "program is not checked", "name another: softverbs doctor --program PROGRAM");
    return;
  }
  const bool under_ours = under != "not found" && real_path(under).rfind(ours + "/", 0) == 0;
  if (under_ours) {
    r.line(Verdict::Ok, "library under softverbs run", path + " loads " + whose(under));
  } else {
    r.line(Verdict::Fail, "library under softverbs run", path + " loads " + whose(under) + ", not softverbs' from " +
           ours, "the program's RPATH, or a setuid program, overrides LD_LIBRARY_PATH: rebuild it without, or "
           "use softverbs enable");
  }
  const bool now_ours = now != "not found" && real_path(now).rfind(ours + "/", 0) == 0;
  const char* what = in_run ? "library here (under softverbs run)" : "library outside softverbs run";
  if (now == "not found")
    r.line(Verdict::Warn, what, path + " finds no libibverbs.so.1", "run it as softverbs run " + prog);
  else
    r.line(Verdict::Ok, what, path + " loads " + whose(now) + (now_ours ? "" : ": run it as softverbs run " + prog +
           " (or softverbs enable: every program, no wrapper)"));
}

constexpr const char* kUsage =
    "usage: softverbs doctor [--program PROGRAM] [--memlock BYTES]\n"
    "  checks what softverbs needs here, one line each: ok, warn or FAIL, and the fix:\n"
    "  the runtime directory, the daemon (its pid, user and network namespaces),\n"
    "  RLIMIT_MEMLOCK, UDP 4791, /dev/infiniband and /sys/class/infiniband, the CDI\n"
    "  specs, and which libibverbs.so.1 PROGRAM (default ibv_devinfo) loads.\n"
    "  --memlock: what registrations will need (default 8 MiB)\n"
    "  Exit status 0 when no check failed (warnings allowed), else 1.\n";

}  // namespace

int doctor_main(int argc, char** argv, const DoctorPaths& paths) {
  std::string program = "ibv_devinfo";
  uint64_t need = kDefaultMemlockNeed;
  for (int i = 0; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (a == "--program" && i + 1 < argc) {
      program = argv[++i];
    } else if (a == "--memlock" && i + 1 < argc) {
      char* end = nullptr;
      errno = 0;
      need = std::strtoull(argv[++i], &end, 10);
      if (errno || !end || *end || argv[i][0] == '-' || !argv[i][0]) {
        std::fprintf(stderr, "softverbs doctor: --memlock %s: a number of bytes, e.g. --memlock 8388608\n", argv[i]);
        return 2;
      }
    } else {
      std::fprintf(stderr, "softverbs doctor: unexpected argument '%s'; try 'softverbs doctor --help'\n", a.c_str());
      return 2;
    }
  }
  Report r;
  const bool in_run = under_run(paths);
  const std::string dir = check_runtime_dir(r);
  const DaemonFacts d = check_daemon(r, dir);
  check_memlock(r, need);
  check_port(r, dir, d);
  check_view(r, in_run);
  if (!in_run) check_run_view(r, paths);
  check_cdi(r);
  check_library(r, paths, program, in_run);
  if (r.failures)
    std::printf("softverbs doctor: %d check%s failed (FAIL above, each with its fix)\n", r.failures,
                r.failures == 1 ? "" : "s");
  else
    std::printf("softverbs doctor: no check failed%s\n", r.warnings ? " (warnings above)" : "");
  return r.failures ? 1 : 0;
}

}  // namespace sv::tools
