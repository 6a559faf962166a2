// libsoftverbs_nldev.so: the answers of the RDMA netlink stand-in
// (nldev.h) for this host, loaded by the netlink shim (preload.c) when a
// program opens a NETLINK_RDMA socket under `softverbs run`. The device's
// facts are device_info.h's (as ibv_query_device/port and the sysfs view
// give them); its objects and counters come from the daemon the program's
// own verbs calls would reach (common/paths.h), asked with Op::ResList and
// Op::Counters: one that is not running holds no objects and counted
// nothing, and no daemon is started for asking.
#include <infiniband/verbs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iterator>

#include "common/counters_query.h"
#include "common/device_info.h"
#include "common/paths.h"
#include "common/protocol.h"
#include "common/shm_layout.h"
#include "common/sys.h"
#include "nldev/nldev.h"

namespace sv::nldev {
namespace {

// The port's net device: the first non-loopback interface holding a GID
// (the address programs reach the device by from another host), else the
// loopback's. rdma-core's tests take a port's IP address from it.
void port_netdev(PortFacts& p) {
  for (const dev::Gid& g : dev::gid_table()) {
    if (g.ndev.empty()) continue;
    if (p.netdev.empty() || (p.netdev == "lo" && g.ndev != "lo")) {
      p.netdev = g.ndev;
      p.netdev_index = g.ifindex;
    }
  }
}

class HostSource : public Source {
 public:
  HostSource() {
    d_.name = dev::kName;
    d_.fw = dev::fw_version();
    d_.node_guid = dev::node_guid();
    d_.protocol = "roce";
    // ibv_query_device's device_cap_flags (the library's context.cc); the
    // kernel's ib_device_cap_flags share these bits.
    d_.cap_flags = IBV_DEVICE_RC_RNR_NAK_GEN | IBV_DEVICE_SYS_IMAGE_GUID | IBV_DEVICE_MEM_WINDOW |
                   IBV_DEVICE_MEM_WINDOW_TYPE_2B | IBV_DEVICE_XRC | IBV_DEVICE_SRQ_RESIZE;
    for (uint32_t i = 0; i < dev::kPortCount; ++i) {
      PortFacts p;
      p.state = dev::port().state;
      p.phys_state = dev::port().phys_state;
      port_netdev(p);
      d_.ports.push_back(p);
    }
  }
  const DeviceFacts& device() override { return d_; }
  int counters(uint32_t port, std::vector<Counter>& out) override;
  int qp_counters(std::vector<QpCounters>& out) override;
  int resources(Resources& out) override;
  bool privileged() override { return ::geteuid() == 0; }

