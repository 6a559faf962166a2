// shm_ring.h: a bounded multi-producer multi-consumer queue that lives in
// shared memory (plain data, no pointers), after Vyukov's per-slot sequence
// design. Producers and consumers may be different processes.
//
// Contract: RingHeader and the slot array are placed by the segment owner
// (the daemon) and initialised with ring_init(). push()/pop() are lock-free
// and safe from any number of threads and processes. A slot's payload is
// written only by the producer that reserved it and read only by the
// consumer that claimed it. A hostile process that maps the ring can corrupt
// its contents but not other memory: consumers validate every payload.
//
// Death at any instruction: a process may be killed
// (kill -9) anywhere inside push() or pop(). Each index (`tail`, `head`) is
// followed by the pid of whoever moved it last, and the two words move
// together in one 16-byte compare-and-swap (claim_index): that is the claim,
// and it names the claimer of the position just behind the index. Before
// moving an index past position p, a claimer looks at slot p - 1: if its
// claimer has not finished with it (a producer has not published it, a
// consumer has not given it back), it writes a "busy mark" into the slot's
// sequence (producer or consumer, the pid the index named, the low bits of
// the position). So every claim is known at any instant: by the index, for
// the position just behind it, or by a mark in the slot, for any older one.
// One locked instruction per push and per pop, as in Vyukov's queue; a mark
// costs a second one only when two claimers overlap (a mark written before
// every claim would cost a locked instruction per completion: READ's 8 B
// round trip measured 71 ns instead of 56).
// A mark whose process no longer exists is repaired: a slot a dead producer
// claimed is voided by the consumers once a later push has marked it (taken
// and given back empty: its element was never published, its push never
// returned; before that mark nothing published lies behind it); a slot a
// dead consumer claimed is left as it is, so that whoever recovers for the
// dead one can still read the element it took (reclaim_dead_take), and the
// producers take it back when they reach it on the next lap. So no dead
// process leaves a slot that stops the ring. What the element meant (a
// receive taken, a completion owed) is the caller's to record: see torn_qpn
// and sq_running in shm_layout.h. Consumers that exclude each other with a
// lock (take_exclusive, release) move the head with a store and record no
// claimer; they leave at most the slot behind the head unreleased, and the
// next holder of their lock, which takes it over from the dead one, gives
// it back (recover_exclusive).
#pragma once

#include <atomic>
#include <cstdint>
#include <cstddef>
#include <cstring>

#include "common/sys.h"

namespace sv::shm {

// Starts taking the line at `p` for writing (x86 PREFETCHW): a hint that
// never faults and changes nothing but timing. Used on ring slots that
// another process wrote last: reading the line and then writing it costs
// two transfers between CPUs (a fetch, then an invalidation of the other
// copy); taking it for writing at once costs one, and started early it
// overlaps other work.
inline void prefetch_for_write(const void* p) { asm volatile("prefetchw %0" ::"m"(*static_cast<const char*>(p))); }

// Each index is followed by the pid that moved it last (the claimer of the
// position behind it; 0: none recorded), changed with it in one 16-byte
// compare-and-swap: the pair is 16-byte aligned (cmpxchg16b requires it).
struct RingHeader {
  alignas(64) std::atomic<uint64_t> tail;  // next position to produce
  std::atomic<uint64_t> tail_by;           // who claimed tail - 1
  alignas(64) std::atomic<uint64_t> head;  // next position to consume
  std::atomic<uint64_t> head_by;           // who claimed head - 1
  alignas(64) uint32_t capacity;           // power of two
  uint32_t mask;
  uint32_t slot_size;                      // bytes per slot incl. sequence
  uint32_t reserved;
};

// A spin lock in shared memory. It records its holder's pid so that the
// daemon can recover it from a dead holder.
//
// Not starved: posters that take the lock again as soon as they release it
// (two processes posting in a loop on a shared QP) could keep a third from
// ever winning the compare-and-swap; under load one waited more than 30 s
// (KillSharedQp in CI). A waiter that has waited long asks for the next
// turn (`next` = its pid); everyone else then leaves the lock to it until it
// took it (or died: `next` is cleared when its pid is gone). A hint only:
// who holds the lock is decided by `owner` alone.
struct ShmLock {
  std::atomic<uint32_t> owner;  // 0 = free, else holder pid
  std::atomic<uint32_t> next;   // 0, or the pid of a starved waiter the lock is left to

  static constexpr unsigned kStarved = 256;  // spins (most of them yields) before asking for the next turn

