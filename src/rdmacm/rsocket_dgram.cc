// rsocket_dgram.cc: SOCK_DGRAM rsockets over UD (rsocket.c's "ds_" code),
// with rsocket.c's wire formats so that they can talk to rdma-core's:
//
//  * The descriptor is a kernel UDP socket that owns the address and port.
//  * A datagram to a destination whose QP we do not know yet goes through
//    that UDP socket, after a struct ds_udp_header (tag 0x55555555, IP
//    version, op, header length, our QPN, our address). The receiver answers
//    with a header-only CTRL message (so the sender learns its QPN), makes
//    an address handle to the sender and delivers the payload. rsocket.c
//    forwards it to itself through its own UD QP; we queue it directly.
//  * Once the QPN is known, datagrams are UD SENDs (qkey RDMA_UDP_QKEY)
//    after a struct ds_header (IP version, length, source port and address),
//    of at most 2048 bytes with the header (RS_SNDLOWAT).
//
// Differences: one UD QP per rsocket (rsocket.c has one per source
// address), no service thread: the UDP socket is read by the rsocket's own
// calls (rrecvfrom, rsendto, rpoll), so a CTRL answer or a datagram that came
// through UDP waits for the next of them.
#include <arpa/inet.h>
#include <endian.h>
#include <poll.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <deque>
#include <map>
#include <string>

#include "common/sys.h"
#include "rdmacm/rsocket_internal.h"

namespace sv::rsock {

namespace {

constexpr uint32_t kUdpTag = 0x55555555;
constexpr size_t kGrh = 40;
constexpr uint32_t kMsg = kSndLowat;  // the largest datagram, header included

struct DsHeader {  // struct ds_header
  uint8_t version;
  uint8_t length;
  uint16_t port;  // network order
  union {
    uint32_t ipv4;
    struct {
      uint32_t flowinfo;
      uint8_t addr[16];
    } ipv6;
  } addr;
};

struct DsUdpHeader {  // struct ds_udp_header
  uint32_t tag;  // big endian
  uint8_t version;
  uint8_t op;
  uint8_t length;
  uint8_t reserved;
  uint32_t qpn;  // big endian, 24 bits
  union {
    uint32_t ipv4;
    uint8_t ipv6[16];
  } addr;
};

// A destination's key: family, port and address (not sin_zero's bytes).
std::string key_of(const sockaddr* a) {
  std::string k(1, char(a->sa_family));
  if (a->sa_family == AF_INET) {
    auto* s = reinterpret_cast<const sockaddr_in*>(a);
    k.append(reinterpret_cast<const char*>(&s->sin_port), 2);
    k.append(reinterpret_cast<const char*>(&s->sin_addr), 4);
  } else {
    auto* s = reinterpret_cast<const sockaddr_in6*>(a);
    k.append(reinterpret_cast<const char*>(&s->sin6_port), 2);
    k.append(reinterpret_cast<const char*>(&s->sin6_addr), 16);
  }
  return k;
}

socklen_t len_of(const sockaddr* a) { return a->sa_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in); }

uint8_t hdr_len(const sockaddr* a) { return a->sa_family == AF_INET6 ? 24 : 8; }

DsHeader format_hdr(const sockaddr* a) {
  DsHeader h{};
  if (a->sa_family == AF_INET) {
    auto* s = reinterpret_cast<const sockaddr_in*>(a);
    h.version = 4;
    h.length = 8;
    h.port = s->sin_port;
    h.addr.ipv4 = s->sin_addr.s_addr;
  } else {
    auto* s = reinterpret_cast<const sockaddr_in6*>(a);
    h.version = 6;
    h.length = 24;
    h.port = s->sin6_port;
    h.addr.ipv6.flowinfo = s->sin6_flowinfo;
    std::memcpy(h.addr.ipv6.addr, &s->sin6_addr, 16);
  }
  return h;
}

sockaddr_storage addr_of_hdr(const DsHeader& h) {
  sockaddr_storage ss{};
  if (h.version == 4) {
    auto* s = reinterpret_cast<sockaddr_in*>(&ss);
    s->sin_family = AF_INET;
    s->sin_port = h.port;
    s->sin_addr.s_addr = h.addr.ipv4;
  } else {
    auto* s = reinterpret_cast<sockaddr_in6*>(&ss);
    s->sin6_family = AF_INET6;
    s->sin6_port = h.port;
    s->sin6_flowinfo = h.addr.ipv6.flowinfo;
    std::memcpy(&s->sin6_addr, h.addr.ipv6.addr, 16);
  }
  return ss;
}

struct Dest {
  ibv_ah* ah = nullptr;
  uint32_t qpn = 0;
};

struct Datagram {
  sockaddr_storage from;
  std::string data;   // a datagram that came through UDP
  int64_t offset = -1;  // else its receive slot
  uint32_t length = 0;
};

}  // namespace

