#include "common/shm_ring.h"

#include <sched.h>
#include <signal.h>

#include <cerrno>

namespace sv::shm {

bool ShmLock::lock_slow(uint32_t pid) {
  for (unsigned spins = 0;; ++spins) {
    uint32_t turn = next.load(std::memory_order_relaxed);
    uint32_t expected = 0;
    if ((turn == 0 || turn == pid) && owner.compare_exchange_weak(expected, pid, std::memory_order_acquire)) {
      if (turn == pid) next.compare_exchange_strong(turn, 0, std::memory_order_relaxed);
      return false;
    }
    if (spins <= 64) {
      __builtin_ia32_pause();
      continue;
    }
    relax_long();
    // Looked at every 16 yields (a kill(2) probe): with every CPU busy a
    // yield can cost a whole time slice, and 1024 of them take seconds.
    if ((spins & 15) != 0) continue;
    if (turn == 0 && spins >= kStarved) {
      next.compare_exchange_strong(turn, pid, std::memory_order_relaxed);
    } else if (turn != 0 && turn != pid && !alive(turn)) {
      next.compare_exchange_strong(turn, 0, std::memory_order_relaxed);  // it died waiting
    }
    // A holder that died with the lock (kill -9 mid-post) never frees it:
    // take it over, and say so (the caller repairs what it guarded).
    uint32_t o = owner.load(std::memory_order_relaxed);
    if (o != 0 && o != pid && !alive(o) && owner.compare_exchange_strong(o, pid, std::memory_order_acquire)) {
      uint32_t mine = pid;
      next.compare_exchange_strong(mine, 0, std::memory_order_relaxed);
      return true;
    }
  }
}

void ShmLock::relax_long() { ::sched_yield(); }

bool ShmLock::alive(uint32_t pid) { return ::kill(pid_t(pid), 0) == 0 || errno != ESRCH; }

}  // namespace sv::shm
