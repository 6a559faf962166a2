// Finding 6 (issue 18): a peer can crash you. A process maps the backing
// file of a peer it is connected to (same user; the daemon itself between
// users, for atomics), and the daemon's segments (QP, CQ, SRQ, regions) are
// mapped by several processes. A file that its holder can shrink under
// those mappings turns the next access into SIGBUS. The daemon accepts a
// backing only if it is a memfd sealed against shrinking (for good:
// F_SEAL_SEAL) and registers memory only within its current size; it seals
// its own segments at their size.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>

#include "attack.h"

#ifndef F_SEAL_FUTURE_WRITE
#define F_SEAL_FUTURE_WRITE 0x0010
#endif

namespace svsec {
namespace {

using sv::proto::Op;

// A request on a connection this process already holds (the library's own
// command socket, ibv_context::cmd_fd): what a hostile client sends beside
// the library. Returns the reply's status, -1 if the daemon hung up.
template <class Req, class Rep>
int raw_on(int sock, Op op, Req& r, Rep& rep, std::span<const int> fds = {}, std::vector<sv::Fd>* got = nullptr) {
  static uint32_t seq = 0x40000000;
  sv::proto::init_header(r, op, ++seq);
  if (sv::send_message(sock, &r, sizeof(r), fds) != 0) return -1;
  uint8_t buf[sv::proto::kMaxMessage];
  for (;;) {
    size_t n = 0;
    std::vector<sv::Fd> fdv;
    if (sv::recv_message(sock, buf, sizeof(buf), &n, fdv) != 0 || n < sizeof(sv::proto::Header)) return -1;
    sv::proto::Header h;
    std::memcpy(&h, buf, sizeof(h));
    if (h.seq == 0 && h.op == uint16_t(Op::AsyncEvent)) continue;
    if (got) *got = std::move(fdv);
    std::memcpy(&rep, buf, std::min(n, sizeof(rep)));
    return h.status;
  }
}

// An RC QP of this process's own (library) context, in INIT.
struct Rc {
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  ibv_cq* cq = nullptr;
  ibv_qp* qp = nullptr;

  bool open() {
    ctx = open_dev();
    if (!ctx || !(pd = ibv_alloc_pd(ctx)) || !(cq = ibv_create_cq(ctx, 64, nullptr, nullptr, 0))) return false;
    ibv_qp_init_attr ia{};
    ia.send_cq = cq;
    ia.recv_cq = cq;
    ia.qp_type = IBV_QPT_RC;
    ia.cap.max_send_wr = ia.cap.max_recv_wr = 16;
    ia.cap.max_send_sge = ia.cap.max_recv_sge = 1;
    if (!(qp = ibv_create_qp(pd, &ia))) return false;
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.port_num = 1;
    a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
    return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) == 0;
  }

