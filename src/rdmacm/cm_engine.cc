// cm_engine.cc: the engine thread of the drop-in librdmacm (epoll on the
// rendezvous sockets, the CM gateway's connections and the device's async
// fd; the ids' timers) and the event queues of the channels. See cm_state.h.
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
#include "common/started_thread.h"
#include "rdmacm/cm_msg.h"
#include "rdmacm/cm_state.h"
#include "rdmacm/cm_trace.h"

using namespace sv::rdmacm;

namespace sv::rdmacm::detail {

Global& g = *new Global;

namespace {
void engine_loop();
}  // namespace

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


void start_engine() {
  std::call_once(g.started, [] {
    g.ep = ::epoll_create1(EPOLL_CLOEXEC);
    g.wake = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = g.wake;
    ::epoll_ctl(g.ep, EPOLL_CTL_ADD, g.wake, &ev);
    g.fds[g.wake] = {FdKind::kWake, 0};
    sv::started_thread(engine_loop).detach();
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

namespace {

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
        forget_held_request(ref.serial, fd);
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

void on_timer(const Timer& t) {
  Id* d = find(t.serial);
  // (a held REQ's timer outlives other timers' cancelling: it refuses only
  // what waited its whole grace)
  if (!d || (d->timer_gen != t.gen && t.kind != TimerKind::kHeldReq)) return;
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
    case TimerKind::kHeldReq:
      refuse_held_requests(d, false);
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


}  // namespace

}  // namespace sv::rdmacm::detail
