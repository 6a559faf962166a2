// Registered memory over its lifetime: deregistration revokes remote access
// at once; atomics from many processes are atomic; fork gives the child a
// private snapshot (docs/MEMORY.md).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>

#include "harness.h"

namespace svtest {
namespace {

// The peer registers 1000 bytes at an odd offset; this process reaches its
// first and last byte, and fails one byte beyond either end.
TEST(Memory, FirstAndLastByteReachableOneBeyondFails) {
  Side me;
  ASSERT_EQ(0, me.open({}));
  auto attempt = [&](int64_t offset, bool remote_ok_expected) {
    // A fresh connection each time: an access error moves both QPs to ERR.
    Peer peer;
    PeerInfo info = peer.open({});
    Side mine;
    EXPECT_EQ(0, mine.open({}));
    EXPECT_EQ(0, peer.connect(mine.qp->qp_num, {}));
    EXPECT_EQ(0, mine.connect(info.qpn, {}));
    int st = -1;
    PeerInfo odd = peer.rereg(IBV_REREG_MR_CHANGE_TRANSLATION, 0, 333, 1000, &st);
    EXPECT_EQ(0, st);
    ibv_sge sge{reinterpret_cast<uint64_t>(mine.buf), 1, mine.mr->lkey};
    ibv_send_wr wr{};
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_RDMA_WRITE;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = odd.addr + uint64_t(offset);
    wr.wr.rdma.rkey = odd.rkey;
    ibv_send_wr* bad;
    EXPECT_EQ(0, ibv_post_send(mine.qp, &wr, &bad));
    auto wc = poll(mine.cq, 1);
    EXPECT_EQ(1u, wc.size());
    EXPECT_EQ(remote_ok_expected ? IBV_WC_SUCCESS : IBV_WC_REM_ACCESS_ERR, wc[0].status) << offset;
  };
  attempt(0, true);
  attempt(999, true);
  attempt(-1, false);
  attempt(1000, false);

}

TEST(Memory, LocalSgeBeyondEitherEndIsAProtectionError) {
  Side me;
  Peer peer;
  PeerInfo info;
  ASSERT_EQ(0, connect_pair(me, peer, info));
  ibv_mr* odd = ibv_reg_mr(me.pd, me.buf + 333, 1000, IBV_ACCESS_LOCAL_WRITE);
  ASSERT_NE(nullptr, odd);
  auto write_from = [&](int64_t offset, uint32_t len) {
    ibv_sge sge{reinterpret_cast<uint64_t>(me.buf) + uint64_t(333 + offset), len, odd->lkey};
    ibv_send_wr wr{};
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_RDMA_WRITE;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = info.addr;
    wr.wr.rdma.rkey = info.rkey;
    ibv_send_wr* bad;
    EXPECT_EQ(0, ibv_post_send(me.qp, &wr, &bad));
    auto wc = poll(me.cq, 1);
    return wc.size() == 1 ? wc[0].status : IBV_WC_GENERAL_ERR;
  };
  EXPECT_EQ(IBV_WC_SUCCESS, write_from(0, 1));
  EXPECT_EQ(IBV_WC_SUCCESS, write_from(999, 1));
  EXPECT_EQ(IBV_WC_SUCCESS, write_from(0, 1000));
  EXPECT_EQ(IBV_WC_LOC_PROT_ERR, write_from(999, 2));  // one byte beyond the end
  ibv_dereg_mr(odd);
}

TEST(Memory, HundredRedundantRegistrationsEachEnforceTheirFlags) {
  Side me;
  Peer peer;
  PeerInfo info;
  ASSERT_EQ(0, connect_pair(me, peer, info));
  const int kinds[4] = {IBV_ACCESS_LOCAL_WRITE, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ,
                        IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE,
                        IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE};
  std::vector<ibv_mr*> mrs;
  for (int i = 0; i < 100; ++i) {
    ibv_mr* m = ibv_reg_mr(me.pd, me.buf + 4096, 4096, kinds[i % 4]);
    ASSERT_NE(nullptr, m);
    mrs.push_back(m);
  }
  // The peer reads and writes through each key; only the granted ones work.
  // (A refused access moves the connection to ERR: check all allowed ones
  // first, then one refused read and, on a new connection, one refused write.)
  uint64_t addr = reinterpret_cast<uint64_t>(me.buf) + 4096;
  for (int i = 0; i < 100; ++i) {
    if (kinds[i % 4] & IBV_ACCESS_REMOTE_READ) {
      ASSERT_EQ(IBV_WC_SUCCESS, peer.post(IBV_WR_RDMA_READ, 0, 16, addr, mrs[i]->rkey).status) << i;
    }
    if (kinds[i % 4] & IBV_ACCESS_REMOTE_WRITE) {
      ASSERT_EQ(IBV_WC_SUCCESS, peer.post(IBV_WR_RDMA_WRITE, 0, 16, addr, mrs[i]->rkey).status) << i;
    }
  }
  EXPECT_EQ(IBV_WC_REM_ACCESS_ERR, peer.post(IBV_WR_RDMA_READ, 0, 16, addr, mrs[2]->rkey).status);
  for (ibv_mr* m : mrs) EXPECT_EQ(0, ibv_dereg_mr(m));
}

TEST(Memory, ZeroBasedRegistrationIsAddressedFromZero) {
  Side me;
  Peer peer;
  PeerInfo info;
  ASSERT_EQ(0, connect_pair(me, peer, info));
  ibv_mr* zb = ibv_reg_mr_iova(me.pd, me.buf + 1000, 500, 0,
                               IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_ZERO_BASED);
  ASSERT_NE(nullptr, zb);
  peer.fill(3);
  EXPECT_EQ(IBV_WC_SUCCESS, peer.post(IBV_WR_RDMA_WRITE, 0, 100, 400, zb->rkey).status);
  EXPECT_EQ(peer.checksum(0, 100), checksum(me.buf + 1400, 100));
  EXPECT_EQ(IBV_WC_REM_ACCESS_ERR, peer.post(IBV_WR_RDMA_WRITE, 0, 100, 401, zb->rkey).status);
  ibv_dereg_mr(zb);
}

TEST(Memory, DeregisteredMrRefusesRemoteAccessAndIsNotTouched) {
  Side me;
  Peer peer;
  PeerInfo info;
  ASSERT_EQ(0, connect_pair(me, peer, info));
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

// This process owns the words; kPeers peer processes reach them through one
// QP each.
struct Cluster {
  static constexpr int kPeers = 4;
  Side owner;
  std::vector<ibv_qp*> qps;
  std::vector<std::unique_ptr<Peer>> peers;
  void build();
  ~Cluster() {
    for (size_t i = 1; i < qps.size(); ++i) ibv_destroy_qp(qps[i]);
  }
};

void Cluster::build() {
  ASSERT_EQ(0, owner.open({}));
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
      a.qp_access_flags = IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE;
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
}

// IBTA 9.4.5: RDMA atomics are atomic with respect to each other, here from
// four processes through four QPs at once.
TEST(Memory, FourProcessesFetchAndAddExactly) {
  constexpr uint32_t kEach = 100000;
  Cluster c;
  ASSERT_NO_FATAL_FAILURE(c.build());
  auto* word = reinterpret_cast<uint64_t*>(c.owner.buf + 128);
  *word = 0;
  std::vector<std::thread> ts;
  std::vector<int> rc(Cluster::kPeers, -1);
  for (int i = 0; i < Cluster::kPeers; ++i)
    ts.emplace_back([&, i] { rc[i] = c.peers[i]->fetch_add(kEach, reinterpret_cast<uint64_t>(word), c.owner.mr->rkey); });
  for (auto& t : ts) t.join();
  for (int i = 0; i < Cluster::kPeers; ++i) EXPECT_EQ(0, rc[i]);
  EXPECT_EQ(uint64_t(Cluster::kPeers) * kEach, __atomic_load_n(word, __ATOMIC_SEQ_CST));
}

// A cluster-wide lock (seed 003): a CAS spinlock guards a read-modify-write
// done with plain RDMA READ and WRITE.
TEST(Memory, FourProcessesCasSpinlockGuardsANonAtomicUpdate) {
  constexpr uint32_t kEach = 100000;
  Cluster c;
  ASSERT_NO_FATAL_FAILURE(c.build());
  auto* lock = reinterpret_cast<uint64_t*>(c.owner.buf + 256);
  auto* counter = reinterpret_cast<uint64_t*>(c.owner.buf + 512);
  *lock = 0;
  *counter = 0;
  std::vector<std::thread> ts;
  std::vector<int> rc(Cluster::kPeers, -1);
  for (int i = 0; i < Cluster::kPeers; ++i)
    ts.emplace_back([&, i] {
      rc[i] = c.peers[i]->lock_loop(kEach, reinterpret_cast<uint64_t>(lock), reinterpret_cast<uint64_t>(counter),
                                    c.owner.mr->rkey);
    });
  for (auto& t : ts) t.join();
  for (int i = 0; i < Cluster::kPeers; ++i) EXPECT_EQ(0, rc[i]);
  EXPECT_EQ(uint64_t(Cluster::kPeers) * kEach, __atomic_load_n(counter, __ATOMIC_SEQ_CST));
  EXPECT_EQ(0u, *lock);
}

TEST(Memory, ForkChildGetsAPrivateSnapshot) {
  EXPECT_EQ(IBV_FORK_UNNEEDED, ibv_is_fork_initialized());
  EXPECT_EQ(0, ibv_fork_init());
  Side me;
  Peer peer;
  PeerInfo info;
  ASSERT_EQ(0, connect_pair(me, peer, info));
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

// Once the process's backing is known to the daemon, a
// registration converts its pages while the daemon records it. Threads
// writing the buffer meanwhile, and during each deregistration, lose no
// write (plain and locked increments of their own counters), and the
// peer reads each registration's contents through its key.
TEST(Memory, WritersDuringRegistrationAndDeregistrationLoseNothing) {
  Side me;
  Peer peer;
  PeerInfo info;
  ASSERT_EQ(0, connect_pair(me, peer, info));
  void* a = nullptr;
  ASSERT_EQ(0, posix_memalign(&a, 4096, 3 * 4096));
  auto* words = static_cast<uint64_t*>(a);
  std::memset(a, 0, 3 * 4096);
  std::atomic<bool> stop{false};
  constexpr int kWriters = 2;
  std::thread writers[kWriters];
  uint64_t done[kWriters] = {};
  for (int t = 0; t < kWriters; ++t) {
    writers[t] = std::thread([&, t] {
      // One counter on the first page, one on the last: both ends of the range.
      volatile uint64_t* plain = &words[t * 8];
      uint64_t* locked = &words[2 * 512 + t * 8];
      uint64_t n = 0;
      while (!stop.load(std::memory_order_relaxed)) {
        *plain = *plain + 1;
        __atomic_fetch_add(locked, 1, __ATOMIC_SEQ_CST);
        ++n;
      }
      done[t] = n;
    });
  }
  for (int i = 0; i < 300; ++i) {
    // (No ASSERT while the writers run: they must be joined.)
    ibv_mr* m = ibv_reg_mr(me.pd, a, 3 * 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
    if (!m) {
      ADD_FAILURE() << "ibv_reg_mr " << i << ": " << std::strerror(errno);
      break;
    }
    if (i % 50 == 0) {
      EXPECT_EQ(IBV_WC_SUCCESS, peer.post(IBV_WR_RDMA_READ, 0, 8, reinterpret_cast<uint64_t>(a) + 4096, m->rkey).status);
    }
    EXPECT_EQ(0, ibv_dereg_mr(m)) << i;
  }
  stop = true;
  for (auto& w : writers) w.join();
  for (int t = 0; t < kWriters; ++t) {
    EXPECT_EQ(done[t], words[t * 8]) << "plain counter " << t;
    EXPECT_EQ(done[t], words[2 * 512 + t * 8]) << "locked counter " << t;
  }
  std::free(a);
}

}  // namespace
}  // namespace svtest
