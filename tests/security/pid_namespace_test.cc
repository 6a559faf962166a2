// A client in another pid namespace (a container's processes against the
// host's daemon socket, mounted into the container; issue 23). The shared
// rings name whoever claims a slot by pid, and every process that touches a
// ring judges a claimer's death by that number (common/shm_ring.h): the
// daemon when it pushes a mediated completion or recovers for a dead
// client, the ring's other sharers. A pid of another namespace names
// another process there, or none: a live claimer taken for dead loses a
// message, a dead one taken for alive wedges the ring. So the daemon serves
// only processes of its own pid namespace, whatever their user: root's
// process in a new pid namespace is refused by root's system daemon, at
// once and with the daemon unharmed.
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <string>

#include "attack.h"

namespace svsec {
namespace {

namespace proto = sv::proto;

// In a new pid namespace (this child becomes its pid 1's parent): a raw
// Hello, then the library's ibv_open_device. Exit code: 0 when both were
// refused, 10 + what went wrong otherwise, 77 without CLONE_NEWPID.
int refused_in_new_pid_namespace(const std::string& sock) {
  if (::unshare(CLONE_NEWPID) != 0) return 77;
  pid_t p = ::fork();
  if (p < 0) return 11;
  if (p == 0) {
    if (::getpid() != 1) ::_exit(12);  // really in the new namespace
    RawConn raw(sock);
    if (!raw.ok()) ::_exit(13);  // the socket itself stays reachable: the refusal is the daemon's
    proto::Empty hello{};
    proto::HelloReply rep{};
    std::vector<sv::Fd> got;
    if (raw.call(proto::Op::Hello, hello, rep, {}, &got) != -1) ::_exit(14);  // answered: admitted
    errno = 0;
    ibv_context* c = open_dev();
    if (c) ::_exit(15);
    ::_exit(0);
  }
  return wait_for(p);
}

TEST(PidNamespace, RootsProcessInAnotherPidNamespaceIsRefusedByRootsDaemon) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root for a new pid namespace";
  SystemDaemon sysd;
  const std::string sock = sysd.socket();
  Child other(false, [sock](int) { return refused_in_new_pid_namespace(sock); });
  Child same(false, [](int) {
    ibv_context* c = open_dev();
    if (!c) return 20;
    ibv_pd* pd = ibv_alloc_pd(c);
    int r = pd ? 0 : 21;
    if (pd) ibv_dealloc_pd(pd);
    ibv_close_device(c);
    return r;
  });
  other.start();
  int rc = other.wait();
  if (rc == 77) GTEST_SKIP() << "unshare(CLONE_NEWPID) refused here";
  EXPECT_EQ(rc, 0) << "10+: 11 fork, 12 not pid 1, 13 socket unreachable, 14 raw Hello answered, "
                      "15 ibv_open_device succeeded";
  EXPECT_TRUE(sysd.alive());
  // The daemon goes on serving its own namespace's processes.
  same.start();
  EXPECT_EQ(same.wait(), 0);
}

// A flood of such connections: each is closed at once (none is kept
// pending, which epoll would report again and again), the daemon says so
// once on its log, and a process of its own namespace is still served.
TEST(PidNamespace, AFloodFromAnotherPidNamespaceLeavesTheDaemonServing) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root for a new pid namespace";
  SystemDaemon sysd;
  const std::string sock = sysd.socket();
  Child other(false, [sock](int) {
    if (::unshare(CLONE_NEWPID) != 0) return 77;
    pid_t p = ::fork();
    if (p < 0) return 11;
    if (p == 0) {
      for (int i = 0; i < 2000; ++i) {
        RawConn raw(sock);
        proto::Empty hello{};
        proto::HelloReply rep{};
        if (raw.ok() && raw.call(proto::Op::Hello, hello, rep) != -1) ::_exit(14);
      }
      ::_exit(0);
    }
    return wait_for(p);
  });
  Child same(false, [](int) {
    ibv_context* c = open_dev();
    if (!c) return 20;
    ibv_close_device(c);
    return 0;
  });
  other.start();
  int rc = other.wait();
  if (rc == 77) GTEST_SKIP() << "unshare(CLONE_NEWPID) refused here";
  EXPECT_EQ(rc, 0);
  EXPECT_TRUE(sysd.alive());
  same.start();
  EXPECT_EQ(same.wait(), 0);
}

}  // namespace
}  // namespace svsec
