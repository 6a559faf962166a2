// counters_query.h: asks a daemon for the device's counters (Op::Counters,
// common/counters.h) on a connected control socket: the port's sums and
// every QP's own, each page in turn.
#pragma once

#include <cerrno>
#include <cstdint>
#include <vector>

#include "common/counters.h"
#include "common/protocol.h"
#include "common/sys.h"

namespace sv::counters {

struct Snapshot {
  uint64_t port[kCount] = {};
  std::vector<proto::CounterEntry> qps;
};

// 0, or the errno of the exchange (EPROTO: a reply of the wrong size or
// counter count).
inline int query(int sock, uint32_t& seq, Snapshot& out, bool with_qps = true) {
  uint32_t after = 0;
  for (;;) {
    proto::CountersReq req{};
    proto::init_header(req, proto::Op::Counters, ++seq);
    req.after = after;
    proto::CountersReply rep{};
    std::vector<Fd> fds;
    size_t len = 0;
    if (int e = send_message(sock, &req, sizeof req, {})) return e;
    if (int e = recv_message(sock, &rep, sizeof rep, &len, fds)) return e;
    if (len != sizeof rep) return EPROTO;
    if (rep.h.status) return rep.h.status;
    if (rep.count > proto::kCounterPage || rep.ncounters != kCount) return EPROTO;
    for (uint32_t i = 0; i < kCount; ++i) out.port[i] = rep.port[i];
    if (!with_qps) return 0;
    for (uint32_t i = 0; i < rep.count; ++i) out.qps.push_back(rep.entries[i]);
    if (rep.count < proto::kCounterPage) return 0;
    after = rep.entries[rep.count - 1].qpn;
  }
}

}  // namespace sv::counters
