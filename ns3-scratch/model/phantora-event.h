// Events and time for the per-packet paths: a closure in a pooled EventImpl (no std::function, no malloc per
// event), and ns without Time's unit conversions.
#ifndef PHANTORA_EVENT_H
#define PHANTORA_EVENT_H

#include "phantora-pool.h"
#include "phantora-simulator-impl.h"

#include "ns3/event-id.h"
#include "ns3/event-impl.h"
#include "ns3/nstime.h"
#include "ns3/simulator.h"

#include <optional>
#include <utility>
#include <vector>

namespace ns3 {

/// The current time in ns: the simulator's time step, as the fabric runs at ns resolution (checked by
/// PhantoraNetwork::Finalize), without Time's unit conversion.
/// With PhantoraSimulatorImpl, read from it directly (no Simulator::Now(), no Time).
inline uint64_t FabricNowNs() {
  if (const PhantoraSimulatorImpl* sim = PhantoraSimulatorImpl::Current()) [[likely]] {
    return sim->NowStep();
  }
  return static_cast<uint64_t>(Simulator::Now().GetTimeStep());
}

/// Simulator::GetContext(), read directly from PhantoraSimulatorImpl when it runs.
inline uint32_t FabricContext() {
  if (const PhantoraSimulatorImpl* sim = PhantoraSimulatorImpl::Current()) [[likely]] {
    return sim->Context();
  }
  return Simulator::GetContext();
}

/// `ns` as a Time (a time step of 1 ns, as above).
inline Time FabricNs(uint64_t ns) { return TimeStep(ns); }

/// An event that calls `f()`; its memory comes from a free list per closure type.
template <typename F>
class PooledEvent : public EventImpl {
 public:
  explicit PooledEvent(F f) : m_f(std::move(f)) {}
  PHANTORA_POOLED(PooledEvent)

 protected:
  void Notify() override { m_f(); }

 private:
  F m_f;
};

/**
 * An event that is never cancelled, kept and used again instead of destroyed: made once (per the most
 * alive at once), then armed with a closure, queued, run and put back on the free list of its closure type
 * by Notify(). The free list holds a reference, so the event list's Unref after the run never reaches 0: no
 * EventImpl constructor and destructor per event, no malloc. Only PhantoraSimulatorImpl queues these (it
 * calls ReclaimAll() when it is disposed, for the events left queued, which never run).
 */
class RecycledEventBase : public EventImpl {
 public:
  /// Put every armed event back on its free list, its closure destroyed.
  static void ReclaimAll() {
    for (RecycledEventBase* ev : All()) {
      ev->Reclaim();
    }
  }

 protected:
  RecycledEventBase() { All().push_back(this); }
  virtual void Reclaim() = 0;

 private:
  /// Every one ever made: they live as long as the process (the list too: never destroyed, so a simulator
  /// disposed late in the process's exit still finds it).
  static std::vector<RecycledEventBase*>& All() {
    static auto* all = new std::vector<RecycledEventBase*>();
    return *all;
  }
};

template <typename F>
class RecycledEvent final : public RecycledEventBase {
 public:
  /// An event that calls `f()`, with one reference for the event list.
  static EventImpl* Arm(F&& f) {
    RecycledEvent* ev = s_free;
    if (ev != nullptr) {
      s_free = ev->m_next;
    } else {
      ev = new RecycledEvent();  // its first reference is the free list's, for good
    }
    ev->m_f.emplace(std::move(f));
    ev->Ref();
    return ev;
  }

 protected:
  void Notify() override {
    (*m_f)();  // may arm other events of this type: this one is not free yet
    Disarm();
  }
  void Reclaim() override {
    if (m_f) {
      Disarm();
    }
  }

 private:
  RecycledEvent() = default;
  void Disarm() {
    m_f.reset();
    m_next = s_free;
    s_free = this;
  }

  std::optional<F> m_f;
  RecycledEvent* m_next = nullptr;
  static inline RecycledEvent* s_free = nullptr;
};

/// Simulator::Schedule(delay, f) with a pooled event: the same event, id and order as the usual overloads.
template <typename F>
EventId SchedulePooled(const Time& delay, F f) {
  if (PhantoraSimulatorImpl* sim = PhantoraSimulatorImpl::Current()) [[likely]] {
    return sim->Schedule(delay, new PooledEvent<F>(std::move(f)));  // its reference goes to the event list
  }
  const Ptr<EventImpl> ev(new PooledEvent<F>(std::move(f)), false);
  return Simulator::Schedule(delay, ev);
}

/// Simulator::ScheduleWithContext(context, delay, f) with a pooled event (no EventId: it cannot be cancelled).
/// With PhantoraSimulatorImpl, a RecycledEvent queued there directly (the same key: time, context, next uid), with
/// `hint`, the address `f` reads first, prefetched while the event before it runs (a hint only: never read).
template <typename F>
void ScheduleWithContextPooled(uint32_t context, const Time& delay, F f, const void* hint = nullptr) {
  if (PhantoraSimulatorImpl* sim = PhantoraSimulatorImpl::Current()) [[likely]] {
    sim->ScheduleStepWithContext(context, static_cast<uint64_t>(delay.GetTimeStep()),
                                 RecycledEvent<F>::Arm(std::move(f)), hint);
  } else {
    Simulator::ScheduleWithContext(context, delay, new PooledEvent<F>(std::move(f)));  // takes the reference
  }
}

}  // namespace ns3

#endif  // PHANTORA_EVENT_H
