// Implementation notes (the contract is in mem_backing.h, the design in
// docs/MEMORY.md).
//
// Conversion of a private range [b, e) with protection P:
//   reserve a parking range; publish [b, e) as "in flight"; mprotect(b, e,
//   P minus PROT_WRITE plus PROT_READ); pwrite the non-zero pages into the
//   file at offset == address and punch the zero ones (so they read
//   zeros); mprotect(PROT_NONE) and mremap(MREMAP_DONTUNMAP) the original
//   VMA to the parking range (its pages go with it, an empty VMA stays at
//   [b, e) so the range is never unmapped); mmap(MAP_SHARED | MAP_FIXED, P)
//   the file over [b, e) (atomic replacement); unpublish; MADV_DONTNEED the
//   parked pages (beyond kKeepBudget). Where MREMAP_DONTUNMAP is refused (before Linux 5.7, and
//   on early kernels for anything but private anonymous memory) the original
//   VMA is simply replaced.
// Revert of a backed range [b, e) with protection P:
//   take the parked original VMA (or, if there is none, fresh private
//   anonymous memory); publish; mprotect [b, e) without PROT_WRITE; pread the
//   file into it; mprotect it to P; mremap(MREMAP_FIXED) it over [b, e);
//   unpublish; punch. Because the parked VMA keeps its original vm_pgoff and
//   anon_vma, the kernel merges it back with its old neighbours, so
//   register/deregister cycles do not fragment the address space (a fresh
//   VMA moved into place never merges: its pgoff belongs to another address).
// Between publish and unpublish, nothing may allocate from the heap (the
// converting thread could fault on a heap page it has made read-only).
//
// The SIGSEGV handler (mem_backing_signal.cc) never takes the mutex: it
// reads the in-flight range from atomics (seqlock-style, g_sig.seq odd while
// an operation is in flight), waits on a futex until the operation is over
// and returns so the faulting instruction is retried. A fault reported after
// the operation already ended is recognised by probing the page with
// MADV_POPULATE_WRITE/READ (succeeds only if the same kind of access would
// now succeed; Linux >= 5.14).

#include "mem_backing.h"
#include "mem_backing_signal.h"
#include "proc_maps.h"
#include "raw_syscalls.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/limits.h>
#include <linux/magic.h>
#include <pthread.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <new>
#include <string>
#include <vector>

#ifndef MFD_NOEXEC_SEAL
#define MFD_NOEXEC_SEAL 0x0008U
#endif
#ifndef MREMAP_DONTUNMAP
#define MREMAP_DONTUNMAP 4
#endif
#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

static_assert(sizeof(void*) == 8, "softverbs mem_backing assumes a 64-bit address space");

