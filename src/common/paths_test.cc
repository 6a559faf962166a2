// The choice of the per-user daemon's directory by network namespace
// (common/paths.h).
#include "common/paths.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
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
  // logind's directory when it is the user's own (0700), else /tmp's.
  const std::string uid = std::to_string(::getuid());
  struct stat st;
  const bool logind = ::lstat(("/run/user/" + uid).c_str(), &st) == 0 && S_ISDIR(st.st_mode) &&
                      st.st_uid == ::getuid() && (st.st_mode & 077) == 0;
  EXPECT_EQ(logind ? "/run/user/" + uid + "/softverbs" : "/tmp/softverbs-" + uid, runtime_base_dir());
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

// --- directories held by a descriptor ---------------------------------------

TEST(Paths, OpenDirChecksThroughTheDescriptor) {
  TempDir t;
  const std::string good = t.path() + "/good";
  RunDir d;
  std::string why;
  ASSERT_EQ(0, open_dir(good, DirRule::User, true, d, &why)) << why;
  struct stat st;
  ASSERT_EQ(0, ::fstat(d.fd.get(), &st));
  EXPECT_TRUE(S_ISDIR(st.st_mode));
  EXPECT_EQ(0700u, st.st_mode & 0777);
  EXPECT_EQ(::getuid(), d.owner);
  EXPECT_EQ(good, d.path);
  EXPECT_EQ("/proc/self/fd/" + std::to_string(d.fd.get()) + "/control", d.at("control"));
  // Not made when not asked to.
  RunDir none;
  EXPECT_EQ(ENOENT, open_dir(t.path() + "/absent", DirRule::User, false, none, &why));
  EXPECT_FALSE(none.valid());
}

TEST(Paths, OpenDirRefusesWithTheReason) {
  TempDir t;
  EnvVar dir("SOFTVERBS_DIR", nullptr);
  RunDir d;
  std::string why;
  const std::string wide = t.path() + "/wide";
  ASSERT_EQ(0, ::mkdir(wide.c_str(), 0755));
  ASSERT_EQ(0, ::chmod(wide.c_str(), 0755));
  EXPECT_EQ(EPERM, open_dir(wide, DirRule::User, true, d, &why));
  EXPECT_EQ("runtime directory " + wide + " has mode 0755; it must be 0700 (chmod 700 " + wide + ")", why);
  EXPECT_FALSE(d.valid());
  {
    EnvVar e("SOFTVERBS_DIR", wide.c_str());
    EXPECT_EQ(EPERM, open_dir(wide, DirRule::User, true, d, &why));
    EXPECT_EQ("SOFTVERBS_DIR=" + wide + " has mode 0755; it must be 0700 (chmod 700 " + wide + ")", why);
  }
  // A symlink to a good directory is not followed.
  const std::string good = t.path() + "/good", link = t.path() + "/link";
  ASSERT_EQ(0, ::mkdir(good.c_str(), 0700));
  ASSERT_EQ(0, ::symlink(good.c_str(), link.c_str()));
  EXPECT_NE(0, open_dir(link, DirRule::User, true, d, &why));
  EXPECT_NE(std::string::npos, why.find(link + " is a symbolic link")) << why;
  // A file is not a directory.
  const std::string file = t.path() + "/file";
  std::ofstream(file) << "x";
  EXPECT_EQ(ENOTDIR, open_dir(file, DirRule::User, true, d, &why));
  EXPECT_NE(std::string::npos, why.find(file + " is not a directory")) << why;
  // The system directory: no one else may write it.
  ASSERT_EQ(0, ::chmod(wide.c_str(), 0775));
  EXPECT_EQ(EPERM, open_dir(wide, DirRule::SystemClient, false, d, &why));
  EXPECT_NE(std::string::npos, why.find("has mode 0775; no one but its owner may write it")) << why;
  ASSERT_EQ(0, ::chmod(wide.c_str(), 0755));
  EXPECT_EQ(0, open_dir(wide, DirRule::SystemClient, false, d, &why)) << why;
}

TEST(Paths, OpenDirRefusesAnotherUsersDirectory) {
  if (::getuid() != 0) GTEST_SKIP() << "needs root to make a directory of another user";
  TempDir t;
  EnvVar dir("SOFTVERBS_DIR", nullptr);
  const std::string theirs = t.path() + "/theirs";
  ASSERT_EQ(0, ::mkdir(theirs.c_str(), 0700));
  ASSERT_EQ(0, ::chown(theirs.c_str(), 65534, 65534));
  RunDir d;
  std::string why;
  EXPECT_EQ(EPERM, open_dir(theirs, DirRule::User, true, d, &why));
  EXPECT_EQ("runtime directory " + theirs +
                " is owned by uid 65534, not you (uid 0): remove it, or set XDG_RUNTIME_DIR or SOFTVERBS_DIR to a "
                "directory of yours with mode 0700",
            why);
  EXPECT_EQ(EPERM, open_dir(theirs, DirRule::SystemClient, false, d, &why));
  // A namespace's directory under a refused BASE is not made.
  EnvVar x("XDG_RUNTIME_DIR", t.path().c_str());
  const std::string base = t.path() + "/softverbs";
  ASSERT_EQ(0, ::mkdir(base.c_str(), 0777));
  ASSERT_EQ(0, ::chown(base.c_str(), 65534, 65534));
  EXPECT_EQ(EPERM, ensure_runtime_dir(netns_dir(base, {4, 7}), d, &why));
  struct stat st;
  EXPECT_NE(0, ::lstat(netns_dir(base, {4, 7}).c_str(), &st)) << "made inside a refused directory";
  // Nor is its record read: the choice is BASE itself, which is refused later.
  std::ofstream(netns_record_path(base)) << format_netns_record({4, 8});
  EXPECT_EQ(base, runtime_dir());
  NetnsId got;
  EXPECT_FALSE(read_netns_record(base, &got));
}

