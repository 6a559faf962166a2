// The spec `softverbs cdi` writes (cdi.h): sv0's edits, and a trust
// domain's device with its own directory, read back as a runtime would.
#include "tools/cdi.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace sv::tools {
namespace {

CdiPaths paths() {
  CdiPaths p;
  p.lib_dir = "/usr/lib/softverbs";
  p.daemon = "/usr/sbin/softverbsd";
  p.tool = "/usr/bin/softverbs";
  return p;
}

size_t count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
  return n;
}

TEST(Cdi, Sv0AloneMountsNoDomainDirectory) {
  const std::string s = cdi_spec(paths(), "softverbs.io/rdma");
  EXPECT_EQ(count(s, "\"name\": "), 1u);
  EXPECT_NE(s.find("\"name\": \"sv0\""), std::string::npos);
  EXPECT_EQ(s.find("SOFTVERBS_DIR"), std::string::npos) << "sv0's daemon is the container's own, in its /tmp";
  EXPECT_EQ(s.find("/run/softverbs-domain"), std::string::npos);
  // iproute2's `rdma` in the container: the RDMA netlink shim, from the
  // mounted library directory.
  EXPECT_NE(s.find("\"LD_PRELOAD=/opt/softverbs/lib/libsoftverbs_netlink.so\""), std::string::npos);
  EXPECT_NE(s.find("\"containerPath\": \"/opt/softverbs/lib\""), std::string::npos);
}

TEST(Cdi, ADomainsDeviceHasItsDirectoryReadWriteAndNothingElseDoes) {
  const std::string s = cdi_spec(paths(), "softverbs.io/rdma", {"job1", "job-2"}, "/run/softverbs/domains");
  EXPECT_EQ(count(s, "\"name\": "), 3u);
  EXPECT_EQ(count(s, "SOFTVERBS_DIR=/run/softverbs-domain"), 2u);
  EXPECT_NE(s.find("\"hostPath\": \"/run/softverbs/domains/job1\", \"containerPath\": \"/run/softverbs-domain\", "
                   "\"options\": [\"rw\", \"nosuid\", \"nodev\", \"noexec\", \"rbind\"]"),
            std::string::npos);
  EXPECT_NE(s.find("/run/softverbs/domains/job-2\""), std::string::npos);
  // sv0 comes first and has no domain directory.
  const size_t sv0 = s.find("\"name\": \"sv0\""), job1 = s.find("\"name\": \"job1\"");
  ASSERT_LT(sv0, job1);
  EXPECT_EQ(s.substr(sv0, job1 - sv0).find("softverbs-domain"), std::string::npos);
  // Balanced: every device entry closed, the list's commas between them only.
  EXPECT_EQ(count(s, "{"), count(s, "}"));
  EXPECT_EQ(count(s, "["), count(s, "]"));
  EXPECT_EQ(s.find("},\n  ]"), std::string::npos);
}

// A users' domain (containers of several users in one pod) points the
// library at the domain's system daemon, never at a per-user one.
TEST(Cdi, AUsersDomainsDeviceNamesTheSystemDaemonsDirectory) {
  const std::string s = cdi_spec(paths(), "softverbs.io/rdma", {"job1"}, "/run/softverbs/domains", {"pod7"});
  EXPECT_EQ(count(s, "\"name\": "), 3u);
  const size_t job1 = s.find("\"name\": \"job1\""), pod7 = s.find("\"name\": \"pod7\"");
  ASSERT_LT(job1, pod7);
  const std::string users = s.substr(pod7);
  EXPECT_NE(users.find("\"SOFTVERBS_SYSTEM=1\", \"SOFTVERBS_SYSTEM_DIR=/run/softverbs-domain\""), std::string::npos);
  EXPECT_EQ(users.find("SOFTVERBS_DIR="), std::string::npos) << "a users' domain has no per-user daemon";
  EXPECT_NE(users.find("\"hostPath\": \"/run/softverbs/domains/pod7\""), std::string::npos);
  EXPECT_EQ(s.substr(job1, pod7 - job1).find("SOFTVERBS_SYSTEM"), std::string::npos);
  EXPECT_EQ(count(s, "{"), count(s, "}"));
  EXPECT_EQ(count(s, "["), count(s, "]"));
  EXPECT_EQ(s.find("},\n  ]"), std::string::npos);
}

