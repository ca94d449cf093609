// PfcSwitch: forwarding, MMU admission, PFC generation, ECN and INT at dequeue.
#include "pfc-switch.h"

#include "ns3/log.h"
#include "ns3/simulator.h"
#include "ns3/trace-source-accessor.h"

#include <algorithm>
#include <limits>

namespace ns3 {

NS_LOG_COMPONENT_DEFINE("PhantoraPfcSwitch");
NS_OBJECT_ENSURE_REGISTERED(PfcSwitch);

namespace {

template <typename T>
T ByRate(const std::map<uint64_t, T>& table, uint64_t rateBps, T scaled) {
  auto it = table.find(rateBps);
  return it == table.end() ? scaled : it->second;
}

}  // namespace

TypeId PfcSwitch::GetTypeId() {
  static TypeId tid =
      TypeId("ns3::PfcSwitch")
          .SetParent<Object>()
          .SetGroupName("Phantora")
          .AddConstructor<PfcSwitch>()
          .AddTraceSource("PfcTx", "A PFC frame was sent upstream: (port, class, pause)",
                          MakeTraceSourceAccessor(&PfcSwitch::m_pfcTxTrace), "ns3::PfcSwitch::PfcTracedCallback")
          .AddTraceSource("Drop", "A packet was dropped at ingress: (port, class, flow, seq)",
                          MakeTraceSourceAccessor(&PfcSwitch::m_dropTrace), "ns3::PfcSwitch::DropTracedCallback")
          .AddTraceSource("EcnMark", "A data packet was CE-marked at egress: (port, class, flow)",
                          MakeTraceSourceAccessor(&PfcSwitch::m_ecnTrace), "ns3::PfcSwitch::EcnTracedCallback");
  return tid;
}

void PfcSwitch::Setup(uint32_t nodeId, NodeKind kind, const FabricConfig* cfg, FabricStats* stats,
                      RouteTable* routes, const std::vector<Ptr<PhantoraNetDevice>>& ports,
                      const std::vector<uint64_t>& portDelayNs, bool intOn) {
  m_id = nodeId;
  m_kind = kind;
  m_cfg = cfg;
  m_stats = stats;
  m_routes = routes;
  m_dev = ports;
  m_int = intOn;
  const bool nv = kind == NodeKind::NvSwitch;
  m_ecn = cfg->ecn && !nv;
  m_ports.assign(ports.size(), Port{});

  uint64_t fastest = 0;
  for (const auto& d : ports) {
    fastest = std::max(fastest, d->GetRateBps());
  }
  SwitchMmu::Config mc;
  // 32 MiB at 100 Gb/s, scaled with the fastest port: 16 * bw / 50 MiB.
  mc.bufferBytes = cfg->bufferBytes ? cfg->bufferBytes
                                    : static_cast<uint64_t>((static_cast<unsigned __int128>(fastest) * 16 << 20) /
                                                            50'000'000'000ULL);
  mc.reserveBytes = cfg->reserveBytes;
  mc.resumeOffsetBytes = cfg->resumeOffsetBytes;
  mc.shift = cfg->dtShift;
  mc.pfc = cfg->pfc && !nv;
  mc.unlimited = nv;
  m_mmu.Configure(static_cast<uint32_t>(ports.size()), mc);

  for (uint32_t i = 0; i < ports.size(); ++i) {
    const uint64_t rate = ports[i]->GetRateBps();
    const uint64_t hdrm = cfg->headroomBytes
                              ? cfg->headroomBytes
                              : static_cast<uint64_t>(cfg->headroomFactor * static_cast<double>(rate) / 8e9 *
                                                      static_cast<double>(portDelayNs[i]));
    m_mmu.SetHeadroom(i, hdrm);
    // 100 Gb/s: kmin 400 KB, kmax 1600 KB, pmax 0.2 (KB = 1000 B), scaled linearly with the rate.
    m_ports[i].kmin = ByRate<uint64_t>(cfg->kminBytes, rate, rate / 1'000'000'000ULL * 4000);
    m_ports[i].kmax = ByRate<uint64_t>(cfg->kmaxBytes, rate, rate / 1'000'000'000ULL * 16000);
    m_ports[i].pmax = ByRate<double>(cfg->pmax, rate, 0.2);
  }
  m_rng = CreateObject<UniformRandomVariable>();
  m_rng->SetStream(static_cast<int64_t>(nodeId) + 1);
}

void PfcSwitch::Receive(uint32_t inPort, Ptr<Packet> pkt, const PhantoraHeader& hdr) {
  const uint32_t out = m_routes->Pick(m_id, hdr.dst, hdr.ecmpKey);
  const uint32_t cls = hdr.prio % kNumPrio;
  const uint32_t wire = WireBytes(*m_cfg, hdr, m_int);
  if (out == std::numeric_limits<uint32_t>::max()) {
    NS_LOG_WARN("node " << m_id << ": no route to " << hdr.dst << ", dropping");
    ++m_stats->drops;
    ++m_ports[inPort].drops;
    m_dropTrace(inPort, cls, hdr.flowId, hdr.seq);
    return;
  }
  if (cls != 0) {
    if (!m_mmu.Admit(inPort, cls, wire)) {
      NS_LOG_LOGIC("node " << m_id << " drops flow " << hdr.flowId << " seq " << hdr.seq);
      ++m_stats->drops;
      ++m_ports[inPort].drops;
      m_dropTrace(inPort, cls, hdr.flowId, hdr.seq);
      return;
    }
    m_mmu.Add(inPort, cls, wire);
    if (m_mmu.ShouldPause(inPort, cls)) {
      SendPfc(inPort, cls, true);
    }
  }
  Port& p = m_ports[out];
  p.q[cls].push_back(TxItem{pkt, wire, inPort, static_cast<uint8_t>(cls), hdr.type == PktType::Data});
  p.bytes[cls] += wire;
  p.total += wire;
  p.maxTotal = std::max(p.maxTotal, p.total);
  m_dev[out]->Kick();
}

bool PfcSwitch::Dequeue(uint32_t port, const bool* paused, TxItem& out) {
  Port& p = m_ports[port];
  int cls = -1;
  if (!p.q[0].empty()) {
    cls = 0;
  } else {
    for (uint32_t i = 0; i < kNumPrio - 1; ++i) {
      const uint32_t c = 1 + (p.rr - 1 + i) % (kNumPrio - 1);
      if (!p.q[c].empty() && !paused[c]) {
        cls = static_cast<int>(c);
        p.rr = c % (kNumPrio - 1) + 1;
        break;
      }
    }
  }
  if (cls < 0) {
    return false;
  }
  out = std::move(p.q[cls].front());
  p.q[cls].pop_front();
  p.bytes[cls] -= out.wireBytes;
  p.total -= out.wireBytes;
  if (cls != 0) {
    m_mmu.Remove(out.inPort, cls, out.wireBytes);
    if (m_mmu.ShouldResume(out.inPort, cls)) {
      SendPfc(out.inPort, cls, false);
    }
  }
  if (out.data) {
    const bool mark = m_ecn && EcnMark(p, p.bytes[cls]);
    if (mark || m_int) {
      PhantoraHeader hdr;
      out.pkt->RemoveHeader(hdr);
      if (mark && !(hdr.flags & kFlagCe)) {
        hdr.flags |= kFlagCe;
        ++p.ecnMarks;
        ++m_stats->ecnMarks;
        m_ecnTrace(port, cls, hdr.flowId);
      }
      if (m_int) {
        IntHop hop{static_cast<uint64_t>(Simulator::Now().GetNanoSeconds()), p.txBytes,
                   static_cast<uint32_t>(std::min<uint64_t>(p.total, std::numeric_limits<uint32_t>::max())),
                   m_dev[port]->GetRateBps()};
        hdr.PushHop(hop);
      }
      out.pkt->AddHeader(hdr);
    }
  }
  p.txBytes += out.wireBytes;
  return true;
}

bool PfcSwitch::EcnMark(const Port& p, uint64_t qlen) {
  if (qlen <= p.kmin) {
    return false;
  }
  if (qlen > p.kmax) {
    return true;
  }
  const double prob = p.pmax * static_cast<double>(qlen - p.kmin) / static_cast<double>(p.kmax - p.kmin);
  return m_rng->GetValue() < prob;
}

void PfcSwitch::SendPfc(uint32_t port, uint32_t cls, bool pause) {
  m_mmu.SetPaused(port, cls, pause);
  PhantoraHeader hdr;
  hdr.type = PktType::Pfc;
  hdr.prio = static_cast<uint8_t>(cls);
  hdr.flags = pause ? kFlagPause : 0;
  hdr.src = m_id;
  Ptr<Packet> pkt = Create<Packet>();
  pkt->AddHeader(hdr);
  Port& p = m_ports[port];
  p.q[0].push_back(TxItem{pkt, m_cfg->pfcBytes, port, 0, false});
  p.bytes[0] += m_cfg->pfcBytes;
  p.total += m_cfg->pfcBytes;
  if (pause) {
    ++m_stats->pfcPause;
  } else {
    ++m_stats->pfcResume;
  }
  m_pfcTxTrace(port, cls, pause);
  m_dev[port]->Kick();
}

void PfcSwitch::DoDispose() {
  m_dev.clear();
  m_ports.clear();
  m_rng = nullptr;
  Object::DoDispose();
}

}  // namespace ns3
