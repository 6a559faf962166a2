// Extended QPs (ibv_create_qp_ex(3) with send_ops_flags, ibv_wr_post(3)):
// batches built between ibv_wr_start and ibv_wr_complete run in order, and
// a batch with any error posts nothing.
#include <arpa/inet.h>
#include <gtest/gtest.h>

#include <cstring>

#include "common/verbs_current.h"
#include "harness.h"

namespace svtest {
namespace {

constexpr uint64_t kAllRc = IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM | IBV_QP_EX_WITH_SEND |
                            IBV_QP_EX_WITH_SEND_WITH_IMM | IBV_QP_EX_WITH_RDMA_READ |
                            IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP | IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD |
                            IBV_QP_EX_WITH_LOCAL_INV | IBV_QP_EX_WITH_BIND_MW | IBV_QP_EX_WITH_SEND_WITH_INV;

ibv_qp* create_ex(Side& s, ibv_qp_type type, uint64_t ops, uint32_t comp_mask_extra = 0) {
  ibv_qp_init_attr_ex ix{};
  ix.send_cq = s.cq;
  ix.recv_cq = s.cq;
  ix.qp_type = type;
  ix.cap = {8, 8, 1, 1, 0};
  ix.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS | comp_mask_extra;
  ix.pd = s.pd;
  ix.send_ops_flags = ops;
  return ibv_create_qp_ex(s.ctx, &ix);
}

TEST(QpEx, CreateHonoursSendOpsFlags) {
  Side me;
  ASSERT_EQ(0, me.open({}));
  // A plain QP is not extended.
  EXPECT_EQ(nullptr, ibv_qp_to_qp_ex(me.qp));

  ibv_qp* rc = create_ex(me, IBV_QPT_RC, kAllRc);
  ASSERT_NE(nullptr, rc) << strerror(errno);
  ibv_qp_ex* x = ibv_qp_to_qp_ex(rc);
  ASSERT_EQ(reinterpret_cast<ibv_qp_ex*>(rc), x);
  EXPECT_NE(nullptr, x->wr_start);
  EXPECT_NE(nullptr, x->wr_set_xrc_srqn);
  EXPECT_EQ(0, ibv_destroy_qp(rc));

  struct Case {
    ibv_qp_type type;
    uint64_t ops;
  } refused[] = {
      {IBV_QPT_UD, IBV_QP_EX_WITH_RDMA_WRITE},        // IBTA 9.8.2: UD carries sends only
      {IBV_QPT_UD, IBV_QP_EX_WITH_SEND_WITH_INV},
      {IBV_QPT_UC, IBV_QP_EX_WITH_RDMA_READ},         // IBTA 9.8: no READ on UC
      {IBV_QPT_UC, IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD},
      {IBV_QPT_RC, IBV_QP_EX_WITH_TSO},               // no TSO (a raw packet feature)
      {IBV_QPT_UC, IBV_QP_EX_WITH_ATOMIC_WRITE},      // annex A19: RC only, as rxe
      {IBV_QPT_UC, sv::abi::kQpExWithFlush},
      {IBV_QPT_RC, 1ull << 40},                       // unknown bit
  };
  for (const Case& c : refused) {
    errno = 0;
    EXPECT_EQ(nullptr, create_ex(me, c.type, c.ops)) << c.type << " " << c.ops;
    EXPECT_EQ(EOPNOTSUPP, errno);
  }
  // A comp_mask bit softverbs does not implement (receive-side scaling).
  errno = 0;
  EXPECT_EQ(nullptr, create_ex(me, IBV_QPT_RC, IBV_QP_EX_WITH_SEND, IBV_QP_INIT_ATTR_RX_HASH));
  EXPECT_EQ(EOPNOTSUPP, errno);
  // IBV_QP_INIT_ATTR_CREATE_FLAGS with no flag set asks for nothing: rdma-core's
  // own tests (test_qp.py, random_qp_create_mask) set it so, and rxe accepts it.
  ibv_qp* plain = create_ex(me, IBV_QPT_RC, IBV_QP_EX_WITH_SEND, IBV_QP_INIT_ATTR_CREATE_FLAGS);
  ASSERT_NE(nullptr, plain) << strerror(errno);
  EXPECT_EQ(0, ibv_destroy_qp(plain));

  // IBTA annex A19: ATOMIC WRITE and FLUSH on RC, with v64's wr_flush
  // after v44's ibv_qp_ex.
  ibv_qp* a19 = create_ex(me, IBV_QPT_RC, IBV_QP_EX_WITH_ATOMIC_WRITE | sv::abi::kQpExWithFlush);
  ASSERT_NE(nullptr, a19) << strerror(errno);
  EXPECT_NE(nullptr, ibv_qp_to_qp_ex(a19)->wr_atomic_write);
  EXPECT_NE(nullptr, reinterpret_cast<sv::abi::QpExCurrent*>(ibv_qp_to_qp_ex(a19))->wr_flush);
  EXPECT_EQ(0, ibv_destroy_qp(a19));

  ibv_qp* ud = create_ex(me, IBV_QPT_UD, IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM);
  ASSERT_NE(nullptr, ud);
  EXPECT_NE(nullptr, ibv_qp_to_qp_ex(ud));
  EXPECT_EQ(0, ibv_destroy_qp(ud));
}

// The FLUSH access flags (ibv_reg_mr(3), an RC QP's qp_access_flags: the
// kernel takes them, and rdma-core v64's tests set them on every RC QP) and
// the device capabilities rxe reports for annex A19.
TEST(QpEx, FlushAccessFlagsAndDeviceCaps) {
  Side me;
  Side::Options o;
  o.qp_access |= int(sv::abi::kAccessFlushGlobal | sv::abi::kAccessFlushPersistent);
  ASSERT_EQ(0, me.open(o));
  ibv_qp_attr a{};
  ibv_qp_init_attr ia{};
  ASSERT_EQ(0, ibv_query_qp(me.qp, &a, IBV_QP_ACCESS_FLAGS, &ia));
  EXPECT_EQ(sv::abi::kAccessFlushGlobal | sv::abi::kAccessFlushPersistent,
            a.qp_access_flags & (sv::abi::kAccessFlushGlobal | sv::abi::kAccessFlushPersistent));
  ibv_mr* mr = ibv_reg_mr(me.pd, me.buf, 4096,
                          int(IBV_ACCESS_LOCAL_WRITE | sv::abi::kAccessFlushGlobal | sv::abi::kAccessFlushPersistent));
  ASSERT_NE(nullptr, mr) << strerror(errno);
  EXPECT_EQ(0, ibv_dereg_mr(mr));
  ibv_device_attr_ex dx{};
  ASSERT_EQ(0, ibv_query_device_ex(me.ctx, nullptr, &dx));
  EXPECT_TRUE(dx.device_cap_flags_ex & sv::abi::kDeviceFlushGlobal);
  EXPECT_TRUE(dx.device_cap_flags_ex & sv::abi::kDeviceFlushPersistent);
  EXPECT_TRUE(dx.device_cap_flags_ex & sv::abi::kDeviceAtomicWrite);
  EXPECT_EQ(uint32_t(dx.orig_attr.device_cap_flags), uint32_t(dx.device_cap_flags_ex));
}

class QpExData : public ::testing::Test {
 protected:
  void connect(uint64_t ops) {
    Side::Options mine;
    mine.send_ops = ops;
    ASSERT_EQ(0, connect_pair(me, peer, info, mine, {}));
    x = ibv_qp_to_qp_ex(me.qp);
    ASSERT_NE(nullptr, x);
  }
  uint64_t addr(uint64_t off) const { return reinterpret_cast<uint64_t>(me.buf) + off; }
  uint64_t local_sum(uint64_t off, uint64_t len) const { return checksum(me.buf + off, len); }

