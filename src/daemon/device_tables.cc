#include "daemon/device_tables.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

namespace sv::daemon {

using namespace sv::shm;

namespace {

constexpr int kSeals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE | F_SEAL_SEAL;

template <class T>
void zero(T& e) {
  std::memset(static_cast<void*>(&e), 0, sizeof(e));
}

}  // namespace

DeviceTables::DeviceTables() : mr_seg_(kMrTableSize, 0), qp_seg_(kQpTableSize, 0), groups_(kMcgTableSize) {
  for (Group& g : groups_) zero(g);
}

int DeviceTables::make_segment(uid_t uid, std::unique_ptr<Segment>& out) {
  auto s = std::make_unique<Segment>();
  s->uid = uid;
  Fd rw;
  char name[48];
  std::snprintf(name, sizeof(name), "softverbs-device-%u", unsigned(uid));
  // Fixed size now; the final seals come once the daemon has mapped it.
  if (int e = make_memfd(name, DeviceLayout::size(), rw, kFixedSizeSeals)) return e;
  if (int e = map_shared(rw.get(), 0, DeviceLayout::size(), PROT_READ | PROT_WRITE, false, s->map)) return e;
  auto* h = s->map.as<DeviceHeader>();
  h->magic = kDeviceMagic;
  h->version = kLayoutVersion;
  h->size = DeviceLayout::size();
  h->mr_table_offset = DeviceLayout::mr_offset();
  h->qp_table_offset = DeviceLayout::qp_offset();
  h->mr_capacity = kMrTableSize;
  h->qp_capacity = kQpTableSize;
  h->boot_id = boot_id_;
  s->mr = reinterpret_cast<MrEntry*>(s->map.as<char>() + DeviceLayout::mr_offset());
  s->qp = reinterpret_cast<QpEntry*>(s->map.as<char>() + DeviceLayout::qp_offset());
  s->mcg = reinterpret_cast<McgEntry*>(s->map.as<char>() + DeviceLayout::mcg_offset());
  // The groups so far (no reader maps this segment yet).
  for (uint32_t i = 0; i < kMcgTableSize; ++i)
    if (groups_[i].count) write_group(s->mcg[i], groups_[i]);
  // Sealed now that the daemon's writable mapping exists: with
  // F_SEAL_FUTURE_WRITE no new writable shared mapping, no write() and no
  // hole punched is possible on this file, through any descriptor, its
  // owner's included (memfd_create(2), fcntl(2) "File seals"); ours keeps
  // working. Owned by its user (a root daemon chowns it), mode 0400: its
  // user's processes can reopen it for reading (the lock RDMA atomics on
  // ODP memory take, verbs/context.cc open_odp_lock), and no other user
  // can reopen it at all (/proc/PID/fd needs ptrace access to a holder).
  if (::fcntl(rw.get(), F_ADD_SEALS, kSeals) != 0) return errno;
  if (::geteuid() == 0 && uid != 0 && ::fchown(rw.get(), uid, gid_t(-1)) != 0) return errno;
  if (::fchmod(rw.get(), 0400) != 0) return errno;
  char self[64];
  std::snprintf(self, sizeof(self), "/proc/self/fd/%d", rw.get());
  int ro = ::open(self, O_RDONLY | O_CLOEXEC);
  if (ro < 0) return errno;
  s->ro_fd.reset(ro);
  out = std::move(s);
  return 0;  // `rw` closes: only the mapping and the read-only descriptor stay
}

int DeviceTables::segment_of(uid_t uid, uint32_t& index) {
  if (auto it = seg_by_uid_.find(uid); it != seg_by_uid_.end()) {
    index = it->second;
    return 0;
  }
  std::unique_ptr<Segment> s;
  if (int e = make_segment(uid, s)) return e;
  segs_.push_back(std::move(s));
  index = uint32_t(segs_.size());
  seg_by_uid_[uid] = index;
  return 0;
}

int DeviceTables::segment_fd(uid_t uid, int& err) {
  uint32_t i = 0;
  if ((err = segment_of(uid, i))) return -1;
  return segs_[i - 1]->ro_fd.get();
}

MrEntry& DeviceTables::mr_at(uint32_t slot) {
  uint32_t i = slot < kMrTableSize ? mr_seg_[slot] : 0;
  if (i) return segs_[i - 1]->mr[slot];
  zero(blank_mr_);  // whatever a caller may have stored in it
  return blank_mr_;
}

int DeviceTables::claim_mr(uint32_t slot, uid_t uid) {
  if (slot == 0 || slot >= kMrTableSize) return EINVAL;
  uint32_t i = 0;
  if (int e = segment_of(uid, i)) return e;
  uint32_t old = mr_seg_[slot];
  if (old == i) return 0;
  if (old) {
    MrEntry& e = segs_[old - 1]->mr[slot];
    e.key.store(0, std::memory_order_release);
    zero(e);
  }
  mr_seg_[slot] = i;
  return 0;
}

QpEntry& DeviceTables::qp_at(uint32_t qpn) {
  uint32_t slot = qpn & (kQpTableSize - 1);
  if (uint32_t i = qp_seg_[slot]) return segs_[i - 1]->qp[slot];
  zero(blank_qp_);
  return blank_qp_;
}

int DeviceTables::claim_qp(uint32_t slot, uid_t uid) {
  slot &= kQpTableSize - 1;
  uint32_t i = 0;
  if (int e = segment_of(uid, i)) return e;
  uint32_t old = qp_seg_[slot];
  if (old == i) return 0;
  if (old) {
    QpEntry& e = segs_[old - 1]->qp[slot];
    e.qpn.store(0, std::memory_order_release);
    zero(e);
  }
  qp_seg_[slot] = i;
  return 0;
}

// ---- Multicast ---------------------------------------------------------------

void DeviceTables::write_group(McgEntry& e, const Group& g) {
  // Sequence lock: odd while rewritten, so a sender that read a torn entry
  // reads it again (verbs/mcast.cc).
  e.seq.fetch_add(1, std::memory_order_acq_rel);
  std::memcpy(e.gid, g.gid, 16);
  e.lid = g.lid;
  e.count = g.count;
  std::memcpy(e.qpns, g.qpns, sizeof(e.qpns));
  e.seq.fetch_add(1, std::memory_order_release);
}

void DeviceTables::publish(uint32_t group) {
  ++mcg_generation_;
  for (auto& s : segs_) write_group(s->mcg[group], groups_[group]);
}

int DeviceTables::mcg_attach(const uint8_t* gid, uint16_t lid, uint32_t qpn, McgChange* change) {
  McgChange dummy;
  McgChange& ch = change ? *change : dummy;
  uint32_t slot = kMcgTableSize, free_slot = kMcgTableSize;
  for (uint32_t i = 0; i < kMcgTableSize; ++i) {
    if (groups_[i].count && std::memcmp(groups_[i].gid, gid, 16) == 0) {
      slot = i;
      break;
    }
    if (!groups_[i].count && free_slot == kMcgTableSize) free_slot = i;
  }
  if (slot == kMcgTableSize) {
    if (free_slot == kMcgTableSize) return ENOMEM;  // max_mcast_grp
    slot = free_slot;
    Group& g = groups_[slot];
    zero(g);
    ch.created = true;
    std::memcpy(g.gid, gid, 16);
    g.lid = lid;
  }
  Group& g = groups_[slot];
  for (uint32_t i = 0; i < g.count; ++i)
    if (g.qpns[i] == qpn) return 0;  // attached already
  if (g.count >= kMcgMaxQps) return ENOMEM;  // max_mcast_qp_attach
  g.qpns[g.count++] = qpn;
  ch.slot = slot;
  ch.added = true;
  publish(slot);
  return 0;
}

int DeviceTables::mcg_detach(const uint8_t* gid, uint32_t qpn, McgChange* change) {
  for (uint32_t s = 0; s < kMcgTableSize; ++s) {
    Group& g = groups_[s];
    if (!g.count || std::memcmp(g.gid, gid, 16) != 0) continue;
    uint32_t i = 0;
    while (i < g.count && g.qpns[i] != qpn) ++i;
    if (i == g.count) return EINVAL;  // not attached
    g.qpns[i] = g.qpns[g.count - 1];
    g.qpns[--g.count] = 0;
    if (!g.count) zero(g);
    if (change) *change = McgChange{s, false, true, false, g.count == 0};
    publish(s);
    return 0;
  }
  return EINVAL;
}

std::vector<DeviceTables::McgChange> DeviceTables::mcg_remove_qp(uint32_t qpn) {
  std::vector<McgChange> out;
  for (uint32_t s = 0; s < kMcgTableSize; ++s) {
    Group& g = groups_[s];
    if (!g.count) continue;
    uint32_t i = 0;
    while (i < g.count && g.qpns[i] != qpn) ++i;
    if (i == g.count) continue;
    g.qpns[i] = g.qpns[g.count - 1];
    g.qpns[--g.count] = 0;
    if (!g.count) zero(g);
    out.push_back(McgChange{s, false, true, false, g.count == 0});
    publish(s);
  }
  return out;
}

std::vector<std::array<uint8_t, 16>> DeviceTables::mcg_gids() const {
  std::vector<std::array<uint8_t, 16>> v;
  for (const Group& g : groups_) {
    if (!g.count) continue;
    v.emplace_back();
    std::memcpy(v.back().data(), g.gid, 16);
  }
  return v;
}

bool DeviceTables::mcg_members(const uint8_t* gid, std::vector<uint32_t>& out) const {
  out.clear();
  for (const Group& g : groups_) {
    if (!g.count || std::memcmp(g.gid, gid, 16) != 0) continue;
    out.assign(g.qpns, g.qpns + std::min(g.count, shm::kMcgMaxQps));
    return true;
  }
  return false;
}

}  // namespace sv::daemon
