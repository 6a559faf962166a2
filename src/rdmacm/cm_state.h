// cm_state.h: the drop-in librdmacm's internals, shared by its parts:
//   cm_state.cc      the CM state machine of an id (IBTA 12.9): requests,
//                    replies, disconnection, QP transitions, teardown, sync ids;
//   cm_engine.cc     the engine thread (epoll on the sockets, timers) and the
//                    event queues of the channels;
//   cm_rendezvous.cc the unix-socket rendezvous between processes of one host
//                    (and the daemon's CM gateway for other hosts);
//   cm_multicast.cc  multicast groups: joins, leaves, their events;
//   cma.cc           the public API (rdma_* functions).
//
// Rendezvous: every bound id owns a listening unix SOCK_SEQPACKET socket at
// $RUNTIME/cm/<port space>-<port>-<address>; an active id connects to the
// socket of (its destination, port) or of the wildcard address, and the
// connection then carries the IB CM's MADs (cm_msg.h): REQ/REP/RTU/REJ/
// DREQ/DREP for connected ids, SIDR_REQ/SIDR_REP for UD ids. The socket's
// end is the peer's death: a connected id sees DISCONNECTED.
//
// Threads: one engine thread per process (epoll on the sockets, timers)
// turns messages into events. All state is under one mutex `g.mu`; every
// function declared here expects it held (start_engine aside). The engine
// never calls back into the application. rdma_get_cm_event blocks in
// read(2) on the channel's eventfd (a semaphore: one count per queued
// event), never under the mutex.
#pragma once

#include <rdma/rdma_cma.h>

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "rdmacm/cm_msg.h"

