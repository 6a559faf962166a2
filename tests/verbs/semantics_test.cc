// One operation, three paths: every case below runs on the shared-memory
// path (same user), between users (the daemon carries the request) and on
// the wire (RoCEv2 between two network namespaces), from the public verbs
// API, each side in a process of its own (semantics_agent.h). What each
// asserts is IBTA vol. 1 (section cited per case), as libibverbs' man pages
// and rxe (drivers/infiniband/sw/rxe) read it, and softverbs' own error
// class policy (src/common/access.h) where the spec leaves a choice.
//
// A path that does something else is a drift: its (case, path) is listed in
// kDrifts with what it does instead and is skipped saying so; delete the row
// once the path follows the rule.
#include <arpa/inet.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "semantics_agent.h"

namespace svsem {
namespace {

struct Drift {
  const char* test;  // the case's name, without the path
  Path path;
  const char* what;  // what the path does instead of the rule
};

constexpr Drift kDrifts[] = {
    {"UdSendArrivesAfterTheGrh", Path::kMediated,
     "UD between users is not carried (docs/SHARING.md): the SEND completes IBV_WC_SUCCESS at the requester, the "
     "responder's receive never completes"},
};

const char* drift_of(const std::string& test, Path p) {
  for (const Drift& d : kDrifts)
    if (d.path == p && test == d.test) return d.what;
  return nullptr;
}

constexpr uint8_t kGuard = 0xEE;
const uint32_t kSizes[] = {0, 1, 7, 8, 9, 4096, 65537};

class Semantics : public ::testing::TestWithParam<Path> {
 protected:
  void SetUp() override {
    const std::string why = path_unavailable(GetParam());
    if (!why.empty()) GTEST_SKIP() << why;
    std::string name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    name = name.substr(0, name.find('/'));
    if (const char* d = drift_of(name, GetParam())) GTEST_SKIP() << "drift: " << d;
    ASSERT_TRUE(req.start(GetParam(), 0));
    ASSERT_TRUE(resp.start(GetParam(), 1));
  }

  // Opens both sides (the requester with `ra`, the responder with `rb`)
  // and connects them.
  void open_pair(OpenArgs ra = {}, OpenArgs rb = {}) {
    ra.gid_index = rb.gid_index = GetParam() == Path::kWire ? 1 : 0;  // the veth's address, or loopback
    ASSERT_EQ(0, req.open(ra, a));
    ASSERT_EQ(0, resp.open(rb, b));
    ASSERT_EQ(0, resp.connect(a));
    ASSERT_EQ(0, req.connect(b));
  }

  // New agents, opened and connected: after an error that took the QPs down.
  void fresh_pair(OpenArgs ra = {}, OpenArgs rb = {}) {
    req.stop();
    resp.stop();
    ASSERT_TRUE(req.start(GetParam(), 0));
    ASSERT_TRUE(resp.start(GetParam(), 1));
    open_pair(ra, rb);
  }

  // The one completion of `side` (failing, not hanging, when none comes).
  static ibv_wc one(Agent& side) {
    auto wc = side.poll(1);
    EXPECT_EQ(1u, wc.size()) << "no completion within 20 s";
    return wc.empty() ? ibv_wc{} : wc[0];
  }

  // Posts `w` on the requester and returns its completion.
  ibv_wc run(const Wr& w) {
    EXPECT_EQ(0, req.post_send(w));
    return one(req);
  }

  Wr rdma(uint32_t opcode, uint64_t local_off, uint32_t len, uint64_t remote_off) const {
    Wr w;
    w.opcode = opcode;
    w.off = local_off;
    w.len = len;
    w.raddr = b.addr + remote_off;
    w.rkey = b.rkey;
    return w;
  }

  Wr atomic(uint32_t opcode, uint64_t remote_off, uint64_t compare_add, uint64_t swap) const {
    Wr w = rdma(opcode, 0, 8, remote_off);
    w.compare_add = compare_add;
    w.swap = swap;
    return w;
  }

  uint64_t remote_word(uint64_t off) {
    auto v = resp.load(off, 8);
    uint64_t x = 0;
    if (v.size() == 8) std::memcpy(&x, v.data(), 8);
    return x;
  }
  uint64_t local_word(uint64_t off) {
    auto v = req.load(off, 8);
    uint64_t x = 0;
    if (v.size() == 8) std::memcpy(&x, v.data(), 8);
    return x;
  }
  bool store_word(Agent& side, uint64_t off, uint64_t x) {
    std::vector<uint8_t> v(8);
    std::memcpy(v.data(), &x, 8);
    return side.store(off, v);
  }

