#include "roce/icrc.h"

#include <algorithm>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "roce/headers.h"

namespace sv::roce {
namespace {

constexpr std::array<uint32_t, 256> make_crc_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; i++) {
    uint32_t c = i;
    for (int k = 0; k < 8; k++) c = (c & 1) ? (c >> 1) ^ 0xEDB88320u : c >> 1;
    t[i] = c;
  }
  return t;
}
constexpr std::array<uint32_t, 256> kCrcTable = make_crc_table();

constexpr uint32_t crc_step(uint32_t crc, uint8_t b) { return kCrcTable[(crc ^ b) & 0xff] ^ (crc >> 8); }

// The CRC state after the 8 bytes of 0xFF that stand for the masked LRH
// (A17.4): 0xdebb20e3, as rxe's seed.
constexpr uint32_t lrh_seed() {
  uint32_t c = 0xffffffffu;
  for (int i = 0; i < 8; i++) c = crc_step(c, 0xff);
  return c;
}
static_assert(lrh_seed() == 0xdebb20e3u);

uint16_t ones_sum_fold(uint32_t sum) {
  while (sum >> 16) sum = (sum & 0xffff) + (sum >> 16);
  return uint16_t(sum);
}
uint32_t ones_sum(const uint8_t* p, size_t n, uint32_t sum = 0) {
  for (size_t i = 0; i + 1 < n; i += 2) sum += get_be16(p + i);
  if (n & 1) sum += uint32_t(p[n - 1]) << 8;
  return sum;
}

// Slicing by 16 (tables of the CRC of a byte followed by k zero bytes):
// 16 table lookups per 16 bytes instead of a dependent chain of 16, about
// ten times the bytewise loop, which capped the wire path near 400 MB/s.
using SliceTables = std::array<std::array<uint32_t, 256>, 16>;
constexpr SliceTables make_slice_tables() {
  SliceTables t{};
  t[0] = kCrcTable;
  for (int k = 1; k < 16; k++)
    for (int i = 0; i < 256; i++) t[k][i] = (t[k - 1][i] >> 8) ^ kCrcTable[t[k - 1][i] & 0xff];
  return t;
}
constexpr SliceTables kSlice = make_slice_tables();

inline uint32_t load_le32(const uint8_t* p) {
  return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
}

uint32_t crc32_slice16(uint32_t crc, const uint8_t* p, size_t n) {
  while (n >= 16) {
    const uint32_t a = crc ^ load_le32(p), b = load_le32(p + 4), c = load_le32(p + 8), d = load_le32(p + 12);
    crc = kSlice[15][a & 0xff] ^ kSlice[14][(a >> 8) & 0xff] ^ kSlice[13][(a >> 16) & 0xff] ^ kSlice[12][a >> 24] ^
          kSlice[11][b & 0xff] ^ kSlice[10][(b >> 8) & 0xff] ^ kSlice[9][(b >> 16) & 0xff] ^ kSlice[8][b >> 24] ^
          kSlice[7][c & 0xff] ^ kSlice[6][(c >> 8) & 0xff] ^ kSlice[5][(c >> 16) & 0xff] ^ kSlice[4][c >> 24] ^
          kSlice[3][d & 0xff] ^ kSlice[2][(d >> 8) & 0xff] ^ kSlice[1][(d >> 16) & 0xff] ^ kSlice[0][d >> 24];
    p += 16;
    n -= 16;
  }
  if (n == 0) return crc;
  // The last 1..15 bytes in one step, as slicing by n: byte i (xored with
  // the state's byte i while there is one) through the table of i's byte
  // followed by n-1-i zero bytes; the state's bytes beyond n shift down.
  // (A folded CRC often ends here: a packet's 12-byte BTH, its tail.)
  uint32_t out = n >= 4 ? 0 : crc >> (8 * n);
  for (size_t i = 0; i < n; i++) {
    const uint8_t x = uint8_t(p[i] ^ (i < 4 ? crc >> (8 * i) : 0));
    out ^= kSlice[n - 1 - i][x];
  }
  return out;
}

