// phantora-ns3-runner SCRIPT OUTDIR: replay a call script on the phantora fabric without Python, run
// until every flow is acknowledged, and write OUTDIR/fct.txt and OUTDIR/pfc.txt (HPCC formats; fct.txt
// has the flow id as a ninth column, pfc.txt numbers ports from 1 like HPCC). Prints a one-line JSON
// summary. SCRIPT is what `phantora netsim --network ns3 --out DIR` writes as DIR/ns3-calls.txt: the
// PhantoraNetwork calls of that run, one per line, so the runner makes exactly the same calls.
// phantora-ns3-runner --list-cc prints the registered congestion controls and their attributes as JSON.
// --load LIB (repeatable, first) loads a library of a user's own CCs first (as a script's LoadLibrary line does).
// --records [--watch IDS] SCRIPT: no OUTDIR; run as `phantora netsim` does in-process and print every record it
// reads on stdout (runner-records.h), which netsim parses instead of loading the Python bindings.
// --interface-version prints the interface version (phantora-interface-version.h) once the runner has checked that
// the library it loaded has its own (every mode checks that first).
#include "congestion-control.h"
#include "phantora-interface-version.h"
#include "phantora-network.h"
#include "runner-records.h"

#include <dlfcn.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <sys/stat.h>
#include <vector>

namespace {

uint32_t NodeIp(uint32_t id) { return 0x0b000001u + ((id / 256) << 16) + ((id % 256) << 8); }

int Usage() {
  std::cerr << "usage: phantora-ns3-runner [--load LIB]... SCRIPT OUTDIR\n"
               "       phantora-ns3-runner [--load LIB]... --records [--watch IDS] SCRIPT\n"
               "       phantora-ns3-runner [--load LIB]... --list-cc\n"
               "       phantora-ns3-runner --interface-version\n"
               "  SCRIPT     a call script (`phantora netsim --network ns3 --out DIR` writes DIR/ns3-calls.txt)\n"
               "  OUTDIR     directory for fct.txt and pfc.txt (created if missing)\n"
               "  --list-cc  print the registered congestion controls and their attributes (JSON)\n"
               "  --load     load a library of congestion controls (built from PHANTORA_CC_DIR) first\n"
               "  --records  print every record on stdout as phantora netsim reads them (no OUTDIR)\n"
               "  --watch    with --records: flow ids (comma-separated) to stop at, as netsim's progress display does\n"
               "  --interface-version  print the models' interface version (runner and library agree)\n";
  return 2;
}

/// Throws naming the library and both versions unless the fabric library this runner loaded was built with the
/// interface version the runner was (a runner left from an older build beside a newer library, or the reverse).
void CheckInterface() {
  const uint32_t found = ns3::PhantoraInterfaceVersion();
  if (found == ns3::kPhantoraInterfaceVersion) {
    return;
  }
  Dl_info info{};
  const bool named = dladdr(reinterpret_cast<void*>(&ns3::PhantoraInterfaceVersion), &info) && info.dli_fname;
  throw std::runtime_error((named ? std::string(info.dli_fname) : std::string("libphantora-ns3.so")) +
                           " has interface version " + std::to_string(found) + ", this runner was built for " +
                           std::to_string(ns3::kPhantoraInterfaceVersion) +
                           ": rebuild both with scripts/build_ns3.sh");
}

/// Load a library whose static registrars add congestion controls; throws naming it.
void LoadLibrary(const std::string& path) {
  if (!dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL)) {
    const char* why = dlerror();
    throw std::runtime_error("cannot load " + path + ": " + (why ? why : "unknown error"));
  }
}

/// One call of the script: its verb and its arguments.
struct Call {
  std::string verb;
  std::vector<std::string> args;
  std::string rest;  ///< the text after the first argument (SetParam values may hold spaces)
};

/// The call script versions this runner reads. Version 1 had no route field: AddFlow's KEY word carried a flow
/// through the NICs as its bit 62 (the key word ns-3 took then), so its AddFlow lines are read as flows via NIC
/// exactly where that bit is set (replayed as they ran). Version 2 (phantora.netsim.ns3_calls.HEADER) gives the
/// route its own word: `AddFlow ID SRC DST SIZE START PRIO KEY DELAY_NS DPORT VIA_NIC [DEP ...]`.
constexpr int kScriptVersion = 2;
constexpr uint64_t kV1NicBit = uint64_t{1} << 62;
const std::string kHeaderPrefix = "# phantora ns-3 call script ";

