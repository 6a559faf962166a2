// sys.h: every system call softverbs uses, wrapped once.
//
// Contract: functions return 0 or a positive errno value (never throw, never
// set errno as their result); outputs are passed by reference. Fd and
// Mapping are RAII owners: the destructor is the release path. All functions
// are thread-safe to the extent the underlying system calls are.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace sv {

// Owns one file descriptor.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) reset(std::exchange(o.fd_, -1));
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() { return std::exchange(fd_, -1); }
  void reset(int fd = -1);

 private:
  int fd_ = -1;
};

// Owns one mmap()ed range.
class Mapping {
 public:
  Mapping() = default;
  Mapping(void* addr, size_t len) : addr_(addr), len_(len) {}
  Mapping(Mapping&& o) noexcept
      : addr_(std::exchange(o.addr_, nullptr)), len_(std::exchange(o.len_, 0)) {}
  Mapping& operator=(Mapping&& o) noexcept {
    if (this != &o) {
      reset();
      addr_ = std::exchange(o.addr_, nullptr);
      len_ = std::exchange(o.len_, 0);
    }
    return *this;
  }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping() { reset(); }

  void* get() const { return addr_; }
  template <class T>
  T* as() const { return static_cast<T*>(addr_); }
  size_t size() const { return len_; }
  bool valid() const { return addr_ != nullptr; }
  // Forgets the range without unmapping it (someone else unmaps it).
  void release_ownership() {
    addr_ = nullptr;
    len_ = 0;
  }
  void reset();

 private:
  void* addr_ = nullptr;
  size_t len_ = 0;
};

size_t page_size();
inline uint64_t page_down(uint64_t v) { return v & ~(uint64_t(page_size()) - 1); }
inline uint64_t page_up(uint64_t v) { return page_down(v + page_size() - 1); }

// A memfd of `size` bytes, mode 0600 (another user cannot reopen it through
// /proc/PID/fd), sealed with `seals` once sized. The default fixes its size
// for good: every process that maps it may touch all of it without SIGBUS,
// whoever else holds it (memfd_create(2), fcntl(2) F_ADD_SEALS). A caller
// that must add seals later (after mapping it writable itself) leaves out
// F_SEAL_SEAL.
constexpr unsigned kFixedSizeSeals = 0x0002 | 0x0004;  // F_SEAL_SHRINK | F_SEAL_GROW
constexpr unsigned kFinalSeals = kFixedSizeSeals | 0x0001;  // ... | F_SEAL_SEAL
int make_memfd(const char* name, size_t size, Fd& out, unsigned seals = kFinalSeals);
int make_eventfd(Fd& out);
// Maps [offset, offset+len) of fd shared. prot: PROT_READ or PROT_READ|PROT_WRITE.
int map_shared(int fd, uint64_t offset, size_t len, int prot, bool populate, Mapping& out);
int dup_fd(int fd, Fd& out);
int set_nonblocking(int fd, bool on);

// Unix SOCK_SEQPACKET with SCM_RIGHTS.
constexpr int kMaxFdsPerMessage = 4;
// `dontwait`: MSG_DONTWAIT, so that the call never sleeps whatever the
// socket's file status flags say (the daemon's sends and receives).
int send_message(int sock, const void* data, size_t len, std::span<const int> fds, bool dontwait = false);
// Receives one message; *len is set to its length (0 = peer closed).
// MSG_TRUNC/MSG_CTRUNC are reported as EMSGSIZE; received fds are still owned
// by `fds` so that nothing leaks.
int recv_message(int sock, void* buf, size_t cap, size_t* len, std::vector<Fd>& fds, bool dontwait = false);

