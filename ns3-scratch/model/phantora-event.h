// Events for the per-packet paths: a closure in a pooled EventImpl (no std::function, no malloc per event).
#ifndef PHANTORA_EVENT_H
#define PHANTORA_EVENT_H

#include "phantora-pool.h"

#include "ns3/event-id.h"
#include "ns3/event-impl.h"
#include "ns3/nstime.h"
#include "ns3/simulator.h"

#include <utility>

namespace ns3 {

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
  const Ptr<EventImpl> ev(new PooledEvent<F>(std::move(f)), false);
  return Simulator::Schedule(delay, ev);
}

/// Simulator::ScheduleWithContext(context, delay, f) with a pooled event.
template <typename F>
void ScheduleWithContextPooled(uint32_t context, const Time& delay, F f) {
  Simulator::ScheduleWithContext(context, delay, new PooledEvent<F>(std::move(f)));  // takes the reference
}

}  // namespace ns3

#endif  // PHANTORA_EVENT_H
