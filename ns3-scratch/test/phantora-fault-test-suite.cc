// ns-3 TestSuite "phantora-faults": the scenario code of the fabric (docs/scenarios.md), link failures, repairs and
// re-convergence of the route table, on a leaf-spine fabric of two hosts and two spines.

#include "phantora-network.h"

#include "ns3/callback.h"
#include "ns3/config.h"
#include "ns3/test.h"

#include <algorithm>
#include <map>
#include <string>
#include <vector>

using namespace ns3;

namespace {

constexpr uint64_t kBps = 100'000'000'000ULL;  // every link 100 Gb/s
constexpr uint64_t kDelayNs = 1000;            // and 1 us
constexpr int64_t kForever = int64_t{1} << 40;

/// Two hosts on two leaves joined by two spines: a - leaf0 - spine0|spine1 - leaf1 - b. A failure is on an uplink
/// (leaf0 - spine): the host has one NIC, so the fabric routes around the failure.
struct TwoPaths {
  uint32_t a, b;
};

TwoPaths Build(PhantoraNetwork& net) {
  TwoPaths t{};
  t.a = net.AddNode("host");
  t.b = net.AddNode("host");
  const uint32_t leaf0 = net.AddNode("switch");
  const uint32_t leaf1 = net.AddNode("switch");
  const uint32_t spine0 = net.AddNode("switch");
  const uint32_t spine1 = net.AddNode("switch");
  net.AddLink(t.a, leaf0, kBps, kDelayNs);
  net.AddLink(leaf1, t.b, kBps, kDelayNs);
  for (const uint32_t spine : {spine0, spine1}) {
    net.AddLink(leaf0, spine, kBps, kDelayNs);
    net.AddLink(spine, leaf1, kBps, kDelayNs);
  }
  net.Finalize();
  return t;
}

/// The uplink a route takes: its second hop (channel ids are 2 x link + direction).
uint32_t Uplink(const std::vector<int64_t>& route) { return static_cast<uint32_t>(route.at(1) / 2); }

std::map<std::string, double> StatsOf(const PhantoraNetwork& net) {
  std::map<std::string, double> out;
  for (const auto& [k, v] : net.Stats()) {
    out[k] = v;
  }
  return out;
}

/// A failed link keeps its routes until re-convergence; then every key avoids it; after its repair and the next
/// re-convergence the routes are the intact fabric's again.
class ReconvergeRoutesTest : public TestCase {
 public:
  ReconvergeRoutesTest() : TestCase("re-convergence: routes avoid exactly the links down at that instant") {}

