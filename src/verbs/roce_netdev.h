// roce_netdev.h: a RoCEv2 GID as the IP address and netdev it stands for
// (IBTA annex A17.4.5.1), for the wire path.
#pragma once

#include <cstdint>
#include <string>

namespace sv::verbs {

// "a.b.c.d" for an IPv4-mapped GID (RoCEv2, IBTA annex A17.4.5.1), else the IPv6 text.
std::string gid_to_ip(const uint8_t* g);
// The largest IB MTU whose packets (IP, UDP, BTH, the longest extension
// headers, ICRC) fit the netdev that holds `sgid`: never IP-fragment.
uint32_t wire_mtu_for(const uint8_t* sgid);

}  // namespace sv::verbs
