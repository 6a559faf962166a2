// UD multicast (ibv_attach_mcast(3)): the checks of attach and detach, and a
// send to a group reaching every attached QP, each in its own process.
#include <arpa/inet.h>
#include <gtest/gtest.h>

#include <cstring>

#include "harness.h"

namespace svtest {
namespace {

ibv_gid group_gid(uint8_t last) {
  ibv_gid g{};
  g.raw[0] = 0xff;  // multicast
  g.raw[1] = 0x0e;  // global scope
  g.raw[15] = last;
  return g;
}

Side::Options ud() {
  Side::Options o;
  o.type = IBV_QPT_UD;
  return o;
}

TEST(Mcast, AttachAndDetachCheckTheirArguments) {
  Side rc;
  ASSERT_EQ(0, rc.open({}));
  ibv_gid g = group_gid(1);
  EXPECT_EQ(EINVAL, ibv_attach_mcast(rc.qp, &g, 0xc001));  // not a UD QP
  EXPECT_EQ(EINVAL, ibv_detach_mcast(rc.qp, &g, 0xc001));

  Side me;
  ASSERT_EQ(0, me.open(ud()));
  ibv_gid unicast{};
  ASSERT_EQ(0, ibv_query_gid(me.ctx, 1, 0, &unicast));
  EXPECT_EQ(EINVAL, ibv_attach_mcast(me.qp, &unicast, 0));  // not a multicast GID
  EXPECT_EQ(EINVAL, ibv_detach_mcast(me.qp, &g, 0xc001));   // not attached
  EXPECT_EQ(0, ibv_attach_mcast(me.qp, &g, 0xc001));
  EXPECT_EQ(0, ibv_attach_mcast(me.qp, &g, 0xc001));  // again: still one membership
  EXPECT_EQ(0, ibv_detach_mcast(me.qp, &g, 0xc001));
  EXPECT_EQ(EINVAL, ibv_detach_mcast(me.qp, &g, 0xc001));
  // RoCEv2: an IPv4 group's GID is ::ffff:a.b.c.d with a.b.c.d in 224.0.0.0/4
  // (the MGID Linux's rdma_cm gives it); another IPv4-mapped GID is unicast.
  ibv_gid v4{};
  v4.raw[10] = v4.raw[11] = 0xff;
  v4.raw[12] = 239;
  v4.raw[15] = 7;
  EXPECT_EQ(0, ibv_attach_mcast(me.qp, &v4, 0));
  EXPECT_EQ(0, ibv_detach_mcast(me.qp, &v4, 0));
  v4.raw[12] = 240;  // class E
  EXPECT_EQ(EINVAL, ibv_attach_mcast(me.qp, &v4, 0));

  ibv_device_attr da{};
  ASSERT_EQ(0, ibv_query_device(me.ctx, &da));
  ASSERT_GT(da.max_mcast_grp, 1);
  ASSERT_GT(da.max_mcast_qp_attach, 0);
  EXPECT_EQ(da.max_mcast_grp * da.max_mcast_qp_attach, da.max_total_mcast_qp_attach);
  // Every group the device holds, then one more.
  std::vector<ibv_gid> gids;
  for (int i = 0; i < da.max_mcast_grp; ++i) {
    ibv_gid x = group_gid(0);
    x.raw[13] = uint8_t(i >> 8);
    x.raw[14] = uint8_t(i);
    x.raw[15] = 0x77;
    ASSERT_EQ(0, ibv_attach_mcast(me.qp, &x, 0)) << i;
    gids.push_back(x);
  }
  ibv_gid extra = group_gid(0x78);
  EXPECT_EQ(ENOMEM, ibv_attach_mcast(me.qp, &extra, 0));
  // Destroying the QP leaves its groups: a new QP can take one again.
  ibv_destroy_qp(me.qp);
  me.qp = nullptr;
  Side other;
  ASSERT_EQ(0, other.open(ud()));
  EXPECT_EQ(0, ibv_attach_mcast(other.qp, &extra, 0));
}

class McastData : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(0, me.open(ud()));
    ASSERT_EQ(0, me.connect(0, ud()));
    for (int i = 0; i < 3; ++i) {
      info[i] = peers[i].open(ud());
      ASSERT_NE(0u, info[i].qpn);
      ASSERT_EQ(0, peers[i].connect(0, ud()));
      ASSERT_EQ(0, peers[i].post_recv(4, 0, 1024));
    }
    for (int i = 0; i < 200; ++i) me.buf[i] = uint8_t(i * 5);
  }
  // Sends 200 bytes to `ah`, QPN `qpn`; returns the send completion's status.
  ibv_wc_status send(ibv_ah* ah, uint32_t qpn, uint32_t imm, uint32_t qkey = 0x1234) {
    ibv_sge sge{reinterpret_cast<uint64_t>(me.buf), 200, me.mr->lkey};
    ibv_send_wr wr{};
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_SEND_WITH_IMM;
    wr.imm_data = htonl(imm);
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.ud.ah = ah;
    wr.wr.ud.remote_qpn = qpn;
    wr.wr.ud.remote_qkey = qkey;
    ibv_send_wr* bad;
    EXPECT_EQ(0, ibv_post_send(me.qp, &wr, &bad));
    auto wc = poll(me.cq, 1);
    return wc.size() == 1 ? wc[0].status : IBV_WC_GENERAL_ERR;
  }
  void expect_delivery(int i, uint32_t imm, uint32_t slot) {
    auto wc = peers[i].poll(1);
    ASSERT_EQ(1u, wc.size()) << "peer " << i;
    EXPECT_EQ(IBV_WC_SUCCESS, wc[0].status);
    EXPECT_EQ(240u, wc[0].byte_len);
    EXPECT_EQ(htonl(imm), wc[0].imm_data);
    EXPECT_EQ(me.qp->qp_num, wc[0].src_qp);
    EXPECT_TRUE(wc[0].wc_flags & IBV_WC_GRH);
    EXPECT_EQ(checksum(me.buf, 200), peers[i].checksum(slot * 1024 + 40, 200));
  }
  Side me;
  Peer peers[3];
  PeerInfo info[3];
};

