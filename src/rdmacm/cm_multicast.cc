// cm_multicast.cc: rdma_cm multicast (rdma_join_multicast(3),
// rdma_join_multicast_ex(3), rdma_leave_multicast(3)) over softverbs' UD
// multicast verbs (ibv_attach_mcast, src/verbs/mcast.cc), on one host.
//
// As Linux's CM does on a RoCEv2 port (the kernel's cma.c, cma_iboe_set_mgid
// and cma_make_mc_event; librdmacm's cma.c, ucma_process_join), reimplemented:
//  * a group's MGID is its IP address as a GID: IPv4 a.b.c.d as
//    ::ffff:a.b.c.d, IPv6 as it is (Annex A17.4.5.1);
//  * the id must have a device (bound to a device's address, or resolved)
//    and a UD QP type (RDMA_PS_UDP, RDMA_PS_IPOIB);
//  * the join's QP (if the id has one) is attached to the group, unless the
//    join is send-only (RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER: the member
//    sends, it does not receive);
//  * RDMA_CM_EVENT_MULTICAST_JOIN carries param.ud: the AH attributes to
//    send to the group (a GRH to the MGID, from the id's GID), remote QPN
//    0xFFFFFF (IBTA 9.8.2: multicast), the Q_Key RDMA_UDP_QKEY, and as
//    private_data the context the join was given; MULTICAST_ERROR its status.
// Here the join needs no SA and no IGMP: the event is posted at once, with
// the QP already attached. Differences, for what softverbs can do better:
// Linux's RoCEv2 refuses IPv6 groups (ENOTSUPP); here they work. A group
// address that is not multicast gives MULTICAST_ERROR -EINVAL (Linux's
// librdmacm: the attach fails when the event is read).
#include <arpa/inet.h>
#include <fcntl.h>
#include <infiniband/ib.h>
#include <unistd.h>

#include <cstring>

#include "rdmacm/addr.h"
#include "rdmacm/cm_state.h"
#include "rdmacm/cm_trace.h"
#include "rdmacm/device.h"

