// The selective-acknowledgement transport of the RDMA NIC (Receiver = sack): the receiver's set of
// received byte ranges and the sender's scoreboard with RACK-style loss detection.
#ifndef PHANTORA_SACK_TRANSPORT_H
#define PHANTORA_SACK_TRANSPORT_H

#include "packet-scoreboard.h"

#include <algorithm>
#include <cstdint>
#include <map>

namespace ns3 {

/// How the receiving NIC treats out-of-order data (NIC attribute Receiver).
enum class RxMode : uint8_t { GoBackN = 0, Sack = 1, Rud = 2, Rod = 3 };  // Rud, Rod: uet-transport.h

/// Per-flow transport counters (flows.csv): retransmissions at the sender, reordering at the receiver.
struct FlowTransportStats {
  uint64_t retxPackets = 0;      ///< data packets sent again
  uint64_t retxBytes = 0;        ///< their payload bytes
  uint64_t oooPackets = 0;       ///< data packets that arrived with a hole before them
  uint64_t reorderMaxBytes = 0;  ///< the furthest a packet arrived ahead of the first missing byte (seq - hole)
};

/**
 * The receiver's byte ranges of one flow: a cumulative point (every byte before it arrived) and the
 * blocks received beyond it. Arrive() files a packet and says what the ACK should carry.
 */
class SackReceiver {
 public:
  struct Arrival {
    uint64_t newBytes = 0;  ///< bytes not received before
    bool advanced = false;  ///< the cumulative point moved
    uint64_t blockLo = 0;   ///< the received block now holding the packet (empty if below the cumulative point)
    uint64_t blockHi = 0;
  };

  uint64_t Cumulative() const { return m_cum; }
  /// Bytes held beyond the first hole.
  uint64_t BufferedBytes() const { return m_buffered; }
  Arrival Arrive(uint64_t seq, uint32_t len);

 private:
  uint64_t m_cum = 0;
  uint64_t m_buffered = 0;
  std::map<uint64_t, uint64_t> m_blocks;  ///< start -> end, disjoint, not touching, all > m_cum
};

/**
 * The sender's record of one flow's packets in flight (sndUna .. sndNxt), one entry per packet.
 * Loss rule (RACK, RFC 8985, without its adaptive window): an unacknowledged packet is lost once a
 * packet sent more than `reorderWindowNs` after it has been acknowledged (cumulatively or by a SACK
 * block); lost packets are retransmitted, oldest first, before new data. A retransmission timeout
 * marks every unacknowledged packet lost. A duplicate reported by the receiver (DSACK) shows a
 * retransmission was spurious: the window then doubles, up to 16 times its start (RACK grows it likewise).
 */
class SackSender : public PacketScoreboard {
 public:
  void Configure(uint32_t payload, uint64_t reorderWindowNs) {
    m_payload = payload;
    m_windowNs = reorderWindowNs;
    m_baseWindowNs = reorderWindowNs;
  }
  /// A packet [seq, seq + len) left now (first transmission or retransmission).
  void OnSend(uint64_t seq, uint32_t len, uint64_t nowNs, bool retx);
  /// An ACK: cumulative point `cum`, a SACK block [lo, hi) (empty if lo >= hi), echoing the send time
  /// `echoNs` of the packet that triggered it. Returns the bytes newly known to be received.
  uint64_t OnAck(uint64_t cum, uint64_t lo, uint64_t hi, uint64_t echoNs);
  /// The receiver got a packet twice: widen the reordering window.
  void OnDsack() { m_windowNs = std::min(2 * m_windowNs, 16 * m_baseWindowNs); }
  uint64_t WindowNs() const { return m_windowNs; }
  /// Mark every unacknowledged packet lost (retransmission timeout).
  void OnTimeout();

 private:
  void DetectLosses();

  uint64_t m_windowNs = 0;
  uint64_t m_baseWindowNs = 0;
  uint64_t m_rackNs = 0;  ///< latest send time among acknowledged packets
};

}  // namespace ns3

#endif  // PHANTORA_SACK_TRANSPORT_H
