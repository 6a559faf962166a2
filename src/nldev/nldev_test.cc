// The RDMA netlink stand-in's messages (nl_msg.h) and answers (nldev.h),
// checked byte for byte against netlink(7)'s layout and the attributes
// iproute2's `rdma` requires of each answer.
#include <gtest/gtest.h>
#include <linux/netlink.h>
#include <rdma/rdma_netlink.h>

#include <cstring>
#include <tuple>

#include "nldev/nl_msg.h"
#include "nldev/nldev.h"

namespace sv::nldev {
namespace {

class FakeSource : public Source {
 public:
  FakeSource() {
    d.name = "sv0";
    d.fw = "softverbs 0.1.0";
    d.node_guid = 0x0011223344555356ull;
    d.protocol = "roce";
    d.ports.push_back({4, 5, "eth0", 2});
  }
  const DeviceFacts& device() override { return d; }
  int counters(uint32_t, std::vector<Counter>& out) override {
    out = {{"sent_pkts", 7}, {"rcvd_pkts", 9}};
    return 0;
  }
  int qp_counters(std::vector<QpCounters>& out) override {
    out = qps;
    return 0;
  }
  int resources(Resources& out) override {
    out = res;
    return 0;
  }
  bool privileged() override { return priv; }
  DeviceFacts d;
  Resources res;
  std::vector<QpCounters> qps;
  bool priv = false;
};

std::string request(uint32_t cmd, uint16_t flags, const std::vector<std::pair<uint16_t, uint32_t>>& attrs,
                    uint32_t seq = 77) {
  MsgWriter w(uint16_t(RDMA_NL_GET_TYPE(RDMA_NL_NLDEV, cmd)), uint16_t(NLM_F_REQUEST | flags), seq, 0);
  for (auto [t, v] : attrs) w.put_u32(t, v);
  return w.finish();
}

struct Parsed {
  MsgHeader h;
  AttrMap attrs;
  std::string bytes;  // keeps the views valid
};

Parsed parse(const std::string& m) {
  Parsed p;
  p.bytes = m;
  EXPECT_TRUE(read_header(p.bytes, p.h));
  EXPECT_EQ(p.h.len, m.size());
  EXPECT_TRUE(parse_attrs(std::string_view(p.bytes).substr(16), p.attrs));
  return p;
}

std::string str(const AttrMap& m, uint16_t t) {
  auto it = m.find(t);
  if (it == m.end() || it->second.empty() || it->second.back() != '\0') return "<none>";
  return std::string(it->second.substr(0, it->second.size() - 1));
}

uint64_t u64(const AttrMap& m, uint16_t t) {
  uint64_t v = 0;
  auto it = m.find(t);
  if (it != m.end() && it->second.size() == 8) std::memcpy(&v, it->second.data(), 8);
  return v;
}

uint32_t u32(const AttrMap& m, uint16_t t) {
  uint32_t v = 0;
  auto it = m.find(t);
  if (it != m.end() && it->second.size() == 4) std::memcpy(&v, it->second.data(), 4);
  return v;
}

int error_of(const std::string& m) {
  nlmsghdr h;
  std::memcpy(&h, m.data(), sizeof h);
  EXPECT_EQ(h.nlmsg_type, NLMSG_ERROR);
  EXPECT_EQ(m.size(), NLMSG_LENGTH(sizeof(nlmsgerr)));
  nlmsgerr e;
  std::memcpy(&e, m.data() + NLMSG_HDRLEN, sizeof e);
  return e.error;
}

TEST(NetlinkMsg, AttributesArePaddedToFourBytes) {
  MsgWriter w(42, NLM_F_MULTI, 5, 6);
  w.put_u8(1, 0xab);
  w.put_str(2, "sv0");
  const size_t nest = w.begin_nest(3);
  w.put_u32(4, 0x01020304);
  w.end_nest(nest);
  const std::string m = w.finish();
  // header 16, u8: 4 + 1 padded to 8, "sv0\0": 4 + 4, nest: 4 + (4 + 4).
  ASSERT_EQ(m.size(), 16u + 8 + 8 + 12);
  nlmsghdr h;
  std::memcpy(&h, m.data(), sizeof h);
  EXPECT_EQ(h.nlmsg_len, m.size());
  EXPECT_EQ(h.nlmsg_type, 42);
  EXPECT_EQ(h.nlmsg_flags, NLM_F_MULTI);
  EXPECT_EQ(h.nlmsg_seq, 5u);
  EXPECT_EQ(h.nlmsg_pid, 6u);
  nlattr a;
  std::memcpy(&a, m.data() + 16, sizeof a);
  EXPECT_EQ(a.nla_len, 5);
  EXPECT_EQ(uint8_t(m[20]), 0xab);
  std::memcpy(&a, m.data() + 24, sizeof a);
  EXPECT_EQ(a.nla_len, 8);
  EXPECT_EQ(std::memcmp(m.data() + 28, "sv0", 4), 0);
  std::memcpy(&a, m.data() + 32, sizeof a);
  EXPECT_EQ(a.nla_len, 12);  // the nest covers its child
  EXPECT_EQ(a.nla_type, 3);
  AttrMap top, inner;
  ASSERT_TRUE(parse_attrs(std::string_view(m).substr(16), top));
  ASSERT_TRUE(parse_attrs(top.at(3), inner));
  uint32_t v = 0;
  EXPECT_TRUE(get_u32(inner, 4, v));
  EXPECT_EQ(v, 0x01020304u);
}

TEST(NetlinkMsg, MalformedAttributesAreRefused) {
  const char shortattr[] = {8, 0, 1, 0, 1, 2};  // claims 8 bytes, has 6
  AttrMap m;
  EXPECT_FALSE(parse_attrs(std::string_view(shortattr, sizeof shortattr), m));
  const char tiny[] = {2, 0, 1, 0};  // shorter than its own header
  EXPECT_FALSE(parse_attrs(std::string_view(tiny, sizeof tiny), m));
}

TEST(Nldev, DeviceDumpThenDone) {
  FakeSource src;
  auto out = answer(request(RDMA_NLDEV_CMD_GET, NLM_F_DUMP | NLM_F_ACK, {}), 1234, src);
  ASSERT_EQ(out.size(), 2u);
  Parsed p = parse(out[0]);
  EXPECT_EQ(p.h.type, RDMA_NL_GET_TYPE(RDMA_NL_NLDEV, RDMA_NLDEV_CMD_GET));
  EXPECT_EQ(p.h.flags, NLM_F_MULTI);
  EXPECT_EQ(p.h.seq, 77u);
  EXPECT_EQ(p.h.portid, 1234u);
  uint32_t v = 0;
  EXPECT_TRUE(get_u32(p.attrs, RDMA_NLDEV_ATTR_DEV_INDEX, v));
  EXPECT_EQ(str(p.attrs, RDMA_NLDEV_ATTR_DEV_NAME), "sv0");
  EXPECT_TRUE(get_u32(p.attrs, RDMA_NLDEV_ATTR_PORT_INDEX, v));
  EXPECT_EQ(v, 1u);  // the port count
  EXPECT_EQ(str(p.attrs, RDMA_NLDEV_ATTR_FW_VERSION), "softverbs 0.1.0");
  EXPECT_EQ(u64(p.attrs, RDMA_NLDEV_ATTR_NODE_GUID), 0x0011223344555356ull);
  EXPECT_EQ(str(p.attrs, RDMA_NLDEV_ATTR_DEV_PROTOCOL), "roce");
  nlmsghdr done;
  std::memcpy(&done, out[1].data(), sizeof done);
  EXPECT_EQ(done.nlmsg_type, NLMSG_DONE);
  EXPECT_EQ(done.nlmsg_flags, NLM_F_MULTI);
  EXPECT_EQ(done.nlmsg_len, NLMSG_LENGTH(sizeof(int)));
}

TEST(Nldev, PortGetNamesTheNetdevAndAcks) {
  FakeSource src;
  auto out = answer(request(RDMA_NLDEV_CMD_PORT_GET, NLM_F_ACK, {{RDMA_NLDEV_ATTR_DEV_INDEX, 1}, {RDMA_NLDEV_ATTR_PORT_INDEX, 1}}), 9, src);
  ASSERT_EQ(out.size(), 2u);
  Parsed p = parse(out[0]);
  EXPECT_EQ(p.h.flags, 0);
  EXPECT_EQ(str(p.attrs, RDMA_NLDEV_ATTR_NDEV_NAME), "eth0");
  uint32_t v = 0;
  EXPECT_TRUE(get_u32(p.attrs, RDMA_NLDEV_ATTR_NDEV_INDEX, v));
  EXPECT_EQ(v, 2u);
  ASSERT_EQ(p.attrs.at(RDMA_NLDEV_ATTR_PORT_STATE).size(), 1u);
  EXPECT_EQ(p.attrs.at(RDMA_NLDEV_ATTR_PORT_STATE)[0], 4);
  EXPECT_EQ(error_of(out[1]), 0);  // the acknowledgement
}

TEST(Nldev, WrongDeviceOrPortIsEinval) {
  FakeSource src;
  auto out = answer(request(RDMA_NLDEV_CMD_PORT_GET, NLM_F_ACK, {{RDMA_NLDEV_ATTR_DEV_INDEX, 7}, {RDMA_NLDEV_ATTR_PORT_INDEX, 1}}), 9, src);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(error_of(out[0]), -EINVAL);
  out = answer(request(RDMA_NLDEV_CMD_PORT_GET, 0, {{RDMA_NLDEV_ATTR_DEV_INDEX, 1}, {RDMA_NLDEV_ATTR_PORT_INDEX, 2}}), 9, src);
  ASSERT_EQ(out.size(), 1u);  // an error is sent without NLM_F_ACK too
  EXPECT_EQ(error_of(out[0]), -EINVAL);
}

TEST(Nldev, UnimplementedIsEopnotsuppNeverSilence) {
  FakeSource src;
  for (uint32_t cmd : {uint32_t(RDMA_NLDEV_CMD_NEWLINK), uint32_t(RDMA_NLDEV_CMD_SET), uint32_t(RDMA_NLDEV_CMD_RES_CM_ID_GET),
                       uint32_t(RDMA_NLDEV_CMD_RES_SRQ_GET), uint32_t(RDMA_NLDEV_CMD_STAT_SET), 200u}) {
    auto out = answer(request(cmd, NLM_F_ACK, {{RDMA_NLDEV_ATTR_DEV_INDEX, 1}}), 9, src);
    ASSERT_EQ(out.size(), 1u) << cmd;
    EXPECT_EQ(error_of(out[0]), -EOPNOTSUPP) << cmd;
  }
  // Another RDMA netlink client (RDMA_NL_LS, the SA's) than the device interface.
  MsgWriter w(uint16_t(RDMA_NL_GET_TYPE(RDMA_NL_LS, 1)), NLM_F_REQUEST, 1, 0);
  auto out = answer(w.finish(), 9, src);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(error_of(out[0]), -EOPNOTSUPP);
  // Per-QP counters (STAT_RES) are not kept.
  out = answer(request(RDMA_NLDEV_CMD_STAT_GET, NLM_F_ACK, {{RDMA_NLDEV_ATTR_DEV_INDEX, 1}, {RDMA_NLDEV_ATTR_PORT_INDEX, 1}, {RDMA_NLDEV_ATTR_STAT_RES, RDMA_NLDEV_ATTR_RES_QP}}), 9, src);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(error_of(out[0]), -EOPNOTSUPP);
}

TEST(Nldev, QpDumpSplitsIntoMessagesAReaderOfAPageTakes) {
  FakeSource src;
  for (uint32_t i = 0; i < 300; ++i) src.res.qps.push_back({100 + i, 0, 0, 0, 1, 4242, 1, 2, 3});
  auto out = answer(request(RDMA_NLDEV_CMD_RES_QP_GET, NLM_F_DUMP | NLM_F_ACK, {{RDMA_NLDEV_ATTR_DEV_INDEX, 1}}), 9, src);
  ASSERT_GT(out.size(), 2u);
  size_t entries = 0;
  for (size_t i = 0; i + 1 < out.size(); ++i) {
    EXPECT_LE(out[i].size(), 4096u);
    Parsed p = parse(out[i]);
    ASSERT_TRUE(p.attrs.count(RDMA_NLDEV_ATTR_RES_QP));
    std::string_view table = p.attrs.at(RDMA_NLDEV_ATTR_RES_QP);
    while (!table.empty()) {  // each entry: a RES_QP_ENTRY nest
      nlattr a;
      std::memcpy(&a, table.data(), sizeof a);
      ASSERT_EQ(a.nla_type, RDMA_NLDEV_ATTR_RES_QP_ENTRY);
      AttrMap e;
      ASSERT_TRUE(parse_attrs(table.substr(4, a.nla_len - 4), e));
      uint32_t lqpn = 0, pid = 0;
      EXPECT_TRUE(get_u32(e, RDMA_NLDEV_ATTR_RES_LQPN, lqpn));
      EXPECT_EQ(lqpn, 100 + entries);
      EXPECT_TRUE(get_u32(e, RDMA_NLDEV_ATTR_RES_PID, pid));
      EXPECT_EQ(pid, 4242u);
      EXPECT_TRUE(e.count(RDMA_NLDEV_ATTR_RES_SQ_PSN) && e.count(RDMA_NLDEV_ATTR_RES_TYPE) &&
                  e.count(RDMA_NLDEV_ATTR_RES_STATE));  // what `rdma` requires of a QP line
      ++entries;
      table.remove_prefix(std::min(table.size(), size_t((a.nla_len + 3) & ~3)));
    }
  }
  EXPECT_EQ(entries, 300u);
  nlmsghdr done;
  std::memcpy(&done, out.back().data(), sizeof done);
  EXPECT_EQ(done.nlmsg_type, NLMSG_DONE);
}

TEST(Nldev, MrKeysOnlyForThePrivileged) {
  FakeSource src;
  src.res.mrs.push_back({5, 0x1234, 1, 42, 0x7000, 4096});
  auto req = request(RDMA_NLDEV_CMD_RES_MR_GET, NLM_F_ACK, {{RDMA_NLDEV_ATTR_DEV_INDEX, 1}, {RDMA_NLDEV_ATTR_RES_MRN, 5}});
  auto out = answer(req, 9, src);
  ASSERT_EQ(out.size(), 2u);
  Parsed p = parse(out[0]);
  EXPECT_FALSE(p.attrs.count(RDMA_NLDEV_ATTR_RES_RKEY));
  EXPECT_FALSE(p.attrs.count(RDMA_NLDEV_ATTR_RES_IOVA));
  EXPECT_EQ(u64(p.attrs, RDMA_NLDEV_ATTR_RES_MRLEN), 4096u);
  src.priv = true;
  out = answer(req, 9, src);
  p = parse(out[0]);
  uint32_t key = 0;
  EXPECT_TRUE(get_u32(p.attrs, RDMA_NLDEV_ATTR_RES_RKEY, key));
  EXPECT_EQ(key, 0x1234u);
  // An object no one may see: ENOENT.
  out = answer(request(RDMA_NLDEV_CMD_RES_MR_GET, NLM_F_ACK, {{RDMA_NLDEV_ATTR_DEV_INDEX, 1}, {RDMA_NLDEV_ATTR_RES_MRN, 6}}), 9, src);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(error_of(out[0]), -ENOENT);
}

TEST(Nldev, PortCountersByName) {
  FakeSource src;
  auto out = answer(request(RDMA_NLDEV_CMD_STAT_GET, NLM_F_ACK, {{RDMA_NLDEV_ATTR_DEV_INDEX, 1}, {RDMA_NLDEV_ATTR_PORT_INDEX, 1}}), 9, src);
  ASSERT_EQ(out.size(), 2u);
  Parsed p = parse(out[0]);
  // Both entries share a type: walk the table.
  std::string_view t = p.attrs.at(RDMA_NLDEV_ATTR_STAT_HWCOUNTERS);
  std::vector<std::pair<std::string, uint64_t>> seen;
  while (!t.empty()) {
    nlattr a;
    std::memcpy(&a, t.data(), sizeof a);
    AttrMap e;
    ASSERT_TRUE(parse_attrs(t.substr(4, a.nla_len - 4), e));
    seen.push_back({str(e, RDMA_NLDEV_ATTR_STAT_HWCOUNTER_ENTRY_NAME), u64(e, RDMA_NLDEV_ATTR_STAT_HWCOUNTER_ENTRY_VALUE)});
    t.remove_prefix(std::min(t.size(), size_t((a.nla_len + 3) & ~3)));
  }
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0], std::make_pair(std::string("sent_pkts"), uint64_t(7)));
  EXPECT_EQ(seen[1], std::make_pair(std::string("rcvd_pkts"), uint64_t(9)));
}

