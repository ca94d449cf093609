// An event scheduler that orders the events of one time step by a key each node computes alone (issue 38).
#ifndef PHANTORA_KEYED_SCHEDULER_H
#define PHANTORA_KEYED_SCHEDULER_H

#include "ns3/scheduler.h"

#include <array>
#include <cstdint>
#include <vector>

namespace ns3 {

/**
 * Who scheduled an event, and when: the order of events of one time step in the keyed mode. Events of one
 * time step run in (schedTs, node, count) order, where `node` is the context of the event that scheduled it
 * (kNoContext if that event has none, kCaller for events scheduled from outside an event: so at one
 * scheduling time, after every node's) and `count` that node's count of events scheduled so far (the caller's:
 * its own order). Every field is known to the scheduling node alone, so a worker
 * that runs a group of nodes orders its events as one engine does, whatever order it learnt of them in.
 */
struct PhantoraOrderKey {
  static constexpr uint32_t kCaller = 0xffffffff;     ///< `node` of the caller's events (between runs)
  static constexpr uint32_t kNoContext = 0xfffffffe;  ///< `node` of events scheduled by a context-less event
  /// `node` of a partition worker's running key in a lockstep round (its `count` the round): the workers run
  /// the events of one time step one worker at a time, in one engine's order, and the rounds give that order.
  static constexpr uint32_t kLockstep = 0xfffffffd;
  /// The caller's counts are split in two ranges so that no caller event can take a queue sample's key: its own
  /// events count from 0 up to kSampleCount (exclusive; PhantoraSimulatorImpl refuses the next), and a queue
  /// sample of ns ts has (ts, kCaller, kSampleCount + slot), slot < kSampleSlots (a partition worker's group):
  /// after every other event of its ns, one engine's and every worker's alike, the workers' in group order.
  static constexpr uint32_t kSampleCount = 0xffff0000u;
  static constexpr uint32_t kSampleSlots = 0xffffffffu - kSampleCount;  ///< UINT32_MAX itself stays unused
  uint64_t schedTs = 0;                            ///< time step at which the event was scheduled
  uint32_t node = kCaller;                         ///< the scheduling node
  uint32_t count = 0;                              ///< the scheduling node's count of events scheduled before
};

/// The key of a queue sample at ns `ts` taken by sampler `slot` (< kSampleSlots; 0 for one engine).
inline PhantoraOrderKey SampleKey(uint64_t ts, uint32_t slot) {
  return PhantoraOrderKey{ts, PhantoraOrderKey::kCaller, PhantoraOrderKey::kSampleCount + slot};
}

/// The key after every other of time step `ts`, its queue samples' included (the count UINT32_MAX, which no node
/// and no sampler takes): a run call's stop that ends the step (PhantoraNetwork::RunTo). A stop with the caller's
/// next key orders before the samples of its step, so a run call to a sampling instant would never get past it.
inline PhantoraOrderKey StepEndKey(uint64_t ts) {
  return PhantoraOrderKey{ts, PhantoraOrderKey::kCaller, UINT32_MAX};
}

/// True if `a` orders before `b` among events of one time step (schedTs, then node, then count).
inline bool KeyBefore(const PhantoraOrderKey& a, const PhantoraOrderKey& b) {
  if (a.schedTs != b.schedTs) {
    return a.schedTs < b.schedTs;
  }
  return a.node != b.node ? a.node < b.node : a.count < b.count;
}

/**
 * Events by (time, order key): the next 8,192 ns in a wheel of 1 ns slots, each slot in key order (a slot's new
 * events almost always have the largest key: their scheduling time is now), the rest in a 4-ary heap, as
 * PhantoraWheelScheduler does by uid. It needs the key with every event:
 * PhantoraSimulatorImpl computes it and calls InsertKeyed() directly. The Scheduler interface's Insert() has
 * no key and is refused (another simulator core, e.g. ns3::DefaultSimulatorImpl, cannot run this mode). The
 * uid still names an event (Remove, EventId) but no longer orders it; keys are unique by construction (one
 * count per node), and the uid breaks a tie between equal keys only if a caller gave two events one key.
 */
class PhantoraKeyedScheduler final : public Scheduler {
 public:
  static TypeId GetTypeId();

