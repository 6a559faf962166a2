// names.cc: the namespace's verbs (see names.h; docs/SHARING.md).
#include "daemon/names.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

namespace sv::daemon {

namespace names_fields {
// A name field from a client: NUL-terminated within its array, else empty
// (which no valid name is).
std::string field_name(const char (&name)[proto::kMaxNsName]) {
  size_t n = ::strnlen(name, proto::kMaxNsName);
  return n == proto::kMaxNsName ? std::string() : std::string(name, n);
}
}  // namespace names_fields

// Drops `name` if the object it names is gone; true if it was dropped.
// Only that one entry is looked at.
bool Names::drop_if_dead(const std::string& name) {
  const NsEntry* e = ns_.find(name);
  if (!e || host_.names_live_object(*e)) return false;
  ns_.erase(name);
  return true;
}

// Drops the names of `owner` whose objects are gone: bounded by what that
// owner may hold (its quota), never by anybody else's names.
void Names::collect_owner(uid_t owner) {
  for (const std::string& n : ns_.names_of(owner)) drop_if_dead(n);
}

int Names::publish(uint32_t client, const proto::NsPublishReq& req) {
  ClientView c;
  if (!host_.find_client(client, c)) return EINVAL;
  std::string name = names_fields::field_name(req.name);
  if (!NameSpace::valid_name(name) || (req.mode & ~0777u)) return EINVAL;
  NsEntry e{req.kind, req.handle, c.ctx, c.uid, c.gid, req.mode};
  if (!host_.names_live_object(e)) return EINVAL;  // not an object of the caller's context
  if (req.group != -1) {
    // As chgrp(1): only to a group the caller is in, unless root.
    Credentials who = host_.credentials(client);
    gid_t g = gid_t(req.group);
    if (req.group < 0) return EINVAL;
    if (who.uid != 0 && g != who.gid && std::find(who.groups.begin(), who.groups.end(), g) == who.groups.end())
      return EPERM;
    e.group = g;
  }
  drop_if_dead(name);
  Quotas& quotas = host_.quotas();
  ns_.set_limit(quotas.limit(Quotas::kName));
  if (quotas.limit(Quotas::kName) && ns_.count(e.owner) >= quotas.limit(Quotas::kName)) collect_owner(e.owner);
  int err = ns_.publish(name, e);
  if (err == EDQUOT)
    std::fprintf(stderr, "softverbsd: uid %u publishes more than %u names (SOFTVERBSD_QUOTA_NAME): EDQUOT\n",
                 unsigned(e.owner), quotas.limit(Quotas::kName));
  return err;
}

int Names::unpublish(uint32_t client, const proto::NsNameReq& req) {
  std::string name = names_fields::field_name(req.name);
  if (!NameSpace::valid_name(name)) return EINVAL;
  drop_if_dead(name);
  return ns_.unpublish(name, host_.credentials(client));
}

int Names::open(uint32_t client, const proto::NsNameReq& req, proto::NsOpenReply& rep) {
  ClientView me;
  if (!host_.find_client(client, me)) return EINVAL;
  if (req.access == 0 || (req.access & ~(proto::kNsRead | proto::kNsWrite))) return EINVAL;
  if (req.flags & ~proto::kNsOwn) return EINVAL;
  std::string name = names_fields::field_name(req.name);
  drop_if_dead(name);
  if (req.flags & proto::kNsOwn) {
    // The caller names an object it expects to be its own user's: a name
    // another user published (squatting it first) is refused before the
    // mode is looked at, and grants nothing.
    if (const NsEntry* it = ns_.find(name)) {
      if (it->owner != me.uid || !host_.context_open(it->ctx) || host_.context_uid(it->ctx) != me.uid)
        return EPERM;
    }
  }
  NsEntry e{};
  if (int err = ns_.lookup(name, host_.credentials(client), req.access, e)) return err;
  // The mode allowed it. Between users the daemon never joins the caller to
  // the owner's context: its descriptors would map more than the named
  // object (its holder's whole backing memory), and a joined root process
  // would register its own memory in the other user's context. Root is no
  // exception (same_user). A CQ is granted by itself, for polling through
  // the daemon (CompletionQueues::poll_granted); PDs, MRs, QPs and SRQs of
  // another user are reached through keys over a connection instead
  // (mediation.cc).
  if (!host_.same_user(client, e.ctx)) {
    if (e.kind != proto::kNsCq) return EPERM;
    cqs_.grant(client, e.handle);
    rep.kind = e.kind;
    rep.handle = e.handle;
    return 0;
  }
  if (me.ctx != e.ctx) {
    // As ibv_import_device: this connection must not hold objects of its own.
    if (int err = host_.attach_client(client, e.ctx)) return err;
  }
  rep.kind = e.kind;
  rep.handle = e.handle;
  return 0;
}

// One page of names after `after` (a name cursor: no walk to an index).
// Entries of objects that are gone are dropped as they are met, each once.
void Names::list(const std::string& after, proto::NsListReply& rep) {
  rep.count = 0;
  std::vector<std::string> gone;
  for (auto it = ns_.after(after); it != ns_.end() && rep.count < proto::kNsListPage; ++it) {
    const auto& [name, e] = *it;
    if (!host_.names_live_object(e)) {
      gone.push_back(name);
      continue;
    }
    proto::NsListEntry& out = rep.entries[rep.count++];
    std::memset(&out, 0, sizeof(out));
    std::memcpy(out.name, name.data(), std::min(name.size(), proto::kMaxNsName - 1));
    out.kind = e.kind;
    out.handle = e.handle;
    out.uid = uint32_t(e.owner);
    out.gid = uint32_t(e.group);
    out.mode = e.mode;
  }
  for (const auto& n : gone) ns_.erase(n);
  rep.total = uint32_t(ns_.size());
}

}  // namespace sv::daemon
