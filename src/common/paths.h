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
inline std::string socket_path(const std::string& dir) { return dir + "/control"; }
inline std::string lock_path(const std::string& dir) { return dir + "/daemon.lock"; }

}  // namespace sv
