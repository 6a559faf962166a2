// `softverbs capture`: makes this user's capture ring (common/capture_ring.h),
// which every process of the user then writes its packets into, and copies
// them into a pcapng file (the PCAP Next Generation format, RFC draft
// draft-ietf-opsawg-pcapng: a section header, one Ethernet interface with
// nanosecond timestamps, one enhanced packet block per packet, its comment
// saying which process and QP it came from) until COUNT packets, S seconds,
// or SIGINT/SIGTERM; then removes the ring and says on stderr how many
// packets it wrote and how many a slow reader lost.
#include "tools/capture.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "common/capture_ring.h"
#include "roce/headers.h"

namespace sv::tools {
namespace {

volatile sig_atomic_t g_stop = 0;
void on_signal(int) { g_stop = 1; }

constexpr const char* kCaptureUsage =
    "usage: softverbs capture [-w FILE] [--qp QPN] [--pid PID] [-c|--count COUNT] [--duration S] [--uid UID]\n"
    "  records this user's RDMA traffic on the softverbs device as pcapng (default: stdout),\n"
    "  shared-memory and between-user operations rendered as the RoCEv2 packets a NIC would send;\n"
    "  --qp: only packets to or from local QP QPN; --pid: only those process PID made;\n"
    "  -c: stop after COUNT packets; --duration: after S seconds; --uid (root): user UID's traffic\n";

struct Options {
  std::string out = "-";
  long long qpn = -1, pid = -1, count = -1, uid = -1;
  double duration = -1;
};

bool number(const char* s, long long& out) {
  char* end = nullptr;
  errno = 0;
  out = std::strtoll(s, &end, 0);
  return errno == 0 && end && *end == 0 && end != s && out >= 0;
}

// 0 on success, 2 on a usage error (said on stderr), -1 for --help.
int parse(int argc, char** argv, Options& o) {
  for (int i = 0; i < argc; i++) {
    std::string a = argv[i];
    if (a == "-h" || a == "--help") return -1;
    if (i + 1 >= argc) {
      std::fprintf(stderr, "softverbs capture: '%s' %s; try 'softverbs capture --help'\n", a.c_str(),
                   a[0] == '-' ? "needs a value" : "is not an option");
      return 2;
    }
    const char* v = argv[++i];
    bool ok = true;
    if (a == "-w") o.out = v;
    else if (a == "--qp") ok = number(v, o.qpn);
    else if (a == "--pid") ok = number(v, o.pid);
    else if (a == "-c" || a == "--count") ok = number(v, o.count);
    else if (a == "--uid") ok = number(v, o.uid);
    else if (a == "--duration") {
      char* end = nullptr;
      o.duration = std::strtod(v, &end);
      ok = end && *end == 0 && o.duration >= 0;
    } else {
      std::fprintf(stderr, "softverbs capture: unknown option '%s'; try 'softverbs capture --help'\n", a.c_str());
      return 2;
    }
    if (!ok) {
      std::fprintf(stderr, "softverbs capture: '%s' is not a valid value for %s\n", v, a.c_str());
      return 2;
    }
  }
  return 0;
}

// ---- pcapng (little-endian blocks, each padded to 4 bytes).
class Pcapng {
 public:
  explicit Pcapng(FILE* f) : f_(f) {}
  bool header() {
    std::vector<uint8_t> b;
    put32(b, 0x1a2b3c4d);  // byte-order magic
    put16(b, 1), put16(b, 0);
    put32(b, 0xffffffff), put32(b, 0xffffffff);  // section length unknown
    option(b, 4, "softverbs capture");           // shb_userappl
    end_options(b);
    if (!block(0x0a0d0d0a, b)) return false;
    b.clear();
    put16(b, 1), put16(b, 0);  // LINKTYPE_ETHERNET
    put32(b, 0);               // no snap length
    option(b, 2, "sv0");       // if_name
    const uint8_t tsresol = 9;  // nanoseconds
    option(b, 9, std::string(reinterpret_cast<const char*>(&tsresol), 1));
    end_options(b);
    return block(1, b);
  }
  bool packet(const capture::Slot& s) {
    std::vector<uint8_t> b;
    put32(b, 0);  // interface 0
    put32(b, uint32_t(s.time_ns >> 32)), put32(b, uint32_t(s.time_ns));
    const uint32_t len = 14 + s.len;
    put32(b, len), put32(b, 14 + s.orig_len);
    static const uint8_t kEth[12] = {0x02, 0, 0, 0, 0, 2, 0x02, 0, 0, 0, 0, 1};
    b.insert(b.end(), kEth, kEth + 12);
    const bool v6 = s.len && (s.data[0] >> 4) == 6;
    b.push_back(v6 ? 0x86 : 0x08), b.push_back(v6 ? 0xdd : 0x00);
    b.insert(b.end(), s.data, s.data + s.len);
    while (b.size() % 4) b.push_back(0);
    char c[64];
    std::snprintf(c, sizeof c, "pid %u qp 0x%x", s.pid, s.qpn);
    option(b, 1, c);  // opt_comment
    end_options(b);
    return block(6, b);
  }

