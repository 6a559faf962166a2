// cma.cc: the public API of the drop-in librdmacm (rdma_* functions, as
// rdma-core's cma.c): rdma_cm ids, event channels and the connection manager
// between processes of one host and, through the daemon's gateway, between
// hosts. The CM state machine is in cm_state.cc, the engine thread in
// cm_engine.cc, the rendezvous in cm_rendezvous.cc, multicast in
// cm_multicast.cc (see cm_state.h).
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

#include "common/paths.h"
#include "rdmacm/cm_msg.h"
#include "rdmacm/cm_state.h"
#include "rdmacm/cm_trace.h"
#include "rdmacm/addr.h"
#include "rdmacm/device.h"

using namespace sv::rdmacm;
using namespace sv::rdmacm::detail;

namespace {

// rdma_resolve_addr on an unbound id: binds it to src_addr, or else to the
// destination itself when that is local, or else to the wildcard of the
// destination's family. 0 or an errno.
int bind_for_resolve(Id* d, const sockaddr* src_addr, const sockaddr* dst_addr) {
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
  if (!addr_is_any(s) && !addr_is_local(s)) return EADDRNOTAVAIL;
  return do_bind(d, s);
}

// The address resolved: the id gets the device, its PD and port, and an
// ADDR_RESOLVED event.
void addr_resolved(Id* d) {
  d->id.verbs = device();
  d->id.pd = default_pd();
  d->id.port_num = 1;
  d->st = St::kAddrResolved;
  post(d, RDMA_CM_EVENT_ADDR_RESOLVED, 0);
}

// rdma_resolve_addr to an address of this host: the GIDs are the addresses'
// own; an id bound to a wildcard takes the destination as its source.
void resolve_local(Id* d, sockaddr* dst_addr) {
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
    // Bound to loopback: GID index 0 (do_bind gave it, or no device).
    d->sgid_index = gid_index_of(&d->id.route.addr.src_addr, &d->id.route.addr.addr.ibaddr.sgid);
    if (d->sgid_index < 0) d->sgid_index = 0;
  }
  addr_resolved(d);
}

// rdma_resolve_addr to another host (RoCEv2): the routing table picks the
// source address, as Linux's rdma_resolve_addr does; the destination's GID
// is its IP address (Annex A17.8); no ARP is needed on a UDP socket. Whether
// anybody answers there shows at rdma_connect (UNREACHABLE).
void resolve_remote(Id* d, sockaddr* dst_addr) {
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
    return;
  }
  std::memcpy(&d->id.route.addr.src_storage, &src, sizeof(src));
  d->sgid_index = idx;
  d->id.route.addr.addr.ibaddr.sgid = sgid;
  d->peer_gid = gid_of_addr(dst_addr);
  d->id.route.addr.addr.ibaddr.dgid = d->peer_gid;
  d->wire = true;
  d->path_mtu = uint8_t(wire_mtu_of(reinterpret_cast<sockaddr*>(&src)));
  addr_resolved(d);
}

// librdmacm's ucma_create_cqs: a CQ of n entries and a completion channel
// for one queue of the id's QP (rdma_verbs.h's helpers wait on them).
bool make_id_cq(Id* d, ibv_comp_channel** ch, ibv_cq** cq, uint32_t n) {
  *ch = ibv_create_comp_channel(d->id.verbs);
  if (!*ch) return false;
  *cq = ibv_create_cq(d->id.verbs, int(std::max<uint32_t>(n, 1)), d, *ch, 0);
  if (!*cq) {
    ibv_destroy_comp_channel(*ch);
    *ch = nullptr;
    return false;
  }
  return true;
}

void destroy_id_cq(ibv_comp_channel** ch, ibv_cq** cq) {
  ibv_destroy_cq(*cq);
  ibv_destroy_comp_channel(*ch);
  *cq = nullptr;
  *ch = nullptr;
}

