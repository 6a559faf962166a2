// fault_ops.h: completions in error from the process's fault plan
// (common/fault_plan.h, docs/LAB.md "Faults"). A QP that a wc rule names
// gets planned operations when its path is chosen (choose_transport): every
// request takes the general path, and before each one is carried out the
// plan decides whether it fails instead, with the status the rule names.
// On the wire the plan decides as the request is handed to the RoCE engine,
// which fails it in its turn (roce::SendWr::fails_with).
// The requester then fails it as it would a real such error (fail(): the
// completion in error, the QP to ERR, later requests flushed; IBTA 10.8.3).
// A delay rule holds the request at the head of the send queue for its
// time (Step::kWait) before it is carried out; an rnr rule makes the
// responder refuse it with RNR NAKs (Step::kRnr), which the requester
// retries as any (IBTA 9.7.5.2.8: rnr_retry, the peer's min_rnr_timer).
// Neither applies on the wire yet.
// A QP the plan does not name keeps its own operations: it pays nothing.
//
// Each injected fault is one line of SOFTVERBS_FAULTS_LOG (appended).
#pragma once

#include <infiniband/verbs.h>

#include <atomic>
#include <cstdio>
#include <cstdint>
#include <string>
#include <vector>

#include "common/fault_plan.h"

namespace sv::verbs {

struct ProcessQp;
struct QpOps;

using PostFn = int (*)(ProcessQp&, ibv_send_wr*, ibv_send_wr**, bool);

// What a QP with completion faults keeps (ProcessQp::faults), guarded by
// the send lock.
struct QpFaults {
  std::atomic<const QpOps*> base{nullptr};  // the operations of its path (chosen again on reconnection)
  PostFn slow_post = nullptr;   // that path's post without its fast path
  std::vector<faults::WcRule> rules;
  bool events = false;  // the plan's port or QP fatal rules look at its requests (fault_events.h)
  std::vector<faults::RnrRule> rnr;
  uint64_t ops = 0;  // requests carried out so far (the first is op 1)
  faults::Rng rng{0};
  // The head request's plan: carried out no earlier than delay_until (ns,
  // monotonic; 0: no delay), after rnr_refusals more RNR NAKs.
  uint64_t delay_until = 0;
  uint32_t rnr_refusals = 0;
};

// The process's plan (read once from its environment), and why it is
// refused ("" when it is not): a context is not opened with a bad plan.
const faults::Plan& process_plan();
const std::string& process_plan_error();

// Whether SOFTVERBS_FAULTS_LOG is open, and one line (with its newline)
// appended to it in one write.
bool fault_log_open();
void fault_log_line(const char* line, size_t n);
// One line, printf-formatted (at most 199 bytes), appended the same way.
template <class... A>
void fault_logf(const char* fmt, A... args) {
  if (!fault_log_open()) return;
  char line[200];
  const int n = std::snprintf(line, sizeof line, fmt, args...);
  if (n > 0) fault_log_line(line, size_t(n < int(sizeof line) ? n : int(sizeof line) - 1));
}

// A send opcode's name for the log ("OTHER" for one it does not name).
const char* fault_opcode_name(uint32_t opcode);

// The operations `q` takes: `ops`, or the planned ones wrapping it when the
// plan names a completion fault for q and the path is shared memory or
// mediated (`slow_post`: that path's post without its fast path); also
// when the plan's port or QP fatal rules apply to q (fault_events.h).
const QpOps* planned_ops(ProcessQp& q, const QpOps* ops, PostFn slow_post);

// On the wire (a QP with q.faults): whether the plan fails the next request,
// wr, and with which status (IBV_WC_SUCCESS: it does not). Counts it.
ibv_wc_status wire_fault(ProcessQp& q, const ibv_send_wr& wr);

}  // namespace sv::verbs
