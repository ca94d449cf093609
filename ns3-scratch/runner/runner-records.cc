// Records mode of phantora-ns3-runner: see runner-records.h.
#include "runner-records.h"

#include <algorithm>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>

namespace phantora_runner {
namespace {

constexpr int64_t kForever = int64_t{1} << 62;  // Python's _FOREVER_NS

using ull = unsigned long long;
using ll = long long;

double Events(const ns3::PhantoraNetwork& net) {
  for (const auto& [key, value] : net.Stats()) {
    if (key == "events") {
      return value;
    }
  }
  return 0;
}

/// Print the completions since the last call (with their lost ranges) and a tick; returns their ids.
std::vector<uint64_t> Take(ns3::PhantoraNetwork& net, std::FILE* out) {
  const auto records = net.DrainCompletions();
  std::map<uint64_t, std::vector<ns3::LossRecord>> lost;
  for (const auto& l : net.DrainLosses()) {  // drained after the completions: a record's losses are all here
    lost[l.flowId].push_back(l);
  }
  std::vector<uint64_t> ids;
  for (const auto& r : records) {
    std::fprintf(out, "C %llu %lld %lld %llu %u %u", static_cast<ull>(r.id), static_cast<ll>(r.startNs),
                 static_cast<ll>(r.endNs), static_cast<ull>(r.size), r.src, r.dst);
    for (const auto& l : lost[r.id]) {
      std::fprintf(out, " %llu %llu", static_cast<ull>(l.offset), static_cast<ull>(l.bytes));
    }
    std::fputc('\n', out);
    ids.push_back(r.id);
  }
  std::fprintf(out, "T %lld %.17g\n", static_cast<ll>(net.Now()), Events(net));
  std::fflush(out);
  return ids;
}

/// `drain_observed`'s loop: stop at each watched flow's completion until none is left or nothing runs.
void Watch(ns3::PhantoraNetwork& net, std::vector<uint64_t> watch, std::FILE* out) {
  while (!watch.empty() && net.InFlight()) {
    net.RunUntilWatched(-1, watch);
    const std::vector<uint64_t> got = Take(net, out);
    const auto hit = [&got](uint64_t id) { return std::find(got.begin(), got.end(), id) != got.end(); };
    const std::size_t before = watch.size();
    watch.erase(std::remove_if(watch.begin(), watch.end(), hit), watch.end());
    if (watch.size() == before) {
      break;  // idle, or nothing more can run: the drain below finishes or says why
    }
  }
}

void PrintRecords(ns3::PhantoraNetwork& net, std::FILE* out) {
  for (const auto& r : net.DrainFct()) {
    std::fprintf(out, "F %u %u %u %u %llu %lld %lld %lld %llu\n", r.src, r.dst, r.sport, r.dport,
                 static_cast<ull>(r.size), static_cast<ll>(r.startNs), static_cast<ll>(r.fctNs),
                 static_cast<ll>(r.standaloneNs), static_cast<ull>(r.id));
  }
  for (const auto& r : net.DrainPfc()) {
    std::fprintf(out, "P %lld %u %u %u %u %u %u\n", static_cast<ll>(r.timeNs), r.node, r.nodeType, r.port, r.prio,
                 r.pause, r.fromNode);
  }
  for (const auto& r : net.DrainQueueSamples()) {
    std::fprintf(out, "Q %lld %u %u %u %llu\n", static_cast<ll>(r.timeNs), r.node, r.port, r.prio,
                 static_cast<ull>(r.bytes));
  }
  for (const auto& r : net.DrainDrops()) {
    std::fprintf(out, "D %lld %u %u %u %llu %llu\n", static_cast<ll>(r.timeNs), r.node, r.port, r.prio,
                 static_cast<ull>(r.flowId), static_cast<ull>(r.seq));
  }
  for (const auto& r : net.DrainTrims()) {
    std::fprintf(out, "R %lld %u %u %u %llu %llu %u\n", static_cast<ll>(r.timeNs), r.node, r.port, r.prio,
                 static_cast<ull>(r.flowId), static_cast<ull>(r.seq), r.payload);
  }
  for (const auto& r : net.DrainCnps()) {
    std::fprintf(out, "N %lld %u %llu %u %llu\n", static_cast<ll>(r.timeNs), r.node, static_cast<ull>(r.flowId),
                 r.fromNode, static_cast<ull>(r.seq));
  }
  for (const auto& r : net.DrainEcnMarks()) {
    std::fprintf(out, "E %lld %u %u %u %u %llu\n", static_cast<ll>(r.timeNs), r.node, r.port, r.prio, r.channel,
                 static_cast<ull>(r.flowId));
  }
  for (const auto& r : net.FlowTransport()) {
    std::fprintf(out, "X %llu %llu %llu %llu %llu\n", static_cast<ull>(r.id), static_cast<ull>(r.retxPackets),
                 static_cast<ull>(r.retxBytes), static_cast<ull>(r.oooPackets), static_cast<ull>(r.reorderMaxBytes));
  }
  for (const auto& r : net.ChannelStats()) {
    std::fprintf(out, "L %u %u %u %llu %llu %llu %llu %llu %llu\n", r.channel, r.src, r.dst, static_cast<ull>(r.bps),
                 static_cast<ull>(r.txBytes), static_cast<ull>(r.txPackets), static_cast<ull>(r.pausedNs),
                 static_cast<ull>(r.ecnMarks), static_cast<ull>(r.maxQueueBytes));
  }
  for (const auto& [key, value] : net.Stats()) {
    std::fprintf(out, "S %s %.17g\n", key.c_str(), value);
  }
}

}  // namespace

int RunRecords(ns3::PhantoraNetwork& net, std::vector<uint64_t> watch, std::FILE* out) {
  for (const auto& [key, text] : net.EffectiveParams()) {  // first: what the fabric runs by, known before it runs
    std::fprintf(out, "A %s %s\n", key.c_str(), text.c_str());
  }
  std::fflush(out);
  Watch(net, std::move(watch), out);
  if (net.InFlight() && !net.RunUntilIdle(kForever)) {
    std::fprintf(out, "U %llu %lld\n", static_cast<ull>(net.InFlight()), static_cast<ll>(net.Now()));
    std::fflush(out);
    return 3;
  }
  Take(net, out);
  const bool quiet = net.RunUntilQuiet(kForever);
  PrintRecords(net, out);
  std::fprintf(out, "Z %d %lld\n", quiet ? 1 : 0, static_cast<ll>(net.Now()));
  std::fflush(out);
  return 0;
}

std::vector<uint64_t> ParseWatch(const std::string& text) {
  std::vector<uint64_t> ids;
  std::istringstream in(text);
  for (std::string word; std::getline(in, word, ',');) {
    if (word.empty() || word.size() > 20 || word.find_first_not_of("0123456789") != std::string::npos) {
      throw std::invalid_argument("--watch: expected flow ids separated by commas, got '" + text + "'");
    }
    ids.push_back(std::stoull(word));
  }
  return ids;
}

}  // namespace phantora_runner
