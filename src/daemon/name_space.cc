#include "daemon/name_space.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

namespace sv::daemon {

std::vector<gid_t> supplementary_groups(pid_t pid) {
  std::vector<gid_t> out;
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("Groups:", 0) != 0) continue;
    std::istringstream in(line.substr(7));
    unsigned long g;
    while (in >> g) out.push_back(gid_t(g));
    break;
  }
  return out;
}

bool NameSpace::valid_name(const std::string& name) {
  if (name.size() < 2 || name.size() >= proto::kMaxNsName || name[0] != '/' || name.back() == '/') return false;
  size_t start = 1;
  while (start <= name.size()) {
    size_t end = name.find('/', start);
    if (end == std::string::npos) end = name.size();
    std::string part = name.substr(start, end - start);
    if (part.empty() || part == "." || part == "..") return false;
    for (char c : part)
      if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-')) return false;
    start = end + 1;
  }
  return true;
}

bool NameSpace::permitted(const NsEntry& e, const Credentials& who, uint32_t access) {
  if (who.uid == 0) return true;
  uint32_t bits;
  if (who.uid == e.owner) {
    bits = (e.mode >> 6) & 7;
  } else if (who.gid == e.group ||
             std::find(who.groups.begin(), who.groups.end(), e.group) != who.groups.end()) {
    bits = (e.mode >> 3) & 7;
  } else {
    bits = e.mode & 7;
  }
  return (access & ~bits) == 0;
}

int NameSpace::publish(const std::string& name, const NsEntry& e) {
  if (!valid_name(name) || (e.mode & ~0777u)) return EINVAL;
  if (entries_.count(name)) return EEXIST;
  if (limit_ && count(e.owner) >= limit_) return EDQUOT;
  entries_.emplace(name, e);
  by_owner_[e.owner].insert(name);
  return 0;
}

int NameSpace::unpublish(const std::string& name, const Credentials& who) {
  auto it = entries_.find(name);
  if (it == entries_.end()) return ENOENT;
  if (who.uid != 0 && who.uid != it->second.owner) return EPERM;
  erase(name);
  return 0;
}

int NameSpace::lookup(const std::string& name, const Credentials& who, uint32_t access, NsEntry& out) const {
  if (!valid_name(name)) return EINVAL;
  auto it = entries_.find(name);
  if (it == entries_.end()) return ENOENT;
  if (!permitted(it->second, who, access)) return EACCES;
  out = it->second;
  return 0;
}

const NsEntry* NameSpace::find(const std::string& name) const {
  auto it = entries_.find(name);
  return it == entries_.end() ? nullptr : &it->second;
}

void NameSpace::erase(const std::string& name) {
  auto it = entries_.find(name);
  if (it == entries_.end()) return;
  auto o = by_owner_.find(it->second.owner);
  if (o != by_owner_.end()) {
    o->second.erase(name);
    if (o->second.empty()) by_owner_.erase(o);
  }
  entries_.erase(it);
}

std::vector<std::string> NameSpace::names_of(uid_t owner) const {
  auto o = by_owner_.find(owner);
  if (o == by_owner_.end()) return {};
  return {o->second.begin(), o->second.end()};
}

uint32_t NameSpace::count(uid_t owner) const {
  auto o = by_owner_.find(owner);
  return o == by_owner_.end() ? 0 : uint32_t(o->second.size());
}

}  // namespace sv::daemon
