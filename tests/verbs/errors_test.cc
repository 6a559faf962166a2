// Error cases of the verbs, as rdma-core documents them and the kernel
// returns them: EINVAL for a bad attribute, EINVAL (or ENOMEM) for a request
// beyond what ibv_query_device reports, and no object created on failure.
// Each case also checks that the valid neighbour of the bad request works, so
// that a verb refusing everything cannot pass.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <poll.h>
#include <signal.h>
#include <sys/time.h>
#include <fcntl.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "harness.h"

namespace svtest {
namespace {

class Errors : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(0, s.open({}));
    ASSERT_EQ(0, ibv_query_device(s.ctx, &dev));
  }
  ibv_qp_init_attr qp_attr(ibv_qp_type t = IBV_QPT_RC) const {
    ibv_qp_init_attr ia{};
    ia.send_cq = s.cq;
    ia.recv_cq = s.cq;
    ia.qp_type = t;
    ia.cap.max_send_wr = 4;
    ia.cap.max_recv_wr = 4;
    ia.cap.max_send_sge = 1;
    ia.cap.max_recv_sge = 1;
    return ia;
  }
  // ibv_create_qp with `ia`: nullptr and errno, or the QP (destroyed at once).
  int create_qp_errno(ibv_qp_init_attr ia) {
    errno = 0;
    ibv_qp* qp = ibv_create_qp(s.pd, &ia);
    if (!qp) return errno;
    EXPECT_EQ(0, ibv_destroy_qp(qp));
    return 0;
  }
  Side s;
  ibv_device_attr dev{};
};

// --- device and port queries ------------------------------------------------

TEST_F(Errors, QueriesOfAPortOrIndexThatDoesNotExist) {
  ibv_port_attr pa{};
  EXPECT_EQ(0, ibv_query_port(s.ctx, 1, &pa));
  EXPECT_EQ(EINVAL, ibv_query_port(s.ctx, 0, &pa));  // ports count from 1
  EXPECT_EQ(EINVAL, ibv_query_port(s.ctx, dev.phys_port_cnt + 1, &pa));

  ibv_gid gid{};
  EXPECT_EQ(0, ibv_query_gid(s.ctx, 1, 0, &gid));
  EXPECT_NE(0, ibv_query_gid(s.ctx, 2, 0, &gid));
  EXPECT_NE(0, ibv_query_gid(s.ctx, 1, pa.gid_tbl_len, &gid));
  EXPECT_NE(0, ibv_query_gid(s.ctx, 1, -1, &gid));

  __be16 pkey = 0;
  EXPECT_EQ(0, ibv_query_pkey(s.ctx, 1, 0, &pkey));
  EXPECT_NE(0, ibv_query_pkey(s.ctx, 1, dev.max_pkeys, &pkey));  // one P_Key: index 0
  EXPECT_NE(0, ibv_query_pkey(s.ctx, 2, 0, &pkey));
}

TEST_F(Errors, NothingPendingOnTheAsyncFdIsEagainWhenNonBlocking) {
  int fl = fcntl(s.ctx->async_fd, F_GETFL);
  ASSERT_GE(fl, 0);
  ASSERT_EQ(0, fcntl(s.ctx->async_fd, F_SETFL, fl | O_NONBLOCK));
  ibv_async_event ev{};
  errno = 0;
  EXPECT_EQ(-1, ibv_get_async_event(s.ctx, &ev));
  EXPECT_EQ(EAGAIN, errno);
  pollfd p{s.ctx->async_fd, POLLIN, 0};
  EXPECT_EQ(0, poll(&p, 1, 0));
}

// --- memory registration ----------------------------------------------------

TEST_F(Errors, RegMrBeyondMaxMrSizeOrWithUnknownAccessIsRefused) {
  std::vector<uint8_t> b(4096);
  errno = 0;
  // A length beyond max_mr_size is refused before any memory is looked at.
  EXPECT_EQ(nullptr, ibv_reg_mr(s.pd, b.data(), dev.max_mr_size + 1, IBV_ACCESS_LOCAL_WRITE));
  EXPECT_TRUE(errno == EINVAL || errno == ENOMEM) << errno;
  // An access bit that no verbs version defines (bits 20..28 are the
  // "optional" range a device may ignore, ibv_reg_mr(3); this is below it).
  errno = 0;
  EXPECT_EQ(nullptr, ibv_reg_mr(s.pd, b.data(), b.size(), IBV_ACCESS_LOCAL_WRITE | (1 << 15)));
  EXPECT_EQ(EINVAL, errno);
  // Memory that cannot be reached: a page reserved with PROT_NONE (the
  // kernel would fail to pin it). An unmapped page is no good here: another
  // thread (a sanitizer's, the library's) may map that address meanwhile.
  void* gone = mmap(nullptr, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(MAP_FAILED, gone);
  errno = 0;
  EXPECT_EQ(nullptr, ibv_reg_mr(s.pd, gone, 4096, IBV_ACCESS_LOCAL_WRITE));
  EXPECT_NE(0, errno);
  ASSERT_EQ(0, munmap(gone, 4096));
  ibv_mr* mr = ibv_reg_mr(s.pd, b.data(), b.size(), IBV_ACCESS_LOCAL_WRITE);
  ASSERT_NE(nullptr, mr);
  EXPECT_EQ(0, ibv_dereg_mr(mr));
}

TEST_F(Errors, ReregMrWithBadFlagsChangesNothing) {
  std::vector<uint8_t> b(8192);
  ibv_mr* mr = ibv_reg_mr(s.pd, b.data(), b.size(), IBV_ACCESS_LOCAL_WRITE);
  ASSERT_NE(nullptr, mr);
  const uint32_t lkey = mr->lkey;
  // No change requested, or a flag outside IBV_REREG_MR_FLAGS_SUPPORTED.
  EXPECT_NE(0, ibv_rereg_mr(mr, 0, nullptr, nullptr, 0, 0));
  EXPECT_NE(0, ibv_rereg_mr(mr, 1 << 10, nullptr, nullptr, 0, 0));
  // Remote write without local write (IBTA 10.6.3.1 / C10-18) is refused too.
  EXPECT_NE(0, ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_ACCESS, nullptr, nullptr, 0, IBV_ACCESS_REMOTE_WRITE));
  EXPECT_EQ(lkey, mr->lkey);
  // The MR still works: a valid rereg succeeds.
  EXPECT_EQ(0, ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_ACCESS, nullptr, nullptr, 0,
                            IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ));
  EXPECT_EQ(0, ibv_dereg_mr(mr));
}

