// softverbs cdi: see cdi.h.
#include "tools/cdi.h"

#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
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

constexpr const char* kDomainContainerDir = "/run/softverbs-domain";

constexpr const char* kUsage =
    "usage: softverbs cdi [--output FILE] [--kind VENDOR/CLASS] [--domain NAME]... [--users-domain NAME]...\n"
    "                     [--owner USER]\n"
    "  Prints a Container Device Interface spec for the softverbs device (or writes\n"
    "  it to FILE), e.g. sudo softverbs cdi --output /etc/cdi/softverbs.json, then:\n"
    "  podman run --device softverbs.io/rdma=sv0 IMAGE ibv_devinfo\n"
    "  --kind    the device kind (default softverbs.io/rdma)\n"
    "  --domain  also a device NAME shared by the containers of one trust domain: those\n"
    "            that use it and share a pid namespace (a pod made with --share +pid)\n"
    "            share one daemon and the shared-memory data path (docs/CONTAINERS.md)\n"
    "  --owner   the user whose containers use the domains (rootless podman's; default: you)\n"
    "  --users-domain  also a device NAME for the containers of several users in one pod\n"
    "            (one pid namespace): their daemon is a system daemon that the pod's\n"
    "            holder runs as root; it carries the data between users with every key\n"
    "            checked, and gives each user's processes shared memory among themselves\n";

// One device's entry: sv0's edits, and for a trust domain's device its
// directory (see cdi.h) and the environment that points the library at it.
// A users' domain's device (`users`) points the library at a system daemon
// in the domain's directory instead (SOFTVERBS_SYSTEM, common/paths.h).
std::string device_entry(const CdiPaths& p, const std::string& name, const std::string& domain_dir, bool users,
                         bool last) {
  std::string s;
  s += "    {\n";
  s += "      \"name\": " + quote(name) + ",\n";
  s += "      \"containerEdits\": {\n";
  s += "        \"env\": [\"LD_LIBRARY_PATH=/opt/softverbs/lib\", \"SOFTVERBSD=/opt/softverbs/bin/softverbsd\"";
  if (users)
    s += ", \"SOFTVERBS_SYSTEM=1\", " + quote(std::string("SOFTVERBS_SYSTEM_DIR=") + kDomainContainerDir);
  else if (!domain_dir.empty())
    s += ", " + quote(std::string("SOFTVERBS_DIR=") + kDomainContainerDir);
  s += "],\n";
  s += "        \"mounts\": [\n";
  // /dev/infiniband/uverbs0 is the host's /dev/null, bound: a mount, not a
  // CDI device node, because a rootless runtime cannot make device nodes
  // and binds the host's node of the node's own path instead (podman 4.3
  // ignores hostPath), which does not exist on a host without RDMA.
  s += "          {\"hostPath\": \"/dev/null\", \"containerPath\": \"/dev/infiniband/uverbs0\", "
       "\"options\": [\"rw\", \"nosuid\", \"noexec\", \"bind\"]},\n";
  s += bind_mount(p.lib_dir, "/opt/softverbs/lib", false);
  s += bind_mount(p.daemon, "/opt/softverbs/bin/softverbsd", false);
  s += bind_mount(p.tool, "/opt/softverbs/bin/softverbs", domain_dir.empty());
  if (!domain_dir.empty()) {
    // Written by the daemon (its socket, lock and log): read-write, and
    // nothing in it runs.
    s += "          {\"hostPath\": " + quote(domain_dir) + ", \"containerPath\": " + quote(kDomainContainerDir) +
         ", \"options\": [\"rw\", \"nosuid\", \"nodev\", \"noexec\", \"rbind\"]}\n";
  }
  s += "        ],\n";
  // The runtime runs the hook in the container's namespaces before it
  // enters the root (OCI createContainer): the /sys/class view, with the
  // container's own GIDs (tools/oci_hook.h).
  s += "        \"hooks\": [\n";
  s += "          {\"hookName\": \"createContainer\", \"path\": " + quote(p.tool) +
       ", \"args\": [\"softverbs\", \"cdi-hook\"]}\n";
  s += "        ]\n";
  s += "      }\n";
  s += last ? "    }\n" : "    },\n";
  return s;
}

}  // namespace

bool valid_domain_name(const std::string& n) {
  if (n.empty() || n.size() > 63 || n == "sv0" || n.front() == '-') return false;
  for (char c : n)
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-')) return false;
  return true;
}

