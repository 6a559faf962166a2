#include "roce/udp.h"

#include <arpa/inet.h>
#include <poll.h>
#include <sys/socket.h>
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
    : clock_(clock), faults_(faults), faulty_(faults.drop > 0 || faults.duplicate > 0 || faults.reorder > 0) {
  frame_.resize(65536);
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

int UdpEndpoint::bind(const std::string& addr, uint16_t port) {
  if (!parse(addr, port, &local_)) return EINVAL;
  fd_ = socket(local_.ss.ss_family, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd_ < 0) return errno;
  // Never IP-fragment: DF on every IPv4 datagram (and IP ID 0, which the
  // ICRC covers); no fragmentation on IPv6 either.
  if (local_.v6()) {
    int pmtu = IPV6_PMTUDISC_DO;
    setsockopt(fd_, IPPROTO_IPV6, IPV6_MTU_DISCOVER, &pmtu, sizeof pmtu);
  } else {
    int pmtu = IP_PMTUDISC_DO;
    setsockopt(fd_, IPPROTO_IP, IP_MTU_DISCOVER, &pmtu, sizeof pmtu);
  }
  if (::bind(fd_, local_.sa(), local_.len()) != 0) return errno;
  socklen_t len = sizeof local_.ss;
  getsockname(fd_, reinterpret_cast<sockaddr*>(&local_.ss), &len);
  port_ = ntohs(local_.v6() ? reinterpret_cast<sockaddr_in6&>(local_.ss).sin6_port
                            : reinterpret_cast<sockaddr_in&>(local_.ss).sin_port);
  return 0;
}

int UdpEndpoint::adopt(int fd) {
  local_ = Addr{};
  socklen_t len = sizeof local_.ss;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&local_.ss), &len) != 0) return errno;
  if (local_.ss.ss_family != AF_INET && local_.ss.ss_family != AF_INET6) return EAFNOSUPPORT;
  if (fd_ >= 0) close(fd_);
  fd_ = fd;
  port_ = ntohs(local_.v6() ? reinterpret_cast<sockaddr_in6&>(local_.ss).sin6_port
                            : reinterpret_cast<sockaddr_in&>(local_.ss).sin_port);
  return 0;
}

uint64_t UdpEndpoint::add_peer(const std::string& addr, uint16_t port) {
  Addr a;
  if (!parse(addr, port, &a) || a.ss.ss_family != local_.ss.ss_family) return UINT64_MAX;
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
    return "[" + std::string(buf) + "]:" + std::to_string(ntohs(x.sin6_port));
  }
  auto& x = reinterpret_cast<const sockaddr_in&>(a.ss);
  inet_ntop(AF_INET, &x.sin_addr, buf, sizeof buf);
  return std::string(buf) + ":" + std::to_string(ntohs(x.sin_port));
}

void UdpEndpoint::attach(Qp* qp) { qps_[qp->config().qpn] = qp; }
void UdpEndpoint::detach(uint32_t qpn) { qps_.erase(qpn); }

size_t UdpEndpoint::frame(const Addr& src, const Addr& dst, std::span<const uint8_t> transport, size_t* hdr) {
  if (src.v6()) {
    auto& s = reinterpret_cast<const sockaddr_in6&>(src.ss);
    auto& d = reinterpret_cast<const sockaddr_in6&>(dst.ss);
    Ipv6Udp h;  // class, flow label and hop limit are masked: their values do not matter
    std::memcpy(h.src.data(), &s.sin6_addr, 16);
    std::memcpy(h.dst.data(), &d.sin6_addr, 16);
    h.sport = ntohs(s.sin6_port);
    h.dport = ntohs(d.sin6_port);
    *hdr = kIpv6UdpLen;
    return frame_ipv6(h, transport, frame_);
  }
  auto& s = reinterpret_cast<const sockaddr_in&>(src.ss);
  auto& d = reinterpret_cast<const sockaddr_in&>(dst.ss);
  Ipv4Udp h;
  std::memcpy(h.src.data(), &s.sin_addr, 4);
  std::memcpy(h.dst.data(), &d.sin_addr, 4);
  h.sport = ntohs(s.sin_port);
  h.dport = ntohs(d.sin_port);
  *hdr = kIpv4UdpLen;
  return frame_ipv4(h, transport, frame_);
}

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

