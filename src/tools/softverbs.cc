// softverbs: run a program on the softverbs device, or ask the daemon how it is.
//
//   softverbs run [--no-view] [--] CMD [ARGS...]
//                                      run CMD with softverbs' libibverbs.so.1 first,
//                                      seeing /dev/infiniband/uverbs0 and /sys/class/infiniband/sv0
//   softverbs status                   objects the daemon holds
//   softverbs ls                       names published in the daemon's namespace
//   softverbs doctor [--program P] [--memlock BYTES]  checks the set-up, one line each (tools/doctor.h)
//   softverbs enable [--force]         every program on the machine gets softverbs (root)
//   softverbs disable                  undoes enable (root)
//   softverbs -h|--help, --version
// With SOFTVERBS_SYSTEM=1, status and ls ask the host-wide daemon.
// Usage errors exit 2 with one line that says what to do next (as the man
// page softverbs(1) describes).
#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "common/paths.h"
#include "tools/capture.h"
#include "tools/cdi.h"
#include "tools/doctor.h"
#include "tools/hw_counters.h"
#include "tools/oci_hook.h"
#include "tools/status_counters.h"
#include "common/protocol.h"
#include "common/device_info.h"
#include "common/sys.h"
#include "tools/view_ns.h"

namespace {

std::string self_dir() {
  char buf[PATH_MAX];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return ".";
  buf[n] = 0;
  std::string p(buf);
  return p.substr(0, p.rfind('/'));
}

bool has_library(const std::string& dir) { return ::access((dir + "/libibverbs.so.1").c_str(), R_OK) == 0; }

// Where softverbs' libibverbs.so.1 and librdmacm.so.1 are: $SOFTVERBS_LIB,
// else the installed private directory relative to this binary
// (SOFTVERBS_BIN_TO_LIB, from the install layout: DESTDIR and moved
// prefixes keep working), else the build tree's bin/../lib.
std::string library_dir() {
  if (const char* l = std::getenv("SOFTVERBS_LIB"); l && *l) return l;
  std::string self = self_dir();
#ifdef SOFTVERBS_BIN_TO_LIB
  if (std::string installed = self + "/" SOFTVERBS_BIN_TO_LIB; has_library(installed)) return installed;
#endif
  return self + "/../lib";
}

// What `softverbs cdi` mounts into a container: this installation's files.
sv::tools::CdiPaths cdi_paths() {
  sv::tools::CdiPaths p;
  p.lib_dir = library_dir();
  if (char* r = ::realpath(p.lib_dir.c_str(), nullptr)) {
    p.lib_dir = r;
    std::free(r);
  }
  const char* d = std::getenv("SOFTVERBSD");
  p.daemon = d && *d ? d : self_dir() + "/softverbsd";
  p.tool = self_dir() + "/softverbs";
  return p;
}

// The RDMA netlink stand-in's shim, beside the libraries (src/nldev/preload.c).
constexpr const char* kNetlinkShim = "libsoftverbs_netlink.so";

// The machine-wide mode's file (softverbs enable, below).
constexpr const char* kLdConf = "/etc/ld.so.conf.d/00-softverbs.conf";

constexpr const char* kRunUsage =
    "usage: softverbs run [--no-view] [--] CMD [ARGS...]\n"
    "  runs CMD with softverbs' libibverbs.so.1 and librdmacm.so.1 first on LD_LIBRARY_PATH;\n"
    "  the daemon softverbsd starts on demand (SOFTVERBS_DIR: its directory).\n"
    "  CMD sees the device where tools look for it, in a private mount namespace:\n"
    "  /dev/infiniband/uverbs0 and /sys/class/infiniband/sv0, and RDMA netlink answers\n"
    "  for iproute2's `rdma` (LD_PRELOAD: libsoftverbs_netlink.so) (--no-view: none of these)\n";

// The device view (tools/view_ns.h); if the namespace cannot be made, one
// warning and the program runs without it.
void enter_view_or_warn() {
  std::string why;
  if (sv::view::enter_view(why) == 0) return;
  std::fprintf(stderr,
               "softverbs run: warning: no device view (%s); the program runs without /dev/infiniband/%s and "
               "/sys/class/infiniband/%s (--no-view: do not try)\n",
               why.c_str(), sv::dev::kUverbsName, sv::dev::kName);
}

// As another user than root, the view is a user namespace as well
// (tools/view_ns.h), and a daemon started from inside it (the library
// starts it with the program's first ibv_open_device) would live in it for
// its idle time, serving the next programs from there: programs of sibling
// namespaces (another `softverbs run`) and of none (a program started
// without it), which it has no ptrace access to, and whose users it would
// see through the namespace's uid map. So the daemon is started first,
// outside: a child process loads the library (LIB) and opens the device
// once, as the program will, which starts the daemon of the directory the
// program will use (common/paths.h) if none answers there (not with
// SOFTVERBS_NO_SPAWN, where the library starts none). Best effort and
// silent: the program says what goes wrong when it opens the device.
void start_daemon_outside_view(const std::string& lib) {
  const pid_t child = ::fork();
  if (child < 0) return;
  if (child == 0) {
    sv::Fd null(::open("/dev/null", O_WRONLY | O_CLOEXEC));
    if (null.valid()) ::dup2(null.get(), STDERR_FILENO);
    void* h = ::dlopen((lib + "/libibverbs.so.1").c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!h) ::_exit(1);
    using GetList = void** (*)(int*);
    using Open = void* (*)(void*);
    using Close = int (*)(void*);
    auto get_list = reinterpret_cast<GetList>(::dlsym(h, "ibv_get_device_list"));
    auto open_device = reinterpret_cast<Open>(::dlsym(h, "ibv_open_device"));
    auto close_device = reinterpret_cast<Close>(::dlsym(h, "ibv_close_device"));
    if (!get_list || !open_device || !close_device) ::_exit(1);
    int n = 0;
    void** list = get_list(&n);
    void* ctx = list && n > 0 ? open_device(list[0]) : nullptr;
    if (ctx) close_device(ctx);
    ::_exit(ctx ? 0 : 1);
  }
  // A daemon starts in milliseconds; one that does not start within 3 s
  // is the program's to wait for and report (the library waits 10 s).
  int status = 0;
  for (int i = 0; i < 1500; ++i) {
    if (::waitpid(child, &status, WNOHANG) != 0) return;
    ::usleep(2000);
  }
  ::kill(child, SIGKILL);
  while (::waitpid(child, &status, 0) < 0 && errno == EINTR) {
  }
}

// The RDMA netlink stand-in (src/nldev/): its shim first on LD_PRELOAD, so
// that iproute2's `rdma` finds sv0 as on a kernel with the device. Without
// the shim beside the libraries, one warning.
void preload_netlink(const std::string& lib) {
  const std::string shim = lib + "/" + kNetlinkShim;
  if (::access(shim.c_str(), R_OK) != 0) {
    std::fprintf(stderr, "softverbs run: warning: no %s in %s; `rdma` will not see %s\n", kNetlinkShim, lib.c_str(),
                 sv::dev::kName);
    return;
  }
  std::string v = shim;
  if (const char* old = std::getenv("LD_PRELOAD"); old && *old) v.append(":").append(old);
  ::setenv("LD_PRELOAD", v.c_str(), 1);
#if defined(__SANITIZE_ADDRESS__)
  // An ASan build of this tool runs ASan builds of the project's programs,
  // whose runtime refuses to come after a preloaded library; the shim has
  // none of ASan's interceptors to clash with.
  std::string asan = "verify_asan_link_order=0";
  if (const char* old = std::getenv("ASAN_OPTIONS"); old && *old) asan = std::string(old) + ":" + asan;
  ::setenv("ASAN_OPTIONS", asan.c_str(), 1);
#endif
}

std::string daemon_dir();
int connect_daemon(const std::string& dir, sv::Fd& s);

// The view's port counter files (ports/1/hw_counters), kept up to date
// while the program runs (tools/hw_counters.h), when this process made a
// view it may write.
void refresh_view_counters() {
  const std::string port_dir = std::string("/sys/class/infiniband/") + sv::dev::kName + "/ports/1";
  if (::access((port_dir + "/hw_counters").c_str(), W_OK) != 0) return;
  sv::tools::start_hw_counters_refresh(port_dir, daemon_dir(),
                                       [](sv::Fd& s) { return connect_daemon(daemon_dir(), s); });
}

int run(int argc, char** argv) {
  if (argc > 0 && (std::strcmp(argv[0], "-h") == 0 || std::strcmp(argv[0], "--help") == 0)) {
    std::fputs(kRunUsage, stdout);
    return 0;
  }
  bool view = true;
  if (argc > 0 && std::strcmp(argv[0], "--no-view") == 0) {
    view = false;
    argv++;
    argc--;
  }
  if (argc > 0 && std::strcmp(argv[0], "--") == 0) {
    argv++;
    argc--;
  }
  if (argc == 0) {
    std::fprintf(stderr, "softverbs run: no command to run; try 'softverbs run -- ibv_devinfo'\n");
    return 2;
  }
  std::string lib = library_dir();
  if (!has_library(lib))
    std::fprintf(stderr, "softverbs run: warning: no libibverbs.so.1 in %s; set SOFTVERBS_LIB to its directory\n",
                 lib.c_str());
  std::string path = lib;
  if (const char* old = std::getenv("LD_LIBRARY_PATH"); old && *old) path.append(":").append(old);
  ::setenv("LD_LIBRARY_PATH", path.c_str(), 1);
  if (!std::getenv("SOFTVERBSD")) ::setenv("SOFTVERBSD", (self_dir() + "/softverbsd").c_str(), 1);
  if (view) preload_netlink(lib);
  if (view && ::geteuid() != 0 && !sv::use_system_daemon() && !std::getenv("SOFTVERBS_NO_SPAWN"))
    start_daemon_outside_view(lib);
  if (view) enter_view_or_warn();
  if (view) refresh_view_counters();
  ::execvp(argv[0], argv);
  int e = errno;
  std::fprintf(stderr, "softverbs run: %s: %s%s\n", argv[0], std::strerror(e),
               e == ENOENT ? "; check the name and PATH" : e == EACCES ? "; check that it is an executable file" : "");
  return e == ENOENT ? 127 : 126;
}

// Said when no daemon answers: the per-user one starts with the first
// program that opens the device; the system one is an administrator's.
const char* const kNoDaemonHint =
    "it starts with the first program run under 'softverbs run' (or, with SOFTVERBS_SYSTEM=1, "
    "as root: softverbsd --system)";

std::string daemon_dir() { return sv::use_system_daemon() ? sv::system_dir() : sv::resolve_runtime_dir(); }

// Connects to the daemon of `dir` through the directory, once it is open
// and checked (common/paths.h); a directory refused says why on stderr.
int connect_daemon(const std::string& dir, sv::Fd& s) {
  sv::RunDir d;
  std::string why;
  const auto rule = sv::use_system_daemon() ? sv::DirRule::SystemClient : sv::DirRule::User;
  if (int e = sv::open_dir(dir, rule, false, d, &why)) {
    if (e != ENOENT) std::fprintf(stderr, "softverbs: %s\n", why.c_str());
    return e;
  }
  return sv::connect_in(d, s);
}

const char* kind_name(uint32_t k) {
  switch (k) {
    case sv::proto::kNsPd: return "pd";
    case sv::proto::kNsMr: return "mr";
    case sv::proto::kNsCq: return "cq";
    case sv::proto::kNsQp: return "qp";
    case sv::proto::kNsSrq: return "srq";
    case sv::proto::kNsChannel: return "channel";
    default: return "?";
  }
}

// Like `ls -l`: mode, owner, group, kind, handle, name.
int list_names() {
  std::string dir = daemon_dir();
  sv::Fd s;
  if (int e = connect_daemon(dir, s)) {
    std::fprintf(stderr, "softverbs ls: no daemon at %s: %s; %s\n", sv::socket_path(dir).c_str(), std::strerror(e),
                 kNoDaemonHint);
    return 1;
  }
  std::string after;  // the last name shown: the next page starts after it
  for (uint32_t seq = 1;; ++seq) {
    sv::proto::NsListReq req{};
    sv::proto::init_header(req, sv::proto::Op::NsList, seq);
    std::memcpy(req.after, after.data(), std::min(after.size(), sizeof(req.after) - 1));
    sv::proto::NsListReply rep{};
    std::vector<sv::Fd> fds;
    size_t len = 0;
    if (sv::send_message(s.get(), &req, sizeof(req), {}) != 0 ||
        sv::recv_message(s.get(), &rep, sizeof(rep), &len, fds) != 0 || len != sizeof(rep) || rep.h.status ||
        rep.count > sv::proto::kNsListPage) {
      std::fprintf(stderr, "softverbs ls: bad reply from the daemon; see %s/daemon.log\n", dir.c_str());
      return 1;
    }
    for (uint32_t i = 0; i < rep.count; ++i) {
      const auto& e = rep.entries[i];
      char perm[10];
      for (int b = 0; b < 9; ++b) perm[b] = (e.mode >> (8 - b)) & 1 ? "rwxrwxrwx"[b] : '-';
      perm[9] = 0;
      std::string name(e.name, ::strnlen(e.name, sizeof(e.name)));
      std::printf("%s %6u %6u %-3s %8u %s\n", perm, e.uid, e.gid, kind_name(e.kind), e.handle, name.c_str());
      after = name;
    }
    if (rep.count < sv::proto::kNsListPage) return 0;
  }
}

// A string as a JSON string's contents (RFC 8259, 7).
std::string json_escape(const std::string& s) {
  std::string o;
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    if (c < 0x20) {
      char b[8];
      std::snprintf(b, sizeof b, "\\u%04x", c);
      o += b;
    } else {
      o += char(c);
    }
  }
  return o;
}

