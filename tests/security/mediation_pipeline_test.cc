// Pipelined requests between users (docs/PERFORMANCE.md, "Between users"): root's
// RC QP connected to nobody's, so the daemon carries every request
// (Op::MediatePost), several in flight per QP. What must hold: every byte
// lands and every completion comes, in order (a READ after a WRITE to the
// same place sees it); the send queue's depth counts the requests in
// flight; a request failing in the middle flushes the rest, which move no
// byte; a deregistration stops the requests still in flight over the MR
// (they fail, nothing lands in the memory afterwards); a requester killed
// with requests in flight leaves the daemon nothing of it.
#include <dirent.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "attack.h"
#include "softverbs/softverbs.h"

namespace svsec {
namespace {

constexpr uint32_t kAccess =
    IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;

struct Info {
  uint32_t qpn, rkey;
  uint64_t addr;
};

// One side: an RC QP of `depth` send requests, a CQ, and `len` bytes
// registered for everything.
struct Side {
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  ibv_cq* cq = nullptr;
  ibv_qp* qp = nullptr;
  uint8_t* buf = nullptr;
  ibv_mr* mr = nullptr;
  uint32_t depth = 0;  // the send queue's, as created

  bool open(size_t len, uint32_t sq_depth) {
    ctx = open_dev();
    if (!ctx || !(pd = ibv_alloc_pd(ctx)) || !(cq = ibv_create_cq(ctx, 4096, nullptr, nullptr, 0))) return false;
    ibv_qp_init_attr ia{};
    ia.send_cq = ia.recv_cq = cq;
    ia.qp_type = IBV_QPT_RC;
    ia.cap.max_send_wr = sq_depth;
    ia.cap.max_recv_wr = 16;
    ia.cap.max_send_sge = ia.cap.max_recv_sge = 1;
    if (!(qp = ibv_create_qp(pd, &ia))) return false;
    depth = ia.cap.max_send_wr;
    void* p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return false;
    buf = static_cast<uint8_t*>(p);
    if (!(mr = ibv_reg_mr(pd, buf, len, kAccess))) return false;
    return qp_to_init(qp, IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC) == 0;
  }
  bool connect(uint32_t dest) { return qp_to_rts(ctx, qp, dest) == 0; }

  // Posts one request; 0 or post_send's errno.
  int post(ibv_wr_opcode op, uint64_t wr_id, void* local, uint32_t len, uint64_t raddr, uint32_t rkey, bool signaled) {
    ibv_sge sge{reinterpret_cast<uintptr_t>(local), len, mr->lkey};
    ibv_send_wr wr{}, *bad = nullptr;
    wr.wr_id = wr_id;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = op;
    wr.send_flags = signaled ? IBV_SEND_SIGNALED : 0;
    wr.wr.rdma.remote_addr = raddr;
    wr.wr.rdma.rkey = rkey;
    return ibv_post_send(qp, &wr, &bad);
  }
  // Takes completions until `n` came or 10 s passed.
  std::vector<ibv_wc> poll(size_t n) {
    std::vector<ibv_wc> got;
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (got.size() < n && std::chrono::steady_clock::now() < until) {
      ibv_wc wc[32];
      const int k = ibv_poll_cq(cq, 32, wc);
      for (int i = 0; i < k; ++i) got.push_back(wc[i]);
      if (k <= 0) std::this_thread::yield();
    }
    return got;
  }
};

uint8_t pattern(uint64_t i, uint64_t at) { return uint8_t(i * 29 + at * 7 + (at >> 9) + 1); }

// Responders. One that only waits for the test's word that it is done:
int waits(Side&, int sock) {
  int done = 0;
  return recv_val(sock, done) ? 0 : 60;
}
// One that, once told, checks that its first `len` bytes hold pattern() in
// pieces of `piece`, as the requester wrote them.
std::function<int(Side&, int)> holds_pattern(uint64_t len, uint64_t piece) {
  return [len, piece](Side& me, int sock) {
    int done = 0;
    if (!recv_val(sock, done)) return 60;
    for (uint64_t at = 0; at < len; ++at)
      if (me.buf[at] != pattern(at / piece, at % piece)) return 61;
    return 0;
  };
}

// Root (requester) and nobody (responder) set up and connected: nobody
// registers `len` bytes and runs `responder` once connected; root creates a
// QP of `depth` and runs `requester` with nobody's Info. The parent relays
// the QP numbers; after that each body talks to the test through its sock.
struct Pair {
  Child root, nobody;
  Pair(size_t len, uint32_t depth, std::function<int(Side&, const Info&, int)> requester,
       std::function<int(Side&, int)> responder)
      : root(false,
             [len, depth, requester](int sock) {
               Side me;
               if (!me.open(len, depth)) return 10;
               Info peer{};
               if (!send_val(sock, me.qp->qp_num) || !recv_val(sock, peer)) return 11;
               if (!me.connect(peer.qpn)) return 12;
               return requester(me, peer, sock);
             }),
        nobody(true, [len, responder](int sock) {
          Side me;
          if (!me.open(len, 16)) return 20;
          Info info{me.qp->qp_num, me.mr->rkey, reinterpret_cast<uintptr_t>(me.buf)};
          uint32_t root_qpn = 0;
          if (!send_val(sock, info) || !recv_val(sock, root_qpn)) return 21;
          if (!me.connect(root_qpn)) return 22;
          if (!send_val(sock, 1)) return 23;
          return responder(me, sock);
        }) {}

