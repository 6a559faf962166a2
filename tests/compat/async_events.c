/* async_events.c: what an application sees of the asynchronous events a
 * fault plan raises (docs/LAB.md "Port down and other async events"). Run
 * under `softverbs run` with SOFTVERBS_FAULTS set by tests/compat/events.sh:
 *
 *   async_events port        plan port:after_ms=T,down_ms=D
 *   async_events port_op     plan port:op=3,down_ms=D
 *   async_events qp_fatal    plan qp_fatal:op=2
 *   async_events cq_err      plan cq_err:cq=1,after_ms=T
 *   async_events srq_limit   plan srq_limit:srq=1,after_ms=T
 *   async_events device_fatal plan device_fatal:after_ms=T
 *   async_events delay       plan wc:op=2,delay_us=300000 (a request delayed)
 *   async_events rnr         plan rnr:op=2,times=3 (refused 3 times, rnr_retry 5)
 *   async_events rnr_exc     plan rnr:op=2,times=4 (refused 4 times, rnr_retry 3)
 *
 * Each step says what it saw on stdout; a step that sees something else
 * says "FAIL: ..." on stderr and the program exits 1. Plain libibverbs: two
 * RC QPs of one context connected to each other. */
#include <infiniband/verbs.h>

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int failures;

static void fail(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "FAIL: ");
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
  failures++;
}

static void die(const char* what) {
  fprintf(stderr, "FAIL: %s: %s\n", what, strerror(errno));
  exit(1);
}

static struct ibv_context* ctx;
static struct ibv_pd* pd;
static struct ibv_mr* mr;
static char buf[4096];

struct pair {
  struct ibv_cq* cq;
  struct ibv_qp* a;
  struct ibv_qp* b;
};

/* The RNR settings of the QPs make_pair connects. */
static uint8_t rnr_retry = 7, min_rnr_timer = 1;