#if defined(__x86_64__)
// Carry-less multiplication folding (the method of Intel's white paper
// "Fast CRC Computation for Generic Polynomials Using PCLMULQDQ"): lanes of
// 128 bits are folded forward over the data, then into one lane. A lane
// folded this way has the same residue modulo the polynomial as the bytes it
// replaces, so the CRC state after them is the CRC of the last lane from
// state 0 (reduce128, no tables); the tail is table CRC.
//
// Folding a lane forward by d bits multiplies its low qword by x^(d+32) mod P
// and its high qword by x^(d-32) mod P (both bit-reflected and shifted left by
// one, as fold_constant gives them) and xors both products into the lane d
// bits on. Checked against the table code for every length and alignment
// (roce.Crc32.EveryKernelMatchesTables).
constexpr uint64_t fold_constant(unsigned n) {
  uint64_t r = 1;  // x^n mod P, P = the Ethernet polynomial, normal bit order
  for (unsigned i = 0; i < n; i++) {
    r <<= 1;
    if (r >> 32) r ^= 0x104c11db7ull;
  }
  uint64_t reflected = 0;
  for (int b = 0; b < 32; b++)
    if (r >> b & 1) reflected |= 1ull << (31 - b);
  return reflected << 1;
}
// The white paper's constants for folds by 128 and 512 bits.
static_assert(fold_constant(160) == 0x1751997d0ull && fold_constant(96) == 0x0ccaa009eull);
static_assert(fold_constant(544) == 0x154442bd4ull && fold_constant(480) == 0x1c6e41596ull);

// A fold constant pair for distance d (low qword, high qword).
// The 128-bit kernels' instruction sets (have_pclmul checks the same).
#define SV_CLMUL128 __attribute__((target("pclmul,sse4.1,ssse3,sse2")))

#define SV_FOLD_PAIR(d) static_cast<long long>(fold_constant((d) - 32)), static_cast<long long>(fold_constant((d) + 32))

SV_CLMUL128 inline __m128i fold(__m128i x, __m128i k, __m128i next) {
  return _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x, k, 0x00), _mm_clmulepi64_si128(x, k, 0x11)), next);
}
SV_CLMUL128 inline __m128i load(const uint8_t* q) {
  return _mm_loadu_si128(reinterpret_cast<const __m128i*>(q));
}
// The 16 bytes at p with the CRC state xored in: the first lane of a fold.
SV_CLMUL128 inline __m128i first_lane(const uint8_t* p, uint32_t crc) {
  return _mm_xor_si128(load(p), _mm_cvtsi32_si128(int(crc)));
}

// The CRC state after the 16 bytes of lane `x` from state 0, without
// tables (the same white paper): fold 128 bits to 64 with x^96 mod P, 64 to
// 32 with x^64 mod P, then a Barrett reduction with mu = x^64 / P and P
// itself (all bit-reflected, shifted left by one as above).
SV_CLMUL128 inline uint32_t reduce128(__m128i x) {
  const __m128i mask32 = _mm_set_epi32(0, 0, 0, -1);
  const __m128i k96 = _mm_set_epi64x(static_cast<long long>(fold_constant(96)), 0);  // high qword
  x = _mm_xor_si128(_mm_srli_si128(x, 8), _mm_clmulepi64_si128(x, k96, 0x10));
  const __m128i k64 = _mm_set_epi64x(0, static_cast<long long>(fold_constant(64)));
  x = _mm_xor_si128(_mm_srli_si128(x, 4), _mm_clmulepi64_si128(_mm_and_si128(x, mask32), k64, 0x00));
  const __m128i mu_p = _mm_set_epi64x(0x1f7011641ll, 0x1db710641ll);
  __m128i t = _mm_clmulepi64_si128(_mm_and_si128(x, mask32), mu_p, 0x10);
  t = _mm_clmulepi64_si128(_mm_and_si128(t, mask32), mu_p, 0x00);
  return uint32_t(_mm_cvtsi128_si32(_mm_srli_si128(_mm_xor_si128(x, t), 4)));
}

// pshufb masks for byte shifts by r (0..15): 16 + r gives "down by r"
// (byte j <- j + r, zero beyond), r gives "up by 16 - r" (byte j <- j - 16 +
// r, zero below); 0x80 makes pshufb write a zero and selects in blendv.
alignas(16) constexpr uint8_t kShiftMasks[48] = {
    0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80,
    0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15,
    0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80};

