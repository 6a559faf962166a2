// cma.cc: rdma_cm ids, event channels and the connection manager between
// processes of one host.
//
// Rendezvous: every bound id owns a listening unix SOCK_SEQPACKET socket at
// $RUNTIME/cm/<port space>-<port>-<address>; an active id connects to the
// socket of (its destination, port) or of the wildcard address, and the
// connection then carries the IB CM's MADs (cm_msg.h): REQ/REP/RTU/REJ/
// DREQ/DREP for connected ids, SIDR_REQ/SIDR_REP for UD ids. The socket's
// end is the peer's death: a connected id sees DISCONNECTED.
//
// Threads: one engine thread per process (epoll on the sockets, timers)
// turns messages into events. All state is under one mutex `g.mu`; the
// engine never calls back into the application. rdma_get_cm_event blocks
// in read(2) on the channel's eventfd (a semaphore: one count per queued
// event), never under the mutex.
#include <fcntl.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/paths.h"
#include "rdmacm/cm_msg.h"
#include "rdmacm/cm_trace.h"
#include "rdmacm/cma.h"

using namespace sv::rdmacm;
namespace cm = sv::cm;

namespace {

using Clock = std::chrono::steady_clock;

// How long an active side waits for a REP / SIDR_REP (the kernel's CM
// retries a REQ for about a minute before UNREACHABLE).
constexpr auto kRepTimeout = std::chrono::seconds(60);
// A REQ that finds nobody listening waits this long for a listener before
// it is rejected (reason 8). Programs race their own listen: perftest's
// server calls rdma_listen only after an out-of-band handshake that the
// client leaves first and connects at once. The CM may answer a REQ any
// time within the REQ's response timeout (IBTA 12.6.5), so waiting is
// within the rules; the daemon's CM gateway does the same for the wire.
constexpr auto kNoListenerGrace = std::chrono::milliseconds(50);
// From DISCONNECTED to TIMEWAIT_EXIT (IBTA 12.9.8.6: the QPN may not be
// reused for a while; applications wait for this event to reuse the QP).
constexpr auto kTimewait = std::chrono::milliseconds(500);
// Default local ACK timeout (4.096 us * 2^14 = 67 ms), as Linux computes it
// for RoCE from the path's packet life time.
constexpr uint8_t kDefaultAckTimeout = 14;
constexpr uint8_t kCmResponseTimeout = 20;  // IBTA 12.6.5: 4.096 us * 2^20 = 4.3 s
constexpr uint8_t kMaxCmRetries = 15;

struct Event {
  rdma_cm_event ev{};
  uint64_t owner = 0;         // serial of ev.id
  uint64_t listen_owner = 0;  // serial of ev.listen_id
  uint8_t pdata[cm::kMadSize] = {};
};

struct Channel {
  rdma_event_channel ch{};  // first: the application holds &ch
  std::deque<Event*> q;
  // Destroyed by the application while ids still used it (rdma_destroy_event_channel):
  // no fd, events dropped, freed with the last of those ids.
  bool dead = false;
};

enum class St {
  kIdle,
  kAddrQuery,
  kAddrResolved,
  kRouteResolved,
  kListen,
  kConnect,      // REQ / SIDR_REQ sent
  kRepRcvd,      // active without a QP: CONNECT_RESPONSE given, waiting for rdma_establish
  kReqRcvd,      // passive: CONNECT_REQUEST given, waiting for accept / reject
  kRepSent,      // passive: REP sent, waiting for RTU
  kEstablished,
  kDreqSent,
  kDisconnected,
  kRejected,
};

enum class TimerKind { kAddrError, kRepTimeout, kTimewait, kRetryConnect };

struct Id {
  rdma_cm_id id{};  // first: the application holds &id
  uint64_t serial = 0;
  St st = St::kIdle;
  bool sync = false;  // created without a channel: calls wait for their events
  Channel* own_channel = nullptr;  // the private channel of a sync id
  int bind_fd = -1;
  std::string bind_path;
  int conn_fd = -1;
  uint64_t listener = 0;  // passive child: its listener's serial
  int backlog = 0;
  uint32_t local_comm_id = 0, remote_comm_id = 0;
  // The Starting PSN of a REQ and of a REP (IBTA 12.6.5, 12.6.8) is the
  // first PSN the sender's receive queue expects, i.e. where the other
  // side's send queue starts: Linux's CM reads it so (cm.c: the active side
  // takes the REP's as its sq_psn, the passive side the REQ's), and so every
  // Linux peer (rxe, RoCE NICs) does. my_psn is what ours expects and we
  // send; peer_psn what the other side sent, where our send queue starts.
  uint32_t my_psn = 0, peer_psn = 0, peer_qpn = 0, peer_qkey = 0;
  ibv_gid peer_gid{};
  int sgid_index = 0;
  uint8_t responder_resources = 0, initiator_depth = 0;
  uint8_t retry_count = 7, rnr_retry_count = 7;
  uint8_t tos = 0, ack_timeout = kDefaultAckTimeout;
  bool ack_timeout_set = false, afonly = false, reuseaddr = false;
  bool peer_gone = false;
  bool had_qp = false;
  // The peer is on another host: the CM's messages go through the daemon's
  // gateway (src/daemon/cm_gateway.cc) as MADs on QP1 over RoCEv2.
  bool wire = false;
  uint8_t path_mtu = 0;  // enum ibv_mtu of the path (the REQ's), 0: the port's
  uint64_t timer_gen = 0;
  ibv_qp_init_attr* ep_qp_attr = nullptr;  // rdma_create_ep on a passive id
  bool created_cqs = false;
  // rdma_connect's REQ is built at once but sent when the connect succeeds
  // (a full listen backlog is retried).
  uint8_t pending_req[cm::kMadSize] = {};
  Clock::time_point connect_deadline{};
  Clock::time_point no_listener_until{};  // kNoListenerGrace after rdma_connect
};

struct Timer {
  uint64_t serial;
  uint64_t gen;
  TimerKind kind;
};

enum class FdKind { kBind, kPending, kConn, kWake, kAsync };
struct FdRef {
  FdKind kind;
  uint64_t serial;
};

struct Global {
  std::mutex mu;
  std::unordered_map<uint64_t, Id*> ids;
  std::unordered_map<int, FdRef> fds;
  std::multimap<Clock::time_point, Timer> timers;
  uint64_t next_serial = 1;
  int ep = -1, wake = -1;
  std::once_flag started;
  ibv_context* watch_ctx = nullptr;  // its async fd tells of the daemon's death
  bool device_removed = false;
};
Global& g = *new Global;  // never destroyed: the engine thread outlives static destructors

Id* id_of(rdma_cm_id* id) { return reinterpret_cast<Id*>(id); }
Channel* chan_of(rdma_event_channel* c) { return reinterpret_cast<Channel*>(c); }
Id* find(uint64_t serial) {
  auto it = g.ids.find(serial);
  return it == g.ids.end() ? nullptr : it->second;
}

uint32_t random32() {
  uint32_t v = 0;
  if (::getrandom(&v, sizeof(v), 0) != sizeof(v)) v = uint32_t(Clock::now().time_since_epoch().count());
  return v;
}

// --- events -----------------------------------------------------------------

Event* new_event(Id* d, rdma_cm_event_type type, int status) {
  CM_TRACE("id %llu event %s status %d", (unsigned long long)d->serial, rdma_event_str(type), status);
  auto* e = new Event;
  e->ev.id = &d->id;
  e->ev.event = type;
  e->ev.status = status;
  e->owner = d->serial;
  return e;
}

void post(Id* d, Event* e) {
  auto* c = chan_of(d->id.channel);
  if (c->dead) {
    delete e;
    return;
  }
  c->q.push_back(e);
  uint64_t one = 1;
  (void)!::write(c->ch.fd, &one, sizeof(one));
}

void post(Id* d, rdma_cm_event_type type, int status) { post(d, new_event(d, type, status)); }

void set_conn_pdata(Event* e, const void* p, size_t n) {
  std::memcpy(e->pdata, p, n);
  e->ev.param.conn.private_data = e->pdata;
  e->ev.param.conn.private_data_len = uint8_t(n);
}

// --- engine -----------------------------------------------------------------

void engine_loop();

void start_engine() {
  std::call_once(g.started, [] {
    g.ep = ::epoll_create1(EPOLL_CLOEXEC);
    g.wake = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = g.wake;
    ::epoll_ctl(g.ep, EPOLL_CTL_ADD, g.wake, &ev);
    g.fds[g.wake] = {FdKind::kWake, 0};
    std::thread(engine_loop).detach();
  });
}

void watch(int fd, FdKind kind, uint64_t serial) {
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLRDHUP;
  ev.data.fd = fd;
  ::epoll_ctl(g.ep, EPOLL_CTL_ADD, fd, &ev);
  g.fds[fd] = {kind, serial};
}

void unwatch_close(int& fd) {
  if (fd < 0) return;
  ::epoll_ctl(g.ep, EPOLL_CTL_DEL, fd, nullptr);
  g.fds.erase(fd);
  ::close(fd);
  fd = -1;
}

void add_timer(Id* d, TimerKind kind, Clock::time_point when) {
  g.timers.emplace(when, Timer{d->serial, d->timer_gen, kind});
  uint64_t one = 1;
  (void)!::write(g.wake, &one, sizeof(one));
}

void cancel_timers(Id* d) { d->timer_gen++; }

bool send_mad(Id* d, const uint8_t* mad) {
  if (d->conn_fd < 0) return false;
  return ::send(d->conn_fd, mad, cm::kMadSize, MSG_NOSIGNAL | MSG_DONTWAIT) == ssize_t(cm::kMadSize);
}

// --- the rendezvous directory -------------------------------------------------

// With the system daemon (SOFTVERBS_SYSTEM=1) every user's ids meet in its
// directory, which the daemon made sticky and writable by all: the port
// space is the host's, as on Linux. Otherwise the user's own directory.
std::string daemon_dir() { return sv::use_system_daemon() ? sv::system_dir() : sv::runtime_dir(); }

std::string cm_dir() {
  if (sv::use_system_daemon()) return sv::system_dir() + "/cm";
  std::string dir = sv::runtime_dir();
  sv::ensure_runtime_dir(dir);
  dir += "/cm";
  ::mkdir(dir.c_str(), 0700);
  return dir;
}

std::string rendezvous_path(int ps, uint16_t port, const std::string& addr) {
  return cm_dir() + "/" + std::to_string(ps) + "-" + std::to_string(port) + "-" + addr;
}

bool fill_sun(sockaddr_un& sun, const std::string& path) {
  if (path.size() >= sizeof(sun.sun_path)) return false;
  sun = {};
  sun.sun_family = AF_UNIX;
  std::memcpy(sun.sun_path, path.c_str(), path.size() + 1);
  return true;
}

// Binds a listening socket at `path`. A socket file left by a dead process
// refuses connections and is replaced. Returns the fd or -errno.
int bind_path(const std::string& path) {
  sockaddr_un sun;
  if (!fill_sun(sun, path)) return -ENAMETOOLONG;
  for (int attempt = 0; attempt < 2; ++attempt) {
    int fd = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return -errno;
    if (::bind(fd, reinterpret_cast<sockaddr*>(&sun), sizeof(sun)) == 0) {
      // Shared with other users (system daemon): they connect to it.
      if (sv::use_system_daemon() && ::chmod(path.c_str(), 0666) != 0) {
        int e = errno;
        ::unlink(path.c_str());
        ::close(fd);
        return -e;
      }
      if (::listen(fd, SOMAXCONN) == 0) return fd;
      int e = errno;
      ::close(fd);
      return -e;
    }
    int e = errno;
    ::close(fd);
    if (e != EADDRINUSE) return -e;
    int probe = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    int r = ::connect(probe, reinterpret_cast<sockaddr*>(&sun), sizeof(sun));
    int pe = errno;
    ::close(probe);
    if (r == 0 || pe != ECONNREFUSED) return -EADDRINUSE;
    ::unlink(path.c_str());  // stale
  }
  return -EADDRINUSE;
}

bool path_exists(const std::string& p) { return ::access(p.c_str(), F_OK) == 0; }

// rdma_bind_addr for an id: reserve (ps, port, address); port 0 picks a free
// ephemeral port (the same range as Linux's ip_local_port_range default).
int do_bind(Id* d, const sockaddr* addr) {
  sockaddr_storage a{};
  std::memcpy(&a, addr, addr_len(addr));
  auto* sa = reinterpret_cast<sockaddr*>(&a);
  std::string text = addr_is_any(sa) ? (sa->sa_family == AF_INET ? "0.0.0.0" : "::") : addr_text(sa);
  int ps = d->id.ps;
  uint16_t port = addr_port(sa);
  int fd = -1;
  // Among users, a port below 1024 is privileged, as Linux's rdma_cm has it
  // (CAP_NET_BIND_SERVICE).
  if (port && port < 1024 && sv::use_system_daemon() && ::geteuid() != 0) return EACCES;
  if (port) {
    // A wildcard and a specific bind of one port conflict, as in TCP.
    if (!addr_is_any(sa) && (path_exists(rendezvous_path(ps, port, "0.0.0.0")) ||
                             path_exists(rendezvous_path(ps, port, "::")))) {
      int probe = bind_path(rendezvous_path(ps, port, sa->sa_family == AF_INET ? "0.0.0.0" : "::"));
      if (probe < 0) return EADDRINUSE;
      ::close(probe);
      ::unlink(rendezvous_path(ps, port, sa->sa_family == AF_INET ? "0.0.0.0" : "::").c_str());
    }
    fd = bind_path(rendezvous_path(ps, port, text));
    if (fd < 0) return -fd;
  } else {
    for (int i = 0; i < 1000 && fd < 0; ++i) {
      port = uint16_t(32768 + random32() % (60999 - 32768));
      if (path_exists(rendezvous_path(ps, port, "0.0.0.0")) || path_exists(rendezvous_path(ps, port, "::")) ||
          path_exists(rendezvous_path(ps, port, text)))
        continue;
      fd = bind_path(rendezvous_path(ps, port, text));
      if (fd == -ENAMETOOLONG) return ENAMETOOLONG;
    }
    if (fd < 0) return EADDRINUSE;
    set_port(sa, port);
  }
  d->bind_fd = fd;
  d->bind_path = rendezvous_path(ps, port, text);
  CM_TRACE("id %llu bound at %s", (unsigned long long)d->serial, d->bind_path.c_str());
  watch(fd, FdKind::kBind, d->serial);
  std::memcpy(&d->id.route.addr.src_storage, &a, sizeof(a));
  // A loopback address is no device's (as in Linux, where no RoCE GID holds
  // it): the id gets its device when it connects or is connected to.
  // libfabric's verbs provider relies on this to find the device's own
  // addresses when it binds "localhost" (vrb_get_rai_id).
  if (!addr_is_any(sa) && !addr_is_loopback(sa)) {
    ibv_gid gid{};
    int idx = gid_index_of(sa, &gid);
    if (idx >= 0) {
      d->sgid_index = idx;
      d->id.route.addr.addr.ibaddr.sgid = gid;
      d->id.verbs = device();
      d->id.pd = default_pd();
      d->id.port_num = 1;
    }
  }
  d->id.route.addr.addr.ibaddr.pkey = htobe16(0xffff);
  return 0;
}

// --- QP transitions (librdmacm's order: INIT at create; INIT again, RTR, RTS
// at accept / on REP; ERR at disconnect) ----------------------------------------

int init_qp_attr(Id* d, ibv_qp_attr* a, int* mask) {
  ibv_qp_state want = a->qp_state;
  std::memset(a, 0, sizeof(*a));
  a->qp_state = want;
  bool ud = d->id.qp_type == IBV_QPT_UD;
  bool connected = d->st == St::kConnect || d->st == St::kRepRcvd || d->st == St::kReqRcvd ||
                   d->st == St::kRepSent || d->st == St::kEstablished;
  switch (want) {
    case IBV_QPS_INIT:
      a->pkey_index = 0;
      a->port_num = 1;
      *mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT;
      if (ud) {
        a->qkey = RDMA_UDP_QKEY;
        *mask |= IBV_QP_QKEY;
      } else {
        // IBTA 12.7.30: remote reads and atomics only with responder resources.
        a->qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
        if (!connected || d->responder_resources)
          a->qp_access_flags |= IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
        *mask |= IBV_QP_ACCESS_FLAGS;
      }
      return 0;
    case IBV_QPS_RTR:
      *mask = IBV_QP_STATE;
      if (ud) return 0;
      if (!connected) return EINVAL;
      a->path_mtu = IBV_MTU_1024;
      if (ibv_context* c = d->id.verbs) {
        ibv_port_attr pa{};
        if (ibv_query_port(c, 1, &pa) == 0) a->path_mtu = pa.active_mtu;
      }
      // IBTA 12.7.23: the REQ's path MTU (that of the path between the hosts).
      if (d->path_mtu && d->path_mtu < a->path_mtu) a->path_mtu = ibv_mtu(d->path_mtu);
      a->dest_qp_num = d->peer_qpn;
      a->rq_psn = d->my_psn;
      a->ah_attr.is_global = 1;
      a->ah_attr.grh.dgid = d->peer_gid;
      a->ah_attr.grh.sgid_index = uint8_t(d->sgid_index);
      a->ah_attr.grh.hop_limit = 64;
      a->ah_attr.grh.traffic_class = d->tos;
      a->ah_attr.port_num = 1;
      a->max_dest_rd_atomic = d->responder_resources;
      // The responder's RNR NAK delay (IBTA 9.7.5.2.8 table 45) is its own
      // choice. Linux's CM leaves 0 (655 ms), which on softverbs, where a
      // sender outruns the receiver's reposting far more often than on
      // hardware, stalls streaming programs (qperf rc_bw) for seconds;
      // 12 (0.64 ms) is what perftest picks.
      a->min_rnr_timer = 12;
      *mask |= IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
               IBV_QP_MIN_RNR_TIMER;
      return 0;
    case IBV_QPS_RTS:
      *mask = IBV_QP_STATE | IBV_QP_SQ_PSN;
      a->sq_psn = ud ? d->my_psn : d->peer_psn;  // UD: any, its receiver checks none
      if (ud) return 0;
      if (!connected) return EINVAL;
      a->timeout = d->ack_timeout;
      a->retry_cnt = d->retry_count;
      a->rnr_retry = d->rnr_retry_count;
      a->max_rd_atomic = d->initiator_depth;
      *mask |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
      return 0;
    default:
      return EINVAL;
  }
}

int modify_to(Id* d, ibv_qp_state s) {
  if (!d->id.qp) return 0;
  ibv_qp_attr a{};
  a.qp_state = s;
  int mask = 0;
  if (int e = init_qp_attr(d, &a, &mask)) return e;
  return ibv_modify_qp(d->id.qp, &a, mask);
}

// ucma_modify_qp_rtr + ucma_modify_qp_rts.
int connect_qp(Id* d) {
  if (!d->id.qp) return 0;
  if (int e = modify_to(d, IBV_QPS_INIT)) return e;
  if (int e = modify_to(d, IBV_QPS_RTR)) return e;
  return modify_to(d, IBV_QPS_RTS);
}

void qp_to_err(Id* d) {
  if (!d->id.qp) return;
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_ERR;
  ibv_modify_qp(d->id.qp, &a, IBV_QP_STATE);
}

void fill_path_rec(Id* d) {
  if (!d->id.route.path_rec)
    d->id.route.path_rec = static_cast<ibv_sa_path_rec*>(std::calloc(1, sizeof(ibv_sa_path_rec)));
  if (!d->id.route.path_rec) return;
  ibv_sa_path_rec& p = *d->id.route.path_rec;
  p.sgid = d->id.route.addr.addr.ibaddr.sgid;
  p.dgid = d->id.route.addr.addr.ibaddr.dgid;
  p.pkey = htobe16(0xffff);
  p.hop_limit = 64;
  p.traffic_class = d->tos;
  p.reversible = 1;
  p.numb_path = 1;
  p.mtu_selector = 2;
  p.mtu = d->path_mtu ? ibv_mtu(d->path_mtu) : IBV_MTU_4096;
  p.rate_selector = 2;
  p.rate = 2;
  p.packet_life_time_selector = 2;
  p.packet_life_time = 6;
  d->id.route.num_paths = 1;
}

// --- tearing down -------------------------------------------------------------

void drop_events_of(Channel* c, uint64_t serial, bool also_listen);
void destroy_locked(Id* d);

// A listener's CONNECT_REQUEST whose child is dropped with it: the active
// side is rejected.
void reject_child(Id* child, uint16_t reason) {
  if (child->conn_fd >= 0 && child->st == St::kReqRcvd) {
    uint8_t mad[cm::kMadSize];
    if (child->id.qp_type == IBV_QPT_UD) {
      cm::SidrRep r;
      r.request_id = child->remote_comm_id;
      r.status = cm::kSidrRejected;
      cm::encode(r, 0, mad);
    } else {
      cm::Rej r;
      r.local_comm_id = child->local_comm_id;
      r.remote_comm_id = child->remote_comm_id;
      r.message_rejected = cm::kRejectedReq;
      r.reason = reason;
      cm::encode(r, 0, mad);
    }
    send_mad(child, mad);
  }
}

void drop_events_of(Channel* c, uint64_t serial, bool also_listen) {
  std::vector<uint64_t> children;
  for (auto it = c->q.begin(); it != c->q.end();) {
    Event* e = *it;
    if (e->owner == serial || (also_listen && e->listen_owner == serial)) {
      if (e->listen_owner == serial && e->owner != serial) children.push_back(e->owner);
      delete e;
      it = c->q.erase(it);  // the eventfd count is left: rdma_get_cm_event skips the gap
    } else {
      ++it;
    }
  }
  for (uint64_t s : children) {
    if (Id* child = find(s)) {
      reject_child(child, cm::kRejInvalidServiceId);
      destroy_locked(child);
    }
  }
}

void free_channel(Channel* c) {
  for (Event* e : c->q) delete e;
  if (c->ch.fd >= 0) ::close(c->ch.fd);
  delete c;
}

bool channel_in_use(const Channel* c) {
  for (const auto& [serial, d] : g.ids)
    if (d->id.channel == &c->ch) return true;
  return false;
}

// A channel the application destroyed while ids used it, once none does.
void free_if_dead(rdma_event_channel* ch) {
  Channel* c = chan_of(ch);
  if (c && c->dead && !channel_in_use(c)) free_channel(c);
}

void destroy_locked(Id* d) {
  g.ids.erase(d->serial);
  cancel_timers(d);
  if (d->id.channel) drop_events_of(chan_of(d->id.channel), d->serial, true);
  if (d->conn_fd >= 0 && !d->peer_gone) {
    uint8_t mad[cm::kMadSize];
    if (d->st == St::kEstablished || d->st == St::kRepSent || d->st == St::kRepRcvd) {
      if (d->id.qp_type != IBV_QPT_UD) {
        cm::Dreq r;  // IBTA 12.9.8.4: destroying a connection sends a DREQ
        r.local_comm_id = d->local_comm_id;
        r.remote_comm_id = d->remote_comm_id;
        r.remote_qpn = d->peer_qpn;
        cm::encode(r, 0, mad);
        send_mad(d, mad);
      }
    } else if (d->st == St::kReqRcvd) {
      reject_child(d, cm::kRejConsumer);
    }
  }
  unwatch_close(d->conn_fd);
  if (d->bind_fd >= 0) {
    unwatch_close(d->bind_fd);
    ::unlink(d->bind_path.c_str());
  }
  std::free(d->id.route.path_rec);
  delete d->ep_qp_attr;
  rdma_event_channel* ch = d->own_channel ? nullptr : d->id.channel;
  if (d->own_channel) free_channel(d->own_channel);
  delete d;
  free_if_dead(ch);
}

// --- the passive side ---------------------------------------------------------

void on_accepted(Id* listener) {
  for (;;) {
    int fd = ::accept4(listener->bind_fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) return;
    watch(fd, FdKind::kPending, listener->serial);
  }
}

void reply_and_close(int fd, const uint8_t* mad) {
  (void)!::send(fd, mad, cm::kMadSize, MSG_NOSIGNAL | MSG_DONTWAIT);
  unwatch_close(fd);
}

Id* new_id(Channel* c, void* context, rdma_port_space ps, ibv_qp_type qpt) {
  auto* d = new Id;
  d->serial = g.next_serial++;
  d->id.channel = c ? &c->ch : nullptr;
  d->id.context = context;
  d->id.ps = ps;
  d->id.qp_type = qpt;
  g.ids[d->serial] = d;
  return d;
}

void make_sync(Id* d);

// A REQ or SIDR_REQ on a fresh connection to listener `serial`.
void on_request(int fd, uint64_t serial, const cm::Msg& m) {
  Id* l = find(serial);
  bool ud = m.attr == cm::Attr::kSidrReq;
  const uint8_t* pdata = ud ? m.sidr_req.private_data : m.req.private_data;
  uint64_t sid = ud ? m.sidr_req.service_id : m.req.service_id;
  cm::IpHeader ip;
  // (a listener whose channel the application destroyed hears nothing: as none)
  bool ok = l && l->st == St::kListen && !(l->id.channel && chan_of(l->id.channel)->dead) &&
            cm::decode_ip_header(pdata, ip) && sid == cm::service_id(l->id.ps, addr_port(&l->id.route.addr.src_addr));
  if (ok) {
    int pending = 0;
    for (auto& [s, c] : g.ids)
      if (c->listener == serial && c->st == St::kReqRcvd) pending++;
    ok = pending < l->backlog;
  }
  if (!ok) {
    uint8_t mad[cm::kMadSize];
    if (ud) {
      cm::SidrRep r;
      r.request_id = m.sidr_req.request_id;
      r.status = cm::kSidrNoService;
      r.service_id = sid;
      cm::encode(r, m.tid, mad);
    } else {
      cm::Rej r;
      r.remote_comm_id = m.req.local_comm_id;
      r.local_comm_id = random32();
      r.message_rejected = cm::kRejectedReq;
      r.reason = cm::kRejInvalidServiceId;
      cm::encode(r, m.tid, mad);
    }
    reply_and_close(fd, mad);
    return;
  }
  Id* d = new_id(chan_of(l->id.channel), l->id.context, l->id.ps, l->id.qp_type);
  d->listener = serial;
  d->conn_fd = fd;
  g.fds[fd] = {FdKind::kConn, d->serial};
  d->st = St::kReqRcvd;
  d->tos = l->tos;
  // The local address is the one the active side dialled (a wildcard
  // listener answers for every address), with the listener's port.
  sockaddr_storage local = ip.dst;
  set_port(reinterpret_cast<sockaddr*>(&local), addr_port(&l->id.route.addr.src_addr));
  std::memcpy(&d->id.route.addr.src_storage, &local, sizeof(local));
  std::memcpy(&d->id.route.addr.dst_storage, &ip.src, sizeof(ip.src));
  ibv_gid gid{};
  int idx = gid_index_of(reinterpret_cast<sockaddr*>(&local), &gid);
  d->sgid_index = idx < 0 ? 0 : idx;
  d->id.route.addr.addr.ibaddr.sgid = gid;
  d->id.route.addr.addr.ibaddr.pkey = htobe16(0xffff);
  // The requester's GID (a SIDR_REQ carries none: its IP address, Annex A17.8).
  d->peer_gid = gid_of_addr(reinterpret_cast<sockaddr*>(&ip.src));
  d->id.route.addr.addr.ibaddr.dgid = d->peer_gid;
  d->id.verbs = device();
  d->id.pd = default_pd();
  d->id.port_num = 1;
  Event* e = new_event(d, RDMA_CM_EVENT_CONNECT_REQUEST, 0);
  e->ev.listen_id = &l->id;
  e->listen_owner = serial;
  if (ud) {
    d->remote_comm_id = m.sidr_req.request_id;
    std::memcpy(e->pdata, pdata + cm::kIpHeader, cm::kSidrReqPrivate - cm::kIpHeader);
    e->ev.param.ud.private_data = e->pdata;
    e->ev.param.ud.private_data_len = uint8_t(cm::kSidrReqPrivate - cm::kIpHeader);
  } else {
    const cm::Req& r = m.req;
    d->local_comm_id = random32();
    d->remote_comm_id = r.local_comm_id;
    d->peer_qpn = r.local_qpn;
    d->peer_psn = r.starting_psn;
    d->my_psn = random32() & 0xffffff;
    std::memcpy(d->peer_gid.raw, r.local_gid, 16);
    d->path_mtu = r.path_mtu >= IBV_MTU_256 && r.path_mtu <= IBV_MTU_4096 ? r.path_mtu : 0;
    d->id.route.addr.addr.ibaddr.dgid = d->peer_gid;
    // Seen from the passive side, the requester's initiator depth is what
    // it asks of our responder, and vice versa (as Linux's CM reports them).
    d->responder_resources = r.initiator_depth;
    d->initiator_depth = r.responder_resources;
    d->retry_count = r.retry_count;
    d->rnr_retry_count = r.rnr_retry_count;
    d->ack_timeout = r.local_ack_timeout ? r.local_ack_timeout : kDefaultAckTimeout;
    set_conn_pdata(e, pdata + cm::kIpHeader, cm::kReqPrivate - cm::kIpHeader);
    rdma_conn_param& p = e->ev.param.conn;
    p.responder_resources = d->responder_resources;
    p.initiator_depth = d->initiator_depth;
    p.flow_control = r.flow_control;
    p.retry_count = r.retry_count;
    p.rnr_retry_count = r.rnr_retry_count;
    p.srq = r.srq;
    p.qp_num = r.local_qpn;
  }
  fill_path_rec(d);
  if (l->sync) make_sync(d);
  post(l, e);
}

// --- the connection's messages ------------------------------------------------

void send_rtu(Id* d) {
  cm::Rtu r;
  r.local_comm_id = d->local_comm_id;
  r.remote_comm_id = d->remote_comm_id;
  uint8_t mad[cm::kMadSize];
  cm::encode(r, 0, mad);
  send_mad(d, mad);
}

void disconnected(Id* d) {
  d->st = St::kDisconnected;
  cancel_timers(d);
  post(d, RDMA_CM_EVENT_DISCONNECTED, 0);
  add_timer(d, TimerKind::kTimewait, Clock::now() + kTimewait);
}

void on_rep(Id* d, const cm::Rep& r) {
  if (d->st != St::kConnect || r.remote_comm_id != d->local_comm_id) return;
  cancel_timers(d);
  d->remote_comm_id = r.local_comm_id;
  d->peer_qpn = r.local_qpn;
  d->peer_psn = r.starting_psn;
  d->responder_resources = r.initiator_depth;
  d->initiator_depth = r.responder_resources;
  d->rnr_retry_count = r.rnr_retry_count;
  Event* e = new_event(d, d->id.qp ? RDMA_CM_EVENT_ESTABLISHED : RDMA_CM_EVENT_CONNECT_RESPONSE, 0);
  set_conn_pdata(e, r.private_data, cm::kRepPrivate);
  rdma_conn_param& p = e->ev.param.conn;
  p.responder_resources = d->responder_resources;
  p.initiator_depth = d->initiator_depth;
  p.flow_control = r.flow_control;
  p.rnr_retry_count = r.rnr_retry_count;
  p.srq = r.srq;
  p.qp_num = r.local_qpn;
  if (!d->id.qp) {
    d->st = St::kRepRcvd;
    post(d, e);
    return;
  }
  d->st = St::kEstablished;
  if (int err = connect_qp(d)) {
    qp_to_err(d);
    cm::Rej j;
    j.local_comm_id = d->local_comm_id;
    j.remote_comm_id = d->remote_comm_id;
    j.message_rejected = cm::kRejectedRep;
    j.reason = cm::kRejConsumer;
    uint8_t mad[cm::kMadSize];
    cm::encode(j, 0, mad);
    send_mad(d, mad);
    d->st = St::kRejected;
    e->ev.event = RDMA_CM_EVENT_CONNECT_ERROR;
    e->ev.status = -err;
    post(d, e);
    return;
  }
  send_rtu(d);
  post(d, e);
}

void on_message(Id* d, const cm::Msg& m) {
  CM_TRACE("id %llu got attr 0x%x in state %d", (unsigned long long)d->serial, unsigned(m.attr), int(d->st));
  switch (m.attr) {
    case cm::Attr::kRep:
      on_rep(d, m.rep);
      break;
    case cm::Attr::kRtu:
      if (d->st == St::kRepSent) {
        d->st = St::kEstablished;
        Event* e = new_event(d, RDMA_CM_EVENT_ESTABLISHED, 0);
        set_conn_pdata(e, m.rtu.private_data, 0);
        post(d, e);
      }
      break;
    case cm::Attr::kRej:
      if (d->st == St::kConnect || d->st == St::kRepSent || d->st == St::kRepRcvd) {
        cancel_timers(d);
        qp_to_err(d);
        d->st = St::kRejected;
        Event* e = new_event(d, RDMA_CM_EVENT_REJECTED, m.rej.reason);
        set_conn_pdata(e, m.rej.private_data, cm::kRejPrivate);
        post(d, e);
        unwatch_close(d->conn_fd);
      }
      break;
    case cm::Attr::kDreq: {
      cm::Drep r;
      r.local_comm_id = d->local_comm_id;
      r.remote_comm_id = d->remote_comm_id;
      uint8_t mad[cm::kMadSize];
      cm::encode(r, m.tid, mad);
      send_mad(d, mad);
      if (d->st == St::kEstablished || d->st == St::kDreqSent || d->st == St::kRepSent ||
          d->st == St::kRepRcvd)
        disconnected(d);
      break;
    }
    case cm::Attr::kDrep:
      if (d->st == St::kDreqSent) disconnected(d);
      break;
    case cm::Attr::kSidrRep: {
      if (d->st != St::kConnect || m.sidr_rep.request_id != d->local_comm_id) break;
      cancel_timers(d);
      const cm::SidrRep& r = m.sidr_rep;
      Event* e = new_event(d, RDMA_CM_EVENT_ESTABLISHED, 0);
      if (r.status != cm::kSidrOk) {
        // Linux reports a SIDR_REP that is not "QP valid" as UNREACHABLE.
        e->ev.event = RDMA_CM_EVENT_UNREACHABLE;
        e->ev.status = r.status == cm::kSidrNoService ? -ECONNREFUSED : r.status;
        d->st = St::kRejected;
      } else {
        d->st = St::kEstablished;
        d->peer_qpn = r.qpn;
        d->peer_qkey = r.qkey;
      }
      std::memcpy(e->pdata, r.private_data, cm::kSidrRepPrivate);
      rdma_ud_param& p = e->ev.param.ud;
      p.private_data = e->pdata;
      p.private_data_len = uint8_t(cm::kSidrRepPrivate);
      p.ah_attr.is_global = 1;
      p.ah_attr.grh.dgid = d->peer_gid;
      p.ah_attr.grh.sgid_index = uint8_t(d->sgid_index);
      p.ah_attr.grh.hop_limit = 64;
      p.ah_attr.grh.traffic_class = d->tos;
      p.ah_attr.port_num = 1;
      p.qp_num = r.qpn;
      p.qkey = r.qkey;
      post(d, e);
      unwatch_close(d->conn_fd);
      break;
    }
    default:
      break;
  }
}

// The peer's end of the connection closed: it called rdma_destroy_id or died.
void on_peer_gone(Id* d) {
  d->peer_gone = true;
  unwatch_close(d->conn_fd);
  switch (d->st) {
    case St::kEstablished:
    case St::kDreqSent:
      disconnected(d);
      break;
    case St::kConnect:
      cancel_timers(d);
      d->st = St::kRejected;
      // Through the gateway: the REQ went unanswered (Linux: -ETIMEDOUT).
      post(d, RDMA_CM_EVENT_UNREACHABLE, d->wire ? -ETIMEDOUT : -ECONNRESET);
      break;
    case St::kRepSent:
    case St::kRepRcvd:
      cancel_timers(d);
      d->st = St::kRejected;
      post(d, RDMA_CM_EVENT_CONNECT_ERROR, -ECONNRESET);
      break;
    default:
      break;  // a request not yet answered: rdma_accept will report it
  }
}

// IBV_EVENT_DEVICE_FATAL (softverbsd died): every id on the device gets
// DEVICE_REMOVAL, once, as rdma_cm reports a removed device.
void on_async() {
  ibv_async_event ev;
  while (ibv_get_async_event(g.watch_ctx, &ev) == 0) {
    bool fatal = ev.event_type == IBV_EVENT_DEVICE_FATAL;
    ibv_ack_async_event(&ev);
    if (!fatal || g.device_removed) continue;
    g.device_removed = true;
    for (auto& [serial, d] : g.ids)
      if (d->id.verbs) post(d, RDMA_CM_EVENT_DEVICE_REMOVAL, 0);
  }
}

void on_readable(int fd, FdRef ref) {
  if (ref.kind == FdKind::kAsync) {
    on_async();
    return;
  }
  if (ref.kind == FdKind::kWake) {
    uint64_t v;
    (void)!::read(fd, &v, sizeof(v));
    return;
  }
  if (ref.kind == FdKind::kBind) {
    if (Id* d = find(ref.serial)) on_accepted(d);
    return;
  }
  for (;;) {
    uint8_t buf[cm::kMadSize + 1];
    ssize_t n = ::recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
    if (ref.kind == FdKind::kPending) {
      cm::Msg m;
      if (n > 0 && cm::decode(buf, size_t(n), m) &&
          (m.attr == cm::Attr::kReq || m.attr == cm::Attr::kSidrReq)) {
        on_request(fd, ref.serial, m);
      } else {
        unwatch_close(fd);
      }
      return;
    }
    Id* d = find(ref.serial);
    if (!d) return;
    if (n <= 0) {
      on_peer_gone(d);
      return;
    }
    cm::Msg m;
    if (cm::decode(buf, size_t(n), m)) on_message(d, m);
    if (d->conn_fd != fd) return;  // closed by the message
  }
}

bool try_connect(Id* d);

void on_timer(const Timer& t) {
  Id* d = find(t.serial);
  if (!d || d->timer_gen != t.gen) return;
  switch (t.kind) {
    case TimerKind::kAddrError:
      if (d->st == St::kAddrQuery) {
        d->st = St::kIdle;
        post(d, RDMA_CM_EVENT_ADDR_ERROR, -ETIMEDOUT);
      }
      break;
    case TimerKind::kRepTimeout:
      if (d->st == St::kConnect) {
        d->st = St::kRejected;
        unwatch_close(d->conn_fd);
        post(d, RDMA_CM_EVENT_UNREACHABLE, -ETIMEDOUT);
      }
      break;
    case TimerKind::kTimewait:
      if (d->st == St::kDisconnected && d->had_qp) post(d, RDMA_CM_EVENT_TIMEWAIT_EXIT, 0);
      break;
    case TimerKind::kRetryConnect:
      if (d->st == St::kConnect && d->conn_fd < 0) try_connect(d);
      break;
  }
}

void engine_loop() {
  epoll_event evs[64];
  for (;;) {
    int timeout = -1;
    {
      std::lock_guard<std::mutex> lk(g.mu);
      if (!g.timers.empty()) {
        auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(g.timers.begin()->first - Clock::now())
                      .count();
        timeout = int(std::clamp<long long>(ms + 1, 0, 60000));
      }
    }
    int n = ::epoll_wait(g.ep, evs, 64, timeout);
    std::lock_guard<std::mutex> lk(g.mu);
    for (int i = 0; i < n; ++i) {
      auto it = g.fds.find(evs[i].data.fd);
      if (it != g.fds.end()) on_readable(evs[i].data.fd, it->second);
    }
    auto now = Clock::now();
    while (!g.timers.empty() && g.timers.begin()->first <= now) {
      Timer t = g.timers.begin()->second;
      g.timers.erase(g.timers.begin());
      on_timer(t);
    }
  }
}

// --- the active side ----------------------------------------------------------

// Connects d->conn_fd to the listener of the destination and sends the
// prepared REQ. A full backlog is retried every 5 ms until the deadline.
bool try_connect(Id* d) {
  if (d->wire) {
    // Another host: the daemon's CM gateway carries the MADs on the wire.
    sockaddr_un sun;
    int fd = -1;
    if (fill_sun(sun, daemon_dir() + "/cm-gateway")) {
      fd = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
      if (fd >= 0 && ::connect(fd, reinterpret_cast<sockaddr*>(&sun), sizeof(sun)) != 0) {
        CM_TRACE("id %llu gateway %s: %s", (unsigned long long)d->serial, sun.sun_path, std::strerror(errno));
        ::close(fd);
        fd = -1;
      }
    }
    if (fd < 0) {
      // No gateway: the daemon does not own the RoCEv2 port (SOFTVERBS_ROCE).
      d->st = St::kRejected;
      post(d, RDMA_CM_EVENT_UNREACHABLE, -ENETUNREACH);
      return false;
    }
    d->conn_fd = fd;
    watch(fd, FdKind::kConn, d->serial);
    send_mad(d, d->pending_req);
    add_timer(d, TimerKind::kRepTimeout, Clock::now() + kRepTimeout);
    return true;
  }
  const sockaddr* dst = &d->id.route.addr.dst_addr;
  uint16_t port = addr_port(dst);
  std::string cands[3] = {addr_text(dst), "", ""};
  if (dst->sa_family == AF_INET || addr_text(dst).find(':') == std::string::npos) {
    cands[1] = "0.0.0.0";
    cands[2] = "::";
  } else {
    cands[1] = "::";
  }
  int last = ENOENT;
  for (const std::string& c : cands) {
    if (c.empty()) continue;
    sockaddr_un sun;
    if (!fill_sun(sun, rendezvous_path(d->id.ps, port, c))) continue;
    int fd = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return false;
    int cr = ::connect(fd, reinterpret_cast<sockaddr*>(&sun), sizeof(sun));
    CM_TRACE("id %llu connect %s: %s", (unsigned long long)d->serial, sun.sun_path, cr ? std::strerror(errno) : "ok");
    if (cr == 0) {
      d->conn_fd = fd;
      watch(fd, FdKind::kConn, d->serial);
      send_mad(d, d->pending_req);
      add_timer(d, TimerKind::kRepTimeout, Clock::now() + kRepTimeout);
      return true;
    }
    last = errno;
    ::close(fd);
    if (last == EAGAIN) break;  // that listener exists, its backlog is full
  }
  if ((last == EAGAIN && Clock::now() < d->connect_deadline) || (last != EAGAIN && Clock::now() < d->no_listener_until)) {
    add_timer(d, TimerKind::kRetryConnect, Clock::now() + std::chrono::milliseconds(5));
    return true;
  }
  // Nobody listens on that port: the remote CM rejects the REQ (IBTA
  // 12.6.7.2: invalid service ID), which Linux reports as REJECTED.
  d->st = St::kRejected;
  if (d->id.qp_type == IBV_QPT_UD)
    post(d, RDMA_CM_EVENT_UNREACHABLE, -ECONNREFUSED);
  else
    post(d, RDMA_CM_EVENT_REJECTED, cm::kRejInvalidServiceId);
  return false;
}

// --- sync ids (created without a channel) -------------------------------------

Channel* new_channel() {
  int fd = ::eventfd(0, EFD_CLOEXEC | EFD_SEMAPHORE);
  if (fd < 0) return nullptr;
  auto* c = new Channel;
  c->ch.fd = fd;
  return c;
}

void move_events(Id* d, Channel* from, Channel* to) {
  if (from == to) return;
  for (auto it = from->q.begin(); it != from->q.end();) {
    if ((*it)->owner == d->serial && (*it)->listen_owner != d->serial) {
      to->q.push_back(*it);
      uint64_t one = 1;
      (void)!::write(to->ch.fd, &one, sizeof(one));
      it = from->q.erase(it);
    } else {
      ++it;
    }
  }
}

void make_sync(Id* d) {
  Channel* c = new_channel();
  if (!c) return;
  Channel* old = chan_of(d->id.channel);
  if (old) move_events(d, old, c);
  d->id.channel = &c->ch;
  d->own_channel = c;
  d->sync = true;
}

// librdmacm's ucma_complete: a sync id's call waits for its event.
int complete(Id* d) {
  if (!d->sync) return 0;
  if (d->id.event) {
    rdma_ack_cm_event(d->id.event);
    d->id.event = nullptr;
  }
  if (rdma_get_cm_event(d->id.channel, &d->id.event)) return -1;
  rdma_cm_event* e = d->id.event;
  if (e->status) {
    if (e->event == RDMA_CM_EVENT_REJECTED) return fail(ECONNREFUSED);
    return fail(e->status < 0 ? -e->status : e->status);
  }
  return 0;
}

bool has_local_device(Id* d) { return d->id.verbs != nullptr; }

}  // namespace

