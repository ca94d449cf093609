// PfcSwitch: forwarding, MMU admission, PFC generation, ECN and INT at dequeue.
#include "pfc-switch.h"
#include "phantora-event.h"
#include "phantora-type-id.h"

#include "ns3/boolean.h"
#include "ns3/double.h"
#include "ns3/log.h"
#include "ns3/simulator.h"
#include "ns3/string.h"
#include "ns3/trace-source-accessor.h"
#include "ns3/uinteger.h"

#include <algorithm>
#include <limits>
#include <sstream>
#include <stdexcept>

namespace ns3 {

NS_LOG_COMPONENT_DEFINE("PhantoraPfcSwitch");
NS_OBJECT_ENSURE_REGISTERED(PfcSwitch);

namespace {

template <typename T>
T ByRate(const std::map<uint64_t, T>& table, uint64_t rateBps, T scaled) {
  auto it = table.find(rateBps);
  return it == table.end() ? scaled : it->second;
}

/// Attribute `name`'s text "rate value rate value ..." (rates in bit/s) as a map; throws on bad text.
template <typename T>
std::map<uint64_t, T> ParseRateMap(const std::string& name, const std::string& text) {
  std::istringstream in(text);
  std::map<uint64_t, T> out;
  std::string rate;
  std::string value;
  while (in >> rate) {
    if (!(in >> value)) {
      throw std::invalid_argument("switch attribute " + name + ": expected 'rate value' pairs, got '" + text + "'");
    }
    std::size_t a = 0;
    std::size_t b = 0;
    try {
      const uint64_t r = rate[0] == '-' ? throw std::invalid_argument("") : std::stoull(rate, &a);
      const double v = std::stod(value, &b);
      if (a != rate.size() || b != value.size() || r == 0 || v < 0) {
        throw std::invalid_argument("");
      }
      out[r] = static_cast<T>(v);
    } catch (const std::exception&) {
      throw std::invalid_argument("switch attribute " + name + ": bad pair '" + rate + " " + value + "'");
    }
  }
  return out;
}

}  // namespace

TypeId PfcSwitch::GetTypeId() {
  static TypeId tid = PhantoraTypeId<PfcSwitch, Object>("ns3::PfcSwitch")
          .AddAttribute("NvSwitch", "An NVSwitch: unlimited buffer, never pauses, drops or marks",
                        BooleanValue(false), MakeBooleanAccessor(&PfcSwitch::m_nvSwitch), MakeBooleanChecker())
          .AddAttribute("HeaderSize", "Header bytes on the wire per data packet and per ACK/NACK", UintegerValue(48),
                        MakeUintegerAccessor(&PfcSwitch::GetHeaderSize, &PfcSwitch::SetHeaderSize),
                        MakeUintegerChecker<uint32_t>())
          .AddAttribute("IntHeaderSize", "INT bytes reserved per data packet and ACK when INT is on",
                        UintegerValue(42),
                        MakeUintegerAccessor(&PfcSwitch::GetIntHeaderSize, &PfcSwitch::SetIntHeaderSize),
                        MakeUintegerChecker<uint32_t>())
          .AddAttribute("PfcFrameSize", "Bytes of a PFC frame", UintegerValue(64),
                        MakeUintegerAccessor(&PfcSwitch::GetPfcFrameSize, &PfcSwitch::SetPfcFrameSize),
                        MakeUintegerChecker<uint32_t>(1))
          .AddAttribute("IntEnabled", "Stamp INT records on data packets at dequeue (set by the fabric)",
                        BooleanValue(false), MakeBooleanAccessor(&PfcSwitch::GetIntEnabled, &PfcSwitch::SetIntEnabled),
                        MakeBooleanChecker())
          .AddAttribute("PfcEnabled", "Pause upstream at the dynamic threshold (off: drop past it)", BooleanValue(true),
                        MakeBooleanAccessor(&PfcSwitch::m_pfc), MakeBooleanChecker())
          .AddAttribute("BufferSize", "Shared buffer bytes; 0 = 16 x (fastest port in Gb/s) / 50 MiB",
                        UintegerValue(0), MakeUintegerAccessor(&PfcSwitch::m_bufferBytes),
                        MakeUintegerChecker<uint64_t>())
          .AddAttribute("ReserveSize", "Bytes reserved per ingress (port, class)", UintegerValue(4096),
                        MakeUintegerAccessor(&PfcSwitch::m_reserveBytes), MakeUintegerChecker<uint64_t>())
          .AddAttribute("ResumeOffset", "XON when shared use + this is back under the threshold", UintegerValue(3072),
                        MakeUintegerAccessor(&PfcSwitch::m_resumeOffsetBytes), MakeUintegerChecker<uint64_t>())
          .AddAttribute("DtShift", "Dynamic threshold = free buffer >> DtShift", UintegerValue(3),
                        MakeUintegerAccessor(&PfcSwitch::m_dtShift), MakeUintegerChecker<uint32_t>(0, 30))
          .AddAttribute("HeadroomFactor", "PFC headroom per port = factor x rate x link delay", DoubleValue(3.0),
                        MakeDoubleAccessor(&PfcSwitch::m_headroomFactor), MakeDoubleChecker<double>(0.0))
          .AddAttribute("HeadroomSize", "Fixed PFC headroom bytes per port; 0 = by HeadroomFactor", UintegerValue(0),
                        MakeUintegerAccessor(&PfcSwitch::m_headroomBytes), MakeUintegerChecker<uint64_t>())
          .AddAttribute("EcnEnabled", "RED-ECN marking at dequeue", BooleanValue(true),
                        MakeBooleanAccessor(&PfcSwitch::m_ecnEnabled), MakeBooleanChecker())
          .AddAttribute("KminMap",
                        "ECN kmin bytes by port rate: 'rate_bps bytes ...'; other rates: 4000 B per Gb/s",
                        StringValue(""), MakeStringAccessor(&PfcSwitch::m_kminMap), MakeStringChecker())
          .AddAttribute("KmaxMap",
                        "ECN kmax bytes by port rate: 'rate_bps bytes ...'; other rates: 16000 B per Gb/s",
                        StringValue(""), MakeStringAccessor(&PfcSwitch::m_kmaxMap), MakeStringChecker())
          .AddAttribute("PmaxMap", "ECN marking probability at kmax by port rate: 'rate_bps p ...'; other rates: 0.2",
                        StringValue(""), MakeStringAccessor(&PfcSwitch::m_pmaxMap), MakeStringChecker())
          .AddAttribute("ClassScheduling", "How data classes 1..7 share a port: rr, strict (class 1 first) or wrr",
                        StringValue("rr"), MakeStringAccessor(&PfcSwitch::m_classSchedText), MakeStringChecker())
          .AddAttribute("ClassWeights", "wrr weights of classes 1..7: 'w1 ... w7' (integers >= 1); '' = all 1",
                        StringValue(""), MakeStringAccessor(&PfcSwitch::m_classWeightsText), MakeStringChecker())
          .AddAttribute("TrimThreshold",
                        "Trim a loss-tolerant data packet to its header when its egress class queue holds more "
                        "than this many bytes (DLCP); 0 = never",
                        UintegerValue(0), MakeUintegerAccessor(&PfcSwitch::m_trimBytes),
                        MakeUintegerChecker<uint64_t>())
          .AddAttribute("ThresholdsFollowRate",
                        "A port whose rate changes (a link_degrade scenario) scales its trim threshold and ECN "
                        "kmin / kmax by its new rate over its installed one, as htsim's -failed sizes a slowed "
                        "link's queue; off: they stay as installed (a switch's byte thresholds are configuration)",
                        BooleanValue(false), MakeBooleanAccessor(&PfcSwitch::m_followRate), MakeBooleanChecker())
          .AddAttribute("TrimHeaderPriority",
                        "Ultra Ethernet trimming: a trimmable packet the buffer cannot take is trimmed instead of "
                        "dropped, and trimmed headers go in the strict-priority class 0 (off: DLCP, trimmed "
                        "packets keep their class)",
                        BooleanValue(false), MakeBooleanAccessor(&PfcSwitch::m_trimHeaderPrio), MakeBooleanChecker())
          .AddAttribute("LoadBalancing",
                        "Egress choice for data packets among equal-cost ports: ecmp, spray, spray_rr, flowlet, "
                        "adaptive, reps or oblivious (the last two hash the entropy the NIC chose; ACKs, NACKs and "
                        "PFC frames always take ECMP)",
                        StringValue("ecmp"), MakeStringAccessor(&PfcSwitch::m_lbMode), MakeStringChecker())
          .AddAttribute("FlowletGap", "LoadBalancing flowlet: a gap longer than this starts a new flowlet",
                        TimeValue(MicroSeconds(10)), MakeTimeAccessor(&PfcSwitch::m_flowletGap),
                        MakeTimeChecker(NanoSeconds(1)))
          .AddAttribute("CreditFlowControl",
                        "Credit-based flow control (hop by hop, lossless): each port's upstream sender sends a data "
                        "class only against link credit for this switch's buffer, given back as packets leave it "
                        "(PFC is off under it)",
                        BooleanValue(false), MakeBooleanAccessor(&PfcSwitch::m_cbfc), MakeBooleanChecker())
          .AddAttribute("CreditSize",
                        "CreditFlowControl: link credit bytes per ingress (port, data class); 0 = the credit loop's "
                        "bandwidth-delay product, rate x 2 x link delay + 2 largest packets + a credit frame + "
                        "CreditUpdate",
                        UintegerValue(0), MakeUintegerAccessor(&PfcSwitch::m_creditBytes),
                        MakeUintegerChecker<uint64_t>())
          .AddAttribute("CreditUpdate",
                        "CreditFlowControl: a credit frame goes upstream each time this many bytes of a class have "
                        "been freed since the last one; 0 = one largest packet",
                        UintegerValue(0), MakeUintegerAccessor(&PfcSwitch::m_creditUpdateBytes),
                        MakeUintegerChecker<uint64_t>())
          .AddAttribute("PayloadSize", "Largest data payload bytes (the NICs' PayloadSize; sizes link credit)",
                        UintegerValue(1000), MakeUintegerAccessor(&PfcSwitch::m_payloadBytes),
                        MakeUintegerChecker<uint32_t>(1))
          .AddTraceSource("PfcTx", "A PFC frame was sent upstream: (port, class, pause)",
                          MakeTraceSourceAccessor(&PfcSwitch::m_pfcTxTrace), "ns3::PfcSwitch::PfcTracedCallback")
          .AddTraceSource("Drop", "A packet was dropped at ingress: (port, class, flow, seq)",
                          MakeTraceSourceAccessor(&PfcSwitch::m_dropTrace), "ns3::PfcSwitch::DropTracedCallback")
          .AddTraceSource("EcnMark", "A data packet was CE-marked at egress: (port, class, flow)",
                          MakeTraceSourceAccessor(&PfcSwitch::m_ecnTrace), "ns3::PfcSwitch::EcnTracedCallback")
          .AddTraceSource("Trim", "A loss-tolerant data packet was trimmed to its header: (egress port, class, flow, "
                          "seq, payload bytes lost)",
                          MakeTraceSourceAccessor(&PfcSwitch::m_trimTrace), "ns3::PfcSwitch::TrimTracedCallback")
          .AddTraceSource("LbPick",
                          "A data packet's egress was chosen by a LoadBalancing mode other than ecmp: "
                          "(flow, seq, its send time, egress port, flowlet number; 0 outside flowlet mode)",
                          MakeTraceSourceAccessor(&PfcSwitch::m_lbTrace), "ns3::PfcSwitch::LbTracedCallback");
  return tid;
}

namespace {
/// `bytes` x `rate` / `rate0`, rounded down (htsim's mem_b of queuesize x failed_link_ratio).
uint64_t ScaledBytes(uint64_t bytes, uint64_t rate, uint64_t rate0) {
  return static_cast<uint64_t>(static_cast<unsigned __int128>(bytes) * rate / rate0);
}
}  // namespace

PfcSwitch::PortSettings PfcSwitch::ResolvedPort(uint32_t port) const {
  const Port& p = m_ports.at(port);
  const uint64_t rate = m_dev.at(port)->GetRateBps();
  if (m_followRate && rate != p.rateBps && p.rate0 != 0) {  // not yet rescaled: no packet since the change
    return {rate, ScaledBytes(p.kmin0, rate, p.rate0), ScaledBytes(p.kmax0, rate, p.rate0), p.pmax,
            m_mmu.Headroom(port)};
  }
  return {rate, p.kmin, p.kmax, p.pmax, m_mmu.Headroom(port)};
}

void PfcSwitch::Install(Ptr<Node> node, uint32_t nodeId, Ptr<RouteTable> routes) {
  const LbMode lb = m_nvSwitch ? LbMode::Ecmp : ParseLbMode(m_lbMode);
  const auto kmin = ParseRateMap<uint64_t>("KminMap", m_kminMap);
  const auto kmax = ParseRateMap<uint64_t>("KmaxMap", m_kmaxMap);
  const auto pmax = ParseRateMap<double>("PmaxMap", m_pmaxMap);
  for (const auto& [rate, lo] : kmin) {
    auto it = kmax.find(rate);
    if (it != kmax.end() && it->second < lo) {
      throw std::invalid_argument("kmin > kmax at rate " + std::to_string(rate));
    }
  }
  for (const auto& [rate, p] : pmax) {
    if (p > 1) {
      throw std::invalid_argument("pmax must be in [0, 1] at rate " + std::to_string(rate));
    }
  }
  m_classSched = ParseClassSched(m_classSchedText);
  m_classWeights = ParseClassWeights(m_classWeightsText);
  m_id = nodeId;
  m_routes = routes;
  m_dev = TakePorts(node, this);
  const bool nv = m_nvSwitch;
  m_ecn = m_ecnEnabled && !nv;
  m_ports.assign(m_dev.size(), Port{});

  uint64_t fastest = 0;
  for (const auto& d : m_dev) {
    fastest = std::max(fastest, d->GetRateBps());
  }
  SwitchMmu::Config mc;
  // 32 MiB at 100 Gb/s, scaled with the fastest port: 16 * bw / 50 MiB.
  mc.bufferBytes = m_bufferBytes ? m_bufferBytes
                                 : static_cast<uint64_t>((static_cast<unsigned __int128>(fastest) * 16 << 20) /
                                                         50'000'000'000ULL);
  mc.reserveBytes = m_reserveBytes;
  mc.resumeOffsetBytes = m_resumeOffsetBytes;
  mc.shift = m_dtShift;
  const bool cbfc = m_cbfc && !nv;
  mc.pfc = m_pfc && !nv && !cbfc;
  mc.unlimited = nv;
  m_mmu.Configure(static_cast<uint32_t>(m_dev.size()), mc);

  for (uint32_t i = 0; i < m_dev.size(); ++i) {
    const uint64_t rate = m_dev[i]->GetRateBps();
    const uint64_t hdrm = m_headroomBytes
                              ? m_headroomBytes
                              : static_cast<uint64_t>(m_headroomFactor * static_cast<double>(rate) / 8e9 *
                                                      static_cast<double>(m_dev[i]->GetDelayNs()));
    m_mmu.SetHeadroom(i, hdrm);
    // 100 Gb/s: kmin 400 KB, kmax 1600 KB, pmax 0.2 (KB = 1000 B), scaled linearly with the rate.
    m_ports[i].kmin = ByRate<uint64_t>(kmin, rate, rate / 1'000'000'000ULL * 4000);
    m_ports[i].kmax = ByRate<uint64_t>(kmax, rate, rate / 1'000'000'000ULL * 16000);
    m_ports[i].pmax = ByRate<double>(pmax, rate, 0.2);
    m_ports[i].trim = m_trimBytes;
    m_ports[i].rateBps = m_ports[i].rate0 = rate;
    m_ports[i].kmin0 = m_ports[i].kmin;
    m_ports[i].kmax0 = m_ports[i].kmax;
    m_ports[i].trim0 = m_trimBytes;
  }
  m_creditSize.assign(m_dev.size(), 0);
  if (cbfc) {
    const uint64_t maxPacket = m_payloadBytes + m_wire.headerBytes + (m_wire.intOn ? m_wire.intHeaderBytes : 0);
    const uint64_t update = m_creditUpdateBytes ? m_creditUpdateBytes : maxPacket;
    uint64_t total = 0;
    for (uint32_t i = 0; i < m_dev.size(); ++i) {
      const uint64_t rate = m_dev[i]->GetRateBps();
      const uint64_t loop = static_cast<uint64_t>(static_cast<unsigned __int128>(rate) * 2 * m_dev[i]->GetDelayNs() /
                                                  8'000'000'000ULL);
      const uint64_t credit = m_creditBytes ? m_creditBytes : loop + 2 * maxPacket + m_wire.pfcBytes + update;
      if (credit < maxPacket + update) {
        throw std::invalid_argument("switch " + std::to_string(nodeId) + ": CreditSize " + std::to_string(credit) +
                                    " B is below one packet (" + std::to_string(maxPacket) +
                                    " B) + CreditUpdate (" + std::to_string(update) + " B): the link would stall");
      }
      m_creditSize[i] = credit;
      total += credit;
      m_dev[i]->EnableCreditReturn(credit, update, m_wire.pfcBytes);
      m_dev[i]->GetPeer()->EnableCreditSend(credit, static_cast<uint32_t>(maxPacket));
    }
    if (total > mc.bufferBytes) {
      NS_LOG_WARN("switch " << nodeId << ": link credit of one class on every port (" << total
                            << " B) exceeds the buffer (" << mc.bufferBytes << " B)");
    }
  }
  m_rng = CreateObject<UniformRandomVariable>();
  m_rng->SetStream(static_cast<int64_t>(nodeId) + 1);
  // Spraying draws from its own stream per switch, apart from ECN's, so ECN marks do not shift with it.
  m_lb.Configure(lb, nodeId, routes, static_cast<uint64_t>(m_flowletGap.GetNanoSeconds()),
                 (int64_t{1} << 32) + nodeId, MakeCallback(&PfcSwitch::PortBytes, this));
  node->AggregateObject(this);
}

void PfcSwitch::Receive(uint32_t inPort, const Ptr<PhantoraPacket>& pkt) {
  PhantoraHeader& hdr = pkt->hdr;
  uint32_t out;
  if (m_lb.Mode() == LbMode::Ecmp || hdr.type != PktType::Data) {
    out = m_routes->Pick(m_id, hdr.src, hdr.dst, hdr.ecmpKey, hdr.viaNic);
  } else {
    out = m_lb.Pick(hdr, FabricNowNs());
    m_lbTrace(hdr.flowId, hdr.seq, hdr.tsNs, out, m_lb.LastFlowlet());
  }
  uint32_t cls = hdr.prio % kNumPrio;
  uint32_t wire = m_wire.Bytes(hdr);
  // Link credit the upstream port spent on this packet: the buffer is reserved for it (no admission check) and
  // it goes back as the packet leaves.
  const uint32_t credit = pkt->linkCredit;  // (on the packet's first cache line; linkClass is not: read if set)
  const uint8_t creditCls = credit ? pkt->linkClass : 0;
  pkt->linkCredit = 0;
  const bool trimmable = m_trimBytes && !m_nvSwitch && (hdr.flags & kFlagLossTolerant) && !(hdr.flags & kFlagTrimmed) &&
                         hdr.type == PktType::Data && out < m_ports.size();
  if (m_followRate && out < m_ports.size()) {
    FollowRate(out);
  }
  if (trimmable && m_ports[out].bytes[cls] + wire > m_ports[out].trim) {
    wire = Trim(out, cls, hdr);
  }
  if (out == std::numeric_limits<uint32_t>::max()) {
    NS_LOG_WARN("node " << m_id << ": no route to " << hdr.dst << ", dropping");
    if (credit) {
      m_dev[inPort]->ReturnCredit(creditCls, credit);
    }
    ++m_counters.drops;
    ++m_ports[inPort].drops;
    m_dropTrace(inPort, cls, hdr.flowId, hdr.seq);
    return;
  }
  bool admitted = false;  // the buffer checked and found room for `wire` (Admit is const: no need to ask twice)
  if (m_trimHeaderPrio && cls != 0 && !(hdr.flags & kFlagTrimmed) && trimmable && !credit) {
    admitted = m_mmu.Admit(inPort, cls, wire);
    if (!admitted) {
      wire = Trim(out, cls, hdr);  // no room for the payload: forward the header (UET trims rather than drops)
    }
  }
  if (m_trimHeaderPrio && (hdr.flags & kFlagTrimmed)) {
    cls = 0;  // trimmed headers jump the data queues (NDP / UET), outside the shared buffer's accounting
  }
  if (cls != 0) {
    if (!credit && !admitted && !m_mmu.Admit(inPort, cls, wire)) {
      NS_LOG_LOGIC("node " << m_id << " drops flow " << hdr.flowId << " seq " << hdr.seq);
      ++m_counters.drops;
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
  const bool data = hdr.type == PktType::Data;
  if (data && (hdr.flags & kFlagLastByte) && m_lastByteHook) [[unlikely]] {
    LastByteQueued(out, cls, wire, hdr);
  }
  p.q[cls].push_back(TxItem{pkt, wire, inPort, static_cast<uint8_t>(cls), data, credit, creditCls});
  p.nonEmpty |= 1U << cls;
  p.bytes[cls] += wire;
  p.total += wire;
  p.maxTotal = std::max(p.maxTotal, p.total);
  m_dev[out]->Kick();
}

void PfcSwitch::LastByteQueued(uint32_t port, uint32_t cls, uint32_t wire, const PhantoraHeader& hdr) {
  const Port& p = m_ports[port];
  const PhantoraNetDevice& dev = *m_dev[port];
  // Its own bytes and those ahead leave back to back at the line rate at best, from 999 ps before now on (a
  // packet may start that far back, PhantoraNetDevice::Send), or from the end of the packet the port is sending
  // now (no byte queued starts before it); the arrival is a whole ns at or after the end, plus the cable's delay.
  // 2 ns spare for the rounding.
  const uint64_t ahead = p.bytes[cls] + (cls != 0 ? p.bytes[0] : 0) + wire;
  const auto txNs = static_cast<int64_t>(static_cast<unsigned __int128>(ahead) * 8'000'000'000ULL / dev.GetRateBps());
  const uint64_t from = std::max<uint64_t>(FabricNowNs(), dev.TxEndPs() / 1000);
  const int64_t arrive = static_cast<int64_t>(from) - 2 + txNs + static_cast<int64_t>(dev.GetDelayNs());
  m_lastByteHook(hdr.flowId, hdr.src, hdr.dst, dev.GetPeer()->GetNodeId(), arrive);
}

uint32_t PfcSwitch::Trim(uint32_t port, uint32_t cls, PhantoraHeader& hdr) {
  hdr.flags |= kFlagTrimmed;  // the payload is gone (PhantoraPacket::ToPacket() leaves it out)
  ++m_counters.trims;
  m_counters.trimmedBytes += hdr.payload;
  NS_LOG_LOGIC("node " << m_id << " trims flow " << hdr.flowId << " seq " << hdr.seq);
  m_trimTrace(port, cls, hdr.flowId, hdr.seq, hdr.payload);
  return m_wire.Bytes(hdr);
}

bool PfcSwitch::Dequeue(uint32_t port, const bool* paused, TxItem& out) {
  if (m_followRate) {  // a queue that drains after a rate change, with nothing arriving, marks by the new rate
    FollowRate(port);
  }
  Port& p = m_ports[port];
  int cls = -1;
  if (p.nonEmpty & 1U) {
    cls = 0;
  } else {
    cls = PickClass(m_classSched, m_classWeights, m_wire.headerBytes + 1000, p.q, p.nonEmpty, paused, p.sched);
  }
  if (cls < 0) {
    return false;
  }
  RingQueue<TxItem>& q = p.q[cls];
  out = std::move(q.front());
  q.pop_front();
  if (q.empty()) {
    p.nonEmpty &= ~(1U << cls);
  }
  p.bytes[cls] -= out.wireBytes;
  p.total -= out.wireBytes;
  if (out.creditBytes) {
    m_dev[out.inPort]->ReturnCredit(out.creditClass, out.creditBytes);
  }
  if (cls != 0) {
    m_mmu.Remove(out.inPort, cls, out.wireBytes);
    if (m_mmu.ShouldResume(out.inPort, cls)) {
      SendPfc(out.inPort, cls, false);
    }
  }
  if (out.data) {
    const bool mark = m_ecn && EcnMark(p, p.bytes[cls]);
    if (mark || m_wire.intOn) {
      PhantoraHeader& hdr = out.pkt->hdr;
      if (mark && !(hdr.flags & kFlagCe)) {
        hdr.flags |= kFlagCe;
        ++p.ecnMarks;
        ++m_counters.ecnMarks;
        m_ecnTrace(port, cls, hdr.flowId);
      }
      if (m_wire.intOn) {
        IntHop hop{FabricNowNs(), p.txBytes,
                   static_cast<uint32_t>(std::min<uint64_t>(p.total, std::numeric_limits<uint32_t>::max())),
                   m_dev[port]->GetRateBps()};
        hdr.PushHop(hop);
      }
    }
  }
  p.txBytes += out.wireBytes;
  return true;
}

void PfcSwitch::FollowRate(uint32_t port) {
  Port& p = m_ports[port];
  const uint64_t rate = m_dev[port]->GetRateBps();
  if (rate == p.rateBps || p.rate0 == 0) {
    return;
  }
  const auto scale = [&](uint64_t bytes) { return ScaledBytes(bytes, rate, p.rate0); };
  p.rateBps = rate;
  p.kmin = scale(p.kmin0);
  p.kmax = scale(p.kmax0);
  p.trim = p.trim0 ? std::max<uint64_t>(scale(p.trim0), 1) : 0;
  NS_LOG_LOGIC("node " << m_id << " port " << port << " at " << rate << " bps: kmin " << p.kmin << " kmax " << p.kmax
                       << " trim " << p.trim);
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
  Ptr<PhantoraPacket> pkt = PhantoraPacket::Make();
  PhantoraHeader& hdr = pkt->hdr;
  hdr.type = PktType::Pfc;
  hdr.prio = static_cast<uint8_t>(cls);
  hdr.flags = pause ? kFlagPause : 0;
  hdr.src = m_id;
  Port& p = m_ports[port];
  p.q[0].push_back(TxItem{pkt, m_wire.pfcBytes, port, 0, false});
  p.nonEmpty |= 1U;
  p.bytes[0] += m_wire.pfcBytes;
  p.total += m_wire.pfcBytes;
  if (pause) {
    ++m_counters.pfcPause;
  } else {
    ++m_counters.pfcResume;
  }
  m_pfcTxTrace(port, cls, pause);
  m_dev[port]->Kick();
}

uint64_t PfcSwitch::GetHeaderSize() const { return m_wire.headerBytes; }
void PfcSwitch::SetHeaderSize(uint64_t bytes) { m_wire.headerBytes = static_cast<uint32_t>(bytes); }
uint64_t PfcSwitch::GetIntHeaderSize() const { return m_wire.intHeaderBytes; }
void PfcSwitch::SetIntHeaderSize(uint64_t bytes) { m_wire.intHeaderBytes = static_cast<uint32_t>(bytes); }
uint64_t PfcSwitch::GetPfcFrameSize() const { return m_wire.pfcBytes; }
void PfcSwitch::SetPfcFrameSize(uint64_t bytes) { m_wire.pfcBytes = static_cast<uint32_t>(bytes); }
bool PfcSwitch::GetIntEnabled() const { return m_wire.intOn; }
void PfcSwitch::SetIntEnabled(bool on) { m_wire.intOn = on; }

void PfcSwitch::DoDispose() {
  m_routes = nullptr;
  m_dev.clear();
  m_ports.clear();
  m_rng = nullptr;
  m_lb.Dispose();
  Object::DoDispose();
}

}  // namespace ns3
