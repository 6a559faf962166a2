// softverbs cdi-hook: see oci_hook.h.
#include "tools/oci_hook.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>

#include "common/sys.h"
#include "tools/view_ns.h"

namespace sv::tools {
namespace {

constexpr int kMaxDepth = 64;  // nesting a walk goes into before it gives up

// A walk over one JSON text (RFC 8259): each call consumes one token or
// value at `i` and says whether it was well-formed.
class Walk {
 public:
  explicit Walk(const std::string& s) : s_(s) {}

  // The value at keys[k..] of the object at the current position.
  bool find(const std::vector<std::string>& keys, size_t k, std::string& out, int depth) {
    if (depth > kMaxDepth || !take('{')) return false;
    if (take('}')) return false;
    for (;;) {
      std::string key;
      if (!string(&key) || !take(':')) return false;
      if (key == keys[k]) {
        if (k + 1 == keys.size()) return string(&out);  // the first of duplicate keys counts
        return find(keys, k + 1, out, depth + 1);
      }
      if (!skip(depth + 1)) return false;
      if (take('}')) return false;
      if (!take(',')) return false;
    }
  }

 private:
  void ws() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r')) ++i_;
  }
  bool take(char c) {
    ws();
    if (i_ < s_.size() && s_[i_] == c) {
      ++i_;
      return true;
    }
    return false;
  }
  bool hex4(uint32_t& v) {
    if (i_ + 4 > s_.size()) return false;
    v = 0;
    for (int n = 0; n < 4; ++n) {
      char c = s_[i_++];
      v <<= 4;
      if (c >= '0' && c <= '9') v |= uint32_t(c - '0');
      else if (c >= 'a' && c <= 'f') v |= uint32_t(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F') v |= uint32_t(c - 'A' + 10);
      else return false;
    }
    return true;
  }
  static void utf8(uint32_t cp, std::string& o) {
    if (cp < 0x80) {
      o += char(cp);
    } else if (cp < 0x800) {
      o += char(0xc0 | (cp >> 6));
      o += char(0x80 | (cp & 0x3f));
    } else if (cp < 0x10000) {
      o += char(0xe0 | (cp >> 12));
      o += char(0x80 | ((cp >> 6) & 0x3f));
      o += char(0x80 | (cp & 0x3f));
    } else {
      o += char(0xf0 | (cp >> 18));
      o += char(0x80 | ((cp >> 12) & 0x3f));
      o += char(0x80 | ((cp >> 6) & 0x3f));
      o += char(0x80 | (cp & 0x3f));
    }
  }
  // A string (RFC 8259, section 7), unescaped into *out (if not null).
  bool string(std::string* out) {
    if (!take('"')) return false;
    std::string o;
    while (i_ < s_.size()) {
      char c = s_[i_++];
      if (c == '"') {
        if (out) *out = std::move(o);
        return true;
      }
      if (static_cast<unsigned char>(c) < 0x20) return false;
      if (c != '\\') {
        o += c;
        continue;
      }
      if (i_ >= s_.size()) return false;
      char e = s_[i_++];
      switch (e) {
        case '"': case '\\': case '/': o += e; break;
        case 'b': o += '\b'; break;
        case 'f': o += '\f'; break;
        case 'n': o += '\n'; break;
        case 'r': o += '\r'; break;
        case 't': o += '\t'; break;
        case 'u': {
          uint32_t cp = 0;
          if (!hex4(cp)) return false;
          if (cp >= 0xd800 && cp < 0xdc00) {  // a surrogate pair
            uint32_t lo = 0;
            if (i_ + 2 > s_.size() || s_[i_] != '\\' || s_[i_ + 1] != 'u') return false;
            i_ += 2;
            if (!hex4(lo) || lo < 0xdc00 || lo >= 0xe000) return false;
            cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
          } else if (cp >= 0xdc00 && cp < 0xe000) {
            return false;
          }
          utf8(cp, o);
          break;
        }
        default: return false;
      }
    }
    return false;
  }
  // Any value, not kept.
  bool skip(int depth) {
    if (depth > kMaxDepth) return false;
    ws();
    if (i_ >= s_.size()) return false;
    char c = s_[i_];
    if (c == '"') return string(nullptr);
    if (c == '{' || c == '[') {
      const char close = c == '{' ? '}' : ']';
      ++i_;
      if (take(close)) return true;
      for (;;) {
        if (c == '{' && (!string(nullptr) || !take(':'))) return false;
        if (!skip(depth + 1)) return false;
        if (take(close)) return true;
        if (!take(',')) return false;
      }
    }
    // A number, true, false or null.
    size_t start = i_;
    while (i_ < s_.size() && std::strchr("+-.0123456789eEtruefalsn", s_[i_])) ++i_;
    return i_ > start;
  }

  const std::string& s_;
  size_t i_ = 0;
};

bool read_whole(const std::string& path, std::string& out) {
  Fd f(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!f.valid()) return false;
  out.clear();
  char buf[65536];
  for (;;) {
    ssize_t n = ::read(f.get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return false;
    if (n == 0) return true;
    if (out.size() + size_t(n) > (64u << 20)) return false;  // no config is that large
    out.append(buf, size_t(n));
  }
}

}  // namespace

std::optional<std::string> json_string(const std::string& doc, const std::vector<std::string>& keys) {
  if (keys.empty()) return std::nullopt;
  std::string out;
  Walk w(doc);
  if (!w.find(keys, 0, out, 0)) return std::nullopt;
  return out;
}

int cdi_hook_main(int argc, char** argv) {
  for (int i = 0; i < argc; ++i) {
    if (!std::strcmp(argv[i], "-h") || !std::strcmp(argv[i], "--help")) {
      std::fputs("usage: softverbs cdi-hook < OCI-STATE\n"
                 "  The createContainer hook of softverbs' CDI spec (softverbs cdi): run by the\n"
                 "  container runtime, it adds the device's /sys/class view to the container.\n",
                 stdout);
      return 0;
    }
  }
  std::string state, why;
  if (!read_whole("/dev/stdin", state)) {
    std::fprintf(stderr, "softverbs cdi-hook: cannot read the OCI state on standard input\n");
    return 0;
  }
  auto root = container_root(state, read_whole, why);
  if (!root) {
    std::fprintf(stderr, "softverbs cdi-hook: %s; the container has no /sys/class/infiniband\n", why.c_str());
    return 0;
  }
  if (int e = view::add_sysfs_view(*root, why)) {
    std::fprintf(stderr, "softverbs cdi-hook: %s (%s); the container has no /sys/class/infiniband\n", why.c_str(),
                 std::strerror(e));
  }
  return 0;
}

}  // namespace sv::tools