  // True when the lock was taken over from a dead holder: what it guarded
  // may be half-updated, and the caller repairs it (see its users).
  bool lock(uint32_t pid) {
    // The common case inline: nobody holds the lock and nobody waits for a
    // turn. (The loop below inline would cost every post ten instructions
    // of set-up, as callgrind counts.)
    uint32_t expected = 0;
    if (next.load(std::memory_order_relaxed) == 0 &&
        owner.compare_exchange_strong(expected, pid, std::memory_order_acquire)) [[likely]]
      return false;
    return lock_slow(pid);
  }
  // lock()'s loop: spins, then yields, asks for a turn when starved, takes
  // the lock over from a dead holder.
  bool lock_slow(uint32_t pid);
  void unlock() { owner.store(0, std::memory_order_release); }
  static void relax_long();
  static bool alive(uint32_t pid);
};

template <class T>
struct alignas(64) RingSlot {
  std::atomic<uint64_t> seq;
  T value;
};

static_assert(offsetof(RingHeader, tail_by) == offsetof(RingHeader, tail) + 8 && offsetof(RingHeader, tail) % 16 == 0);
static_assert(offsetof(RingHeader, head_by) == offsetof(RingHeader, head) + 8 && offsetof(RingHeader, head) % 16 == 0);

// A position this process's view of a ring is done with (published by one
// of its producers, given back by one of its consumers): a claimer that
// finds the position behind its own claim here need not look at that slot,
// which the other side's CPU last wrote (a transfer between CPUs per
// message). Relaxed; copies as a value, so that a Ring stays copyable.
struct DonePos {
  std::atomic<uint64_t> v{~0ull};
  DonePos() = default;
  DonePos(const DonePos& o) : v(o.v.load(std::memory_order_relaxed)) {}
  DonePos& operator=(const DonePos& o) {
    v.store(o.v.load(std::memory_order_relaxed), std::memory_order_relaxed);
    return *this;
  }
};

template <class T>
class Ring {
 public:
  Ring() = default;
  // The capacity is read from the header once, here: for a process that
  // trusts whoever initialised the ring.
  Ring(RingHeader* h, RingSlot<T>* slots) : h_(h), slots_(slots), mask_(h->mask) {}
  // With the capacity the caller knows: the daemon, which must not take an
  // index bound from memory that every process mapping the ring can write.
  Ring(RingHeader* h, RingSlot<T>* slots, uint32_t capacity) : h_(h), slots_(slots), mask_(capacity - 1) {}

  // capacity: a power of two, at least 2 (with one slot, a producer's
  // "free" sequence equals the consumer's "full" one).
  static void init(RingHeader* h, RingSlot<T>* slots, uint32_t capacity) {
    h->tail.store(0, std::memory_order_relaxed);
    h->tail_by.store(0, std::memory_order_relaxed);
    h->head.store(0, std::memory_order_relaxed);
    h->head_by.store(0, std::memory_order_relaxed);
    h->capacity = capacity;
    h->mask = capacity - 1;
    h->slot_size = sizeof(RingSlot<T>);
    // Other processes see the ring only after its segment's fd reaches them
    // over a socket, which orders these stores before their loads.
    for (uint32_t i = 0; i < capacity; ++i) slots[i].seq.store(i, std::memory_order_release);
  }

  // Bit of `tail` that closes the ring to producers: push() then fails as
  // on a full ring. Used to move a CQ to a new segment (ibv_resize_cq).
  static constexpr uint64_t kClosed = 1ull << 63;

  bool valid() const { return h_ != nullptr; }
  // Closes the ring to producers; returns the final tail. Slots reserved
  // before the close may still be in the middle of being written.
  uint64_t close() { return h_->tail.fetch_or(kClosed, std::memory_order_acq_rel) & ~kClosed; }
  void reopen() { h_->tail.fetch_and(~kClosed, std::memory_order_acq_rel); }
  bool closed() const { return h_->tail.load(std::memory_order_acquire) & kClosed; }
  uint64_t head() const { return h_->head.load(std::memory_order_acquire); }
  uint32_t capacity() const { return mask_ + 1; }

  // Returns false when the ring is full.
  bool push(const T& v) { return push_prefix(v, sizeof(T)); }

  // Returns false when the ring is empty.
  bool pop(T& out) {
    return pop_with(out, [](T& o, const T& in) { std::memcpy(&o, static_cast<const void*>(&in), sizeof(T)); });
  }