namespace sv::rdmacm::detail {
namespace {

uint64_t g_next_mc = 1;  // under g.mu

// The MGID of a group address on a RoCEv2 port (cma_iboe_set_mgid).
ibv_gid mgid_of(const sockaddr* a) { return gid_of_addr(a); }

bool same_addr(const sockaddr* a, const sockaddr* b) {
  if (a->sa_family != b->sa_family) return false;
  if (a->sa_family == AF_INET)
    return reinterpret_cast<const sockaddr_in*>(a)->sin_addr.s_addr ==
           reinterpret_cast<const sockaddr_in*>(b)->sin_addr.s_addr;
  return std::memcmp(&reinterpret_cast<const sockaddr_in6*>(a)->sin6_addr,
                     &reinterpret_cast<const sockaddr_in6*>(b)->sin6_addr, 16) == 0;
}

Mcast* find_mc(Id* d, const sockaddr* a) {
  for (Mcast& m : d->mcs)
    if (same_addr(reinterpret_cast<const sockaddr*>(&m.addr), a)) return &m;
  return nullptr;
}

// The join's outcome as its event (cma_make_mc_event): param.ud to send to
// the group, or MULTICAST_ERROR with `status`.
void post_join_event(Id* d, const Mcast& m, int status) {
  Event* e = new_event(d, status ? RDMA_CM_EVENT_MULTICAST_ERROR : RDMA_CM_EVENT_MULTICAST_JOIN, status);
  e->mc = m.serial;
  rdma_ud_param& ud = e->ev.param.ud;
  ud.private_data = m.context;  // librdmacm: the join's context
  ud.private_data_len = 0;
  if (!status) {
    ibv_ah_attr& ah = ud.ah_attr;
    ah.is_global = 1;
    ah.port_num = d->id.port_num ? d->id.port_num : 1;
    ah.dlid = 0;  // no multicast LID on Ethernet
    ah.sl = 0;
    ah.grh.dgid = m.mgid;
    ah.grh.sgid_index = uint8_t(d->sgid_index);
    ah.grh.hop_limit = 64;  // IPV6_DEFAULT_HOPLIMIT, as Linux for RoCEv2 groups
    ah.grh.traffic_class = 0;
    ah.grh.flow_label = 0;
    ud.qp_num = 0xffffff;  // IBTA 9.8.2: the multicast QPN
    ud.qkey = RDMA_UDP_QKEY;
  }
  post(d, e);
}

// The id may join: it has a device and is bound or address-resolved
// (Linux's rdma_join_multicast: ADDR_BOUND or ADDR_RESOLVED), UD.
int check_joinable(Id* d, const sockaddr* a) {
  if (!has_local_device(d)) return EINVAL;
  if (d->st != St::kIdle && d->st != St::kAddrResolved) return EINVAL;
  if (d->id.qp_type != IBV_QPT_UD) return EINVAL;
  if (a->sa_family != AF_INET && a->sa_family != AF_INET6) return EINVAL;
  if (addr_is_any(a)) return EINVAL;  // no SA to assign a group on RoCE
  if (find_mc(d, a)) return EADDRINUSE;
  return 0;
}

int join_group(rdma_cm_id* id, const sockaddr* addr, int flags, void* context) {
  Id* d = id_of(id);
  {
    std::lock_guard<std::mutex> lk(g.mu);
    if (int e = check_joinable(d, addr)) return fail(e);
    Mcast m;
    m.serial = g_next_mc++;
    std::memcpy(&m.addr, addr, addr_len(addr));
    m.mgid = mgid_of(addr);
    m.join_flags = flags;
    m.context = context;
    int status = 0;
    if (!addr_is_multicast(addr)) {
      status = -EINVAL;
    } else if (d->id.qp && flags != RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER) {
      if (int e = ibv_attach_mcast(d->id.qp, &m.mgid, 0)) status = -e;
      else m.attached = d->id.qp;
    }
    CM_TRACE("id %llu joins %s (%s): %d", (unsigned long long)d->serial, addr_text(addr).c_str(),
             flags == RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER ? "send-only" : "full member", status);
    // Kept after an error too, as librdmacm keeps it: rdma_leave_multicast forgets it.
    d->mcs.push_back(m);
    post_join_event(d, m, status);
  }
  return complete(d);
}

// Takes one count of the channel's eventfd (a semaphore) if it has one,
// never blocking: a program that polls the channel then calls
// rdma_get_cm_event must not find it readable for an event that is gone.
void take_count(Channel* c) {
  int fd = c->ch.fd;
  if (fd < 0) return;
  int fl = ::fcntl(fd, F_GETFL);
  if (fl < 0) return;
  if (!(fl & O_NONBLOCK)) ::fcntl(fd, F_SETFL, fl | O_NONBLOCK);
  uint64_t v;
  (void)!::read(fd, &v, sizeof(v));
  if (!(fl & O_NONBLOCK)) ::fcntl(fd, F_SETFL, fl);
}

// Removes the events of group `serial` still queued for the id: after
// rdma_leave_multicast, no event of the group is reported (librdmacm
// instead waits in the leave until they are acknowledged).
void drop_mc_events(Id* d, uint64_t serial) {
  if (!d->id.channel) return;
  Channel* c = chan_of(d->id.channel);
  for (auto it = c->q.begin(); it != c->q.end();) {
    if ((*it)->owner == d->serial && (*it)->mc == serial) {
      delete *it;
      it = c->q.erase(it);
      take_count(c);
    } else {
      ++it;
    }
  }
}

}  // namespace

bool addr_is_multicast(const sockaddr* a) {
  if (a->sa_family == AF_INET)
    return IN_MULTICAST(ntohl(reinterpret_cast<const sockaddr_in*>(a)->sin_addr.s_addr));
  if (a->sa_family == AF_INET6) return IN6_IS_ADDR_MULTICAST(&reinterpret_cast<const sockaddr_in6*>(a)->sin6_addr);
  return false;
}

void resolve_multicast(Id* d, const sockaddr* group) {
  std::memcpy(&d->id.route.addr.dst_storage, group, addr_len(group));
  // The source: the bound address's GID; a wildcard takes the source the
  // routing table picks for the group, else loopback (GID index 0).
  sockaddr_storage src{};
  std::memcpy(&src, &d->id.route.addr.src_storage, sizeof(src));
  auto* s = reinterpret_cast<sockaddr*>(&src);
  if (addr_is_any(s)) {
    sockaddr_storage r{};
    if (route_source(group, &r) == 0 && gid_index_of(reinterpret_cast<sockaddr*>(&r), nullptr) >= 0) {
      set_port(reinterpret_cast<sockaddr*>(&r), addr_port(s));
      src = r;
      std::memcpy(&d->id.route.addr.src_storage, &src, sizeof(src));
    }
  }
  int idx = addr_is_any(s) ? -1 : gid_index_of(s, &d->id.route.addr.addr.ibaddr.sgid);
  if (idx < 0) {
    idx = 0;
    ibv_query_gid(device(), 1, 0, &d->id.route.addr.addr.ibaddr.sgid);
  }
  d->sgid_index = idx;
  d->peer_gid = mgid_of(group);
  d->id.route.addr.addr.ibaddr.dgid = d->peer_gid;
  d->id.verbs = device();
  d->id.pd = default_pd();
  d->id.port_num = 1;
  d->st = St::kAddrResolved;
  post(d, RDMA_CM_EVENT_ADDR_RESOLVED, 0);
}

void leave_all_multicast(Id* d) {
  for (Mcast& m : d->mcs)
    if (m.attached && m.attached == d->id.qp) ibv_detach_mcast(m.attached, &m.mgid, 0);
  d->mcs.clear();
}

void multicast_qp_gone(Id* d) {
  for (Mcast& m : d->mcs) m.attached = nullptr;
}

}  // namespace sv::rdmacm::detail

