// verbs_bench: RDMA WRITE, RDMA READ and SEND/RECV latency and bandwidth over
// one RC QP pair, using only the public libibverbs API.  The program forks: the child
// is the server, the parent the client; both open the first (or --dev) device,
// exchange {qpn, psn, lid, gid, addr, rkey, mtu} over a socketpair created
// before fork() and connect their QPs (INIT -> RTR -> RTS).
//
//  write_lat: ping-pong of RDMA WRITEs like perftest's ib_write_lat: each side
//             writes into the peer's buffer and busy-polls the last byte of its
//             own buffer for the iteration tag.  Reports one-way (RTT/2).
//  write_bw:  the client keeps a window of WRITEs in flight (signalled every
//             `chunk` WRs) for >= --time seconds per size; reports GB/s.
//  send_lat:  SEND/RECV ping-pong, completion detected by polling the recv CQ.
//  read_lat:  the client RDMA-READs from the server's buffer, one at a time,
//             and polls its CQ for the completion.  A READ is a round trip by
//             nature, so this reports the whole round trip, not half.
//  read_bw:   like write_bw with RDMA READs (up to the device's max_qp_rd_atom
//             outstanding on the wire).
//  send_bw:   like write_bw with SENDs; the server keeps receives posted and
//             polls its receive CQ; the client stops the server by telling it
//             over the socket how many messages it sent.
//
// Latency tests scale the iteration count down for large sizes (--lat-bytes),
// so that 4 MiB ping-pongs do not take minutes.
//
// Output: one JSON object per line on stdout (client only); errors on stderr.
//
// This file: the options and the two processes; the QP pair is set up in
// verbs_bench_rdma.cc, the tests are in verbs_bench_tests.cc.
#include <grp.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "verbs_bench.h"

using namespace verbs_bench;

namespace {

// The client learns about a failed server through SIGCHLD, even while it
// busy-polls memory that the dead server would have written.
volatile sig_atomic_t g_child_pid = 0;
volatile sig_atomic_t g_child_done = 0;
volatile sig_atomic_t g_child_status = 0;

void on_sigchld(int) {
  int saved = errno;
  int st = 0;
  pid_t p = waitpid(static_cast<pid_t>(g_child_pid), &st, WNOHANG);
  if (p > 0) {
    g_child_status = st;
    g_child_done = 1;
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
      static const char msg[] = "verbs_bench client: server process failed; aborting\n";
      ssize_t r = write(2, msg, sizeof msg - 1);
      (void)r;
      _exit(1);
    }
  }
  errno = saved;
}

void on_alarm(int) {
  static const char msg[] = "verbs_bench: watchdog timeout (peer hung or device too slow)\n";
  ssize_t r = write(2, msg, sizeof msg - 1);
  (void)r;
  _exit(3);
}

int run_role(const Options &o, bool client, int sock) {
  g_role = client ? "client" : "server";
  srand48(getpid() * 7919L + (client ? 1 : 2));
  if (o.pin) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(client ? 0 : 1, &set);
    if (sched_setaffinity(0, sizeof set, &set)) std::perror("sched_setaffinity");
  }
  uint64_t max_size = 64;
  for (Test t : o.tests)
    max_size = std::max(max_size, bench::max_of(is_bw(t) ? o.bw_sizes : o.lat_sizes));

  Rdma r;
  r.sock = sock;
  setup(r, o, max_size);
  if (client)
    bench::JsonLine()
        .str("bench", "verbs")
        .str("test", "info")
        .str("device", r.dev)
        .num("mtu", mtu_bytes(r.local.mtu))
        .num("max_inline", r.max_inline)
        .num("sq_depth", r.sq_depth)
        .str("link_layer", r.port.link_layer == IBV_LINK_LAYER_ETHERNET ? "ethernet"
                           : r.port.link_layer == IBV_LINK_LAYER_INFINIBAND ? "infiniband"
                                                                           : "unspecified")
        .emit();

  for (Test t : o.tests) {
    const auto &sizes = is_bw(t) ? o.bw_sizes : o.lat_sizes;
    for (uint64_t size : sizes) {
      vlog("%s %llu B: start", test_name(t), static_cast<unsigned long long>(size));
      switch (t) {
        case Test::WriteLat: write_lat(r, o, client, size); break;
        case Test::WriteBw: write_bw(r, o, client, size); break;
        case Test::SendLat: send_lat(r, o, client, size); break;
        case Test::Verify: verify(r, client, size); break;
        case Test::ReadLat: read_lat(r, o, client, size); break;
        case Test::ReadBw: write_bw(r, o, client, size, Test::ReadBw); break;
        case Test::SendBw: send_bw(r, o, client, size); break;
      }
    }
  }
  barrier(sock);
  vlog("tests done, tearing down");
  teardown(r);
  vlog("done");
  return 0;
}

