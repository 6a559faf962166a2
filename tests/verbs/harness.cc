#include "harness.h"

#include "softverbs/softverbs.h"

#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <sched.h>

#include <thread>

namespace svtest {

int Side::open(const Options& o) {
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (!list || n < 1) return ENODEV;
  ctx = ibv_open_device(list[0]);
  ibv_free_device_list(list);
  if (!ctx) return errno;
  pd = ibv_alloc_pd(ctx);
  if (!pd) return errno;
  len = o.len;
  if (posix_memalign(reinterpret_cast<void**>(&buf), 4096, len)) return ENOMEM;
  std::memset(buf, 0, len);
  mr = ibv_reg_mr(pd, buf, len, o.mr_access);
  if (!mr) return errno;
  cq = ibv_create_cq(ctx, o.cqe, nullptr, nullptr, 0);
  if (!cq) return errno;
  ibv_qp_init_attr ia{};
  ia.send_cq = cq;
  ia.recv_cq = cq;
  ia.qp_type = o.type;
  ia.cap.max_send_wr = o.max_wr;
  ia.cap.max_recv_wr = o.max_wr;
  ia.cap.max_send_sge = 4;
  ia.cap.max_recv_sge = 4;
  ia.cap.max_inline_data = 64;
  if (o.send_ops) {
    ibv_qp_init_attr_ex ix{};
    ix.send_cq = cq;
    ix.recv_cq = cq;
    ix.qp_type = o.type;
    ix.cap = ia.cap;
    ix.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
    ix.pd = pd;
    ix.send_ops_flags = o.send_ops;
    qp = ibv_create_qp_ex(ctx, &ix);
  } else {
    qp = ibv_create_qp(pd, &ia);
  }
  if (!qp) return errno;
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.port_num = 1;
  a.pkey_index = 0;
  if (o.type == IBV_QPT_UD) {
    a.qkey = o.qkey;
    return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY);
  }
  a.qp_access_flags = o.type == IBV_QPT_UC ? (o.qp_access & IBV_ACCESS_REMOTE_WRITE) : o.qp_access;
  return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
}

int Side::connect(uint32_t dest_qpn, const Options& o) {
  if (o.type == IBV_QPT_UD) {  // no connection: RTR and RTS need no peer
    ibv_qp_attr u{};
    u.qp_state = IBV_QPS_RTR;
    if (int e = ibv_modify_qp(qp, &u, IBV_QP_STATE)) return e;
    u.qp_state = IBV_QPS_RTS;
    return ibv_modify_qp(qp, &u, IBV_QP_STATE | IBV_QP_SQ_PSN);
  }
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = IBV_MTU_1024;
  a.dest_qp_num = dest_qpn;
  a.rq_psn = 0;
  a.max_dest_rd_atomic = 1;
  a.min_rnr_timer = o.min_rnr_timer;
  a.ah_attr.is_global = 1;
  a.ah_attr.grh.sgid_index = 0;
  a.ah_attr.grh.hop_limit = 1;
  ibv_query_gid(ctx, 1, 0, &a.ah_attr.grh.dgid);
  a.ah_attr.port_num = 1;
  bool uc = o.type == IBV_QPT_UC;
  int rtr_mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
  if (!uc) rtr_mask |= IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
  if (int e = ibv_modify_qp(qp, &a, rtr_mask)) return e;
  ibv_qp_attr r{};
  r.qp_state = IBV_QPS_RTS;
  r.timeout = o.timeout;
  r.retry_cnt = o.retry_cnt;
  r.rnr_retry = o.rnr_retry;
  r.sq_psn = 0;
  r.max_rd_atomic = 1;
  int rts_mask = IBV_QP_STATE | IBV_QP_SQ_PSN;
  if (!uc) rts_mask |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
  return ibv_modify_qp(qp, &r, rts_mask);
}

void Side::close() {
  if (qp) ibv_destroy_qp(qp);
  if (cq) ibv_destroy_cq(cq);
  if (mr) ibv_dereg_mr(mr);
  if (pd) ibv_dealloc_pd(pd);
  if (ctx) ibv_close_device(ctx);
  std::free(buf);
  qp = nullptr;
  cq = nullptr;
  mr = nullptr;
  pd = nullptr;
  ctx = nullptr;
  buf = nullptr;
}

