#include "roce/udp.h"

#include <arpa/inet.h>
#include <netinet/udp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "roce/headers.h"
#include "roce/icrc.h"

namespace sv::roce {

uint64_t SteadyClock::now_ns() const {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
}

UdpEndpoint::UdpEndpoint(Clock& clock, FaultConfig faults)
    : clock_(clock), faults_(faults),
      faulty_(faults.drop > 0 || faults.duplicate > 0 || faults.reorder > 0 || faults.corrupt > 0 || faults.link_down),
      link_down_(faults.link_down) {
  rx_.resize(65536);
}

UdpEndpoint::~UdpEndpoint() {
  if (fd_ >= 0) close(fd_);
}

bool UdpEndpoint::Addr::operator==(const Addr& o) const {
  if (ss.ss_family != o.ss.ss_family) return false;
  if (v6()) {
    auto& x = reinterpret_cast<const sockaddr_in6&>(ss);
    auto& y = reinterpret_cast<const sockaddr_in6&>(o.ss);
    return x.sin6_port == y.sin6_port && std::memcmp(&x.sin6_addr, &y.sin6_addr, 16) == 0;
  }
  auto& x = reinterpret_cast<const sockaddr_in&>(ss);
  auto& y = reinterpret_cast<const sockaddr_in&>(o.ss);
  return x.sin_port == y.sin_port && x.sin_addr.s_addr == y.sin_addr.s_addr;
}

bool UdpEndpoint::parse(const std::string& s, uint16_t port, Addr* out) {
  *out = Addr{};
  auto* v4 = reinterpret_cast<sockaddr_in*>(&out->ss);
  if (inet_pton(AF_INET, s.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(port);
    return true;
  }
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&out->ss);
  if (inet_pton(AF_INET6, s.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(port);
    return true;
  }
  return false;
}

void set_roce_socket_options(int fd, int family) {
  int one = 1;
  if (family == AF_INET6) {
    int pmtu = IPV6_PMTUDISC_DO;
    setsockopt(fd, IPPROTO_IPV6, IPV6_MTU_DISCOVER, &pmtu, sizeof pmtu);
    setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
    setsockopt(fd, IPPROTO_UDP, UDP_NO_CHECK6_RX, &one, sizeof one);
  } else {
    int pmtu = IP_PMTUDISC_DO;
    setsockopt(fd, IPPROTO_IP, IP_MTU_DISCOVER, &pmtu, sizeof pmtu);
  }
}

int UdpEndpoint::bind(const std::string& addr, uint16_t port) {
  if (!parse(addr, port, &local_)) return EINVAL;
  // By its system call: a program may preload rdma-core's librspreload.so,
  // which would make an rsocket of a socket() (common/sys.h, kernel_socket).
  fd_ = int(::syscall(SYS_socket, local_.ss.ss_family, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (fd_ < 0) return errno;
  set_roce_socket_options(fd_, local_.ss.ss_family);
  if (::bind(fd_, local_.sa(), local_.len()) != 0) return errno;
  socklen_t len = sizeof local_.ss;
  getsockname(fd_, reinterpret_cast<sockaddr*>(&local_.ss), &len);
  set_local(0);
  return 0;
}

int UdpEndpoint::adopt(int fd, uint16_t receive_port) {
  local_ = Addr{};
  socklen_t len = sizeof local_.ss;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&local_.ss), &len) != 0) return errno;
  if (local_.ss.ss_family != AF_INET && local_.ss.ss_family != AF_INET6) return EAFNOSUPPORT;
  if (fd_ >= 0) close(fd_);
  fd_ = fd;
  set_local(receive_port);
  return 0;
}

// local_ is the bound address (the source of what is sent); rx_local_ the
// destination of what arrives: the same, or at `receive_port`.
void UdpEndpoint::set_local(uint16_t receive_port) {
  clear_prefixes();
  rx_local_ = local_;
  auto& p = local_.v6() ? reinterpret_cast<sockaddr_in6&>(rx_local_.ss).sin6_port
                        : reinterpret_cast<sockaddr_in&>(rx_local_.ss).sin_port;
  if (receive_port) p = htons(receive_port);
  port_ = ntohs(p);
}

uint64_t UdpEndpoint::add_peer(const std::string& addr, uint16_t port) {
  Addr a;
  if (!parse(addr, port, &a) || a.ss.ss_family != local_.ss.ss_family) return UINT64_MAX;
  // One handle per address: a connected QP's packets are matched to its
  // peer by handle (EngineQp::receive), and peer_for() names the first.
  for (size_t i = 0; i < peers_.size(); i++) {
    if (peers_[i] == a) return i;
  }
  peers_.push_back(a);
  return peers_.size() - 1;
}

// A peer's packets come from whatever source port it likes (rxe: 0xc000 +
// a hash of the QPN) but are answered on the RoCEv2 port: a source that is
// not a known peer is matched by address alone, else becomes a new peer at
// our own port (everyone listens on 4791; tests bind other ports and add
// their peers explicitly).
uint64_t UdpEndpoint::peer_for(const Addr& a) {
  for (size_t i = 0; i < peers_.size(); i++) {
    if (peers_[i] == a) return i;
  }
  Addr at_port = a;
  if (a.v6()) {
    reinterpret_cast<sockaddr_in6&>(at_port.ss).sin6_port = htons(port_);
  } else {
    reinterpret_cast<sockaddr_in&>(at_port.ss).sin_port = htons(port_);
  }
  for (size_t i = 0; i < peers_.size(); i++) {
    if (peers_[i] == at_port) return i;
  }
  peers_.push_back(at_port);
  return peers_.size() - 1;
}

std::string UdpEndpoint::peer_name(uint64_t ah) const {
  if (ah >= peers_.size()) return "";
  const Addr& a = peers_[ah];
  char buf[INET6_ADDRSTRLEN];
  if (a.v6()) {
    auto& x = reinterpret_cast<const sockaddr_in6&>(a.ss);
    inet_ntop(AF_INET6, &x.sin6_addr, buf, sizeof buf);
    // Appended piece by piece: GCC 12 at -O3 warns (-Wrestrict) inside
    // std::string's operator+ on "literal" + std::string (a false positive).
    std::string s = "[";
    s.append(buf).append("]:").append(std::to_string(ntohs(x.sin6_port)));
    return s;
  }
  auto& x = reinterpret_cast<const sockaddr_in&>(a.ss);
  inet_ntop(AF_INET, &x.sin_addr, buf, sizeof buf);
  std::string s = buf;
  s.append(":").append(std::to_string(ntohs(x.sin_port)));
  return s;
}

void UdpEndpoint::attach(EngineQp* qp) { qps_[qp->config().qpn] = qp; }
void UdpEndpoint::detach(uint32_t qpn) { qps_.erase(qpn); }

size_t UdpEndpoint::header(const Addr& src, const Addr& dst, size_t transport_len, uint8_t* out) {
  if (src.v6()) {
    auto& s = reinterpret_cast<const sockaddr_in6&>(src.ss);
    auto& d = reinterpret_cast<const sockaddr_in6&>(dst.ss);
    Ipv6Udp h;  // class, flow label and hop limit are masked: their values do not matter
    std::memcpy(h.src.data(), &s.sin6_addr, 16);
    std::memcpy(h.dst.data(), &d.sin6_addr, 16);
    h.sport = ntohs(s.sin6_port);
    h.dport = ntohs(d.sin6_port);
    return header_ipv6(h, transport_len, out);
  }
  auto& s = reinterpret_cast<const sockaddr_in&>(src.ss);
  auto& d = reinterpret_cast<const sockaddr_in&>(dst.ss);
  Ipv4Udp h;
  std::memcpy(h.src.data(), &s.sin_addr, 4);
  std::memcpy(h.dst.data(), &d.sin_addr, 4);
  h.sport = ntohs(s.sin_port);
  h.dport = ntohs(d.sin_port);
  return header_ipv4(h, transport_len, out);
}

void UdpEndpoint::clear_prefixes() {
  tx_prefix_.fill(TxPrefix{});
  rx_prefix_.fill(RxPrefix{});
}

std::optional<uint32_t> UdpEndpoint::tx_prefix(uint64_t ah, size_t transport_len) {
  TxPrefix& e = tx_prefix_[(transport_len * 31 + ah) % tx_prefix_.size()];
  if (e.ah == ah && e.len == transport_len) return e.crc;
  uint8_t hdr[kIpv6UdpLen];
  const size_t hl = header(local_, peers_[ah], transport_len, hdr);
  auto crc = hl ? icrc_prefix(std::span<const uint8_t>(hdr, hl)) : std::nullopt;
  if (crc) e = TxPrefix{ah, transport_len, *crc};
  return crc;
}

const UdpEndpoint::RxPrefix* UdpEndpoint::rx_prefix(const Addr& from, size_t transport_len) {
  const uint16_t port = from.v6() ? reinterpret_cast<const sockaddr_in6&>(from.ss).sin6_port
                                  : reinterpret_cast<const sockaddr_in&>(from.ss).sin_port;
  RxPrefix& e = rx_prefix_[(transport_len * 31 + port) % rx_prefix_.size()];
  if (e.len == transport_len && e.from == from) return &e;
  uint8_t hdr[kIpv6UdpLen];
  const size_t hl = header(from, rx_local_, transport_len, hdr);
  auto crc = hl ? icrc_prefix(std::span<const uint8_t>(hdr, hl)) : std::nullopt;
  if (!crc) return nullptr;
  e = RxPrefix{from, transport_len, *crc, peer_for(from)};
  return &e;
}

void UdpEndpoint::send(uint64_t ah, std::span<const uint8_t> packet) {
  if (ah >= peers_.size() || fd_ < 0) return;
  // The ICRC over the headers the kernel will build and the packet.
  auto prefix = tx_prefix(ah, packet.size());
  auto crc = prefix ? icrc_finish(*prefix, std::span<const std::span<const uint8_t>>(&packet, 1)) : std::nullopt;
  if (!crc) return;
  uint8_t icrc[kIcrcLen];
  icrc_store(icrc, *crc);
  if (!faulty_) return transmit(ah, packet, icrc);
  if (link_is_down()) {  // a NIC whose link is down sends nothing
    stats_.link_down_sent++;
    return;
  }
  if (spared_) return transmit(ah, packet, icrc);
  FaultDecision d = faults_.decide();
  if (d.copies == 0) stats_.fault_dropped++;
  if (d.copies == 2) stats_.fault_duplicated++;
  if (faults_.config().log && (d.copies != 1 || d.corrupt || d.delay_ns[0])) faults_.config().log(d, packet);
  std::vector<uint8_t> flipped;
  if (d.corrupt && d.copies && !packet.empty()) {
    // One bit of the packet changes after its ICRC was computed: the
    // receiver's ICRC check drops it (IBTA A17.4.1), the requester resends.
    // Byte 4 of the BTH (reserved) is masked out of the ICRC: not that one.
    stats_.fault_corrupted++;
    flipped.assign(packet.begin(), packet.end());
    size_t at = d.corrupt_at % packet.size();
    if (at == 4 && packet.size() > 5) at = 5;
    flipped[at] ^= d.corrupt_bit;
    packet = std::span<const uint8_t>(flipped);
  }
  for (int c = 0; c < d.copies; c++) {
    if (d.delay_ns[c] == 0) {
      transmit(ah, packet, icrc);
    } else {
      stats_.fault_delayed++;
      std::vector<uint8_t> bytes(packet.begin(), packet.end());
      bytes.insert(bytes.end(), icrc, icrc + kIcrcLen);
      delayed_.push(Delayed{clock_.now_ns() + d.delay_ns[c], seq_++, ah, std::move(bytes)});
    }
  }
}

void UdpEndpoint::ensure_batch() {
  if (txbuf_) return;
  txbuf_.reset(new uint8_t[kTxBatch * kTxSlot]);
  txmsg_.resize(kTxBatch);
  txd_.resize(kTxBatch);
  txiov_.resize(kTxBatch * kIovPerDatagram);
  txcmsg_.resize(kTxBatch);
}

void UdpEndpoint::send_gather(uint64_t ah, std::span<const uint8_t> headers,
                              std::span<const std::span<const uint8_t>> payload) {
  // The fault hook keeps copies of what it delays: the copying path.
  if (faulty_ || !batching_ || payload.size() > kMaxPayloadPieces || headers.size() + 3 + kIcrcLen > kTxSlot)
    return PacketSink::send_gather(ah, headers, payload);
  if (ah >= peers_.size() || fd_ < 0 || headers.size() < kBthLen) return;
  static constexpr uint8_t kZeros[4] = {};
  size_t plen = 0;
  std::array<std::span<const uint8_t>, 3 + kMaxPayloadPieces> pieces;
  size_t np = 0;
  pieces[np++] = headers;
  for (auto piece : payload) {
    plen += piece.size();
    if (!piece.empty()) pieces[np++] = piece;
  }
  const size_t pad = (4 - (plen & 3)) & 3;
  if (pad) pieces[np++] = std::span<const uint8_t>(kZeros, pad);
  const size_t transport_len = headers.size() + plen + pad;
  auto prefix = tx_prefix(ah, transport_len);
  auto crc = prefix ? icrc_finish(*prefix, std::span<const std::span<const uint8_t>>(pieces.data(), np)) : std::nullopt;
  if (!crc) return;
  if (tap_.want && tap_.want(tap_.arg)) [[unlikely]] {
    uint8_t icrc[kIcrcLen];
    icrc_store(icrc, *crc);
    pieces[np] = std::span<const uint8_t>(icrc, kIcrcLen);
    tap(local_, peers_[ah], std::span<const std::span<const uint8_t>>(pieces.data(), np + 1));
  }
  ensure_batch();
  // The slot holds the headers, then the pad and the ICRC; the payload's
  // iovecs point at its pieces in between.
  uint8_t* slot = txbuf_.get() + size_t(tx_n_) * kTxSlot;
  std::memcpy(slot, headers.data(), headers.size());
  uint8_t* tail = slot + headers.size();
  std::memset(tail, 0, pad);
  icrc_store(tail + pad, *crc);
  TxDatagram& d = txd_[size_t(tx_n_)];
  d = TxDatagram{ah, tx_iov_n_, 0, uint32_t(transport_len + kIcrcLen), get_be24(headers.data() + 5), tail + pad};
  txiov_[tx_iov_n_++] = {slot, headers.size()};
  for (auto piece : payload) {
    if (!piece.empty()) txiov_[tx_iov_n_++] = {const_cast<uint8_t*>(piece.data()), piece.size()};
  }
  txiov_[tx_iov_n_++] = {tail, pad + kIcrcLen};
  d.iov_count = tx_iov_n_ - d.iov_first;
  tx_bytes_ += d.len;
  if (++tx_n_ == kTxBatch || tx_bytes_ >= kTxBatchBytes) flush_tx();
}

void UdpEndpoint::tap(const Addr& src, const Addr& dst, std::span<const std::span<const uint8_t>> pieces,
                      uint16_t ipv4_id) {
  size_t n = 0;
  for (auto p : pieces) n += p.size();
  if (n < kBthLen + kIcrcLen) return;
  std::vector<uint8_t> ip(kIpv6UdpLen + n);
  const size_t hl = header(src, dst, n - kIcrcLen, ip.data());  // the length before the ICRC
  if (!hl) return;
  if (ipv4_id && !src.v6()) {  // the ID it likely came with, and the header checksum over it (RFC 791)
    put_be16(ip.data() + 4, ipv4_id);
    put_be16(ip.data() + 10, 0);
    uint32_t sum = 0;
    for (int i = 0; i < 20; i += 2) sum += get_be16(ip.data() + i);
    while (sum >> 16) sum = (sum & 0xffff) + (sum >> 16);
    put_be16(ip.data() + 10, uint16_t(~sum));
  }
  ip.resize(hl + n);
  size_t at = hl;
  for (auto p : pieces) {
    if (!p.empty()) std::memcpy(ip.data() + at, p.data(), p.size());
    at += p.size();
  }
  tap_.put(tap_.arg, ip, tap_.qpn);
}

void UdpEndpoint::tap_in(const Addr& from, const uint8_t* data, size_t n, uint32_t crc, uint32_t got,
                         uint16_t ipv4_id) {
  // The IPv4 ID the sender's ICRC covers (0, the GRO train's index, or one
  // a search finds: a GSO send's k-th datagram has ID k), so that the copy
  // carries a right ICRC; else the likely one.
  uint16_t id = 0;
  if (crc != got && !from.v6()) {
    id = ipv4_id;
    const size_t total = kIpv4UdpLen + n;
    for (uint32_t k = 1; k < 4096; k++)
      if ((crc ^ id_delta(total, uint16_t(k))) == got) {
        id = uint16_t(k);
        break;
      }
  }
  const std::span<const uint8_t> whole(data, n);
  tap(from, rx_local_, std::span<const std::span<const uint8_t>>(&whole, 1), id);
}

void UdpEndpoint::transmit(uint64_t ah, std::span<const uint8_t> a, std::span<const uint8_t> b) {
  if (tap_.want && tap_.want(tap_.arg)) [[unlikely]] {
    const std::span<const uint8_t> pieces[2] = {a, b};
    tap(local_, peers_[ah], pieces);
  }
  if (batching_ && a.size() + b.size() <= kTxSlot && a.size() + b.size() >= kBthLen) {
    ensure_batch();
    uint8_t* p = txbuf_.get() + size_t(tx_n_) * kTxSlot;
    std::memcpy(p, a.data(), a.size());
    if (!b.empty()) std::memcpy(p + a.size(), b.data(), b.size());
    const size_t len = a.size() + b.size();
    txd_[size_t(tx_n_)] = TxDatagram{ah, tx_iov_n_, 1, uint32_t(len), get_be24(p + 5), p + len - kIcrcLen};
    txiov_[tx_iov_n_++] = {p, len};
    tx_bytes_ += len;
    if (++tx_n_ == kTxBatch || tx_bytes_ >= kTxBatchBytes) flush_tx();
    return;
  }
  flush_tx();  // keep the order
  const Addr& dst = peers_[ah];
  iovec iov[2] = {{const_cast<uint8_t*>(a.data()), a.size()}, {const_cast<uint8_t*>(b.data()), b.size()}};
  msghdr m{};
  m.msg_name = const_cast<sockaddr*>(dst.sa());
  m.msg_namelen = dst.len();
  m.msg_iov = iov;
  m.msg_iovlen = b.empty() ? 1 : 2;
  // A full socket buffer loses the datagram, as a congested link would.
  if (sendmsg(fd_, &m, 0) >= 0) stats_.sent++;
}

int UdpEndpoint::build_tx_messages(std::array<int, kTxBatch>& segs_of, std::array<int, kTxBatch>& firsts) {
  // Consecutive datagrams to one address and QPN, of one size (the last
  // may be shorter), go as one UDP GSO send (UDP_SEGMENT): one trip through
  // the stack for up to 64 KiB; the kernel (or the NIC) cuts it into the
  // same datagrams. A RDMA message's Middle and Last packets qualify.
  int nm = 0;
  for (int i = 0; i < tx_n_;) {
    const TxDatagram& d0 = txd_[size_t(i)];
    const size_t seg = d0.len;
    size_t total = seg;
    int j = i + 1;
    while (gso_ && j < tx_n_ && j - i < kMaxGsoSegments && txd_[size_t(j)].ah == d0.ah &&
           txd_[size_t(j)].len <= seg && total + txd_[size_t(j)].len <= kMaxGsoBytes &&
           txd_[size_t(j)].dqpn == d0.dqpn) {
      total += txd_[size_t(j)].len;
      if (txd_[size_t(j++)].len < seg) break;  // a shorter one ends the group
    }
    const Addr& dst = peers_[d0.ah];
    if (!dst.v6()) {
      // The kernel cuts a GSO send into datagrams whose IPv4 IDs count up
      // from the ID of the whole, 0 with DF on an unconnected socket
      // (inet_gso_segment): the k-th one's ICRC must cover ID k, as a peer
      // that checks the real header (rxe) computes it. Verified on the
      // wire by roce.wire.capture_gso.
      for (int k = 1; k < j - i; ++k) {
        TxDatagram& d = txd_[size_t(i + k)];
        icrc_store(d.icrc, icrc_load(d.icrc) ^ id_delta(kIpv4UdpLen + d.len, uint16_t(k)));
      }
    }
    const TxDatagram& last = txd_[size_t(j - 1)];
    msghdr& m = txmsg_[size_t(nm)].msg_hdr;
    m = msghdr{};
    m.msg_name = const_cast<sockaddr*>(dst.sa());
    m.msg_namelen = dst.len();
    m.msg_iov = &txiov_[d0.iov_first];
    m.msg_iovlen = last.iov_first + last.iov_count - d0.iov_first;
    if (j - i > 1) {
      auto& cb = txcmsg_[size_t(nm)];
      m.msg_control = cb.buf;
      m.msg_controllen = sizeof cb.buf;
      cmsghdr* c = CMSG_FIRSTHDR(&m);
      c->cmsg_level = SOL_UDP;
      c->cmsg_type = UDP_SEGMENT;
      c->cmsg_len = CMSG_LEN(sizeof(uint16_t));
      const uint16_t gso_size = uint16_t(seg);
      std::memcpy(CMSG_DATA(c), &gso_size, sizeof gso_size);
    }
    segs_of[size_t(nm)] = j - i;
    firsts[size_t(nm)] = i;
    ++nm;
    i = j;
  }
  return nm;
}

void UdpEndpoint::send_without_gso(int first, int count) {
  // No GSO on this path (a device without checksum offload, an old
  // kernel): from now on one datagram per send; these go one by one
  // with the ICRC of ID 0 again.
  gso_ = false;
  const Addr& dst = peers_[txd_[size_t(first)].ah];
  for (int k = 0; k < count; ++k) {
    TxDatagram& d = txd_[size_t(first + k)];
    if (!dst.v6() && k > 0) icrc_store(d.icrc, icrc_load(d.icrc) ^ id_delta(kIpv4UdpLen + d.len, uint16_t(k)));
    msghdr one{};
    one.msg_name = const_cast<sockaddr*>(dst.sa());
    one.msg_namelen = dst.len();
    one.msg_iov = &txiov_[d.iov_first];
    one.msg_iovlen = d.iov_count;
    if (sendmsg(fd_, &one, 0) >= 0) stats_.sent++;
  }
}

void UdpEndpoint::flush_tx() {
  // Per message: datagrams, index of the first (written before read: not
  // zeroed, this runs after every call into the engine).
  std::array<int, kTxBatch> segs_of, firsts;
  const int nm = build_tx_messages(segs_of, firsts);
  int done = 0;
  while (done < nm) {
    int n = sendmmsg(fd_, txmsg_.data() + done, unsigned(nm - done), 0);
    if (n <= 0) {
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && segs_of[size_t(done)] > 1 && errno != EAGAIN && errno != ENOBUFS && errno != EFAULT) {
        send_without_gso(firsts[size_t(done)], segs_of[size_t(done)]);
        done++;
        continue;
      }
      // A full socket buffer (EAGAIN) loses these datagrams, as a congested
      // link would; so does memory that went away under a gathered payload
      // (EFAULT: a buffer freed after its WQE failed); the rest may go.
      done++;
      continue;
    }
    for (int k = done; k < done + n; ++k) {
      stats_.sent += uint64_t(segs_of[size_t(k)]);
      if (segs_of[size_t(k)] > 1) stats_.gso_sends++;
    }
    done += n;
  }
  tx_n_ = 0;
  tx_iov_n_ = 0;
  tx_bytes_ = 0;
}