// `softverbs status --json`: the daemon's facts and the counters
// (status_counters.h; docs/LAB.md for the schema) on stdout.
int status_json(int sock, const sv::proto::StatusReply& rep, const std::string& dir) {
  sv::counters::Snapshot snap;
  uint32_t seq = 10;
  if (int e = sv::tools::fetch_counters(sock, seq, snap)) {
    std::fprintf(stderr, "softverbs status: the daemon's counters: %s; see %s/daemon.log\n", std::strerror(e),
                 dir.c_str());
    return 1;
  }
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "\"pid\": %u, \"clients\": %u, \"pds\": %u, \"mrs\": %u, \"cqs\": %u, \"qps\": %u, "
                "\"system\": %s, \"dir\": \"",
                rep.daemon_pid, rep.clients, rep.pds, rep.mrs, rep.cqs, rep.qps,
                (rep.served_as & sv::proto::kServedAsSystem) ? "true" : "false");
  std::fputs(sv::tools::counters_json(snap, buf + json_escape(dir) + "\"").c_str(), stdout);
  return 0;
}

// No daemon to ask: said on stdout, or with --json on stderr (stdout is
// for the document alone); 1.
int not_running(const std::string& dir, int e, bool json) {
  if (json)
    std::fprintf(stderr, "softverbs status: no daemon at %s: %s; %s\n", sv::socket_path(dir).c_str(), std::strerror(e),
                 kNoDaemonHint);
  else
    std::printf("softverbsd: not running (%s: %s); %s\n", sv::socket_path(dir).c_str(), std::strerror(e),
                kNoDaemonHint);
  return 1;
}

