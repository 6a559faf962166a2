/* cm_port_down.c: rdma_cm facing a port that a fault plan takes down
 * (docs/LAB.md "Port down and other async events"). Run under
 * `softverbs run` with SOFTVERBS_FAULTS='port:after_ms=T,down_ms=D' by
 * tests/compat/events.sh (mode cm), PORT an rdma_cm port:
 *
 *   cm_port_down PORT
 *
 * A listener on 127.0.0.1:PORT, a client id that resolves its address
 * and route and one that resolves its address while the port is up; then,
 * once IBV_EVENT_PORT_ERR came, rdma_connect ends in
 * RDMA_CM_EVENT_UNREACHABLE (-ETIMEDOUT), rdma_resolve_route in
 * RDMA_CM_EVENT_ROUTE_ERROR (-ENETUNREACH) and a new rdma_resolve_addr in
 * RDMA_CM_EVENT_ADDR_ERROR (-ENETUNREACH); another process without a plan
 * (this program again, "cm_port_down PORT connect") connects to the
 * listener and gets RDMA_CM_EVENT_UNREACHABLE, the listener no
 * CONNECT_REQUEST; once IBV_EVENT_PORT_ACTIVE came, a new id connects to the
 * listener and a SEND moves. Each step says what it saw on stdout;
 * "FAIL: ..." on stderr and exit 1 otherwise. */
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>

#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <sys/wait.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int failures;
static struct rdma_event_channel* ch;
static struct sockaddr_in addr;

#define FAIL(...) (fprintf(stderr, "FAIL: " __VA_ARGS__), fprintf(stderr, "\n"), failures++)

static void die(const char* what) {
  fprintf(stderr, "FAIL: %s: %s\n", what, strerror(errno));
  exit(1);
}

/* The next rdma_cm event, which must be `type` with `status`; its id. */
static struct rdma_cm_id* expect_cm(enum rdma_cm_event_type type, int status) {
  struct rdma_cm_event* ev;
  if (rdma_get_cm_event(ch, &ev)) die("rdma_get_cm_event");
  printf("cm event %s status %d\n", rdma_event_str(ev->event), ev->status);
  if (ev->event != type || ev->status != status)
    FAIL("%s status %d, wanted %s status %d", rdma_event_str(ev->event), ev->status, rdma_event_str(type), status);
  struct rdma_cm_id* id = ev->id;
  rdma_ack_cm_event(ev);
  return id;
}

static void expect_async(struct ibv_context* c, enum ibv_event_type type) {
  struct ibv_async_event ev;
  if (ibv_get_async_event(c, &ev)) die("ibv_get_async_event");
  printf("event %s port %d\n", ibv_event_type_str(ev.event_type), ev.element.port_num);
  if (ev.event_type != type || ev.element.port_num != 1)
    FAIL("%s on port %d, wanted %s on 1", ibv_event_type_str(ev.event_type), ev.element.port_num,
         ibv_event_type_str(type));
  ibv_ack_async_event(&ev);
}

static struct ibv_qp_init_attr qp_attr(void) {
  struct ibv_qp_init_attr a;
  memset(&a, 0, sizeof a);
  a.qp_type = IBV_QPT_RC;
  a.cap.max_send_wr = a.cap.max_recv_wr = 4;
  a.cap.max_send_sge = a.cap.max_recv_sge = 1;
  a.sq_sig_all = 1;
  return a;
}

/* A new client id with its address and route resolved and a QP. */
static struct rdma_cm_id* client(void) {
  struct rdma_cm_id* id;
  if (rdma_create_id(ch, &id, NULL, RDMA_PS_TCP)) die("rdma_create_id");
  if (rdma_resolve_addr(id, NULL, (struct sockaddr*)&addr, 2000)) die("rdma_resolve_addr");
  expect_cm(RDMA_CM_EVENT_ADDR_RESOLVED, 0);
  if (rdma_resolve_route(id, 2000)) die("rdma_resolve_route");
  expect_cm(RDMA_CM_EVENT_ROUTE_RESOLVED, 0);
  struct ibv_qp_init_attr a = qp_attr();
  if (rdma_create_qp(id, NULL, &a)) die("rdma_create_qp");
  return id;
}

/* The other process: its REQ reaches a listener whose port is down, which
 * drops it: the connection is unreachable. */
static int connect_child(void) {
  struct rdma_cm_id* id = client();
  struct rdma_conn_param cp;
  memset(&cp, 0, sizeof cp);
  cp.retry_count = 7;
  if (rdma_connect(id, &cp)) die("rdma_connect");
  struct rdma_cm_event* ev;
  if (rdma_get_cm_event(ch, &ev)) die("rdma_get_cm_event");
  printf("other process: cm event %s status %d\n", rdma_event_str(ev->event), ev->status);
  if (ev->event != RDMA_CM_EVENT_UNREACHABLE) FAIL("other process: %s, wanted UNREACHABLE", rdma_event_str(ev->event));
  rdma_ack_cm_event(ev);
  return failures ? 1 : 0;
}

