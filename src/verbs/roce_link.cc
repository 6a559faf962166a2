#include "verbs/roce_link.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <poll.h>
#include <sched.h>
#include <fcntl.h>
#include <netinet/udp.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>

#include "common/access.h"
#include "common/responder_core.h"
#include "common/mgid.h"
#include "common/started_thread.h"
#include "common/port_holder.h"
#include "common/trace.h"
#include "roce/engine.h"
#include "roce/udp.h"
#include "verbs/capture.h"
#include "verbs/fault_ops.h"
#include "verbs/provider.h"
#include "verbs/roce_memory.h"
#include "verbs/roce_engine_io.h"
#include "verbs/roce_netdev.h"
#include "verbs/roce_stats.h"
#include "verbs/roce_xrc.h"
#include "verbs/wr_rules.h"

namespace sv::verbs {
namespace {

using namespace sv::roce;

using Gid = std::array<uint8_t, 16>;

uint32_t mtu_bytes(ibv_mtu m) { return (m >= IBV_MTU_256 && m <= IBV_MTU_4096) ? 128u << m : 1024; }

// Where the engine's packets go: the QP's endpoint, or for a UD QP's
// destination of the other address family (an IPv6 group or GID of a QP
// that listens on the IPv4 GID) its second endpoint, whose address handles
// carry kOther.
class RouteSink : public PacketSink {
 public:
  static constexpr uint64_t kOther = uint64_t(1) << 48;
  UdpEndpoint* first = nullptr;
  UdpEndpoint* other = nullptr;
  void send(uint64_t ah, std::span<const uint8_t> p) override { to(ah)->send(ah & ~kOther, p); }
  void send_gather(uint64_t ah, std::span<const uint8_t> headers,
                   std::span<const std::span<const uint8_t>> payload) override {
    to(ah)->send_gather(ah & ~kOther, headers, payload);
  }

