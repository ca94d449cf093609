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

#include <algorithm>

namespace ns3 {

NS_LOG_COMPONENT_DEFINE("PhantoraNetDevice");
NS_OBJECT_ENSURE_REGISTERED(PhantoraNetDevice);

TypeId PhantoraNetDevice::GetTypeId() {
  static TypeId tid = PhantoraTypeId<PhantoraNetDevice, NetDevice>("ns3::PhantoraNetDevice")
          .AddTraceSource("Tx", "A packet starts serialisation", MakeTraceSourceAccessor(&PhantoraNetDevice::m_txTrace),
                          "ns3::Packet::TracedCallback")
          .AddTraceSource("PfcRx", "A PFC frame arrived: (port, class, pause)",
                          MakeTraceSourceAccessor(&PhantoraNetDevice::m_pfcRxTrace),
                          "ns3::PhantoraNetDevice::PfcTracedCallback")
          .AddTraceSource("CreditRx",
                          "A link credit frame arrived (credit-based flow control): (port, class, cumulative limit)",
                          MakeTraceSourceAccessor(&PhantoraNetDevice::m_creditRxTrace),
                          "ns3::PhantoraNetDevice::CreditTracedCallback");
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
  if (m_creditDue && m_channel->IsUp() && NextCreditFrame(item)) {
    Send(item);  // link credit goes ahead of whatever the owner has
    return;
  }
  const bool* blocked = m_paused;
  if (m_creditSend) {
    UpdateBlocked();
    blocked = m_blocked;
  }
  bool got = false;
  do {
    m_kickPending = false;
    m_dequeuing = true;
    got = m_owner->Dequeue(m_port, blocked, item);
    m_dequeuing = false;
  } while (!got && m_kickPending);
  if (!got) {
    return;
  }
  const uint32_t c = item.prio % kNumPrio;
  if (m_creditSend && c != 0 && m_channel->IsUp()) {  // a dead cable's packets are lost, not credited
    m_creditSent[c] += item.wireBytes;
    item.pkt->linkCredit = item.wireBytes;
    item.pkt->linkSent = m_creditSent[c];
    item.pkt->linkClass = static_cast<uint8_t>(c);
    UpdateBlocked();
  } else {
    item.pkt->linkCredit = 0;
  }
  Send(item);
}

void PhantoraNetDevice::Send(TxItem& item) {
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
  // Hint: the fields TransmitDone reads first (cold by then on a large fabric).
  ScheduleWithContextPooled(FabricContext(), FabricNs(endNs - nowNs), [this] { TransmitDone(); }, &m_owner);
  m_channel->Transmit(this, item.pkt, endNs);
}

void PhantoraNetDevice::EnableCreditSend(uint64_t creditBytes, uint32_t maxPacketBytes) {
  NS_ASSERT_MSG(creditBytes >= maxPacketBytes, "link credit below one packet");
  m_creditSend = true;
  m_creditMaxPacket = maxPacketBytes;
  for (uint32_t c = 0; c < kNumPrio; ++c) {
    m_creditLimit[c] = creditBytes;
    m_creditSent[c] = 0;
    m_creditOut[c] = false;
  }
}

void PhantoraNetDevice::EnableCreditReturn(uint64_t creditBytes, uint64_t updateBytes, uint32_t frameBytes) {
  m_creditReturn = true;
  m_creditSize = creditBytes;
  m_creditUpdate = std::max<uint64_t>(updateBytes, 1);
  m_creditFrameBytes = frameBytes;
}

int64_t PhantoraNetDevice::CreditAvailable(uint32_t cls) const {
  const uint32_t c = cls % kNumPrio;
  return static_cast<int64_t>(m_creditLimit[c]) - static_cast<int64_t>(m_creditSent[c]);
}

void PhantoraNetDevice::UpdateBlocked() {
  if (m_creditResync && m_channel->IsUp()) {
    // The cable is back: the link's re-initialisation hands over the receiver's counts. Bytes sent but lost on
    // the cable count as received and freed.
    m_creditResync = false;
    PhantoraNetDevice* peer = PeekPointer(GetPeer());
    for (uint32_t c = 1; c < kNumPrio; ++c) {
      if (m_creditSent[c] > peer->m_creditRecv[c]) {
        peer->m_creditFreed[c] += m_creditSent[c] - peer->m_creditRecv[c];
        peer->m_creditRecv[c] = m_creditSent[c];
      }
      peer->m_creditTold[c] = peer->m_creditFreed[c];
      m_creditLimit[c] = std::max(m_creditLimit[c], peer->m_creditFreed[c] + peer->m_creditSize);
    }
  }
  const uint64_t now = FabricNowNs();
  // A dead cable takes packets without credit (they are lost, as without credits); a live one needs a packet's.
  const bool up = m_channel->IsUp();
  m_blocked[0] = m_paused[0];
  for (uint32_t c = 1; c < kNumPrio; ++c) {
    const bool out = up && CreditAvailable(c) < static_cast<int64_t>(m_creditMaxPacket);
    if (out && !m_creditOut[c]) {
      m_creditOutSinceNs[c] = now;
    } else if (!out && m_creditOut[c]) {
      m_creditBlockedNs += now - m_creditOutSinceNs[c];
    }
    m_creditOut[c] = out;
    m_blocked[c] = m_paused[c] || out;
  }
}

bool PhantoraNetDevice::NextCreditFrame(TxItem& item) {
  for (uint32_t c = 1; c < kNumPrio; ++c) {
    if (!(m_creditDue & (1U << c))) {
      continue;
    }
    m_creditDue = static_cast<uint8_t>(m_creditDue & ~(1U << c));
    m_creditTold[c] = m_creditFreed[c];
    Ptr<PhantoraPacket> pkt = PhantoraPacket::Make();
    PhantoraHeader& hdr = pkt->hdr;
    hdr.type = PktType::Pfc;
    hdr.flags = kFlagCredit;
    hdr.prio = static_cast<uint8_t>(c);
    hdr.src = m_nodeId;
    hdr.seq = m_creditFreed[c] + m_creditSize;  // the new cumulative limit
    item = TxItem{pkt, m_creditFrameBytes, m_port, 0, false};
    ++m_creditFrames;
    return true;
  }
  return false;
}

void PhantoraNetDevice::ReturnCredit(uint32_t cls, uint32_t bytes) {
  const uint32_t c = cls % kNumPrio;
  m_creditFreed[c] += bytes;
  if (m_creditFreed[c] - m_creditTold[c] >= m_creditUpdate) {
    m_creditDue = static_cast<uint8_t>(m_creditDue | (1U << c));
    Kick();
  }
}

uint64_t PhantoraNetDevice::GetCreditBlockedNs() const {
  uint64_t total = m_creditBlockedNs;
  const uint64_t now = Simulator::Now().GetNanoSeconds();
  for (uint32_t c = 1; c < kNumPrio; ++c) {
    if (m_creditOut[c]) {
      total += now - m_creditOutSinceNs[c];
    }
  }
  return total;
}

void PhantoraNetDevice::TransmitDone() {
  m_busy = false;
  TransmitNext();
}

void PhantoraNetDevice::Receive(const Ptr<PhantoraPacket>& pkt) {
  const PhantoraHeader& hdr = pkt->hdr;
  if (hdr.type == PktType::Pfc && (hdr.flags & kFlagCredit)) {  // link credit (credit-based flow control)
    const uint32_t c = hdr.prio % kNumPrio;
    m_creditLimit[c] = std::max(m_creditLimit[c], hdr.seq);
    NS_LOG_LOGIC("port " << m_port << " class " << c << " credit limit " << m_creditLimit[c]);
    m_creditRxTrace(m_port, c, m_creditLimit[c]);
    if (m_creditSend) {
      UpdateBlocked();
      if (!m_blocked[c]) {
        Kick();
      }
    }
    return;
  }
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
  if (m_creditReturn && pkt->linkCredit) {
    const uint32_t c = pkt->linkClass % kNumPrio;
    const uint64_t expected = m_creditRecv[c] + pkt->linkCredit;
    m_creditRecv[c] = pkt->linkSent;
    if (pkt->linkSent > expected) {
      ReturnCredit(c, static_cast<uint32_t>(pkt->linkSent - expected));  // the link lost packets in between
    }
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
  if (m_creditSend) {
    m_creditResync = true;  // the counts are taken over when the cable is up again
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
