// mem_backing_signal.h: what MemBacking (mem_backing.cc) shares with its
// SIGSEGV handler (mem_backing_signal.cc): the range being converted or
// reverted, published in async-signal-safe atomics while the operation is in
// flight, so that a thread faulting on it waits and retries (seqlock-style:
// seq is odd while an operation is in flight). Internal to sv_membacking.
#pragma once

#include <signal.h>

#include <atomic>
#include <cstdint>

#include "raw_syscalls.h"

// Hidden: the handler and the converting thread reach these PC-relative,
// never through the GOT.
#define SV_MEMBACKING_INTERNAL __attribute__((visibility("hidden")))

namespace sv::membacking {

static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t) && std::atomic<uint32_t>::is_always_lock_free,
              "futex word must be a plain lock-free 32-bit integer");

// Everything the SIGSEGV handler reads, kept in one object so that a range
// can be checked against it (see can_park in mem_backing.cc).
struct alignas(64) SignalState {
  std::atomic<uint32_t> seq{0};  // odd while a conversion/revert is in flight
  std::atomic<uint32_t> waiters{0};  // handlers that may sleep on seq
  std::atomic<uintptr_t> begin{0};
  std::atomic<uintptr_t> end{0};
  std::atomic<uintptr_t> thread{0};  // thread doing the conversion/revert (self_thread)
  std::atomic<uintptr_t> page{4096};
  struct sigaction prev {};  // written once, before our handler is installed
};
extern SignalState g_sig SV_MEMBACKING_INTERNAL;

// The calling thread, unique among the live threads of the process: its
// thread pointer where one instruction reads it (x86-64: the TCB's self
// pointer at %fs:0, which glibc's pthread_self returns), else its tid.
// Read at each publish and in the handler: not a system call each.
inline uintptr_t self_thread() {
#if defined(__x86_64__)
  uintptr_t p;
  asm volatile("mov %%fs:0, %0" : "=r"(p));
  return p;
#else
  return static_cast<uintptr_t>(rawsys::gettid());
#endif
}

// Publishes [b, e) as in flight. Only ever called with MemBacking's mutex
// held, so there is one writer.
inline void publish(uintptr_t b, uintptr_t e) {
  g_sig.begin.store(b);
  g_sig.end.store(e);
  g_sig.thread.store(self_thread());
  g_sig.seq.fetch_add(1);  // now odd
}

// Ends the operation and wakes the handlers waiting for it. A handler counts
// itself in `waiters` before it reads seq, and this reads `waiters` after it
// changed seq (both sequentially consistent): either the handler sees the
// new seq and does not sleep, or this sees it and wakes it (FUTEX_WAIT
// sleeps only while seq still holds the old value, futex(2)). Nobody
// waiting (the usual case): no system call.
inline void unpublish() {
  g_sig.seq.fetch_add(1);  // now even
  if (g_sig.waiters.load() != 0) rawsys::futex_wake_all(&g_sig.seq);
}

// The SIGSEGV handler (SA_SIGINFO): a fault on the published range by
// another thread waits until the operation is over and returns, so that the
// access is retried; any other fault goes to the previous handler.
void segv_handler(int sig, siginfo_t* si, void* uc) SV_MEMBACKING_INTERNAL;

}  // namespace sv::membacking
