// roce_port.h: the daemon as the owner of UDP port 4791 (RoCEv2) in its
// network namespace (docs/ROCE.md, "Integration"). It binds the port on
// each address of the GID table and steers each arriving datagram, by the
// destination QPN in its BTH, to the client that attached that QPN:
//   - straight to the client's own socket: per address, the daemon's socket
//     and one socket per client form a SO_REUSEPORT group, and a classic BPF
//     program (SO_ATTACH_REUSEPORT_CBPF), rewritten when QPNs come and go,
//     maps the destination QPN to the index of its client's socket. The
//     client receives and sends on that socket: no daemon on the data path.
//     Any member can replace the group's program (the kernel has no lock
//     for it), so only clients of the daemon's own user get one (the
//     kernel would admit that user's own sockets to the group anyway):
//     every client of a per-user daemon, root's under the system daemon.
//   - anything else (QPN 1, unknown QPNs, short datagrams, other users'
//     clients) lands on the daemon's socket (index 0): readable() forwards
//     it to the client's arrival socket by QPN if it came to the address
//     the QP attached on, or drops it. Such a client sends on a socket of
//     its own, bound to its address at a port the kernel chose, in no group.
// Invariant: a descriptor of a socket bound to port 4791 (a group member)
// goes only to a client whose user owns the group.
// The transport itself (the engine of src/roce) runs in the client process,
// which checks the ICRC, keys, bounds and access flags: nothing arriving is
// trusted here beyond reading the QPN.
//
// Contract: single-threaded (the daemon's epoll loop); owns its sockets.
// Opened by default when the port is free (one per-user daemon per network
// namespace, common/paths.h, so normally one per "host"); never with
// SOFTVERBS_ROCE=0. An address whose port another process or the kernel's
// rxe holds is retried each time a QP asks for it (a bind: cheap); till
// then attach() answers EADDRINUSE, which the library explains
// (src/verbs/port_holder.h). QPs between processes of this daemon never need
// the port.
#pragma once
#include <sys/socket.h>
#include <sys/types.h>

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <utility>
#include <vector>

#include "common/fault_plan.h"
#include "common/protocol.h"
#include "common/sys.h"

namespace sv::daemon {

class RocePort {
 public:
  // Binds UDP 4791 on every non-loopback address (link-local IPv6 excluded)
  // and reads SOFTVERBS_FAULTS; returns 0 or an errno. Its fds go to epoll.
  // EADDRINUSE when every address was held by someone else.
  int open();
  bool enabled() const { return !socks_.empty(); }
  bool opened() const { return opened_; }
  // A socket bound after open() (a held address freed since): to epoll.
  std::function<void(int fd)> on_new_fd;
  std::vector<int> fds() const;
  bool owns(int fd) const;
  // Forwards what is waiting on `fd`.
  void readable(int fd);
  // RoceAttach: qpn must be the client's (checked by the caller); uid: the
  // user of its process. EOPNOTSUPP if never opened, EADDRINUSE if the
  // address's port is someone else's, EADDRNOTAVAIL if not an address here.
  int attach(uint32_t client, uid_t uid, const proto::RoceAttachReq& req, proto::RoceAttachReply& rep,
             std::vector<int>& out_fds);
  void remove_client(uint32_t client);
  bool has_arrival(uint32_t client) const { return arrivals_.count(client) != 0; }
  // Multicast (docs/ROCE.md, "Multicast"): the groups that have members
  // (ibv_attach_mcast) now. Per group, a socket bound to the group's IP
  // address, port 4791, that joined it on the interfaces of the port's
  // addresses of its family; a group gone closes its socket (which leaves
  // it). Without the port: nothing.
  void mcast_sync(const std::vector<std::array<uint8_t, 16>>& mgids);
  // The members of a group (the daemon's table), asked per datagram.
  std::function<bool(const uint8_t* mgid, std::vector<uint32_t>& qpns)> mcast_members;
  // Datagrams for QP1 (the GSI's MADs) go here instead: the CM gateway.
  std::function<void(int fd, const sockaddr* from, socklen_t from_len, const uint8_t* data, size_t n)> on_qp1;

 private:
  // One client's socket in an address's reuseport group. Never closed while
  // the group lives (the kernel would move the group's last socket into its
  // index): a departed client's slot is drained and given to the next one.
  struct Slot {
    Fd fd;
    bool used = false;
    uint32_t client = 0;
    uid_t uid = 0;  // of its first owner: only that user's clients get it again
    uint32_t lane = 0;  // which of its client's RoCE threads receives on it
  };
  struct Sock {
    Fd fd;            // the daemon's: index 0 of the group (bound first)
    uint8_t gid[16];  // the bound address as a GID (IPv4-mapped for IPv4)
    unsigned ifindex = 0;  // its interface
    sockaddr_storage addr{};
    socklen_t addr_len = 0;
    bool steering = false;    // a program is attached: slots may exist
    std::vector<Slot> slots;  // slots[i] is index i + 1 of the group (bind order)
  };
  struct Address {
    sockaddr_storage ss{};
    socklen_t len = 0;
    uint8_t gid[16] = {};
    unsigned ifindex = 0;
  };
  // A multicast group this namespace's hosts listen to (mcast_sync).
  struct Group {
    std::array<uint8_t, 16> mgid{};
    Fd fd;
    sockaddr_storage addr{};  // the group's IP address, port 4791
    socklen_t addr_len = 0;
  };
  std::vector<Group> groups_;
  Fd open_group(const std::array<uint8_t, 16>& mgid, sockaddr_storage& ss, socklen_t& len);
  void group_readable(const Group& g);
  int bind_address(const Address& a);  // 0 or errno; appends to socks_
  int retry_busy(const uint8_t* gid);  // index in socks_, or -errno
  bool opened_ = false;
  std::vector<Address> busy_;  // addresses whose port was held at open()
  // The client's slot on socks_[si] (a new or recycled one), or -1.
  int slot_for(size_t si, uint32_t client, uint32_t lane, uid_t uid);
  // Rewrites socks_[si]'s steering program from qpns_; false if the kernel refused it.
  bool steer(size_t si);
  int sender_for(size_t si, uint32_t client);
  int client_socket(size_t si, uint32_t client, uint32_t lane, uid_t uid, bool steerable,
                    proto::RoceAttachReply& rep);
  bool arrived_at_own_address(int fd, uint32_t qpn) const;
  std::map<std::pair<uint32_t, size_t>, Fd> senders_;  // (client, index in socks_) -> its sending socket
  std::vector<Sock> socks_;
  struct Arrival {
    Fd mine;    // the daemon's end (non-blocking)
    Fd theirs;  // passed to the client
  };
  std::map<uint32_t, Arrival> arrivals_;  // client -> its arrival socket
  std::map<uint32_t, uint32_t> qpns_;     // QPN -> client
  std::map<uint32_t, uint32_t> qpn_lane_;  // QPN -> its lane (RoceAttachReq::lane)
  // SOFTVERBS_TEST_STEER_LIMIT=N: at most N QPNs in a steering program, the
  // rest forwarded as beyond the program's size (tests: roce.wire.lanes_forwarded).
  size_t steer_limit_ = SIZE_MAX;
  std::map<uint32_t, size_t> qpn_sock_;   // QPN -> index in socks_ of the address it attached on
  std::map<uint32_t, size_t> qpn_sock2_;  // a UD QPN -> its second address's (kRoceSecondAddress)
  faults::Plan faults_;
  uint8_t buf_[65536 + sizeof(proto::RoceArrival)];
};

}  // namespace sv::daemon
