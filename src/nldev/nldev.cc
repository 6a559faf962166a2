// The RDMA netlink device commands (nldev.h), one handler per command: the
// attributes each puts are those the kernel's nldev puts for a RoCE device
// of a user-space process (drivers/infiniband/core/nldev.c: fill_dev_info,
// fill_port_info, fill_res_info, fill_res_*_entry, the statistics doit),
// written here from <rdma/rdma_netlink.h>'s attribute list.
#include "nldev/nldev.h"

#include <linux/netlink.h>
#include <rdma/rdma_netlink.h>

#include <cerrno>
#include <functional>

#include "nldev/nl_msg.h"

namespace sv::nldev {
namespace {

// One message must fit the reader's buffer: libmnl's MNL_SOCKET_BUFFER_SIZE
// is a page (4096) where pages are 4 KiB, as iproute2 reads with it.
constexpr size_t kMaxMessage = 3800;

struct Ctx {
  const MsgHeader& req;
  const AttrMap& attrs;
  uint32_t portid;
  Source& src;
  std::vector<std::string>& out;
  uint16_t type() const { return uint16_t(RDMA_NL_GET_TYPE(RDMA_NL_NLDEV, RDMA_NL_GET_OP(req.type))); }
  bool dump() const { return (req.flags & NLM_F_DUMP) == NLM_F_DUMP; }
  MsgWriter writer() const { return MsgWriter(type(), dump() ? NLM_F_MULTI : 0, req.seq, portid); }
};

void put_device_handle(MsgWriter& w, const DeviceFacts& d) {
  w.put_u32(RDMA_NLDEV_ATTR_DEV_INDEX, d.index);
  w.put_str(RDMA_NLDEV_ATTR_DEV_NAME, d.name);
}

// The device a request names: DEV_INDEX must be ours (the kernel answers
// EINVAL for an index no device has).
int named_device(const Ctx& c, bool required) {
  uint32_t idx = 0;
  if (!get_u32(c.attrs, RDMA_NLDEV_ATTR_DEV_INDEX, idx)) return required ? EINVAL : 0;
  return idx == c.src.device().index ? 0 : EINVAL;
}

// RDMA_NLDEV_CMD_GET (fill_dev_info): PORT_INDEX carries the port count.
int cmd_get(Ctx& c) {
  if (int e = named_device(c, !c.dump())) return e;
  const DeviceFacts& d = c.src.device();
  MsgWriter w = c.writer();
  put_device_handle(w, d);
  w.put_u32(RDMA_NLDEV_ATTR_PORT_INDEX, uint32_t(d.ports.size()));
  w.put_u64(RDMA_NLDEV_ATTR_CAP_FLAGS, d.cap_flags);
  if (!d.fw.empty()) w.put_str(RDMA_NLDEV_ATTR_FW_VERSION, d.fw);
  w.put_u64(RDMA_NLDEV_ATTR_NODE_GUID, d.node_guid);
  w.put_u64(RDMA_NLDEV_ATTR_SYS_IMAGE_GUID, d.node_guid);
  w.put_u8(RDMA_NLDEV_ATTR_DEV_NODE_TYPE, d.node_type);
  if (!d.protocol.empty()) w.put_str(RDMA_NLDEV_ATTR_DEV_PROTOCOL, d.protocol);
  w.put_u8(RDMA_NLDEV_ATTR_DEV_DIM, 0);
  c.out.push_back(w.finish());
  return 0;
}

// RDMA_NLDEV_CMD_PORT_GET (fill_port_info): a RoCE port has no LID, SM or
// subnet prefix attributes; its net device when it has one.
void port_message(Ctx& c, uint32_t port) {
  const DeviceFacts& d = c.src.device();
  const PortFacts& p = d.ports[port - 1];
  MsgWriter w = c.writer();
  put_device_handle(w, d);
  w.put_u32(RDMA_NLDEV_ATTR_PORT_INDEX, port);
  w.put_u8(RDMA_NLDEV_ATTR_PORT_STATE, p.state);
  w.put_u8(RDMA_NLDEV_ATTR_PORT_PHYS_STATE, p.phys_state);
  if (!p.netdev.empty()) {
    w.put_u32(RDMA_NLDEV_ATTR_NDEV_INDEX, p.netdev_index);
    w.put_str(RDMA_NLDEV_ATTR_NDEV_NAME, p.netdev);
  }
  c.out.push_back(w.finish());
}

int cmd_port_get(Ctx& c) {
  const size_t n = c.src.device().ports.size();
  if (c.dump()) {
    if (int e = named_device(c, false)) return e;
    for (uint32_t p = 1; p <= n; ++p) port_message(c, p);
    return 0;
  }
  uint32_t port = 0;
  if (int e = named_device(c, true)) return e;
  if (!get_u32(c.attrs, RDMA_NLDEV_ATTR_PORT_INDEX, port) || port == 0 || port > n) return EINVAL;
  port_message(c, port);
  return 0;
}

// RDMA_NLDEV_CMD_RES_GET (fill_res_info): how many objects of each kind.
int cmd_res_summary(Ctx& c) {
  if (int e = named_device(c, !c.dump())) return e;
  Resources r;
  if (int e = c.src.resources(r)) return e;
  MsgWriter w = c.writer();
  put_device_handle(w, c.src.device());
  const size_t table = w.begin_nest(RDMA_NLDEV_ATTR_RES_SUMMARY);
  const std::pair<const char*, size_t> rows[] = {
      {"pd", r.pds.size()}, {"cq", r.cqs.size()}, {"qp", r.qps.size()}, {"mr", r.mrs.size()}};
  for (const auto& [name, count] : rows) {
    const size_t e = w.begin_nest(RDMA_NLDEV_ATTR_RES_SUMMARY_ENTRY);
    w.put_str(RDMA_NLDEV_ATTR_RES_SUMMARY_ENTRY_NAME, name);
    w.put_u64(RDMA_NLDEV_ATTR_RES_SUMMARY_ENTRY_CURR, count);
    w.end_nest(e);
  }
  w.end_nest(table);
  c.out.push_back(w.finish());
  return 0;
}

// ---- One object of each kind (fill_res_*_entry) ----
void put_pid(MsgWriter& w, uint32_t pid) {
  if (pid) w.put_u32(RDMA_NLDEV_ATTR_RES_PID, pid);
}

void put_qp(MsgWriter& w, const QpRes& q, bool) {
  if (q.port) w.put_u32(RDMA_NLDEV_ATTR_PORT_INDEX, q.port);
  w.put_u32(RDMA_NLDEV_ATTR_RES_LQPN, q.lqpn);
  const bool connected = q.type == 2 || q.type == 3;  // RC, UC
  if (connected) {
    w.put_u32(RDMA_NLDEV_ATTR_RES_RQPN, q.rqpn);
    w.put_u32(RDMA_NLDEV_ATTR_RES_RQ_PSN, q.rq_psn);
  }
  w.put_u32(RDMA_NLDEV_ATTR_RES_SQ_PSN, q.sq_psn);
  if (connected) w.put_u8(RDMA_NLDEV_ATTR_RES_PATH_MIG_STATE, 0);  // IB_MIG_MIGRATED
  w.put_u8(RDMA_NLDEV_ATTR_RES_TYPE, q.type);
  w.put_u8(RDMA_NLDEV_ATTR_RES_STATE, q.state);
  w.put_u32(RDMA_NLDEV_ATTR_RES_PDN, q.pdn);
  put_pid(w, q.pid);
}

void put_cq(MsgWriter& w, const CqRes& q, bool) {
  w.put_u32(RDMA_NLDEV_ATTR_RES_CQE, q.cqe);
  w.put_u64(RDMA_NLDEV_ATTR_RES_USECNT, q.users);
  w.put_u32(RDMA_NLDEV_ATTR_RES_CQN, q.cqn);
  if (q.ctxn) w.put_u32(RDMA_NLDEV_ATTR_RES_CTXN, q.ctxn);
  put_pid(w, q.pid);
}

// Keys and the address only to the privileged, as the kernel puts them
// only for CAP_NET_ADMIN.
void put_mr(MsgWriter& w, const MrRes& m, bool privileged) {
  if (privileged) {
    w.put_u32(RDMA_NLDEV_ATTR_RES_RKEY, m.key);
    w.put_u32(RDMA_NLDEV_ATTR_RES_LKEY, m.key);
    w.put_u64(RDMA_NLDEV_ATTR_RES_IOVA, m.iova);
  }
  w.put_u64(RDMA_NLDEV_ATTR_RES_MRLEN, m.length);
  w.put_u32(RDMA_NLDEV_ATTR_RES_MRN, m.mrn);
  w.put_u32(RDMA_NLDEV_ATTR_RES_PDN, m.pdn);
  put_pid(w, m.pid);
}

void put_pd(MsgWriter& w, const PdRes& p, bool) {
  w.put_u64(RDMA_NLDEV_ATTR_RES_USECNT, p.users);
  w.put_u32(RDMA_NLDEV_ATTR_RES_PDN, p.pdn);
  if (p.ctxn) w.put_u32(RDMA_NLDEV_ATTR_RES_CTXN, p.ctxn);
  put_pid(w, p.pid);
}

// A resource command: a dump puts the objects as entries of the kind's
// table (as many messages as they fill); a doit the one object the id
// attribute names (ENOENT for none), its attributes at the top level.
template <class T>
int res_command(Ctx& c, const std::vector<T>& objs, uint32_t T::*id, uint16_t id_attr, uint16_t table_attr,
                uint16_t entry_attr, void (*put)(MsgWriter&, const T&, bool)) {
  const bool priv = c.src.privileged();
  const DeviceFacts& d = c.src.device();
  if (!c.dump()) {
    uint32_t want = 0;
    if (!get_u32(c.attrs, id_attr, want)) return EINVAL;
    for (const T& o : objs) {
      if (o.*id != want) continue;
      MsgWriter w = c.writer();
      put_device_handle(w, d);
      put(w, o, priv);
      c.out.push_back(w.finish());
      return 0;
    }
    return ENOENT;
  }
  size_t i = 0;
  do {
    MsgWriter w = c.writer();
    put_device_handle(w, d);
    const size_t table = w.begin_nest(table_attr);
    for (; i < objs.size() && w.size() < kMaxMessage; ++i) {
      const size_t e = w.begin_nest(entry_attr);
      put(w, objs[i], priv);
      w.end_nest(e);
    }
    w.end_nest(table);
    c.out.push_back(w.finish());
  } while (i < objs.size());
  return 0;
}

int cmd_res(Ctx& c, uint32_t op) {
  if (int e = named_device(c, true)) return e;
  Resources r;
  if (int e = c.src.resources(r)) return e;
  switch (op) {
    case RDMA_NLDEV_CMD_RES_QP_GET:
      return res_command(c, r.qps, &QpRes::lqpn, RDMA_NLDEV_ATTR_RES_LQPN, RDMA_NLDEV_ATTR_RES_QP,
                         RDMA_NLDEV_ATTR_RES_QP_ENTRY, put_qp);
    case RDMA_NLDEV_CMD_RES_CQ_GET:
      return res_command(c, r.cqs, &CqRes::cqn, RDMA_NLDEV_ATTR_RES_CQN, RDMA_NLDEV_ATTR_RES_CQ,
                         RDMA_NLDEV_ATTR_RES_CQ_ENTRY, put_cq);
    case RDMA_NLDEV_CMD_RES_MR_GET:
      return res_command(c, r.mrs, &MrRes::mrn, RDMA_NLDEV_ATTR_RES_MRN, RDMA_NLDEV_ATTR_RES_MR,
                         RDMA_NLDEV_ATTR_RES_MR_ENTRY, put_mr);
    default:
      return res_command(c, r.pds, &PdRes::pdn, RDMA_NLDEV_ATTR_RES_PDN, RDMA_NLDEV_ATTR_RES_PD,
                         RDMA_NLDEV_ATTR_RES_PD_ENTRY, put_pd);
  }
}

void put_hwcounters(MsgWriter& w, const std::vector<Counter>& counters) {
  const size_t table = w.begin_nest(RDMA_NLDEV_ATTR_STAT_HWCOUNTERS);
  for (const Counter& k : counters) {
    const size_t e = w.begin_nest(RDMA_NLDEV_ATTR_STAT_HWCOUNTER_ENTRY);
    w.put_str(RDMA_NLDEV_ATTR_STAT_HWCOUNTER_ENTRY_NAME, k.name);
    w.put_u64(RDMA_NLDEV_ATTR_STAT_HWCOUNTER_ENTRY_VALUE, k.value);
    w.end_nest(e);
  }
  w.end_nest(table);
}

// RDMA_NLDEV_CMD_STAT_GET dump with STAT_RES = RES_QP (`rdma statistic qp
// show`): the counter objects, one per live QP (as the kernel's automatic
// per-QP mode would bind them), numbered by QPN, each with its counters
// and its one QP, as STAT_COUNTER entries, in as many messages as they fill.
int stat_qp_dump(Ctx& c, uint32_t port) {
  std::vector<QpCounters> qps;
  if (int e = c.src.qp_counters(qps)) return e;
  size_t i = 0;
  do {
    MsgWriter w = c.writer();
    put_device_handle(w, c.src.device());
    w.put_u32(RDMA_NLDEV_ATTR_PORT_INDEX, port);
    const size_t table = w.begin_nest(RDMA_NLDEV_ATTR_STAT_COUNTER);
    for (; i < qps.size() && w.size() < kMaxMessage; ++i) {
      const size_t e = w.begin_nest(RDMA_NLDEV_ATTR_STAT_COUNTER_ENTRY);
      w.put_u32(RDMA_NLDEV_ATTR_PORT_INDEX, port);
      w.put_u32(RDMA_NLDEV_ATTR_STAT_COUNTER_ID, qps[i].qpn);
      put_pid(w, qps[i].pid);
      put_hwcounters(w, qps[i].values);
      const size_t qt = w.begin_nest(RDMA_NLDEV_ATTR_RES_QP);
      const size_t qe = w.begin_nest(RDMA_NLDEV_ATTR_RES_QP_ENTRY);
      w.put_u32(RDMA_NLDEV_ATTR_RES_LQPN, qps[i].qpn);
      w.end_nest(qe);
      w.end_nest(qt);
      w.end_nest(e);
    }
    w.end_nest(table);
    c.out.push_back(w.finish());
  } while (i < qps.size());
  return 0;
}

// RDMA_NLDEV_CMD_STAT_GET: without STAT_RES, the port's counters (as
// `rdma statistic show` asks): STAT_HWCOUNTERS, one entry per counter;
// with STAT_RES = RES_QP, a dump, each QP's (stat_qp_dump). Other
// resources and the counter modes are not kept: EOPNOTSUPP.
int cmd_stat_get(Ctx& c) {
  uint32_t res = 0;
  const bool per_qp = get_u32(c.attrs, RDMA_NLDEV_ATTR_STAT_RES, res);
  if (c.attrs.count(RDMA_NLDEV_ATTR_STAT_RES) && (!per_qp || res != RDMA_NLDEV_ATTR_RES_QP || !c.dump()))
    return EOPNOTSUPP;
  if (!per_qp && c.dump()) return EOPNOTSUPP;
  uint32_t port = 0;
  if (int e = named_device(c, true)) return e;
  if (!get_u32(c.attrs, RDMA_NLDEV_ATTR_PORT_INDEX, port) || port == 0 || port > c.src.device().ports.size())
    return EINVAL;
  if (per_qp) return stat_qp_dump(c, port);
  std::vector<Counter> counters;
  if (int e = c.src.counters(port, counters)) return e;
  MsgWriter w = c.writer();
  put_device_handle(w, c.src.device());
  w.put_u32(RDMA_NLDEV_ATTR_PORT_INDEX, port);
  put_hwcounters(w, counters);
  c.out.push_back(w.finish());
  return 0;
}

// RDMA_NLDEV_CMD_SYS_GET: devices shared by every network namespace
// (netns mode 1, shared), copy-on-fork (memory registered stays with the
// parent across fork: softverbs' backings are shared memory).
int cmd_sys_get(Ctx& c) {
  MsgWriter w = c.writer();
  w.put_u8(RDMA_NLDEV_SYS_ATTR_NETNS_MODE, 1);
  w.put_u8(RDMA_NLDEV_SYS_ATTR_COPY_ON_FORK, 1);
  c.out.push_back(w.finish());
  return 0;
}

int dispatch(Ctx& c) {
  if (RDMA_NL_GET_CLIENT(c.req.type) != RDMA_NL_NLDEV) return EOPNOTSUPP;
  const uint32_t op = RDMA_NL_GET_OP(c.req.type);
  switch (op) {
    case RDMA_NLDEV_CMD_GET: return cmd_get(c);
    case RDMA_NLDEV_CMD_PORT_GET: return cmd_port_get(c);
    case RDMA_NLDEV_CMD_RES_GET: return cmd_res_summary(c);
    case RDMA_NLDEV_CMD_RES_QP_GET:
    case RDMA_NLDEV_CMD_RES_CQ_GET:
    case RDMA_NLDEV_CMD_RES_MR_GET:
    case RDMA_NLDEV_CMD_RES_PD_GET: return cmd_res(c, op);
    case RDMA_NLDEV_CMD_STAT_GET: return cmd_stat_get(c);
    case RDMA_NLDEV_CMD_SYS_GET:
      if (c.dump()) return EOPNOTSUPP;
      return cmd_sys_get(c);
    default: return EOPNOTSUPP;
  }
}

}  // namespace

std::vector<std::string> answer(std::string_view request, uint32_t portid, Source& src) {
  std::vector<std::string> out;
  each_message(request, [&](const MsgHeader& h, std::string_view payload) {
    if (!(h.flags & NLM_F_REQUEST) || h.type < NLMSG_MIN_TYPE) {
      if (h.flags & NLM_F_ACK) out.push_back(error_message(h, 0, portid));
      return;
    }
    AttrMap attrs;
    const size_t before = out.size();
    int e = parse_attrs(payload, attrs) ? 0 : EINVAL;
    Ctx c{h, attrs, portid, src, out};
    if (e == 0) e = dispatch(c);
    if (e) {
      out.resize(before);
      out.push_back(error_message(h, e, portid));
    } else if (c.dump()) {
      out.push_back(done_message(h, portid));
    } else if (h.flags & NLM_F_ACK) {
      out.push_back(error_message(h, 0, portid));
    }
  });
  return out;
}

}  // namespace sv::nldev
