// roce_stats.h: a wire QP's counters, said on stderr (SOFTVERBS_ROCE_STATS)
// and published into its segment for `rdma statistic show`.
#pragma once

#include <cstdint>

#include "common/shm_layout.h"
#include "roce/engine.h"
#include "roce/udp.h"

namespace sv::verbs {

// One line on stderr with a wire QP's engine and endpoint counters (`other`:
// a UD QP's endpoint of the other address family, or null; its counters
// are added; `lane`: the RoCE thread that served it, roce_link.cc).
void print_roce_stats(uint32_t qpn, unsigned lane, const roce::QpStats& s, const roce::UdpEndpointStats& e,
                      const roce::UdpEndpointStats* other);

// Copies a wire QP's engine counters into its segment's `wire` counts
// (shm::WireCounter, rxe's names), where the daemon reads them for `rdma
// statistic show`. Those the engine does not count stay 0.
void publish_wire_counters(shm::QpSegmentHeader& h, const roce::QpStats& s);

}  // namespace sv::verbs
