// qp_state.h: the QP state machine of IBTA vol. 1, section 10.3.1 (figure
// "QP/EE state diagram"), with the required and optional attributes of each
// ibv_modify_qp transition (section 11.2.4.2, "Modify Queue Pair").
//
// Contract: pure functions, thread-safe.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>

namespace sv {

struct QpTransition {
  bool valid;
  uint32_t required;  // IBV_QP_* bits that must be present (besides IBV_QP_STATE)
  uint32_t optional;  // IBV_QP_* bits that may be present
};

// The rule for cur -> next on a QP of the given type (RC, UC, UD).
QpTransition qp_transition(ibv_qp_type type, ibv_qp_state cur, ibv_qp_state next);

// 0 if `mask` is acceptable for the transition, else EINVAL.
int check_qp_transition(ibv_qp_type type, ibv_qp_state cur, ibv_qp_state next, uint32_t mask);

const char* qp_state_name(ibv_qp_state s);

}  // namespace sv
