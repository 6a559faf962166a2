// roce_stats.cc: see roce_stats.h.
#include "verbs/roce_stats.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "common/sys.h"
#include "verbs/provider.h"

namespace sv::verbs {

using roce::QpStats;
using roce::UdpEndpointStats;

void print_roce_stats(uint32_t qpn, unsigned lane, const QpStats& s, const UdpEndpointStats& e1, const UdpEndpointStats* other) {
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
               "softverbs roce: qp %u: lane %u packets_sent %lu packets_received %lu retransmit_timeouts %lu "
               "seq_naks_sent %lu seq_naks_received %lu rnr_naks_sent %lu rnr_naks_received %lu "
               "duplicates %lu dropped %lu read_replays %lu atomic_replays %lu wrong_source %lu bad_icrc %lu "
               "nonzero_ipv4_id %lu "
               "fault_dropped %lu fault_delayed %lu fault_duplicated %lu fault_corrupted %lu port_down_sent %lu "
               "port_down_received %lu gso_sends %lu multicast_received %lu\n",
               qpn, lane, (unsigned long)s.packets_sent, (unsigned long)s.packets_received,
               (unsigned long)s.retransmit_timeouts, (unsigned long)s.seq_naks_sent,
               (unsigned long)s.seq_naks_received, (unsigned long)s.rnr_naks_sent,
               (unsigned long)s.rnr_naks_received, (unsigned long)s.duplicates, (unsigned long)s.dropped,
               (unsigned long)s.read_replays, (unsigned long)s.atomic_replays, (unsigned long)s.wrong_source,
               (unsigned long)e.bad_icrc,
               (unsigned long)e.nonzero_ipv4_id, (unsigned long)e.fault_dropped, (unsigned long)e.fault_delayed,
               (unsigned long)e.fault_duplicated, (unsigned long)e.fault_corrupted, (unsigned long)e.link_down_sent,
               (unsigned long)e.link_down_received, (unsigned long)e.gso_sends, (unsigned long)e.multicast);
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
