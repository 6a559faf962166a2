// The namespace calls of softverbs.h: publishing objects under names and
// opening them by name (docs/SHARING.md). The daemon checks names, modes
// and credentials; this side only forwards and imports.
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
