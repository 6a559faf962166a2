#include "common/port_holder.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>

namespace sv {
namespace {

std::string read_small(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return {};
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof buf)) > 0 && out.size() < (1u << 20)) out.append(buf, size_t(n));
  ::close(fd);
  return out;
}

// NUL-separated fields (/proc/PID/cmdline, /proc/PID/environ).
std::vector<std::string> split_nul(const std::string& s) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < s.size()) {
    size_t end = s.find('\0', pos);
    if (end == std::string::npos) end = s.size();
    out.push_back(s.substr(pos, end - pos));
    pos = end + 1;
  }
  return out;
}

// The process with a descriptor on socket `inode`, or 0.
pid_t process_of_socket(uint64_t inode) {
  const std::string want = "socket:[" + std::to_string(inode) + "]";
  DIR* proc = ::opendir("/proc");
  if (!proc) return 0;
  pid_t found = 0;
  while (dirent* p = ::readdir(proc)) {
    char* end = nullptr;
    long pid = std::strtol(p->d_name, &end, 10);
    if (pid <= 0 || *end) continue;
    const std::string fd_dir = std::string("/proc/") + p->d_name + "/fd";
    DIR* fds = ::opendir(fd_dir.c_str());
    if (!fds) continue;  // another user's process
    while (dirent* f = ::readdir(fds)) {
      char link[64];
      ssize_t n = ::readlinkat(::dirfd(fds), f->d_name, link, sizeof link - 1);
      if (n > 0 && std::string(link, size_t(n)) == want) {
        found = pid_t(pid);
        break;
      }
    }
    ::closedir(fds);
    if (found) break;
  }
  ::closedir(proc);
  return found;
}

// A softverbsd's directory: its --dir, else SOFTVERBS_DIR of its environment.
std::string softverbsd_dir(pid_t pid) {
  const std::string base = "/proc/" + std::to_string(pid);
  auto args = split_nul(read_small(base + "/cmdline"));
  for (size_t i = 0; i + 1 < args.size(); ++i) {
    if (args[i] == "--dir") return args[i + 1];
  }
  for (const auto& kv : split_nul(read_small(base + "/environ"))) {
    if (kv.rfind("SOFTVERBS_DIR=", 0) == 0 && kv.size() > 14) return kv.substr(14);
  }
  return {};
}

}  // namespace

std::vector<UdpSocket> parse_proc_net_udp(const std::string& text, uint16_t port) {
  std::vector<UdpSocket> out;
  std::istringstream in(text);
  std::string line;
  std::getline(in, line);  // the header
  while (std::getline(in, line)) {
    std::istringstream f(line);
    std::string sl, local, remote, st, queues, timer, retr;
    unsigned long uid = 0;
    long timeout = 0;
    unsigned long long inode = 0;
    if (!(f >> sl >> local >> remote >> st >> queues >> timer >> retr >> uid >> timeout >> inode)) continue;
    const size_t colon = local.rfind(':');
    if (colon == std::string::npos) continue;
    if (std::strtoul(local.c_str() + colon + 1, nullptr, 16) != port) continue;
    out.push_back({uint32_t(uid), uint64_t(inode)});
  }
  return out;
}

PortHolder find_udp_port_holder(uint16_t port) {
  PortHolder h;
  for (const char* table : {"/proc/net/udp", "/proc/net/udp6"}) {
    for (const UdpSocket& s : parse_proc_net_udp(read_small(table), port)) {
      if (!h.bound) h.bound = true, h.uid = s.uid;
      if (s.inode == 0) continue;
      if (pid_t pid = process_of_socket(s.inode)) {
        h.uid = s.uid;
        h.pid = pid;
        h.comm = read_small("/proc/" + std::to_string(pid) + "/comm");
        while (!h.comm.empty() && h.comm.back() == '\n') h.comm.pop_back();
        if (h.comm == "softverbsd") h.softverbs_dir = softverbsd_dir(pid);
        return h;
      }
    }
  }
  return h;
}

std::string describe(const PortHolder& h) {
  if (!h.bound) return {};
  const std::string user = "user " + std::to_string(h.uid);
  if (!h.pid) return "a socket of " + user + " in no process of ours (the kernel's rdma_rxe, or another user's program)";
  std::string s = (h.comm.empty() ? std::string("a process") : h.comm) + " (pid " + std::to_string(h.pid) + ", " + user + ")";
  if (!h.softverbs_dir.empty()) s += " serving " + h.softverbs_dir;
  return s;
}

// Why a QP whose peer is on another host cannot have the wire, on stderr
// once per process and reason (ibv_modify_qp only returns an errno): the
// port held by someone else (who, and what to do), or
// RoCE off in the daemon.
void explain_no_wire(int e, const std::string& dir, const uint8_t* sgid) {
  static std::atomic<bool> said_busy{false}, said_off{false}, said_other{false};
  char addr[INET6_ADDRSTRLEN] = "?";
  const bool v4 = IN6_IS_ADDR_V4MAPPED(reinterpret_cast<const in6_addr*>(sgid));
  ::inet_ntop(v4 ? AF_INET : AF_INET6, v4 ? sgid + 12 : sgid, addr, sizeof addr);
  if (e == EADDRINUSE) {
    if (said_busy.exchange(true)) return;
    const PortHolder h = find_udp_port_holder(4791);
    std::string who = describe(h);
    if (who.empty()) who = "another process or the kernel (no longer bound: try again)";
    std::string todo;
    if (!h.softverbs_dir.empty()) {
      todo = "Either share its daemon (SOFTVERBS_DIR=" + h.softverbs_dir + " in this program's environment) or stop it";
    } else if (h.bound && h.uid != ::getuid()) {
      todo = "Either use the system daemon (SOFTVERBS_SYSTEM=1, softverbsd --system: one for every user) or have "
             "the holder stopped (rdma_rxe: rdma link delete)";
    } else {
      todo = "Stop the holder";
    }
    std::fprintf(stderr,
                 "softverbs: a QP whose peer is on another host needs UDP port 4791 (RoCEv2) on %s, "
                 "which is held by %s, so the softverbs daemon of %s cannot take it. %s "
                 "(this daemon takes the port at the next such QP).\n",
                 addr, who.c_str(), dir.c_str(), todo.c_str());
  } else if (e == EOPNOTSUPP) {
    if (said_off.exchange(true)) return;
    std::fprintf(stderr,
                 "softverbs: a QP whose peer is on another host needs RoCEv2, which the softverbs daemon "
                 "of %s does not use (it was started with SOFTVERBS_ROCE=0)\n",
                 dir.c_str());
  } else {
    if (said_other.exchange(true)) return;
    std::fprintf(stderr, "softverbs: a QP whose peer is on another host cannot use RoCEv2 on %s: %s\n", addr,
                 std::strerror(e));
  }
}

}  // namespace sv
