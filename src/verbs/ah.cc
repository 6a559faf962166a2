// Address handles (ibv_create_ah(3), ibv_destroy_ah(3),
// ibv_init_ah_from_wc(3), ibv_create_ah_from_wc(3)).
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "verbs/provider.h"

using namespace sv;
using namespace sv::verbs;

extern "C" {

// Address handles record their attributes; a UD send reads the destination
// GID from them (ibv_create_ah(3)).
// The port is a RoCE port (link layer Ethernet): an address is a GID, so an
// AH without a GRH is refused, as rdma-core's RoCE devices and the kernel do
// (IBTA A17.4.5.1: RoCEv2 packets always carry the GRH's addresses).
ibv_ah* ibv_create_ah(ibv_pd* pd, ibv_ah_attr* attr) {
  if (!pd || !attr || attr->port_num != 1 || !attr->is_global || attr->grh.sgid_index >= kGidTableLen) {
    errno = EINVAL;
    return nullptr;
  }
  // The device's max_ah (ibv_query_device) holds: one more is ENOMEM, as a
  // kernel device's AH table would refuse it.
  ContextState& cs = ctx_state(pd->context);
  if (cs.ahs.fetch_add(1, std::memory_order_relaxed) >= kMaxAh) {
    cs.ahs.fetch_sub(1, std::memory_order_relaxed);
    errno = ENOMEM;
    return nullptr;
  }
  auto* ah = static_cast<Ah*>(std::calloc(1, sizeof(Ah)));
  if (!ah) {
    cs.ahs.fetch_sub(1, std::memory_order_relaxed);
    errno = ENOMEM;
    return nullptr;
  }
  ah->ah.context = pd->context;
  ah->ah.pd = pd;
  ah->attr = *attr;
  return &ah->ah;
}

int ibv_destroy_ah(ibv_ah* ah) {
  if (!ah) return EINVAL;
  ctx_state(ah->context).ahs.fetch_sub(1, std::memory_order_relaxed);
  std::free(ah);
  return 0;
}

// ibv_init_ah_from_wc(3): the reply address of a received UD message. With
// a GRH (IBTA 8.3), the reply goes to the sender's GID from the local GID
// the message was sent to; 0 on success, -1 with errno on error.
int ibv_init_ah_from_wc(ibv_context* context, uint8_t port_num, ibv_wc* wc, ibv_grh* grh, ibv_ah_attr* ah_attr) {
  if (!context || !wc || !ah_attr || port_num != 1 || ((wc->wc_flags & IBV_WC_GRH) && !grh)) {
    errno = EINVAL;
    return -1;
  }
  std::memset(ah_attr, 0, sizeof(*ah_attr));
  ah_attr->dlid = wc->slid;
  ah_attr->sl = wc->sl;
  ah_attr->src_path_bits = wc->dlid_path_bits;
  ah_attr->port_num = port_num;
  if (wc->wc_flags & IBV_WC_GRH) {
    ah_attr->is_global = 1;
    ah_attr->grh.dgid = grh->sgid;
    ibv_gid dgid = grh->dgid;
    uint8_t tclass = uint8_t(be32toh(grh->version_tclass_flow) >> 20);
    uint32_t flow_label = be32toh(grh->version_tclass_flow) & 0xfffff;
    // RoCEv2 over IPv4 (IBTA Annex A17.4.5.1): the 40 bytes are 20 of zero
    // then the IPv4 header; its addresses are the GIDs ::ffff:a.b.c.d.
    const auto* raw = reinterpret_cast<const uint8_t*>(grh);
    if ((raw[0] >> 4) != 6 && raw[20] == 0x45) {
      std::memset(&ah_attr->grh.dgid, 0, sizeof(ibv_gid));
      std::memset(&dgid, 0, sizeof dgid);
      ah_attr->grh.dgid.raw[10] = ah_attr->grh.dgid.raw[11] = 0xff;
      dgid.raw[10] = dgid.raw[11] = 0xff;
      std::memcpy(&ah_attr->grh.dgid.raw[12], raw + 20 + 12, 4);  // IPv4 source
      std::memcpy(&dgid.raw[12], raw + 20 + 16, 4);                // IPv4 destination
      tclass = raw[20 + 1];
      flow_label = 0;
    }
    int index = -1;
    for (int i = 0; i < int(kGidTableLen) && index < 0; ++i) {
      ibv_gid g{};
      if (ibv_query_gid(context, port_num, i, &g)) break;
      if (std::memcmp(g.raw, dgid.raw, 16) == 0) index = i;
    }
    if (index < 0) {
      errno = ENOENT;  // the message was not addressed to one of our GIDs
      return -1;
    }
    ah_attr->grh.sgid_index = uint8_t(index);
    ah_attr->grh.flow_label = flow_label;
    ah_attr->grh.traffic_class = tclass;
    ah_attr->grh.hop_limit = 0xff;
  }
  return 0;
}

ibv_ah* ibv_create_ah_from_wc(ibv_pd* pd, ibv_wc* wc, ibv_grh* grh, uint8_t port_num) {
  if (!pd) {
    errno = EINVAL;
    return nullptr;
  }
  ibv_ah_attr attr;
  if (ibv_init_ah_from_wc(pd->context, port_num, wc, grh, &attr)) return nullptr;
  return ibv_create_ah(pd, &attr);
}

}  // extern "C"
