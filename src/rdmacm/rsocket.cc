// rsocket.cc: the rsocket API (rsocket(7), rdma-core's <rdma/rsocket.h>)
// over our own rdma_cm and verbs: the socket calls, connection set-up and
// tear-down. The data path is rsocket_stream.cc, rpoll/rselect
// rsocket_poll.cc, options and riomap rsocket_opts.cc.
//
// Connection set-up mirrors rdma-core's rsocket.c (rs_do_connect,
// rs_accept): the connect REQ and the REP carry struct rs_conn_data (see
// rsocket_proto.h). Unlike rsocket.c, every id has its own event channel
// (async ids) and no service thread: a listener takes its CONNECT_REQUESTs
// in raccept or rpoll, and the passive side accepts at raccept.
// SOCK_DGRAM (rsocket.c's UD "ds_" sockets): rsocket_dgram.cc.
#include <poll.h>
#include <rdma/rsocket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <unordered_map>

#include "rdmacm/rsocket_internal.h"

namespace sv::rsock {

namespace {
std::mutex table_mu;
std::unordered_map<int, Rs*>& table() {
  static auto* t = new std::unordered_map<int, Rs*>;
  return *t;
}

socklen_t sa_len(const sockaddr* a) { return a->sa_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in); }

void copy_addr(sockaddr* dst, const sockaddr* src, socklen_t* len) {
  socklen_t n = sa_len(src);
  std::memcpy(dst, src, std::min(*len, n));
  *len = n;
}

// Waits for the next CM event of rs's channel; nullptr (errno) if none
// (EWOULDBLOCK when nonblocking).
rdma_cm_event* next_event(Rs* rs, std::unique_lock<std::mutex>& lk, bool nonblock) {
  for (;;) {
    rdma_cm_event* e;
    if (!rdma_get_cm_event(rs->ch, &e)) return e;
    if (errno != EAGAIN && errno != EINTR) return nullptr;
    if (nonblock) {
      errno = EWOULDBLOCK;
      return nullptr;
    }
    pollfd p{rs->ch->fd, POLLIN, 0};
    lk.unlock();
    ::poll(&p, 1, 1000);
    lk.lock();
  }
}

int event_errno(const rdma_cm_event* e) {
  switch (e->event) {
    case RDMA_CM_EVENT_REJECTED:
      return ECONNREFUSED;
    case RDMA_CM_EVENT_ADDR_ERROR:
    case RDMA_CM_EVENT_ROUTE_ERROR:
      return e->status ? std::abs(e->status) : EHOSTUNREACH;
    case RDMA_CM_EVENT_UNREACHABLE:
      return ETIMEDOUT;
    default:
      return e->status ? std::abs(e->status) : ECONNREFUSED;
  }
}

// The active side's last step (rsocket.c's rs_do_connect, ROUTE_RESOLVED
// .. rdma_connect): the endpoint and the REQ's private data.
int start_connect(Rs* rs) {
  if (create_ep(rs)) return -1;
  ConnData cd;
  encode_conn(my_conn_info(rs), &cd);
  rdma_conn_param p{};
  p.private_data = &cd;
  p.private_data_len = sizeof(cd);
  p.flow_control = 1;
  p.retry_count = 7;
  p.rnr_retry_count = 7;
  p.responder_resources = 1;
  p.initiator_depth = 1;
  if (rdma_connect(rs->id, &p)) return -1;
  rs->state = St::kConnecting;
  return 0;
}

// One CM event of a connecting rsocket; 1 when connected, 0 to go on.
int connect_step(Rs* rs, rdma_cm_event* e) {
  int r = 0;
  switch (e->event) {
    case RDMA_CM_EVENT_ADDR_RESOLVED:
      r = rdma_resolve_route(rs->id, 2000);
      if (!r) rs->state = St::kResolvingRoute;
      break;
    case RDMA_CM_EVENT_ROUTE_RESOLVED:
      r = start_connect(rs);
      break;
    case RDMA_CM_EVENT_ESTABLISHED: {
      ConnInfo peer;
      if (!decode_conn(e->param.conn.private_data, e->param.conn.private_data_len, &peer)) {
        r = seterr(ENOTSUP);
        break;
      }
      save_conn(rs, peer);
      rs->state = St::kConnected;
      rs->readable = rs->writable = true;
      rdma_ack_cm_event(e);
      return 1;
    }
    default:
      r = seterr(event_errno(e));
      break;
  }
  rdma_ack_cm_event(e);
  return r;
}

}  // namespace