  // Starts both and relays the set-up; false (with the children's exit
  // codes said) if either failed.
  bool start() {
    root.start();
    nobody.start();
    uint32_t root_qpn = 0;
    Info info{};
    int ready = 0;
    if (!recv_val(root.sock(), root_qpn) || !recv_val(nobody.sock(), info) || !send_val(nobody.sock(), root_qpn) ||
        !recv_val(nobody.sock(), ready) || !send_val(root.sock(), info)) {
      ADD_FAILURE() << "set-up failed: root exit " << root.wait() << ", nobody exit " << nobody.wait();
      return false;
    }
    return true;
  }
};

// The end of a test whose root body says it is done: nobody is told (its
// responder returns), both must exit 0, and the daemon still runs.
void finish(Pair& pair, const SystemDaemon& sysd) {
  int done = 0;
  ASSERT_TRUE(recv_val(pair.root.sock(), done)) << "root failed: exit " << pair.root.wait();
  ASSERT_TRUE(send_val(pair.nobody.sock(), done));
  EXPECT_EQ(0, pair.root.wait());
  EXPECT_EQ(0, pair.nobody.wait());
  EXPECT_TRUE(sysd.alive());
}

// Posts `op`, waiting for room (completions taken meanwhile into `got`).
int post_waiting(Side& me, std::vector<ibv_wc>& got, ibv_wr_opcode op, uint64_t wr_id, void* local, uint32_t len,
                 uint64_t raddr, uint32_t rkey, bool signaled) {
  for (int tries = 0; tries < 1000000; ++tries) {
    const int e = me.post(op, wr_id, local, len, raddr, rkey, signaled);
    if (e != ENOMEM) return e;
    ibv_wc wc[32];
    const int k = ibv_poll_cq(me.cq, 32, wc);
    for (int i = 0; i < k; ++i) got.push_back(wc[i]);
    std::this_thread::yield();
  }
  return ENOMEM;
}

// Completions in posting order, with the statuses expected: 0 when so.
int in_order(const std::vector<ibv_wc>& got, const std::vector<uint64_t>& ids,
             const std::function<ibv_wc_status(uint64_t)>& status) {
  if (got.size() != ids.size()) return 1;
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i].wr_id != ids[i]) return 2;
    if (got[i].status != status(ids[i])) return 3;
  }
  return 0;
}

// WRITE chunk i, then READ it back into a second buffer: the READ, in flight
// behind the WRITE, must see its bytes. Two signaled in three, the rest not.
TEST(MediationPipeline, ManyRequestsInFlightMoveEveryByteAndCompleteInOrder) {
  constexpr uint32_t kChunk = 6000, kChunks = 300;
  constexpr size_t kLen = size_t(kChunk) * kChunks;
  SystemDaemon sysd;
  ASSERT_TRUE(sysd.alive());
  Pair pair(
      2 * kLen, 64,
      [](Side& me, const Info& peer, int sock) {
        for (uint64_t at = 0; at < kLen; ++at) me.buf[at] = pattern(at / kChunk, at % kChunk);
        std::vector<ibv_wc> got;
        std::vector<uint64_t> ids;
        for (uint32_t i = 0; i < kChunks; ++i) {
          const uint64_t w = 2 * i, r = 2 * i + 1;
          uint8_t* src = me.buf + uint64_t(i) * kChunk;
          const uint64_t remote = peer.addr + uint64_t(i) * kChunk;
          if (post_waiting(me, got, IBV_WR_RDMA_WRITE, w, src, kChunk, remote, peer.rkey, w % 3 != 0)) return 30;
          if (post_waiting(me, got, IBV_WR_RDMA_READ, r, src + kLen, kChunk, remote, peer.rkey, r % 3 != 0)) return 31;
          for (uint64_t id : {w, r})
            if (id % 3 != 0) ids.push_back(id);
        }
        for (const ibv_wc& wc : me.poll(ids.size() - got.size())) got.push_back(wc);
        if (int e = in_order(got, ids, [](uint64_t) { return IBV_WC_SUCCESS; })) return 40 + e;
        if (memcmp(me.buf, me.buf + kLen, kLen) != 0) return 50;
        return send_val(sock, 1) ? 0 : 51;
      },
      holds_pattern(kLen, kChunk));
  ASSERT_TRUE(pair.start());
  finish(pair, sysd);
}