namespace sv::rdmacm::detail {

namespace cm = sv::cm;

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
// A REQ for an id that is bound but not listening yet (hold_request): its
// program is about to listen (it sent its port out of band first), and a
// loaded machine may keep it from doing so for far longer than 50 ms (the
// first run of compat.qperf.rc_rdma_write_lat.cm1 failed once with two
// builds beside it). Still well within the REQ's response timeout: librdmacm
// asks for 4.096 us * 2^20, about 4.3 s (CMA_CM_RESPONSE_TIMEOUT, IBTA
// 12.6.5), and a REQ to an id that never listens is still rejected.
constexpr auto kBoundNotListeningGrace = std::chrono::seconds(2);
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
  uint64_t mc = 0;            // the Mcast serial of a MULTICAST_JOIN / _ERROR
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

enum class TimerKind { kAddrError, kRepTimeout, kTimewait, kRetryConnect, kHeldReq };

// A multicast group joined by an id (cm_multicast.cc), until it leaves.
struct Mcast {
  uint64_t serial = 0;
  sockaddr_storage addr{};
  ibv_gid mgid{};
  int join_flags = RDMA_MC_JOIN_FLAG_FULLMEMBER;
  void* context = nullptr;
  ibv_qp* attached = nullptr;  // the id's QP, attached to the group at the join
};

struct Id {
  rdma_cm_id id{};  // first: the application holds &id
  uint64_t serial = 0;
  St st = St::kIdle;
  bool sync = false;  // created without a channel: calls wait for their events
  Channel* own_channel = nullptr;  // the private channel of a sync id
  int bind_fd = -1;
  std::string bind_path;
  bool daemon_port = false;  // held through the system daemon (release_bind gives it back)
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
  ibv_ece local_ece{};  // rdma_set_local_ece: kept, not sent (see cma.cc)
  bool created_cqs = false;
  // rdma_connect's REQ is built at once but sent when the connect succeeds
  // (a full listen backlog is retried).
  uint8_t pending_req[cm::kMadSize] = {};
  Clock::time_point connect_deadline{};
  Clock::time_point no_listener_until{};  // kNoListenerGrace after rdma_connect
  // REQs that reached this id bound but not yet listening: held for
  // kNoListenerGrace, for the rdma_listen that the program is about to
  // call (see hold_request in cm_state.cc).
  struct HeldReq {
    int fd;
    cm::Msg m;
    Clock::time_point until;
  };
  std::vector<HeldReq> held;
  std::vector<Mcast> mcs;  // joined groups (rdma_join_multicast), in join order
  // rdma_resolve_addrinfo: from the call until rdma_query_addrinfo takes
  // the result (or ADDRINFO_ERROR says there is none); the result, owned.
  bool resolving_ai = false;
  rdma_addrinfo* resolved_ai = nullptr;
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
extern Global& g;  // never destroyed: the engine thread outlives static destructors

inline Id* id_of(rdma_cm_id* id) { return reinterpret_cast<Id*>(id); }
inline Channel* chan_of(rdma_event_channel* c) { return reinterpret_cast<Channel*>(c); }
inline Id* find(uint64_t serial) {
  auto it = g.ids.find(serial);
  return it == g.ids.end() ? nullptr : it->second;
}
uint32_t random32();

// --- events and the engine (cm_engine.cc) ------------------------------------
Event* new_event(Id* d, rdma_cm_event_type type, int status);
void post(Id* d, Event* e);
void post(Id* d, rdma_cm_event_type type, int status);
void set_conn_pdata(Event* e, const void* p, size_t n);
void start_engine();  // once per process; takes g.mu itself
void watch(int fd, FdKind kind, uint64_t serial);
void unwatch_close(int& fd);
void add_timer(Id* d, TimerKind kind, Clock::time_point when);
void cancel_timers(Id* d);
bool send_mad(Id* d, const uint8_t* mad);

// --- the rendezvous (cm_rendezvous.cc) ---------------------------------------
std::string daemon_dir();
std::string rendezvous_path(int ps, uint16_t port, const std::string& addr);
bool path_exists(const std::string& p);
int do_bind(Id* d, const sockaddr* addr);
// Closes a bound id's socket and gives its port back.
void release_bind(Id* d);
void on_accepted(Id* listener);
void reply_and_close(int fd, const uint8_t* mad);
bool try_connect(Id* d);

// --- multicast (cm_multicast.cc) ------------------------------------------------
bool addr_is_multicast(const sockaddr* a);
// rdma_resolve_addr to a group: resolved on this host, with the group's MGID
// as the destination GID (multicast between hosts is not carried yet).
void resolve_multicast(Id* d, const sockaddr* group);
// rdma_destroy_id: the id's QP leaves every group it is attached to.
void leave_all_multicast(Id* d);
// rdma_destroy_qp: the QP goes (and with it its attachments, in the
// daemon); the id stays joined, without a QP.
void multicast_qp_gone(Id* d);

// --- the state machine (cm_state.cc) -----------------------------------------
int init_qp_attr(Id* d, ibv_qp_attr* a, int* mask);
int modify_to(Id* d, ibv_qp_state s);
int connect_qp(Id* d);
void qp_to_err(Id* d);
void fill_path_rec(Id* d);
void reject_child(Id* child, uint16_t reason);
void drop_events_of(Channel* c, uint64_t serial, bool also_listen);
void free_channel(Channel* c);
bool channel_in_use(const Channel* c);
void free_if_dead(rdma_event_channel* ch);
void destroy_locked(Id* d);
Id* new_id(Channel* c, void* context, rdma_port_space ps, ibv_qp_type qpt);
void on_request(int fd, uint64_t serial, const cm::Msg& m);
// rdma_listen: the REQs held for `l` are taken now. The held REQs whose
// grace ended (kHeldReq timer), or all of them (`all`: the id is going),
// are rejected as for no listener.
void take_held_requests(Id* l);
void refuse_held_requests(Id* l, bool all);
// A pending connection closed by its peer: no longer held.
void forget_held_request(uint64_t serial, int fd);
void send_rtu(Id* d);
void disconnected(Id* d);
void on_message(Id* d, const cm::Msg& m);
void on_peer_gone(Id* d);
Channel* new_channel();
void move_events(Id* d, Channel* from, Channel* to);
void make_sync(Id* d);
int complete(Id* d);
inline bool has_local_device(Id* d) { return d->id.verbs != nullptr; }

}  // namespace sv::rdmacm::detail