TEST(Paths, EverythingGoesThroughTheDescriptorAfterTheCheck) {
  TempDir t;
  const std::string p = t.path() + "/d";
  RunDir d;
  ASSERT_EQ(0, open_dir(p, DirRule::User, true, d));
  // The path now names another directory; the descriptor still the checked one.
  ASSERT_EQ(0, ::rename(p.c_str(), (p + ".old").c_str()));
  ASSERT_EQ(0, ::mkdir(p.c_str(), 0777));
  ASSERT_EQ(0, write_netns_record(d, {4, 9}));
  RunDir sub;
  ASSERT_EQ(0, open_subdir(d, "net-1-2", true, sub));
  struct stat st;
  EXPECT_EQ(0, ::lstat((p + ".old/netns").c_str(), &st));
  EXPECT_EQ(0, ::lstat((p + ".old/net-1-2").c_str(), &st));
  EXPECT_NE(0, ::lstat((p + "/netns").c_str(), &st));
  EXPECT_NE(0, ::lstat((p + "/net-1-2").c_str(), &st));
  NetnsId got;
  ASSERT_TRUE(read_netns_record(d, &got));
  EXPECT_EQ((NetnsId{4, 9}), got);
  std::ofstream(d.at("x")) << "y";
  EXPECT_EQ(0, ::lstat((p + ".old/x").c_str(), &st));
  // A subdirectory is one plain name, and not a symlink.
  EXPECT_EQ(EINVAL, open_subdir(d, "..", true, sub));
  EXPECT_EQ(EINVAL, open_subdir(d, "a/b", true, sub));
  ASSERT_EQ(0, ::symlink((p + ".old/net-1-2").c_str(), (p + ".old/link").c_str()));
  EXPECT_NE(0, open_subdir(d, "link", false, sub));
}

TEST(Paths, RecordMustBeTheOwnersRegularFile) {
  TempDir t;
  RunDir d;
  ASSERT_EQ(0, open_dir(t.path() + "/d", DirRule::User, true, d));
  const std::string rec = t.path() + "/d/netns";
  NetnsId got;
  // A symlink to a good record is not followed.
  std::ofstream(t.path() + "/elsewhere") << "4 5\n";
  ASSERT_EQ(0, ::symlink((t.path() + "/elsewhere").c_str(), rec.c_str()));
  EXPECT_FALSE(read_netns_record(d, &got));
  ASSERT_EQ(0, ::unlink(rec.c_str()));
  // A FIFO is not waited on.
  ASSERT_EQ(0, ::mkfifo(rec.c_str(), 0600));
  EXPECT_FALSE(read_netns_record(d, &got));
  ASSERT_EQ(0, ::unlink(rec.c_str()));
  std::ofstream(rec) << "4 5\n";
  EXPECT_TRUE(read_netns_record(d, &got));
  if (::getuid() == 0) {
    ASSERT_EQ(0, ::chown(rec.c_str(), 65534, 65534));
    EXPECT_FALSE(read_netns_record(d, &got)) << "a record of another user was believed";
  }
}

TEST(Paths, ConnectInAcceptsOnlyTheOwnersDaemon) {
  if (::getuid() != 0) GTEST_SKIP() << "needs root to listen as another user";
  TempDir t;
  RunDir d;
  ASSERT_EQ(0, open_dir(t.path() + "/d", DirRule::User, true, d));
  // Bound by root, listening as nobody: SO_PEERCRED names the listener.
  int ready[2];
  ASSERT_EQ(0, ::pipe(ready));
  pid_t pid = ::fork();
  if (pid == 0) {
    Fd s(::socket(AF_UNIX, SOCK_SEQPACKET, 0));
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::snprintf(a.sun_path, sizeof a.sun_path, "%s/d/control", t.path().c_str());
    if (::bind(s.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::setgid(65534) != 0 ||
        ::setuid(65534) != 0 || ::listen(s.get(), 4) != 0)
      ::_exit(1);
    char c = 1;
    if (::write(ready[1], &c, 1) != 1) ::_exit(1);
    ::pause();
    ::_exit(0);
  }
  char c = 0;
  ASSERT_EQ(1, ::read(ready[0], &c, 1));
  Fd conn;
  EXPECT_EQ(EPERM, connect_in(d, conn));
  EXPECT_FALSE(conn.valid());
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
  ::close(ready[0]);
  ::close(ready[1]);
  // The owner's own listener is accepted.
  ASSERT_EQ(0, ::unlink((t.path() + "/d/control").c_str()));
  Fd l;
  ASSERT_EQ(0, listen_seqpacket(d.at("control"), l, 0));
  EXPECT_EQ(0, connect_in(d, conn));
}

}  // namespace
}  // namespace sv
