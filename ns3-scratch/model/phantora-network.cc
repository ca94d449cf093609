// PhantoraNetwork: the facade's life cycle, its settings, building the fabric, results and queries.
// Flows and running are in phantora-flows.cc.
#include "phantora-network.h"

#include "phantora-interrupt.h"
#include "phantora-network-impl.h"
#include "phantora-scheduler.h"

#include "ns3/global-value.h"
#include "ns3/log.h"
#include "ns3/object-factory.h"
#include "ns3/rng-seed-manager.h"
#include "ns3/scheduler.h"
#include "ns3/simulator-impl.h"
#include "ns3/simulator.h"
#include "ns3/string.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <unordered_map>
#include <utility>

namespace ns3 {

NS_LOG_COMPONENT_DEFINE("PhantoraNetwork");

namespace {

bool g_live = false;  // ns-3 has one simulator per process

/// A partition param's comma-separated list of ids (each 1-9 decimal digits); throws naming the param and the
/// word that is not `what`.
std::vector<uint32_t> ParseIdList(const std::string& name, const std::string& value, const char* what) {
  std::vector<uint32_t> ids;
  std::size_t at = 0;
  while (at < value.size()) {
    std::size_t end = value.find(',', at);
    end = end == std::string::npos ? value.size() : end;
    const std::string word = value.substr(at, end - at);
    if (word.empty() || word.find_first_not_of("0123456789") != std::string::npos || word.size() > 9) {
      throw std::invalid_argument("partition." + name + ": '" + word + "' is not " + what);
    }
    ids.push_back(static_cast<uint32_t>(std::stoul(word)));
    at = end + 1;
  }
  return ids;
}

/// partition.Groups (a group per node id, comma-separated) or partition.Loopback (1: every group in this
/// engine, the one mode built).
void SetPartitionParam(PhantoraNetwork::Impl& s, const std::string& name, const std::string& value) {
  if (name == "Groups") {
    s.cutGroups = ParseIdList(name, value, "a group number");
  } else if (name == "Loopback") {
    if (value != "1" && value != "true") {
      throw std::invalid_argument("partition.Loopback: '" + value +
                                  "' (only 1 is built: every group runs in this engine, through messages)");
    }
    s.cutLoopback = true;
  } else if (name == "Worker") {
    if (value.empty() || value.find_first_not_of("0123456789") != std::string::npos || value.size() > 9) {
      throw std::invalid_argument("partition.Worker: '" + value + "' is not a group number");
    }
    s.cutWorker = static_cast<uint32_t>(std::stoul(value));
  } else if (name == "Idle") {  // nodes that carry no packet (comma-separated ids): their cut cables bound nothing
    s.cutIdle = ParseIdList(name, value, "a node id");
  } else {
    throw std::invalid_argument("unknown param 'partition." + name + "' (expected partition.Groups, "
                                "partition.Loopback, partition.Worker or partition.Idle)");
  }
}

/// Make the fabric's "Simulator" attribute ns-3's simulator core, before anything schedules an event (a new
/// node schedules its initialisation): bind SimulatorImplementationType, then check what ns-3 made of it.
void BindSimulator(PhantoraNetwork::Impl& s) {
  if (s.simulatorBound) {
    return;
  }
  const std::string& name = s.fabric->GetSimulator();
  TypeId tid;
  if (!TypeId::LookupByNameFailSafe(name, &tid) || !tid.IsChildOf(SimulatorImpl::GetTypeId()) ||
      !tid.HasConstructor()) {
    throw std::invalid_argument("attribute 'Simulator' of the fabric: unknown ns-3 simulator '" + name + "'");
  }
  GlobalValue::Bind("SimulatorImplementationType", StringValue(name));
  const std::string running = Simulator::GetImplementation()->GetInstanceTypeId().GetName();
  if (running != name) {
    throw std::runtime_error("attribute 'Simulator' of the fabric: ns-3's simulator is already a " + running +
                             " (made before this network added a node)");
  }
  s.simulatorBound = true;
}

}  // namespace

PhantoraNetwork::PhantoraNetwork() {
  if (g_live) {
    throw std::runtime_error("a PhantoraNetwork is already open in this process: Close() it first");
  }
  g_live = true;
  TakeInterrupt();  // a signal before this network existed was about earlier work
  m_impl = std::make_unique<Impl>();
}

PhantoraNetwork::~PhantoraNetwork() { Close(); }

void PhantoraNetwork::Close() {
  if (!m_impl) {
    return;
  }
  if (m_impl->cut) {
    if (PhantoraSimulatorImpl* sim = PhantoraSimulatorImpl::Current()) {
      sim->SetWindow(nullptr, 0);
    }
    m_impl->cut.reset();
  }
  m_impl->recorder->Dispose();
  m_impl->fabric->Dispose();
  m_impl.reset();
  Simulator::Destroy();
  g_live = false;
}

PhantoraNetwork::Impl& PhantoraNetwork::Need() const {
  if (!m_impl) {
    throw std::runtime_error("this PhantoraNetwork is closed");
  }
  return *m_impl;
}

void PhantoraNetwork::SetParam(const std::string& key, const std::string& value) {
  Impl& s = Need();
  if (s.finalized) {
    throw std::runtime_error("SetParam('" + key + "') after Finalize()");
  }
  const std::size_t dot = key.find('.');
  const std::string scope = key.substr(0, dot);
  const std::string name = dot == std::string::npos ? "" : key.substr(dot + 1);
  if (name.empty()) {
    throw std::invalid_argument("unknown param '" + key + "' (expected nic.ATTR, switch.ATTR, cc.ATTR, fabric.ATTR "
                                "or recorder.ATTR)");
  }
  if (scope == "nic") {
    s.installer.SetNicAttribute(name, value);
  } else if (scope == "switch") {
    s.installer.SetSwitchAttribute(name, value);
  } else if (scope == "cc") {
    s.installer.SetCcAttribute(name, value);
  } else if (scope == "fabric") {
    if (name == "Simulator" && s.simulatorBound) {
      throw std::runtime_error("SetParam('fabric.Simulator') after the first AddNode (ns-3's simulator exists)");
    }
    s.fabric->SetAttribute(name, *AttributeFromText(PhantoraFabric::GetTypeId(), name, value, "the fabric"));
  } else if (scope == "partition") {
    SetPartitionParam(s, name, value);
  } else if (scope == "recorder") {
    s.recorder->SetAttribute(name, *AttributeFromText(FabricRecorder::GetTypeId(), name, value, "the recorder"));
  } else {
    throw std::invalid_argument("unknown param '" + key + "' (expected nic.ATTR, switch.ATTR, cc.ATTR, fabric.ATTR "
                                "or recorder.ATTR)");
  }
}

uint32_t PhantoraNetwork::AddNode(const std::string& kind) {
  Impl& s = Need();
  if (s.finalized) {
    throw std::runtime_error("AddNode after Finalize()");
  }
  BindSimulator(s);
  return s.fabric->AddNode(kind);
}

uint32_t PhantoraNetwork::AddLink(uint32_t a, uint32_t b, uint64_t bps, uint64_t delayNs) {
  Impl& s = Need();
  if (s.finalized) {
    throw std::runtime_error("AddLink after Finalize()");
  }
  return s.fabric->AddLink(a, b, bps, delayNs);
}

void PhantoraNetwork::Finalize() {
  Impl& s = Need();
  if (s.finalized) {
    throw std::runtime_error("Finalize() called twice");
  }
  BindSimulator(s);
  TypeId sched;
  const std::string& schedName = s.fabric->GetScheduler();
  if (!TypeId::LookupByNameFailSafe(schedName, &sched) || !sched.IsChildOf(Scheduler::GetTypeId()) ||
      !sched.HasConstructor()) {
    throw std::invalid_argument("attribute 'Scheduler' of the fabric: unknown ns-3 scheduler '" + schedName + "'");
  }
  if (sched == PhantoraKeyedScheduler::GetTypeId() && s.fabric->GetSimulator() != "ns3::PhantoraSimulatorImpl") {
    throw std::invalid_argument("attribute 'Scheduler' of the fabric: ns3::PhantoraKeyedScheduler (the keyed mode) "
                                "needs attribute 'Simulator' ns3::PhantoraSimulatorImpl, not " +
                                s.fabric->GetSimulator());
  }
  if (Time::GetResolution() != Time::NS) {
    throw std::runtime_error("the phantora fabric runs at ns resolution; Time::SetResolution was changed");
  }
  RngSeedManager::SetSeed(s.fabric->GetSeed());
  RngSeedManager::SetRun(1);
  ObjectFactory factory;
  factory.SetTypeId("ns3::PhantoraScheduler");
  factory.Set("Inner", StringValue(schedName));
  Simulator::SetScheduler(factory);
  Impl* impl = &s;
  s.installer.Install(s.fabric, MakeCallback(&Impl::DataComplete, impl), MakeCallback(&Impl::SenderDone, impl));
  s.recorder->Connect(s.fabric);
  s.fabric->ComputeGlobalRtt();
  if (!s.cutGroups.empty()) {
    PhantoraSimulatorImpl* sim = PhantoraSimulatorImpl::Current();
    if (!sim || !sim->Keyed()) {
      throw std::invalid_argument("partition.Groups: a cut needs the keyed mode (attribute 'Scheduler' of the "
                                  "fabric ns3::PhantoraKeyedScheduler)");
    }
    if (s.cutLoopback == s.Worker()) {
      throw std::invalid_argument("partition.Groups: give either partition.Loopback 1 (every group in this "
                                  "engine) or partition.Worker G (this engine runs group G)");
    }
    s.cut = std::make_unique<PhantoraCutLink>(s.fabric, s.cutGroups, s.cutWorker, s.cutIdle);
    if (s.cutLoopback && s.cut->CutCables() > 0) {
      sim->SetWindow(s.cut.get(), s.cut->LookaheadNs());
    }
    if (s.Worker()) {
      sim->KeepRunningKey();  // every record carries its event's order key, for the merge of the workers'
      s.recorder->keepKeys = true;
      std::vector<uint8_t> owned(s.fabric->NumNodes());
      for (uint32_t n = 0; n < owned.size(); ++n) {
        owned[n] = s.Owns(n) ? 1 : 0;
      }
      s.recorder->SampleOwned(std::move(owned), s.cutWorker);  // each worker samples the switches it runs
      s.cut->SetForget([impl](uint64_t flow, uint32_t node, uint64_t) { impl->ForgetAtReceiver(flow, node); });
      s.cut->SetRelease([impl](uint64_t flow, uint64_t ns, const PhantoraOrderKey& event, uint32_t seq,
                               const PhantoraOrderKey& key) {
        impl->Release(flow, static_cast<int64_t>(ns), event, seq, key, true);
      });
      s.cut->SetDone([impl](uint64_t flow, uint64_t ns) {
        impl->doneEnd[flow] = static_cast<int64_t>(ns);
        ++impl->doneNotes;
      });
      for (uint32_t n = 0; n < s.fabric->NumNodes(); ++n) {  // retransmissions after the last byte's first send
        const PhantoraFabric::NodeInfo& info = s.fabric->GetNode(n);
        if (info.nic && s.Owns(n)) {
          info.nic->TraceConnectWithoutContext("Retransmit", MakeCallback(&Impl::Retransmitted, impl));
        }
      }
      s.cut->SetBound([impl](uint64_t flow, uint64_t ns) {
        const auto info = impl->depInfo.find(flow);
        if (info != impl->depInfo.end() && impl->Owns(info->second.src)) {  // its last byte's, from a switch there
          if (impl->flows.count(flow)) {
            int64_t& lb = impl->tailLb[flow];
            lb = std::max(lb, static_cast<int64_t>(ns));
          }
        } else if (!impl->doneEnd.count(flow)) {
          int64_t& lb = impl->sharedLb[flow];
          lb = std::max(lb, static_cast<int64_t>(ns));
        }
      });
      s.EnableTailBounds();
    }
  } else if (s.Worker()) {
    throw std::invalid_argument("partition.Worker: needs partition.Groups");
  }
  s.finalized = true;
  // Nodes schedule their initialisation at t = 0: run it now, so NextEventTime() reports only our events.
  RunUntil(0);
  s.workerStarted = s.Worker();
}

std::vector<FlowRecord> PhantoraNetwork::DrainCompletions() {
  std::vector<FlowRecord> out = TakeAll(Need().completions);
  std::sort(out.begin(), out.end(), [](const FlowRecord& a, const FlowRecord& b) {
    return a.endNs != b.endNs ? a.endNs < b.endNs : a.id < b.id;
  });
  return out;
}

std::vector<FctRecord> PhantoraNetwork::DrainFct() {
  return TakeAll(Need().fcts);
}

std::vector<PfcRecord> PhantoraNetwork::DrainPfc() {
  return TakeAll(Need().recorder->pfcs);
}

std::vector<QueueSample> PhantoraNetwork::DrainQueueSamples() {
  return TakeAll(Need().recorder->samples);
}

std::vector<DropRecord> PhantoraNetwork::DrainDrops() {
  return TakeAll(Need().recorder->drops);
}

std::vector<TrimRecord> PhantoraNetwork::DrainTrims() {
  return TakeAll(Need().recorder->trims);
}

std::vector<LossRecord> PhantoraNetwork::DrainLosses() {
  return TakeAll(Need().losses);
}

std::vector<CnpRecord> PhantoraNetwork::DrainCnps() {
  return TakeAll(Need().recorder->cnps);
}

std::vector<EcnRecord> PhantoraNetwork::DrainEcnMarks() {
  return TakeAll(Need().recorder->ecnMarks);
}

std::vector<int64_t> PhantoraNetwork::DrainRecordKeys(const std::string& kind) {
  Impl& s = Need();
  FabricRecorder& r = *s.recorder;
  std::vector<RecordKey>* keys = kind == "fct"     ? &s.fctKeys
                                 : kind == "pfc"   ? &r.pfcKeys
                                 : kind == "drops" ? &r.dropKeys
                                 : kind == "trims" ? &r.trimKeys
                                 : kind == "cnps"  ? &r.cnpKeys
                                 : kind == "ecn"   ? &r.ecnKeys
                                                   : nullptr;
  if (!keys) {
    throw std::invalid_argument("DrainRecordKeys: unknown record kind '" + kind +
                                "' (fct, pfc, drops, trims, cnps, ecn)");
  }
  std::vector<int64_t> out;
  out.reserve(4 * keys->size());
  for (const RecordKey& k : TakeAll(*keys)) {
    out.insert(out.end(), {k.ns, static_cast<int64_t>(k.schedTs), k.node, k.count});
  }
  return out;
}

std::vector<ChannelRecord> PhantoraNetwork::ChannelStats() const {
  const Impl& s = Need();
  std::vector<ChannelRecord> out;
  const auto& links = s.fabric->Links();
  out.reserve(2 * links.size());
  for (uint32_t l = 0; l < links.size(); ++l) {
    const PhantoraFabric::LinkInfo& li = links[l];
    for (int dir = 0; dir < 2; ++dir) {
      const uint32_t from = dir ? li.b : li.a;
      const uint32_t to = dir ? li.a : li.b;
      const uint32_t port = dir ? li.pb : li.pa;
      const PhantoraFabric::NodeInfo& n = s.fabric->GetNode(from);
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

std::vector<FlowTransportRecord> PhantoraNetwork::FlowTransport() const {
  const Impl& s = Need();
  std::vector<FlowTransportRecord> out;
  out.reserve(s.transport.size());
  for (const auto& [id, t] : s.transport) {
    out.push_back(FlowTransportRecord{id, t.retxPackets, t.retxBytes, t.oooPackets, t.reorderMaxBytes});
  }
  return out;
}

std::vector<int64_t> PhantoraNetwork::CutTransportTail() const {
  const Impl& s = Need();
  std::vector<int64_t> out;
  if (!s.Worker()) {
    return out;
  }
  const auto key = [&out](const RecordKey& k) {
    out.insert(out.end(), {k.ns, static_cast<int64_t>(k.schedTs), static_cast<int64_t>(k.node),
                           static_cast<int64_t>(k.count)});
  };
  std::vector<uint64_t> ids;
  for (const auto& [id, k] : s.dataDoneKey) {
    ids.push_back(id);
  }
  std::sort(ids.begin(), ids.end());
  for (uint64_t id : ids) {
    out.insert(out.end(), {0, static_cast<int64_t>(id)});
    key(s.dataDoneKey.at(id));
  }
  ids.clear();
  for (const auto& [id, f] : s.flows) {
    if (f.startNs >= 0 && f.size > 0 && f.src != f.dst && s.Owns(f.src) && !s.Owns(f.dst)) {
      ids.push_back(id);
    }
  }
  std::sort(ids.begin(), ids.end());
  static const std::vector<std::pair<RecordKey, uint32_t>> kNone;
  for (uint64_t id : ids) {
    const auto& f = s.flows.at(id);
    const FlowTransportStats tx = s.fabric->GetNode(f.src).nic->TxStats(id);
    const auto tail = s.tailRetx.find(id);
    const auto& marks = tail == s.tailRetx.end() ? kNone : tail->second;
    out.insert(out.end(), {1, static_cast<int64_t>(id), static_cast<int64_t>(tx.retxPackets),
                           static_cast<int64_t>(tx.retxBytes), static_cast<int64_t>(marks.size())});
    for (const auto& [k, payload] : marks) {
      key(k);
      out.push_back(payload);
    }
  }
  return out;
}

std::vector<std::pair<std::string, double>> PhantoraNetwork::Stats() const {
  const Impl& s = Need();
  uint64_t maxBuf = 0;
  uint64_t wireLostPackets = 0;
  uint64_t wireLostBytes = 0;
  for (const auto& l : s.fabric->Links()) {
    wireLostPackets += l.channel->GetLostPackets();
    wireLostBytes += l.channel->GetLostBytes();
  }
  uint64_t qps = 0;
  uint64_t failovers = 0;
  RdmaNic::Counters t;
  PfcSwitch::Counters w;
  uint64_t flowlets = 0;
  uint64_t creditFrames = 0;
  uint64_t creditBlockedNs = 0;
  for (const auto& n : s.fabric->Nodes()) {
    for (const auto& port : n.ports) {  // credit-based flow control (switch.CreditFlowControl)
      creditFrames += port->GetCreditFrames();
      creditBlockedNs += port->GetCreditBlockedNs();
    }
    if (n.sw) {
      maxBuf = std::max(maxBuf, n.sw->Mmu().MaxUsedBytes());
      const PfcSwitch::Counters& c = n.sw->GetCounters();
      w.drops += c.drops;
      w.ecnMarks += c.ecnMarks;
      w.pfcPause += c.pfcPause;
      w.pfcResume += c.pfcResume;
      w.trims += c.trims;
      w.trimmedBytes += c.trimmedBytes;
      flowlets += n.sw->Lb().Flowlets();
    }
    if (n.nic) {
      qps += n.nic->ActiveQps();
      const RdmaNic::Counters& c = n.nic->GetCounters();
      t.dataPackets += c.dataPackets;
      t.retxPackets += c.retxPackets;
      t.retxBytes += c.retxBytes;
      t.oooPackets += c.oooPackets;
      t.reorderMaxBytes = std::max(t.reorderMaxBytes, c.reorderMaxBytes);
      t.acks += c.acks;
      t.nacks += c.nacks;
      t.timeouts += c.timeouts;
      t.cnps += c.cnps;
      t.ecnEchoes += c.ecnEchoes;
      t.trimNacks += c.trimNacks;
      t.entropiesExplored += c.entropiesExplored;
      t.entropiesRecycled += c.entropiesRecycled;
      t.repsFreezes += c.repsFreezes;
      t.payloadBytesDelivered += c.payloadBytesDelivered;
      t.queuePairs += c.queuePairs;
      failovers += c.failovers;
    }
  }
  return {{"events", static_cast<double>(Simulator::GetEventCount())},
          {"flows_submitted", static_cast<double>(s.submitted)},
          {"flows_completed", static_cast<double>(s.completed)},
          {"flows_in_flight", static_cast<double>(s.inFlight)},
          {"active_qps", static_cast<double>(qps)},
          {"queue_pairs", static_cast<double>(t.queuePairs)},
          {"data_packets", static_cast<double>(t.dataPackets)},
          {"retx_packets", static_cast<double>(t.retxPackets)},
          {"retx_bytes", static_cast<double>(t.retxBytes)},
          {"ooo_packets", static_cast<double>(t.oooPackets)},
          {"reorder_max_bytes", static_cast<double>(t.reorderMaxBytes)},
          {"flowlets", static_cast<double>(flowlets)},
          {"acks", static_cast<double>(t.acks)},
          {"nacks", static_cast<double>(t.nacks)},
          {"timeouts", static_cast<double>(t.timeouts)},
          {"cnps", static_cast<double>(t.cnps)},
          {"ecn_echoes", static_cast<double>(t.ecnEchoes)},
          {"trim_nacks", static_cast<double>(t.trimNacks)},
          {"entropies_explored", static_cast<double>(t.entropiesExplored)},
          {"entropies_recycled", static_cast<double>(t.entropiesRecycled)},
          {"reps_freezes", static_cast<double>(t.repsFreezes)},
          {"ecn_marks", static_cast<double>(w.ecnMarks)},
          {"drops", static_cast<double>(w.drops)},
          {"pfc_pause", static_cast<double>(w.pfcPause)},
          {"pfc_resume", static_cast<double>(w.pfcResume)},
          {"credit_frames", static_cast<double>(creditFrames)},
          {"credit_blocked_ns", static_cast<double>(creditBlockedNs)},
          {"trims", static_cast<double>(w.trims)},
          {"trimmed_bytes", static_cast<double>(w.trimmedBytes)},
          {"payload_bytes_delivered", static_cast<double>(t.payloadBytesDelivered)},
          {"max_switch_buffer_bytes", static_cast<double>(maxBuf)},
          {"int_enabled", s.installer.IntEnabled() ? 1.0 : 0.0},
          {"cc_base_rtt_ns", static_cast<double>(s.fabric->MaxRttNs())},
          {"cc_bdp_bytes", static_cast<double>(s.fabric->MaxBdpBytes())},
          {"link_events", static_cast<double>(s.linkEvents)},
          {"reconvergences", static_cast<double>(s.reconvergences)},
          {"rerouted_flows", static_cast<double>(s.reroutedFlows)},
          {"rerouted_bytes", static_cast<double>(s.reroutedBytes)},
          {"stalls", static_cast<double>(s.stalls)},
          {"no_route_flows", static_cast<double>(s.noRoute.size())},
          {"nic_failovers", static_cast<double>(failovers)},
          {"wire_lost_packets", static_cast<double>(wireLostPackets)},
          {"wire_lost_bytes", static_cast<double>(wireLostBytes)}};
}

namespace {

/// Check a scenario event's link and time; the delay until it.
Time ScenarioDelay(PhantoraNetwork::Impl& s, const char* what, int64_t atNs, uint32_t link) {
  if (!s.finalized) {
    throw std::runtime_error(std::string(what) + " before Finalize()");
  }
  if (s.Worker()) {
    throw std::invalid_argument(std::string(what) + ": scenario events are not split by owner in a partition worker "
                                                    "(partition.Worker) yet");
  }
  if (link >= s.fabric->Links().size()) {
    throw std::invalid_argument(std::string(what) + ": unknown link " + std::to_string(link));
  }
  const int64_t now = Simulator::Now().GetNanoSeconds();
  if (atNs < now) {
    throw std::invalid_argument(std::string(what) + " at " + std::to_string(atNs) + " ns: the network is already at " +
                                std::to_string(now) + " ns");
  }
  return NanoSeconds(atNs - now);
}

}  // namespace

void PhantoraNetwork::ScheduleLinkState(int64_t atNs, uint32_t link, bool up) {
  Impl& s = Need();
  const Time delay = ScenarioDelay(s, "ScheduleLinkState", atNs, link);
  if (s.linkDown.empty()) {
    s.linkDown.assign(s.fabric->Links().size(), 0);
  }
  const PhantoraFabric::LinkInfo& info = s.fabric->Links()[link];
  info.channel->ExpectFailure();
  Impl* impl = &s;
  Simulator::Schedule(delay, [impl, link, up] {
    const PhantoraFabric::LinkInfo& l = impl->fabric->Links()[link];
    uint32_t& count = impl->linkDown[link];
    count = up ? (count > 0 ? count - 1 : 0) : count + 1;
    ++impl->linkEvents;
    l.channel->SetUp(count == 0);
    if (count > 0) {
      impl->fabric->GetNode(l.a).ports[l.pa]->ClearPause();
      impl->fabric->GetNode(l.b).ports[l.pb]->ClearPause();
    }
    if (!up) {
      const uint64_t hit = impl->StallOnLink(link);
      impl->stallLog.insert(impl->stallLog.end(),
                            {Simulator::Now().GetNanoSeconds(), static_cast<int64_t>(link), static_cast<int64_t>(hit)});
    }
  });
}

void PhantoraNetwork::ScheduleLinkDegrade(int64_t atNs, uint32_t link, uint64_t bps, uint64_t extraDelayNs,
                                          double loss, uint64_t seed) {
  Impl& s = Need();
  const Time delay = ScenarioDelay(s, "ScheduleLinkDegrade", atNs, link);
  if (!(loss >= 0.0 && loss < 1.0)) {
    throw std::invalid_argument("ScheduleLinkDegrade: loss must be in [0, 1), got " + std::to_string(loss));
  }
  Impl* impl = &s;
  Simulator::Schedule(delay, [impl, link, bps, extraDelayNs, loss, seed] {
    const PhantoraFabric::LinkInfo& l = impl->fabric->Links()[link];
    const uint64_t rate = bps ? bps : l.bps;
    ++impl->linkEvents;
    impl->fabric->GetNode(l.a).ports[l.pa]->SetRateBps(rate);
    impl->fabric->GetNode(l.b).ports[l.pb]->SetRateBps(rate);
    l.channel->SetDegraded(extraDelayNs, loss, seed * 1000003ULL + link);
  });
}

void PhantoraNetwork::ScheduleReconverge(int64_t atNs) {
  Impl& s = Need();
  const Time delay = ScenarioDelay(s, "ScheduleReconverge", atNs, 0);
  Impl* impl = &s;
  Simulator::Schedule(delay, [impl] {
    std::vector<uint32_t> down;
    for (uint32_t l = 0; l < impl->linkDown.size(); ++l) {
      if (impl->linkDown[l] > 0) {
        down.push_back(l);
      }
    }
    ++impl->reconvergences;
    // the started flows' routes before and after: those that change move with the bytes not yet sent once
    Ptr<RouteTable> routes = impl->fabric->GetRoutes();
    std::vector<std::pair<uint64_t, std::vector<int64_t>>> before;
    for (const auto& [id, f] : impl->flows) {
      if (f.startNs >= 0 && !f.dataDone && f.size > 0 && f.src != f.dst) {
        before.emplace_back(id, routes->Path(f.src, f.dst, f.key, f.viaNic));
      }
    }
    routes->SetLinksDown(down);
    impl->routesCut = !down.empty();
    uint64_t stalledNow = 0;  // the NICs move their queue pairs (failover) or stall those with no route
    for (const auto& n : impl->fabric->Nodes()) {
      if (n.nic) {
        for (const uint64_t id : n.nic->Repin()) {
          ++stalledNow;
          if (impl->noRoute.insert(id).second && !impl->blackholed.count(id)) {
            ++impl->stalls;  // a flow blackholed at the failure was counted then
          }
        }
      }
    }
    impl->blackholed.clear();
    uint64_t moved = 0;
    uint64_t bytes = 0;
    for (const auto& [id, path] : before) {
      const Impl::FlowState& f = impl->flows.at(id);
      const std::vector<int64_t> now = routes->Path(f.src, f.dst, f.key, f.viaNic);
      if (now.empty() || now == path) {
        continue;
      }
      uint64_t sent = 0;
      uint64_t bps = 0;
      impl->fabric->GetNode(f.src).nic->SendProgress(id, sent, bps);
      ++moved;
      bytes += f.size - std::min(sent, f.size);
    }
    impl->reroutedFlows += moved;
    impl->reroutedBytes += bytes;
    const int64_t atNow = Simulator::Now().GetNanoSeconds();
    impl->rerouteLog.insert(impl->rerouteLog.end(),
                            {atNow, static_cast<int64_t>(moved), static_cast<int64_t>(bytes)});
    impl->stallLog.insert(impl->stallLog.end(), {atNow, -1, static_cast<int64_t>(stalledNow)});
  });
}

std::vector<int64_t> PhantoraNetwork::RerouteLog() const { return Need().rerouteLog; }

std::vector<int64_t> PhantoraNetwork::StallLog() const { return Need().stallLog; }

uint64_t PhantoraNetwork::Impl::StallOnLink(uint32_t link) {
  const auto a = static_cast<int64_t>(2 * link);
  uint64_t hit = 0;
  std::vector<uint64_t> ids;
  for (const auto& [id, f] : flows) {
    if (f.startNs >= 0 && !f.dataDone && f.size > 0 && f.src != f.dst && !blackholed.count(id)) {
      ids.push_back(id);
    }
  }
  std::sort(ids.begin(), ids.end());
  for (const uint64_t id : ids) {
    const FlowState& f = flows.at(id);
    const std::vector<int64_t> path = fabric->GetRoutes()->Path(f.src, f.dst, f.key, f.viaNic);
    if (std::any_of(path.begin(), path.end(), [a](int64_t c) { return c == a || c == a + 1; })) {
      blackholed.insert(id);
      ++hit;
    }
  }
  stalls += hit;
  NS_LOG_LOGIC("link " << link << " fails: " << hit << " flows on it stall until re-convergence");
  return hit;
}

void PhantoraNetwork::SetThrottle(uint32_t node, int64_t startNs, int64_t endNs, double factor) {
  Impl& s = Need();
  if (node >= s.fabric->NumNodes() || !IsEndpoint(s.fabric->GetNode(node).kind)) {
    throw std::invalid_argument("SetThrottle: node " + std::to_string(node) + " is not an endpoint");
  }
  if (!(factor > 0.0) || (endNs >= 0 && endNs <= startNs)) {
    throw std::invalid_argument("SetThrottle: a factor > 0 and a window [start, end) with end > start");
  }
  s.throttles[node].push_back({startNs, endNs < 0 ? -1 : endNs, factor});
}

void PhantoraNetwork::ThrottleFromFlow(uint64_t id, uint32_t node, int64_t durationNs, double factor) {
  Impl& s = Need();
  if (s.Worker()) {
    throw std::invalid_argument("ThrottleFromFlow: not in a partition worker (partition.Worker): the flow's "
                                "completion and the throttled node may be in different workers");
  }
  if (node >= s.fabric->NumNodes() || !IsEndpoint(s.fabric->GetNode(node).kind)) {
    throw std::invalid_argument("ThrottleFromFlow: node " + std::to_string(node) + " is not an endpoint");
  }
  if (!(factor > 0.0) || durationNs == 0) {
    throw std::invalid_argument("ThrottleFromFlow: a factor > 0 and a duration != 0");
  }
  if (s.doneEnd.count(id)) {
    throw std::invalid_argument("ThrottleFromFlow: flow " + std::to_string(id) + " has already completed");
  }
  s.throttleOnDone[id].push_back({node, durationNs < 0 ? -1 : durationNs, factor});
}

void PhantoraNetwork::ExemptFromThrottle(uint64_t id) { Need().unthrottled.insert(id); }

PhantoraCutLink& PhantoraNetwork::Worker(const char* what) const {
  const Impl& s = Need();
  if (!s.Worker() || !s.cut) {
    throw std::runtime_error(std::string(what) + ": not a partition worker (params partition.Groups and "
                                                 "partition.Worker, then Finalize)");
  }
  return *s.cut;
}

void PhantoraNetwork::CutRunBefore(int64_t endNs) {
  Worker("CutRunBefore");
  Need().cutRan = true;
  PhantoraSimulatorImpl::Current()->RunBefore(static_cast<uint64_t>(std::max<int64_t>(endNs, 0)));
}

void PhantoraNetwork::CutRunThrough(int64_t ns) {
  Worker("CutRunThrough");
  Need().cutRan = true;
  PhantoraSimulatorImpl::Current()->RunBefore(static_cast<uint64_t>(std::max<int64_t>(ns, 0)), true);
}

void PhantoraNetwork::CutLockstep(int64_t ns, uint32_t round) {
  Worker("CutLockstep");
  PhantoraSimulatorImpl::Current()->SetLockstep(static_cast<uint64_t>(ns), round);
}

uint64_t PhantoraNetwork::CutRunLeast(int64_t ns, const std::vector<int64_t>& limit) {
  PhantoraCutLink& cut = Worker("CutRunLeast");
  Need().cutRan = true;
  PhantoraSimulatorImpl* sim = PhantoraSimulatorImpl::Current();
  PhantoraOrderKey lim;
  if (limit.size() == 3) {
    lim = PhantoraOrderKey{static_cast<uint64_t>(limit[0]), static_cast<uint32_t>(limit[1]),
                           static_cast<uint32_t>(limit[2])};
  } else if (!limit.empty()) {
    throw std::invalid_argument("CutRunLeast: the limit is a key (schedTs, node, count) or empty");
  }
  const uint64_t releases = cut.Releases();
  Impl& s = Need();
  uint64_t ran = 0;
  while (cut.Releases() == releases && static_cast<int64_t>(s.inFlight) > s.finishAt &&
         sim->RunOneAt(static_cast<uint64_t>(ns), limit.empty() ? nullptr : &lim)) {
    ++ran;
  }
  s.finishAt = -1;
  return ran;
}

std::vector<int64_t> PhantoraNetwork::CutNextKey() const {
  Worker("CutNextKey");
  uint64_t ts = 0;
  PhantoraOrderKey key;
  if (!PhantoraSimulatorImpl::Current()->PeekNextKeyed(ts, key)) {
    return {};
  }
  return {static_cast<int64_t>(ts), static_cast<int64_t>(key.schedTs), key.node, key.count};
}

std::vector<int64_t> PhantoraNetwork::CutReleaseBounds(int64_t floorNs) {
  Worker("CutReleaseBounds");
  Impl& s = Need();
  const int64_t now = floorNs;
  int64_t later = -1;
  int64_t same = -1;
  std::unordered_map<uint64_t, int64_t> memo;
  for (Impl::CrossJoin& join : s.crossJoins) {
    // A flow waiting on the join is released once its last dependency completes: no earlier than the greatest
    // of their completion bounds. Those done made their release already: they bound nothing more.
    int64_t done = -1;
    std::size_t keep = 0;
    for (const uint64_t id : join.deps) {
      const auto it = s.flows.find(id);
      if (it == s.flows.end() || it->second.dataDone || s.doneEnd.count(id)) {
        continue;
      }
      join.deps[keep++] = id;
      done = std::max(done, s.FlowLb(id, now, memo));
    }
    join.deps.resize(keep);
    if (keep == 0) {
      continue;
    }
    for (const Impl::CrossDependent& j : join.waiting) {
      const int64_t land = std::max(j.submitNs, done) + (s.throttles.empty() ? j.delayNs : 0);
      int64_t& slot = land > done ? later : same;
      slot = slot < 0 ? land : std::min(slot, land);
    }
  }
  return {later, same};
}

void PhantoraNetwork::CutShareBounds(int64_t floorNs) {
  Worker("CutShareBounds");
  if (floorNs >= 0) {
    Need().ShareBounds(floorNs);
  }
}

void PhantoraNetwork::CutReacting(const std::vector<int64_t>& flat) {
  Worker("CutReacting");
  if (flat.size() % 2 != 0) {
    throw std::invalid_argument("CutReacting: a flat list of (flow id, reaction ns) pairs, got " +
                                std::to_string(flat.size()) + " numbers");
  }
  Impl& s = Need();
  s.reacting.clear();
  s.reactStop = -1;
  for (std::size_t i = 0; i < flat.size(); i += 2) {
    if (flat[i] < 0 || flat[i + 1] < 0) {
      throw std::invalid_argument("CutReacting: flow " + std::to_string(flat[i]) + " with reaction " +
                                  std::to_string(flat[i + 1]) + " ns (both must be >= 0)");
    }
    s.reacting[static_cast<uint64_t>(flat[i])] = flat[i + 1];
  }
}

std::vector<int64_t> PhantoraNetwork::CutReactBounds(int64_t floorNs) {
  Worker("CutReactBounds");
  Impl& s = Need();
  int64_t least = -1;
  std::unordered_map<uint64_t, int64_t> memo;
  for (const auto& [id, reaction] : s.reacting) {
    const auto it = s.flows.find(id);
    // Its sender's worker bounds it (the receiver's reports its completion); a flow not added yet cannot complete.
    if (it == s.flows.end() || !s.Owns(it->second.src) || it->second.dataDone || s.doneEnd.count(id)) {
      continue;
    }
    const int64_t ns = std::max(s.FlowLb(id, floorNs, memo), floorNs) + reaction;
    least = least < 0 ? ns : std::min(least, ns);
  }
  return {least, s.reactStop};
}

void PhantoraNetwork::CutAdvanceTo(int64_t ns) {
  Worker("CutAdvanceTo");
  if (ns < Now() || (NextEventTime() >= 0 && NextEventTime() < ns)) {
    throw std::invalid_argument("CutAdvanceTo(" + std::to_string(ns) + "): the worker is at " +
                                std::to_string(Now()) + " ns with an event at " + std::to_string(NextEventTime()));
  }
  PhantoraSimulatorImpl::Current()->AdvanceTo(static_cast<uint64_t>(ns));
}

std::string PhantoraNetwork::CutTakeOutbox(uint32_t group) {
  PhantoraCutLink& cut = Worker("CutTakeOutbox");
  if (group >= cut.NumGroups()) {
    throw std::invalid_argument("CutTakeOutbox: group " + std::to_string(group) + " of " +
                                std::to_string(cut.NumGroups()));
  }
  const std::vector<uint8_t> out = cut.TakeOutbox(group);
  return std::string(reinterpret_cast<const char*>(out.data()), out.size());
}

std::size_t PhantoraNetwork::CutSwapOutbox(uint32_t group, std::vector<uint8_t>& batch) {
  PhantoraCutLink& cut = Worker("CutSwapOutbox");
  if (group >= cut.NumGroups()) {
    throw std::invalid_argument("CutSwapOutbox: group " + std::to_string(group) + " of " +
                                std::to_string(cut.NumGroups()));
  }
  return cut.SwapOutbox(group, batch);
}

int64_t PhantoraNetwork::CutTakeMinArrival() {
  const uint64_t t = Worker("CutTakeMinArrival").TakeMinArrival();
  return t == UINT64_MAX ? -1 : static_cast<int64_t>(t);
}

int64_t PhantoraNetwork::CutOutputBound() {
  PhantoraCutLink& cut = Worker("CutOutputBound");
  const PhantoraScheduler* sched = PhantoraScheduler::Current();
  const PhantoraKeyedScheduler* keyed = sched ? sched->Keyed() : nullptr;
  if (!keyed) {
    throw std::runtime_error("CutOutputBound: the keyed mode's scheduler is not running");
  }
  const uint64_t la = cut.LookaheadNs();
  const uint64_t t = std::min(keyed->LeastReach(cut.OwnReach(), la, std::max<uint64_t>(la, 1)), cut.TakeMinReach());
  return t >= static_cast<uint64_t>(INT64_MAX) ? -1 : static_cast<int64_t>(t);
}

void PhantoraNetwork::CutDeliver(const std::string& batch) {
  Worker("CutDeliver").Deliver(reinterpret_cast<const uint8_t*>(batch.data()), batch.size());
}

void PhantoraNetwork::CutDeliverBytes(const uint8_t* data, std::size_t size) {
  Worker("CutDeliver").Deliver(data, size);
}

uint32_t PhantoraNetwork::CutGroups() const { return Worker("CutGroups").NumGroups(); }

int64_t PhantoraNetwork::CutSamplingFrom() const {
  Worker("CutSamplingFrom");
  const FabricRecorder& r = *Need().recorder;
  return r.SamplesQueues() ? r.SamplingFrom() : -2;
}

int64_t PhantoraNetwork::CutIdleSince() const {
  Worker("CutIdleSince");
  const Impl& s = Need();
  return s.flows.empty() ? s.emptySince : -1;
}

bool PhantoraNetwork::CutSampling(int64_t fromNs, bool othersBusy, int64_t idleNs, int64_t ranBefore) {
  Worker("CutSampling");
  Impl& s = Need();
  s.othersBusy = othersBusy;
  if (fromNs >= 0) {
    s.recorder->JoinSampling(fromNs, MakeCallback(&Impl::Busy, &s));
  }
  return s.recorder->EndPeriod(fromNs, idleNs, ranBefore);
}

std::vector<uint64_t> PhantoraNetwork::UnpackIds(const std::string& packed) {
  if (packed.size() % sizeof(uint64_t) != 0) {
    throw std::invalid_argument("UnpackIds: " + std::to_string(packed.size()) + " bytes, not 8-byte ids");
  }
  std::vector<uint64_t> ids(packed.size() / sizeof(uint64_t));
  std::memcpy(ids.data(), packed.data(), packed.size());
  return ids;
}

void PhantoraNetwork::AddFlows(const std::string& packed) {
  constexpr size_t kWords = 9;
  if (packed.size() % (kWords * sizeof(uint64_t)) != 0) {
    throw std::invalid_argument("AddFlows: " + std::to_string(packed.size()) + " bytes, not 9 words a flow");
  }
  static const std::vector<uint64_t> kNoDeps;
  const size_t n = packed.size() / (kWords * sizeof(uint64_t));
  uint64_t w[kWords];
  for (size_t i = 0; i < n; ++i) {
    std::memcpy(w, packed.data() + i * sizeof(w), sizeof(w));
    if (w[8] > 1) {
      throw std::invalid_argument("flow " + std::to_string(w[0]) + ": AddFlows viaNic word " + std::to_string(w[8]) +
                                  ", not 0 or 1");
    }
    AddFlow(w[0], static_cast<uint32_t>(w[1]), static_cast<uint32_t>(w[2]), w[3], static_cast<int64_t>(w[4]),
            static_cast<uint32_t>(w[5]), w[6], kNoDeps, static_cast<int64_t>(w[7]), 100, w[8] != 0);
  }
}

std::string PhantoraNetwork::StepToCompletion(int64_t ns) {
  RunUntilCompletion(ns);
  const std::vector<FlowRecord> done = DrainCompletions();
  const std::vector<LossRecord> lost = DrainLosses();
  std::vector<uint64_t> w;
  w.reserve(3 + 6 * done.size() + 3 * lost.size());
  w.insert(w.end(), {static_cast<uint64_t>(InterruptedBy()), done.size(), lost.size()});
  for (const FlowRecord& r : done) {
    w.insert(w.end(), {r.id, r.src, r.dst, r.size, static_cast<uint64_t>(r.startNs), static_cast<uint64_t>(r.endNs)});
  }
  for (const LossRecord& r : lost) {
    w.insert(w.end(), {r.flowId, r.offset, r.bytes});
  }
  return std::string(reinterpret_cast<const char*>(w.data()), w.size() * sizeof(uint64_t));
}

std::vector<uint64_t> PhantoraNetwork::CutStats() const {
  const Impl& s = Need();
  if (!s.cut) {
    return {0, 0, 0, 0, 0};
  }
  return {s.cut->CutCables(), s.cut->LookaheadNs(), s.cut->Messages(), s.cut->MessageBytes(), s.cut->Barriers()};
}

int64_t PhantoraNetwork::Now() const { return Simulator::Now().GetNanoSeconds(); }

int64_t PhantoraNetwork::NextEventTime() const {
  PhantoraScheduler* sched = PhantoraScheduler::Current();
  return sched ? sched->PeekNextTs() : -1;
}

int64_t PhantoraNetwork::NextLiveEventTime() {
  Need();
  PhantoraScheduler* sched = PhantoraScheduler::Current();
  return sched ? sched->PeekNextLiveTs() : -1;
}

uint64_t PhantoraNetwork::InFlight() const { return Need().inFlight; }

std::vector<int64_t> PhantoraNetwork::Route(uint32_t src, uint32_t dst, uint64_t ecmpKey, bool viaNic) {
  Impl& s = Need();
  if (src >= s.fabric->NumNodes() || dst >= s.fabric->NumNodes()) {
    throw std::invalid_argument("Route: unknown node");
  }
  return s.fabric->GetRoutes()->Path(src, dst, ecmpKey, viaNic);
}

uint64_t PhantoraNetwork::BaseRttNs(uint32_t src, uint32_t dst, uint64_t ecmpKey, bool viaNic) {
  Impl& s = Need();
  if (src >= s.fabric->NumNodes() || dst >= s.fabric->NumNodes()) {
    throw std::invalid_argument("BaseRttNs: unknown node");
  }
  return s.fabric->PairRttNs(src, dst, ecmpKey, viaNic);
}

std::vector<FlowBound> PhantoraNetwork::CompletionBounds() {
  Impl& s = Need();
  const int64_t now = Now();
  s.EnableTailBounds();
  std::vector<FlowBound> out;
  out.reserve(s.inFlight);
  for (auto& [id, f] : s.flows) {
    if (f.startNs < 0 || f.dataDone) {
      continue;
    }
    out.push_back(FlowBound{id, s.CompletionLb(f, now, now + 1)});
  }
  return out;
}

int64_t PhantoraNetwork::LastSendEndBound() {
  Impl& s = Need();
  struct Left {
    uint64_t bytes = 0;                ///< not yet sent once
    int64_t propNs = INT64_MAX;        ///< the least propagation of their routes
    std::vector<uint32_t> ports;       ///< every port any of them may leave by
  };
  std::unordered_map<uint32_t, Left> left;  // per sender node
  const Ptr<RouteTable> routes = s.fabric->GetRoutes();
  for (auto& [id, f] : s.flows) {
    if (f.dataDone || f.size == 0 || f.src == f.dst || !s.Owns(f.src)) {
      continue;
    }
    uint64_t unsent = f.size;
    if (f.startNs >= 0) {
      uint64_t sent = 0;
      uint64_t bps = 0;
      if (!s.fabric->GetNode(f.src).nic->SendProgress(id, sent, bps)) {
        continue;  // no queue pair: nothing left to send here
      }
      unsent = f.size - std::min(sent, f.size);
    }
    const std::vector<uint32_t>& ports = routes->Candidates(f.src, f.dst, f.viaNic);
    if (unsent == 0 || ports.empty()) {
      continue;  // (no route: it waits for one, its bytes left out: the bound only falls)
    }
    if (f.minPropNs < 0) {
      f.minPropNs = static_cast<int64_t>(s.fabric->MinPropagationNs(f.src, f.dst));
    }
    Left& l = left[f.src];
    l.bytes += unsent;
    l.propNs = std::min(l.propNs, f.minPropNs);
    for (uint32_t p : ports) {
      if (std::find(l.ports.begin(), l.ports.end(), p) == l.ports.end()) {
        l.ports.push_back(p);
      }
    }
  }
  const int64_t now = Now();
  int64_t end = -1;
  for (const auto& [node, l] : left) {
    uint64_t bps = 0;
    for (uint32_t p : l.ports) {
      bps += s.fabric->GetNode(node).nic->PortRateBps(p);
    }
    if (bps == 0) {
      continue;
    }
    const auto txNs = static_cast<int64_t>(static_cast<unsigned __int128>(l.bytes) * 8'000'000'000ULL / bps);
    end = std::max(end, now - 2 + txNs + l.propNs);
  }
  return end;
}

void PhantoraNetwork::CutFinishAfter(int64_t left) {
  Worker("CutFinishAfter");
  Impl& s = Need();
  s.finishAt = left < 1 ? -1 : static_cast<int64_t>(s.inFlight) - left;
}

std::vector<int64_t> PhantoraNetwork::CutFinishBound() {
  Worker("CutFinishBound");
  Impl& s = Need();
  const int64_t now = Now();
  int64_t bound = LastSendEndBound();
  for (auto& [id, f] : s.flows) {
    // floor 0: a flow another worker completes may have completed there already (its own sends still bound it);
    // now - 1: one this worker completes may still complete in ns now (a window run through it, CutRunThrough)
    if (f.startNs >= 0 && !f.dataDone) {
      bound = std::max(bound, s.CompletionLb(f, now - 1, 0));
    }
  }
  return {static_cast<int64_t>(s.inFlight), bound};
}

std::string PhantoraNetwork::CutRoundEnd() {
  const std::vector<FlowRecord> done = DrainCompletions();
  const std::vector<LossRecord> lost = DrainLosses();
  const std::vector<FlowBound> bounds = CompletionBounds();
  std::vector<uint64_t> w;
  w.reserve(3 + 6 * done.size() + 3 * lost.size() + 2 * bounds.size());
  w.insert(w.end(), {done.size(), lost.size(), bounds.size()});
  for (const FlowRecord& r : done) {
    w.insert(w.end(), {r.id, r.src, r.dst, r.size, static_cast<uint64_t>(r.startNs), static_cast<uint64_t>(r.endNs)});
  }
  for (const LossRecord& r : lost) {
    w.insert(w.end(), {r.flowId, r.offset, r.bytes});
  }
  for (const FlowBound& b : bounds) {
    w.insert(w.end(), {b.id, static_cast<uint64_t>(b.ns)});
  }
  return std::string(reinterpret_cast<const char*>(w.data()), w.size() * sizeof(uint64_t));
}

uint64_t PhantoraNetwork::FlowRateBps(uint64_t flowId) const {
  const Impl& s = Need();
  auto it = s.flows.find(flowId);
  if (it == s.flows.end() || it->second.startNs < 0) {
    return 0;
  }
  Ptr<CongestionControl> cc = s.fabric->GetNode(it->second.src).nic->GetCc(flowId);
  return cc ? cc->GetRateBps() : 0;
}

}  // namespace ns3
