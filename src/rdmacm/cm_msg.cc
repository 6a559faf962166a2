// cm_msg.cc: byte layouts of the CM MADs. Offsets below are from the start
// of the MAD's data (after the 24-byte header), in bytes, as in the tables
// of IBTA 12.6.5-12.6.11 and 12.11.2-3; all fields are big-endian.
#include "rdmacm/cm_msg.h"

#include <arpa/inet.h>

#include <cstring>

namespace sv::cm {
namespace {

void put8(uint8_t* d, size_t off, uint8_t v) { d[kMadHeader + off] = v; }
void put16(uint8_t* d, size_t off, uint16_t v) {
  d[kMadHeader + off] = uint8_t(v >> 8);
  d[kMadHeader + off + 1] = uint8_t(v);
}
void put32(uint8_t* d, size_t off, uint32_t v) {
  for (int i = 0; i < 4; ++i) d[kMadHeader + off + i] = uint8_t(v >> (24 - 8 * i));
}
void put64(uint8_t* d, size_t off, uint64_t v) {
  put32(d, off, uint32_t(v >> 32));
  put32(d, off + 4, uint32_t(v));
}
void putn(uint8_t* d, size_t off, const void* src, size_t n) { std::memcpy(d + kMadHeader + off, src, n); }
uint8_t get8(const uint8_t* d, size_t off) { return d[kMadHeader + off]; }
uint16_t get16(const uint8_t* d, size_t off) {
  return uint16_t(d[kMadHeader + off] << 8 | d[kMadHeader + off + 1]);
}
uint32_t get32(const uint8_t* d, size_t off) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v = v << 8 | d[kMadHeader + off + i];
  return v;
}
uint64_t get64(const uint8_t* d, size_t off) { return uint64_t(get32(d, off)) << 32 | get32(d, off + 4); }
void getn(const uint8_t* d, size_t off, void* dst, size_t n) { std::memcpy(dst, d + kMadHeader + off, n); }

// IBTA 13.4.3: BaseVersion, MgmtClass, ClassVersion, R|Method, Status,
// ClassSpecific, TransactionID, AttributeID, reserved, AttributeModifier.
void header(uint8_t* d, Attr a, uint64_t tid) {
  std::memset(d, 0, kMadSize);
  d[0] = 1;
  d[1] = kMgmtClassCm;
  d[2] = kCmClassVersion;
  d[3] = kMethodSend;
  for (int i = 0; i < 8; ++i) d[8 + i] = uint8_t(tid >> (56 - 8 * i));
  d[16] = uint8_t(uint16_t(a) >> 8);
  d[17] = uint8_t(uint16_t(a));
}

}  // namespace

// IBTA 12.6.5 table 99.
void encode(const Req& m, uint64_t tid, uint8_t* d) {
  header(d, Attr::kReq, tid);
  put32(d, 0, m.local_comm_id);
  put64(d, 8, m.service_id);
  put64(d, 16, m.local_ca_guid);
  put32(d, 28, m.local_qkey);
  put32(d, 32, (m.local_qpn & 0xffffff) << 8 | m.responder_resources);
  put32(d, 36, m.initiator_depth);  // local EECN 0
  put32(d, 40, uint32_t(m.remote_cm_response_timeout & 0x1f) << 3 | (m.transport_type & 3) << 1 |
                   (m.flow_control ? 1 : 0));  // remote EECN 0
  put32(d, 44, (m.starting_psn & 0xffffff) << 8 | (m.local_cm_response_timeout & 0x1f) << 3 |
                   (m.retry_count & 7));
  put16(d, 48, m.pkey);
  put8(d, 50, uint8_t((m.path_mtu & 0xf) << 4 | (m.rnr_retry_count & 7)));  // RDC exists 0
  put8(d, 51, uint8_t((m.max_cm_retries & 0xf) << 4 | (m.srq ? 8 : 0)));
  put16(d, 52, 0xffff);  // primary local LID: permissive on RoCE
  put16(d, 54, 0xffff);
  putn(d, 56, m.local_gid, 16);
  putn(d, 72, m.remote_gid, 16);
  put32(d, 88, (m.flow_label & 0xfffff) << 12 | (m.packet_rate & 0x3f));
  put8(d, 92, m.traffic_class);
  put8(d, 93, m.hop_limit);
  put8(d, 94, uint8_t((m.sl & 0xf) << 4));
  put8(d, 95, uint8_t((m.local_ack_timeout & 0x1f) << 3));
  putn(d, 140, m.private_data, kReqPrivate);
}

