// PhantoraFabric: the nodes, links and routes of one phantora fabric, its path arithmetic, and the
// fabric-wide settings (attributes) that are neither a NIC's nor a switch's.
#ifndef PHANTORA_FABRIC_H
#define PHANTORA_FABRIC_H

#include "pfc-switch.h"
#include "phantora-channel.h"
#include "phantora-net-device.h"
#include "phantora-routing.h"
#include "rdma-nic.h"

#include "ns3/node.h"
#include "ns3/nstime.h"
#include "ns3/object.h"

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

namespace ns3 {

/**
 * The fabric as built by FabricInstaller: nodes (each with its ports, and an RdmaNic or a
 * PfcSwitch once installed), full-duplex links (directed channel 2*link = a->b, 2*link+1 = b->a)
 * and the shared route table. Attributes hold the run-wide settings: the congestion control's
 * type, INT, what the CC is told of the fabric (HPCC's GLOBAL_T), the ECMP policy, the RNG seed and
 * the scheduler.
 */
class PhantoraFabric : public Object {
 public:
  static TypeId GetTypeId();

  /// INT stamping: when the CC wants it (HPCC), always, or never.
  enum IntMode { INT_AUTO = 0, INT_ON = 1, INT_OFF = 2 };

  struct NodeInfo {
    NodeKind kind;
    Ptr<Node> node;
    std::vector<Ptr<PhantoraNetDevice>> ports;
    std::vector<uint32_t> portChannel;  ///< directed channel each port sends on
    Ptr<PfcSwitch> sw;
    Ptr<RdmaNic> nic;
  };
  struct LinkInfo {
    uint32_t a, b;
    uint64_t bps, delayNs;
    uint32_t pa, pb;  ///< port at a, port at b
    Ptr<PhantoraChannel> channel;
  };

  /// "host", "gpu", "switch" or "nvswitch"; returns the node id (dense, from 0).
  uint32_t AddNode(const std::string& kind);
  /// A full-duplex link; returns its id. Ports are numbered per node in link order.
  uint32_t AddLink(uint32_t a, uint32_t b, uint64_t bps, uint64_t delayNs);

  uint32_t NumNodes() const { return static_cast<uint32_t>(m_nodes.size()); }
  NodeInfo& GetNode(uint32_t n) { return m_nodes[n]; }
  const NodeInfo& GetNode(uint32_t n) const { return m_nodes[n]; }
  const std::vector<NodeInfo>& Nodes() const { return m_nodes; }
  const std::vector<LinkInfo>& Links() const { return m_links; }
  Ptr<RouteTable> GetRoutes() const { return m_routes; }

  // ----- settings -----
  const std::string& GetCongestionControl() const { return m_cc; }
  IntMode GetIntMode() const { return m_intMode; }
  uint32_t GetSeed() const { return m_seed; }
  void SetEcmpHash(EcmpHashKind kind) { m_routes->SetEcmpHash(kind); }
  EcmpHashKind GetEcmpHash() const { return m_routes->GetEcmpHash(); }
  const std::string& GetScheduler() const { return m_scheduler; }
  const std::string& GetSimulator() const { return m_simulator; }

  // ----- paths (valid once NICs are installed) -----
  // A path is a flow's: its ECMP key and its route (`viaNic`: through the NICs, RouteTable::Pick).
  /// Base RTT of a path: 2 x propagation + one payload's serialisation per hop (as HPCC).
  uint64_t PairRttNs(uint32_t src, uint32_t dst, uint64_t key, bool viaNic);
  /// Bottleneck rate of a path (0 if none).
  uint64_t PathRateBps(uint32_t src, uint32_t dst, uint64_t key, bool viaNic);
  /// The least propagation delay from endpoint src to dst over every route a packet may take (each hop's
  /// equal-cost candidates, whatever the load balancing picks); 0 if src == dst.
  uint64_t MinPropagationNs(uint32_t src, uint32_t dst);
  /// HPCC's standalone FCT: base RTT + the flow with headers at the path's bottleneck rate, or its payload at its
  /// rate cap `maxRateBps` (payload bits/s, as RdmaNic paces it; 0 = none) if that takes longer.
  int64_t StandaloneNs(uint32_t src, uint32_t dst, uint64_t key, bool viaNic, uint64_t size,
                       uint64_t maxRateBps = 0);
  /// Compute the fabric-wide max base RTT and BDP (GLOBAL_T).
  void ComputeGlobalRtt();
  /// What a flow's CC is told: the override, else the fabric-wide maximum (GLOBAL_T), else its own path's.
  uint64_t CcBaseRttNs(uint32_t src, uint32_t dst, uint64_t key, bool viaNic);
  uint64_t CcBdpBytes(uint32_t src, uint32_t dst, uint64_t key, bool viaNic);
  uint64_t MaxRttNs() const;
  uint64_t MaxBdpBytes() const;

 protected:
  void DoDispose() override;

 private:
  uint32_t PayloadBytes() const;
  uint32_t HeaderBytes() const;

  std::vector<NodeInfo> m_nodes;
  std::vector<LinkInfo> m_links;
  Ptr<RouteTable> m_routes = Create<RouteTable>();
  /// MinPropagationNs's least delays, per destination then node (kept while the routes' Generation stays).
  std::unordered_map<uint32_t, std::unordered_map<uint32_t, uint64_t>> m_minProp;
  uint64_t m_minPropGeneration = 0;
  uint64_t m_maxRttNs = 0;
  uint64_t m_maxBdpBytes = 0;
  // Attributes.
  std::string m_cc = "none";
  IntMode m_intMode = INT_AUTO;
  bool m_globalT = true;
  Time m_ccBaseRtt;
  uint64_t m_ccBdpBytes = 0;
  uint32_t m_seed = 1;
  std::string m_scheduler = "ns3::PhantoraWheelScheduler";
  std::string m_simulator = "ns3::PhantoraSimulatorImpl";
};

}  // namespace ns3

#endif  // PHANTORA_FABRIC_H