  Side me;
  Peer peer;
  PeerInfo info{};
  ibv_qp_ex* x = nullptr;
};

TEST_F(QpExData, ABatchRunsEveryOpInOrder) {
  connect(kAllRc);
  peer.fill(9);
  ASSERT_EQ(0, peer.post_recv(2, 32768, 1024));
  for (int i = 0; i < 256; ++i) me.buf[i] = uint8_t(i * 3 + 1);
  uint64_t word;
  uint8_t orig[8];
  for (int i = 0; i < 8; ++i) orig[i] = pattern(9, 16384 + i);
  std::memcpy(&word, orig, 8);

  char a[] = "hello, ";
  char b[] = "world";
  ibv_data_buf bufs[2] = {{a, 7}, {b, 5}};

  ibv_wr_start(x);
  x->wr_id = 1;
  x->wr_flags = IBV_SEND_SIGNALED;
  ibv_wr_rdma_write(x, info.rkey, info.addr + 0);
  ibv_wr_set_sge(x, me.mr->lkey, addr(0), 200);
  x->wr_id = 2;
  ibv_wr_send_imm(x, htonl(7));
  ibv_wr_set_inline_data_list(x, 2, bufs);
  x->wr_id = 3;
  ibv_wr_rdma_read(x, info.rkey, info.addr + 4096);
  ibv_sge two[2] = {{addr(8192), 100, me.mr->lkey}, {addr(9000), 28, me.mr->lkey}};
  ibv_wr_set_sge_list(x, 2, two);
  x->wr_id = 4;
  ibv_wr_atomic_fetch_add(x, info.rkey, info.addr + 16384, 5);
  ibv_wr_set_sge(x, me.mr->lkey, addr(12288), 8);
  x->wr_id = 5;
  ibv_wr_atomic_cmp_swp(x, info.rkey, info.addr + 16384, word + 5, 77);
  ibv_wr_set_sge(x, me.mr->lkey, addr(12296), 8);
  x->wr_id = 6;
  x->wr_flags = 0;  // unsignaled: no completion
  ibv_wr_rdma_write_imm(x, info.rkey, info.addr + 20000, htonl(8));
  ibv_wr_set_sge(x, me.mr->lkey, addr(0), 0);
  ASSERT_EQ(0, ibv_wr_complete(x));

  auto wc = poll(me.cq, 5);
  ASSERT_EQ(5u, wc.size());
  const ibv_wc_opcode ops[] = {IBV_WC_RDMA_WRITE, IBV_WC_SEND, IBV_WC_RDMA_READ, IBV_WC_FETCH_ADD,
                               IBV_WC_COMP_SWAP};
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_EQ(IBV_WC_SUCCESS, wc[i].status) << i;
    EXPECT_EQ(i + 1, wc[i].wr_id);
    EXPECT_EQ(ops[i], wc[i].opcode);
  }
  EXPECT_TRUE(poll(me.cq, 1, 50).empty());
  EXPECT_EQ(local_sum(0, 200), peer.checksum(0, 200));
  auto theirs = peer.poll(2);
  ASSERT_EQ(2u, theirs.size());
  EXPECT_EQ(12u, theirs[0].byte_len);
  EXPECT_EQ(htonl(7), theirs[0].imm_data);
  EXPECT_EQ(checksum(reinterpret_cast<const uint8_t*>("hello, world"), 12), peer.checksum(32768, 12));
  EXPECT_EQ(IBV_WC_RECV_RDMA_WITH_IMM, theirs[1].opcode);
  EXPECT_EQ(htonl(8), theirs[1].imm_data);
  // The read scattered the peer's bytes [4096, 4224) over two local buffers.
  for (int i = 0; i < 100; ++i) ASSERT_EQ(pattern(9, 4096 + i), me.buf[8192 + i]) << i;
  for (int i = 0; i < 28; ++i) ASSERT_EQ(pattern(9, 4196 + i), me.buf[9000 + i]) << i;
  uint64_t faa_old, cas_old;
  std::memcpy(&faa_old, me.buf + 12288, 8);
  std::memcpy(&cas_old, me.buf + 12296, 8);
  EXPECT_EQ(word, faa_old);
  EXPECT_EQ(word + 5, cas_old);
  uint64_t swapped = 77;
  EXPECT_EQ(checksum(reinterpret_cast<const uint8_t*>(&swapped), 8), peer.checksum(16384, 8));
}

TEST_F(QpExData, ABatchWithAnErrorPostsNothing) {
  connect(IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_SEND);
  peer.fill(1);
  const uint64_t before = peer.checksum(0, 4096);
  for (int i = 0; i < 64; ++i) me.buf[i] = uint8_t(0xA0 + i);

  auto good_write = [&](uint64_t id) {
    x->wr_id = id;
    x->wr_flags = IBV_SEND_SIGNALED;
    ibv_wr_rdma_write(x, info.rkey, info.addr);
    ibv_wr_set_sge(x, me.mr->lkey, addr(0), 64);
  };
  auto expect_nothing_posted = [&] {
    EXPECT_TRUE(poll(me.cq, 1, 50).empty());
    EXPECT_EQ(before, peer.checksum(0, 4096));
  };

  // An op the QP was not created for.
  ibv_wr_start(x);
  good_write(1);
  ibv_wr_rdma_read(x, info.rkey, info.addr);
  ibv_wr_set_sge(x, me.mr->lkey, addr(0), 8);
  EXPECT_EQ(EINVAL, ibv_wr_complete(x));
  expect_nothing_posted();

  // More SGEs than the QP's max_send_sge.
  ibv_sge many[17];
  for (auto& s : many) s = {addr(0), 1, me.mr->lkey};
  ibv_wr_start(x);
  good_write(2);
  ibv_wr_send(x);
  ibv_wr_set_sge_list(x, 17, many);
  EXPECT_EQ(EINVAL, ibv_wr_complete(x));
  expect_nothing_posted();

  // Inline data beyond max_inline_data (the harness asks for 64).
  std::vector<uint8_t> big(4096, 1);
  ibv_wr_start(x);
  good_write(3);
  ibv_wr_send(x);
  ibv_wr_set_inline_data(x, big.data(), big.size());
  EXPECT_EQ(EINVAL, ibv_wr_complete(x));
  expect_nothing_posted();

  // More WRs than the send queue holds.
  ibv_qp_attr qa{};
  ibv_qp_init_attr qi{};
  ASSERT_EQ(0, ibv_query_qp(me.qp, &qa, 0, &qi));
  ibv_wr_start(x);
  for (uint32_t i = 0; i <= qi.cap.max_send_wr; ++i) good_write(100 + i);
  EXPECT_EQ(ENOMEM, ibv_wr_complete(x));
  expect_nothing_posted();

  // wr_abort drops the batch.
  ibv_wr_start(x);
  good_write(4);
  ibv_wr_abort(x);
  expect_nothing_posted();

  // And the QP still works: the lock was released, the error forgotten.
  ibv_wr_start(x);
  good_write(5);
  ASSERT_EQ(0, ibv_wr_complete(x));
  auto wc = poll(me.cq, 1);
  ASSERT_EQ(1u, wc.size());
  EXPECT_EQ(5u, wc[0].wr_id);
  EXPECT_EQ(IBV_WC_SUCCESS, wc[0].status);
  EXPECT_EQ(local_sum(0, 64), peer.checksum(0, 64));
}

TEST_F(QpExData, AFailingRemoteOpCompletesWithItsError) {
  connect(IBV_QP_EX_WITH_RDMA_WRITE);
  ibv_wr_start(x);
  x->wr_id = 1;
  x->wr_flags = IBV_SEND_SIGNALED;
  ibv_wr_rdma_write(x, info.rkey ^ 0x100, info.addr);  // no such key
  ibv_wr_set_sge(x, me.mr->lkey, addr(0), 8);
  x->wr_id = 2;
  ibv_wr_rdma_write(x, info.rkey, info.addr);
  ibv_wr_set_sge(x, me.mr->lkey, addr(0), 8);
  ASSERT_EQ(0, ibv_wr_complete(x));  // posted: the error is the responder's
  auto wc = poll(me.cq, 2);
  ASSERT_EQ(2u, wc.size());
  EXPECT_EQ(IBV_WC_REM_ACCESS_ERR, wc[0].status);
  EXPECT_EQ(IBV_WC_WR_FLUSH_ERR, wc[1].status);  // the QP went to ERR (IBTA 10.3.1)
}

TEST_F(QpExData, UdSendsGoToTheAddressOfEachWr) {
  Side::Options ud;
  ud.type = IBV_QPT_UD;
  ud.send_ops = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM;
  ASSERT_EQ(0, me.open(ud));
  Side::Options theirs;
  theirs.type = IBV_QPT_UD;
  info = peer.open(theirs);
  ASSERT_NE(0u, info.qpn);
  ASSERT_EQ(0, peer.connect(0, theirs));
  ASSERT_EQ(0, me.connect(0, ud));
  x = ibv_qp_to_qp_ex(me.qp);
  ASSERT_NE(nullptr, x);
  ibv_ah_attr aa{};
  aa.is_global = 1;
  aa.port_num = 1;
  ibv_query_gid(me.ctx, 1, 0, &aa.grh.dgid);
  ibv_ah* ah = ibv_create_ah(me.pd, &aa);
  ASSERT_NE(nullptr, ah);
  ASSERT_EQ(0, peer.post_recv(2, 0, 1024));
  for (int i = 0; i < 300; ++i) me.buf[i] = uint8_t(i);

  // A send without an address is refused, with the good one before it.
  ibv_wr_start(x);
  x->wr_id = 1;
  x->wr_flags = IBV_SEND_SIGNALED;
  ibv_wr_send(x);
  ibv_wr_set_ud_addr(x, ah, info.qpn, 0x1234);
  ibv_wr_set_sge(x, me.mr->lkey, addr(0), 300);
  ibv_wr_send(x);
  ibv_wr_set_sge(x, me.mr->lkey, addr(0), 300);
  EXPECT_EQ(EINVAL, ibv_wr_complete(x));
  EXPECT_TRUE(peer.poll(1, 50).empty());

  ibv_wr_start(x);
  x->wr_id = 2;
  ibv_wr_send_imm(x, htonl(3));
  ibv_wr_set_ud_addr(x, ah, info.qpn, 0x1234);
  ibv_wr_set_sge(x, me.mr->lkey, addr(0), 300);
  ASSERT_EQ(0, ibv_wr_complete(x));
  auto wc = poll(me.cq, 1);
  ASSERT_EQ(1u, wc.size());
  EXPECT_EQ(2u, wc[0].wr_id);
  auto got = peer.poll(1);
  ASSERT_EQ(1u, got.size());
  EXPECT_EQ(340u, got[0].byte_len);
  EXPECT_EQ(htonl(3), got[0].imm_data);
  EXPECT_EQ(local_sum(0, 300), peer.checksum(40, 300));
  ibv_destroy_ah(ah);
}

}  // namespace
}  // namespace svtest

