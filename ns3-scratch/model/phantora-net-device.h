// A full-duplex port of the phantora fabric: serialises packets at line rate, obeys PFC per class.
#ifndef PHANTORA_NET_DEVICE_H
#define PHANTORA_NET_DEVICE_H

#include "phantora-packet.h"

#include "ns3/net-device.h"
#include "ns3/node.h"
#include "ns3/packet.h"
#include "ns3/traced-callback.h"

#include <cstdint>
#include <vector>

namespace ns3 {

class PhantoraChannel;

constexpr uint32_t kNumPrio = 8;  ///< traffic classes per port; class 0 is strict-priority control

/// One packet waiting for, or leaving through, a port.
struct TxItem {
  Ptr<PhantoraPacket> pkt;
  uint32_t wireBytes = 0;  ///< bytes the packet occupies on the wire
  uint32_t inPort = 0;     ///< switch ingress port (MMU accounting)
  uint8_t prio = 0;        ///< egress class
  bool data = false;       ///< a data packet (ECN, INT apply)
};

/// What a port asks of the node that owns it (a switch or a NIC).
class PortOwner {
 public:
  virtual ~PortOwner() = default;
  /// Hand the next packet for `port` to the device, or return false. `paused[c]` is the PFC state.
  virtual bool Dequeue(uint32_t port, const bool* paused, TxItem& out) = 0;
  /// A non-PFC packet arrived on `port` (its header is `pkt->hdr`).
  virtual void Receive(uint32_t port, const Ptr<PhantoraPacket>& pkt) = 0;
};

/**
 * A port. It pulls packets from its owner whenever the line is free, times them exactly in
 * picoseconds (so a long run keeps the line rate at any speed, though events fall on whole ns),
 * and hands them to the channel. Received PFC frames pause or resume one class of this port.
 */
class PhantoraNetDevice : public NetDevice {
 public:
  static TypeId GetTypeId();
  PhantoraNetDevice();

  void Setup(PortOwner* owner, uint32_t port, uint64_t rateBps);
  /// The NIC or switch that feeds and receives this port.
  void SetOwner(PortOwner* owner) { m_owner = owner; }
  /// Propagation delay of the attached channel.
  uint64_t GetDelayNs() const;
  void Attach(Ptr<PhantoraChannel> channel);
  /// Start sending if the line is idle and the owner has something.
  void Kick();
  /// Called by the channel when a packet has fully arrived.
  void Receive(const Ptr<PhantoraPacket>& pkt);

  uint64_t GetRateBps() const { return m_rateBps; }
  /// A new line rate from the next packet on (a degraded or restored link).
  void SetRateBps(uint64_t bps);
  /// Resume every paused class (the port's link failed: its PFC state is cleared).
  void ClearPause();
  uint32_t GetPort() const { return m_port; }
  bool IsPaused(uint32_t prio) const { return m_paused[prio]; }
  Ptr<PhantoraNetDevice> GetPeer() const;
  uint64_t GetTxBytes() const { return m_txBytes; }
  uint64_t GetTxPackets() const { return m_txPackets; }
  uint64_t GetPausedNs() const;

  // NetDevice interface (mostly inert: this fabric has no L3 above it).
  void SetIfIndex(const uint32_t index) override;
  uint32_t GetIfIndex() const override;
  Ptr<Channel> GetChannel() const override;
  void SetAddress(Address address) override;
  Address GetAddress() const override;
  bool SetMtu(const uint16_t mtu) override;
  uint16_t GetMtu() const override;
  bool IsLinkUp() const override;
  void AddLinkChangeCallback(Callback<void> callback) override;
  bool IsBroadcast() const override;
  Address GetBroadcast() const override;
  bool IsMulticast() const override;
  Address GetMulticast(Ipv4Address multicastGroup) const override;
  Address GetMulticast(Ipv6Address addr) const override;
  bool IsBridge() const override;
  bool IsPointToPoint() const override;
  bool Send(Ptr<Packet> packet, const Address& dest, uint16_t protocolNumber) override;
  bool SendFrom(Ptr<Packet> packet, const Address& source, const Address& dest, uint16_t protocolNumber) override;
  Ptr<Node> GetNode() const override;
  void SetNode(Ptr<Node> node) override;
  /// GetNode()->GetId() without the Ptr and the call (the context of the events this device receives).
  uint32_t GetNodeId() const { return m_nodeId; }
  bool NeedsArp() const override;
  void SetReceiveCallback(NetDevice::ReceiveCallback cb) override;
  void SetPromiscReceiveCallback(PromiscReceiveCallback cb) override;
  bool SupportsSendFrom() const override;

 protected:
  void DoDispose() override;

 private:
  void TransmitNext();
  void TransmitDone();

  PortOwner* m_owner = nullptr;
  Ptr<Node> m_node;
  uint32_t m_nodeId = 0;
  Ptr<PhantoraChannel> m_channel;
  uint32_t m_ifIndex = 0;
  uint32_t m_port = 0;
  uint64_t m_rateBps = 0;
  uint16_t m_mtu = 1500;
  bool m_busy = false;
  bool m_dequeuing = false;
  bool m_kickPending = false;
  uint64_t m_lastEndPs = 0;  ///< exact end of the last serialisation
  uint64_t m_txRem = 0;      ///< sub-ps remainder of the serialisation times (in bit-ps / rate units)
  bool m_paused[kNumPrio] = {};
  uint64_t m_pausedSinceNs[kNumPrio] = {};
  uint64_t m_pausedNs = 0;  ///< class-ns spent paused, summed
  uint64_t m_txBytes = 0;
  uint64_t m_txPackets = 0;
  TracedCallback<Ptr<const Packet>> m_txTrace;  ///< fed PhantoraPacket::ToPacket(), only when connected
  TracedCallback<uint32_t, uint32_t, bool> m_pfcRxTrace;  ///< (port, class, pause) on a received PFC frame
};

/// The PhantoraNetDevices of `node` in port order (port i = device i), each now fed by `owner`.
std::vector<Ptr<PhantoraNetDevice>> TakePorts(Ptr<Node> node, PortOwner* owner);

}  // namespace ns3

#endif  // PHANTORA_NET_DEVICE_H
