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
// Reads are made with process_vm_readv(2) on the pid, into a buffer of
// this object's, and count only if the pidfd says the registrant was still
// alive after the call (a live process holds its pid, so the pid named it
// throughout); else the bytes are dropped. process_vm_readv keeps the
// kernel's protections, and its fault waits are killable (a page whose
// FUSE READ is never answered holds the caller, but not its exit).
//
// Writes go through /proc/PID/mem, which ignores page protections on
// private mappings (the kernel's FOLL_FORCE), unlike process_vm_writev(2):
// each first asks the maps descriptor (PROCMAP_QUERY, Linux 6.11; else the
// text) whether every mapping over the range is writable. An mprotect(2)
// by the registrant between that question and the copy is not seen by that
// copy (the registrant racing its own access). Its faults wait
// uninterruptibly, so the pages are first faulted in by a one-byte read of
// each (process_vm_readv, killable); a page the registrant makes wait again
// in between (its own file, a FUSE one, locked anew) holds the writer
// until the wait ends.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <memory>

#include "common/sys.h"

namespace sv {

class OdpMemory {
 public:
  // allows() from the maps text, as before Linux 6.11 (no PROCMAP_QUERY):
  // 0, EFAULT, or ESRCH. Public for its test, which this kernel's path
  // never takes.
  int allows_by_text(uint64_t addr, size_t n, bool write) const;
  // The handle of process `pid`, the process behind `pidfd`: 0 and `out`,
  // or an errno (ESRCH: it exited before the opens were confirmed; EACCES,
  // EPERM: this process may not ptrace-read it, proc(5)).
  static int open(pid_t pid, int pidfd, std::shared_ptr<const OdpMemory>& out);
  // This process's own: process_vm_readv/writev on its own pid, which is
  // its own for as long as it runs (no /proc file: a process that changed
  // its ids is not dumpable, and its /proc/self/mem is root's).
  static int open_self(std::shared_ptr<const OdpMemory>& out);

  // n bytes at `addr` of the process, into `buf` / from `buf`. 0, or EFAULT
  // (a page not mapped, or mapped without the access), ESRCH (the process
  // is gone), or another errno of pread(2)/pwrite(2). Bytes before a
  // failing page may have been copied.
  int read(uint64_t addr, void* buf, size_t n) const;
  int write(uint64_t addr, const void* buf, size_t n) const;
  // IBTA annex A19's ATOMIC WRITE: the 8 bytes of `value` at the aligned
  // `addr` (EINVAL if not aligned), with write()'s checks, as one write of
  // one aligned quadword (a single pwrite(2) / process_vm_writev(2) of 8
  // bytes, which the kernel copies as one unit within one page; never
  // split). Atomic with respect to other RDMA atomics only under the lock
  // they take (the caller's; docs/MEMORY.md, "Atomics").
  int store_word(uint64_t addr, uint64_t value) const;

  pid_t pid() const { return pid_; }

 private:
  OdpMemory(pid_t pid, Fd pidfd, Fd mem, Fd maps, Fd pagemap)
      : pid_(pid), pidfd_(std::move(pidfd)), mem_(std::move(mem)), maps_(std::move(maps)),
        pagemap_(std::move(pagemap)) {}
  // process_vm_readv of n bytes at addr into buf: 0, EFAULT or an errno.
  int readv_all(uint64_t addr, uint8_t* buf, size_t n) const;
  // One byte of each page of the range that is not present now read
  // (process_vm_readv, whose fault waits are killable), then alive(): 0,
  // EFAULT, ESRCH or an errno. Which pages are present: pagemap_ (one
  // read for up to 512 pages); without it, every page is read.
  int prefault(uint64_t addr, size_t n) const;
  // The addresses of the pages of [from, end) not present, at most `max`,
  // into `out`; how many, with *next the first page not looked at; -1 if
  // the pagemap cannot be read.
  int absent_pages(uint64_t from, uint64_t end, uint64_t* out, int max, uint64_t* next) const;
  // Whether the registrant is still alive (always, for this process's own).
  bool alive() const { return !pidfd_.valid() || pidfd_alive(pidfd_.get()); }
  // Whether every byte of [addr, addr + n) lies in mappings that allow
  // reading (or writing): 0, EFAULT, or ESRCH.
  int allows(uint64_t addr, size_t n, bool write) const;
  pid_t pid_;
  Fd pidfd_;  // none: this process's own (and no mem_, maps_ either)
  Fd mem_, maps_;
  Fd pagemap_;  // /proc/PID/pagemap of the same mm (proc(5)), if it could be opened
};

// The identity of the struct pid behind a pidfd that no other process ever
// has (its pidfs inode, Linux 6.9), or 0 where pidfds are not pidfs inodes.
uint64_t pidfd_identity(int pidfd);

}  // namespace sv