  // True when the oldest position holds an element, without claiming it:
  // two loads, and no write to a line the producers use. An idle poller
  // calls this in a loop, so it must not take locks or pull lines away
  // from the producers more than the slot itself.
  // Also true when the oldest slot carries the mark of a producer that died
  // before publishing it (a pop voids it).
  // (A producer's mark is judged with patience: see dead_mark_patient.)
  bool ready() const {
    uint64_t pos = h_->head.load(std::memory_order_relaxed);
    uint64_t seq = slots_[pos & mask_].seq.load(std::memory_order_acquire);
    return seq == pos + 1 || dead_mark_patient(seq, pos);
  }

  // As push(), but copies only the first `bytes` of `v` into the slot (the
  // rest of the slot keeps older contents): for elements whose used length
  // is known, such as a work request with few SGEs. bytes <= sizeof(T).
  bool push_prefix(const T& v, size_t bytes) {
    return push_prefix_then(v, bytes, [] {});
  }

  // As push_prefix(), and calls `before_publish()` once the element is
  // written but not yet visible: for a record that must be gone by the time
  // the element can be taken (see torn_qpn in shm_layout.h). Not called when
  // the push fails.
  template <class F>
  SV_HOT bool push_prefix_then(const T& v, size_t bytes, F before_publish) {
    return push_write_then([&v, bytes](T& slot) { std::memcpy(static_cast<void*>(&slot), &v, bytes); },
                           before_publish);
  }

  // As push_prefix_then, with `write(slot_value)` writing the element
  // straight into the slot it claimed (no element built on the stack and
  // copied: building a completion, copying it into an entry and copying that
  // again costs instructions on every push, as callgrind counts). `write`
  // runs once, after the claim, and must write every byte a consumer reads.
  template <class W, class F>
  SV_HOT bool push_write_then(W write, F before_publish) {
    // The common case inline: the slot at the tail is free and the claim
    // wins at once. Anything else takes the loop below, out of line.
    const uint32_t me = self_pid();
    uint64_t pos, by;
    load_index(h_->tail, h_->tail_by, pos, by);
    RingSlot<T>& s = slots_[pos & mask_];
    prefetch_for_write(&s);  // read, then written: one transfer, not two
    if (!(pos & kClosed) && s.seq.load(std::memory_order_acquire) == pos) {
      record_claim(pos - 1, by, false, pushed_);
      if (claim_index(h_->tail, h_->tail_by, pos, by, me)) {
        publish(s, pos, write, before_publish);
        return true;
      }
    }
    return push_slow(write, before_publish, me, pos, by);
  }

  // As push_write_then, from the index pair (`pos`, `by`) last read.
  template <class W, class F>
  __attribute__((noinline)) bool push_slow(W& write, F before_publish, uint32_t me, uint64_t pos, uint64_t by) {
    for (;;) {
      if (pos & kClosed) return false;
      RingSlot<T>& s = slots_[pos & mask_];
      uint64_t seq = s.seq.load(std::memory_order_acquire);
      if (seq == pos) {
        // Free: claim it by moving the tail (see the top of this file).
        record_claim(pos - 1, by, false, pushed_);
        if (!claim_index(h_->tail, h_->tail_by, pos, by, me)) continue;
        publish(s, pos, write, before_publish);
        return true;
      }
      if (seq & kBusy) {
        if (!(seq & kTaker) && uint32_t(seq) == uint32_t(pos)) {
          // A producer's mark at the tail itself (left by a library that
          // marked before it moved the tail, or forged): count it as the
          // claim it names.
          if (claim_index(h_->tail, h_->tail_by, pos, by, mark_pid(seq))) load_index(h_->tail, h_->tail_by, pos, by);
          continue;
        }
        if ((seq & kTaker) && uint32_t(seq) == uint32_t(pos - mask_ - 1)) {
          // The consumer of the previous lap is still copying out: full,
          // unless it died there; then its element died with it.
          if (ShmLock::alive(mark_pid(seq))) return false;
          s.seq.compare_exchange_strong(seq, pos, std::memory_order_acq_rel, std::memory_order_relaxed);
          continue;
        }
        if (!reload_index(h_->tail, h_->tail_by, pos, by)) return false;  // a mark of another lap: full
        continue;
      }
      if (seq == pos - mask_) {
        // The previous lap's element is still here: full, unless the
        // consumer that claimed it (named by the head) died before giving
        // it back.
        if (!take_back_unrecorded(s, seq, pos)) return false;
        continue;
      }
      if (int64_t(seq - pos) < 0) return false;
      if (!reload_index(h_->tail, h_->tail_by, pos, by)) return false;  // ahead of a tail that did not move: corrupted
    }
  }

