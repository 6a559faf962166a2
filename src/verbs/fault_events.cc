// fault_events.cc: the asynchronous events of the process's fault plan
// (fault_events.h).
#include "verbs/fault_events.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/device_info.h"
#include "common/sys.h"
#include "common/trace.h"
#include "verbs/fault_ops.h"
#include "verbs/provider.h"
#include "verbs/transport.h"

namespace sv::verbs {
namespace {

// One planned moment: the port goes down or up (port rule `rule`), or a
// timed rule fires.
enum class What { kDown, kUp, kTimed };
struct Due {
  uint64_t at_ns;
  What what;
  size_t rule;
};

// The process's event state. The clock thread, once started, lives as long
// as the process (it only waits between moments).
struct Events {
  std::mutex mu;  // guards what follows, up to `port_down`
  std::condition_variable cv;
  std::vector<ContextState*> contexts;
  std::vector<Due> due;
  bool seeded = false;
  bool clock_started = false;
  int downs = 0;  // port rules holding the port down now
  std::atomic<bool> port_down{false};
  std::atomic<uint64_t> sends{0};  // send requests of the process's planned QPs
  std::atomic<uint32_t> ordinals[3]{};
};

Events& events() {
  static Events* e = new Events;  // never destroyed: the clock thread may outlive static destructors
  return *e;
}

// The device view `softverbs run` gives the program (tools/view_ns.h) is a
// tmpfs in the program's own mount namespace: its port files follow this
// process's port as ibv_query_port does, "1: DOWN" and "3: Disabled" while
// it is down, "4: ACTIVE" and "5: LinkUp" again after (the kernel's
// spellings, drivers/infiniband/core/sysfs.c). Each file is replaced whole
// (a reader never sees half of one). A real sysfs (no view) is left alone.
void view_port_state(bool down) {
  static const std::string dir = std::string("/sys/class/infiniband/") + dev::kName + "/ports/1/";
  struct statfs fs {};
  if (::statfs(dir.c_str(), &fs) != 0 || fs.f_type != TMPFS_MAGIC) return;
  const char* const files[][2] = {{"state", down ? "1: DOWN\n" : "4: ACTIVE\n"},
                                  {"phys_state", down ? "3: Disabled\n" : "5: LinkUp\n"}};
  for (const auto& [name, text] : files) {
    const std::string tmp = dir + "." + name, dst = dir + name;
    Fd f(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0444));
    const size_t n = std::strlen(text);
    int e = 0;
    if (!f.valid() || ::write(f.get(), text, n) != ssize_t(n) || ::rename(tmp.c_str(), dst.c_str()) != 0) e = errno;
    static bool said = false;
    if (e && !said) {
      said = true;
      std::fprintf(stderr, "softverbs: the device view's %s does not follow the fault plan's port: %s\n", dst.c_str(),
                   std::strerror(e));
    }
  }
}

// The port goes down (or up) for one rule; the contexts hear of it when
// the first rule takes it down and when the last lets it up. Under E.mu.
void port_go(Events& E, bool down) {
  const bool changed = down ? E.downs++ == 0 : (E.downs > 0 && --E.downs == 0);
  if (!changed) return;
  view_port_state(down);  // first: whoever sees the port down finds the view saying so
  E.port_down.store(down, std::memory_order_release);
  SV_TRACE("fault plan: port 1 %s", down ? "DOWN" : "ACTIVE");
  fault_logf("port %s\n", down ? "down" : "up");
  ibv_async_event ev{};
  ev.event_type = down ? IBV_EVENT_PORT_ERR : IBV_EVENT_PORT_ACTIVE;
  ev.element.port_num = 1;
  for (ContextState* st : E.contexts)
    if (!st->dead.load()) push_async_event(*st, ev);
}

void start_clock(Events& E);

void schedule(Events& E, Due d) {
  E.due.push_back(d);
  if (!E.clock_started) start_clock(E);
  E.cv.notify_all();
}

// The CQ or SRQ of the process with ordinal `n`, as its context and daemon
// handle; false if there is none now. An SRQ's limit is disarmed here, under
// its context's lock (a destroy takes it too), and returned in `limit`.
bool find_object(Events& E, faults::Timed kind, uint32_t n, ContextState*& at, uint32_t& handle, uint32_t& limit) {
  for (ContextState* st : E.contexts) {
    std::lock_guard<std::mutex> g(st->mu);
    if (kind == faults::Timed::kCqErr) {
      for (auto& [h, cq] : st->cq_handles)
        if (cq->st->plan_ordinal == n) return (at = st, handle = h, true);
    } else {
      for (auto& [h, s] : st->srq_handles) {
        SrqState* srq = reinterpret_cast<Srq*>(s)->st;
        if (srq->plan_ordinal != n) continue;
        // IBTA 11.5.2.4: the event disarms the limit; an SRQ not armed has none.
        limit = srq->now().hdr->limit.exchange(0);
        return (at = st, handle = h, true);
      }
    }
  }
  return false;
}

// A timed rule fires. Under E.mu (a context closing waits).
void fire_timed(Events& E, const faults::TimedRule& r) {
  if (r.kind == faults::Timed::kDeviceFatal) {
    SV_TRACE("fault plan: device fatal");
    fault_logf("%s\n", "device_fatal");
    // The daemon connection ends: each context's watchdog raises
    // IBV_EVENT_DEVICE_FATAL and fails what follows, as when the daemon dies.
    for (ContextState* st : E.contexts) st->conn.fail_device();
    return;
  }
  const bool cq = r.kind == faults::Timed::kCqErr;
  ContextState* st = nullptr;
  uint32_t handle = 0, limit = 0;
  if (!find_object(E, r.kind, r.n, st, handle, limit)) {
    fault_logf("%s %s=%u: none (no event)\n", cq ? "cq_err" : "srq_limit", cq ? "cq" : "srq", r.n);
    return;
  }
  proto::HandleReq req{};
  req.handle = handle;
  proto::Empty rep{};
  if (cq) {
    fault_logf("cq_err cq=%u\n", r.n);
    st->conn.call<proto::Op::CqError>(req, rep);  // the event, and the CQ's QPs to ERR
    return;
  }
  fault_logf(limit ? "srq_limit srq=%u limit=%u\n" : "srq_limit srq=%u: not armed (no event)\n", r.n, limit);
  if (limit) st->conn.call<proto::Op::SrqLimit>(req, rep);
}

void fire(Events& E, const Due& d) {
  const faults::Plan& p = process_plan();
  if (d.what == What::kTimed) return fire_timed(E, p.timed[d.rule]);
  port_go(E, d.what == What::kDown);
  if (d.what == What::kDown) schedule(E, {monotonic_ns() + p.port[d.rule].down_ms * 1'000'000, What::kUp, d.rule});
}

void start_clock(Events& E) {
  E.clock_started = true;
  std::thread([&E] {
    std::unique_lock<std::mutex> l(E.mu);
    for (;;) {
      if (E.due.empty()) {
        E.cv.wait(l);
        continue;
      }
      auto it = std::min_element(E.due.begin(), E.due.end(), [](const Due& a, const Due& b) { return a.at_ns < b.at_ns; });
      const uint64_t now = monotonic_ns();
      if (it->at_ns > now) {
        E.cv.wait_for(l, std::chrono::nanoseconds(it->at_ns - now));
        continue;
      }
      const Due d = *it;
      E.due.erase(it);
      fire(E, d);
    }
  }).detach();
}

}  // namespace

