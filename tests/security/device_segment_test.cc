// Issue 18, finding 1: the device segment (MR, QP and multicast tables) that
// the Hello reply hands every client. Attacks by nobody against root on a
// private system daemon: the segment must be read-only in fact (no writable
// mapping, no write(), no read-write reopen through /proc/self/fd, no
// mprotect to add write), hold none of root's keys or QPNs, and the
// multicast table's bounds must hold against a client attaching too many QPs.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <string>

#include "attack.h"
#include "common/shm_layout.h"

namespace svsec {
namespace {

using sv::Fd;
namespace proto = sv::proto;
namespace shm = sv::shm;

// The descriptor the Hello reply of a raw connection carries.
bool hello_segment(const std::string& socket, Fd& out) {
  RawConn raw(socket);
  if (!raw.ok()) return false;
  proto::Empty hello{};
  proto::HelloReply rep{};
  std::vector<Fd> fds;
  if (raw.call(proto::Op::Hello, hello, rep, {}, &fds) != 0 || fds.size() != 1) return false;
  out = std::move(fds[0]);
  return true;
}

// Every way of writing the segment through `fd`; returns a bit per way that
// worked (0: none did). With `vandalise`, a way that worked is used as the
// attack did: every MR slot is marked used (so root's reg_mr would fail).
int try_writes(int fd, bool vandalise) {
  int worked = 0;
  const size_t size = shm::DeviceLayout::size();
  void* w = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (w != MAP_FAILED) {
    worked |= 1;
    if (vandalise) {
      auto* mr = reinterpret_cast<shm::MrEntry*>(static_cast<char*>(w) + shm::DeviceLayout::mr_offset());
      for (uint32_t i = 1; i < shm::kMrTableSize; ++i)
        if (mr[i].key.load() == 0) mr[i].key.store((i << 8) | 1);
    }
    munmap(w, size);
  }
  uint32_t junk = 0xdeadbeef;
  if (pwrite(fd, &junk, sizeof(junk), off_t(shm::DeviceLayout::mr_offset() + 64)) > 0) worked |= 2;
  std::string self = "/proc/self/fd/" + std::to_string(fd);
  int rw = open(self.c_str(), O_RDWR | O_CLOEXEC);
  if (rw >= 0) {
    worked |= 4;
    close(rw);
  }
  void* r = mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  if (r != MAP_FAILED) {
    if (mprotect(r, size, PROT_READ | PROT_WRITE) == 0) worked |= 8;
    munmap(r, size);
  }
  if (ftruncate(fd, 4096) == 0) worked |= 16;
  return worked;
}

TEST(DeviceSegment, AnotherUserCannotWriteIt) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run a child as another user";
  SystemDaemon sysd;
  const std::string sock = sysd.socket();
  Child nobody(true, [sock](int s) {
    Fd seg;
    if (!hello_segment(sock, seg)) return 100;
    int worked = try_writes(seg.get(), true);
    send_val(s, worked);
    return 0;
  });
  ASSERT_TRUE(sysd.alive());
  nobody.start();
  int worked = -1;
  ASSERT_TRUE(recv_val(nobody.sock(), worked));
  EXPECT_EQ(0, worked) << "1: writable mapping, 2: write(), 4: O_RDWR reopen, 8: mprotect, 16: ftruncate";
  EXPECT_EQ(0, nobody.wait());
  // Whatever nobody tried, root's registrations still work.
  ibv_context* c = open_dev();
  ASSERT_NE(nullptr, c);
  ibv_pd* pd = ibv_alloc_pd(c);
  ASSERT_NE(nullptr, pd);
  static char buf[4096];
  ibv_mr* mr = ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE);
  EXPECT_NE(nullptr, mr) << strerror(errno);
  if (mr) ibv_dereg_mr(mr);
  ibv_dealloc_pd(pd);
  ibv_close_device(c);
  EXPECT_TRUE(sysd.alive());
}

