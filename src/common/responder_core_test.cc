// The responder core (common/responder_core.h) and the opcode rules
// (common/opcode_rules.h), on plain memory: the error policy, the receive
// checks and scatter, the atomics, the tail-last store, the receive
// completion.
#include "common/responder_core.h"

#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <vector>

namespace sv::core {
namespace {

using access::Fault;

// ---- The error policy ------------------------------------------------------

TEST(ResponderPolicy, EachCheckHasOneMeaningAtBothEnds) {
  struct Row {
    Check c;
    ibv_wc_status requester, receive;
    Nak nak;
  };
  const Row rows[] = {
      {Check::kOk, IBV_WC_SUCCESS, IBV_WC_SUCCESS, Nak::kPsnSequence},
      {Check::kReceiveTooShort, IBV_WC_REM_INV_REQ_ERR, IBV_WC_LOC_LEN_ERR, Nak::kInvalidRequest},
      {Check::kReceiveMalformed, IBV_WC_REM_INV_REQ_ERR, IBV_WC_LOC_LEN_ERR, Nak::kInvalidRequest},
      {Check::kReceiveBadKey, IBV_WC_REM_OP_ERR, IBV_WC_LOC_PROT_ERR, Nak::kRemoteOperational},
      {Check::kRemoteKey, IBV_WC_REM_ACCESS_ERR, IBV_WC_REM_ACCESS_ERR, Nak::kRemoteAccess},
      {Check::kMisalignedAtomic, IBV_WC_REM_INV_REQ_ERR, IBV_WC_REM_INV_REQ_ERR, Nak::kInvalidRequest},
      {Check::kInvalidateRefused, IBV_WC_REM_INV_REQ_ERR, IBV_WC_REM_INV_REQ_ERR, Nak::kInvalidRequest},
      {Check::kMalformedRequest, IBV_WC_REM_INV_REQ_ERR, IBV_WC_REM_INV_REQ_ERR, Nak::kInvalidRequest},
      {Check::kResponderFault, IBV_WC_REM_OP_ERR, IBV_WC_LOC_PROT_ERR, Nak::kRemoteOperational},
  };
  for (const Row& r : rows) {
    const Verdict v = verdict(r.c);
    EXPECT_EQ(requester_status(r.c), r.requester) << int(r.c);
    EXPECT_EQ(v.receive_status, r.receive) << int(r.c);
    EXPECT_EQ(v.nak, r.nak) << int(r.c);
    // Every failed check is the responder's: an RC responder goes to ERR.
    EXPECT_EQ(access::responder_detected(v.fault), r.c != Check::kOk) << int(r.c);
  }
}

// ---- Receives ----------------------------------------------------------------

struct Sge {
  uint64_t addr;
  uint32_t length;
  uint32_t lkey;
};

// A receive buffer of 64 bytes in three SGEs; L_Key 7 is bad.
struct Receive {
  std::array<uint8_t, 64> mem{};
  std::vector<Sge> sg;
  std::vector<uint32_t> keys_checked;
  Receive(uint32_t k0, uint32_t k1, uint32_t k2) {
    const uint64_t base = reinterpret_cast<uintptr_t>(mem.data());
    sg = {{base, 16, k0}, {base + 16, 0, 7}, {base + 16, 48, k1}};
    if (k2) sg.push_back({base, 0, k2});
  }
  Check put(uint64_t off, const char* data) {
    const uint64_t len = std::strlen(data);
    return scatter_receive(sg.data(), uint32_t(sg.size()), off, len,
                           [&](const Sge& s, uint64_t at, uint64_t n, uint64_t msg_at) {
                             keys_checked.push_back(s.lkey);
                             if (s.lkey == 7) return false;
                             std::memcpy(reinterpret_cast<uint8_t*>(s.addr + at), data + msg_at, n);
                             return true;
                           });
  }
};

TEST(ResponderReceive, ScattersAcrossSgesAtAnOffset) {
  Receive r(1, 2, 0);
  EXPECT_EQ(r.put(0, "0123456789abcdefXYZ"), Check::kOk);
  EXPECT_EQ(std::memcmp(r.mem.data(), "0123456789abcdefXYZ", 19), 0);
  // A later packet of the message, at its offset (the RoCE responder's case).
  EXPECT_EQ(r.put(14, "PQRS"), Check::kOk);
  EXPECT_EQ(std::memcmp(r.mem.data() + 14, "PQRS", 4), 0);
  // The zero-length SGE is passed over, its bad key never used.
  for (uint32_t k : r.keys_checked) EXPECT_NE(k, 7u);
}

TEST(ResponderReceive, TheLengthIsCheckedBeforeAnyKey) {
  Receive r(7, 7, 0);
  std::string big(65, 'x');
  EXPECT_EQ(r.put(0, big.c_str()), Check::kReceiveTooShort);
  EXPECT_TRUE(r.keys_checked.empty());
  EXPECT_EQ(r.put(60, "12345"), Check::kReceiveTooShort);  // at an offset
  EXPECT_EQ(r.put(65, ""), Check::kReceiveTooShort);       // past the end, even empty
  EXPECT_EQ(r.put(64, ""), Check::kOk);                    // exactly full
}

TEST(ResponderReceive, OnlyTheSgesTheMessageReachesAreChecked) {
  Receive r(1, 7, 0);
  EXPECT_EQ(r.put(0, "0123456789abcdef"), Check::kOk);  // fits the first SGE
  EXPECT_EQ(r.put(0, "0123456789abcdefg"), Check::kReceiveBadKey);
}

TEST(ResponderReceive, MoreSgesThanAWqeHasIsMalformed) {
  std::vector<Sge> sg(shm::kMaxSge + 1, Sge{0, 1, 1});
  EXPECT_EQ(scatter_receive(sg.data(), uint32_t(sg.size()), 0, 1, [](const Sge&, uint64_t, uint64_t, uint64_t) {
              return true;
            }),
            Check::kReceiveMalformed);
}

TEST(ResponderReceive, TheCompletionCarriesFlagsOnlyOnSuccess) {
  ibv_wc wc = receive_completion(5, IBV_WC_SUCCESS, IBV_WR_SEND_WITH_IMM, 12, 0x11, 0x22, 0xabcd, 0);
  EXPECT_EQ(wc.opcode, IBV_WC_RECV);
  EXPECT_EQ(wc.wc_flags, unsigned(IBV_WC_WITH_IMM));
  EXPECT_EQ(wc.imm_data, 0xabcdu);
  EXPECT_EQ(wc.byte_len, 12u);
  EXPECT_EQ(wc.qp_num, 0x11u);
  EXPECT_EQ(wc.src_qp, 0x22u);
  wc = receive_completion(5, IBV_WC_SUCCESS, IBV_WR_RDMA_WRITE_WITH_IMM, 8, 1, 2, 3, 0);
  EXPECT_EQ(wc.opcode, IBV_WC_RECV_RDMA_WITH_IMM);
  EXPECT_EQ(wc.wc_flags, unsigned(IBV_WC_WITH_IMM));
  wc = receive_completion(5, IBV_WC_SUCCESS, IBV_WR_SEND_WITH_INV, 8, 1, 2, 0, 0x99);
  EXPECT_EQ(wc.wc_flags, unsigned(IBV_WC_WITH_INV));
  EXPECT_EQ(wc.invalidated_rkey, 0x99u);
  wc = receive_completion(5, IBV_WC_SUCCESS, IBV_WR_SEND, 8, 1, 2, 3, 4);
  EXPECT_EQ(wc.wc_flags, 0u);
  // In error: ibv_poll_cq(3) says only wr_id, status and qp_num are valid.
  wc = receive_completion(6, IBV_WC_REM_INV_REQ_ERR, IBV_WR_SEND_WITH_IMM, 8, 1, 2, 3, 4);
  EXPECT_EQ(wc.wr_id, 6u);
  EXPECT_EQ(wc.status, IBV_WC_REM_INV_REQ_ERR);
  EXPECT_EQ(wc.wc_flags, 0u);
  EXPECT_EQ(wc.byte_len, 0u);
}

// ---- Atomics -----------------------------------------------------------------

TEST(ResponderAtomic, CompareSwapAndFetchAddReturnTheOriginal) {
  alignas(8) uint64_t w = 40;
  EXPECT_EQ(apply_atomic(&w, false, 2, 0), 40u);
  EXPECT_EQ(w, 42u);
  EXPECT_EQ(apply_atomic(&w, true, 41, 7), 42u);  // no match: unchanged
  EXPECT_EQ(w, 42u);
  EXPECT_EQ(apply_atomic(&w, true, 42, 7), 42u);
  EXPECT_EQ(w, 7u);
  EXPECT_EQ(apply_atomic(&w, false, ~uint64_t(0), 0), 7u);  // wraps
  EXPECT_EQ(w, 6u);
}

TEST(ResponderAtomic, OnlyAnAlignedQuadword) {
  EXPECT_EQ(check_atomic_target(0x1000), Check::kOk);
  EXPECT_EQ(check_atomic_target(0x1ff8), Check::kOk);
  for (uint64_t a : {0x1001u, 0x1004u, 0x1007u}) {
    EXPECT_EQ(check_atomic_target(a), Check::kMisalignedAtomic) << a;
  }
  EXPECT_EQ(check_atomic(IBV_WR_ATOMIC_CMP_AND_SWP, 8, 0x1004), Fault::kRemoteInvalid);
  EXPECT_EQ(check_atomic(IBV_WR_ATOMIC_FETCH_AND_ADD, 7, 0x1000), Fault::kLocalLength);
  EXPECT_EQ(check_atomic(IBV_WR_RDMA_READ, 8, 0x1000), Fault::kLocalOperation);
}

// ---- The tail-last store -------------------------------------------------------

TEST(ResponderStore, CopiesEveryLengthAndPlace) {
  std::array<uint8_t, 256> src{}, dst{};
  for (size_t i = 0; i < src.size(); ++i) src[i] = uint8_t(i * 7 + 1);
  for (uint64_t at = 0; at < 64; ++at) {
    for (uint64_t n = 0; n <= 100; ++n) {
      dst.fill(0);
      store_tail_last(dst.data() + at, src.data(), n);
      ASSERT_EQ(std::memcmp(dst.data() + at, src.data(), n), 0) << at << " " << n;
      ASSERT_EQ(dst[at + n], 0) << at << " " << n;
      if (at) {
        ASSERT_EQ(dst[at - 1], 0) << at << " " << n;
      }
    }
  }
}

TEST(ResponderStore, OverlappingRangesCopyAsMemmove) {
  for (int shift : {-9, -3, -1, 1, 3, 9}) {
    for (uint64_t n : {1u, 5u, 8u, 9u, 40u}) {
      std::array<uint8_t, 128> buf{}, want{};
      for (size_t i = 0; i < buf.size(); ++i) buf[i] = uint8_t(i + 1);
      want = buf;
      std::memmove(want.data() + 40 + shift, want.data() + 40, n);
      store_tail_last(buf.data() + 40 + shift, buf.data() + 40, n);
      EXPECT_EQ(buf, want) << shift << " " << n;
    }
  }
}

// ---- The opcode rules ------------------------------------------------------------

TEST(OpcodeRules, OneTableForEveryPath) {
  using rules::allowed_on;
  EXPECT_TRUE(allowed_on(IBV_WR_RDMA_READ, IBV_QPT_RC));
  EXPECT_FALSE(allowed_on(IBV_WR_RDMA_READ, IBV_QPT_UC));
  EXPECT_FALSE(allowed_on(IBV_WR_ATOMIC_FETCH_AND_ADD, IBV_QPT_UC));
  EXPECT_FALSE(allowed_on(IBV_WR_SEND_WITH_INV, IBV_QPT_UC));
  EXPECT_TRUE(allowed_on(IBV_WR_SEND_WITH_IMM, IBV_QPT_UD));
  EXPECT_FALSE(allowed_on(IBV_WR_RDMA_WRITE, IBV_QPT_UD));
  EXPECT_TRUE(allowed_on(IBV_WR_ATOMIC_WRITE, IBV_QPT_RC));
  EXPECT_TRUE(allowed_on(abi::kWrFlush, IBV_QPT_RC));
  EXPECT_FALSE(allowed_on(IBV_WR_ATOMIC_WRITE, IBV_QPT_UC));
  EXPECT_FALSE(allowed_on(abi::kWrFlush, IBV_QPT_XRC_SEND));  // RC only, as rxe
  EXPECT_FALSE(allowed_on(IBV_WR_TSO, IBV_QPT_RC));
  EXPECT_FALSE(allowed_on(12345, IBV_QPT_RC));
  // The completion opcodes, by ibv_wr_opcode and by the engine's opcode.
  EXPECT_EQ(rules::send_completion_opcode(IBV_WR_RDMA_WRITE_WITH_IMM), IBV_WC_RDMA_WRITE);
  EXPECT_EQ(rules::send_completion_opcode(IBV_WR_ATOMIC_CMP_AND_SWP), IBV_WC_COMP_SWAP);
  EXPECT_EQ(rules::send_completion_opcode(12345), IBV_WC_SEND);
  for (uint32_t op = 0; op < rules::kOpcodeCount; ++op) {
    const rules::OpcodeRule& r = rules::rule_of(op);
    if (r.known) {
      EXPECT_EQ(&rules::rule_of_wire(r.wire), &r) << op;
    }
  }
  EXPECT_TRUE(rules::writes_local(IBV_WR_RDMA_READ));
  EXPECT_FALSE(rules::writes_local(IBV_WR_RDMA_WRITE));
}

}  // namespace
}  // namespace sv::core
