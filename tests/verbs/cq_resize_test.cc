// ibv_resize_cq(3): grow and shrink with completions waiting, in order, also
// while another process completes into the CQ; and CQ overrun as a CQ error
// (IBTA 11.4.2.1, 10.10.2.3).
#include <gtest/gtest.h>
#include <poll.h>

#include <atomic>
#include <chrono>
#include <thread>

#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "softverbs/softverbs.h"

namespace svtest {
namespace {

class CqResize : public ::testing::Test {
 protected:
  void connect(int cqe) {
    Side::Options o;
    o.cqe = cqe;
    o.max_wr = 256;
    ASSERT_EQ(0, connect_pair(me, peer, info, o, {}));
  }
  int write(uint64_t id, bool signaled = true) {
    ibv_sge sge{reinterpret_cast<uint64_t>(me.buf), 8, me.mr->lkey};
    ibv_send_wr wr{};
    wr.wr_id = id;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_RDMA_WRITE;
    wr.send_flags = signaled ? IBV_SEND_SIGNALED : 0;
    wr.wr.rdma.remote_addr = info.addr;
    wr.wr.rdma.rkey = info.rkey;
    ibv_send_wr* bad;
    return ibv_post_send(me.qp, &wr, &bad);
  }
  // Polls exactly n completions (never more) and checks their order.
  void expect_in_order(uint64_t first, size_t n) {
    std::vector<ibv_wc> wc(n);
    size_t got = 0;
    for (int spins = 0; got < n && spins < 1000000; ++spins) {
      int k = ibv_poll_cq(me.cq, int(n - got), wc.data() + got);
      ASSERT_GE(k, 0);
      got += size_t(k);
    }
    ASSERT_EQ(n, got);
    for (size_t i = 0; i < n; ++i) {
      EXPECT_EQ(first + i, wc[i].wr_id);
      EXPECT_EQ(IBV_WC_SUCCESS, wc[i].status);
    }
  }
  Side me;
  Peer peer;
  PeerInfo info{};
};

TEST_F(CqResize, GrowKeepsWaitingCompletionsInOrder) {
  connect(16);
  EXPECT_GE(me.cq->cqe, 16);
  for (uint64_t i = 0; i < 10; ++i) ASSERT_EQ(0, write(i));
  ASSERT_EQ(0, ibv_resize_cq(me.cq, 200));
  EXPECT_GE(me.cq->cqe, 200);
  // More than the old ring held, after the ten still waiting.
  for (uint64_t i = 10; i < 150; ++i) ASSERT_EQ(0, write(i));
  expect_in_order(0, 150);
  EXPECT_TRUE(poll(me.cq, 1, 20).empty());
}

TEST_F(CqResize, ShrinkBelowWaitingCompletionsIsRefused) {
  connect(256);
  for (uint64_t i = 0; i < 40; ++i) ASSERT_EQ(0, write(i));
  EXPECT_EQ(EINVAL, ibv_resize_cq(me.cq, 39));
  EXPECT_GE(me.cq->cqe, 256);  // unchanged
  EXPECT_EQ(EINVAL, ibv_resize_cq(me.cq, 0));
  EXPECT_EQ(EINVAL, ibv_resize_cq(me.cq, -1));
  EXPECT_EQ(EINVAL, ibv_resize_cq(me.cq, 1 << 24));  // beyond max_cqe
  expect_in_order(0, 5);
  ASSERT_EQ(0, ibv_resize_cq(me.cq, 35));  // exactly what is waiting
  EXPECT_GE(me.cq->cqe, 35);
  EXPECT_LT(me.cq->cqe, 256);
  expect_in_order(5, 35);
  // The refused resize left the CQ usable and the shrunk one works.
  for (uint64_t i = 100; i < 120; ++i) ASSERT_EQ(0, write(i));
  expect_in_order(100, 20);
}

// The peer process pushes its SENDs' receive completions into our CQ; it
// follows the CQ to its new segment without being told.
TEST_F(CqResize, AnotherProcessFollowsTheResizedCq) {
  connect(16);
  ibv_recv_wr rw[20];
  ibv_sge sg[20];
  for (int i = 0; i < 20; ++i) {
    sg[i] = {reinterpret_cast<uint64_t>(me.buf) + 4096 + uint64_t(i) * 64, 64, me.mr->lkey};
    rw[i] = {};
    rw[i].wr_id = 500 + uint64_t(i);
    rw[i].sg_list = &sg[i];
    rw[i].num_sge = 1;
    rw[i].next = i < 19 ? &rw[i + 1] : nullptr;
  }
  ibv_recv_wr* bad;
  ASSERT_EQ(0, ibv_post_recv(me.qp, rw, &bad));
  for (int i = 0; i < 3; ++i) EXPECT_EQ(IBV_WC_SUCCESS, peer.post(IBV_WR_SEND, 0, 16, 0, 0).status);
  ASSERT_EQ(0, ibv_resize_cq(me.cq, 100));
  for (int i = 0; i < 12; ++i) EXPECT_EQ(IBV_WC_SUCCESS, peer.post(IBV_WR_SEND, 0, 16, 0, 0).status);
  ASSERT_EQ(0, ibv_resize_cq(me.cq, 20));  // and back down
  for (int i = 0; i < 5; ++i) EXPECT_EQ(IBV_WC_SUCCESS, peer.post(IBV_WR_SEND, 0, 16, 0, 0).status);
  auto wc = poll(me.cq, 20);
  ASSERT_EQ(20u, wc.size());
  for (size_t i = 0; i < 20; ++i) {
    EXPECT_EQ(500 + i, wc[i].wr_id);
    EXPECT_EQ(IBV_WC_RECV, wc[i].opcode);
    EXPECT_EQ(16u, wc[i].byte_len);
  }
}

// Resizes while another thread keeps completing into the CQ and this one
// polls: every completion arrives once, in order.
TEST_F(CqResize, ResizesRaceProducersWithoutLossOrReordering) {
  connect(1024);
  constexpr uint64_t kTotal = 3000;
  std::atomic<uint64_t> posted{0}, polled{0};
  std::atomic<bool> failed{false};
  std::thread producer([&] {
    for (uint64_t i = 0; i < kTotal; ++i) {
      while (posted.load() - polled.load() > 400) std::this_thread::yield();  // stay below every size used
      if (write(i)) {
        failed = true;
        return;
      }
      posted++;
    }
  });
  uint64_t next = 0;
  int resizes = 0;
  const int sizes[] = {600, 4096, 800, 2048};
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (next < kTotal && !failed && std::chrono::steady_clock::now() < deadline) {
    ibv_wc wc[16];
    int n = ibv_poll_cq(me.cq, 16, wc);
    ASSERT_GE(n, 0);
    for (int i = 0; i < n; ++i) {
      ASSERT_EQ(next, wc[i].wr_id);
      ASSERT_EQ(IBV_WC_SUCCESS, wc[i].status);
      ++next;
    }
    polled += uint64_t(n);
    if (next / 150 > uint64_t(resizes)) {
      ASSERT_EQ(0, ibv_resize_cq(me.cq, sizes[resizes % 4]));
      ++resizes;
    }
  }
  producer.join();
  EXPECT_FALSE(failed);
  EXPECT_EQ(kTotal, next);
  EXPECT_GE(resizes, 10);
}

// A process sharing the CQ (svx_pack/svx_unpack) polls it: it follows the
// resizes made by the creator and sees every completion in order.
TEST_F(CqResize, ASharerFollowsTheResizes) {
  int sv[2];
  ASSERT_EQ(0, socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv));
  pid_t child = fork();
  if (child == 0) {
    ::close(sv[0]);
    ibv_context* c = nullptr;
    svx_object obj[1];
    int n = 0;
    if (svx_unpack(sv[1], &c, obj, 1, &n) || n != 1) _exit(2);
    uint32_t ready = 1;
    if (::write(sv[1], &ready, 4) != 4) _exit(3);
    uint64_t next = 0;
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (next < 100 && std::chrono::steady_clock::now() < deadline) {
      ibv_wc wc[8];
      int got = ibv_poll_cq(obj[0].cq, 8, wc);
      if (got < 0) _exit(4);
      for (int i = 0; i < got; ++i)
        if (wc[i].wr_id != next++ || wc[i].status != IBV_WC_SUCCESS) _exit(5);
    }
    _exit(next == 100 ? 0 : 6);
  }
  ::close(sv[1]);
  connect(256);
  svx_object obj[1];
  obj[0].type = SVX_OBJ_CQ;
  obj[0].cq = me.cq;
  ASSERT_EQ(0, svx_pack(sv[0], me.ctx, obj, 1));
  uint32_t ready = 0;
  ASSERT_EQ(4, read(sv[0], &ready, 4));
  for (uint64_t i = 0; i < 30; ++i) ASSERT_EQ(0, write(i));
  ASSERT_EQ(0, ibv_resize_cq(me.cq, 2048));
  for (uint64_t i = 30; i < 60; ++i) ASSERT_EQ(0, write(i));
  int rc;
  while ((rc = ibv_resize_cq(me.cq, 100)) == EINVAL) usleep(1000);  // until the sharer drained enough
  ASSERT_EQ(0, rc);
  for (uint64_t i = 60; i < 100; ++i) ASSERT_EQ(0, write(i));
  int st = 0;
  ASSERT_EQ(child, waitpid(child, &st, 0));
  EXPECT_TRUE(WIFEXITED(st));
  EXPECT_EQ(0, WEXITSTATUS(st));
  ::close(sv[0]);
}

// IBTA 11.4.2.1: a completion that does not fit is a CQ overrun, an error
// of the CQ (10.10.2.3): IBV_EVENT_CQ_ERR, and its QPs go to ERR.
TEST_F(CqResize, OverrunIsACqErrorEvent) {
  connect(4);
  const int cap = me.cq->cqe + 1;  // the ring holds cqe+1 in softverbs; fill past it
  for (int i = 0; i < cap + 2; ++i) write(uint64_t(i));
  ibv_async_event ev{};
  bool got = false;
  for (int i = 0; i < 3000 && !got; ++i) {  // up to 30 s: a loaded sanitizer run is slow
    got = ibv_get_async_event(me.ctx, &ev) == 0;
    if (!got) {
      pollfd p{me.ctx->async_fd, POLLIN, 0};
      ::poll(&p, 1, 10);
    }
  }
  ASSERT_TRUE(got);
  EXPECT_EQ(IBV_EVENT_CQ_ERR, ev.event_type);
  EXPECT_EQ(me.cq, ev.element.cq);
  ibv_ack_async_event(&ev);
  ibv_qp_attr a{};
  ibv_qp_init_attr ia{};
  ASSERT_EQ(0, ibv_query_qp(me.qp, &a, IBV_QP_STATE, &ia));
  EXPECT_EQ(IBV_QPS_ERR, a.qp_state);
  // The completions that fit are still there, in order.
  auto wc = poll(me.cq, cap);
  ASSERT_EQ(size_t(cap), wc.size());
  for (int i = 0; i < cap; ++i) EXPECT_EQ(uint64_t(i), wc[i].wr_id);
}

// A poll gives its last slot back to the producers only at the next poll
// (cq.cc): the CQ must still hold cqe completions meanwhile, also across a
// resize, and each held-back slot comes back.
TEST_F(CqResize, APollHoldsBackNoCapacity) {
  connect(4);
  const int cqe = me.cq->cqe;
  uint64_t id = 0;
  for (int round = 0; round < 3; ++round) {
    ASSERT_EQ(0, write(id));
    expect_in_order(id++, 1);  // one slot held back now
    for (int i = 0; i < cqe; ++i) ASSERT_EQ(0, write(id + uint64_t(i)));
    expect_in_order(id, size_t(cqe));
    id += uint64_t(cqe);
  }
  ASSERT_EQ(0, write(id));
  expect_in_order(id++, 1);
  ASSERT_EQ(0, ibv_resize_cq(me.cq, 2 * cqe));
  for (int i = 0; i < me.cq->cqe; ++i) ASSERT_EQ(0, write(id + uint64_t(i)));
  expect_in_order(id, size_t(me.cq->cqe));
  pollfd p{me.ctx->async_fd, POLLIN, 0};
  EXPECT_EQ(0, ::poll(&p, 1, 50));  // no CQ error (overrun) was raised
}

TEST_F(CqResize, IgnoreOverrunCqRaisesNoError) {
  Side::Options o;
  ASSERT_EQ(0, connect_pair(me, peer, info, o, {}));
  ibv_cq_init_attr_ex ca{};
  ca.cqe = 4;
  ca.comp_mask = IBV_CQ_INIT_ATTR_MASK_FLAGS;
  ca.flags = IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN;
  ibv_cq_ex* cq = ibv_create_cq_ex(me.ctx, &ca);
  ASSERT_NE(nullptr, cq);
  ibv_qp_init_attr ia{};
  ia.send_cq = ibv_cq_ex_to_cq(cq);
  ia.recv_cq = ibv_cq_ex_to_cq(cq);
  ia.qp_type = IBV_QPT_RC;
  ia.cap = {64, 8, 1, 1, 0};
  ibv_qp* qp = ibv_create_qp(me.pd, &ia);
  ASSERT_NE(nullptr, qp);
  // Swap it in for the harness's QP: connect it to a second peer QP.
  Peer p2;
  PeerInfo i2 = p2.open({});
  Side tmp;
  tmp.ctx = me.ctx;
  tmp.qp = qp;
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.port_num = 1;
  a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
  ASSERT_EQ(0, ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS));
  ASSERT_EQ(0, tmp.connect(i2.qpn, {}));
  tmp.ctx = nullptr;
  tmp.qp = nullptr;
  ASSERT_EQ(0, p2.connect(qp->qp_num, {}));
  for (int i = 0; i < 20; ++i) {
    ibv_sge sge{reinterpret_cast<uint64_t>(me.buf), 8, me.mr->lkey};
    ibv_send_wr wr{};
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_RDMA_WRITE;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = i2.addr;
    wr.wr.rdma.rkey = i2.rkey;
    ibv_send_wr* bad;
    ASSERT_EQ(0, ibv_post_send(qp, &wr, &bad));
  }
  pollfd p{me.ctx->async_fd, POLLIN, 0};
  EXPECT_EQ(0, ::poll(&p, 1, 100));  // no async event (the fd blocks: do not read it)
  ibv_qp_attr qa{};
  ASSERT_EQ(0, ibv_query_qp(qp, &qa, IBV_QP_STATE, &ia));
  EXPECT_EQ(IBV_QPS_RTS, qa.qp_state);
  ibv_destroy_qp(qp);
  ibv_destroy_cq(ibv_cq_ex_to_cq(cq));
}

}  // namespace
}  // namespace svtest
