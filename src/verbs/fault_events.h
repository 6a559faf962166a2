// fault_events.h: the asynchronous events of the process's fault plan
// (common/fault_plan.h: port, qp_fatal, cq_err, srq_limit, device_fatal;
// docs/LAB.md "Port down and other async events"), raised by this library in
// this process only, as a NIC raises them (ibv_get_async_event(3)):
//
//   port          the port goes DOWN for down_ms: ibv_query_port says
//                 IBV_PORT_DOWN, every context of the process gets
//                 IBV_EVENT_PORT_ERR, then IBV_EVENT_PORT_ACTIVE when it is
//                 up again. A reliable QP (RC, XRC) whose request is carried
//                 out while it is down fails it with IBV_WC_RETRY_EXC_ERR (no
//                 acknowledgement comes back: its transport retries run out,
//                 ibv_poll_cq(3)) and goes to ERR, its later requests flushed; an
//                 unreliable one's message is lost (completes successfully).
//                 rdma_cm address resolution fails while it is down (rdmacm).
//   qp_fatal      the QP's N-th send request is not carried out: the QP goes
//                 to ERR (that request and the later ones flushed, the
//                 receives too) and IBV_EVENT_QP_FATAL names it (the
//                 "local work queue catastrophic error" of ibv_get_async_event(3)).
//   cq_err        IBV_EVENT_CQ_ERR on the process's N-th CQ, its QPs to ERR,
//                 as after an overrun (IBTA 11.4.2.1; the daemon does both).
//   srq_limit     IBV_EVENT_SRQ_LIMIT_REACHED on the process's N-th SRQ if its
//                 limit is armed, which disarms it (IBTA 11.5.2.4).
//   device_fatal  each context's daemon connection is shut down: the
//                 context's watchdog raises IBV_EVENT_DEVICE_FATAL and later
//                 verbs fail as after the device is gone.
//
// Times count from when the plan is read (the process's first context).
// Each event is one line of SOFTVERBS_FAULTS_LOG. Without such clauses
// nothing here runs: no thread, and QPs keep their own operations.
#pragma once

#include <atomic>
#include <cstdint>

#include "common/fault_plan.h"

namespace sv::verbs {

struct ContextState;
struct ProcessQp;
struct Outcome;

// A context opened or closed (no-ops unless the plan raises events).
void events_attach(ContextState& st);
void events_detach(ContextState& st);

// Whether the plan has the port down now.
bool planned_port_down();

// The port's state as a flag that a RoCEv2 endpoint looks at (true: down;
// roce::FaultConfig::link_down), or nullptr when the plan has no port rule.
const std::atomic<bool>* planned_port_flag();

// The ordinal of a CQ or SRQ the process creates (1, 2, ...), for cq_err
// and srq_limit; 0 when the plan names none.
uint32_t planned_ordinal(faults::Timed kind);

// Before a planned QP carries out its send request number `qp_op` (its
// QpFaults count) of opcode `opcode` and work request `wr_id`: true, with
// the outcome in `out`, when an event of the plan fails it instead.
bool event_fault(ProcessQp& q, uint64_t qp_op, uint32_t opcode, uint64_t wr_id, Outcome& out);

}  // namespace sv::verbs
