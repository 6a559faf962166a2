// odp.h: bytes of on-demand-paging memory (docs/MEMORY.md, "On-demand
// paging"): the address space of the MR's registrant as it is now, read
// and written through its pinned address space (common/odp_memory.h),
// opened once per registrant (requester_odp.cc). Each returns false, with
// nothing else harmed, where a page is not there or does not allow the
// access, the registrant is gone (whatever process took its pid), or the
// kernel refuses this process that process (said on stderr once).
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>

#include "common/shm_layout.h"

namespace sv::verbs {

struct ContextState;

// Who registered an ODP MR: its pid and the identity of its struct pid
// (MrEntry::owner_identity), which no later process at that pid has.
struct OdpOwner {
  pid_t pid = 0;
  uint64_t identity = 0;
};
inline OdpOwner odp_owner(const shm::MrEntry& e) { return {pid_t(e.owner_pid), e.owner_identity}; }

bool odp_read(const OdpOwner& o, uint64_t addr, uint8_t* out, size_t n);
bool odp_write(const OdpOwner& o, uint64_t addr, const uint8_t* in, size_t n);
// Compare-and-swap (`cas`) or fetch-and-add on the quadword at addr, under
// the lock every RDMA atomic on ODP memory of this user takes
// (ContextState::odp_lock); the original value in *orig.
bool odp_atomic(ContextState& cs, const OdpOwner& o, uint64_t addr, bool cas, uint64_t compare_add, uint64_t swap,
                uint64_t* orig);
// ATOMIC WRITE (IBTA annex A19): `value` as one aligned quadword at addr
// (OdpMemory::store_word), under the same lock as odp_atomic, so that it
// is atomic with respect to them.
bool odp_atomic_write(ContextState& cs, const OdpOwner& o, uint64_t addr, uint64_t value);

}  // namespace sv::verbs
