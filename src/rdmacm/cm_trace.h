// cm_trace.h: SOFTVERBS_CM_TRACE=1, one line on stderr per CM step.
//
// Each line leaves in ONE write(2): the engine thread traces while the
// application prints, both often into the same file (`prog >log 2>&1`);
// a line written in pieces (prefix, message, newline) gets the
// application's output spliced into it, and the tests that grep the trace
// (tests/compat/ucx_cm.sh, tests/roce/cm_wire_test.sh) then miss it.
#pragma once

#include <cstdarg>
#include <string>

namespace sv::rdmacm {

// "softverbs-cm[PID]: <message>\n", the message formatted from fmt/ap
// (truncated to a bounded length, the newline always kept).
std::string trace_line(int pid, const char* fmt, va_list ap);

// Writes trace_line(getpid(), fmt, ...) to fd with a single write(2).
void write_trace(int fd, const char* fmt, ...) __attribute__((format(printf, 2, 3)));

// Whether SOFTVERBS_CM_TRACE is set (read once).
bool tracing();

}  // namespace sv::rdmacm

#define CM_TRACE(...)                                              \
  do {                                                             \
    if (::sv::rdmacm::tracing()) ::sv::rdmacm::write_trace(2, __VA_ARGS__); \
  } while (0)
