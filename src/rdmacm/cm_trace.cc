// cm_trace.cc: the CM's trace lines (see cm_trace.h).
#include "rdmacm/cm_trace.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>

namespace sv::rdmacm {

std::string trace_line(int pid, const char* fmt, va_list ap) {
  char buf[512];
  int n = std::snprintf(buf, sizeof(buf), "softverbs-cm[%d]: ", pid);
  if (n < 0) n = 0;
  size_t used = std::min(size_t(n), sizeof(buf) - 1);
  int m = std::vsnprintf(buf + used, sizeof(buf) - used, fmt, ap);
  if (m > 0) used = std::min(used + size_t(m), sizeof(buf) - 1);
  std::string line(buf, used);
  line.push_back('\n');
  return line;
}

void write_trace(int fd, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  std::string line = trace_line(::getpid(), fmt, ap);
  va_end(ap);
  int saved = errno;  // callers trace between a failing call and their use of errno
  (void)!::write(fd, line.data(), line.size());
  errno = saved;
}

bool tracing() {
  static const bool on = [] {
    const char* v = std::getenv("SOFTVERBS_CM_TRACE");
    return v && *v && *v != '0';
  }();
  return on;
}

}  // namespace sv::rdmacm
