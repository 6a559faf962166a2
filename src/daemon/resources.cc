// resources.cc: the objects a client may see, for `rdma resource show`
// (Op::ResList; src/nldev/ turns them into RDMA netlink). Like the kernel's
// restrack, which shows a process's objects only within its pid namespace
// (every client of this daemon is of the daemon's own), and, as one daemon
// serves many users, only the caller's own user's objects unless the
// caller is root. A user's call walks its own contexts' objects only (by
// the owner index): what it costs the daemon is bounded by what the user
// holds, not by every user's objects.
#include <algorithm>
#include <cerrno>
#include <iterator>

#include "common/shm_layout.h"
#include "daemon/registry.h"

namespace sv::daemon {

uint32_t Registry::context_pid(uint32_t context) const {
  auto it = ctx_clients_.lower_bound({context, 0});
  return it != ctx_clients_.end() && it->first == context ? client_pid(it->second) : 0;
}

std::vector<uint32_t> Registry::contexts_of_user(uid_t uid) const {
  std::vector<uint32_t> v;
  for (auto it = user_contexts_.lower_bound({uid, 0}); it != user_contexts_.end() && it->first == uid; ++it)
    v.push_back(it->second);
  return v;
}

namespace {

// The handles of the page after `after`: root's, the table's; another
// user's, its own contexts' (`ctxs`) merged in handle order, by the owner
// index, so that what the call costs is bounded by the caller's own
// objects, not by every user's.
template <class Table>
std::vector<uint32_t> next_page(const Table& table, const std::vector<uint32_t>* ctxs, uint32_t after) {
  std::vector<uint32_t> ids;
  if (!ctxs) {
    for (auto it = table.upper_bound(after); it != table.end() && ids.size() < proto::kResListPage; ++it)
      ids.push_back(it->first);
    return ids;
  }
  for (uint32_t c : *ctxs) {
    const std::vector<uint32_t> more = table.of_after(c, after, proto::kResListPage);
    ids.insert(ids.end(), more.begin(), more.end());
  }
  std::sort(ids.begin(), ids.end());
  if (ids.size() > proto::kResListPage) ids.resize(proto::kResListPage);
  return ids;
}

// Fills the page: each object's handle and context, then `fill` its kind's fields.
template <class Table, class Fill>
void page_of(const Table& table, const std::vector<uint32_t>* ctxs, uint32_t after, proto::ResListReply& rep,
             Fill&& fill) {
  for (uint32_t h : next_page(table, ctxs, after)) {
    auto it = table.find(h);
    if (it == table.end()) continue;
    proto::ResEntry& e = rep.entries[rep.count++];
    e = {};
    e.handle = h;
    e.context = it->second.owner;
    fill(h, it->second, e);
  }
}

}  // namespace

int Registry::res_list(uint32_t client, const proto::ResListReq& req, proto::ResListReply& rep) const {
  rep.count = 0;
  const uid_t me = client_uid(client);
  if (me == uid_t(-1)) return EINVAL;
  const std::vector<uint32_t> mine = contexts_of_user(me);
  const std::vector<uint32_t>* may_see = me == 0 ? nullptr : &mine;  // root: every user's
  auto who = [&](const Object& o, proto::ResEntry& e) {
    e.uid = uint32_t(context_uid(o.owner));
    e.pid = context_pid(o.owner);
  };
  switch (req.kind) {
    case proto::kResQp:
      page_of(qp_.table(), may_see, req.after, rep, [&](uint32_t qpn, const Qp& q, proto::ResEntry& e) {
        who(q, e);
        const shm::QpEntry& slot = qp_.slot(qpn);
        e.a = uint32_t(q.type);
        e.b = slot.state.load(std::memory_order_relaxed);
        e.c = q.pd;
        e.d = slot.dest_qpn.load(std::memory_order_relaxed);
        e.length = uint64_t(q.sq_psn) << 32 | q.rq_psn;
      });
      return 0;
    case proto::kResCq:
      page_of(cq_.table(), may_see, req.after, rep, [&](uint32_t, const Cq& c, proto::ResEntry& e) {
        who(c, e);
        e.a = c.capacity;
        e.b = c.refs;
      });
      return 0;
    case proto::kResMr:
      page_of(mr_.table(), may_see, req.after, rep, [&](uint32_t, const Mr& m, proto::ResEntry& e) {
        who(m, e);
        if (m.charged_pid) e.pid = uint32_t(m.charged_pid);
        e.a = m.key;
        e.b = m.pd;
        if (const shm::MrEntry* me_ = mr_.entry(m.key)) {
          e.length = me_->length;
          e.iova = me_->iova;
        }
      });
      return 0;
    case proto::kResPd:
      page_of(pd_.table(), may_see, req.after, rep, [&](uint32_t, const Pd& p, proto::ResEntry& e) {
        who(p, e);
        e.b = p.refs;
      });
      return 0;
    default:
      return EINVAL;
  }
}

}  // namespace sv::daemon
