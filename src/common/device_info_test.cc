// The GID table's order and contents (common/device_info.h), from made-up
// interface lists.
#include "common/device_info.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>

#include <cstring>

namespace sv::dev {
namespace {

IfAddr v4(const char* name, uint32_t index, const char* text, bool loopback = false) {
  IfAddr a;
  a.name = name;
  a.ifindex = index;
  a.family = AF_INET;
  a.loopback = loopback;
  inet_pton(AF_INET, text, a.addr.data());
  return a;
}

IfAddr v6(const char* name, uint32_t index, const char* text, bool loopback = false) {
  IfAddr a = v4(name, index, "0.0.0.0", loopback);
  a.family = AF_INET6;
  inet_pton(AF_INET6, text, a.addr.data());
  return a;
}

std::string text(const Gid& g) {
  char buf[INET6_ADDRSTRLEN] = {};
  inet_ntop(AF_INET6, g.raw.data(), buf, sizeof buf);
  return buf;
}

TEST(GidTable, LoopbackFirstThenIPv4ThenIPv6WithTheirNetDevices) {
  auto t = gid_table_from({v6("eth0", 2, "fe80::1"), v4("lo", 1, "127.0.0.1", true), v6("lo", 1, "::1", true),
                           v4("eth0", 2, "10.0.0.5"), v4("eth1", 3, "192.168.1.2")});
  ASSERT_EQ(t.size(), 4u);
  EXPECT_EQ(text(t[0]), "::ffff:127.0.0.1");
  EXPECT_EQ(t[0].ndev, "lo");
  EXPECT_EQ(t[0].ifindex, 1u);
  EXPECT_EQ(text(t[1]), "::ffff:10.0.0.5");
  EXPECT_EQ(t[1].ndev, "eth0");
  EXPECT_EQ(text(t[2]), "::ffff:192.168.1.2");
  EXPECT_EQ(t[2].ndev, "eth1");
  EXPECT_EQ(t[2].ifindex, 3u);
  EXPECT_EQ(text(t[3]), "fe80::1");
  EXPECT_EQ(t[3].ndev, "eth0");
  for (const auto& g : t) EXPECT_EQ(g.type, GidType::kRoceV2);
}

TEST(GidTable, AlwaysHasTheLoopbackGidAndAtMostTheTableLength) {
  auto empty = gid_table_from({});
  ASSERT_EQ(empty.size(), 1u);
  EXPECT_EQ(text(empty[0]), "::ffff:127.0.0.1");
  EXPECT_EQ(empty[0].ndev, "lo");
  std::vector<IfAddr> many;
  for (int i = 0; i < 40; ++i) many.push_back(v4("eth0", 2, ("10.0.1." + std::to_string(i + 1)).c_str()));
  EXPECT_EQ(gid_table_from(many).size(), kGidTableLen);
}

TEST(GidTable, TheHostsTableStartsWithLoopback) {
  const auto& t = gid_table();
  ASSERT_FALSE(t.empty());
  EXPECT_EQ(text(t[0]), "::ffff:127.0.0.1");
  EXPECT_FALSE(t[0].ndev.empty());
}

}  // namespace
}  // namespace sv::dev
