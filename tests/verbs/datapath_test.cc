// Data between separate processes, every opcode, patterns checked on
// arrival; and every error completion the foundation defines.
#include <arpa/inet.h>
#include <gtest/gtest.h>

#include <cstring>

#include "harness.h"

namespace svtest {
namespace {

class DataPath : public ::testing::Test {
 protected:
  void SetUp() override { connect({}, {}); }

  void connect(const Side::Options& mine, const Side::Options& theirs) {
    ASSERT_EQ(0, me.open(mine));
    info = peer.open(theirs);
    ASSERT_NE(0u, info.qpn);
    ASSERT_EQ(0, peer.connect(me.qp->qp_num, theirs));
    ASSERT_EQ(0, me.connect(info.qpn, mine));
  }

  int post(ibv_wr_opcode op, uint64_t local_off, uint32_t len, uint64_t remote_off, uint32_t rkey,
           int flags = IBV_SEND_SIGNALED, uint32_t lkey = 0) {
    ibv_sge sge{reinterpret_cast<uint64_t>(me.buf) + local_off, len, lkey ? lkey : me.mr->lkey};
    ibv_send_wr wr{};
    wr.wr_id = 77;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = op;
    wr.send_flags = flags;
    wr.imm_data = htonl(0xabcd1234);
    wr.wr.rdma.remote_addr = info.addr + remote_off;
    wr.wr.rdma.rkey = rkey;
    ibv_send_wr* bad;
    return ibv_post_send(me.qp, &wr, &bad);
  }

  void fill_local(uint8_t seed, uint64_t off, uint64_t len) {
    for (uint64_t i = 0; i < len; ++i) me.buf[off + i] = pattern(seed, i);
  }
  uint64_t local_sum(uint64_t off, uint64_t len) { return checksum(me.buf + off, len); }

  ibv_wc one_completion() {
    auto wc = poll(me.cq, 1);
    EXPECT_EQ(1u, wc.size());
    return wc.empty() ? ibv_wc{} : wc[0];
  }

