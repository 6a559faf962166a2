// The capture ring (capture_ring.h): in order, a slow reader loses the
// oldest packets and counts them, a slot left unfinished is skipped, a
// writer's rules on what it maps, and nothing a writer forges makes the
// reader copy more than a slot.
#include "common/capture_ring.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <memory>
#include <vector>

namespace sv::capture {
namespace {

struct TempRing {
  std::string path = "/dev/shm/softverbs-capture-test-" + std::to_string(getpid());
  Ring reader;
  TempRing() {
    std::string why;
    EXPECT_EQ(0, reader.create(path, getuid(), &why)) << why;
  }
  ~TempRing() { unlink(path.c_str()); }
};

std::vector<uint8_t> packet(uint8_t tag, size_t n = 60) { return std::vector<uint8_t>(n, tag); }

TEST(CaptureRing, InOrderThenNothing) {
  TempRing t;
  Ring w;
  ASSERT_EQ(0, w.open_writer(t.path));
  for (uint8_t i = 0; i < 5; i++) w.write(packet(i), 7, 100 + i);
  auto s = std::make_unique<Slot>();
  uint64_t lost = 0;
  for (uint8_t i = 0; i < 5; i++) {
    ASSERT_TRUE(t.reader.read(*s, &lost));
    EXPECT_EQ(i, s->data[0]);
    EXPECT_EQ(60u, s->len);
    EXPECT_EQ(7u, s->qpn);
    EXPECT_EQ(uint32_t(getpid()), s->pid);
  }
  EXPECT_FALSE(t.reader.read(*s, &lost));
  EXPECT_EQ(0u, lost);
}

TEST(CaptureRing, ASlowReaderLosesTheOldestAndCountsThem) {
  TempRing t;
  Ring w;
  ASSERT_EQ(0, w.open_writer(t.path));
  const uint64_t n = kSlots + 100;
  for (uint64_t i = 0; i < n; i++) w.write(packet(uint8_t(i)), 0, i);
  auto s = std::make_unique<Slot>();
  uint64_t lost = 0, got = 0;
  while (t.reader.read(*s, &lost)) got++;
  EXPECT_EQ(100u, lost);
  EXPECT_EQ(uint64_t(kSlots), got);
}

TEST(CaptureRing, LongPacketsAreCutToASlot) {
  TempRing t;
  Ring w;
  ASSERT_EQ(0, w.open_writer(t.path));
  w.write(packet(9, kSlotData + 500), 0, 0);
  auto s = std::make_unique<Slot>();
  uint64_t lost = 0;
  ASSERT_TRUE(t.reader.read(*s, &lost));
  EXPECT_EQ(kSlotData, s->len);
  EXPECT_EQ(kSlotData + 500, s->orig_len);
}

TEST(CaptureRing, ForgedLengthsAndAnUnfinishedSlot) {
  TempRing t;
  Ring w;
  ASSERT_EQ(0, w.open_writer(t.path));
  w.write(packet(1), 0, 0);
  w.write(packet(2), 0, 0);
  // A writer forges the first slot's length, and leaves a third unfinished
  // (as one killed in the middle would).
  auto* slots = reinterpret_cast<Slot*>(reinterpret_cast<uint8_t*>(w.header()) + 4096);
  slots[0].len = 0xffffffff;
  w.header()->next.fetch_add(1);
  slots[2].seq.store(5);
  auto s = std::make_unique<Slot>();
  uint64_t lost = 0;
  ASSERT_TRUE(t.reader.read(*s, &lost));
  EXPECT_EQ(kSlotData, s->len);
  ASSERT_TRUE(t.reader.read(*s, &lost));
  EXPECT_EQ(2, s->data[0]);
  EXPECT_FALSE(t.reader.read(*s, &lost));  // unfinished: waited for a while
  usleep(150'000);
  EXPECT_FALSE(t.reader.read(*s, &lost));  // then skipped
  EXPECT_EQ(1u, lost);
}

TEST(CaptureRing, AWriterMapsOnlyItsUsersOwnPrivateRing) {
  TempRing t;
  Ring w;
  ASSERT_EQ(0, chmod(t.path.c_str(), 0644));
  EXPECT_EQ(EPERM, w.open_writer(t.path));
  ASSERT_EQ(0, chmod(t.path.c_str(), 0600));
  const std::string link = t.path + ".link";
  ASSERT_EQ(0, symlink(t.path.c_str(), link.c_str()));
  EXPECT_EQ(ELOOP, w.open_writer(link));
  unlink(link.c_str());
  const std::string small = t.path + ".small";
  int fd = open(small.c_str(), O_CREAT | O_RDWR | O_EXCL, 0600);
  ASSERT_GE(fd, 0);
  close(fd);
  EXPECT_EQ(EPERM, w.open_writer(small));
  unlink(small.c_str());
  EXPECT_EQ(0, w.open_writer(t.path));
}

}  // namespace
}  // namespace sv::capture
