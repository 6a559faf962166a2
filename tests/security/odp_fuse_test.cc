// The daemon never blocks on a client's memory. nobody mounts a FUSE
// filesystem of its own (a user and mount namespace, /dev/fuse spoken
// directly) whose server answers INIT, LOOKUP, GETATTR and OPEN and never a
// READ, maps a file of it and registers the mapping as ODP memory; root
// RDMA READs from it, so the daemon's copy faults on a page that never
// comes. A third client (root's) must still have its control calls
// answered promptly and its own mediated WRITEs to a fourth (nobody's)
// carried; nobody's process then exits (its FUSE server lives on, the page
// still never comes) and root's READ must complete in error; and the
// daemon must still stop on SIGTERM while its copy is stuck.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/fuse.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "attack.h"

namespace svsec {
namespace odp_fuse_test {  // this file's own (unity builds join files)
namespace {

constexpr size_t kFile = 1 << 20;

double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

bool write_file(const char* path, const std::string& s) {
  int fd = open(path, O_WRONLY);
  if (fd < 0) return false;
  const bool ok = write(fd, s.data(), s.size()) == ssize_t(s.size());
  close(fd);
  return ok;
}

void fill_attr(fuse_attr& a, uint64_t ino, bool dir) {
  std::memset(&a, 0, sizeof a);
  a.ino = ino;
  a.mode = dir ? (S_IFDIR | 0755) : (S_IFREG | 0644);
  a.nlink = 1;
  a.size = dir ? 0 : kFile;
  a.blocks = dir ? 0 : kFile / 512;
  a.blksize = 4096;
}

void reply(int dev, uint64_t unique, int error, const void* body, size_t n) {
  char buf[sizeof(fuse_out_header) + 256];
  fuse_out_header h{uint32_t(sizeof h + n), -error, unique};
  std::memcpy(buf, &h, sizeof h);
  if (n) std::memcpy(buf + sizeof h, body, n);
  (void)!write(dev, buf, sizeof h + n);
}

// The FUSE server (fuse(4)): one regular file "f" of kFile bytes in the
// root directory; READ is never answered.
[[noreturn]] void serve_fuse(int dev) {
  static char buf[1 << 17];
  for (;;) {
    const ssize_t n = read(dev, buf, sizeof buf);
    if (n < ssize_t(sizeof(fuse_in_header))) {
      if (n < 0 && errno == EINTR) continue;
      _exit(0);
    }
    fuse_in_header in;
    std::memcpy(&in, buf, sizeof in);
    switch (in.opcode) {
      case FUSE_INIT: {
        fuse_init_out o{};
        o.major = FUSE_KERNEL_VERSION;
        o.minor = 31;
        o.max_readahead = 0;
        o.max_write = 4096;
        o.max_background = 16;
        o.congestion_threshold = 12;
        reply(dev, in.unique, 0, &o, sizeof o);
        break;
      }
      case FUSE_LOOKUP: {
        fuse_entry_out e{};
        e.nodeid = 2;
        fill_attr(e.attr, 2, false);
        const char* name = buf + sizeof in;
        if (std::strcmp(name, "f") != 0) reply(dev, in.unique, ENOENT, nullptr, 0);
        else reply(dev, in.unique, 0, &e, sizeof e);
        break;
      }
      case FUSE_GETATTR: {
        fuse_attr_out a{};
        fill_attr(a.attr, in.nodeid, in.nodeid == 1);
        reply(dev, in.unique, 0, &a, sizeof a);
        break;
      }
      case FUSE_OPEN: {
        fuse_open_out o{};
        o.fh = 1;
        reply(dev, in.unique, 0, &o, sizeof o);
        break;
      }
      case FUSE_READ:       // never answered: whoever faults on the file waits
      case FUSE_FORGET:     // no reply expected
      case FUSE_INTERRUPT:  // left unanswered as well
        break;
      case FUSE_FLUSH:
      case FUSE_RELEASE: reply(dev, in.unique, 0, nullptr, 0); break;
      default: reply(dev, in.unique, ENOSYS, nullptr, 0);
    }
  }
}

// A FUSE mount in a user and mount namespace of its own (a helper process:
// unshare(CLONE_NEWUSER) needs a single-threaded caller), whose server is a
// process of its own (its pid in *server); the file mapped here, or nullptr.
// The mount point's name (in /tmp, seen from outside the namespace as an
// empty directory) in dir_out. `writable`: a private writable mapping
// (whose first write still reads the page in), else a shared read-only one.
void* map_stuck_file(pid_t* server, char (&dir_out)[32], bool writable = false) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv) != 0) return nullptr;
  const pid_t helper = fork();
  if (helper == 0) {
    close(sv[0]);
    const uid_t uid = getuid();
    const gid_t gid = getgid();
    // A process that changed its ids is not dumpable: its /proc/self files
    // would stay root's.
    prctl(PR_SET_DUMPABLE, 1);
    if (unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0) _exit(1);
    if (!write_file("/proc/self/setgroups", "deny") ||
        !write_file("/proc/self/uid_map", "0 " + std::to_string(uid) + " 1") ||
        !write_file("/proc/self/gid_map", "0 " + std::to_string(gid) + " 1"))
      _exit(2);
    char dir[] = "/tmp/svfuse-XXXXXX";
    if (!mkdtemp(dir)) _exit(3);
    const int dev = open("/dev/fuse", O_RDWR | O_CLOEXEC);
    if (dev < 0) _exit(4);
    const std::string opts = "fd=" + std::to_string(dev) + ",rootmode=40000,user_id=0,group_id=0";
    if (mount("svfuse", dir, "fuse", MS_NOSUID | MS_NODEV, opts.c_str()) != 0) _exit(5);
    const pid_t srv = fork();
    if (srv == 0) serve_fuse(dev);
    close(dev);
    const int fd = open((std::string(dir) + "/f").c_str(), O_RDONLY);
    if (fd < 0) _exit(6);
    const int fds[] = {fd};
    if (!send_val(sv[1], srv, fds) || !send_bytes(sv[1], dir, sizeof dir)) _exit(7);
    // The helper faults on the first page itself: FUSE sends the READ
    // (the helper's ids are the mount's), the page stays locked, and any
    // other access to it, root's daemon's too, waits for that lock. The
    // helper waits for ever (uninterruptibly: the READ was sent), not the
    // registrant, which stays free to exit.
    void* m = mmap(nullptr, kFile, PROT_READ, MAP_SHARED, fd, 0);
    if (m != MAP_FAILED) (void)*static_cast<volatile const uint8_t*>(m);
    _exit(0);
  }
  close(sv[1]);
  std::vector<sv::Fd> got;
  const bool ok = recv_val(sv[0], *server, &got) && got.size() == 1 && recv_bytes(sv[0], dir_out, 19);
  close(sv[0]);
  if (!ok) {
    std::fprintf(stderr, "the FUSE helper failed\n");
    return nullptr;
  }
  usleep(100 * 1000);  // its READ is sent
  void* p = mmap(nullptr, kFile, writable ? PROT_READ | PROT_WRITE : PROT_READ, writable ? MAP_PRIVATE : MAP_SHARED,
                 got[0].get(), 0);
  return p == MAP_FAILED ? nullptr : p;
}

