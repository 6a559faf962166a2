// addr.cc: socket addresses and their GIDs (addr.h), rdma_getaddrinfo(3)
// and rdma_freeaddrinfo(3).
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <sys/ioctl.h>
#include <unistd.h>
#include <netdb.h>
#include <rdma/rdma_cma.h>

#include <cstdlib>
#include <cstring>

#include "common/sys.h"
#include "rdmacm/addr.h"
#include "rdmacm/device.h"

namespace sv::rdmacm {
namespace {

bool v4_of(const sockaddr* a, in_addr* out) {
  if (a->sa_family == AF_INET) {
    *out = reinterpret_cast<const sockaddr_in*>(a)->sin_addr;
    return true;
  }
  if (a->sa_family == AF_INET6) {
    const in6_addr& s6 = reinterpret_cast<const sockaddr_in6*>(a)->sin6_addr;
    if (IN6_IS_ADDR_V4MAPPED(&s6)) {
      std::memcpy(out, &s6.s6_addr[12], 4);
      return true;
    }
  }
  return false;
}

}  // namespace

socklen_t addr_len(const sockaddr* a) {
  if (!a) return 0;
  if (a->sa_family == AF_INET) return sizeof(sockaddr_in);
  if (a->sa_family == AF_INET6) return sizeof(sockaddr_in6);
  return 0;
}

uint16_t addr_port(const sockaddr* a) {
  if (a->sa_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in*>(a)->sin_port);
  if (a->sa_family == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6*>(a)->sin6_port);
  return 0;
}

void set_port(sockaddr* a, uint16_t port) {
  if (a->sa_family == AF_INET) reinterpret_cast<sockaddr_in*>(a)->sin_port = htons(port);
  if (a->sa_family == AF_INET6) reinterpret_cast<sockaddr_in6*>(a)->sin6_port = htons(port);
}

bool addr_is_any(const sockaddr* a) {
  if (a->sa_family == AF_INET) return reinterpret_cast<const sockaddr_in*>(a)->sin_addr.s_addr == htonl(INADDR_ANY);
  if (a->sa_family == AF_INET6) return IN6_IS_ADDR_UNSPECIFIED(&reinterpret_cast<const sockaddr_in6*>(a)->sin6_addr);
  return false;
}

bool addr_is_loopback(const sockaddr* a) {
  in_addr v4;
  if (v4_of(a, &v4)) return (ntohl(v4.s_addr) >> 24) == 127;
  if (a->sa_family == AF_INET6) return IN6_IS_ADDR_LOOPBACK(&reinterpret_cast<const sockaddr_in6*>(a)->sin6_addr);
  return false;
}

bool loopback_bind_gives_device() {
  const char* v = std::getenv("SOFTVERBS_CM_LOOPBACK_DEVICE");
  return v && std::strcmp(v, "1") == 0;
}

bool addr_is_local(const sockaddr* a) {
  if (addr_is_loopback(a)) return true;
  in_addr v4;
  bool is4 = v4_of(a, &v4);
  ifaddrs* ifs = nullptr;
  if (::getifaddrs(&ifs) != 0) return false;
  bool found = false;
  for (ifaddrs* i = ifs; i && !found; i = i->ifa_next) {
    if (!i->ifa_addr) continue;
    if (is4 && i->ifa_addr->sa_family == AF_INET)
      found = reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr == v4.s_addr;
    else if (!is4 && a->sa_family == AF_INET6 && i->ifa_addr->sa_family == AF_INET6)
      found = std::memcmp(&reinterpret_cast<sockaddr_in6*>(i->ifa_addr)->sin6_addr,
                          &reinterpret_cast<const sockaddr_in6*>(a)->sin6_addr, 16) == 0;
  }
  ::freeifaddrs(ifs);
  return found;
}

std::string addr_text(const sockaddr* a) {
  char buf[INET6_ADDRSTRLEN] = "?";
  in_addr v4;
  if (v4_of(a, &v4))
    ::inet_ntop(AF_INET, &v4, buf, sizeof(buf));
  else if (a->sa_family == AF_INET6)
    ::inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(a)->sin6_addr, buf, sizeof(buf));
  return buf;
}

