// device_info.h: what the softverbs device is, in one place: its names, its
// identity (GUID, firmware, vendor), its port and its GID table. The library
// answers ibv_query_device / ibv_query_port / ibv_query_gid from here, and
// `softverbs run` writes the same values into its sysfs view
// (src/tools/sysfs_view.h), so that the two never disagree.
//
// No libibverbs types: the tool links this too. The numbers are the ABI's
// (enum ibv_port_state, ibv_mtu, ... in <infiniband/verbs.h>).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace sv::dev {

constexpr const char* kName = "sv0";            // ibv_device.name, /sys/class/infiniband/sv0
constexpr const char* kUverbsName = "uverbs0";  // ibv_device.dev_name, /dev/infiniband/uverbs0
constexpr uint32_t kVendorId = 0x5356;          // 'SV': neither mlx5 nor EFA, see docs/ABI.md
constexpr uint32_t kVendorPartId = 1;
constexpr uint32_t kHwVer = 1;
constexpr uint32_t kGidTableLen = 16;
constexpr uint32_t kPortCount = 1;
// The uverbs ABI versions a kernel reports: the class's
// (/sys/class/infiniband_verbs/abi_version, IB_USER_VERBS_ABI_VERSION) and the
// driver's (uverbsN/abi_version).
constexpr uint32_t kUverbsClassAbi = 6;
constexpr uint32_t kUverbsDriverAbi = 1;

// "softverbs VERSION": ibv_device_attr.fw_ver.
std::string fw_version();
// The node GUID in host order (from the host name; the low 16 bits 'SV').
uint64_t node_guid();

// Port 1, as ibv_query_port reports it (a RoCE port: link layer Ethernet).
struct Port {
  uint8_t state = 4;         // IBV_PORT_ACTIVE
  uint8_t phys_state = 5;    // LinkUp
  uint8_t max_mtu = 5;       // IBV_MTU_4096
  uint8_t active_mtu = 5;    // IBV_MTU_4096
  uint8_t active_width = 2;  // 4x
  uint8_t active_speed = 32; // EDR (25 Gb/s a lane)
  uint8_t link_layer = 2;    // IBV_LINK_LAYER_ETHERNET
  // VLCap (IBTA 14.2.5.6, PortInfo): 1 = VL0 only, the one data VL that
  // RoCE has (Linux rxe reports 1 too). ibv_devinfo calls 0 invalid.
  uint8_t max_vl_num = 1;
  uint32_t cap_flags = 1u << 16;  // IBV_PORT_CM_SUP
  uint32_t max_msg_sz = 1u << 31;
  uint16_t lid = 0;
  uint16_t sm_lid = 0;
  uint8_t lmc = 0;
  uint8_t sm_sl = 0;
  uint16_t pkey = 0xffff;  // the one P_Key, index 0
  uint32_t pkey_tbl_len = 1;
};
const Port& port();

// One GID of port 1: the address, the net device that holds it, its type.
enum class GidType : uint8_t { kRoceV1 = 0, kRoceV2 = 1 };  // ibv_query_gid_type's numbers
struct Gid {
  std::array<uint8_t, 16> raw{};
  uint32_t ifindex = 0;
  std::string ndev;  // the net device's name ("lo", "eth0")
  GidType type = GidType::kRoceV2;
};

// One address of an interface, as getifaddrs(3) lists it.
struct IfAddr {
  std::string name;
  uint32_t ifindex = 0;
  int family = 0;  // AF_INET or AF_INET6
  std::array<uint8_t, 16> addr{};  // 4 or 16 bytes, network order
  bool loopback = false;
};

// The GID table of port 1, as a RoCE v2 device presents it (IBTA annex
// A17): index 0 is ::ffff:127.0.0.1 (loopback, always present: the index to
// use on one host), then each IPv4 address of a non-loopback interface as
// ::ffff:a.b.c.d, then each such IPv6 address; at most kGidTableLen. Pure.
std::vector<Gid> gid_table_from(const std::vector<IfAddr>& addrs);
// This host's addresses (getifaddrs); empty if it fails.
std::vector<IfAddr> host_addresses();
// gid_table_from(host_addresses()), computed once per process.
const std::vector<Gid>& gid_table();

}  // namespace sv::dev
