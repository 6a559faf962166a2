// rsocket_internal.h: the state of one rsocket, shared by rsocket.cc (the
// socket calls), rsocket_stream.cc (endpoint, completions, data path),
// rsocket_poll.cc (rpoll/rselect) and rsocket_opts.cc (options, iomap).
//
// An rsocket's descriptor is the fd of its own rdma_cm event channel (as in
// rdma-core): a real eventfd, readable when a CM event waits. A connected
// rsocket also has a completion channel (an eventfd) for its one CQ; rpoll
// sleeps in poll(2) on those two fds after arming the CQ.
//
// Locking: one mutex per rsocket, held by every call on it; a blocking call
// drops it while it sleeps (so rrecv in one thread and rsend in another both
// progress, as rdma-core's two-lock scheme allows).
#pragma once

#include <fcntl.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <sys/socket.h>

#include <deque>
#include <mutex>
#include <vector>

#include "rdmacm/rsocket_proto.h"

namespace sv::rsock {

enum class St {
  kInit,
  kBound,
  kListening,
  kResolvingAddr,
  kResolvingRoute,
  kConnecting,
  kConnected,     // readable/writable say which directions are still open
  kConnectError,  // err holds why
  kDisconnected,
  kError,  // err holds why
};

// A registration announced to the peer (riomap with PROT_WRITE), or kept
// local (index -1).
struct IoMr {
  ibv_mr* mr = nullptr;
  uint64_t offset = 0;
  int index = -1;
  bool sent = false;
};

struct Ds;  // rsocket_dgram.cc

struct Rs {
  int fd = -1;
  int type = SOCK_STREAM;
  int domain = AF_INET;
  std::mutex mu;
  rdma_event_channel* ch = nullptr;
  rdma_cm_id* id = nullptr;
  St state = St::kInit;
  bool readable = false, writable = false;
  int err = 0;
  int fs_flags = 0, fd_flags = 0;
  std::deque<rdma_cm_event*> requests;  // a listener's pending CONNECT_REQUESTs
  Ds* ds = nullptr;  // SOCK_DGRAM

  // Options (SOL_SOCKET/IPPROTO_TCP bits by option number, as rdma-core).
  uint64_t so_opts = 0, tcp_opts = 0, ipv6_opts = 0;
  uint32_t sbuf_size = kDefMem, rbuf_size = kDefMem;
  uint16_t sq_size = kDefQpSize, rq_size = kDefQpSize, sq_inline = kDefInline;
  uint16_t iomap_size = 0;
  int keepalive_time = 0;

  // The endpoint.
  ibv_comp_channel* cc = nullptr;
  ibv_cq* cq = nullptr;
  bool cq_armed = false;
  unsigned unacked = 0;
  // Threads asleep in wait_for, and the eventfd that wakes them when another
  // thread took the completions they waited for (both sleep on the same
  // channels, and only one reads each event).
  int waiters = 0;
  int wakefd = -1;
  uint8_t* sbuf = nullptr;  // sbuf_size + the control area
  uint8_t* rbuf = nullptr;
  uint8_t* tbuf = nullptr;  // target SGL (kSglSize Sge) + iomap table
  ibv_mr *smr = nullptr, *rmr = nullptr, *tmr = nullptr;

  // Flow control (rsocket.c's names).
  uint32_t ctrl_seqno = 0, ctrl_max_seqno = kQpCtrlSize;
  uint16_t sseq_no = 0, sseq_comp = 0;
  int sqe_avail = 0;
  uint32_t sbuf_avail = 0, spos = 0;
  int target_sge = 0;  // the entry of our target SGL we write into next
  Sge remote_sgl{}, remote_iomap{};
  int remote_sge = 0;  // the peer's target SGL entry we grant into next
  bool swap = false;
  RecvRing ring;
  std::vector<IoMr> iomaps;  // ours
  bool iomap_pending = false;

