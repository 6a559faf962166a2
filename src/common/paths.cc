#include "common/paths.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>

namespace sv {

std::string runtime_dir() {
  if (const char* d = std::getenv("SOFTVERBS_DIR"); d && *d) return d;
  if (const char* x = std::getenv("XDG_RUNTIME_DIR"); x && *x) return std::string(x) + "/softverbs";
  return "/tmp/softverbs-" + std::to_string(::getuid());
}

int ensure_runtime_dir(const std::string& dir) {
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) return errno;
  struct stat st;
  if (::lstat(dir.c_str(), &st) != 0) return errno;
  if (!S_ISDIR(st.st_mode)) return ENOTDIR;
  if (st.st_uid != ::getuid()) return EPERM;
  if ((st.st_mode & 0077) != 0) return EPERM;
  return 0;
}

std::string system_dir() {
  if (const char* d = std::getenv("SOFTVERBS_SYSTEM_DIR"); d && *d) return d;
  return "/run/softverbs";
}

bool use_system_daemon() {
  const char* e = std::getenv("SOFTVERBS_SYSTEM");
  return e && *e && *e != '0';
}

int check_system_dir(const std::string& dir) {
  struct stat st;
  if (::lstat(dir.c_str(), &st) != 0) return errno;
  if (!S_ISDIR(st.st_mode)) return ENOTDIR;
  if (st.st_uid != 0 && st.st_uid != ::getuid()) return EPERM;
  if ((st.st_mode & 0022) != 0) return EPERM;
  return 0;
}

int ensure_system_dir(const std::string& dir) {
  if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) return errno;
  struct stat st;
  if (::lstat(dir.c_str(), &st) != 0) return errno;
  if (!S_ISDIR(st.st_mode)) return ENOTDIR;
  if (st.st_uid != ::getuid()) return EPERM;
  // Every user reaches the socket inside: the directory must be searchable
  // by all and writable by nobody else.
  if (::chmod(dir.c_str(), 0755) != 0) return errno;
  return 0;
}

}  // namespace sv