/// The version a script's first line declares (`# phantora ns-3 call script N: ...`); throws naming the header
/// when it is missing or names a version this runner does not read.
int ScriptVersion(const std::string& first) {
  if (first.rfind(kHeaderPrefix, 0) != 0) {
    throw std::invalid_argument("no call script header (a first line '" + kHeaderPrefix + "N: ...'; netsim --out "
                                "writes it)");
  }
  const std::string rest = first.substr(kHeaderPrefix.size());
  const std::size_t end = rest.find_first_not_of("0123456789");
  const std::string digits = rest.substr(0, end);
  if (digits.empty() || digits.size() > 4 || std::stoi(digits) < 1 || std::stoi(digits) > kScriptVersion) {
    throw std::invalid_argument("call script header version '" + rest.substr(0, rest.find(':')) +
                                "': this runner reads versions 1 to " + std::to_string(kScriptVersion));
  }
  return std::stoi(digits);
}

Call ParseLine(const std::string& line) {
  Call c;
  std::istringstream in(line);
  in >> c.verb;
  for (std::string w; in >> w;) {
    c.args.push_back(w);
  }
  const std::size_t key = line.find_first_not_of(' ', line.find(' '));
  const std::size_t value = key == std::string::npos ? key : line.find(' ', key);
  c.rest = value == std::string::npos ? "" : line.substr(value + 1);
  return c;
}

uint64_t U64(const std::string& s) {
  std::size_t pos = 0;
  const unsigned long long v = std::stoull(s, &pos);
  if (pos != s.size() || s[0] == '-') {
    throw std::invalid_argument("expected a non-negative integer, got '" + s + "'");
  }
  return v;
}

int64_t I64(const std::string& s) {
  std::size_t pos = 0;
  const long long v = std::stoll(s, &pos);
  if (pos != s.size()) {
    throw std::invalid_argument("expected an integer, got '" + s + "'");
  }
  return v;
}

void Need(const Call& c, std::size_t n, bool more = false) {
  if (c.args.size() < n || (!more && c.args.size() != n)) {
    throw std::invalid_argument(c.verb + ": expected " + std::to_string(n) + (more ? " or more" : "") +
                                " arguments, got " + std::to_string(c.args.size()));
  }
}

