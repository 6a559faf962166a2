// paths.h: where a user's softverbs daemon lives.
//
// One per-user daemon per network namespace: its GID table
// is the addresses of the namespace it runs in, so a process must reach the
// daemon of its own namespace. The base directory is $XDG_RUNTIME_DIR/softverbs,
// else /tmp/softverbs-<uid>. Its daemon records the namespace it serves in
// BASE/netns (write_netns_record()). The library (src/verbs/daemon_conn.cc)
// uses BASE's daemon when one answers there and serves its namespace
// (proto::Op::Netns: the daemon answers EXDEV to a process of another);
// when none answers, BASE if the record names no other namespace (the
// daemon it starts there records ours), else BASE/net-<inode>-<device> of
// its own namespace (netns_dir()); and that directory too whenever a daemon
// of another namespace answered.
//
// $SOFTVERBS_DIR, when set, is the directory whatever the namespace: no
// record is consulted (sharing one daemon between namespaces on purpose,
// and every test's private daemon).
//
// Without $XDG_RUNTIME_DIR, BASE is /run/user/<uid>/softverbs when
// /run/user/<uid> is the user's (logind makes it, mode 0700), else
// /tmp/softverbs-<uid>, a name any user can take first in /tmp.
//
// A runtime directory must be a real directory (not a symlink) owned by the
// user with no access for group or others (0700). It is opened once, as a
// descriptor (RunDir), and checked by fstat(2) of that descriptor; all that
// is done in it afterwards goes through the descriptor (openat(2),
// mkdirat(2), and sockets named /proc/self/fd/N/NAME, which the kernel
// resolves in that very directory, proc(5)), so that renaming or replacing
// a path component after the check changes nothing. A directory that fails
// the check is used for nothing: no record read, nothing created in it, no
// connection, no daemon started; the reason is a sentence for stderr.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>

#include "common/sys.h"

namespace sv {

// A network namespace, as stat(2) of /proc/self/ns/net names it (namespaces(7):
// two namespaces are the same iff device and inode are). {0, 0}: unknown (no
// /proc), which matches only itself.
struct NetnsId {
  uint64_t dev = 0;
  uint64_t ino = 0;
  bool operator==(const NetnsId&) const = default;
};
NetnsId netns_self();
std::string netns_text(NetnsId id);                   // "net:[INODE] dev D", for messages
bool parse_netns_record(const std::string& text, NetnsId* out);  // "DEV INO\n"
std::string format_netns_record(NetnsId id);

// A directory held open (O_PATH | O_DIRECTORY | O_NOFOLLOW) once checked.
struct RunDir {
  std::string path;  // as named when opened: for messages and the daemon's --dir
  Fd fd;
  uid_t owner = 0;  // as fstat(2) of fd said
  bool valid() const { return fd.valid(); }
  // The directory as a path that the kernel resolves through the
  // descriptor, "/proc/self/fd/N"; `path` when /proc is not mounted (or
  // is not this process's).
  std::string via() const;
  // via() + "/" + NAME ("/proc/self/fd/N/NAME" is within sun_path's 108
  // bytes); path + "/" + NAME when /proc is not mounted (then connect_in() still
  // accepts only a daemon of the directory's owner).
  std::string at(const char* name) const;
};

// What a directory must be. User: the caller's, no group or other
// permission (0700). SystemClient: root's or the caller's, writable by no
// one else. SystemDaemon: the caller's, then given mode 0755.
enum class DirRule { User, SystemClient, SystemDaemon };

// Opens `path`, made first (0700; 0755 for SystemDaemon) when `create` and
// absent, and checks it by its descriptor. 0 or errno; on failure *why (if
// given) says what is wrong and what to do, in one sentence for stderr.
int open_dir(const std::string& path, DirRule rule, bool create, RunDir& out, std::string* why = nullptr);
// `name` (one component) in `parent`, made by mkdirat(2) when `create`,
// opened by openat(2) without following a symlink, and checked as a User
// directory.
int open_subdir(const RunDir& parent, const std::string& name, bool create, RunDir& out, std::string* why = nullptr);
// Connects to DIR/control through the descriptor; the daemon at the other
// end (SO_PEERCRED) must run as the directory's owner. 0 or errno.
int connect_in(const RunDir& dir, Fd& out);
// Writes "softverbs: WHY" on stderr, the first time only in this process.
void say_dir_problem(const std::string& why);

bool runtime_dir_explicit();       // $SOFTVERBS_DIR is set
// $XDG_RUNTIME_DIR/softverbs, /run/user/<uid>/softverbs or /tmp/softverbs-<uid>.
std::string runtime_base_dir();
std::string netns_dir(const std::string& base, NetnsId id);  // BASE/net-<ino>-<dev>
std::string netns_dir_name(NetnsId id);                       // net-<ino>-<dev>
std::string netns_record_path(const std::string& dir);       // DIR/netns
// The namespace the daemon of `dir` last recorded; false if none, or
// unreadable, or not a regular file of the directory's owner.
bool read_netns_record(const RunDir& dir, NetnsId* out);
bool read_netns_record(const std::string& dir, NetnsId* out);  // opens and checks `dir` (User) first
// Daemon side: records `id` in DIR/netns (written beside, then renamed). 0 or errno.
int write_netns_record(const RunDir& dir, NetnsId id);
int write_netns_record(const std::string& dir, NetnsId id);
// The choice for a namespace: BASE if `recorded` is absent or is `self`,
// else netns_dir(BASE, self). Pure (unit-tested).
std::string choose_runtime_dir(const std::string& base, const NetnsId* recorded, NetnsId self);

// $SOFTVERBS_DIR, else choose_runtime_dir(BASE, BASE's record, this namespace).
std::string runtime_dir();
// As the library finds its daemon (src/verbs/daemon_conn.cc), without
// starting one: $SOFTVERBS_DIR; else BASE if its daemon answers and serves
// this namespace, BASE/net-INODE-DEV if it serves another; else runtime_dir().
// For the tools and librdmacm's rendezvous directory.
std::string resolve_runtime_dir();
// Opens (and creates) the directory the library uses, as DaemonConn does:
// $SOFTVERBS_DIR, else BASE or its net-INODE-DEV. 0 or errno, *why set.
int ensure_runtime_dir(const std::string& dir, RunDir& out, std::string* why = nullptr);
int ensure_runtime_dir(const std::string& dir);  // 0 or errno

// The host-wide (system) daemon, which serves every user: its directory is
// $SOFTVERBS_SYSTEM_DIR if set, else /run/softverbs. A process uses it
// instead of its per-user daemon when SOFTVERBS_SYSTEM=1 is in its
// environment. The directory must be a real directory owned by root (or by
// the caller: a test's private system daemon) that nobody else may write;
// ensure_system_dir() creates it (mode 0755) or refuses one that fails this.
// It serves the network namespace it was started in, whatever the client's
// (one per host, as an administrator runs it).
std::string system_dir();
bool use_system_daemon();
int ensure_system_dir(const std::string& dir);  // daemon side: 0 or errno
int check_system_dir(const std::string& dir);   // client side: 0 or errno
inline std::string socket_path(const std::string& dir) { return dir + "/control"; }
inline std::string lock_path(const std::string& dir) { return dir + "/daemon.lock"; }

}  // namespace sv
