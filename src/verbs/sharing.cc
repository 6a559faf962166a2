// Sharing objects between processes: rdma-core's import API and softverbs'
// extensions (include/softverbs/softverbs.h). A process imports a context by
// passing its command socket to the daemon; afterwards the context's objects
// are looked up by handle and mapped into the importer.
#include <sys/mman.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "softverbs/softverbs.h"
#include "verbs/provider.h"
#include "verbs/transport.h"

namespace sv::verbs {
namespace {

Pd* local_pd(ContextState& st, ibv_context* c, uint32_t handle) {
  {
    std::lock_guard<std::mutex> g(st.mu);
    if (auto it = st.pds.find(handle); it != st.pds.end()) return it->second;
  }
  return reinterpret_cast<Pd*>(ibv_import_pd(c, handle));
}

}  // namespace

ibv_pd* import_pd_handle(ibv_context* c, uint32_t handle) {
  Pd* p = local_pd(ctx_state(c), c, handle);
  return p ? &p->pd : nullptr;
}

Cq* import_cq_handle(ibv_context* c, uint32_t handle) {
  ContextState& cs = ctx_state(c);
  {
    std::lock_guard<std::mutex> g(cs.mu);
    if (auto it = cs.cq_handles.find(handle); it != cs.cq_handles.end()) return it->second;
  }
  proto::HandleReq req{};
  req.handle = handle;
  proto::ImportCqReply rep{};
  std::vector<Fd> fds;
  if (int e = cs.conn.call<proto::Op::ImportCq>(req, rep, {}, &fds); e || rep.capacity < 2) {
    errno = e ? e : EPROTO;
    return nullptr;
  }
  auto st = std::make_unique<CqState>();
  st->ctx = to_ctx(c);
  st->handle = handle;
  if (fds.empty()) {
    // Another user's CQ, granted by name: polled through the daemon, with
    // no segment (and no channel) here.
    st->granted = true;
    st->view.cs = &cs;
    st->view.handle = handle;
    ibv_cq* q = new_cq_handle(c, std::move(st), rep.capacity, nullptr, nullptr);
    return q ? to_cq(q) : nullptr;
  }
  // The CQ's completion channel, if this process has imported it already
  // (svx_import_comp_channel); otherwise the CQ is imported without one.
  Channel* ch = nullptr;
  if (rep.channel) {
    std::lock_guard<std::mutex> g(cs.mu);
    if (auto it = cs.channel_handles.find(rep.channel); it != cs.channel_handles.end()) ch = it->second;
  }
  st->channel = ch;
  st->view.cs = &cs;
  st->view.handle = handle;
  if (int e = st->view.attach(fds[0].get(), rep.segment_size)) {
    errno = e;
    return nullptr;
  }
  if (ch) st->view.channel_fd = ch->wake;
  ibv_cq* q = new_cq_handle(c, std::move(st), rep.capacity, ch ? &ch->ch : nullptr, nullptr);
  return q ? to_cq(q) : nullptr;
}

ibv_qp* import_qp_num(ibv_context* c, uint32_t qpn) {
  ContextState& cs = ctx_state(c);
  {
    std::lock_guard<std::mutex> g(cs.mu);
    if (auto it = cs.qp_handles.find(qpn); it != cs.qp_handles.end()) return &it->second->qpx.qp_base;
  }
  proto::HandleReq req{};
  req.handle = qpn;
  proto::ImportQpReply rep{};
  std::vector<Fd> fds;
  if (int e = cs.conn.call<proto::Op::ImportQp>(req, rep, {}, &fds)) {
    errno = e;
    return nullptr;
  }
  auto st = std::make_unique<ProcessQp>();
  st->ctx = to_ctx(c);
  st->qpn = qpn;
  st->type = ibv_qp_type(rep.qp_type);
  st->entry = cs.qp_slot(qpn);
  if (int e = attach_qp_segment(*st, fds[0].get(), rep.segment_size)) {
    errno = e;
    return nullptr;
  }
  // Created in a thread domain: its creator posts without the send lock, so
  // a second handle would post concurrently with it. Refused before its PD
  // and CQs are imported, which nobody would release.
  if (st->hdr->exclusive.load(std::memory_order_acquire)) {
    errno = EPERM;
    return nullptr;
  }
  // Each stops at the first failure, whose errno is the caller's.
  Pd* pd = local_pd(cs, c, rep.pd);
  if (!pd) return nullptr;
  Cq* scq = import_cq_handle(c, rep.send_cq);
  if (!scq) return nullptr;
  Cq* rcq = import_cq_handle(c, rep.recv_cq);
  if (!rcq) return nullptr;
  st->pd = pd;
  st->send_cq = scq;
  st->recv_cq = rcq;
  st->cap = {rep.max_send_wr, rep.max_recv_wr, shm::kMaxSge, shm::kMaxSge, shm::kMaxInline};
  st->sq_sig_all = rep.sq_sig_all != 0;
  st->attr.qp_state = ibv_qp_state(st->entry->state.load());
  st->attr.cap = st->cap;
  st->attr.dest_qp_num = st->entry->dest_qpn.load();
  choose_transport(*st);
  auto* qp = static_cast<QpHandle*>(std::calloc(1, sizeof(QpHandle)));
  if (!qp) {
    errno = ENOMEM;
    return nullptr;
  }
  ibv_qp& q = qp->qpx.qp_base;
  q.context = c;
  q.pd = &pd->pd;
  q.send_cq = reinterpret_cast<ibv_cq*>(&scq->cq);
  q.recv_cq = reinterpret_cast<ibv_cq*>(&rcq->cq);
  q.handle = qpn;
  q.qp_num = qpn;
  q.state = st->attr.qp_state;
  q.qp_type = st->type;
  pthread_mutex_init(&q.mutex, nullptr);
  pthread_cond_init(&q.cond, nullptr);
  st->self = qp;
  const uint64_t ops = st->hdr->send_ops.load(std::memory_order_acquire);
  const ibv_qp_type type = st->type;
  qp->st = st.release();
  // Created as an extended QP: this handle is one too, with the creator's
  // send ops (only those its type offers: the segment is the creator's to write).
  if (ops & shm::kSendOpsExtended) init_qp_ex(qp, ops & supported_send_ops(type));
  std::lock_guard<std::mutex> g(cs.mu);
  cs.qp_handles[qpn] = qp;
  return &q;
}

}  // namespace sv::verbs