  /// Queue `ev` with its order key.
  void InsertKeyed(const Event& ev, const PhantoraOrderKey& key);
  /// Hold `ev` with its key for FlushStaged() (not queued until then): a partition worker's batch of cut-cable
  /// arrivals, queued at once instead of one wheel insert each.
  void InsertStaged(const Event& ev, const PhantoraOrderKey& key) { m_staged.push_back(Item{ev, key}); }
  /// Queue the events InsertStaged() holds: sorted by (time, key) and merged into a sorted run beside the wheel
  /// and the heap, whose least is taken with theirs (the events' order is the same).
  void FlushStaged();
  /// Refused: an event needs its order key (an NS_FATAL_ERROR naming the simulator core to use).
  void Insert(const Event& ev) override;
  bool IsEmpty() const override { return m_inWheel == 0 && m_heap.empty() && m_runHead == m_run.size(); }
  Event PeekNext() const override { return PeekItem().ev; }
  /// Time step of the next event (the queue must not be empty): PeekNext()'s without copying the event.
  uint64_t PeekNextTs() const { return PeekItem().ev.key.m_ts; }
  Event RemoveNext() override;
  /// RemoveNext() without the virtual call (PhantoraSimulatorImpl::RunBefore's loop).
  Event TakeNext() { return Take().ev; }
  /// The next event's time step and key, located once (the queue must not be empty).
  const PhantoraOrderKey& PeekNextTsKey(uint64_t& ts) const {
    const Item& i = PeekItem();
    ts = i.ev.key.m_ts;
    return i.key;
  }
  void Remove(const Event& ev) override;
  /// The key of the next event (the heap must not be empty).
  const PhantoraOrderKey& PeekNextKey() const { return PeekItem().key; }
  /// Time step of the next event that is not cancelled, or -1 (the events' order is unchanged).
  int64_t PeekNextLiveTs();
  /// The least `ts + dist[context]` over the events not cancelled (`other` for a context past `dist`, such as
  /// Simulator::NO_CONTEXT), saturating; UINT64_MAX if none. `least` (> 0): no distance is below it, so the scan
  /// stops at the first time step that cannot do better (the wheel in time order, the heap's subtrees pruned).
  uint64_t LeastReach(const std::vector<uint64_t>& dist, uint64_t other, uint64_t least) const;

 private:
  struct Item {
    Event ev;
    PhantoraOrderKey key;
  };
  struct Slot {
    std::vector<Item> items;  ///< in key order from `head` on
    std::size_t head = 0;
  };
  static constexpr uint64_t kSlots = 8192;  ///< ns covered by the wheel (a power of 2)
  static constexpr uint64_t kWords = kSlots / 64;

  static bool Before(const Item& a, const Item& b);
  void Add(const Item& item);  ///< into the wheel or the heap
  Item Take();                 ///< the least item out
  /// The least item; inline, so that a worker's peeks at a located item are a compare and a load each.
  const Item& PeekItem() const {
    if (m_from == kUnknown) {
      Locate();
    }
    if (m_from == kFromRun) [[unlikely]] {
      return m_run[m_runHead];
    }
    return m_from == kFromWheel ? m_slots[m_fromSlot].items[m_slots[m_fromSlot].head] : m_heap.front();
  }
  /// Where the least item is (m_from, m_fromSlot), found once and kept until the queue changes: a partition
  /// worker peeks at the next event three times before it takes it (its running key, its window's end).
  void Locate() const;
  uint64_t NextSlot() const;  ///< the first slot in use from m_base on (cyclically), kSlots if none
  bool WheelFirst(uint64_t s) const;
  bool RunFirst(uint64_t s) const;  ///< the run's head orders before the wheel's (slot s) and the heap's
  void Push(const Item& item);  ///< into the heap
  Item Pop();                   ///< the heap's least

  std::vector<Slot> m_slots = std::vector<Slot>(kSlots);
  std::array<uint64_t, kWords> m_used{};
  uint64_t m_base = 0;  ///< the wheel holds times in [m_base, m_base + kSlots)
  uint64_t m_inWheel = 0;
  std::vector<Item> m_heap;  ///< events outside the wheel's window
  std::vector<Item> m_run;     ///< FlushStaged()'s events in order, from m_runHead on
  std::size_t m_runHead = 0;
  std::vector<Item> m_staged;  ///< InsertStaged()'s, not yet flushed
  std::vector<Item> m_merged;  ///< FlushStaged()'s buffer
  enum From : uint8_t { kUnknown, kFromRun, kFromWheel, kFromHeap };
  mutable From m_from = kUnknown;  ///< Locate()'s answer, kUnknown once anything is queued or taken
  mutable uint64_t m_fromSlot = 0;  ///< with kFromWheel: the slot
};

}  // namespace ns3

#endif  // PHANTORA_KEYED_SCHEDULER_H
