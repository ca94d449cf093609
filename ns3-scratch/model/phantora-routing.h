// Shortest-path ECMP routing of the phantora fabric, identical to phantora.topology.model.Topology.route
// (the two ECMP policies: phantora.topology.ecmp).
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

/// How a node chooses among equal-cost next hops (phantora.topology.ecmp.ECMP_HASHES).
enum class EcmpHashKind : uint8_t { Phantora = 0, Hpcc = 1 };

/// splitmix64-finaliser hash of a flow key at a node: bit-for-bit phantora.topology.ecmp.splitmix_hash.
inline uint64_t EcmpHash(uint64_t flowKey, uint64_t node) {
  uint64_t z = flowKey * 0x9E3779B97F4A7C15ULL + node * 0xBF58476D1CE4E5B9ULL + 0x94D049BB133111EBULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

/// MurmurHash3 x86_32 of `n` 32-bit words (4n bytes, no tail), as the HPCC models' SwitchNode::EcmpHash.
uint32_t Murmur3Words(const uint32_t* words, uint32_t n, uint32_t seed);

/// HPCC's address of a node (third.cc node_id_to_ip).
inline uint32_t HpccIp(uint32_t node) { return 0x0b000001u + ((node / 256) << 16) + ((node % 256) << 8); }

/// HPCC's switch hash of a packet from endpoint src to dst with port word `key & 0xffffffff` at `node`.
inline uint32_t HpccEcmpHash(uint32_t src, uint32_t dst, uint64_t key, uint32_t node) {
  const uint32_t words[3] = {HpccIp(src), HpccIp(dst), static_cast<uint32_t>(key)};
  return Murmur3Words(words, 3, node);
}

/**
 * Routes between endpoints. Endpoints never forward; two endpoints on one NVSwitch talk through
 * it; everything else takes a shortest hop-count path through switches. Equal-cost next hops
 * are chosen by the ECMP policy: Phantora sorts them by (neighbour id, channel id) and picks
 * EcmpHash(key, node) % count; Hpcc orders them as HPCC's routing BFS from the destination dequeues
 * them (endpoints' neighbours first by id, then switches by descending id) and picks
 * HpccEcmpHash(src, dst, key, node) % count. A flow "via NIC" (phantora Flow.via_nic: NCCL's NET transport
 * between GPUs of one NVSwitch) leaves its endpoints through their NICs even where they share an NVSwitch; that
 * route is a flag of its own beside the key, which is only hashed. Tables are filled lazily per destination. One
 * table serves the whole fabric (shared by Ptr).
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
  /// Whether a flow from src to dst has a route (`viaNic`: one through the NICs, not a shared NVSwitch).
  bool Reachable(uint32_t src, uint32_t dst, bool viaNic);
  /// Equal-cost ports of `node` towards endpoint `dst` (empty if none).
  const std::vector<uint32_t>& Candidates(uint32_t node, uint32_t dst);
  /// Those of a flow: with `viaNic` at an endpoint, its NIC ports even towards a GPU of a shared NVSwitch (NCCL's
  /// NET transport within a host: phantora Flow.via_nic), else Candidates(node, dst).
  const std::vector<uint32_t>& Candidates(uint32_t node, uint32_t dst, bool viaNic);
  /// Routing's view of the failed links (a scenario's re-convergence): routes avoid exactly these links, as
  /// phantora.topology.model.Topology.with_links_down does (clears the tables).
  void SetLinksDown(const std::vector<uint32_t>& links);
  bool LinkDown(uint32_t channel) const { return !m_down.empty() && m_down[channel >> 1]; }
  /// The ECMP policy (clears the tables).
  void SetEcmpHash(EcmpHashKind kind);
  EcmpHashKind GetEcmpHash() const { return m_hash; }
  /// The port a packet from endpoint `src` to `dst` with this flow key and route (`viaNic`) leaves `node` by;
  /// UINT32_MAX if unreachable.
  uint32_t Pick(uint32_t node, uint32_t src, uint32_t dst, uint64_t key, bool viaNic);
  /// The key of the reverse direction (ACKs, CNPs): Hpcc swaps sport and dport; Phantora keeps it.
  uint64_t ReverseKey(uint64_t key) const;
  /// Counts the table clears (a node, a link, a failure or the ECMP policy changed): what is derived from the
  /// routes is stale once it moves.
  uint64_t Generation() const { return m_generation; }
  /// Channel ids along the path of a flow (empty if src == dst or unreachable).
  std::vector<int64_t> Path(uint32_t src, uint32_t dst, uint64_t key, bool viaNic);
  /// Path's channels into `channels` (cleared; reused, so a sweep over many pairs allocates nothing), keeping no
  /// endpoint's candidates (Path keeps each (endpoint, dst) pair's: what flows ask again, not a sweep); false
  /// (and empty) when unreachable. The same hops as Path.
  bool PathInto(uint32_t src, uint32_t dst, uint64_t key, bool viaNic, std::vector<uint32_t>& channels);

 private:
  const std::vector<uint32_t>& Dist(uint32_t dst);
  /// The equal-cost ports of `node` towards `dst`, in the policy's order, computed (not looked up) into `out`.
  void FillCandidates(uint32_t node, uint32_t dst, std::vector<uint32_t>& out, bool viaNic = false);
  /// The port of `c` the ECMP policy picks at `node` for this packet; UINT32_MAX if `c` is empty.
  uint32_t Choose(const std::vector<uint32_t>& c, uint32_t node, uint32_t src, uint32_t dst, uint64_t key) const;
  /// Position of each node in the queue of HPCC's BFS from dst (kInf: never queued).
  const std::vector<uint32_t>& HpccQueueOrder(uint32_t dst);
  void ClearTables();
  int64_t SharedNvSwitch(uint32_t a, uint32_t b) const;
  uint32_t PortTo(uint32_t a, uint32_t b) const;

  std::vector<NodeKind> m_kind;
  std::vector<std::vector<Adj>> m_adj;
  std::vector<uint8_t> m_down;  ///< per link: routing avoids it (empty: none)
  EcmpHashKind m_hash = EcmpHashKind::Phantora;
  uint64_t m_generation = 0;  ///< Generation
  std::vector<std::vector<uint32_t>> m_dist;                   ///< per dst, filled lazily
  std::vector<std::vector<uint32_t>> m_hpccOrder;              ///< per dst, filled lazily (Hpcc only)
  std::vector<std::vector<std::vector<uint32_t>>> m_cand;      ///< switches: [node][dst], filled lazily
  std::vector<std::vector<uint8_t>> m_candDone;
  std::unordered_map<uint64_t, std::vector<uint32_t>> m_endpointCand;  ///< endpoints: (node << 32 | dst)
  std::unordered_map<uint64_t, std::vector<uint32_t>> m_endpointNicCand;  ///< the same through the NICs only
  std::vector<uint32_t> m_scratch;  ///< PathInto's endpoint candidates
};

}  // namespace ns3

#endif  // PHANTORA_ROUTING_H
