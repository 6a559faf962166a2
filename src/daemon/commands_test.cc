// The daemon's generic command checks (commands.cc), through Server::handle
// as a client's message would reach it, without a socket: unknown ops,
// descriptors in, request lengths, and the descriptors a reply carries.
#include "daemon/commands.h"

#include <fcntl.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "common/op_handles.h"
#include "daemon/server.h"

namespace sv::daemon {
namespace {

struct Reply {
  size_t len = 0;
  proto::Header h{};
  uint8_t bytes[proto::kMaxMessage];
  std::vector<int> fds;
};

class Commands : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(0, server.registry().init());
    client = server.registry().add_client(::getpid(), ::getuid(), ::getgid());
  }

  // Sends `n` raw bytes of a message with op `op` (a header, then zeros),
  // with `nfds` eventfds.
  Reply send(uint16_t op, size_t n, size_t nfds = 0, uint32_t seq = 7) {
    uint8_t msg[proto::kMaxMessage + 8] = {};
    proto::Header h{proto::kMagic, proto::kVersion, op, seq, 0};
    std::memcpy(msg, &h, sizeof h);
    return send_raw(msg, n, nfds);
  }
  template <class Req>
  Reply send(proto::Op op, Req& req, size_t nfds = 0) {
    proto::init_header(req, op, 9);
    return send_raw(reinterpret_cast<const uint8_t*>(&req), sizeof req, nfds);
  }
  Reply send_raw(const uint8_t* msg, size_t n, size_t nfds) {
    std::vector<Fd> in;
    for (size_t i = 0; i < nfds; ++i) in.emplace_back(::eventfd(0, EFD_CLOEXEC));
    return send_fds(msg, n, std::move(in));
  }
  template <class Req>
  Reply send_with(proto::Op op, Req& req, std::vector<Fd> in) {
    proto::init_header(req, op, 9);
    return send_fds(reinterpret_cast<const uint8_t*>(&req), sizeof req, std::move(in));
  }
  Reply send_fds(const uint8_t* msg, size_t n, std::vector<Fd> in) {
    Reply r;
    r.len = server.handle(client, msg, n, in, r.bytes, r.fds);
    if (r.len >= sizeof r.h) std::memcpy(&r.h, r.bytes, sizeof r.h);
    return r;
  }

  Server server{"/tmp/softverbs-commands-test-unused", 0};
  uint32_t client = 0;
};

TEST_F(Commands, MalformedHeaderIsNotAnswered) {
  uint8_t msg[sizeof(proto::Header)] = {};
  std::vector<Fd> in;
  std::vector<int> out_fds;
  uint8_t out[proto::kMaxMessage];
  EXPECT_EQ(0u, server.handle(client, msg, sizeof msg, in, out, out_fds));  // bad magic
  EXPECT_EQ(0u, server.handle(client, msg, 3, in, out, out_fds));           // shorter than a header
}

TEST_F(Commands, UnknownOpsAndEventsAreRefused) {
  for (uint16_t op : {uint16_t(0), uint16_t(proto::Op::kCount), uint16_t(0xffff), uint16_t(proto::Op::AsyncEvent)}) {
    Reply r = send(op, sizeof(proto::AsyncEventMsg));
    ASSERT_EQ(sizeof(proto::Empty), r.len) << op;
    EXPECT_EQ(EOPNOTSUPP, r.h.status) << op;
    EXPECT_EQ(op, r.h.op);
    EXPECT_EQ(7u, r.h.seq);
    EXPECT_TRUE(r.fds.empty());
  }
}

// Every op: descriptors beyond its declaration are EBADF (before the length
// is looked at), fewer than it takes too; a length other than its
// request's is EINVAL. Nothing is created and no descriptor goes out.
TEST_F(Commands, EveryOpChecksDescriptorsThenLength) {
  for (const proto::OpInfo& i : proto::kOps) {
    if (i.event) continue;
    Reply r = send(uint16_t(i.op), i.req_size + 1, i.in.max + 1);
    EXPECT_EQ(EBADF, r.h.status) << i.name;
    if (i.in.min > 0) {
      EXPECT_EQ(EBADF, send(uint16_t(i.op), i.req_size, i.in.min - 1).h.status) << i.name;
    }
    for (size_t len : {i.req_size - 1, i.req_size + 1}) {
      if (len < sizeof(proto::Header)) continue;  // not answered (above)
      r = send(uint16_t(i.op), len, i.in.min);
      EXPECT_EQ(sizeof(proto::Empty), r.len) << i.name;
      EXPECT_EQ(EINVAL, r.h.status) << i.name;
      EXPECT_TRUE(r.fds.empty()) << i.name;
    }
  }
  EXPECT_EQ(0u, server.registry().counts().pds);
}

