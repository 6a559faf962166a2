// XRC (IBTA annex A14; ibv_open_xrcd(3), ibv_create_srq_ex(3),
// ibv_open_qp(3)): domains shared through a file's inode with O_CREAT and
// O_EXCL as the kernel treats them, XRC SRQs, XRC send and receive QPs, and
// the error cases. Debian's ibv_xsrq_pingpong runs in tests/compat.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "harness.h"

namespace svtest {
namespace {

ibv_context* open_ctx() {
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (!list || n < 1) return nullptr;
  ibv_context* c = ibv_open_device(list[0]);
  ibv_free_device_list(list);
  return c;
}

ibv_xrcd* open_xrcd(ibv_context* c, int fd, int oflags, uint32_t mask = IBV_XRCD_INIT_ATTR_FD |
                                                                        IBV_XRCD_INIT_ATTR_OFLAGS) {
  ibv_xrcd_init_attr a{};
  a.comp_mask = mask;
  a.fd = fd;
  a.oflags = oflags;
  return ibv_open_xrcd(c, &a);
}

ibv_qp* create_tgt(ibv_context* c, ibv_xrcd* x) {
  ibv_qp_init_attr_ex a{};
  a.qp_type = IBV_QPT_XRC_RECV;
  a.comp_mask = IBV_QP_INIT_ATTR_XRCD;
  a.xrcd = x;
  return ibv_create_qp_ex(c, &a);
}

ibv_qp* open_tgt(ibv_context* c, ibv_xrcd* x, uint32_t qpn) {
  ibv_qp_open_attr a{};
  a.comp_mask = IBV_QP_OPEN_ATTR_NUM | IBV_QP_OPEN_ATTR_XRCD | IBV_QP_OPEN_ATTR_TYPE;
  a.qp_num = qpn;
  a.xrcd = x;
  a.qp_type = IBV_QPT_XRC_RECV;
  return ibv_open_qp(c, &a);
}

// A file of our own (the kernel keys a domain by the file's inode).
struct TempFile {
  TempFile() {
    char tmpl[] = "/tmp/sv-xrcd-XXXXXX";
    fd = mkstemp(tmpl);
    path = tmpl;
  }
  ~TempFile() {
    ::close(fd);
    ::unlink(path.c_str());
  }
  int fd;
  std::string path;
};

TEST(Xrc, OpenXrcdFollowsTheKernelsOCreatAndOExcl) {
  ibv_context* c = open_ctx();
  ASSERT_NE(nullptr, c);
  ibv_device_attr da{};
  ASSERT_EQ(0, ibv_query_device(c, &da));
  EXPECT_TRUE(da.device_cap_flags & IBV_DEVICE_XRC);
  TempFile f;
  errno = 0;
  EXPECT_EQ(nullptr, open_xrcd(c, f.fd, 0));  // no domain for this inode yet, no O_CREAT
  EXPECT_EQ(EINVAL, errno);
  errno = 0;
  EXPECT_EQ(nullptr, open_xrcd(c, f.fd, O_CREAT, IBV_XRCD_INIT_ATTR_FD));  // both bits are required
  EXPECT_EQ(EINVAL, errno);
  ibv_xrcd* a = open_xrcd(c, f.fd, O_CREAT | O_EXCL);
  ASSERT_NE(nullptr, a) << strerror(errno);
  errno = 0;
  EXPECT_EQ(nullptr, open_xrcd(c, f.fd, O_CREAT | O_EXCL));  // exists now
  EXPECT_EQ(EINVAL, errno);
  ibv_xrcd* b = open_xrcd(c, f.fd, 0);  // the same domain, by inode
  ASSERT_NE(nullptr, b);
  int other = ::open(f.path.c_str(), O_RDONLY);  // another file description of the same inode
  ibv_xrcd* b2 = open_xrcd(c, other, 0);
  ASSERT_NE(nullptr, b2);
  ::close(other);
  errno = 0;
  EXPECT_EQ(nullptr, open_xrcd(c, 999, O_CREAT));  // not a descriptor
  EXPECT_EQ(EBADF, errno);
  ibv_xrcd* priv = open_xrcd(c, -1, 0);  // fd -1: a private domain
  ASSERT_NE(nullptr, priv);

  // A target QP of the domain can be opened through any handle of it, not
  // through a private one.
  ibv_qp* t = create_tgt(c, a);
  ASSERT_NE(nullptr, t) << strerror(errno);
  ibv_qp* t2 = open_tgt(c, b2, t->qp_num);
  ASSERT_NE(nullptr, t2) << strerror(errno);
  EXPECT_EQ(t->qp_num, t2->qp_num);
  errno = 0;
  EXPECT_EQ(nullptr, open_tgt(c, priv, t->qp_num));
  EXPECT_EQ(EINVAL, errno);

  // XRC SRQ: needs its domain and CQ.
  ibv_pd* pd = ibv_alloc_pd(c);
  ibv_cq* cq = ibv_create_cq(c, 16, nullptr, nullptr, 0);
  ibv_srq_init_attr_ex sa{};
  sa.attr.max_wr = 8;
  sa.attr.max_sge = 1;
  sa.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_XRCD | IBV_SRQ_INIT_ATTR_PD;
  sa.srq_type = IBV_SRQT_XRC;
  sa.xrcd = priv;
  sa.pd = pd;
  errno = 0;
  EXPECT_EQ(nullptr, ibv_create_srq_ex(c, &sa));  // no CQ
  EXPECT_EQ(EINVAL, errno);
  sa.comp_mask |= IBV_SRQ_INIT_ATTR_CQ;
  sa.cq = cq;
  ibv_srq* srq = ibv_create_srq_ex(c, &sa);
  ASSERT_NE(nullptr, srq) << strerror(errno);
  uint32_t num = 0;
  EXPECT_EQ(0, ibv_get_srq_num(srq, &num));
  EXPECT_NE(0u, num);
  ibv_srq_init_attr basic{};
  basic.attr = {8, 1, 0};
  ibv_srq* bsrq = ibv_create_srq(pd, &basic);
  ASSERT_NE(nullptr, bsrq);
  EXPECT_EQ(EINVAL, ibv_get_srq_num(bsrq, &num));  // only XRC SRQs have a number to name
  EXPECT_EQ(EBUSY, ibv_destroy_cq(cq));             // the XRC SRQ completes into it
  EXPECT_EQ(EBUSY, ibv_close_xrcd(priv));           // its last handle, with an SRQ in it
  EXPECT_EQ(0, ibv_destroy_srq(srq));
  EXPECT_EQ(0, ibv_close_xrcd(priv));
  EXPECT_EQ(0, ibv_destroy_srq(bsrq));

  // QP creation errors.
  ibv_qp_init_attr_ex qa{};
  qa.qp_type = IBV_QPT_XRC_RECV;
  qa.comp_mask = IBV_QP_INIT_ATTR_PD;  // no domain
  qa.pd = pd;
  errno = 0;
  EXPECT_EQ(nullptr, ibv_create_qp_ex(c, &qa));
  EXPECT_EQ(EINVAL, errno);
  qa.qp_type = IBV_QPT_XRC_SEND;
  qa.send_cq = cq;
  qa.cap = {4, 0, 1, 0, 0};
  ibv_srq* srq2 = ibv_create_srq(pd, &basic);
  qa.srq = srq2;  // an initiator has no receive side
  errno = 0;
  EXPECT_EQ(nullptr, ibv_create_qp_ex(c, &qa));
  EXPECT_EQ(EINVAL, errno);
  qa.srq = nullptr;
  ibv_qp* ini = ibv_create_qp_ex(c, &qa);
  ASSERT_NE(nullptr, ini) << strerror(errno);
  ibv_recv_wr rw{};
  ibv_recv_wr* bad;
  EXPECT_EQ(EINVAL, ibv_post_recv(ini, &rw, &bad));  // no receive queue
  EXPECT_EQ(EINVAL, ibv_post_recv(t, &rw, &bad));

  EXPECT_EQ(0, ibv_destroy_qp(ini));
  EXPECT_EQ(0, ibv_destroy_srq(srq2));
  EXPECT_EQ(0, ibv_destroy_qp(t));
  EXPECT_EQ(0, ibv_destroy_qp(t2));  // the last holder of the target QP
  EXPECT_EQ(0, ibv_close_xrcd(b2));
  EXPECT_EQ(0, ibv_close_xrcd(b));
  EXPECT_EQ(0, ibv_close_xrcd(a));
  // The domain is gone with its last handle: O_CREAT is needed again.
  errno = 0;
  EXPECT_EQ(nullptr, open_xrcd(c, f.fd, 0));
  EXPECT_EQ(EINVAL, errno);
  ibv_destroy_cq(cq);
  ibv_dealloc_pd(pd);
  ibv_close_device(c);
}

// Another process opening the same file gets the same domain: it can open
// our target QP; through a domain of another file it cannot.
TEST(Xrc, ProcessesShareADomainThroughTheFilesInode) {
  TempFile f, g;
  int to_child[2], to_parent[2];
  ASSERT_EQ(0, pipe(to_child));
  ASSERT_EQ(0, pipe(to_parent));
  pid_t pid = fork();
  if (pid == 0) {
    uint32_t qpn = 0;
    if (read(to_child[0], &qpn, 4) != 4) _exit(10);
    ibv_context* c = open_ctx();
    if (!c) _exit(11);
    int fd = ::open(f.path.c_str(), O_RDONLY);
    ibv_xrcd* x = open_xrcd(c, fd, 0);  // no O_CREAT: it must exist already
    if (!x) _exit(12);
    int gfd = ::open(g.path.c_str(), O_RDONLY);
    ibv_xrcd* y = open_xrcd(c, gfd, O_CREAT);
    if (!y) _exit(13);
    if (open_tgt(c, y, qpn)) _exit(14);  // another domain
    ibv_qp* t = open_tgt(c, x, qpn);
    if (!t) _exit(15);
    int st = 0;
    if (write(to_parent[1], &st, 4) != 4) _exit(16);
    if (read(to_child[0], &st, 4) != 4) _exit(17);  // the parent destroyed its handle
    // Still alive for us: we hold it.
    ibv_qp_attr a{};
    ibv_qp_init_attr ia{};
    if (ibv_query_qp(t, &a, IBV_QP_STATE, &ia)) _exit(18);
    if (ibv_destroy_qp(t) || ibv_close_xrcd(x) || ibv_close_xrcd(y)) _exit(19);
    ibv_close_device(c);
    _exit(0);
  }
  ibv_context* c = open_ctx();
  ASSERT_NE(nullptr, c);
  ibv_xrcd* x = open_xrcd(c, f.fd, O_CREAT);
  ASSERT_NE(nullptr, x);
  ibv_qp* t = create_tgt(c, x);
  ASSERT_NE(nullptr, t);
  uint32_t qpn = t->qp_num;
  ASSERT_EQ(4, write(to_child[1], &qpn, 4));
  int st = -1;
  ASSERT_EQ(4, read(to_parent[0], &st, 4));
  EXPECT_EQ(0, ibv_destroy_qp(t));
  EXPECT_EQ(0, ibv_close_xrcd(x));
  ASSERT_EQ(4, write(to_child[1], &st, 4));
  int status = 0;
  ASSERT_EQ(pid, waitpid(pid, &status, 0));
  EXPECT_TRUE(WIFEXITED(status));
  EXPECT_EQ(0, WEXITSTATUS(status));
  ibv_close_device(c);
}

// The data path: an initiator in one context sends through a target QP of
// another context to the XRC SRQ each WR names; completions go to that
// SRQ's CQ.
class XrcData : public ::testing::Test {
 protected:
  void SetUp() override {
    s = open_ctx();
    r = open_ctx();
    ASSERT_TRUE(s && r);
    spd = ibv_alloc_pd(s);
    rpd = ibv_alloc_pd(r);
    scq = ibv_create_cq(s, 64, nullptr, nullptr, 0);
    rcq = ibv_create_cq(r, 64, nullptr, nullptr, 0);
    rcq2 = ibv_create_cq(r, 64, nullptr, nullptr, 0);
    sbuf = static_cast<uint8_t*>(aligned_alloc(4096, 1 << 16));
    rbuf = static_cast<uint8_t*>(aligned_alloc(4096, 1 << 16));
    std::memset(sbuf, 0, 1 << 16);
    std::memset(rbuf, 0, 1 << 16);
    smr = ibv_reg_mr(spd, sbuf, 1 << 16, IBV_ACCESS_LOCAL_WRITE);
    rmr = ibv_reg_mr(rpd, rbuf, 1 << 16, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    ASSERT_TRUE(smr && rmr);
    xrcd = open_xrcd(r, -1, 0);
    other = open_xrcd(r, -1, 0);
    ASSERT_TRUE(xrcd && other);
    srq = make_srq(xrcd, rcq);
    srq2 = make_srq(xrcd, rcq2);
    foreign = make_srq(other, rcq);
    ASSERT_TRUE(srq && srq2 && foreign);
    tgt = create_tgt(r, xrcd);
    ASSERT_NE(nullptr, tgt);
    ibv_qp_init_attr_ex qa{};
    qa.qp_type = IBV_QPT_XRC_SEND;
    qa.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
    qa.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_RDMA_WRITE;
    qa.pd = spd;
    qa.send_cq = scq;
    qa.cap = {16, 0, 2, 0, 0};
    ini = ibv_create_qp_ex(s, &qa);
    ASSERT_NE(nullptr, ini);
    EXPECT_EQ(EINVAL, post(1, 8, 0));  // RESET: nothing to send on yet
    to_init(tgt, IBV_ACCESS_REMOTE_WRITE);
    to_init(ini, 0);
    to_rtr(tgt, ini->qp_num, true);
    to_rtr(ini, tgt->qp_num, false);
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RTS;
    a.timeout = 14;
    a.sq_psn = 0;
    ASSERT_EQ(0, ibv_modify_qp(tgt, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_SQ_PSN));  // A14: just these
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.max_rd_atomic = 1;
    ASSERT_EQ(0, ibv_modify_qp(ini, &a,
                               IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_SQ_PSN | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                                   IBV_QP_MAX_QP_RD_ATOMIC));
  }
  void TearDown() override {
    if (ini) ibv_destroy_qp(ini);
    if (tgt) ibv_destroy_qp(tgt);
    for (ibv_srq* q : {srq, srq2, foreign})
      if (q) ibv_destroy_srq(q);
    if (xrcd) ibv_close_xrcd(xrcd);
    if (other) ibv_close_xrcd(other);
    if (smr) ibv_dereg_mr(smr);
    if (rmr) ibv_dereg_mr(rmr);
    for (ibv_cq* q : {scq, rcq, rcq2})
      if (q) ibv_destroy_cq(q);
    if (spd) ibv_dealloc_pd(spd);
    if (rpd) ibv_dealloc_pd(rpd);
    if (s) ibv_close_device(s);
    if (r) ibv_close_device(r);
    std::free(sbuf);
    std::free(rbuf);
  }
  ibv_srq* make_srq(ibv_xrcd* x, ibv_cq* cq) {
    ibv_srq_init_attr_ex sa{};
    sa.attr.max_wr = 16;
    sa.attr.max_sge = 1;
    sa.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_XRCD | IBV_SRQ_INIT_ATTR_CQ | IBV_SRQ_INIT_ATTR_PD;
    sa.srq_type = IBV_SRQT_XRC;
    sa.xrcd = x;
    sa.cq = cq;
    sa.pd = rpd;
    return ibv_create_srq_ex(r, &sa);
  }
  void to_init(ibv_qp* q, int access) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.port_num = 1;
    a.qp_access_flags = access;
    ASSERT_EQ(0, ibv_modify_qp(q, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS));
  }
  void to_rtr(ibv_qp* q, uint32_t dest, bool responder) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = IBV_MTU_1024;
    a.dest_qp_num = dest;
    a.min_rnr_timer = 1;
    a.max_dest_rd_atomic = 1;
    a.ah_attr.port_num = 1;
    int mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
    // A14: an initiator needs no responder attributes at RTR, a target does.
    if (responder) mask |= IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
    ASSERT_EQ(0, ibv_modify_qp(q, &a, mask));
  }
  int post_srq(ibv_srq* q, uint64_t id, uint64_t off) {
    ibv_sge sge{reinterpret_cast<uint64_t>(rbuf) + off, 1024, rmr->lkey};
    ibv_recv_wr wr{};
    wr.wr_id = id;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    ibv_recv_wr* bad;
    return ibv_post_srq_recv(q, &wr, &bad);
  }
  int post(uint32_t srqn, uint32_t len, uint64_t id, ibv_wr_opcode op = IBV_WR_SEND, uint64_t raddr = 0) {
    ibv_sge sge{reinterpret_cast<uint64_t>(sbuf), len, smr->lkey};
    ibv_send_wr wr{};
    wr.wr_id = id;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = op;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.qp_type.xrc.remote_srqn = srqn;
    wr.wr.rdma.remote_addr = raddr;
    wr.wr.rdma.rkey = rmr->rkey;
    ibv_send_wr* bad;
    return ibv_post_send(ini, &wr, &bad);
  }
  uint32_t num(ibv_srq* q) {
    uint32_t n = 0;
    EXPECT_EQ(0, ibv_get_srq_num(q, &n));
    return n;
  }

