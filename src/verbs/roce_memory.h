// roce_memory.h: this process's registered memory as the RoCE engine
// reaches it (roce::Memory): every key from the wire checked against the
// MR table, bytes reached directly or through a backing's window, the
// responder's stores and atomics through the responder core.
#pragma once

#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <utility>
#include <vector>

#include "common/access.h"
#include "common/responder_core.h"
#include "roce/engine.h"
#include "verbs/odp.h"
#include "verbs/provider.h"

namespace sv::verbs {

using roce::SendWr;
using roce::WcStatus;
using roce::WrOpcode;

// The registered memory of one PD in this process, as the engine needs it:
// every key checked against the MR table (IBTA 10.6.7), since what arrives
// from the wire is untrusted. The PD is the QP's, or for an XRC target the
// SRQ's a request names (IBTA annex A14); 0 grants nothing.
class OwnMemory : public roce::Memory {
 public:
  OwnMemory(ProcessQp& q, uint32_t pd) : q_(q), pd_(pd) {}

  // The MR table's entry for `key` if it grants `need` over [addr, addr+len)
  // (common/access.h). The engine checked the QP's remote access flags.
  const MrEntry* granted(uint32_t key, uint64_t addr, uint64_t len, uint32_t need, bool remote) {
    const MrEntry* e = q_.ctx->st->mr(key);
    if (pd_ == 0) return nullptr;
    const access::User who{pd_, q_.qpn, access::kQpAccessChecked};
    return access::permits(e, remote ? access::Use::kRemote : access::Use::kLocal, who, need, addr, len) ? e : nullptr;
  }

  // Where `addr` of `e` lies if it is mapped in this process for as long as
  // the registration lasts (our own memory, or a view of a local backing);
  // nullptr if it has to be reached through a window.
  uint8_t* direct(const MrEntry& e, uint64_t addr) {
    ContextState& cs = *q_.ctx->st;
    const uint64_t off = access::file_offset(e, addr);
    if (e.backing == cs.backing) return reinterpret_cast<uint8_t*>(off);  // our own memory: file offset == address
    if (e.owner_pid == self_pid()) {
      std::lock_guard<std::mutex> g(cs.mu);
      if (auto v = cs.local_views.find(e.backing); v != cs.local_views.end())
        return v->second.first + (off - v->second.second);
    }
    return nullptr;
  }

  // `fn` gets the bytes [addr, addr+len) if `key` grants `need` over them.
  bool access(uint32_t key, uint64_t addr, uint64_t len, uint32_t need, bool remote,
              const std::function<void(uint8_t*)>& fn) {
    if (len == 0) {
      // A zero-length access needs no key (IBTA 9.7.4.1.5 for remote ones)
      // and moves no byte: `fn` is not called (it would get no address).
      return true;
    }
    const MrEntry* e = granted(key, addr, len, need, remote);
    if (!e) return false;
    if (uint8_t* p = direct(*e, addr)) {
      fn(p);
      return true;
    }
    if (e->backing == shm::kOdpBacking) {  // no pointer to it: the caller copies (odp_)
      odp_ = {true, odp_owner(*e), access::file_offset(*e, addr)};
      return false;
    }
    std::shared_ptr<Window> w = window_for(*q_.ctx->st, *e, key);
    if (!w) return false;
    fn(w->at(access::file_offset(*e, addr)));
    return true;
  }

  // On-demand-paging memory (docs/MEMORY.md): access() granted the key but
  // has no pointer; the bytes are copied through the registrant's pinned
  // address space (verbs/odp.h), a hole failing as the key would. Set only by access(),
  // taken by its caller at once.
  struct OdpTarget {
    bool set = false;
    OdpOwner owner{};
    uint64_t at = 0;
  };
  OdpTarget odp_;
  OdpTarget take_odp() { return std::exchange(odp_, OdpTarget{}); }

  const uint8_t* local_view(uint32_t lkey, uint64_t addr, size_t len) override {
    if (lkey == 0 || len == 0) return nullptr;  // inline data is copied from its slot
    const MrEntry* e = granted(lkey, addr, len, 0, false);
    return e ? direct(*e, addr) : nullptr;
  }
  const uint8_t* remote_view(uint32_t rkey, uint64_t va, size_t len) override {
    if (len == 0) return nullptr;
    const MrEntry* e = granted(rkey, va, len, IBV_ACCESS_REMOTE_READ, true);
    return e ? direct(*e, va) : nullptr;
  }

  // Inline sends (IBV_SEND_INLINE) have no key: their bytes are copied at
  // post time into staging slots, named by key 0 (never a valid key: slot 0
  // of the MR table is unused).
  std::vector<uint8_t> inline_slab;