TEST_F(Errors, AllocMwOfAnUnknownTypeIsRefused) {
  errno = 0;
  EXPECT_EQ(nullptr, ibv_alloc_mw(s.pd, ibv_mw_type(7)));
  EXPECT_EQ(EINVAL, errno);
  ibv_mw* mw = ibv_alloc_mw(s.pd, IBV_MW_TYPE_1);
  ASSERT_NE(nullptr, mw);
  EXPECT_EQ(0, ibv_dealloc_mw(mw));
}

// --- completion queues and channels -----------------------------------------

TEST_F(Errors, CreateCqChecksCqeAndCompletionVector) {
  errno = 0;
  EXPECT_EQ(nullptr, ibv_create_cq(s.ctx, 0, nullptr, nullptr, 0));  // at least one entry
  EXPECT_EQ(EINVAL, errno);
  errno = 0;
  EXPECT_EQ(nullptr, ibv_create_cq(s.ctx, -1, nullptr, nullptr, 0));
  EXPECT_EQ(EINVAL, errno);
  errno = 0;
  EXPECT_EQ(nullptr, ibv_create_cq(s.ctx, dev.max_cqe + 1, nullptr, nullptr, 0));
  EXPECT_EQ(EINVAL, errno);
  errno = 0;
  EXPECT_EQ(nullptr, ibv_create_cq(s.ctx, 4, nullptr, nullptr, s.ctx->num_comp_vectors));
  EXPECT_EQ(EINVAL, errno);
  // The largest CQ the device reports is granted, with at least that many entries.
  ibv_cq* cq = ibv_create_cq(s.ctx, dev.max_cqe, nullptr, nullptr, s.ctx->num_comp_vectors - 1);
  ASSERT_NE(nullptr, cq);
  EXPECT_GE(cq->cqe, dev.max_cqe);
  EXPECT_EQ(0, ibv_destroy_cq(cq));
}

TEST_F(Errors, DestroyingACqAQpUsesIsBusy) {
  EXPECT_EQ(EBUSY, ibv_destroy_cq(s.cq));
  // And the CQ still works.
  ibv_wc wc{};
  EXPECT_EQ(0, ibv_poll_cq(s.cq, 1, &wc));
}

TEST_F(Errors, GetCqEventWithNothingPendingIsEagainWhenNonBlocking) {
  ibv_comp_channel* ch = ibv_create_comp_channel(s.ctx);
  ASSERT_NE(nullptr, ch);
  ibv_cq* cq = ibv_create_cq(s.ctx, 4, nullptr, ch, 0);
  ASSERT_NE(nullptr, cq);
  ASSERT_EQ(0, ibv_req_notify_cq(cq, 0));
  int fl = fcntl(ch->fd, F_GETFL);
  ASSERT_EQ(0, fcntl(ch->fd, F_SETFL, fl | O_NONBLOCK));
  ibv_cq* ev_cq = nullptr;
  void* ev_ctx = nullptr;
  errno = 0;
  EXPECT_EQ(-1, ibv_get_cq_event(ch, &ev_cq, &ev_ctx));
  EXPECT_EQ(EAGAIN, errno);
  // A channel with a CQ on it cannot go first.
  EXPECT_EQ(EBUSY, ibv_destroy_comp_channel(ch));
  EXPECT_EQ(0, ibv_destroy_cq(cq));
  EXPECT_EQ(0, ibv_destroy_comp_channel(ch));
}

// A signal whose handler does not ask for restarts (no SA_RESTART) ends a
// blocking wait for a completion event with -1/EINTR, as rdma-core's
// ibv_get_cq_event(3) does (a plain read(2) of the channel's fd). qperf's
// timed tests end their loop from a SIGALRM handler this way; a wait that
// retried the read would hang them.
TEST_F(Errors, GetCqEventInterruptedBySignalIsEintr) {
  ibv_comp_channel* ch = ibv_create_comp_channel(s.ctx);
  ASSERT_NE(nullptr, ch);
  ibv_cq* cq = ibv_create_cq(s.ctx, 4, nullptr, ch, 0);
  ASSERT_NE(nullptr, cq);
  ASSERT_EQ(0, ibv_req_notify_cq(cq, 0));
  struct sigaction sa {}, old {};
  sa.sa_handler = [](int) {};
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;  // no SA_RESTART
  ASSERT_EQ(0, sigaction(SIGALRM, &sa, &old));
  // Repeating, so that one lands while the wait is blocked in the kernel
  // whatever the spin before it takes.
  itimerval it{{0, 20000}, {0, 20000}};
  ASSERT_EQ(0, setitimer(ITIMER_REAL, &it, nullptr));
  ibv_cq* ev_cq = nullptr;
  void* ev_ctx = nullptr;
  errno = 0;
  int r = ibv_get_cq_event(ch, &ev_cq, &ev_ctx);
  int e = errno;
  itimerval off{};
  setitimer(ITIMER_REAL, &off, nullptr);
  sigaction(SIGALRM, &old, nullptr);
  EXPECT_EQ(-1, r);
  EXPECT_EQ(EINTR, e);
  EXPECT_EQ(0, ibv_destroy_cq(cq));
  EXPECT_EQ(0, ibv_destroy_comp_channel(ch));
}

