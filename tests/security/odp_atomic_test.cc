// RDMA atomics between users on ODP memory: another user FETCH_ADDs the
// owner's ODP quadword through the daemon while the owner's own process
// FETCH_ADDs the same quadword through a pair of its own QPs (the library's
// path, under the user's ODP atomics lock). Both are atomic with respect to
// each other: every update counts and every original value returned is
// distinct. The lock is the owner's user's device segment (its own file);
// a third user that takes the name a lock once had in /dev/shm takes
// nothing. And ATOMIC WRITE (IBTA annex A19): another user's stores through
// the daemon never tear the owner's FETCH_ADDs' values.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "attack.h"

namespace svsec {
namespace {

constexpr int kEach = 2000;
constexpr int kAll = IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC;

struct Qp {
  ibv_qp* qp = nullptr;
  ibv_cq* cq = nullptr;
};

bool make_qp(ibv_context* ctx, ibv_pd* pd, Qp& out) {
  out.cq = ibv_create_cq(ctx, 16, nullptr, nullptr, 0);
  ibv_qp_init_attr ia{};
  ia.send_cq = ia.recv_cq = out.cq;
  ia.qp_type = IBV_QPT_RC;
  ia.cap.max_send_wr = ia.cap.max_recv_wr = 4;
  ia.cap.max_send_sge = ia.cap.max_recv_sge = 1;
  return out.cq && (out.qp = ibv_create_qp(pd, &ia)) && qp_to_init(out.qp, kAll) == 0;
}

// kEach FETCH_ADD(1) on addr/rkey, one at a time, the original values in `got`.
bool fetch_adds(const Qp& q, ibv_mr* result, uint64_t addr, uint32_t rkey, std::vector<uint64_t>& got) {
  auto* r = static_cast<uint64_t*>(result->addr);
  for (int i = 0; i < kEach; ++i) {
    ibv_sge sge{uint64_t(uintptr_t(r)), 8, result->lkey};
    ibv_send_wr wr{}, *bad = nullptr;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.atomic.remote_addr = addr;
    wr.wr.atomic.rkey = rkey;
    wr.wr.atomic.compare_add = 1;
    if (ibv_post_send(q.qp, &wr, &bad)) return false;
    ibv_wc wc{};
    int n;
    while ((n = ibv_poll_cq(q.cq, 1, &wc)) == 0) {
    }
    if (n != 1 || wc.status != IBV_WC_SUCCESS) return false;
    got.push_back(*r);
  }
  return true;
}

// kEach ATOMIC WRITEs (IBTA annex A19, inline) of kHighA and kHighB in
// turn to addr/rkey, one at a time; the values written in `got`.
constexpr uint64_t kHighA = 0xAAAAAAAA00000000ull, kHighB = 0x5555555500000000ull;
bool atomic_writes(const Qp& q, uint64_t addr, uint32_t rkey, std::vector<uint64_t>& got) {
  for (int i = 0; i < kEach; ++i) {
    uint64_t v = i % 2 ? kHighB : kHighA;
    ibv_sge sge{uint64_t(uintptr_t(&v)), 8, 0};
    ibv_send_wr wr{}, *bad = nullptr;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_ATOMIC_WRITE;
    wr.send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
    wr.wr.rdma.remote_addr = addr;
    wr.wr.rdma.rkey = rkey;
    if (ibv_post_send(q.qp, &wr, &bad)) return false;
    ibv_wc wc{};
    int n;
    while ((n = ibv_poll_cq(q.cq, 1, &wc)) == 0) {
    }
    if (n != 1 || wc.status != IBV_WC_SUCCESS) return false;
    got.push_back(v);
  }
  return true;
}

// Whether a value of the word the ATOMIC WRITEs and the FETCH_ADDs share is
// whole: a high half of one store (or none yet), a low half of at most
// kEach adds (they never carry into the high half).
bool whole(uint64_t v) {
  const uint64_t hi = v & ~0xffffffffull;
  return (hi == 0 || hi == kHighA || hi == kHighB) && (v & 0xffffffffull) <= uint64_t(kEach);
}

// The other user's side: FETCH_ADDs, or (g_other_writes) ATOMIC WRITEs.
bool g_other_writes = false;

struct Target {
  uint32_t qpn, rkey;
  uint64_t addr;
};

void atomics_together(bool owner_is_nobody) {
  SystemDaemon sysd;
  ASSERT_TRUE(sysd.alive());
  Child root(owner_is_nobody, [](int sock) {
    ibv_context* ctx = open_dev();
    ibv_pd* pd = ctx ? ibv_alloc_pd(ctx) : nullptr;
    Qp to_nobody, a, b;
    if (!pd || !make_qp(ctx, pd, to_nobody) || !make_qp(ctx, pd, a) || !make_qp(ctx, pd, b)) return 10;
    if (qp_to_rts(ctx, a.qp, b.qp->qp_num) || qp_to_rts(ctx, b.qp, a.qp->qp_num)) return 11;
    void* p = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ibv_mr* mr = ibv_reg_mr(pd, p, 4096, IBV_ACCESS_ON_DEMAND | IBV_ACCESS_LOCAL_WRITE | kAll);
    static uint64_t result[1];
    ibv_mr* res = ibv_reg_mr(pd, result, sizeof result, IBV_ACCESS_LOCAL_WRITE);
    if (!mr || !res) return 12;
    Target t{to_nobody.qp->qp_num, mr->rkey, uint64_t(uintptr_t(p))};
    uint32_t peer = 0;
    if (!send_val(sock, t) || !recv_val(sock, peer) || qp_to_rts(ctx, to_nobody.qp, peer)) return 13;
    int go = 0;
    if (!recv_val(sock, go)) return 14;
    std::vector<uint64_t> got;
    if (!fetch_adds(a, res, t.addr, t.rkey, got)) return 15;
    int done = 0;
    if (!send_val(sock, done) || !recv_val(sock, done)) return 16;
    uint64_t final_value = *static_cast<volatile uint64_t*>(p);
    for (uint64_t v : got)
      if (!send_val(sock, v)) return 17;
    return send_val(sock, final_value) ? 0 : 18;
  });
  Child nobody(!owner_is_nobody, [](int sock) {
    ibv_context* ctx = open_dev();
    ibv_pd* pd = ctx ? ibv_alloc_pd(ctx) : nullptr;
    Qp q;
    if (!pd || !make_qp(ctx, pd, q)) return 20;
    static uint64_t result[1];
    ibv_mr* res = ibv_reg_mr(pd, result, sizeof result, IBV_ACCESS_LOCAL_WRITE);
    Target t{};
    uint32_t qpn = q.qp->qp_num;
    if (!res || !recv_val(sock, t) || !send_val(sock, qpn) || qp_to_rts(ctx, q.qp, t.qpn)) return 21;
    int go = 0;
    if (!recv_val(sock, go)) return 22;
    std::vector<uint64_t> got;
    if (!(g_other_writes ? atomic_writes(q, t.addr, t.rkey, got) : fetch_adds(q, res, t.addr, t.rkey, got))) return 23;
    for (uint64_t v : got)
      if (!send_val(sock, v)) return 24;
    return 0;
  });
  root.start();
  nobody.start();
  Target t{};
  ASSERT_TRUE(recv_val(root.sock(), t)) << "root failed: exit " << root.wait();
  ASSERT_TRUE(send_val(nobody.sock(), t));
  uint32_t qpn = 0;
  ASSERT_TRUE(recv_val(nobody.sock(), qpn)) << "nobody failed: exit " << nobody.wait();
  ASSERT_TRUE(send_val(root.sock(), qpn));
  int go = 1;
  ASSERT_TRUE(send_val(root.sock(), go));
  ASSERT_TRUE(send_val(nobody.sock(), go));
  std::vector<uint64_t> all;
  for (int i = 0; i < kEach; ++i) {
    uint64_t v = 0;
    ASSERT_TRUE(recv_val(nobody.sock(), v)) << "nobody's atomics failed: exit " << nobody.wait();
    all.push_back(v);
  }
  int done = 0;
  ASSERT_TRUE(recv_val(root.sock(), done)) << "root's atomics failed: exit " << root.wait();
  ASSERT_TRUE(send_val(root.sock(), done));
  for (int i = 0; i < kEach; ++i) {
    uint64_t v = 0;
    ASSERT_TRUE(recv_val(root.sock(), v));
    all.push_back(v);
  }
  uint64_t final_value = 0;
  ASSERT_TRUE(recv_val(root.sock(), final_value));
  EXPECT_EQ(0, root.wait());
  EXPECT_EQ(0, nobody.wait());
  if (g_other_writes) {
    // The owner's adds saw only whole values, and the last value is whole.
    for (int i = kEach; i < 2 * kEach; ++i) EXPECT_TRUE(whole(all[size_t(i)])) << std::hex << all[size_t(i)];
    EXPECT_TRUE(whole(final_value) && final_value >> 32 != 0) << std::hex << final_value;
    return;
  }
  EXPECT_EQ(uint64_t(2 * kEach), final_value) << "updates were lost";
  std::sort(all.begin(), all.end());
  EXPECT_TRUE(std::adjacent_find(all.begin(), all.end()) == all.end()) << "two atomics returned the same original";
}

TEST(OdpAtomic, AnotherUsersAtomicsAndTheOwnersAreAtomicTogether) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run a child as another user";
  atomics_together(false);
}

TEST(OdpAtomic, AnotherUsersAtomicsAndAnUnprivilegedOwnersAreAtomicTogether) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run a child as another user";
  atomics_together(true);
}

