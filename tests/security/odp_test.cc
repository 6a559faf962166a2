// On-demand paging (docs/MEMORY.md, "On-demand paging"): an ODP MR's bytes
// are its registrant's address space, reached with process_vm_readv/writev:
// by the requester itself for a peer of the same user, by the daemon (root)
// for another user's. Either way a key reaches exactly its range: root's ODP
// MR is the middle page of three secret pages, and a peer that writes in
// range and then just past it changes the 64 bytes it may and nothing else.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>

#include "attack.h"

namespace svsec {
namespace odp_test {  // this file's own (unity builds join files)
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
  int read, write, past_end;
  uint8_t seen;  // the first byte the READ brought
};
struct Changed {
  int inside, outside;
};

// Root registers the middle page of kLen secret bytes ODP; the peer
// (nobody, or root) reads and writes 64 bytes in it, then writes 8 bytes
// straddling its end; root counts the bytes that changed in and around it.
void odp_across(bool peer_is_nobody, Outcome& got, Changed& changed) {
  SystemDaemon sysd;
  ASSERT_TRUE(sysd.alive());
  Child root(false, [](int sock) {
    RcEnd me;
    if (!me.open()) return 10;
    auto* buf = static_cast<uint8_t*>(mmap(nullptr, kLen, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    if (buf == MAP_FAILED) return 11;
    std::memset(buf, kSecret, kLen);
    ibv_mr* mr = ibv_reg_mr(me.pd, buf + 4096, 4096, kAll | IBV_ACCESS_ON_DEMAND);
    if (!mr) return 12;
    Target t{me.qp->qp_num, mr->rkey, uint64_t(uintptr_t(buf)) + 4096};
    uint32_t peer_qpn = 0;
    if (!send_val(sock, t) || !recv_val(sock, peer_qpn) || qp_to_rts(me.ctx, me.qp, peer_qpn)) return 13;
    int ready = 1, done = 0;
    if (!send_val(sock, ready) || !recv_val(sock, done)) return 14;
    Changed c{};
    for (size_t i = 0; i < kLen; ++i)
      if (buf[i] != kSecret) ++(i >= 4096 && i < 8192 ? c.inside : c.outside);
    return send_val(sock, c) ? 0 : 15;
  });
  Child peer(peer_is_nobody, [](int sock) {
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
    o.past_end = me.post(IBV_WR_RDMA_WRITE, mine, 8, mr->lkey, t.addr + 4096 - 4, t.rkey);
    return send_val(sock, o) ? 0 : 24;
  });
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
  got = Outcome{-1, -1, -1, 0};
  ASSERT_TRUE(recv_val(peer.sock(), got)) << "the peer failed: exit " << peer.wait();
  ASSERT_TRUE(send_val(root.sock(), ready));
  changed = Changed{-1, -1};
  EXPECT_TRUE(recv_val(root.sock(), changed));
  EXPECT_EQ(0, root.wait()) << "root's process died";
  EXPECT_EQ(0, peer.wait());
  EXPECT_TRUE(sysd.alive()) << "the daemon died";
}

void expect_exactly_the_key(bool peer_is_nobody) {
  Outcome o{};
  Changed c{};
  odp_across(peer_is_nobody, o, c);
  EXPECT_EQ(IBV_WC_SUCCESS, o.read);
  EXPECT_EQ(kSecret, o.seen);
  EXPECT_EQ(IBV_WC_SUCCESS, o.write);
  EXPECT_EQ(IBV_WC_REM_ACCESS_ERR, o.past_end);
  EXPECT_EQ(64, c.inside) << "the in-range WRITE's 64 bytes, and no byte of the one past the end";
  EXPECT_EQ(0, c.outside) << "a byte of root's outside the key's range changed";
}

// Between users the daemon (root) copies with process_vm_*: the key, its
// range and its rights decide, as for a regular MR; nothing else of root's.
TEST(Odp, AnotherUserReachesExactlyTheKeysRangeOfRootsOdpMemory) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run a child as another user";
  expect_exactly_the_key(true);
}

// The same from a peer of root's own user (the requester copies itself).
TEST(Odp, ASameUserPeerReachesExactlyTheKeysRange) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root (the system daemon)";
  expect_exactly_the_key(false);
}

}  // namespace
}  // namespace odp_test
}  // namespace svsec
