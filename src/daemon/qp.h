// qp.h: queue pairs (ibv_create_qp(3), ibv_modify_qp(3), IBTA 11.2.4): the
// QP table (by QPN), the generations of the QP-table slots, which QPs name
// which destination, the XRC target QPs each context holds a handle of, and
// the QP verbs (qp.cc): connections to peers on this host, XRC (IBTA annex
// A14), multicast (UD), a QP's receive queue as the daemon takes from it,
// and what becomes of the peers of QPs that die. Their entries are written
// in the device tables, which the registry owns and lends it. The registry
// composes it and reaches the table for resolve, destroy, a context's
// release, mediation and what a client's QPs reach (qp_reach.cc); it
// reaches the registry through ObjectHost, and the CQs and SRQs it
// completes into and takes from through their classes.
//
// Contract: single-threaded (the daemon's loop), as the registry.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <set>
#include <utility>
#include <vector>

#include "common/protocol.h"
#include "common/shm_layout.h"
#include "daemon/cq.h"
#include "daemon/device_tables.h"
#include "daemon/mediation.h"
#include "daemon/object_host.h"
#include "daemon/objects.h"
#include "daemon/srq.h"

namespace sv::daemon {

class QueuePairs {
 public:
  using RecvQueue = MediationTables::RecvQueue;

  QueuePairs(ObjectHost& host, DeviceTables& tables, CompletionQueues& cqs, SharedReceiveQueues& srqs);

  // The objects a CreateQp names (each the client's, or null for none).
  struct Objects {
    const Srq* srq = nullptr;
    const XrcdHandle* xrcd = nullptr;
  };
  int create(uint32_t client, const Objects& o, const proto::CreateQpReq& req, proto::CreateQpReply& rep,
             std::vector<int>& out_fds);
  int modify(Qp& qp, const proto::ModifyQpReq& req);
  // The peer of the client's QP `qp` (`qpn`), or (UD) QP `dest`.
  int connect_peer(uint32_t client, const Qp& qp, uint32_t qpn, proto::ConnectPeerReply& rep,
                   std::vector<int>& out_fds);
  int connect_ud(uint32_t client, const Qp& qp, uint32_t dest, proto::ConnectPeerReply& rep,
                 std::vector<int>& out_fds);
  int connect_xrc(uint32_t client, const Qp& qp, const proto::ConnectXrcReq& req, proto::ConnectPeerReply& rep,
                  std::vector<int>& out_fds);
  // XRC target QP req.qpn, in the domain of the client's handle `xrcd`.
  int open_qp(uint32_t client, const XrcdHandle& xrcd, const proto::OpenQpReq& req, proto::ImportQpReply& rep,
              std::vector<int>& out_fds);
  // The requester QP `qpn` (the client's) reports a responder error.
  int peer_error(uint32_t qpn, uint32_t wc_status);
  // The responder QP's holders learn why it went to ERR (IBTA 11.6.3.1).
  void responder_error_event(uint32_t qpn, ibv_wc_status requester_status);
  // Multicast: QP req.qpn is `qp`, the client's.
  int attach_mcast(uint32_t client, const Qp& qp, const proto::McastReq& req);
  int detach_mcast(const Qp& qp, const proto::McastReq& req);

  // The QP's type hooks for destroy and a context's release (kTypeOps).
  int destroy_handle(uint32_t ctx, uint32_t qpn);
  std::vector<uint32_t> to_release(uint32_t ctx);
  void before_release(const std::vector<uint32_t>& qpns);
  void release(uint32_t qpn);
  void fail_peers_of(const std::vector<uint32_t>& dead_qpns);

  // QP `qpn` when the client's context owns or holds it (counted as a
  // lookup by owner: objects.h), and the same by context (not counted).
  Qp* find(uint32_t client, uint32_t qpn);
  Qp* held(uint32_t ctx, uint32_t qpn);
  static bool holds(const Qp& q, uint32_t ctx);  // context `ctx` owns or holds `q`
  // A QP's entry in its user's device segment (by the QPN's slot), and the
  // entry only while it is QP `qpn`'s.
  shm::QpEntry& slot(uint32_t qpn) const;
  const shm::QpEntry* entry(uint32_t qpn) const;
  // A QP's receive queue (its own ring or its SRQ's), located by the
  // capacities the daemon recorded; its posted receives flushed.
  bool receive_queue(uint32_t qpn, RecvQueue& out);
  void flush_rq(Qp& q, uint32_t qpn);

  ObjectTable<Qp>& table() { return qps_; }
  const ObjectTable<Qp>& table() const { return qps_; }

 private:
  int check_create(const Objects& o, const proto::CreateQpReq& req);
  uint32_t alloc_slot();
  void init_entry(uint32_t client, uint32_t slot, uint32_t qpn, const proto::CreateQpReq& req);
  int peer_reply(uint32_t client, uint32_t dest, proto::ConnectPeerReply& rep, std::vector<int>& out_fds);
  void complete_torn_receive(uint32_t dead_qpn);
  bool torn_record_allowed(const Qp& dead, uint32_t dead_qpn, const Qp& peer, uint32_t peer_qpn) const;
  void mcg_release(const DeviceTables::McgChange& ch, uint32_t qpn);
  uid_t qp_uid(uint32_t qpn) const;
  void set_dest(uint32_t qpn, uint32_t dest);

  ObjectHost& host_;
  DeviceTables& tables_;
  CompletionQueues& cqs_;
  SharedReceiveQueues& srqs_;
  ObjectTable<Qp> qps_;  // by qpn
  // (destination QPN, QPN) of every QP whose entry names a destination:
  // the QPs connected to one QP without a walk over every QP.
  std::set<std::pair<uint32_t, uint32_t>> by_dest_;
  // The QPs of a context being released that were still connected (RTR,
  // RTS, SQD or SQE) when their last holder went: before_release notes
  // them, fail_peers_of fails their peers and forgets them.
  std::set<uint32_t> died_connected_;
  // (context, QPN), once per handle a context holds of an XRC target QP.
  std::multiset<std::pair<uint32_t, uint32_t>> xrc_handles_;
  std::vector<uint8_t> gen_;  // per QP slot: generation
  uint32_t next_slot_ = 2;    // QPN 0 and 1 are the special QPs
};

}  // namespace sv::daemon
