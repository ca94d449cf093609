// Ultra Ethernet transport pieces of the RDMA NIC: reliable unordered delivery (RUD, Receiver = rud) with
// packet sequence numbers, SACK bitmaps and NACKs for trimmed packets, and the sender's entropy choice
// (LoadBalancing = reps: REPS, recycled entropies; oblivious: a fresh permutation of the entropies per round).
#ifndef PHANTORA_UET_TRANSPORT_H
#define PHANTORA_UET_TRANSPORT_H

#include "packet-scoreboard.h"

#include "ns3/ptr.h"
#include "ns3/random-variable-stream.h"

#include <cstdint>
#include <deque>
#include <vector>

namespace ns3 {

/// Bits of the SACK bitmap an ACK carries: packets cum .. cum + 63 (UET's 64-bit SACK bitmap).
constexpr uint32_t kRudBitmapBits = 64;

/**
 * The RUD receiver of one flow, by packet sequence number (PSN = byte seq / payload; every packet but the
 * flow's last is full). It keeps the cumulative point (every packet before it held) and which later packets
 * it holds; Bitmap() is the SACK bitmap of the 64 PSNs from the cumulative point.
 */
class RudReceiver {
 public:
  struct Arrival {
    bool fresh = false;     ///< not held before (else a duplicate)
    bool advanced = false;  ///< the cumulative point moved
  };

  void Configure(uint32_t payload) { m_payload = payload; }
  Arrival Arrive(uint64_t seq, uint32_t len);
  /// Bytes held contiguously from 0.
  uint64_t Cumulative() const { return m_cumBytes; }
  /// Bit i set: the packet at Cumulative() + i x payload is held (bit 0 is never set).
  uint64_t Bitmap() const { return m_bits; }

 private:
  uint32_t m_payload = 1000;
  uint64_t m_cumPsn = 0;
  uint64_t m_cumBytes = 0;
  std::deque<uint32_t> m_held;  ///< entry i: length of the held packet m_cumPsn + i, 0 if missing
  uint64_t m_bits = 0;          ///< bit i: m_held[i] != 0, for i < kRudBitmapBits (kept as packets arrive)
};

/**
 * The RUD sender's record of one flow's packets in flight. A packet is lost only when the receiver says so
 * (a NACK for its trimmed transmission: that transmission, once) or when it is older than the retransmission
 * timeout; no reordering rule, so sprayed packets are never resent for arriving out of order. Lost packets go
 * again, oldest first, before new data. InFlightBytes() (sent, neither acknowledged nor lost) is what the
 * congestion window caps.
 * SLEEK (optional, for losses no NACK reports: drops, failed links): once the packets acknowledged beyond the
 * cumulative point reach a threshold, the sender enters loss recovery until the cumulative point passes what it
 * had sent then, and marks lost every packet from the cumulative point up to a window ahead that is neither
 * acknowledged nor marked, each once per recovery.
 */
class RudSender : public PacketScoreboard {
 public:
  void Configure(uint32_t payload) { m_payload = payload; }
  /// A packet [seq, seq + len) left now (first transmission or retransmission).
  void OnSend(uint64_t seq, uint32_t len, uint64_t nowNs, bool retx);
  /// An ACK: cumulative point `cum` (bytes), the SACK bitmap from it, and the packet it acknowledges
  /// (`ackedSeq`, UINT64_MAX if none). Returns the payload bytes newly known to be received.
  uint64_t OnAck(uint64_t cum, uint64_t bitmap, uint64_t ackedSeq);
  /// A NACK for the packet at `seq` whose transmission sent at `echoNs` was trimmed: marks it lost if that
  /// transmission is still its latest and unacknowledged. Returns its payload bytes if marked, else 0.
  uint32_t OnNack(uint64_t seq, uint64_t echoNs);
  /// Mark lost every unacknowledged packet sent at least `rtoNs` ago; returns how many.
  uint64_t OnTimeout(uint64_t nowNs, uint64_t rtoNs);
  /// SLEEK after an ACK: enter (at `thresholdPackets` acknowledged beyond the cumulative point) or go on with loss
  /// recovery, marking lost the unmarked packets up to `windowBytes` past the cumulative point; returns how many.
  uint64_t Sleek(uint64_t thresholdPackets, uint64_t windowBytes);
  /// Packets acknowledged beyond the cumulative point.
  uint64_t AckedAhead() const { return m_ackedAhead; }
  uint64_t InFlightBytes() const { return m_inFlight; }
  /// Payload bytes marked lost and not resent yet.
  uint64_t LostBytes() const { return m_lostBytes; }

 private:
  uint64_t Ack(Seg& g);
  /// Mark entry i lost (neither acknowledged nor marked) and queue its resend.
  void MarkLost(uint64_t i);