void usage() {
  std::fprintf(stderr,
               "usage: verbs_bench [options]\n"
               "  --test LIST       write_lat,write_bw,send_lat,read_lat,read_bw,send_bw,verify\n"
               "                    (aliases lat,bw,send; all = every test but verify;\n"
               "                    verify checks that WRITE data arrives intact, for each bw size)\n"
               "  --sizes LIST      sizes for all tests, e.g. 8-4M (powers of 2) or 8,64K,1M\n"
               "  --lat-sizes LIST  sizes for latency tests (default 8)\n"
               "  --bw-sizes LIST   sizes for the bandwidth tests (default 8-4M)\n"
               "  --iters N         latency iterations (default 100000)\n"
               "  --lat-bytes SIZE  latency: at most SIZE bytes per message size (default 1G),\n"
               "                    i.e. fewer iterations for large messages\n"
               "  --min-iters N     latency: but at least N iterations (default 100)\n"
               "  --warmup N        latency warm-up iterations (default 2000)\n"
               "  --time SEC        write_bw seconds per size (default 0.2)\n"
               "  --window N        write_bw WRs in flight (default 64)\n"
               "  --signal-every N  write_bw signal period (default window/4)\n"
               "  --cq-mod N        latency tests: signal every Nth WR (default 64)\n"
               "  --inline N        requested max_inline_data (default 64)\n"
               "  --dev NAME --ib-port N --gid-idx N --mtu BYTES\n"
               "  --pin             pin client to CPU 0, server to CPU 1\n"
               "  --td              create the QP in a parent domain with a thread domain\n"
               "                    (ibv_alloc_td: one thread per QP, the provider may skip locks)\n"
               "  --server-uid UID  the server process runs as UID (gid UID, no groups): with a\n"
               "                    system daemon (SOFTVERBS_SYSTEM=1), the path between users\n"
               "  --timeout SEC     watchdog (default 300)\n"
               "  -v, --verbose     log setup and test progress to stderr\n");
}

bool parse_tests(const std::string &v, std::vector<Test> &out) {
  out.clear();
  size_t pos = 0;
  while (pos <= v.size()) {
    size_t c = v.find(',', pos);
    if (c == std::string::npos) c = v.size();
    std::string t = v.substr(pos, c - pos);
    if (t == "all") {
      out = {Test::WriteLat, Test::WriteBw, Test::SendLat, Test::ReadLat, Test::ReadBw, Test::SendBw};
    } else if (t == "write_lat" || t == "lat") {
      out.push_back(Test::WriteLat);
    } else if (t == "write_bw" || t == "bw") {
      out.push_back(Test::WriteBw);
    } else if (t == "send_lat" || t == "send") {
      out.push_back(Test::SendLat);
    } else if (t == "verify") {
      out.push_back(Test::Verify);
    } else if (t == "read_lat") {
      out.push_back(Test::ReadLat);
    } else if (t == "read_bw") {
      out.push_back(Test::ReadBw);
    } else if (t == "send_bw") {
      out.push_back(Test::SendBw);
    } else if (!t.empty()) {
      return false;
    }
    pos = c + 1;
  }
  return !out.empty();
}

// The options that name sizes or tests: true if a.cur() is one of them;
// then `bad` says whether its value was refused (said on stderr).
bool take_list_option(bench::Args &a, Options &o, bool &bad) {
  std::string v;
  const char *name = nullptr;
  bool ok = true;
  if (a.take(name = "--test", v)) {
    ok = parse_tests(v, o.tests);
  } else if (a.take(name = "--sizes", v)) {
    ok = bench::parse_size_list(v, o.bw_sizes) && bench::parse_size_list(v, o.lat_sizes);
  } else if (a.take(name = "--lat-sizes", v)) {
    ok = bench::parse_size_list(v, o.lat_sizes);
  } else if (a.take(name = "--bw-sizes", v)) {
    ok = bench::parse_size_list(v, o.bw_sizes);
  } else if (a.take(name = "--lat-bytes", v)) {
    ok = bench::parse_size(v, o.lat_bytes);
  } else {
    return false;
  }
  bad = !ok;
  if (bad) std::fprintf(stderr, "bad %s '%s'\n", name, v.c_str());
  return true;
}