int route_source(const sockaddr* dst, sockaddr_storage* src) {
  sockaddr_storage d{};
  std::memcpy(&d, dst, addr_len(dst));
  set_port(reinterpret_cast<sockaddr*>(&d), 4791);
  int s = sv::kernel_socket(dst->sa_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (s < 0) return errno;
  int e = 0;
  socklen_t len = sizeof(*src);
  if (::connect(s, reinterpret_cast<sockaddr*>(&d), addr_len(dst)) != 0 ||
      ::getsockname(s, reinterpret_cast<sockaddr*>(src), &len) != 0)
    e = errno;
  ::close(s);
  if (!e) set_port(reinterpret_cast<sockaddr*>(src), 0);
  return e;
}

ibv_gid gid_of_addr(const sockaddr* a) {
  ibv_gid g{};
  in_addr v4;
  if (v4_of(a, &v4)) {
    g.raw[10] = g.raw[11] = 0xff;
    std::memcpy(&g.raw[12], &v4, 4);
  } else if (a->sa_family == AF_INET6) {
    std::memcpy(g.raw, &reinterpret_cast<const sockaddr_in6*>(a)->sin6_addr, 16);
  }
  return g;
}

int wire_mtu_of(const sockaddr* a) {
  ifaddrs* ifs = nullptr;
  if (::getifaddrs(&ifs) != 0) return 0;
  std::string name;
  in_addr v4;
  bool is4 = v4_of(a, &v4);
  for (ifaddrs* i = ifs; i && name.empty(); i = i->ifa_next) {
    if (!i->ifa_addr) continue;
    if (is4 && i->ifa_addr->sa_family == AF_INET &&
        reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr == v4.s_addr)
      name = i->ifa_name;
    else if (!is4 && a->sa_family == AF_INET6 && i->ifa_addr->sa_family == AF_INET6 &&
             std::memcmp(&reinterpret_cast<sockaddr_in6*>(i->ifa_addr)->sin6_addr,
                         &reinterpret_cast<const sockaddr_in6*>(a)->sin6_addr, 16) == 0)
      name = i->ifa_name;
  }
  ::freeifaddrs(ifs);
  if (name.empty() || name.size() >= IFNAMSIZ) return 0;
  ifreq r{};
  std::memcpy(r.ifr_name, name.c_str(), name.size() + 1);
  int s = sv::kernel_socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  int ifmtu = 0;
  if (s >= 0 && ::ioctl(s, SIOCGIFMTU, &r) == 0) ifmtu = r.ifr_mtu;
  if (s >= 0) ::close(s);
  if (ifmtu <= 0) return 0;
  // IP (20 or 40) + UDP 8 + BTH 12 + the longest extension headers (28)
  // + ICRC 4, as the RoCE engine sizes its packets (src/verbs/roce_link.cc).
  int overhead = (is4 ? 20 : 40) + 8 + 12 + 28 + 4;
  for (int m = IBV_MTU_4096; m >= IBV_MTU_256; --m)
    if ((128 << m) + overhead <= ifmtu) return m;
  return IBV_MTU_256;
}

// RoCE v2 GIDs are the interface addresses (IBTA annex A17.8); an IPv4
// address appears as ::ffff:a.b.c.d. Loopback addresses map to index 0
// (::ffff:127.0.0.1, see src/verbs/context.cc).
int gid_index_of(const sockaddr* a, ibv_gid* gid) {
  ibv_context* c = device();
  if (!c) return -1;
  ibv_gid want{};
  in_addr v4;
  if (v4_of(a, &v4)) {
    want.raw[10] = want.raw[11] = 0xff;
    std::memcpy(&want.raw[12], &v4, 4);
  } else if (a->sa_family == AF_INET6) {
    std::memcpy(want.raw, &reinterpret_cast<const sockaddr_in6*>(a)->sin6_addr, 16);
  } else {
    return -1;
  }
  ibv_port_attr pa{};
  if (ibv_query_port(c, 1, &pa)) return -1;
  for (int i = 0; i < pa.gid_tbl_len; ++i) {
    ibv_gid g{};
    if (ibv_query_gid(c, 1, i, &g)) break;
    if (std::memcmp(g.raw, want.raw, 16) == 0) {
      if (gid) *gid = g;
      return i;
    }
  }
  if (addr_is_loopback(a) && ibv_query_gid(c, 1, 0, gid ? gid : &want) == 0) return 0;
  return -1;
}

}  // namespace sv::rdmacm

using namespace sv::rdmacm;

