// Mediation (mediation.h) on a fake registry: two QPs, an MR table in plain
// memory, memfds as the two users' backings. No daemon, no sockets. Every
// opcode it carries, and what it refuses.
#include "daemon/mediation.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <array>
#include <cstring>
#include <map>
#include <vector>

namespace sv::daemon {
namespace {

using shm::MrEntry;
using shm::RecvWqe;

constexpr uint32_t kClient = 1, kReqQp = 0x10, kRespQp = 0x20, kReqPd = 1, kRespPd = 2, kRecvCq = 9;
constexpr uint64_t kMem = 1 << 16;
enum : uint32_t { kReqMr = 0x105, kRespMr = 0x207, kRespRo = 0x309, kRespMw2 = 0x40b };
enum : uint32_t { kReqBacking = 1, kRespBacking = 2 };
constexpr uint64_t kReqBase = 0x100000, kRespBase = 0x200000;

class FakeTables : public MediationTables {
 public:
  FakeTables() {
    for (uint32_t b : {kReqBacking, kRespBacking}) {
      fds_[b] = Fd(::memfd_create("mediation_test", MFD_CLOEXEC));
      EXPECT_EQ(::ftruncate(fds_[b].get(), kMem), 0);
    }
    constexpr uint32_t all = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE |
                             IBV_ACCESS_REMOTE_ATOMIC;
    mr(kReqMr, all, kReqPd, kReqBacking, kReqBase, kMem);
    mr(kRespMr, all, kRespPd, kRespBacking, kRespBase, kMem);
    mr(kRespRo, IBV_ACCESS_REMOTE_READ, kRespPd, kRespBacking, kRespBase, kMem);
    mr(kRespMw2, IBV_ACCESS_REMOTE_WRITE, kRespPd, kRespBacking, kRespBase, 0x100, shm::kKindMw2, kRespQp);
    qps_[kReqQp] = {IBV_QPT_RC, kReqPd, 0};
    qps_[kRespQp] = {IBV_QPT_RC, kRespPd, kRecvCq};
    connect(kReqQp, kRespQp);
    connect(kRespQp, kReqQp);
    entries_[kRespQp].access = IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC;
    ring_mem_.resize(sizeof(shm::RingHeader) + 8 * sizeof(shm::RingSlot<RecvWqe>) + 64);
    rh_ = reinterpret_cast<shm::RingHeader*>((reinterpret_cast<uintptr_t>(ring_mem_.data()) + 63) & ~uintptr_t(63));
    shm::Ring<RecvWqe>::init(rh_, slots(), 8);
  }

  void set_type(ibv_qp_type t) { qps_[kReqQp].type = qps_[kRespQp].type = t; }
  void post_recv(uint64_t wr_id, uint64_t addr, uint32_t len, uint32_t lkey = kRespMr) {
    RecvWqe r{};
    r.wr_id = wr_id;
    r.num_sge = 1;
    r.sge[0] = {addr, len, lkey};
    ASSERT_TRUE(shm::Ring<RecvWqe>(rh_, slots(), 8).push(r));
  }
  void write(uint32_t backing, uint64_t off, const void* p, size_t n) {
    ASSERT_EQ(::pwrite(fds_[backing].get(), p, n, off), ssize_t(n));
  }
  std::vector<uint8_t> read(uint32_t backing, uint64_t off, size_t n) {
    std::vector<uint8_t> v(n);
    EXPECT_EQ(::pread(fds_[backing].get(), v.data(), n, off), ssize_t(n));
    return v;
  }

