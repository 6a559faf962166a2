// Verbs that need no device state (strings, rates, fork) and the verbs of
// later issues that answer "not supported" until they land (SRQ, import,
// address handles are minimal).
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "verbs/provider.h"

using namespace sv;
using namespace sv::verbs;

namespace {
std::atomic<bool> g_fork_init{false};
}

extern "C" {

const char* ibv_wc_status_str(ibv_wc_status s) {
  static const char* const names[] = {
      "success", "local length error", "local QP operation error", "local EE context operation error",
      "local protection error", "Work Request Flushed Error", "memory management operation error",
      "bad response error", "local access error", "remote invalid request error", "remote access error",
      "remote operation error", "transport retry counter exceeded", "RNR retry counter exceeded",
      "local RDD violation error", "remote invalid RD request", "aborted error", "invalid EE context number",
      "invalid EE context state", "fatal error", "response timeout error", "general error",
      "TM error", "TM rendezvous error"};
  if (int(s) < 0 || size_t(s) >= sizeof(names) / sizeof(names[0])) return "unknown";
  return names[s];
}

const char* ibv_node_type_str(ibv_node_type t) {
  switch (t) {
    case IBV_NODE_CA: return "InfiniBand channel adapter";
    case IBV_NODE_SWITCH: return "InfiniBand switch";
    case IBV_NODE_ROUTER: return "InfiniBand router";
    case IBV_NODE_RNIC: return "iWARP NIC";
    case IBV_NODE_USNIC: return "usNIC";
    case IBV_NODE_USNIC_UDP: return "usNIC UDP";
    case IBV_NODE_UNSPECIFIED: return "unspecified";
    default: return "unknown";
  }
}

const char* ibv_port_state_str(ibv_port_state s) {
  static const char* const names[] = {"PORT_NOP", "PORT_DOWN", "PORT_INIT", "PORT_ARMED", "PORT_ACTIVE",
                                      "PORT_ACTIVE_DEFER"};
  if (int(s) < 0 || size_t(s) >= sizeof(names) / sizeof(names[0])) return "unknown";
  return names[s];
}

const char* ibv_event_type_str(ibv_event_type e) {
  static const char* const names[] = {
      "CQ error", "local work queue catastrophic error", "invalid request local work queue error",
      "local access violation work queue error", "communication established", "send queue drained",
      "path migrated", "path migration request error", "local catastrophic error", "port active",
      "port error", "LID change", "P_Key change", "SM change", "SRQ catastrophic error",
      "SRQ limit reached", "last WQE reached", "client reregistration", "GID table change",
      "WQ fatal"};
  if (int(e) < 0 || size_t(e) >= sizeof(names) / sizeof(names[0])) return "unknown";
  return names[e];
}

int ibv_rate_to_mult(ibv_rate rate) {
  switch (rate) {
    case IBV_RATE_2_5_GBPS: return 1;
    case IBV_RATE_5_GBPS: return 2;
    case IBV_RATE_10_GBPS: return 4;
    case IBV_RATE_20_GBPS: return 8;
    case IBV_RATE_30_GBPS: return 12;
    case IBV_RATE_40_GBPS: return 16;
    case IBV_RATE_60_GBPS: return 24;
    case IBV_RATE_80_GBPS: return 32;
    case IBV_RATE_120_GBPS: return 48;
    default: return -1;
  }
}

ibv_rate mult_to_ibv_rate(int mult) {
  switch (mult) {
    case 1: return IBV_RATE_2_5_GBPS;
    case 2: return IBV_RATE_5_GBPS;
    case 4: return IBV_RATE_10_GBPS;
    case 8: return IBV_RATE_20_GBPS;
    case 12: return IBV_RATE_30_GBPS;
    case 16: return IBV_RATE_40_GBPS;
    case 24: return IBV_RATE_60_GBPS;
    case 32: return IBV_RATE_80_GBPS;
    case 48: return IBV_RATE_120_GBPS;
    default: return IBV_RATE_MAX;
  }
}

int ibv_rate_to_mbps(ibv_rate rate) {
  switch (rate) {
    case IBV_RATE_2_5_GBPS: return 2500;
    case IBV_RATE_5_GBPS: return 5000;
    case IBV_RATE_10_GBPS: return 10000;
    case IBV_RATE_20_GBPS: return 20000;
    case IBV_RATE_30_GBPS: return 30000;
    case IBV_RATE_40_GBPS: return 40000;
    case IBV_RATE_60_GBPS: return 60000;
    case IBV_RATE_80_GBPS: return 80000;
    case IBV_RATE_120_GBPS: return 120000;
    case IBV_RATE_14_GBPS: return 14062;
    case IBV_RATE_56_GBPS: return 56250;
    case IBV_RATE_112_GBPS: return 112500;
    case IBV_RATE_168_GBPS: return 168750;
    case IBV_RATE_25_GBPS: return 25781;
    case IBV_RATE_100_GBPS: return 103125;
    case IBV_RATE_200_GBPS: return 206250;
    case IBV_RATE_300_GBPS: return 309375;
    case IBV_RATE_28_GBPS: return 28125;
    case IBV_RATE_50_GBPS: return 53125;
    case IBV_RATE_400_GBPS: return 425000;
    case IBV_RATE_600_GBPS: return 637500;
    default: return -1;
  }
}

ibv_rate mbps_to_ibv_rate(int mbps) {
  for (int r = IBV_RATE_2_5_GBPS; r <= IBV_RATE_600_GBPS; ++r)
    if (ibv_rate_to_mbps(ibv_rate(r)) == mbps) return ibv_rate(r);
  return IBV_RATE_MAX;
}

// Registered pages are shared-file pages whose fork behaviour softverbs
// controls itself (docs/MEMORY.md): a child gets a private copy of them, as
// with ordinary memory. So fork needs no preparation, and softverbs answers
// as rdma-core does on kernels with fork-safe pinning: ibv_fork_init() is a
// successful no-op and ibv_is_fork_initialized() says IBV_FORK_UNNEEDED.
int ibv_fork_init(void) {
  g_fork_init = true;
  return 0;
}

ibv_fork_status ibv_is_fork_initialized(void) { return IBV_FORK_UNNEEDED; }

// softverbs' device has no sysfs directory.
int ibv_read_sysfs_file(const char*, const char*, char*, size_t) {
  errno = ENOENT;
  return -1;
}

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



int ibv_query_ece(ibv_qp*, ibv_ece*) { return EOPNOTSUPP; }
int ibv_set_ece(ibv_qp*, ibv_ece*) { return EOPNOTSUPP; }

// Data of one QP lands in order: the requester copies each message front to
// back, last byte last.
int ibv_query_qp_data_in_order(ibv_qp*, ibv_wr_opcode, uint32_t) { return 1; }

}  // extern "C"
