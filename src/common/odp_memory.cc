// odp_memory.cc: see odp_memory.h.
#include "common/odp_memory.h"

#include <fcntl.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "common/proc_maps_text.h"

namespace sv {
namespace {

// PROCMAP_QUERY (common/proc_maps_text.h): the VMA of a /proc/PID/maps
// descriptor's mm that covers an address, matching the flags asked for.
using procmaps::ProcmapQuery;
using procmaps::kProcmapQuery;
constexpr uint64_t kQueryReadable = procmaps::kVmaReadable, kQueryWritable = procmaps::kVmaWritable;
constexpr long kPidfsMagic = 0x50494446;  // PID_FS_MAGIC, include/uapi/linux/magic.h

int open_pair(const char* dir, Fd& mem, Fd& maps) {
  std::string m = std::string(dir) + "/mem", p = std::string(dir) + "/maps";
  mem.reset(::open(m.c_str(), O_RDWR | O_CLOEXEC));
  if (!mem.valid()) return errno;
  maps.reset(::open(p.c_str(), O_RDONLY | O_CLOEXEC));
  return maps.valid() ? 0 : errno;
}

// A pipe of this thread's through which OdpMemory::write copies into this
// process's own memory: vmsplice(2) takes references to the source's pages
// (get_user_pages_fast, no copy), read(2) copies them into the destination
// with copy_to_user, which faults the destination's pages in as the process
// itself would (no pinning) and fails with EFAULT, not a signal, on a page
// not mapped or not writable. One copy, and no pinning of the destination:
// about 1.7x process_vm_writev into 4 KiB pages (docs/MEMORY.md, "Cost").
// Made per thread (a shared pipe would mix two threads' bytes) and anew in
// a fork child (the parent's pipe is the same file).
class SplicePipe {
 public:
  ~SplicePipe() { reset(); }
  // The pipe's ends and its capacity, or false (the caller copies otherwise).
  bool ready() {
    if (owner_ != self_pid()) reset();
    if (rd_ >= 0) return true;
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0) return false;
    rd_ = fds[0], wr_ = fds[1];
    owner_ = self_pid();
    // The default capacity, not more: pipe pages count against the user's
    // pipe-user-pages-soft (pipe(7)), past which every new pipe of that
    // user, in any program, gets two pages; a larger pipe per thread would
    // spend that on the user's behalf.
    const int got = ::fcntl(wr_, F_GETPIPE_SZ);
    cap_ = got > 0 ? size_t(got) : 4096;
    return true;
  }
  // Drops the pipe (and whatever a failed copy left in it). A fork child
  // leaves the descriptors it inherited alone: it may have closed them and
  // reused their numbers.
  void reset() {
    if (rd_ >= 0 && owner_ == self_pid()) ::close(rd_), ::close(wr_);
    rd_ = wr_ = -1;
  }
  // n bytes from `src` (this process's memory, always there) to `dst`: 0,
  // EFAULT (dst not mapped or not writable there; bytes before it may have
  // landed), or -1 where the pipe failed before any byte of this round
  // moved (the caller copies the rest its own way).
  int copy(uint8_t* dst, const uint8_t* src, size_t n) {
    while (n) {
      iovec v{const_cast<uint8_t*>(src), std::min(n, cap_)};
      const ssize_t s = ::vmsplice(wr_, &v, 1, SPLICE_F_NONBLOCK);
      if (s < 0 && errno == EINTR) continue;
      if (s <= 0) return reset(), -1;
      for (ssize_t got = 0; got < s;) {
        const ssize_t r = ::read(rd_, dst + got, size_t(s - got));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return reset(), EFAULT;  // EFAULT: a hole; nothing else can fail a read of bytes there
        got += r;
      }
      src += s, dst += s, n -= size_t(s);
    }
    return 0;
  }

 private:
  int rd_ = -1, wr_ = -1;
  uint32_t owner_ = 0;
  size_t cap_ = 0;
};

// Which copy into this process's own memory is faster for this thread's
// writes, SplicePipe (0) or process_vm_writev (1), measured as it goes: the
// pipe is the faster into 4 KiB pages, process_vm_writev into transparent
// huge pages (pinning a huge page is one step); nothing cheap says which
// pages a range has. Writes under kMin bytes take process_vm_writev (one
// system call, not two); larger ones the faster so far, and every 16th the
// other. Each is judged by its fastest time per KiB over the last two
// epochs of 256 writes: a write the scheduler preempted only looks slower,
// and a change of pages is seen within an epoch or two.
class SelfCopyChoice {
 public:
  static constexpr size_t kMin = 16 * 1024;
  int pick(size_t n) {
    if (n < kMin) return 1;
    if (++calls_ % 256 == 0)
      for (int m : {0, 1}) last_[m] = now_[m], now_[m] = kNone;
    const double a = std::min(last_[0], now_[0]), b = std::min(last_[1], now_[1]);
    if (a == kNone || b == kNone) return a == kNone ? 0 : 1;
    const int best = a <= b ? 0 : 1;
    return calls_ % 16 == 0 ? 1 - best : best;
  }
  void record(int m, size_t n, uint64_t ns) {
    if (n >= kMin) now_[m] = std::min(now_[m], double(ns) * 1024.0 / double(n));
  }

