// Process death and daemon faults (issue "Robustness"): a dead peer's QPs
// take their connected QPs to ERR with flushes and an async event; a dead
// daemon is IBV_EVENT_DEVICE_FATAL and errors, never a hang; a new daemon
// starts cleanly.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>

#include "harness.h"

namespace svtest {
namespace {

bool wait_async(ibv_context* c, ibv_async_event* ev, int ms) {
  pollfd p{c->async_fd, POLLIN, 0};
  int flags = fcntl(c->async_fd, F_GETFL);
  fcntl(c->async_fd, F_SETFL, flags | O_NONBLOCK);
  for (int waited = 0; waited < ms; waited += 10) {
    if (ibv_get_async_event(c, ev) == 0) return true;
    poll(&p, 1, 10);
  }
  return false;
}

TEST(Faults, PeerDeathTakesConnectedQpToErrorWithFlushesAndAnEvent) {
  Side me;
  Peer peer;
  PeerInfo info;
  ASSERT_EQ(0, connect_pair(me, peer, info));
  for (int i = 0; i < 3; ++i) {
    ibv_sge sge{reinterpret_cast<uint64_t>(me.buf), 16, me.mr->lkey};
    ibv_recv_wr wr{};
    wr.wr_id = 500 + uint64_t(i);
    wr.sg_list = &sge;
    wr.num_sge = 1;
    ibv_recv_wr* bad;
    ASSERT_EQ(0, ibv_post_recv(me.qp, &wr, &bad));
  }
  peer.kill9();
  ibv_async_event ev{};
  ASSERT_TRUE(wait_async(me.ctx, &ev, 30000));
  EXPECT_EQ(IBV_EVENT_QP_FATAL, ev.event_type);
  EXPECT_EQ(me.qp, ev.element.qp);
  ibv_ack_async_event(&ev);
  auto wc = poll(me.cq, 3);
  ASSERT_EQ(3u, wc.size());
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(IBV_WC_WR_FLUSH_ERR, wc[i].status);
    EXPECT_EQ(500u + uint64_t(i), wc[i].wr_id);
  }
  ibv_qp_attr a{};
  ibv_qp_init_attr ia{};
  ibv_query_qp(me.qp, &a, IBV_QP_STATE, &ia);
  EXPECT_EQ(IBV_QPS_ERR, a.qp_state);
}

std::string daemon_path() {
  char buf[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return "softverbsd";
  buf[n] = 0;
  std::string p(buf);
  return p.substr(0, p.rfind('/')) + "/../bin/softverbsd";
}

TEST(Faults, DaemonDeathIsDeviceFatalAndANewDaemonStartsCleanly) {
  char tmpl[] = "/tmp/softverbs-fault-XXXXXX";
  ASSERT_NE(nullptr, mkdtemp(tmpl));
  std::string dir = tmpl;
  std::string old = getenv("SOFTVERBS_DIR") ? getenv("SOFTVERBS_DIR") : "";
  setenv("SOFTVERBS_DIR", dir.c_str(), 1);
  std::string bin = daemon_path();
  pid_t d = fork();
  if (d == 0) {
    execl(bin.c_str(), "softverbsd", "--foreground", "--idle", "0", "--dir", dir.c_str(), nullptr);
    _exit(127);
  }
  // Use that daemon only: no other may be started on demand meanwhile.
  setenv("SOFTVERBS_NO_SPAWN", "1", 1);
  {
    Side me;
    ASSERT_EQ(0, me.open({}));  // connects to that daemon (the library retries while it binds)
    ibv_comp_channel* ch = ibv_create_comp_channel(me.ctx);
    ASSERT_NE(nullptr, ch);
    ibv_cq* cq = ibv_create_cq(me.ctx, 4, nullptr, ch, 0);
    ASSERT_NE(nullptr, cq);
    ASSERT_EQ(0, ibv_req_notify_cq(cq, 0));
    kill(d, SIGKILL);
    int st;
    waitpid(d, &st, 0);
    ibv_async_event ev{};
    ASSERT_TRUE(wait_async(me.ctx, &ev, 30000));
    EXPECT_EQ(IBV_EVENT_DEVICE_FATAL, ev.event_type);
    ibv_ack_async_event(&ev);
    // A thread asleep in ibv_get_cq_event would wake up with an error; so do we.
    ibv_cq* got;
    void* ctx;
    EXPECT_EQ(-1, ibv_get_cq_event(ch, &got, &ctx));
    EXPECT_EQ(EIO, errno);
    // Verbs fail rather than hang.
    errno = 0;
    EXPECT_EQ(nullptr, ibv_alloc_pd(me.ctx));
    EXPECT_NE(0, errno);
    ibv_sge sge{reinterpret_cast<uint64_t>(me.buf), 8, me.mr->lkey};
    ibv_recv_wr wr{};
    wr.sg_list = &sge;
    wr.num_sge = 1;
    ibv_recv_wr* bad;
    EXPECT_EQ(EIO, ibv_post_recv(me.qp, &wr, &bad));
    // Tearing down without a daemon succeeds and frees our side (as rdma-core
    // allows destroys after a device disassociation).
    EXPECT_EQ(0, ibv_destroy_cq(cq));
    EXPECT_EQ(0, ibv_destroy_comp_channel(ch));
  }  // Side::close destroys the QP, CQ, MR and PD: all must succeed without a daemon
  // A new daemon starts on demand in the same directory: the stale socket
  // and lock do not block it.
  unsetenv("SOFTVERBS_NO_SPAWN");
  {
    Side again;
    EXPECT_EQ(0, again.open({}));
  }
  if (old.empty()) unsetenv("SOFTVERBS_DIR");
  else setenv("SOFTVERBS_DIR", old.c_str(), 1);
}

}  // namespace
}  // namespace svtest
