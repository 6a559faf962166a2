// fault_ops.cc: completions in error from the process's fault plan
// (fault_ops.h).
#include "verbs/fault_ops.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "common/shm_layout.h"
#include "common/trace.h"
#include "verbs/fault_events.h"
#include "verbs/provider.h"
#include "verbs/transport.h"
#include "verbs/wr_rules.h"

namespace sv::verbs {
namespace {

struct ProcessPlan {
  faults::Plan plan;
  std::string error;
  int log_fd = -1;
  uint64_t read_ns = monotonic_ns();  // when the plan was read: wc rules' after_ms count from here
  ProcessPlan() {
    error = faults::from_environment(plan);
    if (!error.empty()) {
      std::fprintf(stderr, "softverbs: %s\n", error.c_str());
      plan = faults::Plan{};
      return;
    }
    // Appended to, created mode 0600, never through a symbolic link; not
    // for a set-user-ID or set-group-ID program (secure_getenv).
    if (const char* path = secure_getenv("SOFTVERBS_FAULTS_LOG"); path && !plan.empty()) {
      log_fd = ::open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
      if (log_fd < 0) std::fprintf(stderr, "softverbs: SOFTVERBS_FAULTS_LOG: cannot open %s: %s\n", path, std::strerror(errno));
    }
  }
};

ProcessPlan& the_plan() {
  static ProcessPlan p;
  return p;
}

// The QPs given planned operations, in order: each draws from its own
// stream of the plan's seed, so a scripted run replays whatever QPNs the
// daemon hands out.
std::atomic<uint64_t> g_planned_qps{0};

uint64_t stream_seed(uint64_t seed, uint64_t ordinal) {
  faults::Rng r{seed ^ (ordinal * 0xd1342543de82ef95ull)};
  return r.next();
}

}  // namespace

const char* fault_opcode_name(uint32_t op) {
  switch (op) {
    case IBV_WR_RDMA_WRITE: return "RDMA_WRITE";
    case IBV_WR_RDMA_WRITE_WITH_IMM: return "RDMA_WRITE_WITH_IMM";
    case IBV_WR_SEND: return "SEND";
    case IBV_WR_SEND_WITH_IMM: return "SEND_WITH_IMM";
    case IBV_WR_RDMA_READ: return "RDMA_READ";
    case IBV_WR_ATOMIC_CMP_AND_SWP: return "ATOMIC_CMP_AND_SWP";
    case IBV_WR_ATOMIC_FETCH_AND_ADD: return "ATOMIC_FETCH_AND_ADD";
    case IBV_WR_SEND_WITH_INV: return "SEND_WITH_INV";
    default: return "OTHER";
  }
}

namespace {

// One line per injected fault (SOFTVERBS_FAULTS_LOG), written whole with
// one append.
void log_fault(const ProcessQp& q, uint64_t wr_id, uint32_t opcode, uint64_t op, ibv_wc_status s) {
  if (!fault_log_open()) return;
  char line[160];
  int n = std::snprintf(line, sizeof line, "wc qp=0x%x op=%llu wr_id=%llu opcode=%s status=%s\n", q.qpn,
                        (unsigned long long)op, (unsigned long long)wr_id, fault_opcode_name(opcode),
                        faults::status_name(s));
  if (n > 0) fault_log_line(line, size_t(std::min(n, int(sizeof line) - 1)));
}

// Whether wc rule `r` (the QP's own copy) takes request number n: by
// operation number, by rate, or by time (the first request at or after
// after_ms, once; or at its rate from then on).
bool takes(QpFaults& f, faults::WcRule& r, uint64_t n) {
  if (r.op) return r.op == n;
  if (r.after_ms) {
    if (monotonic_ns() < the_plan().read_ns + r.after_ms * 1'000'000) return false;
    if (r.rate == 0) {
      r.after_ms = UINT64_MAX / 2'000'000;  // spent: taken once
      return true;
    }
  }
  return f.rng.chance(r.rate);
}

// The plan's decision for request number n, `w`, at its first try: an
// outcome now (it fails), or none (it goes on, perhaps delayed or refused:
// f.delay_until, f.rnr_refusals).
bool decide(ProcessQp& q, QpFaults& f, uint64_t n, const shm::SendWqe& w, Outcome& out) {
  f.delay_until = 0;
  f.rnr_refusals = 0;
  if (f.events && event_fault(q, n, w.opcode, w.wr_id, out)) return true;
  for (faults::WcRule& r : f.rules) {
    if (!takes(f, r, n)) continue;
    if (r.delay_us) {
      f.delay_until = monotonic_ns() + uint64_t(r.delay_us) * 1000;
      fault_logf("wc qp=0x%x op=%llu wr_id=%llu opcode=%s delay_us=%u\n", q.qpn, (unsigned long long)n,
               (unsigned long long)w.wr_id, fault_opcode_name(w.opcode), r.delay_us);
      continue;
    }
    SV_TRACE("QP 0x%x: fault plan fails op %llu with %s", q.qpn, (unsigned long long)n, faults::status_name(r.status));
    log_fault(q, w.wr_id, w.opcode, n, r.status);
    out = {Step::kError, r.status};
    return true;
  }
  // RC and XRC only: UC and UD have no RNR NAK (IBTA 9.7.5.2.8).
  const bool reliable = q.type == IBV_QPT_RC || q.type == IBV_QPT_XRC_SEND;
  for (const faults::RnrRule& r : f.rnr) {
    if (r.op != n || !reliable || wr_rule(w.opcode).kind == WrKind::kLocal) continue;
    f.rnr_refusals = r.times;
    fault_logf("rnr qp=0x%x op=%llu wr_id=%llu opcode=%s times=%u\n", q.qpn, (unsigned long long)n,
             (unsigned long long)w.wr_id, fault_opcode_name(w.opcode), r.times);
  }
  return false;
}

// The execute of planned operations: the plan decides at a request's first
// try (a head retried after RNR or a timeout was decided then); a delay
// holds it at the head (Step::kWait), then each planned refusal is an RNR
// NAK, then it is carried out.
Outcome execute_planned(ProcessQp& q, const shm::SendWqe& w) {
  QpFaults& f = *q.faults;
  if (!q.head_started) {
    if (Outcome o; decide(q, f, ++f.ops, w, o)) return o;
  }
  if (f.delay_until) [[unlikely]] {
    if (monotonic_ns() < f.delay_until) {
      q.next_try_ns = f.delay_until;
      return {Step::kWait};
    }
    f.delay_until = 0;
  }
  if (f.rnr_refusals) [[unlikely]] {
    --f.rnr_refusals;
    SV_TRACE("QP 0x%x: fault plan: RNR NAK (%u more)", q.qpn, f.rnr_refusals);
    return {Step::kRnr};
  }
  return f.base.load(std::memory_order_acquire)->execute(q, w);
}

int post_planned(ProcessQp& q, ibv_send_wr* wr, ibv_send_wr** bad, bool all_or_nothing) {
  return q.faults->slow_post(q, wr, bad, all_or_nothing);
}

constexpr QpOps kPlannedShm{"shared memory (fault plan)", post_planned, execute_planned};
constexpr QpOps kPlannedMediated{"mediated (fault plan)", post_planned, execute_planned};

}  // namespace

const faults::Plan& process_plan() { return the_plan().plan; }
bool fault_log_open() { return the_plan().log_fd >= 0; }
void fault_log_line(const char* line, size_t n) {
  if (::write(the_plan().log_fd, line, n) < 0) return;  // a log that cannot be written loses the line, not the run
}
const std::string& process_plan_error() { return the_plan().error; }

ibv_wc_status wire_fault(ProcessQp& q, const ibv_send_wr& wr) {
  QpFaults& f = *q.faults;
  const uint64_t n = ++f.ops;
  // A port rule: a reliable request fails (retries exhausted), an
  // unreliable one goes into the down link (lost there: the endpoint sends
  // nothing while the port is down).
  if (Outcome o; f.events && event_fault(q, n, wr.opcode, wr.wr_id, o))
    return o.step == Step::kError ? o.status : IBV_WC_SUCCESS;
  for (faults::WcRule& r : f.rules) {
    if (r.delay_us) continue;  // delays are not applied on the wire yet
    if (takes(f, r, n)) {
      SV_TRACE("QP 0x%x: fault plan fails op %llu with %s", q.qpn, (unsigned long long)n, faults::status_name(r.status));
      log_fault(q, wr.wr_id, wr.opcode, n, r.status);
      return r.status;
    }
  }
  return IBV_WC_SUCCESS;
}

namespace {

// q's planned state, if the plan has anything for it: its wc rules (with
// `wc`), and whether its requests go through event_fault (port rules look
// at every QP; QP fatal ones at those they name). False: nothing.
bool plan_qp(ProcessQp& q, const faults::Plan& p, bool wc) {
  if (q.faults) return true;
  std::vector<faults::WcRule> rules;
  for (const faults::WcRule& r : p.wc)
    if (wc && (r.all || r.qpn == q.qpn)) rules.push_back(r);
  std::vector<faults::RnrRule> rnr;
  for (const faults::RnrRule& r : p.rnr)
    if (wc && (r.all || r.qpn == q.qpn)) rnr.push_back(r);
  bool events = !p.port.empty();
  for (const faults::QpFatalRule& r : p.qp_fatal) events |= r.all || r.qpn == q.qpn;
  if (rules.empty() && rnr.empty() && !events) return false;
  auto f = std::make_unique<QpFaults>();
  f->rules = std::move(rules);
  f->rnr = std::move(rnr);
  f->events = events;
  f->rng.state = stream_seed(p.seed, g_planned_qps.fetch_add(1, std::memory_order_relaxed));
  q.faults = std::move(f);
  return true;
}

}  // namespace

const QpOps* planned_ops(ProcessQp& q, const QpOps* ops, PostFn slow_post) {
  const faults::Plan& p = process_plan();
  if (!p.plans_sends()) return ops;
  const bool shm = std::strcmp(ops->path, "shared memory") == 0;
  // On the wire the RoCE engine carries the requests (roce_link.cc asks
  // wire_fault of each, for a remote destination); its ops stay. Completion
  // faults do not apply to UD there.
  if (std::strcmp(ops->path, "wire") == 0) {
    // (rnr rules do not apply there yet: its QPFaults has none)
    if (!q.faults && plan_qp(q, p, q.type != IBV_QPT_UD)) q.faults->rnr.clear();
    return ops;
  }
  if (!shm && std::strcmp(ops->path, "mediated") != 0) return ops;  // no send queue
  if (!plan_qp(q, p, true)) return ops;
  q.faults->slow_post = slow_post;  // the same for every path a QP takes here
  q.faults->base.store(ops, std::memory_order_release);
  return shm ? &kPlannedShm : &kPlannedMediated;
}

}  // namespace sv::verbs
