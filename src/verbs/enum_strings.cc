// Names of the verbs' enumerations (ibv_wc_status_str(3),
// ibv_node_type_str(3), ibv_port_state_str(3), ibv_event_type_str(3),
// ibv_wr_opcode_str, exported in the private node since rdma-core v56) and
// the conversions between static rates, multipliers and Mb/s
// (ibv_rate_to_mult(3), ibv_rate_to_mbps(3)). No device state.
#include <infiniband/verbs.h>

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

// The names rdma-core's libibverbs gives (libibverbs/enum_strs.c); one
// beyond IBV_WR_ATOMIC_WRITE (15) is "unknown".
const char* ibv_wr_opcode_str(ibv_wr_opcode op) {
  static const char* const names[] = {
      "rdma-write", "rdma-write-with-imm", "send",     "send-with-imm", "rdma-read",  "atomic-cmp-and-swp",
      "atomic-fetch-and-add", "local-inv", "bind-mw", "send-with-inv", "tso",        "driver1",
      nullptr, nullptr, "flush", "atomic-write"};
  unsigned i = unsigned(op);
  if (i >= sizeof(names) / sizeof(names[0]) || !names[i]) return "unknown";
  return names[i];
}

ibv_rate mbps_to_ibv_rate(int mbps) {
  for (int r = IBV_RATE_2_5_GBPS; r <= IBV_RATE_600_GBPS; ++r)
    if (ibv_rate_to_mbps(ibv_rate(r)) == mbps) return ibv_rate(r);
  return IBV_RATE_MAX;
}

}  // extern "C"
