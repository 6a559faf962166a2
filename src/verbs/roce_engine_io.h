// roce_engine_io.h: the RoCEv2 engine (roce/engine.h) in the library's
// terms, for the wire path (roce_link.cc): its completions into the QP's CQ
// rings, its receives from the QP's ring or SRQ, its status, opcode and QP
// type as the verbs' values, and the fault hook a QP's plan gives it. Not
// an API; called with the hub lock held.
#pragma once
#include <infiniband/verbs.h>

#include <cstdint>
#include <functional>

#include "common/protocol.h"
#include "roce/engine.h"
#include "roce/udp.h"

namespace sv::verbs {

struct ProcessQp;
class XrcTargetSrqs;

// The engine's completions, into the QP's CQ rings as ibv_wc (an XRC
// target's receives: into their SRQs' CQs, `xrc`).
//
// `before_error`, if set, runs before a completion in error is pushed: the
// QP's owner makes its error state visible (ibv_query_qp) before the
// completion that tells the application about it can be polled.
class CqSink : public roce::CompletionSink {
 public:
  CqSink(ProcessQp& q, XrcTargetSrqs* xrc) : q_(q), xrc_(xrc) {}
  void complete(const roce::Completion& c) override;
  std::function<void()> before_error;

 private:
  ProcessQp& q_;
  XrcTargetSrqs* xrc_;
};

// Receive WQEs from the QP's ring or its SRQ, one when a message needs it:
// the ring is shared with the shared-memory path (a UD QP hears both) and
// an SRQ with other QPs.
class RingRecvSource : public roce::RecvSource {
 public:
  explicit RingRecvSource(ProcessQp& q) : q_(q) {}
  bool take(roce::RecvWr& out) override;

 private:
  ProcessQp& q_;
};

// The engine's completion status and opcode are ibv_wc's values (roce/engine.h).
// The requester's ibv_wr_opcode of a receive the engine completed (what
// core::receive_completion takes): WRITE with immediate, SEND with
// immediate or with Invalidate, or a SEND.
constexpr uint32_t sender_opcode(const roce::Completion& c) {
  if (c.opcode == roce::WcOpcode::kRecvWriteImm) return IBV_WR_RDMA_WRITE_WITH_IMM;
  if (c.has_imm) return IBV_WR_SEND_WITH_IMM;
  return c.has_inv ? IBV_WR_SEND_WITH_INV : IBV_WR_SEND;
}
constexpr ibv_wc_status to_status(roce::WcStatus s) { return ibv_wc_status(s); }
constexpr ibv_wc_opcode to_wc_opcode(roce::WcOpcode o) { return ibv_wc_opcode(o); }
// The engine's fault hook as the daemon's attach reply says it
// (SOFTVERBS_FAULTS), each QP its own sequence; the engine's QP type.
roce::FaultConfig faults_of(const proto::RoceAttachReply& rep, uint32_t qpn);
roce::QpType engine_type(ibv_qp_type t);

}  // namespace sv::verbs