extern "C" {

rdma_event_channel* rdma_create_event_channel() {
  Channel* c = new_channel();
  if (!c) return nullptr;
  start_engine();
  return &c->ch;
}

void rdma_destroy_event_channel(rdma_event_channel* channel) {
  if (!channel) return;
  std::lock_guard<std::mutex> lk(g.mu);
  Channel* c = chan_of(channel);
  if (!channel_in_use(c)) {
    free_channel(c);
    return;
  }
  // Its ids must be destroyed first (rdma_destroy_event_channel(3)), but
  // programs get that wrong on error paths (perftest's, when a connection is
  // rejected) and then destroy the ids: their later events are dropped and
  // the memory stays until the last of them goes, instead of a use after free.
  for (Event* e : c->q) delete e;
  c->q.clear();
  ::close(c->ch.fd);
  c->ch.fd = -1;
  c->dead = true;
}

int rdma_create_id(rdma_event_channel* channel, rdma_cm_id** id, void* context, rdma_port_space ps) {
  if (!id) return fail(EINVAL);
  ibv_qp_type qpt;
  switch (ps) {
    case RDMA_PS_TCP:
    case RDMA_PS_IB:
      qpt = IBV_QPT_RC;
      break;
    case RDMA_PS_UDP:
    case RDMA_PS_IPOIB:
      qpt = IBV_QPT_UD;
      break;
    default:
      return fail(EINVAL);
  }
  if (!device()) return -1;  // librdmacm fails with ENODEV without a device
  start_engine();
  std::lock_guard<std::mutex> lk(g.mu);
  if (!g.watch_ctx && (g.watch_ctx = open_watch_context())) {
    int fd = g.watch_ctx->async_fd;
    ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
    watch(fd, FdKind::kAsync, 0);
  }
  Id* d = new_id(channel ? chan_of(channel) : nullptr, context, ps, qpt);
  if (!channel) {
    d->id.channel = nullptr;
    make_sync(d);
    if (!d->own_channel) {
      g.ids.erase(d->serial);
      delete d;
      return fail(ENOMEM);
    }
  }
  *id = &d->id;
  return 0;
}

int rdma_destroy_id(rdma_cm_id* id) {
  if (!id) return fail(EINVAL);
  Id* d = id_of(id);
  if (d->id.event) {
    rdma_ack_cm_event(d->id.event);
    d->id.event = nullptr;
  }
  std::lock_guard<std::mutex> lk(g.mu);
  destroy_locked(d);
  return 0;
}

int rdma_bind_addr(rdma_cm_id* id, sockaddr* addr) {
  if (!id || !addr || !addr_len(addr)) return fail(EINVAL);
  Id* d = id_of(id);
  std::lock_guard<std::mutex> lk(g.mu);
  if (d->bind_fd >= 0 || d->st != St::kIdle) return fail(EINVAL);
  if (!addr_is_any(addr) && !addr_is_local(addr)) return fail(EADDRNOTAVAIL);
  if (int e = do_bind(d, addr)) return fail(e);
  return 0;
}

int rdma_resolve_addr(rdma_cm_id* id, sockaddr* src_addr, sockaddr* dst_addr, int /*timeout_ms: no ARP to wait for*/) {
  if (!id || !dst_addr || !addr_len(dst_addr)) return fail(EINVAL);
  Id* d = id_of(id);
  {
    std::lock_guard<std::mutex> lk(g.mu);
    if (d->st != St::kIdle) return fail(EINVAL);
    if (d->bind_fd < 0) {
      sockaddr_storage src{};
      if (src_addr && addr_len(src_addr)) {
        std::memcpy(&src, src_addr, addr_len(src_addr));
      } else if (addr_is_local(dst_addr)) {
        // A local destination is reached from itself (as Linux picks the
        // source of a local route).
        std::memcpy(&src, dst_addr, addr_len(dst_addr));
        set_port(reinterpret_cast<sockaddr*>(&src), 0);
      } else {
        src.ss_family = dst_addr->sa_family;
      }
      auto* s = reinterpret_cast<sockaddr*>(&src);
      if (!addr_is_any(s) && !addr_is_local(s)) return fail(EADDRNOTAVAIL);
      if (int e = do_bind(d, s)) return fail(e);
    }
    std::memcpy(&d->id.route.addr.dst_storage, dst_addr, addr_len(dst_addr));
    if (addr_is_local(dst_addr)) {
      ibv_gid dgid{};
      gid_index_of(dst_addr, &dgid);
      d->peer_gid = dgid;
      d->id.route.addr.addr.ibaddr.dgid = dgid;
      if (addr_is_any(&d->id.route.addr.src_addr)) {
        // Bound to a wildcard: the source is the destination's own address.
        sockaddr_storage src{};
        std::memcpy(&src, dst_addr, addr_len(dst_addr));
        set_port(reinterpret_cast<sockaddr*>(&src), addr_port(&d->id.route.addr.src_addr));
        std::memcpy(&d->id.route.addr.src_storage, &src, sizeof(src));
        d->sgid_index = gid_index_of(dst_addr, &d->id.route.addr.addr.ibaddr.sgid);
        if (d->sgid_index < 0) d->sgid_index = 0;
      } else if (addr_is_loopback(&d->id.route.addr.src_addr)) {
        // Bound to loopback, which gave no device (do_bind): GID index 0.
        d->sgid_index = gid_index_of(&d->id.route.addr.src_addr, &d->id.route.addr.addr.ibaddr.sgid);
        if (d->sgid_index < 0) d->sgid_index = 0;
      }
      d->id.verbs = device();
      d->id.pd = default_pd();
      d->id.port_num = 1;
      d->st = St::kAddrResolved;
      post(d, RDMA_CM_EVENT_ADDR_RESOLVED, 0);
    } else {
      // Another host (RoCEv2): the routing table picks the source address,
      // as Linux's rdma_resolve_addr does; the destination's GID is its IP
      // address (Annex A17.8); no ARP is needed on a UDP socket. Whether
      // anybody answers there shows at rdma_connect (UNREACHABLE).
      sockaddr_storage src{};
      int e = 0;
      if (addr_is_any(&d->id.route.addr.src_addr)) {
        e = route_source(dst_addr, &src);
        set_port(reinterpret_cast<sockaddr*>(&src), addr_port(&d->id.route.addr.src_addr));
      } else {
        std::memcpy(&src, &d->id.route.addr.src_storage, sizeof(src));
      }
      ibv_gid sgid{};
      int idx = e ? -1 : gid_index_of(reinterpret_cast<sockaddr*>(&src), &sgid);
      if (idx < 0 || addr_is_loopback(reinterpret_cast<sockaddr*>(&src))) {
        // No route, or the source is not one of the device's RoCE GIDs.
        d->st = St::kIdle;
        post(d, RDMA_CM_EVENT_ADDR_ERROR, -(e ? e : EADDRNOTAVAIL));
      } else {
        std::memcpy(&d->id.route.addr.src_storage, &src, sizeof(src));
        d->sgid_index = idx;
        d->id.route.addr.addr.ibaddr.sgid = sgid;
        d->peer_gid = gid_of_addr(dst_addr);
        d->id.route.addr.addr.ibaddr.dgid = d->peer_gid;
        d->wire = true;
        d->path_mtu = uint8_t(wire_mtu_of(reinterpret_cast<sockaddr*>(&src)));
        d->id.verbs = device();
        d->id.pd = default_pd();
        d->id.port_num = 1;
        d->st = St::kAddrResolved;
        post(d, RDMA_CM_EVENT_ADDR_RESOLVED, 0);
      }
    }
  }
  return complete(d);
}

int rdma_resolve_route(rdma_cm_id* id, int) {
  if (!id) return fail(EINVAL);
  Id* d = id_of(id);
  {
    std::lock_guard<std::mutex> lk(g.mu);
    if (d->st != St::kAddrResolved) return fail(EINVAL);
    fill_path_rec(d);
    d->st = St::kRouteResolved;
    post(d, RDMA_CM_EVENT_ROUTE_RESOLVED, 0);
  }
  return complete(d);
}

int rdma_init_qp_attr(rdma_cm_id* id, ibv_qp_attr* qp_attr, int* qp_attr_mask) {
  if (!id || !qp_attr || !qp_attr_mask) return fail(EINVAL);
  std::lock_guard<std::mutex> lk(g.mu);
  if (int e = init_qp_attr(id_of(id), qp_attr, qp_attr_mask)) return fail(e);
  return 0;
}

int rdma_create_qp_ex(rdma_cm_id* id, ibv_qp_init_attr_ex* attr) {
  if (!id || !attr) return fail(EINVAL);
  Id* d = id_of(id);
  if (!has_local_device(d)) return fail(EINVAL);
  if (d->id.qp) return fail(EINVAL);
  if (!(attr->comp_mask & IBV_QP_INIT_ATTR_PD) || !attr->pd) {
    attr->comp_mask |= IBV_QP_INIT_ATTR_PD;
    attr->pd = d->id.pd ? d->id.pd : default_pd();
  }
  if (!attr->pd) return -1;
  if (attr->pd->context != d->id.verbs) return fail(EINVAL);
  bool made_send = false, made_recv = false;
  // librdmacm's ucma_create_cqs: a CQ and a channel for each queue the
  // caller left without one (rdma_verbs.h's helpers wait on them).
  auto make_cq = [&](ibv_comp_channel** ch, ibv_cq** cq, uint32_t n) {
    *ch = ibv_create_comp_channel(d->id.verbs);
    if (!*ch) return false;
    *cq = ibv_create_cq(d->id.verbs, int(std::max<uint32_t>(n, 1)), d, *ch, 0);
    if (!*cq) {
      ibv_destroy_comp_channel(*ch);
      *ch = nullptr;
      return false;
    }
    return true;
  };
  if (!attr->recv_cq && !attr->srq) {
    if (!make_cq(&d->id.recv_cq_channel, &d->id.recv_cq, attr->cap.max_recv_wr)) return -1;
    attr->recv_cq = d->id.recv_cq;
    made_recv = true;
  } else if (!attr->recv_cq && attr->srq) {
    if (!make_cq(&d->id.recv_cq_channel, &d->id.recv_cq, attr->cap.max_recv_wr)) return -1;
    attr->recv_cq = d->id.recv_cq;
    made_recv = true;
  }
  if (!attr->send_cq) {
    if (!make_cq(&d->id.send_cq_channel, &d->id.send_cq, attr->cap.max_send_wr)) {
      if (made_recv) {
        ibv_destroy_cq(d->id.recv_cq);
        ibv_destroy_comp_channel(d->id.recv_cq_channel);
        d->id.recv_cq = nullptr;
        d->id.recv_cq_channel = nullptr;
      }
      return -1;
    }
    attr->send_cq = d->id.send_cq;
    made_send = true;
  }
  auto undo_cqs = [&] {
    if (made_send) {
      ibv_destroy_cq(d->id.send_cq);
      ibv_destroy_comp_channel(d->id.send_cq_channel);
      d->id.send_cq = nullptr;
      d->id.send_cq_channel = nullptr;
    }
    if (made_recv) {
      ibv_destroy_cq(d->id.recv_cq);
      ibv_destroy_comp_channel(d->id.recv_cq_channel);
      d->id.recv_cq = nullptr;
      d->id.recv_cq_channel = nullptr;
    }
  };
  if (!attr->srq && d->id.srq) attr->srq = d->id.srq;
  ibv_qp* qp = ibv_create_qp_ex(d->id.verbs, attr);
  if (!qp) {
    int e = errno;
    undo_cqs();
    return fail(e);
  }
  std::lock_guard<std::mutex> lk(g.mu);
  d->id.qp = qp;
  d->id.pd = attr->pd;
  d->had_qp = true;
  d->created_cqs = made_send || made_recv;
  int e = modify_to(d, IBV_QPS_INIT);
  if (!e && d->id.qp_type == IBV_QPT_UD) {
    // A UD QP is ready to send at once (librdmacm's ucma_init_ud_qp).
    e = modify_to(d, IBV_QPS_RTR);
    if (!e) e = modify_to(d, IBV_QPS_RTS);
  }
  if (e) {
    ibv_destroy_qp(qp);
    d->id.qp = nullptr;
    undo_cqs();
    return fail(e);
  }
  return 0;
}

int rdma_create_qp(rdma_cm_id* id, ibv_pd* pd, ibv_qp_init_attr* qp_init_attr) {
  if (!id || !qp_init_attr) return fail(EINVAL);
  ibv_qp_init_attr_ex ex{};
  std::memcpy(&ex, qp_init_attr, sizeof(*qp_init_attr));
  ex.comp_mask = IBV_QP_INIT_ATTR_PD;
  ex.pd = pd ? pd : (id->pd ? id->pd : default_pd());
  int r = rdma_create_qp_ex(id, &ex);
  if (r == 0) {
    qp_init_attr->send_cq = ex.send_cq;
    qp_init_attr->recv_cq = ex.recv_cq;
    qp_init_attr->srq = ex.srq;
    qp_init_attr->cap = ex.cap;
  }
  return r;
}

void rdma_destroy_qp(rdma_cm_id* id) {
  if (!id || !id->qp) return;
  ibv_qp* qp;
  {
    std::lock_guard<std::mutex> lk(g.mu);  // the engine moves id->qp on a REP
    qp = id->qp;
    id->qp = nullptr;
  }
  ibv_destroy_qp(qp);
  Id* d = id_of(id);
  if (d->created_cqs) {
    if (id->send_cq) ibv_destroy_cq(id->send_cq);
    if (id->send_cq_channel) ibv_destroy_comp_channel(id->send_cq_channel);
    if (id->recv_cq) ibv_destroy_cq(id->recv_cq);
    if (id->recv_cq_channel) ibv_destroy_comp_channel(id->recv_cq_channel);
    id->send_cq = id->recv_cq = nullptr;
    id->send_cq_channel = id->recv_cq_channel = nullptr;
    d->created_cqs = false;
  }
}

int rdma_connect(rdma_cm_id* id, rdma_conn_param* param) {
  if (!id) return fail(EINVAL);
  Id* d = id_of(id);
  {
    std::lock_guard<std::mutex> lk(g.mu);
    if (d->st != St::kRouteResolved) return fail(EINVAL);
    bool ud = d->id.qp_type == IBV_QPT_UD;
    size_t max_pd = (ud ? cm::kSidrReqPrivate : cm::kReqPrivate) - cm::kIpHeader;
    if (param && param->private_data_len > max_pd) return fail(EINVAL);
    if (!ud && !d->id.qp && !param) return fail(EINVAL);
    ibv_device_attr da{};
    ibv_query_device(d->id.verbs, &da);
    // rdma_connect(3): RDMA_MAX_INIT_DEPTH / RDMA_MAX_RESP_RES mean "as the
    // device allows"; more than the device allows is refused.
    uint8_t dev_init = uint8_t(std::min(da.max_qp_init_rd_atom, 255));
    uint8_t dev_resp = uint8_t(std::min(da.max_qp_rd_atom, 255));
    if (!ud && param) {
      if (param->initiator_depth != RDMA_MAX_INIT_DEPTH && param->initiator_depth > dev_init) return fail(EINVAL);
      if (param->responder_resources != RDMA_MAX_RESP_RES && param->responder_resources > dev_resp)
        return fail(EINVAL);
    }
    d->initiator_depth = param && param->initiator_depth != RDMA_MAX_INIT_DEPTH ? param->initiator_depth : dev_init;
    d->responder_resources =
        param && param->responder_resources != RDMA_MAX_RESP_RES ? param->responder_resources : dev_resp;
    d->retry_count = param ? std::min<uint8_t>(param->retry_count, 7) : 7;
    d->rnr_retry_count = param ? std::min<uint8_t>(param->rnr_retry_count, 7) : 7;
    d->local_comm_id = random32();
    d->my_psn = random32() & 0xffffff;
    cm::IpHeader ip;
    std::memcpy(&ip.src, &d->id.route.addr.src_storage, sizeof(ip.src));
    std::memcpy(&ip.dst, &d->id.route.addr.dst_storage, sizeof(ip.dst));
    uint16_t port = addr_port(&d->id.route.addr.dst_addr);
    if (ud) {
      cm::SidrReq r;
      r.request_id = d->local_comm_id;
      r.pkey = 0xffff;
      r.service_id = cm::service_id(d->id.ps, port);
      cm::encode_ip_header(ip, r.private_data);
      if (param && param->private_data && param->private_data_len)
        std::memcpy(r.private_data + cm::kIpHeader, param->private_data, param->private_data_len);
      cm::encode(r, d->local_comm_id, d->pending_req);
    } else {
      cm::Req r;
      r.local_comm_id = d->local_comm_id;
      r.service_id = cm::service_id(d->id.ps, port);
      ibv_device_attr a{};
      ibv_query_device(d->id.verbs, &a);
      r.local_ca_guid = be64toh(a.node_guid);
      r.local_qpn = d->id.qp ? d->id.qp->qp_num : (param ? param->qp_num : 0);
      r.responder_resources = d->responder_resources;
      r.initiator_depth = d->initiator_depth;
      r.remote_cm_response_timeout = kCmResponseTimeout;
      r.transport_type = d->id.qp_type == IBV_QPT_UC ? 1 : 0;
      r.flow_control = param ? param->flow_control : true;
      r.starting_psn = d->my_psn;
      r.local_cm_response_timeout = kCmResponseTimeout;
      r.retry_count = d->retry_count;
      r.pkey = 0xffff;
      r.path_mtu = d->path_mtu ? d->path_mtu : uint8_t(IBV_MTU_4096);
      r.rnr_retry_count = d->rnr_retry_count;
      r.max_cm_retries = kMaxCmRetries;
      r.srq = d->id.qp ? d->id.qp->srq != nullptr : (param && param->srq);
      std::memcpy(r.local_gid, d->id.route.addr.addr.ibaddr.sgid.raw, 16);
      std::memcpy(r.remote_gid, d->peer_gid.raw, 16);
      r.traffic_class = d->tos;
      r.hop_limit = 64;
      r.local_ack_timeout = d->ack_timeout;
      cm::encode_ip_header(ip, r.private_data);
      if (param && param->private_data && param->private_data_len)
        std::memcpy(r.private_data + cm::kIpHeader, param->private_data, param->private_data_len);
      cm::encode(r, d->local_comm_id, d->pending_req);
    }
    d->st = St::kConnect;
    d->connect_deadline = Clock::now() + kRepTimeout;
    d->no_listener_until = Clock::now() + kNoListenerGrace;
    try_connect(d);
  }
  return complete(d);
}

int rdma_listen(rdma_cm_id* id, int backlog) {
  if (!id) return fail(EINVAL);
  Id* d = id_of(id);
  std::lock_guard<std::mutex> lk(g.mu);
  if (d->st == St::kListen) {
    d->backlog = backlog > 0 ? backlog : 1024;
    return 0;
  }
  if (d->st != St::kIdle) return fail(EINVAL);
  if (d->bind_fd < 0) {
    sockaddr_in any{};
    any.sin_family = AF_INET;
    if (int e = do_bind(d, reinterpret_cast<sockaddr*>(&any))) return fail(e);
  }
  d->backlog = backlog > 0 ? backlog : 1024;
  ::listen(d->bind_fd, std::max(d->backlog, SOMAXCONN));
  d->st = St::kListen;
  return 0;
}

int rdma_get_request(rdma_cm_id* listen, rdma_cm_id** id) {
  if (!listen || !id) return fail(EINVAL);
  Id* l = id_of(listen);
  if (!l->sync) return fail(EINVAL);
  if (listen->event) {
    rdma_ack_cm_event(listen->event);
    listen->event = nullptr;
  }
  rdma_cm_event* e = nullptr;
  if (rdma_get_cm_event(listen->channel, &e)) return -1;
  if (e->status || e->event != RDMA_CM_EVENT_CONNECT_REQUEST) {
    int err = e->status ? (e->status < 0 ? -e->status : e->status) : EINVAL;
    listen->event = e;
    return fail(err);
  }
  if (l->ep_qp_attr) {
    ibv_qp_init_attr a = *l->ep_qp_attr;
    if (rdma_create_qp(e->id, listen->pd, &a)) {
      listen->event = e;
      return -1;
    }
  }
  *id = e->id;
  (*id)->event = e;
  return 0;
}

int rdma_accept(rdma_cm_id* id, rdma_conn_param* param) {
  if (!id) return fail(EINVAL);
  Id* d = id_of(id);
  bool ud;
  {
    std::lock_guard<std::mutex> lk(g.mu);
    if (d->st != St::kReqRcvd) return fail(EINVAL);
    ud = d->id.qp_type == IBV_QPT_UD;
    size_t max_pd = ud ? cm::kSidrRepPrivate : cm::kRepPrivate;
    if (param && param->private_data_len > max_pd) return fail(EINVAL);
    if (!d->id.qp && !param) return fail(EINVAL);
    ibv_device_attr da{};
    ibv_query_device(d->id.verbs, &da);
    if (!param || param->initiator_depth == RDMA_MAX_INIT_DEPTH)
      d->initiator_depth = uint8_t(std::min<int>(d->initiator_depth, da.max_qp_init_rd_atom));
    else
      d->initiator_depth = param->initiator_depth;
    if (!param || param->responder_resources == RDMA_MAX_RESP_RES)
      d->responder_resources = uint8_t(std::min<int>(d->responder_resources, da.max_qp_rd_atom));
    else
      d->responder_resources = param->responder_resources;
    uint32_t qpn = d->id.qp ? d->id.qp->qp_num : param->qp_num;
    uint8_t mad[cm::kMadSize];
    if (ud) {
      cm::SidrRep r;
      r.request_id = d->remote_comm_id;
      r.status = cm::kSidrOk;
      r.qpn = qpn;
      r.service_id = cm::service_id(d->id.ps, addr_port(&d->id.route.addr.src_addr));
      r.qkey = RDMA_UDP_QKEY;
      if (param && param->private_data && param->private_data_len) std::memcpy(r.private_data, param->private_data, param->private_data_len);
      cm::encode(r, 0, mad);
      d->st = St::kEstablished;
      if (!send_mad(d, mad)) return fail(ECONNRESET);
    } else {
      // The QP is ready before the REP leaves, so the active side's first
      // SEND finds the receives posted before accept (seed 001's race).
      d->st = St::kRepSent;
      if (int e = connect_qp(d)) {
        d->st = St::kReqRcvd;
        qp_to_err(d);
        return fail(e);
      }
      cm::Rep r;
      r.local_comm_id = d->local_comm_id;
      r.remote_comm_id = d->remote_comm_id;
      r.local_qkey = 0;
      r.local_qpn = qpn;
      r.starting_psn = d->my_psn;
      r.responder_resources = d->responder_resources;
      r.initiator_depth = d->initiator_depth;
      r.target_ack_delay = 0;
      r.flow_control = param ? param->flow_control : true;
      // IBTA 12.7.35: the REP's RNR retry count is for the active side's QP.
      r.rnr_retry_count = param ? std::min<uint8_t>(param->rnr_retry_count, 7) : 7;
      r.srq = d->id.qp ? d->id.qp->srq != nullptr : param->srq;
      ibv_device_attr a{};
      ibv_query_device(d->id.verbs, &a);
      r.local_ca_guid = be64toh(a.node_guid);
      if (param && param->private_data && param->private_data_len) std::memcpy(r.private_data, param->private_data, param->private_data_len);
      cm::encode(r, 0, mad);
      if (d->peer_gone || !send_mad(d, mad)) {
        qp_to_err(d);
        d->st = St::kRejected;
        post(d, RDMA_CM_EVENT_CONNECT_ERROR, -ECONNRESET);
      }
    }
  }
  if (ud) {
    if (d->sync && d->id.event) {
      rdma_ack_cm_event(d->id.event);
      d->id.event = nullptr;
    }
    return 0;
  }
  return complete(d);
}

int rdma_reject(rdma_cm_id* id, const void* private_data, uint8_t private_data_len) {
  if (!id) return fail(EINVAL);
  Id* d = id_of(id);
  std::lock_guard<std::mutex> lk(g.mu);
  if (d->st != St::kReqRcvd && d->st != St::kRepRcvd) return fail(EINVAL);
  uint8_t mad[cm::kMadSize];
  if (d->id.qp_type == IBV_QPT_UD) {
    if (private_data_len > cm::kSidrRepPrivate) return fail(EINVAL);
    cm::SidrRep r;
    r.request_id = d->remote_comm_id;
    r.status = cm::kSidrRejected;
    if (private_data && private_data_len) std::memcpy(r.private_data, private_data, private_data_len);
    cm::encode(r, 0, mad);
  } else {
    if (private_data_len > cm::kRejPrivate) return fail(EINVAL);
    cm::Rej r;
    r.local_comm_id = d->local_comm_id;
    r.remote_comm_id = d->remote_comm_id;
    r.message_rejected = d->st == St::kReqRcvd ? cm::kRejectedReq : cm::kRejectedRep;
    r.reason = cm::kRejConsumer;
    if (private_data && private_data_len) std::memcpy(r.private_data, private_data, private_data_len);
    cm::encode(r, 0, mad);
  }
  send_mad(d, mad);
  d->st = St::kRejected;
  unwatch_close(d->conn_fd);
  return 0;
}

int rdma_reject_ece(rdma_cm_id* id, const void* private_data, uint8_t private_data_len) {
  return rdma_reject(id, private_data, private_data_len);
}

int rdma_establish(rdma_cm_id* id) {
  if (!id) return fail(EINVAL);
  Id* d = id_of(id);
  std::lock_guard<std::mutex> lk(g.mu);
  if (d->st != St::kRepRcvd) return fail(EINVAL);
  if (d->id.qp) {
    if (int e = connect_qp(d)) return fail(e);
  }
  send_rtu(d);
  d->st = St::kEstablished;
  return 0;
}

int rdma_disconnect(rdma_cm_id* id) {
  if (!id) return fail(EINVAL);
  Id* d = id_of(id);
  std::lock_guard<std::mutex> lk(g.mu);
  if (!d->id.verbs) return fail(EINVAL);
  qp_to_err(d);  // librdmacm's ucma_shutdown on an IB-transport device
  switch (d->st) {
    case St::kEstablished:
    case St::kRepSent:
    case St::kRepRcvd: {
      if (d->id.qp_type == IBV_QPT_UD) return fail(EINVAL);
      if (d->peer_gone || d->conn_fd < 0) {
        disconnected(d);
        return 0;
      }
      cm::Dreq r;
      r.local_comm_id = d->local_comm_id;
      r.remote_comm_id = d->remote_comm_id;
      r.remote_qpn = d->peer_qpn;
      uint8_t mad[cm::kMadSize];
      cm::encode(r, 0, mad);
      d->st = St::kDreqSent;
      if (!send_mad(d, mad)) disconnected(d);
      return 0;
    }
    case St::kDreqSent:
    case St::kDisconnected:
      return 0;  // the DREP was already sent when the DREQ arrived
    default:
      return fail(EINVAL);
  }
}

int rdma_get_cm_event(rdma_event_channel* channel, rdma_cm_event** event) {
  if (!channel || !event) return fail(EINVAL);
  Channel* c = chan_of(channel);
  for (;;) {
    uint64_t v;
    ssize_t n = ::read(c->ch.fd, &v, sizeof(v));  // blocks unless the app made the fd O_NONBLOCK
    if (n < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    std::lock_guard<std::mutex> lk(g.mu);
    if (c->q.empty()) continue;  // an event dropped with its id
    Event* e = c->q.front();
    c->q.pop_front();
    *event = &e->ev;
    return 0;
  }
}

int rdma_ack_cm_event(rdma_cm_event* event) {
  if (!event) return fail(EINVAL);
  delete reinterpret_cast<Event*>(event);
  return 0;
}

__be16 rdma_get_src_port(rdma_cm_id* id) {
  return id ? htons(addr_port(&id->route.addr.src_addr)) : 0;
}

__be16 rdma_get_dst_port(rdma_cm_id* id) {
  return id ? htons(addr_port(&id->route.addr.dst_addr)) : 0;
}

int rdma_set_option(rdma_cm_id* id, int level, int optname, void* optval, size_t optlen) {
  if (!id || !optval) return fail(EINVAL);
  Id* d = id_of(id);
  std::lock_guard<std::mutex> lk(g.mu);
  if (level == RDMA_OPTION_ID) {
    switch (optname) {
      case RDMA_OPTION_ID_TOS:
        if (optlen != sizeof(uint8_t)) return fail(EINVAL);
        d->tos = *static_cast<uint8_t*>(optval);
        return 0;
      case RDMA_OPTION_ID_REUSEADDR:
        if (optlen != sizeof(int)) return fail(EINVAL);
        d->reuseaddr = *static_cast<int*>(optval) != 0;
        return 0;
      case RDMA_OPTION_ID_AFONLY:
        if (optlen != sizeof(int)) return fail(EINVAL);
        d->afonly = *static_cast<int*>(optval) != 0;
        return 0;
      case RDMA_OPTION_ID_ACK_TIMEOUT:
        if (optlen != sizeof(uint8_t)) return fail(EINVAL);
        d->ack_timeout = std::min<uint8_t>(*static_cast<uint8_t*>(optval), 31);
        d->ack_timeout_set = true;
        return 0;
      default:
        return fail(ENOSYS);
    }
  }
  if (level == RDMA_OPTION_IB && optname == RDMA_OPTION_IB_PATH) {
    // A path record set by the application: on one host there is one path.
    return optlen % sizeof(ibv_path_data) == 0 && optlen ? 0 : fail(EINVAL);
  }
  return fail(ENOSYS);
}

int rdma_migrate_id(rdma_cm_id* id, rdma_event_channel* channel) {
  if (!id) return fail(EINVAL);
  Id* d = id_of(id);
  std::lock_guard<std::mutex> lk(g.mu);
  Channel* old = chan_of(d->id.channel);
  Channel* old_own = d->own_channel;
  if (!channel) {
    d->own_channel = nullptr;
    make_sync(d);
    if (!d->own_channel) {
      d->own_channel = old_own;
      return fail(ENOMEM);
    }
  } else {
    move_events(d, old, chan_of(channel));
    d->id.channel = channel;
    d->own_channel = nullptr;
    d->sync = false;
  }
  if (old_own) free_channel(old_own);
  else if (old) free_if_dead(&old->ch);
  return 0;
}

int rdma_notify(rdma_cm_id* id, ibv_event_type) {
  if (!id) return fail(EINVAL);
  // The CM learns of a QP's first receive from the RTU already (IBTA
  // 12.9.7.2's communication-established event is for a lost RTU).
  return 0;
}

int rdma_create_ep(rdma_cm_id** id, rdma_addrinfo* res, ibv_pd* pd, ibv_qp_init_attr* qp_init_attr) {
  if (!id || !res) return fail(EINVAL);
  rdma_cm_id* cid = nullptr;
  if (rdma_create_id(nullptr, &cid, nullptr, rdma_port_space(res->ai_port_space))) return -1;
  Id* d = id_of(cid);
  if (res->ai_qp_type) cid->qp_type = ibv_qp_type(res->ai_qp_type);
  auto undo = [&] {
    int e = errno;
    rdma_destroy_id(cid);
    errno = e;
    return -1;
  };
  if (res->ai_flags & RAI_PASSIVE) {
    if (rdma_bind_addr(cid, res->ai_src_addr)) return undo();
    if (pd) cid->pd = pd;
    if (qp_init_attr) {
      d->ep_qp_attr = new ibv_qp_init_attr(*qp_init_attr);
      d->ep_qp_attr->qp_type = cid->qp_type;  // librdmacm: the endpoint's type, from rdma_getaddrinfo
    }
    *id = cid;
    return 0;
  }
  if (rdma_resolve_addr(cid, res->ai_src_addr, res->ai_dst_addr, 2000)) return undo();
  if (rdma_resolve_route(cid, 2000)) return undo();
  if (pd) cid->pd = pd;
  if (qp_init_attr) {
    qp_init_attr->qp_type = cid->qp_type;
    if (rdma_create_qp(cid, pd, qp_init_attr)) return undo();
  }
  *id = cid;
  return 0;
}

void rdma_destroy_ep(rdma_cm_id* id) {
  if (!id) return;
  if (id->qp) rdma_destroy_qp(id);
  if (id->srq) {
    ibv_destroy_srq(id->srq);
    id->srq = nullptr;
  }
  rdma_destroy_id(id);
}

int rdma_create_srq_ex(rdma_cm_id* id, ibv_srq_init_attr_ex* attr) {
  if (!id || !attr) return fail(EINVAL);
  if (attr->srq_type != IBV_SRQT_BASIC) return fail(EOPNOTSUPP);
  ibv_srq_init_attr a{};
  a.srq_context = attr->srq_context;
  a.attr = attr->attr;
  ibv_pd* pd = (attr->comp_mask & IBV_SRQ_INIT_ATTR_PD) && attr->pd ? attr->pd : (id->pd ? id->pd : default_pd());
  if (!pd) return -1;
  ibv_srq* srq = ibv_create_srq(pd, &a);
  if (!srq) return -1;
  attr->attr = a.attr;
  id->srq = srq;
  return 0;
}

int rdma_create_srq(rdma_cm_id* id, ibv_pd* pd, ibv_srq_init_attr* attr) {
  if (!id || !attr) return fail(EINVAL);
  ibv_srq_init_attr_ex ex{};
  ex.srq_context = attr->srq_context;
  ex.attr = attr->attr;
  ex.srq_type = IBV_SRQT_BASIC;
  if (pd) {
    ex.comp_mask = IBV_SRQ_INIT_ATTR_PD;
    ex.pd = pd;
  }
  int r = rdma_create_srq_ex(id, &ex);
  if (!r) attr->attr = ex.attr;
  return r;
}

void rdma_destroy_srq(rdma_cm_id* id) {
  if (!id || !id->srq) return;
  ibv_destroy_srq(id->srq);
  id->srq = nullptr;
}

// Multicast needs the fabric's multicast groups, which softverbs has not yet.
int rdma_join_multicast(rdma_cm_id*, sockaddr*, void*) { return fail(ENOSYS); }
int rdma_join_multicast_ex(rdma_cm_id*, rdma_cm_join_mc_attr_ex*, void*) { return fail(ENOSYS); }
int rdma_leave_multicast(rdma_cm_id*, sockaddr*) { return fail(EADDRNOTAVAIL); }

// Enhanced connection establishment (vendor options): not offered.
int rdma_set_local_ece(rdma_cm_id*, ibv_ece*) { return fail(EOPNOTSUPP); }
int rdma_get_remote_ece(rdma_cm_id*, ibv_ece*) { return fail(EOPNOTSUPP); }

}  // extern "C"
