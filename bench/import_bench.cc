// import_bench: what sharing costs per call, between two processes.
//
// The owner (parent) creates a context with a PD, an MR, a CQ and a QP and
// hands them to the importer (child) with svx_pack.  The importer then times,
// per call (median and mean of --iters calls):
//   import_device   ibv_import_device(cmd_fd) + ibv_close_device
//   import_pd       ibv_import_pd + ibv_unimport_pd
//   import_mr       ibv_import_mr + ibv_unimport_mr
//   import_cq       svx_import_cq + svx_unimport_cq
//   import_qp       svx_import_qp + svx_unimport_qp
//   pack_unpack     svx_pack of the 4 objects + svx_unpack of them (one
//                   process, a socketpair), then ibv_close_device of the
//                   unpacked context (timed apart as unpacked_close)
//   open            svx_open of a published MR + ibv_close_device
//   unix_rt         the baseline: one raw round trip of a 64-byte message
//                   over an AF_UNIX SOCK_SEQPACKET socketpair (the daemon's
//                   socket type) between two processes, blocking read and
//                   write on both sides: what any control round trip costs
//                   at least (issue 24: a daemon call at most 2x this;
//                   ibv_import_pd is one daemon call, its unimport local)
// and the owner times svx_publish and svx_unpublish of --iters names.
// Every call goes to the daemon, so these numbers are daemon round trips.
// Output: JSON lines on stdout.  Needs softverbs' libibverbs (the svx_ calls).
#include <infiniband/verbs.h>
#include <softverbs/softverbs.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench_common.h"

namespace {

[[noreturn]] void die(const char *what) {
  std::fprintf(stderr, "import_bench: %s failed: %s\n", what, std::strerror(errno));
  std::fflush(stderr);
  _exit(1);
}

// Per-call timings of one operation.
struct Timer {
  std::vector<double> ns;
  uint64_t t0 = 0;
  void start() { t0 = bench::now_ns_steady(); }
  void stop() { ns.push_back(static_cast<double>(bench::now_ns_steady() - t0)); }
  void emit(const char *test) const {
    double sum = 0;
    for (double v : ns) sum += v;
    bench::JsonLine()
        .str("bench", "import")
        .str("test", test)
        .num("calls", static_cast<uint64_t>(ns.size()))
        .real("median_ns", bench::median_of(ns))
        .real("mean_ns", ns.empty() ? 0 : sum / static_cast<double>(ns.size()))
        .emit();
  }
};

std::string name_of(int i) { return "/svbench-" + std::to_string(getppid()) + "/mr" + std::to_string(i); }

void xfer(int fd, void *p, size_t n, bool out) {
  if ((out ? write(fd, p, n) : read(fd, p, n)) != static_cast<ssize_t>(n)) die("socket");
}

int importer(int sock, int iters) {
  ibv_context *c = nullptr;
  svx_object o[4]{};
  int n = 0;
  if (int e = svx_unpack(sock, &c, o, 4, &n); e || n != 4) {
    errno = e ? e : EPROTO;
    die("svx_unpack");
  }
  ibv_pd *pd = o[0].pd;
  ibv_mr *mr = o[1].mr;
  ibv_cq *cq = o[2].cq;
  ibv_qp *qp = o[3].qp;
  Timer t;
  for (int i = 0; i < iters; ++i) {
    t.start();
    ibv_context *c2 = ibv_import_device(c->cmd_fd);
    if (!c2) die("ibv_import_device");
    if (ibv_close_device(c2)) die("ibv_close_device");
    t.stop();
  }
  t.emit("import_device");
  t = {};
  for (int i = 0; i < iters; ++i) {
    t.start();
    ibv_pd *p = ibv_import_pd(c, pd->handle);
    if (!p) die("ibv_import_pd");
    ibv_unimport_pd(p);
    t.stop();
  }
  t.emit("import_pd");
  t = {};
  for (int i = 0; i < iters; ++i) {
    t.start();
    ibv_mr *m = ibv_import_mr(pd, mr->handle);
    if (!m) die("ibv_import_mr");
    ibv_unimport_mr(m);
    t.stop();
  }
  t.emit("import_mr");
  t = {};
  for (int i = 0; i < iters; ++i) {
    t.start();
    ibv_cq *q = svx_import_cq(c, cq->handle);
    if (!q) die("svx_import_cq");
    svx_unimport_cq(q);
    t.stop();
  }
  t.emit("import_cq");
  t = {};
  for (int i = 0; i < iters; ++i) {
    t.start();
    ibv_qp *q = svx_import_qp(c, qp->qp_num);
    if (!q) die("svx_import_qp");
    svx_unimport_qp(q);
    t.stop();
  }
  t.emit("import_qp");

  int sp[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp)) die("socketpair");
  Timer closing;
  t = {};
  for (int i = 0; i < iters; ++i) {
    t.start();
    if (int e = svx_pack(sp[0], c, o, 4)) {
      errno = e;
      die("svx_pack");
    }
    ibv_context *c3 = nullptr;
    svx_object o3[4]{};
    int n3 = 0;
    if (int e = svx_unpack(sp[1], &c3, o3, 4, &n3); e || n3 != 4) {
      errno = e ? e : EPROTO;
      die("svx_unpack (round trip)");
    }
    t.stop();
    closing.start();
    if (ibv_close_device(c3)) die("ibv_close_device (unpacked)");
    closing.stop();
  }
  t.emit("pack_unpack");
  closing.emit("unpacked_close");
  close(sp[0]);
  close(sp[1]);