 private:
  UdpEndpoint* to(uint64_t ah) { return (ah & kOther) && other ? other : first; }
};

struct RoceQp;
void publish_error(RoceQp& r);

struct RoceQp {
  ProcessQp* q;
  Gid sgid{};
  OwnMemory mem;
  XrcTargetSrqs xrc;
  CqSink sink;
  RingRecvSource recvs;
  std::unique_ptr<UdpEndpoint> ep;
  std::unique_ptr<UdpEndpoint> ep2;  // UD: on the first GID of the other family, for sending (attach_other)
  RouteSink route;
  std::unique_ptr<roce::EngineQp> engine;
  roce::QpConfig cfg;
  std::map<Gid, uint64_t> ahs;  // UD destinations -> endpoint address handles
  uint32_t wire_mtu = 1024;
  uint64_t inline_next = 0;
  bool error_reported = false;
  bool error_published = false;  // the daemon's table says ERR (publish_error)
  int ep_fd = -1;  // the endpoint's socket (owned by it)
  uint64_t ack_due = 0;  // a held ACK goes by then (Hub::kAckHold)
  explicit RoceQp(ProcessQp& s)
      : q(&s), mem(s, s.pd ? s.pd->handle : 0),
        xrc(s, [&s](uint32_t pd) { return std::make_unique<OwnMemory>(s, pd); }), sink(s, &xrc), recvs(s) {
    sink.before_error = [this] { publish_error(*this); };
  }
  // The endpoint for datagrams of address family `fam`.
  UdpEndpoint& ep_for(int fam) { return ep2 && ep->family() != fam ? *ep2 : *ep; }
  void flush_delayed(bool all = false) {
    ep->flush_delayed(all);
    if (ep2) ep2->flush_delayed(all);
  }
  // What a pass of the engine sent goes out; its counts go to the QP's
  // segment (`rdma statistic show`).
  void flush_tx() {
    ep->flush_tx();
    if (ep2) ep2->flush_tx();
    if (engine && q->hdr) publish_wire_counters(*q->hdr, engine->stats());
  }
  uint64_t next_delayed() const { return std::min(ep->next_delayed(), ep2 ? ep2->next_delayed() : UINT64_MAX); }
};

// SOFTVERBS_TEST_SLOW_ERROR=US: the daemon's call waits US microseconds
// first, the window a loaded machine opens, made certain (roce.wire.xrc_peer
// runs so). Read once; a rare path.
const unsigned g_slow_error_us = [] {
  const char* e = std::getenv("SOFTVERBS_TEST_SLOW_ERROR");
  return e ? unsigned(std::strtoul(e, nullptr, 10)) : 0u;
}();

// The engine went to the error state by itself (a fatal completion error,
// IBTA 10.3.1): the daemon's QP table follows, so that ibv_query_qp and
// post_recv see ERR. Done before the first completion in error is pushed
// (CqSink::before_error), so that a program that polls it and then asks
// ibv_query_qp is told ERR, never the state before (roce.wire.xrc_peer
// asked so and was told RTS once in CI). Called with the hub lock held
// (lock order: hub, then the connection).
void publish_error(RoceQp& r) {
  if (r.error_published || !r.engine || r.engine->state() != roce::EngineState::kError) return;
  r.error_published = true;
  if (g_slow_error_us) ::usleep(g_slow_error_us);
  ProcessQp& q = *r.q;
  proto::ModifyQpReq req{};
  req.qpn = q.qpn;
  req.attr_mask = IBV_QP_STATE;
  req.qp_state = IBV_QPS_ERR;
  switch (r.engine->responder_fault()) {  // the responder's affiliated event (IBTA 11.6.3.1)
    case roce::WcStatus::kRemInvReqErr: req.responder_status = IBV_WC_REM_INV_REQ_ERR; break;
    case roce::WcStatus::kRemAccessErr: req.responder_status = IBV_WC_REM_ACCESS_ERR; break;
    case roce::WcStatus::kRemOpErr: req.responder_status = IBV_WC_REM_OP_ERR; break;
    default: break;
  }
  proto::Empty rep{};
  q.ctx->st->conn.call<proto::Op::ModifyQp>(req, rep);
  {
    std::lock_guard<std::mutex> g(q.attr_mu);  // ibv_modify_qp writes ibv_qp::state under it too
    q.attr.qp_state = IBV_QPS_ERR;
    q.self->qpx.qp_base.state = IBV_QPS_ERR;
  }
}

// Then, once the engine's own completions are out, what waits in the
// receive ring is flushed after them.
void report_error(RoceQp& r) {
  if (r.error_reported || !r.engine || r.engine->state() != roce::EngineState::kError) return;
  r.error_reported = true;
  publish_error(r);
  ProcessQp& q = *r.q;
  if (!q.srq && q.type != IBV_QPT_XRC_RECV) flush_rq(q);  // an XRC target has no receive queue
  SV_TRACE("roce: QP %u: transport error, now in ERR", q.qpn);
}

// What one daemon connection (context) gave this process: its arrival
// socket (datagrams the daemon forwards) and the sockets the daemon steers
// this process's QPNs to (one per local address in use; each distinct
// socket once, by inode). Closed together when the daemon closes the
// arrival socket, since the daemon may then give those sockets to others.
struct ConnSocks {
  Fd arrival;
  std::vector<std::pair<ino_t, Fd>> steered;
};

// All RoCE QPs of this process and the thread that serves their arrivals
// and timers.
//
// Who receives: the RoCE thread sleeps in poll() on the sockets; a thread
// that polls a wire CQ (ibv_poll_cq) and finds it empty receives and runs
// the engines itself (roce_poll), which on a busy poller's CPU costs no
// wake-up (ib_send_lat, ib_write_bw's requester). After traffic the RoCE
// thread looks again without sleeping for a short while (spin_ns), so that
// a stream of datagrams does not cost a wake-up each.
struct Hub {
  std::mutex mu;
  std::map<uint32_t, std::unique_ptr<RoceQp>> qps;  // by QPN
  std::map<ContextState*, ConnSocks> conns;          // one per daemon connection
  SteadyClock clock;
  Fd wake{::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)};
  bool started = false;
  // SOFTVERBS_ROCE_GSO=0: one datagram per send and no UDP GRO (captures
  // then show each packet as the wire of a NIC would).
  const bool gso = [] {
    const char* e = std::getenv("SOFTVERBS_ROCE_GSO");
    return !(e && std::strcmp(e, "0") == 0);
  }();
  std::atomic<uint64_t> sleep_until{0};  // ns: when the RoCE thread wakes at the latest
  std::atomic<uint64_t> last_app_poll{0};  // ns: the last roce_poll of an application thread
  // While an application thread polls a wire CQ (roce_poll within
  // kPollerGone), it receives: the RoCE thread keeps off the sockets (a
  // wake-up per datagram would take the CPU from the poller, on 2 vCPUs)
  // and only naps (kPollerNap) for timers and held ACKs, and to notice the
  // poller gone. Arming a CQ for an event ends that at once.
  static constexpr uint64_t kPollerGone = 200'000;  // ns
  static constexpr uint64_t kPollerNap = 100'000;   // ns
  // SOFTVERBS_ROCE_SPIN_US (default 20): how long the RoCE thread keeps
  // looking after traffic before it sleeps again.
  const uint64_t spin_ns = [] {
    const char* e = std::getenv("SOFTVERBS_ROCE_SPIN_US");
    return (e ? std::strtoull(e, nullptr, 10) : 20) * 1000;
  }();
  std::vector<uint8_t> buf = std::vector<uint8_t>(65536 + sizeof(proto::RoceArrival));
  // recvmmsg batches on the steered sockets. A slot takes a whole UDP GRO
  // train (the datagrams of one GSO send), so a batch of 4 brings up to
  // 256 KiB: small enough that the kernel's copy is still in the L2 cache
  // when the ICRC check and the copy into the MR read it. (32 slots, 2 MiB,
  // made all three miss: at MTU 9000 1 MiB ib_write_bw went from about
  // 2.6 to 3.4 GB/s with 4.)
  static constexpr int kBatch = 4;
  static constexpr size_t kSlot = 65536;
  std::vector<uint8_t> rxbuf;  // kBatch * kSlot, on first use (not for local-only processes)
  std::array<sockaddr_storage, kBatch> rxfrom{};
  std::array<iovec, kBatch> rxiov{};
  std::array<mmsghdr, kBatch> rxmsg{};
  struct CmsgBuf {
    alignas(cmsghdr) char buf[CMSG_SPACE(sizeof(int))];
  };
  std::array<CmsgBuf, kBatch> rxcmsg{};

  void kick() { eventfd_signal(wake.get()); }

  // The RoCE thread must wake by `deadline` (a new timer): kick it only if
  // it sleeps longer (an eventfd write per post would cost a wake-up each).
  void wake_by(uint64_t deadline) {
    if (deadline < sleep_until.load(std::memory_order_relaxed)) kick();
  }

  void deliver_one(const sockaddr* from, socklen_t fl, const uint8_t* dg, size_t len, uint16_t ipv4_id = 0) {
    if (len < kBthLen + kIcrcLen) return;
    const uint32_t dqpn = uint32_t(dg[5]) << 16 | uint32_t(dg[6]) << 8 | dg[7];
    auto it = qps.find(dqpn);
    if (it == qps.end() || !it->second->engine) return;
    it->second->ep_for(from->sa_family).deliver(from, fl, dg, len, ipv4_id);
    if (it->second->engine->ack_urgent()) urgent.push_back(it->second.get());
  }