 private:
  static constexpr double kNone = 1e300;
  double now_[2] = {kNone, kNone}, last_[2] = {kNone, kNone};
  uint32_t calls_ = 0;
};

}  // namespace

int OdpMemory::open(pid_t pid, int pidfd, std::shared_ptr<const OdpMemory>& out) {
  if (pid <= 0 || pidfd < 0) return ESRCH;
  char dir[32];
  std::snprintf(dir, sizeof dir, "/proc/%d", int(pid));
  Fd mem, maps;
  if (int e = open_pair(dir, mem, maps)) return e == ENOENT ? ESRCH : e;
  // The process behind pidfd had not exited after the opens: the number
  // was still its own, so the files are its mm's.
  if (!pidfd_alive(pidfd)) return ESRCH;
  Fd own(::fcntl(pidfd, F_DUPFD_CLOEXEC, 0));
  if (!own.valid()) return errno;
  // Only which pages are present is read from it (bit 63, proc(5)); made
  // in the same window as the others, so of the same mm, or left out.
  std::string pm = std::string(dir) + "/pagemap";
  Fd pagemap(::open(pm.c_str(), O_RDONLY | O_CLOEXEC));
  if (!pidfd_alive(pidfd)) return ESRCH;
  out.reset(new OdpMemory(pid, std::move(own), std::move(mem), std::move(maps), std::move(pagemap)));
  return 0;
}

int OdpMemory::open_self(std::shared_ptr<const OdpMemory>& out) {
  out.reset(new OdpMemory(::getpid(), Fd(), Fd(), Fd(), Fd()));
  return 0;
}

int OdpMemory::allows(uint64_t addr, size_t n, bool write) const {
  const uint64_t end = addr + n;
  if (end < addr) return EFAULT;
  for (uint64_t at = addr; at < end;) {
    ProcmapQuery q{};
    q.size = sizeof q;
    q.query_flags = write ? kQueryWritable : kQueryReadable;
    q.query_addr = at;
    if (::ioctl(maps_.get(), kProcmapQuery, &q) != 0) {
      if (errno == ENOENT) return EFAULT;  // no mapping there, or none that allows the access
      if (errno == ENOTTY) return allows_by_text(addr, n, write);
      return errno == ESRCH ? ESRCH : EFAULT;
    }
    if (q.vma_end <= at) return EFAULT;
    at = q.vma_end;
  }
  return 0;
}

// Before Linux 6.11: the maps text (proc(5): "start-end perms ..."), of the
// same mm.
int OdpMemory::allows_by_text(uint64_t addr, size_t n, bool write) const {
  std::string text;
  char buf[8192];
  for (off_t off = 0;;) {
    const ssize_t r = ::pread(maps_.get(), buf, sizeof buf, off);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return EFAULT;
    if (r == 0) break;
    text.append(buf, size_t(r));
    off += r;
  }
  if (text.empty()) return ESRCH;
  const uint64_t end = addr + n;
  uint64_t at = addr;
  for (size_t pos = 0; pos < text.size() && at < end;) {
    const size_t eol = std::min(text.find('\n', pos), text.size());
    procmaps::VmaView v;
    const bool ok = procmaps::parse_maps_line(text.data() + pos, text.data() + eol, &v);
    pos = eol + 1;
    if (!ok || v.end <= at) continue;
    if (v.start > at) return EFAULT;  // a gap
    if (!(v.prot & (write ? PROT_WRITE : PROT_READ))) return EFAULT;
    at = v.end;
  }
  return at >= end ? 0 : EFAULT;
}