// Requests the daemon has not finished count against the send queue's
// depth: with the daemon stopped (SIGSTOP, once the pipeline is open),
// exactly `depth` posts succeed and the next fails with ENOMEM; once it runs
// again every completion comes, in order, and the queue has room. (It once
// counted on large WRITEs being slower than posting, which a daemon that
// got the poster's CPU at each post was not, one run in ten.)
TEST(MediationPipeline, TheSendQueueDepthCountsRequestsInFlight) {
  constexpr uint32_t kLen = 64u << 10, kDepth = 8;
  SystemDaemon sysd;
  ASSERT_TRUE(sysd.alive());
  Pair pair(
      kLen, kDepth,
      [](Side& me, const Info& peer, int sock) {
        // The first request goes alone (a round trip), the second opens
        // the pipeline and its request ring: both done before the stop.
        for (uint64_t id : {1000, 1001})
          if (me.post(IBV_WR_RDMA_WRITE, id, me.buf, kLen, peer.addr, peer.rkey, true)) return 35;
        if (me.poll(2).size() != 2) return 36;
        int ack = 0;
        if (!send_val(sock, 1) || !recv_val(sock, ack)) return 37;  // the daemon is stopped now
        std::vector<uint64_t> ids;
        int e = 0;
        uint64_t posted = 0;
        for (; posted < 4 * kDepth; ++posted) {
          if ((e = me.post(IBV_WR_RDMA_WRITE, posted, me.buf, kLen, peer.addr, peer.rkey, true))) break;
          ids.push_back(posted);
        }
        if (e != ENOMEM || posted != kDepth) {
          std::fprintf(stderr, "%lu posts before %d (depth %u)\n", (unsigned long)posted, e, kDepth);
          return 30;
        }
        if (!send_val(sock, 2) || !recv_val(sock, ack)) return 38;  // running again
        std::vector<ibv_wc> got = me.poll(ids.size());
        if (int r = in_order(got, ids, [](uint64_t) { return IBV_WC_SUCCESS; })) return 40 + r;
        if (me.post(IBV_WR_RDMA_WRITE, 99, me.buf, 8, peer.addr, peer.rkey, true)) return 32;  // room again
        got = me.poll(1);
        if (got.size() != 1 || got[0].wr_id != 99 || got[0].status != IBV_WC_SUCCESS) return 33;
        return send_val(sock, 1) ? 0 : 34;
      },
      waits);
  ASSERT_TRUE(pair.start());
  struct Resume {
    pid_t pid;
    ~Resume() { ::kill(pid, SIGCONT); }
  } resume{sysd.pid};
  int step = 0;
  ASSERT_TRUE(recv_val(pair.root.sock(), step)) << "root failed: exit " << pair.root.wait();
  ASSERT_EQ(0, ::kill(sysd.pid, SIGSTOP));
  ASSERT_TRUE(send_val(pair.root.sock(), 1));
  ASSERT_TRUE(recv_val(pair.root.sock(), step)) << "root failed: exit " << pair.root.wait();
  ASSERT_EQ(0, ::kill(sysd.pid, SIGCONT));
  ASSERT_TRUE(send_val(pair.root.sock(), 1));
  finish(pair, sysd);
}

// The 10th of 30 WRITEs names a bad R_Key: it fails with a remote access
// error, the 20 behind it (sent already) complete flushed, in order, and
// move no byte; the QP is in ERR.
TEST(MediationPipeline, AFailureInTheMiddleFlushesTheRest) {
  constexpr uint32_t kChunk = 4096, kN = 30, kBad = 9;
  SystemDaemon sysd;
  ASSERT_TRUE(sysd.alive());
  Pair pair(
      size_t(kChunk) * kN, 64,
      [](Side& me, const Info& peer, int sock) {
        memset(me.buf, 0xab, size_t(kChunk) * kN);
        std::vector<uint64_t> ids;
        for (uint32_t i = 0; i < kN; ++i) {
          const uint32_t rkey = i == kBad ? peer.rkey ^ 0x100 : peer.rkey;
          if (me.post(IBV_WR_RDMA_WRITE, i, me.buf + uint64_t(i) * kChunk, kChunk, peer.addr + uint64_t(i) * kChunk,
                      rkey, true))
            return 30;
          ids.push_back(i);
        }
        std::vector<ibv_wc> got = me.poll(ids.size());
        if (int r = in_order(got, ids, [](uint64_t i) {
              return i < kBad ? IBV_WC_SUCCESS : i == kBad ? IBV_WC_REM_ACCESS_ERR : IBV_WC_WR_FLUSH_ERR;
            }))
          return 40 + r;
        ibv_qp_attr a{};
        ibv_qp_init_attr ia{};
        if (ibv_query_qp(me.qp, &a, IBV_QP_STATE, &ia) || a.qp_state != IBV_QPS_ERR) return 31;
        // Posted now: flushed at once, behind everything.
        if (me.post(IBV_WR_RDMA_WRITE, 77, me.buf, 8, peer.addr, peer.rkey, true)) return 32;
        got = me.poll(1);
        if (got.size() != 1 || got[0].wr_id != 77 || got[0].status != IBV_WC_WR_FLUSH_ERR) return 33;
        return send_val(sock, 1) ? 0 : 34;
      },
      [](Side& me, int sock) {
        int done = 0;
        if (!recv_val(sock, done)) return 60;
        for (uint64_t at = 0; at < uint64_t(kChunk) * kN; ++at)
          if (me.buf[at] != (at / kChunk < kBad ? 0xab : 0)) return 61;
        return 0;
      });
  ASSERT_TRUE(pair.start());
  finish(pair, sysd);
}