  // As pop(), but copies the element out with `copy(out, slot_value)`, which
  // may read only the part of the slot that is in use.
  template <class Copy>
  bool pop_with(T& out, Copy copy) {
    return pop_recorded(out, [](uint64_t) {}, copy);
  }

  // As pop_with(), and calls `before_claim(pos)` before each attempt to
  // claim position `pos`: for a consumer that must be able to say, if it is
  // killed at any instruction after, which element it may have taken (see
  // torn_pos in shm_layout.h and reclaim_dead_take). The claim is ordered
  // after whatever before_claim() stored.
  template <class Before, class Copy>
  SV_HOT bool pop_recorded(T& out, Before before_claim, Copy copy) {
    // The common case inline, as in push_prefix_then.
    const uint32_t me = self_pid();
    uint64_t pos, by;
    load_index(h_->head, h_->head_by, pos, by);
    RingSlot<T>& s = slots_[pos & mask_];
    prefetch_for_write(&s);  // its sequence is written back: one transfer, not two
    if (s.seq.load(std::memory_order_acquire) == pos + 1) {
      before_claim(pos);
      record_claim(pos - 1, by, true, taken_);
      if (claim_index(h_->head, h_->head_by, pos, by, me)) {
        give_back(s, pos, out, copy);
        return true;
      }
    }
    return pop_slow(out, before_claim, copy, me, pos, by);
  }

  template <class Before, class Copy>
  __attribute__((noinline)) bool pop_slow(T& out, Before before_claim, Copy copy, uint32_t me, uint64_t pos,
                                          uint64_t by) {
    for (;;) {
      RingSlot<T>& s = slots_[pos & mask_];
      uint64_t seq = s.seq.load(std::memory_order_acquire);
      if (seq == pos + 1) {
        before_claim(pos);
        record_claim(pos - 1, by, true, taken_);
        if (!claim_index(h_->head, h_->head_by, pos, by, me)) continue;
        give_back(s, pos, out, copy);
        return true;
      }
      if ((seq & kBusy) && uint32_t(seq) == uint32_t(pos)) {
        if (seq & kTaker) {
          // A consumer's mark at the head: one voiding a dead producer's
          // slot (it moves the head after its mark), or left by a library
          // that marked before it moved the head. Count it for it and go on;
          // if it died there, the slot stays as it left it (its element may
          // still be owed: reclaim_dead_take), and the producers take it
          // back when they reach it on the next lap.
          if (claim_index(h_->head, h_->head_by, pos, by, mark_pid(seq))) load_index(h_->head, h_->head_by, pos, by);
          continue;
        }
        if (!void_dead_producer(s, seq, pos, me, false)) return false;  // being written: empty
        load_index(h_->head, h_->head_by, pos, by);
        continue;
      }
      int64_t diff = int64_t(seq - (pos + 1));
      if (diff < 0 && !(seq & kBusy)) {
        return false;
      } else if (!reload_index(h_->head, h_->head_by, pos, by)) {
        return false;  // a sequence ahead of a head that did not move: corrupted
      }
    }
  }

  // As pop(), for a caller that excludes every other consumer (a CQ's
  // pollers hold its poll lock): the head moves with a plain store, not a
  // compare-and-swap. Producers never write the head, so this is safe
  // beside any number of them.
  bool pop_exclusive(T& out) {
    uint64_t pos = h_->head.load(std::memory_order_relaxed);
    RingSlot<T>* s = &slots_[pos & mask_];
    for (uint64_t seq; (seq = s->seq.load(std::memory_order_acquire)) != pos + 1;) {
      if (!void_dead_producer(*s, seq, pos, self_pid(), true)) return false;
      pos = h_->head.load(std::memory_order_relaxed);
      s = &slots_[pos & mask_];
    }
    std::memcpy(&out, static_cast<const void*>(&s->value), sizeof(T));
    store_head_exclusive(pos + 1);
    s->seq.store(pos + mask_ + 1, std::memory_order_release);
    return true;
  }

  // Hints for a caller that will pop (push) again soon: start taking the
  // slot the next pop (push) uses, so that its transfer from the process
  // that wrote it last happens now, off the critical path of the next call.
  void prefetch_next_pop() const { prefetch_for_write(&slots_[h_->head.load(std::memory_order_relaxed) & mask_]); }
  void prefetch_next_push() const { prefetch_for_write(&slots_[h_->tail.load(std::memory_order_relaxed) & mask_]); }

