#include "mem_backing.h"

#include <errno.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/auxv.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

using sv::MemBacking;

const size_t kPage = static_cast<size_t>(sysconf(_SC_PAGESIZE));

uintptr_t page_down(const void* p) { return reinterpret_cast<uintptr_t>(p) & ~(kPage - 1); }
uintptr_t page_up(uintptr_t a) { return (a + kPage - 1) & ~(kPage - 1); }

struct MapsLine {
  uintptr_t start = 0;
  uintptr_t end = 0;
  std::string perms;
  uint64_t offset = 0;
  uint64_t inode = 0;
  std::string name;
};

std::vector<MapsLine> read_maps() {
  std::vector<MapsLine> out;
  std::ifstream in("/proc/self/maps");
  std::string line;
  while (std::getline(in, line)) {
    MapsLine m;
    std::istringstream ls(line);
    std::string range, dev;
    ls >> range >> m.perms >> std::hex >> m.offset >> dev >> std::dec >> m.inode;
    std::getline(ls >> std::ws, m.name);
    const size_t dash = range.find('-');
    m.start = std::stoull(range.substr(0, dash), nullptr, 16);
    m.end = std::stoull(range.substr(dash + 1), nullptr, 16);
    out.push_back(m);
  }
  return out;
}

MapsLine vma_of(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  for (const MapsLine& m : read_maps()) {
    if (a >= m.start && a < m.end) return m;
  }
  return MapsLine{};
}

bool is_our_memfd(const MapsLine& m) {
  return m.perms.size() == 4 && m.perms[3] == 's' && m.name.find("memfd:softverbs-backing") != std::string::npos &&
         m.offset == m.start;
}

// Every page of [p, p+len) is a shared mapping of our backing file at offset == address.
bool all_pages_ours(const void* p, size_t len) {
  for (uintptr_t a = page_down(p); a < reinterpret_cast<uintptr_t>(p) + len; a += kPage) {
    if (!is_our_memfd(vma_of(reinterpret_cast<void*>(a)))) return false;
  }
  return true;
}

bool any_page_ours(const void* p, size_t len) {
  for (uintptr_t a = page_down(p); a < reinterpret_cast<uintptr_t>(p) + len; a += kPage) {
    if (is_our_memfd(vma_of(reinterpret_cast<void*>(a)))) return true;
  }
  return false;
}

void fill(void* p, size_t n, uint8_t seed) {
  auto* b = static_cast<uint8_t*>(p);
  for (size_t i = 0; i < n; ++i) b[i] = static_cast<uint8_t>(seed + i * 7 + (i >> 12));
}

bool check(const void* p, size_t n, uint8_t seed) {
  const auto* b = static_cast<const uint8_t*>(p);
  for (size_t i = 0; i < n; ++i) {
    if (b[i] != static_cast<uint8_t>(seed + i * 7 + (i >> 12))) return false;
  }
  return true;
}

bool all_zero(const void* p, size_t n) {
  const auto* b = static_cast<const uint8_t*>(p);
  for (size_t i = 0; i < n; ++i) {
    if (b[i] != 0) return false;
  }
  return true;
}

// A "peer view": maps the backing file the way another process would, for the
// pages covering [p, p+len). Returns the address corresponding to p.
struct View {
  void* base = MAP_FAILED;
  size_t len = 0;
  uint8_t* at = nullptr;
  View(int fd, const void* p, size_t n) {
    const uintptr_t b = page_down(p);
    len = page_up(reinterpret_cast<uintptr_t>(p) + n) - b;
    base = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, static_cast<off_t>(b));
    if (base != MAP_FAILED) at = static_cast<uint8_t*>(base) + (reinterpret_cast<uintptr_t>(p) - b);
  }
  ~View() {
    if (base != MAP_FAILED) munmap(base, len);
  }
  bool ok() const { return base != MAP_FAILED; }
};

