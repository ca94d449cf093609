// PhantoraNetwork: builds the fabric, runs flows and their dependencies, collects results.
#include "phantora-network.h"

#include "congestion-control.h"
#include "fabric-config.h"
#include "pfc-switch.h"
#include "phantora-channel.h"
#include "phantora-net-device.h"
#include "phantora-routing.h"
#include "phantora-scheduler.h"
#include "rdma-nic.h"

#include "ns3/log.h"
#include "ns3/node.h"
#include "ns3/object-factory.h"
#include "ns3/rng-seed-manager.h"
#include "ns3/scheduler.h"
#include "ns3/simulator.h"
#include "ns3/string.h"
#include "ns3/uinteger.h"

#include <algorithm>
#include <limits>
#include <cctype>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>
#include <unordered_map>
#include <unordered_set>

namespace ns3 {

NS_LOG_COMPONENT_DEFINE("PhantoraNetwork");

namespace {

bool g_live = false;  // ns-3 has one simulator per process

uint64_t ParseU64(const std::string& key, const std::string& v) {
  std::size_t pos = 0;
  unsigned long long x = 0;
  try {
    if (!v.empty() && v[0] == '-') {
      throw std::invalid_argument("negative");
    }
    x = std::stoull(v, &pos, 0);
  } catch (const std::exception&) {
    pos = 0;
  }
  if (pos == 0 || pos != v.size()) {
    throw std::invalid_argument("param '" + key + "': expected a non-negative integer, got '" + v + "'");
  }
  return x;
}

int64_t ParseI64(const std::string& key, const std::string& v) {
  std::size_t pos = 0;
  long long x = 0;
  try {
    x = std::stoll(v, &pos, 0);
  } catch (const std::exception&) {
    pos = 0;
  }
  if (pos == 0 || pos != v.size()) {
    throw std::invalid_argument("param '" + key + "': expected an integer, got '" + v + "'");
  }
  return x;
}

double ParseF64(const std::string& key, const std::string& v) {
  std::size_t pos = 0;
  double x = 0;
  try {
    x = std::stod(v, &pos);
  } catch (const std::exception&) {
    pos = 0;
  }
  if (pos == 0 || pos != v.size()) {
    throw std::invalid_argument("param '" + key + "': expected a number, got '" + v + "'");
  }
  return x;
}

bool ParseBool(const std::string& key, const std::string& v) {
  if (v == "1" || v == "true" || v == "True" || v == "yes" || v == "on") {
    return true;
  }
  if (v == "0" || v == "false" || v == "False" || v == "no" || v == "off") {
    return false;
  }
  throw std::invalid_argument("param '" + key + "': expected 0/1 or true/false, got '" + v + "'");
}

/// "rate value rate value ..." (rates in bit/s) into a map.
template <typename T, typename F>
std::map<uint64_t, T> ParseMap(const std::string& key, const std::string& v, F parseValue) {
  std::istringstream in(v);
  std::vector<std::string> tok;
  for (std::string t; in >> t;) {
    tok.push_back(t);
  }
  if (tok.size() % 2 != 0) {
    throw std::invalid_argument("param '" + key + "': expected 'rate value' pairs, got '" + v + "'");
  }
  std::map<uint64_t, T> out;
  for (std::size_t i = 0; i < tok.size(); i += 2) {
    out[ParseU64(key, tok[i])] = parseValue(key, tok[i + 1]);
  }
  return out;
}

std::string CcTypeName(const std::string& v) {
  static const std::map<std::string, std::string> shortNames = {
      {"none", "ns3::CcNone"},   {"dcqcn", "ns3::CcDcqcn"}, {"hpcc", "ns3::CcHpcc"},
      {"timely", "ns3::CcTimely"}, {"dctcp", "ns3::CcDctcp"}};
  auto it = shortNames.find(v);
  return it == shortNames.end() ? v : it->second;
}

uint64_t NowNs() { return static_cast<uint64_t>(Simulator::Now().GetNanoSeconds()); }

/// Would ns-3 parse `text` as a value of this attribute type? (Some of its parsers abort on bad input.)
bool ParsableAs(const std::string& valueType, const std::string& text) {
  auto whole = [&](auto parse) {
    std::size_t pos = 0;
    try {
      parse(text, &pos);
    } catch (const std::exception&) {
      return false;
    }
    return pos == text.size() && !text.empty();
  };
  if (valueType == "ns3::DoubleValue") {
    return whole([](const std::string& t, std::size_t* p) { return std::stod(t, p); });
  }
  if (valueType == "ns3::UintegerValue") {
    return !text.empty() && text[0] != '-' &&
           whole([](const std::string& t, std::size_t* p) { return std::stoull(t, p); });
  }
  if (valueType == "ns3::IntegerValue") {
    return whole([](const std::string& t, std::size_t* p) { return std::stoll(t, p); });
  }
  if (valueType == "ns3::BooleanValue") {
    return text == "true" || text == "false" || text == "1" || text == "0";
  }
  if (valueType == "ns3::TimeValue") {
    std::size_t i = 0;
    while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.' ||
                               text[i] == 'e' || text[i] == '+' || text[i] == '-')) {
      ++i;
    }
    static const std::set<std::string> units = {"", "s", "ms", "us", "ns", "ps", "fs", "min", "h", "d", "y"};
    std::size_t pos = 0;
    try {
      std::stod(text.substr(0, i), &pos);
    } catch (const std::exception&) {
      return false;
    }
    return pos == i && units.count(text.substr(i)) > 0;
  }
  return valueType == "ns3::StringValue";
}

}  // namespace

