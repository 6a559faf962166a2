// fault_plan.h: the fault plan a user gives without recompiling
// (SOFTVERBS_FAULTS, or a file named by SOFTVERBS_FAULT_PLAN; docs/LAB.md,
// "Faults"): seeded wire faults (loss, duplication, reordering with delay,
// corruption) that the RoCEv2 senders apply, and completions in error at a
// chosen QP and operation number or at a rate, which the requester reports.
//
//   plan    := clause { ";" clause }            (a file: clauses one a line, '#' comments)
//   clause  := "seed=" N
//            | section [ "@" qpsel ] ":" kv { "," kv }
//            | kv { "," kv }                    (a wire clause for all QPs; seed= allowed)
//   section := "wire" | "wc"
//   qpsel   := "all" | "qp=" N                  (N decimal or 0x hex)
//   wire kv := drop=P | dup=P | reorder=P | delay_us=N | corrupt=P   (P in [0, 1])
//   wc kv   := status=NAME (required) and one of op=N (N >= 1) or rate=P
//   NAME    := RNR_RETRY_EXC_ERR | RETRY_EXC_ERR | REM_ACCESS_ERR | REM_OP_ERR | LOC_PROT_ERR
//              (an IBV_WC_ prefix is accepted)
//
// Parsing is strict: an unknown key, a value out of range or with trailing
// characters, a duplicate key or a missing one is an error with a message.
//
// Contract: pure functions and plain values; thread-safe.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace sv::faults {

struct WireRule {
  bool all = true;
  uint32_t qpn = 0;
  double drop = 0, dup = 0, reorder = 0, corrupt = 0;
  uint32_t delay_us = 200;
};

struct WcRule {
  bool all = true;
  uint32_t qpn = 0;
  uint64_t op = 0;    // the op-th send work request the QP carries out (1-based); 0: by rate
  double rate = 0;
  ibv_wc_status status = IBV_WC_SUCCESS;
};

struct Plan {
  uint64_t seed = 1;
  std::vector<WireRule> wire;
  std::vector<WcRule> wc;
  bool empty() const { return wire.empty() && wc.empty(); }
};

// Parses `text` into `out`: "" on success, else what is wrong (one line).
std::string parse(std::string_view text, Plan& out);

// A plan file's text as one plan: lines joined, '#' to the end of a line dropped.
std::string file_text(std::string_view contents);

// The process's plan from its environment: SOFTVERBS_FAULTS, or the file
// SOFTVERBS_FAULT_PLAN names (not both). "" on success (`out` empty when
// neither is set), else the message for stderr.
std::string from_environment(Plan& out);

// The wire rule for `qpn` (a rule for that QP before one for all), or null.
const WireRule* wire_for(const Plan& p, uint32_t qpn);

// The status's name as the plan spells it ("" for a status a plan cannot name).
const char* status_name(ibv_wc_status s);

// Seeded decisions (splitmix64), one stream per QP.
struct Rng {
  uint64_t state;
  uint64_t next() {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  bool chance(double p) { return p > 0 && double(next() >> 11) * 0x1.0p-53 < p; }
};

}  // namespace sv::faults