void events_attach(ContextState& st) {
  const faults::Plan& p = process_plan();
  if (!p.raises_events()) return;
  Events& E = events();
  std::lock_guard<std::mutex> g(E.mu);
  E.contexts.push_back(&st);
  if (E.seeded) return;
  E.seeded = true;  // times count from the first context
  const uint64_t now = monotonic_ns();
  for (size_t i = 0; i < p.port.size(); ++i) {
    if (p.port[i].op) continue;
    // after_ms=0: the port is down before the first context's first verb
    // (the application opens its device on a port that is down).
    if (p.port[i].after_ms == 0) fire(E, {now, What::kDown, i});
    else schedule(E, {now + p.port[i].after_ms * 1'000'000, What::kDown, i});
  }
  for (size_t i = 0; i < p.timed.size(); ++i) schedule(E, {now + p.timed[i].after_ms * 1'000'000, What::kTimed, i});
}

void events_detach(ContextState& st) {
  if (!process_plan().raises_events()) return;
  Events& E = events();
  std::lock_guard<std::mutex> g(E.mu);
  E.contexts.erase(std::remove(E.contexts.begin(), E.contexts.end(), &st), E.contexts.end());
}

bool planned_port_down() {
  return process_plan().raises_events() && events().port_down.load(std::memory_order_acquire);
}

