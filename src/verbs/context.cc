// Devices and contexts: the device list, opening a context (and with it the
// daemon connection), and the query verbs. See docs/ABI.md for the layout
// rules these structures follow.
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <vector>

#include "common/device_info.h"
#include "common/started_thread.h"
#include <fcntl.h>

#include "verbs/fault_events.h"
#include "verbs/fault_ops.h"
#include "verbs/capture.h"
#include "verbs/provider.h"

#undef ibv_query_port
#undef ibv_reg_mr

namespace sv::verbs {
namespace {

// The device as libibverbs lays out `struct verbs_device`: an ibv_device,
// then the provider ops pointer that mlx5dv/efadv compare against their own
// (ours points elsewhere), then fields we leave zero. 1 KiB covers v44's
// 672-byte struct.
struct Device {
  ibv_device dev;
  const void* ops;
  char reserved[1024];
};

const char kOpsMarker[] = "softverbs";

Device* the_device() {
  static Device* d = [] {
    auto* dev = static_cast<Device*>(std::calloc(1, sizeof(Device)));
    dev->dev.node_type = IBV_NODE_CA;
    dev->dev.transport_type = IBV_TRANSPORT_IB;
    std::snprintf(dev->dev.name, sizeof(dev->dev.name), "%s", kDeviceName);
    // The uverbs node and its sysfs directory, as `softverbs run` provides
    // them (src/tools/sysfs_view.h): /dev/infiniband/uverbs0 and
    // /sys/class/infiniband_verbs/uverbs0.
    std::snprintf(dev->dev.dev_name, sizeof(dev->dev.dev_name), "%s", dev::kUverbsName);
    std::snprintf(dev->dev.dev_path, sizeof(dev->dev.dev_path), "/sys/class/infiniband_verbs/%s",
                  dev::kUverbsName);
    std::snprintf(dev->dev.ibdev_path, sizeof(dev->dev.ibdev_path), "/sys/class/infiniband/%s", kDeviceName);
    dev->ops = kOpsMarker;
    return dev;
  }();
  return d;
}

// The GID table of port 1: common/device_info.h (shared with the sysfs view
// of `softverbs run`).
const std::vector<dev::Gid>& gid_table() { return dev::gid_table(); }

}  // namespace

void fill_device_attr(ibv_device_attr& a) {
  std::memset(&a, 0, sizeof(a));
  std::snprintf(a.fw_ver, sizeof(a.fw_ver), "%s", dev::fw_version().c_str());
  a.node_guid = htobe64(dev::node_guid());
  a.sys_image_guid = a.node_guid;
  a.max_mr_size = shm::kMaxMrSize;
  a.page_size_cap = ~uint64_t(0xfff);  // any power of two from 4 KiB
  a.vendor_id = kVendorId;
  a.vendor_part_id = kVendorPartId;
  a.hw_ver = dev::kHwVer;
  a.max_qp = shm::kQpTableSize - 2;
  a.max_qp_wr = shm::kMaxQpWr;
  a.device_cap_flags = IBV_DEVICE_RC_RNR_NAK_GEN | IBV_DEVICE_SYS_IMAGE_GUID | IBV_DEVICE_MEM_WINDOW |
                       IBV_DEVICE_MEM_WINDOW_TYPE_2B | IBV_DEVICE_XRC | IBV_DEVICE_SRQ_RESIZE;
  a.max_sge = shm::kMaxSge;
  a.max_sge_rd = shm::kMaxSge;
  a.max_cq = 65536;
  a.max_cqe = shm::kMaxCqe - 1;
  a.max_mr = shm::kMrTableSize - 1;
  a.max_pd = 1 << 24;
  a.max_mw = shm::kMrTableSize - 1;  // windows share the key table with MRs
  a.max_qp_rd_atom = shm::kMaxRdAtomic;
  a.max_qp_init_rd_atom = shm::kMaxRdAtomic;
  a.max_res_rd_atom = shm::kMaxRdAtomic * a.max_qp;
  a.atomic_cap = IBV_ATOMIC_HCA;
  a.max_ah = int(kMaxAh);
  a.max_mcast_grp = shm::kMcgTableSize;
  a.max_mcast_qp_attach = shm::kMcgMaxQps;
  a.max_total_mcast_qp_attach = shm::kMcgTableSize * shm::kMcgMaxQps;
  a.max_pkeys = 1;
  a.max_srq = 65536;
  a.max_srq_wr = shm::kMaxQpWr;
  a.max_srq_sge = shm::kMaxSge;
  a.local_ca_ack_delay = 15;
  a.phys_port_cnt = dev::kPortCount;
}

ibv_context* open_context(ibv_device* device) {
  if (device != &the_device()->dev) {
    errno = ENODEV;
    return nullptr;
  }
  if (!process_plan_error().empty()) {  // said on stderr when it was read
    errno = EINVAL;
    return nullptr;
  }
  return make_context(-1);
}

namespace {

// The file whose flock(2) RDMA atomics on ODP memory take
// (ContextState::odp_lock): one per user, the user's device segment, its
// own file (daemon/device_tables.cc), opened anew (not dup'ed: a flock
// belongs to an open file description, and the daemon hands every process
// the same one). No name in a shared directory, which another user could
// take first.
Fd open_odp_lock(int segment) {
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/self/fd/%d", segment);
  return Fd(::open(path, O_RDONLY | O_CLOEXEC));  // invalid: such atomics fail with ENOLCK, said when tried
}

// The device segment of Hello's reply (the MR, QP and multicast tables,
// read-only: docs/SHARED_MEMORY.md), mapped and checked. 0 or an errno.
int map_device(ContextState& st, const proto::HelloReply& rep, const Fd& segment) {
  st.boot_id = rep.boot_id;
  st.conn.set_client_id(rep.client_id);
  if (int e = map_shared(segment.get(), 0, shm::DeviceLayout::size(), PROT_READ, false, st.device_map)) return e;
  auto* dh = st.device_map.as<shm::DeviceHeader>();
  if (dh->magic != shm::kDeviceMagic || dh->version != shm::kLayoutVersion) return EPROTO;
  st.mr_table = reinterpret_cast<const MrEntry*>(st.device_map.as<char>() + dh->mr_table_offset);
  st.qp_table = reinterpret_cast<const QpEntry*>(st.device_map.as<char>() + dh->qp_table_offset);
  st.mcg_table = reinterpret_cast<const shm::McgEntry*>(st.device_map.as<char>() + shm::DeviceLayout::mcg_offset());
  st.odp_lock = open_odp_lock(segment.get());
  return 0;
}

// Without a wake socket (a daemon that does not offer it) requests a
// departed sharer left queued on a QP wait for the next post on that QP:
// said once, the context still works.
void say_no_wake(int e) {
  static std::once_flag once;
  std::call_once(once, [e] {
    std::fprintf(stderr, "softverbs: the daemon gave no wake socket (%s): requests a process sharing a QP "
                         "leaves queued wait for the next post on that QP\n", std::strerror(e));
  });
}

// The requests that bind a fresh connection to its context, sent in one
// batch (DaemonConn::call_batch: one round trip), in this order:
//   ClaimSocket    the socket is ours (its inode);
//   ImportContext  join the context of another process's socket
//                  (ibv_import_device(3)), if asked;
//   NsOpen         or of a published object (svx_open), if asked;
//   Hello          the daemon's boot id and this user's device segment;
//   RegAsync       async events: the daemon sends the event and signals our
//                  wake-up pair (a socketpair, not an eventfd: its signal
//                  must not be able to block whatever the application does
//                  to the descriptor);
//   Wake           the wake socket (see start_watchdog); optional.
// 0 or an errno.
int set_up_connection(ContextState& st, int import_fd, NsAttach* ns) {
  struct stat sst {};
  if (::fstat(st.conn.fd(), &sst) != 0) return errno;
  if (int e = make_wake_pair(st.async_fd, st.async_wake)) return e;
  proto::ClaimSocketReq claim{};
  claim.inode = sst.st_ino;
  proto::Empty none[4]{};
  proto::ClientReply joined{};
  proto::NsNameReq ns_req{};
  proto::HelloReply hello{};
  proto::Empty async_rep{}, wake_rep{};
  std::vector<Fd> segment, wake;
  const int import_fds[1] = {import_fd};
  const int async_fds[1] = {st.async_wake.get()};
  DaemonConn::Batched calls[6];
  size_t n = 0, import_at = 0;
  calls[n++] = DaemonConn::batched<proto::Op::ClaimSocket>(claim, none[0]);
  if (import_fd >= 0) {
    import_at = n;
    calls[n++] = DaemonConn::batched<proto::Op::ImportContext>(none[1], joined, import_fds);
  }
  if (ns) {
    ns_req.access = ns->access;
    ns_req.flags = ns->flags;
    std::strncpy(ns_req.name, ns->name, sizeof(ns_req.name) - 1);
    calls[n++] = DaemonConn::batched<proto::Op::NsOpen>(ns_req, ns->rep);
  }
  calls[n++] = DaemonConn::batched<proto::Op::Hello>(none[2], hello, {}, &segment);
  calls[n++] = DaemonConn::batched<proto::Op::RegAsync>(none[3], async_rep, async_fds);
  const size_t wake_at = n;
  proto::Empty wake_req{};
  calls[n++] = DaemonConn::batched<proto::Op::Wake>(wake_req, wake_rep, {}, &wake);
  calls[wake_at].optional = true;
  ContextState* raw = &st;  // events may come with the replies
  st.conn.on_event = [raw](const proto::AsyncEventMsg& m) {
    std::lock_guard<std::mutex> g(raw->async.mu);
    raw->async.raw.push_back(m);
  };
  if (int e = st.conn.call_batch(std::span(calls, n))) {
    if (import_at && calls[import_at].status == ENOENT && e == ENOENT) return EINVAL;
    return e;
  }
  if (int e = map_device(st, hello, segment[0])) return e;
  if (calls[wake_at].status == 0) st.wake = std::move(wake[0]);
  else say_no_wake(calls[wake_at].status);
  return 0;
}

// The context as libibverbs sees it: the provider's ops (rdma-core's
// verbs_context_ops, set once here) and the fds it polls.
Context* new_verbs_context(ContextState& st) {
  auto* ctx = static_cast<Context*>(std::calloc(1, sizeof(Context)));
  if (!ctx) return nullptr;
  verbs_context& v = ctx->v;
  v.sz = sizeof(abi::VerbsContextCurrent);  // reaches back over v64's ops
  ctx->v64.free_buf = free_buf;
  ctx->v64.alloc_buf = alloc_buf;
  ctx->v64.dm_export_dmabuf_fd = dm_export_dmabuf_fd;
  ctx->v64.reg_mr_ex = reg_mr_ex;
  ctx->v64.dealloc_dmah = dealloc_dmah;
  ctx->v64.alloc_dmah = alloc_dmah;
  v.query_port = query_port;
  v.query_device_ex = query_device_ex;
  v.create_cq_ex = create_cq_ex;
  v.create_qp_ex = create_qp_ex;
  v.open_xrcd = open_xrcd;  // and close_xrcd: set both or neither (verbs-abi notes)
  v.close_xrcd = close_xrcd;
  v.create_srq_ex = create_srq_ex;
  v.get_srq_num = get_srq_num;
  v.open_qp = open_qp;
  v.alloc_td = alloc_td;
  v.dealloc_td = dealloc_td;
  v.alloc_parent_domain = alloc_parent_domain;
  v.alloc_dm = alloc_dm;  // device memory (dm.cc)
  v.free_dm = free_dm;
  v.reg_dm_mr = reg_dm_mr;
  v.advise_mr = advise_mr;  // on-demand paging (requester_odp.cc)
  ibv_context& c = v.context;
  c.device = &the_device()->dev;
  c.ops.poll_cq = poll_cq;
  c.ops.req_notify_cq = req_notify_cq;
  c.ops.post_send = post_send;
  c.ops.post_recv = post_recv;
  c.ops.post_srq_recv = post_srq_recv;
  c.ops.alloc_mw = alloc_mw;
  c.ops.bind_mw = bind_mw;
  c.ops.dealloc_mw = dealloc_mw;
  c.cmd_fd = st.conn.fd();
  c.async_fd = st.async_fd.get();
  c.num_comp_vectors = 1;
  pthread_mutex_init(&c.mutex, nullptr);
  c.abi_compat = __VERBS_ABI_IS_EXTENDED;
  return ctx;
}

}  // namespace

// Opens a context on a new daemon connection. With import_fd >= 0, the
// connection joins the context whose command socket that is
// (ibv_import_device(3)) instead of starting a new one.
ibv_context* make_context(int import_fd, NsAttach* ns) {
  std::unique_ptr<ContextState> st;
  int e = 0;
  // A daemon killed between accepting this connection and answering it (one
  // being replaced: Restart.DaemonKilledDuringTraffic* met it in CI) resets
  // the connection: start again, which finds or starts its successor.
  for (int attempt = 0; attempt < 3; ++attempt) {
    st = std::make_unique<ContextState>();
    e = st->conn.open();
    if (!e) e = set_up_connection(*st, import_fd, ns);
    if (e != ECONNRESET) break;
  }
  if (e) {
    errno = e;
    return nullptr;
  }
  Context* ctx = new_verbs_context(*st);
  if (!ctx) {
    errno = ENOMEM;
    return nullptr;
  }
  start_watchdog(*st);
  events_attach(*st);
  ctx->st = st.release();
  return &ctx->v.context;
}

int close_context(ibv_context* c) {
  Context* ctx = to_ctx(c);
  events_detach(*ctx->st);
  delete ctx->st;  // closes the daemon connection: the daemon releases what is left
  pthread_mutex_destroy(&c->mutex);
  std::free(ctx);
  return 0;
}

int query_device_ex(ibv_context*, const ibv_query_device_ex_input* in, ibv_device_attr_ex* attr,
                    size_t attr_size) {
  if (in && in->comp_mask) return EINVAL;
  if (attr_size < sizeof(attr->orig_attr)) return EINVAL;
  std::memset(attr, 0, std::min(attr_size, sizeof(*attr)));
  fill_device_attr(attr->orig_attr);
  // The 64-bit capabilities: the 32 of ibv_device_attr, and (as rxe reports
  // them) FLUSH to both placement types and ATOMIC WRITE (IBTA annex A19).
  if (attr_size >= offsetof(ibv_device_attr_ex, device_cap_flags_ex) + sizeof(attr->device_cap_flags_ex))
    attr->device_cap_flags_ex = uint64_t(uint32_t(attr->orig_attr.device_cap_flags)) | abi::kDeviceFlushGlobal |
                                abi::kDeviceFlushPersistent | abi::kDeviceAtomicWrite;
  // Completion timestamps are CLOCK_MONOTONIC nanoseconds: a 1 GHz clock.
  if (attr_size >= offsetof(ibv_device_attr_ex, hca_core_clock) + sizeof(attr->hca_core_clock)) {
    attr->completion_timestamp_mask = ~uint64_t(0);
    attr->hca_core_clock = 1000000;  // kHz
  }
  // One port, in the field for devices with more than 255 too (ibv_query_device_ex(3)).
  if (attr_size >= offsetof(ibv_device_attr_ex, phys_port_cnt_ex) + sizeof(attr->phys_port_cnt_ex))
    attr->phys_port_cnt_ex = 1;
  // On-demand paging (docs/MEMORY.md): explicit and implicit ODP MRs, on
  // the shared-memory path of every transport that has it, between users
  // and on RoCEv2.
  if (attr_size >= offsetof(ibv_device_attr_ex, odp_caps) + sizeof(attr->odp_caps)) {
    attr->odp_caps.general_caps = IBV_ODP_SUPPORT | IBV_ODP_SUPPORT_IMPLICIT;
    constexpr uint32_t kRc = IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV | IBV_ODP_SUPPORT_WRITE |
                             IBV_ODP_SUPPORT_READ | IBV_ODP_SUPPORT_ATOMIC | IBV_ODP_SUPPORT_SRQ_RECV |
                             abi::kOdpSupportFlush | abi::kOdpSupportAtomicWrite;
    attr->odp_caps.per_transport_caps.rc_odp_caps = kRc;
    attr->odp_caps.per_transport_caps.uc_odp_caps =
        IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV | IBV_ODP_SUPPORT_WRITE | IBV_ODP_SUPPORT_SRQ_RECV;
    attr->odp_caps.per_transport_caps.ud_odp_caps =
        IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV | IBV_ODP_SUPPORT_SRQ_RECV;
    if (attr_size >= offsetof(ibv_device_attr_ex, xrc_odp_caps) + sizeof(attr->xrc_odp_caps))
      attr->xrc_odp_caps = kRc;
  }
  // Device memory a user may hold in all (ibv_alloc_dm(3), src/daemon/dm.cc).
  if (attr_size >= offsetof(ibv_device_attr_ex, max_dm_size) + sizeof(attr->max_dm_size))
    attr->max_dm_size = proto::kMaxDmSize;
  return 0;
}

int query_port(ibv_context*, uint8_t port, ibv_port_attr* attr, size_t attr_len) {
  if (port != 1) return EINVAL;
  const dev::Port& p = dev::port();
  ibv_port_attr a{};
  a.state = ibv_port_state(p.state);
  a.max_mtu = ibv_mtu(p.max_mtu);
  a.active_mtu = ibv_mtu(p.active_mtu);
  a.gid_tbl_len = kGidTableLen;
  a.port_cap_flags = p.cap_flags;
  a.max_msg_sz = p.max_msg_sz;
  a.pkey_tbl_len = uint16_t(p.pkey_tbl_len);
  a.lid = p.lid;
  a.sm_lid = p.sm_lid;
  a.lmc = p.lmc;
  a.sm_sl = p.sm_sl;
  a.active_width = p.active_width;
  a.active_speed = p.active_speed;
  a.phys_state = p.phys_state;
  if (planned_port_down()) {  // the fault plan's port rule (fault_events.h): as a NIC whose link is down
    a.state = IBV_PORT_DOWN;
    a.phys_state = 3;  // Disabled (IBTA 14.2.5.6 PortPhysicalState)
  }
  a.link_layer = p.link_layer;
  a.max_vl_num = p.max_vl_num;
  // The caller's size says which release's struct it holds: v64's ends
  // with active_speed_ex (the speed when it does not fit active_speed's
  // byte; the kernel fills it with the same value otherwise).
  abi::PortAttrCurrent cur{};
  cur.v44 = a;
  cur.active_speed_ex = p.active_speed;
  std::memcpy(attr, &cur, std::min(attr_len, sizeof(cur)));
  return 0;
}

ContextState::~ContextState() {
  if (watchdog.joinable()) {
    eventfd_signal(watchdog_stop.get());
    watchdog.join();
  }
}

// Watches the daemon connection: when the daemon dies, the device is gone
// (IBV_EVENT_DEVICE_FATAL): later verbs fail, and threads asleep in
// ibv_get_cq_event or ibv_get_async_event wake up with an error.
// It also reads the wake socket (Op::Wake): another process of the context
// left it, and what it left queued on the QPs is this process's to carry
// out (progress_adopt).
void start_watchdog(ContextState& st) {
  if (make_eventfd(st.watchdog_stop)) return;
  st.capture_watch = capture_watch(st);  // `softverbs capture` (capture.h)
  st.watchdog = started_thread([&st] {
    pollfd p[4] = {{st.conn.fd(), POLLRDHUP, 0},
                   {st.watchdog_stop.get(), POLLIN, 0},
                   {st.wake.get(), POLLIN, 0},
                   {st.capture_watch.get(), POLLIN, 0}};
    for (;;) {
      int n = ::poll(p, 4, -1);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 || (p[1].revents & POLLIN)) return;
      if (p[0].revents & (POLLRDHUP | POLLHUP | POLLERR)) break;
      if (p[2].revents & (POLLHUP | POLLERR)) p[2].fd = -1;  // the daemon's end is gone: the socket above says why
      if (p[2].revents & POLLIN) {
        std::vector<uint32_t> gone;  // one message per process that left: its pid
        uint32_t pid = 0;
        while (::recv(st.wake.get(), &pid, sizeof pid, MSG_DONTWAIT) == ssize_t(sizeof pid)) gone.push_back(pid);
        progress_adopt(st, gone);
      }
      if (p[3].revents & POLLIN) capture_changed(st, p[3].fd);
    }
    st.dead.store(true);
    ibv_async_event ev{};
    ev.event_type = IBV_EVENT_DEVICE_FATAL;
    push_async_event(st, ev);
    std::lock_guard<std::mutex> g(st.mu);
    for (CqState* cq : st.cqs)
      if (cq->channel) wake_signal(cq->channel->wake);
  });
}

