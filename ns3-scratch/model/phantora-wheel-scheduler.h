// An event scheduler for packet-level runs: a timing wheel of 1 ns slots, a 4-ary heap for the rest.
#ifndef PHANTORA_WHEEL_SCHEDULER_H
#define PHANTORA_WHEEL_SCHEDULER_H

#include "ns3/scheduler.h"

#include <array>
#include <cstdint>
#include <vector>

namespace ns3 {

/// A 4-ary min-heap of events by (time, uid), in one vector.
class EventHeap {
 public:
  bool Empty() const { return m_heap.empty(); }
  /// Time of the earliest event, or UINT64_MAX if there is none (kept up to date: no load of the top).
  uint64_t TopTs() const { return m_topTs; }
  const Scheduler::Event& Top() const { return m_heap.front(); }
  void Push(const Scheduler::Event& ev);
  Scheduler::Event Pop();
  /// Take out the event with this uid; false if it is not here.
  bool Erase(uint32_t uid);

 private:
  void SiftDown(std::size_t hole);  ///< fill `hole` with the last event, moved down to its place

  std::vector<Scheduler::Event> m_heap;
  uint64_t m_topTs = UINT64_MAX;
};

/**
 * The events of the next kSlots ns sit in a wheel of 1 ns slots (each slot in uid order, a bitmap of the
 * slots in use); later ones, and the rare event earlier than the wheel's window, in an EventHeap. Almost
 * every event of a packet run (serialisation ends, arrivals one link delay later, ACKs, pacing) lands in
 * the wheel: inserting and removing cost O(1), with no allocation once the slots have grown. Events leave
 * in (time, uid) order, as from every ns-3 scheduler, so the choice never changes a result.
 */
class PhantoraWheelScheduler final : public Scheduler {
 public:
  static TypeId GetTypeId();

  void Insert(const Event& ev) override { InsertHinted(ev, nullptr); }
  /// Insert with a prefetch hint: an address the event will read first (its packet, its device), loaded into the
  /// cache while the event before it runs. Only a hint: never read here, so it may be null or stale.
  void InsertHinted(const Event& ev, const void* hint);
  bool IsEmpty() const override { return m_inWheel == 0 && m_far.Empty(); }
  Event PeekNext() const override;
  Event RemoveNext() override;
  void Remove(const Event& ev) override;

 private:
  static constexpr uint64_t kSlots = 8192;  ///< ns covered by the wheel (a power of 2)
  static constexpr uint64_t kWords = kSlots / 64;
  /// A queued event and its prefetch hint (32 bytes: two to a cache line).
  struct Entry {
    Event ev;
    const void* hint;
  };
  struct Slot {
    std::vector<Entry> events;  ///< in uid order from `head` on
    std::size_t head = 0;
  };

  /// The first slot in use at or after `m_base` (cyclically), or kSlots if the wheel is empty.
  uint64_t NextSlot() const;
  /// True if the wheel's earliest event (slot `s`) runs before the heap's earliest.
  bool WheelFirst(uint64_t s) const;

  std::vector<Slot> m_slots = std::vector<Slot>(kSlots);
  std::array<uint64_t, kWords> m_used{};  ///< bit s: slot s holds events
  uint64_t m_base = 0;                    ///< the wheel holds events with times in [m_base, m_base + kSlots)
  uint64_t m_inWheel = 0;
  EventHeap m_far;
};

}  // namespace ns3

#endif  // PHANTORA_WHEEL_SCHEDULER_H
