// A point-to-point full-duplex cable between two phantora ports.
#ifndef PHANTORA_CHANNEL_H
#define PHANTORA_CHANNEL_H

#include "phantora-packet.h"

#include "ns3/channel.h"
#include "ns3/ptr.h"
#include "ns3/traced-callback.h"

#include <cstdint>

namespace ns3 {

class PhantoraNetDevice;
class PhantoraCutLink;

/**
 * Two ports and a propagation delay (integer ns). A scenario (docs/scenarios.md) may take the cable down
 * (every packet sent on it, or on the wire when it fails, is lost), add latency, or make it drop data packets
 * at random with a seeded generator (a gray failure; PFC frames are never dropped at random). Lost packets
 * fire the "Lost" trace source and are counted.
 */
class PhantoraChannel : public Channel {
 public:
  static TypeId GetTypeId();

  /// A failure of this cable is scheduled: from now on each packet checks on arrival that it did not fail.
  void ExpectFailure() { m_mayFail = m_slowPath = true; }
  /// Fail (false) or repair (true) the cable: packets on the wire when it fails are lost.
  void SetUp(bool up);
  bool IsUp() const { return m_up; }
  /// A gray failure: extra propagation delay and a random loss rate of data packets in [0, 1), drawn from a
  /// splitmix64 stream seeded by (seed, link); (0, 0) restores the cable.
  void SetDegraded(uint64_t extraDelayNs, double loss, uint64_t seed);
  uint64_t GetLostPackets() const { return m_lostPackets; }
  uint64_t GetLostBytes() const { return m_lostBytes; }
  /// Signature of the "Lost" trace source: (flow id, sequence, true if the cable was down).
  typedef void (*LostTracedCallback)(uint64_t flowId, uint64_t seq, bool down);

  void Attach(Ptr<PhantoraNetDevice> a, Ptr<PhantoraNetDevice> b);
  /// Deliver `pkt` from `from` to the other end: it has fully left `from` at `txEndNs`.
  void Transmit(const PhantoraNetDevice* from, const Ptr<PhantoraPacket>& pkt, uint64_t txEndNs);
  Ptr<PhantoraNetDevice> GetPeer(const PhantoraNetDevice* dev) const;
  /// Cut this cable (parallel packet simulation): its packets go to `cut` as messages, cable `linkId`, instead
  /// of arriving here; nullptr (the default) restores the direct path.
  void SetCut(PhantoraCutLink* cut, uint32_t linkId) {
    m_cut = cut;
    m_linkId = linkId;
    m_slowPath = m_mayFail || m_cut != nullptr;
  }
  /// A packet that crossed the cut arrives at end `end` (0 or 1): lost if the cable failed since failure epoch
  /// `epoch` (UINT64_MAX: no check, no failure was scheduled when it was sent).
  void Arrive(uint32_t end, const Ptr<PhantoraPacket>& pkt, uint64_t epoch);
  uint64_t GetDelayNs() const { return m_delayNs + m_extraDelayNs; }

  std::size_t GetNDevices() const override;
  Ptr<NetDevice> GetDevice(std::size_t i) const override;

 protected:
  void DoDispose() override;

 private:
  void Lose(const Ptr<PhantoraPacket>& pkt, bool down);
  /// Next uniform draw in [0, 1) of the loss stream.
  double Draw();

  uint64_t m_delayNs = 1000;
  Ptr<PhantoraNetDevice> m_dev[2];
  uint32_t m_nodeId[2] = {0, 0};  ///< m_dev[i]'s node id (the context of its arrivals), not read from the cold device
  bool m_up = true;
  bool m_mayFail = false;
  bool m_slowPath = false;  ///< m_mayFail or cut: Transmit's one test on the common path
  uint64_t m_epoch = 0;  ///< failures so far: a packet sent before the last one is lost on arrival
  uint64_t m_extraDelayNs = 0;
  double m_loss = 0.0;
  uint64_t m_rngState = 0;
  uint64_t m_lostPackets = 0;
  uint64_t m_lostBytes = 0;
  TracedCallback<uint64_t, uint64_t, bool> m_lostTrace;
  PhantoraCutLink* m_cut = nullptr;  ///< set when the cable is cut
  uint32_t m_linkId = 0;             ///< the cable's id in the fabric, when cut
};

}  // namespace ns3

#endif  // PHANTORA_CHANNEL_H
