// paths.h: where a user's softverbs daemon lives.
//
// One per-user daemon per network namespace (issue 22, item 7): its GID table
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
// record is consulted and no check is made (sharing one daemon between
// namespaces on purpose, and every test's private daemon).
//
// A runtime directory must be a real directory (not a symlink) owned by the
// user with mode 0700; ensure_runtime_dir() creates it (and BASE for a
// namespace's directory under it) or refuses one that fails these checks.
#pragma once

#include <cstdint>
#include <string>

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

bool runtime_dir_explicit();       // $SOFTVERBS_DIR is set
std::string runtime_base_dir();    // $XDG_RUNTIME_DIR/softverbs or /tmp/softverbs-<uid>
std::string netns_dir(const std::string& base, NetnsId id);  // BASE/net-<ino>-<dev>
std::string netns_record_path(const std::string& dir);       // DIR/netns
// The namespace the daemon of `dir` last recorded; false if none (or unreadable).
bool read_netns_record(const std::string& dir, NetnsId* out);
// Daemon side: records `id` in DIR/netns (written beside, then renamed). 0 or errno.
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
