// See proc_maps.h.
#include "proc_maps.h"

#include <linux/limits.h>
#include <sys/ioctl.h>
#include <sys/stat.h>

namespace sv::procmaps {

// An open /proc/self/maps: the one in `cache` while fstat(2) says it is
// still the file we opened (the application may have closed the number and
// reused it), else a new one, kept in `cache` if there is one. Opening it
// is a path walk that costs more than the query itself.
static int open_maps(MapsFile* cache, int* fd) {
  struct stat st;
  if (cache && cache->fd >= 0) {
    if (rawsys::fstat(cache->fd, &st) == 0 && uint64_t(st.st_dev) == cache->dev && uint64_t(st.st_ino) == cache->ino) {
      *fd = cache->fd;
      return 0;
    }
    cache->fd = -1;  // not ours any more: not ours to close either
  }
  if (int r = rawsys::open_ro("/proc/self/maps", fd)) return r;
  if (cache && rawsys::fstat(*fd, &st) == 0) {
    cache->fd = *fd;
    cache->dev = uint64_t(st.st_dev);
    cache->ino = uint64_t(st.st_ino);
  }
  return 0;
}

void forget(MapsFile* cache) {
  struct stat st;
  if (cache->fd >= 0 && rawsys::fstat(cache->fd, &st) == 0 && uint64_t(st.st_dev) == cache->dev &&
      uint64_t(st.st_ino) == cache->ino)
    rawsys::close(cache->fd);
  *cache = MapsFile{};
}

// The VMAs overlapping [lo, hi) through PROCMAP_QUERY. An errno when the
// kernel cannot answer (ENOTTY before 6.11, ENAMETOOLONG for a name longer
// than PATH_MAX): the caller reads the text instead.
int query_maps(uintptr_t lo, uintptr_t hi, std::vector<Vma>* out, MapsFile* cache) {
  int fd = -1;
  if (int r = open_maps(cache, &fd)) return r;
  char name[PATH_MAX + 16];
  int r = 0;
  for (uintptr_t at = lo; at < hi;) {
    ProcmapQuery q{};
    q.size = sizeof q;
    q.query_flags = kCoveringOrNext;
    q.query_addr = at;
    q.vma_name_addr = reinterpret_cast<uintptr_t>(name);
    q.vma_name_size = sizeof name;
    if ((r = rawsys::ioctl(fd, kProcmapQuery, &q)) != 0) {
      if (r == ENOENT) r = 0;  // no VMA at or after `at`
      break;
    }
    if (q.vma_start >= hi || q.vma_end <= at) break;
    Vma m;
    m.start = q.vma_start;
    m.end = q.vma_end;
    m.prot = ((q.vma_flags & kVmaReadable) ? PROT_READ : 0) | ((q.vma_flags & kVmaWritable) ? PROT_WRITE : 0) |
             ((q.vma_flags & kVmaExecutable) ? PROT_EXEC : 0);
    m.shared = (q.vma_flags & kVmaShared) != 0;
    m.offset = q.vma_offset;
    m.dev_major = q.dev_major;
    m.dev_minor = q.dev_minor;
    m.inode = q.inode;
    if (q.vma_name_size > 1 && q.vma_name_size <= sizeof name) m.name_str.assign(name, q.vma_name_size - 1);
    out->push_back(std::move(m));
    at = q.vma_end;
  }
  if (!cache) rawsys::close(fd);
  return r;
}

// The same from the text of /proc/self/maps, every line parsed.
int read_maps_text(uintptr_t lo, uintptr_t hi, std::vector<Vma>* out) {
  out->clear();
  return for_each_vma([&](const VmaView& v) {
    if (v.end <= lo || v.start >= hi) return;
    Vma m;
    static_cast<VmaView&>(m) = v;
    m.name_str.assign(v.name, v.name_len);
    m.name = nullptr;
    m.name_len = 0;
    out->push_back(std::move(m));
  });
}

int read_maps(uintptr_t lo, uintptr_t hi, std::vector<Vma>* out, MapsFile* cache) {
  out->clear();
  if (query_maps(lo, hi, out, cache) == 0) return 0;
  return read_maps_text(lo, hi, out);
}

}  // namespace sv::procmaps
