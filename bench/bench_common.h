// Shared helpers for the softverbs benchmarks: a cheap timestamp counter,
// order statistics, message-size parsing and JSON-lines output.
//
// Both benchmarks time ping-pong loops the same way (one timestamp per round
// trip, RTT_i = t[i+1] - t[i]) so that the clock overhead is identical in the
// baseline and in the verbs measurement and their ratio stays meaningful.
//
// Contract: header-only, no global state except the cached tick rate
// (ticks_per_ns(), call it once before fork() or threads); every helper is
// safe to call from one thread at a time per object, and nothing here owns
// memory beyond its own members.
#pragma once

#include <sched.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <x86intrin.h>
#define BENCH_HAVE_TSC 1
#endif

namespace bench {

// ---------------------------------------------------------------- timing --

inline uint64_t now_ns_steady() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}

// Tick counter: the TSC on x86 (constant/invariant on every machine we run
// on), otherwise steady_clock nanoseconds.  ticks_per_ns() converts.
inline uint64_t ticks() {
#ifdef BENCH_HAVE_TSC
  return __rdtsc();
#else
  return now_ns_steady();
#endif
}

// Calibrate ticks against steady_clock once (~20 ms).
inline double ticks_per_ns() {
  static double cached = 0.0;
  if (cached > 0.0) return cached;
#ifdef BENCH_HAVE_TSC
  double best = 0.0;
  for (int round = 0; round < 2; ++round) {
    uint64_t n0 = now_ns_steady();
    uint64_t t0 = ticks();
    uint64_t n1 = n0;
    while ((n1 = now_ns_steady()) - n0 < 10'000'000ull) {
    }
    uint64_t t1 = ticks();
    best = static_cast<double>(t1 - t0) / static_cast<double>(n1 - n0);
  }
  cached = best > 0.0 ? best : 1.0;
#else
  cached = 1.0;
#endif
  return cached;
}

inline double elapsed_s(uint64_t t0, uint64_t t1) {
  return static_cast<double>(t1 - t0) / ticks_per_ns() * 1e-9;
}

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#else
  asm volatile("" ::: "memory");
#endif
}

// Busy-wait helper: pause-spin; once a wait has lasted more than 1 ms, also
// yield the CPU every 1024 spins.  A ping-pong partner on an idle machine
// answers within microseconds, so the yield never happens in a measurement
// that matters; when the partner was preempted (2 vCPUs and something else
// running) it lets it run sooner.  Yielding early is harmful: it hands the CPU
// to whatever else is runnable for a whole time slice.
struct Spinner {
  uint32_t n = 0;
  uint64_t start = 0;
  void spin() {
    cpu_relax();
    if ((++n & 1023u) != 0) return;
    const uint64_t t = ticks();
    if (start == 0) start = t;
    else if (elapsed_s(start, t) > 1e-3) sched_yield();
  }
};

// ------------------------------------------------------------ statistics --

struct LatStats {
  double median_ns = 0;       // median of batch-mean one-way latency (see below)
  double median_iter_ns = 0;  // plain median of individual round trips / 2
  double p99_ns = 0, mean_ns = 0, min_ns = 0, max_ns = 0;
  size_t samples = 0;
};

// Round trips per batch for the median.  The tick counter can be coarse
// (AMD EPYC's TSC advances in ~10 ns steps), which would quantise a ~70 ns
// round trip badly; the median over means of 16 consecutive round trips keeps
// the robustness of a median (a preempted batch is just an outlier) at 16x the
// resolution.  Percentiles and min come from individual round trips.
inline constexpr size_t kLatBatch = 16;

