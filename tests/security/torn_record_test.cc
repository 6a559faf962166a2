// The records a QP's segment keeps for the daemon to act on at its death
// (the torn receive: torn_qpn, torn_wr_id, torn_taken, torn_pos, torn_pid;
// also sq_running and the pipelined run's fields) are in memory the QP's
// holders write. Nobody points its own RC QPs at root's QP number (QPNs
// are easy to guess), forges every such record in their segments naming
// root's QP, and leaves: the daemon, releasing nobody's QPs, must complete
// nothing into root's CQ and leave root's QP working. Before, it pushed a
// "flushed receive" with nobody's wr_id into root's CQ for each forged
// record (docs/SECURITY.md).
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "attack.h"
#include "common/shm_layout.h"

namespace svsec {
namespace {

using sv::proto::Op;

struct Victim {
  uint32_t qpn;  // root's responder QP
  uint32_t pid;  // root's pid (a claimer the forged record names)
};

// One raw RC QP of nobody's aimed at `dest` (INIT -> RTR), its segment
// mapped read-write; nullptr on failure.
sv::shm::QpSegmentHeader* forged_qp(RawConn& raw, uint32_t pd, uint32_t cq, uint32_t dest, size_t& size) {
  sv::proto::CreateQpReq q{};
  q.pd = pd;
  q.send_cq = q.recv_cq = cq;
  q.qp_type = IBV_QPT_RC;
  q.max_send_wr = q.max_recv_wr = 4;
  q.max_send_sge = q.max_recv_sge = 1;
  sv::proto::CreateQpReply qrep{};
  std::vector<sv::Fd> fds;
  if (raw.call(Op::CreateQp, q, qrep, {}, &fds) != 0 || fds.size() != 1) return nullptr;
  sv::proto::ModifyQpReq m{};
  m.qpn = qrep.qpn;
  m.attr_mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
  m.qp_state = IBV_QPS_INIT;
  m.port_num = 1;
  if (raw.call(Op::ModifyQp, m) != 0) return nullptr;
  sv::proto::ModifyQpReq r{};
  r.qpn = qrep.qpn;
  r.attr_mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
  r.qp_state = IBV_QPS_RTR;
  r.path_mtu = IBV_MTU_1024;
  r.dest_qp_num = dest;
  r.ah_port_num = 1;
  if (raw.call(Op::ModifyQp, r) != 0) return nullptr;
  size = qrep.segment_size;
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0].get(), 0);
  return p == MAP_FAILED ? nullptr : static_cast<sv::shm::QpSegmentHeader*>(p);
}

// Every record the daemon could read at the QP's death, naming root's QP.
void forge(sv::shm::QpSegmentHeader* h, const Victim& v, uint32_t taken, uint64_t wr_id, uint64_t pos) {
  h->torn_wr_id = wr_id;
  h->torn_pos = pos;
  h->torn_pid = v.pid;
  h->torn_taken.store(taken);
  h->torn_qpn.store(v.qpn);
  h->sq_running.store(1);
  h->med_pid.store(v.pid);
  h->med_client = 1;
  h->med_sent = 1000;
  h->med_epoch = 1;
}

int nobody_forges(const std::string& socket, int sock) {
  Victim v{};
  if (!recv_val(sock, v)) return 10;
  RawConn raw(socket);
  if (!raw.ok()) return 11;
  sv::proto::Empty hello{};
  sv::proto::HelloReply hrep{};
  std::vector<sv::Fd> fds;
  if (raw.call(Op::Hello, hello, hrep, {}, &fds) != 0) return 12;
  sv::proto::Empty e{};
  sv::proto::HandleReply pd{};
  if (raw.call(Op::AllocPd, e, pd) != 0) return 13;
  sv::proto::CreateCqReq cq{};
  cq.cqe = 16;
  sv::proto::CreateCqReply cqrep{};
  if (raw.call(Op::CreateCq, cq, cqrep, {}, &fds) != 0) return 14;
  // Copied out (torn_taken 1) with nobody's wr_id; still in the slot at
  // positions 0 and 1 of root's receive queue (torn_taken 0, claimed by
  // root's pid); and once more copied out.
  const struct {
    uint32_t taken;
    uint64_t wr_id, pos;
  } records[] = {{1, 0x6666, 0}, {0, 0x6667, 0}, {0, 0x6668, 1}, {1, 0x6669, 0}};
  for (const auto& rec : records) {
    size_t size = 0;
    sv::shm::QpSegmentHeader* h = forged_qp(raw, pd.handle, cqrep.handle, v.qpn, size);
    if (!h) return 20;
    forge(h, v, rec.taken, rec.wr_id, rec.pos);
  }
  return send_val(sock, 1) ? 0 : 30;  // then exits: its connection closes, its QPs die
}

