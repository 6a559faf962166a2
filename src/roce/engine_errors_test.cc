// The engine's error paths, RNR, duplicates, UC and UD, on the simulated
// link of engine_sim.h.
#include <gtest/gtest.h>

#include <cstring>
#include <set>

#include "roce/engine_sim.h"

namespace sv::roce {
namespace {

using testsim::rwr;
using testsim::Sim;
using testsim::wr;

constexpr uint64_t kA = 0x100000, kB = 0x200000;

struct Pair {
  Sim sim;
  uint32_t a, b;  // one 64 KiB region on each side, every access
  explicit Pair(QpType t = QpType::kRC, FaultConfig f = {}, uint32_t pmtu = 1024) : sim(t, f, pmtu) {}
  void start() {
    a = sim.nodes[0].mem.add(kA, 65536, kLocalWrite | kRemoteWrite | kRemoteRead | kRemoteAtomic);
    b = sim.nodes[1].mem.add(kB, 65536, kLocalWrite | kRemoteWrite | kRemoteRead | kRemoteAtomic);
    for (size_t i = 0; i < 65536; i++) sim.nodes[0].mem.bytes(a)[i] = uint8_t(i * 7);
    sim.start();
  }
  EngineQp& qa() { return *sim.nodes[0].qp; }
  EngineQp& qb() { return *sim.nodes[1].qp; }
  std::vector<Completion>& ca() { return sim.nodes[0].cq.all; }
  std::vector<Completion>& cb() { return sim.nodes[1].cq.all; }
  bool settle() { return sim.run([] { return false; }); }
};

TEST(RcErrors, RnrNakThenReceivePostedLater) {
  Pair p;
  p.start();
  ASSERT_EQ(0, p.qa().post_send(wr(1, WrOpcode::kSend, p.a, kA, 3000)));
  p.sim.run([] { return false; }, 2'000'000);  // 2 ms of RNR NAKs
  EXPECT_TRUE(p.ca().empty());
  EXPECT_GT(p.qb().stats().rnr_naks_sent, 10u);
  EXPECT_EQ(p.qa().stats().rnr_naks_received, p.qb().stats().rnr_naks_sent);
  p.qb().post_recv(rwr(9, p.b, kB, 4096));
  p.settle();
  ASSERT_EQ(p.ca().size(), 1u);
  EXPECT_EQ(p.ca()[0].status, WcStatus::kSuccess);
  ASSERT_EQ(p.cb().size(), 1u);
  EXPECT_EQ(p.cb()[0].byte_len, 3000u);
  EXPECT_EQ(0, memcmp(p.sim.nodes[1].mem.bytes(p.b).data(), p.sim.nodes[0].mem.bytes(p.a).data(), 3000));
}

TEST(RcErrors, RnrRetryExceeded) {
  Pair p;
  p.sim.cfg[0].rnr_retry = 2;
  p.start();
  ASSERT_EQ(0, p.qa().post_send(wr(1, WrOpcode::kSend, p.a, kA, 100)));
  ASSERT_EQ(0, p.qa().post_send(wr(2, WrOpcode::kWrite, p.a, kA, 100)));
  p.settle();
  ASSERT_EQ(p.ca().size(), 2u);
  EXPECT_EQ(p.ca()[0].status, WcStatus::kRnrRetryExcErr);
  EXPECT_EQ(p.ca()[0].wr_id, 1u);
  EXPECT_EQ(p.ca()[1].status, WcStatus::kWrFlushErr);
  EXPECT_EQ(p.qa().stats().rnr_naks_received, 3u);  // the first try and rnr_retry = 2 more
  EXPECT_EQ(p.qa().state(), EngineState::kError);
  // Posting in the error state completes at once, flushed.
  p.qa().post_send(wr(3, WrOpcode::kSend, p.a, kA, 1));
  ASSERT_EQ(p.ca().size(), 3u);
  EXPECT_EQ(p.ca()[2].status, WcStatus::kWrFlushErr);
}

TEST(RcErrors, RnrTimerFromTable45) {
  Pair p;
  p.sim.cfg[1].min_rnr_timer = 14;  // 1.28 ms
  p.sim.cfg[0].rnr_retry = 1;
  p.start();
  p.qa().post_send(wr(1, WrOpcode::kSend, p.a, kA, 1));
  p.settle();
  ASSERT_EQ(p.ca().size(), 1u);
  EXPECT_EQ(p.ca()[0].status, WcStatus::kRnrRetryExcErr);
  // Two RNR NAKs, one 1.28 ms wait between them, plus a few link delays.
  EXPECT_GE(p.sim.clock.now, 1'280'000u);
  EXPECT_LT(p.sim.clock.now, 1'300'000u);
}

TEST(RcErrors, RetryExceededWhenThePeerIsGone) {
  Pair p(QpType::kRC, FaultConfig{1.0, 0, 0, 0, 1});  // every packet lost
  p.sim.cfg[0].retry_cnt = 3;
  p.start();
  p.qa().post_send(wr(1, WrOpcode::kWrite, p.a, kA, 10));
  p.settle();
  ASSERT_EQ(p.ca().size(), 1u);
  EXPECT_EQ(p.ca()[0].status, WcStatus::kRetryExcErr);
  EXPECT_EQ(p.qa().stats().packets_sent, 4u);          // first try + retry_cnt
  EXPECT_EQ(p.qa().stats().retransmit_timeouts, 4u);
  const uint64_t timeout = 4096ull << 5;
  EXPECT_GE(p.sim.clock.now, 4 * timeout);
  EXPECT_LT(p.sim.clock.now, 4 * timeout + 10000);
}

// A request a fault plan fails (SendWr::fails_with): the WRITEs before it
// land and complete first, it completes with the plan's status without a
// packet of its own, and the QP is in error with the rest flushed.
TEST(RcErrors, PlannedFailureCompletesInOrderAndEndsTheQp) {
  Pair p;
  p.start();
  auto write = [&](uint64_t id) {
    SendWr w = wr(id, WrOpcode::kWrite, p.a, kA, 2000);
    w.remote_addr = kB;
    w.rkey = p.b;
    return w;
  };
  ASSERT_EQ(0, p.qa().post_send(write(1)));
  ASSERT_EQ(0, p.qa().post_send(write(2)));
  SendWr doomed = wr(3, WrOpcode::kSend, p.a, kA, 100);
  doomed.fails_with = WcStatus::kRetryExcErr;
  ASSERT_EQ(0, p.qa().post_send(doomed));
  ASSERT_EQ(0, p.qa().post_send(write(4)));
  p.settle();
  ASSERT_EQ(p.ca().size(), 4u);
  EXPECT_EQ(p.ca()[0].status, WcStatus::kSuccess);
  EXPECT_EQ(p.ca()[1].status, WcStatus::kSuccess);
  EXPECT_EQ(p.ca()[2].wr_id, 3u);
  EXPECT_EQ(p.ca()[2].status, WcStatus::kRetryExcErr);
  EXPECT_EQ(p.ca()[3].status, WcStatus::kWrFlushErr);
  EXPECT_EQ(p.qa().state(), EngineState::kError);
  EXPECT_EQ(p.qa().stats().packets_sent, 4u);  // the two WRITEs' packets only (pmtu 1024)
  EXPECT_TRUE(p.cb().empty());                  // no SEND arrived
  EXPECT_EQ(0, memcmp(p.sim.nodes[1].mem.bytes(p.b).data(), p.sim.nodes[0].mem.bytes(p.a).data(), 2000));
}

TEST(RcErrors, RemoteAccessErrorIsFatalAtBothEnds) {
  Pair p;
  p.start();
  p.qb().post_recv(rwr(7, p.b, kB, 100));
  SendWr w = wr(1, WrOpcode::kWrite, p.a, kA, 100);
  w.remote_addr = kB + 65536 - 50;  // past the end of the region
  w.rkey = p.b;
  p.qa().post_send(w);
  p.qa().post_send(wr(2, WrOpcode::kSend, p.a, kA, 10));
  p.settle();
  ASSERT_EQ(p.ca().size(), 2u);
  EXPECT_EQ(p.ca()[0].status, WcStatus::kRemAccessErr);
  EXPECT_EQ(p.ca()[1].status, WcStatus::kWrFlushErr);
  EXPECT_EQ(p.qb().state(), EngineState::kError);
  // The responder says why, for its affiliated event (IBTA 11.6.3.1); the
  // requester's error was not its responder's.
  EXPECT_EQ(p.qb().responder_fault(), WcStatus::kRemAccessErr);
  EXPECT_EQ(p.qa().responder_fault(), WcStatus::kSuccess);
  ASSERT_EQ(p.cb().size(), 1u);  // the receive is flushed
  EXPECT_EQ(p.cb()[0].status, WcStatus::kWrFlushErr);
  EXPECT_EQ(p.sim.nodes[1].mem.writes, 0u);
}

TEST(RcErrors, QpAccessFlagsAreChecked) {
  for (WrOpcode op : {WrOpcode::kRead, WrOpcode::kWrite, WrOpcode::kFetchAdd}) {
    Pair p;
    p.sim.cfg[1].access = 0;  // the QP allows no remote access at all
    p.start();
    SendWr w = wr(1, op, p.a, kA, op == WrOpcode::kFetchAdd ? 8 : 64);
    w.remote_addr = kB;
    w.rkey = p.b;
    p.qa().post_send(w);
    p.settle();
    ASSERT_EQ(p.ca().size(), 1u);
    EXPECT_EQ(p.ca()[0].status, WcStatus::kRemAccessErr) << int(op);
  }
}

TEST(RcErrors, MisalignedAtomicIsAnInvalidRequest) {
  Pair p;
  p.start();
  SendWr w = wr(1, WrOpcode::kCompareSwap, p.a, kA, 8);
  w.remote_addr = kB + 4;
  w.rkey = p.b;
  p.qa().post_send(w);
  p.settle();
  ASSERT_EQ(p.ca().size(), 1u);
  EXPECT_EQ(p.ca()[0].status, WcStatus::kRemInvReqErr);
  EXPECT_EQ(p.qb().responder_fault(), WcStatus::kRemInvReqErr);
  EXPECT_EQ(p.sim.nodes[1].mem.atomics, 0u);
}

TEST(RcErrors, ReceiveTooSmallIsInvalidRequestThereAndLengthErrorHere) {
  Pair p(QpType::kRC, {}, 256);
  p.start();
  p.qb().post_recv(rwr(7, p.b, kB, 600));
  p.qa().post_send(wr(1, WrOpcode::kSend, p.a, kA, 1000));
  p.settle();
  ASSERT_EQ(p.ca().size(), 1u);
  EXPECT_EQ(p.ca()[0].status, WcStatus::kRemInvReqErr);
  ASSERT_EQ(p.cb().size(), 1u);
  EXPECT_EQ(p.cb()[0].status, WcStatus::kLocLenErr);
  EXPECT_EQ(p.cb()[0].wr_id, 7u);
}

TEST(RcErrors, BadReceiveKeyIsRemoteOperationalError) {
  Pair p;
  p.start();
  p.qb().post_recv(rwr(7, 0xdead, kB, 600));
  p.qa().post_send(wr(1, WrOpcode::kSend, p.a, kA, 100));
  p.settle();
  ASSERT_EQ(p.ca().size(), 1u);
  EXPECT_EQ(p.ca()[0].status, WcStatus::kRemOpErr);
  EXPECT_EQ(p.qb().responder_fault(), WcStatus::kRemOpErr);
  ASSERT_EQ(p.cb().size(), 1u);
  EXPECT_EQ(p.cb()[0].status, WcStatus::kLocProtErr);
}

TEST(RcErrors, BadLocalKeyIsLocalProtectionError) {
  Pair p;
  p.start();
  p.qa().post_send(wr(1, WrOpcode::kSend, 0xbad, kA, 100));
  p.settle();
  ASSERT_EQ(p.ca().size(), 1u);
  EXPECT_EQ(p.ca()[0].status, WcStatus::kLocProtErr);
  EXPECT_EQ(p.qa().stats().packets_sent, 0u);
}

TEST(RcEngineOps, SendWithInvalidateAndUnsignaled) {
  Pair p;
  p.start();
  uint32_t victim = p.sim.nodes[1].mem.add(0x900000, 64, kRemoteWrite);
  p.qb().post_recv(rwr(7, p.b, kB, 100));
  SendWr un = wr(1, WrOpcode::kWrite, p.a, kA, 10);
  un.remote_addr = kB + 1000;
  un.rkey = p.b;
  un.signaled = false;
  p.qa().post_send(un);
  SendWr inv = wr(2, WrOpcode::kSendInv, p.a, kA, 10);
  inv.invalidate_rkey = victim;
  p.qa().post_send(inv);
  p.settle();
  ASSERT_EQ(p.ca().size(), 1u);  // the unsignaled WRITE completes silently
  EXPECT_EQ(p.ca()[0].wr_id, 2u);
  ASSERT_EQ(p.cb().size(), 1u);
  EXPECT_TRUE(p.cb()[0].has_inv);
  EXPECT_EQ(p.cb()[0].invalidated_rkey, victim);
  EXPECT_FALSE(p.sim.nodes[1].mem.remote_check(victim, 0x900000, 8, kRemoteWrite));
  EXPECT_EQ(0, memcmp(p.sim.nodes[1].mem.bytes(p.b).data() + 1000, p.sim.nodes[0].mem.bytes(p.a).data(), 10));
}

TEST(RcEngineOps, CompareAndSwap) {
  Pair p;
  p.start();
  uint64_t v = 41;
  std::memcpy(p.sim.nodes[1].mem.bytes(p.b).data() + 64, &v, 8);
  for (uint64_t cmp : {40, 41}) {
    SendWr w = wr(cmp, WrOpcode::kCompareSwap, p.a, kA + 8 * cmp, 8);
    w.remote_addr = kB + 64;
    w.rkey = p.b;
    w.compare_add = cmp;
    w.swap = 1000 + cmp;
    p.qa().post_send(w);
  }
  p.settle();
  ASSERT_EQ(p.ca().size(), 2u);
  uint64_t o1, o2, now;
  std::memcpy(&o1, p.sim.nodes[0].mem.bytes(p.a).data() + 8 * 40, 8);
  std::memcpy(&o2, p.sim.nodes[0].mem.bytes(p.a).data() + 8 * 41, 8);
  std::memcpy(&now, p.sim.nodes[1].mem.bytes(p.b).data() + 64, 8);
  EXPECT_EQ(o1, 41u);  // no swap: 40 != 41
  EXPECT_EQ(o2, 41u);  // swapped
  EXPECT_EQ(now, 1041u);
}

// Captures the first packet with `opcode` arriving at node 1.
struct Capture {
  std::vector<uint8_t> pkt;
  void attach(Sim& sim, uint8_t opcode) {
    sim.nodes[1].tap = [this, opcode](std::vector<uint8_t>& b) {
      if (pkt.empty() && !b.empty() && b[0] == opcode) pkt = b;
    };
  }
};

TEST(RcDuplicates, WriteIsAcknowledgedNotExecutedAgain) {
  Pair p;
  p.start();
  Capture cap;
  cap.attach(p.sim, op::kWriteOnly);
  SendWr w = wr(1, WrOpcode::kWrite, p.a, kA, 32);
  w.remote_addr = kB;
  w.rkey = p.b;
  p.qa().post_send(w);
  p.settle();
  ASSERT_FALSE(cap.pkt.empty());
  std::memset(p.sim.nodes[1].mem.bytes(p.b).data(), 0xee, 32);
  const uint64_t writes = p.sim.nodes[1].mem.writes, acks = p.qb().stats().acks_sent;
  p.qb().receive(cap.pkt, 0);
  p.settle();
  EXPECT_EQ(p.sim.nodes[1].mem.writes, writes);
  EXPECT_EQ(p.sim.nodes[1].mem.bytes(p.b)[0], 0xee);
  EXPECT_EQ(p.qb().stats().acks_sent, acks + 1);  // acknowledged again
  EXPECT_EQ(p.ca().size(), 1u);                    // and nothing completes twice
}

TEST(RcDuplicates, AtomicIsAnsweredFromTheSavedResult) {
  Pair p;
  p.start();
  Capture cap;
  cap.attach(p.sim, op::kFetchAdd);
  SendWr w = wr(1, WrOpcode::kFetchAdd, p.a, kA, 8);
  w.remote_addr = kB + 8;
  w.rkey = p.b;
  w.compare_add = 5;
  p.qa().post_send(w);
  p.settle();
  ASSERT_FALSE(cap.pkt.empty());
  EXPECT_EQ(p.sim.nodes[1].mem.atomics, 1u);
  p.qb().receive(cap.pkt, 0);
  p.qb().receive(cap.pkt, 0);
  p.settle();
  EXPECT_EQ(p.sim.nodes[1].mem.atomics, 1u);  // never executed twice
  EXPECT_EQ(p.qb().stats().atomic_replays, 2u);
  uint64_t v;
  std::memcpy(&v, p.sim.nodes[1].mem.bytes(p.b).data() + 8, 8);
  EXPECT_EQ(v, 5u);
  EXPECT_EQ(p.ca().size(), 1u);
}

TEST(RcDuplicates, ReadIsReplayedFromMemory) {
  Pair p(QpType::kRC, {}, 256);
  p.start();
  Capture cap;
  cap.attach(p.sim, op::kReadRequest);
  std::vector<uint8_t> responses;
  SendWr w = wr(1, WrOpcode::kRead, p.a, kA, 700);
  w.remote_addr = kB;
  w.rkey = p.b;
  p.qa().post_send(w);
  p.settle();
  ASSERT_FALSE(cap.pkt.empty());
  std::memset(p.sim.nodes[1].mem.bytes(p.b).data(), 0x5c, 700);
  int resp = 0;
  p.sim.nodes[0].tap = [&](std::vector<uint8_t>& b) {
    Packet q;
    if (parse_packet(b, false, &q) == ParseError::kOk && q.info().kind == OpKind::kReadResponse) {
      resp++;
      EXPECT_EQ(q.payload[0], 0x5c);  // memory as it is now
    }
  };
  p.qb().receive(cap.pkt, 0);
  p.settle();
  EXPECT_EQ(resp, 3);  // 700 bytes at 256
  EXPECT_EQ(p.qb().stats().read_replays, 1u);
  EXPECT_EQ(p.ca().size(), 1u);  // the requester ignores the stale responses
  EXPECT_EQ(p.qa().state(), EngineState::kReady);
}

TEST(RcDuplicates, OutOfSequencePacketGetsOneNak) {
  Pair p;
  p.start();
  Capture cap;
  cap.attach(p.sim, op::kWriteOnly);
  SendWr w = wr(1, WrOpcode::kWrite, p.a, kA, 8);
  w.remote_addr = kB;
  w.rkey = p.b;
  p.qa().post_send(w);
  p.settle();
  Packet q;
  ASSERT_EQ(parse_packet(cap.pkt, false, &q), ParseError::kOk);
  for (uint32_t ahead : {5, 6, 7}) {
    q.bth.psn = psn_add(q.bth.psn, ahead);
    std::vector<uint8_t> b(packet_size(q));
    build_packet(q, b);
    p.qb().receive(b, 0);
  }
  EXPECT_EQ(p.qb().stats().seq_naks_sent, 1u);
  EXPECT_EQ(p.sim.nodes[1].mem.writes, 1u);
}

TEST(UcEngine, MessagesArriveWholeOrNotAtAll) {
  for (double loss : {0.0, 0.1}) {
    Pair p(QpType::kUC, FaultConfig{loss, 0, 0, 0, 5}, 256);
    p.start();
    const int n = 100;
    for (int i = 0; i < n; i++) p.qb().post_recv(rwr(100 + i, p.b, kB + 600 * i, 600));
    for (int i = 0; i < n; i++) {
      // Message i is 50 + 5i bytes from offset 37i of A's pattern, imm i.
      SendWr w = wr(i, WrOpcode::kSendImm, p.a, kA + 37 * i, 50 + 5 * i);
      w.imm = i;
      p.qa().post_send(w);
    }
    p.settle();
    ASSERT_EQ(p.ca().size(), size_t(n));  // UC completes every send once sent
    for (auto& c : p.ca()) EXPECT_EQ(c.status, WcStatus::kSuccess);
    size_t got = 0;
    for (auto& c : p.cb()) {
      if (c.status == WcStatus::kWrFlushErr) continue;
      ASSERT_EQ(c.status, WcStatus::kSuccess);
      ASSERT_TRUE(c.has_imm);
      const int i = int(c.imm);
      EXPECT_EQ(c.byte_len, uint32_t(50 + 5 * i));
      const uint8_t* buf = p.sim.nodes[1].mem.bytes(p.b).data() + 600 * (c.wr_id - 100);
      EXPECT_EQ(0, memcmp(buf, p.sim.nodes[0].mem.bytes(p.a).data() + 37 * i, c.byte_len)) << i;
      got++;
    }
    if (loss == 0) {
      EXPECT_EQ(got, size_t(n));
    } else {
      EXPECT_LT(got, size_t(n));
      EXPECT_GT(got, size_t(n) / 3);
    }
    EXPECT_EQ(p.qa().stats().packets_received, 0u);  // no ACKs on UC
  }
}

TEST(UcEngine, WriteAndNoReadOrAtomics) {
  Pair p(QpType::kUC);
  p.start();
  SendWr w = wr(1, WrOpcode::kWrite, p.a, kA, 5000);
  w.remote_addr = kB;
  w.rkey = p.b;
  p.qa().post_send(w);
  p.settle();
  EXPECT_EQ(0, memcmp(p.sim.nodes[1].mem.bytes(p.b).data(), p.sim.nodes[0].mem.bytes(p.a).data(), 5000));
  EXPECT_EQ(EINVAL, p.qa().post_send(wr(2, WrOpcode::kRead, p.a, kA, 8)));
  EXPECT_EQ(EINVAL, p.qa().post_send(wr(3, WrOpcode::kFetchAdd, p.a, kA, 8)));
}

TEST(UdEngine, QkeySourceQpGrhAndLength) {
  Pair p(QpType::kUD);
  p.start();
  for (int i = 0; i < 4; i++) p.qb().post_recv(rwr(10 + i, p.b, kB + 2048 * i, 2048));
  auto send = [&](uint64_t id, uint32_t len, uint32_t qkey) {
    SendWr w = wr(id, WrOpcode::kSendImm, p.a, kA, len);
    w.remote_qpn = p.sim.cfg[1].qpn;
    w.remote_qkey = qkey;
    w.ah = 1;
    w.imm = uint32_t(id);
    return p.qa().post_send(w);
  };
  EXPECT_EQ(0, send(1, 100, 0x1234));
  EXPECT_EQ(0, send(2, 100, 0x9999));        // wrong Q_Key: dropped silently
  EXPECT_EQ(0, send(3, 200, 0x80000000u));   // high bit: the sender QP's Q_Key (also 0x1234)
  p.settle();
  ASSERT_EQ(p.cb().size(), 2u);
  EXPECT_EQ(p.cb()[0].imm, 1u);
  EXPECT_EQ(p.cb()[0].byte_len, 140u);  // 40 bytes of GRH first
  EXPECT_EQ(p.cb()[0].src_qp, p.sim.cfg[0].qpn);
  EXPECT_EQ(p.cb()[0].src_ah, 0u);
  EXPECT_EQ(0, memcmp(p.sim.nodes[1].mem.bytes(p.b).data() + 40, p.sim.nodes[0].mem.bytes(p.a).data(), 100));
  EXPECT_EQ(p.cb()[1].imm, 3u);
  EXPECT_EQ(p.qb().stats().dropped, 1u);
  ASSERT_EQ(p.ca().size(), 3u);
  EXPECT_EQ(send(4, 1025, 0x1234), 0);  // more than one MTU
  p.settle();
  ASSERT_EQ(p.ca().size(), 4u);
  EXPECT_EQ(p.ca()[3].status, WcStatus::kLocLenErr);
  EXPECT_EQ(EINVAL, p.qa().post_send(wr(5, WrOpcode::kWrite, p.a, kA, 8)));
}

// Multicast (docs/ROCE.md, "Multicast"): UD SENDs to the multicast QPN
// (0xFFFFFF) on a seeded lossy, duplicating, reordering link. The member
// takes every datagram that arrives with its Q_Key (UD: no recovery, no
// order), as often as the link delivered it, each intact; the others are
// dropped; the sends are unsignaled. A RC QP drops a packet for the
// multicast QPN (IBTA 9.6: not its QPN) that it takes with its own.
TEST(UdEngine, MulticastQpnOnALossyLink) {
  Pair p(QpType::kUD, FaultConfig{0.05, 0.05, 0.10, 30000, 21});
  p.start();
  uint32_t good = 0, bad = 0;
  p.sim.nodes[1].tap = [&](std::vector<uint8_t>& pkt) {
    if (pkt.size() < 20 || get_be24(pkt.data() + 5) != kMulticastQpn) return;
    (pkt[12] == 0 && pkt[13] == 0 && pkt[14] == 0x12 && pkt[15] == 0x34 ? good : bad)++;
  };
  constexpr uint32_t kSlot = 160;  // GRH + 100 bytes
  for (uint32_t i = 0; i < 400; i++) p.qb().post_recv(rwr(1000 + i, p.b, kB + kSlot * i, kSlot));
  for (uint32_t i = 0; i < 200; i++) {
    SendWr w = wr(i, WrOpcode::kSendImm, p.a, kA + i, 100);
    w.remote_qpn = kMulticastQpn;
    w.remote_qkey = i % 10 == 9 ? 0x9999 : 0x1234;  // every tenth: not the member's Q_Key
    w.ah = 1;
    w.imm = i;
    w.signaled = false;
    ASSERT_EQ(0, p.qa().post_send(w));
  }
  p.settle();
  EXPECT_TRUE(p.ca().empty());
  EXPECT_EQ(p.sim.sent, 200u);
  EXPECT_NE(good + bad, 200u);  // the link lost or doubled some (seed 21)
  ASSERT_EQ(p.cb().size(), good);
  EXPECT_EQ(p.qb().stats().dropped, bad);
  const uint8_t* src = p.sim.nodes[0].mem.bytes(p.a).data();
  for (size_t k = 0; k < p.cb().size(); k++) {
    const Completion& c = p.cb()[k];
    EXPECT_EQ(c.status, WcStatus::kSuccess);
    EXPECT_EQ(c.byte_len, 140u);
    EXPECT_EQ(c.src_qp, p.sim.cfg[0].qpn);
    ASSERT_LT(c.imm, 200u);
    EXPECT_NE(c.imm % 10, 9u);
    const uint8_t* got = p.sim.nodes[1].mem.bytes(p.b).data() + kSlot * (c.wr_id - 1000) + 40;
    EXPECT_EQ(0, memcmp(got, src + c.imm, 100)) << k;
  }

  Pair r(QpType::kRC);
  r.start();
  r.qb().post_recv(rwr(1, r.b, kB, 64));
  auto send_only = [&](uint32_t dqpn) {
    Packet q;
    q.bth.opcode = op::kSendOnly;
    q.bth.dest_qp = dqpn;
    q.bth.psn = 0;
    const uint8_t data[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    q.payload = data;
    std::vector<uint8_t> t(packet_size(q));
    build_packet(q, t);
    r.qb().receive(t, 0);
  };
  send_only(kMulticastQpn);
  EXPECT_EQ(r.qb().stats().dropped, 1u);
  EXPECT_TRUE(r.cb().empty());
  send_only(r.sim.cfg[1].qpn);  // the control: its own QPN completes
  ASSERT_EQ(r.cb().size(), 1u);
  EXPECT_EQ(r.cb()[0].byte_len, 8u);
}

TEST(UcEngine, WriteWithImmediateAndUdPlainSend) {
  {
    Pair p(QpType::kUC);
    p.start();
    p.qb().post_recv(rwr(5, p.b, 0, 0));
    SendWr w = wr(1, WrOpcode::kWriteImm, p.a, kA, 3000);
    w.remote_addr = kB + 8;
    w.rkey = p.b;
    w.imm = 0xabc;
    p.qa().post_send(w);
    p.settle();
    ASSERT_EQ(p.cb().size(), 1u);
    EXPECT_EQ(p.cb()[0].opcode, WcOpcode::kRecvWriteImm);
    EXPECT_EQ(p.cb()[0].imm, 0xabcu);
    EXPECT_EQ(p.cb()[0].byte_len, 3000u);
    EXPECT_EQ(0, memcmp(p.sim.nodes[1].mem.bytes(p.b).data() + 8, p.sim.nodes[0].mem.bytes(p.a).data(), 3000));
  }
  {
    Pair p(QpType::kUD);
    p.start();
    p.qb().post_recv(rwr(5, p.b, kB, 1063));
    SendWr w = wr(1, WrOpcode::kSend, p.a, kA, 1024);  // exactly one MTU
    w.remote_qpn = p.sim.cfg[1].qpn;
    w.remote_qkey = 0x1234;
    w.ah = 1;
    p.qa().post_send(w);
    p.settle();
    ASSERT_EQ(p.cb().size(), 1u);
    EXPECT_EQ(p.cb()[0].status, WcStatus::kLocLenErr);  // 40 + 1024 > 1063
    p.qb().post_recv(rwr(6, p.b, kB, 1064));
    p.qa().post_send(w);
    p.settle();
    ASSERT_EQ(p.cb().size(), 2u);
    EXPECT_EQ(p.cb()[1].status, WcStatus::kSuccess);
    EXPECT_FALSE(p.cb()[1].has_imm);
    EXPECT_EQ(p.cb()[1].byte_len, 1064u);
  }
}

// Corrupted packets (which the ICRC would normally stop) may make the
// connection fail, but never crash the engine, complete anything twice or
// leave a WR without its completion. (Run once with 2000 seeds and 10%
// corruption.)
TEST(Engine, CorruptedPacketsNeverBreakTheInvariants) {
  for (uint64_t seed = 1; seed <= 20; seed++) {
    Pair p(QpType::kRC, FaultConfig{0.02, 0.02, 0.02, 20000, seed}, 256);
    p.start();
    FaultInjector corrupt(FaultConfig{0, 0, 0, 0, seed * 7});
    for (int i = 0; i < 2; i++) {
      p.sim.nodes[i].tap = [&corrupt](std::vector<uint8_t>& b) {
        if (!b.empty() && corrupt.chance(0.03)) b[corrupt.next() % b.size()] ^= uint8_t(1 << (corrupt.next() % 8));
      };
    }
    int sends = 0, recvs = 0;
    for (int k = 0; k < 60; k++) {
      EngineQp& q = k % 3 ? p.qa() : p.qb();
      uint32_t key = k % 3 ? p.a : p.b;
      uint64_t base = k % 3 ? kA : kB;
      EngineQp& peer = k % 3 ? p.qb() : p.qa();
      uint32_t pkey = k % 3 ? p.b : p.a;
      uint64_t pbase = k % 3 ? kB : kA;
      WrOpcode op = WrOpcode(k % 8 == 2 ? 0 : k % 8);
      SendWr w = wr(uint64_t(k), op, key, base + 64 * uint64_t(k), op >= WrOpcode::kCompareSwap ? 8 : 700);
      w.remote_addr = pbase + 8 * uint64_t(k);
      w.rkey = pkey;
      if (op == WrOpcode::kSend || op == WrOpcode::kSendImm || op == WrOpcode::kWriteImm) {
        peer.post_recv(rwr(1000 + uint64_t(k), pkey, pbase + 20000 + 1024 * uint64_t(k), 1024));
        recvs++;
      }
      q.post_send(w);
      sends++;
    }
    p.settle();
    std::set<std::pair<bool, uint64_t>> seen;
    for (auto* cq : {&p.ca(), &p.cb()}) {
      for (auto& c : *cq) EXPECT_TRUE(seen.insert({c.is_recv, c.wr_id}).second) << "seed " << seed;
    }
    // Every send completed once; the receives too once both QPs have failed.
    size_t send_done = 0, recv_done = 0;
    for (auto& e : seen) (e.first ? recv_done : send_done)++;
    EXPECT_EQ(send_done, size_t(sends)) << "seed " << seed;
    if (p.qa().state() == EngineState::kError && p.qb().state() == EngineState::kError) {
      EXPECT_EQ(recv_done, size_t(recvs)) << "seed " << seed;
    }
  }
}

TEST(UdEngine, GrhFromThePacketIo) {
  Pair p(QpType::kUD);
  p.start();
  p.qb().post_recv(rwr(5, p.b, kB, 200));
  Packet q;
  q.bth.opcode = op::kUD | op::kSendOnly;
  q.bth.dest_qp = p.sim.cfg[1].qpn;
  q.deth = Deth{0x1234, 0x77};
  const uint8_t data[5] = {9, 8, 7, 6, 5};
  q.payload = data;
  std::vector<uint8_t> b(packet_size(q));
  build_packet(q, b);
  uint8_t grh[40];
  for (int i = 0; i < 40; i++) grh[i] = uint8_t(0xc0 + i);
  p.qb().receive(b, 3, grh);
  ASSERT_EQ(p.cb().size(), 1u);
  EXPECT_TRUE(p.cb()[0].grh);
  EXPECT_EQ(p.cb()[0].src_ah, 3u);
  EXPECT_EQ(p.cb()[0].src_qp, 0x77u);
  EXPECT_EQ(0, memcmp(p.sim.nodes[1].mem.bytes(p.b).data(), grh, 40));
  EXPECT_EQ(0, memcmp(p.sim.nodes[1].mem.bytes(p.b).data() + 40, data, 5));
}

TEST(RcEngineOps, FenceWaitsForEarlierReads) {
  for (bool fence : {false, true}) {
    Pair p(QpType::kRC, {}, 256);
    p.start();
    uint64_t last_read_response = 0, send_arrival = 0;
    p.sim.nodes[0].tap = [&](std::vector<uint8_t>& b) {
      if (b[0] == op::kReadRespLast) last_read_response = p.sim.clock.now;
    };
    p.sim.nodes[1].tap = [&](std::vector<uint8_t>& b) {
      if (b[0] == op::kSendOnly && !send_arrival) send_arrival = p.sim.clock.now;
    };
    p.qb().post_recv(rwr(5, p.b, kB + 4096, 100));
    SendWr r = wr(1, WrOpcode::kRead, p.a, kA, 4000);
    r.remote_addr = kB;
    r.rkey = p.b;
    p.qa().post_send(r);
    SendWr s = wr(2, WrOpcode::kSend, p.a, kA, 10);
    s.fence = fence;
    p.qa().post_send(s);
    p.settle();
    ASSERT_EQ(p.ca().size(), 2u);
    if (fence) {
      EXPECT_GT(send_arrival, last_read_response);
    } else {
      EXPECT_LT(send_arrival, last_read_response);
    }
  }
}

// LOCAL_INV and BIND_MW act only once every earlier WQE has completed
// (so no retransmission of those can read what they invalidate), complete
// in order with their own opcodes, and hold back what follows them.
TEST(RcEngineOps, LocalOperationsWaitForEarlierWorkAndCompleteInOrder) {
  Pair p(QpType::kRC, FaultConfig{.drop = 0.2});
  p.start();
  uint32_t mine = p.sim.nodes[0].mem.add(0x700000, 64, kRemoteWrite);
  p.qb().post_recv(rwr(9, p.b, kB, 100));
  SendWr w = wr(1, WrOpcode::kWrite, p.a, kA, 20000);
  w.remote_addr = kB + 4096;
  w.rkey = p.b;
  ASSERT_EQ(0, p.qa().post_send(w));
  SendWr inv;
  inv.wr_id = 2;
  inv.opcode = WrOpcode::kLocalInv;
  inv.invalidate_rkey = mine;
  ASSERT_EQ(0, p.qa().post_send(inv));
  SendWr bind;
  bind.wr_id = 3;
  bind.opcode = WrOpcode::kBindMw;
  bind.bind = {.mw_handle = 1, .rkey = 0x4242, .mr_lkey = p.a, .access = kRemoteRead, .addr = 0x800000, .length = 32};
  ASSERT_EQ(0, p.qa().post_send(bind));
  ASSERT_EQ(0, p.qa().post_send(wr(4, WrOpcode::kSend, p.a, kA, 10)));
  // Nothing local happens while the WRITE is unacknowledged.
  for (auto& n : p.sim.nodes) n.qp->progress();
  EXPECT_TRUE(p.sim.nodes[0].mem.local_ops.empty());
  EXPECT_TRUE(p.sim.nodes[0].mem.remote_check(mine, 0x700000, 8, kRemoteWrite));
  p.settle();
  ASSERT_EQ(p.ca().size(), 4u);
  const WcOpcode want[] = {WcOpcode::kWrite, WcOpcode::kLocalInv, WcOpcode::kBindMw, WcOpcode::kSend};
  for (size_t i = 0; i < 4; i++) {
    EXPECT_EQ(p.ca()[i].wr_id, i + 1);
    EXPECT_EQ(p.ca()[i].status, WcStatus::kSuccess) << i;
    EXPECT_EQ(p.ca()[i].opcode, want[i]) << i;
  }
  EXPECT_EQ(p.sim.nodes[0].mem.local_ops, (std::vector<uint64_t>{2, 3}));
  EXPECT_FALSE(p.sim.nodes[0].mem.remote_check(mine, 0x700000, 8, kRemoteWrite));
  EXPECT_TRUE(p.sim.nodes[0].mem.remote_check(0x4242, 0x800000, 32, kRemoteRead));
  ASSERT_EQ(p.cb().size(), 1u);
  EXPECT_EQ(0, memcmp(p.sim.nodes[1].mem.bytes(p.b).data() + 4096, p.sim.nodes[0].mem.bytes(p.a).data(), 20000));
}

// A local operation that fails is a local error: the QP enters the error
// state, that WQE completes with MW_BIND_ERR and the rest are flushed. UD
// QPs take neither.
TEST(RcEngineOps, FailedLocalOperationEndsTheQp) {
  Pair p;
  p.start();
  SendWr inv;
  inv.wr_id = 1;
  inv.opcode = WrOpcode::kLocalInv;
  inv.invalidate_rkey = 0xdead;  // no such key
  ASSERT_EQ(0, p.qa().post_send(inv));
  ASSERT_EQ(0, p.qa().post_send(wr(2, WrOpcode::kSend, p.a, kA, 10)));
  p.settle();
  ASSERT_EQ(p.ca().size(), 2u);
  EXPECT_EQ(p.ca()[0].status, WcStatus::kMwBindErr);
  EXPECT_EQ(p.ca()[0].opcode, WcOpcode::kLocalInv);
  EXPECT_EQ(p.ca()[1].status, WcStatus::kWrFlushErr);
  EXPECT_EQ(p.qa().state(), EngineState::kError);

  Pair u(QpType::kUD);
  u.start();
  EXPECT_EQ(EINVAL, u.qa().post_send(inv));
}

TEST(Engine, MalformedAndMisaddressedPacketsAreDropped) {
  Pair p;
  p.start();
  std::vector<uint8_t> junk = {1, 2, 3};
  p.qb().receive(junk, 0);
  Packet q;
  q.bth.opcode = op::kSendOnly;
  q.bth.dest_qp = 0x999;  // not this QP
  std::vector<uint8_t> b(packet_size(q));
  build_packet(q, b);
  p.qb().receive(b, 0);
  q.bth.dest_qp = p.sim.cfg[1].qpn;
  q.bth.opcode = op::kUD | op::kSendOnly;  // UD opcode on an RC QP
  b.resize(packet_size(q));
  build_packet(q, b);
  p.qb().receive(b, 0);
  EXPECT_EQ(p.qb().stats().dropped, 3u);
  EXPECT_EQ(p.qb().state(), EngineState::kReady);
  EXPECT_EQ(p.qb().stats().packets_sent, 0u);
}

}  // namespace
}  // namespace sv::roce

namespace sv::roce {
namespace {

// Captures what an EngineQp sends, to hand over by hand.
struct PacketCapture : PacketSink {
  std::vector<std::vector<uint8_t>> out;
  void send(uint64_t, std::span<const uint8_t> p) override { out.emplace_back(p.begin(), p.end()); }
};

// progress(false) keeps the coalesced ACK pending (the owner holds it so
// that it leaves after the application's next request); flush_ack() or a
// plain progress() sends it; a request sent meanwhile goes before it.
// A held ACK stops being held once a quarter of the window has come since
// the last ACK: the requester would otherwise stall on its window while the
// responder drains a long batch (the owner sends urgent ACKs at once).
TEST(RcEngineOps, StreamMakesTheAckUrgentAfterAQuarterWindow) {
  testsim::SimClock clock;
  testsim::TestMemory ma, mb;
  testsim::Cq ca, cb;
  PacketCapture na, nb;
  QpConfig a, b;
  a.qpn = 0x11, a.dest_qpn = 0x12, b.qpn = 0x12, b.dest_qpn = 0x11;
  a.access = b.access = kRemoteWrite;
  a.pmtu = b.pmtu = 256;
  a.max_window = b.max_window = 256;
  const uint32_t ka = ma.add(kA, 65536, kLocalWrite), kb = mb.add(kB, 65536, kLocalWrite | kRemoteWrite);
  EngineQp qa(a, na, ca, ma, clock), qb(b, nb, cb, mb, clock);
  SendWr w = testsim::wr(1, WrOpcode::kWrite, ka, kA, 100 * 256);
  w.remote_addr = kB;
  w.rkey = kb;
  ASSERT_EQ(0, qa.post_send(w));
  qa.progress();
  ASSERT_EQ(na.out.size(), 100u);
  for (size_t i = 0; i < 100; i++) {
    qb.receive(na.out[i]);
    // AckReq every 16 packets makes an ACK pending; it becomes urgent at 64.
    EXPECT_EQ(qb.ack_urgent(), i + 1 == 64) << i;
    if (qb.ack_urgent()) qb.flush_ack();  // what the owner does
  }
  ASSERT_EQ(nb.out.size(), 1u);  // the urgent ACK, sent after packet 64
  EXPECT_EQ(nb.out[0][0], op::kRC | op::kAck);
  qb.progress();  // the rest as before: one coalesced ACK for the batch
  EXPECT_EQ(nb.out.size(), 2u);
  for (auto& p : nb.out) qa.receive(p);
  ASSERT_EQ(ca.all.size(), 1u);
  EXPECT_EQ(ca.all[0].status, WcStatus::kSuccess);
}

TEST(RcEngineOps, AckHeldUntilFlushed) {
  testsim::SimClock clock;
  testsim::TestMemory ma, mb;
  testsim::Cq ca, cb;
  PacketCapture na, nb;
  QpConfig a, b;
  a.qpn = 0x11, a.dest_qpn = 0x12, b.qpn = 0x12, b.dest_qpn = 0x11;
  a.access = b.access = kRemoteWrite;
  const uint32_t ka = ma.add(kA, 4096, kLocalWrite | kRemoteWrite), kb = mb.add(kB, 4096, kLocalWrite | kRemoteWrite);
  EngineQp qa(a, na, ca, ma, clock), qb(b, nb, cb, mb, clock);
  auto write = [](uint64_t id, uint32_t lkey, uint64_t addr, uint32_t len, uint64_t raddr, uint32_t rkey) {
    SendWr w = testsim::wr(id, WrOpcode::kWrite, lkey, addr, len);
    w.remote_addr = raddr;
    w.rkey = rkey;
    return w;
  };
  for (int i = 0; i < 100; i++) ma.bytes(ka)[size_t(i)] = uint8_t(i + 1);
  ASSERT_EQ(0, qa.post_send(write(1, ka, kA, 100, kB, kb)));
  qa.progress();
  ASSERT_EQ(na.out.size(), 1u);  // WRITE Only, AckReq
  qb.receive(na.out[0]);
  qb.progress(false);
  EXPECT_TRUE(qb.ack_pending());
  EXPECT_TRUE(nb.out.empty());
  // B's own request goes out; the ACK still waits.
  ASSERT_EQ(0, qb.post_send(write(2, kb, kB, 10, kA + 200, ka)));
  qb.progress(false);
  ASSERT_EQ(nb.out.size(), 1u);
  EXPECT_EQ(nb.out[0][0], op::kRC | op::kWriteOnly);
  qb.flush_ack();
  EXPECT_FALSE(qb.ack_pending());
  ASSERT_EQ(nb.out.size(), 2u);
  EXPECT_EQ(nb.out[1][0], op::kRC | op::kAck);
  // A: the WRITE from B lands, then the ACK completes A's WRITE.
  for (auto& p : nb.out) qa.receive(p);
  const size_t a_sent = na.out.size();
  qa.progress();  // a plain progress(): A's ACK for B's WRITE goes at once
  ASSERT_EQ(ca.all.size(), 1u);
  EXPECT_EQ(ca.all[0].wr_id, 1u);
  EXPECT_EQ(ca.all[0].status, WcStatus::kSuccess);
  EXPECT_EQ(0, std::memcmp(mb.bytes(kb).data(), ma.bytes(ka).data(), 100));
  EXPECT_EQ(0, std::memcmp(ma.bytes(ka).data() + 200, mb.bytes(kb).data(), 10));
  EXPECT_FALSE(qa.ack_pending());
  ASSERT_EQ(na.out.size(), a_sent + 1);
  EXPECT_EQ(na.out.back()[0], op::kRC | op::kAck);
  qb.receive(na.out.back());
  qb.progress();
  ASSERT_EQ(cb.all.size(), 1u);
  EXPECT_EQ(cb.all[0].wr_id, 2u);
  EXPECT_EQ(cb.all[0].status, WcStatus::kSuccess);
}

}  // namespace
}  // namespace sv::roce
