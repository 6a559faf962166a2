// cm_gateway.cc: see cm_gateway.h. The rules for retransmission and
// duplicates follow IBTA 12.9 (the CM's state machine): a REQ, REP or DREQ
// is sent again until its answer comes (REP/REJ/MRA, RTU/REJ/DREQ,
// DREP/DREQ), a duplicate REQ / REP / DREQ is answered with what was sent for
// the first (REP or MRA, RTU, DREP: 12.9.5, 12.9.8.3), and a connection whose
// process went away without ending it is ended for it (DREQ, 12.9.8.4, or REJ).
#include "daemon/cm_gateway.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/timerfd.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <random>
#include <span>
#include <vector>

#include "common/trace.h"
#include "roce/headers.h"
#include "roce/icrc.h"
#include "roce/udp.h"
#include "rdmacm/rendezvous.h"

namespace sv::daemon {

namespace {

constexpr uint32_t kGsiQkey = 0x80010000;  // IBTA 10.2.5: the well-known Q_Key of QP1
constexpr uint16_t kRocePort = 4791;       // IBTA Annex A17.2.1
constexpr uint8_t kUdSendOnly = 0x64;      // IBTA 9.2 table 38
constexpr auto kLinger = std::chrono::seconds(5);
constexpr uint16_t A(cm::Attr a) { return uint16_t(a); }

bool same_ip(const sockaddr_storage& a, const sockaddr_storage& b) {
  if (a.ss_family != b.ss_family) return false;
  if (a.ss_family == AF_INET)
    return reinterpret_cast<const sockaddr_in&>(a).sin_addr.s_addr ==
           reinterpret_cast<const sockaddr_in&>(b).sin_addr.s_addr;
  return std::memcmp(&reinterpret_cast<const sockaddr_in6&>(a).sin6_addr,
                     &reinterpret_cast<const sockaddr_in6&>(b).sin6_addr, 16) == 0;
}

std::string ip_text(const sockaddr_storage& a) {
  char buf[INET6_ADDRSTRLEN] = "?";
  if (a.ss_family == AF_INET)
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in&>(a).sin_addr, buf, sizeof buf);
  else if (a.ss_family == AF_INET6)
    ::inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6&>(a).sin6_addr, buf, sizeof buf);
  return buf;
}

void set_port(sockaddr_storage& a, uint16_t port) {
  if (a.ss_family == AF_INET) reinterpret_cast<sockaddr_in&>(a).sin_port = htons(port);
  if (a.ss_family == AF_INET6) reinterpret_cast<sockaddr_in6&>(a).sin6_port = htons(port);
}

uint16_t port_of(const sockaddr_storage& a) {
  if (a.ss_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in&>(a).sin_port);
  if (a.ss_family == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6&>(a).sin6_port);
  return 0;
}

socklen_t len_of(const sockaddr_storage& a) {
  return a.ss_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
}

// An IPv4-mapped IPv6 address is the IPv4 address (the library's GIDs and
// IP headers may use either form).
sockaddr_storage plain(const sockaddr_storage& a) {
  if (a.ss_family != AF_INET6) return a;
  auto& s6 = reinterpret_cast<const sockaddr_in6&>(a);
  if (!IN6_IS_ADDR_V4MAPPED(&s6.sin6_addr)) return a;
  sockaddr_storage r{};
  auto& s4 = reinterpret_cast<sockaddr_in&>(r);
  s4.sin_family = AF_INET;
  s4.sin_port = s6.sin6_port;
  std::memcpy(&s4.sin_addr, &s6.sin6_addr.s6_addr[12], 4);
  return r;
}

