// udp.h: a RoCEv2 endpoint on a UDP socket (IPv4 or IPv6): it owns the socket
// (UDP port 4791, or any port for tests), adds the ICRC to what the engine
// sends and checks it on what arrives, demultiplexes arriving packets by
// destination QPN to the attached Qps, and drives their timers. A
// FaultInjector on the send path drops, duplicates and delays datagrams.
//
// The ICRC covers the IP header the kernel builds; its variant fields are
// masked, the rest is known (addresses, length, DF) except, on IPv4, the IP
// ID, which a UDP socket sending with IP_PMTUDISC_DO leaves 0 and which it
// cannot see on arrival: the check assumes 0 (docs/ROCE.md). Packets whose
// ICRC does not match are dropped and counted.
//
// Contract: single-threaded; the endpoint owns its socket; attached Qps and
// the PacketSink role must be used from the thread that calls run()/poll().
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <queue>
#include <string>
#include <vector>

#include "roce/engine.h"
#include "roce/fault.h"
#include "roce/icrc.h"

namespace sv::roce {

class SteadyClock : public Clock {
 public:
  uint64_t now_ns() const override;
};

struct UdpEndpointStats {
  uint64_t sent = 0, received = 0, bad_icrc = 0, no_qp = 0, too_short = 0, fault_dropped = 0, fault_delayed = 0,
           fault_duplicated = 0, fault_corrupted = 0, nonzero_ipv4_id = 0, gso_sends = 0, multicast = 0;
  // Datagrams not sent, and arrivals dropped, while the link was down
  // (FaultConfig::link_down).
  uint64_t link_down_sent = 0, link_down_received = 0;
};

// Socket options every RoCEv2 UDP socket of `family` (AF_INET, AF_INET6)
// takes, set once here for the daemon's port, the CM gateway and the
// endpoint: never IP-fragmented (DF; on IPv4 that also keeps the IP ID 0,
// which the ICRC covers); IPv6 only on an IPv6 socket; and on IPv6, accept
// datagrams whose UDP checksum is zero. Linux rxe sends its IPv6 datagrams
// so (RFC 6935/6936 allow it for tunnels; the ICRC covers the payload), and
// the kernel drops them on a socket without UDP_NO_CHECK6_RX.
void set_roce_socket_options(int fd, int family);

class UdpEndpoint : public PacketSink {
 public:
  explicit UdpEndpoint(Clock& clock, FaultConfig faults = {});
  ~UdpEndpoint() override;
  UdpEndpoint(const UdpEndpoint&) = delete;
  UdpEndpoint& operator=(const UdpEndpoint&) = delete;

  // Binds to addr:port (an IPv4 or IPv6 address; port 0 = any free port).
  // Returns 0 or an errno.
  int bind(const std::string& addr, uint16_t port);
  // Takes over a UDP socket bound elsewhere (the daemon passes a process
  // one). Returns 0 or an errno. With an adopted socket the owner receives
  // and calls deliver(). `receive_port` (0: the socket's own) is the port
  // datagrams arrive at, when the socket only sends (bound to the address
  // at another port; the daemon forwards what comes to port 4791): the
  // ICRC of arrivals covers it, and peers are answered there.
  int adopt(int fd, uint16_t receive_port = 0);
  uint16_t port() const { return port_; }
  int family() const { return local_.ss.ss_family; }  // AF_INET or AF_INET6 once bound or adopted
  // An address handle for a peer (of the bound address's family), or
  // UINT64_MAX if `addr` is not one.
  uint64_t add_peer(const std::string& addr, uint16_t port);
  // "addr:port" ("[addr]:port" for IPv6) of an address handle, "" if none.
  std::string peer_name(uint64_t ah) const;
  size_t peer_count() const { return peers_.size(); }
  // Arriving packets for `qp->config().qpn` go to `qp`, which must outlive
  // the endpoint or be detached.
  void attach(EngineQp* qp);
  void detach(uint32_t qpn);

  // PacketSink: frames a transport packet (appends the ICRC) and sends it.
  void send(uint64_t ah, std::span<const uint8_t> packet) override;
  // With batching and no faults the payload pieces are not copied: the
  // batch's iovecs point at them until flush_tx(), which the owner calls
  // before its call into the engine returns (engine.h).
  void send_gather(uint64_t ah, std::span<const uint8_t> headers,
                   std::span<const std::span<const uint8_t>> payload) override;

