// HPCC / SimAI input readers. Keep the config key table in step with phantora/netsim/packet_config.py.
#include "hpcc-input.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>

namespace phantora {

namespace {

struct Line {
  int no;
  std::vector<std::string> words;
};

std::vector<Line> ReadLines(const std::string& path, const char* what) {
  std::ifstream in(path);
  if (!in) {
    throw InputError(path + ": cannot read " + what + " file");
  }
  std::vector<Line> out;
  std::string text;
  for (int no = 1; std::getline(in, text); ++no) {
    text = text.substr(0, text.find('#'));
    std::istringstream ws(text);
    Line line{no, {}};
    for (std::string w; ws >> w;) {
      line.words.push_back(w);
    }
    if (!line.words.empty()) {
      out.push_back(std::move(line));
    }
  }
  if (out.empty()) {
    throw InputError(path + ": the " + what + " file is empty");
  }
  return out;
}

std::string Where(const std::string& path, int line, const std::string& key = "") {
  return path + ":" + std::to_string(line) + ": " + (key.empty() ? "" : "field '" + key + "': ");
}

uint64_t ToU64(const std::string& w, const std::string& where) {
  std::size_t pos = 0;
  unsigned long long x = 0;
  try {
    if (!w.empty() && w[0] != '-') {
      x = std::stoull(w, &pos);
    }
  } catch (const std::exception&) {
    pos = 0;
  }
  if (pos == 0 || pos != w.size()) {
    throw InputError(where + "expected a non-negative integer, got '" + w + "'");
  }
  return x;
}

std::pair<double, std::string> SplitUnit(const std::string& text) {
  std::size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.' || text[i] == 'e' ||
                             text[i] == 'E' || ((text[i] == '-' || text[i] == '+') && i > 0))) {
    ++i;
  }
  std::size_t used = 0;
  const double v = std::stod(text.substr(0, i), &used);
  if (used != i) {
    throw std::invalid_argument("bad number");
  }
  std::string unit = text.substr(i);
  std::transform(unit.begin(), unit.end(), unit.begin(), [](unsigned char c) { return std::tolower(c); });
  return {v, unit};
}

/// Decimal seconds ("2.0005") to integer ns without binary rounding.
int64_t SecondsToNs(const std::string& w, const std::string& where) {
  const std::size_t dot = w.find('.');
  const std::string whole = w.substr(0, dot);
  std::string frac = dot == std::string::npos ? "" : w.substr(dot + 1);
  const bool ok = !whole.empty() && std::all_of(whole.begin(), whole.end(), ::isdigit) &&
                  std::all_of(frac.begin(), frac.end(), ::isdigit);
  if (!ok) {
    throw InputError(where + "start time: expected seconds, got '" + w + "'");
  }
  while (frac.size() > 9 && frac.back() == '0') {
    frac.pop_back();
  }
  if (frac.size() > 9) {
    throw InputError(where + "start time must be a whole number of ns, got '" + w + "' s");
  }
  frac.resize(9, '0');
  return static_cast<int64_t>(std::stoull(whole) * 1'000'000'000ULL + std::stoull(frac));
}

}  // namespace

uint64_t ParseRateBps(const std::string& text) {
  auto [v, unit] = SplitUnit(text);
  const auto pos = unit.find("b/s");
  if (pos != std::string::npos) {
    unit = unit.substr(0, pos) + "bps";
  }
  static const std::map<std::string, double> scale = {
      {"", 1}, {"bps", 1}, {"kbps", 1e3}, {"mbps", 1e6}, {"gbps", 1e9}, {"tbps", 1e12}};
  auto it = scale.find(unit);
  if (it == scale.end() || v <= 0) {
    throw std::invalid_argument("bad rate '" + text + "'");
  }
  return static_cast<uint64_t>(std::llround(v * it->second));
}

uint64_t ParseTimeNs(const std::string& text) {
  auto [v, unit] = SplitUnit(text);
  static const std::map<std::string, double> scale = {{"", 1},      {"ps", 1e-3}, {"ns", 1},
                                                      {"us", 1e3},  {"ms", 1e6},  {"s", 1e9}};
  auto it = scale.find(unit);
  if (it == scale.end() || v < 0) {
    throw std::invalid_argument("bad time '" + text + "'");
  }
  return static_cast<uint64_t>(std::llround(v * it->second));
}

