#include "semantics_agent.h"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>

#include "../security/attack.h"
#include "common/verbs_current.h"

namespace svsem {
namespace {

enum Op : uint32_t { kOpen = 1, kConnect, kPostSend, kPostRecv, kPoll, kStore, kLoad, kWatch, kWatchResult };

constexpr int kReplyMs = 60000;  // an agent that says nothing for a minute is stuck

bool write_all(int fd, const void* p, size_t n) {
  auto* c = static_cast<const uint8_t*>(p);
  while (n) {
    ssize_t k = ::send(fd, c, n, MSG_NOSIGNAL);
    if (k <= 0) {
      if (k < 0 && errno == EINTR) continue;
      return false;
    }
    c += k;
    n -= size_t(k);
  }
  return true;
}

// Reads n bytes; with ms >= 0, gives up when nothing arrives for ms.
bool read_all(int fd, void* p, size_t n, int ms) {
  auto* c = static_cast<uint8_t*>(p);
  while (n) {
    if (ms >= 0) {
      pollfd pf{fd, POLLIN, 0};
      if (::poll(&pf, 1, ms) != 1) return false;
    }
    ssize_t k = ::recv(fd, c, n, 0);
    if (k <= 0) {
      if (k < 0 && errno == EINTR) continue;
      return false;
    }
    c += k;
    n -= size_t(k);
  }
  return true;
}

struct Header {
  int32_t op_or_status;
  uint32_t len;
};

// ---- The environment of each path ----------------------------------------

// Enters network namespace `name` (ip netns); false on failure.
bool enter_netns(const std::string& name) {
  int fd = ::open(("/var/run/netns/" + name).c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const bool ok = setns(fd, CLONE_NEWNET) == 0;
  ::close(fd);
  return ok;
}

// Starts a daemon serving `dir` and waits (up to 60 s: a loaded machine)
// until it answers; in namespace `ns` owning its UDP 4791, unless `ns` is
// empty. Its pid, or -1. Started here rather than by the agents' library,
// whose wait for a daemon it starts is 10 s.
pid_t start_daemon(const std::string& ns, const std::string& dir) {
  const std::string bin = svsec::build_bin("softverbsd");
  pid_t pid = fork();
  if (pid == 0) {
    // Gone with the test: a test that dies (a sanitizer's abort) must not
    // leave a daemon holding its output open, which ctest would wait on.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (!ns.empty() && !enter_netns(ns)) _exit(126);
    unsetenv("SOFTVERBSD_IDLE");  // it would override --idle 0
    if (!ns.empty()) setenv("SOFTVERBS_ROCE", "1", 1);
    execl(bin.c_str(), "softverbsd", "--foreground", "--dir", dir.c_str(), "--idle", "0", static_cast<char*>(nullptr));
    _exit(127);
  }
  if (pid < 0) return -1;
  for (int i = 0; i < 6000; ++i) {
    sv::Fd probe;
    if (sv::connect_seqpacket(dir + "/control", probe) == 0) return pid;
    int st = 0;
    if (waitpid(pid, &st, WNOHANG) == pid) return -1;
    usleep(10000);
  }
  kill(pid, SIGKILL);
  svsec::wait_for(pid);
  return -1;
}

struct Testbed {
  std::string prefix;
  std::string dirs[2];  // each namespace's daemon directory
  pid_t daemons[2] = {-1, -1};
  std::string error;
  Testbed() {
    prefix = "svsem" + std::to_string(getpid());
    std::string net = std::to_string(getpid() % 200 + 20);
    std::string cmd = "SOFTVERBS_TESTBED=" + prefix + " SOFTVERBS_TESTBED_NET=" + net + " " +
                      SOFTVERBS_SOURCE_DIR "/scripts/testbed.sh up 2 >/dev/null 2>&1";
    if (std::system(cmd.c_str()) != 0) error = "scripts/testbed.sh up failed (no network namespaces?)";
    for (int i = 0; i < 2 && error.empty(); ++i) {
      char tmpl[] = "/tmp/softverbs-sem-XXXXXX";
      const char* d = mkdtemp(tmpl);
      dirs[i] = d ? d : "";
      daemons[i] = d ? start_daemon(prefix + "-h" + std::to_string(i), dirs[i]) : -1;
      if (daemons[i] < 0) error = "the daemon of namespace h" + std::to_string(i) + " did not start";
    }
  }
  ~Testbed() {
    for (pid_t pid : daemons)
      if (pid > 0) {
        kill(pid, SIGTERM);
        svsec::wait_for(pid);
      }
    std::string cmd = "SOFTVERBS_TESTBED=" + prefix + " " SOFTVERBS_SOURCE_DIR "/scripts/testbed.sh down >/dev/null 2>&1";
    if (std::system(cmd.c_str())) {
    }
    for (auto& d : dirs)
      if (!d.empty() && std::system(("rm -rf " + d).c_str())) {
      }
  }
};

// This binary's own daemon (SOFTVERBS_DIR, set by main.cc), for kShm.
struct PrivateDaemon {
  pid_t pid = -1;
  PrivateDaemon() {
    const char* dir = std::getenv("SOFTVERBS_DIR");
    if (dir) pid = start_daemon("", dir);
  }
  ~PrivateDaemon() {
    if (pid > 0) {
      kill(pid, SIGTERM);
      svsec::wait_for(pid);
    }
  }
};

std::unique_ptr<PrivateDaemon> g_private;
std::unique_ptr<svsec::SystemDaemon> g_system;
std::unique_ptr<Testbed> g_testbed;
std::string g_system_dir;

// In the forked agent, before the library is first used: where it is.
bool enter_path(Path p, int side) {
  if (p == Path::kMediated) {
    setenv("SOFTVERBS_SYSTEM", "1", 1);
    setenv("SOFTVERBS_SYSTEM_DIR", g_system_dir.c_str(), 1);
    if (side == 1 && !svsec::become_nobody()) return false;
  } else if (p == Path::kWire) {
    if (!enter_netns(g_testbed->prefix + "-h" + std::to_string(side))) return false;
    setenv("SOFTVERBS_DIR", g_testbed->dirs[side].c_str(), 1);
    setenv("SOFTVERBS_ROCE", "1", 1);
  }
  return true;
}

}  // namespace

const char* path_name(Path p) {
  switch (p) {
    case Path::kShm: return "Shm";
    case Path::kMediated: return "Mediated";
    case Path::kWire: return "Wire";
  }
  return "?";
}

std::string path_unavailable(Path p) {
  if (p == Path::kShm) {
    if (!g_private) g_private = std::make_unique<PrivateDaemon>();
    return g_private->pid > 0 ? "" : "this binary's daemon (SOFTVERBS_DIR) did not start";
  }
  if (geteuid() != 0)
    return std::string(p == Path::kMediated ? "needs root: the responder runs as nobody under a system daemon"
                                            : "needs root: the wire path runs between two network namespaces");
  if (p == Path::kMediated) {
    if (!g_system) {
      g_system = std::make_unique<svsec::SystemDaemon>();
      g_system_dir = g_system->dir;
      // Only the mediated path's agents use it (enter_path).
      unsetenv("SOFTVERBS_SYSTEM");
      unsetenv("SOFTVERBS_SYSTEM_DIR");
    }
    return g_system->alive() ? "" : "the system daemon (softverbsd --system) did not start";
  }
  if (!g_testbed) g_testbed = std::make_unique<Testbed>();
  return g_testbed->error;
}

std::vector<uint8_t> pattern(uint8_t seed, uint64_t len) {
  std::vector<uint8_t> v(len);
  for (uint64_t i = 0; i < len; ++i) v[i] = uint8_t((seed * 131 + i * 7 + (i >> 8)) % 255 + 1);
  return v;
}

// ---- The agent process ----------------------------------------------------

namespace {

struct AgentState {
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  ibv_cq* cq = nullptr;
  ibv_qp* qp = nullptr;
  ibv_mr* mr = nullptr;
  ibv_ah* ah = nullptr;
  uint8_t* buf = nullptr;
  uint64_t len = 0;
  uint32_t type = IBV_QPT_RC;
  uint32_t gid_index = 0;
  uint32_t access = 0;
  uint32_t dest_qpn = 0;
  uint32_t rnr_retry = 7;
  std::thread watcher;
  std::atomic<bool> watching{false};  // the watcher has looked once
  WatchResult watched;
};

constexpr uint32_t kQkey = 0x11111111;

int open_side(AgentState& s, const OpenArgs& a, Endpoint& e) {
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (!list || n < 1) return ENODEV;
  s.ctx = ibv_open_device(list[0]);
  ibv_free_device_list(list);
  if (!s.ctx || !(s.pd = ibv_alloc_pd(s.ctx))) return errno ? errno : EIO;
  s.len = a.len;
  if (posix_memalign(reinterpret_cast<void**>(&s.buf), 4096, s.len)) return ENOMEM;
  std::memset(s.buf, 0, s.len);
  if (!(s.mr = ibv_reg_mr(s.pd, s.buf, s.len, int(a.mr_access)))) return errno;
  if (!(s.cq = ibv_create_cq(s.ctx, 256, nullptr, nullptr, 0))) return errno;
  ibv_qp_init_attr ia{};
  ia.send_cq = ia.recv_cq = s.cq;
  ia.qp_type = ibv_qp_type(a.qp_type);
  ia.cap.max_send_wr = ia.cap.max_recv_wr = 64;
  ia.cap.max_send_sge = ia.cap.max_recv_sge = kMaxSge;
  ia.cap.max_inline_data = kMaxInline;
  if (a.extended) {
    ibv_qp_init_attr_ex x{};
    x.send_cq = x.recv_cq = s.cq;
    x.qp_type = ia.qp_type;
    x.cap = ia.cap;
    x.pd = s.pd;
    x.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
    x.send_ops_flags = IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_READ | IBV_QP_EX_WITH_SEND |
                       IBV_QP_EX_WITH_ATOMIC_WRITE | sv::abi::kQpExWithFlush;
    if (!(s.qp = ibv_create_qp_ex(s.ctx, &x))) return errno;
  } else if (!(s.qp = ibv_create_qp(s.pd, &ia))) {
    return errno;
  }
  s.type = a.qp_type;
  s.gid_index = a.gid_index;
  s.access = a.qp_access;
  s.rnr_retry = a.rnr_retry;
  ibv_qp_attr at{};
  at.qp_state = IBV_QPS_INIT;
  at.port_num = 1;
  int mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT;
  if (s.type == IBV_QPT_UD) {
    at.qkey = kQkey;
    mask |= IBV_QP_QKEY;
  } else {
    at.qp_access_flags = s.type == IBV_QPT_UC ? (a.qp_access & IBV_ACCESS_REMOTE_WRITE) : a.qp_access;
    mask |= IBV_QP_ACCESS_FLAGS;
  }
  if (int r = ibv_modify_qp(s.qp, &at, mask)) return r;
  ibv_gid g{};
  if (int r = ibv_query_gid(s.ctx, 1, int(a.gid_index), &g)) return r;
  e.qpn = s.qp->qp_num;
  e.rkey = s.mr->rkey;
  e.lkey = s.mr->lkey;
  e.addr = reinterpret_cast<uintptr_t>(s.buf);
  e.gid_index = a.gid_index;
  std::memcpy(e.gid, g.raw, 16);
  return 0;
}

ibv_ah_attr address_of(const AgentState& s, const Endpoint& peer) {
  ibv_ah_attr ah{};
  ah.is_global = 1;
  ah.port_num = 1;
  ah.grh.sgid_index = uint8_t(s.gid_index);
  ah.grh.hop_limit = 64;
  std::memcpy(ah.grh.dgid.raw, peer.gid, 16);
  return ah;
}

int connect_side(AgentState& s, const Endpoint& peer) {
  ibv_qp_attr a{};
  s.dest_qpn = peer.qpn;
  if (s.type == IBV_QPT_UD) {
    ibv_ah_attr ah = address_of(s, peer);
    if (!(s.ah = ibv_create_ah(s.pd, &ah))) return errno;
    a.qp_state = IBV_QPS_RTR;
    if (int e = ibv_modify_qp(s.qp, &a, IBV_QP_STATE)) return e;
    a.qp_state = IBV_QPS_RTS;
    return ibv_modify_qp(s.qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN);
  }
  const bool uc = s.type == IBV_QPT_UC;
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = IBV_MTU_1024;
  a.dest_qp_num = peer.qpn;
  a.max_dest_rd_atomic = 4;
  a.min_rnr_timer = 1;
  a.ah_attr = address_of(s, peer);
  int mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
  if (!uc) mask |= IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
  if (int e = ibv_modify_qp(s.qp, &a, mask)) return e;
  ibv_qp_attr r{};
  r.qp_state = IBV_QPS_RTS;
  r.timeout = 14;
  r.retry_cnt = 7;
  r.rnr_retry = uint8_t(s.rnr_retry);
  r.max_rd_atomic = 4;
  mask = IBV_QP_STATE | IBV_QP_SQ_PSN;
  if (!uc) mask |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
  return ibv_modify_qp(s.qp, &r, mask);
}

// The scatter/gather list of a Wr or Recv: none for a zero-length first.
template <class W>
int sg_list(const AgentState& s, const W& w, ibv_sge (&out)[kMaxSge]) {
  if constexpr (requires { w.zero_sge; }) {
    if (!w.len && w.zero_sge) {
      out[0] = {reinterpret_cast<uintptr_t>(s.buf) + w.off, 0, s.mr->lkey ^ w.lkey_xor};
      return 1;
    }
  }
  if (!w.len) return 0;
  out[0] = {reinterpret_cast<uintptr_t>(s.buf) + w.off, w.len, s.mr->lkey ^ w.lkey_xor};
  const uint32_t more = std::min(w.more, kMaxSge - 1);
  for (uint32_t i = 0; i < more; ++i) {
    const Sge& m = w.more_sge[i];
    out[i + 1] = {reinterpret_cast<uintptr_t>(s.buf) + m.off, m.len, s.mr->lkey ^ m.lkey_xor};
  }
  return int(1 + more);
}

// IBTA annex A19 through the ibv_wr_* API: ibv_wr_flush is v64's member
// of ibv_qp_ex (sv::abi::QpExCurrent), past v44's struct.
int post_send_new(AgentState& s, const Wr& w) {
  ibv_qp_ex* x = ibv_qp_to_qp_ex(s.qp);
  if (!x) return EINVAL;
  ibv_wr_start(x);
  x->wr_id = w.wr_id;
  x->wr_flags = w.send_flags;
  if (w.opcode == kWrFlush) {
    reinterpret_cast<sv::abi::QpExCurrent*>(x)->wr_flush(x, w.rkey, w.raddr, w.flush_len, w.flush_type,
                                                          w.flush_level);
  } else {
    ibv_wr_atomic_write(x, w.rkey, w.raddr, s.buf + w.off);
  }
  return ibv_wr_complete(x);
}

int post_send_side(AgentState& s, const Wr& w) {
  if (w.new_api || w.opcode == kWrFlush) {
    if (!w.new_api) {  // IBV_WR_FLUSH through ibv_post_send: the placement type is not in ibv_send_wr
      ibv_send_wr wr{}, *bad = nullptr;
      wr.wr_id = w.wr_id;
      wr.opcode = ibv_wr_opcode(w.opcode);
      wr.send_flags = w.send_flags;
      wr.wr.rdma.remote_addr = w.raddr;
      wr.wr.rdma.rkey = w.rkey;
      return ibv_post_send(s.qp, &wr, &bad);
    }
    return post_send_new(s, w);
  }
  ibv_sge sge[kMaxSge];
  ibv_send_wr wr{}, *bad = nullptr;
  wr.wr_id = w.wr_id;
  wr.opcode = ibv_wr_opcode(w.opcode);
  wr.send_flags = w.send_flags;
  wr.num_sge = sg_list(s, w, sge);
  wr.sg_list = wr.num_sge ? sge : nullptr;
  wr.imm_data = w.imm;
  if (s.type == IBV_QPT_UD) {
    wr.wr.ud.ah = s.ah;
    wr.wr.ud.remote_qpn = s.dest_qpn;
    wr.wr.ud.remote_qkey = kQkey;
  } else if (w.opcode == IBV_WR_ATOMIC_CMP_AND_SWP || w.opcode == IBV_WR_ATOMIC_FETCH_AND_ADD) {
    wr.wr.atomic.remote_addr = w.raddr;
    wr.wr.atomic.rkey = w.rkey;
    wr.wr.atomic.compare_add = w.compare_add;
    wr.wr.atomic.swap = w.swap;
  } else {
    wr.wr.rdma.remote_addr = w.raddr;
    wr.wr.rdma.rkey = w.rkey;
  }
  return ibv_post_send(s.qp, &wr, &bad);
}

int post_recv_side(AgentState& s, const Recv& r) {
  // A UD receive starts with the 40 bytes of the GRH (ibv_post_recv(3)).
  ibv_sge sge[kMaxSge];
  ibv_recv_wr wr{}, *bad = nullptr;
  wr.wr_id = r.wr_id;
  wr.num_sge = sg_list(s, r, sge);
  wr.sg_list = wr.num_sge ? sge : nullptr;
  return ibv_post_recv(s.qp, &wr, &bad);
}

std::vector<ibv_wc> poll_side(AgentState& s, uint32_t n, uint32_t ms) {
  std::vector<ibv_wc> out;
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  while (out.size() < n && std::chrono::steady_clock::now() < until) {
    ibv_wc wc[8];
    int got = ibv_poll_cq(s.cq, 8, wc);
    if (got < 0) break;
    out.insert(out.end(), wc, wc + got);
    if (got == 0) std::this_thread::yield();
  }
  return out;
}

// The watcher: spins on the last byte (an acquire load, as a poller of the
// target would), then compares the rest with what was written.
void watch(AgentState& s, uint64_t off, std::vector<uint8_t> want, uint32_t ms) {
  const uint64_t last = off + want.size() - 1;
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  std::atomic_ref<uint8_t> tail(s.buf[last]);
  uint8_t seen = tail.load(std::memory_order_acquire);
  s.watching.store(true, std::memory_order_release);
  for (uint64_t spins = 0; seen != want.back(); ++spins, seen = tail.load(std::memory_order_acquire)) {
    if ((spins & 63) == 63) {
      if (std::chrono::steady_clock::now() > until) {
        s.watched.state = 2;
        return;
      }
      sched_yield();
    }
  }
  s.watched.state = 0;
  for (uint64_t i = 0; i + 1 < want.size(); ++i) {
    if (std::atomic_ref<uint8_t>(s.buf[off + i]).load(std::memory_order_relaxed) != want[i]) {
      s.watched.state = 1;
      s.watched.first_missing = i;
      return;
    }
  }
}

// Carries out one command; the reply's status, its payload in `out`.
int serve_one(AgentState& s, uint32_t op, const std::vector<uint8_t>& in, std::vector<uint8_t>& out) {
  auto arg = [&](auto& v) {
    if (!in.empty()) std::memcpy(&v, in.data(), std::min(sizeof(v), in.size()));
  };
  auto put = [&](const void* p, size_t n) {
    auto* c = static_cast<const uint8_t*>(p);
    out.insert(out.end(), c, c + n);
  };
  switch (op) {
    case kOpen: {
      OpenArgs a;
      arg(a);
      Endpoint e;
      int r = open_side(s, a, e);
      put(&e, sizeof(e));
      return r;
    }
    case kConnect: {
      Endpoint e;
      arg(e);
      return connect_side(s, e);
    }
    case kPostSend: {
      Wr w;
      arg(w);
      return post_send_side(s, w);
    }
    case kPostRecv: {
      Recv r;
      arg(r);
      return post_recv_side(s, r);
    }
    case kPoll: {
      uint32_t nm[2] = {0, 0};
      arg(nm);
      auto wcs = poll_side(s, nm[0], nm[1]);
      put(wcs.data(), wcs.size() * sizeof(ibv_wc));
      return 0;
    }
    default: break;
  }
  uint64_t range[2] = {0, 0};
  arg(range);
  if (range[0] > s.len || (op != kStore && op != kWatch && range[1] > s.len - range[0])) return ERANGE;
  if (op == kStore || op == kWatch) {
    uint64_t n = in.size() - 16;
    if (n > s.len - range[0]) return ERANGE;
    if (op == kStore) std::memcpy(s.buf + range[0], in.data() + 16, n);
    if (op == kWatch) {
      if (s.watcher.joinable() || n == 0) return EBUSY;
      s.watched = {};
      s.watching.store(false);
      s.watcher = std::thread(watch, std::ref(s), range[0], std::vector<uint8_t>(in.begin() + 16, in.end()),
                              uint32_t(range[1]));
      // Answered once the watcher is spinning (or already done).
      while (!s.watching.load(std::memory_order_acquire)) std::this_thread::yield();
    }
    return 0;
  }
  if (op == kLoad) {
    put(s.buf + range[0], range[1]);
    return 0;
  }
  if (op == kWatchResult) {
    if (!s.watcher.joinable()) return ECHILD;
    s.watcher.join();
    put(&s.watched, sizeof(s.watched));
    return 0;
  }
  return ENOSYS;
}

[[noreturn]] void serve(int sock) {
  AgentState s;
  for (;;) {
    Header h{};
    if (!read_all(sock, &h, sizeof(h), -1)) break;
    std::vector<uint8_t> in(h.len), out;
    if (!read_all(sock, in.data(), in.size(), kReplyMs)) break;
    Header r{serve_one(s, uint32_t(h.op_or_status), in, out), uint32_t(out.size())};
    if (!write_all(sock, &r, sizeof(r)) || !write_all(sock, out.data(), out.size())) break;
  }
  // The test is done with this side: no teardown of the verbs objects (a
  // QP in error, a watcher still spinning); the daemon cleans up after us.
  _exit(0);
}

}  // namespace

bool Agent::start(Path p, int side) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) return false;
  pid_ = fork();
  if (pid_ < 0) return false;
  if (pid_ == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);  // gone with the test, as its daemons
    // Only its own end: an agent holding another's would keep that one
    // from seeing its socket close.
    const unsigned keep = unsigned(sv[1]);
    if (keep > 3) close_range(3, keep - 1, 0);
    close_range(keep + 1, ~0u, 0);
    if (!enter_path(p, side)) {
      std::fprintf(stderr, "semantics agent %d of %s: cannot enter the path: %s\n", side, path_name(p),
                   std::strerror(errno));
      _exit(3);
    }
    serve(sv[1]);
  }
  ::close(sv[1]);
  sock_ = sv[0];
  return true;
}

