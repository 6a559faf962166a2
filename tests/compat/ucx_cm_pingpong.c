/*
 * ucx_cm_pingpong: a UCP client/server pair connected through a UCX
 * connection manager (the "sockaddr" flow: ucp_listener_create on the
 * server, ucp_ep_create with UCP_EP_PARAM_FIELD_SOCK_ADDR on the client),
 * used by tests/compat/ucx_cm.sh and tests/roce/cm_wire_test.sh to show that
 * UCX's rdmacm CM works over softverbs' librdmacm.
 *
 *   ucx_cm_pingpong server PORT [ADDRESS]
 *   ucx_cm_pingpong client ADDRESS PORT
 *   ucx_cm_pingpong reject PORT [ADDRESS]
 *   ucx_cm_pingpong refused ADDRESS PORT STATUS
 *   ucx_cm_pingpong hold PORT [ADDRESS]
 *   ucx_cm_pingpong orphan ADDRESS PORT
 *
 * What happens, in order:
 *   1. the server listens; the client connects; the server accepts the
 *      connection request (UCP_EP_PARAM_FIELD_CONN_REQUEST);
 *   2. for each size of SIZES, ROUNDS round trips of tagged messages: the
 *      client sends a pattern that depends on (size, round, direction), the
 *      server checks every byte and answers with the pattern of the other
 *      direction, which the client checks;
 *   3. one-sided: the server maps RMA_SIZE bytes, fills them with a pattern
 *      and sends its address and packed rkey; the client GETs them all and
 *      checks them, PUTs its own pattern over the second half and flushes,
 *      then tells the server, which checks the half;
 *   4. both print their endpoint (ucp_ep_print_info: the lanes, transports,
 *      devices and the CM) and close it.
 *
 * "reject" listens and refuses the first request (ucp_listener_reject:
 * rdma_reject with UCX's header); "refused" connects, posts a send and
 * expects the endpoint to fail with STATUS ("rejected": the server refused;
 * "reset": nobody listens, the CM's own REJ), the send to fail too, and no
 * message ever to complete.
 *
 * "hold" accepts one connection, sends one message, prints "pid N" and
 * waits to be killed; "orphan" connects, receives that message, prints
 * "orphan: connected" and waits for its endpoint to fail when the server
 * dies (the CM's DISCONNECTED).
 *
 * Prints "PASS <role>" and exits 0 when every byte matched; any error or
 * mismatch is reported on stderr and the exit code is 1. Every wait has a
 * deadline (CM_PINGPONG_TIMEOUT seconds, default 30).
 */
#include <arpa/inet.h>
#include <netdb.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <ucp/api/ucp.h>

enum { ROUNDS = 3, RMA_SIZE = 1 << 20 };
static const size_t SIZES[] = {8, 100, 4096, 8192, 65536, 1 << 20};

/* Tags: the data of each direction, the rkey message, the "put done" and
 * "goodbye" messages. */
enum {
    TAG_TO_SERVER = 0x1001,
    TAG_TO_CLIENT = 0x1002,
    TAG_RKEY = 0x1003,
    TAG_PUT_DONE = 0x1004,
    TAG_BYE = 0x1005,
};

static const char *role = "?";
static double deadline_s;
static ucp_context_h context;
static ucp_worker_h worker;
static ucp_conn_request_h conn_request;
static int closing;
static int ep_failed;
static ucs_status_t ep_status = UCS_OK; /* what the error handler was given */

static void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "FAIL %s: ", role);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(1);
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void check_deadline(const char *what)
{
    if (now() > deadline_s)
        die("timed out waiting for %s", what);
    if (ep_failed && !closing)
        die("the endpoint failed while waiting for %s", what);
}

/* Progresses until REQ (the result of an _nbx call) completes. */
static void wait_req(ucs_status_ptr_t req, const char *what)
{
    ucs_status_t st;
    if (req == NULL)
        return;
    if (UCS_PTR_IS_ERR(req))
        die("%s: %s", what, ucs_status_string(UCS_PTR_STATUS(req)));
    while ((st = ucp_request_check_status(req)) == UCS_INPROGRESS) {
        ucp_worker_progress(worker);
        check_deadline(what);
    }
    ucp_request_free(req);
    if (st != UCS_OK)
        die("%s: %s", what, ucs_status_string(st));
}