struct Target {
  uint32_t qpn, rkey;
  uint64_t addr;
  pid_t server;
  char dir[32];
};
struct Calls {
  int failed;
  int count;
  double worst_ms;
  int writes_failed;       // mediated WRITEs to the fourth client
  double worst_write_ms;
};
struct ReadDone {
  int status;
  double ms_after_exit;  // from the registrant's exit to the completion
};

// Waits up to ms for a value on sock.
template <class T>
bool recv_within(int sock, T& v, int ms) {
  pollfd p{sock, POLLIN, 0};
  return poll(&p, 1, ms) == 1 && recv_val(sock, v);
}

TEST(OdpFuse, AFaultThatNeverEndsStallsNoOneElse) {
#if defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "the attacker's unshare(CLONE_NEWUSER) needs a single-threaded process; ThreadSanitizer's runtime runs a thread";
#endif
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run a child as another user";
  SystemDaemon sysd;
  ASSERT_TRUE(sysd.alive());
  Child nobody(true, [](int sock) {
    pid_t server = -1;
    char dir[32] = {};
    void* p = map_stuck_file(&server, dir);
    if (!p) return 21;
    RcEnd me;
    if (!me.open()) return 20;
    ibv_mr* mr = ibv_reg_mr(me.pd, p, kFile, IBV_ACCESS_ON_DEMAND | IBV_ACCESS_REMOTE_READ);
    if (!mr) return 22;
    Target t{me.qp->qp_num, mr->rkey, uint64_t(uintptr_t(p)), server, {}};
    std::memcpy(t.dir, dir, sizeof dir);
    uint32_t peer = 0;
    if (!send_val(sock, t) || !recv_val(sock, peer) || qp_to_rts(me.ctx, me.qp, peer)) return 23;
    int go = 0;
    return send_val(sock, go) && recv_val(sock, go) ? 0 : 24;  // exits when told (its server lives on)
  });
  Child root(false, [](int sock) {
    RcEnd me;
    if (!me.open()) return 10;
    static uint8_t buf[4096];
    ibv_mr* mr = ibv_reg_mr(me.pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE);
    if (!mr) return 11;
    Target t{};
    uint32_t qpn = me.qp->qp_num;
    if (!recv_val(sock, t) || !send_val(sock, qpn) || qp_to_rts(me.ctx, me.qp, t.qpn)) return 12;
    int go = 0;
    if (!recv_val(sock, go)) return 13;
    ibv_sge sge{uint64_t(uintptr_t(buf)), sizeof buf, mr->lkey};
    ibv_send_wr wr{}, *bad = nullptr;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_RDMA_READ;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = t.addr;
    wr.wr.rdma.rkey = t.rkey;
    int posted = 1;
    if (!send_val(sock, posted) || ibv_post_send(me.qp, &wr, &bad)) return 14;
    int exited = 0;
    if (!recv_val(sock, exited)) return 15;  // the registrant's process is gone
    const double t0 = now_ms();
    for (;;) {
      ibv_wc wc{};
      const int n = ibv_poll_cq(me.cq, 1, &wc);
      if (n < 0) return 16;
      if (n == 1) return send_val(sock, ReadDone{int(wc.status), now_ms() - t0}) ? 0 : 17;
      usleep(1000);
    }
  });
  Child third(false, [](int sock) {
    RcEnd me;
    if (!me.open()) return 30;
    static uint8_t buf[4096];
    ibv_mr* mr = ibv_reg_mr(me.pd, buf, sizeof buf, 0);
    Target t{};
    uint32_t qpn = me.qp->qp_num;
    if (!mr || !recv_val(sock, t) || !send_val(sock, qpn) || qp_to_rts(me.ctx, me.qp, t.qpn)) return 31;
    int go = 0;
    if (!send_val(sock, go) || !recv_val(sock, go)) return 32;
    Calls c{0, 0, 0, 0, 0};
    for (const double until = now_ms() + 1500; now_ms() < until; ++c.count) {
      const double t0 = now_ms();
      ibv_pd* pd = ibv_alloc_pd(me.ctx);
      if (!pd || ibv_dealloc_pd(pd)) ++c.failed;
      c.worst_ms = std::max(c.worst_ms, now_ms() - t0);
    }
    for (int i = 0; i < 16; ++i) {  // another user's mediated traffic
      ibv_sge sge{uint64_t(uintptr_t(buf)), sizeof buf, mr->lkey};
      ibv_send_wr wr{}, *bad = nullptr;
      wr.sg_list = &sge;
      wr.num_sge = 1;
      wr.opcode = IBV_WR_RDMA_WRITE;
      wr.send_flags = IBV_SEND_SIGNALED;
      wr.wr.rdma.remote_addr = t.addr;
      wr.wr.rdma.rkey = t.rkey;
      const double t0 = now_ms();
      if (ibv_post_send(me.qp, &wr, &bad)) return 33;
      ibv_wc wc{};
      int n = 0;
      while ((n = ibv_poll_cq(me.cq, 1, &wc)) == 0 && now_ms() - t0 < 5000) {
      }
      if (n != 1 || wc.status != IBV_WC_SUCCESS) ++c.writes_failed;
      c.worst_write_ms = std::max(c.worst_write_ms, now_ms() - t0);
      if (n != 1) break;
    }
    return send_val(sock, c) ? 0 : 34;
  });
  // The fourth client (another nobody process): an ordinary MR the third writes.
  Child fourth(true, [](int sock) {
    RcEnd me;
    if (!me.open()) return 40;
    static uint8_t buf[4096];
    ibv_mr* mr = ibv_reg_mr(me.pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    if (!mr) return 41;
    Target t{me.qp->qp_num, mr->rkey, uint64_t(uintptr_t(buf)), 0, {}};
    uint32_t peer = 0;
    if (!send_val(sock, t) || !recv_val(sock, peer) || qp_to_rts(me.ctx, me.qp, peer)) return 42;
    int done = 0;
    return recv_val(sock, done) ? 0 : 43;
  });
  nobody.start();
  root.start();
  third.start();
  fourth.start();
  Target t4{};
  ASSERT_TRUE(recv_val(fourth.sock(), t4)) << "the fourth client failed: exit " << fourth.wait();
  ASSERT_TRUE(send_val(third.sock(), t4));
  uint32_t qpn3 = 0;
  ASSERT_TRUE(recv_val(third.sock(), qpn3)) << "the third client failed: exit " << third.wait();
  ASSERT_TRUE(send_val(fourth.sock(), qpn3));
  Target t{};
  ASSERT_TRUE(recv_val(nobody.sock(), t)) << "nobody failed: exit " << nobody.wait();
  ASSERT_TRUE(send_val(root.sock(), t));
  uint32_t qpn = 0;
  ASSERT_TRUE(recv_val(root.sock(), qpn)) << "root failed: exit " << root.wait();
  ASSERT_TRUE(send_val(nobody.sock(), qpn));
  int go = 0;
  ASSERT_TRUE(recv_val(nobody.sock(), go)) << "nobody failed: exit " << nobody.wait();
  ASSERT_TRUE(recv_val(third.sock(), go)) << "the third client failed: exit " << third.wait();
  ASSERT_TRUE(send_val(root.sock(), go));
  ASSERT_TRUE(recv_val(root.sock(), go)) << "root failed: exit " << root.wait();
  usleep(200 * 1000);  // the READ is with the daemon, faulting on the file
  ASSERT_TRUE(send_val(third.sock(), go));
  Calls c{-1, 0, 0, -1, 0};
  const bool answered = recv_within(third.sock(), c, 8000);
  // nobody's process exits; its FUSE server does not.
  ASSERT_TRUE(send_val(nobody.sock(), go));
  EXPECT_EQ(0, nobody.wait());
  ASSERT_TRUE(send_val(root.sock(), go));
  ReadDone r{-1, 0};
  const bool completed = recv_within(root.sock(), r, 5000);
  // The daemon stops on SIGTERM though a copy of its is still stuck.
  bool stopped = false;
  if (sysd.alive() && kill(sysd.pid, SIGTERM) == 0)
    for (const double until = now_ms() + 5000; !(stopped = !sysd.alive()) && now_ms() < until;) usleep(10 * 1000);
  // Whatever happened, the stuck fault ends with the server.
  kill(t.server, SIGKILL);
  t.dir[sizeof t.dir - 1] = 0;
  if (std::strncmp(t.dir, "/tmp/svfuse-", 12) == 0 && rmdir(t.dir) != 0) std::perror(t.dir);
  EXPECT_TRUE(answered) << "the daemon answered no control call of a third client within 8 s while another "
                           "user's ODP memory faulted on a FUSE page that never came";
  EXPECT_EQ(0, c.failed);
  EXPECT_LT(c.worst_ms, 500.0) << "a control call of a third client waited " << c.worst_ms << " ms";
  EXPECT_EQ(0, c.writes_failed) << "mediated WRITEs between two other clients failed";
  EXPECT_LT(c.worst_write_ms, 500.0) << "a mediated WRITE between two other clients took " << c.worst_write_ms << " ms";
  EXPECT_TRUE(completed) << "root's READ did not complete within 5 s of the registrant's exit";
  EXPECT_NE(IBV_WC_SUCCESS, r.status);
#if defined(__SANITIZE_ADDRESS__)
  // Under AddressSanitizer the daemon's exit runs LeakSanitizer, which stops
  // every thread (ptrace) to scan them; the copy's thread, stuck in the
  // kernel's fault, cannot stop, so that exit waits: not the daemon's code.
  if (!stopped) std::fprintf(stderr, "(ASan build: the daemon's exit waits in LeakSanitizer's stop of the stuck thread)\n");
#else
  EXPECT_TRUE(stopped) << "the daemon did not stop within 5 s of SIGTERM while a copy of ODP memory was stuck";
#endif
  root.wait();  // its READ may have no completion: the daemon is gone
  EXPECT_EQ(0, third.wait());
  send_val(fourth.sock(), go);
  EXPECT_EQ(0, fourth.wait());
}

// The same page as an atomic's result buffer: nobody FETCH_ADDs root's
// ordinary MR with its result landing in its stuck ODP page. The atomic
// itself is the daemon's to carry on root's page; the 8 bytes of result
// must not be written on the loop, which would wait for the page.
TEST(OdpFuse, AnAtomicResultIntoAStuckPageStallsNoOneElse) {
#if defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "the attacker's unshare(CLONE_NEWUSER) needs a single-threaded process; ThreadSanitizer's runtime runs a thread";
#endif
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run a child as another user";
  SystemDaemon sysd;
  ASSERT_TRUE(sysd.alive());
  Child root(false, [](int sock) {
    RcEnd me;
    if (!me.open()) return 10;
    static uint64_t word[512];
    ibv_mr* mr = ibv_reg_mr(me.pd, word, sizeof word, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_ATOMIC);
    if (!mr) return 11;
    ibv_qp_attr a{};
    a.qp_access_flags = IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC;
    if (ibv_modify_qp(me.qp, &a, IBV_QP_ACCESS_FLAGS)) return 12;
    Target t{me.qp->qp_num, mr->rkey, uint64_t(uintptr_t(word)), 0, {}};
    uint32_t peer = 0;
    if (!send_val(sock, t) || !recv_val(sock, peer) || qp_to_rts(me.ctx, me.qp, peer)) return 13;
    int done = 0;
    return recv_val(sock, done) ? 0 : 14;
  });
  Child nobody(true, [](int sock) {
    pid_t server = -1;
    char dir[32] = {};
    void* p = map_stuck_file(&server, dir, true);
    if (!p) return 21;
    RcEnd me;
    if (!me.open()) return 20;
    ibv_mr* mr = ibv_reg_mr(me.pd, p, kFile, IBV_ACCESS_ON_DEMAND | IBV_ACCESS_LOCAL_WRITE);
    if (!mr) return 22;
    Target t{};
    uint32_t qpn = me.qp->qp_num;
    if (!recv_val(sock, t) || !send_val(sock, qpn) || qp_to_rts(me.ctx, me.qp, t.qpn)) return 23;
    ibv_sge sge{uint64_t(uintptr_t(p)), 8, mr->lkey};
    ibv_send_wr wr{}, *bad = nullptr;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.atomic.remote_addr = t.addr;
    wr.wr.atomic.rkey = t.rkey;
    wr.wr.atomic.compare_add = 1;
    Target mine{0, 0, 0, server, {}};
    std::memcpy(mine.dir, dir, sizeof dir);
    if (!send_val(sock, mine) || ibv_post_send(me.qp, &wr, &bad)) return 24;
    int done = 0;
    return recv_val(sock, done) ? 0 : 25;
  });
  Child third(false, [](int sock) {
    ibv_context* ctx = open_dev();
    if (!ctx) return 30;
    int go = 0;
    if (!send_val(sock, go) || !recv_val(sock, go)) return 31;
    Calls c{0, 0, 0, 0, 0};
    for (const double until = now_ms() + 1000; now_ms() < until; ++c.count) {
      const double t0 = now_ms();
      ibv_pd* pd = ibv_alloc_pd(ctx);
      if (!pd || ibv_dealloc_pd(pd)) ++c.failed;
      c.worst_ms = std::max(c.worst_ms, now_ms() - t0);
    }
    return send_val(sock, c) ? 0 : 32;
  });
  root.start();
  nobody.start();
  third.start();
  Target t{};
  ASSERT_TRUE(recv_val(root.sock(), t)) << "root failed: exit " << root.wait();
  ASSERT_TRUE(send_val(nobody.sock(), t));
  uint32_t qpn = 0;
  ASSERT_TRUE(recv_val(nobody.sock(), qpn)) << "nobody failed: exit " << nobody.wait();
  ASSERT_TRUE(send_val(root.sock(), qpn));
  Target mine{};
  ASSERT_TRUE(recv_val(nobody.sock(), mine)) << "nobody failed: exit " << nobody.wait();
  int go = 0;
  ASSERT_TRUE(recv_val(third.sock(), go)) << "the third client failed: exit " << third.wait();
  usleep(200 * 1000);  // the atomic is with the daemon
  ASSERT_TRUE(send_val(third.sock(), go));
  Calls c{-1, 0, 0, 0, 0};
  const bool answered = recv_within(third.sock(), c, 8000);
  kill(mine.server, SIGKILL);
  mine.dir[sizeof mine.dir - 1] = 0;
  if (std::strncmp(mine.dir, "/tmp/svfuse-", 12) == 0 && rmdir(mine.dir) != 0) std::perror(mine.dir);
  EXPECT_TRUE(answered) << "the daemon answered no control call of a third client within 8 s while it wrote an "
                           "atomic's result into a FUSE page that never came";
  EXPECT_EQ(0, c.failed);
  EXPECT_LT(c.worst_ms, 500.0) << "a control call of a third client waited " << c.worst_ms << " ms";
  send_val(nobody.sock(), go);
  send_val(root.sock(), go);
  EXPECT_EQ(0, nobody.wait());
  EXPECT_EQ(0, root.wait());
  EXPECT_EQ(0, third.wait());
  EXPECT_TRUE(sysd.alive()) << "the daemon died";
}

// A thread of the daemon's stays with each copy stuck on a fault, after
// its registrant is gone. nobody's registrants, one process after another,
// each register the stuck page and exit while root READs it: the threads
// the daemon keeps for them stay within the per-user bound
// (daemon/odp_copies.h), however many processes nobody makes.
int daemon_threads(pid_t pid) {
  std::FILE* f = std::fopen(("/proc/" + std::to_string(pid) + "/status").c_str(), "r");
  if (!f) return -1;
  char line[256];
  int n = -1;
  while (std::fgets(line, sizeof line, f))
    if (std::sscanf(line, "Threads: %d", &n) == 1) break;
  std::fclose(f);
  return n;
}

TEST(OdpFuse, StuckCopiesOfOneUserHoldBoundedThreads) {
#if defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "the attacker's unshare(CLONE_NEWUSER) needs a single-threaded process; ThreadSanitizer's runtime runs a thread";
#endif
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run a child as another user";
  constexpr int kRounds = 8;
  SystemDaemon sysd;
  ASSERT_TRUE(sysd.alive());
  Child nobody(true, [](int sock) {
    pid_t server = -1;
    char dir[32] = {};
    void* p = map_stuck_file(&server, dir);
    if (!p) return 21;
    Target cleanup{0, 0, 0, server, {}};
    std::memcpy(cleanup.dir, dir, sizeof dir);
    if (!send_val(sock, cleanup)) return 22;
    for (int i = 0; i < kRounds; ++i) {
      const pid_t reg = fork();  // a registrant process: the library opened only here
      if (reg == 0) {
        RcEnd me;
        ibv_mr* mr = me.open() ? ibv_reg_mr(me.pd, p, kFile, IBV_ACCESS_ON_DEMAND | IBV_ACCESS_REMOTE_READ) : nullptr;
        if (!mr) _exit(23);
        Target t{me.qp->qp_num, mr->rkey, uint64_t(uintptr_t(p)), 0, {}};
        uint32_t peer = 0;
        if (!send_val(sock, t) || !recv_val(sock, peer) || qp_to_rts(me.ctx, me.qp, peer)) _exit(24);
        int go = 0;
        _exit(send_val(sock, go) && recv_val(sock, go) ? 0 : 25);  // exits when told
      }
      if (wait_for(reg) != 0) return 26;
    }
    return 0;
  });
  Child root(false, [](int sock) {
    static uint8_t buf[4096];
    for (int i = 0; i < kRounds; ++i) {
      auto* me = new RcEnd;  // kept: its READ is still with the daemon
      ibv_mr* mr = me->open() ? ibv_reg_mr(me->pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE) : nullptr;
      Target t{};
      uint32_t qpn = mr ? me->qp->qp_num : 0;
      if (!mr || !recv_val(sock, t) || !send_val(sock, qpn) || qp_to_rts(me->ctx, me->qp, t.qpn)) return 10;
      int go = 0;
      if (!recv_val(sock, go)) return 11;
      ibv_sge sge{uint64_t(uintptr_t(buf)), sizeof buf, mr->lkey};
      ibv_send_wr wr{}, *bad = nullptr;
      wr.sg_list = &sge;
      wr.num_sge = 1;
      wr.opcode = IBV_WR_RDMA_READ;
      wr.wr.rdma.remote_addr = t.addr;
      wr.wr.rdma.rkey = t.rkey;
      // Said first: the post may return only once the copy is over.
      if (!send_val(sock, go) || ibv_post_send(me->qp, &wr, &bad)) return 12;
    }
    int done = 0;
    return recv_val(sock, done) ? 0 : 14;
  });
  nobody.start();
  root.start();
  Target cleanup{};
  ASSERT_TRUE(recv_val(nobody.sock(), cleanup)) << "nobody failed: exit " << nobody.wait();
  const int before = daemon_threads(sysd.pid);
  int peak = before;
  for (int i = 0; i < kRounds; ++i) {
    Target t{};
    ASSERT_TRUE(recv_val(nobody.sock(), t)) << "round " << i << ": nobody failed: exit " << nobody.wait();
    ASSERT_TRUE(send_val(root.sock(), t));
    uint32_t qpn = 0;
    ASSERT_TRUE(recv_val(root.sock(), qpn)) << "root failed: exit " << root.wait();
    ASSERT_TRUE(send_val(nobody.sock(), qpn));
    int go = 0;
    ASSERT_TRUE(recv_val(nobody.sock(), go)) << "round " << i << ": the registrant failed";
    ASSERT_TRUE(send_val(root.sock(), go));
    ASSERT_TRUE(recv_val(root.sock(), go)) << "root failed: exit " << root.wait();
    usleep(200 * 1000);  // the READ is with the daemon, faulting on the page
    peak = std::max(peak, daemon_threads(sysd.pid));
    ASSERT_TRUE(send_val(nobody.sock(), go));  // the registrant exits; the fault does not end
  }
  EXPECT_EQ(0, nobody.wait());
  usleep(200 * 1000);
  peak = std::max(peak, daemon_threads(sysd.pid));
  const int go = 1;
  send_val(root.sock(), go);
  kill(cleanup.server, SIGKILL);
  cleanup.dir[sizeof cleanup.dir - 1] = 0;
  if (std::strncmp(cleanup.dir, "/tmp/svfuse-", 12) == 0 && rmdir(cleanup.dir) != 0) std::perror(cleanup.dir);
  root.wait();
  std::fprintf(stderr, "the daemon ran %d threads before, %d at most over %d stuck registrants\n", before, peak,
               kRounds);
  EXPECT_LE(peak - before, 4) << "threads the daemon kept for one user's stuck copies";
}

}  // namespace
}  // namespace odp_fuse_test
}  // namespace svsec