Rs* lookup(int fd) {
  std::lock_guard<std::mutex> g(table_mu);
  auto it = table().find(fd);
  return it == table().end() ? nullptr : it->second;
}

void insert(Rs* rs) {
  std::lock_guard<std::mutex> g(table_mu);
  table()[rs->fd] = rs;
}

void remove(Rs* rs) {
  std::lock_guard<std::mutex> g(table_mu);
  table().erase(rs->fd);
}

// Drives a connect on (rs_do_connect): 0 connected, -1 EINPROGRESS when
// nonblocking and not there yet, -1 errno on failure (the state is then
// kConnectError and SO_ERROR tells the error).
int advance_connect(Rs* rs, std::unique_lock<std::mutex>& lk, bool nonblock) {
  while (rs->opening()) {
    rdma_cm_event* e = next_event(rs, lk, nonblock);
    if (!e) {
      if (errno == EWOULDBLOCK) return seterr(EINPROGRESS);
      break;
    }
    int r = connect_step(rs, e);
    if (r == 1) return 0;
    if (r < 0) break;
  }
  if (rs->connected()) return 0;
  if (rs->state == St::kConnectError) return seterr(rs->err);
  if (!rs->opening()) {
    if (rs->state == St::kDisconnected || rs->state == St::kError) return seterr(ECONNRESET);
  }
  rs->err = errno ? errno : ECONNREFUSED;
  rs->state = St::kConnectError;
  return seterr(rs->err);
}

int poll_listener(Rs* rs) {
  rdma_cm_event* e;
  while (!rdma_get_cm_event(rs->ch, &e)) {
    if (e->event == RDMA_CM_EVENT_CONNECT_REQUEST) rs->requests.push_back(e);
    else rdma_ack_cm_event(e);
  }
  return int(rs->requests.size());
}

namespace {

// rsocket.c's rs_accept, on our own thread: the child gets its own
// channel, its endpoint, and the REP with our rs_conn_data.
Rs* accept_one(Rs* l, rdma_cm_event* e) {
  rdma_cm_id* cid = e->id;
  ConnInfo peer;
  bool ok = decode_conn(e->param.conn.private_data, e->param.conn.private_data_len, &peer);
  rdma_conn_param req = e->param.conn;
  rdma_ack_cm_event(e);
  Rs* rs = alloc_rs(l, l->domain);
  rs->id = cid;
  cid->context = rs;
  rs->ch = rdma_create_event_channel();
  if (!ok || !rs->ch || rdma_migrate_id(cid, rs->ch) || create_ep(rs)) {
    rdma_reject(cid, nullptr, 0);
    free_rs(rs);
    return nullptr;
  }
  ::fcntl(rs->ch->fd, F_SETFL, ::fcntl(rs->ch->fd, F_GETFL) | O_NONBLOCK);
  rs->fd = rs->ch->fd;
  save_conn(rs, peer);
  ConnData cd;
  encode_conn(my_conn_info(rs), &cd);
  rdma_conn_param p{};
  p.private_data = &cd;
  p.private_data_len = sizeof(cd);
  p.responder_resources = std::min<uint8_t>(req.responder_resources, 1);
  p.initiator_depth = std::min<uint8_t>(req.initiator_depth, 1);
  p.flow_control = 1;
  p.rnr_retry_count = 7;
  if (rdma_accept(cid, &p)) {
    free_rs(rs);
    return nullptr;
  }
  rs->state = St::kConnected;
  rs->readable = rs->writable = true;
  return rs;
}

}  // namespace

}  // namespace sv::rsock

