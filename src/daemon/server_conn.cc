// server_conn.cc: one connection of softverbsd's event loop: its requests
// (from its socket and its request ring), its replies and events (queued
// while the socket is full), its epoll interest, and the wake socket the
// daemon signals when a sharer of its context departs. The loop itself, the
// listener and the copy worker are in server.cc.
#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/trace.h"
#include "daemon/commands.h"
#include "daemon/server.h"

namespace sv::daemon {

// Async events go out as unsolicited messages (seq 0) on the client's
// socket, and its async eventfd is raised so that a poller wakes up. An
// event that does not fit waits in the client's queue; an identical event
// already waiting there is not queued again (the client learns of it once,
// as a kernel's async event queue would coalesce a repeated event).
void Server::send_events() {
  for (const auto& ev : registry_.take_events()) {
    int fd = -1;
    if (Conn* c = conn_of(ev.client, fd)) {
      Conn& conn = *c;
      proto::AsyncEventMsg m{};
      proto::init_header(m, proto::Op::AsyncEvent, 0);
      m.event_type = ev.type;
      m.element = ev.element;
      const uint64_t key = ((uint64_t(ev.type) << 32) | ev.element) + 1;
      if (conn.events_queued.count(key)) continue;
      if (conn.events_queued.size() >= kMaxQueuedEvents) continue;
      if (enqueue(fd, conn, &m, sizeof(m), {}, key)) {
        int afd = registry_.async_fd_of(conn.client);
        if (afd >= 0) wake_signal(afd);  // never sleeps (a full socket: already signalled)
      }
    }
  }
}

bool Server::enqueue(int fd, Conn& c, const void* msg, size_t len, std::span<const int> fds, uint64_t event_key) {
  if (c.out.empty()) {
    int e = send_message(fd, msg, len, fds, true);
    if (e == 0) return true;
    if (e != EAGAIN && e != EWOULDBLOCK && e != ENOBUFS) {
      SV_TRACE("daemon: fd %d: not sent: %s", fd, std::strerror(e));
      return false;  // the client is gone; its hang-up drops it
    }
  }
  Out o;
  o.bytes.assign(static_cast<const uint8_t*>(msg), static_cast<const uint8_t*>(msg) + len);
  for (int f : fds) {
    Fd d(::fcntl(f, F_DUPFD_CLOEXEC, 0));
    if (!d.valid()) return false;
    o.fds.push_back(std::move(d));
  }
  // The duplicates are the user's descriptors until they are sent (serve
  // admitted them before the request ran: Server::fds_admitted).
  if (!o.fds.empty()) {
    o.fd_key = kQueuedFdsKey | ++queued_fds_seq_;
    registry_.quotas().charge_fds(o.fd_key, registry_.client_uid(c.client), uint32_t(o.fds.size()));
  }
  o.event_key = event_key;
  if (event_key) c.events_queued.insert(event_key);
  else ++c.replies_queued;
  c.out.push_back(std::move(o));
  update_interest(fd, c);
  return true;
}

// The client's socket has room: send what waits, in order.
void Server::flush(int fd) {
  auto it = conns_.find(fd);
  if (it == conns_.end()) return;
  Conn& c = it->second;
  while (!c.out.empty()) {
    Out& o = c.out.front();
    std::vector<int> raw;
    for (const Fd& f : o.fds) raw.push_back(f.get());
    int e = send_message(fd, o.bytes.data(), o.bytes.size(), raw, true);
    if (e == EAGAIN || e == EWOULDBLOCK || e == ENOBUFS) break;
    if (e != 0) {
      SV_TRACE("daemon: fd %d: queued message not sent: %s", fd, std::strerror(e));
      drop(fd);
      return;
    }
    if (o.event_key) c.events_queued.erase(o.event_key);
    else --c.replies_queued;
    registry_.quotas().release_fds(o.fd_key);
    c.out.pop_front();
  }
  update_interest(fd, c);
}

bool Server::held(const Conn& c) { return c.replies_queued >= kMaxQueuedReplies || c.copying; }

// Reading while few replies wait; writability while any message waits.
// A connection not served (held()) is not asked for EPOLLRDHUP either: a
// client that shut its sending half down would have it reported on every
// turn (level-triggered), a busy loop; its closing is EPOLLHUP, always
// reported.
void Server::update_interest(int fd, Conn& c) {
  uint32_t want = 0;
  if (!held(c)) want |= EPOLLIN | EPOLLRDHUP;
  if (!c.out.empty()) want |= EPOLLOUT;
  if (want == c.interest) return;
  epoll_event ev{};
  ev.events = want;
  ev.data.fd = fd;
  if (::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_MOD, fd, &ev) == 0) c.interest = want;
}

