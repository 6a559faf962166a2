// Seed 000: named shared memory regions (created by whoever comes first,
// attached by the rest, freed with the last registration) and reg_shared.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>

#include "common/paths.h"
#include "common/protocol.h"
#include "common/sys.h"
#include "harness.h"
#include "softverbs/softverbs.h"

namespace svtest {
namespace {

uint32_t region_count() {
  sv::Fd s;
  if (sv::connect_seqpacket(sv::socket_path(sv::runtime_dir()), s)) return ~0u;
  sv::proto::Empty req{};
  sv::proto::init_header(req, sv::proto::Op::Status, 1);
  sv::proto::StatusReply rep{};
  std::vector<sv::Fd> fds;
  size_t len = 0;
  if (sv::send_message(s.get(), &req, sizeof(req), {}) || sv::recv_message(s.get(), &rep, sizeof(rep), &len, fds))
    return ~0u;
  return rep.regions;
}

const char kId[] = "\x01\x02seed-000 region\xff";  // a byte array, not a string

TEST(ShmRegion, FirstCreatesOthersAttachNoOrderFreedWithLastDereg) {
  Side me;
  ASSERT_EQ(0, me.open({}));  // keeps the daemon up
  uint32_t base = region_count();
  constexpr int kProcs = 3;
  int to_child[kProcs][2], from_child[kProcs][2];
  pid_t pids[kProcs];
  for (int i = 0; i < kProcs; ++i) {
    ASSERT_EQ(0, pipe(to_child[i]));
    ASSERT_EQ(0, pipe(from_child[i]));
    pids[i] = fork();
    if (pids[i] == 0) {
      Side s;
      if (s.open({})) _exit(2);
      int created = -1;
      ibv_mr* mr = svx_reg_shmid(s.pd, kId, sizeof(kId), 8192, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE,
                                 &created);
      if (!mr || mr->length != 8192) _exit(3);
      auto* p = static_cast<uint8_t*>(mr->addr);
      p[i] = uint8_t(10 + i);  // each process writes its own byte
      char r[2] = {char('0' + created), 0};
      if (write(from_child[i][1], r, 1) != 1) _exit(4);
      char go;
      if (read(to_child[i][0], &go, 1) != 1) _exit(5);
      // Everyone's bytes are visible to everyone: one region.
      for (int k = 0; k < kProcs; ++k)
        if (p[k] != uint8_t(10 + k)) _exit(6);
      if (ibv_dereg_mr(mr)) _exit(7);
      if (write(from_child[i][1], "d", 1) != 1) _exit(8);
      _exit(0);
    }
  }
  int creators = 0;
  for (int i = 0; i < kProcs; ++i) {
    char c;
    ASSERT_EQ(1, read(from_child[i][0], &c, 1));
    creators += c == '1';
  }
  EXPECT_EQ(1, creators);
  EXPECT_EQ(base + 1, region_count());
  for (int i = 0; i < kProcs; ++i) ASSERT_EQ(1, write(to_child[i][1], "g", 1));
  for (int i = 0; i < kProcs; ++i) {
    char c;
    ASSERT_EQ(1, read(from_child[i][0], &c, 1));
    int st = 0;
    waitpid(pids[i], &st, 0);
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "child " << i << " status " << st;
  }
  EXPECT_EQ(base, region_count());  // freed with its last registration
  // The next caller creates it anew.
  int created = 0;
  ibv_mr* mr = svx_reg_shmid(me.pd, kId, sizeof(kId), 4096, IBV_ACCESS_LOCAL_WRITE, &created);
  ASSERT_NE(nullptr, mr);
  EXPECT_EQ(1, created);
  EXPECT_EQ(0, static_cast<uint8_t*>(mr->addr)[0]);
  // Attaching for more than the region holds is refused.
  errno = 0;
  EXPECT_EQ(nullptr, svx_reg_shmid(me.pd, kId, sizeof(kId), 1 << 20, IBV_ACCESS_LOCAL_WRITE, nullptr));
  EXPECT_EQ(EINVAL, errno);
  EXPECT_EQ(nullptr, svx_reg_shmid(me.pd, kId, 0, 4096, IBV_ACCESS_LOCAL_WRITE, nullptr));
  EXPECT_EQ(0, ibv_dereg_mr(mr));
  EXPECT_EQ(base, region_count());
}

TEST(ShmRegion, RemoteAccessToARegion) {
  Side me;
  Peer peer;
  PeerInfo info;
  ASSERT_EQ(0, connect_pair(me, peer, info));
  ibv_mr* mr = svx_reg_shmid(me.pd, "rdma", 4, 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE, nullptr);
  ASSERT_NE(nullptr, mr);
  peer.fill(8);
  EXPECT_EQ(IBV_WC_SUCCESS,
            peer.post(IBV_WR_RDMA_WRITE, 0, 4096, reinterpret_cast<uint64_t>(mr->addr), mr->rkey).status);
  EXPECT_EQ(peer.checksum(0, 4096), checksum(static_cast<uint8_t*>(mr->addr), 4096));
  // And as a local source: read back into the peer from the region.
  ibv_sge sge{reinterpret_cast<uint64_t>(mr->addr), 4096, mr->lkey};
  ibv_send_wr wr{};
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = info.addr + 8192;
  wr.wr.rdma.rkey = info.rkey;
  ibv_send_wr* bad;
  ASSERT_EQ(0, ibv_post_send(me.qp, &wr, &bad));
  ASSERT_EQ(IBV_WC_SUCCESS, poll(me.cq, 1)[0].status);
  EXPECT_EQ(peer.checksum(0, 4096), peer.checksum(8192, 4096));
  EXPECT_EQ(0, ibv_dereg_mr(mr));
}

TEST(ShmRegion, RegSharedMapsTheVeryPagesAndRefusesOthers) {
  int sv[2];
  ASSERT_EQ(0, socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv));
  pid_t child = fork();
  if (child == 0) {
    std::vector<sv::Fd> fds;
    uint32_t h[2];
    size_t len = 0;
    if (sv::recv_message(sv[1], h, sizeof(h), &len, fds) || fds.size() != 1) _exit(2);
    ibv_context* c = ibv_import_device(fds[0].get());
    ibv_pd* pd = c ? ibv_import_pd(c, h[0]) : nullptr;
    ibv_mr* theirs = pd ? ibv_import_mr(pd, h[1]) : nullptr;
    if (!theirs) _exit(3);
    // Map the parent's pages here, registered with our own keys.
    ibv_mr* mine = svx_reg_shared(theirs, pd, nullptr, IBV_ACCESS_LOCAL_WRITE);
    if (!mine || mine->lkey == theirs->lkey || mine->length != theirs->length) _exit(4);
    auto* p = static_cast<uint8_t*>(mine->addr);
    for (int i = 0; i < 100; ++i)
      if (p[i] != uint8_t(i)) _exit(5);  // the very same bytes
    p[200] = 77;                          // and the same pages: the parent sees it
    // Pages that are not the MR's: refused.
    void* other = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    errno = 0;
    if (svx_reg_shared(theirs, pd, other, IBV_ACCESS_LOCAL_WRITE) || errno != EINVAL) _exit(6);
    // The mapping we made ourselves is accepted when named explicitly.
    ibv_mr* again = svx_reg_shared(theirs, pd, mine->addr, IBV_ACCESS_LOCAL_WRITE);
    if (!again) _exit(7);
    ibv_dereg_mr(again);
    ibv_dereg_mr(mine);
    if (write(sv[1], "k", 1) != 1) _exit(8);
    _exit(0);
  }
  Side me;
  Side::Options o;
  o.len = 4096;
  ASSERT_EQ(0, me.open(o));
  for (int i = 0; i < 4096; ++i) me.buf[i] = uint8_t(i);
  uint32_t h[2] = {me.pd->handle, me.mr->handle};
  int fds[1] = {me.ctx->cmd_fd};
  ASSERT_EQ(0, sv::send_message(sv[0], h, sizeof(h), fds));
  char c;
  ASSERT_EQ(1, read(sv[0], &c, 1));
  int st = 0;
  waitpid(child, &st, 0);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << st;
  EXPECT_EQ(77, me.buf[200]);
  close(sv[0]);
  close(sv[1]);
}

}  // namespace
}  // namespace svtest
