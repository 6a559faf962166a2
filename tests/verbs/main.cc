// Test main: every test binary gets its own softverbs daemon (a private
// SOFTVERBS_DIR) that exits shortly after the last client.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <string>

int main(int argc, char** argv) {
  char tmpl[] = "/tmp/softverbs-test-XXXXXX";
  if (!getenv("SOFTVERBS_DIR")) {
    const char* dir = mkdtemp(tmpl);
    if (dir) setenv("SOFTVERBS_DIR", dir, 1);
  }
  setenv("SOFTVERBSD_IDLE", "3", 0);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
