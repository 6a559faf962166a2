// Memory windows: type 1 (ibv_bind_mw) and type 2 (IBV_WR_BIND_MW,
// IBV_WR_LOCAL_INV, IBV_WR_SEND_WITH_INV). This process owns the memory and
// the windows; the peer process reaches them with the window keys.
#include <gtest/gtest.h>

#include "harness.h"

namespace svtest {
namespace {

class Windows : public ::testing::Test {
 protected:
  void SetUp() override {
    Side::Options o;
    o.mr_access |= IBV_ACCESS_MW_BIND;
    ASSERT_EQ(0, me.open(o));
    info = peer.open({});
    ASSERT_NE(0u, info.qpn);
    ASSERT_EQ(0, peer.connect(me.qp->qp_num, {}));
    ASSERT_EQ(0, me.connect(info.qpn, {}));
    base = reinterpret_cast<uint64_t>(me.buf);
  }

  ibv_wc post_local(ibv_send_wr& wr) {
    ibv_send_wr* bad;
    EXPECT_EQ(0, ibv_post_send(me.qp, &wr, &bad));
    auto v = poll(me.cq, 1);
    EXPECT_EQ(1u, v.size());
    return v.empty() ? ibv_wc{} : v[0];
  }

  Side me;
  Peer peer;
  PeerInfo info{};
  uint64_t base = 0;
};

TEST_F(Windows, Type1BindGrantsExactlyTheWindow) {
  ibv_mw* mw = ibv_alloc_mw(me.pd, IBV_MW_TYPE_1);
  ASSERT_NE(nullptr, mw);
  uint32_t unbound = mw->rkey;
  ibv_mw_bind bind{};
  bind.wr_id = 9;
  bind.send_flags = IBV_SEND_SIGNALED;
  bind.bind_info = {me.mr, base + 4096, 1000, IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ};
  ASSERT_EQ(0, ibv_bind_mw(me.qp, mw, &bind));
  EXPECT_NE(unbound, mw->rkey);  // the key byte changes on each bind
  EXPECT_EQ(unbound >> 8, mw->rkey >> 8);
  auto c = poll(me.cq, 1);
  ASSERT_EQ(1u, c.size());
  EXPECT_EQ(IBV_WC_BIND_MW, c[0].opcode);
  EXPECT_EQ(9u, c[0].wr_id);

  peer.fill(4);
  EXPECT_EQ(IBV_WC_SUCCESS, peer.post(IBV_WR_RDMA_WRITE, 0, 1000, base + 4096, mw->rkey).status);
  EXPECT_EQ(peer.checksum(0, 1000), checksum(me.buf + 4096, 1000));
  EXPECT_EQ(IBV_WC_SUCCESS, peer.post(IBV_WR_RDMA_READ, 0, 10, base + 4096 + 990, mw->rkey).status);

  // Rebinding revokes the old key at once.
  uint32_t old = mw->rkey;
  bind.bind_info = {me.mr, base, 64, IBV_ACCESS_REMOTE_READ};
  ASSERT_EQ(0, ibv_bind_mw(me.qp, mw, &bind));
  poll(me.cq, 1);
  EXPECT_NE(old, mw->rkey);
  EXPECT_EQ(IBV_WC_SUCCESS, peer.post(IBV_WR_RDMA_READ, 0, 64, base, mw->rkey).status);
  // Write through a read-only window: refused (and the connection goes to ERR).
  EXPECT_EQ(IBV_WC_REM_ACCESS_ERR, peer.post(IBV_WR_RDMA_WRITE, 0, 8, base, mw->rkey).status);
  EXPECT_EQ(0, ibv_dealloc_mw(mw));
}

TEST_F(Windows, Type1WindowBoundsAreEnforced) {
  ibv_mw* mw = ibv_alloc_mw(me.pd, IBV_MW_TYPE_1);
  ASSERT_NE(nullptr, mw);
  ibv_mw_bind bind{};
  bind.bind_info = {me.mr, base + 100, 50, IBV_ACCESS_REMOTE_WRITE};
  ASSERT_EQ(0, ibv_bind_mw(me.qp, mw, &bind));
  uint64_t before = checksum(me.buf, me.len);
  EXPECT_EQ(IBV_WC_REM_ACCESS_ERR, peer.post(IBV_WR_RDMA_WRITE, 0, 51, base + 100, mw->rkey).status);
  EXPECT_EQ(before, checksum(me.buf, me.len));
  EXPECT_EQ(0, ibv_dealloc_mw(mw));
}

TEST_F(Windows, BindNeedsMwBindAccessAndDeregWaitsForWindows) {
  ibv_mr* plain = ibv_reg_mr(me.pd, me.buf, 4096, IBV_ACCESS_LOCAL_WRITE);
  ASSERT_NE(nullptr, plain);
  ibv_mw* mw = ibv_alloc_mw(me.pd, IBV_MW_TYPE_1);
  ASSERT_NE(nullptr, mw);
  ibv_mw_bind bind{};
  bind.bind_info = {plain, base, 64, IBV_ACCESS_REMOTE_READ};
  EXPECT_NE(0, ibv_bind_mw(me.qp, mw, &bind));
  // A window bound to an MR keeps the MR registered.
  bind.bind_info = {me.mr, base, 64, IBV_ACCESS_REMOTE_READ};
  ASSERT_EQ(0, ibv_bind_mw(me.qp, mw, &bind));
  EXPECT_EQ(EBUSY, ibv_dereg_mr(me.mr));
  EXPECT_EQ(0, ibv_dealloc_mw(mw));
  EXPECT_EQ(0, ibv_dereg_mr(plain));
}

TEST_F(Windows, Type2BindLocalInvalidateAndSendWithInvalidate) {
  ibv_mw* mw = ibv_alloc_mw(me.pd, IBV_MW_TYPE_2);
  ASSERT_NE(nullptr, mw);
  ibv_send_wr wr{};
  wr.wr_id = 3;
  wr.opcode = IBV_WR_BIND_MW;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.bind_mw.mw = mw;
  wr.bind_mw.rkey = ibv_inc_rkey(mw->rkey);
  wr.bind_mw.bind_info = {me.mr, base, 256, IBV_ACCESS_REMOTE_WRITE};
  ibv_wc c = post_local(wr);
  EXPECT_EQ(IBV_WC_SUCCESS, c.status);
  EXPECT_EQ(IBV_WC_BIND_MW, c.opcode);
  uint32_t key = wr.bind_mw.rkey;
  EXPECT_EQ(IBV_WC_SUCCESS, peer.post(IBV_WR_RDMA_WRITE, 0, 256, base, key).status);

  // Local invalidation: the key stops working at once.
  ibv_send_wr inv{};
  inv.opcode = IBV_WR_LOCAL_INV;
  inv.send_flags = IBV_SEND_SIGNALED;
  inv.invalidate_rkey = key;
  c = post_local(inv);
  EXPECT_EQ(IBV_WC_SUCCESS, c.status);
  EXPECT_EQ(IBV_WC_LOCAL_INV, c.opcode);

  // Bind again with a new key; the peer invalidates it with SEND_WITH_INV.
  wr.bind_mw.rkey = ibv_inc_rkey(key);
  ASSERT_EQ(IBV_WC_SUCCESS, post_local(wr).status);
  uint32_t key2 = wr.bind_mw.rkey;
  ibv_sge sge{base + 4096, 64, me.mr->lkey};
  ibv_recv_wr rwr{};
  rwr.wr_id = 44;
  rwr.sg_list = &sge;
  rwr.num_sge = 1;
  ibv_recv_wr* bad;
  ASSERT_EQ(0, ibv_post_recv(me.qp, &rwr, &bad));
  EXPECT_EQ(IBV_WC_SUCCESS, peer.post(IBV_WR_SEND_WITH_INV, 0, 8, 0, key2).status);
  auto r = poll(me.cq, 1);
  ASSERT_EQ(1u, r.size());
  EXPECT_EQ(44u, r[0].wr_id);
  EXPECT_TRUE(r[0].wc_flags & IBV_WC_WITH_INV);
  EXPECT_EQ(key2, r[0].invalidated_rkey);
  EXPECT_EQ(IBV_WC_REM_ACCESS_ERR, peer.post(IBV_WR_RDMA_WRITE, 0, 8, base, key2).status);
  EXPECT_EQ(0, ibv_dealloc_mw(mw));
}

TEST_F(Windows, Type2KeyOfAnInvalidatedWindowIsRefused) {
  ibv_mw* mw = ibv_alloc_mw(me.pd, IBV_MW_TYPE_2);
  ASSERT_NE(nullptr, mw);
  // Never bound: its key grants nothing.
  EXPECT_EQ(IBV_WC_REM_ACCESS_ERR, peer.post(IBV_WR_RDMA_WRITE, 0, 8, base, mw->rkey).status);
  EXPECT_EQ(0, ibv_dealloc_mw(mw));
}

}  // namespace
}  // namespace svtest