/* This program again, without the plan, as "PORT connect"; its exit status. */
static int run_other(char** argv) {
  fflush(stdout);
  pid_t pid = fork();
  if (pid < 0) die("fork");
  if (pid == 0) {
    unsetenv("SOFTVERBS_FAULTS");
    unsetenv("SOFTVERBS_FAULT_PLAN");
    unsetenv("SOFTVERBS_FAULTS_LOG");
    execl("/proc/self/exe", argv[0], argv[1], "connect", (char*)NULL);
    _exit(127);
  }
  int st;
  while (waitpid(pid, &st, 0) < 0)
    if (errno != EINTR) die("waitpid");
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

int main(int argc, char** argv) {
  if (argc != 2 && !(argc == 3 && !strcmp(argv[2], "connect"))) {
    fprintf(stderr, "usage: %s PORT [connect]\n", argv[0]);
    return 2;
  }
  setvbuf(stdout, NULL, _IOLBF, 0);
  alarm(30);
  addr.sin_family = AF_INET;
  addr.sin_port = htons((uint16_t)atoi(argv[1]));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ch = rdma_create_event_channel();
  if (!ch) die("rdma_create_event_channel");
  if (argc == 3) return connect_child();
  struct rdma_cm_id* listener;
  if (rdma_create_id(ch, &listener, NULL, RDMA_PS_TCP)) die("rdma_create_id");
  if (rdma_bind_addr(listener, (struct sockaddr*)&addr) || rdma_listen(listener, 4)) die("rdma_listen");

  struct rdma_cm_id* early = client();
  struct rdma_cm_id* late;
  if (rdma_create_id(ch, &late, NULL, RDMA_PS_TCP)) die("rdma_create_id");
  if (rdma_resolve_addr(late, NULL, (struct sockaddr*)&addr, 2000)) die("rdma_resolve_addr");
  expect_cm(RDMA_CM_EVENT_ADDR_RESOLVED, 0);
  expect_async(early->verbs, IBV_EVENT_PORT_ERR);
  struct rdma_conn_param cp;
  memset(&cp, 0, sizeof cp);
  cp.retry_count = 7;
  cp.rnr_retry_count = 7;
  if (rdma_connect(early, &cp)) die("rdma_connect");
  expect_cm(RDMA_CM_EVENT_UNREACHABLE, -ETIMEDOUT);
  struct rdma_cm_id* refused;
  if (rdma_create_id(ch, &refused, NULL, RDMA_PS_TCP)) die("rdma_create_id");
  if (rdma_resolve_addr(refused, NULL, (struct sockaddr*)&addr, 2000)) die("rdma_resolve_addr");
  expect_cm(RDMA_CM_EVENT_ADDR_ERROR, -ENETUNREACH);
  if (rdma_resolve_route(late, 2000)) die("rdma_resolve_route");
  expect_cm(RDMA_CM_EVENT_ROUTE_ERROR, -ENETUNREACH);
  /* Another process connects to our listener: nothing comes in. */
  int rc = run_other(argv);
  if (rc != 0) FAIL("the other process's connect: exit %d", rc);
  struct pollfd pf = {.fd = ch->fd, .events = POLLIN};
  if (poll(&pf, 1, 100) != 0) FAIL("an rdma_cm event came while the port was down");

  expect_async(early->verbs, IBV_EVENT_PORT_ACTIVE);
  struct rdma_cm_id* c = client();
  static char sbuf[64] = "after the port came back", rbuf[64];
  struct ibv_mr* smr = rdma_reg_msgs(c, sbuf, sizeof sbuf);
  if (!smr) die("rdma_reg_msgs");
  if (rdma_connect(c, &cp)) die("rdma_connect");
  struct rdma_cm_id* s = expect_cm(RDMA_CM_EVENT_CONNECT_REQUEST, 0);
  struct ibv_qp_init_attr a = qp_attr();
  if (rdma_create_qp(s, NULL, &a)) die("rdma_create_qp");
  struct ibv_mr* rmr = rdma_reg_msgs(s, rbuf, sizeof rbuf);
  if (!rmr || rdma_post_recv(s, NULL, rbuf, sizeof rbuf, rmr)) die("rdma_post_recv");
  if (rdma_accept(s, &cp)) die("rdma_accept");
  expect_cm(RDMA_CM_EVENT_ESTABLISHED, 0);
  expect_cm(RDMA_CM_EVENT_ESTABLISHED, 0);
  if (rdma_post_send(c, NULL, sbuf, sizeof sbuf, smr, 0)) die("rdma_post_send");
  struct ibv_wc wc;
  if (rdma_get_send_comp(c, &wc) != 1 || wc.status != IBV_WC_SUCCESS) FAIL("the SEND: %s", ibv_wc_status_str(wc.status));
  if (rdma_get_recv_comp(s, &wc) != 1 || wc.status != IBV_WC_SUCCESS) FAIL("the receive: %s", ibv_wc_status_str(wc.status));
  printf("received '%s'\n", rbuf);
  if (strcmp(rbuf, sbuf) != 0) FAIL("received '%s'", rbuf);
  printf("%s\n", failures ? "FAILED" : "PASSED");
  return failures ? 1 : 0;
}