void* map_anon(size_t n, int prot = PROT_READ | PROT_WRITE) {
  void* p = mmap(nullptr, n, prot, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return p == MAP_FAILED ? nullptr : p;
}

// Acquire, check content/backing/peer view, release, check again.
void round_trip(void* p, size_t n, uint8_t seed) {
  MemBacking& mb = MemBacking::instance();
  const size_t before = mb.backed_pages();
  fill(p, n, seed);
  ASSERT_EQ(0, mb.acquire(p, n));
  EXPECT_TRUE(check(p, n, seed));
  EXPECT_TRUE(mb.is_backed(p));
  EXPECT_TRUE(mb.is_backed(static_cast<uint8_t*>(p) + n - 1));
  EXPECT_TRUE(all_pages_ours(p, n));
  EXPECT_GE(mb.backed_pages(), before + 1);
  {
    View v(mb.fd(), p, n);
    ASSERT_TRUE(v.ok());
    EXPECT_TRUE(check(v.at, n, seed));
  }
  mb.release(p, n);
  EXPECT_TRUE(check(p, n, seed));
  EXPECT_EQ(before, mb.backed_pages());
  EXPECT_FALSE(any_page_ours(p, n));
}

// ---------------------------------------------------------------------------

TEST(MemBacking, InvalidArguments) {
  MemBacking& mb = MemBacking::instance();
  int x = 0;
  EXPECT_EQ(EINVAL, mb.acquire(&x, 0));
  EXPECT_EQ(EINVAL, mb.acquire(reinterpret_cast<void*>(UINTPTR_MAX - 10), 100));
  mb.release(&x, 0);  // no-op
}

TEST(MemBacking, PreservesMalloc) {
  for (size_t n : {size_t{1}, size_t{100}, kPage, size_t{10000}, size_t{1} << 20}) {
    void* p = malloc(n);
    ASSERT_NE(nullptr, p);
    round_trip(p, n, static_cast<uint8_t>(n));
    free(p);
  }
}

TEST(MemBacking, PreservesPosixMemalign) {
  void* p = nullptr;
  ASSERT_EQ(0, posix_memalign(&p, kPage, 3 * kPage));
  round_trip(p, 3 * kPage, 11);
  free(p);
}

TEST(MemBacking, PreservesAnonymousMmapWithUntouchedPages) {
  const size_t n = 16 * kPage;
  auto* p = static_cast<uint8_t*>(map_anon(n));
  ASSERT_NE(nullptr, p);
  // Only some pages touched; the rest must read as zero everywhere.
  for (size_t i = 0; i < 16; i += 3) std::memset(p + i * kPage + 5, static_cast<int>(i + 1), 100);
  std::vector<uint8_t> copy(p, p + n);
  MemBacking& mb = MemBacking::instance();
  ASSERT_EQ(0, mb.acquire(p, n));
  EXPECT_EQ(0, std::memcmp(copy.data(), p, n));
  {
    View v(mb.fd(), p, n);
    ASSERT_TRUE(v.ok());
    EXPECT_EQ(0, std::memcmp(copy.data(), v.at, n));
  }
  mb.release(p, n);
  EXPECT_EQ(0, std::memcmp(copy.data(), p, n));
  munmap(p, n);
}

alignas(64) uint8_t g_bss[3 * 4096 + 123];
uint8_t g_data[2 * 4096 + 77] = {1, 2, 3, 4, 5};

TEST(MemBacking, PreservesBssAndData) {
  round_trip(g_bss + 17, sizeof g_bss - 17, 23);
  round_trip(g_data, sizeof g_data, 29);
}

TEST(MemBacking, UnalignedByteRangesKeepWholePages) {
  const size_t n = 4 * kPage;
  auto* p = static_cast<uint8_t*>(map_anon(n));
  ASSERT_NE(nullptr, p);
  fill(p, n, 3);
  MemBacking& mb = MemBacking::instance();
  ASSERT_EQ(0, mb.acquire(p + 3, 5000));  // pages 0 and 1
  EXPECT_TRUE(check(p, n, 3));            // bytes outside the range too
  EXPECT_TRUE(all_pages_ours(p, 2 * kPage));
  EXPECT_FALSE(any_page_ours(p + 2 * kPage, 2 * kPage));
  EXPECT_TRUE(mb.is_backed(p));
  EXPECT_TRUE(mb.is_backed(p + kPage + 907));
  EXPECT_FALSE(mb.is_backed(p + 2 * kPage));
  ASSERT_EQ(0, mb.acquire(p + 2 * kPage - 1, 2));  // straddles pages 1 and 2
  EXPECT_TRUE(mb.is_backed(p + 2 * kPage));
  mb.release(p + 3, 5000);
  EXPECT_FALSE(mb.is_backed(p));
  EXPECT_TRUE(mb.is_backed(p + kPage));
  mb.release(p + 2 * kPage - 1, 2);
  EXPECT_FALSE(any_page_ours(p, n));
  EXPECT_TRUE(check(p, n, 3));
  munmap(p, n);
}

TEST(MemBacking, PeerViewSeesWritesBothWays) {
  const size_t n = 2 * kPage;
  auto* p = static_cast<uint8_t*>(map_anon(n));
  ASSERT_NE(nullptr, p);
  MemBacking& mb = MemBacking::instance();
  ASSERT_EQ(0, mb.acquire(p, n));
  View v(mb.fd(), p, n);
  ASSERT_TRUE(v.ok());
  p[10] = 42;
  EXPECT_EQ(42, v.at[10]);
  v.at[kPage + 1] = 43;
  EXPECT_EQ(43, p[kPage + 1]);
  mb.release(p, n);
  munmap(p, n);
}

TEST(MemBacking, ProtectionIsKept) {
  const size_t n = 2 * kPage;
  auto* p = static_cast<uint8_t*>(map_anon(n));
  ASSERT_NE(nullptr, p);
  fill(p, n, 5);
  ASSERT_EQ(0, mprotect(p, n, PROT_READ));
  MemBacking& mb = MemBacking::instance();
  ASSERT_EQ(0, mb.acquire(p, n));
  EXPECT_EQ("r--s", vma_of(p).perms);
  EXPECT_TRUE(check(p, n, 5));
  mb.release(p, n);
  EXPECT_EQ("r--p", vma_of(p).perms);
  EXPECT_TRUE(check(p, n, 5));
  munmap(p, n);
}

TEST(MemBacking, RedundantOverlappingRegistrations) {
  const size_t n = 6 * kPage;
  auto* p = static_cast<uint8_t*>(map_anon(n));
  ASSERT_NE(nullptr, p);
  fill(p, n, 9);
  MemBacking& mb = MemBacking::instance();
  const size_t base = mb.backed_pages();
  ASSERT_EQ(0, mb.acquire(p, 3 * kPage));          // pages 0-2
  ASSERT_EQ(0, mb.acquire(p + kPage, 4 * kPage));  // pages 1-4
  ASSERT_EQ(0, mb.acquire(p + kPage, 4 * kPage));  // again
  ASSERT_EQ(0, mb.acquire(p + 2 * kPage + 5, 1));  // page 2
  EXPECT_EQ(base + 5, mb.backed_pages());
  EXPECT_TRUE(check(p, n, 9));

  mb.release(p, 3 * kPage);  // page 0 -> 0
  EXPECT_FALSE(mb.is_backed(p));
  EXPECT_FALSE(any_page_ours(p, kPage));
  EXPECT_TRUE(all_pages_ours(p + kPage, 4 * kPage));
  EXPECT_EQ(base + 4, mb.backed_pages());

  mb.release(p + kPage, 4 * kPage);
  EXPECT_EQ(base + 4, mb.backed_pages());
  mb.release(p + kPage, 4 * kPage);  // pages 1,3,4 -> 0; page 2 still held
  EXPECT_EQ(base + 1, mb.backed_pages());
  EXPECT_TRUE(mb.is_backed(p + 2 * kPage));
  EXPECT_TRUE(all_pages_ours(p + 2 * kPage, kPage));
  EXPECT_FALSE(any_page_ours(p + kPage, kPage));
  EXPECT_FALSE(any_page_ours(p + 3 * kPage, 2 * kPage));

  mb.release(p + 2 * kPage + 5, 1);
  EXPECT_EQ(base, mb.backed_pages());
  EXPECT_FALSE(any_page_ours(p, n));
  mb.release(p, n);  // releasing unbacked pages is a no-op
  EXPECT_EQ(base, mb.backed_pages());
  EXPECT_TRUE(check(p, n, 9));
  munmap(p, n);
}

TEST(MemBacking, AdjacentRangesMergeIntoOneVma) {
  const size_t n = 8 * kPage;
  auto* p = static_cast<uint8_t*>(map_anon(n));
  ASSERT_NE(nullptr, p);
  fill(p, n, 1);
  MemBacking& mb = MemBacking::instance();
  ASSERT_EQ(0, mb.acquire(p + 2 * kPage, 2 * kPage));
  ASSERT_EQ(0, mb.acquire(p + 4 * kPage, 2 * kPage));
  ASSERT_EQ(0, mb.acquire(p + 1 * kPage, kPage));
  const MapsLine m = vma_of(p + 3 * kPage);
  EXPECT_TRUE(is_our_memfd(m));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p + kPage), m.start);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p + 6 * kPage), m.end);
  mb.release(p + 2 * kPage, 2 * kPage);
  mb.release(p + 4 * kPage, 2 * kPage);
  mb.release(p + 1 * kPage, kPage);
  EXPECT_TRUE(check(p, n, 1));
  munmap(p, n);
}