void UdpEndpoint::flush_delayed(bool all) {
  // Nothing delayed (the fault hook is off): no clock read. The RoCE thread
  // calls this twice per QP on every pass, a pass per batch of datagrams.
  if (delayed_.empty()) return;
  const uint64_t now = all ? UINT64_MAX : clock_.now_ns();
  while (!delayed_.empty() && delayed_.top().at <= now) {
    Delayed d = delayed_.top();
    delayed_.pop();
    transmit(d.ah, d.bytes);
  }
}

// CRC-32 is affine over GF(2): for IPv4 datagrams of one length, the ICRC
// with IP ID x is the ICRC with ID 0 XOR a linear function of x's 16 bits,
// whatever the rest of the datagram holds. The 16 per-bit differences are
// computed once per length, on a datagram of zeros.
const std::array<uint32_t, 16>& UdpEndpoint::id_deltas(size_t total) {
  // A GSO send or GRO train repeats one length: the last one found first.
  if (total == last_id_total_) return *last_id_deltas_;
  auto it = id_deltas_.find(total);
  if (it != id_deltas_.end()) {
    last_id_total_ = total;
    last_id_deltas_ = &it->second;
    return it->second;
  }
  std::vector<uint8_t> f(total, 0);
  std::array<uint32_t, 16> d{};
  if (total >= kIpv4UdpLen + kBthLen + kIcrcLen) {
    header_ipv4(Ipv4Udp{}, total - kIpv4UdpLen - kIcrcLen, f.data());
    std::span<const uint8_t> ip(f.data(), total - kIcrcLen);
    const uint32_t icrc0 = icrc_compute(ip).value_or(0);
    for (int b = 0; b < 16; b++) {
      f[4] = uint8_t((1u << b) >> 8);  // IPv4 header: ID at bytes 4-5
      f[5] = uint8_t(1u << b);
      d[b] = icrc_compute(ip).value_or(icrc0) ^ icrc0;
    }
  }
  if (id_deltas_.size() > 4096) id_deltas_.clear();
  last_id_total_ = total;
  last_id_deltas_ = &id_deltas_.emplace(total, d).first->second;
  return *last_id_deltas_;
}

