#include "verbs/roce_util.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
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

using roce::kBthLen;
using roce::kIcrcLen;
using roce::QpStats;
using roce::UdpEndpointStats;
using roce::WcOpcode;
using roce::WcStatus;

std::string gid_to_ip(const uint8_t* g) {
  static const uint8_t mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  char buf[INET6_ADDRSTRLEN] = {};
  if (std::memcmp(g, mapped, 12) == 0) inet_ntop(AF_INET, g + 12, buf, sizeof buf);
  else inet_ntop(AF_INET6, g, buf, sizeof buf);
  return buf;
}

uint32_t wire_mtu_for(const uint8_t* sgid) {
  const bool v4 = gid_to_ip(sgid).find(':') == std::string::npos;
  uint32_t ifmtu = 1500;
  ifaddrs* ifs = nullptr;
  if (::getifaddrs(&ifs) == 0) {
    for (ifaddrs* i = ifs; i; i = i->ifa_next) {
      if (!i->ifa_addr) continue;
      const void* a = nullptr;
      if (v4 && i->ifa_addr->sa_family == AF_INET) a = &reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr;
      if (!v4 && i->ifa_addr->sa_family == AF_INET6) a = &reinterpret_cast<sockaddr_in6*>(i->ifa_addr)->sin6_addr;
      if (!a || std::memcmp(a, v4 ? sgid + 12 : sgid, v4 ? 4 : 16) != 0) continue;
      int s = sv::kernel_socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
      ifreq r{};
      std::strncpy(r.ifr_name, i->ifa_name, IFNAMSIZ - 1);
      if (s >= 0 && ::ioctl(s, SIOCGIFMTU, &r) == 0) ifmtu = uint32_t(r.ifr_mtu);
      if (s >= 0) ::close(s);
      break;
    }
    ::freeifaddrs(ifs);
  }
  const uint32_t overhead = (v4 ? 20 : 40) + 8 + kBthLen + 28 + kIcrcLen;
  uint32_t mtu = 4096;
  while (mtu > 256 && mtu + overhead > ifmtu) mtu /= 2;
  return mtu;
}

void print_roce_stats(uint32_t qpn, const QpStats& s, const UdpEndpointStats& e1, const UdpEndpointStats* other) {
  UdpEndpointStats e = e1;
  if (other) {
    e.bad_icrc += other->bad_icrc;
    e.nonzero_ipv4_id += other->nonzero_ipv4_id;
    e.fault_dropped += other->fault_dropped;
    e.fault_delayed += other->fault_delayed;
    e.fault_duplicated += other->fault_duplicated;
    e.fault_corrupted += other->fault_corrupted;
    e.gso_sends += other->gso_sends;
    e.multicast += other->multicast;
    e.link_down_sent += other->link_down_sent;
    e.link_down_received += other->link_down_received;
  }
  std::fprintf(stderr,
               "softverbs roce: qp %u: packets_sent %lu packets_received %lu retransmit_timeouts %lu "
               "seq_naks_sent %lu seq_naks_received %lu rnr_naks_sent %lu rnr_naks_received %lu "
               "duplicates %lu dropped %lu read_replays %lu atomic_replays %lu wrong_source %lu bad_icrc %lu "
               "nonzero_ipv4_id %lu "
               "fault_dropped %lu fault_delayed %lu fault_duplicated %lu fault_corrupted %lu port_down_sent %lu "
               "port_down_received %lu gso_sends %lu multicast_received %lu\n",
               qpn, (unsigned long)s.packets_sent, (unsigned long)s.packets_received,
               (unsigned long)s.retransmit_timeouts, (unsigned long)s.seq_naks_sent,
               (unsigned long)s.seq_naks_received, (unsigned long)s.rnr_naks_sent,
               (unsigned long)s.rnr_naks_received, (unsigned long)s.duplicates, (unsigned long)s.dropped,
               (unsigned long)s.read_replays, (unsigned long)s.atomic_replays, (unsigned long)s.wrong_source,
               (unsigned long)e.bad_icrc,
               (unsigned long)e.nonzero_ipv4_id, (unsigned long)e.fault_dropped, (unsigned long)e.fault_delayed,
               (unsigned long)e.fault_duplicated, (unsigned long)e.fault_corrupted, (unsigned long)e.link_down_sent,
               (unsigned long)e.link_down_received, (unsigned long)e.gso_sends, (unsigned long)e.multicast);
}

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

void publish_wire_counters(shm::QpSegmentHeader& h, const QpStats& s) {
  // As rxe counts: packets out and in, requests seen twice (duplicate) or
  // out of order (a sequence NAK sent), RNR NAKs received and sent,
  // sequence NAKs received, the completer's retransmissions, and the
  // SENDs and receives completed in success.
  const std::pair<shm::WireCounter, uint64_t> counts[] = {
      {shm::kWireSentPkts, s.packets_sent},          {shm::kWireRcvdPkts, s.packets_received},
      {shm::kWireDuplicateRequest, s.duplicates},    {shm::kWireOutOfSeqRequest, s.seq_naks_sent},
      {shm::kWireRcvdRnrErr, s.rnr_naks_received},   {shm::kWireSendRnrErr, s.rnr_naks_sent},
      {shm::kWireRcvdSeqErr, s.seq_naks_received},   {shm::kWireCompleterRetryErr, s.retransmit_timeouts},
      {shm::kWireRdmaSends, s.sends_completed},       {shm::kWireRdmaRecvs, s.recvs_completed}};
  for (const auto& [i, v] : counts) {
    if (h.wire[i].load(std::memory_order_relaxed) != v) h.wire[i].store(v, std::memory_order_relaxed);
  }
}

}  // namespace sv::verbs
