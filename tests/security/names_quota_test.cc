// Tables a user can grow are bounded per user, and what another user pays
// for is bounded by its own objects (quota.h, name_space.h): nobody
// publishes names till refused (EDQUOT) and keeps the namespace busy, and
// root's ibv_open_device and name calls stay quick; nobody takes multicast
// groups, and places in a group, till refused (ENOMEM), and root's
// ibv_attach_mcast still works.
#include <gtest/gtest.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>

#include "attack.h"
#include "common/shm_layout.h"
#include "softverbs/softverbs.h"

namespace svsec {
namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

TEST(NamesQuota, PublishingIsBoundedAndRootsCallsStayQuick) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run a child as another user";
  SystemDaemon sysd;
  constexpr int kTry = 40000;
  Child nobody(true, [](int s) {
    ibv_context* c = open_dev();
    ibv_pd* pd = c ? ibv_alloc_pd(c) : nullptr;
    if (!pd) return 2;
    svx_object obj{};
    obj.type = SVX_OBJ_PD;
    obj.pd = pd;
    int published = 0, refused = 0;
    for (int i = 0; i < kTry; ++i) {
      int e = svx_publish(c, ("/nobody/n" + std::to_string(i)).c_str(), &obj, 0644, -1);
      if (e == 0) {
        ++published;
      } else {
        refused = e;
        break;
      }
    }
    int res[2] = {published, refused};
    if (!send_bytes(s, res, sizeof res)) return 3;
    // Keep the daemon busy with calls that once walked every name, till
    // root is done.
    char go = 0;
    for (;;) {
      for (int i = 0; i < 50; ++i) svx_unpublish(c, "/nobody/none");
      svx_object o{};
      ibv_context* x = svx_open("/nobody/n1", SVX_OPEN_READ, &o);
      if (x) ibv_close_device(x);
      pollfd p{s, POLLIN, 0};
      if (::poll(&p, 1, 0) == 1) break;
    }
    recv_val(s, go);
    return 0;
  });
  nobody.start();
  int res[2] = {-1, -1};
  ASSERT_TRUE(recv_bytes(nobody.sock(), res, sizeof res));
  EXPECT_EQ(EDQUOT, res[1]) << "nobody published " << res[0] << " names unrefused";
  EXPECT_LT(res[0], kTry);
  double worst = 0;
  const char* worst_call = "";
  auto timed = [&](const char* what, auto&& f) {
    auto t = Clock::now();
    f();
    double ms = ms_since(t);
    if (ms > worst) {
      worst = ms;
      worst_call = what;
    }
  };
  for (int round = 0; round < 5; ++round) {
    ibv_context* c = nullptr;
    timed("ibv_open_device", [&] { c = open_dev(); });
    ASSERT_NE(nullptr, c);
    ibv_pd* pd = ibv_alloc_pd(c);
    ASSERT_NE(nullptr, pd);
    svx_object obj{};
    obj.type = SVX_OBJ_PD;
    obj.pd = pd;
    const std::string name = "/root/pd" + std::to_string(round);
    int e = -1;
    timed("svx_publish", [&] { e = svx_publish(c, name.c_str(), &obj, 0600, -1); });
    EXPECT_EQ(0, e);
    svx_object o{};
    ibv_context* x = nullptr;
    timed("svx_open", [&] { x = svx_open(name.c_str(), SVX_OPEN_READ, &o); });
    EXPECT_NE(nullptr, x);
    if (x && o.pd) ibv_unimport_pd(o.pd);  // the PD svx_open imported
    if (x) ibv_close_device(x);
    timed("svx_unpublish", [&] { e = svx_unpublish(c, name.c_str()); });
    EXPECT_EQ(0, e);
    ibv_dealloc_pd(pd);
    ibv_close_device(c);
  }
  EXPECT_LT(worst, 200.0) << worst_call << " took " << worst << " ms";
  ASSERT_TRUE(send_val(nobody.sock(), char(1)));
  EXPECT_EQ(0, nobody.wait());
  EXPECT_TRUE(sysd.alive());
}