static void send_tag(ucp_ep_h ep, ucp_tag_t tag, const void *buf, size_t len, const char *what)
{
    ucp_request_param_t p;
    memset(&p, 0, sizeof(p));
    wait_req(ucp_tag_send_nbx(ep, buf, len, tag, &p), what);
}

/* Receives one message of tag TAG into BUF (CAP bytes); returns its length. */
static size_t recv_tag(ucp_tag_t tag, void *buf, size_t cap, const char *what)
{
    ucp_request_param_t p;
    ucp_tag_recv_info_t info;
    ucs_status_ptr_t req;
    ucs_status_t st;
    memset(&p, 0, sizeof(p));
    memset(&info, 0, sizeof(info));
    /* Always a request, also for a message already here (UCX 1.13 returns
     * NULL for one, without its length, unless told not to). */
    p.op_attr_mask = UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
    req = ucp_tag_recv_nbx(worker, buf, cap, tag, (ucp_tag_t)-1, &p);
    if (req == NULL)
        die("%s: ucp_tag_recv_nbx completed at once despite UCP_OP_ATTR_FLAG_NO_IMM_CMPL", what);
    if (UCS_PTR_IS_ERR(req))
        die("%s: %s", what, ucs_status_string(UCS_PTR_STATUS(req)));
    while ((st = ucp_tag_recv_request_test(req, &info)) == UCS_INPROGRESS) {
        ucp_worker_progress(worker);
        check_deadline(what);
    }
    ucp_request_free(req);
    if (st != UCS_OK)
        die("%s: %s", what, ucs_status_string(st));
    return info.length;
}

/* The byte at offset I of a message: differs between sizes, rounds and
 * directions, and is not periodic in any power of two. */
static uint8_t pattern(size_t size, int round, int dir, size_t i)
{
    uint64_t x = (uint64_t)i * 2654435761u + size * 40503u + (uint64_t)round * 97u + (uint64_t)dir * 0x5bd1e995u;
    return (uint8_t)(x ^ (x >> 13) ^ (x >> 23));
}

static void fill(uint8_t *buf, size_t size, int round, int dir)
{
    for (size_t i = 0; i < size; i++)
        buf[i] = pattern(size, round, dir, i);
}

static void verify(const uint8_t *buf, size_t got, size_t size, int round, int dir, const char *what)
{
    if (got != size)
        die("%s: %zu bytes received, expected %zu", what, got, size);
    for (size_t i = 0; i < size; i++)
        if (buf[i] != pattern(size, round, dir, i))
            die("%s: byte %zu of %zu is 0x%02x, expected 0x%02x", what, i, size, buf[i],
                pattern(size, round, dir, i));
}

static void ep_error(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    (void)arg;
    (void)ep;
    /* Reported even when expected (the peer's disconnect, status
     * "Connection reset by remote peer"), for the test's log. */
    printf("%s: endpoint error handler: %s%s\n", role, ucs_status_string(status),
           closing ? " (while closing)" : "");
    ep_status = status;
    ep_failed = 1;
}

static void on_conn_request(ucp_conn_request_h req, void *arg)
{
    if (conn_request != NULL) {
        fprintf(stderr, "%s: a second connection request, rejected\n", role);
        ucp_listener_reject(*(ucp_listener_h *)arg, req);
        return;
    }
    conn_request = req;
}

static void resolve(const char *host, const char *port, struct sockaddr_storage *ss, socklen_t *len)
{
    struct addrinfo hints, *ai;
    int rc;
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = host ? 0 : AI_PASSIVE;
    rc = getaddrinfo(host, port, &hints, &ai);
    if (rc != 0)
        die("getaddrinfo(%s, %s): %s", host ? host : "*", port, gai_strerror(rc));
    memcpy(ss, ai->ai_addr, ai->ai_addrlen);
    *len = ai->ai_addrlen;
    freeaddrinfo(ai);
}

