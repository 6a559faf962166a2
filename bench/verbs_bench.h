// verbs_bench.h: what the files of verbs_bench share. verbs_bench.cc: the
// options and the two processes; verbs_bench_rdma.cc: the RC QP pair, its
// socket and completions; verbs_bench_tests.cc: the tests.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>
#include <string>
#include <vector>

#include "bench_common.h"

namespace verbs_bench {

constexpr unsigned kInline = IBV_SEND_INLINE;
constexpr unsigned kSignaled = IBV_SEND_SIGNALED;

enum class Test { WriteLat, WriteBw, SendLat, Verify, ReadLat, ReadBw, SendBw };

inline bool is_bw(Test t) { return t == Test::WriteBw || t == Test::ReadBw || t == Test::SendBw || t == Test::Verify; }

inline const char *test_name(Test t) {
  switch (t) {
    case Test::WriteLat: return "write_lat";
    case Test::WriteBw: return "write_bw";
    case Test::SendLat: return "send_lat";
    case Test::Verify: return "verify";
    case Test::ReadLat: return "read_lat";
    case Test::ReadBw: return "read_bw";
    case Test::SendBw: return "send_bw";
  }
  return "?";
}

struct Options {
  std::vector<Test> tests{Test::WriteLat, Test::WriteBw, Test::SendLat};
  std::vector<uint64_t> lat_sizes{8};
  std::vector<uint64_t> bw_sizes;
  uint64_t iters = 100000;
  uint64_t warmup = 2000;
  uint64_t lat_bytes = 1ull << 30;  // latency: at most this many bytes per size and side
  uint64_t min_iters = 100;
  double seconds = 0.2;  // per bw size
  double warm_seconds = 0.02;
  unsigned window = 64;
  unsigned chunk = 0;  // bw: signal every `chunk` WRs; 0 = window/4
  unsigned cq_mod = 64;  // latency tests: signal every `cq_mod` WRs
  unsigned inline_req = 64;
  std::string dev_name;
  int ib_port = 1;
  int gid_idx = 0;
  int mtu = 0;  // bytes; 0 = port's active MTU
  bool pin = false;
  bool td = false;  // QP in a parent domain with a thread domain (ibv_alloc_td)
  unsigned timeout = 300;
  long server_uid = -1;  // the server drops to this uid (and gid) after fork: another user
};

extern const char *g_role;  // "client" or "server", in messages
extern bool g_verbose;      // -v: vlog writes

// Says what failed on stderr, in one write, and exits 1.
[[noreturn]] void die(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
// Progress on stderr, with -v.
void vlog(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

// ------------------------------------------------------------ socket sync --

void write_all(int fd, const void *p, size_t n);
void read_all(int fd, void *p, size_t n);
void barrier(int fd);

// -------------------------------------------------------------- RDMA setup --

struct PeerInfo {
  uint32_t qpn;
  uint32_t psn;
  uint32_t rkey;
  uint32_t mtu;  // enum ibv_mtu
  uint64_t addr;
  uint16_t lid;
  uint8_t gid[16];
  uint8_t pad[6];
};

struct Rdma {
  ibv_context *ctx = nullptr;
  ibv_pd *pd = nullptr;
  ibv_td *td = nullptr;
  ibv_pd *qp_pd = nullptr;  // the parent domain with --td, else pd
  ibv_mr *mr = nullptr;
  ibv_cq *scq = nullptr;
  ibv_cq *rcq = nullptr;
  ibv_qp *qp = nullptr;
  char *buf = nullptr;
  size_t region = 0;  // buf = [recv region | send region], each `region` bytes
  unsigned sq_depth = 0;
  unsigned rq_depth = 0;
  unsigned rd_atom = 1;  // RDMA READs this QP may have outstanding
  unsigned max_inline = 0;
  unsigned recv_posted = 0;
  ibv_port_attr port{};
  PeerInfo local{}, remote{};
  std::string dev;
  int sock = -1;

  char *recv_buf() const { return buf; }
  char *send_buf() const { return buf + region; }
  uint64_t remote_recv() const { return remote.addr; }
};

inline int mtu_bytes(uint32_t m) { return m >= IBV_MTU_256 && m <= IBV_MTU_4096 ? 128 << m : 0; }
ibv_mtu mtu_enum(int bytes);  // dies on a size that is no IB MTU

// Opens the device, creates the QP and connects it to the peer's over r.sock.
void setup(Rdma &r, const Options &o, uint64_t max_size);
void teardown(Rdma &r);

// ------------------------------------------------------------- completions --

void check_wc(const ibv_wc &wc, const char *what);
// Non-blocking: reap up to `max` send completions; returns how many.
int poll_send(Rdma &r, int max = 16);

// Tracks unsignalled WRs so the SQ never overflows: a signalled WR retires
// itself and every unsignalled WR posted before it.
struct SendTracker {
  unsigned sig_every;
  unsigned sq_depth;
  unsigned since_sig = 0;  // unsignalled WRs posted since the last signalled one
  unsigned pending = 0;    // signalled WRs whose completion is not reaped yet

  unsigned outstanding() const { return since_sig + pending * sig_every; }
  // Decide the signal flag for the next WR (force = last WR of a test).
  bool next_signaled(Rdma &r, bool force) {
    while (outstanding() + 1 > sq_depth) pending -= static_cast<unsigned>(poll_send(r));
    bool sig = force || since_sig + 1 >= sig_every;
    if (sig) {
      since_sig = 0;
      ++pending;
    } else {
      ++since_sig;
    }
    return sig;
  }
  void reap(Rdma &r) {
    if (pending) pending -= static_cast<unsigned>(poll_send(r));
  }
  void drain(Rdma &r) {
    while (pending) pending -= static_cast<unsigned>(poll_send(r));
  }
};

// Receives always cover the whole receive region, so receives left posted by
// an earlier send_lat size still fit a larger message.
void post_recvs(Rdma &r);

// ------------------------------------------------------------------- tests --
// Each runs on both sides (client true in the parent) for one message size;
// the client emits the result.

void write_lat(Rdma &r, const Options &o, bool client, uint64_t size);
void send_lat(Rdma &r, const Options &o, bool client, uint64_t size);
void read_lat(Rdma &r, const Options &o, bool client, uint64_t size);
void verify(Rdma &r, bool client, uint64_t size);
void write_bw(Rdma &r, const Options &o, bool client, uint64_t size, Test t = Test::WriteBw);
void send_bw(Rdma &r, const Options &o, bool client, uint64_t size);

}  // namespace verbs_bench
