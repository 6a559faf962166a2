// wire_peer.h: what the test bed's peer programs (mw_wire_peer,
// xrc_wire_peer) share: dying with a message, handing a line to the other
// side through a file of the shared directory, waiting for the other side's
// line, and waiting for one completion.
#pragma once

#include <errno.h>
#include <infiniband/verbs.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>

namespace wire_peer {

// Exits 1 after "PROGRAM: what" on stderr.
[[noreturn]] inline void die(const std::string& what) {
  std::fprintf(stderr, "%s: %s\n", program_invocation_short_name, what.c_str());
  std::exit(1);
}

// Writes `text` as PATH's one line, whole (written aside, then renamed).
inline void put(const std::string& path, const std::string& text) {
  std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp);
    f << text << "\n";
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) die("rename " + path);
}

// PATH's line, once the other side wrote it (at most 30 s).
inline std::string get(const std::string& path) {
  for (int i = 0; i < 3000; ++i) {
    std::ifstream f(path);
    std::string s;
    if (f && std::getline(f, s) && !s.empty()) return s;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  die("timed out waiting for " + path);
}

// One completion of `cq`: polled, then polled with short sleeps.
inline ibv_wc poll_one(ibv_cq* cq) {
  ibv_wc wc{};
  for (int i = 0; i < 30'000'000; ++i) {
    int n = ibv_poll_cq(cq, 1, &wc);
    if (n < 0) die("ibv_poll_cq");
    if (n == 1) return wc;
    if (i > 1000) std::this_thread::sleep_for(std::chrono::microseconds(10));
  }
  die("no completion");
}

}  // namespace wire_peer
