// lanes_wire_peer: several RC QPs of one process over RoCEv2 between two
// hosts of the test bed, every byte and every completion checked
// (tests/roce/wire_test.sh, case lanes; run with SOFTVERBS_ROCE_THREADS so
// that the QPs are served by several RoCE threads: docs/ROCE.md, "Several
// engine threads"). The sides meet through files of a directory both read.
//
//   lanes_wire_peer server|client DIR QPS MSGS
//
// server: QPS RC QPs on one CQ (as perftest -q does), MSGS receives posted
//         on each; publishes each QP's number and the key of its WRITE
//         region; checks that each QP's receives complete in order
//         (IBTA 9.5: a QP's messages complete in the order sent), each with
//         the length and every byte its sender gave it, and that the
//         RDMA WRITE its sender posted before the first SEND is in memory
//         when that SEND completes (IBTA 10.8.3.1, ordering on one QP).
//         Then prints the names of its threads ("threads: ...").
// client: per QP a 256 KiB RDMA WRITE, then MSGS SENDs of 1 to 16384
//         bytes, posted round robin over the QPs; every completion must be
//         a success.
// Exit 0 and "lanes_wire_peer SIDE: ok" when every check holds.
#include <dirent.h>
#include <infiniband/verbs.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "wire_peer.h"

