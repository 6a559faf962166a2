// Unit tests of the registry's object types (objects.h, pd.cc, mr.cc, cq.cc,
// qp.cc, srq.cc, xrc.cc, sharing.cc) without the daemon's socket: a Registry
// with clients added directly, objects created, destroyed and released with
// their context, and the counts, quotas and device-table entries checked.
#include "daemon/registry.h"

#include <fcntl.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <string>

#include <gtest/gtest.h>

#include "daemon/commands.h"

namespace sv::daemon {
namespace {

constexpr uint32_t kPage = 4096;

// A destroy op as the command layer carries it out (commands.cc): the
// handle resolved as the caller's (else EINVAL), then its type's destroy.
int destroy(Registry& reg, ObjKind kind, uint32_t client, uint32_t handle) {
  return reg.resolve(kind, client, handle) ? reg.destroy(kind, client, handle) : EINVAL;
}
// A request as a client's reaches the registry: through the command layer
// (commands.h), which resolves the handle fields its op declares.
template <proto::Op op>
int call(Registry& reg, uint32_t client, typename proto::Command<op>::Req req,
         typename proto::Command<op>::Rep* rep = nullptr) {
  static RocePort roce;  // not opened
  std::vector<Fd> in;
  std::vector<int> out;
  CommandEnv env{reg, roce, client, in, out, nullptr};
  proto::init_header(req, op);
  uint8_t buf[proto::kMaxMessage];
  run_command(env, req.h, reinterpret_cast<const uint8_t*>(&req), sizeof req, buf);
  proto::Header h;
  std::memcpy(&h, buf, sizeof h);
  if (rep) std::memcpy(rep, buf, sizeof *rep);
  return h.status;
}
// The object a handle field resolves to for the caller (which must exist).
template <class T>
T& resolved(Registry& reg, ObjKind kind, uint32_t client, uint32_t handle) {
  Object* o = reg.resolve(kind, client, handle);
  EXPECT_NE(nullptr, o);
  return *static_cast<T*>(o);
}
// A query op's check: the handle is the caller's.
int query(Registry& reg, ObjKind kind, uint32_t client, uint32_t handle) {
  return reg.resolve(kind, client, handle) ? 0 : EINVAL;
}

class RegistryObjects : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(reg.init(), 0);
    a = reg.add_client(::getpid(), ::getuid(), ::getgid());
  }

  uint32_t used(Quotas::Kind k) { return reg.quotas().used(::getuid(), k); }
  Counts counts() { return reg.counts(); }