 private:
  void DoRun() override {
    PhantoraNetwork net;
    const TwoPaths t = Build(net);
    std::vector<std::vector<int64_t>> intact;
    for (uint64_t k = 0; k < 8; ++k) {
      intact.push_back(net.Route(t.a, t.b, k));
    }
    const uint32_t dead = Uplink(intact[0]);
    net.ScheduleLinkState(10'000, dead, false);
    net.ScheduleReconverge(15'000);
    net.ScheduleLinkState(30'000, dead, true);
    net.ScheduleReconverge(30'000);
    net.RunUntil(12'000);
    NS_TEST_ASSERT_MSG_EQ((net.Route(t.a, t.b, 0) == intact[0]), true, "routes unchanged before re-convergence");
    net.RunUntil(20'000);
    for (uint64_t k = 0; k < 8; ++k) {
      const auto r = net.Route(t.a, t.b, k);
      NS_TEST_ASSERT_MSG_EQ(r.size(), 4u, "four hops");
      NS_TEST_ASSERT_MSG_NE(Uplink(r), dead, "the dead link is avoided by every key");
    }
    net.RunUntil(40'000);
    for (uint64_t k = 0; k < 8; ++k) {
      NS_TEST_ASSERT_MSG_EQ((net.Route(t.a, t.b, k) == intact[k]), true, "the intact routes come back");
    }
    const auto st = StatsOf(net);
    NS_TEST_ASSERT_MSG_EQ(st.at("link_events"), 2.0, "one failure, one repair");
    NS_TEST_ASSERT_MSG_EQ(st.at("reconvergences"), 2.0, "two re-convergences");
    NS_TEST_ASSERT_MSG_EQ(st.at("wire_lost_packets"), 0.0, "no traffic, nothing lost");
    const auto log = net.RerouteLog();
    NS_TEST_ASSERT_MSG_EQ(log.size(), 6u, "one entry per re-convergence");
    NS_TEST_ASSERT_MSG_EQ(log[0], 15'000, "at its time");
    NS_TEST_ASSERT_MSG_EQ(log[1] + log[4], 0, "no flow to move");
  }
};

/// A 1 MB flow whose uplink fails at t1, routes re-converging d later: the NIC sends into the dead link until
/// then, those packets are lost and go-back-N resends them on the other path after the retransmission timeout.
/// The re-convergence moves exactly that flow with the bytes it had not sent once, S - R (t1 + d) within two
/// packets (R the payload rate); the flow completes with every byte.
class FailedLinkFlowTest : public TestCase {
 public:
  FailedLinkFlowTest() : TestCase("a flow on a failed link: lost, moved at re-convergence with its unsent bytes") {}

 private:
  void DoRun() override {
    PhantoraNetwork net;
    net.SetParam("nic.RetransmitTimeout", "100us");
    const TwoPaths t = Build(net);
    const uint64_t size = 1'000'000;
    const uint64_t key = 7;
    const int64_t t1 = 20'000;
    const int64_t d = 5'000;
    net.AddFlow(1, t.a, t.b, size, 0, 3, key, {}, 0);
    net.ScheduleLinkState(t1, Uplink(net.Route(t.a, t.b, key)), false);
    net.ScheduleReconverge(t1 + d);
    NS_TEST_ASSERT_MSG_EQ(net.RunUntilIdle(kForever), true, "the flow completes");
    const auto done = net.DrainCompletions();
    NS_TEST_ASSERT_MSG_EQ(done.size(), 1u, "one completion");
    const auto st = StatsOf(net);
    NS_TEST_ASSERT_MSG_GT(st.at("wire_lost_bytes"), 0.0, "packets were lost on the dead link");
    NS_TEST_ASSERT_MSG_EQ(st.at("rerouted_flows"), 1.0, "the flow moved");
    const double rate = 100.0 * 1000.0 / 1048.0 / 8.0;  // payload bytes per ns (1000 B payload, 48 B headers)
    const double unsent = static_cast<double>(size) - rate * static_cast<double>(t1 + d);
    NS_TEST_ASSERT_MSG_EQ_TOL(st.at("rerouted_bytes"), unsent, 2000.0, "with S - R (t1 + d) bytes");
    const auto log = net.RerouteLog();
    NS_TEST_ASSERT_MSG_EQ(log.size(), 3u, "one re-convergence");
    NS_TEST_ASSERT_MSG_EQ(log[0], t1 + d, "at t1 + d");
    NS_TEST_ASSERT_MSG_EQ(log[1], 1, "one flow");
    NS_TEST_ASSERT_MSG_EQ(static_cast<double>(log[2]), st.at("rerouted_bytes"), "the log and the counters agree");
  }
};

/// A flap with no re-convergence delay before any flow starts changes nothing: the flow ends when it would alone.
class FlapNoTrafficTest : public TestCase {
 public:
  FlapNoTrafficTest() : TestCase("a flap with zero delay before a flow starts changes nothing") {}

 private:
  void DoRun() override {
    auto end = [](bool flap) {
      PhantoraNetwork net;
      const TwoPaths t = Build(net);
      const uint32_t link = Uplink(net.Route(t.a, t.b, 3));
      if (flap) {
        net.ScheduleLinkState(1'000, link, false);
        net.ScheduleReconverge(1'000);
        net.ScheduleLinkState(2'000, link, true);
        net.ScheduleReconverge(2'000);
      }
      net.AddFlow(1, t.a, t.b, 200'000, 5'000, 3, 3, {}, 0);
      net.RunUntilIdle(kForever);
      const auto done = net.DrainCompletions();
      return std::pair<int64_t, double>{done.at(0).endNs, StatsOf(net).at("wire_lost_packets")};
    };
    const auto clean = end(false);
    const auto flapped = end(true);
    NS_TEST_ASSERT_MSG_EQ(flapped.first, clean.first, "same end, to the ns");
    NS_TEST_ASSERT_MSG_EQ(flapped.second, 0.0, "nothing lost");
  }
};

/// Two hosts, each with two NICs: NIC 0 on plane0, NIC 1 on plane1 (links a-plane0, b-plane0, a-plane1,
/// b-plane1, in that order, as tests/test_scenario_nic.py builds it).
TwoPaths BuildPlanes(PhantoraNetwork& net) {
  TwoPaths t{};
  t.a = net.AddNode("host");
  t.b = net.AddNode("host");
  for (int p = 0; p < 2; ++p) {
    const uint32_t plane = net.AddNode("switch");
    net.AddLink(t.a, plane, kBps, kDelayNs);
    net.AddLink(t.b, plane, kBps, kDelayNs);
  }
  net.Finalize();
  return t;
}

/// The NIC a 1 MB flow leaves by fails at t1; at the re-convergence d later its queue pair moves to the host's
/// other NIC (a failover: the "Failover" trace fires once with the two ports, nic_failovers is 1) and the flow
/// completes there. The failure stalls exactly that flow (StallLog: the link, 1 flow), the re-convergence leaves
/// none without a route. Its end: it sent into the dead port until t1 + d, then resends from the first byte
/// lost (what it had sent by t1, less the wire) at the payload rate: t1 + d + (S - R t1) / R plus a round trip
/// for the NACK and two hops, within 2 us.
class NicFailoverTest : public TestCase {
 public:
  NicFailoverTest() : TestCase("nic down: the queue pair fails over to the host's other NIC at re-convergence") {}

 private:
  void DoRun() override {
    PhantoraNetwork net;
    net.SetParam("nic.RetransmitTimeout", "100us");
    const TwoPaths t = BuildPlanes(net);
    const uint64_t size = 1'000'000;
    const uint64_t key = 5;
    const int64_t t1 = 20'000;
    const int64_t d = 10'000;
    std::vector<std::pair<uint32_t, uint32_t>> moves;
    Config::ConnectWithoutContextFailSafe(
        "/NodeList/*/$ns3::RdmaNic/Failover",
        MakeCallback(+[](std::vector<std::pair<uint32_t, uint32_t>>* out, uint64_t, uint32_t from, uint32_t to) {
          out->emplace_back(from, to);
        }).Bind(&moves));
    net.AddFlow(1, t.a, t.b, size, 0, 3, key, {}, 0);
    const std::vector<int64_t> before = net.Route(t.a, t.b, key);
    const uint32_t nic = static_cast<uint32_t>(before.at(0) / 2);  // the link of the NIC it leaves by
    net.ScheduleLinkState(t1, nic, false);
    net.ScheduleReconverge(t1 + d);
    net.RunUntil(t1 + d);
    const std::vector<int64_t> after = net.Route(t.a, t.b, key);
    NS_TEST_ASSERT_MSG_NE(after.at(0) / 2, before.at(0) / 2, "the route leaves by the other NIC");
    NS_TEST_ASSERT_MSG_EQ(net.RunUntilIdle(kForever), true, "the flow completes");
    const auto done = net.DrainCompletions();
    NS_TEST_ASSERT_MSG_EQ(done.size(), 1u, "one completion");
    const auto st = StatsOf(net);
    NS_TEST_ASSERT_MSG_EQ(st.at("nic_failovers"), 1.0, "one queue pair failed over");
    NS_TEST_ASSERT_MSG_EQ(st.at("rerouted_flows"), 1.0, "the flow moved");
    NS_TEST_ASSERT_MSG_EQ(st.at("no_route_flows"), 0.0, "it had a route");
    NS_TEST_ASSERT_MSG_EQ(st.at("stalls"), 1.0, "it stalled once, at the failure");
    NS_TEST_ASSERT_MSG_EQ(moves.size(), 1u, "the Failover trace fired once");
    NS_TEST_ASSERT_MSG_EQ(moves.at(0).first, nic / 2, "from the failed NIC's port (links 0, 2: ports 0, 1) ...");
    NS_TEST_ASSERT_MSG_EQ(moves.at(0).second, 1 - nic / 2, "... to the other");
    const auto log = net.StallLog();
    NS_TEST_ASSERT_MSG_EQ(log.size(), 6u, "a failure and a re-convergence");
    NS_TEST_ASSERT_MSG_EQ(log[0], t1, "the failure, at t1");
    NS_TEST_ASSERT_MSG_EQ(log[1], static_cast<int64_t>(nic), "on the NIC's link");
    NS_TEST_ASSERT_MSG_EQ(log[2], 1, "stalls the flow");
    NS_TEST_ASSERT_MSG_EQ(log[3], t1 + d, "the re-convergence");
    NS_TEST_ASSERT_MSG_EQ(log[4], -1, "(link -1)");
    NS_TEST_ASSERT_MSG_EQ(log[5], 0, "leaves no flow without a route");
    const double rate = 100.0 * 1000.0 / 1048.0 / 8.0;  // payload bytes per ns
    const double rtt = 4.0 * kDelayNs;
    const double expect = static_cast<double>(t1 + d) + (static_cast<double>(size) - rate * t1) / rate + rtt +
                          2.0 * kDelayNs;
    NS_TEST_ASSERT_MSG_EQ_TOL(static_cast<double>(done[0].endNs), expect, 2000.0, "ends as the closed form says");
  }
};

/// A host's only NIC fails at t1 for D, re-convergence d after each change: at the first re-convergence its flow
/// has no route and stalls at the NIC (StallLog: 1 flow at t1 + d, no_route_flows 1, no failover); after the
/// repair's re-convergence it resumes and completes.
class NicStallTest : public TestCase {
 public:
  NicStallTest() : TestCase("nic down on a one-NIC host: the flow stalls with no route, then resumes") {}

 private:
  void DoRun() override {
    PhantoraNetwork net;
    net.SetParam("nic.RetransmitTimeout", "100us");
    const TwoPaths t = Build(net);
    const int64_t t1 = 10'000;
    const int64_t d = 5'000;
    const int64_t D = 200'000;
    net.AddFlow(1, t.a, t.b, 1'000'000, 0, 3, 3, {}, 0);
    net.ScheduleLinkState(t1, 0, false);  // link 0: a - leaf0, a's only NIC
    net.ScheduleReconverge(t1 + d);
    net.ScheduleLinkState(t1 + D, 0, true);
    net.ScheduleReconverge(t1 + D + d);
    net.RunUntil(t1 + d + 1);
    const auto mid = StatsOf(net);
    NS_TEST_ASSERT_MSG_EQ(mid.at("no_route_flows"), 1.0, "no route left: the flow stalls");
    NS_TEST_ASSERT_MSG_EQ(net.Route(t.a, t.b, 3).empty(), true, "routing has no route");
    NS_TEST_ASSERT_MSG_EQ(net.RunUntilIdle(kForever), true, "the flow completes after the repair");
    const auto done = net.DrainCompletions();
    NS_TEST_ASSERT_MSG_GT(done.at(0).endNs, t1 + D + d, "after the repair's re-convergence");
    const auto st = StatsOf(net);
    NS_TEST_ASSERT_MSG_EQ(st.at("no_route_flows"), 1.0, "counted once");
    NS_TEST_ASSERT_MSG_EQ(st.at("stalls"), 1.0, "one stall: blackholed at the failure, then no route");
    NS_TEST_ASSERT_MSG_EQ(st.at("nic_failovers"), 0.0, "nowhere to fail over to");
    const auto log = net.StallLog();
    NS_TEST_ASSERT_MSG_EQ(log.size(), 9u, "a failure and two re-convergences");
    NS_TEST_ASSERT_MSG_EQ(log[2], 1, "the failure stalls the flow");
    NS_TEST_ASSERT_MSG_EQ(log[5], 1, "the first re-convergence leaves it without a route");
    NS_TEST_ASSERT_MSG_EQ(log[8], 0, "the second finds it one");
  }
};

/// A slow GPU that opens as a step marker completes (ThrottleFromFlow): a compute marker of W ns released by a step
/// marker that ends at t0 takes k W from t0 under an open window; under a window of W ns at x2 half its work is
/// done inside and half after, 1.5 W; a marker on another node keeps W.
class ThrottleFromFlowTest : public TestCase {
 public:
  ThrottleFromFlowTest() : TestCase("a slow GPU opens when a step marker completes, before what it releases") {}

 private:
  void DoRun() override {
    constexpr int64_t kT0 = 50'000;
    constexpr int64_t kW = 100'000;
    auto end = [](int64_t duration, double factor) {
      PhantoraNetwork net;
      const TwoPaths t = Build(net);
      net.ThrottleFromFlow(1, t.a, duration, factor);
      net.AddFlow(1, t.a, t.a, 0, 0, 3, 0, {}, kT0);   // the step marker: ends at t0
      net.AddFlow(2, t.a, t.a, 0, 0, 3, 0, {1}, kW);   // compute released by it
      net.AddFlow(3, t.b, t.b, 0, 0, 3, 0, {1}, kW);   // compute on another node
      net.RunUntilIdle(kForever);
      std::map<uint64_t, int64_t> out;
      for (const auto& c : net.DrainCompletions()) {
        out[c.id] = c.endNs;
      }
      return out;
    };
    const auto open = end(-1, 3.0);
    NS_TEST_ASSERT_MSG_EQ(open.at(1), kT0, "the marker ends at t0");
    NS_TEST_ASSERT_MSG_EQ(open.at(2), kT0 + 3 * kW, "its compute takes k W from t0");
    NS_TEST_ASSERT_MSG_EQ(open.at(3), kT0 + kW, "another node's compute is not slowed");
    const auto window = end(kW, 2.0);
    NS_TEST_ASSERT_MSG_EQ(window.at(2), kT0 + kW + kW / 2, "half the work in a window of W at x2, the rest after");
  }
};

class PhantoraFaultTestSuite : public TestSuite {
 public:
  PhantoraFaultTestSuite() : TestSuite("phantora-faults", Type::UNIT) {
    AddTestCase(new ReconvergeRoutesTest, TestCase::Duration::QUICK);
    AddTestCase(new FailedLinkFlowTest, TestCase::Duration::QUICK);
    AddTestCase(new FlapNoTrafficTest, TestCase::Duration::QUICK);
    AddTestCase(new NicFailoverTest, TestCase::Duration::QUICK);
    AddTestCase(new NicStallTest, TestCase::Duration::QUICK);
    AddTestCase(new ThrottleFromFlowTest, TestCase::Duration::QUICK);
  }
};

PhantoraFaultTestSuite g_phantoraFaultTestSuite;

}  // namespace
