#include "daemon/cm_ports.h"

#include <arpa/inet.h>
#include <rdma/rdma_cma.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "rdmacm/rendezvous.h"

namespace sv::daemon {

namespace {

bool valid_ps(uint32_t ps) {
  return ps == RDMA_PS_TCP || ps == RDMA_PS_UDP || ps == RDMA_PS_IB || ps == RDMA_PS_IPOIB;
}

bool is_wildcard(const std::string& a) { return a == "0.0.0.0" || a == "::"; }

uint16_t random_port() {
  uint32_t r = 0;
  if (::getrandom(&r, sizeof r, 0) != sizeof r) r = uint32_t(::random());
  return uint16_t(32768 + r % (60999 - 32768));  // Linux's ip_local_port_range default
}

}  // namespace

std::string CmPorts::address_text(uint16_t family, const uint8_t* addr) {
  char buf[INET6_ADDRSTRLEN] = "";
  static const uint8_t kMapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  if (family == AF_INET) {
    ::inet_ntop(AF_INET, addr, buf, sizeof buf);
  } else if (family == AF_INET6) {
    if (std::memcmp(addr, kMapped, 12) == 0)
      ::inet_ntop(AF_INET, addr + 12, buf, sizeof buf);
    else
      ::inet_ntop(AF_INET6, addr, buf, sizeof buf);
  }
  return buf;
}

// May `uid` hold `addr` of port `k`? (cm_ports.h, "Rules".)
bool CmPorts::conflicts(uint64_t k, uid_t uid, const std::string& addr) const {
  auto it = ports_.find(k);
  if (it == ports_.end()) return false;
  const bool v6 = addr.find(':') != std::string::npos;
  for (const Binding& b : it->second) {
    if (b.addr == addr) return true;
    if (is_wildcard(b.addr)) {
      if (!is_wildcard(addr)) return true;
      if (b.uid != uid) return true;  // the other family's wildcard, another user's
      continue;
    }
    if (is_wildcard(addr) && (b.uid != uid || (b.addr.find(':') != std::string::npos) == v6)) return true;
  }
  return false;
}

// Makes the listening socket of (ps, port, addr) in the directory (0666:
// every user may connect to it; only the daemon creates or removes one).
// It appears at its path already listening with its mode (listen_seqpacket).
int CmPorts::make(uint32_t client, uid_t uid, uint32_t ps, uint16_t port, const std::string& addr, int& fd) {
  const std::string path = dir_ + "/" + rdmacm::rendezvous_name(int(ps), port, addr);
  Fd s;
  if (int e = listen_seqpacket(path, s, 0666)) return e;
  const uint32_t id = next_id_++;
  fd = s.get();
  ports_[key(ps, port)].push_back(Binding{id, client, uid, addr, path, std::move(s)});
  by_id_[id] = key(ps, port);
  by_client_[client].push_back(id);
  quotas_.charge(Quotas::kCmPort, id, uid);
  return 0;
}

int CmPorts::bind(uint32_t client, uid_t uid, const proto::CmBindReq& req, uint16_t& port, int& fd) {
  if (dir_.empty()) return EOPNOTSUPP;
  if (!valid_ps(req.ps)) return EINVAL;
  const std::string addr = address_text(req.family, req.addr);
  if (addr.empty()) return EINVAL;
  if (req.port && req.port < 1024 && uid != 0) {
    std::fprintf(stderr, "softverbsd: uid %u binds rdma_cm port %u: below 1024 only root may (EACCES)\n",
                 unsigned(uid), unsigned(req.port));
    return EACCES;
  }
  if (int e = quotas_.admit(Quotas::kCmPort, uid)) {
    std::fprintf(stderr, "softverbsd: uid %u holds %u rdma_cm ports (SOFTVERBSD_QUOTA_CMPORT): %s\n", unsigned(uid),
                 quotas_.used(uid, Quotas::kCmPort), std::strerror(e));
    return e;
  }
  if (req.port) {
    if (conflicts(key(req.ps, req.port), uid, addr)) return EADDRINUSE;
    port = req.port;
    return make(client, uid, req.ps, port, addr, fd);
  }
  for (int i = 0; i < 1000; ++i) {
    port = random_port();
    if (ports_.count(key(req.ps, port))) continue;
    return make(client, uid, req.ps, port, addr, fd);
  }
  return EADDRINUSE;
}

void CmPorts::remove(uint64_t k, uint32_t id) {
  auto p = ports_.find(k);
  if (p == ports_.end()) return;
  auto& v = p->second;
  auto it = std::find_if(v.begin(), v.end(), [&](const Binding& b) { return b.id == id; });
  if (it == v.end()) return;
  ::unlink(it->path.c_str());
  quotas_.release(Quotas::kCmPort, id);
  v.erase(it);
  if (v.empty()) ports_.erase(p);
  by_id_.erase(id);
}

int CmPorts::unbind(uint32_t client, const proto::CmBindReq& req) {
  const std::string addr = address_text(req.family, req.addr);
  auto p = ports_.find(key(req.ps, req.port));
  if (addr.empty() || p == ports_.end()) return ENOENT;
  for (const Binding& b : p->second) {
    if (b.client != client || b.addr != addr) continue;
    const uint32_t id = b.id;
    remove(p->first, id);
    auto c = by_client_.find(client);
    if (c != by_client_.end()) {
      std::erase(c->second, id);
      if (c->second.empty()) by_client_.erase(c);
    }
    return 0;
  }
  return ENOENT;
}

void CmPorts::release_client(uint32_t client) {
  auto c = by_client_.find(client);
  if (c == by_client_.end()) return;
  for (uint32_t id : c->second) {
    auto k = by_id_.find(id);
    if (k != by_id_.end()) remove(k->second, id);
  }
  by_client_.erase(c);
}

}  // namespace sv::daemon