using namespace sv;
using namespace sv::verbs;

namespace sv::verbs {

// Imports one object of a shared context into this process (svx_unpack,
// svx_open). An MR comes with its PD. 0 or an errno value.
int import_object(ibv_context* c, uint32_t type, uint32_t handle, svx_object& obj) {
  obj.type = svx_object_type(type);
  obj.ptr = nullptr;
  ContextState& st = ctx_state(c);
  errno = 0;
  switch (type) {
    case SVX_OBJ_PD:
      if (Pd* pd = local_pd(st, c, handle)) obj.pd = &pd->pd;
      break;
    case SVX_OBJ_MR: {
      proto::HandleReq req{};
      req.handle = handle;
      proto::QueryMrReply rep{};
      if (int e = st.conn.call<proto::Op::QueryMr>(req, rep)) return e;
      if (Pd* pd = local_pd(st, c, rep.pd)) obj.mr = ibv_import_mr(&pd->pd, handle);
      break;
    }
    case SVX_OBJ_CQ: obj.cq = svx_import_cq(c, handle); break;
    case SVX_OBJ_QP: obj.qp = svx_import_qp(c, handle); break;
    case SVX_OBJ_SRQ: obj.srq = svx_import_srq(c, handle); break;
    case SVX_OBJ_CHANNEL: obj.channel = svx_import_comp_channel(c, handle); break;
    default: return EINVAL;
  }
  return obj.ptr ? 0 : (errno ? errno : EPROTO);
}

}  // namespace sv::verbs

