/* rpma_pingpong: a librpma (Debian's librpma 1.2, PMDK's RDMA library for
 * persistent memory) server and client over softverbs' librdmacm.so.1 and
 * libibverbs.so.1, used by compat.rpma.* (tests/compat/rpma.sh).
 *
 *   rpma_pingpong server ADDR PORT KIND SIZE
 *   rpma_pingpong client ADDR PORT SIZE
 *
 * The server maps SIZE bytes of memory of KIND (private: malloc'd;
 * shared: MAP_SHARED|MAP_ANONYMOUS; memfd: a memfd mapped MAP_SHARED;
 * shm: a POSIX shared memory object; sysv: a SysV segment; file: a file
 * in $TMPDIR mapped MAP_SHARED), fills it with a pattern, registers it with
 * rpma_mr_reg as READ_SRC|WRITE_DST|FLUSH_TYPE_VISIBILITY and hands its
 * descriptor to the client in the connection's private data. The client
 * reads the whole region (rpma_read), checks every byte, writes its
 * complement back (rpma_write), makes it visible (rpma_flush,
 * RPMA_FLUSH_TYPE_VISIBILITY) and disconnects. The server then checks every
 * byte of its memory, through a second mapping of the same memory where
 * KIND has one (so the write reached the memory, not a copy of it), and
 * prints "server PASS"; the client prints "client PASS".
 */
#define _GNU_SOURCE
#include <librpma.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ipc.h>
#include <sys/mman.h>
#include <sys/shm.h>
#include <unistd.h>

static int fail(const char *what, int ret) {
  fprintf(stderr, "rpma_pingpong: %s: %s\n", what, ret < 0 ? rpma_err_2str(ret) : strerror(ret));
  return 1;
}

static unsigned char pattern(size_t i) { return (unsigned char)(i * 7 + 3); }

/* Memory of KIND: *mem is the mapping registered, *view a second mapping of
 * the same memory (or *mem where KIND has none). */
static int map_kind(const char *kind, size_t size, unsigned char **mem, unsigned char **view) {
  int fd = -1;
  *view = NULL;
  if (!strcmp(kind, "private")) {
    if (posix_memalign((void **)mem, 4096, size)) return 1;
    *view = *mem;
    return 0;
  }
  if (!strcmp(kind, "shared")) {
    *mem = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    *view = *mem;
    return *mem == MAP_FAILED;
  }
  if (!strcmp(kind, "sysv")) {
    int id = shmget(IPC_PRIVATE, size, IPC_CREAT | 0600);
    if (id < 0) return 1;
    *mem = shmat(id, NULL, 0);
    *view = shmat(id, NULL, 0);
    shmctl(id, IPC_RMID, NULL);
    return *mem == (void *)-1 || *view == (void *)-1;
  }
  if (!strcmp(kind, "memfd")) {
    fd = memfd_create("rpma_pingpong", 0);
  } else if (!strcmp(kind, "shm")) {
    char name[64];
    snprintf(name, sizeof name, "/rpma_pingpong.%d", (int)getpid());
    fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
    shm_unlink(name);
  } else if (!strcmp(kind, "file")) {
    char path[4096];
    const char *dir = getenv("TMPDIR");
    snprintf(path, sizeof path, "%s/rpma_pingpong.XXXXXX", dir ? dir : "/tmp");
    fd = mkstemp(path);
    unlink(path);
  } else {
    fprintf(stderr, "rpma_pingpong: unknown memory kind %s\n", kind);
    return 1;
  }
  if (fd < 0 || ftruncate(fd, (off_t)size)) return 1;
  *mem = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  *view = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  return *mem == MAP_FAILED || *view == MAP_FAILED;
}

static int wait_event(struct rpma_conn *conn, enum rpma_conn_event want) {
  enum rpma_conn_event ev;
  int ret = rpma_conn_next_event(conn, &ev);
  if (ret) return fail("rpma_conn_next_event", ret);
  if (ev != want) {
    fprintf(stderr, "rpma_pingpong: connection event %s, expected %s\n", rpma_utils_conn_event_2str(ev),
            rpma_utils_conn_event_2str(want));
    return 1;
  }
  return 0;
}

