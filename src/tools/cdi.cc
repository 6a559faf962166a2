// softverbs cdi: see cdi.h.
#include "tools/cdi.h"

#include <dirent.h>
#include <fcntl.h>
#include <ftw.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

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

constexpr const char* kCdiVersion = "0.5.0";
constexpr const char* kDomainContainerDir = "/run/softverbs-domain";

constexpr const char* kUsage =
    "usage: softverbs cdi [--output FILE] [--kind VENDOR/CLASS] [--domain NAME]... [--users-domain NAME]...\n"
    "                     [--owner USER]\n"
    "  Prints a Container Device Interface spec for the softverbs device (or writes\n"
    "  it to FILE), e.g. sudo softverbs cdi --output /etc/cdi/softverbs.json, then:\n"
    "  podman run --device softverbs.io/rdma=sv0 IMAGE ibv_devinfo\n"
    "  -o, --output FILE  write the spec to FILE (mode 0644), making its missing parent\n"
    "            directories (0755). A spec already there of the same kind keeps its other\n"
    "            devices: this run's sv0 and domains replace theirs, the rest stay\n"
    "  --kind    the device kind (default softverbs.io/rdma)\n"
    "  --domain NAME  also a device NAME shared by the containers of one trust domain: those\n"
    "            that use it and share a pid namespace (a pod made with --share +pid)\n"
    "            share one daemon and the shared-memory data path (docs/CONTAINERS.md)\n"
    "  --owner USER  the user whose containers use the domains (rootless podman's; default:\n"
    "            you): their directories, and what is in them, become USER's\n"
    "  --users-domain NAME  also a device NAME for the containers of several users in one pod\n"
    "            (one pid namespace): their daemon is a system daemon that the pod's\n"
    "            holder runs as root; it carries the data between users with every key\n"
    "            checked, and gives each user's processes shared memory among themselves\n"
    "  -h, --help  this help\n";

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
  s += "        \"env\": [\"LD_LIBRARY_PATH=/opt/softverbs/lib\", \"SOFTVERBSD=/opt/softverbs/bin/softverbsd\", "
       "\"LD_PRELOAD=/opt/softverbs/lib/libsoftverbs_netlink.so\"";
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
  s += "  \"cdiVersion\": \"" + std::string(kCdiVersion) + "\",\n";
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

// Just enough of JSON (RFC 8259) to read a CDI spec's kind and its devices
// back: each device's text as written, and its name.
struct SpecReader {
  explicit SpecReader(const std::string& text) : s(text) {}
  const std::string& s;
  size_t i = 0;
  std::string why;

  void ws() {
    while (i < s.size() && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r')) ++i;
  }
  bool fail(const std::string& w) {
    if (why.empty()) why = w + " at byte " + std::to_string(i);
    return false;
  }
  bool expect(char c) {
    ws();
    if (i >= s.size() || s[i] != c) return fail(std::string("'") + c + "' expected");
    ++i;
    return true;
  }
  // A string (section 7); \u escapes above 0x7f are kept as written.
  bool string(std::string& out) {
    out.clear();
    if (!expect('"')) return false;
    while (i < s.size() && s[i] != '"') {
      char c = s[i++];
      if (c != '\\') {
        out += c;
        continue;
      }
      if (i >= s.size()) break;
      c = s[i++];
      const char* from = "\"\\/bfnrt";
      const char* to = "\"\\/\b\f\n\r\t";
      if (const char* at = std::strchr(from, c); at && c) {
        out += to[at - from];
      } else if (c == 'u' && i + 4 <= s.size()) {
        const unsigned long v = std::strtoul(s.substr(i, 4).c_str(), nullptr, 16);
        out += v < 0x80 ? std::string(1, char(v)) : "\\u" + s.substr(i, 4);
        i += 4;
      } else {
        return fail("bad escape");
      }
    }
    return expect('"');
  }
  // Any value, skipped; `depth` bounds the nesting.
  bool skip(int depth = 0) {
    ws();
    if (i >= s.size() || depth > 64) return fail("value expected");
    std::string ignored;
    if (s[i] == '"') return string(ignored);
    if (s[i] == '{' || s[i] == '[') {
      const char close = s[i] == '{' ? '}' : ']';
      ++i;
      ws();
      if (i < s.size() && s[i] == close) return ++i, true;
      for (;;) {
        if (close == '}' && !(string(ignored) && expect(':'))) return false;
        if (!skip(depth + 1)) return false;
        ws();
        if (i < s.size() && s[i] == ',') {
          ++i;
          continue;
        }
        return expect(close);
      }
    }
    const size_t from = i;
    while (i < s.size() && std::strchr("+-.0123456789eEtruefalsn", s[i])) ++i;
    return i > from || fail("value expected");
  }
  // A device: an object, its text and its "name".
  bool device(std::pair<std::string, std::string>& d) {
    ws();
    const size_t from = i;
    if (!expect('{')) return false;
    i = from;
    if (!skip()) return false;
    d.second = s.substr(from, i - from);
    SpecReader inner{d.second};
    inner.expect('{');
    std::string key;
    for (;;) {
      if (!inner.string(key) || !inner.expect(':')) return fail("a device without a name");
      if (key == "name") return inner.string(d.first) || fail("a device's name is not a string");
      inner.skip();
      inner.ws();
      if (inner.i >= inner.s.size() || inner.s[inner.i] != ',') return fail("a device without a name");
      ++inner.i;
    }
  }
  bool spec(std::string& kind, std::vector<std::pair<std::string, std::string>>& devices) {
    if (!expect('{')) return false;
    std::string key;
    for (;;) {
      if (!string(key) || !expect(':')) return false;
      if (key == "kind") {
        if (!string(kind)) return false;
      } else if (key == "devices") {
        if (!expect('[')) return false;
        ws();
        while (i < s.size() && s[i] != ']') {
          devices.emplace_back();
          if (!device(devices.back())) return false;
          ws();
          if (i < s.size() && s[i] == ',') ++i;
        }
        if (!expect(']')) return false;
      } else if (!skip()) {
        return false;
      }
      ws();
      if (i < s.size() && s[i] == ',') {
        ++i;
        continue;
      }
      if (!expect('}')) return false;
      ws();
      return i == s.size() || fail("text after the spec");
    }
  }
};

}  // namespace