static void init_ucp(void)
{
    ucp_params_t params;
    ucp_worker_params_t wparams;
    ucs_status_t st;
    memset(&params, 0, sizeof(params));
    params.field_mask = UCP_PARAM_FIELD_FEATURES;
    params.features = UCP_FEATURE_TAG | UCP_FEATURE_RMA;
    st = ucp_init(&params, NULL, &context);
    if (st != UCS_OK)
        die("ucp_init: %s", ucs_status_string(st));
    memset(&wparams, 0, sizeof(wparams));
    wparams.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wparams.thread_mode = UCS_THREAD_MODE_SINGLE;
    st = ucp_worker_create(context, &wparams, &worker);
    if (st != UCS_OK)
        die("ucp_worker_create: %s", ucs_status_string(st));
}

static void set_err_handler(ucp_ep_params_t *p)
{
    p->field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
    p->err_mode = UCP_ERR_HANDLING_MODE_PEER;
    p->err_handler.cb = ep_error;
    p->err_handler.arg = NULL;
}

static void print_ep(ucp_ep_h ep)
{
    printf("----- %s endpoint\n", role);
    fflush(stdout);
    ucp_ep_print_info(ep, stdout);
    fflush(stdout);
    printf("----- end\n");
    fflush(stdout);
}

/* Closes EP: flushed and disconnected through the CM (rdma_disconnect), or,
 * FORCE, released at once (an endpoint the peer has disconnected). */
static void close_ep(ucp_ep_h ep, int force)
{
    ucp_request_param_t p;
    closing = 1;
    memset(&p, 0, sizeof(p));
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0;
    wait_req(ucp_ep_close_nbx(ep, &p), "the endpoint to close");
}

struct rkey_msg {
    uint64_t address;
    uint64_t rkey_len;
    uint8_t rkey[4096];
};

