// The QP state machine through ibv_modify_qp (IBTA 10.3.1, 11.2.4.2).
#include <gtest/gtest.h>

#include "harness.h"

namespace svtest {
namespace {

ibv_qp_state state_of(ibv_qp* qp) {
  ibv_qp_attr a{};
  ibv_qp_init_attr ia{};
  ibv_query_qp(qp, &a, IBV_QP_STATE, &ia);
  return a.qp_state;
}

int to_rtr(ibv_qp* qp, uint32_t dest, int mask_drop = 0) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = IBV_MTU_1024;
  a.dest_qp_num = dest;
  a.max_dest_rd_atomic = 1;
  a.min_rnr_timer = 1;
  a.ah_attr.port_num = 1;
  int mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
             IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
  return ibv_modify_qp(qp, &a, mask & ~mask_drop);
}

int to_rts(ibv_qp* qp) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_RTS;
  a.timeout = 14;
  a.retry_cnt = 7;
  a.rnr_retry = 7;
  a.max_rd_atomic = 1;
  return ibv_modify_qp(qp, &a,
                       IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                           IBV_QP_MAX_QP_RD_ATOMIC);
}

int to_state(ibv_qp* qp, ibv_qp_state s) {
  ibv_qp_attr a{};
  a.qp_state = s;
  return ibv_modify_qp(qp, &a, IBV_QP_STATE);
}

TEST(QpStateMachine, EveryLegalTransition) {
  Side s;
  ASSERT_EQ(0, s.open({}));  // RESET -> INIT
  EXPECT_EQ(IBV_QPS_INIT, state_of(s.qp));
  EXPECT_EQ(0, to_state(s.qp, IBV_QPS_INIT));  // INIT -> INIT
  ASSERT_EQ(0, to_rtr(s.qp, s.qp->qp_num));
  EXPECT_EQ(IBV_QPS_RTR, state_of(s.qp));
  ASSERT_EQ(0, to_rts(s.qp));
  EXPECT_EQ(IBV_QPS_RTS, state_of(s.qp));
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_RTS;
  a.min_rnr_timer = 3;
  EXPECT_EQ(0, ibv_modify_qp(s.qp, &a, IBV_QP_STATE | IBV_QP_MIN_RNR_TIMER));  // RTS -> RTS
  EXPECT_EQ(0, to_state(s.qp, IBV_QPS_SQD));
  EXPECT_EQ(IBV_QPS_SQD, state_of(s.qp));
  EXPECT_EQ(0, to_state(s.qp, IBV_QPS_SQD));  // SQD -> SQD
  EXPECT_EQ(0, to_state(s.qp, IBV_QPS_RTS));  // SQD -> RTS
  EXPECT_EQ(0, to_state(s.qp, IBV_QPS_ERR));
  EXPECT_EQ(IBV_QPS_ERR, state_of(s.qp));
  EXPECT_EQ(0, to_state(s.qp, IBV_QPS_RESET));
  EXPECT_EQ(IBV_QPS_RESET, state_of(s.qp));
  // And back up again from RESET.
  ibv_qp_attr i{};
  i.qp_state = IBV_QPS_INIT;
  i.port_num = 1;
  EXPECT_EQ(0, ibv_modify_qp(s.qp, &i, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS));
  EXPECT_EQ(0, to_state(s.qp, IBV_QPS_ERR));  // INIT -> ERR
}

TEST(QpStateMachine, IllegalTransitionsKeepTheState) {
  Side s;
  ASSERT_EQ(0, s.open({}));
  EXPECT_EQ(EINVAL, to_rts(s.qp));  // INIT -> RTS skips RTR
  EXPECT_EQ(IBV_QPS_INIT, state_of(s.qp));
  EXPECT_EQ(EINVAL, to_rtr(s.qp, 5, IBV_QP_DEST_QPN));  // required attribute missing
  EXPECT_EQ(EINVAL, to_rtr(s.qp, 5, IBV_QP_MIN_RNR_TIMER));
  EXPECT_EQ(IBV_QPS_INIT, state_of(s.qp));
  ASSERT_EQ(0, to_rtr(s.qp, 5));
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_RTS;
  a.dest_qp_num = 9;  // not allowed on RTR -> RTS
  EXPECT_EQ(EINVAL, ibv_modify_qp(s.qp, &a, IBV_QP_STATE | IBV_QP_DEST_QPN));
  EXPECT_EQ(EINVAL, to_state(s.qp, IBV_QPS_SQD));  // RTR -> SQD
  a = {};
  a.qp_state = IBV_QPS_RTS;
  a.cur_qp_state = IBV_QPS_INIT;  // wrong current state
  a.timeout = 1;
  EXPECT_EQ(EINVAL, ibv_modify_qp(s.qp, &a,
                                  IBV_QP_STATE | IBV_QP_CUR_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                                      IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC));
  EXPECT_EQ(IBV_QPS_RTR, state_of(s.qp));
  ASSERT_EQ(0, to_state(s.qp, IBV_QPS_ERR));
  EXPECT_EQ(EINVAL, to_rts(s.qp));  // ERR -> RTS
}

TEST(QpStateMachine, AttributeRangesAreChecked) {
  Side s;
  ASSERT_EQ(0, s.open({}));
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.port_num = 2;  // no such port
  EXPECT_EQ(EINVAL, ibv_modify_qp(s.qp, &a, IBV_QP_STATE | IBV_QP_PORT));
  a.port_num = 1;
  a.qp_access_flags = 1 << 20;
  EXPECT_EQ(EINVAL, ibv_modify_qp(s.qp, &a, IBV_QP_STATE | IBV_QP_ACCESS_FLAGS));
  ASSERT_EQ(0, to_rtr(s.qp, 5));
  a = {};
  a.qp_state = IBV_QPS_RTS;
  a.retry_cnt = 8;  // 3 bits
  EXPECT_EQ(EINVAL, ibv_modify_qp(s.qp, &a,
                                  IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                                      IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC));
}

TEST(QpStateMachine, PostingBeforeRtsIsRefused) {
  Side s;
  ASSERT_EQ(0, s.open({}));
  ibv_sge sge{reinterpret_cast<uint64_t>(s.buf), 8, s.mr->lkey};
  ibv_send_wr wr{};
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_SEND;
  ibv_send_wr* bad = nullptr;
  EXPECT_EQ(EINVAL, ibv_post_send(s.qp, &wr, &bad));
  EXPECT_EQ(&wr, bad);
}

}  // namespace
}  // namespace svtest