using namespace sv::rdmacm;
using namespace sv::rdmacm::detail;

extern "C" {

int rdma_join_multicast(rdma_cm_id* id, sockaddr* addr, void* context) {
  if (!id || !addr || !addr_len(addr)) return fail(EINVAL);
  return join_group(id, addr, RDMA_MC_JOIN_FLAG_FULLMEMBER, context);
}

// librdmacm's checks: a known comp_mask, an address, join flags.
int rdma_join_multicast_ex(rdma_cm_id* id, rdma_cm_join_mc_attr_ex* attr, void* context) {
  if (!id || !attr) return fail(EINVAL);
  if (attr->comp_mask >= RDMA_CM_JOIN_MC_ATTR_RESERVED) return fail(ENOTSUP);
  if (!(attr->comp_mask & RDMA_CM_JOIN_MC_ATTR_ADDRESS) || !attr->addr || !addr_len(attr->addr))
    return fail(EINVAL);
  if (!(attr->comp_mask & RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS) || attr->join_flags >= RDMA_MC_JOIN_FLAG_RESERVED)
    return fail(EINVAL);
  return join_group(id, attr->addr, int(attr->join_flags), context);
}

// The QP leaves the group (if it was attached at the join), and the group's
// events not yet read are dropped.
int rdma_leave_multicast(rdma_cm_id* id, sockaddr* addr) {
  if (!id || !addr || !addr_len(addr)) return fail(EINVAL);
  Id* d = id_of(id);
  std::lock_guard<std::mutex> lk(g.mu);
  Mcast* m = find_mc(d, addr);
  if (!m) return fail(EADDRNOTAVAIL);
  if (m->attached && m->attached == d->id.qp) {
    if (int e = ibv_detach_mcast(m->attached, &m->mgid, 0)) return fail(e);
  }
  CM_TRACE("id %llu leaves %s", (unsigned long long)d->serial, addr_text(addr).c_str());
  drop_mc_events(d, m->serial);
  d->mcs.erase(d->mcs.begin() + (m - d->mcs.data()));
  return 0;
}

}  // extern "C"
