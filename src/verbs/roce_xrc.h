// roce_xrc.h: the receive side of an XRC target QP on the wire (IBTA annex
// A14; docs/ROCE.md, "XRC on the wire"). The engine (src/roce, QpType
// kXrcRecv) asks, per request, for the XRC SRQ the request's XRCETH names;
// this finds it by number through the daemon (ConnectXrc on the target QP
// itself: the daemon answers only for an XRC SRQ of the target's XRC
// domain) and maps it as the shared-memory path maps it for an initiator of
// this host (a Peer, attach_peer): receive WQEs are taken with that path's
// pop (pop_peer_recv: the SRQ limit event, a torn-receive record until the
// completion), completions go to the SRQ's CQ (push_recv_completion), and
// keys are checked in the SRQ's PD (the Memory `mem_for` gives for it).
//
// Thread safety: none of its own; called with roce_link.cc's hub lock held
// (lock order: hub, then the daemon connection).
#pragma once
#include <infiniband/verbs.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>

#include "roce/engine.h"

namespace sv::verbs {

struct ProcessQp;

class XrcTargetSrqs : public roce::XrcDomain {
 public:
  // The registered memory of PD `pd` as the engine needs it.
  using MemoryFor = std::function<std::unique_ptr<roce::Memory>(uint32_t pd)>;
  XrcTargetSrqs(ProcessQp& q, MemoryFor mem_for);
  ~XrcTargetSrqs() override;
  const roce::XrcSrq* find_srq(uint32_t srqn) override;
  // A receive completion of the target QP, with its ibv_wc status: into the
  // CQ of the SRQ its WQE came from (c.xrc_srqn).
  void complete(const roce::Completion& c, ibv_wc_status status);

 private:
  struct Srq;
  ProcessQp& q_;
  MemoryFor mem_for_;
  std::map<uint32_t, std::unique_ptr<Srq>> srqs_;
};

}  // namespace sv::verbs
