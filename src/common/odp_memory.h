// odp_memory.h: the address space of one process, reached with its identity
// pinned (docs/MEMORY.md, "On-demand paging"). An on-demand-paging MR's
// bytes are its registrant's memory as it is at each access; whoever copies
// them (the daemon between users, a peer process of the same user, the
// process itself) goes through an OdpMemory of that registrant.
//
// The handle is a descriptor of /proc/PID/mem and one of /proc/PID/maps,
// opened while the registrant was known to be alive (its pidfd, taken
// before the opens, says it had not exited after them, so the number PID
// still named it). Both are bound to the process's mm at open (proc(5));
// a later process that takes the pid is a different mm, which no access
// through the handle reaches: once the registrant's mm is gone, every
// access fails.
//
// /proc/PID/mem ignores page protections on private mappings (the kernel's
// FOLL_FORCE), unlike process_vm_writev(2), so each access first asks the
// maps descriptor (PROCMAP_QUERY, Linux 6.11; else the text) whether the
// mappings over the range allow it: readable for a read, writable for a
// write. An mprotect(2) by the registrant between that question and the
// copy is not seen by that copy (the registrant racing its own access).
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <memory>

#include "common/sys.h"

namespace sv {

class OdpMemory {
 public:
  // The handle of process `pid`, the process behind `pidfd`: 0 and `out`,
  // or an errno (ESRCH: it exited before the opens were confirmed; EACCES,
  // EPERM: this process may not ptrace-read it, proc(5)).
  static int open(pid_t pid, int pidfd, std::shared_ptr<const OdpMemory>& out);
  // This process's own (no pidfd needed: /proc/self names the caller).
  static int open_self(std::shared_ptr<const OdpMemory>& out);

  // n bytes at `addr` of the process, into `buf` / from `buf`. 0, or EFAULT
  // (a page not mapped, or mapped without the access), ESRCH (the process
  // is gone), or another errno of pread(2)/pwrite(2). Bytes before a
  // failing page may have been copied.
  int read(uint64_t addr, void* buf, size_t n) const;
  int write(uint64_t addr, const void* buf, size_t n) const;

  pid_t pid() const { return pid_; }

 private:
  OdpMemory(pid_t pid, Fd mem, Fd maps) : pid_(pid), mem_(std::move(mem)), maps_(std::move(maps)) {}
  // Whether every byte of [addr, addr + n) lies in mappings that allow
  // reading (or writing): 0, EFAULT, or ESRCH.
  int allows(uint64_t addr, size_t n, bool write) const;
  int allows_by_text(uint64_t addr, size_t n, bool write) const;
  pid_t pid_;
  Fd mem_, maps_;
};

// The identity of the struct pid behind a pidfd that no other process ever
// has (its pidfs inode, Linux 6.9), or 0 where pidfds are not pidfs inodes.
uint64_t pidfd_identity(int pidfd);

}  // namespace sv
