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
#include <poll.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
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

// What the refused process learns: the daemon's one Refused message (the
// reason, and both namespaces), then the connection closed; and from the
// library, once per process, a line on stderr with the reason and what to
// do. Exit code: 0, or 30 + what went wrong.
int told_why_in_new_pid_namespace(const std::string& sock, uint64_t daemon_ns) {
  if (::unshare(CLONE_NEWPID) != 0) return 77;
  pid_t p = ::fork();
  if (p < 0) return 31;
  if (p == 0) {
    struct stat mine {};
    if (::stat("/proc/self/ns/pid", &mine) != 0 || mine.st_ino == daemon_ns) ::_exit(32);
    RawConn raw(sock);
    if (!raw.ok()) ::_exit(33);
    pollfd pf{raw.fd(), POLLIN, 0};
    if (::poll(&pf, 1, 10000) != 1) ::_exit(34);  // nothing said
    proto::RefusedMsg m{};
    const ssize_t n = ::recv(raw.fd(), &m, sizeof m, 0);
    if (n != ssize_t(sizeof m) || m.h.magic != proto::kMagic || m.h.op != uint16_t(proto::Op::Refused) ||
        m.h.seq != 0 || m.h.status != EPERM || m.reason != proto::kRefusedPidNamespace)
      ::_exit(35);
    if (m.mine != daemon_ns || (m.theirs != 0 && m.theirs != mine.st_ino)) ::_exit(36);
    char rest[8];
    if (::recv(raw.fd(), rest, sizeof rest, 0) != 0) ::_exit(37);  // closed after it
    // The library: stderr into a file, two opens, one line.
    const int err = ::memfd_create("stderr", 0);
    if (err < 0 || ::dup2(err, 2) != 2) ::_exit(38);
    if (open_dev() || open_dev()) ::_exit(39);
    std::string text(4096, '\0');
    const ssize_t got = ::pread(err, text.data(), text.size(), 0);
    text.resize(got > 0 ? size_t(got) : 0);
    const std::string want = "refused this process: it is in pid namespace pid:[" + std::to_string(mine.st_ino) +
                             "], the daemon serves pid:[" + std::to_string(daemon_ns) + "]";
    const size_t at = text.find(want);
    if (at == std::string::npos) ::_exit(40);
    if (text.find("refused this process", at + 1) != std::string::npos) ::_exit(41);  // said twice
    ::_exit(0);
  }
  return wait_for(p);
}

TEST(PidNamespace, TheRefusedProcessIsToldWhyOnce) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root for a new pid namespace";
  SystemDaemon sysd;
  const std::string sock = sysd.socket();
  struct stat ns {};
  ASSERT_EQ(::stat("/proc/self/ns/pid", &ns), 0);
  const uint64_t daemon_ns = ns.st_ino;  // the daemon was started from here
  Child other(false, [sock, daemon_ns](int) { return told_why_in_new_pid_namespace(sock, daemon_ns); });
  other.start();
  int rc = other.wait();
  if (rc == 77) GTEST_SKIP() << "unshare(CLONE_NEWPID) refused here";
  EXPECT_EQ(rc, 0) << "30+: 32 not a new namespace, 33 socket unreachable, 34 nothing said, 35 not a Refused "
                      "message for the pid namespace, 36 wrong namespaces, 37 not closed after it, 38 stderr, "
                      "39 ibv_open_device succeeded, 40 no such line on stderr, 41 said twice";
  EXPECT_TRUE(sysd.alive());
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