// One lane folded over the n < 64 bytes left, then reduced. A tail of
// r = 1..15 bytes, when the 16 bytes ending with it may be read (`look_back`:
// they lie in the same buffer), is folded too (the white paper's partial
// block): lane x then the tail are, as a stream, the 16 - r zero bytes that
// lead every lane, x, the tail; its last 32 bytes are W1 = x moved up by
// 16 - r bytes and W2 = x's last 16 - r bytes then the tail, and W1 folds
// onto W2. Otherwise the tail goes through the tables.
SV_CLMUL128 inline uint32_t finish_lane(__m128i x, const uint8_t* p, size_t n,
                                                                               bool look_back) {
  const __m128i k128 = _mm_set_epi64x(SV_FOLD_PAIR(128));
  while (n >= 16) {
    x = fold(x, k128, load(p));
    p += 16;
    n -= 16;
  }
  if (n == 0) return reduce128(x);
  if (!look_back) return crc32_slice16(reduce128(x), p, n);
  const __m128i down = load(kShiftMasks + 16 + n), up = load(kShiftMasks + n);
  const __m128i w1 = _mm_shuffle_epi8(x, up);
  const __m128i w2 = _mm_blendv_epi8(load(p + n - 16), _mm_shuffle_epi8(x, down), up);
  return reduce128(fold(w1, k128, w2));
}

// `first`: the first 16 bytes, the state already xored into them; then the
// n bytes at p. Four lanes from 64 bytes on; shorter data (the masked
// headers of every packet) keeps to one.
SV_CLMUL128 uint32_t crc32_folded_lane_sse(__m128i first, const uint8_t* p,
                                                                                  size_t n) {
  const __m128i k128 = _mm_set_epi64x(SV_FOLD_PAIR(128));
  const size_t all = n;
  __m128i x3 = first;
  if (n >= 48) {
    __m128i x0 = x3, x1 = load(p), x2 = load(p + 16);
    x3 = load(p + 32);
    p += 48;
    n -= 48;
    const __m128i k512 = _mm_set_epi64x(SV_FOLD_PAIR(512));
    while (n >= 64) {
      x0 = fold(x0, k512, load(p));
      x1 = fold(x1, k512, load(p + 16));
      x2 = fold(x2, k512, load(p + 32));
      x3 = fold(x3, k512, load(p + 48));
      p += 64;
      n -= 64;
    }
    x1 = fold(x0, k128, x1);
    x2 = fold(x1, k128, x2);
    x3 = fold(x2, k128, x3);
  }
  return finish_lane(x3, p, n, all >= 16);
}

// The same with VPCLMULQDQ on 512-bit registers (Ice Lake and later): four
// registers of four lanes fold 256 bytes per step, a quarter of the steps of
// the 128-bit loop, whose latency chain bounds it. n >= 240 (256 bytes with
// `first`).
#define SV_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,vpclmulqdq,pclmul,sse4.1,ssse3,sse2")))
SV_AVX512 inline __m512i fold512(__m512i x, __m512i k, __m512i next) {
  // 0x96: a ^ b ^ c in one instruction.
  return _mm512_ternarylogic_epi64(_mm512_clmulepi64_epi128(x, k, 0x00), _mm512_clmulepi64_epi128(x, k, 0x11), next,
                                   0x96);
}
SV_AVX512 inline __m512i load512(const uint8_t* q) { return _mm512_loadu_si512(q); }
SV_AVX512 inline __m512i broadcast128(__m128i x) {
  return _mm512_mask_broadcast_i32x4(_mm512_setzero_si512(), 0xffff, x);
}
SV_AVX512 uint32_t crc32_folded_lane_avx512(__m128i first, const uint8_t* p, size_t n) {
  // The first 64 bytes: `first`, then p[0, 48).
  // (GCC 12's casts, inserts, extracts and broadcasts between register
  // widths trip -Wuninitialized on their undefined sources: masked forms.)
  const __m512i up2 = _mm512_set_epi64(5, 4, 3, 2, 1, 0, 0, 0);  // qword i <- qword i - 2
  __m512i x0 = _mm512_maskz_permutexvar_epi64(0xfc, up2, load512(p));
  x0 = _mm512_mask_broadcast_i32x4(x0, 0x000f, first);
  __m512i x1 = load512(p + 48), x2 = load512(p + 112), x3 = load512(p + 176);
  p += 240;
  n -= 240;
  const __m512i k2048 = broadcast128(_mm_set_epi64x(SV_FOLD_PAIR(2048)));
  while (n >= 256) {
    x0 = fold512(x0, k2048, load512(p));
    x1 = fold512(x1, k2048, load512(p + 64));
    x2 = fold512(x2, k2048, load512(p + 128));
    x3 = fold512(x3, k2048, load512(p + 192));
    p += 256;
    n -= 256;
  }
  const __m512i k512 = broadcast128(_mm_set_epi64x(SV_FOLD_PAIR(512)));
  x1 = fold512(x0, k512, x1);
  x2 = fold512(x1, k512, x2);
  x3 = fold512(x2, k512, x3);
  while (n >= 64) {
    x3 = fold512(x3, k512, load512(p));
    p += 64;
    n -= 64;
  }
  // x3's four lanes into one: lane i lies 384 - 128 i bits before lane 3,
  // which is kept as it is (its constants are 0, the mask keeps it).
  const __m512i lanes = _mm512_set_epi64(0, 0, SV_FOLD_PAIR(128), SV_FOLD_PAIR(256), SV_FOLD_PAIR(384));
  const __m512i t = _mm512_ternarylogic_epi64(_mm512_clmulepi64_epi128(x3, lanes, 0x00),
                                              _mm512_clmulepi64_epi128(x3, lanes, 0x11),
                                              _mm512_maskz_mov_epi64(0xc0, x3), 0x96);
  const __m256i half = _mm256_xor_si256(_mm512_mask_extracti64x4_epi64(_mm256_setzero_si256(), 0xf, t, 0),
                                        _mm512_mask_extracti64x4_epi64(_mm256_setzero_si256(), 0xf, t, 1));
  const __m128i one = _mm_xor_si128(_mm256_castsi256_si128(half), _mm256_extracti128_si256(half, 1));
  // Clean upper halves before any SSE code runs again: GCC leaves them dirty
  // on a tail call, and SSE instructions after dirty 512-bit state cost
  // about 300 ns per packet here.
  _mm256_zeroupper();
  return finish_lane(one, p, n, true);  // 240 bytes or more lie behind
}