  Side me;
  Peer peer;
  PeerInfo info{};
};

TEST_F(DataPath, RdmaWriteLandsExactlyAtEverySize) {
  for (uint32_t len : {1u, 7u, 64u, 4095u, 4096u, 40000u}) {
    fill_local(uint8_t(len), 0, len);
    uint64_t remote_off = 3;  // unaligned target
    ASSERT_EQ(0, post(IBV_WR_RDMA_WRITE, 0, len, remote_off, info.rkey));
    ibv_wc wc = one_completion();
    EXPECT_EQ(IBV_WC_SUCCESS, wc.status);
    EXPECT_EQ(IBV_WC_RDMA_WRITE, wc.opcode);
    EXPECT_EQ(77u, wc.wr_id);
    EXPECT_EQ(local_sum(0, len), peer.checksum(remote_off, len)) << len;
  }
}

TEST_F(DataPath, RdmaReadFetchesThePeersBytes) {
  peer.fill(9);
  std::vector<uint8_t> want(5000);
  for (size_t i = 0; i < want.size(); ++i) want[i] = pattern(9, i + 100);
  ASSERT_EQ(0, post(IBV_WR_RDMA_READ, 10, 5000, 100, info.rkey));
  ibv_wc wc = one_completion();
  EXPECT_EQ(IBV_WC_SUCCESS, wc.status);
  EXPECT_EQ(IBV_WC_RDMA_READ, wc.opcode);
  EXPECT_EQ(0, std::memcmp(want.data(), me.buf + 10, want.size()));
}

TEST_F(DataPath, SendArrivesWithImmediateAndSource) {
  ASSERT_EQ(0, peer.post_recv(2, 0, 4096));
  fill_local(5, 0, 3000);
  ASSERT_EQ(0, post(IBV_WR_SEND, 0, 3000, 0, 0));
  ASSERT_EQ(0, post(IBV_WR_SEND_WITH_IMM, 0, 10, 0, 0));
  auto mine = poll(me.cq, 2);
  ASSERT_EQ(2u, mine.size());
  EXPECT_EQ(IBV_WC_SEND, mine[0].opcode);
  auto theirs = peer.poll(2);
  ASSERT_EQ(2u, theirs.size());
  EXPECT_EQ(IBV_WC_SUCCESS, theirs[0].status);
  EXPECT_EQ(IBV_WC_RECV, theirs[0].opcode);
  EXPECT_EQ(3000u, theirs[0].byte_len);
  EXPECT_EQ(1000u, theirs[0].wr_id);
  EXPECT_EQ(me.qp->qp_num, theirs[0].src_qp);
  EXPECT_EQ(info.qpn, theirs[0].qp_num);
  EXPECT_FALSE(theirs[0].wc_flags & IBV_WC_WITH_IMM);
  EXPECT_TRUE(theirs[1].wc_flags & IBV_WC_WITH_IMM);
  EXPECT_EQ(htonl(0xabcd1234), theirs[1].imm_data);
  EXPECT_EQ(local_sum(0, 10), peer.checksum(4096, 10));
}

TEST_F(DataPath, InlineSendAndWriteDoNotNeedAKey) {
  ASSERT_EQ(0, peer.post_recv(1, 0, 64));
  fill_local(3, 0, 48);
  ASSERT_EQ(0, post(IBV_WR_SEND, 0, 48, 0, 0, IBV_SEND_SIGNALED | IBV_SEND_INLINE, 0xdead00));
  ASSERT_EQ(0, post(IBV_WR_RDMA_WRITE, 0, 48, 1000, info.rkey, IBV_SEND_SIGNALED | IBV_SEND_INLINE, 0xdead00));
  auto mine = poll(me.cq, 2);
  ASSERT_EQ(2u, mine.size());
  EXPECT_EQ(IBV_WC_SUCCESS, mine[0].status);
  EXPECT_EQ(IBV_WC_SUCCESS, mine[1].status);
  ASSERT_EQ(1u, peer.poll(1).size());
  EXPECT_EQ(local_sum(0, 48), peer.checksum(0, 48));
  EXPECT_EQ(local_sum(0, 48), peer.checksum(1000, 48));
}

TEST_F(DataPath, WriteWithImmediateConsumesAReceive) {
  ASSERT_EQ(0, peer.post_recv(1, 0, 16));
  fill_local(4, 0, 2048);
  ASSERT_EQ(0, post(IBV_WR_RDMA_WRITE_WITH_IMM, 0, 2048, 8192, info.rkey));
  EXPECT_EQ(IBV_WC_SUCCESS, one_completion().status);
  auto theirs = peer.poll(1);
  ASSERT_EQ(1u, theirs.size());
  EXPECT_EQ(IBV_WC_RECV_RDMA_WITH_IMM, theirs[0].opcode);
  EXPECT_EQ(htonl(0xabcd1234), theirs[0].imm_data);
  EXPECT_EQ(local_sum(0, 2048), peer.checksum(8192, 2048));
}

TEST_F(DataPath, MultiSgeGatherAndScatter) {
  ASSERT_EQ(0, peer.post_recv(1, 100, 5000));
  ibv_sge sges[3] = {{reinterpret_cast<uint64_t>(me.buf), 100, me.mr->lkey},
                     {reinterpret_cast<uint64_t>(me.buf) + 1000, 1, me.mr->lkey},
                     {reinterpret_cast<uint64_t>(me.buf) + 3000, 900, me.mr->lkey}};
  fill_local(8, 0, 4000);
  std::vector<uint8_t> expect;
  for (auto& s : sges) expect.insert(expect.end(), me.buf + (s.addr - uint64_t(me.buf)), me.buf + (s.addr - uint64_t(me.buf)) + s.length);
  ibv_send_wr wr{};
  wr.sg_list = sges;
  wr.num_sge = 3;
  wr.opcode = IBV_WR_SEND;
  wr.send_flags = IBV_SEND_SIGNALED;
  ibv_send_wr* bad;
  ASSERT_EQ(0, ibv_post_send(me.qp, &wr, &bad));
  EXPECT_EQ(IBV_WC_SUCCESS, one_completion().status);
  ASSERT_EQ(1u, peer.poll(1).size());
  EXPECT_EQ(checksum(expect.data(), expect.size()), peer.checksum(100, expect.size()));
}

TEST_F(DataPath, UnsignaledWritesCompleteSilently) {
  for (int i = 0; i < 10; ++i) ASSERT_EQ(0, post(IBV_WR_RDMA_WRITE, 0, 8, uint64_t(i) * 8, info.rkey, 0));
  ASSERT_EQ(0, post(IBV_WR_RDMA_WRITE, 0, 8, 80, info.rkey));
  auto wc = poll(me.cq, 2, 200);
  ASSERT_EQ(1u, wc.size());
  EXPECT_EQ(IBV_WC_SUCCESS, wc[0].status);
}

TEST_F(DataPath, AtomicsActOnThePeersWord) {
  auto* word = reinterpret_cast<uint64_t*>(me.buf);
  ibv_sge sge{reinterpret_cast<uint64_t>(me.buf), 8, me.mr->lkey};
  ibv_send_wr wr{};
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
  wr.wr.atomic.remote_addr = info.addr + 64;
  wr.wr.atomic.rkey = info.rkey;
  wr.wr.atomic.compare_add = 5;
  ibv_send_wr* bad;
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(0, ibv_post_send(me.qp, &wr, &bad));
    ibv_wc wc = one_completion();
    EXPECT_EQ(IBV_WC_FETCH_ADD, wc.opcode);
    EXPECT_EQ(uint64_t(i) * 5, *word);
  }
  wr.opcode = IBV_WR_ATOMIC_CMP_AND_SWP;
  wr.wr.atomic.compare_add = 15;
  wr.wr.atomic.swap = 1234;
  ASSERT_EQ(0, ibv_post_send(me.qp, &wr, &bad));
  EXPECT_EQ(IBV_WC_COMP_SWAP, one_completion().opcode);
  EXPECT_EQ(15u, *word);
  wr.wr.atomic.compare_add = 15;  // fails now: value is 1234
  ASSERT_EQ(0, ibv_post_send(me.qp, &wr, &bad));
  one_completion();
  EXPECT_EQ(1234u, *word);
  // Misaligned: an error completion, never a torn update.
  wr.wr.atomic.remote_addr = info.addr + 65;
  ASSERT_EQ(0, ibv_post_send(me.qp, &wr, &bad));
  EXPECT_EQ(IBV_WC_REM_INV_REQ_ERR, one_completion().status);
}

TEST_F(DataPath, ReregChangesAccessAndTranslation) {
  int st = -1;
  PeerInfo ro = peer.rereg(IBV_REREG_MR_CHANGE_ACCESS, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ, 0, 0, &st);
  ASSERT_EQ(0, st);
  ASSERT_EQ(0, post(IBV_WR_RDMA_READ, 0, 8, 0, ro.rkey));
  EXPECT_EQ(IBV_WC_SUCCESS, one_completion().status);
  // The key stays (ibv_rereg_mr changes the MR in place); the write is
  // refused for the right the MR no longer grants.
  EXPECT_EQ(info.rkey, ro.rkey);
  ASSERT_EQ(0, post(IBV_WR_RDMA_WRITE, 0, 8, 0, ro.rkey));
  EXPECT_EQ(IBV_WC_REM_ACCESS_ERR, one_completion().status);
}

TEST_F(DataPath, ReregTranslationMovesTheWindow) {
  int st = -1;
  PeerInfo moved = peer.rereg(IBV_REREG_MR_CHANGE_TRANSLATION, 0, 4096, 4096, &st);
  ASSERT_EQ(0, st);
  EXPECT_EQ(info.addr + 4096, moved.addr);
  info.addr = moved.addr;
  fill_local(2, 0, 100);
  ASSERT_EQ(0, post(IBV_WR_RDMA_WRITE, 0, 100, 0, moved.rkey));
  EXPECT_EQ(IBV_WC_SUCCESS, one_completion().status);
  EXPECT_EQ(local_sum(0, 100), peer.checksum(4096, 100));
  ASSERT_EQ(0, post(IBV_WR_RDMA_WRITE, 0, 100, 4000, moved.rkey));  // beyond the new 4 KiB
  EXPECT_EQ(IBV_WC_REM_ACCESS_ERR, one_completion().status);
}

// ---- Error completions ---------------------------------------------------

TEST_F(DataPath, BadLkeyIsALocalProtectionError) {
  ASSERT_EQ(0, post(IBV_WR_RDMA_WRITE, 0, 8, 0, info.rkey, IBV_SEND_SIGNALED, me.mr->lkey + 1));
  ibv_wc wc = one_completion();
  EXPECT_EQ(IBV_WC_LOC_PROT_ERR, wc.status);
  EXPECT_EQ(77u, wc.wr_id);
}

TEST_F(DataPath, LocalSgeOutsideTheMrIsAProtectionError) {
  ASSERT_EQ(0, post(IBV_WR_RDMA_WRITE, me.len - 4, 8, 0, info.rkey));
  EXPECT_EQ(IBV_WC_LOC_PROT_ERR, one_completion().status);
}

TEST_F(DataPath, BadRkeyIsARemoteAccessErrorAndLeavesMemoryAlone) {
  peer.fill(1);
  uint64_t before = peer.checksum(0, info.len);
  ASSERT_EQ(0, post(IBV_WR_RDMA_WRITE, 0, 8, 0, info.rkey ^ 0x100));
  EXPECT_EQ(IBV_WC_REM_ACCESS_ERR, one_completion().status);
  EXPECT_EQ(before, peer.checksum(0, info.len));
}

TEST_F(DataPath, WriteBeyondTheRemoteMrIsARemoteAccessError) {
  ASSERT_EQ(0, post(IBV_WR_RDMA_WRITE, 0, 16, info.len - 8, info.rkey));
  EXPECT_EQ(IBV_WC_REM_ACCESS_ERR, one_completion().status);
}

TEST_F(DataPath, SubsequentRequestsAreFlushedAfterAnError) {
  ASSERT_EQ(0, post(IBV_WR_RDMA_WRITE, 0, 8, 0, info.rkey + 1));
  ASSERT_EQ(0, post(IBV_WR_RDMA_WRITE, 0, 8, 0, info.rkey));
  auto wc = poll(me.cq, 2);
  ASSERT_EQ(2u, wc.size());
  EXPECT_EQ(IBV_WC_REM_ACCESS_ERR, wc[0].status);
  EXPECT_EQ(IBV_WC_WR_FLUSH_ERR, wc[1].status);
}

TEST_F(DataPath, SendLargerThanTheReceiveIsALengthError) {
  ASSERT_EQ(0, peer.post_recv(1, 0, 16));
  ASSERT_EQ(0, post(IBV_WR_SEND, 0, 17, 0, 0));
  EXPECT_EQ(IBV_WC_REM_INV_REQ_ERR, one_completion().status);
  auto theirs = peer.poll(1);
  ASSERT_EQ(1u, theirs.size());
  EXPECT_EQ(IBV_WC_LOC_LEN_ERR, theirs[0].status);
}

TEST_F(DataPath, ErrorStateFlushesPostedReceives) {
  ASSERT_EQ(0, peer.post_recv(3, 0, 16));
  ASSERT_EQ(0, peer.to_error());
  auto theirs = peer.poll(3);
  ASSERT_EQ(3u, theirs.size());
  for (auto& wc : theirs) EXPECT_EQ(IBV_WC_WR_FLUSH_ERR, wc.status);
  // Receives posted in ERR complete at once, flushed.
  ASSERT_EQ(0, peer.post_recv(1, 0, 16));
  ASSERT_EQ(1u, peer.poll(1).size());
}

// The requester's fast path (fast_post in requester.cc) carries a request
// out once the QP's peer is attached and its last window cached, that is from
// the second request on. Each check must still hold there: these tests warm
// the path with a good request, then send the bad one.
class WarmPath : public DataPath {
 protected:
  void warm_write() {
    fill_local(5, 0, 64);
    ASSERT_EQ(0, post(IBV_WR_RDMA_WRITE, 0, 64, 0, info.rkey));
    ASSERT_EQ(IBV_WC_SUCCESS, one_completion().status);
    ASSERT_EQ(local_sum(0, 64), peer.checksum(0, 64));
  }
};

TEST_F(WarmPath, BadRkeyIsStillARemoteAccessError) {
  warm_write();
  peer.fill(2);
  uint64_t before = peer.checksum(0, info.len);
  ASSERT_EQ(0, post(IBV_WR_RDMA_WRITE, 0, 8, 0, info.rkey ^ 0x100));
  EXPECT_EQ(IBV_WC_REM_ACCESS_ERR, one_completion().status);
  EXPECT_EQ(before, peer.checksum(0, info.len));
}

TEST_F(WarmPath, WriteBeyondTheRemoteMrIsStillARemoteAccessError) {
  warm_write();
  peer.fill(3);
  uint64_t before = peer.checksum(0, info.len);
  ASSERT_EQ(0, post(IBV_WR_RDMA_WRITE, 0, 16, info.len - 8, info.rkey));
  EXPECT_EQ(IBV_WC_REM_ACCESS_ERR, one_completion().status);
  EXPECT_EQ(before, peer.checksum(0, info.len));
}

TEST_F(WarmPath, BadLkeyAndLocalBoundsAreStillLocalProtectionErrors) {
  warm_write();
  ASSERT_EQ(0, post(IBV_WR_RDMA_WRITE, 0, 8, 0, info.rkey, IBV_SEND_SIGNALED, me.mr->lkey + 1));
  ibv_wc wc = one_completion();
  EXPECT_EQ(IBV_WC_LOC_PROT_ERR, wc.status);
  EXPECT_EQ(77u, wc.wr_id);
}

TEST_F(WarmPath, LocalSgeOutsideTheMrIsStillALocalProtectionError) {
  warm_write();
  ASSERT_EQ(0, post(IBV_WR_RDMA_WRITE, me.len - 4, 8, 0, info.rkey));
  EXPECT_EQ(IBV_WC_LOC_PROT_ERR, one_completion().status);
}

TEST_F(WarmPath, InlineLongerThanMaxInlineIsStillRefused) {
  warm_write();
  ibv_qp_attr attr{};
  ibv_qp_init_attr init{};
  ASSERT_EQ(0, ibv_query_qp(me.qp, &attr, IBV_QP_CAP, &init));
  EXPECT_EQ(EINVAL, post(IBV_WR_RDMA_WRITE, 0, init.cap.max_inline_data + 1, 0, info.rkey,
                         IBV_SEND_SIGNALED | IBV_SEND_INLINE));
  EXPECT_TRUE(poll(me.cq, 1, 50).empty());
}

TEST_F(WarmPath, UnsignaledWritesStaySilentAndSignaledOnesComplete) {
  warm_write();
  for (int i = 0; i < 20; ++i) {
    fill_local(uint8_t(i), 0, 8);
    ASSERT_EQ(0, post(IBV_WR_RDMA_WRITE, 0, 8, uint64_t(i) * 8, info.rkey, i % 5 == 4 ? IBV_SEND_SIGNALED : 0));
    EXPECT_EQ(local_sum(0, 8), peer.checksum(uint64_t(i) * 8, 8));
  }
  auto wc = poll(me.cq, 5, 2000);
  ASSERT_EQ(4u, wc.size());
  for (auto& w : wc) {
    EXPECT_EQ(IBV_WC_SUCCESS, w.status);
    EXPECT_EQ(IBV_WC_RDMA_WRITE, w.opcode);
    EXPECT_EQ(8u, w.byte_len);
  }
}

TEST_F(WarmPath, ReadsCarryThePeersBytesAndABadRkeyIsStillARemoteAccessError) {
  peer.fill(9);
  for (int i = 0; i < 3; ++i) {
    std::memset(me.buf + 2048, 0, 256);
    ASSERT_EQ(0, post(IBV_WR_RDMA_READ, 2048, 256, 512 + 64 * uint64_t(i), info.rkey));
    ibv_wc wc = one_completion();
    ASSERT_EQ(IBV_WC_SUCCESS, wc.status);
    EXPECT_EQ(IBV_WC_RDMA_READ, wc.opcode);
    EXPECT_EQ(256u, wc.byte_len);
    EXPECT_EQ(peer.checksum(512 + 64 * uint64_t(i), 256), local_sum(2048, 256));
  }
  ASSERT_EQ(0, post(IBV_WR_RDMA_READ, 2048, 8, info.len - 4, info.rkey));
  EXPECT_EQ(IBV_WC_REM_ACCESS_ERR, one_completion().status);
}

TEST_F(WarmPath, SendLargerThanTheReceiveIsStillALengthError) {
  ASSERT_EQ(0, peer.post_recv(2, 0, 16));
  fill_local(6, 0, 16);
  ASSERT_EQ(0, post(IBV_WR_SEND, 0, 16, 0, 0));
  EXPECT_EQ(IBV_WC_SUCCESS, one_completion().status);
  ASSERT_EQ(0, post(IBV_WR_SEND, 0, 17, 0, 0));
  EXPECT_EQ(IBV_WC_REM_INV_REQ_ERR, one_completion().status);
  auto theirs = peer.poll(2);
  ASSERT_EQ(2u, theirs.size());
  EXPECT_EQ(IBV_WC_SUCCESS, theirs[0].status);
  EXPECT_EQ(16u, theirs[0].byte_len);
  EXPECT_EQ(IBV_WC_LOC_LEN_ERR, theirs[1].status);
  // IBTA 9.7.5.2: the requester's QP is in ERR now; the next request is flushed.
  ASSERT_EQ(0, post(IBV_WR_RDMA_WRITE, 0, 8, 0, info.rkey));
  EXPECT_EQ(IBV_WC_WR_FLUSH_ERR, one_completion().status);
}

TEST_F(WarmPath, SendWithImmediateAndWriteWithImmediateCarryIt) {
  ASSERT_EQ(0, peer.post_recv(4, 0, 64));  // receive k covers [64k, 64k+64)
  uint64_t k = 0;
  for (ibv_wr_opcode op : {IBV_WR_SEND_WITH_IMM, IBV_WR_RDMA_WRITE_WITH_IMM, IBV_WR_SEND, IBV_WR_RDMA_WRITE_WITH_IMM}) {
    fill_local(uint8_t(op), 0, 32);
    ASSERT_EQ(0, post(op, 0, 32, 1024, info.rkey));
    ibv_wc wc = one_completion();
    EXPECT_EQ(IBV_WC_SUCCESS, wc.status);
    EXPECT_EQ(op == IBV_WR_RDMA_WRITE_WITH_IMM ? IBV_WC_RDMA_WRITE : IBV_WC_SEND, wc.opcode);
    auto theirs = peer.poll(1);
    ASSERT_EQ(1u, theirs.size());
    EXPECT_EQ(IBV_WC_SUCCESS, theirs[0].status);
    EXPECT_EQ(32u, theirs[0].byte_len);
    if (op == IBV_WR_SEND) {
      EXPECT_EQ(IBV_WC_RECV, theirs[0].opcode);
      EXPECT_EQ(0u, theirs[0].wc_flags & IBV_WC_WITH_IMM);
    } else {
      EXPECT_EQ(op == IBV_WR_SEND_WITH_IMM ? IBV_WC_RECV : IBV_WC_RECV_RDMA_WITH_IMM, theirs[0].opcode);
      EXPECT_TRUE(theirs[0].wc_flags & IBV_WC_WITH_IMM);
      EXPECT_EQ(htonl(0xabcd1234), theirs[0].imm_data);
    }
    EXPECT_EQ(local_sum(0, 32), peer.checksum(op == IBV_WR_RDMA_WRITE_WITH_IMM ? 1024 : 64 * k, 32));
    ++k;
  }
}

class DataPathAccess : public DataPath {
 protected:
  void SetUp() override {}
};

TEST_F(DataPathAccess, MrWithoutRemoteWriteRefusesWrites) {
  Side::Options theirs;
  theirs.mr_access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ;
  connect({}, theirs);
  ASSERT_EQ(0, post(IBV_WR_RDMA_WRITE, 0, 8, 0, info.rkey));
  EXPECT_EQ(IBV_WC_REM_ACCESS_ERR, one_completion().status);
}

TEST_F(DataPathAccess, QpWithoutRemoteReadRefusesReads) {
  Side::Options theirs;
  theirs.qp_access = IBV_ACCESS_REMOTE_WRITE;
  connect({}, theirs);
  ASSERT_EQ(0, post(IBV_WR_RDMA_READ, 0, 8, 0, info.rkey));
  EXPECT_EQ(IBV_WC_REM_ACCESS_ERR, one_completion().status);
}

TEST_F(DataPathAccess, NoReceivePostedExhaustsRnrRetries) {
  Side::Options mine;
  mine.rnr_retry = 1;
  connect(mine, {});
  ASSERT_EQ(0, post(IBV_WR_SEND, 0, 8, 0, 0));
  EXPECT_EQ(IBV_WC_RNR_RETRY_EXC_ERR, one_completion().status);
}

TEST_F(DataPathAccess, ReceivePostedLateIsUsedAfterRnrWait) {
  connect({}, {});  // rnr_retry 7: retry forever
  fill_local(6, 0, 32);
  ASSERT_EQ(0, post(IBV_WR_SEND, 0, 32, 0, 0));
  EXPECT_TRUE(poll(me.cq, 1, 50).empty());  // waiting on RNR
  ASSERT_EQ(0, peer.post_recv(1, 0, 64));
  EXPECT_EQ(IBV_WC_SUCCESS, one_completion().status);
  EXPECT_EQ(local_sum(0, 32), peer.checksum(0, 32));
}

// IBTA 9.8: UC has no acknowledgements: a message without a posted receive
// is dropped at the responder and completes successfully at the requester.
TEST_F(DataPathAccess, UcDropsWhatTheResponderCannotTakeAndCarriesOn) {
  Side::Options uc;
  uc.type = IBV_QPT_UC;
  connect(uc, uc);
  fill_local(1, 0, 64);
  ASSERT_EQ(0, post(IBV_WR_SEND, 0, 64, 0, 0));  // no receive posted: dropped
  EXPECT_EQ(IBV_WC_SUCCESS, one_completion().status);
  ASSERT_EQ(0, post(IBV_WR_RDMA_WRITE, 0, 8, 0, info.rkey + 1));  // bad key: dropped
  EXPECT_EQ(IBV_WC_SUCCESS, one_completion().status);
  EXPECT_TRUE(peer.poll(1, 50).empty());
  ASSERT_EQ(0, peer.post_recv(1, 0, 64));
  fill_local(2, 0, 64);
  ASSERT_EQ(0, post(IBV_WR_SEND, 0, 64, 0, 0));
  EXPECT_EQ(IBV_WC_SUCCESS, one_completion().status);
  auto theirs = peer.poll(1);
  ASSERT_EQ(1u, theirs.size());
  EXPECT_EQ(IBV_WC_SUCCESS, theirs[0].status);
  EXPECT_EQ(local_sum(0, 64), peer.checksum(0, 64));
  ASSERT_EQ(0, post(IBV_WR_RDMA_WRITE, 0, 64, 128, info.rkey));
  EXPECT_EQ(IBV_WC_SUCCESS, one_completion().status);
  EXPECT_EQ(local_sum(0, 64), peer.checksum(128, 64));
  // No READ or atomics on UC.
  EXPECT_EQ(EINVAL, post(IBV_WR_RDMA_READ, 0, 8, 0, info.rkey));
}

// Receive WQEs travel through the ring by their used length only (the SGEs
// in use): a slot that held a 4-SGE receive and now holds a 1-SGE one must
// offer the room of one SGE, not four.
TEST_F(DataPathAccess, ReusedReceiveSlotsOfferOnlyTheirOwnSges) {
  Side::Options small;
  small.max_wr = 4;  // receive ring of 4 slots
  connect(small, {});
  auto post_recv = [&](int nsge) {
    ibv_sge sges[4];
    for (int i = 0; i < nsge; ++i) sges[i] = {reinterpret_cast<uint64_t>(me.buf) + 4096 + 16 * uint64_t(i), 16, me.mr->lkey};
    ibv_recv_wr wr{};
    wr.wr_id = uint64_t(nsge);
    wr.sg_list = sges;
    wr.num_sge = nsge;
    ibv_recv_wr* bad;
    return ibv_post_recv(me.qp, &wr, &bad);
  };
  for (int i = 0; i < 8; ++i) {  // every slot, twice, with 4 SGEs of 16 bytes
    ASSERT_EQ(0, post_recv(4));
    peer.fill(uint8_t(i));
    ibv_wc wc = peer.post(IBV_WR_SEND, 0, 64, 0, 0);
    ASSERT_EQ(IBV_WC_SUCCESS, wc.status);
    ibv_wc mine = one_completion();
    ASSERT_EQ(IBV_WC_SUCCESS, mine.status);
    ASSERT_EQ(4u, mine.wr_id);
    ASSERT_EQ(peer.checksum(0, 64), local_sum(4096, 64));
  }
  ASSERT_EQ(0, post_recv(1));
  ibv_wc wc = peer.post(IBV_WR_SEND, 0, 64, 0, 0);
  EXPECT_EQ(IBV_WC_REM_INV_REQ_ERR, wc.status);
  ibv_wc mine = one_completion();
  EXPECT_EQ(IBV_WC_LOC_LEN_ERR, mine.status);
  EXPECT_EQ(1u, mine.wr_id);
}

// A queue asked for one entry must neither take a second one over the
// first nor lose it (a one-slot ring cannot tell full from empty: the
// daemon makes every queue at least two deep).
TEST_F(DataPathAccess, OneDeepReceiveQueueLosesNothing) {
  Side::Options one;
  one.max_wr = 1;
  connect(one, {});
  auto post_recv = [&](uint64_t id, uint64_t off) {
    ibv_sge sge{reinterpret_cast<uint64_t>(me.buf) + off, 64, me.mr->lkey};
    ibv_recv_wr wr{};
    wr.wr_id = id;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    ibv_recv_wr* bad;
    return ibv_post_recv(me.qp, &wr, &bad);
  };
  ASSERT_EQ(0, post_recv(1, 0));
  int second = post_recv(2, 64);
  ASSERT_TRUE(second == 0 || second == ENOMEM) << second;
  int want = second == 0 ? 2 : 1;
  for (int i = 0; i < want; ++i) ASSERT_EQ(IBV_WC_SUCCESS, peer.post(IBV_WR_SEND, 0, 8, 0, 0).status);
  auto wc = poll(me.cq, want);
  ASSERT_EQ(size_t(want), wc.size());
  for (int i = 0; i < want; ++i) {
    EXPECT_EQ(IBV_WC_SUCCESS, wc[i].status);
    EXPECT_EQ(uint64_t(i + 1), wc[i].wr_id);
  }
}

// UC on the warm path: a receive too small fails at the responder, and the
// requester (no acknowledgements, IBTA 9.8) completes successfully.
TEST_F(DataPathAccess, UcWarmSendIntoATooSmallReceiveFailsOnlyAtTheResponder) {
  Side::Options uc;
  uc.type = IBV_QPT_UC;
  connect(uc, uc);
  ASSERT_EQ(0, peer.post_recv(2, 0, 16));
  fill_local(7, 0, 32);
  ASSERT_EQ(0, post(IBV_WR_SEND, 0, 16, 0, 0));
  EXPECT_EQ(IBV_WC_SUCCESS, one_completion().status);
  ASSERT_EQ(0, post(IBV_WR_SEND, 0, 17, 0, 0));
  EXPECT_EQ(IBV_WC_SUCCESS, one_completion().status);
  auto theirs = peer.poll(2);
  ASSERT_EQ(2u, theirs.size());
  EXPECT_EQ(IBV_WC_SUCCESS, theirs[0].status);
  EXPECT_EQ(IBV_WC_LOC_LEN_ERR, theirs[1].status);
  // The requester carries on.
  ASSERT_EQ(0, post(IBV_WR_RDMA_WRITE, 0, 32, 256, info.rkey));
  EXPECT_EQ(IBV_WC_SUCCESS, one_completion().status);
  EXPECT_EQ(local_sum(0, 32), peer.checksum(256, 32));
}

// IBTA 9.8.2: UD sends go to the QP the work request names, if the Q_Key
// matches; receive buffers start with 40 bytes for the GRH.
TEST_F(DataPathAccess, UdDeliversWithGrhAndChecksTheQkey) {
  Side::Options ud;
  ud.type = IBV_QPT_UD;
  connect(ud, ud);
  ibv_ah_attr aa{};
  aa.is_global = 1;
  aa.port_num = 1;
  ibv_query_gid(me.ctx, 1, 0, &aa.grh.dgid);
  ibv_ah* ah = ibv_create_ah(me.pd, &aa);
  ASSERT_NE(nullptr, ah);
  auto send = [&](uint32_t qkey, uint32_t len) {
    ibv_sge sge{reinterpret_cast<uint64_t>(me.buf), len, me.mr->lkey};
    ibv_send_wr wr{};
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_SEND_WITH_IMM;
    wr.imm_data = htonl(42);
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.ud.ah = ah;
    wr.wr.ud.remote_qpn = info.qpn;
    wr.wr.ud.remote_qkey = qkey;
    ibv_send_wr* bad;
    EXPECT_EQ(0, ibv_post_send(me.qp, &wr, &bad));
    return one_completion().status;
  };
  fill_local(3, 0, 1000);
  EXPECT_EQ(IBV_WC_SUCCESS, send(0x1234, 1000));  // no receive posted: dropped quietly
  ASSERT_EQ(0, peer.post_recv(2, 0, 2048));
  EXPECT_EQ(IBV_WC_SUCCESS, send(0x9999, 1000));  // wrong Q_Key: dropped
  EXPECT_TRUE(peer.poll(1, 50).empty());
  EXPECT_EQ(IBV_WC_SUCCESS, send(0x1234, 1000));
  auto theirs = peer.poll(1);
  ASSERT_EQ(1u, theirs.size());
  EXPECT_EQ(IBV_WC_SUCCESS, theirs[0].status);
  EXPECT_EQ(1040u, theirs[0].byte_len);  // includes the GRH
  EXPECT_EQ(me.qp->qp_num, theirs[0].src_qp);
  EXPECT_TRUE(theirs[0].wc_flags & IBV_WC_GRH);
  EXPECT_EQ(htonl(42), theirs[0].imm_data);
  EXPECT_EQ(local_sum(0, 1000), peer.checksum(40, 1000));  // payload after the 40 GRH bytes
  ibv_destroy_ah(ah);
}

TEST_F(DataPathAccess, UnreachablePeerExhaustsTransportRetries) {
  Side::Options mine;
  mine.retry_cnt = 1;
  mine.timeout = 8;  // ~1 ms
  ASSERT_EQ(0, me.open(mine));
  ASSERT_EQ(0, me.connect(0xfffff0, mine));  // no such QP
  ASSERT_EQ(0, post(IBV_WR_RDMA_WRITE, 0, 8, 0, 0x1234));
  EXPECT_EQ(IBV_WC_RETRY_EXC_ERR, one_completion().status);
}

}  // namespace
}  // namespace svtest

