// Names with an owner (issue 18, findings 3 and 4): named shared memory
// regions (svx_reg_shmid) and namespace names (svx_publish/svx_open) belong
// to a user. Another user neither attaches a region of root's, nor
// pre-creates one root later attaches, nor makes root's svx_open join its
// context by publishing a name first.
#include <gtest/gtest.h>
#include <infiniband/verbs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <span>
#include <vector>

#include "attack.h"
#include "softverbs/softverbs.h"

namespace svsec {
namespace {

constexpr size_t kLen = 4096;

// What nobody saw of a region: created, and counts of zero / root-secret /
// own-pattern bytes (a region it could not register counts nothing).
struct RegionView {
  int ok = 0;  // 1: registered
  int created = -1;
  uint32_t zero = 0, secret = 0, own = 0;
};

RegionView look(const ibv_mr* mr, int created, uint8_t secret, uint8_t own) {
  RegionView v;
  if (!mr) return v;
  v.ok = 1;
  v.created = created;
  auto* p = static_cast<const uint8_t*>(mr->addr);
  for (size_t i = 0; i < kLen; ++i) {
    v.zero += p[i] == 0;
    v.secret += p[i] == secret;
    v.own += p[i] == own;
  }
  return v;
}

// Finding 3: root creates region "x" and writes a secret; nobody's "x" is
// its own fresh region (or fails), never root's bytes. nobody creates "y"
// first; root's "y" is then a fresh region of root's, and nobody sees none
// of root's writes.
TEST(Names, RegionIdsBelongToTheirUser) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run a child as another user";
  SystemDaemon sysd;
  Child nobody(true, [](int sock) {
    ibv_context* c = open_dev();
    ibv_pd* pd = c ? ibv_alloc_pd(c) : nullptr;
    if (!pd) return 2;
    char go = 0;
    // 1. root's "x" exists: try to attach it, and overwrite what it sees.
    if (!recv_val(sock, go)) return 3;
    int created = -1;
    ibv_mr* x = svx_reg_shmid(pd, "x", 1, kLen, IBV_ACCESS_LOCAL_WRITE, &created);
    RegionView vx = look(x, created, 0x5a, 0x77);
    if (x) std::memset(x->addr, 0x66, kLen);
    if (!send_val(sock, vx)) return 4;
    // 2. Pre-create "y" with a pattern of its own, before root asks for it.
    ibv_mr* y = svx_reg_shmid(pd, "y", 1, kLen, IBV_ACCESS_LOCAL_WRITE, &created);
    if (!y) return 5;
    std::memset(y->addr, 0x77, kLen);
    int ycreated = created;
    if (!send_val(sock, ycreated)) return 6;
    // 3. root attached (or created) its "y" and wrote 0x5a: nobody's is untouched.
    if (!recv_val(sock, go)) return 7;
    RegionView vy = look(y, ycreated, 0x5a, 0x77);
    if (!send_val(sock, vy)) return 8;
    if (!recv_val(sock, go)) return 9;
    return 0;
  });
  ibv_context* c = open_dev();
  ASSERT_NE(nullptr, c);
  ibv_pd* pd = ibv_alloc_pd(c);
  ASSERT_NE(nullptr, pd);
  int created = -1;
  ibv_mr* x = svx_reg_shmid(pd, "x", 1, kLen, IBV_ACCESS_LOCAL_WRITE, &created);
  ASSERT_NE(nullptr, x);
  EXPECT_EQ(1, created);
  std::memset(x->addr, 0x5a, kLen);

  nobody.start();
  char go = 1;
  ASSERT_TRUE(send_val(nobody.sock(), go));
  RegionView vx;
  ASSERT_TRUE(recv_val(nobody.sock(), vx));
  EXPECT_EQ(0u, vx.secret) << "nobody read root's region";
  if (vx.ok) {
    EXPECT_EQ(1, vx.created) << "nobody attached an existing region";
    EXPECT_EQ(uint32_t(kLen), vx.zero);
  }
  // And nobody's writes did not reach root's region.
  auto* px = static_cast<uint8_t*>(x->addr);
  size_t intact = 0;
  for (size_t i = 0; i < kLen; ++i) intact += px[i] == 0x5a;
  EXPECT_EQ(kLen, intact) << "nobody overwrote root's region";