TEST(MemBacking, LargeSparseRangeAcrossChunks) {
  const size_t n = (130u << 20) + 3 * kPage;
  auto* p = static_cast<uint8_t*>(map_anon(n));
  ASSERT_NE(nullptr, p);
  for (size_t off = 0; off < n; off += (1u << 20) + 5) p[off] = static_cast<uint8_t>(off >> 20 | 1);
  MemBacking& mb = MemBacking::instance();
  ASSERT_EQ(0, mb.acquire(p, n));
  EXPECT_EQ(n / kPage, mb.backed_pages());
  const MapsLine m = vma_of(p);
  EXPECT_TRUE(is_our_memfd(m));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p + n), m.end);  // chunks merged
  bool ok = true;
  for (size_t off = 0; off < n; off += (1u << 20) + 5) ok &= p[off] == static_cast<uint8_t>(off >> 20 | 1);
  EXPECT_TRUE(ok);
  EXPECT_EQ(0, p[7]);
  mb.release(p, n);
  for (size_t off = 0; off < n; off += (1u << 20) + 5) ok &= p[off] == static_cast<uint8_t>(off >> 20 | 1);
  EXPECT_TRUE(ok);
  munmap(p, n);
}

TEST(MemBacking, ReleaseRevokesPeerMapping) {
  const size_t n = 3 * kPage;
  auto* p = static_cast<uint8_t*>(map_anon(n));
  ASSERT_NE(nullptr, p);
  fill(p, n, 77);
  MemBacking& mb = MemBacking::instance();
  ASSERT_EQ(0, mb.acquire(p, n));
  View v(mb.fd(), p, n);
  ASSERT_TRUE(v.ok());
  EXPECT_TRUE(check(v.at, n, 77));
  mb.release(p, n);
  EXPECT_TRUE(all_zero(v.at, n));  // the peer's old mapping is revoked
  EXPECT_TRUE(check(p, n, 77));    // the application keeps its data
  v.at[0] = 1;                     // a peer's late write does not reach the application
  EXPECT_EQ(static_cast<uint8_t>(77), p[0]);
  p[1] = 5;
  EXPECT_EQ(0, v.at[1]);
  munmap(p, n);
}

TEST(MemBacking, PeersCannotShrinkTheFile) {
  MemBacking& mb = MemBacking::instance();
  void* p = malloc(64);
  ASSERT_EQ(0, mb.acquire(p, 64));
  EXPECT_EQ(-1, ftruncate(mb.fd(), 0));
  EXPECT_EQ(EPERM, errno);
  mb.release(p, 64);
  free(p);
}