int status(bool json) {
  std::string dir = daemon_dir();
  sv::Fd s;
  if (int e = connect_daemon(dir, s)) return not_running(dir, e, json);
  sv::proto::Empty req{};
  sv::proto::init_header(req, sv::proto::Op::Status, 1);
  if (int e = sv::send_message(s.get(), &req, sizeof(req), {})) {
    std::printf("softverbsd: status not sent: %s; see %s/daemon.log\n", std::strerror(e), dir.c_str());
    return 1;
  }
  sv::proto::StatusReply rep{};
  std::vector<sv::Fd> fds;
  size_t len = 0;
  if (sv::recv_message(s.get(), &rep, sizeof(rep), &len, fds) != 0 || len != sizeof(rep) || rep.h.status) {
    std::printf("softverbsd: bad status reply; see %s/daemon.log\n", dir.c_str());
    return 1;
  }
  if (json) return status_json(s.get(), rep, dir);
  sv::proto::Empty areq{};
  sv::proto::init_header(areq, sv::proto::Op::Accounts, 2);
  sv::proto::AccountsReply arep{};
  bool have_accounts = sv::send_message(s.get(), &areq, sizeof(areq), {}) == 0 &&
                       sv::recv_message(s.get(), &arep, sizeof(arep), &len, fds) == 0 && len == sizeof(arep) &&
                       arep.h.status == 0;
  std::printf("softverbsd (pid %u) at %s\n", rep.daemon_pid, dir.c_str());
  std::printf("  machine-wide mode: %s\n", ::access(kLdConf, F_OK) == 0 ? "enabled (softverbs disable undoes it)" : "off");
  // Which daemon serves: the system daemon or this user's,
  // started by systemd's socket unit or otherwise (the library, by hand).
  const bool sys = rep.served_as & sv::proto::kServedAsSystem;
  std::printf("  served by the %s, %s\n", sys ? "system daemon (every user's)" : "per-user daemon",
              (rep.served_as & sv::proto::kServedAsActivated)
                  ? (sys ? "socket-activated by systemd (softverbsd.socket)"
                         : "socket-activated by systemd --user (softverbsd.socket)")
                  : (sys ? "started by hand or by a service without its socket unit"
                         : "started on demand by the library or by hand"));
  // The network namespace it serves: its GIDs are that
  // namespace's addresses.
  sv::proto::NetnsMsg nreq{};
  sv::proto::init_header(nreq, sv::proto::Op::Netns, 3);
  nreq.flags = sv::proto::kNetnsQuery;
  sv::proto::NetnsMsg nrep{};
  if (sv::send_message(s.get(), &nreq, sizeof(nreq), {}) == 0 &&
      sv::recv_message(s.get(), &nrep, sizeof(nrep), &len, fds) == 0 && len == sizeof(nrep) && nrep.h.status == 0) {
    const sv::NetnsId served{nrep.dev, nrep.ino};
    std::printf("  network namespace %s, %s\n", sv::netns_text(served).c_str(),
                served == sv::netns_self() ? "this one" : "not this one (its GIDs are another namespace's)");
  }
  std::printf("  clients %u (this query included)\n  pds %u\n  mrs %u\n  cqs %u\n  qps %u\n  channels %u\n  backings %u\n  regions %u\n",
              rep.clients, rep.pds, rep.mrs, rep.cqs, rep.qps, rep.channels, rep.backings, rep.regions);
  if (have_accounts) {
    // The limit each process's last registration met: its RLIMIT_MEMLOCK,
    // or "unlimited" once CAP_IPC_LOCK carried a charge beyond it (the
    // capability counts only there, as in the kernel's ib_umem_get).
    std::printf("locked memory (RLIMIT_MEMLOCK charges of registrations; limit: as last applied):\n");
    std::printf("  %8s %8s %14s %14s\n", "pid", "uid", "locked", "limit");
    std::map<uint32_t, uint64_t> per_user;
    for (uint32_t i = 0; i < arep.count && i < sv::proto::kMaxAccounts; ++i) {
      const auto& a = arep.entries[i];
      char limit[32];
      if (a.limit_bytes == UINT64_MAX) std::snprintf(limit, sizeof(limit), "unlimited");
      else std::snprintf(limit, sizeof(limit), "%llu", (unsigned long long)a.limit_bytes);
      std::printf("  %8u %8u %14llu %14s\n", a.pid, a.uid, (unsigned long long)a.locked_bytes, limit);
      per_user[a.uid] += a.locked_bytes;
    }
    if (arep.others_bytes) std::printf("  (more processes: %llu bytes)\n", (unsigned long long)arep.others_bytes);
    for (auto& [uid, b] : per_user) std::printf("  user %u: %llu bytes locked\n", uid, (unsigned long long)b);
  }
  sv::counters::Snapshot snap;
  uint32_t seq = 10;
  if (int e = sv::tools::fetch_counters(s.get(), seq, snap))
    std::printf("counters: not read: %s\n", std::strerror(e));
  else
    sv::tools::print_counters(snap);
  return 0;
}