  bool connect(uint32_t dest) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = IBV_MTU_1024;
    a.dest_qp_num = dest;
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 1;
    a.ah_attr.is_global = 1;
    a.ah_attr.grh.hop_limit = 1;
    ibv_query_gid(ctx, 1, 0, &a.ah_attr.grh.dgid);
    a.ah_attr.port_num = 1;
    if (ibv_modify_qp(qp, &a,
                      IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                          IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
      return false;
    ibv_qp_attr r{};
    r.qp_state = IBV_QPS_RTS;
    r.timeout = 14;
    r.retry_cnt = 7;
    r.rnr_retry = 7;
    r.max_rd_atomic = 1;
    return ibv_modify_qp(qp, &r,
                         IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                             IBV_QP_MAX_QP_RD_ATOMIC) == 0;
  }

  // One signaled work request; its completion status (-1: none came).
  int post(ibv_wr_opcode op, void* local, uint32_t len, uint32_t lkey, uint64_t raddr, uint32_t rkey) {
    ibv_sge sge{reinterpret_cast<uintptr_t>(local), len, lkey};
    ibv_send_wr wr{}, *bad = nullptr;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = op;
    wr.send_flags = IBV_SEND_SIGNALED;
    if (op == IBV_WR_ATOMIC_FETCH_AND_ADD) {
      wr.wr.atomic.remote_addr = raddr;
      wr.wr.atomic.rkey = rkey;
      wr.wr.atomic.compare_add = 1;
    } else {
      wr.wr.rdma.remote_addr = raddr;
      wr.wr.rdma.rkey = rkey;
    }
    if (ibv_post_send(qp, &wr, &bad)) return -1;
    for (int spins = 0; spins < 50'000'000; ++spins) {
      ibv_wc wc{};
      int n = ibv_poll_cq(cq, 1, &wc);
      if (n < 0) return -1;
      if (n == 1) return wc.status;
    }
    return -1;
  }
};

// An fd of this process whose /proc/self/fd link names `what`, or -1.
int find_fd(const char* what) {
  for (int fd = 0; fd < 1024; ++fd) {
    char path[64], target[256];
    std::snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
    ssize_t n = readlink(path, target, sizeof(target) - 1);
    if (n <= 0) continue;
    target[n] = 0;
    if (std::strstr(target, what)) return fd;
  }
  return -1;
}

int sealed_memfd(size_t size, unsigned seals) {
  int fd = memfd_create("hostile", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0 || ftruncate(fd, off_t(size)) != 0) return -1;
  if (seals && fcntl(fd, F_ADD_SEALS, seals) != 0) return -1;
  return fd;
}

constexpr uint32_t kAll = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                          IBV_ACCESS_REMOTE_ATOMIC;

// A hostile raw client offers the daemon backings a holder could shrink or
// that the daemon could not write: each is refused. A memfd sealed for good
// against shrinking is accepted, but only registered within its size.
TEST(Backing, RegBackingRefusesFilesAPeerCouldShrink) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run a child as another user";
  SystemDaemon sysd;
  enum { kUnsealed, kNoSealing, kShrinkNotFinal, kRegular, kPipe, kReadOnly, kWriteSealed, kDaemonSegment, kGood,
         kMrInside, kMrPastEnd, kMrBeyond, kN };
  struct Result {
    int st[kN];
  };
  const std::string path = sysd.socket();
  Child nobody(true, [path](int sock) {
    Result r{};
    RawConn raw(path);
    sv::proto::Empty hello{};
    sv::proto::HelloReply hr{};
    if (!raw.ok() || raw.call(Op::Hello, hello, hr) != 0) return 2;
    sv::proto::Empty apd{};
    sv::proto::HandleReply pd{};
    if (raw.call(Op::AllocPd, apd, pd) != 0) return 3;
    auto offer = [&](int fd) {
      if (fd < 0) return -2;
      sv::proto::Empty req{};
      sv::proto::HandleReply rep{};
      int fds[1] = {fd};
      int st = raw.call(Op::RegBacking, req, rep, fds);
      return st;
    };
    r.st[kUnsealed] = offer(sealed_memfd(1 << 16, 0));
    int plain = memfd_create("plain", MFD_CLOEXEC);  // F_SEAL_SEAL only: never sealable
    r.st[kNoSealing] = plain >= 0 && ftruncate(plain, 1 << 16) == 0 ? offer(plain) : -2;
    r.st[kShrinkNotFinal] = offer(sealed_memfd(1 << 16, F_SEAL_SHRINK));
    char tmpl[] = "/tmp/softverbs-backing-XXXXXX";
    int file = mkstemp(tmpl);
    if (file >= 0) unlink(tmpl);
    r.st[kRegular] = file >= 0 && ftruncate(file, 1 << 16) == 0 ? offer(file) : -2;
    int p[2];
    r.st[kPipe] = pipe(p) == 0 ? offer(p[1]) : -2;
    int good = sealed_memfd(1 << 16, F_SEAL_SHRINK | F_SEAL_SEAL);
    char self[64];
    std::snprintf(self, sizeof(self), "/proc/self/fd/%d", good);
    r.st[kReadOnly] = offer(open(self, O_RDONLY | O_CLOEXEC));
    r.st[kWriteSealed] = offer(sealed_memfd(1 << 16, F_SEAL_SHRINK | F_SEAL_FUTURE_WRITE | F_SEAL_SEAL));
    // A segment of the daemon's (its own CQ's): the daemon would write it as
    // this user's memory.
    sv::proto::CreateCqReq cq{};
    cq.cqe = 16;
    sv::proto::CreateCqReply cqr{};
    std::vector<sv::Fd> cqfd;
    r.st[kDaemonSegment] =
        raw.call(Op::CreateCq, cq, cqr, {}, &cqfd) == 0 && cqfd.size() == 1 ? offer(cqfd[0].get()) : -2;
    sv::proto::Empty breq{};
    sv::proto::HandleReply brep{};
    int fds[1] = {good};
    r.st[kGood] = raw.call(Op::RegBacking, breq, brep, fds);
    auto reg = [&](uint64_t addr, uint64_t len) {
      sv::proto::RegMrReq m{};
      m.pd = pd.handle;
      m.backing = brep.handle;
      m.addr = addr;
      m.length = len;
      m.iova = addr;
      m.access = kAll;
      sv::proto::RegMrReply mr{};
      return raw.call(Op::RegMr, m, mr);
    };
    r.st[kMrInside] = reg(4096, (1 << 16) - 4096);
    r.st[kMrPastEnd] = reg(1 << 15, 1 << 16);  // ends 32 KiB beyond the file
    r.st[kMrBeyond] = reg(1 << 16, 4096);      // wholly beyond it
    return send_val(sock, r) ? 0 : 4;
  });
  ASSERT_TRUE(sysd.alive());
  nobody.start();
  Result r{};
  ASSERT_TRUE(recv_val(nobody.sock(), r)) << "the child failed: exit " << nobody.wait();
  const char* names[kN] = {"unsealed memfd", "memfd without sealing", "F_SEAL_SHRINK without F_SEAL_SEAL",
                           "regular file", "pipe", "read-only memfd", "write-sealed memfd", "the daemon's CQ segment",
                           "sealed memfd",
                           "MR inside", "MR past the end", "MR beyond the end"};
  // EBADF: not of the kind RegBacking takes at all (a tmpfs file), refused before the registry looks.
  for (int i : {kUnsealed, kNoSealing, kShrinkNotFinal, kRegular, kPipe, kReadOnly, kWriteSealed, kDaemonSegment})
    EXPECT_TRUE(r.st[i] == EINVAL || r.st[i] == EPERM || r.st[i] == EBADF) << names[i] << ": status " << r.st[i];
  EXPECT_EQ(0, r.st[kGood]) << names[kGood];
  EXPECT_EQ(0, r.st[kMrInside]) << names[kMrInside];
  EXPECT_EQ(EINVAL, r.st[kMrPastEnd]) << names[kMrPastEnd];
  EXPECT_EQ(EINVAL, r.st[kMrBeyond]) << names[kMrBeyond];
  EXPECT_EQ(0, nobody.wait());
  EXPECT_TRUE(sysd.alive());
}

// The attack as found: root's QP connected to a peer's QP; the peer
// registers memory, tries to pull it from under root (ftruncate to 0 of an
// unsealed backing it got registered, else of its library backing), and
// root reads, writes and adds to the peer's memory. Root must survive (no
// SIGBUS) and so must the daemon, which maps a page for atomics.
void pull_backing_from_under_root(bool peer_is_nobody) {
  SystemDaemon sysd;
  struct PeerInfo {
    uint32_t qpn, rkey;
    uint64_t addr;
    int hostile_status;  // RegBacking of an unsealed memfd (0: accepted)
  };
  struct Truncated {
    int rc, err;
  };
  struct Statuses {
    int read, write, atomic;
  };
  Child root(false, [](int sock) {
    Rc me;
    if (!me.open()) return 10;
    static uint8_t buf[8192] __attribute__((aligned(4096)));
    ibv_mr* mr = ibv_reg_mr(me.pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE);
    if (!mr) return 11;
    uint32_t qpn = me.qp->qp_num;
    PeerInfo peer{};
    if (!send_val(sock, qpn) || !recv_val(sock, peer)) return 12;
    if (!me.connect(peer.qpn)) return 13;
    int ready = 1, go = 0;
    if (!send_val(sock, ready) || !recv_val(sock, go)) return 14;
    Statuses s{};
    s.read = me.post(IBV_WR_RDMA_READ, buf, 4096, mr->lkey, peer.addr, peer.rkey);
    std::memset(buf + 4096, 0xc3, 100);
    s.write = me.post(IBV_WR_RDMA_WRITE, buf + 4096, 100, mr->lkey, peer.addr + 1000, peer.rkey);
    s.atomic = me.post(IBV_WR_ATOMIC_FETCH_AND_ADD, buf + 4200, 8, mr->lkey, peer.addr + 2048, peer.rkey);
    return send_val(sock, s) ? 0 : 15;
  });
  Child peer(peer_is_nobody, [](int sock) {
    Rc me;
    if (!me.open()) return 20;
    PeerInfo info{};
    info.qpn = me.qp->qp_num;
    // The hostile registration: an unsealed memfd, sent beside the library
    // on its own connection, registered over its whole length.
    int hostile = memfd_create("hostile", MFD_CLOEXEC);
    if (hostile < 0 || ftruncate(hostile, 1 << 16) != 0) return 21;
    sv::proto::Empty req{};
    sv::proto::HandleReply rep{};
    int fds[1] = {hostile};
    info.hostile_status = raw_on(me.ctx->cmd_fd, Op::RegBacking, req, rep, fds);
    static uint8_t buf[1 << 16] __attribute__((aligned(4096)));
    for (size_t i = 0; i < sizeof(buf); ++i) buf[i] = uint8_t(i * 13 + 1);
    if (info.hostile_status == 0) {
      sv::proto::RegMrReq m{};
      m.pd = me.pd->handle;
      m.backing = rep.handle;
      m.addr = 0;
      m.length = 1 << 16;
      m.iova = 0;
      m.access = kAll;
      sv::proto::RegMrReply mr{};
      if (raw_on(me.ctx->cmd_fd, Op::RegMr, m, mr) != 0) return 22;
      info.rkey = mr.key;
      info.addr = 0;
    } else {
      ibv_mr* mr = ibv_reg_mr(me.pd, buf, sizeof(buf), kAll);
      if (!mr) return 23;
      info.rkey = mr->rkey;
      info.addr = reinterpret_cast<uintptr_t>(buf);
    }
    uint32_t root_qpn = 0;
    if (!send_val(sock, info) || !recv_val(sock, root_qpn)) return 24;
    if (!me.connect(root_qpn)) return 25;
    // Pull the memory from under root.
    int backing = info.hostile_status == 0 ? hostile : find_fd("memfd:softverbs-backing");
    Truncated t{-2, 0};
    if (backing >= 0) {
      t.rc = ftruncate(backing, 0);
      t.err = t.rc ? errno : 0;
    }
    int done = 0;
    if (!send_val(sock, t) || !recv_val(sock, done)) return 26;
    return 0;
  });
  ASSERT_TRUE(sysd.alive());
  root.start();
  peer.start();
  uint32_t root_qpn = 0;
  ASSERT_TRUE(recv_val(root.sock(), root_qpn)) << "root failed: exit " << root.wait();
  PeerInfo info{};
  ASSERT_TRUE(recv_val(peer.sock(), info)) << "the peer failed: exit " << peer.wait();
  EXPECT_TRUE(info.hostile_status == EINVAL || info.hostile_status == EPERM)
      << "an unsealed backing was accepted: status " << info.hostile_status;
  ASSERT_TRUE(send_val(root.sock(), info));
  ASSERT_TRUE(send_val(peer.sock(), root_qpn));
  int ready = 0;
  ASSERT_TRUE(recv_val(root.sock(), ready)) << "root failed: exit " << root.wait();
  Truncated t{};
  ASSERT_TRUE(recv_val(peer.sock(), t)) << "the peer failed: exit " << peer.wait();
  EXPECT_EQ(-1, t.rc) << "the peer shrank the backing root maps";
  EXPECT_EQ(EPERM, t.err);
  ASSERT_TRUE(send_val(root.sock(), ready));
  Statuses s{-1, -1, -1};
  bool got = recv_val(root.sock(), s);
  EXPECT_EQ(0, root.wait()) << "root's process died (128 + SIGBUS = " << 128 + SIGBUS << ")";
  EXPECT_TRUE(got);
  EXPECT_EQ(IBV_WC_SUCCESS, s.read);
  EXPECT_EQ(IBV_WC_SUCCESS, s.write);
  EXPECT_EQ(IBV_WC_SUCCESS, s.atomic);
  int done = 1;
  send_val(peer.sock(), done);
  EXPECT_EQ(0, peer.wait());
  EXPECT_TRUE(sysd.alive()) << "the daemon died";
}

TEST(Backing, AnotherUserCannotPullItsMemoryFromUnderRoot) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run a child as another user";
  pull_backing_from_under_root(true);
}

