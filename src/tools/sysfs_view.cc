#include "tools/sysfs_view.h"

#include <cstdio>
#include <set>

#include "common/counters.h"

namespace sv::view {

DeviceFacts this_device(const std::string& dev_numbers) {
  DeviceFacts f;
  f.node_guid = dev::node_guid();
  f.fw_ver = dev::fw_version();
  f.port = dev::port();
  f.gids = dev::gid_table();
  f.dev_numbers = dev_numbers;
  return f;
}

std::string guid_text(uint64_t g) {
  char b[24];
  std::snprintf(b, sizeof b, "%04x:%04x:%04x:%04x", unsigned(g >> 48) & 0xffff, unsigned(g >> 32) & 0xffff,
                unsigned(g >> 16) & 0xffff, unsigned(g) & 0xffff);
  return b;
}

// The kernel prints a GID with %pI6: eight groups of four hex digits, no
// shortening.
std::string gid_text(const uint8_t* r) {
  std::string s;
  char b[8];
  for (int i = 0; i < 16; i += 2) {
    std::snprintf(b, sizeof b, "%s%02x%02x", i ? ":" : "", r[i], r[i + 1]);
    s += b;
  }
  return s;
}

// rate_show(): width times the lane speed, in Gb/s with a ".5" where due.
std::string rate_text(uint8_t width, uint8_t speed) {
  int lanes = width == 1 ? 1 : width == 2 ? 4 : width == 4 ? 8 : width == 8 ? 12 : width == 16 ? 2 : 1;
  const char* name = "";
  int tenths = 25;  // SDR
  switch (speed) {
    case 2: name = " DDR", tenths = 50; break;
    case 4: name = " QDR", tenths = 100; break;
    case 8: name = " FDR10", tenths = 100; break;
    case 16: name = " FDR", tenths = 140; break;
    case 32: name = " EDR", tenths = 250; break;
    case 64: name = " HDR", tenths = 500; break;
    case 128: name = " NDR", tenths = 1000; break;
    default: break;
  }
  const int rate = tenths * lanes;
  char b[64];
  std::snprintf(b, sizeof b, "%d%s Gb/sec (%dX%s)", rate / 10, rate % 10 ? ".5" : "", lanes, name);
  return b;
}

std::string port_state_text(uint8_t s) {
  static const char* const names[] = {"NOP", "DOWN", "INIT", "ARMED", "ACTIVE", "ACTIVE_DEFER"};
  return std::to_string(s) + ": " + (s < 6 ? names[s] : "UNKNOWN");
}

std::string phys_state_text(uint8_t s) {
  static const char* const names[] = {"<unknown>", "Sleep",     "Polling",           "Disabled",
                                      "PortConfigurationTraining", "LinkUp", "LinkErrorRecovery", "Phy Test"};
  return std::to_string(s) + ": " + (s < 8 ? names[s] : "<unknown>");
}

std::string gid_type_text(dev::GidType t) { return t == dev::GidType::kRoceV2 ? "RoCE v2" : "IB/RoCE v1"; }

namespace {

std::string hex(uint32_t v, int width) {
  char b[16];
  std::snprintf(b, sizeof b, "0x%0*x", width, v);
  return b;
}

// ports/1: the attributes of ib_port_attrs (sysfs.c), the GID table with
// each entry's type and net device (gid_attrs/), the one P_Key.
void port_entries(const DeviceFacts& f, const std::string& p, std::vector<Entry>& out) {
  auto dir = [&](const std::string& d) { out.push_back({Entry::kDir, d, ""}); };
  auto file = [&](const std::string& n, const std::string& t) { out.push_back({Entry::kFile, n, t + "\n"}); };
  const dev::Port& pt = f.port;
  dir(p);
  file(p + "/state", port_state_text(pt.state));
  file(p + "/phys_state", phys_state_text(pt.phys_state));
  file(p + "/rate", rate_text(pt.active_width, pt.active_speed));
  file(p + "/lid", hex(pt.lid, 1));
  file(p + "/sm_lid", hex(pt.sm_lid, 1));
  file(p + "/sm_sl", std::to_string(pt.sm_sl));
  file(p + "/lid_mask_count", std::to_string(pt.lmc));
  file(p + "/cap_mask", hex(pt.cap_flags, 8));
  file(p + "/link_layer", pt.link_layer == 2 ? "Ethernet" : "InfiniBand");
  dir(p + "/gids");
  for (uint32_t i = 0; i < f.gid_tbl_len; ++i) {
    uint8_t zero[16] = {};
    file(p + "/gids/" + std::to_string(i), gid_text(i < f.gids.size() ? f.gids[i].raw.data() : zero));
  }
  // The kernel's type and ndev files of an empty entry fail to read
  // (EINVAL); here they are absent, which readers take alike.
  dir(p + "/gid_attrs");
  dir(p + "/gid_attrs/types");
  dir(p + "/gid_attrs/ndevs");
  for (size_t i = 0; i < f.gids.size() && i < f.gid_tbl_len; ++i) {
    file(p + "/gid_attrs/types/" + std::to_string(i), gid_type_text(f.gids[i].type));
    file(p + "/gid_attrs/ndevs/" + std::to_string(i), f.gids[i].ndev);
  }
  dir(p + "/pkeys");
  for (uint32_t i = 0; i < pt.pkey_tbl_len; ++i) file(p + "/pkeys/" + std::to_string(i), hex(i ? 0 : pt.pkey, 4));
  // hw_counters/: the port's counters by name, as rxe's (docs/LAB.md), 0
  // until `softverbs run` refreshes them (tools/hw_counters.h).
  dir(p + "/hw_counters");
  for (const char* n : counters::kNames) file(p + "/hw_counters/" + n, "0");
}

}  // namespace

std::vector<Entry> sysfs_entries(const DeviceFacts& f) {
  std::vector<Entry> out;
  auto dir = [&](const std::string& d) { out.push_back({Entry::kDir, d, ""}); };
  auto file = [&](const std::string& n, const std::string& t) { out.push_back({Entry::kFile, n, t + "\n"}); };
  auto link = [&](const std::string& n, const std::string& t) { out.push_back({Entry::kSymlink, n, t}); };
  const std::string d = "infiniband/" + f.name;
  dir("infiniband");
  dir(d);
  file(d + "/node_type", "1: CA");
  file(d + "/node_guid", guid_text(f.node_guid));
  file(d + "/sys_image_guid", guid_text(f.node_guid));
  file(d + "/node_desc", "softverbs " + f.name);
  file(d + "/fw_ver", f.fw_ver);
  // Driver attributes (as mlx4/mlx5 add them): hardware type and revision.
  file(d + "/hca_type", "softverbs");
  file(d + "/hw_rev", std::to_string(dev::kHwVer));
  file(d + "/board_id", "softverbs");
  // device/: the parent device. A kernel's is the PCI function, whose net/
  // holds its netdevs; softverbs' ports are every interface that holds a
  // GID. Its uverbs device hangs below it, as on a PCI device.
  dir(d + "/device");
  dir(d + "/device/net");
  std::set<std::string> ndevs;
  for (const auto& g : f.gids)
    if (!g.ndev.empty()) ndevs.insert(g.ndev);
  for (const auto& n : ndevs) link(d + "/device/net/" + n, "/sys/class/net/" + n);
  const std::string u = d + "/device/infiniband_verbs/" + f.uverbs;
  dir(d + "/device/infiniband_verbs");
  dir(u);
  file(u + "/ibdev", f.name);
  file(u + "/abi_version", std::to_string(dev::kUverbsDriverAbi));
  file(u + "/dev", f.dev_numbers);
  dir(d + "/ports");
  for (uint32_t p = 1; p <= dev::kPortCount; ++p) port_entries(f, d + "/ports/" + std::to_string(p), out);
  // The class: its ABI version and a link per uverbs device (into the
  // device's tree, as the kernel's class links are).
  dir("infiniband_verbs");
  file("infiniband_verbs/abi_version", std::to_string(dev::kUverbsClassAbi));
  link("infiniband_verbs/" + f.uverbs, "/sys/class/" + u);
  return out;
}

}  // namespace sv::view
