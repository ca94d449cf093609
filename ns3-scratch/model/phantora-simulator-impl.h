// A lean ns-3 simulator core for the fabric: DefaultSimulatorImpl's event loop without its per-event costs.
#ifndef PHANTORA_SIMULATOR_IMPL_H
#define PHANTORA_SIMULATOR_IMPL_H

#include "phantora-scheduler.h"

#include "ns3/event-id.h"
#include "ns3/event-impl.h"
#include "ns3/nstime.h"
#include "ns3/scheduler.h"
#include "ns3/simulator-impl.h"

#include <list>

namespace ns3 {

/**
 * ns-3's DefaultSimulatorImpl, event for event: the same (time, uid) keys, uids handed out in the same
 * order (destroy events take one too), the same event count, stop and cancel semantics, so a run gives the
 * same bytes as with the default. What it leaves out, per event: the EventId made for PreEventHook, the
 * check that the caller is the main thread (and the list and mutex for events scheduled from other threads:
 * every call must come from the thread that runs the simulator, as for the fabric's pools), the log checks,
 * and the virtual calls into a PhantoraScheduler (called directly). The fabric's hot paths reach it without
 * going through Simulator:: (PhantoraSimulatorImpl::Current(), see phantora-event.h).
 *
 * ns-3 picks it with the global value SimulatorImplementationType (PhantoraNetwork binds it from the
 * fabric's attribute "Simulator", default this class; ns3::DefaultSimulatorImpl runs the same).
 */
class PhantoraSimulatorImpl final : public SimulatorImpl {
 public:
  static TypeId GetTypeId();
  PhantoraSimulatorImpl();
  ~PhantoraSimulatorImpl() override;

  /// The simulator of this process if it is a PhantoraSimulatorImpl, else nullptr.
  static PhantoraSimulatorImpl* Current() { return s_current; }

  void Destroy() override;
  bool IsFinished() const override;
  void Stop() override;
  EventId Stop(const Time& delay) override;
  EventId Schedule(const Time& delay, EventImpl* event) override;
  void ScheduleWithContext(uint32_t context, const Time& delay, EventImpl* event) override;
  EventId ScheduleNow(EventImpl* event) override;
  EventId ScheduleDestroy(EventImpl* event) override;
  void Remove(const EventId& id) override;
  void Cancel(const EventId& id) override;
  bool IsExpired(const EventId& id) const override;
  void Run() override;
  Time Now() const override;
  Time GetDelayLeft(const EventId& id) const override;
  Time GetMaximumSimulationTime() const override;
  void SetScheduler(ObjectFactory schedulerFactory) override;
  uint32_t GetSystemId() const override;
  uint32_t GetContext() const override;
  uint64_t GetEventCount() const override;

  /// The current time step (Now().GetTimeStep()), without making a Time.
  uint64_t NowStep() const { return m_currentTs; }
  /// GetContext(), not virtual.
  uint32_t Context() const { return m_currentContext; }
  /// ScheduleWithContext(context, TimeStep(delay), event), not virtual; takes the event's reference.
  void ScheduleStepWithContext(uint32_t context, uint64_t delay, EventImpl* event) {
    Enqueue(event, m_currentTs + delay, context);
  }

 private:
  void DoDispose() override;
  void ProcessOneEvent();
  bool EventsEmpty() const { return m_phantora ? m_phantora->PhantoraScheduler::IsEmpty() : m_events->IsEmpty(); }
  /// Queue `event` at time step `ts` with the next uid.
  void Enqueue(EventImpl* event, uint64_t ts, uint32_t context) {
    Scheduler::Event ev;
    ev.impl = event;
    ev.key.m_ts = ts;
    ev.key.m_context = context;
    ev.key.m_uid = m_uid;
    ++m_uid;
    ++m_unscheduledEvents;
    if (m_phantora) {
      m_phantora->PhantoraScheduler::Insert(ev);
    } else {
      m_events->Insert(ev);
    }
  }

  static inline PhantoraSimulatorImpl* s_current = nullptr;

  std::list<EventId> m_destroyEvents;
  bool m_stop = false;
  Ptr<Scheduler> m_events;
  PhantoraScheduler* m_phantora = nullptr;  ///< m_events, when it is a PhantoraScheduler
  uint32_t m_uid = EventId::UID::VALID;
  uint32_t m_currentUid = EventId::UID::INVALID;
  uint64_t m_currentTs = 0;
  uint32_t m_currentContext;
  uint64_t m_eventCount = 0;
  int m_unscheduledEvents = 0;
};

}  // namespace ns3

#endif  // PHANTORA_SIMULATOR_IMPL_H
