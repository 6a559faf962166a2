// name_space.h: the daemon's namespace of published objects (seed 002's
// "filesystem" idea). A process publishes an object it holds under a
// path-like name with an owner, a group and a mode; other processes open it
// by name, and the mode decides, as on a file, who may.
//
// Names: an absolute path of components made of [A-Za-z0-9._-], separated
// by single '/', no "." or ".." component, at most kMaxNsName-1 bytes.
// Permission: root may do anything; the owner class applies when the caller's
// uid owns the entry, the group class when the entry's group is the caller's
// gid or one of its supplementary groups, the other class otherwise
// (exactly one class is checked, as in POSIX).
//
// Cost: every call is O(log n) in the number of names, or bounded by the
// caller's own names (a per-owner index): nothing walks every user's names
// except a listing page, which starts at a name (no walk to an index).
// Each owner holds at most `limit` names (set_limit; 0: none): one more is
// EDQUOT.
//
// Contract: single-threaded (the daemon's event loop); no I/O except
// supplementary_groups(), which reads /proc.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <unordered_map>
#include <unordered_set>
#include <string>
#include <vector>

#include "common/protocol.h"

namespace sv::daemon {

struct Credentials {
  uid_t uid;
  gid_t gid;
  std::vector<gid_t> groups;  // supplementary
};

// The caller's supplementary groups, from /proc/PID/status ("Groups:").
std::vector<gid_t> supplementary_groups(pid_t pid);

struct NsEntry {
  uint32_t kind;    // proto::NsKind
  uint32_t handle;  // the object, in `ctx`
  uint32_t ctx;     // the context that holds it
  uid_t owner;
  gid_t group;
  uint32_t mode;    // permission bits, 0..0777
};

class NameSpace {
 public:
  static bool valid_name(const std::string& name);
  // True if `who` may open `e` for `access` (proto::kNsRead | kNsWrite).
  static bool permitted(const NsEntry& e, const Credentials& who, uint32_t access);

  void set_limit(uint32_t per_owner) { limit_ = per_owner; }
  // 0, EINVAL (bad name or mode), EEXIST, EDQUOT (the owner holds `limit`).
  int publish(const std::string& name, const NsEntry& e);
  // 0, ENOENT, EPERM (not the owner and not root).
  int unpublish(const std::string& name, const Credentials& who);
  // 0 and the entry, ENOENT or EACCES.
  int lookup(const std::string& name, const Credentials& who, uint32_t access, NsEntry& out) const;
  const NsEntry* find(const std::string& name) const;
  void erase(const std::string& name);
  // The names `owner` holds (bounded by the limit), and how many.
  std::vector<std::string> names_of(uid_t owner) const;
  uint32_t count(uid_t owner) const;
  // The first entry whose name sorts after `after` ("" for the first).
  std::map<std::string, NsEntry>::const_iterator after(const std::string& name) const {
    return entries_.upper_bound(name);
  }
  std::map<std::string, NsEntry>::const_iterator end() const { return entries_.end(); }
  size_t size() const { return entries_.size(); }

 private:
  std::map<std::string, NsEntry> entries_;
  std::unordered_map<uid_t, std::unordered_set<std::string>> by_owner_;
  uint32_t limit_ = 0;
};

}  // namespace sv::daemon