TEST_F(Commands, RepliesAreTheDeclaredStructs) {
  proto::Empty hello{};
  Reply r = send(proto::Op::Hello, hello);
  ASSERT_EQ(0, r.h.status);
  EXPECT_EQ(sizeof(proto::HelloReply), r.len);
  EXPECT_EQ(1u, r.fds.size());  // the device segment
  EXPECT_EQ(9u, r.h.seq);

  proto::Empty alloc{};
  r = send(proto::Op::AllocPd, alloc);
  ASSERT_EQ(0, r.h.status);
  ASSERT_EQ(sizeof(proto::HandleReply), r.len);
  proto::HandleReply pd;
  std::memcpy(&pd, r.bytes, sizeof pd);
  EXPECT_EQ(1u, server.registry().counts().pds);

  proto::HandleReq dealloc{};
  dealloc.handle = pd.handle;
  r = send(proto::Op::DeallocPd, dealloc);
  EXPECT_EQ(0, r.h.status);
  EXPECT_EQ(sizeof(proto::Empty), r.len);
  EXPECT_EQ(0u, server.registry().counts().pds);
}

// A failed op sends no descriptor, whatever its declaration says.
TEST_F(Commands, FailedOpsCarryNoDescriptors) {
  proto::HandleReq req{};
  req.handle = 12345;
  for (proto::Op op : {proto::Op::ImportQp, proto::Op::ImportCq, proto::Op::GetCq, proto::Op::ConnectPeer}) {
    Reply r = send(op, req);
    EXPECT_NE(0, r.h.status) << unsigned(op);
    EXPECT_EQ(proto::op_info(uint16_t(op))->rep_size, r.len);
    EXPECT_TRUE(r.fds.empty());
  }
}

// Each op that takes descriptors takes only the kind it declares
// (proto::in_fd_kind): what the daemon signals is a socketpair end, never an
// eventfd, pipe or FIFO whose write could sleep; a backing is a memfd.
TEST_F(Commands, DescriptorsOfAnotherKindAreRefused) {
  auto pair = [] {
    int sv[2];
    EXPECT_EQ(0, ::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv));
    std::vector<Fd> v;
    v.emplace_back(sv[0]);
    v.emplace_back(sv[1]);
    return v;
  };
  auto pipe_end = [] {
    int p[2];
    EXPECT_EQ(0, ::pipe2(p, O_CLOEXEC));
    ::close(p[0]);
    std::vector<Fd> v;
    v.emplace_back(p[1]);
    return v;
  };
  auto one = [](int fd) {
    std::vector<Fd> v;
    v.emplace_back(fd);
    return v;
  };
  proto::Empty e{};
  EXPECT_EQ(EBADF, send_with(proto::Op::RegAsync, e, one(::eventfd(0, EFD_CLOEXEC))).h.status);
  EXPECT_EQ(EBADF, send_with(proto::Op::RegAsync, e, pipe_end()).h.status);
  EXPECT_EQ(EBADF, send_with(proto::Op::RegAsync, e, one(::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0))).h.status);
  std::vector<Fd> p = pair();
  Fd kept = std::move(p[1]);  // the end the application would poll
  p.pop_back();
  EXPECT_EQ(0, send_with(proto::Op::RegAsync, e, std::move(p)).h.status);
  std::vector<Fd> efds;
  efds.emplace_back(::eventfd(0, EFD_CLOEXEC));
  efds.emplace_back(::eventfd(0, EFD_CLOEXEC));
  EXPECT_EQ(EBADF, send_with(proto::Op::CreateChannel, e, std::move(efds)).h.status);
  EXPECT_EQ(0, send_with(proto::Op::CreateChannel, e, pair()).h.status);
  EXPECT_EQ(EBADF, send_with(proto::Op::RegBacking, e, one(::eventfd(0, EFD_CLOEXEC))).h.status);
  EXPECT_EQ(EBADF, send_with(proto::Op::ImportContext, e, one(::eventfd(0, EFD_CLOEXEC))).h.status);
}

