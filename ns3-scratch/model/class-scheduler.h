// Which traffic class an egress port serves next: round robin, strict priority, or weighted (DRR).
#ifndef PHANTORA_CLASS_SCHEDULER_H
#define PHANTORA_CLASS_SCHEDULER_H

#include "phantora-net-device.h"
#include "ring-queue.h"

#include <array>
#include <cstdint>
#include <deque>
#include <string>

namespace ns3 {

/// How the data classes 1..7 of a port share it (class 0, control, is always served first).
enum class ClassSched : uint8_t {
  RoundRobin = 0,  ///< one packet per non-empty class in turn (the HPCC models' behaviour)
  Strict = 1,      ///< the lowest-numbered non-empty class first: class 1 highest, 7 lowest
  Weighted = 2,    ///< deficit round robin: bytes shared in proportion to the class weights
};

/// "rr", "strict" or "wrr" -> ClassSched; throws std::invalid_argument naming the attribute.
ClassSched ParseClassSched(const std::string& text);

/// "w1 w2 ... w7" (seven integers >= 1, for classes 1..7; commas allowed) -> weights[1..7]; "" = all 1.
std::array<uint32_t, kNumPrio> ParseClassWeights(const std::string& text);

/// Per-port state of the class scheduler.
struct ClassSchedState {
  uint32_t rr = 1;                         ///< next class to try (round robin and DRR)
  std::array<uint64_t, kNumPrio> deficit{};  ///< DRR credit per class, bytes
  bool fresh = true;                        ///< DRR: class `rr` has not yet been given its quantum this turn
};

/**
 * The data class a port sends next, or -1 if none may send. `queues[c]` holds class c's packets, bit c of
 * `nonEmpty` says it has any (kept by the caller: the eight queues span five cache lines, which the round robin and
 * strict picks then never read), `paused[c]` its PFC state. Class 0 is not considered (the caller serves it
 * first). DRR quantum of class c = weights[c] x `quantumBytes`.
 */
int PickClass(ClassSched kind, const std::array<uint32_t, kNumPrio>& weights, uint64_t quantumBytes,
              const std::array<RingQueue<TxItem>, kNumPrio>& queues, uint32_t nonEmpty, const bool* paused,
              ClassSchedState& st);

}  // namespace ns3

#endif  // PHANTORA_CLASS_SCHEDULER_H
