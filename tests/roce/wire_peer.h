// wire_peer.h: what the test bed's peer programs (mw_wire_peer,
// xrc_wire_peer, lanes_wire_peer) share: dying with a message, handing a
// line to the other side through a file of the shared directory, waiting for
// the other side's line, opening the device, a RC QP's moves to RTR and RTS, and waiting for one
// completion.
#pragma once

#include <errno.h>
#include <infiniband/verbs.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>

namespace wire_peer {

// Exits 1 after "PROGRAM: what" on stderr.
[[noreturn]] inline void die(const std::string& what) {
  std::fprintf(stderr, "%s: %s\n", program_invocation_short_name, what.c_str());
  std::exit(1);
}

// Writes `text` as PATH's one line, whole (written aside, then renamed).
inline void put(const std::string& path, const std::string& text) {
  std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp);
    f << text << "\n";
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) die("rename " + path);
}

// PATH's line, once the other side wrote it (at most 30 s).
inline std::string get(const std::string& path) {
  for (int i = 0; i < 3000; ++i) {
    std::ifstream f(path);
    std::string s;
    if (f && std::getline(f, s) && !s.empty()) return s;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  die("timed out waiting for " + path);
}

// The first device, opened, and its GID `gid_index` of port 1 in `gid`.
inline ibv_context* open_first(int gid_index, ibv_gid& gid) {
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (!list || n < 1) die("no device");
  ibv_context* ctx = ibv_open_device(list[0]);
  ibv_free_device_list(list);
  if (!ctx) die("ibv_open_device");
  if (ibv_query_gid(ctx, 1, gid_index, &gid)) die("ibv_query_gid");
  return ctx;
}

// RTR toward QP `dest` at `dgid` (path MTU 1024, PSN 0, from GID index
// `sgid_index` of port 1), then RTS (PSN 0, `timeout`, 7 retries).
inline void to_rtr(ibv_qp* qp, uint32_t dest, const ibv_gid& dgid, int sgid_index) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = IBV_MTU_1024;
  a.dest_qp_num = dest;
  a.rq_psn = 0;
  a.max_dest_rd_atomic = 1;
  a.min_rnr_timer = 12;
  a.ah_attr.is_global = 1;
  a.ah_attr.grh.dgid = dgid;
  a.ah_attr.grh.sgid_index = uint8_t(sgid_index);
  a.ah_attr.grh.hop_limit = 64;
  a.ah_attr.port_num = 1;
  if (ibv_modify_qp(qp, &a,
                    IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                        IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
    die("modify to RTR");
}
inline void to_rts(ibv_qp* qp, uint8_t timeout = 14) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_RTS;
  a.sq_psn = 0;
  a.timeout = timeout;
  a.retry_cnt = 7;
  a.rnr_retry = 7;
  a.max_rd_atomic = 1;
  if (ibv_modify_qp(qp, &a,
                    IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                        IBV_QP_MAX_QP_RD_ATOMIC))
    die("modify to RTS");
}

// One completion of `cq`: polled, then polled with short sleeps.
inline ibv_wc poll_one(ibv_cq* cq) {
  ibv_wc wc{};
  for (int i = 0; i < 30'000'000; ++i) {
    int n = ibv_poll_cq(cq, 1, &wc);
    if (n < 0) die("ibv_poll_cq");
    if (n == 1) return wc;
    if (i > 1000) std::this_thread::sleep_for(std::chrono::microseconds(10));
  }
  die("no completion");
}

}  // namespace wire_peer