namespace {

using wire_peer::die;
using wire_peer::get;
using wire_peer::put;

constexpr int kGidIndex = 1;
constexpr size_t kWrite = 256 * 1024;  // each QP's WRITE region
constexpr size_t kMaxMsg = 16384;
constexpr uint32_t kSendDepth = 64;

size_t msg_len(unsigned seq) { return 1 + (size_t(seq) * 7919u) % kMaxMsg; }
uint8_t msg_byte(unsigned qp, unsigned seq, size_t i) { return uint8_t(qp * 131 + seq * 31 + i * 7 + 5); }
uint8_t write_byte(unsigned qp, size_t i) { return uint8_t(qp * 17 + i * 13 + (i >> 9) + 1); }

struct Side {
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  ibv_cq* cq = nullptr;
  std::vector<ibv_qp*> qps;
  uint8_t* buf = nullptr;  // per QP: its WRITE region, then its message slots
  ibv_mr* mr = nullptr;
  ibv_gid gid{};
  size_t per_qp = 0;
};

Side open_side(unsigned nqp, unsigned msgs) {
  Side s;
  s.ctx = wire_peer::open_first(kGidIndex, s.gid);
  s.pd = ibv_alloc_pd(s.ctx);
  s.cq = ibv_create_cq(s.ctx, int(nqp * (msgs + kSendDepth) + 16), nullptr, nullptr, 0);
  s.per_qp = kWrite + size_t(msgs) * kMaxMsg;
  s.buf = static_cast<uint8_t*>(std::aligned_alloc(4096, s.per_qp * nqp));
  if (!s.pd || !s.cq || !s.buf) die("pd/cq/buffer");
  std::memset(s.buf, 0, s.per_qp * nqp);
  s.mr = ibv_reg_mr(s.pd, s.buf, s.per_qp * nqp, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  if (!s.mr) die("ibv_reg_mr");
  for (unsigned i = 0; i < nqp; ++i) {
    ibv_qp_init_attr ia{};
    ia.send_cq = ia.recv_cq = s.cq;
    ia.qp_type = IBV_QPT_RC;
    ia.cap.max_send_wr = kSendDepth;
    ia.cap.max_recv_wr = msgs;
    ia.cap.max_send_sge = ia.cap.max_recv_sge = 1;
    ibv_qp* qp = ibv_create_qp(s.pd, &ia);
    if (!qp) die("ibv_create_qp");
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.port_num = 1;
    a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
    if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
      die("modify to INIT");
    s.qps.push_back(qp);
  }
  return s;
}

// Each QP: "QPN ADDR RKEY", then the GID's 16 bytes.
std::string describe(const Side& s) {
  std::ostringstream o;
  for (size_t i = 0; i < s.qps.size(); ++i)
    o << s.qps[i]->qp_num << ' ' << reinterpret_cast<uintptr_t>(s.buf + i * s.per_qp) << ' ' << s.mr->rkey << ' ';
  for (uint8_t b : s.gid.raw) o << unsigned(b) << ' ';
  return o.str();
}

struct Remote {
  std::vector<uint32_t> qpn;
  std::vector<uint64_t> addr;
  uint32_t rkey = 0;
  ibv_gid gid{};
};

Remote parse(const std::string& line, size_t nqp) {
  Remote r;
  std::istringstream in(line);
  for (size_t i = 0; i < nqp; ++i) {
    uint32_t q = 0;
    uint64_t a = 0;
    in >> q >> a >> r.rkey;
    r.qpn.push_back(q);
    r.addr.push_back(a);
  }
  for (auto& b : r.gid.raw) {
    unsigned v = 0;
    in >> v;
    b = uint8_t(v);
  }
  if (!in) die("bad peer line: " + line);
  return r;
}

void connect(ibv_qp* qp, uint32_t dest, const ibv_gid& g) {
  wire_peer::to_rtr(qp, dest, g, kGidIndex);
  wire_peer::to_rts(qp, 12);
}

// Polls `cq` until `want` completions came (at most 60 s), each handed to `f`.
template <class F>
void reap(ibv_cq* cq, size_t want, F f) {
  ibv_wc wc[32];
  size_t got = 0;
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (got < want) {
    const int n = ibv_poll_cq(cq, int(std::min<size_t>(32, want - got)), wc);
    if (n < 0) die("ibv_poll_cq");
    for (int i = 0; i < n; ++i) f(wc[i]);
    got += size_t(n);
    if (n == 0 && std::chrono::steady_clock::now() > end)
      die("timed out: " + std::to_string(got) + " of " + std::to_string(want) + " completions");
  }
}

void close_side(Side& s) {
  for (ibv_qp* q : s.qps) {
    if (ibv_destroy_qp(q)) die("ibv_destroy_qp");  // prints its wire statistics (SOFTVERBS_ROCE_STATS)
  }
  if (ibv_dereg_mr(s.mr) || ibv_destroy_cq(s.cq) || ibv_dealloc_pd(s.pd) || ibv_close_device(s.ctx)) die("teardown");
  std::free(s.buf);
}

std::string thread_names() {
  std::vector<std::string> names;
  if (DIR* d = ::opendir("/proc/self/task")) {
    while (dirent* e = ::readdir(d)) {
      if (e->d_name[0] == '.') continue;
      std::ifstream f(std::string("/proc/self/task/") + e->d_name + "/comm");
      std::string n;
      if (std::getline(f, n)) names.push_back(n);
    }
    ::closedir(d);
  }
  std::sort(names.begin(), names.end());
  std::string out;
  for (auto& n : names) out += " " + n;
  return out;
}

int server(const std::string& dir, unsigned nqp, unsigned msgs) {
  Side s = open_side(nqp, msgs);
  for (unsigned q = 0; q < nqp; ++q) {
    for (unsigned m = 0; m < msgs; ++m) {
      uint8_t* slot = s.buf + q * s.per_qp + kWrite + size_t(m) * kMaxMsg;
      ibv_sge sge{reinterpret_cast<uintptr_t>(slot), uint32_t(kMaxMsg), s.mr->lkey};
      ibv_recv_wr wr{}, *bad = nullptr;
      wr.wr_id = uint64_t(q) << 32 | m;
      wr.sg_list = &sge;
      wr.num_sge = 1;
      if (ibv_post_recv(s.qps[q], &wr, &bad)) die("ibv_post_recv");
    }
  }
  put(dir + "/server", describe(s));
  const Remote r = parse(get(dir + "/client"), nqp);
  for (unsigned q = 0; q < nqp; ++q) connect(s.qps[q], r.qpn[q], r.gid);
  put(dir + "/server.ready", "1");
  std::vector<unsigned> next(nqp, 0);
  reap(s.cq, size_t(nqp) * msgs, [&](const ibv_wc& wc) {
    if (wc.status != IBV_WC_SUCCESS || wc.opcode != IBV_WC_RECV)
      die(std::string("receive: ") + ibv_wc_status_str(wc.status) + ", opcode " + std::to_string(wc.opcode));
    const unsigned q = unsigned(wc.wr_id >> 32), seq = unsigned(wc.wr_id & 0xffffffff);
    if (q >= nqp || s.qps[q]->qp_num != wc.qp_num) die("a completion of the wrong QP");
    if (seq != next[q]) die("QP " + std::to_string(q) + ": receive " + std::to_string(seq) + " completed, expected " +
                            std::to_string(next[q]) + " (out of order)");
    ++next[q];
    if (wc.byte_len != msg_len(seq)) die("QP " + std::to_string(q) + " message " + std::to_string(seq) + ": length");
    const uint8_t* p = s.buf + q * s.per_qp + kWrite + size_t(seq) * kMaxMsg;
    for (size_t i = 0; i < wc.byte_len; ++i) {
      if (p[i] != msg_byte(q, seq, i))
        die("QP " + std::to_string(q) + " message " + std::to_string(seq) + ": byte " + std::to_string(i));
    }
    if (seq == 0) {
      const uint8_t* w = s.buf + q * s.per_qp;
      for (size_t i = 0; i < kWrite; ++i) {
        if (w[i] != write_byte(q, i)) die("QP " + std::to_string(q) + ": WRITE byte " + std::to_string(i));
      }
    }
  });
  std::printf("threads:%s\n", thread_names().c_str());
  std::fflush(stdout);
  put(dir + "/server.done", "1");
  get(dir + "/client.done");
  close_side(s);
  std::printf("lanes_wire_peer server: ok\n");
  return 0;
}

int client(const std::string& dir, unsigned nqp, unsigned msgs) {
  Side s = open_side(nqp, msgs);
  for (unsigned q = 0; q < nqp; ++q) {
    uint8_t* w = s.buf + q * s.per_qp;
    for (size_t i = 0; i < kWrite; ++i) w[i] = write_byte(q, i);
  }
  put(dir + "/client", describe(s));
  const Remote r = parse(get(dir + "/server"), nqp);
  for (unsigned q = 0; q < nqp; ++q) connect(s.qps[q], r.qpn[q], r.gid);
  get(dir + "/server.ready");
  std::vector<uint32_t> outstanding(nqp, 0);
  size_t total = 0;
  auto check = [&](const ibv_wc& wc) {
    if (wc.status != IBV_WC_SUCCESS) die(std::string("send: ") + ibv_wc_status_str(wc.status));
    --outstanding[wc.wr_id >> 32];
  };
  auto post = [&](unsigned q, ibv_send_wr& wr) {
    while (outstanding[q] >= kSendDepth) reap(s.cq, 1, check);
    ibv_send_wr* bad = nullptr;
    if (ibv_post_send(s.qps[q], &wr, &bad)) die("ibv_post_send");
    ++outstanding[q];
    ++total;
  };
  for (unsigned q = 0; q < nqp; ++q) {
    ibv_sge sge{reinterpret_cast<uintptr_t>(s.buf + q * s.per_qp), uint32_t(kWrite), s.mr->lkey};
    ibv_send_wr wr{};
    wr.wr_id = uint64_t(q) << 32;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_RDMA_WRITE;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = r.addr[q];
    wr.wr.rdma.rkey = r.rkey;
    post(q, wr);
  }
  for (unsigned m = 0; m < msgs; ++m) {
    for (unsigned q = 0; q < nqp; ++q) {
      uint8_t* p = s.buf + q * s.per_qp + kWrite + size_t(m) * kMaxMsg;
      const size_t len = msg_len(m);
      for (size_t i = 0; i < len; ++i) p[i] = msg_byte(q, m, i);
      ibv_sge sge{reinterpret_cast<uintptr_t>(p), uint32_t(len), s.mr->lkey};
      ibv_send_wr wr{};
      wr.wr_id = uint64_t(q) << 32 | (m + 1);
      wr.sg_list = &sge;
      wr.num_sge = 1;
      wr.opcode = IBV_WR_SEND;
      wr.send_flags = IBV_SEND_SIGNALED;
      post(q, wr);
    }
  }
  size_t left = 0;
  for (uint32_t o : outstanding) left += o;
  reap(s.cq, left, check);
  get(dir + "/server.done");
  put(dir + "/client.done", "1");
  close_side(s);
  std::printf("lanes_wire_peer client: ok (%zu work requests)\n", total);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5) die("usage: lanes_wire_peer server|client DIR QPS MSGS");
  const std::string role = argv[1], dir = argv[2];
  const unsigned nqp = unsigned(std::atoi(argv[3])), msgs = unsigned(std::atoi(argv[4]));
  if (nqp < 1 || nqp > 64 || msgs < 1 || msgs > 4096) die("QPS 1-64, MSGS 1-4096");
  if (role == "server") return server(dir, nqp, msgs);
  if (role == "client") return client(dir, nqp, msgs);
  die("usage: lanes_wire_peer server|client DIR QPS MSGS");
}
