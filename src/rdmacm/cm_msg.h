// cm_msg.h: the IB connection manager's messages (IBTA 12.6 and 12.11) as
// 256-byte MADs, and the IP addressing header that rdma_cm puts at the start
// of a REQ's / SIDR_REQ's private data (IBTA Annex A11).
//
// Contract: pure functions over caller-owned buffers; no state, thread safe.
// encode() writes exactly kMadSize bytes; decode() accepts only a buffer of
// exactly kMadSize bytes with the CM management class and a known attribute,
// and never reads past it. The same bytes can later travel as MADs on QP1
// (RoCEv2); between processes of one host they travel over a unix socket.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <cstddef>
#include <cstdint>

namespace sv::cm {

constexpr size_t kMadSize = 256;       // IBTA 13.4.2: every MAD is 256 bytes
constexpr size_t kMadHeader = 24;      // IBTA 13.4.3: common MAD header
constexpr uint8_t kMgmtClassCm = 0x07;  // IBTA 13.4.4: Communication Management
constexpr uint8_t kCmClassVersion = 2;
constexpr uint8_t kMethodSend = 0x03;

// IBTA 12.6 table 98 (attribute IDs of the CM class).
enum class Attr : uint16_t {
  kReq = 0x0010,
  kMra = 0x0011,
  kRej = 0x0012,
  kRep = 0x0013,
  kRtu = 0x0014,
  kDreq = 0x0015,
  kDrep = 0x0016,
  kSidrReq = 0x0017,
  kSidrRep = 0x0018,
};

// Private data sizes (IBTA 12.6.5-12.6.11, 12.11.2-3).
constexpr size_t kReqPrivate = 92;
constexpr size_t kRepPrivate = 196;
constexpr size_t kRejPrivate = 148;
constexpr size_t kRtuPrivate = 224;
constexpr size_t kDreqPrivate = 220;
constexpr size_t kDrepPrivate = 224;
constexpr size_t kSidrReqPrivate = 216;
constexpr size_t kSidrRepPrivate = 136;

// REJ reasons (IBTA 12.6.7.2 table 107) that we send.
enum RejReason : uint16_t {
  kRejTimeout = 1,
  kRejInvalidServiceId = 8,
  kRejStaleConn = 10,
  kRejConsumer = 28,
};
// SIDR_REP status (IBTA 12.11.3 table 120).
enum SidrStatus : uint8_t { kSidrOk = 0, kSidrNoService = 1, kSidrRejected = 2 };
// REJ "message rejected" (IBTA 12.6.7.1): 0 REQ, 1 REP, 2 other.
enum RejMsg : uint8_t { kRejectedReq = 0, kRejectedRep = 1, kRejectedOther = 2 };

// IBTA 12.6.5 (REQ), primary path only: on RoCE the path is the GRH.
struct Req {
  uint32_t local_comm_id = 0;
  uint64_t service_id = 0;
  uint64_t local_ca_guid = 0;
  uint32_t local_qkey = 0;
  uint32_t local_qpn = 0;  // 24 bits
  uint8_t responder_resources = 0;
  uint8_t initiator_depth = 0;
  uint8_t remote_cm_response_timeout = 0;  // 5 bits
  uint8_t transport_type = 0;              // 2 bits: 0 RC, 1 UC, 3 see extended
  bool flow_control = false;
  uint32_t starting_psn = 0;               // 24 bits
  uint8_t local_cm_response_timeout = 0;   // 5 bits
  uint8_t retry_count = 0;                 // 3 bits
  uint16_t pkey = 0;
  uint8_t path_mtu = 0;                    // 4 bits, enum ibv_mtu
  uint8_t rnr_retry_count = 0;             // 3 bits
  uint8_t max_cm_retries = 0;              // 4 bits
  bool srq = false;
  uint8_t local_gid[16] = {};
  uint8_t remote_gid[16] = {};
  uint32_t flow_label = 0;  // 20 bits
  uint8_t packet_rate = 0;  // 6 bits
  uint8_t traffic_class = 0;
  uint8_t hop_limit = 0;
  uint8_t sl = 0;                // 4 bits
  uint8_t local_ack_timeout = 0; // 5 bits
  uint8_t private_data[kReqPrivate] = {};
};

// IBTA 12.6.8 (REP).
struct Rep {
  uint32_t local_comm_id = 0;
  uint32_t remote_comm_id = 0;
  uint32_t local_qkey = 0;
  uint32_t local_qpn = 0;     // 24 bits
  uint32_t starting_psn = 0;  // 24 bits
  uint8_t responder_resources = 0;
  uint8_t initiator_depth = 0;
  uint8_t target_ack_delay = 0;  // 5 bits
  uint8_t failover_accepted = 0; // 2 bits
  bool flow_control = false;
  uint8_t rnr_retry_count = 0;   // 3 bits
  bool srq = false;
  uint64_t local_ca_guid = 0;
  uint8_t private_data[kRepPrivate] = {};
};

// IBTA 12.6.7 (REJ).
struct Rej {
  uint32_t local_comm_id = 0;
  uint32_t remote_comm_id = 0;
  uint8_t message_rejected = 0;  // 2 bits, RejMsg
  uint8_t reject_info_length = 0;
  uint16_t reason = 0;
  uint8_t ari[72] = {};
  uint8_t private_data[kRejPrivate] = {};
};

// IBTA 12.6.9 (RTU), 12.6.11 (DREP): ids and private data only.
struct Rtu {
  uint32_t local_comm_id = 0;
  uint32_t remote_comm_id = 0;
  uint8_t private_data[kRtuPrivate] = {};
};

// IBTA 12.6.10 (DREQ).
struct Dreq {
  uint32_t local_comm_id = 0;
  uint32_t remote_comm_id = 0;
  uint32_t remote_qpn = 0;  // 24 bits
  uint8_t private_data[kDreqPrivate] = {};
};

struct Drep {
  uint32_t local_comm_id = 0;
  uint32_t remote_comm_id = 0;
  uint8_t private_data[kDrepPrivate] = {};
};

// IBTA 12.11.2 (SIDR_REQ).
struct SidrReq {
  uint32_t request_id = 0;
  uint16_t pkey = 0;
  uint64_t service_id = 0;
  uint8_t private_data[kSidrReqPrivate] = {};
};

// IBTA 12.11.3 (SIDR_REP); the ClassPortInfo (redirection) is left zero.
struct SidrRep {
  uint32_t request_id = 0;
  uint8_t status = 0;
  uint8_t additional_info_length = 0;
  uint32_t qpn = 0;  // 24 bits
  uint64_t service_id = 0;
  uint32_t qkey = 0;
  uint8_t private_data[kSidrRepPrivate] = {};
};

// IBTA 12.6.6 (MRA): "a reply will be late"; sent by the wire gateway
// (src/daemon/cm_gateway.cc) for a REQ the application has not answered yet.
enum MraMsg : uint8_t { kMraReq = 0, kMraRep = 1, kMraLap = 2 };
struct Mra {
  uint32_t local_comm_id = 0;
  uint32_t remote_comm_id = 0;
  uint8_t message_mraed = 0;          // 2 bits, MraMsg
  uint8_t service_timeout = 0;        // 5 bits: 4.096 us * 2^n
};

// A decoded message: `attr` says which member is meaningful.
struct Msg {
  Attr attr = Attr::kReq;
  uint64_t tid = 0;
  Req req;
  Rep rep;
  Rej rej;
  Rtu rtu;
  Dreq dreq;
  Drep drep;
  SidrReq sidr_req;
  SidrRep sidr_rep;
  Mra mra;
};

void encode(const Req& m, uint64_t tid, uint8_t out[kMadSize]);
void encode(const Rep& m, uint64_t tid, uint8_t out[kMadSize]);
void encode(const Rej& m, uint64_t tid, uint8_t out[kMadSize]);
void encode(const Rtu& m, uint64_t tid, uint8_t out[kMadSize]);
void encode(const Dreq& m, uint64_t tid, uint8_t out[kMadSize]);
void encode(const Drep& m, uint64_t tid, uint8_t out[kMadSize]);
void encode(const SidrReq& m, uint64_t tid, uint8_t out[kMadSize]);
void encode(const SidrRep& m, uint64_t tid, uint8_t out[kMadSize]);
void encode(const Mra& m, uint64_t tid, uint8_t out[kMadSize]);
// false if `n` is not kMadSize or the header is not a CM Send of a known attribute.
bool decode(const uint8_t* in, size_t n, Msg& out);

// The rdma_cm IP addressing header (IBTA Annex A11, "RDMA IP CM Service"):
// 36 bytes at the start of the REQ / SIDR_REQ private data.
constexpr size_t kIpHeader = 36;
constexpr uint8_t kIpHeaderVersion = 0x00;
// Service ID of an rdma_cm port (Annex A11.2): 0x0000000001 | port space | port.
inline uint64_t service_id(int port_space, uint16_t port) {
  return (uint64_t(uint16_t(port_space)) << 16) | port;
}
struct IpHeader {
  sockaddr_storage src{};  // the active side's address and port
  sockaddr_storage dst{};  // the address it connected to (port from the service ID)
};
void encode_ip_header(const IpHeader& h, uint8_t out[kIpHeader]);
// false for an unknown version or IP version; dst's port is left 0.
bool decode_ip_header(const uint8_t in[kIpHeader], IpHeader& h);

// --- reading and answering messages: shared by the library's state machine
// (src/rdmacm/cm_state.cc) and the daemon's gateway (src/daemon/cm_gateway.cc).

// The attribute ID of a MAD's header (IBTA 13.4.3), without decoding it.
uint16_t attr_of(const uint8_t* mad);
// A REQ or SIDR_REQ: the first message of a connection (or of a SIDR query).
bool is_request(const Msg& m);
// A REQ's local comm ID or a SIDR_REQ's request ID; 0 for other messages.
uint32_t request_id(const Msg& m);
// A REQ's or SIDR_REQ's service ID (Annex A11.2); 0 for other messages.
uint64_t request_service_id(const Msg& m);
// A REQ's or SIDR_REQ's private data (which starts with the IP header);
// nullptr for other messages.
const uint8_t* request_private_data(const Msg& m);
// The IP header of a REQ / SIDR_REQ; false for another message or a bad header.
bool request_ip_header(const Msg& m, IpHeader& h);
// The comm ID an answer names as its receiver's own: the RemoteCommID of a
// REP, REJ, RTU, DREQ, DREP or MRA, the request ID of a SIDR_REP; 0 for a
// request.
uint32_t receiver_id(const Msg& m);

// The CM's own messages, encoded into `out` (private data zero).
void encode_rej(uint32_t local_id, uint32_t remote_id, RejMsg which, uint16_t reason, uint64_t tid,
                uint8_t out[kMadSize]);
void encode_dreq(uint32_t local_id, uint32_t remote_id, uint32_t remote_qpn, uint64_t tid, uint8_t out[kMadSize]);
void encode_drep(uint32_t local_id, uint32_t remote_id, uint64_t tid, uint8_t out[kMadSize]);
void encode_sidr_status(uint32_t request_id, SidrStatus status, uint64_t service_id, uint64_t tid,
                        uint8_t out[kMadSize]);
// The answer to a request nobody listens for: a REJ "invalid service ID"
// (IBTA 12.6.7.2, reason 8) from comm ID `local_id`, or a SIDR_REP "service
// ID not supported" (12.11.3), with the request's transaction ID.
void encode_no_listener(const Msg& req, uint32_t local_id, uint8_t out[kMadSize]);

}  // namespace sv::cm