  // A stream's ACK goes as soon as a quarter window has come (see
  // EngineQp::ack_urgent), not after the batch and the hold: the requester would
  // otherwise sit on a full window while we drain it.
  std::vector<RoceQp*> urgent;
  void send_urgent_acks() {
    for (RoceQp* r : urgent) {
      if (!r->engine->ack_urgent()) continue;
      r->engine->flush_ack();
      r->ack_due = 0;
      r->flush_tx();
    }
    urgent.clear();
  }

  // Delivers what waits on arrival socket `fd`; returns how many datagrams.
  int drain(int fd) {
    int got = 0;
    for (int budget = 0; budget < 1024; ++budget) {
      ssize_t n = ::recv(fd, buf.data(), buf.size(), MSG_DONTWAIT);
      if (n < 0) break;
      if (size_t(n) < sizeof(proto::RoceArrival) + kBthLen + kIcrcLen) continue;
      proto::RoceArrival a;
      std::memcpy(&a, buf.data(), sizeof a);
      if (a.from_len > sizeof a.from) continue;
      sockaddr_storage from{};
      std::memcpy(&from, a.from, a.from_len);
      if (a.to_len) {
        // A multicast datagram the daemon received for the group and copied
        // to each member: this one is for our QP a.qpn.
        if (a.to_len > sizeof a.to) continue;
        sockaddr_storage to{};
        std::memcpy(&to, a.to, a.to_len);
        auto it = qps.find(a.qpn & 0xffffff);
        if (it != qps.end() && it->second->engine)
          it->second->ep_for(from.ss_family).deliver_multicast(reinterpret_cast<sockaddr*>(&from), a.from_len,
                                            reinterpret_cast<sockaddr*>(&to), a.to_len, a.qpn & 0xffffff,
                                            buf.data() + sizeof a, size_t(n) - sizeof a);
        ++got;
        continue;
      }
      deliver_one(reinterpret_cast<sockaddr*>(&from), a.from_len, buf.data() + sizeof a, size_t(n) - sizeof a);
      if (!urgent.empty()) send_urgent_acks();
      ++got;
    }
    return got;
  }

  // Delivers what waits on steered UDP socket `fd` (recvmmsg batches).
  int drain_udp(int fd) {
    if (rxbuf.empty()) rxbuf.resize(kBatch * kSlot);
    int got = 0;
    for (int round = 0; round < 32; ++round) {
      for (int i = 0; i < kBatch; ++i) {
        rxiov[i] = {rxbuf.data() + size_t(i) * kSlot, kSlot};
        rxmsg[i].msg_hdr = msghdr{};
        rxmsg[i].msg_hdr.msg_name = &rxfrom[i];
        rxmsg[i].msg_hdr.msg_namelen = sizeof rxfrom[i];
        rxmsg[i].msg_hdr.msg_iov = &rxiov[i];
        rxmsg[i].msg_hdr.msg_iovlen = 1;
        rxmsg[i].msg_hdr.msg_control = rxcmsg[i].buf;
        rxmsg[i].msg_hdr.msg_controllen = sizeof rxcmsg[i].buf;
      }
      int n = ::recvmmsg(fd, rxmsg.data(), kBatch, MSG_DONTWAIT, nullptr);
      if (n <= 0) break;
      for (int i = 0; i < n; ++i) {
        const msghdr& m = rxmsg[i].msg_hdr;
        if (m.msg_flags & MSG_TRUNC) continue;
        // UDP GRO (enabled on the socket): a train of datagrams of gso_size
        // bytes each (the last may be shorter), as the sender's GSO send.
        size_t seg = rxmsg[i].msg_len;
        for (cmsghdr* c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(const_cast<msghdr*>(&m), c)) {
          if (c->cmsg_level == SOL_UDP && c->cmsg_type == UDP_GRO) {
            int g;
            std::memcpy(&g, CMSG_DATA(c), sizeof g);
            if (g > 0) seg = size_t(g);
          }
        }
        const uint8_t* p = static_cast<uint8_t*>(rxiov[i].iov_base);
        uint16_t k = 0;  // the k-th datagram of a GSO send went with IPv4 ID k
        for (size_t off = 0; off < rxmsg[i].msg_len; off += seg, ++k)
          deliver_one(reinterpret_cast<sockaddr*>(&rxfrom[i]), m.msg_namelen, p + off,
                      std::min(seg, size_t(rxmsg[i].msg_len) - off), k);
        if (!urgent.empty()) send_urgent_acks();
      }
      got += n;
      if (n < kBatch) break;
    }
    return got;
  }

  // `polled`: what ppoll just said, if it watched the arrival sockets for
  // input. With steered sockets, the daemon's arrival socket is nearly
  // always empty (datagrams come to it only before a QP's steering is in
  // place): it is read when ppoll says it is readable, else one turn in
  // eight, instead of a system call that finds nothing on every turn.
  unsigned drain_turn = 0;
  int drain_all(const std::vector<pollfd>* polled = nullptr) {
    int got = 0;
    ++drain_turn;
    for (auto& [cs, c] : conns) {
      for (auto& [ino, fd] : c.steered) got += drain_udp(fd.get());
      if (!c.arrival.valid()) continue;
      bool read = c.steered.empty() || (drain_turn & 7) == 0;
      if (!read && polled) {
        for (const pollfd& p : *polled) {
          if (p.fd == c.arrival.get()) read = !(p.events & POLLIN) || (p.revents & POLLIN);
        }
      }
      if (read) got += drain(c.arrival.get());
    }
    return got;
  }