// One signal that arrives while ibv_get_cq_event still spins for the event,
// before it sleeps, must end the wait as well, as it would have interrupted
// rdma-core's read(2): it was taken during the spin, its handler ran there,
// and the read after the spin slept on (a program bounding its wait with one
// alarm(2) waited forever; qperf escapes only because its timer, once run
// out, fires again every 10 ms). The spin is made long
// (SOFTVERBS_SPIN_US, read once per process: ctest runs each test in its
// own) so that the signal lands in it; a second signal 2 s later rescues a
// wait that missed the first. `to_process`: sent to the process (kill(2)),
// as SIGALRM is, which the kernel may hand to any thread that does not block
// it: the library's own threads must (the context's watchdog is one).
static void wait_through_a_signal_in_the_spin(ibv_context* ctx, bool to_process) {
  setenv("SOFTVERBS_SPIN_US", "100000", 1);
  ibv_comp_channel* ch = ibv_create_comp_channel(ctx);
  ASSERT_NE(nullptr, ch);
  ibv_cq* cq = ibv_create_cq(ctx, 4, nullptr, ch, 0);
  ASSERT_NE(nullptr, cq);
  ASSERT_EQ(0, ibv_req_notify_cq(cq, 0));
  static std::atomic<int> handled{0};
  handled = 0;
  struct sigaction sa {}, old {};
  sa.sa_handler = [](int) { handled.fetch_add(1); };
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;  // no SA_RESTART: a read(2) it interrupts fails with EINTR
  ASSERT_EQ(0, sigaction(SIGUSR1, &sa, &old));
  std::atomic<bool> done{false};
  pthread_t waiter = pthread_self();
  std::thread kicker([&] {
    sigset_t usr1;
    sigemptyset(&usr1);
    sigaddset(&usr1, SIGUSR1);
    pthread_sigmask(SIG_BLOCK, &usr1, nullptr);  // never this thread's
    auto kick = [&] { to_process ? kill(getpid(), SIGUSR1) : pthread_kill(waiter, SIGUSR1); };
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    kick();
    for (int i = 0; i < 200 && !done; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    if (!done) pthread_kill(waiter, SIGUSR1);  // the rescue
  });
  ibv_cq* ev_cq = nullptr;
  void* ev_ctx = nullptr;
  errno = 0;
  int r = ibv_get_cq_event(ch, &ev_cq, &ev_ctx);
  int e = errno;
  int seen = handled.load();
  done = true;
  kicker.join();
  sigaction(SIGUSR1, &old, nullptr);
  unsetenv("SOFTVERBS_SPIN_US");
  EXPECT_EQ(-1, r);
  EXPECT_EQ(EINTR, e);
  EXPECT_EQ(1, seen) << "the wait outlived the signal that arrived during its spin";
  EXPECT_EQ(0, ibv_destroy_cq(cq));
  EXPECT_EQ(0, ibv_destroy_comp_channel(ch));
}

TEST_F(Errors, GetCqEventEndsOnASignalThatArrivedDuringItsSpin) {
  wait_through_a_signal_in_the_spin(s.ctx, false);
}

TEST_F(Errors, GetCqEventEndsOnAProcessSignalThatArrivedDuringItsSpin) {
  wait_through_a_signal_in_the_spin(s.ctx, true);
}

// A signal whose handler was installed with SA_RESTART restarts a read(2)
// (signal(7)): one that arrives during the spin does not end the wait, which
// goes on and returns the event that comes after it.
TEST_F(Errors, GetCqEventGoesOnAfterASaRestartSignalDuringItsSpin) {
  setenv("SOFTVERBS_SPIN_US", "100000", 1);
  ibv_comp_channel* ch = ibv_create_comp_channel(s.ctx);
  ASSERT_NE(nullptr, ch);
  ibv_cq* cq = ibv_create_cq(s.ctx, 4, nullptr, ch, 0);
  ASSERT_NE(nullptr, cq);
  ASSERT_EQ(0, ibv_req_notify_cq(cq, 0));
  static std::atomic<int> handled{0};
  handled = 0;
  struct sigaction sa {}, old {};
  sa.sa_handler = [](int) { handled.fetch_add(1); };
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  ASSERT_EQ(0, sigaction(SIGUSR1, &sa, &old));
  pthread_t waiter = pthread_self();
  // The event: the completion of an RDMA WRITE by a QP connected to itself,
  // posted after the signal, on the CQ.
  ibv_qp_init_attr ia = qp_attr();
  ia.send_cq = ia.recv_cq = cq;
  ibv_qp* qp = ibv_create_qp(s.pd, &ia);
  ASSERT_NE(nullptr, qp);
  ASSERT_EQ(0, connect_qp(qp, qp->qp_num));
  int posted = -1;
  std::thread kicker([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    pthread_kill(waiter, SIGUSR1);
    std::this_thread::sleep_for(std::chrono::milliseconds(150));
    ibv_sge sge{reinterpret_cast<uintptr_t>(s.buf), 64, s.mr->lkey};
    ibv_send_wr wr{}, *bad = nullptr;
    wr.opcode = IBV_WR_RDMA_WRITE;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.wr.rdma.remote_addr = reinterpret_cast<uintptr_t>(s.buf) + 4096;
    wr.wr.rdma.rkey = s.mr->rkey;
    posted = ibv_post_send(qp, &wr, &bad);
  });
  ibv_cq* ev_cq = nullptr;
  void* ev_ctx = nullptr;
  int r = ibv_get_cq_event(ch, &ev_cq, &ev_ctx);
  kicker.join();
  sigaction(SIGUSR1, &old, nullptr);
  unsetenv("SOFTVERBS_SPIN_US");
  EXPECT_EQ(0, r);
  EXPECT_EQ(cq, ev_cq);
  EXPECT_EQ(0, posted);
  EXPECT_EQ(1, handled.load());
  if (r == 0) ibv_ack_cq_events(cq, 1);
  EXPECT_EQ(1u, poll(cq, 1).size());
  EXPECT_EQ(0, ibv_destroy_qp(qp));
  EXPECT_EQ(0, ibv_destroy_cq(cq));
  EXPECT_EQ(0, ibv_destroy_comp_channel(ch));
}

// --- queue pairs ----------------------------------------------------------------

TEST_F(Errors, CreateQpBeyondTheDeviceCapsIsEinval) {
  EXPECT_EQ(0, create_qp_errno(qp_attr()));

  auto ia = qp_attr();
  ia.cap.max_recv_wr = uint32_t(dev.max_qp_wr) + 1;
  EXPECT_EQ(EINVAL, create_qp_errno(ia));
  ia = qp_attr();
  ia.cap.max_recv_sge = uint32_t(dev.max_sge) + 1;
  EXPECT_EQ(EINVAL, create_qp_errno(ia));
  // The limits themselves are granted.
  ia = qp_attr();
  ia.cap.max_send_wr = ia.cap.max_recv_wr = uint32_t(dev.max_qp_wr);
  ia.cap.max_send_sge = ia.cap.max_recv_sge = uint32_t(dev.max_sge);
  EXPECT_EQ(0, create_qp_errno(ia));
}

TEST_F(Errors, CreateQpWithoutCqsOrOfAnUnknownTypeIsRefused) {
  auto ia = qp_attr();
  ia.send_cq = nullptr;
  EXPECT_EQ(EINVAL, create_qp_errno(ia));
  ia = qp_attr();
  ia.recv_cq = nullptr;
  EXPECT_EQ(EINVAL, create_qp_errno(ia));
  ia = qp_attr(ibv_qp_type(77));
  EXPECT_NE(0, create_qp_errno(ia));
  // A raw packet QP needs a NIC; this device has none.
  ia = qp_attr(IBV_QPT_RAW_PACKET);
  EXPECT_NE(0, create_qp_errno(ia));
}

TEST_F(Errors, CreateQpWithMoreInlineDataThanTheDeviceHasIsEinval) {
  auto ia = qp_attr();
  ia.cap.max_inline_data = 64;
  ibv_qp* qp = ibv_create_qp(s.pd, &ia);
  ASSERT_NE(nullptr, qp);
  EXPECT_GE(ia.cap.max_inline_data, 64u);  // the granted size is written back
  const uint32_t granted = ia.cap.max_inline_data;
  EXPECT_EQ(0, ibv_destroy_qp(qp));
  ia = qp_attr();
  ia.cap.max_inline_data = granted + (1u << 20);
  EXPECT_EQ(EINVAL, create_qp_errno(ia));
}

TEST_F(Errors, CreateQpExNeedsAPdAndRefusesFeaturesItLacks) {
  ibv_qp_init_attr_ex ix{};
  ix.send_cq = s.cq;
  ix.recv_cq = s.cq;
  ix.qp_type = IBV_QPT_RC;
  ix.cap = {4, 4, 1, 1, 0};
  ix.pd = s.pd;
  auto create = [&](const ibv_qp_init_attr_ex& a) {
    ibv_qp_init_attr_ex c = a;
    errno = 0;
    ibv_qp* qp = ibv_create_qp_ex(s.ctx, &c);
    if (!qp) return errno;
    EXPECT_EQ(0, ibv_destroy_qp(qp));
    return 0;
  };
  ix.comp_mask = 0;  // an RC QP without IBV_QP_INIT_ATTR_PD has no PD
  EXPECT_EQ(EINVAL, create(ix));
  // Creation flags (scatter FCS, CVLAN stripping...) belong to raw packet
  // QPs on a NIC; RSS (rx_hash) needs one too.
  ix.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_CREATE_FLAGS;
  ix.create_flags = IBV_QP_CREATE_SCATTER_FCS;
  EXPECT_NE(0, create(ix));
  ix.create_flags = 0;
  ix.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_RX_HASH;
  EXPECT_NE(0, create(ix));
  ix.comp_mask = IBV_QP_INIT_ATTR_PD;
  EXPECT_EQ(0, create(ix));
}

TEST_F(Errors, ModifyQpAttributesOutOfRange) {
  // RESET -> INIT with a P_Key index past the table (max_pkeys entries).
  {
    auto ia = qp_attr();
    ibv_qp* qp = ibv_create_qp(s.pd, &ia);
    ASSERT_NE(nullptr, qp);
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.port_num = 1;
    a.pkey_index = uint16_t(dev.max_pkeys);
    const int mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
    EXPECT_EQ(EINVAL, ibv_modify_qp(qp, &a, mask));
    a.pkey_index = 0;
    EXPECT_EQ(0, ibv_modify_qp(qp, &a, mask));
    EXPECT_EQ(0, ibv_destroy_qp(qp));
  }
  // INIT -> RTR (s.qp is in INIT): responder resources beyond
  // max_qp_rd_atom, a GID index past the table, an MTU that is no MTU.
  ibv_port_attr pa{};
  ASSERT_EQ(0, ibv_query_port(s.ctx, 1, &pa));
  auto rtr = [&](void (*tweak)(ibv_qp_attr&, const ibv_device_attr&, const ibv_port_attr&)) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = IBV_MTU_1024;
    a.dest_qp_num = s.qp->qp_num;
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 1;
    a.ah_attr.port_num = 1;
    a.ah_attr.is_global = 1;
    a.ah_attr.grh.sgid_index = 0;
    a.ah_attr.grh.hop_limit = 1;
    a.ah_attr.grh.dgid.raw[10] = 0xff;
    a.ah_attr.grh.dgid.raw[11] = 0xff;
    a.ah_attr.grh.dgid.raw[12] = 127;
    a.ah_attr.grh.dgid.raw[15] = 1;
    if (tweak) tweak(a, dev, pa);
    return ibv_modify_qp(s.qp, &a,
                         IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                             IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
  };
  EXPECT_EQ(EINVAL, rtr([](ibv_qp_attr& a, const ibv_device_attr& d, const ibv_port_attr&) {
              a.max_dest_rd_atomic = uint8_t(d.max_qp_rd_atom + 1);
            }));
  EXPECT_EQ(EINVAL, rtr([](ibv_qp_attr& a, const ibv_device_attr&, const ibv_port_attr& p) {
              a.ah_attr.grh.sgid_index = uint8_t(p.gid_tbl_len);
            }));
  EXPECT_EQ(EINVAL, rtr([](ibv_qp_attr& a, const ibv_device_attr&, const ibv_port_attr&) {
              a.path_mtu = ibv_mtu(6);  // IBTA 9.6.1.1: 1..5 are the MTUs
            }));
  EXPECT_EQ(EINVAL, rtr([](ibv_qp_attr& a, const ibv_device_attr&, const ibv_port_attr&) {
              a.min_rnr_timer = 32;  // 5 bits (IBTA 9.7.5.2.8)
            }));
  EXPECT_EQ(0, rtr(nullptr));
  // RTR -> RTS: initiator depth beyond max_qp_init_rd_atom, a 5-bit timeout
  // out of range, a 3-bit RNR retry count out of range.
  auto rts = [&](void (*tweak)(ibv_qp_attr&, const ibv_device_attr&)) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RTS;
    a.timeout = 14;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.max_rd_atomic = 1;
    if (tweak) tweak(a, dev);
    return ibv_modify_qp(s.qp, &a,
                         IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                             IBV_QP_MAX_QP_RD_ATOMIC);
  };
  EXPECT_EQ(EINVAL, rts([](ibv_qp_attr& a, const ibv_device_attr& d) {
              a.max_rd_atomic = uint8_t(d.max_qp_init_rd_atom + 1);
            }));
  EXPECT_EQ(EINVAL, rts([](ibv_qp_attr& a, const ibv_device_attr&) { a.timeout = 32; }));
  EXPECT_EQ(EINVAL, rts([](ibv_qp_attr& a, const ibv_device_attr&) { a.rnr_retry = 8; }));
  EXPECT_EQ(0, rts(nullptr));
}