// stamps[i] = tick count just before round trip i starts; stamps.back() after
// the last one.  The first `skip` round trips are warm-up.  Results are
// one-way (RTT/2) in nanoseconds; with `div` = 1 they are whole round trips
// (RDMA READ, whose latency is a round trip by nature).
inline LatStats one_way_stats(const std::vector<uint64_t> &stamps, size_t skip, double div = 2.0) {
  LatStats s;
  if (stamps.size() < skip + 2) return s;
  const double k = 1.0 / div / ticks_per_ns();
  std::vector<uint64_t> rtt;
  rtt.reserve(stamps.size() - skip - 1);
  for (size_t i = skip; i + 1 < stamps.size(); ++i) rtt.push_back(stamps[i + 1] - stamps[i]);
  const size_t n = rtt.size();
  std::vector<double> batch;
  for (size_t b = skip; b + kLatBatch < stamps.size(); b += kLatBatch)
    batch.push_back(static_cast<double>(stamps[b + kLatBatch] - stamps[b]) / kLatBatch * k);
  std::sort(rtt.begin(), rtt.end());
  auto pct = [&](double p) {
    size_t idx = static_cast<size_t>(p * static_cast<double>(n - 1) + 0.5);
    if (idx >= n) idx = n - 1;
    return static_cast<double>(rtt[idx]) * k;
  };
  s.samples = n;
  s.median_iter_ns = pct(0.5);
  s.p99_ns = pct(0.99);
  s.min_ns = static_cast<double>(rtt.front()) * k;
  s.max_ns = static_cast<double>(rtt.back()) * k;
  s.mean_ns = static_cast<double>(stamps.back() - stamps[skip]) / static_cast<double>(n) * k;
  if (batch.empty()) {
    s.median_ns = s.median_iter_ns;
  } else {
    std::sort(batch.begin(), batch.end());
    s.median_ns = batch.size() % 2 ? batch[batch.size() / 2]
                                   : 0.5 * (batch[batch.size() / 2 - 1] + batch[batch.size() / 2]);
  }
  return s;
}