// status [--json]
int status_main(int argc, char** argv) {
  if (argc == 0) return status(false);
  if (argc == 1 && std::strcmp(argv[0], "--json") == 0) return status(true);
  if (std::strcmp(argv[0], "-h") == 0 || std::strcmp(argv[0], "--help") == 0) {
    std::printf("usage: softverbs status [--json]\n");
    return 0;
  }
  std::fprintf(stderr, "softverbs status: unexpected argument '%s'; try 'softverbs status' or 'softverbs status --json'\n",
               argv[0]);
  return 2;
}

// ---- The machine-wide mode -------------------------------------------------
//
// `softverbs enable` makes every program on the machine load softverbs'
// libibverbs.so.1 and librdmacm.so.1 with no wrapper: a file in the dynamic
// linker's configuration directory names the private library directory,
// sorted before the system's own entries (00-), and ldconfig rebuilds the
// cache, which then resolves the two sonames there first. `disable` removes
// the file and rebuilds the cache. Nothing else changes: the machine's
// rdma-core stays installed, and `softverbs run` works as before.

// The device node too: UCX and others look for
// /dev/infiniband/<dev_name> before they open a device. `enable` makes it a
// character device with /dev/null's numbers (1:3: softverbs has no kernel
// part; readers only stat and access it), and a tmpfiles.d(5) entry makes
// systemd-tmpfiles create it again at every boot (/dev is a devtmpfs).
constexpr const char* kDevDir = "/dev/infiniband";
constexpr const char* kTmpfiles = "/etc/tmpfiles.d/softverbs.conf";
constexpr const char* kWrittenBy = "# Written by 'softverbs enable'";