TEST_F(Errors, ModifyQpWithAttributesTheTransitionDoesNotTake) {
  // IBTA 11.2.4.2 (table 91): RESET -> INIT of a UD QP takes a Q_Key, not
  // access flags; an RC QP takes access flags, not a Q_Key. An attribute the
  // transition does not list is an error, and the state stays RESET.
  auto ia = qp_attr(IBV_QPT_UD);
  ibv_qp* ud = ibv_create_qp(s.pd, &ia);
  ASSERT_NE(nullptr, ud);
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.port_num = 1;
  a.qkey = 0x11;
  a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
  EXPECT_EQ(EINVAL, ibv_modify_qp(ud, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY |
                                              IBV_QP_ACCESS_FLAGS));
  // A required attribute missing (the Q_Key) is an error too.
  EXPECT_EQ(EINVAL, ibv_modify_qp(ud, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT));
  ibv_qp_attr q{};
  ibv_qp_init_attr qi{};
  ASSERT_EQ(0, ibv_query_qp(ud, &q, IBV_QP_STATE, &qi));
  EXPECT_EQ(IBV_QPS_RESET, q.qp_state);
  EXPECT_EQ(0, ibv_modify_qp(ud, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY));
  EXPECT_EQ(0, ibv_destroy_qp(ud));

  ia = qp_attr(IBV_QPT_RC);
  ibv_qp* rc = ibv_create_qp(s.pd, &ia);
  ASSERT_NE(nullptr, rc);
  EXPECT_EQ(EINVAL, ibv_modify_qp(rc, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
                                              IBV_QP_ACCESS_FLAGS | IBV_QP_QKEY));
  EXPECT_EQ(0, ibv_modify_qp(rc, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS));
  EXPECT_EQ(0, ibv_destroy_qp(rc));
}

