#include "common/shm_ring.h"

#include <sched.h>
#include <signal.h>

#include <cerrno>

namespace sv::shm {

void ShmLock::relax_long() { ::sched_yield(); }

bool ShmLock::alive(uint32_t pid) { return ::kill(pid_t(pid), 0) == 0 || errno != ESRCH; }

}  // namespace sv::shm