// A second `softverbs cdi --output` of the same file keeps the devices the
// first wrote that it does not name: domain A survives domain B's run.
TEST(Cdi, AnotherDomainsRunKeepsTheDevicesAlreadyInTheSpec) {
  const std::string first = cdi_spec(paths(), "softverbs.io/rdma", {"job1"}, "/run/softverbs/domains", {"pod1"});
  const std::string second = cdi_spec(paths(), "softverbs.io/rdma", {"job2"}, "/run/softverbs/domains");
  std::string merged, why;
  std::vector<std::string> kept;
  ASSERT_TRUE(merge_cdi_spec(second, first, merged, kept, why)) << why;
  EXPECT_EQ(kept, (std::vector<std::string>{"job1", "pod1"}));
  EXPECT_EQ(count(merged, "\"name\": "), 4u) << merged;
  EXPECT_EQ(count(merged, "\"name\": \"sv0\""), 1u) << "sv0 is replaced, not doubled";
  for (const char* n : {"job1", "job2", "pod1"})
    EXPECT_EQ(count(merged, std::string("\"name\": \"") + n + "\""), 1u) << n;
  // pod1's edits came through as written: still a users' domain.
  EXPECT_NE(merged.substr(merged.find("\"name\": \"pod1\"")).find("SOFTVERBS_SYSTEM=1"), std::string::npos);
  // Merging again changes nothing: the output reads back as a spec.
  std::string again;
  ASSERT_TRUE(merge_cdi_spec(second, merged, again, kept, why)) << why;
  EXPECT_EQ(again, merged);
  EXPECT_EQ(count(merged, "{"), count(merged, "}"));
  EXPECT_EQ(merged.find("},\n  ]"), std::string::npos);
}

// A run that names a domain already in the spec replaces its device; no
// file, or an empty one, gives the fresh spec.
TEST(Cdi, ADomainNamedAgainIsReplacedAndAnEmptyFileIsNoSpec) {
  CdiPaths moved = paths();
  moved.tool = "/opt/new/softverbs";
  const std::string first = cdi_spec(paths(), "softverbs.io/rdma", {"job1"}, "/run/softverbs/domains");
  const std::string second = cdi_spec(moved, "softverbs.io/rdma", {"job1"}, "/run/softverbs/domains");
  std::string merged, why;
  std::vector<std::string> kept;
  ASSERT_TRUE(merge_cdi_spec(second, first, merged, kept, why)) << why;
  EXPECT_TRUE(kept.empty());
  EXPECT_EQ(merged, second);
  ASSERT_TRUE(merge_cdi_spec(second, " \n", merged, kept, why)) << why;
  EXPECT_EQ(merged, second);
}

// A spec of another kind, or a file that is no spec, is not overwritten.
TEST(Cdi, AFileOfAnotherKindOrNoSpecIsNotMergedInto) {
  const std::string fresh = cdi_spec(paths(), "softverbs.io/rdma");
  std::string merged, why;
  std::vector<std::string> kept;
  EXPECT_FALSE(merge_cdi_spec(fresh, cdi_spec(paths(), "example.com/gpu"), merged, kept, why));
  EXPECT_NE(why.find("example.com/gpu"), std::string::npos) << why;
  for (const char* bad : {"not json", "{\"kind\": \"softverbs.io/rdma\", \"devices\": [{\"name\": ", "[1, 2]",
                          "{\"kind\": \"softverbs.io/rdma\", \"devices\": [{\"x\": 1}]}", "{} trailing"}) {
    why.clear();
    EXPECT_FALSE(merge_cdi_spec(fresh, bad, merged, kept, why)) << bad;
    EXPECT_FALSE(why.empty()) << bad;
  }
  // Another writer's spacing and fields are read alike.
  const std::string other =
      "{\"cdiVersion\":\"0.6.0\",\"kind\":\"softverbs.io/rdma\",\"annotations\":{\"a\":[1,true,null,-2.5e3]},"
      "\"devices\":[{\"containerEdits\":{\"env\":[\"A=\\\"b\\\"\"]},\"name\":\"by\\u0068and\"}]}";
  ASSERT_TRUE(merge_cdi_spec(fresh, other, merged, kept, why)) << why;
  EXPECT_EQ(kept, std::vector<std::string>{"byhand"});
}

TEST(Cdi, DomainNamesThatCouldEscapeOrCollideAreRefused) {
  for (const char* ok : {"a", "job1", "job-2", "0", "abcdefghijklmnopqrstuvwxyz0123456789-abcdefghijklmnopqrstuvwxyz"})
    EXPECT_TRUE(valid_domain_name(ok)) << ok;
  for (const char* bad : {"", "sv0", "..", "../etc", "a/b", "-x", "Job", "a b", "a\"b", "a\nb", "\xc3\xa9",
                          "abcdefghijklmnopqrstuvwxyz0123456789-abcdefghijklmnopqrstuvwxyz0"})
    EXPECT_FALSE(valid_domain_name(bad)) << bad;
}

}  // namespace
}  // namespace sv::tools
