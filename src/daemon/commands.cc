// commands.cc: each op's handler, and the generic checks around it (see
// commands.h). A handler decodes nothing, checks no descriptor count and
// looks up no handle field: run_command has done all three from the op's
// declaration (common/protocol.h, common/op_handles.h), and destroys the
// object of a destroy op by its type's hook once the handler succeeded.
#include "daemon/commands.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "common/op_handles.h"
#include "common/paths.h"
#include "common/trace.h"

namespace sv::daemon {
namespace {

using proto::Op;
template <Op op>
using Req = typename proto::Command<op>::Req;
template <Op op>
using Rep = typename proto::Command<op>::Rep;

HandleAudit g_audit;

// The objects the request fields of op `op` name (common/op_handles.h),
// resolved before its handler runs: each must exist and its field's rule
// allow the caller (Registry::resolve: by default, the caller's), else the
// request fails with EINVAL (or the rule's errno) and no handler runs. The handler takes them typed from here, which records which ones
// it used; a kDestroy one is destroyed here once the handler succeeded.
template <Op op>
class Resolved {
  static constexpr auto& kFields = proto::HandleFields<op>::list;
  static constexpr size_t kN = kFields.size();
  static_assert(kN <= 32);
  template <size_t I>
  using T = typename ObjType<kFields[I].kind>::type;
  template <size_t I>
  static constexpr ObjKind kind = ObjType<kFields[I].kind>::kind;

 public:
  // 0, or the errno of the first field whose object the caller may not name.
  int resolve(Registry& reg, uint32_t client, const Req<op>& req) {
    return resolve_each(reg, client, req, std::make_index_sequence<kN>{});
  }
  // The object of field I (kRead).
  template <size_t I>
  T<I>& get() {
    static_assert(kFields[I].access == proto::HandleAccess::kRead);
    used_ |= 1u << I;
    return *static_cast<T<I>*>(objs_[I]);
  }
  // The object of field I (kOptional), null for none.
  template <size_t I>
  T<I>* optional() {
    static_assert(kFields[I].access == proto::HandleAccess::kOptional);
    used_ |= 1u << I;
    return static_cast<T<I>*>(objs_[I]);
  }
  // Field I's handle (that of the object get<I> gives).
  template <size_t I>
  uint32_t id() {
    used_ |= 1u << I;
    return ids_[I];
  }
  // Destroys the kDestroy objects, by their types' hooks (EBUSY while used).
  int destroy(Registry& reg, uint32_t client) { return destroy_each(reg, client, std::make_index_sequence<kN>{}); }
  uint32_t declared() const { return kN ? uint32_t((uint64_t(1) << kN) - 1) : 0; }
  uint32_t used() const { return used_; }

 private:
  template <size_t... I>
  int resolve_each([[maybe_unused]] Registry& reg, [[maybe_unused]] uint32_t client, [[maybe_unused]] const Req<op>& req,
                   std::index_sequence<I...>) {
    int e = 0;
    ((e = e ? e : resolve_one<I>(reg, client, req.*(kFields[I].field))), ...);
    return e;
  }
  template <size_t I>
  int resolve_one(Registry& reg, uint32_t client, uint32_t handle) {
    ids_[I] = handle;
    if (kFields[I].access == proto::HandleAccess::kOptional && handle == 0) return 0;
    const int e = reg.resolve(kind<I>, kFields[I].rule, client, handle, objs_[I]);
    if (e == 0) return 0;
    SV_TRACE("daemon: %s: %s %u is no object the caller may name (rule %u): %s", proto::Command<op>::info.name,
             type_info(kind<I>).name, handle, unsigned(kFields[I].rule), std::strerror(e));
    return e;
  }
  template <size_t... I>
  int destroy_each([[maybe_unused]] Registry& reg, [[maybe_unused]] uint32_t client, std::index_sequence<I...>) {
    int e = 0;
    ((e = e ? e : destroy_one<I>(reg, client)), ...);
    return e;
  }
  template <size_t I>
  int destroy_one(Registry& reg, uint32_t client) {
    if constexpr (kFields[I].access != proto::HandleAccess::kDestroy) {
      return 0;
    } else {
      used_ |= 1u << I;
      return reg.destroy(kind<I>, client, ids_[I]);
    }
  }