TEST_F(Errors, PostRecvWithMoreSgesThanTheQpHasIsEinvalAndNamesTheWr) {
  auto ia = qp_attr();
  ia.cap.max_recv_sge = 2;
  ibv_qp* qp = ibv_create_qp(s.pd, &ia);
  ASSERT_NE(nullptr, qp);
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.port_num = 1;
  ASSERT_EQ(0, ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS));
  std::vector<ibv_sge> sges(ia.cap.max_recv_sge + 1);
  for (auto& g : sges) g = {reinterpret_cast<uint64_t>(s.buf), 8, s.mr->lkey};
  ibv_recv_wr ok{}, bad_wr{};
  ok.wr_id = 1;
  ok.sg_list = sges.data();
  ok.num_sge = 1;
  ok.next = &bad_wr;
  bad_wr.wr_id = 2;
  bad_wr.sg_list = sges.data();
  bad_wr.num_sge = int(sges.size());
  ibv_recv_wr* bad = nullptr;
  EXPECT_EQ(EINVAL, ibv_post_recv(qp, &ok, &bad));
  EXPECT_EQ(&bad_wr, bad);
  // More receives than max_recv_wr: ENOMEM at the first that does not fit.
  std::vector<ibv_recv_wr> many(ia.cap.max_recv_wr + 1);
  for (size_t i = 0; i < many.size(); ++i) {
    many[i].wr_id = 100 + i;
    many[i].sg_list = sges.data();
    many[i].num_sge = 1;
    many[i].next = i + 1 < many.size() ? &many[i + 1] : nullptr;
  }
  bad = nullptr;
  // The first, valid WR above was posted; room is max_recv_wr - 1 more.
  EXPECT_EQ(ENOMEM, ibv_post_recv(qp, many.data(), &bad));
  ASSERT_NE(nullptr, bad);
  EXPECT_EQ(100u + ia.cap.max_recv_wr - 1, bad->wr_id);
  EXPECT_EQ(0, ibv_destroy_qp(qp));
}

// --- shared receive queues -----------------------------------------------------

TEST_F(Errors, CreateSrqBeyondTheDeviceCapsOrWithALimitAboveItsSizeIsEinval) {
  auto srq_errno = [&](uint32_t wr, uint32_t sge, uint32_t limit) {
    ibv_srq_init_attr sa{};
    sa.attr.max_wr = wr;
    sa.attr.max_sge = sge;
    sa.attr.srq_limit = limit;
    errno = 0;
    ibv_srq* srq = ibv_create_srq(s.pd, &sa);
    if (!srq) return errno;
    EXPECT_EQ(0, ibv_destroy_srq(srq));
    return 0;
  };
  EXPECT_EQ(0, srq_errno(uint32_t(dev.max_srq_wr), uint32_t(dev.max_srq_sge), 0));
  EXPECT_EQ(EINVAL, srq_errno(uint32_t(dev.max_srq_wr) + 1, 1, 0));
  EXPECT_EQ(EINVAL, srq_errno(16, uint32_t(dev.max_srq_sge) + 1, 0));
  EXPECT_EQ(EINVAL, srq_errno(0, 1, 0));
}

