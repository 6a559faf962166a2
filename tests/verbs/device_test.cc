// The device as clients see it: list, open, queries, PD and MR argument checks.
#include <arpa/inet.h>
#include <gtest/gtest.h>

#include <cstring>

#include "harness.h"

namespace svtest {
namespace {

TEST(Device, ListHasOneDeviceNamedSv0) {
  int n = -1;
  ibv_device** list = ibv_get_device_list(&n);
  ASSERT_NE(nullptr, list);
  ASSERT_EQ(1, n);
  EXPECT_STREQ("sv0", ibv_get_device_name(list[0]));
  EXPECT_EQ(nullptr, list[1]);
  ibv_free_device_list(list);
}

TEST(Device, PortIsActiveEthernetWithLoopbackGidAtIndexZero) {
  Side s;
  ASSERT_EQ(0, s.open({}));
  ibv_port_attr pa{};
  ASSERT_EQ(0, ibv_query_port(s.ctx, 1, &pa));
  EXPECT_EQ(IBV_PORT_ACTIVE, pa.state);
  EXPECT_EQ(IBV_LINK_LAYER_ETHERNET, pa.link_layer);
  // VLCap (IBTA 14.2.5.6): 1 means VL0 only, RoCE's one data VL; 0 is no
  // valid value at all.
  EXPECT_EQ(1, pa.max_vl_num);
  EXPECT_NE(0, ibv_query_port(s.ctx, 2, &pa));

  ibv_gid gid{};
  ASSERT_EQ(0, ibv_query_gid(s.ctx, 1, 0, &gid));
  uint8_t want[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, 1};
  EXPECT_EQ(0, std::memcmp(want, gid.raw, 16));
  ibv_gid_entry e{};
  ASSERT_EQ(0, ibv_query_gid_ex(s.ctx, 1, 0, &e, 0));
  EXPECT_EQ(IBV_GID_TYPE_ROCE_V2, e.gid_type);
  EXPECT_EQ(ENODATA, ibv_query_gid_ex(s.ctx, 1, 15, &e, 0));
  __be16 pkey;
  ASSERT_EQ(0, ibv_query_pkey(s.ctx, 1, 0, &pkey));
  EXPECT_EQ(0xffff, ntohs(pkey));
}

TEST(Device, QueryDeviceReportsWhatIsEnforced) {
  Side s;
  ASSERT_EQ(0, s.open({}));
  ibv_device_attr a{};
  ASSERT_EQ(0, ibv_query_device(s.ctx, &a));
  EXPECT_EQ(1, a.phys_port_cnt);
  EXPECT_EQ(IBV_ATOMIC_HCA, a.atomic_cap);
  // A QP beyond max_qp_wr or max_sge is refused with EINVAL.
  ibv_qp_init_attr ia{};
  ia.send_cq = s.cq;
  ia.recv_cq = s.cq;
  ia.qp_type = IBV_QPT_RC;
  ia.cap.max_send_wr = uint32_t(a.max_qp_wr) + 1;
  ia.cap.max_recv_wr = 1;
  ia.cap.max_send_sge = 1;
  ia.cap.max_recv_sge = 1;
  errno = 0;
  EXPECT_EQ(nullptr, ibv_create_qp(s.pd, &ia));
  EXPECT_EQ(EINVAL, errno);
  ia.cap.max_send_wr = 1;
  ia.cap.max_send_sge = uint32_t(a.max_sge) + 1;
  EXPECT_EQ(nullptr, ibv_create_qp(s.pd, &ia));
  EXPECT_EQ(EINVAL, errno);
  EXPECT_EQ(nullptr, ibv_create_cq(s.ctx, a.max_cqe + 1, nullptr, nullptr, 0));
  EXPECT_EQ(EINVAL, errno);
}

TEST(Device, RemoteWriteWithoutLocalWriteIsRefused) {
  Side s;
  ASSERT_EQ(0, s.open({}));
  std::vector<uint8_t> b(100);
  errno = 0;
  EXPECT_EQ(nullptr, ibv_reg_mr(s.pd, b.data(), b.size(), IBV_ACCESS_REMOTE_WRITE));
  EXPECT_EQ(EINVAL, errno);
  EXPECT_EQ(nullptr, ibv_reg_mr(s.pd, b.data(), b.size(), IBV_ACCESS_REMOTE_ATOMIC));
  EXPECT_EQ(EINVAL, errno);
  EXPECT_EQ(nullptr, ibv_reg_mr(s.pd, b.data(), 0, IBV_ACCESS_LOCAL_WRITE));
  EXPECT_EQ(EINVAL, errno);
}

TEST(Device, ByteGranularAndRedundantRegistrations) {
  Side s;
  ASSERT_EQ(0, s.open({}));
  std::vector<uint8_t> b(10000, 7);
  ibv_mr* a = ibv_reg_mr(s.pd, b.data() + 3, 5, IBV_ACCESS_LOCAL_WRITE);
  ibv_mr* c = ibv_reg_mr(s.pd, b.data() + 1, 9000, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
  ASSERT_NE(nullptr, a);
  ASSERT_NE(nullptr, c);
  EXPECT_NE(a->lkey, c->lkey);
  EXPECT_EQ(5u, a->length);
  EXPECT_EQ(0, ibv_dereg_mr(a));
  EXPECT_EQ(7, b[4]);  // contents survive registration and deregistration
  b[5000] = 9;
  EXPECT_EQ(0, ibv_dereg_mr(c));
  EXPECT_EQ(9, b[5000]);
}

TEST(Device, DeallocPdInUseIsBusy) {
  Side s;
  ASSERT_EQ(0, s.open({}));
  EXPECT_EQ(EBUSY, ibv_dealloc_pd(s.pd));
}

}  // namespace
}  // namespace svtest
