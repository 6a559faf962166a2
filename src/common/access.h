// access.h: the one memory access check (IBTA 10.6.7), for every path that
// touches registered memory on a key's authority: the shared-memory
// requester (src/verbs/requester.cc, acting as the responder in the peer's
// memory too), the RoCE responder's memory (src/verbs/roce_link.cc) and the
// daemon's mediation between users (src/daemon/mediation.cc).
//
// A key is checked against its entry in the MR table (shm::MrEntry, written
// by the daemon alone): the entry exists under that key, belongs to the PD
// of the QP that uses it, is of a kind the use allows (L_Keys name memory
// regions, R_Keys regions and windows; a type 2 window serves only the QP it
// is bound to), grants the access (local write, remote read / write /
// atomic), and holds the whole range. An R_Key also needs the responder
// QP's remote access flags, and an atomic an aligned quadword. Each failure
// falls into one error class, mapped once to the completion status the
// requester sees (IBTA 9.7.5.2, 10.6.7, 11.6.2).
//
// Header-only: the shared-memory post path checks keys inline (an 8 B WRITE
// costs about 160 ns end to end).
#pragma once

#include <infiniband/verbs.h>

#include <atomic>
#include <cstdint>

#include "common/opcode_rules.h"
#include "common/shm_layout.h"

