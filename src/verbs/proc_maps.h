// The process's own VMAs, from /proc/self/maps: the kernel's PROCMAP_QUERY
// ioctl for a range (Linux 6.11), the text as the fallback and for a walk
// of the whole address space. Used by mem_backing.cc (which ranges to
// convert into its backing file, and which to revert); internal.
#pragma once

#include <sys/mman.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "common/proc_maps_text.h"
#include "raw_syscalls.h"

namespace sv::procmaps {

struct Vma : VmaView {
  std::string name_str;
};

// Calls f(const VmaView&) for every line of /proc/self/maps, in address
// order. Reads the whole file first into memory from mmap, not from the heap
// (usable in the fork child before its heap pages are private again).
template <class F>
int for_each_vma(F&& f) {
  for (size_t cap = size_t{1} << 18;; cap *= 2) {
    uintptr_t buf = 0;
    if (int r = rawsys::mmap(0, cap, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0, &buf)) return r;
    int fd = -1;
    int r = rawsys::open_ro("/proc/self/maps", &fd);
    size_t used = 0;
    if (r == 0) {
      for (;;) {
        size_t got = 0;
        if ((r = rawsys::read(fd, reinterpret_cast<char*>(buf) + used, cap - used, &got)) || got == 0) break;
        used += got;
        if (used == cap) break;
      }
      rawsys::close(fd);
    }
    if (r == 0 && used < cap) {
      const char* p = reinterpret_cast<const char*>(buf);
      const char* end = p + used;
      while (p < end) {
        const char* nl = static_cast<const char*>(std::memchr(p, '\n', static_cast<size_t>(end - p)));
        const char* le = nl ? nl : end;
        VmaView v;
        if (parse_maps_line(p, le, &v)) f(v);
        p = nl ? nl + 1 : end;
      }
    }
    rawsys::munmap(buf, cap);
    if (r != 0 || used < cap) return r;
    // Buffer full: retry with a bigger one.
  }
}

// /proc/self/maps kept open between queries. It describes the process that
// opened it: a forked child must forget() it (which closes it while it is
// still the file that was opened) and open its own.
struct MapsFile {
  int fd = -1;
  uint64_t dev = 0;
  uint64_t ino = 0;
};
void forget(MapsFile* cache);

// The VMAs overlapping [lo, hi), sorted by address (allocates): the
// kernel's answer, or the text's where it has none. `cache`: the file to
// query through and keep open (none: opened and closed here).
int read_maps(uintptr_t lo, uintptr_t hi, std::vector<Vma>* out, MapsFile* cache = nullptr);
// Each source alone (tests compare them).
int query_maps(uintptr_t lo, uintptr_t hi, std::vector<Vma>* out, MapsFile* cache = nullptr);
int read_maps_text(uintptr_t lo, uintptr_t hi, std::vector<Vma>* out);

}  // namespace sv::procmaps