  Agent req, resp;
  Endpoint a, b;
};

// `got` is `guard` bytes of kGuard, then `want`, then kGuard to its end.
void expect_framed(const std::vector<uint8_t>& got, uint64_t guard, const std::vector<uint8_t>& want) {
  ASSERT_GE(got.size(), guard + want.size());
  for (uint64_t i = 0; i < got.size(); ++i) {
    const uint8_t w = i < guard || i >= guard + want.size() ? kGuard : want[i - guard];
    if (got[i] != w) {
      ADD_FAILURE() << "byte " << i << " of the frame is " << int(got[i]) << ", not " << int(w) << " (message of "
                    << want.size() << " bytes at " << guard << ")";
      return;
    }
  }
}

// ---- Data movement, byte for byte (IBTA 9.4.1 SEND, 9.4.3 RDMA WRITE,
// 9.4.4 RDMA READ; zero-length messages are valid, 9.4.1.1 / 9.4.3.1) ------

TEST_P(Semantics, WriteIsByteExact) {
  open_pair();
  for (uint32_t n : kSizes) {
    SCOPED_TRACE("size " + std::to_string(n));
    ASSERT_TRUE(resp.store(0, std::vector<uint8_t>(n + 128, kGuard)));
    ASSERT_TRUE(req.store(128, pattern(uint8_t(n), n)));
    ibv_wc wc = run(rdma(IBV_WR_RDMA_WRITE, 128, n, 64));
    ASSERT_EQ(IBV_WC_SUCCESS, wc.status) << ibv_wc_status_str(wc.status);
    EXPECT_EQ(IBV_WC_RDMA_WRITE, wc.opcode);
    expect_framed(resp.load(0, n + 128), 64, pattern(uint8_t(n), n));
  }
}

TEST_P(Semantics, ReadIsByteExact) {
  open_pair();
  for (uint32_t n : kSizes) {
    SCOPED_TRACE("size " + std::to_string(n));
    ASSERT_TRUE(resp.store(64, pattern(uint8_t(n + 1), n)));
    ASSERT_TRUE(req.store(64, std::vector<uint8_t>(n + 128, kGuard)));
    ibv_wc wc = run(rdma(IBV_WR_RDMA_READ, 128, n, 64));
    ASSERT_EQ(IBV_WC_SUCCESS, wc.status) << ibv_wc_status_str(wc.status);
    EXPECT_EQ(IBV_WC_RDMA_READ, wc.opcode);
    expect_framed(req.load(64, n + 128), 64, pattern(uint8_t(n + 1), n));
  }
}

// The receive is larger than the message: byte_len is the message's length
// and nothing past it is written (9.4.1; ibv_poll_cq(3) byte_len).
TEST_P(Semantics, SendIsByteExact) {
  open_pair();
  for (uint32_t n : kSizes) {
    SCOPED_TRACE("size " + std::to_string(n));
    ASSERT_TRUE(resp.store(0, std::vector<uint8_t>(n + 192, kGuard)));
    Recv r;
    r.off = 64;
    r.len = n + 64;
    r.wr_id = 1000 + n;
    ASSERT_EQ(0, resp.post_recv(r));
    ASSERT_TRUE(req.store(128, pattern(uint8_t(n + 2), n)));
    Wr w;
    w.opcode = IBV_WR_SEND;
    w.off = 128;
    w.len = n;
    ibv_wc wc = run(w);
    ASSERT_EQ(IBV_WC_SUCCESS, wc.status) << ibv_wc_status_str(wc.status);
    EXPECT_EQ(IBV_WC_SEND, wc.opcode);
    ibv_wc rc = one(resp);
    ASSERT_EQ(IBV_WC_SUCCESS, rc.status) << ibv_wc_status_str(rc.status);
    EXPECT_EQ(IBV_WC_RECV, rc.opcode);
    EXPECT_EQ(1000u + n, rc.wr_id);
    EXPECT_EQ(n, rc.byte_len);
    EXPECT_EQ(0u, rc.wc_flags & IBV_WC_WITH_IMM);
    expect_framed(resp.load(0, n + 192), 64, pattern(uint8_t(n + 2), n));
  }
}

// Scatter/gather lists (IBTA 10.7.2.1 / 9.4: a message is its gather list's
// bytes in order; a receive's scatter list is filled in order, each element
// to its length before the next; ibv_post_send(3), ibv_post_recv(3)).
TEST_P(Semantics, GatherAndScatterListsKeepTheOrder) {
  open_pair();
  const uint32_t total = 2000;
  const auto msg = pattern(21, total);
  // The requester's message in three pieces: [0, 3) at 0, [3, 1503) at 100, the rest at 4000.
  ASSERT_TRUE(req.store(0, std::vector<uint8_t>(msg.begin(), msg.begin() + 3)));
  ASSERT_TRUE(req.store(100, std::vector<uint8_t>(msg.begin() + 3, msg.begin() + 1503)));
  ASSERT_TRUE(req.store(4000, std::vector<uint8_t>(msg.begin() + 1503, msg.end())));
  auto gather = [](Wr& w) {
    w.off = 0;
    w.len = 3;
    w.more = 2;
    w.more_sge[0] = {100, 1500, 0};
    w.more_sge[1] = {4000, total - 1503, 0};
  };
  // SEND: the responder's receive in three pieces of 5, 1000 and 4096 bytes.
  ASSERT_TRUE(resp.store(0, std::vector<uint8_t>(64 * 1024, kGuard)));
  Recv r;
  r.off = 64;
  r.len = 5;
  r.more = 2;
  r.more_sge[0] = {8192, 1000, 0};
  r.more_sge[1] = {16384, 4096, 0};
  ASSERT_EQ(0, resp.post_recv(r));
  Wr w;
  w.opcode = IBV_WR_SEND;
  gather(w);
  ibv_wc wc = run(w);
  ASSERT_EQ(IBV_WC_SUCCESS, wc.status) << ibv_wc_status_str(wc.status);
  ibv_wc rc = one(resp);
  ASSERT_EQ(IBV_WC_SUCCESS, rc.status) << ibv_wc_status_str(rc.status);
  EXPECT_EQ(total, rc.byte_len);
  expect_framed(resp.load(0, 64 + 5 + 64), 64, std::vector<uint8_t>(msg.begin(), msg.begin() + 5));
  expect_framed(resp.load(8192 - 64, 1000 + 128), 64, std::vector<uint8_t>(msg.begin() + 5, msg.begin() + 1005));
  expect_framed(resp.load(16384 - 64, 4096 + 128), 64, std::vector<uint8_t>(msg.begin() + 1005, msg.end()));
  // WRITE: gathered into one contiguous range.
  Wr wr = rdma(IBV_WR_RDMA_WRITE, 0, 0, 32768 + 64);
  gather(wr);
  wc = run(wr);
  ASSERT_EQ(IBV_WC_SUCCESS, wc.status) << ibv_wc_status_str(wc.status);
  expect_framed(resp.load(32768, total + 128), 64, msg);
  // READ: that range back, scattered over three pieces of the requester's.
  ASSERT_TRUE(req.store(0, std::vector<uint8_t>(64 * 1024, kGuard)));
  Wr rd = rdma(IBV_WR_RDMA_READ, 64, 7, 32768 + 64);
  rd.more = 2;
  rd.more_sge[0] = {8192, 993, 0};
  rd.more_sge[1] = {16384, total - 1000, 0};
  wc = run(rd);
  ASSERT_EQ(IBV_WC_SUCCESS, wc.status) << ibv_wc_status_str(wc.status);
  expect_framed(req.load(0, 64 + 7 + 64), 64, std::vector<uint8_t>(msg.begin(), msg.begin() + 7));
  expect_framed(req.load(8192 - 64, 993 + 128), 64, std::vector<uint8_t>(msg.begin() + 7, msg.begin() + 1000));
  expect_framed(req.load(16384 - 64, total - 1000 + 128), 64, std::vector<uint8_t>(msg.begin() + 1000, msg.end()));
}

// ---- Immediate data (9.4.1, 9.4.3: ImmDt consumes a receive; the receive
// completion carries it with IBV_WC_WITH_IMM, opcode RECV_RDMA_WITH_IMM for
// a WRITE; ibv_poll_cq(3)) -------------------------------------------------

TEST_P(Semantics, WriteWithImmediateCompletesTheReceive) {
  open_pair();
  Recv r;
  r.wr_id = 77;  // no scatter list: the data goes where the WRITE says
  ASSERT_EQ(0, resp.post_recv(r));
  ASSERT_TRUE(req.store(0, pattern(5, 100)));
  Wr w = rdma(IBV_WR_RDMA_WRITE_WITH_IMM, 0, 100, 512);
  w.imm = htonl(0x12345678);
  ibv_wc wc = run(w);
  ASSERT_EQ(IBV_WC_SUCCESS, wc.status) << ibv_wc_status_str(wc.status);
  EXPECT_EQ(IBV_WC_RDMA_WRITE, wc.opcode);
  ibv_wc rc = one(resp);
  ASSERT_EQ(IBV_WC_SUCCESS, rc.status) << ibv_wc_status_str(rc.status);
  EXPECT_EQ(IBV_WC_RECV_RDMA_WITH_IMM, rc.opcode);
  EXPECT_EQ(77u, rc.wr_id);
  EXPECT_TRUE(rc.wc_flags & IBV_WC_WITH_IMM);
  EXPECT_EQ(htonl(0x12345678), rc.imm_data);
  EXPECT_EQ(100u, rc.byte_len);  // the WRITE's length (rxe, mlx5)
  EXPECT_EQ(pattern(5, 100), resp.load(512, 100));
}

TEST_P(Semantics, SendWithImmediateCarriesIt) {
  open_pair();
  Recv r;
  r.off = 0;
  r.len = 256;
  r.wr_id = 78;
  ASSERT_EQ(0, resp.post_recv(r));
  ASSERT_TRUE(req.store(0, pattern(6, 32)));
  Wr w;
  w.opcode = IBV_WR_SEND_WITH_IMM;
  w.len = 32;
  w.imm = htonl(0xa5a5c3c3);
  ibv_wc wc = run(w);
  ASSERT_EQ(IBV_WC_SUCCESS, wc.status) << ibv_wc_status_str(wc.status);
  EXPECT_EQ(IBV_WC_SEND, wc.opcode);
  ibv_wc rc = one(resp);
  ASSERT_EQ(IBV_WC_SUCCESS, rc.status) << ibv_wc_status_str(rc.status);
  EXPECT_EQ(IBV_WC_RECV, rc.opcode);
  EXPECT_TRUE(rc.wc_flags & IBV_WC_WITH_IMM);
  EXPECT_EQ(htonl(0xa5a5c3c3), rc.imm_data);
  EXPECT_EQ(32u, rc.byte_len);
  EXPECT_EQ(pattern(6, 32), resp.load(0, 32));
}

// ---- Atomics (9.4.5: the original value returns to the requester's SGE;
// CmpSwap writes Swap only if the word equals Compare; FetchAdd adds, 64-bit
// with carry) -------------------------------------------------------------

TEST_P(Semantics, CompareAndSwapReturnsTheOriginalBothWays) {
  open_pair();
  ASSERT_TRUE(store_word(resp, 256, 0x1111222233334444ull));
  ibv_wc wc = run(atomic(IBV_WR_ATOMIC_CMP_AND_SWP, 256, 0x1111222233334444ull, 0xaaaabbbbccccddddull));
  ASSERT_EQ(IBV_WC_SUCCESS, wc.status) << ibv_wc_status_str(wc.status);
  EXPECT_EQ(IBV_WC_COMP_SWAP, wc.opcode);
  EXPECT_EQ(0x1111222233334444ull, local_word(0));
  EXPECT_EQ(0xaaaabbbbccccddddull, remote_word(256));
  // A compare that fails: the word stays, its value still comes back.
  wc = run(atomic(IBV_WR_ATOMIC_CMP_AND_SWP, 256, 0x1111222233334444ull, 0x5555ull));
  ASSERT_EQ(IBV_WC_SUCCESS, wc.status) << ibv_wc_status_str(wc.status);
  EXPECT_EQ(0xaaaabbbbccccddddull, local_word(0));
  EXPECT_EQ(0xaaaabbbbccccddddull, remote_word(256));
}

TEST_P(Semantics, FetchAndAddReturnsTheOriginalAndCarries) {
  open_pair();
  ASSERT_TRUE(store_word(resp, 256, 0x00000000ffffffffull));
  ibv_wc wc = run(atomic(IBV_WR_ATOMIC_FETCH_AND_ADD, 256, 1, 0));
  ASSERT_EQ(IBV_WC_SUCCESS, wc.status) << ibv_wc_status_str(wc.status);
  EXPECT_EQ(IBV_WC_FETCH_ADD, wc.opcode);
  EXPECT_EQ(0x00000000ffffffffull, local_word(0));
  EXPECT_EQ(0x0000000100000000ull, remote_word(256));
  wc = run(atomic(IBV_WR_ATOMIC_FETCH_AND_ADD, 256, ~0ull, 0));  // adding -1 wraps
  ASSERT_EQ(IBV_WC_SUCCESS, wc.status) << ibv_wc_status_str(wc.status);
  EXPECT_EQ(0x0000000100000000ull, local_word(0));
  EXPECT_EQ(0x00000000ffffffffull, remote_word(256));
}

// An atomic's address must be 8-byte aligned (9.4.5); the responder NAKs it
// as an invalid request (9.7.5.2.4; rxe: RESPST_ERR_MISALIGNED_ATOMIC).
TEST_P(Semantics, MisalignedAtomicIsAnInvalidRequest) {
  open_pair();
  ASSERT_TRUE(store_word(resp, 256, 7));
  ASSERT_TRUE(store_word(resp, 264, 9));
  ibv_wc wc = run(atomic(IBV_WR_ATOMIC_FETCH_AND_ADD, 260, 1, 0));
  EXPECT_EQ(IBV_WC_REM_INV_REQ_ERR, wc.status) << ibv_wc_status_str(wc.status);
  EXPECT_EQ(7u, remote_word(256));
  EXPECT_EQ(9u, remote_word(264));
}

// The MR must grant remote atomic access (10.6.3.2 / 9.7.5.2.4: NAK remote
// access error; rxe: RESPST_ERR_RKEY_VIOLATION).
TEST_P(Semantics, AtomicWithoutRemoteAtomicAccessOnTheMr) {
  OpenArgs rb;
  rb.mr_access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
  open_pair({}, rb);
  ASSERT_TRUE(store_word(resp, 256, 7));
  ibv_wc wc = run(atomic(IBV_WR_ATOMIC_CMP_AND_SWP, 256, 7, 8));
  EXPECT_EQ(IBV_WC_REM_ACCESS_ERR, wc.status) << ibv_wc_status_str(wc.status);
  EXPECT_EQ(7u, remote_word(256));
}

// ... nor may a QP whose access flags lack it take one (10.2.x QP access
// flags; 9.7.5.2.4).
TEST_P(Semantics, AtomicWithoutRemoteAtomicAccessOnTheQp) {
  OpenArgs rb;
  rb.qp_access = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
  open_pair({}, rb);
  ASSERT_TRUE(store_word(resp, 256, 7));
  ibv_wc wc = run(atomic(IBV_WR_ATOMIC_FETCH_AND_ADD, 256, 1, 0));
  EXPECT_EQ(IBV_WC_REM_ACCESS_ERR, wc.status) << ibv_wc_status_str(wc.status);
  EXPECT_EQ(7u, remote_word(256));
}

// ---- The responder's receive errors (9.9.3.1.2 responder class A/C errors;
// src/common/access.h receive_fault): a message longer than the receive is
// the receive's local length error and the requester's invalid request; a
// receive whose L_Key is not valid is the receive's local protection error
// and the requester's remote operational error --------------------------------

TEST_P(Semantics, ReceiveTooShortForTheSend) {
  open_pair();
  Recv r;
  r.len = 16;
  r.wr_id = 55;
  ASSERT_EQ(0, resp.post_recv(r));
  ASSERT_TRUE(resp.store(16, std::vector<uint8_t>(64, kGuard)));
  Wr w;
  w.opcode = IBV_WR_SEND;
  w.off = 0;
  w.len = 64;
  ibv_wc wc = run(w);
  EXPECT_EQ(IBV_WC_REM_INV_REQ_ERR, wc.status) << ibv_wc_status_str(wc.status);
  ibv_wc rc = one(resp);
  EXPECT_EQ(55u, rc.wr_id);
  EXPECT_EQ(IBV_WC_LOC_LEN_ERR, rc.status) << ibv_wc_status_str(rc.status);
  EXPECT_EQ(std::vector<uint8_t>(64, kGuard), resp.load(16, 64));  // nothing past the receive
}

TEST_P(Semantics, ReceiveWithABadLKey) {
  open_pair();
  Recv r;
  r.len = 64;
  r.wr_id = 56;
  r.lkey_xor = 0x80000000;
  ASSERT_EQ(0, resp.post_recv(r));
  Wr w;
  w.opcode = IBV_WR_SEND;
  w.len = 32;
  ibv_wc wc = run(w);
  EXPECT_EQ(IBV_WC_REM_OP_ERR, wc.status) << ibv_wc_status_str(wc.status);
  ibv_wc rc = one(resp);
  EXPECT_EQ(56u, rc.wr_id);
  EXPECT_EQ(IBV_WC_LOC_PROT_ERR, rc.status) << ibv_wc_status_str(rc.status);
}

// ---- R_Key and bounds (10.6.7.2; 9.7.5.2.4 NAK remote access error) ------

TEST_P(Semantics, WriteWithABadRKey) {
  open_pair();
  Wr w = rdma(IBV_WR_RDMA_WRITE, 0, 16, 0);
  w.rkey ^= 0x80000000;
  ibv_wc wc = run(w);
  EXPECT_EQ(IBV_WC_REM_ACCESS_ERR, wc.status) << ibv_wc_status_str(wc.status);
}

TEST_P(Semantics, WriteBeyondTheMr) {
  open_pair();
  const uint64_t end = OpenArgs{}.len;
  ASSERT_TRUE(resp.store(end - 64, std::vector<uint8_t>(64, kGuard)));
  ASSERT_TRUE(req.store(0, pattern(9, 16)));
  ibv_wc wc = run(rdma(IBV_WR_RDMA_WRITE, 0, 16, end - 8));
  EXPECT_EQ(IBV_WC_REM_ACCESS_ERR, wc.status) << ibv_wc_status_str(wc.status);
  EXPECT_EQ(std::vector<uint8_t>(64, kGuard), resp.load(end - 64, 64));
}

// Every remote access check of READ, WRITE and the atomics fails the same
// way (10.6.7.2 R_Key checks, 9.7.5.2.4 NAK remote access error, rxe
// RESPST_ERR_RKEY_VIOLATION): a bad key, a range past the MR, an MR or a QP
// without the right. Each on a fresh pair (the error takes both QPs down).
TEST_P(Semantics, EveryRemoteAccessViolationIsARemoteAccessError) {
  const uint32_t all = OpenArgs{}.mr_access;
  struct Case {
    const char* what;
    uint32_t opcode;
    uint32_t mr_access;  // the responder's MR
    uint32_t qp_access;  // the responder's QP
    uint32_t rkey_xor;
    uint64_t remote_off;
  } const cases[] = {
      {"READ, bad R_Key", IBV_WR_RDMA_READ, all, OpenArgs{}.qp_access, 0x80000000, 0},
      {"READ past the MR", IBV_WR_RDMA_READ, all, OpenArgs{}.qp_access, 0, OpenArgs{}.len - 8},
      {"READ, MR without REMOTE_READ", IBV_WR_RDMA_READ, all & ~IBV_ACCESS_REMOTE_READ, OpenArgs{}.qp_access, 0, 0},
      {"READ, QP without REMOTE_READ", IBV_WR_RDMA_READ, all, OpenArgs{}.qp_access & ~IBV_ACCESS_REMOTE_READ, 0, 0},
      {"WRITE, MR without REMOTE_WRITE", IBV_WR_RDMA_WRITE, all & ~IBV_ACCESS_REMOTE_WRITE, OpenArgs{}.qp_access, 0,
       0},
      {"WRITE, QP without REMOTE_WRITE", IBV_WR_RDMA_WRITE, all, OpenArgs{}.qp_access & ~IBV_ACCESS_REMOTE_WRITE, 0,
       0},
      {"FETCH_ADD, bad R_Key", IBV_WR_ATOMIC_FETCH_AND_ADD, all, OpenArgs{}.qp_access, 0x80000000, 0},
      {"CMP_SWP past the MR", IBV_WR_ATOMIC_CMP_AND_SWP, all, OpenArgs{}.qp_access, 0, OpenArgs{}.len},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    OpenArgs rb;
    rb.mr_access = c.mr_access;
    rb.qp_access = c.qp_access;
    fresh_pair({}, rb);
    ASSERT_TRUE(store_word(resp, 0, 5));
    Wr w = c.opcode == IBV_WR_ATOMIC_FETCH_AND_ADD || c.opcode == IBV_WR_ATOMIC_CMP_AND_SWP
               ? atomic(c.opcode, c.remote_off, 5, 6)
               : rdma(c.opcode, 0, 16, c.remote_off);
    w.rkey ^= c.rkey_xor;
    ibv_wc wc = run(w);
    EXPECT_EQ(IBV_WC_REM_ACCESS_ERR, wc.status) << ibv_wc_status_str(wc.status);
    EXPECT_EQ(5u, remote_word(0));
  }
}

// After an error the responder detected, both QPs are in the error state:
// what else each had posted completes with IBV_WC_WR_FLUSH_ERR (IBTA
// 9.9.3.1.2 / 10.3.1 "Error" state; 11.6.2 flushed WRs), in order.
TEST_P(Semantics, AResponderErrorFlushesWhatFollows) {
  open_pair();
  for (uint64_t i = 0; i < 2; ++i) {
    Recv r;
    r.len = 16;
    r.wr_id = 60 + i;
    ASSERT_EQ(0, resp.post_recv(r));
  }
  for (uint64_t i = 0; i < 2; ++i) {
    Wr w;
    w.opcode = IBV_WR_SEND;
    w.len = 64;  // longer than either receive
    w.wr_id = 70 + i;
    ASSERT_EQ(0, req.post_send(w));
  }
  auto wc = req.poll(2);
  ASSERT_EQ(2u, wc.size());
  EXPECT_EQ(70u, wc[0].wr_id);
  EXPECT_EQ(IBV_WC_REM_INV_REQ_ERR, wc[0].status) << ibv_wc_status_str(wc[0].status);
  EXPECT_EQ(71u, wc[1].wr_id);
  EXPECT_EQ(IBV_WC_WR_FLUSH_ERR, wc[1].status) << ibv_wc_status_str(wc[1].status);
  auto rc = resp.poll(2);
  ASSERT_EQ(2u, rc.size());
  EXPECT_EQ(60u, rc[0].wr_id);
  EXPECT_EQ(IBV_WC_LOC_LEN_ERR, rc[0].status) << ibv_wc_status_str(rc[0].status);
  EXPECT_EQ(61u, rc[1].wr_id);
  EXPECT_EQ(IBV_WC_WR_FLUSH_ERR, rc[1].status) << ibv_wc_status_str(rc[1].status);
}

// Inline data (IBV_SEND_INLINE, ibv_post_send(3)): the payload is taken at
// post time; the buffer may change at once without changing what lands.
TEST_P(Semantics, InlineSendAndWriteCarryThePostedBytes) {
  open_pair();
  for (uint32_t n : {1u, 7u, 8u, 9u, kMaxInline}) {
    SCOPED_TRACE("size " + std::to_string(n));
    ASSERT_TRUE(resp.store(0, std::vector<uint8_t>(n + 128, kGuard)));
    Recv r;
    r.off = 64;
    r.len = n;
    ASSERT_EQ(0, resp.post_recv(r));
    ASSERT_TRUE(req.store(0, pattern(uint8_t(n + 3), n)));
    Wr w = rdma(IBV_WR_RDMA_WRITE, 0, n, 4096 + 64);
    w.send_flags |= IBV_SEND_INLINE;
    ASSERT_EQ(0, req.post_send(w));
    w.opcode = IBV_WR_SEND;
    ASSERT_EQ(0, req.post_send(w));
    ASSERT_TRUE(req.store(0, std::vector<uint8_t>(n, 0)));  // after the post: must not matter
    auto wc = req.poll(2);
    ASSERT_EQ(2u, wc.size());
    EXPECT_EQ(IBV_WC_SUCCESS, wc[0].status) << ibv_wc_status_str(wc[0].status);
    EXPECT_EQ(IBV_WC_SUCCESS, wc[1].status) << ibv_wc_status_str(wc[1].status);
    ibv_wc rc = one(resp);
    EXPECT_EQ(IBV_WC_SUCCESS, rc.status) << ibv_wc_status_str(rc.status);
    EXPECT_EQ(n, rc.byte_len);
    expect_framed(resp.load(0, n + 128), 64, pattern(uint8_t(n + 3), n));
    EXPECT_EQ(pattern(uint8_t(n + 3), n), resp.load(4096 + 64, n));
  }
}

// Receiver not ready (IBTA 9.7.5.2.8, C9-144 / o9-35): a SEND with no
// receive posted is RNR NAKed and retried rnr_retry times (7: for ever);
// past them the requester completes with IBV_WC_RNR_RETRY_EXC_ERR.
TEST_P(Semantics, ReceiverNotReadyWithoutRetriesFails) {
  OpenArgs ra;
  ra.rnr_retry = 0;
  open_pair(ra, {});
  Wr w;
  w.opcode = IBV_WR_SEND;
  w.len = 8;
  ibv_wc wc = run(w);
  EXPECT_EQ(IBV_WC_RNR_RETRY_EXC_ERR, wc.status) << ibv_wc_status_str(wc.status);
}

TEST_P(Semantics, ReceiverNotReadyIsRetriedUntilAReceiveComes) {
  open_pair();
  ASSERT_TRUE(req.store(0, pattern(31, 64)));
  Wr w;
  w.opcode = IBV_WR_SEND;
  w.len = 64;
  ASSERT_EQ(0, req.post_send(w));
  Recv r;  // posted after the SEND, whenever that arrived
  r.len = 64;
  r.wr_id = 9;
  ASSERT_EQ(0, resp.post_recv(r));
  ibv_wc wc = one(req);
  EXPECT_EQ(IBV_WC_SUCCESS, wc.status) << ibv_wc_status_str(wc.status);
  ibv_wc rc = one(resp);
  EXPECT_EQ(IBV_WC_SUCCESS, rc.status) << ibv_wc_status_str(rc.status);
  EXPECT_EQ(9u, rc.wr_id);
  EXPECT_EQ(pattern(31, 64), resp.load(0, 64));
}

// ---- Completion opcodes (ibv_poll_cq(3), IBTA 11.4.2.1): each send opcode's
// own, and the receive's for what consumed it --------------------------------

TEST_P(Semantics, CompletionOpcodeOfEveryOperation) {
  open_pair();
  for (uint64_t i = 0; i < 3; ++i) {
    Recv r;
    r.off = 4096 * (i + 1);
    r.len = 64;
    r.wr_id = 500 + i;
    ASSERT_EQ(0, resp.post_recv(r));
  }
  struct {
    uint32_t op;
    ibv_wc_opcode wc;
  } const ops[] = {
      {IBV_WR_RDMA_WRITE, IBV_WC_RDMA_WRITE},         {IBV_WR_RDMA_WRITE_WITH_IMM, IBV_WC_RDMA_WRITE},
      {IBV_WR_SEND, IBV_WC_SEND},                     {IBV_WR_SEND_WITH_IMM, IBV_WC_SEND},
      {IBV_WR_RDMA_READ, IBV_WC_RDMA_READ},           {IBV_WR_ATOMIC_CMP_AND_SWP, IBV_WC_COMP_SWAP},
      {IBV_WR_ATOMIC_FETCH_AND_ADD, IBV_WC_FETCH_ADD},
  };
  for (const auto& o : ops) {
    Wr w = rdma(o.op, 0, 8, 0);
    w.wr_id = 900 + o.op;
    ibv_wc wc = run(w);
    EXPECT_EQ(IBV_WC_SUCCESS, wc.status) << "opcode " << o.op << ": " << ibv_wc_status_str(wc.status);
    EXPECT_EQ(900u + o.op, wc.wr_id);
    EXPECT_EQ(o.wc, wc.opcode) << "opcode " << o.op;
    EXPECT_EQ(a.qpn, wc.qp_num) << "opcode " << o.op;  // the local QP (ibv_poll_cq(3))
    EXPECT_EQ(0u, wc.wc_flags & IBV_WC_WITH_IMM) << "opcode " << o.op;
  }
  auto rc = resp.poll(3);
  ASSERT_EQ(3u, rc.size());
  const ibv_wc_opcode want[] = {IBV_WC_RECV_RDMA_WITH_IMM, IBV_WC_RECV, IBV_WC_RECV};
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(IBV_WC_SUCCESS, rc[i].status) << ibv_wc_status_str(rc[i].status);
    EXPECT_EQ(500u + i, rc[i].wr_id);
    EXPECT_EQ(want[i], rc[i].opcode) << "receive " << i;
    EXPECT_EQ(b.qpn, rc[i].qp_num) << "receive " << i;
    EXPECT_EQ(i == 1 ? 0u : unsigned(IBV_WC_WITH_IMM), rc[i].wc_flags & IBV_WC_WITH_IMM) << "receive " << i;
  }
}

// ---- Opcodes a QP type does not have (IBTA 9.8.2, table 38 / 3.6.3: UC has
// SEND and RDMA WRITE, UD SEND only): ibv_post_send refuses them with EINVAL
// and posts nothing (ibv_post_send(3)); the QP still works --------------------

TEST_P(Semantics, UcRefusesReadAndAtomics) {
  OpenArgs uc;
  uc.qp_type = IBV_QPT_UC;
  open_pair(uc, uc);
  for (uint32_t op : {IBV_WR_RDMA_READ, IBV_WR_ATOMIC_CMP_AND_SWP, IBV_WR_ATOMIC_FETCH_AND_ADD}) {
    Wr w = rdma(op, 0, 8, 0);
    w.wr_id = 10 + op;
    EXPECT_EQ(EINVAL, req.post_send(w)) << "opcode " << op;
  }
  Wr w = rdma(IBV_WR_RDMA_WRITE, 0, 8, 0);
  w.wr_id = 1;
  ASSERT_EQ(0, req.post_send(w));
  auto wc = req.poll(2, 500);  // the refused ones must not complete
  ASSERT_EQ(1u, wc.size());
  EXPECT_EQ(1u, wc[0].wr_id);
  EXPECT_EQ(IBV_WC_SUCCESS, wc[0].status) << ibv_wc_status_str(wc[0].status);
}

TEST_P(Semantics, UdRefusesRdmaAndAtomics) {
  OpenArgs ud;
  ud.qp_type = IBV_QPT_UD;
  open_pair(ud, ud);
  for (uint32_t op : {IBV_WR_RDMA_WRITE, IBV_WR_RDMA_WRITE_WITH_IMM, IBV_WR_RDMA_READ, IBV_WR_ATOMIC_CMP_AND_SWP,
                      IBV_WR_ATOMIC_FETCH_AND_ADD}) {
    Wr w;
    w.opcode = op;
    w.len = 8;
    w.wr_id = 10 + op;
    EXPECT_EQ(EINVAL, req.post_send(w)) << "opcode " << op;
  }
  Wr w;
  w.opcode = IBV_WR_SEND;
  w.len = 16;
  w.wr_id = 2;
  ASSERT_EQ(0, req.post_send(w));
  auto wc = req.poll(2, 500);
  ASSERT_EQ(1u, wc.size());
  EXPECT_EQ(2u, wc[0].wr_id);
  EXPECT_EQ(IBV_WC_SUCCESS, wc[0].status) << ibv_wc_status_str(wc[0].status);
}

// A UD receive starts with the 40 bytes of the GRH (IBTA 11.4.1.2,
// ibv_post_recv(3)); byte_len counts them; src_qp names the sender.
TEST_P(Semantics, UdSendArrivesAfterTheGrh) {
  OpenArgs ud;
  ud.qp_type = IBV_QPT_UD;
  open_pair(ud, ud);
  Recv r;
  r.len = 40 + 16;
  r.wr_id = 3;
  ASSERT_EQ(0, resp.post_recv(r));
  ASSERT_TRUE(req.store(0, pattern(3, 16)));
  Wr w;
  w.opcode = IBV_WR_SEND_WITH_IMM;
  w.imm = htonl(0x01020304);
  w.len = 16;
  w.wr_id = 2;
  ibv_wc wc = run(w);
  EXPECT_EQ(IBV_WC_SUCCESS, wc.status) << ibv_wc_status_str(wc.status);
  EXPECT_EQ(IBV_WC_SEND, wc.opcode);
  ibv_wc rc = one(resp);
  EXPECT_EQ(IBV_WC_SUCCESS, rc.status) << ibv_wc_status_str(rc.status);
  EXPECT_EQ(IBV_WC_RECV, rc.opcode);
  EXPECT_EQ(40u + 16u, rc.byte_len);
  EXPECT_EQ(a.qpn, rc.src_qp);
  EXPECT_TRUE(rc.wc_flags & IBV_WC_GRH);
  EXPECT_TRUE(rc.wc_flags & IBV_WC_WITH_IMM);
  EXPECT_EQ(htonl(0x01020304), rc.imm_data);
  EXPECT_EQ(pattern(3, 16), resp.load(40, 16));
}

// ---- Tail last: a poller spinning on the last byte of a WRITE's target
// never sees it before every other byte of the message (small, one page,
// a megabyte: many packets on the wire, a loop of copies elsewhere). Not an IBTA promise
// (10.8.3 orders nothing within a message) but what rxe and real HCAs do in
// practice and what pollers of the target (MPI eager protocols, perftest's
// write_lat) rely on; softverbs promises it on every path -------------------

TEST_P(Semantics, LastByteOfAWriteLandsLast) {
#if defined(__SANITIZE_THREAD__)
  // The watcher reads the buffer while the responder stores into it, with
  // no atomics, as an RDMA poller does: on the wire path both are threads of
  // one process, a race by design that TSan reports.
  if (GetParam() == Path::kWire) GTEST_SKIP() << "a poller's read of a buffer being written is a race by design";
#endif
  OpenArgs big;
  big.len = 2 << 20;
  open_pair(big, big);
  const uint32_t sizes[] = {2, 7, 9, 4096, 4096, 4096, 4096, 1 << 20, 1 << 20, 1 << 20, 1 << 20};
  for (size_t round = 0; round < sizeof(sizes) / sizeof(sizes[0]); ++round) {
    const uint32_t n = sizes[round];
    SCOPED_TRACE("size " + std::to_string(n) + ", round " + std::to_string(round));
    const auto want = pattern(uint8_t(round + 11), n);
    ASSERT_TRUE(resp.store(4096, std::vector<uint8_t>(n, 0)));
    ASSERT_TRUE(req.store(0, want));
    ASSERT_TRUE(resp.watch_tail(4096, want, 30000));
    ibv_wc wc = run(rdma(IBV_WR_RDMA_WRITE, 0, n, 4096));
    ASSERT_EQ(IBV_WC_SUCCESS, wc.status) << ibv_wc_status_str(wc.status);
    WatchResult r = resp.watch_result();
    EXPECT_NE(2, r.state) << "the last byte never arrived";
    EXPECT_NE(1, r.state) << "the last byte arrived before byte " << r.first_missing;
    EXPECT_EQ(0, r.state);
  }
}

// ---- Zero-length operations (IBTA 9.4.1.1, 9.4.3.1, 9.4.4.1: valid, with
// no SGE or one SGE of length 0; a zero-length RDMA operation needs no
// R_Key nor address, 9.7.4.1.5, and rxe checks none) --------------------------

TEST_P(Semantics, ZeroLengthOperationsNeedNoKey) {
  open_pair();
  ASSERT_TRUE(resp.store(0, std::vector<uint8_t>(64, kGuard)));
  for (uint32_t zero_sge : {0u, 1u}) {
    SCOPED_TRACE(zero_sge ? "one SGE of length 0" : "no SGE");
    for (uint32_t op : {IBV_WR_RDMA_WRITE, IBV_WR_RDMA_READ}) {
      Wr w = rdma(op, 0, 0, 0);
      w.zero_sge = zero_sge;
      w.rkey = b.rkey ^ 0x5a5a00;  // no key of the responder's
      w.raddr = 0;
      ibv_wc wc = run(w);
      EXPECT_EQ(IBV_WC_SUCCESS, wc.status) << "opcode " << op << ": " << ibv_wc_status_str(wc.status);
      EXPECT_EQ(0u, wc.byte_len);
    }
    Recv r;
    r.off = 0;
    r.len = 0;
    r.wr_id = 77;
    ASSERT_EQ(0, resp.post_recv(r));
    Wr w;
    w.opcode = IBV_WR_SEND;
    w.zero_sge = zero_sge;
    ibv_wc wc = run(w);
    EXPECT_EQ(IBV_WC_SUCCESS, wc.status) << ibv_wc_status_str(wc.status);
    ibv_wc rc = one(resp);
    EXPECT_EQ(IBV_WC_SUCCESS, rc.status) << ibv_wc_status_str(rc.status);
    EXPECT_EQ(0u, rc.byte_len);
  }
  expect_framed(resp.load(0, 64), 0, std::vector<uint8_t>(64, kGuard));
}

// ---- ATOMIC WRITE (IBTA annex A19, ibv_wr_atomic_write; rxe: an R_Key with
// remote write, 8 bytes to an aligned address, IBV_WC_ATOMIC_WRITE) ---------

OpenArgs a19_args() {
  OpenArgs o;
  o.extended = 1;
  o.mr_access |= kAccessFlushGlobal | kAccessFlushPersistent;
  o.qp_access |= kAccessFlushGlobal | kAccessFlushPersistent;
  return o;
}

TEST_P(Semantics, AtomicWriteStoresItsEightBytes) {
  open_pair(a19_args(), a19_args());
  ASSERT_TRUE(resp.store(0, std::vector<uint8_t>(512, kGuard)));
  for (uint32_t new_api : {0u, 1u}) {
    SCOPED_TRACE(new_api ? "ibv_wr_atomic_write" : "ibv_post_send");
    const auto v = pattern(uint8_t(40 + new_api), 8);
    ASSERT_TRUE(req.store(64, v));
    Wr w = rdma(IBV_WR_ATOMIC_WRITE, 64, 8, 256);
    w.new_api = new_api;
    w.wr_id = 60 + new_api;
    ibv_wc wc = run(w);
    ASSERT_EQ(IBV_WC_SUCCESS, wc.status) << ibv_wc_status_str(wc.status);
    EXPECT_EQ(IBV_WC_ATOMIC_WRITE, wc.opcode);
    EXPECT_EQ(60u + new_api, wc.wr_id);
    expect_framed(resp.load(0, 512), 256, v);
    ASSERT_TRUE(resp.store(256, std::vector<uint8_t>(8, kGuard)));
  }
  // Inline (its 8 bytes whatever max_inline_data), and after a WRITE it
  // lands after the WRITE's bytes.
  ASSERT_TRUE(req.store(0, pattern(9, 64)));
  ASSERT_EQ(0, req.post_send(rdma(IBV_WR_RDMA_WRITE, 0, 64, 128)));
  Wr w = rdma(IBV_WR_ATOMIC_WRITE, 8, 8, 192);
  w.send_flags |= IBV_SEND_INLINE;
  w.wr_id = 2;
  ASSERT_EQ(0, req.post_send(w));
  auto wc = req.poll(2);
  ASSERT_EQ(2u, wc.size());
  EXPECT_EQ(IBV_WC_SUCCESS, wc[1].status) << ibv_wc_status_str(wc[1].status);
  auto got = resp.load(128, 72);
  const auto p = pattern(9, 64);
  EXPECT_TRUE(std::equal(p.begin(), p.end(), got.begin()));
  EXPECT_TRUE(std::equal(p.begin() + 8, p.begin() + 16, got.begin() + 64));
}

// Its errors: a length other than 8 is refused at the post (EINVAL); the
// responder finds a misaligned address an invalid request, an MR without
// remote write or an address past its end a remote access error.
TEST_P(Semantics, AtomicWriteErrors) {
  OpenArgs no_write = a19_args();
  no_write.mr_access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
  struct Case {
    const char* name;
    uint64_t remote_off;
    bool read_only_mr;
    ibv_wc_status status;
  } const cases[] = {
      {"misaligned", 260, false, IBV_WC_REM_INV_REQ_ERR},
      {"MR without remote write", 256, true, IBV_WC_REM_ACCESS_ERR},
      {"past the MR's end", 1 << 20, false, IBV_WC_REM_ACCESS_ERR},
  };
  bool first = true;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    if (first) {
      open_pair(a19_args(), c.read_only_mr ? no_write : a19_args());
    } else {
      fresh_pair(a19_args(), c.read_only_mr ? no_write : a19_args());
    }
    if (first) {
      EXPECT_EQ(EINVAL, req.post_send(rdma(IBV_WR_ATOMIC_WRITE, 0, 4, 256))) << "4 bytes";
      EXPECT_EQ(EINVAL, req.post_send(rdma(IBV_WR_ATOMIC_WRITE, 0, 16, 256))) << "16 bytes";
    }
    first = false;
    ASSERT_TRUE(resp.store(256, std::vector<uint8_t>(16, kGuard)));
    ibv_wc wc = run(rdma(IBV_WR_ATOMIC_WRITE, 0, 8, c.remote_off));
    EXPECT_EQ(c.status, wc.status) << ibv_wc_status_str(wc.status);
    expect_framed(resp.load(256, 16), 0, std::vector<uint8_t>(16, kGuard));
  }
}

