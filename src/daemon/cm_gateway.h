// cm_gateway.h: the daemon as its host's IB connection manager agent on the
// RoCEv2 wire (docs/RDMACM.md, "Between hosts"), as the kernel is on Linux.
//
// The drop-in librdmacm connects ids of one host to each other over unix
// sockets carrying the CM's MADs (src/rdmacm/cm_rendezvous.cc). For a destination on
// another host it connects instead to this gateway ($DIR/cm-gateway) and
// sends the same MADs; the gateway sends them as RoCEv2 UD datagrams to the
// remote host's QP1 (GSI, IBTA 13.5: BTH to QP 1, DETH Q_Key 0x80010000 from
// QP 1, P_Key 0xffff, ICRC), retransmits the ones that expect an answer
// (REQ, REP, DREQ, SIDR_REQ) and answers duplicates. MADs arriving on QP1
// (RocePort hands them over) are matched to a connection by comm ID; a new
// REQ / SIDR_REQ is relayed to the local listener's rendezvous socket
// ($DIR/cm/<ps>-<port>-<addr>) as a local rdma_connect would be, or, if
// nobody listens there within kNoListenerGrace, rejected (IBTA 12.6.7.2
// reason 8, "invalid service ID").
//
// Contract: single-threaded (the daemon's loop). fd() is one epoll fd (its
// own sockets and timer inside) for the daemon's loop; run() handles what is
// ready. Nothing arriving from the wire is trusted: MADs are size-checked
// and decoded by cm_msg, whose decoders never read past 256 bytes.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/sys.h"
#include "rdmacm/cm_msg.h"

namespace sv::daemon {

class CmGateway {
 public:
  // Listens on dir/cm-gateway; the listeners' rendezvous is dir/cm.
  // Returns 0 or an errno. SOFTVERBS_CM_RETRY_MS (default 1000) and
  // SOFTVERBS_CM_RETRIES (default 15, as Linux's rdma_cm) set the
  // retransmission of REQ, REP and DREQ; SOFTVERBS_CM_DROP_EVERY=N (tests)
  // loses every Nth MAD sent. `mode`: the gateway socket's (0666 in the
  // system daemon), set before it appears.
  int open(const std::string& dir, mode_t mode = 0);
  int fd() const { return ep_.get(); }
  void run();
  // One UDP payload (BTH .. ICRC) for QPN 1 that arrived on RoCE socket
  // `sock` (bound to the local address) from `from`.
  void deliver(int sock, const sockaddr* from, socklen_t from_len, const uint8_t* data, size_t n);

  struct Stats {
    uint64_t sent = 0, received = 0, retransmitted = 0, duplicates = 0, bad = 0, rejected_no_listener = 0;
  };
  const Stats& stats() const { return stats_; }

 private:
  using Clock = std::chrono::steady_clock;
  struct Conn {
    int fd = -1;          // the library's end (-1: it closed)
    bool active = false;  // our side sent the REQ / SIDR_REQ
    bool sidr = false;
    bool established = false, ended = false;
    sockaddr_storage local{}, remote{};  // IP addresses (remote at port 4791)
    uint32_t local_id = 0, remote_id = 0;  // comm IDs (SIDR: the request ID)
    uint8_t last_out[256] = {};
    bool has_out = false;
    uint16_t last_in_attr = 0;
    uint16_t awaiting = 0;  // attribute being retransmitted until answered
    int retries_left = 0;
    Clock::time_point due{};
    Clock::time_point linger_until{};  // closed: answer duplicates until then
  };

  void accept_lib();
  void from_lib(uint64_t key);
  void lib_closed(uint64_t key);
  void on_timer();
  void arm();
  void send_wire(Conn& c, const uint8_t* mad, bool remember);
  void send_raw(const sockaddr_storage& local, const sockaddr_storage& remote, const uint8_t* mad);
  void await(Conn& c, uint16_t attr);
  // A REQ / SIDR_REQ for which no listener exists yet waits for one (see
  // kNoListenerGrace); a duplicate of it meanwhile is dropped.
  struct Parked {
    sockaddr_storage local{}, remote{};
    uint8_t mad[cm::kMadSize] = {};
    cm::Msg msg;                  // mad, decoded
    uint32_t request_id = 0;      // the REQ's local comm ID, the SIDR_REQ's request ID
    Clock::time_point until{};    // rejected then
    Clock::time_point recheck{};  // looked for its listener again then
  };
  static constexpr auto kNoListenerGrace = std::chrono::milliseconds(50);
  static constexpr auto kNoListenerRecheck = std::chrono::milliseconds(5);
  static constexpr size_t kMaxParked = 256;  // beyond: rejected at once (a flood of REQs)
  // Relays the request to its listener, parks it, or rejects it.
  void new_request(const sockaddr_storage& local, const sockaddr_storage& remote, const uint8_t* mad,
                   const cm::Msg& m, Clock::time_point until);
  int listener_fd(const cm::Msg& m);
  void from_wire(Conn& c, const uint8_t* mad, const cm::Msg& m);
  int udp_socket_for(const sockaddr_storage& local, uint16_t* port);
  void close_lib(Conn& c);
  void erase(uint64_t key);
  Conn* find_by_local_id(uint32_t id, const sockaddr_storage& remote);

  std::string dir_;
  Fd ep_, listen_, timer_;
  std::map<uint64_t, std::unique_ptr<Conn>> conns_;
  std::vector<Parked> parked_;
  std::map<int, uint64_t> by_fd_;  // library fds -> key
  uint64_t next_key_ = 1;
  std::map<std::string, std::pair<Fd, uint16_t>> udp_;  // local address -> socket, its port
  uint32_t psn_ = 0;
  std::chrono::milliseconds retry_{1000};
  int retries_ = 15;
  int drop_every_ = 0;  // SOFTVERBS_CM_DROP_EVERY (tests): lose every Nth MAD sent
  uint64_t sent_count_ = 0;
  Stats stats_;
};

}  // namespace sv::daemon
