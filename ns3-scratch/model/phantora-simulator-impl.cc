// PhantoraSimulatorImpl: DefaultSimulatorImpl's semantics, one thread, no per-event extras.
#include "phantora-simulator-impl.h"
#include "phantora-event.h"
#include "phantora-order-log.h"
#include "phantora-type-id.h"

#include "ns3/assert.h"
#include "ns3/fatal-error.h"
#include "ns3/log.h"
#include "ns3/object-factory.h"
#include "ns3/simulator.h"

#include <algorithm>

namespace ns3 {

NS_LOG_COMPONENT_DEFINE("PhantoraSimulatorImpl");
NS_OBJECT_ENSURE_REGISTERED(PhantoraSimulatorImpl);

namespace {
std::vector<uint64_t>* g_orderLog = nullptr;  ///< PhantoraOrderLog's record while on

/// Run `next`'s event; while PhantoraOrderLog records, its key and the next uid (`uid`, read before and after the
/// event, which may schedule more) go to the record with it.
template <typename Uid>
[[gnu::always_inline]] inline void InvokeLogged(const Scheduler::Event& next, const Uid& uid) {
  if (g_orderLog) {
    g_orderLog->insert(g_orderLog->end(), {next.key.m_ts, next.key.m_uid, next.key.m_context, uid});
    next.impl->Invoke();
    g_orderLog->push_back(uid);
  } else {
    next.impl->Invoke();
  }
}
}  // namespace

void PhantoraOrderLog::Start() {
  delete g_orderLog;
  g_orderLog = new std::vector<uint64_t>();
}

std::vector<uint64_t> PhantoraOrderLog::Take() {
  std::vector<uint64_t> out;
  if (g_orderLog) {
    out.swap(*g_orderLog);
    delete g_orderLog;
    g_orderLog = nullptr;
  }
  return out;
}

TypeId PhantoraSimulatorImpl::GetTypeId() {
  static TypeId tid = PhantoraTypeId<PhantoraSimulatorImpl, SimulatorImpl>("ns3::PhantoraSimulatorImpl");
  return tid;
}

PhantoraSimulatorImpl::PhantoraSimulatorImpl() : m_currentContext(Simulator::NO_CONTEXT) {
  NS_LOG_FUNCTION(this);
  s_current = this;
}

PhantoraSimulatorImpl::~PhantoraSimulatorImpl() {
  NS_LOG_FUNCTION(this);
  if (s_current == this) {
    s_current = nullptr;
  }
}

void PhantoraSimulatorImpl::DoDispose() {
  NS_LOG_FUNCTION(this);
  if (s_current == this) {
    s_current = nullptr;  // Simulator:: calls from here on go to the next implementation
  }
  while (!m_events->IsEmpty()) {
    Scheduler::Event next = m_events->RemoveNext();
    next.impl->Unref();
  }
  RecycledEventBase::ReclaimAll();  // the recycled ones among them (their closures hold packets)
  m_phantora = nullptr;
  m_keyed = nullptr;
  m_window = nullptr;
  m_events = nullptr;
  SimulatorImpl::DoDispose();
}

void PhantoraSimulatorImpl::Destroy() {
  NS_LOG_FUNCTION(this);
  while (!m_destroyEvents.empty()) {
    Ptr<EventImpl> ev = m_destroyEvents.front().PeekEventImpl();
    m_destroyEvents.pop_front();
    NS_LOG_LOGIC("handle destroy " << ev);
    if (!ev->IsCancelled()) {
      ev->Invoke();
    }
  }
}

void PhantoraSimulatorImpl::SetScheduler(ObjectFactory schedulerFactory) {
  NS_LOG_FUNCTION(this << schedulerFactory);
  Ptr<Scheduler> scheduler = schedulerFactory.Create<Scheduler>();
  auto* phantora = dynamic_cast<PhantoraScheduler*>(PeekPointer(scheduler));
  PhantoraKeyedScheduler* keyed =
      phantora ? phantora->Keyed() : dynamic_cast<PhantoraKeyedScheduler*>(PeekPointer(scheduler));
  if (m_events) {
    while (!m_events->IsEmpty()) {
      const Scheduler::Event ev = m_events->RemoveNext();
      if (keyed) {
        // Caller keys in the order they leave: the order of each time step's events is kept.
        keyed->InsertKeyed(ev, PhantoraOrderKey{m_currentTs, PhantoraOrderKey::kCaller, NextCallerCount()});
      } else {
        scheduler->Insert(ev);
      }
    }
  }
  m_events = scheduler;
  m_phantora = keyed ? nullptr : phantora;  // the keyed mode goes through m_events (PhantoraScheduler's checks)
  m_keyed = keyed;
}

void PhantoraSimulatorImpl::SetWindow(PhantoraWindowHook* hook, uint64_t lookaheadNs) {
  NS_ABORT_MSG_IF(hook && (!m_keyed || lookaheadNs == 0), "windows need the keyed mode and a lookahead > 0");
  m_window = hook;
  m_lookahead = lookaheadNs;
  m_windowEnd = 0;
}

[[gnu::always_inline]] inline void PhantoraSimulatorImpl::NoteRunningKey(uint64_t ts, const PhantoraOrderKey& k) {
  // The event about to run; within a time step, the largest key run so far (an event scheduled for this very
  // step can order before its parent and runs right after it: it takes its parent's place).
  if (ts == m_lockTs) {
    m_runningKey = PhantoraOrderKey{ts, PhantoraOrderKey::kLockstep, m_lockRound};
  } else if (ts != m_currentTs || m_ranNow.empty() || KeyBefore(m_runningKey, k)) {
    m_runningKey = k;
  }
}

[[gnu::always_inline]] inline void PhantoraSimulatorImpl::RunTaken(const Scheduler::Event& next) {
  NS_ASSERT(next.key.m_ts >= m_currentTs);
  if (next.key.m_ts != m_currentTs) {
    m_ranNow.clear();
  }
  m_ranNow.push_back(next.key.m_uid);
  --m_unscheduledEvents;
  ++m_eventCount;
  m_currentTs = next.key.m_ts;
  m_currentContext = next.key.m_context;
  m_currentUid = next.key.m_uid;
  m_inEvent = true;
  InvokeLogged(next, m_uid);
  m_inEvent = false;
  next.impl->Unref();
}

void PhantoraSimulatorImpl::RunBefore(uint64_t endTs, bool scheduledBefore) {
  NS_ABORT_MSG_IF(!m_keyed || m_window, "RunBefore needs the keyed mode without loopback windows");
  // ProcessOneKeyed's steps with the next event located once and taken from the keyed scheduler directly (Stop()
  // is ignored here, so PhantoraScheduler's check of a signal is not needed: the window loop checks it after)
  PhantoraKeyedScheduler& q = *m_keyed;
  while (!q.IsEmpty()) {
    uint64_t ts = 0;
    const PhantoraOrderKey& key = q.PeekNextTsKey(ts);
    if (ts > endTs || (ts == endTs && !(scheduledBefore && key.schedTs < endTs))) {
      break;
    }
    if (m_keepKey) {
      NoteRunningKey(ts, key);
    }
    RunTaken(q.TakeNext());
  }
  m_stop = false;
}

void PhantoraSimulatorImpl::AdvanceTo(uint64_t ts) {
  NS_ABORT_MSG_IF(!m_keyed, "AdvanceTo needs the keyed mode");
  NS_ABORT_MSG_IF(ts < m_currentTs || (!EventsEmpty() && m_keyed->PeekNextTs() < ts),
                  "AdvanceTo(" << ts << "): the clock is at " << m_currentTs << " or an event is pending before");
  if (ts != m_currentTs) {
    m_ranNow.clear();
    m_currentTs = ts;
  }
}

uint32_t PhantoraSimulatorImpl::NextCallerCount() {
  if (m_callerCount == PhantoraOrderKey::kSampleCount) [[unlikely]] {
    NS_FATAL_ERROR("keyed mode: the caller scheduled " << PhantoraOrderKey::kSampleCount
                                                       << " events (the counts above are the queue samples' keys)");
  }
  return m_callerCount++;
}

PhantoraOrderKey PhantoraSimulatorImpl::TakeKey() {
  NS_ASSERT_MSG(m_keyed, "PhantoraSimulatorImpl::TakeKey() outside the keyed mode");
  PhantoraOrderKey key;
  key.schedTs = m_currentTs;
  if (!m_inEvent) {
    key.count = NextCallerCount();  // key.node: kCaller
    return key;
  } else if (m_currentContext == Simulator::NO_CONTEXT) {
    key.node = PhantoraOrderKey::kNoContext;
    key.count = m_noContextCount++;
  } else {
    if (m_currentContext >= m_nodeCount.size()) {
      m_nodeCount.resize(m_currentContext + 1, 0);
    }
    key.node = m_currentContext;
    key.count = m_nodeCount[m_currentContext]++;
  }
  if (key.count == UINT32_MAX) [[unlikely]] {
    NS_FATAL_ERROR("keyed mode: node " << key.node << " scheduled 2^32 events (its 32-bit order count wraps)");
  }
  return key;
}

EventId PhantoraSimulatorImpl::ScheduleKeyedAt(uint64_t ts, uint32_t context, const PhantoraOrderKey& key,
                                               EventImpl* event, bool staged) {
  const uint32_t uid = QueueKeyed(ts, context, key, event, staged);
  return EventId(event, ts, context, uid);
}

void PhantoraSimulatorImpl::StageKeyedAt(uint64_t ts, uint32_t context, const PhantoraOrderKey& key,
                                         EventImpl* event) {
  QueueKeyed(ts, context, key, event, true);
}

uint32_t PhantoraSimulatorImpl::QueueKeyed(uint64_t ts, uint32_t context, const PhantoraOrderKey& key,
                                           EventImpl* event, bool staged) {
  NS_ASSERT_MSG(m_keyed, "PhantoraSimulatorImpl::ScheduleKeyedAt() outside the keyed mode");
  NS_ABORT_MSG_IF(ts < m_currentTs, "keyed mode: an event for time " << ts << " queued at time " << m_currentTs
                                                                     << " (behind the clock)");
  Scheduler::Event ev;
  ev.impl = event;
  ev.key.m_ts = ts;
  ev.key.m_context = context;
  ev.key.m_uid = m_uid;
  ++m_uid;
  ++m_unscheduledEvents;
  if (staged) {
    m_keyed->InsertStaged(ev, key);
  } else {
    m_keyed->InsertKeyed(ev, key);
  }
  return ev.key.m_uid;
}

uint32_t PhantoraSimulatorImpl::GetSystemId() const { return 0; }

void PhantoraSimulatorImpl::ProcessOneEvent() {
  const Scheduler::Event next = m_phantora ? m_phantora->PhantoraScheduler::RemoveNext() : m_events->RemoveNext();
  NS_ASSERT(next.key.m_ts >= m_currentTs);
  --m_unscheduledEvents;
  ++m_eventCount;
  m_currentTs = next.key.m_ts;
  m_currentContext = next.key.m_context;
  m_currentUid = next.key.m_uid;
  InvokeLogged(next, m_uid);
  next.impl->Unref();
}

void PhantoraSimulatorImpl::ProcessOneKeyed() {
  if (m_keepKey) {
    NoteRunningKey(m_keyed->PeekNextTs(), m_keyed->PeekNextKey());  // the event RemoveNext() gives
  }
  RunTaken(m_events->RemoveNext());
}

bool PhantoraSimulatorImpl::IsFinished() const { return EventsEmpty() || m_stop; }

void PhantoraSimulatorImpl::Run() {
  NS_LOG_FUNCTION(this);
  m_stop = false;
  if (m_window) {
    while (!m_stop) {
      if (EventsEmpty() || m_keyed->PeekNextTs() >= m_windowEnd) {
        m_window->Barrier();  // every event before the window's end has run
        if (EventsEmpty()) {
          break;
        }
        m_windowEnd = m_keyed->PeekNextTs() + m_lookahead;
      }
      ProcessOneKeyed();
    }
    m_window->Barrier();  // a message sent in this window arrives at or after its end: queued before it runs
  } else if (m_keyed) {
    while (!EventsEmpty() && !m_stop) {
      ProcessOneKeyed();
    }
  } else {
    while (!EventsEmpty() && !m_stop) {
      ProcessOneEvent();
    }
  }
  // Stopped for lack of events: none was lost on the way.
  NS_ASSERT(!EventsEmpty() || m_unscheduledEvents == 0);
}

void PhantoraSimulatorImpl::Stop() {
  NS_LOG_FUNCTION(this);
  m_stop = true;
}

EventId PhantoraSimulatorImpl::Stop(const Time& delay) {
  NS_LOG_FUNCTION(this << delay.GetTimeStep());
  return Simulator::Schedule(delay, &Simulator::Stop);
}

EventId PhantoraSimulatorImpl::Schedule(const Time& delay, EventImpl* event) {
  NS_ASSERT_MSG(delay.IsPositive(), "PhantoraSimulatorImpl::Schedule(): negative delay");
  const uint64_t ts = static_cast<uint64_t>((delay + TimeStep(m_currentTs)).GetTimeStep());
  const uint32_t uid = m_uid;
  Enqueue(event, ts, m_currentContext);
  return EventId(event, ts, m_currentContext, uid);
}

void PhantoraSimulatorImpl::ScheduleWithContext(uint32_t context, const Time& delay, EventImpl* event) {
  Enqueue(event, static_cast<uint64_t>((delay + TimeStep(m_currentTs)).GetTimeStep()), context);
}

EventId PhantoraSimulatorImpl::ScheduleNow(EventImpl* event) { return Schedule(Time(0), event); }

EventId PhantoraSimulatorImpl::ScheduleDestroy(EventImpl* event) {
  EventId id(Ptr<EventImpl>(event, false), m_currentTs, 0xffffffff, EventId::UID::DESTROY);
  m_destroyEvents.push_back(id);
  ++m_uid;
  return id;
}

Time PhantoraSimulatorImpl::Now() const { return TimeStep(m_currentTs); }  // no logging: Now() prints log lines

Time PhantoraSimulatorImpl::GetDelayLeft(const EventId& id) const {
  if (IsExpired(id)) {
    return TimeStep(0);
  }
  return TimeStep(id.GetTs() - m_currentTs);
}

void PhantoraSimulatorImpl::Remove(const EventId& id) {
  if (id.GetUid() == EventId::UID::DESTROY) {
    for (auto i = m_destroyEvents.begin(); i != m_destroyEvents.end(); ++i) {
      if (*i == id) {
        m_destroyEvents.erase(i);
        break;
      }
    }
    return;
  }
  if (IsExpired(id)) {
    return;
  }
  Scheduler::Event event;
  event.impl = id.PeekEventImpl();
  event.key.m_ts = id.GetTs();
  event.key.m_context = id.GetContext();
  event.key.m_uid = id.GetUid();
  m_events->Remove(event);
  event.impl->Cancel();
  event.impl->Unref();  // the reference the event list held
  --m_unscheduledEvents;
}

void PhantoraSimulatorImpl::Cancel(const EventId& id) {
  if (!IsExpired(id)) {
    id.PeekEventImpl()->Cancel();
  }
}

bool PhantoraSimulatorImpl::IsExpired(const EventId& id) const {
  if (id.GetUid() == EventId::UID::DESTROY) {
    if (id.PeekEventImpl() == nullptr || id.PeekEventImpl()->IsCancelled()) {
      return true;
    }
    for (const EventId& d : m_destroyEvents) {
      if (d == id) {
        return false;
      }
    }
    return true;
  }
  if (m_keyed && id.GetTs() == m_currentTs) {
    // Events of this time step do not run in uid order: an event has run if its uid is among those run.
    return id.PeekEventImpl() == nullptr || id.PeekEventImpl()->IsCancelled() ||
           std::find(m_ranNow.begin(), m_ranNow.end(), id.GetUid()) != m_ranNow.end();
  }
  return id.PeekEventImpl() == nullptr || id.GetTs() < m_currentTs ||
         (id.GetTs() == m_currentTs && id.GetUid() <= m_currentUid) || id.PeekEventImpl()->IsCancelled();
}

Time PhantoraSimulatorImpl::GetMaximumSimulationTime() const { return TimeStep(0x7fffffffffffffffLL); }

uint32_t PhantoraSimulatorImpl::GetContext() const { return m_currentContext; }

uint64_t PhantoraSimulatorImpl::GetEventCount() const { return m_eventCount; }

}  // namespace ns3