// Another unprivileged user (65533) creates, before nobody runs, the file
// a per-user name in /dev/shm would give nobody's ODP atomics lock: they
// must not depend on a name any user can take first.
TEST(OdpAtomic, ALockNameTakenFirstByAnotherUserChangesNothing) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run a child as another user";
  const char* squat = "/dev/shm/softverbs-odp-65534";
  ::unlink(squat);
  const pid_t p = fork();
  if (p == 0) {
    if (setresgid(65533, 65533, 65533) != 0 || setresuid(65533, 65533, 65533) != 0) _exit(2);
    const int fd = ::open(squat, O_RDWR | O_CREAT | O_EXCL, 0666);
    _exit(fd >= 0 && fchmod(fd, 0666) == 0 ? 0 : 3);
  }
  ASSERT_EQ(0, wait_for(p));
  atomics_together(true);
  ::unlink(squat);
}

// Another user's ATOMIC WRITEs through the daemon and the owner's
// FETCH_ADDs on one ODP word: every original value the owner's adds return,
// and the last value, is whole (the store is one quadword, under the lock
// the adds take).
TEST(OdpAtomic, AnotherUsersAtomicWritesAndTheOwnersAddsNeverTear) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run a child as another user";
  g_other_writes = true;
  atomics_together(false);
  g_other_writes = false;
}

}  // namespace
}  // namespace svsec
