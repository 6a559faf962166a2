// The request ring (Op::PostRing, daemon/post_ring.h; docs/PROTOCOL.md,
// "The request ring"): pipelined requests a client writes into shared
// memory the daemon reads. Nobody, a raw client, writes there what the
// library never would: garbage, requests of other ops, a request naming
// root's QP, a tail far ahead of the head and one behind it, and tries to
// shrink the ring under the daemon's mapping. The daemon must run only its
// own valid MediatePost, answer nothing from the ring, drop the connection
// of an impossible tail, and stay up for root, whose QP gets nothing.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "attack.h"

namespace svsec {
namespace {

using sv::proto::Op;

struct Ring {
  sv::Fd memfd, efd;
  sv::proto::PostRingReply rep{};
  void* map = MAP_FAILED;
  sv::proto::PostRingHeader* hdr() const { return static_cast<sv::proto::PostRingHeader*>(map); }
  uint8_t* slot(uint64_t i) const {
    return static_cast<uint8_t*>(map) + sv::proto::kPostRingHeaderSize + (i % rep.capacity) * rep.slot_size;
  }
  // Asks for the connection's ring and maps it; 0 or a code.
  int open(RawConn& raw) {
    sv::proto::Empty req{};
    std::vector<sv::Fd> fds;
    if (raw.call(Op::PostRing, req, rep, {}, &fds) != 0 || fds.size() != 2) return 1;
    memfd = std::move(fds[0]);
    efd = std::move(fds[1]);
    if (rep.slot_size != sizeof(sv::proto::MediateReq) || rep.capacity == 0) return 2;
    map = mmap(nullptr, rep.size, PROT_READ | PROT_WRITE, MAP_SHARED, memfd.get(), 0);
    return map == MAP_FAILED ? 3 : 0;
  }
  void publish(uint64_t tail) {
    hdr()->tail.store(tail, std::memory_order_release);
    uint64_t one = 1;
    if (write(efd.get(), &one, sizeof one) != sizeof one) {
    }
  }
  // Until the daemon's head reaches `n` (5 s at most).
  bool taken(uint64_t n) const {
    for (int i = 0; i < 500; ++i) {
      if (hdr()->head.load(std::memory_order_acquire) >= n) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }
};

// Status on the socket: its own reply (not one to something read from the
// ring), or -1 once the daemon has dropped the connection.
int status_of(RawConn& raw) {
  sv::proto::Empty req{};
  sv::proto::init_header(req, Op::Status, 99);
  sv::proto::StatusReply rep{};
  const int st = raw.send_raw(&req, sizeof req, {}, nullptr, &rep, sizeof rep);
  if (st != 0) return st;
  return rep.h.op == uint16_t(Op::Status) && rep.h.seq == 99 ? 0 : 1000 + rep.h.op;
}

TEST(PostRing, WhatAClientWritesInItsRingRunsOnlyItsOwnValidRequestsAndAnImpossibleTailDropsIt) {
  SystemDaemon sysd;
  ASSERT_TRUE(sysd.alive());
  const std::string socket = sysd.socket();
  Child nobody(true, [socket](int sock) {
    uint32_t root_qpn = 0;
    if (!recv_val(sock, root_qpn)) return 10;
    RawConn raw(socket);
    sv::proto::MediateReq own{};
    if (!raw.ok() || !raw_mediated_pair(raw, 4096, own)) return 11;
    Ring r;
    if (int e = r.open(raw)) return 20 + e;
    // Sealed at its size: the daemon's mapping cannot be cut short.
    if (ftruncate(r.memfd.get(), 0) == 0 || ftruncate(r.memfd.get(), off_t(r.rep.size) * 2) == 0) return 30;
    sv::proto::Empty again{};
    sv::proto::PostRingReply rep2{};
    if (raw.call(Op::PostRing, again, rep2) != EBUSY) return 31;  // one ring per connection
    // 0: garbage. 1: Hello (it must not be answered). 2: a MediatePost naming
    // root's QP. 3: its own valid MediatePost.
    std::memset(r.slot(0), 0xff, r.rep.slot_size);
    sv::proto::Empty hello{};
    sv::proto::init_header(hello, Op::Hello, 7);
    std::memset(r.slot(1), 0, r.rep.slot_size);
    std::memcpy(r.slot(1), &hello, sizeof hello);
    sv::proto::MediateReq theirs = own;
    sv::proto::init_header(theirs, Op::MediatePost, 8);
    theirs.qpn = root_qpn;
    theirs.send_flags = IBV_SEND_SIGNALED;
    theirs.wr_id = 66;
    std::memcpy(r.slot(2), &theirs, sizeof theirs);
    sv::proto::MediateReq mine = own;
    sv::proto::init_header(mine, Op::MediatePost, 9);
    mine.epoch = 1;
    mine.wr_id = 77;
    std::memcpy(r.slot(3), &mine, sizeof mine);
    r.publish(4);
    if (!r.taken(4)) return 40;
    if (int st = status_of(raw)) return 41 + (st < 0 ? 0 : 1);  // alive, and nothing from the ring answered
    // A tail more than the capacity ahead of the head: dropped.
    r.publish(4 + r.rep.capacity + 1);
    for (int i = 0; i < 500 && status_of(raw) != -1; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    if (status_of(raw) != -1) return 50;
    // A tail behind the head, on a second connection: dropped too.
    RawConn raw2(socket);
    sv::proto::Empty h2{};
    sv::proto::HelloReply hrep{};
    std::vector<sv::Fd> fds;
    Ring r2;
    if (!raw2.ok() || raw2.call(Op::Hello, h2, hrep, {}, &fds) != 0 || r2.open(raw2) != 0) return 60;
    r2.publish(UINT64_MAX);
    for (int i = 0; i < 500 && status_of(raw2) != -1; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    if (status_of(raw2) != -1) return 61;
    return send_val(sock, 1) ? 0 : 62;
  });
  nobody.start();
  ibv_context* c = open_dev();
  ASSERT_NE(nullptr, c);
  ibv_pd* pd = ibv_alloc_pd(c);
  ibv_cq* cq = ibv_create_cq(c, 16, nullptr, nullptr, 0);
  ASSERT_TRUE(pd && cq);
  ibv_qp_init_attr ia{};
  ia.send_cq = ia.recv_cq = cq;
  ia.qp_type = IBV_QPT_RC;
  ia.cap.max_send_wr = ia.cap.max_recv_wr = 4;
  ia.cap.max_send_sge = ia.cap.max_recv_sge = 1;
  ibv_qp* qp = ibv_create_qp(pd, &ia);
  ASSERT_NE(nullptr, qp);
  ASSERT_TRUE(send_val(nobody.sock(), qp->qp_num));
  int done = 0;
  ASSERT_TRUE(recv_val(nobody.sock(), done)) << "nobody: exit " << nobody.wait();
  EXPECT_EQ(0, nobody.wait());
  ibv_wc wc{};
  EXPECT_EQ(0, ibv_poll_cq(cq, 1, &wc)) << "a completion on root's QP from nobody's ring (wr_id " << wc.wr_id << ")";
  ibv_pd* later = ibv_alloc_pd(c);
  EXPECT_NE(nullptr, later) << "the daemon no longer serves root";
  if (later) ibv_dealloc_pd(later);
  EXPECT_TRUE(sysd.alive());
  ibv_destroy_qp(qp);
  ibv_destroy_cq(cq);
  ibv_dealloc_pd(pd);
  ibv_close_device(c);
}

}  // namespace
}  // namespace svsec
