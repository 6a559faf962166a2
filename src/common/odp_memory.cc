// odp_memory.cc: see odp_memory.h.
#include "common/odp_memory.h"

#include <fcntl.h>
#include <sys/ioctl.h>
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

namespace sv {
namespace {

// PROCMAP_QUERY (include/uapi/linux/fs.h, Linux 6.11): the VMA of a
// /proc/PID/maps descriptor's mm that covers an address, matching the
// flags asked for. The layout is the kernel's ABI; declared here because
// older system headers lack it.
struct ProcmapQuery {
  uint64_t size;
  uint64_t query_flags;
  uint64_t query_addr;
  uint64_t vma_start;
  uint64_t vma_end;
  uint64_t vma_flags;
  uint64_t vma_page_size;
  uint64_t vma_offset;
  uint64_t inode;
  uint32_t dev_major;
  uint32_t dev_minor;
  uint32_t vma_name_size;
  uint32_t build_id_size;
  uint64_t vma_name_addr;
  uint64_t build_id_addr;
};
static_assert(sizeof(ProcmapQuery) == 104);
constexpr unsigned long kProcmapQuery = 0xC0686611;  // _IOWR('f', 17, struct procmap_query)
constexpr uint64_t kQueryReadable = 0x01, kQueryWritable = 0x02;
constexpr long kPidfsMagic = 0x50494446;  // PID_FS_MAGIC, include/uapi/linux/magic.h

int open_pair(const char* dir, Fd& mem, Fd& maps) {
  std::string m = std::string(dir) + "/mem", p = std::string(dir) + "/maps";
  mem.reset(::open(m.c_str(), O_RDWR | O_CLOEXEC));
  if (!mem.valid()) return errno;
  maps.reset(::open(p.c_str(), O_RDONLY | O_CLOEXEC));
  return maps.valid() ? 0 : errno;
}

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
  out.reset(new OdpMemory(pid, std::move(own), std::move(mem), std::move(maps)));
  return 0;
}

int OdpMemory::open_self(std::shared_ptr<const OdpMemory>& out) {
  out.reset(new OdpMemory(::getpid(), Fd(), Fd(), Fd()));
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
    const size_t eol = text.find('\n', pos);
    const std::string line = text.substr(pos, eol == std::string::npos ? std::string::npos : eol - pos);
    pos = eol == std::string::npos ? text.size() : eol + 1;
    char* rest = nullptr;
    const uint64_t s = std::strtoull(line.c_str(), &rest, 16);
    if (!rest || *rest != '-') continue;
    const uint64_t e = std::strtoull(rest + 1, &rest, 16);
    if (!rest || rest[0] != ' ' || e <= at) continue;
    if (s > at) return EFAULT;  // a gap
    if (rest[write ? 2 : 1] != (write ? 'w' : 'r')) return EFAULT;
    at = e;
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

// One byte of each page of [addr, addr + n), read: the pages are faulted
// in where the wait is killable.
int OdpMemory::prefault(uint64_t addr, size_t n) const {
  constexpr uint64_t kPage = 4096;
  constexpr size_t kBatch = 64;
  uint8_t sink[kBatch];
  iovec here[kBatch], there[kBatch];
  for (uint64_t at = addr & ~(kPage - 1); at < addr + n;) {
    size_t k = 0;
    for (; k < kBatch && at < addr + n; ++k, at += kPage) {
      here[k] = {sink + k, 1};
      there[k] = {reinterpret_cast<void*>(std::max(at, addr)), 1};
    }
    ssize_t r;
    while ((r = ::process_vm_readv(pid_, here, k, there, k, 0)) < 0 && errno == EINTR) {
    }
    if (r != ssize_t(k)) return r < 0 ? errno : EFAULT;
  }
  return alive() ? 0 : ESRCH;
}

int OdpMemory::write(uint64_t addr, const void* buf, size_t n) const {
  if (n == 0) return 0;
  if (!pidfd_.valid()) {  // this process: process_vm_writev keeps the protections
    auto* p = static_cast<uint8_t*>(const_cast<void*>(buf));
    while (n) {
      iovec here{p, n}, there{reinterpret_cast<void*>(addr), n};
      const ssize_t r = ::process_vm_writev(pid_, &here, 1, &there, 1, 0);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) return r < 0 ? errno : EFAULT;
      p += r, addr += uint64_t(r), n -= size_t(r);
    }
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
