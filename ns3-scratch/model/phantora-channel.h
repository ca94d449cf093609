// A point-to-point full-duplex cable between two phantora ports.
#ifndef PHANTORA_CHANNEL_H
#define PHANTORA_CHANNEL_H

#include "phantora-packet.h"

#include "ns3/channel.h"
#include "ns3/ptr.h"

#include <cstdint>

namespace ns3 {

class PhantoraNetDevice;

/// Two ports and a propagation delay (integer ns).
class PhantoraChannel : public Channel {
 public:
  static TypeId GetTypeId();

  void Attach(Ptr<PhantoraNetDevice> a, Ptr<PhantoraNetDevice> b);
  /// Deliver `pkt` from `from` to the other end: it has fully left `from` at `txEndNs`.
  void Transmit(const PhantoraNetDevice* from, const Ptr<PhantoraPacket>& pkt, uint64_t txEndNs);
  Ptr<PhantoraNetDevice> GetPeer(const PhantoraNetDevice* dev) const;
  uint64_t GetDelayNs() const { return m_delayNs; }

  std::size_t GetNDevices() const override;
  Ptr<NetDevice> GetDevice(std::size_t i) const override;

 protected:
  void DoDispose() override;

 private:
  uint64_t m_delayNs = 1000;
  Ptr<PhantoraNetDevice> m_dev[2];
};

}  // namespace ns3

#endif  // PHANTORA_CHANNEL_H