  int ycreated = -1;
  ASSERT_TRUE(recv_val(nobody.sock(), ycreated));
  EXPECT_EQ(1, ycreated);
  created = -1;
  ibv_mr* y = svx_reg_shmid(pd, "y", 1, kLen, IBV_ACCESS_LOCAL_WRITE, &created);
  ASSERT_NE(nullptr, y);
  EXPECT_EQ(1, created) << "root attached a region nobody pre-created";
  auto* py = static_cast<uint8_t*>(y->addr);
  size_t zero = 0;
  for (size_t i = 0; i < kLen; ++i) zero += py[i] == 0;
  EXPECT_EQ(kLen, zero) << "root's fresh region holds nobody's bytes";
  std::memset(y->addr, 0x5a, kLen);
  ASSERT_TRUE(send_val(nobody.sock(), go));
  RegionView vy;
  ASSERT_TRUE(recv_val(nobody.sock(), vy));
  EXPECT_EQ(1, vy.ok);
  EXPECT_EQ(0u, vy.secret) << "nobody saw root's writes";
  EXPECT_EQ(uint32_t(kLen), vy.own);
  ASSERT_TRUE(send_val(nobody.sock(), go));
  EXPECT_EQ(0, nobody.wait());

  // Within one user regions are still shared: a second registration of "x"
  // by root attaches root's region.
  created = -1;
  ibv_mr* x2 = svx_reg_shmid(pd, "x", 1, kLen, IBV_ACCESS_LOCAL_WRITE, &created);
  ASSERT_NE(nullptr, x2);
  EXPECT_EQ(0, created);
  EXPECT_EQ(0x5a, static_cast<uint8_t*>(x2->addr)[100]);
  ibv_dereg_mr(x2);
  ibv_dereg_mr(y);
  ibv_dereg_mr(x);
  ibv_dealloc_pd(pd);
  ibv_close_device(c);
}

// Finding 4: nobody publishes "/squat" (a PD of its context, mode 0666)
// before root opens that name. root's svx_open must not join nobody's
// context: root registers a secret buffer in what it got (if anything), and
// nobody tries to map it (import the MR, then register its pages again,
// which maps the registrant's backing). With SVX_OPEN_OWN root's open of a
// name another user owns fails with EPERM.
TEST(Names, OpeningASquattedNameJoinsNoOtherUsersContext) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run a child as another user";
  SystemDaemon sysd;
  Child nobody(true, [](int sock) {
    ibv_context* c = open_dev();
    ibv_pd* pd = c ? ibv_alloc_pd(c) : nullptr;
    if (!pd) return 2;
    svx_object o{SVX_OBJ_PD, {}};
    o.pd = pd;
    if (svx_publish(c, "/squat", &o, 0666, -1) != 0) return 3;
    int ok = 1;
    if (!send_val(sock, ok)) return 4;
    uint32_t handle = 0;
    if (!recv_val(sock, handle)) return 5;
    uint32_t seen = 0;  // bytes of root's secret nobody could read
    if (handle) {
      ibv_mr* imp = ibv_import_mr(pd, handle);
      ibv_mr* again = imp ? svx_reg_shared(imp, pd, nullptr, IBV_ACCESS_LOCAL_WRITE) : nullptr;
      if (again) {
        auto* p = static_cast<const uint8_t*>(again->addr);
        for (size_t i = 0; i < kLen; ++i) seen += p[i] == 0xa5;
      }
    }
    if (!send_val(sock, seen)) return 6;
    if (!recv_val(sock, ok)) return 7;
    return 0;
  });
  nobody.start();
  int ok = 0;
  ASSERT_TRUE(recv_val(nobody.sock(), ok));
  static uint8_t secret[kLen] __attribute__((aligned(4096)));
  std::memset(secret, 0xa5, sizeof(secret));