namespace svtest {
namespace {

// The responder's own side of an error it detected (IBTA 11.6.3.1): its QP
// goes to ERR and its holders get the affiliated asynchronous error, an
// access violation for a bad R_Key, an invalid request for a SEND longer than
// the receive; a second error on a QP already in ERR raises nothing more.
TEST(ResponderErrors, TheResponderQpGetsItsAffiliatedAsyncEvent) {
  struct Case {
    const char* what;
    ibv_wr_opcode op;  // a WRITE, READ or atomic goes with a bad R_Key; a SEND of 32 bytes to a 16-byte receive
    ibv_wc_status requester;
    ibv_event_type responder;
  };
  for (const Case& k : {Case{"bad R_Key", IBV_WR_RDMA_WRITE, IBV_WC_REM_ACCESS_ERR, IBV_EVENT_QP_ACCESS_ERR},
                        Case{"READ with a bad R_Key", IBV_WR_RDMA_READ, IBV_WC_REM_ACCESS_ERR, IBV_EVENT_QP_ACCESS_ERR},
                        Case{"atomic with a bad R_Key", IBV_WR_ATOMIC_FETCH_AND_ADD, IBV_WC_REM_ACCESS_ERR,
                             IBV_EVENT_QP_ACCESS_ERR},
                        Case{"SEND longer than the receive", IBV_WR_SEND, IBV_WC_REM_INV_REQ_ERR,
                             IBV_EVENT_QP_REQ_ERR}}) {
    SCOPED_TRACE(k.what);
    Side req, resp;
    Side::Options o;
    ASSERT_EQ(0, req.open(o));
    ASSERT_EQ(0, resp.open(o));
    ASSERT_EQ(0, req.connect(resp.qp->qp_num, o));
    ASSERT_EQ(0, resp.connect(req.qp->qp_num, o));
    ibv_sge rs{reinterpret_cast<uint64_t>(resp.buf), 16, resp.mr->lkey};
    ibv_recv_wr rw{};
    rw.sg_list = &rs;
    rw.num_sge = 1;
    ibv_recv_wr* rbad;
    ASSERT_EQ(0, ibv_post_recv(resp.qp, &rw, &rbad));
    const bool atomic = k.op == IBV_WR_ATOMIC_FETCH_AND_ADD;
    ibv_sge ss{reinterpret_cast<uint64_t>(req.buf), atomic ? 8u : 32u, req.mr->lkey};
    ibv_send_wr sw{};
    sw.sg_list = &ss;
    sw.num_sge = 1;
    sw.opcode = k.op;
    sw.send_flags = IBV_SEND_SIGNALED;
    if (atomic) {
      sw.wr.atomic.remote_addr = reinterpret_cast<uint64_t>(resp.buf);
      sw.wr.atomic.rkey = resp.mr->rkey ^ 0x100;
      sw.wr.atomic.compare_add = 1;
    } else {
      sw.wr.rdma.remote_addr = reinterpret_cast<uint64_t>(resp.buf);
      sw.wr.rdma.rkey = resp.mr->rkey ^ 0x100;
    }
    ibv_send_wr* sbad;
    ASSERT_EQ(0, ibv_post_send(req.qp, &sw, &sbad));
    auto mine = poll(req.cq, 1);
    ASSERT_EQ(1u, mine.size());
    EXPECT_EQ(k.requester, mine[0].status) << ibv_wc_status_str(mine[0].status);
    ibv_async_event ev{};
    ASSERT_TRUE(next_event(resp.ctx, ev, 10000)) << "no async event at the responder";
    EXPECT_EQ(k.responder, ev.event_type) << ibv_event_type_str(ev.event_type);
    EXPECT_EQ(resp.qp, ev.element.qp);
    ibv_ack_async_event(&ev);
    ibv_qp_attr qa{};
    ibv_qp_init_attr qi{};
    ASSERT_EQ(0, ibv_query_qp(resp.qp, &qa, IBV_QP_STATE, &qi));
    EXPECT_EQ(IBV_QPS_ERR, qa.qp_state);
    EXPECT_FALSE(next_event(resp.ctx, ev, 100)) << "a second event: " << ibv_event_type_str(ev.event_type);
    EXPECT_FALSE(next_event(req.ctx, ev, 0)) << "the requester got an event: " << ibv_event_type_str(ev.event_type);
  }
}

}  // namespace
}  // namespace svtest

