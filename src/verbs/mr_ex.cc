// The registration calls of rdma-core v64 (IBVERBS_1.15-1.17) and the
// verbs_context ops behind them:
//   ibv_reg_mr_ex(3)        one registration call for every input: an
//                           address or a dma-buf fd, an IOVA, a DMA handle,
//                           a buffer from ibv_alloc_buf;
//   ibv_alloc_dmah(3)       a DMA handle: PCIe TLP processing hints (a CPU,
//                           a memory type, a processing hint) for the
//                           device's writes to the MRs registered with it;
//   ibv_alloc_buf(3)        a buffer the provider chooses the backing of,
//                           registered with ibv_reg_buf_mr;
//   ibv_dm_export_dmabuf_fd device memory as a dma-buf.
// A software device writes with the CPU: the DMA handle's hints are checked
// as the kernel checks them (drivers/infiniband/core/uverbs_std_types_dmah.c)
// and then have nothing to steer. A dma-buf can be neither imported nor
// exported here: there is no device for the kernel's dma-buf to attach to.
#include <sched.h>
#include <sys/mman.h>
#include <unistd.h>
#include <fcntl.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>

#include "verbs/provider.h"

namespace sv::verbs {

struct DmahState {
  abi::Dmah dmah;  // first: the application holds &dmah
  std::atomic<uint32_t> mrs{0};  // MRs registered with it (ibv_dealloc_dmah is EBUSY while any)
  uint32_t comp_mask = 0;
  uint32_t cpu_id = 0;
  uint8_t ph = 0;
  uint8_t mem_type = 0;
};

// ibv_buf as rdma-core's driver.h lays it out (the application sees a
// pointer only). dmabuf_fd is always -1: the buffer is process memory.
struct BufState {
  void* addr;
  size_t size;
  ibv_pd* pd;
  int dmabuf_fd;
};

namespace {

constexpr uint64_t kRegMrKnown = abi::kRegMrMaskIova | abi::kRegMrMaskAddr | abi::kRegMrMaskFd |
                                 abi::kRegMrMaskFdOffset | abi::kRegMrMaskDmah | abi::kRegMrMaskBuf;
constexpr uint32_t kDmahKnown = abi::kDmahMaskCpuId | abi::kDmahMaskPh | abi::kDmahMaskTphMemType;

template <typename T>
T* refuse(int e, const char* why = nullptr) {
  if (why) std::fprintf(stderr, "softverbs: %s\n", why);
  errno = e;
  return nullptr;
}

// A CPU this process may run on (the kernel's check: cpumask_test_cpu on
// the caller's cpus_ptr, EPERM). One beyond the machine's CPUs is EINVAL.
int check_cpu(uint32_t cpu) {
  long n = sysconf(_SC_NPROCESSORS_CONF);
  if (n > 0 && cpu >= uint64_t(n)) return EINVAL;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0 && (cpu >= CPU_SETSIZE || !CPU_ISSET(cpu, &set)))
    return EPERM;
  return 0;
}

// ibv_reg_mr_ex with IBV_REG_MR_MASK_BUF: the range must lie in the buffer,
// allocated on this PD, and be named by address (rdma-core's verbs.c does
// the same translation before the provider sees the request).
int check_buf(ibv_pd* pd, const abi::MrInitAttr& a) {
  auto* b = reinterpret_cast<const BufState*>(a.buf);
  if (!b || b->pd != pd) return EINVAL;
  if (!(a.comp_mask & abi::kRegMrMaskAddr)) return EINVAL;
  if (a.comp_mask & (abi::kRegMrMaskFd | abi::kRegMrMaskFdOffset)) return EINVAL;
  auto base = reinterpret_cast<uintptr_t>(b->addr), addr = reinterpret_cast<uintptr_t>(a.addr);
  if (addr < base || addr - base > b->size || a.length > b->size - (addr - base)) return EINVAL;
  return 0;
}

}  // namespace

// ibv_reg_dmabuf_mr(3): the fd must be open (EBADF as the kernel's
// dma_buf_get); an open one is refused: a dma-buf needs a device to attach
// to, and this one has none.
ibv_mr* reg_dmabuf_mr(ibv_pd* pd, uint64_t, size_t length, uint64_t, int fd, int) {
  if (!pd || length == 0) return refuse<ibv_mr>(EINVAL, "ibv_reg_dmabuf_mr: no PD or a zero length");
  if (fd < 0 || fcntl(fd, F_GETFD) < 0)
    return refuse<ibv_mr>(EBADF, "ibv_reg_dmabuf_mr: the dma-buf fd is not an open file descriptor");
  return refuse<ibv_mr>(EOPNOTSUPP,
                      "ibv_reg_dmabuf_mr: a software device cannot attach to a dma-buf "
                      "(register the memory by address instead)");
}

