#include "common/shm_ring.h"

#include <sched.h>

namespace sv::shm {

void ShmLock::relax_long() { ::sched_yield(); }

}  // namespace sv::shm