TEST(MemBacking, RefusesUnmappedSharedStackAndSpecialRanges) {
  MemBacking& mb = MemBacking::instance();
  const size_t base = mb.backed_pages();

  auto* p = static_cast<uint8_t*>(map_anon(3 * kPage));
  ASSERT_NE(nullptr, p);
  fill(p, 3 * kPage, 4);
  ASSERT_EQ(0, munmap(p + kPage, kPage));
  EXPECT_EQ(EFAULT, mb.acquire(p, 3 * kPage));
  EXPECT_EQ(EFAULT, mb.acquire(p + kPage + 1, 1));
  EXPECT_EQ(base, mb.backed_pages());
  EXPECT_FALSE(any_page_ours(p, kPage));  // nothing converted on failure
  EXPECT_TRUE(check(p, kPage, 4));
  munmap(p, 3 * kPage);

  void* sh = mmap(nullptr, kPage, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(MAP_FAILED, sh);
  EXPECT_EQ(EOPNOTSUPP, mb.acquire(sh, 8));
  munmap(sh, kPage);

  // Private memory followed by shared memory: all or nothing.
  auto* q = static_cast<uint8_t*>(map_anon(2 * kPage));
  ASSERT_NE(nullptr, q);
  ASSERT_NE(MAP_FAILED, mmap(q + kPage, kPage, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS | MAP_FIXED, -1, 0));
  EXPECT_EQ(EOPNOTSUPP, mb.acquire(q, 2 * kPage));
  EXPECT_FALSE(any_page_ours(q, kPage));
  munmap(q, 2 * kPage);

  EXPECT_EQ(EOPNOTSUPP, mb.acquire(__builtin_frame_address(0), 8));  // [stack]
  const auto vdso = getauxval(AT_SYSINFO_EHDR);
  if (vdso != 0) {
    EXPECT_EQ(EOPNOTSUPP, mb.acquire(reinterpret_cast<void*>(vdso), 8));
  }
  EXPECT_EQ(base, mb.backed_pages());
}

TEST(MemBacking, StaleStateAfterMunmapAndRemap) {
  const size_t n = 4 * kPage;
  auto* p = static_cast<uint8_t*>(map_anon(n));
  ASSERT_NE(nullptr, p);
  fill(p, n, 1);
  MemBacking& mb = MemBacking::instance();
  ASSERT_EQ(0, mb.acquire(p, n));
  mb.release(p, n);

  // Same addresses, now someone else's shared memory: must be re-checked.
  ASSERT_EQ(0, munmap(p, n));
  ASSERT_EQ(p, mmap(p, n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS | MAP_FIXED, -1, 0));
  EXPECT_EQ(EOPNOTSUPP, mb.acquire(p, n));

  // And again fresh private memory with new contents.
  ASSERT_EQ(0, munmap(p, n));
  ASSERT_EQ(p, mmap(p, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0));
  fill(p, n, 2);
  ASSERT_EQ(0, mb.acquire(p, n));
  EXPECT_TRUE(check(p, n, 2));
  {
    View v(mb.fd(), p, n);
    ASSERT_TRUE(v.ok());
    EXPECT_TRUE(check(v.at, n, 2));
  }
  mb.release(p, n);
  EXPECT_TRUE(check(p, n, 2));
  munmap(p, n);
}

TEST(MemBacking, ReacquiresPagesAlreadyBackedByOurFile) {
  const size_t n = 2 * kPage;
  auto* p = static_cast<uint8_t*>(map_anon(n));
  ASSERT_NE(nullptr, p);
  MemBacking& mb = MemBacking::instance();
  ASSERT_EQ(0, mb.acquire(p, n));  // makes the file big enough
  mb.release(p, n);
  // Map our file at offset == address by hand (count 0, but ours).
  ASSERT_EQ(p, mmap(p, n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, mb.fd(), reinterpret_cast<off_t>(p)));
  fill(p, n, 8);
  ASSERT_EQ(0, mb.acquire(p, n));
  EXPECT_TRUE(check(p, n, 8));
  EXPECT_TRUE(mb.is_backed(p));
  mb.release(p, n);
  EXPECT_FALSE(any_page_ours(p, n));
  EXPECT_TRUE(check(p, n, 8));
  munmap(p, n);
}

// Whether this kernel can park VMAs (MREMAP_DONTUNMAP on anonymous memory).
bool kernel_has_dontunmap() {
  void* a = map_anon(kPage);
  void* b = map_anon(kPage);
  if (a == nullptr || b == nullptr) return false;
  const void* r = mremap(a, kPage, kPage, MREMAP_MAYMOVE | MREMAP_FIXED | 4 /* MREMAP_DONTUNMAP */, b);
  munmap(a, kPage);
  munmap(b, kPage);
  return r != MAP_FAILED;
}

size_t vma_count() { return read_maps().size(); }

TEST(MemBacking, ReleaseRestoresOriginalVmas) {
  if (!kernel_has_dontunmap()) GTEST_SKIP() << "no MREMAP_DONTUNMAP: reverted ranges stay separate VMAs";
  const size_t n = 64 * kPage;
  auto* p = static_cast<uint8_t*>(map_anon(n));
  ASSERT_NE(nullptr, p);
  fill(p, n, 12);
  MemBacking& mb = MemBacking::instance();
  for (size_t i = 0; i < 64; i += 2) ASSERT_EQ(0, mb.acquire(p + i * kPage + 1, 10));
  for (size_t i = 0; i < 64; i += 2) mb.release(p + i * kPage + 1, 10);
  const MapsLine m = vma_of(p + 5 * kPage);  // one VMA again (maybe merged with a neighbour)
  EXPECT_LE(m.start, reinterpret_cast<uintptr_t>(p));
  EXPECT_GE(m.end, reinterpret_cast<uintptr_t>(p + n));
  EXPECT_TRUE(check(p, n, 12));

  // Many register/deregister cycles on distinct heap buffers do not leave
  // VMAs behind (vm.max_map_count).
  // (Allocate first: the allocator may map new regions of its own.)
  std::vector<void*> bufs;
  auto len_of = [](size_t i) { return 3000 + i * 13; };
  for (size_t i = 0; i < 300; ++i) {
    bufs.push_back(malloc(len_of(i)));
    ASSERT_NE(nullptr, bufs.back());
  }
  const size_t before = vma_count();
  for (size_t i = 0; i < bufs.size(); ++i) {
    ASSERT_EQ(0, mb.acquire(bufs[i], len_of(i)));
    mb.release(bufs[i], len_of(i));
  }
  EXPECT_LE(vma_count(), before + 4);
  for (void* q : bufs) free(q);
  munmap(p, n);
}

TEST(MemBacking, PrivateFileMappingWithZeroPage) {
  char path[] = "/tmp/mem_backing_test_XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  unlink(path);
  const size_t n = 3 * kPage;
  std::vector<uint8_t> content(n, 0xab);
  ASSERT_EQ(static_cast<ssize_t>(n), pwrite(fd, content.data(), n, 0));
  auto* p = static_cast<uint8_t*>(mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0));
  ASSERT_NE(MAP_FAILED, p);
  std::memset(p + kPage, 0, kPage);  // a private all-zero copy over non-zero file data
  p[2 * kPage + 3] = 1;
  std::vector<uint8_t> expect(p, p + n);
  MemBacking& mb = MemBacking::instance();
  ASSERT_EQ(0, mb.acquire(p, n));
  EXPECT_EQ(0, std::memcmp(expect.data(), p, n));
  p[5] = 7;
  expect[5] = 7;
  mb.release(p, n);
  EXPECT_EQ(0, std::memcmp(expect.data(), p, n));
  EXPECT_FALSE(any_page_ours(p, n));
  uint8_t b = 0;  // the file itself is untouched
  ASSERT_EQ(1, pread(fd, &b, 1, static_cast<off_t>(kPage)));
  EXPECT_EQ(0xab, b);
  munmap(p, n);
  close(fd);
}

