// ibv_rereg_mr(3) as rdma-core's own tests use it (tests/test_mr.py): the
// MR keeps its lkey and rkey across every change, so the peer process that
// holds the rkey goes on using it; what changed is enforced at once (access:
// remote access error; PD: the responder's receive fails, the requester
// sees a remote operational error, IBTA 9.7.5.2.4; translation: the new
// range, reached through a view of it the peer makes afresh). A refusal
// leaves the MR as it was. This process owns the MR; the peer reaches it.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "harness.h"

namespace svtest {
namespace {

constexpr int kAll = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                     IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_MW_BIND;

class Rereg : public ::testing::Test {
 protected:
  void SetUp() override {
    Side::Options o;
    o.mr_access = kAll;
    ASSERT_EQ(0, me.open(o));
    info = peer.open({});
    ASSERT_NE(0u, info.qpn);
    ASSERT_EQ(0, peer.connect(me.qp->qp_num, {}));
    ASSERT_EQ(0, me.connect(info.qpn, {}));
    base = reinterpret_cast<uint64_t>(me.buf);
    lkey = me.mr->lkey;
    rkey = me.mr->rkey;
  }

  void post_recv(uint64_t addr, uint32_t len) {
    ibv_sge sge{addr, len, me.mr->lkey};
    ibv_recv_wr wr{};
    wr.wr_id = 44;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    ibv_recv_wr* bad;
    ASSERT_EQ(0, ibv_post_recv(me.qp, &wr, &bad));
  }

  ibv_wc one_completion() {
    auto v = poll(me.cq, 1);
    EXPECT_EQ(1u, v.size());
    return v.empty() ? ibv_wc{} : v[0];
  }

  // Both QPs from ERR back to RTS, as test_mr.py's restate_qps.
  void restart_both() {
    ASSERT_EQ(0, restart_qp(me.qp, info.qpn));
    ASSERT_EQ(0, peer.restart(me.qp->qp_num));
  }

  void expect_keys_kept() {
    EXPECT_EQ(lkey, me.mr->lkey);
    EXPECT_EQ(rkey, me.mr->rkey);
  }

