// XRC on the wire (IBTA annex A14): the XRC opcodes and XRCETH, and an XRC
// initiator (kXrcSend) talking to an XRC target (kXrcRecv) on the simulated
// link of engine_sim.h, the target's receives and key checks coming from the
// XRC SRQ each request names.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <optional>

#include "roce/engine_sim.h"

namespace sv::roce {
namespace {

using testsim::rwr;
using testsim::Sim;
using testsim::TestMemory;
using testsim::wr;

TEST(XrcHeaders, OpcodeTableHasRcsOperationsWithXrcEthOnRequests) {
  int n = 0;
  for (int low = 0; low < 32; low++) {
    const OpcodeInfo& rc = opcode_info(uint8_t(low));
    const OpcodeInfo& x = opcode_info(uint8_t(0xa0 | low));
    // Annex A19's FLUSH and ATOMIC WRITE (0x1c, 0x1d) are RC's alone.
    ASSERT_EQ(rc.valid && low < 0x18, x.valid) << low;
    if (!x.valid) continue;
    n++;
    EXPECT_EQ(x.transport, Transport::kXRC);
    EXPECT_EQ(x.kind, rc.kind);
    EXPECT_EQ(x.pos, rc.pos);
    EXPECT_EQ(x.request, rc.request);
    EXPECT_EQ(x.has(kHasXrcEth), rc.request) << x.name;  // requests only (IBTA A14)
    EXPECT_EQ(x.hdr_len, rc.hdr_len + (rc.request ? kXrcEthLen : 0));
    EXPECT_EQ(std::strncmp(x.name, "XRC ", 4), 0);
    EXPECT_STREQ(x.name + 4, rc.name + 3);
  }
  EXPECT_EQ(n, 23);
  EXPECT_FALSE(opcode_info(0xb5).valid);
  EXPECT_STREQ(opcode_info(0xb1).name, "XRC Acknowledge");
}

TEST(XrcHeaders, XrcEthFollowsBthAndPrecedesReth) {
  Packet p;
  p.bth.opcode = op::kXRC | op::kWriteOnlyImm;
  p.bth.dest_qp = 0x123456;
  p.xrc_srqn = 0xabcdef;
  p.reth = Reth{0x1122334455667788ull, 0x99aabbcc, 3};
  p.imm = 0x01020304;
  const uint8_t data[3] = {7, 8, 9};
  p.payload = data;
  std::vector<uint8_t> out(packet_size(p));
  ASSERT_EQ(build_packet(p, out), out.size());
  ASSERT_EQ(out.size(), kBthLen + kXrcEthLen + kRethLen + kImmDtLen + 4);
  EXPECT_EQ(out[0], 0xab);
  const uint8_t xrceth[4] = {0x00, 0xab, 0xcd, 0xef};  // reserved, then the 24-bit XRC SRQ number
  EXPECT_EQ(0, std::memcmp(out.data() + kBthLen, xrceth, 4));
  EXPECT_EQ(out[kBthLen + 4], 0x11);  // RETH's VA right after
  Packet q;
  ASSERT_EQ(parse_packet(out, false, &q), ParseError::kOk);
  EXPECT_EQ(q.xrc_srqn, 0xabcdefu);
  EXPECT_EQ(q.reth.va, p.reth.va);
  EXPECT_EQ(q.reth.rkey, p.reth.rkey);
  EXPECT_EQ(q.imm, p.imm);
  ASSERT_EQ(q.payload.size(), 3u);
  EXPECT_EQ(q.payload[2], 9);
  // Every truncation is an error, never a read past the end.
  for (size_t n = 0; n < kBthLen + kXrcEthLen + kRethLen + kImmDtLen; n++)
    EXPECT_NE(parse_packet(std::span<const uint8_t>(out.data(), n), false, &q), ParseError::kOk) << n;
  // An ACK carries no XRCETH.
  Packet a;
  a.bth.opcode = op::kXRC | op::kAck;
  EXPECT_EQ(packet_size(a), kBthLen + kAethLen);
}

// The target's XRC domain: SRQs by number, each with its own receive WQEs
// and its own memory (its PD); `domain` says which XRC domain each is of.
struct TestSrq : RecvSource {
  uint32_t srqn = 0, domain = 0;
  TestMemory mem;
  std::deque<RecvWr> wqes;
  XrcSrq srq;
  bool take(RecvWr& out) override {
    if (wqes.empty()) return false;
    out = std::move(wqes.front());
    out.xrc_srqn = srqn;
    wqes.pop_front();
    return true;
  }
};
struct TestDomain : XrcDomain {
  uint32_t domain = 1;
  std::map<uint32_t, std::unique_ptr<TestSrq>> srqs;
  uint64_t lookups = 0;
  TestSrq& add(uint32_t srqn, uint32_t dom = 1) {
    auto s = std::make_unique<TestSrq>();
    s->srqn = srqn;
    s->domain = dom;
    s->srq.recvs = s.get();
    s->srq.mem = &s->mem;
    return *(srqs[srqn] = std::move(s));
  }
  const XrcSrq* find_srq(uint32_t srqn) override {
    lookups++;
    auto it = srqs.find(srqn);
    return it == srqs.end() || it->second->domain != domain ? nullptr : &it->second->srq;
  }
};

constexpr uint64_t kXrcA = 0x100000, kXrcS = 0x500000;
constexpr uint32_t kAll = kLocalWrite | kRemoteWrite | kRemoteRead | kRemoteAtomic;

// Node 0: an XRC initiator; node 1: an XRC target with SRQs 5 and 6 of its
// domain and SRQ 9 of another domain, each with a 1 MiB region.
struct XrcPair {
  Sim sim;
  TestDomain dom;
  uint32_t a = 0;
  std::map<uint32_t, uint32_t> key;  // srqn -> its region's key
  explicit XrcPair(FaultConfig f = {}, uint32_t pmtu = 1024) : sim(QpType::kRC, f, pmtu) {
    sim.cfg[0].type = QpType::kXrcSend;
    sim.cfg[1].type = QpType::kXrcRecv;
  }
  void start() {
    a = sim.nodes[0].mem.add(kXrcA, 65536, kAll);
    for (size_t i = 0; i < 65536; i++) sim.nodes[0].mem.bytes(a)[i] = uint8_t(i * 7 + 1);
    for (auto [n, d] : {std::pair{5u, 1u}, {6u, 1u}, {9u, 2u}}) {
      TestSrq& s = dom.add(n, d);
      for (uint32_t k = 0; k < n; k++) s.mem.add(0, 1, 0);  // keys differ between SRQs: 0x100 + srqn
      key[n] = s.mem.add(kXrcS + n * 0x100000, 1 << 20, kAll);
    }
    sim.start();
    qb().set_xrc_domain(&dom);
  }
  TestSrq& srq(uint32_t n) { return *dom.srqs.at(n); }
  std::vector<uint8_t>& sbytes(uint32_t n) { return srq(n).mem.bytes(key[n]); }
  uint64_t sbase(uint32_t n) { return kXrcS + n * 0x100000; }
  void post_srq_recv(uint32_t n, uint64_t id, uint64_t off, uint32_t len) {
    srq(n).wqes.push_back(rwr(id, key[n], sbase(n) + off, len));
  }
  SendWr send(uint64_t id, uint32_t srqn, uint64_t off, uint32_t len, WrOpcode op = WrOpcode::kSend) {
    SendWr w = wr(id, op, a, kXrcA + off, len);
    w.xrc_srqn = srqn;
    return w;
  }
  SendWr rdma(uint64_t id, WrOpcode op, uint32_t srqn, uint64_t off, uint32_t len, uint64_t roff, uint32_t rkey) {
    SendWr w = send(id, srqn, off, len, op);
    w.remote_addr = sbase(srqn) + roff;
    w.rkey = rkey;
    return w;
  }
  EngineQp& qa() { return *sim.nodes[0].qp; }
  EngineQp& qb() { return *sim.nodes[1].qp; }
  std::vector<Completion>& ca() { return sim.nodes[0].cq.all; }
  std::vector<Completion>& cb() { return sim.nodes[1].cq.all; }
  bool settle() { return sim.run([] { return false; }); }
};

// An XRC target is connected too: a SEND from a third address, with the
// PSN the target expects and a valid XRCETH, takes no WQE of the SRQ and
// writes nothing (IBTA 9.6; Linux rxe, rxe_recv.c check_addr).
TEST(XrcEngine, TargetDropsRequestsFromAThirdHost) {
  XrcPair p;
  p.start();
  p.sim.faulty = false;
  std::optional<std::vector<uint8_t>> first;
  p.sim.nodes[1].tap = [&](std::vector<uint8_t>& b) {
    if (first) return;
    first = b;
    b.clear();  // lost on the link
  };
  p.post_srq_recv(5, 50, 0, 64);
  ASSERT_EQ(0, p.qa().post_send(p.send(1, 5, 0, 64)));
  p.sim.run([&] { return first.has_value(); }, 1'000'000);
  ASSERT_TRUE(first);
  p.sim.inject(1, 2, *first);
  p.sim.run([] { return false; }, p.sim.clock.now + 50'000);
  EXPECT_EQ(p.qb().stats().wrong_source, 1u);
  EXPECT_TRUE(p.cb().empty());
  EXPECT_EQ(p.srq(5).wqes.size(), 1u);
  EXPECT_EQ(p.sbytes(5)[0], 0);
  EXPECT_EQ(p.qb().stats().acks_sent, 0u);
  // The initiator retransmits; from it the SEND is received.
  p.settle();
  ASSERT_EQ(p.cb().size(), 1u);
  EXPECT_EQ(p.cb()[0].wr_id, 50u);
  EXPECT_EQ(p.sbytes(5)[0], p.sim.nodes[0].mem.bytes(p.a)[0]);
}

TEST(XrcEngine, SendsGoToTheNamedSrqAndRdmaUsesItsPd) {
  XrcPair p;
  std::vector<uint8_t> to_target, to_initiator;  // opcodes seen on the link
  p.start();
  p.sim.nodes[1].tap = [&](std::vector<uint8_t>& b) {
    to_target.push_back(b[0]);
    Packet q;
    ASSERT_EQ(parse_packet(b, false, &q), ParseError::kOk);
    EXPECT_EQ(q.info().transport, Transport::kXRC);
    EXPECT_TRUE(q.info().has(kHasXrcEth));
  };
  p.sim.nodes[0].tap = [&](std::vector<uint8_t>& b) { to_initiator.push_back(b[0]); };
  p.post_srq_recv(5, 50, 0, 8192);
  p.post_srq_recv(6, 60, 0, 8192);
  p.post_srq_recv(6, 61, 8192, 100);
  p.sbytes(6)[40000] = 0;
  std::memcpy(p.sbytes(5).data() + 30000, "\x05\0\0\0\0\0\0\0", 8);
  // SEND of 3 MTUs to SRQ 6, SEND to SRQ 5, WRITE with Immediate into SRQ 6's
  // memory (its receive from SRQ 6), READ of SRQ 5's memory, fetch-and-add.
  ASSERT_EQ(0, p.qa().post_send(p.send(1, 6, 0, 3000)));
  ASSERT_EQ(0, p.qa().post_send(p.send(2, 5, 100, 10)));
  SendWr wi = p.rdma(3, WrOpcode::kWriteImm, 6, 200, 2500, 40000, p.key[6]);
  wi.imm = 0xfeedbeef;
  ASSERT_EQ(0, p.qa().post_send(wi));
  ASSERT_EQ(0, p.qa().post_send(p.rdma(4, WrOpcode::kRead, 5, 20000, 1500, 100, p.key[5])));
  SendWr fa = p.rdma(5, WrOpcode::kFetchAdd, 5, 40000, 8, 30000, p.key[5]);
  fa.compare_add = 10;
  ASSERT_EQ(0, p.qa().post_send(fa));
  p.settle();
  ASSERT_EQ(p.ca().size(), 5u);
  for (size_t i = 0; i < 5; i++) {
    EXPECT_EQ(p.ca()[i].status, WcStatus::kSuccess) << i;
    EXPECT_EQ(p.ca()[i].wr_id, i + 1);
  }
  auto& A = p.sim.nodes[0].mem.bytes(p.a);
  ASSERT_EQ(p.cb().size(), 3u);
  EXPECT_EQ(p.cb()[0].wr_id, 60u);
  EXPECT_EQ(p.cb()[0].xrc_srqn, 6u);
  EXPECT_EQ(p.cb()[0].byte_len, 3000u);
  EXPECT_EQ(p.cb()[0].qp_num, p.sim.cfg[1].qpn);
  EXPECT_EQ(0, std::memcmp(p.sbytes(6).data(), A.data(), 3000));
  EXPECT_EQ(p.cb()[1].wr_id, 50u);
  EXPECT_EQ(p.cb()[1].xrc_srqn, 5u);
  EXPECT_EQ(0, std::memcmp(p.sbytes(5).data(), A.data() + 100, 10));
  EXPECT_EQ(p.cb()[2].wr_id, 61u);
  EXPECT_EQ(p.cb()[2].xrc_srqn, 6u);
  EXPECT_EQ(p.cb()[2].opcode, WcOpcode::kRecvWriteImm);
  EXPECT_TRUE(p.cb()[2].has_imm);
  EXPECT_EQ(p.cb()[2].imm, 0xfeedbeefu);
  EXPECT_EQ(0, std::memcmp(p.sbytes(6).data() + 40000, A.data() + 200, 2500));
  EXPECT_EQ(0, std::memcmp(A.data() + 20000, p.sbytes(5).data() + 100, 1500));
  uint64_t orig = 0, now = 0;
  std::memcpy(&orig, A.data() + 40000, 8);
  std::memcpy(&now, p.sbytes(5).data() + 30000, 8);
  EXPECT_EQ(orig, 5u);
  EXPECT_EQ(now, 15u);
  // On the wire: XRC requests (with XRCETH), XRC responses and ACKs back.
  for (uint8_t o : to_target) EXPECT_EQ(o >> 5, 5) << int(o);
  for (uint8_t o : to_initiator) {
    EXPECT_EQ(o >> 5, 5) << int(o);
    EXPECT_FALSE(opcode_info(o).request);
  }
  auto has = [](const std::vector<uint8_t>& v, uint8_t o) { return std::find(v.begin(), v.end(), o) != v.end(); };
  EXPECT_TRUE(has(to_target, 0xa0) && has(to_target, 0xa1) && has(to_target, 0xa2) && has(to_target, 0xa4));
  EXPECT_TRUE(has(to_target, 0xa6) && has(to_target, 0xa9) && has(to_target, 0xac) && has(to_target, 0xb4));
  EXPECT_TRUE(has(to_initiator, 0xb1) && has(to_initiator, 0xad) && has(to_initiator, 0xaf) &&
              has(to_initiator, 0xb2));
  EXPECT_EQ(p.qb().state(), EngineState::kReady);
}

TEST(XrcEngine, RkeyOfAnotherSrqsPdIsARemoteAccessError) {
  XrcPair p;
  p.start();
  // SRQ 6's key and memory, the request naming SRQ 5: checked in SRQ 5's
  // PD, it fails.
  SendWr w = p.rdma(1, WrOpcode::kWrite, 5, 0, 100, 0, p.key[6]);
  w.remote_addr = p.sbase(6);
  p.qa().post_send(w);
  p.qa().post_send(p.send(2, 5, 0, 10));
  p.settle();
  ASSERT_EQ(p.ca().size(), 2u);
  EXPECT_EQ(p.ca()[0].status, WcStatus::kRemAccessErr);
  EXPECT_EQ(p.ca()[1].status, WcStatus::kWrFlushErr);
  EXPECT_EQ(p.qb().state(), EngineState::kError);
  EXPECT_EQ(p.qb().responder_fault(), WcStatus::kRemAccessErr);
  EXPECT_EQ(p.sim.nodes[1].mem.writes + p.srq(5).mem.writes + p.srq(6).mem.writes, 0u);
}

void expect_invalid_request(XrcPair& p, uint32_t srqn) {
  p.post_srq_recv(5, 50, 0, 100);
  p.post_srq_recv(9, 90, 0, 100);
  p.qa().post_send(p.send(1, srqn, 0, 10));
  p.qa().post_send(p.send(2, 5, 0, 10));
  p.settle();
  ASSERT_EQ(p.ca().size(), 2u);
  EXPECT_EQ(p.ca()[0].status, WcStatus::kRemInvReqErr);
  EXPECT_EQ(p.ca()[1].status, WcStatus::kWrFlushErr);
  EXPECT_EQ(p.qa().state(), EngineState::kError);
  EXPECT_EQ(p.qb().state(), EngineState::kError);
  EXPECT_EQ(p.qb().responder_fault(), WcStatus::kRemInvReqErr);
  EXPECT_TRUE(p.cb().empty());  // no SRQ's WQE was taken
  EXPECT_EQ(p.srq(5).wqes.size(), 1u);
  EXPECT_EQ(p.srq(9).wqes.size(), 1u);
}

TEST(XrcEngine, UnknownSrqNumberIsAnInvalidRequest) {
  XrcPair p;
  p.start();
  expect_invalid_request(p, 77);
}

TEST(XrcEngine, SrqOfAnotherXrcDomainIsAnInvalidRequest) {
  XrcPair p;
  p.start();
  expect_invalid_request(p, 9);  // exists, but in domain 2
}

TEST(XrcEngine, EmptySrqIsRnrThenDelivers) {
  XrcPair p;
  p.start();
  p.qa().post_send(p.send(1, 5, 0, 2000));
  p.sim.run([] { return false; }, 1'000'000);
  EXPECT_TRUE(p.ca().empty());
  EXPECT_GT(p.qb().stats().rnr_naks_sent, 3u);
  p.post_srq_recv(6, 60, 0, 4096);  // the other SRQ does not help
  p.sim.run([] { return false; }, 2'000'000);
  EXPECT_TRUE(p.ca().empty());
  p.post_srq_recv(5, 50, 0, 4096);
  p.settle();
  ASSERT_EQ(p.ca().size(), 1u);
  EXPECT_EQ(p.ca()[0].status, WcStatus::kSuccess);
  ASSERT_EQ(p.cb().size(), 1u);
  EXPECT_EQ(p.cb()[0].wr_id, 50u);
  EXPECT_EQ(p.srq(6).wqes.size(), 1u);
}

TEST(XrcEngine, MessageChangingItsSrqMidwayIsAnInvalidRequest) {
  XrcPair p;
  p.start();
  p.post_srq_recv(5, 50, 0, 8192);
  p.post_srq_recv(6, 60, 0, 8192);
  // The Middle packet of a 3-packet SEND to SRQ 5 is made to name SRQ 6 (the
  // ICRC is not checked on the simulated link).
  p.sim.nodes[1].tap = [&](std::vector<uint8_t>& b) {
    if (b[0] == (op::kXRC | op::kSendMiddle)) b[kBthLen + 3] = 6;
  };
  p.qa().post_send(p.send(1, 5, 0, 2500));
  p.settle();
  ASSERT_EQ(p.ca().size(), 1u);
  EXPECT_EQ(p.ca()[0].status, WcStatus::kRemInvReqErr);
  // The SEND's receive WQE was taken from SRQ 5 and is flushed to its CQ.
  ASSERT_EQ(p.cb().size(), 1u);
  EXPECT_EQ(p.cb()[0].wr_id, 50u);
  EXPECT_EQ(p.cb()[0].xrc_srqn, 5u);
  EXPECT_EQ(p.cb()[0].status, WcStatus::kWrFlushErr);
  EXPECT_EQ(p.srq(6).wqes.size(), 1u);
}

TEST(XrcEngine, TargetHasNoSendQueueAndInitiatorNoResponder) {
  XrcPair p;
  p.start();
  EXPECT_EQ(EINVAL, p.qb().post_send(p.send(1, 5, 0, 10)));
  // A request arriving at the initiator is dropped.
  Packet q;
  q.bth.opcode = op::kXRC | op::kSendOnly;
  q.bth.dest_qp = p.sim.cfg[0].qpn;
  q.xrc_srqn = 5;
  std::vector<uint8_t> b(packet_size(q));
  build_packet(q, b);
  p.qa().receive(b);
  EXPECT_EQ(p.qa().stats().dropped, 1u);
  // RC opcodes reach neither.
  b[0] = op::kSendOnly;
  b.erase(b.begin() + kBthLen, b.begin() + kBthLen + kXrcEthLen);
  p.qa().receive(b);
  EXPECT_EQ(p.qa().stats().dropped, 2u);
}

// Under loss, duplication and reordering every message reaches its SRQ
// exactly once, whole and in order; every READ and atomic is right.
void lossy_run(uint64_t seed) {
  XrcPair p(FaultConfig{0.05, 0.05, 0.05, 30000, seed});
  p.start();
  constexpr int kMsgs = 60;
  uint64_t expect_sum = 0;
  std::map<uint32_t, std::vector<std::pair<uint64_t, uint32_t>>> sent;  // srqn -> (offset in A, length)
  for (int i = 0; i < kMsgs; i++) {
    const uint32_t srqn = (i * 7 % 3) ? 5 : 6;
    p.post_srq_recv(srqn, 1000 + i, uint64_t(i) * 8192, 8192);
    const uint32_t len = uint32_t(i * 997 % 5000);
    const uint64_t off = uint64_t(i * 131 % 20000);
    if (i % 5 == 3) {
      SendWr w = p.rdma(i, WrOpcode::kRead, srqn, 30000 + uint64_t(i % 4) * 8192, std::min<uint32_t>(len, 8000),
                        uint64_t(i) * 16, p.key[srqn]);
      p.qa().post_send(w);
    } else if (i % 5 == 4) {
      SendWr w = p.rdma(i, WrOpcode::kFetchAdd, srqn, 64000, 8, 65528, p.key[srqn]);
      w.compare_add = uint64_t(i);
      expect_sum += uint64_t(i);
      p.qa().post_send(w);
    } else {
      p.qa().post_send(p.send(i, srqn, off, len));
      sent[srqn].push_back({off, len});
    }
    if (i % 5 == 3) {
      p.settle();  // each READ checked before the next may land in the same place
      auto& A = p.sim.nodes[0].mem.bytes(p.a);
      const uint32_t rl = std::min<uint32_t>(len, 8000);
      EXPECT_EQ(0, std::memcmp(A.data() + 30000 + (i % 4) * 8192, p.sbytes(srqn).data() + uint64_t(i) * 16, rl))
          << "seed " << seed << " read " << i;
    }
  }
  p.settle();
  ASSERT_EQ(p.ca().size(), size_t(kMsgs)) << "seed " << seed;
  for (int i = 0; i < kMsgs; i++) {
    EXPECT_EQ(p.ca()[i].wr_id, uint64_t(i));
    EXPECT_EQ(p.ca()[i].status, WcStatus::kSuccess) << "seed " << seed << " wr " << i;
  }
  // Receives: each SRQ's in posting order (it is a queue), each once.
  std::map<uint32_t, size_t> next;
  auto& A = p.sim.nodes[0].mem.bytes(p.a);
  size_t sends = 0;
  for (const Completion& c : p.cb()) {
    ASSERT_EQ(c.status, WcStatus::kSuccess);
    auto& v = sent[c.xrc_srqn];
    ASSERT_LT(next[c.xrc_srqn], v.size());
    auto [off, len] = v[next[c.xrc_srqn]++];
    EXPECT_EQ(c.byte_len, len);
    EXPECT_EQ(0, std::memcmp(p.sbytes(c.xrc_srqn).data() + (c.wr_id - 1000) * 8192, A.data() + off, len))
        << "seed " << seed << " recv " << c.wr_id;
    sends++;
  }
  EXPECT_EQ(sends, sent[5].size() + sent[6].size());
  uint64_t s5 = 0, s6 = 0;
  std::memcpy(&s5, p.sbytes(5).data() + 65528, 8);
  std::memcpy(&s6, p.sbytes(6).data() + 65528, 8);
  EXPECT_EQ(s5 + s6, expect_sum) << "seed " << seed;  // no atomic ran twice
  EXPECT_GT(p.qa().stats().retransmit_timeouts + p.qa().stats().seq_naks_received, 0u);
  EXPECT_GT(p.qb().stats().duplicates, 0u);
}

// ROCE_SOAK=N: N seeds instead of six.
TEST(XrcEngine, LossDuplicationReorderingDeliverOnce) {
  const char* soak = std::getenv("ROCE_SOAK");
  const uint64_t n = soak ? std::strtoull(soak, nullptr, 10) : 6;
  for (uint64_t seed = 1; seed <= n; seed++) lossy_run(seed);
}

}  // namespace
}  // namespace sv::roce
