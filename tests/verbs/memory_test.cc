// Registered memory over its lifetime: deregistration revokes remote access
// at once; atomics from many processes are atomic; fork gives the child a
// private snapshot (docs/MEMORY.md).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <thread>

#include "harness.h"

namespace svtest {
namespace {

TEST(Memory, DeregisteredMrRefusesRemoteAccessAndIsNotTouched) {
  Side me;
  ASSERT_EQ(0, me.open({}));
  Peer peer;
  PeerInfo info = peer.open({});
  ASSERT_EQ(0, peer.connect(me.qp->qp_num, {}));
  ASSERT_EQ(0, me.connect(info.qpn, {}));
  ibv_sge sge{reinterpret_cast<uint64_t>(me.buf), 8, me.mr->lkey};
  ibv_send_wr wr{};
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = info.addr;
  wr.wr.rdma.rkey = info.rkey;
  ibv_send_wr* bad;
  std::memset(me.buf, 0x5a, 8);
  ASSERT_EQ(0, ibv_post_send(me.qp, &wr, &bad));
  ASSERT_EQ(IBV_WC_SUCCESS, poll(me.cq, 1)[0].status);
  peer.fill(7);
  uint64_t before = peer.checksum(0, info.len);
  ASSERT_EQ(0, peer.dereg());
  ASSERT_EQ(0, ibv_post_send(me.qp, &wr, &bad));
  auto wc = poll(me.cq, 1);
  ASSERT_EQ(1u, wc.size());
  EXPECT_EQ(IBV_WC_REM_ACCESS_ERR, wc[0].status);
  EXPECT_EQ(before, peer.checksum(0, info.len));
}

TEST(Memory, AtomicsFromSeveralProcessesAreAtomic) {
  // This process owns the word; three peer processes hammer it through
  // three QPs at once.
  constexpr int kPeers = 3;
  constexpr uint32_t kEach = 2000;
  Side owner;
  ASSERT_EQ(0, owner.open({}));
  std::vector<ibv_qp*> qps;
  std::vector<std::unique_ptr<Peer>> peers;
  for (int i = 0; i < kPeers; ++i) {
    peers.push_back(std::make_unique<Peer>());
    PeerInfo pi = peers.back()->open({});
    ASSERT_NE(0u, pi.qpn);
    ibv_qp* qp = owner.qp;
    if (i > 0) {
      ibv_qp_init_attr ia{};
      ia.send_cq = owner.cq;
      ia.recv_cq = owner.cq;
      ia.qp_type = IBV_QPT_RC;
      ia.cap = {8, 8, 1, 1, 0};
      qp = ibv_create_qp(owner.pd, &ia);
      ASSERT_NE(nullptr, qp);
      ibv_qp_attr a{};
      a.qp_state = IBV_QPS_INIT;
      a.port_num = 1;
      a.qp_access_flags = IBV_ACCESS_REMOTE_ATOMIC;
      ASSERT_EQ(0, ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS));
    }
    Side tmp;
    tmp.ctx = owner.ctx;
    tmp.qp = qp;
    ASSERT_EQ(0, tmp.connect(pi.qpn, {}));
    tmp.ctx = nullptr;
    tmp.qp = nullptr;
    ASSERT_EQ(0, peers.back()->connect(qp->qp_num, {}));
    qps.push_back(qp);
  }
  auto* word = reinterpret_cast<uint64_t*>(owner.buf + 128);
  *word = 0;
  std::vector<std::thread> ts;
  std::vector<int> rc(kPeers, -1);
  for (int i = 0; i < kPeers; ++i)
    ts.emplace_back([&, i] { rc[i] = peers[i]->fetch_add(kEach, reinterpret_cast<uint64_t>(word), owner.mr->rkey); });
  for (auto& t : ts) t.join();
  for (int i = 0; i < kPeers; ++i) EXPECT_EQ(0, rc[i]);
  EXPECT_EQ(uint64_t(kPeers) * kEach, __atomic_load_n(word, __ATOMIC_SEQ_CST));
  for (size_t i = 1; i < qps.size(); ++i) ibv_destroy_qp(qps[i]);
}

TEST(Memory, ForkChildGetsAPrivateSnapshot) {
  EXPECT_EQ(IBV_FORK_UNNEEDED, ibv_is_fork_initialized());
  EXPECT_EQ(0, ibv_fork_init());
  Side me;
  ASSERT_EQ(0, me.open({}));
  Peer peer;
  PeerInfo info = peer.open({});
  ASSERT_EQ(0, peer.connect(me.qp->qp_num, {}));
  ASSERT_EQ(0, me.connect(info.qpn, {}));
  std::memset(me.buf, 1, me.len);
  int pipe_fd[2], ready[2];
  ASSERT_EQ(0, pipe(pipe_fd));
  ASSERT_EQ(0, pipe(ready));
  pid_t child = fork();
  if (child == 0) {
    // The snapshot is complete once fork() returns in the child (see
    // docs/MEMORY.md: it is taken by the child's atfork handler).
    if (write(ready[1], "r", 1) != 1) _exit(4);
    // The child sees the registered bytes as they were at fork, and its
    // writes stay its own.
    bool ok = me.buf[10] == 1;
    me.buf[100] = 9;
    char c;
    if (read(pipe_fd[0], &c, 1) != 1) _exit(3);  // wait until the peer wrote into the parent
    ok = ok && me.buf[30] == 1;  // the peer's RDMA write went to the parent only
    _exit(ok ? 0 : 1);
  }
  // The peer writes into the parent's registered memory after the fork.
  char r;
  ASSERT_EQ(1, read(ready[0], &r, 1));
  peer.fill(0);
  ASSERT_EQ(IBV_WC_SUCCESS, peer.post(IBV_WR_RDMA_WRITE, 0, 64, reinterpret_cast<uint64_t>(me.buf), me.mr->rkey).status);
  EXPECT_EQ(peer.checksum(0, 64), checksum(me.buf, 64));
  ASSERT_EQ(1, write(pipe_fd[1], "x", 1));
  int st = 0;
  waitpid(child, &st, 0);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  EXPECT_EQ(1, me.buf[100]);  // the child's write did not reach the parent
  close(pipe_fd[0]);
  close(pipe_fd[1]);
  close(ready[0]);
  close(ready[1]);
}

}  // namespace
}  // namespace svtest
