// proc_maps_text.h: what the kernel says about a process's mappings, in
// its two forms (proc(5)): a line of /proc/PID/maps as text, and the
// PROCMAP_QUERY ioctl on that file (Linux 6.11). Pure parsing and the
// ioctl's ABI; shared by the library's own-maps reader (verbs/proc_maps.h)
// and the ODP address-space checks (common/odp_memory.h). Header-only and
// free of libc calls (the library's fork-time reader may not take locks).
#pragma once

#include <sys/ioctl.h>
#include <sys/mman.h>

#include <cstddef>
#include <cstdint>

namespace sv::procmaps {

// One /proc/self/maps line. `name` points into the buffer being parsed.
struct VmaView {
  uintptr_t start = 0;
  uintptr_t end = 0;
  int prot = 0;
  bool shared = false;
  uint64_t offset = 0;
  unsigned dev_major = 0;
  unsigned dev_minor = 0;
  uint64_t inode = 0;
  const char* name = nullptr;
  size_t name_len = 0;
};

namespace text_detail {

inline bool parse_num(const char*& p, const char* end, int base, uint64_t* out) {
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

inline bool parse_char(const char*& p, const char* end, char c) {
  if (p >= end || *p != c) return false;
  ++p;
  return true;
}

inline void skip_spaces(const char*& p, const char* end) {
  while (p < end && *p == ' ') ++p;
}

}  // namespace text_detail

// "start-end perms offset major:minor inode   name"; false for a line
// that is not one.
inline bool parse_maps_line(const char* p, const char* end, VmaView* v) {
  uint64_t x = 0;
  if (!text_detail::parse_num(p, end, 16, &x)) return false;
  v->start = x;
  if (!text_detail::parse_char(p, end, '-') || !text_detail::parse_num(p, end, 16, &x)) return false;
  v->end = x;
  text_detail::skip_spaces(p, end);
  if (end - p < 4) return false;
  v->prot = (p[0] == 'r' ? PROT_READ : 0) | (p[1] == 'w' ? PROT_WRITE : 0) | (p[2] == 'x' ? PROT_EXEC : 0);
  v->shared = p[3] == 's';
  p += 4;
  text_detail::skip_spaces(p, end);
  if (!text_detail::parse_num(p, end, 16, &v->offset)) return false;
  text_detail::skip_spaces(p, end);
  if (!text_detail::parse_num(p, end, 16, &x)) return false;
  v->dev_major = static_cast<unsigned>(x);
  if (!text_detail::parse_char(p, end, ':') || !text_detail::parse_num(p, end, 16, &x)) return false;
  v->dev_minor = static_cast<unsigned>(x);
  text_detail::skip_spaces(p, end);
  if (!text_detail::parse_num(p, end, 10, &v->inode)) return false;
  text_detail::skip_spaces(p, end);
  v->name = p;
  v->name_len = static_cast<size_t>(end - p);
  return true;
}

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

}  // namespace sv::procmaps