// SENDs behind a WRITE, sent before nobody has posted a receive: the first
// meets RNR at the daemon and the rest of its run comes back unexecuted;
// the library retries them in order, and once receives are posted each
// SEND lands in its own receive, in order, and completes in order.
TEST(MediationPipeline, AnRnrInTheMiddleSendsTheRestBackAndTheyGoInOrder) {
  constexpr uint32_t kN = 12, kMsg = 64;
  SystemDaemon sysd;
  ASSERT_TRUE(sysd.alive());
  Pair pair(
      4096, 64,
      [](Side& me, const Info& peer, int sock) {
        std::vector<uint64_t> ids{100};
        if (me.post(IBV_WR_RDMA_WRITE, 100, me.buf, 8, peer.addr + 4000, peer.rkey, true)) return 30;
        for (uint32_t i = 0; i < kN; ++i) {
          memset(me.buf + i * kMsg, int(i + 1), kMsg);
          if (me.post(IBV_WR_SEND, i, me.buf + i * kMsg, kMsg, 0, 0, true)) return 31;
          ids.push_back(i);
        }
        std::vector<ibv_wc> got = me.poll(ids.size());
        if (int r = in_order(got, ids, [](uint64_t) { return IBV_WC_SUCCESS; })) return 40 + r;
        return send_val(sock, 1) ? 0 : 32;
      },
      [](Side& me, int sock) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));  // root's SENDs meet no receive meanwhile
        for (uint32_t i = 0; i < kN; ++i) {
          ibv_sge sge{reinterpret_cast<uintptr_t>(me.buf + i * kMsg), kMsg, me.mr->lkey};
          ibv_recv_wr wr{}, *bad = nullptr;
          wr.wr_id = i;
          wr.sg_list = &sge;
          wr.num_sge = 1;
          if (ibv_post_recv(me.qp, &wr, &bad)) return 60;
        }
        std::vector<ibv_wc> got = me.poll(kN);
        for (uint32_t i = 0; i < kN; ++i) {
          if (i >= got.size() || got[i].wr_id != i || got[i].status != IBV_WC_SUCCESS) return 61;
          for (uint32_t b = 0; b < kMsg; ++b)
            if (me.buf[i * kMsg + b] != i + 1) return 62;
        }
        int done = 0;
        return recv_val(sock, done) ? 0 : 63;
      });
  ASSERT_TRUE(pair.start());
  finish(pair, sysd);
}

// Nobody deregisters its MR while root streams WRITEs into it, several in
// flight: the requests behind the deregistration fail (a remote access
// error, then flushes, in order), and no byte lands in nobody's memory
// after ibv_dereg_mr returned.
TEST(MediationPipeline, ADeregistrationStopsTheRequestsInFlight) {
  constexpr uint32_t kChunk = 64u << 10, kChunks = 32;
  constexpr size_t kLen = size_t(kChunk) * kChunks;
  SystemDaemon sysd;
  ASSERT_TRUE(sysd.alive());
  Pair pair(
      kLen, 32,
      [](Side& me, const Info& peer, int sock) {
        memset(me.buf, 0x5a, kLen);
        std::vector<ibv_wc> got;
        uint64_t posted = 0;
        const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
        auto failed = [&got] {
          for (const ibv_wc& wc : got)
            if (wc.status != IBV_WC_SUCCESS) return true;
          return false;
        };
        bool stop = false;
        while (!stop && std::chrono::steady_clock::now() < until) {
          const uint64_t at = (posted % kChunks) * kChunk;
          if (post_waiting(me, got, IBV_WR_RDMA_WRITE, posted, me.buf + at, kChunk, peer.addr + at, peer.rkey, true))
            break;
          ++posted;
          ibv_wc wc[32];
          const int k = ibv_poll_cq(me.cq, 32, wc);
          for (int i = 0; i < k; ++i) got.push_back(wc[i]), stop |= wc[i].status != IBV_WC_SUCCESS;
        }
        for (const ibv_wc& wc : me.poll(posted - got.size())) got.push_back(wc);
        if (got.size() != posted || !failed()) return 30;
        size_t i = 0;
        for (; i < got.size() && got[i].status == IBV_WC_SUCCESS; ++i)
          if (got[i].wr_id != i) return 31;
        // The key check fails (a remote access error), or the copy worker's
        // copy was revoked in the middle (a remote operation error).
        if (got[i].wr_id != i || (got[i].status != IBV_WC_REM_ACCESS_ERR && got[i].status != IBV_WC_REM_OP_ERR))
          return 32;
        for (++i; i < got.size(); ++i)
          if (got[i].wr_id != i || got[i].status != IBV_WC_WR_FLUSH_ERR) return 33;
        return send_val(sock, 1) ? 0 : 34;
      },
      [](Side& me, int sock) {
        // The stream has begun: some bytes landed.
        const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
        while (reinterpret_cast<volatile uint8_t*>(me.buf)[kLen - 1] != 0x5a)
          if (std::chrono::steady_clock::now() > until) return 60;
        if (ibv_dereg_mr(me.mr)) return 61;
        memset(me.buf, 0x77, kLen);
        int done = 0;
        if (!recv_val(sock, done)) return 62;
        for (size_t at = 0; at < kLen; ++at)
          if (me.buf[at] != 0x77) return 63;
        return 0;
      });
  ASSERT_TRUE(pair.start());
  int done = 0;
  ASSERT_TRUE(recv_val(pair.root.sock(), done)) << "root failed: exit " << pair.root.wait();
  ASSERT_TRUE(send_val(pair.nobody.sock(), done));
  EXPECT_EQ(0, pair.root.wait());
  EXPECT_EQ(0, pair.nobody.wait()) << "63: a byte landed after the deregistration";
  EXPECT_TRUE(sysd.alive());
}