// Root's own segment is sealed too: a writable shared mapping and write()
// fail even for the daemon's own user.
TEST(DeviceSegment, SealedForItsOwnUser) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root";
  SystemDaemon sysd;
  ASSERT_TRUE(sysd.alive());
  Fd seg;
  ASSERT_TRUE(hello_segment(sysd.socket(), seg));
  int seals = fcntl(seg.get(), F_GET_SEALS);
  EXPECT_EQ(F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE | F_SEAL_SEAL, seals);
  EXPECT_EQ(O_RDONLY, fcntl(seg.get(), F_GETFL) & O_ACCMODE);
  int worked = try_writes(seg.get(), false);
  EXPECT_EQ(0, worked & ~4) << "1: writable mapping, 2: write(), 8: mprotect, 16: ftruncate";
}

struct RootObjects {
  uint32_t key;
  uint32_t qpn;
  uint64_t addr;
};

TEST(DeviceSegment, AnotherUserSeesNoneOfRootsKeys) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run a child as another user";
  SystemDaemon sysd;
  const std::string sock = sysd.socket();
  Child nobody(true, [sock](int s) {
    RootObjects ro{};
    if (!recv_val(s, ro)) return 100;
    Fd seg;
    if (!hello_segment(sock, seg)) return 101;
    const size_t size = shm::DeviceLayout::size();
    void* m = mmap(nullptr, size, PROT_READ, MAP_SHARED, seg.get(), 0);
    if (m == MAP_FAILED) return 102;
    const auto* mr = reinterpret_cast<const shm::MrEntry*>(static_cast<char*>(m) + shm::DeviceLayout::mr_offset());
    const auto* qp = reinterpret_cast<const shm::QpEntry*>(static_cast<char*>(m) + shm::DeviceLayout::qp_offset());
    int found = 0;
    for (uint32_t i = 0; i < shm::kMrTableSize; ++i) {
      if (mr[i].key.load() == ro.key) found |= 1;
      if (mr[i].iova == ro.addr || mr[i].file_offset == ro.addr) found |= 2;
    }
    for (uint32_t i = 0; i < shm::kQpTableSize; ++i)
      if (qp[i].qpn.load() == ro.qpn) found |= 4;
    munmap(m, size);
    send_val(s, found);
    return 0;
  });
  ASSERT_TRUE(sysd.alive());
  nobody.start();
  ibv_context* c = open_dev();
  ASSERT_NE(nullptr, c);
  ibv_pd* pd = ibv_alloc_pd(c);
  ibv_cq* cq = ibv_create_cq(c, 4, nullptr, nullptr, 0);
  ASSERT_NE(nullptr, pd);
  ASSERT_NE(nullptr, cq);
  static char secret[8192] = "root's secret";
  ibv_mr* mr = ibv_reg_mr(pd, secret, sizeof(secret), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
  ASSERT_NE(nullptr, mr);
  ibv_qp_init_attr qa{};
  qa.send_cq = cq;
  qa.recv_cq = cq;
  qa.qp_type = IBV_QPT_RC;
  qa.cap = {4, 4, 1, 1, 0};
  ibv_qp* qp = ibv_create_qp(pd, &qa);
  ASSERT_NE(nullptr, qp);
  RootObjects ro{mr->rkey, qp->qp_num, uint64_t(reinterpret_cast<uintptr_t>(secret))};
  ASSERT_TRUE(send_val(nobody.sock(), ro));
  int found = -1;
  EXPECT_TRUE(recv_val(nobody.sock(), found));
  EXPECT_EQ(0, found) << "1: root's key, 2: root's address, 4: root's QPN";
  EXPECT_EQ(0, nobody.wait());
  ibv_destroy_qp(qp);
  ibv_dereg_mr(mr);
  ibv_destroy_cq(cq);
  ibv_dealloc_pd(pd);
  ibv_close_device(c);
}