extern "C" {

ibv_pd* ibv_import_pd(ibv_context* c, uint32_t pd_handle) {
  ContextState& st = ctx_state(c);
  proto::HandleReq req{};
  req.handle = pd_handle;
  proto::Empty rep{};
  if (int e = st.conn.call<proto::Op::QueryPd>(req, rep)) {
    errno = e;
    return nullptr;
  }
  return new_pd_handle(c, pd_handle);
}

void ibv_unimport_pd(ibv_pd* ibpd) {
  ContextState& st = ctx_state(ibpd->context);
  {
    std::lock_guard<std::mutex> g(st.mu);
    if (auto it = st.pds.find(ibpd->handle); it != st.pds.end() && it->second == to_pd(ibpd)) st.pds.erase(it);
  }
  std::free(to_pd(ibpd));
}

ibv_mr* ibv_import_mr(ibv_pd* pd, uint32_t mr_handle) {
  ContextState& st = ctx_state(pd->context);
  proto::HandleReq req{};
  req.handle = mr_handle;
  proto::QueryMrReply rep{};
  if (int e = st.conn.call<proto::Op::QueryMr>(req, rep)) {
    errno = e;
    return nullptr;
  }
  if (rep.pd != to_pd(pd)->handle) {
    errno = EINVAL;
    return nullptr;
  }
  // The pages are the registrant's: this handle releases nothing at dereg.
  Mr* mr = new_mr_handle(pd, reinterpret_cast<void*>(rep.addr), rep.length, mr_handle, rep.key);
  if (!mr) {
    errno = ENOMEM;
    return nullptr;
  }
  return &mr->mr;
}

void ibv_unimport_mr(ibv_mr* mr) { std::free(to_mr(mr)); }

ibv_cq* svx_import_cq(ibv_context* c, uint32_t handle) {
  Cq* cq = import_cq_handle(c, handle);
  return cq ? reinterpret_cast<ibv_cq*>(&cq->cq) : nullptr;
}

void svx_unimport_cq(ibv_cq* ibcq) {
  Cq* cq = to_cq(ibcq);
  ContextState& cs = ctx_state(ibcq->context);
  {
    std::lock_guard<std::mutex> g(cs.mu);
    std::erase(cs.cqs, cq->st);
    if (auto it = cs.cq_handles.find(cq->st->handle); it != cs.cq_handles.end() && it->second == cq)
      cs.cq_handles.erase(it);
  }
  if (ibcq->channel) __atomic_sub_fetch(&ibcq->channel->refcnt, 1, __ATOMIC_RELAXED);
  pthread_cond_destroy(&ibcq->cond);
  pthread_mutex_destroy(&ibcq->mutex);
  delete cq->st;
  std::free(cq);
}

ibv_qp* svx_import_qp(ibv_context* c, uint32_t qpn) { return import_qp_num(c, qpn); }

ibv_qp* svx_resolve_qp(ibv_context* c, uint32_t qpn) { return import_qp_num(c, qpn); }

void svx_unimport_qp(ibv_qp* ibqp) {
  QpHandle* qp = to_qp(ibqp);
  ContextState& cs = ctx_state(ibqp->context);
  {
    std::lock_guard<std::mutex> g(cs.mu);
    if (auto it = cs.qp_handles.find(qp->st->qpn); it != cs.qp_handles.end() && it->second == qp)
      cs.qp_handles.erase(it);
  }
  progress_unregister(qp->st);
  pthread_cond_destroy(&ibqp->cond);
  pthread_mutex_destroy(&ibqp->mutex);
  delete qp->st;
  std::free(qp);
}

// ---- pack / unpack (seed 001) ------------------------------------------------

namespace {
constexpr uint32_t kPackMagic = 0x53565058;  // "SVPX"
struct PackHeader {
  uint32_t magic;
  uint16_t version;
  uint16_t count;
};
struct PackEntry {
  uint32_t type;
  uint32_t handle;
};
struct PackMessage {
  PackHeader h;
  PackEntry e[SVX_MAX_PACKED];
};
}  // namespace

int svx_pack(int sock, ibv_context* c, const svx_object* objs, int count) {
  if (!c || count < 0 || count > SVX_MAX_PACKED || (count && !objs)) return EINVAL;
  PackMessage m{};
  m.h = {kPackMagic, 1, uint16_t(count)};
  for (int i = 0; i < count; ++i) {
    m.e[i].type = objs[i].type;
    switch (objs[i].type) {
      case SVX_OBJ_PD: m.e[i].handle = objs[i].pd->handle; break;
      case SVX_OBJ_MR: m.e[i].handle = objs[i].mr->handle; break;
      case SVX_OBJ_CQ: m.e[i].handle = objs[i].cq->handle; break;
      case SVX_OBJ_QP: m.e[i].handle = objs[i].qp->qp_num; break;
      case SVX_OBJ_SRQ: m.e[i].handle = objs[i].srq->handle; break;
      case SVX_OBJ_CHANNEL: m.e[i].handle = svx_comp_channel_handle(objs[i].channel); break;
      default: return EINVAL;
    }
  }
  int fds[1] = {c->cmd_fd};
  return send_message(sock, &m, sizeof(PackHeader) + sizeof(PackEntry) * size_t(count), fds);
}

int svx_unpack(int sock, ibv_context** out, svx_object* objs, int max, int* count) {
  if (!out || !count || max < 0) return EINVAL;
  PackMessage m{};
  size_t len = 0;
  std::vector<Fd> fds;
  if (int e = recv_message(sock, &m, sizeof(m), &len, fds)) return e;
  if (len < sizeof(PackHeader) || m.h.magic != kPackMagic || m.h.version != 1 || m.h.count > SVX_MAX_PACKED ||
      len != sizeof(PackHeader) + sizeof(PackEntry) * m.h.count || fds.size() != 1)
    return EPROTO;
  if (m.h.count > max) return ENOSPC;
  ibv_context* c = ibv_import_device(fds[0].get());
  if (!c) return errno;
  for (int i = 0; i < m.h.count; ++i) {
    if (int e = import_object(c, m.e[i].type, m.e[i].handle, objs[i])) {
      ibv_close_device(c);
      return e;
    }
  }
  *out = c;
  *count = m.h.count;
  return 0;
}

}  // extern "C"