Topo ReadTopology(const std::string& path) {
  const std::vector<Line> lines = ReadLines(path, "topology");
  std::vector<std::string> tokens;  // the id lists may span lines
  std::vector<int> tokenLine;
  const Line& head = lines[0];
  uint64_t nodes = 0, nsw = 0, nnv = 0, nlinks = 0;
  bool simai = false;
  if (head.words.size() == 3) {
    nodes = ToU64(head.words[0], Where(path, head.no, "nodes"));
    nsw = ToU64(head.words[1], Where(path, head.no, "switches"));
    nlinks = ToU64(head.words[2], Where(path, head.no, "links"));
  } else if (head.words.size() == 6) {
    simai = true;
    nodes = ToU64(head.words[0], Where(path, head.no, "nodes"));
    nnv = ToU64(head.words[2], Where(path, head.no, "nvswitches"));
    nsw = ToU64(head.words[3], Where(path, head.no, "switches"));
    nlinks = ToU64(head.words[4], Where(path, head.no, "links"));
  } else {
    throw InputError(Where(path, head.no) + "expected an HPCC (3 fields) or SimAI (6 fields) header");
  }
  Topo topo;
  topo.kinds.assign(nodes, simai ? "gpu" : "host");
  std::size_t li = 1;
  std::size_t wi = 0;
  auto nextId = [&](const char* what) -> uint32_t {
    while (li < lines.size() && wi >= lines[li].words.size()) {
      ++li;
      wi = 0;
    }
    if (li >= lines.size()) {
      throw InputError(path + ": missing " + what + " ids");
    }
    const uint64_t id = ToU64(lines[li].words[wi++], Where(path, lines[li].no, what));
    if (id >= nodes) {
      throw InputError(Where(path, lines[li].no, what) + "node " + std::to_string(id) + " out of range");
    }
    return static_cast<uint32_t>(id);
  };
  for (uint64_t i = 0; i < nnv; ++i) {
    topo.kinds[nextId("nvswitch")] = "nvswitch";
  }
  for (uint64_t i = 0; i < nsw; ++i) {
    topo.kinds[nextId("switch")] = "switch";
  }
  if (wi != 0) {
    ++li;
  }
  for (uint64_t i = 0; i < nlinks; ++i, ++li) {
    if (li >= lines.size()) {
      throw InputError(path + ": the header announces " + std::to_string(nlinks) + " links, found " +
                       std::to_string(i));
    }
    const Line& l = lines[li];
    if (l.words.size() < 4) {
      throw InputError(Where(path, l.no) + "expected '<src> <dst> <rate> <delay> <error_rate>'");
    }
    TopoLink link;
    link.a = static_cast<uint32_t>(ToU64(l.words[0], Where(path, l.no, "src")));
    link.b = static_cast<uint32_t>(ToU64(l.words[1], Where(path, l.no, "dst")));
    if (link.a >= nodes || link.b >= nodes || link.a == link.b) {
      throw InputError(Where(path, l.no) + "bad link ends");
    }
    try {
      link.bps = ParseRateBps(l.words[2]);
    } catch (const std::exception&) {
      throw InputError(Where(path, l.no, "rate") + "bad rate '" + l.words[2] + "'");
    }
    try {
      link.delayNs = ParseTimeNs(l.words[3]);
    } catch (const std::exception&) {
      throw InputError(Where(path, l.no, "delay") + "bad delay '" + l.words[3] + "'");
    }
    topo.links.push_back(link);
  }
  return topo;
}

std::vector<HpccFlow> ReadFlows(const std::string& path, const Topo& topo) {
  const std::vector<Line> lines = ReadLines(path, "flow");
  if (lines[0].words.size() != 1) {
    throw InputError(Where(path, lines[0].no) + "line 1 must be the flow count");
  }
  const uint64_t count = ToU64(lines[0].words[0], Where(path, lines[0].no, "flow count"));
  if (lines.size() - 1 != count) {
    throw InputError(Where(path, lines[0].no) + "the header announces " + std::to_string(count) + " flows but " +
                     std::to_string(lines.size() - 1) + " follow");
  }
  std::vector<HpccFlow> out;
  for (std::size_t i = 1; i < lines.size(); ++i) {
    const Line& l = lines[i];
    if (l.words.size() != 6) {
      throw InputError(Where(path, l.no) + "expected '<src> <dst> <priority_group> <dport> <size_bytes> <start_seconds>'");
    }
    HpccFlow f;
    f.src = static_cast<uint32_t>(ToU64(l.words[0], Where(path, l.no, "src")));
    f.dst = static_cast<uint32_t>(ToU64(l.words[1], Where(path, l.no, "dst")));
    f.prio = static_cast<uint32_t>(ToU64(l.words[2], Where(path, l.no, "priority_group")));
    f.dport = static_cast<uint32_t>(ToU64(l.words[3], Where(path, l.no, "dport")));
    f.size = ToU64(l.words[4], Where(path, l.no, "size_bytes"));
    f.startNs = SecondsToNs(l.words[5], Where(path, l.no, "start_seconds"));
    for (uint32_t end : {f.src, f.dst}) {
      if (end >= topo.kinds.size() || (topo.kinds[end] != "host" && topo.kinds[end] != "gpu")) {
        throw InputError(Where(path, l.no) + "node " + std::to_string(end) + " is not an endpoint");
      }
    }
    if (f.prio < 1 || f.prio > 7) {
      throw InputError(Where(path, l.no, "priority_group") + "must be 1..7");
    }
    if (!out.empty() && f.startNs < out.back().startNs) {
      throw InputError(Where(path, l.no, "start_seconds") + "flows must be sorted by start time");
    }
    out.push_back(f);
  }
  return out;
}