  uint32_t pd(uint32_t c) {
    uint32_t h = 0;
    EXPECT_EQ(reg.pd().alloc(c, h), 0);
    return h;
  }
  // A sealed memfd of the test's user, as the library registers one.
  uint32_t backing(uint32_t c, size_t len = 4 * kPage) {
    int fd = ::memfd_create("registry-test", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    EXPECT_GE(fd, 0);
    EXPECT_EQ(::ftruncate(fd, off_t(len)), 0);
    EXPECT_EQ(::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_SEAL), 0);
    uint32_t id = 0;
    EXPECT_EQ(reg.backings().reg(c, Fd(fd), id), 0);
    return id;
  }
  proto::RegMrReply mr(uint32_t c, uint32_t p, uint32_t b,
                       uint32_t access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_MW_BIND) {
    proto::RegMrReq req{};
    req.pd = p;
    req.backing = b;
    req.addr = 0;
    req.length = kPage;
    req.iova = 0x10000;
    req.access = access;
    proto::RegMrReply rep{};
    EXPECT_EQ(call<proto::Op::RegMr>(reg, c, req, &rep), 0);
    return rep;
  }
  uint32_t channel(uint32_t c) {
    uint32_t h = 0;
    Fd rd, wake;
    EXPECT_EQ(make_wake_pair(rd, wake), 0);
    EXPECT_EQ(reg.cq().create_channel(c, std::move(rd), std::move(wake), h), 0);
    return h;
  }
  uint32_t cq(uint32_t c, uint32_t ch = 0) {
    proto::CreateCqReq req{};
    req.cqe = 16;
    req.channel = ch;
    proto::CreateCqReply rep{};
    std::vector<int> fds;
    EXPECT_EQ(reg.cq().create(c, req.channel, req, rep, fds), 0);
    EXPECT_EQ(fds.size(), 1u);
    return rep.handle;
  }
  uint32_t srq(uint32_t c, uint32_t p, uint32_t xrcd = 0, uint32_t xcq = 0) {
    proto::CreateSrqReq req{};
    req.pd = p;
    req.max_wr = 16;
    req.max_sge = 1;
    req.srq_type = xrcd ? IBV_SRQT_XRC : IBV_SRQT_BASIC;
    req.xrcd = xrcd;
    req.cq = xcq;
    proto::CreateSrqReply rep{};
    std::vector<int> fds;
    EXPECT_EQ(call<proto::Op::CreateSrq>(reg, c, req, &rep), 0);
    return rep.handle;
  }
  int create_qp(uint32_t c, uint32_t p, uint32_t scq, uint32_t rcq, uint32_t s, ibv_qp_type type,
                uint32_t& qpn, uint32_t xrcd = 0) {
    proto::CreateQpReq req{};
    req.pd = p;
    req.send_cq = scq;
    req.recv_cq = rcq;
    req.srq = s;
    req.qp_type = type;
    req.max_send_wr = 8;
    req.max_recv_wr = s || type == IBV_QPT_XRC_RECV ? 0 : 8;
    req.max_send_sge = 1;
    req.max_recv_sge = 1;
    req.xrcd = xrcd;
    proto::CreateQpReply rep{};
    std::vector<int> fds;
    int err = call<proto::Op::CreateQp>(reg, c, req, &rep);
    qpn = rep.qpn;
    return err;
  }
  uint32_t qp(uint32_t c, uint32_t p, uint32_t scq, uint32_t rcq, uint32_t s = 0, ibv_qp_type type = IBV_QPT_RC) {
    uint32_t qpn = 0;
    EXPECT_EQ(create_qp(c, p, scq, rcq, s, type, qpn), 0);
    return qpn;
  }
  // A UD QP to RTS (the fewest attributes): a window is bound through it.
  void ud_to_rts(uint32_t c, uint32_t qpn) {
    proto::ModifyQpReq m{};
    m.qpn = qpn;
    m.attr_mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY;
    m.qp_state = IBV_QPS_INIT;
    m.port_num = 1;
    m.qkey = 0x11;
    ASSERT_EQ(reg.qp().modify(resolved<Qp>(reg, ObjKind::kQp, c, m.qpn), m), 0);
    m.attr_mask = IBV_QP_STATE;
    m.qp_state = IBV_QPS_RTR;
    ASSERT_EQ(reg.qp().modify(resolved<Qp>(reg, ObjKind::kQp, c, m.qpn), m), 0);
    m.attr_mask = IBV_QP_STATE | IBV_QP_SQ_PSN;
    m.qp_state = IBV_QPS_RTS;
    ASSERT_EQ(reg.qp().modify(resolved<Qp>(reg, ObjKind::kQp, c, m.qpn), m), 0);
  }
  uint32_t open_xrcd(uint32_t c, int file = -1) {
    proto::OpenXrcdReq req{};
    req.oflags = O_CREAT;
    req.has_fd = file >= 0;
    uint32_t h = 0;
    EXPECT_EQ(reg.xrc().open(c, req, file >= 0 ? Fd(::dup(file)) : Fd(), h), 0);
    return h;
  }
  // A second client joined to `c`'s context through the namespace (as a
  // second process of the same user opening a published PD).
  uint32_t join(uint32_t p, const char* name) {
    proto::NsPublishReq pub{};
    pub.kind = proto::kNsPd;
    pub.handle = p;
    pub.mode = 0600;
    pub.group = -1;
    std::strncpy(pub.name, name, sizeof(pub.name) - 1);
    EXPECT_EQ(reg.names().publish(a, pub), 0);
    uint32_t b = reg.add_client(::getpid(), ::getuid(), ::getgid());
    proto::NsNameReq open{};
    open.access = proto::kNsRead | proto::kNsWrite;
    std::strncpy(open.name, name, sizeof(open.name) - 1);
    proto::NsOpenReply rep{};
    EXPECT_EQ(reg.names().open(b, open, rep), 0);
    return b;
  }