uint32_t UdpEndpoint::id_delta(size_t total, uint16_t id) {
  const auto& d = id_deltas(total);
  uint32_t x = 0;
  for (unsigned bits = id; bits; bits &= bits - 1) x ^= d[size_t(__builtin_ctz(bits))];
  return x;
}

// The difference between the ICRC received and the one computed with ID 0
// must be a combination of the 16 per-bit differences: Gaussian
// elimination (a basis by leading bit, then reduce the difference).
bool UdpEndpoint::icrc_matches_some_ipv4_id(size_t total, uint32_t icrc0, uint32_t got) {
  return in_xor_span(id_deltas(total), got ^ icrc0);
}

void UdpEndpoint::deliver(const sockaddr* from_sa, socklen_t from_len, const uint8_t* data, size_t n,
                          uint16_t ipv4_id) {
  Addr from;
  // Copies of a known size (this runs for every datagram).
  if (from_sa->sa_family == AF_INET && from_len >= sizeof(sockaddr_in)) {
    std::memcpy(&from.ss, from_sa, sizeof(sockaddr_in));
  } else if (from_sa->sa_family == AF_INET6 && from_len >= sizeof(sockaddr_in6)) {
    std::memcpy(&from.ss, from_sa, sizeof(sockaddr_in6));
  } else {
    return;
  }
  if (link_down_ && link_is_down()) [[unlikely]] {  // nor receives anything
    stats_.link_down_received++;
    return;
  }
  stats_.received++;
  if (n < kBthLen + kIcrcLen) {
    stats_.too_short++;
    return;
  }
  // The IP and UDP headers the datagram arrived with (IPv4 ID assumed 0):
  // the ICRC over them (IBTA Annex A17.4), their part of it cached.
  std::span<const uint8_t> transport(data, n - kIcrcLen);
  const RxPrefix* pre = rx_prefix(from, transport.size());
  const std::optional<uint32_t> computed =
      pre ? icrc_finish(pre->crc, std::span<const std::span<const uint8_t>>(&transport, 1)) : std::nullopt;
  if (!computed) {
    stats_.bad_icrc++;
    return;
  }
  // value_or, not *: GCC 12 at -Os warns (a false maybe-uninitialized) on
  // the optional's storage after the check above.
  const uint32_t crc = computed.value_or(0);
  const bool v4 = !from.v6();
  const uint32_t got = icrc_load(data + n - kIcrcLen);
  if (tap_.want && tap_.want(tap_.arg)) [[unlikely]] tap_in(from, data, n, crc, got, ipv4_id);
  if (crc != got) {
    const size_t total = (v4 ? kIpv4UdpLen : kIpv6UdpLen) + n;
    // The k-th datagram of a UDP GRO train was sent with IP ID k (see
    // flush_tx): an exact check. Else, if allowed, any ID (rxe).
    const bool exact = v4 && ipv4_id != 0 && (crc ^ id_delta(total, ipv4_id)) == got;
    if (!exact) {
      if (!any_ipv4_id_ || !v4 || !icrc_matches_some_ipv4_id(total, crc, got)) {
        stats_.bad_icrc++;
        return;
      }
      stats_.nonzero_ipv4_id++;
    }
  }
  const uint32_t dqpn = get_be24(transport.data() + 5);
  auto it = qps_.find(dqpn);
  if (it == qps_.end()) {
    stats_.no_qp++;
    return;
  }
  const uint64_t peer = pre->peer;
  if (it->second->config().type != QpType::kUD) return it->second->receive(transport, peer);
  // UD receives get the IP header as their GRH (RoCEv2: the IPv6 header,
  // or 20 bytes of zero then the IPv4 header).
  uint8_t grh[40] = {};
  header(from, rx_local_, transport.size(), hdr_);
  if (!v4) {
    std::memcpy(grh, hdr_, 40);
  } else {
    std::memcpy(grh + 20, hdr_, 20);
  }
  it->second->receive(transport, peer, grh);
}

