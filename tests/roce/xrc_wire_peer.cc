// xrc_wire_peer: XRC (IBTA annex A14) over RoCEv2 between two hosts of the
// test bed (tests/roce/wire_test.sh, case xrc_peer): what Debian's
// programs never do. The two sides meet through files in a directory both
// can read (the namespaces share the file system); GID index 1.
//
//   xrc_wire_peer server|client DIR
//
// server: XRC domain 1 with SRQ A (PD 1) and SRQ B (PD 2), XRC domain 2
//         with SRQ C; an MR in each PD; four XRC target QPs of domain 1,
//         one per client initiator.
// client: four XRC initiators, one per phase (an error ends both QPs):
//   1. SEND of 3000 bytes (3 packets) to A; SEND with Immediate to B
//      through the extended API (ibv_wr_set_xrc_srqn); WRITE into PD 1's MR
//      naming A and READ it back; WRITE into PD 2's MR naming B: all
//      succeed, each receive in its SRQ (checked by the server).
//   2. SEND naming an SRQ number the server's domain does not have:
//      IBV_WC_REM_INV_REQ_ERR.
//   3. SEND naming C, an SRQ of the server's other XRC domain:
//      IBV_WC_REM_INV_REQ_ERR, and C's receive is not taken.
//   4. WRITE with PD 2's key naming A (keys are checked in the named SRQ's
//      PD): IBV_WC_REM_ACCESS_ERR.
// The server then checks its refusing target QPs are in ERR and raised
// IBV_EVENT_QP_REQ_ERR (2, 3) and IBV_EVENT_QP_ACCESS_ERR (4).
// Exit 0 when every check holds; the failed check on stderr otherwise.
#include <arpa/inet.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "wire_peer.h"
#include <vector>

