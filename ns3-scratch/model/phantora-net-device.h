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
  uint32_t creditBytes = 0;  ///< link credit owed to the ingress port's sender once this leaves the buffer
  uint8_t creditClass = 0;   ///< the class that credit is of
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
 *
 * Credit-based flow control (hop by hop, as InfiniBand's and the Ultra Ethernet link layer's CBFC), set up by a
 * switch with CreditFlowControl for each of its ports: the sending side of a link holds, per data class 1..7, a
 * cumulative credit limit from the receiving switch and sends a class only while limit - bytes sent >= the
 * largest packet; the receiving side sums the bytes its switch has freed (ReturnCredit) and, each `update` bytes,
 * sends a credit frame (a PFC-type link frame with kFlagCredit carrying freed + credit size as the new limit)
 * ahead of anything its owner has. Class 0 (control, trimmed headers) is never credited. A cable failure
 * resynchronises the sender to what the receiver got (ClearPause), as InfiniBand's FCTBS does; bytes lost to a
 * degraded link's random loss are not given back (a leak the model does not repair).
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
  /// Resume every paused class (the port's link failed: its PFC state is cleared) and resynchronise link
  /// credit: bytes sent but never received are given back.
  void ClearPause();
  /// Credit-based flow control, sending side: each data class may have `creditBytes` in the peer switch's buffer,
  /// and a class is eligible while at least `maxPacketBytes` of its credit is left.
  void EnableCreditSend(uint64_t creditBytes, uint32_t maxPacketBytes);
  /// Credit-based flow control, receiving side: the owner returns the credit of what it frees (ReturnCredit);
  /// a credit frame of `frameBytes` goes upstream every `updateBytes` freed in a class (at least one per packet
  /// when updateBytes is 0 or 1).
  void EnableCreditReturn(uint64_t creditBytes, uint64_t updateBytes, uint32_t frameBytes);
  /// The owner freed `bytes` of class `cls` that arrived on this port with link credit.
  void ReturnCredit(uint32_t cls, uint32_t bytes);
  bool CreditSendEnabled() const { return m_creditSend; }
  /// Credit left to the sending side in class `cls` (bytes; negative when a control packet overdrew it).
  int64_t CreditAvailable(uint32_t cls) const;
  uint64_t GetCreditFrames() const { return m_creditFrames; }
  /// Class-ns this sending port spent with a class out of credit, summed over classes.
  uint64_t GetCreditBlockedNs() const;
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
  /// The exact end (ps) of the packet this device is serialising now, 0 when the line is free: nothing it queues
  /// starts before it (PfcSwitch::LastByteQueued's bound).
  uint64_t TxEndPs() const { return m_busy ? m_lastEndPs : 0; }
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
  /// Serialise `item` onto the channel (the line is free).
  void Send(TxItem& item);
  /// The next due credit frame, if any (true: `item` holds it).
  bool NextCreditFrame(TxItem& item);
  /// Refresh m_blocked (PFC pause or no credit) and the credit-blocked time.
  void UpdateBlocked();

  // What every packet this port sends or receives reads (Kick, TransmitNext, Send, Receive), first and together:
  // a port is cold when its next packet comes (thousands of ports in a large fabric), so these take two cache
  // lines, not one each as they did spread over the object.
  PortOwner* m_owner = nullptr;
  Ptr<PhantoraChannel> m_channel;
  uint64_t m_rateBps = 0;
  uint64_t m_lastEndPs = 0;  ///< exact end of the last serialisation
  uint64_t m_txRem = 0;      ///< sub-ps remainder of the serialisation times (in bit-ps / rate units)
  uint64_t m_txBytes = 0;
  uint64_t m_txPackets = 0;
  uint32_t m_port = 0;
  uint32_t m_nodeId = 0;
  bool m_busy = false;
  bool m_dequeuing = false;
  bool m_kickPending = false;
  bool m_creditSend = false;    ///< credit-based flow control, sending side (below)
  bool m_creditReturn = false;  ///< ... receiving side
  uint8_t m_creditDue = 0;      ///< bit c: a credit frame of class c is due
  bool m_paused[kNumPrio] = {};
  TracedCallback<Ptr<const Packet>> m_txTrace;  ///< fed PhantoraPacket::ToPacket(), only when connected

  Ptr<Node> m_node;
  uint32_t m_ifIndex = 0;
  uint16_t m_mtu = 1500;
  uint64_t m_pausedSinceNs[kNumPrio] = {};
  uint64_t m_pausedNs = 0;  ///< class-ns spent paused, summed
  // Credit-based flow control (classes 1..7; index 0 unused). Sending side:
  uint32_t m_creditMaxPacket = 0;
  uint64_t m_creditLimit[kNumPrio] = {};  ///< cumulative: the bytes the receiver lets us have sent
  uint64_t m_creditSent[kNumPrio] = {};   ///< cumulative bytes sent with credit
  bool m_blocked[kNumPrio] = {};          ///< paused, or out of credit: what Dequeue is given
  bool m_creditOut[kNumPrio] = {};
  uint64_t m_creditOutSinceNs[kNumPrio] = {};
  uint64_t m_creditBlockedNs = 0;
  bool m_creditResync = false;  ///< the link failed: take the receiver's counts when it is up again
  // Receiving side:
  uint64_t m_creditSize = 0;
  uint64_t m_creditUpdate = 1;
  uint32_t m_creditFrameBytes = 64;
  uint64_t m_creditRecv[kNumPrio] = {};   ///< cumulative bytes received with credit (a failure's resync)
  uint64_t m_creditFreed[kNumPrio] = {};  ///< cumulative bytes freed by the owner
  uint64_t m_creditTold[kNumPrio] = {};   ///< m_creditFreed as of the last credit frame
  uint64_t m_creditFrames = 0;
  TracedCallback<uint32_t, uint32_t, uint64_t> m_creditRxTrace;  ///< (port, class, new cumulative limit)
  TracedCallback<uint32_t, uint32_t, bool> m_pfcRxTrace;  ///< (port, class, pause) on a received PFC frame
};

/// The PhantoraNetDevices of `node` in port order (port i = device i), each now fed by `owner`.
std::vector<Ptr<PhantoraNetDevice>> TakePorts(Ptr<Node> node, PortOwner* owner);

}  // namespace ns3

#endif  // PHANTORA_NET_DEVICE_H