std::string cdi_spec(const CdiPaths& p, const std::string& kind, const std::vector<std::string>& domains,
                     const std::string& domains_dir, const std::vector<std::string>& users_domains) {
  std::string s;
  s += "{\n";
  s += "  \"cdiVersion\": \"0.5.0\",\n";
  s += "  \"kind\": " + quote(kind) + ",\n";
  s += "  \"devices\": [\n";
  s += device_entry(p, "sv0", "", false, domains.empty() && users_domains.empty());
  for (size_t i = 0; i < domains.size(); ++i)
    s += device_entry(p, domains[i], domains_dir + "/" + domains[i], false,
                      i + 1 == domains.size() && users_domains.empty());
  for (size_t i = 0; i < users_domains.size(); ++i)
    s += device_entry(p, users_domains[i], domains_dir + "/" + users_domains[i], true, i + 1 == users_domains.size());
  s += "  ]\n";
  s += "}\n";
  return s;
}

namespace {

// The host directory of each domain: made (0700, owned by the caller, as the
// library requires of a runtime directory) if missing, checked if present.
// A users' domain's (`mode` 0755): the system daemon's directory, which
// every user of the pod reaches and none but its owner (root) writes.
int make_domain_dirs(const std::string& base, const std::vector<std::string>& domains, uid_t owner,
                     mode_t mode = 0700) {
  if (domains.empty()) return 0;
  // Its parents too (/run/softverbs may not exist yet), each searchable by
  // all and writable by its owner alone.
  for (size_t i = 1; i <= base.size(); ++i) {
    if (i != base.size() && base[i] != '/') continue;
    const std::string dir = base.substr(0, i);
    if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
      std::fprintf(stderr, "softverbs cdi: cannot make %s: %s\n", dir.c_str(), std::strerror(errno));
      return 1;
    }
  }
  for (const std::string& d : domains) {
    const std::string dir = base + "/" + d;
    if (::mkdir(dir.c_str(), mode) != 0 && errno != EEXIST) {
      std::fprintf(stderr, "softverbs cdi: cannot make %s: %s\n", dir.c_str(), std::strerror(errno));
      return 1;
    }
    struct stat st {};
    if (::lstat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode) && st.st_uid != owner && st.st_uid == ::getuid() &&
        ::lchown(dir.c_str(), owner, gid_t(-1)) == 0)
      ::lstat(dir.c_str(), &st);
    if (!S_ISDIR(st.st_mode) || st.st_uid != owner || (st.st_mode & 0777) != mode) {
      std::fprintf(stderr, "softverbs cdi: %s must be a directory of uid %u with mode %04o\n", dir.c_str(),
                   unsigned(owner), unsigned(mode));
      return 1;
    }
  }
  return 0;
}

}  // namespace

int cdi_main(int argc, char** argv, const CdiPaths& paths) {
  std::string out, kind = "softverbs.io/rdma";
  std::vector<std::string> domains, users_domains;
  uid_t owner = ::getuid();
  for (int i = 0; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if ((a == "--domain" || a == "--users-domain") && i + 1 < argc) {
      std::string d = argv[++i];
      if (!valid_domain_name(d)) {
        std::fprintf(stderr, "softverbs cdi: %s %s: a name of a-z, 0-9 and '-' (at most 63, not sv0)\n", a.c_str(),
                     d.c_str());
        return 2;
      }
      if (std::find(domains.begin(), domains.end(), d) != domains.end() ||
          std::find(users_domains.begin(), users_domains.end(), d) != users_domains.end()) {
        std::fprintf(stderr, "softverbs cdi: %s %s: named twice\n", a.c_str(), d.c_str());
        return 2;
      }
      (a == "--domain" ? domains : users_domains).push_back(d);
      continue;
    }
    if (a == "--owner" && i + 1 < argc) {
      const std::string u = argv[++i];
      if (const passwd* pw = ::getpwnam(u.c_str())) {
        owner = pw->pw_uid;
      } else if (!u.empty() && u.find_first_not_of("0123456789") == std::string::npos && u.size() < 10) {
        owner = uid_t(std::stoul(u));
      } else {
        std::fprintf(stderr, "softverbs cdi: --owner %s: no such user\n", u.c_str());
        return 2;
      }
      continue;
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
  if (int e = make_domain_dirs(paths.domains_dir, domains, owner)) return e;
  // A system daemon's directory: root's (the holder runs the daemon as root).
  if (!users_domains.empty() && ::geteuid() != 0) {
    std::fprintf(stderr, "softverbs cdi: --users-domain needs root (its daemon is a system daemon)\n");
    return 1;
  }
  if (int e = make_domain_dirs(paths.domains_dir, users_domains, 0, 0755)) return e;
  const std::string spec = cdi_spec(paths, kind, domains, paths.domains_dir, users_domains);
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