// The next request of connection `fd` into `in`: from its ring first (what
// the client wrote there came before any request it sends on the socket
// after it: post_ring.h), else from its socket. 0 (or EMSGSIZE, `len`
// what was read) with a request; EAGAIN when none waits; EBADMSG when the
// ring was corrupt and the connection is dropped; another errno from the
// socket.
int Server::next_request(int fd, Conn& c, uint8_t* in, size_t& len, std::vector<Fd>& fds, bool& ringed) {
  ringed = false;
  if (PostRing* ring = c.ring.get()) {
    const PostRing::Take t = ring->take(in);
    if (t == PostRing::Take::kCorrupt) {
      SV_TRACE("daemon: fd %d: request ring with an impossible tail: dropped", fd);
      drop(fd);
      return EBADMSG;
    }
    ringed = t == PostRing::Take::kOne;
    if (ringed) {
      len = PostRing::kSlotSize;
      return 0;
    }
  }
  return recv_message(fd, in, proto::kMaxMessage, &len, fds, true);
}

// A Mediate the handler deferred goes to the copy worker; its reply waits
// for it, and the connection is not served meanwhile (held).
void Server::defer_copy(int fd, Conn& conn, const uint8_t* in) {
  Copy c{conn.client, {}, std::move(deferred_)};
  std::memcpy(&c.h, in, sizeof c.h);
  const uid_t uid = c.job->uid;
  if (odp_copies_ && c.job->odp_pid()) {
    odp_copies_->start(std::move(c), kCopyPiece);
  } else {
    {
      std::lock_guard<std::mutex> g(copy_mu_);
      copy_queues_[uid].push_back(std::move(c));
    }
    copy_cv_.notify_one();
  }
  conn.copying = true;
  update_interest(fd, conn);
  send_events();
}

// The answer to a message malformed beyond answering (bad magic or
// version, truncated header): EPROTO, with its seq when it has one.
size_t Server::malformed(const uint8_t* in, size_t len, uint8_t* out) {
  proto::Empty rep{};
  proto::init_header(rep, proto::Op(0));
  rep.h.status = EPROTO;
  if (len >= sizeof(proto::Header)) std::memcpy(&rep.h.seq, in + offsetof(proto::Header, seq), 4);
  std::memcpy(out, &rep, sizeof(rep));
  return sizeof(rep);
}

