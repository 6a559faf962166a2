// trace.h: opt-in diagnostics. SOFTVERBS_TRACE=1 in the environment makes
// the library report rare events (RNR and retry stalls, errors) on stderr.
// Checked once per process; off costs one predictable branch.
#pragma once

#include <cstdio>
#include <cstdlib>

namespace sv {

inline bool trace_on() {
  static const bool on = [] {
    const char* e = std::getenv("SOFTVERBS_TRACE");
    return e && *e && *e != '0';
  }();
  return on;
}

#define SV_TRACE(...)                                  \
  do {                                                 \
    if (::sv::trace_on()) {                            \
      std::fprintf(stderr, "softverbs: " __VA_ARGS__); \
      std::fputc('\n', stderr);                        \
    }                                                  \
  } while (0)

}  // namespace sv
