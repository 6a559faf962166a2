// A third host on the link: packets that look right in every header (the
// QPN, the P_Key, the next expected PSN) but come from an address that is
// not the connected QP's peer are dropped, counted, and change nothing: no
// completion, no byte of memory, no acknowledgement (IBTA 9.6; Linux rxe,
// rxe_recv.c check_addr). UD takes them (no peer to compare with).
#include <gtest/gtest.h>

#include <cstring>
#include <optional>

#include "roce/engine.h"
#include "roce/engine_sim.h"

namespace sv::roce {
namespace {

using namespace testsim;

constexpr int kThirdHost = 2;  // an address handle neither node's peer
constexpr uint64_t kBase = 0x40000000;

// Node 1's first arriving packet is taken off the link and kept.
struct SourceCapture {
  std::optional<std::vector<uint8_t>> pkt;
  void on(Sim& sim) {
    sim.nodes[1].tap = [this](std::vector<uint8_t>& b) {
      if (pkt) return;
      pkt = b;
      b.clear();  // lost on the link
    };
  }
};

// A WRITE from node 0, its first packet replayed by the third host: on UC
// (no retransmission) and RC (the requester retransmits).
void write_from_third_host(QpType type) {
  Sim sim(type, FaultConfig{}, 1024);
  sim.faulty = false;
  sim.start();
  const uint32_t src = sim.nodes[0].mem.add(kBase, 64, kLocalWrite);
  const uint32_t dst = sim.nodes[1].mem.add(kBase, 64, kLocalWrite | kRemoteWrite);
  for (size_t i = 0; i < 64; i++) sim.nodes[0].mem.bytes(src)[i] = uint8_t(0xa0 + i);
  SourceCapture cap;
  cap.on(sim);
  SendWr w = wr(1, WrOpcode::kWrite, src, kBase, 64);
  w.remote_addr = kBase;
  w.rkey = dst;
  ASSERT_EQ(sim.nodes[0].qp->post_send(w), 0);
  sim.run([&] { return cap.pkt.has_value(); }, 1'000'000);
  ASSERT_TRUE(cap.pkt);

  // The same bytes from the third host: the PSN is the one node 1 expects.
  sim.inject(1, kThirdHost, *cap.pkt);
  sim.run([] { return false; }, sim.clock.now + 50'000);
  const QpStats& s1 = sim.nodes[1].qp->stats();
  EXPECT_EQ(s1.wrong_source, 1u);
  EXPECT_EQ(sim.nodes[1].mem.writes, 0u);
  EXPECT_EQ(sim.nodes[1].mem.bytes(dst), std::vector<uint8_t>(64, 0));
  EXPECT_EQ(s1.acks_sent, 0u);
  EXPECT_TRUE(sim.nodes[1].cq.all.empty());
  EXPECT_EQ(sim.nodes[1].qp->state(), EngineState::kReady);

  // From the peer, the very same packet is taken (it was a valid one).
  if (type == QpType::kUC) sim.inject(1, 0, *cap.pkt);  // RC: the requester retransmits it
  sim.run([&] { return sim.nodes[1].mem.writes == 1 && !sim.nodes[0].cq.all.empty(); });
  EXPECT_EQ(sim.nodes[1].mem.writes, 1u);
  EXPECT_EQ(sim.nodes[1].mem.bytes(dst), sim.nodes[0].mem.bytes(src));
  ASSERT_EQ(sim.nodes[0].cq.all.size(), 1u);
  EXPECT_EQ(sim.nodes[0].cq.all[0].status, WcStatus::kSuccess);
  EXPECT_EQ(s1.wrong_source, 1u);
}

TEST(EngineSource, RcWriteFromThirdHostDropped) { write_from_third_host(QpType::kRC); }
TEST(EngineSource, UcWriteFromThirdHostDropped) { write_from_third_host(QpType::kUC); }

// A SEND: no receive WQE consumed, no receive completion.
TEST(EngineSource, UcSendFromThirdHostDropped) {
  Sim sim(QpType::kUC, FaultConfig{}, 1024);
  sim.faulty = false;
  sim.start();
  const uint32_t src = sim.nodes[0].mem.add(kBase, 32, kLocalWrite);
  const uint32_t dst = sim.nodes[1].mem.add(kBase, 32, kLocalWrite);
  std::memset(sim.nodes[0].mem.bytes(src).data(), 0x5a, 32);
  sim.nodes[1].qp->post_recv(rwr(7, dst, kBase, 32));
  SourceCapture cap;
  cap.on(sim);
  ASSERT_EQ(sim.nodes[0].qp->post_send(wr(1, WrOpcode::kSend, src, kBase, 32)), 0);
  sim.run([&] { return cap.pkt.has_value(); }, 1'000'000);
  ASSERT_TRUE(cap.pkt);
  for (int i = 0; i < 3; i++) sim.inject(1, kThirdHost + i, *cap.pkt);
  sim.run([] { return false; }, sim.clock.now + 50'000);
  EXPECT_EQ(sim.nodes[1].qp->stats().wrong_source, 3u);
  EXPECT_TRUE(sim.nodes[1].cq.all.empty());
  EXPECT_EQ(sim.nodes[1].mem.bytes(dst), std::vector<uint8_t>(32, 0));
  sim.inject(1, 0, *cap.pkt);
  sim.run([&] { return !sim.nodes[1].cq.all.empty(); });
  ASSERT_EQ(sim.nodes[1].cq.all.size(), 1u);
  EXPECT_EQ(sim.nodes[1].cq.all[0].wr_id, 7u);
  EXPECT_EQ(sim.nodes[1].mem.bytes(dst), sim.nodes[0].mem.bytes(src));
}

// The requester side of RC: an ACK from the third host acknowledges nothing.
TEST(EngineSource, RcAckFromThirdHostIgnored) {
  Sim sim(QpType::kRC, FaultConfig{}, 1024);
  sim.faulty = false;
  sim.start();
  const uint32_t src = sim.nodes[0].mem.add(kBase, 16, kLocalWrite);
  const uint32_t dst = sim.nodes[1].mem.add(kBase, 16, kLocalWrite | kRemoteWrite);
  // Node 0's first arriving packet (node 1's ACK) is taken off the link.
  std::optional<std::vector<uint8_t>> ack;
  sim.nodes[0].tap = [&](std::vector<uint8_t>& b) {
    if (ack) return;
    ack = b;
    b.clear();
  };
  SendWr w = wr(1, WrOpcode::kWrite, src, kBase, 16);
  w.remote_addr = kBase;
  w.rkey = dst;
  ASSERT_EQ(sim.nodes[0].qp->post_send(w), 0);
  sim.run([&] { return ack.has_value(); }, 1'000'000);
  ASSERT_TRUE(ack);
  sim.inject(0, kThirdHost, *ack);
  sim.run([] { return false; }, sim.clock.now + 10'000);  // well before the retransmission timeout
  EXPECT_EQ(sim.nodes[0].qp->stats().wrong_source, 1u);
  EXPECT_TRUE(sim.nodes[0].cq.all.empty());
  // The peer's ACK (for the retransmitted WRITE, a duplicate) completes it.
  sim.run([&] { return !sim.nodes[0].cq.all.empty(); });
  ASSERT_EQ(sim.nodes[0].cq.all.size(), 1u);
  EXPECT_EQ(sim.nodes[0].cq.all[0].status, WcStatus::kSuccess);
}

// UD has no peer: a datagram from any address is received, and its
// completion names where it came from.
TEST(EngineSource, UdFromThirdHostReceived) {
  Sim sim(QpType::kUD, FaultConfig{}, 1024);
  sim.faulty = false;
  sim.start();
  const uint32_t src = sim.nodes[0].mem.add(kBase, 16, kLocalWrite);
  const uint32_t dst = sim.nodes[1].mem.add(kBase, 64, kLocalWrite);
  sim.nodes[1].qp->post_recv(rwr(9, dst, kBase, 64));
  SourceCapture cap;
  cap.on(sim);
  SendWr w = wr(1, WrOpcode::kSend, src, kBase, 16);
  w.ah = 1;
  w.remote_qpn = sim.cfg[1].qpn;
  w.remote_qkey = sim.cfg[1].qkey;
  ASSERT_EQ(sim.nodes[0].qp->post_send(w), 0);
  sim.run([&] { return cap.pkt.has_value(); }, 1'000'000);
  ASSERT_TRUE(cap.pkt);
  sim.inject(1, kThirdHost, *cap.pkt);
  sim.run([&] { return !sim.nodes[1].cq.all.empty(); });
  ASSERT_EQ(sim.nodes[1].cq.all.size(), 1u);
  EXPECT_EQ(sim.nodes[1].cq.all[0].status, WcStatus::kSuccess);
  EXPECT_EQ(sim.nodes[1].cq.all[0].src_ah, uint64_t(kThirdHost));
  EXPECT_EQ(sim.nodes[1].qp->stats().wrong_source, 0u);
}

}  // namespace
}  // namespace sv::roce
