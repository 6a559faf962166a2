#include "daemon/roce_port.h"

#include <arpa/inet.h>
#include <linux/filter.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>

#include "common/trace.h"
#include "roce/udp.h"

namespace sv::daemon {

namespace {

constexpr uint16_t kRoceV2Port = 4791;  // IBTA annex A17.2.1

// A UDP socket bound to `ss` (port 4791), options as RoCEv2 needs them;
// with `reuseport`, one that joins (or starts) the address's SO_REUSEPORT
// group. Invalid on failure (errno set).
//
// Multicast sent on it (docs/ROCE.md, "Multicast") leaves by the interface
// of its address (`ifindex`) and is not looped back to this host: its
// members had it through shared memory already (a second copy from the IP
// loopback would deliver it twice).
Fd open_udp(const sockaddr_storage& ss, socklen_t len, bool reuseport, unsigned ifindex) {
  const int fam = ss.ss_family;
  Fd fd(::socket(fam, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd.valid()) return fd;
  roce::set_roce_socket_options(fd.get(), fam);
  int zero = 0;
  if (fam == AF_INET) {
    ::setsockopt(fd.get(), IPPROTO_IP, IP_MULTICAST_LOOP, &zero, sizeof zero);
    ip_mreqn m{};
    m.imr_address = reinterpret_cast<const sockaddr_in&>(ss).sin_addr;
    m.imr_ifindex = int(ifindex);
    ::setsockopt(fd.get(), IPPROTO_IP, IP_MULTICAST_IF, &m, sizeof m);
  } else {
    ::setsockopt(fd.get(), IPPROTO_IPV6, IPV6_MULTICAST_LOOP, &zero, sizeof zero);
    if (ifindex) ::setsockopt(fd.get(), IPPROTO_IPV6, IPV6_MULTICAST_IF, &ifindex, sizeof ifindex);
  }
  int one = 1;
  if (reuseport) ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEPORT, &one, sizeof one);
  // A window of 256 packets in flight must fit in the receive buffer, or
  // the kernel drops and the sender waits out a retransmission timeout:
  // beyond net.core.rmem_max when we may (CAP_NET_ADMIN).
  int big = 8 << 20;
  if (::setsockopt(fd.get(), SOL_SOCKET, SO_RCVBUFFORCE, &big, sizeof big) != 0)
    ::setsockopt(fd.get(), SOL_SOCKET, SO_RCVBUF, &big, sizeof big);
  if (::setsockopt(fd.get(), SOL_SOCKET, SO_SNDBUFFORCE, &big, sizeof big) != 0)
    ::setsockopt(fd.get(), SOL_SOCKET, SO_SNDBUF, &big, sizeof big);
  if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&ss), len) != 0) {
    int e = errno;
    fd.reset();
    errno = e;
  }
  return fd;
}

constexpr uint32_t kCmQpn = 1;        // QP1, the General Services Interface (CM MADs): the daemon's, never steered
constexpr size_t kMaxSlots = 256;     // client sockets per address; more clients use forwarding

// The wire rule of the plan for `qpn`, per million.
void set_faults(const faults::Plan& p, uint32_t qpn, proto::RoceAttachReply& rep) {
  rep.seed = p.seed;
  rep.reorder_delay_us = 200;
  const faults::WireRule* r = faults::wire_for(p, qpn);
  if (!r) return;
  auto ppm = [](double x) { return uint32_t(x * 1e6 + 0.5); };
  rep.drop_ppm = ppm(r->drop);
  rep.dup_ppm = ppm(r->dup);
  rep.reorder_ppm = ppm(r->reorder);
  rep.corrupt_ppm = ppm(r->corrupt);
  rep.reorder_delay_us = r->delay_us;
}

}  // namespace

