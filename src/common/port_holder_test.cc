// Reading /proc/net/udp{,6} for the holder of a port (common/port_holder.h).
#include "common/port_holder.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

namespace sv {
namespace {

// The layout of proc(5)'s /proc/net/udp (as Linux 6.1 and 6.18 print it).
constexpr const char* kUdp =
    "   sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode ref pointer drops\n"
    "  100: 0100007F:0035 00000000:0000 07 00000000:00000000 00:00000000 00000000   101        0 1111 2 0000000000000000 0\n"
    "  200: 014D4D0A:12B7 00000000:0000 07 00000000:00000000 00:00000000 00000000  1000        0 2222 2 0000000000000000 0\n"
    "  201: 00000000:12B7 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 0 2 0000000000000000 0\n";
constexpr const char* kUdp6 =
    "  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode ref pointer drops\n"
    "  12: 000077FD000000000000000001000000:12B7 00000000000000000000000000000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 3333 2 0000000000000000 0\n";

TEST(PortHolder, ParsesTheTables) {
  auto v = parse_proc_net_udp(kUdp, 4791);
  ASSERT_EQ(2u, v.size());
  EXPECT_EQ(1000u, v[0].uid);
  EXPECT_EQ(2222u, v[0].inode);
  EXPECT_EQ(0u, v[1].inode);  // a kernel socket (rxe's) may show no inode
  EXPECT_EQ(1u, parse_proc_net_udp(kUdp, 53).size());
  auto v6 = parse_proc_net_udp(kUdp6, 4791);
  ASSERT_EQ(1u, v6.size());
  EXPECT_EQ(3333u, v6[0].inode);
  EXPECT_TRUE(parse_proc_net_udp("header only\n", 4791).empty());
  EXPECT_TRUE(parse_proc_net_udp("", 4791).empty());
}

TEST(PortHolder, Describes) {
  PortHolder h;
  EXPECT_EQ("", describe(h));
  h.bound = true;
  EXPECT_NE(std::string::npos, describe(h).find("no process of ours"));
  h.pid = 12;
  h.uid = 1000;
  h.comm = "softverbsd";
  h.softverbs_dir = "/run/user/1000/softverbs";
  EXPECT_EQ("softverbsd (pid 12, user 1000) serving /run/user/1000/softverbs", describe(h));
}

// A socket of this process bound to a free port is found, and named ours.
TEST(PortHolder, FindsThisProcess) {
  int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(0, ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a));
  socklen_t len = sizeof a;
  ASSERT_EQ(0, ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len));
  PortHolder h = find_udp_port_holder(ntohs(a.sin_port));
  EXPECT_TRUE(h.bound);
  EXPECT_EQ(::getpid(), h.pid);
  EXPECT_EQ(::getuid(), h.uid);
  ::close(fd);
}

}  // namespace
}  // namespace sv
