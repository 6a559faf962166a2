// xrc.cc: XRC domains (IBTA annex A14; ibv_open_xrcd(3)).
#include "daemon/xrc.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <cerrno>

namespace sv::daemon {

void XrcDomains::drop_if_unused(uint32_t id) {
  auto it = xrcds_.find(id);
  if (it == xrcds_.end() || it->second.opens != 0 || it->second.refs != 0) return;
  if (it->second.ino) by_file_.erase({it->second.uid, it->second.dev, it->second.ino});
  xrcds_.erase(it);
}

// ibv_open_xrcd(3), as the kernel does it: a file names a domain by its
// inode, shared by every opener; without O_CREAT the domain must exist, with
// O_EXCL it must not. No file (fd -1): a new private domain.
int XrcDomains::open(uint32_t client, const proto::OpenXrcdReq& req, Fd fd, uint32_t& handle) {
  if (req.has_fd > 1 || bool(req.has_fd) != fd.valid()) return EINVAL;
  Quotas& quotas = host_.quotas();
  if (int e = quotas.admit(Quotas::kXrcd, host_.client_uid(client))) return e;
  uint32_t id = 0;
  if (fd.valid()) {
    struct stat st;
    if (::fstat(fd.get(), &st) != 0) return EBADF;
    // Per user too: under the system daemon no object is shared between
    // users unless mediated, and a target QP would be (ibv_open_qp).
    const uint32_t uid = host_.client_uid(client);
    const std::tuple<uint32_t, uint64_t, uint64_t> file{uid, uint64_t(st.st_dev), uint64_t(st.st_ino)};
    if (auto f = by_file_.find(file); st.st_ino && f != by_file_.end()) id = f->second;
    if (id && (req.oflags & O_EXCL)) return EINVAL;
    if (!id && !(req.oflags & O_CREAT)) return EINVAL;
    if (!id) {
      id = next_xrcd_++;
      Xrcd& x = xrcds_[id];
      x.dev = uint64_t(st.st_dev);
      x.ino = uint64_t(st.st_ino);
      x.uid = uid;
      if (st.st_ino) by_file_[file] = id;
    }
  } else {
    id = next_xrcd_++;
    xrcds_[id] = Xrcd{};
  }
  xrcds_[id].opens++;
  handle = host_.take_handle();
  quotas.charge(Quotas::kXrcd, handle, host_.client_uid(client));
  XrcdHandle h;
  h.owner = host_.context_of(client);
  h.xrcd = id;
  handles_.insert(handle, std::move(h));
  return 0;
}

// The destroy hook of a domain's handle (ibv_close_xrcd(3)).
int XrcDomains::close(uint32_t handle) {
  const uint32_t id = handles_.at(handle).xrcd;
  Xrcd& x = xrcds_[id];
  // The last handle of a domain that SRQs or target QPs still use.
  if (x.opens == 1 && x.refs) return EBUSY;
  release(handle);
  return 0;
}

void XrcDomains::release(uint32_t handle) {
  auto it = handles_.find(handle);
  if (it == handles_.end()) return;
  const uint32_t id = it->second.xrcd;
  host_.forget(ObjKind::kXrcdHandle, handle);
  if (Xrcd* x = xrcds_.get(id)) x->opens--;
  drop_if_unused(id);
}

}  // namespace sv::daemon
