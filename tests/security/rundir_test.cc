// The per-user runtime directory against a user who takes its name first.
//
// Root with no XDG_RUNTIME_DIR (sudo, cron, services) falls back to
// /tmp/softverbs-0, a name anyone can create in /tmp. Nobody creates it
// first, with a netns record naming another network namespace (so that the
// library would go on to BASE/net-INODE-DEV) and a directory of its own with
// a listening socket, which it swaps with net-INODE-DEV in a tight loop
// (renameat2 RENAME_EXCHANGE): a victim that checks a path and then uses it
// by name ends up at nobody's socket. The victim must refuse the directory
// with one clear line on stderr, connect nowhere in it, create nothing in
// it, and start no daemon for it.
//
// Each case runs in an arena: a process with a private mount namespace and
// a tmpfs over /tmp (and /run/user), so the host's /tmp/softverbs-0 is never
// touched and nothing is left behind.
#include <fcntl.h>
#include <ftw.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "attack.h"
#include "common/paths.h"

namespace svsec {
namespace {

constexpr const char* kBase = "/tmp/softverbs-0";
constexpr const char* kVictimDir = "/tmp/sv-victim";  // root's, 0700: the victim's stderr and spawn log
constexpr int kSkip = 77;

std::string read_all(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

int listen_at(const std::string& path) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::snprintf(a.sun_path, sizeof a.sun_path, "%s", path.c_str());
  int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (s < 0 || bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || listen(s, 64) != 0) return -1;
  return s;
}

// Nobody's part: squats BASE with a record naming another namespace and a
// listening "daemon" in BASE/control and BASE/evil/control, then swaps
// BASE/evil with BASE/net-INODE-DEV as fast as it can, counting every
// connection, until `stop` is readable. Writes the count to `result`.
int attacker(int ready, int stop, int result) {
  if (!become_nobody()) return 98;
  if (mkdir(kBase, 0777) != 0 || chmod(kBase, 0777) != 0) return 97;
  sv::NetnsId other = sv::netns_self();
  other.ino += 1;
  const std::string record = sv::format_netns_record(other);
  int rf = open((std::string(kBase) + "/netns").c_str(), O_WRONLY | O_CREAT | O_EXCL, 0644);
  if (rf < 0 || write(rf, record.data(), record.size()) != ssize_t(record.size())) return 96;
  close(rf);
  if (mkdir((std::string(kBase) + "/evil").c_str(), 0777) != 0) return 95;
  int l1 = listen_at(std::string(kBase) + "/control");
  int l2 = listen_at(std::string(kBase) + "/evil/control");
  if (l1 < 0 || l2 < 0) return 94;
  int base = open(kBase, O_PATH | O_DIRECTORY);
  const sv::NetnsId self = sv::netns_self();
  const std::string net = "net-" + std::to_string(self.ino) + "-" + std::to_string(self.dev);
  char go = 1;
  if (write(ready, &go, 1) != 1) return 93;
  uint64_t connections = 0;
  for (uint64_t i = 0;; ++i) {
    // The victim's own net-INODE-DEV, once it made one, trades places with
    // nobody's directory (ENOENT till then).
    renameat2(base, net.c_str(), base, "evil", RENAME_EXCHANGE);
    for (int l : {l1, l2}) {
      int c = accept4(l, nullptr, nullptr, SOCK_CLOEXEC);
      if (c >= 0) {
        ++connections;
        close(c);
      }
    }
    if (i % 64 == 0) {
      pollfd p{stop, POLLIN, 0};
      if (poll(&p, 1, 0) == 1) break;
    }
  }
  return write(result, &connections, sizeof connections) == sizeof connections ? 0 : 92;
}

// Root's part: the library opens the device with no XDG_RUNTIME_DIR and
// no SOFTVERBS_DIR, again and again for `seconds`. Exit status: how many
// opens succeeded (capped), 0 if none.
int victim(double seconds, const std::string& daemon) {
  unsetenv("XDG_RUNTIME_DIR");
  unsetenv("SOFTVERBS_DIR");
  unsetenv("SOFTVERBS_SYSTEM");
  unsetenv("SOFTVERBS_SYSTEM_DIR");
  setenv("SOFTVERBSD", daemon.c_str(), 1);
  setenv("SOFTVERBSD_IDLE", "1", 1);
  int err = open((std::string(kVictimDir) + "/stderr").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (err < 0) return 99;
  dup2(err, 2);
  int opened = 0;
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  do {
    if (ibv_context* c = open_dev()) {
      ++opened;
      ibv_close_device(c);
    }
  } while (std::chrono::steady_clock::now() < until);
  return opened > 50 ? 50 : opened;
}

// Paths under BASE that nobody did not create, one a line.
std::string foreign_entries() {
  static std::string found;
  found.clear();
  nftw(
      kBase,
      [](const char* p, const struct stat* st, int, FTW*) {
        if (st->st_uid != kNobody) found += std::string(p) + " (uid " + std::to_string(st->st_uid) + ")\n";
        return 0;
      },
      16, FTW_PHYS);
  return found;
}

// A private /tmp (and /run/user, where logind would put the user's
// directory) for this process and its children.
bool private_tmp(bool with_logind_dir) {
  if (unshare(CLONE_NEWNS) != 0 || mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) return false;
  if (mount("tmpfs", "/tmp", "tmpfs", 0, "mode=1777") != 0) return false;
  // An empty /run/user; where there is none, an empty /run to make it in
  // (nothing is made on the host's file systems).
  struct stat st;
  const bool have = stat("/run/user", &st) == 0;
  if (have && mount("tmpfs", "/run/user", "tmpfs", 0, "mode=0755") != 0) return false;
  if (!have && with_logind_dir && mount("tmpfs", "/run", "tmpfs", 0, "mode=0755") != 0) return false;
  if (with_logind_dir && (mkdir("/run/user", 0755) != 0 && errno != EEXIST)) return false;
  if (with_logind_dir && (mkdir("/run/user/0", 0700) != 0 || chmod("/run/user/0", 0700) != 0)) return false;
  return mkdir(kVictimDir, 0700) == 0;
}

struct Outcome {
  int opened = -1;               // victim's successful opens
  uint64_t connections = ~0ull;  // to nobody's sockets
  std::string stderr_text, foreign, spawned;
};

// The arena (a forked process): sets up, runs nobody and the victim, and
// reports the outcome on `out` as text fields separated by NULs.
int arena(bool with_logind_dir, bool real_daemon, int out) {
  if (!private_tmp(with_logind_dir)) return kSkip;
  // A daemon the victim would start only logs that it was asked to.
  const std::string spawn_log = std::string(kVictimDir) + "/spawned";
  const std::string fake = std::string(kVictimDir) + "/softverbsd";
  std::ofstream(fake) << "#!/bin/sh\necho \"$@\" >> " << spawn_log << "\n";
  chmod(fake.c_str(), 0700);
  int ready[2], stop[2], result[2];
  if (pipe(ready) || pipe(stop) || pipe(result)) return 90;
  pid_t a = fork();
  if (a == 0) _exit(attacker(ready[1], stop[0], result[1]));
  char go = 0;
  if (read(ready[0], &go, 1) != 1) return 91;
  pid_t v = fork();
  if (v == 0) _exit(victim(1.5, real_daemon ? build_bin("softverbsd") : fake));
  // The victim may not take longer than its daemon-start deadline allows.
  int vst = -1;
  for (int i = 0; i < 3000; ++i) {
    int st;
    if (waitpid(v, &st, WNOHANG) == v) {
      vst = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      break;
    }
    usleep(10000);
  }
  if (vst < 0) {
    kill(v, SIGKILL);
    vst = wait_for(v);
  }
  if (write(stop[1], &go, 1) != 1) return 89;
  uint64_t n = ~0ull;
  if (read(result[0], &n, sizeof n) != sizeof n) n = ~0ull;
  kill(a, SIGKILL);
  wait_for(a);
  std::string report = std::to_string(vst) + '\0' + std::to_string(n) + '\0' +
                       read_all(std::string(kVictimDir) + "/stderr") + '\0' + foreign_entries() + '\0' +
                       read_all(spawn_log);
  if (write(out, report.data(), report.size()) != ssize_t(report.size())) return 88;
  return 0;
}

// Runs an arena and parses its report; false (with the test skipped) where
// this host gives no private mount namespace.
bool run_arena(bool with_logind_dir, bool real_daemon, Outcome& o) {
  int p[2];
  if (pipe(p) != 0) return false;
  pid_t pid = fork();
  if (pid == 0) {
    close(p[0]);
    _exit(arena(with_logind_dir, real_daemon, p[1]));
  }
  close(p[1]);
  std::string text;
  char buf[4096];
  for (ssize_t r; (r = read(p[0], buf, sizeof buf)) > 0;) text.append(buf, size_t(r));
  close(p[0]);
  const int rc = wait_for(pid);
  if (rc == kSkip) return false;
  EXPECT_EQ(0, rc) << "the arena failed to set up (" << rc << ")";
  std::vector<std::string> f;
  size_t start = 0;
  for (size_t z; (z = text.find('\0', start)) != std::string::npos; start = z + 1) f.push_back(text.substr(start, z - start));
  f.push_back(text.substr(start));
  if (f.size() != 5) {
    ADD_FAILURE() << "no report from the arena";
    return true;
  }
  o.opened = std::atoi(f[0].c_str());
  o.connections = std::strtoull(f[1].c_str(), nullptr, 10);
  o.stderr_text = f[2];
  o.foreign = f[3];
  o.spawned = f[4];
  return true;
}

TEST(RunDir, SquattedFallbackIsRefusedAndNeverUsed) {
  if (getuid() != 0) GTEST_SKIP() << "needs root (the victim is root, the squatter nobody)";
  Outcome o;
  if (!run_arena(false, false, o)) GTEST_SKIP() << "no private mount namespace here";
  EXPECT_EQ(0u, o.connections) << "the victim connected to nobody's socket";
  EXPECT_EQ(0, o.opened) << "the victim opened a device through nobody's directory";
  EXPECT_EQ("", o.foreign) << "created inside nobody's directory";
  EXPECT_EQ("", o.spawned) << "a daemon was started for nobody's directory";
  const std::string want = "softverbs: runtime directory /tmp/softverbs-0 is owned by uid 65534, not you (uid 0): "
                           "remove it, or set XDG_RUNTIME_DIR or SOFTVERBS_DIR to a directory of yours with mode 0700 (softverbs doctor checks the set-up)\n";
  EXPECT_EQ(want, o.stderr_text) << "one line, once per process, saying why";
}

TEST(RunDir, LogindDirectoryIsPreferredOverASquattedTmp) {
  if (getuid() != 0) GTEST_SKIP() << "needs root (the victim is root, the squatter nobody)";
  Outcome o;
  if (!run_arena(true, true, o)) GTEST_SKIP() << "no private mount namespace here";
  EXPECT_EQ(0u, o.connections) << "the victim connected to nobody's socket";
  EXPECT_GT(o.opened, 0) << "the device did not open through /run/user/0/softverbs; stderr: " << o.stderr_text;
  EXPECT_EQ("", o.foreign) << "created inside nobody's directory";
}

// A SOFTVERBS_DIR that others may read says so, once, with the fix.
TEST(RunDir, WideSoftverbsDirSaysWhy) {
  char tmpl[] = "/tmp/sv-rundir-XXXXXX";
  ASSERT_NE(nullptr, mkdtemp(tmpl));
  const std::string dir = tmpl;
  ASSERT_EQ(0, chmod(dir.c_str(), 0755));
  const std::string err = dir + "/stderr";
  pid_t pid = fork();
  if (pid == 0) {
    setenv("SOFTVERBS_DIR", dir.c_str(), 1);
    unsetenv("SOFTVERBS_SYSTEM");
    setenv("SOFTVERBSD", "/bin/false", 1);
    int fd = open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    dup2(fd, 2);
    int opened = 0;
    for (int i = 0; i < 2; ++i) {
      if (ibv_context* c = open_dev()) ++opened, ibv_close_device(c);
    }
    _exit(opened);
  }
  EXPECT_EQ(0, wait_for(pid)) << "the device opened in a directory of mode 0755";
  const std::string text = read_all(err);
  EXPECT_EQ("softverbs: SOFTVERBS_DIR=" + dir + " has mode 0755; it must be 0700 (chmod 700 " + dir + ") (softverbs doctor checks the set-up)\n", text);
  unlink(err.c_str());
  rmdir(dir.c_str());
}

}  // namespace
}  // namespace svsec