// ATOMIC WRITE on on-demand-paging memory (docs/MEMORY.md): both MRs ODP;
// the same eight bytes, opcode and errors as on regular MRs, on every path.
TEST_P(Semantics, OdpAtomicWriteStoresItsEightBytesAndFailsAlike) {
  OpenArgs odp = a19_args();
  odp.mr_access |= IBV_ACCESS_ON_DEMAND;
  open_pair(odp, odp);
  ASSERT_TRUE(resp.store(0, std::vector<uint8_t>(512, kGuard)));
  for (uint32_t new_api : {0u, 1u}) {
    SCOPED_TRACE(new_api ? "ibv_wr_atomic_write" : "ibv_post_send");
    const auto v = pattern(uint8_t(70 + new_api), 8);
    ASSERT_TRUE(req.store(64, v));
    Wr w = rdma(IBV_WR_ATOMIC_WRITE, 64, 8, 256);
    w.new_api = new_api;
    w.wr_id = 80 + new_api;
    ibv_wc wc = run(w);
    ASSERT_EQ(IBV_WC_SUCCESS, wc.status) << ibv_wc_status_str(wc.status);
    EXPECT_EQ(IBV_WC_ATOMIC_WRITE, wc.opcode);
    EXPECT_EQ(80u + new_api, wc.wr_id);
    expect_framed(resp.load(0, 512), 256, v);
    ASSERT_TRUE(resp.store(256, std::vector<uint8_t>(8, kGuard)));
  }
  Wr in = rdma(IBV_WR_ATOMIC_WRITE, 0, 8, 320);
  in.send_flags |= IBV_SEND_INLINE;
  ASSERT_TRUE(req.store(0, pattern(5, 8)));
  ASSERT_EQ(IBV_WC_SUCCESS, run(in).status);
  expect_framed(resp.load(0, 512), 320, pattern(5, 8));
  OpenArgs no_write = odp;
  no_write.mr_access = IBV_ACCESS_ON_DEMAND | IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
  struct Case {
    const char* name;
    uint64_t remote_off;
    bool read_only_mr;
    ibv_wc_status status;
  } const cases[] = {
      {"misaligned", 260, false, IBV_WC_REM_INV_REQ_ERR},
      {"MR without remote write", 256, true, IBV_WC_REM_ACCESS_ERR},
      {"past the MR's end", 1 << 20, false, IBV_WC_REM_ACCESS_ERR},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    fresh_pair(odp, c.read_only_mr ? no_write : odp);
    ASSERT_TRUE(resp.store(256, std::vector<uint8_t>(16, kGuard)));
    ibv_wc wc = run(rdma(IBV_WR_ATOMIC_WRITE, 0, 8, c.remote_off));
    EXPECT_EQ(c.status, wc.status) << ibv_wc_status_str(wc.status);
    expect_framed(resp.load(256, 16), 0, std::vector<uint8_t>(16, kGuard));
  }
}

