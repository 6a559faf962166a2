// server.h: softverbsd's event loop: accepts clients on the control socket,
// checks their credentials, hands each request to its op's handler through
// the op table's checks (commands.h) and sends the reply. A client whose connection closes is removed
// and everything it held is released.
//
// Contract: single-threaded; run() returns when idle for idle_seconds (no
// clients) or on SIGTERM/SIGINT.
#pragma once

#include <sys/epoll.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <span>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/paths.h"
#include "daemon/cm_gateway.h"
#include "daemon/odp_copies.h"
#include "daemon/post_ring.h"
#include "daemon/registry.h"
#include "daemon/roce_port.h"

namespace sv::daemon {

// Fairness (docs/PROTOCOL.md, "Flow control"): each turn of the loop serves
// at most this many requests of one connection, so that one client's
// pipeline does not hold up the others; a client with this many replies
// waiting for its socket is not read until it reads them (it is slowed,
// not dropped); and at most this many distinct async events wait for one
// client (identical ones are coalesced, so this is only reached by a
// client holding more objects than that, whose further events are lost).
inline constexpr int kRequestsPerTurn = 4;
inline constexpr uint32_t kRingTurnsPerPoll = 8;
inline constexpr size_t kMaxQueuedReplies = 64;
inline constexpr size_t kMaxQueuedEvents = 1 << 16;
// The copy worker moves this much of one user's copy, then turns to the
// next user with a copy waiting.
inline constexpr uint64_t kCopyPiece = 1 << 20;
inline constexpr uint64_t kContendedOffload = 64 << 10;  // copies from this size on go to the worker under contention

class Server {
 public:
  // `system`: the host-wide daemon (run as root) that serves every user; its
  // directory is world-searchable and its socket world-writable.
  explicit Server(std::string dir, int idle_seconds, bool system = false)
      : dir_(std::move(dir)), idle_seconds_(idle_seconds), system_(system) {}
  ~Server();
  int start();  // takes the lock, binds the socket; EALREADY if another daemon runs
  int run();
  // Why start() refused the directory (a sentence), empty if it did not.
  const std::string& dir_problem() const { return dir_problem_; }
  // The directory, open and checked once start() got past it; -1 before.
  int dir_fd() const { return rundir_.fd.get(); }

  // Handles one raw request from `client` (exposed for tests and fuzzing):
  // checks its header, then run_command (commands.h). Returns the reply
  // length written to `out` (0: not answerable, bad magic or version or
  // shorter than a header) and fills `out_fds`.
  size_t handle(uint32_t client, const uint8_t* msg, size_t len, std::vector<Fd>& in_fds,
                uint8_t* out, std::vector<int>& out_fds);
  Registry& registry() { return registry_; }

 private:
  struct Conn;
  void accept_clients();
  bool admitted(int fd, PeerCred& cred, Fd& pidfd);
  bool dispatch(const epoll_event& ev);
  // Serves up to kRequestsPerTurn requests of connection `fd`; true if it
  // read any (or dropped the connection).
  bool serve(int fd);
  int next_request(int fd, Conn& c, uint8_t* in, size_t& len, std::vector<Fd>& fds, bool& ringed);
  void defer_copy(int fd, Conn& conn, const uint8_t* in);
  static size_t malformed(const uint8_t* in, size_t len, uint8_t* out);
  bool fds_admitted(uint32_t client, uint16_t op);
  static size_t refuse(const uint8_t* req, int status, uint8_t* out);
  void drop(int fd);
  static void clear_rendezvous(int cm, const std::string& path);
  void send_events();
  // Output (docs/PROTOCOL.md, "Flow control"): a reply or event that does
  // not fit the client's socket waits in its queue, sent when the socket
  // is writable (EPOLLOUT); a client is never dropped for a full socket.
  // Returns false if the client is gone (the send failed otherwise).
  bool enqueue(int fd, Conn& c, const void* msg, size_t len, std::span<const int> fds, uint64_t event_key);
  void flush(int fd);
  void update_interest(int fd, Conn& c);

