// flood_bench: what one user's flood of the system daemon costs another user
// (the daemon's fairness between users). Run as root: it starts a private system
// daemon (tests/security/attack.h), a flooder of user nobody that sends
// pipelined mediated 4 MiB RDMA WRITEs on two connections without pause (its
// whole 8 MiB of locked memory), and, in interleaved rounds with the flood
// paused and running, measures in a fresh root process:
//   setup:    ibv_open_device + ibv_alloc_pd + ibv_reg_mr (1 MiB) + teardown,
//             median of 10;
//   8 B lat:  one-way latency of an 8-byte RDMA WRITE ping-pong between two
//             threads' RC QPs (perftest ib_write_lat's pattern), median of
//             2000 round trips / 2.
// Output: a markdown table (per round and medians; ratio flood/idle) on
// stdout, progress on stderr. bench/flood.sh writes it to bench/results/.
//   flood_bench [ROUNDS] [FLOOD_BYTES]
#include <infiniband/verbs.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "../tests/security/attack.h"
#include "common/sys.h"

using namespace svsec;
using sv::proto::Op;

namespace {

uint64_t median(std::vector<uint64_t> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int connect_rc(ibv_context* ctx, ibv_qp* qp, uint32_t dest) {
  if (int e = qp_to_init(qp, IBV_ACCESS_REMOTE_WRITE)) return e;
  return qp_to_rts(ctx, qp, dest);
}

// One-way latency (ns) of 8 B RDMA WRITEs bounced between two threads' QPs:
// each side writes a counter into the other's buffer and waits for the
// other's write of the next value, polling memory (unsignaled writes, a
// signaled one now and then to keep the send queue from filling).
uint64_t pingpong_ns(int iters) {
  ibv_context* c = open_dev();
  if (!c) return 0;
  ibv_pd* pd = ibv_alloc_pd(c);
  alignas(64) static volatile uint64_t buf[2][8];
  static uint64_t src[2][8];
  ibv_mr* mr = ibv_reg_mr(pd, const_cast<uint64_t*>(&buf[0][0]), sizeof(buf),
                          IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  ibv_mr* smr = ibv_reg_mr(pd, src, sizeof(src), IBV_ACCESS_LOCAL_WRITE);
  ibv_cq* cq[2] = {ibv_create_cq(c, 64, nullptr, nullptr, 0), ibv_create_cq(c, 64, nullptr, nullptr, 0)};
  ibv_qp* qp[2];
  for (int i = 0; i < 2; ++i) {
    ibv_qp_init_attr ia{};
    ia.send_cq = ia.recv_cq = cq[i];
    ia.qp_type = IBV_QPT_RC;
    ia.cap.max_send_wr = 64;
    ia.cap.max_recv_wr = 1;
    ia.cap.max_send_sge = ia.cap.max_recv_sge = 1;
    qp[i] = ibv_create_qp(pd, &ia);
  }
  if (!mr || !smr || !qp[0] || !qp[1] || connect_rc(c, qp[0], qp[1]->qp_num) || connect_rc(c, qp[1], qp[0]->qp_num))
    return 0;
  for (auto& b : buf) b[0] = 0;
  std::vector<uint64_t> rtt;
  rtt.reserve(iters);
  auto side = [&](int me) {
    int other = 1 - me;
    for (uint64_t n = 1; n <= uint64_t(iters); ++n) {
      uint64_t t0 = sv::monotonic_ns();
      if (me == 1) {
        while (buf[me][0] < n) {
        }
      }
      src[me][0] = n;
      ibv_sge sge{reinterpret_cast<uintptr_t>(&src[me][0]), 8, smr->lkey};
      ibv_send_wr wr{}, *bad = nullptr;
      wr.opcode = IBV_WR_RDMA_WRITE;
      wr.sg_list = &sge;
      wr.num_sge = 1;
      wr.send_flags = IBV_SEND_INLINE | (n % 32 == 0 ? IBV_SEND_SIGNALED : 0);
      wr.wr.rdma.remote_addr = reinterpret_cast<uintptr_t>(const_cast<uint64_t*>(&buf[other][0]));
      wr.wr.rdma.rkey = mr->rkey;
      if (ibv_post_send(qp[me], &wr, &bad)) return;
      if (n % 32 == 0) {
        ibv_wc wc;
        while (ibv_poll_cq(cq[me], 1, &wc) == 0) {
        }
      }
      if (me == 0) {
        while (buf[me][0] < n) {
        }
        rtt.push_back(sv::monotonic_ns() - t0);
      }
    }
  };
  std::thread t(side, 1);
  side(0);
  t.join();
  for (ibv_qp* q : qp) ibv_destroy_qp(q);
  for (ibv_cq* q : cq) ibv_destroy_cq(q);
  ibv_dereg_mr(smr);
  ibv_dereg_mr(mr);
  ibv_dealloc_pd(pd);
  ibv_close_device(c);
  return median(rtt) / 2;
}

uint64_t setup_ns(int n) {
  static char mem[1 << 20];
  std::vector<uint64_t> ns;
  for (int i = 0; i < n; ++i) {
    uint64_t t0 = sv::monotonic_ns();
    ibv_context* c = open_dev();
    ibv_pd* pd = c ? ibv_alloc_pd(c) : nullptr;
    ibv_mr* mr = pd ? ibv_reg_mr(pd, mem, sizeof mem, IBV_ACCESS_LOCAL_WRITE) : nullptr;
    if (!mr) return 0;
    ibv_dereg_mr(mr);
    ibv_dealloc_pd(pd);
    ibv_close_device(c);
    ns.push_back(sv::monotonic_ns() - t0);
  }
  return median(ns);
}

struct Sample {
  uint64_t setup, lat;
};

// Measures in a fresh root process (a new client, as another user's program is).
Sample measure() {
  Child root(false, [](int sock) {
    alarm(120);
    Sample s{setup_ns(10), pingpong_ns(2000)};
    return send_val(sock, s) ? 0 : 3;
  });
  root.start();
  Sample s{0, 0};
  recv_val(root.sock(), s);
  root.wait();
  return s;
}

// The flooder, in a process of nobody's: mediated copies of flood_bytes
// over two connections to the daemon while told to (1 on sock), paused
// otherwise (0), until told to stop (2); answers each command with the
// number of copies so far.
int flood_as_nobody(SystemDaemon& sysd, uint64_t flood_bytes, int sock) {
  constexpr int kConns = 2;
  std::vector<std::unique_ptr<RawConn>> conns;
  sv::proto::MediateReq req[kConns];
  for (int i = 0; i < kConns; ++i) {
    conns.push_back(std::make_unique<RawConn>(sysd.socket()));
    if (!conns.back()->ok() || !raw_mediated_pair(*conns.back(), flood_bytes, req[i])) return 2;
  }
  std::atomic<int> on{0};
  std::atomic<bool> stop{false};
  std::atomic<long> replies{0}, sent{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kConns; ++i) {
    threads.emplace_back([&, i] {
      sv::proto::MediateReq r = req[i];
      for (uint32_t seq = 1; !stop.load();) {
        // At most 64 in flight per connection: pipelined, not unbounded.
        if (!on.load() || sent.load() - replies.load() > 64 * kConns) {
          usleep(200);
          continue;
        }
        sv::proto::init_header(r, Op::Mediate, seq++);
        if (sv::send_message(conns[i]->fd(), &r, sizeof r, {}) != 0) return;
        sent.fetch_add(1);
      }
    });
    threads.emplace_back([&, i] {
      uint8_t buf[sv::proto::kMaxMessage];
      for (;;) {
        size_t len = 0;
        std::vector<sv::Fd> f;
        if (sv::recv_message(conns[i]->fd(), buf, sizeof buf, &len, f) != 0 || len == 0) return;
        replies.fetch_add(1);
      }
    });
  }
  for (;;) {
    int cmd = 0;
    if (!recv_val(sock, cmd) || cmd == 2) break;
    long before = replies.load();
    on.store(cmd);
    if (cmd == 1)
      while (replies.load() < before + 4) usleep(1000);  // flooding for real
    long copies = replies.load();
    send_val(sock, copies);
  }
  stop.store(true);
  for (auto& c : conns) shutdown(c->fd(), SHUT_RDWR);
  for (auto& t : threads) t.join();
  return 0;
}

// The per-round table and the medians, in Markdown.
void print_table(const std::vector<Sample>& idle, const std::vector<Sample>& flood, const std::vector<long>& copies) {
  const size_t rounds = idle.size();
  auto med = [](const std::vector<Sample>& v, bool lat) {
    std::vector<uint64_t> x;
    for (const Sample& s : v) x.push_back(lat ? s.lat : s.setup);
    return median(x);
  };
  std::printf("| round | setup idle (us) | setup flood (us) | ratio | 8 B lat idle (ns) | 8 B lat flood (ns) | ratio | nobody's 4 MiB copies meanwhile |\n");
  std::printf("| --- | --- | --- | --- | --- | --- | --- | --- |\n");
  for (size_t r = 0; r < rounds; ++r)
    std::printf("| %zu | %.1f | %.1f | %.2f | %llu | %llu | %.2f | %ld |\n", r + 1, idle[r].setup / 1e3,
                flood[r].setup / 1e3, idle[r].setup ? double(flood[r].setup) / double(idle[r].setup) : 0.0,
                (unsigned long long)idle[r].lat, (unsigned long long)flood[r].lat,
                idle[r].lat ? double(flood[r].lat) / double(idle[r].lat) : 0.0, copies[r]);
  uint64_t si = med(idle, false), sf = med(flood, false), li = med(idle, true), lf = med(flood, true);
  std::printf("| **median** | **%.1f** | **%.1f** | **%.2f** | **%llu** | **%llu** | **%.2f** | |\n", si / 1e3, sf / 1e3,
              si ? double(sf) / double(si) : 0.0, (unsigned long long)li, (unsigned long long)lf,
              li ? double(lf) / double(li) : 0.0);
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = argc > 1 ? std::atoi(argv[1]) : 5;
  // The flooder's copy size (default 4 MiB: the copy worker's; 1 MiB and
  // less are copied on the daemon's loop).
  const uint64_t flood_bytes = argc > 2 ? std::strtoull(argv[2], nullptr, 0) : 4 << 20;
  if (geteuid() != 0) {
    std::fprintf(stderr, "flood_bench: run as root (the flooder runs as nobody against a private system daemon)\n");
    return 2;
  }
  SystemDaemon sysd;
  if (!sysd.alive()) return 3;
  // The flooder: floods while told to, pauses otherwise.
  Child nobody(true, [&sysd, flood_bytes](int sock) { return flood_as_nobody(sysd, flood_bytes, sock); });
  nobody.start();
  std::vector<Sample> idle, flood;
  std::vector<long> copies;
  for (int r = 0; r < rounds; ++r) {
    std::fprintf(stderr, "round %d/%d: idle...", r + 1, rounds);
    idle.push_back(measure());
    int cmd = 1;
    long c0 = 0, c1 = 0;
    send_val(nobody.sock(), cmd);
    recv_val(nobody.sock(), c0);
    std::fprintf(stderr, " flood...");
    flood.push_back(measure());
    cmd = 0;
    send_val(nobody.sock(), cmd);
    recv_val(nobody.sock(), c1);
    copies.push_back(c1 - c0);
    std::fprintf(stderr, " done (%ld mediated 4 MiB copies of nobody's during it)\n", c1 - c0);
  }
  int cmd = 2;
  send_val(nobody.sock(), cmd);
  nobody.wait();

  print_table(idle, flood, copies);
  return 0;
}