const std::atomic<bool>* planned_port_flag() {
  return process_plan().port.empty() ? nullptr : &events().port_down;
}

uint32_t planned_ordinal(faults::Timed kind) {
  const faults::Plan& p = process_plan();
  for (const faults::TimedRule& r : p.timed)
    if (r.kind == kind) return events().ordinals[int(kind)].fetch_add(1, std::memory_order_relaxed) + 1;
  return 0;
}

bool event_fault(ProcessQp& q, uint64_t qp_op, uint32_t opcode, uint64_t wr_id, Outcome& out) {
  const faults::Plan& p = process_plan();
  Events& E = events();
  if (!p.port.empty()) {
    const uint64_t n = E.sends.fetch_add(1, std::memory_order_relaxed) + 1;
    for (size_t i = 0; i < p.port.size(); ++i) {
      if (p.port[i].op != n) continue;
      std::lock_guard<std::mutex> g(E.mu);
      fault_logf("port op=%llu qp=0x%x: down for %llu ms\n", (unsigned long long)n, q.qpn,
               (unsigned long long)p.port[i].down_ms);
      port_go(E, true);
      schedule(E, {monotonic_ns() + p.port[i].down_ms * 1'000'000, What::kUp, i});
    }
  }
  for (const faults::QpFatalRule& r : p.qp_fatal) {
    if ((!r.all && r.qpn != q.qpn) || r.op != qp_op) continue;
    SV_TRACE("QP 0x%x: fault plan: QP fatal at op %llu", q.qpn, (unsigned long long)qp_op);
    fault_logf("qp_fatal qp=0x%x op=%llu wr_id=%llu opcode=%s\n", q.qpn, (unsigned long long)qp_op,
             (unsigned long long)wr_id, fault_opcode_name(opcode));
    ibv_async_event ev{};
    ev.event_type = IBV_EVENT_QP_FATAL;
    ev.element.qp = &q.self->qpx.qp_base;
    push_async_event(*q.ctx->st, ev);
    out = {Step::kError, IBV_WC_WR_FLUSH_ERR};
    return true;
  }
  if (!E.port_down.load(std::memory_order_acquire) || opcode == IBV_WR_LOCAL_INV || opcode == IBV_WR_BIND_MW)
    return false;
  const bool reliable = q.type == IBV_QPT_RC || q.type == IBV_QPT_XRC_SEND;
  fault_logf("port down: qp=0x%x wr_id=%llu opcode=%s %s\n", q.qpn, (unsigned long long)wr_id, fault_opcode_name(opcode),
           reliable ? "status=RETRY_EXC_ERR" : "lost");
  // A reliable QP's retries run out without an acknowledgement; an
  // unreliable one's message is lost on the way.
  out = reliable ? Outcome{Step::kError, IBV_WC_RETRY_EXC_ERR} : Outcome{Step::kDone};
  return true;
}

}  // namespace sv::verbs
