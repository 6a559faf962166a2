// softverbs: process-wide shared-memory backing for registered memory.
//
// CONTRACT
//
// What it does. acquire() makes every page covering [addr, addr+len) a
// MAP_SHARED mapping of one process-wide memfd (the "backing file") whose file
// offset equals the virtual address of the page. A process that receives
// fd() can therefore mmap [page_down(va), page_up(va+len)) at file offset
// page_down(va) and see (and modify) exactly this process's bytes. Pages are
// reference-counted per page: acquire() on already-backed pages only bumps
// their counts; release() drops them and pages whose count reaches zero are
// turned back into private anonymous memory (contents kept) and their file
// range is hole-punched, so a peer's old mapping of those offsets reads zeros
// from then on. See docs/MEMORY.md.
//
// Thread safety. All member functions are thread-safe (one internal mutex).
// Other threads may keep reading and writing the affected memory while
// acquire()/release() runs: a write that hits a page while it is being
// converted faults, waits in the module's SIGSEGV handler until the page is
// replaced and is then retried, so no write is lost. Do not call any member
// from a signal handler.
//
// Ownership. The backing fd is owned by this object and stays open for the
// life of the process (until exec; it is O_CLOEXEC). Callers may dup() it or
// pass it to other processes (SCM_RIGHTS) but must not close, ftruncate,
// fallocate, seal or write() it. Whoever holds the fd can map ANY offset of
// it, i.e. every page that is currently backed, including the unregistered
// bytes that share a page with a registered buffer: hand it only to trusted
// peers. The object itself is never destroyed.
//
// The caller must not, while a page is acquired (count > 0):
//  - munmap, mremap, mprotect or madvise(MADV_DONTNEED/FREE/REMOVE) it, or
//    free() the heap memory containing a registered buffer (the table trusts
//    pages with count > 0 and does not re-check them);
//  - install a SIGSEGV handler that does not chain to the previous one (the
//    module's handler is installed on the first acquire());
//  - create child processes with raw clone()/syscall(SYS_fork) (they bypass
//    the pthread_atfork handler and would share the registered pages).
// Kernel accesses (read(2) into the range, etc.) by another thread while the
// range is being converted or reverted may fail with EFAULT.
//
// Errors are returned as values: 0 or a positive errno; nothing throws.
//   acquire: EINVAL     len == 0 or the range wraps around the address space
//            EFAULT     part of the range is not mapped
//            EOPNOTSUPP part of the range is a MAP_SHARED mapping that is not
//                       our own, hugetlb memory, the [stack] or another
//                       special kernel mapping ([vdso], [vvar], ...)
//            other      errno of a failing syscall (ENOMEM, ...); in that case
//                       nothing was converted.
//
// fork(): in the child, every backed range is replaced by a private copy and
// the child starts with an empty table and no backing fd (fd() == -1 until its
// own first acquire()), so the child never writes into the parent's pages.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace sv {

// What the module reads of the address space, for its tests: the VMAs
// overlapping [lo, hi), one line each ("start-end prot s|p offset
// major:minor inode name"), as the kernel's PROCMAP_QUERY ioctl answers
// (`query`) and as the text of /proc/self/maps says (`text`). Returns 0 or
// an errno (ENOTTY: the kernel has no PROCMAP_QUERY).
int describe_maps_for_test(uintptr_t lo, uintptr_t hi, bool query, std::string* out);

class MemBacking {
 public:
  // The process-wide instance (created on first use, never destroyed).
  static MemBacking& instance();

  // Backing memfd, -1 before the first successful acquire() (and in a forked
  // child until its own first acquire()).
  int fd() const;

  // Backs every page covering [addr, addr+len) (byte range, any alignment)
  // by the backing file. Returns 0 or an errno (see above).
  int acquire(const void* addr, size_t len);

  // Makes sure the backing file exists and is long enough to hold every
  // page covering [addr, addr+len); converts nothing. A registration may
  // then be announced to the daemon (which checks the file's length) while
  // acquire() converts the pages. Returns 0 or an errno (EINVAL as
  // acquire).
  int reserve(const void* addr, size_t len);

  // Drops one reference on every page covering [addr, addr+len). Pages with
  // count 0 are ignored. Pages reaching 0 are reverted to private memory and
  // revoked from peers. len == 0 is a no-op.
  void release(const void* addr, size_t len);

  // Number of pages with count > 0.
  size_t backed_pages() const;

  // Whether the page containing addr has count > 0.
  bool is_backed(const void* addr) const;

  MemBacking(const MemBacking&) = delete;
  MemBacking& operator=(const MemBacking&) = delete;

  struct Impl;

 private:
  MemBacking();
  ~MemBacking() = default;

  Impl* impl_;
};

}  // namespace sv