bool next_event(ibv_context* c, ibv_async_event& ev, int ms) {
  fcntl(c->async_fd, F_SETFL, fcntl(c->async_fd, F_GETFL) | O_NONBLOCK);
  pollfd p{c->async_fd, POLLIN, 0};
  for (int waited = 0;; waited += 10) {
    if (ibv_get_async_event(c, &ev) == 0) return true;
    if (waited >= ms) return false;
    ::poll(&p, 1, 10);
  }
}

int pack_qp_and_mr(int sock, ibv_context* ctx, ibv_qp* qp, ibv_mr* mr) {
  svx_object objs[2];
  objs[0].type = SVX_OBJ_QP;
  objs[0].qp = qp;
  objs[1].type = SVX_OBJ_MR;
  objs[1].mr = mr;
  return svx_pack(sock, ctx, objs, 2) == 0 ? 0 : errno;
}

std::vector<ibv_wc> poll(ibv_cq* cq, int n, int ms) {
  std::vector<ibv_wc> out;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  while (int(out.size()) < n && std::chrono::steady_clock::now() < deadline) {
    ibv_wc wc[8];
    int got = ibv_poll_cq(cq, 8, wc);
    if (got < 0) break;
    out.insert(out.end(), wc, wc + got);
    if (got == 0) std::this_thread::yield();
  }
  return out;
}

// Moves any RC QP through INIT/RTR/RTS towards `dest` (remote read and
// write allowed). 0 or errno.
int connect_qp(ibv_qp* qp, uint32_t dest) {
  Side s;
  s.ctx = qp->context;
  s.qp = qp;
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.port_num = 1;
  a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
  int e = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
  if (!e) e = s.connect(dest, {});
  s.ctx = nullptr;
  s.qp = nullptr;
  return e;
}

int restart_qp(ibv_qp* qp, uint32_t dest) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_RESET;
  if (int e = ibv_modify_qp(qp, &a, IBV_QP_STATE)) return e;
  return connect_qp(qp, dest);
}

int connect_pair(Side& me, Peer& peer, PeerInfo& info, const Side::Options& mine, const Side::Options& theirs) {
  if (int e = me.open(mine)) return e;
  info = peer.open(theirs);
  if (info.qpn == 0) return EIO;
  if (int e = peer.connect(me.qp->qp_num, theirs)) return e;
  return me.connect(info.qpn, mine);
}

