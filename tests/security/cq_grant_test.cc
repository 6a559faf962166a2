// A CQ granted for reading is not writable (issue 18, finding 5). root
// publishes a CQ with mode 0644; nobody opens it. Whatever descriptor the
// daemon hands nobody must not map writable nor reopen read-write through
// /proc/self/fd, so nobody can neither forge completions nor take the CQ's
// poll lock (which stalled root's ibv_poll_cq for good); nobody still reads
// root's completions, polling through the API.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <signal.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "attack.h"
#include "common/shm_layout.h"
#include "softverbs/softverbs.h"

namespace svsec {
namespace {

constexpr const char* kName = "/grant/cq";

uint64_t now_ms() {
  timespec t{};
  clock_gettime(CLOCK_MONOTONIC, &t);
  return uint64_t(t.tv_sec) * 1000 + uint64_t(t.tv_nsec) / 1000000;
}

// Polls `cq` until `want` completions or 10 s.
int poll_n(ibv_cq* cq, ibv_wc* wc, int want) {
  int got = 0;
  uint64_t end = now_ms() + 10000;
  while (got < want && now_ms() < end) {
    int k = ibv_poll_cq(cq, want - got, wc + got);
    if (k < 0) return k;
    got += k;
    if (!k) usleep(200);
  }
  return got;
}

// What nobody managed against the granted CQ.
struct Attack {
  uint32_t fds = 0;        // descriptors the daemon handed out with the grant
  uint32_t writable = 0;   // mapped MAP_SHARED + PROT_WRITE
  uint32_t reopened = 0;   // reopened read-write through /proc/self/fd
  uint32_t opened = 0;     // svx_open of the name worked
  uint32_t polled = 0;     // completions nobody polled through the API
  uint64_t wr_ids[2] = {};
  uint32_t statuses_ok = 0;
  uint32_t destroyed = 0;  // nobody destroyed root's CQ
};

TEST(CqGrant, AGrantedCqIsReadNotWritten) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run a child as another user";
  SystemDaemon sysd;
  // The owner: root, in a process of its own so that a poll that never
  // returns ends in SIGALRM (a failure) instead of a hung test.
  Child owner(false, [](int sock) {
    ibv_context* c = open_dev();
    if (!c) return 2;
    ibv_pd* pd = ibv_alloc_pd(c);
    static uint8_t buf[8192] __attribute__((aligned(4096)));
    ibv_mr* mr = pd ? ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE) : nullptr;
    ibv_cq* cq = ibv_create_cq(c, 16, nullptr, nullptr, 0);
    ibv_cq* cq2 = ibv_create_cq(c, 16, nullptr, nullptr, 0);
    if (!mr || !cq || !cq2) return 3;
    ibv_qp_init_attr ia{};
    ia.qp_type = IBV_QPT_RC;
    ia.cap.max_send_wr = ia.cap.max_recv_wr = 16;
    ia.cap.max_send_sge = ia.cap.max_recv_sge = 1;
    ia.send_cq = ia.recv_cq = cq;
    ibv_qp* a = ibv_create_qp(pd, &ia);
    ia.send_cq = ia.recv_cq = cq2;
    ibv_qp* b = ibv_create_qp(pd, &ia);
    if (!a || !b || qp_to_init(a, IBV_ACCESS_REMOTE_WRITE) || qp_to_init(b, IBV_ACCESS_REMOTE_WRITE) || qp_to_rts(c, a, b->qp_num) || qp_to_rts(c, b, a->qp_num)) return 4;
    svx_object o{SVX_OBJ_CQ, {}};
    o.cq = cq;
    if (svx_publish(c, kName, &o, 0644, -1)) return 5;
    uint32_t handle = cq->handle;
    if (!send_val(sock, handle)) return 6;
    auto post = [&](uint64_t id) {
      ibv_sge sge{reinterpret_cast<uintptr_t>(buf), 8, mr->lkey};
      ibv_send_wr wr{}, *bad = nullptr;
      wr.wr_id = id;
      wr.sg_list = &sge;
      wr.num_sge = 1;
      wr.opcode = IBV_WR_RDMA_WRITE;
      wr.send_flags = IBV_SEND_SIGNALED;
      wr.wr.rdma.remote_addr = reinterpret_cast<uintptr_t>(buf + 4096);
      wr.wr.rdma.rkey = mr->rkey;
      return ibv_post_send(a, &wr, &bad);
    };
    char go = 0;
    // Phase 1: two completions for nobody to poll.
    if (!recv_val(sock, go) || post(1) || post(2)) return 7;
    if (!send_val(sock, go)) return 8;
    // Phase 2: root polls its own CQ; a stolen poll lock hangs here.
    if (!recv_val(sock, go) || post(3) || post(4)) return 9;
    alarm(20);
    ibv_wc wc[2]{};
    int got = poll_n(cq, wc, 2);
    alarm(0);
    if (got != 2 || wc[0].wr_id != 3 || wc[1].wr_id != 4 || wc[0].status || wc[1].status) return 10;
    if (!recv_val(sock, go)) return 11;  // nobody is done with the name
    return 0;
  });
  Child nobody(true, [](int sock) {
    alarm(30);  // a poll that spins on a stolen lock ends in SIGALRM (a failure)
    Attack at;
    uint32_t handle = 0;
    if (!recv_val(sock, handle)) return 2;
    // Straight at the daemon: open the name, import the CQ, and try to
    // write what came back.
    std::string sockpath;
    {
      uint32_t n = 0;
      if (!recv_val(sock, n) || n > 4096) return 3;
      sockpath.resize(n);
      if (!recv_bytes(sock, sockpath.data(), n)) return 3;
    }
    RawConn raw(sockpath);
    if (!raw.ok()) return 4;
    sv::proto::Empty hello{};
    sv::proto::HelloReply hrep{};
    std::vector<sv::Fd> hfds;
    if (raw.call(sv::proto::Op::Hello, hello, hrep, {}, &hfds)) return 5;
    sv::proto::NsNameReq nreq{};
    nreq.access = sv::proto::kNsRead;
    std::strcpy(nreq.name, kName);
    sv::proto::NsOpenReply nrep{};
    if (raw.call(sv::proto::Op::NsOpen, nreq, nrep)) return 6;
    sv::proto::HandleReq ireq{};
    ireq.handle = handle;
    sv::proto::ImportCqReply irep{};
    std::vector<sv::Fd> fds;
    raw.call(sv::proto::Op::ImportCq, ireq, irep, {}, &fds);
    at.fds = uint32_t(fds.size());
    for (auto& fd : fds) {
      size_t len = irep.segment_size ? irep.segment_size : 4096;
      void* p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
      if (p != MAP_FAILED) {
        at.writable++;
        // What the attack did: the CQ's poll lock held "by" pid 1 (alive
        // for ever), so root's next poll of a non-empty CQ spins for good.
        reinterpret_cast<sv::shm::CqSegmentHeader*>(p)->poll_lock.owner.store(1);
        munmap(p, len);
      }
      char path[64];
      std::snprintf(path, sizeof(path), "/proc/self/fd/%d", fd.get());
      int rw = open(path, O_RDWR);
      if (rw >= 0) {
        at.reopened++;
        close(rw);
      }
    }
    if (!send_val(sock, at)) return 11;  // what the raw attack got, before anything can hang
    // Through the API: open the name, poll root's completions.
    svx_object o{};
    ibv_context* c = svx_open(kName, SVX_OPEN_READ, &o);
    at.opened = c && o.type == SVX_OBJ_CQ && o.cq;
    char go = 1;
    if (!send_val(sock, go)) return 7;
    if (!recv_val(sock, go)) return 8;  // root posted two
    if (at.opened) {
      at.destroyed = ibv_destroy_cq(o.cq) == 0;
      ibv_wc wc[2]{};
      int got = poll_n(o.cq, wc, 2);
      at.polled = got < 0 ? 0 : uint32_t(got);
      for (int i = 0; i < got && i < 2; ++i) {
        at.wr_ids[i] = wc[i].wr_id;
        at.statuses_ok += wc[i].status == IBV_WC_SUCCESS;
      }
    }
    if (!send_val(sock, at)) return 9;
    if (!recv_val(sock, go)) return 10;
    if (c) {
      svx_unimport_cq(o.cq);
      ibv_close_device(c);
    }
    return 0;
  });
  ASSERT_TRUE(sysd.alive());
  owner.start();
  nobody.start();
  uint32_t handle = 0;
  ASSERT_TRUE(recv_val(owner.sock(), handle));
  ASSERT_TRUE(send_val(nobody.sock(), handle));
  std::string path = sysd.socket();
  uint32_t n = uint32_t(path.size());
  ASSERT_TRUE(send_val(nobody.sock(), n));
  ASSERT_TRUE(send_bytes(nobody.sock(), path.data(), n));
  Attack raw;
  ASSERT_TRUE(recv_val(nobody.sock(), raw));
  EXPECT_EQ(0u, raw.fds) << "the grant came with a descriptor of root's CQ";
  EXPECT_EQ(0u, raw.writable) << "nobody mapped root's CQ writable";
  EXPECT_EQ(0u, raw.reopened) << "nobody reopened root's CQ read-write";
  char go = 1;
  ASSERT_TRUE(recv_val(nobody.sock(), go));  // attacked, and opened the name
  ASSERT_TRUE(send_val(owner.sock(), go));   // root: post two
  ASSERT_TRUE(recv_val(owner.sock(), go));
  ASSERT_TRUE(send_val(nobody.sock(), go));  // nobody: poll them
  Attack at;
  ASSERT_TRUE(recv_val(nobody.sock(), at));
  EXPECT_EQ(1u, at.opened);
  EXPECT_EQ(0u, at.destroyed);
  EXPECT_EQ(2u, at.polled);
  EXPECT_EQ(1u, at.wr_ids[0]);
  EXPECT_EQ(2u, at.wr_ids[1]);
  EXPECT_EQ(2u, at.statuses_ok);
  ASSERT_TRUE(send_val(owner.sock(), go));  // root: post two more and poll them
  ASSERT_TRUE(send_val(nobody.sock(), go));
  EXPECT_EQ(0, nobody.wait());
  ASSERT_TRUE(send_val(owner.sock(), go));
  EXPECT_EQ(0, owner.wait()) << "root's own poll failed or hung (142: SIGALRM)";
  EXPECT_TRUE(sysd.alive());
}