static void run_server(const char *port, const char *addr)
{
    ucp_listener_params_t lp;
    ucp_listener_h listener;
    ucp_ep_params_t ep_params;
    ucp_ep_h ep;
    ucs_status_t st;
    struct sockaddr_storage ss;
    socklen_t sslen;
    uint8_t *buf = malloc(1 << 20);
    if (buf == NULL)
        die("out of memory");

    resolve(addr, port, &ss, &sslen);
    memset(&lp, 0, sizeof(lp));
    lp.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
    lp.sockaddr.addr = (const struct sockaddr *)&ss;
    lp.sockaddr.addrlen = sslen;
    lp.conn_handler.cb = on_conn_request;
    lp.conn_handler.arg = &listener;
    st = ucp_listener_create(worker, &lp, &listener);
    if (st != UCS_OK)
        die("ucp_listener_create on port %s: %s", port, ucs_status_string(st));
    printf("server: listening on port %s\n", port);
    fflush(stdout);

    while (conn_request == NULL) {
        ucp_worker_progress(worker);
        check_deadline("a connection request");
    }
    {
        ucp_conn_request_attr_t ca;
        char host[INET6_ADDRSTRLEN] = "?";
        memset(&ca, 0, sizeof(ca));
        ca.field_mask = UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR;
        if (ucp_conn_request_query(conn_request, &ca) == UCS_OK) {
            const struct sockaddr *sa = (const struct sockaddr *)&ca.client_address;
            if (sa->sa_family == AF_INET)
                inet_ntop(AF_INET, &((const struct sockaddr_in *)sa)->sin_addr, host, sizeof(host));
            else if (sa->sa_family == AF_INET6)
                inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)sa)->sin6_addr, host, sizeof(host));
        }
        printf("server: connection request from %s\n", host);
    }
    memset(&ep_params, 0, sizeof(ep_params));
    ep_params.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST;
    ep_params.conn_request = conn_request;
    set_err_handler(&ep_params);
    st = ucp_ep_create(worker, &ep_params, &ep);
    if (st != UCS_OK)
        die("ucp_ep_create (accept): %s", ucs_status_string(st));

    for (size_t s = 0; s < sizeof(SIZES) / sizeof(SIZES[0]); s++) {
        for (int r = 0; r < ROUNDS; r++) {
            size_t got = recv_tag(TAG_TO_SERVER, buf, 1 << 20, "a message from the client");
            verify(buf, got, SIZES[s], r, 0, "server received");
            fill(buf, SIZES[s], r, 1);
            send_tag(ep, TAG_TO_CLIENT, buf, SIZES[s], "the answer");
        }
    }
    printf("server: %zu sizes x %d round trips verified\n", sizeof(SIZES) / sizeof(SIZES[0]), ROUNDS);

    /* One-sided: expose RMA_SIZE bytes. */
    {
        ucp_mem_map_params_t mp;
        ucp_mem_h memh;
        ucp_mem_attr_t ma;
        void *rkey_buf;
        size_t rkey_len;
        struct rkey_msg *msg = calloc(1, sizeof(*msg)); /* not on the stack: softverbs registers no stack */
        uint8_t *region;
        uint8_t done;

        memset(&mp, 0, sizeof(mp));
        mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                        UCP_MEM_MAP_PARAM_FIELD_FLAGS;
        mp.address = NULL;
        mp.length = RMA_SIZE;
        mp.flags = UCP_MEM_MAP_ALLOCATE;
        st = ucp_mem_map(context, &mp, &memh);
        if (st != UCS_OK)
            die("ucp_mem_map: %s", ucs_status_string(st));
        ma.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS;
        st = ucp_mem_query(memh, &ma);
        if (st != UCS_OK)
            die("ucp_mem_query: %s", ucs_status_string(st));
        region = ma.address;
        fill(region, RMA_SIZE, 7, 2);
        st = ucp_rkey_pack(context, memh, &rkey_buf, &rkey_len);
        if (st != UCS_OK)
            die("ucp_rkey_pack: %s", ucs_status_string(st));
        if (msg == NULL)
            die("out of memory");
        if (rkey_len > sizeof(msg->rkey))
            die("packed rkey of %zu bytes", rkey_len);
        msg->address = (uint64_t)(uintptr_t)region;
        msg->rkey_len = rkey_len;
        memcpy(msg->rkey, rkey_buf, rkey_len);
        ucp_rkey_buffer_release(rkey_buf);
        send_tag(ep, TAG_RKEY, msg, sizeof(*msg), "the rkey");

        if (recv_tag(TAG_PUT_DONE, &done, sizeof(done), "the client's PUT") != 1)
            die("bad 'put done' message");
        /* The first half is untouched, the second is the client's. */
        for (size_t i = 0; i < RMA_SIZE / 2; i++)
            if (region[i] != pattern(RMA_SIZE, 7, 2, i))
                die("region: byte %zu of the first half changed to 0x%02x", i, region[i]);
        for (size_t i = 0; i < RMA_SIZE / 2; i++)
            if (region[RMA_SIZE / 2 + i] != pattern(RMA_SIZE / 2, 8, 3, i))
                die("PUT: byte %zu of the second half is 0x%02x, expected 0x%02x", i, region[RMA_SIZE / 2 + i],
                    pattern(RMA_SIZE / 2, 8, 3, i));
        printf("server: the client's GET and PUT of %d bytes verified\n", RMA_SIZE);
        send_tag(ep, TAG_BYE, &done, sizeof(done), "goodbye");
        ucp_mem_unmap(context, memh);
        free(msg);
    }

    print_ep(ep);
    /* The client closes first, after our goodbye; wait for its disconnect
     * (the error handler), then close ours. */
    closing = 1;
    while (!ep_failed) {
        ucp_worker_progress(worker);
        if (now() > deadline_s)
            die("timed out waiting for the client to disconnect");
    }
    printf("server: the client disconnected\n");
    close_ep(ep, 1);
    ucp_listener_destroy(listener);
    free(buf);
}

