// multicast_test.cc: rdma_cm multicast (rdma_join_multicast(3),
// rdma_join_multicast_ex(3), rdma_leave_multicast(3)) between two real
// processes: this binary run again as `--child mc-recv:<group>:<wfd>:<rfd> 0`
// (rdmacm_test.cc's main dispatches to multicast_child). The processes
// take turns through two pipes, so nothing waits on time.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

int multicast_child(const std::string& mode);

namespace {

using Clock = std::chrono::steady_clock;
constexpr int kMsgs = 8;
constexpr size_t kLen = 64;
constexpr size_t kSlot = kLen + 40;  // a UD receive starts with the 40-byte GRH

rdma_cm_event* mc_event(rdma_event_channel* ch, int ms = 10000) {
  pollfd p{ch->fd, POLLIN, 0};
  if (::poll(&p, 1, ms) <= 0) return nullptr;
  rdma_cm_event* e = nullptr;
  return rdma_get_cm_event(ch, &e) == 0 ? e : nullptr;
}

bool parse_group(const char* text, sockaddr_storage* out) {
  std::memset(out, 0, sizeof(*out));
  auto* a4 = reinterpret_cast<sockaddr_in*>(out);
  auto* a6 = reinterpret_cast<sockaddr_in6*>(out);
  if (inet_pton(AF_INET, text, &a4->sin_addr) == 1) {
    a4->sin_family = AF_INET;
    return true;
  }
  a6->sin6_family = AF_INET6;
  return inet_pton(AF_INET6, text, &a6->sin6_addr) == 1;
}

// The MGID Linux's CM gives a group on a RoCEv2 port (cma_iboe_set_mgid).
ibv_gid mgid_of(const sockaddr_storage& g) {
  ibv_gid m{};
  if (g.ss_family == AF_INET) {
    m.raw[10] = m.raw[11] = 0xff;
    std::memcpy(&m.raw[12], &reinterpret_cast<const sockaddr_in*>(&g)->sin_addr, 4);
  } else {
    std::memcpy(m.raw, &reinterpret_cast<const sockaddr_in6*>(&g)->sin6_addr, 16);
  }
  return m;
}

// One UD id resolved to a group, with a QP, receive buffers and (after
// join) an AH to the group.
struct Member {
  rdma_event_channel* ch = nullptr;
  rdma_cm_id* id = nullptr;
  ibv_mr* mr = nullptr;
  ibv_ah* ah = nullptr;
  char* buf = static_cast<char*>(std::calloc(4 * kMsgs + 1, kSlot));
  sockaddr_storage group{};
  rdma_ud_param ud{};

  ~Member() {
    if (ah) ibv_destroy_ah(ah);
    if (mr) ibv_dereg_mr(mr);
    if (id && id->qp) rdma_destroy_qp(id);
    if (id) rdma_destroy_id(id);
    if (ch) rdma_destroy_event_channel(ch);
    std::free(buf);
  }
  sockaddr* gaddr() { return reinterpret_cast<sockaddr*>(&group); }

  bool open(const char* group_text, bool block_self = false) {
    if (!parse_group(group_text, &group)) return false;
    ch = rdma_create_event_channel();
    if (!ch || rdma_create_id(ch, &id, nullptr, RDMA_PS_UDP)) return false;
    if (rdma_resolve_addr(id, nullptr, gaddr(), 2000)) return false;
    rdma_cm_event* e = mc_event(ch);
    bool ok = e && e->event == RDMA_CM_EVENT_ADDR_RESOLVED;
    if (e) rdma_ack_cm_event(e);
    if (!ok) return false;
    ibv_qp_init_attr_ex qa{};
    qa.qp_type = IBV_QPT_UD;
    qa.cap.max_send_wr = qa.cap.max_recv_wr = 4 * kMsgs;
    qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
    qa.sq_sig_all = 1;
    qa.comp_mask = IBV_QP_INIT_ATTR_PD | (block_self ? IBV_QP_INIT_ATTR_CREATE_FLAGS : 0);
    qa.pd = id->pd;
    qa.create_flags = block_self ? IBV_QP_CREATE_BLOCK_SELF_MCAST_LB : 0;
    if (rdma_create_qp_ex(id, &qa)) return false;
    mr = ibv_reg_mr(id->pd, buf, (4 * kMsgs + 1) * kSlot, IBV_ACCESS_LOCAL_WRITE);
    if (!mr) return false;
    for (int i = 0; i < 4 * kMsgs; ++i) {
      ibv_sge s{uint64_t(uintptr_t(buf + size_t(i) * kSlot)), uint32_t(kSlot), mr->lkey};
      ibv_recv_wr w{};
      ibv_recv_wr* bad = nullptr;
      w.wr_id = uint64_t(i);
      w.sg_list = &s;
      w.num_sge = 1;
      if (ibv_post_recv(id->qp, &w, &bad)) return false;
    }
    return true;
  }