std::string dev_node() { return std::string(kDevDir) + "/" + sv::dev::kUverbsName; }

bool is_our_node(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0 && S_ISCHR(st.st_mode) && st.st_rdev == makedev(1, 3);
}

// 0 or an errno, with `what` saying which step failed.
int add_device_node(std::string& what) {
  const std::string node = dev_node();
  if (::mkdir(kDevDir, 0755) != 0 && errno != EEXIST) return what = kDevDir, errno;
  if (::access(node.c_str(), F_OK) != 0) {
    const mode_t old = ::umask(0);
    const int r = ::mknod(node.c_str(), S_IFCHR | 0666, makedev(1, 3));
    ::umask(old);
    if (r != 0) return what = node, errno;
  }
  std::string body = std::string(kWrittenBy) + ": softverbs' device node, for programs that look\n"
                     "# for it before they open the device (UCX). Undo with 'softverbs disable'.\n"
                     "d " + kDevDir + " 0755 root root -\n"
                     "c " + node + " 0666 root root - 1:3\n";
  std::string tmp = std::string(kTmpfiles) + ".tmp";
  ::mkdir("/etc/tmpfiles.d", 0755);
  FILE* f = std::fopen(tmp.c_str(), "w");
  if (!f || std::fputs(body.c_str(), f) < 0 || std::fclose(f) != 0 || ::chmod(tmp.c_str(), 0644) != 0 ||
      ::rename(tmp.c_str(), kTmpfiles) != 0) {
    int e = errno;
    ::unlink(tmp.c_str());
    return what = kTmpfiles, e;
  }
  return 0;
}