TEST_F(Errors, ModifySrqLimitAboveItsSizeIsEinval) {
  ibv_srq_init_attr sa{};
  sa.attr.max_wr = 16;
  sa.attr.max_sge = 1;
  ibv_srq* srq = ibv_create_srq(s.pd, &sa);
  ASSERT_NE(nullptr, srq);
  ibv_srq_attr q{};
  ASSERT_EQ(0, ibv_query_srq(srq, &q));
  ibv_srq_attr m{};
  m.srq_limit = q.max_wr + 1;
  EXPECT_EQ(EINVAL, ibv_modify_srq(srq, &m, IBV_SRQ_LIMIT));
  m.srq_limit = 4;
  EXPECT_EQ(0, ibv_modify_srq(srq, &m, IBV_SRQ_LIMIT));
  ASSERT_EQ(0, ibv_query_srq(srq, &q));
  EXPECT_EQ(4u, q.srq_limit);
  // The device resizes SRQs (IBV_DEVICE_SRQ_RESIZE); not below the armed
  // limit, nor to 0; the limit stays armed.
  EXPECT_TRUE(dev.device_cap_flags & IBV_DEVICE_SRQ_RESIZE);
  m.max_wr = 2;
  EXPECT_EQ(EINVAL, ibv_modify_srq(srq, &m, IBV_SRQ_MAX_WR));
  m.max_wr = 0;
  EXPECT_EQ(EINVAL, ibv_modify_srq(srq, &m, IBV_SRQ_MAX_WR));
  m.max_wr = 64;
  EXPECT_EQ(0, ibv_modify_srq(srq, &m, IBV_SRQ_MAX_WR));
  ASSERT_EQ(0, ibv_query_srq(srq, &q));
  EXPECT_GE(q.max_wr, 64u);
  EXPECT_EQ(4u, q.srq_limit);
  EXPECT_EQ(0, ibv_destroy_srq(srq));
}

TEST_F(Errors, PostSrqRecvWithTooManySgesIsEinvalAndNamesTheWr) {
  ibv_srq_init_attr sa{};
  sa.attr.max_wr = 4;
  sa.attr.max_sge = 1;
  ibv_srq* srq = ibv_create_srq(s.pd, &sa);
  ASSERT_NE(nullptr, srq);
  ibv_sge sg[2] = {{reinterpret_cast<uint64_t>(s.buf), 8, s.mr->lkey},
                   {reinterpret_cast<uint64_t>(s.buf) + 8, 8, s.mr->lkey}};
  ibv_recv_wr wr{};
  wr.sg_list = sg;
  wr.num_sge = 2;
  ibv_recv_wr* bad = nullptr;
  EXPECT_EQ(EINVAL, ibv_post_srq_recv(srq, &wr, &bad));
  EXPECT_EQ(&wr, bad);
  wr.num_sge = 1;
  EXPECT_EQ(0, ibv_post_srq_recv(srq, &wr, &bad));
  EXPECT_EQ(0, ibv_destroy_srq(srq));
}

// --- address handles --------------------------------------------------------------

TEST_F(Errors, CreateAhNeedsAGidAndAPortThatExist) {
  ibv_port_attr pa{};
  ASSERT_EQ(0, ibv_query_port(s.ctx, 1, &pa));
  ibv_ah_attr a{};
  a.port_num = 1;
  a.is_global = 1;
  a.grh.sgid_index = 0;
  a.grh.hop_limit = 1;
  a.grh.dgid.raw[10] = 0xff;
  a.grh.dgid.raw[11] = 0xff;
  a.grh.dgid.raw[12] = 127;
  a.grh.dgid.raw[15] = 1;
  ibv_ah* ah = ibv_create_ah(s.pd, &a);
  ASSERT_NE(nullptr, ah);
  EXPECT_EQ(0, ibv_destroy_ah(ah));
  // Without a GRH: refused, the port is RoCE (as the kernel's RoCE devices).
  ibv_ah_attr b = a;
  b.is_global = 0;
  errno = 0;
  EXPECT_EQ(nullptr, ibv_create_ah(s.pd, &b));
  EXPECT_EQ(EINVAL, errno);
  b = a;
  b.grh.sgid_index = uint8_t(pa.gid_tbl_len);
  errno = 0;
  EXPECT_EQ(nullptr, ibv_create_ah(s.pd, &b));
  EXPECT_EQ(EINVAL, errno);
  b = a;
  b.port_num = 2;
  errno = 0;
  EXPECT_EQ(nullptr, ibv_create_ah(s.pd, &b));
  EXPECT_EQ(EINVAL, errno);
}

// ibv_query_device's max_ah is what a context may hold: one more is ENOMEM,
// and a destroyed one makes room again.
TEST_F(Errors, AddressHandlesBeyondMaxAhAreEnomem) {
  ibv_device_attr da{};
  ASSERT_EQ(0, ibv_query_device(s.ctx, &da));
  ASSERT_GT(da.max_ah, 0);
  ibv_ah_attr a{};
  a.port_num = 1;
  a.is_global = 1;
  a.grh.hop_limit = 1;
  a.grh.dgid.raw[10] = a.grh.dgid.raw[11] = 0xff;
  a.grh.dgid.raw[12] = 127;
  a.grh.dgid.raw[15] = 1;
  std::vector<ibv_ah*> ahs;
  for (int i = 0; i < da.max_ah; ++i) {
    ibv_ah* ah = ibv_create_ah(s.pd, &a);
    ASSERT_NE(nullptr, ah) << "AH " << i << " of max_ah " << da.max_ah << ": " << strerror(errno);
    ahs.push_back(ah);
  }
  errno = 0;
  EXPECT_EQ(nullptr, ibv_create_ah(s.pd, &a));
  EXPECT_EQ(ENOMEM, errno);
  EXPECT_EQ(0, ibv_destroy_ah(ahs.back()));
  ahs.back() = ibv_create_ah(s.pd, &a);
  EXPECT_NE(nullptr, ahs.back());
  for (ibv_ah* ah : ahs) {
    if (ah) {
      EXPECT_EQ(0, ibv_destroy_ah(ah));
    }
  }
}