  // MediationTables
  bool requester_qp(uint32_t client, uint32_t qpn, QpView& out) override {
    return client == kClient && qpn == kReqQp && responder_qp(qpn, out);
  }
  bool responder_qp(uint32_t qpn, QpView& out) override {
    auto it = qps_.find(qpn);
    if (it == qps_.end()) return false;
    out = it->second;
    return true;
  }
  shm::QpEntry& qp_state_entry(uint32_t qpn) override { return entries_[qpn]; }
  const MrEntry& mr_slot(uint32_t slot) const override { return slot < mrs_.size() ? mrs_[slot] : blank_; }
  int backing_fd(uint32_t b) const override {
    auto it = fds_.find(b);
    return it == fds_.end() ? -1 : it->second.get();
  }
  bool receive_queue(uint32_t qpn, RecvQueue& out) override {
    if (qpn != kRespQp) return false;
    out.ring = shm::Ring<RecvWqe>(rh_, slots(), 8);
    return true;
  }
  void srq_limit_reached(uint32_t) override {}
  void responder_error_event(uint32_t, ibv_wc_status) override {}
  void push_cq_entry(uint32_t cq, const ibv_wc& wc, bool) override {
    EXPECT_EQ(cq, kRecvCq);
    completions.push_back(wc);
  }
  void flush_receives(uint32_t) override { ++flushes; }
  int invalidate_remote(uint32_t client, uint32_t qpn, uint32_t key) override {
    invalidated.push_back(key);
    return client == kClient && qpn == kReqQp && key == kRespMw2 ? 0 : EACCES;
  }
  uid_t uid_of_client(uint32_t) const override { return 1000; }

  std::vector<ibv_wc> completions;
  std::vector<uint32_t> invalidated;
  int flushes = 0;