static int to_rts(struct ibv_qp* q, uint32_t remote) {
  struct ibv_qp_attr at = {.qp_state = IBV_QPS_INIT, .port_num = 1,
                           .qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ};
  if (ibv_modify_qp(q, &at, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)) return -1;
  memset(&at, 0, sizeof at);
  at.qp_state = IBV_QPS_RTR;
  at.path_mtu = IBV_MTU_1024;
  at.dest_qp_num = remote;
  at.rq_psn = 0;
  at.max_dest_rd_atomic = 1;
  at.min_rnr_timer = min_rnr_timer;
  at.ah_attr.is_global = 1;
  at.ah_attr.port_num = 1;
  at.ah_attr.grh.hop_limit = 1;
  if (ibv_query_gid(ctx, 1, 0, &at.ah_attr.grh.dgid)) return -1;
  if (ibv_modify_qp(q, &at, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
    return -1;
  memset(&at, 0, sizeof at);
  at.qp_state = IBV_QPS_RTS;
  at.timeout = 14;
  at.retry_cnt = 7;
  at.rnr_retry = rnr_retry;
  at.sq_psn = 0;
  at.max_rd_atomic = 1;
  return ibv_modify_qp(q, &at, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                                   IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
}

/* Two RC QPs on one new CQ (or an SRQ for b's receives), connected. */
static void make_pair(struct pair* p, struct ibv_srq* srq) {
  p->cq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
  if (!p->cq) die("ibv_create_cq");
  struct ibv_qp_init_attr ia = {.send_cq = p->cq, .recv_cq = p->cq, .qp_type = IBV_QPT_RC,
                                .cap = {.max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1, .max_recv_sge = 1}};
  p->a = ibv_create_qp(pd, &ia);
  ia.srq = srq;
  p->b = ibv_create_qp(pd, &ia);
  if (!p->a || !p->b) die("ibv_create_qp");
  if (to_rts(p->a, p->b->qp_num) || to_rts(p->b, p->a->qp_num)) die("ibv_modify_qp");
}

static int post_recv(struct ibv_qp* q, uint64_t id) {
  struct ibv_sge s = {(uintptr_t)buf + 2048, 64, mr->lkey};
  struct ibv_recv_wr w = {.wr_id = id, .sg_list = &s, .num_sge = 1}, *bad;
  return ibv_post_recv(q, &w, &bad);
}

static int post_send(struct ibv_qp* q, uint64_t id) {
  struct ibv_sge s = {(uintptr_t)buf, 64, mr->lkey};
  struct ibv_send_wr w = {.wr_id = id, .sg_list = &s, .num_sge = 1, .opcode = IBV_WR_SEND,
                          .send_flags = IBV_SEND_SIGNALED}, *bad;
  return ibv_post_send(q, &w, &bad);
}

/* Completions polled while looking for another one, kept for later. */
static struct ibv_wc kept[64];
static int nkept;

/* The completion of `cq` for work request `id` of `qpn`, in whatever order
 * the completions come, within 5 s. */
static int find_wc(struct ibv_cq* cq, uint32_t qpn, uint64_t id, struct ibv_wc* wc) {
  for (int i = 0; i < nkept; i++) {
    if (kept[i].qp_num == qpn && kept[i].wr_id == id) {
      *wc = kept[i];
      kept[i] = kept[--nkept];
      return 0;
    }
  }
  for (int i = 0; i < 50000; i++) {
    int n = ibv_poll_cq(cq, 1, wc);
    if (n < 0) return -1;
    if (n == 0) {
      usleep(100);
      continue;
    }
    if (wc->qp_num == qpn && wc->wr_id == id) return 0;
    if (nkept < 64) kept[nkept++] = *wc;
  }
  return -1;
}

static void expect_wc(struct ibv_cq* cq, uint32_t qpn, uint64_t id, enum ibv_wc_status st) {
  struct ibv_wc wc;
  if (find_wc(cq, qpn, id, &wc)) return fail("no completion for wr_id %llu", (unsigned long long)id);
  printf("wc qp=0x%x wr_id=%llu status=%s\n", wc.qp_num, (unsigned long long)wc.wr_id, ibv_wc_status_str(wc.status));
  if (wc.status != st)
    fail("wr_id %llu: %s, wanted %s", (unsigned long long)wc.wr_id, ibv_wc_status_str(wc.status), ibv_wc_status_str(st));
}

/* The next async event, which must be `type`; returns it acknowledged. */
static struct ibv_async_event expect_event(enum ibv_event_type type) {
  struct ibv_async_event ev;
  memset(&ev, 0, sizeof ev);
  if (ibv_get_async_event(ctx, &ev)) {
    fail("ibv_get_async_event: %s", strerror(errno));
    return ev;
  }
  printf("event %s\n", ibv_event_type_str(ev.event_type));
  if (ev.event_type != type) fail("event %s, wanted %s", ibv_event_type_str(ev.event_type), ibv_event_type_str(type));
  ibv_ack_async_event(&ev);
  return ev;
}

/* The device view's port file NAME (softverbs run's sysfs view) says
 * WANT; no view (the file absent): nothing to check. */
static void expect_view(const char* name, const char* want) {
  char path[96], line[64] = "";
  snprintf(path, sizeof path, "/sys/class/infiniband/%s/ports/1/%s", ibv_get_device_name(ctx->device), name);
  FILE* f = fopen(path, "r");
  if (!f) return;
  if (!fgets(line, sizeof line, f)) line[0] = 0;
  fclose(f);
  line[strcspn(line, "\n")] = 0;
  printf("sysfs %s %s\n", name, line);
  if (strcmp(line, want)) fail("%s says '%s', wanted '%s'", path, line, want);
}

static void expect_port(enum ibv_port_state want) {
  struct ibv_port_attr pa;
  if (ibv_query_port(ctx, 1, &pa)) return fail("ibv_query_port: %s", strerror(errno));
  printf("port state %s\n", ibv_port_state_str(pa.state));
  if (pa.state != want) fail("port %s, wanted %s", ibv_port_state_str(pa.state), ibv_port_state_str(want));
  expect_view("state", want == IBV_PORT_DOWN ? "1: DOWN" : "4: ACTIVE");
  expect_view("phys_state", want == IBV_PORT_DOWN ? "3: Disabled" : "5: LinkUp");
}

static void expect_qp_state(struct ibv_qp* q, enum ibv_qp_state want) {
  struct ibv_qp_attr at;
  struct ibv_qp_init_attr ia;
  if (ibv_query_qp(q, &at, IBV_QP_STATE, &ia)) return fail("ibv_query_qp: %s", strerror(errno));
  printf("qp 0x%x state %d\n", q->qp_num, at.qp_state);
  if (at.qp_state != want) fail("QP 0x%x in state %d, wanted %d", q->qp_num, at.qp_state, want);
}

/* A send from a to b that arrives. */
static void moves_data(struct pair* p, uint64_t id) {
  if (post_recv(p->b, id + 1000) || post_send(p->a, id)) return fail("post: %s", strerror(errno));
  expect_wc(p->cq, p->a->qp_num, id, IBV_WC_SUCCESS);
  expect_wc(p->cq, p->b->qp_num, id + 1000, IBV_WC_SUCCESS);
}

/* The port goes down (by time, or at the third send), sends fail with
 * retry exceeded and flush, then it comes back and a new pair connects. */
static void port(int by_op) {
  struct pair p, q;
  expect_port(IBV_PORT_ACTIVE);
  make_pair(&p, NULL);
  moves_data(&p, 1);
  if (by_op) {
    moves_data(&p, 2);
  }
  struct ibv_async_event ev;
  if (!by_op) {
    ev = expect_event(IBV_EVENT_PORT_ERR);
    if (ev.element.port_num != 1) fail("PORT_ERR for port %d", ev.element.port_num);
    expect_port(IBV_PORT_DOWN);
  }
  if (post_send(p.a, 3) || post_send(p.a, 4)) return fail("post: %s", strerror(errno));
  expect_wc(p.cq, p.a->qp_num, 3, IBV_WC_RETRY_EXC_ERR);
  expect_wc(p.cq, p.a->qp_num, 4, IBV_WC_WR_FLUSH_ERR);
  expect_qp_state(p.a, IBV_QPS_ERR);
  if (by_op) {
    ev = expect_event(IBV_EVENT_PORT_ERR);
    if (ev.element.port_num != 1) fail("PORT_ERR for port %d", ev.element.port_num);
    expect_port(IBV_PORT_DOWN);
  }
  ev = expect_event(IBV_EVENT_PORT_ACTIVE);
  if (ev.element.port_num != 1) fail("PORT_ACTIVE for port %d", ev.element.port_num);
  expect_port(IBV_PORT_ACTIVE);
  make_pair(&q, NULL);
  moves_data(&q, 5);
}

/* The second send of a QP meets QP fatal: the event names it, its
 * requests and receives flush. */
static void qp_fatal(void) {
  struct pair p;
  make_pair(&p, NULL);
  moves_data(&p, 1);
  if (post_recv(p.a, 77)) return fail("post_recv: %s", strerror(errno));
  if (post_send(p.a, 2) || post_send(p.a, 3)) return fail("post: %s", strerror(errno));
  struct ibv_async_event ev = expect_event(IBV_EVENT_QP_FATAL);
  if (ev.element.qp != p.a) fail("QP_FATAL for %p, not QP 0x%x", (void*)ev.element.qp, p.a->qp_num);
  expect_wc(p.cq, p.a->qp_num, 2, IBV_WC_WR_FLUSH_ERR);
  expect_wc(p.cq, p.a->qp_num, 3, IBV_WC_WR_FLUSH_ERR);
  expect_wc(p.cq, p.a->qp_num, 77, IBV_WC_WR_FLUSH_ERR);
  expect_qp_state(p.a, IBV_QPS_ERR);
  expect_qp_state(p.b, IBV_QPS_RTS);
}

static void cq_err(void) {
  struct pair p, q;
  make_pair(&p, NULL);  /* CQ 1 */
  make_pair(&q, NULL);  /* CQ 2 */
  moves_data(&p, 1);
  struct ibv_async_event ev = expect_event(IBV_EVENT_CQ_ERR);
  if (ev.element.cq != p.cq) fail("CQ_ERR for %p, not the first CQ %p", (void*)ev.element.cq, (void*)p.cq);
  expect_qp_state(p.a, IBV_QPS_ERR);
  expect_qp_state(p.b, IBV_QPS_ERR);
  expect_qp_state(q.a, IBV_QPS_RTS);
  moves_data(&q, 2);
}

static void srq_limit(void) {
  struct ibv_srq_init_attr sa = {.attr = {.max_wr = 32, .max_sge = 1}};
  struct ibv_srq* srq = ibv_create_srq(pd, &sa);
  if (!srq) die("ibv_create_srq");
  struct ibv_srq_attr at = {.srq_limit = 4};
  if (ibv_modify_srq(srq, &at, IBV_SRQ_LIMIT)) die("ibv_modify_srq");
  struct ibv_async_event ev = expect_event(IBV_EVENT_SRQ_LIMIT_REACHED);
  if (ev.element.srq != srq) fail("SRQ_LIMIT_REACHED for %p, not %p", (void*)ev.element.srq, (void*)srq);
  memset(&at, 0, sizeof at);
  if (ibv_query_srq(srq, &at)) return fail("ibv_query_srq: %s", strerror(errno));
  printf("srq_limit %u\n", at.srq_limit);
  if (at.srq_limit != 0) fail("the limit is still armed (%u)", at.srq_limit);
}

static void device_fatal(void) {
  struct pair p;
  make_pair(&p, NULL);
  moves_data(&p, 1);
  expect_event(IBV_EVENT_DEVICE_FATAL);
  int e = post_send(p.a, 2);
  printf("post_send after: %s\n", strerror(e));
  if (e != EIO) fail("ibv_post_send after the device died: %s, not EIO", strerror(e));
  errno = 0;
  struct ibv_cq* cq = ibv_create_cq(ctx, 4, NULL, NULL, 0);
  printf("create_cq after: %s\n", cq ? "succeeded" : strerror(errno));
  if (cq || errno != EIO) fail("ibv_create_cq after the device died: %s, not EIO", cq ? "succeeded" : strerror(errno));
  errno = 0;
  struct ibv_mr* m = ibv_reg_mr(pd, buf + 1024, 64, IBV_ACCESS_LOCAL_WRITE);
  printf("reg_mr after: %s\n", m ? "succeeded" : strerror(errno));
  if (m || errno != EIO) fail("ibv_reg_mr after the device died: %s, not EIO", m ? "succeeded" : strerror(errno));
}

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

/* A SEND from a to b, timed from its post to its completion; the receive
 * completes too. Its time in ms. */
static double timed_send(struct pair* p, uint64_t id, enum ibv_wc_status st) {
  if (post_recv(p->b, id + 1000)) fail("post_recv: %s", strerror(errno));
  double t0 = now_ms();
  if (post_send(p->a, id)) fail("post_send: %s", strerror(errno));
  expect_wc(p->cq, p->a->qp_num, id, st);
  double ms = now_ms() - t0;
  printf("send %llu: %.1f ms\n", (unsigned long long)id, ms);
  if (st == IBV_WC_SUCCESS) expect_wc(p->cq, p->b->qp_num, id + 1000, IBV_WC_SUCCESS);
  return ms;
}

/* The QP's second send is held 300 ms before it is carried out: it and its
 * receive complete successfully, that much later; the first and third go
 * at once. */
static void delay(void) {
  struct pair p;
  make_pair(&p, NULL);
  double a = timed_send(&p, 1, IBV_WC_SUCCESS), b = timed_send(&p, 2, IBV_WC_SUCCESS),
         c = timed_send(&p, 3, IBV_WC_SUCCESS);
  if (b < 300) fail("the delayed send took %.1f ms, not 300 or more", b);
  if (a > 150 || c > 150) fail("an undelayed send took %.1f / %.1f ms", a, c);
  expect_qp_state(p.a, IBV_QPS_RTS);
}

/* The responder answers the second send with RNR NAKs `times` times; with
 * rnr_retry `retry` (min_rnr_timer 18: 5.12 ms, IBTA table 45) it completes
 * after those waits, or with RNR_RETRY_EXC_ERR once more come than the
 * retries allow (the QP to ERR, the next send flushed). */
static void rnr(int times, int retry) {
  struct pair p;
  rnr_retry = (uint8_t)retry;
  min_rnr_timer = 18;
  make_pair(&p, NULL);
  timed_send(&p, 1, IBV_WC_SUCCESS);
  const int exceeded = times > retry;
  /* The waits: one per retry made, 5.12 ms each. */
  const double least = 5.12 * (exceeded ? retry : times);
  double ms = timed_send(&p, 2, exceeded ? IBV_WC_RNR_RETRY_EXC_ERR : IBV_WC_SUCCESS);
  if (ms < least) fail("send 2 took %.1f ms, less than its %d RNR waits (%.1f ms)", ms, exceeded ? retry : times, least);
  if (!exceeded) {
    timed_send(&p, 3, IBV_WC_SUCCESS);
    expect_qp_state(p.a, IBV_QPS_RTS);
    return;
  }
  expect_qp_state(p.a, IBV_QPS_ERR);
  if (post_send(p.a, 3)) fail("post_send: %s", strerror(errno));
  expect_wc(p.cq, p.a->qp_num, 3, IBV_WC_WR_FLUSH_ERR);
  expect_qp_state(p.b, IBV_QPS_RTS);  /* the responder only refused */
}

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s port|port_op|qp_fatal|cq_err|srq_limit|device_fatal|delay|rnr|rnr_exc\n", argv[0]);
    return 2;
  }
  setvbuf(stdout, NULL, _IOLBF, 0);
  alarm(30);
  struct ibv_device** list = ibv_get_device_list(NULL);
  if (!list || !list[0]) die("no RDMA device");
  ctx = ibv_open_device(list[0]);
  if (!ctx) die("ibv_open_device");
  pd = ibv_alloc_pd(ctx);
  if (!pd) die("ibv_alloc_pd");
  mr = ibv_reg_mr(pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  if (!mr) die("ibv_reg_mr");
  const char* m = argv[1];
  if (!strcmp(m, "port")) port(0);
  else if (!strcmp(m, "port_op")) port(1);
  else if (!strcmp(m, "qp_fatal")) qp_fatal();
  else if (!strcmp(m, "cq_err")) cq_err();
  else if (!strcmp(m, "srq_limit")) srq_limit();
  else if (!strcmp(m, "device_fatal")) device_fatal();
  else if (!strcmp(m, "delay")) delay();
  else if (!strcmp(m, "rnr")) rnr(3, 5);
  else if (!strcmp(m, "rnr_exc")) rnr(4, 3);
  else {
    fprintf(stderr, "unknown mode %s\n", m);
    return 2;
  }
  printf("%s\n", failures ? "FAILED" : "PASSED");
  return failures ? 1 : 0;
}
