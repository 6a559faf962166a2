// The daemon's cache of backing windows (backing_windows.h): where a byte
// is, what is cached and for how long, and that a window a copy holds stays
// mapped whatever the cache does meanwhile.
#include "daemon/backing_windows.h"

#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>

#include "common/sys.h"

namespace sv::daemon {
namespace {

using W = BackingWindows;

Fd sparse_file(uint64_t size) {
  Fd fd(::memfd_create("backing-windows-test", MFD_CLOEXEC));
  EXPECT_EQ(0, ::ftruncate(fd.get(), off_t(size)));
  return fd;
}

TEST(BackingWindows, ABytesAddressIsItsFileOffsetInTheWindowOfItsFirstByte) {
  const uint64_t size = 3 * W::kStride;
  Fd fd = sparse_file(size);
  W win;
  win.live(7);
  // The last byte of a stride and the first of the next: each window
  // reaches at least a stride beyond the byte asked for.
  for (uint64_t off : {uint64_t(0), W::kStride - 1, W::kStride, 2 * W::kStride + 5}) {
    std::shared_ptr<W::Window> h;
    uint8_t* p = win.at(7, fd.get(), off, h);
    ASSERT_NE(nullptr, p);
    EXPECT_GE(W::reach(off), W::kStride);
    *p = uint8_t(off + 1);
    uint8_t got = 0;
    ASSERT_EQ(1, ::pread(fd.get(), &got, 1, off_t(off)));
    EXPECT_EQ(uint8_t(off + 1), got);
  }
  EXPECT_EQ(3u, win.cached());  // windows 0, 1 and 2
}

TEST(BackingWindows, OnlyLiveBackingsAreCachedAndForgetDropsThemButNotAHeldWindow) {
  Fd fd = sparse_file(W::kWindow);
  W win;
  std::shared_ptr<W::Window> h;
  ASSERT_NE(nullptr, win.at(1, fd.get(), 100, h));
  EXPECT_EQ(0u, win.cached()) << "a backing no key was resolved for (or released) is never cached";
  win.live(1);
  uint8_t* p = win.at(1, fd.get(), 100, h);
  ASSERT_NE(nullptr, p);
  EXPECT_EQ(1u, win.cached());
  win.forget(1);
  EXPECT_EQ(0u, win.cached());
  *p = 42;  // still mapped: the copy holding it finishes
  uint8_t got = 0;
  ASSERT_EQ(1, ::pread(fd.get(), &got, 1, 100));
  EXPECT_EQ(42, got);
  h.reset();
  ASSERT_NE(nullptr, win.at(1, fd.get(), 100, h));
  EXPECT_EQ(0u, win.cached()) << "a released backing came back into the cache";
}

TEST(BackingWindows, TheCacheIsBoundedAndEvictsTheLeastRecentlyUsed) {
  const uint64_t n = W::kMaxWindows + 8;
  Fd fd = sparse_file((n + 1) * W::kStride);
  W win;
  win.live(3);
  std::shared_ptr<W::Window> first;
  ASSERT_NE(nullptr, win.at(3, fd.get(), 0, first));
  for (uint64_t i = 1; i < n; ++i) {
    std::shared_ptr<W::Window> h;
    ASSERT_NE(nullptr, win.at(3, fd.get(), i * W::kStride, h));
    std::shared_ptr<W::Window> again;
    ASSERT_NE(nullptr, win.at(3, fd.get(), 0, again));  // window 0 stays the most recently used
    EXPECT_LE(win.cached(), W::kMaxWindows);
  }
  std::shared_ptr<W::Window> h0;
  win.at(3, fd.get(), 0, h0);
  EXPECT_EQ(first.get(), h0.get()) << "the most recently used window was evicted";
  std::shared_ptr<W::Window> h1;
  win.at(3, fd.get(), W::kStride, h1);
  EXPECT_NE(nullptr, h1);
  win.forget(3);
  EXPECT_EQ(0u, win.cached());
}

TEST(BackingWindows, AnUnmappableDescriptorGivesNullNotACrash) {
  W win;
  win.live(9);
  std::shared_ptr<W::Window> h;
  EXPECT_EQ(nullptr, win.at(9, -1, 0, h));
  Fd ro(::memfd_create("backing-windows-ro", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  ASSERT_EQ(0, ::ftruncate(ro.get(), 4096));
  ASSERT_EQ(0, ::fcntl(ro.get(), F_ADD_SEALS, F_SEAL_WRITE));
  EXPECT_EQ(nullptr, win.at(9, ro.get(), 0, h)) << "a write-sealed file mapped writable";
  EXPECT_EQ(0u, win.cached());
}

}  // namespace
}  // namespace sv::daemon
