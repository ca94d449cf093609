// PhantoraChannel: schedules the arrival of a packet at the far port.
#include "phantora-channel.h"
#include "phantora-type-id.h"

#include "phantora-cut-link.h"
#include "phantora-event.h"
#include "phantora-net-device.h"

#include "ns3/log.h"
#include "ns3/simulator.h"
#include "ns3/trace-source-accessor.h"
#include "ns3/uinteger.h"

namespace ns3 {

NS_LOG_COMPONENT_DEFINE("PhantoraChannel");
NS_OBJECT_ENSURE_REGISTERED(PhantoraChannel);

TypeId PhantoraChannel::GetTypeId() {
  static TypeId tid = PhantoraTypeId<PhantoraChannel, Channel>("ns3::PhantoraChannel")
                          .AddAttribute("DelayNs", "Propagation delay in ns", UintegerValue(1000),
                                        MakeUintegerAccessor(&PhantoraChannel::m_delayNs),
                                        MakeUintegerChecker<uint64_t>())
                          .AddTraceSource("Lost", "A packet lost on this cable: (flow, seq, cable down)",
                                          MakeTraceSourceAccessor(&PhantoraChannel::m_lostTrace),
                                          "ns3::PhantoraChannel::LostTracedCallback");
  return tid;
}

void PhantoraChannel::Attach(Ptr<PhantoraNetDevice> a, Ptr<PhantoraNetDevice> b) {
  m_dev[0] = a;
  m_dev[1] = b;
  m_nodeId[0] = a->GetNodeId();  // the devices are on their nodes by now (PhantoraFabric::AddLink)
  m_nodeId[1] = b->GetNodeId();
}

Ptr<PhantoraNetDevice> PhantoraChannel::GetPeer(const PhantoraNetDevice* dev) const {
  return PeekPointer(m_dev[0]) == dev ? m_dev[1] : m_dev[0];
}

void PhantoraChannel::SetUp(bool up) {
  if (m_up && !up) {
    ++m_epoch;
  }
  NS_LOG_INFO("cable " << m_dev[0]->GetNodeId() << "-" << m_dev[1]->GetNodeId() << (up ? " up" : " down"));
  m_up = up;
}

void PhantoraChannel::SetDegraded(uint64_t extraDelayNs, double loss, uint64_t seed) {
  m_extraDelayNs = extraDelayNs;
  m_loss = loss;
  m_rngState = seed * 0x9E3779B97F4A7C15ULL + m_dev[0]->GetNodeId() * 0xBF58476D1CE4E5B9ULL + m_dev[1]->GetNodeId();
}

double PhantoraChannel::Draw() {
  uint64_t z = (m_rngState += 0x9E3779B97F4A7C15ULL);  // splitmix64
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  z ^= z >> 31;
  return static_cast<double>(z >> 11) * 0x1.0p-53;
}

void PhantoraChannel::Lose(const Ptr<PhantoraPacket>& pkt, bool down) {
  ++m_lostPackets;
  m_lostBytes += pkt->hdr.payload;
  NS_LOG_LOGIC("lost flow " << pkt->hdr.flowId << " seq " << pkt->hdr.seq << (down ? " (cable down)" : ""));
  m_lostTrace(pkt->hdr.flowId, pkt->hdr.seq, down);
}

void PhantoraChannel::Transmit(const PhantoraNetDevice* from, const Ptr<PhantoraPacket>& pkt, uint64_t txEndNs) {
  const uint32_t end = PeekPointer(m_dev[0]) == from ? 1 : 0;
  PhantoraNetDevice* peer = PeekPointer(m_dev[end]);
  if (!m_up) {
    Lose(pkt, true);
    return;
  }
  if (m_loss > 0.0 && pkt->hdr.type != PktType::Pfc && Draw() < m_loss) {
    Lose(pkt, false);
    return;
  }
  const uint64_t now = FabricNowNs();
  const Time delay = FabricNs(txEndNs - now + m_delayNs + m_extraDelayNs);
  if (!m_slowPath) [[likely]] {  // no failure scheduled, not cut: no check on arrival (the common case)
    // Hint: the packet, whose first line Receive reads first (cold by then: it left here a link delay before).
    ScheduleWithContextPooled(m_nodeId[end], delay, [peer, p = pkt] { peer->Receive(p); }, PeekPointer(pkt));
    return;
  }
  if (m_cut) {
    m_cut->Send(m_linkId, end, pkt, txEndNs + m_delayNs + m_extraDelayNs,
                m_mayFail ? m_epoch : UINT64_MAX);
    return;
  }
  ScheduleWithContextPooled(m_nodeId[end], delay, [this, peer, p = pkt, epoch = m_epoch] {
    if (epoch != m_epoch) {
      Lose(p, true);  // the cable failed while the packet was on it
      return;
    }
    peer->Receive(p);
  });
}

void PhantoraChannel::Arrive(uint32_t end, const Ptr<PhantoraPacket>& pkt, uint64_t epoch) {
  if (epoch != UINT64_MAX && epoch != m_epoch) {
    Lose(pkt, true);  // the cable failed while the packet was on it
    return;
  }
  m_dev[end]->Receive(pkt);
}

std::size_t PhantoraChannel::GetNDevices() const { return 2; }

Ptr<NetDevice> PhantoraChannel::GetDevice(std::size_t i) const { return m_dev[i]; }

void PhantoraChannel::DoDispose() {
  m_dev[0] = nullptr;
  m_dev[1] = nullptr;
  Channel::DoDispose();
}

}  // namespace ns3