// IBTA 12.6.8 table 103.
void encode(const Rep& m, uint64_t tid, uint8_t* d) {
  header(d, Attr::kRep, tid);
  put32(d, 0, m.local_comm_id);
  put32(d, 4, m.remote_comm_id);
  put32(d, 8, m.local_qkey);
  put32(d, 12, (m.local_qpn & 0xffffff) << 8);
  put32(d, 20, (m.starting_psn & 0xffffff) << 8);
  put8(d, 24, m.responder_resources);
  put8(d, 25, m.initiator_depth);
  put8(d, 26, uint8_t((m.target_ack_delay & 0x1f) << 3 | (m.failover_accepted & 3) << 1 | (m.flow_control ? 1 : 0)));
  put8(d, 27, uint8_t((m.rnr_retry_count & 7) << 5 | (m.srq ? 0x10 : 0)));
  put64(d, 28, m.local_ca_guid);
  putn(d, 36, m.private_data, kRepPrivate);
}

// IBTA 12.6.7 table 106.
void encode(const Rej& m, uint64_t tid, uint8_t* d) {
  header(d, Attr::kRej, tid);
  put32(d, 0, m.local_comm_id);
  put32(d, 4, m.remote_comm_id);
  put8(d, 8, uint8_t((m.message_rejected & 3) << 6));
  put8(d, 9, uint8_t((m.reject_info_length & 0x7f) << 1));
  put16(d, 10, m.reason);
  putn(d, 12, m.ari, sizeof(m.ari));
  putn(d, 84, m.private_data, kRejPrivate);
}

// IBTA 12.6.9 table 108.
void encode(const Rtu& m, uint64_t tid, uint8_t* d) {
  header(d, Attr::kRtu, tid);
  put32(d, 0, m.local_comm_id);
  put32(d, 4, m.remote_comm_id);
  putn(d, 8, m.private_data, kRtuPrivate);
}

// IBTA 12.6.10 table 109.
void encode(const Dreq& m, uint64_t tid, uint8_t* d) {
  header(d, Attr::kDreq, tid);
  put32(d, 0, m.local_comm_id);
  put32(d, 4, m.remote_comm_id);
  put32(d, 8, (m.remote_qpn & 0xffffff) << 8);
  putn(d, 12, m.private_data, kDreqPrivate);
}

// IBTA 12.6.11 table 110.
void encode(const Drep& m, uint64_t tid, uint8_t* d) {
  header(d, Attr::kDrep, tid);
  put32(d, 0, m.local_comm_id);
  put32(d, 4, m.remote_comm_id);
  putn(d, 8, m.private_data, kDrepPrivate);
}

// IBTA 12.11.2 table 118.
void encode(const SidrReq& m, uint64_t tid, uint8_t* d) {
  header(d, Attr::kSidrReq, tid);
  put32(d, 0, m.request_id);
  put16(d, 4, m.pkey);
  put64(d, 8, m.service_id);
  putn(d, 16, m.private_data, kSidrReqPrivate);
}

// IBTA 12.11.3 table 119.
void encode(const SidrRep& m, uint64_t tid, uint8_t* d) {
  header(d, Attr::kSidrRep, tid);
  put32(d, 0, m.request_id);
  put8(d, 4, m.status);
  put8(d, 5, m.additional_info_length);
  put32(d, 8, (m.qpn & 0xffffff) << 8);
  put64(d, 12, m.service_id);
  put32(d, 20, m.qkey);
  putn(d, 96, m.private_data, kSidrRepPrivate);
}

