// psn.h: 24-bit packet sequence number arithmetic (IBTA vol. 1 9.7.1): PSNs
// wrap modulo 2^24 and are compared within a window of 2^23.
//
// Contract: constexpr, thread-safe.
#pragma once

#include <cstdint>

namespace sv::roce {

constexpr uint32_t kPsnMask = 0xffffff;
constexpr uint32_t psn_add(uint32_t a, int64_t n) { return uint32_t(int64_t(a) + n) & kPsnMask; }
// a - b as a signed distance in (-2^23, 2^23]: > 0 when a is after b.
constexpr int32_t psn_diff(uint32_t a, uint32_t b) { return int32_t((a - b) << 8) >> 8; }
constexpr bool psn_lt(uint32_t a, uint32_t b) { return psn_diff(a, b) < 0; }
constexpr bool psn_le(uint32_t a, uint32_t b) { return psn_diff(a, b) <= 0; }

static_assert(psn_diff(0, 0xffffff) == 1);
static_assert(psn_diff(0xffffff, 0) == -1);
static_assert(psn_add(0xfffffe, 3) == 1);
static_assert(psn_lt(0x7ffff0, 0x800010));

}  // namespace sv::roce