// Matches the daemon's events to this process's handles; events for objects
// this process holds no handle of are not its business.
void resolve_raw_events(ContextState& st) {
  std::deque<proto::AsyncEventMsg> raw;
  {
    std::lock_guard<std::mutex> g(st.async.mu);
    raw.swap(st.async.raw);
  }
  for (const auto& m : raw) {
    ibv_async_event ev{};
    ev.event_type = ibv_event_type(m.event_type);
    {
      std::lock_guard<std::mutex> g(st.mu);
      if (m.event_type == IBV_EVENT_QP_FATAL || m.event_type == IBV_EVENT_QP_REQ_ERR ||
          m.event_type == IBV_EVENT_QP_ACCESS_ERR || m.event_type == IBV_EVENT_QP_LAST_WQE_REACHED) {
        auto it = st.qp_handles.find(m.element);
        if (it == st.qp_handles.end()) continue;
        ev.element.qp = &it->second->qpx.qp_base;
      } else if (m.event_type == IBV_EVENT_SRQ_LIMIT_REACHED || m.event_type == IBV_EVENT_SRQ_ERR) {
        auto it = st.srq_handles.find(m.element);
        if (it == st.srq_handles.end()) continue;
        ev.element.srq = it->second;
      } else if (m.event_type == IBV_EVENT_CQ_ERR) {
        auto it = st.cq_handles.find(m.element);
        if (it == st.cq_handles.end()) continue;
        ev.element.cq = reinterpret_cast<ibv_cq*>(&it->second->cq);
      } else {
        ev.element.port_num = 1;
      }
    }
    std::lock_guard<std::mutex> g(st.async.mu);
    st.async.events.push_back(ev);
  }
}

