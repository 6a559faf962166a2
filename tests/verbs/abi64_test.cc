// abi64_test.cc: the calls rdma-core added after v44 (IBVERBS_1.15-1.17 and
// the private nodes up to v64), through our libibverbs.so.1 as a program
// built against v64's verbs.h calls them: ibv_reg_mr_ex with each input and
// each malformed comp_mask, DMA handles and their validation, ibv_alloc_buf
// and ibv_reg_buf_mr, ibv_query_port_speed, ibv_query_port with v64's
// struct size, the v64 verbs_context layout, ibv_dm_export_dmabuf_fd,
// ibv_query_qp_data_in_order's capability bits, ibv_wr_opcode_str, and a
// private symbol at each release's node (dlvsym).
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <infiniband/verbs.h>
#include <sched.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "common/verbs_current.h"
#include "harness.h"

// v64's declarations (Debian 12's verbs.h lacks them).
extern "C" {
ibv_mr* ibv_reg_mr_ex(ibv_pd* pd, ::sv::abi::MrInitAttr* attr);
::sv::abi::Dmah* ibv_alloc_dmah(ibv_context* c, ::sv::abi::DmahInitAttr* attr);
int ibv_dealloc_dmah(::sv::abi::Dmah* dmah);
int ibv_query_port_speed(ibv_context* c, uint32_t port, uint64_t* speed);
int ibv_dm_export_dmabuf_fd(ibv_dm* dm);
void* ibv_alloc_buf(ibv_pd* pd, size_t size, ::sv::abi::Buf** buf);
void ibv_free_buf(::sv::abi::Buf* buf);
ibv_mr* ibv_reg_buf_mr(ibv_pd* pd, ::sv::abi::Buf* buf, void* addr, size_t length, int access);
const char* ibv_wr_opcode_str(ibv_wr_opcode op);
}