void UdpEndpoint::send(uint64_t ah, std::span<const uint8_t> packet) {
  if (ah >= peers_.size() || fd_ < 0) return;
  // The ICRC over the headers the kernel will build and the packet, in place.
  uint8_t hdr[kIpv6UdpLen];
  const size_t hl = header(local_, peers_[ah], packet.size(), hdr);
  if (hl == 0) return;
  auto crc = icrc_compute(std::span<const uint8_t>(hdr, hl), packet);
  if (!crc) return;
  uint8_t icrc[kIcrcLen];
  icrc_store(icrc, *crc);
  if (!faulty_) return transmit(ah, packet, icrc);
  FaultDecision d = faults_.decide();
  if (d.copies == 0) stats_.fault_dropped++;
  if (d.copies == 2) stats_.fault_duplicated++;
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

void UdpEndpoint::transmit(uint64_t ah, std::span<const uint8_t> a, std::span<const uint8_t> b) {
  const Addr& dst = peers_[ah];
  if (batching_ && a.size() + b.size() <= kTxSlot) {
    if (txbuf_.empty()) {
      txbuf_.resize(kTxBatch * kTxSlot);
      txmsg_.resize(kTxBatch);
      txiov_.resize(kTxBatch);
    }
    uint8_t* p = txbuf_.data() + size_t(tx_n_) * kTxSlot;
    std::memcpy(p, a.data(), a.size());
    if (!b.empty()) std::memcpy(p + a.size(), b.data(), b.size());
    txiov_[tx_n_] = {p, a.size() + b.size()};
    msghdr& m = txmsg_[tx_n_].msg_hdr;
    m = msghdr{};
    m.msg_name = const_cast<sockaddr*>(dst.sa());
    m.msg_namelen = dst.len();
    m.msg_iov = &txiov_[tx_n_];
    m.msg_iovlen = 1;
    if (++tx_n_ == kTxBatch) flush_tx();
    return;
  }
  flush_tx();  // keep the order
  iovec iov[2] = {{const_cast<uint8_t*>(a.data()), a.size()}, {const_cast<uint8_t*>(b.data()), b.size()}};
  msghdr m{};
  m.msg_name = const_cast<sockaddr*>(dst.sa());
  m.msg_namelen = dst.len();
  m.msg_iov = iov;
  m.msg_iovlen = b.empty() ? 1 : 2;
  // A full socket buffer loses the datagram, as a congested link would.
  if (sendmsg(fd_, &m, 0) >= 0) stats_.sent++;
}

void UdpEndpoint::flush_tx() {
  int done = 0;
  while (done < tx_n_) {
    int n = sendmmsg(fd_, txmsg_.data() + done, unsigned(tx_n_ - done), 0);
    if (n <= 0) {
      if (n < 0 && errno == EINTR) continue;
      // A full socket buffer (EAGAIN) loses this datagram, as a congested
      // link would; the rest may still go.
      done++;
      continue;
    }
    stats_.sent += uint64_t(n);
    done += n;
  }
  tx_n_ = 0;
}

void UdpEndpoint::flush_delayed(bool all) {
  const uint64_t now = all ? UINT64_MAX : clock_.now_ns();
  while (!delayed_.empty() && delayed_.top().at <= now) {
    Delayed d = delayed_.top();
    delayed_.pop();
    transmit(d.ah, d.bytes);
  }
}

// CRC-32 is affine over GF(2): for datagrams of one length, the ICRC with
// IP ID x is the ICRC with ID 0 XOR a linear function of x's 16 bits. So the
// difference between the ICRC received and the one computed with ID 0 must
// be a combination of the 16 per-bit differences, which are computed once
// per length (frame_ holds the datagram with ID 0).
bool UdpEndpoint::icrc_matches_some_ipv4_id(size_t total, uint32_t got) {
  const uint32_t icrc0 = icrc_load(frame_.data() + total - kIcrcLen);
  auto it = id_deltas_.find(total);
  if (it == id_deltas_.end()) {
    std::array<uint32_t, 16> d{};
    std::span<const uint8_t> ip(frame_.data(), total - kIcrcLen);
    for (int b = 0; b < 16; b++) {
      frame_[4] = uint8_t((1u << b) >> 8);  // IPv4 header: ID at bytes 4-5
      frame_[5] = uint8_t(1u << b);
      d[b] = icrc_compute(ip).value_or(icrc0) ^ icrc0;
    }
    frame_[4] = frame_[5] = 0;
    if (id_deltas_.size() > 4096) id_deltas_.clear();
    it = id_deltas_.emplace(total, d).first;
  }
  // Gaussian elimination: a basis by leading bit, then reduce the difference.
  uint32_t basis[32] = {};
  for (uint32_t v : it->second) {
    for (int bit = 31; bit >= 0 && v; bit--) {
      if (!(v >> bit & 1)) continue;
      if (!basis[bit]) {
        basis[bit] = v;
        break;
      }
      v ^= basis[bit];
    }
  }
  uint32_t diff = got ^ icrc0;
  for (int bit = 31; bit >= 0 && diff; bit--) {
    if (!(diff >> bit & 1)) continue;
    if (!basis[bit]) return false;
    diff ^= basis[bit];
  }
  return diff == 0;
}

void UdpEndpoint::deliver(const sockaddr* from_sa, socklen_t from_len, const uint8_t* data, size_t n) {
  Addr from;
  if (from_len > sizeof from.ss) return;
  std::memcpy(&from.ss, from_sa, from_len);
  stats_.received++;
  if (n < kBthLen + kIcrcLen) {
    stats_.too_short++;
    return;
  }
  // Rebuild the IP and UDP headers the datagram arrived with (IPv4 ID
  // assumed 0) and check the ICRC over them (IBTA Annex A17.4).
  std::span<const uint8_t> transport(data, n - kIcrcLen);
  const size_t hdr = header(from, local_, transport.size(), hdr_);
  auto crc = hdr ? icrc_compute(std::span<const uint8_t>(hdr_, hdr), transport) : std::nullopt;
  if (!crc) {
    stats_.bad_icrc++;
    return;
  }
  if (*crc != icrc_load(data + n - kIcrcLen)) {
    size_t h2 = 0;
    const size_t total = any_ipv4_id_ && hdr == kIpv4UdpLen ? frame(from, local_, transport, &h2) : 0;
    if (total == 0 || !icrc_matches_some_ipv4_id(total, icrc_load(data + n - kIcrcLen))) {
      stats_.bad_icrc++;
      return;
    }
    stats_.nonzero_ipv4_id++;
  }
  const uint32_t dqpn = get_be24(transport.data() + 5);
  auto it = qps_.find(dqpn);
  if (it == qps_.end()) {
    stats_.no_qp++;
    return;
  }
  // UD receives get the IP header as their GRH (RoCEv2: the IPv6 header,
  // or 20 bytes of zero then the IPv4 header).
  uint8_t grh[40] = {};
  if (hdr == kIpv6UdpLen) {
    std::memcpy(grh, hdr_, 40);
  } else {
    std::memcpy(grh + 20, hdr_, 20);
  }
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