  // ACKs are held up to kAckHold after the packets that asked for them, so
  // that an answer the application posts meanwhile carries them in the same
  // sendmmsg, after it (ib_write_lat: the peer, polling its CQ for the ACK,
  // has our WRITE in memory when it sees it, and needs no wake-up of its
  // RoCE thread). The requester's window (256 packets) outlasts the hold
  // many times over.
  static constexpr uint64_t kAckHold = 20'000;

  void progress_all() {
    const uint64_t now = clock.now_ns();
    for (auto& [qpn, r] : qps) {
      if (!r->engine) continue;
      r->flush_delayed();
      r->engine->progress(r->ack_due != 0 && now >= r->ack_due);
      if (!r->engine->ack_pending()) r->ack_due = 0;
      else if (r->ack_due == 0) r->ack_due = now + kAckHold;
      r->flush_delayed();
      r->flush_tx();
      report_error(*r);
    }
  }

  uint64_t next_deadline() {
    uint64_t next = UINT64_MAX;
    for (auto& [qpn, r] : qps) {
      if (!r->engine) continue;
      next = std::min({next, r->engine->next_deadline(), r->next_delayed()});
      if (r->ack_due) next = std::min(next, r->ack_due);
    }
    return next;
  }

  void run() {
    std::unique_lock<std::mutex> lk(mu);
    std::vector<pollfd> pfds;
    uint64_t spin_until = 0;  // after traffic, look again without sleeping until then
    for (;;) {
      const uint64_t now = clock.now_ns();
      const bool poller = now - last_app_poll.load(std::memory_order_relaxed) < kPollerGone;
      pfds.clear();
      pfds.push_back({wake.get(), POLLIN, 0});
      for (auto& [cs, c] : conns) {
        pfds.push_back({c.arrival.get(), short(poller ? 0 : POLLIN), 0});  // POLLHUP comes anyway
        if (poller) continue;
        for (auto& [ino, fd] : c.steered) pfds.push_back({fd.get(), POLLIN, 0});
      }
      uint64_t next = std::min(next_deadline(), now + (poller ? kPollerNap : 20'000'000));
      if (!poller && now < spin_until) next = now;
      sleep_until.store(next, std::memory_order_relaxed);
      timespec ts{time_t((next > now ? next - now : 0) / 1'000'000'000), long((next > now ? next - now : 0) % 1'000'000'000)};
      lk.unlock();
      for (;;) {
        ::ppoll(pfds.data(), pfds.size(), &ts, nullptr);
        if (!poller) {
          lk.lock();
          break;
        }
        // A poller holding the lock is doing the work: do not queue behind
        // it (its unlock would then cost it a futex wake each time).
        if (lk.try_lock()) break;
        uint64_t v;
        while (::read(wake.get(), &v, sizeof v) > 0) {
        }
        ts = timespec{0, long(kPollerNap)};
      }
      sleep_until.store(0, std::memory_order_relaxed);
      if (pfds[0].revents & POLLIN) {
        uint64_t v;
        while (::read(wake.get(), &v, sizeof v) > 0) {
        }
      }
      for (size_t i = 1; i < pfds.size(); ++i) {
        if (pfds[i].revents & (POLLHUP | POLLERR)) {
          // The daemon closed the arrival socket (the context was closed, or
          // the daemon died): stop polling it, or poll() would return at once
          // for ever, and drop the steered sockets of that connection.
          for (auto c = conns.begin(); c != conns.end(); ++c) {
            if (c->second.arrival.get() == pfds[i].fd) {
              conns.erase(c);
              break;
            }
          }
        }
      }
      // A poller still at it receives and sends itself (roce_poll): unless a
      // timer or a held ACK is due, keep off. Taking the work over after
      // each nap made two threads of one process run it in turns (the
      // poller yielding on the lock): a third runnable thread on 2 vCPUs.
      if (poller && clock.now_ns() - last_app_poll.load(std::memory_order_relaxed) < kPollerGone &&
          next_deadline() > clock.now_ns())
        continue;
      if (drain_all(&pfds) > 0) spin_until = clock.now_ns() + spin_ns;
      progress_all();
    }
  }
};

Hub& hub() {
  static Hub* h = new Hub;  // lives until exit; its thread is detached
  return *h;
}

// Our own socket `fd` of an address's reuseport group (kRoceSteered): the
// RoCE thread and CQ pollers receive on it (a copy: the endpoint owns the
// one it sends on), once per distinct socket.
void receive_on(Hub& h, ContextState& cs, int fd) {
  ConnSocks& c = h.conns[&cs];
  struct stat st {};
  if (::fstat(fd, &st) != 0) return;
  for (auto& [ino, s] : c.steered) {
    if (ino == st.st_ino) return;
  }
  Fd mine(::fcntl(fd, F_DUPFD_CLOEXEC, 0));
  // Trains of datagrams from GSO senders arrive whole (one recvmmsg entry
  // each) instead of being cut by the kernel first.
  int one = 1;
  if (h.gso) ::setsockopt(mine.get(), SOL_UDP, UDP_GRO, &one, sizeof one);
  c.steered.emplace_back(st.st_ino, std::move(mine));
  h.kick();
}

// A UD QP also sends from the first GID of the other address family (an
// IPv6 one after the IPv4 index 1), so that its datagrams to IPv6 GIDs and
// groups go on the wire (docs/ROCE.md, "Multicast"): a second RoceAttach
// (kRoceSecondAddress), whose socket is ours in that address's reuseport
// group, the QPN steered to it too (else the daemon's, and what arrives
// there for the QP is forwarded). Best effort: without it those
// destinations stay local.
void attach_other(Hub& h, ProcessQp& q, RoceQp& r) {
  static const uint8_t mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  const bool v4 = std::memcmp(r.sgid.data(), mapped, 12) == 0;
  for (int i = 1; i < int(kGidTableLen); ++i) {
    ibv_gid g{};
    if (ibv_query_gid(q.self->qpx.qp_base.context, 1, i, &g) != 0) return;
    static const uint8_t zero[16] = {};
    if (std::memcmp(g.raw, zero, 16) == 0) return;
    if ((std::memcmp(g.raw, mapped, 12) == 0) == v4 || (g.raw[0] == 0xfe && (g.raw[1] & 0xc0) == 0x80)) continue;
    proto::RoceAttachReq req{};
    req.qpn = q.qpn;
    req.flags = proto::kRoceSecondAddress;
    std::memcpy(req.sgid, g.raw, 16);
    proto::RoceAttachReply rep{};
    std::vector<Fd> fds;
    if (q.ctx->st->conn.call<proto::Op::RoceAttach>(req, rep, {}, &fds) || fds.empty()) return;
    auto ep = std::make_unique<UdpEndpoint>(h.clock, faults_of(rep, q.qpn));
    const int fd = fds[0].get();
    if (ep->adopt(fds[0].release(), kRoceV2Port) != 0 || ep->family() == r.ep->family()) return;
    if (rep.flags & proto::kRoceSteered) receive_on(h, *q.ctx->st, fd);
    ep->set_accept_any_ipv4_id(true);
    ep->set_batching(true);
    ep->set_gso(h.gso);
    ep->set_tap(capture_tap(*q.ctx->st, q.qpn));
    r.wire_mtu = std::min(r.wire_mtu, wire_mtu_for(g.raw));
    r.ep2 = std::move(ep);
    return;
  }
}

// RoceAttach: this process's socket on the address of `sgid` (steered:
// in the port's group; else for sending only), and this connection's
// arrival socket. Called with the hub lock held.
int attach(Hub& h, ProcessQp& q, const uint8_t* sgid, std::unique_ptr<RoceQp>& out) {
  ContextState& cs = *q.ctx->st;
  proto::RoceAttachReq req{};
  req.qpn = q.qpn;
  std::memcpy(req.sgid, sgid, 16);
  proto::RoceAttachReply rep{};
  std::vector<Fd> fds;
  if (int e = cs.conn.call<proto::Op::RoceAttach>(req, rep, {}, &fds)) return e;
  const FaultConfig f = faults_of(rep, q.qpn);
  auto r = std::make_unique<RoceQp>(q);
  r->ep = std::make_unique<UdpEndpoint>(h.clock, f);
  r->ep_fd = fds[0].get();
  // Unsteered, the socket only sends (from a port of its own): what comes
  // to 4791 for the QP is forwarded on the arrival socket.
  if (int e = r->ep->adopt(fds[0].release(), kRoceV2Port)) return e;
  r->ep->set_accept_any_ipv4_id(true);
  r->ep->set_tap(capture_tap(cs, q.qpn));  // `softverbs capture` (capture.h)
  r->ep->set_batching(true);  // one sendmmsg per call into the engine
  r->ep->set_gso(h.gso);  // rxe's IPv4 packets carry an IP ID (docs/ROCE.md)
  std::memcpy(r->sgid.data(), sgid, 16);
  r->wire_mtu = wire_mtu_for(sgid);
  // One arrival socket per daemon connection. A ContextState at the address
  // of a closed one is a new connection with a new socket: compare inodes.
  auto a = h.conns.find(&cs);
  struct stat now {}, had {};
  if (a == h.conns.end() || ::fstat(fds[1].get(), &now) != 0 || ::fstat(a->second.arrival.get(), &had) != 0 ||
      now.st_ino != had.st_ino) {
    ConnSocks c;
    c.arrival = std::move(fds[1]);
    h.conns[&cs] = std::move(c);
    h.kick();
  }
  if (rep.flags & proto::kRoceSteered) receive_on(h, cs, r->ep_fd);
  // (An XRC target has no CQs: its SRQs' are marked as it finds them.)
  if (q.send_cq) q.send_cq->st->wire.store(true, std::memory_order_relaxed);
  if (q.recv_cq) q.recv_cq->st->wire.store(true, std::memory_order_relaxed);
  if (!h.started) {
    h.started = true;
    started_thread([&h] { h.run(); }).detach();
  }
  out = std::move(r);
  return 0;
}

// Where a connected QP's request acts at the responder: the RETH's fields,
// an atomic's AtomicETH, a FLUSH's (wr_rules.h: flush_fields).
void remote_fields(const ibv_send_wr* wr, uint32_t op, SendWr& s) {
  if (wr_rule(op).kind == WrKind::kFlush) {
    const FlushFields f = flush_fields(wr->wr.atomic.remote_addr, wr->wr.atomic.rkey, wr->wr.atomic.compare_add,
                                       wr->wr.atomic.swap);
    s.remote_addr = f.addr;
    s.rkey = f.rkey;
    s.placement = f.placement;
    s.level = f.level;
    s.flush_len = uint32_t(f.len);  // validate_wr: a range's length fits the RETH
  } else if (wr_rule(op).kind == WrKind::kAtomic) {
    s.remote_addr = wr->wr.atomic.remote_addr;
    s.rkey = wr->wr.atomic.rkey;
    s.compare_add = wr->wr.atomic.compare_add;
    s.swap = wr->wr.atomic.swap;
  } else {
    s.remote_addr = wr->wr.rdma.remote_addr;
    s.rkey = wr->wr.rdma.rkey;
  }
}

// The engine's form of a work request validate_wr() accepted: inline data
// copied into a staging slot, a UD destination as an endpoint peer. 0 or
// EINVAL (an address the endpoint cannot reach).
int to_engine_wr(ProcessQp& q, RoceQp& r, const ibv_send_wr* wr, SendWr& s) {
  const uint32_t op = opcode_of(wr);
  s.opcode = wr_rule(op).wire;
  const bool local_op = wr_rule(op).kind == WrKind::kLocal;
  s.wr_id = wr->wr_id;
  s.signaled = q.sq_sig_all || (wr->send_flags & IBV_SEND_SIGNALED);
  s.solicited = wr->send_flags & IBV_SEND_SOLICITED;
  s.fence = wr->send_flags & IBV_SEND_FENCE;
  // imm_data is the wire's 4 bytes as they lie in memory (__be32); the
  // engine holds ImmDt as those bytes read big-endian (headers.h).
  s.imm = ntohl(wr->imm_data);
  s.invalidate_rkey = wr->invalidate_rkey;
  if (local_op) {
    if (op == IBV_WR_BIND_MW) {
      const ibv_mw_bind_info& b = wr->bind_mw.bind_info;
      s.bind.mw_handle = wr->bind_mw.mw->handle;
      s.bind.rkey = wr->bind_mw.rkey;
      s.bind.mr_lkey = b.mr ? b.mr->lkey : 0;
      s.bind.access = b.mw_access_flags;
      s.bind.addr = b.addr;
      s.bind.length = b.length;
    }
  } else if (op == IBV_WR_ATOMIC_WRITE && (wr->send_flags & IBV_SEND_INLINE)) {
    // Its 8 bytes (validate_wr counted them) travel in the WR itself.
    uint8_t v[8] = {};
    uint64_t off = 0;
    for (int i = 0; i < wr->num_sge && off + wr->sg_list[i].length <= 8; ++i) {
      std::memcpy(v + off, reinterpret_cast<const void*>(wr->sg_list[i].addr), wr->sg_list[i].length);
      off += wr->sg_list[i].length;
    }
    std::memcpy(&s.compare_add, v, 8);
  } else if ((wr->send_flags & IBV_SEND_INLINE) && op != IBV_WR_RDMA_READ) {
    // Copied now (ibv_post_send(3): the buffer may be reused at once) into
    // a staging slot, which lives until the WR has surely retired: the
    // engine holds at most max_send_wr WRs and there are one more slots.
    uint64_t total = 0;
    for (int i = 0; i < wr->num_sge; ++i) total += wr->sg_list[i].length;
    const size_t slot = std::max<uint32_t>(q.cap.max_inline_data, 1);
    if (total > slot) return EINVAL;
    uint8_t* p = r.mem.inline_slab.data() + (r.inline_next++ % (q.cap.max_send_wr + 1)) * slot;
    uint64_t off = 0;
    for (int i = 0; i < wr->num_sge; ++i) {
      std::memcpy(p + off, reinterpret_cast<const void*>(wr->sg_list[i].addr), wr->sg_list[i].length);
      off += wr->sg_list[i].length;
    }
    if (total) s.sg.push_back({uint64_t(reinterpret_cast<uintptr_t>(p)), uint32_t(total), 0});
  } else {
    for (int i = 0; i < wr->num_sge; ++i)
      s.sg.push_back({wr->sg_list[i].addr, wr->sg_list[i].length, wr->sg_list[i].lkey});
  }
  // XRC: the responder's XRC SRQ, in every request's XRCETH (IBTA annex A14).
  if (q.type == IBV_QPT_XRC_SEND) s.xrc_srqn = wr->qp_type.xrc.remote_srqn & 0xffffff;
  if (q.type == IBV_QPT_UD) {
    const Ah* ah = reinterpret_cast<const Ah*>(wr->wr.ud.ah);
    Gid dg;
    std::memcpy(dg.data(), ah->attr.grh.dgid.raw, 16);
    auto a = r.ahs.find(dg);
    if (a == r.ahs.end()) {
      static const uint8_t mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
      UdpEndpoint& ep = r.ep_for(std::memcmp(dg.data(), mapped, 12) == 0 ? AF_INET : AF_INET6);
      uint64_t ah = ep.add_peer(gid_to_ip(dg.data()), kRoceV2Port);
      if (ah != UINT64_MAX && &ep != r.ep.get()) ah |= RouteSink::kOther;
      a = r.ahs.emplace(dg, ah).first;
    }
    if (a->second == UINT64_MAX) return EINVAL;  // IPv4 source, IPv6 destination or the reverse
    s.ah = a->second;
    s.remote_qpn = wr->wr.ud.remote_qpn & 0xffffff;
    s.remote_qkey = wr->wr.ud.remote_qkey;
  } else {
    remote_fields(wr, op, s);
  }
  return 0;
}

}  // namespace

