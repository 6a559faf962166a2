// The library's side of the control protocol: connecting to the user's
// daemon, starting it on demand, and synchronous request/reply calls.
#include <dlfcn.h>
#include <poll.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/paths.h"
#include "common/trace.h"
#include "verbs/provider.h"

namespace sv::verbs {
namespace {

constexpr uint64_t kReplySpinNs = 50'000;

std::string library_dir() {
  Dl_info info{};
  if (::dladdr(reinterpret_cast<void*>(&library_dir), &info) == 0 || !info.dli_fname) return ".";
  std::string p = info.dli_fname;
  auto slash = p.rfind('/');
  return slash == std::string::npos ? "." : p.substr(0, slash);
}

// $SOFTVERBSD, else the daemon beside this library: where `cmake --install`
// puts it relative to the private library directory (SOFTVERBS_LIB_TO_DAEMON,
// from the install layout, so DESTDIR and moved prefixes work), the build
// tree's bin/, or PATH.
std::string find_daemon() {
  if (const char* e = std::getenv("SOFTVERBSD"); e && *e) return e;
  std::string dir = library_dir();
#ifdef SOFTVERBS_LIB_TO_DAEMON
  if (std::string c = dir + "/" SOFTVERBS_LIB_TO_DAEMON; ::access(c.c_str(), X_OK) == 0) return c;
#endif
  for (const char* rel : {"/../bin/softverbsd", "/softverbsd", "/../libexec/softverbs/softverbsd",
                          "/../../bin/softverbsd"}) {
    std::string c = dir + rel;
    if (::access(c.c_str(), X_OK) == 0) return c;
  }
  return "softverbsd";  // rely on PATH
}

// Starts the daemon for `dir` as a grandchild so that it is never our child
// to reap, with no descriptor of ours open.
void spawn_daemon(const std::string& dir) {
  std::string path = find_daemon();
  // The daemon gets the application's environment but its preloads: a
  // library preloaded into the application (rdma-core's librspreload.so,
  // which turns sockets into rsockets; stdbuf's) would take over the
  // daemon's own sockets and files. librspreload in a process starting the
  // daemon made every start fail, each retried, for ten seconds. Built
  // before the fork: the child of a threaded process calls nothing but
  // fork, close_range, exec and _exit.
  std::vector<char*> envp;
  for (char** e = environ; e && *e; ++e)
    if (std::strncmp(*e, "LD_PRELOAD=", 11) != 0) envp.push_back(*e);
  envp.push_back(nullptr);
  pid_t child = ::fork();
  if (child < 0) return;
  if (child == 0) {
    pid_t grandchild = ::fork();
    if (grandchild == 0) {
      ::syscall(SYS_close_range, 3u, ~0u, 0u);
      char* argv[] = {const_cast<char*>("softverbsd"), const_cast<char*>("--dir"), const_cast<char*>(dir.c_str()),
                      nullptr};
      if (path.find('/') != std::string::npos) ::execve(path.c_str(), argv, envp.data());
      else ::execvpe(path.c_str(), argv, envp.data());
      ::_exit(127);
    }
    ::_exit(0);
  }
  int status;
  while (::waitpid(child, &status, 0) < 0 && errno == EINTR) {
  }
}

}  // namespace

// The daemon of this process (common/paths.h). SOFTVERBS_DIR or the system
// daemon: that directory's, unchecked. Otherwise the daemon must serve our
// network namespace (proto::Op::Netns; EXDEV: another's):
//   1. a daemon that answers in BASE, if it serves ours (a socket-activated
//      one too: the user unit listens there);
//   2. else, with none answering in BASE, the directory BASE's record
//      chooses (BASE if it names no other namespace), started if need be;
//   3. a daemon of another namespace found on the way: our namespace's
//      directory, BASE/net-INODE-DEV, instead.
int DaemonConn::open() {
  const bool system = use_system_daemon();
  std::string why;
  if (system || runtime_dir_explicit()) {
    RunDir d;
    int e = system ? open_dir(system_dir(), DirRule::SystemClient, false, d, &why)
                   : open_dir(runtime_dir(), DirRule::User, true, d, &why);
    if (e) {
      if (system && e == ENOENT) why += " (no system daemon runs; as root: softverbsd --system)";
      say_dir_problem(why);
      return e;
    }
    e = connect_dir(d, system, true);
    if (e == 0) dir_ = d.path;
    return e;
  }
  // Each directory is opened and checked once, then used only through its
  // descriptor (common/paths.h); one that fails is not looked into.
  const NetnsId self = netns_self();
  RunDir base, mine;
  if (int e = open_dir(runtime_base_dir(), DirRule::User, true, base, &why)) {
    say_dir_problem(why);
    return e;
  }
  const RunDir* dir = &base;
  NetnsId recorded;
  if (connect_dir(base, false, false) != 0 && read_netns_record(base, &recorded) && !(recorded == self)) dir = &mine;
  for (;;) {
    if (dir == &mine && !mine.valid()) {
      if (int e = open_subdir(base, netns_dir_name(self), true, mine, &why)) {
        say_dir_problem(why);
        return e;
      }
    }
    if (!sock_.valid()) {
      if (int e = connect_dir(*dir, false, true)) return e;
    }
    proto::NetnsMsg req{};
    req.dev = self.dev;
    req.ino = self.ino;
    proto::NetnsMsg rep{};
    // Another error than EXDEV: a daemon older than the check (EOPNOTSUPP),
    // or one gone (the next call says so).
    if (const int r = call<proto::Op::Netns>(req, rep); r != EXDEV) {
      if (r == EPERM || r == EMFILE) return r;  // refused (take_refusal said why)
      break;
    }
    sock_.reset();
    if (dir == &mine) {  // our own namespace's directory serves another: refuse it
      say_dir_problem("the daemon in " + mine.path + " serves network namespace " + netns_text({rep.dev, rep.ino}) +
                      ", not this process's " + netns_text(self) + ": stop that daemon");
      return EXDEV;
    }
    SV_TRACE("verbs: the daemon in %s serves %s, not this process's %s: using %s", base.path.c_str(),
             netns_text({rep.dev, rep.ino}).c_str(), netns_text(self).c_str(),
             netns_dir(base.path, self).c_str());
    dir = &mine;
  }
  dir_ = dir->path;
  return 0;
}

// Why no daemon answers in `dir`, in words with what to do (said once).
static void say_no_daemon(const std::string& dir, bool system) {
  if (system) {
    say_dir_problem("no system daemon answers in " + dir +
                    " (as root: softverbsd --system, or systemctl enable --now softverbsd.socket)");
    return;
  }
  if (std::getenv("SOFTVERBS_NO_SPAWN")) {
    say_dir_problem("no daemon answers in " + dir + " and SOFTVERBS_NO_SPAWN is set: start one (softverbsd --dir " +
                    dir + ") or unset it");
    return;
  }
  const std::string path = find_daemon();
  if (path.find('/') != std::string::npos && ::access(path.c_str(), X_OK) != 0) {
    say_dir_problem("the daemon for " + dir + " could not be started: " + path + ": " + std::strerror(errno) +
                    (std::getenv("SOFTVERBSD") ? " (SOFTVERBSD)" : " (is softverbs installed whole?)"));
    return;
  }
  say_dir_problem("no daemon answered in " + dir + " within 10 s of starting " + path + "; its log: " + dir +
                  "/daemon.log");
}

// Connects to the daemon of `dir` (open and checked), starting it there if
// none answers (and `may_start`; else ENOENT or ECONNREFUSED at once).
int DaemonConn::connect_dir(const RunDir& dir, bool system, bool may_start) {
  // SOFTVERBS_SYSTEM=1: the host-wide daemon, which an administrator runs;
  // it is never started from here.
  bool spawned = system;
  uint64_t last_spawn = 0;
  uint64_t deadline = monotonic_ns() + 10'000'000'000ull;
  for (;;) {
    int e = connect_in(dir, sock_);
    if (e == 0) {
      dir_ = dir.path;  // for messages until open() settles on it
      owner_pid_ = self_pid();
      // A daemon that stops answering must not hang the application forever.
      timeval tv{30, 0};
      ::setsockopt(sock_.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
      return 0;
    }
    if (e == EPERM)
      say_dir_problem(dir.path + "/control is served by a process that does not run as the directory's owner (uid " +
                      std::to_string(dir.owner) + "): not used; stop that process and remove the socket");
    if (e != ENOENT && e != ECONNREFUSED) return e;
    if (!may_start) return e;
    // No system daemon runs (no socket, or a stale one for over a second;
    // a daemon that is starting has bound but may not listen yet).
    if (system && (e == ENOENT || monotonic_ns() > deadline - 9'000'000'000ull)) {
      say_no_daemon(dir.path, true);
      return ENODEV;
    }
    // Started again every half second: a daemon started while the previous
    // one is still on its way out (idle exit, or killed) finds its lock
    // taken and exits at once. It opens and checks the directory itself.
    if ((!spawned || monotonic_ns() > last_spawn + 500'000'000ull) && !system &&
        !std::getenv("SOFTVERBS_NO_SPAWN")) {
      // A daemon that cannot be started is said at once, not after the wait.
      if (const std::string path = find_daemon(); path.find('/') != std::string::npos && ::access(path.c_str(), X_OK) != 0) {
        say_no_daemon(dir.path, false);
        return ENODEV;
      }
      spawn_daemon(dir.path);
      spawned = true;
      last_spawn = monotonic_ns();
    }
    if (monotonic_ns() > deadline) {
      say_no_daemon(dir.path, false);
      return ENODEV;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

namespace {

std::atomic<bool> g_said_refused{false};

std::string own_pid_namespace() {
  char link[64];
  const ssize_t n = ::readlink("/proc/self/ns/pid", link, sizeof link - 1);
  return n > 0 ? std::string(link, size_t(n)) : std::string("(unknown)");
}

// The daemon's reason (proto::RefusedMsg), in words with what to do.
void say_refused(const proto::RefusedMsg& m, const std::string& dir) {
  const std::string who = "softverbs: the daemon in " + (dir.empty() ? std::string("its directory") : dir) +
                          " refused this process: ";
  switch (m.reason) {
    case proto::kRefusedPidNamespace:
      std::fprintf(stderr,
                   "%sit is in pid namespace %s, the daemon serves pid:[%llu] (a container, or unshare -p); a daemon "
                   "serves only its own pid namespace's processes: give this one a daemon of its own (set "
                   "SOFTVERBS_DIR to an empty directory of its own, mode 0700; docs/CONTAINERS.md); softverbs doctor checks the set-up\n",
                   who.c_str(), own_pid_namespace().c_str(), static_cast<unsigned long long>(m.mine));
      break;
    case proto::kRefusedUser:
      std::fprintf(stderr,
                   "%sit runs as uid %llu, the daemon is uid %llu's and serves no other user; leave SOFTVERBS_DIR "
                   "unset for a daemon of this user's own, or use the system daemon (SOFTVERBS_SYSTEM=1); softverbs doctor checks the set-up\n",
                   who.c_str(), static_cast<unsigned long long>(m.theirs), static_cast<unsigned long long>(m.mine));
      break;
    case proto::kRefusedConnections:
      std::fprintf(stderr,
                   "%sthis user's quota of connections is reached (one per open device context); close some, or "
                   "raise SOFTVERBSD_QUOTA_CONNECTION for the daemon; softverbs doctor checks the set-up\n",
                   who.c_str());
      break;
    case proto::kRefusedUnmappedUser:
      std::fprintf(stderr,
                   "%sthe daemon runs in a user namespace that cannot name this process's user (it sees uid %llu); "
                   "stop that daemon and let a program outside that namespace start it; softverbs doctor checks the set-up\n",
                   who.c_str(), static_cast<unsigned long long>(m.theirs));
      break;
    default:
      std::fprintf(stderr, "%s%s (reason %u; see softverbs status); softverbs doctor checks the set-up\n", who.c_str(),
                   std::strerror(m.h.status > 0 ? m.h.status : EPERM), unsigned(m.reason));
  }
}

}  // namespace

// The daemon's Refused message in `buf` (a message of `len` bytes, seq 0),
// said once per process: the errno it carries (EPERM if none); 0 if the
// message is not one.
int DaemonConn::take_refusal(const uint8_t* buf, size_t len) const {
  proto::Header h;
  if (len < sizeof h) return 0;
  std::memcpy(&h, buf, sizeof h);
  if (h.magic != proto::kMagic || h.op != uint16_t(proto::Op::Refused) || h.seq != 0) return 0;
  proto::RefusedMsg m{};
  std::memcpy(&m, buf, std::min(len, sizeof m));
  if (!g_said_refused.exchange(true)) say_refused(m, dir_);
  return m.h.status > 0 && m.h.status < 4096 ? m.h.status : EPERM;
}

// A daemon closes a connection before its first answer only when it will
// not serve the process at all; it says why first (proto::Op::Refused),
// which is said here once per process, as providers warn. A daemon that
// did not say: one of another pid namespace (docs/SECURITY.md, row 12).
int DaemonConn::refused(int e, uint32_t seq) const {
  if (seq != 1 || (e != ECONNRESET && e != ENODEV)) return e;
  alignas(8) uint8_t buf[proto::kMaxMessage];
  const ssize_t n = ::recv(sock_.get(), buf, sizeof buf, MSG_DONTWAIT);
  if (n > 0) {
    if (int r = take_refusal(buf, size_t(n))) return r;
  }
  // The daemon is outside this process's pid namespace when the kernel has
  // no pid for it here (SO_PEERCRED's pid is 0, socket(7)).
  PeerCred daemon{};
  if (peer_credentials(sock_.get(), daemon) == 0 && daemon.pid == 0 && !g_said_refused.exchange(true))
    std::fprintf(stderr,
                 "softverbs: the daemon closed the connection before answering: a daemon serves only processes of "
                 "its own pid namespace; give this one its own (docs/CONTAINERS.md); softverbs doctor checks the set-up\n");
  return e;
}

// With mu_ held: numbers request `req` and sends it (both raw_post and
// raw_call), after re-attaching a forked child.
int DaemonConn::send_locked(void* req, size_t req_len, std::span<const int> send_fds) {
  if (failed_.load(std::memory_order_relaxed)) return EIO;
  if (!sock_.valid()) return ENODEV;
  if (owner_pid_ != self_pid()) {
    if (int e = reattach_after_fork()) return e;
  }
  auto* h = static_cast<proto::Header*>(req);
  h->seq = ++seq_;
  if (int e = send_message(sock_.get(), req, req_len, send_fds)) return refused(e == EPIPE ? ENODEV : e, h->seq);
  return 0;
}

// Pipelined requests go into the connection's request ring once the daemon
// has given one (its first use asks for it), else on the socket. The daemon
// takes what waits in the ring before the next request on the socket, so
// the connection's order holds either way.
void DaemonConn::fail_device() {
  failed_.store(true);
  ::shutdown(sock_.get(), SHUT_RDWR);
}

int DaemonConn::raw_post(void* req, size_t req_len) {
  std::lock_guard<std::mutex> g(mu_);
  if (failed_.load(std::memory_order_relaxed)) return EIO;
  if (!sock_.valid()) return ENODEV;
  if (owner_pid_ != self_pid()) {
    if (int e = reattach_after_fork()) return e;
  }
  if (!ring_ && !ring_refused_) open_ring_locked();
  if (ring_ && req_len == sizeof(proto::MediateReq)) return ring_push_locked(req, req_len);
  return send_locked(req, req_len, {});
}

void DaemonConn::open_ring_locked() {
  proto::Empty req{};
  proto::init_header(req, proto::Op::PostRing);
  proto::PostRingReply rep{};
  std::vector<Fd> fds;
  ring_refused_ = true;  // unless all of it goes well
  if (raw_call_locked(&req, sizeof req, &rep, sizeof rep, {}, &fds, nullptr) != 0 || fds.size() != 2) return;
  if (rep.capacity == 0 || rep.slot_size != sizeof(proto::MediateReq) ||
      rep.size < proto::kPostRingHeaderSize + uint64_t(rep.capacity) * rep.slot_size || rep.size > (64u << 20))
    return;
  auto r = std::make_unique<PostRing>();
  if (map_shared(fds[0].get(), 0, size_t(rep.size), PROT_READ | PROT_WRITE, true, r->map) != 0) return;
  r->hdr = r->map.as<proto::PostRingHeader>();
  if (r->hdr->magic != proto::kPostRingMagic) return;
  r->slots = r->map.as<uint8_t>() + proto::kPostRingHeaderSize;
  r->capacity = rep.capacity;
  r->efd = std::move(fds[1]);
  ring_ = std::move(r);
  ring_refused_ = false;
}

// Waits for room (the daemon takes requests whatever this connection's
// socket does), writes the slot, then the tail; wakes the daemon if it said
// it might sleep (post_ring.h: its flag against our tail).
int DaemonConn::ring_push_locked(const void* req, size_t req_len) {
  PostRing& r = *ring_;
  auto* h = static_cast<proto::Header*>(const_cast<void*>(req));
  h->seq = ++seq_;
  if (r.tail - r.hdr->head.load(std::memory_order_acquire) >= r.capacity) {
    const uint64_t until = monotonic_ns() + 30'000'000'000ull;  // as a control call waits
    for (uint32_t spins = 0; r.tail - r.hdr->head.load(std::memory_order_acquire) >= r.capacity; ++spins) {
      if (monotonic_ns() > until) return ETIMEDOUT;
      if (spins % 1024 == 1023) {
        pollfd p{sock_.get(), POLLIN, 0};
        if (::poll(&p, 1, 0) == 1 && (p.revents & (POLLHUP | POLLERR))) return ENODEV;  // the daemon is gone
        ::sched_yield();
      }
      __builtin_ia32_pause();
    }
  }
  std::memcpy(r.slots + (r.tail % r.capacity) * sizeof(proto::MediateReq), req, req_len);
  // Both seq_cst, as the daemon's store of `wake` and its load of the
  // tail: either it sees this tail or we see its flag.
  r.hdr->tail.store(++r.tail, std::memory_order_seq_cst);
  if (r.hdr->wake.load(std::memory_order_seq_cst)) {
    wake_signal(r.efd.get());
    // The daemon slept: it sleeps between requests when the CPUs are
    // oversubscribed (Server::spin_contended), and the wake-up often puts
    // it on this CPU, behind this thread. Give it the CPU now: the caller
    // will spin for the outcome anyway. With an idle CPU, the daemon runs
    // there and this returns at once.
    ::sched_yield();
  }
  return 0;
}

int DaemonConn::raw_call(void* req, size_t req_len, void* rep, size_t rep_len,
                         std::span<const int> send_fds, std::vector<Fd>* recv_fds, const Work* work) {
  std::lock_guard<std::mutex> g(mu_);
  return raw_call_locked(req, req_len, rep, rep_len, send_fds, recv_fds, work);
}

int DaemonConn::raw_call_locked(void* req, size_t req_len, void* rep, size_t rep_len,
                                std::span<const int> send_fds, std::vector<Fd>* recv_fds, const Work* work) {
  if (int e = send_locked(req, req_len, send_fds)) return e;
  if (work) *work->result = work->run(work->ctx);
  return recv_reply_locked(static_cast<proto::Header*>(req)->seq, rep, rep_len, recv_fds, nullptr);
}

int DaemonConn::recv_reply_locked(uint32_t seq, void* rep, size_t rep_len, std::vector<Fd>* recv_fds, bool* broken) {
  alignas(8) uint8_t buf[proto::kMaxMessage];
  std::vector<Fd> fds;
  size_t len = 0;
  proto::Header rh;
  for (;;) {
    // A blocking wake-up across vCPUs costs tens of microseconds on a VM
    // (docs/PERFORMANCE.md); the daemon usually answers faster than that,
    // so spin briefly before sleeping in recvmsg.
    for (uint64_t until = monotonic_ns() + kReplySpinNs; monotonic_ns() < until;) {
      pollfd p{sock_.get(), POLLIN, 0};
      if (::poll(&p, 1, 0) == 1) break;
      __builtin_ia32_pause();
    }
    if (int e = recv_message(sock_.get(), buf, sizeof(buf), &len, fds)) {
      if (broken) *broken = true;
      return refused(e == EAGAIN ? ETIMEDOUT : e, seq);
    }
    if (broken) *broken = len < sizeof(proto::Header);
    if (len == 0) return refused(ENODEV, seq);  // the daemon went away
    if (len < sizeof(proto::Header)) return EPROTO;
    if (int r = take_refusal(buf, len)) {
      if (broken) *broken = true;
      return r;
    }
    if (dispatch_event(buf, len)) continue;
    // A reply to an earlier request of this connection: one whose caller
    // stopped waiting (ETIMEDOUT), answered late by a daemon held up (a
    // loaded machine). The daemon answers in order, so ours follows it;
    // taken as ours, it would put every later call one reply out of step.
    std::memcpy(&rh, buf, sizeof(rh));
    if (rh.magic == proto::kMagic && rh.seq != seq && int32_t(rh.seq - seq) < 0) {
      SV_TRACE("verbs: a late reply (seq %u, op %u) dropped while waiting for seq %u", unsigned(rh.seq),
               unsigned(rh.op), unsigned(seq));
      continue;
    }
    break;  // our reply
  }
  std::memcpy(&rh, buf, sizeof(rh));
  if (rh.magic != proto::kMagic || rh.seq != seq) {
    if (broken) *broken = true;  // out of step: what follows cannot be matched
    return EPROTO;
  }
  if (rh.status != 0) return rh.status;
  if (len != rep_len) return EPROTO;
  std::memcpy(rep, buf, rep_len);
  if (recv_fds) *recv_fds = std::move(fds);
  return 0;
}

// All sent, then all answered: a request the daemon refuses does not stop
// the ones after it (they were sent already), so every reply is read. A
// send that fails stops the sending; the replies to what went are still
// read (the first one of a refused connection says why: refused()).
int DaemonConn::call_batch(std::span<Batched> calls) {
  std::lock_guard<std::mutex> g(mu_);
  size_t sent = 0;
  int send_error = 0;
  for (Batched& c : calls) {
    if ((send_error = send_locked(c.req, c.req_len, c.send_fds)) != 0) break;
    ++sent;
  }
  bool broken = false;
  for (size_t i = 0; i < calls.size(); ++i) {
    Batched& c = calls[i];
    if (i >= sent || broken) {
      c.status = i == sent && send_error ? send_error : ENODEV;  // never sent, or its reply cannot come
      continue;
    }
    std::vector<Fd> fds;
    c.status = recv_reply_locked(static_cast<proto::Header*>(c.req)->seq, c.rep, c.rep_len, &fds, &broken);
    if (c.status == 0 && !c.matches(c.rep, fds.size())) c.status = EPROTO;
    if (c.status == 0 && c.recv_fds) *c.recv_fds = std::move(fds);
  }
  for (const Batched& c : calls)
    if (c.status != 0 && !c.optional) return c.status;
  return 0;
}

// A forked child inherits its parent's socket: a reply would go to whichever
// of them reads first (several children allocating at once, as rdma-core's
// test_multi_process_alloc_dm does, got each other's replies). The child
// opens its own connection and joins the context through the inherited
// socket, as ibv_import_device does (the parent claimed that socket), so it
// works on the same objects as equals. Called with mu_ held.
int DaemonConn::reattach_after_fork() {
  DaemonConn fresh;
  if (int e = fresh.open()) return e;
  proto::Empty req{};
  proto::ClientReply rep{};
  int fds[1] = {sock_.get()};
  if (int e = fresh.call<proto::Op::ImportContext>(req, rep, fds)) return e;
  client_id_ = rep.client_id;
  // The inherited socket stays open but unused here: ibv_context::cmd_fd
  // still names it (another process may import the context through it).
  inherited_ = std::exchange(sock_, std::move(fresh.sock_));
  owner_pid_ = fresh.owner_pid_;
  ring_.reset();  // the parent's; this connection asks for its own
  ring_refused_ = false;
  return 0;
}

uint32_t DaemonConn::client_id() {
  std::lock_guard<std::mutex> g(mu_);
  if (owner_pid_ != self_pid() && reattach_after_fork() != 0) return 0;
  return client_id_;
}

bool DaemonConn::dispatch_event(const uint8_t* buf, size_t len) {
  proto::Header h;
  std::memcpy(&h, buf, sizeof(h));
  if (h.op != uint16_t(proto::Op::AsyncEvent) || h.seq != 0) return false;
  if (len == sizeof(proto::AsyncEventMsg) && on_event) {
    proto::AsyncEventMsg m;
    std::memcpy(&m, buf, sizeof(m));
    on_event(m);
  }
  return true;
}

void DaemonConn::drain_events() {
  std::lock_guard<std::mutex> g(mu_);
  for (;;) {
    pollfd p{sock_.get(), POLLIN, 0};
    if (::poll(&p, 1, 0) != 1 || !(p.revents & POLLIN)) return;
    alignas(8) uint8_t buf[proto::kMaxMessage];
    std::vector<Fd> fds;
    size_t len = 0;
    if (recv_message(sock_.get(), buf, sizeof(buf), &len, fds) || len < sizeof(proto::Header)) return;
    dispatch_event(buf, len);  // nothing else can be waiting: calls hold the lock
  }
}

}  // namespace sv::verbs
