// ibv_modify_srq(3) with IBV_SRQ_MAX_WR: the SRQ grows with its posted
// receives kept, in order, for a sender in another process and for an
// importer posting from another process; a size below the receives
// outstanding is refused.
#include <gtest/gtest.h>

#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <thread>

#include "harness.h"
#include "softverbs/softverbs.h"

namespace svtest {
namespace {

// An SRQ of 8 receives and one RC QP taking from it, connected to a QP of a
// second process (the sender, which maps the SRQ's segment).
struct SrqPair {
  Side me;
  ibv_srq* srq = nullptr;
  ibv_qp* qp = nullptr;
  Peer peer;

  void open() {
    ASSERT_EQ(0, me.open({}));
    ibv_srq_init_attr sa{};
    sa.attr.max_wr = 8;
    sa.attr.max_sge = 1;
    srq = ibv_create_srq(me.pd, &sa);
    ASSERT_NE(nullptr, srq);
    ibv_qp_init_attr ia{};
    ia.send_cq = me.cq;
    ia.recv_cq = me.cq;
    ia.srq = srq;
    ia.qp_type = IBV_QPT_RC;
    ia.cap = {8, 0, 1, 0, 0};
    qp = ibv_create_qp(me.pd, &ia);
    ASSERT_NE(nullptr, qp);
    PeerInfo info = peer.open({});
    Side tmp;
    tmp.ctx = me.ctx;
    tmp.qp = qp;
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.port_num = 1;
    ASSERT_EQ(0, ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS));
    ASSERT_EQ(0, tmp.connect(info.qpn, {}));
    tmp.ctx = nullptr;
    tmp.qp = nullptr;
    ASSERT_EQ(0, peer.connect(qp->qp_num, {}));
  }
  int post(uint64_t id) {
    ibv_sge sge{reinterpret_cast<uint64_t>(me.buf) + (id % 512) * 64, 64, me.mr->lkey};
    ibv_recv_wr rw{};
    rw.wr_id = id;
    rw.sg_list = &sge;
    rw.num_sge = 1;
    ibv_recv_wr* bad;
    return ibv_post_srq_recv(srq, &rw, &bad);
  }
  // The peer sends n messages; each takes the next receive, in order.
  void expect_received_in_order(uint64_t first, uint64_t n) {
    for (uint64_t i = 0; i < n; ++i) ASSERT_EQ(IBV_WC_SUCCESS, peer.post(IBV_WR_SEND, 0, 64, 0, 0).status) << i;
    auto wc = poll(me.cq, int(n));
    ASSERT_EQ(n, wc.size());
    for (uint64_t i = 0; i < n; ++i) {
      EXPECT_EQ(IBV_WC_SUCCESS, wc[i].status);
      EXPECT_EQ(first + i, wc[i].wr_id);
    }
  }
  uint32_t max_wr() {
    ibv_srq_attr q{};
    EXPECT_EQ(0, ibv_query_srq(srq, &q));
    return q.max_wr;
  }
  ~SrqPair() {
    if (qp) ibv_destroy_qp(qp);
    if (srq) ibv_destroy_srq(srq);
  }
};

TEST(SrqResize, GrowKeepsPostedReceivesInOrderForASenderInAnotherProcess) {
  SrqPair s;
  ASSERT_NO_FATAL_FAILURE(s.open());
  const uint32_t old_size = s.max_wr();
  ASSERT_LT(old_size, 100u);
  for (uint64_t i = 0; i < 6; ++i) ASSERT_EQ(0, s.post(i));
  ASSERT_NO_FATAL_FAILURE(s.expect_received_in_order(0, 1));  // the sender maps the old segment
  ibv_srq_attr a{};
  a.max_wr = 128;
  ASSERT_EQ(0, ibv_modify_srq(s.srq, &a, IBV_SRQ_MAX_WR));
  EXPECT_GE(s.max_wr(), 128u);
  // More than the old ring held, after the five still posted.
  for (uint64_t i = 6; i < 106; ++i) ASSERT_EQ(0, s.post(i)) << i;
  ASSERT_NO_FATAL_FAILURE(s.expect_received_in_order(1, 105));
  // Empty again: it grows further, and the sender follows again.
  a.max_wr = 300;
  ASSERT_EQ(0, ibv_modify_srq(s.srq, &a, IBV_SRQ_MAX_WR));
  for (uint64_t i = 106; i < 110; ++i) ASSERT_EQ(0, s.post(i));
  ASSERT_NO_FATAL_FAILURE(s.expect_received_in_order(106, 4));
}

TEST(SrqResize, ShrinkBelowTheReceivesOutstandingIsRefused) {
  SrqPair s;
  ASSERT_NO_FATAL_FAILURE(s.open());
  ibv_srq_attr a{};
  a.max_wr = 128;
  ASSERT_EQ(0, ibv_modify_srq(s.srq, &a, IBV_SRQ_MAX_WR));
  for (uint64_t i = 0; i < 60; ++i) ASSERT_EQ(0, s.post(i));
  const uint32_t size = s.max_wr();
  a.max_wr = 59;
  EXPECT_EQ(EINVAL, ibv_modify_srq(s.srq, &a, IBV_SRQ_MAX_WR));
  EXPECT_EQ(size, s.max_wr());  // unchanged
  // Down to exactly the outstanding count is allowed; they are all kept.
  a.max_wr = 60;
  ASSERT_EQ(0, ibv_modify_srq(s.srq, &a, IBV_SRQ_MAX_WR));
  EXPECT_GE(s.max_wr(), 60u);
  ASSERT_NO_FATAL_FAILURE(s.expect_received_in_order(0, 60));
}

// Resizes race the posts and the sender's takes: another thread resizes the
// SRQ back and forth while this one posts; every receive arrives once, in
// the order posted.
TEST(SrqResize, ResizesRacePostsAndTakesWithoutLossOrReordering) {
  SrqPair s;
  ASSERT_NO_FATAL_FAILURE(s.open());
  ibv_srq_attr first{};
  first.max_wr = 64;  // room for a round's 40 from here on
  ASSERT_EQ(0, ibv_modify_srq(s.srq, &first, IBV_SRQ_MAX_WR));
  std::atomic<bool> stop{false};
  std::atomic<int> resized{0};
  struct Joined {
    std::atomic<bool>& stop;
    std::thread t;
    ~Joined() {
      stop = true;
      t.join();
    }
  } resizer{stop, std::thread([&] {
    for (uint32_t i = 0; !stop.load(); ++i) {
      ibv_srq_attr a{};
      a.max_wr = (i & 1) ? 64 : 200;
      if (ibv_modify_srq(s.srq, &a, IBV_SRQ_MAX_WR) == 0) resized.fetch_add(1);
    }
  })};
  uint64_t id = 0;
  for (int round = 0; round < 20; ++round) {
    for (int k = 0; k < 40; ++k, ++id) ASSERT_EQ(0, s.post(id)) << id;
    ASSERT_NO_FATAL_FAILURE(s.expect_received_in_order(id - 40, 40));
  }
  EXPECT_GT(resized.load(), 1);
}

struct Sock {
  int a = -1, b = -1;
  Sock() {
    int sv[2];
    EXPECT_EQ(0, socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv));
    a = sv[0];
    b = sv[1];
  }
  ~Sock() {
    close(a);
    close(b);
  }
};