TEST(Backing, ASameUserPeerCannotPullItsMemoryFromUnderYou) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root";
  pull_backing_from_under_root(false);
}

// The daemon's own segments (CQ, QP, SRQ) are mapped by every holder: they
// are sealed at their size, and another user cannot reopen them writable
// through /proc/self/fd (owner-only mode).
TEST(Backing, DaemonSegmentsCannotBeResized) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run a child as another user";
  SystemDaemon sysd;
  const std::string path = sysd.socket();
  struct Seg {
    int seals, trunc_err, grow_err, reopen_err, mode;
  };
  struct Result {
    Seg cq, qp, srq;
  };
  Child nobody(true, [path](int sock) {
    RawConn raw(path);
    sv::proto::Empty hello{};
    sv::proto::HelloReply hr{};
    if (!raw.ok() || raw.call(Op::Hello, hello, hr) != 0) return 2;
    sv::proto::Empty apd{};
    sv::proto::HandleReply pd{};
    if (raw.call(Op::AllocPd, apd, pd) != 0) return 3;
    auto inspect = [](int fd) {
      Seg s{};
      s.seals = fcntl(fd, F_GET_SEALS);
      struct stat st {};
      fstat(fd, &st);
      s.mode = int(st.st_mode & 0777);
      s.trunc_err = ftruncate(fd, 0) == 0 ? 0 : errno;
      s.grow_err = ftruncate(fd, st.st_size + (1 << 20)) == 0 ? 0 : errno;
      char self[64];
      std::snprintf(self, sizeof(self), "/proc/self/fd/%d", fd);
      int re = open(self, O_RDWR | O_CLOEXEC);
      s.reopen_err = re >= 0 ? 0 : errno;
      if (re >= 0) close(re);
      return s;
    };
    Result r{};
    sv::proto::CreateCqReq cq{};
    cq.cqe = 16;
    sv::proto::CreateCqReply cqr{};
    std::vector<sv::Fd> fds;
    if (raw.call(Op::CreateCq, cq, cqr, {}, &fds) != 0 || fds.size() != 1) return 4;
    r.cq = inspect(fds[0].get());
    sv::proto::CreateQpReq qp{};
    qp.pd = pd.handle;
    qp.send_cq = qp.recv_cq = cqr.handle;
    qp.qp_type = IBV_QPT_RC;
    qp.max_send_wr = qp.max_recv_wr = 8;
    qp.max_send_sge = qp.max_recv_sge = 1;
    sv::proto::CreateQpReply qpr{};
    if (raw.call(Op::CreateQp, qp, qpr, {}, &fds) != 0 || fds.size() != 1) return 5;
    r.qp = inspect(fds[0].get());
    sv::proto::CreateSrqReq srq{};
    srq.pd = pd.handle;
    srq.max_wr = 8;
    srq.max_sge = 1;
    srq.srq_type = IBV_SRQT_BASIC;
    sv::proto::CreateSrqReply srqr{};
    if (raw.call(Op::CreateSrq, srq, srqr, {}, &fds) != 0 || fds.size() != 1) return 6;
    r.srq = inspect(fds[0].get());
    return send_val(sock, r) ? 0 : 7;
  });
  ASSERT_TRUE(sysd.alive());
  nobody.start();
  Result r{};
  ASSERT_TRUE(recv_val(nobody.sock(), r)) << "the child failed: exit " << nobody.wait();
  for (auto [name, s] : {std::pair{"CQ", r.cq}, std::pair{"QP", r.qp}, std::pair{"SRQ", r.srq}}) {
    EXPECT_EQ(F_SEAL_SHRINK | F_SEAL_GROW, s.seals & (F_SEAL_SHRINK | F_SEAL_GROW)) << name;
    EXPECT_EQ(EPERM, s.trunc_err) << name << " shrank";
    EXPECT_EQ(EPERM, s.grow_err) << name << " grew";
    EXPECT_EQ(EACCES, s.reopen_err) << name << " reopened writable by another user";
    EXPECT_EQ(0600, s.mode) << name;
  }
  EXPECT_EQ(0, nobody.wait());
  EXPECT_TRUE(sysd.alive());
}


