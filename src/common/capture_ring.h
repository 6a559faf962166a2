// capture_ring.h: the capture ring, a bounded ring of packets in shared
// memory that a user's processes write while `softverbs capture` reads it.
//
// One ring per user and daemon: /dev/shm/softverbs-capture-UID-KEY, KEY
// naming the daemon's directory (its device and inode), created by the
// capturing tool (mode 0600, owned by the user whose traffic it records;
// written beside and renamed into place whole) and removed when it stops.
// The library maps a ring only if it is a regular file owned by its own
// real user with mode 0600 (another user can squat the name, and so deny
// capture, but never make a process write into a ring it can read).
//
// Writers never wait: each packet takes the next slot (an atomic counter);
// a slot is a seqlock (seq odd while written, then 2*(index+1)); a reader
// that falls a ring behind loses the oldest packets and counts them. A
// writer killed mid-slot leaves it odd: the reader skips it after a while.
// The reader trusts nothing in the ring: lengths are bounded, and a user's
// forged slots reach that user's own captures only.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace sv::capture {

constexpr uint32_t kRingMagic = 0x53564350;  // "SVCP"
constexpr uint32_t kSlotData = 4096 + 128;   // an IP datagram: MTU 4096 payload and RoCEv2 headers
constexpr uint32_t kSlots = 2048;

struct Slot {
  std::atomic<uint64_t> seq;
  uint64_t time_ns;
  uint32_t len;       // bytes of data[] (an IPv4 or IPv6 datagram)
  uint32_t orig_len;  // the datagram's length before truncation to kSlotData
  uint32_t pid;       // the writing process
  uint32_t qpn;       // the local QP it concerns (0: unknown)
  uint8_t data[kSlotData];
};

struct RingHeader {
  uint32_t magic;
  uint32_t slots;
  std::atomic<uint64_t> next;  // slots handed out so far
  std::atomic<uint32_t> reader_pid;
  uint32_t reserved[13];
};
static_assert(sizeof(RingHeader) == 72);

constexpr size_t ring_size() { return 4096 + size_t(kSlots) * sizeof(Slot); }

// /dev/shm/softverbs-capture-UID-KEY for the daemon whose directory is
// `dir` (stat'ed: its device and inode); "" if it cannot be stat'ed.
std::string ring_path(uint32_t uid, const std::string& dir);
// The directory this process's library talks to (the system daemon's or
// its user's), as the library finds it.
std::string daemon_dir();

class Ring {
 public:
  Ring() = default;
  Ring(const Ring&) = delete;
  Ring& operator=(const Ring&) = delete;
  ~Ring();
  // Writer side: maps `path` if it is a ring of the caller's real user
  // (regular file, owner getuid(), mode 0600, the right size and magic).
  // 0 or an errno.
  int open_writer(const std::string& path);
  // Reader side: creates the ring at `path` for user `uid` (written
  // beside, then renamed into place). 0 or an errno; *why set.
  int create(const std::string& path, uint32_t uid, std::string* why);
  bool mapped() const { return hdr_ != nullptr; }
  // Appends one datagram (truncated to kSlotData). Never blocks.
  void write(std::span<const uint8_t> ip, uint32_t qpn, uint64_t time_ns);
  // Reader: the next packet, if any, into `s` (a copy). Counts the packets
  // lost to a reader too slow in *lost.
  bool read(Slot& s, uint64_t* lost);
  RingHeader* header() { return hdr_; }

 private:
  RingHeader* hdr_ = nullptr;
  Slot* slots_ = nullptr;
  uint64_t tail_ = 0;          // reader: the next index to read
  uint64_t stuck_since_ = 0;   // reader: when the slot at tail_ was first seen unfinished
};

uint64_t now_ns();  // CLOCK_REALTIME

}  // namespace sv::capture
