// A lean ns-3 simulator core for the fabric: DefaultSimulatorImpl's event loop without its per-event costs.
#ifndef PHANTORA_SIMULATOR_IMPL_H
#define PHANTORA_SIMULATOR_IMPL_H

#include "phantora-keyed-scheduler.h"
#include "phantora-scheduler.h"

#include "ns3/event-id.h"
#include "ns3/event-impl.h"
#include "ns3/nstime.h"
#include "ns3/scheduler.h"
#include "ns3/simulator-impl.h"

#include <list>
#include <vector>

namespace ns3 {

/// The keyed mode's window barrier (parallel packet simulation, PhantoraCutLink).
class PhantoraWindowHook {
 public:
  virtual ~PhantoraWindowHook() = default;
  /// A window ends: queue the messages that cross it (PhantoraSimulatorImpl::ScheduleKeyedAt).
  virtual void Barrier() = 0;
};

/**
 * ns-3's DefaultSimulatorImpl, event for event: the same (time, uid) keys, uids handed out in the same
 * order (destroy events take one too), the same event count, stop and cancel semantics, so a run gives the
 * same bytes as with the default. What it leaves out, per event: the EventId made for PreEventHook, the
 * check that the caller is the main thread (and the list and mutex for events scheduled from other threads:
 * every call must come from the thread that runs the simulator, as for the fabric's pools), the log checks,
 * and the virtual calls into a PhantoraScheduler (called directly). The fabric's hot paths reach it without
 * going through Simulator:: (PhantoraSimulatorImpl::Current(), see phantora-event.h).
 *
 * The keyed mode (issue 38; the fabric's Scheduler ns3::PhantoraKeyedScheduler): events of one time step run in
 * the order of a PhantoraOrderKey (scheduling time, scheduling node, that node's count) instead of by uid, so
 * a worker that runs some of the nodes can order its events as one engine does. It is a new reference, not
 * ns-3's order: it differs where two nodes schedule events for one time step at one time step (node id order
 * instead of run order). Off (any other scheduler), the default path pays one predictable branch per event.
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
  /// True in the keyed mode.
  bool Keyed() const { return m_keyed != nullptr; }
  /// Keyed mode: the order key the next event scheduled now gets, consumed (the scheduling node's count
  /// moves on), for an event another worker will queue with ScheduleKeyedAt.
  PhantoraOrderKey TakeKey();
  /// Keyed mode: queue `event` at time step `ts` (not before now) for node `context` with the order key
  /// `key` (one TakeKey() gave); takes the event's reference. `staged`: held until FlushStaged() (a batch of
  /// arrivals queued at once, PhantoraKeyedScheduler::InsertStaged).
  EventId ScheduleKeyedAt(uint64_t ts, uint32_t context, const PhantoraOrderKey& key, EventImpl* event,
                          bool staged = false);
  /// ScheduleKeyedAt(..., staged = true) without an EventId made (a cut-cable arrival, never cancelled).
  void StageKeyedAt(uint64_t ts, uint32_t context, const PhantoraOrderKey& key, EventImpl* event);
  /// Keyed mode: queue the events ScheduleKeyedAt(..., staged) holds.
  void FlushStaged() { m_keyed->FlushStaged(); }
  /// Keyed mode: keep the order key of each event as it runs (RunningKey); off by default (a partition worker's
  /// records carry it).
  void KeepRunningKey() { m_keepKey = true; }
  /// Keyed mode with KeepRunningKey: the order key of the event running now, the order one engine runs the
  /// events of its time step in (an event that ran before its parent's key, scheduled for the same step, takes
  /// the largest key run in the step so far: it ran right after it). Outside an event: (now, kCaller, the
  /// caller's next count), after every event the caller scheduled so far.
  PhantoraOrderKey RunningKey() const {
    return m_inEvent ? m_runningKey : PhantoraOrderKey{m_currentTs, PhantoraOrderKey::kCaller, m_callerCount};
  }

  /// Keyed mode: run in conservative windows of `lookaheadNs` (a window [W, W + lookahead) from the earliest
  /// pending event W), calling `hook->Barrier()` between windows, when no event is left, and when Run()
  /// returns. nullptr: no windows.
  void SetWindow(PhantoraWindowHook* hook, uint64_t lookaheadNs);
  /// Keyed mode, a partition worker's window (its windows are driven from outside): run every event before
  /// time step `endTs` (with `scheduledBefore`, also the events of `endTs` scheduled before it: every event that
  /// orders before one scheduled at `endTs`), ignoring Stop(); the clock stays at the last event run.
  void RunBefore(uint64_t endTs, bool scheduledBefore = false);
  /// Keyed mode with KeepRunningKey: the events of time step `ts` run in lockstep rounds (partition workers, one
  /// at a time); the running key of an event of `ts` is then (ts, kLockstep, `round`).
  void SetLockstep(uint64_t ts, uint32_t round) {
    m_lockTs = ts;
    m_lockRound = round;
  }
  /// The events of time step `ts` run in lockstep rounds.
  bool Lockstep(uint64_t ts) const { return m_lockTs == ts; }
  /// Run the next event if it is at time step `ts` and, with `limit`, orders before it; false if none is.
  bool RunOneAt(uint64_t ts, const PhantoraOrderKey* limit) {
    if (EventsEmpty() || m_keyed->PeekNextTs() != ts || (limit && !KeyBefore(m_keyed->PeekNextKey(), *limit))) {
      return false;
    }
    ProcessOneKeyed();
    return true;
  }
  /// The next event's time step and key; false if none.
  bool PeekNextKeyed(uint64_t& ts, PhantoraOrderKey& key) const {
    if (EventsEmpty()) {
      return false;
    }
    ts = m_keyed->PeekNextTs();
    key = m_keyed->PeekNextKey();
    return true;
  }
  /// Events run at the current time step so far (the running one included).
  uint32_t RanAtNow() const { return static_cast<uint32_t>(m_ranNow.size()); }
  /// Keyed mode with KeepRunningKey: an event that orders after (`ts`, `key`) has run already, so an event
  /// queued now at `ts` with `key` would run out of one engine's order.
  bool RanPast(uint64_t ts, const PhantoraOrderKey& key) const {
    return m_currentTs > ts || (m_currentTs == ts && !m_ranNow.empty() && KeyBefore(key, m_runningKey));
  }
  /// Keyed mode: move the clock to `ts` without running an event (none may be pending before it), as a
  /// worker ends RunUntil(ts) that one engine ends with its stop event.
  void AdvanceTo(uint64_t ts);

  /// ScheduleWithContext(context, TimeStep(delay), event), not virtual; takes the event's reference. `hint`: an
  /// address the event reads first, prefetched just before it runs (PhantoraWheelScheduler::InsertHinted); only
  /// a hint, never read, so a wrong one costs time, never a result.
  void ScheduleStepWithContext(uint32_t context, uint64_t delay, EventImpl* event, const void* hint = nullptr) {
    Enqueue(event, m_currentTs + delay, context, hint);
  }

 private:
  void DoDispose() override;
  void ProcessOneEvent();
  void ProcessOneKeyed();  ///< ProcessOneEvent in the keyed mode
  /// ScheduleKeyedAt's queuing; returns the event's uid.
  uint32_t QueueKeyed(uint64_t ts, uint32_t context, const PhantoraOrderKey& key, EventImpl* event, bool staged);
  /// Keyed mode with KeepRunningKey: the event of time step `ts` with key `k` is about to run (m_runningKey).
  void NoteRunningKey(uint64_t ts, const PhantoraOrderKey& k);
  /// Run `next`, just taken from the queue (ProcessOneKeyed's rest).
  void RunTaken(const Scheduler::Event& next);
  bool EventsEmpty() const { return m_phantora ? m_phantora->PhantoraScheduler::IsEmpty() : m_events->IsEmpty(); }
  /// Queue `event` at time step `ts` with the next uid (and a prefetch hint, see ScheduleStepWithContext).
  void Enqueue(EventImpl* event, uint64_t ts, uint32_t context, const void* hint = nullptr) {
    Scheduler::Event ev;
    ev.impl = event;
    ev.key.m_ts = ts;
    ev.key.m_context = context;
    ev.key.m_uid = m_uid;
    ++m_uid;
    ++m_unscheduledEvents;
    if (m_phantora) [[likely]] {  // null in the keyed mode: the default path tests nothing more
      m_phantora->InsertHinted(ev, hint);
    } else if (m_keyed) {
      m_keyed->InsertKeyed(ev, TakeKey());
    } else {
      m_events->Insert(ev);
    }
  }

  static inline PhantoraSimulatorImpl* s_current = nullptr;

  std::list<EventId> m_destroyEvents;
  bool m_stop = false;
  Ptr<Scheduler> m_events;
  PhantoraScheduler* m_phantora = nullptr;  ///< m_events, when it is a PhantoraScheduler (null in the keyed mode)
  /// Keyed mode: the caller's next order count (fatal once it would reach the queue samples' counts).
  uint32_t NextCallerCount();

  PhantoraKeyedScheduler* m_keyed = nullptr;  ///< the keyed scheduler (m_events or inside m_phantora), or null
  bool m_inEvent = false;                     ///< keyed mode: an event is running (else the caller schedules)
  bool m_keepKey = false;                     ///< keyed mode: keep m_runningKey (KeepRunningKey)
  PhantoraOrderKey m_runningKey;              ///< keyed mode with m_keepKey: the running event's key
  uint64_t m_lockTs = UINT64_MAX;             ///< keyed mode: the time step run in lockstep rounds (SetLockstep)
  uint32_t m_lockRound = 0;                   ///< ... and the round running
  std::vector<uint32_t> m_nodeCount;          ///< keyed mode: events scheduled so far, per node
  uint32_t m_callerCount = 0;                 ///< keyed mode: events the caller scheduled
  uint32_t m_noContextCount = 0;              ///< keyed mode: events scheduled by events without a context
  std::vector<uint32_t> m_ranNow;             ///< keyed mode: uids run at m_currentTs (IsExpired)
  PhantoraWindowHook* m_window = nullptr;     ///< keyed mode: the window barrier, or null
  uint64_t m_lookahead = 0;                   ///< keyed mode: the windows' length
  uint64_t m_windowEnd = 0;                   ///< keyed mode: the current window runs events before this
  uint32_t m_uid = EventId::UID::VALID;
  uint32_t m_currentUid = EventId::UID::INVALID;
  uint64_t m_currentTs = 0;
  uint32_t m_currentContext;
  uint64_t m_eventCount = 0;
  int m_unscheduledEvents = 0;
};

}  // namespace ns3

#endif  // PHANTORA_SIMULATOR_IMPL_H