namespace sv::access {

// ---- Error classes -----------------------------------------------------

enum class Fault : uint8_t {
  kNone = 0,
  // The requester's own L_Key, PD, bounds or local write right (10.6.7.1).
  kLocalProtection,
  // The local list is longer than a message may be, or the result buffer of
  // an atomic shorter than its 8 bytes (IBTA 9.7.5.2: local length error).
  kLocalLength,
  // An operation this QP cannot carry out (a READ or atomic on UC, an
  // opcode the path does not have): local QP operation error.
  kLocalOperation,
  // The responder refused the R_Key: entry, PD, kind, window binding,
  // rights, bounds or the QP's remote access flags (10.6.7.2; NAK remote
  // access error, 9.7.5.2.4 / 9.7.4.1.5).
  kRemoteAccess,
  // The responder found the request malformed: a misaligned atomic (9.4.5),
  // a message longer than the receive buffer (its local length error), a
  // key it may not invalidate (NAK invalid request, 9.7.5.2.4).
  kRemoteInvalid,
  // The responder failed in its own memory: its receive WQE's L_Keys (its
  // local protection error), or the copy itself (NAK remote operational
  // error, 9.7.5.2.4).
  kRemoteOperation,
};

// The requester's completion status for each class (ibv_wc_status).
constexpr ibv_wc_status status(Fault f) {
  switch (f) {
    case Fault::kNone: return IBV_WC_SUCCESS;
    case Fault::kLocalProtection: return IBV_WC_LOC_PROT_ERR;
    case Fault::kLocalLength: return IBV_WC_LOC_LEN_ERR;
    case Fault::kLocalOperation: return IBV_WC_LOC_QP_OP_ERR;
    case Fault::kRemoteAccess: return IBV_WC_REM_ACCESS_ERR;
    case Fault::kRemoteInvalid: return IBV_WC_REM_INV_REQ_ERR;
    case Fault::kRemoteOperation: return IBV_WC_REM_OP_ERR;
  }
  return IBV_WC_GENERAL_ERR;
}

// Errors the responder detects are its own (an RC responder goes to the
// error state, IBTA 9.9.3.1.2); the requester's are not.
constexpr bool responder_detected(Fault f) {
  return f == Fault::kRemoteAccess || f == Fault::kRemoteInvalid || f == Fault::kRemoteOperation;
}

// The affiliated asynchronous error the responder's QP raises for an error
// it detected (IBTA 11.6.3.1), from what the requester completes with: an
// R_Key, bounds or access violation is a Local Access Violation Work Queue
// Error (IBV_EVENT_QP_ACCESS_ERR), an invalid request (an opcode the QP does
// not take, a message longer than the receive) an Invalid Request Local Work
// Queue Error (IBV_EVENT_QP_REQ_ERR), anything else a Local Work Queue
// Catastrophic Error (IBV_EVENT_QP_FATAL).
constexpr ibv_event_type responder_event(ibv_wc_status requester_status) {
  switch (requester_status) {
    case IBV_WC_REM_ACCESS_ERR: return IBV_EVENT_QP_ACCESS_ERR;
    case IBV_WC_REM_INV_REQ_ERR: return IBV_EVENT_QP_REQ_ERR;
    default: return IBV_EVENT_QP_FATAL;
  }
}

// ---- Key lookup ----------------------------------------------------------

// A key's slot in the MR table: its upper 24 bits (0 if none; slot 0 is
// never used, so key 0 is never valid).
constexpr uint32_t slot_of(uint32_t key) {
  const uint32_t slot = key >> 8;
  return slot < shm::kMrTableSize ? slot : 0;
}

// The entry `key` names, or nullptr. `at(slot)` gives the table's entry of
// a slot (a mapped array in the library, the daemon's device tables).
template <class At>
[[gnu::always_inline]] inline const shm::MrEntry* lookup(uint32_t key, const At& at) {
  const uint32_t slot = slot_of(key);
  if (slot == 0) return nullptr;
  const shm::MrEntry& e = at(slot);
  return e.key.load(std::memory_order_acquire) == key ? &e : nullptr;
}

// ---- The checks ------------------------------------------------------------

// How a key is used (IBTA 10.6.3): an L_Key names a memory region and is
// used by that region's owner (its own SGEs, or its receive WQEs when a
// message lands); an R_Key names a region or a window and is used by a
// remote requester.
enum class Use : uint8_t { kLocal, kRemote };

// Who uses the key: the PD and QP number of the QP the access goes through
// (the responder's QP for remote and receive accesses), and that QP's remote
// access flags (qp_access_flags) for R_Keys.
struct User {
  uint32_t pd;
  uint32_t qpn;
  uint32_t qp_access;
};

// qp_access for a caller that has checked the QP's flags itself (the RoCE
// engine's responder does, roce/responder.cc).
constexpr uint32_t kQpAccessChecked = ~0u;

// [addr, addr + len) lies within the entry's [iova, iova + length), without
// computing an end that could wrap.
constexpr bool in_bounds(const shm::MrEntry& e, uint64_t addr, uint64_t len) {
  return addr >= e.iova && addr - e.iova <= e.length && e.length - (addr - e.iova) >= len;
}

// The offset of `addr` in the entry's backing file (after in_bounds).
constexpr uint64_t file_offset(const shm::MrEntry& e, uint64_t addr) { return e.file_offset + (addr - e.iova); }

// Does the entry (the key's, from lookup; may be null) grant `need`
// (IBV_ACCESS_*) over [addr, addr + len) to `who` using it as `use`?
// Zero-length accesses are the callers' (they need no key, 9.7.4.1.5).
[[gnu::always_inline]] inline bool permits(const shm::MrEntry* e, Use use, const User& who, uint32_t need, uint64_t addr, uint64_t len) {
  if (!e || e->pd != who.pd) return false;
  if (use == Use::kLocal) {
    if (e->kind != shm::kKindMr) return false;  // L_Keys name regions only (10.6.3.1)
  } else {
    if ((who.qp_access & need) != need) return false;  // the QP's remote access flags (10.6.7.2)
    // A type 2 window serves only the QP it is bound to (10.6.7.2.5).
    if (e->kind == shm::kKindMw2 && e->bound_qpn != who.qpn) return false;
  }
  if ((e->access & need) != need) return false;
  return in_bounds(*e, addr, len);
}

// The whole check of one key: lookup, then permits(). The entry if granted.
template <class At>
inline const shm::MrEntry* check(const At& at, uint32_t key, Use use, const User& who, uint32_t need, uint64_t addr,
                                 uint64_t len) {
  const shm::MrEntry* e = lookup(key, at);
  return permits(e, use, who, need, addr, len) ? e : nullptr;
}

// The fault of a failed check: the requester's own L_Key is a local
// protection error; a key the responder checks, a remote access error. (A
// responder's receive L_Key: core::verdict, common/responder_core.h.)
constexpr Fault fault_of(Use use) { return use == Use::kLocal ? Fault::kLocalProtection : Fault::kRemoteAccess; }

// ---- Operations ------------------------------------------------------------
// (What each opcode is and needs: common/opcode_rules.h.)

constexpr bool is_atomic(uint32_t opcode) { return rules::rule_of(opcode).kind == rules::WrKind::kAtomic; }

// The local SGEs are written (the destination of a READ, the result of an
// atomic), so their L_Keys need local write.
constexpr bool writes_local(uint32_t opcode) { return rules::writes_local(opcode); }

// What an operation's R_Key must grant (0: it carries none).
constexpr uint32_t remote_need(uint32_t opcode) { return rules::rule_of(opcode).remote_need; }

// Atomics act on one 8-byte quadword (IBTA 9.4.5).
constexpr uint64_t kAtomicBytes = 8;

}  // namespace sv::access
