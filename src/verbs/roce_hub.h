// roce_hub.h: the wire path's state in the process (roce_link.cc's
// internals, not an API): a QP on the wire (RoceQp: its engine, endpoints,
// memory and completion sinks) and the lanes that serve such QPs, each a
// Hub with its lock, QPs, sockets and RoCE thread (docs/ROCE.md,
// "Integration: QPs on the wire" and "Several engine threads").
//
// Thread safety: a Hub's members are guarded by its `mu` unless marked
// atomic; a RoceQp is its lane's. Lock order: a hub, then the daemon
// connection; never two hubs at once (lane 0 hands another lane's
// datagrams over through that lane's `handed` queue instead).
#pragma once
#include <poll.h>
#include <netinet/udp.h>
#include <sys/eventfd.h>
#include <sys/socket.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/protocol.h"
#include "common/sys.h"
#include "roce/engine.h"
#include "roce/udp.h"
#include "verbs/provider.h"
#include "verbs/roce_engine_io.h"
#include "verbs/roce_memory.h"
#include "verbs/roce_stats.h"
#include "verbs/roce_xrc.h"

namespace sv::verbs::wire {

using namespace sv::roce;

using Gid = std::array<uint8_t, 16>;

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
  Fd member;  // steered: our socket of the port's group, till the lane receives on it (receive_on)
  uint64_t ack_due = 0;  // a held ACK goes by then (Hub::kAckHold)
  bool steered = false;  // the daemon steers the QPN to our socket (`member`)
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

// Then, once the engine's own completions are out, what waits in the
// receive ring is flushed after them (roce_link.cc).
void report_error(RoceQp& r);

// What one daemon connection (context) gave this process: its arrival
// socket (datagrams the daemon forwards) and the sockets the daemon steers
// this process's QPNs to (one per local address in use; each distinct
// socket once, by inode). Closed together when the daemon closes the
// arrival socket, since the daemon may then give those sockets to others.
//
// With several lanes (below) each lane has its own ConnSocks per
// connection: lane 0 reads the arrival socket; the others hold a copy of it
// only to see it close (POLLHUP), and read their own steered sockets.
struct ConnSocks {
  Fd arrival;
  std::vector<std::pair<ino_t, Fd>> steered;
};

// A datagram the daemon forwarded on the arrival socket (lane 0 reads it)
// for a QP that another lane serves: handed to that lane.
struct Handed {
  sockaddr_storage from{};
  socklen_t from_len = 0;
  std::vector<uint8_t> dg;
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
//
// Lanes (docs/ROCE.md, "Several engine threads"): a process has
// lane_count() hubs, each with its own lock, QPs, steered sockets and RoCE
// thread ("sv-roce-N"). A QP belongs to one lane for its life on the wire
// (ProcessQp::roce_lane), so its engine runs in one thread at a time and
// its order, retransmission and ACKs are as with one lane; QPs of
// different lanes run in parallel. The daemon steers each QPN to its
// lane's socket (RoceAttachReq::lane).
struct Hub {
  unsigned index = 0;  // the lane
  std::mutex mu;
  std::map<uint32_t, std::unique_ptr<RoceQp>> qps;  // by QPN
  std::map<ContextState*, ConnSocks> conns;          // one per daemon connection
  std::map<std::string, Fd> senders;  // several lanes: the lane's sending socket per local address (lane_sender)
  SteadyClock clock;
  Fd wake{::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)};
  std::atomic<bool> started{false};  // its thread (set with mu held)
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

  void deliver_one(const sockaddr* from, socklen_t fl, const uint8_t* dg, size_t len, uint16_t ipv4_id = 0, bool forwarded = false);

  // Datagrams lane 0 handed over (deliver_one), taken by drain_all.
  std::mutex handed_mu;
  std::vector<Handed> handed;
  std::atomic<bool> has_handed{false};
  static constexpr size_t kMaxHanded = 1024;  // beyond, dropped (a datagram network)
  void hand(const sockaddr* from, socklen_t fl, const uint8_t* dg, size_t len);
  int take_handed();

  // A stream's ACK goes as soon as a quarter window has come (see
  // EngineQp::ack_urgent), not after the batch and the hold: the requester would
  // otherwise sit on a full window while we drain it.
  std::vector<RoceQp*> urgent;
  void send_urgent_acks();

  // Delivers what waits on arrival socket `fd`; returns how many datagrams.
  int drain(int fd);

  // Delivers what waits on steered UDP socket `fd` (recvmmsg batches).
  int drain_udp(int fd);

  // `polled`: what ppoll just said, if it watched the arrival sockets for
  // input. With steered sockets, the daemon's arrival socket is nearly
  // always empty (datagrams come to it only before a QP's steering is in
  // place): it is read when ppoll says it is readable, else one turn in
  // eight, instead of a system call that finds nothing on every turn.
  unsigned drain_turn = 0;
  int drain_all(const std::vector<pollfd>* polled = nullptr);

  // ACKs are held up to kAckHold after the packets that asked for them, so
  // that an answer the application posts meanwhile carries them in the same
  // sendmmsg, after it (ib_write_lat: the peer, polling its CQ for the ACK,
  // has our WRITE in memory when it sees it, and needs no wake-up of its
  // RoCE thread). The requester's window (256 packets) outlasts the hold
  // many times over.
  static constexpr uint64_t kAckHold = 20'000;

  void progress_all();

  uint64_t next_deadline();

  void run();
};

// The lanes: how many, lane `lane` (0 if beyond), every one.
unsigned lane_count();
Hub& hub(unsigned lane = 0);
const std::vector<Hub*>& lane_hubs();
// The lane of an attached QP.
Hub& hub_of(const ProcessQp& q);
// The lane serving QPN `qpn` (nullptr if none): for lane 0's hand-overs.
Hub* lane_of_qpn(uint32_t qpn);
void set_lane_of_qpn(uint32_t qpn, unsigned lane);
// Which lane a QP about to go on the wire asks for.
unsigned lane_for(const ProcessQp& q);
// Lane `h` receives on steered socket `fd` of connection `cs` (with h.mu held).
void receive_on(Hub& h, ContextState& cs, int fd);
// Lane `h` watches connection `cs`'s arrival socket (with h.mu held).
void adopt_arrival(Hub& h, ContextState& cs, Fd fd);
// Several lanes: the socket lane `h` sends from on the address `member`
// (a steered socket) is bound to, at a UDP port of the lane's own (a new
// descriptor for the caller), or -1. With h.mu held.
int lane_sender(Hub& h, int member);
// Lane `h`'s thread runs (with h.mu held).
void start(Hub& h);

}  // namespace sv::verbs::wire
