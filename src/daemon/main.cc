// softverbsd: the per-user softverbs device daemon. Usually started on
// demand by libibverbs.so.1; see docs/ARCHITECTURE.md.
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "common/paths.h"
#include "daemon/server.h"

static void usage() {
  std::fprintf(stderr,
               "usage: softverbsd [--foreground] [--idle SECONDS] [--dir DIR] [--system]\n"
               "  --idle: exit after SECONDS with no clients (default 30, 0 = never)\n"
               "  --system: the host-wide daemon serving every user (run it as root; its\n"
               "            directory is $SOFTVERBS_SYSTEM_DIR or /run/softverbs, and it\n"
               "            does not exit when idle unless --idle is given)\n");
}

int main(int argc, char** argv) {
  bool foreground = false;
  bool system = false;
  int idle = 30;
  bool idle_given = false;
  std::string dir;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--foreground") foreground = true;
    else if (a == "--idle" && i + 1 < argc) idle = std::atoi(argv[++i]), idle_given = true;
    else if (a == "--system") system = true;
    else if (a == "--dir" && i + 1 < argc) dir = argv[++i];
    else {
      usage();
      return 2;
    }
  }
  if (const char* e = std::getenv("SOFTVERBSD_IDLE")) idle = std::atoi(e), idle_given = true;
  if (dir.empty()) dir = system ? sv::system_dir() : sv::runtime_dir();
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
  if (e) {
    std::fprintf(stderr, "softverbsd: cannot start in %s: %s\n", dir.c_str(), std::strerror(e));
    return 1;
  }
  if (!foreground) {
    // Detach from the starter's session and descriptors: a pipe the starter
    // reads must not stay open because of us. Errors go to DIR/daemon.log.
    ::setsid();
    int null = ::open("/dev/null", O_RDWR | O_CLOEXEC);
    int log = ::open((dir + "/daemon.log").c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
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
