#include "common/device_info.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <unistd.h>

#include <cstring>

namespace sv::dev {

std::string fw_version() { return std::string("softverbs ") + SOFTVERBS_VERSION; }

uint64_t node_guid() {
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (const char* p = host; *p; ++p) h = (h ^ uint8_t(*p)) * 1099511628211ull;
  return (h & ~0xffffull) | 0x5356;
}

const Port& port() {
  static const Port p{};
  return p;
}

std::vector<Gid> gid_table_from(const std::vector<IfAddr>& addrs) {
  std::vector<Gid> t;
  auto add_v4 = [&](const uint8_t* a, uint32_t ifindex, const std::string& ndev) {
    Gid g;
    g.raw[10] = g.raw[11] = 0xff;
    std::memcpy(&g.raw[12], a, 4);
    g.ifindex = ifindex;
    g.ndev = ndev;
    t.push_back(g);
  };
  // The loopback GID belongs to the loopback interface that holds
  // 127.0.0.1 (lo, index 1, unless the host says otherwise).
  const uint8_t lo[4] = {127, 0, 0, 1};
  uint32_t lo_index = 1;
  std::string lo_name = "lo";
  for (const auto& a : addrs)
    if (a.loopback && a.family == AF_INET && std::memcmp(a.addr.data(), lo, 4) == 0) {
      lo_index = a.ifindex;
      lo_name = a.name;
      break;
    }
  add_v4(lo, lo_index, lo_name);
  for (const auto& a : addrs)
    if (!a.loopback && a.family == AF_INET) add_v4(a.addr.data(), a.ifindex, a.name);
  for (const auto& a : addrs)
    if (!a.loopback && a.family == AF_INET6) {
      Gid g;
      g.raw = a.addr;
      g.ifindex = a.ifindex;
      g.ndev = a.name;
      t.push_back(g);
    }
  if (t.size() > kGidTableLen) t.resize(kGidTableLen);
  return t;
}

std::vector<IfAddr> host_addresses() {
  std::vector<IfAddr> out;
  ifaddrs* ifs = nullptr;
  if (::getifaddrs(&ifs) != 0) return out;
  for (ifaddrs* i = ifs; i; i = i->ifa_next) {
    if (!i->ifa_addr) continue;
    const int fam = i->ifa_addr->sa_family;
    if (fam != AF_INET && fam != AF_INET6) continue;
    IfAddr a;
    a.name = i->ifa_name;
    a.ifindex = ::if_nametoindex(i->ifa_name);
    a.family = fam;
    a.loopback = (i->ifa_flags & IFF_LOOPBACK) != 0;
    if (fam == AF_INET) std::memcpy(a.addr.data(), &reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr, 4);
    else std::memcpy(a.addr.data(), &reinterpret_cast<sockaddr_in6*>(i->ifa_addr)->sin6_addr, 16);
    out.push_back(a);
  }
  ::freeifaddrs(ifs);
  return out;
}

const std::vector<Gid>& gid_table() {
  static const std::vector<Gid> t = gid_table_from(host_addresses());
  return t;
}

}  // namespace sv::dev