  Registry reg;
  uint32_t a = 0;
};

// One suite per object type (ctest names them so).
using RegistryPd = RegistryObjects;
using RegistryMr = RegistryObjects;
using RegistryCq = RegistryObjects;
using RegistryQp = RegistryObjects;
using RegistrySrq = RegistryObjects;
using RegistryXrc = RegistryObjects;
using RegistrySharing = RegistryObjects;
using RegistryContext = RegistryObjects;

// ---- The descriptors ----------------------------------------------------------

// Every reference a type declares points at a type destroyed after it, so
// that releasing a context type by type only ever drops references to
// objects still there.
TEST(ObjectTypes, ReferencesPointLaterInDestroyOrder) {
  auto pos = [](ObjKind k) {
    for (size_t i = 0; i < std::size(kDestroyOrder); ++i)
      if (kDestroyOrder[i].kind == k) return i;
    return std::size(kDestroyOrder);  // the XRC domain: owned by no context, never collected
  };
  auto check = [&](ObjKind self, const Held& held) {
    for (Ref r : held)
      if (r.handle) {
        EXPECT_GT(pos(r.kind), pos(self)) << kDestroyOrder[pos(self)].name;
      }
  };
  Qp q;
  q.pd = q.send_cq = q.recv_cq = q.srq = q.xrcd = 1;
  check(ObjKind::kQp, q.held());
  Srq s;
  s.pd = s.cq = s.xrcd = 1;
  check(ObjKind::kSrq, s.held());
  Mw w;
  w.pd = w.bound_mr = 1;
  check(ObjKind::kMw, w.held());
  Mr m;
  m.pd = m.backing = m.dm = 1;
  check(ObjKind::kMr, m.held());
  Dm d;
  d.backing = 1;
  check(ObjKind::kDm, d.held());
  Cq c;
  c.channel = 1;
  check(ObjKind::kCq, c.held());
}

TEST(ObjectTypes, TableCountsReferencesAndOwners) {
  ObjectTable<Pd> t;
  Pd p;
  p.owner = 7;
  t.insert(3, std::move(p));
  EXPECT_NE(t.owned(3, 7), nullptr);
  EXPECT_EQ(t.owned(3, 8), nullptr);
  EXPECT_TRUE(t.any_of(7));
  EXPECT_EQ(t.of(7), std::vector<uint32_t>{3});
  t.ref(3);
  t.ref(3);
  EXPECT_EQ(t.unref(3), 1);
  EXPECT_EQ(t.unref(3), 0);
  EXPECT_EQ(t.unref(3), 0);  // never below zero
  EXPECT_EQ(t.unref(4), -1);
}

// The owner index follows every insert, replacement, change of owner and
// erase: of() and any_of() answer as a walk over the table would.
TEST(ObjectTypes, OwnerIndexFollowsTheTable) {
  ObjectTable<Qp> t;
  for (uint32_t h : {5u, 1u, 9u, 3u}) {
    Qp q;
    q.owner = h % 2 ? 7 : 8;
    t.insert(h, std::move(q));
  }
  EXPECT_EQ(t.of(7), (std::vector<uint32_t>{1, 3, 5, 9}));
  EXPECT_TRUE(t.of(8).empty());
  Qp moved;
  moved.owner = 8;
  t.insert(5, std::move(moved));  // replaces the object of handle 5
  EXPECT_EQ(t.of(7), (std::vector<uint32_t>{1, 3, 9}));
  EXPECT_EQ(t.of(8), std::vector<uint32_t>{5});
  t.set_owner(9, 8);
  EXPECT_EQ(t.of(8), (std::vector<uint32_t>{5, 9}));
  EXPECT_EQ(t.owned(9, 8)->owner, 8u);
  t.remove(5);
  t.erase(t.find(9));
  EXPECT_EQ(t.erase(9), 0u);
  EXPECT_FALSE(t.any_of(8));
  EXPECT_EQ(t.of(7), (std::vector<uint32_t>{1, 3}));
  t[4];  // made here: owned by no context
  EXPECT_EQ(t.of(0), std::vector<uint32_t>{4});
  EXPECT_EQ(t.size(), 3u);
}