struct PeerCred {
  pid_t pid;
  uid_t uid;
  gid_t gid;
};
int peer_credentials(int sock, PeerCred& out);
// A pidfd for the process at the other end of a connected Unix socket, as
// it was when it connected: SO_PEERPIDFD (Linux 6.5), else pidfd_open(2) of
// cred.pid, accepted only if that process started before `accepted_ns`
// (CLOCK_BOOTTIME, taken once accept(2) returned), so that a pid reused
// since then is not taken for the peer.
int peer_pidfd(int sock, const PeerCred& cred, uint64_t accepted_ns, Fd& out);
// Whether the process a pidfd refers to is still alive (pidfd_send_signal(2)
// with signal 0; a zombie still counts).
bool pidfd_alive(int pidfd);
// pidfd_open(2).
int pidfd_open(pid_t pid, Fd& out);
// Whether process `pid` (the process behind `pidfd`, alive until the answer
// was read) is in this process's pid namespace. First by the NSpid: line of
// /proc/PID/status (proc(5); readable by anyone, so that no ptrace access
// to the process is needed: a process in a user namespace of its own, as
// `softverbs run` makes, grants none to a daemon outside it, nor does a
// process outside to a daemon inside one), where this process's /proc is
// its own pid namespace's; else (another /proc) by the namespace itself,
// the same device and inode (namespaces(7)), asked of the pidfds
// (PIDFD_GET_PID_NAMESPACE) or of /proc/PID/ns/pid. 0 and `same` set, or
// ESRCH (gone; no pidfd; pid 0: a process the kernel could not name in our
// namespace, socket(7) SO_PEERCRED) or another errno (EACCES: not readable).
int same_pid_namespace(pid_t pid, int pidfd, bool& same);
// The inode of the pid namespace of the process behind `pidfd` (pid `pid`;
// 0: this process), for messages ("pid:[INODE]", namespaces(7)); 0 where it
// cannot be read.
uint64_t pid_namespace_inode(pid_t pid, int pidfd);
// Whether /proc/PID/uid_map (0: this process's), read from this process,
// is the whole identity map "0 0 4294967295" (user_namespaces(7)): the
// initial user namespace, as seen from it. Anyone may read the file. Only
// root can make another namespace with that map; read from inside a user
// namespace, the initial one's map reads otherwise.
bool identity_uid_map(pid_t pid);
// The inode of the peer of the Unix socket whose inode is `inode` (one end
// of a connection in this network namespace), as the kernel's sock_diag
// says it (sock_diag(7): UDIAG_SHOW_PEER; no privilege needed). 0 and
// `peer` set, or an errno.
int unix_peer_inode(uint64_t inode, uint64_t& peer);
uint64_t boottime_ns();

// socket(2) by its system call, never through a library that interposes
// the C library's socket(): rdma-core's librspreload.so, preloaded into a
// program, turns every AF_INET/AF_INET6 socket() into an rsocket, and the
// drop-in libraries' own UDP sockets (RoCEv2 ports, route lookups, a
// datagram rsocket's address) are plain kernel sockets. The calls on the
// descriptor then reach the C library's (the preload passes descriptors it
// did not make through). -1 and errno on failure.
int kernel_socket(int domain, int type, int protocol);

// A listening SOCK_SEQPACKET socket at `path` (replacing one there). With a
// `mode`, the path appears only once the socket listens with that mode.
int listen_seqpacket(const std::string& path, Fd& out, mode_t mode = 0);
int connect_seqpacket(const std::string& path, Fd& out);

// Eventfd helpers: signal adds 1; drain reads the counter (EAGAIN if zero and
// the fd is non-blocking). drain retries a read a signal interrupted;
// wait_once does not (EINTR): for the verbs that block for the application
// (ibv_get_cq_event, ibv_get_async_event), which, as rdma-core's, return
// -1/EINTR when a signal arrives, so that a program whose SIGALRM handler
// ends its loop (qperf's timed tests) is not left waiting.
int eventfd_signal(int fd);
int eventfd_drain(int fd, uint64_t* value);
int eventfd_wait_once(int fd, uint64_t* value);

// Wake-up sockets: a connected AF_UNIX SOCK_STREAM pair whose one end is
// polled for readability (the application's async fd, the daemon's end of
// a request ring's wake-up) and whose other end is written. Unlike an
// eventfd or a pipe, a send(2) with MSG_DONTWAIT never sleeps, whatever the
// holder of either end does to the file status flags (fcntl(2) F_SETFL
// acts on the shared file description): a full socket means a wake-up is
// already waiting, which is all a signal has to say. The daemon signals
// clients and reads their wake-ups only through such sockets.
// `reader` is polled and read, `writer` signalled.
int make_wake_pair(Fd& reader, Fd& writer);
// One byte, MSG_DONTWAIT | MSG_NOSIGNAL; 0 also when the socket is full.
int wake_signal(int fd);
// Reads what waits, never sleeping: 0 if something was read, EAGAIN if
// nothing was, or another errno (0 bytes read: the other end is closed, EPIPE).
int wake_drain(int fd);
// Waits for a wake-up as the descriptor's own flags say (O_NONBLOCK: EAGAIN
// when none waits), then reads the rest without sleeping. EINTR ends the
// wait, as eventfd_wait_once.
int wake_wait_once(int fd);
// Whether `fd` is one end of an AF_UNIX SOCK_STREAM socketpair(2): neither
// end has a name (a socket connected to a listener has one, its listener's
// or its own), so the daemon's bytes reach only the client that made it.
bool is_wake_socket(int fd);

uint64_t monotonic_ns();

// This process's pid, cached (getpid(2) is a real system call); refreshed
// in a fork child. Inline: every post and poll takes a lock stamped with it.
namespace detail {
extern std::atomic<uint32_t> g_pid;
}
uint32_t self_pid_slow();
// The data path's functions: in .text.hot, together and each at a cache-line
// boundary, so that the post/poll path's code layout does not move with
// unrelated edits or the build's grouping of files (docs/PERFORMANCE.md).
#define SV_HOT [[gnu::hot, gnu::aligned(64)]]

inline uint32_t self_pid() {
  uint32_t p = detail::g_pid.load(std::memory_order_relaxed);
  return p ? p : self_pid_slow();
}

}  // namespace sv