// The datagram local <-> remote as the kernel puts it on the wire, for its
// ICRC (IBTA Annex A17.4). Returns its size, 0 if it does not fit.
size_t frame(const sockaddr_storage& src, const sockaddr_storage& dst, std::span<const uint8_t> transport,
             std::span<uint8_t> out, size_t* hdr) {
  if (src.ss_family == AF_INET6) {
    roce::Ipv6Udp h;
    std::memcpy(h.src.data(), &reinterpret_cast<const sockaddr_in6&>(src).sin6_addr, 16);
    std::memcpy(h.dst.data(), &reinterpret_cast<const sockaddr_in6&>(dst).sin6_addr, 16);
    h.sport = port_of(src);
    h.dport = port_of(dst);
    *hdr = roce::kIpv6UdpLen;
    return roce::frame_ipv6(h, transport, out);
  }
  roce::Ipv4Udp h;
  std::memcpy(h.src.data(), &reinterpret_cast<const sockaddr_in&>(src).sin_addr, 4);
  std::memcpy(h.dst.data(), &reinterpret_cast<const sockaddr_in&>(dst).sin_addr, 4);
  h.sport = port_of(src);
  h.dport = port_of(dst);
  *hdr = roce::kIpv4UdpLen;
  return roce::frame_ipv4(h, transport, out);
}

// The ICRC of an arriving datagram. A UDP socket does not see the IPv4 ID,
// which the ICRC covers: 0 is tried first (softverbs sends 0), then any ID
// (Linux rxe sends one): CRC-32 is affine, so the ICRC with ID x is the ICRC
// with ID 0 XOR a linear function of x's bits; the difference must lie in
// the span of the 16 single-bit differences (as src/roce/udp.cc checks).
bool icrc_ok(const sockaddr_storage& from, const sockaddr_storage& local, const uint8_t* data, size_t n) {
  uint8_t fr[1024];
  size_t hdr = 0;
  const size_t total = frame(from, local, std::span<const uint8_t>(data, n - roce::kIcrcLen), fr, &hdr);
  if (total == 0) return false;
  const uint32_t got = roce::icrc_load(data + n - roce::kIcrcLen);
  const uint32_t icrc0 = roce::icrc_load(fr + total - roce::kIcrcLen);
  if (got == icrc0) return true;
  if (hdr != roce::kIpv4UdpLen) return false;
  uint32_t deltas[16];
  for (int b = 0; b < 16; b++) {
    fr[4] = uint8_t((1u << b) >> 8);
    fr[5] = uint8_t(1u << b);
    deltas[b] = roce::icrc_compute(std::span<const uint8_t>(fr, total - roce::kIcrcLen)).value_or(icrc0) ^ icrc0;
  }
  return roce::in_xor_span(deltas, got ^ icrc0);
}

uint32_t random_id() {
  static std::mt19937 rng{std::random_device{}()};
  return rng();
}

int env_int(const char* name, int dflt) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : dflt;
}

}  // namespace

int CmGateway::open(const std::string& dir, mode_t mode) {
  dir_ = dir;
  retry_ = std::chrono::milliseconds(std::max(env_int("SOFTVERBS_CM_RETRY_MS", 1000), 10));
  retries_ = std::max(env_int("SOFTVERBS_CM_RETRIES", 15), 0);
  drop_every_ = env_int("SOFTVERBS_CM_DROP_EVERY", 0);
  ep_.reset(::epoll_create1(EPOLL_CLOEXEC));
  if (!ep_.valid()) return errno;
  if (int e = listen_seqpacket(dir + "/cm-gateway", listen_, mode)) return e;
  ::fcntl(listen_.get(), F_SETFL, ::fcntl(listen_.get(), F_GETFL) | O_NONBLOCK);
  timer_.reset(::timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC));
  if (!timer_.valid()) return errno;
  for (int fd : {listen_.get(), timer_.get()}) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    if (::epoll_ctl(ep_.get(), EPOLL_CTL_ADD, fd, &ev) != 0) return errno;
  }
  return 0;
}

void CmGateway::run() {
  epoll_event evs[16];
  int n = ::epoll_wait(ep_.get(), evs, 16, 0);
  for (int i = 0; i < n; ++i) {
    int fd = evs[i].data.fd;
    if (fd == listen_.get()) {
      accept_lib();
    } else if (fd == timer_.get()) {
      uint64_t v;
      (void)!::read(fd, &v, sizeof v);
      on_timer();
    } else if (auto it = by_fd_.find(fd); it != by_fd_.end()) {
      from_lib(it->second);
    }
  }
  arm();
}

