// backing_windows.h: the daemon's cached mappings of backing files, for
// mediated copies between users.
//
// A mediated copy moves bytes between two backings with memcpy through
// mappings kept here, instead of pread/pwrite through a bounce buffer (two
// copies, four system calls per 64 KiB) or a mapping per copy (whose munmap
// is a TLB shootdown on every copy). A backing's file offset is its owner's
// virtual address, so it is sparse and huge and is never mapped whole: it is
// mapped in windows. Window k covers [k*kStride, k*kStride + 2*kStride), so
// any piece of up to kStride bytes lies inside the window of its first byte.
//
// Why a mapping cannot harm the daemon: a backing is a tmpfs memfd sealed
// against shrinking for good (pd.cc, reg_backing; the daemon's own region and
// device-memory files are sealed at their size), and a copy touches only
// bytes a key granted (common/access.h), which lie inside the file's size as
// checked at registration. So no access is beyond the end of the file (no
// SIGBUS). A range the owner punched out (deregistered) reads zeros and
// takes writes into the file, as pread/pwrite would; the owner does not map
// it any more. A window beyond the file's end is mapped but never touched there.
//
// Windows are kept until their backing is released (forget) or, beyond
// kMaxWindows, the least recently used is unmapped. A window in use by a
// copy stays mapped until that copy lets go of it (shared ownership), so the
// loop and the copy worker may both use the cache. Thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_set>

namespace sv::daemon {

class BackingWindows {
 public:
  static constexpr uint64_t kStride = 32ull << 20;
  static constexpr uint64_t kWindow = 2 * kStride;
  static constexpr size_t kMaxWindows = 256;  // 16 GiB of address space, 256 VMAs

  struct Window {
    uint8_t* base = nullptr;
    uint64_t off = 0;  // the file offset of base
    Window() = default;
    Window(const Window&) = delete;
    Window& operator=(const Window&) = delete;
    ~Window();
  };
  // Where the byte at `off` of backing `backing` (descriptor `fd`) is in the
  // daemon, valid for at least min(kStride, what is asked) bytes from there:
  // `hold` keeps it mapped. Null if it cannot be mapped (the caller falls
  // back to pread/pwrite). A backing not (or no longer) live is mapped for
  // this use alone, not cached.
  uint8_t* at(uint32_t backing, int fd, uint64_t off, std::shared_ptr<Window>& hold);
  // Bytes from `off` that the window of `off` covers.
  static uint64_t reach(uint64_t off) { return (off / kStride) * kStride + kWindow - off; }

  // The backing exists (the loop resolved a key of it): its windows may be cached.
  void live(uint32_t backing);
  // The backing is released: its windows are dropped (unmapped once no copy holds them).
  void forget(uint32_t backing);
  size_t cached() const;

 private:
  struct Entry {
    std::shared_ptr<Window> w;
    uint64_t used = 0;
  };
  using Key = std::pair<uint32_t, uint64_t>;  // (backing, window index)
  static std::shared_ptr<Window> map(int fd, uint64_t index);
  void evict_one();

  mutable std::mutex mu_;
  std::map<Key, Entry> windows_;
  std::unordered_set<uint32_t> live_;
  uint64_t tick_ = 0;
};

}  // namespace sv::daemon
