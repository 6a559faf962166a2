// nldev.h: the RDMA netlink device interface (RDMA_NL_NLDEV, the kernel's
// uapi <rdma/rdma_netlink.h>), answered for softverbs' one device, so that
// iproute2's `rdma` (which speaks only netlink) shows sv0: `rdma dev`,
// `rdma link`, `rdma resource`, `rdma statistic`, `rdma system`. Pure: the
// facts come from a Source; the answers are the datagrams a kernel's
// NETLINK_RDMA socket would deliver, one message each, in the attribute
// layout the kernel's nldev emits (each command's attributes below).
// Commands not answered here get a netlink error EOPNOTSUPP, never silence.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace sv::nldev {

struct PortFacts {
  uint8_t state = 0, phys_state = 0;
  std::string netdev;  // the port's net device ("" for none)
  uint32_t netdev_index = 0;
};

struct DeviceFacts {
  uint32_t index = 1;
  std::string name;
  std::string fw;
  uint64_t node_guid = 0;       // host order; sent as the kernel sends it (network order)
  uint64_t cap_flags = 0;       // ib_device_cap_flags
  uint8_t node_type = 1;        // RDMA_NODE_IB_CA
  std::string protocol;         // "roce"
  std::vector<PortFacts> ports;  // port 1 first
};

struct Counter {
  std::string name;
  uint64_t value = 0;
};

// One QP's own counters (`rdma statistic qp show`: each QP its own counter
// object, numbered by its QPN). `pid`: its context's opener (0: unknown).
struct QpCounters {
  uint32_t qpn = 0, pid = 0;
  std::vector<Counter> values;
};

// One object, as the resource commands show it. `pid`: the process that
// made it (0: none known, no PID attribute).
struct QpRes {
  uint32_t lqpn = 0, rqpn = 0, sq_psn = 0, rq_psn = 0, pdn = 0, pid = 0, port = 0;
  uint8_t type = 0, state = 0;  // enum ib_qp_type (as ibv_qp_type's RC 2, UC 3, UD 4), ib_qp_state
};
struct CqRes {
  uint32_t cqn = 0, cqe = 0, pid = 0, ctxn = 0;
  uint64_t users = 0;
};
struct MrRes {
  uint32_t mrn = 0, key = 0, pdn = 0, pid = 0;
  uint64_t iova = 0, length = 0;
};
struct PdRes {
  uint32_t pdn = 0, pid = 0, ctxn = 0;
  uint64_t users = 0;
};
struct Resources {
  std::vector<QpRes> qps;
  std::vector<CqRes> cqs;
  std::vector<MrRes> mrs;
  std::vector<PdRes> pds;
};

class Source {
 public:
  virtual ~Source() = default;
  virtual const DeviceFacts& device() = 0;
  // The port's counters (rxe's names), or an errno.
  virtual int counters(uint32_t port, std::vector<Counter>& out) = 0;
  // Each live QP's counters the caller may see, or an errno.
  virtual int qp_counters(std::vector<QpCounters>& out) = 0;
  // The objects the caller may see, or an errno.
  virtual int resources(Resources& out) = 0;
  // May the caller see keys (the kernel's CAP_NET_ADMIN test)?
  virtual bool privileged() = 0;
};

// The answer to a buffer the program sent on its NETLINK_RDMA socket (one
// or more requests): each datagram it will receive, in order. `portid`:
// the socket's address, which answers carry.
std::vector<std::string> answer(std::string_view request, uint32_t portid, Source& src);

}  // namespace sv::nldev
