// Memory other mappings share, registered through its owner (docs/MEMORY.md,
// "Every kind of memory"): root's MR is the middle page of three secret
// pages of shared memory of each kind (memfd, MAP_SHARED anonymous, SysV,
// tmpfs and disk files). Another user (through the daemon) and a peer of
// root's own (directly) read it, write 64 bytes and add 1 to a word in it,
// then write 8 bytes straddling its end: exactly those bytes change, seen
// through root's second mapping of the memory, and nothing around the MR
// does.
#include <gtest/gtest.h>
#include <sys/ipc.h>
#include <sys/mman.h>
#include <sys/shm.h>
#include <unistd.h>

#include <cstring>
#include <iterator>

#include "attack.h"

namespace svsec {
namespace shared_memory_test {  // this file's own (unity builds join files)
namespace {

constexpr int kAll = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                     IBV_ACCESS_REMOTE_ATOMIC;
constexpr size_t kLen = 3 * 4096;
constexpr uint8_t kSecret = 0x5e;

struct Target {
  uint32_t qpn, rkey;
  uint64_t addr;  // the MR's first byte (the middle page)
};
struct Outcome {
  int read, write, add, past_end;
  uint8_t seen;
};
struct Changed {
  int inside, outside;
  uint8_t word0;  // the low byte of the word the peer added 1 to
};

enum class Kind { kMemfd, kSharedAnonymous, kSysv, kTmpfsFile, kDiskFile };

// kLen bytes of `kind`, mapped twice (mem, view); false if it cannot be made.
bool map_twice(Kind kind, uint8_t*& mem, uint8_t*& view) {
  int fd = -1;
  switch (kind) {
    case Kind::kSharedAnonymous:
      mem = view = static_cast<uint8_t*>(mmap(nullptr, kLen, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
      return mem != MAP_FAILED;
    case Kind::kSysv: {
      const int id = shmget(IPC_PRIVATE, kLen, IPC_CREAT | 0600);
      if (id < 0) return false;
      mem = static_cast<uint8_t*>(shmat(id, nullptr, 0));
      view = static_cast<uint8_t*>(shmat(id, nullptr, 0));
      shmctl(id, IPC_RMID, nullptr);
      return mem != reinterpret_cast<uint8_t*>(-1) && view != reinterpret_cast<uint8_t*>(-1);
    }
    case Kind::kMemfd: fd = memfd_create("shared_memory_test", MFD_CLOEXEC); break;
    case Kind::kTmpfsFile:
    case Kind::kDiskFile: {
      char path[] = "/dev/shm/sv_shared_memory_test.XXXXXX";
      char disk[] = "/var/tmp/sv_shared_memory_test.XXXXXX";
      char* p = kind == Kind::kTmpfsFile ? path : disk;
      fd = mkstemp(p);
      unlink(p);
      break;
    }
  }
  if (fd < 0 || ftruncate(fd, kLen)) return false;
  mem = static_cast<uint8_t*>(mmap(nullptr, kLen, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
  view = static_cast<uint8_t*>(mmap(nullptr, kLen, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
  close(fd);
  return mem != MAP_FAILED && view != MAP_FAILED;
}

int root_side(Kind kind, int sock) {
  RcEnd me;
  if (!me.open()) return 10;
  uint8_t *mem = nullptr, *view = nullptr;
  if (!map_twice(kind, mem, view)) return 11;
  std::memset(mem, kSecret, kLen);
  ibv_mr* mr = ibv_reg_mr(me.pd, mem + 4096, 4096, kAll);
  if (!mr) return 12;
  Target t{me.qp->qp_num, mr->rkey, uint64_t(uintptr_t(mem)) + 4096};
  uint32_t peer_qpn = 0;
  if (!send_val(sock, t) || !recv_val(sock, peer_qpn) || qp_to_rts(me.ctx, me.qp, peer_qpn)) return 13;
  int ready = 1, done = 0;
  if (!send_val(sock, ready) || !recv_val(sock, done)) return 14;
  Changed c{};
  for (size_t i = 0; i < kLen; ++i)
    if (view[i] != kSecret) ++(i >= 4096 && i < 8192 ? c.inside : c.outside);
  c.word0 = view[4096 + 512];
  return send_val(sock, c) ? 0 : 15;
}

int peer_side(int sock) {
  RcEnd me;
  if (!me.open()) return 20;
  static uint8_t mine[4096] __attribute__((aligned(4096)));
  ibv_mr* mr = ibv_reg_mr(me.pd, mine, sizeof(mine), kAll);
  if (!mr) return 21;
  Target t{};
  uint32_t qpn = me.qp->qp_num;
  if (!recv_val(sock, t) || !send_val(sock, qpn) || qp_to_rts(me.ctx, me.qp, t.qpn)) return 22;
  int go = 0;
  if (!recv_val(sock, go)) return 23;
  Outcome o{};
  o.read = me.post(IBV_WR_RDMA_READ, mine, 64, mr->lkey, t.addr, t.rkey);
  o.seen = mine[0];
  std::memset(mine, 0xc3, 64);
  o.write = me.post(IBV_WR_RDMA_WRITE, mine, 64, mr->lkey, t.addr + 100, t.rkey);
  o.add = me.post(IBV_WR_ATOMIC_FETCH_AND_ADD, mine + 1024, 8, mr->lkey, t.addr + 512, t.rkey);
  o.past_end = me.post(IBV_WR_RDMA_WRITE, mine, 8, mr->lkey, t.addr + 4096 - 4, t.rkey);
  return send_val(sock, o) ? 0 : 24;
}

void across(bool peer_is_nobody, Kind kind) {
  SystemDaemon sysd;
  ASSERT_TRUE(sysd.alive());
  Child root(false, [kind](int sock) { return root_side(kind, sock); });
  Child peer(peer_is_nobody, peer_side);
  root.start();
  peer.start();
  Target t{};
  ASSERT_TRUE(recv_val(root.sock(), t)) << "root failed: exit " << root.wait();
  ASSERT_TRUE(send_val(peer.sock(), t));
  uint32_t peer_qpn = 0;
  ASSERT_TRUE(recv_val(peer.sock(), peer_qpn)) << "the peer failed: exit " << peer.wait();
  ASSERT_TRUE(send_val(root.sock(), peer_qpn));
  int ready = 0;
  ASSERT_TRUE(recv_val(root.sock(), ready)) << "root failed: exit " << root.wait();
  ASSERT_TRUE(send_val(peer.sock(), ready));
  Outcome got{-1, -1, -1, -1, 0};
  ASSERT_TRUE(recv_val(peer.sock(), got)) << "the peer failed: exit " << peer.wait();
  ASSERT_TRUE(send_val(root.sock(), ready));
  Changed changed{-1, -1, 0};
  EXPECT_TRUE(recv_val(root.sock(), changed));
  EXPECT_EQ(0, root.wait()) << "root's process died";
  EXPECT_EQ(0, peer.wait());
  EXPECT_EQ(IBV_WC_SUCCESS, got.read);
  EXPECT_EQ(kSecret, got.seen);
  EXPECT_EQ(IBV_WC_SUCCESS, got.write);
  EXPECT_EQ(IBV_WC_SUCCESS, got.add);
  EXPECT_EQ(IBV_WC_REM_ACCESS_ERR, got.past_end);
  EXPECT_EQ(64 + 1, changed.inside) << "the WRITE's 64 bytes and the added word's low byte";
  EXPECT_EQ(uint8_t(kSecret + 1), changed.word0);
  EXPECT_EQ(0, changed.outside) << "bytes beyond the MR changed";
}

// Each kind of shared memory, another user (through the daemon) and a peer
// of root's own (directly).
constexpr Kind kKinds[] = {Kind::kMemfd, Kind::kSharedAnonymous, Kind::kSysv, Kind::kTmpfsFile, Kind::kDiskFile};
constexpr const char* kKindNames[] = {"memfd", "MAP_SHARED|MAP_ANONYMOUS", "SysV", "tmpfs file", "disk file"};

TEST(SharedMemoryAcross, AnotherUserReachesExactlyTheKeysRangeOfEachKind) {
  for (size_t i = 0; i < std::size(kKinds); ++i) {
    SCOPED_TRACE(kKindNames[i]);
    across(true, kKinds[i]);
  }
}
TEST(SharedMemoryAcross, APeerOfTheSameUserReachesExactlyTheKeysRangeOfEachKind) {
  for (size_t i = 0; i < std::size(kKinds); ++i) {
    SCOPED_TRACE(kKindNames[i]);
    across(false, kKinds[i]);
  }
}

}  // namespace
}  // namespace shared_memory_test
}  // namespace svsec
