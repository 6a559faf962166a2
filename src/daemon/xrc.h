// xrc.h: XRC domains (IBTA annex A14; ibv_open_xrcd(3)): the domain table
// (owned by no context: a domain lives while opened or used), the table of
// the handles contexts hold of them, and the domains opened through a file
// (xrc.cc). The registry composes it and reaches the tables for resolve,
// destroy, references and a context's release; it reaches the registry
// through ObjectHost. XRC QPs and SRQs are their own types' (qp.h, srq.h).
//
// Contract: single-threaded (the daemon's loop), as the registry.
#pragma once

#include <cstdint>
#include <map>
#include <tuple>

#include "common/protocol.h"
#include "common/sys.h"
#include "daemon/object_host.h"
#include "daemon/objects.h"

namespace sv::daemon {

class XrcDomains {
 public:
  explicit XrcDomains(ObjectHost& host) : host_(host) {}

  // ibv_open_xrcd(3): a handle of the domain `fd` names (none: a new
  // private domain) for the client's context.
  int open(uint32_t client, const proto::OpenXrcdReq& req, Fd fd, uint32_t& handle);
  // The destroy hook of a handle (ibv_close_xrcd(3)): EBUSY for the last
  // handle of a domain that SRQs or target QPs still use.
  int close(uint32_t handle);
  // The cleanup of a handle (its close, or its context's release).
  void release(uint32_t handle);
  // A domain nobody opened or uses any more goes (its last reference dropped).
  void drop_if_unused(uint32_t id);

  ObjectTable<Xrcd>& domains() { return xrcds_; }
  ObjectTable<XrcdHandle>& handles() { return handles_; }

 private:
  ObjectHost& host_;
  ObjectTable<Xrcd> xrcds_;  // by domain id (owned by no context)
  ObjectTable<XrcdHandle> handles_;
  uint32_t next_xrcd_ = 1;
  // The domains opened through a file, by (user, device, inode).
  std::map<std::tuple<uint32_t, uint64_t, uint64_t>, uint32_t> by_file_;
};

}  // namespace sv::daemon