TEST_F(Commands, OptionalDescriptorOpenXrcd) {
  proto::OpenXrcdReq req{};
  req.oflags = O_CREAT;
  Reply r = send(proto::Op::OpenXrcd, req, 0);  // a private domain
  EXPECT_EQ(0, r.h.status);
  EXPECT_EQ(sizeof(proto::HandleReply), r.len);
  EXPECT_EQ(EBADF, send(proto::Op::OpenXrcd, req, 2).h.status);
}


// ---- Each op's handle fields (common/op_handles.h) ----------------------

// A fresh object of each kind, of the test's client, made in the registry.
class CommandHandles : public Commands {
 protected:
  Registry& reg() { return server.registry(); }
  uint32_t pd() {
    uint32_t h = 0;
    EXPECT_EQ(0, reg().pd().alloc(client, h));
    return h;
  }
  uint32_t backing() {
    int fd = ::memfd_create("commands-test", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    EXPECT_EQ(0, ::ftruncate(fd, 4096));
    EXPECT_EQ(0, ::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_SEAL));
    uint32_t id = 0;
    EXPECT_EQ(0, reg().backings().reg(client, Fd(fd), id));
    return id;
  }
  uint32_t cq() {
    proto::CreateCqReq req{};
    req.cqe = 4;
    proto::CreateCqReply rep{};
    std::vector<int> fds;
    EXPECT_EQ(0, reg().cq().create(client, 0, req, rep, fds));
    return rep.handle;
  }
  uint32_t qp() {
    proto::CreateQpReq req{};
    req.pd = pd();
    req.send_cq = cq();
    req.recv_cq = cq();
    req.qp_type = IBV_QPT_RC;
    req.max_send_wr = req.max_recv_wr = 4;
    req.max_send_sge = req.max_recv_sge = 1;
    proto::CreateQpReply rep{};
    std::vector<int> fds;
    EXPECT_EQ(0, reg().qp().create(client, {}, req, rep, fds));
    return rep.qpn;
  }
  uint32_t mr() { return reg_mr().handle; }
  uint32_t mr_key() { return reg_mr().key; }
  proto::RegMrReply reg_mr() {
    proto::RegMrReq req{};
    req.pd = pd();
    req.backing = backing();
    req.length = 4096;
    req.access = IBV_ACCESS_LOCAL_WRITE;
    proto::RegMrReply rep{};
    const Reply r = send(proto::Op::RegMr, req);
    EXPECT_EQ(0, r.h.status);
    std::memcpy(&rep, r.bytes, sizeof rep);
    return rep;
  }
  uint32_t srq() {
    proto::CreateSrqReq req{};
    req.pd = pd();
    req.max_wr = 4;
    req.max_sge = 1;
    req.srq_type = IBV_SRQT_BASIC;
    proto::CreateSrqReply rep{};
    std::vector<int> fds;
    EXPECT_EQ(0, reg().srq().create(client, nullptr, req, rep, fds));
    return rep.handle;
  }
  uint32_t make(proto::Obj kind) {
    uint32_t h = 0;
    switch (kind) {
      case proto::kObjPd: return pd();
      case proto::kObjBacking: return backing();
      case proto::kObjMr: return mr();
      case proto::kObjCq: return cq();
      case proto::kObjQp: return qp();
      case proto::kObjSrq: return srq();
      case proto::kObjMw: {
        proto::AllocMwReq req{};
        req.pd = pd();
        req.type = IBV_MW_TYPE_1;
        proto::KeyReply rep{};
        EXPECT_EQ(0, reg().mr().alloc_mw(client, req.pd, req, rep));
        return rep.handle;
      }
      case proto::kObjChannel: {
        Fd rd, wake;
        EXPECT_EQ(0, make_wake_pair(rd, wake));
        EXPECT_EQ(0, reg().cq().create_channel(client, std::move(rd), std::move(wake), h));
        return h;
      }
      case proto::kObjXrcd: {
        proto::OpenXrcdReq req{};
        req.oflags = O_CREAT;
        EXPECT_EQ(0, reg().xrc().open(client, req, Fd(), h));
        return h;
      }
      case proto::kObjDm: {
        proto::AllocDmReq req{};
        req.length = 64;
        proto::DmReply rep{};
        std::vector<int> fds;
        EXPECT_EQ(0, reg().dm().alloc(client, req, rep, fds));
        return rep.handle;
      }
      default: ADD_FAILURE() << "no maker for kind " << kind; return 0;
    }
  }

