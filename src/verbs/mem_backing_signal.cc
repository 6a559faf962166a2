// mem_backing_signal.cc: MemBacking's SIGSEGV handler (the state it shares
// with the converting thread: mem_backing_signal.h). It never takes the
// mutex: a fault on the range in flight, by another thread, waits on a futex
// until the operation is over and returns, so the faulting instruction is
// retried; a fault reported after the operation ended is recognised by
// probing the page with MADV_POPULATE_WRITE/READ (succeeds only if the same
// kind of access would now succeed; Linux >= 5.14).
#include "mem_backing_signal.h"

#include <errno.h>
#include <sys/mman.h>
#include <ucontext.h>

#include <cstring>

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

namespace sv::membacking {

SignalState g_sig;

namespace {

namespace sys = rawsys;

enum class Access { kRead, kWrite, kExec };

// What the faulting access was. Unknown architectures report a write: there
// the module never uses PROT_NONE windows (can_park), so only writes can
// fault because of it.
Access fault_access(void* uc) {
#if defined(__x86_64__)
  const auto* u = static_cast<const ucontext_t*>(uc);
  const auto err = static_cast<uint64_t>(u->uc_mcontext.gregs[REG_ERR]);
  if (err & 0x10u) return Access::kExec;  // X86_PF_INSTR
  return (err & 0x2u) ? Access::kWrite : Access::kRead;  // X86_PF_WRITE
#else
  (void)uc;
  return Access::kWrite;
#endif
}

void chain_segv(int sig, siginfo_t* si, void* uc) {
  const struct sigaction& p = g_sig.prev;
  if (p.sa_handler != SIG_DFL && p.sa_handler != SIG_IGN) {
    if (p.sa_flags & SA_SIGINFO) {
      p.sa_sigaction(sig, si, uc);
    } else {
      p.sa_handler(sig);
    }
    return;
  }
  // Default action: restore it and let the fault happen again (a kernel
  // fault re-executes the instruction; a sent signal is re-raised).
  struct sigaction dfl;
  std::memset(&dfl, 0, sizeof dfl);
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  ::sigaction(sig, &dfl, nullptr);
  if (si == nullptr || si->si_code <= 0) raise(sig);
}

}  // namespace

void segv_handler(int sig, siginfo_t* si, void* uc) {
  const int saved_errno = errno;
  if (si != nullptr && (si->si_code == SEGV_ACCERR || si->si_code == SEGV_MAPERR)) {
    const uintptr_t a = reinterpret_cast<uintptr_t>(si->si_addr);
    const uintptr_t ps = g_sig.page.load(std::memory_order_relaxed);
    const Access access = fault_access(uc);
    for (;;) {
      const uint32_t s1 = g_sig.seq.load();
      if (s1 & 1u) {
        const uintptr_t b = g_sig.begin.load();
        const uintptr_t e = g_sig.end.load();
        const uintptr_t thread = g_sig.thread.load();
        if (g_sig.seq.load() == s1 && a >= b && a < e && thread != self_thread()) {
          g_sig.waiters.fetch_add(1);
          while (g_sig.seq.load() == s1) sys::futex_wait(&g_sig.seq, s1);
          g_sig.waiters.fetch_sub(1);
          errno = saved_errno;
          return;  // retry the access on the new pages
        }
      }
      // The operation may have finished between the fault and now: if the
      // same access to the page would now succeed, retry it. (Executable
      // memory is never made inaccessible by this module.)
      if (access != Access::kExec &&
          sys::madvise(a & ~(ps - 1), ps,
                       access == Access::kWrite ? MADV_POPULATE_WRITE : MADV_POPULATE_READ) == 0) {
        errno = saved_errno;
        return;
      }
      if (g_sig.seq.load() == s1) break;  // nothing changed: a genuine fault
    }
  }
  errno = saved_errno;
  chain_segv(sig, si, uc);
}

}  // namespace sv::membacking
