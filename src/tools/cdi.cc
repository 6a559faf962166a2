// softverbs cdi: see cdi.h.
#include "tools/cdi.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace sv::tools {
namespace {

// A JSON string literal of `s` (RFC 8259, section 7).
std::string quote(const std::string& s) {
  std::string o = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      o += '\\';
      o += char(c);
    } else if (c < 0x20) {
      char b[8];
      std::snprintf(b, sizeof b, "\\u%04x", c);
      o += b;
    } else {
      o += char(c);
    }
  }
  return o + "\"";
}

std::string bind_mount(const std::string& host, const std::string& container, bool last) {
  return "          {\"hostPath\": " + quote(host) + ", \"containerPath\": " + quote(container) +
         ", \"options\": [\"ro\", \"nosuid\", \"nodev\", \"rbind\"]}" + (last ? "\n" : ",\n");
}

constexpr const char* kUsage =
    "usage: softverbs cdi [--output FILE] [--kind VENDOR/CLASS]\n"
    "  Prints a Container Device Interface spec for the softverbs device (or writes\n"
    "  it to FILE), e.g. sudo softverbs cdi --output /etc/cdi/softverbs.json, then:\n"
    "  podman run --device softverbs.io/rdma=sv0 IMAGE ibv_devinfo\n"
    "  --kind   the device kind (default softverbs.io/rdma)\n";

}  // namespace

std::string cdi_spec(const CdiPaths& p, const std::string& kind) {
  std::string s;
  s += "{\n";
  s += "  \"cdiVersion\": \"0.5.0\",\n";
  s += "  \"kind\": " + quote(kind) + ",\n";
  s += "  \"devices\": [\n";
  s += "    {\n";
  s += "      \"name\": \"sv0\",\n";
  s += "      \"containerEdits\": {\n";
  s += "        \"env\": [\"LD_LIBRARY_PATH=/opt/softverbs/lib\", \"SOFTVERBSD=/opt/softverbs/bin/softverbsd\"],\n";
  s += "        \"deviceNodes\": [\n";
  s += "          {\"path\": \"/dev/infiniband/uverbs0\", \"hostPath\": \"/dev/null\", \"type\": \"c\", "
       "\"major\": 1, \"minor\": 3, \"fileMode\": 438, \"permissions\": \"rw\"}\n";
  s += "        ],\n";
  s += "        \"mounts\": [\n";
  s += bind_mount(p.lib_dir, "/opt/softverbs/lib", false);
  s += bind_mount(p.daemon, "/opt/softverbs/bin/softverbsd", false);
  s += bind_mount(p.tool, "/opt/softverbs/bin/softverbs", true);
  s += "        ],\n";
  // The runtime runs the hook in the container's namespaces before it
  // enters the root (OCI createContainer): the /sys/class view, with the
  // container's own GIDs (tools/oci_hook.h).
  s += "        \"hooks\": [\n";
  s += "          {\"hookName\": \"createContainer\", \"path\": " + quote(p.tool) +
       ", \"args\": [\"softverbs\", \"cdi-hook\"]}\n";
  s += "        ]\n";
  s += "      }\n";
  s += "    }\n";
  s += "  ]\n";
  s += "}\n";
  return s;
}

int cdi_main(int argc, char** argv, const CdiPaths& paths) {
  std::string out, kind = "softverbs.io/rdma";
  for (int i = 0; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if ((a == "--output" || a == "-o" || a == "--kind") && i + 1 < argc) {
      (a == "--kind" ? kind : out) = argv[++i];
      continue;
    }
    std::fprintf(stderr, "softverbs cdi: unexpected argument '%s'; try 'softverbs cdi --help'\n", a.c_str());
    return 2;
  }
  if (kind.find('/') == std::string::npos) {
    std::fprintf(stderr, "softverbs cdi: --kind is VENDOR/CLASS, e.g. softverbs.io/rdma\n");
    return 2;
  }
  for (const std::string* f : {&paths.daemon, &paths.tool}) {
    if (::access(f->c_str(), X_OK) != 0) {
      std::fprintf(stderr, "softverbs cdi: %s: %s; set SOFTVERBSD or install softverbs\n", f->c_str(),
                   std::strerror(errno));
      return 1;
    }
  }
  if (::access((paths.lib_dir + "/libibverbs.so.1").c_str(), R_OK) != 0) {
    std::fprintf(stderr, "softverbs cdi: no libibverbs.so.1 in %s; set SOFTVERBS_LIB to its directory\n",
                 paths.lib_dir.c_str());
    return 1;
  }
  const std::string spec = cdi_spec(paths, kind);
  if (out.empty()) {
    std::fputs(spec.c_str(), stdout);
    return 0;
  }
  FILE* f = std::fopen(out.c_str(), "w");
  bool ok = f && std::fputs(spec.c_str(), f) >= 0;
  if (f && std::fclose(f) != 0) ok = false;
  if (!ok) {
    std::fprintf(stderr, "softverbs cdi: cannot write %s: %s\n", out.c_str(), std::strerror(errno));
    return 1;
  }
  std::printf("softverbs: wrote %s; use it with: podman run --device %s=sv0 IMAGE CMD\n", out.c_str(), kind.c_str());
  return 0;
}

}  // namespace sv::tools