  // Joins and takes the MULTICAST_JOIN event, whose param.ud must be
  // Linux's; an AH to the group from it.
  bool join(int flags, void* context) {
    rdma_cm_join_mc_attr_ex a{};
    a.comp_mask = RDMA_CM_JOIN_MC_ATTR_ADDRESS | RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS;
    a.addr = gaddr();
    a.join_flags = uint32_t(flags);
    if (rdma_join_multicast_ex(id, &a, context)) return false;
    rdma_cm_event* e = mc_event(ch);
    if (!e) return false;
    bool ok = e->event == RDMA_CM_EVENT_MULTICAST_JOIN && e->status == 0 && e->id == id;
    ud = e->param.ud;
    rdma_ack_cm_event(e);
    if (!ok) return false;
    ibv_gid m = mgid_of(group);
    if (ud.private_data != context || ud.qp_num != 0xffffffu || ud.qkey != RDMA_UDP_QKEY) return false;
    if (!ud.ah_attr.is_global || ud.ah_attr.port_num != 1 || std::memcmp(ud.ah_attr.grh.dgid.raw, m.raw, 16))
      return false;
    ah = ibv_create_ah(id->pd, &ud.ah_attr);
    return ah != nullptr;
  }

  // kMsgs datagrams "<tag><i>" to the group; true when all completed.
  bool send(char tag) {
    for (int i = 0; i < kMsgs; ++i) {
      char* p = buf + size_t(4 * kMsgs) * kSlot;
      std::snprintf(p, kLen, "%c%d", tag, i);
      ibv_sge s{uint64_t(uintptr_t(p)), uint32_t(kLen), mr->lkey};
      ibv_send_wr w{};
      ibv_send_wr* bad = nullptr;
      w.sg_list = &s;
      w.num_sge = 1;
      w.opcode = IBV_WR_SEND;
      w.wr.ud.ah = ah;
      w.wr.ud.remote_qpn = ud.qp_num;
      w.wr.ud.remote_qkey = ud.qkey;
      if (ibv_post_send(id->qp, &w, &bad)) return false;
      ibv_wc wc{};
      auto end = Clock::now() + std::chrono::seconds(10);
      int n = 0;
      while ((n = ibv_poll_cq(id->send_cq, 1, &wc)) == 0 && Clock::now() < end) {
      }
      if (n != 1 || wc.status != IBV_WC_SUCCESS) return false;
    }
    return true;
  }

  // Receives: how many of "<tag>0".."<tag>N-1" arrived, in order; polls up
  // to `ms` for `want` of them (0: takes only what is there).
  int received(char tag, int want, int ms = 10000) {
    int got = 0;
    auto end = Clock::now() + std::chrono::milliseconds(ms);
    for (;;) {
      ibv_wc wc{};
      int n = ibv_poll_cq(id->recv_cq, 1, &wc);
      if (n == 1) {
        char expect[16];
        std::snprintf(expect, sizeof expect, "%c%d", tag, got);
        const char* data = buf + size_t(wc.wr_id) * kSlot + 40;
        if (wc.status != IBV_WC_SUCCESS || wc.byte_len != kLen + 40 || std::strcmp(data, expect)) return -1;
        ++got;
        continue;
      }
      if (got >= want || Clock::now() >= end) return got;
    }
  }
};

bool pipe_put(int fd, char c) { return ::write(fd, &c, 1) == 1; }
char pipe_get(int fd, int ms = 20000) {
  pollfd p{fd, POLLIN, 0};
  char c = 0;
  if (::poll(&p, 1, ms) != 1 || ::read(fd, &c, 1) != 1) return 0;
  return c;
}

// The receiving process: joins, says 'j'; takes the first batch 'a';
// leaves, says 'l'; after the sender's 'x' (its second batch sent), must
// have received nothing more.
struct Child {
  pid_t pid = -1;
  int to = -1, from = -1;  // our ends
  bool start(const char* group) {
    int up[2], down[2];
    if (::pipe(up) || ::pipe(down)) return false;
    // The child's arguments on the stack: a heap page may hold registered
    // memory, which the child copies only in its atfork handler, after this
    // process went on and maybe reused the page (docs/MEMORY.md, "fork()").
    char self[4096] = {}, mode[256] = {};
    ssize_t n = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n <= 0) return false;
    std::snprintf(mode, sizeof(mode), "mc-recv:%s:%d:%d", group, up[1], down[0]);
    pid = ::fork();
    if (pid == 0) {
      ::close(up[0]);
      ::close(down[1]);
      ::execl(self, self, "--child", mode, "0", nullptr);
      ::_exit(127);
    }
    ::close(up[1]);
    ::close(down[0]);
    from = up[0];
    to = down[1];
    return pid > 0;
  }
  int wait() {
    int st = 0;
    ::close(to);
    ::close(from);
    if (::waitpid(pid, &st, 0) != pid) return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  }
};

