// Tests of identity.cc: the locked-memory identity read through the pidfd
// (PIDFD_GET_INFO, capget(2), prlimit(2)) says what /proc/PID/status says,
// for a process whose credentials differ in every id, before and after they
// change, and neither says anything of a process that is gone.
#include "daemon/identity.h"

#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>

#include <gtest/gtest.h>

#include "common/sys.h"

namespace sv::daemon {
namespace {

// A child that sets its ids and limit as told when it reads a byte from
// `cmd`, then answers on `ack` and waits.
struct Child {
  pid_t pid = -1;
  Fd pidfd;
  int cmd = -1, ack = -1;

  void start() {
    int c[2], a[2];
    ASSERT_EQ(::pipe(c), 0);
    ASSERT_EQ(::pipe(a), 0);
    pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      ::close(c[1]);  // so that the parent's close ends the loop
      ::close(a[0]);
      for (char op; ::read(c[0], &op, 1) == 1;) {
        if (op == 'u') {
          rlimit rl{123 * 4096, 123 * 4096};  // lowered: raising needs CAP_SYS_RESOURCE
          bool ok = ::setrlimit(RLIMIT_MEMLOCK, &rl) == 0 && ::setresgid(11, 12, 13) == 0 &&
                    ::setresuid(21, 22, 23) == 0;
          if (::write(a[1], ok ? "y" : "n", 1) != 1) ::_exit(1);
        }
      }
      ::_exit(0);
    }
    ::close(c[0]);
    ::close(a[1]);
    cmd = c[1];
    ack = a[0];
    int fd = int(::syscall(SYS_pidfd_open, pid, 0));
    ASSERT_GE(fd, 0);
    pidfd.reset(fd);
  }
  bool tell(char op) {
    char r = 0;
    return ::write(cmd, &op, 1) == 1 && ::read(ack, &r, 1) == 1 && r == 'y';
  }
  void stop() {
    ::close(cmd);
    ::close(ack);
    int st = 0;
    ::waitpid(pid, &st, 0);
  }
};

void expect_same(const ConnectIdentity& a, const ConnectIdentity& b) {
  EXPECT_TRUE(std::equal(a.uids, a.uids + 4, b.uids));
  EXPECT_TRUE(std::equal(a.gids, a.gids + 4, b.gids));
  EXPECT_EQ(a.memlock, b.memlock);
  EXPECT_EQ(a.ipc_lock, b.ipc_lock);
}

TEST(Identity, ThePidfdSaysWhatProcStatusSays) {
  Child c;
  c.start();
  ConnectIdentity fast, proc;
  ASSERT_TRUE(read_identity(c.pid, c.pidfd.get(), fast));
  ASSERT_TRUE(read_identity_proc(c.pid, c.pidfd.get(), proc));
  expect_same(fast, proc);
  if (::geteuid() == 0) {
    // Every id different, the capability dropped with them (capabilities(7):
    // a setresuid away from 0 clears the effective set).
    ASSERT_TRUE(c.tell('u'));
    ConnectIdentity fast2, proc2;
    ASSERT_TRUE(read_identity(c.pid, c.pidfd.get(), fast2));
    ASSERT_TRUE(read_identity_proc(c.pid, c.pidfd.get(), proc2));
    expect_same(fast2, proc2);
    EXPECT_EQ(fast2.uids[0], 21u);
    EXPECT_EQ(fast2.uids[1], 22u);
    EXPECT_EQ(fast2.uids[2], 23u);
    EXPECT_EQ(fast2.gids[0], 11u);
    EXPECT_EQ(fast2.gids[1], 12u);
    EXPECT_EQ(fast2.gids[2], 13u);
    EXPECT_EQ(fast2.memlock, 123u * 4096);
    EXPECT_FALSE(fast2.ipc_lock);
    // The limit of a process whose credentials changed since it connected
    // is no larger than it was then, and no larger than now.
    EXPECT_EQ(memlock_limit(c.pid, c.pidfd.get(), fast, 0), std::min(fast.memlock, fast2.memlock));
  }
  c.stop();
  // Gone (reaped): nothing is read of whatever process has its pid now.
  ConnectIdentity gone, gone_proc;
  EXPECT_FALSE(read_identity(c.pid, c.pidfd.get(), gone));
  EXPECT_FALSE(read_identity_proc(c.pid, c.pidfd.get(), gone_proc));
  EXPECT_FALSE(gone.known);
}

TEST(Identity, WithoutWantCapsTheCapabilityIsNotLookedUp) {
  ConnectIdentity with, without;
  Fd self(int(::syscall(SYS_pidfd_open, ::getpid(), 0)));
  ASSERT_TRUE(self.valid());
  ASSERT_TRUE(read_identity(::getpid(), self.get(), with, true));
  ASSERT_TRUE(read_identity(::getpid(), self.get(), without, false));
  EXPECT_FALSE(without.ipc_lock);
  EXPECT_TRUE(std::equal(with.uids, with.uids + 4, without.uids));
  EXPECT_EQ(with.memlock, without.memlock);
}

// A process entered into a pid namespace from outside (as `docker exec`
// enters a container): its parent is not in the namespace (ppid 0), for
// which some versions of PIDFD_GET_INFO answer ESRCH although it lives
// (this kernel's does not). A daemon in that namespace reads its
// identity all the same.
TEST(Identity, AProcessWhoseParentIsOutsideTheNamespaceIsRead) {
  int pipefd[2];
  ASSERT_EQ(0, ::pipe(pipefd));
  const pid_t x = ::fork();
  ASSERT_GE(x, 0);
  if (x == 0) {
    if (::unshare(CLONE_NEWPID | CLONE_NEWNS) != 0) ::_exit(77);
    const pid_t reader = ::fork();  // pid 1 of the new namespace: the "daemon"
    if (reader == 0) {
      if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 ||
          ::mount("proc", "/proc", "proc", 0, nullptr) != 0)
        ::_exit(77);
      pid_t t = 0;
      if (::read(pipefd[0], &t, sizeof t) != sizeof t) ::_exit(2);
      Fd pidfd(int(::syscall(SYS_pidfd_open, t, 0)));
      if (!pidfd.valid()) ::_exit(3);
      ConnectIdentity id;
      ::_exit(read_identity(t, pidfd.get(), id) && id.known && id.uids[0] == ::getuid() ? 0 : 4);
    }
    const pid_t target = ::fork();  // its parent, this process, is outside
    if (target == 0) {
      const pid_t self = ::getpid();  // as the namespace numbers it
      if (::write(pipefd[1], &self, sizeof self) != sizeof self) ::_exit(1);
      ::pause();
      ::_exit(0);
    }
    // The reader's exit kills the target, and the reader's exit waits until
    // the target is reaped: reap both, whichever comes first.
    int st = 0;
    for (pid_t w; (w = ::waitpid(-1, &st, 0)) > 0;) {
      if (w == reader) break;
    }
    ::kill(target, SIGKILL);
    while (::waitpid(-1, nullptr, 0) > 0) {
    }
    ::_exit(WIFEXITED(st) ? WEXITSTATUS(st) : 5);
  }
  int st = 0;
  ASSERT_EQ(x, ::waitpid(x, &st, 0));
  ASSERT_TRUE(WIFEXITED(st));
  if (WEXITSTATUS(st) == 77) GTEST_SKIP() << "cannot make a pid and mount namespace here";
  EXPECT_EQ(0, WEXITSTATUS(st));
}

}  // namespace
}  // namespace sv::daemon
