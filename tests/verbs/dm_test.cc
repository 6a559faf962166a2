// Device memory (ibv_alloc_dm(3)): allocation within max_dm_size, copies,
// zero-based MRs over it reached by a peer process (RDMA WRITE, READ,
// atomics) and by this process's own work requests, import by a process
// sharing the context, and what is refused: bad handles, copies and
// registrations beyond the DM, another context's DM, forged requests.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <algorithm>
#include <cstring>
#include <span>
#include <vector>

#include "common/paths.h"
#include "common/protocol.h"
#include "common/sys.h"
#include "harness.h"

namespace svtest {
namespace {

constexpr int kRemoteAccess = IBV_ACCESS_ZERO_BASED | IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                              IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;

ibv_context* open_first_device() {
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (!list || n < 1) return nullptr;
  ibv_context* c = ibv_open_device(list[0]);
  ibv_free_device_list(list);
  return c;
}

uint64_t max_dm_size(ibv_context* c) {
  ibv_device_attr_ex a{};
  return ibv_query_device_ex(c, nullptr, &a) == 0 ? a.max_dm_size : 0;
}

ibv_dm* alloc(ibv_context* c, size_t len, uint32_t log_align = 0, uint32_t comp_mask = 0) {
  ibv_alloc_dm_attr a{len, log_align, comp_mask};
  return ibv_alloc_dm(c, &a);
}

TEST(DeviceMemory, AllocCopyFreeWithinMaxDmSize) {
  ibv_context* c = open_first_device();
  ASSERT_NE(nullptr, c);
  const uint64_t max = max_dm_size(c);
  EXPECT_EQ(sv::proto::kMaxDmSize, max);
  ibv_dm* dm = alloc(c, 4096, 6);
  ASSERT_NE(nullptr, dm);
  EXPECT_EQ(c, dm->context);
  EXPECT_TRUE(dm->comp_mask & IBV_DM_MASK_HANDLE);
  std::vector<uint8_t> in(4096), out(4096, 0);
  for (size_t i = 0; i < in.size(); ++i) in[i] = pattern(3, i);
  ASSERT_EQ(0, ibv_memcpy_to_dm(dm, 0, in.data(), in.size()));
  ASSERT_EQ(0, ibv_memcpy_from_dm(out.data(), dm, 0, out.size()));
  EXPECT_EQ(in, out);
  // A part of it, at a word offset.
  uint32_t w = 0;
  ASSERT_EQ(0, ibv_memcpy_from_dm(&w, dm, 40, 4));
  EXPECT_EQ(0, std::memcmp(&w, &in[40], 4));
  EXPECT_EQ(0, ibv_free_dm(dm));

  // All of max_dm_size at once, nothing beyond it; freeing makes room again.
  ibv_dm* all = alloc(c, max);
  ASSERT_NE(nullptr, all);
  errno = 0;
  EXPECT_EQ(nullptr, alloc(c, 4));
  EXPECT_EQ(ENOMEM, errno);
  EXPECT_EQ(0, ibv_free_dm(all));
  errno = 0;
  EXPECT_EQ(nullptr, alloc(c, max + 1));
  EXPECT_EQ(ENOMEM, errno);
  // Each DM counts in whole pages: max / page DMs of 4 bytes fit, one more does not.
  std::vector<ibv_dm*> small;
  for (uint64_t i = 0; i < max / sv::page_size(); ++i) {
    small.push_back(alloc(c, 4));
    ASSERT_NE(nullptr, small.back()) << i;
  }
  EXPECT_EQ(nullptr, alloc(c, 4));
  for (ibv_dm* d : small) EXPECT_EQ(0, ibv_free_dm(d));
  ibv_dm* again = alloc(c, max);
  EXPECT_NE(nullptr, again);
  if (again) {
    EXPECT_EQ(0, ibv_free_dm(again));
  }
  ASSERT_EQ(0, ibv_close_device(c));
}

// A context's DMs go with it, whether its process closes it with a DM and
// an MR over it still there, or dies holding them: all of max_dm_size is
// free again (the daemon's release of a closed connection may come a turn
// of its loop after our next request, hence the deadline).
TEST(DeviceMemory, ClosingTheContextReleasesItsDeviceMemory) {
  for (int round = 0; round < 4; ++round) {
    pid_t child = fork();
    if (child == 0) {
      ibv_context* c = open_first_device();
      ibv_pd* pd = c ? ibv_alloc_pd(c) : nullptr;
      ibv_dm* dm = pd ? alloc(c, max_dm_size(c)) : nullptr;
      if (!dm) _exit(2);
      if (!ibv_reg_dm_mr(pd, dm, 0, 4096, kRemoteAccess)) _exit(3);
      if (round % 2 == 0 && ibv_close_device(c)) _exit(4);
      _exit(0);  // odd rounds: the process goes with the context open
    }
    int st = 0;
    ASSERT_EQ(child, waitpid(child, &st, 0));
    ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "round " << round << ": child status " << st;
    ibv_context* c = open_first_device();
    ASSERT_NE(nullptr, c);
    ibv_dm* dm = nullptr;
    for (uint64_t until = sv::monotonic_ns() + 5'000'000'000ull; !dm && sv::monotonic_ns() < until;) {
      dm = alloc(c, max_dm_size(c));
      if (!dm) usleep(1000);
    }
    EXPECT_NE(nullptr, dm) << "round " << round << ": the child's DM was not released";
    if (dm) {
      EXPECT_EQ(0, ibv_free_dm(dm));
    }
    ASSERT_EQ(0, ibv_close_device(c));
  }
}

// The DM is this process's; the peer process reaches it through the MR's
// R_Key at zero-based addresses, as it would reach any MR.
class DmPeer : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(0, connect_pair(me, peer, info));
    dm = alloc(me.ctx, kLen);
    ASSERT_NE(nullptr, dm);
    std::vector<uint8_t> zero(kLen, 0);
    ASSERT_EQ(0, ibv_memcpy_to_dm(dm, 0, zero.data(), kLen));
    mr = ibv_reg_dm_mr(me.pd, dm, kMrOffset, kMrLen, kRemoteAccess);
    ASSERT_NE(nullptr, mr);
    EXPECT_EQ(nullptr, mr->addr);  // zero-based
    EXPECT_EQ(kMrLen, mr->length);
  }
  void TearDown() override {
    if (mr) {
      EXPECT_EQ(0, ibv_dereg_mr(mr));
    }
    if (dm) {
      EXPECT_EQ(0, ibv_free_dm(dm));
    }
  }
  uint64_t dm_checksum(uint64_t off, uint64_t len) {
    std::vector<uint8_t> b(len);
    EXPECT_EQ(0, ibv_memcpy_from_dm(b.data(), dm, off, len));
    return checksum(b.data(), len);
  }

