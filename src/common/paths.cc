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

}  // namespace sv
