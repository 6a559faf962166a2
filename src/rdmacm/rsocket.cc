// rsocket.cc: the rsocket API (rsocket(7)). No rsocket can be created
// here yet (rsocket() fails with ENOSYS), so every descriptor a program
// holds is an ordinary one: rpoll and rselect are poll(2) and select(2),
// which is exactly what rdma-core's examples (rping, ucmatose, udaddy) use
// them for; every call on an rsocket fails with ENOSYS.
#include <poll.h>
#include <rdma/rsocket.h>
#include <sys/select.h>

#include <cerrno>

namespace {
int nosys() {
  errno = ENOSYS;
  return -1;
}
}  // namespace

extern "C" {

int rsocket(int, int, int) { return nosys(); }
int rbind(int, const sockaddr*, socklen_t) { return nosys(); }
int rlisten(int, int) { return nosys(); }
int raccept(int, sockaddr*, socklen_t*) { return nosys(); }
int rconnect(int, const sockaddr*, socklen_t) { return nosys(); }
int rshutdown(int, int) { return nosys(); }
int rclose(int) { return nosys(); }
ssize_t rrecv(int, void*, size_t, int) { return nosys(); }
ssize_t rrecvfrom(int, void*, size_t, int, sockaddr*, socklen_t*) { return nosys(); }
ssize_t rrecvmsg(int, msghdr*, int) { return nosys(); }
ssize_t rsend(int, const void*, size_t, int) { return nosys(); }
ssize_t rsendto(int, const void*, size_t, int, const sockaddr*, socklen_t) { return nosys(); }
ssize_t rsendmsg(int, const msghdr*, int) { return nosys(); }
ssize_t rread(int, void*, size_t) { return nosys(); }
ssize_t rreadv(int, const iovec*, int) { return nosys(); }
ssize_t rwrite(int, const void*, size_t) { return nosys(); }
ssize_t rwritev(int, const iovec*, int) { return nosys(); }
int rpoll(pollfd* fds, nfds_t nfds, int timeout) { return ::poll(fds, nfds, timeout); }
int rselect(int nfds, fd_set* r, fd_set* w, fd_set* e, timeval* t) { return ::select(nfds, r, w, e, t); }
int rgetpeername(int, sockaddr*, socklen_t*) { return nosys(); }
int rgetsockname(int, sockaddr*, socklen_t*) { return nosys(); }
int rsetsockopt(int, int, int, const void*, socklen_t) { return nosys(); }
int rgetsockopt(int, int, int, void*, socklen_t*) { return nosys(); }
int rfcntl(int, int, ...) { return nosys(); }
off_t riomap(int, void*, size_t, int, int, off_t) { return nosys(); }
int riounmap(int, void*, size_t) { return nosys(); }
size_t riowrite(int, const void*, size_t, off_t, int) {
  errno = ENOSYS;
  return 0;
}

}  // extern "C"