void CmGateway::accept_lib() {
  for (;;) {
    int fd = ::accept4(listen_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) return;
    PeerCred cred{};
    if (peer_credentials(fd, cred) != 0 || cred.uid != ::getuid()) {
      ::close(fd);
      continue;
    }
    auto c = std::make_unique<Conn>();
    c->fd = fd;
    uint64_t key = next_key_++;
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP;
    ev.data.fd = fd;
    ::epoll_ctl(ep_.get(), EPOLL_CTL_ADD, fd, &ev);
    by_fd_[fd] = key;
    conns_[key] = std::move(c);
  }
}

void CmGateway::close_lib(Conn& c) {
  if (c.fd < 0) return;
  ::epoll_ctl(ep_.get(), EPOLL_CTL_DEL, c.fd, nullptr);
  by_fd_.erase(c.fd);
  ::close(c.fd);
  c.fd = -1;
  c.linger_until = Clock::now() + kLinger;
}

void CmGateway::erase(uint64_t key) {
  auto it = conns_.find(key);
  if (it == conns_.end()) return;
  close_lib(*it->second);
  conns_.erase(it);
}

void CmGateway::await(Conn& c, uint16_t attr) {
  c.awaiting = attr;
  c.retries_left = retries_;
  c.due = Clock::now() + retry_;
}