size_t entries(const std::string& dir) {
  size_t n = 0;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) n += e->d_name[0] != '.';
    closedir(d);
  }
  return n;
}

// The mappings in /proc/PID/maps that are of a file (a pathname that
// starts with '/': a client's memory reaches the daemon only as a file, a
// memfd, "/memfd:... (deleted)"). Anonymous ones are the daemon's own
// heap, and a sanitizer's runtime maps more of those as it goes.
size_t file_maps(const std::string& path) {
  std::ifstream f(path);
  size_t n = 0;
  for (std::string line; std::getline(f, line);) {
    // start-end perms offset dev inode [pathname]
    std::istringstream in(line);
    std::string field, name;
    for (int i = 0; i < 5 && in >> field; ++i) {
    }
    if (in >> name && name[0] == '/') ++n;
  }
  return n;
}

// IBTA 10.8.3 / ibv_poll_cq(3): a request whose completion has been polled
// has left the send queue, so its slot may be posted again at once (what
// perftest's ib_write_bw does: it posts whenever fewer than its depth are
// outstanding). The daemon once pushed a completion before the count that
// frees its slot: a post between the two got ENOMEM (ib_write_bw between
// users failed one run in two at 50,000 iterations of 64 KiB). Here: a
// queue of 8 kept full for 3 s of 16 KiB WRITEs, each post right after the
// poll that made room; not one may be refused.
TEST(MediationPipeline, APolledCompletionHasFreedItsSlotForTheNextPost) {
  constexpr uint32_t kDepth = 8, kLen = 16384;
  SystemDaemon sysd;
  ASSERT_TRUE(sysd.alive());
  Pair pair(
      1 << 20, kDepth,
      [](Side& me, const Info& peer, int sock) {
        // The first request goes alone (its round trip): then the pipeline.
        if (me.post(IBV_WR_RDMA_WRITE, 0, me.buf, 8, peer.addr, peer.rkey, true) || me.poll(1).size() != 1) return 30;
        uint64_t posted = 0, polled = 0;
        const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(3);
        while (std::chrono::steady_clock::now() < until) {
          while (posted - polled < me.depth) {
            const uint64_t at = (posted % 64) * kLen;
            if (int e = me.post(IBV_WR_RDMA_WRITE, posted, me.buf + at % (1 << 19), kLen, peer.addr + at % (1 << 19),
                                peer.rkey, true)) {
              std::fprintf(stderr, "post %llu refused (%d) with %llu outstanding of %u\n",
                           (unsigned long long)posted, e, (unsigned long long)(posted - polled), me.depth);
              return 31;
            }
            ++posted;
          }
          ibv_wc wc[4];
          const int k = ibv_poll_cq(me.cq, 4, wc);
          for (int i = 0; i < k; ++i) {
            if (wc[i].status != IBV_WC_SUCCESS || wc[i].wr_id != polled) return 32;
            ++polled;
          }
        }
        for (const ibv_wc& wc : me.poll(posted - polled))
          if (wc.status != IBV_WC_SUCCESS || wc.wr_id != polled++) return 33;
        std::fprintf(stderr, "%llu requests posted, each as soon as its slot was free\n", (unsigned long long)posted);
        return polled == posted && send_val(sock, 1) ? 0 : 34;
      },
      [](Side& me, int sock) {
        Info info{me.qp->qp_num, me.mr->rkey, reinterpret_cast<uintptr_t>(me.buf)};
        if (!send_val(sock, info)) return 60;
        int done = 0;
        return recv_val(sock, done) ? 0 : 61;
      });
  ASSERT_TRUE(pair.start());
  Info peer{};
  ASSERT_TRUE(recv_val(pair.nobody.sock(), peer));
  finish(pair, sysd);
}

