// rsocket_proto.h: the rsocket wire protocol and its bookkeeping, pure (no
// verbs, no sockets), so that it can be unit tested (tests/rdmacm/
// rsocket_proto_test.cc).
//
// The protocol is rdma-core's (librdmacm/rsocket.c, rsocket(7)); we mirror
// it so that a softverbs rsocket can talk to an rdma-core one (e.g. on rxe):
//
//  * Connect private data: struct rs_conn_data (40 bytes, below): version 1,
//    flags (RS_CONN_FLAG_NET: the sender is big endian; RS_CONN_FLAG_IOMAP),
//    credits = the sender's receive queue size (big endian), the size of its
//    iomap table (rs_value_to_scale, 8 bits), the "target SGL" (where the
//    peer writes new receive-buffer grants: 2 rs_sge entries, followed by
//    the iomap table, in one MR) and the first half of its receive buffer.
//    Its addresses, keys and lengths are big endian.
//  * Every message is an RDMA WRITE WITH IMMEDIATE; the immediate (big
//    endian on the wire) is op << 29 | data: DATA (data = bytes written into
//    the peer's receive buffer), SGL (data = the sequence number up to which
//    the peer may send: credits; with a 16-byte payload it also grants a new
//    half of the receive buffer, written into the peer's target SGL),
//    IOMAP_SGL (data = the index of the iomap entry written), CTRL
//    (DISCONNECT, KEEPALIVE, SHUTDOWN). riowrite is a plain RDMA WRITE.
//  * In-band SGL/iomap payloads are in the sender's byte order unless the
//    connect data said the orders differ (RS_OPT_SWAP_SGL).
//  * The receive buffer is a ring of two halves; the receiver grants a half
//    once it has consumed it, data arrives in ring order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

