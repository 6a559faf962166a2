// roce_demo: one RC connection over RoCEv2/UDP between two hosts of the test
// bed (scripts/testbed.sh), driven by src/roce's engine and UdpEndpoint.
//
//   roce_demo server BIND_ADDR PEER_ADDR [options]
//   roce_demo client BIND_ADDR PEER_ADDR [options]
//   options: --port P (4791) --count N (50) --size BYTES (10000)
//            --loss P --dup P --reorder P --seed S
//
// QPNs, PSNs and keys are fixed (what ibv_rc_pingpong would exchange out of
// band). The client sends N SENDs, N WRITEs, N READs and N fetch-and-adds,
// then a last SEND with immediate 0xd0e; both sides check every byte and
// that each completion came exactly once. Exit 0 on success.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>
#include <string>

#include "roce/engine_sim.h"
#include "roce/udp.h"

using namespace sv::roce;
using testsim::Cq;
using testsim::rwr;
using testsim::TestMemory;
using testsim::wr;

namespace {
constexpr uint32_t kClientQpn = 0x11, kServerQpn = 0x12;
constexpr uint64_t kSrc = 0x10000000, kDst = 0x20000000, kAtom = 0x30000000, kRes = 0x40000000;
uint8_t pattern(int side, uint64_t i) { return uint8_t(i * (side ? 29 : 17) + (i >> 9) + side); }
}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s server|client BIND PEER [--port P --count N --size B --loss P --dup P "
                         "--reorder P --seed S]\n", argv[0]);
    return 2;
  }
  const bool server = std::string(argv[1]) == "server";
  const int side = server ? 1 : 0;
  uint16_t port = kRoceV2Port;
  int count = 50;
  uint32_t size = 10000;
  FaultConfig f;
  for (int i = 4; i + 1 < argc; i += 2) {
    std::string o = argv[i];
    double v = std::atof(argv[i + 1]);
    if (o == "--port") port = uint16_t(v);
    else if (o == "--count") count = int(v);
    else if (o == "--size") size = uint32_t(v);
    else if (o == "--loss") f.drop = v;
    else if (o == "--dup") f.duplicate = v;
    else if (o == "--reorder") f.reorder = v;
    else if (o == "--seed") f.seed = uint64_t(v);
  }
  f.reorder_delay_ns = 200000;
  SteadyClock clock;
  UdpEndpoint ep(clock, f);
  if (int e = ep.bind(argv[2], port)) {
    std::fprintf(stderr, "bind %s:%u: %s\n", argv[2], port, strerror(e));
    return 1;
  }
  const uint64_t peer = ep.add_peer(argv[3], port);
  TestMemory mem;
  const size_t bytes = size_t(count) * size;
  // Keys come out of TestMemory in order, the same on both sides.
  const uint32_t src = mem.add(kSrc, bytes, kLocalWrite | kRemoteRead);
  const uint32_t dst = mem.add(kDst, 2 * bytes + 64, kLocalWrite | kRemoteWrite);
  const uint32_t atom = mem.add(kAtom, 8, kRemoteAtomic);
  const uint32_t res = mem.add(kRes, 8 * size_t(count), kLocalWrite);
  for (size_t i = 0; i < bytes; i++) mem.bytes(src)[i] = pattern(side, i);
  QpConfig c;
  c.qpn = server ? kServerQpn : kClientQpn;
  c.dest_qpn = server ? kClientQpn : kServerQpn;
  c.dest_ah = peer;
  c.sq_psn = server ? 2000 : 1000;
  c.rq_psn = server ? 1000 : 2000;
  c.pmtu = 1024;  // what rxe picks for a 1500-byte netdev
  c.timeout = 12;  // 16.8 ms
  c.access = kRemoteWrite | kRemoteRead | kRemoteAtomic;
  Cq cq;
  EngineQp qp(c, ep, cq, mem, clock);
  ep.attach(&qp);
  const uint64_t deadline = clock.now_ns() + 60'000'000'000ull;
  int failures = 0;
  if (server) {
    // The client's SENDs land in dst[0, bytes), its WRITEs in dst[bytes, 2 bytes).
    for (int i = 0; i < count; i++) qp.post_recv(rwr(i, dst, kDst + uint64_t(i) * size, size));
    qp.post_recv(rwr(9999, dst, kDst + 2 * bytes, 64));
    bool done = ep.run([&] { return cq.all.size() == size_t(count) + 1; }, deadline);
    if (!done) { std::fprintf(stderr, "server: %zu of %d receives\n", cq.all.size(), count + 1); return 1; }
    std::set<uint64_t> ids;
    for (auto& w : cq.all) {
      if (w.status != WcStatus::kSuccess || !ids.insert(w.wr_id).second) failures++;
    }
    if (!cq.all.back().has_imm || cq.all.back().imm != 0xd0e) failures++;
    for (size_t i = 0; i < bytes; i++) {
      if (mem.bytes(dst)[i] != pattern(0, i) || mem.bytes(dst)[bytes + i] != pattern(0, i)) { failures++; break; }
    }
    uint64_t counter;
    std::memcpy(&counter, mem.bytes(atom).data(), 8);
    if (counter != uint64_t(count)) failures++;
    // Stay to acknowledge retransmissions of the last SEND, whose ACK may be lost.
    ep.run([] { return false; }, clock.now_ns() + 500'000'000ull);
  } else {
    for (int i = 0; i < count; i++) {
      qp.post_send(wr(i, WrOpcode::kSend, src, kSrc + uint64_t(i) * size, size));
      SendWr w = wr(1000 + i, WrOpcode::kWrite, src, kSrc + uint64_t(i) * size, size);
      w.remote_addr = kDst + bytes + uint64_t(i) * size;
      w.rkey = dst;
      qp.post_send(w);
      SendWr r = wr(2000 + i, WrOpcode::kRead, dst, kDst + uint64_t(i) * size, size);
      r.remote_addr = kSrc + uint64_t(i) * size;
      r.rkey = src;
      qp.post_send(r);
      SendWr a = wr(3000 + i, WrOpcode::kFetchAdd, res, kRes + 8 * uint64_t(i), 8);
      a.remote_addr = kAtom;
      a.rkey = atom;
      a.compare_add = 1;
      qp.post_send(a);
    }
    SendWr last = wr(4000, WrOpcode::kSendImm, src, kSrc, 16);
    last.imm = 0xd0e;
    qp.post_send(last);
    const size_t want = 4 * size_t(count) + 1;
    bool done = ep.run([&] { return cq.all.size() == want; }, deadline);
    if (!done) { std::fprintf(stderr, "client: %zu of %zu completions\n", cq.all.size(), want); return 1; }
    std::set<uint64_t> ids, origs;
    for (auto& w : cq.all) {
      if (w.status != WcStatus::kSuccess || !ids.insert(w.wr_id).second) {
        std::fprintf(stderr, "client: wr %llu: %s\n", (unsigned long long)w.wr_id, wc_status_name(w.status));
        failures++;
      }
    }
    for (size_t i = 0; i < bytes; i++) {
      if (mem.bytes(dst)[i] != pattern(1, i)) { failures++; break; }  // READ the server's pattern
    }
    for (int i = 0; i < count; i++) {
      uint64_t o;
      std::memcpy(&o, mem.bytes(res).data() + 8 * i, 8);
      origs.insert(o);
    }
    if (origs.size() != size_t(count) || *origs.rbegin() != uint64_t(count - 1)) failures++;  // each add once
  }
  const QpStats& s = qp.stats();
  std::printf("%s: %s; %llu packets sent, %llu received, %llu timeouts, %llu/%llu seq NAKs sent/received, "
              "%llu duplicates, %llu read replays, %llu atomic replays; fault hook dropped %llu; bad ICRC %llu\n",
              argv[1], failures ? "FAILED" : "ok", (unsigned long long)s.packets_sent,
              (unsigned long long)s.packets_received, (unsigned long long)s.retransmit_timeouts,
              (unsigned long long)s.seq_naks_sent, (unsigned long long)s.seq_naks_received,
              (unsigned long long)s.duplicates, (unsigned long long)s.read_replays,
              (unsigned long long)s.atomic_replays, (unsigned long long)ep.stats().fault_dropped,
              (unsigned long long)ep.stats().bad_icrc);
  return failures ? 1 : 0;
}