  // The copy worker: large mediated copies run off
  // the loop, a piece (kCopyPiece) at a time, round robin between users;
  // the requester's connection is not read meanwhile (its reply, sent when
  // the copy is done, is what it waits for), everyone else is served.
  // Those that touch ODP memory run on threads of their own (odp_copies.h).
  using Copy = MediatedCopy;
  std::unique_ptr<OdpCopies> odp_copies_;
  int open_roce();
  int watch_roce_fd(int fd);
  void sync_mcast();
  void open_cm_gateway();
  bool cm_open_ = false;
  void start_copier();
  void stop_copier();
  void copier_main();
  void copies_done();
  void note_contention(const epoll_event* evs, int n);
  void revoke_copies(uint32_t client, const uint8_t* msg, size_t len);
  void revoke_odp_copies(pid_t pid);
  void revoke_copies_if(const std::function<bool(const MediationJob&)>& hit);
  std::unique_ptr<MediationJob> deferred_;  // set by handle() when a Mediate was deferred
  bool defer_copies_ = false;
  // The loop's spin between requests, and when it yields to sleeping
  // (Server::spin_contended).
  bool spin_contended();
  uint64_t spin_nivcsw_ = 0;           // this thread's involuntary switches, as last read
  uint64_t spin_checked_ns_ = 0;       // when they were read
  uint64_t spin_contended_until_ = 0;  // monotonic ns: no spinning before
  std::thread copier_;
  std::mutex copy_mu_;
  std::condition_variable copy_cv_;
  std::map<uid_t, std::deque<Copy>> copy_queues_;  // by user
  uid_t copy_last_uid_ = 0;
  uint64_t refused_pid_ns_ = 0;  // connections from another pid namespace (accept_clients)
  std::deque<Copy> copies_done_;
  bool copy_stop_ = false;
  MediationJob* copy_current_ = nullptr;  // the job the worker is stepping (under copy_mu_)
  std::condition_variable copy_step_cv_;  // the worker finished a step
  Fd copy_done_fd_;  // eventfd: the worker finished copies (polled by the loop)

  std::string dir_;
  RunDir rundir_;  // dir_, opened and checked: all in it is reached through it
  std::string dir_problem_;
  int idle_seconds_;
  bool system_;
  Registry registry_;
  RocePort roce_;  // UDP 4791, when RoCEv2 is enabled
  uint64_t mcast_generation_ = 0;  // of the groups roce_ listens to
  CmGateway cm_;   // the CM's MADs on QP1, with RoCEv2
  Fd lock_fd_;
  Fd listen_fd_;
  Fd epoll_fd_;
  Fd reserve_fd_;  // given up to accept-and-close a connection at the descriptor limit
  struct Out {
    std::vector<uint8_t> bytes;
    std::vector<Fd> fds;  // duplicates: the registry's may be closed before this is sent
    uint64_t event_key;   // (type << 32 | element) + 1 for an async event, 0 for a reply
    uint64_t fd_key = 0;  // the duplicates' charge (Quotas::charge_fds), when it has some
  };
  static constexpr uint64_t kQueuedFdsKey = uint64_t(1) << 63;  // Quotas keys of queued replies' fds
  uint64_t queued_fds_seq_ = 0;
  struct Conn {
    uint32_t client;
    Fd sock;
    std::deque<Out> out;
    size_t replies_queued = 0;
    std::set<uint64_t> events_queued;  // coalescing: an event already waiting is not queued twice
    uint32_t interest = 0;             // the epoll events asked for now
    bool copying = false;              // a deferred Mediate of this client is on the copy worker
    std::unique_ptr<PostRing> ring;    // its request ring (Op::PostRing), if it asked for one
    Fd wake;                           // the daemon's end of its wake socket (Op::Wake), if it asked for one
  };
  // Each connection's socket by its client id: an event or a finished copy
  // finds its connection without a walk over every connection.
  std::map<uint32_t, int> fd_of_client_;
  Conn* conn_of(uint32_t client, int& fd);
  std::map<int, Conn> conns_;
  // Whether a connection is left unserved for now: kMaxQueuedReplies
  // replies unread (it reads them first: slowed, not dropped), or its
  // Mediate on the copy worker. Neither its socket nor its ring is read.
  static bool held(const Conn& c);
  // Request rings (post_ring.h): each ring's eventfd -> its connection's
  // socket (its wake-up socket's, post_ring.h); the connection being
  // served (for PostRing, -1 otherwise).
  std::map<int, int> ring_efds_;
  // Clients that registered an ODP MR, by the pidfd of their process
  // (watched: readable when the process exits, Registry::odp_owner_gone).
  std::map<int, uint32_t> odp_owners_;
  void watch_odp_owner(uint32_t client);
  int serving_fd_ = -1;
  std::vector<int> ring_ready_;  // scratch for run()
  int open_ring(int fd, proto::PostRingReply& rep, std::vector<int>& out_fds);
  // Op::Wake: a socket pair, one end kept in the connection, the other
  // handed out (held in wake_given_ until the reply carrying it is queued).
  int open_wake(int fd, std::vector<int>& out_fds);
  Fd wake_given_;
  // The processes still attached to `context` take over what process `pid`,
  // which just left it, had queued on its QPs: its pid on each wake socket.
  void wake_sharers(uint32_t context, uint32_t pid);
  // The rings with requests waiting are served; true if any was.
  bool serve_rings();
  // Before a sleep: true if a ring has requests after all (no sleep).
  bool rings_may_sleep();
  void rings_awake();
  void ring_woken(int wake, int conn_fd);
};

}  // namespace sv::daemon