  Side me;
  Peer peer;
  PeerInfo info{};
  uint64_t base = 0;
  uint32_t lkey = 0, rkey = 0;
};

TEST_F(Rereg, KeysStayAcrossEveryChange) {
  ibv_pd* pd2 = ibv_alloc_pd(me.ctx);
  ASSERT_NE(nullptr, pd2);
  EXPECT_EQ(0, ibv_rereg_mr(me.mr, IBV_REREG_MR_CHANGE_ACCESS, nullptr, nullptr, 0,
                            IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ));
  expect_keys_kept();
  EXPECT_EQ(0, ibv_rereg_mr(me.mr, IBV_REREG_MR_CHANGE_PD, pd2, nullptr, 0, 0));
  expect_keys_kept();
  EXPECT_EQ(pd2, me.mr->pd);
  EXPECT_EQ(EBUSY, ibv_dealloc_pd(pd2));  // the MR holds it now
  void* nb = nullptr;
  ASSERT_EQ(0, posix_memalign(&nb, 4096, 8192));
  EXPECT_EQ(0, ibv_rereg_mr(me.mr, IBV_REREG_MR_CHANGE_TRANSLATION, nullptr, nb, 8192, 0));
  expect_keys_kept();
  EXPECT_EQ(nb, me.mr->addr);
  EXPECT_EQ(8192u, me.mr->length);
  // All three at once, back to where it started.
  EXPECT_EQ(0, ibv_rereg_mr(me.mr, IBV_REREG_MR_FLAGS_SUPPORTED, me.pd, me.buf, me.len, kAll));
  expect_keys_kept();
  EXPECT_EQ(me.pd, me.mr->pd);
  EXPECT_EQ(0, ibv_dealloc_pd(pd2));  // released with the move back
  std::free(nb);
  peer.fill(3);
  EXPECT_EQ(IBV_WC_SUCCESS, peer.post(IBV_WR_RDMA_WRITE, 0, 512, base + 512, rkey).status);
  EXPECT_EQ(peer.checksum(0, 512), checksum(me.buf + 512, 512));
}

TEST_F(Rereg, TheKeptRkeyWritesAfterAnAccessChange) {
  ASSERT_EQ(0, ibv_rereg_mr(me.mr, IBV_REREG_MR_CHANGE_ACCESS, nullptr, nullptr, 0,
                            IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE));
  expect_keys_kept();
  peer.fill(7);
  EXPECT_EQ(IBV_WC_SUCCESS, peer.post(IBV_WR_RDMA_WRITE, 0, 1000, base + 100, rkey).status);
  EXPECT_EQ(peer.checksum(0, 1000), checksum(me.buf + 100, 1000));
  // Remote read is no longer granted.
  EXPECT_EQ(IBV_WC_REM_ACCESS_ERR, peer.post(IBV_WR_RDMA_READ, 0, 8, base, rkey).status);
}

TEST_F(Rereg, RemovedRemoteAccessIsARemoteAccessError) {
  peer.fill(1);
  EXPECT_EQ(IBV_WC_SUCCESS, peer.post(IBV_WR_RDMA_WRITE, 0, 64, base, rkey).status);
  ASSERT_EQ(0, ibv_rereg_mr(me.mr, IBV_REREG_MR_CHANGE_ACCESS, nullptr, nullptr, 0, IBV_ACCESS_LOCAL_WRITE));
  std::memset(me.buf, 0, 64);
  peer.fill(2);
  EXPECT_EQ(IBV_WC_REM_ACCESS_ERR, peer.post(IBV_WR_RDMA_WRITE, 0, 64, base, rkey).status);
  for (int i = 0; i < 64; ++i) ASSERT_EQ(0, me.buf[i]) << i;
}

// test_mr_rereg_pd: the MR moves to another PD, so the receive of this QP
// (of the old PD) that names it fails at the responder (its local
// protection error) and the sender gets a remote operational error, not a
// flush. Moved back, after both QPs restart, traffic flows again.
TEST_F(Rereg, PdChangeFailsTheReceiveWithARemoteOperationalError) {
  ibv_pd* pd2 = ibv_alloc_pd(me.ctx);
  ASSERT_NE(nullptr, pd2);
  ASSERT_EQ(0, ibv_rereg_mr(me.mr, IBV_REREG_MR_CHANGE_PD, pd2, nullptr, 0, 0));
  post_recv(base, 256);
  EXPECT_EQ(IBV_WC_REM_OP_ERR, peer.post(IBV_WR_SEND, 0, 64, 0, 0).status);
  ibv_wc r = one_completion();
  EXPECT_EQ(IBV_WC_LOC_PROT_ERR, r.status);
  EXPECT_EQ(44u, r.wr_id);
  // The responder detected the error: its QP is in ERR (IBTA 9.9.3.1.2).
  ibv_qp_attr qa{};
  ibv_qp_init_attr qi{};
  ASSERT_EQ(0, ibv_query_qp(me.qp, &qa, IBV_QP_STATE, &qi));
  EXPECT_EQ(IBV_QPS_ERR, qa.qp_state);

  ASSERT_EQ(0, ibv_rereg_mr(me.mr, IBV_REREG_MR_CHANGE_PD, me.pd, nullptr, 0, 0));
  restart_both();
  post_recv(base, 256);
  peer.fill(9);
  EXPECT_EQ(IBV_WC_SUCCESS, peer.post(IBV_WR_SEND, 0, 64, 0, 0).status);
  r = one_completion();
  EXPECT_EQ(IBV_WC_SUCCESS, r.status);
  EXPECT_EQ(64u, r.byte_len);
  EXPECT_EQ(peer.checksum(0, 64), checksum(me.buf, 64));
  // Destroying a PD that a re-registered MR left: test_mr.py's last step.
  ASSERT_EQ(0, ibv_rereg_mr(me.mr, IBV_REREG_MR_CHANGE_PD, pd2, nullptr, 0, 0));
  ASSERT_EQ(0, ibv_rereg_mr(me.mr, IBV_REREG_MR_CHANGE_PD, me.pd, nullptr, 0, 0));
  EXPECT_EQ(0, ibv_dealloc_pd(pd2));
}

// The peer's view of the MR (mapped at its first write) follows the MR to
// a range it did not map; the old range is no longer reachable.
TEST_F(Rereg, TranslationChangeUsesTheNewAddress) {
  ASSERT_EQ(0, ibv_rereg_mr(me.mr, IBV_REREG_MR_CHANGE_TRANSLATION, nullptr, me.buf, 4096, 0));
  peer.fill(4);
  EXPECT_EQ(IBV_WC_SUCCESS, peer.post(IBV_WR_RDMA_WRITE, 0, 100, base, rkey).status);
  EXPECT_EQ(peer.checksum(0, 100), checksum(me.buf, 100));
  ASSERT_EQ(0, ibv_rereg_mr(me.mr, IBV_REREG_MR_CHANGE_TRANSLATION, nullptr, me.buf + 32768, 4096, 0));
  expect_keys_kept();
  peer.fill(5);
  EXPECT_EQ(IBV_WC_SUCCESS, peer.post(IBV_WR_RDMA_WRITE, 0, 4096, base + 32768, rkey).status);
  EXPECT_EQ(peer.checksum(0, 4096), checksum(me.buf + 32768, 4096));
  EXPECT_EQ(IBV_WC_REM_ACCESS_ERR, peer.post(IBV_WR_RDMA_WRITE, 0, 8, base, rkey).status);
}

// test_mr_rereg_addr: a receive posted before the move names the old
// address, outside the MR now: the sender gets a remote operational error.
TEST_F(Rereg, AReceivePostedBeforeAMoveFailsWithARemoteOperationalError) {
  post_recv(base, 256);
  void* nb = nullptr;
  ASSERT_EQ(0, posix_memalign(&nb, 4096, 4096));
  ASSERT_EQ(0, ibv_rereg_mr(me.mr, IBV_REREG_MR_CHANGE_TRANSLATION, nullptr, nb, 4096, 0));
  EXPECT_EQ(IBV_WC_REM_OP_ERR, peer.post(IBV_WR_SEND, 0, 64, 0, 0).status);
  EXPECT_EQ(IBV_WC_LOC_PROT_ERR, one_completion().status);
  restart_both();
  post_recv(reinterpret_cast<uint64_t>(nb), 256);
  peer.fill(6);
  EXPECT_EQ(IBV_WC_SUCCESS, peer.post(IBV_WR_SEND, 0, 64, 0, 0).status);
  EXPECT_EQ(IBV_WC_SUCCESS, one_completion().status);
  EXPECT_EQ(peer.checksum(0, 64), checksum(static_cast<uint8_t*>(nb), 64));
  ASSERT_EQ(0, ibv_rereg_mr(me.mr, IBV_REREG_MR_CHANGE_TRANSLATION, nullptr, me.buf, me.len, 0));
  std::free(nb);
}

// The kernel refuses to change an MR that windows are bound to (EBUSY);
// so does softverbs, for both types, until the window goes.
TEST_F(Rereg, BoundWindowsMakeItBusy) {
  ibv_mw* mw2 = ibv_alloc_mw(me.pd, IBV_MW_TYPE_2);
  ASSERT_NE(nullptr, mw2);
  ibv_send_wr wr{};
  wr.opcode = IBV_WR_BIND_MW;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.bind_mw.mw = mw2;
  wr.bind_mw.rkey = ibv_inc_rkey(mw2->rkey);
  wr.bind_mw.bind_info = {me.mr, base, 256, IBV_ACCESS_REMOTE_WRITE};
  ibv_send_wr* bad;
  ASSERT_EQ(0, ibv_post_send(me.qp, &wr, &bad));
  ASSERT_EQ(IBV_WC_SUCCESS, one_completion().status);
  errno = 0;
  EXPECT_EQ(IBV_REREG_MR_ERR_CMD,
            ibv_rereg_mr(me.mr, IBV_REREG_MR_CHANGE_ACCESS, nullptr, nullptr, 0, IBV_ACCESS_LOCAL_WRITE));
  EXPECT_EQ(EBUSY, errno);
  expect_keys_kept();
  EXPECT_EQ(IBV_WC_SUCCESS, peer.post(IBV_WR_RDMA_WRITE, 0, 256, base, wr.bind_mw.rkey).status);
  ibv_send_wr inv{};
  inv.opcode = IBV_WR_LOCAL_INV;
  inv.send_flags = IBV_SEND_SIGNALED;
  inv.invalidate_rkey = wr.bind_mw.rkey;
  ASSERT_EQ(0, ibv_post_send(me.qp, &inv, &bad));
  ASSERT_EQ(IBV_WC_SUCCESS, one_completion().status);

  ibv_mw* mw1 = ibv_alloc_mw(me.pd, IBV_MW_TYPE_1);
  ASSERT_NE(nullptr, mw1);
  ibv_mw_bind bind{};
  bind.send_flags = IBV_SEND_SIGNALED;
  bind.bind_info = {me.mr, base, 64, IBV_ACCESS_REMOTE_READ};
  ASSERT_EQ(0, ibv_bind_mw(me.qp, mw1, &bind));
  ASSERT_EQ(IBV_WC_SUCCESS, one_completion().status);
  errno = 0;
  EXPECT_EQ(IBV_REREG_MR_ERR_CMD, ibv_rereg_mr(me.mr, IBV_REREG_MR_CHANGE_PD, me.pd, nullptr, 0, 0));
  EXPECT_EQ(EBUSY, errno);
  EXPECT_EQ(0, ibv_dealloc_mw(mw1));
  EXPECT_EQ(0, ibv_rereg_mr(me.mr, IBV_REREG_MR_CHANGE_ACCESS, nullptr, nullptr, 0,
                            IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE));
  expect_keys_kept();
  EXPECT_EQ(0, ibv_dealloc_mw(mw2));
}

// The peer's view of a key is tied to the entry's generation, not to the key
// alone: a type 2 window bound again under a key it had before, elsewhere,
// is reached where it is now (the peer's view of its first range would not
// hold it).
TEST_F(Rereg, AWindowKeyBoundAgainElsewhereIsReachedWhereItIsNow) {
  ibv_mw* mw = ibv_alloc_mw(me.pd, IBV_MW_TYPE_2);
  ASSERT_NE(nullptr, mw);
  auto bind = [&](uint32_t key, uint64_t addr) {
    ibv_send_wr wr{};
    wr.opcode = IBV_WR_BIND_MW;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.bind_mw.mw = mw;
    wr.bind_mw.rkey = key;
    wr.bind_mw.bind_info = {me.mr, addr, 256, IBV_ACCESS_REMOTE_WRITE};
    ibv_send_wr* bad;
    ASSERT_EQ(0, ibv_post_send(me.qp, &wr, &bad));
    ASSERT_EQ(IBV_WC_SUCCESS, one_completion().status);
  };
  auto invalidate = [&](uint32_t key) {
    ibv_send_wr inv{};
    inv.opcode = IBV_WR_LOCAL_INV;
    inv.send_flags = IBV_SEND_SIGNALED;
    inv.invalidate_rkey = key;
    ibv_send_wr* bad;
    ASSERT_EQ(0, ibv_post_send(me.qp, &inv, &bad));
    ASSERT_EQ(IBV_WC_SUCCESS, one_completion().status);
  };
  const uint32_t k1 = ibv_inc_rkey(mw->rkey), k2 = ibv_inc_rkey(k1);
  bind(k1, base);
  peer.fill(1);
  ASSERT_EQ(IBV_WC_SUCCESS, peer.post(IBV_WR_RDMA_WRITE, 0, 256, base, k1).status);
  invalidate(k1);
  bind(k2, base + 4096);
  invalidate(k2);
  bind(k1, base + 40960);
  peer.fill(2);
  EXPECT_EQ(IBV_WC_SUCCESS, peer.post(IBV_WR_RDMA_WRITE, 0, 256, base + 40960, k1).status);
  EXPECT_EQ(peer.checksum(0, 256), checksum(me.buf + 40960, 256));
  invalidate(k1);
  EXPECT_EQ(0, ibv_dealloc_mw(mw));
}

// Each refusal leaves the MR exactly as it was, and still usable.
TEST_F(Rereg, ARefusalLeavesTheMrAsItWas) {
  ibv_pd* before_pd = me.mr->pd;
  void* before_addr = me.mr->addr;
  size_t before_len = me.mr->length;
  // What libibverbs refuses itself (IBV_REREG_MR_ERR_INPUT).
  EXPECT_EQ(IBV_REREG_MR_ERR_INPUT, ibv_rereg_mr(me.mr, 1 << 10, nullptr, nullptr, 0, 0));
  EXPECT_EQ(IBV_REREG_MR_ERR_INPUT, ibv_rereg_mr(me.mr, IBV_REREG_MR_CHANGE_TRANSLATION, nullptr, nullptr, 4096, 0));
  EXPECT_EQ(IBV_REREG_MR_ERR_INPUT, ibv_rereg_mr(me.mr, IBV_REREG_MR_CHANGE_PD, nullptr, nullptr, 0, 0));
  EXPECT_EQ(IBV_REREG_MR_ERR_INPUT,
            ibv_rereg_mr(me.mr, IBV_REREG_MR_CHANGE_PD, nullptr, nullptr, 0, IBV_ACCESS_LOCAL_WRITE));
  // What the device refuses (IBV_REREG_MR_ERR_CMD): remote write without
  // local write (ibv_reg_mr(3)), memory without access, no change at all.
  errno = 0;
  EXPECT_EQ(IBV_REREG_MR_ERR_CMD,
            ibv_rereg_mr(me.mr, IBV_REREG_MR_CHANGE_ACCESS, nullptr, nullptr, 0, IBV_ACCESS_REMOTE_WRITE));
  EXPECT_EQ(EINVAL, errno);
  void* guard = mmap(nullptr, 8192, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(MAP_FAILED, guard);
  errno = 0;
  EXPECT_EQ(IBV_REREG_MR_ERR_CMD, ibv_rereg_mr(me.mr, IBV_REREG_MR_CHANGE_TRANSLATION, nullptr, guard, 8192, 0));
  EXPECT_EQ(EFAULT, errno);
  ASSERT_EQ(0, munmap(guard, 8192));
  EXPECT_EQ(IBV_REREG_MR_ERR_CMD, ibv_rereg_mr(me.mr, 0, nullptr, nullptr, 0, 0));
  expect_keys_kept();
  EXPECT_EQ(before_pd, me.mr->pd);
  EXPECT_EQ(before_addr, me.mr->addr);
  EXPECT_EQ(before_len, me.mr->length);
  peer.fill(8);
  EXPECT_EQ(IBV_WC_SUCCESS, peer.post(IBV_WR_RDMA_WRITE, 0, 2048, base + me.len - 2048, rkey).status);
  EXPECT_EQ(peer.checksum(0, 2048), checksum(me.buf + me.len - 2048, 2048));
  EXPECT_EQ(IBV_WC_SUCCESS, peer.post(IBV_WR_RDMA_READ, 0, 8, base, rkey).status);
}

// A QP moved from ERR to RESET takes its completions still waiting in its
// CQ with it (as mlx4's and mlx5's providers clean the CQs); another QP's
// stay.
TEST(ResetQp, TakesItsWaitingCompletionsOutOfItsCq) {
  Side me;
  ASSERT_EQ(0, me.open({}));
  ibv_qp_init_attr ia{};
  ia.send_cq = me.cq;
  ia.recv_cq = me.cq;
  ia.qp_type = IBV_QPT_RC;
  ia.cap.max_send_wr = ia.cap.max_recv_wr = 8;
  ia.cap.max_send_sge = ia.cap.max_recv_sge = 1;
  ibv_qp* other = ibv_create_qp(me.pd, &ia);
  ASSERT_NE(nullptr, other);
  ASSERT_EQ(0, connect_qp(other, other->qp_num));
  ASSERT_EQ(0, connect_qp(me.qp, me.qp->qp_num));
  ibv_sge sge{reinterpret_cast<uint64_t>(me.buf), 64, me.mr->lkey};
  ibv_recv_wr wr{};
  wr.sg_list = &sge;
  wr.num_sge = 1;
  ibv_recv_wr* bad;
  for (ibv_qp* q : {me.qp, me.qp, other}) ASSERT_EQ(0, ibv_post_recv(q, &wr, &bad));
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_ERR;
  ASSERT_EQ(0, ibv_modify_qp(me.qp, &a, IBV_QP_STATE));  // two flushed receives wait
  ASSERT_EQ(0, ibv_modify_qp(other, &a, IBV_QP_STATE));  // and one of the other QP
  a.qp_state = IBV_QPS_RESET;
  ASSERT_EQ(0, ibv_modify_qp(me.qp, &a, IBV_QP_STATE));
  ibv_wc wc[4];
  ASSERT_EQ(1, ibv_poll_cq(me.cq, 4, wc));
  EXPECT_EQ(other->qp_num, wc[0].qp_num);
  EXPECT_EQ(IBV_WC_WR_FLUSH_ERR, wc[0].status);
  EXPECT_EQ(0, ibv_destroy_qp(other));
}

}  // namespace
}  // namespace svtest
