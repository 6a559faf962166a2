#include "daemon/roce_port.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>

#include "common/trace.h"

namespace sv::daemon {

namespace {

constexpr uint16_t kRoceV2Port = 4791;  // IBTA annex A17.2.1

// SOFTVERBS_FAULTS="drop=0.01,dup=0.01,reorder=0.01,delay_us=200,seed=N":
// the fault hook every attached QP's sender applies (src/roce/fault.h).
void parse_faults(const char* s, proto::RoceAttachReply& f) {
  f.reorder_delay_us = 200;
  f.seed = 1;
  if (!s) return;
  std::string str(s);
  size_t pos = 0;
  while (pos < str.size()) {
    size_t end = str.find(',', pos);
    if (end == std::string::npos) end = str.size();
    std::string kv = str.substr(pos, end - pos);
    pos = end + 1;
    size_t eq = kv.find('=');
    if (eq == std::string::npos) continue;
    std::string k = kv.substr(0, eq);
    double v = std::strtod(kv.c_str() + eq + 1, nullptr);
    auto ppm = [](double p) { return uint32_t(p < 0 ? 0 : p > 1 ? 1000000 : p * 1e6); };
    if (k == "drop") f.drop_ppm = ppm(v);
    else if (k == "dup") f.dup_ppm = ppm(v);
    else if (k == "reorder") f.reorder_ppm = ppm(v);
    else if (k == "delay_us") f.reorder_delay_us = uint32_t(v);
    else if (k == "seed") f.seed = std::strtoull(kv.c_str() + eq + 1, nullptr, 0);
  }
}

}  // namespace

int RocePort::open() {
  parse_faults(std::getenv("SOFTVERBS_FAULTS"), faults_);
  ifaddrs* ifs = nullptr;
  if (::getifaddrs(&ifs) != 0) return errno;
  for (ifaddrs* i = ifs; i; i = i->ifa_next) {
    if (!i->ifa_addr || (i->ifa_flags & IFF_LOOPBACK)) continue;
    const int fam = i->ifa_addr->sa_family;
    if (fam != AF_INET && fam != AF_INET6) continue;
    Sock s{};
    sockaddr_storage ss{};
    socklen_t len;
    if (fam == AF_INET) {
      auto a = *reinterpret_cast<sockaddr_in*>(i->ifa_addr);
      a.sin_port = htons(kRoceV2Port);
      std::memcpy(&ss, &a, sizeof a);
      len = sizeof a;
      s.gid[10] = s.gid[11] = 0xff;
      std::memcpy(s.gid + 12, &a.sin_addr, 4);
    } else {
      auto a = *reinterpret_cast<sockaddr_in6*>(i->ifa_addr);
      if (IN6_IS_ADDR_LINKLOCAL(&a.sin6_addr)) continue;  // needs a scope; not in our GID use
      a.sin6_port = htons(kRoceV2Port);
      std::memcpy(&ss, &a, sizeof a);
      len = sizeof a;
      std::memcpy(s.gid, &a.sin6_addr, 16);
    }
    s.fd.reset(::socket(fam, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (!s.fd.valid()) continue;
    // RoCEv2 is never IP-fragmented: DF set (and, on IPv4, IP ID 0, which
    // the ICRC covers; see docs/ROCE.md).
    int pmtu = fam == AF_INET ? IP_PMTUDISC_DO : IPV6_PMTUDISC_DO;
    if (fam == AF_INET) ::setsockopt(s.fd.get(), IPPROTO_IP, IP_MTU_DISCOVER, &pmtu, sizeof pmtu);
    else ::setsockopt(s.fd.get(), IPPROTO_IPV6, IPV6_MTU_DISCOVER, &pmtu, sizeof pmtu);
    if (fam == AF_INET6) {
      int one = 1;
      ::setsockopt(s.fd.get(), IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
    }
    int big = 4 << 20;
    ::setsockopt(s.fd.get(), SOL_SOCKET, SO_RCVBUF, &big, sizeof big);
    ::setsockopt(s.fd.get(), SOL_SOCKET, SO_SNDBUF, &big, sizeof big);
    if (::bind(s.fd.get(), reinterpret_cast<sockaddr*>(&ss), len) != 0) {
      SV_TRACE("daemon: RoCE: bind %s: %s", i->ifa_name, std::strerror(errno));
      continue;
    }
    socks_.push_back(std::move(s));
  }
  ::freeifaddrs(ifs);
  return socks_.empty() ? EADDRNOTAVAIL : 0;
}

std::vector<int> RocePort::fds() const {
  std::vector<int> v;
  for (const auto& s : socks_) v.push_back(s.fd.get());
  return v;
}

bool RocePort::owns(int fd) const {
  for (const auto& s : socks_) {
    if (s.fd.get() == fd) return true;
  }
  return false;
}

void RocePort::readable(int fd) {
  auto* pre = reinterpret_cast<proto::RoceArrival*>(buf_);
  for (int budget = 0; budget < 512; ++budget) {
    sockaddr_storage from{};
    socklen_t fl = sizeof from;
    ssize_t n = ::recvfrom(fd, buf_ + sizeof *pre, sizeof buf_ - sizeof *pre, 0,
                           reinterpret_cast<sockaddr*>(&from), &fl);
    if (n < 0) return;
    if (n < 12 + 4 || fl > sizeof pre->from) continue;  // BTH + ICRC at least
    const uint8_t* bth = buf_ + sizeof *pre;
    const uint32_t dqpn = uint32_t(bth[5]) << 16 | uint32_t(bth[6]) << 8 | bth[7];
    if (dqpn == 1 && on_qp1) {
      on_qp1(fd, reinterpret_cast<sockaddr*>(&from), fl, bth, size_t(n));
      continue;
    }
    auto q = qpns_.find(dqpn);
    if (q == qpns_.end()) continue;
    auto a = arrivals_.find(q->second);
    if (a == arrivals_.end()) continue;
    std::memset(pre, 0, sizeof *pre);
    std::memcpy(pre->from, &from, fl);
    pre->from_len = fl;
    // A client that does not keep up loses datagrams, as a full NIC queue would.
    ::send(a->second.mine.get(), buf_, sizeof *pre + size_t(n), MSG_DONTWAIT | MSG_NOSIGNAL);
  }
}

int RocePort::attach(uint32_t client, const proto::RoceAttachReq& req, proto::RoceAttachReply& rep,
                     std::vector<int>& out_fds) {
  const Sock* sock = nullptr;
  for (const auto& s : socks_) {
    if (std::memcmp(s.gid, req.sgid, 16) == 0) sock = &s;
  }
  if (!sock) return EADDRNOTAVAIL;
  auto it = arrivals_.find(client);
  if (it == arrivals_.end()) {
    int sv[2];
    if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) return errno;
    Arrival a;
    a.mine.reset(sv[0]);
    a.theirs.reset(sv[1]);
    int big = 8 << 20;
    ::setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &big, sizeof big);
    ::setsockopt(sv[1], SOL_SOCKET, SO_RCVBUF, &big, sizeof big);
    it = arrivals_.emplace(client, std::move(a)).first;
  }
  qpns_[req.qpn & 0xffffff] = client;
  rep.drop_ppm = faults_.drop_ppm;
  rep.dup_ppm = faults_.dup_ppm;
  rep.reorder_ppm = faults_.reorder_ppm;
  rep.reorder_delay_us = faults_.reorder_delay_us;
  rep.seed = faults_.seed;
  out_fds.push_back(sock->fd.get());
  out_fds.push_back(it->second.theirs.get());
  return 0;
}

void RocePort::remove_client(uint32_t client) {
  arrivals_.erase(client);
  for (auto it = qpns_.begin(); it != qpns_.end();) {
    if (it->second == client) it = qpns_.erase(it);
    else ++it;
  }
}

}  // namespace sv::daemon
