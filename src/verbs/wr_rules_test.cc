// The opcode rules (wr_rules.h) and validate_wr(), table-driven, without a
// daemon: a ProcessQp of each type with only what the check reads.
#include "verbs/wr_rules.h"

#include <gtest/gtest.h>

#include <cerrno>

#include "verbs/provider.h"

namespace sv::verbs {
namespace {

struct FakeQp {
  ibv_context ctx{};
  QpHandle qp{};
  ProcessQp st;
  explicit FakeQp(ibv_qp_type t) {
    st.type = t;
    st.cap = {16, 16, 4, 4, 64};
    st.self = &qp;
    qp.qpx.qp_base.context = &ctx;
    qp.st = &st;
  }
};

struct Wr {
  ibv_send_wr wr{};
  ibv_sge sge[8]{};
  Ah ah{};
  ibv_mw mw{};
  explicit Wr(const FakeQp& q, uint32_t opcode, int nsge = 1, uint32_t len = 8) {
    std::memcpy(&wr.opcode, &opcode, sizeof opcode);
    wr.sg_list = sge;
    wr.num_sge = nsge;
    for (auto& s : sge) s = {0x1000, len, 1};
    ah.ah.context = const_cast<ibv_context*>(&q.ctx);
    wr.wr.ud.ah = &ah.ah;
    mw.context = ah.ah.context;
    mw.type = IBV_MW_TYPE_2;
  }
};

int check(const FakeQp& q, uint32_t opcode, int nsge = 1, uint32_t len = 8) {
  Wr w(q, opcode, nsge, len);
  return validate_wr(q.st, &w.wr);
}

constexpr ibv_qp_type kTypes[] = {IBV_QPT_RC, IBV_QPT_UC, IBV_QPT_UD, IBV_QPT_XRC_SEND};

// IBTA 9.8 / table 38, as softverbs implements it: which opcode each type takes.
bool allowed(ibv_qp_type t, uint32_t op) {
  switch (t) {
    case IBV_QPT_RC:
    case IBV_QPT_XRC_SEND: return op <= IBV_WR_SEND_WITH_INV;
    case IBV_QPT_UC: return op <= IBV_WR_SEND_WITH_IMM;
    case IBV_QPT_UD: return op == IBV_WR_SEND || op == IBV_WR_SEND_WITH_IMM;
    default: return false;
  }
}

TEST(WrRules, EachQpTypeTakesItsOpcodesOnly) {
  for (ibv_qp_type t : kTypes) {
    FakeQp q(t);
    for (uint32_t op : {0u, 1u, 2u, 3u, 4u, 5u, 6u, 7u, 8u, 9u, 10u, 11u, 12u, 13u, 16u, 255u, 0x80000000u}) {
      Wr w(q, op);
      w.wr.bind_mw.mw = &w.mw;  // a valid type 2 window for BIND_MW
      EXPECT_EQ(validate_wr(q.st, &w.wr), allowed(t, op) ? 0 : EINVAL) << "type " << t << " opcode " << op;
    }
  }
}

TEST(WrRules, AtomicsNeedOneEightByteBufferAndNoInline) {
  FakeQp q(IBV_QPT_RC);
  for (uint32_t op : {uint32_t(IBV_WR_ATOMIC_CMP_AND_SWP), uint32_t(IBV_WR_ATOMIC_FETCH_AND_ADD)}) {
    EXPECT_EQ(check(q, op, 1, 8), 0);
    EXPECT_EQ(check(q, op, 0), EINVAL);
    EXPECT_EQ(check(q, op, 2), EINVAL);
    EXPECT_EQ(check(q, op, 1, 4), EINVAL);
    Wr in(q, op);
    in.wr.send_flags = IBV_SEND_INLINE;
    EXPECT_EQ(validate_wr(q.st, &in.wr), EINVAL);
  }
}

// IBTA annex A19 as rdma-core has it: ATOMIC WRITE (RC) carries exactly 8
// bytes, inline whatever max_inline_data; FLUSH only as ibv_wr_flush builds
// it (ibv_send_wr has no field for its placement type), with a known
// placement type and selectivity level.
TEST(WrRules, AtomicWriteAndFlush) {
  FakeQp q(IBV_QPT_RC);
  EXPECT_EQ(check(q, IBV_WR_ATOMIC_WRITE, 1, 8), 0);
  EXPECT_EQ(check(q, IBV_WR_ATOMIC_WRITE, 2, 4), 0);
  EXPECT_EQ(check(q, IBV_WR_ATOMIC_WRITE, 1, 4), EINVAL);
  EXPECT_EQ(check(q, IBV_WR_ATOMIC_WRITE, 1, 16), EINVAL);
  EXPECT_EQ(check(q, IBV_WR_ATOMIC_WRITE, 0), EINVAL);
  q.st.cap.max_inline_data = 0;
  Wr in(q, IBV_WR_ATOMIC_WRITE);
  in.wr.send_flags = IBV_SEND_INLINE;
  EXPECT_EQ(validate_wr(q.st, &in.wr), 0);
  for (ibv_qp_type t : {IBV_QPT_UC, IBV_QPT_UD, IBV_QPT_XRC_SEND}) {
    FakeQp o(t);
    EXPECT_EQ(check(o, IBV_WR_ATOMIC_WRITE), EINVAL) << t;
  }

  Wr f(q, abi::kWrFlush, 0);
  f.wr.wr.atomic = {0x1000, 64, flush_code(abi::kFlushGlobal, abi::kFlushRange), 7};
  EXPECT_EQ(validate_wr(q.st, &f.wr), EINVAL) << "through ibv_post_send";
  f.wr.send_flags = kFlushBuilt;
  EXPECT_EQ(validate_wr(q.st, &f.wr), 0);
  f.wr.wr.atomic.swap = flush_code(abi::kFlushGlobal | abi::kFlushPersistent, abi::kFlushMr);
  EXPECT_EQ(validate_wr(q.st, &f.wr), 0);
  for (uint64_t bad : {flush_code(0, 0), flush_code(4, 0), flush_code(1, 2)}) {
    f.wr.wr.atomic.swap = bad;
    EXPECT_EQ(validate_wr(q.st, &f.wr), EINVAL) << bad;
  }
  f.wr.wr.atomic.swap = flush_code(abi::kFlushGlobal, abi::kFlushRange);
  f.wr.wr.atomic.compare_add = 1ull << 32;  // more than a RETH's length
  EXPECT_EQ(validate_wr(q.st, &f.wr), EINVAL);
  shm::SendWqe w{};
  f.wr.wr.atomic.compare_add = 64;
  to_send_wqe(q.st, &f.wr, w);
  EXPECT_EQ(w.num_sge, 0u);
  EXPECT_EQ(w.compare_add, 64u);
  EXPECT_EQ(w.send_flags & kFlushBuilt, 0u);
}

TEST(WrRules, ScatterListAndInlineLimits) {
  FakeQp q(IBV_QPT_RC);
  EXPECT_EQ(check(q, IBV_WR_SEND, 4), 0);
  EXPECT_EQ(check(q, IBV_WR_SEND, 5), EINVAL);   // more than max_send_sge
  EXPECT_EQ(check(q, IBV_WR_SEND, -1), EINVAL);
  Wr in(q, IBV_WR_RDMA_WRITE, 2, 32);
  in.wr.send_flags = IBV_SEND_INLINE;
  EXPECT_EQ(validate_wr(q.st, &in.wr), 0);  // 64 bytes: max_inline_data
  in.sge[1].length = 33;
  EXPECT_EQ(validate_wr(q.st, &in.wr), EINVAL);
  Wr rd(q, IBV_WR_RDMA_READ);
  rd.wr.send_flags = IBV_SEND_INLINE;  // the SGE is a destination
  EXPECT_EQ(validate_wr(q.st, &rd.wr), EINVAL);
  // Local operations have no scatter list: num_sge is not looked at.
  EXPECT_EQ(check(q, IBV_WR_LOCAL_INV, 1000), 0);
}

TEST(WrRules, UdNeedsAnAddressHandleOfItsDevice) {
  FakeQp q(IBV_QPT_UD);
  Wr w(q, IBV_WR_SEND);
  EXPECT_EQ(validate_wr(q.st, &w.wr), 0);
  w.wr.wr.ud.ah = nullptr;
  EXPECT_EQ(validate_wr(q.st, &w.wr), EINVAL);
  ibv_context other{};
  w.wr.wr.ud.ah = &w.ah.ah;
  w.ah.ah.context = &other;
  EXPECT_EQ(validate_wr(q.st, &w.wr), EINVAL);
}

TEST(WrRules, BindNeedsATypeTwoWindowOfItsDevice) {
  FakeQp q(IBV_QPT_RC);
  Wr w(q, IBV_WR_BIND_MW);
  w.wr.bind_mw.mw = &w.mw;
  EXPECT_EQ(validate_wr(q.st, &w.wr), 0);
  w.mw.type = IBV_MW_TYPE_1;  // bound with ibv_bind_mw(3) instead
  EXPECT_EQ(validate_wr(q.st, &w.wr), EINVAL);
  w.mw.type = IBV_MW_TYPE_2;
  ibv_context other{};
  w.mw.context = &other;
  EXPECT_EQ(validate_wr(q.st, &w.wr), EINVAL);
  w.wr.bind_mw.mw = nullptr;
  EXPECT_EQ(validate_wr(q.st, &w.wr), EINVAL);
}

TEST(WrRules, ExtendedOpsAndCompletionOpcodesComeFromTheTable) {
  const uint64_t sends = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM;
  const uint64_t uc = sends | IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM;
  const uint64_t rc = uc | IBV_QP_EX_WITH_RDMA_READ | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP |
                      IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD | IBV_QP_EX_WITH_LOCAL_INV | IBV_QP_EX_WITH_BIND_MW |
                      IBV_QP_EX_WITH_SEND_WITH_INV;
  // IBTA annex A19's operations: RC only, as rxe has them.
  EXPECT_EQ(supported_send_ops(IBV_QPT_RC), rc | IBV_QP_EX_WITH_ATOMIC_WRITE | abi::kQpExWithFlush);
  EXPECT_EQ(supported_send_ops(IBV_QPT_XRC_SEND), rc);
  EXPECT_EQ(supported_send_ops(IBV_QPT_UC), uc);
  EXPECT_EQ(supported_send_ops(IBV_QPT_UD), sends);
  EXPECT_EQ(supported_send_ops(IBV_QPT_XRC_RECV), 0u);
  EXPECT_EQ(send_wc_opcode(IBV_WR_RDMA_WRITE_WITH_IMM), IBV_WC_RDMA_WRITE);
  EXPECT_EQ(send_wc_opcode(IBV_WR_SEND_WITH_INV), IBV_WC_SEND);
  EXPECT_EQ(send_wc_opcode(IBV_WR_ATOMIC_CMP_AND_SWP), IBV_WC_COMP_SWAP);
  EXPECT_EQ(send_wc_opcode(IBV_WR_ATOMIC_FETCH_AND_ADD), IBV_WC_FETCH_ADD);
  EXPECT_EQ(send_wc_opcode(IBV_WR_BIND_MW), IBV_WC_BIND_MW);
  EXPECT_EQ(send_wc_opcode(IBV_WR_ATOMIC_WRITE), IBV_WC_ATOMIC_WRITE);
  EXPECT_EQ(send_wc_opcode(abi::kWrFlush), abi::kWcFlush);
  EXPECT_EQ(send_wc_opcode(IBV_WR_LOCAL_INV), IBV_WC_LOCAL_INV);
  EXPECT_EQ(send_wc_opcode(IBV_WR_RDMA_READ), IBV_WC_RDMA_READ);
  EXPECT_EQ(send_wc_opcode(12345), IBV_WC_SEND);
}

TEST(WrRules, SendWqeCarriesWhatEachKindNeeds) {
  FakeQp rc(IBV_QPT_RC);
  Wr a(rc, IBV_WR_ATOMIC_CMP_AND_SWP);
  a.wr.wr.atomic = {0x2000, 5, 6, 77};
  shm::SendWqe w{};
  to_send_wqe(rc.st, &a.wr, w);
  EXPECT_EQ(w.remote_addr, 0x2000u);
  EXPECT_EQ(w.compare_add, 5u);
  EXPECT_EQ(w.swap, 6u);
  EXPECT_EQ(w.rkey, 77u);
  EXPECT_EQ(w.num_sge, 1u);

  Wr li(rc, IBV_WR_LOCAL_INV, 1000);  // no scatter list copied (fuzz/wr_fuzz.cc)
  li.wr.invalidate_rkey = 9;
  to_send_wqe(rc.st, &li.wr, w);
  EXPECT_EQ(w.num_sge, 0u);
  EXPECT_EQ(w.invalidate_rkey, 9u);

  FakeQp ud(IBV_QPT_UD);
  Wr s(ud, IBV_WR_SEND);
  s.wr.wr.ud.remote_qpn = 0xff000123;
  s.wr.wr.ud.remote_qkey = 0x11;
  s.ah.attr.is_global = 1;
  s.ah.attr.grh.dgid.raw[15] = 7;
  to_send_wqe(ud.st, &s.wr, w);
  EXPECT_EQ(w.ud_qpn, 0x123u);
  EXPECT_EQ(w.ud_qkey, 0x11u);
  EXPECT_TRUE(w.ud_grh);
  EXPECT_EQ(w.ud_dgid[15], 7);
  EXPECT_EQ(w.rkey, 0u);
}

}  // namespace
}  // namespace sv::verbs
