// PhantoraFabric: topology bookkeeping, path arithmetic and the fabric-wide attributes.
#include "phantora-fabric.h"
#include "phantora-type-id.h"

#include "ns3/boolean.h"
#include "ns3/enum.h"
#include "ns3/log.h"
#include "ns3/string.h"
#include "ns3/uinteger.h"

#include <algorithm>
#include <functional>
#include <limits>
#include <stdexcept>
#include <unordered_map>

namespace ns3 {

NS_LOG_COMPONENT_DEFINE("PhantoraFabric");
NS_OBJECT_ENSURE_REGISTERED(PhantoraFabric);

TypeId PhantoraFabric::GetTypeId() {
  static TypeId tid = PhantoraTypeId<PhantoraFabric, Object>("ns3::PhantoraFabric")
          .AddAttribute("CongestionControl",
                        "Every queue pair's CC: a registered name (none, dcqcn, ...) or a CongestionControl TypeId",
                        StringValue("none"), MakeStringAccessor(&PhantoraFabric::m_cc), MakeStringChecker())
          .AddAttribute("IntMode", "INT stamping: Auto (when the CC wants it), On or Off", EnumValue<IntMode>(INT_AUTO),
                        MakeEnumAccessor<IntMode>(&PhantoraFabric::m_intMode),
                        MakeEnumChecker(INT_AUTO, "Auto", INT_ON, "On", INT_OFF, "Off"))
          .AddAttribute("GlobalT", "Every CC is told the fabric-wide max base RTT and BDP (HPCC GLOBAL_T)",
                        BooleanValue(true), MakeBooleanAccessor(&PhantoraFabric::m_globalT), MakeBooleanChecker())
          .AddAttribute("CcBaseRtt", "Base RTT told to every CC instead of the computed one; 0 = computed",
                        TimeValue(Time(0)), MakeTimeAccessor(&PhantoraFabric::m_ccBaseRtt), MakeTimeChecker(Time(0)))
          .AddAttribute("CcBdp", "BDP bytes told to every CC instead of the computed one; 0 = computed",
                        UintegerValue(0), MakeUintegerAccessor(&PhantoraFabric::m_ccBdpBytes),
                        MakeUintegerChecker<uint64_t>())
          .AddAttribute("EcmpHash",
                        "ECMP policy: Phantora (splitmix64 of the flow key, next hops by id) or Hpcc (the HPCC "
                        "models' MurmurHash3 of sip, dip and ports, next hops in their BFS order)",
                        EnumValue<EcmpHashKind>(EcmpHashKind::Phantora),
                        MakeEnumAccessor<EcmpHashKind>(&PhantoraFabric::SetEcmpHash, &PhantoraFabric::GetEcmpHash),
                        MakeEnumChecker(EcmpHashKind::Phantora, "Phantora", EcmpHashKind::Hpcc, "Hpcc"))
          .AddAttribute("Seed", "ns-3 RNG seed of the run (ECN marking draws)", UintegerValue(1),
                        MakeUintegerAccessor(&PhantoraFabric::m_seed), MakeUintegerChecker<uint32_t>(1))
          .AddAttribute("Scheduler", "TypeId name of the ns-3 event scheduler",
                        StringValue("ns3::PhantoraWheelScheduler"),
                        MakeStringAccessor(&PhantoraFabric::m_scheduler), MakeStringChecker())
          .AddAttribute("Simulator",
                        "TypeId name of the ns-3 simulator core (global value SimulatorImplementationType, bound "
                        "before the first node is added): ns3::PhantoraSimulatorImpl or ns3::DefaultSimulatorImpl "
                        "give the same results",
                        StringValue("ns3::PhantoraSimulatorImpl"),
                        MakeStringAccessor(&PhantoraFabric::m_simulator), MakeStringChecker());
  return tid;
}

uint32_t PhantoraFabric::AddNode(const std::string& kind) {
  NodeKind k;
  if (kind == "host") {
    k = NodeKind::Host;
  } else if (kind == "gpu") {
    k = NodeKind::Gpu;
  } else if (kind == "switch") {
    k = NodeKind::Switch;
  } else if (kind == "nvswitch") {
    k = NodeKind::NvSwitch;
  } else {
    throw std::invalid_argument("unknown node kind '" + kind + "' (host, gpu, switch, nvswitch)");
  }
  m_routes->AddNode(k);
  NodeInfo info;
  info.kind = k;
  info.node = CreateObject<Node>();
  m_nodes.push_back(std::move(info));
  return static_cast<uint32_t>(m_nodes.size() - 1);
}

uint32_t PhantoraFabric::AddLink(uint32_t a, uint32_t b, uint64_t bps, uint64_t delayNs) {
  const std::string name = "link " + std::to_string(a) + "-" + std::to_string(b) + ": ";
  if (a >= m_nodes.size() || b >= m_nodes.size()) {
    throw std::invalid_argument(name + "unknown node");
  }
  if (a == b) {
    throw std::invalid_argument(name + "joins a node to itself");
  }
  if (bps == 0) {
    throw std::invalid_argument(name + "bandwidth must be > 0");
  }
  const uint32_t id = static_cast<uint32_t>(m_links.size());
  auto [pa, pb] = m_routes->AddLink(a, b, id);
  Ptr<PhantoraChannel> ch = CreateObject<PhantoraChannel>();
  ch->SetAttribute("DelayNs", UintegerValue(delayNs));
  Ptr<PhantoraNetDevice> da = CreateObject<PhantoraNetDevice>();
  Ptr<PhantoraNetDevice> db = CreateObject<PhantoraNetDevice>();
  m_nodes[a].node->AddDevice(da);
  m_nodes[b].node->AddDevice(db);
  da->Attach(ch);
  db->Attach(ch);
  ch->Attach(da, db);
  m_nodes[a].ports.push_back(da);
  m_nodes[b].ports.push_back(db);
  m_nodes[a].portChannel.push_back(2 * id);
  m_nodes[b].portChannel.push_back(2 * id + 1);
  m_links.push_back({a, b, bps, delayNs, pa, pb, ch});
  // Owners are attached when the NIC or switch is installed.
  da->Setup(nullptr, pa, bps);
  db->Setup(nullptr, pb, bps);
  return id;
}

uint32_t PhantoraFabric::PayloadBytes() const {
  for (const auto& n : m_nodes) {
    if (n.nic) {
      return n.nic->GetPayloadSize();
    }
  }
  return 1000;
}

uint32_t PhantoraFabric::HeaderBytes() const {
  for (const auto& n : m_nodes) {
    if (n.nic) {
      return n.nic->GetWireFormat().headerBytes;
    }
  }
  return 48;
}

uint64_t PhantoraFabric::PairRttNs(uint32_t src, uint32_t dst, uint64_t key, bool viaNic) {
  const uint32_t payload = PayloadBytes();
  uint64_t prop = 0;
  uint64_t txPs = 0;
  for (int64_t ch : m_routes->Path(src, dst, key, viaNic)) {
    const LinkInfo& l = m_links[ch >> 1];
    prop += l.delayNs;
    txPs += static_cast<uint64_t>(static_cast<unsigned __int128>(payload) * 8'000'000'000'000ULL / l.bps);
  }
  return 2 * prop + txPs / 1000;
}

uint64_t PhantoraFabric::PathRateBps(uint32_t src, uint32_t dst, uint64_t key, bool viaNic) {
  uint64_t rate = std::numeric_limits<uint64_t>::max();
  for (int64_t ch : m_routes->Path(src, dst, key, viaNic)) {
    rate = std::min(rate, m_links[ch >> 1].bps);
  }
  return rate == std::numeric_limits<uint64_t>::max() ? 0 : rate;
}

uint64_t PhantoraFabric::MinPropagationNs(uint32_t src, uint32_t dst) {
  // Shortest-hop routes form a DAG towards dst: the least delay from each node, memoised per destination (the
  // switches ask once per flow and hop: CompletionBounds' tail bounds) until the routes change.
  if (m_minPropGeneration != m_routes->Generation()) {
    m_minProp.clear();
    m_minPropGeneration = m_routes->Generation();
  }
  std::unordered_map<uint32_t, uint64_t>& memo = m_minProp[dst];
  memo.emplace(dst, 0);
  std::function<uint64_t(uint32_t)> least = [&](uint32_t node) -> uint64_t {
    auto it = memo.find(node);
    if (it != memo.end()) {
      return it->second;
    }
    uint64_t best = std::numeric_limits<uint64_t>::max();
    for (uint32_t port : m_routes->Candidates(node, dst)) {
      const RouteTable::Adj& e = m_routes->Neighbours(node)[port];
      const uint64_t rest = least(e.peer);
      if (rest != std::numeric_limits<uint64_t>::max()) {
        best = std::min(best, m_links[e.channel >> 1].delayNs + rest);
      }
    }
    memo[node] = best;
    return best;
  };
  const uint64_t out = least(src);
  return out == std::numeric_limits<uint64_t>::max() ? 0 : out;
}

int64_t PhantoraFabric::StandaloneNs(uint32_t src, uint32_t dst, uint64_t key, bool viaNic, uint64_t size,
                                     uint64_t maxRateBps) {
  if (src == dst || size == 0) {
    return 0;
  }
  const uint32_t payload = PayloadBytes();
  const uint64_t pkts = (size + payload - 1) / payload;
  const uint64_t bytes = size + pkts * HeaderBytes();
  const uint64_t rate = PathRateBps(src, dst, key, viaNic);
  uint64_t txNs =
      static_cast<uint64_t>(static_cast<unsigned __int128>(bytes) * 8'000'000'000ULL / std::max<uint64_t>(rate, 1));
  if (maxRateBps != 0) {  // the NIC paces a capped flow's payload at its cap where the cap binds
    txNs = std::max(txNs, static_cast<uint64_t>(static_cast<unsigned __int128>(size) * 8'000'000'000ULL / maxRateBps));
  }
  return static_cast<int64_t>(PairRttNs(src, dst, key, viaNic) + txNs);
}

void PhantoraFabric::ComputeGlobalRtt() {
  std::vector<uint32_t> eps;
  for (uint32_t i = 0; i < m_nodes.size(); ++i) {
    if (IsEndpoint(m_nodes[i].kind)) {
      eps.push_back(i);
    }
  }
  // PairRttNs and PathRateBps of each pair (key 0), from one walk of its path (PathInto: no route state kept for
  // the pairs, which a worker mostly never routes) and each link's payload time computed once, as they compute it.
  const uint32_t payload = PayloadBytes();
  std::vector<uint64_t> txPs(m_links.size());
  for (std::size_t l = 0; l < m_links.size(); ++l) {
    txPs[l] = static_cast<uint64_t>(static_cast<unsigned __int128>(payload) * 8'000'000'000'000ULL / m_links[l].bps);
  }
  std::vector<uint32_t> path;
  // Exact for up to 512 sources; larger fabrics use 512 evenly spaced sources (documented).
  const std::size_t step = std::max<std::size_t>(1, eps.size() / 512);
  m_maxRttNs = 0;
  m_maxBdpBytes = 0;
  for (std::size_t i = 0; i < eps.size(); i += step) {
    for (uint32_t d : eps) {
      if (d == eps[i] || !m_routes->Reachable(eps[i], d, false)) {
        continue;
      }
      uint64_t prop = 0;
      uint64_t tx = 0;
      uint64_t rate = 0;  // PathRateBps: 0 without a path
      if (m_routes->PathInto(eps[i], d, 0, false, path)) {
        rate = std::numeric_limits<uint64_t>::max();
        for (uint32_t ch : path) {
          const LinkInfo& l = m_links[ch >> 1];
          prop += l.delayNs;
          tx += txPs[ch >> 1];
          rate = std::min(rate, l.bps);
        }
      }
      const uint64_t rtt = 2 * prop + tx / 1000;
      m_maxRttNs = std::max(m_maxRttNs, rtt);
      m_maxBdpBytes = std::max<uint64_t>(m_maxBdpBytes, rtt * rate / 8'000'000'000ULL);
    }
  }
}

uint64_t PhantoraFabric::CcBaseRttNs(uint32_t src, uint32_t dst, uint64_t key, bool viaNic) {
  if (m_ccBaseRtt.IsStrictlyPositive()) {
    return static_cast<uint64_t>(m_ccBaseRtt.GetNanoSeconds());
  }
  return m_globalT ? m_maxRttNs : PairRttNs(src, dst, key, viaNic);
}

uint64_t PhantoraFabric::CcBdpBytes(uint32_t src, uint32_t dst, uint64_t key, bool viaNic) {
  if (m_ccBdpBytes) {
    return m_ccBdpBytes;
  }
  if (m_globalT) {
    return m_maxBdpBytes;
  }
  return PairRttNs(src, dst, key, viaNic) * PathRateBps(src, dst, key, viaNic) / 8'000'000'000ULL;
}

uint64_t PhantoraFabric::MaxRttNs() const {
  return m_ccBaseRtt.IsStrictlyPositive() ? static_cast<uint64_t>(m_ccBaseRtt.GetNanoSeconds()) : m_maxRttNs;
}

uint64_t PhantoraFabric::MaxBdpBytes() const { return m_ccBdpBytes ? m_ccBdpBytes : m_maxBdpBytes; }

void PhantoraFabric::DoDispose() {
  for (auto& n : m_nodes) {
    if (n.nic) {
      n.nic->Dispose();
    }
    if (n.sw) {
      n.sw->Dispose();
    }
  }
  m_nodes.clear();
  m_links.clear();
  m_routes = nullptr;
  Object::DoDispose();
}

}  // namespace ns3
