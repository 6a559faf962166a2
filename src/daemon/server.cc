#include "daemon/server.h"

#include "common/trace.h"

#include <dirent.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "common/paths.h"
#include "daemon/commands.h"
#include "daemon/identity.h"

namespace sv::daemon {

namespace {

volatile sig_atomic_t g_stop = 0;

// Tells a client this daemon will not serve why, before the connection is
// closed (proto::Op::Refused): one message, never waited for (MSG_DONTWAIT
// on a fresh connection, whose buffer has room; a client that never reads
// costs nothing more).
void tell_refused(int fd, uint32_t reason, int status, uint64_t theirs, uint64_t mine) {
  proto::RefusedMsg m{};
  proto::init_header(m, proto::Op::Refused, 0);
  m.h.status = status;
  m.reason = reason;
  m.theirs = theirs;
  m.mine = mine;
  (void)::send(fd, &m, sizeof m, MSG_DONTWAIT | MSG_NOSIGNAL);
}

// The uid a user namespace shows for a uid it does not map
// (/proc/sys/kernel/overflowuid, user_namespaces(7)), when this daemon
// lives in a user namespace other than the initial one (a daemon started
// inside `softverbs run`'s view); otherwise none (-1). SO_PEERCRED gives
// every unmapped user that same uid: such a connection names no one user.
uid_t unmapped_uid() {
  static const uid_t uid = [] {
    if (identity_uid_map(0)) return uid_t(-1);
    unsigned v = 65534;
    if (FILE* f = std::fopen("/proc/sys/kernel/overflowuid", "r")) {
      if (std::fscanf(f, "%u", &v) != 1) v = 65534;
      std::fclose(f);
    }
    return uid_t(v);
  }();
  return uid;
}

void on_signal(int) { g_stop = 1; }

// systemd's socket activation protocol (sd_listen_fds(3)): LISTEN_PID names
// this process and LISTEN_FDS counts the sockets passed from descriptor 3
// on. The first is taken when it is what we would have made ourselves: a
// listening AF_UNIX SOCK_SEQPACKET socket bound to `path` (a unit naming
// another path would leave the library knocking at a socket nobody serves:
// said, and the daemon listens on its own). The variables are removed, so
// that nothing the daemon starts takes them for its own.
bool inherited_listener(const std::string& path, Fd& out) {
  const char* pid = std::getenv("LISTEN_PID");
  const char* fds = std::getenv("LISTEN_FDS");
  const bool ours = pid && fds && std::strtoul(pid, nullptr, 10) == static_cast<unsigned long>(::getpid()) &&
                    std::atoi(fds) >= 1;
  ::unsetenv("LISTEN_PID");
  ::unsetenv("LISTEN_FDS");
  ::unsetenv("LISTEN_FDNAMES");
  if (!ours) return false;
  constexpr int kFirst = 3;  // SD_LISTEN_FDS_START
  Fd fd(kFirst);
  int type = 0, listening = 0;
  socklen_t len = sizeof type;
  sockaddr_un a{};
  socklen_t alen = sizeof a;
  if (::getsockopt(fd.get(), SOL_SOCKET, SO_TYPE, &type, &len) != 0 || type != SOCK_SEQPACKET ||
      (len = sizeof listening, ::getsockopt(fd.get(), SOL_SOCKET, SO_ACCEPTCONN, &listening, &len)) != 0 ||
      !listening || ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&a), &alen) != 0 || a.sun_family != AF_UNIX ||
      path != std::string(a.sun_path, ::strnlen(a.sun_path, sizeof a.sun_path))) {
    std::fprintf(stderr,
                 "softverbsd: the socket systemd passed is not a listening SOCK_SEQPACKET socket at %s "
                 "(ListenSequentialPacket= in softverbsd.socket must name it); listening on our own\n",
                 path.c_str());
    return false;  // closes it
  }
  ::fcntl(fd.get(), F_SETFD, FD_CLOEXEC);
  ::fcntl(fd.get(), F_SETFL, ::fcntl(fd.get(), F_GETFL) | O_NONBLOCK);
  out = std::move(fd);
  return true;
}

}  // namespace