  static constexpr size_t kLen = 16384;
  static constexpr uint64_t kMrOffset = 4096;  // the MR starts here in the DM
  static constexpr size_t kMrLen = 8192;
  Side me;
  Peer peer;
  PeerInfo info{};
  ibv_dm* dm = nullptr;
  ibv_mr* mr = nullptr;
};

TEST_F(DmPeer, PeerWritesReadsAndAddsAtomicallyIntoDeviceMemory) {
  peer.fill(7);
  // RDMA WRITE at MR address 100: DM offset kMrOffset + 100.
  ASSERT_EQ(IBV_WC_SUCCESS, peer.post(IBV_WR_RDMA_WRITE, 0, 1000, 100, mr->rkey).status);
  EXPECT_EQ(peer.checksum(0, 1000), dm_checksum(kMrOffset + 100, 1000));
  EXPECT_EQ(dm_checksum(0, kMrOffset), checksum(std::vector<uint8_t>(kMrOffset, 0).data(), kMrOffset));

  // RDMA READ of what this process copied in.
  std::vector<uint8_t> src(512);
  for (size_t i = 0; i < src.size(); ++i) src[i] = pattern(9, i);
  ASSERT_EQ(0, ibv_memcpy_to_dm(dm, kMrOffset + 2048, src.data(), src.size()));
  ASSERT_EQ(IBV_WC_SUCCESS, peer.post(IBV_WR_RDMA_READ, 4096, 512, 2048, mr->rkey).status);
  EXPECT_EQ(checksum(src.data(), src.size()), peer.checksum(4096, 512));

  // Atomics on a word of it.
  ASSERT_EQ(0, peer.fetch_add(25, 8, mr->rkey));
  uint64_t v = 0;
  ASSERT_EQ(0, ibv_memcpy_from_dm(&v, dm, kMrOffset + 8, 8));
  EXPECT_EQ(25u, v);

  // One byte beyond the MR: a remote access error, nothing written.
  const uint64_t before = dm_checksum(0, kLen);
  EXPECT_EQ(IBV_WC_REM_ACCESS_ERR, peer.post(IBV_WR_RDMA_WRITE, 0, 8, kMrLen - 4, mr->rkey).status);
  EXPECT_EQ(before, dm_checksum(0, kLen));
}

