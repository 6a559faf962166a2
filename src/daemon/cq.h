// cq.h: completion queues and completion channels (ibv_create_cq(3),
// ibv_resize_cq(3), ibv_create_comp_channel(3)): the CQ and channel tables,
// the CQs granted to another user by name, the daemon's own completions,
// and the CQ verbs (cq.cc). The registry composes it and reaches the tables
// for resolve, destroy, a context's release and the peers' segments; it
// reaches the registry through ObjectHost. Which CQs a client's QPs may
// complete into is the QPs' (qp_reach.cc).
//
// Contract: single-threaded (the daemon's loop), as the registry.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "common/protocol.h"
#include "common/sys.h"
#include "daemon/object_host.h"
#include "daemon/objects.h"

namespace sv::daemon {

class CompletionQueues {
 public:
  explicit CompletionQueues(ObjectHost& host) : host_(host) {}

  // ibv_create_comp_channel(3): the client's eventfd and wake-up socket.
  int create_channel(uint32_t client, Fd fd, Fd wake, uint32_t& handle);
  // ibv_create_cq(3): a CQ of the client's context with its segment;
  // `channel`: the client's (0: none).
  int create(uint32_t client, uint32_t channel, const proto::CreateCqReq& req, proto::CreateCqReply& rep,
             std::vector<int>& out_fds);
  // ibv_resize_cq: a pending segment, then its commit or abort (see docs/PROTOCOL.md).
  int resize(Cq& cq, const proto::ResizeCqReq& req, proto::CreateCqReply& rep, std::vector<int>& out_fds);
  int resize_done(Cq& cq, const proto::ResizeCqDoneReq& req);
  // A CQ's current segment, for a process that completes into it (its
  // context's CQ, or the receive CQ of a QP one of its QPs can reach:
  // resolved by the command layer, HandleRule::kCompletable).
  int get(const Cq& cq, proto::ImportCqReply& rep, std::vector<int>& out_fds);
  // A CQ overrun (CQ `handle`): the CQ error event, and the QPs completing
  // into it go to ERR (ObjectHost::qps_error_on_cq).
  int error(Cq& cq, uint32_t handle);
  // A CQ of the client's context comes with its segment; a CQ granted by
  // name to another user comes without any descriptor (segment_size 0): the
  // grantee polls it with poll_granted and can neither write entries nor
  // hold the owner's poll lock. `cq` is the client's or granted to it
  // (resolved by the command layer).
  int import(uint32_t client, const Cq& cq, proto::ImportCqReply& rep, std::vector<int>& out_fds);
  // Pops up to req.max completions of a CQ granted to the client, under the
  // CQ's poll lock taken with a try-lock: the daemon never waits on a lock a
  // client can hold (a busy lock answers 0 completions).
  int poll_granted(Cq& cq, const proto::PollCqReq& req, proto::PollCqReply& rep);
  // The daemon's own completion into CQ `handle` (none if it is gone).
  void push(uint32_t handle, const ibv_wc& wc, bool solicited);
  // CQ grants (NsOpen of another user's CQ): once per client and CQ, so
  // that a client repeating NsOpen does not grow the table; a client's go
  // with its connection.
  bool granted(uint32_t client, uint32_t handle) const;
  void grant(uint32_t client, uint32_t handle);
  void drop_grants(uint32_t client) { grants_.erase(client); }

  ObjectTable<Cq>& table() { return cqs_; }
  const ObjectTable<Cq>& table() const { return cqs_; }
  ObjectTable<Channel>& channels() { return channels_; }
  const ObjectTable<Channel>& channels() const { return channels_; }

 private:
  ObjectHost& host_;
  ObjectTable<Channel> channels_;
  ObjectTable<Cq> cqs_;
  // CQs another user opened by name (client -> CQ handles): a CQ segment
  // holds completions only, so mapping it grants exactly the named object.
  std::multimap<uint32_t, uint32_t> grants_;
};

}  // namespace sv::daemon