  // Receives what is there (waiting at most timeout_ms), delivers it, then
  // runs progress() on every attached EngineQp.
  void poll(int timeout_ms);
  // One arriving UDP payload (BTH .. ICRC) from `from`: ICRC check, QPN
  // demultiplexing, receive() on the EngineQp. progress() is the caller's.
  // `ipv4_id`: the IP ID the datagram is likely to have been sent with (the
  // k-th of a UDP GRO train: k), checked exactly besides 0.
  void deliver(const sockaddr* from, socklen_t from_len, const uint8_t* data, size_t n, uint16_t ipv4_id = 0);
  // One multicast datagram (docs/ROCE.md, "Multicast") from `from` to the
  // IP group `group` (port 4791), for the attached UD QP `qpn`, a member of
  // that group (the caller's word: the daemon's table): its ICRC is over the
  // headers with the group as destination; the BTH's DestQP must be the
  // multicast QPN. Anything else is dropped (counted in stats()).
  void deliver_multicast(const sockaddr* from, socklen_t from_len, const sockaddr* group, socklen_t group_len,
                         uint32_t qpn, const uint8_t* data, size_t n);
  // From now on nothing this endpoint sends is dropped, delayed or
  // corrupted by the fault hook (a down link still sends nothing). For a QP
  // being destroyed: its last ACK, lost, would leave the peer retrying into
  // a QP that no longer exists until its retry count ends (an outcome of the
  // test's loss, not of the transport it tests; docs/LAB.md, "Faults").
  void spare_from_faults() { spared_ = true; }
  // Sends the datagrams the fault hook held back whose time has come (all
  // of them with `all`: they are on the wire already, as it were), and when
  // the next one is due (UINT64_MAX if none).
  void flush_delayed(bool all = false);
  uint64_t next_delayed() const { return delayed_.empty() ? UINT64_MAX : delayed_.top().at; }
  // poll() until done() or deadline_ns on the clock; returns done().
  bool run(const std::function<bool()>& done, uint64_t deadline_ns);

  // Batching: with it on, datagrams wait in a batch (up to kTxBatch) until
  // flush_tx(), which sends them with one sendmmsg; the owner calls
  // flush_tx() after each call into the engine. Off by default.
  void set_batching(bool on) { batching_ = on; }
  // With batching: send runs of equal datagrams with UDP GSO (one send of
  // up to 64 KiB, cut by the kernel). See docs/ROCE.md for the IPv4 ID.
  void set_gso(bool on) { gso_ = on; }
  void flush_tx();
  // 256: a window's worth (the requester's default), so that what one call
  // into the engine sends is cut into GSO sends only where a run of equal
  // datagrams ends or 64 KiB is full, not where a batch of 64 was (62 + 2
  // datagrams of 1040 bytes, 31 per send on average: the kernel's cost per
  // send made that 25-30 % dearer than 62 per send).
  static constexpr int kTxBatch = 256;
  // And at most about 256 KiB a batch (64 datagrams at path MTU 4096): one
  // sendmmsg must fit in the socket's send buffer, which is net.core.wmem_max
  // (about 416 KiB as the kernel counts it) for a daemon without
  // CAP_NET_ADMIN; behind a NIC whose ring is full, the rest of a larger
  // batch would be lost (EAGAIN) and wait out a retransmission timeout.
  static constexpr size_t kTxBatchBytes = 256 * 1024;

  // IPv4 peers that send a non-zero IP ID with DF (Linux rxe: every packet)
  // compute their ICRC over that ID, which a UDP socket cannot see. When
  // set, an IPv4 datagram is accepted if its ICRC is right for some ID: the
  // check keeps 16 of its 32 bits for such peers (docs/ROCE.md).
  void set_accept_any_ipv4_id(bool on) { any_ipv4_id_ = on; }
  const UdpEndpointStats& stats() const { return stats_; }
  // A copy of every datagram sent (each copy the fault hook makes, when it
  // goes) and received (before its checks), as an IP datagram with the
  // headers the kernel builds (IPv4 ID 0), for capture: `want(arg)` is asked
  // per datagram, `put` gets it while want says so. Set before traffic.
  struct Tap {
    bool (*want)(void* arg) = nullptr;
    void (*put)(void* arg, std::span<const uint8_t> ip, uint32_t qpn) = nullptr;
    void* arg = nullptr;
    uint32_t qpn = 0;  // the local QP the endpoint serves, handed to put
  };
  void set_tap(const Tap& t) { tap_ = t; }

 private:
  struct Addr {
    sockaddr_storage ss{};
    bool v6() const { return ss.ss_family == AF_INET6; }
    socklen_t len() const { return v6() ? sizeof(sockaddr_in6) : sizeof(sockaddr_in); }
    const sockaddr* sa() const { return reinterpret_cast<const sockaddr*>(&ss); }
    bool operator==(const Addr& o) const;
  };
  static bool parse(const std::string& s, uint16_t port, Addr* out);
  struct Delayed {
    uint64_t at;
    uint64_t seq;
    uint64_t ah;
    std::vector<uint8_t> bytes;
    bool operator>(const Delayed& o) const { return at != o.at ? at > o.at : seq > o.seq; }
  };
  // The IP + UDP headers src -> dst of a datagram carrying `transport_len`
  // bytes, as the kernel builds them (IPv4 ID 0), into `out` (48 bytes);
  // returns their length (0 if too long).
  size_t header(const Addr& src, const Addr& dst, size_t transport_len, uint8_t* out);
  // Sends (or batches) the UDP payload a + b.
  void transmit(uint64_t ah, std::span<const uint8_t> a, std::span<const uint8_t> b = {});
  // The ICRC's state after the masked IP and UDP headers of a datagram to
  // peer `ah` (sending) or from `from` (receiving) carrying `transport_len`
  // bytes before the ICRC: cached, since a stream repeats them.
  std::optional<uint32_t> tx_prefix(uint64_t ah, size_t transport_len);
  struct RxPrefix;
  const RxPrefix* rx_prefix(const Addr& from, size_t transport_len);
  void clear_prefixes();
  void ensure_batch();  // the batch's buffers, on first use
  // The batch as sendmmsg messages in txmsg_: the m-th one UDP GSO send of
  // segs_of[m] datagrams from firsts[m] on. Returns how many messages.
  int build_tx_messages(std::array<int, kTxBatch>& segs_of, std::array<int, kTxBatch>& firsts);
  // Sends count datagrams of the batch from first on one by one, and
  // turns GSO off, after the kernel refused them as one GSO send.
  void send_without_gso(int first, int count);
  const std::array<uint32_t, 16>& id_deltas(size_t total);
  // ICRC(ID id) ^ ICRC(ID 0) for an IPv4 datagram of `total` bytes.
  uint32_t id_delta(size_t total, uint16_t id);
  bool icrc_matches_some_ipv4_id(size_t total, uint32_t icrc0, uint32_t got);
  uint64_t peer_for(const Addr& a);

