// Two UdpEndpoints on 127.0.0.1 (ephemeral ports) carry RC traffic with
// injected faults; corrupted datagrams are dropped by the ICRC check.
#include "roce/udp.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/udp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstring>

#include "roce/engine_sim.h"
#include "roce/icrc.h"

namespace sv::roce {
namespace {

using testsim::Cq;
using testsim::rwr;
using testsim::TestMemory;
using testsim::wr;

struct Side {
  SteadyClock clock;
  UdpEndpoint ep;
  TestMemory mem;
  Cq cq;
  std::unique_ptr<EngineQp> qp;
  uint32_t key = 0;
  explicit Side(FaultConfig f) : ep(clock, f) {}
};

class UdpLoopback : public ::testing::TestWithParam<const char*> {};

// 40 SENDs and 40 WRITEs between two engines over `lo` through endpoints
// with the faults `f`, all delivered intact; `bound` false when `lo` cannot be bound.
void rc_transfer(const char* lo, FaultConfig f, UdpEndpointStats& sa, UdpEndpointStats& sb, bool& bound) {
  Side a(f), b(f);
  bound = a.ep.bind(lo, 0) == 0;
  if (!bound) return;
  ASSERT_EQ(b.ep.bind(lo, 0), 0);
  const uint64_t ab = a.ep.add_peer(lo, b.ep.port());
  const uint64_t ba = b.ep.add_peer(lo, a.ep.port());
  ASSERT_NE(ab, UINT64_MAX);
  EXPECT_EQ(a.ep.add_peer(std::string(lo) == "::1" ? "127.0.0.1" : "::1", 1), UINT64_MAX);  // other family
  QpConfig ca, cb;
  ca.qpn = 0x21; ca.dest_qpn = 0x22; ca.dest_ah = ab; ca.sq_psn = 10; ca.rq_psn = 20; ca.timeout = 10;  // 4 ms
  cb.qpn = 0x22; cb.dest_qpn = 0x21; cb.dest_ah = ba; cb.sq_psn = 20; cb.rq_psn = 10; cb.timeout = 10;
  ca.access = cb.access = kRemoteWrite | kRemoteRead | kRemoteAtomic;
  a.key = a.mem.add(0x1000000, 1 << 20, kLocalWrite | kRemoteRead | kRemoteWrite);
  b.key = b.mem.add(0x2000000, 1 << 20, kLocalWrite | kRemoteRead | kRemoteWrite);
  for (size_t i = 0; i < (1 << 20); i++) a.mem.bytes(a.key)[i] = uint8_t(i * 13 + 1);
  a.qp = std::make_unique<EngineQp>(ca, a.ep, a.cq, a.mem, a.clock);
  b.qp = std::make_unique<EngineQp>(cb, b.ep, b.cq, b.mem, b.clock);
  a.ep.attach(a.qp.get());
  b.ep.attach(b.qp.get());
  // 40 SENDs of 3000 bytes and 40 WRITEs of 5000 into the second half.
  for (int i = 0; i < 40; i++) {
    b.qp->post_recv(rwr(100 + i, b.key, 0x2000000 + 3000 * uint64_t(i), 3000));
    a.qp->post_send(wr(i, WrOpcode::kSend, a.key, 0x1000000 + 3000 * uint64_t(i), 3000));
    SendWr w = wr(1000 + i, WrOpcode::kWrite, a.key, 0x1000000 + 3000 * uint64_t(i), 5000);
    w.remote_addr = 0x2000000 + (1 << 19) + 5000 * uint64_t(i);
    w.rkey = b.key;
    a.qp->post_send(w);
  }
  const uint64_t deadline = a.clock.now_ns() + 20'000'000'000ull;
  while ((a.cq.all.size() < 80 || b.cq.all.size() < 40) && a.clock.now_ns() < deadline) {
    a.ep.poll(0);
    b.ep.poll(1);
  }
  ASSERT_EQ(a.cq.all.size(), 80u);
  ASSERT_EQ(b.cq.all.size(), 40u);
  for (auto& c : a.cq.all) EXPECT_EQ(c.status, WcStatus::kSuccess);
  for (auto& c : b.cq.all) EXPECT_EQ(c.status, WcStatus::kSuccess);
  auto& src = a.mem.bytes(a.key);
  auto& dst = b.mem.bytes(b.key);
  EXPECT_EQ(0, memcmp(dst.data(), src.data(), 40 * 3000));
  for (int i = 0; i < 40; i++) {
    EXPECT_EQ(0, memcmp(dst.data() + (1 << 19) + 5000 * i, src.data() + 3000 * i, 5000)) << i;
  }
  sa = a.ep.stats();
  sb = b.ep.stats();
}

TEST_P(UdpLoopback, RcWithFaults) {
  UdpEndpointStats sa, sb;
  bool bound = false;
  rc_transfer(GetParam(), FaultConfig{0.05, 0.02, 0.05, 200000, 3}, sa, sb, bound);
  if (!bound) GTEST_SKIP() << "cannot bind";
  EXPECT_GT(sa.fault_dropped, 0u);
  EXPECT_EQ(sa.bad_icrc + sb.bad_icrc, 0u);
}

// A corrupted packet fails the receiver's ICRC check (IBTA A17.4.1), is
// dropped there and recovered by retransmission, as a lost one.
TEST_P(UdpLoopback, RcWithCorruptedPackets) {
  FaultConfig f;
  f.corrupt = 0.05;
  f.seed = 5;
  UdpEndpointStats sa, sb;
  bool bound = false;
  rc_transfer(GetParam(), f, sa, sb, bound);
  if (!bound) GTEST_SKIP() << "cannot bind";
  EXPECT_GT(sa.fault_corrupted, 0u);
  EXPECT_GT(sa.bad_icrc + sb.bad_icrc, 0u);
  EXPECT_LE(sa.bad_icrc + sb.bad_icrc, sa.fault_corrupted + sb.fault_corrupted);
}

TEST_P(UdpLoopback, UdCarriesTheIpHeaderAsGrh) {
  const char* lo = GetParam();
  const bool v6 = std::string(lo) == "::1";
  Side a(FaultConfig{}), b(FaultConfig{});
  if (a.ep.bind(lo, 0) != 0) GTEST_SKIP() << "cannot bind " << lo;
  ASSERT_EQ(b.ep.bind(lo, 0), 0);
  QpConfig ca, cb;
  ca.type = cb.type = QpType::kUD;
  ca.qpn = 0x41;
  cb.qpn = 0x42;
  ca.qkey = cb.qkey = 0x11;
  a.key = a.mem.add(0x1000, 4096, kLocalWrite);
  b.key = b.mem.add(0x2000, 4096, kLocalWrite);
  a.qp = std::make_unique<EngineQp>(ca, a.ep, a.cq, a.mem, a.clock);
  b.qp = std::make_unique<EngineQp>(cb, b.ep, b.cq, b.mem, b.clock);
  a.ep.attach(a.qp.get());
  b.ep.attach(b.qp.get());
  b.qp->post_recv(rwr(1, b.key, 0x2000, 1064));
  SendWr w = wr(7, WrOpcode::kSend, a.key, 0x1000, 1000);
  w.remote_qpn = 0x42;
  w.remote_qkey = 0x11;
  w.ah = a.ep.add_peer(lo, b.ep.port());
  a.qp->post_send(w);
  for (int i = 0; i < 100 && b.cq.all.empty(); i++) {
    a.ep.poll(0);
    b.ep.poll(5);
  }
  ASSERT_EQ(b.cq.all.size(), 1u);
  EXPECT_TRUE(b.cq.all[0].grh);
  EXPECT_EQ(b.cq.all[0].src_qp, 0x41u);
  const uint8_t* g = b.mem.bytes(b.key).data();
  if (v6) {
    EXPECT_EQ(g[0] >> 4, 6);
    EXPECT_EQ(g[6], 17);  // next header UDP
    EXPECT_EQ(g[8 + 15], 1);
  } else {
    for (int i = 0; i < 20; i++) EXPECT_EQ(g[i], 0) << i;
    EXPECT_EQ(g[20], 0x45);
    EXPECT_EQ(g[20 + 9], 17);
    EXPECT_EQ(g[20 + 12], 127);
  }
}

// Batching and GSO as wire QPs use them, with payloads gathered where they
// lie (PacketSink::send_gather): SENDs, WRITEs and READs of odd lengths (pad
// bytes), from several SGEs (several pieces) and from more SGEs than a
// packet takes pieces (the copying path), arrive exact with good ICRCs.
TEST_P(UdpLoopback, GatheredPayloadsInGsoBatches) {
  const char* lo = GetParam();
  Side a(FaultConfig{}), b(FaultConfig{});
  if (a.ep.bind(lo, 0) != 0) GTEST_SKIP() << "cannot bind " << lo;
  ASSERT_EQ(b.ep.bind(lo, 0), 0);
  for (Side* s : {&a, &b}) {
    s->ep.set_batching(true);
    s->ep.set_gso(true);
    // Segments cut by the kernel carry IPv4 IDs 1, 2, ...: this socket
    // does not take GRO trains, which would say which is which.
    s->ep.set_accept_any_ipv4_id(true);
  }
  const uint64_t ab = a.ep.add_peer(lo, b.ep.port());
  const uint64_t ba = b.ep.add_peer(lo, a.ep.port());
  QpConfig ca, cb;
  ca.qpn = 0x31; ca.dest_qpn = 0x32; ca.dest_ah = ab; ca.sq_psn = 100; ca.rq_psn = 200; ca.timeout = 12;
  cb.qpn = 0x32; cb.dest_qpn = 0x31; cb.dest_ah = ba; cb.sq_psn = 200; cb.rq_psn = 100; cb.timeout = 12;
  ca.access = cb.access = kRemoteWrite | kRemoteRead;
  a.key = a.mem.add(0x1000000, 1 << 20, kLocalWrite | kRemoteRead | kRemoteWrite);
  b.key = b.mem.add(0x2000000, 1 << 20, kLocalWrite | kRemoteRead | kRemoteWrite);
  for (size_t i = 0; i < (1 << 20); i++) a.mem.bytes(a.key)[i] = uint8_t(i * 7 + 3);
  for (size_t i = 0; i < (1 << 20); i++) b.mem.bytes(b.key)[i] = uint8_t(i * 11 + 5);
  a.qp = std::make_unique<EngineQp>(ca, a.ep, a.cq, a.mem, a.clock);
  b.qp = std::make_unique<EngineQp>(cb, b.ep, b.cq, b.mem, b.clock);
  a.ep.attach(a.qp.get());
  b.ep.attach(b.qp.get());
  const uint64_t A = 0x1000000, B = 0x2000000;
  // A SEND of 70001 bytes into b's first 128 KiB.
  b.qp->post_recv(rwr(1, b.key, B, 1 << 17));
  a.qp->post_send(wr(10, WrOpcode::kSend, a.key, A, 70001));
  // A WRITE of 3 SGEs (300 + 5 + 4097 bytes) to B + 256 KiB.
  SendWr w = wr(11, WrOpcode::kWrite, a.key, A + 1000, 300);
  w.sg.push_back(Sge{A + 5000, 5, a.key});
  w.sg.push_back(Sge{A + 9001, 4097, a.key});
  w.remote_addr = B + (1 << 18);
  w.rkey = b.key;
  a.qp->post_send(w);
  // A WRITE of 6 SGEs of 500 bytes (more pieces than a packet takes).
  SendWr w6 = wr(12, WrOpcode::kWrite, a.key, A + 20000, 500);
  for (int k = 1; k < 6; k++) w6.sg.push_back(Sge{A + 20000 + 1000 * uint64_t(k), 500, a.key});
  w6.remote_addr = B + (1 << 18) + 8192;
  w6.rkey = b.key;
  a.qp->post_send(w6);
  // A READ of 100003 bytes of b's memory at B + 512 KiB into A + 512 KiB.
  SendWr r = wr(13, WrOpcode::kRead, a.key, A + (1 << 19), 100003);
  r.remote_addr = B + (1 << 19);
  r.rkey = b.key;
  a.qp->post_send(r);
  const uint64_t deadline = a.clock.now_ns() + 20'000'000'000ull;
  while ((a.cq.all.size() < 4 || b.cq.all.size() < 1) && a.clock.now_ns() < deadline) {
    a.ep.poll(0);
    b.ep.poll(1);
  }
  ASSERT_EQ(a.cq.all.size(), 4u);
  ASSERT_EQ(b.cq.all.size(), 1u);
  for (auto& c : a.cq.all) EXPECT_EQ(c.status, WcStatus::kSuccess) << c.wr_id;
  EXPECT_EQ(b.cq.all[0].status, WcStatus::kSuccess);
  EXPECT_EQ(b.cq.all[0].byte_len, 70001u);
  auto& src = a.mem.bytes(a.key);
  auto& dst = b.mem.bytes(b.key);
  EXPECT_EQ(0, memcmp(dst.data(), src.data(), 70001));
  EXPECT_EQ(dst[70001], uint8_t(70001 * 11 + 5));  // not one byte more
  EXPECT_EQ(0, memcmp(dst.data() + (1 << 18), src.data() + 1000, 300));
  EXPECT_EQ(0, memcmp(dst.data() + (1 << 18) + 300, src.data() + 5000, 5));
  EXPECT_EQ(0, memcmp(dst.data() + (1 << 18) + 305, src.data() + 9001, 4097));
  for (int k = 0; k < 6; k++)
    EXPECT_EQ(0, memcmp(dst.data() + (1 << 18) + 8192 + 500 * k, src.data() + 20000 + 1000 * k, 500)) << k;
  EXPECT_EQ(0, memcmp(src.data() + (1 << 19), dst.data() + (1 << 19), 100003));
  EXPECT_GT(a.mem.views_given, 0u);  // a's requests were gathered in place
  EXPECT_GT(b.mem.views_given, 0u);  // and so were b's READ responses
  EXPECT_GT(a.ep.stats().gso_sends, 0u);
  EXPECT_GT(b.ep.stats().gso_sends, 0u);
  EXPECT_EQ(a.ep.stats().bad_icrc + b.ep.stats().bad_icrc, 0u);
  EXPECT_EQ(a.qp->stats().retransmit_timeouts + b.qp->stats().retransmit_timeouts, 0u);
}

INSTANTIATE_TEST_SUITE_P(Ipv4AndIpv6, UdpLoopback, ::testing::Values("127.0.0.1", "::1"));

TEST(UdpEndpoint, CorruptIcrcAndUnknownQpAreDropped) {
  SteadyClock clock;
  UdpEndpoint ep(clock);
  ASSERT_EQ(ep.bind("127.0.0.1", 0), 0);
  TestMemory mem;
  Cq cq;
  QpConfig c;
  c.qpn = 0x33;
  c.access = kRemoteWrite;
  uint32_t key = mem.add(0x5000, 64, kRemoteWrite);
  EngineQp qp(c, ep, cq, mem, clock);
  ep.attach(&qp);
  // A raw UDP socket plays the peer.
  int s = socket(AF_INET, SOCK_DGRAM, 0);
  sockaddr_in me{};
  me.sin_family = AF_INET;
  me.sin_port = 0;
  inet_pton(AF_INET, "127.0.0.1", &me.sin_addr);
  ASSERT_EQ(bind(s, reinterpret_cast<sockaddr*>(&me), sizeof me), 0);
  socklen_t len = sizeof me;
  getsockname(s, reinterpret_cast<sockaddr*>(&me), &len);
  sockaddr_in to = me;
  to.sin_port = htons(ep.port());
  auto datagram = [&](uint32_t qpn) {
    Packet p;
    p.bth.opcode = op::kWriteOnly;
    p.bth.dest_qp = qpn;
    p.reth = Reth{0x5000, key, 4};
    static const uint8_t data[4] = {1, 2, 3, 4};
    p.payload = data;
    std::vector<uint8_t> t(packet_size(p));
    build_packet(p, t);
    Ipv4Udp h;
    std::memcpy(h.src.data(), &me.sin_addr, 4);
    std::memcpy(h.dst.data(), &me.sin_addr, 4);
    h.sport = ntohs(me.sin_port);
    h.dport = ep.port();
    std::vector<uint8_t> ip(kIpv4UdpLen + t.size() + 4);
    frame_ipv4(h, t, ip);
    return std::vector<uint8_t>(ip.begin() + kIpv4UdpLen, ip.end());
  };
  auto bad = datagram(0x33);
  bad[bad.size() - 1] ^= 1;
  sendto(s, bad.data(), bad.size(), 0, reinterpret_cast<sockaddr*>(&to), sizeof to);
  auto other = datagram(0x34);
  sendto(s, other.data(), other.size(), 0, reinterpret_cast<sockaddr*>(&to), sizeof to);
  auto good = datagram(0x33);
  sendto(s, good.data(), good.size(), 0, reinterpret_cast<sockaddr*>(&to), sizeof to);
  for (int i = 0; i < 20 && ep.stats().received < 3; i++) ep.poll(50);
  EXPECT_EQ(ep.stats().received, 3u);
  // The sender was unknown: it became a peer at the endpoint's own port, where
  // a RoCEv2 host listens whatever its source port.
  ASSERT_EQ(ep.peer_count(), 1u);
  EXPECT_EQ(ep.peer_name(0), "127.0.0.1:" + std::to_string(ep.port()));
  EXPECT_EQ(ep.stats().bad_icrc, 1u);
  EXPECT_EQ(ep.stats().no_qp, 1u);
  EXPECT_EQ(mem.writes, 1u);  // only the good one, whose ICRC assumed IP ID 0 as sent
  EXPECT_EQ(mem.bytes(key)[3], 4);
  close(s);
}

// Sides a and b bound to 127.0.0.1, each with a 4 KiB memory region and a
// RC QP (QPNs `qpn` and `qpn` + 1, 4 ms timeout) connected to the other's.
void connect_on_loopback(Side& a, Side& b, uint32_t qpn) {
  ASSERT_EQ(a.ep.bind("127.0.0.1", 0), 0);
  ASSERT_EQ(b.ep.bind("127.0.0.1", 0), 0);
  QpConfig ca, cb;
  ca.qpn = qpn; ca.dest_qpn = qpn + 1; ca.dest_ah = a.ep.add_peer("127.0.0.1", b.ep.port()); ca.timeout = 10;
  cb.qpn = qpn + 1; cb.dest_qpn = qpn; cb.dest_ah = b.ep.add_peer("127.0.0.1", a.ep.port()); cb.timeout = 10;
  a.key = a.mem.add(0x1000000, 4096, kLocalWrite);
  b.key = b.mem.add(0x2000000, 4096, kLocalWrite);
  a.qp = std::make_unique<EngineQp>(ca, a.ep, a.cq, a.mem, a.clock);
  b.qp = std::make_unique<EngineQp>(cb, b.ep, b.cq, b.mem, b.clock);
  a.ep.attach(a.qp.get());
  b.ep.attach(b.qp.get());
}

// A link that something took down (FaultConfig::link_down, a fault plan's
// port rule): the endpoint sends nothing and drops what arrives, counting
// both; once it is up again the peers' retransmissions go through and every
// request completes, as after a NIC's link comes back within the retry count.
TEST(UdpEndpoint, NothingGoesOrArrivesWhileTheLinkIsDown) {
  std::atomic<bool> down{true};
  FaultConfig fa;
  fa.link_down = &down;
  Side a(fa), b(FaultConfig{});
  connect_on_loopback(a, b, 0x41);
  a.qp->post_recv(rwr(1, a.key, 0x1000800, 100));
  b.qp->post_recv(rwr(2, b.key, 0x2000800, 100));
  a.qp->post_send(wr(10, WrOpcode::kSend, a.key, 0x1000000, 100));
  b.qp->post_send(wr(20, WrOpcode::kSend, b.key, 0x2000000, 100));
  for (int i = 0; i < 10; i++) {
    a.ep.poll(0);
    b.ep.poll(1);
  }
  EXPECT_GE(a.ep.stats().link_down_sent, 1u);
  EXPECT_GE(a.ep.stats().link_down_received, 1u);
  EXPECT_EQ(a.ep.stats().received, 0u);
  EXPECT_EQ(b.ep.stats().received, 0u);
  EXPECT_TRUE(a.cq.all.empty());
  EXPECT_TRUE(b.cq.all.empty());
  down = false;
  const uint64_t deadline = a.clock.now_ns() + 5'000'000'000ull;
  while ((a.cq.all.size() < 2 || b.cq.all.size() < 2) && a.clock.now_ns() < deadline) {
    a.ep.poll(0);
    b.ep.poll(1);
  }
  ASSERT_EQ(a.cq.all.size(), 2u);
  ASSERT_EQ(b.cq.all.size(), 2u);
  for (auto& c : a.cq.all) EXPECT_EQ(c.status, WcStatus::kSuccess);
  for (auto& c : b.cq.all) EXPECT_EQ(c.status, WcStatus::kSuccess);
  EXPECT_GE(a.qp->stats().retransmit_timeouts + b.qp->stats().retransmit_timeouts, 1u);
}

// spare_from_faults (a QP being destroyed, roce_link.cc): B's plan drops
// everything it sends, so A's SEND arrives and its ACK never does; once B's
// endpoint is spared, the ACK for A's retransmission goes and A completes
// within its retry count.
TEST(UdpEndpoint, ASparedEndpointSendsDespiteItsPlan) {
  FaultConfig fb;
  fb.drop = 1.0;
  fb.seed = 3;
  Side a(FaultConfig{}), b(fb);
  connect_on_loopback(a, b, 0x51);
  b.qp->post_recv(rwr(2, b.key, 0x2000800, 100));
  a.qp->post_send(wr(10, WrOpcode::kSend, a.key, 0x1000000, 100));
  uint64_t deadline = a.clock.now_ns() + 2'000'000'000ull;
  while ((b.cq.all.empty() || b.ep.stats().fault_dropped == 0) && a.clock.now_ns() < deadline) {
    a.ep.poll(0);
    b.ep.poll(1);
  }
  ASSERT_EQ(b.cq.all.size(), 1u);  // B has the message; its ACK was dropped
  EXPECT_TRUE(a.cq.all.empty());
  const uint64_t dropped = b.ep.stats().fault_dropped;
  b.ep.spare_from_faults();
  deadline = a.clock.now_ns() + 2'000'000'000ull;
  while (a.cq.all.empty() && a.clock.now_ns() < deadline) {
    a.ep.poll(0);
    b.ep.poll(1);
  }
  ASSERT_EQ(a.cq.all.size(), 1u);
  EXPECT_EQ(a.cq.all[0].status, WcStatus::kSuccess);
  EXPECT_EQ(b.ep.stats().fault_dropped, dropped);  // nothing dropped once spared
}

// Linux rxe sends IPv4 with DF and a non-zero IP ID, which its ICRC covers
// and a UDP socket cannot see: with set_accept_any_ipv4_id such a datagram
// is accepted, without it dropped; a corrupted one is dropped either way.
TEST(UdpEndpoint, Ipv4IcrcOverANonZeroIpId) {
  for (bool any : {false, true}) {
    SteadyClock clock;
    UdpEndpoint ep(clock);
    ASSERT_EQ(ep.bind("127.0.0.1", 0), 0);
    ep.set_accept_any_ipv4_id(any);
    TestMemory mem;
    Cq cq;
    QpConfig c;
    c.qpn = 0x33;
    c.access = kRemoteWrite;
    uint32_t key = mem.add(0x5000, 64, kRemoteWrite);
    EngineQp qp(c, ep, cq, mem, clock);
    ep.attach(&qp);
    sockaddr_in from{};
    from.sin_family = AF_INET;
    from.sin_port = htons(0xc123);
    inet_pton(AF_INET, "127.0.0.1", &from.sin_addr);
    auto datagram = [&](uint16_t id, uint32_t psn, uint8_t fill) {
      Packet p;
      p.bth.opcode = op::kWriteOnly;
      p.bth.dest_qp = 0x33;
      p.bth.psn = psn;
      p.reth = Reth{0x5000, key, 4};
      const uint8_t data[4] = {fill, fill, fill, fill};
      p.payload = data;
      std::vector<uint8_t> t(packet_size(p));
      build_packet(p, t);
      Ipv4Udp h;
      std::memcpy(h.src.data(), &from.sin_addr, 4);
      std::memcpy(h.dst.data(), &from.sin_addr, 4);
      h.sport = 0xc123;
      h.dport = ep.port();
      h.id = id;
      std::vector<uint8_t> ip(kIpv4UdpLen + t.size() + 4);
      frame_ipv4(h, t, ip);
      return std::vector<uint8_t>(ip.begin() + kIpv4UdpLen, ip.end());
    };
    auto give = [&](const std::vector<uint8_t>& d) {
      ep.deliver(reinterpret_cast<const sockaddr*>(&from), sizeof from, d.data(), d.size());
    };
    give(datagram(0x1234, 0, 7));  // rxe-style: ID chosen by the kernel
    auto bad = datagram(0xbeef, any ? 1 : 0, 9);
    bad[29] ^= 0x40;  // a payload bit flipped on the way (after BTH + RETH)
    give(bad);
    give(datagram(0, any ? 1 : 0, 8));  // ID 0: accepted in both modes
    EXPECT_EQ(ep.stats().received, 3u);
    EXPECT_EQ(ep.stats().bad_icrc, any ? 1u : 2u);
    EXPECT_EQ(ep.stats().nonzero_ipv4_id, any ? 1u : 0u);
    EXPECT_EQ(mem.writes, any ? 2u : 1u);
    EXPECT_EQ(mem.bytes(key)[0], 8);
  }
}

// RoCEv2 multicast (docs/ROCE.md, "Multicast"): a UD SEND to the multicast
// QPN whose ICRC covers the IP group as destination reaches the member QP
// named by the caller, with the GRH's destination the group; every garbled
// form is dropped without harm: a flipped bit, a truncated datagram (cut in
// the BTH, in the DETH, one byte short), a DestQP other than 0xFFFFFF, a
// datagram for another group (its ICRC fails), a QP that is not attached,
// and a wrong Q_Key (dropped by the QP).
TEST(UdpEndpoint, MulticastToAMemberAndGarbledOnesDropped) {
  SteadyClock clock;
  UdpEndpoint ep(clock);
  ASSERT_EQ(ep.bind("127.0.0.1", 0), 0);
  TestMemory mem;
  Cq cq;
  QpConfig c;
  c.type = QpType::kUD;
  c.qpn = 0x44;
  c.qkey = 0x1234;
  const uint32_t key = mem.add(0x6000, 8192, kLocalWrite);
  EngineQp qp(c, ep, cq, mem, clock);
  ep.attach(&qp);
  for (int i = 0; i < 8; i++) qp.post_recv(rwr(10 + uint64_t(i), key, 0x6000 + 1024 * uint64_t(i), 1024));
  sockaddr_in from{}, group{}, other{};
  from.sin_family = group.sin_family = other.sin_family = AF_INET;
  from.sin_port = htons(0xc001);
  group.sin_port = other.sin_port = htons(kRoceV2Port);
  inet_pton(AF_INET, "10.1.2.3", &from.sin_addr);
  inet_pton(AF_INET, "239.1.1.1", &group.sin_addr);
  inet_pton(AF_INET, "239.1.1.2", &other.sin_addr);
  auto datagram = [&](uint32_t dqpn, uint32_t qkey, uint8_t fill) {
    Packet p;
    p.bth.opcode = op::kUD | op::kSendOnly;
    p.bth.dest_qp = dqpn;
    p.deth = Deth{qkey, 0x77};
    const uint8_t data[16] = {fill, fill, fill, fill, fill, fill, fill, fill,
                              fill, fill, fill, fill, fill, fill, fill, fill};
    p.payload = data;
    std::vector<uint8_t> t(packet_size(p));
    build_packet(p, t);
    Ipv4Udp h;
    std::memcpy(h.src.data(), &from.sin_addr, 4);
    std::memcpy(h.dst.data(), &group.sin_addr, 4);
    h.sport = 0xc001;
    h.dport = kRoceV2Port;
    std::vector<uint8_t> ip(kIpv4UdpLen + t.size() + 4);
    frame_ipv4(h, t, ip);
    return std::vector<uint8_t>(ip.begin() + kIpv4UdpLen, ip.end());
  };
  auto give = [&](const std::vector<uint8_t>& d, const sockaddr_in& to = {}, uint32_t qpn = 0x44, size_t n = 0) {
    const sockaddr_in& g = to.sin_family ? to : group;
    ep.deliver_multicast(reinterpret_cast<const sockaddr*>(&from), sizeof from, reinterpret_cast<const sockaddr*>(&g),
                         sizeof g, qpn, d.data(), n ? n : d.size());
  };
  give(datagram(kMulticastQpn, 0x1234, 1));  // delivered
  auto flipped = datagram(kMulticastQpn, 0x1234, 2);
  flipped[22] ^= 1;
  give(flipped);
  const auto good = datagram(kMulticastQpn, 0x1234, 3);
  for (size_t n : {size_t(5), size_t(15), size_t(19), good.size() - 1}) give(good, {}, 0x44, n);
  give(datagram(0x44, 0x1234, 4));              // unicast DestQP on the multicast path
  give(good, other);                            // another group: the ICRC covers the destination
  give(good, {}, 0x45);                         // not a QP of this endpoint
  give(datagram(kMulticastQpn, 0x9999, 5));     // wrong Q_Key: the QP drops it
  ep.deliver(reinterpret_cast<const sockaddr*>(&from), sizeof from, good.data(), good.size());  // unicast path
  give(good);                                   // delivered
  ASSERT_EQ(cq.all.size(), 2u);
  for (const auto& w : cq.all) {
    EXPECT_EQ(w.status, WcStatus::kSuccess);
    EXPECT_EQ(w.byte_len, 16u + 40u);
    EXPECT_EQ(w.src_qp, 0x77u);
    EXPECT_TRUE(w.grh);
  }
  const uint8_t* g = mem.bytes(key).data();
  EXPECT_EQ(g[20], 0x45);
  EXPECT_EQ(0, std::memcmp(g + 20 + 16, &group.sin_addr, 4));  // the GRH's destination: the group
  EXPECT_EQ(g[40], 1);
  EXPECT_EQ(g[1024 + 40], 3);
  EXPECT_EQ(ep.stats().multicast, 3u);  // the two delivered and the wrong Q_Key's
  // A flipped bit, the two cut after the BTH, another group's, the unicast path's.
  EXPECT_EQ(ep.stats().bad_icrc, 5u);
  EXPECT_EQ(ep.stats().too_short, 2u);
  EXPECT_EQ(ep.stats().no_qp, 2u);
}

// Linux rxe sends its IPv6 datagrams with a UDP checksum of zero; the kernel
// drops those on a socket without UDP_NO_CHECK6_RX (set_roce_socket_options).
// A sender with UDP_NO_CHECK6_TX sends them so on loopback.
TEST(UdpEndpoint, Ipv6DatagramsWithAZeroUdpChecksumArrive) {
  SteadyClock clock;
  UdpEndpoint ep(clock);
  if (ep.bind("::1", 0) != 0) GTEST_SKIP() << "no IPv6 loopback";
  TestMemory mem;
  Cq cq;
  QpConfig c;
  c.qpn = 0x66;
  c.access = kRemoteWrite;
  uint32_t key = mem.add(0x6000, 64, kRemoteWrite);
  EngineQp qp(c, ep, cq, mem, clock);
  ep.attach(&qp);

  int s = socket(AF_INET6, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(s, 0);
  int one = 1;
  ASSERT_EQ(setsockopt(s, IPPROTO_UDP, UDP_NO_CHECK6_TX, &one, sizeof one), 0);
  sockaddr_in6 me{};
  me.sin6_family = AF_INET6;
  me.sin6_addr = in6addr_loopback;
  ASSERT_EQ(::bind(s, reinterpret_cast<sockaddr*>(&me), sizeof me), 0);
  socklen_t ml = sizeof me;
  getsockname(s, reinterpret_cast<sockaddr*>(&me), &ml);

  Packet p;
  p.bth.opcode = op::kWriteOnly;
  p.bth.dest_qp = 0x66;
  p.reth = Reth{0x6000, key, 4};
  const uint8_t data[4] = {5, 6, 7, 8};
  p.payload = data;
  std::vector<uint8_t> t(packet_size(p));
  build_packet(p, t);
  Ipv6Udp h;
  std::memcpy(h.src.data(), &in6addr_loopback, 16);
  std::memcpy(h.dst.data(), &in6addr_loopback, 16);
  h.sport = ntohs(me.sin6_port);
  h.dport = ep.port();
  std::vector<uint8_t> ip(kIpv6UdpLen + t.size() + 4);
  ASSERT_GT(frame_ipv6(h, t, ip), 0u);
  sockaddr_in6 to = me;
  to.sin6_port = htons(ep.port());
  ASSERT_EQ(sendto(s, ip.data() + kIpv6UdpLen, ip.size() - kIpv6UdpLen, 0, reinterpret_cast<sockaddr*>(&to),
                   sizeof to),
            ssize_t(ip.size() - kIpv6UdpLen));
  for (int i = 0; i < 50 && mem.writes == 0; i++) ep.poll(10);
  close(s);
  EXPECT_EQ(ep.stats().received, 1u);
  EXPECT_EQ(ep.stats().bad_icrc, 0u);
  ASSERT_EQ(mem.writes, 1u);
  EXPECT_EQ(mem.bytes(key)[3], 8);
}

}  // namespace
}  // namespace sv::roce
