// objects.h: the daemon's object types and the typed table that holds them.
//
// Every object a client creates is an entry of one ObjectTable, keyed by its
// handle (a QP by its QPN, an MR or a memory window by its MR-table slot),
// with the context that owns it and a count of the objects that reference
// it. What an object references is declared by its type (`held()`): the
// registry takes those references when the object is created and drops them
// when it is freed, through the tables (Registry::hold / Registry::drop),
// never by editing another type's map. An object with references left is
// not destroyed by its holder (EBUSY, as ibv_dealloc_pd(3) and the other
// destroy verbs); when a context's last process goes, its objects are freed
// by type in kDestroyOrder, referrers first, so each free only drops
// references (Registry::release_context).
//
// The model is the kernel's: rdma_core.c keeps every uobject of a file in
// typed tables destroyed by type order when the file closes; rxe_pool.c
// gives each type a descriptor (rxe_type_info) and counted elements.
//
// Contract: single-threaded (the daemon's loop), as the registry.
#pragma once

#include <sys/types.h>

#include <array>
#include <cstdint>
#include <iterator>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/counters.h"
#include "common/protocol.h"
#include "common/shm_layout.h"
#include "common/sys.h"
#include "common/verbs_current.h"
#include "daemon/quota.h"

namespace sv::daemon {

// Access flags an MR may carry, and those that mean something for a QP
// (the FLUSH rights of IBTA annex A19: ibv_reg_mr(3), and an RC QP's
// qp_access_flags, which the kernel takes).
inline constexpr uint32_t kKnownAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                                         IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC |
                                         IBV_ACCESS_MW_BIND | IBV_ACCESS_ZERO_BASED | abi::kAccessFlushGlobal |
                                         abi::kAccessFlushPersistent;
inline constexpr uint32_t kQpAccess = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC |
                                      abi::kAccessFlushGlobal | abi::kAccessFlushPersistent;

// The object types. The order of the context-owned ones is the order a
// context's objects are destroyed in (kDestroyOrder); an XRC domain is
// owned by no context (it lives while opened or used).
enum class ObjKind : uint8_t { kQp, kSrq, kXrcdHandle, kMw, kMr, kDm, kCq, kChannel, kBacking, kPd, kXrcd, kCount };

// One type's descriptor (cf. rxe_type_info): its name (traces, tests) and
// the quota its objects are charged to (quota.h).
struct TypeInfo {
  ObjKind kind;
  const char* name;
  Quotas::Kind quota;
};

// Context-owned types in destroy order: QPs use SRQs, CQs and PDs; SRQs use
// XRC domains, CQs and PDs; windows use MRs and PDs; MRs use PDs and
// backings and device memory; device memory uses its backing; CQs use
// channels.
inline constexpr TypeInfo kDestroyOrder[] = {
    {ObjKind::kQp, "QP", Quotas::kQp},          {ObjKind::kSrq, "SRQ", Quotas::kSrq},
    {ObjKind::kXrcdHandle, "XRCD", Quotas::kXrcd}, {ObjKind::kMw, "MW", Quotas::kMw},
    {ObjKind::kMr, "MR", Quotas::kMr},          {ObjKind::kDm, "DM", Quotas::kDm},
    {ObjKind::kCq, "CQ", Quotas::kCq},
    {ObjKind::kChannel, "channel", Quotas::kChannel}, {ObjKind::kBacking, "backing", Quotas::kBacking},
    {ObjKind::kPd, "PD", Quotas::kPd},
};
// The registry finds a type's operations by its kind: the context-owned
// kinds are numbered in destroy order.
constexpr bool kinds_in_destroy_order() {
  for (size_t i = 0; i < std::size(kDestroyOrder); ++i)
    if (size_t(kDestroyOrder[i].kind) != i) return false;
  return std::size(kDestroyOrder) == size_t(ObjKind::kXrcd);
}
static_assert(kinds_in_destroy_order());
constexpr const TypeInfo& type_info(ObjKind kind) { return kDestroyOrder[size_t(kind)]; }

// A reference one object holds on another (handle 0: none).
struct Ref {
  ObjKind kind;
  uint32_t handle;
};
using Held = std::array<Ref, 5>;

// What every object has: the context it belongs to and how many objects
// reference it.
struct Object {
  uint32_t owner = 0;
  uint32_t refs = 0;
};

struct Pd : Object {  // refs: MRs, windows, SRQs and QPs of it
  Held held() const { return {}; }
};

struct Backing : Object {  // refs: MRs of it
  Fd fd;
  std::string region;    // named region (seed 000) this backing attaches, or empty
  uint64_t limit = 0;    // region backings: the region's size
  uid_t region_uid = 0;  // region backings: the user whose id space names it
  bool dm = false;       // device memory's own backing (made by the daemon): only RegDmMr registers it
  Held held() const { return {}; }
};

// A named shared memory region: tied to no context; alive while some
// context holds a backing of it (from attach until its last MR is gone).
// Ids have an owner: each user has its own id space (keyed by (uid, id)),
// so another user neither attaches a user's region nor pre-creates one
// that user will ask for.
using RegionKey = std::pair<uid_t, std::string>;
struct Region {
  Fd fd;
  uint64_t length;
  uint32_t backings = 0;
};

struct Mr : Object {  // refs: memory windows bound to it
  uint32_t key = 0;
  uint32_t pd = 0;
  uint32_t backing = 0;
  pid_t charged_pid = 0;  // the registrant; the charge stays with it until the MR is freed
  uint64_t charged_bytes = 0;
  uint32_t dm = 0;  // registered over device memory (ibv_reg_dm_mr): that DM
  Held held() const { return {Ref{ObjKind::kPd, pd}, Ref{ObjKind::kBacking, backing}, Ref{ObjKind::kDm, dm}}; }
};

// Device memory (ibv_alloc_dm(3)): a memfd the daemon made, kept as a
// backing of the context that the DM holds; freed with its last handle.
struct Dm : Object {  // refs: MRs registered over it
  uint32_t backing = 0;
  uint64_t length = 0;   // as allocated (registrations and copies stay within it)
  uint64_t charged = 0;  // bytes counted against its user's device memory (whole pages)
  uid_t uid = 0;         // that user
  Held held() const { return {Ref{ObjKind::kBacking, backing}}; }
};

struct Mw : Object {
  uint32_t pd = 0;
  uint32_t type = 0;
  uint32_t key = 0;       // current key (type 2: also while invalid)
  uint32_t bound_mr = 0;  // MR slot, 0 = not bound / invalid (a reference while bound)
  uint32_t alloc_pid = 0;  // the allocating client's pid: its entry's owner_pid but while bound to ODP memory
  Held held() const { return {Ref{ObjKind::kPd, pd}, Ref{ObjKind::kMr, bound_mr}}; }
};

struct Channel : Object {  // refs: CQs attached to it
  // Its wake-up pair (sys.h, make_wake_pair; proto::FdKind::kWakeSocket):
  // `fd` is what its holders poll and read (handed back by ImportChannel),
  // `wake` what the daemon and the CQs' peers signal, never sleeping.
  Fd fd, wake;
  Held held() const { return {}; }
};

struct Cq : Object {  // refs: QPs and XRC SRQs completing into it
  uint32_t channel = 0;
  Fd fd;
  Mapping map;
  Fd next_fd;  // a resize in progress: the segment it moves to
  Mapping next_map;
  bool failed = false;  // CQ error reported (once)
  // Ring capacities as made here: never read back from a segment's header,
  // which every process that maps the segment can write.
  uint32_t capacity = 0;
  uint32_t next_capacity = 0;
  Held held() const { return {Ref{ObjKind::kChannel, channel}}; }
};

struct Srq : Object {  // refs: QPs using it
  uint32_t pd = 0;
  Fd fd;
  Mapping map;
  uint32_t type = IBV_SRQT_BASIC;
  uint32_t xrcd = 0;      // XRC: the domain (an id in the XRC domain table)
  uint32_t cq = 0;        // XRC: the CQ its receives complete into
  uint32_t capacity = 0;  // its ring's, as made here (not the header's)
  uint32_t max_sge = 0;   // as created (not the header's: its holders can write that)
  Fd next_fd;             // a resize's pending segment (ResizeSrq until ResizeSrqDone)
  Mapping next_map;
  uint32_t next_capacity = 0;
  Held held() const { return {Ref{ObjKind::kPd, pd}, Ref{ObjKind::kCq, cq}, Ref{ObjKind::kXrcd, xrcd}}; }
};

// An XRC domain: shared by every context that opened the same file (by
// device and inode), or private (ino 0). Lives while opened or used.
struct Xrcd : Object {  // refs: XRC SRQs and target QPs (its users); no owner
  uint64_t dev = 0;
  uint64_t ino = 0;    // 0: private
  uint32_t uid = 0;    // the user of its openers: a file names one domain per user (system daemon)
  uint32_t opens = 0;  // handles
  Held held() const { return {}; }
};

struct XrcdHandle : Object {  // one ibv_open_xrcd of a context
  uint32_t xrcd = 0;
  Held held() const { return {}; }  // counted in the domain's `opens`, not its users
};

struct Qp : Object {
  // The user of its context (every process that holds it is of that user):
  // whose device tables hold its entry, and who may map its segment.
  uint32_t uid = uint32_t(-1);
  uint32_t pd = 0;
  uint32_t send_cq = 0;
  uint32_t recv_cq = 0;
  ibv_qp_type type = IBV_QPT_RC;
  Fd fd;
  Mapping map;
  uint32_t slot = 0;
  uint32_t sq_capacity = 0;
  uint32_t rq_capacity = 0;
  uint32_t sq_sig_all = 0;
  uint32_t rq_psn = 0, sq_psn = 0;  // the starting PSNs ibv_modify_qp gave (RTR, RTS)
  uint32_t srq = 0;
  uint32_t xrcd = 0;               // XRC target: its domain
  std::vector<uint32_t> holders;  // XRC target: the context of each handle of it (ibv_open_qp)
  // Pipelined mediated requests (Op::MediatePost, registry_mediation.cc):
  // the counts the QP segment shows, and a run stopped by a request that
  // failed (the rest is flushed) or stalled (the rest comes back unexecuted).
  uint64_t med_finished = 0, med_done = 0;
  uint32_t med_stop_epoch = 0;
  uint8_t med_stop = 0;  // MedStop
  // Its counts between users (counters::Mediated): the daemon's own, of
  // what it carried out for and to this QP.
  uint64_t med_counts[counters::kMedCount] = {};
  Held held() const {
    return {Ref{ObjKind::kPd, pd}, Ref{ObjKind::kCq, send_cq}, Ref{ObjKind::kCq, recv_cq}, Ref{ObjKind::kSrq, srq},
            Ref{ObjKind::kXrcd, xrcd}};
  }
};

// The table kind and type of each kind of handle a request field names
// (proto::Obj; common/op_handles.h). An XRC domain's handle is a context's
// handle of it.
template <proto::Obj>
struct ObjType;
#define SV_OBJ_TYPE(bit_, Type_, kind_)          \
  template <>                                    \
  struct ObjType<proto::bit_> {                  \
    using type = Type_;                          \
    static constexpr ObjKind kind = ObjKind::kind_; \
  };
SV_OBJ_TYPE(kObjPd, Pd, kPd)
SV_OBJ_TYPE(kObjBacking, Backing, kBacking)
SV_OBJ_TYPE(kObjMr, Mr, kMr)
SV_OBJ_TYPE(kObjMw, Mw, kMw)
SV_OBJ_TYPE(kObjChannel, Channel, kChannel)
SV_OBJ_TYPE(kObjCq, Cq, kCq)
SV_OBJ_TYPE(kObjQp, Qp, kQp)
SV_OBJ_TYPE(kObjSrq, Srq, kSrq)
SV_OBJ_TYPE(kObjXrcd, XrcdHandle, kXrcdHandle)
SV_OBJ_TYPE(kObjDm, Dm, kDm)
#undef SV_OBJ_TYPE

// Lookups of an object by a handle and the context that must own it
// (ObjectTable::owned, QueuePairs::find): the ownership checks outside
// the command layer's resolver, counted so that a test can tell that an
// op's handler made none (commands_test.cc).
inline uint64_t& owner_lookups() {
  static thread_local uint64_t n = 0;
  return n;
}

// The objects of one type by handle. It reads as the std::map it wraps
// (find, end, iteration), plus lookups by owner and counted references.
// (No virtual functions: the registry picks a table by kind with a switch,
// Registry::with_table.)
template <class T>
class ObjectTable {
 public:
  using Map = std::map<uint32_t, T>;
  using iterator = typename Map::iterator;
  using const_iterator = typename Map::const_iterator;

