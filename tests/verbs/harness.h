// harness.h: the pieces the verbs tests share. Tests talk to softverbs only
// through the public verbs API (our libibverbs.so.1 is linked in), and put a
// second party in a real process (Peer) that obeys simple commands sent over
// a socketpair: create resources, connect, post receives, poll, report its
// buffer. Every test binary uses its own daemon (SOFTVERBS_DIR, set in main).
#pragma once

#include <infiniband/verbs.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace svtest {

// One side's resources: device context, PD, CQ, RC QP and a registered buffer.
struct Side {
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  ibv_cq* cq = nullptr;
  ibv_qp* qp = nullptr;
  ibv_mr* mr = nullptr;
  uint8_t* buf = nullptr;
  size_t len = 0;

  struct Options {
    size_t len = 1 << 16;
    int mr_access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                    IBV_ACCESS_REMOTE_ATOMIC;
    int qp_access = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
    int cqe = 256;
    uint32_t max_wr = 64;
    uint8_t rnr_retry = 7;
    uint8_t retry_cnt = 7;
    uint8_t timeout = 14;
    uint8_t min_rnr_timer = 1;
    ibv_qp_type type = IBV_QPT_RC;
    uint32_t qkey = 0x1234;  // UD
    uint64_t send_ops = 0;   // non-zero: ibv_create_qp_ex with these IBV_QP_EX_WITH_* ops
  };

  int open(const Options& o);   // up to INIT; 0 or errno
  int connect(uint32_t dest_qpn, const Options& o);  // INIT -> RTR -> RTS
  void close();
  ~Side() { close(); }
};

// Polls `cq` until `n` completions arrived or `ms` passed.
std::vector<ibv_wc> poll(ibv_cq* cq, int n, int ms = 5000);

// The context's next async event within `ms` (its async fd made nonblocking).
bool next_event(ibv_context* c, ibv_async_event& ev, int ms);

// Packs the Side's QP and MR (in that order) over `sock` (svx_pack); 0 or errno.
int pack_qp_and_mr(int sock, ibv_context* ctx, ibv_qp* qp, ibv_mr* mr);

struct PeerInfo {
  uint32_t qpn;
  uint32_t rkey;
  uint64_t addr;
  uint64_t len;
};

// A second process holding its own Side.
class Peer {
 public:
  enum Op : uint32_t { kOpen = 1, kConnect, kPostRecv, kPoll, kFill, kChecksum, kReadByte, kExit, kToError, kRereg, kPost, kAtomics, kDereg, kLockLoop, kMcast, kRestart, kOdpOrphan, kAtomicWrites };
  struct Cmd {
    uint32_t op;
    uint32_t a;
    uint64_t b;
    uint64_t c;
    uint64_t d;
    uint32_t e;
    Side::Options opt;
  };
  struct Reply {
    int32_t status;
    uint32_t count;
    PeerInfo info;
    uint64_t value;
    ibv_wc wc[8];
  };

  Peer();
  ~Peer();
  PeerInfo open(const Side::Options& o = {});
  int connect(uint32_t dest_qpn, const Side::Options& o = {});
  // Posts `count` receives of `len` bytes each at offset `off`, consecutive.
  int post_recv(uint32_t count, uint64_t off, uint64_t len);
  std::vector<ibv_wc> poll(uint32_t n, int ms = 5000);
  void fill(uint8_t seed);          // buffer = pattern(seed)
  uint64_t checksum(uint64_t off, uint64_t len);
  int to_error();
  // `count` fetch-and-add(1) operations on the word at remote_addr, one at a time.
  int fetch_add(uint32_t count, uint64_t remote_addr, uint32_t rkey);
  // `count` ATOMIC WRITEs (IBTA annex A19, inline) of `a`, `b`, `a`, ...
  // to the word at remote_addr, one at a time.
  int atomic_writes(uint32_t count, uint64_t a, uint64_t b, uint64_t remote_addr, uint32_t rkey);
  int dereg();
  // `count` times: take a spinlock (CAS 0 -> 1 on lock_addr), read the counter
  // at counter_addr, write it back plus one, release the lock (CAS 1 -> 0).
  int lock_loop(uint32_t count, uint64_t lock_addr, uint64_t counter_addr, uint32_t rkey);
  // Posts one signaled work request from the peer's buffer [off, off+len) and
  // returns its completion. For *_WITH_INV, `rkey` is the key to invalidate.
  ibv_wc post(ibv_wr_opcode op, uint64_t off, uint32_t len, uint64_t remote_addr, uint32_t rkey);
  // ibv_rereg_mr on the peer's MR; CHANGE_TRANSLATION moves it to [off, off+len) of its buffer.
  PeerInfo rereg(int flags, int access, uint64_t off, uint64_t len, int* status);
  // The peer's QP to RESET and back up to RTS towards `dest_qpn`; 0 or errno.
  int restart(uint32_t dest_qpn);
  // ibv_attach_mcast (attach) or ibv_detach_mcast on the peer's QP; its result.
  int mcast(bool attach, const ibv_gid& gid, uint16_t lid);
  // ibv_reg_mr(NULL, SIZE_MAX, ON_DEMAND | local/remote write/read): an
  // implicit ODP MR of the peer; then the peer forks a child that inherits
  // its connection to the daemon and sleeps (its pid in *orphan). The key,
  // or 0 with *orphan the errno.
  uint32_t odp_orphan(pid_t* orphan);
  pid_t pid() const { return pid_; }
  void kill9();

 private:
  Reply call(const Cmd& c);
  pid_t pid_ = -1;
  int sock_ = -1;
};

// Moves any RC QP through INIT/RTR/RTS towards `dest` (remote read and
// write allowed). 0 or errno.
int connect_qp(ibv_qp* qp, uint32_t dest);

// Moves an RC QP to RESET, then up again as connect_qp does. 0 or errno.
int restart_qp(ibv_qp* qp, uint32_t dest);

// Opens `me` and `peer` and connects their QPs to each other; `info` gets
// the peer's QP and buffer. 0 or the first error.
int connect_pair(Side& me, Peer& peer, PeerInfo& info, const Side::Options& mine = {},
                 const Side::Options& theirs = {});

// Deterministic byte pattern.
inline uint8_t pattern(uint8_t seed, uint64_t i) { return uint8_t(seed * 131 + i * 7 + (i >> 8)); }
uint64_t checksum(const uint8_t* p, uint64_t len);

// Bounded exchange of one fixed-size value on a control socketpair between
// a test and its peer process.
template <class T>
bool put(int fd, const T& v) {
  return ::send(fd, &v, sizeof(T), MSG_NOSIGNAL) == ssize_t(sizeof(T));
}
template <class T>
bool get(int fd, T& v, int ms = 30000) {
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, ms) != 1) return false;
  return ::recv(fd, &v, sizeof(T), 0) == ssize_t(sizeof(T));
}

}  // namespace svtest
