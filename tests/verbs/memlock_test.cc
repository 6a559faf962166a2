// The resource manager: registrations are charged to the registrant's
// RLIMIT_MEMLOCK (whole pages, each registration separately, as the kernel
// charges pinned pages) and refused with ENOMEM beyond it, unless the
// process has CAP_IPC_LOCK.
#include <gtest/gtest.h>
#include <linux/capability.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cerrno>
#include <cstring>
#include <cstdio>

#include "harness.h"

namespace svtest {
namespace {

bool drop_ipc_lock() {
  __user_cap_header_struct h{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct d[2]{};
  if (syscall(SYS_capget, &h, d) != 0) return false;
  d[0].effective &= ~(1u << CAP_IPC_LOCK);
  return syscall(SYS_capset, &h, d) == 0;
}

// Runs `body` in a child process and returns its exit status.
template <class F>
int in_child(F body) {
  pid_t pid = fork();
  if (pid == 0) _exit(body());
  int st = 0;
  waitpid(pid, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 100;
}

// In a child: no CAP_IPC_LOCK, RLIMIT_MEMLOCK 64 KiB, and `s` opened with a
// 4 KiB buffer of its own (charged: the process's backing is known to the
// daemon from then on). 0, or the test's code for the step that failed.
int open_under_64k_limit(Side& s) {
  if (!drop_ipc_lock()) return 10;
  rlimit rl{64 * 1024, 64 * 1024};
  if (setrlimit(RLIMIT_MEMLOCK, &rl) != 0) return 11;
  Side::Options o;
  o.len = 4096;
  return s.open(o) ? 12 : 0;
}

TEST(Memlock, RegistrationBeyondTheLimitIsRefusedWithEnomem) {
  int rc = in_child([] {
    Side s;
    if (int e = open_under_64k_limit(s)) return e;
    void* a = nullptr;
    if (posix_memalign(&a, 4096, 256 * 1024)) return 13;
    auto* b = static_cast<uint8_t*>(a);
    ibv_mr* m1 = ibv_reg_mr(s.pd, b, 32 * 1024, IBV_ACCESS_LOCAL_WRITE);
    if (!m1) return 14;
    errno = 0;
    ibv_mr* m2 = ibv_reg_mr(s.pd, b + 64 * 1024, 40 * 1024, IBV_ACCESS_LOCAL_WRITE);
    if (m2 || errno != ENOMEM) return 15;
    // Redundant registrations are charged again: the same 32 KiB once more fits
    // (4 + 32 + 28 < 64 KiB) only while it is smaller than what is left.
    ibv_mr* m3 = ibv_reg_mr(s.pd, b, 24 * 1024, IBV_ACCESS_LOCAL_WRITE);
    if (!m3) return 16;
    ibv_mr* m4 = ibv_reg_mr(s.pd, b, 8 * 1024, IBV_ACCESS_LOCAL_WRITE);
    if (m4 || errno != ENOMEM) return 17;
    // Freeing returns the charge.
    if (ibv_dereg_mr(m1)) return 18;
    m2 = ibv_reg_mr(s.pd, b + 64 * 1024, 20 * 1024, IBV_ACCESS_LOCAL_WRITE);
    if (!m2) return 19;
    // Byte granularity is charged by the pages it touches: 2 bytes across a page boundary = 2 pages.
    ibv_mr* m5 = ibv_reg_mr(s.pd, b + 128 * 1024 - 1, 2, IBV_ACCESS_LOCAL_WRITE);
    if (!m5) return 20;
    // Charged now: 4 + 24 + 20 + 8 = 56 KiB; 12 KiB more would exceed 64 KiB, 8 KiB fits.
    ibv_mr* m6 = ibv_reg_mr(s.pd, b + 160 * 1024, 12 * 1024, IBV_ACCESS_LOCAL_WRITE);
    if (m6 || errno != ENOMEM) return 21;
    if (!ibv_reg_mr(s.pd, b + 160 * 1024, 8 * 1024, IBV_ACCESS_LOCAL_WRITE)) return 22;
    return 0;
  });
  if (rc == 10 || rc == 11) GTEST_SKIP() << "cannot drop CAP_IPC_LOCK or set RLIMIT_MEMLOCK here";
  EXPECT_EQ(0, rc);
}

// ibv_rereg_mr with a new translation moves the MR's charge: the new pages
// are charged, the old range's charge counts as released (the whole limit
// is there for the move), and a move beyond the limit changes nothing.
TEST(Memlock, ReregTranslationMovesTheCharge) {
  int rc = in_child([] {
    Side s;
    if (int e = open_under_64k_limit(s)) return e;
    void* a = nullptr;
    if (posix_memalign(&a, 4096, 256 * 1024)) return 13;
    auto* b = static_cast<uint8_t*>(a);
    ibv_mr* m = ibv_reg_mr(s.pd, b, 32 * 1024, IBV_ACCESS_LOCAL_WRITE);  // 36 KiB
    if (!m) return 14;
    // 4 + 48 = 52 KiB after the move (36 + 48 would not fit).
    if (ibv_rereg_mr(m, IBV_REREG_MR_CHANGE_TRANSLATION, nullptr, b + 64 * 1024, 48 * 1024, 0)) return 15;
    errno = 0;
    if (ibv_reg_mr(s.pd, b + 128 * 1024, 16 * 1024, IBV_ACCESS_LOCAL_WRITE) || errno != ENOMEM) return 16;
    if (!ibv_reg_mr(s.pd, b + 128 * 1024, 12 * 1024, IBV_ACCESS_LOCAL_WRITE)) return 17;  // 64 KiB
    errno = 0;
    if (ibv_rereg_mr(m, IBV_REREG_MR_CHANGE_TRANSLATION, nullptr, b, 52 * 1024, 0) != IBV_REREG_MR_ERR_CMD ||
        errno != ENOMEM)
      return 18;
    if (m->addr != b + 64 * 1024 || m->length != 48 * 1024) return 19;
    if (ibv_rereg_mr(m, IBV_REREG_MR_CHANGE_TRANSLATION, nullptr, b, 48 * 1024, 0)) return 20;  // 64 KiB again
    return 0;
  });
  if (rc == 10 || rc == 11) GTEST_SKIP() << "cannot drop CAP_IPC_LOCK or set RLIMIT_MEMLOCK here";
  EXPECT_EQ(0, rc);
}

TEST(Memlock, CapIpcLockLiftsTheLimit) {
  int rc = in_child([] {
    __user_cap_header_struct h{_LINUX_CAPABILITY_VERSION_3, 0};
    __user_cap_data_struct d[2]{};
    if (syscall(SYS_capget, &h, d) != 0 || !(d[0].effective & (1u << CAP_IPC_LOCK))) return 10;
    rlimit rl{4096, 4096};
    if (setrlimit(RLIMIT_MEMLOCK, &rl) != 0) return 11;
    Side s;
    Side::Options o;
    o.len = 1 << 20;
    return s.open(o) == 0 ? 0 : 12;
  });
  if (rc == 10 || rc == 11) GTEST_SKIP() << "no CAP_IPC_LOCK here";
  EXPECT_EQ(0, rc);
}

// As in the kernel's ib_umem_get, CAP_IPC_LOCK is consulted only
// for a charge beyond RLIMIT_MEMLOCK (so that a registration within the
// limit costs the daemon no capget(2) and no read of the namespace's link),
// and there it must still be held: a process that dropped it after lifting
// the limit once is refused the next charge beyond the limit, and within
// the limit it needs no capability at all.
TEST(Memlock, CapIpcLockCountsBeyondTheLimitOnlyWhileHeld) {
  int rc = in_child([] {
    __user_cap_header_struct h{_LINUX_CAPABILITY_VERSION_3, 0};
    __user_cap_data_struct d[2]{};
    if (syscall(SYS_capget, &h, d) != 0 || !(d[0].effective & (1u << CAP_IPC_LOCK))) return 10;
    rlimit rl{64 * 1024, 64 * 1024};
    if (setrlimit(RLIMIT_MEMLOCK, &rl) != 0) return 11;
    Side s;
    Side::Options o;
    o.len = 4096;
    if (s.open(o)) return 12;
    auto* b = static_cast<uint8_t*>(
        mmap(nullptr, 1 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    if (b == MAP_FAILED) return 13;
    ibv_mr* within = ibv_reg_mr(s.pd, b, 16 * 1024, IBV_ACCESS_LOCAL_WRITE);  // 20 KiB in all
    if (!within) return 14;
    ibv_mr* beyond = ibv_reg_mr(s.pd, b + 64 * 1024, 512 * 1024, IBV_ACCESS_LOCAL_WRITE);  // the capability
    if (!beyond) return 15;
    if (!drop_ipc_lock()) return 16;
    errno = 0;
    if (ibv_reg_mr(s.pd, b + 768 * 1024, 4096, IBV_ACCESS_LOCAL_WRITE) || errno != ENOMEM) return 17;
    if (ibv_dereg_mr(beyond)) return 18;
    // 20 KiB charged again: within the limit, no capability needed; beyond
    // it (20 + 48 > 64 KiB), refused.
    ibv_mr* again = ibv_reg_mr(s.pd, b + 64 * 1024, 40 * 1024, IBV_ACCESS_LOCAL_WRITE);  // 60 KiB
    if (!again) return 19;
    errno = 0;
    if (ibv_reg_mr(s.pd, b + 128 * 1024, 8 * 1024, IBV_ACCESS_LOCAL_WRITE) || errno != ENOMEM) return 20;
    if (ibv_dereg_mr(again) || ibv_dereg_mr(within)) return 21;
    return 0;
  });
  if (rc == 10 || rc == 11) GTEST_SKIP() << "no CAP_IPC_LOCK here, or cannot set RLIMIT_MEMLOCK";
  EXPECT_EQ(0, rc);
}

// Whether the page at `p` is a mapping of the library's backing file.
bool backed(const void* p) {
  FILE* f = std::fopen("/proc/self/maps", "r");
  if (!f) return false;
  char line[512];
  bool found = false;
  const auto a = reinterpret_cast<uintptr_t>(p);
  while (std::fgets(line, sizeof line, f)) {
    unsigned long lo = 0, hi = 0;
    if (std::sscanf(line, "%lx-%lx", &lo, &hi) == 2 && a >= lo && a < hi) {
      found = std::strstr(line, "softverbs-backing") != nullptr;
      break;
    }
  }
  std::fclose(f);
  return found;
}

// Once the process's backing is known to the daemon, a
// registration is recorded by the daemon while its pages are converted.
// Either side failing undoes the other: a conversion that fails (part of
// the range unmapped) leaves no MR and no charge behind, and a
// registration the limit refuses leaves its pages private, not backed.
TEST(Memlock, AFailedRegistrationLeavesNeitherChargeNorBackedPages) {
  int rc = in_child([] {
    Side s;
    if (int e = open_under_64k_limit(s)) return e;
    auto* b = static_cast<uint8_t*>(
        mmap(nullptr, 64 * 1024, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    if (b == MAP_FAILED) return 13;
    std::memset(b, 7, 64 * 1024);
    if (munmap(b + 48 * 1024, 4096) != 0) return 14;  // a hole in the last 16 KiB
    // Each would be charged 52 KiB: a charge left behind by any of them
    // would refuse the next.
    for (int i = 0; i < 8; ++i) {
      errno = 0;
      if (ibv_reg_mr(s.pd, b, 52 * 1024, IBV_ACCESS_LOCAL_WRITE) || errno != EFAULT) return 20 + i;
      if (backed(b)) return 30 + i;
    }
    ibv_mr* ok = ibv_reg_mr(s.pd, b, 44 * 1024, IBV_ACCESS_LOCAL_WRITE);
    if (!ok || !backed(b)) return 40;
    if (ibv_dereg_mr(ok) || backed(b)) return 41;
    // Refused by the limit (4 + 64 > 64 KiB) after its pages were converted:
    // they are private again, contents kept.
    auto* c = static_cast<uint8_t*>(
        mmap(nullptr, 64 * 1024, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    if (c == MAP_FAILED) return 42;
    std::memset(c, 9, 64 * 1024);
    errno = 0;
    if (ibv_reg_mr(s.pd, c, 64 * 1024, IBV_ACCESS_LOCAL_WRITE) || errno != ENOMEM) return 43;
    if (backed(c) || backed(c + 60 * 1024) || c[0] != 9 || c[64 * 1024 - 1] != 9) return 44;
    return 0;
  });
  if (rc == 10 || rc == 11) GTEST_SKIP() << "cannot drop CAP_IPC_LOCK or set RLIMIT_MEMLOCK here";
  EXPECT_EQ(0, rc);
}

}  // namespace
}  // namespace svtest
