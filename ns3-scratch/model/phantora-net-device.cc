// PhantoraNetDevice: line-rate serialisation with picosecond carry, PFC pause per class.
#include "phantora-net-device.h"
#include "phantora-type-id.h"

#include "phantora-channel.h"
#include "phantora-event.h"
#include "wire-format.h"

#include "ns3/log.h"
#include "ns3/mac48-address.h"
#include "ns3/simulator.h"
#include "ns3/trace-source-accessor.h"

namespace ns3 {

NS_LOG_COMPONENT_DEFINE("PhantoraNetDevice");
NS_OBJECT_ENSURE_REGISTERED(PhantoraNetDevice);

TypeId PhantoraNetDevice::GetTypeId() {
  static TypeId tid = PhantoraTypeId<PhantoraNetDevice, NetDevice>("ns3::PhantoraNetDevice")
          .AddTraceSource("Tx", "A packet starts serialisation", MakeTraceSourceAccessor(&PhantoraNetDevice::m_txTrace),
                          "ns3::Packet::TracedCallback")
          .AddTraceSource("PfcRx", "A PFC frame arrived: (port, class, pause)",
                          MakeTraceSourceAccessor(&PhantoraNetDevice::m_pfcRxTrace),
                          "ns3::PhantoraNetDevice::PfcTracedCallback");
  return tid;
}

PhantoraNetDevice::PhantoraNetDevice() = default;

void PhantoraNetDevice::Setup(PortOwner* owner, uint32_t port, uint64_t rateBps) {
  m_owner = owner;
  m_port = port;
  m_rateBps = rateBps;
}

void PhantoraNetDevice::Attach(Ptr<PhantoraChannel> channel) { m_channel = channel; }

std::vector<Ptr<PhantoraNetDevice>> TakePorts(Ptr<Node> node, PortOwner* owner) {
  std::vector<Ptr<PhantoraNetDevice>> ports;
  for (uint32_t i = 0; i < node->GetNDevices(); ++i) {
    Ptr<PhantoraNetDevice> dev = DynamicCast<PhantoraNetDevice>(node->GetDevice(i));
    NS_ASSERT_MSG(dev, "node " << node->GetId() << ": device " << i << " is not a PhantoraNetDevice");
    dev->SetOwner(owner);
    ports.push_back(dev);
  }
  return ports;
}

uint64_t PhantoraNetDevice::GetDelayNs() const { return m_channel ? m_channel->GetDelayNs() : 0; }

Ptr<PhantoraNetDevice> PhantoraNetDevice::GetPeer() const { return m_channel->GetPeer(this); }

void PhantoraNetDevice::Kick() {
  if (m_dequeuing) {
    m_kickPending = true;  // the owner enqueued for this port from inside its own Dequeue
    return;
  }
  if (!m_busy) {
    TransmitNext();
  }
}

void PhantoraNetDevice::TransmitNext() {
  TxItem item;
  bool got = false;
  do {
    m_kickPending = false;
    m_dequeuing = true;
    got = m_owner->Dequeue(m_port, m_paused, item);
    m_dequeuing = false;
  } while (!got && m_kickPending);
  if (!got) {
    return;
  }
  const uint64_t nowPs = FabricNowNs() * 1000;
  // Back to back with the previous packet (we are at its end, rounded up to a whole ns): keep the
  // exact end, so the fractions of a ns do not add up to a lower line rate.
  const uint64_t startPs = (nowPs >= m_lastEndPs && nowPs - m_lastEndPs < 1000) ? m_lastEndPs : nowPs;
  // Serialisation time in ps; the remainder carries over, so even 3.6 Tb/s keeps its exact rate.
  const uint64_t txPs = SerialisationPs(item.wireBytes, m_rateBps, m_txRem);
  m_lastEndPs = startPs + txPs;
  const uint64_t endNs = (m_lastEndPs + 999) / 1000;
  m_busy = true;
  m_txBytes += item.wireBytes;
  ++m_txPackets;
  if (!m_txTrace.IsEmpty()) {
    m_txTrace(item.pkt->ToPacket());
  }
  const uint64_t nowNs = nowPs / 1000;
  // Never cancelled: scheduled with its context (as Schedule does) to skip making an EventId.
  ScheduleWithContextPooled(FabricContext(), FabricNs(endNs - nowNs), [this] { TransmitDone(); });
  m_channel->Transmit(this, item.pkt, endNs);
}

void PhantoraNetDevice::TransmitDone() {
  m_busy = false;
  TransmitNext();
}

void PhantoraNetDevice::Receive(const Ptr<PhantoraPacket>& pkt) {
  const PhantoraHeader& hdr = pkt->hdr;
  if (hdr.type == PktType::Pfc) {
    const uint32_t c = hdr.prio % kNumPrio;
    const bool pause = hdr.flags & kFlagPause;
    const uint64_t now = FabricNowNs();
    NS_LOG_LOGIC("port " << m_port << " class " << c << (pause ? " paused" : " resumed"));
    if (pause && !m_paused[c]) {
      m_pausedSinceNs[c] = now;
    } else if (!pause && m_paused[c]) {
      m_pausedNs += now - m_pausedSinceNs[c];
    }
    m_paused[c] = pause;
    m_pfcRxTrace(m_port, c, pause);
    if (!pause) {
      Kick();
    }
    return;
  }
  m_owner->Receive(m_port, pkt);
}

void PhantoraNetDevice::SetRateBps(uint64_t bps) {
  NS_ASSERT_MSG(bps > 0, "a port's rate must be > 0");
  m_rateBps = bps;
  m_txRem = 0;
}

void PhantoraNetDevice::ClearPause() {
  const uint64_t now = FabricNowNs();
  bool any = false;
  for (uint32_t c = 0; c < kNumPrio; ++c) {
    if (m_paused[c]) {
      m_pausedNs += now - m_pausedSinceNs[c];
      m_paused[c] = false;
      any = true;
    }
  }
  if (any) {
    Kick();
  }
}

uint64_t PhantoraNetDevice::GetPausedNs() const {
  uint64_t total = m_pausedNs;
  const uint64_t now = Simulator::Now().GetNanoSeconds();
  for (uint32_t c = 0; c < kNumPrio; ++c) {
    if (m_paused[c]) {
      total += now - m_pausedSinceNs[c];
    }
  }
  return total;
}

void PhantoraNetDevice::DoDispose() {
  m_owner = nullptr;
  m_node = nullptr;
  m_channel = nullptr;
  NetDevice::DoDispose();
}

// ----- NetDevice boilerplate ------------------------------------------------------------------
void PhantoraNetDevice::SetIfIndex(const uint32_t index) { m_ifIndex = index; }
uint32_t PhantoraNetDevice::GetIfIndex() const { return m_ifIndex; }
Ptr<Channel> PhantoraNetDevice::GetChannel() const { return m_channel; }
void PhantoraNetDevice::SetAddress(Address) {}
Address PhantoraNetDevice::GetAddress() const { return Mac48Address(); }
bool PhantoraNetDevice::SetMtu(const uint16_t mtu) {
  m_mtu = mtu;
  return true;
}
uint16_t PhantoraNetDevice::GetMtu() const { return m_mtu; }
bool PhantoraNetDevice::IsLinkUp() const { return m_channel != nullptr; }
void PhantoraNetDevice::AddLinkChangeCallback(Callback<void>) {}
bool PhantoraNetDevice::IsBroadcast() const { return false; }
Address PhantoraNetDevice::GetBroadcast() const { return Mac48Address::GetBroadcast(); }
bool PhantoraNetDevice::IsMulticast() const { return false; }
Address PhantoraNetDevice::GetMulticast(Ipv4Address) const { return Mac48Address(); }
Address PhantoraNetDevice::GetMulticast(Ipv6Address) const { return Mac48Address(); }
bool PhantoraNetDevice::IsBridge() const { return false; }
bool PhantoraNetDevice::IsPointToPoint() const { return true; }
bool PhantoraNetDevice::Send(Ptr<Packet>, const Address&, uint16_t) { return false; }
bool PhantoraNetDevice::SendFrom(Ptr<Packet>, const Address&, const Address&, uint16_t) { return false; }
Ptr<Node> PhantoraNetDevice::GetNode() const { return m_node; }
void PhantoraNetDevice::SetNode(Ptr<Node> node) {
  m_node = node;
  m_nodeId = node ? node->GetId() : 0;
}
bool PhantoraNetDevice::NeedsArp() const { return false; }
void PhantoraNetDevice::SetReceiveCallback(NetDevice::ReceiveCallback) {}
void PhantoraNetDevice::SetPromiscReceiveCallback(PromiscReceiveCallback) {}
bool PhantoraNetDevice::SupportsSendFrom() const { return false; }

}  // namespace ns3