struct Ds {
  int udp = -1;
  rdma_cm_id* id = nullptr;  // PS_UDP, bound to our source address; owns the QP
  ibv_comp_channel* cc = nullptr;
  ibv_cq* cq = nullptr;
  bool armed = false;
  uint8_t *sbuf = nullptr, *rbuf = nullptr;
  ibv_mr *smr = nullptr, *rmr = nullptr;
  std::vector<uint32_t> free_slots;  // send slots
  sockaddr_storage src{};  // the address in our headers
  std::map<std::string, Dest> dests;
  sockaddr_storage conn{};
  bool connected = false;
  std::deque<Datagram> queue;
};

namespace {

int ds_create_qp(Rs* rs, Ds* d, const sockaddr* src) {
  if (rdma_create_id(nullptr, &d->id, rs, RDMA_PS_UDP)) return -1;
  if (rdma_bind_addr(d->id, const_cast<sockaddr*>(src))) return -1;
  // Bound to a loopback address (without the opt-in of docs/RDMACM.md
  // "Addresses") or to one the device's GID table lacks, an id has no
  // device until it resolves one: resolve to itself.
  if (!d->id->verbs && rdma_resolve_addr(d->id, nullptr, const_cast<sockaddr*>(src), 2000)) return -1;
  if (!d->id->verbs) return seterr(ENODEV);
  rs->rq_size = uint16_t(std::clamp<uint32_t>(rs->rbuf_size / kMsg, 2, rs->rq_size));
  rs->sq_size = uint16_t(std::clamp<uint32_t>(rs->sbuf_size / kMsg, 2, rs->sq_size));
  if (!(d->cc = ibv_create_comp_channel(d->id->verbs))) return -1;
  ::fcntl(d->cc->fd, F_SETFL, ::fcntl(d->cc->fd, F_GETFL) | O_NONBLOCK);
  if (!(d->cq = ibv_create_cq(d->id->verbs, rs->sq_size + rs->rq_size, rs, d->cc, 0))) return -1;
  ibv_qp_init_attr a{};
  a.send_cq = a.recv_cq = d->cq;
  a.qp_type = IBV_QPT_UD;
  a.sq_sig_all = 1;
  a.cap.max_send_wr = rs->sq_size;
  a.cap.max_recv_wr = rs->rq_size;
  a.cap.max_send_sge = 1;
  a.cap.max_recv_sge = 2;
  a.cap.max_inline_data = rs->sq_inline;
  if (rdma_create_qp(d->id, d->id->pd, &a)) return -1;
  size_t rlen = size_t(rs->rq_size) * kMsg + kGrh, slen = size_t(rs->sq_size) * kMsg;
  d->rbuf = static_cast<uint8_t*>(std::calloc(1, rlen));
  d->sbuf = static_cast<uint8_t*>(std::calloc(1, slen));
  if (!d->rbuf || !d->sbuf) return seterr(ENOMEM);
  if (!(d->rmr = ibv_reg_mr(d->id->pd, d->rbuf, rlen, IBV_ACCESS_LOCAL_WRITE))) return -1;
  if (!(d->smr = ibv_reg_mr(d->id->pd, d->sbuf, slen, IBV_ACCESS_LOCAL_WRITE))) return -1;
  for (uint32_t i = 0; i < rs->sq_size; i++) d->free_slots.push_back(i);
  for (uint32_t i = 0; i < rs->rq_size; i++) {
    // rsocket.c's ds_post_recv: the GRH apart, the message in its slot.
    ibv_sge sg[2] = {{uintptr_t(d->rbuf + size_t(rs->rq_size) * kMsg), uint32_t(kGrh), d->rmr->lkey},
                     {uintptr_t(d->rbuf + size_t(i) * kMsg), kMsg, d->rmr->lkey}};
    ibv_recv_wr wr{}, *bad;
    wr.wr_id = kWrRecv | i;
    wr.sg_list = sg;
    wr.num_sge = 2;
    if (int e = ibv_post_recv(d->id->qp, &wr, &bad)) return seterr(e);
  }
  std::memcpy(&d->src, src, len_of(src));
  return 0;
}

void repost(Rs* rs, Ds* d, uint32_t slot) {
  ibv_sge sg[2] = {{uintptr_t(d->rbuf + size_t(rs->rq_size) * kMsg), uint32_t(kGrh), d->rmr->lkey},
                   {uintptr_t(d->rbuf + size_t(slot) * kMsg), kMsg, d->rmr->lkey}};
  ibv_recv_wr wr{}, *bad;
  wr.wr_id = kWrRecv | slot;
  wr.sg_list = sg;
  wr.num_sge = 2;
  ibv_post_recv(d->id->qp, &wr, &bad);
}

// rsocket.c's ds_get_src_addr: the bound address, or the one the routing
// table picks for `dst` (with the bound port).
int src_for(Ds* d, const sockaddr* dst, sockaddr_storage* src) {
  socklen_t len = sizeof(*src);
  if (::getsockname(d->udp, reinterpret_cast<sockaddr*>(src), &len)) return -1;
  auto* s4 = reinterpret_cast<sockaddr_in*>(src);
  auto* s6 = reinterpret_cast<sockaddr_in6*>(src);
  bool any = src->ss_family == AF_INET ? s4->sin_addr.s_addr == htonl(INADDR_ANY)
                                       : !std::memcmp(&s6->sin6_addr, &in6addr_any, 16);
  if (!any) return 0;
  uint16_t port = src->ss_family == AF_INET ? s4->sin_port : s6->sin6_port;
  int s = sv::kernel_socket(dst->sa_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (s < 0) return -1;
  len = sizeof(*src);
  int r = ::connect(s, dst, len_of(dst));
  if (!r) r = ::getsockname(s, reinterpret_cast<sockaddr*>(src), &len);
  ::close(s);
  if (src->ss_family == AF_INET) s4->sin_port = port;
  else s6->sin6_port = port;
  return r;
}

// The UDP socket must have a port before our headers name it.
int ensure_bound(Ds* d, int domain) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (::getsockname(d->udp, reinterpret_cast<sockaddr*>(&ss), &len)) return -1;
  uint16_t port = ss.ss_family == AF_INET ? reinterpret_cast<sockaddr_in*>(&ss)->sin_port
                                          : reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port;
  if (port) return 0;
  sockaddr_storage any{};
  any.ss_family = sa_family_t(domain);
  return ::bind(d->udp, reinterpret_cast<sockaddr*>(&any), domain == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in));
}