// The mediated path (root's QP connected to another user's: the daemon
// carries out root's requests): a WRITE with a bad R_Key completes with a
// remote access error at root, and the responder's QP, nobody's, goes to
// ERR and raises its affiliated event, a local access violation
// (IBV_EVENT_QP_ACCESS_ERR, IBTA 11.6.3.1), to nobody's process.
TEST(MediatedResponder, ABadRKeyRaisesTheResponderQpsAccessError) {
  SystemDaemon sysd;
  struct Info {
    uint32_t qpn, rkey;
    uint64_t addr;
  };
  struct Seen {
    int event, mine, state;
  };
  Child root(false, [](int sock) {
    Rc me;
    if (!me.open()) return 10;
    static uint8_t buf[4096] __attribute__((aligned(4096)));
    ibv_mr* mr = ibv_reg_mr(me.pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE);
    if (!mr) return 11;
    uint32_t qpn = me.qp->qp_num;
    Info peer{};
    if (!send_val(sock, qpn) || !recv_val(sock, peer)) return 12;
    if (!me.connect(peer.qpn)) return 13;
    int status = me.post(IBV_WR_RDMA_WRITE, buf, 64, mr->lkey, peer.addr, peer.rkey ^ 0x100);
    return send_val(sock, status) ? 0 : 14;
  });
  Child nobody(true, [](int sock) {
    Rc me;
    if (!me.open()) return 20;
    static uint8_t buf[4096] __attribute__((aligned(4096)));
    ibv_mr* mr = ibv_reg_mr(me.pd, buf, sizeof(buf), kAll);
    if (!mr) return 21;
    Info info{me.qp->qp_num, mr->rkey, reinterpret_cast<uintptr_t>(buf)};
    uint32_t root_qpn = 0;
    if (!send_val(sock, info) || !recv_val(sock, root_qpn)) return 22;
    if (!me.connect(root_qpn)) return 23;
    int ready = 1;
    if (!send_val(sock, ready)) return 24;
    Seen seen{-1, 0, -1};
    pollfd pfd{me.ctx->async_fd, POLLIN, 0};
    ibv_async_event ev{};
    if (::poll(&pfd, 1, 30000) == 1 && ibv_get_async_event(me.ctx, &ev) == 0) {
      seen.event = ev.event_type;
      seen.mine = ev.element.qp == me.qp;
      ibv_ack_async_event(&ev);
    }
    ibv_qp_attr a{};
    ibv_qp_init_attr ia{};
    if (ibv_query_qp(me.qp, &a, IBV_QP_STATE, &ia) == 0) seen.state = a.qp_state;
    return send_val(sock, seen) ? 0 : 25;
  });
  ASSERT_TRUE(sysd.alive());
  root.start();
  nobody.start();
  uint32_t root_qpn = 0;
  ASSERT_TRUE(recv_val(root.sock(), root_qpn)) << "root failed: exit " << root.wait();
  Info info{};
  ASSERT_TRUE(recv_val(nobody.sock(), info)) << "nobody failed: exit " << nobody.wait();
  ASSERT_TRUE(send_val(nobody.sock(), root_qpn));
  int ready = 0;
  ASSERT_TRUE(recv_val(nobody.sock(), ready)) << "nobody failed: exit " << nobody.wait();
  ASSERT_TRUE(send_val(root.sock(), info));
  int status = -1;
  ASSERT_TRUE(recv_val(root.sock(), status)) << "root failed: exit " << root.wait();
  EXPECT_EQ(IBV_WC_REM_ACCESS_ERR, status) << ibv_wc_status_str(ibv_wc_status(status));
  Seen seen{};
  ASSERT_TRUE(recv_val(nobody.sock(), seen)) << "nobody failed: exit " << nobody.wait();
  EXPECT_EQ(IBV_EVENT_QP_ACCESS_ERR, seen.event)
      << (seen.event < 0 ? "no async event" : ibv_event_type_str(ibv_event_type(seen.event)));
  EXPECT_TRUE(seen.mine) << "the event is not of the responder's QP";
  EXPECT_EQ(IBV_QPS_ERR, seen.state);
  EXPECT_EQ(0, root.wait());
  EXPECT_EQ(0, nobody.wait());
  EXPECT_TRUE(sysd.alive());
}

}  // namespace
}  // namespace svsec
