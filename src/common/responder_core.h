// responder_core.h: what a responder does with a request, once, for the
// three places that act as one: the initiating process on the shared-memory
// path (verbs/requester*.cc, which writes into its peer's memory itself),
// the daemon between users (daemon/mediation.cc) and the RoCE engine's
// responder (roce/responder.cc, its memory in verbs/roce_link.cc). Each of
// them supplies only how it reaches memory, where its receives come from
// and where completions go, as callbacks templated in; the meaning is here:
//
//  - the checks' outcomes (Check) and the one error policy that maps each
//    to the requester's status, the responder's receive status and the RoCE
//    NAK code (verdict(); the model is Linux rxe's rxe_resp.c: one small
//    check per step, the errors decided in one place);
//  - taking a receive WQE for a message: its length, then the L_Keys of the
//    buffers the message lands in (scatter_receive);
//  - the atomics: the aligned quadword, compare-and-swap and fetch-and-add
//    (check_atomic_target, apply_atomic);
//  - IBTA annex A19's ATOMIC WRITE and FLUSH (check_atomic_write,
//    store_atomic_write; check_flush, flush_extent, apply_flush);
//  - the store of a message's bytes with its last byte last (store_tail_last);
//  - the receive completion (receive_completion).
//
// Header-only: the shared-memory post path inlines all of it.
#pragma once
#include <infiniband/verbs.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>

#include "common/access.h"
#include "common/opcode_rules.h"

