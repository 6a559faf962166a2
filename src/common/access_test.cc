// The one access check (common/access.h), table-driven, on an MR table in
// plain memory: no daemon, no sockets.
#include "common/access.h"
#include "common/responder_core.h"

#include <gtest/gtest.h>

#include <array>
#include <cstdint>

namespace sv::access {
namespace {

using shm::MrEntry;

constexpr uint64_t kTop = ~uint64_t(0);
constexpr uint32_t kAll = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE |
                          IBV_ACCESS_REMOTE_ATOMIC;
constexpr uint32_t kPd = 7, kQpn = 0x42;

// Key = slot << 8 | byte.
enum : uint32_t {
  kMr = 0x105,        // slot 1: [0x1000, 0x2000), every right
  kReadOnly = 0x203,  // slot 2: [0x1000, 0x2000), remote read only
  kMw1 = 0x307,       // slot 3: type 1 window [0x1800, 0x1900), remote write
  kMw2 = 0x409,       // slot 4: type 2 window bound to kQpn, remote read and write
  kHigh = 0x50b,      // slot 5: the last 4 KiB of the address space, every right
  kOtherPd = 0x60d,   // slot 6: as kMr, in PD 8
};

class Table {
 public:
  Table() {
    set(kMr, kAll, kPd, 0x1000, 0x1000, shm::kKindMr);
    set(kReadOnly, IBV_ACCESS_REMOTE_READ, kPd, 0x1000, 0x1000, shm::kKindMr);
    set(kMw1, IBV_ACCESS_REMOTE_WRITE, kPd, 0x1800, 0x100, shm::kKindMw1);
    set(kMw2, IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE, kPd, 0x1000, 0x1000, shm::kKindMw2, kQpn);
    set(kHigh, kAll, kPd, kTop - 0xfff, 0x1000, shm::kKindMr);
    set(kOtherPd, kAll, 8, 0x1000, 0x1000, shm::kKindMr);
  }
  const MrEntry& operator()(uint32_t slot) const { return slot < e_.size() ? e_[slot] : blank_; }
  const MrEntry* find(uint32_t key) const { return lookup(key, *this); }

