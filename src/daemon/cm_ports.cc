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
bool is_v6(const std::string& a) { return a.find(':') != std::string::npos; }

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

// May `uid` hold `addr` of port `k`? (cm_ports.h, "Rules".) O(log n).
bool CmPorts::conflicts(uint64_t k, uid_t uid, const std::string& addr) const {
  auto it = ports_.find(k);
  if (it == ports_.end()) return false;
  const Port& p = it->second;
  if (p.by_addr.count(addr)) return true;
  if (!is_wildcard(addr)) return p.by_addr.count("0.0.0.0") || p.by_addr.count("::");
  const bool v6 = is_v6(addr);
  auto other = p.by_addr.find(v6 ? "0.0.0.0" : "::");
  if (other != p.by_addr.end() && other->second.uid != uid) return true;
  if (p.specific.count({uid, v6})) return true;
  const size_t mine = p.specific.count({uid, false}) + p.specific.count({uid, true});
  return p.specific.size() > mine;  // another user's specific address
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
  Port& p = ports_[key(ps, port)];
  p.by_addr.emplace(addr, Binding{id, client, uid, path, std::move(s)});
  if (!is_wildcard(addr)) ++p.specific[{uid, is_v6(addr)}];
  by_id_[id] = {key(ps, port), addr};
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

void CmPorts::remove(uint64_t k, const std::string& addr) {
  auto p = ports_.find(k);
  if (p == ports_.end()) return;
  auto it = p->second.by_addr.find(addr);
  if (it == p->second.by_addr.end()) return;
  const Binding& b = it->second;
  ::unlink(b.path.c_str());
  quotas_.release(Quotas::kCmPort, b.id);
  if (!is_wildcard(addr)) {
    auto n = p->second.specific.find({b.uid, is_v6(addr)});
    if (n != p->second.specific.end() && --n->second == 0) p->second.specific.erase(n);
  }
  by_id_.erase(b.id);
  p->second.by_addr.erase(it);
  if (p->second.by_addr.empty()) ports_.erase(p);
}

int CmPorts::unbind(uint32_t client, const proto::CmBindReq& req) {
  const std::string addr = address_text(req.family, req.addr);
  auto p = ports_.find(key(req.ps, req.port));
  if (addr.empty() || p == ports_.end()) return ENOENT;
  auto b = p->second.by_addr.find(addr);
  if (b == p->second.by_addr.end() || b->second.client != client) return ENOENT;
  const uint32_t id = b->second.id;
  remove(p->first, addr);
  auto c = by_client_.find(client);
  if (c != by_client_.end()) {
    std::erase(c->second, id);
    if (c->second.empty()) by_client_.erase(c);
  }
  return 0;
}

void CmPorts::release_client(uint32_t client) {
  auto c = by_client_.find(client);
  if (c == by_client_.end()) return;
  for (uint32_t id : c->second) {
    auto k = by_id_.find(id);
    if (k == by_id_.end()) continue;
    const auto [port, addr] = k->second;  // a copy: remove() erases the entry
    remove(port, addr);
  }
  by_client_.erase(c);
}

}  // namespace sv::daemon