bool have_pclmul() {
  static const bool yes = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1") &&
                          __builtin_cpu_supports("ssse3") && __builtin_cpu_supports("sse2");
  return yes;
}
bool have_vpclmul512() {
  static const bool yes = have_pclmul() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("vpclmulqdq");
  return yes;
}

uint32_t crc32_folded_lane(__m128i first, const uint8_t* p, size_t n) {
  if (n >= 240 && have_vpclmul512()) return crc32_folded_lane_avx512(first, p, n);
  return crc32_folded_lane_sse(first, p, n);
}

// n >= 16.
SV_CLMUL128 uint32_t crc32_folded(uint32_t crc, const uint8_t* p, size_t n) {
  return crc32_folded_lane(first_lane(p, crc), p + 16, n - 16);
}
// The 16 bytes at head, then the n at p (two places, one fold).
SV_CLMUL128 uint32_t crc32_folded2(uint32_t crc, const uint8_t* head, const uint8_t* p,
                                                               size_t n) {
  return crc32_folded_lane(first_lane(head, crc), p, n);
}
#endif

}  // namespace

uint32_t crc32_update(uint32_t crc, std::span<const uint8_t> data) {
#if defined(__x86_64__)
  if (data.size() >= 16 && have_pclmul()) return crc32_folded(crc, data.data(), data.size());
#endif
  return crc32_slice16(crc, data.data(), data.size());
}

uint32_t crc32_update_tables(uint32_t crc, std::span<const uint8_t> data) {
  return crc32_slice16(crc, data.data(), data.size());
}

std::optional<uint32_t> crc32_update_with(CrcKernel kernel, uint32_t crc, std::span<const uint8_t> data) {
  switch (kernel) {
    case CrcKernel::kTables:
      return crc32_slice16(crc, data.data(), data.size());
#if defined(__x86_64__)
    case CrcKernel::kClmul128:
      if (!have_pclmul()) return std::nullopt;
      if (data.size() < 16) return crc32_slice16(crc, data.data(), data.size());
      return crc32_folded_lane_sse(first_lane(data.data(), crc), data.data() + 16, data.size() - 16);
    case CrcKernel::kClmul512:
      if (!have_vpclmul512()) return std::nullopt;
      if (data.size() < 256) return crc32_update(crc, data);
      return crc32_folded_lane_avx512(first_lane(data.data(), crc), data.data() + 16, data.size() - 16);
#else
    default:
      return std::nullopt;
#endif
  }
  return std::nullopt;
}