// ---- PD and backings ----------------------------------------------------------

TEST_F(RegistryPd, PdBelongsToItsContext) {
  uint32_t p = pd(a);
  uint32_t b = reg.add_client(::getpid(), ::getuid(), ::getgid());
  EXPECT_EQ(query(reg, ObjKind::kPd, a, p), 0);
  EXPECT_EQ(query(reg, ObjKind::kPd, b, p), EINVAL);
  EXPECT_EQ(destroy(reg, ObjKind::kPd, b, p), EINVAL);
  EXPECT_EQ(used(Quotas::kPd), 1u);
  EXPECT_EQ(destroy(reg, ObjKind::kPd, a, p), 0);
  EXPECT_EQ(destroy(reg, ObjKind::kPd, a, p), EINVAL);
  EXPECT_EQ(counts().pds, 0u);
  EXPECT_EQ(used(Quotas::kPd), 0u);
}

TEST_F(RegistryPd, BackingMustBeASealedMemfd) {
  uint32_t id = 0;
  int fd = ::memfd_create("unsealed", MFD_CLOEXEC);
  ASSERT_EQ(::ftruncate(fd, kPage), 0);
  EXPECT_EQ(reg.backings().reg(a, Fd(fd), id), EINVAL);
  backing(a);
  EXPECT_EQ(counts().backings, 1u);
}

// ---- MRs, windows and keys ----------------------------------------------------

TEST_F(RegistryMr, MrHoldsItsPdAndItsKeyIsRevoked) {
  uint32_t p = pd(a), b = backing(a);
  proto::RegMrReply m = mr(a, p, b);
  ASSERT_NE(reg.mr_entry(m.key), nullptr);
  EXPECT_EQ(destroy(reg, ObjKind::kPd, a, p), EBUSY);  // ibv_dealloc_pd(3): still in use
  EXPECT_EQ(destroy(reg, ObjKind::kMr, a, m.handle), 0);
  EXPECT_EQ(reg.mr_entry(m.key), nullptr);
  EXPECT_EQ(destroy(reg, ObjKind::kPd, a, p), 0);
  EXPECT_EQ(counts().mrs, 0u);
  EXPECT_EQ(used(Quotas::kMr), 0u);
}

TEST_F(RegistryMr, BoundWindowHoldsItsMr) {
  uint32_t p = pd(a), b = backing(a), c = cq(a);
  proto::RegMrReply m = mr(a, p, b);
  uint32_t q = qp(a, p, c, c, 0, IBV_QPT_UD);
  ud_to_rts(a, q);
  proto::AllocMwReq alloc{};
  alloc.pd = p;
  alloc.type = IBV_MW_TYPE_1;
  proto::KeyReply w{};
  ASSERT_EQ(reg.mr().alloc_mw(a, alloc.pd, alloc, w), 0);
  proto::BindMwReq bind{};
  bind.mw = w.handle;
  bind.qpn = q;
  bind.mr_key = m.key;
  bind.addr = 0x10000;
  bind.length = 64;
  bind.access = IBV_ACCESS_REMOTE_WRITE;
  proto::KeyReply bound{};
  ASSERT_EQ(call<proto::Op::BindMw>(reg, a, bind, &bound), 0);
  EXPECT_NE(reg.mr_entry(bound.key), nullptr);
  EXPECT_EQ(destroy(reg, ObjKind::kMr, a, m.handle), EBUSY);  // a window is bound to it
  bind.mr_key = 0;
  bind.length = 0;  // type 1 unbind
  ASSERT_EQ(call<proto::Op::BindMw>(reg, a, bind, &bound), 0);
  EXPECT_EQ(destroy(reg, ObjKind::kMr, a, m.handle), 0);
  EXPECT_EQ(destroy(reg, ObjKind::kPd, a, p), EBUSY);  // the window and the QP
  EXPECT_EQ(destroy(reg, ObjKind::kMw, a, w.handle), 0);
  EXPECT_EQ(used(Quotas::kMw), 0u);
  EXPECT_EQ(destroy(reg, ObjKind::kQp, a, q), 0);
  EXPECT_EQ(destroy(reg, ObjKind::kPd, a, p), 0);
}

