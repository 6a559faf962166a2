#include "roce/icrc.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "roce/headers.h"

namespace sv::roce {
namespace {

// An RC RDMA WRITE Only (QPN 0x12, PSN 0x345, AckReq, RETH va 0xdeadbeef rkey
// 0x1234 len 16, payload 00..0f) from 10.0.0.1 to 10.0.0.2, built by scapy
// 2.5 (scapy.contrib.roce computes the ICRC independently of this code).
const std::vector<uint8_t> kScapyWriteOnly = {
    0x45, 0x00, 0x00, 0x4c, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0x26, 0x9f, 0x0a, 0x00, 0x00, 0x01, 0x0a, 0x00, 0x00,
    0x02, 0xc0, 0x00, 0x12, 0xb7, 0x00, 0x38, 0x00, 0x00, 0x0a, 0x00, 0xff, 0xff, 0x00, 0x00, 0x00, 0x12, 0x80, 0x00,
    0x03, 0x45, 0x00, 0x00, 0x00, 0x00, 0xde, 0xad, 0xbe, 0xef, 0x00, 0x00, 0x12, 0x34, 0x00, 0x00, 0x00, 0x10, 0x00,
    0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0a, 0x0b, 0x0c, 0x0d, 0x0e, 0x0f, 0xf1, 0x55, 0xce, 0x65};

TEST(Crc32, IsTheEthernetCrc) {
  const char* s = "123456789";
  uint32_t c = crc32_update(0xffffffffu, std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(s), 9));
  EXPECT_EQ(c ^ 0xffffffffu, 0xCBF43926u);
}

// The bit-by-bit definition, as the reference for the fast versions.
uint32_t crc32_bitwise(uint32_t crc, const uint8_t* p, size_t n) {
  for (size_t i = 0; i < n; i++) {
    crc ^= p[i];
    for (int k = 0; k < 8; k++) crc = (crc & 1) ? (crc >> 1) ^ 0xEDB88320u : crc >> 1;
  }
  return crc;
}

// Slicing by 16 and both carry-less multiplication kernels (128-bit
// PCLMULQDQ, 512-bit VPCLMULQDQ) agree with the definition for every length
// up to 1100 bytes and many up to 9000 (each of the 512-bit loop's
// remainders), at several alignments, from arbitrary states; crc32_update,
// which picks among them, too.
TEST(Crc32, EveryKernelMatchesTables) {
  std::vector<uint8_t> buf(9000 + 16);
  uint64_t x = 0x9e3779b97f4a7c15ull;
  for (auto& b : buf) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    b = uint8_t(x);
  }
  int kernels_run = 0;
  for (CrcKernel k : {CrcKernel::kTables, CrcKernel::kClmul128, CrcKernel::kClmul512}) {
    if (!crc32_update_with(k, 0, std::span<const uint8_t>(buf.data(), 300))) continue;  // not on this CPU
    kernels_run++;
    for (size_t len = 0; len <= 9000; len += (len < 1100 ? 1 : 61)) {
      for (size_t off : {0, 1, 3, 8, 15}) {
        const uint32_t init = uint32_t(len * 2654435761u) ^ uint32_t(off);
        std::span<const uint8_t> d(buf.data() + off, len);
        const uint32_t want = crc32_bitwise(init, d.data(), d.size());
        ASSERT_EQ(crc32_update_with(k, init, d), want) << "kernel " << int(k) << " len " << len << " off " << off;
        if (k == CrcKernel::kTables) {
          ASSERT_EQ(crc32_update(init, d), want) << "len " << len << " off " << off;
        }
      }
    }
  }
  EXPECT_GE(kernels_run, 1);
  // A jumbo packet's worth, as the wire sends.
  std::vector<uint8_t> big(4096 + 60, 0xa5);
  EXPECT_EQ(crc32_update(0xdebb20e3u, big), crc32_bitwise(0xdebb20e3u, big.data(), big.size()));
}

std::vector<uint8_t> write_only_transport() {
  Packet p;
  p.bth.opcode = op::kWriteOnly;
  p.bth.dest_qp = 0x12;
  p.bth.psn = 0x345;
  p.bth.ack_req = true;
  p.reth = Reth{0xdeadbeef, 0x1234, 16};
  static uint8_t data[16];
  for (int i = 0; i < 16; i++) data[i] = uint8_t(i);
  p.payload = data;
  std::vector<uint8_t> t(packet_size(p));
  build_packet(p, t);
  return t;
}

