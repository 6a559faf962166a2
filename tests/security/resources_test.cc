// `rdma resource show` under softverbs (Op::ResList, src/nldev/): one daemon
// serves every user, and a user must not learn another user's objects
// (their QPNs, CQs, MR keys and lengths, PDs, nor the pids that hold them)
// unless root. nobody asks the daemon directly, walking every page from
// every starting handle, and must see its own objects and none of root's;
// root sees both users'.
#include <gtest/gtest.h>
#include <infiniband/verbs.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <set>

#include "attack.h"
#include "common/shm_layout.h"

namespace svsec {
namespace {

constexpr uint32_t kNobodyUid = 65534;

struct Seen {
  uint32_t foreign = 0;   // entries of another user
  uint32_t own_qp = 0;    // the QP it made itself
  uint32_t own_pid = 0;   // ... reported with its own pid
  uint32_t answered = 0;  // kinds the daemon listed (status 0)
};

// Every entry of every kind nobody's connection gets, starting the walk
// at 0 and at every handle up to `max_after` (a start past an object it
// may not see must not reveal what follows it either).
Seen walk(RawConn& raw, uint32_t my_qpn, uint32_t max_after) {
  Seen s;
  for (uint32_t kind : {sv::proto::kResQp, sv::proto::kResCq, sv::proto::kResMr, sv::proto::kResPd}) {
    bool ok = true;
    for (uint32_t after = 0; after <= max_after && ok; after += after < 64 ? 1 : 4093) {
      sv::proto::ResListReq req{};
      req.kind = kind;
      req.after = after;
      sv::proto::ResListReply rep{};
      if (raw.call(sv::proto::Op::ResList, req, rep) != 0 || rep.count > sv::proto::kResListPage) {
        ok = false;
        break;
      }
      for (uint32_t i = 0; i < rep.count; ++i) {
        const auto& e = rep.entries[i];
        if (e.uid != kNobodyUid) ++s.foreign;
        if (after == 0 && kind == sv::proto::kResQp && e.handle == my_qpn) {
          ++s.own_qp;
          s.own_pid += e.pid == uint32_t(::getpid());
        }
      }
    }
    s.answered += ok;
  }
  return s;
}

TEST(Resources, AUserSeesOnlyItsOwnObjects) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run a child as another user";
  SystemDaemon sysd;
  // root's objects, made first: a PD, an MR, a CQ and a QP in INIT.
  ibv_context* c = open_dev();
  ASSERT_NE(nullptr, c);
  ibv_pd* pd = ibv_alloc_pd(c);
  ASSERT_NE(nullptr, pd);
  static char buf[8192];
  ibv_mr* mr = ibv_reg_mr(pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
  ASSERT_NE(nullptr, mr);
  ibv_cq* cq = ibv_create_cq(c, 16, nullptr, nullptr, 0);
  ASSERT_NE(nullptr, cq);
  ibv_qp_init_attr qa{};
  qa.send_cq = qa.recv_cq = cq;
  qa.qp_type = IBV_QPT_RC;
  qa.cap.max_send_wr = qa.cap.max_recv_wr = 4;
  qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
  ibv_qp* qp = ibv_create_qp(pd, &qa);
  ASSERT_NE(nullptr, qp);
  ASSERT_EQ(0, qp_to_init(qp, IBV_ACCESS_REMOTE_READ));

  const std::string sock = sysd.socket();
  const uint32_t max_after = qp->qp_num + 4096;
  Child nobody(true, [sock, max_after](int s) {
    ibv_context* nc = open_dev();
    ibv_pd* npd = nc ? ibv_alloc_pd(nc) : nullptr;
    ibv_cq* ncq = nc ? ibv_create_cq(nc, 8, nullptr, nullptr, 0) : nullptr;
    if (!npd || !ncq) return 2;
    ibv_qp_init_attr a{};
    a.send_cq = a.recv_cq = ncq;
    a.qp_type = IBV_QPT_RC;
    a.cap.max_send_wr = a.cap.max_recv_wr = 2;
    a.cap.max_send_sge = a.cap.max_recv_sge = 1;
    ibv_qp* nqp = ibv_create_qp(npd, &a);
    if (!nqp) return 3;
    RawConn raw(sock);
    if (!raw.ok()) return 4;
    Seen seen = walk(raw, nqp->qp_num, max_after);
    if (!send_val(s, seen)) return 5;
    uint32_t qpn = nqp->qp_num;
    if (!send_val(s, qpn)) return 6;
    char go = 0;
    if (!recv_val(s, go)) return 7;  // holds its objects until root has looked
    return 0;
  });
  nobody.start();
  Seen seen;
  uint32_t nobody_qpn = 0;
  ASSERT_TRUE(recv_val(nobody.sock(), seen));
  ASSERT_TRUE(recv_val(nobody.sock(), nobody_qpn));
  EXPECT_EQ(4u, seen.answered) << "the daemon did not list every kind for nobody";
  EXPECT_EQ(1u, seen.own_qp) << "nobody's own QP is missing from its list";
  EXPECT_EQ(1u, seen.own_pid) << "nobody's QP is not shown with nobody's pid";
  EXPECT_EQ(0u, seen.foreign) << "nobody learned objects of another user";

  // root sees every user's: its own QP and nobody's, each with its user.
  RawConn raw(sysd.socket());
  ASSERT_TRUE(raw.ok());
  std::set<std::pair<uint32_t, uint32_t>> qps;  // (qpn, uid)
  sv::proto::ResListReq req{};
  req.kind = sv::proto::kResQp;
  for (;;) {
    sv::proto::ResListReply rep{};
    ASSERT_EQ(0, raw.call(sv::proto::Op::ResList, req, rep));
    for (uint32_t i = 0; i < rep.count; ++i) qps.insert({rep.entries[i].handle, rep.entries[i].uid});
    if (rep.count < sv::proto::kResListPage) break;
    req.after = rep.entries[rep.count - 1].handle;
  }
  EXPECT_TRUE(qps.count({qp->qp_num, 0u}));
  EXPECT_TRUE(qps.count({nobody_qpn, kNobodyUid}));
  // An unknown kind is refused.
  req.kind = 99;
  req.after = 0;
  sv::proto::ResListReply rep{};
  EXPECT_EQ(EINVAL, raw.call(sv::proto::Op::ResList, req, rep));

  char go = 1;
  ASSERT_TRUE(send_val(nobody.sock(), go));
  EXPECT_EQ(0, nobody.wait());
  ibv_destroy_qp(qp);
  ibv_destroy_cq(cq);
  ibv_dereg_mr(mr);
  ibv_dealloc_pd(pd);
  ibv_close_device(c);
}

// The port counters (`rdma statistic show`, Op::WireCounters) are summed
// from memory each QP's processes write: root forges huge counts in its own
// QP's segment; nobody, asking, must get none of them (its own QPs never
// went on the wire: zeros), and root gets its own.
TEST(Resources, WireCountersAreTheCallersOwn) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run a child as another user";
  SystemDaemon sysd;
  using sv::proto::Op;
  RawConn root(sysd.socket());
  ASSERT_TRUE(root.ok());
  std::vector<sv::Fd> fds;
  sv::proto::Empty e{};
  sv::proto::HelloReply hello{};
  ASSERT_EQ(0, root.call(Op::Hello, e, hello, {}, &fds));
  sv::proto::HandleReply pd{};
  ASSERT_EQ(0, root.call(Op::AllocPd, e, pd));
  sv::proto::CreateCqReq cq{};
  cq.cqe = 16;
  sv::proto::CreateCqReply cqrep{};
  ASSERT_EQ(0, root.call(Op::CreateCq, cq, cqrep, {}, &fds));
  sv::proto::CreateQpReq q{};
  q.pd = pd.handle;
  q.send_cq = q.recv_cq = cqrep.handle;
  q.qp_type = IBV_QPT_RC;
  q.max_send_wr = q.max_recv_wr = 4;
  q.max_send_sge = q.max_recv_sge = 1;
  sv::proto::CreateQpReply qrep{};
  fds.clear();
  ASSERT_EQ(0, root.call(Op::CreateQp, q, qrep, {}, &fds));
  ASSERT_EQ(1u, fds.size());
  void* seg = mmap(nullptr, sizeof(sv::shm::QpSegmentHeader), PROT_READ | PROT_WRITE, MAP_SHARED, fds[0].get(), 0);
  ASSERT_NE(MAP_FAILED, seg);
  constexpr uint64_t kForged = 1'000'000'007;
  auto* h = static_cast<sv::shm::QpSegmentHeader*>(seg);
  for (auto& w : h->wire) w.store(kForged);

