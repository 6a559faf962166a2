// Named shared memory regions and reg_shared (seed 000). A region is a
// memfd the daemon keeps under a byte-array id; each caller maps it and
// registers it like any memory, with the region as the backing file.
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "softverbs/softverbs.h"
#include "verbs/provider.h"

namespace sv::verbs {
namespace {

// Does [addr, addr+len) map file (dev, ino) at file offset `off`, contiguously?
bool maps_same_pages(const void* addr, size_t len, dev_t dev, ino_t ino, uint64_t off) {
  FILE* f = std::fopen("/proc/self/maps", "r");
  if (!f) return false;
  uint64_t want = reinterpret_cast<uint64_t>(addr), end = want + len;
  uint64_t cursor = want;
  char line[512];
  while (cursor < end && std::fgets(line, sizeof(line), f)) {
    unsigned long long lo, hi, foff, inode;
    unsigned maj, min;
    char perms[8];
    if (std::sscanf(line, "%llx-%llx %7s %llx %x:%x %llu", &lo, &hi, perms, &foff, &maj, &min, &inode) != 7) continue;
    if (cursor < lo || cursor >= hi) continue;
    if (inode != ino || makedev(maj, min) != dev) break;
    if (foff + (cursor - lo) != off + (cursor - want)) break;
    cursor = hi;
  }
  std::fclose(f);
  return cursor >= end;
}

}  // namespace
}  // namespace sv::verbs

using namespace sv;
using namespace sv::verbs;

extern "C" {

ibv_mr* svx_reg_shmid(ibv_pd* pd, const void* id, size_t id_len, size_t length, unsigned int access, int* created) {
  if (!pd || !id || id_len == 0 || id_len > SVX_SHMID_MAX) {
    errno = EINVAL;
    return nullptr;
  }
  ContextState& st = ctx_state(pd->context);
  proto::RegShmidReq req{};
  req.pd = to_pd(pd)->handle;
  req.access = access;
  req.length = length;
  req.id_len = uint32_t(id_len);
  std::memcpy(req.id, id, id_len);
  proto::RegShmidReply rep{};
  std::vector<Fd> fds;
  if (int e = st.conn.call<proto::Op::RegShmid>(req, rep, {}, &fds)) {
    errno = e;
    return nullptr;
  }
  size_t len = length ? length : rep.length;
  Mapping map;
  if (int e = map_shared(fds[0].get(), 0, rep.length, PROT_READ | PROT_WRITE, false, map)) {
    errno = e;
    return nullptr;
  }
  proto::RegMrReq r{};
  r.pd = to_pd(pd)->handle;
  r.backing = rep.backing;
  r.addr = 0;
  r.length = len;
  r.iova = reinterpret_cast<uint64_t>(map.get());
  r.access = access & ~uint32_t(IBV_ACCESS_OPTIONAL_RANGE);
  proto::RegMrReply mr_rep{};
  if (int e = st.conn.call<proto::Op::RegMr>(r, mr_rep)) {
    errno = e;
    return nullptr;
  }
  Mr* mr = new_mr_handle(pd, map.get(), len, mr_rep.handle, mr_rep.key);
  if (!mr) {
    errno = ENOMEM;
    return nullptr;
  }
  {
    std::lock_guard<std::mutex> g(st.mu);
    st.local_views[rep.backing] = {map.as<uint8_t>(), 0};
  }
  mr->map_len = map.size();
  mr->map_addr = map.get();
  map.release_ownership();
  if (created) *created = int(rep.created);
  return &mr->mr;
}

ibv_mr* svx_reg_shared(ibv_mr* old, ibv_pd* pd, void* addr, unsigned int access) {
  if (!old || !pd || pd->context->device != old->context->device) {
    errno = EINVAL;
    return nullptr;
  }
  ContextState& st = ctx_state(pd->context);
  const MrEntry* e = st.mr(old->lkey);
  if (!e) {
    errno = EINVAL;
    return nullptr;
  }
  uint64_t file_offset = e->file_offset, length = e->length;
  // The backing file that holds the MR's pages.
  proto::GetMrBackingReq greq{};
  greq.key = old->lkey;
  proto::GetMrBackingReply grep{};
  std::vector<Fd> fds;
  if (int err = st.conn.call<proto::Op::GetMrBacking>(greq, grep, {}, &fds)) {
    errno = err;
    return nullptr;
  }
  void* map_addr = nullptr;
  size_t map_len = 0;
  if (addr) {
    struct stat sst {};
    if (::fstat(fds[0].get(), &sst) != 0 || !maps_same_pages(addr, length, sst.st_dev, sst.st_ino, file_offset)) {
      errno = EINVAL;  // not the very same pages
      return nullptr;
    }
  } else {
    uint64_t base = page_down(file_offset);
    map_len = page_up(file_offset + length) - base;
    void* p = ::mmap(nullptr, map_len, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0].get(), off_t(base));
    if (p == MAP_FAILED) return nullptr;
    map_addr = p;
    addr = static_cast<uint8_t*>(p) + (file_offset - base);
  }
  proto::RegSharedReq req{};
  req.key = old->lkey;
  req.pd = to_pd(pd)->handle;
  req.iova = reinterpret_cast<uint64_t>(addr);
  req.access = access & ~uint32_t(IBV_ACCESS_OPTIONAL_RANGE);
  proto::RegMrReply rep{};
  if (int err = st.conn.call<proto::Op::RegShared>(req, rep)) {
    if (map_addr) ::munmap(map_addr, map_len);
    errno = err;
    return nullptr;
  }
  Mr* mr = new_mr_handle(pd, addr, length, rep.handle, rep.key);
  if (!mr) {
    errno = ENOMEM;
    return nullptr;
  }
  mr->map_addr = map_addr;
  mr->map_len = map_len;
  return &mr->mr;
}

}  // extern "C"
