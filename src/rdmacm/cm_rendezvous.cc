// cm_rendezvous.cc: where ids of one host meet (unix SOCK_SEQPACKET
// sockets at $RUNTIME/cm/<port space>-<port>-<address>), port reservation
// (the system daemon's, or this user's own directory's),
// and the active side's connect (to a listener, or to the daemon's CM
// gateway for another host). See cm_state.h.
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
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/paths.h"
#include "softverbs/softverbs.h"
#include "rdmacm/addr.h"
#include "rdmacm/cm_msg.h"
#include "rdmacm/cm_state.h"
#include "rdmacm/cm_trace.h"
#include "rdmacm/device.h"
#include "rdmacm/rendezvous.h"

using namespace sv::rdmacm;

namespace sv::rdmacm::detail {

// --- the rendezvous directory -------------------------------------------------

namespace {

// Under this path nothing exists and no one but root could make anything:
// what a refused directory is replaced by.
constexpr const char* kNowhere = "/proc/self/fd/-1";

// `dir` once made if need be and checked as the user's (common/paths.h);
// a refused one is said on stderr and never used.
std::string checked(const std::string& dir) {
  sv::RunDir rd;
  std::string why;
  if (sv::ensure_runtime_dir(dir, rd, &why) == 0) return dir;
  sv::say_dir_problem(why);
  return kNowhere;
}

// The per-user daemon's directory, as the library finds it (one per network
// namespace, common/paths.h); SOFTVERBS_DIR if set. Looked up till a daemon
// has answered (a process does not change namespace under librdmacm), then
// kept.
std::string user_dir() {
  if (sv::runtime_dir_explicit()) return checked(sv::runtime_dir());
  static std::mutex mu;
  static std::string found;
  std::lock_guard<std::mutex> g(mu);
  if (!found.empty()) return found;
  std::string dir = checked(sv::resolve_runtime_dir());
  if (::access(sv::socket_path(dir).c_str(), F_OK) == 0) found = dir;
  return dir;
}

}  // namespace

// With the system daemon (SOFTVERBS_SYSTEM=1) every user's ids meet in its
// directory, which only the daemon writes (it holds the ports: daemon_bind):
// the port space is the host's, as on Linux. Otherwise the user's own
// directory.
std::string daemon_dir() { return sv::use_system_daemon() ? sv::system_dir() : user_dir(); }

namespace {

std::string cm_dir() {
  if (sv::use_system_daemon()) return sv::system_dir() + "/cm";
  std::string dir = user_dir();
  dir += "/cm";
  ::mkdir(dir.c_str(), 0700);
  return dir;
}

}  // namespace

std::string rendezvous_path(int ps, uint16_t port, const std::string& addr) {
  return cm_dir() + "/" + rendezvous_name(ps, port, addr);
}

namespace {

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

}  // namespace

bool path_exists(const std::string& p) { return ::access(p.c_str(), F_OK) == 0; }

namespace {

// With the system daemon the daemon holds the port (daemon/cm_ports.h): it
// decides who may have it and makes the listening socket in its directory,
// which no user writes. 0 and the socket, or an errno (said on stderr when
// it is a rule's: a privileged port, the user's quota).
int daemon_bind(int ps, sockaddr* sa, int& fd) {
  ibv_context* c = device();
  if (!c) return ENODEV;
  uint16_t port = 0;
  int e = svx_cm_bind(c, ps, sa, &port, &fd);
  if (e == EACCES)
    std::fprintf(stderr, "librdmacm: rdma_bind_addr to port %u: below 1024 only root may bind (EACCES)\n",
                 unsigned(addr_port(sa)));
  else if (e && e != EADDRINUSE)
    std::fprintf(stderr, "librdmacm: rdma_bind_addr: the daemon refused the port: %s\n", std::strerror(e));
  if (e) return e;
  set_port(sa, port);
  return 0;
}

}  // namespace

void release_bind(Id* d) {
  unwatch_close(d->bind_fd);
  d->bind_fd = -1;
  if (!d->daemon_port) {
    ::unlink(d->bind_path.c_str());
    return;
  }
  const auto* src = reinterpret_cast<const sockaddr*>(&d->id.route.addr.src_storage);
  if (ibv_context* c = device()) svx_cm_unbind(c, d->id.ps, src, addr_port(src));
  d->daemon_port = false;
}

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
  if (sv::use_system_daemon()) {
    if (int e = daemon_bind(ps, sa, fd)) return e;
    port = addr_port(sa);
    d->daemon_port = true;
  } else if (port) {
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
  // A specific address gives the device whose GID table holds it (Linux's
  // rdma_bind_addr). A loopback address gives none by default, as in Linux,
  // whose CM counts loopback as any address (cma_any_addr): the id gets its
  // device when it resolves, connects or is connected to. libfabric's verbs
  // provider needs that: it binds "localhost" and, with no device there,
  // offers the device's own addresses; with one it offers 127.0.0.1, which
  // its servers then hand to clients on other hosts. The opt-in
  // (loopback_bind_gives_device) gives sv0 with GID index 0
  // (::ffff:127.0.0.1) at the bind, for programs that read id->verbs after
  // binding 127.0.0.1 or ::1 (librpma's rpma_utils_get_ibv_context).
  if (!addr_is_any(sa) && (!addr_is_loopback(sa) || loopback_bind_gives_device())) {
    ibv_gid gid{};
    int idx = gid_index_of(sa, &gid);
    if (idx >= 0) {
      d->sgid_index = idx;
      d->id.route.addr.addr.ibaddr.sgid = gid;
      d->id.verbs = device();
      d->id.pd = default_pd();
      d->id.port_num = 1;
    }
  } else if (addr_is_loopback(sa)) {
    CM_TRACE("id %llu: loopback, no device until it connects (SOFTVERBS_CM_LOOPBACK_DEVICE=1: at the bind)",
             (unsigned long long)d->serial);
  }
  d->id.route.addr.addr.ibaddr.pkey = htobe16(0xffff);
  return 0;
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
  int last = ENOENT;
  const std::string dir = cm_dir();
  for (const std::string& name : listener_names(d->id.ps, port, addr_text(dst))) {
    sockaddr_un sun;
    if (!fill_sun(sun, dir + "/" + name)) continue;
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


}  // namespace sv::rdmacm::detail
