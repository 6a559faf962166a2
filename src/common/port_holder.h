// port_holder.h: who holds a local UDP port in this network namespace, for
// a message that says what to do about it (a second daemon, or the
// kernel's rxe, on UDP 4791).
//
// The sockets come from /proc/net/udp and /proc/net/udp6 (proc(5): the
// calling process's network namespace; columns sl, local_address as
// hex ADDRESS:PORT, rem_address, st, tx_queue:rx_queue, tr:tm->when,
// retrnsmt, uid, timeout, inode); the process from a /proc/PID/fd/* link
// naming socket:[INODE] (only our own user's processes are readable, so a
// socket of another user's process, or a kernel socket such as rdma_rxe's,
// is named by its user alone).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace sv {

struct UdpSocket {
  uint32_t uid = 0;
  uint64_t inode = 0;
};
// The sockets of `text` (a /proc/net/udp or udp6 table) bound to local `port`.
std::vector<UdpSocket> parse_proc_net_udp(const std::string& text, uint16_t port);

struct PortHolder {
  bool bound = false;  // somebody holds the port
  uint32_t uid = 0;
  pid_t pid = 0;       // 0: not found among the processes we may look at
  std::string comm;    // /proc/PID/comm
  std::string softverbs_dir;  // a softverbsd's directory (its --dir or SOFTVERBS_DIR), if found
};
PortHolder find_udp_port_holder(uint16_t port);
// "softverbsd (pid 12, user 1000) serving /run/user/1000/softverbs", "process
// iperf (pid 7, user 0)", "a socket of user 0 with no process of ours
// (the kernel's rdma_rxe, or another user's program)"; "" if nobody.
std::string describe(const PortHolder& h);

// Library side: why a QP whose peer is on another host could not have the
// wire (RoceAttach's error `e`; the daemon of `dir`; the source GID), on
// stderr once per process and reason: the holder of UDP 4791 and what to do
// (EADDRINUSE), RoCE off in the daemon (EOPNOTSUPP), else the error.
void explain_no_wire(int e, const std::string& dir, const uint8_t* sgid);

}  // namespace sv
