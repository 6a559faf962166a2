#include "daemon/quota.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>

#include "common/shm_layout.h"

namespace sv::daemon {

namespace {

// The second kind an object of kind k takes, or kKinds; and how many of it.
uint32_t implied_count(Quotas::Kind k) { return k == Quotas::kChannel ? 2 : 1; }  // a channel: both ends of its pair
Quotas::Kind implied(Quotas::Kind k) {
  switch (k) {
    case Quotas::kMr:
    case Quotas::kMw:
      return Quotas::kKeySlot;
    case Quotas::kChannel:
    case Quotas::kCq:
    case Quotas::kQp:
    case Quotas::kSrq:
    case Quotas::kBacking:
    case Quotas::kConnection:
      return Quotas::kFd;
    default:
      return Quotas::kKinds;
  }
}

int over(Quotas::Kind k) {
  if (k == Quotas::kName) return EDQUOT;
  return k == Quotas::kFd || k == Quotas::kChannel || k == Quotas::kConnection ? EMFILE : ENOMEM;
}

}  // namespace

const char* Quotas::name(Kind k) {
  static const char* const names[kKinds] = {"PD", "MR", "MW", "KEYSLOT", "CQ", "QP",
                                            "SRQ", "CHANNEL", "BACKING", "XRCD", "CONNECTION", "FD", "DM",
                                            "NAME", "MCG", "MCGATTACH", "CMPORT"};
  return k < kKinds ? names[k] : "?";
}

void Quotas::configure(bool system, uint64_t fd_limit) {
  limit_.fill(0);
  if (system) {
    limit_.fill(1u << 16);
    limit_[kMr] = limit_[kMw] = limit_[kKeySlot] = shm::kMrTableSize / 4;
    limit_[kQp] = shm::kQpTableSize / 4;
    limit_[kName] = 4096;
    limit_[kCmPort] = 1024;
    limit_[kMcg] = shm::kMcgTableSize / 4;
    limit_[kMcgAttach] = shm::kMcgTableSize * shm::kMcgMaxQps / 4;
    // A quarter of the daemon's descriptors (at least a few for a small limit).
    limit_[kFd] = uint32_t(std::max<uint64_t>(16, std::min<uint64_t>(fd_limit / 4, 1u << 30)));
    limit_[kChannel] = limit_[kConnection] = std::min(limit_[kFd], 1u << 16);
  }
  for (uint32_t k = 0; k < kKinds; ++k) {
    std::string var = std::string("SOFTVERBSD_QUOTA_") + name(Kind(k));
    if (const char* v = std::getenv(var.c_str())) {
      char* end = nullptr;
      unsigned long n = std::strtoul(v, &end, 10);
      if (end != v && *end == 0 && n <= 0xffffffffu) limit_[k] = uint32_t(n);
    }
  }
}

int Quotas::admit(Kind k, uid_t uid) const {
  auto it = used_.find(uid);
  if (it == used_.end()) return 0;
  const Kind k2 = implied(k);
  if (limit_[k] && it->second[k] >= limit_[k]) return over(k);
  if (k2 != kKinds && limit_[k2] && uint64_t(it->second[k2]) + implied_count(k) > limit_[k2]) return over(k2);
  return 0;
}

void Quotas::charge(Kind k, uint32_t id, uid_t uid) {
  const uint64_t key = (uint64_t(k) << 32) | id;
  if (charged_.count(key)) return;
  auto& u = used_[uid];
  ++u[k];
  if (const Kind k2 = implied(k); k2 != kKinds) u[k2] += implied_count(k);
  charged_[key] = uid;
}

void Quotas::release(Kind k, uint32_t id) {
  auto it = charged_.find((uint64_t(k) << 32) | id);
  if (it == charged_.end()) return;
  auto u = used_.find(it->second);
  if (u != used_.end()) {
    if (u->second[k]) --u->second[k];
    const Kind k2 = implied(k);
    if (k2 != kKinds) u->second[k2] -= std::min(u->second[k2], implied_count(k));
  }
  charged_.erase(it);
}

int Quotas::admit_fds(uid_t uid, uint32_t n) const {
  auto it = used_.find(uid);
  if (it == used_.end() || !limit_[kFd]) return 0;
  return uint64_t(it->second[kFd]) + n > limit_[kFd] ? EMFILE : 0;
}

void Quotas::charge_fds(uint64_t key, uid_t uid, uint32_t n) {
  if (!n) return;
  release_fds(key);
  used_[uid][kFd] += n;
  fds_charged_[key] = {uid, n};
}

void Quotas::release_fds(uint64_t key) {
  auto it = fds_charged_.find(key);
  if (it == fds_charged_.end()) return;
  auto u = used_.find(it->second.first);
  if (u != used_.end()) u->second[kFd] -= std::min(u->second[kFd], it->second.second);
  fds_charged_.erase(it);
}

uint32_t Quotas::used(uid_t uid, Kind k) const {
  auto it = used_.find(uid);
  return it == used_.end() ? 0 : it->second[k];
}

}  // namespace sv::daemon
