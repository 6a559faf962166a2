// The namespace calls of softverbs.h: publishing objects under names and
// opening them by name (docs/SHARING.md). The daemon checks names, modes
// and credentials; this side only forwards and imports.
#include <netinet/in.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>

#include "softverbs/softverbs.h"
#include "verbs/provider.h"

using namespace sv;
using namespace sv::verbs;

extern "C" {

int svx_publish(ibv_context* c, const char* name, const svx_object* obj, unsigned int mode, int group) {
  if (!c || !name || !obj || !obj->ptr || std::strlen(name) >= SVX_NAME_MAX) return EINVAL;
  proto::NsPublishReq req{};
  switch (obj->type) {
    case SVX_OBJ_PD: req.handle = obj->pd->handle; break;
    case SVX_OBJ_MR: req.handle = obj->mr->handle; break;
    case SVX_OBJ_CQ: req.handle = obj->cq->handle; break;
    case SVX_OBJ_QP: req.handle = obj->qp->qp_num; break;
    case SVX_OBJ_SRQ: req.handle = obj->srq->handle; break;
    case SVX_OBJ_CHANNEL: req.handle = svx_comp_channel_handle(obj->channel); break;
    default: return EINVAL;
  }
  req.kind = uint32_t(obj->type);
  req.mode = mode;
  req.group = group;
  std::memcpy(req.name, name, std::strlen(name));
  proto::Empty rep{};
  return ctx_state(c).conn.call<proto::Op::NsPublish>(req, rep);
}

int svx_unpublish(ibv_context* c, const char* name) {
  if (!c || !name || std::strlen(name) >= SVX_NAME_MAX) return EINVAL;
  proto::NsNameReq req{};
  std::memcpy(req.name, name, std::strlen(name));
  proto::Empty rep{};
  return ctx_state(c).conn.call<proto::Op::NsUnpublish>(req, rep);
}

}  // extern "C"

namespace {

// The CmBind fields of an address; false for a family other than IPv4/6.
bool cm_fields(int ps, const sockaddr* addr, uint16_t port, proto::CmBindReq& req) {
  if (!addr || ps < 0) return false;
  req.ps = uint32_t(ps);
  req.port = port;
  req.family = addr->sa_family;
  if (addr->sa_family == AF_INET)
    std::memcpy(req.addr, &reinterpret_cast<const sockaddr_in*>(addr)->sin_addr, 4);
  else if (addr->sa_family == AF_INET6)
    std::memcpy(req.addr, &reinterpret_cast<const sockaddr_in6*>(addr)->sin6_addr, 16);
  else
    return false;
  return true;
}

}  // namespace

extern "C" {

int svx_cm_bind(ibv_context* c, int ps, const sockaddr* addr, uint16_t* port_out, int* fd_out) {
  proto::CmBindReq req{};
  if (!c || !port_out || !fd_out) return EINVAL;
  uint16_t port = 0;
  if (addr && addr->sa_family == AF_INET) port = ntohs(reinterpret_cast<const sockaddr_in*>(addr)->sin_port);
  if (addr && addr->sa_family == AF_INET6) port = ntohs(reinterpret_cast<const sockaddr_in6*>(addr)->sin6_port);
  if (!cm_fields(ps, addr, port, req)) return EAFNOSUPPORT;
  proto::CmBindReply rep{};
  std::vector<Fd> fds;
  if (int e = ctx_state(c).conn.call<proto::Op::CmBind>(req, rep, {}, &fds)) return e;
  *port_out = rep.port;
  *fd_out = fds.at(0).release();
  return 0;
}

int svx_cm_unbind(ibv_context* c, int ps, const sockaddr* addr, uint16_t port) {
  proto::CmBindReq req{};
  if (!c || !cm_fields(ps, addr, port, req)) return EINVAL;
  proto::Empty rep{};
  return ctx_state(c).conn.call<proto::Op::CmUnbind>(req, rep);
}

ibv_context* svx_open(const char* name, int access, svx_object* obj) {
  if (!name || !obj || std::strlen(name) >= SVX_NAME_MAX || (access & (SVX_OPEN_READ | SVX_OPEN_WRITE)) == 0 ||
      (access & ~(SVX_OPEN_READ | SVX_OPEN_WRITE | SVX_OPEN_OWN))) {
    errno = EINVAL;
    return nullptr;
  }
  NsAttach ns{name, uint32_t(access & (SVX_OPEN_READ | SVX_OPEN_WRITE)), {}};
  ns.flags = (access & SVX_OPEN_OWN) ? proto::kNsOwn : 0;
  ibv_context* c = make_context(-1, &ns);
  if (!c) return nullptr;
  if (int e = import_object(c, ns.rep.kind, ns.rep.handle, *obj)) {
    ibv_close_device(c);
    errno = e;
    return nullptr;
  }
  return c;
}

}  // extern "C"