// The parent sends; `flags` is its own membership.
void send_to_child(const char* group, int flags) {
  Member m;
  ASSERT_TRUE(m.open(group));
  int ctx = 0;
  ASSERT_TRUE(m.join(flags, &ctx));
  Child c;
  ASSERT_TRUE(c.start(group));
  ASSERT_EQ(pipe_get(c.from), 'j') << "child exit " << c.wait();
  ASSERT_TRUE(m.send('a'));
  // A full member receives its own datagrams (multicast loopback, as
  // mckey(1) describes it); a send-only member none.
  bool full = flags == RDMA_MC_JOIN_FLAG_FULLMEMBER;
  EXPECT_EQ(m.received('a', full ? kMsgs : 0, full ? 10000 : 0), full ? kMsgs : 0);
  ASSERT_EQ(pipe_get(c.from), 'l');  // the child had all of batch 'a' and left
  ASSERT_TRUE(m.send('b'));
  EXPECT_EQ(m.received('b', full ? kMsgs : 0, full ? 10000 : 0), full ? kMsgs : 0);
  ASSERT_TRUE(pipe_put(c.to, 'x'));
  EXPECT_EQ(c.wait(), 0);
  EXPECT_EQ(rdma_leave_multicast(m.id, m.gaddr()), 0);
}

TEST(RdmaCmMulticast, FullMembersIPv4) { send_to_child("239.1.2.3", RDMA_MC_JOIN_FLAG_FULLMEMBER); }
TEST(RdmaCmMulticast, FullMembersIPv6) { send_to_child("ff0e::1:2:3", RDMA_MC_JOIN_FLAG_FULLMEMBER); }
TEST(RdmaCmMulticast, SendOnlyMemberIPv4) { send_to_child("239.1.2.4", RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER); }
TEST(RdmaCmMulticast, SendOnlyMemberIPv6) { send_to_child("ff0e::1:2:4", RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER); }

// mckey -l: a QP created with IBV_QP_CREATE_BLOCK_SELF_MCAST_LB does not
// receive its own multicast datagrams; another member of the process does.
TEST(RdmaCmMulticast, BlockSelfLoopback) {
  Member a, b;
  ASSERT_TRUE(a.open("239.1.2.5", true));
  ASSERT_TRUE(b.open("239.1.2.5"));
  ASSERT_TRUE(a.join(RDMA_MC_JOIN_FLAG_FULLMEMBER, nullptr));
  ASSERT_TRUE(b.join(RDMA_MC_JOIN_FLAG_FULLMEMBER, nullptr));
  ASSERT_TRUE(a.send('a'));
  EXPECT_EQ(b.received('a', kMsgs), kMsgs);
  EXPECT_EQ(a.received('a', 0, 0), 0);
  ASSERT_TRUE(b.send('b'));
  EXPECT_EQ(a.received('b', kMsgs), kMsgs);
  EXPECT_EQ(b.received('b', kMsgs), kMsgs);
}

