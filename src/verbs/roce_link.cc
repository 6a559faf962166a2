#include "verbs/roce_link.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <fcntl.h>
#include <netinet/udp.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <thread>
#include <unordered_map>

#include "common/access.h"
#include "common/responder_core.h"
#include "common/mgid.h"
#include "common/started_thread.h"
#include "common/port_holder.h"
#include "common/trace.h"
#include "roce/engine.h"
#include "roce/udp.h"
#include "verbs/capture.h"
#include "verbs/fault_ops.h"
#include "verbs/provider.h"
#include "verbs/roce_memory.h"
#include "verbs/roce_engine_io.h"
#include "verbs/roce_hub.h"
#include "verbs/roce_netdev.h"
#include "verbs/roce_stats.h"
#include "verbs/roce_xrc.h"
#include "verbs/wr_rules.h"

namespace sv::verbs::wire {
namespace {

uint32_t mtu_bytes(ibv_mtu m) { return (m >= IBV_MTU_256 && m <= IBV_MTU_4096) ? 128u << m : 1024; }

// SOFTVERBS_TEST_SLOW_ERROR=US: the daemon's call waits US microseconds
// first, the window a loaded machine opens, made certain (roce.wire.xrc_peer
// runs so). Read once; a rare path.
const unsigned g_slow_error_us = [] {
  const char* e = std::getenv("SOFTVERBS_TEST_SLOW_ERROR");
  return e ? unsigned(std::strtoul(e, nullptr, 10)) : 0u;
}();

}  // namespace

// The engine went to the error state by itself (a fatal completion error,
// IBTA 10.3.1): the daemon's QP table follows, so that ibv_query_qp and
// post_recv see ERR. Done before the first completion in error is pushed
// (CqSink::before_error), so that a program that polls it and then asks
// ibv_query_qp is told ERR, never the state before (roce.wire.xrc_peer
// asked so and was told RTS once in CI). Called with the hub lock held
// (lock order: hub, then the connection).
void publish_error(RoceQp& r) {
  if (r.error_published || !r.engine || r.engine->state() != roce::EngineState::kError) return;
  r.error_published = true;
  if (g_slow_error_us) ::usleep(g_slow_error_us);
  ProcessQp& q = *r.q;
  proto::ModifyQpReq req{};
  req.qpn = q.qpn;
  req.attr_mask = IBV_QP_STATE;
  req.qp_state = IBV_QPS_ERR;
  switch (r.engine->responder_fault()) {  // the responder's affiliated event (IBTA 11.6.3.1)
    case roce::WcStatus::kRemInvReqErr: req.responder_status = IBV_WC_REM_INV_REQ_ERR; break;
    case roce::WcStatus::kRemAccessErr: req.responder_status = IBV_WC_REM_ACCESS_ERR; break;
    case roce::WcStatus::kRemOpErr: req.responder_status = IBV_WC_REM_OP_ERR; break;
    default: break;
  }
  proto::Empty rep{};
  q.ctx->st->conn.call<proto::Op::ModifyQp>(req, rep);
  {
    std::lock_guard<std::mutex> g(q.attr_mu);  // ibv_modify_qp writes ibv_qp::state under it too
    q.attr.qp_state = IBV_QPS_ERR;
    q.self->qpx.qp_base.state = IBV_QPS_ERR;
  }
}

void report_error(RoceQp& r) {
  if (r.error_reported || !r.engine || r.engine->state() != roce::EngineState::kError) return;
  r.error_reported = true;
  publish_error(r);
  ProcessQp& q = *r.q;
  if (!q.srq && q.type != IBV_QPT_XRC_RECV) flush_rq(q);  // an XRC target has no receive queue
  SV_TRACE("roce: QP %u: transport error, now in ERR", q.qpn);
}

namespace {

// A UD QP also sends from the first GID of the other address family (an
// IPv6 one after the IPv4 index 1), so that its datagrams to IPv6 GIDs and
// groups go on the wire (docs/ROCE.md, "Multicast"): a second RoceAttach
// (kRoceSecondAddress), whose socket is ours in that address's reuseport
// group, the QPN steered to it too (else the daemon's, and what arrives
// there for the QP is forwarded). Best effort: without it those
// destinations stay local.
void attach_other(Hub& h, ProcessQp& q, RoceQp& r) {
  static const uint8_t mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  const bool v4 = std::memcmp(r.sgid.data(), mapped, 12) == 0;
  for (int i = 1; i < int(kGidTableLen); ++i) {
    ibv_gid g{};
    if (ibv_query_gid(q.self->qpx.qp_base.context, 1, i, &g) != 0) return;
    static const uint8_t zero[16] = {};
    if (std::memcmp(g.raw, zero, 16) == 0) return;
    if ((std::memcmp(g.raw, mapped, 12) == 0) == v4 || (g.raw[0] == 0xfe && (g.raw[1] & 0xc0) == 0x80)) continue;
    proto::RoceAttachReq req{};
    req.qpn = q.qpn;
    req.flags = proto::kRoceSecondAddress;
    std::memcpy(req.sgid, g.raw, 16);
    proto::RoceAttachReply rep{};
    std::vector<Fd> fds;
    if (q.ctx->st->conn.call<proto::Op::RoceAttach>(req, rep, {}, &fds) || fds.empty()) return;
    auto ep = std::make_unique<UdpEndpoint>(h.clock, faults_of(rep, q.qpn));
    const int fd = fds[0].get();
    if (ep->adopt(fds[0].release(), kRoceV2Port) != 0 || ep->family() == r.ep->family()) return;
    if (rep.flags & proto::kRoceSteered) receive_on(h, *q.ctx->st, fd);
    ep->set_accept_any_ipv4_id(true);
    ep->set_batching(true);
    ep->set_gso(h.gso);
    ep->set_tap(capture_tap(*q.ctx->st, q.qpn));
    r.wire_mtu = std::min(r.wire_mtu, wire_mtu_for(g.raw));
    r.ep2 = std::move(ep);
    return;
  }
}


// RoceAttach: this process's socket on the address of `sgid` (steered:
// in the port's group, on lane `want`'s socket; else for sending only), and
// this connection's arrival socket. `lane`: the lane that serves the QP
// (`want` if steered, else 0, whose thread reads the arrival socket).
// Called with no hub lock held.
int attach(ProcessQp& q, const uint8_t* sgid, unsigned want, std::unique_ptr<RoceQp>& out, unsigned& lane) {
  ContextState& cs = *q.ctx->st;
  proto::RoceAttachReq req{};
  req.qpn = q.qpn;
  req.lane = want;
  std::memcpy(req.sgid, sgid, 16);
  proto::RoceAttachReply rep{};
  std::vector<Fd> fds;
  if (int e = cs.conn.call<proto::Op::RoceAttach>(req, rep, {}, &fds)) return e;
  const bool steered = rep.flags & proto::kRoceSteered;
  lane = steered ? want : 0;
  Hub& h = hub(lane);
  const FaultConfig f = faults_of(rep, q.qpn);
  auto r = std::make_unique<RoceQp>(q);
  r->ep = std::make_unique<UdpEndpoint>(h.clock, f);
  // Unsteered, the socket only sends (from a port of its own): what comes
  // to 4791 for the QP is forwarded on the arrival socket. Steered, the
  // lane receives on it (receive_on); with several lanes the QP sends from
  // its lane's own port (lane_sender), else on it.
  int send_fd = -1;
  if (steered && lane_count() > 1) {
    std::lock_guard<std::mutex> g(h.mu);
    send_fd = lane_sender(h, fds[0].get());
  }
  if (send_fd >= 0) r->member = std::move(fds[0]);
  else if (steered) r->member.reset(::fcntl(fds[0].get(), F_DUPFD_CLOEXEC, 0));
  if (int e = r->ep->adopt(send_fd >= 0 ? send_fd : fds[0].release(), kRoceV2Port)) return e;
  r->ep->set_accept_any_ipv4_id(true);
  r->ep->set_tap(capture_tap(cs, q.qpn));  // `softverbs capture` (capture.h)
  r->ep->set_batching(true);  // one sendmmsg per call into the engine
  r->ep->set_gso(h.gso);  // rxe's IPv4 packets carry an IP ID (docs/ROCE.md)
  std::memcpy(r->sgid.data(), sgid, 16);
  r->wire_mtu = wire_mtu_for(sgid);
  // One arrival socket per daemon connection, read by lane 0.
  if (lane != 0) {
    Fd copy(::fcntl(fds[1].get(), F_DUPFD_CLOEXEC, 0));
    if (!copy.valid()) return errno;
    std::lock_guard<std::mutex> g(h.mu);
    adopt_arrival(h, cs, std::move(copy));
  }
  {
    Hub& h0 = hub(0);
    std::lock_guard<std::mutex> g(h0.mu);
    adopt_arrival(h0, cs, std::move(fds[1]));
    start(h0);
  }
  r->steered = steered;
  out = std::move(r);
  return 0;
}

// Where a connected QP's request acts at the responder: the RETH's fields,
// an atomic's AtomicETH, a FLUSH's (wr_rules.h: flush_fields).
void remote_fields(const ibv_send_wr* wr, uint32_t op, SendWr& s) {
  if (wr_rule(op).kind == WrKind::kFlush) {
    const FlushFields f = flush_fields(wr->wr.atomic.remote_addr, wr->wr.atomic.rkey, wr->wr.atomic.compare_add,
                                       wr->wr.atomic.swap);
    s.remote_addr = f.addr;
    s.rkey = f.rkey;
    s.placement = f.placement;
    s.level = f.level;
    s.flush_len = uint32_t(f.len);  // validate_wr: a range's length fits the RETH
  } else if (wr_rule(op).kind == WrKind::kAtomic) {
    s.remote_addr = wr->wr.atomic.remote_addr;
    s.rkey = wr->wr.atomic.rkey;
    s.compare_add = wr->wr.atomic.compare_add;
    s.swap = wr->wr.atomic.swap;
  } else {
    s.remote_addr = wr->wr.rdma.remote_addr;
    s.rkey = wr->wr.rdma.rkey;
  }
}

// The engine's form of a work request validate_wr() accepted: inline data
// copied into a staging slot, a UD destination as an endpoint peer. 0 or
// EINVAL (an address the endpoint cannot reach).
int to_engine_wr(ProcessQp& q, RoceQp& r, const ibv_send_wr* wr, SendWr& s) {
  const uint32_t op = opcode_of(wr);
  s.opcode = wr_rule(op).wire;
  const bool local_op = wr_rule(op).kind == WrKind::kLocal;
  s.wr_id = wr->wr_id;
  s.signaled = q.sq_sig_all || (wr->send_flags & IBV_SEND_SIGNALED);
  s.solicited = wr->send_flags & IBV_SEND_SOLICITED;
  s.fence = wr->send_flags & IBV_SEND_FENCE;
  // imm_data is the wire's 4 bytes as they lie in memory (__be32); the
  // engine holds ImmDt as those bytes read big-endian (headers.h).
  s.imm = ntohl(wr->imm_data);
  s.invalidate_rkey = wr->invalidate_rkey;
  if (local_op) {
    if (op == IBV_WR_BIND_MW) {
      const ibv_mw_bind_info& b = wr->bind_mw.bind_info;
      s.bind.mw_handle = wr->bind_mw.mw->handle;
      s.bind.rkey = wr->bind_mw.rkey;
      s.bind.mr_lkey = b.mr ? b.mr->lkey : 0;
      s.bind.access = b.mw_access_flags;
      s.bind.addr = b.addr;
      s.bind.length = b.length;
    }
  } else if (op == IBV_WR_ATOMIC_WRITE && (wr->send_flags & IBV_SEND_INLINE)) {
    // Its 8 bytes (validate_wr counted them) travel in the WR itself.
    uint8_t v[8] = {};
    uint64_t off = 0;
    for (int i = 0; i < wr->num_sge && off + wr->sg_list[i].length <= 8; ++i) {
      std::memcpy(v + off, reinterpret_cast<const void*>(wr->sg_list[i].addr), wr->sg_list[i].length);
      off += wr->sg_list[i].length;
    }
    std::memcpy(&s.compare_add, v, 8);
  } else if ((wr->send_flags & IBV_SEND_INLINE) && op != IBV_WR_RDMA_READ) {
    // Copied now (ibv_post_send(3): the buffer may be reused at once) into
    // a staging slot, which lives until the WR has surely retired: the
    // engine holds at most max_send_wr WRs and there are one more slots.
    uint64_t total = 0;
    for (int i = 0; i < wr->num_sge; ++i) total += wr->sg_list[i].length;
    const size_t slot = std::max<uint32_t>(q.cap.max_inline_data, 1);
    if (total > slot) return EINVAL;
    uint8_t* p = r.mem.inline_slab.data() + (r.inline_next++ % (q.cap.max_send_wr + 1)) * slot;
    uint64_t off = 0;
    for (int i = 0; i < wr->num_sge; ++i) {
      std::memcpy(p + off, reinterpret_cast<const void*>(wr->sg_list[i].addr), wr->sg_list[i].length);
      off += wr->sg_list[i].length;
    }
    if (total) s.sg.push_back({uint64_t(reinterpret_cast<uintptr_t>(p)), uint32_t(total), 0});
  } else {
    for (int i = 0; i < wr->num_sge; ++i)
      s.sg.push_back({wr->sg_list[i].addr, wr->sg_list[i].length, wr->sg_list[i].lkey});
  }
  // XRC: the responder's XRC SRQ, in every request's XRCETH (IBTA annex A14).
  if (q.type == IBV_QPT_XRC_SEND) s.xrc_srqn = wr->qp_type.xrc.remote_srqn & 0xffffff;
  if (q.type == IBV_QPT_UD) {
    const Ah* ah = reinterpret_cast<const Ah*>(wr->wr.ud.ah);
    Gid dg;
    std::memcpy(dg.data(), ah->attr.grh.dgid.raw, 16);
    auto a = r.ahs.find(dg);
    if (a == r.ahs.end()) {
      static const uint8_t mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
      UdpEndpoint& ep = r.ep_for(std::memcmp(dg.data(), mapped, 12) == 0 ? AF_INET : AF_INET6);
      uint64_t ah = ep.add_peer(gid_to_ip(dg.data()), kRoceV2Port);
      if (ah != UINT64_MAX && &ep != r.ep.get()) ah |= RouteSink::kOther;
      a = r.ahs.emplace(dg, ah).first;
    }
    if (a->second == UINT64_MAX) return EINVAL;  // IPv4 source, IPv6 destination or the reverse
    s.ah = a->second;
    s.remote_qpn = wr->wr.ud.remote_qpn & 0xffffff;
    s.remote_qkey = wr->wr.ud.remote_qkey;
  } else {
    remote_fields(wr, op, s);
  }
  return 0;
}

// RTR: the QP goes on the wire, in the lane the daemon steers it to.
int go_on_wire(ProcessQp& q, const ibv_qp_attr& attr, int mask) {
  {
    uint8_t sgid[16] = {};
    if (q.type == IBV_QPT_UD) {
      // A UD QP has no address vector: it listens on the first address of
      // the GID table after loopback (index 1); messages to local GIDs
      // keep the shared-memory path.
      ibv_gid g1{};
      if (ibv_query_gid(q.self->qpx.qp_base.context, 1, 1, &g1) != 0) return 0;
      std::memcpy(sgid, g1.raw, 16);
    } else {
      if (!(mask & IBV_QP_AV) || !attr.ah_attr.is_global || gid_is_local(attr.ah_attr.grh.dgid.raw)) return 0;
      ibv_gid s{};
      if (ibv_query_gid(q.self->qpx.qp_base.context, 1, attr.ah_attr.grh.sgid_index, &s) != 0) return EINVAL;
      std::memcpy(sgid, s.raw, 16);
    }
    std::unique_ptr<RoceQp> nr;
    unsigned lane = 0;
    if (int e = attach(q, sgid, lane_for(q), nr, lane)) {
      // UD without a RoCE port stays a local-only QP.
      if (q.type == IBV_QPT_UD) return 0;
      SV_TRACE("roce: QP %u: no RoCEv2 port: %s", q.qpn, std::strerror(e));
      explain_no_wire(e, q.ctx->st->conn.dir(), sgid);
      return e;
    }
    Hub& h = hub(lane);
    std::lock_guard<std::mutex> g(h.mu);
    if (nr->steered && nr->member.valid()) receive_on(h, *q.ctx->st, nr->member.get());
    nr->member.reset();
    // (An XRC target has no CQs: its SRQs' are marked as it finds them.)
    if (q.send_cq) q.send_cq->st->wire.store(true, std::memory_order_relaxed);
    if (q.recv_cq) q.recv_cq->st->wire.store(true, std::memory_order_relaxed);
    if (q.type == IBV_QPT_UD) attach_other(h, q, *nr);
    roce::QpConfig& c = nr->cfg;
    c.type = engine_type(q.type);
    c.qpn = q.qpn;
    c.pmtu = q.type == IBV_QPT_UD ? nr->wire_mtu : std::min(mtu_bytes(attr.path_mtu), nr->wire_mtu);
    c.rq_psn = attr.rq_psn;
    c.access = uint32_t(attr.qp_access_flags);
    c.min_rnr_timer = attr.min_rnr_timer;
    c.max_dest_rd_atomic = attr.max_dest_rd_atomic ? attr.max_dest_rd_atomic : 1;
    c.qkey = attr.qkey;
    if (const char* w = std::getenv("SOFTVERBS_ROCE_WINDOW")) c.max_window = std::clamp<uint32_t>(uint32_t(std::atoi(w)), 16, 1u << 20);
    if (const char* w = std::getenv("SOFTVERBS_ROCE_ACK_AFTER")) c.ack_urgent_after = uint32_t(std::max(std::atoi(w), 0));
    if (q.type != IBV_QPT_UD) {
      c.dest_qpn = attr.dest_qp_num;
      c.dest_ah = nr->ep->add_peer(gid_to_ip(attr.ah_attr.grh.dgid.raw), kRoceV2Port);
      if (c.dest_ah == UINT64_MAX) return EINVAL;  // IPv4 source, IPv6 destination or the reverse
    }
    nr->route.first = nr->ep.get();
    nr->route.other = nr->ep2.get();
    nr->engine = std::make_unique<roce::EngineQp>(c, nr->route, nr->sink, nr->mem, h.clock);
    nr->engine->set_recv_source(&nr->recvs);
    nr->engine->set_xrc_domain(&nr->xrc);
    nr->ep->attach(nr->engine.get());
    if (nr->ep2) nr->ep2->attach(nr->engine.get());
    nr->mem.inline_slab.resize(size_t(q.cap.max_send_wr + 1) * std::max<uint32_t>(q.cap.max_inline_data, 1));
    SV_TRACE("roce: QP %u on the wire, pmtu %u", q.qpn, c.pmtu);
    h.qps[q.qpn] = std::move(nr);
    set_lane_of_qpn(q.qpn, lane);
    start(h);
    q.roce_lane.store(uint8_t(lane), std::memory_order_release);
    q.on_wire.store(true, std::memory_order_release);
    return 0;
  }
}

}  // namespace
}  // namespace sv::verbs::wire

