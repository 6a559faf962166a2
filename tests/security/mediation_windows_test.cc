// The daemon's mappings of backings: mediated copies go
// through windows the daemon keeps of each backing (daemon/backing_windows.h)
// instead of pread/pwrite. What must hold: copies across window boundaries
// of a huge sparse backing are exact and touch nothing else; a backing whose
// owner punches holes in it (what deregistration does) neither crashes the
// daemon nor lets old bytes through; the daemon keeps no mapping of a
// backing once it is released (it pins no user's memory after use).
#include <fcntl.h>
#include <sys/stat.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <span>
#include <thread>
#include <vector>

#include "attack.h"

namespace svsec {
namespace {

using sv::proto::Op;

constexpr uint64_t kWinTiB = 1ull << 40;
constexpr const char* kWinBackingName = "softverbs-test-backing";  // attack.cc's sealed_backing

// Whether the daemon maps a file of the tests' backing name.
bool daemon_maps_a_backing(pid_t daemon) {
  std::ifstream maps("/proc/" + std::to_string(daemon) + "/maps");
  std::string line;
  while (std::getline(maps, line))
    if (line.find(kWinBackingName) != std::string::npos) return true;
  return false;
}

std::vector<uint8_t> win_pattern(uint64_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (uint64_t i = 0; i < n; ++i) v[i] = uint8_t(i * 13 + seed + (i >> 11));
  return v;
}

// An MR of 2 * kWinHalf + 16 bytes just below 1 TiB of a sparse backing, so
// each half crosses a window boundary (window strides divide 1 TiB).
constexpr uint64_t kWinHalf = (2ull << 20) + 5;
constexpr uint64_t kWinMrAt = kWinTiB - kWinHalf - 4099;
constexpr uint64_t kWinMrLen = 2 * kWinHalf + 16;

TEST(MediationWindows, CopiesAcrossWindowsOfASparseBackingAreExact) {
  SystemDaemon sysd;
  ASSERT_TRUE(sysd.alive());
  RawConn raw(sysd.socket());
  sv::proto::MediateReq req{};
  sv::Fd mfd;
  ASSERT_TRUE(raw_mediated_pair(raw, kWinMrLen, req, &mfd, kWinMrAt, 4096));
  const std::vector<uint8_t> a = win_pattern(kWinHalf, 3);
  ASSERT_EQ(ssize_t(kWinHalf), pwrite(mfd.get(), a.data(), kWinHalf, off_t(kWinMrAt)));
  const uint8_t guard[8] = {9, 9, 9, 9, 9, 9, 9, 9};
  ASSERT_EQ(8, pwrite(mfd.get(), guard, 8, off_t(kWinMrAt + 2 * kWinHalf)));  // just after the destination
  // WRITE the first half onto the second, in two SGEs split at an odd place.
  req.num_sge = 2;
  req.sge[0] = {kWinMrAt, 777, req.rkey};
  req.sge[1] = {kWinMrAt + 777, uint32_t(kWinHalf - 777), req.rkey};
  req.remote_addr = kWinMrAt + kWinHalf;
  sv::proto::MediateReply rep{};
  ASSERT_EQ(0, raw.call(Op::Mediate, req, rep));
  ASSERT_EQ(sv::proto::kMediateDone, rep.outcome);
  std::vector<uint8_t> got(kWinHalf);
  ASSERT_EQ(ssize_t(kWinHalf), pread(mfd.get(), got.data(), kWinHalf, off_t(kWinMrAt + kWinHalf)));
  EXPECT_TRUE(got == a);
  uint8_t after[8] = {};
  ASSERT_EQ(8, pread(mfd.get(), after, 8, off_t(kWinMrAt + 2 * kWinHalf)));
  EXPECT_EQ(0, memcmp(after, guard, 8)) << "a byte past the WRITE changed";
  // READ it back into the cleared first half.
  const std::vector<uint8_t> zero(kWinHalf, 0);
  ASSERT_EQ(ssize_t(kWinHalf), pwrite(mfd.get(), zero.data(), kWinHalf, off_t(kWinMrAt)));
  req.opcode = IBV_WR_RDMA_READ;
  ASSERT_EQ(0, raw.call(Op::Mediate, req, rep));
  ASSERT_EQ(sv::proto::kMediateDone, rep.outcome);
  ASSERT_EQ(ssize_t(kWinHalf), pread(mfd.get(), got.data(), kWinHalf, off_t(kWinMrAt)));
  EXPECT_TRUE(got == a);
  // An atomic on the last quadword below 1 TiB, then one byte past the MR: refused.
  req.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
  req.num_sge = 1;
  req.sge[0] = {kWinMrAt + 8, 8, req.rkey};
  req.remote_addr = kWinTiB - 8;  // 8-aligned, in the MR, just below a window boundary
  req.compare_add = 5;
  ASSERT_EQ(0, raw.call(Op::Mediate, req, rep));
  ASSERT_EQ(sv::proto::kMediateDone, rep.outcome);
  req.opcode = IBV_WR_RDMA_WRITE;
  req.sge[0] = {kWinMrAt, 1, req.rkey};
  req.remote_addr = kWinMrAt + kWinMrLen;
  ASSERT_EQ(0, raw.call(Op::Mediate, req, rep));
  EXPECT_EQ(sv::proto::kMediateError, rep.outcome);
  EXPECT_TRUE(sysd.alive());
}

TEST(MediationWindows, PunchedHolesInAMappedBackingReadZerosAndHarmNothing) {
  SystemDaemon sysd;
  ASSERT_TRUE(sysd.alive());
  RawConn raw(sysd.socket());
  sv::proto::MediateReq req{};
  sv::Fd mfd;
  ASSERT_TRUE(raw_mediated_pair(raw, kWinMrLen, req, &mfd, kWinMrAt, 4096));
  const std::vector<uint8_t> a = win_pattern(kWinHalf, 7);
  ASSERT_EQ(ssize_t(kWinHalf), pwrite(mfd.get(), a.data(), kWinHalf, off_t(kWinMrAt)));
  req.sge[0] = {kWinMrAt, uint32_t(kWinHalf), req.rkey};
  req.remote_addr = kWinMrAt + kWinHalf;
  for (int round = 0; round < 3; ++round) {
    sv::proto::MediateReply rep{};
    ASSERT_EQ(0, raw.call(Op::Mediate, req, rep));  // the daemon now maps both halves
    ASSERT_EQ(sv::proto::kMediateDone, rep.outcome);
    // The owner punches the whole file out from under the daemon's windows
    // (deregistration punches what it converts back), as hostile as it likes.
    ASSERT_EQ(0, fallocate(mfd.get(), FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, off_t(kWinMrAt + kWinMrLen + 4096)));
    ASSERT_EQ(0, raw.call(Op::Mediate, req, rep));
    ASSERT_EQ(sv::proto::kMediateDone, rep.outcome) << "round " << round;
    std::vector<uint8_t> got(kWinHalf, 1);
    ASSERT_EQ(ssize_t(kWinHalf), pread(mfd.get(), got.data(), kWinHalf, off_t(kWinMrAt + kWinHalf)));
    EXPECT_TRUE(std::all_of(got.begin(), got.end(), [](uint8_t b) { return b == 0; }))
        << "bytes from before the punch came through";
    ASSERT_EQ(ssize_t(kWinHalf), pwrite(mfd.get(), a.data(), kWinHalf, off_t(kWinMrAt)));
  }
  // The file cannot shrink under the daemon's windows (sealed).
  EXPECT_NE(0, ftruncate(mfd.get(), 4096));
  EXPECT_TRUE(sysd.alive());
}

TEST(MediationWindows, TheDaemonUnmapsABackingOnceItIsReleased) {
  SystemDaemon sysd;
  ASSERT_TRUE(sysd.alive());
  {
    RawConn raw(sysd.socket());
    sv::proto::MediateReq req{};
    sv::Fd mfd;
    ASSERT_TRUE(raw_mediated_pair(raw, kWinMrLen, req, &mfd, kWinMrAt, 4096));
    sv::proto::MediateReply rep{};
    ASSERT_EQ(0, raw.call(Op::Mediate, req, rep));
    ASSERT_EQ(sv::proto::kMediateDone, rep.outcome);
    ASSERT_TRUE(daemon_maps_a_backing(sysd.pid)) << "the test would prove nothing: no window was kept";
  }  // the connection closes: its context, MR and backing are released
  bool mapped = true;
  for (int i = 0; i < 200 && (mapped = daemon_maps_a_backing(sysd.pid)); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_FALSE(mapped) << "the daemon still maps a released user's memory";
  EXPECT_TRUE(sysd.alive());
}

// Deregistration revokes at once: a large copy on the daemon's copy worker
// over an MR that a second connection of its context deregisters lands no
// byte after the deregistration's reply (it is failed, or it had finished).
TEST(MediationWindows, NoByteOfACopyLandsAfterItsMrIsDeregistered) {
  constexpr uint64_t kLen = 64ull << 20;  // well over the loop's 1 MiB: the copy worker's
  SystemDaemon sysd;
  ASSERT_TRUE(sysd.alive());
  RawConn raw(sysd.socket());
  sv::proto::MediateReq req{};
  sv::Fd mfd;
  uint32_t mr = 0;
  ASSERT_TRUE(raw_mediated_pair(raw, 2 * kLen, req, &mfd, 0, 0, &mr));
  const std::vector<uint8_t> a(kLen, 0x5a);
  ASSERT_EQ(ssize_t(kLen), pwrite(mfd.get(), a.data(), kLen, 0));
  RawConn other(sysd.socket());  // a second connection of the same context
  sv::proto::Empty hello{};
  sv::proto::HelloReply hrep{};
  std::vector<sv::Fd> fds;
  ASSERT_EQ(0, other.call(Op::Hello, hello, hrep, {}, &fds));
  struct stat sst {};
  ASSERT_EQ(0, fstat(raw.fd(), &sst));
  sv::proto::ClaimSocketReq claim{};
  claim.inode = sst.st_ino;
  ASSERT_EQ(0, raw.call(Op::ClaimSocket, claim));
  sv::proto::Empty imp{};
  const int cmd_fd = raw.fd();
  ASSERT_EQ(0, other.call(Op::ImportContext, imp, std::span<const int>(&cmd_fd, 1)));
  req.sge[0].length = uint32_t(kLen);
  req.remote_addr = kLen;
  sv::proto::MediateReply rep{};
  int st = -1;
  std::thread copier([&] { st = raw.call(Op::Mediate, req, rep); });
  uint8_t first = 0;  // the copy has begun
  for (int i = 0; i < 200000 && first == 0; ++i) ASSERT_EQ(1, pread(mfd.get(), &first, 1, off_t(kLen)));
  sv::proto::HandleReq dereg{};
  dereg.handle = mr;
  EXPECT_EQ(0, other.call(Op::DeregMr, dereg));
  // What the library's deregistration does next: the pages go back to the
  // process and the range is punched out of the file. A byte written after
  // this point would be a byte landed after DeregMr returned.
  ASSERT_EQ(0, fallocate(mfd.get(), FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, off_t(kLen), off_t(kLen)));
  copier.join();
  ASSERT_EQ(0, st);
  // Failed by the deregistration (kMediateError), unless the machine was so
  // slow to deliver DeregMr that the copy had finished (then it tests nothing).
  if (rep.outcome == sv::proto::kMediateDone) std::fprintf(stderr, "note: the copy finished before DeregMr\n");
  std::vector<uint8_t> later(kLen);
  ASSERT_EQ(ssize_t(kLen), pread(mfd.get(), later.data(), kLen, off_t(kLen)));
  EXPECT_EQ(size_t(0), size_t(std::count(later.begin(), later.end(), 0x5a)))
      << "bytes of the copy landed after DeregMr returned";
  EXPECT_TRUE(sysd.alive());
}

}  // namespace
}  // namespace svsec
