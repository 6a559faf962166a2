// Operations between users (the system daemon): a requester may not map a
// peer's memory when the peer belongs to another user, because a backing
// memfd maps its holder's whole address space, more than any key grants.
// For such a connection the library sends each work request here and the
// daemon carries it out between the two backings with pread/pwrite (and an
// atomic on a one-page mapping for atomics), after the same checks the
// library makes on one user's path: the requester's L_Keys in its PD
// (IBTA 10.6.7.1), the responder's R_Key, PD, bounds and access rights
// (IBTA 10.6.7.2), the QP's remote access flags, 8-byte alignment of
// atomics (IBTA 9.4.5). Slower (a round trip per operation), but no process
// ever holds a descriptor of another user's memory.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "common/completion.h"
#include "daemon/registry.h"

namespace sv::daemon {

using namespace shm;

namespace {

constexpr uint32_t kKindBitMr = 1u << kKindMr, kKindBitMw1 = 1u << kKindMw1, kKindBitMw2 = 1u << kKindMw2;
constexpr uint64_t kMaxMediated = 1ull << 31;
// Copies from this size on leave the control loop (a copy of less costs
// about as much as the hand-over).
constexpr uint64_t kOffloadBytes = 64 << 10;

bool pread_all(int fd, uint8_t* p, uint64_t len, uint64_t off) {
  while (len) {
    ssize_t n = ::pread(fd, p, len, off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    len -= uint64_t(n);
    off += uint64_t(n);
  }
  return true;
}

bool pwrite_all(int fd, const uint8_t* p, uint64_t len, uint64_t off) {
  while (len) {
    ssize_t n = ::pwrite(fd, p, len, off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    len -= uint64_t(n);
    off += uint64_t(n);
  }
  return true;
}

}  // namespace

// ---- Copies off the control loop (issue 18, finding 8) -------------------
// A large mediated copy runs on the server's copy worker, a piece at a time;
// this is that job's state. Its spans hold duplicates of the backings'
// descriptors, so a deregistration meanwhile cannot pull the file away.
bool MediationJob::step(uint64_t max_bytes) {
  if (failed || left == 0) return false;
  uint64_t budget = max_bytes;
  if (!inline_data.empty()) {
    // The inline payload (at most kMaxInline bytes): at once.
    uint64_t off = 0;
    for (const OwnedSpan& d : dst) {
      uint64_t n = std::min(d.len, total - off);
      if (n && !pwrite_all(d.fd.get(), inline_data.data() + off, n, d.off)) {
        failed = true;
        return false;
      }
      off += n;
    }
    left = 0;
    return false;
  }
  buf.resize(std::min<uint64_t>(total, 1 << 16));
  while (left && budget) {
    const OwnedSpan& d = dst[di];
    const OwnedSpan& sr = src[si];
    uint64_t n = std::min({left, budget, uint64_t(buf.size()), d.len - doff, sr.len - soff});
    if (!pread_all(sr.fd.get(), buf.data(), n, sr.off + soff) || !pwrite_all(d.fd.get(), buf.data(), n, d.off + doff)) {
      failed = true;
      return false;
    }
    left -= n;
    budget -= n;
    if ((doff += n) == d.len) ++di, doff = 0;
    if ((soff += n) == sr.len) ++si, soff = 0;
  }
  return left != 0;
}

bool Registry::resolve_key(uint32_t key, uint32_t pd, uint64_t addr, uint64_t len, uint32_t need, uint32_t kinds,
                           uint32_t bound_qpn, Span& out) const {
  const MrEntry* e = mr_entry(key);
  if (!e || e->pd != pd || !(kinds & (1u << e->kind))) return false;
  if ((e->access & need) != need) return false;
  if (e->kind == kKindMw2 && e->bound_qpn != bound_qpn) return false;
  if (addr < e->iova || addr - e->iova > e->length || e->length - (addr - e->iova) < len) return false;
  auto b = backings_.find(e->backing);
  if (b == backings_.end()) return false;
  out = Span{b->second.fd.get(), e->file_offset + (addr - e->iova), len};
  return true;
}

bool Registry::pop_recv(Qp& peer, uint32_t, RecvWqe& out) {
  // The rings are located by the capacities recorded when they were made,
  // not by the segment header's offsets, which the peer's process can write.
  if (peer.srq) {
    auto s = srqs_.find(peer.srq);
    if (s == srqs_.end()) return false;
    const uint32_t cap = s->second.capacity;
    auto* rh = reinterpret_cast<RingHeader*>(s->second.map.as<char>() + SrqLayout{cap}.ring_offset());
    Ring<RecvWqe> ring(rh, reinterpret_cast<RingSlot<RecvWqe>*>(rh + 1), cap);
    if (!ring.pop(out)) return false;
    // The SRQ fell below its armed limit: the event, once per arm (IBTA
    // 10.2.9.4, 11.5.2.4), as the library raises it on one user's path.
    auto* sh = s->second.map.as<SrqSegmentHeader>();
    const uint32_t limit = sh->limit.load(std::memory_order_relaxed);
    if (limit && ring.size() < limit && sh->limit.exchange(0) != 0) {
      for (auto& [id, c] : clients_)
        if (c.ctx == s->second.owner) events_.push_back({id, IBV_EVENT_SRQ_LIMIT_REACHED, peer.srq});
    }
    return true;
  }
  const QpLayout layout{peer.sq_capacity, peer.rq_capacity};
  auto* rqh = reinterpret_cast<RingHeader*>(peer.map.as<char>() + layout.rq_offset());
  Ring<RecvWqe> rq(rqh, reinterpret_cast<RingSlot<RecvWqe>*>(rqh + 1), layout.rq_capacity);
  return rq.pop(out);
}

void Registry::push_recv(Qp& peer, uint32_t, const ibv_wc& wc, bool solicited) {
  push_cq(peer.recv_cq, wc, solicited);  // follows a CQ that a resize moved
}

// The QP's own posted receives complete with flush errors (IBTA 10.3.1);
// an SRQ's receives belong to its other QPs too and stay.
void Registry::flush_rq(Qp& q, uint32_t qpn) {
  RecvWqe w{};
  while (!q.srq && pop_recv(q, qpn, w)) {
    ibv_wc wc{};
    wc.wr_id = w.wr_id;
    wc.status = IBV_WC_WR_FLUSH_ERR;
    wc.opcode = IBV_WC_RECV;
    wc.qp_num = qpn;
    push_cq(q.recv_cq, wc, true);
  }
}

int Registry::mediate(uint32_t client, const proto::MediateReq& req, proto::MediateReply& rep,
                      std::unique_ptr<MediationJob>* defer) {
  Qp* me = find_qp(client, req.qpn);
  if (!me || (me->type != IBV_QPT_RC && me->type != IBV_QPT_UC)) return EINVAL;
  if (req.num_sge > kMaxSge || req.inline_len > kMaxInline) return EINVAL;
  auto done = [&](proto::MediateOutcome o, ibv_wc_status st = IBV_WC_SUCCESS, bool peer_err = false,
                  uint64_t len = 0) {
    rep.outcome = o;
    rep.wc_status = st;
    rep.peer_error = peer_err;
    rep.byte_len = uint32_t(len);
    return 0;
  };

  uint32_t dest = qp_slot(req.qpn).dest_qpn.load();
  auto pit = qps_.find(dest);
  if (pit == qps_.end()) return done(proto::kMediateRetry);
  Qp& peer = pit->second;
  QpEntry& pe = qp_slot(dest);
  auto pst = ibv_qp_state(pe.state.load());
  if ((pst != IBV_QPS_RTR && pst != IBV_QPS_RTS && pst != IBV_QPS_SQD && pst != IBV_QPS_SQE) ||
      pe.dest_qpn.load() != req.qpn || peer.type != me->type)
    return done(proto::kMediateRetry);
  // The responder found the error: an RC responder goes to ERR (IBTA 9.9.3.1.2).
  auto responder_error = [&](ibv_wc_status requester_status) {
    if (me->type == IBV_QPT_RC) {
      pe.state.store(IBV_QPS_ERR, std::memory_order_release);
      flush_rq(peer, dest);
    }
    return done(proto::kMediateError, requester_status, true);
  };

  // The local side: the requester's own MRs (or the inline payload).
  const bool writes_local = req.opcode == IBV_WR_RDMA_READ || req.opcode == IBV_WR_ATOMIC_CMP_AND_SWP ||
                            req.opcode == IBV_WR_ATOMIC_FETCH_AND_ADD;
  const bool is_inline = (req.send_flags & IBV_SEND_INLINE) && !writes_local;
  std::vector<Span> local;
  uint64_t total = 0;
  if (is_inline) {
    total = req.inline_len;
  } else {
    for (uint32_t i = 0; i < req.num_sge; ++i) {
      const Sge& s = req.sge[i];
      if (s.length == 0) continue;
      Span sp{};
      if (!resolve_key(s.lkey, me->pd, s.addr, s.length, writes_local ? IBV_ACCESS_LOCAL_WRITE : 0, kKindBitMr, 0,
                       sp))
        return done(proto::kMediateError, IBV_WC_LOC_PROT_ERR);
      local.push_back(sp);
      total += s.length;
    }
  }
  if (total > kMaxMediated) return done(proto::kMediateError, IBV_WC_LOC_LEN_ERR);

  // Copies `total` bytes from one list to the other through a bounce buffer.
  auto copy = [&](const std::vector<Span>& dst, const std::vector<Span>& src) {
    std::vector<uint8_t> buf(std::min<uint64_t>(total, 1 << 16));
    size_t di = 0, si = 0;
    uint64_t doff = 0, soff = 0, left = total;
    while (left) {
      uint64_t n = std::min({left, uint64_t(buf.size()), dst[di].len - doff, src[si].len - soff});
      if (!pread_all(src[si].fd, buf.data(), n, src[si].off + soff)) return false;
      if (!pwrite_all(dst[di].fd, buf.data(), n, dst[di].off + doff)) return false;
      left -= n;
      if ((doff += n) == dst[di].len) ++di, doff = 0;
      if ((soff += n) == src[si].len) ++si, soff = 0;
    }
    return true;
  };
  // The inline payload, as the first source.
  auto copy_to = [&](const std::vector<Span>& dst) {
    if (!is_inline) return copy(dst, local);
    uint64_t off = 0;
    for (const Span& d : dst) {
      uint64_t n = std::min(d.len, total - off);
      if (n && !pwrite_all(d.fd, req.inline_data + off, n, d.off)) return false;
      off += n;
    }
    return true;
  };
  // A copy large enough to hold up the control loop goes to the copy
  // worker, when the server has one: the job, whose finish() completes the
  // operation on the loop once the bytes have moved.
  auto deferred = [&](const std::vector<Span>& dst, const std::vector<Span>& src) -> bool {
    if (!defer || total < kOffloadBytes) return false;
    auto job = std::make_unique<MediationJob>();
    auto own = [](const std::vector<Span>& v, std::vector<MediationJob::OwnedSpan>& out) {
      for (const Span& sp : v) {
        Fd d(::fcntl(sp.fd, F_DUPFD_CLOEXEC, 0));
        if (!d.valid()) return false;
        out.push_back({std::move(d), sp.off, sp.len});
      }
      return true;
    };
    if (!own(dst, job->dst)) return false;
    if (is_inline && &src == &local) {
      job->inline_data.assign(req.inline_data, req.inline_data + total);
    } else if (!own(src, job->src)) {
      return false;
    }
    job->total = job->left = total;
    job->uid = client_uid(client);
    job->requester_qpn = req.qpn;
    job->dest = dest;
    job->opcode = req.opcode;
    job->imm_data = req.imm_data;
    job->solicited = (req.send_flags & IBV_SEND_SOLICITED) != 0;
    job->type = me->type;
    *defer = std::move(job);
    return true;
  };
  // A receive WQE of the responder as a list in its memory (its L_Keys, its PD).
  auto recv_spans = [&](const RecvWqe& r, std::vector<Span>& out, ibv_wc_status& st) {
    uint64_t room = 0;
    for (uint32_t i = 0; i < r.num_sge && i < kMaxSge; ++i) {
      const Sge& s = r.sge[i];
      if (s.length == 0) continue;
      Span sp{};
      if (!resolve_key(s.lkey, peer.pd, s.addr, s.length, IBV_ACCESS_LOCAL_WRITE, kKindBitMr, 0, sp)) {
        st = IBV_WC_LOC_PROT_ERR;
        return false;
      }
      out.push_back(sp);
      room += s.length;
    }
    if (room < total) {
      st = IBV_WC_LOC_LEN_ERR;
      return false;
    }
    // Trim the list to the message.
    uint64_t left = total;
    for (auto& sp : out) sp.len = std::min(sp.len, left), left -= sp.len;
    std::erase_if(out, [](const Span& sp) { return sp.len == 0; });
    return true;
  };
  auto recv_wc = [&](const RecvWqe& r, ibv_wc_status st, ibv_wc_opcode op, uint64_t len) {
    ibv_wc wc{};
    wc.wr_id = r.wr_id;
    wc.status = st;
    wc.opcode = op;
    wc.byte_len = uint32_t(len);
    wc.qp_num = dest;
    wc.src_qp = req.qpn;
    if (req.opcode == IBV_WR_SEND_WITH_IMM || req.opcode == IBV_WR_RDMA_WRITE_WITH_IMM) {
      wc.wc_flags = IBV_WC_WITH_IMM;
      wc.imm_data = req.imm_data;
    }
    push_recv(peer, dest, wc, (req.send_flags & IBV_SEND_SOLICITED) != 0);
  };
  uint32_t qp_access = pe.access.load(std::memory_order_relaxed);

  switch (req.opcode) {
    case IBV_WR_SEND:
    case IBV_WR_SEND_WITH_IMM: {
      RecvWqe r{};
      if (!pop_recv(peer, dest, r)) return done(proto::kMediateRnr);
      std::vector<Span> dst;
      ibv_wc_status rs = IBV_WC_SUCCESS;
      if (!recv_spans(r, dst, rs)) {
        // IBTA 9.7.5.2: the responder's protection error is our remote
        // operational error, its length error our invalid request.
        recv_wc(r, rs, IBV_WC_RECV, 0);
        return responder_error(rs == IBV_WC_LOC_PROT_ERR ? IBV_WC_REM_OP_ERR : IBV_WC_REM_INV_REQ_ERR);
      }
      if (deferred(dst, local)) {
        (*defer)->has_recv = true;
        (*defer)->recv = r;
        return 0;
      }
      if (total && !copy_to(dst)) {
        recv_wc(r, IBV_WC_LOC_PROT_ERR, IBV_WC_RECV, 0);
        return responder_error(IBV_WC_REM_OP_ERR);
      }
      recv_wc(r, IBV_WC_SUCCESS, IBV_WC_RECV, total);
      return done(proto::kMediateDone, IBV_WC_SUCCESS, false, total);
    }
    case IBV_WR_RDMA_WRITE:
    case IBV_WR_RDMA_WRITE_WITH_IMM: {
      std::vector<Span> dst;
      if (total) {
        Span sp{};
        if (!(qp_access & IBV_ACCESS_REMOTE_WRITE) ||
            !resolve_key(req.rkey, peer.pd, req.remote_addr, total, IBV_ACCESS_REMOTE_WRITE,
                         kKindBitMr | kKindBitMw1 | kKindBitMw2, dest, sp))
          return responder_error(IBV_WC_REM_ACCESS_ERR);
        dst.push_back(sp);
      }
      RecvWqe r{};
      const bool imm = req.opcode == IBV_WR_RDMA_WRITE_WITH_IMM;
      if (imm && !pop_recv(peer, dest, r)) return done(proto::kMediateRnr);
      if (deferred(dst, local)) {
        (*defer)->has_recv = imm;
        (*defer)->recv = r;
        return 0;
      }
      if (total && !copy_to(dst)) return responder_error(IBV_WC_REM_OP_ERR);
      if (imm) recv_wc(r, IBV_WC_SUCCESS, IBV_WC_RECV_RDMA_WITH_IMM, total);
      return done(proto::kMediateDone, IBV_WC_SUCCESS, false, total);
    }
    case IBV_WR_RDMA_READ: {
      if (me->type != IBV_QPT_RC) return done(proto::kMediateError, IBV_WC_LOC_QP_OP_ERR);
      if (total) {
        Span sp{};
        if (!(qp_access & IBV_ACCESS_REMOTE_READ) ||
            !resolve_key(req.rkey, peer.pd, req.remote_addr, total, IBV_ACCESS_REMOTE_READ,
                         kKindBitMr | kKindBitMw1 | kKindBitMw2, dest, sp))
          return responder_error(IBV_WC_REM_ACCESS_ERR);
        const std::vector<Span> remote{sp};
        if (deferred(local, remote)) return 0;
        if (!copy(local, remote)) return responder_error(IBV_WC_REM_OP_ERR);
      }
      return done(proto::kMediateDone, IBV_WC_SUCCESS, false, total);
    }
    case IBV_WR_ATOMIC_CMP_AND_SWP:
    case IBV_WR_ATOMIC_FETCH_AND_ADD: {
      if (me->type != IBV_QPT_RC) return done(proto::kMediateError, IBV_WC_LOC_QP_OP_ERR);
      if (local.empty() || local[0].len < 8) return done(proto::kMediateError, IBV_WC_LOC_LEN_ERR);
      if (req.remote_addr & 7) return responder_error(IBV_WC_REM_INV_REQ_ERR);
      Span sp{};
      if (!(qp_access & IBV_ACCESS_REMOTE_ATOMIC) ||
          !resolve_key(req.rkey, peer.pd, req.remote_addr, 8, IBV_ACCESS_REMOTE_ATOMIC,
                       kKindBitMr | kKindBitMw1 | kKindBitMw2, dest, sp))
        return responder_error(IBV_WC_REM_ACCESS_ERR);
      // Atomic with respect to the owner's own CPU atomics on the same
      // pages: operate on a mapping of the page, not with pread/pwrite.
      uint64_t page = sp.off & ~uint64_t(4095);
      void* m = ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, sp.fd, off_t(page));
      if (m == MAP_FAILED) return responder_error(IBV_WC_REM_OP_ERR);
      auto* word = reinterpret_cast<uint64_t*>(static_cast<uint8_t*>(m) + (sp.off - page));
      uint64_t old;
      if (req.opcode == IBV_WR_ATOMIC_CMP_AND_SWP) {
        old = req.compare_add;
        __atomic_compare_exchange_n(word, &old, req.swap, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
      } else {
        old = __atomic_fetch_add(word, req.compare_add, __ATOMIC_SEQ_CST);
      }
      ::munmap(m, 4096);
      uint8_t bytes[8];
      std::memcpy(bytes, &old, 8);
      if (!pwrite_all(local[0].fd, bytes, 8, local[0].off)) return done(proto::kMediateError, IBV_WC_LOC_PROT_ERR);
      return done(proto::kMediateDone, IBV_WC_SUCCESS, false, 8);
    }
    default:
      // SEND_WITH_INV, windows and the rest are not carried between users yet.
      return done(proto::kMediateError, IBV_WC_LOC_QP_OP_ERR);
  }
}

// The end of a deferred mediated operation, on the loop: what mediate()
// would have done after its copy. The responder QP is looked up again (it
// may be gone; then nobody is left to complete to).
int Registry::finish_mediation(MediationJob& job, proto::MediateReply& rep) {
  const bool ok = !job.failed && job.left == 0;
  auto peer = qps_.find(job.dest);
  auto done = [&](proto::MediateOutcome o, ibv_wc_status st = IBV_WC_SUCCESS, bool peer_err = false,
                  uint64_t len = 0) {
    rep.outcome = o;
    rep.wc_status = st;
    rep.peer_error = peer_err;
    rep.byte_len = uint32_t(len);
    return 0;
  };
  auto recv_wc = [&](ibv_wc_status st, ibv_wc_opcode op, uint64_t len) {
    if (!job.has_recv || peer == qps_.end()) return;
    ibv_wc wc{};
    wc.wr_id = job.recv.wr_id;
    wc.status = st;
    wc.opcode = op;
    wc.byte_len = uint32_t(len);
    wc.qp_num = job.dest;
    wc.src_qp = job.requester_qpn;
    if (job.opcode == IBV_WR_SEND_WITH_IMM || job.opcode == IBV_WR_RDMA_WRITE_WITH_IMM) {
      wc.wc_flags = IBV_WC_WITH_IMM;
      wc.imm_data = job.imm_data;
    }
    push_recv(peer->second, job.dest, wc, job.solicited);
  };
  auto responder_error = [&](ibv_wc_status requester_status) {
    if (job.type == IBV_QPT_RC && peer != qps_.end()) {
      qp_slot(job.dest).state.store(IBV_QPS_ERR, std::memory_order_release);
      flush_rq(peer->second, job.dest);
    }
    return done(proto::kMediateError, requester_status, true);
  };
  switch (job.opcode) {
    case IBV_WR_SEND:
    case IBV_WR_SEND_WITH_IMM:
      if (!ok) {
        recv_wc(IBV_WC_LOC_PROT_ERR, IBV_WC_RECV, 0);
        return responder_error(IBV_WC_REM_OP_ERR);
      }
      recv_wc(IBV_WC_SUCCESS, IBV_WC_RECV, job.total);
      return done(proto::kMediateDone, IBV_WC_SUCCESS, false, job.total);
    case IBV_WR_RDMA_WRITE:
    case IBV_WR_RDMA_WRITE_WITH_IMM:
      if (!ok) return responder_error(IBV_WC_REM_OP_ERR);
      recv_wc(IBV_WC_SUCCESS, IBV_WC_RECV_RDMA_WITH_IMM, job.total);
      return done(proto::kMediateDone, IBV_WC_SUCCESS, false, job.total);
    default:  // IBV_WR_RDMA_READ
      if (!ok) return responder_error(IBV_WC_REM_OP_ERR);
      return done(proto::kMediateDone, IBV_WC_SUCCESS, false, job.total);
  }
}

}  // namespace sv::daemon