// ibv_rereg_mr: the entry changes in place under the same key, checked as a
// new registration (another context's MR, PD or backing is refused), the
// references move, and a refusal changes nothing.
TEST_F(RegistryMr, ReregChangesTheEntryInPlace) {
  uint32_t p = pd(a), p2 = pd(a), b = backing(a);
  proto::RegMrReply m = mr(a, p, b);
  proto::ReregMrReq r{};
  r.handle = m.handle;
  r.flags = IBV_REREG_MR_CHANGE_PD;
  r.pd = p2;
  proto::RegMrReply rep{};
  ASSERT_EQ(call<proto::Op::ReregMr>(reg, a, r, &rep), 0);
  EXPECT_EQ(rep.key, m.key);
  ASSERT_NE(reg.mr_entry(m.key), nullptr);
  EXPECT_EQ(reg.mr_entry(m.key)->pd, p2);
  EXPECT_EQ(destroy(reg, ObjKind::kPd, a, p), 0);       // the MR let go of it
  EXPECT_EQ(destroy(reg, ObjKind::kPd, a, p2), EBUSY);  // and holds this one
  const uint32_t gen = reg.mr_entry(m.key)->generation;
  r.flags = IBV_REREG_MR_CHANGE_TRANSLATION;
  r.backing = b;
  r.addr = kPage;
  r.length = 2 * kPage;
  r.iova = 0x20000;
  ASSERT_EQ(call<proto::Op::ReregMr>(reg, a, r, &rep), 0);
  const shm::MrEntry* e = reg.mr_entry(m.key);
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->file_offset, kPage);
  EXPECT_EQ(e->length, 2u * kPage);
  EXPECT_EQ(e->iova, 0x20000u);
  EXPECT_NE(e->generation, gen);  // views of the old range are stale
  // Refused, the entry as it was: beyond the backing file, no flag, remote
  // write without local write, and another context's MR, PD or backing.
  const uint32_t gen2 = e->generation;
  r.addr = 3 * kPage;
  EXPECT_EQ(call<proto::Op::ReregMr>(reg, a, r, &rep), EINVAL);
  r.flags = 0;
  EXPECT_EQ(call<proto::Op::ReregMr>(reg, a, r, &rep), EINVAL);
  r.flags = IBV_REREG_MR_CHANGE_ACCESS;
  r.access = IBV_ACCESS_REMOTE_WRITE;
  EXPECT_EQ(call<proto::Op::ReregMr>(reg, a, r, &rep), EINVAL);
  uint32_t other = reg.add_client(::getpid(), ::getuid(), ::getgid());
  r.access = IBV_ACCESS_LOCAL_WRITE;
  EXPECT_EQ(call<proto::Op::ReregMr>(reg, other, r, &rep), EINVAL);
  r.flags = IBV_REREG_MR_CHANGE_PD;
  r.pd = pd(other);
  EXPECT_EQ(call<proto::Op::ReregMr>(reg, a, r, &rep), EINVAL);
  r.flags = IBV_REREG_MR_CHANGE_TRANSLATION;
  r.backing = backing(other);
  r.addr = 0;
  EXPECT_EQ(call<proto::Op::ReregMr>(reg, a, r, &rep), EINVAL);
  e = reg.mr_entry(m.key);
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->generation, gen2);
  EXPECT_EQ(e->pd, p2);
  EXPECT_EQ(e->file_offset, kPage);
  EXPECT_EQ(e->length, 2u * kPage);
  EXPECT_EQ(used(Quotas::kMr), 1u);  // quotas unchanged
  EXPECT_EQ(destroy(reg, ObjKind::kMr, a, m.handle), 0);
  EXPECT_EQ(destroy(reg, ObjKind::kPd, a, p2), 0);
}

// ---- CQs and channels ---------------------------------------------------------

