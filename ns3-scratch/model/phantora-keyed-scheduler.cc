// PhantoraKeyedScheduler: a 4-ary heap by (time, scheduling time, scheduling node, that node's count).
#include "phantora-keyed-scheduler.h"
#include "phantora-type-id.h"

#include "ns3/event-impl.h"
#include "ns3/fatal-error.h"
#include "ns3/log.h"

#include <algorithm>

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

void PhantoraKeyedScheduler::InsertKeyed(const Event& ev, const PhantoraOrderKey& key) { Push(Item{ev, key}); }

void PhantoraKeyedScheduler::Insert(const Event& ev) {
  NS_FATAL_ERROR("ns3::PhantoraKeyedScheduler orders events by a key only ns3::PhantoraSimulatorImpl computes: "
                 "set the fabric's attribute 'Simulator' to ns3::PhantoraSimulatorImpl");
}

Scheduler::Event PhantoraKeyedScheduler::RemoveNext() { return Pop().ev; }

void PhantoraKeyedScheduler::Remove(const Event& ev) {
  const uint32_t uid = ev.key.m_uid;
  auto it = std::find_if(m_heap.begin(), m_heap.end(), [uid](const Item& i) { return i.ev.key.m_uid == uid; });
  NS_ASSERT_MSG(it != m_heap.end(), "PhantoraKeyedScheduler::Remove: no event with uid " << uid);
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
  while (!m_heap.empty()) {
    if (!m_heap.front().ev.impl->IsCancelled()) {
      ts = static_cast<int64_t>(m_heap.front().ev.key.m_ts);
      break;
    }
    cancelled.push_back(Pop());
  }
  for (const Item& i : cancelled) {
    Push(i);  // with its key: the order is unchanged
  }
  return ts;
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