int Server::start() {
  // The directory is opened and checked once; the lock, the record and the
  // socket are made through its descriptor (common/paths.h).
  if (int e = system_ ? open_dir(dir_, DirRule::SystemDaemon, true, rundir_, &dir_problem_)
                      : ensure_runtime_dir(dir_, rundir_, &dir_problem_))
    return e;
  dir_problem_.clear();
  lock_fd_.reset(::openat(rundir_.fd.get(), "daemon.lock", O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!lock_fd_.valid()) return errno;
  if (::flock(lock_fd_.get(), LOCK_EX | LOCK_NB) != 0) return errno == EWOULDBLOCK ? EALREADY : errno;
  // The network namespace served here (common/paths.h): processes of
  // another one choose their own directory by it.
  if (int e = write_netns_record(rundir_, netns_self())) {
    std::fprintf(stderr, "softverbsd: %s not written: %s\n", netns_record_path(dir_).c_str(), std::strerror(e));
  }
  if (int e = registry_.init()) return e;
  // Descriptors: as many as we may have, each user
  // capped to a share of them (quota.h), and one in reserve to refuse a
  // connection with when they are all taken.
  rlimit nofile{};
  if (::getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur < nofile.rlim_max) {
    nofile.rlim_cur = nofile.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &nofile);
  }
  registry_.quotas().configure(system_, nofile.rlim_cur == RLIM_INFINITY ? (1u << 20) : uint64_t(nofile.rlim_cur));
  reserve_fd_.reset(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  // Socket activation (systemd's softverbsd.socket, packaging/systemd): the
  // listening socket is inherited, already bound and with its mode set by
  // the unit; else our own.
  const bool activated = inherited_listener(socket_path(dir_), listen_fd_);
  if (!activated) {
    // The system daemon's socket is every user's (0666), from its first connection.
    if (int e = listen_seqpacket(rundir_.at("control"), listen_fd_, system_ ? 0666 : 0)) return e;
  }
  registry_.set_served_as((system_ ? proto::kServedAsSystem : 0) | (activated ? proto::kServedAsActivated : 0));
  epoll_fd_.reset(::epoll_create1(EPOLL_CLOEXEC));
  if (!epoll_fd_.valid()) return errno;
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = listen_fd_.get();
  if (::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, listen_fd_.get(), &ev) != 0) return errno;
  // The system daemon's rdma_cm rendezvous (docs/RDMACM.md, "Users"): one
  // directory for every user's listeners, as the port space is host-wide on
  // Linux; only the daemon writes it (cm_ports.h), and what is there is a
  // daemon's before this one.
  if (system_) {
    if (::mkdirat(rundir_.fd.get(), "cm", 0755) != 0 && errno != EEXIST) return errno;
    Fd cm(::openat(rundir_.fd.get(), "cm", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    struct stat st;
    if (!cm.valid() || ::fstat(cm.get(), &st) != 0) return errno;
    if (!S_ISDIR(st.st_mode) || st.st_uid != ::getuid()) return EPERM;
    if (::fchmod(cm.get(), 0755) != 0) return errno;
    const std::string cm_path = dir_ + "/cm";
    clear_rendezvous(cm.get(), cm_path);
    registry_.cm_ports().set_dir(cm_path);
  }
  if (int e = open_roce()) return e;
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  ::sigaction(SIGTERM, &sa, nullptr);
  ::sigaction(SIGINT, &sa, nullptr);
  ::signal(SIGPIPE, SIG_IGN);
  return 0;
}

// RoCEv2 (docs/ROCE.md): UDP 4791 is taken by default where free (one
// per-user daemon per network namespace, common/paths.h); SOFTVERBS_ROCE=0:
// never; SOFTVERBS_ROCE=1 (or the system daemon): a port not taken is said
// on stderr. A held address is retried when a QP needs it (RocePort).
int Server::open_roce() {
  const char* roce = std::getenv("SOFTVERBS_ROCE");
  if (roce && std::strcmp(roce, "0") == 0) return 0;
  const bool asked = (roce && std::strcmp(roce, "1") == 0) || system_;
  if (int e = roce_.open()) {
    if (asked) std::fprintf(stderr, "softverbsd: RoCEv2 port not opened: %s\n", std::strerror(e));
    SV_TRACE("daemon: RoCEv2 port not opened: %s", std::strerror(e));
  }
  for (int fd : roce_.fds()) {
    if (int e = watch_roce_fd(fd)) return e;
  }
  open_cm_gateway();
  roce_.mcast_members = [this](const uint8_t* mgid, std::vector<uint32_t>& qpns) {
    return registry_.mcast_members(mgid, qpns);
  };
  roce_.on_new_fd = [this](int fd) {
    if (watch_roce_fd(fd) == 0) open_cm_gateway();
    // An address bound late (its holder gone) may be the first of a group's
    // family: look at the groups again after this command (sync_mcast).
    mcast_generation_ = ~uint64_t(0);
  };
  return 0;
}

int Server::watch_roce_fd(int fd) {
  epoll_event rev{};
  rev.events = EPOLLIN;
  rev.data.fd = fd;
  return ::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, fd, &rev) != 0 ? errno : 0;
}

// The connection manager between hosts (docs/RDMACM.md): QP1's MADs, once
// the port is ours.
void Server::open_cm_gateway() {
  if (!roce_.enabled() || cm_open_) return;
  if (int e = cm_.open(rundir_.via(), system_ ? 0666 : 0)) {
    std::fprintf(stderr, "softverbsd: CM gateway not opened: %s\n", std::strerror(e));
    return;
  }
  epoll_event cev{};
  cev.events = EPOLLIN;
  cev.data.fd = cm_.fd();
  if (::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, cm_.fd(), &cev) != 0) return;
  roce_.on_qp1 = [this](int fd, const sockaddr* from, socklen_t fl, const uint8_t* d, size_t n) {
    cm_.deliver(fd, from, fl, d, n);
  };
  cm_open_ = true;
}

