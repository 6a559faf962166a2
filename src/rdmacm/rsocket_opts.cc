// rsocket_opts.cc: rsetsockopt/rgetsockopt/rfcntl (rsocket.c's, the same
// options and the same quirks: SO_RCVBUF/SO_SNDBUF double the value and
// apply until the buffers exist, SOL_RDMA options only before connecting)
// and riomap/riounmap/riowrite (rsocket.c's iomap: a PROT_WRITE mapping is
// written into the peer's iomap table at the next send; riowrite is an RDMA
// WRITE into the peer's mapping, with no completion at the peer).
#include <netinet/tcp.h>
#include <rdma/rsocket.h>
#include <stdarg.h>
#include <sys/mman.h>

#include <algorithm>
#include <cerrno>

#include "rdmacm/rsocket_internal.h"

namespace sv::rsock {
namespace {

int set_flag(uint64_t* opts, int optname, bool on) {
  if (on) *opts |= uint64_t(1) << optname;
  else *opts &= ~(uint64_t(1) << optname);
  return 0;
}

bool flag(uint64_t opts, int optname) { return (opts >> optname) & 1; }

int int_opt(const void* v, socklen_t len, int* out) {
  if (!v || len < sizeof(int)) return seterr(EINVAL);
  std::memcpy(out, v, sizeof(int));
  return 0;
}

int set_socket_opt(Rs* rs, int optname, const void* v, socklen_t len) {
  int x = 0;
  switch (optname) {
    case SO_REUSEADDR:
      if (int_opt(v, len, &x)) return -1;
      rdma_set_option(rs->id, RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR, &x, sizeof(x));
      return set_flag(&rs->so_opts, optname, x);
    case SO_RCVBUF:
      if (int_opt(v, len, &x)) return -1;
      if (!rs->rbuf) rs->rbuf_size = std::max<uint32_t>(uint32_t(x) << 1, 2 * kSndLowat);
      return 0;
    case SO_SNDBUF:
      if (int_opt(v, len, &x)) return -1;
      if (!rs->sbuf) rs->sbuf_size = std::max<uint32_t>(uint32_t(x) << 1, 2 * kSndLowat);
      return 0;
    case SO_LINGER:
      if (!v || len < sizeof(linger)) return seterr(EINVAL);
      // Inverted as rsocket.c stores it, so that the default (0) is "on".
      return set_flag(&rs->so_opts, optname, !static_cast<const linger*>(v)->l_onoff);
    case SO_KEEPALIVE:
    case SO_OOBINLINE:
      if (int_opt(v, len, &x)) return -1;
      return set_flag(&rs->so_opts, optname, x);
    default:
      return seterr(ENOTSUP);
  }
}

int set_tcp_opt(Rs* rs, int optname, const void* v, socklen_t len) {
  int x = 0;
  switch (optname) {
    case TCP_NODELAY:
      if (int_opt(v, len, &x)) return -1;
      return set_flag(&rs->tcp_opts, optname, x);
    case TCP_KEEPIDLE:
      if (int_opt(v, len, &x)) return -1;
      if (x <= 0) return seterr(EINVAL);
      rs->keepalive_time = x;
      return 0;
    case TCP_MAXSEG:
    case TCP_KEEPCNT:
    case TCP_KEEPINTVL:
    case TCP_CONGESTION:
      return 0;  // n/a over a reliable connection
    default:
      return seterr(ENOTSUP);
  }
}

int set_rdma_opt(Rs* rs, int optname, const void* v, socklen_t len) {
  if (rs->rbuf || rs->opening()) return seterr(EINVAL);  // a listener passes them on
  int x = 0;
  if (optname == RDMA_ROUTE) return v && len ? 0 : seterr(EINVAL);  // one path on one host
  if (int_opt(v, len, &x)) return -1;
  uint16_t u = uint16_t(std::clamp<int>(x, 0, kQpMaxSize));
  switch (optname) {
    case RDMA_SQSIZE:
      rs->sq_size = u;
      return 0;
    case RDMA_RQSIZE:
      rs->rq_size = u;
      return 0;
    case RDMA_INLINE:
      rs->sq_inline = u;
      return 0;
    case RDMA_IOMAPSIZE:
      rs->iomap_size = uint16_t(scale_to_value(uint8_t(value_to_scale(std::clamp(x, 0, 0xFFFF), 8)), 8));
      return 0;
    default:
      return seterr(ENOTSUP);
  }
}

void put_int(void* v, socklen_t* len, int x) {
  std::memcpy(v, &x, sizeof(int));
  *len = sizeof(int);
}

int get_socket_opt(Rs* rs, int optname, void* v, socklen_t* len) {
  switch (optname) {
    case SO_REUSEADDR:
    case SO_KEEPALIVE:
    case SO_OOBINLINE:
      put_int(v, len, flag(rs->so_opts, optname));
      return 0;
    case SO_RCVBUF:
      put_int(v, len, int(rs->rbuf_size));
      return 0;
    case SO_SNDBUF:
      put_int(v, len, int(rs->sbuf_size));
      return 0;
    case SO_LINGER: {
      if (*len < sizeof(linger)) return seterr(EINVAL);
      linger l{!flag(rs->so_opts, optname), 0};
      std::memcpy(v, &l, sizeof(l));
      *len = sizeof(l);
      return 0;
    }
    case SO_ERROR:
      put_int(v, len, rs->err);
      rs->err = 0;
      return 0;
    case SO_TYPE:
      put_int(v, len, SOCK_STREAM);
      return 0;
    default:
      return seterr(ENOTSUP);
  }
}

int get_tcp_opt(Rs* rs, int optname, void* v, socklen_t* len) {
  switch (optname) {
    case TCP_NODELAY:
      put_int(v, len, flag(rs->tcp_opts, optname));
      return 0;
    case TCP_MAXSEG: {
      ibv_sa_path_rec* p = rs->id->route.num_paths ? rs->id->route.path_rec : nullptr;
      put_int(v, len, p ? 1 << (7 + p->mtu) : 2048);
      return 0;
    }
    case TCP_KEEPIDLE:
      put_int(v, len, rs->keepalive_time);
      return 0;
    case TCP_KEEPCNT:
    case TCP_KEEPINTVL:
      put_int(v, len, 1);
      return 0;
    default:
      return seterr(ENOTSUP);
  }
}

int get_rdma_opt(Rs* rs, int optname, void* v, socklen_t* len) {
  switch (optname) {
    case RDMA_SQSIZE:
      put_int(v, len, rs->sq_size);
      return 0;
    case RDMA_RQSIZE:
      put_int(v, len, rs->rq_size);
      return 0;
    case RDMA_INLINE:
      put_int(v, len, rs->sq_inline);
      return 0;
    case RDMA_IOMAPSIZE:
      put_int(v, len, rs->iomap_size);
      return 0;
    case RDMA_ROUTE: {
      // The route as ibv_path_data entries (rsocket.c's rs_convert_sa_path).
      socklen_t n = 0;
      auto* out = static_cast<ibv_path_data*>(v);
      for (int i = 0; i < rs->id->route.num_paths && n + sizeof(ibv_path_data) <= *len; i++) {
        ibv_path_data d{};
        d.flags = IBV_PATH_FLAG_GMP | IBV_PATH_FLAG_PRIMARY | IBV_PATH_FLAG_BIDIRECTIONAL;
        const ibv_sa_path_rec& r = rs->id->route.path_rec[i];
        std::memcpy(&d.path.dgid, &r.dgid, 16);
        std::memcpy(&d.path.sgid, &r.sgid, 16);
        d.path.dlid = r.dlid;
        d.path.slid = r.slid;
        d.path.pkey = r.pkey;
        std::memcpy(out + i, &d, sizeof(d));
        n += sizeof(ibv_path_data);
      }
      if (*len < sizeof(ibv_path_data)) return seterr(EINVAL);
      *len = n;
      return 0;
    }
    default:
      return seterr(ENOTSUP);
  }
}

// The peer's iomap entry that holds `offset` (rsocket.c's rs_find_iomap).
volatile Iomap* find_iomap(Rs* rs, uint64_t offset) {
  volatile Iomap* t = rs->target_iomap();
  for (int i = 0; i < rs->iomap_size; i++)
    if (t[i].sge.length && offset >= t[i].offset && offset < t[i].offset + t[i].sge.length) return t + i;
  return nullptr;
}

}  // namespace
}  // namespace sv::rsock