// IBTA 12.6.6 table 101.
void encode(const Mra& m, uint64_t tid, uint8_t* d) {
  header(d, Attr::kMra, tid);
  put32(d, 0, m.local_comm_id);
  put32(d, 4, m.remote_comm_id);
  put8(d, 8, uint8_t((m.message_mraed & 3) << 6));
  put8(d, 9, uint8_t((m.service_timeout & 0x1f) << 3));
}

namespace {

// IBTA 12.6.5 table 99.
void decode_req(const uint8_t* d, Req& r) {
  r.local_comm_id = get32(d, 0);
  r.service_id = get64(d, 8);
  r.local_ca_guid = get64(d, 16);
  r.local_qkey = get32(d, 28);
  r.local_qpn = get32(d, 32) >> 8;
  r.responder_resources = get8(d, 35);
  r.initiator_depth = get8(d, 39);
  uint8_t b = get8(d, 43);
  r.remote_cm_response_timeout = b >> 3;
  r.transport_type = (b >> 1) & 3;
  r.flow_control = b & 1;
  r.starting_psn = get32(d, 44) >> 8;
  b = get8(d, 47);
  r.local_cm_response_timeout = b >> 3;
  r.retry_count = b & 7;
  r.pkey = get16(d, 48);
  b = get8(d, 50);
  r.path_mtu = b >> 4;
  r.rnr_retry_count = b & 7;
  b = get8(d, 51);
  r.max_cm_retries = b >> 4;
  r.srq = b & 8;
  getn(d, 56, r.local_gid, 16);
  getn(d, 72, r.remote_gid, 16);
  uint32_t w = get32(d, 88);
  r.flow_label = w >> 12;
  r.packet_rate = w & 0x3f;
  r.traffic_class = get8(d, 92);
  r.hop_limit = get8(d, 93);
  r.sl = get8(d, 94) >> 4;
  r.local_ack_timeout = get8(d, 95) >> 3;
  getn(d, 140, r.private_data, kReqPrivate);
}

// IBTA 12.6.8 table 103.
void decode_rep(const uint8_t* d, Rep& r) {
  r.local_comm_id = get32(d, 0);
  r.remote_comm_id = get32(d, 4);
  r.local_qkey = get32(d, 8);
  r.local_qpn = get32(d, 12) >> 8;
  r.starting_psn = get32(d, 20) >> 8;
  r.responder_resources = get8(d, 24);
  r.initiator_depth = get8(d, 25);
  uint8_t b = get8(d, 26);
  r.target_ack_delay = b >> 3;
  r.failover_accepted = (b >> 1) & 3;
  r.flow_control = b & 1;
  b = get8(d, 27);
  r.rnr_retry_count = b >> 5;
  r.srq = b & 0x10;
  r.local_ca_guid = get64(d, 28);
  getn(d, 36, r.private_data, kRepPrivate);
}

// IBTA 12.6.7 table 106.
void decode_rej(const uint8_t* d, Rej& r) {
  r.local_comm_id = get32(d, 0);
  r.remote_comm_id = get32(d, 4);
  r.message_rejected = get8(d, 8) >> 6;
  r.reject_info_length = get8(d, 9) >> 1;
  r.reason = get16(d, 10);
  getn(d, 12, r.ari, sizeof(r.ari));
  getn(d, 84, r.private_data, kRejPrivate);
}

// IBTA 12.11.3 table 119.
void decode_sidr_rep(const uint8_t* d, SidrRep& r) {
  r.request_id = get32(d, 0);
  r.status = get8(d, 4);
  r.additional_info_length = get8(d, 5);
  r.qpn = get32(d, 8) >> 8;
  r.service_id = get64(d, 12);
  r.qkey = get32(d, 20);
  getn(d, 96, r.private_data, kSidrRepPrivate);
}

}  // namespace

