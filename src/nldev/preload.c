/* libsoftverbs_netlink.so: the RDMA netlink stand-in's shim, which
 * `softverbs run` (and a CDI container's environment) puts on LD_PRELOAD.
 * A program that opens socket(AF_NETLINK, *, NETLINK_RDMA) (iproute2's
 * `rdma`, through libmnl) gets a descriptor of a local datagram socket
 * pair instead; what it sends there is answered by libsoftverbs_nldev.so
 * (nldev.h), loaded from this file's directory at the first such socket,
 * and what it then receives is that answer, one netlink message per read,
 * with a netlink source address. Every other socket, and every call on
 * another descriptor, goes to the C library untouched. Written in C so
 * that the one file every program under `softverbs run` loads needs
 * nothing but the C library.
 *
 * The calls libmnl makes on the socket (libmnl's socket.c: socket, bind,
 * getsockname, setsockopt, sendto, recvmsg, close) and their plain
 * siblings (send, sendmsg, recv, recvfrom, getsockopt) are answered as
 * netlink(7) describes them. Answers are made when the request is sent, so
 * a read with nothing left returns EAGAIN rather than waiting for ever. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/netlink.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#define SV_EXPORT __attribute__((visibility("default")))
#define SV_MAX_SOCKETS 64

struct sv_msg {
  struct sv_msg* next;
  size_t len;
  char data[];
};

struct sv_nlsock {
  int fd;      /* what the program holds (-1: free) */
  int peer;    /* the other end: one byte written per queued message, for poll(2) */
  uint32_t portid;
  struct sv_msg *head, *tail;
};

typedef int (*answer_fn)(const void*, size_t, uint32_t, void (*)(void*, const void*, size_t), void*);

/* Recursive: answering a request makes socket calls of its own (to the
 * daemon, getifaddrs' netlink), which come back through this file. */
static pthread_mutex_t g_lock = PTHREAD_RECURSIVE_MUTEX_INITIALIZER_NP;
static struct sv_nlsock g_socks[SV_MAX_SOCKETS];
static int g_used;
static uint32_t g_next_portid;
static answer_fn g_answer;

/* The C library's function `name`, looked up once. */
#define REAL(name)                                                            \
  ({                                                                          \
    static __typeof__(&name) real_;                                           \
    __typeof__(&name) p_ = __atomic_load_n(&real_, __ATOMIC_RELAXED);         \
    if (!p_) {                                                                \
      p_ = (__typeof__(&name))dlsym(RTLD_NEXT, #name);                        \
      __atomic_store_n(&real_, p_, __ATOMIC_RELAXED);                         \
    }                                                                         \
    p_;                                                                       \
  })
/* No netlink stand-in socket was ever made: every call goes straight through. */
#define NONE_YET() (__atomic_load_n(&g_used, __ATOMIC_RELAXED) == 0)

/* The socket entry of `fd`, or NULL (the caller holds g_lock). */
static struct sv_nlsock* find(int fd) {
  for (int i = 0; i < g_used; ++i)
    if (g_socks[i].fd == fd) return &g_socks[i];
  return NULL;
}

/* libsoftverbs_nldev.so, beside this file; NULL (with the reason on
 * stderr) if it cannot be loaded. */
static answer_fn load_answer(void) {
  if (g_answer) return g_answer;
  Dl_info info;
  char path[4096];
  if (!dladdr((void*)&load_answer, &info) || !info.dli_fname) return NULL;
  const char* slash = strrchr(info.dli_fname, '/');
  int dir = slash ? (int)(slash - info.dli_fname) : 1;
  snprintf(path, sizeof path, "%.*s/libsoftverbs_nldev.so", dir, slash ? info.dli_fname : ".");
  void* h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    fprintf(stderr, "softverbs: RDMA netlink stand-in unavailable: %s\n", dlerror());
    return NULL;
  }
  g_answer = (answer_fn)dlsym(h, "sv_nldev_answer");
  if (!g_answer) fprintf(stderr, "softverbs: RDMA netlink stand-in unavailable: %s has no sv_nldev_answer\n", path);
  return g_answer;
}

