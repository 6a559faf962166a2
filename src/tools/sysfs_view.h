// sysfs_view.h: the files a kernel RDMA device has under /sys/class, for the
// softverbs device, as data: "which files with which contents". `softverbs
// run` writes them into its private view of /sys/class (src/tools/view_ns.h);
// nothing here touches the file system, so it is unit-tested as is
// (sysfs_view_test.cc).
//
// The layout mirrors the kernel's (drivers/infiniband/core/sysfs.c for the
// device and port attributes, drivers/infiniband/core/uverbs_main.c for the
// infiniband_verbs class) and the files its readers open: rdma-core's
// libibumad/umad.c (ibstat: node_type, fw_ver, hw_rev, hca_type, node_guid,
// sys_image_guid, ports/N/{lid_mask_count,sm_lid,sm_sl,lid,state,phys_state,
// rate,cap_mask,link_layer,gids/0,pkeys/*}), libibverbs/sysfs.c and init.c
// (infiniband_verbs/abi_version, uverbsN/{ibdev,abi_version,dev}), and
// rdma-core's tests/base.py (device/net/: the net device of the port).
// The values come from common/device_info.h, where the library's
// ibv_query_* answers come from.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/device_info.h"

namespace sv::view {

struct Entry {
  enum Kind { kDir, kFile, kSymlink } kind;
  std::string path;  // relative to /sys/class, e.g. "infiniband/sv0/node_type"
  std::string text;  // a file's contents, a symlink's target; empty for a directory
  bool operator==(const Entry&) const = default;
};

// What the view says about the device.
struct DeviceFacts {
  std::string name = dev::kName;
  std::string uverbs = dev::kUverbsName;
  uint64_t node_guid = 0;  // host order
  std::string fw_ver;
  dev::Port port;
  uint32_t gid_tbl_len = dev::kGidTableLen;
  std::vector<dev::Gid> gids;
  std::string dev_numbers = "1:3";  // MAJOR:MINOR of /dev/infiniband/<uverbs>
};

// The facts of this host's device (common/device_info.h); the node's device
// numbers are given by the caller (those of /dev/null, which it binds).
DeviceFacts this_device(const std::string& dev_numbers);

// The kernel's spellings (drivers/infiniband/core/sysfs.c).
std::string guid_text(uint64_t guid);             // "xxxx:xxxx:xxxx:xxxx"
std::string gid_text(const uint8_t* raw);         // 8 groups of 4 hex digits
std::string rate_text(uint8_t width, uint8_t speed);  // "100 Gb/sec (4X EDR)"
std::string port_state_text(uint8_t state);       // "4: ACTIVE"
std::string phys_state_text(uint8_t phys_state);  // "5: LinkUp"
std::string gid_type_text(dev::GidType t);        // "IB/RoCE v1", "RoCE v2"

// Every directory, file and symlink of the device, parents before children:
// infiniband/NAME/..., infiniband_verbs/abi_version, infiniband_verbs/UVERBS.
std::vector<Entry> sysfs_entries(const DeviceFacts& f);

}  // namespace sv::view
