/* shared_qp_client: seed 001's client, steps A to D.
 *
 *   A. create a unix-domain socket
 *   B. connect to the server
 *   C. get the server's message
 *   D. unpack the context, PD, MR, CQ and QP
 *
 * Then it uses the server's QP as its own: it writes a greeting into the
 * server's buffer with an RDMA WRITE posted on the shared QP and polls the
 * shared CQ for the completion.
 *
 * usage: shared_qp_client SOCKET_PATH [INDEX]
 */
#include <softverbs/softverbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s SOCKET_PATH [INDEX]\n", argv[0]);
    return 2;
  }
  int index = argc > 2 ? atoi(argv[2]) : 0;
  /* A, B */
  int s = socket(AF_UNIX, SOCK_SEQPACKET, 0);
  struct sockaddr_un addr;
  memset(&addr, 0, sizeof(addr));
  addr.sun_family = AF_UNIX;
  snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", argv[1]);
  if (connect(s, (struct sockaddr *)&addr, sizeof(addr))) return perror("connect"), 1;
  /* C, D */
  struct ibv_context *ctx;
  struct svx_object objs[4];
  int n = 0;
  int e = svx_unpack(s, &ctx, objs, 4, &n);
  if (e || n != 4) return fprintf(stderr, "svx_unpack: %s\n", strerror(e)), 1;
  struct ibv_mr *mr = objs[1].mr;
  struct ibv_cq *cq = objs[2].cq;
  struct ibv_qp *qp = objs[3].qp;
  printf("client: got context, PD %u, MR lkey 0x%x, CQ %u, QP 0x%x\n", objs[0].pd->handle, mr->lkey, cq->handle,
         qp->qp_num);

  /* The greeting travels inline (no key needed for the source) through the
   * shared QP into the second page of the server's buffer. */
  char msg[64];
  snprintf(msg, sizeof(msg), "hello from client %d (pid %d)", index, (int)getpid());
  struct ibv_sge sge = {(uint64_t)(uintptr_t)msg, (uint32_t)strlen(msg) + 1, 0};
  struct ibv_send_wr wr;
  memset(&wr, 0, sizeof(wr));
  wr.wr_id = 7;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
  wr.wr.rdma.remote_addr = (uint64_t)(uintptr_t)mr->addr + 4096 + 64 * (uint64_t)index;
  wr.wr.rdma.rkey = mr->rkey;
  struct ibv_send_wr *bad;
  if ((e = ibv_post_send(qp, &wr, &bad))) return fprintf(stderr, "post: %s\n", strerror(e)), 1;
  struct ibv_wc wc;
  while ((n = ibv_poll_cq(cq, 1, &wc)) == 0) {
  }
  if (n < 0 || wc.status != IBV_WC_SUCCESS) return fprintf(stderr, "completion: %s\n", ibv_wc_status_str(wc.status)), 1;
  printf("client: wrote \"%s\" through the shared QP\n", msg);
  if (write(s, "x", 1) != 1) return 1;
  svx_unimport_qp(qp);
  svx_unimport_cq(cq);
  ibv_unimport_mr(mr);
  ibv_unimport_pd(objs[0].pd);
  ibv_close_device(ctx);
  return 0;
}