  // As pop_exclusive(), but the slot stays taken: its sequence, which gives
  // it back to the producers, is written later by release(pos). The head
  // moves at once, so the next take sees the next element. For a consumer
  // that wants that write (to a line the producer wrote, hence a transfer
  // between CPUs) out of its critical path.
  bool take_exclusive(T& out, uint64_t& pos) {
    return take_exclusive_with(pos, [&out](const T& v) { std::memcpy(&out, static_cast<const void*>(&v), sizeof(T)); });
  }
  // As take_exclusive, with `copy(element)` taking what the caller needs of
  // the element straight from the slot (no copy of the whole element first).
  template <class Copy>
  bool take_exclusive_with(uint64_t& pos, Copy copy) {
    pos = h_->head.load(std::memory_order_relaxed);
    RingSlot<T>* s = &slots_[pos & mask_];
    for (uint64_t seq; (seq = s->seq.load(std::memory_order_acquire)) != pos + 1;) {
      if (!void_dead_producer(*s, seq, pos, self_pid(), true)) return false;
      pos = h_->head.load(std::memory_order_relaxed);
      s = &slots_[pos & mask_];
    }
    copy(s->value);
    store_head_exclusive(pos + 1);
    return true;
  }
  // Gives slot `pos` (taken with take_exclusive) back to the producers.
  void release(uint64_t pos) { slots_[pos & mask_].seq.store(pos + mask_ + 1, std::memory_order_release); }

  // Gives slot `pos` back if it is behind the head and still holds the
  // element of `pos` (taken, not given back); anything else is left alone.
  // For a consumer whose last take may have been followed by voided slots
  // (the head then moved on past it).
  // Exclusive consumers only (the caller holds the consumers' lock): a slot
  // that holds the element of `pos` behind the head is written by nobody
  // but its taker (producers wait for the next lap's sequence, voiding
  // touches only producer marks at the head), so a load and a plain store
  // do what a compare-and-swap would, without a locked instruction on the
  // poll path.
  void release_if_taken(uint64_t pos) {
    uint64_t hd = h_->head.load(std::memory_order_relaxed);
    if (pos >= hd || hd - pos > mask_) return;
    RingSlot<T>& s = slots_[pos & mask_];
    if (s.seq.load(std::memory_order_relaxed) == pos + 1) s.seq.store(pos + mask_ + 1, std::memory_order_release);
  }

  // For an exclusive consumer that took its lock over from a dead one
  // (ShmLock::lock returned true): the dead one may have moved the head
  // past a slot (take_exclusive, pop_exclusive) without giving it back, or
  // died holding a slot it claimed to void. Gives such a slot back.
  void recover_exclusive() {
    uint64_t pos = h_->head.load(std::memory_order_relaxed);
    RingSlot<T>& prev = slots_[(pos - 1) & mask_];
    uint64_t seq = prev.seq.load(std::memory_order_acquire);
    if (pos != 0 && seq == pos) prev.seq.store(pos - 1 + mask_ + 1, std::memory_order_release);
    RingSlot<T>& cur = slots_[pos & mask_];
    seq = cur.seq.load(std::memory_order_acquire);
    if ((seq & kBusy) && (seq & kTaker) && uint32_t(seq) == uint32_t(pos) && !ShmLock::alive(mark_pid(seq))) {
      store_head_exclusive(pos + 1);
      cur.seq.store(pos + mask_ + 1, std::memory_order_release);
    }
  }