 private:
  static void put16(std::vector<uint8_t>& b, uint16_t v) { b.push_back(uint8_t(v)), b.push_back(uint8_t(v >> 8)); }
  static void put32(std::vector<uint8_t>& b, uint32_t v) { put16(b, uint16_t(v)), put16(b, uint16_t(v >> 16)); }
  static void option(std::vector<uint8_t>& b, uint16_t code, const std::string& v) {
    put16(b, code), put16(b, uint16_t(v.size()));
    b.insert(b.end(), v.begin(), v.end());
    while (b.size() % 4) b.push_back(0);
  }
  static void end_options(std::vector<uint8_t>& b) { put32(b, 0); }
  bool block(uint32_t type, const std::vector<uint8_t>& body) {
    std::vector<uint8_t> b;
    const uint32_t total = uint32_t(12 + body.size());
    put32(b, type), put32(b, total);
    b.insert(b.end(), body.begin(), body.end());
    put32(b, total);
    return std::fwrite(b.data(), b.size(), 1, f_) == 1;
  }
  FILE* f_;
};

// Whether a packet passes --qp (the QP that made it, or the one it is
// addressed to: the BTH's destination QP) and --pid.
bool wanted(const Options& o, const capture::Slot& s) {
  if (o.pid >= 0 && s.pid != uint64_t(o.pid)) return false;
  if (o.qpn < 0 || s.qpn == uint64_t(o.qpn)) return true;
  const size_t ip = s.len && (s.data[0] >> 4) == 6 ? 40 : 20;
  if (s.len < ip + 8 + roce::kBthLen) return false;
  return roce::get_be24(s.data + ip + 8 + 5) == uint64_t(o.qpn);
}

// A ring at `path` whose reader is alive: another capture of this user's.
bool busy(const std::string& path, uint32_t* pid) {
  capture::Ring r;
  if (r.open_writer(path) != 0) return false;
  *pid = r.header()->reader_pid.load();
  return *pid && (::kill(pid_t(*pid), 0) == 0 || errno == EPERM);
}

const char* out_name(const Options& o) { return o.out == "-" ? "standard output" : o.out.c_str(); }

int copy_packets(const Options& o, capture::Ring& ring, Pcapng& out, FILE* f) {
  const uint64_t start = capture::now_ns();
  uint64_t written = 0, lost = 0, idle = 0;
  auto* s = static_cast<capture::Slot*>(std::malloc(sizeof(capture::Slot)));
  while (!g_stop && (o.count < 0 || written < uint64_t(o.count))) {
    if (o.duration >= 0 && double(capture::now_ns() - start) / 1e9 >= o.duration) break;
    if (!ring.read(*s, &lost)) {
      if (++idle % 64 == 0) std::fflush(f);
      ::usleep(1000);
      continue;
    }
    if (!wanted(o, *s)) continue;
    if (!out.packet(*s)) {
      std::fprintf(stderr, "softverbs capture: cannot write %s: %s\n", out_name(o), std::strerror(errno));
      std::free(s);
      return 1;
    }
    written++;
  }
  std::free(s);
  std::fprintf(stderr, "softverbs capture: %llu packets written, %llu lost (the reader fell behind)\n",
               (unsigned long long)written, (unsigned long long)lost);
  return 0;
}

}  // namespace

int capture_main(int argc, char** argv) {
  Options o;
  if (int e = parse(argc, argv, o)) {
    if (e < 0) std::fputs(kCaptureUsage, stdout);
    return e < 0 ? 0 : e;
  }
  uint32_t uid = ::getuid();
  if (o.uid >= 0 && uint32_t(o.uid) != uid) {
    if (uid != 0) {
      std::fprintf(stderr, "softverbs capture: only root may capture another user's traffic (--uid %lld)\n", o.uid);
      return 1;
    }
    uid = uint32_t(o.uid);
  }
  const std::string dir = capture::daemon_dir();
  const std::string path = capture::ring_path(uid, dir);
  if (path.empty()) {
    std::fprintf(stderr, "softverbs capture: no daemon directory %s: start a program under softverbs first\n",
                 dir.c_str());
    return 1;
  }
  uint32_t other = 0;
  if (busy(path, &other)) {
    std::fprintf(stderr, "softverbs capture: another capture (pid %u) is running for user %u\n", other, uid);
    return 1;
  }
  FILE* f = o.out == "-" ? stdout : std::fopen(o.out.c_str(), "wb");
  if (!f) {
    std::fprintf(stderr, "softverbs capture: cannot write %s: %s\n", o.out.c_str(), std::strerror(errno));
    return 1;
  }
  Pcapng out(f);
  capture::Ring ring;
  std::string why;
  if (!out.header() || ring.create(path, uid, &why) != 0) {
    std::fprintf(stderr, "softverbs capture: %s\n", why.empty() ? "cannot write the output" : why.c_str());
    return 1;
  }
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
  ::sigaction(SIGHUP, &sa, nullptr);
  ::signal(SIGPIPE, SIG_IGN);  // a reader gone (tshark -r - quit): a write error, said, and the ring removed
  std::fprintf(stderr, "softverbs capture: capturing user %u's traffic on sv0\n", uid);
  int rc = copy_packets(o, ring, out, f);
  ::unlink(path.c_str());
  if (std::fclose(f) != 0 && rc == 0) {
    std::fprintf(stderr, "softverbs capture: cannot write %s: %s\n", out_name(o), std::strerror(errno));
    rc = 1;
  }
  return rc;
}

}  // namespace sv::tools
