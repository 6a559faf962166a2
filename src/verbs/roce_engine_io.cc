// roce_engine_io.cc: see roce_engine_io.h.
#include "verbs/roce_engine_io.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "common/responder_core.h"
#include "common/sys.h"
#include "roce/headers.h"
#include "verbs/fault_events.h"
#include "verbs/provider.h"
#include "verbs/roce_xrc.h"

namespace sv::verbs {

using roce::WcOpcode;
using roce::WcStatus;

void CqSink::complete(const roce::Completion& c) {
  if (c.status != roce::WcStatus::kSuccess && before_error) before_error();
  // An XRC target's receives complete in the CQ of the SRQ they came from.
  if (c.is_recv && q_.type == IBV_QPT_XRC_RECV) {
    xrc_->complete(c, to_status(c.status));
    return;
  }
  ibv_wc wc{};
  if (c.is_recv) {
    // The immediate back to the wire's bytes, as ibv_wc has them.
    wc = core::receive_completion(c.wr_id, to_status(c.status), sender_opcode(c), c.byte_len, q_.qpn, c.src_qp,
                                  htonl(c.imm), c.invalidated_rkey);
    if (c.grh) wc.wc_flags |= IBV_WC_GRH;
  } else {
    wc.wr_id = c.wr_id;
    wc.status = to_status(c.status);
    wc.opcode = to_wc_opcode(c.opcode);
    wc.qp_num = q_.qpn;
    wc.byte_len = c.byte_len;
  }
  Cq* cq = c.is_recv ? q_.recv_cq : q_.send_cq;
  cq->st->view.push(wc, c.is_recv);
}

bool RingRecvSource::take(roce::RecvWr& out) {
  shm::RecvWqe w;
  if (q_.srq) {
    SrqState& st = *q_.srq->st;
    SrqSegment* s = &st.now();
    while (!shm::take_srq_receive(s->hdr, [&] { return s->ring.pop(w); })) {
      if (!s->hdr->moved.load(std::memory_order_acquire) || !follow_srq(st, s)) return false;
      s = &st.now();  // resized: its receives are in the new segment
    }
    uint32_t limit = s->hdr->limit.load(std::memory_order_relaxed);
    if (limit && s->ring.size() < limit && s->hdr->limit.exchange(0) != 0) {
      // Below the armed limit: IBV_EVENT_SRQ_LIMIT_REACHED to its holders.
      proto::HandleReq req{};
      req.handle = st.handle;
      proto::Empty rep{};
      q_.ctx->st->conn.call<proto::Op::SrqLimit>(req, rep);
    }
  } else if (!q_.rq.pop(w)) {
    return false;
  }
  out.wr_id = w.wr_id;
  out.sg.clear();
  for (uint32_t i = 0; i < w.num_sge && i < shm::kMaxSge; ++i)
    out.sg.push_back({w.sge[i].addr, w.sge[i].length, w.sge[i].lkey});
  return true;
}

namespace {

// One line of the fault log (SOFTVERBS_FAULTS_LOG) per datagram the fault
// hook changed: the BTH's destination QP, PSN and opcode (IBTA 9.2), what
// was done to it.
void log_wire_fault(const roce::FaultDecision& d, std::span<const uint8_t> p) {
  if (p.size() < 12) return;
  const unsigned dqp = unsigned(p[5]) << 16 | unsigned(p[6]) << 8 | p[7];
  const unsigned psn = unsigned(p[9]) << 16 | unsigned(p[10]) << 8 | p[11];
  char what[64];
  if (d.copies == 0) std::snprintf(what, sizeof what, "drop");
  else if (d.copies == 2) std::snprintf(what, sizeof what, "dup delay_us=%llu,%llu", (unsigned long long)d.delay_ns[0] / 1000, (unsigned long long)d.delay_ns[1] / 1000);
  else std::snprintf(what, sizeof what, "delay_us=%llu", (unsigned long long)d.delay_ns[0] / 1000);
  char line[160];
  int n = std::snprintf(line, sizeof line, "wire dqp=0x%x psn=%u opcode=0x%02x %s%s\n", dqp, psn, unsigned(p[0]), what,
                        d.corrupt ? " corrupt" : "");
  if (n > 0) fault_log_line(line, size_t(std::min(n, int(sizeof line) - 1)));
}

}  // namespace

// The wire faults of this process's own plan for the QP (SOFTVERBS_FAULTS
// or SOFTVERBS_FAULT_PLAN in its environment) where it has a wire rule,
// else those the daemon's plan says; each QP its own sequence.
roce::FaultConfig faults_of(const proto::RoceAttachReply& rep, uint32_t qpn) {
  roce::FaultConfig f;
  if (const faults::WireRule* r = faults::wire_for(process_plan(), qpn)) {
    f.drop = r->drop;
    f.duplicate = r->dup;
    f.reorder = r->reorder;
    f.corrupt = r->corrupt;
    f.reorder_delay_ns = uint64_t(r->delay_us) * 1000;
    f.seed = process_plan().seed ^ (uint64_t(qpn) << 32);
  } else {
    f.drop = rep.drop_ppm / 1e6;
    f.duplicate = rep.dup_ppm / 1e6;
    f.reorder = rep.reorder_ppm / 1e6;
    f.reorder_delay_ns = uint64_t(rep.reorder_delay_us) * 1000;
    f.corrupt = rep.corrupt_ppm / 1e6;
    f.seed = rep.seed ^ (uint64_t(qpn) << 32);
  }
  if (fault_log_open()) f.log = log_wire_fault;
  f.link_down = planned_port_flag();  // the plan's port rules take the link down too
  return f;
}

roce::QpType engine_type(ibv_qp_type t) {
  switch (t) {
    case IBV_QPT_UC: return roce::QpType::kUC;
    case IBV_QPT_UD: return roce::QpType::kUD;
    case IBV_QPT_XRC_SEND: return roce::QpType::kXrcSend;
    case IBV_QPT_XRC_RECV: return roce::QpType::kXrcRecv;
    default: return roce::QpType::kRC;
  }
}

}  // namespace sv::verbs
