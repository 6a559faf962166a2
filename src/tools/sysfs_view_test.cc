// The sysfs view's files and their contents (tools/sysfs_view.h), as the
// kernel spells them, from made-up device facts.
#include "tools/sysfs_view.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>

#include <map>

namespace sv::view {
namespace {

DeviceFacts facts() {
  DeviceFacts f;
  f.node_guid = 0x0123456789ab5356ull;
  f.fw_ver = "softverbs 9.9";
  dev::IfAddr lo{"lo", 1, AF_INET, {}, true};
  inet_pton(AF_INET, "127.0.0.1", lo.addr.data());
  dev::IfAddr eth{"eth0", 2, AF_INET, {}, false};
  inet_pton(AF_INET, "10.1.2.3", eth.addr.data());
  dev::IfAddr eth6{"eth0", 2, AF_INET6, {}, false};
  inet_pton(AF_INET6, "fe80::1", eth6.addr.data());
  f.gids = dev::gid_table_from({lo, eth, eth6});
  f.dev_numbers = "1:3";
  return f;
}

std::map<std::string, Entry> by_path(const std::vector<Entry>& v) {
  std::map<std::string, Entry> m;
  for (const auto& e : v) EXPECT_TRUE(m.emplace(e.path, e).second) << "twice: " << e.path;
  return m;
}

std::string file(const std::map<std::string, Entry>& m, const std::string& p) {
  auto it = m.find(p);
  if (it == m.end()) return "<absent>";
  EXPECT_EQ(it->second.kind, Entry::kFile) << p;
  return it->second.text;
}

TEST(SysfsView, KernelSpellings) {
  EXPECT_EQ(guid_text(0x0123456789ab5356ull), "0123:4567:89ab:5356");
  uint8_t g[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, 1};
  EXPECT_EQ(gid_text(g), "0000:0000:0000:0000:0000:ffff:7f00:0001");
  EXPECT_EQ(rate_text(2, 32), "100 Gb/sec (4X EDR)");
  EXPECT_EQ(rate_text(1, 1), "2.5 Gb/sec (1X)");
  EXPECT_EQ(rate_text(2, 16), "56 Gb/sec (4X FDR)");
  EXPECT_EQ(rate_text(8, 64), "600 Gb/sec (12X HDR)");
  EXPECT_EQ(port_state_text(4), "4: ACTIVE");
  EXPECT_EQ(phys_state_text(5), "5: LinkUp");
  EXPECT_EQ(gid_type_text(dev::GidType::kRoceV2), "RoCE v2");
  EXPECT_EQ(gid_type_text(dev::GidType::kRoceV1), "IB/RoCE v1");
}

TEST(SysfsView, DeviceAttributesAsUmadAndLibibverbsReadThem) {
  auto m = by_path(sysfs_entries(facts()));
  EXPECT_EQ(file(m, "infiniband/sv0/node_type"), "1: CA\n");
  EXPECT_EQ(file(m, "infiniband/sv0/node_guid"), "0123:4567:89ab:5356\n");
  EXPECT_EQ(file(m, "infiniband/sv0/sys_image_guid"), "0123:4567:89ab:5356\n");
  EXPECT_EQ(file(m, "infiniband/sv0/fw_ver"), "softverbs 9.9\n");
  EXPECT_EQ(file(m, "infiniband/sv0/hw_rev"), "1\n");
  EXPECT_NE(file(m, "infiniband/sv0/hca_type"), "<absent>");
  EXPECT_NE(file(m, "infiniband/sv0/board_id"), "<absent>");
  EXPECT_EQ(file(m, "infiniband_verbs/abi_version"), "6\n");
  EXPECT_EQ(file(m, "infiniband/sv0/device/infiniband_verbs/uverbs0/ibdev"), "sv0\n");
  EXPECT_EQ(file(m, "infiniband/sv0/device/infiniband_verbs/uverbs0/abi_version"), "1\n");
  EXPECT_EQ(file(m, "infiniband/sv0/device/infiniband_verbs/uverbs0/dev"), "1:3\n");
  ASSERT_TRUE(m.count("infiniband_verbs/uverbs0"));
  EXPECT_EQ(m["infiniband_verbs/uverbs0"].kind, Entry::kSymlink);
  EXPECT_EQ(m["infiniband_verbs/uverbs0"].text, "/sys/class/infiniband/sv0/device/infiniband_verbs/uverbs0");
}

TEST(SysfsView, PortAttributesAndTheGidTable) {
  auto m = by_path(sysfs_entries(facts()));
  const std::string p = "infiniband/sv0/ports/1/";
  EXPECT_EQ(file(m, p + "state"), "4: ACTIVE\n");
  EXPECT_EQ(file(m, p + "phys_state"), "5: LinkUp\n");
  EXPECT_EQ(file(m, p + "rate"), "100 Gb/sec (4X EDR)\n");
  EXPECT_EQ(file(m, p + "lid"), "0x0\n");
  EXPECT_EQ(file(m, p + "sm_lid"), "0x0\n");
  EXPECT_EQ(file(m, p + "sm_sl"), "0\n");
  EXPECT_EQ(file(m, p + "lid_mask_count"), "0\n");
  EXPECT_EQ(file(m, p + "cap_mask"), "0x00010000\n");
  EXPECT_EQ(file(m, p + "link_layer"), "Ethernet\n");
  EXPECT_EQ(file(m, p + "pkeys/0"), "0xffff\n");
  EXPECT_EQ(file(m, p + "gids/0"), "0000:0000:0000:0000:0000:ffff:7f00:0001\n");
  EXPECT_EQ(file(m, p + "gids/1"), "0000:0000:0000:0000:0000:ffff:0a01:0203\n");
  EXPECT_EQ(file(m, p + "gids/2"), "fe80:0000:0000:0000:0000:0000:0000:0001\n");
  EXPECT_EQ(file(m, p + "gids/15"), "0000:0000:0000:0000:0000:0000:0000:0000\n");
  EXPECT_EQ(file(m, p + "gids/16"), "<absent>");
  EXPECT_EQ(file(m, p + "gid_attrs/types/0"), "RoCE v2\n");
  EXPECT_EQ(file(m, p + "gid_attrs/ndevs/0"), "lo\n");
  EXPECT_EQ(file(m, p + "gid_attrs/ndevs/1"), "eth0\n");
  EXPECT_EQ(file(m, p + "gid_attrs/ndevs/2"), "eth0\n");
  EXPECT_EQ(file(m, p + "gid_attrs/types/3"), "<absent>");  // empty entry
}

TEST(SysfsView, TheDevicesNetDevicesAndParentsFirst) {
  auto v = sysfs_entries(facts());
  auto m = by_path(v);
  ASSERT_TRUE(m.count("infiniband/sv0/device/net/lo"));
  EXPECT_EQ(m["infiniband/sv0/device/net/lo"].kind, Entry::kSymlink);
  EXPECT_EQ(m["infiniband/sv0/device/net/lo"].text, "/sys/class/net/lo");
  EXPECT_EQ(m["infiniband/sv0/device/net/eth0"].text, "/sys/class/net/eth0");
  std::map<std::string, bool> seen_dirs;
  for (const auto& e : v) {
    auto slash = e.path.rfind('/');
    if (slash != std::string::npos) {
      EXPECT_TRUE(seen_dirs.count(e.path.substr(0, slash))) << e.path;
    }
    if (e.kind == Entry::kDir) seen_dirs[e.path] = true;
  }
}

}  // namespace
}  // namespace sv::view