  volatile Sge* target_sgl() { return reinterpret_cast<volatile Sge*>(tbuf); }
  volatile Iomap* target_iomap() { return reinterpret_cast<volatile Iomap*>(tbuf + kSglSize * sizeof(Sge)); }
  bool connected() const { return state == St::kConnected; }
  bool opening() const {
    return state == St::kResolvingAddr || state == St::kResolvingRoute || state == St::kConnecting;
  }
  bool nonblock(int flags) const { return (fs_flags & O_NONBLOCK) || (flags & MSG_DONTWAIT); }
};

// The table of rsockets by descriptor.
Rs* lookup(int fd);
void insert(Rs* rs);
void remove(Rs* rs);

int seterr(int e);  // errno = e, -1

// rsocket_stream.cc
Rs* alloc_rs(const Rs* inherit, int domain);
int create_ep(Rs* rs);
void free_rs(Rs* rs);
ConnInfo my_conn_info(Rs* rs);
void save_conn(Rs* rs, const ConnInfo& peer);
// Process completions (and, if `slow`, CM events: a read(2) each) without
// sleeping; returns -1 (errno) only if a post failed.
int progress(Rs* rs, bool slow);
int64_t now_us();

// rsocket.c's rs_configure: the defaults, from /etc/rdma/rsocket/* as
// rdma-core reads them (polling_time, inline_default, sqsize_default,
// rqsize_default, mem_default, wmem_default, iomap_size), read once.
struct Config {
  // How long a blocking call or rpoll polls before it sleeps. rsocket.c's
  // default is 10 us, for hardware whose interrupt wakes the sleeper in a
  // few microseconds; softverbs' wake-up is another process's eventfd
  // write, which costs a VM 50-250 us, and a 64 KiB ping-pong (each side
  // copies 64 KiB and returns a credit: over 10 us) slept every time:
  // rstream 64k latency 518 us/xfer at 10 us, 53 at 200 (bench/rsocket.py,
  // docs/RDMACM.md). /etc/rdma/rsocket/polling_time still overrides it.
  int64_t polling_us = 100;
  uint16_t inline_size = kDefInline, sq_size = kDefQpSize, rq_size = kDefQpSize, iomap_size = 0;
  uint32_t mem = kDefMem, wmem = kDefMem;
};
const Config& config();
// Waits (mu held through `lk`) until test(rs) holds; -1 EWOULDBLOCK when
// nonblocking, -1 with errno on failure.
int wait_for(Rs* rs, std::unique_lock<std::mutex>& lk, bool nonblock, bool (*test)(Rs*));
bool can_send(Rs* rs);
bool conn_can_send(Rs* rs);
bool conn_have_rdata(Rs* rs);
bool ctrl_avail(Rs* rs);
int post_ctrl(Rs* rs, uint32_t ctrl);
bool all_sends_done(Rs* rs);
ssize_t stream_send(Rs* rs, std::unique_lock<std::mutex>& lk, const iovec* iov, int iovcnt, int flags);
ssize_t stream_recv(Rs* rs, std::unique_lock<std::mutex>& lk, void* buf, size_t len, int flags);
int send_iomaps(Rs* rs, std::unique_lock<std::mutex>& lk, int flags);
int post_write(Rs* rs, const ibv_sge* sg, int n, uint32_t wr_msg, uint64_t addr, uint32_t rkey, bool imm, int flags);
// Copies user data into the send ring and posts it (DATA or riowrite).
int copy_and_post(Rs* rs, const iovec** iov, size_t* off, uint32_t len, uint32_t msg, uint64_t addr, uint32_t rkey, bool imm);

// rsocket.cc
int advance_connect(Rs* rs, std::unique_lock<std::mutex>& lk, bool nonblock);
int poll_listener(Rs* rs);  // drains CM events into rs->requests; their count

// rsocket_dgram.cc (SOCK_DGRAM over UD)
int ds_socket(Rs* rs);
void ds_free(Rs* rs);
int ds_bind(Rs* rs, const sockaddr* a, socklen_t len);
int ds_connect(Rs* rs, const sockaddr* a, socklen_t len);
int ds_name(Rs* rs, sockaddr* a, socklen_t* len, bool peer);
int ds_setsockopt(Rs* rs, int level, int optname, const void* v, socklen_t len);
int ds_getsockopt(Rs* rs, int level, int optname, void* v, socklen_t* len);
ssize_t ds_send(Rs* rs, std::unique_lock<std::mutex>& lk, const iovec* iov, int iovcnt, int flags, const sockaddr* to);
ssize_t ds_recv(Rs* rs, std::unique_lock<std::mutex>& lk, void* buf, size_t len, int flags, sockaddr* from,
                socklen_t* fromlen);
int wait_ds(Rs* rs, std::unique_lock<std::mutex>& lk, bool nonblock, bool (*test)(Rs*));
// A datagram rsocket's revents; if none and `wait`, its fds to sleep on.
short ds_revents(Rs* rs, short events, std::vector<pollfd>* wait);

// rsocket_poll.cc
// The revents of an rsocket now (mu held through lk); its fds to sleep on
// go to `wait` (the CQ armed first).
short poll_revents(Rs* rs, std::unique_lock<std::mutex>& lk, short events, bool slow);

}  // namespace sv::rsock