  // Expecting its own object, root is told the name is another user's.
  svx_object o{};
  errno = 0;
  ibv_context* own = svx_open("/squat", SVX_OPEN_READ | SVX_OPEN_OWN, &o);
  EXPECT_EQ(nullptr, own);
  EXPECT_EQ(EPERM, errno);
  if (own) ibv_close_device(own);

  // Without the flag root gets no more than another user would: no join.
  o = {};
  ibv_context* got = svx_open("/squat", SVX_OPEN_READ | SVX_OPEN_WRITE, &o);
  EXPECT_EQ(nullptr, got) << "root joined nobody's context";
  ibv_mr* mr = nullptr;
  if (got && o.type == SVX_OBJ_PD && o.pd) mr = ibv_reg_mr(o.pd, secret, sizeof(secret), IBV_ACCESS_LOCAL_WRITE);
  uint32_t handle = mr ? mr->handle : 0;
  ASSERT_TRUE(send_val(nobody.sock(), handle));
  uint32_t seen = 1;
  ASSERT_TRUE(recv_val(nobody.sock(), seen));
  EXPECT_EQ(0u, seen) << "nobody mapped root's memory";
  ASSERT_TRUE(send_val(nobody.sock(), ok));
  EXPECT_EQ(0, nobody.wait());
  if (mr) ibv_dereg_mr(mr);
  if (got) ibv_close_device(got);

  // root's own name, with the flag, still opens (and joins root's context).
  ibv_context* c = open_dev();
  ASSERT_NE(nullptr, c);
  ibv_pd* pd = ibv_alloc_pd(c);
  ASSERT_NE(nullptr, pd);
  svx_object op{SVX_OBJ_PD, {}};
  op.pd = pd;
  ASSERT_EQ(0, svx_publish(c, "/mine", &op, 0600, -1));
  o = {};
  ibv_context* mine = svx_open("/mine", SVX_OPEN_READ | SVX_OPEN_OWN, &o);
  ASSERT_NE(nullptr, mine);
  EXPECT_EQ(SVX_OBJ_PD, o.type);
  if (o.type == SVX_OBJ_PD) ibv_unimport_pd(o.pd);  // svx_open imported it for us
  ibv_close_device(mine);
  ibv_dealloc_pd(pd);
  ibv_close_device(c);
}

