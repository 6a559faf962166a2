// cm_trace_test.cc: SOFTVERBS_CM_TRACE's line, built whole and written once
// (src/rdmacm/cm_trace.h).
#include "rdmacm/cm_trace.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <string>

namespace {

std::string line_of(int pid, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
std::string line_of(int pid, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  std::string s = sv::rdmacm::trace_line(pid, fmt, ap);
  va_end(ap);
  return s;
}

TEST(CmTrace, LineIsPrefixMessageNewline) {
  EXPECT_EQ(line_of(42, "id %d event %s status %d", 2, "RDMA_CM_EVENT_DISCONNECTED", 0),
            "softverbs-cm[42]: id 2 event RDMA_CM_EVENT_DISCONNECTED status 0\n");
}

TEST(CmTrace, LongMessageIsCutButKeepsItsNewline) {
  std::string big(5000, 'x');
  std::string s = line_of(7, "%s", big.c_str());
  ASSERT_LT(s.size(), 1024u);
  EXPECT_EQ(s.rfind("softverbs-cm[7]: xxx", 0), 0u);
  EXPECT_EQ(s.find('\n'), s.size() - 1);
}

// One write(2): on a SOCK_SEQPACKET socket each write is one record, so the
// line arrives as exactly one record, and errno survives the call.
TEST(CmTrace, OneWritePerLine) {
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv), 0);
  errno = ECONNREFUSED;
  sv::rdmacm::write_trace(sv[1], "id %llu event %s status %d", 9ull, "RDMA_CM_EVENT_ESTABLISHED", 0);
  EXPECT_EQ(errno, ECONNREFUSED);
  char buf[1024];
  ssize_t n = ::recv(sv[0], buf, sizeof(buf), MSG_DONTWAIT);
  ASSERT_GT(n, 0);
  std::string want = "softverbs-cm[" + std::to_string(::getpid()) + "]: id 9 event RDMA_CM_EVENT_ESTABLISHED status 0\n";
  EXPECT_EQ(std::string(buf, size_t(n)), want);
  EXPECT_LT(::recv(sv[0], buf, sizeof(buf), MSG_DONTWAIT), 0);  // nothing more
  ::close(sv[0]);
  ::close(sv[1]);
}

}  // namespace
