// softverbsd: the per-user softverbs device daemon. Usually started on
// demand by libibverbs.so.1; see docs/ARCHITECTURE.md.
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "common/paths.h"
#include "daemon/server.h"

constexpr const char* kUsage =
    "usage: softverbsd [--foreground] [--idle SECONDS] [--dir DIR] [--system]\n"
    "  the softverbs device daemon; programs start the per-user one on demand\n"
    "  --foreground: stay attached to the terminal, errors on stderr\n"
    "  --idle: exit after SECONDS with no clients (default 30, 0 = never)\n"
    "  --dir: serve in DIR (default $SOFTVERBS_DIR, else $XDG_RUNTIME_DIR/softverbs\n"
    "         or /tmp/softverbs-UID, or its net-INODE-DEV for a network namespace\n"
    "         other than the one recorded there)\n"
    "  --system: the host-wide daemon serving every user (run it as root; its\n"
    "            directory is $SOFTVERBS_SYSTEM_DIR or /run/softverbs, and it\n"
    "            does not exit when idle unless --idle is given)\n"
    "  -h, --help: this help; --version: softverbs' version. See softverbsd(8).\n";

struct Options {
  bool foreground = false;
  bool system = false;
  int idle = 30;
  bool idle_given = false;
  std::string dir;
};

// Parses argv into *o; returns -1 to go on, else the exit code (0 after
// --help or --version, 2 after a usage error, which names what to do next).
static int parse(int argc, char** argv, Options* o) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    bool has_value = i + 1 < argc;
    if (a == "-h" || a == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    } else if (a == "--version") {
      std::printf("softverbsd %s\n", SOFTVERBS_VERSION);
      return 0;
    } else if (a == "--foreground") {
      o->foreground = true;
    } else if (a == "--system") {
      o->system = true;
    } else if ((a == "--idle" || a == "--dir") && !has_value) {
      std::fprintf(stderr, "softverbsd: %s needs a value; try 'softverbsd --help'\n", a.c_str());
      return 2;
    } else if (a == "--idle") {
      char* end = nullptr;
      long v = std::strtol(argv[++i], &end, 10);
      if (*argv[i] == 0 || *end != 0 || v < 0 || v > INT32_MAX) {
        std::fprintf(stderr, "softverbsd: --idle '%s': want a number of seconds (0 = never)\n", argv[i]);
        return 2;
      }
      o->idle = int(v), o->idle_given = true;
    } else if (a == "--dir") {
      o->dir = argv[++i];
    } else {
      std::fprintf(stderr, "softverbsd: unknown %s '%s'; try 'softverbsd --help'\n",
                   a[0] == '-' ? "option" : "argument", a.c_str());
      return 2;
    }
  }
  return -1;
}

// Without --dir: $SOFTVERBS_DIR, else this network namespace's directory
// (common/paths.h), but the base directory when systemd passed us its
// socket (the user unit listens on %t/softverbs/control: that daemon serves
// the user manager's namespace, and records it there).
static std::string default_dir() {
  const char* pid = std::getenv("LISTEN_PID");
  const bool activated = pid && std::strtoul(pid, nullptr, 10) == static_cast<unsigned long>(::getpid());
  if (activated && !sv::runtime_dir_explicit()) return sv::runtime_base_dir();
  return sv::runtime_dir();
}

int main(int argc, char** argv) {
  Options o;
  if (int rc = parse(argc, argv, &o); rc >= 0) return rc;
  bool foreground = o.foreground, system = o.system, idle_given = o.idle_given;
  int idle = o.idle;
  std::string dir = o.dir;
  if (const char* e = std::getenv("SOFTVERBSD_IDLE")) idle = std::atoi(e), idle_given = true;
  if (dir.empty()) dir = system ? sv::system_dir() : default_dir();
  if (system && !idle_given) idle = 0;

  // Every QP, CQ, channel and backing holds a descriptor here: use all the
  // descriptors the hard limit allows.
  rlimit nofile{};
  if (::getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur < nofile.rlim_max) {
    nofile.rlim_cur = nofile.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &nofile);
  }

  sv::daemon::Server server(dir, idle, system);
  int e = server.start();
  if (e == EALREADY) return 0;  // another daemon serves this user
  if (e && !server.dir_problem().empty()) {
    std::fprintf(stderr, "softverbsd: cannot start in %s: %s; or choose another directory with --dir\n", dir.c_str(),
                 server.dir_problem().c_str());
    return 1;
  }
  if (e) {
    std::fprintf(stderr, "softverbsd: cannot start in %s: %s; %s\n", dir.c_str(), std::strerror(e),
                 e == EPERM || e == ENOTDIR
                     ? "it must be a directory of yours, mode 0700 (root's, 0755, for --system); choose another with --dir"
                     : "choose another directory with --dir, or see softverbsd(8)");
    return 1;
  }
  if (!foreground) {
    // Detach from the starter's descriptors: a pipe the starter reads must
    // not stay open because of us. Errors go to DIR/daemon.log.
    //
    // A process group of our own (setpgid(2)): a signal to the starter's
    // group (a terminal's Ctrl-C, timeout(1), kill of a job) does not reach
    // us. But not a session of our own: with autogroup scheduling
    // (sched(7), "The autogroup feature"; kernel.sched_autogroup_enabled,
    // on by default) every session is a scheduling group of its own, and a
    // daemon alone in its group was seen runnable and never run for more
    // than 30 s on a 2-CPU machine while its clients' group spun on both
    // CPUs (ibv_post_send retried on a full queue, sched_yield between
    // tries), waiting for a client whose request it had not read. In the
    // starter's session the daemon competes with its clients' threads one
    // to one, and the kernel shares the CPUs between them.
    ::setpgid(0, 0);
    int null = ::open("/dev/null", O_RDWR | O_CLOEXEC);
    int log = ::openat(server.dir_fd(), "daemon.log", O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (null >= 0) {
      ::dup2(null, 0);
      ::dup2(null, 1);
      ::dup2(log >= 0 ? log : null, 2);
      ::close(null);
    }
    if (log >= 0) ::close(log);
  }
  return server.run() == 0 ? 0 : 1;
}