  char go = 0;
  xfer(sock, &go, 1, false);  // the owner has published the names
  t = {};
  for (int i = 0; i < iters; ++i) {
    svx_object ob{};
    t.start();
    ibv_context *c4 = svx_open(name_of(i).c_str(), SVX_OPEN_READ | SVX_OPEN_WRITE, &ob);
    if (!c4 || ob.type != SVX_OBJ_MR) die("svx_open");
    if (ibv_close_device(c4)) die("ibv_close_device (opened)");
    t.stop();
  }
  t.emit("open");
  xfer(sock, &go, 1, true);
  if (ibv_close_device(c)) die("ibv_close_device");
  return 0;
}

// The raw round trip baseline (unix_rt): a child echoes what it reads.
void unix_round_trip(int iters) {
  int sp[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sp)) die("socketpair (seqpacket)");
  pid_t echo = fork();
  if (echo < 0) die("fork (echo)");
  char msg[64]{};
  if (echo == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    close(sp[0]);
    for (ssize_t n; (n = read(sp[1], msg, sizeof msg)) > 0;)
      if (write(sp[1], msg, static_cast<size_t>(n)) != n) _exit(1);
    _exit(0);
  }
  close(sp[1]);
  Timer t;
  for (int i = 0; i < iters + iters / 10; ++i) {  // the first tenth warms up, untimed
    if (i >= iters / 10) t.start();
    xfer(sp[0], msg, sizeof msg, true);
    xfer(sp[0], msg, sizeof msg, false);
    if (i >= iters / 10) t.stop();
  }
  close(sp[0]);
  waitpid(echo, nullptr, 0);
  t.emit("unix_rt");
}

}  // namespace

int main(int argc, char **argv) {
  int iters = argc > 1 ? std::atoi(argv[1]) : 200;
  if (iters < 1 || iters > 100000) {
    std::fprintf(stderr, "usage: import_bench [ITERS (default 200)]\n");
    return 2;
  }
  alarm(120);  // watchdog: the default action ends the process
  unix_round_trip(iters);
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv)) die("socketpair");
  std::fflush(stdout);
  pid_t pid = fork();
  if (pid < 0) die("fork");
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    close(sv[0]);
    int rc = importer(sv[1], iters);
    std::fflush(stdout);
    _exit(rc);
  }
  close(sv[1]);
  int nd = 0;
  ibv_device **l = ibv_get_device_list(&nd);
  if (!l || !nd) die("ibv_get_device_list (is softverbs on LD_LIBRARY_PATH?)");
  ibv_context *ctx = ibv_open_device(l[0]);
  ibv_free_device_list(l);
  if (!ctx) die("ibv_open_device");
  static char buf[4096];
  ibv_pd *pd = ibv_alloc_pd(ctx);
  ibv_mr *mr = pd ? ibv_reg_mr(pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE) : nullptr;
  ibv_cq *cq = ibv_create_cq(ctx, 16, nullptr, nullptr, 0);
  if (!mr || !cq) die("setup");
  ibv_qp_init_attr ia{};
  ia.send_cq = ia.recv_cq = cq;
  ia.qp_type = IBV_QPT_RC;
  ia.cap = {16, 16, 1, 1, 0};
  ibv_qp *qp = ibv_create_qp(pd, &ia);
  if (!qp) die("ibv_create_qp");
  svx_object o[4]{};
  o[0].type = SVX_OBJ_PD;
  o[0].pd = pd;
  o[1].type = SVX_OBJ_MR;
  o[1].mr = mr;
  o[2].type = SVX_OBJ_CQ;
  o[2].cq = cq;
  o[3].type = SVX_OBJ_QP;
  o[3].qp = qp;
  if (int e = svx_pack(sv[0], ctx, o, 4)) {
    errno = e;
    die("svx_pack");
  }
  Timer pub, unpub;
  for (int i = 0; i < iters; ++i) {
    // name_of() uses getppid() in the importer: here that is our own pid.
    std::string name = "/svbench-" + std::to_string(getpid()) + "/mr" + std::to_string(i);
    pub.start();
    if (int e = svx_publish(ctx, name.c_str(), &o[1], 0600, -1)) {
      errno = e;
      die("svx_publish");
    }
    pub.stop();
  }
  char go = 1;
  xfer(sv[0], &go, 1, true);
  xfer(sv[0], &go, 1, false);  // the importer has opened them all
  for (int i = 0; i < iters; ++i) {
    std::string name = "/svbench-" + std::to_string(getpid()) + "/mr" + std::to_string(i);
    unpub.start();
    if (int e = svx_unpublish(ctx, name.c_str())) {
      errno = e;
      die("svx_unpublish");
    }
    unpub.stop();
  }
  int st = 0;
  if (waitpid(pid, &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
    std::fprintf(stderr, "import_bench: importer failed\n");
    return 1;
  }
  pub.emit("publish");
  unpub.emit("unpublish");
  ibv_destroy_qp(qp);
  ibv_destroy_cq(cq);
  ibv_dereg_mr(mr);
  ibv_dealloc_pd(pd);
  ibv_close_device(ctx);
  return 0;
}