bool put(int fd, uint32_t v) { return write(fd, &v, sizeof v) == ssize_t(sizeof v); }
uint32_t get(int fd) {
  uint32_t v = ~0u;
  if (read(fd, &v, sizeof v) != ssize_t(sizeof v)) return ~0u;
  return v;
}

// The importer: posts 4 receives before the resize; after it, queries the
// size, arms the limit and posts 40 (more than the old segment held), all
// through its own (old) mapping of the SRQ, which it follows.
[[noreturn]] void importer(int sock) {
  ibv_context* c = nullptr;
  svx_object objs[2];
  int n = 0;
  if (svx_unpack(sock, &c, objs, 2, &n) || n != 2 || objs[0].type != SVX_OBJ_SRQ) _exit(2);
  auto post = [&](uint64_t id) {
    ibv_mr* mr = objs[1].mr;
    ibv_sge sge{reinterpret_cast<uint64_t>(mr->addr) + (id % 512) * 64, 64, mr->lkey};
    ibv_recv_wr wr{};
    wr.wr_id = id;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    ibv_recv_wr* bad;
    return ibv_post_srq_recv(objs[0].srq, &wr, &bad);
  };
  for (uint64_t i = 100; i < 104; ++i)
    if (post(i)) _exit(3);
  put(sock, 1);
  if (get(sock) != 2) _exit(4);  // resized
  // Its size and its limit are the new segment's, before any post here.
  ibv_srq_attr q{};
  if (ibv_query_srq(objs[0].srq, &q) || q.max_wr < 128) _exit(6);
  q.srq_limit = 5;
  if (ibv_modify_srq(objs[0].srq, &q, IBV_SRQ_LIMIT)) _exit(7);
  for (uint64_t i = 104; i < 144; ++i)
    if (post(i)) _exit(5);
  put(sock, 3);
  get(sock);
  _exit(0);
}

TEST(SrqResize, AnImporterInAnotherProcessKeepsPostingAcrossTheResize) {
  Sock p;
  pid_t child = fork();  // before this process starts the library's threads
  if (child == 0) importer(p.b);
  close(p.b);  // a child that failed ends the parent's reads
  p.b = -1;
  SrqPair s;
  ASSERT_NO_FATAL_FAILURE(s.open());
  svx_object objs[2];
  objs[0].type = SVX_OBJ_SRQ;
  objs[0].srq = s.srq;
  objs[1].type = SVX_OBJ_MR;
  objs[1].mr = s.me.mr;
  ASSERT_EQ(0, svx_pack(p.a, s.me.ctx, objs, 2));
  ASSERT_EQ(1u, get(p.a));
  ibv_srq_attr a{};
  a.max_wr = 128;
  ASSERT_EQ(0, ibv_modify_srq(s.srq, &a, IBV_SRQ_MAX_WR));
  ASSERT_TRUE(put(p.a, 2));
  EXPECT_EQ(3u, get(p.a));
  ibv_srq_attr q{};
  ASSERT_EQ(0, ibv_query_srq(s.srq, &q));
  EXPECT_EQ(5u, q.srq_limit);  // armed by the importer, in the segment in use
  ASSERT_NO_FATAL_FAILURE(s.expect_received_in_order(100, 44));
  put(p.a, 4);
  int st = 0;
  waitpid(child, &st, 0);
  EXPECT_TRUE(WIFEXITED(st));
  EXPECT_EQ(0, WEXITSTATUS(st));
}

}  // namespace
}  // namespace svtest