bool Server::serve(int fd) {
  auto it = conns_.find(fd);
  if (it == conns_.end()) return false;
  bool worked = false;
  uint8_t in[proto::kMaxMessage];
  uint8_t out[proto::kMaxMessage];
  const uint64_t copied = registry_.mediated_on_loop();
  for (int served = 0; served < kRequestsPerTurn; ++served, worked = true) {
    // Not while it has kMaxQueuedReplies unread (it reads them first), nor
    // while its Mediate is being carried out (one request at a time).
    if (held(it->second)) return worked;
    size_t len = 0;
    std::vector<Fd> fds;
    bool ringed = false;
    int e = next_request(fd, it->second, in, len, fds, ringed);
    if (e == EAGAIN) return worked;
    if (e == EBADMSG) return true;  // dropped
    if (e == EMSGSIZE) {
      // Oversized or truncated message: answer with an error if we can read a header.
      if (len < sizeof(proto::Header)) continue;
    } else if (e != 0 || len == 0) {
      SV_TRACE("daemon: fd %d: %s", fd, e ? std::strerror(e) : "closed by the client");
      drop(fd);
      return true;
    }
    std::vector<int> out_fds;
    // A pipelined request (Op::MediatePost) is never answered, not even
    // malformed: its sender waits for no reply.
    uint16_t op = 0;
    if (len >= sizeof(proto::Header)) std::memcpy(&op, in + offsetof(proto::Header, op), sizeof op);
    const bool posted = op == uint16_t(proto::Op::MediatePost);
    if (ringed && !posted) continue;  // only MediatePost travels on the ring: anything else is ignored
    if (e != EMSGSIZE) revoke_copies(it->second.client, in, len);
    size_t rlen = 0;
    if (e != EMSGSIZE && !posted && !fds_admitted(it->second.client, op)) {
      rlen = refuse(in, EMFILE, out);
    } else if (e != EMSGSIZE) {
      serving_fd_ = fd;
      rlen = handle(it->second.client, in, len, fds, out, out_fds);
      serving_fd_ = -1;
      if (op == uint16_t(proto::Op::RegOdpMr)) watch_odp_owner(it->second.client);
    }
    if (deferred_) {
      defer_copy(fd, it->second, in);
      return true;
    }
    if (posted) {
      send_events();
      it = conns_.find(fd);
      if (it == conns_.end() || registry_.mediated_on_loop() - copied >= kCopyPiece) return true;
      continue;
    }
    if (rlen == 0) {
      rlen = malformed(in, len, out);
      out_fds.clear();
    }
    const bool queued = enqueue(fd, it->second, out, rlen, out_fds, 0);
    wake_given_.reset();  // sent or duplicated into the queue by now
    if (!queued) {
      drop(fd);
      return true;
    }
    send_events();
    it = conns_.find(fd);  // an event's failed send may not drop, but stay safe
    if (it == conns_.end()) return true;
    // Mediated copies made on the loop count against the turn: a piece's
    // worth ends it, as the copy worker serves a piece at a time.
    if (registry_.mediated_on_loop() - copied >= kCopyPiece) return true;
  }
  return true;
}

// A reply may wait in the output queue with duplicates of its descriptors
// (enqueue), charged to the user: a request whose reply may carry some is
// run only while the user's quota has room for all it may carry (else
// EMFILE, as for any descriptor over the quota). So what a user's unread
// replies hold stays within its quota, give or take one reply's.
bool Server::fds_admitted(uint32_t client, uint16_t op) {
  const proto::OpInfo* info = proto::op_info(op);
  if (!info || info->out.max == 0) return true;
  if (registry_.quotas().admit_fds(registry_.client_uid(client), info->out.max) == 0) return true;
  SV_TRACE("daemon: client %u: %s refused: descriptor quota reached", client, info->name);
  return false;
}

size_t Server::refuse(const uint8_t* req, int status, uint8_t* out) {
  proto::Empty rep{};
  std::memcpy(&rep.h, req, sizeof rep.h);
  rep.h.status = status;
  std::memcpy(out, &rep, sizeof rep);
  return sizeof rep;
}

// Lookup, check, call: commands.cc, from the op table (common/protocol.h).
size_t Server::handle(uint32_t client, const uint8_t* msg, size_t len, std::vector<Fd>& in_fds,
                      uint8_t* out, std::vector<int>& out_fds) {
  if (len < sizeof(proto::Header)) return 0;
  proto::Header h;
  std::memcpy(&h, msg, sizeof(h));
  if (h.magic != proto::kMagic || h.version != proto::kVersion) return 0;
  CommandEnv env{registry_, roce_, client, in_fds, out_fds, defer_copies_ ? &deferred_ : nullptr};
  if (serving_fd_ >= 0) {
    const int fd = serving_fd_;
    env.post_ring = [this, fd](proto::PostRingReply& rep, std::vector<int>& fds) { return open_ring(fd, rep, fds); };
    env.wake = [this, fd](std::vector<int>& fds) { return open_wake(fd, fds); };
  }
  const size_t n = run_command(env, h, msg, len, out);
  sync_mcast();
  return n;
}

// ---- Request rings (post_ring.h) ---------------------------------------------

