// rsocket_proto.cc: see rsocket_proto.h.
#include "rdmacm/rsocket_proto.h"

#include <endian.h>

#include <algorithm>

namespace sv::rsock {

namespace {
constexpr bool host_is_net() { return __BYTE_ORDER == __BIG_ENDIAN; }

Sge sge_to_be(Sge s) { return Sge{htobe64(s.addr), htobe32(s.key), htobe32(s.length)}; }
Sge sge_from_be(Sge s) { return Sge{be64toh(s.addr), be32toh(s.key), be32toh(s.length)}; }
}  // namespace

// rsocket.c's rs_format_conn_data.
void encode_conn(const ConnInfo& in, ConnData* out) {
  std::memset(out, 0, sizeof(*out));
  out->version = 1;
  out->flags = kConnFlagIomap | (host_is_net() ? kConnFlagNet : 0);
  out->credits = htobe16(in.credits);
  out->target_iomap_size = uint8_t(value_to_scale(in.iomap_size, 8));
  out->target_sgl = sge_to_be(in.target_sgl);
  out->data_buf = sge_to_be(in.data_buf);
}

// rsocket.c's rs_save_conn_data (the part that reads the message).
bool decode_conn(const void* p, size_t len, ConnInfo* out) {
  if (!p || len < sizeof(ConnData)) return false;
  ConnData c;
  std::memcpy(&c, p, sizeof(c));
  if (c.version != 1) return false;
  out->target_sgl = sge_from_be(c.target_sgl);
  out->data_buf = sge_from_be(c.data_buf);
  out->credits = be16toh(c.credits);
  out->iomap = (c.flags & kConnFlagIomap) != 0;
  out->iomap_size = out->iomap ? uint16_t(scale_to_value(c.target_iomap_size, 8)) : 0;
  out->swap = host_is_net() != ((c.flags & kConnFlagNet) != 0);
  return true;
}

Sge wire_sge(Sge s, bool swap) {
  if (!swap) return s;
  return Sge{__builtin_bswap64(s.addr), __builtin_bswap32(s.key), __builtin_bswap32(s.length)};
}

Iomap wire_iomap(Iomap m, bool swap) {
  if (!swap) return m;
  return Iomap{__builtin_bswap64(m.offset), wire_sge(m.sge, true)};
}

// rsocket.c's rs_init_bufs: the first half is granted by the connect data.
void RecvRing::reset(uint32_t rbuf_size, uint16_t rq_size) {
  msgs_.assign(size_t(rq_size) + 1, 0);
  head_ = tail_ = 0;
  size_ = rbuf_size;
  offset_ = 0;
  free_offset_ = rbuf_size / 2;
  avail_ = rbuf_size / 2;
  rq_size_ = rq_size;
  rseq_no_ = 0;
  rseq_comp_ = uint16_t(rq_size / 2);
}

bool RecvRing::push(uint32_t len) {
  size_t next = (tail_ + 1) % msgs_.size();
  if (next == head_) return false;
  msgs_[tail_] = len;
  tail_ = next;
  return true;
}

size_t RecvRing::queued_bytes() const {
  size_t n = 0;
  for (size_t i = head_; i != tail_; i = (i + 1) % msgs_.size()) n += msgs_[i];
  return n;
}

// rsocket.c's rrecv / rs_peek loop: messages in order, the ring wraps at
// the end of the buffer; a partly read message keeps its remainder.
size_t RecvRing::take(const uint8_t* rbuf, uint8_t* dst, size_t len, bool peek) {
  size_t head = head_, done = 0;
  uint32_t offset = offset_;
  while (done < len && head != tail_) {
    uint32_t& m = msgs_[head];
    uint32_t n = uint32_t(std::min<size_t>(m, len - done));
    uint32_t first = std::min(n, size_ - offset);
    std::memcpy(dst + done, rbuf + offset, first);
    if (n > first) std::memcpy(dst + done + first, rbuf, n - first);
    offset = (offset + n) % size_;
    done += n;
    if (peek) {
      if (n < m) break;
      head = (head + 1) % msgs_.size();
      continue;
    }
    avail_ += n;
    if (n < m) {
      m -= n;
    } else {
      rseq_no_++;
      head = (head + 1) % msgs_.size();
    }
  }
  if (!peek) {
    head_ = head;
    offset_ = offset;
  }
  return done;
}

bool RecvRing::want_credit() const {
  return avail_ >= size_ / 2 || int16_t(uint16_t(rseq_no_ - rseq_comp_)) >= 0;
}

// rsocket.c's rs_send_credits.
uint32_t RecvRing::grant(int64_t* half_offset) {
  rseq_comp_ = uint16_t(rseq_no_ + rq_size_ / 2);
  *half_offset = -1;
  if (avail_ >= size_ / 2) {
    *half_offset = free_offset_;
    avail_ -= size_ / 2;
    free_offset_ += size_ / 2;
    if (free_offset_ >= size_) free_offset_ = 0;
  }
  return uint32_t(uint16_t(rseq_no_ + rq_size_));
}

int send_pieces(uint32_t sbuf_size, uint32_t* pos, uint32_t len, Piece out[2]) {
  uint32_t left = sbuf_size - *pos;
  if (len < left) {
    out[0] = {*pos, len};
    *pos += len;
    return 1;
  }
  out[0] = {*pos, left};
  if (len == left) {
    *pos = 0;
    return 1;
  }
  out[1] = {0, len - left};
  *pos = len - left;
  return 2;
}

uint32_t next_xfer(uint32_t* olen, size_t left, uint32_t sbuf_avail, uint32_t target_len) {
  uint32_t x;
  if (*olen < left) {
    x = *olen;
    if (*olen < kMaxTransfer) *olen <<= 1;
  } else {
    x = uint32_t(left);
  }
  return std::min({x, sbuf_avail, target_len});
}

}  // namespace sv::rsock