TEST_F(DmPeer, LocalWorkRequestsUseDeviceMemoryByItsLkey) {
  std::vector<uint8_t> src(1024);
  for (size_t i = 0; i < src.size(); ++i) src[i] = pattern(5, i);
  ASSERT_EQ(0, ibv_memcpy_to_dm(dm, kMrOffset + 64, src.data(), src.size()));
  // RDMA WRITE from the DM (MR address 64) into the peer's buffer.
  ibv_sge sge{64, 1024, mr->lkey};
  ibv_send_wr wr{};
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = info.addr + 512;
  wr.wr.rdma.rkey = info.rkey;
  ibv_send_wr* bad = nullptr;
  ASSERT_EQ(0, ibv_post_send(me.qp, &wr, &bad));
  auto c = poll(me.cq, 1);
  ASSERT_EQ(1u, c.size());
  EXPECT_EQ(IBV_WC_SUCCESS, c[0].status);
  EXPECT_EQ(checksum(src.data(), src.size()), peer.checksum(512, 1024));

  // RDMA READ from the peer into the DM (MR address 4096).
  peer.fill(11);
  sge = {4096, 2048, mr->lkey};
  wr.opcode = IBV_WR_RDMA_READ;
  wr.wr.rdma.remote_addr = info.addr;
  ASSERT_EQ(0, ibv_post_send(me.qp, &wr, &bad));
  c = poll(me.cq, 1);
  ASSERT_EQ(1u, c.size());
  EXPECT_EQ(IBV_WC_SUCCESS, c[0].status);
  EXPECT_EQ(peer.checksum(0, 2048), dm_checksum(kMrOffset + 4096, 2048));
}