// Op::PostRing: one ring per connection, its eventfd watched with the rest.
int Server::open_ring(int fd, proto::PostRingReply& rep, std::vector<int>& out_fds) {
  auto it = conns_.find(fd);
  if (it == conns_.end()) return EINVAL;
  if (it->second.ring) return EBUSY;
  const uid_t uid = registry_.client_uid(it->second.client);
  if (int e = registry_.quotas().admit_fds(uid, PostRing::kFds)) return e;
  std::unique_ptr<PostRing> ring;
  if (int e = PostRing::create(ring)) return e;
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = ring->wake();
  if (::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, ring->wake(), &ev) != 0) return errno;
  ring_efds_[ring->wake()] = fd;
  registry_.quotas().charge_fds(Quotas::fd_key(it->second.client, Quotas::kRingFds), uid, PostRing::kFds);
  rep.capacity = ring->capacity();
  rep.slot_size = uint32_t(PostRing::kSlotSize);
  rep.size = PostRing::size();
  out_fds = {ring->memfd(), ring->theirs()};
  it->second.ring = std::move(ring);
  return 0;
}

int Server::open_wake(int fd, std::vector<int>& out_fds) {
  auto it = conns_.find(fd);
  if (it == conns_.end()) return EINVAL;
  if (it->second.wake.valid()) return EBUSY;
  const uid_t uid = registry_.client_uid(it->second.client);
  if (int e = registry_.quotas().admit_fds(uid, 1)) return e;  // the daemon's end
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, sv) != 0) return errno;
  it->second.wake.reset(sv[0]);
  registry_.quotas().charge_fds(Quotas::fd_key(it->second.client, Quotas::kWakeFd), uid, 1);
  wake_given_.reset(sv[1]);
  out_fds = {sv[1]};
  return 0;
}

// The daemon's end is its own open file: whatever the client does to its
// end (never reading, flags) the send cannot block. A full socket holds
// wakes the client has not read; the one dropped is said on the trace.
void Server::wake_sharers(uint32_t context, uint32_t pid) {
  if (context == 0) return;
  // The context's own connections (the registry's index): the cost is the
  // departed process's sharers, not every connection of the daemon.
  for (uint32_t client : registry_.clients_of(context)) {
    int fd = -1;
    Conn* c = conn_of(client, fd);
    if (c && c->wake.valid() && ::send(c->wake.get(), &pid, sizeof pid, MSG_DONTWAIT | MSG_NOSIGNAL) != ssize_t(sizeof pid))
      SV_TRACE("daemon: fd %d: wake for pid %u not sent: %s", fd, pid, std::strerror(errno));
  }
}

// A connection not served (held) is not looked at: what waits in its ring
// waits until it is served again (its unread replies read: EPOLLOUT, flush;
// its copy done: copies_done), however its tail moves meanwhile.
bool Server::serve_rings() {
  ring_ready_.clear();
  for (auto& [fd, c] : conns_)
    if (c.ring && !held(c) && c.ring->pending()) ring_ready_.push_back(fd);
  bool worked = false;
  for (int fd : ring_ready_) worked |= serve(fd);  // may drop a connection: by fd, not by iterator
  return worked;
}

bool Server::rings_may_sleep() {
  bool waiting = false;
  for (auto& [fd, c] : conns_)
    if (c.ring && !held(c) && c.ring->may_sleep()) waiting = true;
  return waiting;
}

// A ring's wake-up: read without sleeping. Its other end closed (EOF,
// reported readable for good): no longer watched.
void Server::ring_woken(int wake, int conn_fd) {
  if (wake_drain(wake) == EPIPE) {
    ::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_DEL, wake, nullptr);
    ring_efds_.erase(wake);
  }
  serve(conn_fd);
}

void Server::rings_awake() {
  for (auto& [fd, c] : conns_)
    if (c.ring) c.ring->awake();
}

// The RoCEv2 port listens to the multicast groups that have members
// (docs/ROCE.md, "Multicast"): after every command and departed client,
// when the groups changed (attach, detach, a destroyed QP).
void Server::sync_mcast() {
  const uint64_t g = registry_.mcast_generation();
  if (g == mcast_generation_) return;
  mcast_generation_ = g;
  roce_.mcast_sync(registry_.mcast_gids());
}

}  // namespace sv::daemon
