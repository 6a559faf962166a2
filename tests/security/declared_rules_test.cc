// Handle fields whose rule is not "the caller's own" (common/op_handles.h,
// HandleRule): another user names root's CQ, SRQ and MR key straight at the
// daemon and gets each rule's errno, and nothing else: no descriptor, no
// completion in root's CQ.
#include <gtest/gtest.h>
#include <infiniband/verbs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <string>
#include <vector>

#include "attack.h"

namespace svsec {
namespace {

struct Names {
  uint32_t cq = 0, srq = 0, key = 0;
};

// What nobody sees for each op naming root's objects: 0 when every answer
// was the rule's errno with no descriptor, else the number of the check.
int nobody_names(int sock) {
  Names n{};
  uint32_t len = 0;
  std::string path;
  if (!recv_val(sock, n) || !recv_val(sock, len) || len > 4096) return 2;
  path.resize(len);
  if (!recv_bytes(sock, path.data(), len)) return 2;
  RawConn raw(path);
  sv::proto::Empty hello{};
  sv::proto::HelloReply hrep{};
  std::vector<sv::Fd> fds;
  if (!raw.ok() || raw.call(sv::proto::Op::Hello, hello, hrep, {}, &fds)) return 3;
  fds.clear();
  sv::proto::HandleReq h{};
  h.handle = n.cq;
  sv::proto::ImportCqReply irep{};
  if (raw.call(sv::proto::Op::ImportCq, h, irep, {}, &fds) != EINVAL || !fds.empty()) return 4;  // not granted
  if (raw.call(sv::proto::Op::GetCq, h, irep, {}, &fds) != EINVAL || !fds.empty()) return 5;  // not completable
  if (raw.call(sv::proto::Op::CqError, h) != EINVAL) return 6;
  sv::proto::PollCqReq p{};
  p.handle = n.cq;
  p.max = 1;
  sv::proto::PollCqReply prep{};
  if (raw.call(sv::proto::Op::PollCq, p, prep) != EINVAL || prep.count) return 7;
  h.handle = n.srq;
  if (raw.call(sv::proto::Op::SrqLimit, h) != EACCES) return 8;  // exists, out of reach
  sv::proto::GetMrBackingReq g{};
  g.key = n.key;
  sv::proto::GetMrBackingReply grep{};
  if (raw.call(sv::proto::Op::GetMrBacking, g, grep, {}, &fds) != EACCES || !fds.empty()) return 9;
  return 0;
}

TEST(DeclaredRules, AnotherUserNamingRootsObjectsGetsEachRulesErrno) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run a child as another user";
  SystemDaemon sysd;
  ibv_context* c = open_dev();
  ASSERT_NE(nullptr, c);
  ibv_pd* pd = ibv_alloc_pd(c);
  ASSERT_NE(nullptr, pd);
  static uint8_t buf[4096] __attribute__((aligned(4096)));
  ibv_mr* mr = ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  ibv_cq* cq = ibv_create_cq(c, 16, nullptr, nullptr, 0);
  ibv_srq_init_attr sa{};
  sa.attr.max_wr = 4;
  sa.attr.max_sge = 1;
  ibv_srq* srq = ibv_create_srq(pd, &sa);
  ASSERT_TRUE(mr && cq && srq);
  Child nobody(true, nobody_names);
  nobody.start();
  const Names n{cq->handle, srq->handle, mr->rkey};
  const std::string path = sysd.socket();
  const uint32_t len = uint32_t(path.size());
  ASSERT_TRUE(send_val(nobody.sock(), n) && send_val(nobody.sock(), len) &&
              send_bytes(nobody.sock(), path.data(), len));
  EXPECT_EQ(0, nobody.wait()) << "the check that failed (see nobody_names)";
  ibv_wc wc{};
  EXPECT_EQ(0, ibv_poll_cq(cq, 1, &wc));  // nothing was put in root's CQ
  EXPECT_EQ(0, ibv_destroy_srq(srq));
  EXPECT_EQ(0, ibv_destroy_cq(cq));
  EXPECT_EQ(0, ibv_dereg_mr(mr));
  EXPECT_EQ(0, ibv_dealloc_pd(pd));
  ibv_close_device(c);
}

}  // namespace
}  // namespace svsec
