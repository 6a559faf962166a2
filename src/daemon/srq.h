// srq.h: shared receive queues (ibv_create_srq(3), ibv_modify_srq(3)): the
// SRQ table and the SRQ verbs (srq.cc). The registry composes it and
// reaches the table for resolve, destroy, a context's release, and the
// receives that QPs and mediation take from an SRQ; it reaches the
// registry through ObjectHost. Which SRQs a client's QPs reach is the QPs'
// (qp_reach.cc).
//
// Contract: single-threaded (the daemon's loop), as the registry.
#pragma once

#include <cstdint>
#include <vector>

#include "common/protocol.h"
#include "daemon/object_host.h"
#include "daemon/objects.h"

namespace sv::daemon {

class SharedReceiveQueues {
 public:
  explicit SharedReceiveQueues(ObjectHost& host) : host_(host) {}

  // ibv_create_srq(3): an SRQ of the client's context with its segment;
  // `xrcd`: the client's handle of the XRC domain req.xrcd names (null: none).
  int create(uint32_t client, const XrcdHandle* xrcd, const proto::CreateSrqReq& req, proto::CreateSrqReply& rep,
             std::vector<int>& out_fds);
  // The SRQ limit event for SRQ `handle`'s holders, asked for by a sender
  // that reaches it (resolved by the command layer, HandleRule::kReachable).
  int limit(const Srq& srq, uint32_t handle);
  // ibv_modify_srq(3) with IBV_SRQ_MAX_WR: a pending segment, then its
  // commit or abort (see docs/PROTOCOL.md).
  int resize(Srq& srq, uint32_t handle, const proto::ResizeSrqReq& req, proto::CreateSrqReply& rep,
             std::vector<int>& out_fds);
  int resize_done(Srq& srq, const proto::ResizeSrqDoneReq& req);

  ObjectTable<Srq>& table() { return srqs_; }
  const ObjectTable<Srq>& table() const { return srqs_; }

 private:
  ObjectHost& host_;
  ObjectTable<Srq> srqs_;
};

}  // namespace sv::daemon