  ibv_context *s = nullptr, *r = nullptr;
  ibv_pd *spd = nullptr, *rpd = nullptr;
  ibv_cq *scq = nullptr, *rcq = nullptr, *rcq2 = nullptr;
  uint8_t *sbuf = nullptr, *rbuf = nullptr;
  ibv_mr *smr = nullptr, *rmr = nullptr;
  ibv_xrcd *xrcd = nullptr, *other = nullptr;
  ibv_srq *srq = nullptr, *srq2 = nullptr, *foreign = nullptr;
  ibv_qp *tgt = nullptr, *ini = nullptr;
};

TEST_F(XrcData, EachSendGoesToTheSrqItNames) {
  ASSERT_EQ(0, post_srq(srq, 100, 0));
  ASSERT_EQ(0, post_srq(srq2, 200, 4096));
  for (int i = 0; i < 300; ++i) sbuf[i] = uint8_t(i + 7);
  ASSERT_EQ(0, post(num(srq2), 300, 1));
  ASSERT_EQ(0, post(num(srq), 100, 2));
  auto mine = poll(scq, 2);
  ASSERT_EQ(2u, mine.size());
  EXPECT_EQ(IBV_WC_SUCCESS, mine[0].status);
  EXPECT_EQ(IBV_WC_SUCCESS, mine[1].status);
  auto a = poll(rcq2, 1);
  ASSERT_EQ(1u, a.size());
  EXPECT_EQ(200u, a[0].wr_id);
  EXPECT_EQ(300u, a[0].byte_len);
  EXPECT_EQ(tgt->qp_num, a[0].qp_num);  // the target QP it came through
  EXPECT_EQ(0, std::memcmp(sbuf, rbuf + 4096, 300));
  auto b = poll(rcq, 1);
  ASSERT_EQ(1u, b.size());
  EXPECT_EQ(100u, b[0].wr_id);
  EXPECT_EQ(100u, b[0].byte_len);
  // RDMA WRITE needs no receive, only the SRQ's domain and the key.
  ASSERT_EQ(0, post(num(srq), 64, 3, IBV_WR_RDMA_WRITE, reinterpret_cast<uint64_t>(rbuf) + 8192));
  auto w = poll(scq, 1);
  ASSERT_EQ(1u, w.size());
  EXPECT_EQ(IBV_WC_SUCCESS, w[0].status);
  EXPECT_EQ(0, std::memcmp(sbuf, rbuf + 8192, 64));
}

// IBTA annex A14: an XRC SRQ number outside the target QP's domain is an
// invalid request.
TEST_F(XrcData, AnSrqOfAnotherDomainIsAnInvalidRequest) {
  ASSERT_EQ(0, post_srq(foreign, 1, 0));
  ASSERT_EQ(0, post(num(foreign), 8, 1));
  auto wc = poll(scq, 1);
  ASSERT_EQ(1u, wc.size());
  EXPECT_EQ(IBV_WC_REM_INV_REQ_ERR, wc[0].status);
  EXPECT_TRUE(poll(rcq, 1, 30).empty());
}

TEST_F(XrcData, NoSuchSrqIsAnInvalidRequest) {
  ASSERT_EQ(0, post(0xfffff, 8, 1));
  auto wc = poll(scq, 1);
  ASSERT_EQ(1u, wc.size());
  EXPECT_EQ(IBV_WC_REM_INV_REQ_ERR, wc[0].status);
}

// The ibv_wr_* API names the SRQ with ibv_wr_set_xrc_srqn.
TEST_F(XrcData, TheWrApiNamesTheSrq) {
  ibv_qp_ex* x = ibv_qp_to_qp_ex(ini);
  ASSERT_NE(nullptr, x);
  ASSERT_EQ(0, post_srq(srq2, 7, 0));
  for (int i = 0; i < 50; ++i) sbuf[i] = uint8_t(3 * i);
  ibv_wr_start(x);
  x->wr_id = 9;
  x->wr_flags = IBV_SEND_SIGNALED;
  ibv_wr_send(x);
  ibv_wr_set_xrc_srqn(x, num(srq2));
  ibv_wr_set_sge(x, smr->lkey, reinterpret_cast<uint64_t>(sbuf), 50);
  ASSERT_EQ(0, ibv_wr_complete(x));
  auto mine = poll(scq, 1);
  ASSERT_EQ(1u, mine.size());
  EXPECT_EQ(9u, mine[0].wr_id);
  EXPECT_EQ(IBV_WC_SUCCESS, mine[0].status);
  auto got = poll(rcq2, 1);
  ASSERT_EQ(1u, got.size());
  EXPECT_EQ(7u, got[0].wr_id);
  EXPECT_EQ(0, std::memcmp(sbuf, rbuf, 50));
}

TEST_F(XrcData, ATargetQpCannotSend) {
  ibv_sge sge{reinterpret_cast<uint64_t>(rbuf), 8, rmr->lkey};
  ibv_send_wr wr{};
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_SEND;
  ibv_send_wr* bad;
  EXPECT_EQ(EINVAL, ibv_post_send(tgt, &wr, &bad));
}

}  // namespace
}  // namespace svtest
