// The spec `softverbs cdi` writes (cdi.h): sv0's edits, and a trust
// domain's device with its own directory, read back as a runtime would.
#include "tools/cdi.h"

#include <gtest/gtest.h>

#include <string>

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

TEST(Cdi, DomainNamesThatCouldEscapeOrCollideAreRefused) {
  for (const char* ok : {"a", "job1", "job-2", "0", "abcdefghijklmnopqrstuvwxyz0123456789-abcdefghijklmnopqrstuvwxyz"})
    EXPECT_TRUE(valid_domain_name(ok)) << ok;
  for (const char* bad : {"", "sv0", "..", "../etc", "a/b", "-x", "Job", "a b", "a\"b", "a\nb", "\xc3\xa9",
                          "abcdefghijklmnopqrstuvwxyz0123456789-abcdefghijklmnopqrstuvwxyz0"})
    EXPECT_FALSE(valid_domain_name(bad)) << bad;
}

}  // namespace
}  // namespace sv::tools