  // For whoever recovers after consumer `pid` died (it is not alive): if
  // that consumer claimed position `pos` and never gave the slot back, the
  // element is still in it. Copies it to `out`, gives the slot back to the
  // producers and returns true; otherwise (never claimed, given back, or
  // already taken back by a producer) false and nothing changes. The copy
  // counts only if the slot still carried the claim after it: a producer
  // must replace the claim before it writes the slot.
  bool reclaim_dead_take(uint64_t pos, uint32_t pid, T& out) { return !ShmLock::alive(pid) && reclaim_take(pos, pid, out); }
  // As reclaim_dead_take, for a caller that knows by other means that `pid`
  // will take nothing more (the daemon, once every process holding the QP
  // that recorded the claim has gone: one that is still a zombie is alive
  // to kill(2)).
  // The claim is either a mark in the slot, or, while the head is just past
  // `pos`, the head's claimer; a mark left at the head by a library that
  // marked first moves the head past `pos` first, as any consumer meeting
  // it would (a slot given back behind a head that never passed it stopped
  // the ring for good: KillSharedQp's receive queue looked empty for ever).
  bool reclaim_take(uint64_t pos, uint32_t pid, T& out) {
    RingSlot<T>& s = slots_[pos & mask_];
    const uint64_t marked = mark(true, pid, pos);
    uint64_t seq = s.seq.load(std::memory_order_acquire);
    uint64_t hp, hb;
    load_index(h_->head, h_->head_by, hp, hb);
    if (seq == pos + 1) {
      // Claimed by the head's claimer, unless the head moved on (a later
      // consumer marked the slot before it moved it: look again).
      if (hp != pos + 1 || uint32_t(hb) != pid) {
        seq = s.seq.load(std::memory_order_acquire);
        if (seq != marked) return false;
      }
    } else if (seq != marked) {
      return false;
    } else if (hp == pos) {
      claim_index(h_->head, h_->head_by, hp, hb, pid);
    }
    std::memcpy(static_cast<void*>(&out), static_cast<const void*>(&s.value), sizeof(T));
    for (;;) {
      if (s.seq.compare_exchange_strong(seq, pos + mask_ + 1, std::memory_order_acq_rel, std::memory_order_acquire))
        return true;
      if (seq != marked) return false;  // taken back by a producer, or by another recoverer
      // else a later consumer marked the claim meanwhile: the same claim, the same element
    }
  }

  // Peeks at the oldest element without consuming it (single consumer only).
  // A slot a dead producer claimed is voided on the way, and a dead
  // consumer's mark at the head (left by a library that marked before it
  // moved the head) is passed over as pop() passes it: what that element
  // was owed is the caller's record (sq_running), which finds it with at().
  // (Such a claim once made the ring look empty for good while it was full:
  // a shared send queue whose poster was killed there refused every post
  // with ENOMEM; KillSharedQp.)
  const T* front() {
    for (;;) {
      uint64_t pos, by;
      load_index(h_->head, h_->head_by, pos, by);
      RingSlot<T>& s = slots_[pos & mask_];
      uint64_t seq = s.seq.load(std::memory_order_acquire);
      if (seq == pos + 1) return &s.value;
      if ((seq & kBusy) && (seq & kTaker) && uint32_t(seq) == uint32_t(pos) && !ShmLock::alive(mark_pid(seq))) {
        claim_index(h_->head, h_->head_by, pos, by, mark_pid(seq));
        continue;
      }
      if (!void_dead_producer(s, seq, pos, self_pid(), false)) return nullptr;
    }
  }

  // The element last written at `pos`, whatever the slot's state: for a
  // single consumer that knows (by its own record) that the slot holds what
  // a dead consumer took and nobody has written it since (producers reach
  // it again only on the next lap).
  const T& at(uint64_t pos) const { return slots_[pos & mask_].value; }

  bool empty() const {
    // The head may pass a tail that a dead producer did not move (voided slot).
    return h_->head.load(std::memory_order_acquire) >= (h_->tail.load(std::memory_order_acquire) & ~kClosed);
  }
  uint64_t size() const {
    uint64_t t = h_->tail.load(std::memory_order_acquire) & ~kClosed;
    uint64_t hd = h_->head.load(std::memory_order_acquire);
    return t > hd ? t - hd : 0;
  }

 private:
  // Sequence marks of a claimed slot (see the top of this file): bit 63,
  // bit 62 for a consumer, the claimer's pid in bits 32-61, the low 32 bits
  // of the position. Positions never reach bit 62.
  static constexpr uint64_t kBusy = 1ull << 63;
  static constexpr uint64_t kTaker = 1ull << 62;
  static uint64_t mark(bool taker, uint32_t pid, uint64_t pos) {
    return kBusy | (taker ? kTaker : 0) | (uint64_t(pid & 0x3fffffffu) << 32) | uint32_t(pos);
  }
  static uint32_t mark_pid(uint64_t seq) { return uint32_t(seq >> 32) & 0x3fffffffu; }

  // A claimed slot written and published (producer), copied out and given
  // back (consumer); each remembered as done by this view (record_claim).
  template <class W, class F>
  void publish(RingSlot<T>& s, uint64_t pos, W& write, F& before_publish) {
    write(s.value);
    before_publish();
    s.seq.store(pos + 1, std::memory_order_release);
    pushed_.v.store(pos, std::memory_order_relaxed);
  }
  template <class Copy>
  void give_back(RingSlot<T>& s, uint64_t pos, T& out, Copy& copy) {
    copy(out, s.value);
    s.seq.store(pos + mask_ + 1, std::memory_order_release);
    taken_.v.store(pos, std::memory_order_relaxed);
  }