// Removes what add_device_node made: the node if it is ours (1:3), the
// directory if it is left empty, the tmpfiles.d entry if softverbs wrote it.
void remove_device_node() {
  if (is_our_node(dev_node())) ::unlink(dev_node().c_str());
  ::rmdir(kDevDir);  // only if empty
  if (FILE* f = std::fopen(kTmpfiles, "r")) {
    char line[128] = {};
    const bool ours = std::fgets(line, sizeof line, f) && std::strncmp(line, kWrittenBy, std::strlen(kWrittenBy)) == 0;
    std::fclose(f);
    if (ours) ::unlink(kTmpfiles);
  }
}

int run_ldconfig() {
  pid_t pid = ::fork();
  if (pid < 0) return errno;
  if (pid == 0) {
    const char* ld = ::access("/sbin/ldconfig", X_OK) == 0 ? "/sbin/ldconfig" : "ldconfig";
    ::execlp(ld, ld, static_cast<char*>(nullptr));
    ::_exit(127);
  }
  int st = 0;
  while (::waitpid(pid, &st, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : EIO;
}

// The machine's own RDMA devices (a kernel driver's, rxe's): enabling would
// hide them from every program.
// softverbs' own sv0 (in the view of `softverbs run`) is not one.
std::vector<std::string> real_devices() {
  std::vector<std::string> out;
  DIR* d = ::opendir("/sys/class/infiniband");
  if (!d) return out;
  const std::string ours = std::string("/sys/class/infiniband/") + sv::dev::kName + "/fw_ver";
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] == '.') continue;
    if (e->d_name == std::string(sv::dev::kName)) {
      char fw[64] = {};
      FILE* f = std::fopen(ours.c_str(), "r");
      const bool soft = f && std::fgets(fw, sizeof fw, f) && std::strncmp(fw, "softverbs", 9) == 0;
      if (f) std::fclose(f);
      if (soft) continue;
    }
    out.emplace_back(e->d_name);
  }
  ::closedir(d);
  return out;
}