uint64_t checksum(const uint8_t* p, uint64_t len) {
  uint64_t h = 1469598103934665603ull;
  for (uint64_t i = 0; i < len; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

// ---- Peer ----------------------------------------------------------------

namespace {

bool read_all(int fd, void* p, size_t n) {
  auto* c = static_cast<char*>(p);
  while (n) {
    ssize_t r = ::read(fd, c, n);
    if (r <= 0) return false;
    c += r;
    n -= size_t(r);
  }
  return true;
}

bool write_all(int fd, const void* p, size_t n) {
  auto* c = static_cast<const char*>(p);
  while (n) {
    ssize_t r = ::write(fd, c, n);
    if (r <= 0) return false;
    c += r;
    n -= size_t(r);
  }
  return true;
}

[[noreturn]] void serve(int fd) {
  Side s;
  Peer::Cmd c;
  while (read_all(fd, &c, sizeof(c))) {
    Peer::Reply r{};
    switch (c.op) {
      case Peer::kOpen:
        r.status = s.open(c.opt);
        if (!r.status) r.info = {s.qp->qp_num, s.mr->rkey, reinterpret_cast<uint64_t>(s.buf), s.len};
        break;
      case Peer::kConnect:
        r.status = s.connect(c.a, c.opt);
        break;
      case Peer::kPostRecv:
        for (uint32_t i = 0; i < c.a && !r.status; ++i) {
          ibv_sge sge{reinterpret_cast<uint64_t>(s.buf) + c.b + i * c.c, uint32_t(c.c), s.mr->lkey};
          ibv_recv_wr wr{};
          wr.wr_id = 1000 + i;
          wr.sg_list = &sge;
          wr.num_sge = 1;
          ibv_recv_wr* bad;
          r.status = ibv_post_recv(s.qp, &wr, &bad);
        }
        break;
      case Peer::kPoll: {
        auto v = poll(s.cq, int(std::min<uint32_t>(c.a, 8)), int(c.b));
        r.count = uint32_t(v.size());
        for (size_t i = 0; i < v.size(); ++i) r.wc[i] = v[i];
        break;
      }
      case Peer::kFill:
        for (uint64_t i = 0; i < s.len; ++i) s.buf[i] = pattern(uint8_t(c.a), i);
        break;
      case Peer::kChecksum:
        r.value = checksum(s.buf + c.b, c.c);
        break;
      case Peer::kToError: {
        ibv_qp_attr a{};
        a.qp_state = IBV_QPS_ERR;
        r.status = ibv_modify_qp(s.qp, &a, IBV_QP_STATE);
        break;
      }
      case Peer::kRereg:
        r.status = ibv_rereg_mr(s.mr, int(c.a), s.pd, s.buf + c.b, c.c, c.opt.mr_access);
        r.info = {s.qp->qp_num, s.mr->rkey, reinterpret_cast<uint64_t>(s.mr->addr), s.mr->length};
        break;
      case Peer::kPost: {
        ibv_sge sge{reinterpret_cast<uint64_t>(s.buf) + c.b, uint32_t(c.c), s.mr->lkey};
        ibv_send_wr wr{};
        wr.wr_id = 5;
        wr.sg_list = &sge;
        wr.num_sge = 1;
        wr.opcode = ibv_wr_opcode(c.a);
        wr.send_flags = IBV_SEND_SIGNALED;
        if (wr.opcode == IBV_WR_SEND_WITH_INV) wr.invalidate_rkey = c.e;
        wr.wr.rdma.remote_addr = c.d;
        wr.wr.rdma.rkey = c.e;
        ibv_send_wr* bad;
        r.status = ibv_post_send(s.qp, &wr, &bad);
        if (!r.status) {
          auto v = poll(s.cq, 1, 5000);
          r.count = uint32_t(v.size());
          if (!v.empty()) r.wc[0] = v[0];
        }
        break;
      }
      case Peer::kAtomics: {
        ibv_sge sge{reinterpret_cast<uint64_t>(s.buf), 8, s.mr->lkey};
        ibv_send_wr wr{};
        wr.sg_list = &sge;
        wr.num_sge = 1;
        wr.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
        wr.send_flags = IBV_SEND_SIGNALED;
        wr.wr.atomic.remote_addr = c.d;
        wr.wr.atomic.rkey = c.e;
        wr.wr.atomic.compare_add = 1;
        for (uint32_t i = 0; i < c.a && !r.status; ++i) {
          ibv_send_wr* bad;
          r.status = ibv_post_send(s.qp, &wr, &bad);
          auto v = poll(s.cq, 1, 5000);
          if (v.size() != 1 || v[0].status != IBV_WC_SUCCESS) r.status = EIO;
        }
        break;
      }
      case Peer::kAtomicWrites: {
        uint64_t value = 0;
        ibv_sge sge{reinterpret_cast<uint64_t>(&value), 8, 0};
        ibv_send_wr wr{};
        wr.sg_list = &sge;
        wr.num_sge = 1;
        wr.opcode = IBV_WR_ATOMIC_WRITE;
        wr.send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
        wr.wr.rdma.remote_addr = c.d;
        wr.wr.rdma.rkey = c.e;
        for (uint32_t i = 0; i < c.a && !r.status; ++i) {
          value = i % 2 ? c.c : c.b;
          ibv_send_wr* bad;
          r.status = ibv_post_send(s.qp, &wr, &bad);
          auto v = poll(s.cq, 1, 5000);
          if (v.size() != 1 || v[0].status != IBV_WC_SUCCESS) r.status = EIO;
        }
        break;
      }
      case Peer::kLockLoop: {
        uint64_t* local = reinterpret_cast<uint64_t*>(s.buf);
        auto one = [&](ibv_wr_opcode op, uint64_t addr, uint64_t cmp, uint64_t swap, uint32_t len) {
          ibv_sge sge{reinterpret_cast<uint64_t>(s.buf), len, s.mr->lkey};
          ibv_send_wr wr{};
          wr.sg_list = &sge;
          wr.num_sge = 1;
          wr.opcode = op;
          wr.send_flags = IBV_SEND_SIGNALED;
          if (op == IBV_WR_ATOMIC_CMP_AND_SWP) {
            wr.wr.atomic.remote_addr = addr;
            wr.wr.atomic.rkey = uint32_t(c.e);
            wr.wr.atomic.compare_add = cmp;
            wr.wr.atomic.swap = swap;
          } else {
            wr.wr.rdma.remote_addr = addr;
            wr.wr.rdma.rkey = uint32_t(c.e);
          }
          ibv_send_wr* bad;
          if (ibv_post_send(s.qp, &wr, &bad)) return false;
          ibv_wc wc;
          int n;
          while ((n = ibv_poll_cq(s.cq, 1, &wc)) == 0) {
          }
          return n == 1 && wc.status == IBV_WC_SUCCESS;
        };
        for (uint32_t i = 0; i < c.a && !r.status; ++i) {
          for (unsigned spins = 0;; ++spins) {
            if (!one(IBV_WR_ATOMIC_CMP_AND_SWP, c.b, 0, 1, 8)) { r.status = EIO; break; }
            if (*local == 0) break;  // we hold the lock
            if (spins > 16) sched_yield();
          }
          if (r.status) break;
          if (!one(IBV_WR_RDMA_READ, c.d, 0, 0, 8)) { r.status = EIO; break; }
          *local += 1;  // the non-atomic update the lock guards
          if (!one(IBV_WR_RDMA_WRITE, c.d, 0, 0, 8)) { r.status = EIO; break; }
          if (!one(IBV_WR_ATOMIC_CMP_AND_SWP, c.b, 1, 0, 8) || *local != 1) { r.status = EIO; break; }
        }
        break;
      }
      case Peer::kMcast: {
        ibv_gid g;
        std::memcpy(g.raw, &c.c, 8);
        std::memcpy(g.raw + 8, &c.d, 8);
        r.status = c.a ? ibv_attach_mcast(s.qp, &g, uint16_t(c.e)) : ibv_detach_mcast(s.qp, &g, uint16_t(c.e));
        break;
      }
      case Peer::kRestart:
        r.status = restart_qp(s.qp, c.a);
        break;
      case Peer::kDereg:
        r.status = ibv_dereg_mr(s.mr);
        if (!r.status) s.mr = nullptr;
        break;
      case Peer::kOdpOrphan: {
        ibv_mr* m = ibv_reg_mr(s.pd, nullptr, SIZE_MAX,
                               IBV_ACCESS_ON_DEMAND | IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                                   IBV_ACCESS_REMOTE_READ);
        r.status = m ? 0 : errno;
        r.info.rkey = m ? m->rkey : 0;
        if (m) {
          pid_t g = ::fork();
          if (g == 0) {
            for (;;) ::pause();
          }
          r.value = uint64_t(g);
        }
        break;
      }
      case Peer::kExit:
        s.close();
        write_all(fd, &r, sizeof(r));
        ::_exit(0);
    }
    write_all(fd, &r, sizeof(r));
  }
  ::_exit(0);
}

}  // namespace

}  // namespace svtest

// `test-binary --peer FD` (main.cc): a Peer's process, serving on FD.
extern "C" int svtest_peer_main(int fd) { svtest::serve(fd); }

namespace svtest {

// The peer is the test binary started again (`--peer FD`, see main.cc), not
// a bare fork: after a fork, a process whose threads were running (the
// library's watchdog, progress and wire threads) may only call
// async-signal-safe functions until it execs (POSIX), and a forked peer that
// opened a device hung so, rarely, on an allocator lock a parent thread held
// at the fork (Srq.TwoQpsFromTwoProcessesShareOneSrqAndTheLimitFires under
// ASan). A peer is a real second process, as an application's would be.
Peer::Peer() {
  int sv[2];
  ::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv);
  char exe[4096];
  ssize_t n = ::readlink("/proc/self/exe", exe, sizeof exe - 1);
  exe[n > 0 ? n : 0] = 0;
  char fdarg[16];
  std::snprintf(fdarg, sizeof fdarg, "%d", sv[1]);
  pid_ = ::fork();
  if (pid_ == 0) {
    // Only async-signal-safe calls from here to the exec.
    ::fcntl(sv[1], F_SETFD, 0);
    char peer[] = "--peer";
    char* argv[] = {exe, peer, fdarg, nullptr};
    ::execv(exe, argv);
    ::_exit(127);
  }
  ::close(sv[1]);
  sock_ = sv[0];
}

Peer::~Peer() {
  if (pid_ > 0) {
    Cmd c{};
    c.op = kExit;
    write_all(sock_, &c, sizeof(c));
    Reply r;
    read_all(sock_, &r, sizeof(r));
    int st;
    ::waitpid(pid_, &st, 0);
  }
  ::close(sock_);
}

void Peer::kill9() {
  ::kill(pid_, SIGKILL);
  int st;
  ::waitpid(pid_, &st, 0);
  pid_ = -1;
}

Peer::Reply Peer::call(const Cmd& c) {
  Reply r{};
  r.status = EIO;
  if (!write_all(sock_, &c, sizeof(c)) || !read_all(sock_, &r, sizeof(r))) r.status = EIO;
  return r;
}

PeerInfo Peer::open(const Side::Options& o) {
  Cmd c{};
  c.op = kOpen;
  c.opt = o;
  Reply r = call(c);
  if (r.status) return {};
  return r.info;
}

int Peer::connect(uint32_t dest, const Side::Options& o) {
  Cmd c{};
  c.op = kConnect;
  c.a = dest;
  c.opt = o;
  return call(c).status;
}

int Peer::post_recv(uint32_t count, uint64_t off, uint64_t len) {
  Cmd c{};
  c.op = kPostRecv;
  c.a = count;
  c.b = off;
  c.c = len;
  return call(c).status;
}

std::vector<ibv_wc> Peer::poll(uint32_t n, int ms) {
  Cmd c{};
  c.op = kPoll;
  c.a = n;
  c.b = uint64_t(ms);
  Reply r = call(c);
  return std::vector<ibv_wc>(r.wc, r.wc + r.count);
}

void Peer::fill(uint8_t seed) {
  Cmd c{};
  c.op = kFill;
  c.a = seed;
  call(c);
}

uint64_t Peer::checksum(uint64_t off, uint64_t len) {
  Cmd c{};
  c.op = kChecksum;
  c.b = off;
  c.c = len;
  return call(c).value;
}

uint32_t Peer::odp_orphan(pid_t* orphan) {
  Cmd c{};
  c.op = kOdpOrphan;
  Reply r = call(c);
  *orphan = r.status ? pid_t(r.status) : pid_t(r.value);
  return r.status ? 0 : r.info.rkey;
}

int Peer::restart(uint32_t dest_qpn) {
  Cmd c{};
  c.op = kRestart;
  c.a = dest_qpn;
  return call(c).status;
}

PeerInfo Peer::rereg(int flags, int access, uint64_t off, uint64_t len, int* status) {
  Cmd c{};
  c.op = kRereg;
  c.a = uint32_t(flags);
  c.b = off;
  c.c = len;
  c.opt.mr_access = access;
  Reply r = call(c);
  *status = r.status;
  return r.info;
}

ibv_wc Peer::post(ibv_wr_opcode op, uint64_t off, uint32_t len, uint64_t remote_addr, uint32_t rkey) {
  Cmd c{};
  c.op = kPost;
  c.a = op;
  c.b = off;
  c.c = len;
  c.d = remote_addr;
  c.e = rkey;
  Reply r = call(c);
  if (r.status || r.count != 1) {
    ibv_wc bad{};
    bad.status = IBV_WC_GENERAL_ERR;
    return bad;
  }
  return r.wc[0];
}

int Peer::fetch_add(uint32_t count, uint64_t remote_addr, uint32_t rkey) {
  Cmd c{};
  c.op = kAtomics;
  c.a = count;
  c.d = remote_addr;
  c.e = rkey;
  return call(c).status;
}

int Peer::atomic_writes(uint32_t count, uint64_t a, uint64_t b, uint64_t remote_addr, uint32_t rkey) {
  Cmd c{};
  c.op = kAtomicWrites;
  c.a = count;
  c.b = a;
  c.c = b;
  c.d = remote_addr;
  c.e = rkey;
  return call(c).status;
}

int Peer::lock_loop(uint32_t count, uint64_t lock_addr, uint64_t counter_addr, uint32_t rkey) {
  Cmd c{};
  c.op = kLockLoop;
  c.a = count;
  c.b = lock_addr;
  c.d = counter_addr;
  c.e = rkey;
  return call(c).status;
}

int Peer::dereg() {
  Cmd c{};
  c.op = kDereg;
  return call(c).status;
}

int Peer::to_error() {
  Cmd c{};
  c.op = kToError;
  return call(c).status;
}

}  // namespace svtest

namespace svtest {

int Peer::mcast(bool attach, const ibv_gid& gid, uint16_t lid) {
  Cmd c{};
  c.op = kMcast;
  c.a = attach ? 1 : 0;
  std::memcpy(&c.c, gid.raw, 8);
  std::memcpy(&c.d, gid.raw + 8, 8);
  c.e = lid;
  return call(c).status;
}

}  // namespace svtest