TEST(MemBacking, LockedMemory) {
  const size_t n = 2 * kPage;
  auto* p = static_cast<uint8_t*>(map_anon(n));
  ASSERT_NE(nullptr, p);
  if (mlock(p, n) != 0) {
    munmap(p, n);
    GTEST_SKIP() << "mlock not permitted";
  }
  std::memset(p, 0, n);
  p[kPage + 9] = 4;
  MemBacking& mb = MemBacking::instance();
  ASSERT_EQ(0, mb.acquire(p, n));
  p[3] = 5;
  mb.release(p, n);
  EXPECT_EQ(5, p[3]);
  EXPECT_EQ(4, p[kPage + 9]);
  EXPECT_EQ(0, p[kPage + 8]);
  EXPECT_EQ(0, p[100]);
  munmap(p, n);
}

TEST(MemBacking, RefusesTheCallersOwnThreadStack) {
  int rc = -1;
  std::thread([&] { rc = MemBacking::instance().acquire(__builtin_frame_address(0), 16); }).join();
  EXPECT_EQ(EOPNOTSUPP, rc);
}

// ---------------------------------------------------------------------------
// Concurrent writers.

// Writers increment counters at counter_offsets while the range is acquired
// and released `cycles` times; a reader watches a constant non-zero word at
// sentinel_offset (it must never read anything else, e.g. a zero page).
void hammer_during_cycles(uint8_t* region, size_t n, std::vector<size_t> counter_offsets, size_t sentinel_offset,
                          int cycles) {
  MemBacking& mb = MemBacking::instance();
  std::atomic<bool> stop{false};
  std::atomic<int> running{0};
  std::vector<uint64_t> done(counter_offsets.size(), 0);
  std::vector<std::thread> threads;
  for (size_t t = 0; t < counter_offsets.size(); ++t) {
    threads.emplace_back([&, t] {
      auto* ctr = reinterpret_cast<volatile uint64_t*>(region + counter_offsets[t]);
      uint64_t local = 0;
      running.fetch_add(1);
      while (!stop.load(std::memory_order_relaxed)) {
        if (t % 2 == 0) {
          *ctr = *ctr + 1;  // plain load + store
        } else {
          __atomic_fetch_add(const_cast<uint64_t*>(ctr), 1, __ATOMIC_RELAXED);  // locked RMW
        }
        ++local;
      }
      done[t] = local;
    });
  }
  const uint64_t sentinel = 0x0123456789abcdefULL;
  std::memcpy(region + sentinel_offset, &sentinel, sizeof sentinel);
  uint64_t bad_reads = 0, reads = 0;
  threads.emplace_back([&] {
    auto* w = reinterpret_cast<volatile uint64_t*>(region + sentinel_offset);
    running.fetch_add(1);
    while (!stop.load(std::memory_order_relaxed)) {
      bad_reads += *w != sentinel;
      ++reads;
    }
  });
  while (running.load() < static_cast<int>(threads.size())) std::this_thread::yield();
  int failures = 0;
  for (int i = 0; i < cycles; ++i) {
    failures += mb.acquire(region, n) != 0;
    std::this_thread::yield();
    mb.release(region, n);
  }
  stop = true;
  for (auto& th : threads) th.join();
  EXPECT_EQ(0, failures);
  for (size_t t = 0; t < counter_offsets.size(); ++t) {
    EXPECT_EQ(done[t], *reinterpret_cast<uint64_t*>(region + counter_offsets[t])) << "writer " << t;
    EXPECT_GT(done[t], 0u);
  }
  EXPECT_EQ(0u, bad_reads) << "of " << reads;
  EXPECT_GT(reads, 0u);
}

