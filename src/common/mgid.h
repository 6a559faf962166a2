// mgid.h: which GIDs name a multicast group, for every part that checks one
// (ibv_attach_mcast in the library, the daemon's group table, the UD
// requester).
//
// IBTA 4.1.1: a multicast GID starts with 0xFF. On a RoCEv2 port a group
// also has the GID of its IP address (Annex A17.4.5.1, IPv4 as
// ::ffff:a.b.c.d), and Linux's CM gives an IPv4 group exactly that MGID
// (cma_iboe_set_mgid for RoCEv2): an IPv4-mapped address in 224.0.0.0/4 is a
// multicast GID too, as the kernel's rdma_is_multicast_addr has it.
#pragma once

#include <cstdint>

namespace sv {

inline bool gid_is_multicast(const uint8_t* g) {
  if (g[0] == 0xff) return true;
  for (int i = 0; i < 10; ++i)
    if (g[i]) return false;
  return g[10] == 0xff && g[11] == 0xff && (g[12] & 0xf0) == 0xe0;
}

}  // namespace sv
