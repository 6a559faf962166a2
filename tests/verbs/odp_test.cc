// On-demand paging (IBV_ACCESS_ON_DEMAND, docs/MEMORY.md "On-demand
// paging"): an ODP MR follows this process's mappings as they are at each
// access. A Peer process of the same user reaches this process's ODP MRs
// (process_vm_readv/writev); this process's own SGEs in ODP MRs go the same
// way. An access with no mapping, or none that allows it, completes in
// error; neither process is harmed.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>

#include "common/paths.h"
#include "common/sys.h"
#include "harness.h"

namespace svtest {
namespace {

constexpr int kOdpAccess = IBV_ACCESS_ON_DEMAND | IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                           IBV_ACCESS_REMOTE_READ;

const size_t kPage = size_t(sysconf(_SC_PAGESIZE));

uint8_t* fresh(size_t len) {
  void* p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return p == MAP_FAILED ? nullptr : static_cast<uint8_t*>(p);
}

// A kB figure of /proc/self/status ("VmLck", "VmRSS").
long status_kb(const char* field) {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind(field, 0) == 0) return std::stol(line.substr(line.find(':') + 1));
  return -1;
}

// This process (me) and a peer process, connected; the peer's buffer is an
// ordinary MR whose bytes are pattern(seed 9).
struct Pair {
  Side me;
  Peer peer;
  PeerInfo info{};
  bool ok = false;
  Pair() {
    ok = connect_pair(me, peer, info) == 0;
    if (ok) peer.fill(9);
  }
};

TEST(Odp, DeviceReportsOdpCaps) {
  Side s;
  ASSERT_EQ(0, s.open({}));
  ibv_device_attr_ex a{};
  ASSERT_EQ(0, ibv_query_device_ex(s.ctx, nullptr, &a));
  EXPECT_EQ(uint64_t(IBV_ODP_SUPPORT | IBV_ODP_SUPPORT_IMPLICIT), a.odp_caps.general_caps & 3);
  const uint32_t rc = a.odp_caps.per_transport_caps.rc_odp_caps;
  for (uint32_t c : {IBV_ODP_SUPPORT_SEND, IBV_ODP_SUPPORT_RECV, IBV_ODP_SUPPORT_WRITE, IBV_ODP_SUPPORT_READ,
                     IBV_ODP_SUPPORT_ATOMIC, IBV_ODP_SUPPORT_SRQ_RECV})
    EXPECT_TRUE(rc & c) << c;
}

// Registration pins nothing and converts nothing: 1 GiB of reserved,
// never-touched memory registers (and deregisters) with no locked memory,
// no resident pages, and the mapping left as it was (still PROT_NONE).
TEST(Odp, RegistrationPinsNothing) {
  Side s;
  ASSERT_EQ(0, s.open({}));
  const size_t len = size_t(1) << 30;
  void* p = mmap(nullptr, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  ASSERT_NE(MAP_FAILED, p);
  const long lck = status_kb("VmLck"), rss = status_kb("VmRSS");
  ibv_mr* mr = ibv_reg_mr(s.pd, p, len, kOdpAccess);
  ASSERT_NE(nullptr, mr) << strerror(errno);
  EXPECT_EQ(p, mr->addr);
  EXPECT_EQ(len, mr->length);
  EXPECT_EQ(lck, status_kb("VmLck"));
  EXPECT_LT(status_kb("VmRSS") - rss, 1024);  // no page of the range came in
  unsigned char v = 0;
  EXPECT_EQ(0, mincore(p, kPage, &v));
  EXPECT_EQ(0, v & 1);
  EXPECT_EQ(0, ibv_dereg_mr(mr));
  munmap(p, len);
}

TEST(Odp, RegistrationVariants) {
  Side s;
  ASSERT_EQ(0, s.open({}));
  uint8_t* b = fresh(4 * kPage);
  ibv_mr* m = ibv_reg_mr_iova2(s.pd, b, 4 * kPage, 0x10000, kOdpAccess);
  ASSERT_NE(nullptr, m) << strerror(errno);
  EXPECT_EQ(0, ibv_dereg_mr(m));
  // Implicit ODP: the whole address space, one MR.
  ibv_mr* imp = ibv_reg_mr(s.pd, nullptr, SIZE_MAX, kOdpAccess);
  ASSERT_NE(nullptr, imp) << strerror(errno);
  EXPECT_EQ(SIZE_MAX, imp->length);
  EXPECT_EQ(0, ibv_dereg_mr(imp));
  // Remote write without local write stays refused (ibv_reg_mr(3)).
  errno = 0;
  EXPECT_EQ(nullptr, ibv_reg_mr(s.pd, b, kPage, IBV_ACCESS_ON_DEMAND | IBV_ACCESS_REMOTE_WRITE));
  EXPECT_EQ(EINVAL, errno);
  munmap(b, 4 * kPage);
}

// The peer writes into and reads from fresh memory registered ODP: the
// pages come in on the peer's access.
TEST(Odp, PeerWritesAndReadsFreshMemory) {
  Pair t;
  ASSERT_TRUE(t.ok);
  const size_t len = 64 * 1024;
  uint8_t* b = fresh(len);
  ibv_mr* mr = ibv_reg_mr(t.me.pd, b, len, kOdpAccess);
  ASSERT_NE(nullptr, mr) << strerror(errno);
  ibv_wc wc = t.peer.post(IBV_WR_RDMA_WRITE, 0, uint32_t(len), uint64_t(uintptr_t(b)), mr->rkey);
  ASSERT_EQ(IBV_WC_SUCCESS, wc.status) << ibv_wc_status_str(wc.status);
  for (size_t i = 0; i < len; i += 997) ASSERT_EQ(pattern(9, i), b[i]) << i;
  std::memset(b, 0x5a, len);
  wc = t.peer.post(IBV_WR_RDMA_READ, 0, uint32_t(len), uint64_t(uintptr_t(b)), mr->rkey);
  ASSERT_EQ(IBV_WC_SUCCESS, wc.status) << ibv_wc_status_str(wc.status);
  std::vector<uint8_t> want(len, 0x5a);
  EXPECT_EQ(t.peer.checksum(0, len), checksum(want.data(), len));
  EXPECT_EQ(0, ibv_dereg_mr(mr));
  munmap(b, len);
}

// A hole in the range (munmap, PROT_NONE): the peer's WRITE completes with
// a remote access error; this process is unharmed and the bytes around
// the hole are as they were.
void hole_test(bool unmap) {
  Pair t;
  ASSERT_TRUE(t.ok);
  uint8_t* b = fresh(3 * kPage);
  std::memset(b, 1, 3 * kPage);
  ibv_mr* mr = ibv_reg_mr(t.me.pd, b, 3 * kPage, kOdpAccess);
  ASSERT_NE(nullptr, mr);
  if (unmap)
    ASSERT_EQ(0, munmap(b + kPage, kPage));
  else
    ASSERT_EQ(0, mprotect(b + kPage, kPage, PROT_NONE));
  ibv_wc wc = t.peer.post(IBV_WR_RDMA_WRITE, 0, 16, uint64_t(uintptr_t(b + kPage + 8)), mr->rkey);
  EXPECT_EQ(IBV_WC_REM_ACCESS_ERR, wc.status) << ibv_wc_status_str(wc.status);
  EXPECT_EQ(1, b[0]);
  EXPECT_EQ(1, b[2 * kPage]);
  EXPECT_EQ(0, ibv_dereg_mr(mr));
  munmap(b, 3 * kPage);
}
TEST(Odp, UnmappedPageIsARemoteAccessError) { hole_test(true); }
TEST(Odp, ProtNonePageIsARemoteAccessError) { hole_test(false); }

// A read-only page takes READs, not WRITEs.
TEST(Odp, ReadOnlyPageRefusesWrites) {
  Pair t;
  ASSERT_TRUE(t.ok);
  uint8_t* b = fresh(kPage);
  std::memset(b, 7, kPage);
  ibv_mr* mr = ibv_reg_mr(t.me.pd, b, kPage, kOdpAccess);
  ASSERT_NE(nullptr, mr);
  ASSERT_EQ(0, mprotect(b, kPage, PROT_READ));
  // process_vm_writev writes as the process itself would (FOLL_WRITE on a
  // read-only VMA fails): EFAULT.
  ibv_wc wc = t.peer.post(IBV_WR_RDMA_WRITE, 0, 8, uint64_t(uintptr_t(b)), mr->rkey);
  EXPECT_EQ(IBV_WC_REM_ACCESS_ERR, wc.status) << ibv_wc_status_str(wc.status);
  EXPECT_EQ(7, b[0]);
  EXPECT_EQ(0, ibv_dereg_mr(mr));
  munmap(b, kPage);
}

// MADV_DONTNEED drops private anonymous pages: the peer reads zeros, as the
// process itself would.
TEST(Odp, DontneedReadsBackZeros) {
  Pair t;
  ASSERT_TRUE(t.ok);
  uint8_t* b = fresh(kPage);
  std::memset(b, 0xee, kPage);
  ibv_mr* mr = ibv_reg_mr(t.me.pd, b, kPage, kOdpAccess);
  ASSERT_NE(nullptr, mr);
  ASSERT_EQ(0, madvise(b, kPage, MADV_DONTNEED));
  ibv_wc wc = t.peer.post(IBV_WR_RDMA_READ, 0, uint32_t(kPage), uint64_t(uintptr_t(b)), mr->rkey);
  ASSERT_EQ(IBV_WC_SUCCESS, wc.status);
  std::vector<uint8_t> zeros(kPage, 0);
  EXPECT_EQ(checksum(zeros.data(), kPage), t.peer.checksum(0, kPage));
  EXPECT_EQ(0, ibv_dereg_mr(mr));
  munmap(b, kPage);
}

// MAP_FIXED replacement and mremap: the MR follows the addresses, so the
// peer's WRITE lands in whatever is mapped there now.
TEST(Odp, FollowsRemapAndReplacement) {
  Pair t;
  ASSERT_TRUE(t.ok);
  uint8_t* b = fresh(2 * kPage);
  ibv_mr* mr = ibv_reg_mr(t.me.pd, b, 2 * kPage, kOdpAccess);
  ASSERT_NE(nullptr, mr);
  // Replace the first page by a new anonymous one.
  ASSERT_EQ(b, mmap(b, kPage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0));
  ASSERT_EQ(IBV_WC_SUCCESS, t.peer.post(IBV_WR_RDMA_WRITE, 0, 64, uint64_t(uintptr_t(b)), mr->rkey).status);
  EXPECT_EQ(pattern(9, 5), b[5]);
  // Move another buffer over the second page (mremap MREMAP_FIXED).
  uint8_t* other = fresh(kPage);
  std::memset(other, 3, kPage);
  ASSERT_EQ(b + kPage, mremap(other, kPage, kPage, MREMAP_MAYMOVE | MREMAP_FIXED, b + kPage));
  ASSERT_EQ(IBV_WC_SUCCESS, t.peer.post(IBV_WR_RDMA_READ, 0, 64, uint64_t(uintptr_t(b + kPage)), mr->rkey).status);
  std::vector<uint8_t> threes(64, 3);
  EXPECT_EQ(checksum(threes.data(), 64), t.peer.checksum(0, 64));
  EXPECT_EQ(0, ibv_dereg_mr(mr));
  munmap(b, 2 * kPage);
}

// fork(): the child's memory is not the MR's. What the child writes into
// its copy is not what the peer reads.
TEST(Odp, ForkChildWritesAreNotSeen) {
  Pair t;
  ASSERT_TRUE(t.ok);
  uint8_t* b = fresh(kPage);
  std::memset(b, 0x11, kPage);
  ibv_mr* mr = ibv_reg_mr(t.me.pd, b, kPage, kOdpAccess);
  ASSERT_NE(nullptr, mr);
  int go[2];
  ASSERT_EQ(0, pipe(go));
  pid_t child = fork();
  if (child == 0) {
    std::memset(b, 0x22, kPage);
    char c = 1;
    (void)!write(go[1], &c, 1);
    pause();
    _exit(0);
  }
  char c;
  ASSERT_EQ(1, read(go[0], &c, 1));
  ASSERT_EQ(IBV_WC_SUCCESS, t.peer.post(IBV_WR_RDMA_READ, 0, 64, uint64_t(uintptr_t(b)), mr->rkey).status);
  std::vector<uint8_t> want(64, 0x11);
  EXPECT_EQ(checksum(want.data(), 64), t.peer.checksum(0, 64));
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  close(go[0]);
  close(go[1]);
  EXPECT_EQ(0, ibv_dereg_mr(mr));
  munmap(b, kPage);
}

// Implicit ODP: one MR over the address space reaches memory allocated
// after it was registered, at its own address.
TEST(Odp, ImplicitReachesFreshHeapMemory) {
  Pair t;
  ASSERT_TRUE(t.ok);
  ibv_mr* imp = ibv_reg_mr(t.me.pd, nullptr, SIZE_MAX, kOdpAccess);
  ASSERT_NE(nullptr, imp) << strerror(errno);
  auto* heap = static_cast<uint8_t*>(std::malloc(60000));
  ASSERT_NE(nullptr, heap);
  ASSERT_EQ(IBV_WC_SUCCESS,
            t.peer.post(IBV_WR_RDMA_WRITE, 0, 60000, uint64_t(uintptr_t(heap)), imp->rkey).status);
  for (size_t i = 0; i < 60000; i += 1009) ASSERT_EQ(pattern(9, i), heap[i]) << i;
  // An address with nothing mapped: an error, not a crash.
  EXPECT_EQ(IBV_WC_REM_ACCESS_ERR, t.peer.post(IBV_WR_RDMA_WRITE, 0, 8, 0x1000, imp->rkey).status);
  std::free(heap);
  EXPECT_EQ(0, ibv_dereg_mr(imp));
}

// This process's own SGEs in an ODP MR: the source of a WRITE and the
// destination of a READ; a hole in a local SGE is a local protection error.
TEST(Odp, LocalSgesInOdpMemory) {
  Pair t;
  ASSERT_TRUE(t.ok);
  uint8_t* b = fresh(2 * kPage);
  ibv_mr* mr = ibv_reg_mr(t.me.pd, b, 2 * kPage, kOdpAccess);
  ASSERT_NE(nullptr, mr);
  for (size_t i = 0; i < kPage; ++i) b[i] = uint8_t(i * 3);
  auto post = [&](ibv_wr_opcode op, uint8_t* at, uint32_t len) {
    ibv_sge sge{uint64_t(uintptr_t(at)), len, mr->lkey};
    ibv_send_wr wr{}, *bad = nullptr;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = op;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = t.info.addr;
    wr.wr.rdma.rkey = t.info.rkey;
    EXPECT_EQ(0, ibv_post_send(t.me.qp, &wr, &bad));
    auto v = poll(t.me.cq, 1);
    return v.empty() ? IBV_WC_GENERAL_ERR : v[0].status;
  };
  ASSERT_EQ(IBV_WC_SUCCESS, post(IBV_WR_RDMA_WRITE, b, uint32_t(kPage)));
  EXPECT_EQ(checksum(b, kPage), t.peer.checksum(0, kPage));
  ASSERT_EQ(IBV_WC_SUCCESS, post(IBV_WR_RDMA_READ, b + kPage, 256));
  EXPECT_EQ(checksum(b, 256), checksum(b + kPage, 256));
  ASSERT_EQ(0, munmap(b + kPage, kPage));
  EXPECT_EQ(IBV_WC_LOC_PROT_ERR, post(IBV_WR_RDMA_WRITE, b + kPage, 64));
  EXPECT_EQ(0, ibv_dereg_mr(mr));
  munmap(b, kPage);
}

// A SEND into a receive buffer in ODP memory.
TEST(Odp, SendIntoOdpReceiveBuffer) {
  Pair t;
  ASSERT_TRUE(t.ok);
  uint8_t* b = fresh(kPage);
  ibv_mr* mr = ibv_reg_mr(t.me.pd, b, kPage, kOdpAccess);
  ASSERT_NE(nullptr, mr);
  ibv_sge sge{uint64_t(uintptr_t(b)), uint32_t(kPage), mr->lkey};
  ibv_recv_wr rwr{}, *rbad = nullptr;
  rwr.wr_id = 77;
  rwr.sg_list = &sge;
  rwr.num_sge = 1;
  ASSERT_EQ(0, ibv_post_recv(t.me.qp, &rwr, &rbad));
  ASSERT_EQ(IBV_WC_SUCCESS, t.peer.post(IBV_WR_SEND, 0, 1000, 0, 0).status);
  auto v = poll(t.me.cq, 1);
  ASSERT_EQ(1u, v.size());
  EXPECT_EQ(IBV_WC_SUCCESS, v[0].status);
  EXPECT_EQ(1000u, v[0].byte_len);
  for (size_t i = 0; i < 1000; ++i) ASSERT_EQ(pattern(9, i), b[i]) << i;
  EXPECT_EQ(0, ibv_dereg_mr(mr));
  munmap(b, kPage);
}

// RDMA atomics on ODP memory: two peers' fetch-and-adds on one word,
// concurrently, each through its own QP and MR: none is lost. A word with
// no page behind it fails the atomic.
TEST(Odp, AtomicsAreAtomicAmongThemselves) {
  Pair a, b;
  ASSERT_TRUE(a.ok && b.ok);
  uint8_t* w = fresh(2 * kPage);
  const int acc = kOdpAccess | IBV_ACCESS_REMOTE_ATOMIC;
  ibv_mr* ma = ibv_reg_mr(a.me.pd, w, 2 * kPage, acc);
  ibv_mr* mb = ibv_reg_mr(b.me.pd, w, 2 * kPage, acc);
  ASSERT_TRUE(ma && mb);
  const uint64_t at = uint64_t(uintptr_t(w)) + 64;
  int ra = -1, rb = -1;
  std::thread ta([&] { ra = a.peer.fetch_add(2000, at, ma->rkey); });
  std::thread tb([&] { rb = b.peer.fetch_add(2000, at, mb->rkey); });
  ta.join();
  tb.join();
  EXPECT_EQ(0, ra);
  EXPECT_EQ(0, rb);
  uint64_t v;
  std::memcpy(&v, w + 64, 8);
  EXPECT_EQ(4000u, v);
  ASSERT_EQ(0, munmap(w + kPage, kPage));
  EXPECT_NE(0, a.peer.fetch_add(1, at + kPage, ma->rkey));
  EXPECT_EQ(0, ibv_dereg_mr(ma));
  EXPECT_EQ(0, ibv_dereg_mr(mb));
  munmap(w, kPage);
}

// ATOMIC WRITE (IBTA annex A19) on ODP memory from a peer process: its 8
// bytes land, nothing around them; and the errors of a regular MR, plus
// those of a hole: misaligned (invalid request), an MR without remote
// write, past the MR, an unmapped page, a read-only page (remote access).
TEST(Odp, AtomicWriteStoresEightBytesAndFailsAsARegularMr) {
  uint8_t* b = fresh(3 * kPage);
  std::memset(b, 0x11, 3 * kPage);
  {
    Pair t;
    ASSERT_TRUE(t.ok);
    ibv_mr* mr = ibv_reg_mr(t.me.pd, b, 3 * kPage, kOdpAccess);
    ASSERT_NE(nullptr, mr) << strerror(errno);
    ibv_wc wc = t.peer.post(IBV_WR_ATOMIC_WRITE, 16, 8, uint64_t(uintptr_t(b + 64)), mr->rkey);
    ASSERT_EQ(IBV_WC_SUCCESS, wc.status) << ibv_wc_status_str(wc.status);
    EXPECT_EQ(IBV_WC_ATOMIC_WRITE, wc.opcode);
    for (size_t i = 0; i < 8; ++i) EXPECT_EQ(pattern(9, 16 + i), b[64 + i]) << i;
    EXPECT_EQ(0x11, b[63]);
    EXPECT_EQ(0x11, b[72]);
    EXPECT_EQ(0, ibv_dereg_mr(mr));
  }
  std::memset(b, 0x11, 128);
  struct Case {
    const char* name;
    size_t at;
    int access;
    int change;  // 1: munmap the second page, 2: make it read-only
    ibv_wc_status status;
  } const cases[] = {
      {"misaligned", 68, kOdpAccess, 0, IBV_WC_REM_INV_REQ_ERR},
      {"MR without remote write", 64, IBV_ACCESS_ON_DEMAND | IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ, 0,
       IBV_WC_REM_ACCESS_ERR},
      {"past the MR", 3 * kPage, kOdpAccess, 0, IBV_WC_REM_ACCESS_ERR},
      {"read-only page", kPage + 8, kOdpAccess, 2, IBV_WC_REM_ACCESS_ERR},
      {"unmapped page", kPage + 8, kOdpAccess, 1, IBV_WC_REM_ACCESS_ERR},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    Pair t;
    ASSERT_TRUE(t.ok);
    ibv_mr* mr = ibv_reg_mr(t.me.pd, b, 3 * kPage, c.access);
    ASSERT_NE(nullptr, mr) << strerror(errno);
    if (c.change == 1) {
      ASSERT_EQ(0, munmap(b + kPage, kPage));
    }
    if (c.change == 2) {
      ASSERT_EQ(0, mprotect(b + kPage, kPage, PROT_READ));
    }
    ibv_wc wc = t.peer.post(IBV_WR_ATOMIC_WRITE, 16, 8, uint64_t(uintptr_t(b + c.at)), mr->rkey);
    EXPECT_EQ(c.status, wc.status) << ibv_wc_status_str(wc.status);
    for (size_t i = 0; i < 128; ++i) ASSERT_EQ(0x11, b[i]) << i;
    if (c.change == 2) {
      EXPECT_EQ(0x11, b[kPage + 8]);
      ASSERT_EQ(0, mprotect(b + kPage, kPage, PROT_READ | PROT_WRITE));
    }
    EXPECT_EQ(0, ibv_dereg_mr(mr));
  }
  munmap(b, 3 * kPage);
}

// An ATOMIC WRITE racing FETCH_ADDs on one ODP word never tears: one peer
// stores 0xAAAAAAAA00000000 and 0x5555555500000000 in turn while another
// adds 1 (2000 times; the low half never carries into the high one), and
// this process, the registrant, reads the word all along with 8-byte loads.
// Every value seen, and the last, has a whole high half; the adds are
// atomic with the stores (the ODP lock), so the low half ends at most 2000.
TEST(Odp, AtomicWriteRacingFetchAddsNeverTears) {
  Pair a, b;
  ASSERT_TRUE(a.ok && b.ok);
  uint8_t* w = fresh(kPage);
  const int acc = kOdpAccess | IBV_ACCESS_REMOTE_ATOMIC;
  ibv_mr* ma = ibv_reg_mr(a.me.pd, w, kPage, acc);
  ibv_mr* mb = ibv_reg_mr(b.me.pd, w, kPage, acc);
  ASSERT_TRUE(ma && mb);
  const uint64_t at = uint64_t(uintptr_t(w)) + 64;
  auto* word = reinterpret_cast<uint64_t*>(w + 64);
  constexpr uint64_t kA = 0xAAAAAAAA00000000ull, kB = 0x5555555500000000ull;
  const auto whole = [&](uint64_t v) { return (v >> 32) == 0 || (v >> 32) == (kA >> 32) || (v >> 32) == (kB >> 32); };
  std::atomic<bool> done{false};
  uint64_t torn = 0, seen = 0, first_torn = 0;
  std::thread watcher([&] {
    while (!done.load(std::memory_order_relaxed)) {
      const uint64_t v = __atomic_load_n(word, __ATOMIC_RELAXED);
      ++seen;
      if (!whole(v) && torn++ == 0) first_torn = v;
    }
  });
  int ra = -1, rb = -1;
  std::thread ta([&] { ra = a.peer.atomic_writes(2000, kA, kB, at, ma->rkey); });
  std::thread tb([&] { rb = b.peer.fetch_add(2000, at, mb->rkey); });
  ta.join();
  tb.join();
  done = true;
  watcher.join();
  EXPECT_EQ(0, ra);
  EXPECT_EQ(0, rb);
  EXPECT_EQ(0u, torn) << "of " << seen << " loads; the first: " << std::hex << first_torn;
  const uint64_t last = __atomic_load_n(word, __ATOMIC_RELAXED);
  EXPECT_TRUE(whole(last) && (last >> 32) != 0) << std::hex << last;
  EXPECT_LE(last & 0xffffffffull, 2000u);
  EXPECT_EQ(0, ibv_dereg_mr(ma));
  EXPECT_EQ(0, ibv_dereg_mr(mb));
  munmap(w, kPage);
}

// Binds a type 1 window over [at, at + len) of `mr` for `acc`; its key, or 0.
uint32_t bind_window(Side& me, ibv_mr* mr, ibv_mw* mw, uint64_t at, uint64_t len, unsigned acc) {
  ibv_mw_bind bind{};
  bind.send_flags = IBV_SEND_SIGNALED;
  bind.bind_info = {mr, at, len, acc};
  if (ibv_bind_mw(me.qp, mw, &bind) != 0) return 0;
  auto c = poll(me.cq, 1);
  return c.size() == 1 && c[0].status == IBV_WC_SUCCESS ? mw->rkey : 0;
}

// Memory windows over ODP MRs (explicit and implicit): a window grants
// exactly its range and rights of the registrant's memory as it is now;
// past it, a right it lacks, or a hole inside it is a remote access error.
TEST(Odp, WindowsOverOdpMrsGrantExactlyTheWindow) {
  uint8_t* b = fresh(3 * kPage);
  std::memset(b, 0x11, 3 * kPage);
  const int acc = kOdpAccess | IBV_ACCESS_MW_BIND;
  const auto at = [&](size_t off) { return uint64_t(uintptr_t(b + off)); };
  {
    Pair t;
    ASSERT_TRUE(t.ok);
    ibv_mr* mr = ibv_reg_mr(t.me.pd, b, 3 * kPage, acc);
    ASSERT_NE(nullptr, mr) << strerror(errno);
    ibv_mw* mw = ibv_alloc_mw(t.me.pd, IBV_MW_TYPE_1);
    ASSERT_NE(nullptr, mw);
    const uint32_t key = bind_window(t.me, mr, mw, at(kPage), 1000, IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
    ASSERT_NE(0u, key) << strerror(errno);
    ibv_wc wc = t.peer.post(IBV_WR_RDMA_WRITE, 0, 1000, at(kPage), key);
    ASSERT_EQ(IBV_WC_SUCCESS, wc.status) << ibv_wc_status_str(wc.status);
    for (size_t i = 0; i < 1000; ++i) ASSERT_EQ(pattern(9, i), b[kPage + i]) << i;
    EXPECT_EQ(0x11, b[kPage - 1]);
    EXPECT_EQ(0x11, b[kPage + 1000]);
    std::memset(b + kPage, 0x33, 1000);
    wc = t.peer.post(IBV_WR_RDMA_READ, 0, 10, at(kPage + 990), key);
    ASSERT_EQ(IBV_WC_SUCCESS, wc.status) << ibv_wc_status_str(wc.status);
    std::vector<uint8_t> want(10, 0x33);
    EXPECT_EQ(checksum(want.data(), 10), t.peer.checksum(0, 10));
    // One byte past the window: refused, nothing written.
    wc = t.peer.post(IBV_WR_RDMA_WRITE, 0, 11, at(kPage + 990), key);
    EXPECT_EQ(IBV_WC_REM_ACCESS_ERR, wc.status) << ibv_wc_status_str(wc.status);
    EXPECT_EQ(0x33, b[kPage + 999]);
    EXPECT_EQ(0x11, b[kPage + 1000]);
    EXPECT_EQ(0, ibv_dealloc_mw(mw));
    EXPECT_EQ(0, ibv_dereg_mr(mr));
  }
  {  // an implicit ODP MR; a read-only window refuses a WRITE
    Pair t;
    ASSERT_TRUE(t.ok);
    ibv_mr* imp = ibv_reg_mr(t.me.pd, nullptr, SIZE_MAX, acc);
    ASSERT_NE(nullptr, imp) << strerror(errno);
    ibv_mw* mw = ibv_alloc_mw(t.me.pd, IBV_MW_TYPE_1);
    ASSERT_NE(nullptr, mw);
    const uint32_t key = bind_window(t.me, imp, mw, at(0), 2 * kPage, IBV_ACCESS_REMOTE_READ);
    ASSERT_NE(0u, key) << strerror(errno);
    ASSERT_EQ(IBV_WC_SUCCESS, t.peer.post(IBV_WR_RDMA_READ, 0, 64, at(kPage - 32), key).status);
    EXPECT_EQ(IBV_WC_REM_ACCESS_ERR, t.peer.post(IBV_WR_RDMA_WRITE, 0, 8, at(0), key).status);
    EXPECT_EQ(0x11, b[0]);
    EXPECT_EQ(0, ibv_dealloc_mw(mw));
    EXPECT_EQ(0, ibv_dereg_mr(imp));
  }
  {  // a hole inside the window
    Pair t;
    ASSERT_TRUE(t.ok);
    ibv_mr* mr = ibv_reg_mr(t.me.pd, b, 3 * kPage, acc);
    ASSERT_NE(nullptr, mr);
    ibv_mw* mw = ibv_alloc_mw(t.me.pd, IBV_MW_TYPE_1);
    ASSERT_NE(nullptr, mw);
    const uint32_t key = bind_window(t.me, mr, mw, at(0), 3 * kPage, IBV_ACCESS_REMOTE_WRITE);
    ASSERT_NE(0u, key);
    ASSERT_EQ(0, munmap(b + 2 * kPage, kPage));
    EXPECT_EQ(IBV_WC_REM_ACCESS_ERR, t.peer.post(IBV_WR_RDMA_WRITE, 0, 16, at(2 * kPage + 8), key).status);
    EXPECT_EQ(0, ibv_dealloc_mw(mw));
    EXPECT_EQ(0, ibv_dereg_mr(mr));
  }
  munmap(b, 2 * kPage);
}

// The MR dies with its process, whatever takes its pid. The peer registers
// an implicit ODP MR and forks a child that keeps its daemon connection
// open; the daemon is stopped (SIGSTOP), so that it cannot revoke the key
// when the peer exits; the peer is killed and its pid given to a new
// process of the same user (ns_last_pid), which has `victim` at the same
// address (both are forks of this program). A WRITE through the dead
// peer's key, still published, must not land in the new process: the
// registrant's memory is reached only through its pinned address space
// (common/odp_memory.h), which the new process is not. `warm`: this process
// reached the peer's memory before (its handle is open already); else it
// opens one after the pid was reused.
volatile uint8_t victim[64];

struct DaemonStopped {
  pid_t pid = 0;
  DaemonStopped() {
    sv::Fd s;
    sv::PeerCred c{};
    if (sv::connect_seqpacket(sv::socket_path(sv::runtime_dir()), s) == 0 && sv::peer_credentials(s.get(), c) == 0 &&
        c.pid > 0 && kill(c.pid, SIGSTOP) == 0)
      pid = c.pid;
  }
  ~DaemonStopped() {
    if (resume.joinable()) resume.join();
    if (pid) kill(pid, SIGCONT);
  }
  // Lets the daemon go on after `ms` (a failed request's completion asks it
  // to move the QP to the error state).
  void resume_after(int ms) {
    resume = std::thread([this, ms] {
      usleep(useconds_t(ms) * 1000);
      kill(pid, SIGCONT);
    });
  }
  std::thread resume;
};

// A signaled WRITE of this side's first `len` bytes to addr under rkey;
// its completion's status.
ibv_wc_status write_to(Side& me, uint64_t addr, uint32_t rkey, uint32_t len) {
  ibv_sge sge{uint64_t(uintptr_t(me.buf)), len, me.mr->lkey};
  ibv_send_wr wr{}, *bad = nullptr;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = addr;
  wr.wr.rdma.rkey = rkey;
  if (ibv_post_send(me.qp, &wr, &bad) != 0) return IBV_WC_GENERAL_ERR;
  auto v = poll(me.cq, 1);
  return v.size() == 1 ? v[0].status : IBV_WC_GENERAL_ERR;
}

void dead_key_write(bool warm) {
  Pair t;
  ASSERT_TRUE(t.ok);
  pid_t orphan = 0;
  const uint32_t rkey = t.peer.odp_orphan(&orphan);
  ASSERT_NE(0u, rkey) << strerror(orphan);
  // What this process needs of the daemon to reach the peer is fetched
  // now, by a WRITE through the peer's ordinary key; `warm`: also through
  // its ODP key.
  ASSERT_EQ(IBV_WC_SUCCESS, write_to(t.me, t.info.addr, t.info.rkey, 8));
  if (warm) {
    ASSERT_EQ(IBV_WC_SUCCESS, write_to(t.me, t.info.addr, rkey, 8)) << "the peer's memory through its ODP key";
  }
  const pid_t dead = t.peer.pid();
  DaemonStopped stopped;
  ASSERT_NE(0, stopped.pid) << "cannot stop the daemon";
  t.peer.kill9();
  // A process of this user at the dead peer's pid, holding `victim`.
  int report[2];
  ASSERT_EQ(0, pipe(report));
  pid_t reuser = -1;
  for (int tries = 0; tries < 200 && reuser != dead; ++tries) {
    if (reuser > 0) waitpid(reuser, nullptr, 0);
    FILE* f = fopen("/proc/sys/kernel/ns_last_pid", "w");
    if (!f) break;
    fprintf(f, "%d", int(dead) - 1);
    fclose(f);
    reuser = fork();
    if (reuser == 0) {
      if (getpid() != dead) _exit(0);
      std::memset(const_cast<uint8_t*>(victim), 0x77, sizeof(victim));
      usleep(500 * 1000);  // the test's WRITE happens meanwhile
      uint8_t first = victim[0];
      (void)!write(report[1], &first, 1);
      _exit(0);
    }
  }
  if (reuser != dead) {
    kill(orphan, SIGKILL);
    waitpid(orphan, nullptr, 0);
    GTEST_SKIP() << "could not hand pid " << dead << " to a new process";
  }
  usleep(100 * 1000);  // the victim has set its bytes
  std::memset(t.me.buf, 0x99, 64);
  stopped.resume_after(300);  // the WRITE's bytes have moved, or not, by then
  const ibv_wc_status st = write_to(t.me, uint64_t(uintptr_t(victim)), rkey, 64);
  uint8_t first = 0;
  EXPECT_EQ(1, read(report[0], &first, 1));
  EXPECT_EQ(0x77, first) << "a WRITE through a dead process's key landed in the process that took its pid";
  EXPECT_NE(IBV_WC_SUCCESS, st);
  waitpid(reuser, nullptr, 0);
  kill(orphan, SIGKILL);
  waitpid(orphan, nullptr, 0);
  close(report[0]);
  close(report[1]);
}

TEST(Odp, AKeyDiesWithItsProcessNotWithItsPid) {
  if (geteuid() != 0 || access("/proc/sys/kernel/ns_last_pid", W_OK) != 0)
    GTEST_SKIP() << "needs root and ns_last_pid to hand the dead peer's pid to another process";
  dead_key_write(false);
}

TEST(Odp, AnOpenHandleDiesWithItsProcessNotWithItsPid) {
  if (geteuid() != 0 || access("/proc/sys/kernel/ns_last_pid", W_OK) != 0)
    GTEST_SKIP() << "needs root and ns_last_pid to hand the dead peer's pid to another process";
  dead_key_write(true);
}

// ibv_advise_mr: PREFETCH_WRITE brings the pages in; a non-ODP MR is refused.
TEST(Odp, PrefetchPopulates) {
  Side s;
  ASSERT_EQ(0, s.open({}));
  const size_t len = 16 * kPage;
  uint8_t* b = fresh(len);
  ibv_mr* mr = ibv_reg_mr(s.pd, b, len, kOdpAccess);
  ASSERT_NE(nullptr, mr);
  std::vector<unsigned char> v(16);
  ASSERT_EQ(0, mincore(b, len, v.data()));
  EXPECT_EQ(0, v[3] & 1);
  ibv_sge sge{uint64_t(uintptr_t(b)), uint32_t(len), mr->lkey};
  EXPECT_EQ(0, ibv_advise_mr(s.pd, IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE, IBV_ADVISE_MR_FLAG_FLUSH, &sge, 1));
  ASSERT_EQ(0, mincore(b, len, v.data()));
  for (int i = 0; i < 16; ++i) EXPECT_EQ(1, v[i] & 1) << i;
  EXPECT_EQ(0, ibv_advise_mr(s.pd, IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT, 0, &sge, 1));
  ibv_sge plain{uint64_t(uintptr_t(s.buf)), 64, s.mr->lkey};
  EXPECT_EQ(EINVAL, ibv_advise_mr(s.pd, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, &plain, 1));
  EXPECT_EQ(0, ibv_dereg_mr(mr));
  munmap(b, len);
}

}  // namespace
}  // namespace svtest