int RocePort::open() {
  opened_ = true;
  // The wire part of the fault plan (common/fault_plan.h), which every
  // attached QP's sender applies (src/roce/fault.h). The library refuses
  // contexts under a bad plan; the daemon says why and runs without one.
  if (std::string e = faults::from_environment(faults_); !e.empty())
    std::fprintf(stderr, "softverbsd: %s (no wire faults)\n", e.c_str());
  if (const char* e = std::getenv("SOFTVERBS_TEST_STEER_LIMIT")) steer_limit_ = std::strtoul(e, nullptr, 10);
  ifaddrs* ifs = nullptr;
  if (::getifaddrs(&ifs) != 0) return errno;
  for (ifaddrs* i = ifs; i; i = i->ifa_next) {
    if (!i->ifa_addr || (i->ifa_flags & IFF_LOOPBACK)) continue;
    const int fam = i->ifa_addr->sa_family;
    if (fam != AF_INET && fam != AF_INET6) continue;
    Address a{};
    a.ifindex = ::if_nametoindex(i->ifa_name);
    if (fam == AF_INET) {
      auto in = *reinterpret_cast<sockaddr_in*>(i->ifa_addr);
      in.sin_port = htons(kRoceV2Port);
      std::memcpy(&a.ss, &in, sizeof in);
      a.len = sizeof in;
      a.gid[10] = a.gid[11] = 0xff;
      std::memcpy(a.gid + 12, &in.sin_addr, 4);
    } else {
      auto in6 = *reinterpret_cast<sockaddr_in6*>(i->ifa_addr);
      if (IN6_IS_ADDR_LINKLOCAL(&in6.sin6_addr)) continue;  // needs a scope; not in our GID use
      in6.sin6_port = htons(kRoceV2Port);
      std::memcpy(&a.ss, &in6, sizeof in6);
      a.len = sizeof in6;
      std::memcpy(a.gid, &in6.sin6_addr, 16);
    }
    if (int e = bind_address(a); e == EADDRINUSE) busy_.push_back(a);
  }
  ::freeifaddrs(ifs);
  return socks_.empty() ? (busy_.empty() ? EADDRNOTAVAIL : EADDRINUSE) : 0;
}

int RocePort::bind_address(const Address& a) {
  // The port must be ours alone: probe with a plain bind first (a second
  // daemon, or rxe, holds it), then bind again as the first member of a
  // reuseport group, whose other members will be our clients' sockets.
  {
    Fd probe = open_udp(a.ss, a.len, false, a.ifindex);
    if (!probe.valid()) {
      int e = errno;
      SV_TRACE("daemon: RoCE: bind port %u: %s", kRoceV2Port, std::strerror(e));
      return e;
    }
  }
  Sock s{};
  s.fd = open_udp(a.ss, a.len, true, a.ifindex);
  if (!s.fd.valid()) {
    int e = errno;
    SV_TRACE("daemon: RoCE: bind port %u: %s", kRoceV2Port, std::strerror(e));
    return e;
  }
  std::memcpy(s.gid, a.gid, 16);
  s.ifindex = a.ifindex;
  s.addr = a.ss;
  s.addr_len = a.len;
  socks_.push_back(std::move(s));
  // Before any client socket joins the group, a program that sends
  // everything to index 0: without one the kernel would spread datagrams
  // over the group by a hash of the addresses.
  socks_.back().steering = steer(socks_.size() - 1);
  if (on_new_fd) on_new_fd(socks_.back().fd.get());
  return 0;
}

// The address of `gid` was held by someone else at open(): try again (its
// holder may have stopped since). Its index in socks_, or a negative errno.
int RocePort::retry_busy(const uint8_t* gid) {
  for (auto it = busy_.begin(); it != busy_.end(); ++it) {
    if (std::memcmp(it->gid, gid, 16) != 0) continue;
    if (int e = bind_address(*it)) return -e;
    busy_.erase(it);
    return int(socks_.size() - 1);
  }
  return -EADDRNOTAVAIL;
}