SV_EXPORT int socket(int domain, int type, int protocol) {
  if (domain != AF_NETLINK || protocol != NETLINK_RDMA) return REAL(socket)(domain, type, protocol);
  pthread_mutex_lock(&g_lock);
  int fds[2] = {-1, -1};
  struct sv_nlsock* s = NULL;
  int err = 0;
  if (!load_answer()) {
    err = EPROTONOSUPPORT;
  } else if (socketpair(AF_UNIX, SOCK_DGRAM | (type & (SOCK_CLOEXEC | SOCK_NONBLOCK)), 0, fds) != 0) {
    err = errno;
  } else {
    s = find(-1); /* a slot freed by close */
    if (!s && g_used < SV_MAX_SOCKETS) s = &g_socks[g_used];
    if (!s) err = EMFILE;
  }
  if (err) {
    if (fds[0] >= 0) REAL(close)(fds[0]), REAL(close)(fds[1]);
    pthread_mutex_unlock(&g_lock);
    errno = err;
    return -1;
  }
  /* The kernel gives the first socket the process id, later ones
   * negative numbers. */
  s->fd = fds[0];
  s->peer = fds[1];
  s->portid = g_next_portid++ == 0 ? (uint32_t)getpid() : (uint32_t)(-4096 - (int32_t)g_next_portid);
  s->head = s->tail = NULL;
  if (s == &g_socks[g_used]) __atomic_store_n(&g_used, g_used + 1, __ATOMIC_RELEASE);
  pthread_mutex_unlock(&g_lock);
  return fds[0];
}

SV_EXPORT int bind(int fd, const struct sockaddr* addr, socklen_t len) {
  if (NONE_YET()) return REAL(bind)(fd, addr, len);
  pthread_mutex_lock(&g_lock);
  struct sv_nlsock* s = find(fd);
  if (s && addr && len >= sizeof(struct sockaddr_nl)) {
    const struct sockaddr_nl* nl = (const struct sockaddr_nl*)addr;
    if (nl->nl_pid) s->portid = nl->nl_pid;
  }
  pthread_mutex_unlock(&g_lock);
  return s ? 0 : REAL(bind)(fd, addr, len);
}

SV_EXPORT int getsockname(int fd, struct sockaddr* addr, socklen_t* len) {
  if (NONE_YET()) return REAL(getsockname)(fd, addr, len);
  pthread_mutex_lock(&g_lock);
  struct sv_nlsock* s = find(fd);
  uint32_t portid = s ? s->portid : 0;
  pthread_mutex_unlock(&g_lock);
  if (!s) return REAL(getsockname)(fd, addr, len);
  struct sockaddr_nl nl = {.nl_family = AF_NETLINK, .nl_pid = portid};
  if (!len) return errno = EFAULT, -1;
  memcpy(addr, &nl, *len < sizeof nl ? *len : sizeof nl);
  *len = sizeof nl;
  return 0;
}

/* NETLINK_CAP_ACK, NETLINK_EXT_ACK and the rest of SOL_NETLINK: taken
 * (answers always carry capped acknowledgements). */
SV_EXPORT int setsockopt(int fd, int level, int name, const void* val, socklen_t len) {
  if (level == SOL_NETLINK && !NONE_YET()) {
    pthread_mutex_lock(&g_lock);
    struct sv_nlsock* s = find(fd);
    pthread_mutex_unlock(&g_lock);
    if (s) return 0;
  }
  return REAL(setsockopt)(fd, level, name, val, len);
}

SV_EXPORT int getsockopt(int fd, int level, int name, void* val, socklen_t* len) {
  if (level == SOL_NETLINK && !NONE_YET()) {
    pthread_mutex_lock(&g_lock);
    struct sv_nlsock* s = find(fd);
    pthread_mutex_unlock(&g_lock);
    if (s) {
      if (!len || *len < (socklen_t)sizeof(int)) return errno = EINVAL, -1;
      *(int*)val = name == NETLINK_CAP_ACK;
      *len = sizeof(int);
      return 0;
    }
  }
  return REAL(getsockopt)(fd, level, name, val, len);
}

static void queue_message(void* arg, const void* data, size_t len) {
  struct sv_nlsock* s = arg;
  struct sv_msg* m = malloc(sizeof *m + len);
  if (!m) return;
  m->next = NULL;
  m->len = len;
  memcpy(m->data, data, len);
  if (s->tail) s->tail->next = m;
  else s->head = m;
  s->tail = m;
  char one = 1;
  (void)REAL(send)(s->peer, &one, 1, MSG_DONTWAIT | MSG_NOSIGNAL);
}

/* A request sent: its answers are queued. */
static ssize_t nl_send(struct sv_nlsock* s, const struct iovec* iov, size_t n) {
  size_t total = 0;
  for (size_t i = 0; i < n; ++i) total += iov[i].iov_len;
  char* buf = malloc(total ? total : 1);
  if (!buf) return errno = ENOBUFS, -1;
  size_t at = 0;
  for (size_t i = 0; i < n; ++i) memcpy(buf + at, iov[i].iov_base, iov[i].iov_len), at += iov[i].iov_len;
  g_answer(buf, total, s->portid, queue_message, s);
  free(buf);
  return (ssize_t)total;
}

/* One message to the program: copied into iov (MSG_TRUNC when it does not
 * fit), consumed unless MSG_PEEK; the source address is the kernel's. */
