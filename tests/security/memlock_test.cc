// Finding 10 (issue 18): RLIMIT_MEMLOCK bypass. Registrations are charged to
// the registrant's RLIMIT_MEMLOCK unless it has CAP_IPC_LOCK, and as in the
// kernel (capable(), which asks the initial user namespace) a capability a
// process holds in a user namespace of its own does not count. The
// registrant is the process that connected, bound at connect time: a later
// exec of a setuid binary by that process raises nothing.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include "attack.h"

namespace svsec {
namespace {

using sv::proto::Op;

constexpr uint64_t kLimit = 64 * 1024;
constexpr uint64_t kTiB = 1ull << 40;

bool write_file(const char* path, const char* text) {
  int fd = open(path, O_WRONLY | O_CLOEXEC);
  if (fd < 0) return false;
  bool ok = write(fd, text, std::strlen(text)) == ssize_t(std::strlen(text));
  close(fd);
  return ok;
}

// The `key:` line of /proc/PID/status (empty if none).
std::string status_line(pid_t pid, const char* key) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind(key, 0) == 0) return line;
  return {};
}

bool has_cap_ipc_lock(pid_t pid) {
  std::string l = status_line(pid, "CapEff:");
  return !l.empty() && (std::strtoull(l.c_str() + 7, nullptr, 16) & (1ull << 14));
}

// Requests on a control connection given by its descriptor (a RawConn's,
// or one received from another process).
struct Conn {
  int fd;
  uint32_t seq = 0x40000000;
  template <class Req, class Rep>
  int call(Op op, Req& r, Rep& rep, std::span<const int> fds = {}) {
    sv::proto::init_header(r, op, ++seq);
    if (sv::send_message(fd, &r, sizeof(r), fds) != 0) return -1;
    uint8_t buf[sv::proto::kMaxMessage];
    for (;;) {
      size_t n = 0;
      std::vector<sv::Fd> got;
      if (sv::recv_message(fd, buf, sizeof(buf), &n, got) != 0 || n < sizeof(sv::proto::Header)) return -1;
      sv::proto::Header h;
      std::memcpy(&h, buf, sizeof(h));
      if (h.seq != seq) continue;  // an async event
      std::memcpy(&rep, buf, std::min(n, sizeof(rep)));
      return h.status;
    }
  }
};

// A connection's PD and a backing (a sealed sparse memfd of 1 TiB) to
// register over.
struct RegTarget {
  uint32_t pd = 0, backing = 0;
};

int sealed_tib() {
  int fd = memfd_create("memlock", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0 || ftruncate(fd, off_t(kTiB)) != 0 || fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_SEAL) != 0)
    return -1;
  return fd;
}

// `backing`: a memfd of the connection's user (the daemon takes no other),
// or -1 for one made here.
int setup(Conn& c, RegTarget& s, int backing = -1) {
  sv::proto::Empty hello{};
  sv::proto::HelloReply hr{};
  if (c.fd < 0 || c.call(Op::Hello, hello, hr) != 0) return 2;
  sv::proto::Empty apd{};
  sv::proto::HandleReply pd{};
  if (c.call(Op::AllocPd, apd, pd) != 0) return 3;
  int fd = backing >= 0 ? backing : sealed_tib();
  if (fd < 0) return 4;
  sv::proto::Empty breq{};
  sv::proto::HandleReply brep{};
  int fds[1] = {fd};
  if (c.call(Op::RegBacking, breq, brep, fds) != 0) return 5;
  if (fd != backing) close(fd);
  s.pd = pd.handle;
  s.backing = brep.handle;
  return 0;
}

sv::proto::RegMrReq reg_req(const RegTarget& s, uint64_t len) {
  sv::proto::RegMrReq m{};
  m.pd = s.pd;
  m.backing = s.backing;
  m.addr = 0;
  m.length = len;
  m.access = IBV_ACCESS_LOCAL_WRITE;
  return m;
}

int reg(Conn& c, const RegTarget& s, uint64_t len) {
  auto m = reg_req(s, len);
  sv::proto::RegMrReply rep{};
  return c.call(Op::RegMr, m, rep);
}