  // Reads an index and its claimer as one pair: the two words change only
  // together (claim_index), and the index only grows, so a pair read
  // between two equal reads of the index is one the index held. (x86 keeps
  // loads in program order.) Bounded: a process that rewrites the index in
  // a loop gets a torn pair, which the compare-and-swap then refuses.
  static void load_index(const std::atomic<uint64_t>& idx, const std::atomic<uint64_t>& by_word, uint64_t& pos,
                         uint64_t& by) {
    for (int i = 0; i < 64; ++i) {
      pos = idx.load(std::memory_order_acquire);
      by = by_word.load(std::memory_order_acquire);
      if (idx.load(std::memory_order_acquire) == pos) return;
    }
  }
  // The claim: moves the index from `pos` (with claimer `by`) to pos + 1
  // with claimer `claimer`, in one locked instruction. On failure `pos` and
  // `by` hold the pair as it is.
  // When the claimer stays the same (one process posting or polling in a
  // row, the common case) only the index changes, and an 8-byte
  // compare-and-swap of it does: every claim moves the index, so an index
  // still at `pos` still names `by`. Otherwise both words change together
  // in x86 `cmpxchg16b` on the 16-byte aligned pair, which costs about 1.3x
  // the 8-byte one here (docs/PERFORMANCE.md, "Shared rings robust to death").
  static bool claim_index(std::atomic<uint64_t>& idx, std::atomic<uint64_t>& by_word, uint64_t& pos, uint64_t& by,
                          uint64_t claimer) {
    if (by == claimer) {
      uint64_t p = pos;
      // acq_rel: the slot is written only after the claim, and the record
      // of the claim behind (record_claim) is in place before it.
      if (idx.compare_exchange_strong(p, pos + 1, std::memory_order_acq_rel, std::memory_order_relaxed)) return true;
      load_index(idx, by_word, pos, by);
      return false;
    }
    struct alignas(16) Pair {
      uint64_t lo, hi;
    };
    uint64_t lo = pos, hi = by;
    bool ok;
    asm volatile("lock cmpxchg16b %1"
                 : "=@ccz"(ok), "+m"(*reinterpret_cast<volatile Pair*>(&idx)), "+a"(lo), "+d"(hi)
                 : "b"(pos + 1), "c"(claimer)
                 : "memory");
    if (!ok) {
      pos = lo;
      by = hi;
    }
    return ok;
  }
  // Before an index moves past `prev` + 1: if the claimer the index names
  // for `prev` (`by`) has not finished with that slot (a producer's element
  // unpublished, a consumer's not given back), record the claim in the
  // slot, so that it is known once the index names someone else. Nothing
  // to do when this view finished `prev` itself (`done`), or when the index
  // names nobody (exclusive consumers, whose lock recovers instead).
  void record_claim(uint64_t prev, uint64_t by, bool taker, const DonePos& done) {
    if (by == 0 || prev == ~0ull || done.v.load(std::memory_order_relaxed) == prev) return;
    RingSlot<T>& s = slots_[prev & mask_];
    uint64_t unfinished = taker ? prev + 1 : prev;
    uint64_t seq = s.seq.load(std::memory_order_relaxed);
    if (seq == unfinished)
      s.seq.compare_exchange_strong(seq, mark(taker, uint32_t(by), prev), std::memory_order_relaxed,
                                    std::memory_order_relaxed);
  }
  // A producer at `pos` found the element of `pos - capacity` still in slot
  // `s` (`seq`). If the head names the consumer that claimed it and that
  // consumer is dead, take the slot back for this lap (its element died
  // with it) and return true; otherwise the ring is full.
  bool take_back_unrecorded(RingSlot<T>& s, uint64_t seq, uint64_t pos) {
    uint64_t hp, hb;
    load_index(h_->head, h_->head_by, hp, hb);
    if (hp != seq || hb == 0 || ShmLock::alive(uint32_t(hb))) return false;
    // Whether this or another's compare-and-swap (a recoverer's, a
    // producer's) changed the slot, the caller looks at it again.
    s.seq.compare_exchange_strong(seq, pos, std::memory_order_acq_rel, std::memory_order_relaxed);
    return true;
  }
  // Exclusive consumers move the head with a store and name no claimer.
  void store_head_exclusive(uint64_t pos) {
    if (h_->head_by.load(std::memory_order_relaxed) != 0) h_->head_by.store(0, std::memory_order_relaxed);
    h_->head.store(pos, std::memory_order_relaxed);
  }

