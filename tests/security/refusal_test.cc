// The daemon's refusals reach the refused program's stderr, once, in words
// (proto::Op::Refused; the library's say_refused): one test per reason, each
// with a real daemon and a real program that the daemon refuses. The pid
// namespace's and the connection quota's are in pid_namespace_test.cc and
// quota_test.cc; here the two that need a daemon of a particular kind:
//   kRefusedUser          a user's own daemon, reached by a process of
//                         another user: a setuid-root program that the
//                         daemon's user runs (its real uid passes the
//                         library's check of the directory; the daemon sees
//                         the effective one);
//   kRefusedUnmappedUser  a daemon in a user namespace that maps root alone
//                         (a container's), its directory where every user
//                         finds it: another user's process is one it
//                         cannot name.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>

#include "attack.h"

namespace svsec {
namespace {

bool write_map_file(const char* path, const std::string& text) {
  sv::Fd f(::open(path, O_WRONLY | O_CLOEXEC));
  return f.valid() && ::write(f.get(), text.data(), text.size()) == ssize_t(text.size());
}

// A daemon started by a forked child that first runs `prepare` (returns
// false: the child exits 77), in directory `dir`, with `args` after
// --foreground --dir DIR --idle 0. Ready when its socket accepts (up to
// 30 s); stopped with SIGTERM at the end.
struct OtherDaemon {
  std::string dir;
  pid_t pid = -1;
  OtherDaemon(const std::string& d, bool system, const std::function<bool()>& prepare) : dir(d) {
    const std::string bin = build_bin("softverbsd");
    pid = ::fork();
    if (pid == 0) {
      if (!prepare()) ::_exit(77);
      ::unsetenv("SOFTVERBSD_IDLE");
      if (system)
        ::execl(bin.c_str(), "softverbsd", "--system", "--foreground", "--dir", dir.c_str(), "--idle", "0",
                static_cast<char*>(nullptr));
      else
        ::execl(bin.c_str(), "softverbsd", "--foreground", "--dir", dir.c_str(), "--idle", "0",
                static_cast<char*>(nullptr));
      ::_exit(127);
    }
    for (int i = 0; i < 3000 && alive(); ++i) {
      sv::Fd probe;
      if (sv::connect_seqpacket(dir + "/control", probe) == 0) break;
      ::usleep(10000);
    }
  }
  ~OtherDaemon() {
    if (pid > 0) {
      ::kill(pid, SIGTERM);
      wait_for(pid);
    }
  }
  int exit_status = -1;  // once reaped: its exit status (128 + signal)
  // Whether it runs; one that stopped is reaped here, its status kept.
  bool alive() {
    if (pid <= 0) return false;
    int st = 0;
    if (::waitpid(pid, &st, WNOHANG) != pid) return true;
    exit_status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    pid = -1;
    return false;
  }
  // The exit status once it stopped by itself (77: not prepared), else -1.
  int stopped() { return alive() ? -1 : exit_status; }
};

// Two opens with stderr in a memfd: 0 when both failed and `want` is on
// stderr exactly once (a later refusal is not said again); 1 an open
// succeeded, 2 stderr, 3 `want` missing, 4 said twice. What was said goes
// to `sock` (up to 4 KiB) for the test's message.
int refused_and_told(const std::string& want, int sock) {
  const int err = ::memfd_create("stderr", 0);
  if (err < 0 || ::dup2(err, 2) != 2) return 2;
  ibv_context* a = open_dev();
  ibv_context* b = open_dev();
  std::string text(4096, '\0');
  const ssize_t got = ::pread(err, text.data(), text.size(), 0);
  text.resize(got > 0 ? size_t(got) : 0);
  (void)send_bytes(sock, text.data(), text.size());
  if (a || b) return 1;
  const size_t at = text.find(want);
  if (at == std::string::npos) return 3;
  if (text.find("refused this process", at + 1) != std::string::npos) return 4;
  return 0;
}

// What the child said on its stderr (it sends it before it exits; nothing
// if it failed before).
std::string said(int sock) {
  char buf[4096];
  const ssize_t n = ::recv(sock, buf, sizeof buf, 0);
  return n > 0 ? std::string(buf, size_t(n)) : std::string("(nothing)");
}

// The test binary's own daemon directory (tests/verbs/main.cc), put back
// when a test has pointed the children it forks elsewhere.
struct KeepEnv {
  std::string name, value;
  bool had;
  explicit KeepEnv(const char* n) : name(n), had(std::getenv(n) != nullptr) {
    if (had) value = std::getenv(n);
  }
  ~KeepEnv() {
    if (had) setenv(name.c_str(), value.c_str(), 1);
    else unsetenv(name.c_str());
  }
};

// nobody's own daemon, in nobody's directory (mode 0700); a setuid-root
// program run by nobody (real uid 65534, effective 0) opens the device with
// SOFTVERBS_DIR there: the library's checks pass (the directory is its real
// user's, the daemon runs as that user), and the daemon, which serves its
// own user only, sees uid 0 and refuses with kRefusedUser.
TEST(Refusal, AnotherUsersProcessAtAUsersDaemonIsToldWhyOnce) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run a daemon as another user";
  char tmpl[] = "/tmp/softverbs-refusal-XXXXXX";
  ASSERT_NE(nullptr, mkdtemp(tmpl));
  const std::string dir = tmpl;
  ASSERT_EQ(0, chown(dir.c_str(), kNobody, kNobody));
  ASSERT_EQ(0, chmod(dir.c_str(), 0700));
  {
    OtherDaemon nobodys(dir, false, [] { return become_nobody(); });
    ASSERT_TRUE(nobodys.alive()) << "nobody's daemon did not start (exit " << nobodys.stopped() << ")";
    KeepEnv keep_dir("SOFTVERBS_DIR"), keep_spawn("SOFTVERBS_NO_SPAWN");
    setenv("SOFTVERBS_DIR", dir.c_str(), 1);
    setenv("SOFTVERBS_NO_SPAWN", "1", 1);
    Child setuid_root(false, [](int sock) {
      if (::setresgid(kNobody, 0, 0) != 0 || ::setresuid(kNobody, 0, 0) != 0) return 10;
      return refused_and_told("refused this process: it runs as uid 0, the daemon is uid 65534's", sock);
    });
    setuid_root.start();
    const std::string text = said(setuid_root.sock());
    EXPECT_EQ(0, setuid_root.wait()) << "1 opened, 2 stderr, 3 not said, 4 said twice, 10 setresuid; stderr: "
                                     << text;
    EXPECT_TRUE(nobodys.alive());
  }
  std::string cmd = "rm -rf " + dir;
  if (std::system(cmd.c_str())) {
  }
}

// A system daemon started in a user namespace that maps root alone ("0 0
// 1": a rootful container's daemon with its directory mounted where the
// host's users reach it). nobody's process opens the device there: the
// daemon sees the overflow uid, which names no one user, and refuses with
// kRefusedUnmappedUser; root's process, which it can name, is served.
TEST(Refusal, AUserTheDaemonsNamespaceCannotNameIsToldWhyOnce) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root for a user namespace that maps root";
  char tmpl[] = "/tmp/softverbs-refusal-XXXXXX";
  ASSERT_NE(nullptr, mkdtemp(tmpl));
  const std::string dir = tmpl;
  ASSERT_EQ(0, chmod(dir.c_str(), 0755));
  {
    OtherDaemon contained(dir, true, [] {
      return ::unshare(CLONE_NEWUSER) == 0 && write_map_file("/proc/self/setgroups", "deny") &&
             write_map_file("/proc/self/uid_map", "0 0 1") && write_map_file("/proc/self/gid_map", "0 0 1");
    });
    if (const int rc = contained.stopped(); rc == 77) GTEST_SKIP() << "no user namespaces here";
    ASSERT_TRUE(contained.alive()) << "the daemon in a user namespace did not start";
    KeepEnv keep_system("SOFTVERBS_SYSTEM"), keep_dir("SOFTVERBS_SYSTEM_DIR");
    setenv("SOFTVERBS_SYSTEM", "1", 1);
    setenv("SOFTVERBS_SYSTEM_DIR", dir.c_str(), 1);
    Child nobody(true, [](int sock) {
      return refused_and_told(
          "refused this process: the daemon runs in a user namespace that cannot name this process's user (it "
          "sees uid 65534)",
          sock);
    });
    Child root(false, [](int) {
      ibv_context* c = open_dev();
      if (!c) return 1;
      ibv_close_device(c);
      return 0;
    });
    nobody.start();
    const std::string text = said(nobody.sock());
    EXPECT_EQ(0, nobody.wait()) << "1 opened, 2 stderr, 3 not said, 4 said twice; stderr: " << text;
    root.start();
    EXPECT_EQ(0, root.wait()) << "root's process, which the namespace maps, was not served";
    EXPECT_TRUE(contained.alive());
  }
  std::string cmd = "rm -rf " + dir;
  if (std::system(cmd.c_str())) {
  }
}

}  // namespace
}  // namespace svsec