// --- posting send requests --------------------------------------------------------

// ibv_post_send(3): a WR the QP cannot take is refused with EINVAL (ENOMEM
// for a full send queue), bad_wr names it, and the WRs before it are posted.
class PostSendErrors : public ::testing::Test {
 protected:
  void SetUp() override {
    opts.max_wr = 4;
    ASSERT_EQ(0, connect_pair(me, peer, info, opts, opts));
  }
  // Posts `good` (a signaled 8-byte RDMA WRITE) followed by `wr`; returns the
  // error and checks that bad_wr is `wr` and that `good` completed.
  int post_after_good(ibv_send_wr& wr) {
    ibv_sge sge{reinterpret_cast<uint64_t>(me.buf), 8, me.mr->lkey};
    ibv_send_wr good{};
    good.wr_id = 1;
    good.opcode = IBV_WR_RDMA_WRITE;
    good.sg_list = &sge;
    good.num_sge = 1;
    good.send_flags = IBV_SEND_SIGNALED;
    good.wr.rdma.remote_addr = info.addr;
    good.wr.rdma.rkey = info.rkey;
    good.next = &wr;
    ibv_send_wr* bad = nullptr;
    int e = ibv_post_send(me.qp, &good, &bad);
    EXPECT_EQ(&wr, bad);
    auto wc = poll(me.cq, 1, 2000);
    EXPECT_EQ(1u, wc.size());
    if (!wc.empty()) {
      EXPECT_EQ(1u, wc[0].wr_id);
      EXPECT_EQ(IBV_WC_SUCCESS, wc[0].status);
    }
    return e;
  }
  ibv_send_wr write_wr(ibv_sge* sg, int n) const {
    ibv_send_wr wr{};
    wr.wr_id = 2;
    wr.opcode = IBV_WR_RDMA_WRITE;
    wr.sg_list = sg;
    wr.num_sge = n;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = info.addr;
    wr.wr.rdma.rkey = info.rkey;
    return wr;
  }
  Side::Options opts;
  Side me;
  Peer peer;
  PeerInfo info{};
};

TEST_F(PostSendErrors, MoreSgesThanTheQpHasIsEinval) {
  ibv_qp_attr qa{};
  ibv_qp_init_attr qi{};
  ASSERT_EQ(0, ibv_query_qp(me.qp, &qa, IBV_QP_CAP, &qi));
  std::vector<ibv_sge> sg(qi.cap.max_send_sge + 1, ibv_sge{reinterpret_cast<uint64_t>(me.buf), 8, me.mr->lkey});
  auto wr = write_wr(sg.data(), int(sg.size()));
  EXPECT_EQ(EINVAL, post_after_good(wr));
  wr.num_sge = -1;
  EXPECT_EQ(EINVAL, post_after_good(wr));
}

TEST_F(PostSendErrors, InlineDataBeyondMaxInlineIsEinval) {
  ibv_qp_attr qa{};
  ibv_qp_init_attr qi{};
  ASSERT_EQ(0, ibv_query_qp(me.qp, &qa, IBV_QP_CAP, &qi));
  ibv_sge sg{reinterpret_cast<uint64_t>(me.buf), qi.cap.max_inline_data + 1, 0};
  auto wr = write_wr(&sg, 1);
  wr.send_flags |= IBV_SEND_INLINE;
  EXPECT_EQ(EINVAL, post_after_good(wr));
}

TEST_F(PostSendErrors, AFullSendQueueIsEnomem) {
  ibv_qp_attr qa{};
  ibv_qp_init_attr qi{};
  ASSERT_EQ(0, ibv_query_qp(me.qp, &qa, IBV_QP_CAP, &qi));
  ibv_sge sge{reinterpret_cast<uint64_t>(me.buf), 8, me.mr->lkey};
  // A SEND with no receive posted waits in the send queue for RNR retries
  // (rnr_retry 7: for ever), holding its slot; so does everything behind it.
  std::vector<ibv_send_wr> wr(qi.cap.max_send_wr + 1);
  for (size_t i = 0; i < wr.size(); ++i) {
    wr[i].wr_id = 10 + i;
    wr[i].opcode = IBV_WR_SEND;
    wr[i].sg_list = &sge;
    wr[i].num_sge = 1;
    wr[i].send_flags = IBV_SEND_SIGNALED;
    wr[i].next = i + 1 < wr.size() ? &wr[i + 1] : nullptr;
  }
  ibv_send_wr* bad = nullptr;
  EXPECT_EQ(ENOMEM, ibv_post_send(me.qp, wr.data(), &bad));
  ASSERT_NE(nullptr, bad);
  EXPECT_EQ(10u + qi.cap.max_send_wr, bad->wr_id);
}

TEST_F(PostSendErrors, AtomicOnAMisalignedWordOrIntoAShortSgeIsNeverExecuted) {
  // IBTA 9.4.5: an atomic acts on one naturally aligned 8-byte word (else
  // the responder answers "invalid request"); the local SGE must hold the
  // 8-byte original value.
  auto atomic = [&](uint64_t remote, uint32_t local_len) {
    ibv_sge sg{reinterpret_cast<uint64_t>(me.buf), local_len, me.mr->lkey};
    ibv_send_wr wr{};
    wr.wr_id = 2;
    wr.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
    wr.sg_list = &sg;
    wr.num_sge = 1;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.atomic.remote_addr = remote;
    wr.wr.atomic.rkey = info.rkey;
    wr.wr.atomic.compare_add = 1;
    ibv_send_wr* bad = nullptr;
    // Either refused at post time or completed in error: never executed.
    int e = ibv_post_send(me.qp, &wr, &bad);
    if (e == 0) {
      auto wc = poll(me.cq, 1, 2000);
      ASSERT_EQ(1u, wc.size());
      EXPECT_NE(IBV_WC_SUCCESS, wc[0].status);
    } else {
      EXPECT_EQ(EINVAL, e);
      EXPECT_EQ(&wr, bad);
    }
  };
  atomic(info.addr + 8, 4);
  atomic(info.addr + 4, 8);
  const std::vector<uint8_t> zeros(64);
  EXPECT_EQ(checksum(zeros.data(), zeros.size()), peer.checksum(0, 64));  // untouched
}

