// An event scheduler that lets the facade peek at the time of the next pending event.
#ifndef PHANTORA_SCHEDULER_H
#define PHANTORA_SCHEDULER_H

#include "phantora-interrupt.h"
#include "phantora-keyed-scheduler.h"
#include "phantora-wheel-scheduler.h"

#include "ns3/scheduler.h"
#include "ns3/simulator.h"

namespace ns3 {

/**
 * Wraps an ns-3 scheduler (attribute "Inner", default ns3::PhantoraWheelScheduler, which it calls directly
 * rather than through virtual functions) and remembers the live instance, so
 * PhantoraNetwork::NextEventTime() can answer without running anything.
 */
class PhantoraScheduler : public Scheduler {
 public:
  static TypeId GetTypeId();
  PhantoraScheduler();
  ~PhantoraScheduler() override;

  /// The scheduler of the running simulator, or nullptr.
  static PhantoraScheduler* Current();
  /// Time step (ns) of the next event, or -1 if there is none.
  int64_t PeekNextTs() const;
  /// Time step (ns) of the next event that is not cancelled (reached, a cancelled one does nothing), or -1.
  int64_t PeekNextLiveTs();
  /// The inner scheduler when it is ns3::PhantoraKeyedScheduler (the keyed mode), else nullptr.
  PhantoraKeyedScheduler* Keyed() const { return m_keyed; }

  // Inline: PhantoraSimulatorImpl calls these directly.
  void Insert(const Event& ev) override { m_wheel ? m_wheel->Insert(ev) : m_inner->Insert(ev); }
  /// Insert with a prefetch hint (PhantoraWheelScheduler::InsertHinted; other schedulers drop it).
  void InsertHinted(const Event& ev, const void* hint) {
    m_wheel ? m_wheel->InsertHinted(ev, hint) : m_inner->Insert(ev);
  }
  bool IsEmpty() const override { return m_wheel ? m_wheel->IsEmpty() : m_inner->IsEmpty(); }
  Event PeekNext() const override;
  Event RemoveNext() override {
    Event ev = m_wheel ? m_wheel->RemoveNext() : m_inner->RemoveNext();
    if (InterruptPending()) [[unlikely]] {
      Simulator::Stop();  // SIGTERM / SIGINT: Run() returns after this event, whichever scheduler is inside
    }
    return ev;
  }
  void Remove(const Event& ev) override;

 private:
  void SetInner(std::string name);
  std::string GetInner() const;

  Ptr<Scheduler> m_inner;
  PhantoraWheelScheduler* m_wheel = nullptr;  ///< m_inner, when it is the wheel
  PhantoraKeyedScheduler* m_keyed = nullptr;  ///< m_inner, when it is the keyed scheduler
  std::string m_innerName;
};

}  // namespace ns3

#endif  // PHANTORA_SCHEDULER_H
