// Shared receive queues: one SRQ feeds several QPs (from different sender
// processes); the limit event fires when it runs low (IBTA 11.5.2.4).
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>

#include <cstdio>
#include <cstring>
#include <set>
#include <vector>

#include "common/shm_layout.h"
#include "harness.h"
#include "softverbs/softverbs.h"

namespace svtest {
namespace {

TEST(Srq, TwoQpsFromTwoProcessesShareOneSrqAndTheLimitFires) {
  Side me;
  ASSERT_EQ(0, me.open({}));
  ibv_srq_init_attr sa{};
  sa.attr.max_wr = 8;
  sa.attr.max_sge = 1;
  ibv_srq* srq = ibv_create_srq(me.pd, &sa);
  ASSERT_NE(nullptr, srq);
  EXPECT_GE(sa.attr.max_wr, 8u);
  ibv_qp* qps[2];
  Peer peers[2];
  for (int i = 0; i < 2; ++i) {
    ibv_qp_init_attr ia{};
    ia.send_cq = me.cq;
    ia.recv_cq = me.cq;
    ia.srq = srq;
    ia.qp_type = IBV_QPT_RC;
    ia.cap = {8, 0, 1, 0, 0};
    qps[i] = ibv_create_qp(me.pd, &ia);
    ASSERT_NE(nullptr, qps[i]);
    PeerInfo info = peers[i].open({});
    Side tmp;
    tmp.ctx = me.ctx;
    tmp.qp = qps[i];
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.port_num = 1;
    ASSERT_EQ(0, ibv_modify_qp(qps[i], &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS));
    ASSERT_EQ(0, tmp.connect(info.qpn, {}));
    tmp.ctx = nullptr;
    tmp.qp = nullptr;
    ASSERT_EQ(0, peers[i].connect(qps[i]->qp_num, {}));
  }
  // Receives go to the SRQ, not to the QPs.
  ibv_sge sge{reinterpret_cast<uint64_t>(me.buf), 64, me.mr->lkey};
  ibv_recv_wr rw{};
  rw.sg_list = &sge;
  rw.num_sge = 1;
  ibv_recv_wr* bad;
  EXPECT_EQ(EINVAL, ibv_post_recv(qps[0], &rw, &bad));
  for (int i = 0; i < 4; ++i) {
    sge.addr = reinterpret_cast<uint64_t>(me.buf) + uint64_t(i) * 64;
    rw.wr_id = 900 + uint64_t(i);
    ASSERT_EQ(0, ibv_post_srq_recv(srq, &rw, &bad));
  }
  ibv_srq_attr lim{};
  lim.srq_limit = 2;
  ASSERT_EQ(0, ibv_modify_srq(srq, &lim, IBV_SRQ_LIMIT));
  ibv_srq_attr q{};
  ASSERT_EQ(0, ibv_query_srq(srq, &q));
  EXPECT_EQ(2u, q.srq_limit);

  peers[0].fill(1);
  peers[1].fill(2);
  EXPECT_EQ(IBV_WC_SUCCESS, peers[0].post(IBV_WR_SEND, 0, 64, 0, 0).status);
  EXPECT_EQ(IBV_WC_SUCCESS, peers[1].post(IBV_WR_SEND, 0, 64, 0, 0).status);
  EXPECT_EQ(IBV_WC_SUCCESS, peers[0].post(IBV_WR_SEND, 0, 64, 0, 0).status);
  auto wc = poll(me.cq, 3);
  ASSERT_EQ(3u, wc.size());
  std::set<uint32_t> qpns;
  for (auto& w : wc) {
    EXPECT_EQ(IBV_WC_SUCCESS, w.status);
    qpns.insert(w.qp_num);  // the QP that received, for ibv_srq_pingpong's sake
  }
  EXPECT_EQ(std::set<uint32_t>({qps[0]->qp_num, qps[1]->qp_num}), qpns);
  EXPECT_EQ(peers[0].checksum(0, 64), checksum(me.buf, 64));

  // One WQE is left, below the limit of 2: the event fired and disarmed it.
  int fl = fcntl(me.ctx->async_fd, F_GETFL);
  fcntl(me.ctx->async_fd, F_SETFL, fl | O_NONBLOCK);
  ibv_async_event ev{};
  bool got = false;
  // The event is raised by the daemon after the third SEND took the SRQ
  // below its limit: wait for it as long as a loaded (sanitizer) run needs,
  // not a fixed 2 s (that made this test fail under load).
  for (int i = 0; i < 600 && !got; ++i) {
    got = ibv_get_async_event(me.ctx, &ev) == 0;
    if (!got) {
      pollfd p{me.ctx->async_fd, POLLIN, 0};
      poll(&p, 1, 100);
    }
  }
  ASSERT_TRUE(got);
  EXPECT_EQ(IBV_EVENT_SRQ_LIMIT_REACHED, ev.event_type);
  EXPECT_EQ(srq, ev.element.srq);
  ibv_ack_async_event(&ev);
  ASSERT_EQ(0, ibv_query_srq(srq, &q));
  EXPECT_EQ(0u, q.srq_limit);

  EXPECT_EQ(EBUSY, ibv_destroy_srq(srq));  // QPs still use it
  for (auto* qp : qps) EXPECT_EQ(0, ibv_destroy_qp(qp));
  EXPECT_EQ(0, ibv_destroy_srq(srq));
}

// The SRQ's segment header is memory every holder can write. An importer's
// library writes up to max_sge SGEs into each ring slot, so the max_sge the
// daemon gives it must be the one the SRQ was created with, whatever a
// holder wrote in the header (before: the daemon read it from there, and a
// forged 1000 let the importer write far past each slot).
TEST(Srq, AnImporterGetsTheCreatedMaxSgeNotTheHeadersForgedOne) {
  Side me;
  ASSERT_EQ(0, me.open({}));
  ibv_srq_init_attr sa{};
  sa.attr.max_wr = 8;
  sa.attr.max_sge = 2;
  ibv_srq* srq = ibv_create_srq(me.pd, &sa);
  ASSERT_NE(nullptr, srq);
  // This process maps the SRQ's segment: find it, and forge its max_sge.
  sv::shm::SrqSegmentHeader* seg = nullptr;
  if (FILE* f = fopen("/proc/self/maps", "r")) {
    char line[512];
    while (!seg && fgets(line, sizeof(line), f)) {
      unsigned long lo = 0, hi = 0;
      if (!strstr(line, "softverbs-srq") || sscanf(line, "%lx-%lx", &lo, &hi) != 2) continue;
      auto* h = reinterpret_cast<sv::shm::SrqSegmentHeader*>(lo);
      if (h->magic == sv::shm::kSrqMagic && h->handle == srq->handle) seg = h;
    }
    fclose(f);
  }
  ASSERT_NE(nullptr, seg);
  seg->max_sge = 1000;
  ibv_context* c = ibv_import_device(me.ctx->cmd_fd);
  ASSERT_NE(nullptr, c);
  ibv_srq* imported = svx_import_srq(c, srq->handle);
  ASSERT_NE(nullptr, imported) << strerror(errno);
  ibv_srq_attr attr{};
  ASSERT_EQ(0, ibv_query_srq(imported, &attr));
  EXPECT_EQ(2u, attr.max_sge);
  // A receive of more SGEs than the SRQ was made with is refused, not
  // written past its slot.
  std::vector<ibv_sge> sges(sv::shm::kMaxSge + 1, ibv_sge{reinterpret_cast<uintptr_t>(me.buf), 8, me.mr->lkey});
  ibv_recv_wr wr{}, *bad = nullptr;
  wr.sg_list = sges.data();
  wr.num_sge = int(sges.size());
  EXPECT_EQ(EINVAL, ibv_post_srq_recv(imported, &wr, &bad));
  wr.num_sge = 3;
  EXPECT_EQ(EINVAL, ibv_post_srq_recv(imported, &wr, &bad));
  wr.num_sge = 2;
  EXPECT_EQ(0, ibv_post_srq_recv(imported, &wr, &bad));
  ibv_pd* imported_pd = imported->pd;  // imported with the SRQ
  svx_unimport_srq(imported);
  ibv_unimport_pd(imported_pd);
  EXPECT_EQ(0, ibv_close_device(c));
  EXPECT_EQ(0, ibv_destroy_srq(srq));
}

}  // namespace
}  // namespace svtest