namespace sv::rsock {

// Immediate data: op in bits 31..29 (rsocket.c's RS_OP_*).
enum : uint32_t {
  kOpData = 0,
  kOpWrite = 2,  // riowrite: never on the wire, only in our wr_id
  kOpSgl = 4,
  kOpIomapSgl = 6,
  kOpCtrl = 7,
};
enum : uint32_t { kCtrlDisconnect = 0, kCtrlKeepalive = 1, kCtrlShutdown = 2 };

constexpr uint32_t msg_set(uint32_t op, uint32_t data) { return (op << 29) | (data & 0x1FFFFFFFu); }
constexpr uint32_t msg_op(uint32_t m) { return m >> 29; }
constexpr uint32_t msg_data(uint32_t m) { return m & 0x1FFFFFFFu; }

// Work request ids: receives carry bit 63 (rsocket.c's RS_WR_ID_FLAG_RECV),
// sends the message they carry.
constexpr uint64_t kWrRecv = uint64_t(1) << 63;

// rsocket.c's defaults and limits.
constexpr uint32_t kOlapStart = 2048;      // RS_OLAP_START_SIZE
constexpr uint32_t kMaxTransfer = 65536;   // RS_MAX_TRANSFER
constexpr uint32_t kSndLowat = 2048;       // RS_SNDLOWAT
constexpr uint16_t kQpMinSize = 16;        // RS_QP_MIN_SIZE
constexpr uint16_t kQpMaxSize = 0xFFFE;    // RS_QP_MAX_SIZE
constexpr uint32_t kQpCtrlSize = 4;        // RS_QP_CTRL_SIZE
constexpr int kSglSize = 2;                // RS_SGL_SIZE
constexpr uint32_t kDefMem = 1 << 17;      // def_mem, def_wmem
constexpr uint16_t kDefInline = 64;
constexpr uint16_t kDefQpSize = 384;

struct Sge {  // struct rs_sge
  uint64_t addr;
  uint32_t key;
  uint32_t length;
};
static_assert(sizeof(Sge) == 16);

struct Iomap {  // struct rs_iomap
  uint64_t offset;
  Sge sge;
};
static_assert(sizeof(Iomap) == 24);

constexpr uint8_t kConnFlagNet = 1 << 0;
constexpr uint8_t kConnFlagIomap = 1 << 1;

struct ConnData {  // struct rs_conn_data, as on the wire
  uint8_t version;
  uint8_t flags;
  uint16_t credits;  // big endian
  uint8_t reserved[3];
  uint8_t target_iomap_size;  // rs_value_to_scale(size, 8)
  Sge target_sgl;             // big endian fields
  Sge data_buf;               // big endian fields
};
static_assert(sizeof(ConnData) == 40);

// What a side announces / learns at connect, in host order.
struct ConnInfo {
  Sge target_sgl;  // length = number of SGL entries (2)
  Sge data_buf;    // the first half of the receive buffer
  uint16_t credits = 0;
  uint16_t iomap_size = 0;
  bool iomap = false;
  bool swap = false;  // peer's byte order differs (RS_OPT_SWAP_SGL)
};

// rsocket.c's rs_value_to_scale / rs_scale_to_value: a value up to
// 2^(bits-1) is itself, larger ones are stored as a multiple of 2^bits.
constexpr int value_to_scale(int value, int bits) {
  return value <= (1 << (bits - 1)) ? value : (1 << (bits - 1)) | (value >> bits);
}
constexpr int scale_to_value(int value, int bits) {
  return value <= (1 << (bits - 1)) ? value : (value & ~(1 << (bits - 1))) << bits;
}

void encode_conn(const ConnInfo& in, ConnData* out);
// false unless version 1 and at least sizeof(ConnData) bytes.
bool decode_conn(const void* p, size_t len, ConnInfo* out);
// An in-band SGL entry as the peer expects it (swapped if orders differ).
Sge wire_sge(Sge s, bool swap);
Iomap wire_iomap(Iomap m, bool swap);

// The receive side's accounting (rsocket.c's rbuf_* and rseq_* fields): a
// ring of DATA messages (their lengths) over a receive buffer of two halves.
class RecvRing {
 public:
  void reset(uint32_t rbuf_size, uint16_t rq_size);
  // A DATA message of `len` bytes arrived; false if the queue is full (the
  // peer overran its credits).
  bool push(uint32_t len);
  bool empty() const { return head_ == tail_; }
  size_t queued_bytes() const;
  // Copies up to `len` bytes into `dst` (consuming unless `peek`); the
  // buffer `rbuf` is the ring's memory. Returns the count.
  size_t take(const uint8_t* rbuf, uint8_t* dst, size_t len, bool peek);
  // rs_give_credits' first half: a half of the buffer is free, or half the
  // receive credits were used since the last grant.
  bool want_credit() const;
  // The grant to send: the credit limit (rseq_no + rq_size) and, if a
  // half is free, that half's offset (else -1). Updates the bookkeeping.
  uint32_t grant(int64_t* half_offset);
  uint32_t half() const { return size_ / 2; }
  uint16_t seq() const { return rseq_no_; }

 private:
  std::vector<uint32_t> msgs_;
  size_t head_ = 0, tail_ = 0;
  uint32_t size_ = 0, offset_ = 0, avail_ = 0, free_offset_ = 0;
  uint16_t rq_size_ = 0, rseq_no_ = 0, rseq_comp_ = 0;
};

// The send buffer's ring position: where the next copy goes, in up to two
// pieces at the wrap (rsocket.c's ssgl[0..1]).
struct Piece {
  uint32_t offset;
  uint32_t length;
};
int send_pieces(uint32_t sbuf_size, uint32_t* pos, uint32_t len, Piece out[2]);

// The next transfer's size (rsend's olen doubling from 2 KiB to 64 KiB,
// bounded by the send buffer and the peer's current receive half).
uint32_t next_xfer(uint32_t* olen, size_t left, uint32_t sbuf_avail, uint32_t target_len);

}  // namespace sv::rsock