TEST(MemBacking, ConcurrentWritersLoseNothingAnonymous) {
  const size_t n = 4u << 20;
  auto* p = static_cast<uint8_t*>(map_anon(n + kPage));
  ASSERT_NE(nullptr, p);
  std::memset(p, 0x5a, n + kPage);  // non-zero: every page is copied, long windows
  for (size_t off : {size_t{0}, n / 2, n - 8, n}) std::memset(p + off, 0, 8);
  // Counters at the start, middle and end of the range, and one just past it.
  hammer_during_cycles(p, n, {0, n / 2, n - 8, n}, n / 4, 60);
  munmap(p, n + kPage);
}

TEST(MemBacking, ConcurrentWritersLoseNothingHeap) {
  const size_t n = 256 * 1024;
  auto* p = static_cast<uint8_t*>(calloc(1, n));
  ASSERT_NE(nullptr, p);
  std::memset(p + 64, 0x11, n - 64);
  hammer_during_cycles(p, n, {0, 32}, kPage + 8, 300);
  free(p);
}

TEST(MemBacking, ConcurrentRegistrationsFromManyThreads) {
  const size_t n = 16 * kPage;
  auto* p = static_cast<uint8_t*>(map_anon(n));
  ASSERT_NE(nullptr, p);
  fill(p, n, 6);
  MemBacking& mb = MemBacking::instance();
  const size_t base = mb.backed_pages();
  std::atomic<int> errors{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 100; ++i) {
        uint8_t* b = p + static_cast<size_t>((t * 3 + i) % 10) * kPage + static_cast<size_t>(i % 7);
        const size_t len = static_cast<size_t>(1 + (i * 977) % (5 * kPage));
        if (mb.acquire(b, len) != 0) errors.fetch_add(1);
        if (!mb.is_backed(b)) errors.fetch_add(1);
        mb.release(b, len);
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(0, errors.load());
  EXPECT_EQ(base, mb.backed_pages());
  EXPECT_FALSE(any_page_ours(p, n));
  EXPECT_TRUE(check(p, n, 6));
  munmap(p, n);
}

// ---------------------------------------------------------------------------
// Processes.

bool send_fd(int sock, int fd, const void* data, size_t len) {
  iovec iov{const_cast<void*>(data), len};
  alignas(cmsghdr) char ctl[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = ctl;
  msg.msg_controllen = sizeof ctl;
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(c), &fd, sizeof fd);
  return sendmsg(sock, &msg, 0) == static_cast<ssize_t>(len);
}

int recv_fd(int sock, void* data, size_t len) {
  iovec iov{data, len};
  alignas(cmsghdr) char ctl[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = ctl;
  msg.msg_controllen = sizeof ctl;
  if (recvmsg(sock, &msg, 0) != static_cast<ssize_t>(len)) return -1;
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  if (c == nullptr || c->cmsg_type != SCM_RIGHTS) return -1;
  int fd = -1;
  std::memcpy(&fd, CMSG_DATA(c), sizeof fd);
  return fd;
}

bool send_byte(int sock, char c) { return write(sock, &c, 1) == 1; }
char recv_byte(int sock) {
  char c = 0;
  return read(sock, &c, 1) == 1 ? c : '\0';
}

int wait_child(pid_t pid) {
  int status = 0;
  if (waitpid(pid, &status, 0) != pid) return -1;
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return 1000 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

struct Shared {
  uintptr_t addr;
  size_t len;
};

// The child is forked before anything is registered; it only ever sees the
// parent's memory through the fd it receives, like a real peer.
int peer_child(int sock) {
  Shared sh{};
  const int fd = recv_fd(sock, &sh, sizeof sh);
  if (fd < 0) return 2;
  const uintptr_t b = sh.addr & ~(kPage - 1);
  const size_t mlen = page_up(sh.addr + sh.len) - b;
  void* m = mmap(nullptr, mlen, PROT_READ | PROT_WRITE, MAP_SHARED, fd, static_cast<off_t>(b));
  if (m == MAP_FAILED) return 3;
  uint8_t* at = static_cast<uint8_t*>(m) + (sh.addr - b);
  if (!check(at, sh.len, 51)) return 4;
  std::memcpy(at + 10, "child", 5);
  if (!send_byte(sock, 'A')) return 5;
  if (recv_byte(sock) != 'B') return 6;
  if (std::memcmp(at + 20, "parent2", 7) != 0) return 7;
  if (!send_byte(sock, 'C')) return 8;
  if (recv_byte(sock) != 'D') return 9;
  if (!all_zero(m, mlen)) return 10;  // revoked
  return 0;
}

TEST(MemBacking, SecondProcessSeesAndWritesThroughFd) {
  int sv[2];
  ASSERT_EQ(0, socketpair(AF_UNIX, SOCK_STREAM, 0, sv));
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    close(sv[0]);
    _exit(peer_child(sv[1]));
  }
  close(sv[1]);
  const int sock = sv[0];
  const size_t n = 2 * kPage;
  auto* p = static_cast<uint8_t*>(map_anon(3 * kPage));
  ASSERT_NE(nullptr, p);
  uint8_t* buf = p + 100;
  fill(buf, n, 51);
  MemBacking& mb = MemBacking::instance();
  ASSERT_EQ(0, mb.acquire(buf, n));
  std::vector<uint8_t> expect(buf, buf + n);
  std::memcpy(expect.data() + 10, "child", 5);
  std::memcpy(expect.data() + 20, "parent2", 7);
  const Shared sh{reinterpret_cast<uintptr_t>(buf), n};
  ASSERT_TRUE(send_fd(sock, mb.fd(), &sh, sizeof sh));
  ASSERT_EQ('A', recv_byte(sock));
  EXPECT_EQ(0, std::memcmp(buf + 10, "child", 5));  // child's write visible here
  std::memcpy(buf + 20, "parent2", 7);
  ASSERT_TRUE(send_byte(sock, 'B'));
  ASSERT_EQ('C', recv_byte(sock));
  mb.release(buf, n);
  ASSERT_TRUE(send_byte(sock, 'D'));
  EXPECT_EQ(0, wait_child(pid));
  EXPECT_EQ(0, std::memcmp(expect.data(), buf, n));  // application keeps everything
  close(sock);
  munmap(p, 3 * kPage);
}

TEST(MemBacking, ForkChildGetsPrivateSnapshot) {
  const size_t n = 3 * kPage + 10;
  auto* p = static_cast<uint8_t*>(malloc(n));
  ASSERT_NE(nullptr, p);
  fill(p, n, 61);
  MemBacking& mb = MemBacking::instance();
  ASSERT_EQ(0, mb.acquire(p, n));
  struct stat parent_st {};
  ASSERT_EQ(0, fstat(mb.fd(), &parent_st));
  int c2p[2], p2c[2];
  ASSERT_EQ(0, pipe(c2p));
  ASSERT_EQ(0, pipe(p2c));
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    int rc = 0;
    if (mb.is_backed(p) || mb.backed_pages() != 0 || mb.fd() != -1) rc = 2;
    if (rc == 0 && any_page_ours(p, n)) rc = 3;
    if (rc == 0 && !check(p, n, 61)) rc = 4;
    if (rc == 0) std::memset(p, 0xee, n);
    if (!send_byte(c2p[1], 'x')) rc = rc ? rc : 5;
    if (recv_byte(p2c[0]) != 'y') rc = rc ? rc : 6;
    if (rc == 0 && p[0] != 0xee) rc = 7;  // parent's later write not visible
    // The child can register its own memory, with its own file.
    if (rc == 0 && mb.acquire(p, n) != 0) rc = 8;
    struct stat st {};
    if (rc == 0 && (fstat(mb.fd(), &st) != 0 || st.st_ino == parent_st.st_ino)) rc = 9;
    if (rc == 0 && p[5] != 0xee) rc = 10;
    if (rc == 0) std::memset(p, 0xdd, n);
    _exit(rc);
  }
  ASSERT_EQ('x', recv_byte(c2p[0]));
  EXPECT_TRUE(check(p, n, 61));  // child's writes did not reach us
  p[0] = 0x77;
  ASSERT_TRUE(send_byte(p2c[1], 'y'));
  EXPECT_EQ(0, wait_child(pid));
  EXPECT_EQ(0x77, p[0]);
  p[0] = 61;  // the pattern's first byte
  EXPECT_TRUE(check(p, n, 61));
  EXPECT_TRUE(mb.is_backed(p));
  EXPECT_TRUE(all_pages_ours(p, n));
  mb.release(p, n);
  for (int fd : {c2p[0], c2p[1], p2c[0], p2c[1]}) close(fd);
  free(p);
}

// The module keeps /proc/self/maps open between registrations.
// That file describes the process that opened it: a forked child must ask
// about its own address space. Memory the child maps after the fork, at
// an address the parent has nothing at, registers in the child (with the
// parent's file it would be refused as unmapped), and the parent's still
// does. A descriptor number the application closed and reused for a file
// of its own is neither queried nor closed.
TEST(MemBacking, TheKeptMapsFileFollowsForkAndClosedDescriptors) {
  MemBacking& mb = MemBacking::instance();
  auto* p = static_cast<uint8_t*>(map_anon(kPage));
  ASSERT_EQ(0, mb.acquire(p, kPage));  // the file is open now
  mb.release(p, kPage);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    auto* q = static_cast<uint8_t*>(map_anon(4 * kPage));
    // A range the parent never had: unmap the parent's page and map anew.
    int rc = 0;
    if (munmap(p, kPage) != 0) rc = 2;
    auto* r = static_cast<uint8_t*>(mmap(p, kPage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0));
    if (rc == 0 && r != p) rc = 3;
    if (rc == 0) {
      std::memset(q, 5, 4 * kPage);
      if (mb.acquire(q, 4 * kPage) != 0) rc = 4;
    }
    if (rc == 0 && !all_pages_ours(q, 4 * kPage)) rc = 5;
    if (rc == 0 && q[4 * kPage - 1] != 5) rc = 6;
    if (rc == 0) mb.release(q, 4 * kPage);
    _exit(rc);
  }
  EXPECT_EQ(0, wait_child(pid));
  // The module's descriptor of /proc/self/maps closed behind its back, and
  // its number given to a file of ours: the module opens its own again and
  // leaves ours alone.
  const std::string maps = "/proc/" + std::to_string(getpid()) + "/maps";
  int kept = -1;
  for (int fd = 3; fd < 1024 && kept < 0; ++fd) {
    char link[256];
    const ssize_t len = readlink(("/proc/self/fd/" + std::to_string(fd)).c_str(), link, sizeof link - 1);
    if (len > 0 && std::string(link, size_t(len)) == maps) kept = fd;
  }
  ASSERT_GE(kept, 0) << "the module keeps no " << maps << " open";
  ASSERT_EQ(0, close(kept));
  int devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
  ASSERT_GE(devnull, 0);
  if (devnull != kept) {
    ASSERT_EQ(kept, dup2(devnull, kept));
    close(devnull);
    devnull = kept;
  }
  struct stat before {};
  ASSERT_EQ(0, fstat(devnull, &before));
  std::memset(p, 6, kPage);
  EXPECT_EQ(0, mb.acquire(p, kPage));
  EXPECT_TRUE(all_pages_ours(p, kPage));
  mb.release(p, kPage);
  struct stat after {};
  EXPECT_EQ(0, fstat(devnull, &after));
  EXPECT_EQ(before.st_ino, after.st_ino);
  EXPECT_EQ(6, p[kPage - 1]);
  close(devnull);
  munmap(p, kPage);
}

