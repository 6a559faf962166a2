// A fair daemon (issue 18, findings 7 and 8): one user's flood of requests
// or events neither drops nor stalls another user's process.
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include "attack.h"

namespace svsec {
namespace {

using sv::proto::Op;

bool raw_to_rtr(RawConn& raw, uint32_t qpn, uint32_t dest);

// A raw RC QP of this connection, in RTR towards `dest` (what a hostile
// client can make without the library). Returns its QPN, 0 on failure.
uint32_t raw_rc_qp_towards(RawConn& raw, uint32_t dest) {
  sv::proto::Empty hello{};
  sv::proto::HelloReply hrep{};
  std::vector<sv::Fd> fds;
  if (raw.call(Op::Hello, hello, hrep, {}, &fds) != 0) return 0;
  sv::proto::Empty e{};
  sv::proto::HandleReply pd{};
  if (raw.call(Op::AllocPd, e, pd) != 0) return 0;
  sv::proto::CreateCqReq cq{};
  cq.cqe = 16;
  sv::proto::CreateCqReply cqrep{};
  if (raw.call(Op::CreateCq, cq, cqrep, {}, &fds) != 0) return 0;
  sv::proto::CreateQpReq q{};
  q.pd = pd.handle;
  q.send_cq = q.recv_cq = cqrep.handle;
  q.qp_type = IBV_QPT_RC;
  q.max_send_wr = q.max_recv_wr = 16;
  q.max_send_sge = q.max_recv_sge = 1;
  sv::proto::CreateQpReply qrep{};
  if (raw.call(Op::CreateQp, q, qrep, {}, &fds) != 0) return 0;
  return raw_to_rtr(raw, qrep.qpn, dest) ? qrep.qpn : 0;
}

// Moves a raw RC QP from RESET through INIT to RTR towards `dest`.
bool raw_to_rtr(RawConn& raw, uint32_t qpn, uint32_t dest) {
  sv::proto::ModifyQpReq m{};
  m.qpn = qpn;
  m.attr_mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
  m.qp_state = IBV_QPS_INIT;
  m.port_num = 1;
  m.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
  if (raw.call(Op::ModifyQp, m) != 0) return false;
  sv::proto::ModifyQpReq r{};
  r.qpn = qpn;
  r.attr_mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
  r.qp_state = IBV_QPS_RTR;
  r.path_mtu = IBV_MTU_1024;
  r.dest_qp_num = dest;
  r.ah_port_num = 1;
  return raw.call(Op::ModifyQp, r) == 0;
}

// Sends `n` copies of `req` (op `op`) pipelined, `window` at a time, and
// reads their replies (and any events); false if the daemon hung up.
int last_status = 0;
template <class Req>
bool flood(RawConn& raw, Op op, Req req, int n, int window = 64) {
  sv::proto::init_header(req, op, 1);
  uint8_t buf[sv::proto::kMaxMessage];
  for (int sent = 0; sent < n;) {
    int batch = std::min(window, n - sent);
    for (int i = 0; i < batch; ++i)
      if (sv::send_message(raw.fd(), &req, sizeof(req), {}) != 0) return false;
    for (int got = 0; got < batch;) {
      size_t len = 0;
      std::vector<sv::Fd> fds;
      if (sv::recv_message(raw.fd(), buf, sizeof(buf), &len, fds) != 0 || len < sizeof(sv::proto::Header))
        return false;
      sv::proto::Header h;
      std::memcpy(&h, buf, sizeof(h));
      if (h.seq != 0) {
        ++got;
        if (h.status != 0) last_status = h.status;
      }
    }
    sent += batch;
  }
  return true;
}

// Finding 7: nobody points a QP at root's QP (root's never points back) and
// asks for root's SRQ limit event 20,000 times while root is not reading
// its socket; root then asks something, and reads only afterwards. Root
// must not be dropped: its reply comes, its objects and its QP's state
// survive, and its next request works. (Root is a raw connection so that
// its request surely meets a full socket; the library would race to drain.)
TEST(Fairness, EventFloodDoesNotDropTheVictim) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run a child as another user";
  SystemDaemon sysd;
  Child nobody(true, [&sysd](int sock) {
    uint32_t ids[2];
    if (!recv_val(sock, ids)) return 2;
    RawConn raw(sysd.socket());
    if (!raw.ok()) return 3;
    if (!raw_rc_qp_towards(raw, ids[0])) return 4;
    sv::proto::HandleReq req{};
    req.handle = ids[1];
    if (!flood(raw, Op::SrqLimit, req, 20000)) return 5;
    int done = 1;
    return send_val(sock, done) ? 0 : 6;
  });
  ASSERT_TRUE(sysd.alive());
  RawConn root(sysd.socket());
  ASSERT_TRUE(root.ok());
  sv::proto::Empty hello{};
  sv::proto::HelloReply hrep{};
  std::vector<sv::Fd> fds;
  ASSERT_EQ(0, root.call(Op::Hello, hello, hrep, {}, &fds));
  sv::proto::Empty e{};
  sv::proto::HandleReply pd{};
  ASSERT_EQ(0, root.call(Op::AllocPd, e, pd));
  sv::proto::CreateCqReq cq{};
  cq.cqe = 16;
  sv::proto::CreateCqReply cqrep{};
  ASSERT_EQ(0, root.call(Op::CreateCq, cq, cqrep, {}, &fds));
  sv::proto::CreateSrqReq sr{};
  sr.pd = pd.handle;
  sr.max_wr = 16;
  sr.max_sge = 1;
  sr.srq_limit = 4;
  sr.srq_type = IBV_SRQT_BASIC;
  sv::proto::CreateSrqReply srep{};
  ASSERT_EQ(0, root.call(Op::CreateSrq, sr, srep, {}, &fds));
  sv::proto::CreateQpReq q{};
  q.pd = pd.handle;
  q.send_cq = q.recv_cq = cqrep.handle;
  q.srq = srep.handle;
  q.qp_type = IBV_QPT_RC;
  q.max_send_wr = 16;
  q.max_send_sge = q.max_recv_sge = 1;
  sv::proto::CreateQpReply qrep{};
  ASSERT_EQ(0, root.call(Op::CreateQp, q, qrep, {}, &fds));

