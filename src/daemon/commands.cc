// commands.cc: each op's handler, and the generic checks around it (see
// commands.h). A handler decodes nothing and checks no descriptor count:
// run_command has done both from the op's declaration (common/protocol.h).
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

#include "common/paths.h"
#include "common/trace.h"

namespace sv::daemon {
namespace {

using proto::Op;
template <Op op>
using Req = typename proto::Command<op>::Req;
template <Op op>
using Rep = typename proto::Command<op>::Rep;

// The handler of op `op`: returns the reply's status (0 or a positive
// errno) and fills `rep` and env.out_fds. Specialised once per op below
// (but AsyncEvent, which the daemon only sends); one missing does not link.
template <Op op>
int handler(CommandEnv& env, const Req<op>& req, Rep<op>& rep);

#define SV_HANDLER(op_)                                                                          \
  template <>                                                                                    \
  int handler<Op::op_>([[maybe_unused]] CommandEnv & env, [[maybe_unused]] const Req<Op::op_>& req, \
                       [[maybe_unused]] Rep<Op::op_>& rep)

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
  env.registry.accounts(rep);
  return 0;
}

// ---- PD, backings, MRs, windows -------------------------------------------
SV_HANDLER(AllocPd) { return env.registry.alloc_pd(env.client, rep.handle); }
SV_HANDLER(DeallocPd) { return env.registry.dealloc_pd(env.client, req.handle); }
SV_HANDLER(QueryPd) { return env.registry.query_pd(env.client, req.handle); }
SV_HANDLER(RegBacking) { return env.registry.reg_backing(env.client, std::move(env.in_fds[0]), rep.handle); }
SV_HANDLER(RegMr) { return env.registry.reg_mr(env.client, req, rep); }
SV_HANDLER(ReregMr) { return env.registry.rereg_mr(env.client, req, rep); }
SV_HANDLER(DeregMr) { return env.registry.dereg_mr(env.client, req.handle); }
SV_HANDLER(QueryMr) { return env.registry.query_mr(env.client, req.handle, rep); }
SV_HANDLER(GetMrBacking) { return env.registry.get_mr_backing(env.client, req.key, rep, env.out_fds); }
SV_HANDLER(RegShmid) { return env.registry.reg_shmid(env.client, req, rep, env.out_fds); }
SV_HANDLER(RegShared) { return env.registry.reg_shared(env.client, req, rep); }
SV_HANDLER(AllocMw) { return env.registry.alloc_mw(env.client, req, rep); }
SV_HANDLER(DeallocMw) { return env.registry.dealloc_mw(env.client, req.handle); }
SV_HANDLER(BindMw) { return env.registry.bind_mw(env.client, req, rep); }
SV_HANDLER(InvalidateKey) { return env.registry.invalidate(env.client, req); }
SV_HANDLER(AllocDm) { return env.registry.alloc_dm(env.client, req, rep, env.out_fds); }
SV_HANDLER(FreeDm) { return env.registry.free_dm(env.client, req.handle); }
SV_HANDLER(ImportDm) { return env.registry.import_dm(env.client, req.handle, rep, env.out_fds); }
SV_HANDLER(RegDmMr) { return env.registry.reg_dm_mr(env.client, req, rep); }

// ---- Channels and CQs -----------------------------------------------------
SV_HANDLER(CreateChannel) {
  return env.registry.create_channel(env.client, std::move(env.in_fds[0]), std::move(env.in_fds[1]), rep.handle);
}
SV_HANDLER(DestroyChannel) { return env.registry.destroy_channel(env.client, req.handle); }
SV_HANDLER(ImportChannel) { return env.registry.import_channel(env.client, req.handle, env.out_fds); }
SV_HANDLER(CreateCq) { return env.registry.create_cq(env.client, req, rep, env.out_fds); }
SV_HANDLER(DestroyCq) { return env.registry.destroy_cq(env.client, req.handle); }
SV_HANDLER(ImportCq) { return env.registry.import_cq(env.client, req.handle, rep, env.out_fds); }
SV_HANDLER(ResizeCq) { return env.registry.resize_cq(env.client, req, rep, env.out_fds); }
SV_HANDLER(ResizeCqDone) { return env.registry.resize_cq_done(env.client, req); }
SV_HANDLER(GetCq) { return env.registry.get_cq(env.client, req.handle, rep, env.out_fds); }
SV_HANDLER(CqError) { return env.registry.cq_error(env.client, req.handle); }
SV_HANDLER(PollCq) { return env.registry.poll_granted_cq(env.client, req, rep); }

// ---- QPs ------------------------------------------------------------------
SV_HANDLER(CreateQp) { return env.registry.create_qp(env.client, req, rep, env.out_fds); }
SV_HANDLER(ModifyQp) { return env.registry.modify_qp(env.client, req); }
SV_HANDLER(DestroyQp) { return env.registry.destroy_qp(env.client, req.handle); }
SV_HANDLER(ImportQp) { return env.registry.import_qp(env.client, req.handle, rep, env.out_fds); }
SV_HANDLER(ConnectPeer) { return env.registry.connect_peer(env.client, req.handle, rep, env.out_fds); }
SV_HANDLER(ConnectUd) { return env.registry.connect_ud(env.client, req.qpn, req.dest, rep, env.out_fds); }
SV_HANDLER(PeerError) { return env.registry.peer_error(env.client, req.handle, req.wc_status); }
SV_HANDLER(Mediate) { return env.registry.mediate(env.client, req, rep, env.deferred); }
SV_HANDLER(MediatePost) {
  (void)rep;  // never sent (Server::serve)
  return env.registry.mediate_posted(env.client, req, env.deferred);
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
SV_HANDLER(MediateGone) { return env.registry.mediate_gone(env.client, req.qpn, req.client); }
SV_HANDLER(AttachMcast) { return env.registry.attach_mcast(env.client, req); }
SV_HANDLER(DetachMcast) { return env.registry.detach_mcast(env.client, req); }
SV_HANDLER(RoceAttach) {
  if (!env.roce.opened()) return EOPNOTSUPP;  // SOFTVERBS_ROCE=0
  if (!env.registry.holds_qp(env.client, req.qpn)) return EINVAL;
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
SV_HANDLER(CreateSrq) { return env.registry.create_srq(env.client, req, rep, env.out_fds); }
SV_HANDLER(DestroySrq) { return env.registry.destroy_srq(env.client, req.handle); }
SV_HANDLER(ImportSrq) { return env.registry.import_srq(env.client, req.handle, rep, env.out_fds); }
SV_HANDLER(SrqLimit) { return env.registry.srq_limit(env.client, req.handle); }
SV_HANDLER(OpenXrcd) {
  Fd fd = env.in_fds.empty() ? Fd() : std::move(env.in_fds[0]);  // none: a private domain
  return env.registry.open_xrcd(env.client, req, std::move(fd), rep.handle);
}
SV_HANDLER(CloseXrcd) { return env.registry.close_xrcd(env.client, req.handle); }
SV_HANDLER(ConnectXrc) { return env.registry.connect_xrc(env.client, req, rep, env.out_fds); }
SV_HANDLER(OpenQp) { return env.registry.open_qp(env.client, req, rep, env.out_fds); }

// ---- The namespace (docs/SHARING.md) --------------------------------------
SV_HANDLER(NsPublish) { return env.registry.ns_publish(env.client, req); }
SV_HANDLER(NsUnpublish) { return env.registry.ns_unpublish(env.client, req); }
SV_HANDLER(NsOpen) { return env.registry.ns_open(env.client, req, rep); }
SV_HANDLER(NsList) {
  env.registry.ns_list(std::string(req.after, ::strnlen(req.after, sizeof(req.after))), rep);
  return 0;
}
// ---- rdma_cm ports (cm_ports.h) -----------------------------------------
SV_HANDLER(CmBind) {
  int fd = -1;
  int e = env.registry.cm_bind(env.client, req, rep, fd);
  if (e == 0) env.out_fds.push_back(fd);
  return e;
}
SV_HANDLER(CmUnbind) { return env.registry.cm_unbind(env.client, req); }
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
    int st = handler<op>(env, req, rep);
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

size_t run_command(CommandEnv& env, const proto::Header& h, const uint8_t* msg, size_t len, uint8_t* out) {
  const proto::OpInfo* op = proto::op_info(h.op);
  if (!op) return refuse(h, EOPNOTSUPP, out);
  if (!op->in.allows(env.in_fds.size())) return refuse(h, EBADF, out);
  return kRunners[h.op - 1](env, h, msg, len, out);
}

}  // namespace sv::daemon
