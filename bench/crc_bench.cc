// crc_bench: CRC-32 (the ICRC's, src/roce/icrc.cc) throughput of each kernel
// this CPU has: slicing by 16 (tables), 128-bit carry-less multiplication
// folding (PCLMULQDQ), 512-bit (AVX-512 VPCLMULQDQ), and crc32_update, which
// picks one by CPU and length. Buffers of 64 B (a header), 1 KiB and 4 KiB
// (packets at MTU 1500 and 9000) and 64 KiB, warm in the cache; the best of
// 5 trials of about 50 ms each, GB/s = 10^9 bytes per second.
//
//   crc_bench
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <span>
#include <vector>

#include "roce/icrc.h"

namespace {

using sv::roce::CrcKernel;

// Runs kernel `k` (or crc32_update if none) over `data` until ~50 ms pass;
// GB/s, or nullopt if this CPU has not got the kernel.
std::optional<double> trial(std::optional<CrcKernel> k, std::span<const uint8_t> data, uint32_t& sink) {
  using clock = std::chrono::steady_clock;
  if (k && !sv::roce::crc32_update_with(*k, 0, data)) return std::nullopt;
  uint64_t bytes = 0;
  const auto t0 = clock::now();
  auto t = t0;
  while (t - t0 < std::chrono::milliseconds(50)) {
    for (int i = 0; i < 64; i++) {
      sink ^= k ? *sv::roce::crc32_update_with(*k, sink, data) : sv::roce::crc32_update(sink, data);
      bytes += data.size();
    }
    t = clock::now();
  }
  return double(bytes) / std::chrono::duration<double, std::nano>(t - t0).count();
}

}  // namespace

int main() {
  std::vector<uint8_t> buf(65536 + 64);
  uint64_t x = 0x243f6a8885a308d3ull;
  for (auto& b : buf) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    b = uint8_t(x);
  }
  uint32_t sink = 0;
  const struct {
    const char* name;
    std::optional<CrcKernel> k;
  } kernels[] = {{"tables (slicing by 16)", CrcKernel::kTables},
                 {"clmul 128-bit", CrcKernel::kClmul128},
                 {"clmul 512-bit", CrcKernel::kClmul512},
                 {"crc32_update (dispatch)", std::nullopt}};
  std::printf("%-26s %10s %10s %10s %10s   (GB/s, best of 5)\n", "kernel", "64 B", "1 KiB", "4 KiB", "64 KiB");
  for (const auto& kn : kernels) {
    std::printf("%-26s", kn.name);
    for (size_t len : {size_t(64), size_t(1024), size_t(4096), size_t(65536)}) {
      std::optional<double> best;
      for (int rep = 0; rep < 5; rep++) {
        auto g = trial(kn.k, std::span<const uint8_t>(buf.data() + 1, len), sink);  // unaligned, as packets are
        if (g && (!best || *g > *best)) best = g;
      }
      if (best) std::printf(" %10.2f", *best);
      else std::printf(" %10s", "-");
    }
    std::printf("\n");
  }
  return sink == 0x12345678u ? 1 : 0;  // keeps the work
}