bool roce_attached(const ProcessQp& q) { return q.on_wire.load(std::memory_order_acquire); }

int roce_on_modify(ProcessQp& q, const ibv_qp_attr& attr, int mask, ibv_qp_state next) {
  Hub& h = hub();
  if (next == IBV_QPS_RESET) {
    roce_detach(q);
    return 0;
  }
  std::lock_guard<std::mutex> g(h.mu);
  auto it = h.qps.find(q.qpn);
  RoceQp* r = (it != h.qps.end() && it->second->q == &q) ? it->second.get() : nullptr;
  if (next == IBV_QPS_ERR) {
    if (r && r->engine) {
      r->error_reported = true;  // the application's own modify
      r->error_published = true;
      r->engine->flush_ack();    // what completed here is acknowledged first
      r->flush_tx();
      r->engine->set_error();
    }
    return 0;
  }
  if (next == IBV_QPS_RTR && !r) {
    uint8_t sgid[16] = {};
    if (q.type == IBV_QPT_UD) {
      // A UD QP has no address vector: it listens on the first address of
      // the GID table after loopback (index 1); messages to local GIDs
      // keep the shared-memory path.
      ibv_gid g1{};
      if (ibv_query_gid(q.self->qpx.qp_base.context, 1, 1, &g1) != 0) return 0;
      std::memcpy(sgid, g1.raw, 16);
    } else {
      if (!(mask & IBV_QP_AV) || !attr.ah_attr.is_global || gid_is_local(attr.ah_attr.grh.dgid.raw)) return 0;
      ibv_gid s{};
      if (ibv_query_gid(q.self->qpx.qp_base.context, 1, attr.ah_attr.grh.sgid_index, &s) != 0) return EINVAL;
      std::memcpy(sgid, s.raw, 16);
    }
    std::unique_ptr<RoceQp> nr;
    if (int e = attach(h, q, sgid, nr)) {
      // UD without a RoCE port stays a local-only QP.
      if (q.type == IBV_QPT_UD) return 0;
      SV_TRACE("roce: QP %u: no RoCEv2 port: %s", q.qpn, std::strerror(e));
      explain_no_wire(e, q.ctx->st->conn.dir(), sgid);
      return e;
    }
    if (q.type == IBV_QPT_UD) attach_other(h, q, *nr);
    roce::QpConfig& c = nr->cfg;
    c.type = engine_type(q.type);
    c.qpn = q.qpn;
    c.pmtu = q.type == IBV_QPT_UD ? nr->wire_mtu : std::min(mtu_bytes(attr.path_mtu), nr->wire_mtu);
    c.rq_psn = attr.rq_psn;
    c.access = uint32_t(attr.qp_access_flags);
    c.min_rnr_timer = attr.min_rnr_timer;
    c.max_dest_rd_atomic = attr.max_dest_rd_atomic ? attr.max_dest_rd_atomic : 1;
    c.qkey = attr.qkey;
    if (const char* w = std::getenv("SOFTVERBS_ROCE_WINDOW")) c.max_window = std::clamp<uint32_t>(uint32_t(std::atoi(w)), 16, 1u << 20);
    if (const char* w = std::getenv("SOFTVERBS_ROCE_ACK_AFTER")) c.ack_urgent_after = uint32_t(std::max(std::atoi(w), 0));
    if (q.type != IBV_QPT_UD) {
      c.dest_qpn = attr.dest_qp_num;
      c.dest_ah = nr->ep->add_peer(gid_to_ip(attr.ah_attr.grh.dgid.raw), kRoceV2Port);
      if (c.dest_ah == UINT64_MAX) return EINVAL;  // IPv4 source, IPv6 destination or the reverse
    }
    nr->route.first = nr->ep.get();
    nr->route.other = nr->ep2.get();
    nr->engine = std::make_unique<roce::EngineQp>(c, nr->route, nr->sink, nr->mem, h.clock);
    nr->engine->set_recv_source(&nr->recvs);
    nr->engine->set_xrc_domain(&nr->xrc);
    nr->ep->attach(nr->engine.get());
    if (nr->ep2) nr->ep2->attach(nr->engine.get());
    nr->mem.inline_slab.resize(size_t(q.cap.max_send_wr + 1) * std::max<uint32_t>(q.cap.max_inline_data, 1));
    SV_TRACE("roce: QP %u on the wire, pmtu %u", q.qpn, c.pmtu);
    h.qps[q.qpn] = std::move(nr);
    q.on_wire.store(true, std::memory_order_release);
    return 0;
  }
  if (next == IBV_QPS_RTS && r && r->engine && q.type != IBV_QPT_UD) {
    r->engine->set_requester(attr.sq_psn, attr.timeout, attr.retry_cnt, attr.rnr_retry, attr.max_rd_atomic);
  } else if (next == IBV_QPS_RTS && r && r->engine) {
    r->engine->set_requester(attr.sq_psn, 0, 0, 0, 1);
  }
  return 0;
}

