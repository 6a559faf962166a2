// roce_util.h: helpers of the wire path (roce_link.cc): a RoCEv2 GID as an
// IP address, the path MTU its netdev carries, the engine's completions
// into the QP's CQs and its receives from the QP's ring or SRQ, and the
// SOFTVERBS_ROCE_STATS line. Not an API; called with the hub lock held.
#pragma once
#include <infiniband/verbs.h>

#include <cstdint>
#include <functional>
#include <string>

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

// "a.b.c.d" for an IPv4-mapped GID (RoCEv2, IBTA annex A17.4.5.1), else the IPv6 text.
std::string gid_to_ip(const uint8_t* g);
// The largest IB MTU whose packets (IP, UDP, BTH, the longest extension
// headers, ICRC) fit the netdev that holds `sgid`: never IP-fragment.
uint32_t wire_mtu_for(const uint8_t* sgid);

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

// One line on stderr with a wire QP's engine and endpoint counters (`other`:
// a UD QP's endpoint of the other address family, or null; its counters
// are added).
void print_roce_stats(uint32_t qpn, const roce::QpStats& s, const roce::UdpEndpointStats& e,
                      const roce::UdpEndpointStats* other);

// Copies a wire QP's engine counters into its segment's `wire` counts
// (shm::WireCounter, rxe's names), where the daemon reads them for `rdma
// statistic show`. Those the engine does not count stay 0.
void publish_wire_counters(shm::QpSegmentHeader& h, const roce::QpStats& s);

}  // namespace sv::verbs
