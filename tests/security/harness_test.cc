// The attack harness itself: a child of another user reaches the private
// system daemon, and the daemon tells the two users apart.
#include <gtest/gtest.h>
#include <unistd.h>

#include "attack.h"

namespace svsec {
namespace {

TEST(AttackHarness, NobodyReachesThePrivateSystemDaemon) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run a child as another user";
  SystemDaemon sysd;
  Child nobody(true, [](int sock) {
    if (getuid() != kNobody) return 1;
    ibv_context* c = open_dev();
    if (!c) return 2;
    ibv_pd* pd = ibv_alloc_pd(c);
    if (!pd) return 3;
    int ok = 1;
    send_val(sock, ok);
    ibv_dealloc_pd(pd);
    ibv_close_device(c);
    return 0;
  });
  ASSERT_TRUE(sysd.alive());
  nobody.start();
  int ok = 0;
  EXPECT_TRUE(recv_val(nobody.sock(), ok));
  EXPECT_EQ(1, ok);
  EXPECT_EQ(0, nobody.wait());
  RawConn raw(sysd.socket());
  ASSERT_TRUE(raw.ok());
  sv::proto::Empty hello{};
  sv::proto::HelloReply rep{};
  std::vector<sv::Fd> fds;
  EXPECT_EQ(0, raw.call(sv::proto::Op::Hello, hello, rep, {}, &fds));
  EXPECT_EQ(1u, fds.size());
  EXPECT_TRUE(sysd.alive());
}

}  // namespace
}  // namespace svsec