// ibv_import_dm(3) in a process that imported the context
// (ibv_import_device): the same memory, by handle, both ways.
TEST(DeviceMemory, AProcessSharingTheContextImportsTheDm) {
  int sv[2];
  ASSERT_EQ(0, socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv));
  pid_t child = fork();
  if (child == 0) {
    ::close(sv[0]);
    std::vector<sv::Fd> fds;
    uint32_t handle = 0;
    size_t len = 0;
    if (sv::recv_message(sv[1], &handle, sizeof(handle), &len, fds) || fds.size() != 1) _exit(2);
    ibv_context* c = ibv_import_device(fds[0].get());
    if (!c) _exit(3);
    ibv_dm* dm = ibv_import_dm(c, handle);
    if (!dm || dm->handle != handle) _exit(4);
    std::vector<uint8_t> got(8192), want(8192);
    for (size_t i = 0; i < want.size(); ++i) want[i] = pattern(21, i);
    if (ibv_memcpy_from_dm(got.data(), dm, 0, got.size()) || got != want) _exit(5);
    // The same bounds as the allocator's handle.
    if (ibv_memcpy_from_dm(got.data(), dm, 4, got.size()) != EINVAL) _exit(6);
    const uint32_t mark = 0x5eedf00d;
    if (ibv_memcpy_to_dm(dm, 8188, &mark, 4)) _exit(7);
    // An MR over the imported DM, from a PD of the shared context.
    ibv_pd* pd = ibv_alloc_pd(c);
    ibv_mr* mr = pd ? ibv_reg_dm_mr(pd, dm, 0, 8192, kRemoteAccess) : nullptr;
    if (!mr || ibv_dereg_mr(mr) || ibv_dealloc_pd(pd)) _exit(8);
    ibv_unimport_dm(dm);
    if (ibv_close_device(c)) _exit(9);
    _exit(put<uint32_t>(sv[1], 1) ? 0 : 10);
  }
  ::close(sv[1]);
  ibv_context* c = open_first_device();
  ASSERT_NE(nullptr, c);
  ibv_dm* dm = alloc(c, 8192);
  ASSERT_NE(nullptr, dm);
  std::vector<uint8_t> data(8192);
  for (size_t i = 0; i < data.size(); ++i) data[i] = pattern(21, i);
  ASSERT_EQ(0, ibv_memcpy_to_dm(dm, 0, data.data(), data.size()));
  int fds[1] = {c->cmd_fd};
  ASSERT_EQ(0, sv::send_message(sv[0], &dm->handle, sizeof(dm->handle), fds));
  uint32_t done = 0;
  EXPECT_TRUE(get(sv[0], done));
  int st = 0;
  ASSERT_EQ(child, waitpid(child, &st, 0));
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "child status " << st;
  uint32_t mark = 0;
  ASSERT_EQ(0, ibv_memcpy_from_dm(&mark, dm, 8188, 4));
  EXPECT_EQ(0x5eedf00du, mark);
  EXPECT_EQ(0, ibv_free_dm(dm));
  ::close(sv[0]);
  EXPECT_EQ(0, ibv_close_device(c));
}

// Children forked after the context was opened use it at once, each on a
// connection of its own joined to the same context (a shared socket
// crossed their replies: rdma-core's test_multi_process_alloc_dm).
TEST(DeviceMemory, ForkedChildrenAllocateOnTheirParentsContextAtOnce) {
  ibv_context* c = open_first_device();
  ASSERT_NE(nullptr, c);
  const uint64_t each = max_dm_size(c) / 2 / 5;
  std::vector<pid_t> kids;
  for (int i = 0; i < 5; ++i) {
    pid_t pid = fork();
    if (pid == 0) {
      for (int round = 0; round < 20; ++round) {
        ibv_dm* dm = alloc(c, each);
        if (!dm) _exit(10 + errno % 100);
        const uint32_t v = uint32_t(getpid()) ^ uint32_t(round);
        uint32_t back = 0;
        if (ibv_memcpy_to_dm(dm, 0, &v, 4) || ibv_memcpy_from_dm(&back, dm, 0, 4) || back != v) _exit(2);
        if (ibv_free_dm(dm)) _exit(3);
      }
      _exit(0);
    }
    ASSERT_GT(pid, 0);
    kids.push_back(pid);
  }
  // The parent goes on using its connection meanwhile.
  for (int round = 0; round < 20; ++round) {
    ibv_dm* dm = alloc(c, each);
    ASSERT_NE(nullptr, dm) << errno;
    EXPECT_EQ(0, ibv_free_dm(dm));
  }
  for (pid_t k : kids) {
    int st = 0;
    ASSERT_EQ(k, waitpid(k, &st, 0));
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "child status " << st;
  }
  EXPECT_EQ(0, ibv_close_device(c));
}

