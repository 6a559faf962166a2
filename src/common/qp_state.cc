#include "common/qp_state.h"

#include <cerrno>

namespace sv {
namespace {

constexpr int kStates = IBV_QPS_ERR + 1;  // RESET INIT RTR RTS SQD SQE ERR
enum Kind { kRc, kUc, kUd, kKinds };

struct Row {
  uint32_t req[kKinds];
  uint32_t opt[kKinds];
  bool valid;
};

constexpr uint32_t ALT = IBV_QP_ALT_PATH;

// IBTA 11.2.4.2 table: attributes per transition and QP type, one function
// per transition, each returning a valid row.
constexpr Row valid_row() {
  return Row{{0, 0, 0}, {0, 0, 0}, true};
}

constexpr Row reset_to_init() {
  Row r = valid_row();
  r.req[kRc] = r.req[kUc] = IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
  r.req[kUd] = IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY;
  return r;
}

constexpr Row init_to_init() {
  Row r = valid_row();
  r.opt[kRc] = r.opt[kUc] = IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
  r.opt[kUd] = IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY;
  return r;
}

constexpr Row init_to_rtr() {
  Row r = valid_row();
  r.req[kRc] = IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
               IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
  r.req[kUc] = IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
  r.opt[kRc] = r.opt[kUc] = ALT | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX;
  r.opt[kUd] = IBV_QP_PKEY_INDEX | IBV_QP_QKEY;
  return r;
}

constexpr Row rtr_to_rts() {
  Row r = valid_row();
  r.req[kRc] = IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
               IBV_QP_MAX_QP_RD_ATOMIC;
  r.req[kUc] = r.req[kUd] = IBV_QP_SQ_PSN;
  r.opt[kRc] = IBV_QP_CUR_STATE | ALT | IBV_QP_ACCESS_FLAGS | IBV_QP_MIN_RNR_TIMER |
               IBV_QP_PATH_MIG_STATE;
  r.opt[kUc] = IBV_QP_CUR_STATE | ALT | IBV_QP_ACCESS_FLAGS | IBV_QP_PATH_MIG_STATE;
  r.opt[kUd] = IBV_QP_CUR_STATE | IBV_QP_QKEY;
  return r;
}

// RTS to RTS and SQD to RTS take the same attributes.
constexpr Row to_rts_again() {
  Row r = valid_row();
  r.opt[kRc] = IBV_QP_CUR_STATE | IBV_QP_ACCESS_FLAGS | ALT | IBV_QP_PATH_MIG_STATE |
               IBV_QP_MIN_RNR_TIMER;
  r.opt[kUc] = IBV_QP_CUR_STATE | IBV_QP_ACCESS_FLAGS | ALT | IBV_QP_PATH_MIG_STATE;
  r.opt[kUd] = IBV_QP_CUR_STATE | IBV_QP_QKEY;
  return r;
}

constexpr Row rts_to_sqd() {
  Row r = valid_row();
  r.opt[kRc] = r.opt[kUc] = r.opt[kUd] = IBV_QP_EN_SQD_ASYNC_NOTIFY;
  return r;
}

constexpr Row sqd_to_sqd() {
  Row r = valid_row();
  r.opt[kRc] = IBV_QP_PORT | IBV_QP_AV | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
               IBV_QP_MAX_QP_RD_ATOMIC | IBV_QP_MAX_DEST_RD_ATOMIC | ALT | IBV_QP_ACCESS_FLAGS |
               IBV_QP_PKEY_INDEX | IBV_QP_MIN_RNR_TIMER | IBV_QP_PATH_MIG_STATE;
  r.opt[kUc] = IBV_QP_AV | ALT | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX | IBV_QP_PATH_MIG_STATE;
  r.opt[kUd] = IBV_QP_PKEY_INDEX | IBV_QP_QKEY;
  return r;
}

constexpr Row sqe_to_rts() {
  Row r = valid_row();
  r.opt[kRc] = IBV_QP_CUR_STATE | IBV_QP_ACCESS_FLAGS | IBV_QP_MIN_RNR_TIMER;
  r.opt[kUc] = IBV_QP_CUR_STATE | IBV_QP_ACCESS_FLAGS;
  r.opt[kUd] = IBV_QP_CUR_STATE | IBV_QP_QKEY;
  return r;
}

constexpr Row rule(ibv_qp_state cur, ibv_qp_state next) {
  // Any state may go to RESET or ERR with only the state attribute (10.3.1).
  if (next == IBV_QPS_RESET || next == IBV_QPS_ERR) return valid_row();
  if (cur == IBV_QPS_RESET && next == IBV_QPS_INIT) return reset_to_init();
  if (cur == IBV_QPS_INIT && next == IBV_QPS_INIT) return init_to_init();
  if (cur == IBV_QPS_INIT && next == IBV_QPS_RTR) return init_to_rtr();
  if (cur == IBV_QPS_RTR && next == IBV_QPS_RTS) return rtr_to_rts();
  if ((cur == IBV_QPS_RTS || cur == IBV_QPS_SQD) && next == IBV_QPS_RTS) return to_rts_again();
  if (cur == IBV_QPS_RTS && next == IBV_QPS_SQD) return rts_to_sqd();
  if (cur == IBV_QPS_SQD && next == IBV_QPS_SQD) return sqd_to_sqd();
  if (cur == IBV_QPS_SQE && next == IBV_QPS_RTS) return sqe_to_rts();
  return Row{{0, 0, 0}, {0, 0, 0}, false};
}

Kind kind_of(ibv_qp_type t) {
  switch (t) {
    case IBV_QPT_RC:
    case IBV_QPT_XRC_SEND:
    case IBV_QPT_XRC_RECV: return kRc;  // XRC follows RC, with the differences below
    case IBV_QPT_UC: return kUc;
    default: return kUd;
  }
}

}  // namespace

QpTransition qp_transition(ibv_qp_type type, ibv_qp_state cur, ibv_qp_state next) {
  if (int(cur) < 0 || int(cur) >= kStates || int(next) < 0 || int(next) >= kStates) return {false, 0, 0};
  Row r = rule(cur, next);
  Kind k = kind_of(type);
  QpTransition t{r.valid, r.req[k], r.opt[k]};
  // IBTA annex A14 (XRC), QP state table: an XRC initiator has no responder side, so
  // INIT->RTR does not need the responder's read/atomic depth or RNR timer;
  // an XRC target has no requester side, so RTR->RTS needs only the timeout
  // and the send PSN (rdma-core and the kernel take the same lists).
  if (type == IBV_QPT_XRC_SEND && cur == IBV_QPS_INIT && next == IBV_QPS_RTR) {
    constexpr uint32_t resp = IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
    t.required &= ~resp;
    t.optional |= resp;
  }
  if (type == IBV_QPT_XRC_RECV && cur == IBV_QPS_RTR && next == IBV_QPS_RTS) {
    constexpr uint32_t need = IBV_QP_TIMEOUT | IBV_QP_SQ_PSN;
    t.optional |= t.required & ~need;
    t.required = need;
  }
  return t;
}

int check_qp_transition(ibv_qp_type type, ibv_qp_state cur, ibv_qp_state next, uint32_t mask) {
  QpTransition t = qp_transition(type, cur, next);
  if (!t.valid) return EINVAL;
  uint32_t attrs = mask & ~uint32_t(IBV_QP_STATE);
  if ((attrs & t.required) != t.required) return EINVAL;
  if (attrs & ~(t.required | t.optional)) return EINVAL;
  return 0;
}

const char* qp_state_name(ibv_qp_state s) {
  static const char* const names[] = {"RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR"};
  return (int(s) >= 0 && int(s) < kStates) ? names[s] : "UNKNOWN";
}

}  // namespace sv