  nobody.start();
  uint32_t ids[2] = {qrep.qpn, srep.handle};
  ASSERT_TRUE(send_val(nobody.sock(), ids));
  int done = 0;
  EXPECT_TRUE(recv_val(nobody.sock(), done));
  EXPECT_EQ(0, nobody.wait());
  // Root's socket holds whatever the flood put there; root asks now, and
  // reads only once the daemon has surely answered: a few round trips of
  // another connection are a few turns of its loop, which serves every
  // readable connection each turn.
  sv::proto::Empty pd2{};
  sv::proto::init_header(pd2, Op::AllocPd, 1000);
  ASSERT_EQ(0, sv::send_message(root.fd(), &pd2, sizeof(pd2), {}));
  RawConn other(sysd.socket());
  ASSERT_TRUE(other.ok());
  sv::proto::Empty st{};
  for (int i = 0; i < 4; ++i) ASSERT_EQ(0, other.call(Op::Status, st));
  uint8_t buf[sv::proto::kMaxMessage];
  sv::proto::Header h{};
  int events = 0;
  for (;;) {
    size_t len = 0;
    std::vector<sv::Fd> f;
    ASSERT_EQ(0, sv::recv_message(root.fd(), buf, sizeof(buf), &len, f));
    ASSERT_GE(len, sizeof(h)) << "dropped by the daemon after " << events << " events";
    std::memcpy(&h, buf, sizeof(h));
    if (h.seq == 0) {
      ++events;
      continue;
    }
    break;
  }
  EXPECT_EQ(1000u, h.seq);
  EXPECT_EQ(0, h.status);
  sv::proto::HandleReq qd{};
  qd.handle = qrep.qpn;
  EXPECT_EQ(0, root.call(Op::DestroyQp, qd));  // still root's: the connection survived
  EXPECT_TRUE(sysd.alive());
}

// The same flood from a sender that may ask for the event (root's own other
// connection, its QP and root's SRQ QP pointing at each other): the events
// pile up for a client that does not read, and are coalesced - one (type,
// element) waits once - instead of dropping it or growing without bound.
TEST(Fairness, RepeatedEventsAreCoalescedNotDropped) {
  SystemDaemon sysd;
  ASSERT_TRUE(sysd.alive());
  RawConn victim(sysd.socket());
  ASSERT_TRUE(victim.ok());
  sv::proto::Empty hello{};
  sv::proto::HelloReply hrep{};
  std::vector<sv::Fd> fds;
  ASSERT_EQ(0, victim.call(Op::Hello, hello, hrep, {}, &fds));
  sv::proto::Empty e{};
  sv::proto::HandleReply pd{};
  ASSERT_EQ(0, victim.call(Op::AllocPd, e, pd));
  sv::proto::CreateCqReq cq{};
  cq.cqe = 16;
  sv::proto::CreateCqReply cqrep{};
  ASSERT_EQ(0, victim.call(Op::CreateCq, cq, cqrep, {}, &fds));
  sv::proto::CreateSrqReq sr{};
  sr.pd = pd.handle;
  sr.max_wr = 16;
  sr.max_sge = 1;
  sr.srq_type = IBV_SRQT_BASIC;
  sv::proto::CreateSrqReply srep{};
  ASSERT_EQ(0, victim.call(Op::CreateSrq, sr, srep, {}, &fds));
  sv::proto::CreateQpReq q{};
  q.pd = pd.handle;
  q.send_cq = q.recv_cq = cqrep.handle;
  q.srq = srep.handle;
  q.qp_type = IBV_QPT_RC;
  q.max_send_wr = 16;
  q.max_send_sge = q.max_recv_sge = 1;
  sv::proto::CreateQpReply qrep{};
  ASSERT_EQ(0, victim.call(Op::CreateQp, q, qrep, {}, &fds));
  RawConn sender(sysd.socket());
  ASSERT_TRUE(sender.ok());
  uint32_t sq = raw_rc_qp_towards(sender, qrep.qpn);
  ASSERT_NE(0u, sq);
  ASSERT_TRUE(raw_to_rtr(victim, qrep.qpn, sq));
  sv::proto::HandleReq req{};
  req.handle = srep.handle;
  last_status = 0;
  ASSERT_TRUE(flood(sender, Op::SrqLimit, req, 20000));
  EXPECT_EQ(0, last_status);  // allowed: the event is the sender's to ask for
  // The victim asks, then reads once its reply surely went out (as in
  // EventFloodDoesNotDropTheVictim).
  sv::proto::Empty pd2{};
  sv::proto::init_header(pd2, Op::AllocPd, 1000);
  ASSERT_EQ(0, sv::send_message(victim.fd(), &pd2, sizeof(pd2), {}));
  sv::proto::Empty st{};
  for (int i = 0; i < 4; ++i) ASSERT_EQ(0, sender.call(Op::Status, st));
  uint8_t buf[sv::proto::kMaxMessage];
  sv::proto::Header h{};
  int events = 0;
  for (;;) {
    size_t len = 0;
    std::vector<sv::Fd> f;
    ASSERT_EQ(0, sv::recv_message(victim.fd(), buf, sizeof(buf), &len, f));
    ASSERT_GE(len, sizeof(h)) << "dropped by the daemon after " << events << " events";
    std::memcpy(&h, buf, sizeof(h));
    if (h.seq == 0) {
      ++events;
      continue;
    }
    break;
  }
  EXPECT_EQ(1000u, h.seq);
  EXPECT_EQ(0, h.status);
  // What the socket held, plus one queued behind it: far fewer than asked.
  EXPECT_GE(events, 1);
  EXPECT_LT(events, 2000);
  EXPECT_TRUE(sysd.alive());
}

// A client that pipelines requests without reading its replies is slowed
// down (the daemon stops reading it), never dropped: every reply arrives.
TEST(Fairness, UnreadRepliesDoNotDropTheClient) {
  SystemDaemon sysd;
  ASSERT_TRUE(sysd.alive());
  RawConn raw(sysd.socket());
  ASSERT_TRUE(raw.ok());
  sv::proto::Empty hello{};
  sv::proto::HelloReply hrep{};
  std::vector<sv::Fd> fds;
  ASSERT_EQ(0, raw.call(Op::Hello, hello, hrep, {}, &fds));
  // 20,000 Status requests written before any reply is read: far more
  // replies than a socket buffer holds. A writer thread, as the socket
  // blocks us too once the daemon stops reading.
  constexpr int kN = 20000;
  std::thread writer([&] {
    sv::proto::Empty st{};
    for (int i = 0; i < kN; ++i) {
      sv::proto::init_header(st, Op::Status, uint32_t(i + 1));
      if (sv::send_message(raw.fd(), &st, sizeof(st), {}) != 0) return;
    }
  });
  // Let the daemon fill our receive buffer before we read anything.
  sv::proto::Empty probe{};
  RawConn other(sysd.socket());
  ASSERT_TRUE(other.ok());
  for (int i = 0; i < 200; ++i) ASSERT_EQ(0, other.call(Op::Status, probe));
  int got = 0;
  uint8_t buf[sv::proto::kMaxMessage];
  while (got < kN) {
    size_t len = 0;
    std::vector<sv::Fd> f;
    if (sv::recv_message(raw.fd(), buf, sizeof(buf), &len, f) != 0 || len == 0) break;
    sv::proto::Header h;
    std::memcpy(&h, buf, sizeof(h));
    if (h.seq == 0) continue;
    EXPECT_EQ(uint32_t(got + 1), h.seq);
    EXPECT_EQ(0, h.status);
    ++got;
  }
  writer.join();
  EXPECT_EQ(kN, got);
  EXPECT_TRUE(sysd.alive());
}

// Finding 8: nobody floods the daemon with mediated 4 MiB writes between
// its own QPs, on two connections, each written without pause by one
// thread while another reads the replies (Mediate), or with no reply to
// read at all (MediatePost: pipelined, as many as the socket takes).
// Meanwhile root's process opens the device, registers memory and
// allocates a PD: it must get through (an alarm makes a starved root a
// failure, not a hang; no time is asserted).
void flood_does_not_stall_another_user(Op op) {
  SystemDaemon sysd;
  Child nobody(true, [&sysd, op](int sock) {
    constexpr int kConns = 2;
    constexpr uint64_t kLen = 4 << 20;  // two of them: nobody's 8 MiB of locked memory
    std::vector<std::unique_ptr<RawConn>> conns;
    sv::proto::MediateReq req[kConns];
    for (int i = 0; i < kConns; ++i) {
      conns.push_back(std::make_unique<RawConn>(sysd.socket()));
      if (!conns.back()->ok() || !raw_mediated_pair(*conns.back(), kLen, req[i])) return 2;
    }
    std::atomic<bool> stop{false};
    std::atomic<long> replies{0}, sent{0};
    std::atomic<int> bad{0};
    std::vector<std::thread> threads;
    for (int i = 0; i < kConns; ++i) {
      threads.emplace_back([&, i] {  // writer
        sv::proto::MediateReq r = req[i];
        // Unsignaled: no completion to fill the CQ (which would move the QPs
        // to ERR and make every later request a cheap flush).
        if (op == Op::MediatePost) r.send_flags &= ~uint32_t(IBV_SEND_SIGNALED);
        // One half onto the other: a copy onto itself may cost nothing.
        r.sge[0].length = uint32_t(kLen / 2);
        r.remote_addr += kLen / 2;
        for (uint32_t seq = 1; !stop.load(); ++seq) {
          sv::proto::init_header(r, op, seq);
          r.epoch = seq;  // each its own run: none is stopped by another's outcome
          if (sv::send_message(conns[i]->fd(), &r, sizeof r, {}) != 0) return;
          sent.fetch_add(1);
        }
      });
      if (op == Op::MediatePost) continue;  // nothing comes back
      threads.emplace_back([&, i] {  // reader
        uint8_t buf[sv::proto::kMaxMessage];
        for (;;) {
          size_t len = 0;
          std::vector<sv::Fd> f;
          if (sv::recv_message(conns[i]->fd(), buf, sizeof buf, &len, f) != 0 || len == 0) return;
          sv::proto::MediateReply rep{};
          std::memcpy(&rep, buf, std::min(len, sizeof rep));
          if (rep.h.seq == 0) continue;
          if (rep.h.status != 0 || rep.outcome != sv::proto::kMediateDone) bad.fetch_add(1);
          replies.fetch_add(1);
        }
      });
    }
    // The flood is under way: replies came, or more requests went than the
    // socket's buffer holds (a few hundred), so the daemon is reading them.
    while (replies.load() < 4 && sent.load() < 1024) usleep(1000);
    int flooding = 1;
    send_val(sock, flooding);
    int done = 0;
    recv_val(sock, done);
    stop.store(true);
    for (auto& c : conns) shutdown(c->fd(), SHUT_RDWR);
    for (auto& t : threads) t.join();
    return bad.load() == 0 ? 0 : 3;
  });
  Child root(false, [](int) {
    alarm(20);
    ibv_context* c = open_dev();
    if (!c) return 2;
    static char buf[4096];
    ibv_pd* pd = ibv_alloc_pd(c);
    if (!pd) return 3;
    ibv_mr* mr = ibv_reg_mr(pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE);
    if (!mr) return 4;
    ibv_pd* pd2 = ibv_alloc_pd(c);
    if (!pd2) return 5;
    ibv_dealloc_pd(pd2);
    ibv_dereg_mr(mr);
    ibv_dealloc_pd(pd);
    ibv_close_device(c);
    return 0;
  });
  ASSERT_TRUE(sysd.alive());
  nobody.start();
  int flooding = 0;
  ASSERT_TRUE(recv_val(nobody.sock(), flooding));
  root.start();
  EXPECT_EQ(0, root.wait());
  int done = 1;
  send_val(nobody.sock(), done);
  EXPECT_EQ(0, nobody.wait());
  EXPECT_TRUE(sysd.alive());
}

TEST(Fairness, MediatedFloodDoesNotStallAnotherUser) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run a child as another user";
  flood_does_not_stall_another_user(Op::Mediate);
}