Server::~Server() { stop_copier(); }

void Server::start_copier() {
  if (copier_.joinable()) return;
  if (make_eventfd(copy_done_fd_) != 0) return;  // no worker: copies stay on the loop
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = copy_done_fd_.get();
  if (::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, copy_done_fd_.get(), &ev) != 0) return;
  copy_stop_ = false;
  odp_copies_ = std::make_unique<OdpCopies>(copy_done_fd_.get());
  copier_ = std::thread([this] { copier_main(); });
  defer_copies_ = true;
}

void Server::stop_copier() {
  if (!copier_.joinable()) return;
  {
    std::lock_guard<std::mutex> g(copy_mu_);
    copy_stop_ = true;
  }
  copy_cv_.notify_all();
  copier_.join();
  defer_copies_ = false;
}

// Round robin between users: a piece of the oldest copy of the user after
// the one served last. Only MediationJob::step runs here; the registry is
// the loop's alone.
void Server::copier_main() {
  std::unique_lock<std::mutex> lk(copy_mu_);
  for (;;) {
    copy_cv_.wait(lk, [this] { return copy_stop_ || !copy_queues_.empty(); });
    if (copy_stop_) return;
    auto it = copy_queues_.upper_bound(copy_last_uid_);
    if (it == copy_queues_.end()) it = copy_queues_.begin();
    copy_last_uid_ = it->first;
    MediationJob* job = it->second.front().job.get();
    copy_current_ = job;
    lk.unlock();
    bool more = job->step(kCopyPiece);
    lk.lock();
    copy_current_ = nullptr;
    copy_step_cv_.notify_all();
    it = copy_queues_.find(copy_last_uid_);  // the queues only grow meanwhile
    if (!more) {
      copies_done_.push_back(std::move(it->second.front()));
      it->second.pop_front();
      if (it->second.empty()) copy_queues_.erase(it);
      eventfd_signal(copy_done_fd_.get());
    }
  }
}

// On the loop: complete the finished copies and send their replies.
void Server::copies_done() {
  uint64_t n = 0;
  eventfd_drain(copy_done_fd_.get(), &n);
  std::deque<Copy> done;
  {
    std::lock_guard<std::mutex> g(copy_mu_);
    done.swap(copies_done_);
  }
  if (odp_copies_)
    for (Copy& c : odp_copies_->take_done()) done.push_back(std::move(c));
  for (Copy& c : done) {
    proto::MediateReply rep{};
    int st = 0;
    if (c.job->posted) registry_.finish_posted(*c.job);  // no reply: the QP's counts and CQ say it
    else st = registry_.finish_mediation(*c.job, rep);
    int fd = -1;
    if (Conn* conn = conn_of(c.client, fd)) {
      conn->copying = false;
      if (!c.job->posted) {
        uint8_t out[sizeof rep];
        rep.h = c.h;
        rep.h.status = st;
        std::memcpy(out, &rep, sizeof rep);
        enqueue(fd, *conn, out, sizeof rep, {}, 0);  // a failed send: its hang-up drops it
      }
      update_interest(fd, *conn);
    }
  }
  send_events();
}

