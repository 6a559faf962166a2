// op_table.h: the control protocol's op table, one declaration per op
// over the messages of common/protocol.h (which includes this file at its
// end, so every user of the protocol has both).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <utility>

#include "common/protocol.h"

namespace sv::proto {

// ---- The op table -------------------------------------------------------------
// One declaration per op (as the kernel's uverbs declares each method's
// attributes once): its request and reply structs, the descriptors each
// carries (SCM_RIGHTS), and the kinds of handle it reads, creates or
// destroys. The daemon checks every request, and its own replies, against
// it (src/daemon/commands.cc); the library's DaemonConn::call is typed by it
// (src/verbs/provider.h); docs/PROTOCOL.md's op list is checked against it
// (src/common/protocol_test.cc).

// A number of descriptors: exactly `min` when min == max, else min..max.
struct FdCount {
  uint8_t min, max;
  constexpr bool allows(size_t n) const { return n >= min && n <= max; }
};
constexpr FdCount fds(uint8_t n) { return {n, n}; }
constexpr FdCount fds(uint8_t min, uint8_t max) { return {min, max}; }

// Kinds of handle, as bits.
enum Obj : uint16_t {
  kObjContext = 1 << 0,  // another context (a command socket)
  kObjPd = 1 << 1,
  kObjBacking = 1 << 2,
  kObjMr = 1 << 3,
  kObjMw = 1 << 4,
  kObjChannel = 1 << 5,
  kObjCq = 1 << 6,
  kObjQp = 1 << 7,
  kObjSrq = 1 << 8,
  kObjXrcd = 1 << 9,
  kObjName = 1 << 10,  // a name in the namespace
  kObjDm = 1 << 11,    // device memory
};
constexpr uint16_t kObjPublishable = kObjPd | kObjMr | kObjCq | kObjQp | kObjSrq | kObjChannel;  // NsKind
constexpr const char* kObjNames[] = {"context", "pd", "backing", "mr", "mw", "channel",
                                     "cq",      "qp", "srq",     "xrcd", "name", "dm"};

struct Handles {
  uint16_t reads = 0, creates = 0, destroys = 0;
};

struct OpInfo {
  Op op;
  const char* name;
  const char* req_name;  // the structs' names
  const char* rep_name;
  uint16_t req_size, rep_size;
  FdCount in, out;  // the request's descriptors; the reply's (when its status is 0)
  Handles handles;
  bool event;  // daemon -> client only (AsyncEvent): a request with this op is EOPNOTSUPP
};

template <Op>
struct Command;  // declared below once per op

// The reply's own count of its descriptors, where its fields say (-1: only
// the op's FdCount applies).
template <class Rep>
constexpr int reply_fds(const Rep&) { return -1; }
constexpr int reply_fds(const ConnectPeerReply& r) {
  return r.mediated ? 0 : 2 + (r.has_srq ? 1 : 0) + (r.has_channel ? 1 : 0);
}
constexpr int reply_fds(const ImportCqReply& r) { return r.segment_size ? 1 : 0; }  // granted: none

// Whether a reply (status 0) with `n` descriptors matches op C's declaration.
template <class C>
constexpr bool reply_matches(const typename C::Rep& rep, size_t n) {
  const int exact = reply_fds(rep);
  return C::info.out.allows(n) && (exact < 0 || size_t(exact) == n);
}

#define SV_OP_DECL(name_, Req_, Rep_, in_, out_, event_, ...)                                 \
  template <>                                                                                 \
  struct Command<Op::name_> {                                                                 \
    using Req = Req_;                                                                         \
    using Rep = Rep_;                                                                         \
    static_assert(sizeof(Req) <= kMaxMessage && sizeof(Rep) <= kMaxMessage);                  \
    static constexpr OpInfo info{Op::name_, #name_, #Req_, #Rep_, sizeof(Req_), sizeof(Rep_), \
                                 in_, out_, Handles __VA_ARGS__, event_};                     \
  };
#define SV_OP(name_, Req_, Rep_, in_, out_, ...) SV_OP_DECL(name_, Req_, Rep_, in_, out_, false, __VA_ARGS__)

//    op             request         reply               fds in     fds out    handles {reads, creates, destroys}
SV_OP(Hello,         Empty,          HelloReply,         fds(0),    fds(1),    {})  // reply: the user's device segment
SV_OP(AllocPd,       Empty,          HandleReply,        fds(0),    fds(0),    {0, kObjPd})
SV_OP(DeallocPd,     HandleReq,      Empty,              fds(0),    fds(0),    {0, 0, kObjPd})
SV_OP(RegBacking,    Empty,          HandleReply,        fds(1),    fds(0),    {0, kObjBacking})
SV_OP(RegMr,         RegMrReq,       RegMrReply,         fds(0),    fds(0),    {kObjPd | kObjBacking, kObjMr})
SV_OP(DeregMr,       HandleReq,      Empty,              fds(0),    fds(0),    {0, 0, kObjMr})
SV_OP(CreateChannel, Empty,          HandleReply,        fds(2),    fds(0),    {0, kObjChannel})
SV_OP(DestroyChannel, HandleReq,     Empty,              fds(0),    fds(0),    {0, 0, kObjChannel})
SV_OP(CreateCq,      CreateCqReq,    CreateCqReply,      fds(0),    fds(1),    {kObjChannel, kObjCq})
SV_OP(DestroyCq,     HandleReq,      Empty,              fds(0),    fds(0),    {0, 0, kObjCq})
SV_OP(CreateQp,      CreateQpReq,    CreateQpReply,      fds(0),    fds(1),    {kObjPd | kObjCq | kObjSrq | kObjXrcd, kObjQp})
SV_OP(ModifyQp,      ModifyQpReq,    Empty,              fds(0),    fds(0),    {kObjQp})
SV_OP(DestroyQp,     HandleReq,      Empty,              fds(0),    fds(0),    {0, 0, kObjQp})
SV_OP(ConnectPeer,   HandleReq,      ConnectPeerReply,   fds(0),    fds(0, 4), {kObjQp})
SV_OP(GetMrBacking,  GetMrBackingReq, GetMrBackingReply, fds(0),   fds(1),    {kObjMr | kObjMw})
SV_OP(PeerError,     PeerErrorReq,   Empty,              fds(0),    fds(0),    {kObjQp})
SV_OP(Status,        Empty,          StatusReply,        fds(0),    fds(0),    {})
SV_OP(Accounts,      Empty,          AccountsReply,      fds(0),    fds(0),    {})
SV_OP(AllocMw,       AllocMwReq,     KeyReply,           fds(0),    fds(0),    {kObjPd, kObjMw})
SV_OP(DeallocMw,     HandleReq,      Empty,              fds(0),    fds(0),    {0, 0, kObjMw})
SV_OP(BindMw,        BindMwReq,      KeyReply,           fds(0),    fds(0),    {kObjMw | kObjQp | kObjMr})
SV_OP(InvalidateKey, InvalidateReq,  Empty,              fds(0),    fds(0),    {kObjMr | kObjMw | kObjQp})
SV_OP(ClaimSocket,   ClaimSocketReq, Empty,              fds(0),    fds(0),    {})
SV_OP(ImportContext, Empty,          ClientReply,              fds(1),    fds(0),    {kObjContext})
SV_OP(QueryPd,       HandleReq,      Empty,              fds(0),    fds(0),    {kObjPd})
SV_OP(QueryMr,       HandleReq,      QueryMrReply,       fds(0),    fds(0),    {kObjMr})
SV_OP(ImportCq,      HandleReq,      ImportCqReply,      fds(0),    fds(0, 1), {kObjCq})  // granted: no fd
SV_OP(ImportQp,      HandleReq,      ImportQpReply,      fds(0),    fds(1),    {kObjQp})
SV_OP(RegShmid,      RegShmidReq,    RegShmidReply,      fds(0),    fds(1),    {kObjPd, kObjBacking})
SV_OP(RegShared,     RegSharedReq,   RegMrReply,         fds(0),    fds(0),    {kObjMr | kObjPd, kObjMr})
SV_OP(ConnectUd,     ConnectUdReq,   ConnectPeerReply,   fds(0),    fds(2, 4), {kObjQp})
SV_OP(RegAsync,      Empty,          Empty,              fds(1),    fds(0),    {})
SV_OP_DECL(AsyncEvent, AsyncEventMsg, Empty,             fds(0),    fds(0),    true, {})
SV_OP(CreateSrq,     CreateSrqReq,   CreateSrqReply,     fds(0),    fds(1),    {kObjPd | kObjXrcd | kObjCq, kObjSrq})
SV_OP(DestroySrq,    HandleReq,      Empty,              fds(0),    fds(0),    {0, 0, kObjSrq})
SV_OP(SrqLimit,      HandleReq,      Empty,              fds(0),    fds(0),    {kObjSrq})
SV_OP(NsPublish,     NsPublishReq,   Empty,              fds(0),    fds(0),    {kObjPublishable, kObjName})
SV_OP(NsUnpublish,   NsNameReq,      Empty,              fds(0),    fds(0),    {0, 0, kObjName})
SV_OP(NsOpen,        NsNameReq,      NsOpenReply,        fds(0),    fds(0),    {kObjName})
SV_OP(NsList,        NsListReq,      NsListReply,        fds(0),    fds(0),    {})
SV_OP(ImportSrq,     HandleReq,      ImportSrqReply,     fds(0),    fds(1),    {kObjSrq})
SV_OP(ImportChannel, HandleReq,      Empty,              fds(0),    fds(2),    {kObjChannel})
SV_OP(Mediate,       MediateReq,     MediateReply,       fds(0),    fds(0),    {kObjQp | kObjMr | kObjMw})
SV_OP(ResizeCq,      ResizeCqReq,    CreateCqReply,      fds(0),    fds(1),    {kObjCq})
SV_OP(ResizeCqDone,  ResizeCqDoneReq, Empty,             fds(0),    fds(0),    {kObjCq})
SV_OP(GetCq,         HandleReq,      ImportCqReply,      fds(0),    fds(1),    {kObjCq})
SV_OP(CqError,       HandleReq,      Empty,              fds(0),    fds(0),    {kObjCq})
SV_OP(AttachMcast,   McastReq,       Empty,              fds(0),    fds(0),    {kObjQp})
SV_OP(DetachMcast,   McastReq,       Empty,              fds(0),    fds(0),    {kObjQp})
SV_OP(OpenXrcd,      OpenXrcdReq,    HandleReply,        fds(0, 1), fds(0),    {0, kObjXrcd})  // fd if has_fd
SV_OP(CloseXrcd,     HandleReq,      Empty,              fds(0),    fds(0),    {0, 0, kObjXrcd})
SV_OP(ConnectXrc,    ConnectXrcReq,  ConnectPeerReply,   fds(0),    fds(3, 4), {kObjQp | kObjSrq})
SV_OP(OpenQp,        OpenQpReq,      ImportQpReply,      fds(0),    fds(1),    {kObjXrcd, kObjQp})
SV_OP(RoceAttach,    RoceAttachReq,  RoceAttachReply,    fds(0),    fds(2),    {kObjQp})
SV_OP(PollCq,        PollCqReq,      PollCqReply,        fds(0),    fds(0),    {kObjCq})
SV_OP(ReregMr,       ReregMrReq,     RegMrReply,         fds(0),    fds(0),    {kObjMr | kObjPd | kObjBacking})
SV_OP(AllocDm,       AllocDmReq,     DmReply,            fds(0),    fds(1),    {0, kObjDm})
SV_OP(FreeDm,        HandleReq,      Empty,              fds(0),    fds(0),    {0, 0, kObjDm})
SV_OP(ImportDm,      HandleReq,      DmReply,            fds(0),    fds(1),    {kObjDm})
SV_OP(RegDmMr,       RegDmMrReq,     RegMrReply,         fds(0),    fds(0),    {kObjPd | kObjDm, kObjMr})
SV_OP(Netns,         NetnsMsg,       NetnsMsg,           fds(0),    fds(0),    {})
SV_OP(MediatePost,   MediateReq,     Empty,              fds(0),    fds(0),    {kObjQp | kObjMr | kObjMw})
SV_OP(MediateGone,   MediateGoneReq, Empty,              fds(0),    fds(0),    {kObjQp})
SV_OP(PostRing,      Empty,          PostRingReply,      fds(0),    fds(2),    {})
SV_OP(CmBind,        CmBindReq,      CmBindReply,        fds(0),    fds(1),    {})
SV_OP(CmUnbind,      CmBindReq,      Empty,              fds(0),    fds(0),    {})
SV_OP(Wake,          Empty,          Empty,              fds(0),    fds(1),    {})
SV_OP_DECL(Refused,  RefusedMsg,     Empty,              fds(0),    fds(0),    true, {})
SV_OP(ResList,       ResListReq,     ResListReply,       fds(0),    fds(0),    {})
SV_OP(WireCounters,  Empty,          WireCountersReply,  fds(0),    fds(0),    {})
SV_OP(ResizeSrq,     ResizeSrqReq,   CreateSrqReply,     fds(0),    fds(1),    {kObjSrq})
SV_OP(ResizeSrqDone, ResizeSrqDoneReq, Empty,            fds(0),    fds(0),    {kObjSrq})
SV_OP(GetSrq,        HandleReq,      ImportSrqReply,     fds(0),    fds(1),    {kObjSrq})
SV_OP(Counters,      CountersReq,    CountersReply,      fds(0),    fds(0),    {})
SV_OP(RegOdpMr,      RegMrReq,       RegMrReply,         fds(0),    fds(0),    {kObjPd, kObjMr})
#undef SV_OP
#undef SV_OP_DECL

// What each descriptor a request carries must be, declared per op; the
// daemon checks every one before any handler sees it (daemon/fd_kinds.h)
// and refuses anything else (EBADF). Ops not listed take none.
enum class FdKind : uint8_t {
  kNone,
  kSocket,      // a socket (ImportContext: a context's command socket, compared by inode)
  kMemfd,       // a regular file of tmpfs, sealable (RegBacking: a sealed memfd; seals checked by the registry)
  kWakeSocket,  // one end of an AF_UNIX SOCK_STREAM socketpair (RegAsync, CreateChannel: the daemon signals it, MSG_DONTWAIT)
  kAnyFile,     // any open file, only fstat(2)-ed (OpenXrcd: the domain is named by its inode)
};
constexpr FdKind in_fd_kind(Op op) {
  switch (op) {
    case Op::ImportContext: return FdKind::kSocket;
    case Op::RegBacking: return FdKind::kMemfd;
    case Op::RegAsync: return FdKind::kWakeSocket;
    case Op::CreateChannel: return FdKind::kWakeSocket;
    case Op::OpenXrcd: return FdKind::kAnyFile;
    default: return FdKind::kNone;
  }
}

template <size_t... I>
constexpr std::array<OpInfo, sizeof...(I)> make_op_table(std::index_sequence<I...>) {
  return {Command<Op(I + 1)>::info...};
}
// Every op, indexed by its number - 1 (a missing declaration does not compile).
inline constexpr auto kOps = make_op_table(std::make_index_sequence<size_t(Op::kCount) - 1>{});

// The declaration of op number `op`, or null for an unknown op.
constexpr const OpInfo* op_info(uint16_t op) {
  return op == 0 || op >= uint16_t(Op::kCount) ? nullptr : &kOps[op - 1];
}

// Every op that takes a descriptor says what kind, and no other op has one.
constexpr bool fd_kinds_declared() {
  for (const OpInfo& o : kOps)
    if ((o.in.max > 0) != (in_fd_kind(o.op) != FdKind::kNone)) return false;
  return true;
}
static_assert(fd_kinds_declared(), "an op takes descriptors without a declared kind (in_fd_kind)");

}  // namespace sv::proto
