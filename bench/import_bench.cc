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
//                   at least (the goal: a daemon call at most 2x this;
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

// Times iters calls of f, one per call, and emits them as `test`.
template <class F>
void time_calls(const char *test, int iters, F &&f) {
  Timer t;
  for (int i = 0; i < iters; ++i) {
    t.start();
    f(i);
    t.stop();
  }
  t.emit(test);
}

// Import and unimport of each object the owner packed (pd, mr, cq, qp).
void time_imports(ibv_context *c, const svx_object (&o)[4], int iters) {
  time_calls("import_device", iters, [&](int) {
    ibv_context *c2 = ibv_import_device(c->cmd_fd);
    if (!c2) die("ibv_import_device");
    if (ibv_close_device(c2)) die("ibv_close_device");
  });
  time_calls("import_pd", iters, [&](int) {
    ibv_pd *p = ibv_import_pd(c, o[0].pd->handle);
    if (!p) die("ibv_import_pd");
    ibv_unimport_pd(p);
  });
  time_calls("import_mr", iters, [&](int) {
    ibv_mr *m = ibv_import_mr(o[0].pd, o[1].mr->handle);
    if (!m) die("ibv_import_mr");
    ibv_unimport_mr(m);
  });
  time_calls("import_cq", iters, [&](int) {
    ibv_cq *q = svx_import_cq(c, o[2].cq->handle);
    if (!q) die("svx_import_cq");
    svx_unimport_cq(q);
  });
  time_calls("import_qp", iters, [&](int) {
    ibv_qp *q = svx_import_qp(c, o[3].qp->qp_num);
    if (!q) die("svx_import_qp");
    svx_unimport_qp(q);
  });
}

// svx_pack and svx_unpack of the 4 objects within this process, then the
// close of the unpacked context, timed apart.
void time_pack_unpack(ibv_context *c, svx_object (&o)[4], int iters) {
  int sp[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp)) die("socketpair");
  Timer t, closing;
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
}

// The importer (child): unpacks what the owner sent on sock, then times
// the imports, pack/unpack and, once the owner has published them, the
// svx_open of its names.
int importer(int sock, int iters) {
  ibv_context *c = nullptr;
  svx_object o[4]{};
  int n = 0;
  if (int e = svx_unpack(sock, &c, o, 4, &n); e || n != 4) {
    errno = e ? e : EPROTO;
    die("svx_unpack");
  }
  time_imports(c, o, iters);
  time_pack_unpack(c, o, iters);
  char go = 0;
  xfer(sock, &go, 1, false);  // the owner has published the names
  time_calls("open", iters, [&](int i) {
    svx_object ob{};
    ibv_context *c4 = svx_open(name_of(i).c_str(), SVX_OPEN_READ | SVX_OPEN_WRITE, &ob);
    if (!c4 || ob.type != SVX_OBJ_MR) die("svx_open");
    if (ibv_close_device(c4)) die("ibv_close_device (opened)");
  });
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

// The owner's context and the objects it shares: a PD, an MR, a CQ and an
// RC QP, in that order.
struct Owned {
  ibv_context *ctx = nullptr;
  svx_object o[4]{};
};

Owned owner_setup() {
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
  Owned own;
  own.ctx = ctx;
  own.o[0].type = SVX_OBJ_PD;
  own.o[0].pd = pd;
  own.o[1].type = SVX_OBJ_MR;
  own.o[1].mr = mr;
  own.o[2].type = SVX_OBJ_CQ;
  own.o[2].cq = cq;
  own.o[3].type = SVX_OBJ_QP;
  own.o[3].qp = qp;
  return own;
}

// Publishes iters names of the MR (timed in pub), lets the importer open
// them (over sock), then unpublishes them (timed in unpub).
void publish_for_importer(ibv_context *ctx, svx_object &mr, int sock, int iters, Timer &pub, Timer &unpub) {
  for (int i = 0; i < iters; ++i) {
    // name_of() uses getppid() in the importer: here that is our own pid.
    std::string name = "/svbench-" + std::to_string(getpid()) + "/mr" + std::to_string(i);
    pub.start();
    if (int e = svx_publish(ctx, name.c_str(), &mr, 0600, -1)) {
      errno = e;
      die("svx_publish");
    }
    pub.stop();
  }
  char go = 1;
  xfer(sock, &go, 1, true);
  xfer(sock, &go, 1, false);  // the importer has opened them all
  for (int i = 0; i < iters; ++i) {
    std::string name = "/svbench-" + std::to_string(getpid()) + "/mr" + std::to_string(i);
    unpub.start();
    if (int e = svx_unpublish(ctx, name.c_str())) {
      errno = e;
      die("svx_unpublish");
    }
    unpub.stop();
  }
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
  Owned own = owner_setup();
  ibv_context *ctx = own.ctx;
  svx_object (&o)[4] = own.o;
  if (int e = svx_pack(sv[0], ctx, o, 4)) {
    errno = e;
    die("svx_pack");
  }
  Timer pub, unpub;
  publish_for_importer(ctx, o[1], sv[0], iters, pub, unpub);
  int st = 0;
  if (waitpid(pid, &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
    std::fprintf(stderr, "import_bench: importer failed\n");
    return 1;
  }
  pub.emit("publish");
  unpub.emit("unpublish");
  ibv_destroy_qp(o[3].qp);
  ibv_destroy_cq(o[2].cq);
  ibv_dereg_mr(o[1].mr);
  ibv_dealloc_pd(o[0].pd);
  ibv_close_device(ctx);
  return 0;
}