// The steering program (classic BPF, run by the kernel on each datagram for
// the group's address with the packet starting at the UDP payload, i.e. the
// BTH; checked by experiment on Linux 6.18, and by the roce.wire steering
// test). It returns a socket index in the group: the destination QPN's
// client socket, else 0 (the daemon). A load beyond a short datagram ends
// the program with 0, the daemon's socket too. An index beyond the group
// would make the kernel fall back to a hash: every index it returns exists.
bool RocePort::steer(size_t si) {
  Sock& s = socks_[si];
  std::vector<sock_filter> f;
  f.push_back(BPF_STMT(BPF_LD | BPF_W | BPF_ABS, 4));               // BTH bytes 4-7: resv8, DestQP
  f.push_back(BPF_STMT(BPF_ALU | BPF_AND | BPF_K, 0xffffff));
  size_t entries = 0;
  for (const auto& [qpn, client] : qpns_) {
    if (qpn == kCmQpn || f.size() + 3 > BPF_MAXINSNS || entries >= steer_limit_) continue;  // the rest: forwarded
    auto qs = qpn_sock_.find(qpn);
    auto q2 = qpn_sock2_.find(qpn);  // a UD QP's second address
    if ((qs == qpn_sock_.end() || qs->second != si) && (q2 == qpn_sock2_.end() || q2->second != si)) continue;
    const auto ln = qpn_lane_.find(qpn);
    const uint32_t lane = ln == qpn_lane_.end() ? 0 : ln->second;
    for (size_t j = 0; j < s.slots.size(); ++j) {
      if (!s.slots[j].used || s.slots[j].client != client || s.slots[j].lane != lane) continue;
      f.push_back(BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, qpn, 0, 1));
      f.push_back(BPF_STMT(BPF_RET | BPF_K, uint32_t(j + 1)));
      ++entries;
      break;
    }
  }
  f.push_back(BPF_STMT(BPF_RET | BPF_K, 0));
  sock_fprog prog{uint16_t(f.size()), f.data()};
  if (::setsockopt(s.fd.get(), SOL_SOCKET, SO_ATTACH_REUSEPORT_CBPF, &prog, sizeof prog) != 0) {
    SV_TRACE("daemon: RoCE: steering program: %s", std::strerror(errno));
    return false;
  }
  return true;
}

int RocePort::slot_for(size_t si, uint32_t client, uint32_t lane, uid_t uid) {
  Sock& s = socks_[si];
  if (!s.steering) return -1;
  int free_slot = -1;
  for (size_t j = 0; j < s.slots.size(); ++j) {
    if (s.slots[j].used && s.slots[j].client == client && s.slots[j].lane == lane) return int(j);
    // A departed client's process may live on in a child that inherited the
    // socket: hand it only to the same user (system daemon).
    if (!s.slots[j].used && s.slots[j].uid == uid && free_slot < 0) free_slot = int(j);
  }
  if (free_slot >= 0) {
    // What the previous owner left: datagrams for QPNs that are not the new
    // owner's. (Its QPNs left the program when it went.)
    uint8_t junk[64];
    while (::recv(s.slots[free_slot].fd.get(), junk, sizeof junk, MSG_DONTWAIT) >= 0) {
    }
  } else {
    if (s.slots.size() >= kMaxSlots) return -1;
    Fd fd = open_udp(s.addr, s.addr_len, true, s.ifindex);
    if (!fd.valid()) {
      SV_TRACE("daemon: RoCE: client socket: %s", std::strerror(errno));
      return -1;
    }
    s.slots.push_back(Slot{std::move(fd), false, 0, uid});
    free_slot = int(s.slots.size() - 1);
  }
  s.slots[free_slot].used = true;
  s.slots[free_slot].client = client;
  s.slots[free_slot].lane = lane;
  return free_slot;
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
  for (const auto& g : groups_) {
    if (g.fd.get() == fd) return true;
  }
  return false;
}