void roce_detach(ProcessQp& q) {
  Hub& h = hub();
  std::lock_guard<std::mutex> g(h.mu);
  auto it = h.qps.find(q.qpn);
  if (it != h.qps.end() && it->second->q == &q) {
    RoceQp& r = *it->second;
    // SOFTVERBS_ROCE_STATS=1: what the wire did, for tests and debugging.
    if (r.engine && std::getenv("SOFTVERBS_ROCE_STATS"))
      print_roce_stats(q.qpn, r.engine->stats(), r.ep->stats(), r.ep2 ? &r.ep2->stats() : nullptr);
    // An ACK held for the next request (docs/ROCE.md) acknowledges messages
    // this side has completed: it must leave before the QP goes, or the
    // peer retries into a QP that no longer exists (ibv_rc_pingpong's last
    // SEND, then the client exits). Datagrams the fault hook holds back
    // were sent, as far as the peer knows: they must not vanish either.
    if (r.engine) r.engine->flush_ack();
    if (r.ep) {
      r.flush_delayed(true);
      r.flush_tx();
    }
    h.qps.erase(it);
  }
  q.on_wire.store(false, std::memory_order_release);
}

// A multicast send is not "remote": its local members get it through
// shared memory (execute_ud), the wire a copy (roce_post_mcast).
bool roce_ud_remote(const ProcessQp&, const ibv_send_wr* wr) {
  const Ah* ah = reinterpret_cast<const Ah*>(wr->wr.ud.ah);
  return ah && ah->attr.is_global && !gid_is_multicast(ah->attr.grh.dgid.raw) &&
         !gid_is_local(ah->attr.grh.dgid.raw);
}

