// UD multicast: ibv_attach_mcast/ibv_detach_mcast and the group lookup of
// the requester. The daemon owns the membership (QueuePairs::attach_mcast, daemon/qp.h) and
// publishes it in the device segment under a sequence lock per group, so a
// multicast send reads the members from shared memory, with no control
// round trip; only joining and leaving a group cost one.
//
// Thread safety: the verbs are thread-safe (one daemon call each);
// mcast_members reads the table lock-free and may be called from any thread.
#include <cerrno>
#include <cstring>

#include "common/mgid.h"
#include "verbs/provider.h"

namespace sv::verbs {

bool mcast_members(const ContextState& cs, const uint8_t* gid, uint16_t lid, std::vector<uint32_t>& out) {
  for (uint32_t i = 0; i < shm::kMcgTableSize; ++i) {
    const shm::McgEntry& g = cs.mcg_table[i];
    for (;;) {
      uint32_t s1 = g.seq.load(std::memory_order_acquire);
      if (s1 & 1) {
        __builtin_ia32_pause();
        continue;
      }
      uint32_t n = std::min(g.count, shm::kMcgMaxQps);
      bool match = n && (gid ? std::memcmp(g.gid, gid, 16) == 0 : g.lid == lid);
      uint32_t qpns[shm::kMcgMaxQps];
      if (match) std::memcpy(qpns, g.qpns, n * sizeof(uint32_t));
      // The copies above must complete before seq is read again. x86 does
      // not reorder loads with loads, so a compiler barrier is the acquire
      // fence here (TSan refuses std::atomic_thread_fence).
      asm volatile("" ::: "memory");
      if (g.seq.load(std::memory_order_relaxed) != s1) continue;  // rewritten meanwhile: read again
      if (!match) break;
      out.assign(qpns, qpns + n);
      return true;
    }
  }
  return false;
}

namespace {

int mcast_call(proto::Op op, ibv_qp* qp, const ibv_gid* gid, uint16_t lid) {
  if (!qp || !gid) return EINVAL;
  // ibv_attach_mcast(3): UD QPs only; a multicast GID (common/mgid.h).
  if (qp->qp_type != IBV_QPT_UD || !gid_is_multicast(gid->raw)) return EINVAL;
  ProcessQp& q = *to_qp(qp)->st;
  proto::McastReq req{};
  req.qpn = q.qpn;
  req.lid = lid;
  std::memcpy(req.gid, gid->raw, 16);
  proto::Empty rep{};
  DaemonConn& c = q.ctx->st->conn;
  return op == proto::Op::AttachMcast ? c.call<proto::Op::AttachMcast>(req, rep)
                                       : c.call<proto::Op::DetachMcast>(req, rep);
}

}  // namespace
}  // namespace sv::verbs

extern "C" {

int ibv_attach_mcast(ibv_qp* qp, const ibv_gid* gid, uint16_t lid) {
  return sv::verbs::mcast_call(sv::proto::Op::AttachMcast, qp, gid, lid);
}

int ibv_detach_mcast(ibv_qp* qp, const ibv_gid* gid, uint16_t lid) {
  return sv::verbs::mcast_call(sv::proto::Op::DetachMcast, qp, gid, lid);
}

}  // extern "C"
