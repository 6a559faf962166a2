// semantics_agent.h: the three paths of one verbs operation, set up from
// the public verbs API for semantics_test.cc.
//
// Each side of a connection is an agent: a process forked from the test
// (which itself never opens the device, so that the fork copies no library
// threads) that serves simple commands over a socketpair: open a QP, an MR
// and a CQ; connect; post; poll; store and load bytes of its buffer; watch
// the last byte of a range from a thread. Where the agents are is the path:
//   kShm       both of this user, one daemon (this binary's private one):
//              the requester writes the responder's memory itself;
//   kMediated  the requester root, the responder nobody, one system daemon
//              (softverbsd --system): the daemon carries each request;
//   kWire      each in a network namespace of its own (scripts/testbed.sh),
//              each with its own daemon owning UDP 4791: RoCEv2 between them.
#pragma once

#include <infiniband/verbs.h>
#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace svsem {

enum class Path { kShm, kMediated, kWire };
const char* path_name(Path p);

// Why `p` cannot be set up on this machine ("" when it can). The first call
// for kMediated starts the system daemon, for kWire the test bed.
std::string path_unavailable(Path p);

// What an agent opens (its MR covers its whole buffer).
struct OpenArgs {
  uint32_t qp_type = IBV_QPT_RC;
  uint32_t mr_access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                       IBV_ACCESS_REMOTE_ATOMIC;
  uint32_t qp_access = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
  uint32_t gid_index = 0;  // set by Pair from the path
  uint64_t len = 1 << 20;
  uint32_t rnr_retry = 7;  // RC: 7 retries an RNR NAK for ever (IBTA 9.7.5.2.8)
  uint32_t extended = 0;   // RC: created with ibv_create_qp_ex and every send op (ibv_wr_* posts)
};

// What an agent opened: how the other side reaches it.
struct Endpoint {
  uint32_t qpn = 0;
  uint32_t rkey = 0;
  uint32_t lkey = 0;
  uint32_t gid_index = 0;
  uint64_t addr = 0;
  uint8_t gid[16] = {};
};

// A further scatter/gather element of a Wr or Recv (after its first).
struct Sge {
  uint64_t off = 0;
  uint32_t len = 0;
  uint32_t lkey_xor = 0;
};
constexpr uint32_t kMaxSge = 3;

// One send work request, relative to the agent's own buffer.
struct Wr {
  uint32_t opcode = IBV_WR_RDMA_WRITE;
  uint32_t send_flags = IBV_SEND_SIGNALED;
  uint64_t wr_id = 1;
  uint64_t off = 0;       // local offset of the one SGE
  uint32_t len = 0;       // 0: no SGE at all (a zero-length message)
  uint32_t rkey = 0;
  uint64_t raddr = 0;
  uint64_t compare_add = 0;
  uint64_t swap = 0;
  uint32_t imm = 0;       // as it goes on the wire (big-endian), given as is
  uint32_t lkey_xor = 0;  // non-zero: the SGE's L_Key spoiled
  uint32_t more = 0;      // how many of more_sge follow the first
  Sge more_sge[kMaxSge - 1];
  uint32_t zero_sge = 0;  // with len 0: one SGE of length 0 rather than none
  // Posted with the ibv_wr_* API (an extended QP): IBV_WR_ATOMIC_WRITE as
  // ibv_wr_atomic_write of the 8 bytes at `off`, and IBV_WR_FLUSH always, as
  // ibv_wr_flush(rkey, raddr, flush_len, flush_type, flush_level).
  uint32_t new_api = 0;
  uint8_t flush_type = 0;
  uint8_t flush_level = 0;
  uint64_t flush_len = 0;
};

// IBTA annex A19 in rdma-core v64's values (libibverbs/verbs.h), which the
// verbs.h these tests build against (v44) lacks.
constexpr uint32_t kWrFlush = 14;           // IBV_WR_FLUSH
constexpr uint32_t kWcFlush = 8;            // IBV_WC_FLUSH
constexpr uint32_t kAccessFlushGlobal = 1u << 8;
constexpr uint32_t kAccessFlushPersistent = 1u << 9;
constexpr uint8_t kFlushGlobal = 1, kFlushPersistent = 2;  // ibv_placement_type
constexpr uint8_t kFlushRange = 0, kFlushMr = 1;           // ibv_selectivity_level

// Inline (IBV_SEND_INLINE) work requests carry up to this much.
constexpr uint32_t kMaxInline = 64;

struct Recv {
  uint64_t wr_id = 100;
  uint64_t off = 0;
  uint32_t len = 0;
  uint32_t lkey_xor = 0;
  uint32_t more = 0;  // how many of more_sge follow the first
  Sge more_sge[kMaxSge - 1];
};

// What a watch of the last byte of a range saw (see Agent::watch_tail).
struct WatchResult {
  int32_t state = -1;      // 0 every byte there when the last was; 1 not; 2 timed out
  uint32_t pad = 0;
  uint64_t first_missing = 0;  // for state 1: the first byte that was not
};

class Agent {
 public:
  Agent() = default;
  ~Agent();
  Agent(const Agent&) = delete;
  Agent& operator=(const Agent&) = delete;
  // Forks the agent for side `side` (0 requester, 1 responder) of path `p`.
  bool start(Path p, int side);
  // Closes the command socket: the agent exits (killed if it does not).
  void stop();
  pid_t pid() const { return pid_; }

  int open(const OpenArgs& a, Endpoint& out);  // 0 or errno
  int connect(const Endpoint& peer);           // 0 or errno (UD: makes the AH)
  int post_send(const Wr& w);                  // ibv_post_send's result
  int post_recv(const Recv& r);                // ibv_post_recv's result
  // Completions until `n` came or `ms` passed.
  std::vector<ibv_wc> poll(uint32_t n, uint32_t ms = 20000);
  bool store(uint64_t off, const std::vector<uint8_t>& bytes);
  std::vector<uint8_t> load(uint64_t off, uint64_t len);
  // A thread spins on byte off+len-1 until it equals `last` (at most `ms`),
  // then checks that [off, off+len) equals `want` there.
  bool watch_tail(uint64_t off, const std::vector<uint8_t>& want, uint32_t ms);
  WatchResult watch_result();

 private:
  int call(uint32_t op, const void* arg, size_t arg_len, std::vector<uint8_t>* reply);
  pid_t pid_ = -1;
  int sock_ = -1;
};

// Deterministic non-zero bytes (a store of them changes every zeroed byte).
std::vector<uint8_t> pattern(uint8_t seed, uint64_t len);

}  // namespace svsem
