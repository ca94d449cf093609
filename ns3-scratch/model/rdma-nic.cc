// RdmaNic: queue pairs, pacing, ACK/NACK generation and go-back-N recovery.
#include "rdma-nic.h"
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
#include <stdexcept>

namespace ns3 {

NS_LOG_COMPONENT_DEFINE("PhantoraRdmaNic");
NS_OBJECT_ENSURE_REGISTERED(RdmaNic);

namespace {

uint64_t NowNs() { return FabricNowNs(); }

}  // namespace

TypeId RdmaNic::GetTypeId() {
  static TypeId tid = PhantoraTypeId<RdmaNic, Object>("ns3::RdmaNic")
                          .AddAttribute("PayloadSize", "Payload bytes per data packet",
                                        UintegerValue(1000), MakeUintegerAccessor(&RdmaNic::m_payloadBytes),
                                        MakeUintegerChecker<uint32_t>(1))
                          .AddAttribute("HeaderSize", "Header bytes on the wire per data packet and per ACK/NACK",
                                        UintegerValue(48), MakeUintegerAccessor(&RdmaNic::GetHeaderSize,
                                                                                &RdmaNic::SetHeaderSize),
                                        MakeUintegerChecker<uint32_t>())
                          .AddAttribute("IntHeaderSize", "INT bytes reserved per data packet and ACK when INT is on",
                                        UintegerValue(42), MakeUintegerAccessor(&RdmaNic::GetIntHeaderSize,
                                                                                &RdmaNic::SetIntHeaderSize),
                                        MakeUintegerChecker<uint32_t>())
                          .AddAttribute("IntEnabled", "Data packets carry INT records (set by the fabric)",
                                        BooleanValue(false),
                                        MakeBooleanAccessor(&RdmaNic::GetIntEnabled, &RdmaNic::SetIntEnabled),
                                        MakeBooleanChecker())
                          .AddAttribute("AckInterval",
                                        "An ACK per this many in-order data packets (and always on the last "
                                        "one and on a CE mark)",
                                        UintegerValue(1), MakeUintegerAccessor(&RdmaNic::m_ackInterval),
                                        MakeUintegerChecker<uint32_t>(1))
                          .AddAttribute("AckDelay",
                                        "With AckInterval > 1: the longest a received packet waits for its "
                                        "coalesced ACK (as a NIC's coalescing timer; a window-limited sender "
                                        "would otherwise wait for packets it may not send)",
                                        TimeValue(MicroSeconds(1)), MakeTimeAccessor(&RdmaNic::m_ackDelay),
                                        MakeTimeChecker(NanoSeconds(1)))
                          .AddAttribute("AckHighPriority", "ACKs and NACKs go in the strict-priority class 0",
                                        BooleanValue(true), MakeBooleanAccessor(&RdmaNic::m_ackHighPrio),
                                        MakeBooleanChecker())
                          .AddAttribute("ClassScheduling",
                                        "How queue pairs of different classes share the port: rr (round robin "
                                        "over queue pairs, any class) or strict (the lowest class first); wrr "
                                        "serves queue pairs as rr (the switches weigh the classes)",
                                        StringValue("rr"), MakeStringAccessor(&RdmaNic::m_classSchedText),
                                        MakeStringChecker())
                          .AddAttribute("NackInterval", "Minimum gap between two NACKs for the same hole",
                                        TimeValue(MicroSeconds(500)), MakeTimeAccessor(&RdmaNic::m_nackInterval),
                                        MakeTimeChecker(Time(0)))
                          .AddAttribute("RetransmitTimeout",
                                        "Go-back-N timeout without progress; 0 = none (a lossless fabric)",
                                        TimeValue(Time(0)), MakeTimeAccessor(&RdmaNic::m_rto),
                                        MakeTimeChecker(Time(0)))
                          .AddAttribute("Receiver",
                                        "gbn: in-order receiver, NACK and go-back-N; sack: out-of-order receiver, "
                                        "SACK blocks, selective retransmission; rud: Ultra Ethernet reliable "
                                        "unordered delivery (SACK bitmaps, NACKs of trimmed packets); rod: "
                                        "UET reliable ordered delivery (one path per queue pair, in order, "
                                        "NACKs of trimmed packets, go-back-N)",
                                        StringValue("gbn"), MakeStringAccessor(&RdmaNic::m_rxModeName),
                                        MakeStringChecker())
                          .AddAttribute("ReorderWindow",
                                        "Receiver sack: a packet is lost once one sent this much later is "
                                        "acknowledged; 0 = the flow's base RTT (as given to its CC)",
                                        TimeValue(Time(0)), MakeTimeAccessor(&RdmaNic::m_reorderWindow),
                                        MakeTimeChecker(Time(0)))
                          .AddAttribute("LoadBalancing",
                                        "The fabric's load balancing (as the switches'): reps or oblivious make "
                                        "this NIC choose an entropy value per data packet; other modes none",
                                        StringValue("ecmp"), MakeStringAccessor(&RdmaNic::m_lbModeName),
                                        MakeStringChecker())
                          .AddAttribute("Entropies",
                                        "LoadBalancing reps / oblivious: entropy values per queue pair (a power "
                                        "of two for oblivious; htsim's paths)",
                                        UintegerValue(256), MakeUintegerAccessor(&RdmaNic::m_entropies),
                                        MakeUintegerChecker<uint32_t>(1, 65536))
                          .AddAttribute("RepsBufferSize", "LoadBalancing reps: recycled entropies kept per queue pair",
                                        UintegerValue(8), MakeUintegerAccessor(&RdmaNic::m_repsBuffer),
                                        MakeUintegerChecker<uint32_t>(1))
                          .AddAttribute("RepsFreezeTime",
                                        "LoadBalancing reps: after a retransmission timeout a connection "
                                        "freezes this long, recycling only its last RepsBufferSize good "
                                        "entropies (htsim's freezing mode, 10 ms); 0 = never freezes",
                                        TimeValue(MilliSeconds(10)), MakeTimeAccessor(&RdmaNic::m_repsFreeze),
                                        MakeTimeChecker(Time(0)))
                          .AddAttribute("RepsThawExplore",
                                        "LoadBalancing reps: random entropies explored after a freeze ends",
                                        UintegerValue(16), MakeUintegerAccessor(&RdmaNic::m_repsThawExplore),
                                        MakeUintegerChecker<uint32_t>())
                          .AddAttribute("CreditRate",
                                        "Receiver credits (RCCC): a port grants credit at this fraction of its "
                                        "line rate (wire bytes of the packets granted)",
                                        DoubleValue(0.99), MakeDoubleAccessor(&RdmaNic::m_creditRate),
                                        MakeDoubleChecker<double>(0.01, 1.0))
                          .AddAttribute("CreditQuantum", "Receiver credits: the most a grant gives, in packets",
                                        UintegerValue(4), MakeUintegerAccessor(&RdmaNic::m_creditQuantum),
                                        MakeUintegerChecker<uint32_t>(1))
                          .AddAttribute("Sleek",
                                        "Receiver rud: SLEEK loss recovery (resend without a NACK once enough "
                                        "later packets are acknowledged)",
                                        BooleanValue(false), MakeBooleanAccessor(&RdmaNic::m_sleek),
                                        MakeBooleanChecker())
                          .AddAttribute("SleekFactor", "Sleek: threshold in windows (of the CC, else 1.5 BDP)",
                                        DoubleValue(1.5), MakeDoubleAccessor(&RdmaNic::m_sleekFactor),
                                        MakeDoubleChecker<double>(0.0))
                          .AddAttribute("SleekMinPackets", "Sleek: the threshold's floor, in packets",
                                        UintegerValue(5), MakeUintegerAccessor(&RdmaNic::m_sleekMinPackets),
                                        MakeUintegerChecker<uint32_t>(1))
                          .AddAttribute("PortFailover",
                                        "At a re-convergence (a scenario's failure or repair) move each open "
                                        "queue pair to the port routing picks for it now: a failover to a live "
                                        "port of this endpoint; false: a queue pair keeps the port it opened on",
                                        BooleanValue(true), MakeBooleanAccessor(&RdmaNic::m_portFailover),
                                        MakeBooleanChecker())
                          .AddTraceSource("Nack", "This receiver sent a NACK: (flow, expected seq)",
                                          MakeTraceSourceAccessor(&RdmaNic::m_nackTrace),
                                          "ns3::RdmaNic::FlowSeqTracedCallback")
                          .AddTraceSource("Timeout", "A go-back-N timeout at this sender: (flow, seq)",
                                          MakeTraceSourceAccessor(&RdmaNic::m_timeoutTrace),
                                          "ns3::RdmaNic::FlowSeqTracedCallback")
                          .AddTraceSource("CnpRx",
                                          "A CNP (an ACK or NACK echoing a CE mark, for a CC that uses CNPs) reached this sender: "
                                          "(flow, node that sent it, acknowledged seq)",
                                          MakeTraceSourceAccessor(&RdmaNic::m_cnpTrace),
                                          "ns3::RdmaNic::CnpTracedCallback")
                          .AddTraceSource("Failover",
                                          "A re-convergence moved a queue pair: (flow, port it left, port it "
                                          "took); UINT32_MAX as the port taken: no route, it stalls; as the port "
                                          "left: it was stalled and resumes",
                                          MakeTraceSourceAccessor(&RdmaNic::m_failoverTrace),
                                          "ns3::RdmaNic::FailoverTracedCallback")
                          .AddTraceSource("Retransmit",
                                          "This sender sent a data packet again: (flow, payload bytes, whether "
                                          "every byte of the flow had been sent once before)",
                                          MakeTraceSourceAccessor(&RdmaNic::m_retxTrace),
                                          "ns3::RdmaNic::RetransmitTracedCallback");
  return tid;
}

void RdmaNic::Install(Ptr<Node> node, uint32_t nodeId, Ptr<RouteTable> routes) {
  m_strict = ParseClassSched(m_classSchedText) == ClassSched::Strict;
  if (m_rxModeName == "gbn") {
    m_rxMode = RxMode::GoBackN;
  } else if (m_rxModeName == "sack") {
    m_rxMode = RxMode::Sack;
  } else if (m_rxModeName == "rud") {
    m_rxMode = RxMode::Rud;
  } else if (m_rxModeName == "rod") {
    m_rxMode = RxMode::Rod;
  } else {
    throw std::invalid_argument("NIC attribute Receiver: unknown mode '" + m_rxModeName +
                                "' (known: gbn, sack, rud, rod)");
  }
  m_entropyMode = m_lbModeName == "reps"        ? EntropyMode::Reps
                  : m_lbModeName == "oblivious" ? EntropyMode::Oblivious
                                                : EntropyMode::None;
  if (m_entropyMode != EntropyMode::None) {
    m_evRng = CreateObject<UniformRandomVariable>();
    m_evRng->SetStream((int64_t{3} << 32) + nodeId);  // apart from the switches' ECN and spraying streams
  }
  m_id = nodeId;
  m_routes = routes;
  m_dev = TakePorts(node, this);
  m_ports.assign(m_dev.size(), Port{});
  node->AggregateObject(this);
}

void RdmaNic::SetFlowCallbacks(FlowCallback dataComplete, FlowCallback senderDone) {
  m_dataComplete = dataComplete;
  m_senderDone = senderDone;
}

void RdmaNic::SetCcPathQueries(PathQuery baseRttNs, PathQuery bdpBytes) {
  m_baseRtt = baseRttNs;
  m_bdp = bdpBytes;
}

void RdmaNic::StartFlow(const QpSpec& spec) {
  auto qp = std::make_unique<Qp>();
  qp->spec = spec;
  qp->port = m_routes->Pick(m_id, m_id, spec.dst, spec.key, spec.viaNic);
  NS_LOG_LOGIC("node " << m_id << " flow " << spec.id << " to " << spec.dst << (spec.viaNic ? " through the NIC" : "")
                       << ": port " << qp->port);
  if (qp->port >= m_ports.size()) {  // no route now (a scenario's failure): wait stalled for a re-convergence
    NS_LOG_LOGIC("node " << m_id << " flow " << spec.id << ": no route to " << spec.dst << ", opens stalled");
    qp->stalled = true;
    qp->port = 0;
  }
  const uint64_t now = NowNs();
  qp->lastProgressNs = now;
  qp->capFloorPs = now * 1000;
  const uint64_t rate = m_dev[qp->port]->GetRateBps();
  qp->rttNs = m_baseRtt(m_id, spec.dst, spec.key, spec.viaNic);
  qp->bdpBytes = m_bdp(m_id, spec.dst, spec.key, spec.viaNic);
  OpenConn(qp.get(), now);
  if (m_rxMode == RxMode::Sack) {
    const int64_t window = m_reorderWindow.GetNanoSeconds();
    qp->sack.Configure(m_payloadBytes, window > 0 ? static_cast<uint64_t>(window) : qp->rttNs);
  } else if (m_rxMode == RxMode::Rud) {
    qp->rud.Configure(m_payloadBytes);
  }
  if (qp->conn->cc->UsesReceiverCredit()) {
    qp->creditOn = true;
    qp->credit.Configure(qp->conn->cc->SpeculativeCreditBytes(), qp->conn->cc->MaxCreditBytes(), m_payloadBytes);
  }
  if (m_entropyMode != EntropyMode::None) {
    qp->ev.Configure(m_entropyMode, m_entropies, m_repsBuffer, m_evRng, &qp->conn->reps);
    if (m_rxMode == RxMode::Rod) {
      qp->pathEntropy = qp->ev.Next();  // ordered delivery keeps one path
    }
  }
  Qp* raw = qp.get();
  m_qps.Put(spec.id, std::move(qp));
  NS_LOG_LOGIC("node " << m_id << " starts flow " << spec.id << " (" << spec.size << " B to " << spec.dst << ")");
  if (spec.maxRateBps != 0) {
    NS_LOG_LOGIC("flow " << spec.id << ": payload rate capped at " << spec.maxRateBps << " bit/s (line " << rate
                         << " bit/s)");
  }
  if (!raw->stalled) {
    Enlist(raw, raw->port);
  }
}

namespace {
/// The position of the first queue pair of a list (sorted by listSeq) that joined at `seq` or later.
template <typename QpPtr>
typename std::vector<QpPtr>::const_iterator FromSeq(const std::vector<QpPtr>& list, uint64_t seq) {
  return std::lower_bound(list.begin(), list.end(), seq, [](QpPtr q, uint64_t s) { return q->listSeq < s; });
}
}  // namespace

void RdmaNic::Enlist(Qp* qp, uint32_t port) {
  qp->port = port;
  qp->listSeq = ++m_listSeq;
  qp->ready = true;
  m_ports[port].active.push_back(qp);
  m_ports[port].ready.push_back(qp);
  m_dev[port]->Kick();
}

void RdmaNic::Recheck(Qp* qp) {
  if (qp->ready || qp->stalled) {
    return;
  }
  const bool lost = (m_rxMode == RxMode::Sack && qp->sack.HasLost()) || (m_rxMode == RxMode::Rud && qp->rud.HasLost());
  if (qp->timed) {
    if (!lost && qp->sndNxt == qp->timedSndNxt) {
      return;  // its next packet is the same: its time can only have moved on
    }
    Unhold(qp);  // a rewind or a loss: its next packet, so its time, may differ
    Ready(qp);
    return;
  }
  if (!lost && (qp->sndNxt >= qp->spec.size || !InTurn(qp))) {
    return;  // still nothing to send whatever the time
  }
  Ready(qp);
}

void RdmaNic::Ready(Qp* qp) {
  std::vector<Qp*>& ready = m_ports[qp->port].ready;
  ready.insert(ready.begin() + (FromSeq(ready, qp->listSeq) - ready.cbegin()), qp);
  qp->ready = true;
}

void RdmaNic::Hold(Qp* qp) {
  Port& p = m_ports[qp->port];
  const auto later = [](uint64_t at, const Qp* q) { return at < q->timedAt; };
  p.timed.insert(std::upper_bound(p.timed.begin(), p.timed.end(), qp->timedAt, later), qp);
  p.timedLine = m_dev[qp->port]->GetRateBps();
  qp->timedSndNxt = qp->sndNxt;
  ++qp->conn->timed;
}

void RdmaNic::Unhold(Qp* qp) {
  std::vector<Qp*>& timed = m_ports[qp->port].timed;
  const auto earlier = [](const Qp* q, uint64_t at) { return q->timedAt < at; };
  timed.erase(std::find(std::lower_bound(timed.begin(), timed.end(), qp->timedAt, earlier), timed.end(), qp));
  qp->timed = false;
  --qp->conn->timed;
}

void RdmaNic::RecheckFrom(const std::vector<Qp*>& order, size_t from) {
  for (size_t i = from; i < order.size(); ++i) {
    Qp* q = order[i];
    Recheck(q);
    if (q->sndNxt < q->spec.size) {
      break;  // the messages after it wait for it
    }
  }
}

void RdmaNic::RecheckAfter(const Qp* qp) {
  const std::vector<Qp*>& open = qp->conn->open;
  RecheckFrom(open, std::find(open.begin(), open.end(), qp) - open.begin() + 1);
  if (qp->spec.queue != 0) {
    const std::vector<Qp*>& queue = m_queues.at(qp->spec.queue);
    RecheckFrom(queue, std::find(queue.begin(), queue.end(), qp) - queue.begin() + 1);
  }
}

void RdmaNic::Unlist(Qp* qp) {
  Port& p = m_ports[qp->port];
  auto pos = std::find(p.active.begin(), p.active.end(), qp);
  if (pos == p.active.end()) {
    return;  // stalled
  }
  if (qp->ready) {
    p.ready.erase(FromSeq(p.ready, qp->listSeq));
    qp->ready = false;
  } else if (qp->timed) {
    Unhold(qp);
  }
  // The round robin goes on at the first listed at or after rrSeq: if that is qp and qp is the last, it wraps.
  const bool at = qp->listSeq >= p.rrSeq && (pos == p.active.begin() || (*(pos - 1))->listSeq < p.rrSeq);
  if (at && pos + 1 == p.active.end()) {
    p.rrSeq = 0;
  }
  p.active.erase(pos);
}

std::vector<uint64_t> RdmaNic::Repin() {
  m_rx.ForEach([](uint64_t, Rx& rx) { rx.ackPort = UINT32_MAX; });  // routes changed: ACKs pick their port afresh
  std::vector<Qp*> open;
  open.reserve(m_qps.size());
  m_qps.ForEach([&open](uint64_t, Qp& qp) { open.push_back(&qp); });
  std::sort(open.begin(), open.end(), [](const Qp* a, const Qp* b) { return a->spec.id < b->spec.id; });
  std::vector<uint64_t> stalled;
  for (Qp* qp : open) {
    const uint32_t port = m_routes->Pick(m_id, m_id, qp->spec.dst, qp->spec.key, qp->spec.viaNic);
    const uint32_t from = qp->stalled ? UINT32_MAX : qp->port;
    if (port >= m_ports.size()) {
      if (!qp->stalled) {
        NS_LOG_LOGIC("node " << m_id << " flow " << qp->spec.id << ": no route to " << qp->spec.dst << ", stalls");
        Unlist(qp);
        qp->stalled = true;
        qp->rto.Cancel();
        m_failoverTrace(qp->spec.id, from, UINT32_MAX);
      }
      stalled.push_back(qp->spec.id);
      continue;
    }
    if (!qp->stalled && (port == qp->port || !m_portFailover)) {
      continue;
    }
    NS_LOG_LOGIC("node " << m_id << " flow " << qp->spec.id << ": port " << from << " -> " << port);
    Unlist(qp);
    if (!qp->stalled) {
      ++m_counters.failovers;
    }
    qp->stalled = false;
    qp->lastProgressNs = NowNs();
    Enlist(qp, port);
    ArmRto(qp);
    m_failoverTrace(qp->spec.id, from, port);
  }
  return stalled;
}

bool RdmaNic::Stalled(uint64_t flowId) const {
  const Qp* qp = m_qps.Find(flowId);
  return qp != nullptr && qp->stalled;
}

RdmaNic::Conn* RdmaNic::OpenConn(Qp* qp, uint64_t nowNs) {
  const QpSpec& spec = qp->spec;
  Conn* conn = nullptr;
  if (spec.conn == 0) {
    qp->own = std::make_unique<Conn>();
    conn = qp->own.get();
  } else {
    std::unique_ptr<Conn>& slot = m_conns[spec.conn];
    if (slot && slot->dst != spec.dst) {
      throw std::invalid_argument("flow " + std::to_string(spec.id) + " to node " + std::to_string(spec.dst) +
                                  " is on connection " + std::to_string(spec.conn) + ", which goes to node " +
                                  std::to_string(slot->dst));
    }
    if (slot) {
      conn = slot.get();
      if (conn->open.empty()) {
        conn->cc->OnResume(nowNs);
        NS_LOG_LOGIC("node " << m_id << " resumes connection " << spec.conn << " at " << conn->cc->GetRateBps()
                             << " bit/s");
      }
    } else {
      slot = std::make_unique<Conn>();
      conn = slot.get();
    }
  }
  if (!conn->cc) {
    ++m_counters.queuePairs;
    conn->dst = spec.dst;
    conn->nextAvailPs = nowNs * 1000;
    conn->cc = m_ccFactory.Create<CongestionControl>();
    conn->cc->Start(m_dev[qp->port]->GetRateBps(), qp->rttNs, m_payloadBytes,
                    m_bdp(m_id, spec.dst, spec.key, spec.viaNic));
    conn->reps.Configure(m_repsBuffer, static_cast<uint64_t>(m_repsFreeze.GetNanoSeconds()), m_repsThawExplore);
  }
  qp->conn = conn;
  qp->base = conn->streamBytes;
  conn->streamBytes += spec.size;
  conn->open.push_back(qp);
  if (spec.queue != 0) {
    m_queues[spec.queue].push_back(qp);
  }
  return conn;
}

bool RdmaNic::InTurn(const Qp* qp) const {
  for (const Qp* q : qp->conn->open) {
    if (q == qp) {
      break;
    }
    if (q->sndNxt < q->spec.size) {
      return false;
    }
  }
  if (qp->spec.queue == 0) {
    return true;
  }
  for (const Qp* q : m_queues.at(qp->spec.queue)) {
    if (q == qp) {
      return true;
    }
    if (q->sndNxt < q->spec.size) {
      return false;
    }
  }
  return true;
}

uint64_t RdmaNic::InFlight(const Qp* qp) const {
  uint64_t bytes = 0;
  for (const Qp* q : qp->conn->open) {
    bytes += m_rxMode == RxMode::Rud ? q->rud.InFlightBytes() : q->sndNxt - q->sndUna;
  }
  return bytes;
}

void RdmaNic::ExpectFlow(uint64_t id, uint64_t size, uint64_t lossBudget) {
  Rx& rx = m_rx.Get(id);
  rx = Rx{};
  rx.size = size;
  rx.budget = lossBudget;
  rx.rud.Configure(m_payloadBytes);
}

std::vector<std::pair<uint64_t, uint64_t>> RdmaNic::TakeLost(uint64_t id) {
  Rx* rx = m_rx.Find(id);
  if (rx == nullptr) {
    return {};
  }
  std::vector<std::pair<uint64_t, uint64_t>> out;
  out.swap(rx->holes);
  return out;
}

void RdmaNic::ForgetFlow(uint64_t id) {
  if (Rx* rx = m_rx.Find(id)) {
    rx->ackTimer.Cancel();
    if (rx->creditPort != UINT32_MAX) {
      m_ports[rx->creditPort].credit.Forget(id);
    }
    m_rx.Erase(id);
  }
}

void RdmaNic::AckTimeout(uint64_t flowId) {
  Rx* rx = m_rx.Find(flowId);
  if (rx == nullptr || rx->sinceAck == 0) {
    return;
  }
  rx->sinceAck = 0;
  SendAck(rx->unacked, PktType::Ack, *rx);
}

Ptr<CongestionControl> RdmaNic::GetCc(uint64_t flowId) const {
  const Qp* qp = m_qps.Find(flowId);
  return qp == nullptr ? nullptr : qp->conn->cc;
}

FlowTransportStats RdmaNic::RxStats(uint64_t flowId) const {
  const Rx* rx = m_rx.Find(flowId);
  return rx == nullptr ? FlowTransportStats{} : rx->stats;
}

FlowTransportStats RdmaNic::TxStats(uint64_t flowId, bool take) {
  if (const Qp* qp = m_qps.Find(flowId)) {
    return qp->stats;
  }
  auto done = m_doneTx.find(flowId);
  if (done == m_doneTx.end()) {
    return FlowTransportStats{};
  }
  const FlowTransportStats out = done->second;
  if (take) {
    m_doneTx.erase(done);
  }
  return out;
}

bool RdmaNic::SendProgress(uint64_t flowId, uint64_t& sentOnce, uint64_t& lineBps) const {
  const Qp* qp = m_qps.Find(flowId);
  if (qp == nullptr) {
    return false;
  }
  sentOnce = qp->maxSent;
  lineBps = m_dev[qp->port]->GetRateBps();
  return true;
}

int64_t RdmaNic::LastByteSentNs(uint64_t flowId) const {
  const Qp* qp = m_qps.Find(flowId);
  return qp == nullptr ? -1 : qp->lastByteNs;
}

RdmaNic::Look RdmaNic::LookAt(Qp* qp, const bool* paused, uint64_t nowPs, uint64_t& atPs) const {
  // sack: retransmissions ignore the window; rud: the window caps what is neither acknowledged nor lost
  const bool rud = m_rxMode == RxMode::Rud;
  const bool lost = (m_rxMode == RxMode::Sack && qp->sack.HasLost()) || (rud && qp->rud.HasLost());
  if (!lost && (qp->sndNxt >= qp->spec.size || !InTurn(qp))) {
    return Look::Park;
  }
  if (paused[qp->spec.prio % kNumPrio]) {
    return Look::Skip;
  }
  if (qp->creditOn && !qp->credit.CanSend()) {
    return Look::Skip;  // receiver credits: wait for a grant (it kicks the port)
  }
  const Conn* conn = qp->conn;
  const uint64_t win = conn->cc->GetWindowBytes();
  if (win != 0 && (rud || !lost) && InFlight(qp) >= win) {
    return Look::Skip;
  }
  if (conn->nextAvailPs > nowPs + 999) {  // pacing: due later than within this ns
    atPs = conn->nextAvailPs;
    return Look::Wait;
  }
  if (qp->spec.maxRateBps != 0) {  // rate cap: not before the next packet's payload at the cap has gone
    const uint64_t left = lost ? qp->spec.size : qp->spec.size - qp->sndNxt;  // (a resend's length: at most)
    const uint32_t next = static_cast<uint32_t>(std::min<uint64_t>(m_payloadBytes, left));
    const uint64_t due = CapDuePs(qp, next);
    if (due > nowPs) {
      atPs = due + 999;  // wake in the ns it is due by, not before
      return Look::Wait;
    }
  }
  return Look::Send;
}

uint64_t RdmaNic::TimedEarliest(Port& p, const bool* paused, uint64_t nowPs, uint64_t bound) {
  // Every timed queue pair counts at least its timedAt towards the wake-up (or nothing: paused, no credit, a full
  // window), so the first in order that still waits for exactly that gives the earliest of them all.
  size_t i = 0;
  while (i < p.timed.size() && p.timed[i]->timedAt < bound) {
    Qp* qp = p.timed[i];
    uint64_t at = 0;
    const Look look = LookAt(qp, paused, nowPs, at);
    if (look == Look::Skip) {
      ++i;
      continue;
    }
    if (look == Look::Wait && at == qp->timedAt) {
      return at;
    }
    NS_ASSERT_MSG(look == Look::Park || (look == Look::Wait && at > qp->timedAt),
                  "node " << m_id << " flow " << qp->spec.id << ": due before the time it was kept for");
    p.timed.erase(p.timed.begin() + static_cast<std::ptrdiff_t>(i));
    if (look == Look::Park) {
      qp->timed = false;
      --qp->conn->timed;
      continue;
    }
    qp->timedAt = at;  // it waits longer now: back in order, after the ones looked at
    const auto later = [](uint64_t t, const Qp* q) { return t < q->timedAt; };
    p.timed.insert(std::upper_bound(p.timed.begin() + static_cast<std::ptrdiff_t>(i), p.timed.end(), at, later), qp);
  }
  return bound;
}

bool RdmaNic::Dequeue(uint32_t port, const bool* paused, TxItem& out) {
  Port& p = m_ports[port];
  if (!p.ctrl.empty()) {
    out = std::move(p.ctrl.front());
    p.ctrl.pop_front();
    return true;
  }
  const uint64_t now = NowNs();
  const uint64_t nowPs = now * 1000;
  if (!p.timed.empty()) {  // those whose time has come (or all, if the port's rate changed) are looked at again
    const bool rateMoved = m_dev[port]->GetRateBps() != p.timedLine;
    size_t due = 0;
    while (due < p.timed.size() && (rateMoved || p.timed[due]->timedAt <= nowPs + 999)) {
      Qp* qp = p.timed[due++];
      qp->timed = false;
      --qp->conn->timed;
      Ready(qp);
    }
    p.timed.erase(p.timed.begin(), p.timed.begin() + static_cast<std::ptrdiff_t>(due));
  }
  uint64_t earliest = std::numeric_limits<uint64_t>::max();
  Qp* pick = nullptr;
  // Round robin from the first listed at or after rrSeq, looking only at the queue pairs not parked (`ready`, in
  // the same order).
  const uint32_t m = static_cast<uint32_t>(p.ready.size());
  const uint32_t from = static_cast<uint32_t>(FromSeq(p.ready, p.rrSeq) - p.ready.cbegin());
  const uint32_t start = from == m ? 0 : from;
  bool off = false;  // some left `ready` (parked, or timed: on `timed` below)
  for (uint32_t i = 0, idx = start; i < m; ++i, idx = idx + 1 == m ? 0 : idx + 1) {  // round the list, no division
    Qp* qp = p.ready[idx];
    uint64_t at = 0;
    const Look look = LookAt(qp, paused, nowPs, at);
    if (look == Look::Park) {
      qp->ready = false;  // parked until Recheck finds it may send
      off = true;
      continue;
    }
    if (look == Look::Skip) {
      continue;
    }
    if (look == Look::Wait) {
      earliest = std::min(earliest, at);
      qp->ready = false;  // timed: back when `at` comes (on `timed` below)
      qp->timed = true;
      qp->timedAt = at;
      off = true;
      continue;
    }
    if (!m_strict) {  // round robin: the first due queue pair
      pick = qp;
      break;
    }
    if (!pick || qp->spec.prio < pick->spec.prio) {  // strict: the first due one of the highest class
      pick = qp;
    }
  }
  if (!pick && !p.timed.empty()) {  // before the ones timed just now join them
    earliest = TimedEarliest(p, paused, nowPs, earliest);
  }
  if (off) {
    auto keep = p.ready.begin();
    for (Qp* qp : p.ready) {
      if (qp->ready) {
        *keep++ = qp;
      } else if (qp->timed) {
        Hold(qp);
      }
    }
    p.ready.erase(keep, p.ready.end());
  }
  if (pick) {
    p.rrSeq = pick == p.active.back() ? 0 : pick->listSeq + 1;  // on after it, or from the start
    BuildData(pick, out, now);
    return true;
  }
  if (earliest != std::numeric_limits<uint64_t>::max()) {
    Wake(port, earliest / 1000);  // the ns in which the earliest queue pair becomes due
  }
  return false;
}

void RdmaNic::BuildData(Qp* qp, TxItem& out, uint64_t nowNs) {
  Ptr<PhantoraPacket> pkt = PhantoraPacket::Make();
  PhantoraHeader& hdr = pkt->hdr;
  hdr.type = PktType::Data;
  hdr.prio = qp->spec.prio;
  hdr.src = m_id;
  hdr.dst = qp->spec.dst;
  hdr.flowId = qp->spec.id;
  uint64_t lostSeq = 0;
  uint32_t lostLen = 0;
  const bool resend = (m_rxMode == RxMode::Sack && qp->sack.NextLost(lostSeq, lostLen)) ||
                      (m_rxMode == RxMode::Rud && qp->rud.NextLost(lostSeq, lostLen));
  hdr.seq = resend ? lostSeq : qp->sndNxt;
  hdr.payload = resend ? lostLen : static_cast<uint32_t>(std::min<uint64_t>(m_payloadBytes, qp->spec.size - qp->sndNxt));
  hdr.ecmpKey = qp->spec.key;
  hdr.viaNic = qp->spec.viaNic;
  hdr.tsNs = nowNs;
  if (m_markLastByte && hdr.seq + hdr.payload >= qp->spec.size) {
    hdr.flags |= kFlagLastByte;
  }
  if (qp->spec.lossBudget && !qp->budgetGone && m_rxMode == RxMode::GoBackN && qp->sndNxt >= qp->maxSent) {
    // First transmissions only: a retransmission must arrive. DLCP holes are a go-back-N receiver's.
    hdr.flags |= kFlagLossTolerant;
  }
  if (m_rxMode == RxMode::Rud || m_rxMode == RxMode::Rod) {
    hdr.flags |= kFlagLossTolerant;  // UET: every packet may be trimmed; its header comes back as a NACK
  }
  if (m_entropyMode != EntropyMode::None) {
    hdr.entropy = m_rxMode == RxMode::Rod ? qp->pathEntropy : qp->ev.Next();
  }
  const uint32_t wire = m_wire.Bytes(hdr);
  out = TxItem{pkt, wire, 0, qp->spec.prio, true};

  if (resend || qp->sndNxt < qp->maxSent) {
    ++m_counters.retxPackets;
    m_counters.retxBytes += hdr.payload;
    ++qp->stats.retxPackets;
    qp->stats.retxBytes += hdr.payload;
    m_retxTrace(qp->spec.id, hdr.payload, qp->maxSent >= qp->spec.size);
  }
  ++m_counters.dataPackets;
  Qp* queueNext = nullptr;  // its queue's next message, once this packet is the last new one of its own
  if (!resend) {
    qp->sndNxt += hdr.payload;
    qp->maxSent = std::max(qp->maxSent, qp->sndNxt);
    if (qp->lastByteNs < 0 && qp->maxSent >= qp->spec.size) {
      qp->lastByteNs = static_cast<int64_t>(nowNs);
    }
    if (qp->sndNxt >= qp->spec.size) {
      RecheckAfter(qp);  // the next message's turn, maybe
    }
    if (qp->spec.queue != 0 && qp->sndNxt >= qp->spec.size) {  // its queue's next flow may go: wake its port
      for (Qp* q : m_queues.at(qp->spec.queue)) {
        if (q->sndNxt < q->spec.size) {
          queueNext = q;
          if (q->port != qp->port && !q->stalled) {
            m_dev[q->port]->Kick();
          }
          break;
        }
      }
    }
  }
  if (m_rxMode == RxMode::Sack) {
    qp->sack.OnSend(hdr.seq, hdr.payload, nowNs, resend);
  } else if (m_rxMode == RxMode::Rud) {
    qp->rud.OnSend(hdr.seq, hdr.payload, nowNs, resend);
  }
  Conn* conn = qp->conn;
  if (qp->creditOn) {
    qp->credit.OnSend(hdr.payload);
    const uint64_t backlog = qp->spec.size - qp->sndNxt + (m_rxMode == RxMode::Rud ? qp->rud.LostBytes() : 0);
    hdr.flags |= kFlagCredit;
    hdr.credit = qp->credit.Target(backlog, conn->cc->GetWindowBytes());
  }
  uint64_t rate = conn->cc->GetRateBps();
  const uint64_t line = m_dev[qp->port]->GetRateBps();
  if (rate == 0 || rate > line) {
    rate = line;
  }
  // Pace on an exact ps timeline: the packet's ideal start is when it became due (or up to 1 ns ago, if
  // the queue pair was held back), so whole-ns event times never lower the long-run rate.
  const uint64_t nowPs = nowNs * 1000;
  const uint64_t held = CapDuePs(qp, hdr.payload);  // rate cap (payload bits/s): Dequeue held it until then
  if (qp->spec.maxRateBps != 0) {  // CapEndPs, kept by CapDuePs just now (0 for no payload)
    conn->capEndPs = hdr.payload == 0 ? 0 : qp->capMemoSchedEnd;  // before lastStartPs moves: `held`'s schedule
  }
  const uint64_t idealStart = std::max({conn->nextAvailPs, held, nowPs >= 999 ? nowPs - 999 : 0});
  if (held != 0) {
    NS_LOG_LOGIC("flow " << qp->spec.id << ": " << hdr.payload << " B capped at " << qp->spec.maxRateBps
                         << " bit/s, due at " << held << " ps");
  }
  // The next packet: after this one's wire bytes at `rate`; a rate cap's own wait (the next packet's payload at
  // the cap after this one's end at line rate) is CapDuePs's, so the flow's payload rate is the cap exactly.
  conn->nextAvailPs = idealStart + SerialisationPs(wire, rate, conn->paceRem);
  conn->lastStartPs = idealStart;
  conn->lastWire = wire;
  if (conn->timed != 0) {  // the times of its other timed messages count from its last packet: look again
    for (Qp* q : conn->open) {
      if (q->timed) {
        Unhold(q);
        Ready(q);
      }
    }
  }
  if (queueNext != nullptr && queueNext->spec.maxRateBps != 0) {  // its cap counts from this packet's end
    queueNext->capFloorPs = std::max(queueNext->capFloorPs, idealStart + LinePs(qp, wire));
  }
  conn->cc->OnSend(hdr.payload, nowNs);
  ArmRto(qp);
}

uint64_t RdmaNic::LinePs(const Qp* qp, uint32_t wire) const {
  uint64_t rem = 0;
  return SerialisationPs(wire, m_dev[qp->port]->GetRateBps(), rem);
}

uint64_t RdmaNic::CapEndPs(const Qp* qp, uint32_t payload) const {
  const uint64_t cap = qp->spec.maxRateBps;
  if (cap == 0 || payload == 0) {
    return 0;
  }
  const Conn* conn = qp->conn;
  const uint64_t prevEnd = conn->lastWire == 0 ? 0 : conn->lastStartPs + LinePs(qp, conn->lastWire);
  uint64_t rem = 0;
  const uint64_t atCap = SerialisationPs(payload, cap, rem);
  const uint64_t lagFloor = prevEnd > atCap ? prevEnd - atCap : 0;  // at most one packet's time made up
  return std::max({conn->capEndPs, lagFloor, qp->capFloorPs}) + atCap;
}

uint64_t RdmaNic::CapDuePs(const Qp* qp, uint32_t payload) const {
  if (qp->spec.maxRateBps == 0 || payload == 0) {
    return 0;
  }
  const Conn* conn = qp->conn;
  const uint64_t line = m_dev[qp->port]->GetRateBps();
  if (qp->capMemoPayload == payload && qp->capMemoStart == conn->lastStartPs && qp->capMemoWire == conn->lastWire &&
      qp->capMemoEnd == conn->capEndPs && qp->capMemoFloor == qp->capFloorPs && qp->capMemoLine == line) {
    return qp->capMemoDue;  // the same inputs as the last call (a queue pair waiting for its time)
  }
  const uint64_t end = CapEndPs(qp, payload);
  uint64_t rem = 0;
  const uint64_t tx = SerialisationPs(m_wire.DataBytes(payload), line, rem);
  qp->capMemoDue = end > tx ? end - tx : 0;
  qp->capMemoSchedEnd = end;
  qp->capMemoStart = conn->lastStartPs;
  qp->capMemoWire = conn->lastWire;
  qp->capMemoEnd = conn->capEndPs;
  qp->capMemoFloor = qp->capFloorPs;
  qp->capMemoLine = line;
  qp->capMemoPayload = payload;
  return qp->capMemoDue;
}

void RdmaNic::Receive(uint32_t port, const Ptr<PhantoraPacket>& pkt) {
  const PhantoraHeader& hdr = pkt->hdr;
  if (hdr.dst != m_id) {
    NS_LOG_WARN("node " << m_id << " got a packet for " << hdr.dst << "; endpoints do not forward");
    return;
  }
  if (hdr.type == PktType::Data) {
    ReceiveData(port, hdr);
  } else if (hdr.type == PktType::Credit) {
    ReceiveCredit(hdr);
  } else {
    ReceiveAck(hdr);
  }
}

void RdmaNic::ReceiveData(uint32_t port, const PhantoraHeader& hdr) {
  Rx* found = m_rx.Find(hdr.flowId);
  if (found == nullptr) {
    return;  // a late duplicate of a finished flow
  }
  Rx& rx = *found;
  if ((hdr.flags & kFlagCredit) && !rx.done) {
    CreditAsk(rx, hdr, port);
  }
  if (m_rxMode == RxMode::Rud) {
    ReceiveDataRud(rx, hdr);
    return;
  }
  if (hdr.seq > rx.expected) {
    const uint64_t depth = hdr.seq - rx.expected;
    ++rx.stats.oooPackets;
    ++m_counters.oooPackets;
    rx.stats.reorderMaxBytes = std::max(rx.stats.reorderMaxBytes, depth);
    m_counters.reorderMaxBytes = std::max(m_counters.reorderMaxBytes, depth);
  }
  if (m_rxMode == RxMode::Sack) {
    ReceiveDataSack(rx, hdr);
    return;
  }
  const uint64_t now = NowNs();
  const bool trimmed = hdr.flags & kFlagTrimmed;
  if (m_rxMode == RxMode::Rod && trimmed && hdr.seq == rx.expected) {
    // UET ROD: the expected packet's header arrived without its payload: NACK it at once, whatever NACK went
    // before (it names this transmission by its send time); later packets are dropped as out of order.
    ++m_counters.nacks;
    m_nackTrace(hdr.flowId, rx.expected);
    rx.lastNackSeq = rx.expected;
    rx.lastNackNs = now;
    SendAck(hdr, PktType::Nack, rx, kFlagTrimmed, hdr.seq, hdr.seq + hdr.payload);
    CreditAdd(rx, hdr.flowId, hdr.payload);
    return;
  }
  const bool takeHole = trimmed && hdr.seq == rx.expected && rx.lost + hdr.payload <= rx.budget;
  if (trimmed && hdr.seq == rx.expected && !takeHole) {
    // Over the loss budget: ask for it again (go-back-N) and tell the sender to flag nothing more.
    ++m_counters.nacks;
    m_nackTrace(hdr.flowId, rx.expected);
    rx.lastNackSeq = rx.expected;
    rx.lastNackNs = now;
    SendAck(hdr, PktType::Nack, rx, kFlagTrimmed);
    return;
  }
  if (hdr.seq == rx.expected) {
    rx.expected += hdr.payload;
    if (takeHole) {
      rx.lost += hdr.payload;
      if (!rx.holes.empty() && rx.holes.back().first + rx.holes.back().second == hdr.seq) {
        rx.holes.back().second += hdr.payload;
      } else {
        rx.holes.emplace_back(hdr.seq, hdr.payload);
      }
    } else {
      m_counters.payloadBytesDelivered += hdr.payload;
    }
    const bool last = rx.expected >= rx.size;
    const bool ce = hdr.flags & kFlagCe;
    if (++rx.sinceAck >= m_ackInterval || last || ce) {
      rx.sinceAck = 0;
      rx.ackTimer.Cancel();
      SendAck(hdr, PktType::Ack, rx);
    } else {
      rx.unacked.AssignUsed(hdr);
      if (!rx.ackTimer.IsPending()) {
        rx.ackTimer = Simulator::Schedule(m_ackDelay, &RdmaNic::AckTimeout, this, hdr.flowId);
      }
    }
    if (last && !rx.done) {
      rx.done = true;
      m_dataComplete(hdr.flowId);
    }
  } else if (hdr.seq > rx.expected) {
    if (rx.expected != rx.lastNackSeq || now - rx.lastNackNs >= static_cast<uint64_t>(m_nackInterval.GetNanoSeconds())) {
      rx.lastNackSeq = rx.expected;
      rx.lastNackNs = now;
      ++m_counters.nacks;
      m_nackTrace(hdr.flowId, rx.expected);
      SendAck(hdr, PktType::Nack, rx);
    }
  } else {
    SendAck(hdr, PktType::Ack, rx);  // duplicate: tell the sender where we are
  }
}

void RdmaNic::ReceiveDataSack(Rx& rx, const PhantoraHeader& hdr) {
  const uint64_t before = rx.expected;
  const SackReceiver::Arrival a = rx.sack.Arrive(hdr.seq, hdr.payload);
  rx.expected = rx.sack.Cumulative();
  m_counters.payloadBytesDelivered += a.newBytes;
  const bool last = rx.expected >= rx.size;
  const bool ce = hdr.flags & kFlagCe;
  const bool inOrder = a.advanced && hdr.seq == before && rx.expected == before + hdr.payload;
  if (inOrder && !last && !ce && ++rx.sinceAck < m_ackInterval) {
    rx.unacked.AssignUsed(hdr);
    if (!rx.ackTimer.IsPending()) {
      rx.ackTimer = Simulator::Schedule(m_ackDelay, &RdmaNic::AckTimeout, this, hdr.flowId);
    }
  } else {
    // Out of order, a hole filled, a duplicate, the last byte or a CE mark: acknowledge at once.
    rx.sinceAck = 0;
    rx.ackTimer.Cancel();
    SendAck(hdr, PktType::Ack, rx, 0, a.blockLo, a.blockHi, a.newBytes == 0);
  }
  if (last && !rx.done) {
    rx.done = true;
    m_dataComplete(hdr.flowId);
  }
}

void RdmaNic::ReceiveDataRud(Rx& rx, const PhantoraHeader& hdr) {
  if (hdr.flags & kFlagTrimmed) {
    // The payload was trimmed on the way: NACK this packet at once (its header arrived, so it is not lost
    // to the fabric); the NACK echoes the send time, which names the transmission to resend.
    ++m_counters.nacks;
    m_nackTrace(hdr.flowId, hdr.seq);
    SendAck(hdr, PktType::Nack, rx, kFlagTrimmed, hdr.seq, hdr.seq + hdr.payload);
    CreditAdd(rx, hdr.flowId, hdr.payload);
    return;
  }
  const uint64_t before = rx.expected;
  if (hdr.seq > before) {
    const uint64_t depth = hdr.seq - before;
    ++rx.stats.oooPackets;
    ++m_counters.oooPackets;
    rx.stats.reorderMaxBytes = std::max(rx.stats.reorderMaxBytes, depth);
    m_counters.reorderMaxBytes = std::max(m_counters.reorderMaxBytes, depth);
  }
  const RudReceiver::Arrival a = rx.rud.Arrive(hdr.seq, hdr.payload);
  rx.expected = rx.rud.Cumulative();
  if (a.fresh) {
    m_counters.payloadBytesDelivered += hdr.payload;
  }
  const bool last = rx.expected >= rx.size;
  const bool ce = hdr.flags & kFlagCe;
  const bool inOrder = a.advanced && hdr.seq == before && rx.expected == before + hdr.payload;
  if (inOrder && !last && !ce && ++rx.sinceAck < m_ackInterval) {
    rx.unacked.AssignUsed(hdr);
    if (!rx.ackTimer.IsPending()) {
      rx.ackTimer = Simulator::Schedule(m_ackDelay, &RdmaNic::AckTimeout, this, hdr.flowId);
    }
  } else {
    rx.sinceAck = 0;
    rx.ackTimer.Cancel();
    SendAck(hdr, PktType::Ack, rx, 0, hdr.seq, hdr.seq + hdr.payload, !a.fresh, rx.rud.Bitmap());
  }
  if (last && !rx.done) {
    rx.done = true;
    m_dataComplete(hdr.flowId);
  }
}

void RdmaNic::SendAck(const PhantoraHeader& data, PktType type, const Rx& rx, uint8_t extraFlags, uint64_t sackLo,
                      uint64_t sackHi, bool dsack, uint64_t bitmap) {
  Ptr<PhantoraPacket> pkt = PhantoraPacket::Make();
  PhantoraHeader& ack = pkt->hdr;
  ack.type = type;
  ack.prio = m_ackHighPrio ? 0 : data.prio;
  ack.flags = static_cast<uint8_t>(((data.flags & kFlagCe) ? kFlagEcnEcho : 0) | extraFlags);
  ack.src = m_id;
  ack.dst = data.src;
  ack.flowId = data.flowId;
  ack.seq = rx.expected;
  ack.ecmpKey = m_routes->ReverseKey(data.ecmpKey);  // HPCC's ACK carries the ports swapped
  ack.viaNic = data.viaNic;  // back the way its data came: through the NICs if that did
  ack.tsNs = data.tsNs;
  ack.entropy = data.entropy;
  ack.sackBitmap = bitmap;
  if (dsack) {
    ack.flags |= kFlagDsack;
  }
  if (sackLo < sackHi) {
    ack.flags |= kFlagSack;
    ack.sackLo = sackLo;
    ack.sackHi = sackHi;
  }
  ack.nHops = data.nHops;
  std::copy(data.hops, data.hops + data.nHops, ack.hops);
  if (rx.ackPort == UINT32_MAX || rx.ackKey != ack.ecmpKey || rx.ackViaNic != ack.viaNic || rx.ackDst != data.src) {
    rx.ackPort = m_routes->Pick(m_id, m_id, data.src, ack.ecmpKey, ack.viaNic);
    rx.ackKey = ack.ecmpKey;
    rx.ackViaNic = ack.viaNic;
    rx.ackDst = data.src;
  }
  const uint32_t port = rx.ackPort;
  if (port >= m_ports.size()) {
    return;
  }
  m_ports[port].ctrl.push_back(TxItem{pkt, m_wire.Bytes(ack), 0, ack.prio, false});
  ++m_counters.acks;
  m_dev[port]->Kick();
}

void RdmaNic::ReceiveAck(const PhantoraHeader& hdr) {
  Qp* qp = m_qps.Find(hdr.flowId);
  if (qp == nullptr) {
    return;  // the flow already finished
  }
  if (qp->creditOn) {
    qp->credit.StopSpeculating();  // the receiver has answered
  }
  if (m_rxMode == RxMode::Rud) {
    ReceiveAckRud(qp, hdr);
    return;
  }
  const uint64_t now = NowNs();
  uint64_t newly = 0;
  if (hdr.seq > qp->sndUna) {
    newly = hdr.seq - qp->sndUna;
    qp->sndUna = hdr.seq;
    qp->lastProgressNs = now;
  }
  const bool trimNack = hdr.type == PktType::Nack && (hdr.flags & kFlagTrimmed);
  if (trimNack) {
    qp->budgetGone = true;
  }
  const bool rodTrim = trimNack && m_rxMode == RxMode::Rod;
  if (rodTrim) {
    ++m_counters.trimNacks;
  }
  if (m_rxMode == RxMode::Sack) {
    const bool block = hdr.flags & kFlagSack;
    if (hdr.flags & kFlagDsack) {
      qp->sack.OnDsack();
    }
    if (qp->sack.OnAck(hdr.seq, block ? hdr.sackLo : 0, block ? hdr.sackHi : 0, hdr.tsNs) > 0) {
      qp->lastProgressNs = now;
    }
  }
  if (hdr.type == PktType::Nack && qp->sndNxt > hdr.seq) {
    // Go back to the hole, once per hole per round trip (later NACKs for it are already in flight); ROD's
    // trim NACK, once per transmission sent since the last rewind.
    if (rodTrim ? hdr.tsNs >= qp->lastRewindNs
                : hdr.seq != qp->lastRewindSeq || now - qp->lastRewindNs >= qp->rttNs) {
      qp->sndNxt = hdr.seq;
      qp->lastRewindSeq = hdr.seq;
      qp->lastRewindNs = now;
    }
  }
  if (qp->sndNxt < qp->sndUna) {
    qp->sndNxt = qp->sndUna;
  }
  CcFeedback fb;
  fb.nowNs = now;
  fb.ackSeq = qp->base + hdr.seq;  // the queue pair's byte stream runs on across its messages
  fb.newlyAcked = static_cast<uint32_t>(std::min<uint64_t>(newly, std::numeric_limits<uint32_t>::max()));
  fb.ecnEcho = hdr.flags & kFlagEcnEcho;
  fb.rttNs = now > hdr.tsNs ? now - hdr.tsNs : 0;
  fb.nHops = hdr.nHops;
  std::copy(hdr.hops, hdr.hops + hdr.nHops, fb.hops);
  fb.nackedBytes = rodTrim ? static_cast<uint32_t>(hdr.sackHi - hdr.sackLo) : 0;
  if (fb.ecnEcho) {
    EcnEchoed(qp, hdr);
  }
  qp->conn->cc->OnAck(fb);
  if (qp->sndUna >= qp->spec.size) {
    Finish(qp);
    return;
  }
  Recheck(qp);  // a rewind or a loss gives it something to send again
  m_dev[qp->port]->Kick();
}

void RdmaNic::EcnEchoed(Qp* qp, const PhantoraHeader& hdr) {
  ++m_counters.ecnEchoes;
  if (!qp->conn->cc->UsesCnp()) {
    return;  // an ECE echo for a CC that takes no CNPs (DCTCP, NSCC read it; HPCC, TIMELY, Swift ignore it)
  }
  ++m_counters.cnps;
  NS_LOG_LOGIC("node " << m_id << " flow " << hdr.flowId << " gets a CNP from " << hdr.src << " at seq " << hdr.seq);
  m_cnpTrace(hdr.flowId, hdr.src, hdr.seq);
}

void RdmaNic::ReceiveAckRud(Qp* qp, const PhantoraHeader& hdr) {
  const uint64_t now = NowNs();
  const bool ecn = hdr.flags & kFlagEcnEcho;
  uint64_t newly = 0;
  uint32_t nacked = 0;
  if (hdr.type == PktType::Nack && (hdr.flags & kFlagTrimmed)) {
    ++m_counters.trimNacks;
    nacked = qp->rud.OnNack(hdr.sackLo, hdr.tsNs);
    NS_LOG_LOGIC("node " << m_id << " flow " << hdr.flowId << ": packet " << hdr.sackLo << " was trimmed"
                         << (nacked ? ", resending it" : ", already handled"));
  } else {
    newly = qp->rud.OnAck(hdr.seq, hdr.sackBitmap, (hdr.flags & kFlagSack) ? hdr.sackLo : UINT64_MAX);
    if (m_sleek) {
      const uint64_t maxWnd = qp->bdpBytes * 3 / 2;
      const uint64_t cwnd = qp->conn->cc->GetWindowBytes();
      const uint64_t window = cwnd == 0 ? maxWnd : cwnd;
      const auto scaled = static_cast<uint64_t>(m_sleekFactor * static_cast<double>(window));
      const uint64_t threshold = std::max<uint64_t>(std::min(scaled, maxWnd) / m_payloadBytes, m_sleekMinPackets);
      qp->rud.Sleek(threshold, window);
      qp->probeAtNs = now + (qp->sndNxt >= qp->spec.size ? qp->rttNs * 7 / 4 : 3 * qp->rttNs);
      if (!qp->probe.IsPending()) {
        qp->probe = Simulator::Schedule(NanoSeconds(qp->probeAtNs - now), &RdmaNic::SleekProbe, this, qp);
      }
    }
  }
  if (m_entropyMode != EntropyMode::None) {
    qp->ev.Feedback(hdr.entropy, hdr.type == PktType::Ack && !ecn, now);  // REPS recycles uncongested entropies
  }
  qp->sndUna = std::max(qp->sndUna, qp->rud.Una());
  if (newly > 0) {
    qp->lastProgressNs = now;
  }
  CcFeedback fb;
  fb.nowNs = now;
  fb.ackSeq = qp->base + hdr.seq;  // the queue pair's byte stream runs on across its messages
  fb.newlyAcked = static_cast<uint32_t>(std::min<uint64_t>(newly, std::numeric_limits<uint32_t>::max()));
  fb.ecnEcho = ecn;
  fb.rttNs = hdr.type == PktType::Ack && now > hdr.tsNs ? now - hdr.tsNs : 0;
  fb.nHops = hdr.nHops;
  std::copy(hdr.hops, hdr.hops + hdr.nHops, fb.hops);
  fb.nackedBytes = nacked;
  if (ecn) {
    EcnEchoed(qp, hdr);
  }
  qp->conn->cc->OnAck(fb);
  if (qp->sndUna >= qp->spec.size) {
    Finish(qp);
    return;
  }
  Recheck(qp);  // a rewind or a loss gives it something to send again
  m_dev[qp->port]->Kick();
}

void RdmaNic::ReceiveCredit(const PhantoraHeader& hdr) {
  Qp* qp = m_qps.Find(hdr.flowId);
  if (qp == nullptr || !qp->creditOn) {
    return;  // the flow already finished
  }
  qp->credit.OnGrant(hdr.credit);
  m_dev[qp->port]->Kick();
}

void RdmaNic::CreditAsk(Rx& rx, const PhantoraHeader& hdr, uint32_t port) {
  if (rx.creditPort == UINT32_MAX) {
    rx.creditPort = port;
    rx.creditPeer = hdr.src;
    rx.creditKey = m_routes->ReverseKey(hdr.ecmpKey);
    rx.creditViaNic = hdr.viaNic;
  }
  Port& p = m_ports[rx.creditPort];
  p.credit.Ask(hdr.flowId, hdr.credit);
  if (!p.creditEv.IsPending()) {
    CreditTurn(rx.creditPort);
  }
}

void RdmaNic::CreditAdd(Rx& rx, uint64_t flowId, uint64_t bytes) {
  if (rx.creditPort == UINT32_MAX) {
    return;  // the flow does not run under receiver credits
  }
  Port& p = m_ports[rx.creditPort];
  p.credit.Add(flowId, bytes);
  if (!p.creditEv.IsPending()) {
    CreditTurn(rx.creditPort);
  }
}

void RdmaNic::CreditTurn(uint32_t port) {
  Port& p = m_ports[port];
  const uint64_t nowPs = NowNs() * 1000;
  if (p.creditAtPs > nowPs + 999) {  // granted too recently: wait for the pacer
    p.creditEv = SchedulePooled(FabricNs((p.creditAtPs + 999) / 1000 - NowNs()), [this, port] { CreditTurn(port); });
    return;
  }
  uint64_t flowId = 0;
  uint64_t cumulative = 0;
  uint64_t bytes = 0;
  Rx* rx = nullptr;
  while (p.credit.Next(uint64_t{m_creditQuantum} * m_payloadBytes, flowId, cumulative, bytes)) {
    Rx* found = m_rx.Find(flowId);
    if (found != nullptr && !found->done) {
      rx = found;
      break;
    }
    p.credit.Forget(flowId);  // every byte arrived: no more credit
  }
  if (rx == nullptr) {
    return;  // nobody waits: the next request starts the pacer again
  }
  Ptr<PhantoraPacket> pkt = PhantoraPacket::Make();
  PhantoraHeader& c = pkt->hdr;
  c.type = PktType::Credit;
  c.prio = 0;
  c.src = m_id;
  c.dst = rx->creditPeer;
  c.flowId = flowId;
  c.ecmpKey = rx->creditKey;
  c.viaNic = rx->creditViaNic;
  c.tsNs = NowNs();
  c.credit = cumulative;
  const uint32_t out = m_routes->Pick(m_id, m_id, rx->creditPeer, c.ecmpKey, c.viaNic);
  if (out < m_ports.size()) {
    m_ports[out].ctrl.push_back(TxItem{pkt, m_wire.Bytes(c), 0, c.prio, false});
    m_dev[out]->Kick();
  }
  // Pace the grants at the port's rate: the wire bytes of the packets they let in.
  const uint64_t packets = (bytes + m_payloadBytes - 1) / m_payloadBytes;
  const uint64_t wire = bytes + packets * m_wire.Bytes(PhantoraHeader{});
  const auto rate = static_cast<uint64_t>(m_creditRate * static_cast<double>(m_dev[port]->GetRateBps()));
  // on an exact ps timeline: the event fires in the ns the grant fell due, so that ns is not lost to rounding
  p.creditAtPs = std::max(p.creditAtPs, nowPs >= 999 ? nowPs - 999 : 0) + SerialisationPs(wire, rate, p.creditRem);
  p.creditEv = SchedulePooled(FabricNs((p.creditAtPs + 999) / 1000 - NowNs()), [this, port] { CreditTurn(port); });
}

void RdmaNic::Finish(Qp* qp) {
  Conn* conn = qp->conn;
  const size_t at = std::find(conn->open.begin(), conn->open.end(), qp) - conn->open.begin();
  conn->open.erase(conn->open.begin() + static_cast<std::ptrdiff_t>(at));
  std::vector<Qp*>* queue = nullptr;
  size_t queueAt = 0;
  if (qp->spec.queue != 0) {
    auto q = m_queues.find(qp->spec.queue);
    queueAt = std::find(q->second.begin(), q->second.end(), qp) - q->second.begin();
    q->second.erase(q->second.begin() + static_cast<std::ptrdiff_t>(queueAt));
    if (q->second.empty()) {
      m_queues.erase(q);
    } else {
      queue = &q->second;
    }
  }
  RecheckFrom(conn->open, at);  // it no longer holds the messages after it back
  if (queue != nullptr) {
    RecheckFrom(*queue, queueAt);
  }
  if (qp->own) {
    conn->cc->Stop();  // a flow's own queue pair closes with it
  } else if (conn->open.empty()) {
    conn->cc->OnIdle(NowNs());
  }
  m_counters.entropiesExplored += qp->ev.Explored();
  m_counters.entropiesRecycled += qp->ev.Recycled();
  qp->rto.Cancel();
  qp->probe.Cancel();
  Unlist(qp);
  const uint64_t id = qp->spec.id;
  m_doneTx[id] = qp->stats;
  m_qps.Erase(id);  // frees qp
  m_senderDone(id);
}

void RdmaNic::SleekProbe(Qp* qp) {
  const uint64_t now = NowNs();
  if (now < qp->probeAtNs) {
    qp->probe = Simulator::Schedule(NanoSeconds(qp->probeAtNs - now), &RdmaNic::SleekProbe, this, qp);
    return;
  }
  if (qp->rud.InFlightBytes() > 0 && qp->rud.OnTimeout(now, qp->rttNs) > 0) {
    NS_LOG_LOGIC("node " << m_id << " flow " << qp->spec.id << ": no ACK for a probe time, resending");
    Recheck(qp);
    m_dev[qp->port]->Kick();
  }
}

void RdmaNic::ArmRto(Qp* qp) {
  const uint64_t rtoNs = static_cast<uint64_t>(m_rto.GetNanoSeconds());
  if (rtoNs == 0 || qp->rto.IsPending()) {
    return;
  }
  const uint64_t now = NowNs();
  const uint64_t at = std::max(now, qp->lastProgressNs + rtoNs);
  qp->rto = Simulator::Schedule(NanoSeconds(at - now), &RdmaNic::CheckRto, this, qp);
}

void RdmaNic::CheckRto(Qp* qp) {
  if (qp->stalled) {
    return;  // nothing to send on: Repin re-arms it with a route
  }
  const uint64_t now = NowNs();
  if (qp->sndNxt > qp->sndUna && now - qp->lastProgressNs >= static_cast<uint64_t>(m_rto.GetNanoSeconds())) {
    NS_LOG_LOGIC("node " << m_id << " flow " << qp->spec.id << " times out at " << qp->sndUna);
    ++m_counters.timeouts;
    m_timeoutTrace(qp->spec.id, qp->sndUna);
    if (m_entropyMode == EntropyMode::Reps && qp->conn->reps.OnTimeout(now)) {
      ++m_counters.repsFreezes;  // trims report congestion, so a timeout is taken as a failed path
      NS_LOG_LOGIC("node " << m_id << " flow " << qp->spec.id << ": REPS freezes for " << m_repsFreeze);
    }
    const uint64_t resend = m_rxMode == RxMode::Rud ? qp->rud.LostBytes() : qp->sndNxt - qp->sndUna;
    if (m_rxMode == RxMode::Sack) {
      qp->sack.OnTimeout();  // every unacknowledged packet goes again, nothing acknowledged does
    } else if (m_rxMode == RxMode::Rud) {
      qp->rud.OnTimeout(now, static_cast<uint64_t>(m_rto.GetNanoSeconds()));  // those sent an RTO ago
    } else {
      qp->sndNxt = qp->sndUna;
    }
    if (qp->creditOn) {  // resend without waiting for credit (for UET's request to send)
      qp->credit.Allow(m_rxMode == RxMode::Rud ? qp->rud.LostBytes() - resend : resend);
    }
    qp->lastProgressNs = now;
    Recheck(qp);
    m_dev[qp->port]->Kick();
  }
  if (qp->sndNxt > qp->sndUna) {
    ArmRto(qp);
  }
}

void RdmaNic::Wake(uint32_t port, uint64_t atNs) {
  Port& p = m_ports[port];
  if (p.wakeArmed) {
    if (p.wakeNs <= atNs) {
      return;
    }
    p.wake.Cancel();
  }
  p.wakeNs = atNs;
  p.wakeArmed = true;
  p.wake = SchedulePooled(FabricNs(atNs - NowNs()), [this, port] { OnWake(port); });
}

void RdmaNic::OnWake(uint32_t port) {
  m_ports[port].wakeArmed = false;
  m_dev[port]->Kick();
}

uint64_t RdmaNic::GetHeaderSize() const { return m_wire.headerBytes; }
void RdmaNic::SetHeaderSize(uint64_t bytes) { m_wire.headerBytes = static_cast<uint32_t>(bytes); }
uint64_t RdmaNic::GetIntHeaderSize() const { return m_wire.intHeaderBytes; }
void RdmaNic::SetIntHeaderSize(uint64_t bytes) { m_wire.intHeaderBytes = static_cast<uint32_t>(bytes); }
bool RdmaNic::GetIntEnabled() const { return m_wire.intOn; }
void RdmaNic::SetIntEnabled(bool on) { m_wire.intOn = on; }

void RdmaNic::DoDispose() {
  m_qps.ForEach([](uint64_t, Qp& qp) {
    qp.rto.Cancel();
    qp.probe.Cancel();
    if (qp.own) {
      qp.own->cc->Stop();
    }
  });
  for (auto& [id, conn] : m_conns) {
    conn->cc->Stop();
  }
  for (Port& p : m_ports) {
    p.creditEv.Cancel();
  }
  m_qps.Clear();
  m_conns.clear();
  m_rx.Clear();
  m_doneTx.clear();
  m_dev.clear();
  m_ports.clear();
  m_routes = nullptr;
  m_dataComplete.Nullify();
  m_senderDone.Nullify();
  m_baseRtt.Nullify();
  m_bdp.Nullify();
  Object::DoDispose();
}

}  // namespace ns3