  // Runs op `op` with each declared field naming a fresh object of the
  // caller, and checks what its handler did with them.
  template <proto::Op op>
  void run_declared() {
    using C = proto::Command<op>;
    if constexpr (proto::has_handle_fields<op>()) {
      typename C::Req req{};
      for (const auto& f : proto::HandleFields<op>::list) {
        const bool key = f.rule == proto::HandleRule::kOwnKey || f.rule == proto::HandleRule::kReachableKey;
        req.*f.field = key ? mr_key() : make(f.kind);
        // A grant, as NsOpen of another user's CQ makes: the rule's case
        // that lets the handler run.
        if (f.rule == proto::HandleRule::kGranted) reg().cq().grant(client, req.*f.field);
      }
      // The handler runs whatever its other fields say (its status is its
      // own): the resolution that precedes it reads only the handle fields.
      const Reply r = send(op, req);
      const HandleAudit& a = last_handle_audit();
      if (a.op == uint16_t(op) && a.not_served) return;  // switched off in this daemon (RoCE): nothing to audit
      EXPECT_EQ(uint16_t(op), a.op) << C::info.name << ": its handler did not run (status " << r.h.status << ")";
      EXPECT_EQ(a.declared, a.used) << C::info.name << ": declares a handle field its handler does not use";
      EXPECT_EQ(0u, a.own_lookups) << C::info.name << ": its handler looks up a handle it does not declare";
      ++ran;
    }
  }
  template <size_t... I>
  void run_every_op(std::index_sequence<I...>) {
    (run_declared<proto::Op(I + 1)>(), ...);
  }
  int ran = 0;
};

// Every op that declares handle fields: its handler uses each of them, and
// checks no other handle by owner itself (objects.h, owner_lookups): the
// command layer did the checks, from the declaration alone.
TEST_F(CommandHandles, EveryHandlerUsesExactlyTheHandlesItsOpDeclares) {
  run_every_op(std::make_index_sequence<size_t(proto::Op::kCount) - 1>{});
  EXPECT_GT(ran, 0);
}

// A declared field that names nothing of the caller's is EINVAL before the
// handler runs; a destroyed object is gone, and one still used is EBUSY.
TEST_F(CommandHandles, DeclaredFieldsAreResolvedAndDestroyedGenerically) {
  proto::HandleReq req{};
  req.handle = 0x7777;
  EXPECT_EQ(EINVAL, send(proto::Op::QueryPd, req).h.status);
  EXPECT_EQ(EINVAL, send(proto::Op::DeallocPd, req).h.status);
  proto::RegMrReq mr_req{};
  mr_req.pd = pd();
  mr_req.backing = backing();
  mr_req.length = 4096;
  mr_req.access = IBV_ACCESS_LOCAL_WRITE;
  proto::RegMrReply mr{};
  const Reply r = send(proto::Op::RegMr, mr_req);
  ASSERT_EQ(0, r.h.status);
  std::memcpy(&mr, r.bytes, sizeof mr);
  req.handle = mr_req.pd;
  EXPECT_EQ(EBUSY, send(proto::Op::DeallocPd, req).h.status);  // the MR uses it
  req.handle = mr.handle;
  EXPECT_EQ(0, send(proto::Op::DeregMr, req).h.status);
  EXPECT_EQ(EINVAL, send(proto::Op::QueryMr, req).h.status);
  req.handle = mr_req.pd;
  EXPECT_EQ(0, send(proto::Op::DeallocPd, req).h.status);
  EXPECT_EQ(EINVAL, send(proto::Op::QueryPd, req).h.status);
}