static void run_client(const char *addr, const char *port)
{
    ucp_ep_params_t ep_params;
    ucp_ep_h ep;
    ucs_status_t st;
    struct sockaddr_storage ss;
    socklen_t sslen;
    uint8_t *buf = malloc(1 << 20);
    if (buf == NULL)
        die("out of memory");

    resolve(addr, port, &ss, &sslen);
    memset(&ep_params, 0, sizeof(ep_params));
    ep_params.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR;
    ep_params.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
    ep_params.sockaddr.addr = (const struct sockaddr *)&ss;
    ep_params.sockaddr.addrlen = sslen;
    set_err_handler(&ep_params);
    st = ucp_ep_create(worker, &ep_params, &ep);
    if (st != UCS_OK)
        die("ucp_ep_create (connect to %s:%s): %s", addr, port, ucs_status_string(st));

    for (size_t s = 0; s < sizeof(SIZES) / sizeof(SIZES[0]); s++) {
        for (int r = 0; r < ROUNDS; r++) {
            size_t got;
            fill(buf, SIZES[s], r, 0);
            send_tag(ep, TAG_TO_SERVER, buf, SIZES[s], "a message to the server");
            memset(buf, 0, SIZES[s]);
            got = recv_tag(TAG_TO_CLIENT, buf, 1 << 20, "the server's answer");
            verify(buf, got, SIZES[s], r, 1, "client received");
        }
    }
    printf("client: %zu sizes x %d round trips verified\n", sizeof(SIZES) / sizeof(SIZES[0]), ROUNDS);

    {
        struct rkey_msg *msg = calloc(1, sizeof(*msg));
        ucp_rkey_h rkey;
        ucp_request_param_t p;
        uint8_t *local;
        ucp_mem_map_params_t mp;
        ucp_mem_h memh;
        uint8_t done = 1;

        if (msg == NULL)
            die("out of memory");
        if (recv_tag(TAG_RKEY, msg, sizeof(*msg), "the server's rkey") != sizeof(*msg))
            die("bad rkey message");
        st = ucp_ep_rkey_unpack(ep, msg->rkey, &rkey);
        if (st != UCS_OK)
            die("ucp_ep_rkey_unpack: %s", ucs_status_string(st));
        /* A registered local buffer, so that GET and PUT go zero-copy. */
        memset(&mp, 0, sizeof(mp));
        mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
        mp.address = buf;
        mp.length = RMA_SIZE;
        st = ucp_mem_map(context, &mp, &memh);
        if (st != UCS_OK)
            die("ucp_mem_map: %s", ucs_status_string(st));
        local = buf;
        memset(local, 0, RMA_SIZE);
        memset(&p, 0, sizeof(p));
        wait_req(ucp_get_nbx(ep, local, RMA_SIZE, msg->address, rkey, &p), "GET");
        verify(local, RMA_SIZE, RMA_SIZE, 7, 2, "GET");
        printf("client: GET of %d bytes verified\n", RMA_SIZE);

        fill(local, RMA_SIZE / 2, 8, 3);
        memset(&p, 0, sizeof(p));
        wait_req(ucp_put_nbx(ep, local, RMA_SIZE / 2, msg->address + RMA_SIZE / 2, rkey, &p), "PUT");
        memset(&p, 0, sizeof(p));
        wait_req(ucp_ep_flush_nbx(ep, &p), "flush after PUT");
        send_tag(ep, TAG_PUT_DONE, &done, sizeof(done), "'put done'");
        if (recv_tag(TAG_BYE, &done, sizeof(done), "the server's goodbye") != 1)
            die("bad goodbye");
        ucp_rkey_destroy(rkey);
        ucp_mem_unmap(context, memh);
        free(msg);
    }

    print_ep(ep);
    close_ep(ep, 0);
    printf("client: closed\n");
    free(buf);
}

/* Listens, refuses the first connection request, and waits a while for
 * the REJ to leave (progress only; nothing tells the server it has). */
static void run_reject(const char *port, const char *addr)
{
    ucp_listener_params_t lp;
    ucp_listener_h listener;
    ucs_status_t st;
    struct sockaddr_storage ss;
    socklen_t sslen;
    double until;

    resolve(addr, port, &ss, &sslen);
    memset(&lp, 0, sizeof(lp));
    lp.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
    lp.sockaddr.addr = (const struct sockaddr *)&ss;
    lp.sockaddr.addrlen = sslen;
    lp.conn_handler.cb = on_conn_request;
    lp.conn_handler.arg = &listener;
    st = ucp_listener_create(worker, &lp, &listener);
    if (st != UCS_OK)
        die("ucp_listener_create on port %s: %s", port, ucs_status_string(st));
    printf("reject: listening on port %s\n", port);
    while (conn_request == NULL) {
        ucp_worker_progress(worker);
        check_deadline("a connection request");
    }
    st = ucp_listener_reject(listener, conn_request);
    if (st != UCS_OK)
        die("ucp_listener_reject: %s", ucs_status_string(st));
    printf("reject: refused a connection request\n");
    until = now() + 1.0;
    while (now() < until)
        ucp_worker_progress(worker);
    ucp_listener_destroy(listener);
}