// nobody with RLIMIT_MEMLOCK 64 KiB enters a user namespace of its own
// (unshare -Ur), where it holds every capability, CAP_IPC_LOCK included,
// and registers 1 TiB: refused, as the kernel would.
TEST(MemlockNs, CapIpcLockInAUserNamespaceDoesNotLiftTheLimit) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run a child as another user";
  SystemDaemon sysd;
  const std::string path = sysd.socket();
  struct Result {
    int small, huge;
  };
  Child nobody(true, [path](int sock) {
    rlimit rl{kLimit, kLimit};
    if (setrlimit(RLIMIT_MEMLOCK, &rl) != 0) return 10;
    // A process that changed its uid is not dumpable: its /proc files, the
    // maps among them, would stay root's.
    if (prctl(PR_SET_DUMPABLE, 1) != 0 || unshare(CLONE_NEWUSER) != 0) return 11;
    char map[64];
    std::snprintf(map, sizeof(map), "0 %u 1", kNobody);
    if (!write_file("/proc/self/setgroups", "deny") || !write_file("/proc/self/uid_map", map) ||
        !write_file("/proc/self/gid_map", map))
      return 12;
    if (!has_cap_ipc_lock(getpid())) return 13;  // the namespace grants it
    RawConn raw(path);
    Conn c{raw.fd()};
    RegTarget s;
    if (int e = setup(c, s)) return e;
    Result r{};
    r.small = reg(c, s, 16 * 1024);
    r.huge = reg(c, s, kTiB);
    return send_val(sock, r) ? 0 : 14;
  });
  ASSERT_TRUE(sysd.alive());
  nobody.start();
  Result r{-1, -1};
  if (!recv_val(nobody.sock(), r)) {
    int rc = nobody.wait();
    if (rc == 11 || rc == 12) GTEST_SKIP() << "no user namespaces here (exit " << rc << ")";
    FAIL() << "the child failed: exit " << rc;
  }
  EXPECT_EQ(0, r.small) << "16 KiB within the limit";
  EXPECT_EQ(ENOMEM, r.huge) << "1 TiB beyond RLIMIT_MEMLOCK was accepted";
  EXPECT_EQ(0, nobody.wait());
  EXPECT_TRUE(sysd.alive());
}

// A setuid-root copy of sleep(1) in a private directory, for the life of the
// object (the path is empty if one cannot be made).
struct SetuidSleep {
  std::string dir, path;
  SetuidSleep() {
    char tmpl[] = "/tmp/softverbs-setuid-XXXXXX";
    if (!mkdtemp(tmpl)) return;
    dir = tmpl;
    chmod(dir.c_str(), 0755);
    const char* src = access("/bin/sleep", X_OK) == 0 ? "/bin/sleep" : "/usr/bin/sleep";
    std::string dst = dir + "/sleep";
    std::string cmd = std::string("cp ") + src + " " + dst;
    if (std::system(cmd.c_str()) != 0 || chown(dst.c_str(), 0, 0) != 0 || chmod(dst.c_str(), 04755) != 0) return;
    path = dst;
  }
  ~SetuidSleep() {
    if (dir.empty()) return;
    std::string cmd = "rm -rf " + dir;
    if (std::system(cmd.c_str())) {
    }
  }
};

