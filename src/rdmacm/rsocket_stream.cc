// rsocket_stream.cc: a SOCK_STREAM rsocket's endpoint (QP, CQ, buffers),
// its completions, credits and data path. The protocol is rdma-core's
// (librdmacm/rsocket.c; rsocket_proto.h says what goes on the wire); the
// functions below name the rsocket.c functions they mirror.
#include <endian.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <ctime>

#include "rdmacm/rsocket_internal.h"

namespace sv::rsock {

namespace {

uint8_t* alloc_buf(size_t len) {
  void* p = nullptr;
  size_t n = (len + 4095) & ~size_t(4095);
  if (posix_memalign(&p, 4096, n ? n : 4096)) return nullptr;
  std::memset(p, 0, n ? n : 4096);
  return static_cast<uint8_t*>(p);
}

void set_nonblock(int fd) { ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK); }

// rsocket.c's rs_set_qp_size.
void clamp_qp_size(Rs* rs) {
  ibv_device_attr a{};
  int max = kQpMaxSize;
  if (!ibv_query_device(rs->id->verbs, &a)) max = std::min(max, a.max_qp_wr);
  auto clamp = [&](uint16_t v) { return uint16_t(std::clamp<int>(v, kQpMinSize, max)); };
  rs->sq_size = clamp(rs->sq_size);
  rs->rq_size = clamp(rs->rq_size);
}

int post_recv(Rs* rs) {
  ibv_recv_wr wr{}, *bad = nullptr;
  wr.wr_id = kWrRecv;
  if (int e = ibv_post_recv(rs->id->qp, &wr, &bad)) return seterr(e);
  return 0;
}

// rsocket.c's rs_init_bufs.
int init_bufs(Rs* rs) {
  ibv_pd* pd = rs->id->pd;
  const int rw = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
  size_t slen = rs->sbuf_size + kQpCtrlSize * sizeof(Sge);
  size_t tlen = kSglSize * sizeof(Sge) + size_t(rs->iomap_size) * sizeof(Iomap);
  rs->sbuf = alloc_buf(slen);
  rs->rbuf = alloc_buf(rs->rbuf_size);
  rs->tbuf = alloc_buf(tlen);
  if (!rs->sbuf || !rs->rbuf || !rs->tbuf) return seterr(ENOMEM);
  if (!(rs->smr = ibv_reg_mr(pd, rs->sbuf, slen, IBV_ACCESS_LOCAL_WRITE))) return -1;
  if (!(rs->rmr = ibv_reg_mr(pd, rs->rbuf, rs->rbuf_size, rw))) return -1;
  if (!(rs->tmr = ibv_reg_mr(pd, rs->tbuf, tlen, rw))) return -1;
  rs->ring.reset(rs->rbuf_size, rs->rq_size);
  rs->sbuf_avail = rs->sbuf_size;
  rs->spos = 0;
  rs->sqe_avail = int(rs->sq_size) - int(rs->ctrl_max_seqno);
  return 0;
}

}  // namespace

int seterr(int e) {
  errno = e;
  return -1;
}

namespace {

template <typename T>
void read_conf(const char* name, T* v) {
  std::string path = std::string("/etc/rdma/rsocket/") + name;
  FILE* f = std::fopen(path.c_str(), "r");
  if (!f) return;
  unsigned long long x;
  if (std::fscanf(f, "%llu", &x) == 1) *v = T(x);
  std::fclose(f);
}

}  // namespace

const Config& config() {
  static const Config c = [] {
    Config k;
    read_conf("polling_time", &k.polling_us);
    read_conf("inline_default", &k.inline_size);
    read_conf("sqsize_default", &k.sq_size);
    read_conf("rqsize_default", &k.rq_size);
    read_conf("mem_default", &k.mem);
    read_conf("wmem_default", &k.wmem);
    read_conf("iomap_size", &k.iomap_size);
    k.mem = std::max<uint32_t>(k.mem, 2 * kSndLowat);
    k.wmem = std::max<uint32_t>(k.wmem, 2 * kSndLowat);
    k.iomap_size = uint16_t(scale_to_value(value_to_scale(k.iomap_size, 8), 8));
    return k;
  }();
  return c;
}

