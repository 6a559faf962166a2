// shm_pingpong: the raw limits softverbs is compared against.
//
//  lat: two processes (fork) share one MAP_SHARED anonymous page and bounce
//       one cache line by busy polling; the value written is an incrementing
//       counter.  Reports one-way latency (RTT/2) over many round trips.
//  lat2: the same with two lines: each process busy-polls a line of its own
//       and writes the other's, the pattern of an RDMA WRITE ping-pong (each
//       side polls its own buffer, the peer writes into it).  A line with one
//       writer and one spinning reader costs the writer an invalidation and
//       the reader a fetch per message, where one line passed back and forth
//       travels once: on most x86 machines this limit is well above `lat`.
//  bw:  single-thread memcpy of N bytes between hot buffers (destination in a
//       MAP_SHARED mapping), repeated; reports GB/s (1e9 bytes/s).
//
// Output: one JSON object per line on stdout; progress/errors on stderr.
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <new>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench_common.h"

namespace {

struct Options {
  bool do_lat = true;
  bool do_lat2 = false;
  bool do_bw = true;
  uint64_t iters = 200000;
  uint64_t warmup = 10000;
  std::vector<uint64_t> sizes;
  double seconds = 0.2;  // per size for bw
  unsigned trials = 5;   // bw: median over this many trials per size
  bool pin = false;
  unsigned timeout = 120;  // watchdog, seconds
};

void usage() {
  std::fprintf(stderr,
               "usage: shm_pingpong [--test lat,lat2,bw] [--iters N] [--warmup N]\n"
               "                    [--sizes 8-4M|8,64,1M] [--time SEC] [--trials N]\n"
               "                    [--pin] [--timeout SEC]\n"
               "  lat: cache-line ping-pong between two processes (8 B), one-way ns\n"
               "  lat2: the same with one line per direction (each side polls its own)\n"
               "  bw:  single-thread memcpy bandwidth per size, GB/s\n");
}

void on_alarm(int) {
  static const char msg[] = "shm_pingpong: watchdog timeout\n";
  ssize_t r = write(2, msg, sizeof msg - 1);
  (void)r;
  _exit(3);
}

void pin_to(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  if (sched_setaffinity(0, sizeof set, &set) != 0) std::perror("sched_setaffinity");
}

struct alignas(64) SharedLine {
  std::atomic<uint64_t> value;
  char pad[64 - sizeof(std::atomic<uint64_t>)];
};

// two_lines: the parent polls one line and writes another, the child the
// reverse (lat2); else both use line[0] (lat).
int run_lat(const Options &o, bool two_lines) {
  static_assert(std::atomic<uint64_t>::is_always_lock_free);
  void *page = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (page == MAP_FAILED) {
    std::perror("mmap");
    return 1;
  }
  // Two lines 2 KiB apart: not a pair the adjacent-line prefetcher fetches together.
  auto *lines = new (page) SharedLine[64];
  lines[0].value.store(0, std::memory_order_relaxed);
  lines[32].value.store(0, std::memory_order_relaxed);
  SharedLine *parent_polls = &lines[0];
  SharedLine *child_polls = two_lines ? &lines[32] : &lines[0];
  const uint64_t total = o.iters + o.warmup;
  bench::ticks_per_ns();  // calibrate before forking timing-critical code

  pid_t pid = fork();
  if (pid < 0) {
    std::perror("fork");
    return 1;
  }
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (o.pin) pin_to(1);
    // Responder: wait for odd 2k+1, answer 2k+2.
    for (uint64_t i = 0; i < total; ++i) {
      const uint64_t want = 2 * i + 1;
      bench::Spinner sp;
      while (child_polls->value.load(std::memory_order_acquire) != want) sp.spin();
      parent_polls->value.store(want + 1, std::memory_order_release);
    }
    _exit(0);
  }
  if (o.pin) pin_to(0);

  std::vector<uint64_t> stamps(total + 1);
  for (uint64_t i = 0; i < total; ++i) {
    stamps[i] = bench::ticks();
    child_polls->value.store(2 * i + 1, std::memory_order_release);
    const uint64_t want = 2 * i + 2;
    bench::Spinner sp;
    while (parent_polls->value.load(std::memory_order_acquire) != want) sp.spin();
  }
  stamps[total] = bench::ticks();