std::optional<uint32_t> icrc_prefix(std::span<const uint8_t> ip_udp) {
  if (ip_udp.empty()) return std::nullopt;
  // The masked copy of IP + UDP.
  uint8_t hdr[60 + 8];
  size_t iplen;
  const int version = ip_udp[0] >> 4;
  if (version == 4) {
    iplen = size_t(ip_udp[0] & 0xf) * 4;
    if (iplen < 20 || ip_udp.size() != iplen + 8 || ip_udp[9] != 17) return std::nullopt;
    std::memcpy(hdr, ip_udp.data(), iplen + 8);
    hdr[1] = 0xff;                  // TOS (DSCP, ECN)
    hdr[8] = 0xff;                  // TTL
    hdr[10] = hdr[11] = 0xff;       // header checksum
  } else if (version == 6) {
    iplen = 40;
    // No extension headers: RoCEv2 sends UDP right after the fixed header.
    if (ip_udp.size() != iplen + 8 || ip_udp[6] != 17) return std::nullopt;
    std::memcpy(hdr, ip_udp.data(), iplen + 8);
    hdr[0] |= 0x0f;                 // traffic class (high nibble of it)
    hdr[1] = hdr[2] = hdr[3] = 0xff;  // traffic class (low nibble), flow label
    hdr[7] = 0xff;                  // hop limit
  } else {
    return std::nullopt;
  }
  uint8_t* udp = hdr + iplen;
  udp[6] = udp[7] = 0xff;           // UDP checksum
  return crc32_update(lrh_seed(), std::span<const uint8_t>(hdr, iplen + 8));
}

std::optional<uint32_t> icrc_finish(uint32_t prefix, std::span<const std::span<const uint8_t>> transport) {
  // The first 16 bytes (BTH masked, then what follows it, whichever pieces
  // hold them) go through one buffer, so that no piece is too short to fold.
  uint8_t head[16];
  size_t have = 0, piece = 0, at = 0;
  while (have < sizeof head && piece < transport.size()) {
    const size_t n = std::min(sizeof head - have, transport[piece].size() - at);
    if (n) std::memcpy(head + have, transport[piece].data() + at, n);  // an empty piece may have no data()
    have += n;
    at += n;
    if (at == transport[piece].size()) {
      piece++;
      at = 0;
    }
  }
  if (have < kBthLen) return std::nullopt;
  head[4] = 0xff;                   // BTH resv8a (FECN, BECN, reserved)
  uint32_t crc;
#if defined(__x86_64__)
  if (have == sizeof head && have_pclmul()) {
    // The head is the first lane of the fold over the rest of its piece:
    // one reduction for both.
    const std::span<const uint8_t> rest =
        piece < transport.size() ? transport[piece].subspan(at) : std::span<const uint8_t>();
    crc = crc32_folded2(prefix, head, rest.data(), rest.size());
    if (piece < transport.size()) piece++;
    at = 0;
  } else
#endif
  {
    crc = crc32_update(prefix, std::span<const uint8_t>(head, have));
  }
  for (; piece < transport.size(); piece++, at = 0) crc = crc32_update(crc, transport[piece].subspan(at));
  return ~crc;
}

std::optional<uint32_t> icrc_compute(std::span<const uint8_t> ip_udp, std::span<const uint8_t> transport) {
  auto prefix = icrc_prefix(ip_udp);
  if (!prefix) return std::nullopt;
  return icrc_finish(*prefix, std::span<const std::span<const uint8_t>>(&transport, 1));
}

std::optional<uint32_t> icrc_compute(std::span<const uint8_t> ip) {
  if (ip.empty()) return std::nullopt;
  const int version = ip[0] >> 4;
  size_t iplen = version == 4 ? size_t(ip[0] & 0xf) * 4 : version == 6 ? 40 : 0;
  if (iplen < 20 || ip.size() < iplen + 8 + kBthLen) return std::nullopt;
  return icrc_compute(ip.first(iplen + 8), ip.subspan(iplen + 8));
}

bool icrc_check(std::span<const uint8_t> ip) {
  if (ip.size() < kIcrcLen) return false;
  auto c = icrc_compute(ip.first(ip.size() - kIcrcLen));
  return c && *c == icrc_load(ip.data() + ip.size() - kIcrcLen);
}

