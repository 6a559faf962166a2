// attack.h: what the trust-boundary tests (tests/security/) share. Each test
// is an attack: root's programs and a hostile second user (nobody, 65534)
// against a private system daemon (softverbsd --system in a private
// directory, as root runs it in /run/softverbs), in real processes.
//
// Processes are forked when a test constructs its Child, before this
// process starts the library's threads (TSan cannot follow a fork taken
// while other threads run); the child waits for start() and then runs its
// body, as nobody if asked.
#pragma once

#include <infiniband/verbs.h>
#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "common/protocol.h"
#include "common/sys.h"

namespace svsec {

constexpr uid_t kNobody = 65534;

// build/bin/<name> beside this test binary's build/tests/.
std::string build_bin(const char* name);
// Exit status, or 128 + signal.
int wait_for(pid_t pid);
// The first device, opened (nullptr on failure).
ibv_context* open_dev();
// Drops this process to nobody:nogroup; false on failure.
bool become_nobody();

// A memfd of `len` bytes sealed as the daemon requires of a backing
// (F_SEAL_SHRINK | F_SEAL_SEAL: nobody can pull it from under a mapping), for
// raw clients that register memory without the library; -1 on failure.
int sealed_backing(size_t len);

// A connected RC QP of the library, as the tests' programs set one up:
// RESET -> INIT with these remote access flags; INIT -> RTR -> RTS towards
// `dest` on sv0 port 1, GID 0. 0 or the errno of ibv_modify_qp.
int qp_to_init(ibv_qp* qp, int access);
int qp_to_rts(ibv_context* c, ibv_qp* qp, uint32_t dest);

// One process's end of a connected pair: a context, PD, CQ and RC QP in
// INIT with remote read, write and atomics allowed (open()); post() sends
// one signalled request (FETCH_AND_ADD adds 1) and returns its completion
// status, or -1.
struct RcEnd {
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  ibv_cq* cq = nullptr;
  ibv_qp* qp = nullptr;
  bool open();
  int post(ibv_wr_opcode op, void* local, uint32_t len, uint32_t lkey, uint64_t raddr, uint32_t rkey);
  void close();  // the QP, CQ, PD and context (its MRs deregistered first by the caller)
};

class RawConn;
// Hello on a raw connection (the device segment it answers with dropped); true if answered 0.
bool raw_hello(RawConn& raw);
// A process's CPU time so far (utime + stime of /proc/PID/stat), in clock ticks; -1 if unreadable.
long cpu_ticks_of(pid_t pid);

// Two RC QPs of one raw connection pointed at each other (RTR) and one MR of
// `len` bytes at `mr_offset` of a sealed backing with `tail` more bytes after
// it: what a hostile client needs to make the daemon copy with Mediate (it
// carries out any connected pair's operations). Fills `req` with an RDMA
// WRITE of the whole MR onto itself; the backing's descriptor in *memfd.
// The MR's handle in *mr_handle when asked for.
bool raw_mediated_pair(RawConn& raw, uint64_t len, sv::proto::MediateReq& req, sv::Fd* memfd = nullptr,
                       uint64_t mr_offset = 0, uint64_t tail = 0, uint32_t* mr_handle = nullptr,
                       uint32_t extra_access = 0);

// A private system daemon for the life of the object; the environment points
// this process and the children forked after it at that daemon.
struct SystemDaemon {
  std::string dir;
  pid_t pid = -1;
  SystemDaemon();
  // Calls before_start(dir) once the directory exists and before the daemon
  // is started in it (an attacker already waiting there).
  explicit SystemDaemon(const std::function<void(const std::string& dir)>& before_start);
  ~SystemDaemon();
  bool alive() const;
  std::string socket() const { return dir + "/control"; }
};

// A child process: forked now, runs body(sock) after start(), as nobody when
// `as_nobody`; its exit code is body's result. sock() is the parent's end of
// a socketpair with the child's `sock` (SCM_RIGHTS capable).
class Child {
 public:
  Child(bool as_nobody, std::function<int(int sock)> body);
  ~Child();
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;
  void start();
  int sock() const { return sock_; }
  pid_t pid() const { return pid_; }
  int wait();  // closes sock(), waits, returns the exit status
 private:
  pid_t pid_ = -1;
  int sock_ = -1;
};

// Plain values and descriptors over a child's socketpair.
bool send_bytes(int sock, const void* p, size_t n, std::span<const int> fds = {});
bool recv_bytes(int sock, void* p, size_t n, std::vector<sv::Fd>* fds = nullptr);
template <class T>
bool send_val(int sock, const T& v, std::span<const int> fds = {}) {
  return send_bytes(sock, &v, sizeof(v), fds);
}
template <class T>
bool recv_val(int sock, T& v, std::vector<sv::Fd>* fds = nullptr) {
  return recv_bytes(sock, &v, sizeof(v), fds);
}

// A raw control connection to a daemon's socket, speaking the protocol
// directly (what a hostile client writes, not what the library would send).
class RawConn {
 public:
  explicit RawConn(const std::string& socket_path);
  bool ok() const { return sock_.valid(); }
  int fd() const { return sock_.get(); }
  // Sends `len` bytes with `fds`; returns the reply's status, -1 if the
  // daemon hung up (having said why, proto::Op::Refused, or not). The reply (up to reply_len bytes) and its descriptors
  // are stored when asked for.
  int send_raw(const void* msg, size_t len, std::span<const int> fds = {}, std::vector<sv::Fd>* got = nullptr,
               void* reply = nullptr, size_t reply_len = 0);
  template <class Req, class Rep>
  int call(sv::proto::Op op, Req& r, Rep& rep, std::span<const int> fds = {}, std::vector<sv::Fd>* got = nullptr) {
    sv::proto::init_header(r, op, ++seq_);
    return send_raw(&r, sizeof(r), fds, got, &rep, sizeof(rep));
  }
  template <class Req>
  int call(sv::proto::Op op, Req& r, std::span<const int> fds = {}, std::vector<sv::Fd>* got = nullptr) {
    sv::proto::Empty rep{};
    return call(op, r, rep, fds, got);
  }

 private:
  sv::Fd sock_;
  uint32_t seq_ = 0;
};

}  // namespace svsec