// ---- What is refused -------------------------------------------------------

TEST(DeviceMemoryRefuses, CopiesBeyondTheAllocationOrOffWords) {
  ibv_context* c = open_first_device();
  ASSERT_NE(nullptr, c);
  ibv_dm* dm = alloc(c, 100);
  ASSERT_NE(nullptr, dm);
  std::vector<uint8_t> b(256, 0xab);
  const uint64_t before_cases[][2] = {{100, 4},       {96, 8},   {0, 104}, {UINT64_MAX - 3, 8},
                                      {4, UINT64_MAX - 3}, {3, 4}, {4, 3},   {0, 101}};
  for (auto& cs : before_cases) {
    EXPECT_EQ(EINVAL, ibv_memcpy_to_dm(dm, cs[0], b.data(), size_t(cs[1]))) << cs[0] << "+" << cs[1];
    EXPECT_EQ(EINVAL, ibv_memcpy_from_dm(b.data(), dm, cs[0], size_t(cs[1]))) << cs[0] << "+" << cs[1];
  }
  // The last word, and nothing: fine.
  EXPECT_EQ(0, ibv_memcpy_to_dm(dm, 96, b.data(), 4));
  EXPECT_EQ(0, ibv_memcpy_from_dm(b.data(), dm, 100, 0));
  EXPECT_EQ(0, ibv_free_dm(dm));
  ASSERT_EQ(0, ibv_close_device(c));
}

TEST(DeviceMemoryRefuses, BadAllocationsAndRegistrations) {
  ibv_context* c = open_first_device();
  ASSERT_NE(nullptr, c);
  ibv_pd* pd = ibv_alloc_pd(c);
  ASSERT_NE(nullptr, pd);
  errno = 0;
  EXPECT_EQ(nullptr, alloc(c, 0));
  EXPECT_EQ(EINVAL, errno);
  EXPECT_EQ(nullptr, alloc(c, 64, 0, 1));  // no comp_mask bit is defined
  EXPECT_EQ(EINVAL, errno);
  EXPECT_EQ(nullptr, alloc(c, 64, 13));  // beyond a page's alignment
  EXPECT_EQ(EINVAL, errno);
  EXPECT_EQ(nullptr, alloc(c, SIZE_MAX));
  EXPECT_EQ(ENOMEM, errno);

  ibv_dm* dm = alloc(c, 100);
  ASSERT_NE(nullptr, dm);
  const int base = IBV_ACCESS_ZERO_BASED | IBV_ACCESS_LOCAL_WRITE;
  struct {
    uint64_t off;
    size_t len;
    int access;
  } bad[] = {
      {0, 104, base},                                  // beyond the DM
      {100, 4, base},                                  // starts at its end
      {8, 96, base},                                   // ends beyond it
      {UINT64_MAX - 7, 16, base},                      // offset + length wraps
      {0, 64, IBV_ACCESS_LOCAL_WRITE},                 // not zero-based
      {0, 64, IBV_ACCESS_ZERO_BASED | IBV_ACCESS_REMOTE_WRITE},  // remote write without local write
      {0, 64, base | (1 << 30)},                       // an unknown access bit
  };
  for (auto& b : bad) {
    errno = 0;
    EXPECT_EQ(nullptr, ibv_reg_dm_mr(pd, dm, b.off, b.len, unsigned(b.access))) << b.off << "+" << b.len;
    EXPECT_EQ(EINVAL, errno) << b.off << "+" << b.len;
  }
  // Exactly the DM, and an empty MR at its end: fine.
  ibv_mr* whole = ibv_reg_dm_mr(pd, dm, 0, 100, base);
  ASSERT_NE(nullptr, whole);
  ibv_mr* empty = ibv_reg_dm_mr(pd, dm, 100, 0, base);
  ASSERT_NE(nullptr, empty);
  // Not freed while MRs are registered over it, nor re-registered.
  EXPECT_EQ(EBUSY, ibv_free_dm(dm));
  std::vector<uint8_t> buf(64);
  EXPECT_NE(0, ibv_rereg_mr(whole, IBV_REREG_MR_CHANGE_TRANSLATION, pd, buf.data(), buf.size(), base));
  EXPECT_EQ(0, ibv_dereg_mr(whole));
  EXPECT_EQ(EBUSY, ibv_free_dm(dm));
  EXPECT_EQ(0, ibv_dereg_mr(empty));
  EXPECT_EQ(0, ibv_free_dm(dm));
  EXPECT_EQ(0, ibv_dealloc_pd(pd));
  ASSERT_EQ(0, ibv_close_device(c));
}