TEST(Fairness, PipelinedMediatedFloodDoesNotStallAnotherUser) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run a child as another user";
  flood_does_not_stall_another_user(Op::MediatePost);
}

// The copy worker moves the bytes a large mediated WRITE or READ names,
// and only those: 3 MiB + 1 byte (pieces and a remainder) each way within
// one MR, checked byte for byte (and the byte after, untouched); one byte past the MR is still refused
// before any copy.
TEST(Fairness, LargeMediatedCopiesAreExact) {
  SystemDaemon sysd;
  ASSERT_TRUE(sysd.alive());
  RawConn raw(sysd.socket());
  ASSERT_TRUE(raw.ok());
  constexpr uint64_t kHalf = (3 << 20) + 1, kLen = 2 * kHalf + 7;
  sv::proto::MediateReq req{};
  sv::Fd mfd;
  ASSERT_TRUE(raw_mediated_pair(raw, kLen, req, &mfd));
  std::vector<uint8_t> a(kHalf), got(kHalf);
  for (uint64_t i = 0; i < kHalf; ++i) a[i] = uint8_t(i * 7 + (i >> 12));
  ASSERT_EQ(ssize_t(kHalf), pwrite(mfd.get(), a.data(), kHalf, 0));
  // WRITE: [0, kHalf) -> [kHalf, 2 kHalf).
  req.sge[0].addr = 0;
  req.sge[0].length = uint32_t(kHalf);
  req.remote_addr = kHalf;
  sv::proto::MediateReply rep{};
  ASSERT_EQ(0, raw.call(Op::Mediate, req, rep));
  EXPECT_EQ(sv::proto::kMediateDone, rep.outcome);
  EXPECT_EQ(uint32_t(kHalf), rep.byte_len);
  ASSERT_EQ(ssize_t(kHalf), pread(mfd.get(), got.data(), kHalf, kHalf));
  EXPECT_TRUE(got == a);
  // READ back: [kHalf, 2 kHalf) -> [0, kHalf) after clearing it.
  std::vector<uint8_t> zero(kHalf, 0);
  ASSERT_EQ(ssize_t(kHalf), pwrite(mfd.get(), zero.data(), kHalf, 0));
  req.opcode = IBV_WR_RDMA_READ;
  req.remote_addr = kHalf;
  ASSERT_EQ(0, raw.call(Op::Mediate, req, rep));
  EXPECT_EQ(sv::proto::kMediateDone, rep.outcome);
  ASSERT_EQ(ssize_t(kHalf), pread(mfd.get(), got.data(), kHalf, 0));
  EXPECT_TRUE(got == a);
  uint8_t tail = 1;
  ASSERT_EQ(1, pread(mfd.get(), &tail, 1, 2 * kHalf));  // past both halves: untouched
  EXPECT_EQ(0, tail);
  // One byte past the end: refused at once, nothing copied.
  req.opcode = IBV_WR_RDMA_WRITE;
  req.sge[0].addr = 0;
  req.remote_addr = kLen - kHalf + 1;
  ASSERT_EQ(0, raw.call(Op::Mediate, req, rep));
  EXPECT_EQ(sv::proto::kMediateError, rep.outcome);
  EXPECT_EQ(uint32_t(IBV_WC_REM_ACCESS_ERR), rep.wc_status);
  EXPECT_TRUE(sysd.alive());
}

}  // namespace
}  // namespace svsec