namespace sv::core {

// ---- The checks' outcomes and the error policy ---------------------------

// What a responder's check found. Each is one row of the policy below.
enum class Check : uint8_t {
  kOk = 0,
  // The message is longer than the receive WQE's buffers (IBTA 9.7.5.2.4:
  // the responder's local length error).
  kReceiveTooShort,
  // The receive WQE is not one: more SGEs than a WQE has (a ring entry the
  // responder's own process corrupted). Treated as too short.
  kReceiveMalformed,
  // An L_Key of the receive WQE fails its check in the responder's PD
  // with local write (IBTA 10.6.7.1): the responder's local protection error.
  kReceiveBadKey,
  // The R_Key of a WRITE, READ or atomic fails (IBTA 10.6.7.2): entry, PD,
  // kind, window binding, rights, bounds, or the responder QP's remote
  // access flags.
  kRemoteKey,
  // An atomic's remote address is not 8-byte aligned (IBTA 9.4.5).
  kMisalignedAtomic,
  // SEND with Invalidate names a key the responder may not invalidate (not a
  // type 2 window bound to its QP; IBTA 9.4.1.2.1, 10.6.7.2.6).
  kInvalidateRefused,
  // The request itself is malformed: opcode sequence, payload against the
  // path MTU or the RETH's length, a READ longer than 2^31 (IBTA 9.7.4.1).
  kMalformedRequest,
  // The responder's memory failed under a key that was granted (a window
  // that cannot be mapped, a copy that failed).
  kResponderFault,
};

// The AETH NAK codes (IBTA 9.7.5.2.4, table 44 "AETH syndrome": NAK codes).
enum class Nak : uint8_t { kPsnSequence = 0, kInvalidRequest = 1, kRemoteAccess = 2, kRemoteOperational = 3 };

// What a check's outcome means at each end.
struct Verdict {
  access::Fault fault;           // the requester's error class: access::status() is its completion status
  ibv_wc_status receive_status;  // the responder's receive WQE completes so, where it took one
  Nak nak;                       // what a RoCE responder answers (RC)
};

// The one error policy (IBTA 9.7.5.2 NAKs, 9.9.3.1 responder errors,
// 10.6.7 access). A receive that cannot hold the message is the
// responder's local length error and the requester's invalid request; a
// bad receive L_Key the responder's local protection error and the
// requester's remote operational error (9.7.5.2.4: the responder failed in
// its own resources). A refused invalidation completes the receive with a
// remote invalid request error and NAKs invalid request (as access.h's
// kRemoteInvalid says; rxe does the same for its receive).
constexpr Verdict verdict(Check c) {
  using access::Fault;
  switch (c) {
    case Check::kOk: return {Fault::kNone, IBV_WC_SUCCESS, Nak::kPsnSequence};
    case Check::kReceiveTooShort:
    case Check::kReceiveMalformed: return {Fault::kRemoteInvalid, IBV_WC_LOC_LEN_ERR, Nak::kInvalidRequest};
    case Check::kReceiveBadKey: return {Fault::kRemoteOperation, IBV_WC_LOC_PROT_ERR, Nak::kRemoteOperational};
    case Check::kRemoteKey: return {Fault::kRemoteAccess, IBV_WC_REM_ACCESS_ERR, Nak::kRemoteAccess};
    case Check::kMisalignedAtomic:
    case Check::kMalformedRequest: return {Fault::kRemoteInvalid, IBV_WC_REM_INV_REQ_ERR, Nak::kInvalidRequest};
    case Check::kInvalidateRefused: return {Fault::kRemoteInvalid, IBV_WC_REM_INV_REQ_ERR, Nak::kInvalidRequest};
    case Check::kResponderFault: return {Fault::kRemoteOperation, IBV_WC_LOC_PROT_ERR, Nak::kRemoteOperational};
  }
  return {Fault::kRemoteOperation, IBV_WC_GENERAL_ERR, Nak::kRemoteOperational};
}

// The requester's completion status of a check's outcome.
constexpr ibv_wc_status requester_status(Check c) { return access::status(verdict(c).fault); }

// ---- Receives --------------------------------------------------------------

// A message of `len` bytes at offset `off` of the receive whose scatter list
// is sg[0, n) (any SGE type with addr, length and lkey: shm::Sge, the
// engine's roce::Sge). First the length (IBTA 9.7.5.2.4; rxe's
// check_length comes before any copy), then, for each SGE the bytes land
// in and only those (as rxe's copy_data: an SGE the message does not reach
// is not used), put(sge, at, count, msg_at): the L_Key check and the store
// of `count` bytes at `at` of that SGE, message bytes from `msg_at` on.
// put returns false when the L_Key does not grant local write there.
template <class Sge, class Put>
[[gnu::always_inline]] inline Check scatter_receive(const Sge* sg, uint32_t n, uint64_t off, uint64_t len, Put&& put) {
  if (n > shm::kMaxSge) return Check::kReceiveMalformed;
  const uint64_t end = off + len;  // a message and its offsets are below 2^32 bytes: no wrap
  // Most messages fit the first SGE: one check, one put.
  if (n && sg[0].length >= end) return len == 0 || put(sg[0], off, len, uint64_t(0)) ? Check::kOk : Check::kReceiveBadKey;
  // Else the room up to where the message ends, then SGE by SGE.
  uint64_t room = 0;
  for (uint32_t i = 0; i < n && room < end; ++i) room += sg[i].length;
  if (room < end) return Check::kReceiveTooShort;
  uint64_t done = 0;
  for (uint32_t i = 0; i < n && done < len; ++i) {
    if (off >= sg[i].length) {
      off -= sg[i].length;
      continue;
    }
    const uint64_t k = sg[i].length - off < len - done ? sg[i].length - off : len - done;
    if (!put(sg[i], off, k, done)) return Check::kReceiveBadKey;
    done += k;
    off = 0;
  }
  return Check::kOk;
}

// The responder's receive completion (ibv_poll_cq(3)) of a message of the
// requester's `opcode` (an ibv_wr_opcode): its opcode from the rules
// (IBV_WC_RECV_RDMA_WITH_IMM for WRITE with immediate), the immediate or
// the invalidated key with their flags. A completion in error carries only
// wr_id, status and qp_num (ibv_poll_cq(3): the other fields are not valid
// then), and the source QP.
[[gnu::always_inline]] inline ibv_wc receive_completion(uint64_t wr_id, ibv_wc_status status, uint32_t opcode,
                                                        uint32_t byte_len, uint32_t qp_num, uint32_t src_qp,
                                                        uint32_t imm_data, uint32_t invalidated_rkey) {
  const rules::OpcodeRule& r = rules::rule_of(opcode);
  ibv_wc wc{};
  wc.wr_id = wr_id;
  wc.status = status;
  wc.opcode = r.recv_wc;
  wc.qp_num = qp_num;
  wc.src_qp = src_qp;
  if (status != IBV_WC_SUCCESS) return wc;
  wc.byte_len = byte_len;
  if (r.flags & rules::kWrImm) {
    wc.wc_flags = IBV_WC_WITH_IMM;
    wc.imm_data = imm_data;
  } else if (r.flags & rules::kWrInvalidate) {
    wc.wc_flags = IBV_WC_WITH_INV;
    wc.invalidated_rkey = invalidated_rkey;
  }
  return wc;
}

// ---- Atomics (IBTA 9.4.5) --------------------------------------------------

// An atomic acts on one naturally aligned quadword.
constexpr Check check_atomic_target(uint64_t remote_addr) {
  return (remote_addr & (access::kAtomicBytes - 1)) ? Check::kMisalignedAtomic : Check::kOk;
}

// The checks of an atomic request before its R_Key, as the paths that see
// the whole work request make them: the operation is one of the two
// atomics (anything else, masked atomics included, is not one this device
// has: a local QP operation error), its local result buffer holds 8 bytes
// (local length error), and its remote address is aligned (the responder's
// check above).
constexpr access::Fault check_atomic(uint32_t opcode, uint64_t result_len, uint64_t remote_addr) {
  if (!access::is_atomic(opcode)) return access::Fault::kLocalOperation;
  if (result_len < access::kAtomicBytes) return access::Fault::kLocalLength;
  return verdict(check_atomic_target(remote_addr)).fault;
}

// Compare-and-swap (`compare_swap`: the word becomes `swap` if it equals
// `compare_add`) or fetch-and-add (the word grows by `compare_add`), on the
// responder's aligned word, atomic with respect to every CPU access to the
// same memory (the page is shared with its owner). The original value.
inline uint64_t apply_atomic(uint64_t* word, bool compare_swap, uint64_t compare_add, uint64_t swap) {
  if (compare_swap) {
    uint64_t old = compare_add;
    __atomic_compare_exchange_n(word, &old, swap, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    return old;
  }
  return __atomic_fetch_add(word, compare_add, __ATOMIC_SEQ_CST);
}

// ---- ATOMIC WRITE and FLUSH (IBTA annex A19) -------------------------------

// ATOMIC WRITE carries exactly 8 bytes (A19.4.4) to an aligned quadword
// (as the atomics; rxe refuses a misaligned one as a misaligned atomic).
constexpr Check check_atomic_write(uint64_t len, uint64_t remote_addr) {
  if (len != access::kAtomicBytes) return Check::kMalformedRequest;
  return check_atomic_target(remote_addr);
}

// The 8 bytes land as one single-copy atomic store, after every earlier
// store of the QP (a release store; rxe's smp_store_release).
inline void store_atomic_write(uint64_t* word, uint64_t value) { __atomic_store_n(word, value, __ATOMIC_RELEASE); }

// A FLUSH's FETH (A19.4.3): a placement type made of the two known bits,
// and a selectivity level of range (0) or memory region (1).
constexpr Check check_flush(uint8_t placement, uint8_t level) {
  if (placement & ~(abi::kFlushGlobal | abi::kFlushPersistent)) return Check::kMalformedRequest;
  if (level > abi::kFlushMr) return Check::kMalformedRequest;
  return Check::kOk;
}

// What a FLUSH acts on: the range it names, or (selectivity MR) the whole
// region its R_Key names, whatever address and length it carries (rxe
// checks no range then).
struct Extent {
  uint64_t addr, len;
};
constexpr Extent flush_extent(const shm::MrEntry& e, uint8_t level, uint64_t addr, uint64_t len) {
  return level == abi::kFlushMr ? Extent{e.iova, e.length} : Extent{addr, len};
}

// A full fence (FLUSH's global visibility). ThreadSanitizer does not model
// fences and GCC refuses them under -fsanitize=thread: there it is a
// compiler barrier, as release_fence below.
[[gnu::always_inline]] inline void full_fence() {
#if defined(__SANITIZE_THREAD__)
  __atomic_signal_fence(__ATOMIC_SEQ_CST);
#else
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
#endif
}

// Carries out a FLUSH of [p, p + len) of the responder's mapping. Memory
// here is ordinary coherent memory shared between processes: every store
// an earlier operation made is visible to every CPU once it is done, so
// global visibility is a full fence. Persistence is what the memory's
// backing file offers: msync(MS_SYNC) writes the range back to it, which
// makes a region over a file on a persistent file system durable there; a
// region over anonymous memory (a memfd) has no persistent medium, and
// there the FLUSH ends as a global one (docs/MEMORY.md). False when the
// range could not be written back.
inline bool apply_flush(uint8_t* p, uint64_t len, uint8_t placement) {
  full_fence();
  if (!(placement & abi::kFlushPersistent) || len == 0) return true;
  const uintptr_t page = uintptr_t(::sysconf(_SC_PAGESIZE));
  const uintptr_t start = reinterpret_cast<uintptr_t>(p) & ~(page - 1);
  const uintptr_t end = reinterpret_cast<uintptr_t>(p) + len;
  return ::msync(reinterpret_cast<void*>(start), end - start, MS_SYNC) == 0;
}

// The same FLUSH where the responder reaches the memory through its
// backing file `fd` rather than one mapping of the range (the daemon
// between users): the fence, then fdatasync(2) of the file for persistence.
inline bool apply_flush_file(int fd, uint8_t placement) {
  full_fence();
  return !(placement & abi::kFlushPersistent) || ::fdatasync(fd) == 0;
}

// ---- Storing a message -----------------------------------------------------

// A release fence: the stores before it are visible before any store
// after it (C++ [atomics.fences]). ThreadSanitizer does not model fences
// (GCC refuses them under -fsanitize=thread); there it is a compiler
// barrier, which is what the fence compiles to on x86 (TSO) anyway.
[[gnu::always_inline]] inline void release_fence() {
#if defined(__SANITIZE_THREAD__)
  __atomic_signal_fence(__ATOMIC_RELEASE);
#else
  __atomic_thread_fence(__ATOMIC_RELEASE);
#endif
}

// Copies n bytes with the last byte stored last, after every other byte of
// the copy: a poller of a message's final byte (perftest's latency tests,
// and applications that poll a flag at the end of a buffer) then sees the
// whole message. x86 makes stores visible in program order (Intel SDM vol.
// 3, 9.2.2); the release fence keeps the compiler (and a weaker CPU) from
// moving the final store before the others.
//
// The rule: the final store is the last 8 bytes as one store when they lie
// within one 64-byte cache line (then the store is single-copy atomic, SDM
// vol. 3, 9.1.1: a poller cannot see its last byte before its others), else
// the last byte alone. Storing the last 8 bytes whatever their place (as
// the daemon and the library did) leaves a line-crossing store that may
// become visible in two parts, the final byte's first; storing the last
// min(n, 8) bytes with one memcpy (as the RoCE responder did) lets a copy
// of fewer than 8 bytes store them in any order. The source's final bytes
// are loaded before anything is stored, so overlapping ranges copy right.
// The rule's other case: everything but the last byte, then the last byte.
[[gnu::noinline]] inline void store_last_byte_last(uint8_t* d, const uint8_t* s, uint64_t n) {
  if (n == 0) return;
  const uint8_t last = s[n - 1];
  if (n > 1) std::memmove(d, s, n - 1);
  release_fence();
  d[n - 1] = last;
}

[[gnu::always_inline]] inline void store_tail_last(uint8_t* d, const uint8_t* s, uint64_t n) {
  if (__builtin_expect(n >= 8 && ((reinterpret_cast<uintptr_t>(d) + n - 8) & 63) <= 56, 1)) {
    uint64_t tail;
    std::memcpy(&tail, s + n - 8, 8);
    if (n > 8) std::memmove(d, s, n - 8);
    release_fence();
    std::memcpy(d + n - 8, &tail, 8);  // one (possibly unaligned, not line-crossing) store
    return;
  }
  store_last_byte_last(d, s, n);
}

}  // namespace sv::core
