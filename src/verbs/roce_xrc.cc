// roce_xrc.cc: the XRC SRQs of an XRC target QP on the wire (roce_xrc.h).
#include "verbs/roce_xrc.h"

#include <arpa/inet.h>

#include <cstring>

#include "common/trace.h"
#include "verbs/provider.h"
#include "verbs/requester_internal.h"
#include "verbs/roce_engine_io.h"
#include "verbs/roce_netdev.h"
#include "verbs/roce_stats.h"

namespace sv::verbs {

struct XrcTargetSrqs::Srq : roce::RecvSource {
  ProcessQp& q;
  uint32_t srqn;
  Peer peer;
  std::unique_ptr<roce::Memory> mem;
  roce::XrcSrq srq;
  Srq(ProcessQp& qs, uint32_t n) : q(qs), srqn(n) {}
  bool take(roce::RecvWr& out) override {
    shm::RecvWqe w;
    if (!pop_peer_recv(q, peer, w)) return false;
    out.wr_id = w.wr_id;
    out.xrc_srqn = srqn;
    out.sg.clear();
    for (uint32_t i = 0; i < w.num_sge && i < shm::kMaxSge; ++i)
      out.sg.push_back({w.sge[i].addr, w.sge[i].length, w.sge[i].lkey});
    return true;
  }
};

XrcTargetSrqs::XrcTargetSrqs(ProcessQp& q, MemoryFor mem_for) : q_(q), mem_for_(std::move(mem_for)) {}
XrcTargetSrqs::~XrcTargetSrqs() = default;

const roce::XrcSrq* XrcTargetSrqs::find_srq(uint32_t srqn) {
  if (q_.type != IBV_QPT_XRC_RECV) return nullptr;
  if (auto it = srqs_.find(srqn); it != srqs_.end()) return &it->second->srq;
  ContextState& cs = *q_.ctx->st;
  proto::ConnectXrcReq req{};
  req.qpn = q_.qpn;
  req.srqn = srqn;
  proto::ConnectPeerReply rep{};
  std::vector<Fd> fds;
  if (int e = cs.conn.call<proto::Op::ConnectXrc>(req, rep, {}, &fds)) {
    // ENOENT: no such XRC SRQ in the target's domain, an invalid request.
    SV_TRACE("roce: XRC target %u: no XRC SRQ %u in its domain: %s", q_.qpn, srqn, std::strerror(e));
    return nullptr;
  }
  auto s = std::make_unique<Srq>(q_, srqn);
  if (attach_peer(cs, s->peer, rep, fds) || !s->peer.srq_hdr) return nullptr;
  s->mem = mem_for_(rep.pd);
  s->srq.recvs = s.get();
  s->srq.mem = s->mem.get();
  {
    // Its CQ, if this process has it, is polled for wire completions now.
    std::lock_guard<std::mutex> g(cs.mu);
    if (auto c = cs.cq_handles.find(rep.peer_recv_cq); c != cs.cq_handles.end())
      c->second->st->wire.store(true, std::memory_order_relaxed);
  }
  return &(srqs_[srqn] = std::move(s))->srq;
}

void XrcTargetSrqs::complete(const roce::Completion& c, ibv_wc_status status) {
  auto it = srqs_.find(c.xrc_srqn);
  if (it == srqs_.end()) return;  // cannot be: the WQE came from there
  // push_recv_completion takes the sender's opcode (core::receive_completion:
  // the completion's opcode and its IMM / INV flags).
  push_recv_completion(q_, it->second->peer, c.wr_id, status, c.byte_len, sender_opcode(c), IBV_SEND_SOLICITED,
                       htonl(c.imm), c.invalidated_rkey);
}

}  // namespace sv::verbs