 private:
  int connect();
  int list(uint32_t kind, std::vector<proto::ResEntry>& out);
  DeviceFacts d_;
  Fd sock_;
  bool tried_ = false;
  uint32_t seq_ = 0;
};

// The daemon of the directory this program's verbs calls would use; none
// running: ENOENT (no objects).
int HostSource::connect() {
  if (tried_) return sock_.valid() ? 0 : ENOENT;
  tried_ = true;
  const bool system = use_system_daemon();
  RunDir d;
  std::string why;
  int e = system ? open_dir(system_dir(), DirRule::SystemClient, false, d, &why)
                 : open_dir(resolve_runtime_dir(), DirRule::User, false, d, &why);
  if (e == 0) e = connect_in(d, sock_);
  if (e && e != ENOENT && e != ECONNREFUSED)
    std::fprintf(stderr, "softverbs: rdma netlink: no daemon to ask for resources: %s\n",
                 why.empty() ? std::strerror(e) : why.c_str());
  return e;
}

int HostSource::list(uint32_t kind, std::vector<proto::ResEntry>& out) {
  uint32_t after = 0;
  for (;;) {
    proto::ResListReq req{};
    proto::init_header(req, proto::Op::ResList, ++seq_);
    req.kind = kind;
    req.after = after;
    proto::ResListReply rep{};
    std::vector<Fd> fds;
    size_t len = 0;
    if (int e = send_message(sock_.get(), &req, sizeof req, {})) return e;
    if (int e = recv_message(sock_.get(), &rep, sizeof rep, &len, fds)) return e;
    if (len != sizeof rep || rep.count > proto::kResListPage) return EPROTO;
    if (rep.h.status) return rep.h.status;
    for (uint32_t i = 0; i < rep.count; ++i) out.push_back(rep.entries[i]);
    if (rep.count < proto::kResListPage) return 0;
    after = rep.entries[rep.count - 1].handle;
  }
}

// The daemon's sums of the counters (common/counters.h: rxe's names, then
// softverbs' own) of the caller's QPs; with no daemon running, nothing was
// counted: zeros.
int HostSource::counters(uint32_t, std::vector<Counter>& out) {
  sv::counters::Snapshot snap;
  if (int e = connect(); e == 0) {
    if ((e = sv::counters::query(sock_.get(), seq_, snap, false))) {
      std::fprintf(stderr, "softverbs: rdma netlink: the daemon's counters: %s\n", std::strerror(e));
      return e;
    }
  } else if (e != ENOENT && e != ECONNREFUSED) {
    return e;
  }
  for (uint32_t i = 0; i < sv::counters::kCount; ++i) out.push_back({sv::counters::kNames[i], snap.port[i]});
  return 0;
}

// Each live QP's counters the daemon shows the caller (its own user's).
int HostSource::qp_counters(std::vector<QpCounters>& out) {
  if (int e = connect()) return e == ENOENT || e == ECONNREFUSED ? 0 : e;
  sv::counters::Snapshot snap;
  if (int e = sv::counters::query(sock_.get(), seq_, snap)) {
    std::fprintf(stderr, "softverbs: rdma netlink: the daemon's counters: %s\n", std::strerror(e));
    return e;
  }
  for (const proto::CounterEntry& q : snap.qps) {
    QpCounters c{q.qpn, q.pid, {}};
    for (uint32_t i = 0; i < sv::counters::kCount; ++i) c.values.push_back({sv::counters::kNames[i], q.values[i]});
    out.push_back(std::move(c));
  }
  return 0;
}

int HostSource::resources(Resources& r) {
  if (int e = connect()) return e == ENOENT || e == ECONNREFUSED ? 0 : e;
  std::vector<proto::ResEntry> v;
  int e = list(proto::kResQp, v);
  for (const auto& q : v) {
    // A QP has a port from INIT on (ibv_modify_qp's port_num); its PSNs
    // are the starting ones ibv_modify_qp gave (the daemon does not see
    // them move).
    const uint8_t state = uint8_t(q.b);
    r.qps.push_back({q.handle, q.d, uint32_t(q.length >> 32), uint32_t(q.length), q.c, q.pid,
                     state == IBV_QPS_RESET ? 0u : 1u, uint8_t(q.a), state});
  }
  v.clear();
  if (!e) e = list(proto::kResCq, v);
  for (const auto& c : v) r.cqs.push_back({c.handle, c.a, c.pid, c.context, c.b});
  v.clear();
  if (!e) e = list(proto::kResMr, v);
  for (const auto& m : v) r.mrs.push_back({m.handle, m.a, m.b, m.pid, m.iova, m.length});
  v.clear();
  if (!e) e = list(proto::kResPd, v);
  for (const auto& p : v) r.pds.push_back({p.handle, p.pid, p.context, p.b});
  if (e) std::fprintf(stderr, "softverbs: rdma netlink: the daemon's resource list failed: %s\n", std::strerror(e));
  return e;
}

}  // namespace
}  // namespace sv::nldev

// The shim's entry (preload.c): answers the requests in [req, req+len)
// sent on a socket of address `portid`, calling emit once per datagram.
// The source lives for the process: one daemon connection, asked anew
// each time.
extern "C" __attribute__((visibility("default"))) int sv_nldev_answer(const void* req, size_t len, uint32_t portid,
                                                                     void (*emit)(void*, const void*, size_t),
                                                                     void* arg) {
  static sv::nldev::HostSource* src = new sv::nldev::HostSource();
  const auto out = sv::nldev::answer(std::string_view(static_cast<const char*>(req), len), portid, *src);
  for (const std::string& m : out) emit(arg, m.data(), m.size());
  return 0;
}