ibv_qp* ud_qp(ibv_pd* pd, ibv_cq* cq) {
  ibv_qp_init_attr qa{};
  qa.send_cq = cq;
  qa.recv_cq = cq;
  qa.qp_type = IBV_QPT_UD;
  qa.cap = {1, 1, 1, 1, 0};
  return ibv_create_qp(pd, &qa);
}

ibv_gid group(uint16_t n) {
  ibv_gid g{};
  g.raw[0] = 0xff;
  g.raw[1] = 0x0e;
  g.raw[14] = uint8_t(n >> 8);
  g.raw[15] = uint8_t(n);
  return g;
}

// nobody attaches one QP to every group it can make, and as many QPs as it
// can to the group root will join: refused at its quota each time; root
// then makes a group of its own and joins nobody's.
TEST(NamesQuota, MulticastTableIsNotOneUsers) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run a child as another user";
  SystemDaemon sysd;
  Child nobody(true, [](int s) {
    ibv_context* c = open_dev();
    ibv_pd* pd = c ? ibv_alloc_pd(c) : nullptr;
    ibv_cq* cq = pd ? ibv_create_cq(c, 4, nullptr, nullptr, 0) : nullptr;
    ibv_qp* qp = cq ? ud_qp(pd, cq) : nullptr;
    if (!qp) return 2;
    int groups = 0, groups_err = 0, places = 0, places_err = 0;
    for (uint16_t i = 1; i <= sv::shm::kMcgTableSize; ++i) {
      ibv_gid g = group(i);
      int e = ibv_attach_mcast(qp, &g, 0);
      if (e) {
        groups_err = e;
        break;
      }
      ++groups;
    }
    ibv_gid shared = group(1);  // one of nobody's groups, which root joins
    for (uint32_t i = 0; i < sv::shm::kMcgMaxQps; ++i) {
      ibv_qp* q = ud_qp(pd, cq);
      if (!q) return 3;
      int e = ibv_attach_mcast(q, &shared, 0);
      if (e) {
        places_err = e;
        break;
      }
      ++places;
    }
    int res[4] = {groups, groups_err, places, places_err};
    if (!send_bytes(s, res, sizeof res)) return 4;
    char go = 0;
    recv_val(s, go);  // hold everything till root is done
    return 0;
  });
  nobody.start();
  int res[4] = {-1, -1, -1, -1};
  ASSERT_TRUE(recv_bytes(nobody.sock(), res, sizeof res));
  EXPECT_EQ(ENOMEM, res[1]) << "nobody made " << res[0] << " groups";
  EXPECT_LT(res[0], int(sv::shm::kMcgTableSize));
  EXPECT_EQ(ENOMEM, res[3]) << "nobody took " << res[2] << " places of a group";
  ibv_context* c = open_dev();
  ASSERT_NE(nullptr, c);
  ibv_pd* pd = ibv_alloc_pd(c);
  ibv_cq* cq = ibv_create_cq(c, 4, nullptr, nullptr, 0);
  ibv_qp* qp = ud_qp(pd, cq);
  ASSERT_NE(nullptr, qp);
  ibv_gid mine = group(0x7fff), shared = group(1);
  EXPECT_EQ(0, ibv_attach_mcast(qp, &mine, 0)) << "root's own group";
  EXPECT_EQ(0, ibv_attach_mcast(qp, &shared, 0)) << "root joining nobody's group";
  EXPECT_EQ(0, ibv_detach_mcast(qp, &mine, 0));
  EXPECT_EQ(0, ibv_detach_mcast(qp, &shared, 0));
  ASSERT_TRUE(send_val(nobody.sock(), char(1)));
  EXPECT_EQ(0, nobody.wait());
  ibv_destroy_qp(qp);
  ibv_destroy_cq(cq);
  ibv_dealloc_pd(pd);
  ibv_close_device(c);
  EXPECT_TRUE(sysd.alive());
}

}  // namespace
}  // namespace svsec