namespace {

constexpr size_t kBuf = 8192;
constexpr int kGidIndex = 1, kPairs = 4;
constexpr uint32_t kNoSuchSrq = 0x7777;

using wire_peer::die;
using wire_peer::get;
using wire_peer::poll_one;
using wire_peer::put;

void expect(const ibv_wc& wc, uint64_t wr_id, ibv_wc_opcode op, ibv_wc_status st, const char* what) {
  if (wc.wr_id != wr_id || wc.status != st || (st == IBV_WC_SUCCESS && wc.opcode != op)) {
    die(std::string(what) + ": wr_id " + std::to_string(wc.wr_id) + ", status " + ibv_wc_status_str(wc.status) +
        ", opcode " + std::to_string(wc.opcode));
  }
}

struct Dev {
  ibv_context* ctx = nullptr;
  ibv_gid gid{};
  ibv_cq* cq = nullptr;
};

Dev open_dev() {
  Dev d;
  d.ctx = wire_peer::open_first(kGidIndex, d.gid);
  d.cq = ibv_create_cq(d.ctx, 64, nullptr, nullptr, 0);
  if (!d.cq) die("ibv_create_cq");
  return d;
}

ibv_mr* reg(ibv_pd* pd) {
  void* p = std::aligned_alloc(4096, kBuf);
  if (!p) die("buffer");
  std::memset(p, 0, kBuf);
  ibv_mr* mr = ibv_reg_mr(pd, p, kBuf, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
  if (!mr) die("ibv_reg_mr");
  return mr;
}

std::string gid_text(const ibv_gid& g) {
  std::string out;
  // Appended piece by piece: GCC 12's -Wrestrict misfires on
  // " " + std::string at -O3 (the Release build).
  for (uint8_t b : g.raw) {
    out += ' ';
    out += std::to_string(unsigned(b));
  }
  return out;
}

ibv_gid parse_gid(std::istringstream& in) {
  ibv_gid g{};
  for (auto& b : g.raw) {
    unsigned v = 0;
    in >> v;
    b = uint8_t(v);
  }
  return g;
}

void to_init(ibv_qp* qp) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.port_num = 1;
  a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
  if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
    die("modify to INIT");
}

uint8_t pattern(size_t i) { return uint8_t(i * 13 + 5); }

void post_srq_recv(ibv_srq* srq, ibv_mr* mr, size_t off, uint32_t len, uint64_t wr_id) {
  ibv_sge sge{uint64_t(uintptr_t(mr->addr)) + off, len, mr->lkey};
  ibv_recv_wr wr{}, *bad = nullptr;
  wr.wr_id = wr_id;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  if (ibv_post_srq_recv(srq, &wr, &bad)) die("ibv_post_srq_recv");
}

int server(const std::string& dir) {
  Dev d = open_dev();
  ibv_pd* pd1 = ibv_alloc_pd(d.ctx);
  ibv_pd* pd2 = ibv_alloc_pd(d.ctx);
  if (!pd1 || !pd2) die("ibv_alloc_pd");
  ibv_mr* mr1 = reg(pd1);
  ibv_mr* mr2 = reg(pd2);
  ibv_xrcd* x[2];
  for (auto& xd : x) {
    ibv_xrcd_init_attr xa{};
    xa.comp_mask = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS;
    xa.fd = -1;  // a private domain
    xa.oflags = O_CREAT;
    xd = ibv_open_xrcd(d.ctx, &xa);
    if (!xd) die("ibv_open_xrcd");
  }
  auto make_srq = [&](ibv_xrcd* xd, ibv_pd* pd) {
    ibv_srq_init_attr_ex sa{};
    sa.attr.max_wr = 16;
    sa.attr.max_sge = 1;
    sa.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_XRCD | IBV_SRQ_INIT_ATTR_CQ | IBV_SRQ_INIT_ATTR_PD;
    sa.srq_type = IBV_SRQT_XRC;
    sa.xrcd = xd;
    sa.cq = d.cq;
    sa.pd = pd;
    ibv_srq* s = ibv_create_srq_ex(d.ctx, &sa);
    if (!s) die("ibv_create_srq_ex");
    return s;
  };
  ibv_srq* A = make_srq(x[0], pd1);
  ibv_srq* B = make_srq(x[0], pd2);
  ibv_srq* C = make_srq(x[1], pd1);
  uint32_t na = 0, nb = 0, nc = 0;
  if (ibv_get_srq_num(A, &na) || ibv_get_srq_num(B, &nb) || ibv_get_srq_num(C, &nc)) die("ibv_get_srq_num");
  post_srq_recv(A, mr1, 0, 4096, 1);
  post_srq_recv(B, mr2, 0, 4096, 2);
  post_srq_recv(C, mr1, 4096, 4096, 3);
  std::vector<ibv_qp*> tgt;
  std::ostringstream me;
  me << na << " " << nb << " " << nc << " " << uintptr_t(mr1->addr) << " " << mr1->rkey << " "
     << uintptr_t(mr2->addr) << " " << mr2->rkey << gid_text(d.gid);
  for (int i = 0; i < kPairs; ++i) {
    ibv_qp_init_attr_ex qa{};
    qa.qp_type = IBV_QPT_XRC_RECV;
    qa.comp_mask = IBV_QP_INIT_ATTR_XRCD;
    qa.xrcd = x[0];
    ibv_qp* q = ibv_create_qp_ex(d.ctx, &qa);
    if (!q) die("ibv_create_qp_ex XRC_RECV");
    to_init(q);
    tgt.push_back(q);
    me << " " << q->qp_num;
  }
  put(dir + "/server", me.str());
  std::istringstream peer(get(dir + "/client"));
  std::vector<uint32_t> init(kPairs);
  for (auto& n : init) peer >> n;
  const ibv_gid pg = parse_gid(peer);
  for (int i = 0; i < kPairs; ++i) wire_peer::to_rtr(tgt[i], init[i], pg, kGidIndex);
  put(dir + "/server_ready", "ready");

  // Phase 1's two receives, each from its SRQ, into its SRQ's memory.
  ibv_wc wc = poll_one(d.cq);
  expect(wc, 1, IBV_WC_RECV, IBV_WC_SUCCESS, "receive from SRQ A");
  if (wc.byte_len != 3000 || wc.qp_num != tgt[0]->qp_num) die("SRQ A's receive: length or QP number");
  for (size_t i = 0; i < 3000; ++i)
    if (static_cast<uint8_t*>(mr1->addr)[i] != pattern(i)) die("SRQ A's receive: data at " + std::to_string(i));
  wc = poll_one(d.cq);
  expect(wc, 2, IBV_WC_RECV, IBV_WC_SUCCESS, "receive from SRQ B");
  if (wc.byte_len != 100 || !(wc.wc_flags & IBV_WC_WITH_IMM) || wc.imm_data != htonl(0x1234abcd))
    die("SRQ B's receive: length or immediate");
  std::string done = get(dir + "/client_done");
  if (done != "ok") die("client: " + done);
  // The WRITEs of phase 1 landed (PD 1's through A, PD 2's through B); the
  // refused requests of phases 2-4 took no receive and wrote nothing.
  for (size_t i = 0; i < 256; ++i) {
    if (static_cast<uint8_t*>(mr1->addr)[5000 + i] != pattern(i + 7)) die("WRITE through A");
    if (static_cast<uint8_t*>(mr2->addr)[6000 + i] != pattern(i + 9)) die("WRITE through B");
    if (static_cast<uint8_t*>(mr2->addr)[7000 + i] != 0) die("phase 4's WRITE landed");
  }
  if (ibv_poll_cq(d.cq, 1, &wc) != 0) die("a completion from a refused request: wr_id " + std::to_string(wc.wr_id));
  // Each refusing target QP is in ERR and raised its affiliated event
  // (IBTA 11.6.3.1): invalid request for phases 2 and 3, access for 4.
  for (int k = 1; k < kPairs; ++k) {
    pollfd pfd{d.ctx->async_fd, POLLIN, 0};
    if (::poll(&pfd, 1, 10000) != 1) die("async event " + std::to_string(k) + " of 3 missing");
    ibv_async_event ev{};
    if (ibv_get_async_event(d.ctx, &ev)) die("ibv_get_async_event");
    const ibv_event_type type = ev.event_type;
    int i = 0;
    while (i < kPairs && (type == IBV_EVENT_SRQ_LIMIT_REACHED || ev.element.qp != tgt[i])) ++i;
    ibv_ack_async_event(&ev);
    const ibv_event_type want = i == 3 ? IBV_EVENT_QP_ACCESS_ERR : IBV_EVENT_QP_REQ_ERR;
    if (i == 0 || i == kPairs || type != want)
      die(std::string("async event ") + ibv_event_type_str(type) + " of target " + std::to_string(i));
  }
  for (int i = 0; i < kPairs; ++i) {
    ibv_qp_attr qa{};
    ibv_qp_init_attr ia{};
    if (ibv_query_qp(tgt[i], &qa, IBV_QP_STATE, &ia) || (qa.qp_state == IBV_QPS_ERR) != (i != 0))
      die("target " + std::to_string(i) + ": state " + std::to_string(qa.qp_state));
  }
  for (ibv_qp* q : tgt)
    if (ibv_destroy_qp(q)) die("ibv_destroy_qp");
  for (ibv_srq* s : {A, B, C})
    if (ibv_destroy_srq(s)) die("ibv_destroy_srq");
  for (auto* xd : x) ibv_close_xrcd(xd);
  put(dir + "/server_done", "ok");
  std::printf("xrc_wire_peer server: ok\n");
  return 0;
}

int client(const std::string& dir) {
  Dev d = open_dev();
  ibv_pd* pd = ibv_alloc_pd(d.ctx);
  if (!pd) die("ibv_alloc_pd");
  ibv_mr* mr = reg(pd);
  auto* buf = static_cast<uint8_t*>(mr->addr);
  for (size_t i = 0; i < kBuf; ++i) buf[i] = pattern(i);
  std::vector<ibv_qp*> ini;
  std::ostringstream me;
  for (int i = 0; i < kPairs; ++i) {
    ibv_qp_init_attr_ex qa{};
    qa.qp_type = IBV_QPT_XRC_SEND;
    qa.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
    qa.pd = pd;
    qa.send_cq = d.cq;
    qa.cap.max_send_wr = 8;
    qa.cap.max_send_sge = 1;
    qa.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM | IBV_QP_EX_WITH_RDMA_WRITE |
                        IBV_QP_EX_WITH_RDMA_READ;
    ibv_qp* q = ibv_create_qp_ex(d.ctx, &qa);
    if (!q) die("ibv_create_qp_ex XRC_SEND");
    to_init(q);
    ini.push_back(q);
    me << q->qp_num << " ";
  }
  me << gid_text(d.gid);
  put(dir + "/client", me.str());
  std::istringstream peer(get(dir + "/server"));
  uint32_t na = 0, nb = 0, nc = 0, rk1 = 0, rk2 = 0;
  uintptr_t a1 = 0, a2 = 0;
  peer >> na >> nb >> nc >> a1 >> rk1 >> a2 >> rk2;
  const ibv_gid sg = parse_gid(peer);
  std::vector<uint32_t> tgt(kPairs);
  for (auto& n : tgt) peer >> n;
  get(dir + "/server_ready");
  for (int i = 0; i < kPairs; ++i) {
    wire_peer::to_rtr(ini[i], tgt[i], sg, kGidIndex);
    wire_peer::to_rts(ini[i]);
  }
  auto post = [&](ibv_qp* q, uint64_t id, ibv_wr_opcode op, uint32_t srqn, size_t off, uint32_t len,
                  uint64_t raddr = 0, uint32_t rkey = 0) {
    ibv_sge sge{uint64_t(uintptr_t(buf)) + off, len, mr->lkey};
    ibv_send_wr wr{}, *bad = nullptr;
    wr.wr_id = id;
    wr.opcode = op;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.qp_type.xrc.remote_srqn = srqn;
    wr.wr.rdma.remote_addr = raddr;
    wr.wr.rdma.rkey = rkey;
    if (ibv_post_send(q, &wr, &bad)) die("ibv_post_send");
  };
  // 1. Everything that should work.
  post(ini[0], 10, IBV_WR_SEND, na, 0, 3000);
  expect(poll_one(d.cq), 10, IBV_WC_SEND, IBV_WC_SUCCESS, "SEND to A");
  {
    ibv_qp_ex* qx = ibv_qp_to_qp_ex(ini[0]);
    ibv_wr_start(qx);
    qx->wr_id = 11;
    qx->wr_flags = IBV_SEND_SIGNALED;
    ibv_wr_send_imm(qx, htonl(0x1234abcd));
    ibv_wr_set_xrc_srqn(qx, nb);
    ibv_wr_set_sge(qx, mr->lkey, uint64_t(uintptr_t(buf)) + 100, 100);
    if (ibv_wr_complete(qx)) die("ibv_wr_complete");
    expect(poll_one(d.cq), 11, IBV_WC_SEND, IBV_WC_SUCCESS, "SEND with Immediate to B (ibv_wr_set_xrc_srqn)");
  }
  post(ini[0], 12, IBV_WR_RDMA_WRITE, na, 7, 256, a1 + 5000, rk1);
  expect(poll_one(d.cq), 12, IBV_WC_RDMA_WRITE, IBV_WC_SUCCESS, "WRITE into PD 1 naming A");
  std::memset(buf + 4096, 0, 256);
  post(ini[0], 13, IBV_WR_RDMA_READ, na, 4096, 256, a1 + 5000, rk1);
  expect(poll_one(d.cq), 13, IBV_WC_RDMA_READ, IBV_WC_SUCCESS, "READ from PD 1 naming A");
  for (size_t i = 0; i < 256; ++i)
    if (buf[4096 + i] != pattern(i + 7)) die("READ back: data at " + std::to_string(i));
  post(ini[0], 14, IBV_WR_RDMA_WRITE, nb, 9, 256, a2 + 6000, rk2);
  expect(poll_one(d.cq), 14, IBV_WC_RDMA_WRITE, IBV_WC_SUCCESS, "WRITE into PD 2 naming B");
  // 2. No such SRQ in the target's domain.
  post(ini[1], 20, IBV_WR_SEND, kNoSuchSrq, 0, 10);
  expect(poll_one(d.cq), 20, IBV_WC_SEND, IBV_WC_REM_INV_REQ_ERR, "SEND to no such SRQ");
  // 3. An SRQ of the target's other XRC domain.
  post(ini[2], 30, IBV_WR_SEND, nc, 0, 10);
  expect(poll_one(d.cq), 30, IBV_WC_SEND, IBV_WC_REM_INV_REQ_ERR, "SEND to an SRQ of another XRC domain");
  // 4. PD 2's key through A (PD 1).
  post(ini[3], 40, IBV_WR_RDMA_WRITE, na, 0, 256, a2 + 7000, rk2);
  expect(poll_one(d.cq), 40, IBV_WC_RDMA_WRITE, IBV_WC_REM_ACCESS_ERR, "WRITE with another PD's key");
  ibv_qp_attr qa{};
  ibv_qp_init_attr ia{};
  for (int i = 1; i < kPairs; ++i) {
    if (ibv_query_qp(ini[i], &qa, IBV_QP_STATE, &ia) || qa.qp_state != IBV_QPS_ERR)
      die("initiator " + std::to_string(i) + " not in ERR after its error");
  }
  put(dir + "/client_done", "ok");
  get(dir + "/server_done");
  for (ibv_qp* q : ini)
    if (ibv_destroy_qp(q)) die("ibv_destroy_qp");
  std::printf("xrc_wire_peer client: ok\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) die("usage: xrc_wire_peer server|client DIR");
  const std::string role = argv[1];
  if (role == "server") return server(argv[2]);
  if (role == "client") return client(argv[2]);
  die("usage: xrc_wire_peer server|client DIR");
}