// The ICRC over headers and transport packet in two pieces (the endpoint's
// way, no copy of the payload) is the ICRC over the whole datagram.
TEST(Icrc, SplitHeadersGiveTheSameIcrc) {
  auto t = write_only_transport();
  std::vector<uint8_t> big(t);
  big.resize(t.size() + 1024, 0x5a);  // a longer payload: the folded CRC path
  for (const auto* tr : {&t, &big}) {
    Ipv4Udp h4;
    h4.src = {10, 0, 0, 1};
    h4.dst = {10, 0, 0, 2};
    std::vector<uint8_t> f(2048);
    size_t n = frame_ipv4(h4, *tr, f);
    ASSERT_GT(n, 0u);
    uint8_t hdr[kIpv6UdpLen];
    ASSERT_EQ(header_ipv4(h4, tr->size(), hdr), kIpv4UdpLen);
    EXPECT_EQ(0, std::memcmp(hdr, f.data(), kIpv4UdpLen));
    EXPECT_EQ(icrc_compute(std::span<const uint8_t>(hdr, kIpv4UdpLen), *tr), icrc_load(f.data() + n - kIcrcLen));
    Ipv6Udp h6;
    h6.src[15] = 1;
    h6.dst[15] = 2;
    n = frame_ipv6(h6, *tr, f);
    ASSERT_GT(n, 0u);
    ASSERT_EQ(header_ipv6(h6, tr->size(), hdr), kIpv6UdpLen);
    EXPECT_EQ(0, std::memcmp(hdr, f.data(), 40));
    EXPECT_EQ(icrc_compute(std::span<const uint8_t>(hdr, kIpv6UdpLen), *tr), icrc_load(f.data() + n - kIcrcLen));
  }
}

// The ICRC from a cached header prefix over the transport packet in pieces
// (the zero-copy send: headers, payload pieces where they lie, pad) is the
// ICRC over the whole datagram, however the pieces cut it, and the check
// against scapy's datagram holds that way too.
TEST(Icrc, PrefixAndPiecesGiveTheSameIcrc) {
  const size_t ipl = kIpv4UdpLen;
  const std::span<const uint8_t> scapy(kScapyWriteOnly);
  auto prefix = icrc_prefix(scapy.first(ipl));
  ASSERT_TRUE(prefix);
  const std::span<const uint8_t> t = scapy.subspan(ipl, scapy.size() - ipl - kIcrcLen);
  EXPECT_EQ(icrc_finish(*prefix, std::span<const std::span<const uint8_t>>(&t, 1)),
            icrc_load(scapy.data() + scapy.size() - kIcrcLen));

  std::vector<uint8_t> tr(12 + 1024 + 3);
  uint64_t x = 0x243f6a8885a308d3ull;
  for (auto& b : tr) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    b = uint8_t(x);
  }
  Ipv4Udp h4;
  h4.src = {10, 0, 0, 1};
  h4.dst = {10, 0, 0, 2};
  for (size_t len : {12, 15, 16, 17, 28, 40, 63, 64, 65, 100, 1036, 1039}) {
    const std::span<const uint8_t> whole(tr.data(), len);
    uint8_t hdr[kIpv6UdpLen];
    ASSERT_EQ(header_ipv4(h4, len, hdr), ipl);
    const auto want = icrc_compute(std::span<const uint8_t>(hdr, ipl), whole);
    ASSERT_TRUE(want);
    auto pre = icrc_prefix(std::span<const uint8_t>(hdr, ipl));
    ASSERT_TRUE(pre);
    // Every cut into two pieces, and three pieces with an empty one among them.
    for (size_t a = 0; a <= len; a += (len > 100 ? 13 : 1)) {
      const std::span<const uint8_t> two[2] = {whole.first(a), whole.subspan(a)};
      ASSERT_EQ(icrc_finish(*pre, two), want) << "len " << len << " cut " << a;
      const size_t b = a + (len - a) / 2;
      const std::span<const uint8_t> three[4] = {whole.first(a), {}, whole.subspan(a, b - a), whole.subspan(b)};
      ASSERT_EQ(icrc_finish(*pre, three), want) << "len " << len << " cuts " << a << " " << b;
    }
  }
  // Fewer bytes than a BTH is malformed.
  const std::span<const uint8_t> short_one(tr.data(), 11);
  EXPECT_FALSE(icrc_finish(*prefix, std::span<const std::span<const uint8_t>>(&short_one, 1)));
}