// More requests in flight than the connection's request ring holds (256,
// Op::PostRing): a post waits for the daemon to take some and never fails;
// every request runs, in order, and lands.
TEST(MediationPipeline, MoreRequestsInFlightThanTheRequestRingHoldsWaitAndAllLand) {
  constexpr uint32_t kN = 1000, kLen = 512;
  SystemDaemon sysd;
  ASSERT_TRUE(sysd.alive());
  Pair pair(
      size_t(kN) * kLen, 1024,
      [](Side& me, const Info& peer, int sock) {
        for (uint64_t at = 0; at < uint64_t(kN) * kLen; ++at) me.buf[at] = pattern(at / kLen, at % kLen);
        if (me.depth < kN) return 29;
        std::vector<uint64_t> ids;
        for (uint32_t i = 0; i < kN; ++i) {
          const uint64_t off = uint64_t(i) * kLen;
          if (int e = me.post(IBV_WR_RDMA_WRITE, i, me.buf + off, kLen, peer.addr + off, peer.rkey, true)) {
            std::fprintf(stderr, "post %u refused (%d)\n", i, e);
            return 30;
          }
          ids.push_back(i);
        }
        if (int e = in_order(me.poll(kN), ids, [](uint64_t) { return IBV_WC_SUCCESS; })) return 40 + e;
        return send_val(sock, 1) ? 0 : 31;
      },
      holds_pattern(uint64_t(kN) * kLen, kLen));
  ASSERT_TRUE(pair.start());
  finish(pair, sysd);
}

// One user's stream through its request ring does not starve another
// user's control calls: while root keeps up to 1024 WRITEs of 4 KiB in
// flight to nobody (the daemon's loop busy with the ring, where it looks at
// its sockets only every 8 turns or 50 us), a second process of nobody's
// opens the device and makes 100 registrations; an alarm makes a starved
// caller a failure, not a hang (no time is asserted). The stream must have
// gone on meanwhile, every completion a success. (A daemon that never looked
// at its sockets while a ring had requests passes too, on this 2-vCPU
// machine: the stream's poster is off its CPU often enough to empty the
// ring. The bound is the loop's, by construction.)
TEST(MediationPipeline, AStreamThroughTheRingDoesNotStarveAnotherUsersCalls) {
  constexpr uint32_t kLen = 4096, kDepth = 1024;
  SystemDaemon sysd;
  ASSERT_TRUE(sysd.alive());
  Pair pair(
      kLen, kDepth,
      [](Side& me, const Info& peer, int sock) {
        uint64_t posted = 0, done = 0;
        bool told = false;
        for (;;) {
          pollfd p{sock, POLLIN, 0};
          if (::poll(&p, 1, 0) == 1) break;  // the victim is done
          while (posted - done < kDepth) {
            if (int e = me.post(IBV_WR_RDMA_WRITE, posted, me.buf, kLen, peer.addr, peer.rkey, true)) {
              std::fprintf(stderr, "post %lu: %d\n", (unsigned long)posted, e);
              return 30;
            }
            ++posted;
          }
          ibv_wc wc[16];
          const int k = ibv_poll_cq(me.cq, 16, wc);
          for (int i = 0; i < k; ++i)
            if (wc[i].status != IBV_WC_SUCCESS || wc[i].wr_id != done++) return 31;
          if (!told && done >= 64) {
            told = true;  // streaming: let the victim start
            if (!send_val(sock, 1)) return 32;
          }
        }
        int stop = 0;
        if (!recv_val(sock, stop)) return 33;
        for (auto& wc : me.poll(posted - done))
          if (wc.status != IBV_WC_SUCCESS || wc.wr_id != done++) return 34;
        if (done != posted) return 35;
        // How many went while the victim ran: at least the depth again.
        return send_val(sock, posted) ? 0 : 36;
      },
      waits);
  ASSERT_TRUE(pair.start());
  int streaming = 0;
  ASSERT_TRUE(recv_val(pair.root.sock(), streaming)) << "root failed: exit " << pair.root.wait();
  Child victim(true, [](int) {
    alarm(20);
    ibv_context* c = open_dev();
    if (!c) return 2;
    ibv_pd* pd = ibv_alloc_pd(c);
    if (!pd) return 3;
    static char buf[4096];
    for (int i = 0; i < 100; ++i) {
      ibv_mr* mr = ibv_reg_mr(pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE);
      if (!mr) return 4;
      if (ibv_dereg_mr(mr)) return 5;
    }
    ibv_dealloc_pd(pd);
    ibv_close_device(c);
    return 0;
  });
  victim.start();
  EXPECT_EQ(0, victim.wait());
  ASSERT_TRUE(send_val(pair.root.sock(), 1));
  uint64_t posted = 0;
  ASSERT_TRUE(recv_val(pair.root.sock(), posted)) << "root failed: exit " << pair.root.wait();
  EXPECT_GE(posted, 64u + kDepth);
  ASSERT_TRUE(send_val(pair.nobody.sock(), 1));
  EXPECT_EQ(0, pair.root.wait());
  EXPECT_EQ(0, pair.nobody.wait());
  EXPECT_TRUE(sysd.alive());
}