// A datagram for `qpn` came to socket `fd`: true if that is the socket of
// an address the QP attached on. The QPN space is the daemon's, over all
// its addresses; a QP listens on its own (its GID's) only, as Linux rxe
// checks the IP destination of a connected QP's packets against the QP's
// source GID (rxe_recv.c, check_addr). The steering programs hold this by
// construction (one per address, naming that address's QPNs).
bool RocePort::arrived_at_own_address(int fd, uint32_t qpn) const {
  auto own = [&](const std::map<uint32_t, size_t>& m) {
    auto it = m.find(qpn);
    return it != m.end() && it->second < socks_.size() && socks_[it->second].fd.get() == fd;
  };
  return own(qpn_sock_) || own(qpn_sock2_);
}

void RocePort::readable(int fd) {
  for (const auto& g : groups_) {
    if (g.fd.get() == fd) return group_readable(g);
  }
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
    if (q == qpns_.end() || !arrived_at_own_address(fd, dqpn)) continue;
    auto a = arrivals_.find(q->second);
    if (a == arrivals_.end()) continue;
    std::memset(pre, 0, sizeof *pre);
    std::memcpy(pre->from, &from, fl);
    pre->from_len = fl;
    // A client that does not keep up loses datagrams, as a full NIC queue would.
    ::send(a->second.mine.get(), buf_, sizeof *pre + size_t(n), MSG_DONTWAIT | MSG_NOSIGNAL);
  }
}