Rs* alloc_rs(const Rs* inherit, int domain) {
  Rs* rs = new Rs;
  rs->domain = domain;
  if (!inherit) {
    const Config& c = config();
    rs->sbuf_size = c.wmem;
    rs->rbuf_size = c.mem;
    rs->sq_size = c.sq_size;
    rs->rq_size = c.rq_size;
    rs->sq_inline = c.inline_size;
    rs->iomap_size = c.iomap_size;
  } else {
    rs->sbuf_size = inherit->sbuf_size;
    rs->rbuf_size = inherit->rbuf_size;
    rs->sq_size = inherit->sq_size;
    rs->rq_size = inherit->rq_size;
    rs->sq_inline = inherit->sq_inline;
    rs->iomap_size = inherit->iomap_size;
    rs->fs_flags = inherit->fs_flags;
    rs->fd_flags = inherit->fd_flags;
    rs->so_opts = inherit->so_opts;
    rs->tcp_opts = inherit->tcp_opts;
  }
  return rs;
}

// rsocket.c's rs_create_ep + rs_create_cq: one CQ for both queues, armed.
int create_ep(Rs* rs) {
  clamp_qp_size(rs);
  rdma_cm_id* id = rs->id;
  if (!(rs->cc = ibv_create_comp_channel(id->verbs))) return -1;
  set_nonblock(rs->cc->fd);
  if (!(rs->cq = ibv_create_cq(id->verbs, rs->sq_size + rs->rq_size, rs, rs->cc, 0))) return -1;
  ibv_req_notify_cq(rs->cq, 0);
  rs->cq_armed = true;
  ibv_qp_init_attr a{};
  a.qp_context = rs;
  a.send_cq = a.recv_cq = rs->cq;
  a.qp_type = IBV_QPT_RC;
  a.sq_sig_all = 1;
  a.cap.max_send_wr = rs->sq_size;
  a.cap.max_recv_wr = rs->rq_size;
  a.cap.max_send_sge = 2;
  a.cap.max_recv_sge = 1;
  a.cap.max_inline_data = rs->sq_inline;
  if (rdma_create_qp(id, id->pd, &a)) return -1;
  rs->sq_inline = uint16_t(std::min<uint32_t>(a.cap.max_inline_data, kQpMaxSize));
  if (init_bufs(rs)) return -1;
  for (int i = 0; i < rs->rq_size; i++)
    if (post_recv(rs)) return -1;
  return 0;
}

void free_rs(Rs* rs) {
  ds_free(rs);
  for (rdma_cm_event* e : rs->requests) {
    rdma_reject(e->id, nullptr, 0);
    rdma_ack_cm_event(e);
  }
  for (IoMr& m : rs->iomaps)
    if (m.mr) ibv_dereg_mr(m.mr);
  if (rs->id && rs->id->qp) rdma_destroy_qp(rs->id);
  if (rs->cq) {
    ibv_ack_cq_events(rs->cq, rs->unacked);
    ibv_destroy_cq(rs->cq);
  }
  if (rs->cc) ibv_destroy_comp_channel(rs->cc);
  for (ibv_mr* m : {rs->smr, rs->rmr, rs->tmr})
    if (m) ibv_dereg_mr(m);
  std::free(rs->sbuf);
  std::free(rs->rbuf);
  std::free(rs->tbuf);
  if (rs->id) rdma_destroy_id(rs->id);
  if (rs->ch) rdma_destroy_event_channel(rs->ch);
  if (rs->wakefd >= 0) ::close(rs->wakefd);
  delete rs;
}

ConnInfo my_conn_info(Rs* rs) {
  ConnInfo c;
  c.target_sgl = Sge{uintptr_t(rs->tbuf), rs->tmr->rkey, uint32_t(kSglSize)};
  c.data_buf = Sge{uintptr_t(rs->rbuf), rs->rmr->rkey, rs->rbuf_size / 2};
  c.credits = rs->rq_size;
  c.iomap_size = rs->iomap_size;
  c.iomap = true;
  return c;
}