size_t header_ipv4(const Ipv4Udp& h, size_t transport_len, uint8_t* p) {
  const size_t total = kIpv4UdpLen + transport_len + kIcrcLen;
  if (total > 65535) return 0;
  p[0] = 0x45;
  p[1] = h.tos;
  put_be16(p + 2, uint16_t(total));
  put_be16(p + 4, h.id);
  put_be16(p + 6, 0x4000);  // DF: RoCEv2 is never fragmented
  p[8] = h.ttl;
  p[9] = 17;
  put_be16(p + 10, 0);
  std::memcpy(p + 12, h.src.data(), 4);
  std::memcpy(p + 16, h.dst.data(), 4);
  put_be16(p + 10, uint16_t(~ones_sum_fold(ones_sum(p, 20))));
  uint8_t* u = p + 20;
  put_be16(u, h.sport);
  put_be16(u + 2, h.dport);
  put_be16(u + 4, uint16_t(total - 20));
  put_be16(u + 6, 0);
  return kIpv4UdpLen;
}

size_t header_ipv6(const Ipv6Udp& h, size_t transport_len, uint8_t* p) {
  const size_t udplen = 8 + transport_len + kIcrcLen;
  if (udplen > 65535) return 0;
  put_be32(p, 6u << 28 | uint32_t(h.tclass) << 20 | (h.flow_label & 0xfffff));
  put_be16(p + 4, uint16_t(udplen));
  p[6] = 17;
  p[7] = h.hop_limit;
  std::memcpy(p + 8, h.src.data(), 16);
  std::memcpy(p + 24, h.dst.data(), 16);
  uint8_t* u = p + 40;
  put_be16(u, h.sport);
  put_be16(u + 2, h.dport);
  put_be16(u + 4, uint16_t(udplen));
  put_be16(u + 6, 0);
  return kIpv6UdpLen;
}

size_t frame_ipv4(const Ipv4Udp& h, std::span<const uint8_t> transport, std::span<uint8_t> out) {
  const size_t total = kIpv4UdpLen + transport.size() + kIcrcLen;
  if (total > 65535 || out.size() < total) return 0;
  uint8_t* p = out.data();
  header_ipv4(h, transport.size(), p);
  std::memcpy(p + kIpv4UdpLen, transport.data(), transport.size());
  auto crc = icrc_compute(std::span<const uint8_t>(p, total - kIcrcLen));
  if (!crc) return 0;
  icrc_store(p + total - kIcrcLen, *crc);
  return total;
}

size_t frame_ipv6(const Ipv6Udp& h, std::span<const uint8_t> transport, std::span<uint8_t> out) {
  const size_t total = kIpv6UdpLen + transport.size() + kIcrcLen;
  const size_t udplen = total - 40;
  if (udplen > 65535 || out.size() < total) return 0;
  uint8_t* p = out.data();
  header_ipv6(h, transport.size(), p);
  uint8_t* u = p + 40;
  std::memcpy(u + 8, transport.data(), transport.size());
  auto crc = icrc_compute(std::span<const uint8_t>(p, total - kIcrcLen));
  if (!crc) return 0;
  icrc_store(p + total - kIcrcLen, *crc);
  // UDP checksum (RFC 8200 8.1) over the pseudo-header and the whole UDP
  // datagram, ICRC included; the ICRC masks it, so order does not matter.
  uint32_t sum = ones_sum(p + 8, 32);
  sum += uint32_t(udplen) + 17;
  sum = ones_sum(u, udplen, sum);
  uint16_t c = uint16_t(~ones_sum_fold(sum));
  put_be16(u + 6, c == 0 ? 0xffff : c);
  return total;
}

bool in_xor_span(std::span<const uint32_t> deltas, uint32_t diff) {
  uint32_t basis[32] = {};
  for (uint32_t v : deltas) {
    for (int bit = 31; bit >= 0 && v; bit--) {
      if (!(v >> bit & 1)) continue;
      if (!basis[bit]) {
        basis[bit] = v;
        break;
      }
      v ^= basis[bit];
    }
  }
  for (int bit = 31; bit >= 0 && diff; bit--) {
    if (!(diff >> bit & 1)) continue;
    if (!basis[bit]) return false;
    diff ^= basis[bit];
  }
  return diff == 0;
}

}  // namespace sv::roce
