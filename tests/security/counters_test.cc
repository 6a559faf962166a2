// The device's counters (Op::Counters; `rdma statistic`, the sysfs view's
// hw_counters, `softverbs status`) between users. Root's RC QP is connected
// to nobody's, so the daemon carries every request (mediated) and counts it
// itself; nobody also forges huge counts into a QP segment of its own (which
// it may write). What must hold: nobody's view lists none of root's QPs and
// sums none of root's counts (its mediated counts, which only the daemon
// writes, are 0: root's requests count at root's QP); root's QP shows
// exactly what was carried out, whatever nobody wrote; nobody's own QP, the
// responder, shows what reached it.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "attack.h"
#include "common/counters_query.h"
#include "common/shm_layout.h"

namespace svsec {
namespace {

using namespace sv::counters;
constexpr uint64_t kForged = 1'000'000'007;
constexpr uint32_t kAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
constexpr int kWrites = 20, kSends = 3;
// READs: RC only (UC has none, IBTA 9.8).
constexpr int reads_of(ibv_qp_type t) { return t == IBV_QPT_RC ? 5 : 0; }
constexpr uint32_t kWriteLen = 64, kReadLen = 32, kSendLen = 16;

struct Info {
  uint32_t qpn, rkey, forged_qpn;
  uint64_t addr;
};

// What nobody's connection was shown.
struct NobodySaw {
  uint32_t entries = 0, saw_root = 0, saw_forged = 0;
  uint64_t port_mediated_ops = 0, port_rdma_sends = 0;
  uint64_t own[kCount] = {};
};

struct Side {
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  ibv_cq* cq = nullptr;
  ibv_qp* qp = nullptr;
  ibv_mr* mr = nullptr;
  uint8_t* buf = nullptr;  // 8 KiB
  bool open(ibv_qp_type type) {
    ctx = open_dev();
    if (!ctx || !(pd = ibv_alloc_pd(ctx)) || !(cq = ibv_create_cq(ctx, 256, nullptr, nullptr, 0))) return false;
    ibv_qp_init_attr ia{};
    ia.send_cq = ia.recv_cq = cq;
    ia.qp_type = type;
    ia.cap.max_send_wr = ia.cap.max_recv_wr = 64;
    ia.cap.max_send_sge = ia.cap.max_recv_sge = 1;
    void* p = mmap(nullptr, 8192, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return false;
    buf = static_cast<uint8_t*>(p);
    if (!(qp = ibv_create_qp(pd, &ia)) || !(mr = ibv_reg_mr(pd, buf, 8192, kAccess))) return false;
    return qp_to_init(qp, IBV_ACCESS_REMOTE_WRITE | (type == IBV_QPT_RC ? IBV_ACCESS_REMOTE_READ : 0)) == 0;
  }
  // To RTS towards `dest`: qp_to_rts for RC; UC takes no RDMA READ or
  // retry attributes (IBTA 11.2.4.2, as ibv_modify_qp(3)'s table).
  bool connect(ibv_qp_type type, uint32_t dest) {
    if (type == IBV_QPT_RC) return qp_to_rts(ctx, qp, dest) == 0;
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = IBV_MTU_1024;
    a.dest_qp_num = dest;
    a.ah_attr.is_global = 1;
    a.ah_attr.grh.hop_limit = 1;
    ibv_query_gid(ctx, 1, 0, &a.ah_attr.grh.dgid);
    a.ah_attr.port_num = 1;
    if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN))
      return false;
    ibv_qp_attr r{};
    r.qp_state = IBV_QPS_RTS;
    return ibv_modify_qp(qp, &r, IBV_QP_STATE | IBV_QP_SQ_PSN) == 0;
  }
  // One signaled request, waited for; true if it succeeded.
  bool run(ibv_wr_opcode op, uint32_t len, const Info& peer) {
    ibv_sge s{reinterpret_cast<uintptr_t>(buf), len, mr->lkey};
    ibv_send_wr w{}, *bad = nullptr;
    w.sg_list = &s;
    w.num_sge = 1;
    w.opcode = op;
    w.send_flags = IBV_SEND_SIGNALED;
    w.wr.rdma.remote_addr = peer.addr;
    w.wr.rdma.rkey = peer.rkey;
    if (ibv_post_send(qp, &w, &bad)) return false;
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (std::chrono::steady_clock::now() < until) {
      ibv_wc wc{};
      if (ibv_poll_cq(cq, 1, &wc) == 1) return wc.status == IBV_WC_SUCCESS;
      std::this_thread::yield();
    }
    return false;
  }
};

// A QP of nobody's own, made on a raw connection, whose segment it fills
// with kForged: every counter slot a holder may write.
bool forge(RawConn& raw, uint32_t& qpn) {
  using sv::proto::Op;
  std::vector<sv::Fd> fds;
  sv::proto::Empty e{};
  sv::proto::HelloReply hello{};
  sv::proto::HandleReply pd{};
  sv::proto::CreateCqReq cq{};
  cq.cqe = 16;
  sv::proto::CreateCqReply cqrep{};
  if (raw.call(Op::Hello, e, hello, {}, &fds) || raw.call(Op::AllocPd, e, pd) ||
      raw.call(Op::CreateCq, cq, cqrep, {}, &fds))
    return false;
  sv::proto::CreateQpReq q{};
  q.pd = pd.handle;
  q.send_cq = q.recv_cq = cqrep.handle;
  q.qp_type = IBV_QPT_RC;
  q.max_send_wr = q.max_recv_wr = 4;
  q.max_send_sge = q.max_recv_sge = 1;
  sv::proto::CreateQpReply qrep{};
  fds.clear();
  if (raw.call(Op::CreateQp, q, qrep, {}, &fds) || fds.size() != 1) return false;
  void* seg = mmap(nullptr, sizeof(sv::shm::QpSegmentHeader), PROT_READ | PROT_WRITE, MAP_SHARED, fds[0].get(), 0);
  if (seg == MAP_FAILED) return false;
  auto* h = static_cast<sv::shm::QpSegmentHeader*>(seg);
  for (auto& w : h->wire) w.store(kForged);
  for (auto& w : h->req_counts) w.store(kForged);
  for (auto& w : h->rsp_counts) w.store(kForged);
  qpn = qrep.qpn;
  return true;
}

int nobody_body(int sock, const std::string& daemon_socket, ibv_qp_type type) {
  Side me;
  if (!me.open(type)) return 20;
  RawConn raw(daemon_socket);
  uint32_t forged = 0;
  if (!raw.ok() || !forge(raw, forged)) return 21;
  for (int i = 0; i < kSends; ++i) {
    ibv_sge s{reinterpret_cast<uintptr_t>(me.buf) + 4096, 1024, me.mr->lkey};
    ibv_recv_wr r{}, *bad = nullptr;
    r.sg_list = &s;
    r.num_sge = 1;
    if (ibv_post_recv(me.qp, &r, &bad)) return 22;
  }
  Info info{me.qp->qp_num, me.mr->rkey, forged, reinterpret_cast<uintptr_t>(me.buf)};
  uint32_t root_qpn = 0;
  if (!send_val(sock, info) || !recv_val(sock, root_qpn)) return 23;
  if (!me.connect(type, root_qpn)) return 24;
  if (!send_val(sock, 1)) return 25;
  int go = 0;
  if (!recv_val(sock, go)) return 26;
  Snapshot snap;
  uint32_t seq = 100;
  if (query(raw.fd(), seq, snap) != 0) return 27;
  NobodySaw saw;
  saw.entries = uint32_t(snap.qps.size());
  saw.port_mediated_ops = snap.port[kMediatedOps];
  saw.port_rdma_sends = snap.port[kRdmaSends];
  for (const auto& q : snap.qps) {
    if (q.qpn == root_qpn) saw.saw_root = 1;
    if (q.qpn == forged) saw.saw_forged = 1;
    if (q.qpn == me.qp->qp_num) std::copy_n(q.values, kCount, saw.own);
  }
  return send_val(sock, saw) ? 0 : 28;
}

int root_body(int sock, ibv_qp_type type) {
  Side me;
  if (!me.open(type)) return 10;
  Info peer{};
  if (!send_val(sock, me.qp->qp_num) || !recv_val(sock, peer)) return 11;
  if (!me.connect(type, peer.qpn)) return 12;
  for (int i = 0; i < kWrites; ++i)
    if (!me.run(IBV_WR_RDMA_WRITE, kWriteLen, peer)) return 13;
  for (int i = 0; i < reads_of(type); ++i)
    if (!me.run(IBV_WR_RDMA_READ, kReadLen, peer)) return 14;
  for (int i = 0; i < kSends; ++i)
    if (!me.run(IBV_WR_SEND, kSendLen, peer)) return 15;
  int done = 1;
  if (!send_val(sock, done) || !recv_val(sock, done)) return 16;
  return 0;
}

const uint64_t* entry(const Snapshot& s, uint32_t qpn) {
  for (const auto& q : s.qps)
    if (q.qpn == qpn) return q.values;
  return nullptr;
}

// RC between users goes pipelined (Op::MediatePost), UC one request at a
// time (Op::Mediate): both are counted by the daemon.
void sees_and_forges_only_its_own(ibv_qp_type type) {
  const int kReads = reads_of(type);
  SystemDaemon sysd;
  const std::string sock = sysd.socket();
  Child root(false, [type](int s) { return root_body(s, type); });
  Child nobody(true, [sock, type](int s) { return nobody_body(s, sock, type); });
  root.start();
  nobody.start();
  uint32_t root_qpn = 0;
  Info info{};
  int ready = 0, done = 0;
  ASSERT_TRUE(recv_val(root.sock(), root_qpn) && recv_val(nobody.sock(), info) &&
              send_val(nobody.sock(), root_qpn) && recv_val(nobody.sock(), ready) && send_val(root.sock(), info))
      << "set-up: root exit " << root.wait() << ", nobody exit " << nobody.wait();
  ASSERT_TRUE(recv_val(root.sock(), done)) << "root's traffic failed: exit " << root.wait();

  RawConn mine(sock);
  ASSERT_TRUE(mine.ok());
  Snapshot all;
  uint32_t seq = 0;
  ASSERT_EQ(0, query(mine.fd(), seq, all));
  const uint64_t* r = entry(all, root_qpn);
  const uint64_t* n = entry(all, info.qpn);
  ASSERT_NE(nullptr, r);
  ASSERT_NE(nullptr, n);
  EXPECT_NE(nullptr, entry(all, info.forged_qpn)) << "root sees every user's QPs";
  // Root's QP: what the daemon carried out for it, nothing of nobody's.
  EXPECT_EQ(uint64_t(kWrites + kReads + kSends), r[kMediatedOps]);
  EXPECT_EQ(uint64_t(kSends), r[kRdmaSends]);
  EXPECT_EQ(uint64_t(kWrites * kWriteLen + kSends * kSendLen), r[kSentBytes]);
  EXPECT_EQ(uint64_t(kReads * kReadLen), r[kRcvdBytes]);
  for (uint32_t i : {kSentPkts, kRdmaRecvs, kShmOps, kShmErrors, kMediatedErrors}) EXPECT_EQ(0u, r[i]) << kNames[i];
  // Nobody's QP, the responder.
  EXPECT_EQ(uint64_t(kSends), n[kRdmaRecvs]);
  EXPECT_EQ(uint64_t(kWrites * kWriteLen + kSends * kSendLen), n[kRcvdBytes]);
  EXPECT_EQ(uint64_t(kReads * kReadLen), n[kSentBytes]);
  EXPECT_EQ(0u, n[kMediatedOps]);

  int go = 1;
  ASSERT_TRUE(send_val(nobody.sock(), go));
  NobodySaw saw;
  ASSERT_TRUE(recv_val(nobody.sock(), saw)) << "nobody failed: exit " << nobody.wait();
  EXPECT_EQ(0u, saw.saw_root) << "nobody was shown root's QP";
  EXPECT_EQ(1u, saw.saw_forged) << "nobody sees its own QPs";
  EXPECT_EQ(2u, saw.entries);
  EXPECT_EQ(0u, saw.port_mediated_ops) << "nobody's port sums hold root's mediated requests";
  // Its own forged QP's (the wire's slot and the shared-memory path's), nothing of root's.
  EXPECT_EQ(2 * kForged, saw.port_rdma_sends);
  EXPECT_EQ(uint64_t(kSends), saw.own[kRdmaRecvs]);
  ASSERT_TRUE(send_val(root.sock(), go));
  EXPECT_EQ(0, root.wait());
  EXPECT_EQ(0, nobody.wait());
}

TEST(Counters, AUserSeesAndForgesOnlyItsOwnPipelined) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run a child as another user";
  sees_and_forges_only_its_own(IBV_QPT_RC);
}

TEST(Counters, AUserSeesAndForgesOnlyItsOwnOneAtATime) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run a child as another user";
  sees_and_forges_only_its_own(IBV_QPT_UC);
}

}  // namespace
}  // namespace svsec