namespace abi64_test {
namespace {

namespace abi = ::sv::abi;

using svtest::Side;

struct Ctx {
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  Ctx() {
    int n = 0;
    ibv_device** l = ibv_get_device_list(&n);
    if (l && n > 0) ctx = ibv_open_device(l[0]);
    ibv_free_device_list(l);
    if (ctx) pd = ibv_alloc_pd(ctx);
  }
  ~Ctx() {
    if (pd) ibv_dealloc_pd(pd);
    if (ctx) ibv_close_device(ctx);
  }
};

abi::MrInitAttr by_addr(void* addr, size_t len, int access) {
  abi::MrInitAttr a{};
  a.length = len;
  a.access = access;
  a.comp_mask = abi::kRegMrMaskAddr;
  a.addr = addr;
  return a;
}

// Registration fails with `e` in errno.
void expect_refused(ibv_pd* pd, abi::MrInitAttr a, int e) {
  errno = 0;
  ibv_mr* mr = ibv_reg_mr_ex(pd, &a);
  EXPECT_EQ(nullptr, mr);
  EXPECT_EQ(e, errno);
  if (mr) ibv_dereg_mr(mr);
}

uint32_t first_allowed_cpu() {
  cpu_set_t set;
  CPU_ZERO(&set);
  sched_getaffinity(0, sizeof(set), &set);
  for (uint32_t i = 0; i < CPU_SETSIZE; ++i)
    if (CPU_ISSET(i, &set)) return i;
  return 0;
}

abi::DmahInitAttr dmah_attr(uint32_t cpu, uint8_t mem, uint8_t ph) {
  abi::DmahInitAttr a{};
  a.comp_mask = abi::kDmahMaskCpuId | abi::kDmahMaskTphMemType | abi::kDmahMaskPh;
  a.cpu_id = cpu;
  a.tph_mem_type = mem;
  a.ph = ph;
  return a;
}

// An RDMA WRITE from the side's own buffer to `rkey`/`remote` on the same
// (self-connected) QP; the completion's status.
int rdma_write_self(Side& s, uint64_t remote, uint32_t rkey, size_t len) {
  ibv_sge sge{reinterpret_cast<uintptr_t>(s.buf), uint32_t(len), s.mr->lkey};
  ibv_send_wr wr{};
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = remote;
  wr.wr.rdma.rkey = rkey;
  ibv_send_wr* bad = nullptr;
  if (int e = ibv_post_send(s.qp, &wr, &bad)) return -e;
  auto wc = svtest::poll(s.cq, 1);
  return wc.size() == 1 ? int(wc[0].status) : -ETIMEDOUT;
}

TEST(RegMrEx, ByAddressWithIovaCarriesData) {
  Side s;
  ASSERT_EQ(0, s.open({}));
  ASSERT_EQ(0, s.connect(s.qp->qp_num, {}));
  std::vector<uint8_t> dst(4096, 0);
  abi::MrInitAttr a = by_addr(dst.data(), dst.size(), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  a.comp_mask |= abi::kRegMrMaskIova;
  a.iova = 0x7000000;
  ibv_mr* mr = ibv_reg_mr_ex(s.pd, &a);
  ASSERT_NE(nullptr, mr) << strerror(errno);
  EXPECT_EQ(dst.data(), mr->addr);
  EXPECT_EQ(dst.size(), mr->length);
  EXPECT_EQ(s.pd, mr->pd);
  std::memset(s.buf, 0x5a, 64);
  EXPECT_EQ(IBV_WC_SUCCESS, rdma_write_self(s, 0x7000000 + 100, mr->rkey, 64));
  EXPECT_EQ(0x5a, dst[100]);
  EXPECT_EQ(0x5a, dst[163]);
  EXPECT_EQ(0, dst[164]);
  EXPECT_EQ(0, dst[99]);
  EXPECT_EQ(0, ibv_dereg_mr(mr));
}

TEST(RegMrEx, MalformedCompMask) {
  Ctx c;
  ASSERT_NE(nullptr, c.pd);
  std::vector<uint8_t> m(4096);
  abi::MrInitAttr a = by_addr(m.data(), m.size(), IBV_ACCESS_LOCAL_WRITE);
  abi::MrInitAttr x = a;
  x.comp_mask |= 1u << 6;  // past IBV_REG_MR_MASK_BUF
  expect_refused(c.pd, x, EOPNOTSUPP);
  x = a;
  x.comp_mask = 0;  // neither an address nor an fd
  expect_refused(c.pd, x, EINVAL);
  x = a;
  x.comp_mask |= abi::kRegMrMaskFdOffset;  // an offset without an fd
  expect_refused(c.pd, x, EINVAL);
  x = a;
  x.comp_mask |= abi::kRegMrMaskFd | abi::kRegMrMaskFdOffset | abi::kRegMrMaskIova;  // fd and address
  expect_refused(c.pd, x, EINVAL);
  x.comp_mask = abi::kRegMrMaskFd | abi::kRegMrMaskFdOffset;  // fd without IOVA
  expect_refused(c.pd, x, EINVAL);
  x = a;
  x.comp_mask |= abi::kRegMrMaskDmah;  // a DMA handle that is not there
  expect_refused(c.pd, x, EINVAL);
  errno = 0;
  EXPECT_EQ(nullptr, ibv_reg_mr_ex(c.pd, nullptr));
  EXPECT_EQ(EINVAL, errno);
}

TEST(RegMrEx, FdRegistrations) {
  Ctx c;
  ASSERT_NE(nullptr, c.pd);
  abi::MrInitAttr a{};
  a.length = 4096;
  a.access = IBV_ACCESS_LOCAL_WRITE;
  a.comp_mask = abi::kRegMrMaskFd | abi::kRegMrMaskFdOffset | abi::kRegMrMaskIova;
  a.fd = -1;
  expect_refused(c.pd, a, EBADF);
  int fd = memfd_create("abi64", 0);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(0, ftruncate(fd, 4096));
  a.fd = fd;
  expect_refused(c.pd, a, EOPNOTSUPP);  // open, but not a dma-buf this device can attach to
  ::close(fd);
  expect_refused(c.pd, a, EBADF);  // closed now
  errno = 0;
  EXPECT_EQ(nullptr, ibv_reg_dmabuf_mr(c.pd, 0, 4096, 0, -1, IBV_ACCESS_LOCAL_WRITE));
  EXPECT_EQ(EBADF, errno);
}

TEST(Dmah, ValidatedAsTheKernelDoes) {
  Ctx c;
  ASSERT_NE(nullptr, c.ctx);
  const uint32_t cpu = first_allowed_cpu();
  for (uint8_t mem : {abi::kTphMemVolatile, abi::kTphMemPersistent}) {
    abi::DmahInitAttr a = dmah_attr(cpu, mem, 3);
    abi::Dmah* d = ibv_alloc_dmah(c.ctx, &a);
    ASSERT_NE(nullptr, d) << strerror(errno);
    EXPECT_EQ(c.ctx, d->context);
    EXPECT_EQ(0, ibv_dealloc_dmah(d));
  }
  struct Bad {
    abi::DmahInitAttr a;
    int e;
  } bad[] = {
      {dmah_attr(0xffff, abi::kTphMemVolatile, 0), EINVAL},  // no such CPU
      {dmah_attr(cpu, abi::kTphMemVolatile, 4), EINVAL},     // ph is two bits
      {dmah_attr(cpu, 0xfe, 0), EINVAL},                     // no such memory type
  };
  for (auto& b : bad) {
    errno = 0;
    EXPECT_EQ(nullptr, ibv_alloc_dmah(c.ctx, &b.a));
    EXPECT_EQ(b.e, errno);
  }
  abi::DmahInitAttr unknown = dmah_attr(cpu, 0, 0);
  unknown.comp_mask |= 1u << 3;
  errno = 0;
  EXPECT_EQ(nullptr, ibv_alloc_dmah(c.ctx, &unknown));
  EXPECT_EQ(EOPNOTSUPP, errno);
  abi::DmahInitAttr none{};  // no field named: nothing to check
  abi::Dmah* d = ibv_alloc_dmah(c.ctx, &none);
  ASSERT_NE(nullptr, d);
  EXPECT_EQ(0, ibv_dealloc_dmah(d));
}

TEST(Dmah, HeldByItsMrs) {
  Ctx c, other;
  ASSERT_NE(nullptr, c.pd);
  ASSERT_NE(nullptr, other.pd);
  abi::DmahInitAttr da = dmah_attr(first_allowed_cpu(), abi::kTphMemVolatile, 0);
  abi::Dmah* d = ibv_alloc_dmah(c.ctx, &da);
  ASSERT_NE(nullptr, d);
  std::vector<uint8_t> m(8192);
  abi::MrInitAttr a = by_addr(m.data(), m.size(), IBV_ACCESS_LOCAL_WRITE);
  a.comp_mask |= abi::kRegMrMaskDmah;
  a.dmah = d;
  expect_refused(other.pd, a, EINVAL);  // the handle of another context
  abi::MrInitAttr odp = a;
  odp.access |= IBV_ACCESS_ON_DEMAND;
  expect_refused(c.pd, odp, EINVAL);
  ibv_mr* mr = ibv_reg_mr_ex(c.pd, &a);
  ASSERT_NE(nullptr, mr) << strerror(errno);
  EXPECT_EQ(EBUSY, ibv_dealloc_dmah(d));
  EXPECT_EQ(0, ibv_dereg_mr(mr));
  EXPECT_EQ(0, ibv_dealloc_dmah(d));
}

TEST(Buf, AllocRegisterFree) {
  Ctx c, other;
  ASSERT_NE(nullptr, c.pd);
  ASSERT_NE(nullptr, other.pd);
  const size_t page = size_t(sysconf(_SC_PAGESIZE)), size = 3 * page;
  abi::Buf* b = nullptr;
  auto* p = static_cast<uint8_t*>(ibv_alloc_buf(c.pd, size, &b));
  ASSERT_NE(nullptr, p) << strerror(errno);
  ASSERT_NE(nullptr, b);
  EXPECT_EQ(0u, reinterpret_cast<uintptr_t>(p) % page);
  std::memset(p, 1, size);  // it is ordinary writable memory
  ibv_mr* mr = ibv_reg_buf_mr(c.pd, b, p + page, 2 * page, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  ASSERT_NE(nullptr, mr) << strerror(errno);
  EXPECT_EQ(p + page, mr->addr);
  EXPECT_EQ(2 * page, mr->length);
  EXPECT_EQ(0, ibv_dereg_mr(mr));
  errno = 0;
  EXPECT_EQ(nullptr, ibv_reg_buf_mr(c.pd, b, p + page, 2 * page + 1, IBV_ACCESS_LOCAL_WRITE));  // past its end
  EXPECT_EQ(EINVAL, errno);
  errno = 0;
  EXPECT_EQ(nullptr, ibv_reg_buf_mr(c.pd, b, p - 1, 16, IBV_ACCESS_LOCAL_WRITE));  // before its start
  EXPECT_EQ(EINVAL, errno);
  errno = 0;
  EXPECT_EQ(nullptr, ibv_reg_buf_mr(other.pd, b, p, page, IBV_ACCESS_LOCAL_WRITE));  // another PD's buffer
  EXPECT_EQ(EINVAL, errno);
  abi::MrInitAttr a{};
  a.length = page;
  a.access = IBV_ACCESS_LOCAL_WRITE;
  a.comp_mask = abi::kRegMrMaskBuf;  // a buffer without the address
  a.buf = b;
  expect_refused(c.pd, a, EINVAL);
  a.comp_mask = abi::kRegMrMaskBuf | abi::kRegMrMaskAddr | abi::kRegMrMaskFd;  // and an fd
  a.addr = p;
  expect_refused(c.pd, a, EINVAL);
  a.comp_mask = abi::kRegMrMaskBuf | abi::kRegMrMaskAddr;  // the same through ibv_reg_mr_ex
  mr = ibv_reg_mr_ex(c.pd, &a);
  ASSERT_NE(nullptr, mr) << strerror(errno);
  EXPECT_EQ(0, ibv_dereg_mr(mr));
  ibv_free_buf(b);
  errno = 0;
  EXPECT_EQ(nullptr, ibv_alloc_buf(c.pd, 0, &b));
  EXPECT_EQ(EINVAL, errno);
}

TEST(Port, SpeedAndV64Attr) {
  Ctx c;
  ASSERT_NE(nullptr, c.ctx);
  ibv_port_attr pa{};
  ASSERT_EQ(0, ibv_query_port(c.ctx, 1, &pa));
  uint64_t speed = 0;
  ASSERT_EQ(0, ibv_query_port_speed(c.ctx, 1, &speed));
  // The device's port: EDR (25 Gb/s a lane), 4x: 100 Gb/s = 1000 * 100 Mb/s.
  ASSERT_EQ(32, pa.active_speed);
  ASSERT_EQ(2, pa.active_width);
  EXPECT_EQ(1000u, speed);
  EXPECT_EQ(EINVAL, ibv_query_port_speed(c.ctx, 2, &speed));
  // The op with v64's size fills active_speed_ex; with v44's size it
  // writes nothing past v44's struct.
  auto* vc = verbs_get_ctx(c.ctx);
  ASSERT_NE(nullptr, vc);
  abi::PortAttrCurrent cur;
  std::memset(&cur, 0xaa, sizeof(cur));
  ASSERT_EQ(0, vc->query_port(c.ctx, 1, &cur.v44, sizeof(cur)));
  EXPECT_EQ(uint32_t(pa.active_speed), cur.active_speed_ex);
  std::memset(&cur, 0xaa, sizeof(cur));
  ASSERT_EQ(0, vc->query_port(c.ctx, 1, &cur.v44, sizeof(cur.v44)));
  EXPECT_EQ(0xaaaaaaaau, cur.active_speed_ex);
  EXPECT_EQ(pa.active_speed, cur.v44.active_speed);
}

TEST(VerbsContext, LaidOutAsV64) {
  Ctx c;
  ASSERT_NE(nullptr, c.pd);
  verbs_context* v44 = verbs_get_ctx(c.ctx);
  ASSERT_NE(nullptr, v44);
  // v64's verbs_get_ctx_op(ctx, op) finds an op when sz reaches back to it.
  EXPECT_EQ(sizeof(abi::VerbsContextCurrent), v44->sz);
  auto* cur = reinterpret_cast<abi::VerbsContextCurrent*>(reinterpret_cast<char*>(v44) -
                                                          offsetof(abi::VerbsContextCurrent, v44));
  ASSERT_NE(nullptr, cur->v64.reg_mr_ex);
  ASSERT_NE(nullptr, cur->v64.alloc_dmah);
  ASSERT_NE(nullptr, cur->v64.dealloc_dmah);
  ASSERT_NE(nullptr, cur->v64.alloc_buf);
  ASSERT_NE(nullptr, cur->v64.free_buf);
  ASSERT_NE(nullptr, cur->v64.dm_export_dmabuf_fd);
  std::vector<uint8_t> m(4096);
  abi::MrInitAttr a = by_addr(m.data(), m.size(), IBV_ACCESS_LOCAL_WRITE);
  ibv_mr* mr = cur->v64.reg_mr_ex(c.pd, &a);
  ASSERT_NE(nullptr, mr);
  EXPECT_EQ(0, ibv_dereg_mr(mr));
  // v44 clients' ops are where v44's verbs.h looks for them.
  EXPECT_NE(nullptr, verbs_get_ctx_op(c.ctx, query_device_ex));
}

TEST(Dm, NoDmabufToExport) {
  Ctx c;
  ASSERT_NE(nullptr, c.ctx);
  ibv_alloc_dm_attr a{4096, 0, 0};
  ibv_dm* dm = ibv_alloc_dm(c.ctx, &a);
  ASSERT_NE(nullptr, dm) << strerror(errno);
  errno = 0;
  EXPECT_EQ(-1, ibv_dm_export_dmabuf_fd(dm));
  EXPECT_EQ(EOPNOTSUPP, errno);
  EXPECT_EQ(0, ibv_free_dm(dm));
}

TEST(InOrder, ReturnCaps) {
  Side s;
  ASSERT_EQ(0, s.open({}));
  EXPECT_EQ(1, ibv_query_qp_data_in_order(s.qp, IBV_WR_RDMA_WRITE, 0));
  EXPECT_EQ(abi::kInOrderWholeMsg | abi::kInOrderAligned128,
            ibv_query_qp_data_in_order(s.qp, IBV_WR_RDMA_WRITE, abi::kInOrderReturnCaps));
  EXPECT_EQ(3, ibv_query_qp_data_in_order(s.qp, IBV_WR_SEND, abi::kInOrderReturnCaps | abi::kInOrderDeviceOnly));
  EXPECT_EQ(0, ibv_query_qp_data_in_order(s.qp, IBV_WR_RDMA_WRITE, 1u << 2));  // unknown flag
}

TEST(Strings, WrOpcodeStr) {
  EXPECT_STREQ("rdma-write", ibv_wr_opcode_str(IBV_WR_RDMA_WRITE));
  EXPECT_STREQ("atomic-fetch-and-add", ibv_wr_opcode_str(IBV_WR_ATOMIC_FETCH_AND_ADD));
  EXPECT_STREQ("flush", ibv_wr_opcode_str(ibv_wr_opcode(abi::kWrFlush)));
  EXPECT_STREQ("atomic-write", ibv_wr_opcode_str(IBV_WR_ATOMIC_WRITE));
  EXPECT_STREQ("unknown", ibv_wr_opcode_str(ibv_wr_opcode(16)));
}

// A provider or pyverbs of each release imports private symbols at its
// release's node: each version answers as the newest.
TEST(PrivateNodes, EveryReleaseNodeAnswers) {
  Ctx c;
  ASSERT_NE(nullptr, c.ctx);
  void* lib = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_NOLOAD);
  ASSERT_NE(nullptr, lib);
  using GidType = int (*)(ibv_context*, uint8_t, unsigned, int*);
  for (const char* node : {"IBVERBS_PRIVATE_33", "IBVERBS_PRIVATE_34", "IBVERBS_PRIVATE_57",
                           "IBVERBS_PRIVATE_59", "IBVERBS_PRIVATE_64"}) {
    SCOPED_TRACE(node);
    auto f = reinterpret_cast<GidType>(dlvsym(lib, "ibv_query_gid_type", node));
    ASSERT_NE(nullptr, f);
    int type = -1;
    EXPECT_EQ(0, f(c.ctx, 1, 0, &type));
    EXPECT_TRUE(type == 0 || type == 1);
    errno = 0;
    EXPECT_EQ(-1, f(c.ctx, 2, 0, &type));
    EXPECT_EQ(EINVAL, errno);
    using Stub = int (*)(ibv_pd*);
    auto dealloc = reinterpret_cast<Stub>(dlvsym(lib, "ibv_cmd_dealloc_pd", node));
    ASSERT_NE(nullptr, dealloc);
    EXPECT_EQ(EOPNOTSUPP, dealloc(c.pd));
    EXPECT_NE(nullptr, dlvsym(lib, "verbs_allow_disassociate_destroy", node));
  }
  EXPECT_EQ(nullptr, dlvsym(lib, "ibv_wr_opcode_str", "IBVERBS_PRIVATE_33"));  // came after v33
  EXPECT_NE(nullptr, dlvsym(lib, "ibv_cmd_reg_mr_ex", "IBVERBS_PRIVATE_59"));
  EXPECT_EQ(nullptr, dlvsym(lib, "ibv_cmd_reg_mr_ex", "IBVERBS_PRIVATE_57"));
  dlclose(lib);
}

}  // namespace
}  // namespace abi64_test
