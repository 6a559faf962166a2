// A thread that has started by the time its creator goes on.
//
// Starting a thread allocates (its stack bounds, its TLS; under a sanitizer
// also the sanitizer's own thread state). A process that forks while one of
// its threads is still inside that start-up hands the child a copy of the
// allocator with a lock held: the child then hangs in its first allocation of
// that size if the allocator has no fork handler (GCC 12's AddressSanitizer
// has none; Srq.TwoQpsFromTwoProcessesShareOneSrqAndTheLimitFires hung so in
// CI: a forked peer's own watchdog thread waited forever on the lock the
// parent's watchdog held while starting). The library's threads therefore
// are running their own code, which does not allocate, before the call that
// started them returns: a fork after ibv_open_device is safe.
//
// They also take none of the application's signals: each starts with every
// signal blocked but those a fault raises (it inherits its creator's mask,
// set for the moment of its creation). A signal sent to the process goes to
// any thread that does not block it (signal(7)); ibv_get_cq_event blocks
// signals while it spins (cq.cc), so a library thread that did not would
// take the application's SIGALRM then, run its handler there, and leave the
// application's thread asleep in the read that follows.
#pragma once

#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <thread>
#include <utility>

namespace sv {

template <class F>
std::thread started_thread(F f) {
  std::atomic<bool> running{false};
  sigset_t held, caller;
  sigfillset(&held);
  for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP}) sigdelset(&held, sig);
  pthread_sigmask(SIG_BLOCK, &held, &caller);
  std::thread t([&running, f = std::move(f)]() mutable {
    running.store(true, std::memory_order_release);  // its last touch of `running`
    f();
  });
  pthread_sigmask(SIG_SETMASK, &caller, nullptr);
  while (!running.load(std::memory_order_acquire)) std::this_thread::yield();
  return t;
}

}  // namespace sv
