// The shared-memory path's counters (common/counters.h, docs/LAB.md): a
// scripted traffic pattern between two RC QPs, through the fast path (one
// SGE) and the general one (two SGEs, WRITE with immediate, an atomic),
// then each QP's counts as the daemon reports them (Op::Counters, as
// `rdma statistic`, the sysfs view and `softverbs status` read them),
// exactly.
#include <gtest/gtest.h>
#include <infiniband/verbs.h>

#include <cstring>

#include "common/counters_query.h"
#include "common/paths.h"
#include "common/sys.h"
#include "harness.h"

namespace svtest {
namespace {

using namespace sv::counters;

// Each Side's one CQ takes its sends' and its receives' completions: the
// receives seen while waiting for a send's are counted (or dropped) here.
// Waits for the send completion on `side`'s CQ, counting receives into `recvs`.
void wait_send(Side& side, int& recvs) {
  for (int spins = 0; spins < 5'000'000; ++spins) {
    ibv_wc wc{};
    if (ibv_poll_cq(side.cq, 1, &wc) != 1) continue;
    ASSERT_EQ(IBV_WC_SUCCESS, wc.status) << ibv_wc_status_str(wc.status);
    if (wc.opcode & IBV_WC_RECV) {
      ++recvs;
      continue;
    }
    return;
  }
  FAIL() << "no send completion";
}

// Posts one request (signaled) of `sges` pieces of `len` bytes each from
// a's buffer, against b's buffer; waits for its completion (receive
// completions on a's CQ, which its sends share, are polled and dropped).
void post(Side& a, Side& b, ibv_wr_opcode op, uint32_t len, int sges = 1, int&& recvs = 0) {
  ibv_sge s[2] = {{reinterpret_cast<uint64_t>(a.buf), len, a.mr->lkey},
                  {reinterpret_cast<uint64_t>(a.buf) + 4096, len, a.mr->lkey}};
  ibv_send_wr w{};
  w.sg_list = s;
  w.num_sge = sges;
  w.opcode = op;
  w.send_flags = IBV_SEND_SIGNALED;
  w.wr.rdma.remote_addr = reinterpret_cast<uint64_t>(b.buf) + 8192;
  w.wr.rdma.rkey = b.mr->rkey;
  if (op == IBV_WR_ATOMIC_FETCH_AND_ADD) {
    w.wr.atomic.remote_addr = reinterpret_cast<uint64_t>(b.buf) + 8192;
    w.wr.atomic.rkey = b.mr->rkey;
    w.wr.atomic.compare_add = 1;
  }
  ibv_send_wr* bad;
  ASSERT_EQ(0, ibv_post_send(a.qp, &w, &bad));
  wait_send(a, recvs);
}

void post_recv(Side& b, int n) {
  for (int i = 0; i < n; ++i) {
    ibv_sge s{reinterpret_cast<uint64_t>(b.buf) + 16384, 8192, b.mr->lkey};
    ibv_recv_wr r{};
    r.sg_list = &s;
    r.num_sge = 1;
    ibv_recv_wr* bad;
    ASSERT_EQ(0, ibv_post_recv(b.qp, &r, &bad));
  }
}

// This user's counts of QP `qpn` (and the port's sums), from the daemon.
bool counts_of(uint32_t qpn, const uint64_t*& values, Snapshot& snap) {
  sv::Fd sock;
  if (sv::connect_seqpacket(sv::socket_path(sv::runtime_dir()), sock) != 0) return false;
  uint32_t seq = 0;
  if (query(sock.get(), seq, snap) != 0) return false;
  for (const auto& q : snap.qps)
    if (q.qpn == qpn) {
      values = q.values;
      return true;
    }
  return false;
}

TEST(Counters, ExactCountsOfAScriptedPatternPerQp) {
  Side a, b;
  Side::Options o;
  ASSERT_EQ(0, a.open(o));
  ASSERT_EQ(0, b.open(o));
  ASSERT_EQ(0, a.connect(b.qp->qp_num, o));
  ASSERT_EQ(0, b.connect(a.qp->qp_num, o));
  // a -> b: 10 WRITEs of 100 B and 7 READs of 64 B (fast path), 5 SENDs of
  // 256 B (fast), 3 SENDs of 2 x 32 B and 2 WRITEs with immediate of 16 B
  // (general path), 4 fetch-and-adds. b -> a: 6 SENDs of 8 B.
  post_recv(b, 10);
  post_recv(a, 6);
  for (int i = 0; i < 10; ++i) post(a, b, IBV_WR_RDMA_WRITE, 100);
  for (int i = 0; i < 7; ++i) post(a, b, IBV_WR_RDMA_READ, 64);
  for (int i = 0; i < 5; ++i) post(a, b, IBV_WR_SEND, 256);
  for (int i = 0; i < 3; ++i) post(a, b, IBV_WR_SEND, 32, 2);
  for (int i = 0; i < 2; ++i) post(a, b, IBV_WR_RDMA_WRITE_WITH_IMM, 16);
  for (int i = 0; i < 4; ++i) post(a, b, IBV_WR_ATOMIC_FETCH_AND_ADD, 8);
  for (int i = 0; i < 6; ++i) post(b, a, IBV_WR_SEND, 8);

  const uint64_t* qa = nullptr;
  const uint64_t* qb = nullptr;
  Snapshot sa, sb;
  ASSERT_TRUE(counts_of(a.qp->qp_num, qa, sa));
  ASSERT_TRUE(counts_of(b.qp->qp_num, qb, sb));
  const uint64_t a_sent = 10 * 100 + 5 * 256 + 3 * 64 + 2 * 16, a_read = 7 * 64;
  EXPECT_EQ(5u + 3u, qa[kRdmaSends]);
  EXPECT_EQ(6u, qa[kRdmaRecvs]);
  EXPECT_EQ(a_sent, qa[kSentBytes]);
  EXPECT_EQ(a_read + 6 * 8, qa[kRcvdBytes]);
  EXPECT_EQ(10u + 7 + 5 + 3 + 2 + 4, qa[kShmOps]);
  EXPECT_EQ(6u, qb[kRdmaSends]);
  EXPECT_EQ(5u + 3 + 2, qb[kRdmaRecvs]);
  EXPECT_EQ(6 * 8 + a_read, qb[kSentBytes]);  // READ responses leave b
  EXPECT_EQ(a_sent, qb[kRcvdBytes]);
  EXPECT_EQ(6u, qb[kShmOps]);
  for (const uint64_t* q : {qa, qb}) {
    EXPECT_EQ(0u, q[kSentPkts]) << "no packet on this path";
    EXPECT_EQ(0u, q[kMediatedOps]);
    EXPECT_EQ(0u, q[kShmErrors]);
  }
  // The port's sums hold both QPs' (and whatever this binary's other tests counted).
  EXPECT_GE(sb.port[kRdmaSends], qa[kRdmaSends] + qb[kRdmaSends]);
  EXPECT_GE(sb.port[kSentBytes], qa[kSentBytes] + qb[kSentBytes]);
}

// A request that fails on the shared-memory path (a bad R_Key) counts as an
// error, not as an operation carried out; once the QP is gone its counts
// stay in the port's.
TEST(Counters, AnErrorIsCountedAndADestroyedQpsCountsStayInThePorts) {
  Snapshot before;
  uint32_t qpn = 0;
  {
    Side a, b;
    Side::Options o;
    ASSERT_EQ(0, a.open(o));  // the daemon runs from here on
    ASSERT_EQ(0, b.open(o));
    {
      sv::Fd sock;
      ASSERT_EQ(0, sv::connect_seqpacket(sv::socket_path(sv::runtime_dir()), sock));
      uint32_t seq = 0;
      ASSERT_EQ(0, query(sock.get(), seq, before, false));
    }
    ASSERT_EQ(0, a.connect(b.qp->qp_num, o));
    ASSERT_EQ(0, b.connect(a.qp->qp_num, o));
    ibv_sge s0{reinterpret_cast<uint64_t>(a.buf), 40, a.mr->lkey};
    ibv_send_wr w0{};
    w0.sg_list = &s0;
    w0.num_sge = 1;
    w0.opcode = IBV_WR_RDMA_WRITE;
    w0.send_flags = IBV_SEND_SIGNALED;
    w0.wr.rdma.remote_addr = reinterpret_cast<uint64_t>(b.buf);
    w0.wr.rdma.rkey = b.mr->rkey;
    ibv_send_wr* bad0;
    ASSERT_EQ(0, ibv_post_send(a.qp, &w0, &bad0));
    b.mr->rkey ^= 0x100;
    ibv_sge s{reinterpret_cast<uint64_t>(a.buf), 8, a.mr->lkey};
    ibv_send_wr w{};
    w.sg_list = &s;
    w.num_sge = 1;
    w.opcode = IBV_WR_RDMA_WRITE;
    w.wr.rdma.remote_addr = reinterpret_cast<uint64_t>(b.buf);
    w.wr.rdma.rkey = b.mr->rkey;
    ibv_send_wr* bad;
    ASSERT_EQ(0, ibv_post_send(a.qp, &w, &bad));
    auto wc = poll(a.cq, 2);  // the WRITE's, then the failed one's
    ASSERT_EQ(2u, wc.size());
    EXPECT_EQ(IBV_WC_REM_ACCESS_ERR, wc[1].status);
    b.mr->rkey ^= 0x100;
    qpn = a.qp->qp_num;
    const uint64_t* qa = nullptr;
    Snapshot s1;
    ASSERT_TRUE(counts_of(qpn, qa, s1));
    EXPECT_EQ(1u, qa[kShmOps]);
    EXPECT_EQ(40u, qa[kSentBytes]);
    EXPECT_EQ(1u, qa[kShmErrors]);
  }
  const uint64_t* gone = nullptr;
  Snapshot after;
  EXPECT_FALSE(counts_of(qpn, gone, after)) << "a destroyed QP is not listed";
  EXPECT_EQ(before.port[kShmOps] + 1, after.port[kShmOps]);
  EXPECT_EQ(before.port[kShmErrors] + 1, after.port[kShmErrors]);
  EXPECT_EQ(before.port[kSentBytes] + 40, after.port[kSentBytes]);
}

}  // namespace
}  // namespace svtest
