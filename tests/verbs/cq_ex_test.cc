// Extended CQs (ibv_create_cq_ex(3)): start_poll/next_poll/end_poll and the
// read callbacks, completion timestamps.
#include <gtest/gtest.h>

#include "harness.h"

namespace svtest {
namespace {

TEST(CqEx, PollsWithTheExtendedApi) {
  Side me;
  ASSERT_EQ(0, me.open({}));
  ibv_cq_init_attr_ex ca{};
  ca.cqe = 16;
  ca.wc_flags = IBV_WC_EX_WITH_BYTE_LEN | IBV_WC_EX_WITH_QP_NUM | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP;
  ibv_cq_ex* cq = ibv_create_cq_ex(me.ctx, &ca);
  ASSERT_NE(nullptr, cq);
  ibv_cq_init_attr_ex bad_flags = ca;
  bad_flags.wc_flags |= IBV_WC_EX_WITH_TM_INFO;
  errno = 0;
  EXPECT_EQ(nullptr, ibv_create_cq_ex(me.ctx, &bad_flags));
  EXPECT_EQ(EOPNOTSUPP, errno);
  ibv_device_attr_ex dx{};
  ASSERT_EQ(0, ibv_query_device_ex(me.ctx, nullptr, &dx));
  EXPECT_NE(0u, dx.completion_timestamp_mask);

  ibv_qp_init_attr ia{};
  ia.send_cq = ibv_cq_ex_to_cq(cq);
  ia.recv_cq = ibv_cq_ex_to_cq(cq);
  ia.qp_type = IBV_QPT_RC;
  ia.cap = {8, 8, 1, 1, 0};
  ibv_qp* qp = ibv_create_qp(me.pd, &ia);
  ASSERT_NE(nullptr, qp);
  Peer peer;
  PeerInfo info = peer.open({});
  Side tmp;
  tmp.ctx = me.ctx;
  tmp.qp = qp;
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.port_num = 1;
  ASSERT_EQ(0, ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS));
  ASSERT_EQ(0, tmp.connect(info.qpn, {}));
  tmp.ctx = nullptr;
  tmp.qp = nullptr;
  ASSERT_EQ(0, peer.connect(qp->qp_num, {}));

  ibv_poll_cq_attr pa{};
  EXPECT_EQ(ENOENT, ibv_start_poll(cq, &pa));  // empty
  for (uint64_t i = 0; i < 2; ++i) {
    ibv_sge sge{reinterpret_cast<uint64_t>(me.buf), 100, me.mr->lkey};
    ibv_send_wr wr{};
    wr.wr_id = 10 + i;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_RDMA_WRITE;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = info.addr;
    wr.wr.rdma.rkey = info.rkey;
    ibv_send_wr* bad;
    ASSERT_EQ(0, ibv_post_send(qp, &wr, &bad));
  }
  ASSERT_EQ(0, ibv_start_poll(cq, &pa));
  EXPECT_EQ(10u, cq->wr_id);
  EXPECT_EQ(IBV_WC_SUCCESS, cq->status);
  EXPECT_EQ(IBV_WC_RDMA_WRITE, ibv_wc_read_opcode(cq));
  EXPECT_EQ(100u, ibv_wc_read_byte_len(cq));
  EXPECT_EQ(qp->qp_num, ibv_wc_read_qp_num(cq));
  uint64_t t1 = ibv_wc_read_completion_ts(cq);
  EXPECT_NE(0u, t1);
  ASSERT_EQ(0, ibv_next_poll(cq));
  EXPECT_EQ(11u, cq->wr_id);
  EXPECT_GE(ibv_wc_read_completion_ts(cq), t1);
  EXPECT_EQ(ENOENT, ibv_next_poll(cq));
  ibv_end_poll(cq);
  ibv_destroy_qp(qp);
  ibv_destroy_cq(ibv_cq_ex_to_cq(cq));
}

}  // namespace
}  // namespace svtest
