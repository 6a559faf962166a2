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
//   - /dev/infiniband/uverbs0, where tools look for a verbs device (the
//     host's /dev/null bound there, so also rootless: softverbs has no kernel
//     part, nothing opens it for verbs).
//   - a createContainer hook, `softverbs cdi-hook` (tools/oci_hook.h): the
//     device's /sys/class view (infiniband/sv0, infiniband_verbs) with the
//     container's own GIDs, where ibstat and rdma-core's tests read it.
//
// A trust domain's device (`--domain NAME`: containers whose
// processes trust each other as one user's processes do) adds a host
// directory, DOMAINS_DIR/NAME (0700, the caller's or --owner's), mounted read-write at
// /run/softverbs-domain with SOFTVERBS_DIR pointing there: the first
// process of the domain starts the daemon there and the others find it.
// The daemon serves only its own pid namespace (docs/SECURITY.md, row 12),
// so the domain is the containers that also share one: a pod made with
// `podman pod create --share +pid` (Kubernetes: shareProcessNamespace).
// Between them, the shared-memory data path; a container that mounts the
// directory from another pid namespace is refused.
//
// A users' domain's device (`--users-domain NAME`): containers of several
// users in one pod (one pid namespace), which trust each other no more than
// users of one host do. Its directory (0755, root's) is a system daemon's,
// which the pod's holder container runs as root (`softverbsd --system
// --dir /run/softverbs-domain`); SOFTVERBS_SYSTEM points the library there.
// Between users the daemon carries every request with its keys checked (the
// mediated path, docs/SECURITY.md); one user's processes share memory.
#pragma once

#include <string>
#include <vector>

namespace sv::tools {

struct CdiPaths {
  std::string lib_dir;  // holds softverbs' libibverbs.so.1 and librdmacm.so.1
  std::string daemon;   // softverbsd
  std::string tool;     // softverbs
  std::string domains_dir = "/run/softverbs/domains";  // where --domain NAME's directories are made
};

// The spec, as JSON (CDI's YAML is a superset), for `kind` (vendor/class):
// device sv0, then one device per trust domain, each with its directory
// under `domains_dir`.
std::string cdi_spec(const CdiPaths& paths, const std::string& kind, const std::vector<std::string>& domains = {},
                     const std::string& domains_dir = "/run/softverbs/domains",
                     const std::vector<std::string>& users_domains = {});

// `fresh` (a spec cdi_spec wrote) merged into `old`, the spec already in
// the output file: fresh's devices, then old's devices of other names, as
// written (a second `softverbs cdi --domain B` keeps domain A's device).
// Fails, saying why, when `old` is not a CDI spec in JSON or is of another
// kind. An empty `old` gives `fresh`. `kept`: the names taken from `old`.
bool merge_cdi_spec(const std::string& fresh, const std::string& old, std::string& merged,
                    std::vector<std::string>& kept, std::string& why);

// A domain's name: 1-63 of a-z, 0-9 and '-', not starting with '-', not sv0
// (it names a directory and a CDI device).
bool valid_domain_name(const std::string& name);

// `softverbs cdi [--output FILE] [--kind VENDOR/CLASS] [--domain NAME]...
// [--users-domain NAME]... [--owner USER]`, with the host's paths already
// found; returns the exit status. --output makes the file's missing parent
// directories (0755) and merges with a spec already there
// (merge_cdi_spec); --owner gives a domain's directory that was the
// caller's, and the files in it, to USER.
int cdi_main(int argc, char** argv, const CdiPaths& paths);

}  // namespace sv::tools
