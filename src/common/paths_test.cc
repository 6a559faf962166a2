// The choice of the per-user daemon's directory by network namespace
// (common/paths.h, issue 22 item 7).
#include "common/paths.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>

namespace sv {
namespace {

// Sets (or unsets, null) an environment variable for the scope.
class EnvVar {
 public:
  EnvVar(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) had_ = true, old_ = old;
    if (value) ::setenv(name, value, 1);
    else ::unsetenv(name);
  }
  ~EnvVar() {
    if (had_) ::setenv(name_, old_.c_str(), 1);
    else ::unsetenv(name_);
  }

 private:
  const char* name_;
  bool had_ = false;
  std::string old_;
};

class TempDir {
 public:
  TempDir() {
    char t[] = "/tmp/sv-paths-test-XXXXXX";
    path_ = ::mkdtemp(t);
  }
  ~TempDir() { std::system(("rm -rf '" + path_ + "'").c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

TEST(Paths, NetnsSelfIsStable) {
  const NetnsId a = netns_self(), b = netns_self();
  EXPECT_EQ(a, b);
  EXPECT_NE(0u, a.ino);  // /proc is mounted where the tests run
}

TEST(Paths, RecordRoundTrip) {
  NetnsId id{4, 4026532281};
  EXPECT_EQ("4 4026532281\n", format_netns_record(id));
  NetnsId back;
  ASSERT_TRUE(parse_netns_record(format_netns_record(id), &back));
  EXPECT_EQ(id, back);
  for (const char* bad : {"", "4", "4 x\n", "4 5", "x 5\n"}) EXPECT_FALSE(parse_netns_record(bad, &back)) << bad;
}

TEST(Paths, ChooseByRecordedNamespace) {
  const NetnsId a{4, 100}, b{4, 200}, other_dev{5, 100};
  EXPECT_EQ("/r/softverbs", choose_runtime_dir("/r/softverbs", nullptr, a));  // nothing recorded yet
  EXPECT_EQ("/r/softverbs", choose_runtime_dir("/r/softverbs", &a, a));      // BASE serves ours
  EXPECT_EQ("/r/softverbs/net-200-4", choose_runtime_dir("/r/softverbs", &a, b));
  // Same inode on another device: another namespace.
  EXPECT_EQ("/r/softverbs/net-100-5", choose_runtime_dir("/r/softverbs", &a, other_dev));
}

TEST(Paths, BaseDirectory) {
  EnvVar dir("SOFTVERBS_DIR", nullptr);
  {
    EnvVar x("XDG_RUNTIME_DIR", "/run/user/4242");
    EXPECT_EQ("/run/user/4242/softverbs", runtime_base_dir());
    EXPECT_FALSE(runtime_dir_explicit());
  }
  EnvVar x("XDG_RUNTIME_DIR", nullptr);
  EXPECT_EQ("/tmp/softverbs-" + std::to_string(::getuid()), runtime_base_dir());
}

TEST(Paths, ExplicitDirectoryWinsWhateverIsRecorded) {
  TempDir t;
  EnvVar x("XDG_RUNTIME_DIR", t.path().c_str());
  const std::string base = t.path() + "/softverbs";
  ASSERT_EQ(0, ensure_runtime_dir(base));
  NetnsId other = netns_self();
  other.ino += 1;
  ASSERT_EQ(0, write_netns_record(base, other));
  EnvVar dir("SOFTVERBS_DIR", "/somewhere/else");
  EXPECT_TRUE(runtime_dir_explicit());
  EXPECT_EQ("/somewhere/else", runtime_dir());
}

TEST(Paths, RuntimeDirFollowsTheRecord) {
  TempDir t;
  EnvVar dir("SOFTVERBS_DIR", nullptr);
  EnvVar x("XDG_RUNTIME_DIR", t.path().c_str());
  const std::string base = t.path() + "/softverbs";
  const NetnsId self = netns_self();
  EXPECT_EQ(base, runtime_dir());  // no base directory, no record
  // Another namespace's daemon recorded itself: ours is BASE/net-INO-DEV,
  // created with BASE's rules.
  ASSERT_EQ(0, ensure_runtime_dir(base));
  NetnsId other = self;
  other.ino += 1;
  ASSERT_EQ(0, write_netns_record(base, other));
  NetnsId got;
  ASSERT_TRUE(read_netns_record(base, &got));
  EXPECT_EQ(other, got);
  const std::string mine = runtime_dir();
  EXPECT_EQ(netns_dir(base, self), mine);
  EXPECT_EQ(base + "/net-" + std::to_string(self.ino) + "-" + std::to_string(self.dev), mine);
  ASSERT_EQ(0, ensure_runtime_dir(mine));
  struct stat st;
  ASSERT_EQ(0, ::lstat(mine.c_str(), &st));
  EXPECT_EQ(0700u, st.st_mode & 0777);
  // Ours recorded: BASE again.
  ASSERT_EQ(0, write_netns_record(base, self));
  EXPECT_EQ(base, runtime_dir());
  // A record that cannot be read counts as none.
  std::ofstream(netns_record_path(base)) << "garbage";
  EXPECT_EQ(base, runtime_dir());
}

TEST(Paths, NamespaceDirectoryCreatesItsBase) {
  TempDir t;
  EnvVar dir("SOFTVERBS_DIR", nullptr);
  EnvVar x("XDG_RUNTIME_DIR", t.path().c_str());
  const std::string base = t.path() + "/softverbs";
  EXPECT_EQ(0, ensure_runtime_dir(netns_dir(base, {4, 7})));
  struct stat st;
  ASSERT_EQ(0, ::lstat(base.c_str(), &st));
  EXPECT_EQ(0700u, st.st_mode & 0777);
  // Only under BASE: an explicit directory's parent is not created.
  EXPECT_EQ(ENOENT, ensure_runtime_dir(t.path() + "/nothere/x"));
}

}  // namespace
}  // namespace sv
