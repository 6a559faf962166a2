// verbs_bench_tests.cc: verbs_bench's tests (see verbs_bench.cc): latency
// (write_lat, send_lat, read_lat), data check (verify) and bandwidth
// (write_bw, read_bw, send_bw).
#include <sys/socket.h>

#include <cstdio>
#include <cstring>

#include "verbs_bench.h"

namespace verbs_bench {

// Latency iterations for one size: fewer for large messages (at most
// --lat-bytes moved per side), never fewer than --min-iters.
struct LatIters {
  uint64_t iters, warmup;
};
LatIters lat_iters(const Options &o, uint64_t size) {
  uint64_t it = std::min(o.iters, std::max(o.min_iters, o.lat_bytes / std::max<uint64_t>(size, 1)));
  uint64_t w = std::min(o.warmup, std::max<uint64_t>(16, it / 10));
  return {it, w};
}

void emit_lat(Rdma &r, Test t, uint64_t size, LatIters n, bool inl, std::vector<uint64_t> &stamps,
              double div = 2.0) {
  bench::LatStats s = bench::one_way_stats(stamps, n.warmup, div);
  bench::JsonLine()
      .str("bench", "verbs")
      .str("test", test_name(t))
      .str("device", r.dev)
      .num("size", size)
      .num("iters", n.iters)
      .num("inline", inl ? 1 : 0)
      .num("td", r.td ? 1 : 0)
      .real("median_ns", s.median_ns)
      .real("median_iter_ns", s.median_iter_ns)
      .real("p99_ns", s.p99_ns)
      .real("mean_ns", s.mean_ns)
      .real("min_ns", s.min_ns)
      .emit();
}

void write_lat(Rdma &r, const Options &o, bool client, uint64_t size) {
  const LatIters li = lat_iters(o, size);
  const uint64_t total = li.iters + li.warmup;
  std::memset(r.recv_buf(), 0, size);
  std::memset(r.send_buf(), 0, size);
  const bool inl = size <= r.max_inline;
  SendTracker tr{std::max(1u, std::min(o.cq_mod, r.sq_depth / 2)), r.sq_depth};

  ibv_sge sge{reinterpret_cast<uintptr_t>(r.send_buf()), static_cast<uint32_t>(size), r.mr->lkey};
  ibv_send_wr wr{};
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.wr.rdma.remote_addr = r.remote_recv();
  wr.wr.rdma.rkey = r.remote.rkey;
  volatile uint8_t *poll_byte = reinterpret_cast<volatile uint8_t *>(r.recv_buf() + size - 1);
  volatile uint8_t *post_byte = reinterpret_cast<volatile uint8_t *>(r.send_buf() + size - 1);

  auto post = [&](uint64_t i, uint8_t tag) {
    *post_byte = tag;
    wr.wr_id = i;
    wr.send_flags = (inl ? kInline : 0u) |
                    (tr.next_signaled(r, i + 1 == total) ? kSignaled : 0u);
    ibv_send_wr *bad = nullptr;
    if (int e = ibv_post_send(r.qp, &wr, &bad)) die("ibv_post_send(WRITE) failed: %s", std::strerror(e));
  };
  auto wait = [&](uint8_t tag) {
    bench::Spinner sp;
    while (*poll_byte != tag) sp.spin();
    tr.reap(r);
  };

  std::vector<uint64_t> stamps(client ? total + 1 : 0);
  barrier(r.sock);
  for (uint64_t i = 0; i < total; ++i) {
    const uint8_t tag = static_cast<uint8_t>(i + 1);
    if (client) {
      stamps[i] = bench::ticks();
      post(i, tag);
      wait(tag);
    } else {
      wait(tag);
      post(i, tag);
    }
  }
  if (client) stamps[total] = bench::ticks();
  tr.drain(r);
  barrier(r.sock);
  if (client) emit_lat(r, Test::WriteLat, size, li, inl, stamps);
}

void send_lat(Rdma &r, const Options &o, bool client, uint64_t size) {
  const LatIters li = lat_iters(o, size);
  const uint64_t total = li.iters + li.warmup;
  const bool inl = size <= r.max_inline;
  SendTracker tr{std::max(1u, std::min(o.cq_mod, r.sq_depth / 2)), r.sq_depth};
  post_recvs(r);

  ibv_sge sge{reinterpret_cast<uintptr_t>(r.send_buf()), static_cast<uint32_t>(size), r.mr->lkey};
  ibv_send_wr wr{};
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_SEND;
  ibv_sge rsge{reinterpret_cast<uintptr_t>(r.recv_buf()), static_cast<uint32_t>(r.region), r.mr->lkey};
  ibv_recv_wr rwr{};
  rwr.sg_list = &rsge;
  rwr.num_sge = 1;

  auto post = [&](uint64_t i) {
    wr.wr_id = i;
    wr.send_flags = (inl ? kInline : 0u) |
                    (tr.next_signaled(r, i + 1 == total) ? kSignaled : 0u);
    ibv_send_wr *bad = nullptr;
    if (int e = ibv_post_send(r.qp, &wr, &bad)) die("ibv_post_send(SEND) failed: %s", std::strerror(e));
  };
  auto wait = [&]() {
    ibv_wc wc;
    int n;
    bench::Spinner sp;
    while ((n = ibv_poll_cq(r.rcq, 1, &wc)) == 0) sp.spin();
    if (n < 0) die("ibv_poll_cq(recv) failed");
    check_wc(wc, "recv");
    if (wc.byte_len != size) die("recv byte_len %u != %llu", wc.byte_len, static_cast<unsigned long long>(size));
    --r.recv_posted;
    ibv_recv_wr *bad = nullptr;
    rwr.wr_id = wc.wr_id;
    if (int e = ibv_post_recv(r.qp, &rwr, &bad)) die("ibv_post_recv failed: %s", std::strerror(e));
    ++r.recv_posted;
    tr.reap(r);
  };

  std::vector<uint64_t> stamps(client ? total + 1 : 0);
  barrier(r.sock);
  for (uint64_t i = 0; i < total; ++i) {
    if (client) {
      stamps[i] = bench::ticks();
      post(i);
      wait();
    } else {
      wait();
      post(i);
    }
  }
  if (client) stamps[total] = bench::ticks();
  tr.drain(r);
  barrier(r.sock);
  if (client) emit_lat(r, Test::SendLat, size, li, inl, stamps);
}

// verify: RDMA WRITE a pattern and have the target compare it with what it
// computes itself.  Three passes: inline (if the size fits), non-inline, and
// one where the initiator does not poll its CQ until the target has seen the
// data (as in write_lat: an RDMA WRITE must reach the target without the
// requester calling ibv_poll_cq).  A broken data path then fails with a clear
// message instead of a hang in the latency test.
uint8_t pattern_byte(uint64_t i, uint64_t size, unsigned pass) {
  return static_cast<uint8_t>((i * 131 + size * 7 + pass * 29 + 1) & 0xff);
}

void verify(Rdma &r, bool client, uint64_t size) {
  barrier(r.sock);
  for (unsigned pass = 0; pass < 3; ++pass) {
    const bool unpolled = pass == 2;
    const bool inl = pass == 1 ? false : size <= r.max_inline;
    if (pass == 0 && !inl) continue;
    const char *kind = unpolled ? "unpolled" : inl ? "inline" : "non-inline";
    auto wait_completion = [&]() {
      ibv_wc wc;
      int n;
      const uint64_t t0 = bench::ticks();
      while ((n = ibv_poll_cq(r.scq, 1, &wc)) == 0) {
        if (bench::elapsed_s(t0, bench::ticks()) > 5.0)
          die("verify: no completion for a %s %llu B WRITE within 5 s", kind,
              static_cast<unsigned long long>(size));
      }
      if (n < 0) die("verify: ibv_poll_cq failed");
      check_wc(wc, "verify WRITE");
      if (wc.wr_id != 0x7e57 || wc.opcode != IBV_WC_RDMA_WRITE)
        die("verify: bad completion (wr_id %llu, opcode %d)",
            static_cast<unsigned long long>(wc.wr_id), wc.opcode);
    };
    if (client) {
      for (uint64_t i = 0; i < size; ++i)
        r.send_buf()[i] = static_cast<char>(pattern_byte(i, size, pass));
      ibv_sge sge{reinterpret_cast<uintptr_t>(r.send_buf()), static_cast<uint32_t>(size), r.mr->lkey};
      ibv_send_wr wr{};
      wr.wr_id = 0x7e57;
      wr.sg_list = &sge;
      wr.num_sge = 1;
      wr.opcode = IBV_WR_RDMA_WRITE;
      wr.send_flags = kSignaled | (inl ? kInline : 0u);
      wr.wr.rdma.remote_addr = r.remote_recv();
      wr.wr.rdma.rkey = r.remote.rkey;
      ibv_send_wr *bad = nullptr;
      if (int e = ibv_post_send(r.qp, &wr, &bad)) die("verify: ibv_post_send failed: %s", std::strerror(e));
      if (!unpolled) wait_completion();  // completion => data placed at the target
    }
    barrier(r.sock);
    char verdict[200] = "ok";
    if (!client) {
      const volatile uint8_t *p = reinterpret_cast<const volatile uint8_t *>(r.recv_buf());
      if (unpolled) {  // wait for the last byte, as write_lat does
        const uint8_t last = pattern_byte(size - 1, size, pass);
        const uint64_t t0 = bench::ticks();
        bench::Spinner sp;
        while (p[size - 1] != last && bench::elapsed_s(t0, bench::ticks()) < 2.0) sp.spin();
      }
      for (uint64_t i = 0; i < size; ++i) {
        uint8_t want = pattern_byte(i, size, pass);
        if (p[i] != want) {
          std::snprintf(verdict, sizeof verdict, "%s WRITE of %llu B: target byte %llu is 0x%02x, expected 0x%02x%s",
                        kind, static_cast<unsigned long long>(size), static_cast<unsigned long long>(i), p[i],
                        want, unpolled ? " after 2 s (data must arrive while the initiator does not poll its CQ)" : "");
          break;
        }
      }
      write_all(r.sock, verdict, sizeof verdict);
    } else {
      read_all(r.sock, verdict, sizeof verdict);
      verdict[sizeof verdict - 1] = 0;
      if (std::strcmp(verdict, "ok") != 0) die("verify failed: %s", verdict);
      if (unpolled) wait_completion();
    }
  }
  if (client)
    bench::JsonLine()
        .str("bench", "verbs")
        .str("test", "verify")
        .str("device", r.dev)
        .num("size", size)
        .num("ok", 1)
        .emit();
}

struct BwResult {
  uint64_t msgs = 0;
  double seconds = 0;
};

// Flow control of send_bw: the server RDMA-WRITEs how many receives it has
// reposted into `*credit`; the client keeps at most `limit` SENDs beyond that.
struct Credits {
  const volatile uint64_t *credit = nullptr;
  uint64_t limit = 0;
  uint64_t posted = 0;  // SENDs posted so far, over all bw_loop calls of one size
};

// Client side of the bandwidth tests: keep `window` WRs of `op` in flight for
// `secs` seconds.  RDMA READ cannot be inline (its data flows the other way).
BwResult bw_loop(Rdma &r, uint64_t size, unsigned window, unsigned chunk, double secs,
                 ibv_wr_opcode op = IBV_WR_RDMA_WRITE, Credits *cr = nullptr) {
  const bool inl = op != IBV_WR_RDMA_READ && size <= r.max_inline;
  const unsigned max_chunks = window / chunk;
  std::vector<ibv_send_wr> wrs(chunk);
  ibv_sge sge{reinterpret_cast<uintptr_t>(r.send_buf()), static_cast<uint32_t>(size), r.mr->lkey};
  for (unsigned j = 0; j < chunk; ++j) {
    ibv_send_wr &w = wrs[j];
    w = ibv_send_wr{};
    w.wr_id = j;
    w.sg_list = &sge;
    w.num_sge = 1;
    w.opcode = op;
    w.send_flags = (inl ? kInline : 0u) | (j + 1 == chunk ? kSignaled : 0u);
    w.wr.rdma.remote_addr = r.remote_recv();
    w.wr.rdma.rkey = r.remote.rkey;
  }
  BwResult res;
  unsigned in_flight = 0;
  uint64_t chunks_done = 0;
  const uint64_t t0 = bench::ticks();
  uint64_t t1 = t0;
  for (;;) {
    t1 = bench::ticks();
    if (bench::elapsed_s(t0, t1) < secs) {
      while (in_flight < max_chunks && (!cr || cr->posted + chunk <= *cr->credit + cr->limit)) {
        if (cr) cr->posted += chunk;
        for (unsigned j = 0; j < chunk; ++j) {
          ibv_send_wr *bad = nullptr;
          if (int e = ibv_post_send(r.qp, &wrs[j], &bad))
            die("ibv_post_send(WRITE %llu B) failed: %s", static_cast<unsigned long long>(size),
                std::strerror(e));
        }
        ++in_flight;
      }
    } else if (in_flight == 0) {
      break;
    }
    int n = poll_send(r);
    in_flight -= static_cast<unsigned>(n);
    chunks_done += static_cast<uint64_t>(n);
  }
  res.msgs = chunks_done * chunk;
  res.seconds = bench::elapsed_s(t0, t1);
  return res;
}

void bw_window(const Options &o, const Rdma &r, unsigned &window, unsigned &chunk) {
  window = std::max(1u, std::min(o.window, r.sq_depth));
  chunk = o.chunk ? o.chunk : std::max(1u, window / 4);
  chunk = std::min(chunk, window);
  window = window / chunk * chunk;
}

// write_bw and read_bw: the server has nothing to do, a one-sided operation
// needs no responder CPU.
void write_bw(Rdma &r, const Options &o, bool client, uint64_t size, Test t) {
  const ibv_wr_opcode op = t == Test::ReadBw ? IBV_WR_RDMA_READ : IBV_WR_RDMA_WRITE;
  barrier(r.sock);
  if (client) {
    unsigned window, chunk;
    bw_window(o, r, window, chunk);
    std::memset(r.send_buf(), 0x5a, size);
    if (o.warm_seconds > 0) bw_loop(r, size, window, chunk, o.warm_seconds, op);
    BwResult res = bw_loop(r, size, window, chunk, o.seconds, op);
    double bytes = static_cast<double>(res.msgs) * static_cast<double>(size);
    bench::JsonLine()
        .str("bench", "verbs")
        .str("test", test_name(t))
        .str("device", r.dev)
        .num("size", size)
        .num("msgs", res.msgs)
        .real("seconds", res.seconds)
        .real("gbps", bytes / res.seconds / 1e9)
        .real("mmsgs_per_s", static_cast<double>(res.msgs) / res.seconds / 1e6)
        .num("window", window)
        .num("signal_every", chunk)
        .num("inline", op != IBV_WR_RDMA_READ && size <= r.max_inline ? 1 : 0)
        .emit();
  }
  barrier(r.sock);
}

// send_bw: the client streams SENDs like write_bw; the server reposts each
// consumed receive at once and, since it cannot know when the client's timed
// loop ends, learns the total from the socket (checked between polls).
// The client of send_bw: SENDs within the server's credits (see Credits),
// then the count checked against the server's and the result emitted.
void send_bw_client(Rdma &r, const Options &o, uint64_t size) {
  unsigned window, chunk;
  bw_window(o, r, window, chunk);
  window = std::min(window, r.rq_depth / chunk * chunk);  // never outrun the receives
  if (window == 0) window = chunk = 1;
  std::memset(r.send_buf(), 0x3c, size);
  // Never more SENDs unconsumed than the server has receives: a sender
  // that runs out of them waits out RNR NAK timers (IBTA 9.7.5.2.8), and
  // that would measure the back-off, not the data path.
  Credits cr{reinterpret_cast<const volatile uint64_t *>(r.recv_buf()), r.rq_depth, 0};
  uint64_t sent = 0;
  if (o.warm_seconds > 0) sent += bw_loop(r, size, window, chunk, o.warm_seconds, IBV_WR_SEND, &cr).msgs;
  BwResult res = bw_loop(r, size, window, chunk, o.seconds, IBV_WR_SEND, &cr);
  sent += res.msgs;
  write_all(r.sock, &sent, sizeof sent);
  uint64_t got = 0;
  read_all(r.sock, &got, sizeof got);
  if (got != sent) die("send_bw: server received %llu of %llu messages", static_cast<unsigned long long>(got),
                       static_cast<unsigned long long>(sent));
  double bytes = static_cast<double>(res.msgs) * static_cast<double>(size);
  bench::JsonLine()
      .str("bench", "verbs")
      .str("test", "send_bw")
      .str("device", r.dev)
      .num("size", size)
      .num("msgs", res.msgs)
      .real("seconds", res.seconds)
      .real("gbps", bytes / res.seconds / 1e9)
      .real("mmsgs_per_s", static_cast<double>(res.msgs) / res.seconds / 1e6)
      .num("window", window)
      .num("signal_every", chunk)
      .num("inline", size <= r.max_inline ? 1 : 0)
      .emit();
}

// The server of send_bw: reposts each consumed receive at once, credits
// the client every 16 receives, and answers the client's total with its own.
void send_bw_server(Rdma &r, uint64_t size) {
  ibv_sge rsge{reinterpret_cast<uintptr_t>(r.recv_buf()), static_cast<uint32_t>(r.region), r.mr->lkey};
  ibv_recv_wr rwr{};
  rwr.sg_list = &rsge;
  rwr.num_sge = 1;
  uint64_t got = 0, want = UINT64_MAX;
  unsigned idle = 0;
  // Credits: every 16 reposted receives, an inline RDMA WRITE of the count
  // into the client's credit word.
  SendTracker tr{16, r.sq_depth};
  ibv_sge csge{reinterpret_cast<uintptr_t>(r.send_buf()), 8, r.mr->lkey};
  ibv_send_wr cwr{};
  cwr.sg_list = &csge;
  cwr.num_sge = 1;
  cwr.opcode = IBV_WR_RDMA_WRITE;
  cwr.wr.rdma.remote_addr = r.remote_recv();
  cwr.wr.rdma.rkey = r.remote.rkey;
  uint64_t credited = 0;
  while (got < want) {
    ibv_wc wc[16];
    int n = ibv_poll_cq(r.rcq, 16, wc);
    if (n < 0) die("ibv_poll_cq(recv) failed");
    for (int i = 0; i < n; ++i) {
      check_wc(wc[i], "recv");
      if (wc[i].byte_len != size) die("recv byte_len %u != %llu", wc[i].byte_len,
                                      static_cast<unsigned long long>(size));
      rwr.wr_id = wc[i].wr_id;
      ibv_recv_wr *bad = nullptr;
      if (int e = ibv_post_recv(r.qp, &rwr, &bad)) die("ibv_post_recv failed: %s", std::strerror(e));
    }
    got += static_cast<uint64_t>(n);
    if (got - credited >= 16 || (n == 0 && got != credited)) {
      credited = got;
      std::memcpy(r.send_buf(), &credited, 8);
      cwr.send_flags = (r.max_inline >= 8 ? kInline : 0u) | (tr.next_signaled(r, false) ? kSignaled : 0u);
      ibv_send_wr *bad = nullptr;
      if (int e = ibv_post_send(r.qp, &cwr, &bad)) die("ibv_post_send(credit) failed: %s", std::strerror(e));
      tr.reap(r);
    }
    if (n == 0 && want == UINT64_MAX && (++idle & 255) == 0) {
      uint64_t v;
      ssize_t k = recv(r.sock, &v, sizeof v, MSG_DONTWAIT | MSG_PEEK);
      if (k == static_cast<ssize_t>(sizeof v)) read_all(r.sock, &want, sizeof want);
      else if (k == 0) die("peer closed the socket (peer failed?)");
    }
    if (n == 0) bench::cpu_relax();
  }
  if (got != want) die("send_bw: received %llu messages, client sent %llu", static_cast<unsigned long long>(got),
                       static_cast<unsigned long long>(want));
  tr.drain(r);
  write_all(r.sock, &got, sizeof got);
}

void send_bw(Rdma &r, const Options &o, bool client, uint64_t size) {
  post_recvs(r);
  if (client) *reinterpret_cast<volatile uint64_t *>(r.recv_buf()) = 0;  // the credit word
  barrier(r.sock);
  if (client) {
    send_bw_client(r, o, size);
  } else {
    send_bw_server(r, size);
  }
  barrier(r.sock);
}

// read_lat: one RDMA READ at a time from the server's buffer into the
// client's; the time from post to polled completion.  Always signalled: the
// completion is the only sign the data has arrived.
void read_lat(Rdma &r, const Options &o, bool client, uint64_t size) {
  const LatIters li = lat_iters(o, size);
  const uint64_t total = li.iters + li.warmup;
  std::vector<uint64_t> stamps(client ? total + 1 : 0);
  barrier(r.sock);
  if (client) {
    ibv_sge sge{reinterpret_cast<uintptr_t>(r.send_buf()), static_cast<uint32_t>(size), r.mr->lkey};
    ibv_send_wr wr{};
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_RDMA_READ;
    wr.send_flags = kSignaled;
    wr.wr.rdma.remote_addr = r.remote_recv();
    wr.wr.rdma.rkey = r.remote.rkey;
    for (uint64_t i = 0; i < total; ++i) {
      stamps[i] = bench::ticks();
      wr.wr_id = i;
      ibv_send_wr *bad = nullptr;
      if (int e = ibv_post_send(r.qp, &wr, &bad)) die("ibv_post_send(READ) failed: %s", std::strerror(e));
      ibv_wc wc;
      int n;
      bench::Spinner sp;
      while ((n = ibv_poll_cq(r.scq, 1, &wc)) == 0) sp.spin();
      if (n < 0) die("ibv_poll_cq(send) failed");
      check_wc(wc, "READ");
    }
    stamps[total] = bench::ticks();
  }
  barrier(r.sock);
  if (client) emit_lat(r, Test::ReadLat, size, li, false, stamps, 1.0);
}

}  // namespace verbs_bench
