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

#include <atomic>
#include <cerrno>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

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

// The check from the maps text (kernels before PROCMAP_QUERY) decides as
// the protections do, across mapping boundaries and holes.
TEST(OdpMemory, TheMapsTextAllowsAsTheProtectionsDo) {
  Child c;
  ASSERT_TRUE(c.start());
  std::shared_ptr<const OdpMemory> m;
  ASSERT_EQ(0, OdpMemory::open(c.pid, c.pidfd.get(), m));
  const uint64_t a = uint64_t(uintptr_t(c.at));
  EXPECT_EQ(0, m->allows_by_text(a, kPage, true));
  EXPECT_EQ(0, m->allows_by_text(a, 2 * kPage, false));            // read-write, then read-only
  EXPECT_EQ(EFAULT, m->allows_by_text(a + kPage - 8, 16, true));  // into the read-only page
  EXPECT_EQ(EFAULT, m->allows_by_text(a + 2 * kPage, 8, false));  // PROT_NONE
  EXPECT_EQ(EFAULT, m->allows_by_text(a, 3 * kPage, false));      // runs into it
  EXPECT_EQ(EFAULT, m->allows_by_text(8, 8, false));              // nothing mapped there
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

// This process's own memory: writes of every size (both of write()'s copies,
// the pipe and process_vm_writev, are taken in turn as it measures them)
// land byte exact; a range over an unmapped, read-only or PROT_NONE page
// fails with EFAULT, no signal raised, the page untouched, the bytes after
// it not written; the next write succeeds (the pipe a failure left dirty is
// not reused).
TEST(OdpMemory, OwnMemoryWritesLandOrFailWithoutASignal) {
  std::shared_ptr<const OdpMemory> mem;
  ASSERT_EQ(0, OdpMemory::open_self(mem));
  constexpr size_t kLen = 64 * kPage;
  void* p = mmap(nullptr, kLen, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(MAP_FAILED, p);
  auto* at = static_cast<uint8_t*>(p);
  std::vector<uint8_t> src(kLen);
  for (int round = 0; round < 80; ++round) {
    const size_t n = round % 3 == 0 ? 8 : round % 3 == 1 ? 20 * kPage + 3 : kLen - 16;
    for (size_t i = 0; i < n; ++i) src[i] = uint8_t(i * 7 + round);
    ASSERT_EQ(0, mem->write(uint64_t(uintptr_t(at + 8)), src.data(), n)) << round;
    ASSERT_EQ(0, std::memcmp(at + 8, src.data(), n)) << round;
  }
  const uint64_t hole_at = uint64_t(uintptr_t(at)) + 8 * kPage;
  for (int kind = 0; kind < 3; ++kind) {
    SCOPED_TRACE(kind == 0 ? "PROT_READ" : kind == 1 ? "PROT_NONE" : "unmapped");
    for (int round = 0; round < 40; ++round) {
      std::memset(at, 0x11, 8 * kPage);
      if (kind < 2) {
        ASSERT_EQ(0, mprotect(at + 8 * kPage, kPage, PROT_READ | PROT_WRITE));
        std::memset(at + 8 * kPage, 0x11, 2 * kPage);
        ASSERT_EQ(0, mprotect(at + 8 * kPage, kPage, kind == 0 ? PROT_READ : PROT_NONE));
      } else if (round == 0) {
        ASSERT_EQ(0, munmap(at + 8 * kPage, kPage));
        std::memset(at + 9 * kPage, 0x11, kPage);
      }
      std::memset(src.data(), 0x22, kLen);
      EXPECT_EQ(EFAULT, mem->write(hole_at - 4 * kPage, src.data(), 6 * kPage)) << round;
      if (kind < 2) {
        ASSERT_EQ(0, mprotect(at + 8 * kPage, kPage, PROT_READ));
        EXPECT_EQ(0x11, at[8 * kPage]);
        EXPECT_EQ(0x11, at[9 * kPage - 1]);
      }
      EXPECT_EQ(0x11, at[9 * kPage]) << "bytes after the hole";
      EXPECT_EQ(0x11, at[4 * kPage - 1]) << "bytes before the range";
      ASSERT_EQ(0, mem->write(uint64_t(uintptr_t(at)), src.data(), 8 * kPage - 1)) << round;
      EXPECT_EQ(0x22, at[8 * kPage - 2]);
    }
  }
  munmap(at, kLen);
}

// Threads and a fork child each copy through a pipe of their own: their
// bytes never mix.
TEST(OdpMemory, OwnMemoryWritesOfThreadsAndAForkChildDoNotMix) {
  std::shared_ptr<const OdpMemory> mem;
  ASSERT_EQ(0, OdpMemory::open_self(mem));
  constexpr size_t kLen = 32 * kPage;
  std::vector<uint8_t> warm(kLen, 1), scratch(kLen);
  ASSERT_EQ(0, mem->write(uint64_t(uintptr_t(scratch.data())), warm.data(), kLen));  // this thread's pipe exists
  const pid_t child = fork();
  if (child == 0) {
    std::shared_ptr<const OdpMemory> own;
    if (OdpMemory::open_self(own)) _exit(1);
    std::vector<uint8_t> a(kLen), b(kLen);
    for (int i = 0; i < 3000; ++i) {
      std::memset(a.data(), i, kLen);
      if (own->write(uint64_t(uintptr_t(b.data())), a.data(), kLen) || std::memcmp(a.data(), b.data(), kLen)) _exit(2);
    }
    _exit(0);
  }
  ASSERT_GT(child, 0);
  std::atomic<int> bad{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < 3; ++t)
    ts.emplace_back([&, t] {
      std::vector<uint8_t> a(kLen), b(kLen);
      for (int i = 0; i < 3000; ++i) {
        std::memset(a.data(), t * 64 + i % 64, kLen);
        if (mem->write(uint64_t(uintptr_t(b.data())), a.data(), kLen) || std::memcmp(a.data(), b.data(), kLen)) ++bad;
      }
    });
  std::vector<uint8_t> a(kLen), b(kLen);  // this thread too, with the pipe the child inherited
  for (int i = 0; i < 3000; ++i) {
    std::memset(a.data(), 0xf0 | (i % 16), kLen);
    if (mem->write(uint64_t(uintptr_t(b.data())), a.data(), kLen) || std::memcmp(a.data(), b.data(), kLen)) ++bad;
  }
  for (std::thread& t : ts) t.join();
  EXPECT_EQ(0, bad.load());
  int st = 0;
  ASSERT_EQ(child, waitpid(child, &st, 0));
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << st;
}

}  // namespace
}  // namespace sv
