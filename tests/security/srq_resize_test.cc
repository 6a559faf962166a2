// SRQ resize (ResizeSrq, ResizeSrqDone, GetSrq) against the system daemon:
// another user's SRQ handle gets none of the three (no segment, no pending
// resize left behind, no commit); and the segment a resize hands out is
// sized and headed from the daemon's record, whatever the resizer forged in
// the old segment's header, which it can write.
#include <gtest/gtest.h>
#include <infiniband/verbs.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "attack.h"
#include "common/shm_layout.h"
#include "common/shm_ring.h"

namespace svsec {
namespace {

using sv::proto::Op;

bool hello_and_srq(RawConn& raw, uint32_t& srq, uint64_t& size, std::vector<sv::Fd>& fds) {
  sv::proto::Empty hello{};
  sv::proto::HelloReply hr{};
  if (!raw.ok() || raw.call(Op::Hello, hello, hr) != 0) return false;
  sv::proto::Empty apd{};
  sv::proto::HandleReply pd{};
  if (raw.call(Op::AllocPd, apd, pd) != 0) return false;
  sv::proto::CreateSrqReq req{};
  req.pd = pd.handle;
  req.max_wr = 8;
  req.max_sge = 1;
  req.srq_type = IBV_SRQT_BASIC;
  sv::proto::CreateSrqReply rep{};
  if (raw.call(Op::CreateSrq, req, rep, {}, &fds) != 0 || fds.size() != 1) return false;
  srq = rep.handle;
  size = rep.segment_size;
  return true;
}

int resize(RawConn& raw, uint32_t handle, uint32_t max_wr, sv::proto::CreateSrqReply& rep,
           std::vector<sv::Fd>& fds) {
  sv::proto::ResizeSrqReq req{};
  req.handle = handle;
  req.max_wr = max_wr;
  return raw.call(Op::ResizeSrq, req, rep, {}, &fds);
}

int done(RawConn& raw, uint32_t handle, uint32_t commit) {
  sv::proto::ResizeSrqDoneReq req{};
  req.handle = handle;
  req.commit = commit;
  sv::proto::Empty rep{};
  return raw.call(Op::ResizeSrqDone, req, rep);
}

int get(RawConn& raw, uint32_t handle, sv::proto::ImportSrqReply& rep, std::vector<sv::Fd>& fds) {
  sv::proto::HandleReq req{};
  req.handle = handle;
  return raw.call(Op::GetSrq, req, rep, {}, &fds);
}

// What nobody got against root's SRQ.
struct Attack {
  int resize_rc = 0, done_rc = 0, get_rc = 0;
  uint32_t fds = 0;  // descriptors handed out
};

TEST(SrqResize, AnotherUsersSrqHandleGetsNoResizeAndNoSegment) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run a child as another user";
  SystemDaemon sysd;
  const std::string path = sysd.socket();
  Child nobody(true, [path](int sock) {
    uint32_t handle = 0;
    if (!recv_val(sock, handle)) return 2;
    RawConn raw(path);
    uint32_t mine = 0;  // a context of nobody's own, with an SRQ of its own
    uint64_t size = 0;
    std::vector<sv::Fd> fds;
    if (!hello_and_srq(raw, mine, size, fds)) return 3;
    Attack a{};
    sv::proto::CreateSrqReply rr{};
    std::vector<sv::Fd> got;
    a.resize_rc = resize(raw, handle, 64, rr, got);
    a.done_rc = done(raw, handle, 1);
    sv::proto::ImportSrqReply ir{};
    a.get_rc = get(raw, handle, ir, got);
    a.fds = uint32_t(got.size());
    return send_val(sock, a) ? 0 : 4;
  });
  RawConn raw(path);
  uint32_t srq = 0;
  uint64_t size = 0;
  std::vector<sv::Fd> fds;
  ASSERT_TRUE(hello_and_srq(raw, srq, size, fds));
  nobody.start();
  ASSERT_TRUE(send_val(nobody.sock(), srq));
  Attack a{};
  ASSERT_TRUE(recv_val(nobody.sock(), a)) << "the child failed: exit " << nobody.wait();
  EXPECT_NE(0, a.resize_rc);
  EXPECT_NE(0, a.done_rc);
  EXPECT_NE(0, a.get_rc);
  EXPECT_EQ(0u, a.fds);
  EXPECT_EQ(0, nobody.wait());
  // Root's SRQ: in its own segment still, and no resize of nobody's pending
  // on it (root's own starts, not EBUSY).
  sv::proto::ImportSrqReply ir{};
  std::vector<sv::Fd> got;
  ASSERT_EQ(0, get(raw, srq, ir, got));
  EXPECT_EQ(size, ir.segment_size);
  sv::proto::CreateSrqReply rr{};
  got.clear();
  EXPECT_EQ(0, resize(raw, srq, 64, rr, got));
  EXPECT_EQ(0, done(raw, srq, 0));
  EXPECT_TRUE(sysd.alive());
}

// What the daemon gave the forger.
struct Forged {
  uint32_t capacity = 0, hdr_capacity = 0, hdr_max_sge = 0, ring_capacity = 0, get_max_sge = 0;
  uint64_t segment_size = 0, file_size = 0, hdr_size = 0, get_size = 0;
  int bad_commit = 0, no_pending = 0, zero = 0, huge = 0;
};

TEST(SrqResize, TheNewSegmentIsSizedFromTheDaemonsRecordNotTheForgedHeader) {
  SystemDaemon sysd;
  const std::string path = sysd.socket();
  Child nobody(true, [path](int sock) {
    RawConn raw(path);
    uint32_t srq = 0;
    uint64_t size = 0;
    std::vector<sv::Fd> fds;
    if (!hello_and_srq(raw, srq, size, fds)) return 2;
    void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0].get(), 0);
    if (p == MAP_FAILED) return 3;
    auto* h = static_cast<sv::shm::SrqSegmentHeader*>(p);
    h->capacity = 1u << 20;
    h->max_sge = 1000;
    h->size = uint64_t(1) << 34;
    h->ring_offset = 12345;
    auto* rh = reinterpret_cast<sv::shm::RingHeader*>(static_cast<char*>(p) + sv::shm::SrqLayout{16}.ring_offset());
    rh->capacity = 1u << 20;
    rh->mask = (1u << 20) - 1;
    Forged f{};
    sv::proto::CreateSrqReply rr{};
    std::vector<sv::Fd> got;
    f.zero = resize(raw, srq, 0, rr, got);
    f.huge = resize(raw, srq, sv::shm::kMaxQpWr + 1, rr, got);
    f.no_pending = done(raw, srq, 1);
    if (resize(raw, srq, 64, rr, got) != 0 || got.size() != 1) return 4;
    f.capacity = rr.capacity;
    f.segment_size = rr.segment_size;
    struct stat st {};
    fstat(got[0].get(), &st);
    f.file_size = uint64_t(st.st_size);
    void* q = mmap(nullptr, rr.segment_size, PROT_READ, MAP_SHARED, got[0].get(), 0);
    if (q == MAP_FAILED) return 5;
    auto* nh = static_cast<const sv::shm::SrqSegmentHeader*>(q);
    f.hdr_capacity = nh->capacity;
    f.hdr_max_sge = nh->max_sge;
    f.hdr_size = nh->size;
    f.ring_capacity =
        reinterpret_cast<const sv::shm::RingHeader*>(static_cast<const char*>(q) + nh->ring_offset)->capacity;
    f.bad_commit = done(raw, srq, 2);
    if (done(raw, srq, 1) != 0) return 6;
    sv::proto::ImportSrqReply ir{};
    got.clear();
    if (get(raw, srq, ir, got) != 0) return 7;
    f.get_max_sge = ir.max_sge;
    f.get_size = ir.segment_size;
    return send_val(sock, f) ? 0 : 8;
  });
  nobody.start();
  Forged f{};
  ASSERT_TRUE(recv_val(nobody.sock(), f)) << "the child failed: exit " << nobody.wait();
  const uint32_t cap = sv::shm::recv_ring_capacity(64);
  const uint64_t size = sv::shm::SrqLayout{cap}.size();
  EXPECT_EQ(EINVAL, f.zero);
  EXPECT_EQ(EINVAL, f.huge);
  EXPECT_EQ(EINVAL, f.no_pending);
  EXPECT_EQ(EINVAL, f.bad_commit);
  EXPECT_EQ(cap, f.capacity);
  EXPECT_EQ(size, f.segment_size);
  EXPECT_EQ(size, f.file_size);
  EXPECT_EQ(size, f.hdr_size);
  EXPECT_EQ(cap, f.hdr_capacity);
  EXPECT_EQ(cap, f.ring_capacity);
  EXPECT_EQ(1u, f.hdr_max_sge);  // as created, not the forged 1000
  EXPECT_EQ(1u, f.get_max_sge);
  EXPECT_EQ(size, f.get_size);
  EXPECT_EQ(0, nobody.wait());
  EXPECT_TRUE(sysd.alive());
}

}  // namespace
}  // namespace svsec