  iterator begin() { return m_.begin(); }
  iterator end() { return m_.end(); }
  const_iterator begin() const { return m_.begin(); }
  const_iterator end() const { return m_.end(); }
  iterator find(uint32_t h) { return m_.find(h); }
  const_iterator find(uint32_t h) const { return m_.find(h); }
  size_t count(uint32_t h) const { return m_.count(h); }
  size_t size() const { return m_.size(); }
  // A new object made here has owner 0 (objects owned by no context).
  T& operator[](uint32_t h) {
    auto [it, made] = m_.try_emplace(h);
    if (made) by_owner_.insert({it->second.owner, h});
    return it->second;
  }
  T& at(uint32_t h) { return m_.at(h); }
  iterator erase(iterator it) {
    by_owner_.erase({it->second.owner, it->first});
    return m_.erase(it);
  }
  size_t erase(uint32_t h) {
    auto it = m_.find(h);
    if (it == m_.end()) return 0;
    erase(it);
    return 1;
  }
  // The owner is indexed as the object goes in: set it before, and change
  // it afterwards only through set_owner.
  T& insert(uint32_t h, T&& obj) {
    if (auto old = m_.find(h); old != m_.end()) by_owner_.erase({old->second.owner, h});
    by_owner_.insert({obj.owner, h});
    return m_.insert_or_assign(h, std::move(obj)).first->second;
  }
  void set_owner(uint32_t h, uint32_t ctx) {
    T* o = get(h);
    if (!o || o->owner == ctx) return;
    by_owner_.erase({o->owner, h});
    o->owner = ctx;
    by_owner_.insert({ctx, h});
  }

