// roce_hub.cc: the lanes that serve the process's wire QPs (roce_hub.h):
// each lane's receive loop (its RoCE thread, or a CQ poller in its place),
// the delivery of datagrams to the engines, their timers and held ACKs.
#include "verbs/roce_hub.h"

#include <pthread.h>
#include <sched.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <thread>
#include <unordered_map>

#include "common/started_thread.h"

namespace sv::verbs::wire {

void Hub::deliver_one(const sockaddr* from, socklen_t fl, const uint8_t* dg, size_t len, uint16_t ipv4_id, bool forwarded) {
  if (len < kBthLen + kIcrcLen) return;
  const uint32_t dqpn = uint32_t(dg[5]) << 16 | uint32_t(dg[6]) << 8 | dg[7];
  auto it = qps.find(dqpn);
  if (it == qps.end() && forwarded && index == 0 && lane_count() > 1) {
    // Forwarded by the daemon for a QP of another lane (its steering
    // entry missing: the program's size, or before it was in place).
    if (Hub* o = lane_of_qpn(dqpn); o && o != this) o->hand(from, fl, dg, len);
    return;
  }
  if (it == qps.end() || !it->second->engine) return;
  it->second->ep_for(from->sa_family).deliver(from, fl, dg, len, ipv4_id);
  if (it->second->engine->ack_urgent()) urgent.push_back(it->second.get());
}

void Hub::hand(const sockaddr* from, socklen_t fl, const uint8_t* dg, size_t len) {
  {
    std::lock_guard<std::mutex> g(handed_mu);
    if (handed.size() >= kMaxHanded || fl > sizeof(sockaddr_storage)) return;
    Handed d;
    std::memcpy(&d.from, from, fl);
    d.from_len = fl;
    d.dg.assign(dg, dg + len);
    handed.push_back(std::move(d));
    has_handed.store(true, std::memory_order_release);
  }
  kick();
}

int Hub::take_handed() {
  if (!has_handed.load(std::memory_order_acquire)) return 0;
  std::vector<Handed> v;
  {
    std::lock_guard<std::mutex> g(handed_mu);
    v.swap(handed);
    has_handed.store(false, std::memory_order_relaxed);
  }
  for (const Handed& d : v)
    deliver_one(reinterpret_cast<const sockaddr*>(&d.from), d.from_len, d.dg.data(), d.dg.size());
  if (!urgent.empty()) send_urgent_acks();
  return int(v.size());
}

void Hub::send_urgent_acks() {
  for (RoceQp* r : urgent) {
    if (!r->engine->ack_urgent()) continue;
    r->engine->flush_ack();
    r->ack_due = 0;
    r->flush_tx();
  }
  urgent.clear();
}

int Hub::drain(int fd) {
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
    deliver_one(reinterpret_cast<sockaddr*>(&from), a.from_len, buf.data() + sizeof a, size_t(n) - sizeof a, 0,
                true);
    if (!urgent.empty()) send_urgent_acks();
    ++got;
  }
  return got;
}