  // A slot at `pos` marked by a producer that no longer exists.
  static bool dead_mark_at(uint64_t seq, uint64_t pos) {
    return (seq & kBusy) && !(seq & kTaker) && uint32_t(seq) == uint32_t(pos) && !ShmLock::alive(mark_pid(seq));
  }
  // The same for a caller that polls in a loop (a CQ's pollers: ready(),
  // take_exclusive, pop_exclusive). A producer's mark at the head is nearly
  // always a push in progress, and asking the kernel whether its producer
  // lives (kill(2)) costs more than the push: an idle poller that asked at
  // every mark would ask on almost every message, and a SEND's 8 B latency
  // measured 322 ns instead of 118 (bench/ab.py). So
  // this thread asks only after it met the same mark kPatience times in a
  // row: a dead producer's slot is voided a few microseconds later, a live
  // one costs nothing.
  static constexpr uint32_t kPatience = 256;
  static bool dead_mark_patient(uint64_t seq, uint64_t pos) {
    if (!(seq & kBusy) || (seq & kTaker) || uint32_t(seq) != uint32_t(pos)) return false;
    // The verdict on a mark is kept until another is met: ready() and the
    // take that follows it both ask, and a count reset by the first made
    // the second wait again, for ever (a poller never voided a dead
    // producer's slot: KillSharedQp's receiver stopped taking completions).
    thread_local uint64_t met = 0;
    thread_local uint32_t times = 0;
    thread_local bool dead = false;
    if (seq != met) {
      met = seq;
      times = 0;
      dead = false;
    }
    if (dead) return true;
    if (++times < kPatience) return false;
    times = 0;
    dead = !ShmLock::alive(mark_pid(seq));
    return dead;
  }
  // The slot at the head (`pos`) holds `seq`. If a dead producer's mark is
  // in it, take it (our consumer mark), count it in the tail and the head,
  // give it back empty and return true; otherwise (being written, or not
  // ours to judge) false. `exclusive`: the caller excludes other consumers
  // (the head moves with a store) and polls in a loop (dead_mark_patient).
  bool void_dead_producer(RingSlot<T>& s, uint64_t seq, uint64_t pos, uint32_t me, bool exclusive) {
    if (!(exclusive ? dead_mark_patient(seq, pos) : dead_mark_at(seq, pos))) return false;
    if (!s.seq.compare_exchange_strong(seq, mark(true, me, pos), std::memory_order_acquire,
                                       std::memory_order_relaxed))
      return true;  // someone else got there: look again
    // A mark at the tail itself (a library that marked before it moved the
    // tail, or forged) was never counted: count it.
    uint64_t tp, tb;
    load_index(h_->tail, h_->tail_by, tp, tb);
    if (tp == pos) claim_index(h_->tail, h_->tail_by, tp, tb, mark_pid(seq));
    if (exclusive) {
      store_head_exclusive(pos + 1);
    } else {
      uint64_t hp, hb;
      load_index(h_->head, h_->head_by, hp, hb);
      for (int i = 0; i < 64 && hp == pos; ++i) {
        record_claim(pos - 1, hb, true, taken_);
        if (claim_index(h_->head, h_->head_by, hp, hb, me)) break;
      }
    }
    s.seq.store(pos + mask_ + 1, std::memory_order_release);
    return true;
  }

  // A slot whose sequence is ahead of `pos` was taken by another producer
  // (consumer), which moved the tail (head) before it published the slot
  // (release), so reloading sees a new position. If it did not move, the
  // sequence was written by someone who does not follow the protocol: give
  // up rather than spin for ever (the daemon must not hang on a client).
  static bool reload_index(const std::atomic<uint64_t>& idx, const std::atomic<uint64_t>& by_word, uint64_t& pos,
                           uint64_t& by) {
    uint64_t was = pos;
    load_index(idx, by_word, pos, by);
    return pos != was;
  }

  RingHeader* h_ = nullptr;
  RingSlot<T>* slots_ = nullptr;
  uint32_t mask_ = 0;
  DonePos pushed_;  // the last position a producer of this view published
  DonePos taken_;   // the last position a consumer of this view gave back
};

}  // namespace sv::shm