bool merge_cdi_spec(const std::string& fresh, const std::string& old, std::string& merged,
                    std::vector<std::string>& kept, std::string& why) {
  kept.clear();
  if (old.find_first_not_of(" \t\r\n") == std::string::npos) {
    merged = fresh;
    return true;
  }
  std::string kind, old_kind;
  std::vector<std::pair<std::string, std::string>> devices, old_devices;
  SpecReader f{fresh}, o{old};
  if (!f.spec(kind, devices)) {
    why = "internal error: " + f.why;
    return false;
  }
  if (!o.spec(old_kind, old_devices)) {
    why = "not a CDI spec in JSON (" + o.why + ")";
    return false;
  }
  if (old_kind != kind) {
    why = "its devices are of kind " + old_kind + ", not " + kind;
    return false;
  }
  for (auto& d : old_devices) {
    if (std::any_of(devices.begin(), devices.end(), [&](const auto& n) { return n.first == d.first; })) continue;
    kept.push_back(d.first);
    devices.push_back(std::move(d));
  }
  merged = "{\n  \"cdiVersion\": \"" + std::string(kCdiVersion) + "\",\n  \"kind\": " + quote(kind) +
           ",\n  \"devices\": [\n";
  for (size_t k = 0; k < devices.size(); ++k)
    merged += "    " + devices[k].second + (k + 1 == devices.size() ? "\n" : ",\n");
  merged += "  ]\n}\n";
  return true;
}