int ensure_qp(Rs* rs, Ds* d, const sockaddr* dst) {
  if (d->id) return 0;
  if (ensure_bound(d, rs->domain)) return -1;
  sockaddr_storage src;
  if (src_for(d, dst, &src)) return -1;
  return ds_create_qp(rs, d, reinterpret_cast<sockaddr*>(&src));
}

// rsocket.c's udp_svc_create_ah: the path from our address to `dst`.
void make_ah(Ds* d, const sockaddr* dst, Dest* dest, uint32_t qpn) {
  if (dest->ah) ibv_destroy_ah(dest->ah);
  dest->ah = nullptr;
  rdma_cm_id* id = nullptr;
  if (rdma_create_id(nullptr, &id, nullptr, RDMA_PS_UDP)) return;
  sockaddr_storage src = d->src;
  if (src.ss_family == AF_INET) reinterpret_cast<sockaddr_in*>(&src)->sin_port = 0;
  else reinterpret_cast<sockaddr_in6*>(&src)->sin6_port = 0;
  if (!rdma_resolve_addr(id, reinterpret_cast<sockaddr*>(&src), const_cast<sockaddr*>(dst), 2000) &&
      !rdma_resolve_route(id, 2000) && id->route.path_rec) {
    const ibv_sa_path_rec& p = *id->route.path_rec;
    ibv_ah_attr a{};
    if (p.hop_limit > 1) {
      a.is_global = 1;
      a.grh.dgid = p.dgid;
      a.grh.flow_label = be32toh(p.flow_label);
      a.grh.hop_limit = p.hop_limit;
      a.grh.traffic_class = p.traffic_class;
      for (int i = 0; i < 16; i++) {
        ibv_gid g;
        if (!ibv_query_gid(d->id->verbs, d->id->port_num, i, &g) && !std::memcmp(&g, &p.sgid, 16)) {
          a.grh.sgid_index = uint8_t(i);
          break;
        }
      }
    }
    a.dlid = be16toh(p.dlid);
    a.sl = p.sl;
    a.port_num = d->id->port_num;
    dest->ah = ibv_create_ah(d->id->pd, &a);
    dest->qpn = qpn;
  }
  rdma_destroy_id(id);
}

