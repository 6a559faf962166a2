// Thread domains and parent domains (ibv_alloc_td(3), ibv_alloc_parent_domain(3)):
// a QP created in a parent domain with a thread domain is posted to without
// the send lock, so it must behave exactly like any other QP for one
// posting thread (data, checks, completion order, work requests that wait
// for the progress thread), and no second handle of it may exist.
#include <gtest/gtest.h>
#include <infiniband/verbs.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "harness.h"
#include "softverbs/softverbs.h"

using namespace svtest;

namespace {

struct Domains {
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  ibv_td* td = nullptr;
  ibv_pd* parent = nullptr;
  ibv_cq* cq = nullptr;
  ibv_mr* mr = nullptr;
  uint8_t* buf = nullptr;
  static constexpr size_t kLen = 1 << 16;

  void open() {
    int n = 0;
    ibv_device** list = ibv_get_device_list(&n);
    ASSERT_TRUE(list && n > 0);
    ctx = ibv_open_device(list[0]);
    ibv_free_device_list(list);
    ASSERT_NE(nullptr, ctx);
    pd = ibv_alloc_pd(ctx);
    ASSERT_NE(nullptr, pd);
    ibv_td_init_attr ta{};
    td = ibv_alloc_td(ctx, &ta);
    ASSERT_NE(nullptr, td) << strerror(errno);
    ibv_parent_domain_init_attr pa{};
    pa.pd = pd;
    pa.td = td;
    parent = ibv_alloc_parent_domain(ctx, &pa);
    ASSERT_NE(nullptr, parent) << strerror(errno);
    cq = ibv_create_cq(ctx, 1024, nullptr, nullptr, 0);
    ASSERT_NE(nullptr, cq);
    buf = static_cast<uint8_t*>(mmap(nullptr, kLen, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    ASSERT_NE(MAP_FAILED, static_cast<void*>(buf));
    // Registered through the parent domain: it stands for its PD.
    mr = ibv_reg_mr(parent, buf, kLen, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
    ASSERT_NE(nullptr, mr) << strerror(errno);
  }
  ibv_qp* qp(ibv_pd* in) {
    ibv_qp_init_attr ia{};
    ia.send_cq = cq;
    ia.recv_cq = cq;
    ia.qp_type = IBV_QPT_RC;
    ia.cap = {64, 64, 1, 1, 64};
    return ibv_create_qp(in, &ia);
  }
  ~Domains() {
    if (mr) ibv_dereg_mr(mr);
    if (cq) ibv_destroy_cq(cq);
    if (parent) ibv_dealloc_pd(parent);
    if (td) ibv_dealloc_td(td);
    if (pd) ibv_dealloc_pd(pd);
    if (ctx) ibv_close_device(ctx);
    if (buf) munmap(buf, kLen);
  }
};

int post(ibv_qp* qp, ibv_wr_opcode op, uint64_t wr_id, void* local, uint32_t len, uint32_t lkey, uint64_t remote,
         uint32_t rkey, unsigned flags = IBV_SEND_SIGNALED) {
  ibv_sge sge{reinterpret_cast<uint64_t>(local), len, lkey};
  ibv_send_wr wr{};
  wr.wr_id = wr_id;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = op;
  wr.send_flags = flags;
  wr.wr.rdma.remote_addr = remote;
  wr.wr.rdma.rkey = rkey;
  // A full send queue (requests waiting behind an RNR) drains through the
  // progress thread: wait for room.
  for (int tries = 0;; ++tries) {
    ibv_send_wr* bad = nullptr;
    int e = ibv_post_send(qp, &wr, &bad);
    if (e != ENOMEM || tries == 5000) return e;
    usleep(1000);
  }
}

int post_recv(ibv_qp* qp, uint64_t wr_id, void* at, uint32_t len, uint32_t lkey) {
  ibv_sge sge{reinterpret_cast<uint64_t>(at), len, lkey};
  ibv_recv_wr wr{};
  wr.wr_id = wr_id;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  ibv_recv_wr* bad = nullptr;
  return ibv_post_recv(qp, &wr, &bad);
}

}  // namespace

TEST(ThreadDomain, AllocationRules) {
  Domains d;
  ASSERT_NO_FATAL_FAILURE(d.open());
  ibv_td_init_attr bad_td{};
  bad_td.comp_mask = 1;
  errno = 0;
  EXPECT_EQ(nullptr, ibv_alloc_td(d.ctx, &bad_td));
  EXPECT_EQ(EINVAL, errno);
  // No custom allocators: the queues live in the daemon's segments.
  ibv_parent_domain_init_attr pa{};
  pa.pd = d.pd;
  pa.comp_mask = IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS;
  errno = 0;
  EXPECT_EQ(nullptr, ibv_alloc_parent_domain(d.ctx, &pa));
  EXPECT_EQ(EOPNOTSUPP, errno);
  pa.comp_mask = 0;
  pa.pd = d.parent;  // not over another parent domain
  EXPECT_EQ(nullptr, ibv_alloc_parent_domain(d.ctx, &pa));
  pa.pd = nullptr;
  EXPECT_EQ(nullptr, ibv_alloc_parent_domain(d.ctx, &pa));
  // A parent domain without a thread domain is a plain PD alias.
  pa.pd = d.pd;
  ibv_pd* plain = ibv_alloc_parent_domain(d.ctx, &pa);
  ASSERT_NE(nullptr, plain);
  EXPECT_EQ(d.pd->handle, plain->handle);
  // Held objects cannot go first.
  EXPECT_EQ(EBUSY, ibv_dealloc_td(d.td));
  EXPECT_EQ(EBUSY, ibv_dealloc_pd(d.pd));
  EXPECT_EQ(0, ibv_dealloc_pd(plain));
}

// One thread posts WRITE, READ and SEND on a lockless QP, among them SENDs
// that find no receive and wait (RNR) for the progress thread, which then
// has the QP (and the posts take the lock again) until the queue drains.
TEST(ThreadDomain, LocklessQpKeepsEveryRuleAndTheOrder) {
  Domains d;
  ASSERT_NO_FATAL_FAILURE(d.open());
  ibv_qp* a = d.qp(d.parent);  // lockless
  ibv_qp* b = d.qp(d.pd);
  ASSERT_NE(nullptr, a);
  ASSERT_NE(nullptr, b);
  EXPECT_EQ(d.parent, a->pd);
  ASSERT_EQ(0, connect_qp(a, b->qp_num));
  ASSERT_EQ(0, connect_qp(b, a->qp_num));
  uint8_t* src = d.buf;
  uint8_t* dst = d.buf + 4096;
  uint8_t* rbuf = d.buf + 8192;
  uint64_t id = 0;
  std::vector<uint64_t> expect;
  for (int round = 0; round < 200; ++round) {
    std::memset(src, round, 64);
    ASSERT_EQ(0, post(a, IBV_WR_RDMA_WRITE, ++id, src, 64, d.mr->lkey, uint64_t(dst), d.mr->rkey));
    expect.push_back(id);
    ASSERT_EQ(0, post(a, IBV_WR_RDMA_READ, ++id, rbuf, 64, d.mr->lkey, uint64_t(dst), d.mr->rkey));
    expect.push_back(id);
    if (round % 50 == 7) {
      // No receive posted: the SEND waits in the send queue, and so does
      // what is posted after it; the receive comes later.
      ASSERT_EQ(0, post(a, IBV_WR_SEND, ++id, src, 8, d.mr->lkey, 0, 0));
      expect.push_back(id);
      ASSERT_EQ(0, post(a, IBV_WR_RDMA_WRITE, ++id, src, 8, d.mr->lkey, uint64_t(dst), d.mr->rkey));
      expect.push_back(id);
      usleep(2000);
      ASSERT_EQ(0, post_recv(b, 1000 + uint64_t(round), rbuf + 128, 64, d.mr->lkey));
    }
  }
  // Checks are not skipped: a bad rkey still fails (and takes the QP to ERR),
  // so it comes last.
  std::vector<uint64_t> got;
  std::vector<ibv_wc> wcs = poll(d.cq, int(expect.size()) + 4, 10000);
  for (const ibv_wc& wc : wcs) {
    EXPECT_EQ(IBV_WC_SUCCESS, wc.status) << ibv_wc_status_str(wc.status);
    if (wc.qp_num == a->qp_num) got.push_back(wc.wr_id);
  }
  EXPECT_EQ(expect, got);  // every request completed, in posting order
  for (int i = 0; i < 64; ++i) EXPECT_EQ(uint8_t(199), dst[i]);
  for (int i = 0; i < 64; ++i) EXPECT_EQ(uint8_t(199), rbuf[i]);
  ASSERT_EQ(0, post(a, IBV_WR_RDMA_WRITE, ++id, src, 8, d.mr->lkey, uint64_t(dst), d.mr->rkey + 0x100));
  wcs = poll(d.cq, 1);
  ASSERT_EQ(1u, wcs.size());
  EXPECT_EQ(IBV_WC_REM_ACCESS_ERR, wcs[0].status);
  EXPECT_EQ(0, ibv_destroy_qp(a));
  EXPECT_EQ(0, ibv_destroy_qp(b));
}

// A second handle would post concurrently with the lock-free creator: no
// import, from another context of this process (or from any other process).
TEST(ThreadDomain, LocklessQpCannotBeImported) {
  Domains d;
  ASSERT_NO_FATAL_FAILURE(d.open());
  ibv_qp* lockless = d.qp(d.parent);
  ibv_qp* plain = d.qp(d.pd);
  ASSERT_NE(nullptr, lockless);
  ASSERT_NE(nullptr, plain);
  ibv_context* c = ibv_import_device(d.ctx->cmd_fd);
  ASSERT_NE(nullptr, c);
  errno = 0;
  EXPECT_EQ(nullptr, svx_import_qp(c, lockless->qp_num));
  EXPECT_EQ(EPERM, errno);
  ibv_qp* imported = svx_import_qp(c, plain->qp_num);
  ASSERT_NE(nullptr, imported);
  // Its PD and CQ came with it (svx_import_qp(3)); the importer lets go of them.
  ibv_pd* pd = imported->pd;
  ibv_cq* cq = imported->send_cq;
  ASSERT_EQ(cq, imported->recv_cq);
  svx_unimport_qp(imported);
  svx_unimport_cq(cq);
  ibv_unimport_pd(pd);
  // The creator's own context hands back its own handle.
  EXPECT_EQ(lockless, svx_resolve_qp(d.ctx, lockless->qp_num));
  ibv_close_device(c);
  EXPECT_EQ(0, ibv_destroy_qp(lockless));
  EXPECT_EQ(0, ibv_destroy_qp(plain));
}
