// odp.h: bytes of on-demand-paging memory (docs/MEMORY.md, "On-demand
// paging"): the address space of process `pid` as it is now, read and
// written with process_vm_readv/writev (requester_odp.cc). Each returns
// false, with nothing else harmed, where a page is not there or does not
// allow the access, or the kernel refuses this process that process (said
// on stderr once).
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>

namespace sv::verbs {

struct ContextState;

bool odp_read(pid_t pid, uint64_t addr, uint8_t* out, size_t n);
bool odp_write(pid_t pid, uint64_t addr, const uint8_t* in, size_t n);
// Compare-and-swap (`cas`) or fetch-and-add on the quadword at addr, under
// the lock every RDMA atomic on ODP memory of this user takes
// (ContextState::odp_lock); the original value in *orig.
bool odp_atomic(ContextState& cs, pid_t pid, uint64_t addr, bool cas, uint64_t compare_add, uint64_t swap,
                uint64_t* orig);

}  // namespace sv::verbs