TEST(TornRecord, AnotherUsersForgedDeathRecordsCompleteNothingIntoRootsCq) {
  SystemDaemon sysd;
  ASSERT_TRUE(sysd.alive());
  const std::string socket = sysd.socket();
  Child nobody(true, [socket](int sock) { return nobody_forges(socket, sock); });
  nobody.start();
  ibv_context* c = open_dev();
  ASSERT_NE(nullptr, c);
  ibv_pd* pd = ibv_alloc_pd(c);
  ibv_cq* cq = ibv_create_cq(c, 64, nullptr, nullptr, 0);
  ASSERT_TRUE(pd && cq);
  std::vector<uint8_t> buf(4096);
  ibv_mr* mr = ibv_reg_mr(pd, buf.data(), buf.size(), IBV_ACCESS_LOCAL_WRITE);
  ASSERT_NE(nullptr, mr);
  ibv_qp_init_attr ia{};
  ia.send_cq = ia.recv_cq = cq;
  ia.qp_type = IBV_QPT_RC;
  ia.cap.max_send_wr = ia.cap.max_recv_wr = 8;
  ia.cap.max_send_sge = ia.cap.max_recv_sge = 1;
  ibv_qp* qa = ibv_create_qp(pd, &ia);
  ibv_qp* qb = ibv_create_qp(pd, &ia);
  ASSERT_TRUE(qa && qb);
  ASSERT_EQ(0, qp_to_init(qa, 0));
  ASSERT_EQ(0, qp_to_init(qb, 0));
  ASSERT_EQ(0, qp_to_rts(c, qa, qb->qp_num));
  ASSERT_EQ(0, qp_to_rts(c, qb, qa->qp_num));
  // Receives waiting on root's responder: what a forged claim would steal.
  for (uint64_t i = 0; i < 2; ++i) {
    ibv_sge sge{reinterpret_cast<uint64_t>(buf.data()) + i * 64, 64, mr->lkey};
    ibv_recv_wr wr{};
    wr.wr_id = 100 + i;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    ibv_recv_wr* bad;
    ASSERT_EQ(0, ibv_post_recv(qb, &wr, &bad));
  }
  ASSERT_TRUE(send_val(nobody.sock(), Victim{qb->qp_num, uint32_t(getpid())}));
  int done = 0;
  ASSERT_TRUE(recv_val(nobody.sock(), done)) << "nobody: exit " << nobody.wait();
  EXPECT_EQ(0, nobody.wait());
  // Its connection is closed and its QPs released: a second of polling.
  std::vector<ibv_wc> got;
  for (auto end = std::chrono::steady_clock::now() + std::chrono::seconds(1); std::chrono::steady_clock::now() < end;) {
    ibv_wc wc{};
    if (ibv_poll_cq(cq, 1, &wc) == 1) got.push_back(wc);
    else std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  for (const ibv_wc& wc : got)
    ADD_FAILURE() << "a completion in root's CQ from nobody's records: wr_id 0x" << std::hex << wc.wr_id
                  << " status " << std::dec << wc.status << " qp 0x" << std::hex << wc.qp_num;
  EXPECT_EQ(0u, got.size());
  // Root's QP still works: both receives are there, in order, and its
  // state is what root made it.
  ibv_qp_attr attr{};
  ibv_qp_init_attr init{};
  ASSERT_EQ(0, ibv_query_qp(qb, &attr, IBV_QP_STATE, &init));
  EXPECT_EQ(IBV_QPS_RTS, attr.qp_state);
  for (uint32_t i = 0; i < 2; ++i) {
    ibv_sge sge{reinterpret_cast<uint64_t>(buf.data()) + 2048 + i * 64, 16 + i, mr->lkey};
    ibv_send_wr wr{};
    wr.wr_id = 200 + i;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_SEND;
    wr.send_flags = IBV_SEND_SIGNALED;
    ibv_send_wr* bad;
    ASSERT_EQ(0, ibv_post_send(qa, &wr, &bad));
  }
  std::vector<ibv_wc> after;
  for (int i = 0; i < 500 && after.size() < 4; ++i) {
    ibv_wc wc{};
    if (ibv_poll_cq(cq, 1, &wc) == 1) after.push_back(wc);
    else std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_EQ(4u, after.size());
  uint64_t next_recv = 100;
  for (const ibv_wc& wc : after) {
    EXPECT_EQ(IBV_WC_SUCCESS, wc.status) << "wr_id " << wc.wr_id;
    if (wc.opcode == IBV_WC_RECV) {
      EXPECT_EQ(next_recv, wc.wr_id);
      EXPECT_EQ(16 + (next_recv - 100), wc.byte_len);
      ++next_recv;
    }
  }
  EXPECT_TRUE(sysd.alive());
  ibv_destroy_qp(qa);
  ibv_destroy_qp(qb);
  ibv_dereg_mr(mr);
  ibv_destroy_cq(cq);
  ibv_dealloc_pd(pd);
  ibv_close_device(c);
}

}  // namespace
}  // namespace svsec