// The client's own socket for sending on socks_[si]'s address: bound to
// that address at a port of the kernel's choice (RoCEv2's UDP source port
// is free, IBTA annex A17.2.3; peers answer on 4791), in no reuseport
// group, so that what it can do with it concerns its own datagrams only.
// One per client and address; -1 on failure.
int RocePort::sender_for(size_t si, uint32_t client) {
  auto key = std::make_pair(client, si);
  auto it = senders_.find(key);
  if (it != senders_.end()) return it->second.get();
  sockaddr_storage ss = socks_[si].addr;
  if (ss.ss_family == AF_INET) reinterpret_cast<sockaddr_in&>(ss).sin_port = 0;
  else reinterpret_cast<sockaddr_in6&>(ss).sin6_port = 0;
  Fd fd = open_udp(ss, socks_[si].addr_len, false, socks_[si].ifindex);
  if (!fd.valid()) {
    SV_TRACE("daemon: RoCE: client's sending socket: %s", std::strerror(errno));
    return -1;
  }
  // It only sends: what reaches its port is never read.
  int small = 0;
  ::setsockopt(fd.get(), SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
  const int raw = fd.get();
  senders_.emplace(key, std::move(fd));
  return raw;
}

// The socket the client sends (and, steered, receives) on: its own member
// of the address's group when the kernel would let it make one itself,
// else sender_for(). kRoceSteered in rep.flags says which.
int RocePort::client_socket(size_t si, uint32_t client, uint32_t lane, uid_t uid, bool steerable,
                            proto::RoceAttachReply& rep) {
  // A member of the group can replace the group's steering program
  // (SO_ATTACH_REUSEPORT_CBPF / _EBPF, SO_DETACH_REUSEPORT_BPF: no
  // privilege, no lock: net/core/sock_reuseport.c) and so take every
  // datagram to the port. Only a client whose user is the owner of the
  // group's sockets gets one: the kernel admits that user's sockets to the
  // group anyway (SO_REUSEPORT binds need the same effective uid as the
  // group's, udp_lib_lport_inuse), and that user can ptrace this daemon.
  // Under the system daemon (root) that is root alone; a per-user daemon
  // serves its own user only.
  const int slot = steerable && uid == ::geteuid() ? slot_for(si, client, lane, uid) : -1;
  if (slot >= 0 && steer(si)) {
    rep.flags = proto::kRoceSteered;
    return socks_[si].slots[size_t(slot)].fd.get();
  }
  return sender_for(si, client);
}

int RocePort::attach(uint32_t client, uid_t uid, const proto::RoceAttachReq& req, proto::RoceAttachReply& rep,
                     std::vector<int>& out_fds) {
  // One steered socket per lane: at most kRoceMaxLanes per client and
  // address (and kMaxSlots in all), whatever the client asks.
  if (req.lane >= proto::kRoceMaxLanes) return EINVAL;
  size_t si = socks_.size();
  for (size_t i = 0; i < socks_.size(); ++i) {
    if (std::memcmp(socks_[i].gid, req.sgid, 16) == 0) si = i;
  }
  if (si == socks_.size()) {
    // Not bound: RoCE off (SOFTVERBS_ROCE=0), the address held by another
    // process or the kernel (EADDRINUSE, which the library explains), or
    // not an address of this namespace.
    if (!opened_) return EOPNOTSUPP;
    int r = retry_busy(req.sgid);
    if (r < 0) return -r;
    si = size_t(r);
  }
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
  const uint32_t qpn = req.qpn & 0xffffff;
  set_faults(faults_, qpn, rep);
  auto had = qpn_sock_.find(qpn);
  if ((req.flags & proto::kRoceSecondAddress) && had != qpn_sock_.end() && had->second != si &&
      qpns_[qpn] == client) {
    // A UD QP's second address, of the other family (docs/ROCE.md,
    // "Multicast"): the QPN is steered there too, to the client's socket of
    // that address's group (else what comes for it there is forwarded:
    // readable()).
    qpn_sock2_[qpn] = si;
    const int fd = client_socket(si, client, qpn_lane_[qpn], uid, true, rep);
    if (fd < 0) return EIO;
    out_fds.push_back(fd);
    out_fds.push_back(it->second.theirs.get());
    return 0;
  }
  qpns_[qpn] = client;
  qpn_sock_[qpn] = si;
  qpn_sock2_.erase(qpn);
  qpn_lane_[qpn] = req.lane;
  const int fd = client_socket(si, client, req.lane, uid, qpn != kCmQpn, rep);
  if (fd < 0) return EIO;
  out_fds.push_back(fd);
  out_fds.push_back(it->second.theirs.get());
  return 0;
}

void RocePort::remove_client(uint32_t client) {
  arrivals_.erase(client);
  for (auto it = senders_.begin(); it != senders_.end();)
    it = it->first.first == client ? senders_.erase(it) : std::next(it);
  for (auto it = qpns_.begin(); it != qpns_.end();) {
    if (it->second == client) {
      qpn_sock_.erase(it->first);
      qpn_sock2_.erase(it->first);
      qpn_lane_.erase(it->first);
      it = qpns_.erase(it);
    } else {
      ++it;
    }
  }
  // Its QPNs leave the programs before its sockets can go to anyone else.
  for (size_t si = 0; si < socks_.size(); ++si) {
    bool had = false;
    for (auto& slot : socks_[si].slots) {
      if (slot.used && slot.client == client) had = true;
    }
    if (!had) continue;
    if (!steer(si)) continue;  // keep the slots out of use: the old program may still name them
    for (auto& slot : socks_[si].slots) {
      if (slot.used && slot.client == client) slot.used = false;
    }
  }
}

// ---- Multicast ---------------------------------------------------------------
//
// RoCEv2 multicast (IBTA annex A17.4.5: the MGID is the IP destination
// address; an IPv4-mapped MGID, ::ffff:224.0.0.0/4, names the IPv4 group).
// The hosts' sockets of the reuseport groups are bound to unicast addresses
// and never see a datagram sent to a group, so the daemon listens to each
// group itself, on a socket bound to the group's address, port 4791
// (IP_ADD_MEMBERSHIP / IPV6_ADD_MEMBERSHIP on the interfaces of the port's
// addresses; RFC 1112 / RFC 3493 5.2), and hands each datagram to every
// member QP, one copy each on its client's arrival socket (proto::
// RoceArrival with the group and the member). Like rxe (rxe_mcast.c joins
// the group on its netdev, rxe_recv.c copies a packet for DestQP 0xFFFFFF
// to every attached QP), without its code.

Fd RocePort::open_group(const std::array<uint8_t, 16>& mgid, sockaddr_storage& ss, socklen_t& len) {
  static const uint8_t mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  const bool v4 = std::memcmp(mgid.data(), mapped, 12) == 0;
  ss = {};
  unsigned first_if = 0;
  for (const auto& s : socks_) {
    if (s.addr.ss_family == (v4 ? AF_INET : AF_INET6) && s.ifindex && !first_if) first_if = s.ifindex;
  }
  if (!first_if) return Fd();  // no address of the group's family: no wire for it
  if (v4) {
    auto& in = reinterpret_cast<sockaddr_in&>(ss);
    in.sin_family = AF_INET;
    in.sin_port = htons(kRoceV2Port);
    std::memcpy(&in.sin_addr, mgid.data() + 12, 4);
    if (!IN_MULTICAST(ntohl(in.sin_addr.s_addr))) return Fd();
    len = sizeof in;
  } else {
    auto& in6 = reinterpret_cast<sockaddr_in6&>(ss);
    in6.sin6_family = AF_INET6;
    in6.sin6_port = htons(kRoceV2Port);
    std::memcpy(&in6.sin6_addr, mgid.data(), 16);
    if (!IN6_IS_ADDR_MULTICAST(&in6.sin6_addr)) return Fd();
    // A scope smaller than the site's needs an interface to bind to.
    if (IN6_IS_ADDR_MC_LINKLOCAL(&in6.sin6_addr) || IN6_IS_ADDR_MC_NODELOCAL(&in6.sin6_addr))
      in6.sin6_scope_id = first_if;
    len = sizeof in6;
  }
  const int fam = v4 ? AF_INET : AF_INET6;
  Fd fd(::socket(fam, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd.valid()) return fd;
  roce::set_roce_socket_options(fd.get(), fam);
  int one = 1, zero = 0;
  ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  int big = 4 << 20;
  if (::setsockopt(fd.get(), SOL_SOCKET, SO_RCVBUFFORCE, &big, sizeof big) != 0)
    ::setsockopt(fd.get(), SOL_SOCKET, SO_RCVBUF, &big, sizeof big);
  // Only this group's datagrams (the bound address says so already).
  if (v4) ::setsockopt(fd.get(), IPPROTO_IP, IP_MULTICAST_ALL, &zero, sizeof zero);
  if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&ss), len) != 0) {
    SV_TRACE("daemon: RoCE: multicast bind: %s", std::strerror(errno));
    return Fd();
  }
  int joined = 0;
  std::vector<unsigned> done;
  for (const auto& s : socks_) {
    if (s.addr.ss_family != fam || !s.ifindex) continue;
    if (std::find(done.begin(), done.end(), s.ifindex) != done.end()) continue;
    done.push_back(s.ifindex);
    int rc;
    if (v4) {
      ip_mreqn m{};
      m.imr_multiaddr = reinterpret_cast<sockaddr_in&>(ss).sin_addr;
      m.imr_address = reinterpret_cast<const sockaddr_in&>(s.addr).sin_addr;
      m.imr_ifindex = int(s.ifindex);
      rc = ::setsockopt(fd.get(), IPPROTO_IP, IP_ADD_MEMBERSHIP, &m, sizeof m);
    } else {
      ipv6_mreq m{};
      m.ipv6mr_multiaddr = reinterpret_cast<sockaddr_in6&>(ss).sin6_addr;
      m.ipv6mr_interface = s.ifindex;
      rc = ::setsockopt(fd.get(), IPPROTO_IPV6, IPV6_ADD_MEMBERSHIP, &m, sizeof m);
    }
    if (rc == 0) ++joined;
    else SV_TRACE("daemon: RoCE: multicast join on interface %u: %s", s.ifindex, std::strerror(errno));
  }
  if (!joined) return Fd();
  return fd;
}