TEST(PostSendErrorsUd, RdmaAndAtomicsOnUdOrASendWithoutAnAhAreEinval) {
  // IBTA 10.7.2 (table 93? "valid operations per service"): UD carries SEND
  // and SEND with immediate only; a UD SEND needs an address handle.
  Side me;
  Side::Options o;
  o.type = IBV_QPT_UD;
  ASSERT_EQ(0, me.open(o));
  ASSERT_EQ(0, me.connect(0, o));
  ibv_ah_attr aa{};
  aa.port_num = 1;
  aa.is_global = 1;
  aa.grh.hop_limit = 1;
  aa.grh.dgid.raw[10] = 0xff;
  aa.grh.dgid.raw[11] = 0xff;
  aa.grh.dgid.raw[12] = 127;
  aa.grh.dgid.raw[15] = 1;
  ibv_ah* ah = ibv_create_ah(me.pd, &aa);
  ASSERT_NE(nullptr, ah);
  ibv_sge sg{reinterpret_cast<uint64_t>(me.buf), 8, me.mr->lkey};
  ibv_send_wr wr{};
  wr.sg_list = &sg;
  wr.num_sge = 1;
  wr.wr.ud.ah = ah;
  wr.wr.ud.remote_qpn = me.qp->qp_num;
  wr.wr.ud.remote_qkey = o.qkey;
  ibv_send_wr* bad = nullptr;
  for (ibv_wr_opcode op : {IBV_WR_RDMA_WRITE, IBV_WR_RDMA_READ, IBV_WR_ATOMIC_FETCH_AND_ADD}) {
    wr.opcode = op;
    bad = nullptr;
    EXPECT_EQ(EINVAL, ibv_post_send(me.qp, &wr, &bad)) << op;
    EXPECT_EQ(&wr, bad);
  }
  wr.opcode = IBV_WR_SEND;
  wr.wr.ud.ah = nullptr;
  bad = nullptr;
  EXPECT_EQ(EINVAL, ibv_post_send(me.qp, &wr, &bad));
  EXPECT_EQ(&wr, bad);
  // A UD message is at most one MTU (IBTA 9.8.3.2? no segmentation on UD).
  ibv_port_attr pa{};
  ASSERT_EQ(0, ibv_query_port(me.ctx, 1, &pa));
  const uint32_t mtu = 128u << pa.active_mtu;
  ASSERT_LE(mtu + 1, me.len);
  ibv_sge big{reinterpret_cast<uint64_t>(me.buf), mtu + 1, me.mr->lkey};
  wr.wr.ud.ah = ah;
  wr.sg_list = &big;
  wr.send_flags = IBV_SEND_SIGNALED;
  bad = nullptr;
  int e = ibv_post_send(me.qp, &wr, &bad);
  if (e == 0) {
    auto wc = poll(me.cq, 1, 2000);
    ASSERT_EQ(1u, wc.size());
    EXPECT_NE(IBV_WC_SUCCESS, wc[0].status);
  } else {
    EXPECT_EQ(EINVAL, e);
  }
  EXPECT_EQ(0, ibv_destroy_ah(ah));
}

TEST(PostSendErrorsUc, ReadsAndAtomicsOnUcAreEinval) {
  // IBTA 10.7.2: UC carries SEND and RDMA WRITE, not READ or atomics.
  Side me;
  Peer peer;
  PeerInfo info{};
  Side::Options o;
  o.type = IBV_QPT_UC;
  ASSERT_EQ(0, connect_pair(me, peer, info, o, o));
  ibv_sge sg{reinterpret_cast<uint64_t>(me.buf), 8, me.mr->lkey};
  ibv_send_wr wr{};
  wr.sg_list = &sg;
  wr.num_sge = 1;
  wr.wr.rdma.remote_addr = info.addr;
  wr.wr.rdma.rkey = info.rkey;
  for (ibv_wr_opcode op : {IBV_WR_RDMA_READ, IBV_WR_ATOMIC_FETCH_AND_ADD, IBV_WR_ATOMIC_CMP_AND_SWP}) {
    wr.opcode = op;
    ibv_send_wr* bad = nullptr;
    EXPECT_EQ(EINVAL, ibv_post_send(me.qp, &wr, &bad)) << op;
    EXPECT_EQ(&wr, bad);
  }
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.send_flags = IBV_SEND_SIGNALED;
  ibv_send_wr* bad = nullptr;
  EXPECT_EQ(0, ibv_post_send(me.qp, &wr, &bad));
  auto wc = poll(me.cq, 1, 2000);
  ASSERT_EQ(1u, wc.size());
  EXPECT_EQ(IBV_WC_SUCCESS, wc[0].status);
}

// --- extended CQs ---------------------------------------------------------------

TEST_F(Errors, CreateCqExChecksCqeAndVector) {
  ibv_cq_init_attr_ex ca{};
  ca.cqe = 0;
  ca.wc_flags = IBV_WC_EX_WITH_BYTE_LEN;
  errno = 0;
  EXPECT_EQ(nullptr, ibv_create_cq_ex(s.ctx, &ca));
  EXPECT_EQ(EINVAL, errno);
  ca.cqe = dev.max_cqe + 1;
  errno = 0;
  EXPECT_EQ(nullptr, ibv_create_cq_ex(s.ctx, &ca));
  EXPECT_EQ(EINVAL, errno);
  ca.cqe = 16;
  ca.comp_vector = s.ctx->num_comp_vectors;
  errno = 0;
  EXPECT_EQ(nullptr, ibv_create_cq_ex(s.ctx, &ca));
  EXPECT_EQ(EINVAL, errno);
  ca.comp_vector = 0;
  ibv_cq_ex* cq = ibv_create_cq_ex(s.ctx, &ca);
  ASSERT_NE(nullptr, cq);
  EXPECT_EQ(0, ibv_destroy_cq(ibv_cq_ex_to_cq(cq)));
}

}  // namespace
}  // namespace svtest