// An AH from the loopback GID (index 0, ::ffff:127.0.0.1: a group joined
// on an id bound to 127.0.0.1 or ::1) keeps the group on this host, as IP
// multicast sent on lo does.
bool roce_ud_multicast(const ProcessQp&, const ibv_send_wr* wr) {
  const Ah* ah = reinterpret_cast<const Ah*>(wr->wr.ud.ah);
  return ah && ah->attr.is_global && ah->attr.grh.sgid_index != 0 && gid_is_multicast(ah->attr.grh.dgid.raw) &&
         (wr->wr.ud.remote_qpn & 0xffffff) == kMulticastQpn;
}

// RoCEv2 multicast (docs/ROCE.md, "Multicast"; IBTA annex A17.4.5: the MGID
// is the IP destination, an IPv4-mapped MGID the IPv4 group): the same UD
// SEND as a datagram to the group's address, port 4791, DestQP 0xFFFFFF.
// Unsignaled: the work request completes once, on the local path. The
// sending socket does not loop its multicast back (IP_MULTICAST_LOOP off,
// set by the daemon on every socket of the port), so this host's members
// get the message once, from execute_ud. An MGID of the other family than
// the QP's address (a UD QP sends from GID index 1, IPv4) stays local.
int roce_post_mcast(ProcessQp& q, const ibv_send_wr* wr) {
  Hub& h = hub();
  std::lock_guard<std::mutex> g(h.mu);
  auto it = h.qps.find(q.qpn);
  if (it == h.qps.end() || !it->second->engine) return EINVAL;
  RoceQp& r = *it->second;
  if (int e = validate_wr(q, wr)) return e;
  if (r.engine->send_queue_depth() >= q.cap.max_send_wr) return ENOMEM;
  // A UD message is one packet (IBTA 9.8): one larger than the wire's path
  // MTU stays on the host (the engine would complete it with an error).
  uint64_t len = 0;
  for (int i = 0; i < wr->num_sge; ++i) len += wr->sg_list[i].length;
  if (len > r.cfg.pmtu) return EMSGSIZE;
  SendWr s;
  if (int e = to_engine_wr(q, r, wr, s)) return e;
  s.signaled = false;
  s.remote_qpn = kMulticastQpn;
  int rc = r.engine->post_send(std::move(s));
  r.engine->progress(false);
  r.flush_delayed();
  r.flush_tx();
  report_error(r);
  h.wake_by(std::min(r.engine->next_deadline(), r.next_delayed()));
  return rc;
}