 private:
  shm::RingSlot<RecvWqe>* slots() { return reinterpret_cast<shm::RingSlot<RecvWqe>*>(rh_ + 1); }
  void mr(uint32_t key, uint32_t access, uint32_t pd, uint32_t backing, uint64_t iova, uint64_t len,
          uint32_t kind = shm::kKindMr, uint32_t bound = 0) {
    MrEntry& e = mrs_[key >> 8];
    e.access = access;
    e.pd = pd;
    e.backing = backing;
    e.iova = iova;
    e.length = len;
    e.file_offset = 0;
    e.kind = kind;
    e.bound_qpn = bound;
    e.key.store(key);
  }
  void connect(uint32_t a, uint32_t b) {
    entries_[a].qpn.store(a);
    entries_[a].dest_qpn.store(b);
    entries_[a].state.store(IBV_QPS_RTS);
  }
  std::map<uint32_t, Fd> fds_;
  std::array<MrEntry, 8> mrs_{};
  MrEntry blank_{};
  std::map<uint32_t, QpView> qps_;
  std::map<uint32_t, shm::QpEntry> entries_;
  std::vector<uint8_t> ring_mem_;
  shm::RingHeader* rh_ = nullptr;
};

class MediationTest : public ::testing::Test {
 protected:
  proto::MediateReq req(uint32_t opcode, uint64_t local_off, uint32_t len) {
    proto::MediateReq r{};
    r.qpn = kReqQp;
    r.opcode = opcode;
    r.num_sge = 1;
    r.sge[0] = {kReqBase + local_off, len, kReqMr};
    r.rkey = kRespMr;
    r.remote_addr = kRespBase;
    return r;
  }
  proto::MediateReply run(const proto::MediateReq& r, int expect_errno = 0) {
    proto::MediateReply rep{};
    EXPECT_EQ(m.mediate(kClient, r, rep), expect_errno);
    return rep;
  }
  static void expect(const proto::MediateReply& rep, uint32_t outcome, ibv_wc_status st = IBV_WC_SUCCESS,
                     bool peer = false) {
    EXPECT_EQ(rep.outcome, outcome);
    EXPECT_EQ(rep.wc_status, uint32_t(st));
    EXPECT_EQ(rep.peer_error != 0, peer);
  }
  FakeTables t;
  Mediation m{t};
};

TEST_F(MediationTest, WriteCopiesIntoTheResponder) {
  t.write(kReqBacking, 0, "mediated", 8);
  auto r = req(IBV_WR_RDMA_WRITE, 0, 8);
  r.remote_addr = kRespBase + 100;
  auto rep = run(r);
  expect(rep, proto::kMediateDone);
  EXPECT_EQ(rep.byte_len, 8u);
  EXPECT_EQ(std::memcmp(t.read(kRespBacking, 100, 8).data(), "mediated", 8), 0);
}

TEST_F(MediationTest, WriteWithImmediateConsumesAReceive) {
  auto r = req(IBV_WR_RDMA_WRITE_WITH_IMM, 0, 8);
  r.imm_data = 0x1234;
  expect(run(r), proto::kMediateRnr);  // no receive posted
  t.post_recv(77, kRespBase, 0);
  expect(run(r), proto::kMediateDone);
  ASSERT_EQ(t.completions.size(), 1u);
  EXPECT_EQ(t.completions[0].wr_id, 77u);
  EXPECT_EQ(t.completions[0].opcode, IBV_WC_RECV_RDMA_WITH_IMM);
  EXPECT_EQ(t.completions[0].imm_data, 0x1234u);
}

TEST_F(MediationTest, ReadCopiesFromTheResponder) {
  t.write(kRespBacking, 8, "remote!!", 8);
  auto r = req(IBV_WR_RDMA_READ, 16, 8);
  r.remote_addr = kRespBase + 8;
  expect(run(r), proto::kMediateDone);
  EXPECT_EQ(std::memcmp(t.read(kReqBacking, 16, 8).data(), "remote!!", 8), 0);
}

TEST_F(MediationTest, SendLandsInTheReceiveWithImmediate) {
  t.write(kReqBacking, 0, "hello", 5);
  t.post_recv(5, kRespBase + 64, 32);
  auto r = req(IBV_WR_SEND_WITH_IMM, 0, 5);
  r.imm_data = 42;
  expect(run(r), proto::kMediateDone);
  ASSERT_EQ(t.completions.size(), 1u);
  EXPECT_EQ(t.completions[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(t.completions[0].byte_len, 5u);
  EXPECT_EQ(t.completions[0].src_qp, kReqQp);
  EXPECT_EQ(t.completions[0].wc_flags & IBV_WC_WITH_IMM, unsigned(IBV_WC_WITH_IMM));
  EXPECT_EQ(std::memcmp(t.read(kRespBacking, 64, 5).data(), "hello", 5), 0);
}

TEST_F(MediationTest, InlineSendNeedsNoKey) {
  t.post_recv(5, kRespBase, 32);
  auto r = req(IBV_WR_SEND, 0, 0);
  r.num_sge = 0;
  r.send_flags = IBV_SEND_INLINE;
  r.inline_len = 3;
  std::memcpy(r.inline_data, "abc", 3);
  expect(run(r), proto::kMediateDone);
  EXPECT_EQ(std::memcmp(t.read(kRespBacking, 0, 3).data(), "abc", 3), 0);
}

TEST_F(MediationTest, SendWithInvalidateInvalidatesTheBoundWindow) {
  t.post_recv(1, kRespBase, 32);
  auto r = req(IBV_WR_SEND_WITH_INV, 0, 4);
  r.imm_data = kRespMw2;  // invalidate_rkey shares imm_data's place in ibv_send_wr
  expect(run(r), proto::kMediateDone);
  ASSERT_EQ(t.invalidated.size(), 1u);
  EXPECT_EQ(t.invalidated[0], uint32_t(kRespMw2));
  ASSERT_EQ(t.completions.size(), 1u);
  EXPECT_EQ(t.completions[0].wc_flags & IBV_WC_WITH_INV, unsigned(IBV_WC_WITH_INV));
  EXPECT_EQ(t.completions[0].invalidated_rkey, uint32_t(kRespMw2));

  // A key the responder may not invalidate: its receive fails, the
  // requester sees an invalid request (NAK invalid request, as the RoCE
  // responder answers: core::Check::kInvalidateRefused), the RC responder
  // goes to ERR.
  t.post_recv(2, kRespBase, 32);
  r.imm_data = kRespMr;
  expect(run(r), proto::kMediateError, IBV_WC_REM_INV_REQ_ERR, true);
  ASSERT_EQ(t.completions.size(), 2u);
  EXPECT_EQ(t.completions[1].status, IBV_WC_REM_INV_REQ_ERR);
  EXPECT_EQ(t.flushes, 1);
}

TEST_F(MediationTest, AtomicsReturnTheOriginalValue) {
  uint64_t v = 40;
  t.write(kRespBacking, 8, &v, 8);
  auto r = req(IBV_WR_ATOMIC_FETCH_AND_ADD, 0, 8);
  r.remote_addr = kRespBase + 8;
  r.compare_add = 2;
  expect(run(r), proto::kMediateDone);
  uint64_t got;
  std::memcpy(&got, t.read(kReqBacking, 0, 8).data(), 8);
  EXPECT_EQ(got, 40u);
  r.opcode = IBV_WR_ATOMIC_CMP_AND_SWP;
  r.compare_add = 42;
  r.swap = 7;
  expect(run(r), proto::kMediateDone);
  std::memcpy(&got, t.read(kRespBacking, 8, 8).data(), 8);
  EXPECT_EQ(got, 7u);
}

// ---- What it refuses -----------------------------------------------------

struct Refusal {
  const char* name;
  uint32_t opcode;
  uint32_t len;
  uint32_t lkey, rkey;
  uint64_t remote_off;
  ibv_wc_status status;
  bool peer;
};

const Refusal kRefusals[] = {
    {"bad L_Key", IBV_WR_RDMA_WRITE, 8, 0x999, kRespMr, 0, IBV_WC_LOC_PROT_ERR, false},
    {"responder's key as L_Key", IBV_WR_RDMA_WRITE, 8, kRespMr, kRespMr, 0, IBV_WC_LOC_PROT_ERR, false},
    {"bad R_Key", IBV_WR_RDMA_WRITE, 8, kReqMr, 0x999, 0, IBV_WC_REM_ACCESS_ERR, true},
    {"requester's key as R_Key", IBV_WR_RDMA_WRITE, 8, kReqMr, kReqMr, 0, IBV_WC_REM_ACCESS_ERR, true},
    {"write past the end", IBV_WR_RDMA_WRITE, 16, kReqMr, kRespMr, kMem - 8, IBV_WC_REM_ACCESS_ERR, true},
    {"write to a read-only MR", IBV_WR_RDMA_WRITE, 8, kReqMr, kRespRo, 0, IBV_WC_REM_ACCESS_ERR, true},
    {"read past the end", IBV_WR_RDMA_READ, 16, kReqMr, kRespMr, kMem - 8, IBV_WC_REM_ACCESS_ERR, true},
    {"type 2 window read", IBV_WR_RDMA_READ, 8, kReqMr, kRespMw2, 0, IBV_WC_REM_ACCESS_ERR, true},
    {"atomic misaligned", IBV_WR_ATOMIC_FETCH_AND_ADD, 8, kReqMr, kRespMr, 4, IBV_WC_REM_INV_REQ_ERR, true},
    {"atomic across the end", IBV_WR_ATOMIC_FETCH_AND_ADD, 8, kReqMr, kRespMr, kMem, IBV_WC_REM_ACCESS_ERR, true},
    {"atomic, result of 4 bytes", IBV_WR_ATOMIC_CMP_AND_SWP, 4, kReqMr, kRespMr, 0, IBV_WC_LOC_LEN_ERR, false},
    {"atomic without the right", IBV_WR_ATOMIC_CMP_AND_SWP, 8, kReqMr, kRespRo, 0, IBV_WC_REM_ACCESS_ERR, true},
    {"LOCAL_INV", IBV_WR_LOCAL_INV, 0, kReqMr, kRespMr, 0, IBV_WC_LOC_QP_OP_ERR, false},
    {"BIND_MW", IBV_WR_BIND_MW, 0, kReqMr, kRespMr, 0, IBV_WC_LOC_QP_OP_ERR, false},
    {"atomic write misaligned", IBV_WR_ATOMIC_WRITE, 8, kReqMr, kRespMr, 4, IBV_WC_REM_INV_REQ_ERR, true},
    {"atomic write of 16 bytes", IBV_WR_ATOMIC_WRITE, 16, kReqMr, kRespMr, 0, IBV_WC_REM_INV_REQ_ERR, true},
    {"atomic write without remote write", IBV_WR_ATOMIC_WRITE, 8, kReqMr, kRespRo, 0, IBV_WC_REM_ACCESS_ERR, true},
    {"unknown opcode", 200, 8, kReqMr, kRespMr, 0, IBV_WC_LOC_QP_OP_ERR, false},
};

class MediationRefuses : public MediationTest, public ::testing::WithParamInterface<Refusal> {};

TEST_P(MediationRefuses, WithTheClassOfTheError) {
  const Refusal& c = GetParam();
  t.write(kRespBacking, 0, "untouch!", 8);
  auto r = req(c.opcode, 0, c.len);
  r.sge[0].lkey = c.lkey;
  r.rkey = c.rkey;
  r.remote_addr = kRespBase + c.remote_off;
  expect(run(r), proto::kMediateError, c.status, c.peer);
  EXPECT_EQ(t.flushes, c.peer ? 1 : 0) << "an RC responder that found the error goes to ERR";
  EXPECT_EQ(t.qp_state_entry(kRespQp).state.load() == IBV_QPS_ERR, c.peer);
  EXPECT_EQ(std::memcmp(t.read(kRespBacking, 0, 8).data(), "untouch!", 8), 0);
}

INSTANTIATE_TEST_SUITE_P(Table, MediationRefuses, ::testing::ValuesIn(kRefusals), [](const auto& info) {
  std::string n;
  for (const char* p = info.param.name; *p; ++p) n += std::isalnum(static_cast<unsigned char>(*p)) ? *p : '_';
  return n;
});

TEST_F(MediationTest, ReceiveErrorsAreTheRequestersRemoteErrors) {
  // Too small: the responder's length error, our invalid request.
  t.post_recv(1, kRespBase, 4);
  expect(run(req(IBV_WR_SEND, 0, 8)), proto::kMediateError, IBV_WC_REM_INV_REQ_ERR, true);
  ASSERT_EQ(t.completions.size(), 1u);
  EXPECT_EQ(t.completions[0].status, IBV_WC_LOC_LEN_ERR);
  // A receive through a key not of the responder's PD: its protection
  // error, our remote operational error. (The responder back from ERR.)
  t.qp_state_entry(kRespQp).state.store(IBV_QPS_RTS);
  t.post_recv(2, kReqBase, 8, kReqMr);
  expect(run(req(IBV_WR_SEND, 0, 8)), proto::kMediateError, IBV_WC_REM_OP_ERR, true);
  EXPECT_EQ(t.completions.back().status, IBV_WC_LOC_PROT_ERR);
}

TEST_F(MediationTest, UcHasNoReadAtomicsNorInvalidate) {
  t.set_type(IBV_QPT_UC);
  for (uint32_t op : {IBV_WR_RDMA_READ, IBV_WR_ATOMIC_CMP_AND_SWP, IBV_WR_SEND_WITH_INV})
    expect(run(req(op, 0, 8)), proto::kMediateError, IBV_WC_LOC_QP_OP_ERR);
  expect(run(req(IBV_WR_RDMA_WRITE, 0, 8)), proto::kMediateDone);
}

TEST_F(MediationTest, NotARequestOrNotConnected) {
  auto r = req(IBV_WR_RDMA_WRITE, 0, 8);
  r.qpn = kRespQp;  // not the client's
  run(r, EINVAL);
  r = req(IBV_WR_RDMA_WRITE, 0, 8);
  r.num_sge = shm::kMaxSge + 1;
  run(r, EINVAL);
  t.qp_state_entry(kRespQp).state.store(IBV_QPS_INIT);
  expect(run(req(IBV_WR_RDMA_WRITE, 0, 8)), proto::kMediateRetry);
}

TEST_F(MediationTest, QpWithoutRemoteWriteRefusesWrites) {
  t.qp_state_entry(kRespQp).access.store(IBV_ACCESS_REMOTE_READ);
  expect(run(req(IBV_WR_RDMA_WRITE, 0, 8)), proto::kMediateError, IBV_WC_REM_ACCESS_ERR, true);
}

TEST_F(MediationTest, ZeroLengthWriteNeedsNoKey) {
  auto r = req(IBV_WR_RDMA_WRITE, 0, 0);
  r.num_sge = 0;
  r.rkey = 0x999;
  expect(run(r), proto::kMediateDone);
}

}  // namespace
}  // namespace sv::daemon
