// Operations between users (mediation.h). One operation is a chain of
// checks -- the requester's QP, the responder's QP and its state, the
// opcode on this QP type, the requester's L_Keys (IBTA 10.6.7.1) -- and an
// execute step per operation, which checks the R_Key or the responder's
// receive WQE (IBTA 10.6.7.2, common/access.h) and moves the bytes.
//
// What it carries: SEND, SEND with immediate, SEND with Invalidate, RDMA
// WRITE (with immediate), RDMA READ, the two atomics, and IBTA annex A19's
// ATOMIC WRITE and FLUSH, on RC (READ, atomics, SEND with Invalidate, A19)
// and UC (SEND, WRITE), as the shared-memory requester does. What it
// refuses, with a local QP operation error: LOCAL_INV and BIND_MW (they act
// on the requester's side only; the library carries them out and never
// sends them here), and any other opcode (masked atomics, TSO: not
// operations of this device).
#include "common/fence.h"
#include "daemon/mediation.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace sv::daemon {

using namespace shm;
using access::Fault;

namespace {

constexpr uint64_t kMaxMediated = 1ull << 31;

// Moves all of [off, off + len) of a backing file with pread(2)/pwrite(2):
// `io` is one of them, `P` its buffer pointer type. Only where a window
// cannot be mapped (BackingWindows::at).
template <class P, class Io>
bool transfer_all(Io io, int fd, P p, uint64_t len, uint64_t off) {
  while (len) {
    ssize_t n = io(fd, p, len, off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    len -= uint64_t(n);
    off += uint64_t(n);
  }
  return true;
}

bool pread_all(int fd, uint8_t* p, uint64_t len, uint64_t off) { return transfer_all(::pread, fd, p, len, off); }
bool pwrite_all(int fd, const uint8_t* p, uint64_t len, uint64_t off) { return transfer_all(::pwrite, fd, p, len, off); }

using Span = Mediation::Span;
using Window = BackingWindows::Window;

// Where the bytes of a span (or an owned span) are.
struct Extent {
  uint32_t backing;
  int fd;
  uint64_t off;
  const OdpMemory* mem = nullptr;  // on-demand-paging memory of that process (Span::mem)
};
Extent extent(const Span& s, uint64_t at) { return {s.backing, s.fd, s.off + at, s.mem.get()}; }
Extent extent(const MediationJob::OwnedSpan& s, uint64_t at) {
  return {s.backing, s.fd.get(), s.off + at, s.mem.get()};
}

// Which side of the last failed copy was ODP memory that was not there
// (1: the destination, 2: the source; 0: none): the execute step maps it
// to the key's error (docs/MEMORY.md). Taken once.
thread_local int t_odp_fault = 0;
int take_odp_fault() { return std::exchange(t_odp_fault, 0); }

// n bytes between ODP memory and the daemon's, through the registrant's
// pinned address space (common/odp_memory.h: the process's memory as it is
// now; a hole, or a mapping without the access, fails; no signal).
bool odp_move(const OdpMemory& mem, uint64_t addr, uint8_t* here, uint64_t n, bool to_process) {
  return (to_process ? mem.write(addr, here, n) : mem.read(addr, here, n)) == 0;
}

bool put_piece(BackingWindows& win, const Extent& d, const uint8_t* src, uint64_t n);

// The job this thread is stepping (MediationJob::step; null on the loop).
thread_local MediationJob* t_job = nullptr;

// Runs `put`, which lands bytes in a destination, under the stepped job's
// landing lock and only while it is not revoked (false then).
template <class F>
bool land(F put) {
  if (!t_job) return put();
  std::lock_guard<std::timed_mutex> g(t_job->land_mu);
  if (t_job->revoked.load(std::memory_order_acquire)) return false;
  return put();
}

// A piece with ODP memory on either side: into ODP memory straight from
// the daemon's window of a source backing where it has one; else through a
// bounce buffer.
bool move_odp_piece(BackingWindows& win, const Extent& d, const Extent& s, uint64_t n) {
  if (d.mem && !s.mem) {
    std::shared_ptr<Window> hs;
    if (const uint8_t* sp = win.at(s.backing, s.fd, s.off, hs))
      return land([&] { return odp_move(*d.mem, d.off, const_cast<uint8_t*>(sp), n, true) || ((t_odp_fault = 1), false); });
  }
  std::vector<uint8_t> buf(std::min<uint64_t>(n, 1 << 16));
  for (uint64_t done = 0; done < n;) {
    const uint64_t k = std::min<uint64_t>(n - done, buf.size());
    const bool got = s.mem ? odp_move(*s.mem, s.off + done, buf.data(), k, false)
                           : pread_all(s.fd, buf.data(), k, s.off + done);
    if (!got) return (t_odp_fault = s.mem ? 2 : 0), false;
    Extent at = d;
    at.off += done;
    if (!put_piece(win, at, buf.data(), k)) return (t_odp_fault = d.mem ? 1 : 0), false;
    done += k;
  }
  return true;
}

// Moves n bytes from `s` to `d`, n within both windows' reach: one memcpy
// between the daemon's windows, or through a bounce buffer with
// pread/pwrite where a window cannot be mapped.
bool move_piece(BackingWindows& win, const Extent& d, const Extent& s, uint64_t n) {
  if (d.mem || s.mem) return move_odp_piece(win, d, s, n);
  return land([&] {
    std::shared_ptr<Window> hd, hs;
    uint8_t* dp = win.at(d.backing, d.fd, d.off, hd);
    const uint8_t* sp = dp ? win.at(s.backing, s.fd, s.off, hs) : nullptr;
    if (dp && sp) {
      core::store_tail_last(dp, sp, n);  // the last byte last (common/responder_core.h)
      return true;
    }
    std::vector<uint8_t> buf(std::min<uint64_t>(n, 1 << 16));
    for (uint64_t done = 0; done < n;) {
      const uint64_t k = std::min<uint64_t>(n - done, buf.size());
      if (!pread_all(s.fd, buf.data(), k, s.off + done) || !pwrite_all(d.fd, buf.data(), k, d.off + done))
        return false;
      done += k;
    }
    return true;
  });
}

// Bytes from daemon memory (an inline payload) into `d`.
bool put_piece(BackingWindows& win, const Extent& d, const uint8_t* src, uint64_t n) {
  return land([&] {
    if (d.mem) return odp_move(*d.mem, d.off, const_cast<uint8_t*>(src), n, true) || ((t_odp_fault = 1), false);
    std::shared_ptr<Window> hd;
    if (uint8_t* dp = win.at(d.backing, d.fd, d.off, hd)) {
      core::store_tail_last(dp, src, n);
      return true;
    }
    return pwrite_all(d.fd, src, n, d.off);
  });
}

// Where a copy between two lists of spans got to.
struct Cursor {
  size_t di = 0, si = 0;
  uint64_t doff = 0, soff = 0;
};

// Copies up to `budget` of the `left` bytes from one list to the other, a
// piece (bounded by both windows' reach) at a time, in order.
template <class D, class S>
bool copy_lists(BackingWindows& win, const std::vector<D>& dst, const std::vector<S>& src, Cursor& c, uint64_t& left,
                uint64_t budget) {
  while (left && budget) {
    const Extent d = extent(dst[c.di], c.doff), s = extent(src[c.si], c.soff);
    const uint64_t n = std::min({left, budget, dst[c.di].len - c.doff, src[c.si].len - c.soff,
                                 BackingWindows::reach(d.off), BackingWindows::reach(s.off)});
    if (!move_piece(win, d, s, n)) return false;
    left -= n;
    budget -= n;
    if ((c.doff += n) == dst[c.di].len) ++c.di, c.doff = 0;
    if ((c.soff += n) == src[c.si].len) ++c.si, c.soff = 0;
  }
  return true;
}

// An inline payload of `total` bytes into a list of spans.
template <class D>
bool put_inline(BackingWindows& win, const std::vector<D>& dst, const uint8_t* data, uint64_t total) {
  uint64_t off = 0;
  for (const D& sp : dst) {
    for (uint64_t at = 0; at < sp.len && off < total;) {
      const Extent d = extent(sp, at);
      const uint64_t n = std::min({sp.len - at, total - off, BackingWindows::reach(d.off)});
      if (!put_piece(win, d, data + off, n)) return false;
      at += n;
      off += n;
    }
  }
  return true;
}

// The spans with descriptors of their own, for a job that outlives the
// registrations (a deregistration meanwhile cannot pull the file away).
// ODP memory has no file: its span holds the registrant's pinned address
// space and its pidfd, which each step re-checks (the MR dies with its
// process).
bool own_spans(const std::vector<Span>& v, std::vector<MediationJob::OwnedSpan>& out) {
  for (const Span& sp : v) {
    if (sp.pid) {
      Fd p(sp.pidfd < 0 ? -1 : ::fcntl(sp.pidfd, F_DUPFD_CLOEXEC, 0));
      if (!p.valid() || !sp.mem) return false;
      out.push_back({Fd(), sp.off, sp.len, sp.backing, sp.pid, std::move(p), sp.mem, sp.owner_uid});
      continue;
    }
    Fd d(::fcntl(sp.fd, F_DUPFD_CLOEXEC, 0));
    if (!d.valid()) return false;
    out.push_back({std::move(d), sp.off, sp.len, sp.backing, 0, Fd(), nullptr, 0});
  }
  return true;
}

// Which side holds ODP memory whose registrant is gone (1: a destination
// span, 2: a source span; 0: none).
int odp_owner_gone(const std::vector<MediationJob::OwnedSpan>& dst, const std::vector<MediationJob::OwnedSpan>& src) {
  for (const MediationJob::OwnedSpan& s : dst)
    if (s.pid && !pidfd_alive(s.pidfd.get())) return 1;
  for (const MediationJob::OwnedSpan& s : src)
    if (s.pid && !pidfd_alive(s.pidfd.get())) return 2;
  return 0;
}

// An atomic on the responder's quadword, atomic with respect to its owner's
// own CPU atomics on the same page: on the daemon's window of its backing
// (a shared mapping of the same page), not with pread/pwrite. `old`
// receives the original value.
bool atomic_on_page(BackingWindows& win, const Span& sp, const proto::MediateReq& req, uint64_t& old) {
  if (sp.pid) return false;  // ODP memory: on a copy thread (Mediation::defer_odp_atomic)
  std::shared_ptr<Window> h;
  uint8_t* p = win.at(sp.backing, sp.fd, sp.off, h);
  if (!p) return false;
  // 8-byte aligned (core::check_atomic).
  old = core::apply_atomic(reinterpret_cast<uint64_t*>(p), req.opcode == IBV_WR_ATOMIC_CMP_AND_SWP, req.compare_add,
                           req.swap);
  return true;
}

int reply(proto::MediateReply& rep, proto::MediateOutcome o, ibv_wc_status st = IBV_WC_SUCCESS, bool peer_err = false,
          uint64_t len = 0) {
  rep.outcome = o;
  rep.wc_status = st;
  rep.peer_error = peer_err;
  rep.byte_len = uint32_t(len);
  return 0;
}

}  // namespace

// What a message does at the responder once its bytes have moved, the same
// whether the copy ran on the loop or on the copy worker.
struct Mediation::Delivery {
  uint32_t client;
  uint32_t requester_qpn;
  uint32_t dest;
  uint32_t opcode;
  uint32_t imm_data;  // SEND with Invalidate: the key (ibv_send_wr's union)
  bool solicited;
  ibv_qp_type type;
};

// One operation on its way through the checks.
struct Mediation::Op {
  const proto::MediateReq& req;
  proto::MediateReply& rep;
  std::unique_ptr<MediationJob>* defer;
  Delivery d;
  MediationTables::QpView me{}, peer{};
  uint32_t qp_access = 0;  // the responder QP's remote access flags
  bool is_inline = false;
  std::vector<Span> local;  // the requester's SGEs (none for inline data)
  uint64_t total = 0;
  access::User responder() const { return {peer.pd, d.dest, qp_access}; }
};

// ---- Copies off the control loop ------------------------------------------
// A large mediated copy runs on the server's copy worker, a piece at a time.
bool MediationJob::step(uint64_t max_bytes) {
  struct Stepping {
    explicit Stepping(MediationJob* j) { t_job = j; }
    ~Stepping() { t_job = nullptr; }
  } stepping(this);
  if (revoked.load(std::memory_order_acquire)) failed = true;
  if (failed || left == 0) return false;
  // ODP memory is reached only while its registrant lives (as resolve_key
  // checks on the loop): a dead one's pid may be another process's now.
  if (int gone = odp_owner_gone(dst, src)) {
    odp_fault = gone;
    failed = true;
    return false;
  }
  take_odp_fault();
  if (atomic) return store ? step_store() : step_atomic();
  if (!inline_data.empty()) {
    // The inline payload (at most kMaxInline bytes): at once.
    failed = !put_inline(*windows, dst, inline_data.data(), total);
    if (failed) odp_fault = take_odp_fault();
    left = 0;
    return false;
  }
  Cursor c{di, si, doff, soff};
  if (!copy_lists(*windows, dst, src, c, left, max_bytes)) {
    odp_fault = take_odp_fault();
    failed = true;
    return false;
  }
  di = c.di, si = c.si, doff = c.doff, soff = c.soff;
  return left != 0;
}

bool MediationJob::touches(uint32_t backing) const {
  for (const auto* v : {&dst, &src})
    for (const OwnedSpan& s : *v)
      if (!s.pid && s.backing == backing) return true;
  return false;
}

// The atomic (IBTA 9.4.5) on the ODP quadword src[0], read-modify-write
// under the target user's lock (as the library's odp_atomic), its write
// landing only while the job is not revoked; then the original value to
// the result buffer dst.
bool MediationJob::step_atomic() {
  left = 0;
  const OwnedSpan& t = src[0];
  uint64_t old = 0;
  bool ok = false;
  while (::flock(lock.get(), LOCK_EX) != 0 && errno == EINTR) {
  }
  if (t.mem && t.mem->read(t.off, &old, 8) == 0) {
    const uint64_t now = cas ? (old == compare_add ? swap : old) : old + compare_add;
    ok = now == old || land([&] { return t.mem->write(t.off, &now, 8) == 0; });
  }
  ::flock(lock.get(), LOCK_UN);
  if (!ok) {
    odp_fault = 2;
    failed = true;
    return false;
  }
  uint8_t bytes[8];
  std::memcpy(bytes, &old, 8);
  failed = !put_inline(*windows, dst, bytes, 8);
  if (failed) odp_fault = take_odp_fault() ? 1 : 0;
  return false;
}

// ATOMIC WRITE (IBTA annex A19) with ODP memory on either side: the 8
// bytes (swap, or read here from the requester's spans dst), then one
// aligned store into src[0], on ODP memory under the target user's lock
// (as the library's odp_atomic_write), landing only while the job is not
// revoked. odp_fault as for a READ: 1 the requester's side, 2 the target.
bool MediationJob::step_store() {
  left = 0;
  uint64_t v = swap;
  uint64_t at = 0;
  for (const OwnedSpan& l : dst) {
    uint8_t* to = reinterpret_cast<uint8_t*>(&v) + at;
    if (at + l.len > 8 || !(l.mem ? l.mem->read(l.off, to, l.len) == 0 : pread_all(l.fd.get(), to, l.len, l.off))) {
      odp_fault = 1;
      failed = true;
      return false;
    }
    at += l.len;
  }
  const OwnedSpan& t = src[0];
  bool ok = false;
  if (t.mem) {
    while (::flock(lock.get(), LOCK_EX) != 0 && errno == EINTR) {
    }
    ok = land([&] { return t.mem->store_word(t.off, v) == 0; });
    ::flock(lock.get(), LOCK_UN);
  } else {
    ok = land([&] {
      std::shared_ptr<Window> h;
      uint8_t* p = windows->at(t.backing, t.fd.get(), t.off, h);
      if (p) core::store_atomic_write(reinterpret_cast<uint64_t*>(p), v);
      return p != nullptr;
    });
  }
  if (!ok) {
    odp_fault = t.mem ? 2 : 0;
    failed = true;
  }
  return false;
}

pid_t MediationJob::odp_pid() const {
  for (const auto* v : {&dst, &src})
    for (const OwnedSpan& s : *v)
      if (s.pid) return s.pid;
  return 0;
}

uid_t MediationJob::odp_uid() const {
  for (const auto* v : {&dst, &src})
    for (const OwnedSpan& s : *v)
      if (s.pid) return s.owner_uid;
  return 0;
}

std::unique_ptr<MediationJob> MediationJob::failed_copy() const {
  auto j = std::make_unique<MediationJob>();
  j->total = j->left = total;
  j->failed = true;
  j->uid = uid;
  j->client = client;
  j->requester_qpn = requester_qpn, j->dest = dest, j->opcode = opcode, j->imm_data = imm_data;
  j->solicited = solicited;
  j->type = type;
  j->has_recv = has_recv;
  j->recv = recv;
  j->posted = posted;
  j->epoch = epoch;
  j->wr_id = wr_id;
  j->signaled = signaled;
  return j;
}

bool MediationJob::touches_odp_of(pid_t pid) const {
  for (const auto* v : {&dst, &src})
    for (const OwnedSpan& s : *v)
      if (s.pid && s.pid == pid) return true;
  return false;
}

// ---- Tables --------------------------------------------------------------

bool Mediation::resolve_key(uint32_t key, access::Use use, const access::User& who, uint32_t need, uint64_t addr,
                            uint64_t len, Span& out) const {
  const MrEntry* e =
      access::check([this](uint32_t slot) -> const MrEntry& { return t_.mr_slot(slot); }, key, use, who, need, addr, len);
  if (!e) return false;
  if (e->backing == kOdpBacking) {  // the registrant's addresses, while it lives
    int pidfd = -1;
    uid_t uid = 0;
    auto mem = t_.odp_memory(e->owner_pid, e->owner_identity, &pidfd, &uid);
    if (!mem) return false;
    out = Span{-1, access::file_offset(*e, addr), len, kOdpBacking, pid_t(e->owner_pid), std::move(mem), pidfd, uid};
    return true;
  }
  const int fd = t_.backing_fd(e->backing);
  if (fd < 0) return false;
  windows_->live(e->backing);
  out = Span{fd, access::file_offset(*e, addr), len, e->backing};
  return true;
}

bool Mediation::pop_recv(uint32_t qpn, RecvWqe& out) {
  MediationTables::RecvQueue q;
  if (!t_.receive_queue(qpn, q)) return false;
  if (!(q.srq_header ? take_srq_receive(q.srq_header, [&] { return q.ring.pop(out); }) : q.ring.pop(out))) return false;
  if (q.srq_header) {
    // The SRQ fell below its armed limit: the event, once per arm (IBTA
    // 10.2.9.4, 11.5.2.4), as the library raises it on one user's path.
    const uint32_t limit = q.srq_header->limit.load(std::memory_order_relaxed);
    if (limit && q.ring.size() < limit && q.srq_header->limit.exchange(0) != 0) t_.srq_limit_reached(q.srq);
  }
  return true;
}

void Mediation::push_recv(uint32_t qpn, const ibv_wc& wc, bool solicited) {
  MediationTables::QpView v;
  if (t_.responder_qp(qpn, v)) t_.push_cq_entry(v.recv_cq, wc, solicited);  // follows a CQ that a resize moved
}

void Mediation::recv_completion(const Delivery& d, const RecvWqe& r, ibv_wc_status st, uint64_t len) {
  push_recv(d.dest, core::receive_completion(r.wr_id, st, d.opcode, uint32_t(len), d.dest, d.requester_qpn, d.imm_data,
                                             d.imm_data),
            d.solicited);
}

// ---- Outcomes --------------------------------------------------------------

// An error the responder found goes with its QP to ERR on RC (IBTA
// 9.9.3.1.2), its posted receives flushed; the requester's own errors do not.
int Mediation::fail(const Delivery& d, Fault f, proto::MediateReply& rep) {
  if (!access::responder_detected(f)) return reply(rep, proto::kMediateError, access::status(f));
  MediationTables::QpView v;
  if (d.type == IBV_QPT_RC && t_.responder_qp(d.dest, v)) {
    if (t_.qp_state_entry(d.dest).state.exchange(IBV_QPS_ERR, std::memory_order_acq_rel) != IBV_QPS_ERR)
      t_.responder_error_event(d.dest, access::status(f));
    t_.flush_receives(d.dest);
  }
  return reply(rep, proto::kMediateError, access::status(f), true);
}

int Mediation::fail(Op& op, Fault f) { return fail(op.d, f, op.rep); }

int Mediation::complete(Op& op, uint64_t len) { return reply(op.rep, proto::kMediateDone, IBV_WC_SUCCESS, false, len); }

// A SEND's bytes are in the receive buffer: SEND with Invalidate invalidates
// the responder's type 2 window first (IBTA 9.4.1.2.1, 10.6.7.2.6; a key it
// may not invalidate fails the receive: core::Check::kInvalidateRefused),
// then the receive completes.
int Mediation::deliver_send(const Delivery& d, const RecvWqe& r, uint64_t len, proto::MediateReply& rep) {
  if (d.opcode == IBV_WR_SEND_WITH_INV && t_.invalidate_remote(d.client, d.requester_qpn, d.imm_data) != 0) {
    const core::Verdict v = core::verdict(core::Check::kInvalidateRefused);
    recv_completion(d, r, v.receive_status, 0);
    return fail(d, v.fault, rep);
  }
  recv_completion(d, r, IBV_WC_SUCCESS, len);
  return reply(rep, proto::kMediateDone, IBV_WC_SUCCESS, false, len);
}

// ---- The checks ------------------------------------------------------------

// The responder: the QP the requester's is connected to, connected back,
// of the same type, able to receive. Anything else is transient (a peer
// between modify calls): the library retries.
bool Mediation::check_responder(Op& op) {
  op.d.dest = t_.qp_state_entry(op.req.qpn).dest_qpn.load();
  if (!t_.responder_qp(op.d.dest, op.peer)) return false;
  const QpEntry& pe = t_.qp_state_entry(op.d.dest);
  const auto st = ibv_qp_state(pe.state.load());
  if (st != IBV_QPS_RTR && st != IBV_QPS_RTS && st != IBV_QPS_SQD && st != IBV_QPS_SQE) return false;
  if (pe.dest_qpn.load() != op.req.qpn || op.peer.type != op.me.type) return false;
  op.qp_access = pe.access.load(std::memory_order_relaxed);
  return true;
}

// The opcode on this QP type (the opcode rules, common/opcode_rules.h;
// IBTA 9.8: UC has no READ, atomics nor SEND with Invalidate), and one that
// acts at the responder (see the top of the file for what is refused).
Fault Mediation::check_opcode(const Op& op) const {
  if (!rules::allowed_on(op.req.opcode, op.me.type)) return Fault::kLocalOperation;
  const rules::WrKind k = rules::rule_of(op.req.opcode).kind;
  return k == rules::WrKind::kLocal ? Fault::kLocalOperation : Fault::kNone;
}

// The requester's side: its own MRs through its L_Keys in its PD (local
// write where the operation writes them), or the inline payload.
Fault Mediation::resolve_local(Op& op) {
  const proto::MediateReq& req = op.req;
  const bool writes = access::writes_local(req.opcode);
  op.is_inline = (req.send_flags & IBV_SEND_INLINE) && !writes;
  if (op.is_inline) {
    op.total = req.inline_len;
    return Fault::kNone;
  }
  const access::User me{op.me.pd, req.qpn, 0};
  for (uint32_t i = 0; i < req.num_sge; ++i) {
    const Sge& s = req.sge[i];
    if (s.length == 0) continue;
    Span sp{};
    if (!resolve_key(s.lkey, access::Use::kLocal, me, writes ? IBV_ACCESS_LOCAL_WRITE : 0, s.addr, s.length, sp))
      return Fault::kLocalProtection;
    op.local.push_back(sp);
    op.total += s.length;
  }
  return op.total > kMaxMediated ? Fault::kLocalLength : Fault::kNone;
}

// The R_Key of a WRITE, READ or atomic over `len` bytes at the responder.
Fault Mediation::resolve_remote(const Op& op, uint64_t len, Span& out) const {
  const uint32_t need = access::remote_need(op.req.opcode);
  if (!resolve_key(op.req.rkey, access::Use::kRemote, op.responder(), need, op.req.remote_addr, len, out))
    return access::fault_of(access::Use::kRemote);
  return Fault::kNone;
}

// A receive WQE of the responder as a list in its memory for the message
// (core::scatter_receive: its length, then the L_Keys of the buffers the
// message reaches, in the responder's PD with local write).
core::Check Mediation::recv_spans(const Op& op, const RecvWqe& r, std::vector<Span>& out) const {
  const access::User owner{op.peer.pd, op.d.dest, 0};
  return core::scatter_receive(r.sge, r.num_sge, 0, op.total, [&](const Sge& s, uint64_t at, uint64_t n, uint64_t) {
    Span sp{};
    if (!resolve_key(s.lkey, access::Use::kLocal, owner, IBV_ACCESS_LOCAL_WRITE, s.addr + at, n, sp)) return false;
    out.push_back(sp);
    return true;
  });
}

// ---- Moving the bytes --------------------------------------------------------

// The message into `dst`: from the requester's spans, or its inline payload.
bool Mediation::copy_to(const Op& op, const std::vector<Span>& dst) const {
  if (!op.is_inline) return copy_spans(dst, op.local, op.total);
  copied_on_loop_ += op.total;
  return put_inline(*windows_, dst, op.req.inline_data, op.total);
}

bool Mediation::copy_spans(const std::vector<Span>& dst, const std::vector<Span>& src, uint64_t total) const {
  copied_on_loop_ += total;
  Cursor c;
  return copy_lists(*windows_, dst, src, c, total, total);
}

// A job made for `op`, with what finish() completes it by (the requester,
// its destination, the work request's opcode and immediate data), handed
// to the copy worker in *op.defer.
void Mediation::hand_off(Op& op, std::unique_ptr<MediationJob> job) {
  job->windows = windows_;
  job->uid = t_.uid_of_client(op.d.client);
  job->client = op.d.client;
  job->requester_qpn = op.d.requester_qpn;
  job->dest = op.d.dest;
  job->opcode = op.d.opcode;
  job->imm_data = op.d.imm_data;
  job->solicited = op.d.solicited;
  job->type = op.d.type;
  *op.defer = std::move(job);
}

// An atomic's original value, to land in its result buffer off the loop (a
// deferred inline copy: finish() completes it as a READ, a failure being
// the result buffer's, a local protection error).
bool Mediation::defer_result(Op& op, const uint8_t (&bytes)[8]) {
  if (!op.defer) return false;
  auto job = std::make_unique<MediationJob>();
  if (!own_spans({op.local[0]}, job->dst)) return false;
  job->inline_data.assign(bytes, bytes + 8);
  job->total = job->left = 8;
  hand_off(op, std::move(job));
  return true;
}

// An atomic on ODP memory: never on the loop (its page may wait on a fault,
// its lock on whoever holds it), always a job of its own (MediationJob::
// atomic) on a copy thread, under the lock the target user's library
// takes for its own ODP atomics, so that both are atomic with respect to
// each other.
int Mediation::defer_odp_atomic(Op& op, const Span& target) {
  if (!op.defer) return fail(op, Fault::kRemoteOperation);
  auto job = std::make_unique<MediationJob>();
  if (t_.odp_lock(target.owner_uid, job->lock) != 0) return fail(op, Fault::kRemoteOperation);
  if (!own_spans({target}, job->src) || !own_spans({op.local[0]}, job->dst)) return fail(op, Fault::kRemoteOperation);
  job->atomic = true;
  job->cas = op.req.opcode == IBV_WR_ATOMIC_CMP_AND_SWP;
  job->compare_add = op.req.compare_add;
  job->swap = op.req.swap;
  job->total = job->left = access::kAtomicBytes;
  hand_off(op, std::move(job));
  return 0;
}

// An ATOMIC WRITE with ODP memory on either side: a job of its own
// (MediationJob::store) on a copy thread, as defer_odp_atomic. `value`: the
// 8 bytes, or null where the requester's spans hold ODP memory (read on
// that thread).
int Mediation::defer_odp_atomic_write(Op& op, const Span& target, const uint8_t* value) {
  if (!op.defer) return fail(op, Fault::kRemoteOperation);
  auto job = std::make_unique<MediationJob>();
  if (target.pid && t_.odp_lock(target.owner_uid, job->lock) != 0) return fail(op, Fault::kRemoteOperation);
  if (!own_spans({target}, job->src) || (!value && !own_spans(op.local, job->dst)))
    return fail(op, Fault::kRemoteOperation);
  job->atomic = job->store = true;
  if (value) std::memcpy(&job->swap, value, 8);
  job->total = job->left = access::kAtomicBytes;
  hand_off(op, std::move(job));
  return 0;
}

// A copy large enough to hold up the control loop goes to the copy worker,
// when the server has one: the job, whose finish() completes the operation
// on the loop once the bytes have moved. How large is the server's call
// (set_offload): up to its worker's piece (1 MiB, one memcpy between the
// daemon's windows, about 50 us) while one connection at a time is served,
// 64 KiB when others wait.
//
// A copy that touches ODP memory goes whatever its size: a fault on it may
// wait for as long as its registrant wants (a FUSE page whose READ is never
// answered), which the loop must never do.
bool Mediation::defer_copy(Op& op, const std::vector<Span>& dst, const std::vector<Span>& src) {
  if (!op.defer) return false;
  const auto odp = [](const std::vector<Span>& v) {
    return std::any_of(v.begin(), v.end(), [](const Span& s) { return s.pid != 0; });
  };
  if (op.total < offload_bytes_ && !odp(dst) && !(odp(src) && !(op.is_inline && &src == &op.local))) return false;
  auto job = std::make_unique<MediationJob>();
  if (!own_spans(dst, job->dst)) return false;
  if (op.is_inline && &src == &op.local) {
    job->inline_data.assign(op.req.inline_data, op.req.inline_data + op.total);
  } else if (!own_spans(src, job->src)) {
    return false;
  }
  job->total = job->left = op.total;
  hand_off(op, std::move(job));
  return true;
}

// ---- Execute -----------------------------------------------------------------

int Mediation::execute_send(Op& op) {
  RecvWqe r{};
  if (!pop_recv(op.d.dest, r)) return reply(op.rep, proto::kMediateRnr);
  std::vector<Span> dst;
  if (core::Check c = recv_spans(op, r, dst); c != core::Check::kOk) {
    // The receive completes in error, the requester fails (core::verdict).
    const core::Verdict v = core::verdict(c);
    recv_completion(op.d, r, v.receive_status, 0);
    return fail(op, v.fault);
  }
  if (defer_copy(op, dst, op.local)) {
    (*op.defer)->has_recv = true;
    (*op.defer)->recv = r;
    return 0;
  }
  if (op.total && !copy_to(op, dst)) {
    const int odp = take_odp_fault();  // ODP memory not there: the receive's buffer, or the requester's
    if (odp == 2) return recv_completion(op.d, r, IBV_WC_WR_FLUSH_ERR, 0), fail(op, Fault::kLocalProtection);
    const core::Verdict v = core::verdict(odp ? core::Check::kReceiveBadKey : core::Check::kResponderFault);
    recv_completion(op.d, r, v.receive_status, 0);
    return fail(op, v.fault);
  }
  return deliver_send(op.d, r, op.total, op.rep);
}

int Mediation::execute_write(Op& op) {
  std::vector<Span> dst;
  if (op.total) {  // a zero-length WRITE needs no key (IBTA 9.7.4.1.5)
    Span sp{};
    if (Fault f = resolve_remote(op, op.total, sp); f != Fault::kNone) return fail(op, f);
    dst.push_back(sp);
  }
  RecvWqe r{};
  const bool imm = (rules::rule_of(op.req.opcode).flags & rules::kWrRecv) != 0;
  if (imm && !pop_recv(op.d.dest, r)) return reply(op.rep, proto::kMediateRnr);
  if (defer_copy(op, dst, op.local)) {
    (*op.defer)->has_recv = imm;
    (*op.defer)->recv = r;
    return 0;
  }
  if (op.total && !copy_to(op, dst)) {
    const int odp = take_odp_fault();
    return fail(op, odp == 1 ? Fault::kRemoteAccess : odp == 2 ? Fault::kLocalProtection : Fault::kRemoteOperation);
  }
  if (imm) recv_completion(op.d, r, IBV_WC_SUCCESS, op.total);
  return complete(op, op.total);
}

int Mediation::execute_read(Op& op) {
  if (op.total) {  // a zero-length READ needs no key (IBTA 9.7.4.1.5)
    Span sp{};
    if (Fault f = resolve_remote(op, op.total, sp); f != Fault::kNone) return fail(op, f);
    const std::vector<Span> remote{sp};
    if (defer_copy(op, op.local, remote)) return 0;
    if (!copy_spans(op.local, remote, op.total)) {
      const int odp = take_odp_fault();
      return fail(op, odp == 2 ? Fault::kRemoteAccess : odp == 1 ? Fault::kLocalProtection : Fault::kRemoteOperation);
    }
  }
  return complete(op, op.total);
}

int Mediation::execute_atomic(Op& op) {
  const uint64_t result_len = op.local.empty() ? 0 : op.local[0].len;
  if (Fault f = core::check_atomic(op.req.opcode, result_len, op.req.remote_addr); f != Fault::kNone)
    return fail(op, f);
  Span sp{};
  if (Fault f = resolve_remote(op, access::kAtomicBytes, sp); f != Fault::kNone) return fail(op, f);
  if (sp.pid) return defer_odp_atomic(op, sp);
  uint64_t old = 0;
  if (!atomic_on_page(*windows_, sp, op.req, old)) return fail(op, Fault::kRemoteOperation);
  uint8_t bytes[8];
  std::memcpy(bytes, &old, 8);
  // A result buffer in ODP memory is written off the loop (defer_copy): its
  // page may wait on a fault for as long as its registrant wants.
  if (op.local[0].pid && defer_result(op, bytes)) return 0;
  if (!put_piece(*windows_, extent(op.local[0], 0), bytes, 8)) return fail(op, Fault::kLocalProtection);
  return complete(op, access::kAtomicBytes);
}

// ATOMIC WRITE (IBTA annex A19): the requester's 8 bytes (inline, or read
// from its spans) as one aligned store on the daemon's window of the
// responder's page, like the atomics.
int Mediation::execute_atomic_write(Op& op) {
  if (core::Check c = core::check_atomic_write(op.total, op.req.remote_addr); c != core::Check::kOk)
    return fail(op, core::verdict(c).fault);
  Span sp{};
  if (Fault f = resolve_remote(op, access::kAtomicBytes, sp); f != Fault::kNone) return fail(op, f);
  // ODP memory on either side: on a copy thread (defer_odp_atomic_write).
  const bool odp_source =
      !op.is_inline && std::any_of(op.local.begin(), op.local.end(), [](const Span& l) { return l.pid != 0; });
  uint8_t bytes[8];
  if (op.is_inline) {
    std::memcpy(bytes, op.req.inline_data, 8);
  } else if (!odp_source) {
    uint64_t at = 0;
    for (const Span& l : op.local) {
      if (!pread_all(l.fd, bytes + at, l.len, l.off)) return fail(op, Fault::kLocalProtection);
      at += l.len;
    }
  }
  if (sp.pid || odp_source) return defer_odp_atomic_write(op, sp, odp_source ? nullptr : bytes);
  std::shared_ptr<Window> h;
  uint8_t* p = windows_->at(sp.backing, sp.fd, sp.off, h);
  if (!p) return fail(op, Fault::kRemoteOperation);
  uint64_t v;
  std::memcpy(&v, bytes, 8);
  core::store_atomic_write(reinterpret_cast<uint64_t*>(p), v);
  return complete(op, access::kAtomicBytes);
}

// FLUSH (IBTA annex A19): the R_Key with the FLUSH rights of the placement
// type over the range or (selectivity MR) its whole region, then the
// responder core's flush of the backing file.
int Mediation::execute_flush(Op& op) {
  const uint8_t placement = uint8_t(op.req.swap), level = uint8_t(op.req.swap >> 8);
  if (core::Check c = core::check_flush(placement, level); c != core::Check::kOk)
    return fail(op, core::verdict(c).fault);
  const MrEntry* e =
      access::lookup(op.req.rkey, [this](uint32_t slot) -> const MrEntry& { return t_.mr_slot(slot); });
  if (!e) return fail(op, Fault::kRemoteAccess);
  const core::Extent x = core::flush_extent(*e, level, op.req.remote_addr, op.req.compare_add);
  Span sp{};
  if (!resolve_key(op.req.rkey, access::Use::kRemote, op.responder(), rules::flush_need(placement), x.addr, x.len, sp))
    return fail(op, Fault::kRemoteAccess);
  // ODP memory is process memory with no medium: the fence is all.
  if (sp.pid) fence_seq_cst();
  if (!sp.pid && !core::apply_flush_file(sp.fd, placement))
    return fail(op, core::verdict(core::Check::kResponderFault).fault);
  return complete(op, uint32_t(op.req.compare_add));
}

// ---- Entry points ------------------------------------------------------------

int Mediation::mediate(uint32_t client, const proto::MediateReq& req, proto::MediateReply& rep,
                       std::unique_ptr<MediationJob>* defer) {
  MediationTables::QpView me;
  if (!t_.requester_qp(client, req.qpn, me)) return EINVAL;
  return mediate_as(client, me, req, rep, defer);
}

int Mediation::mediate_as(uint32_t client, const MediationTables::QpView& me, const proto::MediateReq& req,
                          proto::MediateReply& rep, std::unique_ptr<MediationJob>* defer) {
  const Delivery d{client, req.qpn, 0, req.opcode, req.imm_data, (req.send_flags & IBV_SEND_SOLICITED) != 0, IBV_QPT_RC};
  Op op{req, rep, defer, d, me, {}, 0, false, {}, 0};
  if (op.me.type != IBV_QPT_RC && op.me.type != IBV_QPT_UC) return EINVAL;
  if (req.num_sge > kMaxSge || req.inline_len > kMaxInline) return EINVAL;
  op.d.type = op.me.type;
  if (!check_responder(op)) return reply(rep, proto::kMediateRetry);
  if (Fault f = check_opcode(op); f != Fault::kNone) return fail(op, f);
  if (Fault f = resolve_local(op); f != Fault::kNone) return fail(op, f);
  switch (rules::rule_of(req.opcode).kind) {
    case rules::WrKind::kSend: return execute_send(op);
    case rules::WrKind::kWrite: return execute_write(op);
    case rules::WrKind::kRead: return execute_read(op);
    case rules::WrKind::kAtomicWrite: return execute_atomic_write(op);
    case rules::WrKind::kFlush: return execute_flush(op);
    default: return execute_atomic(op);  // check_opcode let only the two atomics through
  }
}

// The end of a deferred operation, on the loop. The responder QP is looked
// up again (it may be gone; then nobody is left to complete to).
int Mediation::finish(MediationJob& job, proto::MediateReply& rep) {
  const Delivery d{job.client, job.requester_qpn, job.dest, job.opcode, job.imm_data, job.solicited, job.type};
  const bool ok = !job.failed && job.left == 0;
  switch (rules::rule_of(job.opcode).kind) {
    case rules::WrKind::kSend:
      if (!ok) {  // ODP memory not there, as execute_send maps it
        if (job.odp_fault == 2) return recv_completion(d, job.recv, IBV_WC_WR_FLUSH_ERR, 0), fail(d, Fault::kLocalProtection, rep);
        const core::Verdict v = core::verdict(job.odp_fault ? core::Check::kReceiveBadKey : core::Check::kResponderFault);
        recv_completion(d, job.recv, v.receive_status, 0);
        return fail(d, v.fault, rep);
      }
      return deliver_send(d, job.recv, job.total, rep);
    case rules::WrKind::kWrite:
      if (!ok)
        return fail(d, job.odp_fault == 1 ? Fault::kRemoteAccess
                       : job.odp_fault == 2 ? Fault::kLocalProtection : Fault::kRemoteOperation, rep);
      if (job.has_recv) recv_completion(d, job.recv, IBV_WC_SUCCESS, job.total);
      return reply(rep, proto::kMediateDone, IBV_WC_SUCCESS, false, job.total);
    default:  // IBV_WR_RDMA_READ
      if (!ok)
        return fail(d, job.odp_fault == 2 ? Fault::kRemoteAccess
                       : job.odp_fault == 1 ? Fault::kLocalProtection : Fault::kRemoteOperation, rep);
      return reply(rep, proto::kMediateDone, IBV_WC_SUCCESS, false, job.total);
  }
}

}  // namespace sv::daemon
