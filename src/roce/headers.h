// headers.h: the InfiniBand transport headers as RoCEv2 carries them (IBTA
// vol. 1 9.2-9.3 and Annex A17): BTH, RETH, AETH, AtomicETH, AtomicAckETH,
// DETH, ImmDt, IETH, XRCETH (Annex A14), FETH (Annex A19); the opcode table (IBTA 9.2, table
// 38, with A14's XRC opcodes) as data; and a
// packet parser/builder for "BTH .. payload .. pad" (the ICRC is added and
// checked by icrc.h, since it covers the IP and UDP headers too).
//
// Contract: pure functions and constexpr data, thread-safe. Decoders never
// read outside the span they are given; a malformed packet is reported as a
// ParseError, never as a crash or a partially filled Packet the caller could
// trust. Packet::payload points into the caller's buffer (no ownership).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>

namespace sv::roce {

constexpr uint16_t kRoceV2Port = 4791;  // IANA; IBTA Annex A17
constexpr size_t kBthLen = 12, kRethLen = 16, kAethLen = 4, kAtomicEthLen = 28, kAtomicAckEthLen = 8,
                 kDethLen = 8, kImmDtLen = 4, kIethLen = 4, kXrcEthLen = 4, kIcrcLen = 4, kFethLen = 4;
constexpr uint16_t kDefaultPkey = 0xffff;
// The destination QP of every multicast packet (IBTA vol. 1 9.8.2 and
// 10.5: UD only; the members are the QPs attached to the group its DGID, on
// RoCEv2 its IP destination, names; rxe's IB_MULTICAST_QPN).
constexpr uint32_t kMulticastQpn = 0xffffff;

// ---- Byte order: explicit big-endian loads and stores, no unaligned access.
inline void put_be16(uint8_t* p, uint16_t v) { p[0] = uint8_t(v >> 8); p[1] = uint8_t(v); }
inline void put_be24(uint8_t* p, uint32_t v) { p[0] = uint8_t(v >> 16); p[1] = uint8_t(v >> 8); p[2] = uint8_t(v); }
inline void put_be32(uint8_t* p, uint32_t v) { put_be16(p, uint16_t(v >> 16)); put_be16(p + 2, uint16_t(v)); }
inline void put_be64(uint8_t* p, uint64_t v) { put_be32(p, uint32_t(v >> 32)); put_be32(p + 4, uint32_t(v)); }
inline uint16_t get_be16(const uint8_t* p) { return uint16_t(p[0] << 8 | p[1]); }
inline uint32_t get_be24(const uint8_t* p) { return uint32_t(p[0]) << 16 | uint32_t(p[1]) << 8 | p[2]; }
inline uint32_t get_be32(const uint8_t* p) { return uint32_t(get_be16(p)) << 16 | get_be16(p + 2); }
inline uint64_t get_be64(const uint8_t* p) { return uint64_t(get_be32(p)) << 32 | get_be32(p + 4); }

// ---- The headers, host-order fields. encode() writes exactly kXxxLen bytes.
struct Bth {  // IBTA 9.2
  uint8_t opcode = 0;
  bool se = false;        // solicited event
  bool mig = false;       // MigReq
  uint8_t pad = 0;        // pad count, 0..3
  uint8_t tver = 0;       // transport header version, 0
  uint16_t pkey = kDefaultPkey;
  bool fecn = false, becn = false;  // RoCEv2 puts these in resv8a's top bits (A17.4)
  uint32_t dest_qp = 0;   // 24 bits
  bool ack_req = false;
  uint32_t psn = 0;       // 24 bits
  void encode(uint8_t* p) const;
  static Bth decode(const uint8_t* p);
};
struct Reth {  // IBTA 9.3
  uint64_t va = 0;
  uint32_t rkey = 0;
  uint32_t dma_len = 0;
  void encode(uint8_t* p) const;
  static Reth decode(const uint8_t* p);
};
struct Aeth {  // IBTA 9.3
  uint8_t syndrome = 0;
  uint32_t msn = 0;  // 24 bits
  void encode(uint8_t* p) const;
  static Aeth decode(const uint8_t* p);
};
struct AtomicEth {  // IBTA 9.3
  uint64_t va = 0;
  uint32_t rkey = 0;
  uint64_t swap_add = 0;
  uint64_t compare = 0;
  void encode(uint8_t* p) const;
  static AtomicEth decode(const uint8_t* p);
};
struct AtomicAckEth {  // IBTA 9.3
  uint64_t orig = 0;
  void encode(uint8_t* p) const;
  static AtomicAckEth decode(const uint8_t* p);
};
struct Deth {  // IBTA 9.3
  uint32_t qkey = 0;
  uint32_t src_qp = 0;  // 24 bits
  void encode(uint8_t* p) const;
  static Deth decode(const uint8_t* p);
};

// ---- AETH syndromes, IBTA 9.7.5.2 (the AETH syndrome encoding).
enum class AckType : uint8_t { kAck = 0, kRnrNak = 1, kNak = 3, kReserved = 2 };
enum class NakCode : uint8_t {
  kPsnSeqError = 0, kInvalidRequest = 1, kRemoteAccess = 2, kRemoteOperational = 3, kInvalidRdRequest = 4,
};
constexpr uint8_t kUnlimitedCredits = 0x1f;
constexpr uint8_t syndrome_ack(uint8_t credits = kUnlimitedCredits) { return credits & 0x1f; }
constexpr uint8_t syndrome_rnr(uint8_t timer_code) { return uint8_t(0x20 | (timer_code & 0x1f)); }
constexpr uint8_t syndrome_nak(NakCode c) { return uint8_t(0x60 | uint8_t(c)); }
constexpr AckType syndrome_type(uint8_t s) { return AckType((s >> 5) & 3); }  // top bit is reserved, 0
constexpr uint8_t syndrome_value(uint8_t s) { return s & 0x1f; }

// RNR NAK timer codes, IBTA 9.7.5.2.8 table 45, in nanoseconds (code 0 is
// the longest, 655.36 ms).
uint64_t rnr_timer_ns(uint8_t code);

// ---- The opcode table.
// The top three bits of an opcode (IBTA 9.2 table 38; 100 is CNP, A17.9.3;
// 101 is XRC, annex A14).
enum class Transport : uint8_t { kRC = 0, kUC = 1, kRD = 2, kUD = 3, kXRC = 5 };
enum class OpKind : uint8_t {
  kSend, kWrite, kReadRequest, kReadResponse, kAck, kAtomicAck, kCompareSwap, kFetchAdd, kFlush, kAtomicWrite
};
enum Hdr : uint16_t {  // which extension headers follow BTH (order on the wire: IBTA 9.2 figure)
  kHasDeth = 1, kHasReth = 2, kHasAtomicEth = 4, kHasAeth = 8, kHasAtomicAckEth = 16, kHasImmDt = 32,
  kHasIeth = 64,
  kHasXrcEth = 128,  // XRC requests: right after BTH, before RETH / AtomicETH (IBTA annex A14)
  kHasFeth = 256,    // FLUSH: right after BTH, before its RETH (IBTA annex A19)
};

// The FLUSH Extended Transport Header (IBTA annex A19; 4 bytes): the
// placement type in bits 3-0, the selectivity level in bits 5-4, the rest
// reserved (0), as rxe lays it out.
struct Feth {
  uint8_t placement = 0;
  uint8_t level = 0;
  void encode(uint8_t* p) const {
    p[0] = p[1] = p[2] = 0;
    p[3] = uint8_t((placement & 0xf) | (level & 0x3) << 4);
  }
  static Feth decode(const uint8_t* p) { return {uint8_t(p[3] & 0xf), uint8_t((p[3] >> 4) & 0x3)}; }
};
enum class Position : uint8_t { kOnly, kFirst, kMiddle, kLast };

struct OpcodeInfo {
  bool valid = false;
  const char* name = nullptr;  // as IBTA table 38 spells it
  Transport transport = Transport::kRC;
  OpKind kind = OpKind::kSend;
  Position pos = Position::kOnly;
  uint16_t hdrs = 0;           // Hdr bits
  bool payload = false;        // carries data after the headers
  bool request = false;        // requester -> responder (else a response)
  uint8_t hdr_len = 0;         // BTH + extension headers
  constexpr bool starts_message() const { return pos == Position::kOnly || pos == Position::kFirst; }
  constexpr bool ends_message() const { return pos == Position::kOnly || pos == Position::kLast; }
  constexpr bool has(Hdr h) const { return (hdrs & h) != 0; }
};

namespace detail {
constexpr OpcodeInfo op(const char* name, Transport t, OpKind k, Position pos, uint16_t hdrs, bool payload,
                        bool request) {
  OpcodeInfo i;
  i.valid = true; i.name = name; i.transport = t; i.kind = k; i.pos = pos; i.hdrs = hdrs;
  i.payload = payload; i.request = request;
  size_t len = kBthLen;
  if (hdrs & kHasXrcEth) len += kXrcEthLen;
  if (hdrs & kHasFeth) len += kFethLen;
  if (hdrs & kHasDeth) len += kDethLen;
  if (hdrs & kHasReth) len += kRethLen;
  if (hdrs & kHasAtomicEth) len += kAtomicEthLen;
  if (hdrs & kHasAeth) len += kAethLen;
  if (hdrs & kHasAtomicAckEth) len += kAtomicAckEthLen;
  if (hdrs & kHasImmDt) len += kImmDtLen;
  if (hdrs & kHasIeth) len += kIethLen;
  i.hdr_len = uint8_t(len);
  return i;
}
// IBTA 9.2 table 38: the low five bits are the operation, the top three the
// transport (RC 000, UC 001, RD 010, UD 011).
constexpr std::array<OpcodeInfo, 256> make_opcode_table() {
  std::array<OpcodeInfo, 256> t{};
  using P = Position;
  using K = OpKind;
  constexpr Transport RC = Transport::kRC, UC = Transport::kUC, UD = Transport::kUD;
  for (Transport tr : {RC, UC}) {
    uint8_t b = uint8_t(uint8_t(tr) << 5);
    const bool rc = tr == RC;
    t[b | 0x00] = op(rc ? "RC SEND First" : "UC SEND First", tr, K::kSend, P::kFirst, 0, true, true);
    t[b | 0x01] = op(rc ? "RC SEND Middle" : "UC SEND Middle", tr, K::kSend, P::kMiddle, 0, true, true);
    t[b | 0x02] = op(rc ? "RC SEND Last" : "UC SEND Last", tr, K::kSend, P::kLast, 0, true, true);
    t[b | 0x03] = op(rc ? "RC SEND Last with Immediate" : "UC SEND Last with Immediate", tr, K::kSend, P::kLast,
                     kHasImmDt, true, true);
    t[b | 0x04] = op(rc ? "RC SEND Only" : "UC SEND Only", tr, K::kSend, P::kOnly, 0, true, true);
    t[b | 0x05] = op(rc ? "RC SEND Only with Immediate" : "UC SEND Only with Immediate", tr, K::kSend, P::kOnly,
                     kHasImmDt, true, true);
    t[b | 0x06] = op(rc ? "RC RDMA WRITE First" : "UC RDMA WRITE First", tr, K::kWrite, P::kFirst, kHasReth, true,
                     true);
    t[b | 0x07] = op(rc ? "RC RDMA WRITE Middle" : "UC RDMA WRITE Middle", tr, K::kWrite, P::kMiddle, 0, true, true);
    t[b | 0x08] = op(rc ? "RC RDMA WRITE Last" : "UC RDMA WRITE Last", tr, K::kWrite, P::kLast, 0, true, true);
    t[b | 0x09] = op(rc ? "RC RDMA WRITE Last with Immediate" : "UC RDMA WRITE Last with Immediate", tr, K::kWrite,
                     P::kLast, kHasImmDt, true, true);
    t[b | 0x0a] = op(rc ? "RC RDMA WRITE Only" : "UC RDMA WRITE Only", tr, K::kWrite, P::kOnly, kHasReth, true, true);
    t[b | 0x0b] = op(rc ? "RC RDMA WRITE Only with Immediate" : "UC RDMA WRITE Only with Immediate", tr, K::kWrite,
                     P::kOnly, kHasReth | kHasImmDt, true, true);
  }
  t[0x0c] = op("RC RDMA READ Request", RC, K::kReadRequest, P::kOnly, kHasReth, false, true);
  t[0x0d] = op("RC RDMA READ response First", RC, K::kReadResponse, P::kFirst, kHasAeth, true, false);
  t[0x0e] = op("RC RDMA READ response Middle", RC, K::kReadResponse, P::kMiddle, 0, true, false);
  t[0x0f] = op("RC RDMA READ response Last", RC, K::kReadResponse, P::kLast, kHasAeth, true, false);
  t[0x10] = op("RC RDMA READ response Only", RC, K::kReadResponse, P::kOnly, kHasAeth, true, false);
  t[0x11] = op("RC Acknowledge", RC, K::kAck, P::kOnly, kHasAeth, false, false);
  t[0x12] = op("RC ATOMIC Acknowledge", RC, K::kAtomicAck, P::kOnly, kHasAeth | kHasAtomicAckEth, false, false);
  t[0x13] = op("RC CmpSwap", RC, K::kCompareSwap, P::kOnly, kHasAtomicEth, false, true);
  t[0x14] = op("RC FetchAdd", RC, K::kFetchAdd, P::kOnly, kHasAtomicEth, false, true);
  // 0x15 is RD's RESYNC in table 38; not valid for RC.
  t[0x16] = op("RC SEND Last with Invalidate", RC, K::kSend, P::kLast, kHasIeth, true, true);
  t[0x17] = op("RC SEND Only with Invalidate", RC, K::kSend, P::kOnly, kHasIeth, true, true);
  // IBTA annex A19 (memory placement extensions), RC only as in rxe: FLUSH
  // carries FETH and RETH and no payload; ATOMIC WRITE a RETH and its 8
  // bytes. Both are answered with an RDMA READ response Only of no payload.
  t[0x1c] = op("RC FLUSH", RC, K::kFlush, P::kOnly, kHasFeth | kHasReth, false, true);
  t[0x1d] = op("RC ATOMIC WRITE", RC, K::kAtomicWrite, P::kOnly, kHasReth, true, true);
  // XRC (IBTA annex A14, table 38's 101 prefix): RC's operations with
  // the same low five bits; every request carries the XRCETH (the
  // responder's XRC SRQ), responses and acknowledgements do not.
  for (uint8_t low = 0; low <= 0x17; low++) {
    const OpcodeInfo& r = t[low];
    if (!r.valid) continue;
    const char* xname[0x18] = {
        "XRC SEND First", "XRC SEND Middle", "XRC SEND Last", "XRC SEND Last with Immediate", "XRC SEND Only",
        "XRC SEND Only with Immediate", "XRC RDMA WRITE First", "XRC RDMA WRITE Middle", "XRC RDMA WRITE Last",
        "XRC RDMA WRITE Last with Immediate", "XRC RDMA WRITE Only", "XRC RDMA WRITE Only with Immediate",
        "XRC RDMA READ Request", "XRC RDMA READ response First", "XRC RDMA READ response Middle",
        "XRC RDMA READ response Last", "XRC RDMA READ response Only", "XRC Acknowledge",
        "XRC ATOMIC Acknowledge", "XRC CmpSwap", "XRC FetchAdd", nullptr, "XRC SEND Last with Invalidate",
        "XRC SEND Only with Invalidate"};
    t[0xa0 | low] = op(xname[low], Transport::kXRC, r.kind, r.pos,
                       uint16_t(r.hdrs | (r.request ? kHasXrcEth : 0)), r.payload, r.request);
  }
  t[0x64] = op("UD SEND Only", UD, K::kSend, P::kOnly, kHasDeth, true, true);
  t[0x65] = op("UD SEND Only with Immediate", UD, K::kSend, P::kOnly, kHasDeth | kHasImmDt, true, true);
  return t;
}
}  // namespace detail

inline constexpr std::array<OpcodeInfo, 256> kOpcodes = detail::make_opcode_table();
constexpr const OpcodeInfo& opcode_info(uint8_t opcode) { return kOpcodes[opcode]; }

// Opcode numbers used by the engine (the low five bits, IBTA table 38).
namespace op {
constexpr uint8_t kSendFirst = 0x00, kSendMiddle = 0x01, kSendLast = 0x02, kSendLastImm = 0x03, kSendOnly = 0x04,
                  kSendOnlyImm = 0x05, kWriteFirst = 0x06, kWriteMiddle = 0x07, kWriteLast = 0x08,
                  kWriteLastImm = 0x09, kWriteOnly = 0x0a, kWriteOnlyImm = 0x0b, kReadRequest = 0x0c,
                  kReadRespFirst = 0x0d, kReadRespMiddle = 0x0e, kReadRespLast = 0x0f, kReadRespOnly = 0x10,
                  kAck = 0x11, kAtomicAck = 0x12, kCompareSwap = 0x13, kFetchAdd = 0x14, kSendLastInv = 0x16,
                  kSendOnlyInv = 0x17, kFlush = 0x1c, kAtomicWrite = 0x1d;
constexpr uint8_t kRC = 0x00, kUC = 0x20, kUD = 0x60, kXRC = 0xa0;
}  // namespace op

// ---- A whole transport packet: BTH, its extension headers, payload, pad.
struct Packet {
  Bth bth;
  Reth reth;
  Aeth aeth;
  AtomicEth atomic;
  AtomicAckEth atomic_ack;
  Deth deth;
  uint32_t imm = 0;           // ImmDt, as the 4 bytes read big-endian
  uint32_t ieth_rkey = 0;     // IETH
  uint32_t xrc_srqn = 0;      // XRCETH: the XRC SRQ at the responder (24 bits; IBTA annex A14)
  Feth feth;                  // FETH (FLUSH)
  std::span<const uint8_t> payload;  // without pad (parse) / the data to copy (build)
  const OpcodeInfo& info() const { return opcode_info(bth.opcode); }
};

enum class ParseError : uint8_t {
  kOk = 0,
  kTruncated,      // shorter than BTH, the opcode's headers, or pad + ICRC
  kBadOpcode,      // not in table 38 for RC/UC/UD/XRC
  kBadVersion,     // TVer != 0 (IBTA 9.6: silently dropped)
  kBadPad,         // pad count on a packet without payload, or longer than it
  kUnexpectedPayload,  // bytes after the headers of an opcode that carries none
};
const char* parse_error_name(ParseError e);

// Parses BTH..payload..pad[..ICRC]. With `has_icrc`, the last 4 bytes are the
// ICRC (not checked here, see icrc.h) and are excluded from the payload.
ParseError parse_packet(std::span<const uint8_t> buf, bool has_icrc, Packet* out);

// The number of bytes build_packet writes for `p` (headers, payload, pad;
// without ICRC).
size_t packet_size(const Packet& p);
// Writes BTH (its pad count is computed from the payload length and
// overrides p.bth.pad), the headers the opcode calls for, the payload and the
// zero pad. Returns the bytes written, 0 if `out` is too small or the opcode
// is invalid.
size_t build_packet(const Packet& p, std::span<uint8_t> out);
// Only the headers of a packet whose payload (`payload_len` bytes, not in
// p.payload) the caller sends from elsewhere: BTH with the pad count for
// that length, then the opcode's headers. Returns the bytes written, 0 if
// `out` is too small, the opcode is invalid or carries no payload but
// payload_len is not 0.
size_t build_headers(const Packet& p, size_t payload_len, std::span<uint8_t> out);

}  // namespace sv::roce