int roce_post_send(ProcessQp& q, ibv_send_wr* wr, ibv_send_wr** bad) {
  Hub& h = hub();
  std::lock_guard<std::mutex> g(h.mu);
  auto it = h.qps.find(q.qpn);
  if (it == h.qps.end() || !it->second->engine) {
    *bad = wr;
    return EINVAL;
  }
  RoceQp& r = *it->second;
  int rc = 0;
  for (; wr; wr = wr->next) {
    // One check for every path: the opcode rules of wr_rules.h.
    rc = validate_wr(q, wr);
    if (rc == 0 && r.engine->send_queue_depth() >= q.cap.max_send_wr) rc = ENOMEM;
    if (rc) {
      *bad = wr;
      break;
    }
    SendWr s;
    if ((rc = to_engine_wr(q, r, wr, s))) {
      *bad = wr;
      break;
    }
    if (q.faults) [[unlikely]]
      s.fails_with = roce::to_engine(wire_fault(q, *wr));
    if (int e = r.engine->post_send(std::move(s))) {
      *bad = wr;
      rc = e;
      break;
    }
  }
  // The new requests first, then the held ACK, if any, in the same
  // sendmmsg: a peer polling for that ACK finds the requests already done
  // when it sees it (ib_write_lat: its memory holds our WRITE by then).
  r.engine->progress(false);
  r.engine->flush_ack();
  r.ack_due = 0;
  r.flush_delayed();
  r.flush_tx();
  report_error(r);
  h.wake_by(std::min(r.engine->next_deadline(), r.next_delayed()));  // a timer the RoCE thread must see
  return rc;
}

bool roce_poll() {
  Hub& h = hub();
  h.last_app_poll.store(h.clock.now_ns(), std::memory_order_relaxed);
  std::unique_lock<std::mutex> lk(h.mu, std::try_to_lock);
  if (!lk.owns_lock()) {
    // The RoCE thread or another poller is at it. If it was preempted on
    // our CPU (2 vCPUs: likely), spinning here would keep it from finishing.
    sched_yield();
    return false;
  }
  const int got = h.drain_all();
  if (got == 0 && h.next_deadline() > h.clock.now_ns()) {
    // Nothing came: let another runnable thread of this CPU run (on 2 vCPUs
    // shared with other work the peer's poller may be queued right here,
    // and our spinning would hold its answer back for a time slice).
    lk.unlock();
    sched_yield();
    return false;
  }
  // A held ACK goes with our next post, or at our next poll after its
  // time, or from the RoCE thread, which naps no longer than kPollerNap
  // while we poll: no kick needed.
  h.progress_all();
  return true;
}

void roce_notify_armed() {
  Hub& h = hub();
  if (h.last_app_poll.exchange(0, std::memory_order_relaxed) != 0) h.kick();
}

}  // namespace sv::verbs
