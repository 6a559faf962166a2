/* shared_qp_server: seed 001's server, steps A to D.
 *
 *   A. open a context; create a PD, a CQ, a registered buffer and a QP
 *      (connected, inside the same context, to a second QP that owns the
 *      buffer's receiving side)
 *   B. listen on a unix-domain socket
 *   C. pack the context, PD, MR, CQ and QP
 *   D. send them to each client that connects
 *
 * A client (shared_qp_client) then writes a greeting into the buffer through
 * the shared QP; the server prints what arrived.
 *
 * usage: shared_qp_server SOCKET_PATH [CLIENTS]
 */
#include <softverbs/softverbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

static int to_rts(struct ibv_qp *qp, uint32_t dest) {
  struct ibv_qp_attr a;
  memset(&a, 0, sizeof(a));
  a.qp_state = IBV_QPS_INIT;
  a.port_num = 1;
  a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
  if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)) return -1;
  memset(&a, 0, sizeof(a));
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = IBV_MTU_1024;
  a.dest_qp_num = dest;
  a.max_dest_rd_atomic = 1;
  a.min_rnr_timer = 12;
  a.ah_attr.port_num = 1;
  if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
    return -1;
  memset(&a, 0, sizeof(a));
  a.qp_state = IBV_QPS_RTS;
  a.timeout = 14;
  a.retry_cnt = 7;
  a.rnr_retry = 7;
  a.max_rd_atomic = 1;
  return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                                   IBV_QP_MAX_QP_RD_ATOMIC);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s SOCKET_PATH [CLIENTS]\n", argv[0]);
    return 2;
  }
  int clients = argc > 2 ? atoi(argv[2]) : 1;

  /* A */
  struct ibv_device **list = ibv_get_device_list(NULL);
  if (!list || !list[0]) return fprintf(stderr, "no device\n"), 1;
  struct ibv_context *ctx = ibv_open_device(list[0]);
  ibv_free_device_list(list);
  if (!ctx) return perror("ibv_open_device"), 1;
  struct ibv_pd *pd = ibv_alloc_pd(ctx);
  struct ibv_cq *cq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
  char *buf = aligned_alloc(4096, 4096 * 2);
  memset(buf, 0, 4096 * 2);
  struct ibv_mr *mr = ibv_reg_mr(pd, buf, 4096 * 2, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  struct ibv_qp_init_attr ia;
  memset(&ia, 0, sizeof(ia));
  ia.send_cq = cq;
  ia.recv_cq = cq;
  ia.qp_type = IBV_QPT_RC;
  ia.cap.max_send_wr = ia.cap.max_recv_wr = 16;
  ia.cap.max_send_sge = ia.cap.max_recv_sge = 1;
  struct ibv_qp *shared = ibv_create_qp(pd, &ia);
  struct ibv_qp *target = ibv_create_qp(pd, &ia);
  if (!pd || !cq || !mr || !shared || !target) return perror("setup"), 1;
  if (to_rts(shared, target->qp_num) || to_rts(target, shared->qp_num)) return perror("connect"), 1;

  /* B */
  int ls = socket(AF_UNIX, SOCK_SEQPACKET, 0);
  struct sockaddr_un addr;
  memset(&addr, 0, sizeof(addr));
  addr.sun_family = AF_UNIX;
  snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", argv[1]);
  unlink(argv[1]);
  if (bind(ls, (struct sockaddr *)&addr, sizeof(addr)) || listen(ls, 8)) return perror("listen"), 1;
  printf("server: QP 0x%x shared at %s\n", shared->qp_num, argv[1]);
  fflush(stdout);

  for (int i = 0; i < clients; ++i) {
    int s = accept(ls, NULL, NULL);
    if (s < 0) return perror("accept"), 1;
    /* C, D */
    struct svx_object objs[4];
    objs[0].type = SVX_OBJ_PD;
    objs[0].pd = pd;
    objs[1].type = SVX_OBJ_MR;
    objs[1].mr = mr;
    objs[2].type = SVX_OBJ_CQ;
    objs[2].cq = cq;
    objs[3].type = SVX_OBJ_QP;
    objs[3].qp = shared;
    int e = svx_pack(s, ctx, objs, 4);
    if (e) return fprintf(stderr, "svx_pack: %s\n", strerror(e)), 1;
    char done;
    if (read(s, &done, 1) != 1) return fprintf(stderr, "client %d went away\n", i), 1;
    printf("server: client %d wrote: %s\n", i, buf + 4096 + 64 * i);
    close(s);
  }
  unlink(argv[1]);
  ibv_destroy_qp(shared);
  ibv_destroy_qp(target);
  ibv_dereg_mr(mr);
  ibv_destroy_cq(cq);
  ibv_dealloc_pd(pd);
  ibv_close_device(ctx);
  free(buf);
  return 0;
}
