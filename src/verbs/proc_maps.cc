// See proc_maps.h.
#include "proc_maps.h"

#include <linux/limits.h>
#include <sys/ioctl.h>
#include <sys/stat.h>

namespace sv::procmaps {
namespace {

bool parse_num(const char*& p, const char* end, int base, uint64_t* out) {
  uint64_t v = 0;
  const char* s = p;
  for (; p < end; ++p) {
    int d;
    const char c = *p;
    if (c >= '0' && c <= '9') {
      d = c - '0';
    } else if (base == 16 && c >= 'a' && c <= 'f') {
      d = c - 'a' + 10;
    } else if (base == 16 && c >= 'A' && c <= 'F') {
      d = c - 'A' + 10;
    } else {
      break;
    }
    v = v * static_cast<uint64_t>(base) + static_cast<uint64_t>(d);
  }
  *out = v;
  return p != s;
}

bool parse_char(const char*& p, const char* end, char c) {
  if (p >= end || *p != c) return false;
  ++p;
  return true;
}

void skip_spaces(const char*& p, const char* end) {
  while (p < end && *p == ' ') ++p;
}

}  // namespace

bool parse_maps_line(const char* p, const char* end, VmaView* v) {
  uint64_t x = 0;
  if (!parse_num(p, end, 16, &x)) return false;
  v->start = x;
  if (!parse_char(p, end, '-') || !parse_num(p, end, 16, &x)) return false;
  v->end = x;
  skip_spaces(p, end);
  if (end - p < 4) return false;
  v->prot = (p[0] == 'r' ? PROT_READ : 0) | (p[1] == 'w' ? PROT_WRITE : 0) | (p[2] == 'x' ? PROT_EXEC : 0);
  v->shared = p[3] == 's';
  p += 4;
  skip_spaces(p, end);
  if (!parse_num(p, end, 16, &v->offset)) return false;
  skip_spaces(p, end);
  if (!parse_num(p, end, 16, &x)) return false;
  v->dev_major = static_cast<unsigned>(x);
  if (!parse_char(p, end, ':') || !parse_num(p, end, 16, &x)) return false;
  v->dev_minor = static_cast<unsigned>(x);
  skip_spaces(p, end);
  if (!parse_num(p, end, 10, &v->inode)) return false;
  skip_spaces(p, end);
  v->name = p;
  v->name_len = static_cast<size_t>(end - p);
  return true;
}

namespace {

// PROCMAP_QUERY (Linux 6.11; include/uapi/linux/fs.h, fs/proc/task_mmu.c
// do_procmap_query): an ioctl on /proc/self/maps that answers with the VMA
// covering an address, or the next one, in binary. read_maps() asks it for
// the VMAs of the range alone: formatting and parsing every line of the
// text file was 41 % of the library's time in an ibv_reg_mr + ibv_dereg_mr
// of 4 KiB (docs/PERFORMANCE.md, "Registration"). The answer carries
// what a text line does: a file's offset, device and inode (zero for
// anonymous memory, as the text shows them), the protection, shared or
// private, and the name the text would show ([heap], [anon:x], a path, a
// deleted file's " (deleted)").
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
  uint32_t vma_name_size;  // in: the buffer's size; out: the name's, with its NUL (0: no name)
  uint32_t build_id_size;
  uint64_t vma_name_addr;
  uint64_t build_id_addr;
};
static_assert(sizeof(ProcmapQuery) == 104, "the kernel's struct procmap_query");
constexpr unsigned long kProcmapQuery = _IOWR('f', 17, ProcmapQuery);
enum : uint64_t {
  kVmaReadable = 0x01,
  kVmaWritable = 0x02,
  kVmaExecutable = 0x04,
  kVmaShared = 0x08,
  kCoveringOrNext = 0x10,
};

}  // namespace

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
