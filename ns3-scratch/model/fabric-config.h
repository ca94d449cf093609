// Run-wide settings, counters and callbacks shared by the NICs and switches of one phantora fabric.
#ifndef PHANTORA_FABRIC_CONFIG_H
#define PHANTORA_FABRIC_CONFIG_H

#include "phantora-header.h"

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace ns3 {

/// Every knob of the fabric; defaults follow the HPCC reference models (REFERENCE.md section 5).
struct FabricConfig {
  // Packets.
  uint32_t payloadBytes = 1000;    ///< data payload per packet
  uint32_t headerBytes = 48;       ///< per-packet header overhead on the wire (data and ACK)
  uint32_t intHeaderBytes = 42;    ///< INT space reserved in data packets and ACKs when INT is on
  uint32_t pfcBytes = 64;          ///< PFC frame size
  // Switch buffer and PFC.
  bool pfc = true;
  uint64_t bufferBytes = 0;        ///< per switch; 0 = 16 * bw / 50 MiB, bw = fastest port in Gb/s
  uint64_t reserveBytes = 4096;    ///< per ingress (port, class)
  uint64_t resumeOffsetBytes = 3072;
  uint32_t dtShift = 3;            ///< dynamic threshold = free >> dtShift
  double headroomFactor = 3.0;     ///< headroom per port = factor * rate * link delay
  uint64_t headroomBytes = 0;      ///< fixed headroom per port (overrides the factor when > 0)
  // ECN (RED at dequeue); maps by link rate in bit/s, missing rates scale from 100G = 400KB/1600KB/0.2.
  bool ecn = true;
  std::map<uint64_t, uint64_t> kminBytes;
  std::map<uint64_t, uint64_t> kmaxBytes;
  std::map<uint64_t, double> pmax;
  // NIC.
  uint32_t ackInterval = 1;        ///< ACK every n in-order data packets (and always on the last / a CE mark)
  bool ackHighPrio = true;         ///< ACK/NACK in strict-priority class 0
  uint64_t nackIntervalNs = 500000;  ///< minimum gap between two NACKs for the same hole (HPCC: 500 us)
  int64_t rtoNs = -1;              ///< go-back-N timeout; -1 = off with PFC, 1 ms without; 0 = off
  bool globalT = true;             ///< CC sees the fabric-wide max base RTT / BDP (HPCC GLOBAL_T)
  uint64_t ccBaseRttNs = 0;        ///< override of the base RTT given to the CC (0 = computed)
  uint64_t ccBdpBytes = 0;         ///< override of the BDP given to the CC (0 = computed)
  // Congestion control.
  std::string cc = "ns3::CcNone";
  std::vector<std::pair<std::string, std::string>> ccAttributes;
  int intMode = -1;                ///< INT stamping: -1 = when the CC wants it, 0 = off, 1 = on
  // Observation.
  uint64_t queueSampleNs = 0;      ///< sample switch queues every n ns (0 = off)
  bool traceDrops = true;
  bool traceCnp = true;            ///< record every CNP (time, sender, flow) for DrainCnps
  bool traceEcn = true;            ///< record every CE mark (time, switch, port, class, flow) for DrainEcnMarks
  uint32_t seed = 1;
  std::string scheduler = "ns3::MapScheduler";
};

/// Fabric-wide counters.
struct FabricStats {
  uint64_t dataPackets = 0;
  uint64_t retxPackets = 0;
  uint64_t acks = 0;
  uint64_t nacks = 0;
  uint64_t timeouts = 0;
  uint64_t cnps = 0;         ///< ACKs received with ECN echo
  uint64_t drops = 0;
  uint64_t ecnMarks = 0;
  uint64_t pfcPause = 0;
  uint64_t pfcResume = 0;
  uint64_t payloadBytesDelivered = 0;
};

/// What NICs need from the fabric that owns them.
class FabricContext {
 public:
  virtual ~FabricContext() = default;
  virtual uint64_t CcBaseRttNs(uint32_t src, uint32_t dst, uint64_t key) = 0;
  virtual uint64_t CcBdpBytes(uint32_t src, uint32_t dst, uint64_t key) = 0;
  /// The receiver holds every byte of the flow.
  virtual void DataComplete(uint64_t flowId) = 0;
  /// The sender has every byte acknowledged.
  virtual void SenderDone(uint64_t flowId) = 0;
};

/// Bytes a packet occupies on the wire.
inline uint32_t WireBytes(const FabricConfig& cfg, const PhantoraHeader& h, bool intOn) {
  switch (h.type) {
    case PktType::Data:
      return h.payload + cfg.headerBytes + (intOn ? cfg.intHeaderBytes : 0);
    case PktType::Pfc:
      return cfg.pfcBytes;
    default:
      return cfg.headerBytes + (intOn ? cfg.intHeaderBytes : 0);
  }
}

}  // namespace ns3

#endif  // PHANTORA_FABRIC_CONFIG_H