// nobody (RLIMIT_MEMLOCK 64 KiB) connects, hands its connection to a
// helper (here the test itself) and execs a setuid-root binary: the process
// that connected now runs as root with CAP_IPC_LOCK. A registration of
// 1 TiB on that connection is still charged to nobody's limit, as at
// connect time.
TEST(MemlockNs, ASetuidExecAfterConnectingDoesNotLiftTheLimit) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to make a setuid binary and run a child as another user";
  SetuidSleep bin;
  if (bin.path.empty()) GTEST_SKIP() << "cannot make a setuid binary here";
  SystemDaemon sysd;
  const std::string path = sysd.socket();
  const std::string exe = bin.path;
  struct Before {
    RegTarget s;
    int huge;
  };
  Child nobody(true, [path, exe](int sock) {
    rlimit rl{kLimit, kLimit};
    if (setrlimit(RLIMIT_MEMLOCK, &rl) != 0) return 10;
    RawConn raw(path);
    Conn c{raw.fd()};
    Before b{};
    if (int e = setup(c, b.s)) return e;
    b.huge = reg(c, b.s, kTiB);
    int fds[1] = {raw.fd()};
    if (!send_val(sock, b, fds)) return 11;
    // Our end of the socketpair is close-on-exec: the parent sees the exec.
    execl(exe.c_str(), "sleep", "600", static_cast<char*>(nullptr));
    return 12;
  });
  ASSERT_TRUE(sysd.alive());
  nobody.start();
  Before b{};
  std::vector<sv::Fd> fds;
  ASSERT_TRUE(recv_val(nobody.sock(), b, &fds)) << "the child failed: exit " << nobody.wait();
  ASSERT_EQ(1u, fds.size());
  EXPECT_EQ(ENOMEM, b.huge) << "before the exec";
  // Wait for the exec: the child's end of the socketpair closes with it.
  char c;
  ASSERT_EQ(0, read(nobody.sock(), &c, 1));
  if (!has_cap_ipc_lock(nobody.pid())) GTEST_SKIP() << "the setuid exec did not raise capabilities here";
  ASSERT_NE(std::string::npos, status_line(nobody.pid(), "Uid:").find("\t0\t")) << "not running setuid root";
  // The connection, used by another process: the daemon's registrant is the
  // process that connected (now root, with CAP_IPC_LOCK).
  Conn conn{fds[0].get()};
  EXPECT_EQ(ENOMEM, reg(conn, b.s, kTiB)) << "1 TiB accepted after the setuid exec";
  EXPECT_EQ(0, reg(conn, b.s, 16 * 1024)) << "16 KiB within the limit";
  EXPECT_TRUE(sysd.alive());
}

// The same exec, made before the daemon accepted the connection (the daemon
// is stopped meanwhile): the process it finds behind the socket already
// runs setuid root, but the socket recorded nobody at connect(2).
TEST(MemlockNs, ASetuidExecBeforeTheDaemonAcceptsDoesNotLiftTheLimit) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to make a setuid binary and run a child as another user";
  SetuidSleep bin;
  if (bin.path.empty()) GTEST_SKIP() << "cannot make a setuid binary here";
  SystemDaemon sysd;
  const std::string path = sysd.socket();
  const std::string exe = bin.path;
  Child nobody(true, [path, exe](int sock) {
    rlimit rl{kLimit, kLimit};
    if (setrlimit(RLIMIT_MEMLOCK, &rl) != 0) return 10;
    RawConn raw(path);  // connected; the stopped daemon has not accepted it
    int backing = sealed_tib();
    if (!raw.ok() || backing < 0) return 11;
    int fds[2] = {raw.fd(), backing};
    int ok = 1;
    if (!send_val(sock, ok, fds)) return 12;
    execl(exe.c_str(), "sleep", "600", static_cast<char*>(nullptr));
    return 13;
  });
  ASSERT_TRUE(sysd.alive());
  ASSERT_EQ(0, kill(sysd.pid, SIGSTOP));
  struct Resume {
    pid_t pid;
    ~Resume() { kill(pid, SIGCONT); }
  } resume{sysd.pid};
  nobody.start();
  int ok = 0;
  std::vector<sv::Fd> fds;
  ASSERT_TRUE(recv_val(nobody.sock(), ok, &fds)) << "the child failed: exit " << nobody.wait();
  ASSERT_EQ(2u, fds.size());
  char c;
  ASSERT_EQ(0, read(nobody.sock(), &c, 1));  // exec'd
  if (!has_cap_ipc_lock(nobody.pid())) GTEST_SKIP() << "the setuid exec did not raise capabilities here";
  ASSERT_EQ(0, kill(sysd.pid, SIGCONT));
  Conn conn{fds[0].get()};
  RegTarget t;
  ASSERT_EQ(0, setup(conn, t, fds[1].get()));
  EXPECT_EQ(ENOMEM, reg(conn, t, kTiB)) << "1 TiB accepted for a process that connected as nobody";
  EXPECT_EQ(0, reg(conn, t, 16 * 1024)) << "16 KiB within the limit";
  EXPECT_TRUE(sysd.alive());
}

}  // namespace
}  // namespace svsec