bool decode(const uint8_t* d, size_t n, Msg& m) {
  if (n != kMadSize || d[0] != 1 || d[1] != kMgmtClassCm || d[2] != kCmClassVersion || d[3] != kMethodSend)
    return false;
  m.tid = 0;
  for (int i = 0; i < 8; ++i) m.tid = m.tid << 8 | d[8 + i];
  m.attr = Attr(uint16_t(d[16] << 8 | d[17]));
  switch (m.attr) {
    case Attr::kReq:
      decode_req(d, m.req);
      return true;
    case Attr::kRep:
      decode_rep(d, m.rep);
      return true;
    case Attr::kRej:
      decode_rej(d, m.rej);
      return true;
    case Attr::kRtu:  // IBTA 12.6.9 table 108
      m.rtu.local_comm_id = get32(d, 0);
      m.rtu.remote_comm_id = get32(d, 4);
      getn(d, 8, m.rtu.private_data, kRtuPrivate);
      return true;
    case Attr::kDreq:  // IBTA 12.6.10 table 109
      m.dreq.local_comm_id = get32(d, 0);
      m.dreq.remote_comm_id = get32(d, 4);
      m.dreq.remote_qpn = get32(d, 8) >> 8;
      getn(d, 12, m.dreq.private_data, kDreqPrivate);
      return true;
    case Attr::kDrep:  // IBTA 12.6.11 table 110
      m.drep.local_comm_id = get32(d, 0);
      m.drep.remote_comm_id = get32(d, 4);
      getn(d, 8, m.drep.private_data, kDrepPrivate);
      return true;
    case Attr::kSidrReq:  // IBTA 12.11.2 table 118
      m.sidr_req.request_id = get32(d, 0);
      m.sidr_req.pkey = get16(d, 4);
      m.sidr_req.service_id = get64(d, 8);
      getn(d, 16, m.sidr_req.private_data, kSidrReqPrivate);
      return true;
    case Attr::kSidrRep:
      decode_sidr_rep(d, m.sidr_rep);
      return true;
    case Attr::kMra:  // IBTA 12.6.6 table 101
      m.mra.local_comm_id = get32(d, 0);
      m.mra.remote_comm_id = get32(d, 4);
      m.mra.message_mraed = get8(d, 8) >> 6;
      m.mra.service_timeout = get8(d, 9) >> 3;
      return true;
  }
  return false;
}

uint16_t attr_of(const uint8_t* mad) { return uint16_t(mad[16] << 8 | mad[17]); }

bool is_request(const Msg& m) { return m.attr == Attr::kReq || m.attr == Attr::kSidrReq; }

uint32_t request_id(const Msg& m) {
  if (m.attr == Attr::kReq) return m.req.local_comm_id;
  if (m.attr == Attr::kSidrReq) return m.sidr_req.request_id;
  return 0;
}

uint64_t request_service_id(const Msg& m) {
  if (m.attr == Attr::kReq) return m.req.service_id;
  if (m.attr == Attr::kSidrReq) return m.sidr_req.service_id;
  return 0;
}

const uint8_t* request_private_data(const Msg& m) {
  if (m.attr == Attr::kReq) return m.req.private_data;
  if (m.attr == Attr::kSidrReq) return m.sidr_req.private_data;
  return nullptr;
}

bool request_ip_header(const Msg& m, IpHeader& h) {
  const uint8_t* p = request_private_data(m);
  return p && decode_ip_header(p, h);
}

uint32_t receiver_id(const Msg& m) {
  switch (m.attr) {
    case Attr::kRep:
      return m.rep.remote_comm_id;
    case Attr::kRej:
      return m.rej.remote_comm_id;
    case Attr::kRtu:
      return m.rtu.remote_comm_id;
    case Attr::kDreq:
      return m.dreq.remote_comm_id;
    case Attr::kDrep:
      return m.drep.remote_comm_id;
    case Attr::kMra:
      return m.mra.remote_comm_id;
    case Attr::kSidrRep:
      return m.sidr_rep.request_id;
    case Attr::kReq:
    case Attr::kSidrReq:
      break;
  }
  return 0;
}

