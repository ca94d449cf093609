// PhantoraKeyedScheduler: a 4-ary heap by (time, scheduling time, scheduling node, that node's count).
#include "phantora-keyed-scheduler.h"
#include "phantora-type-id.h"

#include "ns3/event-impl.h"
#include "ns3/fatal-error.h"
#include "ns3/log.h"

#include <algorithm>
#include <iterator>

namespace ns3 {

NS_LOG_COMPONENT_DEFINE("PhantoraKeyedScheduler");
NS_OBJECT_ENSURE_REGISTERED(PhantoraKeyedScheduler);

namespace {
constexpr std::size_t kArity = 4;
}  // namespace

TypeId PhantoraKeyedScheduler::GetTypeId() {
  static TypeId tid = PhantoraTypeId<PhantoraKeyedScheduler, Scheduler>("ns3::PhantoraKeyedScheduler");
  return tid;
}

bool PhantoraKeyedScheduler::Before(const Item& a, const Item& b) {
  if (a.ev.key.m_ts != b.ev.key.m_ts) {
    return a.ev.key.m_ts < b.ev.key.m_ts;
  }
  if (a.key.schedTs != b.key.schedTs) {
    return a.key.schedTs < b.key.schedTs;
  }
  if (a.key.node != b.key.node) {
    return a.key.node < b.key.node;
  }
  if (a.key.count != b.key.count) {
    return a.key.count < b.key.count;
  }
  return a.ev.key.m_uid < b.ev.key.m_uid;
}

void PhantoraKeyedScheduler::InsertKeyed(const Event& ev, const PhantoraOrderKey& key) { Add(Item{ev, key}); }

void PhantoraKeyedScheduler::Add(const Item& item) {
  m_from = kUnknown;
  const uint64_t ts = item.ev.key.m_ts;
  if (ts < m_base || ts - m_base >= kSlots) {
    Push(item);
    return;
  }
  const uint64_t s = ts & (kSlots - 1);
  Slot& slot = m_slots[s];
  auto& v = slot.items;
  if (slot.head == v.size() || Before(v.back(), item)) {
    v.push_back(item);  // the usual case: scheduled now, after everything of this slot
  } else {
    auto pos = std::upper_bound(v.begin() + static_cast<std::ptrdiff_t>(slot.head), v.end(), item, Before);
    v.insert(pos, item);
  }
  m_used[s / 64] |= uint64_t{1} << (s % 64);
  ++m_inWheel;
}

uint64_t PhantoraKeyedScheduler::NextSlot() const {
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
  NS_FATAL_ERROR("PhantoraKeyedScheduler: events counted but no slot in use");
  return kSlots;
}

bool PhantoraKeyedScheduler::WheelFirst(uint64_t s) const {
  if (s == kSlots) {
    return false;
  }
  return m_heap.empty() || Before(m_slots[s].items[m_slots[s].head], m_heap.front());
}

bool PhantoraKeyedScheduler::RunFirst(uint64_t s) const {
  if (m_runHead == m_run.size()) {
    return false;
  }
  const Item& r = m_run[m_runHead];
  if (s != kSlots && !Before(r, m_slots[s].items[m_slots[s].head])) {
    return false;
  }
  return m_heap.empty() || Before(r, m_heap.front());
}

void PhantoraKeyedScheduler::FlushStaged() {
  if (m_staged.empty()) {
    return;
  }
  m_from = kUnknown;
  std::sort(m_staged.begin(), m_staged.end(), Before);
  if (m_runHead == m_run.size()) {
    m_run.swap(m_staged);
  } else {
    m_merged.clear();
    m_merged.reserve(m_run.size() - m_runHead + m_staged.size());
    std::merge(m_run.begin() + static_cast<std::ptrdiff_t>(m_runHead), m_run.end(), m_staged.begin(),
               m_staged.end(), std::back_inserter(m_merged), Before);
    m_run.swap(m_merged);
  }
  m_runHead = 0;
  m_staged.clear();
}

void PhantoraKeyedScheduler::Locate() const {
  if (m_from != kUnknown) {
    return;
  }
  const uint64_t s = NextSlot();
  if (RunFirst(s)) [[unlikely]] {
    m_from = kFromRun;
  } else if (WheelFirst(s)) {
    m_from = kFromWheel;
    m_fromSlot = s;
  } else {
    m_from = kFromHeap;
  }
}

PhantoraKeyedScheduler::Item PhantoraKeyedScheduler::Take() {
  Locate();
  const From from = m_from;
  m_from = kUnknown;
  if (from == kFromRun) [[unlikely]] {
    const Item item = m_run[m_runHead++];
    if (m_runHead == m_run.size()) {
      m_run.clear();
      m_runHead = 0;
    }
    if (item.ev.key.m_ts > m_base && m_inWheel == 0) {
      m_base = item.ev.key.m_ts;  // as the heap's: an empty wheel moves on to where the run is
    }
    return item;
  }
  if (from == kFromHeap) {
    const Item item = Pop();
    if (item.ev.key.m_ts > m_base && m_inWheel == 0) {
      m_base = item.ev.key.m_ts;  // an empty wheel moves on to where the run is
    }
    return item;
  }
  const uint64_t s = m_fromSlot;
  Slot& slot = m_slots[s];
  const Item item = slot.items[slot.head++];
  if (slot.head == slot.items.size()) {
    slot.items.clear();
    slot.head = 0;
    m_used[s / 64] &= ~(uint64_t{1} << (s % 64));
  }
  --m_inWheel;
  m_base = item.ev.key.m_ts;  // everything left is at or after it
  return item;
}

void PhantoraKeyedScheduler::Insert(const Event& ev) {
  NS_FATAL_ERROR("ns3::PhantoraKeyedScheduler orders events by a key only ns3::PhantoraSimulatorImpl computes: "
                 "set the fabric's attribute 'Simulator' to ns3::PhantoraSimulatorImpl");
}

Scheduler::Event PhantoraKeyedScheduler::RemoveNext() { return Take().ev; }

void PhantoraKeyedScheduler::Remove(const Event& ev) {
  m_from = kUnknown;
  const uint32_t uid = ev.key.m_uid;
  const uint64_t ts = ev.key.m_ts;
  if (ts >= m_base && ts - m_base < kSlots) {
    const uint64_t s = ts & (kSlots - 1);
    Slot& slot = m_slots[s];
    for (std::size_t i = slot.head; i < slot.items.size(); ++i) {
      if (slot.items[i].ev.key.m_uid == uid) {
        slot.items.erase(slot.items.begin() + static_cast<std::ptrdiff_t>(i));
        if (slot.head == slot.items.size()) {
          slot.items.clear();
          slot.head = 0;
          m_used[s / 64] &= ~(uint64_t{1} << (s % 64));
        }
        --m_inWheel;
        return;
      }
    }
  }
  auto byUid = [uid](const Item& i) { return i.ev.key.m_uid == uid; };
  auto inRun = std::find_if(m_run.begin() + static_cast<std::ptrdiff_t>(m_runHead), m_run.end(), byUid);
  if (inRun != m_run.end()) {
    m_run.erase(inRun);  // the rest stays in order
    return;
  }
  auto it = std::find_if(m_heap.begin(), m_heap.end(), byUid);
  if (it == m_heap.end()) {
    NS_FATAL_ERROR("PhantoraKeyedScheduler::Remove: no event with uid " << uid);
  }
  std::vector<Item> rest;  // rare (Simulator::Remove): rebuild without it
  rest.swap(m_heap);
  rest.erase(it);
  for (const Item& i : rest) {
    Push(i);
  }
}

int64_t PhantoraKeyedScheduler::PeekNextLiveTs() {
  std::vector<Item> cancelled;
  int64_t ts = -1;
  while (!IsEmpty()) {
    const Item& next = PeekItem();
    if (!next.ev.impl->IsCancelled()) {
      ts = static_cast<int64_t>(next.ev.key.m_ts);
      break;
    }
    cancelled.push_back(Take());
  }
  for (const Item& i : cancelled) {
    Add(i);  // with its key: the order is unchanged
  }
  return ts;
}

namespace {
uint64_t SatAdd(uint64_t a, uint64_t b) { return b > UINT64_MAX - a ? UINT64_MAX : a + b; }
}  // namespace

uint64_t PhantoraKeyedScheduler::LeastReach(const std::vector<uint64_t>& dist, uint64_t other,
                                            uint64_t least) const {
  uint64_t best = UINT64_MAX;
  auto reach = [&dist, other](const Item& i) {
    const uint32_t c = i.ev.key.m_context;
    return SatAdd(i.ev.key.m_ts, c < dist.size() ? dist[c] : other);
  };
  // The wheel holds one time step per slot, [m_base, m_base + kSlots): walk the slots in use in time order.
  const uint64_t start = m_base & (kSlots - 1);
  uint64_t off = 0;  // time steps from m_base not yet looked at start here
  while (m_inWheel > 0 && off < kSlots && SatAdd(m_base + off, least) < best) {
    uint64_t s = (start + off) & (kSlots - 1);
    uint64_t bits = m_used[s / 64] & (~uint64_t{0} << (s % 64));
    while (bits == 0) {
      off += 64 - s % 64;  // on to the next word of slots
      if (off >= kSlots) {
        break;
      }
      s = (start + off) & (kSlots - 1);
      bits = m_used[s / 64];
    }
    if (off >= kSlots) {
      break;
    }
    const uint64_t hit = s / 64 * 64 + static_cast<uint64_t>(__builtin_ctzll(bits));
    off += hit - s;
    if (off >= kSlots || SatAdd(m_base + off, least) >= best) {
      break;  // past the wheel's end, or no event from here on can do better
    }
    const Slot& slot = m_slots[hit];
    for (std::size_t k = slot.head; k < slot.items.size(); ++k) {
      if (!slot.items[k].ev.impl->IsCancelled()) {
        best = std::min(best, reach(slot.items[k]));
      }
    }
    ++off;
  }
  // The run, in time order: it stops at the first time step that cannot do better.
  for (std::size_t k = m_runHead; k < m_run.size() && SatAdd(m_run[k].ev.key.m_ts, least) < best; ++k) {
    if (!m_run[k].ev.impl->IsCancelled()) {
      best = std::min(best, reach(m_run[k]));
    }
  }
  // The heap: a child is never earlier than its parent, so a subtree whose root cannot do better is skipped.
  std::vector<std::size_t> todo;
  if (!m_heap.empty()) {
    todo.push_back(0);
  }
  while (!todo.empty()) {
    const std::size_t at = todo.back();
    todo.pop_back();
    const Item& i = m_heap[at];
    if (SatAdd(i.ev.key.m_ts, least) >= best) {
      continue;
    }
    if (!i.ev.impl->IsCancelled()) {
      best = std::min(best, reach(i));
    }
    for (std::size_t c = at * kArity + 1; c < std::min(at * kArity + 1 + kArity, m_heap.size()); ++c) {
      todo.push_back(c);
    }
  }
  return best;
}

void PhantoraKeyedScheduler::Push(const Item& item) {
  std::size_t hole = m_heap.size();
  m_heap.emplace_back();
  while (hole > 0) {
    const std::size_t parent = (hole - 1) / kArity;
    if (!Before(item, m_heap[parent])) {
      break;
    }
    m_heap[hole] = m_heap[parent];
    hole = parent;
  }
  m_heap[hole] = item;
}

PhantoraKeyedScheduler::Item PhantoraKeyedScheduler::Pop() {
  const Item top = m_heap.front();
  const Item last = m_heap.back();
  m_heap.pop_back();
  const std::size_t n = m_heap.size();
  if (n == 0) {
    return top;
  }
  std::size_t hole = 0;
  for (;;) {
    const std::size_t first = hole * kArity + 1;
    if (first >= n) {
      break;
    }
    std::size_t best = first;
    for (std::size_t c = first + 1; c < std::min(first + kArity, n); ++c) {
      if (Before(m_heap[c], m_heap[best])) {
        best = c;
      }
    }
    if (!Before(m_heap[best], last)) {
      break;
    }
    m_heap[hole] = m_heap[best];
    hole = best;
  }
  m_heap[hole] = last;
  return top;
}

}  // namespace ns3