// The daemon polls a granted CQ with a try-lock: an owner that holds its
// CQ's poll lock (here for good, "by" pid 1) costs the grantee "no
// completion now", and stalls neither the daemon nor anyone else. Once the
// lock is free the grantee polls the completion.
TEST(CqGrant, AnOwnerHoldingItsPollLockStallsNoOneElse) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run a child as another user";
  SystemDaemon sysd;
  Child nobody(true, [](int sock) {
    alarm(30);
    uint32_t handle = 0;
    if (!recv_val(sock, handle)) return 2;
    svx_object o{};
    ibv_context* c = svx_open(kName, SVX_OPEN_READ, &o);
    if (!c || o.type != SVX_OBJ_CQ) return 3;
    char go = 1;
    if (!send_val(sock, go) || !recv_val(sock, go)) return 4;  // root posted one and holds its lock
    ibv_wc wc{};
    for (int i = 0; i < 100; ++i)
      if (ibv_poll_cq(o.cq, 1, &wc) != 0) return 5;  // locked: nothing now, and no wait
    // The daemon still serves everyone.
    ibv_context* other = open_dev();
    ibv_pd* pd = other ? ibv_alloc_pd(other) : nullptr;
    if (!pd) return 6;
    ibv_dealloc_pd(pd);
    ibv_close_device(other);
    if (!send_val(sock, go) || !recv_val(sock, go)) return 7;  // root let go of the lock
    if (poll_n(o.cq, &wc, 1) != 1 || wc.wr_id != 7 || wc.status != IBV_WC_SUCCESS) return 8;
    svx_unimport_cq(o.cq);
    ibv_close_device(c);
    return 0;
  });
  nobody.start();
  ibv_context* c = open_dev();
  ASSERT_NE(nullptr, c);
  ibv_pd* pd = ibv_alloc_pd(c);
  static uint8_t buf[8192] __attribute__((aligned(4096)));
  ibv_mr* mr = ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  ibv_cq* cq = ibv_create_cq(c, 16, nullptr, nullptr, 0);
  ibv_cq* cq2 = ibv_create_cq(c, 16, nullptr, nullptr, 0);
  ASSERT_TRUE(mr && cq && cq2);
  ibv_qp_init_attr ia{};
  ia.qp_type = IBV_QPT_RC;
  ia.cap.max_send_wr = ia.cap.max_recv_wr = 16;
  ia.cap.max_send_sge = ia.cap.max_recv_sge = 1;
  ia.send_cq = ia.recv_cq = cq;
  ibv_qp* a = ibv_create_qp(pd, &ia);
  ia.send_cq = ia.recv_cq = cq2;
  ibv_qp* b = ibv_create_qp(pd, &ia);
  ASSERT_TRUE(a && b);
  ASSERT_EQ(0, qp_to_init(a, IBV_ACCESS_REMOTE_WRITE));
  ASSERT_EQ(0, qp_to_init(b, IBV_ACCESS_REMOTE_WRITE));
  ASSERT_EQ(0, qp_to_rts(c, a, b->qp_num));
  ASSERT_EQ(0, qp_to_rts(c, b, a->qp_num));
  svx_object o{SVX_OBJ_CQ, {}};
  o.cq = cq;
  ASSERT_EQ(0, svx_publish(c, kName, &o, 0644, -1));
  // This process maps its own CQ's segment: find it.
  sv::shm::CqSegmentHeader* seg = nullptr;
  if (FILE* f = fopen("/proc/self/maps", "r")) {
    char line[512];
    while (!seg && fgets(line, sizeof(line), f)) {
      unsigned long lo = 0, hi = 0;
      if (!strstr(line, "softverbs-cq") || sscanf(line, "%lx-%lx", &lo, &hi) != 2) continue;
      auto* h = reinterpret_cast<sv::shm::CqSegmentHeader*>(lo);
      if (h->magic == sv::shm::kCqMagic && h->handle == cq->handle) seg = h;
    }
    fclose(f);
  }
  ASSERT_NE(nullptr, seg);
  uint32_t handle = cq->handle;
  ASSERT_TRUE(send_val(nobody.sock(), handle));
  char go = 0;
  ASSERT_TRUE(recv_val(nobody.sock(), go));
  ibv_sge sge{reinterpret_cast<uintptr_t>(buf), 8, mr->lkey};
  ibv_send_wr wr{}, *bad = nullptr;
  wr.wr_id = 7;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = reinterpret_cast<uintptr_t>(buf + 4096);
  wr.wr.rdma.rkey = mr->rkey;
  // The lock first (a holder that never lets go), then the completion.
  uint32_t free_ = 0;
  ASSERT_TRUE(seg->poll_lock.owner.compare_exchange_strong(free_, 1));
  ASSERT_EQ(0, ibv_post_send(a, &wr, &bad));
  // The completion is in the ring before nobody polls (so its empty polls
  // come from the lock, not from an empty CQ).
  auto* rh = reinterpret_cast<sv::shm::RingHeader*>(reinterpret_cast<char*>(seg) + seg->ring_offset);
  for (uint64_t end = now_ms() + 10000; rh->tail.load() == rh->head.load() && now_ms() < end;) usleep(100);
  ASSERT_NE(rh->tail.load(), rh->head.load());
  ASSERT_TRUE(send_val(nobody.sock(), go));
  ASSERT_TRUE(recv_val(nobody.sock(), go));  // nobody polled nothing and was served
  seg->poll_lock.owner.store(0);
  ASSERT_TRUE(send_val(nobody.sock(), go));
  EXPECT_EQ(0, nobody.wait());
  EXPECT_TRUE(sysd.alive());
  ibv_destroy_qp(a);
  ibv_destroy_qp(b);
  ibv_destroy_cq(cq);
  ibv_destroy_cq(cq2);
  ibv_dereg_mr(mr);
  ibv_dealloc_pd(pd);
  ibv_close_device(c);
}

}  // namespace
}  // namespace svsec
