// hostile_fuzz: a hostile client against a private system daemon, seeded and
// bounded in time, while a victim of another uid runs a checked workload and
// a third party measures that the daemon still answers.
//
//   hostile   (nobody, 65534): speaks the control protocol with random valid
//             and invalid requests (every op of proto::kOps, sizes right and
//             wrong, fields drawn from the handles, QPNs and keys it has seen
//             and the victim's), attaches descriptors of every kind it can
//             make, leaves replies unread, points raw QPs at the victim's
//             QPNs and asks the daemon to carry out RDMA through them, writes
//             random bytes into every segment it can map (its request ring
//             included) and moves the ring's tail at random.
//   victim    (root, with a partner of uid 65533 for the mediated path):
//             RDMA WRITE, READ, SEND/RECV and atomics between its own QPs
//             (shared memory) and to the partner (the daemon mediates); every
//             byte and every completion checked against its own model.
//   prober    (uid 65532): a fresh connection, Hello, AllocPd, DeallocPd in
//             a loop; each round must answer within kProbeLimitMs.
//
// The test fails, naming its seed, if any victim check fails, the prober
// finds the daemon silent, or the daemon is dead or does not stop on
// SIGTERM. SOFTVERBS_HOSTILE_SEED=N replays a seed (the victim's and the
// hostile client's choices; the daemon's scheduling is not replayed);
// SOFTVERBS_HOSTILE_SECONDS sets the duration (default 20).
#include <gtest/gtest.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <grp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "attack.h"

namespace svsec {
namespace {

using sv::proto::Op;
constexpr int kProbeLimitMs = 10'000;
constexpr size_t kBuf = 1 << 16;

struct Rng {
  uint64_t s;
  uint64_t next() {  // splitmix64
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  uint64_t below(uint64_t n) { return n ? next() % n : 0; }
  bool chance(unsigned pct) { return below(100) < pct; }
};

uint64_t now_ms() {
  using namespace std::chrono;
  return uint64_t(duration_cast<milliseconds>(steady_clock::now().time_since_epoch()).count());
}

uint64_t env_u64(const char* name, uint64_t dflt) {
  const char* e = std::getenv(name);
  if (!e || !*e) return dflt;
  char* end = nullptr;
  unsigned long long v = std::strtoull(e, &end, 0);
  return end && *end == 0 ? uint64_t(v) : dflt;
}

bool become(uid_t uid) { return setgroups(0, nullptr) == 0 && setresgid(uid, uid, uid) == 0 && setresuid(uid, uid, uid) == 0; }

// What the victim publishes to the hostile client: everything guessable.
struct VictimInfo {
  uint32_t qpn[3];
  uint32_t rkey[3];
  uint64_t addr[3];
  uint32_t pd_handle_hint;
  uint32_t pad;
};

// ---------------------------------------------------------------- victim --

struct Checked {
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  ibv_cq* cq = nullptr;
  ibv_qp* qp[3] = {};
  ibv_mr* mr[2] = {};
  uint8_t* buf[2] = {};
  uint64_t wr = 0;
  std::string why;