/* Waits for the completion of op_context `ctx` on the connection's CQ. */
static int wait_completion(struct rpma_conn *conn, void *ctx) {
  struct rpma_cq *cq;
  struct ibv_wc wc;
  int ret = rpma_conn_get_cq(conn, &cq);
  if (ret) return fail("rpma_conn_get_cq", ret);
  for (;;) {
    ret = rpma_cq_wait(cq);
    if (ret) return fail("rpma_cq_wait", ret);
    ret = rpma_cq_get_wc(cq, 1, &wc, NULL);
    if (ret == RPMA_E_NO_COMPLETION) continue;
    if (ret) return fail("rpma_cq_get_wc", ret);
    if (wc.status != IBV_WC_SUCCESS) {
      fprintf(stderr, "rpma_pingpong: completion %s\n", ibv_wc_status_str(wc.status));
      return 1;
    }
    if ((void *)(uintptr_t)wc.wr_id == ctx) return 0;
  }
}

static int server(const char *addr, const char *port, const char *kind, size_t size) {
  struct ibv_context *dev;
  struct rpma_peer *peer;
  struct rpma_ep *ep;
  struct rpma_conn_req *req;
  struct rpma_conn *conn;
  struct rpma_mr_local *mr;
  unsigned char *mem, *view, desc[64];
  size_t desc_size;
  int ret;
  if (map_kind(kind, size, &mem, &view)) return fail("mapping the memory", 12);
  for (size_t i = 0; i < size; i++) mem[i] = pattern(i);
  if ((ret = rpma_utils_get_ibv_context(addr, RPMA_UTIL_IBV_CONTEXT_LOCAL, &dev))) return fail("get_ibv_context", ret);
  if ((ret = rpma_peer_new(dev, &peer))) return fail("rpma_peer_new", ret);
  ret = rpma_mr_reg(peer, mem, size, RPMA_MR_USAGE_READ_SRC | RPMA_MR_USAGE_WRITE_DST | RPMA_MR_USAGE_FLUSH_TYPE_VISIBILITY,
                    &mr);
  if (ret) return fail("rpma_mr_reg", ret);
  if ((ret = rpma_mr_get_descriptor_size(mr, &desc_size)) || desc_size > sizeof desc)
    return fail("rpma_mr_get_descriptor_size", ret);
  if ((ret = rpma_mr_get_descriptor(mr, desc))) return fail("rpma_mr_get_descriptor", ret);
  if ((ret = rpma_ep_listen(peer, addr, port, &ep))) return fail("rpma_ep_listen", ret);
  printf("server listening on %s:%s, %zu bytes of %s memory\n", addr, port, size, kind);
  fflush(stdout);
  if ((ret = rpma_ep_next_conn_req(ep, NULL, &req))) return fail("rpma_ep_next_conn_req", ret);
  struct rpma_conn_private_data pdata = {desc, (uint8_t)desc_size};
  if ((ret = rpma_conn_req_connect(&req, &pdata, &conn))) return fail("rpma_conn_req_connect", ret);
  if (wait_event(conn, RPMA_CONN_ESTABLISHED) || wait_event(conn, RPMA_CONN_CLOSED)) return 1;
  for (size_t i = 0; i < size; i++)
    if (view[i] != (unsigned char)~pattern(i)) {
      fprintf(stderr, "rpma_pingpong: server byte %zu is %#x, expected %#x\n", i, view[i], (unsigned char)~pattern(i));
      return 1;
    }
  if ((ret = rpma_conn_disconnect(conn)) && ret != RPMA_E_PROVIDER) return fail("rpma_conn_disconnect", ret);
  if ((ret = rpma_conn_delete(&conn))) return fail("rpma_conn_delete", ret);
  if ((ret = rpma_mr_dereg(&mr))) return fail("rpma_mr_dereg", ret);
  if ((ret = rpma_ep_shutdown(&ep)) || (ret = rpma_peer_delete(&peer))) return fail("shutdown", ret);
  printf("server PASS\n");
  return 0;
}

