#include "common/fence.h"
#include "common/capture_ring.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>

#include "common/paths.h"

namespace sv::capture {

uint64_t now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
}

std::string ring_path(uint32_t uid, const std::string& dir) {
  struct stat st {};
  if (dir.empty() || ::stat(dir.c_str(), &st) != 0) return "";
  char buf[128];
  std::snprintf(buf, sizeof buf, "/dev/shm/softverbs-capture-%u-%llx-%llx", uid,
                (unsigned long long)st.st_dev, (unsigned long long)st.st_ino);
  return buf;
}

std::string daemon_dir() { return use_system_daemon() ? system_dir() : resolve_runtime_dir(); }

Ring::~Ring() {
  if (hdr_) ::munmap(hdr_, ring_size());
}

int Ring::open_writer(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return errno;
  struct stat st {};
  int e = 0;
  if (::fstat(fd, &st) != 0) e = errno;
  else if (!S_ISREG(st.st_mode) || st.st_uid != ::getuid() || (st.st_mode & 07777) != 0600 ||
           size_t(st.st_size) != ring_size())
    e = EPERM;
  void* p = e ? MAP_FAILED : ::mmap(nullptr, ring_size(), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (!e && p == MAP_FAILED) e = errno;
  ::close(fd);
  if (e) return e;
  auto* h = static_cast<RingHeader*>(p);
  if (h->magic != kRingMagic || h->slots != kSlots) {
    ::munmap(p, ring_size());
    return EPROTO;
  }
  hdr_ = h;
  slots_ = reinterpret_cast<Slot*>(static_cast<uint8_t*>(p) + 4096);
  return 0;
}

int Ring::create(const std::string& path, uint32_t uid, std::string* why) {
  std::string tmp = path + ".new." + std::to_string(::getpid());
  int fd = ::open(tmp.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  auto fail = [&](const char* what) {
    int e = errno;
    if (why) *why = std::string(what) + " " + tmp + ": " + std::strerror(e);
    if (fd >= 0) ::close(fd), ::unlink(tmp.c_str());
    return e;
  };
  if (fd < 0) return fail("cannot create");
  if (::fchmod(fd, 0600) != 0) return fail("cannot chmod");
  if (::getuid() != uid && ::fchown(fd, uid, uid_t(-1)) != 0) return fail("cannot give to the user");
  if (::ftruncate(fd, off_t(ring_size())) != 0) return fail("cannot size");
  void* p = ::mmap(nullptr, ring_size(), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return fail("cannot map");
  auto* h = static_cast<RingHeader*>(p);
  h->magic = kRingMagic;
  h->slots = kSlots;
  h->reader_pid.store(uint32_t(::getpid()));
  hdr_ = h;
  slots_ = reinterpret_cast<Slot*>(static_cast<uint8_t*>(p) + 4096);
  if (::rename(tmp.c_str(), path.c_str()) != 0) return fail("cannot rename");
  ::close(fd);
  return 0;
}

void Ring::write(std::span<const uint8_t> ip, uint32_t qpn, uint64_t time_ns) {
  const uint64_t i = hdr_->next.fetch_add(1, std::memory_order_relaxed);
  Slot& s = slots_[i % kSlots];
  s.seq.store(2 * i + 1, std::memory_order_relaxed);
  fence_release();
  const size_t n = ip.size() < kSlotData ? ip.size() : kSlotData;
  s.time_ns = time_ns;
  s.len = uint32_t(n);
  s.orig_len = uint32_t(ip.size());
  s.pid = uint32_t(::getpid());
  s.qpn = qpn;
  std::memcpy(s.data, ip.data(), n);
  s.seq.store(2 * i + 2, std::memory_order_release);
}

bool Ring::read(Slot& out, uint64_t* lost) {
  const uint64_t next = hdr_->next.load(std::memory_order_acquire);
  if (next > tail_ + kSlots) {  // lapped: the oldest are gone
    *lost += next - kSlots - tail_;
    tail_ = next - kSlots;
  }
  if (tail_ >= next) return false;
  Slot& s = slots_[tail_ % kSlots];
  const uint64_t seq = s.seq.load(std::memory_order_acquire);
  if (seq != 2 * tail_ + 2) {
    if (seq > 2 * tail_ + 2) {  // overwritten since
      (*lost)++;
      tail_++;
      return false;
    }
    // Not finished yet: a writer in the middle, or one killed there.
    const uint64_t t = now_ns();
    if (!stuck_since_) stuck_since_ = t;
    if (t - stuck_since_ > 100'000'000) {
      (*lost)++;
      tail_++;
      stuck_since_ = 0;
    }
    return false;
  }
  stuck_since_ = 0;
  out.time_ns = s.time_ns;
  out.len = s.len < kSlotData ? s.len : kSlotData;
  out.orig_len = s.orig_len;
  out.pid = s.pid;
  out.qpn = s.qpn;
  std::memcpy(out.data, s.data, out.len);
  fence_acquire();
  tail_++;
  if (s.seq.load(std::memory_order_relaxed) != seq) {  // torn by a writer a lap ahead
    (*lost)++;
    return false;
  }
  return true;
}

}  // namespace sv::capture