// Finding 4 (a): root is not "the same user" as anyone else. A root QP
// connected to nobody's QP is mediated like any other pair of users: root's
// context is handed neither nobody's QP and CQ segments (rings nobody writes)
// nor, for nobody's key, nobody's backing (which nobody can truncate under
// root, or fill with what it likes).
TEST(Names, RootIsNotTheSameUserAsAnyone) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run a child as another user";
  SystemDaemon sysd;
  struct Info {
    uint32_t qpn, rkey;
    uint64_t addr;
  };
  Child nobody(true, [](int sock) {
    alarm(30);
    ibv_context* c = open_dev();
    ibv_pd* pd = c ? ibv_alloc_pd(c) : nullptr;
    static uint8_t buf[4096] __attribute__((aligned(4096)));
    ibv_mr* mr = pd ? ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                                                          IBV_ACCESS_REMOTE_READ)
                    : nullptr;
    ibv_cq* cq = c ? ibv_create_cq(c, 16, nullptr, nullptr, 0) : nullptr;
    if (!mr || !cq) return 2;
    ibv_qp_init_attr ia{};
    ia.qp_type = IBV_QPT_RC;
    ia.cap.max_send_wr = ia.cap.max_recv_wr = 16;
    ia.cap.max_send_sge = ia.cap.max_recv_sge = 1;
    ia.send_cq = ia.recv_cq = cq;
    ibv_qp* qp = ibv_create_qp(pd, &ia);
    if (!qp || qp_to_init(qp, IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ)) return 3;
    Info info{qp->qp_num, mr->rkey, reinterpret_cast<uintptr_t>(buf)};
    if (!send_val(sock, info)) return 4;
    uint32_t root_qpn = 0;
    if (!recv_val(sock, root_qpn) || qp_to_rts(c, qp, root_qpn)) return 5;
    char go = 1;
    if (!send_val(sock, go) || !recv_val(sock, go)) return 6;
    return buf[0] == 0x3c ? 0 : 7;  // root's WRITE arrived
  });
  nobody.start();
  Info info{};
  ASSERT_TRUE(recv_val(nobody.sock(), info));
  ibv_context* c = open_dev();
  ASSERT_NE(nullptr, c);
  ibv_pd* pd = ibv_alloc_pd(c);
  static uint8_t buf[4096] __attribute__((aligned(4096)));
  std::memset(buf, 0x3c, sizeof(buf));
  ibv_mr* mr = ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE);
  ibv_cq* cq = ibv_create_cq(c, 16, nullptr, nullptr, 0);
  ASSERT_TRUE(mr && cq);
  ibv_qp_init_attr ia{};
  ia.qp_type = IBV_QPT_RC;
  ia.cap.max_send_wr = ia.cap.max_recv_wr = 16;
  ia.cap.max_send_sge = ia.cap.max_recv_sge = 1;
  ia.send_cq = ia.recv_cq = cq;
  ibv_qp* qp = ibv_create_qp(pd, &ia);
  ASSERT_NE(nullptr, qp);
  ASSERT_EQ(0, qp_to_init(qp, IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ));
  ASSERT_TRUE(send_val(nobody.sock(), qp->qp_num));
  char go = 0;
  ASSERT_TRUE(recv_val(nobody.sock(), go));
  ASSERT_EQ(0, qp_to_rts(c, qp, info.qpn));
  // The connection works (through the daemon).
  ibv_sge sge{reinterpret_cast<uintptr_t>(buf), 64, mr->lkey};
  ibv_send_wr wr{}, *bad = nullptr;
  wr.wr_id = 1;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = info.addr;
  wr.wr.rdma.rkey = info.rkey;
  ASSERT_EQ(0, ibv_post_send(qp, &wr, &bad));
  ibv_wc wc{};
  int got = 0;
  for (int i = 0; i < 20000 && got == 0; ++i) {
    got = ibv_poll_cq(cq, 1, &wc);
    if (!got) usleep(500);
  }
  ASSERT_EQ(1, got);
  EXPECT_EQ(IBV_WC_SUCCESS, wc.status);

  // What root's context is handed for that connection: ask the daemon
  // directly, from a second connection of root's context.
  RawConn raw(sysd.socket());
  ASSERT_TRUE(raw.ok());
  sv::proto::Empty hello{};
  sv::proto::HelloReply hrep{};
  std::vector<sv::Fd> fds;
  ASSERT_EQ(0, raw.call(sv::proto::Op::Hello, hello, hrep, {}, &fds));
  sv::proto::Empty imp{};
  int cmd_fd = c->cmd_fd;
  ASSERT_EQ(0, raw.call(sv::proto::Op::ImportContext, imp, std::span<const int>(&cmd_fd, 1)));
  sv::proto::HandleReq creq{};
  creq.handle = qp->qp_num;
  sv::proto::ConnectPeerReply crep{};
  fds.clear();
  EXPECT_EQ(0, raw.call(sv::proto::Op::ConnectPeer, creq, crep, {}, &fds));
  EXPECT_EQ(1u, crep.mediated) << "root's connection to nobody is not mediated";
  EXPECT_EQ(0u, fds.size()) << "root was handed nobody's QP/CQ segments";
  sv::proto::GetMrBackingReq breq{};
  breq.key = info.rkey;
  sv::proto::GetMrBackingReply brep{};
  fds.clear();
  EXPECT_EQ(EACCES, raw.call(sv::proto::Op::GetMrBacking, breq, brep, {}, &fds));
  EXPECT_EQ(0u, fds.size()) << "root was handed nobody's backing";
  ASSERT_TRUE(send_val(nobody.sock(), go));
  EXPECT_EQ(0, nobody.wait());
  ibv_destroy_qp(qp);
  ibv_destroy_cq(cq);
  ibv_dereg_mr(mr);
  ibv_dealloc_pd(pd);
  ibv_close_device(c);
}

}  // namespace
}  // namespace svsec