  bool local_read(uint32_t lkey, uint64_t addr, std::span<uint8_t> out) override {
    if (lkey == 0 && !out.empty()) {
      auto* base = inline_slab.data();
      auto* p = reinterpret_cast<uint8_t*>(addr);
      if (p < base || p + out.size() > base + inline_slab.size()) return false;
      std::memcpy(out.data(), p, out.size());
      return true;
    }
    if (access(lkey, addr, out.size(), 0, false, [&](uint8_t* p) { std::memcpy(out.data(), p, out.size()); }))
      return true;
    const OdpTarget o = take_odp();
    return o.set && odp_read(o.owner, o.at, out.data(), out.size());
  }
  bool local_write(uint32_t lkey, uint64_t addr, std::span<const uint8_t> in) override {
    if (access(lkey, addr, in.size(), IBV_ACCESS_LOCAL_WRITE, false,
               [&](uint8_t* p) { std::memcpy(p, in.data(), in.size()); }))
      return true;
    const OdpTarget o = take_odp();
    return o.set && odp_write(o.owner, o.at, in.data(), in.size());
  }
  bool remote_check(uint32_t rkey, uint64_t va, uint64_t len, uint32_t need) override {
    return access(rkey, va, len, need, true, [](uint8_t*) {}) || take_odp().set;
  }
  bool remote_write(uint32_t rkey, uint64_t va, std::span<const uint8_t> in) override {
    // The last byte last, so a poller of a buffer's final byte (perftest's
    // latency tests) sees the message whole (core::store_tail_last).
    if (access(rkey, va, in.size(), IBV_ACCESS_REMOTE_WRITE, true,
               [&](uint8_t* p) { core::store_tail_last(p, in.data(), in.size()); }))
      return true;
    const OdpTarget o = take_odp();
    return o.set && odp_write(o.owner, o.at, in.data(), in.size());
  }
  bool remote_read(uint32_t rkey, uint64_t va, std::span<uint8_t> out) override {
    if (access(rkey, va, out.size(), IBV_ACCESS_REMOTE_READ, true,
               [&](uint8_t* p) { std::memcpy(out.data(), p, out.size()); }))
      return true;
    const OdpTarget o = take_odp();
    return o.set && odp_read(o.owner, o.at, out.data(), out.size());
  }
  bool remote_atomic(uint32_t rkey, uint64_t va, bool cas, uint64_t compare_add, uint64_t swap,
                     uint64_t* orig) override {
    // On the shared page: atomic with respect to local QPs too (core::apply_atomic).
    if (access(rkey, va, 8, IBV_ACCESS_REMOTE_ATOMIC, true,
               [&](uint8_t* p) { *orig = core::apply_atomic(reinterpret_cast<uint64_t*>(p), cas, compare_add, swap); }))
      return true;
    // ODP memory: under the lock every RDMA atomic on ODP memory takes.
    const OdpTarget o = take_odp();
    return o.set && odp_atomic(*q_.ctx->st, o.owner, o.at, cas, compare_add, swap, orig);
  }

  // IBTA annex A19 from the wire, through the responder core.
  bool remote_atomic_write(uint32_t rkey, uint64_t va, const uint8_t (&value)[8]) override {
    uint64_t v;
    std::memcpy(&v, value, 8);
    if (access(rkey, va, 8, IBV_ACCESS_REMOTE_WRITE, true,
               [&](uint8_t* p) { core::store_atomic_write(reinterpret_cast<uint64_t*>(p), v); }))
      return true;
    // ODP memory: one aligned store under the lock of the ODP atomics.
    const OdpTarget o = take_odp();
    return o.set && odp_atomic_write(*q_.ctx->st, o.owner, o.at, v);
  }
  core::Check remote_flush(uint32_t rkey, uint64_t va, uint64_t len, uint32_t need, uint8_t placement,
                           uint8_t level) override {
    const MrEntry* e = q_.ctx->st->mr(rkey);
    if (!e) return core::Check::kRemoteKey;
    const core::Extent x = core::flush_extent(*e, level, va, len);
    if (!granted(rkey, x.addr, x.len, need, true)) return core::Check::kRemoteKey;
    bool ok = core::apply_flush(nullptr, 0, placement);  // the fence (and all of a zero-length range)
    // ODP memory: process memory, the fence is all (docs/MEMORY.md).
    if (x.len && !access(rkey, x.addr, x.len, need, true,
                         [&](uint8_t* p) { ok = core::apply_flush(p, x.len, placement); }) &&
        !take_odp().set)
      return core::Check::kRemoteKey;
    return ok ? core::Check::kOk : core::Check::kResponderFault;
  }

  // SEND with Invalidate from the wire: the window must be a type 2 window
  // bound to this QP (IBTA 10.6.7.2.6; the daemon checks, as for LOCAL_INV).
  bool invalidate(uint32_t rkey) override { return invalidate_key(rkey) == 0; }

  WcStatus execute_local(const SendWr& wr) override {
    if (wr.opcode == WrOpcode::kLocalInv) return invalidate_key(wr.invalidate_rkey) ? WcStatus::kMwBindErr : WcStatus::kSuccess;
    ibv_mw_bind_info b{};
    b.addr = wr.bind.addr;
    b.length = wr.bind.length;
    b.mw_access_flags = uint32_t(wr.bind.access);
    ibv_mr mr{};
    mr.lkey = wr.bind.mr_lkey;
    b.mr = wr.bind.mr_lkey ? &mr : nullptr;
    return daemon_bind(q_, wr.bind.mw_handle, wr.bind.rkey, b, nullptr) ? WcStatus::kMwBindErr : WcStatus::kSuccess;
  }

 private:
  int invalidate_key(uint32_t key) {
    proto::InvalidateReq req{};
    req.key = key;
    req.qpn = q_.qpn;
    proto::Empty rep{};
    return q_.ctx->st->conn.call<proto::Op::InvalidateKey>(req, rep);
  }

  ProcessQp& q_;
  uint32_t pd_;
};

}  // namespace sv::verbs
