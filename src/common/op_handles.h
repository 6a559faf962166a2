// op_handles.h: which request fields of each op are handles, next to the
// op table (protocol.h), whose Handles say only the kinds.
//
// Per op, each request field that names an object of the caller: the field,
// its kind (one kObj bit, one of the op's Handles), what the op does to it
// and who may name it (HandleRule: by default the caller's context). The
// daemon resolves every declared field before the op's handler runs
// (src/daemon/commands.cc, Registry::resolve: the object must exist and the
// rule allow the caller, else EINVAL, or the rule's own errno), hands the
// handler the typed objects, and after it
// succeeds destroys a kDestroy one (EBUSY while other objects use it), as
// the kernel's uverbs core does with the UVERBS_ATTR_IDR attributes of a
// method. A handler looks up no handle of its own: commands_test.cc runs
// every op with declared fields and checks that its handler used each of
// them and looked up nothing else.
#pragma once

#include <array>
#include <cstdint>
#include <utility>

#include "common/protocol.h"

namespace sv::proto {

enum class HandleAccess : uint8_t {
  kRead,      // the caller's object, which the op uses
  kOptional,  // as kRead, or 0 for none
  kDestroy,   // the caller's object, which the op destroys
};
// Who may name the object (Registry::resolve applies the rule).
enum class HandleRule : uint8_t {
  kOwned,           // of the caller's context (a QP: also one the caller holds, an XRC target QP)
  kOwnedOrGranted,  // a CQ: as kOwned, or granted to the caller by name (NsOpen by another user)
  kGranted,         // a CQ granted to the caller by name, not its own (the daemon polls it for the caller)
  kCompletable,     // a CQ the caller's QPs may complete into (the CQ of a peer they reach)
  kReachable,       // an SRQ the caller's QPs reach (its own, XRC, or a peer's both ways connected);
                    // one that exists but is not reachable: EACCES
  // The field is a key (an MR's key, or a window's), not a handle:
  kOwnKey,          // the MR of an MR key of the caller's context (not a window's)
  kReachableKey,    // the MR of a key (a window's: the MR it is bound to) of the caller's user, whose PD
                    // is the caller's or one its QPs reach; no such key: EINVAL, out of reach: EACCES
};
template <class Req>
struct HandleField {
  uint32_t Req::*field;
  Obj kind;
  HandleAccess access;
  HandleRule rule = HandleRule::kOwned;
};

// Ops not listed have no field the daemon resolves for them (their Handles
// may still name what they reach some other way: by key, by name, by the
// QPN of another user's QP).
template <Op op>
struct HandleFields {
  static constexpr std::array<HandleField<typename Command<op>::Req>, 0> list{};
};

#define SV_FIELDS(op_, ...)                                                    \
  template <>                                                                  \
  struct HandleFields<Op::op_> {                                               \
    using R = Command<Op::op_>::Req;                                           \
    static constexpr auto list = std::to_array<HandleField<R>>({__VA_ARGS__}); \
  };
#define SV_F(field_, kind_, access_) {&R::field_, kObj##kind_, HandleAccess::k##access_, HandleRule::kOwned}
#define SV_FR(field_, kind_, access_, rule_) {&R::field_, kObj##kind_, HandleAccess::k##access_, HandleRule::k##rule_}

//        op                 field   kind     access
SV_FIELDS(DeallocPd,      SV_F(handle, Pd, Destroy))
SV_FIELDS(QueryPd,        SV_F(handle, Pd, Read))
SV_FIELDS(DeregMr,        SV_F(handle, Mr, Destroy))
SV_FIELDS(QueryMr,        SV_F(handle, Mr, Read))
SV_FIELDS(DeallocMw,      SV_F(handle, Mw, Destroy))
SV_FIELDS(DestroyChannel, SV_F(handle, Channel, Destroy))
SV_FIELDS(ImportChannel,  SV_F(handle, Channel, Read))
SV_FIELDS(DestroyCq,      SV_F(handle, Cq, Destroy))
SV_FIELDS(DestroyQp,      SV_F(handle, Qp, Destroy))
SV_FIELDS(DestroySrq,     SV_F(handle, Srq, Destroy))
SV_FIELDS(ImportSrq,      SV_F(handle, Srq, Read))
SV_FIELDS(CloseXrcd,      SV_F(handle, Xrcd, Destroy))
SV_FIELDS(FreeDm,         SV_F(handle, Dm, Destroy))
SV_FIELDS(ImportDm,       SV_F(handle, Dm, Read))
SV_FIELDS(RegMr,          SV_F(pd, Pd, Read), SV_F(backing, Backing, Read))
SV_FIELDS(ReregMr,        SV_F(handle, Mr, Read), SV_F(pd, Pd, Optional), SV_F(backing, Backing, Optional))
SV_FIELDS(RegOdpMr,       SV_F(pd, Pd, Read))
SV_FIELDS(RegDmMr,        SV_F(pd, Pd, Read), SV_F(dm, Dm, Read))
SV_FIELDS(BindMw,         SV_F(mw, Mw, Read), SV_F(qpn, Qp, Read))
SV_FIELDS(RegShmid,       SV_F(pd, Pd, Read))
SV_FIELDS(RegShared,      SV_F(pd, Pd, Read), SV_FR(key, Mr, Read, OwnKey))
SV_FIELDS(GetMrBacking,   SV_FR(key, Mr, Read, ReachableKey))
SV_FIELDS(InvalidateKey,  SV_F(qpn, Qp, Read))
SV_FIELDS(AllocMw,        SV_F(pd, Pd, Read))
SV_FIELDS(CreateCq,       SV_F(channel, Channel, Optional))
SV_FIELDS(ResizeCq,       SV_F(handle, Cq, Read))
SV_FIELDS(ResizeCqDone,   SV_F(handle, Cq, Read))
SV_FIELDS(ImportCq,       SV_FR(handle, Cq, Read, OwnedOrGranted))
SV_FIELDS(PollCq,         SV_FR(handle, Cq, Read, Granted))
SV_FIELDS(GetCq,          SV_FR(handle, Cq, Read, Completable))
SV_FIELDS(CqError,        SV_FR(handle, Cq, Read, Completable))
SV_FIELDS(SrqLimit,       SV_FR(handle, Srq, Read, Reachable))
SV_FIELDS(ResizeSrq,      SV_F(handle, Srq, Read))
SV_FIELDS(ResizeSrqDone,  SV_F(handle, Srq, Read))
SV_FIELDS(GetSrq,         SV_FR(handle, Srq, Read, Reachable))
SV_FIELDS(CreateSrq,      SV_F(pd, Pd, Read), SV_F(xrcd, Xrcd, Optional), SV_F(cq, Cq, Optional))
SV_FIELDS(CreateQp,       SV_F(pd, Pd, Optional), SV_F(send_cq, Cq, Optional), SV_F(recv_cq, Cq, Optional),
                          SV_F(srq, Srq, Optional), SV_F(xrcd, Xrcd, Optional))
SV_FIELDS(ConnectXrc,     SV_F(qpn, Qp, Read))
SV_FIELDS(OpenQp,         SV_F(xrcd, Xrcd, Read))
SV_FIELDS(ModifyQp,       SV_F(qpn, Qp, Read))
SV_FIELDS(ImportQp,       SV_F(handle, Qp, Read))
SV_FIELDS(ConnectPeer,    SV_F(handle, Qp, Read))
SV_FIELDS(ConnectUd,      SV_F(qpn, Qp, Read))
SV_FIELDS(PeerError,      SV_F(handle, Qp, Read))
SV_FIELDS(AttachMcast,    SV_F(qpn, Qp, Read))
SV_FIELDS(DetachMcast,    SV_F(qpn, Qp, Read))
SV_FIELDS(Mediate,        SV_F(qpn, Qp, Read))
SV_FIELDS(MediatePost,    SV_F(qpn, Qp, Read))
SV_FIELDS(MediateGone,    SV_F(qpn, Qp, Read))
SV_FIELDS(RoceAttach,     SV_F(qpn, Qp, Read))
#undef SV_FR
#undef SV_F
#undef SV_FIELDS

// Whether op `op` declares a handle field.
template <Op op>
constexpr bool has_handle_fields() {
  return !HandleFields<op>::list.empty();
}

// A rule other than kOwned is for the one kind it is written for.
constexpr bool rule_fits(Obj kind, HandleRule rule) {
  switch (rule) {
    case HandleRule::kOwned: return true;
    case HandleRule::kReachable: return kind == kObjSrq;
    case HandleRule::kOwnKey:
    case HandleRule::kReachableKey: return kind == kObjMr;
    default: return kind == kObjCq;
  }
}

// Every declared field is of one kind that its op's Handles name for that
// access, under a rule for that kind, and every op that destroys an object of the tables (a name is
// not one) declares the field that names it.
template <Op op>
constexpr bool fields_match_handles() {
  const Handles& h = Command<op>::info.handles;
  int destroyed = 0;
  for (const auto& f : HandleFields<op>::list) {
    const uint16_t mask = f.access == HandleAccess::kDestroy ? h.destroys : h.reads;
    if (!(mask & f.kind) || (f.kind & (f.kind - 1)) || !rule_fits(f.kind, f.rule)) return false;
    destroyed += f.access == HandleAccess::kDestroy;
  }
  return destroyed == ((h.destroys & ~kObjName) ? 1 : 0);
}
template <size_t... I>
constexpr bool all_fields_match(std::index_sequence<I...>) {
  return (fields_match_handles<Op(I + 1)>() && ...);
}
static_assert(all_fields_match(std::make_index_sequence<size_t(Op::kCount) - 1>{}),
              "a handle field (HandleFields) that its op's Handles do not declare");

}  // namespace sv::proto