// A MAD from the library: to the wire.
void CmGateway::from_lib(uint64_t key) {
  for (;;) {
    auto it = conns_.find(key);
    if (it == conns_.end()) return;
    Conn& c = *it->second;
    if (c.fd < 0) return;
    uint8_t mad[cm::kMadSize + 1];
    ssize_t n = ::recv(c.fd, mad, sizeof mad, MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
    if (n <= 0) {
      lib_closed(key);
      return;
    }
    cm::Msg m;
    if (size_t(n) != cm::kMadSize || !cm::decode(mad, cm::kMadSize, m)) continue;
    const bool fresh = c.local.ss_family == 0;
    if (fresh) {
      // The library's first message on its connection: the REQ / SIDR_REQ
      // of an id whose destination is on another host. Its IP header names
      // both ends (Annex A11).
      const bool ud = m.attr == cm::Attr::kSidrReq;
      cm::IpHeader ip;
      if (!cm::is_request(m) || !cm::request_ip_header(m, ip)) {
        erase(key);
        return;
      }
      c.active = true;
      c.sidr = ud;
      c.local = plain(ip.src);
      set_port(c.local, 0);
      c.remote = plain(ip.dst);
      set_port(c.remote, kRocePort);
      c.local_id = cm::request_id(m);
      SV_TRACE("cm gateway: %s %s -> %s id %u", ud ? "SIDR_REQ" : "REQ", ip_text(c.local).c_str(),
               ip_text(c.remote).c_str(), c.local_id);
      send_wire(c, mad, true);
      await(c, A(m.attr));
      continue;
    }
    switch (m.attr) {
      case cm::Attr::kRep:
        c.local_id = m.rep.local_comm_id;
        send_wire(c, mad, true);
        await(c, A(m.attr));
        break;
      case cm::Attr::kRtu:
        c.established = true;
        c.awaiting = 0;
        send_wire(c, mad, true);
        break;
      case cm::Attr::kRej:
        if (!c.local_id) c.local_id = m.rej.local_comm_id;
        c.ended = true;
        c.awaiting = 0;
        send_wire(c, mad, true);
        break;
      case cm::Attr::kDreq:
        send_wire(c, mad, true);
        await(c, A(m.attr));
        break;
      case cm::Attr::kDrep:
      case cm::Attr::kSidrRep:
        c.ended = true;
        c.awaiting = 0;
        send_wire(c, mad, true);
        break;
      default:
        send_wire(c, mad, false);
        break;
    }
  }
}

// The library's end closed (its id was destroyed, or its process died):
// whatever it left unfinished is finished for it.
void CmGateway::lib_closed(uint64_t key) {
  Conn& c = *conns_[key];
  close_lib(c);
  if (c.local.ss_family == 0) {
    erase(key);
    return;
  }
  if (c.ended || c.sidr || c.awaiting == A(cm::Attr::kDreq)) return;
  uint8_t mad[cm::kMadSize];
  if (c.established) {
    cm::encode_dreq(c.local_id, c.remote_id, 0, 0, mad);  // IBTA 12.9.8.4
    send_wire(c, mad, true);
    await(c, A(cm::Attr::kDreq));
    return;
  }
  if (!c.remote_id && !c.active) return;
  // A connection being established: rejected (IBTA 12.9.5).
  cm::encode_rej(c.local_id, c.remote_id,
                 c.active ? (c.remote_id ? cm::kRejectedRep : cm::kRejectedOther) : cm::kRejectedReq,
                 c.active && !c.remote_id ? cm::kRejTimeout : cm::kRejConsumer, 0, mad);
  c.awaiting = 0;
  c.ended = true;
  send_wire(c, mad, true);
}

void CmGateway::on_timer() {
  // Parked requests: relayed if their listener came, rejected when their
  // grace is over, else parked again.
  auto now = Clock::now();
  std::vector<Parked> parked;
  parked.swap(parked_);
  for (const Parked& p : parked) {
    if (p.recheck > now)
      parked_.push_back(p);
    else
      new_request(p.local, p.remote, p.mad, p.msg, p.until);
  }
  std::vector<uint64_t> dead;
  for (auto& [key, cp] : conns_) {
    Conn& c = *cp;
    if (c.awaiting && c.due <= now) {
      if (c.retries_left > 0) {
        c.retries_left--;
        c.due = now + retry_;
        stats_.retransmitted++;
        SV_TRACE("cm gateway: retransmit attr 0x%x id %u", c.awaiting, c.local_id);
        send_raw(c.local, c.remote, c.last_out);
        stats_.sent++;
      } else {
        // No answer (IBTA 12.9.2: the retries are exhausted). The library
        // sees its connection end: UNREACHABLE for a REQ, CONNECT_ERROR for
        // a REP, DISCONNECTED for a DREQ.
        SV_TRACE("cm gateway: attr 0x%x id %u unanswered, giving up", c.awaiting, c.local_id);
        if (c.awaiting == A(cm::Attr::kReq) || c.awaiting == A(cm::Attr::kRep)) {
          // IBTA 12.9.5: a REQ or REP that timed out is rejected ("timeout"),
          // so that the other side, if it is there after all, lets go too.
          uint8_t mad[cm::kMadSize];
          cm::encode_rej(c.local_id, c.remote_id,
                         c.awaiting == A(cm::Attr::kReq) ? cm::kRejectedOther : cm::kRejectedRep, cm::kRejTimeout,
                         0, mad);
          send_wire(c, mad, true);
        }
        c.awaiting = 0;
        c.ended = true;
        close_lib(c);
      }
    }
    if (c.fd < 0 && !c.awaiting && c.linger_until <= now) dead.push_back(key);
  }
  for (uint64_t k : dead) erase(k);
}

void CmGateway::arm() {
  Clock::time_point next = Clock::time_point::max();
  for (const Parked& p : parked_) next = std::min(next, p.recheck);
  for (auto& [key, cp] : conns_) {
    if (cp->awaiting) next = std::min(next, cp->due);
    if (cp->fd < 0 && !cp->awaiting) next = std::min(next, cp->linger_until);
  }
  itimerspec ts{};
  if (next != Clock::time_point::max()) {
    auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(next.time_since_epoch()).count();
    if (ns <= 0) ns = 1;
    ts.it_value.tv_sec = ns / 1000000000;
    ts.it_value.tv_nsec = ns % 1000000000;
    if (ts.it_value.tv_sec == 0 && ts.it_value.tv_nsec == 0) ts.it_value.tv_nsec = 1;
  }
  ::timerfd_settime(timer_.get(), TFD_TIMER_ABSTIME, &ts, nullptr);
}

int CmGateway::udp_socket_for(const sockaddr_storage& local, uint16_t* port) {
  std::string key = ip_text(local);
  auto it = udp_.find(key);
  if (it != udp_.end()) {
    *port = it->second.second;
    return it->second.first.get();
  }
  Fd s(::socket(local.ss_family, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!s.valid()) return -1;
  roce::set_roce_socket_options(s.get(), local.ss_family);
  sockaddr_storage a = local;
  set_port(a, 0);
  if (::bind(s.get(), reinterpret_cast<sockaddr*>(&a), len_of(a)) != 0) {
    SV_TRACE("cm gateway: bind %s: %s", key.c_str(), std::strerror(errno));
    return -1;
  }
  socklen_t l = sizeof a;
  ::getsockname(s.get(), reinterpret_cast<sockaddr*>(&a), &l);
  *port = port_of(a);
  int fd = s.get();
  udp_[key] = {std::move(s), *port};
  return fd;
}

// A MAD on QP1 as the GSI sends it (IBTA 13.5.1): UD SEND Only to QP 1 from
// QP 1 with the GSI Q_Key and the default P_Key.
void CmGateway::send_raw(const sockaddr_storage& local, const sockaddr_storage& remote, const uint8_t* mad) {
  // Test hook: lose every Nth MAD, as an unreliable datagram may be lost.
  if (drop_every_ > 0 && ++sent_count_ % uint64_t(drop_every_) == 0) {
    SV_TRACE("cm gateway: dropped attr 0x%x (SOFTVERBS_CM_DROP_EVERY)", cm::attr_of(mad));
    return;
  }
  uint16_t sport = 0;
  int s = udp_socket_for(local, &sport);
  if (s < 0 || local.ss_family != remote.ss_family) return;
  roce::Packet p;
  p.bth.opcode = kUdSendOnly;
  p.bth.pkey = roce::kDefaultPkey;
  p.bth.dest_qp = 1;
  p.bth.psn = psn_++ & 0xffffff;
  p.deth.qkey = kGsiQkey;
  p.deth.src_qp = 1;
  p.payload = std::span<const uint8_t>(mad, cm::kMadSize);
  uint8_t tp[512];
  size_t tn = roce::build_packet(p, tp);
  if (!tn) return;
  sockaddr_storage src = local;
  set_port(src, sport);
  uint8_t fr[1024];
  size_t hdr = 0;
  size_t n = frame(src, remote, std::span<const uint8_t>(tp, tn), fr, &hdr);
  if (!n) return;
  ::sendto(s, fr + hdr, n - hdr, 0, reinterpret_cast<const sockaddr*>(&remote), len_of(remote));
}

void CmGateway::send_wire(Conn& c, const uint8_t* mad, bool remember) {
  send_raw(c.local, c.remote, mad);
  stats_.sent++;
  if (remember) {
    std::memcpy(c.last_out, mad, cm::kMadSize);
    c.has_out = true;
  }
}

CmGateway::Conn* CmGateway::find_by_local_id(uint32_t id, const sockaddr_storage& remote) {
  for (auto& [key, cp] : conns_) {
    if (id && cp->local_id == id && cp->local.ss_family && same_ip(cp->remote, remote)) return cp.get();
  }
  return nullptr;
}

void CmGateway::deliver(int sock, const sockaddr* from_sa, socklen_t from_len, const uint8_t* data, size_t n) {
  stats_.received++;
  sockaddr_storage from{}, local{};
  if (from_len > sizeof from) return;
  std::memcpy(&from, from_sa, from_len);
  socklen_t l = sizeof local;
  if (::getsockname(sock, reinterpret_cast<sockaddr*>(&local), &l) != 0) return;
  roce::Packet p;
  if (roce::parse_packet(std::span<const uint8_t>(data, n), true, &p) != roce::ParseError::kOk ||
      p.bth.opcode != kUdSendOnly || p.deth.qkey != kGsiQkey || p.payload.size() != cm::kMadSize ||
      !icrc_ok(from, local, data, n)) {
    stats_.bad++;
    return;
  }
  const uint8_t* mad = p.payload.data();
  cm::Msg m;
  if (!cm::decode(mad, cm::kMadSize, m)) return;  // not the CM class, or an attribute we do not use
  sockaddr_storage remote = from;
  set_port(remote, kRocePort);
  set_port(local, 0);
  SV_TRACE("cm gateway: attr 0x%x from %s", unsigned(m.attr), ip_text(remote).c_str());
  Conn* c = nullptr;
  switch (m.attr) {
    case cm::Attr::kReq:
    case cm::Attr::kSidrReq: {
      const bool ud = m.attr == cm::Attr::kSidrReq;
      const uint32_t rid = cm::request_id(m);
      for (auto& [key, cp] : conns_) {
        if (!cp->active && cp->sidr == ud && cp->remote_id == rid && same_ip(cp->remote, remote)) c = cp.get();
      }
      if (!c) {
        for (const Parked& p : parked_) {
          if (p.msg.attr == m.attr && p.request_id == rid && same_ip(p.remote, remote)) {
            stats_.duplicates++;  // still waiting for its listener
            return;
          }
        }
        new_request(local, remote, mad, m, Clock::now() + kNoListenerGrace);
        return;
      }
      break;
    }
    case cm::Attr::kSidrRep:
      for (auto& [key, cp] : conns_) {
        if (cp->active && cp->sidr && cp->local_id == m.sidr_rep.request_id && same_ip(cp->remote, remote))
          c = cp.get();
      }
      break;
    default:  // REP, REJ, RTU, DREQ, DREP, MRA: the comm ID they address
      c = find_by_local_id(cm::receiver_id(m), remote);
      if (!c && m.attr == cm::Attr::kDreq) {
        // IBTA 12.9.8.3.1: a DREQ for a connection not known (any more) is
        // answered with a DREP all the same.
        uint8_t out[cm::kMadSize];
        cm::encode_drep(m.dreq.remote_comm_id, m.dreq.local_comm_id, m.tid, out);
        send_raw(local, remote, out);
        return;
      }
      break;
  }
  if (!c) return;
  from_wire(*c, mad, m);
}

void CmGateway::from_wire(Conn& c, const uint8_t* mad, const cm::Msg& m) {
  const uint16_t a = A(m.attr);
  const bool repeatable = m.attr == cm::Attr::kReq || m.attr == cm::Attr::kRep || m.attr == cm::Attr::kDreq ||
                          m.attr == cm::Attr::kSidrReq;
  // Each message comes once per connection in the CM's exchange (an MRA
  // aside): the same one again is a duplicate, never for the library.
  if (a == c.last_in_attr && m.attr != cm::Attr::kMra) {
    // A retransmission: our answer was lost, or is not ready.
    stats_.duplicates++;
    if (!repeatable) return;
    const uint16_t out = c.has_out ? cm::attr_of(c.last_out) : 0;
    const bool answer = (m.attr == cm::Attr::kReq && (out == A(cm::Attr::kRep) || out == A(cm::Attr::kRej) ||
                                                       out == A(cm::Attr::kMra))) ||
                        (m.attr == cm::Attr::kRep && (out == A(cm::Attr::kRtu) || out == A(cm::Attr::kRej))) ||
                        (m.attr == cm::Attr::kDreq && out == A(cm::Attr::kDrep)) ||
                        (m.attr == cm::Attr::kSidrReq && out == A(cm::Attr::kSidrRep));
    if (answer) {
      send_raw(c.local, c.remote, c.last_out);
    } else if (m.attr == cm::Attr::kReq && !c.has_out) {
      // IBTA 12.6.6: the application has not answered yet; the MRA asks
      // the active side to wait longer instead of giving up.
      cm::Mra r;
      r.local_comm_id = c.local_id;
      r.remote_comm_id = c.remote_id;
      r.message_mraed = cm::kMraReq;
      r.service_timeout = 20;
      uint8_t out[cm::kMadSize];
      cm::encode(r, m.tid, out);
      send_raw(c.local, c.remote, out);
    }
    return;
  }
  if (m.attr == cm::Attr::kMra) {
    if (c.awaiting == A(cm::Attr::kReq) || c.awaiting == A(cm::Attr::kRep)) {
      c.retries_left = retries_;
      c.due = Clock::now() + retry_ * 4;
    }
    return;
  }
  c.last_in_attr = a;
  switch (m.attr) {
    case cm::Attr::kRep:
      if (c.awaiting == A(cm::Attr::kReq)) c.awaiting = 0;
      c.remote_id = m.rep.local_comm_id;
      break;
    case cm::Attr::kRtu:
      if (c.awaiting == A(cm::Attr::kRep)) c.awaiting = 0;
      c.established = true;
      break;
    case cm::Attr::kRej:
      c.awaiting = 0;
      c.ended = true;
      break;
    case cm::Attr::kDreq:
      if (c.awaiting == A(cm::Attr::kRep) || c.awaiting == A(cm::Attr::kDreq)) c.awaiting = 0;
      c.established = true;
      break;
    case cm::Attr::kDrep:
      if (c.awaiting == A(cm::Attr::kDreq)) c.awaiting = 0;
      c.ended = true;
      break;
    case cm::Attr::kSidrRep:
      c.awaiting = 0;
      c.ended = true;
      break;
    default:
      break;
  }
  if (c.fd >= 0) {
    ::send(c.fd, mad, cm::kMadSize, MSG_NOSIGNAL | MSG_DONTWAIT);
    return;
  }
  // The library's end is gone: answer for it.
  if (m.attr == cm::Attr::kDreq) {
    uint8_t out[cm::kMadSize];
    cm::encode_drep(c.local_id, c.remote_id, m.tid, out);
    send_wire(c, out, true);
    c.ended = true;
  }
}

// The listener of a REQ / SIDR_REQ's service ID (Annex A11: 0x0000000001 |
// port space | port) and the address it was sent to, as the library's own
// try_connect finds it: a connected socket, -1 when nobody listens there,
// -2 when the request is to be dropped (a full backlog: the active side
// retransmits).
int CmGateway::listener_fd(const cm::Msg& m) {
  const uint64_t sid = cm::request_service_id(m);
  cm::IpHeader ip;
  if ((sid >> 32) != 0 || !cm::request_ip_header(m, ip)) return -1;
  const int ps = int((sid >> 16) & 0xffff);
  const uint16_t port = uint16_t(sid);
  sockaddr_storage dst = plain(ip.dst);
  for (const std::string& name : rdmacm::listener_names(ps, port, ip_text(dst))) {
    std::string path = dir_ + "/cm/" + name;
    sockaddr_un sun{};
    if (path.size() >= sizeof sun.sun_path) continue;
    sun.sun_family = AF_UNIX;
    std::memcpy(sun.sun_path, path.c_str(), path.size() + 1);
    int s = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (s < 0) return -2;
    if (::connect(s, reinterpret_cast<sockaddr*>(&sun), sizeof sun) == 0) return s;
    int e = errno;
    ::close(s);
    if (e == EAGAIN) return -2;
  }
  return -1;
}

// A new REQ / SIDR_REQ: relayed to its listener. If nobody listens yet it
// is parked until `until` (kNoListenerGrace after it came: programs such as
// perftest call rdma_listen only after a handshake their client leaves
// first, and the CM may answer a REQ any time within its response timeout,
// IBTA 12.6.5), then rejected.
void CmGateway::new_request(const sockaddr_storage& local, const sockaddr_storage& remote, const uint8_t* mad,
                            const cm::Msg& m, Clock::time_point until) {
  const bool ud = m.attr == cm::Attr::kSidrReq;
  const uint64_t sid = cm::request_service_id(m);
  const uint32_t rid = cm::request_id(m);
  const int fd = listener_fd(m);
  if (fd == -2) return;
  if (fd < 0 && Clock::now() < until && parked_.size() < kMaxParked) {
    Parked p;
    p.local = local;
    p.remote = remote;
    std::memcpy(p.mad, mad, cm::kMadSize);
    p.msg = m;
    p.request_id = rid;
    p.until = until;
    p.recheck = std::min(until, Clock::now() + kNoListenerRecheck);
    parked_.push_back(p);
    arm();
    return;
  }
  if (fd < 0) {
    stats_.rejected_no_listener++;
    SV_TRACE("cm gateway: no listener for service 0x%llx", (unsigned long long)sid);
    uint8_t out[cm::kMadSize];
    cm::encode_no_listener(m, random_id(), out);
    send_raw(local, remote, out);
    stats_.sent++;
    return;
  }
  auto c = std::make_unique<Conn>();
  c->fd = fd;
  c->sidr = ud;
  c->local = local;
  c->remote = remote;
  c->remote_id = rid;
  c->last_in_attr = A(m.attr);
  uint64_t key = next_key_++;
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLRDHUP;
  ev.data.fd = fd;
  ::epoll_ctl(ep_.get(), EPOLL_CTL_ADD, fd, &ev);
  by_fd_[fd] = key;
  ::send(fd, mad, cm::kMadSize, MSG_NOSIGNAL | MSG_DONTWAIT);
  conns_[key] = std::move(c);
}

}  // namespace sv::daemon
