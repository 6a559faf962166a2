// Work-request validation: regression tests for what fuzz/wr_fuzz.cc found.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "harness.h"

namespace svtest {
namespace {

// A LOCAL_INV carries no scatter list, whatever num_sge says (IBTA 10.7.2.2
// lists no SGEs for it); the library used to copy num_sge entries into its
// fixed 16-entry WQE before looking at the opcode: a stack overflow.
TEST(WrValidation, LocalInvalidateIgnoresItsScatterList) {
  Side me;
  Peer peer;
  PeerInfo info;
  ASSERT_EQ(0, connect_pair(me, peer, info));
  std::vector<ibv_sge> sges(1000, ibv_sge{reinterpret_cast<uint64_t>(me.buf), 8, me.mr->lkey});
  ibv_send_wr wr{};
  wr.wr_id = 77;
  wr.opcode = IBV_WR_LOCAL_INV;
  wr.sg_list = sges.data();
  wr.num_sge = int(sges.size());
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.invalidate_rkey = 0x12345600;  // no such window: the invalidation itself fails
  ibv_send_wr* bad = nullptr;
  ASSERT_EQ(0, ibv_post_send(me.qp, &wr, &bad));
  auto wc = poll(me.cq, 2, 500);
  ASSERT_EQ(1u, wc.size());
  EXPECT_EQ(77u, wc[0].wr_id);
  EXPECT_NE(IBV_WC_SUCCESS, wc[0].status);
}

// An opcode no enumerator names (a C caller can store any value) is refused
// with EINVAL and reported in bad_wr; the requests before it are posted.
TEST(WrValidation, UnknownOpcodeIsRefusedAndNamedInBadWr) {
  Side me;
  Peer peer;
  PeerInfo info;
  ASSERT_EQ(0, connect_pair(me, peer, info));
  ibv_sge sge{reinterpret_cast<uint64_t>(me.buf), 8, me.mr->lkey};
  ibv_send_wr wr[2]{};
  for (int i = 0; i < 2; ++i) {
    wr[i].wr_id = uint64_t(i);
    wr[i].sg_list = &sge;
    wr[i].num_sge = 1;
    wr[i].send_flags = IBV_SEND_SIGNALED;
    wr[i].wr.rdma.remote_addr = info.addr;
    wr[i].wr.rdma.rkey = info.rkey;
  }
  wr[0].next = &wr[1];
  wr[0].opcode = IBV_WR_RDMA_WRITE;
  uint32_t bogus = 0x7fffff01;
  std::memcpy(&wr[1].opcode, &bogus, sizeof(bogus));
  ibv_send_wr* bad = nullptr;
  EXPECT_EQ(EINVAL, ibv_post_send(me.qp, wr, &bad));
  EXPECT_EQ(&wr[1], bad);
  auto wc = poll(me.cq, 2, 500);
  ASSERT_EQ(1u, wc.size());
  EXPECT_EQ(0u, wc[0].wr_id);
  EXPECT_EQ(IBV_WC_SUCCESS, wc[0].status);
}

}  // namespace
}  // namespace svtest
