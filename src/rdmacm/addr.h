// addr.h: socket addresses as the drop-in librdmacm reads them, and their
// RoCEv2 GIDs (addr.cc). Pure, except addr_is_local, route_source and
// wire_mtu_of, which ask the kernel, and gid_index_of, which reads the
// device's GID table.
#pragma once

#include <infiniband/verbs.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstdint>
#include <string>

namespace sv::rdmacm {

socklen_t addr_len(const sockaddr* a);
uint16_t addr_port(const sockaddr* a);  // host order
void set_port(sockaddr* a, uint16_t port);
bool addr_is_any(const sockaddr* a);
bool addr_is_loopback(const sockaddr* a);
// Whether a bind to a loopback address gives the id sv0 (GID index 0):
// SOFTVERBS_CM_LOOPBACK_DEVICE=1 in the environment, read at each bind.
// Without it a loopback bind gives no device, as in Linux
// (docs/RDMACM.md, "Addresses").
bool loopback_bind_gives_device();
// An address of this host (getifaddrs), loopback included.
bool addr_is_local(const sockaddr* a);
// "a.b.c.d" or the IPv6 text; an IPv4-mapped IPv6 address prints as IPv4.
std::string addr_text(const sockaddr* a);
// The source address the routing table picks for `dst` (a connected UDP
// socket's name), port 0. 0 or an errno (ENETUNREACH: no route).
int route_source(const sockaddr* dst, sockaddr_storage* src);
// The RoCEv2 GID of an address (Annex A17.8: IPv4 as ::ffff:a.b.c.d).
ibv_gid gid_of_addr(const sockaddr* a);
// The largest IB MTU whose RoCEv2 packets fit the MTU of the interface that
// owns local address `a` (IBV_MTU_1024 for Ethernet's 1500); 0 if unknown.
int wire_mtu_of(const sockaddr* a);
// Index in sv0 port 1's GID table of the GID that owns address `a`, or -1.
int gid_index_of(const sockaddr* a, ibv_gid* gid);

}  // namespace sv::rdmacm