TEST(DeviceMemoryRefuses, ImportingADmOfAContextNotSharedOrNoDmAtAll) {
  ibv_context* a = open_first_device();
  ibv_context* b = open_first_device();  // another context of this process: not shared with a
  ASSERT_NE(nullptr, a);
  ASSERT_NE(nullptr, b);
  ibv_dm* dm = alloc(a, 4096);
  ASSERT_NE(nullptr, dm);
  ibv_pd* pd = ibv_alloc_pd(a);
  ASSERT_NE(nullptr, pd);
  errno = 0;
  EXPECT_EQ(nullptr, ibv_import_dm(b, dm->handle));
  EXPECT_EQ(EINVAL, errno);
  // Handles that are no DM: none at all, a PD's, a huge one.
  for (uint32_t h : {0u, pd->handle, 0xdeadbeefu, dm->handle + 1000}) {
    errno = 0;
    EXPECT_EQ(nullptr, ibv_import_dm(a, h)) << h;
    EXPECT_EQ(EINVAL, errno) << h;
  }
  // And the right one from the right context works.
  ibv_dm* same = ibv_import_dm(a, dm->handle);
  ASSERT_NE(nullptr, same);
  ibv_unimport_dm(same);
  EXPECT_EQ(0, ibv_free_dm(dm));
  EXPECT_EQ(0, ibv_dealloc_pd(pd));
  EXPECT_EQ(0, ibv_close_device(b));
  EXPECT_EQ(0, ibv_close_device(a));
}

// Requests a client could forge, sent raw to the daemon (docs/PROTOCOL.md,
// "Device memory"): the daemon checks every field itself.
class RawDaemon {
 public:
  RawDaemon() { EXPECT_EQ(0, sv::connect_seqpacket(sv::socket_path(sv::runtime_dir()), sock_)); }
  template <class Req, class Rep = sv::proto::Empty>
  int send(sv::proto::Op op, Req& r, Rep* rep = nullptr, std::span<const int> fds = {}) {
    sv::proto::init_header(r, op, 9);
    if (sv::send_message(sock_.get(), &r, sizeof(r), fds) != 0) return -1;
    uint8_t buf[sv::proto::kMaxMessage];
    size_t n = 0;
    std::vector<sv::Fd> got;
    if (sv::recv_message(sock_.get(), buf, sizeof(buf), &n, got) != 0 || n < sizeof(sv::proto::Header)) return -1;
    if (rep) std::memcpy(rep, buf, std::min(n, sizeof(Rep)));
    sv::proto::Header h;
    std::memcpy(&h, buf, sizeof(h));
    return h.status;
  }

 private:
  sv::Fd sock_;
};

