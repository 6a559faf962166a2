#include "daemon/cm_ports.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <rdma/rdma_cma.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>

namespace sv::daemon {
namespace {

struct Dir {
  std::string path;
  Dir() {
    char t[] = "/tmp/sv-cmports-XXXXXX";
    path = ::mkdtemp(t);
  }
  ~Dir() { (void)!std::system(("rm -rf " + path).c_str()); }
};

proto::CmBindReq req(uint16_t port, const char* ip) {
  proto::CmBindReq r{};
  r.ps = RDMA_PS_TCP;
  r.port = port;
  r.family = std::string(ip).find(':') == std::string::npos ? AF_INET : AF_INET6;
  ::inet_pton(r.family, ip, r.addr);
  return r;
}

bool exists(const std::string& p) { return ::access(p.c_str(), F_OK) == 0; }

TEST(CmPorts, RulesOfAHostWidePortSpace) {
  Dir d;
  Quotas q;
  q.configure(true, 1024);
  CmPorts ports(q);
  uint16_t port = 0;
  int fd = -1;
  EXPECT_EQ(EOPNOTSUPP, ports.bind(1, 0, req(7000, "0.0.0.0"), port, fd));
  ports.set_dir(d.path);
  // Below 1024: root only.
  EXPECT_EQ(EACCES, ports.bind(1, 1000, req(999, "0.0.0.0"), port, fd));
  EXPECT_EQ(0, ports.bind(2, 0, req(999, "0.0.0.0"), port, fd));
  EXPECT_TRUE(exists(d.path + "/262-999-0.0.0.0"));
  // One address once; a specific under a wildcard; another user's wildcard
  // over a held address.
  EXPECT_EQ(0, ports.bind(1, 1000, req(7000, "127.0.0.1"), port, fd));
  EXPECT_EQ(EADDRINUSE, ports.bind(2, 0, req(7000, "127.0.0.1"), port, fd));
  EXPECT_EQ(EADDRINUSE, ports.bind(2, 0, req(7000, "0.0.0.0"), port, fd));
  EXPECT_EQ(EADDRINUSE, ports.bind(2, 0, req(7000, "::"), port, fd));
  EXPECT_EQ(EADDRINUSE, ports.bind(2, 0, req(999, "127.0.0.1"), port, fd));
  // The same user's two wildcards of one port, each family once.
  EXPECT_EQ(0, ports.bind(3, 1000, req(7100, "0.0.0.0"), port, fd));
  EXPECT_EQ(0, ports.bind(3, 1000, req(7100, "::"), port, fd));
  EXPECT_EQ(EADDRINUSE, ports.bind(4, 1001, req(7100, "::1"), port, fd));
  // An IPv4-mapped address is named as IPv4, as the library names it.
  EXPECT_EQ(EADDRINUSE, ports.bind(2, 0, req(7000, "::ffff:127.0.0.1"), port, fd));
  // Port 0: an ephemeral one.
  ASSERT_EQ(0, ports.bind(1, 1000, req(0, "127.0.0.1"), port, fd));
  EXPECT_GE(port, 32768);
  EXPECT_TRUE(exists(d.path + "/262-" + std::to_string(port) + "-127.0.0.1"));
  // Given back by its connection only; all of a connection's when it goes.
  EXPECT_EQ(ENOENT, ports.unbind(2, req(7000, "127.0.0.1")));
  EXPECT_EQ(0, ports.unbind(1, req(7000, "127.0.0.1")));
  EXPECT_FALSE(exists(d.path + "/262-7000-127.0.0.1"));
  EXPECT_EQ(0, ports.bind(2, 0, req(7000, "0.0.0.0"), port, fd));
  const size_t before = ports.held();
  ports.release_client(3);
  EXPECT_EQ(before - 2, ports.held());
  EXPECT_FALSE(exists(d.path + "/262-7100-::"));
  // Bad input.
  proto::CmBindReq bad = req(7200, "0.0.0.0");
  bad.ps = 7;
  EXPECT_EQ(EINVAL, ports.bind(1, 1000, bad, port, fd));
  bad = req(7200, "0.0.0.0");
  bad.family = AF_UNIX;
  EXPECT_EQ(EINVAL, ports.bind(1, 1000, bad, port, fd));
}

TEST(CmPorts, EachUserHoldsItsQuota) {
  Dir d;
  ::setenv("SOFTVERBSD_QUOTA_CMPORT", "3", 1);
  Quotas q;
  q.configure(true, 1024);
  ::unsetenv("SOFTVERBSD_QUOTA_CMPORT");
  CmPorts ports(q);
  ports.set_dir(d.path);
  uint16_t port = 0;
  int fd = -1;
  for (int i = 0; i < 3; ++i) EXPECT_EQ(0, ports.bind(1, 1000, req(0, "0.0.0.0"), port, fd));
  EXPECT_EQ(ENOMEM, ports.bind(1, 1000, req(0, "0.0.0.0"), port, fd));
  EXPECT_EQ(0, ports.bind(2, 0, req(0, "0.0.0.0"), port, fd));  // another user's own quota
  ports.release_client(1);
  EXPECT_EQ(0, ports.bind(1, 1000, req(0, "0.0.0.0"), port, fd));
}

}  // namespace
}  // namespace sv::daemon