// The attack as it was made: nobody forges an MR entry in the device
// segment that names root's backing and root's buffer (root's MR grants no
// remote access), then asks the daemon to carry out an RDMA READ between two
// of its own QPs with the forged key (Op::Mediate, raw). Root's secret must
// not come back: the segment cannot be written, and the daemon reads only
// entries it wrote itself.
struct RawRc {
  RawConn& c;
  uint32_t pd = 0, cq = 0, qp[2] = {0, 0}, lkey = 0;
  Fd mem;  // nobody's own registered page (the READ's destination)
  explicit RawRc(RawConn& conn) : c(conn) {}
  bool modify(uint32_t qpn, uint32_t dest) {
    proto::ModifyQpReq m{};
    m.qpn = qpn;
    m.attr_mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
    m.qp_state = IBV_QPS_INIT;
    m.port_num = 1;
    m.qp_access_flags = IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE;
    if (c.call(proto::Op::ModifyQp, m) != 0) return false;
    m = {};
    m.qpn = qpn;
    m.attr_mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                  IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
    m.qp_state = IBV_QPS_RTR;
    m.path_mtu = IBV_MTU_1024;
    m.dest_qp_num = dest;
    m.max_dest_rd_atomic = 1;
    m.ah_port_num = 1;
    if (c.call(proto::Op::ModifyQp, m) != 0) return false;
    m = {};
    m.qpn = qpn;
    m.attr_mask = IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                  IBV_QP_MAX_QP_RD_ATOMIC;
    m.qp_state = IBV_QPS_RTS;
    m.max_rd_atomic = 1;
    return c.call(proto::Op::ModifyQp, m) == 0;
  }
  int setup() {
    proto::Empty e{};
    proto::HandleReply h{};
    if (c.call(proto::Op::AllocPd, e, h) != 0) return 1;
    pd = h.handle;
    int fd = sealed_backing(4096);
    if (fd < 0) return 2;
    mem.reset(fd);
    int fds[1] = {fd};
    if (c.call(proto::Op::RegBacking, e, h, std::span<const int>(fds)) != 0) return 3;
    proto::RegMrReq r{};
    r.pd = pd;
    r.backing = h.handle;
    r.addr = 0;
    r.length = 4096;
    r.iova = 0;
    r.access = IBV_ACCESS_LOCAL_WRITE;
    proto::RegMrReply rr{};
    if (c.call(proto::Op::RegMr, r, rr) != 0) return 4;
    lkey = rr.key;
    proto::CreateCqReq cr{};
    cr.cqe = 16;
    proto::CreateCqReply crr{};
    std::vector<Fd> got;
    if (c.call(proto::Op::CreateCq, cr, crr, {}, &got) != 0) return 5;
    cq = crr.handle;
    for (uint32_t& q : qp) {
      proto::CreateQpReq qr{};
      qr.pd = pd;
      qr.send_cq = cq;
      qr.recv_cq = cq;
      qr.qp_type = IBV_QPT_RC;
      qr.max_send_wr = 4;
      qr.max_recv_wr = 4;
      qr.max_send_sge = 1;
      qr.max_recv_sge = 1;
      proto::CreateQpReply qrr{};
      got.clear();
      if (c.call(proto::Op::CreateQp, qr, qrr, {}, &got) != 0) return 6;
      q = qrr.qpn;
    }
    return connect() ? 0 : 7;
  }
  // Both QPs through RESET to RTS, connected to each other (a failed READ
  // moves the responder to ERR, IBTA 9.9.3.1.2).
  bool connect() {
    for (uint32_t q : qp) {
      proto::ModifyQpReq m{};
      m.qpn = q;
      m.attr_mask = IBV_QP_STATE;
      m.qp_state = IBV_QPS_RESET;
      if (c.call(proto::Op::ModifyQp, m) != 0) return false;
    }
    return modify(qp[0], qp[1]) && modify(qp[1], qp[0]);
  }
  // RDMA READ of `len` bytes at `addr` under `rkey` into nobody's page.
  int last_status = 0, last_outcome = 0, last_wc = 0;
  bool read(uint64_t addr, uint32_t rkey, uint32_t len) {
    proto::MediateReq m{};
    m.qpn = qp[0];
    m.opcode = IBV_WR_RDMA_READ;
    m.remote_addr = addr;
    m.rkey = rkey;
    m.num_sge = 1;
    m.sge[0] = {0, len, lkey};
    proto::MediateReply mr{};
    last_status = c.call(proto::Op::Mediate, m, mr);
    last_outcome = int(mr.outcome);
    last_wc = int(mr.wc_status);
    return last_status == 0 && mr.outcome == proto::kMediateDone;
  }
};

