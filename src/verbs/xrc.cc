// XRC (IBTA annex A14): XRC domains, XRC SRQs and ibv_open_qp. The domain,
// the SRQs and the target QPs live in the daemon (XrcDomains::open, daemon/xrc.h, and
// the XRC parts of create_srq/create_qp); XRC_SEND work requests run in the
// requester (xrc_peer in requester.cc), which reaches the SRQ a message
// names through the connected target QP.
//
// Thread safety: as every verb (one daemon call each); handles are
// process-local and freed by the close/destroy verb.
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "verbs/provider.h"
#include "verbs/transport.h"

namespace sv::verbs {

namespace {

struct Xrcd {
  ibv_xrcd x;  // what clients hold
  uint32_t handle;
};

}  // namespace

uint32_t xrcd_handle(ibv_xrcd* x) { return reinterpret_cast<Xrcd*>(x)->handle; }

// ibv_open_xrcd(3): both FD and OFLAGS must be given (as rdma-core's
// ibv_cmd_open_xrcd requires); fd -1 makes a private domain.
ibv_xrcd* open_xrcd(ibv_context* c, ibv_xrcd_init_attr* attr) {
  if (!attr || (attr->comp_mask & ~uint32_t(IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS))) {
    errno = attr ? EOPNOTSUPP : EINVAL;
    return nullptr;
  }
  if (!(attr->comp_mask & IBV_XRCD_INIT_ATTR_FD) || !(attr->comp_mask & IBV_XRCD_INIT_ATTR_OFLAGS) ||
      attr->fd < -1) {
    errno = EINVAL;
    return nullptr;
  }
  ContextState& cs = ctx_state(c);
  proto::OpenXrcdReq req{};
  req.oflags = uint32_t(attr->oflags);
  req.has_fd = attr->fd >= 0 ? 1 : 0;
  proto::HandleReply rep{};
  int fds[1] = {attr->fd};
  std::span<const int> send = req.has_fd ? std::span<const int>(fds, 1) : std::span<const int>();
  if (int e = cs.conn.call<proto::Op::OpenXrcd>(req, rep, send)) {
    errno = e;
    return nullptr;
  }
  auto* x = static_cast<Xrcd*>(std::calloc(1, sizeof(Xrcd)));
  if (!x) {
    errno = ENOMEM;
    return nullptr;
  }
  x->x.context = c;
  x->handle = rep.handle;
  return &x->x;
}

int close_xrcd(ibv_xrcd* xrcd) {
  auto* x = reinterpret_cast<Xrcd*>(xrcd);
  ContextState& cs = ctx_state(xrcd->context);
  proto::HandleReq req{};
  req.handle = x->handle;
  proto::Empty rep{};
  if (int e = destroy_result(cs, cs.conn.call<proto::Op::CloseXrcd>(req, rep))) return e;
  std::free(x);
  return 0;
}

// ibv_create_srq_ex(3): a basic SRQ, or an XRC SRQ (which needs its XRC
// domain and its CQ). Tag matching SRQs are not supported.
ibv_srq* create_srq_ex(ibv_context* c, ibv_srq_init_attr_ex* a) {
  constexpr uint32_t known = IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_XRCD |
                             IBV_SRQ_INIT_ATTR_CQ;
  if (a->comp_mask & ~known) {
    errno = EOPNOTSUPP;
    return nullptr;
  }
  uint32_t type = (a->comp_mask & IBV_SRQ_INIT_ATTR_TYPE) ? uint32_t(a->srq_type) : uint32_t(IBV_SRQT_BASIC);
  if (type == IBV_SRQT_TM) {
    errno = EOPNOTSUPP;
    return nullptr;
  }
  if (!(a->comp_mask & IBV_SRQ_INIT_ATTR_PD) || !a->pd || type > IBV_SRQT_XRC) {
    errno = EINVAL;
    return nullptr;
  }
  uint32_t xrcd = 0;
  ibv_cq* cq = nullptr;
  if (type == IBV_SRQT_XRC) {
    if (!(a->comp_mask & IBV_SRQ_INIT_ATTR_XRCD) || !(a->comp_mask & IBV_SRQ_INIT_ATTR_CQ) || !a->xrcd || !a->cq ||
        a->xrcd->context != c) {
      errno = EINVAL;
      return nullptr;
    }
    xrcd = xrcd_handle(a->xrcd);
    cq = a->cq;
  }
  return create_srq(c, a->pd, a->attr, a->srq_context, type, xrcd, cq);
}

int get_srq_num(ibv_srq* srq, uint32_t* num) {
  SrqState& st = *reinterpret_cast<Srq*>(srq)->st;
  if (st.srq_type != IBV_SRQT_XRC) return EINVAL;  // only XRC SRQs are addressed by number
  *num = st.handle;
  return 0;
}

// ibv_open_qp(3): a handle of an XRC target QP of a domain this context opened.
ibv_qp* open_qp(ibv_context* c, ibv_qp_open_attr* a) {
  constexpr uint32_t need = IBV_QP_OPEN_ATTR_NUM | IBV_QP_OPEN_ATTR_XRCD | IBV_QP_OPEN_ATTR_TYPE;
  if (!a || (a->comp_mask & need) != need || a->comp_mask >= IBV_QP_OPEN_ATTR_RESERVED || !a->xrcd ||
      a->xrcd->context != c || a->qp_type != IBV_QPT_XRC_RECV) {
    errno = EINVAL;
    return nullptr;
  }
  ContextState& cs = ctx_state(c);
  proto::OpenQpReq req{};
  req.qpn = a->qp_num;
  req.xrcd = xrcd_handle(a->xrcd);
  proto::ImportQpReply rep{};
  std::vector<Fd> fds;
  if (int e = cs.conn.call<proto::Op::OpenQp>(req, rep, {}, &fds)) {
    errno = e;
    return nullptr;
  }
  auto st = std::make_unique<ProcessQp>();
  st->ctx = to_ctx(c);
  st->qpn = a->qp_num;
  st->type = IBV_QPT_XRC_RECV;
  st->pd = nullptr;
  st->send_cq = st->recv_cq = nullptr;
  st->entry = cs.qp_slot(a->qp_num);
  if (int e = attach_qp_segment(*st, fds[0].get(), rep.segment_size)) {
    errno = e;
    return nullptr;
  }
  st->cap = {};
  st->sq_sig_all = false;
  st->attr.qp_state = ibv_qp_state(st->entry->state.load());
  st->attr.dest_qp_num = st->entry->dest_qpn.load();
  choose_transport(*st);
  auto* qp = static_cast<QpHandle*>(std::calloc(1, sizeof(QpHandle)));
  if (!qp) {
    errno = ENOMEM;
    return nullptr;
  }
  ibv_qp& q = qp->qpx.qp_base;
  q.context = c;
  q.qp_context = (a->comp_mask & IBV_QP_OPEN_ATTR_CONTEXT) ? a->qp_context : nullptr;
  q.handle = a->qp_num;
  q.qp_num = a->qp_num;
  q.state = st->attr.qp_state;
  q.qp_type = IBV_QPT_XRC_RECV;
  pthread_mutex_init(&q.mutex, nullptr);
  pthread_cond_init(&q.cond, nullptr);
  st->self = qp;
  qp->st = st.release();
  std::lock_guard<std::mutex> g(cs.mu);
  cs.qp_handles.emplace(a->qp_num, qp);  // keeps the first handle if this process has one
  return &q;
}

}  // namespace sv::verbs
