// roce_netdev.cc: see roce_netdev.h.
#include "verbs/roce_netdev.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "common/sys.h"
#include "roce/headers.h"

namespace sv::verbs {

using roce::kBthLen;
using roce::kIcrcLen;

std::string gid_to_ip(const uint8_t* g) {
  static const uint8_t mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  char buf[INET6_ADDRSTRLEN] = {};
  if (std::memcmp(g, mapped, 12) == 0) inet_ntop(AF_INET, g + 12, buf, sizeof buf);
  else inet_ntop(AF_INET6, g, buf, sizeof buf);
  return buf;
}

uint32_t wire_mtu_for(const uint8_t* sgid) {
  const bool v4 = gid_to_ip(sgid).find(':') == std::string::npos;
  uint32_t ifmtu = 1500;
  ifaddrs* ifs = nullptr;
  if (::getifaddrs(&ifs) == 0) {
    for (ifaddrs* i = ifs; i; i = i->ifa_next) {
      if (!i->ifa_addr) continue;
      const void* a = nullptr;
      if (v4 && i->ifa_addr->sa_family == AF_INET) a = &reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr;
      if (!v4 && i->ifa_addr->sa_family == AF_INET6) a = &reinterpret_cast<sockaddr_in6*>(i->ifa_addr)->sin6_addr;
      if (!a || std::memcmp(a, v4 ? sgid + 12 : sgid, v4 ? 4 : 16) != 0) continue;
      int s = sv::kernel_socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
      ifreq r{};
      std::strncpy(r.ifr_name, i->ifa_name, IFNAMSIZ - 1);
      if (s >= 0 && ::ioctl(s, SIOCGIFMTU, &r) == 0) ifmtu = uint32_t(r.ifr_mtu);
      if (s >= 0) ::close(s);
      break;
    }
    ::freeifaddrs(ifs);
  }
  const uint32_t overhead = (v4 ? 20 : 40) + 8 + kBthLen + 28 + kIcrcLen;
  uint32_t mtu = 4096;
  while (mtu > 256 && mtu + overhead > ifmtu) mtu /= 2;
  return mtu;
}

}  // namespace sv::verbs
