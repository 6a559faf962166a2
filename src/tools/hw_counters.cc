// hw_counters.cc: the refresher of the sysfs view's counter files.
#include "tools/hw_counters.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>

#include "common/counters_query.h"
#include "common/paths.h"

namespace sv::tools {

int write_hw_counters(const std::string& port_dir, const uint64_t* port) {
  for (uint32_t i = 0; i < counters::kCount; ++i) {
    const std::string dst = port_dir + "/hw_counters/" + counters::kNames[i];
    const std::string tmp = port_dir + "/hw_counters/." + counters::kNames[i];
    char text[32];
    const int n = std::snprintf(text, sizeof text, "%" PRIu64 "\n", port[i]);
    Fd f(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0444));
    if (!f.valid()) return errno;
    if (::write(f.get(), text, size_t(n)) != n) return errno ? errno : EIO;
    if (::rename(tmp.c_str(), dst.c_str()) != 0) return errno;
  }
  return 0;
}

bool lock_is_held(const std::string& lock_file) {
  struct stat st {};
  if (::stat(lock_file.c_str(), &st) != 0) return false;
  char want[64];
  std::snprintf(want, sizeof want, " %02x:%02x:%llu ", major(st.st_dev), minor(st.st_dev),
                (unsigned long long)st.st_ino);
  FILE* f = std::fopen("/proc/locks", "re");
  if (!f) return true;  // cannot tell: ask (a running daemon answers, none is ENOENT)
  char line[256];
  bool held = false;
  while (!held && std::fgets(line, sizeof line, f))
    held = std::strstr(line, " FLOCK ") && std::strstr(line, want);
  std::fclose(f);
  return held;
}

namespace {

// The refresher's loop: until `watched` (a pidfd of the program) is
// readable (the program ended), every period.
[[noreturn]] void refresh_loop(const std::string& port_dir, const std::string& lock_file,
                               const std::function<int(Fd&)>& connect, int watched, int period_ms) {
  bool said = false;
  uint32_t seq = 0;
  for (;;) {
    counters::Snapshot snap;
    Fd sock;
    int e = lock_is_held(lock_file) ? connect(sock) : ENOENT;
    if (e == 0) e = counters::query(sock.get(), seq, snap, false);
    if (e == ENOENT || e == ECONNREFUSED) e = 0;  // no daemon: nothing counted
    if (e == 0) e = write_hw_counters(port_dir, snap.port);
    if (e && !said) {
      std::fprintf(stderr, "softverbs run: the sysfs view's hw_counters are not refreshed: %s\n", std::strerror(e));
      said = true;
    }
    pollfd p{watched, POLLIN, 0};
    if (::poll(&p, 1, period_ms) != 0) ::_exit(0);
  }
}

}  // namespace

void start_hw_counters_refresh(const std::string& port_dir, const std::string& daemon_dir,
                               std::function<int(Fd&)> connect, int period_ms) {
  const pid_t program = ::getpid();  // exec'd into the program next
  const int watched = int(::syscall(SYS_pidfd_open, program, 0));
  if (watched < 0) {
    std::fprintf(stderr, "softverbs run: the sysfs view's hw_counters stay 0: pidfd_open: %s\n", std::strerror(errno));
    return;
  }
  // Twice forked: the refresher's parent exits at once, so that the program
  // has no child it did not make (init, or a subreaper, reaps the refresher).
  const pid_t mid = ::fork();
  if (mid == 0) {
    if (::fork() == 0) {
      ::setsid();
      for (int fd = 0; fd < 3; ++fd)
        if (fd != 2) ::close(fd);  // stderr stays: a failure says why
      refresh_loop(port_dir, lock_path(daemon_dir), connect, watched, period_ms);
    }
    ::_exit(0);
  }
  ::close(watched);
  if (mid > 0) {
    while (::waitpid(mid, nullptr, 0) < 0 && errno == EINTR) {
    }
  } else {
    std::fprintf(stderr, "softverbs run: the sysfs view's hw_counters stay 0: fork: %s\n", std::strerror(errno));
  }
}

}  // namespace sv::tools