// ---- FLUSH (IBTA annex A19, ibv_wr_flush; IBV_WC_FLUSH; the R_Key and the
// responder QP must grant the FLUSH right of each placement type asked) -----

Wr flush_wr(const Endpoint& b, uint64_t off, uint64_t len, uint8_t type, uint8_t level) {
  Wr w;
  w.opcode = kWrFlush;
  w.new_api = 1;
  w.rkey = b.rkey;
  w.raddr = b.addr + off;
  w.flush_len = len;
  w.flush_type = type;
  w.flush_level = level;
  return w;
}

TEST_P(Semantics, FlushOfARangeAndOfTheRegion) {
  open_pair(a19_args(), a19_args());
  ASSERT_TRUE(req.store(0, pattern(3, 4096)));
  ASSERT_EQ(0, req.post_send(rdma(IBV_WR_RDMA_WRITE, 0, 4096, 0)));
  struct {
    uint8_t type, level;
    uint64_t len;
  } const flushes[] = {
      {kFlushGlobal, kFlushRange, 4096},
      {kFlushPersistent, kFlushRange, 4096},
      {kFlushGlobal | kFlushPersistent, kFlushRange, 0},
      {kFlushGlobal, kFlushMr, 0},  // the whole region, whatever the range says
      {kFlushPersistent, kFlushMr, 1ull << 40},
  };
  uint64_t id = 10;
  for (const auto& f : flushes) {
    Wr w = flush_wr(b, 0, f.len, f.type, f.level);
    w.wr_id = id++;
    ASSERT_EQ(0, req.post_send(w));
  }
  auto wc = req.poll(6);
  ASSERT_EQ(6u, wc.size());
  for (size_t i = 1; i < 6; ++i) {
    EXPECT_EQ(IBV_WC_SUCCESS, wc[i].status) << i << ": " << ibv_wc_status_str(wc[i].status);
    EXPECT_EQ(kWcFlush, unsigned(wc[i].opcode)) << i;
    EXPECT_EQ(9u + i, wc[i].wr_id);
  }
  expect_framed(resp.load(0, 4096), 0, pattern(3, 4096));
}

