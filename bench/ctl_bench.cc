// ctl_bench: the cost of the control path that every program pays first:
// ibv_open_device + ibv_alloc_pd + ibv_dealloc_pd + ibv_close_device, one
// after the other, timed per iteration (CLOCK_MONOTONIC). Public verbs API
// only, so that one binary measures any build's library (LD_LIBRARY_PATH)
// and daemon (SOFTVERBSD): bench/ab_ctl.py runs two builds in turns.
//   ctl_bench [ITERS] [WARMUP]
// Output: one JSON line {"test":"open_pd_close","median_ns":...,"p10_ns":...,
// "p90_ns":...,"cpu_ns":...}: wall time per iteration (median and spread),
// and this process's CPU time per iteration (all its threads, the
// library's included), which a loaded machine disturbs less.
#include <infiniband/verbs.h>
#include <time.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace {

uint64_t now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
}

// One open/alloc/dealloc/close; false (said on stderr) on a failure.
bool one(ibv_device* dev) {
  ibv_context* ctx = ibv_open_device(dev);
  if (!ctx) {
    std::fprintf(stderr, "ctl_bench: ibv_open_device: %s\n", std::strerror(errno));
    return false;
  }
  ibv_pd* pd = ibv_alloc_pd(ctx);
  if (!pd) {
    std::fprintf(stderr, "ctl_bench: ibv_alloc_pd: %s\n", std::strerror(errno));
    ibv_close_device(ctx);
    return false;
  }
  ibv_dealloc_pd(pd);
  ibv_close_device(ctx);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  const int iters = argc > 1 ? std::atoi(argv[1]) : 300;
  const int warmup = argc > 2 ? std::atoi(argv[2]) : 20;
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (!list || n < 1) {
    std::fprintf(stderr, "ctl_bench: no device\n");
    return 1;
  }
  for (int i = 0; i < warmup; ++i)
    if (!one(list[0])) return 1;
  timespec c0{}, c1{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c0);
  std::vector<uint64_t> t;
  t.reserve(size_t(iters));
  for (int i = 0; i < iters; ++i) {
    const uint64_t a = now_ns();
    if (!one(list[0])) return 1;
    t.push_back(now_ns() - a);
  }
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c1);
  const uint64_t cpu = (uint64_t(c1.tv_sec) * 1000000000ull + uint64_t(c1.tv_nsec)) -
                       (uint64_t(c0.tv_sec) * 1000000000ull + uint64_t(c0.tv_nsec));
  ibv_free_device_list(list);
  std::sort(t.begin(), t.end());
  std::printf("{\"test\":\"open_pd_close\",\"median_ns\":%llu,\"p10_ns\":%llu,\"p90_ns\":%llu,\"cpu_ns\":%llu}\n",
              (unsigned long long)t[t.size() / 2], (unsigned long long)t[t.size() / 10],
              (unsigned long long)t[t.size() * 9 / 10], (unsigned long long)(cpu / t.size()));
  return 0;
}
