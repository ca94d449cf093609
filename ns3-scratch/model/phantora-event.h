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

#include <utility>

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
/// With PhantoraSimulatorImpl, queued there directly (the same key: time, context, next uid).
template <typename F>
void ScheduleWithContextPooled(uint32_t context, const Time& delay, F f) {
  EventImpl* ev = new PooledEvent<F>(std::move(f));  // its reference goes to the event list
  if (PhantoraSimulatorImpl* sim = PhantoraSimulatorImpl::Current()) [[likely]] {
    sim->ScheduleStepWithContext(context, static_cast<uint64_t>(delay.GetTimeStep()), ev);
  } else {
    Simulator::ScheduleWithContext(context, delay, ev);
  }
}

}  // namespace ns3

#endif  // PHANTORA_EVENT_H
