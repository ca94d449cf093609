// PhantoraChannel: schedules the arrival of a packet at the far port.
#include "phantora-channel.h"
#include "phantora-type-id.h"

#include "phantora-event.h"
#include "phantora-net-device.h"

#include "ns3/log.h"
#include "ns3/simulator.h"
#include "ns3/uinteger.h"

namespace ns3 {

NS_LOG_COMPONENT_DEFINE("PhantoraChannel");
NS_OBJECT_ENSURE_REGISTERED(PhantoraChannel);

TypeId PhantoraChannel::GetTypeId() {
  static TypeId tid = PhantoraTypeId<PhantoraChannel, Channel>("ns3::PhantoraChannel")
                          .AddAttribute("DelayNs", "Propagation delay in ns", UintegerValue(1000),
                                        MakeUintegerAccessor(&PhantoraChannel::m_delayNs),
                                        MakeUintegerChecker<uint64_t>());
  return tid;
}

void PhantoraChannel::Attach(Ptr<PhantoraNetDevice> a, Ptr<PhantoraNetDevice> b) {
  m_dev[0] = a;
  m_dev[1] = b;
}

Ptr<PhantoraNetDevice> PhantoraChannel::GetPeer(const PhantoraNetDevice* dev) const {
  return PeekPointer(m_dev[0]) == dev ? m_dev[1] : m_dev[0];
}

void PhantoraChannel::Transmit(const PhantoraNetDevice* from, const Ptr<PhantoraPacket>& pkt, uint64_t txEndNs) {
  PhantoraNetDevice* peer = PeekPointer(m_dev[0]) == from ? PeekPointer(m_dev[1]) : PeekPointer(m_dev[0]);
  const uint64_t now = FabricNowNs();
  const Time delay = FabricNs(txEndNs - now + m_delayNs);
  ScheduleWithContextPooled(peer->GetNodeId(), delay, [peer, p = pkt] { peer->Receive(p); });
}

std::size_t PhantoraChannel::GetNDevices() const { return 2; }

Ptr<NetDevice> PhantoraChannel::GetDevice(std::size_t i) const { return m_dev[i]; }

void PhantoraChannel::DoDispose() {
  m_dev[0] = nullptr;
  m_dev[1] = nullptr;
  Channel::DoDispose();
}

}  // namespace ns3