Agent::~Agent() { stop(); }

void Agent::stop() {
  if (sock_ >= 0) ::close(sock_);
  sock_ = -1;
  if (pid_ <= 0) return;
  const pid_t pid = pid_;
  pid_ = -1;
  // The agent exits when its socket closes; a stuck one is killed.
  for (int i = 0; i < 1000; ++i) {
    int st = 0;
    if (waitpid(pid, &st, WNOHANG) == pid) return;
    usleep(10000);
  }
  kill(pid, SIGKILL);
  svsec::wait_for(pid);
}

int Agent::call(uint32_t op, const void* arg, size_t arg_len, std::vector<uint8_t>* reply) {
  Header h{int32_t(op), uint32_t(arg_len)};
  if (!write_all(sock_, &h, sizeof(h)) || !write_all(sock_, arg, arg_len)) return EPIPE;
  Header r{};
  if (!read_all(sock_, &r, sizeof(r), kReplyMs)) return ETIMEDOUT;
  std::vector<uint8_t> got(r.len);
  if (!read_all(sock_, got.data(), got.size(), kReplyMs)) return ETIMEDOUT;
  if (reply) *reply = std::move(got);
  return r.op_or_status;
}

int Agent::open(const OpenArgs& a, Endpoint& out) {
  std::vector<uint8_t> r;
  int e = call(kOpen, &a, sizeof(a), &r);
  if (r.size() == sizeof(out)) std::memcpy(&out, r.data(), sizeof(out));
  return e;
}

