// IBTA annex A19 on the wire, on the simulated link of engine_sim.h: RC
// FLUSH (0x1C, FETH and RETH) and RC ATOMIC WRITE (0x1D, RETH and 8 bytes),
// each answered with an RDMA READ response Only of no payload, as Linux rxe
// sends and answers them; done once whatever the link loses or repeats.
#include <gtest/gtest.h>

#include <cstring>

#include "roce/engine_sim.h"

namespace sv::roce {
namespace a19 {  // named: a unity build joins this file with engine_test.cc, whose kA, kB and Pair differ

using testsim::Sim;
using testsim::TestMemory;
using testsim::wr;

constexpr uint64_t kA = 0x100000, kB = 0x200000, kLen = 65536;
constexpr uint32_t kAll = kLocalWrite | kRemoteWrite | kRemoteRead | kRemoteAtomic | kFlushGlobal | kFlushPersistent;

struct Pair {
  Sim sim;
  uint32_t a = 0, b = 0;
  explicit Pair(FaultConfig f = {}) : sim(QpType::kRC, f, 1024) {
    for (auto& c : sim.cfg) c.access |= kFlushGlobal | kFlushPersistent;
  }
  void start(uint32_t b_access = kAll) {
    a = sim.nodes[0].mem.add(kA, kLen, kAll);
    b = sim.nodes[1].mem.add(kB, kLen, b_access);
    for (size_t i = 0; i < kLen; i++) sim.nodes[0].mem.bytes(a)[i] = uint8_t(i * 7 + 1);
    sim.start();
  }
  EngineQp& qa() { return *sim.nodes[0].qp; }
  EngineQp& qb() { return *sim.nodes[1].qp; }
  std::vector<Completion>& ca() { return sim.nodes[0].cq.all; }
  TestMemory& mb() { return sim.nodes[1].mem; }
  bool settle() { return sim.run([] { return false; }); }