TEST_F(McastData, ASendReachesEveryAttachedProcess) {
  ibv_gid g = group_gid(9);
  ASSERT_EQ(0, peers[0].mcast(true, g, 0xc009));
  ASSERT_EQ(0, peers[1].mcast(true, g, 0xc009));
  ibv_ah_attr aa{};
  aa.is_global = 1;
  aa.port_num = 1;
  aa.dlid = 0xc009;
  aa.grh.dgid = g;
  ibv_ah* ah = ibv_create_ah(me.pd, &aa);
  ASSERT_NE(nullptr, ah);

  EXPECT_EQ(IBV_WC_SUCCESS, send(ah, 0xffffff, 1));
  expect_delivery(0, 1, 0);
  expect_delivery(1, 1, 0);
  EXPECT_TRUE(peers[2].poll(1, 50).empty());  // not attached

  // A multicast DGID with a unicast QPN is not a multicast packet: dropped.
  EXPECT_EQ(IBV_WC_SUCCESS, send(ah, info[0].qpn, 2));
  EXPECT_TRUE(peers[0].poll(1, 50).empty());

  // Each member checks the Q_Key, as any UD destination does.
  EXPECT_EQ(IBV_WC_SUCCESS, send(ah, 0xffffff, 9, 0x9999));
  EXPECT_TRUE(peers[0].poll(1, 50).empty());
  EXPECT_TRUE(peers[1].poll(1, 50).empty());

  // After a detach, only the members left get it.
  ASSERT_EQ(0, peers[1].mcast(false, g, 0xc009));
  ASSERT_EQ(0, peers[2].mcast(true, g, 0xc009));
  EXPECT_EQ(IBV_WC_SUCCESS, send(ah, 0xffffff, 3));
  expect_delivery(0, 3, 1);
  expect_delivery(2, 3, 0);
  EXPECT_TRUE(peers[1].poll(1, 50).empty());

  // A group nobody joined: the send completes, nothing arrives.
  ibv_ah_attr other = aa;
  other.grh.dgid = group_gid(10);
  ibv_ah* ah2 = ibv_create_ah(me.pd, &other);
  ASSERT_NE(nullptr, ah2);
  EXPECT_EQ(IBV_WC_SUCCESS, send(ah2, 0xffffff, 4));
  for (auto& p : peers) EXPECT_TRUE(p.poll(1, 30).empty());
  ibv_destroy_ah(ah2);
  ibv_destroy_ah(ah);
}

// The port is RoCE: a multicast group is named by its MGID in the GRH. An
// AH with only a DLID (InfiniBand's multicast LID) is refused, as
// rdma-core's RoCE devices refuse it (rdma-core tests/test_addr.py).
TEST_F(McastData, AnAhWithoutAGrhIsRefusedOnARoCEPort) {
  ibv_gid g = group_gid(11);
  ASSERT_EQ(0, peers[1].mcast(true, g, 0xc00b));
  ibv_ah_attr aa{};
  aa.port_num = 1;
  aa.dlid = 0xc00b;
  errno = 0;
  EXPECT_EQ(nullptr, ibv_create_ah(me.pd, &aa));
  EXPECT_EQ(EINVAL, errno);
}

}  // namespace
}  // namespace svtest
