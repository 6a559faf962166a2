#include "roce/headers.h"

#include <cstring>

namespace sv::roce {

void Bth::encode(uint8_t* p) const {
  p[0] = opcode;
  p[1] = uint8_t((se ? 0x80 : 0) | (mig ? 0x40 : 0) | (pad & 3) << 4 | (tver & 0xf));
  put_be16(p + 2, pkey);
  p[4] = uint8_t((fecn ? 0x80 : 0) | (becn ? 0x40 : 0));  // resv8a: the rest reserved, 0
  put_be24(p + 5, dest_qp);
  p[8] = ack_req ? 0x80 : 0;  // resv7 0
  put_be24(p + 9, psn);
}
Bth Bth::decode(const uint8_t* p) {
  Bth b;
  b.opcode = p[0];
  b.se = p[1] & 0x80;
  b.mig = p[1] & 0x40;
  b.pad = (p[1] >> 4) & 3;
  b.tver = p[1] & 0xf;
  b.pkey = get_be16(p + 2);
  b.fecn = p[4] & 0x80;
  b.becn = p[4] & 0x40;
  b.dest_qp = get_be24(p + 5);
  b.ack_req = p[8] & 0x80;
  b.psn = get_be24(p + 9);
  return b;
}

void Reth::encode(uint8_t* p) const { put_be64(p, va); put_be32(p + 8, rkey); put_be32(p + 12, dma_len); }
Reth Reth::decode(const uint8_t* p) { return Reth{get_be64(p), get_be32(p + 8), get_be32(p + 12)}; }

void Aeth::encode(uint8_t* p) const { p[0] = syndrome; put_be24(p + 1, msn); }
Aeth Aeth::decode(const uint8_t* p) { return Aeth{p[0], get_be24(p + 1)}; }

void AtomicEth::encode(uint8_t* p) const {
  put_be64(p, va); put_be32(p + 8, rkey); put_be64(p + 12, swap_add); put_be64(p + 20, compare);
}
AtomicEth AtomicEth::decode(const uint8_t* p) {
  return AtomicEth{get_be64(p), get_be32(p + 8), get_be64(p + 12), get_be64(p + 20)};
}

void AtomicAckEth::encode(uint8_t* p) const { put_be64(p, orig); }
AtomicAckEth AtomicAckEth::decode(const uint8_t* p) { return AtomicAckEth{get_be64(p)}; }

void Deth::encode(uint8_t* p) const { put_be32(p, qkey); p[4] = 0; put_be24(p + 5, src_qp); }
Deth Deth::decode(const uint8_t* p) { return Deth{get_be32(p), get_be24(p + 5)}; }

uint64_t rnr_timer_ns(uint8_t code) {
  // IBTA 9.7.5.2.8 table 45, in units of 0.01 ms (code 0 = 655.36 ms).
  static constexpr uint32_t kCentiMs[32] = {
      65536, 1,    2,    3,    4,    6,    8,    12,   16,    24,    32,    48,    64,    96,    128,   192,
      256,      384,  512,  768,  1024, 1536, 2048, 3072, 4096,  6144,  8192,  12288, 16384, 24576, 32768, 49152};
  return uint64_t(kCentiMs[code & 31]) * 10000;  // 0.01 ms = 10000 ns
}

const char* parse_error_name(ParseError e) {
  switch (e) {
    case ParseError::kOk: return "ok";
    case ParseError::kTruncated: return "truncated";
    case ParseError::kBadOpcode: return "bad opcode";
    case ParseError::kBadVersion: return "bad transport version";
    case ParseError::kBadPad: return "bad pad count";
    case ParseError::kUnexpectedPayload: return "unexpected payload";
  }
  return "?";
}

ParseError parse_packet(std::span<const uint8_t> buf, bool has_icrc, Packet* out) {
  size_t len = buf.size();
  if (has_icrc) {
    if (len < kIcrcLen) return ParseError::kTruncated;
    len -= kIcrcLen;
  }
  if (len < kBthLen) return ParseError::kTruncated;
  const uint8_t* p = buf.data();
  Packet pk;
  pk.bth = Bth::decode(p);
  const OpcodeInfo& info = opcode_info(pk.bth.opcode);
  if (!info.valid) return ParseError::kBadOpcode;
  if (pk.bth.tver != 0) return ParseError::kBadVersion;
  if (len < info.hdr_len) return ParseError::kTruncated;
  size_t off = kBthLen;
  auto take = [&](size_t n) { const uint8_t* q = p + off; off += n; return q; };
  // XRCETH: 8 reserved bits, then the XRC SRQ number (IBTA annex A14).
  if (info.has(kHasXrcEth)) pk.xrc_srqn = get_be24(take(kXrcEthLen) + 1);
  if (info.has(kHasFeth)) pk.feth = Feth::decode(take(kFethLen));
  if (info.has(kHasDeth)) pk.deth = Deth::decode(take(kDethLen));
  if (info.has(kHasReth)) pk.reth = Reth::decode(take(kRethLen));
  if (info.has(kHasAtomicEth)) pk.atomic = AtomicEth::decode(take(kAtomicEthLen));
  if (info.has(kHasAeth)) pk.aeth = Aeth::decode(take(kAethLen));
  if (info.has(kHasAtomicAckEth)) pk.atomic_ack = AtomicAckEth::decode(take(kAtomicAckEthLen));
  if (info.has(kHasImmDt)) pk.imm = get_be32(take(kImmDtLen));
  if (info.has(kHasIeth)) pk.ieth_rkey = get_be32(take(kIethLen));
  size_t rest = len - off;
  if (!info.payload) {
    if (pk.bth.pad != 0) return ParseError::kBadPad;
    if (rest != 0) return ParseError::kUnexpectedPayload;
  } else {
    if (pk.bth.pad > rest) return ParseError::kBadPad;
    pk.payload = std::span<const uint8_t>(p + off, rest - pk.bth.pad);
  }
  *out = pk;
  return ParseError::kOk;
}

size_t packet_size(const Packet& p) {
  const OpcodeInfo& info = p.info();
  if (!info.payload) return info.hdr_len;
  return info.hdr_len + ((p.payload.size() + 3) & ~size_t(3));
}

size_t build_headers(const Packet& pk, size_t payload_len, std::span<uint8_t> out) {
  const OpcodeInfo& info = pk.info();
  if (!info.valid) return 0;
  if (!info.payload && payload_len != 0) return 0;
  if (out.size() < info.hdr_len) return 0;
  uint8_t* p = out.data();
  Bth b = pk.bth;
  b.pad = info.payload ? uint8_t((4 - (payload_len & 3)) & 3) : 0;  // IBTA 9.2: pad to a multiple of 4 bytes
  b.encode(p);
  size_t off = kBthLen;
  if (info.has(kHasXrcEth)) {
    p[off] = 0;  // reserved
    put_be24(p + off + 1, pk.xrc_srqn);
    off += kXrcEthLen;
  }
  if (info.has(kHasFeth)) { pk.feth.encode(p + off); off += kFethLen; }
  if (info.has(kHasDeth)) { pk.deth.encode(p + off); off += kDethLen; }
  if (info.has(kHasReth)) { pk.reth.encode(p + off); off += kRethLen; }
  if (info.has(kHasAtomicEth)) { pk.atomic.encode(p + off); off += kAtomicEthLen; }
  if (info.has(kHasAeth)) { pk.aeth.encode(p + off); off += kAethLen; }
  if (info.has(kHasAtomicAckEth)) { pk.atomic_ack.encode(p + off); off += kAtomicAckEthLen; }
  if (info.has(kHasImmDt)) { put_be32(p + off, pk.imm); off += kImmDtLen; }
  if (info.has(kHasIeth)) { put_be32(p + off, pk.ieth_rkey); off += kIethLen; }
  return off;
}

size_t build_packet(const Packet& pk, std::span<uint8_t> out) {
  const size_t total = packet_size(pk);
  if (!pk.info().valid || out.size() < total) return 0;
  size_t off = build_headers(pk, pk.payload.size(), out);
  if (off == 0) return 0;
  uint8_t* p = out.data();
  if (!pk.payload.empty()) std::memcpy(p + off, pk.payload.data(), pk.payload.size());
  off += pk.payload.size();
  while (off < total) p[off++] = 0;
  return total;
}

}  // namespace sv::roce