  bool fail(const std::string& w) {
    if (why.empty()) why = w;
    return false;
  }
  // Waits for `n` completions in order of wr_id from `first`, all successful.
  bool reap(uint64_t first, int n) {
    std::vector<ibv_wc> got;
    const uint64_t until = now_ms() + 15'000;
    while (int(got.size()) < n && now_ms() < until) {
      ibv_wc wc[8];
      int k = ibv_poll_cq(cq, 8, wc);
      if (k < 0) return fail("ibv_poll_cq failed");
      for (int i = 0; i < k; ++i) got.push_back(wc[i]);
      if (k == 0) usleep(50);
    }
    if (int(got.size()) < n) return fail("completion missing after 15 s (wr_id " + std::to_string(first) + ")");
    std::vector<bool> seen(size_t(n), false);
    for (const ibv_wc& wc : got) {
      if (wc.status != IBV_WC_SUCCESS)
        return fail(std::string("completion in error: ") + ibv_wc_status_str(wc.status) + " wr_id " +
                    std::to_string(wc.wr_id));
      if (wc.wr_id < first || wc.wr_id >= first + uint64_t(n) || seen[wc.wr_id - first])
        return fail("unexpected or duplicate wr_id " + std::to_string(wc.wr_id));
      seen[wc.wr_id - first] = true;
    }
    return true;
  }
  bool post(ibv_qp* q, ibv_wr_opcode op, uint8_t* local, uint32_t lkey, uint32_t len, uint64_t raddr, uint32_t rkey,
            uint64_t add = 0, uint64_t swap = 0) {
    ibv_sge sge{reinterpret_cast<uintptr_t>(local), len, lkey};
    ibv_send_wr w{}, *bad = nullptr;
    w.wr_id = wr++;
    w.sg_list = &sge;
    w.num_sge = 1;
    w.opcode = op;
    w.send_flags = IBV_SEND_SIGNALED;
    if (op == IBV_WR_ATOMIC_FETCH_AND_ADD || op == IBV_WR_ATOMIC_CMP_AND_SWP) {
      w.wr.atomic.remote_addr = raddr;
      w.wr.atomic.rkey = rkey;
      w.wr.atomic.compare_add = add;
      w.wr.atomic.swap = swap;
    } else {
      w.wr.rdma.remote_addr = raddr;
      w.wr.rdma.rkey = rkey;
    }
    if (int e = ibv_post_send(q, &w, &bad)) return fail("ibv_post_send: " + std::string(strerror(e)));
    return reap(w.wr_id, 1);
  }
};

// The partner (uid 65533): a QP and an MR the victim reaches through the
// daemon, connected to the victim's third QP. Serves until its socket closes.
int partner_body(int sock) {
  if (!become(65533)) return 90;
  ibv_context* c = open_dev();
  if (!c) return 91;
  ibv_pd* pd = ibv_alloc_pd(c);
  ibv_cq* cq = pd ? ibv_create_cq(c, 16, nullptr, nullptr, 0) : nullptr;
  void* mem = mmap(nullptr, kBuf, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  const int acc = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
  ibv_mr* mr = cq && mem != MAP_FAILED ? ibv_reg_mr(pd, mem, kBuf, acc) : nullptr;
  ibv_qp_init_attr ia{};
  ia.send_cq = ia.recv_cq = cq;
  ia.qp_type = IBV_QPT_RC;
  ia.cap = {16, 16, 1, 1, 0};
  ibv_qp* qp = mr ? ibv_create_qp(pd, &ia) : nullptr;
  if (!qp || qp_to_init(qp, acc) != 0) return 92;
  uint64_t mine[3] = {qp->qp_num, mr->rkey, reinterpret_cast<uintptr_t>(mem)};
  uint32_t dest = 0;
  if (!send_val(sock, mine) || !recv_val(sock, dest) || qp_to_rts(c, qp, dest) != 0) return 93;
  int ready = 1;
  if (!send_val(sock, ready)) return 94;
  char x;
  while (read(sock, &x, 1) > 0) {
  }
  return 0;
}

bool victim_setup(Checked& v, int partner_sock, VictimInfo& info, uint64_t partner[3]) {
  v.ctx = open_dev();
  if (!v.ctx) return v.fail("open_dev");
  v.pd = ibv_alloc_pd(v.ctx);
  v.cq = v.pd ? ibv_create_cq(v.ctx, 256, nullptr, nullptr, 0) : nullptr;
  if (!v.cq) return v.fail("pd/cq");
  const int acc = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
  for (int i = 0; i < 2; ++i) {
    void* m = mmap(nullptr, kBuf, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return v.fail("mmap");
    v.buf[i] = static_cast<uint8_t*>(m);
    v.mr[i] = ibv_reg_mr(v.pd, m, kBuf, acc);
    if (!v.mr[i]) return v.fail("ibv_reg_mr");
  }
  for (int i = 0; i < 3; ++i) {
    ibv_qp_init_attr ia{};
    ia.send_cq = ia.recv_cq = v.cq;
    ia.qp_type = IBV_QPT_RC;
    ia.cap = {32, 32, 1, 1, 0};
    v.qp[i] = ibv_create_qp(v.pd, &ia);
    if (!v.qp[i] || qp_to_init(v.qp[i], acc) != 0) return v.fail("create/init qp");
  }
  if (qp_to_rts(v.ctx, v.qp[0], v.qp[1]->qp_num) || qp_to_rts(v.ctx, v.qp[1], v.qp[0]->qp_num))
    return v.fail("connect own pair");
  if (!recv_val(partner_sock, *reinterpret_cast<uint64_t(*)[3]>(partner)) ||
      !send_val(partner_sock, v.qp[2]->qp_num) || qp_to_rts(v.ctx, v.qp[2], uint32_t(partner[0])) != 0)
    return v.fail("connect to partner");
  int ready = 0;
  if (!recv_val(partner_sock, ready)) return v.fail("partner not ready");
  for (int i = 0; i < 3; ++i) info.qpn[i] = v.qp[i]->qp_num;
  info.rkey[0] = v.mr[0]->rkey;
  info.rkey[1] = v.mr[1]->rkey;
  info.rkey[2] = uint32_t(partner[1]);
  info.addr[0] = reinterpret_cast<uintptr_t>(v.buf[0]);
  info.addr[1] = reinterpret_cast<uintptr_t>(v.buf[1]);
  info.addr[2] = partner[2];
  info.pd_handle_hint = v.pd->handle;
  return true;
}

// One checked operation, chosen by `r`. Buffer 0 is the source and
// scratch, buffer 1 the target of the victim's own pair; the partner's MR is
// reached through QP 2 and read back to check.
bool victim_step(Checked& v, Rng& r, const uint64_t partner[3], uint64_t& partner_word) {
  uint8_t* a = v.buf[0];
  uint8_t* b = v.buf[1];
  const uint32_t len = uint32_t(1 + r.below(r.chance(80) ? 256 : 8192));
  const uint32_t off = uint32_t(r.below(kBuf / 2 - len));
  const uint32_t off2 = uint32_t(kBuf / 2 + r.below(kBuf / 2 - len));
  for (uint32_t i = 0; i < len; ++i) a[off + i] = uint8_t(r.next());
  switch (r.below(6)) {
    case 0:  // WRITE, own pair
      if (!v.post(v.qp[0], IBV_WR_RDMA_WRITE, a + off, v.mr[0]->lkey, len, uint64_t(uintptr_t(b + off)), v.mr[1]->rkey))
        return false;
      return std::memcmp(a + off, b + off, len) == 0 || v.fail("WRITE: bytes differ");
    case 1:  // READ, own pair
      std::memset(b + off, 0x5a, len);
      if (!v.post(v.qp[0], IBV_WR_RDMA_READ, a + off, v.mr[0]->lkey, len, uint64_t(uintptr_t(b + off)), v.mr[1]->rkey))
        return false;
      return std::all_of(a + off, a + off + len, [](uint8_t x) { return x == 0x5a; }) || v.fail("READ: bytes differ");
    case 2: {  // SEND/RECV, own pair
      ibv_sge rs{uintptr_t(b + off2), len, v.mr[1]->lkey};
      ibv_recv_wr rw{}, *bad = nullptr;
      rw.wr_id = v.wr++;
      rw.sg_list = &rs;
      rw.num_sge = 1;
      if (ibv_post_recv(v.qp[1], &rw, &bad) != 0) return v.fail("ibv_post_recv");
      const uint64_t first = rw.wr_id;
      ibv_sge ss{uintptr_t(a + off), len, v.mr[0]->lkey};
      ibv_send_wr sw{}, *sbad = nullptr;
      sw.wr_id = v.wr++;
      sw.sg_list = &ss;
      sw.num_sge = 1;
      sw.opcode = IBV_WR_SEND;
      sw.send_flags = IBV_SEND_SIGNALED;
      if (ibv_post_send(v.qp[0], &sw, &sbad) != 0) return v.fail("ibv_post_send SEND");
      if (!v.reap(first, 2)) return false;
      return std::memcmp(a + off, b + off2, len) == 0 || v.fail("SEND: bytes differ");
    }
    case 3: {  // FETCH_AND_ADD, own pair
      const uint32_t w = uint32_t(r.below(kBuf / 8)) * 8;
      uint64_t before;
      std::memcpy(&before, b + w, 8);
      const uint64_t add = r.next();
      if (!v.post(v.qp[0], IBV_WR_ATOMIC_FETCH_AND_ADD, a, v.mr[0]->lkey, 8, uint64_t(uintptr_t(b + w)), v.mr[1]->rkey,
                  add))
        return false;
      uint64_t old, after;
      std::memcpy(&old, a, 8);
      std::memcpy(&after, b + w, 8);
      return (old == before && after == before + add) || v.fail("FETCH_AND_ADD: wrong values");
    }
    case 4: {  // WRITE to the partner (mediated), then READ it back
      if (!v.post(v.qp[2], IBV_WR_RDMA_WRITE, a + off, v.mr[0]->lkey, len, partner[2] + 8 + off, uint32_t(partner[1])))
        return false;
      if (!v.post(v.qp[2], IBV_WR_RDMA_READ, b + off2, v.mr[1]->lkey, len, partner[2] + 8 + off, uint32_t(partner[1])))
        return false;
      return std::memcmp(a + off, b + off2, len) == 0 || v.fail("mediated WRITE/READ: bytes differ");
    }
    default: {  // CMP_AND_SWP on the partner's first word (mediated), against the model
      const uint64_t swap = r.next();
      if (!v.post(v.qp[2], IBV_WR_ATOMIC_CMP_AND_SWP, a, v.mr[0]->lkey, 8, partner[2], uint32_t(partner[1]),
                  partner_word, swap))
        return false;
      uint64_t old;
      std::memcpy(&old, a, 8);
      if (old != partner_word) return v.fail("mediated CMP_AND_SWP: old value " + std::to_string(old));
      partner_word = swap;
      return true;
    }
  }
}

int victim_body(int sock, uint64_t seed, uint64_t until) {
  int sp[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sp) != 0) return 80;
  pid_t partner = fork();
  if (partner == 0) {
    close(sp[0]);
    _exit(partner_body(sp[1]));
  }
  close(sp[1]);
  Checked v;
  VictimInfo info{};
  uint64_t partner_info[3] = {};
  uint64_t ops = 0;
  Rng r{seed ^ 0x76696374696dull};
  if (victim_setup(v, sp[0], info, partner_info)) {
    send_val(sock, info);
    uint64_t partner_word = 0;
    while (now_ms() < until && victim_step(v, r, partner_info, partner_word)) ++ops;
  }
  close(sp[0]);
  wait_for(partner);
  char msg[512];
  std::snprintf(msg, sizeof msg, "%llu ops; %s", static_cast<unsigned long long>(ops),
                v.why.empty() ? "all checked" : v.why.c_str());
  send_bytes(sock, msg, std::strlen(msg) + 1);
  return v.why.empty() ? 0 : 1;
}

// ----------------------------------------------------------------- hostile --

sigjmp_buf g_fault_jmp;
void on_fault(int) { siglongjmp(g_fault_jmp, 1); }

// The descriptors a hostile client can make, of every kind the daemon might
// meet: memfds (sealed, unsealed, write-sealed, tiny), an eventfd at its
// maximum, both ends of a pipe (one full), sockets, a directory, /dev/null.
sv::Fd make_fd(Rng& r) {
  switch (r.below(9)) {
    case 0: return sv::Fd(sealed_backing(size_t(4096) << r.below(6)));
    case 1: {
      int fd = memfd_create("hostile", MFD_CLOEXEC | MFD_ALLOW_SEALING);
      if (fd >= 0 && ftruncate(fd, off_t(r.below(1 << 20))) != 0) {
      }
      if (fd >= 0 && r.chance(50)) fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_WRITE | F_SEAL_SEAL);
      return sv::Fd(fd);
    }
    case 2: {
      int fd = eventfd(0, EFD_CLOEXEC);
      uint64_t v = 0xfffffffffffffffeull;
      if (fd >= 0 && write(fd, &v, 8) != 8) {
      }
      return sv::Fd(fd);
    }
    case 3: {
      int p[2];
      if (pipe2(p, O_CLOEXEC) != 0) return sv::Fd();
      fcntl(p[1], F_SETFL, O_NONBLOCK);
      char junk[4096] = {};
      while (write(p[1], junk, sizeof junk) > 0) {
      }
      fcntl(p[1], F_SETFL, 0);
      int keep = r.chance(50) ? p[0] : p[1];
      close(keep == p[0] ? p[1] : p[0]);
      return sv::Fd(keep);
    }
    case 4: {
      int s[2];
      if (socketpair(AF_UNIX, int(r.chance(50) ? SOCK_SEQPACKET : SOCK_STREAM) | SOCK_CLOEXEC, 0, s) != 0)
        return sv::Fd();
      close(s[1]);
      return sv::Fd(s[0]);
    }
    case 5: return sv::Fd(open("/tmp", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    case 6: return sv::Fd(open("/dev/null", O_RDWR | O_CLOEXEC));
    case 7: return sv::Fd(socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    default: return sv::Fd(eventfd(0, EFD_CLOEXEC));
  }
}

struct Hostile {
  Rng r;
  const VictimInfo& v;
  std::string sock_path;
  std::vector<RawConn*> conns;
  std::vector<uint32_t> seen;  // handles, QPNs and keys read from replies
  std::vector<sv::Fd> got;     // descriptors the daemon gave
  uint64_t sent = 0, hangups = 0, scribbles = 0;

  Hostile(uint64_t seed, const VictimInfo& info, std::string path) : r{seed}, v(info), sock_path(std::move(path)) {}
  ~Hostile() {
    for (RawConn* c : conns) delete c;
  }

  RawConn& conn() {
    if (conns.size() < 4 || r.chance(2)) {
      if (conns.size() >= 4) {
        size_t i = r.below(conns.size());
        delete conns[i];
        conns.erase(conns.begin() + long(i));
      }
      auto* c = new RawConn(sock_path);
      timeval tv{0, 200'000};
      setsockopt(c->fd(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
      conns.push_back(c);
    }
    return *conns[r.below(conns.size())];
  }

  uint32_t value() {
    switch (r.below(10)) {
      case 0: return v.qpn[r.below(3)] + uint32_t(r.below(5)) - 2;
      case 1: return v.rkey[r.below(3)];
      case 2: return v.pd_handle_hint + uint32_t(r.below(9)) - 4;
      case 3: return seen.empty() ? 0 : seen[r.below(seen.size())];
      case 4: return uint32_t(r.below(64));
      case 5: return 0xffffffffu - uint32_t(r.below(4));
      case 6: return uint32_t(1u << r.below(32));
      default: return uint32_t(r.next());
    }
  }

  // A request for a random op: the right size most of the time, its words
  // drawn from value(), its addresses and lengths from the victim's.
  void random_request(RawConn& c) {
    alignas(8) uint8_t msg[sv::proto::kMaxMessage + 64] = {};
    const uint16_t op = uint16_t(r.chance(95) ? 1 + r.below(uint64_t(Op::kCount) - 1) : r.below(0x10000));
    const sv::proto::OpInfo* info = sv::proto::op_info(op);
    size_t len = info ? info->req_size : sizeof(sv::proto::Header) + r.below(64);
    if (r.chance(10)) len = sizeof(sv::proto::Header) + r.below(sizeof msg - sizeof(sv::proto::Header));
    for (size_t i = 0; i + 4 <= len; i += 4) {
      uint32_t w = r.chance(30) ? uint32_t(r.next()) : r.chance(40) ? value() : 0;
      std::memcpy(msg + i, &w, 4);
    }
    if (r.chance(10) && len >= 24) {
      uint64_t a = v.addr[r.below(3)] + r.below(kBuf);
      std::memcpy(msg + 8 + 8 * r.below((len - 16) / 8), &a, 8);
    }
    auto* h = reinterpret_cast<sv::proto::Header*>(msg);
    if (r.chance(95)) {
      h->magic = sv::proto::kMagic;
      h->op = op;
      h->seq = uint32_t(++sent);
      h->status = 0;
    }
    std::vector<sv::Fd> fds;
    for (uint64_t n = r.chance(70) ? 0 : 1 + r.below(3); n; --n) fds.push_back(make_fd(r));
    std::vector<int> raw;
    for (auto& f : fds)
      if (f.valid()) raw.push_back(f.get());
    if (r.chance(20)) {  // no reply read: let the daemon queue them
      if (sv::send_message(c.fd(), msg, len, raw) != 0) ++hangups;
      return;
    }
    uint8_t rep[sv::proto::kMaxMessage] = {};
    std::vector<sv::Fd> back;
    if (c.send_raw(msg, len, raw, &back, rep, sizeof rep) < 0) ++hangups;
    for (size_t i = 8; i + 4 <= 64; i += 4) {
      uint32_t w;
      std::memcpy(&w, rep + i, 4);
      if (w && seen.size() < 4096) seen.push_back(w);
    }
    for (auto& f : back)
      if (got.size() < 64) got.push_back(std::move(f));
  }

  // Random bytes into a segment the daemon gave (where it can be mapped
  // for writing), at random places.
  void scribble() {
    if (got.empty()) return;
    sv::Fd& f = got[r.below(got.size())];
    struct stat st;
    if (fstat(f.get(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_size <= 0) return;
    const size_t size = std::min<size_t>(size_t(st.st_size), 64u << 20);
    void* m = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, f.get(), 0);
    if (m == MAP_FAILED) return;
    auto* p = static_cast<uint8_t*>(m);
    if (sigsetjmp(g_fault_jmp, 1) == 0) {
      for (uint64_t n = 1 + r.below(64); n; --n) {
        const size_t at = r.below(r.chance(70) ? std::min<size_t>(size, 4096) : size);
        const size_t k = std::min<size_t>(1 + r.below(16), size - at);
        for (size_t i = 0; i < k; ++i) p[at + i] = r.chance(50) ? uint8_t(r.next()) : uint8_t(value());
      }
      ++scribbles;
    }
    munmap(m, size);
  }

  // A request ring of its own, filled with random slots and impossible tails.
  void ring() {
    RawConn& c = conn();
    sv::proto::Empty req{};
    sv::proto::PostRingReply rep{};
    std::vector<sv::Fd> fds;
    if (c.call(Op::PostRing, req, rep, {}, &fds) != 0 || fds.size() != 2) return;
    const size_t size = size_t(std::min<uint64_t>(rep.size, 64u << 20));
    void* m = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0].get(), 0);
    if (m == MAP_FAILED) return;
    auto* hdr = static_cast<sv::proto::PostRingHeader*>(m);
    auto* slots = static_cast<uint8_t*>(m) + sv::proto::kPostRingHeaderSize;
    if (sigsetjmp(g_fault_jmp, 1) == 0) {
      const uint64_t slot_bytes = uint64_t(rep.capacity) * rep.slot_size;
      for (uint64_t n = r.below(4 * rep.capacity); n; --n) {
        uint64_t at = r.below(slot_bytes / 4) * 4;
        uint32_t w = value();
        std::memcpy(slots + at, &w, 4);
      }
      const uint64_t head = hdr->head.load();
      hdr->tail.store(r.chance(70) ? head + r.below(rep.capacity + 1) : r.next());
      uint64_t one = 1;
      if (write(fds[1].get(), &one, 8) != 8) {
      }
    }
    munmap(m, size);
    if (got.size() < 64) got.push_back(std::move(fds[0]));
  }

  // A raw QP pointed at one of the victim's, then RDMA asked of the daemon
  // through it with the victim's keys and addresses.
  void aim_at_victim() {
    RawConn& c = conn();
    sv::proto::MediateReq req{};
    if (!raw_mediated_pair(c, 4096, req)) return;
    sv::proto::ModifyQpReq m{};
    m.qpn = req.qpn;
    m.attr_mask = IBV_QP_DEST_QPN;
    m.dest_qp_num = v.qpn[r.below(3)];
    c.call(Op::ModifyQp, m);
    for (int i = 0; i < 4; ++i) {
      const int k = int(r.below(3));
      req.opcode = uint32_t(r.below(12));
      req.rkey = r.chance(80) ? v.rkey[k] : value();
      req.remote_addr = v.addr[k] + r.below(kBuf);
      sv::proto::MediateReply rep{};
      c.call(r.chance(50) ? Op::Mediate : Op::MediatePost, req, rep);
    }
  }

  // Async events into a descriptor of its choosing (an eventfd at its
  // maximum, a full pipe, a socket nobody reads...): one per CQ it fails.
  void async_flood() {
    RawConn c(sock_path);
    timeval tv{0, 500'000};
    setsockopt(c.fd(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    sv::proto::Empty hello{};
    sv::proto::HelloReply hrep{};
    std::vector<sv::Fd> fds;
    if (c.call(Op::Hello, hello, hrep, {}, &fds) != 0) return;
    sv::Fd target = make_fd(r);
    if (!target.valid()) return;
    int raw[1] = {target.get()};
    sv::proto::Empty e{};
    if (c.call(Op::RegAsync, e, std::span<const int>(raw)) != 0) return;
    for (uint64_t n = 1 + r.below(8); n; --n) {
      sv::proto::CreateCqReq cq{};
      cq.cqe = 4;
      sv::proto::CreateCqReply cqrep{};
      if (c.call(Op::CreateCq, cq, cqrep, {}, &fds) != 0) return;
      sv::proto::HandleReq fail{};
      fail.handle = cqrep.handle;
      c.call(Op::CqError, fail);
    }
  }

  void run(uint64_t until) {
    struct sigaction sa{};
    sa.sa_handler = on_fault;
    sigaction(SIGBUS, &sa, nullptr);
    sigaction(SIGSEGV, &sa, nullptr);
    signal(SIGPIPE, SIG_IGN);
    while (now_ms() < until) {
      switch (r.below(20)) {
        case 0: scribble(); break;
        case 1: ring(); break;
        case 2: aim_at_victim(); break;
        case 3: async_flood(); break;
        default: random_request(conn()); break;
      }
    }
  }
};

int hostile_body(int sock, uint64_t seed, uint64_t until, const std::string& path) {
  VictimInfo info{};
  if (!recv_val(sock, info)) return 70;
  Hostile h(seed, info, path);
  h.run(until);
  char msg[256];
  std::snprintf(msg, sizeof msg, "%llu requests, %llu hang-ups, %llu segment scribbles",
                static_cast<unsigned long long>(h.sent), static_cast<unsigned long long>(h.hangups),
                static_cast<unsigned long long>(h.scribbles));
  send_bytes(sock, msg, std::strlen(msg) + 1);
  return 0;
}

// ------------------------------------------------------------------ prober --

int prober_body(int sock, uint64_t until, const std::string& path) {
  if (!become(65532)) return 60;
  uint64_t worst = 0, rounds = 0;
  int status = 0;
  while (now_ms() < until) {
    const uint64_t t0 = now_ms();
    RawConn c(path);
    timeval tv{kProbeLimitMs / 1000, 0};
    setsockopt(c.fd(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    sv::proto::Empty hello{};
    sv::proto::HelloReply hrep{};
    std::vector<sv::Fd> fds;
    sv::proto::Empty e{};
    sv::proto::HandleReply pd{};
    sv::proto::HandleReq d{};
    if (!c.ok() || c.call(Op::Hello, hello, hrep, {}, &fds) != 0 || c.call(Op::AllocPd, e, pd) != 0) {
      status = 1;
      break;
    }
    d.handle = pd.handle;
    if (c.call(Op::DeallocPd, d) != 0) {
      status = 1;
      break;
    }
    worst = std::max(worst, now_ms() - t0);
    if (worst > uint64_t(kProbeLimitMs)) status = 1;
    ++rounds;
    usleep(20'000);
  }
  char msg[128];
  std::snprintf(msg, sizeof msg, "%llu rounds, worst %llu ms%s", static_cast<unsigned long long>(rounds),
                static_cast<unsigned long long>(worst), status ? " (daemon silent or refusing)" : "");
  send_bytes(sock, msg, std::strlen(msg) + 1);
  return status;
}

// The report `c` sends at its end, waiting until `deadline` at most; a
// party that stays silent is killed (its report says so).
void read_report(Child& c, char* buf, size_t len, uint64_t deadline) {
  pollfd p{c.sock(), POLLIN, 0};
  const uint64_t now = now_ms();
  if (poll(&p, 1, int(deadline > now ? deadline - now : 0)) == 1 && read(c.sock(), buf, len - 1) > 0) return;
  std::snprintf(buf, len, "no report: stuck, killed");
  kill(c.pid(), SIGKILL);
}

TEST(HostileFuzz, VictimAndProberUnharmed) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run children as other users";
  const uint64_t seed = env_u64("SOFTVERBS_HOSTILE_SEED", uint64_t(now_ms()) ^ uint64_t(getpid()) << 32);
  const uint64_t seconds = env_u64("SOFTVERBS_HOSTILE_SECONDS", 20);
  std::printf("hostile_fuzz: seed %llu, %llu s (replay: SOFTVERBS_HOSTILE_SEED=%llu)\n",
              static_cast<unsigned long long>(seed), static_cast<unsigned long long>(seconds),
              static_cast<unsigned long long>(seed));
  SystemDaemon sysd;
  ASSERT_TRUE(sysd.alive());
  const uint64_t t0 = now_ms();
  const uint64_t until = t0 + 3'000 + seconds * 1000;  // the victim's set-up first
  const std::string path = sysd.socket();
  Child victim(false, [&](int s) { return victim_body(s, seed, until); });
  Child hostile(true, [&](int s) { return hostile_body(s, seed, until - 1000, path); });
  Child prober(false, [&](int s) { return prober_body(s, until, path); });
  victim.start();
  VictimInfo info{};
  ASSERT_TRUE(recv_val(victim.sock(), info)) << "the victim could not set up; seed " << seed;
  hostile.start();  // its first read takes the start byte: the victim's ids come after
  ASSERT_TRUE(send_val(hostile.sock(), info));
  prober.start();
  // Each party reports once its time is up; one that does not within a
  // minute more is stuck (on a daemon that stopped answering).
  char vbuf[512] = {}, hbuf[256] = {}, pbuf[128] = {};
  read_report(victim, vbuf, sizeof vbuf, until + 60'000);
  read_report(hostile, hbuf, sizeof hbuf, until + 60'000);
  read_report(prober, pbuf, sizeof pbuf, until + 60'000);
  const int vst = victim.wait(), hst = hostile.wait(), pst = prober.wait();
  std::printf("victim: %s\nhostile: %s\nprober: %s\n", vbuf, hbuf, pbuf);
  EXPECT_EQ(0, vst) << "the victim's checked workload failed: " << vbuf << "; replay with SOFTVERBS_HOSTILE_SEED=" << seed;
  EXPECT_EQ(0, pst) << "the prober found the daemon silent: " << pbuf << "; seed " << seed;
  EXPECT_EQ(0, hst) << "the hostile client did not run (status " << hst << "); seed " << seed;
  ASSERT_TRUE(sysd.alive()) << "the daemon died; seed " << seed;
  // It still stops at once when asked.
  kill(sysd.pid, SIGTERM);
  bool stopped = false;
  for (int i = 0; i < 500 && !stopped; ++i) {
    int st;
    stopped = waitpid(sysd.pid, &st, WNOHANG) == sysd.pid;
    if (!stopped) usleep(10'000);
  }
  if (!stopped) {  // it must not hang the test as well
    kill(sysd.pid, SIGKILL);
    wait_for(sysd.pid);
  }
  sysd.pid = -1;
  EXPECT_TRUE(stopped) << "the daemon did not stop within 5 s of SIGTERM; seed " << seed;
}

}  // namespace
}  // namespace svsec