// `rdma statistic qp show`: a dump of the counter objects, one per QP
// (numbered by QPN), each with its pid, its counters and its one QP.
TEST(Nldev, QpCountersOnePerQp) {
  FakeSource src;
  src.qps = {{17, 4242, {{"rdma_sends", 5}, {"sent_bytes", 640}}}, {18, 0, {{"rdma_sends", 0}, {"sent_bytes", 0}}}};
  auto out = answer(request(RDMA_NLDEV_CMD_STAT_GET, NLM_F_DUMP | NLM_F_ACK,
                            {{RDMA_NLDEV_ATTR_DEV_INDEX, 1}, {RDMA_NLDEV_ATTR_PORT_INDEX, 1},
                             {RDMA_NLDEV_ATTR_STAT_RES, RDMA_NLDEV_ATTR_RES_QP}}),
                    9, src);
  ASSERT_GE(out.size(), 2u);
  Parsed p = parse(out[0]);
  std::string_view t = p.attrs.at(RDMA_NLDEV_ATTR_STAT_COUNTER);
  std::vector<std::tuple<uint32_t, uint32_t, uint32_t, uint64_t>> seen;  // cntn, pid, lqpn, sent_bytes
  while (!t.empty()) {
    nlattr a;
    std::memcpy(&a, t.data(), sizeof a);
    AttrMap e;
    ASSERT_TRUE(parse_attrs(t.substr(4, a.nla_len - 4), e));
    AttrMap qp_entry;  // RES_QP holds one RES_QP_ENTRY
    ASSERT_TRUE(parse_attrs(e.at(RDMA_NLDEV_ATTR_RES_QP).substr(4), qp_entry));
    uint64_t bytes = 0;
    std::string_view h = e.at(RDMA_NLDEV_ATTR_STAT_HWCOUNTERS);
    while (!h.empty()) {
      nlattr b;
      std::memcpy(&b, h.data(), sizeof b);
      AttrMap c;
      ASSERT_TRUE(parse_attrs(h.substr(4, b.nla_len - 4), c));
      if (str(c, RDMA_NLDEV_ATTR_STAT_HWCOUNTER_ENTRY_NAME) == "sent_bytes")
        bytes = u64(c, RDMA_NLDEV_ATTR_STAT_HWCOUNTER_ENTRY_VALUE);
      h.remove_prefix(std::min(h.size(), size_t((b.nla_len + 3) & ~3)));
    }
    const uint32_t pid = e.count(RDMA_NLDEV_ATTR_RES_PID) ? u32(e, RDMA_NLDEV_ATTR_RES_PID) : 0;
    seen.push_back({u32(e, RDMA_NLDEV_ATTR_STAT_COUNTER_ID), pid, u32(qp_entry, RDMA_NLDEV_ATTR_RES_LQPN), bytes});
    t.remove_prefix(std::min(t.size(), size_t((a.nla_len + 3) & ~3)));
  }
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0], std::make_tuple(17u, 4242u, 17u, uint64_t(640)));
  EXPECT_EQ(seen[1], std::make_tuple(18u, 0u, 18u, uint64_t(0)));
  // Without a dump, or for another resource: refused.
  out = answer(request(RDMA_NLDEV_CMD_STAT_GET, NLM_F_ACK,
                       {{RDMA_NLDEV_ATTR_DEV_INDEX, 1}, {RDMA_NLDEV_ATTR_PORT_INDEX, 1},
                        {RDMA_NLDEV_ATTR_STAT_RES, RDMA_NLDEV_ATTR_RES_QP}}),
               9, src);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(error_of(out[0]), -EOPNOTSUPP);
}

TEST(Nldev, SeveralRequestsInOneBuffer) {
  FakeSource src;
  std::string two = request(RDMA_NLDEV_CMD_GET, NLM_F_ACK, {{RDMA_NLDEV_ATTR_DEV_INDEX, 1}}, 1) +
                    request(RDMA_NLDEV_CMD_SET, NLM_F_ACK, {{RDMA_NLDEV_ATTR_DEV_INDEX, 1}}, 2);
  auto out = answer(two, 9, src);
  ASSERT_EQ(out.size(), 3u);  // the device and its ack, then the refusal
  EXPECT_EQ(error_of(out[1]), 0);
  EXPECT_EQ(error_of(out[2]), -EOPNOTSUPP);
  MsgHeader h;
  ASSERT_TRUE(read_header(out[2], h));
  EXPECT_EQ(h.seq, 2u);
}

}  // namespace
}  // namespace sv::nldev