int Agent::connect(const Endpoint& peer) { return call(kConnect, &peer, sizeof(peer), nullptr); }
int Agent::post_send(const Wr& w) { return call(kPostSend, &w, sizeof(w), nullptr); }
int Agent::post_recv(const Recv& r) { return call(kPostRecv, &r, sizeof(r), nullptr); }

std::vector<ibv_wc> Agent::poll(uint32_t n, uint32_t ms) {
  uint32_t nm[2] = {n, ms};
  std::vector<uint8_t> r;
  std::vector<ibv_wc> out;
  if (call(kPoll, nm, sizeof(nm), &r) != 0) return out;
  out.resize(r.size() / sizeof(ibv_wc));
  if (!out.empty()) std::memcpy(out.data(), r.data(), out.size() * sizeof(ibv_wc));
  return out;
}

namespace {
std::vector<uint8_t> range_arg(uint64_t off, uint64_t n, const std::vector<uint8_t>& bytes) {
  std::vector<uint8_t> a(16 + bytes.size());
  std::memcpy(a.data(), &off, 8);
  std::memcpy(a.data() + 8, &n, 8);
  if (!bytes.empty()) std::memcpy(a.data() + 16, bytes.data(), bytes.size());
  return a;
}
}  // namespace

bool Agent::store(uint64_t off, const std::vector<uint8_t>& bytes) {
  auto a = range_arg(off, 0, bytes);
  return call(kStore, a.data(), a.size(), nullptr) == 0;
}

std::vector<uint8_t> Agent::load(uint64_t off, uint64_t len) {
  auto a = range_arg(off, len, {});
  std::vector<uint8_t> r;
  if (call(kLoad, a.data(), a.size(), &r) != 0) r.clear();
  return r;
}

bool Agent::watch_tail(uint64_t off, const std::vector<uint8_t>& want, uint32_t ms) {
  auto a = range_arg(off, ms, want);
  return call(kWatch, a.data(), a.size(), nullptr) == 0;
}

WatchResult Agent::watch_result() {
  std::vector<uint8_t> r;
  WatchResult w;
  if (call(kWatchResult, nullptr, 0, &r) == 0 && r.size() == sizeof(w)) std::memcpy(&w, r.data(), sizeof(w));
  return w;
}

}  // namespace svsem
