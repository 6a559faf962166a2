// rendezvous.h: the names of the rdma_cm listeners' unix sockets, shared by
// the drop-in librdmacm (src/rdmacm/cm_rendezvous.cc: binds and connects)
// and the daemon's CM gateway (src/daemon/cm_gateway.cc: relays a REQ from
// the wire to its listener). A listener of (port space, port) at address A
// owns the socket "<ps>-<port>-<A>" in the rendezvous directory ($DIR/cm).
//
// Contract: pure, header only.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace sv::rdmacm {

inline std::string rendezvous_name(int ps, uint16_t port, const std::string& addr) {
  return std::to_string(ps) + "-" + std::to_string(port) + "-" + addr;
}

// The listeners a request to `addr` (its text: IPv4 dotted, IPv6 with ':')
// may reach, in the order they are tried: the address itself, then the
// wildcards answering for it (0.0.0.0 and :: for IPv4, :: for IPv6).
inline std::vector<std::string> listener_names(int ps, uint16_t port, const std::string& addr) {
  std::vector<std::string> names{rendezvous_name(ps, port, addr)};
  if (addr.find(':') == std::string::npos) names.push_back(rendezvous_name(ps, port, "0.0.0.0"));
  names.push_back(rendezvous_name(ps, port, "::"));
  return names;
}

}  // namespace sv::rdmacm