using namespace sv::rsock;

extern "C" {

int rsetsockopt(int s, int level, int optname, const void* optval, socklen_t optlen) {
  Rs* rs = lookup(s);
  if (!rs) return seterr(EBADF);
  std::lock_guard<std::mutex> g(rs->mu);
  int x = 0;
  if (rs->ds && level != SOL_RDMA) {
    // The UDP socket's, and (as rsocket.c) the buffer sizes for the QP.
    if (ds_setsockopt(rs, level, optname, optval, optlen)) return -1;
    if (level != SOL_SOCKET || (optname != SO_RCVBUF && optname != SO_SNDBUF)) return 0;
  }
  switch (level) {
    case SOL_SOCKET:
      return set_socket_opt(rs, optname, optval, optlen);
    case IPPROTO_TCP:
      return set_tcp_opt(rs, optname, optval, optlen);
    case IPPROTO_IPV6:
      if (optname != IPV6_V6ONLY) return seterr(ENOTSUP);
      if (int_opt(optval, optlen, &x)) return -1;
      rdma_set_option(rs->id, RDMA_OPTION_ID, RDMA_OPTION_ID_AFONLY, &x, sizeof(x));
      return set_flag(&rs->ipv6_opts, optname, x);
    case SOL_RDMA:
      return set_rdma_opt(rs, optname, optval, optlen);
    default:
      return seterr(ENOTSUP);
  }
}

int rgetsockopt(int s, int level, int optname, void* optval, socklen_t* optlen) {
  Rs* rs = lookup(s);
  if (!rs) return seterr(EBADF);
  if (!optval || !optlen || *optlen < sizeof(int)) return seterr(EINVAL);
  std::lock_guard<std::mutex> g(rs->mu);
  if (rs->ds && level != SOL_RDMA) return ds_getsockopt(rs, level, optname, optval, optlen);
  if (rs->ds && optname == RDMA_ROUTE) return seterr(ENOTSUP);
  switch (level) {
    case SOL_SOCKET:
      return get_socket_opt(rs, optname, optval, optlen);
    case IPPROTO_TCP:
      return get_tcp_opt(rs, optname, optval, optlen);
    case IPPROTO_IPV6:
      if (optname != IPV6_V6ONLY) return seterr(ENOTSUP);
      put_int(optval, optlen, flag(rs->ipv6_opts, optname));
      return 0;
    case SOL_RDMA:
      return get_rdma_opt(rs, optname, optval, optlen);
    default:
      return seterr(ENOTSUP);
  }
}

int rfcntl(int s, int cmd, ...) {
  Rs* rs = lookup(s);
  if (!rs) return seterr(EBADF);
  std::lock_guard<std::mutex> g(rs->mu);
  va_list ap;
  va_start(ap, cmd);
  int ret = 0;
  switch (cmd) {
    case F_GETFL:
      ret = rs->fs_flags | O_RDWR;
      break;
    case F_SETFL:
      rs->fs_flags = va_arg(ap, int) & ~O_ACCMODE;
      break;
    case F_GETFD:
      ret = rs->fd_flags;
      break;
    case F_SETFD:
      rs->fd_flags = va_arg(ap, int);
      break;
    default:
      ret = seterr(ENOTSUP);
  }
  va_end(ap);
  return ret;
}

// rsocket.c's riomap: offset -1 maps at the buffer's address.
off_t riomap(int s, void* buf, size_t len, int prot, int, off_t offset) {
  Rs* rs = lookup(s);
  if (!rs) return seterr(EBADF);
  std::lock_guard<std::mutex> g(rs->mu);
  if (rs->ds || !rs->id->pd || (prot & ~(PROT_WRITE | PROT_NONE))) return seterr(EINVAL);
  IoMr m;
  if (prot & PROT_WRITE) {
    std::vector<bool> used(rs->remote_iomap.length, false);
    for (const IoMr& o : rs->iomaps)
      if (o.index >= 0) used[size_t(o.index)] = true;
    auto it = std::find(used.begin(), used.end(), false);
    if (it == used.end()) return seterr(ENOMEM);
    m.index = int(it - used.begin());
  }
  int access = IBV_ACCESS_LOCAL_WRITE | ((prot & PROT_WRITE) ? IBV_ACCESS_REMOTE_WRITE : 0);
  if (!(m.mr = ibv_reg_mr(rs->id->pd, buf, len, access))) return -1;
  m.offset = offset == -1 ? uint64_t(uintptr_t(buf)) : uint64_t(offset);
  rs->iomaps.push_back(m);
  if (m.index >= 0) rs->iomap_pending = true;
  return off_t(m.offset);
}

int riounmap(int s, void* buf, size_t len) {
  Rs* rs = lookup(s);
  if (!rs) return seterr(EBADF);
  std::lock_guard<std::mutex> g(rs->mu);
  for (auto it = rs->iomaps.begin(); it != rs->iomaps.end(); ++it) {
    if (it->mr->addr == buf && it->mr->length == len) {
      ibv_dereg_mr(it->mr);
      rs->iomaps.erase(it);
      return 0;
    }
  }
  return seterr(EINVAL);
}

// rsocket.c's riowrite: RDMA WRITEs (no immediate) into the peer's mapping.
size_t riowrite(int s, const void* buf, size_t count, off_t offset, int flags) {
  Rs* rs = lookup(s);
  if (!rs) return size_t(seterr(EBADF));
  std::unique_lock<std::mutex> lk(rs->mu);
  if (rs->ds) return size_t(seterr(EOPNOTSUPP));
  if (!rs->connected()) return size_t(seterr(ENOTCONN));
  if (rs->iomap_pending && send_iomaps(rs, lk, flags)) return size_t(-1);
  size_t left = count;
  uint32_t olen = kOlapStart;
  iovec v{const_cast<void*>(buf), count};
  const iovec* cur = &v;
  size_t off = 0;
  int r = 0;
  while (left) {
    uint64_t at = uint64_t(offset) + (count - left);
    volatile Iomap* m = find_iomap(rs, at);
    if (!m) break;
    if (!can_send(rs)) {
      if ((r = wait_for(rs, lk, rs->nonblock(flags), conn_can_send))) break;
      if (!rs->writable) {
        r = seterr(ECONNRESET);
        break;
      }
    }
    uint32_t x = next_xfer(&olen, left, rs->sbuf_avail, uint32_t(m->offset + m->sge.length - at));
    rs->sqe_avail--;
    rs->sbuf_avail -= x;
    uint64_t addr = m->sge.addr + at - m->offset;
    if ((r = copy_and_post(rs, &cur, &off, x, msg_set(kOpWrite, x), addr, m->sge.key, false))) break;
    left -= x;
  }
  return (r && left == count) ? size_t(-1) : count - left;
}

}  // extern "C"