  std::array<Object*, kN> objs_{};
  std::array<uint32_t, kN> ids_{};
  uint32_t used_ = 0;
};

// Whether op `op` is served at all here, before any of its handles is
// resolved: a feature switched off answers the same whatever the request
// names (0, or the errno). Specialised for the ops that have such a switch.
template <Op op>
int served(CommandEnv&) {
  return 0;
}
template <>
int served<Op::RoceAttach>(CommandEnv& env) {
  return env.roce.opened() ? 0 : EOPNOTSUPP;  // SOFTVERBS_ROCE=0 (Daemon.RoceAttachRefusedWithRoceOff)
}

// The handler of op `op`: returns the reply's status (0 or a positive
// errno) and fills `rep` and env.out_fds, from the request and the objects
// its handle fields name. Specialised once per op below (but AsyncEvent,
// which the daemon only sends); one missing does not link.
template <Op op>
int handler(CommandEnv& env, const Req<op>& req, Rep<op>& rep, Resolved<op>& obj);

#define SV_HANDLER(op_)                                                                             \
  template <>                                                                                       \
  int handler<Op::op_>([[maybe_unused]] CommandEnv & env, [[maybe_unused]] const Req<Op::op_>& req, \
                       [[maybe_unused]] Rep<Op::op_>& rep, [[maybe_unused]] Resolved<Op::op_>& obj)
// An op whose work is the destroy of its kDestroy handle, which run() does.
#define SV_DESTROY_HANDLER(op_) \
  SV_HANDLER(op_) { return 0; }

// ---- Context ------------------------------------------------------------
SV_HANDLER(Hello) {
  rep.client_id = env.client;
  rep.boot_id = env.registry.boot_id();
  int dev = -1;
  if (int e = env.registry.device_fd(env.client, dev)) return e;
  env.out_fds.push_back(dev);
  return 0;
}
SV_HANDLER(ClaimSocket) { return env.registry.claim_socket(env.client, req.inode); }
SV_HANDLER(ImportContext) {
  rep.client_id = env.client;
  return env.registry.import_context(env.client, std::move(env.in_fds[0]));
}
SV_HANDLER(RegAsync) { return env.registry.reg_async(env.client, std::move(env.in_fds[0])); }
SV_HANDLER(Status) {
  Counts c = env.registry.counts();
  rep.clients = c.clients;
  rep.pds = c.pds;
  rep.mrs = c.mrs;
  rep.cqs = c.cqs;
  rep.qps = c.qps;
  rep.channels = c.channels;
  rep.backings = c.backings;
  rep.regions = env.registry.region_count();
  rep.daemon_pid = uint32_t(::getpid());
  rep.served_as = env.registry.served_as();
  return 0;
}
// The network namespace this daemon serves (its GID table's addresses):
// a process of another one must not use it (common/paths.h).
SV_HANDLER(Netns) {
  const NetnsId mine = netns_self();
  rep.dev = mine.dev;
  rep.ino = mine.ino;
  if (req.flags & proto::kNetnsQuery) return 0;
  return NetnsId{req.dev, req.ino} == mine ? 0 : EXDEV;
}
SV_HANDLER(Accounts) {
  env.registry.mr().accounts(rep);
  return 0;
}

// ---- PD, backings, MRs, windows -------------------------------------------
SV_HANDLER(AllocPd) { return env.registry.pd().alloc(env.client, rep.handle); }
SV_DESTROY_HANDLER(DeallocPd)
SV_HANDLER(QueryPd) {
  (void)obj.get<0>();  // ibv_query_pd: the PD is the caller's
  return 0;
}
SV_HANDLER(RegBacking) { return env.registry.backings().reg(env.client, std::move(env.in_fds[0]), rep.handle); }
SV_HANDLER(RegMr) {
  (void)obj.get<0>();  // the PD: the caller's (the MR records req.pd)
  return env.registry.mr().reg(env.client, obj.get<1>(), req, rep);
}
SV_HANDLER(RegOdpMr) {
  (void)obj.get<0>();  // the PD: the caller's (the MR records req.pd)
  return env.registry.mr().reg_odp(env.client, req, rep);
}
SV_HANDLER(ReregMr) {
  (void)obj.optional<1>();  // a new PD: the caller's (the MR records req.pd)
  return env.registry.mr().rereg(env.client, obj.get<0>(), obj.optional<2>(), req, rep);
}
SV_DESTROY_HANDLER(DeregMr)
SV_HANDLER(QueryMr) {
  env.registry.mr().query(obj.id<0>(), obj.get<0>(), rep);
  return 0;
}
SV_HANDLER(GetMrBacking) { return env.registry.mr().get_backing(obj.get<0>(), rep, env.out_fds); }
SV_HANDLER(RegShmid) {
  (void)obj.get<0>();  // the PD: the caller's (the registration that follows names it)
  return env.registry.backings().reg_shmid(env.client, req, rep, env.out_fds);
}
SV_HANDLER(RegShared) {
  (void)obj.get<0>();  // the PD: the caller's (the new MR records req.pd)
  return env.registry.mr().reg_shared(env.client, obj.get<1>(), req, rep);
}
SV_HANDLER(AllocMw) { return env.registry.mr().alloc_mw(env.client, obj.id<0>(), req, rep); }
SV_DESTROY_HANDLER(DeallocMw)
SV_HANDLER(BindMw) { return env.registry.mr().bind_mw(obj.get<0>(), obj.get<1>(), req, rep); }
SV_HANDLER(InvalidateKey) {
  (void)obj.get<0>();  // the QP: the caller's (its PD and peer are checked against the key's window)
  return env.registry.mr().invalidate(env.client, req);
}
SV_HANDLER(AllocDm) { return env.registry.dm().alloc(env.client, req, rep, env.out_fds); }
SV_DESTROY_HANDLER(FreeDm)
SV_HANDLER(ImportDm) { return env.registry.dm().import(obj.id<0>(), obj.get<0>(), rep, env.out_fds); }
SV_HANDLER(RegDmMr) { return env.registry.dm().reg_mr(env.client, obj.id<0>(), obj.get<1>(), req, rep); }

// ---- Channels and CQs -----------------------------------------------------
SV_HANDLER(CreateChannel) {
  return env.registry.cq().create_channel(env.client, std::move(env.in_fds[0]), std::move(env.in_fds[1]), rep.handle);
}
SV_DESTROY_HANDLER(DestroyChannel)
SV_HANDLER(ImportChannel) {
  const Channel& ch = obj.get<0>();
  env.out_fds.push_back(ch.fd.get());
  env.out_fds.push_back(ch.wake.get());
  return 0;
}
SV_HANDLER(CreateCq) { return env.registry.cq().create(env.client, obj.id<0>(), req, rep, env.out_fds); }
SV_DESTROY_HANDLER(DestroyCq)
SV_HANDLER(ImportCq) { return env.registry.cq().import(env.client, obj.get<0>(), rep, env.out_fds); }
SV_HANDLER(ResizeCq) { return env.registry.cq().resize(obj.get<0>(), req, rep, env.out_fds); }
SV_HANDLER(ResizeCqDone) { return env.registry.cq().resize_done(obj.get<0>(), req); }
SV_HANDLER(GetCq) { return env.registry.cq().get(obj.get<0>(), rep, env.out_fds); }
SV_HANDLER(CqError) { return env.registry.cq().error(obj.get<0>(), obj.id<0>()); }
SV_HANDLER(PollCq) { return env.registry.cq().poll_granted(obj.get<0>(), req, rep); }

// ---- QPs ------------------------------------------------------------------
SV_HANDLER(CreateQp) {
  // Its PD and CQs: the caller's, or none (an XRC target QP); the QP records them.
  (void)obj.optional<0>(), (void)obj.optional<1>(), (void)obj.optional<2>();
  return env.registry.qp().create(env.client, {obj.optional<3>(), obj.optional<4>()}, req, rep, env.out_fds);
}
SV_HANDLER(ModifyQp) { return env.registry.qp().modify(obj.get<0>(), req); }
SV_DESTROY_HANDLER(DestroyQp)
SV_HANDLER(ImportQp) {
  const Qp& qp = obj.get<0>();
  rep.pd = qp.pd;
  rep.send_cq = qp.send_cq;
  rep.recv_cq = qp.recv_cq;
  rep.qp_type = qp.type;
  rep.max_send_wr = qp.sq_capacity;
  rep.max_recv_wr = qp.rq_capacity;
  rep.sq_sig_all = qp.sq_sig_all;
  rep.segment_size = qp.map.size();
  env.out_fds.push_back(qp.fd.get());
  return 0;
}
SV_HANDLER(ConnectPeer) {
  return env.registry.qp().connect_peer(env.client, obj.get<0>(), obj.id<0>(), rep, env.out_fds);
}
SV_HANDLER(ConnectUd) {
  return env.registry.qp().connect_ud(env.client, obj.get<0>(), req.dest, rep, env.out_fds);
}
SV_HANDLER(PeerError) { return env.registry.qp().peer_error(obj.id<0>(), req.wc_status); }
SV_HANDLER(Mediate) { return env.registry.mediate(env.client, obj.get<0>(), req, rep, env.deferred); }
SV_HANDLER(MediatePost) {
  (void)rep;  // never sent (Server::serve)
  return env.registry.mediate_posted(env.client, obj.get<0>(), req, env.deferred);
}
SV_HANDLER(PostRing) {
  (void)req;
  return env.post_ring ? env.post_ring(rep, env.out_fds) : EOPNOTSUPP;
}
SV_HANDLER(Wake) {
  (void)req;
  (void)rep;
  return env.wake ? env.wake(env.out_fds) : EOPNOTSUPP;
}
SV_HANDLER(MediateGone) { return env.registry.mediate_gone(obj.get<0>(), req.client); }
SV_HANDLER(AttachMcast) { return env.registry.qp().attach_mcast(env.client, obj.get<0>(), req); }
SV_HANDLER(DetachMcast) { return env.registry.qp().detach_mcast(obj.get<0>(), req); }
SV_HANDLER(RoceAttach) {
  (void)obj.get<0>();  // the QP: the caller's (the port keys its binding by req.qpn)
  // The connection's arrival socket pair, made at its first attach: two
  // descriptors of its user's quota.
  const uid_t uid = env.registry.client_uid(env.client);
  const bool had = env.roce.has_arrival(env.client);
  if (!had) {
    if (int e = env.registry.quotas().admit_fds(uid, 2)) return e;
  }
  const int e = env.roce.attach(env.client, uid, req, rep, env.out_fds);
  if (!had && env.roce.has_arrival(env.client))
    env.registry.quotas().charge_fds(Quotas::fd_key(env.client, Quotas::kRoceFds), uid, 2);
  return e;
}

// ---- SRQs and XRC ---------------------------------------------------------
SV_HANDLER(CreateSrq) {
  // Its PD and (XRC) CQ: the caller's; the SRQ records them.
  (void)obj.get<0>(), (void)obj.optional<2>();
  return env.registry.srq().create(env.client, obj.optional<1>(), req, rep, env.out_fds);
}
SV_DESTROY_HANDLER(DestroySrq)
SV_HANDLER(ImportSrq) {
  const Srq& srq = obj.get<0>();
  rep.pd = srq.pd;
  // The daemon's record: the header is memory every holder can write, and
  // an importer writes up to max_sge SGEs into each ring slot.
  rep.max_sge = srq.max_sge;
  rep.segment_size = srq.map.size();
  env.out_fds.push_back(srq.fd.get());
  return 0;
}
SV_HANDLER(SrqLimit) { return env.registry.srq().limit(obj.get<0>(), obj.id<0>()); }
SV_HANDLER(ResizeSrq) { return env.registry.srq().resize(obj.get<0>(), obj.id<0>(), req, rep, env.out_fds); }
SV_HANDLER(ResizeSrqDone) { return env.registry.srq().resize_done(obj.get<0>(), req); }
SV_HANDLER(GetSrq) {
  const Srq& srq = obj.get<0>();
  rep.pd = srq.pd;
  rep.max_sge = srq.max_sge;  // the daemon's record, as ImportSrq
  rep.segment_size = srq.map.size();
  env.out_fds.push_back(srq.fd.get());
  return 0;
}
SV_HANDLER(OpenXrcd) {
  Fd fd = env.in_fds.empty() ? Fd() : std::move(env.in_fds[0]);  // none: a private domain
  return env.registry.xrc().open(env.client, req, std::move(fd), rep.handle);
}
SV_DESTROY_HANDLER(CloseXrcd)
SV_HANDLER(ConnectXrc) { return env.registry.qp().connect_xrc(env.client, obj.get<0>(), req, rep, env.out_fds); }
SV_HANDLER(OpenQp) { return env.registry.qp().open_qp(env.client, obj.get<0>(), req, rep, env.out_fds); }

// ---- The namespace (docs/SHARING.md) --------------------------------------
SV_HANDLER(NsPublish) { return env.registry.names().publish(env.client, req); }
SV_HANDLER(NsUnpublish) { return env.registry.names().unpublish(env.client, req); }
SV_HANDLER(NsOpen) { return env.registry.names().open(env.client, req, rep); }
SV_HANDLER(NsList) {
  env.registry.names().list(std::string(req.after, ::strnlen(req.after, sizeof(req.after))), rep);
  return 0;
}
SV_HANDLER(ResList) { return env.registry.res_list(env.client, req, rep); }
SV_HANDLER(WireCounters) {
  env.registry.wire_counters(env.client, rep);
  return 0;
}
SV_HANDLER(Counters) { return env.registry.counters_page(env.client, req, rep); }
// ---- rdma_cm ports (cm_ports.h) -----------------------------------------
SV_HANDLER(CmBind) {
  int fd = -1;
  int e = env.registry.cm_bind(env.client, req, rep, fd);
  if (e == 0) env.out_fds.push_back(fd);
  return e;
}
SV_HANDLER(CmUnbind) { return env.registry.cm_unbind(env.client, req); }
#undef SV_DESTROY_HANDLER
#undef SV_HANDLER

// ---- The generic part -----------------------------------------------------
template <class Rep>
size_t encode(const proto::Header& req_h, Rep& rep, int status, uint8_t* out) {
  static_assert(sizeof(Rep) <= proto::kMaxMessage);
  rep.h = req_h;
  rep.h.status = status;
  std::memcpy(out, &rep, sizeof(Rep));
  return sizeof(Rep);
}

size_t refuse(const proto::Header& h, int status, uint8_t* out) {
  proto::Empty rep{};
  return encode(h, rep, status, out);
}

// Whether `fd` is of kind `k` (proto::in_fd_kind). Only calls that cannot
// block on any descriptor: fstat, fstatfs, getsockopt, getsockname,
// getpeername, fcntl F_GET_SEALS.
bool fd_is(proto::FdKind k, int fd) {
  struct stat st {};
  if (fd < 0 || ::fstat(fd, &st) != 0) return false;
  switch (k) {
    case proto::FdKind::kNone:
      return false;
    case proto::FdKind::kAnyFile:
      return true;
    case proto::FdKind::kSocket: {
      int type = 0;
      socklen_t l = sizeof type;
      return S_ISSOCK(st.st_mode) && ::getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &l) == 0;
    }
    case proto::FdKind::kWakeSocket:
      return is_wake_socket(fd);
    case proto::FdKind::kMemfd: {
      struct statfs sfs {};
      return S_ISREG(st.st_mode) && ::fstatfs(fd, &sfs) == 0 && sfs.f_type == TMPFS_MAGIC &&
             ::fcntl(fd, F_GET_SEALS) >= 0;
    }
  }
  return false;
}

// Decodes op `op`'s request (its length was checked), calls its handler and
// checks the descriptors of a successful reply against the declaration. On
// error no descriptor goes out.
template <Op op>
size_t run(CommandEnv& env, const proto::Header& h, const uint8_t* msg, size_t len, uint8_t* out) {
  using C = proto::Command<op>;
  if constexpr (C::info.event) {
    return refuse(h, EOPNOTSUPP, out);
  } else {
    Req<op> req;
    if (len != sizeof req) return refuse(h, EINVAL, out);
    // Every descriptor a client sends is of the kind its op declares,
    // before the handler sees it (docs/PROTOCOL.md, "Descriptors").
    for (const Fd& f : env.in_fds) {
      if (!fd_is(proto::in_fd_kind(op), f.get())) {
        SV_TRACE("daemon: %s: a descriptor of the wrong kind: refused", C::info.name);
        return refuse(h, EBADF, out);
      }
    }
    std::memcpy(&req, msg, sizeof req);
    Rep<op> rep{};
    Resolved<op> obj;
    int st = served<op>(env);
    if (st != 0) g_audit = {uint16_t(op), 0, 0, 0, true};
    if (st == 0) st = obj.resolve(env.registry, env.client, req);
    if (st == 0) {
      const uint64_t lookups = owner_lookups();
      st = handler<op>(env, req, rep, obj);
      if (st == 0) st = obj.destroy(env.registry, env.client);
      g_audit = {uint16_t(op), obj.declared(), obj.used(), owner_lookups() - lookups, false};
    }
    if (st == 0 && !proto::reply_matches<C>(rep, env.out_fds.size())) {
      SV_TRACE("daemon: %s: reply with %zu descriptors, not as declared", C::info.name, env.out_fds.size());
      st = EIO;
    }
    if (st != 0) env.out_fds.clear();
    return encode(h, rep, st, out);
  }
}

using Runner = size_t (*)(CommandEnv&, const proto::Header&, const uint8_t*, size_t, uint8_t*);

template <size_t... I>
constexpr std::array<Runner, sizeof...(I)> make_runners(std::index_sequence<I...>) {
  return {&run<Op(I + 1)>...};
}
// Indexed like proto::kOps.
constexpr auto kRunners = make_runners(std::make_index_sequence<size_t(Op::kCount) - 1>{});

}  // namespace

const HandleAudit& last_handle_audit() { return g_audit; }

size_t run_command(CommandEnv& env, const proto::Header& h, const uint8_t* msg, size_t len, uint8_t* out) {
  const proto::OpInfo* op = proto::op_info(h.op);
  if (!op) return refuse(h, EOPNOTSUPP, out);
  if (!op->in.allows(env.in_fds.size())) return refuse(h, EBADF, out);
  return kRunners[h.op - 1](env, h, msg, len, out);
}

}  // namespace sv::daemon