// RoCEv2 multicast (IBTA annex A17.4.5: the MGID is the IP destination;
// the ICRC covers that header like any other). Not cached: the prefix of a
// multicast datagram depends on its group too, and multicast is rare here.
void UdpEndpoint::deliver_multicast(const sockaddr* from_sa, socklen_t from_len, const sockaddr* group_sa,
                                    socklen_t group_len, uint32_t qpn, const uint8_t* data, size_t n) {
  auto to_addr = [](const sockaddr* sa, socklen_t len, Addr* out) {
    if (sa->sa_family == AF_INET && len >= sizeof(sockaddr_in)) std::memcpy(&out->ss, sa, sizeof(sockaddr_in));
    else if (sa->sa_family == AF_INET6 && len >= sizeof(sockaddr_in6)) std::memcpy(&out->ss, sa, sizeof(sockaddr_in6));
    else return false;
    return true;
  };
  Addr from, group;
  if (!to_addr(from_sa, from_len, &from) || !to_addr(group_sa, group_len, &group) ||
      from.ss.ss_family != group.ss.ss_family || from.ss.ss_family != local_.ss.ss_family)
    return;
  if (link_is_down()) {
    stats_.link_down_received++;
    return;
  }
  stats_.received++;
  if (n < kBthLen + kIcrcLen) {
    stats_.too_short++;
    return;
  }
  std::span<const uint8_t> transport(data, n - kIcrcLen);
  const size_t hl = header(from, group, transport.size(), hdr_);
  const auto pre = hl ? icrc_prefix(std::span<const uint8_t>(hdr_, hl)) : std::nullopt;
  const auto computed = pre ? icrc_finish(*pre, std::span<const std::span<const uint8_t>>(&transport, 1)) : std::nullopt;
  const bool v4 = !from.v6();
  const uint32_t got = icrc_load(data + n - kIcrcLen);
  if (!computed || (computed.value_or(0) != got &&
                    (!any_ipv4_id_ || !v4 || !icrc_matches_some_ipv4_id(hl + n, computed.value_or(0), got)))) {
    stats_.bad_icrc++;
    return;
  }
  auto it = qps_.find(qpn);
  if (get_be24(transport.data() + 5) != kMulticastQpn || it == qps_.end() ||
      it->second->config().type != QpType::kUD) {
    stats_.no_qp++;
    return;
  }
  stats_.multicast++;
  // The GRH: the IP header as it came, its destination the group (IBTA
  // 11.4.1: a receive's first 40 bytes; RoCEv2 as in deliver()).
  uint8_t grh[40] = {};
  if (!v4) std::memcpy(grh, hdr_, 40);
  else std::memcpy(grh + 20, hdr_, 20);
  it->second->receive(transport, peer_for(from), grh);
}