// rsocket.c's rs_save_conn_data.
void save_conn(Rs* rs, const ConnInfo& peer) {
  rs->remote_sgl = peer.target_sgl;
  rs->remote_sge = 1;
  rs->swap = peer.swap;
  if (peer.iomap) {
    rs->remote_iomap.addr = peer.target_sgl.addr + sizeof(Sge) * peer.target_sgl.length;
    rs->remote_iomap.length = peer.iomap_size;
    rs->remote_iomap.key = peer.target_sgl.key;
  }
  volatile Sge* t = rs->target_sgl();
  t[0].addr = peer.data_buf.addr;
  t[0].key = peer.data_buf.key;
  t[0].length = peer.data_buf.length;
  rs->sseq_comp = peer.credits;
}

int post_write(Rs* rs, const ibv_sge* sg, int n, uint32_t wr_msg, uint64_t addr, uint32_t rkey, bool imm, int flags) {
  ibv_send_wr wr{}, *bad = nullptr;
  wr.wr_id = wr_msg;
  wr.sg_list = const_cast<ibv_sge*>(sg);
  wr.num_sge = n;
  wr.opcode = imm ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE;
  wr.send_flags = flags;
  if (imm) wr.imm_data = htobe32(wr_msg);
  wr.wr.rdma.remote_addr = addr;
  wr.wr.rdma.rkey = rkey;
  if (int e = ibv_post_send(rs->id->qp, &wr, &bad)) return seterr(e);
  return 0;
}

int copy_and_post(Rs* rs, const iovec** iov, size_t* off, uint32_t len, uint32_t msg, uint64_t addr, uint32_t rkey,
                  bool imm) {
  Piece p[2];
  int n = send_pieces(rs->sbuf_size, &rs->spos, len, p);
  ibv_sge sg[2];
  for (int i = 0; i < n; i++) {
    uint8_t* dst = rs->sbuf + p[i].offset;
    uint32_t want = p[i].length;
    while (want) {
      size_t k = std::min<size_t>(want, (*iov)->iov_len - *off);
      std::memcpy(dst, static_cast<const uint8_t*>((*iov)->iov_base) + *off, k);
      dst += k;
      want -= uint32_t(k);
      *off += k;
      if (*off == (*iov)->iov_len) {
        ++*iov;
        *off = 0;
      }
    }
    sg[i] = ibv_sge{uintptr_t(rs->sbuf + p[i].offset), p[i].length, rs->smr->lkey};
  }
  return post_write(rs, sg, n, msg, addr, rkey, imm, len <= rs->sq_inline ? IBV_SEND_INLINE : 0);
}

bool ctrl_avail(Rs* rs) { return rs->ctrl_seqno != rs->ctrl_max_seqno; }

// rsocket.c's rs_post_msg: an immediate without payload. Its zero-length
// write names the peer's target SGL (any valid remote key would do).
int post_ctrl(Rs* rs, uint32_t msg) {
  rs->ctrl_seqno++;
  return post_write(rs, nullptr, 0, msg, rs->remote_sgl.addr, rs->remote_sgl.key, true, 0);
}

