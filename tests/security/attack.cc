#include "attack.h"

#include <infiniband/verbs.h>

#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace svsec {

std::string build_bin(const char* name) {
  char buf[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  buf[n > 0 ? n : 0] = 0;
  std::string p(buf);
  return p.substr(0, p.rfind('/')) + "/../bin/" + name;
}

int wait_for(pid_t pid) {
  int st = 0;
  while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

ibv_context* open_dev() {
  int n = 0;
  ibv_device** l = ibv_get_device_list(&n);
  ibv_context* c = l && n > 0 ? ibv_open_device(l[0]) : nullptr;
  if (l) ibv_free_device_list(l);
  return c;
}

bool become_nobody() {
  return setgroups(0, nullptr) == 0 && setgid(kNobody) == 0 && setuid(kNobody) == 0;
}

int sealed_backing(size_t len) {
  int fd = memfd_create("softverbs-test-backing", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return -1;
  if (ftruncate(fd, off_t(len)) != 0 || fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_SEAL) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

SystemDaemon::SystemDaemon() : SystemDaemon([](const std::string&) {}) {}

SystemDaemon::SystemDaemon(const std::function<void(const std::string& dir)>& before_start) {
  char tmpl[] = "/tmp/softverbs-system-XXXXXX";
  dir = mkdtemp(tmpl);
  chmod(dir.c_str(), 0755);
  before_start(dir);
  std::string bin = build_bin("softverbsd");
  pid = fork();
  if (pid == 0) {
    unsetenv("SOFTVERBSD_IDLE");  // set by the test main; it would override --idle 0
    execl(bin.c_str(), "softverbsd", "--system", "--foreground", "--dir", dir.c_str(), "--idle", "0",
          static_cast<char*>(nullptr));
    _exit(127);
  }
  // Ready when it accepts a connection (its socket file appears at bind,
  // before listen): up to 30 s, for a loaded sanitizer run.
  for (int i = 0; i < 3000; ++i) {
    sv::Fd probe;
    if (sv::connect_seqpacket(socket(), probe) == 0) break;
    usleep(10000);
  }
  setenv("SOFTVERBS_SYSTEM", "1", 1);
  setenv("SOFTVERBS_SYSTEM_DIR", dir.c_str(), 1);
}

SystemDaemon::~SystemDaemon() {
  unsetenv("SOFTVERBS_SYSTEM");
  unsetenv("SOFTVERBS_SYSTEM_DIR");
  if (pid > 0) {
    kill(pid, SIGTERM);
    wait_for(pid);
  }
  std::string cmd = "rm -rf " + dir;
  if (std::system(cmd.c_str())) {
  }
}

bool SystemDaemon::alive() const {
  if (pid <= 0) return false;
  int st = 0;
  return waitpid(pid, &st, WNOHANG) == 0;
}

Child::Child(bool as_nobody, std::function<int(int sock)> body) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) return;
  pid_ = fork();
  if (pid_ == 0) {
    close(sv[0]);
    char go = 0;
    if (read(sv[1], &go, 1) != 1) _exit(99);
    if (as_nobody && !become_nobody()) _exit(98);
    _exit(body(sv[1]));
  }
  close(sv[1]);
  sock_ = sv[0];
}

Child::~Child() {
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    wait();
  }
}

void Child::start() {
  char go = 1;
  if (write(sock_, &go, 1) != 1) std::perror("Child::start");
}

int Child::wait() {
  if (sock_ >= 0) close(sock_);
  sock_ = -1;
  int st = wait_for(pid_);
  pid_ = -1;
  return st;
}

bool send_bytes(int sock, const void* p, size_t n, std::span<const int> fds) {
  return sv::send_message(sock, p, n, fds) == 0;
}

bool recv_bytes(int sock, void* p, size_t n, std::vector<sv::Fd>* fds) {
  std::vector<sv::Fd> got;
  size_t len = 0;
  if (sv::recv_message(sock, p, n, &len, got) != 0 || len != n) return false;
  if (fds) *fds = std::move(got);
  return true;
}

int qp_to_init(ibv_qp* qp, int access) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.port_num = 1;
  a.qp_access_flags = access;
  return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
}

