// Shortest-path ECMP routing of the phantora fabric, identical to phantora.topology.model.Topology.route.
#ifndef PHANTORA_ROUTING_H
#define PHANTORA_ROUTING_H

#include "ns3/simple-ref-count.h"

#include <cstdint>
#include <unordered_map>
#include <vector>

namespace ns3 {

/// Node kinds, as in phantora.topology.model.NODE_KINDS.
enum class NodeKind : uint8_t { Gpu = 0, Host = 1, NvSwitch = 2, Switch = 3 };

inline bool IsEndpoint(NodeKind k) { return k == NodeKind::Gpu || k == NodeKind::Host; }

/// splitmix64-finaliser hash of a flow key at a node: bit-for-bit phantora.topology.model.ecmp_hash.
inline uint64_t EcmpHash(uint64_t flowKey, uint64_t node) {
  uint64_t z = flowKey * 0x9E3779B97F4A7C15ULL + node * 0xBF58476D1CE4E5B9ULL + 0x94D049BB133111EBULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

/**
 * Routes between endpoints. Endpoints never forward; two endpoints on one NVSwitch talk through
 * it; everything else takes a shortest hop-count path through switches. Equal-cost next hops
 * are sorted by (neighbour id, channel id) and chosen by EcmpHash(key, node) % count. Tables are
 * filled lazily per destination. One table serves the whole fabric (shared by Ptr).
 */
class RouteTable : public SimpleRefCount<RouteTable> {
 public:
  struct Adj {
    uint32_t peer;
    uint32_t channel;  ///< 2*link (a->b) or 2*link+1 (b->a)
    uint32_t port;     ///< index of this link among the node's links
  };

  void AddNode(NodeKind kind);
  /// Add link `linkId` between a and b; returns the (port at a, port at b).
  std::pair<uint32_t, uint32_t> AddLink(uint32_t a, uint32_t b, uint32_t linkId);

  uint32_t NumNodes() const { return static_cast<uint32_t>(m_kind.size()); }
  NodeKind Kind(uint32_t node) const { return m_kind[node]; }
  const std::vector<Adj>& Neighbours(uint32_t node) const { return m_adj[node]; }
  bool Reachable(uint32_t src, uint32_t dst);
  /// Equal-cost ports of `node` towards endpoint `dst` (empty if none).
  const std::vector<uint32_t>& Candidates(uint32_t node, uint32_t dst);
  /// The port a flow with this key leaves `node` by, towards `dst`; UINT32_MAX if unreachable.
  uint32_t Pick(uint32_t node, uint32_t dst, uint64_t key);
  /// Channel ids along the path of a flow (empty if src == dst or unreachable).
  std::vector<int64_t> Path(uint32_t src, uint32_t dst, uint64_t key);

 private:
  const std::vector<uint32_t>& Dist(uint32_t dst);
  int64_t SharedNvSwitch(uint32_t a, uint32_t b) const;
  uint32_t PortTo(uint32_t a, uint32_t b) const;

  std::vector<NodeKind> m_kind;
  std::vector<std::vector<Adj>> m_adj;
  std::vector<std::vector<uint32_t>> m_dist;                   ///< per dst, filled lazily
  std::vector<std::vector<std::vector<uint32_t>>> m_cand;      ///< switches: [node][dst], filled lazily
  std::vector<std::vector<uint8_t>> m_candDone;
  std::unordered_map<uint64_t, std::vector<uint32_t>> m_endpointCand;  ///< endpoints: (node << 32 | dst)
};

}  // namespace ns3

#endif  // PHANTORA_ROUTING_H