// A field's rule is the declaration's, applied before the handler runs:
// the caller's own CQ is no grant (PollCq), a CQ nobody completes into from
// the caller's QPs is not completable (another context's), and an SRQ that
// exists but is out of the caller's reach is EACCES (SrqLimit).
TEST_F(CommandHandles, DeclaredRulesDecideWhoMayNameTheObject) {
  proto::PollCqReq poll{};
  poll.handle = cq();
  poll.max = 1;
  EXPECT_EQ(EINVAL, send(proto::Op::PollCq, poll).h.status);  // its own: it polls the segment itself
  reg().cq().grant(client, poll.handle);
  EXPECT_EQ(0, send(proto::Op::PollCq, poll).h.status);
  poll.max = 0;
  EXPECT_EQ(EINVAL, send(proto::Op::PollCq, poll).h.status);

  const uint32_t other = reg().add_client(::getpid(), ::getuid(), ::getgid());  // a context of its own
  proto::CreateCqReq cq_req{};
  cq_req.cqe = 4;
  proto::CreateCqReply cq_rep{};
  std::vector<int> fds;
  ASSERT_EQ(0, reg().cq().create(other, 0, cq_req, cq_rep, fds));
  proto::HandleReq req{};
  req.handle = cq_rep.handle;
  EXPECT_EQ(EINVAL, send(proto::Op::GetCq, req).h.status);
  EXPECT_EQ(EINVAL, send(proto::Op::CqError, req).h.status);
  EXPECT_EQ(EINVAL, send(proto::Op::ImportCq, req).h.status);
  req.handle = cq();
  EXPECT_EQ(0, send(proto::Op::GetCq, req).h.status);
  EXPECT_EQ(0, send(proto::Op::ImportCq, req).h.status);

  proto::CreateSrqReq srq_req{};
  srq_req.pd = 0;
  ASSERT_EQ(0, reg().pd().alloc(other, srq_req.pd));
  srq_req.max_wr = 4;
  srq_req.max_sge = 1;
  srq_req.srq_type = IBV_SRQT_BASIC;
  proto::CreateSrqReply srq_rep{};
  ASSERT_EQ(0, reg().srq().create(other, nullptr, srq_req, srq_rep, fds));
  req.handle = srq_rep.handle;
  EXPECT_EQ(EACCES, send(proto::Op::SrqLimit, req).h.status);  // exists, not reached
  req.handle = 0x7777;
  EXPECT_EQ(EINVAL, send(proto::Op::SrqLimit, req).h.status);  // none
  req.handle = srq();
  EXPECT_EQ(0, send(proto::Op::SrqLimit, req).h.status);
}

// Fields that are keys: GetMrBacking's reaches the MR of a key of the
// caller's user whose PD the caller owns or reaches (EACCES otherwise,
// EINVAL for no key); RegShared's is an MR key of the caller's own context.
TEST_F(CommandHandles, DeclaredKeyRules) {
  proto::GetMrBackingReq get{};
  get.key = mr_key();
  EXPECT_EQ(0, send(proto::Op::GetMrBacking, get).h.status);
  get.key = 0x777701;
  EXPECT_EQ(EINVAL, send(proto::Op::GetMrBacking, get).h.status);

  const uint32_t other = reg().add_client(::getpid(), ::getuid(), ::getgid());  // a context of its own
  int fd = ::memfd_create("commands-test", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  ASSERT_EQ(0, ::ftruncate(fd, 4096));
  ASSERT_EQ(0, ::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_SEAL));
  proto::RegMrReq req{};
  ASSERT_EQ(0, reg().pd().alloc(other, req.pd));
  ASSERT_EQ(0, reg().backings().reg(other, Fd(fd), req.backing));
  req.length = 4096;
  req.access = IBV_ACCESS_LOCAL_WRITE;
  proto::RegMrReply theirs{};
  auto* b = static_cast<Backing*>(reg().resolve(ObjKind::kBacking, other, req.backing));
  ASSERT_NE(nullptr, b);
  ASSERT_EQ(0, reg().mr().reg(other, *b, req, theirs));
  get.key = theirs.key;
  EXPECT_EQ(EACCES, send(proto::Op::GetMrBacking, get).h.status);  // its PD is not reached

  proto::RegSharedReq shared{};
  shared.pd = pd();
  shared.key = theirs.key;
  shared.access = IBV_ACCESS_LOCAL_WRITE;
  EXPECT_EQ(EINVAL, send(proto::Op::RegShared, shared).h.status);  // another context's MR
  shared.key = mr_key();
  EXPECT_EQ(0, send(proto::Op::RegShared, shared).h.status);
}

}  // namespace
}  // namespace sv::daemon