// The numeric options and flags: true if a.cur() is one of them.
bool take_scalar_option(bench::Args &a, Options &o) {
  std::string v;
  if (a.take("--iters", v)) {
    o.iters = bench::to_u64(v, "--iters");
  } else if (a.take("--min-iters", v)) {
    o.min_iters = std::max<uint64_t>(1, bench::to_u64(v, "--min-iters"));
  } else if (a.take("--warmup", v)) {
    o.warmup = bench::to_u64(v, "--warmup");
  } else if (a.take("--time", v)) {
    o.seconds = bench::to_double(v, "--time");
  } else if (a.take("--window", v)) {
    o.window = static_cast<unsigned>(bench::to_u64(v, "--window"));
  } else if (a.take("--signal-every", v)) {
    o.chunk = static_cast<unsigned>(bench::to_u64(v, "--signal-every"));
  } else if (a.take("--cq-mod", v)) {
    o.cq_mod = static_cast<unsigned>(bench::to_u64(v, "--cq-mod"));
  } else if (a.take("--inline", v)) {
    o.inline_req = static_cast<unsigned>(bench::to_u64(v, "--inline"));
  } else if (a.take("--dev", v)) {
    o.dev_name = v;
  } else if (a.take("--ib-port", v)) {
    o.ib_port = static_cast<int>(bench::to_u64(v, "--ib-port"));
  } else if (a.take("--gid-idx", v)) {
    o.gid_idx = static_cast<int>(bench::to_u64(v, "--gid-idx"));
  } else if (a.take("--mtu", v)) {
    o.mtu = static_cast<int>(bench::to_u64(v, "--mtu"));
    mtu_enum(o.mtu);
  } else if (a.take("--timeout", v)) {
    o.timeout = static_cast<unsigned>(bench::to_u64(v, "--timeout"));
  } else if (a.take("--server-uid", v)) {
    o.server_uid = static_cast<long>(bench::to_u64(v, "--server-uid"));
  } else if (a.flag("--pin")) {
    o.pin = true;
  } else if (a.flag("--td")) {
    o.td = true;
  } else if (a.flag("-v") || a.flag("--verbose")) {
    g_verbose = true;
  } else {
    return false;
  }
  return true;
}

// Reads the command line into o: -1 to go on, else the exit status (usage
// asked for, or an error said on stderr).
int parse_args(int argc, char **argv, Options &o) {
  bench::parse_size_list("8-4M", o.bw_sizes);
  bench::Args a(argc, argv);
  for (; a.valid(); a.next()) {
    bool bad = false;
    if (a.flag("-h") || a.flag("--help")) {
      usage();
      return 0;
    } else if (take_list_option(a, o, bad)) {
      if (bad) return 2;
    } else if (!take_scalar_option(a, o)) {
      std::fprintf(stderr, "unknown argument '%s'\n", a.cur());
      usage();
      return 2;
    }
  }
  if (o.iters == 0 || o.window == 0) {
    std::fprintf(stderr, "--iters and --window must be > 0\n");
    return 2;
  }
  for (uint64_t s : o.bw_sizes)
    if (s > (1u << 30)) die("size %llu too large", static_cast<unsigned long long>(s));
  for (uint64_t s : o.lat_sizes)
    if (s > (1u << 30)) die("size %llu too large", static_cast<unsigned long long>(s));
  return -1;
}

// The server: the child of the fork, as --server-uid if given.
[[noreturn]] void run_server(const Options &o, int sock) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (o.server_uid >= 0) {
    const gid_t g = static_cast<gid_t>(o.server_uid);
    const uid_t u = static_cast<uid_t>(o.server_uid);
    if (setgroups(0, nullptr) || setresgid(g, g, g) || setresuid(u, u, u))
      die("--server-uid %ld: %s (run as root)", o.server_uid, std::strerror(errno));
    prctl(PR_SET_PDEATHSIG, SIGKILL);  // cleared by the change of credentials
  }
  if (o.timeout) alarm(o.timeout);
  run_role(o, false, sock);
  std::fflush(stdout);
  _exit(0);
}

// Waits for the server (child pid) to end; dies unless it succeeded.
void wait_server(pid_t pid) {
  int status = 0;
  if (waitpid(pid, &status, 0) < 0) {
    if (errno != ECHILD || !g_child_done) die("waitpid: %s", std::strerror(errno));
    status = g_child_status;
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    if (WIFSIGNALED(status))
      die("server process killed by signal %d", WTERMSIG(status));
    die("server process failed (exit %d)", WEXITSTATUS(status));
  }
}

}  // namespace

int main(int argc, char **argv) {
  Options o;
  if (int rc = parse_args(argc, argv, o); rc >= 0) return rc;
  bench::ticks_per_ns();  // calibrate once, before fork
  signal(SIGALRM, on_alarm);
  signal(SIGPIPE, SIG_IGN);

  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv)) die("socketpair: %s", std::strerror(errno));
  std::fflush(stdout);
  pid_t pid = fork();
  if (pid < 0) die("fork: %s", std::strerror(errno));
  if (pid == 0) {
    close(sv[0]);
    run_server(o, sv[1]);
  }
  close(sv[1]);
  g_child_pid = pid;
  {
    struct sigaction sa {};
    sa.sa_handler = on_sigchld;
    sa.sa_flags = SA_RESTART | SA_NOCLDSTOP;
    sigaction(SIGCHLD, &sa, nullptr);
  }
  // The child may have died before the handler was installed.
  if (!g_child_done) raise(SIGCHLD);
  if (o.timeout) alarm(o.timeout);
  int rc = run_role(o, true, sv[0]);
  close(sv[0]);
  wait_server(pid);
  return rc;
}