void push_async_event(ContextState& st, const ibv_async_event& ev) {
  {
    std::lock_guard<std::mutex> g(st.async.mu);
    st.async.events.push_back(ev);
  }
  wake_signal(st.async_wake.get());
}

}  // namespace sv::verbs

using namespace sv;
using namespace sv::verbs;

extern "C" {

ibv_device** ibv_get_device_list(int* num) {
  auto** list = static_cast<ibv_device**>(std::calloc(2, sizeof(ibv_device*)));
  if (!list) {
    errno = ENOMEM;
    return nullptr;
  }
  list[0] = &the_device()->dev;
  if (num) *num = 1;
  return list;
}

void ibv_free_device_list(ibv_device** list) { std::free(list); }

const char* ibv_get_device_name(ibv_device* d) { return d ? d->name : nullptr; }

__be64 ibv_get_device_guid(ibv_device*) { return htobe64(dev::node_guid()); }

int ibv_get_device_index(ibv_device*) { return 0; }

ibv_context* ibv_open_device(ibv_device* d) { return open_context(d); }

int ibv_close_device(ibv_context* c) { return close_context(c); }

int ibv_query_device(ibv_context*, ibv_device_attr* attr) {
  fill_device_attr(*attr);
  return 0;
}

// The 1.1 symbol takes the compat attr (it ends before the extended fields);
// new callers reach query_port through verbs_context.
int ibv_query_port(ibv_context* c, uint8_t port, struct _compat_ibv_port_attr* attr) {
  return query_port(c, port, reinterpret_cast<ibv_port_attr*>(attr),
                    offsetof(ibv_port_attr, link_layer) + sizeof(uint8_t));
}

// ibv_query_port_speed(3): the port's effective bandwidth in units of
// 100 Mb/s, the data rate of one lane (after line coding: SDR 2.5 Gb/s ...
// XDR 200 Gb/s, IBTA vol. 2 table "link speeds") times the lanes of the
// active width. Returns 0 or an errno.
int ibv_query_port_speed(ibv_context* c, uint32_t port, uint64_t* speed) {
  if (!c || !speed || port != 1) return EINVAL;
  const dev::Port& p = dev::port();
  uint64_t lane = 0;
  switch (uint32_t(p.active_speed)) {  // XDR (256) only fits active_speed_ex
    case 1: lane = 25; break;     // SDR
    case 2: lane = 50; break;     // DDR
    case 4: lane = 100; break;    // QDR
    case 8: lane = 100; break;    // FDR10
    case 16: lane = 140; break;   // FDR
    case 32: lane = 250; break;   // EDR
    case 64: lane = 500; break;   // HDR
    case 128: lane = 1000; break; // NDR
    case 256: lane = 2000; break; // XDR
    default: return EINVAL;
  }
  uint64_t lanes = 0;
  switch (p.active_width) {
    case 1: lanes = 1; break;
    case 2: lanes = 4; break;
    case 4: lanes = 8; break;
    case 8: lanes = 12; break;
    case 16: lanes = 2; break;
    default: return EINVAL;
  }
  *speed = lane * lanes;
  return 0;
}

int ibv_query_gid(ibv_context*, uint8_t port, int index, ibv_gid* gid) {
  if (port != 1 || index < 0 || index >= int(kGidTableLen)) {
    errno = EINVAL;
    return -1;
  }
  const auto& t = gid_table();
  if (size_t(index) < t.size()) std::memcpy(gid->raw, t[index].raw.data(), 16);
  else std::memset(gid, 0, sizeof(*gid));
  return 0;
}

int _ibv_query_gid_ex(ibv_context* c, uint32_t port, uint32_t index, ibv_gid_entry* entry, uint32_t flags,
                      size_t entry_size) {
  if (flags || port != 1 || entry_size < sizeof(ibv_gid_entry)) return EINVAL;
  if (index >= kGidTableLen) return EINVAL;
  const auto& t = gid_table();
  if (index >= t.size()) return ENODATA;
  std::memset(entry, 0, sizeof(*entry));
  std::memcpy(entry->gid.raw, t[index].raw.data(), 16);
  entry->gid_index = index;
  entry->port_num = port;
  entry->gid_type = t[index].type == dev::GidType::kRoceV2 ? IBV_GID_TYPE_ROCE_V2 : IBV_GID_TYPE_ROCE_V1;
  entry->ndev_ifindex = t[index].ifindex;
  (void)c;
  return 0;
}

ssize_t _ibv_query_gid_table(ibv_context* c, ibv_gid_entry* entries, size_t max, uint32_t flags,
                             size_t entry_size) {
  if (flags || entry_size < sizeof(ibv_gid_entry)) return -EINVAL;
  const auto& t = gid_table();
  if (max < t.size()) return -EINVAL;
  for (size_t i = 0; i < t.size(); ++i) {
    auto* e = reinterpret_cast<ibv_gid_entry*>(reinterpret_cast<char*>(entries) + i * entry_size);
    _ibv_query_gid_ex(c, 1, uint32_t(i), e, 0, entry_size);
  }
  return ssize_t(t.size());
}

// Private (IBVERBS_PRIVATE_NN, pyverbs imports it): 0 = IB/RoCE v1, 1 = RoCE v2.
int ibv_query_gid_type(ibv_context*, uint8_t port, unsigned index, int* type) {
  if (port != 1 || index >= kGidTableLen) {
    errno = EINVAL;
    return -1;
  }
  const auto& t = gid_table();
  *type = index < t.size() ? int(t[index].type) : int(dev::GidType::kRoceV2);
  return 0;
}

int ibv_query_pkey(ibv_context*, uint8_t port, int index, __be16* pkey) {
  if (port != 1 || index != 0) {
    errno = EINVAL;
    return -1;
  }
  *pkey = htobe16(dev::port().pkey);
  return 0;
}

int ibv_get_pkey_index(ibv_context*, uint8_t port, __be16 pkey) {
  if (port == 1 && be16toh(pkey) == 0xffff) return 0;
  return -EINVAL;
}

int ibv_get_async_event(ibv_context* c, ibv_async_event* ev) {
  ContextState& st = ctx_state(c);
  for (;;) {
    int e = sv::wake_wait_once(st.async_fd.get());  // EINTR ends the wait
    if (e && e != EAGAIN) {
      errno = e;
      return -1;
    }
    if (!st.dead.load()) st.conn.drain_events();
    resolve_raw_events(st);
    std::lock_guard<std::mutex> g(st.async.mu);
    if (!st.async.events.empty()) {
      *ev = st.async.events.front();
      st.async.events.pop_front();
      if (!st.async.events.empty()) sv::wake_signal(st.async_wake.get());
      return 0;
    }
    if (e == EAGAIN) {
      errno = EAGAIN;
      return -1;
    }
  }
}

void ibv_ack_async_event(ibv_async_event*) {}

// ibv_import_device(3): cmd_fd is another process's context's command fd
// (passed over a unix socket); the new context shares its objects.
ibv_context* ibv_import_device(int cmd_fd) {
  if (cmd_fd < 0) {
    errno = EBADF;
    return nullptr;
  }
  return make_context(cmd_fd);
}

}  // extern "C"