namespace {

// Gives what `dir_fd` holds, and what its subdirectories hold, that belongs
// to `from` to `to`: the files a daemon of the domain's previous owner left
// (its socket, lock, log), which the new owner's daemon must take over.
// Never follows a symbolic link (fchownat AT_SYMLINK_NOFOLLOW, openat
// O_NOFOLLOW); counts what it changed in `n`. Returns 0 or an errno.
int chown_contents(int dir_fd, uid_t from, uid_t to, int depth, unsigned& n) {
  DIR* d = ::fdopendir(dir_fd);
  if (!d) {
    const int e = errno;
    ::close(dir_fd);
    return e;
  }
  int err = 0;
  while (dirent* e = ::readdir(d)) {
    if (std::strcmp(e->d_name, ".") == 0 || std::strcmp(e->d_name, "..") == 0) continue;
    struct stat st {};
    if (::fstatat(::dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
    if (S_ISDIR(st.st_mode) && depth < 8) {
      const int sub = ::openat(::dirfd(d), e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      if (sub >= 0 && !err) err = chown_contents(sub, from, to, depth + 1, n);
    }
    if (st.st_uid != from) continue;
    if (::fchownat(::dirfd(d), e->d_name, to, gid_t(-1), AT_SYMLINK_NOFOLLOW) == 0)
      ++n;
    else if (!err)
      err = errno;
  }
  ::closedir(d);
  return err;
}

// Prints what `softverbs cdi` did beside writing the spec: on standard
// output when the spec goes to a file, else on standard error.
bool g_spec_on_stdout = false;
void note(const std::string& what) {
  std::fprintf(g_spec_on_stdout ? stderr : stdout, "softverbs cdi: %s\n", what.c_str());
}

// A domain's directory of another owner's (the caller's: `softverbs cdi
// --owner USER` after the domain was the caller's own) becomes the owner's,
// with what is in it. Returns 0 or 1 (said why).
int give_domain_dir(const std::string& dir, uid_t owner) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  unsigned n = 0;
  const int e = fd < 0 ? errno : chown_contents(fd, ::getuid(), owner, 0, n);
  if (e != 0 || ::lchown(dir.c_str(), owner, gid_t(-1)) != 0) {
    std::fprintf(stderr, "softverbs cdi: cannot give %s to uid %u: %s\n", dir.c_str(), unsigned(owner),
                 std::strerror(e ? e : errno));
    return 1;
  }
  note(dir + (n ? " and the " + std::to_string(n) + " files in it now belong" : std::string(" now belongs")) +
       " to uid " + std::to_string(owner));
  return 0;
}

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
    if (::lstat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode) && st.st_uid != owner && st.st_uid == ::getuid()) {
      if (give_domain_dir(dir, owner) != 0) return 1;
      ::lstat(dir.c_str(), &st);
    }
    if (!S_ISDIR(st.st_mode) || st.st_uid != owner || (st.st_mode & 0777) != mode) {
      std::fprintf(stderr, "softverbs cdi: %s must be a directory of uid %u with mode %04o\n", dir.c_str(),
                   unsigned(owner), unsigned(mode));
      return 1;
    }
  }
  return 0;
}

// The missing parents of `file`, made (0755, whatever the umask: a runtime
// of any user reads the spec), each named in `made`.
int make_parents(const std::string& file, std::vector<std::string>& made) {
  const size_t last = file.rfind('/');
  if (last == std::string::npos || last == 0) return 0;
  for (size_t i = 1; i <= last; ++i) {
    if (i != last && file[i] != '/') continue;
    const std::string dir = file.substr(0, i);
    if (::mkdir(dir.c_str(), 0755) == 0) {
      ::chmod(dir.c_str(), 0755);
      made.push_back(dir);
    } else if (errno != EEXIST) {
      std::fprintf(stderr, "softverbs cdi: cannot make the directory %s for %s: %s\n", dir.c_str(), file.c_str(),
                   std::strerror(errno));
      return 1;
    }
  }
  return 0;
}

// Writes `spec` to `out`, merged with the spec already there (merge_cdi_spec),
// through a temporary file renamed over it. Returns 0 or 1 (said why).
int write_spec(const std::string& out, const std::string& spec, const std::string& kind) {
  std::vector<std::string> made, kept;
  if (make_parents(out, made) != 0) return 1;
  std::string old, merged, why;
  if (std::ifstream in(out); in) {
    std::ostringstream b;
    b << in.rdbuf();
    old = b.str();
  }
  if (!merge_cdi_spec(spec, old, merged, kept, why)) {
    std::fprintf(stderr, "softverbs cdi: %s is there and cannot be merged with: %s; remove it or give another --output\n",
                 out.c_str(), why.c_str());
    return 1;
  }
  const std::string tmp = out + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644);
  bool ok = fd >= 0 && ::fchmod(fd, 0644) == 0 && ::write(fd, merged.data(), merged.size()) == ssize_t(merged.size());
  int e = errno;
  if (fd >= 0 && ::close(fd) != 0 && ok) ok = false, e = errno;
  if (ok && ::rename(tmp.c_str(), out.c_str()) != 0) ok = false, e = errno;
  if (!ok) {
    std::fprintf(stderr, "softverbs cdi: cannot write %s: %s\n", out.c_str(), std::strerror(e));
    ::unlink(tmp.c_str());
    return 1;
  }
  for (const std::string& d : made) note("made the directory " + d + " (0755)");
  std::string names;
  for (const std::string& k : kept) names += (names.empty() ? "" : ", ") + k;
  if (!kept.empty()) note("kept the devices already in " + out + " that this run does not name: " + names);
  std::printf("softverbs: wrote %s; use it with: podman run --device %s=sv0 IMAGE CMD\n", out.c_str(), kind.c_str());
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
  g_spec_on_stdout = out.empty();
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
  return write_spec(out, spec, kind);
}

}  // namespace sv::tools
