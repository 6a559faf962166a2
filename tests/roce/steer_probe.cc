// steer_probe: one RC QP put on the wire and left there, for
// tests/roce/steer_test.sh (roce.steer): the QP moves to RTR with a remote
// IPv4 DGID from GID index 1, which attaches it to the daemon's RoCEv2 port
// (and, with steering, gives this process its own socket of the port's
// reuseport group). Prints "qpn N", then waits for a line on stdin (or EOF)
// and destroys everything (SOFTVERBS_ROCE_STATS=1 then prints what arrived).
//
//   steer_probe REMOTE_IPV4
#include <arpa/inet.h>
#include <infiniband/verbs.h>

#include <cstdio>
#include <cstring>

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: steer_probe REMOTE_IPV4\n");
    return 2;
  }
  int n = 0;
  ibv_device** devs = ibv_get_device_list(&n);
  if (!devs || n == 0) return 1;
  ibv_context* ctx = ibv_open_device(devs[0]);
  if (!ctx) return 1;
  ibv_pd* pd = ibv_alloc_pd(ctx);
  ibv_cq* cq = ibv_create_cq(ctx, 16, nullptr, nullptr, 0);
  ibv_qp_init_attr ia{};
  ia.send_cq = ia.recv_cq = cq;
  ia.qp_type = IBV_QPT_RC;
  ia.cap.max_send_wr = ia.cap.max_recv_wr = 4;
  ia.cap.max_send_sge = ia.cap.max_recv_sge = 1;
  ibv_qp* qp = pd && cq ? ibv_create_qp(pd, &ia) : nullptr;
  if (!qp) return 1;
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.port_num = 1;
  if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)) return 1;
  a = {};
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = IBV_MTU_1024;
  a.dest_qp_num = 0x123;
  a.max_dest_rd_atomic = 1;
  a.min_rnr_timer = 12;
  a.ah_attr.is_global = 1;
  a.ah_attr.port_num = 1;
  a.ah_attr.grh.sgid_index = 1;
  a.ah_attr.grh.hop_limit = 64;
  a.ah_attr.grh.dgid.raw[10] = a.ah_attr.grh.dgid.raw[11] = 0xff;
  if (inet_pton(AF_INET, argv[1], a.ah_attr.grh.dgid.raw + 12) != 1) return 2;
  if (int e = ibv_modify_qp(qp, &a,
                            IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER)) {
    std::fprintf(stderr, "steer_probe: RTR: %s\n", std::strerror(e));
    return 1;
  }
  std::printf("qpn %u\n", qp->qp_num);
  std::fflush(stdout);
  char line[64];
  (void)!std::fgets(line, sizeof line, stdin);
  ibv_destroy_qp(qp);
  ibv_destroy_cq(cq);
  ibv_dealloc_pd(pd);
  ibv_close_device(ctx);
  ibv_free_device_list(devs);
  return 0;
}