static int client(const char *addr, const char *port, size_t size) {
  struct ibv_context *dev;
  struct rpma_peer *peer;
  struct rpma_conn_req *req;
  struct rpma_conn *conn;
  struct rpma_mr_local *mr;
  struct rpma_mr_remote *remote;
  struct rpma_conn_private_data pdata;
  size_t remote_size;
  unsigned char *buf;
  int ret;
  if (posix_memalign((void **)&buf, 4096, size)) return fail("posix_memalign", 12);
  memset(buf, 0, size);
  if ((ret = rpma_utils_get_ibv_context(addr, RPMA_UTIL_IBV_CONTEXT_REMOTE, &dev))) return fail("get_ibv_context", ret);
  if ((ret = rpma_peer_new(dev, &peer))) return fail("rpma_peer_new", ret);
  if ((ret = rpma_mr_reg(peer, buf, size, RPMA_MR_USAGE_READ_DST | RPMA_MR_USAGE_WRITE_SRC, &mr)))
    return fail("rpma_mr_reg", ret);
  if ((ret = rpma_conn_req_new(peer, addr, port, NULL, &req))) return fail("rpma_conn_req_new", ret);
  if ((ret = rpma_conn_req_connect(&req, NULL, &conn))) return fail("rpma_conn_req_connect", ret);
  if (wait_event(conn, RPMA_CONN_ESTABLISHED)) return 1;
  if ((ret = rpma_conn_get_private_data(conn, &pdata))) return fail("rpma_conn_get_private_data", ret);
  if ((ret = rpma_mr_remote_from_descriptor(pdata.ptr, pdata.len, &remote))) return fail("mr_remote_from_descriptor", ret);
  if ((ret = rpma_mr_remote_get_size(remote, &remote_size)) || remote_size != size) {
    fprintf(stderr, "rpma_pingpong: the server's region is %zu bytes, expected %zu\n", remote_size, size);
    return 1;
  }
  static int op_read, op_write, op_flush;
  if ((ret = rpma_read(conn, mr, 0, remote, 0, size, RPMA_F_COMPLETION_ALWAYS, &op_read))) return fail("rpma_read", ret);
  if (wait_completion(conn, &op_read)) return 1;
  for (size_t i = 0; i < size; i++) {
    if (buf[i] != pattern(i)) {
      fprintf(stderr, "rpma_pingpong: client read byte %zu as %#x, expected %#x\n", i, buf[i], pattern(i));
      return 1;
    }
    buf[i] = (unsigned char)~buf[i];
  }
  if ((ret = rpma_write(conn, remote, 0, mr, 0, size, RPMA_F_COMPLETION_ON_ERROR, &op_write))) return fail("rpma_write", ret);
  ret = rpma_flush(conn, remote, 0, size, RPMA_FLUSH_TYPE_VISIBILITY, RPMA_F_COMPLETION_ALWAYS, &op_flush);
  if (ret) return fail("rpma_flush", ret);
  if (wait_completion(conn, &op_flush)) return 1;
  if ((ret = rpma_conn_disconnect(conn))) return fail("rpma_conn_disconnect", ret);
  if (wait_event(conn, RPMA_CONN_CLOSED)) return 1;
  if ((ret = rpma_conn_delete(&conn))) return fail("rpma_conn_delete", ret);
  if ((ret = rpma_mr_remote_delete(&remote)) || (ret = rpma_mr_dereg(&mr)) || (ret = rpma_peer_delete(&peer)))
    return fail("cleanup", ret);
  printf("client PASS\n");
  return 0;
}

int main(int argc, char **argv) {
  if (getenv("RPMA_PINGPONG_DEBUG")) {
    rpma_log_set_threshold(RPMA_LOG_THRESHOLD, RPMA_LOG_LEVEL_DEBUG);
    rpma_log_set_threshold(RPMA_LOG_THRESHOLD_AUX, RPMA_LOG_LEVEL_DEBUG);
  }
  if (argc == 6 && !strcmp(argv[1], "server")) return server(argv[2], argv[3], argv[4], strtoull(argv[5], NULL, 0));
  if (argc == 5 && !strcmp(argv[1], "client")) return client(argv[2], argv[3], strtoull(argv[4], NULL, 0));
  fprintf(stderr, "usage: rpma_pingpong server ADDR PORT private|shared|memfd|shm|sysv|file SIZE\n"
                  "       rpma_pingpong client ADDR PORT SIZE\n");
  return 2;
}