ssize_t send_udp(Ds* d, const sockaddr* to, uint8_t op, const void* data, size_t len, int flags) {
  DsUdpHeader h{};
  h.tag = htobe32(kUdpTag);
  DsHeader mine = format_hdr(reinterpret_cast<sockaddr*>(&d->src));
  h.version = mine.version;
  h.op = op;
  h.length = mine.version == 4 ? 16 : 28;
  h.qpn = htobe32(d->id->qp->qp_num & 0xFFFFFF);
  if (mine.version == 4) h.addr.ipv4 = mine.addr.ipv4;
  else std::memcpy(h.addr.ipv6, mine.addr.ipv6.addr, 16);
  iovec v[2] = {{&h, h.length}, {const_cast<void*>(data), len}};
  msghdr m{};
  m.msg_name = const_cast<sockaddr*>(to);
  m.msg_namelen = len_of(to);
  m.msg_iov = v;
  m.msg_iovlen = len ? 2 : 1;
  ssize_t n = ::sendmsg(d->udp, &m, flags & MSG_DONTWAIT);
  return n > 0 ? n - h.length : n;
}

// rsocket.c's udp_svc_process_rs, in the caller's thread.
void read_udp(Rs* rs, Ds* d) {
  uint8_t buf[kMsg + 64];
  for (;;) {
    sockaddr_storage from{};
    socklen_t flen = sizeof(from);
    ssize_t n = ::recvfrom(d->udp, buf, sizeof(buf), MSG_DONTWAIT, reinterpret_cast<sockaddr*>(&from), &flen);
    if (n < 16) {
      if (n < 0) return;
      continue;
    }
    DsUdpHeader h;
    std::memcpy(&h, buf, std::min<size_t>(sizeof(h), size_t(n)));
    bool v4 = h.version == 4 && from.ss_family == AF_INET && h.length == 16;
    bool v6 = h.version == 6 && from.ss_family == AF_INET6 && h.length == 28;
    if (be32toh(h.tag) != kUdpTag || !(v4 || v6) || n < h.length) continue;
    auto* fa = reinterpret_cast<sockaddr*>(&from);
    if (ensure_qp(rs, d, fa)) continue;
    uint32_t qpn = be32toh(h.qpn) & 0xFFFFFF;
    if (h.op == kOpData) send_udp(d, fa, kOpCtrl, nullptr, 0, MSG_DONTWAIT);
    Dest& dest = d->dests[key_of(fa)];
    if (!dest.ah || dest.qpn != qpn) make_ah(d, fa, &dest, qpn);
    if (h.op == kOpData) {
      Datagram g;
      g.from = from;
      g.data.assign(reinterpret_cast<char*>(buf) + h.length, size_t(n) - h.length);
      d->queue.push_back(std::move(g));
    }
  }
}

