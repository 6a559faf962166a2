// fault.h: seeded packet-fault injection for the transport's packet I/O:
// drop, duplicate, delay (reorder) and corrupt datagrams with given
// probabilities.
// This kernel has no netem qdisc (scripts/testbed.sh netem), so recovery is
// tested by putting a FaultInjector on the send path: the simulated link of
// the engine tests uses it, and a UDP endpoint is meant to (docs/ROCE.md).
//
// Contract: one FaultInjector per sender, not thread-safe; deterministic for
// a given seed and sequence of calls.
#pragma once

#include <atomic>
#include <cstdint>
#include <span>

namespace sv::roce {

struct FaultDecision;

struct FaultConfig {
  double drop = 0;           // probability a datagram is lost
  double duplicate = 0;      // probability a delivered datagram arrives twice
  double reorder = 0;        // probability a copy is held back by reorder_delay_ns
  uint64_t reorder_delay_ns = 50000;
  uint64_t seed = 1;
  // Called with each decision that changes a datagram (lost, duplicated,
  // delayed or corrupted) and the datagram as it was (a fault plan's log).
  void (*log)(const FaultDecision& d, std::span<const uint8_t> packet) = nullptr;
  double corrupt = 0;        // probability a delivered datagram has one bit flipped (its ICRC then fails)
  // The link's state, where something can take it down (a fault plan's
  // port rule): while *link_down is true a UDP endpoint sends nothing and
  // delivers nothing that arrives, as a NIC whose link is down (both
  // counted). Not owned; outlives the endpoint.
  const std::atomic<bool>* link_down = nullptr;
};

struct FaultDecision {
  int copies = 1;               // 0 = dropped, 1, or 2 (duplicated)
  uint64_t delay_ns[2] = {0, 0};  // extra delay of each copy
  // A bit to flip in every copy (corrupt_at: a byte offset, taken modulo
  // the packet's length; the sender keeps the ICRC of the packet as it was).
  bool corrupt = false;
  uint32_t corrupt_at = 0;
  uint8_t corrupt_bit = 0;
};

class FaultInjector {
 public:
  explicit FaultInjector(const FaultConfig& c = {}) : cfg_(c), state_(c.seed ? c.seed : 1) {}
  FaultDecision decide() {
    FaultDecision d;
    if (chance(cfg_.drop)) { d.copies = 0; return d; }
    if (chance(cfg_.duplicate)) d.copies = 2;
    if (chance(cfg_.corrupt)) {
      d.corrupt = true;
      d.corrupt_at = uint32_t(next());
      d.corrupt_bit = uint8_t(1u << (next() % 8));
    }
    for (int i = 0; i < d.copies; i++) {
      // A random share of the delay, so that held-back copies also pass each other.
      if (chance(cfg_.reorder)) d.delay_ns[i] = cfg_.reorder_delay_ns / 2 + next() % (cfg_.reorder_delay_ns + 1);
    }
    return d;
  }
  uint64_t next() {  // splitmix64
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  bool chance(double p) { return p > 0 && double(next() >> 11) * 0x1.0p-53 < p; }
  const FaultConfig& config() const { return cfg_; }

 private:
  FaultConfig cfg_;
  uint64_t state_;
};

}  // namespace sv::roce