namespace sv {
namespace {

// The system calls, wrapped once: raw_syscalls.h.
namespace sys = rawsys;
using procmaps::for_each_vma;
using procmaps::read_maps;
using procmaps::Vma;
using procmaps::VmaView;
using membacking::g_sig;
using membacking::publish;
using membacking::segv_handler;
using membacking::unpublish;

// ---------------------------------------------------------------------------
// Helpers.

uintptr_t page_size() { return g_sig.page.load(std::memory_order_relaxed); }
uintptr_t page_down(uintptr_t a) { return a & ~(page_size() - 1); }

// [b, e) page range covering [addr, addr+len); false on wrap-around.
bool page_range(const void* addr, size_t len, uintptr_t* b, uintptr_t* e) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(addr);
  const uintptr_t ps = page_size();
  if (len == 0 || a + len < a) return false;
  const uintptr_t last = a + len - 1;
  if (last + ps < last) return false;
  *b = page_down(a);
  *e = page_down(last) + ps;
  return *e > *b;
}

constexpr uintptr_t kConvertChunk = uintptr_t{64} << 20;

// Whether a page reads as all zero. Reads bytes outside the registered buffer
// (rest of the page, e.g. ASan redzones) and memory that other threads wrote
// before the read-only window (no race: the range is read-only now), hence
// not instrumented.
__attribute__((noinline, no_sanitize("address", "thread", "undefined"))) bool page_is_zero(uintptr_t p,
                                                                                             uintptr_t n) {
  const auto* w = reinterpret_cast<const uint64_t*>(p);
  for (uintptr_t i = 0; i < n / 8; i += 8) {
    if ((w[i] | w[i + 1] | w[i + 2] | w[i + 3] | w[i + 4] | w[i + 5] | w[i + 6] | w[i + 7]) != 0) return false;
  }
  return true;
}

// Writes the pages of [b, b+n) into the file at offset == address: the
// non-zero ones are written, the all-zero ones punched out of the file
// (they stay holes, and whatever a peer wrote there since the last revert
// goes). Punching only where a page is zero saves a system call per
// registration of data.
int copy_to_file(int fd, uintptr_t b, uintptr_t n) {
  const uintptr_t ps = page_size();
  uintptr_t run = b;
  bool zero_run = page_is_zero(b, ps);
  for (uintptr_t p = b + ps;; p += ps) {
    const bool end = p >= b + n;
    const bool zero = !end && page_is_zero(p, ps);
    if (end || zero != zero_run) {
      if (int r = zero_run ? sys::punch(fd, run, p - run) : sys::pwrite_all(fd, run, p - run, run)) return r;
      if (end) return 0;
      run = p;
      zero_run = zero;
    }
  }
}

// Copies the data extents of file range [off, off+n) to dst (whose pages are
// fresh anonymous zero pages, so holes need no copying).
int copy_from_file(int fd, uint64_t off, uintptr_t dst, uint64_t n) {
  const uint64_t end = off + n;
  uint64_t cur = off;
  while (cur < end) {
    uint64_t data = 0;
    int r = sys::lseek(fd, cur, SEEK_DATA, &data);
    if (r == ENXIO) return 0;  // no data past cur
    if (r) return r;
    if (data >= end) return 0;
    uint64_t hole = 0;
    if ((r = sys::lseek(fd, data, SEEK_HOLE, &hole))) return r;
    hole = std::min(hole, end);
    // The pages are faulted in by one madvise(2) first rather than one
    // page fault each from inside pread(2): at 1 MiB the faults are a
    // third of a reg + dereg. Best effort: pread faults them
    // in anyway.
    sys::madvise(dst + (data - off), hole - data, MADV_POPULATE_WRITE);
    if ((r = sys::pread_all(fd, dst + (data - off), hole - data, data))) return r;
    cur = hole;
  }
  return 0;
}

int read_only(int prot) { return (prot & ~PROT_WRITE) | PROT_READ; }

// Up to this size a revert reads the file's range whole, holes included.
constexpr uintptr_t kWholeRead = uintptr_t{64} << 10;

// Where the original private VMA of a converted range was parked.
struct Park {
  uintptr_t at = 0;     // parking address of the range's first page, 0 if none
  bool zeroed = false;  // parked pages read as zero (anonymous + MADV_DONTNEED)
  bool kept = false;    // the original pages stay in the parked VMA (kKeepBudget)
};

// Parked anonymous pages are dropped (MADV_DONTNEED), so that a backed page
// costs one page, not two; the revert then faults in a fresh zeroed page
// for each one it copies back. Up to this many bytes of parked ranges per
// process keep their pages instead: the revert copies into pages that are
// there, and neither side allocates, zeroes or frees an anonymous page. At
// 1 MiB that is about a third of a reg + dereg. The pages
// are private to this process and inaccessible (PROT_NONE) while parked:
// memory, not reach; revocation is the file's (docs/MEMORY.md).
constexpr uint64_t kKeepBudget = uint64_t{16} << 20;

// Whether the original VMA of [b, e) may be parked. Parking needs a short
// PROT_NONE window; code that might run meanwhile (this thread between two
// syscalls, the SIGSEGV handler in other threads) must not read the range:
// so only with inline syscalls (no PLT/GOT), never for executable memory,
// and never over the handler's own state.
bool can_park(uintptr_t b, uintptr_t e, int prot) {
  const uintptr_t ps = g_sig.page.load(std::memory_order_relaxed);
  const uintptr_t sb = reinterpret_cast<uintptr_t>(&g_sig) & ~(ps - 1);
  const uintptr_t se = (reinterpret_cast<uintptr_t>(&g_sig + 1) + ps - 1) & ~(ps - 1);
  return sys::kInline && (prot & PROT_EXEC) == 0 && (e <= sb || b >= se);
}

// Whether the first page of [b, b+n) reads non-zero: then it was written.
// (Reading a page never written maps the shared zero page and allocates
// nothing; the range is readable, checked by the caller.)
__attribute__((noinline, no_sanitize("address", "thread", "undefined"))) bool any_written(uintptr_t b,
                                                                                           uintptr_t n) {
  return !page_is_zero(b, std::min(n, page_size()));
}

// Converts private memory [b, e) (protection prot) into a shared mapping of
// the backing file at offset b. `anon`: the VMA is anonymous memory. No heap
// allocation.
int convert_chunk(int fd, uintptr_t b, uintptr_t e, int prot, bool anon, bool keep, Park* park) {
  const uintptr_t n = e - b;
  *park = Park{};
  uintptr_t spot = 0;
  if (can_park(b, e, prot) &&
      sys::mmap(0, n, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0, &spot) != 0) {
    spot = 0;
  }
  if (spot != 0 && anon && (prot & PROT_WRITE) != 0 && !any_written(b, n)) {
    // A VMA that has never been written has no anon_vma, and mremap then
    // resets its vm_pgoff to the destination address, which keeps it from
    // merging back if its neighbours' pgoff is not address-based. Make the
    // kernel attach one (no data changes: this only prefaults one page).
    // A page that reads non-zero was written: its VMA has one already.
    sys::madvise(b, page_size(), MADV_POPULATE_WRITE);
  }
  enum { kReserved, kParked, kGone } spot_state = kReserved;
  publish(b, e);
  int r = sys::mprotect(b, n, read_only(prot));
  if (r == 0) r = copy_to_file(fd, b, n);
  if (r == 0 && spot != 0 && sys::mprotect(b, n, PROT_NONE) == 0) {
    if (sys::mremap_dontunmap(b, n, spot) == 0) {
      spot_state = kParked;
    } else {
      sys::mprotect(b, n, read_only(prot));  // not supported here: plain replacement
    }
  }
  if (r == 0) {
    uintptr_t got = 0;
    r = sys::mmap(b, n, prot, MAP_SHARED | MAP_FIXED, fd, b, &got);
    // On failure put the original pages back over the (empty) VMA left at b.
    if (r != 0 && spot_state == kParked && sys::mremap_fixed(spot, n, b) == 0) spot_state = kGone;
  }
  if (r != 0) sys::mprotect(b, n, prot);
  unpublish();
  if (spot_state == kParked && r == 0) {
    park->at = spot;
    park->kept = keep && anon;
    park->zeroed = !park->kept && anon && sys::madvise(spot, n, MADV_DONTNEED) == 0;
  } else if (spot != 0 && spot_state == kReserved) {
    sys::munmap(spot, n);  // still our own PROT_NONE reservation
  }
  return r;
}

// Replaces backed range [b, e) (currently protection prot) by private memory
// with the same contents: the parked VMA `park` if there is one, otherwise
// fresh anonymous memory. With concurrent == true, writers are held off as
// during conversion. Does not punch; on failure a parked VMA stays parked
// (the caller unmaps it). No heap allocation.
int make_private(int fd, uintptr_t b, uintptr_t e, int prot, bool concurrent, Park park) {
  const uintptr_t n = e - b;
  uintptr_t dst = park.at;
  bool zeroed = park.zeroed;
  if (dst == 0) {
    if (int r = sys::mmap(0, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0, &dst)) return r;
    zeroed = true;
  } else if (int r = sys::mprotect(dst, n, PROT_READ | PROT_WRITE)) {
    return r;
  }
  if (concurrent) publish(b, e);
  int r = 0;
  const bool drop_write = concurrent && (prot & PROT_WRITE) != 0;
  if (drop_write) r = sys::mprotect(b, n, prot & ~PROT_WRITE);
  // Small ranges are read whole: one pread(2) instead of two lseek(2)s
  // besides; zeros read from a hole cost a few fresh pages.
  if (r == 0) r = zeroed && n > kWholeRead ? copy_from_file(fd, b, dst, n) : sys::pread_all(fd, dst, n, b);
  if (r == 0 && prot != (PROT_READ | PROT_WRITE)) r = sys::mprotect(dst, n, prot);
  if (r == 0) r = sys::mremap_fixed(dst, n, b);
  if (r != 0) {
    if (drop_write) sys::mprotect(b, n, prot);
    if (park.at == 0) sys::munmap(dst, n);
  }
  if (concurrent) unpublish();
  return r;
}

// /proc/self/maps: proc_maps.h.

struct FileId {
  unsigned dev_major = 0;
  unsigned dev_minor = 0;
  uint64_t inode = 0;
};

bool is_our_file(const VmaView& v, const FileId& id) {
  return v.shared && v.inode == id.inode && v.dev_major == id.dev_major && v.dev_minor == id.dev_minor;
}

// A mapping of our file at offset == address (so it backs exactly itself).
bool is_ours_identity(const VmaView& v, const FileId& id) { return is_our_file(v, id) && v.offset == v.start; }

bool starts_with(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

bool ends_with(const std::string& s, const char* suffix) {
  const size_t n = std::strlen(suffix);
  return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}

enum class Kind { kOurs, kConvert };

// Whether (and how) a VMA can be backed. Returns 0 or the errno to refuse with.
int classify(const Vma& v, const FileId& id, Kind* kind) {
  if (is_our_file(v, id)) {
    if (v.offset != v.start) return EOPNOTSUPP;  // our fd mapped elsewhere
    *kind = Kind::kOurs;
    return 0;
  }
  if (v.shared) return EOPNOTSUPP;  // someone else's shared memory
  if (starts_with(v.name_str, "[")) {
    // [heap] and named anonymous memory are ordinary private memory; [stack]
    // grows down, [vdso]/[vvar]/[vsyscall]/[uprobes]... are the kernel's.
    if (v.name_str != "[heap]" && !starts_with(v.name_str, "[anon:")) return EOPNOTSUPP;
  } else if (starts_with(v.name_str, "/anon_hugepage")) {
    return EOPNOTSUPP;  // private MAP_HUGETLB
  } else if (starts_with(v.name_str, "/") && !ends_with(v.name_str, " (deleted)")) {
    struct statfs st;
    if (sys::statfs(v.name_str.c_str(), &st) == 0 && static_cast<uint64_t>(st.f_type) == HUGETLBFS_MAGIC) {
      return EOPNOTSUPP;
    }
  }
  *kind = Kind::kConvert;
  return 0;
}

// Calls f(b, e, vma-or-null) for consecutive segments of [b, e); vmas sorted.
template <class F>
void for_each_segment(const std::vector<Vma>& vmas, uintptr_t b, uintptr_t e, F&& f) {
  auto it = std::upper_bound(vmas.begin(), vmas.end(), b, [](uintptr_t x, const Vma& m) { return x < m.end; });
  uintptr_t cur = b;
  for (; cur < e && it != vmas.end() && it->start < e; ++it) {
    if (it->start > cur) {
      f(cur, it->start, static_cast<const Vma*>(nullptr));
      cur = it->start;
    }
    const uintptr_t se = std::min(e, it->end);
    f(cur, se, &*it);
    cur = se;
  }
  if (cur < e) f(cur, e, static_cast<const Vma*>(nullptr));
}

struct Range {
  uintptr_t b;
  uintptr_t e;
};

struct Piece {
  uintptr_t b;
  uintptr_t e;
  int prot;
  bool anon;  // anonymous memory (not a private file mapping)
  Park park;
};

bool is_anonymous(const Vma& v) {
  return v.name_str.empty() || v.name_str == "[heap]" || starts_with(v.name_str, "[anon:");
}

}  // namespace

// ---------------------------------------------------------------------------

struct MemBacking::Impl {
  struct Run {
    uintptr_t end;
    uint64_t count;  // > 0
  };

