// LoadBalancer: how a switch picks among equal-cost egress ports for data packets (ECMP, spraying,
// flowlets, adaptive routing).
#ifndef PHANTORA_LOAD_BALANCER_H
#define PHANTORA_LOAD_BALANCER_H

#include "phantora-header.h"
#include "phantora-routing.h"

#include "ns3/callback.h"
#include "ns3/ptr.h"
#include "ns3/random-variable-stream.h"

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

namespace ns3 {

/// Load-balancing modes (switch attribute LoadBalancing).
enum class LbMode : uint8_t { Ecmp = 0, Spray = 1, SprayRr = 2, Flowlet = 3, Adaptive = 4, Reps = 5, Oblivious = 6 };

/// The mode named `name` ("ecmp", "spray", "spray_rr", "flowlet", "adaptive", "reps", "oblivious"); throws
/// std::invalid_argument.
LbMode ParseLbMode(const std::string& name);

/**
 * Per-switch egress choice for data packets among the route table's equal-cost candidates:
 * - Ecmp: the route table's hash of the flow key (RouteTable::Pick), the default;
 * - Spray: per packet, uniformly at random (an ns-3 RNG stream fixed per switch, so a seed repeats);
 * - SprayRr: per packet, round robin over the candidates, one counter per destination;
 * - Flowlet: a flow keeps its port while its packets arrive within FlowletGap of one another; after a
 *   longer gap a new flowlet starts and takes the port hashed from (flow key, flowlet number), as
 *   LetFlow picks a fresh random path per flowlet;
 * - Adaptive: per packet, the candidate with the fewest bytes queued at this switch's egress (all
 *   classes), ties broken by the ECMP hash's order;
 * - Reps, Oblivious (Ultra Ethernet): the sending NIC chose the packet's entropy value (REPS or oblivious
 *   spraying, uet-transport.h); the switch hashes (flow key, entropy) as ECMP hashes the flow key, so one
 *   entropy is one path.
 * Control packets (ACK, NACK with its CNP echo, PFC) are not passed here: they stay on their ECMP path.
 */
class LoadBalancer {
 public:
  /// Bytes queued at an egress port of the owning switch.
  typedef Callback<uint64_t, uint32_t> QueueQuery;

  /// Set up for switch `node` (RNG stream `stream` for spraying), flowlet gap in ns.
  void Configure(LbMode mode, uint32_t node, Ptr<RouteTable> routes, uint64_t flowletGapNs, int64_t stream,
                 QueueQuery queueBytes);
  LbMode Mode() const { return m_mode; }
  /// The egress port of a data packet; UINT32_MAX if its destination is unreachable.
  uint32_t Pick(const PhantoraHeader& hdr, uint64_t nowNs);
  /// Flowlets started at this switch (Flowlet mode).
  uint64_t Flowlets() const { return m_flowlets; }
  /// The flowlet number of the last data packet picked (0 outside Flowlet mode or with one candidate).
  uint64_t LastFlowlet() const { return m_lastFlowlet; }
  void Dispose();

 private:
  struct Flowlet {
    uint64_t lastNs = 0;
    uint64_t number = 0;  ///< flowlets of this flow so far at this switch
    uint32_t port = 0;
  };

  LbMode m_mode = LbMode::Ecmp;
  uint32_t m_node = 0;
  uint64_t m_gapNs = 0;
  uint64_t m_flowlets = 0;
  uint64_t m_lastFlowlet = 0;
  Ptr<RouteTable> m_routes;
  Ptr<UniformRandomVariable> m_rng;
  QueueQuery m_queueBytes;
  std::unordered_map<uint32_t, uint32_t> m_rr;       ///< SprayRr: next candidate per destination
  std::unordered_map<uint64_t, Flowlet> m_flowlet;   ///< Flowlet: per flow id
};

}  // namespace ns3

#endif  // PHANTORA_LOAD_BALANCER_H