namespace sv::verbs {

bool roce_attached(const ProcessQp& q) { return q.on_wire.load(std::memory_order_acquire); }

int roce_on_modify(ProcessQp& q, const ibv_qp_attr& attr, int mask, ibv_qp_state next) {
  using namespace wire;
  if (next == IBV_QPS_RESET) {
    roce_detach(q);
    return 0;
  }
  if (next == IBV_QPS_RTR && !roce_attached(q)) return go_on_wire(q, attr, mask);
  Hub& h = hub_of(q);
  std::lock_guard<std::mutex> g(h.mu);
  auto it = h.qps.find(q.qpn);
  RoceQp* r = (it != h.qps.end() && it->second->q == &q) ? it->second.get() : nullptr;
  if (next == IBV_QPS_ERR) {
    if (r && r->engine) {
      r->error_reported = true;  // the application's own modify
      r->error_published = true;
      r->engine->flush_ack();    // what completed here is acknowledged first
      r->flush_tx();
      r->engine->set_error();
    }
    return 0;
  }
  if (next == IBV_QPS_RTS && r && r->engine && q.type != IBV_QPT_UD) {
    r->engine->set_requester(attr.sq_psn, attr.timeout, attr.retry_cnt, attr.rnr_retry, attr.max_rd_atomic);
  } else if (next == IBV_QPS_RTS && r && r->engine) {
    r->engine->set_requester(attr.sq_psn, 0, 0, 0, 1);
  }
  return 0;
}

void roce_detach(ProcessQp& q) {
  using namespace wire;
  Hub& h = hub_of(q);
  std::lock_guard<std::mutex> g(h.mu);
  auto it = h.qps.find(q.qpn);
  if (it != h.qps.end() && it->second->q == &q) {
    RoceQp& r = *it->second;
    // SOFTVERBS_ROCE_STATS=1: what the wire did, for tests and debugging.
    if (r.engine && std::getenv("SOFTVERBS_ROCE_STATS"))
      print_roce_stats(q.qpn, h.index, r.engine->stats(), r.ep->stats(), r.ep2 ? &r.ep2->stats() : nullptr);
    // An ACK held for the next request (docs/ROCE.md) acknowledges messages
    // this side has completed: it must leave before the QP goes, or the
    // peer retries into a QP that no longer exists (ibv_rc_pingpong's last
    // SEND, then the client exits). Datagrams the fault hook holds back
    // were sent, as far as the peer knows: they must not vanish either.
    // The fault hook spares what goes now (UdpEndpoint::spare_from_faults):
    // a last ACK lost here could never be made good.
    if (r.ep) r.ep->spare_from_faults();
    if (r.ep2) r.ep2->spare_from_faults();
    if (r.engine) r.engine->flush_ack();
    if (r.ep) {
      r.flush_delayed(true);
      r.flush_tx();
    }
    h.qps.erase(it);
    set_lane_of_qpn(q.qpn, 0);
  }
  q.on_wire.store(false, std::memory_order_release);
}

// A multicast send is not "remote": its local members get it through
// shared memory (execute_ud), the wire a copy (roce_post_mcast).
bool roce_ud_remote(const ProcessQp&, const ibv_send_wr* wr) {
  const Ah* ah = reinterpret_cast<const Ah*>(wr->wr.ud.ah);
  return ah && ah->attr.is_global && !gid_is_multicast(ah->attr.grh.dgid.raw) &&
         !gid_is_local(ah->attr.grh.dgid.raw);
}

// An AH from the loopback GID (index 0, ::ffff:127.0.0.1: a group joined
// on an id bound to 127.0.0.1 or ::1) keeps the group on this host, as IP
// multicast sent on lo does.
bool roce_ud_multicast(const ProcessQp&, const ibv_send_wr* wr) {
  const Ah* ah = reinterpret_cast<const Ah*>(wr->wr.ud.ah);
  return ah && ah->attr.is_global && ah->attr.grh.sgid_index != 0 && gid_is_multicast(ah->attr.grh.dgid.raw) &&
         (wr->wr.ud.remote_qpn & 0xffffff) == roce::kMulticastQpn;
}

// RoCEv2 multicast (docs/ROCE.md, "Multicast"; IBTA annex A17.4.5: the MGID
// is the IP destination, an IPv4-mapped MGID the IPv4 group): the same UD
// SEND as a datagram to the group's address, port 4791, DestQP 0xFFFFFF.
// Unsignaled: the work request completes once, on the local path. The
// sending socket does not loop its multicast back (IP_MULTICAST_LOOP off,
// set by the daemon on every socket of the port), so this host's members
// get the message once, from execute_ud. An MGID of the other family than
// the QP's address (a UD QP sends from GID index 1, IPv4) stays local.
int roce_post_mcast(ProcessQp& q, const ibv_send_wr* wr) {
  using namespace wire;
  Hub& h = hub_of(q);
  std::lock_guard<std::mutex> g(h.mu);
  auto it = h.qps.find(q.qpn);
  if (it == h.qps.end() || !it->second->engine) return EINVAL;
  RoceQp& r = *it->second;
  if (int e = validate_wr(q, wr)) return e;
  if (r.engine->send_queue_depth() >= q.cap.max_send_wr) return ENOMEM;
  // A UD message is one packet (IBTA 9.8): one larger than the wire's path
  // MTU stays on the host (the engine would complete it with an error).
  uint64_t len = 0;
  for (int i = 0; i < wr->num_sge; ++i) len += wr->sg_list[i].length;
  if (len > r.cfg.pmtu) return EMSGSIZE;
  SendWr s;
  if (int e = to_engine_wr(q, r, wr, s)) return e;
  s.signaled = false;
  s.remote_qpn = kMulticastQpn;
  int rc = r.engine->post_send(std::move(s));
  r.engine->progress(false);
  r.flush_delayed();
  r.flush_tx();
  report_error(r);
  h.wake_by(std::min(r.engine->next_deadline(), r.next_delayed()));
  return rc;
}

int roce_post_send(ProcessQp& q, ibv_send_wr* wr, ibv_send_wr** bad) {
  using namespace wire;
  Hub& h = hub_of(q);
  std::lock_guard<std::mutex> g(h.mu);
  auto it = h.qps.find(q.qpn);
  if (it == h.qps.end() || !it->second->engine) {
    *bad = wr;
    return EINVAL;
  }
  RoceQp& r = *it->second;
  int rc = 0;
  for (; wr; wr = wr->next) {
    // One check for every path: the opcode rules of wr_rules.h.
    rc = validate_wr(q, wr);
    if (rc == 0 && r.engine->send_queue_depth() >= q.cap.max_send_wr) rc = ENOMEM;
    if (rc) {
      *bad = wr;
      break;
    }
    SendWr s;
    if ((rc = to_engine_wr(q, r, wr, s))) {
      *bad = wr;
      break;
    }
    if (q.faults) [[unlikely]]
      s.fails_with = roce::to_engine(wire_fault(q, *wr));
    if (int e = r.engine->post_send(std::move(s))) {
      *bad = wr;
      rc = e;
      break;
    }
  }
  // The new requests first, then the held ACK, if any, in the same
  // sendmmsg: a peer polling for that ACK finds the requests already done
  // when it sees it (ib_write_lat: its memory holds our WRITE by then).
  r.engine->progress(false);
  r.engine->flush_ack();
  r.ack_due = 0;
  r.flush_delayed();
  r.flush_tx();
  report_error(r);
  h.wake_by(std::min(r.engine->next_deadline(), r.next_delayed()));  // a timer the RoCE thread must see
  return rc;
}

// One lane (a small machine): the poller takes the lane's work over while
// it polls (Hub::kPollerGone). Several lanes: each lane's thread keeps its
// sockets, and the poller does a lane's work only when it finds that lane
// free (try_lock), so that a lane thread asleep costs no latency.
bool roce_poll() {
  using namespace wire;
  const std::vector<Hub*>& all = lane_hubs();
  const bool one = all.size() == 1;
  bool did = false;
  for (Hub* hp : all) {
    Hub& h = *hp;
    if (!h.started.load(std::memory_order_relaxed)) continue;
    if (one) h.last_app_poll.store(h.clock.now_ns(), std::memory_order_relaxed);
    std::unique_lock<std::mutex> lk(h.mu, std::try_to_lock);
    // Not free: the RoCE thread or another poller is at it.
    if (!lk.owns_lock()) continue;
    const int got = h.drain_all();
    if (got == 0 && h.next_deadline() > h.clock.now_ns()) continue;
    // A held ACK goes with our next post, or at our next poll after its
    // time, or from the RoCE thread, which naps no longer than kPollerNap
    // while we poll: no kick needed.
    h.progress_all();
    did = true;
  }
  // Nothing came, or a lane's thread is at it: let another runnable thread
  // of this CPU run (on 2 vCPUs shared with other work the peer's poller,
  // or the lane thread we found busy, may be queued right here, and our
  // spinning would hold its answer back for a time slice).
  if (!did) sched_yield();
  return did;
}

void roce_notify_armed() {
  using namespace wire;
  for (Hub* h : lane_hubs()) {
    if (h->last_app_poll.exchange(0, std::memory_order_relaxed) != 0) h->kick();
  }
}

}  // namespace sv::verbs