int qp_to_rts(ibv_context* c, ibv_qp* qp, uint32_t dest) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = IBV_MTU_1024;
  a.dest_qp_num = dest;
  a.max_dest_rd_atomic = 1;
  a.min_rnr_timer = 1;
  a.ah_attr.is_global = 1;
  a.ah_attr.grh.hop_limit = 1;
  ibv_query_gid(c, 1, 0, &a.ah_attr.grh.dgid);
  a.ah_attr.port_num = 1;
  if (int e = ibv_modify_qp(qp, &a,
                            IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
    return e;
  ibv_qp_attr r{};
  r.qp_state = IBV_QPS_RTS;
  r.timeout = 14;
  r.retry_cnt = 7;
  r.rnr_retry = 7;
  r.max_rd_atomic = 1;
  return ibv_modify_qp(qp, &r,
                       IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                           IBV_QP_MAX_QP_RD_ATOMIC);
}

bool RcEnd::open() {
  ctx = open_dev();
  if (!ctx || !(pd = ibv_alloc_pd(ctx)) || !(cq = ibv_create_cq(ctx, 64, nullptr, nullptr, 0))) return false;
  ibv_qp_init_attr ia{};
  ia.send_cq = ia.recv_cq = cq;
  ia.qp_type = IBV_QPT_RC;
  ia.cap.max_send_wr = ia.cap.max_recv_wr = 16;
  ia.cap.max_send_sge = ia.cap.max_recv_sge = 1;
  return (qp = ibv_create_qp(pd, &ia)) &&
         qp_to_init(qp, IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC) == 0;
}

void RcEnd::close() {
  if (qp) ibv_destroy_qp(qp);
  if (cq) ibv_destroy_cq(cq);
  if (pd) ibv_dealloc_pd(pd);
  if (ctx) ibv_close_device(ctx);
  qp = nullptr, cq = nullptr, pd = nullptr, ctx = nullptr;
}

int RcEnd::post(ibv_wr_opcode op, void* local, uint32_t len, uint32_t lkey, uint64_t raddr, uint32_t rkey) {
  ibv_sge sge{reinterpret_cast<uintptr_t>(local), len, lkey};
  ibv_send_wr wr{}, *bad = nullptr;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = op;
  wr.send_flags = IBV_SEND_SIGNALED;
  if (op == IBV_WR_ATOMIC_FETCH_AND_ADD) {
    wr.wr.atomic.remote_addr = raddr;
    wr.wr.atomic.rkey = rkey;
    wr.wr.atomic.compare_add = 1;
  } else {
    wr.wr.rdma.remote_addr = raddr;
    wr.wr.rdma.rkey = rkey;
  }
  if (ibv_post_send(qp, &wr, &bad)) return -1;
  for (int spins = 0; spins < 50'000'000; ++spins) {
    ibv_wc wc{};
    const int n = ibv_poll_cq(cq, 1, &wc);
    if (n < 0) return -1;
    if (n == 1) return wc.status;
  }
  return -1;
}

RawConn::RawConn(const std::string& socket_path) { sv::connect_seqpacket(socket_path, sock_); }

int RawConn::send_raw(const void* msg, size_t len, std::span<const int> fds, std::vector<sv::Fd>* got, void* reply,
                      size_t reply_len) {
  if (sv::send_message(sock_.get(), msg, len, fds) != 0) return -1;
  uint8_t buf[sv::proto::kMaxMessage];
  for (;;) {
    size_t n = 0;
    std::vector<sv::Fd> fdv;
    if (sv::recv_message(sock_.get(), buf, sizeof(buf), &n, fdv) != 0 || n < sizeof(sv::proto::Header)) return -1;
    sv::proto::Header h;
    std::memcpy(&h, buf, sizeof(h));
    if (h.seq == 0 && h.op == uint16_t(sv::proto::Op::AsyncEvent)) continue;  // unsolicited
    if (h.seq == 0 && h.op == uint16_t(sv::proto::Op::Refused)) return -1;    // why, then the daemon hangs up
    if (got) *got = std::move(fdv);
    if (reply) std::memcpy(reply, buf, std::min(n, reply_len));
    return h.status;
  }
}


// Two RC QPs of one raw connection pointed at each other, and one MR of
// `len` bytes on a memfd that both use: what a hostile client needs to make
// the daemon copy with a Mediate request (it carries out any connected
// pair's operations). The MR covers [mr_offset, mr_offset + len) of a backing
// that has `tail` more bytes after it. Fills `req` with an RDMA WRITE of the
// whole MR onto itself (the backing's descriptor in *memfd if asked).
bool raw_mediated_pair(RawConn& raw, uint64_t len, sv::proto::MediateReq& req, sv::Fd* memfd, uint64_t mr_offset,
                       uint64_t tail, uint32_t* mr_handle, uint32_t extra_access) {
  using sv::proto::Op;
  sv::proto::Empty hello{};
  sv::proto::HelloReply hrep{};
  std::vector<sv::Fd> fds;
  if (raw.call(Op::Hello, hello, hrep, {}, &fds) != 0) return false;
  int mfd = sealed_backing(mr_offset + len + tail);
  if (mfd < 0) return false;
  sv::proto::Empty rb{};
  sv::proto::HandleReply backing{};
  const int bfd[1] = {mfd};
  int st = raw.call(Op::RegBacking, rb, backing, bfd);
  if (memfd) memfd->reset(dup(mfd));
  close(mfd);
  if (st != 0) return false;
  sv::proto::Empty e{};
  sv::proto::HandleReply pd{};
  if (raw.call(Op::AllocPd, e, pd) != 0) return false;
  sv::proto::RegMrReq mr{};
  mr.pd = pd.handle;
  mr.backing = backing.handle;
  mr.addr = mr_offset;
  mr.iova = mr_offset;
  mr.length = len;
  mr.access =
      IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC | extra_access;
  sv::proto::RegMrReply mrep{};
  if (raw.call(Op::RegMr, mr, mrep) != 0) return false;
  if (mr_handle) *mr_handle = mrep.handle;
  sv::proto::CreateCqReq cq{};
  cq.cqe = 16;
  sv::proto::CreateCqReply cqrep{};
  if (raw.call(Op::CreateCq, cq, cqrep, {}, &fds) != 0) return false;
  uint32_t qpn[2];
  for (uint32_t& n : qpn) {
    sv::proto::CreateQpReq q{};
    q.pd = pd.handle;
    q.send_cq = q.recv_cq = cqrep.handle;
    q.qp_type = IBV_QPT_RC;
    q.max_send_wr = q.max_recv_wr = 16;
    q.max_send_sge = q.max_recv_sge = 1;
    sv::proto::CreateQpReply qrep{};
    if (raw.call(Op::CreateQp, q, qrep, {}, &fds) != 0) return false;
    n = qrep.qpn;
  }
  for (int i = 0; i < 2; ++i) {
    sv::proto::ModifyQpReq m{};
    m.qpn = qpn[i];
    m.attr_mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
    m.qp_state = IBV_QPS_INIT;
    m.port_num = 1;
    m.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC | extra_access;
    if (raw.call(Op::ModifyQp, m) != 0) return false;
    sv::proto::ModifyQpReq r{};
    r.qpn = qpn[i];
    r.attr_mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                  IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
    r.qp_state = IBV_QPS_RTR;
    r.path_mtu = IBV_MTU_1024;
    r.dest_qp_num = qpn[1 - i];
    r.ah_port_num = 1;
    if (raw.call(Op::ModifyQp, r) != 0) return false;
  }
  req = {};
  req.qpn = qpn[0];
  req.opcode = IBV_WR_RDMA_WRITE;
  req.num_sge = 1;
  req.sge[0].addr = mr_offset;
  req.sge[0].length = uint32_t(len);
  req.sge[0].lkey = mrep.key;
  req.remote_addr = mr_offset;
  req.rkey = mrep.key;
  return true;
}

bool raw_hello(RawConn& raw) {
  sv::proto::Empty e{};
  sv::proto::HelloReply rep{};
  std::vector<sv::Fd> fds;
  return raw.call(sv::proto::Op::Hello, e, rep, {}, &fds) == 0;
}

long cpu_ticks_of(pid_t pid) {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/stat", int(pid));
  FILE* f = std::fopen(path, "r");
  if (!f) return -1;
  char buf[1024];
  const size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  buf[n] = 0;
  // After the command's closing parenthesis: state (field 3) ... utime (14), stime (15).
  const char* p = std::strrchr(buf, ')');
  unsigned long utime = 0, stime = 0;
  if (!p || std::sscanf(p + 1, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &utime, &stime) != 2) return -1;
  return long(utime + stime);
}

}  // namespace svsec
