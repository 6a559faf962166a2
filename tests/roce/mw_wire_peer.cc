// mw_wire_peer: memory windows over RoCEv2 between two hosts of the test bed
// (tests/roce/wire_test.sh, case mw). One RC QP each side on GID index 1;
// the two sides meet through files in a directory both can read (the
// namespaces share the file system), as ibv_rc_pingpong meets over TCP.
//
//   mw_wire_peer server|client DIR
//
// server: binds a type 2 window over part of its buffer with IBV_WR_BIND_MW
//         (IBV_WC_BIND_MW), publishes its key, waits for the client's SEND
//         with Invalidate naming that key (IBV_WC_WITH_INV), checks the bytes
//         the client wrote through the window; binds again, invalidates
//         that key itself with IBV_WR_LOCAL_INV (IBV_WC_LOCAL_INV), and
//         publishes the dead key; then waits for its QP's
//         IBV_EVENT_QP_ACCESS_ERR (the client's WRITE with that key).
// client: WRITEs 256 bytes through the window, READs them back, SENDs with
//         Invalidate; then WRITEs through the dead key and expects
//         IBV_WC_REM_ACCESS_ERR.
// Exit 0 when every check holds; the failed check on stderr otherwise.
#include <infiniband/verbs.h>
#include <poll.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>

#include "wire_peer.h"

