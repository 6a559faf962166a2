// quota.h: per-user limits on the daemon's objects,
// as the rdma cgroup limits a cgroup's HCA handles and objects: one user
// cannot take the tables, descriptors or memory that every user shares.
//
// Every object the daemon creates for a user is charged to that user (by
// the uid of the context it belongs to) under its kind, and released when
// the object is freed, whatever frees it. Some kinds charge a second kind
// too: MRs and memory windows both take an MR-table key slot, and objects
// the daemon keeps a descriptor for (CQs, QPs, SRQs, backings, connections)
// take a descriptor, channels two (their wake-up pair's ends). Over a quota
// is ENOMEM, or EMFILE for descriptors, channels and connections, or EDQUOT
// for published names (as a file system's per-user quota refuses one more
// file) (docs/PROTOCOL.md, "Quotas").
//
// Defaults (the system daemon; a per-user daemon serves one user and has
// none unless set): a quarter of each shared table (MR-table key slots,
// QP slots, multicast groups and attachments), a quarter of the daemon's
// descriptor limit, 4,096 published names, 1,024 rdma_cm ports, and 65,536
// of each other kind. Root is not exempt: its limits are its own, like any
// user's. SOFTVERBSD_QUOTA_<KIND>=N in the daemon's environment overrides a
// default (KIND: PD, MR, MW, KEYSLOT, CQ, QP, SRQ, CHANNEL, BACKING, XRCD,
// CONNECTION, FD, DM, NAME, MCG, MCGATTACH,
// CMPORT); 0 means no limit. Device memory is also limited in
// bytes per user (proto::kMaxDmSize, registry), whichever daemon.
//
// Contract: single-threaded (the daemon's loop).
#pragma once

#include <sys/types.h>

#include <array>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <utility>

namespace sv::daemon {

class Quotas {
 public:
  enum Kind : uint32_t {
    kPd, kMr, kMw, kKeySlot, kCq, kQp, kSrq, kChannel, kBacking, kXrcd, kConnection, kFd, kDm,
    kName,       // published names (NameSpace counts them; EDQUOT)
    kMcg,        // multicast groups a user created, till they empty (ENOMEM)
    kMcgAttach,  // a user's QPs' multicast attachments (ENOMEM)
    kCmPort,     // rdma_cm ports held through the system daemon (cm_ports.h; ENOMEM)
    kKinds
  };
  static const char* name(Kind k);

  // `system`: the defaults above (else none); `fd_limit`: the daemon's
  // RLIMIT_NOFILE. Then the environment's overrides.
  void configure(bool system, uint64_t fd_limit);
  // May `uid` have one more object of kind `k` (and of the kind it
  // implies)? 0, or ENOMEM/EMFILE.
  int admit(Kind k, uid_t uid) const;
  // Charges object `id` of kind `k` (admitted just before) to `uid`.
  void charge(Kind k, uint32_t id, uid_t uid);
  // Releases object `id`'s charge (nothing if it was never charged).
  void release(Kind k, uint32_t id);
  // Descriptors held for a user outside the kinds above, counted under kFd:
  // a connection's pidfd, its async wake-up socket, its request ring's memfd
  // and wake-up socket, its sharers' wake socket (Op::Wake), its RoCE arrival pair, its process's
  // pinned address space for on-demand paging (four), and the duplicates that
  // replies waiting in its output queue carry. `key` names the holding (a
  // connection's: fd_key(client, what); a queued reply's: its own).
  int admit_fds(uid_t uid, uint32_t n) const;
  void charge_fds(uint64_t key, uid_t uid, uint32_t n);
  void release_fds(uint64_t key);
  enum FdHolding : uint32_t { kPidfd = 1, kAsyncFd, kRingFds, kRoceFds, kWakeFd, kOdpFds };
  static uint64_t fd_key(uint32_t client, FdHolding what) { return (uint64_t(what) << 32) | client; }
  uint32_t limit(Kind k) const { return limit_[k]; }
  uint32_t used(uid_t uid, Kind k) const;

 private:
  std::array<uint32_t, kKinds> limit_{};  // 0 = none
  std::unordered_map<uid_t, std::array<uint32_t, kKinds>> used_;
  std::unordered_map<uint64_t, uid_t> charged_;  // (kind << 32 | id) -> the user charged
  std::unordered_map<uint64_t, std::pair<uid_t, uint32_t>> fds_charged_;  // key -> the user, descriptors
};

}  // namespace sv::daemon
