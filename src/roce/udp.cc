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

int UdpEndpoint::bind(const std::string& addr, uint16_t port) {
  fd_ = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd_ < 0) return errno;
  // Never IP-fragment: DF on every datagram (and IP ID 0, which the ICRC covers).
  int pmtu = IP_PMTUDISC_DO;
  setsockopt(fd_, IPPROTO_IP, IP_MTU_DISCOVER, &pmtu, sizeof pmtu);
  local_.sin_family = AF_INET;
  local_.sin_port = htons(port);
  if (inet_pton(AF_INET, addr.c_str(), &local_.sin_addr) != 1) return EINVAL;
  if (::bind(fd_, reinterpret_cast<sockaddr*>(&local_), sizeof local_) != 0) return errno;
  socklen_t len = sizeof local_;
  getsockname(fd_, reinterpret_cast<sockaddr*>(&local_), &len);
  port_ = ntohs(local_.sin_port);
  return 0;
}

uint64_t UdpEndpoint::add_peer(const std::string& addr, uint16_t port) {
  Peer p;
  p.sa.sin_family = AF_INET;
  p.sa.sin_port = htons(port);
  inet_pton(AF_INET, addr.c_str(), &p.sa.sin_addr);
  peers_.push_back(p);
  return peers_.size() - 1;
}

uint64_t UdpEndpoint::peer_for(const sockaddr_in& sa) {
  for (size_t i = 0; i < peers_.size(); i++) {
    if (peers_[i].sa.sin_addr.s_addr == sa.sin_addr.s_addr && peers_[i].sa.sin_port == sa.sin_port) return i;
  }
  peers_.push_back(Peer{sa});
  return peers_.size() - 1;
}

void UdpEndpoint::attach(Qp* qp) { qps_[qp->config().qpn] = qp; }
void UdpEndpoint::detach(uint32_t qpn) { qps_.erase(qpn); }

namespace {
Ipv4Udp ipv4_of(const sockaddr_in& src, const sockaddr_in& dst) {
  Ipv4Udp h;
  std::memcpy(h.src.data(), &src.sin_addr, 4);
  std::memcpy(h.dst.data(), &dst.sin_addr, 4);
  h.sport = ntohs(src.sin_port);
  h.dport = ntohs(dst.sin_port);
  return h;
}
}  // namespace

void UdpEndpoint::send(uint64_t ah, std::span<const uint8_t> packet) {
  if (ah >= peers_.size() || fd_ < 0) return;
  // Build the datagram as the kernel will put it on the wire, to get the ICRC.
  size_t n = frame_ipv4(ipv4_of(local_, peers_[ah].sa), packet, frame_);
  if (n == 0) return;
  std::span<const uint8_t> udp_payload(frame_.data() + kIpv4UdpLen, n - kIpv4UdpLen);
  if (!faulty_) return transmit(ah, udp_payload);
  FaultDecision d = faults_.decide();
  if (d.copies == 0) stats_.fault_dropped++;
  for (int c = 0; c < d.copies; c++) {
    if (d.delay_ns[c] == 0) {
      transmit(ah, udp_payload);
    } else {
      delayed_.push(Delayed{clock_.now_ns() + d.delay_ns[c], seq_++, ah,
                            std::vector<uint8_t>(udp_payload.begin(), udp_payload.end())});
    }
  }
}

void UdpEndpoint::transmit(uint64_t ah, std::span<const uint8_t> udp_payload) {
  const sockaddr_in& sa = peers_[ah].sa;
  // A full socket buffer loses the datagram, as a congested link would.
  if (sendto(fd_, udp_payload.data(), udp_payload.size(), 0, reinterpret_cast<const sockaddr*>(&sa), sizeof sa) >= 0) {
    stats_.sent++;
  }
}

void UdpEndpoint::flush_delayed() {
  const uint64_t now = clock_.now_ns();
  while (!delayed_.empty() && delayed_.top().at <= now) {
    Delayed d = delayed_.top();
    delayed_.pop();
    transmit(d.ah, d.bytes);
  }
}

void UdpEndpoint::poll(int timeout_ms) {
  pollfd p{fd_, POLLIN, 0};
  ::poll(&p, 1, timeout_ms);
  for (int budget = 0; budget < 256; budget++) {
    sockaddr_in from{};
    socklen_t fl = sizeof from;
    ssize_t n = recvfrom(fd_, rx_.data(), rx_.size(), 0, reinterpret_cast<sockaddr*>(&from), &fl);
    if (n < 0) break;
    stats_.received++;
    if (size_t(n) < kBthLen + kIcrcLen) {
      stats_.too_short++;
      continue;
    }
    // Rebuild the IPv4 and UDP headers the datagram arrived with (IP ID
    // assumed 0) and check the ICRC over them (IBTA Annex A17.4).
    std::span<const uint8_t> transport(rx_.data(), size_t(n) - kIcrcLen);
    const size_t total = frame_ipv4(ipv4_of(from, local_), transport, frame_);
    if (total == 0 || icrc_load(frame_.data() + total - kIcrcLen) != icrc_load(rx_.data() + n - kIcrcLen)) {
      stats_.bad_icrc++;
      continue;
    }
    const uint32_t dqpn = get_be24(transport.data() + 5);
    auto it = qps_.find(dqpn);
    if (it == qps_.end()) {
      stats_.no_qp++;
      continue;
    }
    it->second->receive(transport, peer_for(from));
  }
  flush_delayed();
  for (auto& [qpn, qp] : qps_) qp->progress();
  flush_delayed();
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