int OdpMemory::readv_all(uint64_t addr, uint8_t* buf, size_t n) const {
  while (n) {
    iovec here{buf, n}, there{reinterpret_cast<void*>(addr), n};
    const ssize_t r = ::process_vm_readv(pid_, &here, 1, &there, 1, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return r < 0 ? errno : EFAULT;
    buf += r, addr += uint64_t(r), n -= size_t(r);
  }
  return 0;
}

int OdpMemory::read(uint64_t addr, void* buf, size_t n) const {
  if (n == 0) return 0;
  if (!pidfd_.valid()) return readv_all(addr, static_cast<uint8_t*>(buf), n);  // this process: its own pid
  // Another process's bytes reach `buf` only once the registrant was seen
  // alive after they were read.
  constexpr size_t kBounce = 64 * 1024;
  static thread_local uint8_t bounce[kBounce];
  for (size_t done = 0; done < n;) {
    const size_t k = std::min(n - done, kBounce);
    const int e = readv_all(addr + done, bounce, k);
    if (!alive()) return ESRCH;
    if (e) return e;
    std::memcpy(static_cast<uint8_t*>(buf) + done, bounce, k);
    done += k;
  }
  return 0;
}

int OdpMemory::absent_pages(uint64_t from, uint64_t end, uint64_t* out, int max, uint64_t* next) const {
  constexpr uint64_t kPage = 4096, kPresent = 1ull << 63;
  uint64_t entries[512];
  const uint64_t pages = std::min<uint64_t>((end - from + kPage - 1) / kPage, 512);
  const ssize_t r = ::pread(pagemap_.get(), entries, pages * 8, off_t(from / kPage * 8));
  if (r <= 0 || r % 8) return -1;
  int k = 0;
  uint64_t i = 0;
  for (; i < uint64_t(r) / 8 && k < max; ++i)
    if (!(entries[i] & kPresent)) out[k++] = from + i * kPage;
  *next = from + i * kPage;
  return k;
}

// One byte of each page of [addr, addr + n) not present now, read: the
// pages are faulted in where the wait is killable. A present page needs no
// fault (as far as a read goes; see docs/MEMORY.md for what remains).
int OdpMemory::prefault(uint64_t addr, size_t n) const {
  constexpr uint64_t kPage = 4096;
  constexpr int kBatch = 64;
  uint8_t sink[kBatch];
  uint64_t pages[kBatch];
  iovec here[kBatch], there[kBatch];
  const uint64_t end = addr + n;
  for (uint64_t at = addr & ~(kPage - 1); at < end;) {
    int k = pagemap_.valid() ? absent_pages(at, end, pages, kBatch, &at) : -1;
    if (k < 0) {  // no pagemap: every page
      for (k = 0; k < kBatch && at < end; ++k, at += kPage) pages[k] = at;
    }
    for (int i = 0; i < k; ++i) {
      here[i] = {sink + i, 1};
      there[i] = {reinterpret_cast<void*>(std::max(pages[i], addr)), 1};
    }
    if (k == 0) continue;
    ssize_t r;
    while ((r = ::process_vm_readv(pid_, here, size_t(k), there, size_t(k), 0)) < 0 && errno == EINTR) {
    }
    if (r != ssize_t(k)) return r < 0 ? errno : EFAULT;
  }
  return alive() ? 0 : ESRCH;
}

int OdpMemory::write(uint64_t addr, const void* buf, size_t n) const {
  if (n == 0) return 0;
  if (!pidfd_.valid()) {  // this process: its own protections and faults
    auto* p = static_cast<uint8_t*>(const_cast<void*>(buf));
    static thread_local SplicePipe pipe;
    static thread_local SelfCopyChoice choice;
    const int how = choice.pick(n);
    const uint64_t t0 = monotonic_ns();
    if (how == 0 && pid_t(self_pid()) == pid_ && pipe.ready()) {
      const int e = pipe.copy(reinterpret_cast<uint8_t*>(addr), p, n);
      if (e == 0) choice.record(0, n, monotonic_ns() - t0);
      if (e >= 0) return e;
    }
    const size_t all = n;
    while (n) {
      iovec here{p, n}, there{reinterpret_cast<void*>(addr), n};
      const ssize_t r = ::process_vm_writev(pid_, &here, 1, &there, 1, 0);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) return r < 0 ? errno : EFAULT;
      p += r, addr += uint64_t(r), n -= size_t(r);
    }
    if (how == 1) choice.record(1, all, monotonic_ns() - t0);
    return 0;
  }
  if (int e = allows(addr, n, true)) return e;
  if (int e = prefault(addr, n)) return e;
  auto* p = static_cast<const uint8_t*>(buf);
  while (n) {
    const ssize_t r = ::pwrite(mem_.get(), p, n, off_t(addr));
    if (r < 0 && errno == EINTR) continue;
    if (r == 0) return ESRCH;
    if (r < 0) return errno == EIO ? EFAULT : errno;
    p += r, addr += uint64_t(r), n -= size_t(r);
  }
  return 0;
}

int OdpMemory::store_word(uint64_t addr, uint64_t value) const {
  if (addr % sizeof value) return EINVAL;
  return write(addr, &value, sizeof value);
}

uint64_t pidfd_identity(int pidfd) {
  struct statfs fs {};
  struct stat st {};
  if (pidfd < 0 || ::fstatfs(pidfd, &fs) != 0 || long(fs.f_type) != kPidfsMagic || ::fstat(pidfd, &st) != 0) return 0;
  return uint64_t(st.st_ino);
}

}  // namespace sv
