// Fault plans (docs/LAB.md, "Faults"): completions in error at a chosen
// operation or at a rate, on the shared-memory path, with the QP then in
// ERR and later requests flushed; a bad plan refused with its reason; the
// same seed replaying the same completions and the same fault log. The
// library reads the plan once, at load: each case runs a scripted workload
// in a fresh process (`--child`) with the plan in its environment.
#include <gtest/gtest.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <string.h>
#include <unistd.h>

#include <fstream>
#include <cctype>
#include <sstream>
#include <string>

#include "harness.h"

namespace svtest {
namespace {

// The workload: `pairs` RC QP pairs of this process (shared memory), each
// carrying `ops` signaled requests in turn (RDMA WRITE, SEND), one at a
// time. Prints each requester completion and the requester QP's final state.
int workload(int pairs, int ops) {
  Side::Options o;
  o.max_wr = 128;
  for (int p = 0; p < pairs; ++p) {
    Side a, b;
    if (a.open(o) || b.open(o) || a.connect(b.qp->qp_num, o) || b.connect(a.qp->qp_num, o)) {
      std::fprintf(stderr, "setup failed: %s\n", strerror(errno));
      return 2;
    }
    for (int i = 0; i < ops; ++i) {
      ibv_sge rs{reinterpret_cast<uint64_t>(b.buf) + 4096, 64, b.mr->lkey};
      ibv_recv_wr rw{};
      rw.sg_list = &rs;
      rw.num_sge = 1;
      ibv_recv_wr* rbad = nullptr;
      if (ibv_post_recv(b.qp, &rw, &rbad)) return 3;
    }
    for (int i = 1; i <= ops; ++i) {
      ibv_sge s{reinterpret_cast<uint64_t>(a.buf), 64, a.mr->lkey};
      ibv_send_wr w{};
      w.wr_id = uint64_t(i);
      w.sg_list = &s;
      w.num_sge = 1;
      w.send_flags = IBV_SEND_SIGNALED;
      w.opcode = i % 2 ? IBV_WR_RDMA_WRITE : IBV_WR_SEND;
      w.wr.rdma.remote_addr = reinterpret_cast<uint64_t>(b.buf);
      w.wr.rdma.rkey = b.mr->rkey;
      ibv_send_wr* bad = nullptr;
      if (int e = ibv_post_send(a.qp, &w, &bad)) {
        std::printf("pair %d wr %d post error %d\n", p, i, e);
        continue;
      }
      auto wc = poll(a.cq, 1, 5000);
      if (wc.size() != 1) return 4;
      std::printf("pair %d wr %llu %s\n", p, (unsigned long long)wc[0].wr_id, ibv_wc_status_str(wc[0].status));
    }
    ibv_qp_attr at{};
    ibv_qp_init_attr init{};
    ibv_query_qp(a.qp, &at, IBV_QP_STATE, &init);
    ibv_qp_attr bt{};
    ibv_query_qp(b.qp, &bt, IBV_QP_STATE, &init);
    std::printf("pair %d requester %s responder %s\n", p, at.qp_state == IBV_QPS_ERR ? "ERR" : "not ERR",
                bt.qp_state == IBV_QPS_RTS ? "RTS" : "not RTS");
  }
  return 0;
}

struct ChildRun {
  int status;
  std::string out;
};

// Runs the workload in a fresh process with `env` (shell assignments).
ChildRun run_child(const std::string& env, int pairs, int ops) {
  std::string cmd = env + " /proc/" + std::to_string(getpid()) + "/exe --child " + std::to_string(pairs) + " " +
                    std::to_string(ops) + " 2>&1";
  ChildRun r{-1, ""};
  FILE* f = popen(cmd.c_str(), "r");
  if (!f) return r;
  char buf[512];
  while (fgets(buf, sizeof buf, f)) r.out += buf;
  int st = pclose(f);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

TEST(FaultPlan, OpNFailsWithEachStatusAndTheQpFlushesWhatFollows) {
  const std::pair<const char*, const char*> kinds[] = {
      {"RNR_RETRY_EXC_ERR", "RNR retry counter exceeded"},
      {"RETRY_EXC_ERR", "transport retry counter exceeded"},
      {"REM_ACCESS_ERR", "remote access error"},
      {"REM_OP_ERR", "remote operation error"},
      {"IBV_WC_LOC_PROT_ERR", "local protection error"},
  };
  for (auto [name, text] : kinds) {
    ChildRun r = run_child(std::string("SOFTVERBS_FAULTS='wc:op=3,status=") + name + "'", 1, 5);
    ASSERT_EQ(0, r.status) << r.out;
    std::string want = std::string("pair 0 wr 1 success\npair 0 wr 2 success\npair 0 wr 3 ") + text +
                       "\npair 0 wr 4 Work Request Flushed Error\npair 0 wr 5 Work Request Flushed Error\n"
                       "pair 0 requester ERR responder RTS\n";
    EXPECT_EQ(want, r.out) << name;
  }
}

TEST(FaultPlan, APlanForAnotherQpChangesNothing) {
  ChildRun r = run_child("SOFTVERBS_FAULTS='wc@qp=0xfffffe:op=1,status=REM_OP_ERR'", 1, 4);
  ASSERT_EQ(0, r.status) << r.out;
  EXPECT_EQ("pair 0 wr 1 success\npair 0 wr 2 success\npair 0 wr 3 success\npair 0 wr 4 success\n"
            "pair 0 requester not ERR responder RTS\n",
            r.out);
}

// A rule for one QP fails that QP only. The daemon of this test (its own)
// numbers QPs in order: a first run says which numbers the requesters got,
// and the second run's are the next ones.
TEST(FaultPlan, ARuleForOneQpFailsThatQpOnly) {
  char path[] = "/tmp/sv-faultlog-XXXXXX";
  ASSERT_NE(nullptr, mkdtemp(path));
  const std::string d = path;
  ChildRun first = run_child("SOFTVERBS_FAULTS='wc:op=1,status=REM_OP_ERR' SOFTVERBS_FAULTS_LOG=" + d + "/log", 2, 1);
  ASSERT_EQ(0, first.status) << first.out;
  unsigned q0 = 0, q1 = 0;
  ASSERT_EQ(2, std::sscanf(slurp(d + "/log").c_str(), "wc qp=0x%x op=1 %*s %*s %*s wc qp=0x%x", &q0, &q1)) << slurp(d + "/log");
  char plan[96];
  std::snprintf(plan, sizeof plan, "SOFTVERBS_FAULTS='wc@qp=0x%x:op=2,status=LOC_PROT_ERR'", q1 + (q1 - q0) * 2);
  ChildRun r = run_child(plan, 2, 3);
  ASSERT_EQ(0, r.status) << r.out;
  EXPECT_EQ("pair 0 wr 1 success\npair 0 wr 2 success\npair 0 wr 3 success\npair 0 requester not ERR responder RTS\n"
            "pair 1 wr 1 success\npair 1 wr 2 local protection error\npair 1 wr 3 Work Request Flushed Error\n"
            "pair 1 requester ERR responder RTS\n",
            r.out)
      << plan;
  std::system(("rm -rf " + d).c_str());
}

TEST(FaultPlan, ABadPlanIsRefusedWithItsReason) {
  ChildRun r = run_child("SOFTVERBS_FAULTS='wc:op=0,status=REM_OP_ERR'", 1, 1);
  EXPECT_NE(0, r.status);
  EXPECT_NE(std::string::npos, r.out.find("softverbs: SOFTVERBS_FAULTS: clause 1 'wc:op=0,status=REM_OP_ERR': bad value '0' for op"))
      << r.out;
  r = run_child("SOFTVERBS_FAULT_PLAN=/nonexistent/plan", 1, 1);
  EXPECT_NE(0, r.status);
  EXPECT_NE(std::string::npos, r.out.find("SOFTVERBS_FAULT_PLAN: cannot read /nonexistent/plan")) << r.out;
}

// Stripped of QP numbers, which the daemon hands out anew each run.
// The log without its "qp=0x... " fields (the QP numbers differ between runs).
std::string without_qpns(const std::string& log) {
  std::string out;
  for (size_t i = 0; i < log.size();) {
    if (log.compare(i, 5, "qp=0x") == 0) {
      size_t j = i + 5;
      while (j < log.size() && std::isxdigit(static_cast<unsigned char>(log[j]))) ++j;
      if (j > i + 5 && j < log.size() && log[j] == ' ') {
        i = j + 1;
        continue;
      }
    }
    out += log[i++];
  }
  return out;
}

TEST(FaultPlan, TheSameSeedReplaysTheSameCompletionsAndLog) {
  char dir[] = "/tmp/sv-faultlog-XXXXXX";
  ASSERT_NE(nullptr, mkdtemp(dir));
  const std::string d = dir;
  auto plan = [&](int seed, const std::string& log) {
    return "SOFTVERBS_FAULTS='seed=" + std::to_string(seed) + ";wc:rate=0.06,status=RETRY_EXC_ERR' SOFTVERBS_FAULTS_LOG=" + log;
  };
  ChildRun one = run_child(plan(11, d + "/1"), 6, 30);
  ChildRun two = run_child(plan(11, d + "/2"), 6, 30);
  ChildRun other = run_child(plan(12, d + "/3"), 6, 30);
  ASSERT_EQ(0, one.status) << one.out;
  EXPECT_EQ(one.out, two.out);
  EXPECT_NE(one.out, other.out) << "another seed, another run";
  const std::string log1 = slurp(d + "/1");
  EXPECT_EQ(without_qpns(log1), without_qpns(slurp(d + "/2")));
  // One line per fault, each the completion the application saw.
  size_t faults = 0;
  for (size_t at = 0; (at = log1.find("status=RETRY_EXC_ERR\n", at)) != std::string::npos; ++at) ++faults;
  size_t failed = 0;
  for (size_t at = 0; (at = one.out.find("transport retry counter exceeded", at)) != std::string::npos; ++at) ++failed;
  EXPECT_GT(faults, 0u);
  EXPECT_EQ(faults, failed);
  // The plan in a file, with comments, is the same plan.
  { std::ofstream(d + "/plan") << "# a recorded plan\nseed=11\nwc:rate=0.06,status=RETRY_EXC_ERR  # one in 16\n"; }
  ChildRun file = run_child("SOFTVERBS_FAULT_PLAN=" + d + "/plan", 6, 30);
  EXPECT_EQ(one.out, file.out);
  std::system(("rm -rf " + d).c_str());
}

// The log is created mode 0600 and never written through a symbolic link
// (a link planted where a user's log goes must not aim it elsewhere).
TEST(FaultPlan, TheLogIsNeverWrittenThroughASymbolicLink) {
  char dir[] = "/tmp/sv-faultlog-XXXXXX";
  ASSERT_NE(nullptr, mkdtemp(dir));
  const std::string d = dir;
  { std::ofstream(d + "/target") << "untouched\n"; }
  ASSERT_EQ(0, symlink((d + "/target").c_str(), (d + "/log").c_str()));
  ChildRun r = run_child("SOFTVERBS_FAULTS='wc:op=1,status=REM_OP_ERR' SOFTVERBS_FAULTS_LOG=" + d + "/log", 1, 1);
  EXPECT_EQ(0, r.status) << r.out;
  EXPECT_NE(std::string::npos, r.out.find("softverbs: SOFTVERBS_FAULTS_LOG: cannot open " + d + "/log")) << r.out;
  EXPECT_NE(std::string::npos, r.out.find("pair 0 wr 1 remote operation error")) << r.out;
  EXPECT_EQ("untouched\n", slurp(d + "/target"));
  ChildRun fresh = run_child("SOFTVERBS_FAULTS='wc:op=1,status=REM_OP_ERR' SOFTVERBS_FAULTS_LOG=" + d + "/new", 1, 1);
  struct stat st {};
  ASSERT_EQ(0, stat((d + "/new").c_str(), &st)) << fresh.out;
  EXPECT_EQ(0600u, st.st_mode & 07777);
  std::system(("rm -rf " + d).c_str());
}

}  // namespace
}  // namespace svtest

extern "C" int svtest_child_main(int argc, char** argv) {
  if (argc < 2) return 64;
  return svtest::workload(std::atoi(argv[0]), std::atoi(argv[1]));
}