static ssize_t nl_recv(struct sv_nlsock* s, const struct iovec* iov, size_t n, int flags, struct sockaddr* from,
                       socklen_t* fromlen, int* msg_flags) {
  struct sv_msg* m = s->head;
  if (!m) return errno = EAGAIN, -1;
  size_t at = 0;
  for (size_t i = 0; i < n && at < m->len; ++i) {
    size_t k = m->len - at < iov[i].iov_len ? m->len - at : iov[i].iov_len;
    memcpy(iov[i].iov_base, m->data + at, k);
    at += k;
  }
  if (msg_flags) *msg_flags = at < m->len ? MSG_TRUNC : 0;
  if (from && fromlen) {
    struct sockaddr_nl nl = {.nl_family = AF_NETLINK};
    memcpy(from, &nl, *fromlen < sizeof nl ? *fromlen : sizeof nl);
    *fromlen = sizeof nl;
  }
  ssize_t r = (ssize_t)((flags & MSG_TRUNC) ? m->len : at);
  if (!(flags & MSG_PEEK)) {
    s->head = m->next;
    if (!s->head) s->tail = NULL;
    free(m);
    char one;
    (void)REAL(recv)(s->fd, &one, 1, MSG_DONTWAIT);
  }
  return r;
}

SV_EXPORT ssize_t sendmsg(int fd, const struct msghdr* msg, int flags) {
  if (NONE_YET()) return REAL(sendmsg)(fd, msg, flags);
  pthread_mutex_lock(&g_lock);
  struct sv_nlsock* s = find(fd);
  ssize_t r = s ? nl_send(s, msg->msg_iov, msg->msg_iovlen) : 0;
  pthread_mutex_unlock(&g_lock);
  return s ? r : REAL(sendmsg)(fd, msg, flags);
}

SV_EXPORT ssize_t sendto(int fd, const void* buf, size_t len, int flags, const struct sockaddr* to, socklen_t tolen) {
  if (NONE_YET()) return REAL(sendto)(fd, buf, len, flags, to, tolen);
  pthread_mutex_lock(&g_lock);
  struct sv_nlsock* s = find(fd);
  struct iovec iov = {(void*)buf, len};
  ssize_t r = s ? nl_send(s, &iov, 1) : 0;
  pthread_mutex_unlock(&g_lock);
  return s ? r : REAL(sendto)(fd, buf, len, flags, to, tolen);
}

SV_EXPORT ssize_t send(int fd, const void* buf, size_t len, int flags) {
  if (NONE_YET()) return REAL(send)(fd, buf, len, flags);
  return sendto(fd, buf, len, flags, NULL, 0);
}

SV_EXPORT ssize_t recvmsg(int fd, struct msghdr* msg, int flags) {
  if (NONE_YET()) return REAL(recvmsg)(fd, msg, flags);
  pthread_mutex_lock(&g_lock);
  struct sv_nlsock* s = find(fd);
  ssize_t r = 0;
  if (s) {
    socklen_t nl = msg->msg_namelen;
    r = nl_recv(s, msg->msg_iov, msg->msg_iovlen, flags, msg->msg_name, msg->msg_name ? &nl : NULL,
                &msg->msg_flags);
    if (msg->msg_name) msg->msg_namelen = nl;
    msg->msg_controllen = 0;
  }
  pthread_mutex_unlock(&g_lock);
  return s ? r : REAL(recvmsg)(fd, msg, flags);
}

SV_EXPORT ssize_t recvfrom(int fd, void* buf, size_t len, int flags, struct sockaddr* from, socklen_t* fromlen) {
  if (NONE_YET()) return REAL(recvfrom)(fd, buf, len, flags, from, fromlen);
  pthread_mutex_lock(&g_lock);
  struct sv_nlsock* s = find(fd);
  struct iovec iov = {buf, len};
  ssize_t r = s ? nl_recv(s, &iov, 1, flags, from, fromlen, NULL) : 0;
  pthread_mutex_unlock(&g_lock);
  return s ? r : REAL(recvfrom)(fd, buf, len, flags, from, fromlen);
}

SV_EXPORT ssize_t recv(int fd, void* buf, size_t len, int flags) {
  if (NONE_YET()) return REAL(recv)(fd, buf, len, flags);
  return recvfrom(fd, buf, len, flags, NULL, NULL);
}

SV_EXPORT int close(int fd) {
  if (NONE_YET()) return REAL(close)(fd);
  pthread_mutex_lock(&g_lock);
  struct sv_nlsock* s = find(fd);
  if (s) {
    while (s->head) {
      struct sv_msg* m = s->head;
      s->head = m->next;
      free(m);
    }
    s->tail = NULL;
    REAL(close)(s->peer);
    s->fd = s->peer = -1;
  }
  pthread_mutex_unlock(&g_lock);
  return REAL(close)(fd);
}