  Clock& clock_;
  FaultInjector faults_;
  bool faulty_;
  bool spared_ = false;  // spare_from_faults()
  const std::atomic<bool>* link_down_;  // FaultConfig::link_down
  bool link_is_down() const { return link_down_ && link_down_->load(std::memory_order_acquire); }
  int fd_ = -1;
  void set_local(uint16_t receive_port);
  Addr local_;     // the socket's address: the source of what is sent
  Addr rx_local_;  // the destination of what arrives (local_, or at the receive port)
  uint16_t port_ = 0;  // rx_local_'s
  std::vector<Addr> peers_;
  std::map<uint32_t, EngineQp*> qps_;
  std::priority_queue<Delayed, std::vector<Delayed>, std::greater<Delayed>> delayed_;
  uint64_t seq_ = 0;
  std::vector<uint8_t> rx_;
  uint8_t hdr_[kIpv6UdpLen];  // the headers of the datagram being received
  Tap tap_;
  // The tap's copy of the datagram src -> dst made of `pieces`.
  // `pieces`: BTH .. ICRC; `ipv4_id`: its IPv4 ID (else 0).
  void tap(const Addr& src, const Addr& dst, std::span<const std::span<const uint8_t>> pieces, uint16_t ipv4_id = 0);
  // The tap's copy of a datagram received (BTH .. ICRC `got`; `crc` the
  // ICRC computed with IPv4 ID 0).
  void tap_in(const Addr& from, const uint8_t* data, size_t n, uint32_t crc, uint32_t got, uint16_t ipv4_id);
  bool batching_ = false;
  static constexpr size_t kTxSlot = 4096 + 256;  // a 4096-MTU packet, headers, ICRC
  // kTxBatch slots, uninitialised: a gathered datagram touches only its
  // slot's headers and ICRC, so most of the pages are never mapped.
  std::unique_ptr<uint8_t[]> txbuf_;
  std::vector<mmsghdr> txmsg_;
  // A batched datagram: its iovecs (txiov_[iov_first ..]: the slot's copy,
  // or the headers in the slot, the payload's pieces, pad and ICRC in the
  // slot), where its ICRC lies, its size and destination.
  struct TxDatagram {
    uint64_t ah;  // resolved at flush: peers_ may grow meanwhile
    uint32_t iov_first, iov_count;
    uint32_t len;   // UDP payload bytes
    uint32_t dqpn;  // BTH's destination QP
    uint8_t* icrc;
  };
  static constexpr size_t kIovPerDatagram = 2 + kMaxPayloadPieces;
  std::vector<TxDatagram> txd_;
  std::vector<iovec> txiov_;
  uint32_t tx_iov_n_ = 0;
  struct TxPrefix {
    uint64_t ah = UINT64_MAX;
    size_t len = 0;
    uint32_t crc = 0;
  };
  std::array<TxPrefix, 16> tx_prefix_{};
  struct RxPrefix {
    Addr from;
    size_t len = SIZE_MAX;
    uint32_t crc = 0;
    uint64_t peer = 0;
  };
  std::array<RxPrefix, 16> rx_prefix_{};
  struct CmsgBuf {
    alignas(cmsghdr) char buf[CMSG_SPACE(sizeof(uint16_t))];
  };
  std::vector<CmsgBuf> txcmsg_;
  bool gso_ = false;
  static constexpr int kMaxGsoSegments = 64;
  static constexpr size_t kMaxGsoBytes = 65000;  // UDP payload of one IPv4 datagram, with room
  int tx_n_ = 0;
  size_t tx_bytes_ = 0;  // UDP payload bytes in the batch
  UdpEndpointStats stats_;
  bool any_ipv4_id_ = false;
  // Per IPv4 datagram length: how each bit of the IP ID changes the ICRC.
  std::map<size_t, std::array<uint32_t, 16>> id_deltas_;
  size_t last_id_total_ = 0;  // 0: none (no datagram is that short)
  const std::array<uint32_t, 16>* last_id_deltas_ = nullptr;
};

}  // namespace sv::roce