namespace {

constexpr size_t kBuf = 4096, kWinOff = 512, kWinLen = 256;
constexpr int kGidIndex = 1;

using wire_peer::die;
using wire_peer::get;
using wire_peer::poll_one;
using wire_peer::put;

void expect(const ibv_wc& wc, ibv_wc_opcode op, ibv_wc_status st, const char* what) {
  if (wc.status != st || (st == IBV_WC_SUCCESS && wc.opcode != op)) {
    die(std::string(what) + ": status " + ibv_wc_status_str(wc.status) + ", opcode " + std::to_string(wc.opcode));
  }
}

struct Side {
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  ibv_cq* cq = nullptr;
  ibv_qp* qp = nullptr;
  ibv_mr* mr = nullptr;
  uint8_t* buf = nullptr;
  ibv_gid gid{};
};

Side open_side() {
  Side s;
  s.ctx = wire_peer::open_first(kGidIndex, s.gid);
  s.pd = ibv_alloc_pd(s.ctx);
  s.cq = ibv_create_cq(s.ctx, 16, nullptr, nullptr, 0);
  s.buf = static_cast<uint8_t*>(std::aligned_alloc(4096, kBuf));
  if (!s.pd || !s.cq || !s.buf) die("pd/cq/buffer");
  std::memset(s.buf, 0, kBuf);
  s.mr = ibv_reg_mr(s.pd, s.buf, kBuf,
                    IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_MW_BIND);
  if (!s.mr) die("ibv_reg_mr");
  ibv_qp_init_attr ia{};
  ia.send_cq = ia.recv_cq = s.cq;
  ia.qp_type = IBV_QPT_RC;
  ia.cap.max_send_wr = ia.cap.max_recv_wr = 8;
  ia.cap.max_send_sge = ia.cap.max_recv_sge = 1;
  s.qp = ibv_create_qp(s.pd, &ia);
  if (!s.qp) die("ibv_create_qp");
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.port_num = 1;
  a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
  if (ibv_modify_qp(s.qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
    die("modify to INIT");
  return s;
}

// Destroying the QP prints its wire statistics (SOFTVERBS_ROCE_STATS), which
// the test reads to know the QP was on the wire.
void close_side(Side& s, ibv_mw* mw = nullptr) {
  if (ibv_destroy_qp(s.qp)) die("ibv_destroy_qp");
  if (mw && ibv_dealloc_mw(mw)) die("ibv_dealloc_mw");
  if (ibv_dereg_mr(s.mr) || ibv_destroy_cq(s.cq) || ibv_dealloc_pd(s.pd) || ibv_close_device(s.ctx)) die("teardown");
  std::free(s.buf);
}

std::string describe(const Side& s) {
  char t[128];
  std::snprintf(t, sizeof t, "%u", s.qp->qp_num);
  std::string out = t;
  for (uint8_t b : s.gid.raw) {
    std::snprintf(t, sizeof t, " %u", unsigned(b));
    out += t;
  }
  return out;
}

void connect(Side& s, const std::string& peer) {
  unsigned qpn = 0;
  ibv_gid g{};
  const char* p = peer.c_str();
  char* end = nullptr;
  qpn = unsigned(std::strtoul(p, &end, 10));
  for (auto& b : g.raw) b = uint8_t(std::strtoul(end, &end, 10));
  wire_peer::to_rtr(s.qp, qpn, g, kGidIndex);
  wire_peer::to_rts(s.qp);
}

uint32_t bind_window(Side& s, ibv_mw* mw, uint64_t wr_id) {
  ibv_send_wr wr{}, *bad = nullptr;
  wr.wr_id = wr_id;
  wr.opcode = IBV_WR_BIND_MW;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.bind_mw.mw = mw;
  wr.bind_mw.rkey = ibv_inc_rkey(mw->rkey);
  wr.bind_mw.bind_info.mr = s.mr;
  wr.bind_mw.bind_info.addr = uint64_t(uintptr_t(s.buf + kWinOff));
  wr.bind_mw.bind_info.length = kWinLen;
  wr.bind_mw.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
  if (ibv_post_send(s.qp, &wr, &bad)) die("post BIND_MW");
  expect(poll_one(s.cq), IBV_WC_BIND_MW, IBV_WC_SUCCESS, "BIND_MW");
  mw->rkey = wr.bind_mw.rkey;
  return mw->rkey;
}

// Waits (10 s at most) for the affiliated event of the server's QP.
void wait_access_error(Side& s) {
  pollfd pfd{s.ctx->async_fd, POLLIN, 0};
  if (::poll(&pfd, 1, 10000) != 1) die("no async event after the client's WRITE through the dead key");
  ibv_async_event ev{};
  if (ibv_get_async_event(s.ctx, &ev)) die("ibv_get_async_event");
  const ibv_event_type type = ev.event_type;
  const bool mine = ev.element.qp == s.qp;
  ibv_ack_async_event(&ev);
  if (type != IBV_EVENT_QP_ACCESS_ERR || !mine)
    die(std::string("async event ") + ibv_event_type_str(type) + (mine ? "" : " (not of our QP)") +
        ", expected IBV_EVENT_QP_ACCESS_ERR of our QP");
  ibv_qp_attr a{};
  ibv_qp_init_attr ia{};
  if (ibv_query_qp(s.qp, &a, IBV_QP_STATE, &ia) || a.qp_state != IBV_QPS_ERR) die("our QP is not in ERR");
}

int server(const std::string& dir) {
  Side s = open_side();
  ibv_mw* mw = ibv_alloc_mw(s.pd, IBV_MW_TYPE_2);
  if (!mw) die("ibv_alloc_mw type 2");
  put(dir + "/server.qp", describe(s));
  connect(s, get(dir + "/client.qp"));
  ibv_sge sge{uint64_t(uintptr_t(s.buf)), 64, s.mr->lkey};
  ibv_recv_wr rwr{}, *rbad = nullptr;
  rwr.wr_id = 100;
  rwr.sg_list = &sge;
  rwr.num_sge = 1;
  if (ibv_post_recv(s.qp, &rwr, &rbad)) die("post recv");
  const uint32_t key1 = bind_window(s, mw, 1);
  put(dir + "/server.key1", std::to_string(key1) + " " + std::to_string(uint64_t(uintptr_t(s.buf + kWinOff))));
  ibv_wc wc = poll_one(s.cq);
  expect(wc, IBV_WC_RECV, IBV_WC_SUCCESS, "SEND with Invalidate");
  // Linux rxe (6.1, rdma-core 44) reports the invalidation with the
  // kernel's flag IB_WC_WITH_INVALIDATE (1 << 2), which libibverbs reads as
  // IBV_WC_IP_CSUM_OK: its user-space CQE carries the kernel's flags as they
  // are (tests/roce/rxe_test.sh runs this peer on rxe). The key must match.
  const bool rxe = std::strncmp(ibv_get_device_name(s.ctx->device), "rxe", 3) == 0;
  const unsigned inv_flag = IBV_WC_WITH_INV | (rxe ? 1u << 2 : 0u);
  if (!(wc.wc_flags & inv_flag) || wc.invalidated_rkey != key1) {
    char why[160];
    std::snprintf(why, sizeof why, "no IBV_WC_WITH_INV for the window's key 0x%x: wc_flags 0x%x, invalidated_rkey 0x%x",
                  key1, unsigned(wc.wc_flags), unsigned(wc.invalidated_rkey));
    die(why);
  }
  for (size_t i = 0; i < kWinLen; ++i) {
    if (s.buf[kWinOff + i] != uint8_t(i * 3 + 1)) die("byte " + std::to_string(i) + " of the window differs");
  }
  // The window is unbound: bind it again, then invalidate it locally.
  const uint32_t key2 = bind_window(s, mw, 2);
  ibv_send_wr inv{}, *bad = nullptr;
  inv.wr_id = 3;
  inv.opcode = IBV_WR_LOCAL_INV;
  inv.send_flags = IBV_SEND_SIGNALED;
  inv.invalidate_rkey = key2;
  if (ibv_post_send(s.qp, &inv, &bad)) die("post LOCAL_INV");
  expect(poll_one(s.cq), IBV_WC_LOCAL_INV, IBV_WC_SUCCESS, "LOCAL_INV");
  put(dir + "/server.key2", std::to_string(key2));
  get(dir + "/client.done");
  // The client's WRITE through the dead key failed our R_Key check: this
  // responder's QP went to ERR and raises the affiliated event IBTA 11.6.3.1
  // names for it, a local access violation (IBV_EVENT_QP_ACCESS_ERR).
  // (Checked on softverbs only: rxe_test.sh runs this peer on rxe too.)
  if (!rxe) wait_access_error(s);
  close_side(s, mw);
  std::printf("mw server: BIND_MW, SEND_WITH_INV of key 0x%x, LOCAL_INV of key 0x%x: ok\n", key1, key2);
  return 0;
}

int client(const std::string& dir) {
  Side s = open_side();
  put(dir + "/client.qp", describe(s));
  connect(s, get(dir + "/server.qp"));
  std::string k = get(dir + "/server.key1");
  char* end = nullptr;
  const uint32_t key1 = uint32_t(std::strtoul(k.c_str(), &end, 10));
  const uint64_t va = std::strtoull(end, nullptr, 10);
  for (size_t i = 0; i < kWinLen; ++i) s.buf[i] = uint8_t(i * 3 + 1);
  ibv_sge sge{uint64_t(uintptr_t(s.buf)), uint32_t(kWinLen), s.mr->lkey};
  ibv_send_wr wr{}, *bad = nullptr;
  wr.wr_id = 1;
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.wr.rdma.remote_addr = va;
  wr.wr.rdma.rkey = key1;
  if (ibv_post_send(s.qp, &wr, &bad)) die("post WRITE");
  expect(poll_one(s.cq), IBV_WC_RDMA_WRITE, IBV_WC_SUCCESS, "WRITE through the window");
  ibv_sge back{uint64_t(uintptr_t(s.buf + 1024)), uint32_t(kWinLen), s.mr->lkey};
  wr.wr_id = 2;
  wr.opcode = IBV_WR_RDMA_READ;
  wr.sg_list = &back;
  if (ibv_post_send(s.qp, &wr, &bad)) die("post READ");
  expect(poll_one(s.cq), IBV_WC_RDMA_READ, IBV_WC_SUCCESS, "READ through the window");
  if (std::memcmp(s.buf, s.buf + 1024, kWinLen) != 0) die("READ back differs from what was written");
  ibv_sge small{uint64_t(uintptr_t(s.buf)), 8, s.mr->lkey};
  wr.wr_id = 3;
  wr.opcode = IBV_WR_SEND_WITH_INV;
  wr.sg_list = &small;
  wr.invalidate_rkey = key1;
  if (ibv_post_send(s.qp, &wr, &bad)) die("post SEND_WITH_INV");
  expect(poll_one(s.cq), IBV_WC_SEND, IBV_WC_SUCCESS, "SEND with Invalidate");
  const uint32_t key2 = uint32_t(std::strtoul(get(dir + "/server.key2").c_str(), nullptr, 10));
  wr.wr_id = 4;
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.sg_list = &sge;
  wr.wr.rdma.rkey = key2;
  if (ibv_post_send(s.qp, &wr, &bad)) die("post WRITE with the invalidated key");
  ibv_wc wc = poll_one(s.cq);
  if (wc.status != IBV_WC_REM_ACCESS_ERR)
    die(std::string("WRITE through an invalidated window: ") + ibv_wc_status_str(wc.status) +
        ", expected remote access error");
  put(dir + "/client.done", "1");
  close_side(s);
  std::printf("mw client: WRITE/READ through the window, SEND_WITH_INV, refused after LOCAL_INV: ok\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s server|client DIR\n", argv[0]);
    return 2;
  }
  return std::string(argv[1]) == "server" ? server(argv[2]) : client(argv[2]);
}