// ibv_reg_mr_ex(3). Unknown comp_mask bits are EOPNOTSUPP; inconsistent
// ones EINVAL (an fd with an address, an fd without its offset and IOVA,
// an address-less registration without an fd), as rdma-core's generic
// reg_mr_ex (libibverbs/dummy_ops.c) and cmd_mr.c.
ibv_mr* reg_mr_ex(ibv_pd* pd, abi::MrInitAttr* attr) {
  if (!pd || !attr) return refuse<ibv_mr>(EINVAL, "ibv_reg_mr_ex: no PD or no attributes");
  abi::MrInitAttr a = *attr;
  if (a.comp_mask & ~kRegMrKnown)
    return refuse<ibv_mr>(EOPNOTSUPP, "ibv_reg_mr_ex: comp_mask has bits this libibverbs does not know");
  if (a.comp_mask & abi::kRegMrMaskBuf) {
    if (int e = check_buf(pd, a))
      return refuse<ibv_mr>(e, "ibv_reg_mr_ex: the range is not inside the ibv_buf of this PD, or lacks its address");
  }
  DmahState* dmah = nullptr;
  if (a.comp_mask & abi::kRegMrMaskDmah) {
    dmah = reinterpret_cast<DmahState*>(a.dmah);
    if (!dmah || dmah->dmah.context != pd->context)
      return refuse<ibv_mr>(EINVAL, "ibv_reg_mr_ex: the DMA handle is missing or of another context");
    if (a.access & IBV_ACCESS_ON_DEMAND)
      return refuse<ibv_mr>(EINVAL, "ibv_reg_mr_ex: a DMA handle cannot steer an on-demand-paging MR");
  }
  ibv_mr* mr;
  if (a.comp_mask & abi::kRegMrMaskFd) {
    if ((a.comp_mask & abi::kRegMrMaskAddr) || !(a.comp_mask & abi::kRegMrMaskFdOffset) ||
        !(a.comp_mask & abi::kRegMrMaskIova))
      return refuse<ibv_mr>(EINVAL, "ibv_reg_mr_ex: an fd registration needs FD_OFFSET and IOVA, and no ADDR");
    mr = reg_dmabuf_mr(pd, a.fd_offset, a.length, a.iova, a.fd, a.access);
  } else {
    if (!(a.comp_mask & abi::kRegMrMaskAddr) || (a.comp_mask & abi::kRegMrMaskFdOffset))
      return refuse<ibv_mr>(EINVAL, "ibv_reg_mr_ex: a registration by address needs ADDR and no FD_OFFSET");
    uint64_t iova = (a.comp_mask & abi::kRegMrMaskIova) ? a.iova : reinterpret_cast<uintptr_t>(a.addr);
    mr = reg_mr(pd, a.addr, a.length, iova, a.access);
  }
  if (mr && dmah) {
    dmah->mrs.fetch_add(1, std::memory_order_relaxed);
    to_mr(mr)->dmah = dmah;
  }
  return mr;
}

// ibv_alloc_dmah(3). Each field is checked only when comp_mask names it:
// the CPU (check_cpu), the memory type (IBV_TPH_MEM_TYPE_VM or _PM), the
// processing hint (two bits: PCIe 6.2 section 2.2.7.1.1).
abi::Dmah* alloc_dmah(ibv_context* c, abi::DmahInitAttr* attr) {
  if (!c || !attr) return refuse<abi::Dmah>(EINVAL, "ibv_alloc_dmah: no context or no attributes");
  if (attr->comp_mask & ~kDmahKnown)
    return refuse<abi::Dmah>(EOPNOTSUPP, "ibv_alloc_dmah: comp_mask has bits this libibverbs does not know");
  if (attr->comp_mask & abi::kDmahMaskCpuId) {
    if (int e = check_cpu(attr->cpu_id)) {
      std::fprintf(stderr, "softverbs: ibv_alloc_dmah: cpu_id %u is %s\n", attr->cpu_id,
                   e == EINVAL ? "not a CPU of this machine" : "not one this process may run on");
      return refuse<abi::Dmah>(e);
    }
  }
  if ((attr->comp_mask & abi::kDmahMaskTphMemType) && attr->tph_mem_type != abi::kTphMemVolatile &&
      attr->tph_mem_type != abi::kTphMemPersistent)
    return refuse<abi::Dmah>(EINVAL, "ibv_alloc_dmah: tph_mem_type is neither IBV_TPH_MEM_TYPE_VM nor _PM");
  if ((attr->comp_mask & abi::kDmahMaskPh) && (attr->ph & ~3u))
    return refuse<abi::Dmah>(EINVAL, "ibv_alloc_dmah: ph (a TLP processing hint) is two bits: 0 to 3");
  auto* d = new (std::nothrow) DmahState;
  if (!d) return refuse<abi::Dmah>(ENOMEM);
  d->dmah.context = c;
  d->comp_mask = attr->comp_mask;
  d->cpu_id = attr->cpu_id;
  d->ph = attr->ph;
  d->mem_type = attr->tph_mem_type;
  return &d->dmah;
}

