// nl_msg.h: netlink messages as the RDMA netlink stand-in writes and reads
// them (netlink(7); the attribute layout of <linux/netlink.h>: a 4-byte
// header {nla_len, nla_type} then the payload, each attribute padded to 4
// bytes; a nest is an attribute whose payload is attributes).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>

namespace sv::nldev {

// One netlink message under construction: nlmsghdr, then attributes.
class MsgWriter {
 public:
  MsgWriter(uint16_t type, uint16_t flags, uint32_t seq, uint32_t portid);
  void put_u8(uint16_t type, uint8_t v) { put(type, &v, 1); }
  void put_u32(uint16_t type, uint32_t v) { put(type, &v, 4); }
  void put_u64(uint16_t type, uint64_t v) { put(type, &v, 8); }
  void put_str(uint16_t type, std::string_view s);  // NUL-terminated, as NLA_NUL_STRING
  void put(uint16_t type, const void* data, size_t len);
  // A nest: begin returns its offset, end sets its length (NLA_F_NESTED is
  // not set: the kernel's RDMA netlink does not set it either).
  size_t begin_nest(uint16_t type);
  void end_nest(size_t at);
  size_t size() const { return buf_.size(); }
  // The message, its nlmsg_len set.
  std::string finish();

 private:
  std::string buf_;
};

// A message's header fields.
struct MsgHeader {
  uint32_t len = 0;
  uint16_t type = 0, flags = 0;
  uint32_t seq = 0, portid = 0;
};

// The attributes of one level, by type (the last one of a type wins, as
// libmnl's parsers keep it); each value is the attribute's payload. False
// for a malformed list (an attribute shorter than its header or past the end).
using AttrMap = std::map<uint16_t, std::string_view>;
bool parse_attrs(std::string_view payload, AttrMap& out);
// A u32 attribute of `m`, if present and 4 bytes long.
bool get_u32(const AttrMap& m, uint16_t type, uint32_t& v);

// Splits a buffer of netlink messages: calls fn(header, attributes
// payload) for each well-formed one; false at the first malformed one.
template <class Fn>
bool each_message(std::string_view buf, Fn&& fn);

// The error message (NLMSG_ERROR) answering `req`: error 0 is an
// acknowledgement. Only the request's header is echoed (NETLINK_CAP_ACK's
// form, flagged NLM_F_CAPPED).
std::string error_message(const MsgHeader& req, int error, uint32_t portid);
// The end of a dump (NLMSG_DONE, NLM_F_MULTI, its int payload 0).
std::string done_message(const MsgHeader& req, uint32_t portid);

// ---- implementation of the template ----
bool read_header(std::string_view buf, MsgHeader& h);
template <class Fn>
bool each_message(std::string_view buf, Fn&& fn) {
  while (!buf.empty()) {
    MsgHeader h;
    if (!read_header(buf, h)) return false;
    constexpr size_t kHdr = 16;
    fn(h, buf.substr(kHdr, h.len - kHdr));
    const size_t step = (size_t(h.len) + 3) & ~size_t(3);
    if (step >= buf.size()) break;
    buf.remove_prefix(step);
  }
  return true;
}

}  // namespace sv::nldev
