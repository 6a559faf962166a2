// The progress thread: retries work requests that wait on an RNR NAK or a
// transport timeout, so they complete (or fail) even while the application
// only sleeps in ibv_get_cq_event. Started on first use.
//
// Lock order: the registry mutex, then a QP's send lock. post_send never
// holds a send lock while registering.
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <set>
#include <span>
#include <thread>

#include "common/started_thread.h"
#include "verbs/provider.h"

namespace sv::verbs {
namespace {

struct Progress {
  std::mutex mu;
  std::condition_variable cv;
  std::set<ProcessQp*> qps;
  bool started = false;

  void run() {
    std::unique_lock<std::mutex> lk(mu);
    for (;;) {
      if (qps.empty()) {
        cv.wait(lk);
        continue;
      }
      uint64_t now = monotonic_ns();
      uint64_t next = now + 1'000'000;  // look again within 1 ms at the latest
      for (auto it = qps.begin(); it != qps.end();) {
        ProcessQp* q = *it;
        q->hdr->send_lock.lock(self_pid());
        q->hdr->progress_pid.store(self_pid(), std::memory_order_relaxed);
        bool pending = progress_qp(*q);
        uint64_t when = q->next_try_ns;
        // Leave the QP under its send lock: a poster that queues a request
        // after our look then sees in_progress_list false once it unlocks,
        // and registers the QP again (cleared after the unlock, a request
        // queued in between waited for the next post).
        if (!pending) q->in_progress_list = false;
        q->hdr->send_lock.unlock();
        if (!pending) {
          it = qps.erase(it);
        } else {
          next = std::min(next, std::max(when, now + 5'000));
          ++it;
        }
      }
      cv.wait_for(lk, std::chrono::nanoseconds(next - now));
    }
  }
};

Progress& progress() {
  static Progress* p = new Progress;  // lives until exit; the thread is detached
  return *p;
}

}  // namespace

void progress_register(ProcessQp* q) {
  Progress& p = progress();
  std::lock_guard<std::mutex> g(p.mu);
  q->in_progress_list = true;
  p.qps.insert(q);
  if (!p.started) {
    p.started = true;
    started_thread([&p] { p.run(); }).detach();
  }
  p.cv.notify_one();
}

namespace {

// Read without the send lock: the process that left is gone, so what it
// left is in memory already; a live poster that queues after this look
// registers the QP with its own progress thread (post_queue). A QP of a
// thread domain is not taken: no other process holds it (it cannot be
// imported), and only its poster may put it on the list (post_queue posts
// to it without the lock while it is off the list).
bool has_work(const ProcessQp& q) {
  if (!q.hdr || q.lockless) return false;
  return !q.sq.empty() || q.hdr->sq_running.load(std::memory_order_acquire) ||
         q.hdr->torn_qpn.load(std::memory_order_acquire) || q.hdr->med_pid.load(std::memory_order_acquire);
}

// Is the QP's work this process's to take over? Only if the process that
// last posted or carried out its queue (progress_pid) is one that left, or
// is gone: a live one's progress thread has it already (another progress
// thread beside it only contends for the send lock). The claim moves
// progress_pid to this process, so of several survivors one takes it.
bool claim(ProcessQp& q, std::span<const uint32_t> gone) {
  uint32_t p = q.hdr->progress_pid.load(std::memory_order_acquire);
  const bool left = p == 0 || std::find(gone.begin(), gone.end(), p) != gone.end() || !shm::ShmLock::alive(p);
  return left && q.hdr->progress_pid.compare_exchange_strong(p, self_pid(), std::memory_order_acq_rel);
}

}  // namespace

// The progress lock, then the context's (the order the progress thread
// takes them in: a step may look up a key's window under the context lock).
// A QP found in the context's handles under its lock is not freed before
// its destroyer has unregistered it, which waits for the progress lock.
void progress_adopt(ContextState& st, std::span<const uint32_t> gone) {
  Progress& p = progress();
  std::lock_guard<std::mutex> g(p.mu);
  bool any = false;
  {
    std::lock_guard<std::mutex> c(st.mu);
    for (auto& [qpn, qp] : st.qp_handles) {
      ProcessQp* q = qp->st;
      if (!has_work(*q) || !claim(*q, gone)) continue;
      q->in_progress_list = true;
      p.qps.insert(q);
      any = true;
    }
  }
  if (!any) return;
  if (!p.started) {
    p.started = true;
    started_thread([&p] { p.run(); }).detach();
  }
  p.cv.notify_one();
}

void progress_unregister(ProcessQp* q) {
  Progress& p = progress();
  std::lock_guard<std::mutex> g(p.mu);
  p.qps.erase(q);
}

}  // namespace sv::verbs