// FLUSH errors: ibv_post_send cannot carry one (EINVAL: ibv_send_wr has no
// placement type); a placement type the MR or the responder QP does not
// grant (rdma-core's test_qp_ex_rc_flush_type_violate), or a range past the
// MR, is a remote access error.
TEST_P(Semantics, FlushErrors) {
  OpenArgs global_mr = a19_args();
  global_mr.mr_access &= ~kAccessFlushPersistent;
  OpenArgs global_qp = a19_args();
  global_qp.qp_access &= ~kAccessFlushPersistent;
  struct Case {
    const char* name;
    OpenArgs responder;
    uint64_t off, len;
    uint8_t type;
  } const cases[] = {
      {"persistent, MR grants global only", global_mr, 0, 64, kFlushPersistent},
      {"persistent, QP grants global only", global_qp, 0, 64, kFlushPersistent},
      {"range past the MR", a19_args(), (1 << 20) - 64, 128, kFlushGlobal},
  };
  bool first = true;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    if (first) {
      open_pair(a19_args(), c.responder);
      Wr old = flush_wr(b, 0, 64, kFlushGlobal, kFlushRange);
      old.new_api = 0;
      EXPECT_EQ(EINVAL, req.post_send(old)) << "IBV_WR_FLUSH through ibv_post_send";
      // The same with the right the MR has succeeds.
      ibv_wc ok = run(flush_wr(b, 0, 64, kFlushGlobal, kFlushRange));
      EXPECT_EQ(IBV_WC_SUCCESS, ok.status) << ibv_wc_status_str(ok.status);
    } else {
      fresh_pair(a19_args(), c.responder);
    }
    first = false;
    ibv_wc wc = run(flush_wr(b, c.off, c.len, c.type, kFlushRange));
    EXPECT_EQ(IBV_WC_REM_ACCESS_ERR, wc.status) << ibv_wc_status_str(wc.status);
  }
}