  mutable std::mutex mu;
  std::atomic<int> fd{-1};
  FileId id;
  uint64_t file_size = 0;      // a lower bound: the file only grows (F_SEAL_SHRINK)
  uint64_t kept = 0;           // bytes of parked ranges that kept their pages
  procmaps::MapsFile maps;     // /proc/self/maps, kept open
  bool handler_installed = false;
  std::map<uintptr_t, Run> runs;  // disjoint page runs with count > 0
  size_t pages = 0;
  // Parked original VMAs of converted ranges: start -> (end, parking spot).
  struct Parked {
    uintptr_t end;
    Park park;
  };
  std::map<uintptr_t, Parked> parks;

  int ensure_ready();
  int grow(uint64_t need);
  int convert(const std::vector<Range>& gaps, std::vector<Piece>* done);
  void undo_conversions(const std::vector<Piece>& done);
  void revert(const std::vector<Range>& zeros);
  void on_fork_child();

  // Table operations (may allocate; never inside an in-flight window).
  std::vector<Range> gaps(uintptr_t b, uintptr_t e) const;
  void split_at(uintptr_t x);
  void coalesce(uintptr_t b, uintptr_t e);
  void inc(uintptr_t b, uintptr_t e);
  std::vector<Range> dec(uintptr_t b, uintptr_t e);
  void split_park(uintptr_t x);
  void take_parks(uintptr_t b, uintptr_t e, int prot, std::vector<Piece>* out);
};

namespace {

std::atomic<MemBacking::Impl*> g_impl{nullptr};
MemBacking::Impl* g_fork_locked = nullptr;  // forks are serialised by libc while handlers run

void atfork_prepare() {
  g_fork_locked = g_impl.load();
  if (g_fork_locked != nullptr) g_fork_locked->mu.lock();
}

void atfork_parent() {
  if (g_fork_locked != nullptr) g_fork_locked->mu.unlock();
}

void atfork_child() {
  if (g_fork_locked == nullptr) return;
  g_fork_locked->on_fork_child();
  g_fork_locked->mu.unlock();
}

// Registered when the library is loaded rather than on first use, so that our
// child handler runs before those of libraries loaded later and of the
// application (child handlers run in registration order).
struct AtforkRegistration {
  AtforkRegistration() { pthread_atfork(atfork_prepare, atfork_parent, atfork_child); }
} g_atfork_registration;

}  // namespace

int MemBacking::Impl::ensure_ready() {
  if (fd.load() < 0) {
    int f = -1;
    // Never executed: ask for the no-exec seal where the kernel knows it.
    int r = sys::memfd_create("softverbs-backing", MFD_CLOEXEC | MFD_ALLOW_SEALING | MFD_NOEXEC_SEAL, &f);
    if (r == EINVAL) r = sys::memfd_create("softverbs-backing", MFD_CLOEXEC | MFD_ALLOW_SEALING, &f);
    if (r) return r;
    // Peers must not be able to shrink the file under our mappings (SIGBUS)
    // or add seals that stop us from growing or punching it.
    sys::fcntl(f, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_SEAL);
    struct stat st;
    if ((r = sys::fstat(f, &st))) {
      sys::close(f);
      return r;
    }
    id.dev_major = major(st.st_dev);
    id.dev_minor = minor(st.st_dev);
    id.inode = st.st_ino;
    fd.store(f);
  }
  if (!handler_installed) {
    struct sigaction sa;
    std::memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = segv_handler;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESTART;
    if (int r = sys::sigaction(SIGSEGV, &sa, &g_sig.prev)) return r;
    handler_installed = true;
  }
  return 0;
}

std::vector<Range> MemBacking::Impl::gaps(uintptr_t b, uintptr_t e) const {
  std::vector<Range> out;
  uintptr_t cur = b;
  auto it = runs.upper_bound(b);
  if (it != runs.begin()) {
    auto prev = std::prev(it);
    if (prev->second.end > b) cur = std::min(prev->second.end, e);
  }
  for (; it != runs.end() && it->first < e; ++it) {
    if (it->first > cur) out.push_back({cur, it->first});
    cur = std::min(it->second.end, e);
  }
  if (cur < e) out.push_back({cur, e});
  return out;
}

void MemBacking::Impl::split_at(uintptr_t x) {
  auto it = runs.upper_bound(x);
  if (it == runs.begin()) return;
  --it;
  if (it->first < x && x < it->second.end) {
    const Run tail{it->second.end, it->second.count};
    it->second.end = x;
    runs.emplace(x, tail);
  }
}

void MemBacking::Impl::coalesce(uintptr_t b, uintptr_t e) {
  auto it = runs.lower_bound(b);
  if (it != runs.begin()) --it;
  while (it != runs.end() && it->first <= e) {
    auto next = std::next(it);
    if (next == runs.end()) break;
    if (it->second.end == next->first && it->second.count == next->second.count) {
      it->second.end = next->second.end;
      runs.erase(next);
    } else {
      it = next;
    }
  }
}

void MemBacking::Impl::inc(uintptr_t b, uintptr_t e) {
  split_at(b);  // splitting never changes counts, so a throw here is harmless
  split_at(e);
  // Fill the gaps with count-0 runs first (allocates), then count (does not).
  try {
    for (const Range& g : gaps(b, e)) runs.emplace(g.b, Run{g.e, 0});
  } catch (...) {
    for (auto it = runs.lower_bound(b); it != runs.end() && it->first < e;) {
      it = it->second.count == 0 ? runs.erase(it) : std::next(it);
    }
    throw;
  }
  const uintptr_t ps = page_size();
  for (auto it = runs.lower_bound(b); it != runs.end() && it->first < e; ++it) {
    if (it->second.count++ == 0) pages += (it->second.end - it->first) / ps;
  }
  coalesce(b, e);
}

std::vector<Range> MemBacking::Impl::dec(uintptr_t b, uintptr_t e) {
  split_at(b);
  split_at(e);
  const uintptr_t ps = page_size();
  std::vector<Range> zeros;
  auto it = runs.lower_bound(b);
  while (it != runs.end() && it->first < e) {
    if (--it->second.count == 0) {
      const Range z{it->first, it->second.end};
      if (!zeros.empty() && zeros.back().e == z.b) {
        zeros.back().e = z.e;
      } else {
        zeros.push_back(z);
      }
      pages -= (z.e - z.b) / ps;
      it = runs.erase(it);
    } else {
      ++it;
    }
  }
  coalesce(b, e);
  return zeros;
}

// Converts the not-yet-counted ranges `gaps`. Either everything is converted
// (done lists the converted chunks) or nothing is and an errno is returned.
int MemBacking::Impl::convert(const std::vector<Range>& gap_list, std::vector<Piece>* done) {
  std::vector<Vma> vmas;
  if (int r = read_maps(gap_list.front().b, gap_list.back().e, &vmas, &maps)) return r;
  std::vector<Piece> pieces;
  int err = 0;
  // This thread's own stack (thread stacks are plain anonymous memory): the
  // read-only window would stop this very thread.
  const uintptr_t sp = reinterpret_cast<uintptr_t>(__builtin_frame_address(0));
  for (const Range& g : gap_list) {
    for_each_segment(vmas, g.b, g.e, [&](uintptr_t sb, uintptr_t se, const Vma* v) {
      if (err) return;
      // Not mapped, or mapped without access (PROT_NONE: a guard or a
      // reservation): the kernel could not pin it either (ibv_reg_mr(3)).
      if (v == nullptr || (v->prot & (PROT_READ | PROT_WRITE)) == 0) {
        err = EFAULT;
        return;
      }
      if (sp >= v->start && sp < v->end) {
        err = EOPNOTSUPP;
        return;
      }
      Kind kind = Kind::kConvert;
      if ((err = classify(*v, id, &kind))) return;
      if (kind == Kind::kConvert) pieces.push_back({sb, se, v->prot, is_anonymous(*v), Park{}});
    });
    if (err) return err;
  }
  if (pieces.empty()) return 0;

  const int f = fd.load();
  if (int r = grow(pieces.back().e)) return r;

  size_t chunks = 0;
  for (const Piece& p : pieces) chunks += (p.e - p.b + kConvertChunk - 1) / kConvertChunk;
  done->clear();
  done->reserve(chunks);  // no allocation from here on
  for (const Piece& p : pieces) {
    for (uintptr_t cb = p.b; cb < p.e;) {
      const uintptr_t ce = std::min(p.e, cb + kConvertChunk);
      Park park;
      const bool keep = kept + (ce - cb) <= kKeepBudget;
      if (int r = convert_chunk(f, cb, ce, p.prot, p.anon, keep, &park)) {
        undo_conversions(*done);
        done->clear();
        return r;
      }
      if (park.kept) kept += ce - cb;
      done->push_back({cb, ce, p.prot, p.anon, park});
      cb = ce;
    }
  }
  return 0;
}

// Makes the file at least `need` bytes long. No fstat(2) where it is known
// to be: it never shrinks.
int MemBacking::Impl::grow(uint64_t need) {
  if (file_size >= need) return 0;
  const int f = fd.load();
  struct stat st;
  if (int r = sys::fstat(f, &st)) return r;
  if (static_cast<uint64_t>(st.st_size) < need) {
    if (int r = sys::ftruncate(f, need)) return r;
    st.st_size = static_cast<off_t>(need);
  }
  file_size = static_cast<uint64_t>(st.st_size);
  return 0;
}

// Reverts chunks converted by the current call (no allocation).
void MemBacking::Impl::undo_conversions(const std::vector<Piece>& done) {
  const int f = fd.load();
  for (auto it = done.rbegin(); it != done.rend(); ++it) {
    if (it->park.kept) kept -= it->e - it->b;
    if (make_private(f, it->b, it->e, it->prot, true, it->park) == 0) {
      sys::punch(f, it->b, it->e - it->b);
    } else if (it->park.at != 0) {
      sys::munmap(it->park.at, it->e - it->b);
    }
  }
}

void MemBacking::Impl::split_park(uintptr_t x) {
  auto it = parks.upper_bound(x);
  if (it == parks.begin()) return;
  --it;
  if (it->first < x && x < it->second.end) {
    Parked tail = it->second;
    tail.park.at += x - it->first;
    it->second.end = x;
    parks.emplace(x, tail);
  }
}

// Cuts [b, e) out of the park table; appends pieces covering [b, e), with the
// parking spot where there is one.
void MemBacking::Impl::take_parks(uintptr_t b, uintptr_t e, int prot, std::vector<Piece>* out) {
  split_park(b);
  split_park(e);
  uintptr_t cur = b;
  auto it = parks.lower_bound(b);
  while (cur < e) {
    if (it != parks.end() && it->first < e) {
      if (it->first > cur) out->push_back({cur, it->first, prot, true, Park{}});
      out->push_back({it->first, it->second.end, prot, true, it->second.park});
      cur = it->second.end;
      it = parks.erase(it);
    } else {
      out->push_back({cur, e, prot, true, Park{}});
      cur = e;
    }
  }
}

// Reverts the ranges whose count dropped to zero.
void MemBacking::Impl::revert(const std::vector<Range>& zeros) {
  const int f = fd.load();
  std::vector<Vma> vmas;
  if (read_maps(zeros.front().b, zeros.back().e, &vmas, &maps) != 0) return;  // stay backed: contents are safe
  std::vector<Piece> ours;   // to make private again
  std::vector<Piece> stale;  // not ours any more (unmapped or replaced by the application)
  for (const Range& z : zeros) {
    for_each_segment(vmas, z.b, z.e, [&](uintptr_t sb, uintptr_t se, const Vma* v) {
      const bool mine = v != nullptr && is_ours_identity(*v, id);
      take_parks(sb, se, mine ? v->prot : 0, mine ? &ours : &stale);
    });
  }
  for (const Piece& p : ours) {
    if (p.park.kept) kept -= p.e - p.b;
    if (make_private(f, p.b, p.e, p.prot, true, p.park) == 0) {
      sys::punch(f, p.b, p.e - p.b);
    } else if (p.park.at != 0) {
      sys::munmap(p.park.at, p.e - p.b);  // stays backed (contents safe)
    }
  }
  for (const Piece& p : stale) {
    if (p.park.kept) kept -= p.e - p.b;
    sys::punch(f, p.b, p.e - p.b);
    if (p.park.at != 0) sys::munmap(p.park.at, p.e - p.b);
  }
}

// Runs in the child of fork() (single-threaded, mutex held). Until the backed
// ranges are private, the child's writes to them land in the parent's pages,
// so nothing here may touch the heap before they are all replaced.
void MemBacking::Impl::on_fork_child() {
  const int f = fd.load();
  if (f >= 0) {
    const FileId ours = id;
    const int r = for_each_vma([&](const VmaView& v) {
      if (!is_ours_identity(v, ours)) return;
      if (make_private(f, v.start, v.end, v.prot, false, Park{}) != 0) {
        // Cannot copy: at least make sure the child cannot touch the
        // parent's pages.
        if (sys::mprotect(v.start, v.end - v.start, PROT_NONE) != 0) sys::munmap(v.start, v.end - v.start);
      }
    });
    if (r != 0) {
      for (const auto& [b, run] : runs) {
        if (sys::mprotect(b, run.end - b, PROT_NONE) != 0) sys::munmap(b, run.end - b);
      }
    }
    // The parked originals are the parent's business.
    for (const auto& [b, p] : parks) sys::munmap(p.park.at, p.end - b);
    sys::close(f);
  }
  fd.store(-1);
  id = FileId{};
  file_size = 0;
  kept = 0;
  procmaps::forget(&maps);  // the parent's address space
  runs.clear();
  parks.clear();
  pages = 0;
}

// ---------------------------------------------------------------------------

MemBacking::MemBacking() : impl_(new Impl) {
  g_sig.page.store(static_cast<uintptr_t>(sysconf(_SC_PAGESIZE)));
  g_impl.store(impl_);
}

MemBacking& MemBacking::instance() {
  static MemBacking* const inst = new MemBacking();
  return *inst;
}

int MemBacking::fd() const { return impl_->fd.load(); }

int MemBacking::acquire(const void* addr, size_t len) {
  uintptr_t b = 0, e = 0;
  if (!page_range(addr, len, &b, &e)) return EINVAL;
  Impl& s = *impl_;
  std::lock_guard<std::mutex> lock(s.mu);
  std::vector<Piece> done;
  try {
    if (int r = s.ensure_ready()) return r;
    const std::vector<Range> gap_list = s.gaps(b, e);
    if (!gap_list.empty()) {
      if (int r = s.convert(gap_list, &done)) return r;
    }
    for (const Piece& p : done) {
      if (p.park.at != 0) s.parks.emplace(p.b, Impl::Parked{p.e, p.park});
    }
    s.inc(b, e);
  } catch (const std::bad_alloc&) {
    for (const Piece& p : done) s.parks.erase(p.b);
    s.undo_conversions(done);
    return ENOMEM;
  }
  return 0;
}

int MemBacking::reserve(const void* addr, size_t len) {
  uintptr_t b = 0, e = 0;
  if (!page_range(addr, len, &b, &e)) return EINVAL;
  Impl& s = *impl_;
  std::lock_guard<std::mutex> lock(s.mu);
  if (int r = s.ensure_ready()) return r;
  return s.grow(e);
}

void MemBacking::release(const void* addr, size_t len) {
  uintptr_t b = 0, e = 0;
  if (!page_range(addr, len, &b, &e)) return;
  Impl& s = *impl_;
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.fd.load() < 0) return;
  try {
    const std::vector<Range> zeros = s.dec(b, e);
    if (!zeros.empty()) s.revert(zeros);
  } catch (const std::bad_alloc&) {
    // Pages stay backed (count 0); contents are safe, a later acquire reuses them.
  }
}