// ibv_dealloc_dmah(3): EBUSY while an MR registered with it remains.
int dealloc_dmah(abi::Dmah* dmah) {
  if (!dmah) return EINVAL;
  auto* d = reinterpret_cast<DmahState*>(dmah);
  if (d->mrs.load(std::memory_order_relaxed)) return EBUSY;
  delete d;
  return 0;
}

void release_dmah(DmahState* dmah) { dmah->mrs.fetch_sub(1, std::memory_order_relaxed); }

// ibv_alloc_buf(3): page-aligned process memory, which ibv_reg_buf_mr
// registers by address like any other.
void* alloc_buf(ibv_pd* pd, size_t size, abi::Buf** buf) {
  if (!pd || !buf || size == 0) return refuse<void>(EINVAL, "ibv_alloc_buf: no PD, no handle pointer or a zero size");
  auto* b = static_cast<BufState*>(std::calloc(1, sizeof(BufState)));
  if (!b) return refuse<void>(ENOMEM);
  void* p = nullptr;
  if (int e = posix_memalign(&p, size_t(sysconf(_SC_PAGESIZE)), size)) {
    std::free(b);
    return refuse<void>(e);
  }
  *b = BufState{p, size, pd, -1};
  *buf = reinterpret_cast<abi::Buf*>(b);
  return p;
}

void free_buf(abi::Buf* buf) {
  if (!buf) return;
  auto* b = reinterpret_cast<BufState*>(buf);
  std::free(b->addr);
  std::free(b);
}

// ibv_dm_export_dmabuf_fd(3): device memory here is a shared file of the
// daemon's, not a device's BAR: there is no dma-buf to export.
int dm_export_dmabuf_fd(ibv_dm* dm) {
  if (!dm) {
    errno = EINVAL;
    return -1;
  }
  std::fprintf(stderr,
               "softverbs: ibv_dm_export_dmabuf_fd: device memory of a software device is not a dma-buf\n");
  errno = EOPNOTSUPP;
  return -1;
}

}  // namespace sv::verbs

using namespace sv::verbs;

// The public calls (rdma-core v64 libibverbs/verbs.h): the same functions
// as the context's ops, so a client reaching an op through verbs_context
// gets the same answers.
extern "C" {

ibv_mr* ibv_reg_mr_ex(ibv_pd* pd, sv::abi::MrInitAttr* attr) { return reg_mr_ex(pd, attr); }

ibv_mr* ibv_reg_dmabuf_mr(ibv_pd* pd, uint64_t offset, size_t length, uint64_t iova, int fd, int access) {
  return reg_dmabuf_mr(pd, offset, length, iova, fd, access);
}

sv::abi::Dmah* ibv_alloc_dmah(ibv_context* c, sv::abi::DmahInitAttr* attr) { return alloc_dmah(c, attr); }

int ibv_dealloc_dmah(sv::abi::Dmah* dmah) { return dealloc_dmah(dmah); }

int ibv_dm_export_dmabuf_fd(ibv_dm* dm) { return dm_export_dmabuf_fd(dm); }

void* ibv_alloc_buf(ibv_pd* pd, size_t size, sv::abi::Buf** buf) { return alloc_buf(pd, size, buf); }

void ibv_free_buf(sv::abi::Buf* buf) { free_buf(buf); }

// ibv_reg_buf_mr(3): ibv_reg_mr_ex with IBV_REG_MR_MASK_BUF | _ADDR.
ibv_mr* ibv_reg_buf_mr(ibv_pd* pd, sv::abi::Buf* buf, void* addr, size_t length, int access) {
  sv::abi::MrInitAttr a{};
  a.length = length;
  a.access = access;
  a.comp_mask = sv::abi::kRegMrMaskBuf | sv::abi::kRegMrMaskAddr;
  a.addr = addr;
  a.buf = buf;
  return reg_mr_ex(pd, &a);
}

}  // extern "C"