TEST_F(RegistryCq, CqHoldsItsChannel) {
  uint32_t ch = channel(a);
  uint32_t c = cq(a, ch);
  EXPECT_EQ(destroy(reg, ObjKind::kChannel, a, ch), EBUSY);
  proto::ResizeCqReq rs{};
  rs.handle = c;
  rs.cqe = 64;
  proto::CreateCqReply rep{};
  std::vector<int> fds;
  ASSERT_EQ(reg.cq().resize(resolved<Cq>(reg, ObjKind::kCq, a, rs.handle), rs, rep, fds), 0);
  EXPECT_EQ(reg.cq().resize(resolved<Cq>(reg, ObjKind::kCq, a, rs.handle), rs, rep, fds), EBUSY);
  proto::ResizeCqDoneReq done{};
  done.handle = c;
  done.commit = 1;
  EXPECT_EQ(reg.cq().resize_done(resolved<Cq>(reg, ObjKind::kCq, a, done.handle), done), 0);
  EXPECT_EQ(destroy(reg, ObjKind::kCq, a, c), 0);
  EXPECT_EQ(destroy(reg, ObjKind::kChannel, a, ch), 0);
  EXPECT_EQ(counts().cqs, 0u);
  EXPECT_EQ(counts().channels, 0u);
  EXPECT_EQ(used(Quotas::kCq), 0u);
  EXPECT_EQ(used(Quotas::kChannel), 0u);
}

// ---- QPs ----------------------------------------------------------------------

TEST_F(RegistryQp, QpHoldsItsPdCqsAndSrq) {
  uint32_t p = pd(a), scq = cq(a), rcq = cq(a), s = srq(a, p);
  uint32_t q = qp(a, p, scq, rcq, s);
  ASSERT_NE(reg.qp_entry(q), nullptr);
  EXPECT_TRUE(reg.holds_qp(a, q));
  EXPECT_EQ(destroy(reg, ObjKind::kPd, a, p), EBUSY);
  EXPECT_EQ(destroy(reg, ObjKind::kCq, a, scq), EBUSY);
  EXPECT_EQ(destroy(reg, ObjKind::kCq, a, rcq), EBUSY);
  EXPECT_EQ(destroy(reg, ObjKind::kSrq, a, s), EBUSY);
  EXPECT_EQ(destroy(reg, ObjKind::kQp, a, q), 0);
  EXPECT_EQ(reg.qp_entry(q), nullptr);
  EXPECT_EQ(destroy(reg, ObjKind::kSrq, a, s), 0);
  EXPECT_EQ(destroy(reg, ObjKind::kCq, a, scq), 0);
  EXPECT_EQ(destroy(reg, ObjKind::kCq, a, rcq), 0);
  EXPECT_EQ(destroy(reg, ObjKind::kPd, a, p), 0);
  EXPECT_EQ(used(Quotas::kQp), 0u);
}

TEST_F(RegistryQp, QpWithOneCqTwiceTakesTwoReferences) {
  uint32_t p = pd(a), c = cq(a);
  uint32_t q1 = qp(a, p, c, c), q2 = qp(a, p, c, c);
  EXPECT_EQ(destroy(reg, ObjKind::kQp, a, q1), 0);
  EXPECT_EQ(destroy(reg, ObjKind::kCq, a, c), EBUSY);
  EXPECT_EQ(destroy(reg, ObjKind::kQp, a, q2), 0);
  EXPECT_EQ(destroy(reg, ObjKind::kCq, a, c), 0);
}

TEST_F(RegistryQp, QpRefusesAnotherContextsObjects) {
  uint32_t p = pd(a), c = cq(a);
  uint32_t b = reg.add_client(::getpid(), ::getuid(), ::getgid());
  uint32_t pb = pd(b), cb = cq(b), qpn = 0;
  EXPECT_EQ(create_qp(b, p, cb, cb, 0, IBV_QPT_RC, qpn), EINVAL);
  EXPECT_EQ(create_qp(b, pb, c, cb, 0, IBV_QPT_RC, qpn), EINVAL);
  EXPECT_EQ(create_qp(b, pb, cb, c, 0, IBV_QPT_RC, qpn), EINVAL);
  // A failed create takes no reference.
  EXPECT_EQ(destroy(reg, ObjKind::kPd, a, p), 0);
  EXPECT_EQ(destroy(reg, ObjKind::kCq, a, c), 0);
  EXPECT_EQ(used(Quotas::kQp), 0u);
}

// ---- SRQs and XRC -------------------------------------------------------------

