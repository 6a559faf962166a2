#include "common/shm_ring.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstring>
#include <thread>
#include <vector>

namespace sv::shm {
namespace {

struct Item {
  uint64_t v;
};

struct RingMem {
  explicit RingMem(uint32_t cap) : cap(cap) {
    size_t len = sizeof(RingHeader) + cap * sizeof(RingSlot<Item>);
    mem = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    size = len;
    auto* h = static_cast<RingHeader*>(mem);
    Ring<Item>::init(h, reinterpret_cast<RingSlot<Item>*>(h + 1), cap);
    ring = Ring<Item>(h, reinterpret_cast<RingSlot<Item>*>(h + 1));
  }
  ~RingMem() { ::munmap(mem, size); }
  uint32_t cap;
  void* mem;
  size_t size;
  Ring<Item> ring;
};

// What a hostile process that maps a ring can write must not make the
// daemon spin or index outside the slots: a sequence number ahead of an
// index that does not move ends push/pop (false), and a ring built with the
// capacity its maker knows ignores a rewritten header mask.
TEST(ShmRing, CorruptedSequencesAndMaskNeitherHangNorEscape) {
  RingMem m(4);
  auto* h = static_cast<RingHeader*>(m.mem);
  auto* slots = reinterpret_cast<RingSlot<Item>*>(h + 1);
  Ring<Item> trusted(h, slots, 4);
  slots[0].seq.store(1000, std::memory_order_relaxed);  // "consumed long ago" at head 0
  Item out{};
  EXPECT_FALSE(trusted.pop(out));
  EXPECT_FALSE(trusted.push({1}));  // seq 1000 is ahead of tail 0 as well
  h->mask = 0xffffffffu;            // would index 2^32 slots
  slots[0].seq.store(0, std::memory_order_relaxed);
  h->tail.store(5, std::memory_order_relaxed);  // position 5 -> slot 1 with the real mask
  slots[1].seq.store(5, std::memory_order_relaxed);
  EXPECT_TRUE(trusted.push({7}));
  EXPECT_EQ(slots[1].value.v, 7u);
  h->head.store(5, std::memory_order_relaxed);
  EXPECT_TRUE(trusted.pop(out));
  EXPECT_EQ(out.v, 7u);
  EXPECT_EQ(trusted.capacity(), 4u);
}

// Closing (a CQ being moved by ibv_resize_cq) refuses producers but lets
// consumers take everything pushed before; reopening resumes at the tail.
TEST(ShmRing, CloseRefusesProducersAndKeepsTheTail) {
  RingMem m(8);
  for (uint64_t i = 0; i < 3; ++i) EXPECT_TRUE(m.ring.push({i}));
  EXPECT_FALSE(m.ring.closed());
  EXPECT_EQ(3u, m.ring.close());
  EXPECT_TRUE(m.ring.closed());
  EXPECT_FALSE(m.ring.push({7}));
  EXPECT_EQ(3u, m.ring.size());
  EXPECT_FALSE(m.ring.empty());
  Item it;
  ASSERT_TRUE(m.ring.pop(it));
  EXPECT_EQ(0u, it.v);
  m.ring.reopen();
  EXPECT_TRUE(m.ring.push({3}));
  for (uint64_t i = 1; i < 4; ++i) {
    ASSERT_TRUE(m.ring.pop(it));
    EXPECT_EQ(i, it.v);
  }
  EXPECT_TRUE(m.ring.empty());
}

// ready() answers "would pop() succeed" without claiming anything, through
// wrap-arounds; it is what an idle ibv_poll_cq reads.
TEST(ShmRing, ReadyTellsWhetherTheHeadHoldsAnElementWithoutTakingIt) {
  RingMem m(2);
  Item it;
  EXPECT_FALSE(m.ring.ready());
  for (uint64_t i = 0; i < 5; ++i) {
    ASSERT_TRUE(m.ring.push({i}));
    EXPECT_TRUE(m.ring.ready());
    EXPECT_TRUE(m.ring.ready());  // still there: ready() took nothing
    EXPECT_EQ(1u, m.ring.size());
    ASSERT_TRUE(m.ring.pop(it));
    EXPECT_EQ(i, it.v);
    EXPECT_FALSE(m.ring.ready());
  }
  ASSERT_TRUE(m.ring.push({7}));
  ASSERT_TRUE(m.ring.push({8}));
  m.ring.close();  // a closed ring still offers what it holds
  EXPECT_TRUE(m.ring.ready());
}

struct Wide {
  uint64_t n;
  uint64_t w[7];
};

// push_prefix copies only the bytes in use and pop_with copies out what the
// element says is in use: a reused slot keeps older bytes beyond the prefix,
// which a reader that honours the length never sees.
TEST(ShmRing, PrefixPushAndPartialPopCarryOnlyTheUsedPart) {
  size_t len = sizeof(RingHeader) + 2 * sizeof(RingSlot<Wide>);  // two slots: the smallest ring
  void* mem = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(MAP_FAILED, mem);
  auto* h = static_cast<RingHeader*>(mem);
  auto* slots = reinterpret_cast<RingSlot<Wide>*>(h + 1);
  Ring<Wide>::init(h, slots, 2);
  Ring<Wide> r(h, slots);
  auto bytes = [](uint64_t n) { return sizeof(uint64_t) * (1 + n); };
  auto copy = [&](Wide& out, const Wide& slot) {
    out.n = slot.n;
    std::memcpy(out.w, slot.w, bytes(std::min<uint64_t>(out.n, 7)) - sizeof(uint64_t));
  };
  Wide full{7, {1, 2, 3, 4, 5, 6, 7}};
  ASSERT_TRUE(r.push_prefix(full, bytes(7)));
  Wide out{};
  ASSERT_TRUE(r.pop_with(out, copy));
  EXPECT_EQ(7u, out.n);
  EXPECT_EQ(7u, out.w[6]);
  ASSERT_TRUE(r.push_prefix(full, bytes(7)));  // slot 1
  ASSERT_TRUE(r.pop_with(out, copy));
  Wide one{1, {42, 0, 0, 0, 0, 0, 0}};
  ASSERT_TRUE(r.push_prefix(one, bytes(1)));  // slot 0 again
  EXPECT_EQ(2u, slots[0].value.w[1]);          // older bytes left in place
  ASSERT_TRUE(r.push_prefix(one, bytes(1)));
  EXPECT_FALSE(r.push_prefix(one, bytes(1)));  // full
  Wide got;
  std::memset(&got, 0xee, sizeof got);
  ASSERT_TRUE(r.pop_with(got, copy));
  EXPECT_EQ(1u, got.n);
  EXPECT_EQ(42u, got.w[0]);
  EXPECT_EQ(0xeeeeeeeeeeeeeeeeull, got.w[1]);  // not copied
  ASSERT_TRUE(r.pop_with(got, copy));
  EXPECT_FALSE(r.pop_with(got, copy));
  ::munmap(mem, len);
}

// A taken slot is the consumer's until released: the head moves on at once,
// producers wrap around onto it only after release().
TEST(ShmRing, TakenSlotReturnsToProducersOnlyWhenReleased) {
  RingMem m(4);
  for (uint64_t i = 0; i < 4; ++i) ASSERT_TRUE(m.ring.push({i}));
  Item out{};
  uint64_t pos = 99;
  ASSERT_TRUE(m.ring.take_exclusive(out, pos));
  EXPECT_EQ(0u, out.v);
  EXPECT_EQ(0u, pos);
  EXPECT_EQ(1u, m.ring.head());
  EXPECT_FALSE(m.ring.push({4}));  // slot 0 is still taken: full
  m.ring.release(pos);
  EXPECT_TRUE(m.ring.push({4}));
  for (uint64_t want = 1; want <= 4; ++want) {
    ASSERT_TRUE(m.ring.take_exclusive(out, pos));
    EXPECT_EQ(want, out.v);
    EXPECT_EQ(want, pos);
    m.ring.release(pos);
  }
  EXPECT_FALSE(m.ring.take_exclusive(out, pos));
  EXPECT_TRUE(m.ring.empty());
}

TEST(ShmRing, FifoAndFull) {
  RingMem m(4);
  for (uint64_t i = 0; i < 4; ++i) EXPECT_TRUE(m.ring.push({i}));
  EXPECT_FALSE(m.ring.push({99}));
  Item it;
  for (uint64_t i = 0; i < 4; ++i) {
    ASSERT_TRUE(m.ring.pop(it));
    EXPECT_EQ(i, it.v);
  }
  EXPECT_FALSE(m.ring.pop(it));
  EXPECT_TRUE(m.ring.empty());
}

TEST(ShmRing, ManyThreadsLoseAndDuplicateNothing) {
  RingMem m(64);
  constexpr int kProducers = 3, kPer = 20000;
  std::vector<std::thread> ts;
  std::atomic<uint64_t> sum{0}, count{0};
  for (int p = 0; p < kProducers; ++p)
    ts.emplace_back([&, p] {
      for (int i = 0; i < kPer; ++i)
        while (!m.ring.push({uint64_t(p) * kPer + i + 1})) std::this_thread::yield();
    });
  for (int c = 0; c < 2; ++c)
    ts.emplace_back([&] {
      Item it;
      while (count.load() < uint64_t(kProducers) * kPer) {
        if (m.ring.pop(it)) {
          sum += it.v;
          count++;
        } else {
          std::this_thread::yield();
        }
      }
    });
  for (auto& t : ts) t.join();
  uint64_t n = uint64_t(kProducers) * kPer;
  EXPECT_EQ(n, count.load());
  EXPECT_EQ(n * (n + 1) / 2, sum.load());
}

// pop_exclusive (one consumer at a time, as a CQ's pollers under its poll
// lock) beside many producers: each producer's elements arrive in its own
// order, none lost or duplicated, through many wrap-arounds of a small ring.
TEST(ShmRing, ExclusiveConsumerBesideManyProducersKeepsEachProducersOrder) {
  RingMem m(8);
  constexpr int kProducers = 3, kPer = 20000;
  std::vector<std::thread> ts;
  for (int p = 0; p < kProducers; ++p)
    ts.emplace_back([&, p] {
      for (int i = 0; i < kPer; ++i)
        while (!m.ring.push({uint64_t(p) << 32 | uint64_t(i)})) std::this_thread::yield();
    });
  std::vector<uint64_t> next(kProducers, 0);
  uint64_t got = 0;
  Item it;
  while (got < uint64_t(kProducers) * kPer) {
    if (!m.ring.pop_exclusive(it)) {
      std::this_thread::yield();
      continue;
    }
    uint64_t p = it.v >> 32;
    ASSERT_LT(p, uint64_t(kProducers));
    ASSERT_EQ(next[p], it.v & 0xffffffffu);
    ++next[p];
    ++got;
  }
  for (auto& t : ts) t.join();
  EXPECT_FALSE(m.ring.pop_exclusive(it));
  EXPECT_TRUE(m.ring.empty());
}

TEST(ShmRing, WorksAcrossProcesses) {
  RingMem m(16);
  pid_t pid = ::fork();
  if (pid == 0) {
    for (uint64_t i = 1; i <= 10000; ++i)
      while (!m.ring.push({i})) ::sched_yield();
    ::_exit(0);
  }
  uint64_t expect = 1;
  Item it;
  while (expect <= 10000) {
    if (m.ring.pop(it)) {
      ASSERT_EQ(expect, it.v);
      ++expect;
    }
  }
  int st;
  ::waitpid(pid, &st, 0);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

}  // namespace
}  // namespace sv::shm

namespace sv::shm {
namespace {

// A pid that no longer exists: a child that exited and was reaped.
uint32_t dead_pid() {
  pid_t pid = ::fork();
  if (pid == 0) ::_exit(0);
  int st;
  ::waitpid(pid, &st, 0);
  return uint32_t(pid);
}

// The busy mark of docs/SHARED_MEMORY.md ("Rings"), as a claimer killed
// right after its compare-and-swap leaves it.
uint64_t busy_mark(bool consumer, uint32_t pid, uint64_t pos) {
  return (1ull << 63) | (consumer ? 1ull << 62 : 0) | (uint64_t(pid & 0x3fffffffu) << 32) | uint32_t(pos);
}

// A producer killed between claiming a slot and
// publishing it (here even before it moved the tail) must not stop the
// ring: other producers move the tail on, the consumer voids the slot.
TEST(ShmRing, ADeadProducersClaimIsVoidedAndTheRingGoesOn) {
  RingMem m(4);
  auto* h = static_cast<RingHeader*>(m.mem);
  auto* slots = reinterpret_cast<RingSlot<Item>*>(h + 1);
  ASSERT_TRUE(m.ring.push(Item{1}));
  slots[1].seq.store(busy_mark(false, dead_pid(), 1));  // claimed, tail still 1
  ASSERT_TRUE(m.ring.push(Item{2}));                     // counts the dead claim, takes position 2
  EXPECT_EQ(3u, h->tail.load());
  Item out{};
  ASSERT_TRUE(m.ring.pop(out));
  EXPECT_EQ(1u, out.v);
  // A poller judges a producer's mark only after meeting it many times in
  // a row (a live producer is nearly always about to publish).
  bool ready = false;
  for (int i = 0; i < 1000 && !ready; ++i) ready = m.ring.ready();
  EXPECT_TRUE(ready) << "a dead claim at the head must make a poller look";
  ASSERT_TRUE(m.ring.pop(out));  // voids position 1
  EXPECT_EQ(2u, out.v);
  for (uint64_t i = 10; i < 14; ++i) ASSERT_TRUE(m.ring.push(Item{i}));  // the whole ring is usable again
  EXPECT_FALSE(m.ring.push(Item{99}));
  for (uint64_t i = 10; i < 14; ++i) {
    ASSERT_TRUE(m.ring.pop(out));
    EXPECT_EQ(i, out.v);
  }
  EXPECT_TRUE(m.ring.empty());
}

// A CQ's poller asks ready() and then takes (CqView::poll): both judge the
// dead producer's mark, and the second must not wait its patience again
// (it did: the poller never voided the slot, and KillSharedQp's receiver
// stopped taking completions for good).
TEST(ShmRing, APollerThatAsksReadyFirstStillVoidsADeadProducersSlot) {
  RingMem m(4);
  auto* h = static_cast<RingHeader*>(m.mem);
  auto* slots = reinterpret_cast<RingSlot<Item>*>(h + 1);
  slots[0].seq.store(busy_mark(false, dead_pid(), 0));
  h->tail.store(1);
  ASSERT_TRUE(m.ring.push(Item{7}));
  Item out{};
  uint64_t pos = 0;
  bool took = false;
  for (int i = 0; i < 10000 && !took; ++i)
    if (m.ring.ready()) took = m.ring.take_exclusive(out, pos);
  ASSERT_TRUE(took) << "the poller never got past the dead producer's slot";
  EXPECT_EQ(7u, out.v);
}

// The same for an exclusive consumer (a CQ's poller), whose head moves with
// a store: a dead claim at the head is voided, and the slot the last take
// kept (take_exclusive) is given back by recover_exclusive, as after a
// poller killed with the poll lock.
TEST(ShmRing, ExclusiveConsumerVoidsDeadClaimsAndRecoversATakenSlot) {
  RingMem m(4);
  auto* h = static_cast<RingHeader*>(m.mem);
  auto* slots = reinterpret_cast<RingSlot<Item>*>(h + 1);
  uint32_t dead = dead_pid();
  slots[0].seq.store(busy_mark(false, dead, 0));
  h->tail.store(1);
  ASSERT_TRUE(m.ring.push(Item{5}));
  Item out{};
  uint64_t pos = 0;
  bool took = false;
  for (int i = 0; i < 1000 && !took; ++i) took = m.ring.take_exclusive(out, pos);  // patient with producer marks
  ASSERT_TRUE(took);
  EXPECT_EQ(5u, out.v);
  EXPECT_EQ(1u, pos);
  // Killed before release(pos): the next holder of the lock gives it back.
  m.ring.recover_exclusive();
  for (uint64_t i = 0; i < 4; ++i) ASSERT_TRUE(m.ring.push(Item{i})) << i;
  EXPECT_FALSE(m.ring.push(Item{99}));
}

// A consumer killed between claiming a slot and giving it back: its element
// is gone with it, and the producers get the slot back when they reach it.
TEST(ShmRing, ADeadConsumersClaimIsGivenBackToTheProducers) {
  RingMem m(2);
  auto* h = static_cast<RingHeader*>(m.mem);
  auto* slots = reinterpret_cast<RingSlot<Item>*>(h + 1);
  ASSERT_TRUE(m.ring.push(Item{1}));
  ASSERT_TRUE(m.ring.push(Item{2}));
  slots[0].seq.store(busy_mark(true, dead_pid(), 0));  // claimed position 0, head still 0
  Item out{};
  ASSERT_TRUE(m.ring.pop(out));  // moves the head past the dead claim
  EXPECT_EQ(2u, out.v);
  ASSERT_TRUE(m.ring.push(Item{3}));
  ASSERT_TRUE(m.ring.push(Item{4}));
  ASSERT_TRUE(m.ring.pop(out));
  EXPECT_EQ(3u, out.v);
  ASSERT_TRUE(m.ring.pop(out));
  EXPECT_EQ(4u, out.v);
}

// A consumer killed between claiming a slot and
// copying its element out. It named the position before the claim
// (pop_recorded), and the element is still in the slot: its recoverer gets
// it back (reclaim_dead_take) even after another consumer passed over the
// claim, and exactly once. A real process is killed there, not a forged mark.
TEST(ShmRing, AConsumerKilledRightAfterItsClaimLeavesTheElementToItsRecoverer) {
  RingMem m(4);
  auto* rec = static_cast<std::atomic<uint64_t>*>(
      ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(MAP_FAILED, static_cast<void*>(rec));
  rec->store(~0ull);
  ASSERT_TRUE(m.ring.push(Item{41}));
  ASSERT_TRUE(m.ring.push(Item{42}));
  pid_t child = ::fork();
  if (child == 0) {
    Item out{};
    m.ring.pop_recorded(out, [rec](uint64_t pos) { rec->store(pos); }, [](Item&, const Item&) { ::raise(SIGKILL); });
    ::_exit(0);
  }
  int st = 0;
  ::waitpid(child, &st, 0);
  ASSERT_TRUE(WIFSIGNALED(st));
  ASSERT_EQ(0u, rec->load());
  Item out{};
  ASSERT_TRUE(m.ring.pop(out));  // passes over the dead claim, leaves it
  EXPECT_EQ(42u, out.v);
  EXPECT_FALSE(m.ring.reclaim_dead_take(0, uint32_t(::getpid()), out)) << "not a dead consumer's claim";
  ASSERT_TRUE(m.ring.reclaim_dead_take(0, uint32_t(child), out));
  EXPECT_EQ(41u, out.v);
  EXPECT_FALSE(m.ring.reclaim_dead_take(0, uint32_t(child), out)) << "reclaimed twice";
  for (uint64_t i = 0; i < 4; ++i) ASSERT_TRUE(m.ring.push(Item{i})) << "the slot went back: " << i;
  EXPECT_FALSE(m.ring.push(Item{99}));
  ::munmap(rec, 4096);
}

// The consumer died after its claim and before it moved the head, and the
// recoverer takes the element back before any other consumer passed over
// the claim: the head moves past it, and the ring goes on. (Before, the slot
// went back behind a head that never passed it: every later pop found the
// ring empty, a receive queue stopped for good; KillSharedQp wedged so.)
TEST(ShmRing, ADeadClaimAtTheHeadTakenBackByItsRecovererLeavesTheRingGoing) {
  RingMem m(4);
  auto* slots = reinterpret_cast<RingSlot<Item>*>(static_cast<RingHeader*>(m.mem) + 1);
  ASSERT_TRUE(m.ring.push(Item{41}));
  ASSERT_TRUE(m.ring.push(Item{42}));
  uint32_t dead = dead_pid();
  slots[0].seq.store(busy_mark(true, dead, 0));  // claimed, head still 0
  Item out{};
  ASSERT_TRUE(m.ring.reclaim_dead_take(0, dead, out));
  EXPECT_EQ(41u, out.v);
  ASSERT_TRUE(m.ring.pop(out)) << "the ring stopped behind a slot given back";
  EXPECT_EQ(42u, out.v);
  for (uint64_t i = 0; i < 4; ++i) ASSERT_TRUE(m.ring.push(Item{i})) << i;
  EXPECT_FALSE(m.ring.push(Item{99}));
}

// A single consumer (a send queue under its lock) that peeks with front()
// passes over a claim its dead predecessor left at the head, as pop() does;
// at() still reads the element it took. (Before, front() found the queue
// empty while it was full: every post got ENOMEM.)
TEST(ShmRing, FrontPassesOverADeadConsumersClaimAtTheHead) {
  RingMem m(4);
  auto* slots = reinterpret_cast<RingSlot<Item>*>(static_cast<RingHeader*>(m.mem) + 1);
  ASSERT_TRUE(m.ring.push(Item{1}));
  ASSERT_TRUE(m.ring.push(Item{2}));
  slots[0].seq.store(busy_mark(true, dead_pid(), 0));
  const Item* f = m.ring.front();
  ASSERT_NE(nullptr, f);
  EXPECT_EQ(2u, f->v);
  EXPECT_EQ(1u, m.ring.head());
  EXPECT_EQ(1u, m.ring.at(0).v);
  Item out{};
  ASSERT_TRUE(m.ring.pop(out));
  EXPECT_EQ(2u, out.v);
  EXPECT_EQ(nullptr, m.ring.front());
}

// A producer that reaches a dead consumer's claim on its next lap takes the
// slot back; the recoverer, later, finds nothing to reclaim (and so never
// reports an element that was overwritten).
TEST(ShmRing, AProducerTakesBackADeadClaimAndTheRecovererFindsNothing) {
  RingMem m(2);
  auto* slots = reinterpret_cast<RingSlot<Item>*>(static_cast<RingHeader*>(m.mem) + 1);
  ASSERT_TRUE(m.ring.push(Item{1}));
  ASSERT_TRUE(m.ring.push(Item{2}));
  uint32_t dead = dead_pid();
  slots[0].seq.store(busy_mark(true, dead, 0));
  Item out{};
  ASSERT_TRUE(m.ring.pop(out));
  EXPECT_EQ(2u, out.v);
  ASSERT_TRUE(m.ring.push(Item{3}));  // position 2: slot 0 again
  EXPECT_FALSE(m.ring.reclaim_dead_take(0, dead, out));
  ASSERT_TRUE(m.ring.pop(out));
  EXPECT_EQ(3u, out.v);
}

// The claim is the index's move, and the index names the claimer (version
// 5): a process killed at any instruction after it leaves a claim that is
// known. Each case below kills a real process there.

// Runs `f` in a child process, which is killed by SIGKILL inside it;
// returns the child's pid once it is dead and reaped.
template <class F>
uint32_t killed_child(F f) {
  pid_t child = ::fork();
  if (child == 0) {
    f();
    ::_exit(0);  // not reached: f kills the child
  }
  int st = 0;
  ::waitpid(child, &st, 0);
  EXPECT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
  return uint32_t(child);
}

// A producer killed after its claim (the tail moved past its slot) and
// before it published: nothing is published behind it, so pollers see an
// empty ring; the next push records the dead claim in the slot, and the
// pollers then void it and take what follows, once and in order.
TEST(ShmRing, AProducerKilledAfterItsClaimIsVoidedOnceTheNextPushNamesIt) {
  for (bool exclusive : {true, false}) {
    RingMem m(4);
    auto* h = static_cast<RingHeader*>(m.mem);
    auto* slots = reinterpret_cast<RingSlot<Item>*>(h + 1);
    ASSERT_TRUE(m.ring.push(Item{1}));
    uint32_t dead = killed_child([&] { m.ring.push_prefix_then(Item{66}, sizeof(Item), [] { ::raise(SIGKILL); }); });
    EXPECT_EQ(2u, h->tail.load());
    EXPECT_EQ(dead, uint32_t(h->tail_by.load())) << "the tail names its last claimer";
    EXPECT_EQ(1u, slots[1].seq.load()) << "claimed, not published, not yet marked";
    Item out{};
    uint64_t pos = 0;
    ASSERT_TRUE(exclusive ? m.ring.take_exclusive(out, pos) : m.ring.pop(out));
    EXPECT_EQ(1u, out.v);
    if (exclusive) m.ring.release(pos);
    EXPECT_FALSE(m.ring.ready()) << "nothing published: empty";
    ASSERT_TRUE(m.ring.push(Item{2}));
    EXPECT_EQ(busy_mark(false, dead, 1), slots[1].seq.load()) << "the next push recorded the dead claim";
    bool took = false;
    for (int i = 0; i < 10000 && !took; ++i) {
      took = exclusive ? m.ring.take_exclusive(out, pos) : m.ring.pop(out);  // pollers are patient
    }
    ASSERT_TRUE(took) << "the dead producer's slot stopped the ring";
    EXPECT_EQ(2u, out.v) << "the dead producer's element must never be seen";
    if (exclusive) m.ring.release(pos);
    for (uint64_t i = 10; i < 14; ++i) ASSERT_TRUE(m.ring.push(Item{i})) << "the whole ring is usable again";
    EXPECT_FALSE(m.ring.push(Item{99}));
    for (uint64_t i = 10; i < 14; ++i) {
      ASSERT_TRUE(exclusive ? m.ring.take_exclusive(out, pos) : m.ring.pop(out));
      EXPECT_EQ(i, out.v);
      if (exclusive) m.ring.release(pos);
    }
  }
}

// A consumer killed after its claim, with nobody popping after it: the head
// alone names it. Its recoverer gets the element back, once; the ring goes on.
TEST(ShmRing, AConsumerKilledAfterItsClaimIsReclaimedWhileOnlyTheHeadNamesIt) {
  RingMem m(4);
  auto* h = static_cast<RingHeader*>(m.mem);
  ASSERT_TRUE(m.ring.push(Item{41}));
  ASSERT_TRUE(m.ring.push(Item{42}));
  uint32_t dead = killed_child([&] {
    Item out{};
    m.ring.pop_with(out, [](Item&, const Item&) { ::raise(SIGKILL); });
  });
  EXPECT_EQ(1u, h->head.load());
  EXPECT_EQ(dead, uint32_t(h->head_by.load()));
  Item out{};
  EXPECT_FALSE(m.ring.reclaim_dead_take(0, uint32_t(::getpid()), out)) << "not the claimer";
  EXPECT_FALSE(m.ring.reclaim_dead_take(1, dead, out)) << "not its position";
  ASSERT_TRUE(m.ring.reclaim_dead_take(0, dead, out));
  EXPECT_EQ(41u, out.v);
  EXPECT_FALSE(m.ring.reclaim_dead_take(0, dead, out)) << "reclaimed twice";
  ASSERT_TRUE(m.ring.pop(out));
  EXPECT_EQ(42u, out.v);
  for (uint64_t i = 0; i < 4; ++i) ASSERT_TRUE(m.ring.push(Item{i})) << "the slot went back: " << i;
  EXPECT_FALSE(m.ring.push(Item{99}));
}

// The same claim, met by a producer on its next lap before any recoverer:
// the producer takes the slot back (its element died with its consumer),
// and the recoverer then finds nothing, rather than an overwritten element.
TEST(ShmRing, AProducerTakesBackAClaimOnlyTheHeadNamesWhenItsConsumerDied) {
  RingMem m(2);
  ASSERT_TRUE(m.ring.push(Item{1}));
  ASSERT_TRUE(m.ring.push(Item{2}));
  uint32_t dead = killed_child([&] {
    Item out{};
    m.ring.pop_with(out, [](Item&, const Item&) { ::raise(SIGKILL); });
  });
  ASSERT_TRUE(m.ring.push(Item{9})) << "position 2 is slot 0 again: taken back from the dead consumer";
  Item out{};
  EXPECT_FALSE(m.ring.reclaim_dead_take(0, dead, out)) << "the producer took it back first";
  ASSERT_TRUE(m.ring.pop(out));
  EXPECT_EQ(2u, out.v);
  ASSERT_TRUE(m.ring.pop(out));
  EXPECT_EQ(9u, out.v);
  EXPECT_FALSE(m.ring.pop(out));
}

// While a live consumer holds its claim (copying out), a producer that laps
// onto the slot finds the ring full, and takes nothing from under it.
TEST(ShmRing, ALiveConsumersClaimIsNeverTakenBack) {
  RingMem m(2);
  auto* h = static_cast<RingHeader*>(m.mem);
  auto* slots = reinterpret_cast<RingSlot<Item>*>(h + 1);
  ASSERT_TRUE(m.ring.push(Item{1}));
  ASSERT_TRUE(m.ring.push(Item{2}));
  // Our own claim of position 0, as pop() leaves it before it gives the slot back.
  h->head.store(1);
  h->head_by.store(uint32_t(::getpid()));
  EXPECT_FALSE(m.ring.push(Item{3})) << "full: the claimer is alive";
  EXPECT_EQ(1u, slots[0].seq.load());
}

// A waiter that waited long gets the next turn, even against a holder that
// takes the lock again at once (KillSharedQp: a third poster starved for
// 30 s by two that posted in a loop). Pids stand for processes here: the
// waiter's is our parent's (alive).
TEST(ShmLock, AStarvedWaiterGetsTheNextTurn) {
  ShmLock lock{};
  const uint32_t me = uint32_t(::getpid()), other = uint32_t(::getppid());
  ASSERT_FALSE(lock.lock(me));
  std::atomic<bool> waiter_got{false};
  std::thread waiter([&] {
    EXPECT_FALSE(lock.lock(other));
    waiter_got = true;
    lock.unlock();
  });
  while (lock.next.load() != other) std::this_thread::yield();  // it asked for the next turn
  lock.unlock();
  EXPECT_FALSE(lock.lock(me));  // only after the waiter's turn
  EXPECT_TRUE(waiter_got.load()) << "the holder took the lock again before the starved waiter";
  EXPECT_EQ(0u, lock.next.load());
  lock.unlock();
  waiter.join();
}

// A waiter that asked for the next turn and died does not keep it.
TEST(ShmLock, ADeadWaitersTurnIsDropped) {
  ShmLock lock{};
  lock.next.store(dead_pid());
  EXPECT_FALSE(lock.lock(uint32_t(::getpid())));
  EXPECT_EQ(0u, lock.next.load());
  lock.unlock();
}

TEST(ShmLock, ALockHeldByADeadProcessIsTakenOver) {
  auto* lock = static_cast<ShmLock*>(
      ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  lock->owner.store(0);
  pid_t pid = ::fork();
  if (pid == 0) {
    lock->lock(uint32_t(::getpid()));
    ::_exit(0);  // dies holding it
  }
  int st;
  ::waitpid(pid, &st, 0);
  EXPECT_EQ(uint32_t(pid), lock->owner.load());
  EXPECT_TRUE(lock->lock(uint32_t(::getpid()))) << "must not hang, and must say it took over";
  EXPECT_EQ(uint32_t(::getpid()), lock->owner.load());
  lock->unlock();
  ::munmap(lock, 4096);
}

}  // namespace
}  // namespace sv::shm