namespace {

// rsocket.c's rs_send_credits.
void send_credits(Rs* rs) {
  int64_t half;
  uint32_t credit = rs->ring.grant(&half);
  if (half < 0) {
    post_ctrl(rs, msg_set(kOpSgl, credit));
    return;
  }
  rs->ctrl_seqno++;
  Sge s = wire_sge(Sge{uintptr_t(rs->rbuf + half), rs->rmr->rkey, rs->rbuf_size / 2}, rs->swap);
  ibv_sge sg{uintptr_t(&s), sizeof(s), 0};
  int flags = IBV_SEND_INLINE;
  if (rs->sq_inline < sizeof(s)) {
    uint8_t* ctrl = rs->sbuf + rs->sbuf_size + sizeof(Sge) * (rs->ctrl_seqno & (kQpCtrlSize - 1));
    std::memcpy(ctrl, &s, sizeof(s));
    sg = ibv_sge{uintptr_t(ctrl), sizeof(s), rs->smr->lkey};
    flags = 0;
  }
  uint64_t addr = rs->remote_sgl.addr + uint64_t(rs->remote_sge) * sizeof(Sge);
  post_write(rs, &sg, 1, msg_set(kOpSgl, credit), addr, rs->remote_sgl.key, true, flags);
  if (++rs->remote_sge == int(rs->remote_sgl.length)) rs->remote_sge = 0;
}

// rsocket.c's rs_update_credits / rs_give_credits.
void update_credits(Rs* rs) {
  if (rs->connected() && rs->cq && ctrl_avail(rs) && rs->ring.want_credit()) send_credits(rs);
}

void lose_connection(Rs* rs, St st, int err) {
  rs->state = st;
  rs->readable = rs->writable = false;
  if (err) rs->err = err;
}

void on_recv(Rs* rs, const ibv_wc& wc) {
  if (!(wc.wc_flags & IBV_WC_WITH_IMM)) return;
  uint32_t msg = be32toh(wc.imm_data);
  switch (msg_op(msg)) {
    case kOpSgl:
      rs->sseq_comp = uint16_t(msg_data(msg));
      break;
    case kOpIomapSgl:  // the peer wrote an entry of our iomap table
    case kOpWrite:
      break;
    case kOpCtrl:
      if (msg_data(msg) == kCtrlDisconnect) {
        lose_connection(rs, St::kDisconnected, 0);
      } else if (msg_data(msg) == kCtrlShutdown) {
        if (rs->writable) rs->readable = false;
        else lose_connection(rs, St::kDisconnected, 0);
      }
      break;
    default:
      if (!rs->ring.push(msg_data(msg))) lose_connection(rs, St::kError, EIO);
      break;
  }
}

void on_send(Rs* rs, const ibv_wc& wc) {
  uint32_t msg = uint32_t(wc.wr_id);
  switch (msg_op(msg)) {
    case kOpSgl:
      rs->ctrl_max_seqno++;
      break;
    case kOpCtrl:
      rs->ctrl_max_seqno++;
      if (msg_data(msg) == kCtrlDisconnect) lose_connection(rs, St::kDisconnected, 0);
      break;
    case kOpIomapSgl:
      rs->sqe_avail++;
      rs->sbuf_avail += sizeof(Iomap);
      break;
    default:
      rs->sqe_avail++;
      rs->sbuf_avail += msg_data(msg);
      break;
  }
  if (wc.status != IBV_WC_SUCCESS && rs->connected()) lose_connection(rs, St::kError, EIO);
}

// rsocket.c's rs_poll_cq.
int poll_cq(Rs* rs) {
  ibv_wc wc[16];
  int n, rcnt = 0;
  while ((n = ibv_poll_cq(rs->cq, 16, wc)) > 0) {
    if (rs->waiters) {
      uint64_t one = 1;
      ssize_t w = ::write(rs->wakefd, &one, sizeof(one));
      (void)w;
    }
    for (int i = 0; i < n; i++) {
      if (wc[i].wr_id & kWrRecv) {
        if (wc[i].status != IBV_WC_SUCCESS) continue;
        rcnt++;
        if (rs->connected()) on_recv(rs, wc[i]);
      } else {
        on_send(rs, wc[i]);
      }
    }
  }
  if (!rs->connected()) return 0;
  while (rcnt--) {
    if (post_recv(rs)) {
      lose_connection(rs, St::kError, errno);
      return -1;
    }
  }
  return 0;
}

// CM events of a connecting-done rsocket: the passive side's ESTABLISHED,
// and DISCONNECTED when the peer went without its DISCONNECT message.
void cm_events(Rs* rs) {
  rdma_cm_event* e;
  while (rs->ch && rs->state != St::kListening && !rs->opening() && !rdma_get_cm_event(rs->ch, &e)) {
    rdma_cm_event_type t = e->event;
    rdma_ack_cm_event(e);
    if (t == RDMA_CM_EVENT_DISCONNECTED || t == RDMA_CM_EVENT_DEVICE_REMOVAL) {
      // An orderly close sends its DISCONNECT message before the CM's DREQ:
      // without one, the peer died (or the device went): a reset.
      if (rs->cq) poll_cq(rs);
      if (rs->connected()) lose_connection(rs, St::kError, ECONNRESET);
    }
  }
}

}  // namespace

