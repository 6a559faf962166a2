// Registration of memory that other mappings share (docs/MEMORY.md, "Every
// kind of memory"): shared anonymous memory, a memfd, POSIX and SysV shared
// memory, tmpfs and ext4 files mapped MAP_SHARED, and private huge pages.
// The kernel pins such pages and a NIC reaches the memory every mapping
// sees; so here: what a peer writes through the key is seen through a
// second mapping of the same memory, what is written there is what the
// peer reads, atomics land in it, and the registrant's own SGEs in it work.
// A file truncated under its MR fails the access beyond its end (the key's
// error), and no process gets SIGBUS. RLIMIT_MEMLOCK counts such an MR's
// pages as the kernel's pinning does.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/capability.h>
#include <sys/ipc.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/shm.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

#include "harness.h"

namespace svtest {
namespace shared_memory_test {  // this file's own (unity builds join files)
namespace {

constexpr size_t kLen = 64 * 1024;

enum class Kind { kSharedAnon, kMemfd, kPosixShm, kSysv, kTmpfsFile, kDiskFile, kHugetlbPrivate, kHugetlbShared };

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::kSharedAnon: return "SharedAnonymous";
    case Kind::kMemfd: return "Memfd";
    case Kind::kPosixShm: return "PosixShm";
    case Kind::kSysv: return "SysvShm";
    case Kind::kTmpfsFile: return "TmpfsFile";
    case Kind::kDiskFile: return "DiskFile";
    case Kind::kHugetlbPrivate: return "HugetlbPrivate";
    case Kind::kHugetlbShared: return "HugetlbShared";
  }
  return "?";
}

// `len` bytes of memory of one kind: `mem` is what is registered, `view` a
// second mapping of the same memory (mem itself for private memory), `fd`
// the file where the kind has one (for truncation).
struct Memory {
  uint8_t* mem = nullptr;
  uint8_t* view = nullptr;
  size_t len = 0;
  int fd = -1;
  int shmid = -1;
  std::string path;
  std::string skip;  // non-empty: this machine cannot make this kind