constexpr const char* kEnableUsage =
    "usage: softverbs enable [--force]\n"
    "  every program on this machine gets softverbs' libibverbs.so.1 and librdmacm.so.1,\n"
    "  with no wrapper (writes /etc/ld.so.conf.d/00-softverbs.conf and runs ldconfig; root),\n"
    "  and the device node /dev/infiniband/uverbs0 (kept across reboots by /etc/tmpfiles.d/softverbs.conf).\n"
    "  Refused on a machine with RDMA devices of its own unless --force. Undo: softverbs disable\n";

int enable(int argc, char** argv) {
  bool force = false;
  for (int i = 0; i < argc; ++i) {
    if (std::strcmp(argv[i], "-h") == 0 || std::strcmp(argv[i], "--help") == 0) {
      std::fputs(kEnableUsage, stdout);
      return 0;
    }
    if (std::strcmp(argv[i], "--force") != 0) {
      std::fprintf(stderr, "softverbs enable: unexpected argument '%s'; try 'softverbs enable --help'\n", argv[i]);
      return 2;
    }
    force = true;
  }
  char real[PATH_MAX];
  std::string lib = library_dir();
  if (!has_library(lib) || !::realpath(lib.c_str(), real)) {
    std::fprintf(stderr, "softverbs enable: no libibverbs.so.1 in %s; set SOFTVERBS_LIB to softverbs' library directory\n",
                 lib.c_str());
    return 1;
  }
  auto devs = real_devices();
  if (!devs.empty() && !force) {
    std::string names;
    for (auto& d : devs) names += (names.empty() ? "" : ", ") + d;
    std::fprintf(stderr,
                 "softverbs enable: this machine has RDMA devices of its own (%s): every program would see softverbs' "
                 "device instead of them. Use 'softverbs run CMD' per program, or 'softverbs enable --force'\n",
                 names.c_str());
    return 1;
  }
  if (::geteuid() != 0) {
    std::fprintf(stderr, "softverbs enable: writes %s and runs ldconfig: run it as root (sudo softverbs enable)\n", kLdConf);
    return 1;
  }
  std::string body = std::string("# Written by 'softverbs enable': every program loads softverbs' libibverbs.so.1\n"
                                 "# and librdmacm.so.1 from here first. Undo with 'softverbs disable'.\n") +
                     real + "\n";
  std::string tmp = std::string(kLdConf) + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "w");
  if (!f || std::fputs(body.c_str(), f) < 0 || std::fclose(f) != 0 || ::chmod(tmp.c_str(), 0644) != 0 ||
      ::rename(tmp.c_str(), kLdConf) != 0) {
    std::fprintf(stderr, "softverbs enable: cannot write %s: %s\n", kLdConf, std::strerror(errno));
    ::unlink(tmp.c_str());
    return 1;
  }
  if (int e = run_ldconfig()) {
    std::fprintf(stderr, "softverbs enable: ldconfig failed (%s); undo with 'softverbs disable'\n", std::strerror(e));
    return 1;
  }
  std::string what;
  if (int e = add_device_node(what)) {
    std::fprintf(stderr, "softverbs enable: cannot create %s: %s; undo with 'softverbs disable'\n", what.c_str(),
                 std::strerror(e));
    return 1;
  }
  std::printf("softverbs: enabled machine-wide: programs load libibverbs.so.1 and librdmacm.so.1 from %s "
              "(%s), and find the device node %s (%s); undo with 'softverbs disable'\n",
              real, kLdConf, dev_node().c_str(), kTmpfiles);
  return 0;
}

int disable() {
  if (::access(kLdConf, F_OK) != 0) {
    if (::geteuid() == 0) remove_device_node();  // a half-done enable's
    std::printf("softverbs: not enabled machine-wide (no %s)\n", kLdConf);
    return 0;
  }
  if (::geteuid() != 0) {
    std::fprintf(stderr, "softverbs disable: removes %s and runs ldconfig: run it as root (sudo softverbs disable)\n",
                 kLdConf);
    return 1;
  }
  if (::unlink(kLdConf) != 0) {
    std::fprintf(stderr, "softverbs disable: cannot remove %s: %s\n", kLdConf, std::strerror(errno));
    return 1;
  }
  remove_device_node();
  if (int e = run_ldconfig()) {
    std::fprintf(stderr, "softverbs disable: ldconfig failed (%s); run ldconfig by hand\n", std::strerror(e));
    return 1;
  }
  std::printf("softverbs: disabled machine-wide: programs load the machine's own libibverbs again\n");
  return 0;
}

