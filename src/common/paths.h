// paths.h: where a user's softverbs daemon lives.
//
// The runtime directory is $SOFTVERBS_DIR if set, else
// $XDG_RUNTIME_DIR/softverbs, else /tmp/softverbs-<uid>. It must be a real
// directory (not a symlink) owned by the user with mode 0700; ensure_runtime_dir()
// creates it or refuses one that fails these checks.
#pragma once

#include <string>

namespace sv {

std::string runtime_dir();
int ensure_runtime_dir(const std::string& dir);  // 0 or errno

// The host-wide (system) daemon, which serves every user: its directory is
// $SOFTVERBS_SYSTEM_DIR if set, else /run/softverbs. A process uses it
// instead of its per-user daemon when SOFTVERBS_SYSTEM=1 is in its
// environment. The directory must be a real directory owned by root (or by
// the caller: a test's private system daemon) that nobody else may write;
// ensure_system_dir() creates it (mode 0755) or refuses one that fails this.
std::string system_dir();
bool use_system_daemon();
int ensure_system_dir(const std::string& dir);  // daemon side: 0 or errno
int check_system_dir(const std::string& dir);   // client side: 0 or errno
inline std::string socket_path(const std::string& dir) { return dir + "/control"; }
inline std::string lock_path(const std::string& dir) { return dir + "/daemon.lock"; }

}  // namespace sv
