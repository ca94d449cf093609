// Shared-buffer switch memory manager: per-ingress (port, class) accounting, dynamic PFC threshold.
#ifndef PHANTORA_SWITCH_MMU_H
#define PHANTORA_SWITCH_MMU_H

#include <array>
#include <cstdint>
#include <vector>

namespace ns3 {

/**
 * Buffer accounting of one switch (no ns-3 dependencies; pure bookkeeping).
 *
 * Every ingress (port, class) owns a small reserve; beyond it packets use the shared pool, and
 * once a class reaches the dynamic threshold (buffer - headroom - reserve - shared_used) >> shift
 * further packets go to that port's headroom and the class must be paused (XOFF). XON when the
 * headroom is empty and shared use + resume offset is back under the threshold. With PFC off
 * there is no headroom and packets past the threshold are dropped.
 */
class SwitchMmu {
 public:
  struct Config {
    uint64_t bufferBytes = 32ULL << 20;
    uint64_t reserveBytes = 4096;
    uint64_t resumeOffsetBytes = 3072;
    uint32_t shift = 3;
    bool pfc = true;
    bool unlimited = false;  ///< NVSwitch: never drops, never pauses
  };

  void Configure(uint32_t nPorts, const Config& cfg);
  void SetHeadroom(uint32_t port, uint64_t bytes);

  /// Can a packet of `bytes` entering by (port, cls) be stored?
  bool Admit(uint32_t port, uint32_t cls, uint64_t bytes) const;
  void Add(uint32_t port, uint32_t cls, uint64_t bytes);
  void Remove(uint32_t port, uint32_t cls, uint64_t bytes);
  bool ShouldPause(uint32_t port, uint32_t cls) const;
  bool ShouldResume(uint32_t port, uint32_t cls) const;
  void SetPaused(uint32_t port, uint32_t cls, bool paused) { m_acct[port][cls].paused = paused; }

  uint64_t Threshold() const;
  uint64_t SharedUsed(uint32_t port, uint32_t cls) const;
  uint64_t UsedBytes() const { return m_usedBytes; }
  uint64_t MaxUsedBytes() const { return m_maxUsedBytes; }
  uint64_t HeadroomUsed(uint32_t port, uint32_t cls) const { return m_acct[port][cls].hdrm; }
  /// The headroom of ingress `port` (SetHeadroom), in bytes.
  uint64_t Headroom(uint32_t port) const { return m_headroom[port]; }
  const Config& GetConfig() const { return m_cfg; }

 private:
  struct Acct {
    uint64_t ingress = 0;  ///< bytes held in reserve + shared pool
    uint64_t hdrm = 0;     ///< bytes held in headroom
    bool paused = false;   ///< we sent XOFF upstream
  };
  Config m_cfg;
  std::vector<std::array<Acct, 8>> m_acct;
  std::vector<uint64_t> m_headroom;
  uint64_t m_totalHeadroom = 0;
  uint64_t m_totalReserve = 0;
  uint64_t m_sharedUsed = 0;
  uint64_t m_usedBytes = 0;
  uint64_t m_maxUsedBytes = 0;
};

}  // namespace ns3

#endif  // PHANTORA_SWITCH_MMU_H