TEST(DeviceMemoryRefuses, ForgedRequests) {
  namespace proto = sv::proto;
  ibv_context* c = open_first_device();
  ASSERT_NE(nullptr, c);
  ibv_pd* pd = ibv_alloc_pd(c);
  ibv_dm* dm = alloc(c, 8192);
  ASSERT_NE(nullptr, dm);
  {
    // A stranger (its own context) names the DM: nothing of it is reachable.
    RawDaemon stranger;
    proto::HandleReq h{};
    h.handle = dm->handle;
    proto::DmReply rep{};
    EXPECT_EQ(EINVAL, stranger.send(proto::Op::ImportDm, h, &rep));
    EXPECT_EQ(EINVAL, stranger.send(proto::Op::FreeDm, h));
    proto::RegDmMrReq r{};
    r.pd = pd->handle;
    r.dm = dm->handle;
    r.length = 64;
    r.access = IBV_ACCESS_ZERO_BASED;
    proto::RegMrReply mrep{};
    EXPECT_EQ(EINVAL, stranger.send(proto::Op::RegDmMr, r, &mrep));
    proto::AllocDmReq a{};
    a.length = UINT64_MAX;
    EXPECT_EQ(ENOMEM, stranger.send(proto::Op::AllocDm, a, &rep));
    a.length = 64;
    a.log_align_req = UINT32_MAX;
    EXPECT_EQ(EINVAL, stranger.send(proto::Op::AllocDm, a, &rep));
  }
  {
    // A process in the context (ImportContext) that skips the library's
    // checks: a DM's backing is registered only through RegDmMr, and an MR
    // over a DM is not re-registered or re-shared.
    RawDaemon inside;
    proto::Empty e{};
    int fds[1] = {c->cmd_fd};
    ASSERT_EQ(0, inside.send(proto::Op::ImportContext, e, static_cast<proto::Empty*>(nullptr), fds));
    proto::AllocDmReq a{};
    a.length = 4096;
    proto::DmReply d{};
    ASSERT_EQ(0, inside.send(proto::Op::AllocDm, a, &d));
    proto::RegMrReq m{};
    m.pd = pd->handle;
    m.backing = d.backing;
    m.addr = 0;
    m.length = 4096;
    m.access = IBV_ACCESS_LOCAL_WRITE;
    proto::RegMrReply mrep{};
    EXPECT_EQ(EINVAL, inside.send(proto::Op::RegMr, m, &mrep));
    proto::RegDmMrReq r{};
    r.pd = pd->handle;
    r.dm = d.handle;
    r.offset = 4;
    r.length = UINT64_MAX - 2;  // wraps
    r.access = IBV_ACCESS_ZERO_BASED;
    EXPECT_EQ(EINVAL, inside.send(proto::Op::RegDmMr, r, &mrep));
    r.length = 4092;
    ASSERT_EQ(0, inside.send(proto::Op::RegDmMr, r, &mrep));
    proto::ReregMrReq rr{};
    rr.handle = mrep.handle;
    rr.flags = IBV_REREG_MR_CHANGE_ACCESS;
    rr.access = IBV_ACCESS_ZERO_BASED | IBV_ACCESS_LOCAL_WRITE;
    proto::RegMrReply rrep{};
    EXPECT_EQ(EINVAL, inside.send(proto::Op::ReregMr, rr, &rrep));
    proto::RegSharedReq sh{};
    sh.key = mrep.key;
    sh.pd = pd->handle;
    sh.iova = 4096;
    EXPECT_EQ(EINVAL, inside.send(proto::Op::RegShared, sh, &rrep));
    proto::HandleReq h{};
    h.handle = d.handle;
    EXPECT_EQ(EBUSY, inside.send(proto::Op::FreeDm, h));
    h.handle = mrep.handle;
    EXPECT_EQ(0, inside.send(proto::Op::DeregMr, h));
    h.handle = d.handle;
    EXPECT_EQ(0, inside.send(proto::Op::FreeDm, h));
    EXPECT_EQ(EINVAL, inside.send(proto::Op::FreeDm, h));  // twice
  }
  EXPECT_EQ(0, ibv_free_dm(dm));
  EXPECT_EQ(0, ibv_dealloc_pd(pd));
  EXPECT_EQ(0, ibv_close_device(c));
}

}  // namespace
}  // namespace svtest