constexpr const char* kUsage =
    "usage: softverbs COMMAND [ARGS...]\n"
    "  run [--no-view] [--] CMD [ARGS...]\n"
    "                          run CMD, unmodified, on the softverbs device\n"
    "  status [--json]         what the daemon holds (objects, locked memory) and its counters;\n"
    "                          --json: the counters per port, context and QP as JSON (docs/LAB.md)\n"
    "  capture [-w FILE] [--qp QPN] [--pid PID] [-c|--count COUNT] [--duration S] [--uid UID]\n"
    "                          this user's RDMA traffic as pcapng, for tshark/Wireshark (docs/LAB.md);\n"
    "                          --uid UID (root): that user's\n"
    "  ls                      names published in the daemon's namespace\n"
    "  doctor [--program P] [--memlock BYTES]\n"
    "                          checks this set-up, one line each with its fix (the library of P;\n"
    "                          registrations of BYTES against RLIMIT_MEMLOCK, default 8 MiB)\n"
    "  enable [--force]        every program on this machine gets softverbs, no wrapper (root)\n"
    "  disable                 undo enable (root)\n"
    "  cdi [-o|--output FILE] [--kind VENDOR/CLASS] [--domain NAME]... [--users-domain NAME]...\n"
    "      [--owner USER]      a CDI spec: containers get the device (podman --device softverbs.io/rdma=sv0);\n"
    "                          --output merges into FILE (other devices kept), making its directories;\n"
    "                          --kind: the device kind (default softverbs.io/rdma);\n"
    "                          --domain NAME: the containers of one pod share a daemon and shared memory;\n"
    "                          --users-domain NAME: several users' containers in one pod share a system daemon;\n"
    "                          --owner USER: the domains' directories are USER's (rootless podman)\n"
    "  cdi-hook                (run by the container runtime, from the CDI spec) the /sys/class view\n"
    "  -h, --help              this help\n"
    "  --version               softverbs' version\n"
    "Environment: SOFTVERBS_DIR (the per-user daemon's directory), SOFTVERBS_SYSTEM=1\n"
    "(the host-wide daemon), SOFTVERBS_LIB, SOFTVERBSD. See softverbs(1).\n";

// ls and disable take no arguments but help.
int no_args(const char* cmd, int argc, char** argv, int (*fn)()) {
  if (argc == 0) return fn();
  if (std::strcmp(argv[0], "-h") == 0 || std::strcmp(argv[0], "--help") == 0) {
    std::printf("usage: softverbs %s\n", cmd);
    return 0;
  }
  std::fprintf(stderr, "softverbs %s: unexpected argument '%s'; try 'softverbs %s' alone\n", cmd, argv[0], cmd);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "softverbs: no command; try 'softverbs --help'\n");
    return 2;
  }
  std::string cmd = argv[1];
  if (cmd == "-h" || cmd == "--help" || cmd == "help") {
    std::fputs(kUsage, stdout);
    return 0;
  }
  if (cmd == "--version") {
    std::printf("softverbs %s\n", SOFTVERBS_VERSION);
    return 0;
  }
  if (cmd == "run") return run(argc - 2, argv + 2);
  if (cmd == "status") return status_main(argc - 2, argv + 2);
  if (cmd == "capture") return sv::tools::capture_main(argc - 2, argv + 2);
  if (cmd == "ls") return no_args("ls", argc - 2, argv + 2, list_names);
  if (cmd == "doctor") return sv::tools::doctor_main(argc - 2, argv + 2, {library_dir(), self_dir() + "/softverbs"});
  if (cmd == "enable") return enable(argc - 2, argv + 2);
  if (cmd == "disable") return no_args("disable", argc - 2, argv + 2, disable);
  if (cmd == "cdi") return sv::tools::cdi_main(argc - 2, argv + 2, cdi_paths());
  if (cmd == "cdi-hook") return sv::tools::cdi_hook_main(argc - 2, argv + 2);
  std::fprintf(stderr, "softverbs: unknown %s '%s'; try 'softverbs --help'\n", cmd[0] == '-' ? "option" : "command",
               cmd.c_str());
  return 2;
}