  T* get(uint32_t h) {
    auto it = m_.find(h);
    return it == m_.end() ? nullptr : &it->second;
  }
  // The object if it exists and belongs to context `ctx`.
  T* owned(uint32_t h, uint32_t ctx) {
    ++owner_lookups();
    T* o = get(h);
    return o && o->owner == ctx ? o : nullptr;
  }
  const T* owned(uint32_t h, uint32_t ctx) const {
    ++owner_lookups();
    auto it = m_.find(h);
    return it != m_.end() && it->second.owner == ctx ? &it->second : nullptr;
  }
  // By the owner index: the cost is the context's own objects, not the table's.
  bool any_of(uint32_t ctx) const {
    auto it = by_owner_.lower_bound({ctx, 0});
    return it != by_owner_.end() && it->first == ctx;
  }

  // Takes a reference on object `h` (nothing if there is none).
  void ref(uint32_t h) {
    if (T* o = get(h)) o->refs++;
  }
  // Drops one; the references left, or -1 if there is no such object.
  int64_t unref(uint32_t h) {
    T* o = get(h);
    if (!o) return -1;
    if (o->refs) o->refs--;
    return o->refs;
  }
  // The references object `h` holds (none if there is no such object).
  Held held_by(uint32_t h) const {
    auto it = m_.find(h);
    return it == m_.end() ? Held{} : it->second.held();
  }
  void remove(uint32_t h) { erase(h); }
  // Up to `max` handles of context `ctx`'s objects above `after`, in
  // handle order (by the owner index: the cost is that context's objects).
  std::vector<uint32_t> of_after(uint32_t ctx, uint32_t after, size_t max) const {
    std::vector<uint32_t> ids;
    if (after == UINT32_MAX) return ids;
    for (auto it = by_owner_.lower_bound({ctx, after + 1}); it != by_owner_.end() && it->first == ctx && ids.size() < max;
         ++it)
      ids.push_back(it->second);
    return ids;
  }
  const_iterator upper_bound(uint32_t h) const { return m_.upper_bound(h); }
  // The handles of context `ctx`'s objects, in handle order.
  std::vector<uint32_t> of(uint32_t ctx) const {
    std::vector<uint32_t> ids;
    for (auto it = by_owner_.lower_bound({ctx, 0}); it != by_owner_.end() && it->first == ctx; ++it)
      ids.push_back(it->second);
    return ids;
  }

 private:
  Map m_;
  // (owner, handle) of every object: a context's objects without a walk
  // over every context's.
  std::set<std::pair<uint32_t, uint32_t>> by_owner_;
};

}  // namespace sv::daemon
