// SwitchMmu bookkeeping.
#include "switch-mmu.h"

#include <algorithm>

namespace ns3 {

void SwitchMmu::Configure(uint32_t nPorts, const Config& cfg) {
  m_cfg = cfg;
  m_acct.assign(nPorts, {});
  m_headroom.assign(nPorts, 0);
  m_totalHeadroom = 0;
  m_totalReserve = cfg.reserveBytes * nPorts;
  m_sharedUsed = 0;
  m_usedBytes = 0;
  m_maxUsedBytes = 0;
}

void SwitchMmu::SetHeadroom(uint32_t port, uint64_t bytes) {
  if (!m_cfg.pfc) {
    bytes = 0;
  }
  m_totalHeadroom = m_totalHeadroom - m_headroom[port] + bytes;
  m_headroom[port] = bytes;
}

uint64_t SwitchMmu::Threshold() const {
  const uint64_t taken = m_totalHeadroom + m_totalReserve + m_sharedUsed;
  return taken >= m_cfg.bufferBytes ? 0 : (m_cfg.bufferBytes - taken) >> m_cfg.shift;
}

uint64_t SwitchMmu::SharedUsed(uint32_t port, uint32_t cls) const {
  const uint64_t in = m_acct[port][cls].ingress;
  return in > m_cfg.reserveBytes ? in - m_cfg.reserveBytes : 0;
}

bool SwitchMmu::Admit(uint32_t port, uint32_t cls, uint64_t bytes) const {
  if (m_cfg.unlimited) {
    return true;
  }
  const Acct& a = m_acct[port][cls];
  if (a.ingress + bytes <= m_cfg.reserveBytes) {
    return true;
  }
  if (SharedUsed(port, cls) + bytes <= Threshold()) {
    return true;
  }
  // Past the threshold: only the headroom (PFC on) can take it.
  return m_cfg.pfc && a.hdrm + bytes <= m_headroom[port];
}

void SwitchMmu::Add(uint32_t port, uint32_t cls, uint64_t bytes) {
  Acct& a = m_acct[port][cls];
  m_usedBytes += bytes;
  m_maxUsedBytes = std::max(m_maxUsedBytes, m_usedBytes);
  const uint64_t after = a.ingress + bytes;
  if (after <= m_cfg.reserveBytes || m_cfg.unlimited) {
    a.ingress = after;
    return;
  }
  if (m_cfg.pfc && after - m_cfg.reserveBytes > Threshold()) {
    a.hdrm += bytes;
    return;
  }
  m_sharedUsed += std::min(bytes, after - m_cfg.reserveBytes);
  a.ingress = after;
}

void SwitchMmu::Remove(uint32_t port, uint32_t cls, uint64_t bytes) {
  Acct& a = m_acct[port][cls];
  m_usedBytes -= std::min(m_usedBytes, bytes);
  const uint64_t fromHdrm = std::min(a.hdrm, bytes);
  const uint64_t rest = bytes - fromHdrm;
  const uint64_t fromShared = std::min(rest, SharedUsed(port, cls));
  a.hdrm -= fromHdrm;
  m_sharedUsed -= std::min(m_sharedUsed, fromShared);
  a.ingress -= std::min(a.ingress, rest);
}

bool SwitchMmu::ShouldPause(uint32_t port, uint32_t cls) const {
  const Acct& a = m_acct[port][cls];
  if (!m_cfg.pfc || m_cfg.unlimited || a.paused) {
    return false;
  }
  return a.hdrm > 0 || SharedUsed(port, cls) >= Threshold();
}

bool SwitchMmu::ShouldResume(uint32_t port, uint32_t cls) const {
  const Acct& a = m_acct[port][cls];
  if (!a.paused || a.hdrm > 0) {
    return false;
  }
  const uint64_t shared = SharedUsed(port, cls);
  return shared == 0 || shared + m_cfg.resumeOffsetBytes <= Threshold();
}

}  // namespace ns3