  Memory(Kind k, size_t n) : len(n) {
    switch (k) {
      case Kind::kSharedAnon: {
        void* p = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        mem = view = p == MAP_FAILED ? nullptr : static_cast<uint8_t*>(p);
        return;
      }
      case Kind::kSysv: {
        shmid = shmget(IPC_PRIVATE, n, IPC_CREAT | 0600);
        if (shmid < 0) return;
        void* a = shmat(shmid, nullptr, 0);
        void* b = shmat(shmid, nullptr, 0);
        shmctl(shmid, IPC_RMID, nullptr);
        if (a != reinterpret_cast<void*>(-1)) mem = static_cast<uint8_t*>(a);
        if (b != reinterpret_cast<void*>(-1)) view = static_cast<uint8_t*>(b);
        return;
      }
      case Kind::kHugetlbPrivate:
      case Kind::kHugetlbShared: {
        const int type = k == Kind::kHugetlbShared ? MAP_SHARED : MAP_PRIVATE;
        void* p = mmap(nullptr, n, PROT_READ | PROT_WRITE, type | MAP_ANONYMOUS | MAP_HUGETLB, -1, 0);
        if (p == MAP_FAILED) {
          skip = "no huge pages reserved here (vm.nr_hugepages)";
          return;
        }
        mem = view = static_cast<uint8_t*>(p);
        return;
      }
      case Kind::kMemfd: fd = memfd_create("shared_memory_test", MFD_CLOEXEC); break;
      case Kind::kPosixShm: {
        const std::string name = "/sv_shared_memory_test." + std::to_string(getpid());
        fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        shm_unlink(name.c_str());
        break;
      }
      case Kind::kTmpfsFile:
      case Kind::kDiskFile: {
        const char* dir = k == Kind::kTmpfsFile ? "/dev/shm" : (getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
        path = std::string(dir) + "/sv_shared_memory_test.XXXXXX";
        fd = mkostemp(path.data(), O_CLOEXEC);
        break;
      }
    }
    if (fd < 0 || ftruncate(fd, off_t(n)) != 0) return;
    void* a = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    void* b = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (a != MAP_FAILED) mem = static_cast<uint8_t*>(a);
    if (b != MAP_FAILED) view = static_cast<uint8_t*>(b);
  }
  ~Memory() {
    if (shmid >= 0) {
      if (mem) shmdt(mem);
      if (view) shmdt(view);
    } else {
      if (view && view != mem) munmap(view, len);
      if (mem) munmap(mem, len);
    }
    if (fd >= 0) close(fd);
    if (!path.empty()) unlink(path.c_str());
  }
  bool ok() const { return mem && view; }
};

constexpr int kAccess =
    IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;

// This process and a peer process of the same user, connected; the peer's
// buffer holds pattern(9).
struct Pair {
  Side me;
  Peer peer;
  PeerInfo info{};
  bool ok = false;
  Pair() {
    ok = connect_pair(me, peer, info) == 0;
    if (ok) peer.fill(9);
  }
};

// Posts one signalled RDMA WRITE from [addr, addr+len) (lkey) to the peer's
// buffer at offset `off`, and returns its completion.
ibv_wc write_to_peer(Pair& t, uint32_t lkey, const uint8_t* addr, uint32_t len, uint64_t off) {
  ibv_sge sge{uint64_t(uintptr_t(addr)), len, lkey};
  ibv_send_wr wr{};
  wr.wr_id = 77;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = t.info.addr + off;
  wr.wr.rdma.rkey = t.info.rkey;
  ibv_send_wr* bad = nullptr;
  ibv_wc wc{};
  wc.status = IBV_WC_GENERAL_ERR;
  if (ibv_post_send(t.me.qp, &wr, &bad) != 0) return wc;
  auto got = poll(t.me.cq, 1);
  return got.size() == 1 ? got[0] : wc;
}

class SharedMemory : public ::testing::TestWithParam<Kind> {};

// The peer's WRITE is seen through the other mapping, what that mapping
// holds is what the peer READs back, and 100 fetch-and-adds land in it.
TEST_P(SharedMemory, APeerReachesTheMemoryEveryMappingSees) {
  Memory m(GetParam(), kLen);
  if (!m.skip.empty()) GTEST_SKIP() << m.skip;
  ASSERT_TRUE(m.ok()) << strerror(errno);
  Pair t;
  ASSERT_TRUE(t.ok);
  ibv_mr* mr = ibv_reg_mr(t.me.pd, m.mem, kLen, kAccess);
  ASSERT_NE(nullptr, mr) << kind_name(GetParam()) << ": " << strerror(errno);
  EXPECT_EQ(m.mem, mr->addr);
  const uint64_t base = uint64_t(uintptr_t(m.mem));
  // WRITE 4 KiB + 3 bytes at an odd offset: byte granularity.
  ibv_wc wc = t.peer.post(IBV_WR_RDMA_WRITE, 0, 4099, base + 5, mr->rkey);
  ASSERT_EQ(IBV_WC_SUCCESS, wc.status) << ibv_wc_status_str(wc.status);
  EXPECT_EQ(t.peer.checksum(0, 4099), checksum(m.view + 5, 4099));
  EXPECT_EQ(0, m.view[4]);
  EXPECT_EQ(0, m.view[5 + 4099]);
  // What the other mapping writes is what the peer reads.
  for (size_t i = 0; i < 8192; i++) m.view[16384 + i] = pattern(3, i);
  wc = t.peer.post(IBV_WR_RDMA_READ, 0, 8192, base + 16384, mr->rkey);
  ASSERT_EQ(IBV_WC_SUCCESS, wc.status) << ibv_wc_status_str(wc.status);
  EXPECT_EQ(checksum(m.view + 16384, 8192), t.peer.checksum(0, 8192));
  // Atomics on a word of the memory.
  ASSERT_EQ(0, t.peer.fetch_add(100, base + 32768, mr->rkey));
  uint64_t word = 0;
  std::memcpy(&word, m.view + 32768, 8);
  EXPECT_EQ(100u, word);
  EXPECT_EQ(0, ibv_dereg_mr(mr));
}

// The registrant's own SGE in such memory: its WRITE carries what the
// other mapping wrote.
TEST_P(SharedMemory, TheRegistrantsOwnSgeCarriesTheMemory) {
  Memory m(GetParam(), kLen);
  if (!m.skip.empty()) GTEST_SKIP() << m.skip;
  ASSERT_TRUE(m.ok()) << strerror(errno);
  Pair t;
  ASSERT_TRUE(t.ok);
  ibv_mr* mr = ibv_reg_mr(t.me.pd, m.mem, kLen, kAccess);
  ASSERT_NE(nullptr, mr) << kind_name(GetParam()) << ": " << strerror(errno);
  for (size_t i = 0; i < 12000; i++) m.view[100 + i] = pattern(5, i);
  ibv_wc wc = write_to_peer(t, mr->lkey, m.mem + 100, 12000, 64);
  ASSERT_EQ(IBV_WC_SUCCESS, wc.status) << ibv_wc_status_str(wc.status);
  EXPECT_EQ(checksum(m.view + 100, 12000), t.peer.checksum(64, 12000));
  EXPECT_EQ(0, ibv_dereg_mr(mr));
}

INSTANTIATE_TEST_SUITE_P(Kinds, SharedMemory,
                         ::testing::Values(Kind::kSharedAnon, Kind::kMemfd, Kind::kPosixShm, Kind::kSysv,
                                           Kind::kTmpfsFile, Kind::kDiskFile, Kind::kHugetlbPrivate,
                                           Kind::kHugetlbShared),
                         [](const ::testing::TestParamInfo<Kind>& i) { return std::string(kind_name(i.param)); });

// A file truncated under its MR: the peer's WRITE and READ beyond the new
// end complete with the remote access error; within it they still work;
// neither process is killed (no SIGBUS).
TEST(SharedMemoryFile, TruncationFailsAccessBeyondTheEndAndKillsNoOne) {
  for (Kind k : {Kind::kTmpfsFile, Kind::kDiskFile, Kind::kMemfd}) {
    SCOPED_TRACE(kind_name(k));
    Memory m(k, kLen);
    ASSERT_TRUE(m.ok()) << strerror(errno);
    Pair t;
    ASSERT_TRUE(t.ok);
    ibv_mr* mr = ibv_reg_mr(t.me.pd, m.mem, kLen, kAccess);
    ASSERT_NE(nullptr, mr) << strerror(errno);
    ASSERT_EQ(0, ftruncate(m.fd, kLen / 2));
    const uint64_t base = uint64_t(uintptr_t(m.mem));
    ibv_wc wc = t.peer.post(IBV_WR_RDMA_WRITE, 0, 256, base + 100, mr->rkey);
    EXPECT_EQ(IBV_WC_SUCCESS, wc.status) << ibv_wc_status_str(wc.status);
    EXPECT_EQ(t.peer.checksum(0, 256), checksum(m.view + 100, 256));
    wc = t.peer.post(IBV_WR_RDMA_WRITE, 0, 256, base + kLen / 2 + 4096, mr->rkey);
    EXPECT_EQ(IBV_WC_REM_ACCESS_ERR, wc.status) << ibv_wc_status_str(wc.status);
    int st = 0;
    EXPECT_EQ(0, waitpid(t.peer.pid(), &st, WNOHANG)) << "the peer died";
    EXPECT_EQ(0, ibv_dereg_mr(mr));
  }
}

// A buffer on the calling thread's own stack (the backing file's
// conversion would stop the thread): registered through its owner, a
// peer's WRITE lands in it and its READ returns it.
TEST(SharedMemoryFile, ABufferOnTheCallersStackRegisters) {
  Pair t;
  ASSERT_TRUE(t.ok);
  alignas(64) uint8_t stack_buf[16384];
  std::memset(stack_buf, 0, sizeof stack_buf);
  ibv_mr* mr = ibv_reg_mr(t.me.pd, stack_buf, sizeof stack_buf, kAccess);
  ASSERT_NE(nullptr, mr) << strerror(errno);
  const uint64_t base = uint64_t(uintptr_t(stack_buf));
  ibv_wc wc = t.peer.post(IBV_WR_RDMA_WRITE, 0, 5000, base + 7, mr->rkey);
  ASSERT_EQ(IBV_WC_SUCCESS, wc.status) << ibv_wc_status_str(wc.status);
  EXPECT_EQ(t.peer.checksum(0, 5000), checksum(stack_buf + 7, 5000));
  for (size_t i = 0; i < 4096; i++) stack_buf[8192 + i] = pattern(4, i);
  wc = t.peer.post(IBV_WR_RDMA_READ, 0, 4096, base + 8192, mr->rkey);
  ASSERT_EQ(IBV_WC_SUCCESS, wc.status) << ibv_wc_status_str(wc.status);
  EXPECT_EQ(checksum(stack_buf + 8192, 4096), t.peer.checksum(0, 4096));
  EXPECT_EQ(0, ibv_dereg_mr(mr));
}

// Memory unmapped under its MR: the peer's WRITE and READ complete with the
// remote access error and neither process gets a signal.
TEST(SharedMemoryFile, UnmappedMemoryFailsTheAccessAndKillsNoOne) {
  Pair t;
  ASSERT_TRUE(t.ok);
  void* p = mmap(nullptr, kLen, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(MAP_FAILED, p);
  ibv_mr* mr = ibv_reg_mr(t.me.pd, p, kLen, kAccess);
  ASSERT_NE(nullptr, mr) << strerror(errno);
  const uint64_t base = uint64_t(uintptr_t(p));
  ASSERT_EQ(0, munmap(static_cast<uint8_t*>(p) + kLen / 2, kLen / 2));
  ibv_wc wc = t.peer.post(IBV_WR_RDMA_WRITE, 0, 256, base + 64, mr->rkey);
  EXPECT_EQ(IBV_WC_SUCCESS, wc.status) << ibv_wc_status_str(wc.status);
  wc = t.peer.post(IBV_WR_RDMA_READ, 0, 256, base + kLen / 2 + 100, mr->rkey);
  EXPECT_EQ(IBV_WC_REM_ACCESS_ERR, wc.status) << ibv_wc_status_str(wc.status);
  int st = 0;
  EXPECT_EQ(0, waitpid(t.peer.pid(), &st, WNOHANG)) << "the peer died";
  EXPECT_EQ(0, ibv_dereg_mr(mr));
  munmap(p, kLen / 2);
}

bool drop_ipc_lock() {
  __user_cap_header_struct h{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct d[2]{};
  if (syscall(SYS_capget, &h, d) != 0) return false;
  d[0].effective &= ~(1u << CAP_IPC_LOCK);
  return syscall(SYS_capset, &h, d) == 0;
}

// RLIMIT_MEMLOCK counts a shared mapping's MR as the kernel counts pinned
// pages: beyond the limit ENOMEM, within it registered, and the charge
// returns at deregistration.
TEST(SharedMemoryFile, MemlockCountsTheMrsPages) {
  const pid_t pid = fork();
  if (pid == 0) {
    if (!drop_ipc_lock()) _exit(10);
    rlimit rl{64 * 1024, 64 * 1024};
    if (setrlimit(RLIMIT_MEMLOCK, &rl) != 0) _exit(11);
    Side s;
    Side::Options o;
    o.len = 4096;
    if (s.open(o)) _exit(12);
    Memory m(Kind::kSharedAnon, 128 * 1024);
    if (!m.ok()) _exit(13);
    errno = 0;
    if (ibv_reg_mr(s.pd, m.mem, 64 * 1024, kAccess) || errno != ENOMEM) _exit(14);
    ibv_mr* a = ibv_reg_mr(s.pd, m.mem, 48 * 1024, kAccess);
    if (!a) _exit(15);
    if (ibv_reg_mr(s.pd, m.mem + 64 * 1024, 16 * 1024, kAccess) || errno != ENOMEM) _exit(16);
    if (ibv_dereg_mr(a)) _exit(17);
    ibv_mr* b = ibv_reg_mr(s.pd, m.mem + 64 * 1024, 56 * 1024, kAccess);
    if (!b) _exit(18);
    _exit(ibv_dereg_mr(b) ? 19 : 0);
  }
  int st = 0;
  ASSERT_EQ(pid, waitpid(pid, &st, 0));
  ASSERT_TRUE(WIFEXITED(st));
  EXPECT_EQ(0, WEXITSTATUS(st));
}

}  // namespace
}  // namespace shared_memory_test
}  // namespace svtest
