// The cache of backing windows (backing_windows.h).
#include "daemon/backing_windows.h"

#include <sys/mman.h>

#include <vector>

namespace sv::daemon {

BackingWindows::Window::~Window() {
  if (base) ::munmap(base, kWindow);
}

std::shared_ptr<BackingWindows::Window> BackingWindows::map(int fd, uint64_t index) {
  if (fd < 0) return nullptr;
  const uint64_t off = index * kStride;
  // Not populated: only what copies touch is faulted in, once.
  void* m = ::mmap(nullptr, kWindow, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, off_t(off));
  if (m == MAP_FAILED) return nullptr;
  auto w = std::make_shared<Window>();
  w->base = static_cast<uint8_t*>(m);
  w->off = off;
  return w;
}

uint8_t* BackingWindows::at(uint32_t backing, int fd, uint64_t off, std::shared_ptr<Window>& hold) {
  const uint64_t index = off / kStride;
  {
    std::lock_guard<std::mutex> g(mu_);
    auto it = windows_.find({backing, index});
    if (it != windows_.end()) {
      it->second.used = ++tick_;
      hold = it->second.w;
      return hold->base + (off - hold->off);
    }
  }
  // Mapped outside the lock (the loop's small copies need not wait for it).
  std::shared_ptr<Window> w = map(fd, index);
  if (!w) return nullptr;
  std::lock_guard<std::mutex> g(mu_);
  if (live_.count(backing)) {
    auto [it, fresh] = windows_.try_emplace({backing, index});
    if (fresh) {
      if (windows_.size() > kMaxWindows) {
        it->second.used = UINT64_MAX;  // not the one evicted
        evict_one();
      }
      it->second.w = w;
    } else {
      w = it->second.w;  // another thread mapped it meanwhile: ours goes
    }
    it->second.used = ++tick_;
  }
  hold = std::move(w);
  return hold->base + (off - hold->off);
}

void BackingWindows::evict_one() {
  auto oldest = windows_.begin();
  for (auto it = windows_.begin(); it != windows_.end(); ++it)
    if (it->second.used < oldest->second.used) oldest = it;
  if (oldest != windows_.end()) windows_.erase(oldest);
}

void BackingWindows::live(uint32_t backing) {
  std::lock_guard<std::mutex> g(mu_);
  live_.insert(backing);
}

void BackingWindows::forget(uint32_t backing) {
  std::vector<std::shared_ptr<Window>> unmap_after;  // destroyed after the lock is released
  std::lock_guard<std::mutex> g(mu_);
  live_.erase(backing);
  auto it = windows_.lower_bound({backing, 0});
  while (it != windows_.end() && it->first.first == backing) {
    unmap_after.push_back(std::move(it->second.w));
    it = windows_.erase(it);
  }
}

size_t BackingWindows::cached() const {
  std::lock_guard<std::mutex> g(mu_);
  return windows_.size();
}

}  // namespace sv::daemon
