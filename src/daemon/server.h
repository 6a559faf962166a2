// server.h: softverbsd's event loop: accepts clients on the control socket,
// checks their credentials, decodes and validates each request, calls the
// registry and sends the reply. A client whose connection closes is removed
// and everything it held is released.
//
// Contract: single-threaded; run() returns when idle for idle_seconds (no
// clients) or on SIGTERM/SIGINT.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "daemon/cm_gateway.h"
#include "daemon/registry.h"
#include "daemon/roce_port.h"

namespace sv::daemon {

class Server {
 public:
  // `system`: the host-wide daemon (run as root) that serves every user; its
  // directory is world-searchable and its socket world-writable.
  explicit Server(std::string dir, int idle_seconds, bool system = false)
      : dir_(std::move(dir)), idle_seconds_(idle_seconds), system_(system) {}
  int start();  // takes the lock, binds the socket; EALREADY if another daemon runs
  int run();

  // Handles one raw request from `client` (exposed for tests and fuzzing).
  // Returns the reply length written to `out` and fills `out_fds`.
  size_t handle(uint32_t client, const uint8_t* msg, size_t len, std::vector<Fd>& in_fds,
                uint8_t* out, std::vector<int>& out_fds);
  Registry& registry() { return registry_; }

 private:
  void accept_clients();
  void serve(int fd);
  void drop(int fd);
  void remove_stale_rendezvous();
  void send_events();

  std::string dir_;
  int idle_seconds_;
  bool system_;
  Registry registry_;
  RocePort roce_;  // UDP 4791, when RoCEv2 is enabled
  CmGateway cm_;   // the CM's MADs on QP1, with RoCEv2
  Fd lock_fd_;
  Fd listen_fd_;
  Fd epoll_fd_;
  struct Conn {
    uint32_t client;
    Fd sock;
  };
  std::map<int, Conn> conns_;
};

}  // namespace sv::daemon
