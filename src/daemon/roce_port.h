// roce_port.h: the daemon as the owner of UDP port 4791 (RoCEv2) in its
// network namespace (docs/ROCE.md, "Integration"). It binds the port on
// each address of the GID table, hands a client the socket of the address
// its QP sends from (sending needs no daemon round trip), and forwards every
// arriving datagram, by the destination QPN in its BTH, to the arrival
// socket of the client that attached that QPN. The transport itself (the
// engine of src/roce) runs in the client process, which checks the ICRC,
// keys, bounds and access flags: nothing arriving is trusted here beyond
// reading the QPN.
//
// Contract: single-threaded (the daemon's epoll loop); owns its sockets.
// Enabled only when asked (SOFTVERBS_ROCE=1, or the system daemon), since a
// per-user daemon must not take a host's RoCE port by surprise.
#pragma once
#include <sys/socket.h>

#include <cstdint>
#include <functional>
#include <map>
#include <vector>

#include "common/protocol.h"
#include "common/sys.h"

namespace sv::daemon {

class RocePort {
 public:
  // Binds UDP 4791 on every non-loopback address (link-local IPv6 excluded)
  // and reads SOFTVERBS_FAULTS; returns 0 or an errno. Its fds go to epoll.
  int open();
  bool enabled() const { return !socks_.empty(); }
  std::vector<int> fds() const;
  bool owns(int fd) const;
  // Forwards what is waiting on `fd`.
  void readable(int fd);
  // RoceAttach: qpn must be the client's (checked by the caller).
  int attach(uint32_t client, const proto::RoceAttachReq& req, proto::RoceAttachReply& rep,
             std::vector<int>& out_fds);
  void remove_client(uint32_t client);
  // Datagrams for QP1 (the GSI's MADs) go here instead: the CM gateway.
  std::function<void(int fd, const sockaddr* from, socklen_t from_len, const uint8_t* data, size_t n)> on_qp1;

 private:
  struct Sock {
    Fd fd;
    uint8_t gid[16];  // the bound address as a GID (IPv4-mapped for IPv4)
  };
  std::vector<Sock> socks_;
  struct Arrival {
    Fd mine;    // the daemon's end (non-blocking)
    Fd theirs;  // passed to the client
  };
  std::map<uint32_t, Arrival> arrivals_;  // client -> its arrival socket
  std::map<uint32_t, uint32_t> qpns_;     // QPN -> client
  proto::RoceAttachReply faults_{};
  uint8_t buf_[65536 + sizeof(proto::RoceArrival)];
};

}  // namespace sv::daemon