  uint64_t m_inFlight = 0;
  uint64_t m_lostBytes = 0;
  uint64_t m_sentEnd = 0;     ///< one past the highest byte sent
  uint64_t m_ackedAhead = 0;  ///< entries of m_segs acknowledged (beyond the cumulative point)
  bool m_recovery = false;    ///< SLEEK: in loss recovery
  uint64_t m_recoveryEnd = 0; ///< SLEEK: recovery ends when the cumulative point reaches this
  uint64_t m_sleekNext = 0;   ///< SLEEK: the next packet recovery may mark
};

/// How a sending NIC chooses the entropy value of each data packet (NIC attribute LoadBalancing).
enum class EntropyMode : uint8_t { None = 0, Oblivious = 1, Reps = 2 };

/**
 * REPS's freezing mode (htsim's, after the REPS paper), kept per connection across its messages. With trimming
 * on, congestion trims packets instead of dropping them, so a retransmission timeout means a failed path: the
 * sender freezes, stops exploring and cycles through the last `size` entropies whose ACKs came back unmarked
 * (paths that worked), still taking in new good ones, for `freezeNs`; the first feedback after that thaws it: it
 * forgets them and explores `thawExplore` random entropies before recycling again. `freezeNs` 0: never freezes.
 */
class RepsFreeze {
 public:
  void Configure(uint32_t size, uint64_t freezeNs, uint32_t thawExplore);
  bool Frozen() const { return m_frozen; }
  /// A retransmission timeout: freeze, unless off, frozen already or exploring after a thaw. True if it froze.
  bool OnTimeout(uint64_t nowNs);
  /// An ACK's or NACK's feedback: thaw first if the freeze has run out (true then); remember a good entropy.
  bool OnFeedback(uint16_t entropy, bool good, uint64_t nowNs);
  /// Frozen: the next remembered entropy in turn; false if none is remembered.
  bool NextFrozen(uint16_t& entropy);
  /// After a thaw: spend one of the random explorations it owes (false if none is owed).
  bool TakeExplore();
  uint64_t Freezes() const { return m_freezes; }

 private:
  std::vector<uint16_t> m_good;  ///< the last good entropies, a ring written at m_head
  uint32_t m_size = 8;
  uint32_t m_head = 0;
  uint32_t m_cursor = 0;  ///< frozen: the next entry of m_good to use
  uint64_t m_freezeNs = 0;
  uint32_t m_thawExplore = 16;
  uint32_t m_exploreLeft = 0;
  bool m_frozen = false;
  uint64_t m_untilNs = 0;
  uint64_t m_freezes = 0;
};

/**
 * A queue pair's entropy values (UET's EV, which switches hash with the flow key to pick among equal-cost
 * ports). Oblivious: every round draws a random XOR mask and goes through all `entropies` values once in
 * that order (htsim's oblivious multipath). REPS (recycled entropy packet spraying): an ACK that comes back
 * without a CE mark returns its entropy to a ring of `bufferSize`; the next packet reuses the oldest one
 * there, and explores a random entropy when the ring is empty (a CE-marked or NACKed entropy is dropped). With a
 * RepsFreeze (the message's connection's), a frozen connection recycles only what it remembers.
 */
class EntropyPicker {
 public:
  void Configure(EntropyMode mode, uint32_t entropies, uint32_t bufferSize, Ptr<UniformRandomVariable> rng,
                 RepsFreeze* freeze = nullptr);
  EntropyMode Mode() const { return m_mode; }
  uint16_t Next();
  /// The entropy of an acknowledged (good: no CE mark) or CE-marked / NACKed (not good) packet, at `nowNs`.
  void Feedback(uint16_t entropy, bool good, uint64_t nowNs = 0);
  uint64_t Explored() const { return m_explored; }
  uint64_t Recycled() const { return m_recycled; }

 private:
  uint16_t Random();

  EntropyMode m_mode = EntropyMode::None;
  uint32_t m_entropies = 256;
  uint32_t m_bufferSize = 8;
  Ptr<UniformRandomVariable> m_rng;
  RepsFreeze* m_freeze = nullptr;  ///< REPS: the connection's freezing state (not owned), or none
  std::vector<uint16_t> m_ring;  ///< REPS: recycled entropies, a ring of m_bufferSize from m_ringHead
  uint32_t m_ringHead = 0;       ///< REPS: the oldest recycled entropy's slot
  uint32_t m_ringCount = 0;      ///< REPS: recycled entropies held
  uint32_t m_index = 0;         ///< Oblivious: position in this round
  uint32_t m_xor = 0;           ///< Oblivious: this round's mask
  uint64_t m_explored = 0;
  uint64_t m_recycled = 0;
};

}  // namespace ns3

#endif  // PHANTORA_UET_TRANSPORT_H
