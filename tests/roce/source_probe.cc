// source_probe: a UC QP and an RC QP on the wire, connected to REMOTE_IPV4
// (GID index 1 here), both expecting PSN 0 from DestQP 0x123, each with
// receives posted, for tests/roce/source_test.sh (roce.source). Prints
// "uc N" and "rc N" (their QPNs), then "recv QPN LEN FIRST_BYTE" for each
// receive completion, until a line on stdin (or EOF); SOFTVERBS_ROCE_STATS=1
// then prints what each QP dropped.
//
//   source_probe REMOTE_IPV4
#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>

namespace {

ibv_qp* connected(ibv_pd* pd, ibv_cq* cq, ibv_qp_type type, const char* remote) {
  ibv_qp_init_attr ia{};
  ia.send_cq = ia.recv_cq = cq;
  ia.qp_type = type;
  ia.cap.max_send_wr = ia.cap.max_recv_wr = 8;
  ia.cap.max_send_sge = ia.cap.max_recv_sge = 1;
  ibv_qp* qp = ibv_create_qp(pd, &ia);
  if (!qp) return nullptr;
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.port_num = 1;
  a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
  if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)) return nullptr;
  a = {};
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = IBV_MTU_1024;
  a.dest_qp_num = 0x123;
  a.rq_psn = 0;
  a.max_dest_rd_atomic = 1;
  a.min_rnr_timer = 12;
  a.ah_attr.is_global = 1;
  a.ah_attr.port_num = 1;
  a.ah_attr.grh.sgid_index = 1;
  a.ah_attr.grh.hop_limit = 64;
  a.ah_attr.grh.dgid.raw[10] = a.ah_attr.grh.dgid.raw[11] = 0xff;
  if (inet_pton(AF_INET, remote, a.ah_attr.grh.dgid.raw + 12) != 1) return nullptr;
  int mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
  if (type == IBV_QPT_RC) mask |= IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
  if (int e = ibv_modify_qp(qp, &a, mask)) {
    std::fprintf(stderr, "source_probe: RTR: %s\n", std::strerror(e));
    return nullptr;
  }
  return qp;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: source_probe REMOTE_IPV4\n");
    return 2;
  }
  int n = 0;
  ibv_device** devs = ibv_get_device_list(&n);
  ibv_context* ctx = devs && n > 0 ? ibv_open_device(devs[0]) : nullptr;
  ibv_pd* pd = ctx ? ibv_alloc_pd(ctx) : nullptr;
  ibv_cq* cq = pd ? ibv_create_cq(ctx, 64, nullptr, nullptr, 0) : nullptr;
  static char buf[16][256];
  ibv_mr* mr = cq ? ibv_reg_mr(pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE) : nullptr;
  ibv_qp* uc = mr ? connected(pd, cq, IBV_QPT_UC, argv[1]) : nullptr;
  ibv_qp* rc = uc ? connected(pd, cq, IBV_QPT_RC, argv[1]) : nullptr;
  if (!rc) return 1;
  for (int i = 0; i < 16; ++i) {
    ibv_sge sge{reinterpret_cast<uintptr_t>(buf[i]), sizeof buf[i], mr->lkey};
    ibv_recv_wr wr{};
    wr.wr_id = uint64_t(i);
    wr.sg_list = &sge;
    wr.num_sge = 1;
    ibv_recv_wr* bad = nullptr;
    if (ibv_post_recv(i < 8 ? uc : rc, &wr, &bad)) return 1;
  }
  std::printf("uc %u\nrc %u\n", uc->qp_num, rc->qp_num);
  std::fflush(stdout);
  for (;;) {
    ibv_wc wc[8];
    int got = ibv_poll_cq(cq, 8, wc);
    for (int i = 0; i < got; ++i)
      std::printf("recv %u %u %d status %d\n", wc[i].qp_num, wc[i].byte_len, buf[wc[i].wr_id][0], int(wc[i].status));
    if (got > 0) std::fflush(stdout);
    pollfd p{0, POLLIN, 0};
    if (::poll(&p, 1, 5) > 0) break;
  }
  ibv_destroy_qp(uc);
  ibv_destroy_qp(rc);
  return 0;
}