/// Everything behind the facade.
class PhantoraNetwork::Impl : public FabricContext {
 public:
  struct NodeInfo {
    NodeKind kind;
    Ptr<Node> node;
    std::vector<Ptr<PhantoraNetDevice>> ports;
    std::vector<uint64_t> portDelayNs;
    std::vector<uint32_t> portChannel;
    Ptr<PfcSwitch> sw;
    Ptr<RdmaNic> nic;
  };
  struct LinkInfo {
    uint32_t a, b;
    uint64_t bps, delayNs;
    uint32_t pa, pb;
    Ptr<PhantoraChannel> channel;
  };
  struct FlowState {
    uint64_t id;
    uint32_t src, dst;
    uint64_t size;
    uint8_t prio;
    uint64_t key;
    int64_t submitNs;
    int64_t readyNs;
    int64_t delayNs;
    uint32_t pending = 0;
    int64_t startNs = -1;
    uint32_t sport = 0, dport = 100;
    bool dataDone = false;
  };

  FabricConfig cfg;
  FabricStats stats;
  RouteTable routes;
  std::vector<NodeInfo> nodes;
  std::vector<LinkInfo> links;
  bool finalized = false;
  bool intOn = false;
  ObjectFactory ccFactory;
  uint64_t maxRttNs = 0;
  uint64_t maxBdpBytes = 0;

  std::unordered_map<uint64_t, FlowState> flows;           // submitted, not done at both ends
  std::unordered_map<uint64_t, std::vector<uint64_t>> dependents;
  std::unordered_map<uint64_t, int64_t> doneEnd;            // receiver-complete flows
  std::map<std::pair<uint32_t, uint32_t>, uint32_t> nextSport;
  uint64_t inFlight = 0;
  uint64_t submitted = 0;
  uint64_t completed = 0;
  bool stopWhenIdle = false;
  bool stopWhenQuiet = false;
  bool watching = false;                  // RunUntilWatched: stop at the first watched completion
  bool watchHit = false;
  std::unordered_set<uint64_t> watched;
  bool sampling = false;
  std::vector<uint64_t> lastSample;

  std::vector<FlowRecord> completions;
  std::vector<FctRecord> fcts;
  std::vector<PfcRecord> pfcs;
  std::vector<QueueSample> samples;
  std::vector<DropRecord> drops;
  std::vector<CnpRecord> cnps;
  std::vector<EcnRecord> ecnMarks;

  // ----- FabricContext --------------------------------------------------------------------
  uint64_t CcBaseRttNs(uint32_t src, uint32_t dst, uint64_t key) override {
    if (cfg.ccBaseRttNs) {
      return cfg.ccBaseRttNs;
    }
    return cfg.globalT ? maxRttNs : PairRtt(src, dst, key);
  }

  uint64_t CcBdpBytes(uint32_t src, uint32_t dst, uint64_t key) override {
    if (cfg.ccBdpBytes) {
      return cfg.ccBdpBytes;
    }
    if (cfg.globalT) {
      return maxBdpBytes;
    }
    return PairRtt(src, dst, key) * PathRate(src, dst, key) / 8'000'000'000ULL;
  }

  void DataComplete(uint64_t id) override {
    auto it = flows.find(id);
    if (it == flows.end() || it->second.dataDone) {
      return;
    }
    FlowState& f = it->second;
    f.dataDone = true;
    const int64_t now = static_cast<int64_t>(NowNs());
    completions.push_back(FlowRecord{f.id, f.src, f.dst, f.size, f.startNs, now});
    doneEnd[id] = now;
    --inFlight;
    ++completed;
    auto dit = dependents.find(id);
    if (dit != dependents.end()) {
      for (uint64_t j : dit->second) {
        FlowState& g = flows.at(j);
        g.readyNs = std::max(g.readyNs, now);
        if (--g.pending == 0) {
          ScheduleStart(g);
        }
      }
      dependents.erase(dit);
    }
    if (watching && watched.count(id)) {
      // Stop after this event; RunUntilWatched then runs the rest of this ns.
      NS_LOG_LOGIC("watched flow " << id << " completed at " << now << " ns: stopping");
      watching = false;
      watchHit = true;
      Simulator::Stop();
    }
    if (stopWhenIdle && inFlight == 0) {
      Simulator::Stop();
    }
  }