TEST(DeviceSegment, ForgedMrEntryReadsNothingOfRoots) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run a child as another user";
  SystemDaemon sysd;
  const std::string sock = sysd.socket();
  static const char kSecret[] = "root's secret: 0123456789abcdef";
  Child nobody(true, [sock](int s) {
    uint64_t addr = 0;
    if (!recv_val(s, addr)) return 100;
    RawConn c(sock);
    proto::Empty hello{};
    proto::HelloReply hr{};
    std::vector<Fd> seg;
    if (c.call(proto::Op::Hello, hello, hr, {}, &seg) != 0 || seg.size() != 1) return 101;
    RawRc rc(c);
    if (int e = rc.setup()) return 110 + e;
    const size_t size = shm::DeviceLayout::size();
    void* w = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, seg[0].get(), 0);
    auto* mr = w == MAP_FAILED ? nullptr
                               : reinterpret_cast<shm::MrEntry*>(static_cast<char*>(w) + shm::DeviceLayout::mr_offset());
    const uint32_t slot = shm::kMrTableSize - 7;  // a free slot, far from the allocator
    const uint32_t key = (slot << 8) | 0x5a;
    int leaked = 0, done = 0;
    for (uint32_t backing = 1; backing < 64 && !leaked; ++backing) {
      if (mr) {  // forge: root's backing and buffer, nobody's PD, remote read
        shm::MrEntry& e = mr[slot];
        e.key.store(0);
        e.access = IBV_ACCESS_REMOTE_READ;
        e.pd = rc.pd;
        e.backing = backing;
        e.iova = addr;
        e.length = sizeof(kSecret);
        e.file_offset = addr;
        e.kind = shm::kKindMr;
        e.bound_qpn = 0;
        e.key.store(key);
      }
      if (!rc.read(addr, key, sizeof(kSecret))) {
        if (!rc.connect()) return 120;
        continue;
      }
      ++done;
      char got[sizeof(kSecret)] = {};
      if (pread(rc.mem.get(), got, sizeof(got), 0) == ssize_t(sizeof(got)) && std::memcmp(got, kSecret, sizeof(got)) == 0)
        leaked = 1;
    }
    if (w != MAP_FAILED) munmap(w, size);
    int res[6] = {leaked, done, mr != nullptr, rc.last_status, rc.last_outcome, rc.last_wc};
    send_bytes(s, res, sizeof(res));
    return 0;
  });
  ASSERT_TRUE(sysd.alive());
  nobody.start();
  ibv_context* c = open_dev();
  ASSERT_NE(nullptr, c);
  ibv_pd* pd = ibv_alloc_pd(c);
  ASSERT_NE(nullptr, pd);
  static char secret[4096];
  std::memcpy(secret, kSecret, sizeof(kSecret));
  ibv_mr* mr = ibv_reg_mr(pd, secret, sizeof(secret), IBV_ACCESS_LOCAL_WRITE);  // no remote access
  ASSERT_NE(nullptr, mr);
  ASSERT_TRUE(send_val(nobody.sock(), uint64_t(reinterpret_cast<uintptr_t>(secret))));
  int res[6] = {-1, -1, -1, -1, -1, -1};  // leaked, READs done, writable, last READ: status, outcome, wc status
  ASSERT_TRUE(recv_bytes(nobody.sock(), res, sizeof(res)));
  EXPECT_EQ(0, res[0]) << "nobody read root's secret through a forged MR entry";
  EXPECT_EQ(0, res[1]) << "a READ under a forged key was carried out";
  EXPECT_EQ(0, res[2]) << "the segment mapped writable";
  EXPECT_EQ(0, nobody.wait());
  EXPECT_EQ(0, std::memcmp(secret, kSecret, sizeof(kSecret)));
  ibv_dereg_mr(mr);
  ibv_dealloc_pd(pd);
  ibv_close_device(c);
  EXPECT_TRUE(sysd.alive());
}