using namespace sv::rsock;

extern "C" {

int rsocket(int domain, int type, int protocol) {
  int st = type & ~(SOCK_CLOEXEC | SOCK_NONBLOCK);
  if (domain != AF_INET && domain != AF_INET6) return seterr(EAFNOSUPPORT);
  bool dgram = st == SOCK_DGRAM && (!protocol || protocol == IPPROTO_UDP);
  if (!dgram && (st != SOCK_STREAM || (protocol && protocol != IPPROTO_TCP))) return seterr(EPROTONOSUPPORT);
  Rs* rs = alloc_rs(nullptr, domain);
  rs->fs_flags = (type & SOCK_NONBLOCK) ? O_NONBLOCK : 0;
  rs->fd_flags = (type & SOCK_CLOEXEC) ? FD_CLOEXEC : 0;
  if (dgram) {
    rs->type = SOCK_DGRAM;
    if (ds_socket(rs)) {
      int e = errno;
      free_rs(rs);
      return seterr(e);
    }
    insert(rs);
    return rs->fd;
  }
  if (!(rs->ch = rdma_create_event_channel()) || rdma_create_id(rs->ch, &rs->id, rs, RDMA_PS_TCP)) {
    int e = errno;
    free_rs(rs);
    return seterr(e);
  }
  ::fcntl(rs->ch->fd, F_SETFL, ::fcntl(rs->ch->fd, F_GETFL) | O_NONBLOCK);
  rs->fd = rs->ch->fd;
  insert(rs);
  return rs->fd;
}

int rbind(int s, const sockaddr* addr, socklen_t len) {
  Rs* rs = lookup(s);
  if (!rs) return seterr(EBADF);
  std::lock_guard<std::mutex> g(rs->mu);
  if (rs->ds) return ds_bind(rs, addr, len);
  if (rs->state != St::kInit) return seterr(EINVAL);
  if (rdma_bind_addr(rs->id, const_cast<sockaddr*>(addr))) return -1;
  rs->state = St::kBound;
  return 0;
}

int rlisten(int s, int backlog) {
  Rs* rs = lookup(s);
  if (!rs) return seterr(EBADF);
  std::lock_guard<std::mutex> g(rs->mu);
  if (rs->ds) return seterr(EOPNOTSUPP);
  if (rs->state == St::kListening) return 0;
  if (rdma_listen(rs->id, backlog)) return -1;
  rs->state = St::kListening;
  return 0;
}

int raccept(int s, sockaddr* addr, socklen_t* addrlen) {
  Rs* rs = lookup(s);
  if (!rs) return seterr(EBADF);
  std::unique_lock<std::mutex> lk(rs->mu);
  if (rs->ds) return seterr(EOPNOTSUPP);
  if (rs->state != St::kListening) return seterr(EINVAL);
  for (;;) {
    if (rs->requests.empty() && !poll_listener(rs)) {
      if (rs->nonblock(0)) return seterr(EAGAIN);
      pollfd p{rs->ch->fd, POLLIN, 0};
      lk.unlock();
      ::poll(&p, 1, 1000);
      lk.lock();
      continue;
    }
    rdma_cm_event* e = rs->requests.front();
    rs->requests.pop_front();
    Rs* n = accept_one(rs, e);
    if (!n) continue;  // a bad request is rejected, as rs_accept does
    insert(n);
    if (addr && addrlen) copy_addr(addr, rdma_get_peer_addr(n->id), addrlen);
    return n->fd;
  }
}

int rconnect(int s, const sockaddr* addr, socklen_t len) {
  Rs* rs = lookup(s);
  if (!rs) return seterr(EBADF);
  std::unique_lock<std::mutex> lk(rs->mu);
  if (rs->ds) return ds_connect(rs, addr, len);
  if (rs->connected()) return seterr(EISCONN);
  if (rs->state == St::kInit || rs->state == St::kBound) {
    if (rdma_resolve_addr(rs->id, nullptr, const_cast<sockaddr*>(addr), 2000)) return -1;
    rs->state = St::kResolvingAddr;
  } else if (!rs->opening()) {
    return seterr(rs->state == St::kListening ? EINVAL : ECONNREFUSED);
  } else if (rs->nonblock(0)) {
    return seterr(EALREADY);
  }
  return advance_connect(rs, lk, rs->nonblock(0));
}

// rsocket.c's rshutdown: a SHUTDOWN or DISCONNECT message, then the sends
// drain.
int rshutdown(int s, int how) {
  Rs* rs = lookup(s);
  if (!rs) return seterr(EBADF);
  std::unique_lock<std::mutex> lk(rs->mu);
  if (rs->ds) {
    if (how != SHUT_WR) rs->readable = false;
    if (how != SHUT_RD) rs->writable = false;
    return 0;
  }
  if (!rs->connected()) return rs->state == St::kDisconnected ? 0 : seterr(ENOTCONN);
  uint32_t ctrl;
  if (how == SHUT_RDWR) {
    ctrl = kCtrlDisconnect;
    rs->readable = rs->writable = false;
  } else if (how == SHUT_WR) {
    rs->writable = false;
    ctrl = rs->readable ? kCtrlShutdown : kCtrlDisconnect;
  } else {
    rs->readable = false;
    if (rs->writable) return 0;
    ctrl = kCtrlDisconnect;
  }
  if (!ctrl_avail(rs)) wait_for(rs, lk, false, [](Rs* r) { return ctrl_avail(r) || !r->connected(); });
  int ret = 0;
  if (rs->connected() && ctrl_avail(rs)) ret = post_ctrl(rs, msg_set(kOpCtrl, ctrl));
  if (rs->connected()) wait_for(rs, lk, false, all_sends_done);
  if (!rs->connected()) rdma_disconnect(rs->id);
  return ret;
}

int rclose(int s) {
  Rs* rs = lookup(s);
  if (!rs) return seterr(EBADF);
  if (rs->connected() && !rs->ds) rshutdown(s, SHUT_RDWR);
  remove(rs);
  if (rs->state == St::kDisconnected || rs->state == St::kError) rdma_disconnect(rs->id);
  free_rs(rs);
  return 0;
}

ssize_t rsendmsg(int s, const msghdr* msg, int flags) {
  if (msg->msg_control && msg->msg_controllen) return seterr(ENOTSUP);
  Rs* rs = lookup(s);
  if (!rs) return seterr(EBADF);
  std::unique_lock<std::mutex> lk(rs->mu);
  if (rs->ds) return ds_send(rs, lk, msg->msg_iov, int(msg->msg_iovlen), flags, static_cast<const sockaddr*>(msg->msg_name));
  if (rs->opening() && advance_connect(rs, lk, rs->nonblock(flags))) {
    if (errno == EINPROGRESS) errno = EAGAIN;
    return -1;
  }
  return stream_send(rs, lk, msg->msg_iov, int(msg->msg_iovlen), flags);
}

ssize_t rsend(int s, const void* buf, size_t len, int flags) {
  iovec v{const_cast<void*>(buf), len};
  msghdr m{};
  m.msg_iov = &v;
  m.msg_iovlen = 1;
  return rsendmsg(s, &m, flags);
}

ssize_t rsendto(int s, const void* buf, size_t len, int flags, const sockaddr* to, socklen_t tolen) {
  iovec v{const_cast<void*>(buf), len};
  msghdr m{};
  m.msg_iov = &v;
  m.msg_iovlen = 1;
  m.msg_name = const_cast<sockaddr*>(to);  // a stream socket ignores it
  m.msg_namelen = to ? tolen : 0;
  return rsendmsg(s, &m, flags);
}

ssize_t rwrite(int s, const void* buf, size_t count) { return rsend(s, buf, count, 0); }

ssize_t rwritev(int s, const iovec* iov, int iovcnt) {
  msghdr m{};
  m.msg_iov = const_cast<iovec*>(iov);
  m.msg_iovlen = size_t(iovcnt);
  return rsendmsg(s, &m, 0);
}

ssize_t rrecv(int s, void* buf, size_t len, int flags) { return rrecvfrom(s, buf, len, flags, nullptr, nullptr); }

namespace {
ssize_t stream_rrecv(int s, void* buf, size_t len, int flags) {
  Rs* rs = lookup(s);
  if (!rs) return seterr(EBADF);
  std::unique_lock<std::mutex> lk(rs->mu);
  if (rs->opening() && advance_connect(rs, lk, rs->nonblock(flags))) {
    if (errno == EINPROGRESS) errno = EAGAIN;
    return -1;
  }
  return stream_recv(rs, lk, buf, len, flags);
}

}  // namespace

ssize_t rrecvfrom(int s, void* buf, size_t len, int flags, sockaddr* src, socklen_t* srclen) {
  if (Rs* rs = lookup(s); rs && rs->ds) {
    std::unique_lock<std::mutex> lk(rs->mu);
    return ds_recv(rs, lk, buf, len, flags, src, srclen);
  }
  ssize_t n = stream_rrecv(s, buf, len, flags);
  if (n > 0 && src && srclen) rgetpeername(s, src, srclen);
  return n;
}

// All vectors are filled (rsocket.c's rrecvv fills only the first).
ssize_t rrecvmsg(int s, msghdr* msg, int flags) {
  if (msg->msg_control && msg->msg_controllen) return seterr(ENOTSUP);
  if (Rs* rs = lookup(s); rs && rs->ds) {  // one datagram, into the first vector
    if (!msg->msg_iovlen) return 0;
    std::unique_lock<std::mutex> lk(rs->mu);
    socklen_t* nl = msg->msg_name ? &msg->msg_namelen : nullptr;
    return ds_recv(rs, lk, msg->msg_iov[0].iov_base, msg->msg_iov[0].iov_len, flags, static_cast<sockaddr*>(msg->msg_name), nl);
  }
  ssize_t total = 0;
  for (size_t i = 0; i < msg->msg_iovlen; i++) {
    if (!msg->msg_iov[i].iov_len) continue;
    int f = total ? (flags | MSG_DONTWAIT) : flags;
    ssize_t n = rrecv(s, msg->msg_iov[i].iov_base, msg->msg_iov[i].iov_len, f);
    if (n < 0) return total ? total : n;
    total += n;
    if (size_t(n) < msg->msg_iov[i].iov_len) break;
  }
  msg->msg_flags = 0;
  return total;
}

ssize_t rread(int s, void* buf, size_t count) { return rrecv(s, buf, count, 0); }

ssize_t rreadv(int s, const iovec* iov, int iovcnt) {
  msghdr m{};
  m.msg_iov = const_cast<iovec*>(iov);
  m.msg_iovlen = size_t(iovcnt);
  return rrecvmsg(s, &m, 0);
}

int rgetpeername(int s, sockaddr* addr, socklen_t* addrlen) {
  Rs* rs = lookup(s);
  if (!rs) return seterr(EBADF);
  if (!addr || !addrlen) return seterr(EFAULT);
  if (rs->ds) return ds_name(rs, addr, addrlen, true);
  if (!rs->connected() && rs->state != St::kDisconnected) return seterr(ENOTCONN);
  copy_addr(addr, rdma_get_peer_addr(rs->id), addrlen);
  return 0;
}

int rgetsockname(int s, sockaddr* addr, socklen_t* addrlen) {
  Rs* rs = lookup(s);
  if (!rs) return seterr(EBADF);
  if (!addr || !addrlen) return seterr(EFAULT);
  if (rs->ds) return ds_name(rs, addr, addrlen, false);
  sockaddr* a = rdma_get_local_addr(rs->id);
  if (a->sa_family != AF_INET && a->sa_family != AF_INET6) {
    sockaddr_storage any{};
    any.ss_family = sa_family_t(rs->domain);
    copy_addr(addr, reinterpret_cast<sockaddr*>(&any), addrlen);
    return 0;
  }
  copy_addr(addr, a, addrlen);
  return 0;
}

}  // extern "C"