void poll_ds_cq(Rs* rs, Ds* d) {
  if (!d->cq) return;
  ibv_cq* cq;
  void* ctx;
  if (d->armed) {
    while (!ibv_get_cq_event(d->cc, &cq, &ctx)) {
      d->armed = false;
      ibv_ack_cq_events(d->cq, 1);
    }
  }
  ibv_wc wc[16];
  int n;
  while ((n = ibv_poll_cq(d->cq, 16, wc)) > 0) {
    for (int i = 0; i < n; i++) {
      uint32_t slot = uint32_t(wc[i].wr_id);
      if (!(wc[i].wr_id & kWrRecv)) {
        d->free_slots.push_back(slot);
        continue;
      }
      DsHeader h;
      std::memcpy(&h, d->rbuf + size_t(slot) * kMsg, sizeof(h));
      uint32_t len = wc[i].byte_len > kGrh ? wc[i].byte_len - uint32_t(kGrh) : 0;
      bool ok = wc[i].status == IBV_WC_SUCCESS && len >= 8 &&
                ((h.version == 4 && h.length == 8) || (h.version == 6 && h.length == 24)) && len >= h.length;
      if (!ok) {
        repost(rs, d, slot);
        continue;
      }
      Datagram g;
      g.from = addr_of_hdr(h);
      g.offset = int64_t(slot) * kMsg + h.length;
      g.length = len - h.length;
      d->queue.push_back(std::move(g));
    }
  }
}

void ds_progress(Rs* rs) {
  read_udp(rs, rs->ds);
  poll_ds_cq(rs, rs->ds);
}

}  // namespace