// Multicast membership is visible to every user (a UD sender reads it to
// reach every attached QP): a group root made shows in a segment made
// later for nobody. ibv_attach_mcast(3): past max_mcast_qp_attach QPs, an
// attach fails, and one user holds at most half of a group's places
// (quota.h); the daemon lives on.
TEST(DeviceSegment, MulticastGroupsBoundedAndSharedAcrossUsers) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run a child as another user";
  SystemDaemon sysd;
  const std::string sock = sysd.socket();
  static const uint8_t kGid[16] = {0xff, 0x0e, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x51, 0x18, 0, 1};
  Child nobody(true, [sock](int s) {
    uint32_t root_qpn = 0;
    if (!recv_val(s, root_qpn)) return 100;
    Fd seg;
    if (!hello_segment(sock, seg)) return 101;
    const size_t size = shm::DeviceLayout::size();
    void* m = mmap(nullptr, size, PROT_READ, MAP_SHARED, seg.get(), 0);
    if (m == MAP_FAILED) return 102;
    const auto* g = reinterpret_cast<const shm::McgEntry*>(static_cast<char*>(m) + shm::DeviceLayout::mcg_offset());
    bool seen = false;
    for (uint32_t i = 0; i < shm::kMcgTableSize; ++i)
      if (g[i].count == 1 && std::memcmp(g[i].gid, kGid, 16) == 0 && g[i].qpns[0] == root_qpn) seen = true;
    munmap(m, size);
    // Now attach more QPs than a group holds.
    ibv_context* c = open_dev();
    if (!c) return 103;
    ibv_pd* pd = ibv_alloc_pd(c);
    ibv_cq* cq = ibv_create_cq(c, 4, nullptr, nullptr, 0);
    if (!pd || !cq) return 104;
    ibv_gid gid{};
    std::memcpy(gid.raw, kGid, 16);
    int attached = 0, refused = 0, other = 0;
    for (uint32_t i = 0; i < shm::kMcgMaxQps + 8; ++i) {
      ibv_qp_init_attr qa{};
      qa.send_cq = cq;
      qa.recv_cq = cq;
      qa.qp_type = IBV_QPT_UD;
      qa.cap = {1, 1, 1, 1, 0};
      ibv_qp* qp = ibv_create_qp(pd, &qa);
      if (!qp) return 105;
      int e = ibv_attach_mcast(qp, &gid, 0);
      if (e == 0)
        ++attached;
      else if (e == ENOMEM || e == EINVAL)
        ++refused;
      else
        ++other;
    }
    int res[4] = {seen, attached, refused, other};
    send_bytes(s, res, sizeof(res));
    return 0;  // exit: every QP is destroyed with the connection
  });
  ASSERT_TRUE(sysd.alive());
  nobody.start();
  ibv_context* c = open_dev();
  ASSERT_NE(nullptr, c);
  ibv_pd* pd = ibv_alloc_pd(c);
  ibv_cq* cq = ibv_create_cq(c, 4, nullptr, nullptr, 0);
  ibv_qp_init_attr qa{};
  qa.send_cq = cq;
  qa.recv_cq = cq;
  qa.qp_type = IBV_QPT_UD;
  qa.cap = {1, 1, 1, 1, 0};
  ibv_qp* qp = ibv_create_qp(pd, &qa);
  ASSERT_NE(nullptr, qp);
  ibv_gid gid{};
  std::memcpy(gid.raw, kGid, 16);
  ASSERT_EQ(0, ibv_attach_mcast(qp, &gid, 0));
  ASSERT_TRUE(send_val(nobody.sock(), qp->qp_num));
  int res[4] = {-1, -1, -1, -1};
  ASSERT_TRUE(recv_bytes(nobody.sock(), res, sizeof(res)));
  EXPECT_EQ(1, res[0]) << "root's group not in nobody's segment";
  EXPECT_EQ(int(shm::kMcgMaxQps / 2), res[1]);  // half of the group's places
  EXPECT_EQ(int(shm::kMcgMaxQps + 8 - shm::kMcgMaxQps / 2), res[2]);
  EXPECT_EQ(0, res[3]);
  EXPECT_EQ(0, nobody.wait());
  EXPECT_TRUE(sysd.alive());
  // The group shrank back to root's QP; detaching and destroying work.
  EXPECT_EQ(0, ibv_detach_mcast(qp, &gid, 0));
  EXPECT_EQ(0, ibv_destroy_qp(qp));
  ibv_destroy_cq(cq);
  ibv_dealloc_pd(pd);
  ibv_close_device(c);
  EXPECT_TRUE(sysd.alive());
}

}  // namespace
}  // namespace svsec