namespace svtest {
namespace {

// ibv_destroy_qp takes the QP's completions out of its CQs, as mlx4's and
// mlx5's providers do (IBTA 11.2.5.4: its outstanding work requests leave
// the scope of the channel interface). libfabric 1.17 counts on it: closing
// an endpoint it destroys the QP and polls the CQ dry, and RxM would repost
// the buffer of a receive completed there on the closed endpoint and crash
// (SIGSEGV). The CQ goes on with the completions of the next QP on it.
TEST(DestroyQp, ItsWaitingCompletionsLeaveTheCqWithIt) {
  Side req, resp;
  Side::Options o;
  ASSERT_EQ(0, req.open(o));
  ASSERT_EQ(0, resp.open(o));
  ASSERT_EQ(0, req.connect(resp.qp->qp_num, o));
  ASSERT_EQ(0, resp.connect(req.qp->qp_num, o));
  auto post_recvs = [](Side& s, int n) {
    for (int i = 0; i < n; ++i) {
      ibv_sge sge{reinterpret_cast<uint64_t>(s.buf) + 64 * uint64_t(i), 64, s.mr->lkey};
      ibv_recv_wr wr{};
      wr.wr_id = 100 + uint64_t(i);
      wr.sg_list = &sge;
      wr.num_sge = 1;
      ibv_recv_wr* bad;
      ASSERT_EQ(0, ibv_post_recv(s.qp, &wr, &bad));
    }
  };
  auto send = [](Side& s, uint64_t id) {
    ibv_sge sge{reinterpret_cast<uint64_t>(s.buf), 8, s.mr->lkey};
    ibv_send_wr wr{};
    wr.wr_id = id;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_SEND;
    wr.send_flags = IBV_SEND_SIGNALED;
    ibv_send_wr* bad;
    ASSERT_EQ(0, ibv_post_send(s.qp, &wr, &bad));
  };
  post_recvs(resp, 4);
  send(req, 1);
  send(req, 2);
  auto sent = poll(req.cq, 2);
  ASSERT_EQ(2u, sent.size());
  for (const auto& wc : sent) EXPECT_EQ(IBV_WC_SUCCESS, wc.status) << ibv_wc_status_str(wc.status);
  // Two receive completions wait in resp.cq (the responder's is pushed
  // before the requester's); the QP goes, and they with it.
  ASSERT_EQ(0, ibv_destroy_qp(resp.qp));
  resp.qp = nullptr;
  auto left = poll(resp.cq, 1, 200);
  EXPECT_TRUE(left.empty()) << left.size() << " completion(s) of the destroyed QP, wr_id " << left[0].wr_id;

  // A new QP on the same CQ (a new requester for it): its completions arrive.
  ibv_qp_init_attr ia{};
  ia.send_cq = ia.recv_cq = resp.cq;
  ia.qp_type = IBV_QPT_RC;
  ia.cap.max_send_wr = ia.cap.max_recv_wr = 16;
  ia.cap.max_send_sge = ia.cap.max_recv_sge = 1;
  resp.qp = ibv_create_qp(resp.pd, &ia);
  ASSERT_NE(nullptr, resp.qp) << strerror(errno);
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.port_num = 1;
  a.qp_access_flags = o.qp_access;
  ASSERT_EQ(0, ibv_modify_qp(resp.qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS));
  Side req2;
  ASSERT_EQ(0, req2.open(o));
  ASSERT_EQ(0, req2.connect(resp.qp->qp_num, o));
  ASSERT_EQ(0, resp.connect(req2.qp->qp_num, o));
  post_recvs(resp, 1);
  send(req2, 3);
  ASSERT_EQ(1u, poll(req2.cq, 1).size());
  auto got = poll(resp.cq, 1);
  ASSERT_EQ(1u, got.size());
  EXPECT_EQ(IBV_WC_SUCCESS, got[0].status);
  EXPECT_EQ(100u, got[0].wr_id);
  EXPECT_EQ(resp.qp->qp_num, got[0].qp_num);
}

}  // namespace
}  // namespace svtest
