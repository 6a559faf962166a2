// counters.cc: the device's counters (common/counters.h, docs/LAB.md), per
// QP and summed per port, for `rdma statistic show` (Op::WireCounters,
// Op::Counters; src/nldev/), the sysfs view's hw_counters and `softverbs
// status`. Like the objects of resources.cc, a caller sees its own user's
// QPs' counts only (root: every user's): most of them come from the QP
// segment, which the QP's own user's processes write, so whatever they
// wrote there is shown to that user alone. The counts between users are the
// daemon's own (count_mediated).
#include <algorithm>
#include <cerrno>
#include <iterator>

#include "common/counters.h"
#include "common/opcode_rules.h"
#include "common/shm_layout.h"
#include "daemon/registry.h"

namespace sv::daemon {

namespace {

// The QP's segment header, if it has one of the full size.
const shm::QpSegmentHeader* header_of(const Mapping& m) {
  if (!m.get() || m.size() < sizeof(shm::QpSegmentHeader)) return nullptr;
  return m.as<shm::QpSegmentHeader>();
}

}  // namespace

void Registry::qp_counters(const Qp& q, counters::Values& out) const {
  counters::add_qp(header_of(q.map), q.med_counts, out);
}

void Registry::retire_counters(const Qp& q) {
  counters::Values v{};
  qp_counters(q, v);
  auto& total = retired_counters_[q.uid];
  for (uint32_t i = 0; i < counters::kCount; ++i) total[i] += v[i];
}

// The sums wrap: the counts come from memory the QP's processes write, and
// only their own user sees what they add up to.
void Registry::port_counters(uid_t me, counters::Values& out) const {
  for (const auto& [uid, total] : retired_counters_) {
    if (me != 0 && uid != me) continue;
    for (uint32_t i = 0; i < counters::kCount; ++i) out[i] += total[i];
  }
  if (me == 0) {
    for (const auto& [qpn, q] : qp_.table()) qp_counters(q, out);
    return;
  }
  // Another user's: its own contexts' QPs, by the owner index.
  for (uint32_t c : contexts_of_user(me))
    for (uint32_t qpn : qp_.table().of(c)) qp_counters(qp_.table().find(qpn)->second, out);
}

void Registry::wire_counters(uint32_t client, proto::WireCountersReply& rep) const {
  static_assert(shm::kWireCounterCount <= std::size(proto::WireCountersReply{}.values));
  rep.count = shm::kWireCounterCount;
  const uid_t me = client_uid(client);
  if (me == uid_t(-1)) return;
  counters::Values v{};
  port_counters(me, v);
  std::copy_n(v, shm::kWireCounterCount, rep.values);
}

int Registry::counters_page(uint32_t client, const proto::CountersReq& req, proto::CountersReply& rep) const {
  static_assert(counters::kCount <= proto::kCounterSlots);
  rep.count = 0;
  rep.ncounters = counters::kCount;
  const uid_t me = client_uid(client);
  if (me == uid_t(-1)) return EINVAL;
  counters::Values v{};
  port_counters(me, v);
  std::copy_n(v, counters::kCount, rep.port);
  // The page: root's from the whole table; another user's merged from its
  // own contexts' QPs, in QPN order.
  std::vector<uint32_t> ids;
  if (me == 0) {
    for (auto it = qp_.table().upper_bound(req.after); it != qp_.table().end() && ids.size() < proto::kCounterPage; ++it)
      ids.push_back(it->first);
  } else {
    for (uint32_t c : contexts_of_user(me)) {
      const std::vector<uint32_t> more = qp_.table().of_after(c, req.after, proto::kCounterPage);
      ids.insert(ids.end(), more.begin(), more.end());
    }
    std::sort(ids.begin(), ids.end());
    if (ids.size() > proto::kCounterPage) ids.resize(proto::kCounterPage);
  }
  for (uint32_t qpn : ids) {
    auto it = qp_.table().find(qpn);
    if (it == qp_.table().end()) continue;
    proto::CounterEntry& e = rep.entries[rep.count++];
    e.qpn = qpn;
    e.context = it->second.owner;
    e.uid = uint32_t(context_uid(it->second.owner));
    e.pid = context_pid(it->second.owner);
    counters::Values qv{};
    qp_counters(it->second, qv);
    std::copy_n(qv, counters::kCount, e.values);
  }
  return 0;
}

// Counted from the daemon's own outcome: a request carried out (its kind's
// counts, at the requester and at the QP its destination names, as
// counting.h counts them on the shared-memory path) or failed (a flush
// never ran; one that comes back to be retried is counted when it ends).
void Registry::count_mediated(uint32_t qpn, uint32_t opcode, const proto::MediateReply& rep) {
  using namespace counters;
  auto q = qp_.table().find(qpn);
  if (q == qp_.table().end()) return;
  uint64_t* me = q->second.med_counts;
  if (rep.outcome == proto::kMediateError) {
    if (rep.wc_status != IBV_WC_WR_FLUSH_ERR) ++me[kMedErrors];
    return;
  }
  if (rep.outcome != proto::kMediateDone) return;
  const rules::OpcodeRule& r = rules::rule_of(opcode);
  const uint64_t len = rep.byte_len;
  ++me[kMedOps];
  auto peer = qp_.table().find(qp_.slot(qpn).dest_qpn.load(std::memory_order_relaxed));
  uint64_t unused[kMedCount] = {};
  uint64_t* them = peer != qp_.table().end() ? peer->second.med_counts : unused;
  switch (r.kind) {
    case rules::WrKind::kSend:
      ++me[kMedSends];
      [[fallthrough]];
    case rules::WrKind::kWrite:
      me[kMedSentBytes] += len;
      them[kMedRcvdBytes] += len;
      if (r.flags & rules::kWrRecv) ++them[kMedRecvs];
      break;
    case rules::WrKind::kRead:
      me[kMedReadBytes] += len;
      them[kMedServedBytes] += len;
      break;
    default:
      break;
  }
}

}  // namespace sv::daemon
