// What held before issue 18 and must stay held: a mediated operation (the
// daemon copies between two processes' memory, as it does between users)
// reaches exactly the bytes its keys grant. Each case is carried out by a
// hostile raw client of nobody on a fresh connected pair whose MR covers the
// middle page of a three-page backing: the operation must be refused, and
// the pages around the MR must keep their bytes. A control case in bounds
// must succeed, so that a pair that refuses everything cannot pass.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "attack.h"

namespace svsec {
namespace {

using sv::proto::Op;

constexpr uint64_t kPage = 4096;
constexpr uint64_t kMrAt = kPage;  // the MR: [4096, 8192) of a 12288-byte backing
constexpr uint64_t kMrLen = kPage;
constexpr uint8_t kOutside = 0xab, kInside = 0x11;

constexpr uint32_t kFlush = 14;               // IBV_WR_FLUSH (rdma-core v64)
constexpr uint32_t kFlushMrPersistent = 1014;  // the same, persistent placement, selectivity MR
constexpr uint32_t kAccessFlushGlobal = 1u << 8;

struct Case {
  const char* what;
  uint32_t opcode;
  uint64_t remote_addr;
  uint32_t num_sge;       // local SGEs, each `sge_len` bytes from sge_addr on
  uint64_t sge_addr;
  uint32_t sge_len;
  bool should_succeed;
};

const Case kCases[] = {
    {"in bounds (control)", IBV_WR_RDMA_WRITE, kMrAt + 100, 1, kMrAt, 64, true},
    {"WRITE one byte at the end", IBV_WR_RDMA_WRITE, kMrAt + kMrLen, 1, kMrAt, 1, false},
    {"WRITE across the end", IBV_WR_RDMA_WRITE, kMrAt + kMrLen - 1, 1, kMrAt, 2, false},
    {"WRITE one byte before the start", IBV_WR_RDMA_WRITE, kMrAt - 1, 1, kMrAt, 1, false},
    {"WRITE whose end wraps", IBV_WR_RDMA_WRITE, ~uint64_t(0) - 7, 1, kMrAt, 16, false},
    {"WRITE from a local SGE past the end", IBV_WR_RDMA_WRITE, kMrAt, 1, kMrAt + kMrLen, 1, false},
    {"WRITE of 16 SGEs one byte too long", IBV_WR_RDMA_WRITE, kMrAt + 1, 16, kMrAt, uint32_t(kMrLen / 16), false},
    {"READ one byte at the end", IBV_WR_RDMA_READ, kMrAt + kMrLen, 1, kMrAt, 1, false},
    {"READ into a local SGE before the start", IBV_WR_RDMA_READ, kMrAt, 1, kMrAt - 8, 8, false},
    {"FETCH_ADD across the end", IBV_WR_ATOMIC_FETCH_AND_ADD, kMrAt + kMrLen - 4, 1, kMrAt, 8, false},
    {"FETCH_ADD at the end", IBV_WR_ATOMIC_FETCH_AND_ADD, kMrAt + kMrLen, 1, kMrAt, 8, false},
    {"CMP_AND_SWP before the start", IBV_WR_ATOMIC_CMP_AND_SWP, kMrAt - 8, 1, kMrAt, 8, false},
    {"FETCH_ADD misaligned (IBTA 9.4.5)", IBV_WR_ATOMIC_FETCH_AND_ADD, kMrAt + 3, 1, kMrAt, 8, false},
    // IBTA annex A19. ATOMIC WRITE: 8 bytes from the local SGEs.
    {"ATOMIC_WRITE in bounds (control)", IBV_WR_ATOMIC_WRITE, kMrAt + kMrLen - 8, 1, kMrAt, 8, true},
    {"ATOMIC_WRITE at the end", IBV_WR_ATOMIC_WRITE, kMrAt + kMrLen, 1, kMrAt, 8, false},
    {"ATOMIC_WRITE before the start", IBV_WR_ATOMIC_WRITE, kMrAt - 8, 1, kMrAt, 8, false},
    {"ATOMIC_WRITE misaligned", IBV_WR_ATOMIC_WRITE, kMrAt + kMrLen - 4, 1, kMrAt, 8, false},
    {"ATOMIC_WRITE of 16 bytes", IBV_WR_ATOMIC_WRITE, kMrAt, 1, kMrAt, 16, false},
    {"ATOMIC_WRITE from a local SGE past the end", IBV_WR_ATOMIC_WRITE, kMrAt, 1, kMrAt + kMrLen - 4, 8, false},
    // FLUSH (global, range): sge_len is the range's length, no SGE.
    {"FLUSH in bounds (control)", kFlush, kMrAt, 0, 0, uint32_t(kMrLen), true},
    {"FLUSH one byte past the end", kFlush, kMrAt, 0, 0, uint32_t(kMrLen + 1), false},
    {"FLUSH before the start", kFlush, kMrAt - 1, 0, 0, 2, false},
    {"FLUSH whose end wraps", kFlush, ~uint64_t(0) - 7, 0, 0, 16, false},
    {"FLUSH of the MR, persistent: a right it lacks", kFlushMrPersistent, 0, 0, 0, 0, false},
};

TEST(MediationBounds, EveryOutOfBoundsOperationIsRefusedAndTouchesNothing) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run a child as another user";
  SystemDaemon sysd;
  Child nobody(true, [&sysd](int sock) {
    for (size_t i = 0; i < std::size(kCases); ++i) {
      const Case& c = kCases[i];
      RawConn raw(sysd.socket());
      sv::proto::MediateReq req{};
      sv::Fd mem;
      if (!raw.ok() || !raw_mediated_pair(raw, kMrLen, req, &mem, kMrAt, kPage, nullptr, kAccessFlushGlobal)) return 2;
      std::vector<uint8_t> bytes(kMrAt + kMrLen + kPage, kOutside);
      std::memset(bytes.data() + kMrAt, kInside, kMrLen);
      if (pwrite(mem.get(), bytes.data(), bytes.size(), 0) != ssize_t(bytes.size())) return 3;
      req.opcode = c.opcode;
      req.remote_addr = c.remote_addr;
      req.num_sge = c.num_sge;
      for (uint32_t s = 0; s < c.num_sge; ++s) {
        req.sge[s].addr = c.sge_addr + s * c.sge_len;
        req.sge[s].length = c.sge_len;
        req.sge[s].lkey = req.rkey;
      }
      req.compare_add = 1;
      if (c.opcode == kFlush || c.opcode == kFlushMrPersistent) {  // the FETH's fields as the library sends them
        req.opcode = kFlush;
        req.compare_add = c.sge_len;
        req.swap = c.opcode == kFlush ? 1 : (2 | 1 << 8);
      }
      sv::proto::MediateReply rep{};
      int st = raw.call(Op::Mediate, req, rep);
      int result[3] = {int(i), st, st == 0 && rep.outcome == sv::proto::kMediateDone};
      std::vector<uint8_t> after(bytes.size());
      if (pread(mem.get(), after.data(), after.size(), 0) != ssize_t(after.size())) return 4;
      bool outside_intact = true;
      for (uint64_t b = 0; b < after.size(); ++b)
        if ((b < kMrAt || b >= kMrAt + kMrLen) && after[b] != kOutside) outside_intact = false;
      int out[4] = {result[0], result[1], result[2], outside_intact};
      if (!send_bytes(sock, out, sizeof(out))) return 5;
    }
    return 0;
  });
  ASSERT_TRUE(sysd.alive());
  nobody.start();
  for (size_t i = 0; i < std::size(kCases); ++i) {
    int out[4] = {-1, -1, -1, -1};
    ASSERT_TRUE(recv_bytes(nobody.sock(), out, sizeof(out))) << "nobody stopped before case " << i;
    const Case& c = kCases[i];
    EXPECT_EQ(c.should_succeed, out[2] == 1) << c.what << " (status " << out[1] << ")";
    EXPECT_EQ(1, out[3]) << c.what << ": a byte outside the MR changed";
  }
  EXPECT_EQ(0, nobody.wait());
  EXPECT_TRUE(sysd.alive());
}

}  // namespace
}  // namespace svsec