TEST(Icrc, MatchesScapyByteForByte) {
  EXPECT_TRUE(icrc_check(kScapyWriteOnly));
  Ipv4Udp h;
  h.src = {10, 0, 0, 1};
  h.dst = {10, 0, 0, 2};
  auto t = write_only_transport();
  std::vector<uint8_t> out(200);
  size_t n = frame_ipv4(h, t, out);
  out.resize(n);
  EXPECT_EQ(out, kScapyWriteOnly);  // IP header (checksum, DF, id 0), UDP, BTH, RETH, ICRC
}

TEST(Icrc, MaskedFieldsDoNotCountOthersDo) {
  auto base = kScapyWriteOnly;
  // Variant fields (A17.4): TOS, TTL, IP checksum, UDP checksum, BTH resv8a.
  for (size_t i : {1, 8, 10, 11, 26, 27, 32}) {
    auto v = base;
    v[i] ^= 0x5a;
    EXPECT_TRUE(icrc_check(v)) << "byte " << i << " should be masked";
  }
  // Every other bit is covered: each single-bit flip is detected.
  for (size_t i = 0; i < base.size() - 4; i++) {
    if (i == 1 || i == 8 || i == 10 || i == 11 || i == 26 || i == 27 || i == 32) continue;
    for (int b = 0; b < 8; b++) {
      auto v = base;
      v[i] ^= uint8_t(1 << b);
      EXPECT_FALSE(icrc_check(v)) << "byte " << i << " bit " << b;
    }
  }
  for (size_t i = base.size() - 4; i < base.size(); i++) {
    auto v = base;
    v[i] ^= 1;
    EXPECT_FALSE(icrc_check(v));
  }
}

TEST(Icrc, Ipv6MasksClassFlowLabelHopLimit) {
  Ipv6Udp h;
  h.src[15] = 1;
  h.dst[15] = 2;
  auto t = write_only_transport();
  std::vector<uint8_t> a(300), b(300);
  size_t na = frame_ipv6(h, t, a);
  h.tclass = 0xb8;
  h.flow_label = 0xfffff;
  h.hop_limit = 1;
  size_t nb = frame_ipv6(h, t, b);
  ASSERT_EQ(na, nb);
  ASSERT_EQ(na, 48 + t.size() + 4);
  a.resize(na);
  b.resize(nb);
  EXPECT_NE(a, b);
  EXPECT_TRUE(icrc_check(a));
  EXPECT_TRUE(icrc_check(b));
  EXPECT_EQ(icrc_load(&a[na - 4]), icrc_load(&b[nb - 4]));
  EXPECT_NE(a[46] | a[47], 0);  // UDP checksum is present on IPv6
  h.src[15] = 3;
  std::vector<uint8_t> c(300);
  c.resize(frame_ipv6(h, t, c));
  EXPECT_NE(icrc_load(&c[c.size() - 4]), icrc_load(&a[na - 4]));
}

TEST(Icrc, MalformedDatagramsAreRejected) {
  EXPECT_FALSE(icrc_compute({}).has_value());
  auto v = kScapyWriteOnly;
  v[9] = 6;  // TCP
  EXPECT_FALSE(icrc_compute(v).has_value());
  v = kScapyWriteOnly;
  v[0] = 0x55;  // version 5
  EXPECT_FALSE(icrc_compute(v).has_value());
  v = kScapyWriteOnly;
  v[0] = 0x4f;  // IHL 60 bytes, longer than what follows can hold
  EXPECT_FALSE(icrc_compute(std::span<const uint8_t>(v).first(60)).has_value());
  for (size_t n = 0; n < 20 + 8 + 12; n++) {
    std::vector<uint8_t> cut(kScapyWriteOnly.begin(), kScapyWriteOnly.begin() + ptrdiff_t(n));
    EXPECT_FALSE(icrc_compute(cut).has_value()) << n;
  }
  EXPECT_FALSE(icrc_check(std::vector<uint8_t>{1, 2, 3}));
}

}  // namespace
}  // namespace sv::roce