TEST_F(RegistrySrq, XrcSrqHoldsItsCqAndDomain) {
  uint32_t p = pd(a), c = cq(a), x = open_xrcd(a);
  uint32_t s = srq(a, p, x, c);
  EXPECT_EQ(destroy(reg, ObjKind::kCq, a, c), EBUSY);
  EXPECT_EQ(destroy(reg, ObjKind::kXrcdHandle, a, x), EBUSY);  // its last handle, still used
  EXPECT_EQ(destroy(reg, ObjKind::kSrq, a, s), 0);
  EXPECT_EQ(destroy(reg, ObjKind::kXrcdHandle, a, x), 0);
  EXPECT_EQ(destroy(reg, ObjKind::kCq, a, c), 0);
  EXPECT_EQ(used(Quotas::kSrq), 0u);
  EXPECT_EQ(used(Quotas::kXrcd), 0u);
}

// An XRC target QP lives while some context holds a handle of it
// (ibv_open_qp(3)): the release of its creator's context leaves it to the
// other holder, whose release frees it.
TEST_F(RegistryXrc, XrcTargetQpOutlivesItsCreator) {
  char path[] = "/tmp/registry-test-xrcd-XXXXXX";
  int file = ::mkstemp(path);
  ASSERT_GE(file, 0);
  ::unlink(path);
  uint32_t x = open_xrcd(a, file);
  uint32_t tgt = 0;
  ASSERT_EQ(create_qp(a, 0, 0, 0, 0, IBV_QPT_XRC_RECV, tgt, x), 0);
  uint32_t b = reg.add_client(::getpid(), ::getuid(), ::getgid());
  uint32_t xb = open_xrcd(b, file);
  ::close(file);
  proto::OpenQpReq oq{};
  oq.qpn = tgt;
  oq.xrcd = xb;
  proto::ImportQpReply rep{};
  std::vector<int> fds;
  ASSERT_EQ(call<proto::Op::OpenQp>(reg, b, oq, &rep), 0);
  reg.remove_client(a);
  ASSERT_NE(reg.qp_entry(tgt), nullptr);
  EXPECT_TRUE(reg.holds_qp(b, tgt));
  EXPECT_EQ(destroy(reg, ObjKind::kXrcdHandle, b, xb), EBUSY);  // the target QP uses the domain
  reg.remove_client(b);
  EXPECT_EQ(reg.qp_entry(tgt), nullptr);
  EXPECT_EQ(counts().qps, 0u);
  EXPECT_EQ(used(Quotas::kXrcd), 0u);
}

// ---- Contexts: release in one loop ---------------------------------------------

// A context holding one object of every kind, with references between
// them, is freed whole when its last process goes: nothing left in the
// tables, the quotas or the device segment.
TEST_F(RegistryContext, ReleasingAContextFreesEverything) {
  uint32_t p = pd(a), b = backing(a), ch = channel(a);
  uint32_t scq = cq(a, ch), rcq = cq(a), x = open_xrcd(a);
  proto::RegMrReply m = mr(a, p, b);
  uint32_t s = srq(a, p), xs = srq(a, p, x, rcq);
  uint32_t q = qp(a, p, scq, rcq, s);
  uint32_t ud = qp(a, p, scq, rcq, 0, IBV_QPT_UD);
  ud_to_rts(a, ud);
  proto::AllocMwReq alloc{};
  alloc.pd = p;
  alloc.type = IBV_MW_TYPE_1;
  proto::KeyReply w{};
  ASSERT_EQ(reg.mr().alloc_mw(a, alloc.pd, alloc, w), 0);
  proto::BindMwReq bind{};
  bind.mw = w.handle;
  bind.qpn = ud;
  bind.mr_key = m.key;
  bind.addr = 0x10000;
  bind.length = 64;
  bind.access = IBV_ACCESS_REMOTE_WRITE;
  proto::KeyReply bound{};
  ASSERT_EQ(call<proto::Op::BindMw>(reg, a, bind, &bound), 0);
  (void)xs;

  // A second process of the context: its leaving frees nothing.
  uint32_t other = join(p, "/registry-test-pd");
  reg.remove_client(a);
  EXPECT_NE(reg.qp_entry(q), nullptr);
  EXPECT_EQ(counts().mrs, 1u);
  reg.remove_client(other);

  Counts n = counts();
  EXPECT_EQ(n.clients, 0u);
  EXPECT_EQ(n.pds + n.mrs + n.cqs + n.qps + n.channels + n.backings, 0u);
  EXPECT_EQ(reg.qp_entry(q), nullptr);
  EXPECT_EQ(reg.qp_entry(ud), nullptr);
  EXPECT_EQ(reg.mr_entry(m.key), nullptr);
  EXPECT_EQ(reg.mr_entry(bound.key), nullptr);
  for (uint32_t k = 0; k < Quotas::kConnection; ++k)
    EXPECT_EQ(used(Quotas::Kind(k)), 0u) << Quotas::name(Quotas::Kind(k));
}