size_t MemBacking::backed_pages() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->pages;
}

bool MemBacking::is_backed(const void* addr) const {
  const uintptr_t a = reinterpret_cast<uintptr_t>(addr);
  std::lock_guard<std::mutex> lock(impl_->mu);
  auto it = impl_->runs.upper_bound(a);
  if (it == impl_->runs.begin()) return false;
  --it;
  return a < it->second.end;
}

int describe_maps_for_test(uintptr_t lo, uintptr_t hi, bool query, std::string* out) {
  std::vector<Vma> vmas;
  const int r = query ? procmaps::query_maps(lo, hi, &vmas) : procmaps::read_maps_text(lo, hi, &vmas);
  out->clear();
  char line[128];
  for (const Vma& v : vmas) {
    std::snprintf(line, sizeof line, "%lx-%lx %c%c%c %c %llx %x:%x %llu ", static_cast<unsigned long>(v.start),
                  static_cast<unsigned long>(v.end), (v.prot & PROT_READ) ? 'r' : '-', (v.prot & PROT_WRITE) ? 'w' : '-',
                  (v.prot & PROT_EXEC) ? 'x' : '-', v.shared ? 's' : 'p', static_cast<unsigned long long>(v.offset),
                  v.dev_major, v.dev_minor, static_cast<unsigned long long>(v.inode));
    *out += line;
    *out += v.name_str;
    *out += '\n';
  }
  return r;
}

}  // namespace sv