  int status = 0;
  if (waitpid(pid, &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::fprintf(stderr, "shm_pingpong: responder failed (status %d)\n", status);
    return 1;
  }
  munmap(page, 4096);

  bench::LatStats s = bench::one_way_stats(stamps, o.warmup);
  bench::JsonLine()
      .str("bench", "shm_pingpong")
      .str("test", two_lines ? "lat2" : "lat")
      .num("size", uint64_t{8})
      .num("iters", o.iters)
      .real("median_ns", s.median_ns)
      .real("median_iter_ns", s.median_iter_ns)
      .real("p99_ns", s.p99_ns)
      .real("mean_ns", s.mean_ns)
      .real("min_ns", s.min_ns)
      .emit();
  return 0;
}

// Copy `reps` times; the asm barrier keeps the compiler from dropping or
// merging the copies.
inline void copy_reps(char *dst, const char *src, size_t n, uint64_t reps) {
  for (uint64_t r = 0; r < reps; ++r) {
    std::memcpy(dst, src, n);
    asm volatile("" : : "r"(dst), "r"(src) : "memory");
  }
}

int run_bw(const Options &o) {
  const uint64_t max_size = bench::max_of(o.sizes);
  const size_t map_len = (max_size + 4095) & ~uint64_t{4095};
  void *dst_map = mmap(nullptr, map_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (dst_map == MAP_FAILED) {
    std::perror("mmap");
    return 1;
  }
  void *src_mem = nullptr;
  if (posix_memalign(&src_mem, 4096, map_len) != 0) {
    std::fprintf(stderr, "posix_memalign failed\n");
    return 1;
  }
  char *dst = static_cast<char *>(dst_map);
  char *src = static_cast<char *>(src_mem);
  std::memset(src, 0x5a, map_len);
  std::memset(dst, 0, map_len);
  if (o.pin) pin_to(0);

  for (uint64_t size : o.sizes) {
    // Warm up and find a batch that takes >= ~0.5 ms.
    uint64_t batch = 1;
    for (;;) {
      uint64_t t0 = bench::ticks();
      copy_reps(dst, src, size, batch);
      if (bench::elapsed_s(t0, bench::ticks()) >= 0.0005 || batch >= (1ull << 40)) break;
      batch *= 2;
    }
    const double trial_s = o.seconds / o.trials;
    std::vector<double> gbps;
    double total_s = 0;
    for (unsigned t = 0; t < o.trials; ++t) {
      uint64_t copies = 0;
      uint64_t t0 = bench::ticks();
      double el = 0;
      do {
        copy_reps(dst, src, size, batch);
        copies += batch;
        el = bench::elapsed_s(t0, bench::ticks());
      } while (el < trial_s);
      total_s += el;
      gbps.push_back(static_cast<double>(copies) * static_cast<double>(size) / el / 1e9);
    }
    double best = *std::max_element(gbps.begin(), gbps.end());
    bench::JsonLine()
        .str("bench", "memcpy")
        .str("test", "bw")
        .num("size", size)
        .real("gbps", bench::median_of(gbps))
        .real("gbps_max", best)
        .num("trials", o.trials)
        .real("seconds", total_s)
        .emit();
  }
  munmap(dst_map, map_len);
  std::free(src_mem);
  return 0;
}

}  // namespace

int main(int argc, char **argv) {
  Options o;
  bench::parse_size_list("8-4M", o.sizes);
  bench::Args a(argc, argv);
  for (; a.valid(); a.next()) {
    std::string v;
    if (a.flag("-h") || a.flag("--help")) {
      usage();
      return 0;
    } else if (a.take("--test", v)) {
      o.do_lat = o.do_lat2 = o.do_bw = false;
      for (size_t pos = 0; pos <= v.size();) {
        size_t c = std::min(v.find(',', pos), v.size());
        std::string t = v.substr(pos, c - pos);
        o.do_lat |= t == "lat" || t == "all";
        o.do_lat2 |= t == "lat2" || t == "all";
        o.do_bw |= t == "bw" || t == "all";
        pos = c + 1;
      }
      if (!o.do_lat && !o.do_lat2 && !o.do_bw) {
        std::fprintf(stderr, "unknown --test '%s' (lat, lat2, bw, all)\n", v.c_str());
        return 2;
      }
    } else if (a.take("--iters", v)) {
      o.iters = bench::to_u64(v, "--iters");
    } else if (a.take("--warmup", v)) {
      o.warmup = bench::to_u64(v, "--warmup");
    } else if (a.take("--sizes", v)) {
      if (!bench::parse_size_list(v, o.sizes)) {
        std::fprintf(stderr, "bad --sizes '%s'\n", v.c_str());
        return 2;
      }
    } else if (a.take("--time", v)) {
      o.seconds = bench::to_double(v, "--time");
    } else if (a.take("--trials", v)) {
      o.trials = static_cast<unsigned>(bench::to_u64(v, "--trials"));
    } else if (a.take("--timeout", v)) {
      o.timeout = static_cast<unsigned>(bench::to_u64(v, "--timeout"));
    } else if (a.flag("--pin")) {
      o.pin = true;
    } else {
      std::fprintf(stderr, "unknown argument '%s'\n", a.cur());
      usage();
      return 2;
    }
  }
  if (o.iters == 0 || o.trials == 0) {
    std::fprintf(stderr, "--iters and --trials must be > 0\n");
    return 2;
  }
  signal(SIGALRM, on_alarm);
  if (o.timeout) alarm(o.timeout);

  int rc = 0;
  if (o.do_lat) rc |= run_lat(o, false);
  if (o.do_lat2) rc |= run_lat(o, true);
  if (o.do_bw) rc |= run_bw(o);
  return rc;
}