/// Make one call of a script of `version`; false when the line is not a call (blank or a comment).
bool Apply(ns3::PhantoraNetwork& net, const Call& c, int version) {
  if (c.verb.empty() || c.verb[0] == '#') {
    return false;
  }
  if (c.verb == "LoadLibrary") {
    Need(c, 1);
    LoadLibrary(c.args[0]);
  } else if (c.verb == "SetParam") {
    Need(c, 1, true);  // an empty value (e.g. no ECN map) leaves one word
    net.SetParam(c.args[0], c.rest);
  } else if (c.verb == "AddNode") {
    Need(c, 1);
    net.AddNode(c.args[0]);
  } else if (c.verb == "AddLink") {
    Need(c, 4);
    net.AddLink(static_cast<uint32_t>(U64(c.args[0])), static_cast<uint32_t>(U64(c.args[1])), U64(c.args[2]),
                U64(c.args[3]));
  } else if (c.verb == "Finalize") {
    Need(c, 0);
    net.Finalize();
  } else if (c.verb == "AddFlow") {
    const std::size_t fixed = version >= 2 ? 10 : 9;  // version 1: no VIA_NIC word
    Need(c, fixed, true);
    const uint64_t key = U64(c.args[6]);
    bool viaNic = (key & kV1NicBit) != 0;
    if (version >= 2) {
      const uint64_t word = U64(c.args[9]);
      if (word > 1) {
        throw std::invalid_argument("AddFlow: VIA_NIC (the 10th argument) must be 0 or 1, got " + c.args[9]);
      }
      viaNic = word != 0;
    }
    std::vector<uint64_t> deps;
    for (std::size_t i = fixed; i < c.args.size(); ++i) {
      deps.push_back(U64(c.args[i]));
    }
    net.AddFlow(U64(c.args[0]), static_cast<uint32_t>(U64(c.args[1])), static_cast<uint32_t>(U64(c.args[2])),
                U64(c.args[3]), I64(c.args[4]), static_cast<uint32_t>(U64(c.args[5])), key, deps, I64(c.args[7]),
                static_cast<uint32_t>(U64(c.args[8])), viaNic);
  } else if (c.verb == "SetLossBudget") {
    Need(c, 2);
    net.SetLossBudget(U64(c.args[0]), U64(c.args[1]));
  } else if (c.verb == "SetMaxRate") {
    Need(c, 2);
    net.SetMaxRate(U64(c.args[0]), U64(c.args[1]));
  } else if (c.verb == "SetConnection") {
    Need(c, 2);
    net.SetConnection(U64(c.args[0]), U64(c.args[1]));
  } else if (c.verb == "SetQueue") {
    Need(c, 2);
    net.SetQueue(U64(c.args[0]), U64(c.args[1]));
  } else if (c.verb == "ScheduleLinkState") {
    Need(c, 3);
    net.ScheduleLinkState(I64(c.args[0]), static_cast<uint32_t>(U64(c.args[1])), U64(c.args[2]) != 0);
  } else if (c.verb == "ScheduleLinkDegrade") {
    Need(c, 6);
    net.ScheduleLinkDegrade(I64(c.args[0]), static_cast<uint32_t>(U64(c.args[1])), U64(c.args[2]), U64(c.args[3]),
                            std::stod(c.args[4]), U64(c.args[5]));
  } else if (c.verb == "ScheduleReconverge") {
    Need(c, 1);
    net.ScheduleReconverge(I64(c.args[0]));
  } else if (c.verb == "SetThrottle") {
    Need(c, 4);
    net.SetThrottle(static_cast<uint32_t>(U64(c.args[0])), I64(c.args[1]), I64(c.args[2]), std::stod(c.args[3]));
  } else if (c.verb == "ThrottleFromFlow") {
    Need(c, 4);
    net.ThrottleFromFlow(U64(c.args[0]), static_cast<uint32_t>(U64(c.args[1])), I64(c.args[2]), std::stod(c.args[3]));
  } else if (c.verb == "ExemptFromThrottle") {
    Need(c, 1);
    net.ExemptFromThrottle(U64(c.args[0]));
  } else if (c.verb == "RunUntil") {
    Need(c, 1);
    net.RunUntil(I64(c.args[0]));
  } else {
    throw std::invalid_argument("unknown call '" + c.verb + "'");
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  try {
    CheckInterface();
    while (args.size() >= 2 && args[0] == "--load") {
      LoadLibrary(args[1]);
      args.erase(args.begin(), args.begin() + 2);
    }
  } catch (const std::exception& e) {
    std::cerr << "phantora-ns3-runner: error: " << e.what() << std::endl;
    return 2;
  }
  if (args.size() == 1 && args[0] == "--interface-version") {
    std::cout << ns3::kPhantoraInterfaceVersion << std::endl;
    return 0;
  }
  if (args.size() == 1 && args[0] == "--list-cc") {
    std::cout << ns3::CcRegistry::Json() << std::endl;
    return 0;
  }
  bool records = false;
  std::vector<uint64_t> watch;
  try {
    for (; !args.empty() && (args[0] == "--records" || args[0] == "--watch"); args.erase(args.begin())) {
      records = true;
      if (args[0] == "--watch" && args.size() >= 2) {
        watch = phantora_runner::ParseWatch(args[1]);
        args.erase(args.begin());
      }
    }
  } catch (const std::exception& e) {
    std::cerr << "phantora-ns3-runner: error: " << e.what() << std::endl;
    return 2;
  }
  if (args.size() != (records ? 1u : 2u)) {
    return Usage();
  }
  const std::string scriptPath = args[0], outDir = records ? "" : args[1];
  try {
    std::ifstream script(scriptPath);
    if (!script) {
      std::cerr << "phantora-ns3-runner: error: " << scriptPath << ": cannot read" << std::endl;
      return 2;
    }
    const auto t0 = std::chrono::steady_clock::now();
    ns3::PhantoraNetwork net;
    uint64_t flows = 0;
    int version = kScriptVersion;
    std::string line;
    for (uint64_t lineno = 1; std::getline(script, line); ++lineno) {
      try {
        if (lineno == 1) {
          version = ScriptVersion(line);
        }
        const Call c = ParseLine(line);
        if (Apply(net, c, version) && c.verb == "AddFlow") {
          ++flows;
        }
      } catch (const std::exception& e) {
        std::cerr << "phantora-ns3-runner: error: " << scriptPath << ":" << lineno << ": " << e.what() << std::endl;
        return 2;
      }
    }
    if (records) {
      return phantora_runner::RunRecords(net, watch, stdout);
    }
    const bool idle = net.RunUntilIdle(int64_t{1} << 62);
    const bool quiet = idle && net.RunUntilQuiet(int64_t{1} << 62);
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

    mkdir(outDir.c_str(), 0755);
    std::ofstream fct(outDir + "/fct.txt");
    if (!fct) {
      std::cerr << "phantora-ns3-runner: error: " << outDir << ": cannot write fct.txt" << std::endl;
      return 2;
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
    std::cout << "{\"flows\": " << flows << ", \"completed\": " << (quiet ? "true" : "false")
              << ", \"sim_ns\": " << net.Now() << ", \"wall_s\": " << wall;
    for (const auto& [k, v] : net.Stats()) {
      std::cout << ", \"" << k << "\": " << static_cast<long long>(v);
    }
    std::cout << "}" << std::endl;
    return quiet ? 0 : 1;
  } catch (const std::exception& e) {
    std::cerr << "phantora-ns3-runner: error: " << e.what() << std::endl;
    return 2;
  }
}
