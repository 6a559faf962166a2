// Test main: every test binary gets its own softverbs daemon (a private
// SOFTVERBS_DIR) that exits shortly after the last client.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <string>

// A test file may define this: `binary --child ARGS` then runs it instead of
// the tests (a peer that must start as a fresh process, e.g. with its own
// environment read by the library at load).
extern "C" int svtest_child_main(int argc, char** argv) __attribute__((weak));
// harness.cc's Peer: `binary --peer FD` serves the test over the socket FD.
extern "C" int svtest_peer_main(int fd) __attribute__((weak));

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "--child" && svtest_child_main) return svtest_child_main(argc - 2, argv + 2);
  if (argc > 2 && std::string(argv[1]) == "--peer" && svtest_peer_main) return svtest_peer_main(atoi(argv[2]));
  char tmpl[] = "/tmp/softverbs-test-XXXXXX";
  if (!getenv("SOFTVERBS_DIR")) {
    const char* dir = mkdtemp(tmpl);
    if (dir) setenv("SOFTVERBS_DIR", dir, 1);
  }
  setenv("SOFTVERBSD_IDLE", "3", 0);
  // A private test daemon leaves the host's UDP 4791 alone (a per-user
  // daemon takes it by default): which of the tests' daemons run in
  // parallel got it must not change what a test sees. RoCE is tested
  // between namespaces (tests/roce/).
  setenv("SOFTVERBS_ROCE", "0", 0);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
