// phantora-ns3-runner TOPO FLOWS CONFIG OUTDIR: run an HPCC-format input on the phantora fabric,
// without Python, and write OUTDIR/fct.txt and OUTDIR/pfc.txt (HPCC formats; fct.txt has the flow id
// as a ninth column, pfc.txt numbers ports from 1 like HPCC). Prints a one-line JSON summary.
#include "hpcc-input.h"
#include "phantora-network.h"

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sys/stat.h>

namespace {

uint32_t NodeIp(uint32_t id) { return 0x0b000001u + ((id / 256) << 16) + ((id % 256) << 8); }

int Usage() {
  std::cerr << "usage: phantora-ns3-runner TOPO FLOWS CONFIG OUTDIR\n"
               "  TOPO    HPCC or SimAI topology file\n"
               "  FLOWS   HPCC flow file\n"
               "  CONFIG  HPCC config.txt (phantora PacketConfig fields also accepted), or '-' for defaults\n"
               "  OUTDIR  directory for fct.txt and pfc.txt (created if missing)\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5) {
    return Usage();
  }
  const std::string topoPath = argv[1], flowPath = argv[2], cfgPath = argv[3], outDir = argv[4];
  try {
    const phantora::Topo topo = phantora::ReadTopology(topoPath);
    const std::vector<phantora::HpccFlow> flows = phantora::ReadFlows(flowPath, topo);
    std::vector<std::pair<std::string, std::string>> params;
    if (cfgPath != "-") {
      params = phantora::ReadConfig(cfgPath);
    }
    const auto t0 = std::chrono::steady_clock::now();
    ns3::PhantoraNetwork net;
    for (const auto& [k, v] : params) {
      try {
        net.SetParam(k, v);
      } catch (const std::exception& e) {
        throw phantora::InputError(cfgPath + ": " + e.what());
      }
    }
    for (const std::string& kind : topo.kinds) {
      net.AddNode(kind);
    }
    for (const auto& l : topo.links) {
      net.AddLink(l.a, l.b, l.bps, l.delayNs);
    }
    try {
      net.Finalize();
    } catch (const std::exception& e) {
      throw phantora::InputError(cfgPath + ": " + e.what());
    }
    // The same calls, in the same order, as `phantora netsim --network ns3`.
    for (std::size_t i = 0; i < flows.size(); ++i) {
      const auto& f = flows[i];
      net.AddFlow(i, f.src, f.dst, f.size, f.startNs, f.prio, i, {}, 0, f.dport);
    }
    const bool idle = net.RunUntilIdle(int64_t{1} << 62);
    const bool quiet = idle && net.RunUntilQuiet(int64_t{1} << 62);
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

    mkdir(outDir.c_str(), 0755);
    std::ofstream fct(outDir + "/fct.txt");
    if (!fct) {
      throw phantora::InputError(outDir + ": cannot write fct.txt");
    }
    for (const auto& r : net.DrainFct()) {
      char buf[256];
      std::snprintf(buf, sizeof buf, "%08x %08x %u %u %llu %lld %lld %lld %llu\n", NodeIp(r.src), NodeIp(r.dst),
                    r.sport, r.dport, static_cast<unsigned long long>(r.size), static_cast<long long>(r.startNs),
                    static_cast<long long>(r.fctNs), static_cast<long long>(r.standaloneNs),
                    static_cast<unsigned long long>(r.id));
      fct << buf;
    }
    std::ofstream pfc(outDir + "/pfc.txt");
    for (const auto& r : net.DrainPfc()) {
      pfc << r.timeNs << ' ' << r.node << ' ' << r.nodeType << ' ' << r.port + 1 << ' ' << r.pause << '\n';
    }
    std::cout << "{\"flows\": " << flows.size() << ", \"completed\": " << (quiet ? "true" : "false")
              << ", \"sim_ns\": " << net.Now() << ", \"wall_s\": " << wall;
    for (const auto& [k, v] : net.Stats()) {
      std::cout << ", \"" << k << "\": " << static_cast<long long>(v);
    }
    std::cout << "}" << std::endl;
    return quiet ? 0 : 1;
  } catch (const phantora::InputError& e) {
    std::cerr << "phantora-ns3-runner: error: " << e.what() << std::endl;
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "phantora-ns3-runner: error: " << e.what() << std::endl;
    return 2;
  }
}