// A sharer of the QP (another of root's processes) reaps a run whose
// sender was killed with every request of it still unread in the daemon's
// socket, the daemon being stopped meanwhile (SIGSTOP, 1.5 s: as a daemon
// too loaded to come to it). Once the daemon runs again it works through
// the dead connection's requests, and the sharer must not have completed
// them in error before: every request completes exactly once. Before
// Op::MediateGone the sharer waited one second and completed all of them
// in error, then the daemon completed them again.
TEST(MediationPipeline, ASharerKilledMidRunWhileTheDaemonStallsGetsEachCompletionOnce) {
  constexpr uint64_t kRun = 16, kLater = 1000;
  SystemDaemon sysd;
  ASSERT_TRUE(sysd.alive());
  // The survivor: imports the context and the QP, then (told to) posts one
  // more WRITE behind the dead run and counts every completion of the CQ
  // until that one came and 500 ms passed with nothing more.
  Child survivor(false, [](int sock) {
    int dummy = 0;
    std::vector<sv::Fd> fds;
    uint32_t qpn = 0;
    Info peer{};
    if (!recv_val(sock, dummy, &fds) || fds.size() != 1 || !recv_val(sock, qpn) || !recv_val(sock, peer)) return 70;
    ibv_context* c = ibv_import_device(fds[0].get());
    if (!c) return 71;
    ibv_qp* qp = svx_import_qp(c, qpn);
    if (!qp) return 72;
    static uint8_t mine[4096];
    ibv_mr* mr = ibv_reg_mr(qp->pd, mine, sizeof mine, IBV_ACCESS_LOCAL_WRITE);
    if (!mr || !send_val(sock, 1) || !recv_val(sock, dummy)) return 73;
    ibv_sge sge{reinterpret_cast<uintptr_t>(mine), sizeof mine, mr->lkey};
    ibv_send_wr wr{}, *bad = nullptr;
    wr.wr_id = kLater;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_RDMA_WRITE;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = peer.addr;
    wr.wr.rdma.rkey = peer.rkey;
    if (ibv_post_send(qp, &wr, &bad)) return 74;
    uint32_t count[kRun + 1] = {};
    uint32_t later = 0, later_ok = 0;
    auto quiet_since = std::chrono::steady_clock::now();
    const auto until = quiet_since + std::chrono::seconds(20);
    while (std::chrono::steady_clock::now() < until) {
      ibv_wc wc[16];
      const int k = ibv_poll_cq(qp->send_cq, 16, wc);
      for (int i = 0; i < k; ++i) {
        if (wc[i].wr_id == kLater) {
          ++later;
          later_ok += wc[i].status == IBV_WC_SUCCESS;
        } else if (wc[i].wr_id >= 1 && wc[i].wr_id <= kRun) {
          ++count[wc[i].wr_id];
        } else {
          return 75;
        }
      }
      if (k > 0) quiet_since = std::chrono::steady_clock::now();
      if (later && std::chrono::steady_clock::now() - quiet_since > std::chrono::milliseconds(500)) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (!send_val(sock, count) || !send_val(sock, later) || !send_val(sock, later_ok)) return 76;
    return 0;
  });
  Pair pair(
      1 << 20, 64,
      [](Side& me, const Info& peer, int sock) {
        // The first request goes alone (a round trip), the second opens the
        // pipeline (and its request ring, Op::PostRing); their completions
        // are taken here, before the survivor polls.
        for (int i = 0; i < 2; ++i)
          if (me.post(IBV_WR_RDMA_WRITE, 0, me.buf, 64, peer.addr, peer.rkey, true) || me.poll(1).size() != 1) return 30;
        int fd[1] = {me.ctx->cmd_fd}, go = 0;
        if (!send_val(sock, 1, fd) || !send_val(sock, me.qp->qp_num) || !recv_val(sock, go)) return 31;
        for (uint64_t i = 1; i <= kRun; ++i)
          if (me.post(IBV_WR_RDMA_WRITE, i, me.buf + 4096 * i, 4096, peer.addr + 4096 * i, peer.rkey, true)) return 32;
        if (!send_val(sock, 1)) return 33;
        ::raise(SIGKILL);
        return 34;
      },
      [](Side& me, int sock) {
        Info info{me.qp->qp_num, me.mr->rkey, reinterpret_cast<uintptr_t>(me.buf)};
        if (!send_val(sock, info)) return 60;
        int done = 0;
        return recv_val(sock, done) ? 0 : 61;
      });
  ASSERT_TRUE(pair.start());
  Info peer{};
  ASSERT_TRUE(recv_val(pair.nobody.sock(), peer));
  int one = 0;
  uint32_t qpn = 0;
  std::vector<sv::Fd> fds;
  ASSERT_TRUE(recv_val(pair.root.sock(), one, &fds) && fds.size() == 1 && recv_val(pair.root.sock(), qpn));
  survivor.start();
  int cmd[1] = {fds[0].get()};
  ASSERT_TRUE(send_val(survivor.sock(), one, cmd) && send_val(survivor.sock(), qpn) && send_val(survivor.sock(), peer));
  ASSERT_TRUE(recv_val(survivor.sock(), one)) << "survivor: exit " << survivor.wait();
  struct Resume {  // the daemon runs again whatever happens below
    pid_t pid;
    ~Resume() { ::kill(pid, SIGCONT); }
  } resume{sysd.pid};
  ASSERT_EQ(0, ::kill(sysd.pid, SIGSTOP));
  ASSERT_TRUE(send_val(pair.root.sock(), one));
  ASSERT_TRUE(recv_val(pair.root.sock(), one)) << "root failed: exit " << pair.root.wait();
  EXPECT_EQ(128 + SIGKILL, pair.root.wait());
  ASSERT_TRUE(send_val(survivor.sock(), one));
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  ASSERT_EQ(0, ::kill(sysd.pid, SIGCONT));
  uint32_t count[kRun + 1] = {}, later = 0, later_ok = 0;
  ASSERT_TRUE(recv_val(survivor.sock(), count) && recv_val(survivor.sock(), later) && recv_val(survivor.sock(), later_ok))
      << "survivor: exit " << survivor.wait();
  for (uint64_t i = 1; i <= kRun; ++i) EXPECT_EQ(1u, count[i]) << "completions of request " << i;
  EXPECT_EQ(1u, later) << "completions of the survivor's own request";
  EXPECT_EQ(1u, later_ok);
  EXPECT_EQ(0, survivor.wait());
  ASSERT_TRUE(send_val(pair.nobody.sock(), one));
  EXPECT_EQ(0, pair.nobody.wait());
  EXPECT_TRUE(sysd.alive());
}

// Root is killed right after posting large WRITEs (the copy worker's) and
// small ones, all in flight: the daemon finishes or drops them and keeps
// nothing of either client once both are gone (no descriptor, no mapping).
// Twice: the first round leaves what the daemon keeps for good (each
// user's device segment, the copy worker's stack), the second must add
// nothing to it.
TEST(MediationPipeline, ARequesterKilledWithRequestsInFlightLeavesNothing) {
  constexpr uint32_t kBig = 4u << 20;
  SystemDaemon sysd;
  ASSERT_TRUE(sysd.alive());
  const std::string proc = "/proc/" + std::to_string(sysd.pid);
  auto round = [] {
    Pair pair(
        kBig, 64,
        [](Side& me, const Info& peer, int sock) {
          if (!send_val(sock, 1)) return 30;
          for (uint64_t i = 0; i < 8; ++i)
            if (me.post(IBV_WR_RDMA_WRITE, i, me.buf, kBig, peer.addr, peer.rkey, true)) return 31;
          for (uint64_t i = 8; i < 56; ++i)
            if (me.post(IBV_WR_RDMA_WRITE, i, me.buf, 4096, peer.addr, peer.rkey, false)) return 32;
          ::raise(SIGKILL);
          return 33;
        },
        waits);
    ASSERT_TRUE(pair.start());
    int ready = 0;
    ASSERT_TRUE(recv_val(pair.root.sock(), ready));
    EXPECT_EQ(128 + SIGKILL, pair.root.wait());
    ASSERT_TRUE(send_val(pair.nobody.sock(), 1));
    EXPECT_EQ(0, pair.nobody.wait());
  };
  auto settled = [&proc](size_t fds, size_t maps, size_t& fds_now, size_t& maps_now) {
    for (int i = 0; i < 300; ++i) {
      fds_now = entries(proc + "/fd");
      maps_now = file_maps(proc + "/maps");
      if (fds_now <= fds && maps_now <= maps) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  };
  round();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const size_t fds = entries(proc + "/fd"), maps = file_maps(proc + "/maps");  // what stays
  round();
  size_t fds_now = 0, maps_now = 0;
  settled(fds, maps, fds_now, maps_now);
  EXPECT_LE(fds_now, fds) << "the daemon holds descriptors of clients that are gone";
  EXPECT_LE(maps_now, maps) << "the daemon maps memory (files) of clients that are gone";
  EXPECT_TRUE(sysd.alive());
}

}  // namespace
}  // namespace svsec