// rdma_destroy_id leaves the id's groups: its QP (which outlives it here)
// receives nothing more.
TEST(RdmaCmMulticast, DestroyIdLeaves) {
  Member a, b;
  ASSERT_TRUE(a.open("239.1.2.6"));
  ASSERT_TRUE(b.open("239.1.2.6"));
  ASSERT_TRUE(a.join(RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER, nullptr));
  ASSERT_TRUE(b.join(RDMA_MC_JOIN_FLAG_FULLMEMBER, nullptr));
  ASSERT_TRUE(a.send('a'));
  EXPECT_EQ(b.received('a', kMsgs), kMsgs);
  ibv_qp* qp = b.id->qp;
  ibv_cq* cqs[2] = {b.id->send_cq, b.id->recv_cq};
  ibv_comp_channel* chans[2] = {b.id->send_cq_channel, b.id->recv_cq_channel};
  rdma_destroy_id(b.id);  // the id goes, its QP stays (rdma_destroy_id(3))
  b.id = nullptr;
  ASSERT_TRUE(a.send('b'));
  ibv_wc wc{};
  EXPECT_EQ(ibv_poll_cq(cqs[1], 1, &wc), 0);
  EXPECT_EQ(ibv_destroy_qp(qp), 0);
  for (ibv_cq* c : cqs) EXPECT_EQ(ibv_destroy_cq(c), 0);
  for (ibv_comp_channel* c : chans) EXPECT_EQ(ibv_destroy_comp_channel(c), 0);
}

// rdma_join_multicast(3)'s errors, as Linux's CM and librdmacm give them.
TEST(RdmaCmMulticast, Errors) {
  rdma_event_channel* ch = rdma_create_event_channel();
  ASSERT_NE(ch, nullptr);
  rdma_cm_id* id = nullptr;
  ASSERT_EQ(rdma_create_id(ch, &id, nullptr, RDMA_PS_UDP), 0);
  sockaddr_storage grp{}, uni{}, any{};
  ASSERT_TRUE(parse_group("239.9.9.9", &grp));
  ASSERT_TRUE(parse_group("127.0.0.2", &uni));
  ASSERT_TRUE(parse_group("0.0.0.0", &any));
  auto* g = reinterpret_cast<sockaddr*>(&grp);
  auto* u = reinterpret_cast<sockaddr*>(&uni);
  // Neither bound to a device's address nor resolved: no device.
  EXPECT_EQ(rdma_join_multicast(id, g, nullptr), -1);
  EXPECT_EQ(errno, EINVAL);
  ASSERT_EQ(rdma_resolve_addr(id, nullptr, g, 2000), 0);
  rdma_cm_event* e = mc_event(ch);
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->event, RDMA_CM_EVENT_ADDR_RESOLVED);
  rdma_ack_cm_event(e);
  EXPECT_EQ(rdma_join_multicast(id, reinterpret_cast<sockaddr*>(&any), nullptr), -1);
  EXPECT_EQ(errno, EINVAL);
  rdma_cm_join_mc_attr_ex a{};
  a.comp_mask = RDMA_CM_JOIN_MC_ATTR_ADDRESS | RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS;
  a.addr = g;
  a.join_flags = RDMA_MC_JOIN_FLAG_RESERVED;
  EXPECT_EQ(rdma_join_multicast_ex(id, &a, nullptr), -1);
  EXPECT_EQ(errno, EINVAL);
  a.comp_mask = RDMA_CM_JOIN_MC_ATTR_RESERVED;
  EXPECT_EQ(rdma_join_multicast_ex(id, &a, nullptr), -1);
  EXPECT_EQ(errno, ENOTSUP);
  EXPECT_EQ(rdma_leave_multicast(id, g), -1);  // not joined
  EXPECT_EQ(errno, EADDRNOTAVAIL);
  // Not a multicast address: the join's event is MULTICAST_ERROR, -EINVAL.
  int ctx = 0;
  ASSERT_EQ(rdma_join_multicast(id, u, &ctx), 0);
  e = mc_event(ch);
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->event, RDMA_CM_EVENT_MULTICAST_ERROR);
  EXPECT_EQ(e->status, -EINVAL);
  EXPECT_EQ(e->param.ud.private_data, &ctx);
  rdma_ack_cm_event(e);
  EXPECT_EQ(rdma_leave_multicast(id, u), 0);
  // Without a QP the join succeeds (nothing to attach); twice is refused.
  ASSERT_EQ(rdma_join_multicast(id, g, nullptr), 0);
  EXPECT_EQ(rdma_join_multicast(id, g, nullptr), -1);
  EXPECT_EQ(errno, EADDRINUSE);
  e = mc_event(ch);
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->event, RDMA_CM_EVENT_MULTICAST_JOIN);
  rdma_ack_cm_event(e);
  EXPECT_EQ(rdma_leave_multicast(id, g), 0);
  rdma_destroy_id(id);
  // A connected port space (RC) has no multicast.
  ASSERT_EQ(rdma_create_id(ch, &id, nullptr, RDMA_PS_TCP), 0);
  ASSERT_EQ(rdma_resolve_addr(id, nullptr, g, 2000), 0);
  e = mc_event(ch);
  ASSERT_NE(e, nullptr);
  rdma_ack_cm_event(e);
  EXPECT_EQ(rdma_join_multicast(id, g, nullptr), -1);
  EXPECT_EQ(errno, EINVAL);
  rdma_destroy_id(id);
  rdma_destroy_event_channel(ch);
}

