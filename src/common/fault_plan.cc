// fault_plan.cc: the strict parser of fault plans (fault_plan.h).
#include "common/fault_plan.h"

#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

namespace sv::faults {
namespace {

// Joins pieces into a message (appending avoids a GCC 12 -Wrestrict false
// positive on chains of operator+).
template <typename... T>
std::string cat(const T&... parts) {
  std::string out;
  (out.append(std::string_view(parts)), ...);
  return out;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\n' || s.front() == '\r'))
    s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\n' || s.back() == '\r'))
    s.remove_suffix(1);
  return s;
}

std::vector<std::string_view> split(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  for (size_t pos = 0;;) {
    size_t end = s.find(sep, pos);
    out.push_back(trim(s.substr(pos, end == std::string_view::npos ? std::string_view::npos : end - pos)));
    if (end == std::string_view::npos) return out;
    pos = end + 1;
  }
}

bool to_u64(std::string_view v, uint64_t& out) {
  std::string s(v);
  if (s.empty() || s[0] == '-' || s[0] == '+' || s[0] == ' ') return false;
  char* end = nullptr;
  errno = 0;
  out = std::strtoull(s.c_str(), &end, 0);
  return errno == 0 && end && *end == 0;
}

bool to_prob(std::string_view v, double& out) {
  std::string s(v);
  if (s.empty() || s[0] == ' ') return false;
  char* end = nullptr;
  errno = 0;
  out = std::strtod(s.c_str(), &end);
  return errno == 0 && end && *end == 0 && out >= 0 && out <= 1;
}

struct Status {
  const char* name;
  ibv_wc_status s;
};
constexpr Status kStatuses[] = {
    {"RNR_RETRY_EXC_ERR", IBV_WC_RNR_RETRY_EXC_ERR}, {"RETRY_EXC_ERR", IBV_WC_RETRY_EXC_ERR},
    {"REM_ACCESS_ERR", IBV_WC_REM_ACCESS_ERR},       {"REM_OP_ERR", IBV_WC_REM_OP_ERR},
    {"LOC_PROT_ERR", IBV_WC_LOC_PROT_ERR},
};

// One "key=value" of a clause: its key and value, or an error.
std::string key_value(std::string_view kv, std::string_view& k, std::string_view& v) {
  size_t eq = kv.find('=');
  if (kv.empty()) return "an empty setting (two commas in a row?)";
  if (eq == std::string_view::npos) return cat("'", kv, "' is not key=value");
  k = trim(kv.substr(0, eq));
  v = trim(kv.substr(eq + 1));
  return "";
}

std::string bad_value(std::string_view k, std::string_view v, const char* want) {
  return cat("bad value '", v, "' for ", k, " (", want, ")");
}

std::string wire_setting(std::string_view k, std::string_view v, WireRule& r, Plan& p, bool bare) {
  double* prob = k == "drop" ? &r.drop : k == "dup" ? &r.dup : k == "reorder" ? &r.reorder
               : k == "corrupt" ? &r.corrupt : nullptr;
  if (prob) return to_prob(v, *prob) ? "" : bad_value(k, v, "a probability from 0 to 1");
  uint64_t n = 0;
  if (k == "delay_us") {
    if (!to_u64(v, n) || n == 0 || n > 10'000'000) return bad_value(k, v, "microseconds, 1 to 10000000");
    r.delay_us = uint32_t(n);
    return "";
  }
  if (bare && k == "seed") return to_u64(v, p.seed) ? "" : bad_value(k, v, "an unsigned integer");
  return cat("unknown wire setting '", k, "' (drop, dup, reorder, delay_us, corrupt)");
}

std::string wc_setting(std::string_view k, std::string_view v, WcRule& r) {
  uint64_t n = 0;
  if (k == "delay_us") {
    if (!to_u64(v, n) || n == 0 || n > 10'000'000) return bad_value(k, v, "microseconds, 1 to 10000000");
    r.delay_us = uint32_t(n);
    return "";
  }
  if (k == "op") return to_u64(v, r.op) && r.op > 0 ? "" : bad_value(k, v, "an operation number from 1");
  if (k == "rate") return to_prob(v, r.rate) && r.rate > 0 ? "" : bad_value(k, v, "a probability above 0, at most 1");
  if (k == "after_ms") {
    if (!to_u64(v, r.after_ms) || r.after_ms == 0 || r.after_ms > 3'600'000)
      return bad_value(k, v, "milliseconds, 1 to 3600000");
    return "";
  }
  if (k == "status") {
    std::string_view n = v.substr(0, 7) == "IBV_WC_" ? v.substr(7) : v;
    for (const Status& s : kStatuses)
      if (n == s.name) return (r.status = s.s), "";
    return bad_value(k, v, "RNR_RETRY_EXC_ERR, RETRY_EXC_ERR, REM_ACCESS_ERR, REM_OP_ERR or LOC_PROT_ERR");
  }
  return cat("unknown wc setting '", k, "' (op, rate, after_ms, status, delay_us)");
}

// A setting of the event sections: a count or a time.
std::string event_setting(std::string_view section, std::string_view k, std::string_view v, uint64_t& n) {
  if (k == "after_ms" || k == "down_ms") {
    const uint64_t lo = k == "down_ms" ? 1 : 0;
    if (!to_u64(v, n) || n < lo || n > 3'600'000) return bad_value(k, v, lo ? "milliseconds, 1 to 3600000" : "milliseconds, 0 to 3600000");
    return "";
  }
  if (k == "op") return to_u64(v, n) && n > 0 ? "" : bad_value(k, v, "an operation number from 1");
  if (k == "times")
    return to_u64(v, n) && n > 0 && n <= 1'000'000 ? "" : bad_value(k, v, "a count, 1 to 1000000");
  if (k == "cq" || k == "srq")
    return to_u64(v, n) && n > 0 && n <= 0xffffffff ? "" : bad_value(k, v, "an ordinal from 1");
  return cat("unknown setting '", k, "' for ", section);
}

// The keys each event section takes, and the ones it needs.
struct EventSection {
  const char* name;
  const char* keys;      // space-separated
  const char* required;  // space-separated
};
constexpr EventSection kEventSections[] = {
    {"port", " after_ms op down_ms ", " down_ms "},
    {"qp_fatal", " op ", " op "},
    {"rnr", " op times ", " op "},
    {"cq_err", " after_ms cq ", " after_ms "},
    {"srq_limit", " after_ms srq ", " after_ms "},
    {"device_fatal", " after_ms ", " after_ms "},
};

const EventSection* event_section(std::string_view s) {
  for (const EventSection& e : kEventSections)
    if (s == e.name) return &e;
  return nullptr;
}

// An event clause's settings into `p`.
std::string event_clause(const EventSection& es, std::string_view body, bool all, uint32_t qpn, Plan& p) {
  std::map<std::string_view, uint64_t> kv;
  for (std::string_view item : split(body, ',')) {
    std::string_view k, v;
    if (std::string e = key_value(item, k, v); !e.empty()) return e;
    if (kv.count(k)) return cat("'", k, "' given twice in one clause");
    if (std::string_view(es.keys).find(cat(" ", k, " ")) == std::string_view::npos)
      return cat("unknown setting '", k, "' for ", es.name, " (", trim(es.keys), ")");
    if (std::string e = event_setting(es.name, k, v, kv[k]); !e.empty()) return e;
  }
  for (std::string_view r : split(trim(es.required), ' '))
    if (!kv.count(r)) return cat("a ", es.name, " clause needs ", r, "=");
  const std::string_view name = es.name;
  if (name == "port") {
    if (kv.count("op") == kv.count("after_ms")) return "a port clause needs one of after_ms= or op=";
    p.port.push_back({kv.count("after_ms") ? kv["after_ms"] : 0, kv.count("op") ? kv["op"] : 0, kv["down_ms"]});
  } else if (name == "qp_fatal") {
    p.qp_fatal.push_back({all, qpn, kv["op"]});
  } else if (name == "rnr") {
    p.rnr.push_back({all, qpn, kv["op"], kv.count("times") ? uint32_t(kv["times"]) : 1u});
  } else {
    const Timed t = name == "cq_err" ? Timed::kCqErr : name == "srq_limit" ? Timed::kSrqLimit : Timed::kDeviceFatal;
    const uint64_t n = kv.count("cq") ? kv["cq"] : kv.count("srq") ? kv["srq"] : 1;
    p.timed.push_back({t, kv["after_ms"], uint32_t(n)});
  }
  return "";
}

std::string qp_selector(std::string_view sel, bool& all, uint32_t& qpn) {
  if (sel == "all") return (all = true), "";
  uint64_t n = 0;
  if (sel.substr(0, 3) != "qp=" || !to_u64(sel.substr(3), n) || n == 0 || n > 0xffffff)
    return cat("bad QP selector '", sel, "' (all, or qp=N with N a QP number)");
  all = false;
  qpn = uint32_t(n);
  return "";
}

std::string clause(std::string_view c, Plan& p) {
  size_t colon = c.find(':');
  std::string_view head = colon == std::string_view::npos ? "" : trim(c.substr(0, colon));
  std::string_view body = colon == std::string_view::npos ? c : trim(c.substr(colon + 1));
  std::string_view section = head.substr(0, head.find('@'));
  const bool bare = colon == std::string_view::npos;
  const EventSection* es = bare ? nullptr : event_section(section);
  if (!bare && section != "wire" && section != "wc" && !es)
    return cat("unknown section '", section,
               "' (wire, wc, rnr, port, qp_fatal, cq_err, srq_limit or device_fatal)");
  bool all = true;
  uint32_t qpn = 0;
  if (!bare && head.find('@') != std::string_view::npos) {
    if (es && section != "qp_fatal" && section != "rnr") return cat("a ", section, " clause takes no QP selector");
    if (std::string e = qp_selector(trim(head.substr(head.find('@') + 1)), all, qpn); !e.empty()) return e;
  }
  if (es) return event_clause(*es, body, all, qpn, p);
  WireRule w;
  WcRule r;
  std::set<std::string_view> seen;
  for (std::string_view kv : split(body, ',')) {
    std::string_view k, v;
    if (std::string e = key_value(kv, k, v); !e.empty()) return e;
    if (!seen.insert(k).second) return cat("'", k, "' given twice in one clause");
    std::string e = section == "wc" ? wc_setting(k, v, r) : wire_setting(k, v, w, p, bare);
    if (!e.empty()) return e;
  }
  if (bare && seen.size() == 1 && seen.count("seed")) return "";  // "seed=N" alone
  if (section == "wc") {
    if (seen.count("status") == seen.count("delay_us")) return "a wc clause needs one of status= or delay_us=";
    if (seen.count("op") + seen.count("rate") + seen.count("after_ms") == 0)
      return "a wc clause needs one of op=, rate= or after_ms=";
    if (seen.count("op") && (seen.count("rate") || seen.count("after_ms")))
      return "a wc clause with op= takes neither rate= nor after_ms=";
    r.all = all;
    r.qpn = qpn;
    p.wc.push_back(r);
    return "";
  }
  w.all = all;
  w.qpn = qpn;
  p.wire.push_back(w);
  return "";
}

}  // namespace

std::string parse(std::string_view text, Plan& out) {
  Plan p;
  int n = 0;
  for (std::string_view c : split(text, ';')) {
    ++n;
    if (c.empty()) continue;
    if (std::string e = clause(c, p); !e.empty()) return cat("clause ", std::to_string(n), " '", c, "': ", e);
  }
  out = std::move(p);
  return "";
}

std::string file_text(std::string_view contents) {
  std::string out;
  for (std::string_view line : split(contents, '\n')) {
    line = trim(line.substr(0, line.find('#')));
    if (line.empty()) continue;
    if (!out.empty()) out += ';';
    out += line;
  }
  return out;
}

std::string from_environment(Plan& out) {
  // secure_getenv: a set-user-ID or set-group-ID program is given no plan
  // by whoever starts it.
  const char* text = secure_getenv("SOFTVERBS_FAULTS");
  const char* file = secure_getenv("SOFTVERBS_FAULT_PLAN");
  out = Plan{};
  if (text && file) return "SOFTVERBS_FAULTS and SOFTVERBS_FAULT_PLAN are both set: give one";
  if (text) {
    std::string e = parse(text, out);
    return e.empty() ? e : cat("SOFTVERBS_FAULTS: ", e);
  }
  if (!file) return "";
  std::ifstream f(file);
  if (!f) return cat("SOFTVERBS_FAULT_PLAN: cannot read ", file);
  std::stringstream ss;
  ss << f.rdbuf();
  std::string e = parse(file_text(ss.str()), out);
  return e.empty() ? e : cat("SOFTVERBS_FAULT_PLAN ", file, ": ", e);
}

const WireRule* wire_for(const Plan& p, uint32_t qpn) {
  const WireRule* any = nullptr;
  for (const WireRule& r : p.wire) {
    if (!r.all && r.qpn == qpn) return &r;
    if (r.all && !any) any = &r;
  }
  return any;
}

const char* status_name(ibv_wc_status s) {
  for (const Status& st : kStatuses)
    if (st.s == s) return st.name;
  return "";
}

}  // namespace sv::faults
