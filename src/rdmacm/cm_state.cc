// cm_state.cc: the CM state machine of an rdma_cm id (IBTA 12.9, as
// Linux's cm.c / cma.c keep it): the passive side's REQ, the REP/RTU/REJ/
// DREQ/DREP exchange, the peer's end, QP transitions in librdmacm's order,
// teardown, and sync ids. See cm_state.h.
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
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "common/verbs_current.h"
#include "common/paths.h"
#include "rdmacm/cm_msg.h"
#include "rdmacm/cm_state.h"
#include "rdmacm/cm_trace.h"
#include "rdmacm/addr.h"
#include "rdmacm/device.h"

using namespace sv::rdmacm;

namespace sv::rdmacm::detail {

uint32_t random32() {
  uint32_t v = 0;
  if (::getrandom(&v, sizeof(v), 0) != sizeof(v)) v = uint32_t(Clock::now().time_since_epoch().count());
  return v;
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


// A listener's CONNECT_REQUEST whose child is dropped with it: the active
// side is rejected.
void reject_child(Id* child, uint16_t reason) {
  if (child->conn_fd >= 0 && child->st == St::kReqRcvd) {
    uint8_t mad[cm::kMadSize];
    if (child->id.qp_type == IBV_QPT_UD)
      cm::encode_sidr_status(child->remote_comm_id, cm::kSidrRejected, 0, 0, mad);
    else
      cm::encode_rej(child->local_comm_id, child->remote_comm_id, cm::kRejectedReq, reason, 0, mad);
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
  refuse_held_requests(d, true);
  leave_all_multicast(d);
  g.ids.erase(d->serial);
  cancel_timers(d);
  if (d->id.channel) drop_events_of(chan_of(d->id.channel), d->serial, true);
  if (d->conn_fd >= 0 && !d->peer_gone) {
    uint8_t mad[cm::kMadSize];
    if (d->st == St::kEstablished || d->st == St::kRepSent || d->st == St::kRepRcvd) {
      if (d->id.qp_type != IBV_QPT_UD) {
        // IBTA 12.9.8.4: destroying a connection sends a DREQ
        cm::encode_dreq(d->local_comm_id, d->remote_comm_id, d->peer_qpn, 0, mad);
        send_mad(d, mad);
      }
    } else if (d->st == St::kReqRcvd) {
      reject_child(d, cm::kRejConsumer);
    }
  }
  unwatch_close(d->conn_fd);
  if (d->bind_fd >= 0) release_bind(d);
  std::free(d->id.route.path_rec);
  rdma_freeaddrinfo(d->resolved_ai);
  delete d->ep_qp_attr;
  rdma_event_channel* ch = d->own_channel ? nullptr : d->id.channel;
  if (d->own_channel) free_channel(d->own_channel);
  delete d;
  free_if_dead(ch);
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

// A REQ or SIDR_REQ on a fresh connection to listener `serial`.
// A REQ for an id that is bound and not yet listening. Programs send their
// port out of band and then listen (Debian's qperf 0.4.11 does, a race
// fixed upstream in 2018); a REQ in between was rejected at once and its
// client saw REJECTED (compat.qperf.*.cm1 failed 1 run in 20 under load).
// The passive side holds the REQ for kBoundNotListeningGrace: the CM may
// answer within the REQ's response timeout (IBTA 12.6.5).
bool hold_request(Id* l, int fd, const cm::Msg& m) {
  if (!l || l->st != St::kIdle || l->bind_fd < 0 || l->held.size() >= 64) return false;
  Clock::time_point until = Clock::now() + kBoundNotListeningGrace;
  l->held.push_back({fd, m, until});
  add_timer(l, TimerKind::kHeldReq, until);
  CM_TRACE("REQ for id %llu held: bound, not listening yet", (unsigned long long)l->serial);
  return true;
}

void take_held_requests(Id* l) {
  std::vector<Id::HeldReq> held;
  held.swap(l->held);
  for (auto& h : held) on_request(h.fd, l->serial, h.m);
}

void refuse_held_requests(Id* l, bool all) {
  auto now = Clock::now();
  for (auto it = l->held.begin(); it != l->held.end();) {
    if (!all && it->until > now) {
      ++it;
      continue;
    }
    uint8_t mad[cm::kMadSize];
    cm::encode_no_listener(it->m, random32(), mad);
    reply_and_close(it->fd, mad);
    it = l->held.erase(it);
  }
}

void forget_held_request(uint64_t serial, int fd) {
  Id* l = find(serial);
  if (!l) return;
  for (auto it = l->held.begin(); it != l->held.end(); ++it)
    if (it->fd == fd) {
      l->held.erase(it);
      return;
    }
}

namespace {

// Whether listener l (the id `serial`, or none) takes request m: it listens,
// its channel lives, the request names its service and carries an IP header
// (into ip), and its backlog has room.
bool listener_takes(Id* l, uint64_t serial, const cm::Msg& m, cm::IpHeader& ip) {
  // (a listener whose channel the application destroyed hears nothing: as none)
  bool ok = l && l->st == St::kListen && !(l->id.channel && chan_of(l->id.channel)->dead) &&
            cm::request_ip_header(m, ip) &&
            cm::request_service_id(m) == cm::service_id(l->id.ps, addr_port(&l->id.route.addr.src_addr));
  if (!ok) return false;
  int pending = 0;
  for (auto& [s, c] : g.ids)
    if (c->listener == serial && c->st == St::kReqRcvd) pending++;
  return pending < l->backlog;
}

// The passive id d takes the connection parameters of REQ r (IBTA 12.6.5),
// and its CONNECT_REQUEST event e reports them with the private data.
void take_req(Id* d, Event* e, const cm::Req& r, const uint8_t* pdata) {
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

}  // namespace

void on_request(int fd, uint64_t serial, const cm::Msg& m) {
  Id* l = find(serial);
  if (port_down()) {
    // A NIC whose link is down receives nothing: the REQ is lost and the
    // active side, unanswered, reports RDMA_CM_EVENT_UNREACHABLE (its CM's
    // resends of the REQ run out; here when the connection is dropped).
    std::fprintf(stderr, "softverbs: rdma_cm: a connection request for a listener dropped: port 1 of %s is down\n",
                 ibv_get_device_name(device()->device));
    forget_held_request(serial, fd);
    unwatch_close(fd);
    return;
  }
  if (hold_request(l, fd, m)) return;
  bool ud = m.attr == cm::Attr::kSidrReq;
  const uint8_t* pdata = cm::request_private_data(m);
  cm::IpHeader ip;
  if (!listener_takes(l, serial, m, ip)) {
    CM_TRACE("REQ for listener %llu refused (%s)", (unsigned long long)serial,
             !l ? "no such id" : l->st != St::kListen ? "not listening" : "channel gone, bad header or service id, or backlog full");
    uint8_t mad[cm::kMadSize];
    cm::encode_no_listener(m, random32(), mad);
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
    take_req(d, e, m.req, pdata);
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

namespace {

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
    uint8_t mad[cm::kMadSize];
    cm::encode_rej(d->local_comm_id, d->remote_comm_id, cm::kRejectedRep, cm::kRejConsumer, 0, mad);
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

}  // namespace

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
      uint8_t mad[cm::kMadSize];
      cm::encode_drep(d->local_comm_id, d->remote_comm_id, m.tid, mad);
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
    if (sv::abi::cm_event_type(*e) == RDMA_CM_EVENT_REJECTED) return fail(ECONNREFUSED);
    return fail(e->status < 0 ? -e->status : e->status);
  }
  return 0;
}



}  // namespace sv::rdmacm::detail
