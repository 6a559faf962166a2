/* rsocket_tcp.c: a TCP client and server that know nothing of RDMA, for
 * compat.rsocket.preload: under LD_PRELOAD=librspreload.so (rdma-core's
 * rsocket preload library) their socket calls become rsocket calls on our
 * librdmacm.so.1.
 *   rsocket_tcp server PORT          accept one client; read until EOF (poll
 *                                    or select first); answer "<bytes> <hash>\n"
 *   rsocket_tcp client PORT BYTES    connect (nonblocking, poll, SO_ERROR);
 *                                    send BYTES pseudo-random bytes
 *                                    (write and writev, varying sizes);
 *                                    shutdown(SHUT_WR); check the answer
 * The hash is 64-bit FNV-1a. Exit 0 when both sides agree. Both use
 * 127.0.0.1, or RSOCKET_TCP_ADDR (roce.netns.preload: between hosts). */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

static uint64_t fnv(uint64_t h, const unsigned char* p, size_t n) {
  for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ULL;
  return h;
}

/* 127.0.0.1, or the IPv4 address in RSOCKET_TCP_ADDR (between hosts). */
static struct sockaddr_in addr_of(int port) {
  struct sockaddr_in a;
  const char* host = getenv("RSOCKET_TCP_ADDR");
  memset(&a, 0, sizeof(a));
  a.sin_family = AF_INET;
  a.sin_port = htons((uint16_t)port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (host && *host && inet_pton(AF_INET, host, &a.sin_addr) != 1) {
    fprintf(stderr, "RSOCKET_TCP_ADDR: not an IPv4 address: %s\n", host);
    exit(2);
  }
  return a;
}

static int server(int port) {
  int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
  if (l < 0) return perror("socket"), 1;
  setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  struct sockaddr_in a = addr_of(port);
  if (bind(l, (struct sockaddr*)&a, sizeof(a)) || listen(l, 4)) return perror("bind/listen"), 1;
  int c = accept(l, NULL, NULL);
  if (c < 0) return perror("accept"), 1;
  setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  static unsigned char buf[100000];
  uint64_t h = 0xcbf29ce484222325ULL, total = 0;
  for (unsigned k = 0;; k++) {
    /* Wait with poll and select by turns (rpoll, rselect under the preload). */
    if (k % 2) {
      struct pollfd p = {c, POLLIN, 0};
      if (poll(&p, 1, 20000) != 1) return fprintf(stderr, "server: poll timed out\n"), 1;
    } else {
      fd_set rd;
      FD_ZERO(&rd);
      FD_SET(c, &rd);
      struct timeval tv = {20, 0};
      if (select(c + 1, &rd, NULL, NULL, &tv) != 1 || !FD_ISSET(c, &rd))
        return fprintf(stderr, "server: select timed out\n"), 1;
    }
    ssize_t n = read(c, buf, 1 + (size_t)(total % sizeof(buf)));
    if (n < 0) return perror("read"), 1;
    if (n == 0) break;
    h = fnv(h, buf, (size_t)n);
    total += (uint64_t)n;
  }
  char msg[64];
  int len = snprintf(msg, sizeof(msg), "%llu %016llx\n", (unsigned long long)total, (unsigned long long)h);
  if (write(c, msg, (size_t)len) != len) return perror("write"), 1;
  printf("server: %llu bytes hash %016llx\n", (unsigned long long)total, (unsigned long long)h);
  close(c);
  close(l);
  return 0;
}

static int client(int port, uint64_t bytes) {
  int s = socket(AF_INET, SOCK_STREAM, 0);
  if (s < 0) return perror("socket"), 1;
  struct sockaddr_in a = addr_of(port);
  /* A nonblocking connect, as event-driven programs do: EINPROGRESS, then
   * POLLOUT and SO_ERROR; then back to blocking calls. */
  int fl = fcntl(s, F_GETFL);
  if (fl < 0 || fcntl(s, F_SETFL, fl | O_NONBLOCK)) return perror("fcntl"), 1;
  if (connect(s, (struct sockaddr*)&a, sizeof(a))) {
    if (errno != EINPROGRESS) return perror("connect"), 1;
    struct pollfd p = {s, POLLOUT, 0};
    if (poll(&p, 1, 20000) != 1) return fprintf(stderr, "client: connect timed out\n"), 1;
  }
  int err = -1;
  socklen_t len = sizeof(err);
  if (getsockopt(s, SOL_SOCKET, SO_ERROR, &err, &len) || err) return fprintf(stderr, "client: connect: %s\n", strerror(err)), 1;
  if (fcntl(s, F_SETFL, fl)) return perror("fcntl"), 1;
  static unsigned char buf[300000];
  uint64_t h = 0xcbf29ce484222325ULL, sent = 0, x = 88172645463325252ULL;
  for (size_t i = 0; i < sizeof(buf); i++) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    buf[i] = (unsigned char)x;
  }
  for (unsigned k = 0; sent < bytes; k++) {
    size_t want = 1 + (size_t)((k * 7919u) % sizeof(buf) / 2);
    if (want > bytes - sent) want = (size_t)(bytes - sent);
    const unsigned char* p = buf + (k * 31u) % (sizeof(buf) / 2);
    ssize_t n;
    if (k % 2) {
      struct iovec v[2] = {{(void*)p, want / 2}, {(void*)(p + want / 2), want - want / 2}};
      n = writev(s, v, 2);
    } else {
      n = write(s, p, want);
    }
    if (n <= 0) return perror("write"), 1;
    h = fnv(h, p, (size_t)n);
    sent += (uint64_t)n;
  }
  if (shutdown(s, SHUT_WR)) return perror("shutdown"), 1;
  char msg[64] = {0}, want[64];
  size_t got = 0;
  while (got < sizeof(msg) - 1) {
    ssize_t n = read(s, msg + got, sizeof(msg) - 1 - got);
    if (n < 0) return perror("read"), 1;
    if (n == 0) break;
    got += (size_t)n;
  }
  snprintf(want, sizeof(want), "%llu %016llx\n", (unsigned long long)sent, (unsigned long long)h);
  close(s);
  if (strcmp(msg, want)) return fprintf(stderr, "client: server says '%s', expected '%s'\n", msg, want), 1;
  printf("client: OK %llu bytes hash %016llx\n", (unsigned long long)sent, (unsigned long long)h);
  return 0;
}

int main(int argc, char** argv) {
  if (argc == 3 && !strcmp(argv[1], "server")) return server(atoi(argv[2]));
  if (argc == 4 && !strcmp(argv[1], "client")) return client(atoi(argv[2]), strtoull(argv[3], NULL, 0));
  fprintf(stderr, "usage: rsocket_tcp server PORT | client PORT BYTES\n");
  return 2;
}