// A synchronous id (no channel) waits in the join for its event, and an
// unread join event is dropped by the leave.
TEST(RdmaCmMulticast, SyncIdAndLeaveDropsUnreadEvent) {
  rdma_cm_id* id = nullptr;
  ASSERT_EQ(rdma_create_id(nullptr, &id, nullptr, RDMA_PS_UDP), 0);
  sockaddr_storage grp{}, uni{};
  ASSERT_TRUE(parse_group("239.9.9.10", &grp));
  ASSERT_TRUE(parse_group("127.0.0.3", &uni));
  ASSERT_EQ(rdma_resolve_addr(id, nullptr, reinterpret_cast<sockaddr*>(&grp), 2000), 0);
  ASSERT_EQ(rdma_join_multicast(id, reinterpret_cast<sockaddr*>(&grp), nullptr), 0);
  ASSERT_NE(id->event, nullptr);
  EXPECT_EQ(id->event->event, RDMA_CM_EVENT_MULTICAST_JOIN);
  EXPECT_EQ(rdma_join_multicast(id, reinterpret_cast<sockaddr*>(&uni), nullptr), -1);
  EXPECT_EQ(errno, EINVAL);
  EXPECT_EQ(rdma_leave_multicast(id, reinterpret_cast<sockaddr*>(&grp)), 0);
  EXPECT_EQ(rdma_leave_multicast(id, reinterpret_cast<sockaddr*>(&uni)), 0);
  rdma_destroy_id(id);

  rdma_event_channel* ch = rdma_create_event_channel();
  ASSERT_EQ(rdma_create_id(ch, &id, nullptr, RDMA_PS_UDP), 0);
  ASSERT_EQ(rdma_resolve_addr(id, nullptr, reinterpret_cast<sockaddr*>(&grp), 2000), 0);
  rdma_cm_event* e = mc_event(ch);
  ASSERT_NE(e, nullptr);
  rdma_ack_cm_event(e);
  ASSERT_EQ(rdma_join_multicast(id, reinterpret_cast<sockaddr*>(&grp), nullptr), 0);
  EXPECT_EQ(rdma_leave_multicast(id, reinterpret_cast<sockaddr*>(&grp)), 0);
  EXPECT_EQ(mc_event(ch, 0), nullptr);
  rdma_destroy_id(id);
  rdma_destroy_event_channel(ch);
}

}  // namespace

// The receiving child of send_to_child: exit 0 as expected, else the step
// that failed.
int multicast_child(const std::string& mode) {
  // mc-recv:<group>:<write fd>:<read fd>; the group is the text between the
  // first and the second-to-last colons (IPv6 groups have colons).
  size_t last = mode.rfind(':'), mid = mode.rfind(':', last - 1);
  std::string group = mode.substr(8, mid - 8);
  int wfd = std::atoi(mode.c_str() + mid + 1), rfd = std::atoi(mode.c_str() + last + 1);
  Member m;
  if (!m.open(group.c_str())) return 2;
  int ctx = 0;
  if (!m.join(RDMA_MC_JOIN_FLAG_FULLMEMBER, &ctx)) return 3;
  if (!pipe_put(wfd, 'j')) return 4;
  if (m.received('a', kMsgs) != kMsgs) return 5;
  if (rdma_leave_multicast(m.id, m.gaddr())) return 6;
  if (!pipe_put(wfd, 'l')) return 7;
  if (pipe_get(rfd) != 'x') return 8;
  return m.received('b', 0, 0) == 0 ? 0 : 9;
}