int Server::run() {
  // SIGTERM and SIGINT are taken only while the loop waits (epoll_pwait
  // unblocks them atomically): one that comes while a turn runs is seen by
  // the next wait at once, never slept through for its timeout. Blocked
  // before the copy worker starts, which keeps the mask.
  sigset_t stop_signals, waiting;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, &waiting);
  const sigset_t before = waiting;
  sigdelset(&waiting, SIGTERM);
  sigdelset(&waiting, SIGINT);
  start_copier();
  uint64_t idle_since = monotonic_ns();
  uint64_t last_request = 0;
  uint32_t ring_turns = 0;  // consecutive turns the rings had requests
  uint64_t last_poll = 0;
  while (!g_stop) {
    epoll_event evs[32];
    // Right after a request another usually follows (a client setting up
    // its objects): poll without sleeping for a short while, because a
    // blocking wake-up across vCPUs costs tens of microseconds on a VM.
    bool spin = monotonic_ns() - last_request < 50'000 && !spin_contended();
    // Asleep, a ring's client writes its eventfd (post_ring.h); awake, it
    // need not (the loop looks at the rings on every turn).
    bool sleeping = false;
    if (!spin) {
      sleeping = !rings_may_sleep();
      if (!sleeping) rings_awake();
    }
    // While the rings keep the loop busy, the other descriptors (sockets,
    // the copy worker's, the wire's) are looked at every kRingTurnsPerPoll
    // turns or 50 us, whichever comes first (a turn is a few requests of
    // each ring): each epoll_wait is a system call, and made at every turn
    // they are a fifth of the daemon's time at 64 KiB between users
    // (docs/PERFORMANCE.md, "Between users").
    int n = 0;
    const uint64_t now = monotonic_ns();
    if (sleeping || ring_turns % kRingTurnsPerPoll == 0 || now - last_poll > 50'000) {
      last_poll = now;
      n = ::epoll_pwait(epoll_fd_.get(), evs, 32, sleeping ? 1000 : 0, &waiting);
    }
    if (sleeping) rings_awake();
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    note_contention(evs, n);
    for (int i = 0; i < n; ++i)
      if (dispatch(evs[i])) last_request = monotonic_ns();
    if (serve_rings()) {
      last_request = monotonic_ns();
      ++ring_turns;
    } else {
      ring_turns = 0;
    }
    if (!conns_.empty()) {
      idle_since = monotonic_ns();
    } else if (idle_seconds_ > 0 && monotonic_ns() - idle_since > uint64_t(idle_seconds_) * 1000000000ull) {
      break;
    }
  }
  stop_copier();
  pthread_sigmask(SIG_SETMASK, &before, nullptr);
  ::unlinkat(rundir_.fd.get(), "control", 0);
  return 0;
}

// One descriptor epoll reported, to its owner. True when it was work:
// only work keeps the loop spinning (a wake-up that served nothing, a
// connection not served, does not).
bool Server::dispatch(const epoll_event& ev) {
  const int fd = ev.data.fd;
  if (fd == listen_fd_.get()) {
    accept_clients();
  } else if (roce_.owns(fd)) {
    roce_.readable(fd);
  } else if (fd == cm_.fd()) {
    cm_.run();
  } else if (copy_done_fd_.valid() && fd == copy_done_fd_.get()) {
    copies_done();
  } else if (auto w = odp_owners_.find(fd); w != odp_owners_.end()) {
    ::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_DEL, fd, nullptr);
    revoke_odp_copies(pid_t(registry_.client_pid(w->second)));  // its copies complete in error now
    registry_.odp_owner_gone(w->second);
    odp_owners_.erase(w);
  } else if (auto r = ring_efds_.find(fd); r != ring_efds_.end()) {
    ring_woken(fd, r->second);
    return false;  // a wake-up is no request (no spin for it)
  } else if (ev.events & (EPOLLIN | EPOLLOUT)) {
    if (ev.events & EPOLLOUT) flush(fd);
    if ((ev.events & EPOLLIN) && !serve(fd)) return false;
  } else if (ev.events & (EPOLLHUP | EPOLLERR)) {
    SV_TRACE("daemon: fd %d hung up (events 0x%x)", fd, ev.events);
    drop(fd);
  }
  return true;
}

