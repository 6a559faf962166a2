// oci_hook.h: `softverbs cdi-hook`, the container runtime's createContainer
// hook that the CDI spec (tools/cdi.h) declares. An OCI runtime (runc) runs
// it inside the new container's namespaces (mount and network), after it
// mounted the container's file systems and before it pivots into the root
// (OCI runtime spec, config.md "createContainer"), with the container's
// state as JSON on standard input (runtime.md "State": "bundle" is the
// directory of config.json, whose "root"."path" is the root file system,
// absolute or relative to the bundle). The hook adds the device's view of
// /sys/class (tools/view_ns.h) under that root, built from the container's
// own network namespace, so that sysfs readers inside (ibstat, rdma-core's
// tests) find the device as `softverbs run` gives it on a host.
//
// Reading the two JSON documents is pure (no file system) and unit-tested
// (oci_hook_test.cc): json_string() finds a string value by its path of
// object keys in a document it checks only as far as it walks.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace sv::tools {

// The string at keys[0].keys[1]... of the JSON document `doc` (RFC 8259),
// unescaped; nullopt if absent, not a string, or the document is malformed
// on the way there.
std::optional<std::string> json_string(const std::string& doc, const std::vector<std::string>& keys);

// The container's root file system from the OCI state on stdin (`state`)
// and a reader of files (for BUNDLE/config.json); nullopt and `why` if it
// cannot be found.
template <class ReadFile>
std::optional<std::string> container_root(const std::string& state, ReadFile read_file, std::string& why) {
  auto bundle = json_string(state, {"bundle"});
  if (!bundle || bundle->empty()) {
    why = "no \"bundle\" in the OCI state on standard input";
    return std::nullopt;
  }
  std::string config;
  if (!read_file(*bundle + "/config.json", config)) {
    why = "cannot read " + *bundle + "/config.json";
    return std::nullopt;
  }
  auto root = json_string(config, {"root", "path"});
  if (!root || root->empty()) {
    why = "no \"root\".\"path\" in " + *bundle + "/config.json";
    return std::nullopt;
  }
  if ((*root)[0] != '/') return *bundle + "/" + *root;
  return root;
}

// `softverbs cdi-hook`: returns the exit status. It never fails the
// container: where the view cannot be made it says why on stderr and exits
// 0, and the container runs without it (as `softverbs run` does).
int cdi_hook_main(int argc, char** argv);

}  // namespace sv::tools
