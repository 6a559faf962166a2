#include "nldev/nl_msg.h"

#include <linux/netlink.h>

#include <cstring>

namespace sv::nldev {

namespace {
constexpr size_t align4(size_t n) { return (n + 3) & ~size_t(3); }
}  // namespace

MsgWriter::MsgWriter(uint16_t type, uint16_t flags, uint32_t seq, uint32_t portid) {
  nlmsghdr h{};
  h.nlmsg_type = type;
  h.nlmsg_flags = flags;
  h.nlmsg_seq = seq;
  h.nlmsg_pid = portid;
  buf_.assign(reinterpret_cast<const char*>(&h), sizeof(h));
}

void MsgWriter::put(uint16_t type, const void* data, size_t len) {
  nlattr a{};
  a.nla_len = uint16_t(sizeof(a) + len);
  a.nla_type = type;
  buf_.append(reinterpret_cast<const char*>(&a), sizeof(a));
  buf_.append(static_cast<const char*>(data), len);
  buf_.resize(align4(buf_.size()), '\0');
}

void MsgWriter::put_str(uint16_t type, std::string_view s) {
  std::string z(s);
  put(type, z.c_str(), z.size() + 1);
}

size_t MsgWriter::begin_nest(uint16_t type) {
  const size_t at = buf_.size();
  put(type, nullptr, 0);
  return at;
}

void MsgWriter::end_nest(size_t at) {
  const uint16_t len = uint16_t(buf_.size() - at);
  std::memcpy(&buf_[at], &len, sizeof(len));
}

std::string MsgWriter::finish() {
  const uint32_t len = uint32_t(buf_.size());
  std::memcpy(&buf_[0], &len, sizeof(len));
  return buf_;
}

bool parse_attrs(std::string_view p, AttrMap& out) {
  while (p.size() >= sizeof(nlattr)) {
    nlattr a;
    std::memcpy(&a, p.data(), sizeof(a));
    if (a.nla_len < sizeof(a) || a.nla_len > p.size()) return false;
    out[uint16_t(a.nla_type & NLA_TYPE_MASK)] = p.substr(sizeof(a), a.nla_len - sizeof(a));
    const size_t step = align4(a.nla_len);
    if (step >= p.size()) return true;
    p.remove_prefix(step);
  }
  return p.empty();
}

bool get_u32(const AttrMap& m, uint16_t type, uint32_t& v) {
  auto it = m.find(type);
  if (it == m.end() || it->second.size() != sizeof(v)) return false;
  std::memcpy(&v, it->second.data(), sizeof(v));
  return true;
}

bool read_header(std::string_view buf, MsgHeader& h) {
  nlmsghdr n;
  if (buf.size() < sizeof(n)) return false;
  std::memcpy(&n, buf.data(), sizeof(n));
  if (n.nlmsg_len < sizeof(n) || n.nlmsg_len > buf.size()) return false;
  h.len = n.nlmsg_len;
  h.type = n.nlmsg_type;
  h.flags = n.nlmsg_flags;
  h.seq = n.nlmsg_seq;
  h.portid = n.nlmsg_pid;
  return true;
}

std::string error_message(const MsgHeader& req, int error, uint32_t portid) {
  MsgWriter w(NLMSG_ERROR, NLM_F_CAPPED, req.seq, portid);
  nlmsgerr e{};
  e.error = -error;
  e.msg.nlmsg_len = req.len;
  e.msg.nlmsg_type = req.type;
  e.msg.nlmsg_flags = req.flags;
  e.msg.nlmsg_seq = req.seq;
  e.msg.nlmsg_pid = req.portid;
  std::string m = w.finish();
  m.append(reinterpret_cast<const char*>(&e), sizeof(e));
  const uint32_t len = uint32_t(m.size());
  std::memcpy(&m[0], &len, sizeof(len));
  return m;
}

std::string done_message(const MsgHeader& req, uint32_t portid) {
  MsgWriter w(NLMSG_DONE, NLM_F_MULTI, req.seq, portid);
  std::string m = w.finish();
  const int32_t zero = 0;
  m.append(reinterpret_cast<const char*>(&zero), sizeof(zero));
  const uint32_t len = uint32_t(m.size());
  std::memcpy(&m[0], &len, sizeof(len));
  return m;
}

}  // namespace sv::nldev
