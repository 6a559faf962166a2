// odp_copies.cc: see odp_copies.h.
#include "daemon/odp_copies.h"

#include <fcntl.h>

#include <chrono>
#include <system_error>
#include <thread>
#include <tuple>

namespace sv::daemon {

OdpCopies::OdpCopies(int done_fd) : s_(std::make_shared<Shared>()) {
  s_->done_fd.reset(::fcntl(done_fd, F_DUPFD_CLOEXEC, 0));
}

void OdpCopies::start(MediatedCopy c, uint64_t piece) {
  auto r = std::make_shared<Run>();
  r->uid = c.job->odp_uid();
  {
    std::lock_guard<std::mutex> g(s_->mu);
    int of_user = 0;
    for (const auto& o : s_->runs) of_user += o->uid == r->uid;  // abandoned ones too: their threads still run
    if (of_user >= kPerUser || s_->runs.size() >= size_t(kMaxThreads)) {
      s_->done.push_back(std::move(c));
      s_->done.back().job->failed = true;
      eventfd_signal(s_->done_fd.get());
      return;
    }
    r->c = std::move(c);
    s_->runs.push_back(r);
    if (s_->idle > int(s_->handed.size())) {  // a waiting thread takes it
      s_->handed.emplace_back(r, piece);
      s_->more.notify_one();
      return;
    }
  }
  try {
    std::thread(thread_body, s_, r, piece).detach();
  } catch (const std::system_error&) {
    std::lock_guard<std::mutex> g(s_->mu);
    s_->runs.remove(r);
    r->c.job->failed = true;
    s_->done.push_back(std::move(r->c));
    eventfd_signal(s_->done_fd.get());
  }
}

// The thread: the whole copy, a piece at a time (MediationJob::step checks
// the registrant's liveness and `revoked` before each, and lands a piece
// only while not revoked).
void OdpCopies::run(Shared& s, const std::shared_ptr<Run>& r, uint64_t piece) {
  MediationJob* job = r->c.job.get();
  while (job->step(piece)) {
  }
  std::lock_guard<std::mutex> g(s.mu);
  s.runs.remove(r);
  if (r->abandoned) return;
  s.done.push_back(std::move(r->c));
  eventfd_signal(s.done_fd.get());
}

// A copy thread: its first copy, then those handed to it while it waits
// (at most kIdleMs between two; at most kIdleThreads wait).
void OdpCopies::thread_body(std::shared_ptr<Shared> s, std::shared_ptr<Run> r, uint64_t piece) {
  for (;;) {
    run(*s, r, piece);
    r.reset();
    std::unique_lock<std::mutex> g(s->mu);
    if (s->idle >= kIdleThreads) return;
    ++s->idle;
    const bool got = s->more.wait_for(g, std::chrono::milliseconds(kIdleMs), [&] { return !s->handed.empty(); });
    --s->idle;
    if (!got) return;
    std::tie(r, piece) = std::move(s->handed.front());
    s->handed.pop_front();
  }
}

void OdpCopies::revoke(const std::function<bool(const MediationJob&)>& hit) {
  std::lock_guard<std::mutex> g(s_->mu);
  for (const auto& r : s_->runs) {
    if (r->abandoned || !hit(*r->c.job)) continue;
    MediationJob& job = *r->c.job;
    job.revoked.store(true, std::memory_order_release);
    // A piece landing now ends within this wait unless it is a write into
    // ODP memory held by its own fault; either way none starts after.
    if (job.land_mu.try_lock_for(std::chrono::milliseconds(50))) job.land_mu.unlock();
    r->abandoned = true;
    s_->done.push_back({r->c.client, r->c.h, job.failed_copy()});
  }
  eventfd_signal(s_->done_fd.get());
}

std::deque<MediatedCopy> OdpCopies::take_done() {
  std::deque<MediatedCopy> out;
  std::lock_guard<std::mutex> g(s_->mu);
  out.swap(s_->done);
  return out;
}

}  // namespace sv::daemon
