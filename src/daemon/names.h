// names.h: the namespace (docs/SHARING.md): objects published by name with
// a mode, opened by another process of the same user (which joins the
// object's context) or, for a CQ, granted to another user (names.cc). The
// table of names is NameSpace (name_space.h); this class owns it and
// carries out NsPublish, NsUnpublish, NsOpen and NsList. It reaches the
// registry through ObjectHost and grants CQs through CompletionQueues.
//
// Contract: single-threaded (the daemon's loop), as the registry.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>

#include "common/protocol.h"
#include "daemon/cq.h"
#include "daemon/name_space.h"
#include "daemon/object_host.h"

namespace sv::daemon {

class Names {
 public:
  Names(ObjectHost& host, CompletionQueues& cqs) : host_(host), cqs_(cqs) {}

  // Publishing needs the object in the caller's context; opening attaches
  // the caller's fresh connection to the object's context, as
  // ibv_import_device does, after the mode check.
  int publish(uint32_t client, const proto::NsPublishReq& req);
  int unpublish(uint32_t client, const proto::NsNameReq& req);
  int open(uint32_t client, const proto::NsNameReq& req, proto::NsOpenReply& rep);
  void list(const std::string& after, proto::NsListReply& rep);

 private:
  bool drop_if_dead(const std::string& name);
  void collect_owner(uid_t owner);

  ObjectHost& host_;
  CompletionQueues& cqs_;
  NameSpace ns_;
};

}  // namespace sv::daemon
