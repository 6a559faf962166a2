// cm_ports.h: the system daemon's table of rdma_cm ports (docs/RDMACM.md,
// "Users"). Every user's rdma_cm ids meet in one rendezvous directory
// ($DIR/cm), which only the daemon writes: a port is held by asking the
// daemon (Op::CmBind), which decides who may hold it, makes the listening
// unix socket "<ps>-<port>-<address>" (rdmacm/rendezvous.h) and hands it
// to the caller. So a connect to a port reaches the listener of the user
// that holds it and nobody else.
//
// Rules (as Linux's port space, which is host-wide): a port below 1024 is
// held only by root (uid 0: the rule Linux spells CAP_NET_BIND_SERVICE,
// looked at here as the daemon sees a caller, by its uid); one address of
// a port is held once (EADDRINUSE); a specific address conflicts with a
// wildcard of that port, and a wildcard with any address of the port held
// by another user, or by the same user in its own family. Each user holds
// at most its CMPORT quota (quota.h; ENOMEM past it): what a user can put
// in the directory (on /run) is bounded. A port goes back with CmUnbind, or
// when the connection that holds it goes.
//
// Cost: a bind or unbind is O(log n) in the bindings held (by anybody);
// releasing a connection's ports is linear in its own.
//
// Contract: single-threaded (the daemon's loop).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/protocol.h"
#include "common/sys.h"
#include "daemon/quota.h"

namespace sv::daemon {

class CmPorts {
 public:
  explicit CmPorts(Quotas& quotas) : quotas_(quotas) {}
  // The rendezvous directory ("" till set: CmBind is EOPNOTSUPP, as the
  // per-user daemon, whose user's library keeps its own directory).
  void set_dir(const std::string& dir) { dir_ = dir; }
  // 0 with the port and the listening socket (the daemon keeps it till
  // the port goes back), or EINVAL, EACCES, EADDRINUSE, ENOMEM, an errno of
  // socket(2)/bind(2).
  int bind(uint32_t client, uid_t uid, const proto::CmBindReq& req, uint16_t& port, int& fd);
  // 0 or ENOENT (not a port this connection holds).
  int unbind(uint32_t client, const proto::CmBindReq& req);
  void release_client(uint32_t client);
  size_t held() const { return by_id_.size(); }

  // The text of an address as the library names it (rdmacm addr_text: an
  // IPv4-mapped IPv6 address as IPv4); "" for a bad family.
  static std::string address_text(uint16_t family, const uint8_t* addr);

 private:
  struct Binding {
    uint32_t id;
    uint32_t client;
    uid_t uid;
    std::string path;
    Fd fd;
  };
  // One (port space, port): its bindings by address text, and how many
  // specific (not wildcard) addresses each (user, IPv6?) holds.
  struct Port {
    std::map<std::string, Binding> by_addr;
    std::map<std::pair<uid_t, bool>, uint32_t> specific;
  };
  static uint64_t key(uint32_t ps, uint16_t port) { return (uint64_t(ps) << 16) | port; }
  bool conflicts(uint64_t k, uid_t uid, const std::string& addr) const;
  int make(uint32_t client, uid_t uid, uint32_t ps, uint16_t port, const std::string& addr, int& fd);
  void remove(uint64_t k, const std::string& addr);

  Quotas& quotas_;
  std::string dir_;
  uint32_t next_id_ = 1;
  std::map<uint64_t, Port> ports_;                                              // (ps, port) -> its bindings
  std::unordered_map<uint32_t, std::pair<uint64_t, std::string>> by_id_;       // binding -> (ps, port), address
  std::unordered_map<uint32_t, std::vector<uint32_t>> by_client_;  // connection -> its bindings
};

}  // namespace sv::daemon
