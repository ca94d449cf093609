// The order in which PhantoraSimulatorImpl runs events, for checking a parallel run's tie-breaking rule.
#ifndef PHANTORA_ORDER_LOG_H
#define PHANTORA_ORDER_LOG_H

#include <cstdint>
#include <vector>

namespace ns3 {

/**
 * While on, PhantoraSimulatorImpl appends five numbers per event it runs: its time step, its uid, its
 * context (node id, 0xffffffff for none), and the range [first, end) of the uids handed out while it ran
 * (the events it scheduled, in order). ns-3 runs events in (time, uid) order and hands uids out in
 * scheduling order, so this log is the whole ancestry of the run's order: a uid outside every range was
 * scheduled from outside an event (the caller, between runs). Off by default: one branch per event.
 */
class PhantoraOrderLog {
 public:
  /// Start recording (dropping what was recorded).
  static void Start();
  /// Stop recording and hand over the log (ts, uid, context, first, end per event run).
  static std::vector<uint64_t> Take();
};

}  // namespace ns3

#endif  // PHANTORA_ORDER_LOG_H
