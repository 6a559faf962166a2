#include "tools/view_ns.h"

#include <dirent.h>
#include <fcntl.h>
#include <sched.h>
#include <sys/mount.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <set>
#include <vector>

#include "common/sys.h"
#include "tools/sysfs_view.h"

namespace sv::view {
namespace {

// Sets `why` to "WHAT PATH: strerror(e)" and returns e.
int failed(std::string& why, const char* what, const std::string& path, int e) {
  why = std::string(what) + " " + path + ": " + std::strerror(e);
  return e;
}

int write_file(const std::string& path, const std::string& text, std::string& why) {
  Fd f(::open(path.c_str(), O_WRONLY | O_CLOEXEC | O_CREAT | O_TRUNC, 0444));
  if (!f.valid()) return failed(why, "create", path, errno);
  if (::write(f.get(), text.data(), text.size()) != ssize_t(text.size())) return failed(why, "write", path, errno);
  return 0;
}

// user_namespaces(7): our own uid and gid, mapped to themselves; a
// process without CAP_SETGID must deny setgroups before it maps a gid.
int map_self(uid_t uid, gid_t gid, std::string& why) {
  Fd f(::open("/proc/self/setgroups", O_WRONLY | O_CLOEXEC));
  if (f.valid() && ::write(f.get(), "deny", 4) != 4) return failed(why, "write", "/proc/self/setgroups", errno);
  f.reset();
  auto map = [&](const char* path, unsigned id) {
    std::string line = std::to_string(id) + " " + std::to_string(id) + " 1\n";
    Fd m(::open(path, O_WRONLY | O_CLOEXEC));
    if (!m.valid() || ::write(m.get(), line.data(), line.size()) != ssize_t(line.size()))
      return failed(why, "write", path, errno);
    return 0;
  };
  if (int e = map("/proc/self/uid_map", uid)) return e;
  return map("/proc/self/gid_map", gid);
}

// A private mount namespace: as root a mount namespace; otherwise (or if
// that is refused, as in a container without CAP_SYS_ADMIN) a user
// namespace with it. Mounts made here never propagate to the host.
int new_namespace(std::string& why) {
  if (const char* r = std::getenv("SOFTVERBS_VIEW_REFUSE"); r && std::strcmp(r, "1") == 0)
    return failed(why, "unshare", "(SOFTVERBS_VIEW_REFUSE=1)", EPERM);
  const uid_t uid = ::geteuid();
  const gid_t gid = ::getegid();
  if (uid != 0 || ::unshare(CLONE_NEWNS) != 0) {
    if (::unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0)
      return failed(why, "unshare", "(a user and mount namespace)", errno);
    if (int e = map_self(uid, gid, why)) return e;
  }
  if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0)
    return failed(why, "make private", "/", errno);
  return 0;
}

// A directory's entries, read before a tmpfs covers it; the descriptor
// stays open so that each entry can be bound from under the tmpfs
// (/proc/self/fd/N/NAME).
struct Source {
  Fd fd;
  struct Item {
    std::string name;
    mode_t mode;
    std::string link;  // a symlink's target
  };
  std::vector<Item> items;
  std::string path(const std::string& name) const {
    return "/proc/self/fd/" + std::to_string(fd.get()) + "/" + name;
  }
};

// ENOENT leaves `s` empty: a directory that is not there has no entries.
int read_source(const std::string& dir, Source& s, std::string& why) {
  s.fd = Fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!s.fd.valid()) return errno == ENOENT ? 0 : failed(why, "open", dir, errno);
  DIR* d = ::fdopendir(::dup(s.fd.get()));
  if (!d) return failed(why, "read", dir, errno);
  while (dirent* e = ::readdir(d)) {
    if (!std::strcmp(e->d_name, ".") || !std::strcmp(e->d_name, "..")) continue;
    struct stat st {};
    if (::fstatat(s.fd.get(), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) continue;  // gone meanwhile
    Source::Item it{e->d_name, st.st_mode, {}};
    if (S_ISLNK(st.st_mode)) {
      char buf[PATH_MAX];
      ssize_t n = ::readlinkat(s.fd.get(), e->d_name, buf, sizeof buf - 1);
      if (n < 0) continue;
      it.link.assign(buf, size_t(n));
    }
    s.items.push_back(std::move(it));
  }
  ::closedir(d);
  return 0;
}

// Makes each entry of `s` (but those in `skip`) appear in `dst`: the same
// inode, not a copy (a bind mount; a symlink is copied as a symlink).
int replicate(const Source& s, const std::string& dst, const std::set<std::string>& skip, std::string& why) {
  for (const auto& it : s.items) {
    if (skip.count(it.name)) continue;
    const std::string to = dst + "/" + it.name;
    if (S_ISLNK(it.mode)) {
      if (::symlink(it.link.c_str(), to.c_str()) != 0) return failed(why, "symlink", to, errno);
      continue;
    }
    if (S_ISDIR(it.mode)) {
      if (::mkdir(to.c_str(), 0755) != 0) return failed(why, "mkdir", to, errno);
    } else {
      Fd f(::open(to.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
      if (!f.valid()) return failed(why, "create", to, errno);
    }
    if (::mount(s.path(it.name).c_str(), to.c_str(), nullptr, MS_BIND | MS_REC, nullptr) != 0)
      return failed(why, "bind", to, errno);
  }
  return 0;
}

// Covers `target` with a tmpfs holding what it held, but the entries named
// in `rebuilt`, which become directories of their own holding what they
// held. The caller then adds its entries.
int cover(const std::string& target, const std::set<std::string>& rebuilt, std::string& why) {
  Source top;
  if (int e = read_source(target, top, why)) return e;
  std::vector<Source> subs(rebuilt.size());
  size_t i = 0;
  for (const auto& r : rebuilt)
    if (int e = read_source(target + "/" + r, subs[i++], why)) return e;
  if (::mount("softverbs-view", target.c_str(), "tmpfs", MS_NOSUID | MS_NOEXEC, "mode=755") != 0)
    return failed(why, "mount a tmpfs on", target, errno);
  int e = replicate(top, target, rebuilt, why);
  i = 0;
  for (const auto& r : rebuilt) {
    if (e) break;
    const std::string d = target + "/" + r;
    if (::mkdir(d.c_str(), 0755) != 0) e = failed(why, "mkdir", d, errno);
    else e = replicate(subs[i++], d, {}, why);
  }
  if (e) ::umount2(target.c_str(), MNT_DETACH);  // as it was
  return e;
}

// /dev/infiniband/uverbs0: an empty file with /dev/null bound over it.
int add_node(std::string& why) {
  const std::string node = std::string("/dev/infiniband/") + dev::kUverbsName;
  if (::access(node.c_str(), F_OK) == 0) return 0;
  Fd f(::open(node.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
  if (!f.valid()) return failed(why, "create", node, errno);
  if (::mount("/dev/null", node.c_str(), nullptr, MS_BIND, nullptr) != 0) return failed(why, "bind", node, errno);
  return 0;
}

// The entries of tools/sysfs_view.h under CLASS_DIR (/sys/class); one that
// exists already (a real infiniband_verbs/abi_version) is kept.
int add_sysfs(const std::string& class_dir, const DeviceFacts& facts, std::string& why) {
  for (const Entry& e : sysfs_entries(facts)) {
    const std::string p = class_dir + "/" + e.path;
    struct stat st {};
    if (::lstat(p.c_str(), &st) == 0) continue;
    int r = 0;
    if (e.kind == Entry::kDir) r = ::mkdir(p.c_str(), 0755) == 0 ? 0 : failed(why, "mkdir", p, errno);
    else if (e.kind == Entry::kSymlink) r = ::symlink(e.text.c_str(), p.c_str()) == 0 ? 0 : failed(why, "symlink", p, errno);
    else r = write_file(p, e.text, why);
    if (r) return r;
  }
  return 0;
}

bool have_view() {
  struct stat st {};
  return ::stat((std::string("/dev/infiniband/") + dev::kUverbsName).c_str(), &st) == 0 && S_ISCHR(st.st_mode) &&
         ::access((std::string("/sys/class/infiniband/") + dev::kName + "/node_type").c_str(), R_OK) == 0;
}

}  // namespace

int enter_view(std::string& why) {
  if (have_view()) return 0;  // a `softverbs run` inside another one
  struct stat null_st {};
  if (::stat("/dev/null", &null_st) != 0) return failed(why, "stat", "/dev/null", errno);
  // The device's facts first, from the host as it is.
  const DeviceFacts facts = this_device(std::to_string(major(null_st.st_rdev)) + ":" +
                                        std::to_string(minor(null_st.st_rdev)));
  if (int e = new_namespace(why)) return e;
  if (int e = cover("/dev", {"infiniband"}, why)) return e;
  if (int e = add_node(why)) {
    ::umount2("/dev", MNT_DETACH);
    return e;
  }
  if (int e = cover("/sys/class", {"infiniband", "infiniband_verbs"}, why)) {
    ::umount2("/dev", MNT_DETACH);
    return e;
  }
  if (int e = add_sysfs("/sys/class", facts, why)) {
    ::umount2("/sys/class", MNT_DETACH);
    ::umount2("/dev", MNT_DETACH);
    return e;
  }
  return 0;
}

int add_sysfs_view(const std::string& root, std::string& why) {
  const std::string class_dir = root + "/sys/class";
  // The image decides what its /sys is before the runtime mounts sysfs
  // there, and this runs before the runtime enters the root: a symlink in
  // the image (/sys -> /somewhere) would lead these paths out of the
  // container. Only the runtime's sysfs, inside the root, is covered.
  char real_root[PATH_MAX], real_class[PATH_MAX];
  if (!::realpath(root.c_str(), real_root)) return failed(why, "resolve", root, errno);
  if (!::realpath(class_dir.c_str(), real_class)) return failed(why, "resolve", class_dir, errno);
  if (std::string(real_class) != std::string(real_root) + "/sys/class")
    return failed(why, "refuse", class_dir + " (it leads to " + real_class + ")", EPERM);
  struct statfs fs {};
  if (::statfs(real_class, &fs) != 0) return failed(why, "statfs", class_dir, errno);
  if (fs.f_type != SYSFS_MAGIC) return failed(why, "refuse", class_dir + " (not sysfs)", EPERM);
  struct stat st {};
  if (::stat((class_dir + "/infiniband/" + dev::kName + "/node_type").c_str(), &st) == 0) return 0;  // there already
  // The node's numbers: the one the runtime made (the CDI spec's), else /dev/null's.
  std::string numbers = "1:3";
  if (::stat((root + "/dev/infiniband/" + dev::kUverbsName).c_str(), &st) == 0 && S_ISCHR(st.st_mode))
    numbers = std::to_string(major(st.st_rdev)) + ":" + std::to_string(minor(st.st_rdev));
  const DeviceFacts facts = this_device(numbers);
  if (int e = cover(class_dir, {"infiniband", "infiniband_verbs"}, why)) return e;
  if (int e = add_sysfs(class_dir, facts, why)) {
    ::umount2(class_dir.c_str(), MNT_DETACH);
    return e;
  }
  return 0;
}

}  // namespace sv::view