/* Connects and expects the endpoint to fail with WANT, before anything
 * is delivered. */
static void run_refused(const char *addr, const char *port, ucs_status_t want)
{
    ucp_ep_params_t ep_params;
    ucp_request_param_t p;
    ucs_status_ptr_t req;
    ucs_status_t st;
    ucp_ep_h ep;
    struct sockaddr_storage ss;
    socklen_t sslen;
    static uint8_t msg[64];

    resolve(addr, port, &ss, &sslen);
    memset(&ep_params, 0, sizeof(ep_params));
    ep_params.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR;
    ep_params.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
    ep_params.sockaddr.addr = (const struct sockaddr *)&ss;
    ep_params.sockaddr.addrlen = sslen;
    set_err_handler(&ep_params);
    st = ucp_ep_create(worker, &ep_params, &ep);
    if (st != UCS_OK)
        die("ucp_ep_create (connect to %s:%s): %s", addr, port, ucs_status_string(st));
    memset(&p, 0, sizeof(p));
    req = ucp_tag_send_nbx(ep, msg, sizeof(msg), TAG_TO_SERVER, &p);
    if (req == NULL)
        die("a send completed on an endpoint that should be refused");
    if (UCS_PTR_IS_ERR(req))
        die("ucp_tag_send_nbx: %s", ucs_status_string(UCS_PTR_STATUS(req)));
    closing = 1; /* the failure is expected */
    while (!ep_failed) {
        ucp_worker_progress(worker);
        check_deadline("the connection to be refused");
    }
    if (ep_status != want)
        die("the endpoint failed with \"%s\", expected \"%s\"", ucs_status_string(ep_status),
            ucs_status_string(want));
    while ((st = ucp_request_check_status(req)) == UCS_INPROGRESS) {
        ucp_worker_progress(worker);
        check_deadline("the pending send to fail");
    }
    ucp_request_free(req);
    if (st == UCS_OK)
        die("the pending send succeeded on a refused endpoint");
    printf("refused: the endpoint failed with \"%s\", the pending send with \"%s\"\n",
           ucs_status_string(ep_status), ucs_status_string(st));
    close_ep(ep, 1);
}

/* Accepts one connection and sends one message; then waits to be killed. */
static void run_hold(const char *port, const char *addr)
{
    ucp_listener_params_t lp;
    ucp_listener_h listener;
    ucp_ep_params_t ep_params;
    ucp_ep_h ep;
    ucs_status_t st;
    struct sockaddr_storage ss;
    socklen_t sslen;
    static uint8_t msg[64];

    resolve(addr, port, &ss, &sslen);
    memset(&lp, 0, sizeof(lp));
    lp.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
    lp.sockaddr.addr = (const struct sockaddr *)&ss;
    lp.sockaddr.addrlen = sslen;
    lp.conn_handler.cb = on_conn_request;
    lp.conn_handler.arg = &listener;
    st = ucp_listener_create(worker, &lp, &listener);
    if (st != UCS_OK)
        die("ucp_listener_create on port %s: %s", port, ucs_status_string(st));
    while (conn_request == NULL) {
        ucp_worker_progress(worker);
        check_deadline("a connection request");
    }
    memset(&ep_params, 0, sizeof(ep_params));
    ep_params.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST;
    ep_params.conn_request = conn_request;
    set_err_handler(&ep_params);
    st = ucp_ep_create(worker, &ep_params, &ep);
    if (st != UCS_OK)
        die("ucp_ep_create (accept): %s", ucs_status_string(st));
    fill(msg, sizeof(msg), 0, 1);
    send_tag(ep, TAG_TO_CLIENT, msg, sizeof(msg), "the message");
    printf("pid %ld\n", (long)getpid());
    for (;;) {
        ucp_worker_progress(worker);
        check_deadline("being killed");
    }
}