// On-demand paging (docs/MEMORY.md): both MRs ODP; WRITE, READ and the
// atomics are byte exact as on regular MRs. Between users the daemon
// carries WRITE and READ (process_vm_* as root), not atomics yet.
TEST_P(Semantics, OdpMemoryMovesByteExact) {
  OpenArgs odp;
  odp.mr_access |= IBV_ACCESS_ON_DEMAND;
  open_pair(odp, odp);
  for (uint32_t n : {1u, 4096u, 65537u}) {
    SCOPED_TRACE("size " + std::to_string(n));
    ASSERT_TRUE(resp.store(0, std::vector<uint8_t>(n + 128, kGuard)));
    ASSERT_TRUE(req.store(128, pattern(uint8_t(n), n)));
    ASSERT_EQ(IBV_WC_SUCCESS, run(rdma(IBV_WR_RDMA_WRITE, 128, n, 64)).status);
    expect_framed(resp.load(0, n + 128), 64, pattern(uint8_t(n), n));
    ASSERT_TRUE(req.store(0, std::vector<uint8_t>(n + 128, kGuard)));
    ASSERT_EQ(IBV_WC_SUCCESS, run(rdma(IBV_WR_RDMA_READ, 64, n, 64)).status);
    expect_framed(req.load(0, n + 128), 64, pattern(uint8_t(n), n));
  }
  if (GetParam() == Path::kMediated) return;  // atomics on ODP memory: not between users yet
  ASSERT_TRUE(store_word(resp, 4096, 40));
  ibv_wc wc = run(atomic(IBV_WR_ATOMIC_FETCH_AND_ADD, 4096, 2, 0));
  ASSERT_EQ(IBV_WC_SUCCESS, wc.status) << ibv_wc_status_str(wc.status);
  EXPECT_EQ(40u, local_word(0));
  EXPECT_EQ(42u, remote_word(4096));
  wc = run(atomic(IBV_WR_ATOMIC_CMP_AND_SWP, 4096, 42, 7));
  ASSERT_EQ(IBV_WC_SUCCESS, wc.status) << ibv_wc_status_str(wc.status);
  EXPECT_EQ(7u, remote_word(4096));
}

INSTANTIATE_TEST_SUITE_P(Paths, Semantics, ::testing::Values(Path::kShm, Path::kMediated, Path::kWire),
                         [](const ::testing::TestParamInfo<Path>& i) { return std::string(path_name(i.param)); });

}  // namespace
}  // namespace svsem
