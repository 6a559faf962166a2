// engine_sim.h: test support for the RoCE engine: an in-memory Memory with
// byte-exact regions, a CQ that records, a virtual clock, and a simulated
// link between two Qps with a FaultInjector (drop, duplicate, reorder).
// Used by the engine tests; meant for the integrator's tests too.
//
// Contract: single-threaded; a Sim owns its nodes, Qps and packets in flight.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <queue>
#include <vector>

#include "roce/engine.h"
#include "roce/fault.h"

namespace sv::roce::testsim {

// Registered memory: regions keyed by key (lkey == rkey here), byte-exact bounds.
struct Region {
  uint64_t base = 0;
  std::vector<uint8_t> bytes;
  uint32_t access = 0;
};
class TestMemory : public Memory {
 public:
  uint32_t add(uint64_t base, size_t len, uint32_t access) {
    uint32_t key = next_key_++;
    regions_[key] = Region{base, std::vector<uint8_t>(len), access};
    return key;
  }
  std::vector<uint8_t>& bytes(uint32_t key) { return regions_.at(key).bytes; }
  uint64_t base(uint32_t key) { return regions_.at(key).base; }
  uint8_t* at(uint32_t key, uint64_t va, uint64_t len, uint32_t need) {
    auto it = regions_.find(key);
    if (it == regions_.end()) return nullptr;
    Region& r = it->second;
    if ((r.access & need) != need || va < r.base || va + len > r.base + r.bytes.size()) return nullptr;
    return r.bytes.data() + (va - r.base);
  }
  bool local_read(uint32_t lkey, uint64_t addr, std::span<uint8_t> out) override {
    uint8_t* p = at(lkey, addr, out.size(), 0);
    if (p) std::memcpy(out.data(), p, out.size());
    return p;
  }
  bool local_write(uint32_t lkey, uint64_t addr, std::span<const uint8_t> in) override {
    uint8_t* p = at(lkey, addr, in.size(), kLocalWrite);
    if (p) std::memcpy(p, in.data(), in.size());
    return p;
  }
  bool remote_check(uint32_t rkey, uint64_t va, uint64_t len, uint32_t access) override {
    return at(rkey, va, len, access) != nullptr;
  }
  bool remote_write(uint32_t rkey, uint64_t va, std::span<const uint8_t> in) override {
    uint8_t* p = at(rkey, va, in.size(), kRemoteWrite);
    if (p) std::memcpy(p, in.data(), in.size());
    writes++;
    return p;
  }
  // Zero-copy sends read the regions where they lie (off: every payload is
  // copied, as for memory the process cannot reach directly).
  const uint8_t* local_view(uint32_t lkey, uint64_t addr, size_t len) override {
    if (!views) return nullptr;
    views_given++;
    return at(lkey, addr, len, 0);
  }
  const uint8_t* remote_view(uint32_t rkey, uint64_t va, size_t len) override {
    if (!views) return nullptr;
    views_given++;
    return at(rkey, va, len, kRemoteRead);
  }
  bool views = true;
  uint64_t views_given = 0;
  bool remote_read(uint32_t rkey, uint64_t va, std::span<uint8_t> out) override {
    uint8_t* p = at(rkey, va, out.size(), kRemoteRead);
    if (p) std::memcpy(out.data(), p, out.size());
    return p;
  }
  bool remote_atomic(uint32_t rkey, uint64_t va, bool cas, uint64_t compare_add, uint64_t swap,
                     uint64_t* orig) override {
    uint8_t* p = at(rkey, va, 8, kRemoteAtomic);
    if (!p) return false;
    uint64_t v;
    std::memcpy(&v, p, 8);
    *orig = v;
    if (cas) {
      if (v == compare_add) v = swap;
    } else {
      v += compare_add;
    }
    std::memcpy(p, &v, 8);
    atomics++;
    return true;
  }
  bool remote_atomic_write(uint32_t rkey, uint64_t va, const uint8_t (&value)[8]) override {
    uint8_t* p = at(rkey, va, 8, kRemoteWrite);
    if (!p) return false;
    std::memcpy(p, value, 8);
    atomic_writes++;
    return true;
  }
  // A FLUSH is counted, with what it covered (the region's whole range for
  // selectivity MR).
  core::Check remote_flush(uint32_t rkey, uint64_t va, uint64_t len, uint32_t need, uint8_t placement,
                           uint8_t level) override {
    auto it = regions_.find(rkey);
    if (it == regions_.end()) return core::Check::kRemoteKey;
    if (level == abi::kFlushMr) va = it->second.base, len = it->second.bytes.size();
    if (!at(rkey, va, len, need)) return core::Check::kRemoteKey;
    flushes.push_back({va, len, placement});
    return core::Check::kOk;
  }
  struct Flush {
    uint64_t va, len;
    uint8_t placement;
  };
  std::vector<Flush> flushes;
  uint64_t atomic_writes = 0;
  bool invalidate(uint32_t rkey) override { return regions_.erase(rkey) == 1; }
  // LOCAL_INV removes the region; BIND_MW adds a region of bind.length bytes
  // at bind.addr under key bind.rkey, with bind.access.
  WcStatus execute_local(const SendWr& w) override {
    local_ops.push_back(w.wr_id);
    if (w.opcode == WrOpcode::kLocalInv) return invalidate(w.invalidate_rkey) ? WcStatus::kSuccess : WcStatus::kMwBindErr;
    if (w.opcode != WrOpcode::kBindMw || regions_.count(w.bind.rkey)) return WcStatus::kMwBindErr;
    regions_[w.bind.rkey] = Region{w.bind.addr, std::vector<uint8_t>(w.bind.length), w.bind.access};
    return WcStatus::kSuccess;
  }
  uint64_t writes = 0, atomics = 0;
  std::vector<uint64_t> local_ops;  // wr_ids of the local operations, in the order carried out

