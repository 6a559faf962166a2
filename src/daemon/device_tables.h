// device_tables.h: the device segments (MR, QP and multicast tables) the
// daemon publishes to clients, one per user.
//
// Contract: single-threaded (the daemon's event loop). Each user (uid) has
// its own segment, made on first use: it holds the MR entries (MRs and
// memory windows) and QP entries of that user's contexts only, so a user
// sees none of another user's keys, addresses or QPNs.
// The key and QPN allocators stay global (Registry), so keys and QPNs are
// unique on the device; each MR slot and QP slot belongs to the user whose
// object took it last (a daemon-private owner per slot), and mr_at/qp_at
// resolve to that user's segment. The per-user daemon serves one user:
// one segment.
//
// A segment is sealed once the daemon has mapped it (F_SEAL_SHRINK |
// F_SEAL_GROW | F_SEAL_FUTURE_WRITE | F_SEAL_SEAL, memfd_create(2),
// fcntl(2) "File Sealing"), its mode is 0400, and clients get a descriptor
// opened O_RDONLY: no writable shared mapping, write(), mprotect to add
// write, or read-write reopen through /proc/self/fd is possible for them.
// Only the daemon's own mapping writes it, so what the daemon reads back
// from it is its own.
//
// Multicast groups: membership must reach every user's UD senders, so the
// authoritative groups are daemon-private here and each group's entry is
// written into every user's segment under its sequence lock (and copied
// into a segment made later). Group membership (GID, LID, QPNs) is thus
// visible to every user of the device, as on a fabric.
#pragma once

#include <sys/types.h>

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "common/shm_layout.h"
#include "common/sys.h"

namespace sv::daemon {

class DeviceTables {
 public:
  DeviceTables();
  void set_boot_id(uint64_t id) { boot_id_ = id; }

  // The read-only descriptor of `uid`'s segment (made on demand), or -1
  // with `err` set.
  int segment_fd(uid_t uid, int& err);

  // The entry of an MR slot (key >> 8) in its owner's segment. A slot that
  // never had an owner reads as a free entry (key 0) kept by the daemon.
  shm::MrEntry& mr_at(uint32_t slot);
  const shm::MrEntry& mr_at(uint32_t slot) const { return const_cast<DeviceTables*>(this)->mr_at(slot); }
  // Gives a free MR slot to `uid` before its entry is written (its entry in
  // the previous owner's segment is cleared). 0 or an errno.
  int claim_mr(uint32_t slot, uid_t uid);

  // The entry of a QP (by QPN or slot: the low 16 bits) in its owner's segment.
  shm::QpEntry& qp_at(uint32_t qpn);
  const shm::QpEntry& qp_at(uint32_t qpn) const { return const_cast<DeviceTables*>(this)->qp_at(qpn); }
  int claim_qp(uint32_t slot, uid_t uid);

  // Multicast (ibv_attach_mcast(3)): EINVAL/ENOMEM as the verbs say.
  // Attaching an attached QP is a success. `change` says what happened, for
  // the per-user charges: the group's slot, whether the QP was added (not
  // there before), and whether the group was created or emptied (freed).
  struct McgChange {
    uint32_t slot = 0;
    bool added = false, removed = false;
    bool created = false, emptied = false;
  };
  int mcg_attach(const uint8_t* gid, uint16_t lid, uint32_t qpn, McgChange* change = nullptr);
  int mcg_detach(const uint8_t* gid, uint32_t qpn, McgChange* change = nullptr);  // EINVAL: not attached
  std::vector<McgChange> mcg_remove_qp(uint32_t qpn);  // a destroyed QP leaves every group
  // For the RoCEv2 port (docs/ROCE.md, "Multicast"): a counter that moves
  // whenever a group changes, the GIDs of the groups that have members, and
  // a group's members (false: no such group).
  uint64_t mcg_generation() const { return mcg_generation_; }
  std::vector<std::array<uint8_t, 16>> mcg_gids() const;
  bool mcg_members(const uint8_t* gid, std::vector<uint32_t>& out) const;

 private:
  struct Segment {
    uid_t uid;
    Fd ro_fd;  // O_RDONLY, what clients get
    Mapping map;
    shm::MrEntry* mr = nullptr;
    shm::QpEntry* qp = nullptr;
    shm::McgEntry* mcg = nullptr;
  };
  struct Group {
    uint8_t gid[16];
    uint16_t lid;
    uint32_t count;  // 0: free; never above kMcgMaxQps
    uint32_t qpns[shm::kMcgMaxQps];
  };
  int segment_of(uid_t uid, uint32_t& index);  // 1-based index into segs_
  int make_segment(uid_t uid, std::unique_ptr<Segment>& out);
  void publish(uint32_t group);  // writes group `group` into every segment
  static void write_group(shm::McgEntry& e, const Group& g);

  uint64_t boot_id_ = 0;
  uint64_t mcg_generation_ = 0;
  std::vector<std::unique_ptr<Segment>> segs_;
  std::map<uid_t, uint32_t> seg_by_uid_;
  std::vector<uint32_t> mr_seg_;  // per MR slot: owner's segment index, 0 = none
  std::vector<uint32_t> qp_seg_;  // per QP slot
  shm::MrEntry blank_mr_{};
  shm::QpEntry blank_qp_{};
  std::vector<Group> groups_;
};

}  // namespace sv::daemon