// Whether the loop's spin would take a CPU that another thread wants. On
// a machine with fewer CPUs than busy threads (two processes ping-ponging
// RDMA WRITEs between users on 2 vCPUs, each spinning on its buffer), the
// spin keeps one of them off its CPU, and the request it is about to post
// waits for the scheduler to preempt the daemon: 75 us one way. The
// kernel counts each time this thread was preempted (ru_nivcsw); a
// preemption since the last look means the CPUs are oversubscribed, and
// the loop then sleeps between requests for 100 ms before it tries
// spinning again: the client wakes it through its ring's eventfd and
// yields its CPU to it (DaemonConn::ring_push_locked). 11 us one way
// (docs/PERFORMANCE.md, "Between users"); shorter back-offs (1 and 10 ms) gave
// 18-36 us.
bool Server::spin_contended() {
  constexpr uint64_t kBackOffNs = 100'000'000;
  const uint64_t now = monotonic_ns();
  if (now < spin_contended_until_) return true;
  // A look costs a system call: at most one per 20 us of spinning.
  if (now - spin_checked_ns_ < 20'000) return false;
  spin_checked_ns_ = now;
  rusage ru{};
  if (::getrusage(RUSAGE_THREAD, &ru) != 0) return false;
  const bool preempted = uint64_t(ru.ru_nivcsw) != spin_nivcsw_;
  spin_nivcsw_ = uint64_t(ru.ru_nivcsw);
  if (preempted) spin_contended_until_ = now + kBackOffNs;
  return preempted;
}

// Mediated copies up to a piece run on the loop while one connection at a
// time asks for service (a program alone with the daemon: no hand-over to
// the worker, which costs a wake-up of each thread). When several
// connections are ready at once, copies of 64 KiB and more go to the copy
// worker again, round robin between users, and the loop answers the others
// after key checks alone.
void Server::note_contention(const epoll_event* evs, int n) {
  int ready = 0;
  for (int i = 0; i < n; ++i)
    if ((evs[i].events & EPOLLIN) && conns_.count(evs[i].data.fd)) ++ready;
  registry_.set_mediation_offload(ready > 1 ? kContendedOffload : kCopyPiece + 1);
}

// Deregistration revokes at once (docs/SECURITY.md): before
// an MR is deregistered (or reregistered), the copy worker's jobs over its
// backing are failed, and the loop waits for a step in progress to end, so
// that no byte of a mediated copy lands in the backing after the reply.
// A step is at most a piece (1 MiB, about 50 us).
void Server::revoke_copies(uint32_t client, const uint8_t* msg, size_t len) {
  if (!defer_copies_ || len < sizeof(proto::HandleReq)) return;
  proto::Header h;
  std::memcpy(&h, msg, sizeof h);
  if (h.op != uint16_t(proto::Op::DeregMr) && h.op != uint16_t(proto::Op::ReregMr)) return;
  static_assert(offsetof(proto::HandleReq, handle) == offsetof(proto::ReregMrReq, handle));
  uint32_t handle = 0;
  std::memcpy(&handle, msg + offsetof(proto::HandleReq, handle), sizeof handle);
  const uint32_t backing = registry_.mr_backing(client, handle);
  if (backing) return revoke_copies_if([backing](const MediationJob& j) { return j.touches(backing); });
  // An ODP MR holds no backing: the jobs over its registrant's memory.
  if (const uint32_t pid = registry_.mr_odp_owner(client, handle)) revoke_odp_copies(pid_t(pid));
}

// Before a client's ODP MRs go with its connection (its process may live
// on), the jobs over that process's memory are failed likewise.
void Server::revoke_odp_copies(pid_t pid) {
  if (!defer_copies_ || pid <= 0) return;
  revoke_copies_if([pid](const MediationJob& j) { return j.touches_odp_of(pid); });
}

void Server::revoke_copies_if(const std::function<bool(const MediationJob&)>& hit) {
  if (odp_copies_) odp_copies_->revoke(hit);  // never waits for a fault in ODP memory
  std::unique_lock<std::mutex> lk(copy_mu_);
  for (auto& [uid, queue] : copy_queues_)
    for (Copy& c : queue)
      if (hit(*c.job)) c.job->revoked.store(true, std::memory_order_release);
  copy_step_cv_.wait(lk, [this] { return !copy_current_ || !copy_current_->revoked.load(); });
}

// Whether this daemon serves the process that connected on `fd` (its
// credentials and pidfd filled in); if not, it has been told why.
bool Server::admitted(int fd, PeerCred& cred, Fd& pidfd) {
  // A per-user daemon refuses every other user's process; the system
  // daemon serves all users (the registry keeps them apart), each up to
  // its quota of connections.
  if (peer_credentials(fd, cred) != 0) return false;
  if (cred.uid == unmapped_uid()) {
    tell_refused(fd, proto::kRefusedUnmappedUser, EPERM, cred.uid, ::getuid());
    return false;
  }
  if (!system_ && cred.uid != ::getuid()) {
    tell_refused(fd, proto::kRefusedUser, EPERM, cred.uid, ::getuid());
    return false;
  }
  // The socket and the pidfd: two descriptors of the user's quota.
  if (registry_.quotas().admit(Quotas::kConnection, cred.uid) != 0 || registry_.quotas().admit_fds(cred.uid, 2) != 0) {
    SV_TRACE("daemon: uid %u: connection quota reached", unsigned(cred.uid));
    tell_refused(fd, proto::kRefusedConnections, EMFILE, 0, 0);
    return false;
  }
  // The process that connected, by a pidfd: its locked-memory limit is
  // decided for it, not for whatever process reuses its pid.
  peer_pidfd(fd, cred, boottime_ns(), pidfd);
  // Only processes of this daemon's pid namespace. The shared rings name
  // their claimers by pid, and every process that touches a ring (its
  // sharers and this daemon, which pushes completions, carries mediated
  // work and recovers for the dead) judges a claimer's death by that
  // number (shm_ring.h): a pid from another namespace names another
  // process here, or none, and a live claimer taken for dead loses a
  // message. So a client in a container reaches a daemon of its own
  // namespace: its container's, or its pod's (docs/CONTAINERS.md).
  bool same = false;
  if (const int e = client_in_pid_namespace(cred.pid, pidfd.get(), same); e != 0 || !same) {
    tell_refused(fd, proto::kRefusedPidNamespace, EPERM, pid_namespace_inode(cred.pid, pidfd.get()),
                 pid_namespace_inode(0, -1));
    // Said once: a flood of such connections must not flood the log.
    // Another user's namespace is read with ptrace's permission: a
    // system daemon in a container (a pod's, docs/CONTAINERS.md) needs
    // CAP_SYS_PTRACE, as root has it on a host.
    if (!refused_pid_ns_++) {
      if (e == EPERM || e == EACCES)
        std::fprintf(stderr,
                     "softverbsd: refused a connection of uid %u: cannot read its pid namespace (%s; a system "
                     "daemon in a container needs --cap-add SYS_PTRACE)\n",
                     unsigned(cred.uid), std::strerror(e));
      else
        std::fprintf(stderr, "softverbsd: refused a connection of uid %u: not in this daemon's pid namespace\n",
                     unsigned(cred.uid));
    }
    return false;
  }
  return true;
}

void Server::accept_clients() {
  for (;;) {
    int fd = ::accept4(listen_fd_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if ((errno == EMFILE || errno == ENFILE) && reserve_fd_.valid()) {
        // Out of descriptors: take the waiting connection with the reserve
        // and close it (the client sees its connection closed), rather than
        // leave it pending, which epoll would report again at once: a
        // busy loop.
        reserve_fd_.reset();
        int f = ::accept4(listen_fd_.get(), nullptr, nullptr, SOCK_CLOEXEC);
        if (f >= 0) ::close(f);
        reserve_fd_.reset(::open("/dev/null", O_RDONLY | O_CLOEXEC));
        if (f >= 0) continue;
      }
      return;
    }
    Fd sock(fd);
    PeerCred cred{};
    Fd pidfd;
    if (!admitted(fd, cred, pidfd)) continue;
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP;
    ev.data.fd = fd;
    if (::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, fd, &ev) != 0) continue;
    const bool has_pidfd = pidfd.valid();
    uint32_t id = registry_.add_client(cred.pid, cred.uid, cred.gid, std::move(pidfd));
    if (struct stat st {}; ::fstat(fd, &st) == 0) registry_.set_connection_inode(id, st.st_ino);
    registry_.quotas().charge(Quotas::kConnection, id, cred.uid);
    if (has_pidfd) registry_.quotas().charge_fds(Quotas::fd_key(id, Quotas::kPidfd), cred.uid, 1);
    Conn c{};
    c.client = id;
    c.sock = std::move(sock);
    c.interest = ev.events;
    conns_[fd] = std::move(c);
    fd_of_client_[id] = fd;
  }
}