namespace {

sockaddr* copy_addr(const sockaddr* a, socklen_t n) {
  auto* p = static_cast<sockaddr*>(std::malloc(n));
  if (p) std::memcpy(p, a, n);
  return p;
}

int port_space_of(const rdma_addrinfo* hints) {
  return hints && hints->ai_port_space ? hints->ai_port_space : RDMA_PS_TCP;
}

int qp_type_of(const rdma_addrinfo* hints, int ps) {
  if (hints && hints->ai_qp_type) return hints->ai_qp_type;
  return ps == RDMA_PS_UDP || ps == RDMA_PS_IPOIB ? IBV_QPT_UD : IBV_QPT_RC;
}

int from_hints(const rdma_addrinfo* hints, rdma_addrinfo** res) {
  auto* out = static_cast<rdma_addrinfo*>(std::calloc(1, sizeof(rdma_addrinfo)));
  if (!out) return fail(ENOMEM);
  out->ai_flags = hints->ai_flags;
  out->ai_port_space = port_space_of(hints);
  out->ai_qp_type = qp_type_of(hints, out->ai_port_space);
  const sockaddr* any = hints->ai_dst_addr ? hints->ai_dst_addr : hints->ai_src_addr;
  out->ai_family = hints->ai_family ? hints->ai_family : any->sa_family;
  if (hints->ai_src_addr && hints->ai_src_len) {
    out->ai_src_len = hints->ai_src_len;
    out->ai_src_addr = copy_addr(hints->ai_src_addr, hints->ai_src_len);
  }
  if (hints->ai_dst_addr && hints->ai_dst_len) {
    out->ai_dst_len = hints->ai_dst_len;
    out->ai_dst_addr = copy_addr(hints->ai_dst_addr, hints->ai_dst_len);
  }
  *res = out;
  return 0;
}

}  // namespace

extern "C" {

// rdma_getaddrinfo(3): name resolution through getaddrinfo(3); every
// resolvable IP address is an RDMA address here (the device owns every
// local address; others fail later, at address resolution).
int rdma_getaddrinfo(const char* node, const char* service, const rdma_addrinfo* hints, rdma_addrinfo** res) {
  if (!res) return fail(EINVAL);
  if (!node && !service) {
    // rdma_getaddrinfo(3): the addresses may come in the hints instead
    // (libfabric's verbs provider passes them so).
    if (!hints || (!hints->ai_src_addr && !hints->ai_dst_addr)) return fail(EINVAL);
    return from_hints(hints, res);
  }
  addrinfo h{};
  h.ai_socktype = SOCK_STREAM;
  int rai_flags = hints ? hints->ai_flags : 0;
  if (rai_flags & RAI_PASSIVE) h.ai_flags |= AI_PASSIVE;
  if (rai_flags & RAI_NUMERICHOST) h.ai_flags |= AI_NUMERICHOST;
  if (hints && ((rai_flags & RAI_FAMILY) || hints->ai_family)) h.ai_family = hints->ai_family;
  if (h.ai_family == AF_IB) return fail(EAFNOSUPPORT);
  addrinfo* ai = nullptr;
  int r = ::getaddrinfo(node, service, &h, &ai);
  if (r) {
    errno = (r == EAI_SYSTEM) ? errno : ENODEV;
    return r == EAI_SYSTEM ? -1 : r;
  }
  auto* out = static_cast<rdma_addrinfo*>(std::calloc(1, sizeof(rdma_addrinfo)));
  if (!out) {
    ::freeaddrinfo(ai);
    return fail(ENOMEM);
  }
  out->ai_flags = rai_flags;
  out->ai_family = ai->ai_family;
  out->ai_port_space = port_space_of(hints);
  out->ai_qp_type = qp_type_of(hints, out->ai_port_space);
  auto copy = copy_addr;
  if (rai_flags & RAI_PASSIVE) {
    out->ai_src_len = ai->ai_addrlen;
    out->ai_src_addr = copy(ai->ai_addr, ai->ai_addrlen);
  } else {
    out->ai_dst_len = ai->ai_addrlen;
    out->ai_dst_addr = copy(ai->ai_addr, ai->ai_addrlen);
    if (hints && hints->ai_src_addr && hints->ai_src_len) {
      out->ai_src_len = hints->ai_src_len;
      out->ai_src_addr = copy(hints->ai_src_addr, hints->ai_src_len);
    }
  }
  ::freeaddrinfo(ai);
  *res = out;
  return 0;
}

void rdma_freeaddrinfo(rdma_addrinfo* res) {
  while (res) {
    rdma_addrinfo* next = res->ai_next;
    std::free(res->ai_src_addr);
    std::free(res->ai_dst_addr);
    std::free(res->ai_src_canonname);
    std::free(res->ai_dst_canonname);
    std::free(res->ai_route);
    std::free(res->ai_connect);
    std::free(res);
    res = next;
  }
}

}  // extern "C"