int progress(Rs* rs, bool slow) {
  if (rs->cq && rs->cq_armed) {  // an event only follows an arm
    ibv_cq* cq;
    void* ctx;
    while (!ibv_get_cq_event(rs->cc, &cq, &ctx)) {
      rs->cq_armed = false;
      if (++rs->unacked >= 64) {
        ibv_ack_cq_events(rs->cq, rs->unacked);
        rs->unacked = 0;
      }
    }
  }
  if (slow) cm_events(rs);
  if (!rs->cq) return 0;
  update_credits(rs);
  int r = poll_cq(rs);
  update_credits(rs);
  return r;
}

int64_t now_us() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return int64_t(t.tv_sec) * 1000000 + t.tv_nsec / 1000;
}

// rsocket.c's rs_get_comp: completions are polled for config().polling_us before the
// CQ is armed and the thread sleeps.
int wait_for(Rs* rs, std::unique_lock<std::mutex>& lk, bool nonblock, bool (*test)(Rs*)) {
  int64_t spin_end = nonblock ? 0 : now_us() + config().polling_us;
  for (;;) {
    int r = progress(rs, false);
    if (test(rs)) return 0;
    if (r) return -1;
    if (!nonblock && now_us() < spin_end) continue;
    r = progress(rs, true);
    if (test(rs)) return 0;
    if (r) return -1;
    if (nonblock) return seterr(EWOULDBLOCK);
    if (rs->cq && !rs->cq_armed) {
      ibv_req_notify_cq(rs->cq, 0);
      rs->cq_armed = true;
      continue;  // what completed before the arm is in the CQ already
    }
    if (rs->wakefd < 0) rs->wakefd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    pollfd p[3] = {{rs->ch->fd, POLLIN, 0}, {rs->cq ? rs->cc->fd : -1, POLLIN, 0}, {rs->wakefd, POLLIN, 0}};
    rs->waiters++;
    lk.unlock();
    ::poll(p, 3, 1000);
    lk.lock();
    rs->waiters--;
    uint64_t v;
    if (p[2].revents && ::read(rs->wakefd, &v, sizeof(v)) < 0) v = 0;
  }
}

// rsocket.c's rs_can_send (RDMA WRITE WITH IMMEDIATE; no RS_OPT_MSG_SEND).
bool can_send(Rs* rs) {
  return rs->connected() && rs->sqe_avail > 0 && rs->sbuf_avail >= kSndLowat && rs->sseq_no != rs->sseq_comp &&
         rs->target_sgl()[rs->target_sge].length != 0;
}
bool conn_can_send(Rs* rs) { return can_send(rs) || !rs->writable; }
bool conn_have_rdata(Rs* rs) { return !rs->ring.empty() || !rs->readable; }
// rsocket.c's rs_conn_all_sends_done.
bool all_sends_done(Rs* rs) {
  return int(rs->ctrl_max_seqno - rs->ctrl_seqno) + rs->sqe_avail == int(rs->sq_size) || !rs->connected();
}

namespace {

// rsocket.c's rs_write_data: the target entry is advanced before the post.
int write_data(Rs* rs, const iovec** iov, size_t* off, uint32_t len) {
  rs->sseq_no++;
  rs->sqe_avail--;
  rs->sbuf_avail -= len;
  volatile Sge* t = rs->target_sgl() + rs->target_sge;
  uint64_t addr = t->addr;
  uint32_t key = t->key;
  t->addr = addr + len;
  t->length = t->length - len;
  if (t->length == 0 && ++rs->target_sge == kSglSize) rs->target_sge = 0;
  return copy_and_post(rs, iov, off, len, msg_set(kOpData, len), addr, key, true);
}

}  // namespace