void RocePort::mcast_sync(const std::vector<std::array<uint8_t, 16>>& mgids) {
  // Gone groups: closing the socket leaves the group (and takes it out of
  // the daemon's epoll set).
  for (auto it = groups_.begin(); it != groups_.end();) {
    if (std::find(mgids.begin(), mgids.end(), it->mgid) == mgids.end()) {
      SV_TRACE("daemon: RoCE: multicast group left");
      it = groups_.erase(it);
    } else {
      ++it;
    }
  }
  if (socks_.empty()) return;  // no port: multicast stays on this host
  for (const auto& m : mgids) {
    bool have = false;
    for (const auto& g : groups_) have = have || g.mgid == m;
    if (have) continue;
    Group g;
    g.mgid = m;
    g.fd = open_group(m, g.addr, g.addr_len);
    if (!g.fd.valid()) continue;  // tried again at the next change
    groups_.push_back(std::move(g));
    SV_TRACE("daemon: RoCE: multicast group joined");
    if (on_new_fd) on_new_fd(groups_.back().fd.get());
  }
}

// A datagram for a group: untrusted. Only a whole UD SEND Only (with or
// without immediate; IBTA 9.8: a UD message is one packet) to the multicast
// QPN goes on, and only to the group's members that are on the wire here;
// the member's endpoint checks the ICRC (over the group as destination),
// the Q_Key and the rest as for unicast.
void RocePort::group_readable(const Group& g) {
  auto* pre = reinterpret_cast<proto::RoceArrival*>(buf_);
  std::vector<uint32_t> members;
  for (int budget = 0; budget < 512; ++budget) {
    sockaddr_storage from{};
    socklen_t fl = sizeof from;
    ssize_t n = ::recvfrom(g.fd.get(), buf_ + sizeof *pre, sizeof buf_ - sizeof *pre, MSG_TRUNC,
                           reinterpret_cast<sockaddr*>(&from), &fl);
    if (n < 0) return;
    if (size_t(n) > sizeof buf_ - sizeof *pre) continue;  // truncated (MSG_TRUNC: the real length)
    if (size_t(n) < roce::kBthLen + roce::kDethLen + roce::kIcrcLen || fl > sizeof pre->from ||
        from.ss_family != g.addr.ss_family)
      continue;
    const uint8_t* bth = buf_ + sizeof *pre;
    const uint32_t dqpn = uint32_t(bth[5]) << 16 | uint32_t(bth[6]) << 8 | bth[7];
    const uint8_t opcode = bth[0];
    if (dqpn != roce::kMulticastQpn ||
        (opcode != (roce::op::kUD | roce::op::kSendOnly) && opcode != (roce::op::kUD | roce::op::kSendOnlyImm)))
      continue;
    if (!mcast_members || !mcast_members(g.mgid.data(), members)) continue;  // nobody attached (any more)
    std::memset(pre, 0, sizeof *pre);
    std::memcpy(pre->from, &from, fl);
    pre->from_len = fl;
    std::memcpy(pre->to, &g.addr, g.addr_len);
    pre->to_len = g.addr_len;
    for (uint32_t qpn : members) {
      auto q = qpns_.find(qpn & 0xffffff);
      if (q == qpns_.end()) continue;  // not on the wire: a local-only QP
      auto a = arrivals_.find(q->second);
      if (a == arrivals_.end()) continue;
      pre->qpn = qpn & 0xffffff;
      // A client that does not keep up loses datagrams, as a full NIC queue would.
      ::send(a->second.mine.get(), buf_, sizeof *pre + size_t(n), MSG_DONTWAIT | MSG_NOSIGNAL);
    }
  }
}

}  // namespace sv::daemon