  SendWr atomic_write(uint64_t id, uint64_t local_off, uint64_t remote_off) {
    SendWr w = wr(id, WrOpcode::kAtomicWrite, a, kA + local_off, 8);
    w.remote_addr = kB + remote_off;
    w.rkey = b;
    return w;
  }
  SendWr flush(uint64_t id, uint64_t remote_off, uint32_t len, uint8_t placement, uint8_t level) {
    SendWr w;
    w.wr_id = id;
    w.opcode = WrOpcode::kFlush;
    w.remote_addr = kB + remote_off;
    w.rkey = b;
    w.flush_len = len;
    w.placement = placement;
    w.level = level;
    return w;
  }
};

// Every packet between the two, as parsed.
struct Trace {
  std::vector<Packet> to_b, to_a;
  std::vector<std::vector<uint8_t>> raw_to_b, raw_to_a;
  void attach(Sim& sim) {
    sim.nodes[1].tap = [this](std::vector<uint8_t>& bytes) { raw_to_b.push_back(bytes); };
    sim.nodes[0].tap = [this](std::vector<uint8_t>& bytes) { raw_to_a.push_back(bytes); };
  }
  void parse() {
    for (auto* v : {&raw_to_b, &raw_to_a})
      for (const auto& b : *v) {
        Packet p;
        if (parse_packet(b, false, &p) == ParseError::kOk) (v == &raw_to_b ? to_b : to_a).push_back(p);
      }
  }
};

TEST(A19Wire, FlushAndAtomicWriteAsRxeSendsThem) {
  Pair p;
  p.start();
  Trace t;
  t.attach(p.sim);
  p.qa().post_send(p.flush(1, 64, 128, abi::kFlushGlobal | abi::kFlushPersistent, abi::kFlushRange));
  p.qa().post_send(p.atomic_write(2, 16, 256));
  p.settle();
  ASSERT_EQ(p.ca().size(), 2u);
  EXPECT_EQ(p.ca()[0].status, WcStatus::kSuccess);
  EXPECT_EQ(p.ca()[0].opcode, WcOpcode::kFlush);
  EXPECT_EQ(p.ca()[0].byte_len, 128u);
  EXPECT_EQ(p.ca()[1].status, WcStatus::kSuccess);
  EXPECT_EQ(p.ca()[1].opcode, WcOpcode::kAtomicWrite);
  EXPECT_EQ(p.ca()[1].byte_len, 8u);
  t.parse();
  ASSERT_EQ(t.to_b.size(), 2u);
  EXPECT_EQ(t.to_b[0].bth.opcode, 0x1c);
  EXPECT_TRUE(t.to_b[0].bth.ack_req);
  EXPECT_EQ(t.raw_to_b[0].size(), 12u + 4 + 16);  // no payload (oA19-2)
  EXPECT_EQ(t.raw_to_b[0][15], 0x03);              // FETH: placement 3, selectivity range
  EXPECT_EQ(t.to_b[0].reth.va, kB + 64);
  EXPECT_EQ(t.to_b[0].reth.dma_len, 128u);
  EXPECT_EQ(t.to_b[1].bth.opcode, 0x1d);
  EXPECT_EQ(t.to_b[1].reth.dma_len, 8u);
  ASSERT_EQ(t.to_b[1].payload.size(), 8u);
  EXPECT_EQ(std::memcmp(t.to_b[1].payload.data(), p.sim.nodes[0].mem.bytes(p.a).data() + 16, 8), 0);
  ASSERT_EQ(t.to_a.size(), 2u);
  for (const Packet& r : t.to_a) {
    EXPECT_EQ(r.bth.opcode, op::kReadRespOnly);
    EXPECT_TRUE(r.payload.empty());
    EXPECT_EQ(syndrome_type(r.aeth.syndrome), AckType::kAck);
  }
  ASSERT_EQ(p.mb().flushes.size(), 1u);
  EXPECT_EQ(p.mb().flushes[0].va, kB + 64);
  EXPECT_EQ(p.mb().flushes[0].len, 128u);
  EXPECT_EQ(std::memcmp(p.mb().bytes(p.b).data() + 256, p.sim.nodes[0].mem.bytes(p.a).data() + 16, 8), 0);
}

// Selectivity MR flushes the key's whole region whatever the RETH says
// (rxe checks no range then).
TEST(A19Wire, FlushOfTheRegionIgnoresTheRange) {
  Pair p;
  p.start();
  p.qa().post_send(p.flush(1, 0x7fff0000, 1u << 31, abi::kFlushGlobal, abi::kFlushMr));
  p.settle();
  ASSERT_EQ(p.ca().size(), 1u);
  EXPECT_EQ(p.ca()[0].status, WcStatus::kSuccess);
  ASSERT_EQ(p.mb().flushes.size(), 1u);
  EXPECT_EQ(p.mb().flushes[0].va, kB);
  EXPECT_EQ(p.mb().flushes[0].len, kLen);
}

// Lost, repeated and reordered packets: each operation is carried out once
// (a duplicate is answered from the responder's resource), completes once,
// in order, and the memory holds every ATOMIC WRITE's bytes.
TEST(A19Wire, DoneOnceOnALossyLink) {
  uint64_t duplicates = 0;
  for (uint64_t seed = 1; seed <= 12; seed++) {
    SCOPED_TRACE(seed);
    Pair p(FaultConfig{0.15, 0.15, 0.1, 40000, seed});
    p.start();
    int flushes = 0;
    for (uint64_t i = 0; i < 40; i++) {
      if (i % 3 == 2) {
        p.qa().post_send(p.flush(i, i * 64, 64, abi::kFlushGlobal, abi::kFlushRange));
        flushes++;
      } else {
        p.qa().post_send(p.atomic_write(i, i * 8, i * 8));
      }
    }
    p.settle();
    ASSERT_EQ(p.ca().size(), 40u);
    for (uint64_t i = 0; i < 40; i++) {
      EXPECT_EQ(p.ca()[i].wr_id, i);
      EXPECT_EQ(p.ca()[i].status, WcStatus::kSuccess) << i;
      EXPECT_EQ(p.ca()[i].opcode, i % 3 == 2 ? WcOpcode::kFlush : WcOpcode::kAtomicWrite);
      if (i % 3 != 2) {
        EXPECT_EQ(std::memcmp(p.mb().bytes(p.b).data() + i * 8, p.sim.nodes[0].mem.bytes(p.a).data() + i * 8, 8), 0);
      }
    }
    EXPECT_EQ(p.mb().atomic_writes, 40u - uint64_t(flushes));
    EXPECT_EQ(p.mb().flushes.size(), size_t(flushes));
    duplicates += p.qb().stats().duplicates;
  }
  EXPECT_GT(duplicates, 0u) << "the link repeated nothing: the test tests no duplicate";
}

// What the responder refuses, with the NAK each gets (core::verdict): a
// placement type the QP or the R_Key does not grant, a range past the
// region, an ATOMIC WRITE without remote write are remote access errors; a
// misaligned ATOMIC WRITE an invalid request. Nothing is done.
TEST(A19Wire, Refusals) {
  struct Case {
    const char* name;
    uint32_t b_access, qp_access;
    bool flush;
    uint64_t off;
    uint8_t placement;
    WcStatus want;
  } const cases[] = {
      {"persistent, MR grants global", kAll & ~kFlushPersistent, kAll, true, 0, abi::kFlushPersistent,
       WcStatus::kRemAccessErr},
      {"global, QP grants no FLUSH", kAll, kRemoteWrite, true, 0, abi::kFlushGlobal, WcStatus::kRemAccessErr},
      {"range past the region", kAll, kAll, true, kLen - 32, abi::kFlushGlobal, WcStatus::kRemAccessErr},
      {"atomic write, no remote write", kAll & ~kRemoteWrite, kAll, false, 0, 0, WcStatus::kRemAccessErr},
      {"atomic write, QP without remote write", kAll, kRemoteRead, false, 0, 0, WcStatus::kRemAccessErr},
      {"atomic write misaligned", kAll, kAll, false, 4, 0, WcStatus::kRemInvReqErr},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    Pair p;
    p.sim.cfg[1].access = c.qp_access;
    p.start(c.b_access);
    p.qa().post_send(c.flush ? p.flush(1, c.off, 64, c.placement, abi::kFlushRange) : p.atomic_write(1, 0, c.off));
    p.settle();
    ASSERT_EQ(p.ca().size(), 1u);
    EXPECT_EQ(p.ca()[0].status, c.want);
    EXPECT_EQ(p.qb().responder_fault(), c.want);
    EXPECT_EQ(p.mb().flushes.size(), 0u);
    EXPECT_EQ(p.mb().atomic_writes, 0u);
  }
}

// A FLUSH with a selectivity level the annex does not define, or an ATOMIC
// WRITE whose RETH or payload is not 8 bytes, is a malformed request.
TEST(A19Wire, MalformedRequestsAreInvalid) {
  for (int k = 0; k < 3; k++) {
    SCOPED_TRACE(k);
    Pair p;
    p.start();
    Packet r;
    r.bth.psn = 0;
    r.bth.dest_qp = p.sim.cfg[1].qpn;
    r.bth.ack_req = true;
    const uint8_t v[16] = {};
    if (k == 0) {
      r.bth.opcode = op::kFlush;
      r.feth = Feth{1, 2};
      r.reth = Reth{kB, p.b, 64};
    } else {
      r.bth.opcode = op::kAtomicWrite;
      r.reth = Reth{kB, p.b, k == 1 ? 16u : 8u};
      r.payload = std::span<const uint8_t>(v, k == 1 ? 16 : 4);
    }
    std::vector<uint8_t> bytes(128);
    bytes.resize(build_packet(r, bytes));
    p.sim.inject(1, 0, bytes);
    p.settle();
    EXPECT_EQ(p.qb().responder_fault(), WcStatus::kRemInvReqErr);
    EXPECT_EQ(p.mb().atomic_writes, 0u);
    EXPECT_EQ(p.mb().flushes.size(), 0u);
  }
}

// An ATOMIC WRITE of other than 8 bytes never leaves the requester.
TEST(A19Wire, AtomicWriteOfOtherThanEightBytesIsALocalLengthError) {
  Pair p;
  p.start();
  SendWr w = p.atomic_write(1, 0, 0);
  w.sg[0].length = 4;
  p.qa().post_send(w);
  p.settle();
  ASSERT_EQ(p.ca().size(), 1u);
  EXPECT_EQ(p.ca()[0].status, WcStatus::kLocLenErr);
  EXPECT_EQ(p.mb().atomic_writes, 0u);
}

}  // namespace a19
}  // namespace sv::roce
