// The library's side of `softverbs capture` (capture.h): the ring's
// watcher, and the rendering of a request carried out in shared memory (or
// by the daemon) as the RoCEv2 packets an RDMA NIC would have sent for it:
// one per path-MTU piece (IBTA 9.7.2), with the responder's
// acknowledgement, READ responses or ATOMIC acknowledgement after it.
#include "verbs/capture.h"

#include <sys/inotify.h>
#include <unistd.h>

#include <cstring>
#include <utility>
#include <vector>

#include "common/capture_ring.h"
#include "roce/headers.h"
#include "roce/icrc.h"
#include "verbs/provider.h"
#include "verbs/requester_internal.h"
#include "verbs/transport.h"
#include "verbs/wr_rules.h"

namespace sv::verbs {
namespace {

namespace ro = sv::roce;

std::string ring_name(const std::string& path) { return path.substr(path.rfind('/') + 1); }

// Takes the send lock of the QP if it is free now (refresh holds the
// context lock, which a poster may wait for under its send lock: no waiting
// here).
bool try_send_lock(ProcessQp& q) {
  uint32_t expected = 0;
  return q.hdr->send_lock.next.load(std::memory_order_relaxed) == 0 &&
         q.hdr->send_lock.owner.compare_exchange_strong(expected, self_pid(), std::memory_order_acquire);
}

// Every QP of the context chooses its ops again (under its send lock, as
// choose_transport wants it), those busy now a little later; a QP of a
// thread domain is left alone (its own thread only may change it).
void choose_again(ContextState& st) {
  std::vector<uint32_t> left;
  {
    std::lock_guard<std::mutex> g(st.mu);
    for (auto& [qpn, h] : st.qp_handles) left.push_back(qpn);
  }
  for (int round = 0; !left.empty() && round < 20000; round++) {
    if (round) ::usleep(500);
    std::lock_guard<std::mutex> g(st.mu);
    std::vector<uint32_t> busy;
    for (uint32_t qpn : left) {
      auto it = st.qp_handles.find(qpn);
      if (it == st.qp_handles.end() || it->second->st->lockless) continue;  // gone, or a thread domain's
      ProcessQp& q = *it->second->st;
      if (!try_send_lock(q)) {
        busy.push_back(qpn);
        continue;
      }
      choose_transport(q);
      q.hdr->send_lock.unlock();
    }
    left.swap(busy);
  }
}

// Maps the ring if it is there and ours, or drops it, then the QPs choose
// their ops again. A ring dropped stays mapped a second more, for a poster
// or the wire path's tap that loaded it just before.
void refresh(ContextState& st) {
  auto ring = std::make_unique<capture::Ring>();
  const bool on = !st.capture_path.empty() && ring->open_writer(st.capture_path) == 0;
  const uint64_t now = capture::now_ns();
  {
    std::lock_guard<std::mutex> g(st.mu);
    if (!on && !st.capture.load(std::memory_order_relaxed)) return;
    auto& old = st.capture_rings;
    for (size_t i = 0; i < old.size();)
      if (old[i].first.get() != st.capture.load(std::memory_order_relaxed) && now - old[i].second > 1'000'000'000)
        old.erase(old.begin() + long(i));
      else
        i++;
    for (auto& r : old) r.second = now;  // retired now (the current one too)
    st.capture.store(on ? ring.get() : nullptr, std::memory_order_release);
    if (on) old.emplace_back(std::move(ring), UINT64_MAX / 2);
  }
  choose_again(st);
}

uint32_t mtu_bytes(ibv_mtu m) { return m >= IBV_MTU_256 && m <= IBV_MTU_4096 ? 128u << m : 1024u; }

// The addresses of a QP's packets: this port's GID and the peer's (the
// QP's AH), IPv4 when both are IPv4-mapped (RFC 4291 2.5.5.2).
struct Ends {
  uint8_t src[16], dst[16];
  bool v4;
};

Ends ends_of(ProcessQp& q) {
  Ends e{};
  ibv_qp_attr a;
  {
    std::lock_guard<std::mutex> g(q.attr_mu);
    a = q.attr;
  }
  ibv_gid g{};
  if (ibv_query_gid(nullptr, 1, a.ah_attr.grh.sgid_index, &g) != 0) ibv_query_gid(nullptr, 1, 0, &g);
  std::memcpy(e.src, g.raw, 16);
  std::memcpy(e.dst, a.ah_attr.is_global ? a.ah_attr.grh.dgid.raw : g.raw, 16);
  static const uint8_t kMapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  e.v4 = !std::memcmp(e.src, kMapped, 12) && !std::memcmp(e.dst, kMapped, 12);
  return e;
}

// One packet, framed and written into the ring; `back`: the responder's
// (addresses swapped).
void emit(capture::Ring& ring, const Ends& e, bool back, const ro::Packet& p, uint32_t qpn) {
  uint8_t tr[capture::kSlotData];
  const size_t n = ro::build_packet(p, {tr, sizeof tr - 64});
  if (!n) return;
  uint8_t out[capture::kSlotData + 64];
  size_t len;
  const uint8_t* s = back ? e.dst : e.src;
  const uint8_t* d = back ? e.src : e.dst;
  if (e.v4) {
    ro::Ipv4Udp h;
    std::memcpy(h.src.data(), s + 12, 4);
    std::memcpy(h.dst.data(), d + 12, 4);
    h.sport = uint16_t(0xc000 | (qpn & 0x3fff));
    len = ro::frame_ipv4(h, {tr, n}, {out, sizeof out});
  } else {
    ro::Ipv6Udp h;
    std::memcpy(h.src.data(), s, 16);
    std::memcpy(h.dst.data(), d, 16);
    h.sport = uint16_t(0xc000 | (qpn & 0x3fff));
    len = ro::frame_ipv6(h, {tr, n}, {out, sizeof out});
  }
  if (len) ring.write({out, len}, qpn, capture::now_ns());
}

// The bytes of a list of segments, flattened (for packets' payloads).
std::vector<uint8_t> flatten(const Seg* s, int n, uint64_t total) {
  std::vector<uint8_t> v(total);
  uint64_t at = 0;
  for (int i = 0; i < n && at < total; i++) {
    uint64_t k = std::min(s[i].len, total - at);
    if (s[i].p) std::memcpy(v.data() + at, s[i].p, k);
    at += k;
  }
  return v;
}

// What landed in the local scatter list (READ and atomic results).
std::vector<uint8_t> local_result(ProcessQp& q, const shm::SendWqe& w, uint64_t total) {
  Seg segs[shm::kMaxSge];
  int n = 0;
  for (uint32_t i = 0; i < w.num_sge && i < shm::kMaxSge; i++)
    if (!plain_local_segment(q, w.sge[i], true, segs[n++])) segs[n - 1] = {nullptr, w.sge[i].length};
  return flatten(segs, n, total);
}

struct Render {
  capture::Ring& ring;
  ProcessQp& q;
  Ends e;
  uint8_t prefix;  // RC, UC, XRC or UD (IBTA 9.2 table 38's top bits)
  uint32_t dest;
  uint32_t mtu;
  void request(ro::Packet& p) { emit(ring, e, false, p, q.qpn); }
  void response(ro::Packet& p) { emit(ring, e, true, p, q.qpn); }
  uint32_t next_psn() { return q.cap_psn++ & 0xffffff; }
  ro::Packet base(uint8_t opcode) {
    ro::Packet p;
    p.bth.opcode = uint8_t(prefix | opcode);
    p.bth.dest_qp = dest;
    p.xrc_srqn = 0;
    return p;
  }
  void ack(uint32_t psn) {
    if (prefix != ro::op::kRC && prefix != ro::op::kXRC) return;
    ro::Packet a;
    a.bth.opcode = uint8_t(prefix | ro::op::kAck);
    a.bth.dest_qp = q.qpn;
    a.bth.psn = psn;
    a.aeth.syndrome = ro::syndrome_ack();
    a.aeth.msn = ++q.cap_msn & 0xffffff;
    response(a);
  }
};

// A SEND or WRITE of `data`, in MTU pieces (IBTA 9.7.2): RETH on the first,
// ImmDt or IETH on the last.
void message(Render& r, const shm::SendWqe& w, bool write, const std::vector<uint8_t>& data) {
  namespace op = ro::op;
  const bool imm = w.opcode == IBV_WR_SEND_WITH_IMM || w.opcode == IBV_WR_RDMA_WRITE_WITH_IMM;
  const bool inv = w.opcode == IBV_WR_SEND_WITH_INV;
  const size_t len = data.size();
  const size_t pieces = len == 0 ? 1 : (len + r.mtu - 1) / r.mtu;
  uint32_t psn = 0;
  for (size_t i = 0; i < pieces; i++) {
    const bool first = i == 0, last = i + 1 == pieces;
    uint8_t o;
    if (write)
      o = first && last ? (imm ? op::kWriteOnlyImm : op::kWriteOnly)
          : first       ? op::kWriteFirst
          : last        ? (imm ? op::kWriteLastImm : op::kWriteLast)
                        : op::kWriteMiddle;
    else
      o = first && last ? (imm ? op::kSendOnlyImm : inv ? op::kSendOnlyInv : op::kSendOnly)
          : first       ? op::kSendFirst
          : last        ? (imm ? op::kSendLastImm : inv ? op::kSendLastInv : op::kSendLast)
                        : op::kSendMiddle;
    ro::Packet p = r.base(o);
    if (r.prefix == op::kUD) p.bth.opcode = imm ? uint8_t(op::kUD | op::kSendOnlyImm) : uint8_t(op::kUD | op::kSendOnly);
    p.bth.psn = psn = r.next_psn();
    p.bth.ack_req = last && r.prefix != op::kUD && r.prefix != op::kUC;
    p.bth.se = last && (w.send_flags & IBV_SEND_SOLICITED);
    p.reth = {w.remote_addr, w.rkey, uint32_t(len)};
    p.imm = __builtin_bswap32(w.imm_data);
    p.ieth_rkey = w.invalidate_rkey;
    p.deth = {w.ud_qkey, r.q.qpn};
    p.xrc_srqn = w.xrc_srqn;
    p.payload = {data.data() + i * r.mtu, std::min<size_t>(r.mtu, len - i * r.mtu)};
    r.request(p);
  }
  r.ack(psn);
}

void read(Render& r, const shm::SendWqe& w, uint64_t len) {
  namespace op = ro::op;
  ro::Packet p = r.base(op::kReadRequest);
  const size_t pieces = len == 0 ? 1 : (len + r.mtu - 1) / r.mtu;
  p.bth.psn = r.q.cap_psn & 0xffffff;
  p.bth.ack_req = true;
  p.reth = {w.remote_addr, w.rkey, uint32_t(len)};
  p.xrc_srqn = w.xrc_srqn;
  r.request(p);
  const std::vector<uint8_t> data = local_result(r.q, w, len);
  const uint32_t msn = ++r.q.cap_msn & 0xffffff;
  for (size_t i = 0; i < pieces; i++) {
    const bool first = i == 0, last = i + 1 == pieces;
    ro::Packet s;
    s.bth.opcode = uint8_t(r.prefix | (first && last ? op::kReadRespOnly
                                       : first       ? op::kReadRespFirst
                                       : last        ? op::kReadRespLast
                                                     : op::kReadRespMiddle));
    s.bth.dest_qp = r.q.qpn;
    s.bth.psn = r.next_psn();
    s.aeth = {ro::syndrome_ack(), msn};
    s.payload = {data.data() + i * r.mtu, std::min<size_t>(r.mtu, len - i * r.mtu)};
    r.response(s);
  }
}

void atomic(Render& r, const shm::SendWqe& w) {
  namespace op = ro::op;
  ro::Packet p = r.base(w.opcode == IBV_WR_ATOMIC_CMP_AND_SWP ? op::kCompareSwap : op::kFetchAdd);
  p.bth.psn = r.next_psn();
  p.bth.ack_req = true;
  p.atomic = {w.remote_addr, w.rkey, w.opcode == IBV_WR_ATOMIC_CMP_AND_SWP ? w.swap : w.compare_add,
              w.opcode == IBV_WR_ATOMIC_CMP_AND_SWP ? w.compare_add : 0};
  p.xrc_srqn = w.xrc_srqn;
  r.request(p);
  const std::vector<uint8_t> got = local_result(r.q, w, 8);
  uint64_t orig = 0;
  std::memcpy(&orig, got.data(), 8);
  ro::Packet a;
  a.bth.opcode = uint8_t(r.prefix | op::kAtomicAck);
  a.bth.dest_qp = r.q.qpn;
  a.bth.psn = p.bth.psn;
  a.aeth = {ro::syndrome_ack(), ++r.q.cap_msn & 0xffffff};
  a.atomic_ack.orig = orig;
  r.response(a);
}

}  // namespace

Fd capture_watch(ContextState& st) {
  st.capture_path = capture::ring_path(::getuid(), capture::daemon_dir());
  if (st.capture_path.empty()) return Fd();
  Fd fd(::inotify_init1(IN_NONBLOCK | IN_CLOEXEC));
  if (!fd.valid()) return fd;
  if (::inotify_add_watch(fd.get(), "/dev/shm", IN_CREATE | IN_MOVED_TO | IN_DELETE | IN_MOVED_FROM) < 0)
    return Fd();
  refresh(st);
  return fd;
}

void capture_changed(ContextState& st, int inotify_fd) {
  alignas(inotify_event) char buf[4096];
  const std::string mine = ring_name(st.capture_path);
  bool ours = false;
  for (;;) {
    ssize_t n = ::read(inotify_fd, buf, sizeof buf);
    if (n <= 0) break;
    for (ssize_t at = 0; at + ssize_t(sizeof(inotify_event)) <= n;) {
      auto* ev = reinterpret_cast<inotify_event*>(buf + at);
      if (ev->len && mine == ev->name) ours = true;
      if (ev->mask & IN_Q_OVERFLOW) ours = true;
      at += ssize_t(sizeof(inotify_event) + ev->len);
    }
  }
  if (ours) refresh(st);
}

bool capture_on(const ProcessQp& q) { return q.ctx->st->capture.load(std::memory_order_acquire) != nullptr; }

void capture_request(ProcessQp& q, const shm::SendWqe& w, const Outcome& o) {
  capture::Ring* ring = q.ctx->st->capture.load(std::memory_order_acquire);
  if (!ring || o.step != Step::kDone || o.status != IBV_WC_SUCCESS) return;
  const WrKind kind = wr_rule(w.opcode).kind;
  if (kind == WrKind::kLocal) return;
  ibv_mtu mtu;
  uint32_t dest;
  {
    std::lock_guard<std::mutex> g(q.attr_mu);
    mtu = q.attr.path_mtu;
    dest = q.attr.dest_qp_num;
    if (!q.cap_started) q.cap_psn = q.attr.sq_psn, q.cap_started = true;
  }
  uint8_t prefix = q.type == IBV_QPT_UC ? ro::op::kUC : q.type == IBV_QPT_UD ? ro::op::kUD
                   : q.type == IBV_QPT_XRC_SEND ? ro::op::kXRC : ro::op::kRC;
  if (q.type == IBV_QPT_UD) dest = w.ud_qpn, mtu = IBV_MTU_4096;
  Render r{*ring, q, ends_of(q), prefix, dest, mtu_bytes(mtu)};
  if (w.opcode == IBV_WR_RDMA_READ) return read(r, w, [&] {
    uint64_t t = 0;
    for (uint32_t i = 0; i < w.num_sge; i++) t += w.sge[i].length;
    return t;
  }());
  if (w.opcode == IBV_WR_ATOMIC_CMP_AND_SWP || w.opcode == IBV_WR_ATOMIC_FETCH_AND_ADD) return atomic(r, w);
  if (w.opcode != IBV_WR_SEND && w.opcode != IBV_WR_SEND_WITH_IMM && w.opcode != IBV_WR_SEND_WITH_INV &&
      w.opcode != IBV_WR_RDMA_WRITE && w.opcode != IBV_WR_RDMA_WRITE_WITH_IMM)
    return;  // FLUSH, ATOMIC WRITE: not rendered
  Seg segs[shm::kMaxSge + 1];
  int n = 0;
  uint64_t total = 0;
  ibv_wc_status err;
  std::vector<uint8_t> data;
  if (gather(q, w, segs, n, total, err)) data = flatten(segs, n, total);
  message(r, w, w.opcode == IBV_WR_RDMA_WRITE || w.opcode == IBV_WR_RDMA_WRITE_WITH_IMM, data);
}

roce::UdpEndpoint::Tap capture_tap(ContextState& st, uint32_t qpn) {
  roce::UdpEndpoint::Tap t;
  t.want = [](void* arg) { return static_cast<ContextState*>(arg)->capture.load(std::memory_order_relaxed) != nullptr; };
  t.put = [](void* arg, std::span<const uint8_t> ip, uint32_t qpn) {
    if (capture::Ring* ring = static_cast<ContextState*>(arg)->capture.load(std::memory_order_acquire))
      ring->write(ip, qpn, capture::now_ns());
  };
  t.arg = &st;
  t.qpn = qpn;
  return t;
}

}  // namespace sv::verbs