void UdpEndpoint::poll(int timeout_ms) {
  pollfd p{fd_, POLLIN, 0};
  ::poll(&p, 1, timeout_ms);
  for (int budget = 0; budget < 256; budget++) {
    Addr from;
    socklen_t fl = sizeof from.ss;
    ssize_t n = recvfrom(fd_, rx_.data(), rx_.size(), 0, reinterpret_cast<sockaddr*>(&from.ss), &fl);
    if (n < 0) break;
    deliver(reinterpret_cast<const sockaddr*>(&from.ss), fl, rx_.data(), size_t(n));
  }
  flush_delayed();
  for (auto& [qpn, qp] : qps_) qp->progress();
  flush_delayed();
  flush_tx();
}

bool UdpEndpoint::run(const std::function<bool()>& done, uint64_t deadline_ns) {
  while (!done()) {
    const uint64_t now = clock_.now_ns();
    if (now >= deadline_ns) return done();
    uint64_t next = deadline_ns;
    for (auto& [qpn, qp] : qps_) next = std::min(next, qp->next_deadline());
    if (!delayed_.empty()) next = std::min(next, delayed_.top().at);
    int ms = next <= now ? 0 : int(std::min<uint64_t>((next - now + 999999) / 1000000, 100));
    poll(ms);
  }
  return true;
}

}  // namespace sv::roce
