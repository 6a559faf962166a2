// raw_syscalls.h: the system calls MemBacking (mem_backing.cc) makes, wrapped
// once. Each wrapper returns 0 or a positive errno.
//
// They bypass libc: libc's pwrite/pread/mmap are intercepted by sanitizers
// (which would check application bytes we copy, e.g. ASan redzones, or
// re-shadow memory we replace in place, TSan), and on x86-64 the `syscall`
// instruction is issued inline, so code running while part of the address
// space is PROT_NONE touches neither the PLT/GOT nor errno.
#pragma once

#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace sv::rawsys {

// Returns the raw kernel result: >= 0, or -errno.
inline long sc(long nr, long a1 = 0, long a2 = 0, long a3 = 0, long a4 = 0, long a5 = 0, long a6 = 0) {
#if defined(__x86_64__)
  long r;
  register long r10 asm("r10") = a4;
  register long r8 asm("r8") = a5;
  register long r9 asm("r9") = a6;
  asm volatile("syscall"
               : "=a"(r)
               : "a"(nr), "D"(a1), "S"(a2), "d"(a3), "r"(r10), "r"(r8), "r"(r9)
               : "rcx", "r11", "memory");
  return r;
#else
  const int saved = errno;
  long r = syscall(nr, a1, a2, a3, a4, a5, a6);
  if (r == -1) r = -errno;
  errno = saved;
  return r;
#endif
}

// Whether the inline path (no libc involvement at all) is in use.
constexpr bool kInline =
#if defined(__x86_64__)
    true;
#else
    false;
#endif

inline long L(uintptr_t v) { return static_cast<long>(v); }
inline long L64(uint64_t v) { return static_cast<long>(v); }

inline int err(long r) { return r < 0 && r > -4096 ? static_cast<int>(-r) : 0; }

// Retries EINTR.
template <class F>
inline long again(F&& f) {
  for (;;) {
    long r = f();
    if (r != -EINTR) return r;
  }
}

inline int mprotect(uintptr_t a, size_t n, int prot) { return err(sc(SYS_mprotect, L(a), L(n), prot)); }

inline int munmap(uintptr_t a, size_t n) { return err(sc(SYS_munmap, L(a), L(n))); }

inline int mmap(uintptr_t hint, size_t n, int prot, int flags, int fd, uint64_t off, uintptr_t* out) {
  const long r = sc(SYS_mmap, L(hint), L(n), prot, flags, fd, L64(off));
  if (int e = err(r)) return e;
  *out = static_cast<uintptr_t>(r);
  return 0;
}

inline int mremap_fixed(uintptr_t from, size_t n, uintptr_t to) {
  return err(sc(SYS_mremap, L(from), L(n), L(n), MREMAP_MAYMOVE | MREMAP_FIXED, L(to)));
}

inline int mremap_dontunmap(uintptr_t from, size_t n, uintptr_t to) {
  return err(sc(SYS_mremap, L(from), L(n), L(n), MREMAP_MAYMOVE | MREMAP_FIXED | MREMAP_DONTUNMAP, L(to)));
}

inline int madvise(uintptr_t a, size_t n, int advice) { return err(sc(SYS_madvise, L(a), L(n), advice)); }

inline int ftruncate(int fd, uint64_t size) {
  return err(again([&] { return sc(SYS_ftruncate, fd, L64(size)); }));
}

inline int punch(int fd, uint64_t off, uint64_t n) {
  return err(again([&] {
    return sc(SYS_fallocate, fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, L64(off), L64(n));
  }));
}

inline int pwrite_all(int fd, uintptr_t src, size_t n, uint64_t off) {
  while (n > 0) {
    const long r = again([&] { return sc(SYS_pwrite64, fd, L(src), L(n), L64(off)); });
    if (int e = err(r)) return e;
    if (r == 0) return EIO;
    src += static_cast<size_t>(r);
    off += static_cast<uint64_t>(r);
    n -= static_cast<size_t>(r);
  }
  return 0;
}

inline int pread_all(int fd, uintptr_t dst, size_t n, uint64_t off) {
  while (n > 0) {
    const long r = again([&] { return sc(SYS_pread64, fd, L(dst), L(n), L64(off)); });
    if (int e = err(r)) return e;
    if (r == 0) return EIO;  // file shorter than expected
    dst += static_cast<size_t>(r);
    off += static_cast<uint64_t>(r);
    n -= static_cast<size_t>(r);
  }
  return 0;
}

inline int lseek(int fd, uint64_t off, int whence, uint64_t* out) {
  const long r = sc(SYS_lseek, fd, L64(off), whence);
  if (int e = err(r)) return e;
  *out = static_cast<uint64_t>(r);
  return 0;
}

inline int memfd_create(const char* name, unsigned flags, int* out) {
  const long r = sc(SYS_memfd_create, reinterpret_cast<long>(name), static_cast<long>(flags));
  if (int e = err(r)) return e;
  *out = static_cast<int>(r);
  return 0;
}

inline int fcntl(int fd, int cmd, long arg) { return err(sc(SYS_fcntl, fd, cmd, arg)); }

inline int fstat(int fd, struct stat* st) { return err(sc(SYS_fstat, fd, reinterpret_cast<long>(st))); }

inline int statfs(const char* path, struct statfs* st) {
  return err(sc(SYS_statfs, reinterpret_cast<long>(path), reinterpret_cast<long>(st)));
}

inline int open_ro(const char* path, int* out) {
  const long r = again([&] { return sc(SYS_openat, AT_FDCWD, reinterpret_cast<long>(path), O_RDONLY | O_CLOEXEC); });
  if (int e = err(r)) return e;
  *out = static_cast<int>(r);
  return 0;
}

inline int read(int fd, char* buf, size_t n, size_t* got) {
  const long r = again([&] { return sc(SYS_read, fd, reinterpret_cast<long>(buf), L(n)); });
  if (int e = err(r)) return e;
  *got = static_cast<size_t>(r);
  return 0;
}

inline void close(int fd) { sc(SYS_close, fd); }

inline int ioctl(int fd, unsigned long req, void* arg) {
  return err(again([&] { return sc(SYS_ioctl, fd, static_cast<long>(req), reinterpret_cast<long>(arg)); }));
}

inline long gettid() { return sc(SYS_gettid); }

inline void futex_wait(std::atomic<uint32_t>* word, uint32_t expected) {
  sc(SYS_futex, reinterpret_cast<long>(word), FUTEX_WAIT_PRIVATE, static_cast<long>(expected));
}

inline void futex_wake_all(std::atomic<uint32_t>* word) {
  sc(SYS_futex, reinterpret_cast<long>(word), FUTEX_WAKE_PRIVATE, INT32_MAX);
}

// sigaction goes through libc on purpose: sanitizers must see (and wrap) it.
inline int sigaction(int sig, const struct sigaction* sa, struct sigaction* old) {
  return ::sigaction(sig, sa, old) == -1 ? errno : 0;
}

}  // namespace sv::rawsys