 private:
  void set(uint32_t key, uint32_t access, uint32_t pd, uint64_t iova, uint64_t len, uint32_t kind,
           uint32_t bound = 0) {
    MrEntry& e = e_[key >> 8];
    e.access = access;
    e.pd = pd;
    e.iova = iova;
    e.length = len;
    e.file_offset = 0x10000;
    e.kind = kind;
    e.bound_qpn = bound;
    e.key.store(key);
  }
  std::array<MrEntry, 8> e_{};
  MrEntry blank_{};
};

struct KeyCase {
  const char* name;
  uint32_t key;
  Use use;
  uint32_t pd, qpn, qp_access;
  uint32_t need;
  uint64_t addr, len;
  bool granted;
};

constexpr uint32_t RW = IBV_ACCESS_REMOTE_WRITE, RR = IBV_ACCESS_REMOTE_READ, RA = IBV_ACCESS_REMOTE_ATOMIC,
                   LW = IBV_ACCESS_LOCAL_WRITE;
constexpr Use L = Use::kLocal, R = Use::kRemote;

const KeyCase kKeyCases[] = {
    // Bounds (overflow-safe).
    {"whole region", kMr, L, kPd, 0, 0, 0, 0x1000, 0x1000, true},
    {"up to the end", kMr, L, kPd, 0, 0, 0, 0x1800, 0x800, true},
    {"one past the end", kMr, L, kPd, 0, 0, 0, 0x1800, 0x801, false},
    {"last byte", kMr, L, kPd, 0, 0, 0, 0x1fff, 1, true},
    {"at the end, zero length", kMr, L, kPd, 0, 0, 0, 0x2000, 0, true},
    {"end + 1, zero length", kMr, L, kPd, 0, 0, 0, 0x2001, 0, false},
    {"before the start", kMr, L, kPd, 0, 0, 0, 0xfff, 1, false},
    {"before the start, reaching in", kMr, L, kPd, 0, 0, 0, 0xfff, 0x10, false},
    {"zero length at the start", kMr, L, kPd, 0, 0, 0, 0x1000, 0, true},
    {"length that wraps", kMr, L, kPd, 0, 0, 0, 0x1800, kTop, false},
    {"address far past the end", kMr, L, kPd, 0, 0, 0, kTop, 1, false},
    {"top of the address space", kHigh, L, kPd, 0, 0, 0, kTop - 0xfff, 0x1000, true},
    {"top: last byte", kHigh, L, kPd, 0, 0, 0, kTop, 1, true},
    {"top: one past, wrapping", kHigh, L, kPd, 0, 0, 0, kTop, 2, false},
    {"top: whole plus one", kHigh, L, kPd, 0, 0, 0, kTop - 0xfff, 0x1001, false},
    // Lookup.
    {"stale key (other key byte)", kMr + 1, L, kPd, 0, 0, 0, 0x1000, 1, false},
    {"key 0", 0, L, kPd, 0, 0, 0, 0x1000, 1, false},
    {"key beyond the table", 0xffffff05, L, kPd, 0, 0, 0, 0x1000, 1, false},
    {"free slot", 0x705, L, kPd, 0, 0, 0, 0x1000, 1, false},
    // PD.
    {"other PD", kOtherPd, L, kPd, 0, 0, 0, 0x1000, 1, false},
    {"other PD, its own", kOtherPd, L, 8, 0, 0, 0, 0x1000, 1, true},
    {"remote, other PD", kOtherPd, R, kPd, 0, RW, RW, 0x1000, 1, false},
    // Access rights.
    {"local write granted", kMr, L, kPd, 0, 0, LW, 0x1000, 8, true},
    {"local write not granted", kReadOnly, L, kPd, 0, 0, LW, 0x1000, 8, false},
    {"local read without local write", kReadOnly, L, kPd, 0, 0, 0, 0x1000, 8, true},
    {"remote read granted", kReadOnly, R, kPd, 0, RR, RR, 0x1000, 8, true},
    {"remote write not granted", kReadOnly, R, kPd, 0, RW, RW, 0x1000, 8, false},
    {"remote atomic not granted", kReadOnly, R, kPd, 0, RA, RA, 0x1000, 8, false},
    {"remote atomic granted", kMr, R, kPd, 0, RA, RA, 0x1000, 8, true},
    // The QP's remote access flags.
    {"QP without remote write", kMr, R, kPd, 0, RR, RW, 0x1000, 8, false},
    {"QP without remote read", kMr, R, kPd, 0, RW | RA, RR, 0x1000, 8, false},
    {"QP flags checked by the caller", kMr, R, kPd, 0, kQpAccessChecked, RW, 0x1000, 8, true},
    {"QP flags do not matter for L_Keys", kMr, L, kPd, 0, 0, LW, 0x1000, 8, true},
    // Kinds: windows are R_Keys only; type 2 serves its QP only.
    {"type 1 window as R_Key", kMw1, R, kPd, 0, RW, RW, 0x1800, 0x100, true},
    {"type 1 window past its end", kMw1, R, kPd, 0, RW, RW, 0x1800, 0x101, false},
    {"type 1 window before its start", kMw1, R, kPd, 0, RW, RW, 0x17ff, 1, false},
    {"type 1 window, right it lacks", kMw1, R, kPd, 0, RR, RR, 0x1800, 8, false},
    {"type 1 window as L_Key", kMw1, L, kPd, 0, 0, 0, 0x1800, 8, false},
    {"type 2 window through its QP", kMw2, R, kPd, kQpn, RW, RW, 0x1000, 8, true},
    {"type 2 window through another QP", kMw2, R, kPd, kQpn + 1, RW, RW, 0x1000, 8, false},
    {"type 2 window as L_Key", kMw2, L, kPd, kQpn, 0, LW, 0x1000, 8, false},
};

class KeyCheck : public ::testing::TestWithParam<KeyCase> {};

TEST_P(KeyCheck, GrantsExactlyWhatTheEntryAllows) {
  static const Table table;
  const KeyCase& c = GetParam();
  const User who{c.pd, c.qpn, c.qp_access};
  const MrEntry* e = check(table, c.key, c.use, who, c.need, c.addr, c.len);
  EXPECT_EQ(e != nullptr, c.granted) << c.name;
  EXPECT_EQ(permits(table.find(c.key), c.use, who, c.need, c.addr, c.len), c.granted) << c.name;
  if (e) {
    EXPECT_EQ(file_offset(*e, c.addr), 0x10000 + (c.addr - e->iova)) << c.name;
  }
}

INSTANTIATE_TEST_SUITE_P(Table, KeyCheck, ::testing::ValuesIn(kKeyCases), [](const auto& info) {
  std::string n;
  for (const char* p = info.param.name; *p; ++p) n += std::isalnum(static_cast<unsigned char>(*p)) ? *p : '_';
  return n;
});

TEST(KeyLookup, SlotIsTheUpper24BitsWithinTheTable) {
  EXPECT_EQ(slot_of(0x105), 1u);
  EXPECT_EQ(slot_of(0xff), 0u);
  EXPECT_EQ(slot_of((shm::kMrTableSize - 1) << 8 | 3), shm::kMrTableSize - 1);
  EXPECT_EQ(slot_of(shm::kMrTableSize << 8), 0u);
}

// ---- Error classes ---------------------------------------------------------

TEST(Faults, EachClassHasOneStatus) {
  struct Row {
    Fault f;
    ibv_wc_status st;
    bool responder;
  };
  const Row rows[] = {
      {Fault::kNone, IBV_WC_SUCCESS, false},
      {Fault::kLocalProtection, IBV_WC_LOC_PROT_ERR, false},
      {Fault::kLocalLength, IBV_WC_LOC_LEN_ERR, false},
      {Fault::kLocalOperation, IBV_WC_LOC_QP_OP_ERR, false},
      {Fault::kRemoteAccess, IBV_WC_REM_ACCESS_ERR, true},
      {Fault::kRemoteInvalid, IBV_WC_REM_INV_REQ_ERR, true},
      {Fault::kRemoteOperation, IBV_WC_REM_OP_ERR, true},
  };
  for (const Row& r : rows) {
    EXPECT_EQ(status(r.f), r.st) << int(r.f);
    EXPECT_EQ(responder_detected(r.f), r.responder) << int(r.f);
  }
  EXPECT_EQ(fault_of(Use::kLocal), Fault::kLocalProtection);
  EXPECT_EQ(fault_of(Use::kRemote), Fault::kRemoteAccess);
}

// ---- Operations --------------------------------------------------------------

TEST(Operations, WhatEachOpcodeNeeds) {
  struct Row {
    uint32_t opcode;
    uint32_t need;
    bool writes_local;
    bool atomic;
  };
  const Row rows[] = {
      {IBV_WR_SEND, 0, false, false},
      {IBV_WR_SEND_WITH_IMM, 0, false, false},
      {IBV_WR_SEND_WITH_INV, 0, false, false},
      {IBV_WR_RDMA_WRITE, RW, false, false},
      {IBV_WR_RDMA_WRITE_WITH_IMM, RW, false, false},
      {IBV_WR_RDMA_READ, RR, true, false},
      {IBV_WR_ATOMIC_CMP_AND_SWP, RA, true, true},
      {IBV_WR_ATOMIC_FETCH_AND_ADD, RA, true, true},
      {IBV_WR_ATOMIC_WRITE, RW, false, false},  // as rxe: remote write (IBTA annex A19)
      {IBV_WR_LOCAL_INV, 0, false, false},
  };
  for (const Row& r : rows) {
    EXPECT_EQ(remote_need(r.opcode), r.need) << r.opcode;
    EXPECT_EQ(writes_local(r.opcode), r.writes_local) << r.opcode;
    EXPECT_EQ(is_atomic(r.opcode), r.atomic) << r.opcode;
  }
}

TEST(Operations, AtomicsActOnOneAlignedQuadword) {
  struct Row {
    const char* name;
    uint32_t opcode;
    uint64_t result_len, addr;
    Fault f;
  };
  const Row rows[] = {
      {"compare and swap", IBV_WR_ATOMIC_CMP_AND_SWP, 8, 0x1000, Fault::kNone},
      {"fetch and add", IBV_WR_ATOMIC_FETCH_AND_ADD, 16, 0x1ff8, Fault::kNone},
      {"misaligned by 4", IBV_WR_ATOMIC_FETCH_AND_ADD, 8, 0x1004, Fault::kRemoteInvalid},
      {"misaligned by 1", IBV_WR_ATOMIC_CMP_AND_SWP, 8, 0x1001, Fault::kRemoteInvalid},
      {"misaligned across the end", IBV_WR_ATOMIC_CMP_AND_SWP, 8, 0x1ffc, Fault::kRemoteInvalid},
      {"result buffer of 7 bytes", IBV_WR_ATOMIC_CMP_AND_SWP, 7, 0x1000, Fault::kLocalLength},
      {"no result buffer", IBV_WR_ATOMIC_FETCH_AND_ADD, 0, 0x1000, Fault::kLocalLength},
      {"not an atomic", IBV_WR_RDMA_WRITE, 8, 0x1000, Fault::kLocalOperation},
      {"atomic write (not a compare-and-swap nor a fetch-and-add)", IBV_WR_ATOMIC_WRITE, 8, 0x1000,
       Fault::kLocalOperation},
  };
  for (const Row& r : rows) EXPECT_EQ(core::check_atomic(r.opcode, r.result_len, r.addr), r.f) << r.name;

  // Aligned, then the key over its 8 bytes: the last quadword is in, the
  // one at the end is not.
  const Table table;
  const User who{kPd, 0, RA};
  EXPECT_NE(check(table, kMr, Use::kRemote, who, RA, 0x1ff8, kAtomicBytes), nullptr);
  EXPECT_EQ(check(table, kMr, Use::kRemote, who, RA, 0x2000, kAtomicBytes), nullptr);
  EXPECT_EQ(check(table, kMr, Use::kRemote, who, RA, 0xff8, kAtomicBytes), nullptr);
  EXPECT_NE(check(table, kHigh, Use::kRemote, who, RA, kTop - 7, kAtomicBytes), nullptr);
}

}  // namespace
}  // namespace sv::access