// rsocket.c's rsendv.
ssize_t stream_send(Rs* rs, std::unique_lock<std::mutex>& lk, const iovec* iov, int iovcnt, int flags) {
  size_t total = 0;
  for (int i = 0; i < iovcnt; i++) total += iov[i].iov_len;
  if (!rs->connected()) {
    if (rs->state == St::kDisconnected || rs->state == St::kError) return seterr(ECONNRESET);
    return seterr(ENOTCONN);
  }
  if (rs->iomap_pending && send_iomaps(rs, lk, flags)) return -1;
  size_t left = total, off = 0;
  int saved = errno;
  uint32_t olen = kOlapStart;
  const iovec* cur = iov;
  while (cur < iov + iovcnt && cur->iov_len == 0) cur++;
  int r = 0;
  while (left) {
    if (!can_send(rs)) {
      r = wait_for(rs, lk, rs->nonblock(flags), conn_can_send);
      if (r) break;
      if (!rs->writable) {
        r = seterr(ECONNRESET);
        break;
      }
    }
    uint32_t x = next_xfer(&olen, left, rs->sbuf_avail, rs->target_sgl()[rs->target_sge].length);
    if ((r = write_data(rs, &cur, &off, x))) break;
    left -= x;
  }
  if (r && left == total) return -1;
  errno = saved;
  return ssize_t(total - left);
}

// rsocket.c's rrecv: queued data is delivered even after the peer left.
ssize_t stream_recv(Rs* rs, std::unique_lock<std::mutex>& lk, void* buf, size_t len, int flags) {
  if (rs->state == St::kInit || rs->state == St::kBound || rs->state == St::kListening) return seterr(ENOTCONN);
  size_t got = 0;
  int r = 0, saved = errno;  // our EAGAINs inside must not show after a success
  auto* dst = static_cast<uint8_t*>(buf);
  do {
    if (rs->ring.empty()) {
      r = wait_for(rs, lk, rs->nonblock(flags), conn_have_rdata);
      if (r) break;
    }
    if (flags & MSG_PEEK) {
      got = rs->ring.take(rs->rbuf, dst, len, true);
      break;
    }
    got += rs->ring.take(rs->rbuf, dst + got, len - got, false);
  } while (got < len && (flags & MSG_WAITALL) && rs->readable);
  update_credits(rs);
  // A connection lost without the peer's DISCONNECT (it died; our writes
  // failed) is reset, as TCP's after an RST: not an end of file.
  if (!r && got == 0 && len && rs->state == St::kError) return seterr(ECONNRESET);
  if (r && got == 0) return -1;
  errno = saved;
  return ssize_t(got);
}

// rsocket.c's rs_send_iomaps: each new PROT_WRITE mapping is written into
// the peer's iomap table (IOMAP_SGL, the index in the immediate).
int send_iomaps(Rs* rs, std::unique_lock<std::mutex>& lk, int flags) {
  for (IoMr& m : rs->iomaps) {
    if (m.index < 0 || m.sent || !m.mr) continue;
    if (!can_send(rs)) {
      if (wait_for(rs, lk, rs->nonblock(flags), conn_can_send)) return -1;
      if (!rs->writable) return seterr(ECONNRESET);
    }
    Iomap im = wire_iomap(Iomap{m.offset, Sge{uintptr_t(m.mr->addr), m.mr->rkey, uint32_t(m.mr->length)}}, rs->swap);
    iovec v{&im, sizeof(im)};
    const iovec* cur = &v;
    size_t off = 0;
    rs->sseq_no++;
    rs->sqe_avail--;
    rs->sbuf_avail -= sizeof(Iomap);
    uint64_t addr = rs->remote_iomap.addr + uint64_t(m.index) * sizeof(Iomap);
    m.sent = true;
    if (copy_and_post(rs, &cur, &off, sizeof(im), msg_set(kOpIomapSgl, uint32_t(m.index)), addr, rs->remote_iomap.key,
                      true))
      return -1;
  }
  rs->iomap_pending = false;
  return 0;
}

}  // namespace sv::rsock
