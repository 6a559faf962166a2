#include "roce/headers.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

namespace sv::roce {
namespace {

TEST(Opcodes, TableMatchesIbtaTable38) {
  int rc = 0, uc = 0, ud = 0, xrc = 0;
  for (int i = 0; i < 256; i++) {
    const OpcodeInfo& o = opcode_info(uint8_t(i));
    if (!o.valid) continue;
    EXPECT_EQ(int(o.transport), i >> 5) << i;
    (o.transport == Transport::kRC ? rc : o.transport == Transport::kUC ? uc : o.transport == Transport::kUD ? ud : xrc)++;
  }
  EXPECT_EQ(rc, 25);  // 0x00-0x17 without 0x15 (RD's RESYNC), and annex A19's FLUSH (0x1c), ATOMIC WRITE (0x1d)
  EXPECT_EQ(uc, 12);  // SEND and RDMA WRITE only
  EXPECT_EQ(ud, 2);
  EXPECT_EQ(xrc, 23);  // annex A14: RC's, with the 101 prefix (0xa0-0xb7 without 0xb5)
  EXPECT_FALSE(opcode_info(0x15).valid);
  EXPECT_FALSE(opcode_info(0x2c).valid);  // no READ on UC
  EXPECT_FALSE(opcode_info(0x33).valid);  // no atomics on UC
  EXPECT_FALSE(opcode_info(0x60).valid);  // UD has SEND Only (with Immediate) alone
}

TEST(Opcodes, HeadersAndProperties) {
  EXPECT_EQ(opcode_info(op::kWriteOnlyImm).hdrs, kHasReth | kHasImmDt);
  EXPECT_EQ(opcode_info(op::kWriteOnlyImm).hdr_len, 12 + 16 + 4);
  EXPECT_EQ(opcode_info(op::kWriteFirst).hdr_len, 28);
  EXPECT_EQ(opcode_info(op::kWriteMiddle).hdr_len, 12);
  EXPECT_EQ(opcode_info(op::kReadRequest).hdr_len, 28);
  EXPECT_FALSE(opcode_info(op::kReadRequest).payload);
  EXPECT_TRUE(opcode_info(op::kReadRequest).request);
  EXPECT_EQ(opcode_info(op::kReadRespMiddle).hdr_len, 12);  // no AETH in the middle
  EXPECT_EQ(opcode_info(op::kReadRespLast).hdr_len, 16);
  EXPECT_FALSE(opcode_info(op::kReadRespOnly).request);
  EXPECT_EQ(opcode_info(op::kAck).hdr_len, 16);
  EXPECT_EQ(opcode_info(op::kAtomicAck).hdr_len, 24);
  EXPECT_EQ(opcode_info(op::kCompareSwap).hdr_len, 40);
  EXPECT_EQ(opcode_info(op::kFetchAdd).kind, OpKind::kFetchAdd);
  EXPECT_EQ(opcode_info(op::kSendOnlyInv).hdr_len, 16);
  EXPECT_EQ(opcode_info(op::kUD | op::kSendOnlyImm).hdr_len, 24);
  EXPECT_TRUE(opcode_info(op::kSendLast).ends_message());
  EXPECT_FALSE(opcode_info(op::kSendMiddle).starts_message());
  EXPECT_TRUE(opcode_info(op::kUC | op::kWriteFirst).starts_message());
  EXPECT_STREQ(opcode_info(0x12).name, "RC ATOMIC Acknowledge");
  // IBTA annex A19 (rxe's layout): FLUSH is BTH, FETH, RETH and no payload;
  // ATOMIC WRITE is BTH, RETH and its payload. RC only.
  EXPECT_EQ(opcode_info(op::kFlush).hdrs, kHasFeth | kHasReth);
  EXPECT_EQ(opcode_info(op::kFlush).hdr_len, 12 + 4 + 16);
  EXPECT_FALSE(opcode_info(op::kFlush).payload);
  EXPECT_EQ(opcode_info(op::kAtomicWrite).hdr_len, 12 + 16);
  EXPECT_TRUE(opcode_info(op::kAtomicWrite).payload);
  EXPECT_TRUE(opcode_info(op::kAtomicWrite).request);
  EXPECT_FALSE(opcode_info(op::kUC | op::kFlush).valid);
  EXPECT_FALSE(opcode_info(op::kXRC | op::kAtomicWrite).valid);
}

// FLUSH on the wire as rxe writes it: FETH's placement type in bits 3-0 and
// selectivity level in bits 5-4 of its last byte, before the RETH.
TEST(Opcodes, FlushAndAtomicWriteRoundTrip) {
  Packet f;
  f.bth.opcode = op::kFlush;
  f.bth.psn = 7;
  f.feth = Feth{2, 1};  // persistent, whole region
  f.reth = Reth{0x1000, 0x1234, 64};
  uint8_t buf[64];
  const size_t n = build_packet(f, buf);
  ASSERT_EQ(n, 32u);
  EXPECT_EQ(buf[12], 0);
  EXPECT_EQ(buf[15], 0x12);
  EXPECT_EQ(get_be64(buf + 16), 0x1000u);
  Packet g;
  ASSERT_EQ(parse_packet(std::span<const uint8_t>(buf, n), false, &g), ParseError::kOk);
  EXPECT_EQ(g.feth.placement, 2);
  EXPECT_EQ(g.feth.level, 1);
  EXPECT_EQ(g.reth.rkey, 0x1234u);
  EXPECT_EQ(g.reth.dma_len, 64u);
  // Bytes after a FLUSH's headers are not a FLUSH.
  uint8_t longer[68] = {};
  std::memcpy(longer, buf, n);
  EXPECT_EQ(parse_packet(std::span<const uint8_t>(longer, n + 4), false, &g), ParseError::kUnexpectedPayload);

  Packet a;
  a.bth.opcode = op::kAtomicWrite;
  a.reth = Reth{0x2008, 0x55, 8};
  const uint8_t v[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  a.payload = v;
  const size_t m = build_packet(a, buf);
  ASSERT_EQ(m, 12u + 16 + 8);
  ASSERT_EQ(parse_packet(std::span<const uint8_t>(buf, m), false, &g), ParseError::kOk);
  ASSERT_EQ(g.payload.size(), 8u);
  EXPECT_EQ(g.payload[7], 8);
  EXPECT_EQ(g.reth.va, 0x2008u);
}

TEST(Headers, BthWireLayout) {
  Bth b;
  b.opcode = 0x0a;
  b.se = true;
  b.pad = 3;
  b.pkey = 0x1234;
  b.becn = true;
  b.dest_qp = 0xabcdef;
  b.ack_req = true;
  b.psn = 0x123456;
  uint8_t p[12];
  b.encode(p);
  const uint8_t want[12] = {0x0a, 0xb0, 0x12, 0x34, 0x40, 0xab, 0xcd, 0xef, 0x80, 0x12, 0x34, 0x56};
  EXPECT_EQ(0, memcmp(p, want, 12));
  Bth d = Bth::decode(p);
  EXPECT_EQ(d.opcode, 0x0a);
  EXPECT_TRUE(d.se);
  EXPECT_FALSE(d.mig);
  EXPECT_EQ(d.pad, 3);
  EXPECT_EQ(d.pkey, 0x1234);
  EXPECT_FALSE(d.fecn);
  EXPECT_TRUE(d.becn);
  EXPECT_EQ(d.dest_qp, 0xabcdefu);
  EXPECT_TRUE(d.ack_req);
  EXPECT_EQ(d.psn, 0x123456u);
}

TEST(Headers, ExtensionWireLayouts) {
  uint8_t p[28];
  AtomicEth{0x0102030405060708ull, 0x090a0b0cu, 0x1112131415161718ull, 0x2122232425262728ull}.encode(p);
  EXPECT_EQ(p[0], 0x01);
  EXPECT_EQ(p[11], 0x0c);
  EXPECT_EQ(p[12], 0x11);  // swap/add data comes before compare data
  EXPECT_EQ(p[27], 0x28);
  Deth{0x80010002u, 0xfedcbau}.encode(p);
  const uint8_t deth[8] = {0x80, 0x01, 0x00, 0x02, 0x00, 0xfe, 0xdc, 0xba};
  EXPECT_EQ(0, memcmp(p, deth, 8));
  Aeth{syndrome_nak(NakCode::kRemoteAccess), 0x010203}.encode(p);
  const uint8_t aeth[4] = {0x62, 0x01, 0x02, 0x03};
  EXPECT_EQ(0, memcmp(p, aeth, 4));
}

TEST(Headers, Syndromes) {
  EXPECT_EQ(syndrome_type(syndrome_ack()), AckType::kAck);
  EXPECT_EQ(syndrome_ack(), 0x1f);
  EXPECT_EQ(syndrome_type(syndrome_rnr(14)), AckType::kRnrNak);
  EXPECT_EQ(syndrome_value(syndrome_rnr(14)), 14);
  EXPECT_EQ(syndrome_nak(NakCode::kPsnSeqError), 0x60);
  EXPECT_EQ(syndrome_nak(NakCode::kRemoteOperational), 0x63);
  EXPECT_EQ(syndrome_type(0x61), AckType::kNak);
}

TEST(Headers, RnrTimerTable45) {
  EXPECT_EQ(rnr_timer_ns(0), 655360000ull);
  EXPECT_EQ(rnr_timer_ns(1), 10000ull);
  EXPECT_EQ(rnr_timer_ns(5), 60000ull);
  EXPECT_EQ(rnr_timer_ns(14), 1280000ull);
  EXPECT_EQ(rnr_timer_ns(18), 5120000ull);
  EXPECT_EQ(rnr_timer_ns(31), 491520000ull);
  for (int c = 2; c < 32; c++) EXPECT_GT(rnr_timer_ns(uint8_t(c)), rnr_timer_ns(uint8_t(c - 1))) << c;
}

Packet sample(uint8_t opc, std::span<const uint8_t> payload) {
  Packet p;
  p.bth.opcode = opc;
  p.bth.dest_qp = 0x123456;
  p.bth.psn = 0xfffffe;
  p.bth.ack_req = true;
  p.reth = Reth{0x1000200030004000ull, 0x77, 12345};
  p.aeth = Aeth{0x1f, 0xabcdef};
  p.atomic = AtomicEth{0x8000, 0x99, 5, 6};
  p.atomic_ack = AtomicAckEth{0x1234567890abcdefull};
  p.deth = Deth{0x11111111, 0x222222};
  p.imm = 0xcafebabe;
  p.ieth_rkey = 0xdeadbeef;
  p.xrc_srqn = 0x654321;
  if (opcode_info(opc).payload) p.payload = payload;
  return p;
}

TEST(Packets, RoundTripEveryOpcodeAndPad) {
  std::vector<uint8_t> data(9);
  for (size_t i = 0; i < data.size(); i++) data[i] = uint8_t(0xa0 + i);
  for (int opc = 0; opc < 256; opc++) {
    const OpcodeInfo& info = opcode_info(uint8_t(opc));
    if (!info.valid) continue;
    for (size_t len = 0; len <= data.size(); len++) {
      if (!info.payload && len) break;
      Packet p = sample(uint8_t(opc), std::span<const uint8_t>(data).first(len));
      std::vector<uint8_t> buf(packet_size(p));
      ASSERT_EQ(build_packet(p, buf), buf.size());
      EXPECT_EQ(buf.size() % 4, 0u);
      EXPECT_EQ(buf.size(), info.hdr_len + ((len + 3) & ~size_t(3)));
      Packet q;
      ASSERT_EQ(parse_packet(buf, false, &q), ParseError::kOk) << opc << " " << len;
      EXPECT_EQ(q.bth.opcode, opc);
      EXPECT_EQ(q.bth.psn, 0xfffffeu);
      EXPECT_EQ(q.bth.dest_qp, 0x123456u);
      EXPECT_EQ(q.bth.pad, info.payload ? (4 - len % 4) % 4 : 0);
      ASSERT_EQ(q.payload.size(), len);
      EXPECT_TRUE(std::equal(q.payload.begin(), q.payload.end(), data.begin()));
      if (info.has(kHasReth)) {
        EXPECT_EQ(q.reth.va, p.reth.va);
        EXPECT_EQ(q.reth.rkey, p.reth.rkey);
        EXPECT_EQ(q.reth.dma_len, p.reth.dma_len);
      }
      if (info.has(kHasAeth)) { EXPECT_EQ(q.aeth.msn, 0xabcdefu); }
      EXPECT_EQ(q.xrc_srqn, info.has(kHasXrcEth) ? 0x654321u : 0u);
      if (info.has(kHasAtomicEth)) {
        EXPECT_EQ(q.atomic.va, 0x8000u);
        EXPECT_EQ(q.atomic.compare, 6u);
      }
      if (info.has(kHasAtomicAckEth)) { EXPECT_EQ(q.atomic_ack.orig, p.atomic_ack.orig); }
      if (info.has(kHasDeth)) { EXPECT_EQ(q.deth.src_qp, 0x222222u); }
      if (info.has(kHasImmDt)) { EXPECT_EQ(q.imm, 0xcafebabeu); }
      if (info.has(kHasIeth)) { EXPECT_EQ(q.ieth_rkey, 0xdeadbeefu); }
      // With an ICRC after it the same packet parses to the same payload.
      buf.insert(buf.end(), {1, 2, 3, 4});
      ASSERT_EQ(parse_packet(buf, true, &q), ParseError::kOk);
      EXPECT_EQ(q.payload.size(), len);
    }
  }
}

TEST(Packets, EveryTruncationIsAnErrorOrAShorterPacketInsideTheBuffer) {
  std::vector<uint8_t> data(7, 0x5a);
  for (int opc = 0; opc < 256; opc++) {
    const OpcodeInfo& info = opcode_info(uint8_t(opc));
    if (!info.valid) continue;
    Packet p = sample(uint8_t(opc), data);
    std::vector<uint8_t> full(packet_size(p));
    ASSERT_EQ(build_packet(p, full), full.size());
    for (size_t n = 0; n < full.size(); n++) {
      // An exact-size heap copy so that a read past the end is caught by ASan.
      std::vector<uint8_t> cut(full.begin(), full.begin() + ptrdiff_t(n));
      Packet q;
      ParseError e = parse_packet(cut, false, &q);
      if (n < info.hdr_len) {
        EXPECT_EQ(e, ParseError::kTruncated) << opc << " " << n;
      } else if (e == ParseError::kOk) {
        EXPECT_TRUE(info.payload);
        EXPECT_LE(q.payload.size() + info.hdr_len + q.bth.pad, n);
      }
      if (n < info.hdr_len + kIcrcLen) { EXPECT_NE(parse_packet(cut, true, &q), ParseError::kOk); }
    }
  }
}

TEST(Packets, MalformedPacketsAreErrors) {
  std::vector<uint8_t> data(8, 1);
  Packet p = sample(op::kSendOnly, data);
  std::vector<uint8_t> buf(packet_size(p));
  ASSERT_EQ(build_packet(p, buf), buf.size());
  Packet q;
  auto bad = buf;
  bad[0] = 0x15;
  EXPECT_EQ(parse_packet(bad, false, &q), ParseError::kBadOpcode);
  bad = buf;
  bad[1] |= 0x01;  // TVer 1
  EXPECT_EQ(parse_packet(bad, false, &q), ParseError::kBadVersion);
  bad = std::vector<uint8_t>(buf.begin(), buf.begin() + 14);
  bad[1] |= 0x30;  // pad 3 with 2 bytes of payload
  EXPECT_EQ(parse_packet(bad, false, &q), ParseError::kBadPad);
  Packet ack = sample(op::kAck, {});
  buf.assign(packet_size(ack), 0);
  ASSERT_EQ(build_packet(ack, buf), buf.size());
  bad = buf;
  bad.push_back(0);
  EXPECT_EQ(parse_packet(bad, false, &q), ParseError::kUnexpectedPayload);
  bad = buf;
  bad[1] |= 0x10;
  EXPECT_EQ(parse_packet(bad, false, &q), ParseError::kBadPad);
  // build_packet refuses what it cannot write.
  Packet inv = sample(0x15, {});
  EXPECT_EQ(build_packet(inv, buf), 0u);
  Packet big = sample(op::kSendOnly, data);
  std::vector<uint8_t> small(packet_size(big) - 1);
  EXPECT_EQ(build_packet(big, small), 0u);
}

}  // namespace
}  // namespace sv::roce