#include "softverbs/softverbs.h"

namespace svtest {
namespace {

// A QP created as an extended one is extended through every handle: an
// importer's (svx_import_qp, from another context here as from another
// process) has the ibv_qp_ex form with the creator's send ops, and its
// batches run; an op the creator did not ask for is refused there too. A
// plain QP stays plain when imported.
TEST(QpEx, AnImportedQpIsExtendedAsItsCreator) {
  Side me;
  Side::Options o;
  o.send_ops = IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_SEND;
  ASSERT_EQ(0, me.open(o));
  ibv_qp_init_attr ia{};
  ia.send_cq = ia.recv_cq = me.cq;
  ia.qp_type = IBV_QPT_RC;
  ia.cap = {8, 8, 1, 1, 0};
  ibv_qp* plain = ibv_create_qp(me.pd, &ia);
  ASSERT_NE(nullptr, plain);
  ibv_context* c = ibv_import_device(me.ctx->cmd_fd);
  ASSERT_NE(nullptr, c);
  ibv_qp* imported = svx_import_qp(c, me.qp->qp_num);
  ASSERT_NE(nullptr, imported) << strerror(errno);
  ibv_qp_ex* x = ibv_qp_to_qp_ex(imported);
  ASSERT_NE(nullptr, x);
  ibv_qp* imported_plain = svx_import_qp(c, plain->qp_num);
  ASSERT_NE(nullptr, imported_plain);
  EXPECT_EQ(nullptr, ibv_qp_to_qp_ex(imported_plain));

  Peer peer;
  PeerInfo info = peer.open({});
  ASSERT_EQ(0, peer.connect(imported->qp_num, {}));
  ASSERT_EQ(0, connect_qp(imported, info.qpn));
  for (int i = 0; i < 64; ++i) me.buf[i] = uint8_t(i * 5 + 3);
  ibv_wr_start(x);
  x->wr_id = 7;
  x->wr_flags = IBV_SEND_SIGNALED;
  ibv_wr_rdma_write(x, info.rkey, info.addr);
  ibv_wr_set_sge(x, me.mr->lkey, reinterpret_cast<uint64_t>(me.buf), 64);
  ASSERT_EQ(0, ibv_wr_complete(x));
  auto wc = poll(imported->send_cq, 1);
  ASSERT_EQ(1u, wc.size());
  EXPECT_EQ(IBV_WC_SUCCESS, wc[0].status) << ibv_wc_status_str(wc[0].status);
  EXPECT_EQ(7u, wc[0].wr_id);
  EXPECT_EQ(checksum(me.buf, 64), peer.checksum(0, 64));
  // READ was not among the creator's ops.
  ibv_wr_start(x);
  ibv_wr_rdma_read(x, info.rkey, info.addr);
  ibv_wr_set_sge(x, me.mr->lkey, reinterpret_cast<uint64_t>(me.buf) + 1024, 64);
  EXPECT_EQ(EINVAL, ibv_wr_complete(x));

  ibv_pd* pd = imported->pd;
  ibv_cq* cq = imported->send_cq;
  svx_unimport_qp(imported_plain);
  svx_unimport_qp(imported);
  svx_unimport_cq(cq);
  ibv_unimport_pd(pd);
  ibv_close_device(c);
  EXPECT_EQ(0, ibv_destroy_qp(plain));
}

}  // namespace
}  // namespace svtest