  void SenderDone(uint64_t id) override {
    auto it = flows.find(id);
    if (it == flows.end()) {
      return;
    }
    const FlowState& f = it->second;
    const int64_t now = static_cast<int64_t>(NowNs());
    fcts.push_back(FctRecord{f.id, f.src, f.dst, f.sport, f.dport, f.size, f.startNs, now - f.startNs,
                             Standalone(f)});
    if (f.src != f.dst) {
      nodes[f.dst].nic->ForgetFlow(id);
    }
    flows.erase(it);
    if (stopWhenQuiet && flows.empty()) {
      Simulator::Stop();
    }
  }

  // ----- paths --------------------------------------------------------------------------
  uint64_t PairRtt(uint32_t src, uint32_t dst, uint64_t key) {
    uint64_t prop = 0;
    uint64_t txPs = 0;
    for (int64_t ch : routes.Path(src, dst, key)) {
      const LinkInfo& l = links[ch >> 1];
      prop += l.delayNs;
      txPs += static_cast<uint64_t>(static_cast<unsigned __int128>(cfg.payloadBytes) * 8'000'000'000'000ULL / l.bps);
    }
    return 2 * prop + txPs / 1000;
  }

  uint64_t PathRate(uint32_t src, uint32_t dst, uint64_t key) {
    uint64_t rate = std::numeric_limits<uint64_t>::max();
    for (int64_t ch : routes.Path(src, dst, key)) {
      rate = std::min(rate, links[ch >> 1].bps);
    }
    return rate == std::numeric_limits<uint64_t>::max() ? 0 : rate;
  }

