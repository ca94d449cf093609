// Readers of the HPCC / SimAI input files for the standalone runner (mirrors phantora's Python readers).
#ifndef PHANTORA_HPCC_INPUT_H
#define PHANTORA_HPCC_INPUT_H

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace phantora {

/// An input error: "file:line: key: message".
class InputError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct TopoLink {
  uint32_t a, b;
  uint64_t bps;
  uint64_t delayNs;
};

struct Topo {
  std::vector<std::string> kinds;  ///< per node: host, gpu, switch, nvswitch
  std::vector<TopoLink> links;
};

struct HpccFlow {
  uint32_t src, dst, prio, dport;
  uint64_t size;
  int64_t startNs;
};

/// HPCC (`nodes switches links`) or SimAI (`nodes gpus_per_server nvswitches switches links gpu_type`).
Topo ReadTopology(const std::string& path);
std::vector<HpccFlow> ReadFlows(const std::string& path, const Topo& topo);
/// HPCC config.txt (upper-case keys) and phantora PacketConfig fields (lower case) as SetParam pairs.
std::vector<std::pair<std::string, std::string>> ReadConfig(const std::string& path);

uint64_t ParseRateBps(const std::string& text);
uint64_t ParseTimeNs(const std::string& text);

}  // namespace phantora

#endif  // PHANTORA_HPCC_INPUT_H