inline double median_of(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// ----------------------------------------------------------------- sizes --

// "8", "4K", "64k", "1M", "4MiB", "2G" -> bytes; returns false on junk.
inline bool parse_size(std::string_view s, uint64_t &out) {
  if (s.empty()) return false;
  uint64_t v = 0;
  size_t i = 0;
  for (; i < s.size() && s[i] >= '0' && s[i] <= '9'; ++i) {
    if (v > (UINT64_MAX - 9) / 10) return false;
    v = v * 10 + static_cast<uint64_t>(s[i] - '0');
  }
  if (i == 0) return false;
  std::string suffix(s.substr(i));
  for (auto &c : suffix) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  uint64_t mul = 1;
  if (suffix.empty() || suffix == "b") mul = 1;
  else if (suffix == "k" || suffix == "kb" || suffix == "kib") mul = 1ull << 10;
  else if (suffix == "m" || suffix == "mb" || suffix == "mib") mul = 1ull << 20;
  else if (suffix == "g" || suffix == "gb" || suffix == "gib") mul = 1ull << 30;
  else return false;
  out = v * mul;
  return true;
}

// "8-4M" (powers of two, inclusive), "8,64,4K", or a mix "8-64,1M".
inline bool parse_size_list(std::string_view spec, std::vector<uint64_t> &out) {
  out.clear();
  size_t pos = 0;
  while (pos <= spec.size()) {
    size_t comma = spec.find(',', pos);
    if (comma == std::string_view::npos) comma = spec.size();
    std::string_view item = spec.substr(pos, comma - pos);
    if (!item.empty()) {
      size_t dash = item.find('-');
      if (dash != std::string_view::npos) {
        uint64_t lo, hi;
        if (!parse_size(item.substr(0, dash), lo) || !parse_size(item.substr(dash + 1), hi) ||
            lo == 0 || lo > hi)
          return false;
        for (uint64_t v = lo; v <= hi; v *= 2) {
          out.push_back(v);
          if (v > (UINT64_MAX >> 1)) break;
        }
      } else {
        uint64_t v;
        if (!parse_size(item, v) || v == 0) return false;
        out.push_back(v);
      }
    }
    pos = comma + 1;
  }
  return !out.empty();
}

inline uint64_t max_of(const std::vector<uint64_t> &v) {
  uint64_t m = 0;
  for (auto x : v) m = std::max(m, x);
  return m;
}

// ---------------------------------------------------------- JSON output --

// Builds one flat JSON object, printed as one line on stdout.
class JsonLine {
 public:
  JsonLine &str(const char *key, std::string_view v) {
    sep();
    buf_ += '"';
    buf_ += key;
    buf_ += "\":\"";
    for (char c : v) {
      if (c == '"' || c == '\\') {
        buf_ += '\\';
        buf_ += c;
      } else if (static_cast<unsigned char>(c) < 0x20) {
        char esc[8];
        std::snprintf(esc, sizeof esc, "\\u%04x", static_cast<unsigned>(c));
        buf_ += esc;
      } else {
        buf_ += c;
      }
    }
    buf_ += '"';
    return *this;
  }
  JsonLine &num(const char *key, uint64_t v) {
    sep();
    char tmp[64];
    std::snprintf(tmp, sizeof tmp, "\"%s\":%" PRIu64, key, v);
    buf_ += tmp;
    return *this;
  }
  JsonLine &num(const char *key, int64_t v) {
    sep();
    char tmp[64];
    std::snprintf(tmp, sizeof tmp, "\"%s\":%" PRId64, key, v);
    buf_ += tmp;
    return *this;
  }
  JsonLine &num(const char *key, int v) { return num(key, static_cast<int64_t>(v)); }
  JsonLine &num(const char *key, unsigned v) { return num(key, static_cast<uint64_t>(v)); }
  JsonLine &real(const char *key, double v) {
    sep();
    char tmp[96];
    std::snprintf(tmp, sizeof tmp, "\"%s\":%.6g", key, v);
    buf_ += tmp;
    return *this;
  }
  void emit() {
    buf_ += "}\n";
    std::fputs(buf_.c_str(), stdout);
    std::fflush(stdout);
    buf_ = "{";
  }

 private:
  void sep() {
    if (buf_.size() > 1) buf_ += ',';
  }
  std::string buf_ = "{";
};

// ------------------------------------------------------- option helpers --

// Tiny "--name value" / "--name=value" parser.
class Args {
 public:
  Args(int argc, char **argv) : argv_(argv + 1, argv + argc) {}
  // Returns true and fills `val` if the current argument is `name`.
  bool take(const char *name, std::string &val) {
    std::string_view a = argv_[i_];
    size_t n = std::strlen(name);
    if (a.substr(0, n) != name) return false;
    if (a.size() == n) {
      if (i_ + 1 >= argv_.size()) {
        std::fprintf(stderr, "option %s needs a value\n", name);
        std::exit(2);
      }
      val = argv_[++i_];
      return true;
    }
    if (a[n] == '=') {
      val = std::string(a.substr(n + 1));
      return true;
    }
    return false;
  }
  bool flag(const char *name) { return std::string_view(argv_[i_]) == name; }
  bool next() { return ++i_ < argv_.size(); }
  bool valid() const { return i_ < argv_.size(); }
  const char *cur() const { return argv_[i_]; }

 private:
  std::vector<char *> argv_;
  size_t i_ = 0;
};

inline uint64_t to_u64(const std::string &s, const char *what) {
  char *end = nullptr;
  errno = 0;
  unsigned long long v = std::strtoull(s.c_str(), &end, 10);
  if (errno || end == s.c_str() || *end) {
    std::fprintf(stderr, "bad number for %s: '%s'\n", what, s.c_str());
    std::exit(2);
  }
  return v;
}

inline double to_double(const std::string &s, const char *what) {
  char *end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  if (end == s.c_str() || *end || !(v >= 0)) {
    std::fprintf(stderr, "bad number for %s: '%s'\n", what, s.c_str());
    std::exit(2);
  }
  return v;
}

}  // namespace bench
