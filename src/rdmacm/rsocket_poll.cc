// rsocket_poll.cc: rpoll and rselect over a mix of rsockets and ordinary
// fds (rsocket.c's rpoll / rs_poll_rs / rselect). An rsocket that is not
// ready is waited for in poll(2) on its real fds: its CM event channel
// (connect, accept, disconnect) and, once connected, its completion
// channel, with the CQ armed. So rpoll sleeps when nothing is ready
// (rsocket.c spins for polling_time first; we do not).
#include <poll.h>
#include <rdma/rsocket.h>
#include <sys/select.h>
#include <time.h>

#include <algorithm>
#include <cerrno>
#include <vector>

#include "rdmacm/rsocket_internal.h"

namespace sv::rsock {

// rsocket.c's rs_poll_rs.
short poll_revents(Rs* rs, std::unique_lock<std::mutex>& lk, short events, bool slow) {
  if (rs->state == St::kListening) return poll_listener(rs) ? short(events & POLLIN) : 0;
  if (rs->opening()) {
    if (advance_connect(rs, lk, true) && errno == EINPROGRESS) return 0;
  }
  if (rs->state == St::kConnectError) return short((events & (POLLIN | POLLOUT)) | POLLERR);
  if (!rs->cq) return 0;
  progress(rs, slow);
  short rev = 0;
  if ((events & POLLIN) && conn_have_rdata(rs)) rev |= POLLIN;
  if ((events & POLLOUT) && can_send(rs)) rev |= POLLOUT;
  // rsocket.c says POLLHUP as soon as the peer's DISCONNECT is in, data
  // still queued or not; programs (rstream -T a's do_poll) then fail before
  // reading the last bytes. Like TCP, the data comes first: POLLHUP once
  // the queue is empty.
  if (!rs->connected() && (rs->state != St::kDisconnected || rs->ring.empty()))
    rev |= rs->state == St::kDisconnected ? POLLHUP : POLLERR;
  return rev;
}

namespace {

int64_t now_ms() { return now_us() / 1000; }

// The revents of one rsocket, else (if `arm`) its fds to wait on in
// `wait`; `soon` is set when the CQ could not be left armed (then poll only
// briefly). Without `arm`, only its completions are looked at (no system
// call: the spin before sleeping).
short check_rs(Rs* rs, short events, bool arm, std::vector<pollfd>* wait, bool* soon) {
  std::unique_lock<std::mutex> lk(rs->mu);
  if (rs->ds) return ds_revents(rs, events, arm ? wait : nullptr);
  if (!arm) return poll_revents(rs, lk, events, false);
  short rev = 0;
  for (int k = 0; k < 4; k++) {
    rev = poll_revents(rs, lk, events, true);
    if (rev || !rs->cq || rs->cq_armed) break;
    ibv_req_notify_cq(rs->cq, 0);
    rs->cq_armed = true;
  }
  if (rev) return rev;
  if (rs->cq && !rs->cq_armed) *soon = true;
  wait->push_back(pollfd{rs->ch->fd, POLLIN, 0});
  if (rs->cq) wait->push_back(pollfd{rs->cc->fd, POLLIN, 0});
  return 0;
}

}  // namespace

}  // namespace sv::rsock

using namespace sv::rsock;

extern "C" {

int rpoll(pollfd* fds, nfds_t nfds, int timeout) {
  int64_t deadline = timeout > 0 ? now_ms() + timeout : 0;
  int64_t spin_end = timeout ? now_us() + config().polling_us : 0;
  std::vector<pollfd> real, waits;
  std::vector<nfds_t> owner;  // fds index of each ordinary entry of `real`
  std::vector<Rs*> rss(nfds);
  bool all_rs = true;
  for (nfds_t i = 0; i < nfds; i++) {
    rss[i] = fds[i].fd >= 0 ? lookup(fds[i].fd) : nullptr;
    if (!rss[i]) all_rs = false;
  }
  for (;;) {
    int ready = 0;
    bool soon = false;
    // Spin (no arming, no system call) while only rsockets are polled.
    bool spin = all_rs && now_us() < spin_end;
    real.clear();
    owner.clear();
    waits.clear();
    for (nfds_t i = 0; i < nfds; i++) {
      fds[i].revents = 0;
      Rs* rs = rss[i];
      if (!rs) {
        real.push_back(fds[i]);
        owner.push_back(i);
        continue;
      }
      fds[i].revents = check_rs(rs, fds[i].events, !spin, &waits, &soon);
      if (fds[i].revents) ready++;
    }
    if (real.empty() && (ready || spin)) {
      if (ready) return ready;
      continue;
    }
    size_t ordinary = real.size();
    if (!ready) real.insert(real.end(), waits.begin(), waits.end());
    int t = timeout < 0 ? -1 : timeout == 0 ? 0 : int(std::max<int64_t>(0, deadline - now_ms()));
    if (ready || spin) t = 0;
    if (soon && (t < 0 || t > 1)) t = 1;
    int n = ::poll(real.data(), real.size(), t);
    if (n < 0) return -1;
    for (size_t j = 0; j < ordinary; j++) {
      fds[owner[j]].revents = real[j].revents;
      if (real[j].revents) ready++;
    }
    if (ready) return ready;
    if (timeout == 0 || (timeout > 0 && now_ms() >= deadline)) return 0;
  }
}

// rsocket.c's rs_select_to_poll / rs_poll_to_select.
int rselect(int nfds, fd_set* rd, fd_set* wr, fd_set* ex, timeval* tv) {
  std::vector<pollfd> p;
  for (int fd = 0; fd < nfds; fd++) {
    short ev = 0;
    if (rd && FD_ISSET(fd, rd)) ev |= POLLIN;
    if (wr && FD_ISSET(fd, wr)) ev |= POLLOUT;
    if (ex && FD_ISSET(fd, ex)) ev |= POLLPRI;
    if (ev) p.push_back(pollfd{fd, ev, 0});
  }
  int timeout = tv ? int(tv->tv_sec * 1000 + (tv->tv_usec + 999) / 1000) : -1;
  int n = rpoll(p.data(), p.size(), timeout);
  if (n < 0) return n;
  if (rd) FD_ZERO(rd);
  if (wr) FD_ZERO(wr);
  if (ex) FD_ZERO(ex);
  int count = 0;
  for (const pollfd& q : p) {
    if (rd && (q.events & POLLIN) && (q.revents & (POLLIN | POLLHUP | POLLERR))) {
      FD_SET(q.fd, rd);
      count++;
    }
    if (wr && (q.events & POLLOUT) && (q.revents & (POLLOUT | POLLERR))) {
      FD_SET(q.fd, wr);
      count++;
    }
    if (ex && (q.events & POLLPRI) && (q.revents & POLLPRI)) {
      FD_SET(q.fd, ex);
      count++;
    }
  }
  return count;
}

}  // extern "C"