int Hub::drain_udp(int fd) {
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

int Hub::drain_all(const std::vector<pollfd>* polled) {
  int got = take_handed();
  ++drain_turn;
  for (auto& [cs, c] : conns) {
    for (auto& [ino, fd] : c.steered) got += drain_udp(fd.get());
    if (!c.arrival.valid() || index != 0) continue;  // another lane's copy: for POLLHUP only
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

void Hub::progress_all() {
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

uint64_t Hub::next_deadline() {
  uint64_t next = UINT64_MAX;
  for (auto& [qpn, r] : qps) {
    if (!r->engine) continue;
    next = std::min({next, r->engine->next_deadline(), r->next_delayed()});
    if (r->ack_due) next = std::min(next, r->ack_due);
  }
  return next;
}

void Hub::run() {
  char name[16];
  std::snprintf(name, sizeof name, "sv-roce-%u", index);
  ::pthread_setname_np(::pthread_self(), name);
  std::unique_lock<std::mutex> lk(mu);
  std::vector<pollfd> pfds;
  uint64_t spin_until = 0;  // after traffic, look again without sleeping until then
  for (;;) {
    const uint64_t now = clock.now_ns();
    const bool poller = now - last_app_poll.load(std::memory_order_relaxed) < kPollerGone;
    pfds.clear();
    pfds.push_back({wake.get(), POLLIN, 0});
    for (auto& [cs, c] : conns) {
      pfds.push_back({c.arrival.get(), short(poller || index != 0 ? 0 : POLLIN), 0});  // POLLHUP comes anyway
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

namespace {

// SOFTVERBS_ROCE_THREADS=N (1 to proto::kRoceMaxLanes): the number of
// lanes. By default one per 4 CPUs the process may run on, at most 4, and
// one below 8 CPUs: on a small machine a second engine thread only takes
// the CPU from the application's poller (docs/ROCE.md, "Several engine
// threads").
unsigned configured_lanes() {
  if (const char* e = std::getenv("SOFTVERBS_ROCE_THREADS")) {
    const long n = std::strtol(e, nullptr, 10);
    return unsigned(std::clamp<long>(n, 1, long(proto::kRoceMaxLanes)));
  }
  cpu_set_t set;
  CPU_ZERO(&set);
  const int cpus = ::sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set)
                                                                  : int(std::thread::hardware_concurrency());
  return cpus < 8 ? 1u : unsigned(std::min(cpus / 4, 4));
}

struct Lanes {
  std::vector<Hub*> hubs;  // live until exit; their threads are detached
  std::atomic<unsigned> next{0};  // round robin over the lanes, for the next QP
  std::mutex map_mu;
  std::unordered_map<uint32_t, unsigned> qpn_lane;  // QPNs of lanes other than 0
  Lanes() {
    const unsigned n = configured_lanes();
    for (unsigned i = 0; i < n; ++i) {
      hubs.push_back(new Hub);
      hubs.back()->index = i;
    }
  }
};

Lanes& lanes() {
  static Lanes* l = new Lanes;
  return *l;
}

}  // namespace

unsigned lane_count() { return unsigned(lanes().hubs.size()); }

const std::vector<Hub*>& lane_hubs() { return lanes().hubs; }

Hub& hub(unsigned lane) { return *lanes().hubs[lane < lanes().hubs.size() ? lane : 0]; }

Hub& hub_of(const ProcessQp& q) { return hub(q.roce_lane.load(std::memory_order_acquire)); }

Hub* lane_of_qpn(uint32_t qpn) {
  Lanes& l = lanes();
  std::lock_guard<std::mutex> g(l.map_mu);
  auto it = l.qpn_lane.find(qpn);
  return it == l.qpn_lane.end() ? nullptr : l.hubs[it->second];
}

void set_lane_of_qpn(uint32_t qpn, unsigned lane) {
  Lanes& l = lanes();
  if (l.hubs.size() < 2) return;
  std::lock_guard<std::mutex> g(l.map_mu);
  if (lane == 0) l.qpn_lane.erase(qpn);
  else l.qpn_lane[qpn] = lane;
}

// Which lane a QP about to go on the wire asks for: a UD QP lane 0 (its
// multicast copies and second address come through lane 0's arrival
// socket), any other the next in turn.
unsigned lane_for(const ProcessQp& q) {
  const unsigned n = lane_count();
  if (n < 2 || q.type == IBV_QPT_UD) return 0;
  return lanes().next.fetch_add(1, std::memory_order_relaxed) % n;
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

// Lane `h` watches connection `cs`'s arrival socket `fd` (lane 0 reads
// it; any other holds it to see it close). A ContextState at the address of
// a closed one is a new connection with a new socket: compare inodes. With
// h.mu held.
void adopt_arrival(Hub& h, ContextState& cs, Fd fd) {
  auto a = h.conns.find(&cs);
  struct stat now {}, had {};
  if (a != h.conns.end() && ::fstat(fd.get(), &now) == 0 && ::fstat(a->second.arrival.get(), &had) == 0 &&
      now.st_ino == had.st_ino)
    return;
  ConnSocks c;
  c.arrival = std::move(fd);
  h.conns[&cs] = std::move(c);
  h.kick();
}

// IBTA vol. 1 annex A17 (RoCEv2) leaves the UDP source port to the
// sender, for entropy: a RoCE NIC varies it per QP (rxe: 0xC000 + a hash
// of the QPN) so that the receiving host's steering (RSS, RPS) spreads the
// flows over its CPUs. Every steered socket is bound to 4791; each lane
// sends from a socket of its own at a port the kernel picks, so that the
// lanes' flows hash apart. Peers answer to 4791 whatever the source
// port (and check the source address only, as rxe does).
int lane_sender(Hub& h, int member) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (::getsockname(member, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return -1;
  if (ss.ss_family == AF_INET) reinterpret_cast<sockaddr_in&>(ss).sin_port = 0;
  else if (ss.ss_family == AF_INET6) reinterpret_cast<sockaddr_in6&>(ss).sin6_port = 0;
  else return -1;
  std::string key(reinterpret_cast<const char*>(&ss), len);
  auto it = h.senders.find(key);
  if (it == h.senders.end()) {
    // By its system call: a program may preload librspreload.so (common/sys.h).
    Fd fd(kernel_socket(ss.ss_family, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (!fd.valid()) return -1;
    set_roce_socket_options(fd.get(), ss.ss_family);
    int big = 8 << 20, small = 0;
    if (::setsockopt(fd.get(), SOL_SOCKET, SO_SNDBUFFORCE, &big, sizeof big) != 0)
      ::setsockopt(fd.get(), SOL_SOCKET, SO_SNDBUF, &big, sizeof big);
    ::setsockopt(fd.get(), SOL_SOCKET, SO_RCVBUF, &small, sizeof small);  // it only sends
    if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&ss), len) != 0) return -1;
    it = h.senders.emplace(std::move(key), std::move(fd)).first;
  }
  return ::fcntl(it->second.get(), F_DUPFD_CLOEXEC, 0);
}

void start(Hub& h) {  // with h.mu held
  if (h.started) return;
  h.started = true;
  started_thread([&h] { h.run(); }).detach();
}

}  // namespace sv::verbs::wire
