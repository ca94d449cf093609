// PhantoraScheduler: delegation to an inner ns-3 scheduler.
#include "phantora-scheduler.h"
#include "phantora-interrupt.h"
#include "phantora-type-id.h"

#include "ns3/event-impl.h"
#include "ns3/log.h"
#include "ns3/object-factory.h"
#include "ns3/simulator.h"
#include "ns3/string.h"

#include <vector>

namespace ns3 {

NS_LOG_COMPONENT_DEFINE("PhantoraScheduler");
NS_OBJECT_ENSURE_REGISTERED(PhantoraScheduler);

namespace {
PhantoraScheduler* g_current = nullptr;
}

TypeId PhantoraScheduler::GetTypeId() {
  static TypeId tid = PhantoraTypeId<PhantoraScheduler, Scheduler>("ns3::PhantoraScheduler")
                          .AddAttribute("Inner", "TypeId name of the scheduler that holds the events",
                                        StringValue("ns3::PhantoraWheelScheduler"),
                                        MakeStringAccessor(&PhantoraScheduler::SetInner, &PhantoraScheduler::GetInner),
                                        MakeStringChecker());
  return tid;
}

PhantoraScheduler::PhantoraScheduler() {
  SetInner("ns3::PhantoraWheelScheduler");
  g_current = this;
}

PhantoraScheduler::~PhantoraScheduler() {
  if (g_current == this) {
    g_current = nullptr;
  }
}

PhantoraScheduler* PhantoraScheduler::Current() { return g_current; }

void PhantoraScheduler::SetInner(std::string name) {
  NS_ASSERT_MSG(m_inner == nullptr || m_inner->IsEmpty(), "cannot swap a scheduler that holds events");
  ObjectFactory f;
  f.SetTypeId(name);
  m_inner = f.Create<Scheduler>();
  m_wheel = dynamic_cast<PhantoraWheelScheduler*>(PeekPointer(m_inner));
  m_keyed = dynamic_cast<PhantoraKeyedScheduler*>(PeekPointer(m_inner));
  m_innerName = name;
}

std::string PhantoraScheduler::GetInner() const { return m_innerName; }

int64_t PhantoraScheduler::PeekNextTs() const {
  return m_inner->IsEmpty() ? -1 : static_cast<int64_t>(m_inner->PeekNext().key.m_ts);
}

int64_t PhantoraScheduler::PeekNextLiveTs() {
  if (m_keyed) {
    return m_keyed->PeekNextLiveTs();  // put back with their keys
  }
  // Cancelled events stay queued until reached (the simulator counts them then): lift those at the head, look
  // behind them, and put them back with their keys, so the order of everything is unchanged.
  std::vector<Event> cancelled;
  int64_t ts = -1;
  while (!m_inner->IsEmpty()) {
    const Event ev = m_inner->PeekNext();
    if (!ev.impl->IsCancelled()) {
      ts = static_cast<int64_t>(ev.key.m_ts);
      break;
    }
    cancelled.push_back(m_inner->RemoveNext());
  }
  for (const Event& ev : cancelled) {
    m_inner->Insert(ev);
  }
  return ts;
}

Scheduler::Event PhantoraScheduler::PeekNext() const { return m_wheel ? m_wheel->PeekNext() : m_inner->PeekNext(); }
void PhantoraScheduler::Remove(const Event& ev) { m_inner->Remove(ev); }

}  // namespace ns3