// A CQ for each queue the caller of rdma_create_qp left without one; says
// which it made. False (with nothing made) when one cannot be.
bool make_missing_cqs(Id* d, ibv_qp_init_attr_ex* attr, bool* made_send, bool* made_recv) {
  if (!attr->recv_cq) {
    if (!make_id_cq(d, &d->id.recv_cq_channel, &d->id.recv_cq, attr->cap.max_recv_wr)) return false;
    attr->recv_cq = d->id.recv_cq;
    *made_recv = true;
  }
  if (!attr->send_cq) {
    if (!make_id_cq(d, &d->id.send_cq_channel, &d->id.send_cq, attr->cap.max_send_wr)) {
      if (*made_recv) destroy_id_cq(&d->id.recv_cq_channel, &d->id.recv_cq);
      *made_recv = false;
      return false;
    }
    attr->send_cq = d->id.send_cq;
    *made_send = true;
  }
  return true;
}

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
      if (int e = bind_for_resolve(d, src_addr, dst_addr)) return fail(e);
    }
    std::memcpy(&d->id.route.addr.dst_storage, dst_addr, addr_len(dst_addr));
    if (!addr_is_multicast(dst_addr) && port_down()) {
      // As Linux when the netdev under the RDMA port is down: its routes are
      // gone, the route lookup of address resolution fails (drivers/
      // infiniband/core/addr.c, addr4_resolve/addr6_resolve) and the id gets
      // RDMA_CM_EVENT_ADDR_ERROR with status -ENETUNREACH.
      std::fprintf(stderr, "softverbs: rdma_resolve_addr: port 1 of %s is down\n", ibv_get_device_name(device()->device));
      post(d, RDMA_CM_EVENT_ADDR_ERROR, -ENETUNREACH);
    } else if (addr_is_multicast(dst_addr)) {
      resolve_multicast(d, dst_addr);  // a group: joined on this host (cm_multicast.cc)
    } else if (addr_is_local(dst_addr)) {
      resolve_local(d, dst_addr);
    } else {
      resolve_remote(d, dst_addr);
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
    if (port_down()) {
      // No path through a port that is down: as an IB port's path query,
      // which cannot reach the SA then, the id gets RDMA_CM_EVENT_ROUTE_ERROR
      // and keeps its resolved address (it may try again; Linux's cma.c
      // returns a route error to RDMA_CM_ADDR_RESOLVED). Linux's RoCE route
      // resolution (cma_resolve_iboe_route) does not look at the link.
      std::fprintf(stderr, "softverbs: rdma_resolve_route: port 1 of %s is down\n", ibv_get_device_name(device()->device));
      post(d, RDMA_CM_EVENT_ROUTE_ERROR, -ENETUNREACH);
    } else {
      fill_path_rec(d);
      d->st = St::kRouteResolved;
      post(d, RDMA_CM_EVENT_ROUTE_RESOLVED, 0);
    }
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
  if (!make_missing_cqs(d, attr, &made_send, &made_recv)) return -1;
  auto undo_cqs = [&] {
    if (made_send) destroy_id_cq(&d->id.send_cq_channel, &d->id.send_cq);
    if (made_recv) destroy_id_cq(&d->id.recv_cq_channel, &d->id.recv_cq);
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
    multicast_qp_gone(id_of(id));  // destroying the QP detaches it from its groups
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

namespace {

// rdma_connect's REQ goes out (try_connect), unless the port is down: it
// cannot leave then, Linux's CM resends it until its retries run out and
// rdma_cm reports UNREACHABLE, -ETIMEDOUT (drivers/infiniband/core/cm.c, a
// REQ's send error); here at once. With g.mu held.
void start_connect(Id* d) {
  if (port_down()) {
    std::fprintf(stderr, "softverbs: rdma_connect: port 1 of %s is down\n", ibv_get_device_name(d->id.verbs->device));
    d->st = St::kRejected;
    post(d, RDMA_CM_EVENT_UNREACHABLE, -ETIMEDOUT);
    return;
  }
  d->st = St::kConnect;
  d->connect_deadline = Clock::now() + kRepTimeout;
  d->no_listener_until = Clock::now() + kNoListenerGrace;
  try_connect(d);
}

}  // namespace

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
    start_connect(d);
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
  take_held_requests(d);
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
      uint8_t mad[cm::kMadSize];
      cm::encode_dreq(d->local_comm_id, d->remote_comm_id, d->peer_qpn, 0, mad);
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

// Enhanced connection establishment (ECE: a vendor id and vendor options
// that two ends agree on in the CM exchange, set before the QP exists).
// rdma_set_local_ece(3) checks and keeps the caller's; softverbs has no
// vendor options (ibv_set_ece/ibv_query_ece are EOPNOTSUPP, as on rxe), so
// it offers none to the peer and the peer's, as rdma_get_remote_ece(3)
// reports them, are none: vendor_id 0, which an application reads as "the
// peer offered nothing" and goes on without, as with any device that has
// no ECE. Both are refused once the id has a QP, as librdmacm refuses them.
int rdma_set_local_ece(rdma_cm_id* id, ibv_ece* ece) {
  if (!id || id->qp || !ece || !ece->vendor_id || ece->comp_mask) return fail(EINVAL);
  std::lock_guard<std::mutex> lk(g.mu);
  id_of(id)->local_ece = *ece;
  return 0;
}

int rdma_get_remote_ece(rdma_cm_id* id, ibv_ece* ece) {
  if (!id || id->qp || !ece) return fail(EINVAL);
  *ece = ibv_ece{};
  return 0;
}

}  // extern "C"
