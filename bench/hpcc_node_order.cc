// Probe: in what order does std::map<Ptr<Node>, ...> (HPCC's nbr2if) visit nodes created as the HPCC
// models' third.cc creates them? Objects of SwitchNode's size (its m_bytes[257][257][8] counters, 2.1 MB)
// and of SwitchMmu's size are allocated in node-id order next to plain ns3::Node hosts; the program
// prints the node ids in map order. Built and run by bench/hpcc_node_order.py against the ns3 wheel.
#include "ns3/node.h"
#include "ns3/object.h"

#include <cstdio>
#include <cstdlib>
#include <map>
#include <vector>

using namespace ns3;

namespace {
class MmuSized : public Object {  // SwitchMmu: 4 x [257][8] uint32 runtime tables and per-port config
 public:
  uint32_t tables[4][257][8] = {};
  uint32_t config[4][257] = {};
  double pmax[257] = {};
};

class SwitchSized : public Node {  // SwitchNode: m_bytes, tx/last counters, a routing map, its MMU
 public:
  SwitchSized() : mmu(CreateObject<MmuSized>()) {}
  uint32_t ecmpSeed = 0;
  std::map<uint32_t, std::vector<int>> table;
  uint32_t bytes[257][257][8] = {};
  uint64_t txBytes[257] = {};
  uint32_t lastPktSize[257] = {};
  uint64_t lastPktTs[257] = {};
  double u[257] = {};
  Ptr<MmuSized> mmu;
};
}  // namespace

int main(int argc, char** argv) {
  // argv: node count, then the switch ids (as an HPCC topology file's first two lines)
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s NODES [SWITCH_ID ...]\n", argv[0]);
    return 2;
  }
  const uint32_t n = std::strtoul(argv[1], nullptr, 10);
  std::vector<bool> isSwitch(n, false);
  for (int i = 2; i < argc; ++i) {
    isSwitch[std::strtoul(argv[i], nullptr, 10)] = true;
  }
  std::vector<Ptr<Node>> nodes;
  std::map<Ptr<Node>, uint32_t> byAddress;
  for (uint32_t i = 0; i < n; ++i) {
    nodes.push_back(isSwitch[i] ? Ptr<Node>(CreateObject<SwitchSized>()) : CreateObject<Node>());
    byAddress[nodes.back()] = i;
  }
  for (const auto& [node, id] : byAddress) {
    std::printf("%u\n", id);
  }
  return 0;
}
