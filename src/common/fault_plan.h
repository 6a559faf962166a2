// fault_plan.h: the fault plan a user gives without recompiling
// (SOFTVERBS_FAULTS, or a file named by SOFTVERBS_FAULT_PLAN; docs/LAB.md,
// "Faults"): seeded wire faults (loss, duplication, reordering with delay,
// corruption) that the RoCEv2 senders apply, completions in error at a
// chosen QP and operation number or at a rate, which the requester reports,
// and the asynchronous events a NIC raises (port down and up, QP fatal, CQ
// error, SRQ limit, device fatal), which the library raises in the process
// that holds the plan (verbs/fault_events.h).
//
//   plan    := clause { ";" clause }            (a file: clauses one a line, '#' comments)
//   clause  := "seed=" N
//            | section [ "@" qpsel ] ":" kv { "," kv }
//            | kv { "," kv }                    (a wire clause for all QPs; seed= allowed)
//   section := "wire" | "wc" | "qp_fatal" | "rnr"  (these take a qpsel)
//            | "port" | "cq_err" | "srq_limit" | "device_fatal"
//   qpsel   := "all" | "qp=" N                  (N decimal or 0x hex)
//   wire kv := drop=P | dup=P | reorder=P | delay_us=N | corrupt=P   (P in [0, 1])
//   wc kv   := one of status=NAME or delay_us=D (1 .. 10000000), and one of
//              op=N (N >= 1), rate=P, after_ms=T (1 .. 3600000: the first
//              request at or after T ms from when the plan was read) or
//              rate=P,after_ms=T (at that rate from T on): the request fails
//              with NAME, or is carried out D microseconds later than it
//              would have been
//   rnr kv  := op=N (required), times=K (1 .. 1000000, default 1): the
//              responder answers the QP's N-th send request with an RNR NAK
//              K times (RC and XRC; the requester retries per its rnr_retry)
//   qp_fatal kv     := op=N (required): the QP's N-th send request meets
//                      IBV_EVENT_QP_FATAL instead of being carried out
//   port kv         := down_ms=D (required, 1 .. 3600000) and one of
//                      after_ms=T (after the plan is read: the process's
//                      first context; 0: down from its start) or op=N (the process's N-th send request
//                      is the first the down port fails)
//   cq_err kv       := after_ms=T (required), cq=N (the process's N-th CQ, default 1)
//   srq_limit kv    := after_ms=T (required), srq=N (the process's N-th SRQ, default 1)
//   device_fatal kv := after_ms=T (required)
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
  ibv_wc_status status = IBV_WC_SUCCESS;  // IBV_WC_SUCCESS: a delay rule
  uint32_t delay_us = 0;                  // a delay rule's delay
  uint64_t after_ms = 0;  // by time: from after_ms on (with rate), or the first request then (without)
};

// The responder refuses the op-th send request of the QP `times` times
// with an RNR NAK (IBTA 9.7.5.2.8) before it takes it.
struct RnrRule {
  bool all = true;
  uint32_t qpn = 0;
  uint64_t op = 0;
  uint32_t times = 1;
};

// The port goes DOWN (at after_ms, or just before the op-th send request
// of the process) and ACTIVE again down_ms later.
struct PortRule {
  uint64_t after_ms = 0;
  uint64_t op = 0;  // 0: by time
  uint64_t down_ms = 0;
};

struct QpFatalRule {
  bool all = true;
  uint32_t qpn = 0;
  uint64_t op = 0;  // the op-th send request the QP carries out (1-based)
};

// An event at a time: the CQ or SRQ is the process's n-th (1-based).
enum class Timed { kCqErr, kSrqLimit, kDeviceFatal };
struct TimedRule {
  Timed kind;
  uint64_t after_ms = 0;
  uint32_t n = 1;
};

struct Plan {
  uint64_t seed = 1;
  std::vector<WireRule> wire;
  std::vector<WcRule> wc;
  std::vector<PortRule> port;
  std::vector<QpFatalRule> qp_fatal;
  std::vector<TimedRule> timed;
  std::vector<RnrRule> rnr;
  bool empty() const { return wire.empty() && wc.empty() && rnr.empty() && !raises_events(); }
  // Whether send requests on shared memory and mediated paths are planned
  // (each one looked at before it is carried out).
  bool plans_sends() const { return !wc.empty() || !rnr.empty() || !qp_fatal.empty() || !port.empty(); }
  // Whether the library raises asynchronous events for this plan.
  bool raises_events() const { return !port.empty() || !qp_fatal.empty() || !timed.empty(); }
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
