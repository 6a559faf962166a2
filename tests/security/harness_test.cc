// The attack harness itself: a child of another user reaches the private
// system daemon, and the daemon tells the two users apart.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

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

// The system daemon's socket admits every user from the moment it admits
// any: another user already knocking while the daemon starts is never
// refused (EACCES) by a socket that answers root. The socket was bound at
// its path and chmod-ed after it listened; a test in which nobody acted
// first (Names.OpeningASquattedName...) failed on that window under load.
// Each round: nobody spins on connect before the daemon starts, until one
// succeeds; every failure must be "not there yet", never "not for you".
TEST(AttackHarness, AnotherUserIsAdmittedFromTheSystemDaemonsFirstConnection) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run a child as another user";
  for (int round = 0; round < 8; ++round) {
    Child nobody(true, [](int sock) {
      char dir[256] = {};
      if (!recv_bytes(sock, dir, sizeof dir)) return 2;
      const std::string path = std::string(dir) + "/control";
      int refused = 0;  // EACCES: the path was there but not for this user
      for (uint64_t end = sv::monotonic_ns() + 30'000'000'000ull; sv::monotonic_ns() < end;) {
        sv::Fd s;
        int e = sv::connect_seqpacket(path, s);
        if (e == 0) return refused ? 10 + std::min(refused, 100) : 0;
        if (e == EACCES) ++refused;
        else if (e != ENOENT && e != ECONNREFUSED) return 3;
      }
      return 4;  // never admitted
    });
    SystemDaemon sysd([&](const std::string& dir) {
      nobody.start();
      char buf[256] = {};
      std::strncpy(buf, dir.c_str(), sizeof buf - 1);
      ASSERT_TRUE(send_bytes(nobody.sock(), buf, sizeof buf));
    });
    ASSERT_TRUE(sysd.alive());
    EXPECT_EQ(0, nobody.wait()) << "round " << round << ": 1x-1xx: nobody was refused (EACCES) while the socket "
                                << "existed; 4: never admitted";
    struct stat st {};
    ASSERT_EQ(0, ::stat(sysd.socket().c_str(), &st));
    EXPECT_EQ(0666u, st.st_mode & 07777);
    EXPECT_NE(0, ::access((sysd.socket() + "~").c_str(), F_OK)) << "the temporary name is left behind";
  }
}

}  // namespace
}  // namespace svsec
