// status_counters.cc: the counters of `softverbs status` (text) and of
// `softverbs status --json` (the schema is docs/LAB.md's, "Counters").
#include "tools/status_counters.h"

#include <cinttypes>
#include <cstdio>
#include <map>

#include "common/device_info.h"

namespace sv::tools {

int fetch_counters(int sock, uint32_t& seq, counters::Snapshot& out) { return counters::query(sock, seq, out); }

namespace {

// "name value" for each counter that is not 0; "(all 0)" when none is.
std::string nonzero(const uint64_t* v) {
  std::string s;
  char buf[64];
  for (uint32_t i = 0; i < counters::kCount; ++i) {
    if (!v[i]) continue;
    std::snprintf(buf, sizeof buf, " %s %" PRIu64, counters::kNames[i], v[i]);
    s += buf;
  }
  return s.empty() ? " (all 0)" : s;
}

// {"sent_pkts": 0, ...}: every counter, in counters::kNames' order.
std::string object(const uint64_t* v) {
  std::string s = "{";
  char buf[80];
  for (uint32_t i = 0; i < counters::kCount; ++i) {
    std::snprintf(buf, sizeof buf, "%s\"%s\": %" PRIu64, i ? ", " : "", counters::kNames[i], v[i]);
    s += buf;
  }
  return s + "}";
}

}  // namespace

void print_counters(const counters::Snapshot& s) {
  std::printf("counters (docs/LAB.md; this user's QPs, root: every user's):\n");
  std::printf("  port %s/1:%s\n", dev::kName, nonzero(s.port).c_str());
  for (const proto::CounterEntry& q : s.qps)
    std::printf("  qp 0x%x (context %u, pid %u, uid %u):%s\n", q.qpn, q.context, q.pid, q.uid, nonzero(q.values).c_str());
}

// Contexts in handle order, each with the sums of its live QPs and the QPs.
std::string counters_json(const counters::Snapshot& s, const std::string& daemon) {
  struct Ctx {
    uint32_t pid = 0, uid = 0;
    uint64_t sum[counters::kCount] = {};
    std::string qps;
  };
  std::map<uint32_t, Ctx> ctxs;
  char buf[160];
  for (const proto::CounterEntry& q : s.qps) {
    Ctx& c = ctxs[q.context];
    c.pid = q.pid;
    c.uid = q.uid;
    for (uint32_t i = 0; i < counters::kCount; ++i) c.sum[i] += q.values[i];
    std::snprintf(buf, sizeof buf, "%s{\"qpn\": %u, \"counters\": ", c.qps.empty() ? "" : ", ", q.qpn);
    c.qps += buf + object(q.values) + "}";
  }
  std::string out = "{\n  \"schema\": \"softverbs-status/1\",\n";
  if (!daemon.empty()) out += "  \"daemon\": {" + daemon + "},\n";
  out += "  \"counter_names\": [";
  for (uint32_t i = 0; i < counters::kCount; ++i) out += std::string(i ? ", \"" : "\"") + counters::kNames[i] + "\"";
  std::snprintf(buf, sizeof buf, "],\n  \"ports\": [{\"device\": \"%s\", \"port\": 1, \"counters\": ", dev::kName);
  out += buf + object(s.port) + "}],\n  \"contexts\": [";
  bool first = true;
  for (const auto& [id, c] : ctxs) {
    std::snprintf(buf, sizeof buf, "%s\n    {\"context\": %u, \"pid\": %u, \"uid\": %u, \"counters\": ",
                  first ? "" : ",", id, c.pid, c.uid);
    out += buf + object(c.sum) + ",\n     \"qps\": [" + c.qps + "]}";
    first = false;
  }
  out += first ? "]\n}\n" : "\n  ]\n}\n";
  return out;
}

}  // namespace sv::tools