// An ODP MR lives no longer than the process that registered it (its
// addresses mean nothing in another): the first one a client registers
// makes the server watch that process's pidfd.
void Server::watch_odp_owner(uint32_t client) {
  const int pidfd = registry_.client_pidfd(client);
  if (pidfd < 0 || odp_owners_.count(pidfd)) return;
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = pidfd;
  if (::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_ADD, pidfd, &ev) == 0) odp_owners_[pidfd] = client;
}

Server::Conn* Server::conn_of(uint32_t client, int& fd) {
  auto f = fd_of_client_.find(client);
  if (f == fd_of_client_.end()) return nullptr;
  auto it = conns_.find(f->second);
  if (it == conns_.end() || it->second.client != client) return nullptr;
  fd = it->first;
  return &it->second;
}

void Server::drop(int fd) {
  auto it = conns_.find(fd);
  if (it == conns_.end()) return;
  ::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_DEL, fd, nullptr);
  if (it->second.ring) {  // what is left in it is never run (as unread requests on the socket)
    ::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_DEL, it->second.ring->wake(), nullptr);
    ring_efds_.erase(it->second.ring->wake());
  }
  const uint32_t client = it->second.client;
  if (auto w = odp_owners_.find(registry_.client_pidfd(client)); w != odp_owners_.end()) {
    ::epoll_ctl(epoll_fd_.get(), EPOLL_CTL_DEL, w->first, nullptr);  // closed with the client
    odp_owners_.erase(w);
    revoke_odp_copies(pid_t(registry_.client_pid(client)));  // its process may write its memory on
    registry_.odp_owner_gone(client, true);
  }
  const uint32_t context = registry_.context_of(client);
  const uint32_t pid = registry_.client_pid(client);
  for (const Out& o : it->second.out) registry_.quotas().release_fds(o.fd_key);
  registry_.remove_client(client);
  Quotas& q = registry_.quotas();
  q.release(Quotas::kConnection, client);
  for (auto what : {Quotas::kPidfd, Quotas::kRingFds, Quotas::kRoceFds, Quotas::kWakeFd})
    q.release_fds(Quotas::fd_key(client, what));
  roce_.remove_client(it->second.client);
  fd_of_client_.erase(it->second.client);
  conns_.erase(it);
  wake_sharers(context, pid);
  sync_mcast();
  send_events();
}

// Empties the rendezvous directory (held open as `cm`) at start: its
// entries are an earlier daemon's.
void Server::clear_rendezvous(int cm, const std::string& path) {
  DIR* d = ::fdopendir(::dup(cm));
  if (!d) return;
  while (dirent* e = ::readdir(d)) {
    if (std::strcmp(e->d_name, ".") == 0 || std::strcmp(e->d_name, "..") == 0) continue;
    if (::unlinkat(::dirfd(d), e->d_name, 0) != 0 && errno != ENOENT)
      std::fprintf(stderr, "softverbsd: %s/%s not removed: %s\n", path.c_str(), e->d_name, std::strerror(errno));
  }
  ::closedir(d);
}

}  // namespace sv::daemon