int ds_socket(Rs* rs) {
  Ds* d = rs->ds = new Ds;
  d->udp = sv::kernel_socket(rs->domain, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (d->udp < 0) return -1;
  rs->fd = d->udp;
  rs->state = St::kConnected;
  rs->readable = rs->writable = true;
  return 0;
}

void ds_free(Rs* rs) {
  Ds* d = rs->ds;
  if (!d) return;
  for (auto& [k, dest] : d->dests)
    if (dest.ah) ibv_destroy_ah(dest.ah);
  if (d->id && d->id->qp) rdma_destroy_qp(d->id);
  if (d->cq) ibv_destroy_cq(d->cq);
  if (d->cc) ibv_destroy_comp_channel(d->cc);
  if (d->smr) ibv_dereg_mr(d->smr);
  if (d->rmr) ibv_dereg_mr(d->rmr);
  std::free(d->sbuf);
  std::free(d->rbuf);
  if (d->id) rdma_destroy_id(d->id);
  if (d->udp >= 0) ::close(d->udp);
  delete d;
  rs->ds = nullptr;
}

int ds_bind(Rs* rs, const sockaddr* a, socklen_t len) { return ::bind(rs->ds->udp, a, len); }

int ds_connect(Rs* rs, const sockaddr* a, socklen_t len) {
  Ds* d = rs->ds;
  if (::connect(d->udp, a, len)) return -1;
  std::memcpy(&d->conn, a, len_of(a));
  d->connected = true;
  return ensure_qp(rs, d, a);
}

int ds_name(Rs* rs, sockaddr* a, socklen_t* len, bool peer) {
  return peer ? ::getpeername(rs->ds->udp, a, len) : ::getsockname(rs->ds->udp, a, len);
}

int ds_setsockopt(Rs* rs, int level, int optname, const void* v, socklen_t len) {
  return ::setsockopt(rs->ds->udp, level, optname, v, len);
}

int ds_getsockopt(Rs* rs, int level, int optname, void* v, socklen_t* len) {
  return ::getsockopt(rs->ds->udp, level, optname, v, len);
}

// rsocket.c's dsend: through UDP until the peer's QPN is known.
ssize_t ds_send(Rs* rs, std::unique_lock<std::mutex>& lk, const iovec* iov, int iovcnt, int flags, const sockaddr* to) {
  Ds* d = rs->ds;
  if (!to) {
    if (!d->connected) return seterr(EDESTADDRREQ);
    to = reinterpret_cast<sockaddr*>(&d->conn);
  }
  std::string payload;
  for (int i = 0; i < iovcnt; i++) payload.append(static_cast<const char*>(iov[i].iov_base), iov[i].iov_len);
  if (ensure_qp(rs, d, to)) return -1;
  uint8_t hl = hdr_len(reinterpret_cast<sockaddr*>(&d->src));
  if (payload.size() + hl > kMsg) return seterr(EMSGSIZE);
  ds_progress(rs);
  Dest& dest = d->dests[key_of(to)];
  if (!dest.ah) return send_udp(d, to, kOpData, payload.data(), payload.size(), flags);
  while (d->free_slots.empty()) {
    if (wait_ds(rs, lk, rs->nonblock(flags), [](Rs* r) { return !r->ds->free_slots.empty(); })) return -1;
  }
  uint32_t slot = d->free_slots.back();
  d->free_slots.pop_back();
  uint8_t* m = d->sbuf + size_t(slot) * kMsg;
  DsHeader h = format_hdr(reinterpret_cast<sockaddr*>(&d->src));
  std::memcpy(m, &h, h.length);
  std::memcpy(m + h.length, payload.data(), payload.size());
  ibv_sge sg{uintptr_t(m), uint32_t(h.length + payload.size()), d->smr->lkey};
  ibv_send_wr wr{}, *bad;
  wr.wr_id = slot;
  wr.sg_list = &sg;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_SEND;
  wr.send_flags = sg.length <= rs->sq_inline ? IBV_SEND_INLINE : 0;
  wr.wr.ud.ah = dest.ah;
  wr.wr.ud.remote_qpn = dest.qpn;
  wr.wr.ud.remote_qkey = RDMA_UDP_QKEY;
  if (int e = ibv_post_send(d->id->qp, &wr, &bad)) {
    d->free_slots.push_back(slot);
    return seterr(e);
  }
  return ssize_t(payload.size());
}

ssize_t ds_recv(Rs* rs, std::unique_lock<std::mutex>& lk, void* buf, size_t len, int flags, sockaddr* from,
                socklen_t* fromlen) {
  Ds* d = rs->ds;
  if (wait_ds(rs, lk, rs->nonblock(flags), [](Rs* r) { return !r->ds->queue.empty(); })) return -1;
  Datagram& g = d->queue.front();
  size_t n = g.offset >= 0 ? g.length : g.data.size();
  const uint8_t* p = g.offset >= 0 ? d->rbuf + g.offset : reinterpret_cast<const uint8_t*>(g.data.data());
  n = std::min(n, len);
  std::memcpy(buf, p, n);
  if (from && fromlen) {
    socklen_t l = len_of(reinterpret_cast<sockaddr*>(&g.from));
    std::memcpy(from, &g.from, std::min(*fromlen, l));
    *fromlen = l;
  }
  if (!(flags & MSG_PEEK)) {
    if (g.offset >= 0) repost(rs, d, uint32_t(g.offset / kMsg));
    d->queue.pop_front();
  }
  return ssize_t(n);
}

int wait_ds(Rs* rs, std::unique_lock<std::mutex>& lk, bool nonblock, bool (*test)(Rs*)) {
  Ds* d = rs->ds;
  for (;;) {
    ds_progress(rs);
    if (test(rs)) return 0;
    if (nonblock) return seterr(EWOULDBLOCK);
    if (d->cq && !d->armed) {
      ibv_req_notify_cq(d->cq, 0);
      d->armed = true;
      continue;
    }
    pollfd p[2] = {{d->udp, POLLIN, 0}, {d->cq ? d->cc->fd : -1, POLLIN, 0}};
    lk.unlock();
    ::poll(p, 2, 1000);
    lk.lock();
  }
}

short ds_revents(Rs* rs, short events, std::vector<pollfd>* wait) {
  Ds* d = rs->ds;
  ds_progress(rs);
  short rev = 0;
  if ((events & POLLIN) && !d->queue.empty()) rev |= POLLIN;
  if ((events & POLLOUT) && (!d->cq || !d->free_slots.empty())) rev |= POLLOUT;
  if (rev || !wait) return rev;
  if (d->cq && !d->armed) {
    ibv_req_notify_cq(d->cq, 0);
    d->armed = true;
    ds_progress(rs);
    if ((events & POLLIN) && !d->queue.empty()) return POLLIN;
  }
  wait->push_back(pollfd{d->udp, POLLIN, 0});
  if (d->cq) wait->push_back(pollfd{d->cc->fd, POLLIN, 0});
  return 0;
}

}  // namespace sv::rsock