 private:
  std::map<uint32_t, Region> regions_;
  uint32_t next_key_ = 0x100;
};

struct Cq : CompletionSink {
  std::vector<Completion> all;
  void complete(const Completion& c) override { all.push_back(c); }
};

struct SimClock : Clock {
  uint64_t now = 0;
  uint64_t now_ns() const override { return now; }
};

// A link between node 0 and node 1 (ah = node index): 2 us one way, plus
// whatever the fault injector adds; packets delivered in time order.
class Sim {
 public:
  struct Node;
  struct Sink : PacketSink {
    Sim* sim;
    int from;
    void send(uint64_t ah, std::span<const uint8_t> pkt) override { sim->transmit(from, int(ah), pkt); }
  };
  struct Node {
    TestMemory mem;
    Cq cq;
    Sink sink;
    std::unique_ptr<EngineQp> qp;
    std::function<void(std::vector<uint8_t>&)> tap;  // sees (and may change) each arriving packet
  };
  Sim(QpType type, FaultConfig f, uint32_t pmtu = 1024, uint32_t psn0 = 0, uint32_t psn1 = 0) : fault_(f) {
    for (int i = 0; i < 2; i++) {
      nodes[i].sink.sim = this;
      nodes[i].sink.from = i;
    }
    for (int i = 0; i < 2; i++) {
      cfg[i].type = type;
      cfg[i].qpn = 0x11 + uint32_t(i);
      cfg[i].dest_qpn = 0x11 + uint32_t(1 - i);
      cfg[i].dest_ah = uint64_t(1 - i);
      cfg[i].sq_psn = i == 0 ? psn0 : psn1;
      cfg[i].rq_psn = i == 0 ? psn1 : psn0;
      cfg[i].pmtu = pmtu;
      cfg[i].timeout = 5;  // 131 us
      cfg[i].retry_cnt = 7;
      cfg[i].rnr_retry = 7;
      cfg[i].min_rnr_timer = 1;  // 10 us
      cfg[i].qkey = 0x1234;
      cfg[i].access = kRemoteWrite | kRemoteRead | kRemoteAtomic;
    }
  }
  void start() {
    for (int i = 0; i < 2; i++) nodes[i].qp = std::make_unique<EngineQp>(cfg[i], nodes[i].sink, nodes[i].cq, nodes[i].mem, clock);
  }
  void transmit(int from, int to, std::span<const uint8_t> pkt) {
    sent++;
    if (to < 0 || to > 1) return;
    FaultDecision d = faulty ? fault_.decide() : FaultDecision{};
    for (int c = 0; c < d.copies; c++) {
      q_.push(Event{clock.now + 2000 + d.delay_ns[c], seq_++, to, from, std::vector<uint8_t>(pkt.begin(), pkt.end())});
    }
  }
  // A packet from a host outside the link (`from` >= 2: a third address)
  // arrives at node `to` after the link's delay.
  void inject(int to, int from, std::vector<uint8_t> pkt) {
    q_.push(Event{clock.now + 2000, seq_++, to, from, std::move(pkt)});
  }
  // Runs until `done` or nothing is left to do or `limit` of virtual time.
  bool run(const std::function<bool()>& done, uint64_t limit = 60'000'000'000ull) {
    for (;;) {
      for (auto& n : nodes) n.qp->progress();
      if (done()) return true;
      uint64_t t = UINT64_MAX;
      if (!q_.empty()) t = q_.top().at;
      for (auto& n : nodes) t = std::min(t, n.qp->next_deadline());
      if (t == UINT64_MAX || t > limit) return done();
      clock.now = std::max(clock.now, t);
      // Deliver every packet due now, then let each QP coalesce its ACKs.
      while (!q_.empty() && q_.top().at <= clock.now) {
        Event e = q_.top();
        q_.pop();
        if (nodes[e.to].tap) nodes[e.to].tap(e.bytes);
        if (getenv("ROCE_TRACE") && e.bytes.size() >= 12) {
          Packet p;
          parse_packet(e.bytes, false, &p);
          std::printf("%llu %d->%d %s psn %u%s syn %02x len %zu\n", (unsigned long long)clock.now, e.from, e.to,
                      p.info().name ? p.info().name : "?", p.bth.psn, p.bth.ack_req ? " A" : "",
                      p.info().has(kHasAeth) ? p.aeth.syndrome : 0, p.payload.size());
        }
        if (!e.bytes.empty()) nodes[e.to].qp->receive(e.bytes, uint64_t(e.from));
      }
    }
  }
  Node nodes[2];
  QpConfig cfg[2];
  SimClock clock;
  bool faulty = true;
  uint64_t sent = 0;

 private:
  struct Event {
    uint64_t at, seq;
    int to, from;
    std::vector<uint8_t> bytes;
    bool operator>(const Event& o) const { return at != o.at ? at > o.at : seq > o.seq; }
  };
  std::priority_queue<Event, std::vector<Event>, std::greater<Event>> q_;
  uint64_t seq_ = 0;
  FaultInjector fault_;
};

inline SendWr wr(uint64_t id, WrOpcode op, uint32_t lkey, uint64_t addr, uint32_t len) {
  SendWr w;
  w.wr_id = id;
  w.opcode = op;
  w.sg.push_back(Sge{addr, len, lkey});
  return w;
}
inline RecvWr rwr(uint64_t id, uint32_t lkey, uint64_t addr, uint32_t len) {
  RecvWr r;
  r.wr_id = id;
  r.sg.push_back(Sge{addr, len, lkey});
  return r;
}
}  // namespace sv::roce::testsim
