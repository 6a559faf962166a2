// The namespace (seed 002): objects published under names with an owner,
// a group and a mode, opened by name from other processes; a process of
// another user refused (run as root: the child drops to nobody and talks
// to a private system-wide daemon).
#include <gtest/gtest.h>
#include <limits.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "harness.h"
#include "softverbs/softverbs.h"

namespace svtest {
namespace {

int wait_for(pid_t pid) {
  int st = 0;
  waitpid(pid, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

// A second process, forked when the test starts, before this process starts
// the library's threads: TSan cannot follow a fork taken while other threads
// run (the child's new threads collide with the dead ones in its registry).
// The child waits for start(payload), then runs body(sock, payload) and
// exits with its result; sock() is the parent's end of their socket pair.
template <class Payload>
class Child {
 public:
  template <class F>
  explicit Child(F body) {
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) return;
    pid_ = fork();
    if (pid_ == 0) {
      close(sv[0]);
      Payload p{};
      if (read(sv[1], &p, sizeof(p)) != ssize_t(sizeof(p))) _exit(99);
      _exit(body(sv[1], p));
    }
    close(sv[1]);
    sock_ = sv[0];
  }
  ~Child() {
    if (pid_ > 0) wait();
  }
  void start(const Payload& p) {
    if (write(sock_, &p, sizeof(p)) != ssize_t(sizeof(p))) std::perror("Child::start");
  }
  int sock() const { return sock_; }
  int wait() {
    if (sock_ >= 0) close(sock_);
    sock_ = -1;
    int st = wait_for(pid_);
    pid_ = -1;
    return st;
  }

 private:
  pid_t pid_ = -1;
  int sock_ = -1;
};
struct Nothing {
  int unused;
};

std::string build_bin(const char* name) {
  char buf[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  buf[n > 0 ? n : 0] = 0;
  std::string p(buf);
  return p.substr(0, p.rfind('/')) + "/../bin/" + name;
}

ibv_context* open_dev() {
  int n = 0;
  ibv_device** l = ibv_get_device_list(&n);
  ibv_context* c = n > 0 ? ibv_open_device(l[0]) : nullptr;
  ibv_free_device_list(l);
  return c;
}

TEST(Namespace, PublishedObjectsOpenByNameInAnotherProcess) {
  struct Want {
    uint32_t rkey, lkey;
    uint64_t length;
  };
  Child<Want> child([](int s, const Want& want) {
    svx_object o{};
    errno = 0;
    if (svx_open("/ns-test/none", SVX_OPEN_READ, &o) || errno != ENOENT) return 10;
    if (svx_open("/ns-test/../x", SVX_OPEN_READ, &o) || errno != EINVAL) return 11;
    if (svx_open("/ns-test/mr", 0, &o) || errno != EINVAL) return 12;
    ibv_context* c1 = svx_open("/ns-test/mr", SVX_OPEN_READ | SVX_OPEN_WRITE, &o);
    if (!c1 || o.type != SVX_OBJ_MR || !o.mr) return 13;
    if (o.mr->rkey != want.rkey || o.mr->lkey != want.lkey || o.mr->length != want.length) return 14;
    ibv_context* c2 = svx_open("/ns-test/cq", SVX_OPEN_READ, &o);
    if (!c2 || o.type != SVX_OBJ_CQ || !o.cq) return 15;
    char go = 1;
    if (write(s, &go, 1) != 1) return 16;
    // The parent now writes with a signaled WR into its peer QP: the
    // completion arrives in the CQ this process opened by name.
    ibv_wc wc{};
    for (int i = 0; i < 5000000; ++i) {
      int n = ibv_poll_cq(o.cq, 1, &wc);
      if (n == 1) break;
      if (n < 0) return 17;
      if (i % 1000 == 999) usleep(100);
    }
    if (wc.wr_id != 0xfeed || wc.status != IBV_WC_SUCCESS) return 18;
    ibv_close_device(c2);
    ibv_close_device(c1);
    return 0;
  });
  ibv_context* ctx = open_dev();
  ASSERT_NE(nullptr, ctx);
  ibv_pd* pd = ibv_alloc_pd(ctx);
  static uint8_t buf[4096];
  ibv_mr* mr = ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  ibv_cq* cq = ibv_create_cq(ctx, 16, nullptr, nullptr, 0);
  ASSERT_TRUE(pd && mr && cq);
  svx_object omr{SVX_OBJ_MR, {}}, ocq{SVX_OBJ_CQ, {}};
  omr.mr = mr;
  ocq.cq = cq;
  ASSERT_EQ(0, svx_publish(ctx, "/ns-test/mr", &omr, 0600, -1));
  ASSERT_EQ(0, svx_publish(ctx, "/ns-test/cq", &ocq, 0600, -1));
  EXPECT_EQ(EEXIST, svx_publish(ctx, "/ns-test/mr", &ocq, 0600, -1));
  EXPECT_EQ(EINVAL, svx_publish(ctx, "ns-test/relative", &ocq, 0600, -1));
  EXPECT_EQ(EINVAL, svx_publish(ctx, "/ns-test/mode", &ocq, 01777, -1));

  // Two QPs of this context connected to each other, completing into the
  // published CQ: the other process sees the completions there.
  ibv_qp_init_attr ia{};
  ia.send_cq = cq;
  ia.recv_cq = cq;
  ia.qp_type = IBV_QPT_RC;
  ia.cap = {16, 16, 1, 1, 0};
  ibv_qp* qa = ibv_create_qp(pd, &ia);
  ibv_qp* qb = ibv_create_qp(pd, &ia);
  ASSERT_TRUE(qa && qb);
  ASSERT_EQ(0, connect_qp(qa, qb->qp_num));
  ASSERT_EQ(0, connect_qp(qb, qa->qp_num));

  child.start(Want{mr->rkey, mr->lkey, sizeof(buf)});
  char go = 0;
  ASSERT_EQ(1, read(child.sock(), &go, 1));
  ibv_sge sge{reinterpret_cast<uintptr_t>(buf), 8, mr->lkey};
  ibv_send_wr wr{}, *bad = nullptr;
  wr.wr_id = 0xfeed;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = reinterpret_cast<uintptr_t>(buf) + 64;
  wr.wr.rdma.rkey = mr->rkey;
  ASSERT_EQ(0, ibv_post_send(qa, &wr, &bad));
  EXPECT_EQ(0, child.wait());

  // Only the owner (or root) removes a name; a name goes with its object.
  EXPECT_EQ(0, svx_unpublish(ctx, "/ns-test/cq"));
  EXPECT_EQ(ENOENT, svx_unpublish(ctx, "/ns-test/cq"));
  ibv_destroy_qp(qa);
  ibv_destroy_qp(qb);
  ASSERT_EQ(0, ibv_dereg_mr(mr));
  svx_object o{};
  errno = 0;
  EXPECT_EQ(nullptr, svx_open("/ns-test/mr", SVX_OPEN_READ, &o));
  EXPECT_EQ(ENOENT, errno);
  ibv_destroy_cq(cq);
  ibv_dealloc_pd(pd);
  ibv_close_device(ctx);
}

// An SRQ shared by name: another process posts receives to it from its own
// memory, and a QP of the creator consumes them.
TEST(Namespace, SrqOpenedByNameServesReceivesPostedByAnotherProcess) {
  Child<Nothing> child([](int s, const Nothing&) {
    svx_object o{};
    ibv_context* c = svx_open("/srq-test/srq", SVX_OPEN_READ | SVX_OPEN_WRITE, &o);
    if (!c || o.type != SVX_OBJ_SRQ || !o.srq || !o.srq->pd) return 40;
    ibv_srq_attr qa{};
    if (ibv_query_srq(o.srq, &qa) != 0 || qa.max_wr < 16) return 41;
    static uint8_t mine[256];
    ibv_mr* mr = ibv_reg_mr(o.srq->pd, mine, sizeof(mine), IBV_ACCESS_LOCAL_WRITE);
    if (!mr) return 42;
    ibv_sge sge{reinterpret_cast<uintptr_t>(mine), sizeof(mine), mr->lkey};
    ibv_recv_wr wr{}, *bad = nullptr;
    wr.wr_id = 0xabc;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    if (ibv_post_srq_recv(o.srq, &wr, &bad) != 0) return 43;
    char b = 1;
    if (write(s, &b, 1) != 1 || read(s, &b, 1) != 1) return 44;
    for (int i = 0; i < 100; ++i)
      if (mine[i] != uint8_t(i * 7 + 1)) return 45;
    // The MR belongs to the shared context (it would outlive this process
    // and keep the PD busy): deregister it.
    if (ibv_dereg_mr(mr)) return 46;
    svx_unimport_srq(o.srq);
    return 0;
  });
  ibv_context* ctx = open_dev();
  ASSERT_NE(nullptr, ctx);
  ibv_pd* pd = ibv_alloc_pd(ctx);
  ibv_cq* cq = ibv_create_cq(ctx, 16, nullptr, nullptr, 0);
  ibv_srq_init_attr sa{};
  sa.attr.max_wr = 16;
  sa.attr.max_sge = 1;
  ibv_srq* srq = ibv_create_srq(pd, &sa);
  ASSERT_TRUE(pd && cq && srq);
  ibv_qp_init_attr ia{};
  ia.send_cq = cq;
  ia.recv_cq = cq;
  ia.qp_type = IBV_QPT_RC;
  ia.cap = {16, 16, 1, 1, 0};
  ibv_qp* sender = ibv_create_qp(pd, &ia);
  ia.srq = srq;
  ibv_qp* receiver = ibv_create_qp(pd, &ia);
  ASSERT_TRUE(sender && receiver);
  ASSERT_EQ(0, connect_qp(sender, receiver->qp_num));
  ASSERT_EQ(0, connect_qp(receiver, sender->qp_num));
  svx_object osrq{SVX_OBJ_SRQ, {}};
  osrq.srq = srq;
  ASSERT_EQ(0, svx_publish(ctx, "/srq-test/srq", &osrq, 0600, -1));

  child.start({});
  char b = 0;
  ASSERT_EQ(1, read(child.sock(), &b, 1));
  static uint8_t msg[100];
  for (int i = 0; i < 100; ++i) msg[i] = uint8_t(i * 7 + 1);
  ibv_mr* mr = ibv_reg_mr(pd, msg, sizeof(msg), IBV_ACCESS_LOCAL_WRITE);
  ASSERT_NE(nullptr, mr);
  ibv_sge sge{reinterpret_cast<uintptr_t>(msg), sizeof(msg), mr->lkey};
  ibv_send_wr wr{}, *bad = nullptr;
  wr.wr_id = 1;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_SEND;
  wr.send_flags = IBV_SEND_SIGNALED;
  ASSERT_EQ(0, ibv_post_send(sender, &wr, &bad));
  auto wcs = poll(cq, 2);
  ASSERT_EQ(2u, wcs.size());
  bool got_recv = false;
  for (const auto& wc : wcs) {
    EXPECT_EQ(IBV_WC_SUCCESS, wc.status) << ibv_wc_status_str(wc.status);
    if (wc.opcode == IBV_WC_RECV) {
      got_recv = true;
      EXPECT_EQ(0xabcu, wc.wr_id);
      EXPECT_EQ(receiver->qp_num, wc.qp_num);
      EXPECT_EQ(100u, wc.byte_len);
    }
  }
  EXPECT_TRUE(got_recv);
  ASSERT_EQ(1, write(child.sock(), &b, 1));
  EXPECT_EQ(0, child.wait());
  ibv_destroy_qp(receiver);
  ibv_destroy_qp(sender);
  ibv_dereg_mr(mr);
  EXPECT_EQ(0, ibv_destroy_srq(srq));
  ibv_destroy_cq(cq);
  ibv_dealloc_pd(pd);
  ibv_close_device(ctx);
}

// A private system-wide daemon (what root runs as /run/softverbs) for the
// duration of a test; the environment points this process and its
// children at it.
struct SystemDaemon {
  std::string dir;
  pid_t pid = -1;
  SystemDaemon() {
    char tmpl[] = "/tmp/softverbs-system-XXXXXX";
    dir = mkdtemp(tmpl);
    chmod(dir.c_str(), 0755);
    std::string bin = build_bin("softverbsd");
    pid = fork();
    if (pid == 0) {
      execl(bin.c_str(), "softverbsd", "--system", "--foreground", "--dir", dir.c_str(), "--idle", "0",
            static_cast<char*>(nullptr));
      _exit(127);
    }
    for (int i = 0; i < 500 && access((dir + "/control").c_str(), F_OK) != 0; ++i) usleep(10000);
    setenv("SOFTVERBS_SYSTEM", "1", 1);
    setenv("SOFTVERBS_SYSTEM_DIR", dir.c_str(), 1);
  }
  ~SystemDaemon() {
    unsetenv("SOFTVERBS_SYSTEM");
    unsetenv("SOFTVERBS_SYSTEM_DIR");
    if (pid > 0) {
      kill(pid, SIGTERM);
      wait_for(pid);
    }
    std::string cmd = "rm -rf " + dir;
    if (std::system(cmd.c_str())) {
    }
  }
};

TEST(Namespace, AnotherUserIsRefusedAndLsShowsOwnersAndModes) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run a child as another user";
  SystemDaemon sysd;
  Child<Nothing> same([](int, const Nothing&) {
    svx_object o{};
    ibv_context* c = svx_open("/sys-test/private", SVX_OPEN_READ, &o);
    return c && o.mr ? 0 : 20;
  });
  Child<Nothing> nobody([](int, const Nothing&) {
    if (setgid(65534) != 0 || setuid(65534) != 0) return 30;
    svx_object o{};
    errno = 0;
    if (svx_open("/sys-test/private", SVX_OPEN_READ, &o) || errno != EACCES) return 31;
    errno = 0;
    if (svx_open("/sys-test/private", SVX_OPEN_WRITE, &o) || errno != EACCES) return 32;
    // The mode lets others read the PD, but the daemon hands out no
    // descriptor of another user's context (they map its memory).
    errno = 0;
    if (svx_open("/sys-test/public", SVX_OPEN_READ, &o) || errno != EPERM) return 33;
    errno = 0;
    if (svx_open("/sys-test/public", SVX_OPEN_WRITE, &o) || errno != EACCES) return 34;
    // Nor may it remove or take over a name.
    ibv_context* mine = open_dev();
    if (!mine) return 35;
    if (svx_unpublish(mine, "/sys-test/private") != EPERM) return 36;
    ibv_pd* pd2 = ibv_alloc_pd(mine);
    svx_object op{SVX_OBJ_PD, {}};
    op.pd = pd2;
    if (svx_publish(mine, "/sys-test/private", &op, 0666, -1) != EEXIST) return 37;
    if (svx_publish(mine, "/sys-test/nobody", &op, 0600, 0) != EPERM) return 38;  // not in group 0
    ibv_dealloc_pd(pd2);
    ibv_close_device(mine);
    return 0;
  });
  ibv_context* ctx = open_dev();
  ASSERT_NE(nullptr, ctx);
  ibv_pd* pd = ibv_alloc_pd(ctx);
  static uint8_t secret[4096];
  std::memset(secret, 0x5a, sizeof(secret));
  ibv_mr* mr = ibv_reg_mr(pd, secret, sizeof(secret), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
  ASSERT_TRUE(pd && mr);
  svx_object omr{SVX_OBJ_MR, {}}, opd{SVX_OBJ_PD, {}};
  omr.mr = mr;
  opd.pd = pd;
  ASSERT_EQ(0, svx_publish(ctx, "/sys-test/private", &omr, 0600, -1));
  ASSERT_EQ(0, svx_publish(ctx, "/sys-test/public", &opd, 0644, -1));

  // `softverbs ls` lists both, like ls -l.
  std::string cmd = build_bin("softverbs") + " ls";
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(nullptr, p);
  std::string out;
  char line[512];
  while (fgets(line, sizeof(line), p)) out += line;
  EXPECT_EQ(0, pclose(p));
  EXPECT_NE(std::string::npos, out.find("rw-------      0      0 mr")) << out;
  EXPECT_NE(std::string::npos, out.find("/sys-test/private")) << out;
  EXPECT_NE(std::string::npos, out.find("rw-r--r--      0      0 pd")) << out;

  // The same user opens it; nobody (65534) does not.
  same.start({});
  EXPECT_EQ(0, same.wait());
  nobody.start({});
  EXPECT_EQ(0, nobody.wait());
  ibv_dereg_mr(mr);
  ibv_dealloc_pd(pd);
  ibv_close_device(ctx);
}

// Between users, a connection works with exactly what the keys grant: the
// daemon carries each operation out (nothing of the other user's memory is
// mapped), and a key that does not grant the access fails as on a fabric.
TEST(Namespace, AnotherUsersQpReachesOnlyWhatItsKeysGrant) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run a child as another user";
  SystemDaemon sysd;
  struct Info {
    uint32_t qpn, rkey, local_only_key;
    uint64_t addr, local_only_addr;
  };
  Child<Info> child([](int s, const Info& info) {
    if (setgid(65534) != 0 || setuid(65534) != 0) return 60;
    Side b;
    if (int e = b.open({})) {
      fprintf(stderr, "child: open: %s\n", strerror(e));
      return 61;
    }
    uint32_t mine = b.qp->qp_num;
    if (write(s, &mine, 4) != 4) return 62;
    if (b.connect(info.qpn, {})) return 63;
    char go;
    if (read(s, &go, 1) != 1) return 64;  // the root side is connected too
    auto post = [&](ibv_wr_opcode op, uint64_t off, uint32_t len, uint64_t raddr, uint32_t rkey, int flags = 0,
                    uint64_t add = 0) {
      ibv_sge sge{reinterpret_cast<uintptr_t>(b.buf + off), len, b.mr->lkey};
      ibv_send_wr wr{}, *bad = nullptr;
      wr.wr_id = off;
      wr.sg_list = &sge;
      wr.num_sge = 1;
      wr.opcode = op;
      wr.send_flags = IBV_SEND_SIGNALED | flags;
      if (op == IBV_WR_ATOMIC_FETCH_AND_ADD) {
        wr.wr.atomic.remote_addr = raddr;
        wr.wr.atomic.rkey = rkey;
        wr.wr.atomic.compare_add = add;
      } else {
        wr.wr.rdma.remote_addr = raddr;
        wr.wr.rdma.rkey = rkey;
      }
      ibv_wc wc{};
      wc.status = IBV_WC_GENERAL_ERR;
      if (ibv_post_send(b.qp, &wr, &bad)) return wc;
      auto got = svtest::poll(b.cq, 1);
      return got.empty() ? wc : got[0];
    };
    // READ the whole buffer of the other user, through its key.
    ibv_wc wc = post(IBV_WR_RDMA_READ, 0, 4096, info.addr, info.rkey);
    if (wc.status != IBV_WC_SUCCESS) return 65;
    for (int i = 0; i < 4096; ++i)
      if (b.buf[i] != uint8_t(i * 13 + 1)) return 66;
    std::memset(b.buf + 4096, 0xc3, 100);
    if (post(IBV_WR_RDMA_WRITE, 4096, 100, info.addr + 1000, info.rkey).status != IBV_WC_SUCCESS) return 67;
    wc = post(IBV_WR_ATOMIC_FETCH_AND_ADD, 4200, 8, info.addr + 2048, info.rkey, 0, 5);
    if (wc.status != IBV_WC_SUCCESS) return 68;
    uint64_t old = 0;
    std::memcpy(&old, b.buf + 4200, 8);
    if (write(s, &old, 8) != 8) return 69;
    std::memset(b.buf + 4300, 0x5e, 64);
    if (post(IBV_WR_SEND, 4300, 64, 0, 0).status != IBV_WC_SUCCESS) return 70;
    std::memcpy(b.buf + 4400, "inline payload!", 16);
    if (post(IBV_WR_SEND, 4400, 16, 0, 0, IBV_SEND_INLINE).status != IBV_WC_SUCCESS) return 71;
    // A key that grants no remote access (forged from what it knows) fails.
    wc = post(IBV_WR_RDMA_READ, 0, 64, info.local_only_addr, info.local_only_key);
    if (wc.status != IBV_WC_REM_ACCESS_ERR) return 72;
    return 0;
  });
  Side a;
  ASSERT_EQ(0, a.open({}));
  for (size_t i = 0; i < a.len; ++i) a.buf[i] = uint8_t(i * 13 + 1);
  static uint8_t secret[4096];
  ibv_mr* local_only = ibv_reg_mr(a.pd, secret, sizeof(secret), IBV_ACCESS_LOCAL_WRITE);
  ASSERT_NE(nullptr, local_only);
  uint64_t word_before = 0;
  std::memcpy(&word_before, a.buf + 2048, 8);
  // Two receives for the child's SENDs.
  for (int i = 0; i < 2; ++i) {
    ibv_sge sge{reinterpret_cast<uintptr_t>(a.buf + 8192 + i * 256), 256, a.mr->lkey};
    ibv_recv_wr wr{}, *bad = nullptr;
    wr.wr_id = 100 + i;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    ASSERT_EQ(0, ibv_post_recv(a.qp, &wr, &bad));
  }
  Info info{a.qp->qp_num, a.mr->rkey, local_only->lkey, reinterpret_cast<uintptr_t>(a.buf),
            reinterpret_cast<uintptr_t>(secret)};
  child.start(info);
  uint32_t bqpn = 0;
  if (read(child.sock(), &bqpn, 4) != 4) FAIL() << "the child failed early: exit " << child.wait();
  ASSERT_EQ(0, a.connect(bqpn, {}));
  char go = 1;
  ASSERT_EQ(1, write(child.sock(), &go, 1));
  uint64_t old = 0;
  ASSERT_EQ(8, read(child.sock(), &old, 8));
  EXPECT_EQ(word_before, old);
  EXPECT_EQ(0, child.wait());
  for (int i = 1000; i < 1100; ++i) ASSERT_EQ(0xc3, a.buf[i]) << i;
  EXPECT_EQ(uint8_t(999 * 13 + 1), a.buf[999]);
  EXPECT_EQ(uint8_t(1100 * 13 + 1), a.buf[1100]);
  uint64_t word = 0;
  std::memcpy(&word, a.buf + 2048, 8);
  EXPECT_EQ(word_before + 5, word);
  auto wcs = poll(a.cq, 2);
  ASSERT_GE(wcs.size(), 2u);
  EXPECT_EQ(100u, wcs[0].wr_id);
  EXPECT_EQ(IBV_WC_SUCCESS, wcs[0].status);
  EXPECT_EQ(64u, wcs[0].byte_len);
  EXPECT_EQ(bqpn, wcs[0].src_qp);
  EXPECT_EQ(101u, wcs[1].wr_id);
  EXPECT_EQ(16u, wcs[1].byte_len);
  for (int i = 0; i < 64; ++i) ASSERT_EQ(0x5e, a.buf[8192 + i]);
  EXPECT_EQ(0, std::memcmp(a.buf + 8192 + 256, "inline payload!", 16));
  // The responder found the bad key: its QP went to ERR (IBTA 9.9.3.1.2).
  ibv_qp_attr qa{};
  ibv_qp_init_attr qi{};
  ASSERT_EQ(0, ibv_query_qp(a.qp, &qa, IBV_QP_STATE, &qi));
  EXPECT_EQ(IBV_QPS_ERR, qa.qp_state);
  ibv_dereg_mr(local_only);
}

// Between users, SEND with Invalidate (carried by the daemon,
// daemon/mediation.cc): the responder's type 2 window bound to its QP is
// invalidated and its receive says which key (IBTA 9.4.1.2.1, 10.6.7.2.6);
// the key then fails as on a fabric.
TEST(Namespace, AnotherUsersSendWithInvalidateInvalidatesTheBoundWindow) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run a child as another user";
  SystemDaemon sysd;
  struct Info {
    uint32_t qpn;
    uint64_t addr;
  };
  Child<Info> child([](int s, const Info& info) {
    if (setgid(65534) != 0 || setuid(65534) != 0) return 60;
    Side b;
    if (b.open({})) return 61;
    uint32_t mine = b.qp->qp_num;
    if (write(s, &mine, 4) != 4) return 62;
    if (b.connect(info.qpn, {})) return 63;
    uint32_t key = 0;
    if (read(s, &key, 4) != 4) return 64;  // the root side is connected and bound its window
    auto post = [&](ibv_wr_opcode op, uint32_t len, uint32_t rkey) {
      ibv_sge sge{reinterpret_cast<uintptr_t>(b.buf), len, b.mr->lkey};
      ibv_send_wr wr{}, *bad = nullptr;
      wr.sg_list = &sge;
      wr.num_sge = 1;
      wr.opcode = op;
      wr.send_flags = IBV_SEND_SIGNALED;
      if (op == IBV_WR_SEND_WITH_INV) {
        wr.invalidate_rkey = rkey;
      } else {
        wr.wr.rdma.remote_addr = info.addr;
        wr.wr.rdma.rkey = rkey;
      }
      ibv_wc wc{};
      wc.status = IBV_WC_GENERAL_ERR;
      if (ibv_post_send(b.qp, &wr, &bad)) return wc;
      auto got = svtest::poll(b.cq, 1);
      return got.empty() ? wc : got[0];
    };
    if (post(IBV_WR_RDMA_WRITE, 64, key).status != IBV_WC_SUCCESS) return 65;  // the window works
    std::memset(b.buf, 0x77, 32);
    if (post(IBV_WR_SEND_WITH_INV, 32, key).status != IBV_WC_SUCCESS) return 66;
    if (post(IBV_WR_RDMA_WRITE, 64, key).status != IBV_WC_REM_ACCESS_ERR) return 67;  // invalidated
    return 0;
  });
  Side a;
  Side::Options o;
  o.mr_access |= IBV_ACCESS_MW_BIND;
  ASSERT_EQ(0, a.open(o));
  ibv_sge rsge{reinterpret_cast<uintptr_t>(a.buf + 8192), 256, a.mr->lkey};
  ibv_recv_wr rwr{}, *rbad = nullptr;
  rwr.wr_id = 7;
  rwr.sg_list = &rsge;
  rwr.num_sge = 1;
  ASSERT_EQ(0, ibv_post_recv(a.qp, &rwr, &rbad));
  const uint64_t window = reinterpret_cast<uintptr_t>(a.buf + 4096);
  child.start({a.qp->qp_num, window});
  uint32_t bqpn = 0;
  if (read(child.sock(), &bqpn, 4) != 4) FAIL() << "the child failed early: exit " << child.wait();
  ASSERT_EQ(0, a.connect(bqpn, o));
  ibv_mw* mw = ibv_alloc_mw(a.pd, IBV_MW_TYPE_2);
  ASSERT_NE(nullptr, mw);
  ibv_send_wr bind{}, *bad = nullptr;
  bind.wr_id = 3;
  bind.opcode = IBV_WR_BIND_MW;
  bind.send_flags = IBV_SEND_SIGNALED;
  bind.bind_mw.mw = mw;
  bind.bind_mw.rkey = ibv_inc_rkey(mw->rkey);
  bind.bind_mw.bind_info = {a.mr, window, 256, IBV_ACCESS_REMOTE_WRITE};
  ASSERT_EQ(0, ibv_post_send(a.qp, &bind, &bad));
  auto bound = poll(a.cq, 1);
  ASSERT_EQ(1u, bound.size());
  ASSERT_EQ(IBV_WC_SUCCESS, bound[0].status);
  const uint32_t key = bind.bind_mw.rkey;
  ASSERT_EQ(4, write(child.sock(), &key, 4));
  EXPECT_EQ(0, child.wait());
  auto wcs = poll(a.cq, 1);
  ASSERT_EQ(1u, wcs.size());
  EXPECT_EQ(7u, wcs[0].wr_id);
  EXPECT_EQ(IBV_WC_SUCCESS, wcs[0].status);
  EXPECT_EQ(IBV_WC_RECV, wcs[0].opcode);
  EXPECT_EQ(32u, wcs[0].byte_len);
  EXPECT_TRUE(wcs[0].wc_flags & IBV_WC_WITH_INV);
  EXPECT_EQ(key, wcs[0].invalidated_rkey);
  for (int i = 0; i < 32; ++i) ASSERT_EQ(0x77, a.buf[8192 + i]) << i;
  ibv_dealloc_mw(mw);
}

// What the mode grants another user: a CQ, for reading (nothing of it is
// mapped by the grantee; the daemon polls it on its behalf). The other user
// polls the owner's completions.
TEST(Namespace, AnotherUserPollsACqTheModeGrants) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run a child as another user";
  SystemDaemon sysd;
  Child<Nothing> child([](int s, const Nothing&) {
    if (setgid(65534) != 0 || setuid(65534) != 0) return 80;
    svx_object o{};
    errno = 0;
    if (svx_open("/sys-test/cq", SVX_OPEN_READ | SVX_OPEN_WRITE, &o) || errno != EACCES) return 81;
    ibv_context* c = svx_open("/sys-test/cq", SVX_OPEN_READ, &o);
    if (!c || o.type != SVX_OBJ_CQ || !o.cq) return 82;
    // Not this user's to destroy.
    if (ibv_destroy_cq(o.cq) == 0) return 83;
    char go = 1;
    if (write(s, &go, 1) != 1) return 84;
    auto wcs = svtest::poll(o.cq, 1);
    if (wcs.size() != 1 || wcs[0].wr_id != 0xc0ffee || wcs[0].status != IBV_WC_SUCCESS) return 85;
    svx_unimport_cq(o.cq);
    ibv_close_device(c);
    return 0;
  });
  Side a;
  ASSERT_EQ(0, a.open({}));
  Side::Options o2;
  o2.len = 4096;
  Side b;  // a second QP of the owner, as the target of its writes
  ASSERT_EQ(0, b.open(o2));
  ASSERT_EQ(0, a.connect(b.qp->qp_num, {}));
  ASSERT_EQ(0, b.connect(a.qp->qp_num, {}));
  svx_object ocq{SVX_OBJ_CQ, {}};
  ocq.cq = a.cq;
  ASSERT_EQ(0, svx_publish(a.ctx, "/sys-test/cq", &ocq, 0604, -1));
  child.start({});
  char go = 0;
  ASSERT_EQ(1, read(child.sock(), &go, 1));
  ibv_sge sge{reinterpret_cast<uintptr_t>(a.buf), 8, a.mr->lkey};
  ibv_send_wr wr{}, *bad = nullptr;
  wr.wr_id = 0xc0ffee;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = reinterpret_cast<uintptr_t>(b.buf);
  wr.wr.rdma.rkey = b.mr->rkey;
  ASSERT_EQ(0, ibv_post_send(a.qp, &wr, &bad));
  EXPECT_EQ(0, child.wait());
}

}  // namespace
}  // namespace svtest
