// PhantoraWheelScheduler: timing wheel + heap; EventHeap.
#include "phantora-wheel-scheduler.h"
#include "phantora-type-id.h"

#include "ns3/event-impl.h"
#include "ns3/fatal-error.h"

#include <algorithm>

namespace ns3 {

NS_OBJECT_ENSURE_REGISTERED(PhantoraWheelScheduler);

namespace {

/// (time, uid) as one number: events run in this order.
inline unsigned __int128 Order(const Scheduler::Event& ev) {
  return (static_cast<unsigned __int128>(ev.key.m_ts) << 32) | ev.key.m_uid;
}

constexpr std::size_t kArity = 4;  ///< children per heap node: a shallower heap, its children side by side

}  // namespace

// ----- EventHeap ------------------------------------------------------------------------------
void EventHeap::Push(const Scheduler::Event& ev) {
  const unsigned __int128 key = Order(ev);
  std::size_t hole = m_heap.size();
  m_heap.emplace_back();
  while (hole > 0) {
    const std::size_t parent = (hole - 1) / kArity;
    if (Order(m_heap[parent]) <= key) {
      break;
    }
    m_heap[hole] = m_heap[parent];
    hole = parent;
  }
  m_heap[hole] = ev;
  m_topTs = m_heap.front().key.m_ts;
}

Scheduler::Event EventHeap::Pop() {
  const Scheduler::Event top = m_heap.front();
  SiftDown(0);
  m_topTs = m_heap.empty() ? UINT64_MAX : m_heap.front().key.m_ts;
  return top;
}

void EventHeap::SiftDown(std::size_t hole) {
  const Scheduler::Event last = m_heap.back();
  m_heap.pop_back();
  const std::size_t n = m_heap.size();
  if (hole == n) {
    return;
  }
  const unsigned __int128 key = Order(last);
  for (;;) {
    const std::size_t first = hole * kArity + 1;
    if (first >= n) {
      break;
    }
    std::size_t best = first;
    unsigned __int128 bestKey = Order(m_heap[first]);
    for (std::size_t c = first + 1; c < std::min(first + kArity, n); ++c) {
      const unsigned __int128 k = Order(m_heap[c]);
      if (k < bestKey) {
        best = c;
        bestKey = k;
      }
    }
    if (key <= bestKey) {
      break;
    }
    m_heap[hole] = m_heap[best];
    hole = best;
  }
  m_heap[hole] = last;
}

bool EventHeap::Erase(uint32_t uid) {
  auto it = std::find_if(m_heap.begin(), m_heap.end(), [uid](const Scheduler::Event& e) { return e.key.m_uid == uid; });
  if (it == m_heap.end()) {
    return false;
  }
  std::vector<Scheduler::Event> rest;  // rare (Simulator::Remove): rebuild without it
  rest.swap(m_heap);
  m_topTs = UINT64_MAX;
  rest.erase(it);
  for (const Scheduler::Event& e : rest) {
    Push(e);
  }
  return true;
}

// ----- PhantoraWheelScheduler -----------------------------------------------------------------
TypeId PhantoraWheelScheduler::GetTypeId() {
  static TypeId tid = PhantoraTypeId<PhantoraWheelScheduler, Scheduler>("ns3::PhantoraWheelScheduler");
  return tid;
}

void PhantoraWheelScheduler::InsertHinted(const Event& ev, const void* hint) {
  const uint64_t ts = ev.key.m_ts;
  if (ts < m_base || ts - m_base >= kSlots) {
    m_far.Push(ev);  // (no hint: the far heap is rare and its events are not the next ones)
    return;
  }
  const uint64_t s = ts & (kSlots - 1);
  Slot& slot = m_slots[s];
  auto& v = slot.events;
  if (slot.head == v.size() || v.back().ev.key.m_uid < ev.key.m_uid) {
    v.push_back(Entry{ev, hint});  // the usual case: uids grow as events are scheduled
  } else {
    // An event put back (PhantoraScheduler::PeekNextLiveTs) behind later-scheduled ones: keep uid order.
    auto pos = std::upper_bound(v.begin() + static_cast<std::ptrdiff_t>(slot.head), v.end(), ev.key.m_uid,
                                [](uint32_t uid, const Entry& b) { return uid < b.ev.key.m_uid; });
    v.insert(pos, Entry{ev, hint});
  }
  m_used[s / 64] |= uint64_t{1} << (s % 64);
  ++m_inWheel;
}

// Inline (only RemoveNext and PeekNext call these): two calls fewer per event.
[[gnu::always_inline]] inline uint64_t PhantoraWheelScheduler::NextSlot() const {
  if (m_inWheel == 0) {
    return kSlots;
  }
  const uint64_t start = m_base & (kSlots - 1);
  uint64_t w = start / 64;
  uint64_t bits = m_used[w] & (~uint64_t{0} << (start % 64));
  for (uint64_t i = 0; i <= kWords; ++i) {
    if (bits) {
      return w * 64 + static_cast<uint64_t>(__builtin_ctzll(bits));
    }
    w = (w + 1) % kWords;
    bits = m_used[w];
  }
  NS_FATAL_ERROR("PhantoraWheelScheduler: events counted but no slot in use");
  return kSlots;
}

[[gnu::always_inline]] inline bool PhantoraWheelScheduler::WheelFirst(uint64_t s) const {
  if (s == kSlots) {
    return false;
  }
  // (time, uid) order; the heap's top time is cached (UINT64_MAX when it is empty): its uid only on a tie.
  const Slot& slot = m_slots[s];
  const Event& first = slot.events[slot.head].ev;
  const uint64_t farTs = m_far.TopTs();
  if (first.key.m_ts != farTs || m_far.Empty()) {
    return first.key.m_ts < farTs || m_far.Empty();
  }
  return first.key.m_uid < m_far.Top().key.m_uid;
}

Scheduler::Event PhantoraWheelScheduler::PeekNext() const {
  const uint64_t s = NextSlot();
  return WheelFirst(s) ? m_slots[s].events[m_slots[s].head].ev : m_far.Top();
}

Scheduler::Event PhantoraWheelScheduler::RemoveNext() {
  const uint64_t s = NextSlot();
  if (!WheelFirst(s)) {
    const Event ev = m_far.Pop();
    if (ev.key.m_ts > m_base && m_inWheel == 0) {
      m_base = ev.key.m_ts;  // an empty wheel moves on to where the run is
    }
    return ev;
  }
  Slot& slot = m_slots[s];
  const Event ev = slot.events[slot.head++].ev;
  if (slot.head == slot.events.size()) {
    slot.events.clear();
    slot.head = 0;
    m_used[s / 64] &= ~(uint64_t{1} << (s % 64));
  } else {
    // Most likely the next event to run: load its object, and what it reads first (its hint), while this one
    // runs (both are usually out of cache by now, having been touched a link delay ago, and Invoke would wait).
    const Entry& next = slot.events[slot.head];
    __builtin_prefetch(next.ev.impl);
    if (next.hint != nullptr) {
      __builtin_prefetch(next.hint);
    }
  }
  --m_inWheel;
  // Everything left is at or after this event, so the window can start here; the wheel's events are
  // all inside [ts, m_base + kSlots), a part of the new window.
  m_base = ev.key.m_ts;
  return ev;
}

void PhantoraWheelScheduler::Remove(const Event& ev) {
  const uint64_t ts = ev.key.m_ts;
  if (ts >= m_base && ts - m_base < kSlots) {
    const uint64_t s = ts & (kSlots - 1);
    Slot& slot = m_slots[s];
    for (std::size_t i = slot.head; i < slot.events.size(); ++i) {
      if (slot.events[i].ev.key.m_uid == ev.key.m_uid) {
        slot.events.erase(slot.events.begin() + static_cast<std::ptrdiff_t>(i));
        if (slot.head == slot.events.size()) {
          slot.events.clear();
          slot.head = 0;
          m_used[s / 64] &= ~(uint64_t{1} << (s % 64));
        }
        --m_inWheel;
        return;
      }
    }
  }
  if (!m_far.Erase(ev.key.m_uid)) {
    NS_FATAL_ERROR("PhantoraWheelScheduler::Remove: no such event");
  }
}

}  // namespace ns3
