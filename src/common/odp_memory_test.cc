// Tests of odp_memory.cc: another process's address space through its
// pinned handle; protections as process_vm_* keeps them; a handle of a
// process that exited reaches nothing.
#include "common/odp_memory.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace sv {
namespace {

constexpr size_t kPage = 4096;

// A child with three pages at `at` (this process's layout, forked):
// read-write, read-only, PROT_NONE. It waits to be killed.
struct Child {
  pid_t pid = -1;
  Fd pidfd;
  uint8_t* at = nullptr;
  bool start() {
    void* p = mmap(nullptr, 3 * kPage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return false;
    at = static_cast<uint8_t*>(p);
    std::memset(at, 0x5a, 3 * kPage);
    if (mprotect(at + kPage, kPage, PROT_READ) || mprotect(at + 2 * kPage, kPage, PROT_NONE)) return false;
    pid = fork();
    if (pid == 0) {
      for (;;) pause();
    }
    return pid > 0 && pidfd_open(pid, pidfd) == 0;
  }
  void stop() {
    if (pid > 0) kill(pid, SIGKILL), waitpid(pid, nullptr, 0);
    pid = -1;
  }
  ~Child() {
    stop();
    if (at) munmap(at, 3 * kPage);
  }
};

TEST(OdpMemory, ReachesAnotherProcessAsItsProtectionsAllow) {
  Child c;
  ASSERT_TRUE(c.start());
  std::shared_ptr<const OdpMemory> m;
  ASSERT_EQ(0, OdpMemory::open(c.pid, c.pidfd.get(), m));
  uint8_t b[16];
  std::memset(b, 0x11, sizeof b);
  const uint64_t a = uint64_t(uintptr_t(c.at));
  EXPECT_EQ(0, m->write(a, b, sizeof b));
  uint8_t r[16] = {};
  EXPECT_EQ(0, m->read(a, r, sizeof r));
  EXPECT_EQ(0, std::memcmp(b, r, sizeof b));
  EXPECT_EQ(0x5a, c.at[0]) << "the write reached this process, not the child";
  EXPECT_EQ(0, m->read(a + kPage, r, sizeof r));  // read-only: readable
  EXPECT_EQ(EFAULT, m->write(a + kPage, b, sizeof b)) << "a read-only page was written (FOLL_FORCE)";
  EXPECT_EQ(EFAULT, m->read(a + 2 * kPage, r, sizeof r)) << "a PROT_NONE page was read";
  EXPECT_EQ(EFAULT, m->write(a + kPage - 8, b, sizeof b)) << "a write straddling into a read-only page";
}

TEST(OdpMemory, AHandleOfAnExitedProcessReachesNothing) {
  Child c;
  ASSERT_TRUE(c.start());
  std::shared_ptr<const OdpMemory> m;
  ASSERT_EQ(0, OdpMemory::open(c.pid, c.pidfd.get(), m));
  c.stop();
  uint8_t b[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  const uint64_t a = uint64_t(uintptr_t(c.at));
  EXPECT_NE(0, m->write(a, b, sizeof b));
  EXPECT_NE(0, m->read(a, b, sizeof b));
  // And one opened for a pidfd of an exited process is refused.
  Child d;
  ASSERT_TRUE(d.start());
  Fd pidfd;
  ASSERT_EQ(0, pidfd_open(d.pid, pidfd));
  const pid_t pid = d.pid;
  d.stop();
  EXPECT_EQ(ESRCH, OdpMemory::open(pid, pidfd.get(), m));
}

TEST(OdpMemory, PidfdIdentityDiffersBetweenProcesses) {
  Fd self;
  ASSERT_EQ(0, pidfd_open(getpid(), self));
  const uint64_t mine = pidfd_identity(self.get());
  if (mine == 0) GTEST_SKIP() << "pidfds are not pidfs inodes here (Linux < 6.9)";
  Fd again;
  ASSERT_EQ(0, pidfd_open(getpid(), again));
  EXPECT_EQ(mine, pidfd_identity(again.get()));
  Child c;
  ASSERT_TRUE(c.start());
  EXPECT_NE(mine, pidfd_identity(c.pidfd.get()));
}

}  // namespace
}  // namespace sv