  const std::string sock = sysd.socket();
  Child nobody(true, [sock](int s) {
    ibv_context* nc = open_dev();  // a context of its own, with a QP never on the wire
    ibv_pd* npd = nc ? ibv_alloc_pd(nc) : nullptr;
    ibv_cq* ncq = nc ? ibv_create_cq(nc, 8, nullptr, nullptr, 0) : nullptr;
    if (!npd || !ncq) return 2;
    ibv_qp_init_attr a{};
    a.send_cq = a.recv_cq = ncq;
    a.qp_type = IBV_QPT_RC;
    a.cap.max_send_wr = a.cap.max_recv_wr = 2;
    a.cap.max_send_sge = a.cap.max_recv_sge = 1;
    if (!ibv_create_qp(npd, &a)) return 3;
    RawConn raw(sock);
    if (!raw.ok()) return 4;
    sv::proto::Empty req{};
    sv::proto::WireCountersReply rep{};
    if (raw.call(sv::proto::Op::WireCounters, req, rep) != 0) return 5;
    return send_val(s, rep) ? 0 : 6;
  });
  nobody.start();
  sv::proto::WireCountersReply seen{};
  ASSERT_TRUE(recv_val(nobody.sock(), seen));
  EXPECT_EQ(0, nobody.wait());
  EXPECT_EQ(uint32_t(sv::shm::kWireCounterCount), seen.count);
  for (uint32_t i = 0; i < sv::shm::kWireCounterCount; ++i)
    EXPECT_EQ(0u, seen.values[i]) << "nobody's counter " << i << " holds root's counts";
  // root sees its own, live and, once the QP is gone, retired.
  sv::proto::WireCountersReply mine{};
  ASSERT_EQ(0, root.call(Op::WireCounters, e, mine));
  EXPECT_EQ(kForged, mine.values[sv::shm::kWireSentPkts]);
  munmap(seg, sizeof(sv::shm::QpSegmentHeader));
  sv::proto::HandleReq d{};
  d.handle = qrep.qpn;
  ASSERT_EQ(0, root.call(Op::DestroyQp, d));
  ASSERT_EQ(0, root.call(Op::WireCounters, e, mine));
  EXPECT_EQ(kForged, mine.values[sv::shm::kWireRdmaRecvs]);
}

// What nobody's listing costs the daemon is bounded by nobody's own
// objects: 200 ResList (QPs, from the start) and 200 WireCounters, timed
// (best of five rounds) before and after root fills the daemon with QPs,
// against a control request that looks at no object.
struct ListTimes {
  double control, list, counters;
};

ListTimes time_listing(RawConn& raw) {
  using Clock = std::chrono::steady_clock;
  auto secs = [](auto f) {
    auto t0 = Clock::now();
    for (int i = 0; i < 200; ++i) f();
    return std::chrono::duration<double>(Clock::now() - t0).count();
  };
  ListTimes best{1e9, 1e9, 1e9};
  for (int round = 0; round < 5; ++round) {
    best.control = std::min(best.control, secs([&] {
      sv::proto::HandleReq r{};
      raw.call(sv::proto::Op::QueryPd, r);
    }));
    best.list = std::min(best.list, secs([&] {
      sv::proto::ResListReq r{};
      r.kind = sv::proto::kResQp;
      sv::proto::ResListReply rep{};
      raw.call(sv::proto::Op::ResList, r, rep);
    }));
    best.counters = std::min(best.counters, secs([&] {
      sv::proto::Empty r{};
      sv::proto::WireCountersReply rep{};
      raw.call(sv::proto::Op::WireCounters, r, rep);
    }));
  }
  return best;
}

TEST(Resources, AnotherUsersObjectsDoNotSlowTheListing) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run a child as another user";
  setenv("SOFTVERBSD_QUOTA_FD", "1000000", 1);  // each QP holds a descriptor of the daemon's
  SystemDaemon sysd;
  unsetenv("SOFTVERBSD_QUOTA_FD");
  const std::string sock = sysd.socket();
  Child nobody(true, [sock](int s) {
    RawConn raw(sock);
    if (!raw.ok() || !raw_hello(raw)) return 2;
    char go = 0;
    for (int phase = 0; phase < 2; ++phase) {
      if (!recv_val(s, go)) return 3;
      const ListTimes t = time_listing(raw);
      if (!send_val(s, t)) return 4;
    }
    return 0;
  });
  nobody.start();
  char go = 1;
  ListTimes before{}, after{};
  ASSERT_TRUE(send_val(nobody.sock(), go));
  ASSERT_TRUE(recv_val(nobody.sock(), before));
  RawConn root(sock);
  ASSERT_TRUE(raw_hello(root));
  sv::proto::Empty e{};
  sv::proto::HandleReply pd{};
  ASSERT_EQ(0, root.call(sv::proto::Op::AllocPd, e, pd));
  sv::proto::CreateCqReq cq{};
  cq.cqe = 16;
  sv::proto::CreateCqReply cqrep{};
  std::vector<sv::Fd> fds;
  ASSERT_EQ(0, root.call(sv::proto::Op::CreateCq, cq, cqrep, {}, &fds));
  uint32_t made = 0;
  for (; made < sv::shm::kQpTableSize / 4; ++made) {  // the per-user QP quota
    sv::proto::CreateQpReq q{};
    q.pd = pd.handle;
    q.send_cq = q.recv_cq = cqrep.handle;
    q.qp_type = IBV_QPT_RC;
    q.max_send_wr = q.max_recv_wr = q.max_send_sge = q.max_recv_sge = 1;
    sv::proto::CreateQpReply qrep{};
    fds.clear();
    if (root.call(sv::proto::Op::CreateQp, q, qrep, {}, &fds) != 0) break;
  }
  ASSERT_GE(made, sv::shm::kQpTableSize / 8) << "the daemon refused root's QPs too early to measure anything";
  ASSERT_TRUE(send_val(nobody.sock(), go));
  ASSERT_TRUE(recv_val(nobody.sock(), after));
  EXPECT_EQ(0, nobody.wait());
  auto check = [&](const char* what, double b, double a) {
    const double b_trips = b / before.control, a_trips = a / after.control;
    std::fprintf(stderr, "%s: %.2f ms before, %.2f ms after root's %u QPs (%.1f and %.1f times the control)\n", what,
                 b * 1e3, a * 1e3, made, b_trips, a_trips);
    // In round trips of the moment (the control): a machine busy with other
    // work makes every round trip dearer, whatever the daemon holds.
    EXPECT_LT(a_trips, 3 * b_trips + 1) << what << " got slower with another user's objects in the daemon";
  };
  check("200 ResList", before.list, after.list);
  check("200 WireCounters", before.counters, after.counters);
}

}  // namespace
}  // namespace svsec