std::vector<std::pair<std::string, std::string>> ReadConfig(const std::string& path) {
  static const std::set<std::string> ignored = {
      "TOPOLOGY_FILE", "FLOW_FILE",      "TRACE_FILE",   "TRACE_OUTPUT_FILE",    "FCT_OUTPUT_FILE",
      "PFC_OUTPUT_FILE", "QLEN_MON_FILE", "QLEN_MON_START", "QLEN_MON_END",     "SIMULATOR_STOP_TIME",
      "ENABLE_TRACE",  "ERROR_RATE_PER_LINK", "L2_CHUNK_SIZE", "RATE_BOUND",  "MULTI_RATE",
      "INT_MULTI",     "PINT_LOG_BASE",  "PINT_PROB",    "NIC_TOTAL_PAUSE_TIME", "USE_DYNAMIC_PFC_THRESHOLD"};
  static const std::map<int, std::string> modes = {{0, "none"}, {1, "dcqcn"}, {3, "hpcc"}, {7, "timely"},
                                                   {8, "dctcp"}};
  using Conv = std::function<std::string(const std::string&)>;
  const Conv rate = [](const std::string& v) { return std::to_string(ParseRateBps(v)); };
  const Conv us = [](const std::string& v) {
    std::ostringstream o;
    o << std::stod(v) * 1000 << "ns";
    return o.str();
  };
  const Conv num = [](const std::string& v) {
    std::ostringstream o;
    o.precision(17);
    o << std::stod(v);
    return o.str();
  };
  const Conv integer = [](const std::string& v) { return std::to_string(std::stoll(v)); };
  const Conv flag = [](const std::string& v) {
    if (v != "0" && v != "1") {
      throw std::invalid_argument("expected 0 or 1");
    }
    return std::string(v == "1" ? "true" : "false");
  };
  struct CcKey {
    std::string attr;
    Conv conv;
    std::set<std::string> ccs;
  };
  const std::map<std::string, CcKey> ccKeys = {
      {"RATE_AI", {"RateAi", rate, {"dcqcn", "hpcc", "timely"}}},
      {"RATE_HAI", {"RateHai", rate, {"dcqcn", "timely"}}},
      {"MIN_RATE", {"MinRate", rate, {"dcqcn", "hpcc", "timely", "dctcp"}}},
      {"DCTCP_RATE_AI", {"RateAi", rate, {"dctcp"}}},
      {"EWMA_GAIN", {"G", num, {"dcqcn"}}},
      {"RP_TIMER", {"RpTimer", us, {"dcqcn"}}},
      {"ALPHA_RESUME_INTERVAL", {"AlphaResumeInterval", us, {"dcqcn"}}},
      {"RATE_DECREASE_INTERVAL", {"RateDecreaseInterval", us, {"dcqcn"}}},
      {"FAST_RECOVERY_TIMES", {"FastRecoveryTimes", integer, {"dcqcn"}}},
      {"CLAMP_TARGET_RATE", {"ClampTargetRate", flag, {"dcqcn"}}},
      {"U_TARGET", {"TargetUtil", num, {"hpcc"}}},
      {"MI_THRESH", {"MiThresh", integer, {"hpcc"}}},
      {"FAST_REACT", {"FastReact", flag, {"hpcc"}}},
      {"VAR_WIN", {"VarWin", flag, {"hpcc"}}},
      {"SAMPLE_FEEDBACK", {"SampleFeedback", flag, {"hpcc"}}},
      {"HAS_WIN", {"HasWindow", flag, {"none", "dctcp"}}},
  };
  // HPCC 'n rate value ...' maps to 'rate value ...' with values scaled (KB -> bytes).
  auto rateMap = [&](const std::vector<std::string>& w, double scale, bool isFloat) {
    const uint64_t n = std::stoull(w.at(1));
    if (w.size() != 2 + 2 * n) {
      throw std::invalid_argument("expected a count then 'rate value' pairs");
    }
    std::ostringstream o;
    o.precision(17);
    for (uint64_t i = 0; i < n; ++i) {
      if (i) {
        o << ' ';
      }
      o << ParseRateBps(w[2 + 2 * i]) << ' ';
      const double v = std::stod(w[3 + 2 * i]) * scale;
      if (isFloat) {
        o << v;
      } else {
        o << static_cast<uint64_t>(std::llround(v));
      }
    }
    return o.str();
  };

  std::vector<std::pair<std::string, std::string>> out;
  std::vector<std::tuple<int, std::string, std::string>> ccLines;
  std::string cc = "none";
  for (const Line& l : ReadLines(path, "config")) {
    const std::string& key = l.words[0];
    const std::string where = Where(path, l.no, key);
    if (l.words.size() < 2) {
      throw InputError(where + "missing value");
    }
    const std::string& v = l.words[1];
    try {
      if (ignored.count(key)) {
        continue;
      } else if (key == "CC_MODE") {
        auto it = modes.find(static_cast<int>(std::stol(v)));
        if (it == modes.end()) {
          throw InputError(where + "unsupported CC_MODE " + v + " (supported: 0, 1, 3, 7, 8)");
        }
        cc = it->second;
      } else if (key == "PACKET_PAYLOAD_SIZE") {
        out.emplace_back("payload_bytes", integer(v));
      } else if (key == "BUFFER_SIZE") {
        out.emplace_back("buffer_bytes", std::to_string(std::llround(std::stod(v) * 1048576.0)));
      } else if (key == "ENABLE_QCN") {
        out.emplace_back("ecn", flag(v) == "true" ? "1" : "0");
      } else if (key == "ENABLE_PFC") {
        out.emplace_back("pfc", flag(v) == "true" ? "1" : "0");
      } else if (key == "KMIN_MAP") {
        out.emplace_back("kmin_map", rateMap(l.words, 1000, false));
      } else if (key == "KMAX_MAP") {
        out.emplace_back("kmax_map", rateMap(l.words, 1000, false));
      } else if (key == "PMAX_MAP") {
        out.emplace_back("pmax_map", rateMap(l.words, 1, true));
      } else if (key == "L2_ACK_INTERVAL") {
        out.emplace_back("ack_interval", integer(v));
      } else if (key == "ACK_HIGH_PRIO") {
        out.emplace_back("ack_high_prio", flag(v) == "true" ? "1" : "0");
      } else if (key == "GLOBAL_T") {
        out.emplace_back("global_t", flag(v) == "true" ? "1" : "0");
      } else if (key == "L2_BACK_TO_ZERO") {
        if (flag(v) == "true") {
          throw InputError(where + "L2_BACK_TO_ZERO 1 is not modelled; go-back-N is");
        }
      } else if (key == "LINK_DOWN") {
        for (std::size_t i = 1; i < l.words.size(); ++i) {
          if (l.words[i] != "0") {
            throw InputError(where + "LINK_DOWN events are not modelled");
          }
        }
      } else if (ccKeys.count(key)) {
        ccLines.emplace_back(l.no, key, v);
      } else if (key == "cc") {
        cc = v;
      } else if (key == "int_mode") {
        out.emplace_back("int", v == "on" ? "1" : (v == "off" ? "0" : "-1"));
      } else if (key.rfind("cc.", 0) == 0 || (!key.empty() && std::islower(static_cast<unsigned char>(key[0])))) {
        // phantora PacketConfig fields; 'None' keeps the default.
        if (v == "None") {
          continue;
        }
        std::string rest = v;
        for (std::size_t i = 2; i < l.words.size(); ++i) {
          rest += " " + l.words[i];
        }
        if (key.size() > 4 && key.substr(key.size() - 4) == "_map") {
          std::istringstream ws(rest);
          std::ostringstream o;
          bool isRate = true;
          for (std::string w; ws >> w; isRate = !isRate) {
            o << (o.tellp() > 0 ? " " : "") << (isRate ? std::to_string(ParseRateBps(w)) : w);
          }
          rest = o.str();
        }
        out.emplace_back(key, rest);
      } else {
        throw InputError(where + "unknown key");
      }
    } catch (const InputError&) {
      throw;
    } catch (const std::exception& e) {
      throw InputError(where + "bad value '" + v + "': " + e.what());
    }
  }
  out.emplace(out.begin(), "cc", cc);
  for (const auto& [no, key, v] : ccLines) {
    const CcKey& k = ccKeys.at(key);
    if (!k.ccs.count(cc)) {
      continue;
    }
    try {
      out.emplace_back("cc." + k.attr, k.conv(v));
    } catch (const std::exception& e) {
      throw InputError(Where(path, no, key) + "bad value '" + v + "': " + e.what());
    }
  }
  return out;
}

}  // namespace phantora