// A context's release leaves other contexts' objects alone.
TEST_F(RegistryContext, ReleaseTouchesOnlyItsContext) {
  uint32_t b = reg.add_client(::getpid(), ::getuid(), ::getgid());
  uint32_t pa = pd(a), ca = cq(a);
  uint32_t pb = pd(b), cb = cq(b);
  uint32_t qa = qp(a, pa, ca, ca), qb = qp(b, pb, cb, cb);
  reg.remove_client(a);
  EXPECT_EQ(reg.qp_entry(qa), nullptr);
  ASSERT_NE(reg.qp_entry(qb), nullptr);
  EXPECT_EQ(destroy(reg, ObjKind::kPd, b, pb), EBUSY);
  EXPECT_EQ(destroy(reg, ObjKind::kQp, b, qb), 0);
  EXPECT_EQ(destroy(reg, ObjKind::kCq, b, cb), 0);
  EXPECT_EQ(destroy(reg, ObjKind::kPd, b, pb), 0);
}

// ---- Sharing: regions -----------------------------------------------------------

// A named region lives while a backing of it is registered: it goes with
// the last MR of its last backing.
TEST_F(RegistrySharing, RegionGoesWithItsLastMr) {
  uint32_t p = pd(a);
  proto::RegShmidReq req{};
  req.pd = p;
  req.id_len = 3;
  std::memcpy(req.id, "abc", 3);
  req.length = kPage;
  proto::RegShmidReply rep{};
  std::vector<int> fds;
  ASSERT_EQ(call<proto::Op::RegShmid>(reg, a, req, &rep), 0);
  EXPECT_EQ(rep.created, 1u);
  EXPECT_EQ(reg.region_count(), 1u);
  proto::RegMrReply m = mr(a, p, rep.backing);
  EXPECT_EQ(destroy(reg, ObjKind::kMr, a, m.handle), 0);
  EXPECT_EQ(reg.region_count(), 0u);
  EXPECT_EQ(counts().backings, 0u);
}

}  // namespace
}  // namespace sv::daemon

namespace sv::daemon {
namespace {

// RoceAttachReq::lane picks one of the client's steered sockets
// (docs/ROCE.md, "Several engine threads"): a lane at or beyond
// kRoceMaxLanes is refused before anything else is looked at, so that no
// client makes the port open more than kRoceMaxLanes sockets for it per
// address whatever it sends.
TEST(RocePortInput, ALaneBeyondTheMaximumIsRefusedFirst) {
  RocePort port;  // not opened: a valid lane gets EOPNOTSUPP
  std::vector<uint32_t> lanes = {proto::kRoceMaxLanes, proto::kRoceMaxLanes + 1, 0x80000000u, 0xffffffffu};
  for (uint32_t lane = 0; lane < proto::kRoceMaxLanes; ++lane) lanes.push_back(lane);
  for (uint32_t lane : lanes) {
    proto::RoceAttachReq req{};
    req.qpn = 2;
    req.lane = lane;
    proto::RoceAttachReply rep{};
    std::vector<int> fds;
    EXPECT_EQ(lane < proto::kRoceMaxLanes ? EOPNOTSUPP : EINVAL, port.attach(1, 0, req, rep, fds)) << lane;
    EXPECT_TRUE(fds.empty());
  }
}

}  // namespace
}  // namespace sv::daemon