  int64_t Standalone(const FlowState& f) {
    if (f.src == f.dst || f.size == 0) {
      return 0;
    }
    const uint64_t pkts = (f.size + cfg.payloadBytes - 1) / cfg.payloadBytes;
    const uint64_t bytes = f.size + pkts * cfg.headerBytes;
    const uint64_t rate = PathRate(f.src, f.dst, f.key);
    const uint64_t txNs =
        static_cast<uint64_t>(static_cast<unsigned __int128>(bytes) * 8'000'000'000ULL / std::max<uint64_t>(rate, 1));
    return static_cast<int64_t>(PairRtt(f.src, f.dst, f.key) + txNs);
  }

  void ComputeGlobalRtt() {
    std::vector<uint32_t> eps;
    for (uint32_t i = 0; i < nodes.size(); ++i) {
      if (IsEndpoint(nodes[i].kind)) {
        eps.push_back(i);
      }
    }
    // Exact for up to 512 sources; larger fabrics use 512 evenly spaced sources (documented).
    const std::size_t step = std::max<std::size_t>(1, eps.size() / 512);
    maxRttNs = 0;
    maxBdpBytes = 0;
    for (std::size_t i = 0; i < eps.size(); i += step) {
      for (uint32_t d : eps) {
        if (d == eps[i] || !routes.Reachable(eps[i], d)) {
          continue;
        }
        const uint64_t rtt = PairRtt(eps[i], d, 0);
        maxRttNs = std::max(maxRttNs, rtt);
        maxBdpBytes = std::max<uint64_t>(maxBdpBytes, rtt * PathRate(eps[i], d, 0) / 8'000'000'000ULL);
      }
    }
  }

  // ----- flows ---------------------------------------------------------------------------
  void ScheduleStart(FlowState& f) {
    const int64_t at = std::max(f.submitNs, f.readyNs) + f.delayNs;
    const int64_t now = static_cast<int64_t>(NowNs());
    Simulator::Schedule(NanoSeconds(std::max<int64_t>(at - now, 0)), &Impl::StartFlow, this, f.id);
  }

  void StartFlow(uint64_t id) {
    FlowState& f = flows.at(id);
    f.startNs = static_cast<int64_t>(NowNs());
    if (f.size == 0 || f.src == f.dst) {
      DataComplete(id);
      SenderDone(id);
      return;
    }
    nodes[f.dst].nic->ExpectFlow(id, f.size);
    nodes[f.src].nic->StartFlow(QpSpec{id, f.dst, f.size, f.prio, f.key});
    if (cfg.queueSampleNs && !sampling) {
      sampling = true;
      Simulator::Schedule(NanoSeconds(0), &Impl::Sample, this);
    }
  }

  void Sample() {
    const int64_t now = static_cast<int64_t>(NowNs());
    std::size_t k = 0;
    for (uint32_t n = 0; n < nodes.size(); ++n) {
      if (!nodes[n].sw) {
        continue;
      }
      const Ptr<PfcSwitch>& sw = nodes[n].sw;
      for (uint32_t p = 0; p < sw->NumPorts(); ++p) {
        for (uint32_t c = 0; c < kNumPrio; ++c, ++k) {
          if (k >= lastSample.size()) {
            lastSample.resize(k + 1, 0);
          }
          const uint64_t b = sw->QueueBytes(p, c);
          if (b || lastSample[k]) {
            samples.push_back(QueueSample{now, n, p, c, b});
          }
          lastSample[k] = b;
        }
      }
    }
    if (flows.empty()) {
      sampling = false;
      return;
    }
    Simulator::Schedule(NanoSeconds(cfg.queueSampleNs), &Impl::Sample, this);
  }
};

// ----- facade ---------------------------------------------------------------------------------

PhantoraNetwork::PhantoraNetwork() {
  if (g_live) {
    throw std::runtime_error("a PhantoraNetwork is already open in this process: Close() it first");
  }
  g_live = true;
  m_impl = std::make_unique<Impl>();
}

PhantoraNetwork::~PhantoraNetwork() { Close(); }

void PhantoraNetwork::Close() {
  if (!m_impl) {
    return;
  }
  for (auto& n : m_impl->nodes) {
    if (n.nic) {
      n.nic->Dispose();
    }
    if (n.sw) {
      n.sw->Dispose();
    }
  }
  m_impl.reset();
  Simulator::Destroy();
  g_live = false;
}

static PhantoraNetwork::Impl& Need(const std::unique_ptr<PhantoraNetwork::Impl>& impl) {
  if (!impl) {
    throw std::runtime_error("this PhantoraNetwork is closed");
  }
  return *impl;
}

void PhantoraNetwork::SetParam(const std::string& key, const std::string& value) {
  Impl& s = Need(m_impl);
  if (s.finalized) {
    throw std::runtime_error("SetParam('" + key + "') after Finalize()");
  }
  FabricConfig& c = s.cfg;
  auto u32 = [&](uint32_t& field, uint64_t lo) {
    const uint64_t x = ParseU64(key, value);
    if (x < lo || x > std::numeric_limits<uint32_t>::max()) {
      throw std::invalid_argument("param '" + key + "': out of range: " + value);
    }
    field = static_cast<uint32_t>(x);
  };
  if (key == "payload_bytes") {
    u32(c.payloadBytes, 1);
  } else if (key == "header_bytes") {
    u32(c.headerBytes, 0);
  } else if (key == "int_header_bytes") {
    u32(c.intHeaderBytes, 0);
  } else if (key == "pfc_bytes") {
    u32(c.pfcBytes, 1);
  } else if (key == "pfc") {
    c.pfc = ParseBool(key, value);
  } else if (key == "buffer_bytes") {
    c.bufferBytes = ParseU64(key, value);
  } else if (key == "reserve_bytes") {
    c.reserveBytes = ParseU64(key, value);
  } else if (key == "resume_offset_bytes") {
    c.resumeOffsetBytes = ParseU64(key, value);
  } else if (key == "dt_shift") {
    u32(c.dtShift, 0);
    if (c.dtShift > 30) {
      throw std::invalid_argument("param 'dt_shift': must be <= 30");
    }
  } else if (key == "headroom_factor") {
    c.headroomFactor = ParseF64(key, value);
    if (c.headroomFactor < 0) {
      throw std::invalid_argument("param 'headroom_factor': must be >= 0");
    }
  } else if (key == "headroom_bytes") {
    c.headroomBytes = ParseU64(key, value);
  } else if (key == "ecn") {
    c.ecn = ParseBool(key, value);
  } else if (key == "kmin_map") {
    c.kminBytes = ParseMap<uint64_t>(key, value, ParseU64);
  } else if (key == "kmax_map") {
    c.kmaxBytes = ParseMap<uint64_t>(key, value, ParseU64);
  } else if (key == "pmax_map") {
    c.pmax = ParseMap<double>(key, value, ParseF64);
  } else if (key == "ack_interval") {
    u32(c.ackInterval, 1);
  } else if (key == "ack_high_prio") {
    c.ackHighPrio = ParseBool(key, value);
  } else if (key == "nack_interval_ns") {
    c.nackIntervalNs = ParseU64(key, value);
  } else if (key == "rto_ns") {
    c.rtoNs = ParseI64(key, value);
  } else if (key == "global_t") {
    c.globalT = ParseBool(key, value);
  } else if (key == "cc_base_rtt_ns") {
    c.ccBaseRttNs = ParseU64(key, value);
  } else if (key == "cc_bdp_bytes") {
    c.ccBdpBytes = ParseU64(key, value);
  } else if (key == "cc") {
    c.cc = CcTypeName(value);
  } else if (key.rfind("cc.", 0) == 0 && key.size() > 3) {
    c.ccAttributes.emplace_back(key.substr(3), value);
  } else if (key == "int") {
    const int64_t x = ParseI64(key, value);
    if (x < -1 || x > 1) {
      throw std::invalid_argument("param 'int': expected -1 (auto), 0 or 1");
    }
    c.intMode = static_cast<int>(x);
  } else if (key == "queue_sample_ns") {
    c.queueSampleNs = ParseU64(key, value);
  } else if (key == "trace_drops") {
    c.traceDrops = ParseBool(key, value);
  } else if (key == "trace_cnp") {
    c.traceCnp = ParseBool(key, value);
  } else if (key == "trace_ecn") {
    c.traceEcn = ParseBool(key, value);
  } else if (key == "seed") {
    u32(c.seed, 1);
  } else if (key == "scheduler") {
    TypeId tid;
    if (!TypeId::LookupByNameFailSafe(value, &tid) || !tid.IsChildOf(Scheduler::GetTypeId()) ||
        !tid.HasConstructor()) {
      throw std::invalid_argument("param 'scheduler': unknown ns-3 scheduler '" + value + "'");
    }
    c.scheduler = value;
  } else {
    throw std::invalid_argument("unknown param '" + key + "'");
  }
}

uint32_t PhantoraNetwork::AddNode(const std::string& kind) {
  Impl& s = Need(m_impl);
  if (s.finalized) {
    throw std::runtime_error("AddNode after Finalize()");
  }
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
  s.routes.AddNode(k);
  Impl::NodeInfo info;
  info.kind = k;
  info.node = CreateObject<Node>();
  s.nodes.push_back(std::move(info));
  return static_cast<uint32_t>(s.nodes.size() - 1);
}

uint32_t PhantoraNetwork::AddLink(uint32_t a, uint32_t b, uint64_t bps, uint64_t delayNs) {
  Impl& s = Need(m_impl);
  if (s.finalized) {
    throw std::runtime_error("AddLink after Finalize()");
  }
  if (a >= s.nodes.size() || b >= s.nodes.size()) {
    throw std::invalid_argument("link " + std::to_string(a) + "-" + std::to_string(b) + ": unknown node");
  }
  if (a == b) {
    throw std::invalid_argument("link " + std::to_string(a) + "-" + std::to_string(b) + ": joins a node to itself");
  }
  if (bps == 0) {
    throw std::invalid_argument("link " + std::to_string(a) + "-" + std::to_string(b) + ": bandwidth must be > 0");
  }
  const uint32_t id = static_cast<uint32_t>(s.links.size());
  auto [pa, pb] = s.routes.AddLink(a, b, id);
  Ptr<PhantoraChannel> ch = CreateObject<PhantoraChannel>();
  ch->SetAttribute("DelayNs", UintegerValue(delayNs));
  Ptr<PhantoraNetDevice> da = CreateObject<PhantoraNetDevice>();
  Ptr<PhantoraNetDevice> db = CreateObject<PhantoraNetDevice>();
  s.nodes[a].node->AddDevice(da);
  s.nodes[b].node->AddDevice(db);
  da->Attach(ch);
  db->Attach(ch);
  ch->Attach(da, db);
  s.nodes[a].ports.push_back(da);
  s.nodes[b].ports.push_back(db);
  s.nodes[a].portDelayNs.push_back(delayNs);
  s.nodes[b].portDelayNs.push_back(delayNs);
  s.nodes[a].portChannel.push_back(2 * id);
  s.nodes[b].portChannel.push_back(2 * id + 1);
  s.links.push_back({a, b, bps, delayNs, pa, pb, ch});
  // Rates are set now; owners are attached in Finalize.
  da->Setup(nullptr, pa, bps);
  db->Setup(nullptr, pb, bps);
  return id;
}

void PhantoraNetwork::Finalize() {
  Impl& s = Need(m_impl);
  if (s.finalized) {
    throw std::runtime_error("Finalize() called twice");
  }
  FabricConfig& c = s.cfg;
  for (const auto& [rate, kmin] : c.kminBytes) {
    auto it = c.kmaxBytes.find(rate);
    if (it != c.kmaxBytes.end() && it->second < kmin) {
      throw std::invalid_argument("kmin > kmax at rate " + std::to_string(rate));
    }
  }
  for (const auto& [rate, p] : c.pmax) {
    if (p < 0 || p > 1) {
      throw std::invalid_argument("pmax must be in [0, 1] at rate " + std::to_string(rate));
    }
  }
  // Congestion control: check the type and every attribute before anything can abort inside ns-3.
  TypeId tid;
  if (!TypeId::LookupByNameFailSafe(c.cc, &tid) || !tid.IsChildOf(CongestionControl::GetTypeId()) ||
      !tid.HasConstructor()) {
    throw std::invalid_argument("unknown congestion control '" + c.cc + "'");
  }
  s.ccFactory = ObjectFactory();
  s.ccFactory.SetTypeId(tid);
  for (const auto& [name, value] : c.ccAttributes) {
    TypeId::AttributeInformation info;
    if (!tid.LookupAttributeByName(name, &info)) {
      throw std::invalid_argument("congestion control '" + c.cc + "' has no attribute '" + name + "'");
    }
    Ptr<AttributeValue> v;
    if (ParsableAs(info.checker->GetValueTypeName(), value)) {
      v = info.checker->CreateValidValue(StringValue(value));
    }
    if (!v) {
      throw std::invalid_argument("attribute '" + name + "' of '" + c.cc + "': bad value '" + value + "'");
    }
    s.ccFactory.Set(name, *v);
  }
  Ptr<CongestionControl> probe = s.ccFactory.Create<CongestionControl>();
  s.intOn = c.intMode == 1 || (c.intMode == -1 && probe->WantsInt());
  probe = nullptr;

  RngSeedManager::SetSeed(c.seed);
  RngSeedManager::SetRun(1);
  ObjectFactory sched;
  sched.SetTypeId("ns3::PhantoraScheduler");
  sched.Set("Inner", StringValue(c.scheduler));
  Simulator::SetScheduler(sched);

  for (uint32_t n = 0; n < s.nodes.size(); ++n) {
    Impl::NodeInfo& info = s.nodes[n];
    PortOwner* owner = nullptr;
    if (IsEndpoint(info.kind)) {
      info.nic = CreateObject<RdmaNic>();
      info.nic->Setup(n, &s.cfg, &s.stats, &s.routes, &s, info.ports, s.ccFactory, s.intOn);
      info.node->AggregateObject(info.nic);
      owner = PeekPointer(info.nic);
      if (c.traceCnp) {  // connected only when wanted: an unconnected trace source costs nothing per CNP
        Impl* impl = &s;
        info.nic->TraceConnectWithoutContext(
            "CnpRx", Callback<void, uint64_t, uint32_t, uint64_t>([impl, n](uint64_t flow, uint32_t from, uint64_t seq) {
              impl->cnps.push_back(CnpRecord{static_cast<int64_t>(NowNs()), n, from, flow, seq});
            }));
      }
    } else {
      info.sw = CreateObject<PfcSwitch>();
      info.sw->Setup(n, info.kind, &s.cfg, &s.stats, &s.routes, info.ports, info.portDelayNs, s.intOn);
      info.node->AggregateObject(info.sw);
      owner = PeekPointer(info.sw);
      Impl* impl = &s;
      info.sw->TraceConnectWithoutContext(
          "Drop", Callback<void, uint32_t, uint32_t, uint64_t, uint64_t>(
                      [impl, n](uint32_t port, uint32_t cls, uint64_t flow, uint64_t seq) {
                        if (impl->cfg.traceDrops) {
                          impl->drops.push_back(DropRecord{static_cast<int64_t>(NowNs()), n, port, cls, flow, seq});
                        }
                      }));
      if (c.traceEcn) {
        const std::vector<uint32_t>* channels = &info.portChannel;
        info.sw->TraceConnectWithoutContext(
            "EcnMark", Callback<void, uint32_t, uint32_t, uint64_t>([impl, n, channels](uint32_t port, uint32_t cls,
                                                                                         uint64_t flow) {
              impl->ecnMarks.push_back(
                  EcnRecord{static_cast<int64_t>(NowNs()), n, port, cls, (*channels)[port], flow});
            }));
      }
    }
    for (uint32_t p = 0; p < info.ports.size(); ++p) {
      info.ports[p]->Setup(owner, p, info.ports[p]->GetRateBps());
      Impl* impl = &s;
      const uint32_t type = IsEndpoint(info.kind) ? 0 : (info.kind == NodeKind::Switch ? 1 : 2);
      const uint32_t peer = s.routes.Neighbours(n)[p].peer;
      info.ports[p]->TraceConnectWithoutContext(
          "PfcRx", Callback<void, uint32_t, uint32_t, bool>([impl, n, type, peer](uint32_t port, uint32_t cls,
                                                                                   bool pause) {
            impl->pfcs.push_back(PfcRecord{static_cast<int64_t>(NowNs()), n, type, port, cls, pause ? 1u : 0u, peer});
          }));
    }
  }
  s.ComputeGlobalRtt();
  s.finalized = true;
  // Nodes schedule their initialisation at t = 0: run it now, so NextEventTime() reports only our events.
  RunUntil(0);
}

void PhantoraNetwork::AddFlow(uint64_t id, uint32_t src, uint32_t dst, uint64_t sizeBytes, int64_t startNs,
                              uint32_t priority, uint64_t ecmpKey, const std::vector<uint64_t>& deps, int64_t delayNs,
                              uint32_t dport) {
  Impl& s = Need(m_impl);
  const std::string where = "flow " + std::to_string(id) + ": ";
  if (!s.finalized) {
    throw std::runtime_error(where + "AddFlow before Finalize()");
  }
  if (s.flows.count(id) || s.doneEnd.count(id)) {
    throw std::invalid_argument(where + "duplicate flow id");
  }
  for (uint32_t end : {src, dst}) {
    if (end >= s.nodes.size() || !IsEndpoint(s.nodes[end].kind)) {
      throw std::invalid_argument(where + "node " + std::to_string(end) + " is not an endpoint");
    }
  }
  if (priority < 1 || priority >= kNumPrio) {
    throw std::invalid_argument(where + "priority must be 1..7 (class 0 is for control), got " +
                                std::to_string(priority));
  }
  const int64_t now = s.finalized ? static_cast<int64_t>(NowNs()) : 0;
  if (startNs < now) {
    throw std::invalid_argument(where + "starts at " + std::to_string(startNs) + " ns, before now (" +
                                std::to_string(now) + " ns)");
  }
  if (delayNs < 0) {
    throw std::invalid_argument(where + "delay must be >= 0");
  }
  if (src != dst && !s.routes.Reachable(src, dst)) {
    throw std::invalid_argument(where + "no route from " + std::to_string(src) + " to " + std::to_string(dst));
  }
  Impl::FlowState f;
  f.id = id;
  f.src = src;
  f.dst = dst;
  f.size = sizeBytes;
  f.prio = static_cast<uint8_t>(priority);
  f.key = ecmpKey;
  f.submitNs = startNs;
  f.readyNs = startNs;
  f.delayNs = delayNs;
  f.dport = dport;
  f.sport = 10000 + s.nextSport[{src, dst}]++;
  std::unordered_set<uint64_t> seen;
  for (uint64_t d : deps) {
    if (!seen.insert(d).second) {
      continue;
    }
    auto done = s.doneEnd.find(d);
    if (done != s.doneEnd.end()) {
      f.readyNs = std::max(f.readyNs, done->second);
    } else {
      s.dependents[d].push_back(id);
      ++f.pending;
    }
  }
  auto [it, ok] = s.flows.emplace(id, f);
  ++s.inFlight;
  ++s.submitted;
  if (it->second.pending == 0) {
    s.ScheduleStart(it->second);
  }
}

void PhantoraNetwork::RunUntil(int64_t ns) {
  Impl& s = Need(m_impl);
  const int64_t now = Now();
  if (ns < now) {
    throw std::invalid_argument("RunUntil(" + std::to_string(ns) + "): the network is already at " +
                                std::to_string(now) + " ns");
  }
  (void)s;
  Simulator::Stop(NanoSeconds(ns - now));
  Simulator::Run();
  // Events stamped exactly `ns` but scheduled after the stop event: run them too.
  while (NextEventTime() == ns) {
    Simulator::Stop(NanoSeconds(0));
    Simulator::Run();
  }
}

bool PhantoraNetwork::RunUntilWatched(int64_t ns, const std::vector<uint64_t>& watch) {
  NS_LOG_FUNCTION(this << ns << watch.size());
  Impl& s = Need(m_impl);
  const int64_t now = Now();
  const bool bounded = ns >= 0;
  if (bounded && ns < now) {
    throw std::invalid_argument("RunUntilWatched(" + std::to_string(ns) + "): the network is already at " +
                                std::to_string(now) + " ns");
  }
  if (!bounded && s.inFlight == 0) {
    return false;
  }
  s.watched.clear();
  s.watched.insert(watch.begin(), watch.end());
  s.watchHit = false;
  s.watching = !s.watched.empty();
  s.stopWhenIdle = !bounded;
  EventId stop;
  if (bounded) {
    stop = Simulator::Stop(NanoSeconds(ns - now));
  }
  Simulator::Run();
  s.watching = false;
  s.stopWhenIdle = false;
  s.watched.clear();
  if (bounded && !s.watchHit) {
    // Reached the limit: the events stamped `ns` but scheduled after the stop event, as RunUntil.
    RunUntil(ns);
    return false;
  }
  // Stopped inside an ns (a watched completion, or idle): cancel the limit and finish that ns.
  if (bounded) {
    Simulator::Cancel(stop);
  }
  RunUntil(Now());
  NS_LOG_LOGIC("stopped at " << Now() << " ns, watched completion: " << s.watchHit);
  return s.watchHit;
}

bool PhantoraNetwork::RunUntilIdle(int64_t limitNs) {
  Impl& s = Need(m_impl);
  if (s.inFlight == 0) {
    return true;
  }
  const int64_t now = Now();
  if (limitNs < now) {
    throw std::invalid_argument("RunUntilIdle: limit is in the past");
  }
  s.stopWhenIdle = true;
  EventId stop = Simulator::Stop(NanoSeconds(limitNs - now));
  Simulator::Run();
  s.stopWhenIdle = false;
  Simulator::Cancel(stop);
  return s.inFlight == 0;
}

bool PhantoraNetwork::RunUntilQuiet(int64_t limitNs) {
  Impl& s = Need(m_impl);
  if (s.flows.empty()) {
    return true;
  }
  const int64_t now = Now();
  if (limitNs < now) {
    throw std::invalid_argument("RunUntilQuiet: limit is in the past");
  }
  s.stopWhenQuiet = true;
  EventId stop = Simulator::Stop(NanoSeconds(limitNs - now));
  Simulator::Run();
  s.stopWhenQuiet = false;
  Simulator::Cancel(stop);
  return s.flows.empty();
}

std::vector<FlowRecord> PhantoraNetwork::DrainCompletions() {
  std::vector<FlowRecord> out;
  out.swap(Need(m_impl).completions);
  std::sort(out.begin(), out.end(), [](const FlowRecord& a, const FlowRecord& b) {
    return a.endNs != b.endNs ? a.endNs < b.endNs : a.id < b.id;
  });
  return out;
}

std::vector<FctRecord> PhantoraNetwork::DrainFct() {
  std::vector<FctRecord> out;
  out.swap(Need(m_impl).fcts);
  return out;
}

std::vector<PfcRecord> PhantoraNetwork::DrainPfc() {
  std::vector<PfcRecord> out;
  out.swap(Need(m_impl).pfcs);
  return out;
}

std::vector<QueueSample> PhantoraNetwork::DrainQueueSamples() {
  std::vector<QueueSample> out;
  out.swap(Need(m_impl).samples);
  return out;
}

std::vector<DropRecord> PhantoraNetwork::DrainDrops() {
  std::vector<DropRecord> out;
  out.swap(Need(m_impl).drops);
  return out;
}

std::vector<CnpRecord> PhantoraNetwork::DrainCnps() {
  std::vector<CnpRecord> out;
  out.swap(Need(m_impl).cnps);
  return out;
}

std::vector<EcnRecord> PhantoraNetwork::DrainEcnMarks() {
  std::vector<EcnRecord> out;
  out.swap(Need(m_impl).ecnMarks);
  return out;
}

std::vector<ChannelRecord> PhantoraNetwork::ChannelStats() const {
  const Impl& s = Need(m_impl);
  std::vector<ChannelRecord> out;
  out.reserve(2 * s.links.size());
  for (uint32_t l = 0; l < s.links.size(); ++l) {
    const Impl::LinkInfo& li = s.links[l];
    for (int dir = 0; dir < 2; ++dir) {
      const uint32_t from = dir ? li.b : li.a;
      const uint32_t to = dir ? li.a : li.b;
      const uint32_t port = dir ? li.pb : li.pa;
      const Impl::NodeInfo& n = s.nodes[from];
      const Ptr<PhantoraNetDevice>& dev = n.ports[port];
      ChannelRecord r{2 * l + dir, from, to, li.bps, dev->GetTxBytes(), dev->GetTxPackets(), dev->GetPausedNs(), 0, 0};
      if (n.sw) {
        r.ecnMarks = n.sw->EcnMarks(port);
        r.maxQueueBytes = n.sw->MaxPortBytes(port);
      }
      out.push_back(r);
    }
  }
  return out;
}

std::vector<std::pair<std::string, double>> PhantoraNetwork::Stats() const {
  const Impl& s = Need(m_impl);
  uint64_t maxBuf = 0;
  uint64_t qps = 0;
  for (const auto& n : s.nodes) {
    if (n.sw) {
      maxBuf = std::max(maxBuf, n.sw->Mmu().MaxUsedBytes());
    }
    if (n.nic) {
      qps += n.nic->ActiveQps();
    }
  }
  const FabricStats& t = s.stats;
  return {{"events", static_cast<double>(Simulator::GetEventCount())},
          {"flows_submitted", static_cast<double>(s.submitted)},
          {"flows_completed", static_cast<double>(s.completed)},
          {"flows_in_flight", static_cast<double>(s.inFlight)},
          {"active_qps", static_cast<double>(qps)},
          {"data_packets", static_cast<double>(t.dataPackets)},
          {"retx_packets", static_cast<double>(t.retxPackets)},
          {"acks", static_cast<double>(t.acks)},
          {"nacks", static_cast<double>(t.nacks)},
          {"timeouts", static_cast<double>(t.timeouts)},
          {"cnps", static_cast<double>(t.cnps)},
          {"ecn_marks", static_cast<double>(t.ecnMarks)},
          {"drops", static_cast<double>(t.drops)},
          {"pfc_pause", static_cast<double>(t.pfcPause)},
          {"pfc_resume", static_cast<double>(t.pfcResume)},
          {"payload_bytes_delivered", static_cast<double>(t.payloadBytesDelivered)},
          {"max_switch_buffer_bytes", static_cast<double>(maxBuf)},
          {"int_enabled", s.intOn ? 1.0 : 0.0},
          {"cc_base_rtt_ns", static_cast<double>(s.cfg.ccBaseRttNs ? s.cfg.ccBaseRttNs : s.maxRttNs)},
          {"cc_bdp_bytes", static_cast<double>(s.cfg.ccBdpBytes ? s.cfg.ccBdpBytes : s.maxBdpBytes)}};
}

int64_t PhantoraNetwork::Now() const { return Simulator::Now().GetNanoSeconds(); }

int64_t PhantoraNetwork::NextEventTime() const {
  PhantoraScheduler* sched = PhantoraScheduler::Current();
  return sched ? sched->PeekNextTs() : -1;
}

uint64_t PhantoraNetwork::InFlight() const { return Need(m_impl).inFlight; }

std::vector<int64_t> PhantoraNetwork::Route(uint32_t src, uint32_t dst, uint64_t ecmpKey) {
  Impl& s = Need(m_impl);
  if (src >= s.nodes.size() || dst >= s.nodes.size()) {
    throw std::invalid_argument("Route: unknown node");
  }
  return s.routes.Path(src, dst, ecmpKey);
}

uint64_t PhantoraNetwork::BaseRttNs(uint32_t src, uint32_t dst, uint64_t ecmpKey) {
  Impl& s = Need(m_impl);
  if (src >= s.nodes.size() || dst >= s.nodes.size()) {
    throw std::invalid_argument("BaseRttNs: unknown node");
  }
  return s.PairRtt(src, dst, ecmpKey);
}

uint64_t PhantoraNetwork::FlowRateBps(uint64_t flowId) const {
  const Impl& s = Need(m_impl);
  auto it = s.flows.find(flowId);
  if (it == s.flows.end() || it->second.startNs < 0) {
    return 0;
  }
  Ptr<CongestionControl> cc = s.nodes[it->second.src].nic->GetCc(flowId);
  return cc ? cc->GetRateBps() : 0;
}

}  // namespace ns3
