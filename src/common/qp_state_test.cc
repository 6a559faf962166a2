#include "common/qp_state.h"

#include <gtest/gtest.h>

namespace sv {
namespace {

constexpr uint32_t kInit = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
constexpr uint32_t kRtr = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                          IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
constexpr uint32_t kRts = IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                          IBV_QP_MAX_QP_RD_ATOMIC;

TEST(QpState, RcLegalTransitionsWithRequiredAttributes) {
  EXPECT_EQ(0, check_qp_transition(IBV_QPT_RC, IBV_QPS_RESET, IBV_QPS_INIT, kInit));
  EXPECT_EQ(0, check_qp_transition(IBV_QPT_RC, IBV_QPS_INIT, IBV_QPS_INIT, IBV_QP_STATE));
  EXPECT_EQ(0, check_qp_transition(IBV_QPT_RC, IBV_QPS_INIT, IBV_QPS_RTR, kRtr));
  EXPECT_EQ(0, check_qp_transition(IBV_QPT_RC, IBV_QPS_RTR, IBV_QPS_RTS, kRts));
  EXPECT_EQ(0, check_qp_transition(IBV_QPT_RC, IBV_QPS_RTS, IBV_QPS_RTS, IBV_QP_STATE | IBV_QP_MIN_RNR_TIMER));
  EXPECT_EQ(0, check_qp_transition(IBV_QPT_RC, IBV_QPS_RTS, IBV_QPS_SQD, IBV_QP_STATE));
  EXPECT_EQ(0, check_qp_transition(IBV_QPT_RC, IBV_QPS_SQD, IBV_QPS_SQD, IBV_QP_STATE | IBV_QP_TIMEOUT));
  EXPECT_EQ(0, check_qp_transition(IBV_QPT_RC, IBV_QPS_SQD, IBV_QPS_RTS, IBV_QP_STATE));
  EXPECT_EQ(0, check_qp_transition(IBV_QPT_RC, IBV_QPS_SQE, IBV_QPS_RTS, IBV_QP_STATE));
}

TEST(QpState, EveryStateMayGoToResetAndError) {
  for (int s = IBV_QPS_RESET; s <= IBV_QPS_ERR; ++s) {
    EXPECT_EQ(0, check_qp_transition(IBV_QPT_RC, ibv_qp_state(s), IBV_QPS_RESET, IBV_QP_STATE)) << s;
    EXPECT_EQ(0, check_qp_transition(IBV_QPT_RC, ibv_qp_state(s), IBV_QPS_ERR, IBV_QP_STATE)) << s;
  }
}

TEST(QpState, IllegalTransitionsAreRefused) {
  EXPECT_EQ(EINVAL, check_qp_transition(IBV_QPT_RC, IBV_QPS_RESET, IBV_QPS_RTR, kRtr));
  EXPECT_EQ(EINVAL, check_qp_transition(IBV_QPT_RC, IBV_QPS_RESET, IBV_QPS_RTS, kRts));
  EXPECT_EQ(EINVAL, check_qp_transition(IBV_QPT_RC, IBV_QPS_INIT, IBV_QPS_RTS, kRts));
  EXPECT_EQ(EINVAL, check_qp_transition(IBV_QPT_RC, IBV_QPS_RTR, IBV_QPS_INIT, kInit));
  EXPECT_EQ(EINVAL, check_qp_transition(IBV_QPT_RC, IBV_QPS_RTS, IBV_QPS_RTR, kRtr));
  EXPECT_EQ(EINVAL, check_qp_transition(IBV_QPT_RC, IBV_QPS_ERR, IBV_QPS_RTS, kRts));
  EXPECT_EQ(EINVAL, check_qp_transition(IBV_QPT_RC, IBV_QPS_SQE, IBV_QPS_SQD, IBV_QP_STATE));
}

TEST(QpState, MissingRequiredAttributeIsRefused) {
  EXPECT_EQ(EINVAL, check_qp_transition(IBV_QPT_RC, IBV_QPS_RESET, IBV_QPS_INIT, kInit & ~IBV_QP_PORT));
  EXPECT_EQ(EINVAL, check_qp_transition(IBV_QPT_RC, IBV_QPS_INIT, IBV_QPS_RTR, kRtr & ~IBV_QP_DEST_QPN));
  EXPECT_EQ(EINVAL, check_qp_transition(IBV_QPT_RC, IBV_QPS_RTR, IBV_QPS_RTS, kRts & ~IBV_QP_SQ_PSN));
}

TEST(QpState, AttributeNotAllowedForTransitionIsRefused) {
  EXPECT_EQ(EINVAL, check_qp_transition(IBV_QPT_RC, IBV_QPS_RESET, IBV_QPS_INIT, kInit | IBV_QP_DEST_QPN));
  EXPECT_EQ(EINVAL, check_qp_transition(IBV_QPT_RC, IBV_QPS_RTS, IBV_QPS_RTS, IBV_QP_STATE | IBV_QP_DEST_QPN));
  EXPECT_EQ(EINVAL, check_qp_transition(IBV_QPT_RC, IBV_QPS_RTS, IBV_QPS_ERR, IBV_QP_STATE | IBV_QP_SQ_PSN));
}

TEST(QpState, UdAndUcUseTheirOwnAttributeSets) {
  EXPECT_EQ(0, check_qp_transition(IBV_QPT_UD, IBV_QPS_RESET, IBV_QPS_INIT,
                                   IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY));
  EXPECT_EQ(EINVAL, check_qp_transition(IBV_QPT_UD, IBV_QPS_RESET, IBV_QPS_INIT, kInit));
  EXPECT_EQ(0, check_qp_transition(IBV_QPT_UD, IBV_QPS_INIT, IBV_QPS_RTR, IBV_QP_STATE));
  EXPECT_EQ(0, check_qp_transition(IBV_QPT_UC, IBV_QPS_INIT, IBV_QPS_RTR,
                                   IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN));
  EXPECT_EQ(EINVAL, check_qp_transition(IBV_QPT_UC, IBV_QPS_RTR, IBV_QPS_RTS, kRts));
}

// XRC (IBTA annex A14): an initiator needs no responder attributes at RTR;
// a target needs only the timeout and send PSN at RTS; otherwise as RC.
TEST(QpState, XrcInitiatorAndTargetDifferFromRcWhereTheyLackASide) {
  constexpr uint32_t rtr = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
  constexpr uint32_t resp = IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
  EXPECT_EQ(0, check_qp_transition(IBV_QPT_XRC_SEND, IBV_QPS_INIT, IBV_QPS_RTR, rtr));
  EXPECT_EQ(0, check_qp_transition(IBV_QPT_XRC_SEND, IBV_QPS_INIT, IBV_QPS_RTR, rtr | resp));
  EXPECT_EQ(EINVAL, check_qp_transition(IBV_QPT_RC, IBV_QPS_INIT, IBV_QPS_RTR, rtr));
  EXPECT_EQ(EINVAL, check_qp_transition(IBV_QPT_XRC_RECV, IBV_QPS_INIT, IBV_QPS_RTR, rtr));
  EXPECT_EQ(0, check_qp_transition(IBV_QPT_XRC_RECV, IBV_QPS_INIT, IBV_QPS_RTR, rtr | resp));
  constexpr uint32_t tgt_rts = IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_SQ_PSN;
  EXPECT_EQ(0, check_qp_transition(IBV_QPT_XRC_RECV, IBV_QPS_RTR, IBV_QPS_RTS, tgt_rts));
  EXPECT_EQ(0, check_qp_transition(IBV_QPT_XRC_RECV, IBV_QPS_RTR, IBV_QPS_RTS, kRts));
  EXPECT_EQ(EINVAL, check_qp_transition(IBV_QPT_XRC_RECV, IBV_QPS_RTR, IBV_QPS_RTS, IBV_QP_STATE | IBV_QP_TIMEOUT));
  EXPECT_EQ(EINVAL, check_qp_transition(IBV_QPT_XRC_SEND, IBV_QPS_RTR, IBV_QPS_RTS, tgt_rts));
  EXPECT_EQ(0, check_qp_transition(IBV_QPT_XRC_SEND, IBV_QPS_RTR, IBV_QPS_RTS, kRts));
  EXPECT_EQ(0, check_qp_transition(IBV_QPT_XRC_SEND, IBV_QPS_RESET, IBV_QPS_INIT, kInit));
}

}  // namespace
}  // namespace sv