void encode_rej(uint32_t local_id, uint32_t remote_id, RejMsg which, uint16_t reason, uint64_t tid,
                uint8_t out[kMadSize]) {
  Rej r;
  r.local_comm_id = local_id;
  r.remote_comm_id = remote_id;
  r.message_rejected = which;
  r.reason = reason;
  encode(r, tid, out);
}

void encode_dreq(uint32_t local_id, uint32_t remote_id, uint32_t remote_qpn, uint64_t tid, uint8_t out[kMadSize]) {
  Dreq r;
  r.local_comm_id = local_id;
  r.remote_comm_id = remote_id;
  r.remote_qpn = remote_qpn;
  encode(r, tid, out);
}

void encode_drep(uint32_t local_id, uint32_t remote_id, uint64_t tid, uint8_t out[kMadSize]) {
  Drep r;
  r.local_comm_id = local_id;
  r.remote_comm_id = remote_id;
  encode(r, tid, out);
}

void encode_sidr_status(uint32_t request_id, SidrStatus status, uint64_t service_id, uint64_t tid,
                        uint8_t out[kMadSize]) {
  SidrRep r;
  r.request_id = request_id;
  r.status = status;
  r.service_id = service_id;
  encode(r, tid, out);
}

void encode_no_listener(const Msg& req, uint32_t local_id, uint8_t out[kMadSize]) {
  if (req.attr == Attr::kSidrReq)
    encode_sidr_status(req.sidr_req.request_id, kSidrNoService, req.sidr_req.service_id, req.tid, out);
  else
    encode_rej(local_id, request_id(req), kRejectedReq, kRejInvalidServiceId, req.tid, out);
}

// Annex A11: byte 0 CM version, byte 1 IP version in bits 7:4, bytes 2-3 the
// source port, then source and destination addresses as 16 bytes each (an
// IPv4 address in the last 4, the rest zero).
void encode_ip_header(const IpHeader& h, uint8_t out[kIpHeader]) {
  std::memset(out, 0, kIpHeader);
  out[0] = kIpHeaderVersion;
  auto put_addr = [](const sockaddr_storage& ss, uint8_t* dst) {
    if (ss.ss_family == AF_INET)
      std::memcpy(dst + 12, &reinterpret_cast<const sockaddr_in&>(ss).sin_addr, 4);
    else if (ss.ss_family == AF_INET6)
      std::memcpy(dst, &reinterpret_cast<const sockaddr_in6&>(ss).sin6_addr, 16);
  };
  if (h.src.ss_family == AF_INET) {
    out[1] = 4 << 4;
    std::memcpy(out + 2, &reinterpret_cast<const sockaddr_in&>(h.src).sin_port, 2);
  } else {
    out[1] = 6 << 4;
    std::memcpy(out + 2, &reinterpret_cast<const sockaddr_in6&>(h.src).sin6_port, 2);
  }
  put_addr(h.src, out + 4);
  put_addr(h.dst, out + 20);
}

bool decode_ip_header(const uint8_t in[kIpHeader], IpHeader& h) {
  if (in[0] != kIpHeaderVersion) return false;
  h = IpHeader{};
  uint16_t port;
  std::memcpy(&port, in + 2, 2);
  if ((in[1] >> 4) == 4) {
    auto& s = reinterpret_cast<sockaddr_in&>(h.src);
    auto& d = reinterpret_cast<sockaddr_in&>(h.dst);
    s.sin_family = d.sin_family = AF_INET;
    s.sin_port = port;
    std::memcpy(&s.sin_addr, in + 4 + 12, 4);
    std::memcpy(&d.sin_addr, in + 20 + 12, 4);
    return true;
  }
  if ((in[1] >> 4) == 6) {
    auto& s = reinterpret_cast<sockaddr_in6&>(h.src);
    auto& d = reinterpret_cast<sockaddr_in6&>(h.dst);
    s.sin6_family = d.sin6_family = AF_INET6;
    s.sin6_port = port;
    std::memcpy(&s.sin6_addr, in + 4, 16);
    std::memcpy(&d.sin6_addr, in + 20, 16);
    return true;
  }
  return false;
}

}  // namespace sv::cm