// The SIGSEGV handler must not swallow genuine faults.
TEST(MemBackingDeathTest, GenuineFaultsStillCrash) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        auto* q = static_cast<volatile uint8_t*>(map_anon(kPage));
        std::memset(const_cast<uint8_t*>(q), 1, kPage);
        mprotect(const_cast<uint8_t*>(q), kPage, PROT_READ);
        if (MemBacking::instance().acquire(const_cast<uint8_t*>(q), kPage) != 0) _exit(0);
        q[0] = 2;  // write to a registered read-only page
        _exit(0);
      },
      "");
  EXPECT_DEATH(
      {
        void* keep = malloc(16);
        if (MemBacking::instance().acquire(keep, 16) != 0) _exit(0);  // handler installed
        *static_cast<volatile int*>(map_anon(kPage, PROT_READ)) = 1;  // unrelated fault
        _exit(0);
      },
      "");
}

}  // namespace

// read_maps() asks the kernel for the VMAs of a range (PROCMAP_QUERY) and
// reads the text of /proc/self/maps only where the kernel cannot answer
// (parsing the text was 41 % of a 4 KiB ibv_reg_mr + dereg).
// Both must describe every kind of mapping the module judges the same way:
// private and shared, anonymous, a memfd at an offset, shared anonymous
// memory, a deleted file, a named anonymous region, a hole, the stack.
TEST(Maps, TheKernelsQueryDescribesARangeAsTheTextDoes) {
  std::string probe;
  if (sv::describe_maps_for_test(0, 1, true, &probe) == ENOTTY) GTEST_SKIP() << "no PROCMAP_QUERY (Linux < 6.11)";
  const size_t pg = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  char* base = static_cast<char*>(mmap(nullptr, 16 * pg, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0));
  ASSERT_NE(base, MAP_FAILED);
  auto at = [&](int i) { return base + static_cast<size_t>(i) * pg; };
  ASSERT_NE(mmap(at(1), 2 * pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0), MAP_FAILED);
  ASSERT_NE(mmap(at(3), pg, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0), MAP_FAILED);
  const int mfd = memfd_create("sv-maps-test", MFD_CLOEXEC);
  ASSERT_GE(mfd, 0);
  ASSERT_EQ(ftruncate(mfd, static_cast<off_t>(4 * pg)), 0);
  ASSERT_NE(mmap(at(5), pg, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, mfd, static_cast<off_t>(2 * pg)), MAP_FAILED);
  ASSERT_NE(mmap(at(7), pg, PROT_READ | PROT_EXEC, MAP_PRIVATE | MAP_FIXED, mfd, 0), MAP_FAILED);
  ASSERT_NE(mmap(at(9), pg, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS | MAP_FIXED, -1, 0), MAP_FAILED);
  char path[] = "/tmp/sv-maps-test-XXXXXX";
  const int tfd = mkstemp(path);
  ASSERT_GE(tfd, 0);
  ASSERT_EQ(ftruncate(tfd, static_cast<off_t>(pg)), 0);
  ASSERT_NE(mmap(at(11), pg, PROT_READ, MAP_SHARED | MAP_FIXED, tfd, 0), MAP_FAILED);
  unlink(path);
  ASSERT_NE(mmap(at(13), pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0), MAP_FAILED);
  prctl(PR_SET_VMA, PR_SET_VMA_ANON_NAME, reinterpret_cast<unsigned long>(at(13)), pg, "sv-test");  // best effort
  ASSERT_EQ(munmap(at(15), pg), 0);
  close(mfd);
  close(tfd);

  std::string q, t;
  const uintptr_t lo = reinterpret_cast<uintptr_t>(base), hi = lo + 16 * pg;
  ASSERT_EQ(sv::describe_maps_for_test(lo, hi, true, &q), 0);
  ASSERT_EQ(sv::describe_maps_for_test(lo, hi, false, &t), 0);
  EXPECT_EQ(q, t);
  EXPECT_GE(std::count(q.begin(), q.end(), '\n'), 13) << q;
  EXPECT_NE(q.find("/memfd:sv-maps-test (deleted)"), std::string::npos) << q;
  EXPECT_NE(q.find(" (deleted)\n"), std::string::npos) << q;
  // A range inside one mapping, and a hole with nothing mapped.
  ASSERT_EQ(sv::describe_maps_for_test(lo + pg + 100, lo + pg + 200, true, &q), 0);
  ASSERT_EQ(sv::describe_maps_for_test(lo + pg + 100, lo + pg + 200, false, &t), 0);
  EXPECT_EQ(q, t);
  ASSERT_EQ(sv::describe_maps_for_test(hi - pg, hi, true, &q), 0);
  ASSERT_EQ(sv::describe_maps_for_test(hi - pg, hi, false, &t), 0);
  EXPECT_EQ(q, t);
  // The stack this thread runs on.
  int local = 0;
  const uintptr_t sp = reinterpret_cast<uintptr_t>(&local);
  ASSERT_EQ(sv::describe_maps_for_test(sp, sp + 1, true, &q), 0);
  ASSERT_EQ(sv::describe_maps_for_test(sp, sp + 1, false, &t), 0);
  EXPECT_EQ(q, t);
  munmap(base, 16 * pg);
}
