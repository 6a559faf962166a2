// xrc.cc: XRC domains, XRC SRQs' reach and target QPs (IBTA annex A14;
// ibv_open_xrcd(3), ibv_open_qp(3)).
#include "daemon/registry.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/trace.h"

namespace sv::daemon {

using namespace sv::shm;

void Registry::xrcd_drop_if_unused(uint32_t id) {
  auto it = xrcds_.find(id);
  if (it == xrcds_.end() || it->second.opens != 0 || it->second.refs != 0) return;
  if (it->second.ino) xrcd_by_file_.erase({it->second.uid, it->second.dev, it->second.ino});
  xrcds_.erase(it);
}

// ibv_open_xrcd(3), as the kernel does it: a file names a domain by its
// inode, shared by every opener; without O_CREAT the domain must exist, with
// O_EXCL it must not. No file (fd -1): a new private domain.
int Registry::open_xrcd(uint32_t client, const proto::OpenXrcdReq& req, Fd fd, uint32_t& handle) {
  if (req.has_fd > 1 || bool(req.has_fd) != fd.valid()) return EINVAL;
  if (int e = quotas_.admit(Quotas::kXrcd, client_uid(client))) return e;
  uint32_t id = 0;
  if (fd.valid()) {
    struct stat st;
    if (::fstat(fd.get(), &st) != 0) return EBADF;
    // Per user too: under the system daemon no object is shared between
    // users unless mediated, and a target QP would be (ibv_open_qp).
    uint32_t uid = clients_[client].uid;
    const std::tuple<uint32_t, uint64_t, uint64_t> file{uid, uint64_t(st.st_dev), uint64_t(st.st_ino)};
    if (auto f = xrcd_by_file_.find(file); st.st_ino && f != xrcd_by_file_.end()) id = f->second;
    if (id && (req.oflags & O_EXCL)) return EINVAL;
    if (!id && !(req.oflags & O_CREAT)) return EINVAL;
    if (!id) {
      id = next_xrcd_++;
      Xrcd& x = xrcds_[id];
      x.dev = uint64_t(st.st_dev);
      x.ino = uint64_t(st.st_ino);
      x.uid = uid;
      if (st.st_ino) xrcd_by_file_[file] = id;
    }
  } else {
    id = next_xrcd_++;
    xrcds_[id] = Xrcd{};
  }
  xrcds_[id].opens++;
  handle = next_handle_++;
  quotas_.charge(Quotas::kXrcd, handle, client_uid(client));
  XrcdHandle h;
  h.owner = ctx(client);
  h.xrcd = id;
  xrcd_handles_.insert(handle, std::move(h));
  return 0;
}

// The destroy hook of a domain's handle (ibv_close_xrcd(3)).
int Registry::close_xrcd_handle(uint32_t, uint32_t handle) {
  const uint32_t id = xrcd_handles_.at(handle).xrcd;
  Xrcd& x = xrcds_[id];
  // The last handle of a domain that SRQs or target QPs still use.
  if (x.opens == 1 && x.refs) return EBUSY;
  release_xrcd_handle(handle);
  return 0;
}

void Registry::release_xrcd_handle(uint32_t handle) {
  auto it = xrcd_handles_.find(handle);
  if (it == xrcd_handles_.end()) return;
  const uint32_t id = it->second.xrcd;
  forget(ObjKind::kXrcdHandle, handle);
  if (Xrcd* x = xrcds_.get(id)) x->opens--;
  xrcd_drop_if_unused(id);
}

// Whether one of the context's XRC_SEND QPs is connected to a target QP of
// the SRQ's domain, i.e. may deliver into that SRQ.
bool Registry::xrc_reaches_srq(uint32_t context, const Srq& srq) {
  if (srq.type != IBV_SRQT_XRC) return false;
  for (uint32_t qpn : qps_.of(context)) {
    if (qps_.at(qpn).type != IBV_QPT_XRC_SEND) continue;
    auto t = qps_.find(qp_slot(qpn).dest_qpn.load());
    if (t != qps_.end() && t->second.type == IBV_QPT_XRC_RECV && t->second.xrcd == srq.xrcd) return true;
  }
  return false;
}

// IBTA annex A14: an XRC message names the SRQ that takes it; the SRQ must be in
// the target QP's domain. EAGAIN: the target is not ready (the requester
// retries); ENOENT: no such SRQ there (an invalid request).
int Registry::connect_xrc(uint32_t client, const Qp& my_qp, const proto::ConnectXrcReq& req,
                          proto::ConnectPeerReply& rep, std::vector<int>& out_fds) {
  const Qp* qp = &my_qp;
  if (qp->type != IBV_QPT_XRC_SEND && qp->type != IBV_QPT_XRC_RECV) return EINVAL;
  // An XRC target whose initiator is on another host (docs/ROCE.md, XRC on
  // the wire): the caller runs the target's transport and asks for the SRQ
  // a request names, in the target's own XRC domain (IBTA annex A14).
  const bool wire_target = qp->type == IBV_QPT_XRC_RECV;
  uint32_t dest = wire_target ? req.qpn : qp_slot(req.qpn).dest_qpn.load();
  auto tgt = qps_.find(dest);
  if (tgt == qps_.end()) return EAGAIN;
  const QpEntry& te = qp_slot(dest);
  auto st = ibv_qp_state(te.state.load());
  if (tgt->second.type != IBV_QPT_XRC_RECV || (!wire_target && te.dest_qpn.load() != req.qpn)) return EAGAIN;
  // XRC is not mediated between users; the requester reads the target's
  // entry in its own user's device segment.
  if (!same_user(client, tgt->second.owner) || !same_tables(client, tgt->second.owner)) return EACCES;
  if (st != IBV_QPS_RTR && st != IBV_QPS_RTS) return EAGAIN;
  auto srq = srqs_.find(req.srqn);
  if (srq == srqs_.end() || srq->second.type != IBV_SRQT_XRC || srq->second.xrcd != tgt->second.xrcd) return ENOENT;
  auto cq = cqs_.find(srq->second.cq);
  if (cq == cqs_.end()) return ENOENT;
  rep.peer_qpn = dest;
  rep.peer_recv_cq = srq->second.cq;
  rep.qp_segment_size = tgt->second.map.size();
  rep.cq_segment_size = cq->second.map.size();
  out_fds.push_back(tgt->second.fd.get());
  out_fds.push_back(cq->second.fd.get());
  out_fds.push_back(srq->second.fd.get());
  rep.has_srq = 1;
  rep.srq_segment_size = srq->second.map.size();
  rep.srq_handle = req.srqn;
  rep.pd = srq->second.pd;
  rep.has_channel = 0;
  if (auto ch = channels_.find(cq->second.channel); ch != channels_.end()) {
    out_fds.push_back(ch->second.wake.get());
    rep.has_channel = 1;
  }
  return 0;
}

// ibv_open_qp(3): another handle of an XRC target QP, for a context that
// opened the QP's domain.
int Registry::open_qp(uint32_t client, const XrcdHandle& xh, const proto::OpenQpReq& req, proto::ImportQpReply& rep,
                      std::vector<int>& out_fds) {
  const uint32_t xrcd = xh.xrcd;
  auto it = qps_.find(req.qpn);
  if (it == qps_.end() || it->second.type != IBV_QPT_XRC_RECV || it->second.xrcd != xrcd) return EINVAL;
  Qp& q = it->second;
  q.holders.push_back(ctx(client));  // one entry per handle: each is destroyed on its own
  xrc_handles_.insert({ctx(client), req.qpn});
  rep.qp_type = q.type;
  rep.segment_size = q.map.size();
  out_fds.push_back(q.fd.get());
  return 0;
}

}  // namespace sv::daemon
