// softverbs cdi: a Container Device Interface spec (CDI, the runtimes' own
// way to inject a device: github.com/cncf-tags/container-device-interface,
// SPEC.md) that gives a container the softverbs device. Podman reads it from
// /etc/cdi or /var/run/cdi and applies it for `--device softverbs.io/rdma=sv0`.
//
// What the spec puts into the container (docs/CONTAINERS.md):
//   - softverbs' libibverbs.so.1 and librdmacm.so.1, read-only, at
//     /opt/softverbs/lib, first on LD_LIBRARY_PATH: the image's own
//     programs (rdma-core's, perftest...) run on softverbs unmodified. They
//     need only the C library (SOFTVERBS_STATIC_CXX_RUNTIME).
//   - softverbsd and softverbs at /opt/softverbs/bin; SOFTVERBSD names the
//     daemon, which the library starts inside the container on first use:
//     one daemon, so one device, per container, with that container's
//     network namespace (its GIDs, its UDP 4791) and nothing of another's
//     objects, names or keys. It ends with the container's last process.
//   - /dev/infiniband/uverbs0, where tools look for a verbs device (a
//     character device with /dev/null's numbers: softverbs has no kernel
//     part, nothing opens it for verbs).
//   - a createContainer hook, `softverbs cdi-hook` (tools/oci_hook.h): the
//     device's /sys/class view (infiniband/sv0, infiniband_verbs) with the
//     container's own GIDs, where ibstat and rdma-core's tests read it.
#pragma once

#include <string>

namespace sv::tools {

struct CdiPaths {
  std::string lib_dir;  // holds softverbs' libibverbs.so.1 and librdmacm.so.1
  std::string daemon;   // softverbsd
  std::string tool;     // softverbs
};

// The spec, as JSON (CDI's YAML is a superset), for `kind` (vendor/class).
std::string cdi_spec(const CdiPaths& paths, const std::string& kind);

// `softverbs cdi [--output FILE] [--kind VENDOR/CLASS]`, with the host's
// paths already found; returns the exit status.
int cdi_main(int argc, char** argv, const CdiPaths& paths);

}  // namespace sv::tools