/* Connects, receives one message, then waits for the server to die. */
static void run_orphan(const char *addr, const char *port)
{
    ucp_ep_params_t ep_params;
    ucp_request_param_t p;
    ucs_status_ptr_t req;
    ucs_status_t st;
    ucp_ep_h ep;
    struct sockaddr_storage ss;
    socklen_t sslen;
    static uint8_t msg[64];
    double t0;

    resolve(addr, port, &ss, &sslen);
    memset(&ep_params, 0, sizeof(ep_params));
    ep_params.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR;
    ep_params.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
    ep_params.sockaddr.addr = (const struct sockaddr *)&ss;
    ep_params.sockaddr.addrlen = sslen;
    set_err_handler(&ep_params);
    st = ucp_ep_create(worker, &ep_params, &ep);
    if (st != UCS_OK)
        die("ucp_ep_create (connect to %s:%s): %s", addr, port, ucs_status_string(st));
    verify(msg, recv_tag(TAG_TO_CLIENT, msg, sizeof(msg), "the server's message"), sizeof(msg), 0, 1,
           "the server's message");
    printf("orphan: connected\n");
    /* A receive nothing will match: it stays pending while the peer dies. */
    memset(&p, 0, sizeof(p));
    req = ucp_tag_recv_nbx(worker, msg, sizeof(msg), TAG_BYE, (ucp_tag_t)-1, &p);
    if (req == NULL || UCS_PTR_IS_ERR(req))
        die("ucp_tag_recv_nbx did not stay pending");
    closing = 1; /* the failure is expected */
    t0 = now();
    while (!ep_failed) {
        ucp_worker_progress(worker);
        check_deadline("the endpoint to fail after the server's death");
    }
    printf("orphan: the endpoint failed after %.1f s: %s\n", now() - t0, ucs_status_string(ep_status));
    ucp_request_cancel(worker, req);
    while (ucp_request_check_status(req) == UCS_INPROGRESS) {
        ucp_worker_progress(worker);
        check_deadline("the receive to be cancelled");
    }
    ucp_request_free(req);
    close_ep(ep, 1);
}

int main(int argc, char **argv)
{
    const char *t = getenv("CM_PINGPONG_TIMEOUT");
    deadline_s = now() + (t ? atof(t) : 30.0);
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc >= 3 && strcmp(argv[1], "server") == 0) {
        role = "server";
        init_ucp();
        run_server(argv[2], argc >= 4 ? argv[3] : NULL);
    } else if (argc >= 4 && strcmp(argv[1], "client") == 0) {
        role = "client";
        init_ucp();
        run_client(argv[2], argv[3]);
    } else if (argc >= 3 && strcmp(argv[1], "reject") == 0) {
        role = "reject";
        init_ucp();
        run_reject(argv[2], argc >= 4 ? argv[3] : NULL);
    } else if (argc >= 5 && strcmp(argv[1], "refused") == 0 &&
               (strcmp(argv[4], "rejected") == 0 || strcmp(argv[4], "reset") == 0)) {
        role = "refused";
        init_ucp();
        run_refused(argv[2], argv[3],
                    strcmp(argv[4], "rejected") == 0 ? UCS_ERR_REJECTED : UCS_ERR_CONNECTION_RESET);
    } else if (argc >= 3 && strcmp(argv[1], "hold") == 0) {
        role = "hold";
        init_ucp();
        run_hold(argv[2], argc >= 4 ? argv[3] : NULL);
    } else if (argc >= 4 && strcmp(argv[1], "orphan") == 0) {
        role = "orphan";
        init_ucp();
        run_orphan(argv[2], argv[3]);
    } else {
        fprintf(stderr,
                "usage: %s server PORT [ADDRESS] | client ADDRESS PORT | reject PORT [ADDRESS] |\n"
                "       refused ADDRESS PORT rejected|reset | hold PORT [ADDRESS] | orphan ADDRESS PORT\n",
                argv[0]);
        return 2;
    }
    ucp_worker_destroy(worker);
    ucp_cleanup(context);
    printf("PASS %s\n", role);
    return 0;
}
