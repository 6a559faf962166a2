// `softverbs capture` between users (common/capture_ring.h): a user's
// processes write their packets into that user's ring only, a ring a
// regular file of theirs with mode 0600 in /dev/shm. The attacks, by
// nobody against root's processes on a private system daemon:
//  - nobody squats the name of root's ring (a valid ring of its own, mode
//    0666) before root's programs start, to read what they would write
//    into it: they must write nothing there (while a ring of root's own,
//    made by root at the same name, does get their packets);
//  - nobody opens root's ring, asks `softverbs capture --uid 0`, and writes
//    forged packets into its own ring: refused, refused, and what it
//    forged (and its own traffic) reaches nobody's ring, none of root's;
//  - between root's QP and nobody's (mediated), each user's ring gets its
//    own requests only.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>

#include "attack.h"
#include "common/capture_ring.h"

namespace svsec {
namespace capture_test {  // this file's own (unity builds join files)
namespace {

using sv::capture::Ring;
using sv::capture::Slot;
constexpr uint8_t kForged[] = {0x45, 0, 0, 40, 'F', 'O', 'R', 'G', 'E', 'D'};

// Two RC QPs of this process connected to each other (the shared-memory
// path), one RDMA WRITE and one FETCH_AND_ADD between them; true if both
// succeeded.
bool traffic() {
  RcEnd a, b;
  if (!a.open() || !b.open()) return false;
  static uint64_t mem[2][64];
  ibv_mr* ma = ibv_reg_mr(a.pd, mem[0], sizeof mem[0], IBV_ACCESS_LOCAL_WRITE);
  ibv_mr* mb = ibv_reg_mr(b.pd, mem[1], sizeof mem[1],
                          IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC);
  if (!ma || !mb || qp_to_rts(a.ctx, a.qp, b.qp->qp_num) || qp_to_rts(b.ctx, b.qp, a.qp->qp_num)) return false;
  const bool ok = a.post(IBV_WR_RDMA_WRITE, mem[0], 64, ma->lkey, uintptr_t(mem[1]), mb->rkey) == 0 &&
                  a.post(IBV_WR_ATOMIC_FETCH_AND_ADD, mem[0] + 8, 8, ma->lkey, uintptr_t(mem[1]) + 128, mb->rkey) == 0;
  ibv_dereg_mr(ma), ibv_dereg_mr(mb);
  ibv_destroy_qp(a.qp), ibv_destroy_qp(b.qp);
  ibv_destroy_cq(a.cq), ibv_destroy_cq(b.cq);
  ibv_dealloc_pd(a.pd), ibv_dealloc_pd(b.pd);
  ibv_close_device(a.ctx), ibv_close_device(b.ctx);
  return ok;
}

std::string path_of(uid_t uid) { return sv::capture::ring_path(uid, sv::capture::daemon_dir()); }

struct Read {
  uint64_t packets = 0, forged = 0, of_pid = 0;
};
// Everything in `r` now; `pid`: count that process's packets.
Read drain(Ring& r, uint32_t pid) {
  Read out;
  auto s = std::make_unique<Slot>();
  uint64_t lost = 0;
  for (int idle = 0; idle < 50;) {
    if (!r.read(*s, &lost)) {
      idle++;
      usleep(2000);
      continue;
    }
    out.packets++;
    if (s->len >= sizeof kForged && !std::memcmp(s->data, kForged, sizeof kForged)) out.forged++;
    if (s->pid == pid) out.of_pid++;
  }
  return out;
}

TEST(Capture, NobodySquattingRootsRingNameGetsNoneOfRootsPackets) {
  SystemDaemon d;
  ASSERT_TRUE(d.alive());
  Child nobody(true, [](int sock) {
    const std::string path = path_of(0);
    Ring r;
    std::string why;
    if (path.empty() || r.create(path, kNobody, &why) != 0 || ::chmod(path.c_str(), 0666) != 0) return 10;
    int step = 1;
    if (!send_val(sock, step) || !recv_val(sock, step)) return 11;
    const uint64_t got = r.header()->next.load();
    ::unlink(path.c_str());
    return got == 0 ? 0 : 1;
  });
  nobody.start();
  int step = 0;
  ASSERT_TRUE(recv_val(nobody.sock(), step));
  struct stat st {};
  ASSERT_EQ(0, ::stat(path_of(0).c_str(), &st));
  ASSERT_EQ(kNobody, st.st_uid) << "nobody's ring is in place under root's name";
  ASSERT_TRUE(traffic());
  usleep(100'000);
  ASSERT_TRUE(send_val(nobody.sock(), step));
  EXPECT_EQ(0, nobody.wait()) << "root's process wrote packets into nobody's ring";

  // The control: a ring of root's own at that name gets the same traffic.
  Ring mine;
  std::string why;
  ASSERT_EQ(0, mine.create(path_of(0), 0, &why)) << why;
  ASSERT_TRUE(traffic());
  const Read r = drain(mine, uint32_t(getpid()));
  ::unlink(path_of(0).c_str());
  EXPECT_EQ(4u, r.packets) << "RDMA WRITE Only, Acknowledge, FetchAdd, ATOMIC Acknowledge";
}

TEST(Capture, RootsRingIsRootsAloneAndNobodysForgeriesStayNobodys) {
  SystemDaemon d;
  ASSERT_TRUE(d.alive());
  Child nobody(true, [](int sock) {
    int step = 0;
    if (!recv_val(sock, step)) return 10;
    int fd = ::open(path_of(0).c_str(), O_RDONLY | O_NOFOLLOW);
    if (fd >= 0 || errno != EACCES) return 11;
    fd = ::open(path_of(0).c_str(), O_RDWR | O_NOFOLLOW);
    if (fd >= 0 || errno != EACCES) return 12;
    const std::string cmd = build_bin("softverbs") + " capture --uid 0 -c 1 --duration 1 -w /dev/null 2>/dev/null";
    const int rc = std::system(cmd.c_str());
    if (!WIFEXITED(rc) || WEXITSTATUS(rc) != 1) return 13;
    Ring own;
    std::string why;
    if (own.create(path_of(kNobody), kNobody, &why) != 0) return 14;
    for (int i = 0; i < 8; i++) own.write(kForged, 0x123456, 1);
    if (!traffic()) return 15;
    const Read r = drain(own, uint32_t(getpid()));
    ::unlink(path_of(kNobody).c_str());
    if (r.forged != 8 || r.of_pid != 8 + 4) return 16;  // its forgeries and its own packets: nobody's to see
    return send_val(sock, step) ? 0 : 17;
  });
  Ring roots;
  std::string why;
  ASSERT_EQ(0, roots.create(path_of(0), 0, &why)) << why;
  nobody.start();
  int step = 1;
  ASSERT_TRUE(send_val(nobody.sock(), step));
  ASSERT_TRUE(recv_val(nobody.sock(), step));
  const pid_t child = nobody.pid();
  EXPECT_EQ(0, nobody.wait());
  ASSERT_TRUE(traffic());
  const Read r = drain(roots, uint32_t(child));
  ::unlink(path_of(0).c_str());
  EXPECT_EQ(0u, r.forged) << "nobody's forged packets reached root's capture";
  EXPECT_EQ(0u, r.of_pid) << "nobody's packets reached root's capture";
  EXPECT_EQ(4u, r.packets) << "root's own traffic is there";
}

struct Mr {
  uint32_t qpn, rkey;
  uint64_t addr;
};

// Root's QP and nobody's connected (the daemon carries each request:
// mediated). Each side's requests are rendered into its own user's ring:
// root's WRITE and FETCH_AND_ADD (4 packets) into root's, nobody's WRITE (2)
// into nobody's; neither ring gets a packet of the other user's.
TEST(Capture, MediatedRequestsReachTheRequestersRingOnly) {
  SystemDaemon d;
  ASSERT_TRUE(d.alive());
  Child nobody(true, [](int sock) {
    Ring own;
    std::string why;
    if (own.create(path_of(kNobody), kNobody, &why) != 0) return 10;
    RcEnd me;
    static uint64_t mem[64];
    if (!me.open()) return 11;
    ibv_mr* mr = ibv_reg_mr(me.pd, mem, sizeof mem,
                           IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC);
    Mr mine{me.qp->qp_num, mr ? mr->rkey : 0, uintptr_t(mem)}, roots{};
    if (!mr || !send_val(sock, mine) || !recv_val(sock, roots) || qp_to_rts(me.ctx, me.qp, roots.qpn)) return 12;
    int step = 1;
    if (!send_val(sock, step) || !recv_val(sock, step)) return 13;  // root's requests are done
    if (me.post(IBV_WR_RDMA_WRITE, mem + 8, 64, mr->lkey, roots.addr, roots.rkey) != 0) return 14;
    const Read r = drain(own, uint32_t(getpid()));
    ::unlink(path_of(kNobody).c_str());
    return r.packets == 2 && r.of_pid == 2 ? 0 : 15;
  });
  Ring roots;
  std::string why;
  ASSERT_EQ(0, roots.create(path_of(0), 0, &why)) << why;
  nobody.start();
  RcEnd me;
  static uint64_t mem[64];
  ASSERT_TRUE(me.open());
  ibv_mr* mr = ibv_reg_mr(me.pd, mem, sizeof mem, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  ASSERT_NE(nullptr, mr);
  Mr theirs{}, mine{me.qp->qp_num, mr->rkey, uintptr_t(mem)};
  ASSERT_TRUE(recv_val(nobody.sock(), theirs));
  ASSERT_TRUE(send_val(nobody.sock(), mine));
  ASSERT_EQ(0, qp_to_rts(me.ctx, me.qp, theirs.qpn));
  int step = 0;
  ASSERT_TRUE(recv_val(nobody.sock(), step));
  EXPECT_EQ(0, me.post(IBV_WR_RDMA_WRITE, mem, 64, mr->lkey, theirs.addr, theirs.rkey));
  EXPECT_EQ(0, me.post(IBV_WR_ATOMIC_FETCH_AND_ADD, mem + 16, 8, mr->lkey, theirs.addr + 256, theirs.rkey));
  ASSERT_TRUE(send_val(nobody.sock(), step));
  EXPECT_EQ(0, nobody.wait()) << "nobody's ring: exactly its own WRITE and its ACK";
  const Read r = drain(roots, uint32_t(getpid()));
  ::unlink(path_of(0).c_str());
  EXPECT_EQ(4u, r.packets) << "WRITE Only, ACK, FetchAdd, ATOMIC ACK";
  EXPECT_EQ(4u, r.of_pid);
  EXPECT_EQ(0, ibv_dereg_mr(mr));
  me.close();
}

}  // namespace
}  // namespace capture_test
}  // namespace svsec
