// Unit tests of the phantora ns-3 module against closed-form answers: switch buffer accounting, wire
// sizes, attribute checking, HPCC's ECMP, and a single flow's completion times through one switch (at line
// rate, and paced at a rate cap), messages on one connection, and DCQCN's state across an idle queue pair.
#include "cc-dcqcn.h"
#include "congestion-control.h"
#include "fabric-installer.h"
#include "flat-id-map.h"
#include "phantora-fabric.h"
#include "phantora-network.h"
#include "phantora-packet.h"
#include "phantora-routing.h"
#include "phantora-wheel-scheduler.h"
#include "ring-queue.h"
#include "switch-mmu.h"
#include "uet-credit.h"
#include "wire-format.h"

#include "ns3/test.h"

#include "ns3/packet.h"
#include "ns3/simulator.h"
#include "ns3/string.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <map>
#include <memory>
#include <tuple>
#include <utility>
#include <vector>
#include <stdexcept>
#include <string>

using namespace ns3;

namespace {

/// Hosts a and b on one switch, both links at `bps` with `delayNs`; the network finalised. Returns (a, b).
std::pair<uint32_t, uint32_t> TwoHostsOneSwitch(PhantoraNetwork& net, uint64_t bps, uint64_t delayNs) {
  const uint32_t a = net.AddNode("host");
  const uint32_t b = net.AddNode("host");
  const uint32_t sw = net.AddNode("switch");
  net.AddLink(a, sw, bps, delayNs);
  net.AddLink(sw, b, bps, delayNs);
  net.Finalize();
  return {a, b};
}

/// The dynamic threshold is (buffer - headroom - reserves - shared use) >> shift, and PFC pauses a class
/// past it and resumes it once its shared use + the resume offset is back under it.
class MmuThresholdTest : public TestCase {
 public:
  MmuThresholdTest() : TestCase("dynamic PFC threshold, pause and resume of the shared-buffer MMU") {}

 private:
  void DoRun() override {
    SwitchMmu mmu;
    SwitchMmu::Config cfg;
    cfg.bufferBytes = 100000;
    cfg.reserveBytes = 4096;
    cfg.resumeOffsetBytes = 3072;
    cfg.shift = 3;
    mmu.Configure(2, cfg);
    mmu.SetHeadroom(0, 2000);
    mmu.SetHeadroom(1, 2000);
    NS_TEST_ASSERT_MSG_EQ(mmu.Threshold(), uint64_t{(100000 - 4000 - 2 * 4096) >> 3}, "empty-buffer threshold");
    mmu.Add(0, 3, 4096);  // fills the reserve of (0, 3): no shared use yet
    NS_TEST_ASSERT_MSG_EQ(mmu.SharedUsed(0, 3), 0u, "the reserve is not shared");
    uint64_t added = 0;
    while (!mmu.ShouldPause(0, 3)) {
      NS_TEST_ASSERT_MSG_EQ(mmu.Admit(0, 3, 1000), true, "admitted below the threshold");
      mmu.Add(0, 3, 1000);
      added += 1000;
      NS_TEST_ASSERT_MSG_LT(added, 100000u, "never paused");
    }
    // Paused as soon as shared use reaches the threshold, or a packet went past it into the headroom.
    const uint64_t shared = mmu.SharedUsed(0, 3);
    const uint64_t hdrm = mmu.HeadroomUsed(0, 3);
    NS_TEST_ASSERT_MSG_EQ(shared + hdrm, added, "every byte past the reserve is shared or headroom");
    const uint64_t expected = (100000 - 4000 - 2 * 4096 - shared) >> 3;
    NS_TEST_ASSERT_MSG_EQ(mmu.Threshold(), expected, "threshold shrinks with use");
    const bool atThreshold = shared >= expected || (hdrm > 0 && shared + 1000 > expected);
    NS_TEST_ASSERT_MSG_EQ(atThreshold, true, "paused only at or past the threshold");
    const uint64_t emptyThreshold = (100000 - 4000 - 2 * 4096) >> 3;
    NS_TEST_ASSERT_MSG_LT(shared, emptyThreshold, "paused before the empty-buffer threshold");
    mmu.SetPaused(0, 3, true);
    while (!mmu.ShouldResume(0, 3)) {
      mmu.Remove(0, 3, 1000);
    }
    NS_TEST_ASSERT_MSG_LT_OR_EQ(mmu.SharedUsed(0, 3) + 3072, mmu.Threshold(), "XON at offset under threshold");
  }
};

/// Data packets are payload + header (+ INT), control packets header (+ INT), PFC frames their own size.
class WireFormatTest : public TestCase {
 public:
  WireFormatTest() : TestCase("bytes on the wire per packet kind") {}

 private:
  void DoRun() override {
    WireFormat w;
    PhantoraHeader data;
    data.type = PktType::Data;
    data.payload = 1000;
    PhantoraHeader ack;
    ack.type = PktType::Ack;
    PhantoraHeader pfc;
    pfc.type = PktType::Pfc;
    NS_TEST_ASSERT_MSG_EQ(w.Bytes(data), 1048u, "data");
    NS_TEST_ASSERT_MSG_EQ(w.Bytes(ack), 48u, "ack");
    NS_TEST_ASSERT_MSG_EQ(w.Bytes(pfc), 64u, "pfc");
    NS_TEST_ASSERT_MSG_EQ(w.DataBytes(1000), 1048u, "data, from its payload alone");
    w.intOn = true;
    NS_TEST_ASSERT_MSG_EQ(w.Bytes(data), 1090u, "data with INT");
    NS_TEST_ASSERT_MSG_EQ(w.DataBytes(1000), 1090u, "data with INT, from its payload alone");
    NS_TEST_ASSERT_MSG_EQ(w.Bytes(ack), 90u, "ack with INT");
    NS_TEST_ASSERT_MSG_EQ(w.Bytes(pfc), 64u, "pfc without INT");
  }
};

/// Receiver credits (RCCC): the pacer grants in turn, a quantum at a time, up to what each message asked for;
/// the ledger sends against speculation, then grants; a Credit header keeps its grant through serialisation.
class CreditTest : public TestCase {
 public:
  CreditTest() : TestCase("receiver credits: grants in turn, cumulative, speculation ends at the first answer") {}

 private:
  void DoRun() override {
    CreditPacer pacer;
    pacer.Ask(1, 10000);
    pacer.Ask(2, 3000);
    pacer.Ask(1, 5000);  // smaller than before: changes nothing
    uint64_t flow = 0;
    uint64_t cum = 0;
    uint64_t bytes = 0;
    const uint64_t want[][3] = {{1, 4000, 4000}, {2, 3000, 3000}, {1, 8000, 4000}, {1, 10000, 2000}};
    for (const auto& w : want) {
      NS_TEST_ASSERT_MSG_EQ(pacer.Next(4000, flow, cum, bytes), true, "a grant is due");
      NS_TEST_ASSERT_MSG_EQ(flow, w[0], "in turn");
      NS_TEST_ASSERT_MSG_EQ(cum, w[1], "cumulative");
      NS_TEST_ASSERT_MSG_EQ(bytes, w[2], "at most a quantum, at most what is asked");
    }
    NS_TEST_ASSERT_MSG_EQ(pacer.Next(4000, flow, cum, bytes), false, "everything asked for is granted");
    pacer.Add(2, 1000);  // a trimmed packet to resend
    pacer.Ask(3, 500);
    pacer.Forget(3);
    NS_TEST_ASSERT_MSG_EQ(pacer.Next(4000, flow, cum, bytes), true, "the resend's grant");
    NS_TEST_ASSERT_MSG_EQ(flow, 2u, "to the trimmed packet's message");
    NS_TEST_ASSERT_MSG_EQ(cum, 4000u, "on top of its grant");
    NS_TEST_ASSERT_MSG_EQ(pacer.Next(4000, flow, cum, bytes), false, "a forgotten message gets nothing");

    CreditLedger ledger;
    ledger.Configure(3000, 6000, 1000);
    for (int i = 0; i < 3; ++i) {
      NS_TEST_ASSERT_MSG_EQ(ledger.CanSend(), true, "speculation");
      ledger.OnSend(1000);
    }
    NS_TEST_ASSERT_MSG_EQ(ledger.CanSend(), false, "speculation spent");
    NS_TEST_ASSERT_MSG_EQ(ledger.Target(50000, 0), 6000u, "asks for MaxCredit ahead of what it spent");
    NS_TEST_ASSERT_MSG_EQ(ledger.Target(50000, 2000), 3000u, "or a window and a packet, under a window");
    NS_TEST_ASSERT_MSG_EQ(ledger.Target(500, 0), 500u, "or what is left");
    ledger.OnGrant(1000);
    NS_TEST_ASSERT_MSG_EQ(ledger.CanSend(), true, "a grant");
    ledger.OnSend(1000);
    NS_TEST_ASSERT_MSG_EQ(ledger.CanSend(), false, "spent");
    ledger.OnGrant(500);  // an older grant, overtaken
    NS_TEST_ASSERT_MSG_EQ(ledger.CanSend(), false, "grants are cumulative");

    CreditLedger early;
    early.Configure(3000, 6000, 1000);
    early.OnSend(1000);
    early.StopSpeculating();  // an ACK came: the 2000 speculative bytes not spent are dropped
    NS_TEST_ASSERT_MSG_EQ(early.CanSend(), false, "no speculation after the first answer");

    PhantoraHeader grant;
    grant.type = PktType::Credit;
    grant.credit = 123456789;
    Packet pkt;
    pkt.AddHeader(grant);
    PhantoraHeader back;
    pkt.RemoveHeader(back);
    NS_TEST_ASSERT_MSG_EQ(back.credit, 123456789u, "the grant survives serialisation");
    NS_TEST_ASSERT_MSG_EQ(WireFormat{}.Bytes(grant), 48u, "a Credit packet is a header");
  }
};

/// True if `call` throws std::invalid_argument.
template <typename F>
bool Rejects(F call) {
  try {
    call();
  } catch (const std::invalid_argument&) {
    return true;
  }
  return false;
}

/// Every setting is an attribute, checked before ns-3 parses it (some ns-3 parsers abort on bad text).
class AttributeCheckTest : public TestCase {
 public:
  AttributeCheckTest() : TestCase("settings are attributes; bad names and values are rejected, not aborted on") {}

 private:
  void DoRun() override {
    PhantoraNetwork net;
    net.SetParam("nic.PayloadSize", "4000");
    net.SetParam("switch.KminMap", "100000000000 400000");
    net.SetParam("fabric.IntMode", "Off");
    net.SetParam("recorder.QueueSampleInterval", "1us");
    net.SetParam("fabric.CongestionControl", "ns3::CcDcqcn");
    NS_TEST_ASSERT_MSG_EQ(Rejects([&] { net.SetParam("nic.PayloadSize", "0"); }), true, "below the minimum");
    NS_TEST_ASSERT_MSG_EQ(Rejects([&] { net.SetParam("nic.PayloadSize", "-5"); }), true, "negative");
    NS_TEST_ASSERT_MSG_EQ(Rejects([&] { net.SetParam("nic.AckInterval", "two"); }), true, "not a number");
    NS_TEST_ASSERT_MSG_EQ(Rejects([&] { net.SetParam("switch.DtShift", "31"); }), true, "above the maximum");
    NS_TEST_ASSERT_MSG_EQ(Rejects([&] { net.SetParam("fabric.IntMode", "Sometimes"); }), true, "unknown enum");
    NS_TEST_ASSERT_MSG_EQ(Rejects([&] { net.SetParam("nic.NackInterval", "5 parsecs"); }), true, "bad time");
    NS_TEST_ASSERT_MSG_EQ(Rejects([&] { net.SetParam("nic.NoSuchThing", "1"); }), true, "unknown attribute");
    NS_TEST_ASSERT_MSG_EQ(Rejects([&] { net.SetParam("payload_bytes", "1000"); }), true, "no scope");
    NS_TEST_ASSERT_MSG_EQ(Rejects([&] { net.SetParam("router.Foo", "1"); }), true, "unknown scope");
    net.SetParam("cc.G", "0.5");
    net.SetParam("cc.NoSuchAttribute", "1");  // checked at Finalize, once the CC type is final
    net.AddNode("host");
    NS_TEST_ASSERT_MSG_EQ(Rejects([&] { net.Finalize(); }), true, "a CC attribute its type does not have");
  }
};

/// CCs are known by the names their own files register (PHANTORA_REGISTER_CC), as well as by TypeId name.
class CcRegistryTest : public TestCase {
 public:
  CcRegistryTest() : TestCase("congestion controls by registered name; an unknown one lists the registered") {}

 private:
  void DoRun() override {
    for (const char* name : {"none", "dcqcn", "hpcc", "timely", "dctcp", "swift"}) {
      NS_TEST_ASSERT_MSG_EQ(CcRegistry::Lookup(name).IsChildOf(CongestionControl::GetTypeId()), true, name);
    }
    NS_TEST_ASSERT_MSG_EQ(CcRegistry::Lookup("swift").GetName(), std::string("ns3::CcSwift"), "name -> TypeId");
    NS_TEST_ASSERT_MSG_EQ(CcRegistry::Lookup("ns3::CcDcqcn").GetName(), std::string("ns3::CcDcqcn"), "a TypeId");
    std::string why;
    try {
      CcRegistry::Lookup("cubic");
    } catch (const std::invalid_argument& e) {
      why = e.what();
    }
    NS_TEST_ASSERT_MSG_NE(why.find("unknown congestion control 'cubic' (registered: dcqcn, dctcp, hpcc, none, "),
                          std::string::npos, why);
    const std::string json = CcRegistry::Json();
    NS_TEST_ASSERT_MSG_NE(json.find("\"swift\": {\"typeid\": \"ns3::CcSwift\""), std::string::npos, "JSON entry");
    NS_TEST_ASSERT_MSG_NE(json.find("\"BaseTarget\": {\"type\": \"ns3::TimeValue\", \"default\": \"+5000ns\""),
                          std::string::npos, "attribute with its default");
    PhantoraNetwork net;
    net.SetParam("fabric.CongestionControl", "cubic");
    net.AddNode("host");
    NS_TEST_ASSERT_MSG_EQ(Rejects([&] { net.Finalize(); }), true, "an unregistered CC");
  }
};

/// One flow through one store-and-forward switch, at line rate: the last byte arrives after N packets'
/// serialisation on the first link, one more on the second, and both propagation delays; the sender
/// has its last ACK one ACK-serialisation per hop and both delays later.
class SingleFlowTest : public TestCase {
 public:
  SingleFlowTest(uint32_t payload) : TestCase("one flow through a switch, payload " + std::to_string(payload)),
                                     m_payload(payload) {}

 private:
  void DoRun() override {
    const uint64_t bps = 100'000'000'000ULL;
    const uint64_t delayNs = 1000;
    const uint64_t size = 1'000'000;
    PhantoraNetwork net;
    net.SetParam("nic.PayloadSize", std::to_string(m_payload));
    const auto [a, b] = TwoHostsOneSwitch(net, bps, delayNs);
    net.AddFlow(7, a, b, size, 0, 3, 7, {}, 0);
    NS_TEST_ASSERT_MSG_EQ(net.RunUntilIdle(int64_t{1} << 40), true, "the flow completes");
    NS_TEST_ASSERT_MSG_EQ(net.RunUntilQuiet(int64_t{1} << 40), true, "and is acknowledged");
    const auto done = net.DrainCompletions();
    const auto fct = net.DrainFct();
    NS_TEST_ASSERT_MSG_EQ(done.size(), 1u, "one completion");
    NS_TEST_ASSERT_MSG_EQ(fct.size(), 1u, "one FCT record");
    const double pkts = std::ceil(static_cast<double>(size) / m_payload);
    const double bytes = static_cast<double>(size) + pkts * 48;
    const double lastPkt = (size - (pkts - 1) * m_payload + 48) * 8.0 / 100.0;  // ns on one hop
    const double lastByte = bytes * 8.0 / 100.0 + lastPkt + 2.0 * delayNs;
    NS_TEST_ASSERT_MSG_EQ_TOL(static_cast<double>(done[0].endNs - done[0].startNs), lastByte, 3.0,
                              "last byte at N serialisations + one + 2 delays");
    const double ackBack = 2 * (48 * 8.0 / 100.0) + 2.0 * delayNs;
    NS_TEST_ASSERT_MSG_EQ_TOL(static_cast<double>(fct[0].fctNs), lastByte + ackBack, 4.0, "FCT at the last ACK");
    // HPCC's standalone FCT: base RTT (2 delays + one full packet per hop each way... as HPCC: per hop) + the
    // flow with headers at line rate.
    const double baseRtt = 2.0 * 2 * delayNs + 2 * (m_payload * 8.0 / 100.0);
    NS_TEST_ASSERT_MSG_EQ_TOL(static_cast<double>(fct[0].standaloneNs), baseRtt + bytes * 8.0 / 100.0, 2.0,
                              "standalone FCT");
  }

  uint32_t m_payload;
};

/// A rate-capped flow (SetMaxRate, payload bits/s) through one switch: its NIC charges each packet's payload at
/// the cap before the packet's last bit leaves, so packet k's last bit leaves at (k + 1) x payload x 8 / cap (the
/// cap binds: 25 of 100 Gb/s), the flow's last byte at size x 8 / cap as a fluid flow at the cap, and it arrives
/// after the last packet's second serialisation at line rate and both delays. The last packet is short (500 B):
/// the cap still counts payload only. A one-packet flow is held likewise (its payload at the cap, not its wire
/// bytes at line rate).
class RateCapTest : public TestCase {
 public:
  RateCapTest() : TestCase("a rate-capped flow is paced at its cap, in payload bits per second") {}

 private:
  void DoRun() override {
    const uint64_t bps = 100'000'000'000ULL;
    const uint64_t cap = 25'000'000'000ULL;
    const uint64_t delayNs = 1000;
    const uint64_t payload = 1000;
    const uint64_t size = 1'000'500;
    PhantoraNetwork net;
    net.SetParam("nic.PayloadSize", std::to_string(payload));
    const auto [a, b] = TwoHostsOneSwitch(net, bps, delayNs);
    net.AddFlow(7, a, b, size, 0, 3, 7, {}, 0);
    net.SetMaxRate(7, cap);
    bool threw = false;
    try {
      net.SetMaxRate(8, cap);
    } catch (const std::invalid_argument&) {
      threw = true;
    }
    NS_TEST_ASSERT_MSG_EQ(threw, true, "SetMaxRate of an unknown flow throws");
    NS_TEST_ASSERT_MSG_EQ(net.RunUntilIdle(int64_t{1} << 40), true, "the flow completes");
    const auto done = net.DrainCompletions();
    NS_TEST_ASSERT_MSG_EQ(done.size(), 1u, "one completion");
    const double lastLeft = size * 8.0 / (cap / 1e9);  // the last bit leaves the NIC: the whole payload at the cap
    const double lastHop = (size - size / payload * payload + 48) * 8.0 / (bps / 1e9);
    NS_TEST_ASSERT_MSG_EQ_TOL(static_cast<double>(done[0].endNs - done[0].startNs), lastLeft + lastHop + 2.0 * delayNs,
                              2.0, "last bit out at size / cap, then the switch's hop at line rate and 2 delays");
    // The standalone FCT at the flow's own rate: base RTT + its payload at the cap (which binds over the wire
    // bytes at line rate), so the flow, alone, has slowdown 1 within one packet at the cap.
    NS_TEST_ASSERT_MSG_EQ(net.RunUntilQuiet(int64_t{1} << 40), true, "and is acknowledged");
    const auto fct = net.DrainFct();
    NS_TEST_ASSERT_MSG_EQ(fct.size(), 1u, "one FCT record");
    const double baseRtt = 2.0 * 2 * delayNs + 2 * (payload * 8.0 / (bps / 1e9));
    const double alone = baseRtt + size * 8.0 / (cap / 1e9);
    NS_TEST_ASSERT_MSG_EQ_TOL(static_cast<double>(fct[0].standaloneNs), alone, 1.0, "standalone FCT at the cap");
    NS_TEST_ASSERT_MSG_EQ_TOL(static_cast<double>(fct[0].fctNs), alone, payload * 8.0 / (cap / 1e9),
                              "alone at its cap: the FCT is its standalone FCT within one packet at the cap");
    net.Close();

    PhantoraNetwork one;  // one packet: held until its payload at the cap has gone, not sent at once
    one.SetParam("nic.PayloadSize", std::to_string(payload));
    const auto [c, d] = TwoHostsOneSwitch(one, bps, delayNs);
    one.AddFlow(9, c, d, 500, 0, 3, 9, {}, 0);
    one.SetMaxRate(9, cap);
    NS_TEST_ASSERT_MSG_EQ(one.RunUntilIdle(int64_t{1} << 40), true, "the one-packet flow completes");
    const auto single = one.DrainCompletions();
    NS_TEST_ASSERT_MSG_EQ(single.size(), 1u, "one completion");
    NS_TEST_ASSERT_MSG_EQ_TOL(static_cast<double>(single[0].endNs - single[0].startNs),
                              500 * 8.0 / (cap / 1e9) + (500 + 48) * 8.0 / (bps / 1e9) + 2.0 * delayNs, 2.0,
                              "one packet: out at 500 B / cap, then the switch's hop and 2 delays");
  }
};

/// CompletionBounds: a lone 1 MB flow over two leaves and two spines, one spine link 4x slower to cross than the
/// other (the bound takes the least propagation of any candidate route). Right after its start the bound is
/// size x 8 / line rate + that propagation, less the first packet (sent) and 2 ns; it never passes the end,
/// and it never falls.
class CompletionBoundTest : public TestCase {
 public:
  CompletionBoundTest() : TestCase("completion bound of a lone flow: its closed form, never past its end") {}

 private:
  void DoRun() override {
    const uint64_t bps = 100'000'000'000ULL;
    const uint64_t size = 1'000'000;
    PhantoraNetwork net;
    net.SetParam("nic.PayloadSize", "4000");
    const uint32_t a = net.AddNode("host");
    const uint32_t b = net.AddNode("host");
    const uint32_t l0 = net.AddNode("switch");
    const uint32_t l1 = net.AddNode("switch");
    const uint32_t s0 = net.AddNode("switch");
    const uint32_t s1 = net.AddNode("switch");
    net.AddLink(a, l0, bps, 1000);
    net.AddLink(b, l1, bps, 1000);
    net.AddLink(l0, s0, bps, 500);
    net.AddLink(l1, s0, bps, 500);
    net.AddLink(l0, s1, bps, 2000);
    net.AddLink(l1, s1, bps, 2000);
    net.Finalize();
    net.AddFlow(3, a, b, size, 1000, 3, 3, {}, 0);
    net.RunUntil(1000);
    const auto first = net.CompletionBounds();
    NS_TEST_ASSERT_MSG_EQ(first.size(), 1u, "one started flow");
    const int64_t prop = 1000 + 500 + 500 + 1000;
    const int64_t closed = 1000 + static_cast<int64_t>(size * 8 / 100) + prop;
    const int64_t packet = 4000 * 8 / 100;
    NS_TEST_ASSERT_MSG_EQ(first[0].id, 3u, "its id");
    NS_TEST_ASSERT_MSG_EQ(first[0].ns, closed - packet - 2, "start + (size - one packet) at line rate + least prop - 2");
    int64_t last = first[0].ns;
    int64_t t = 1000;
    while (net.InFlight() > 0 && last != net.Now() + 1) {
      t += 10'000;
      net.RunUntil(t);
      for (const FlowBound& bnd : net.CompletionBounds()) {
        NS_TEST_ASSERT_MSG_GT_OR_EQ(bnd.ns, last, "the bound never falls");
        last = bnd.ns;
      }
    }
    NS_TEST_ASSERT_MSG_EQ(net.RunUntilIdle(int64_t{1} << 40), true, "the flow completes");
    const auto done = net.DrainCompletions();
    NS_TEST_ASSERT_MSG_GT_OR_EQ(done[0].endNs, last, "no bound passes the end");
    // What the bound leaves out: the route ECMP took over the least one, the first packet, every packet's
    // header, and the last packet's store and forward at the three switches.
    const int64_t delays[] = {1000, 1000, 500, 500, 2000, 2000};
    int64_t taken = 0;
    for (int64_t ch : net.Route(a, b, 3)) {
      taken += delays[ch >> 1];
    }
    const double gap = static_cast<double>(taken - prop) + packet + (size / 4000) * 48 * 8 / 100.0 +
                       3 * (4048 * 8 / 100.0) + 2;
    NS_TEST_ASSERT_MSG_EQ_TOL(static_cast<double>(done[0].endNs - first[0].ns), gap, 2.0,
                              "the first bound leaves out only the route taken, headers and store and forward");
  }
};

/// The Hpcc ECMP policy: MurmurHash3 x86_32 (reference value of the words 1, 2, 3 with seed 0), HPCC
/// addresses, the reversed ports of ACKs, and next hops in HPCC's BFS order (switches by descending id).
class HpccEcmpTest : public TestCase {
 public:
  HpccEcmpTest() : TestCase("HPCC ECMP: MurmurHash3, addresses, ACK ports, next-hop order") {}

 private:
  void DoRun() override {
    const uint32_t words[3] = {1, 2, 3};
    NS_TEST_ASSERT_MSG_EQ(Murmur3Words(words, 3, 0), 0xe9d78ad6u, "MurmurHash3_x86_32 of 12 bytes");
    NS_TEST_ASSERT_MSG_EQ(HpccIp(256), 0x0b010001u, "node 256's address");
    // Two hosts on leaf 2, each leaf linked to spines 4 and 5; host 1 on leaf 3.
    RouteTable t;
    for (NodeKind k : {NodeKind::Host, NodeKind::Host, NodeKind::Switch, NodeKind::Switch, NodeKind::Switch,
                       NodeKind::Switch}) {
      t.AddNode(k);
    }
    t.AddLink(0, 2, 0);
    t.AddLink(1, 3, 1);
    t.AddLink(2, 4, 2);  // leaf 2: port 1 -> spine 4, port 2 -> spine 5
    t.AddLink(2, 5, 3);
    t.AddLink(3, 4, 4);
    t.AddLink(3, 5, 5);
    t.SetEcmpHash(EcmpHashKind::Hpcc);
    const std::vector<uint32_t> order = t.Candidates(2, 1);
    NS_TEST_ASSERT_MSG_EQ(order.size(), 2u, "two spines");
    NS_TEST_ASSERT_MSG_EQ(order[0], 2u, "spine 5 (the higher id) first");
    const uint64_t key = 10000 | (uint64_t{100} << 16);
    const uint32_t h = HpccEcmpHash(0, 1, key, 2);
    const uint32_t w[3] = {HpccIp(0), HpccIp(1), 10000u | (100u << 16)};
    NS_TEST_ASSERT_MSG_EQ(h, Murmur3Words(w, 3, 2), "hash of (sip, dip, sport | dport << 16), seed = node");
    NS_TEST_ASSERT_MSG_EQ(t.Pick(2, 0, 1, key, false), order[h % 2], "the pick is the hash modulo the next hops");
    const uint64_t reversed = 100u | (uint64_t{10000} << 16);
    NS_TEST_ASSERT_MSG_EQ(t.ReverseKey(key), reversed, "an ACK swaps the ports");
    t.SetEcmpHash(EcmpHashKind::Phantora);
    NS_TEST_ASSERT_MSG_EQ(t.Candidates(2, 1)[0], 1u, "phantora: spine 4 (the lower id) first");
    NS_TEST_ASSERT_MSG_EQ(t.ReverseKey(key), key, "phantora: ACKs hash the flow's key");
  }
};

/// A flow's route through the NICs is its own flag, not a bit of its ECMP key: GPUs 0 and 1 share NVSwitch 2 and
/// each has a NIC port to leaf 3. A key with queue pair 64 in bits 56-62 (bit 62 set, which the routing once read as
/// "through the NICs") still goes over the NVSwitch; viaNic goes through the leaf, and the flag survives a header's
/// serialisation in the type byte (the serialised size unchanged).
class ViaNicRouteTest : public TestCase {
 public:
  ViaNicRouteTest() : TestCase("RouteTable and PhantoraHeader: viaNic routes, not the key's bit 62") {}

 private:
  void DoRun() override {
    RouteTable t;
    for (NodeKind k : {NodeKind::Gpu, NodeKind::Gpu, NodeKind::NvSwitch, NodeKind::Switch}) {
      t.AddNode(k);
    }
    t.AddLink(0, 2, 0);  // channels 0 (0 -> 2), 1
    t.AddLink(1, 2, 1);  // 2, 3 (2 -> 1)
    t.AddLink(0, 3, 2);  // 4 (0 -> 3), 5
    t.AddLink(1, 3, 3);  // 6, 7 (3 -> 1)
    const uint64_t key = 7 | (uint64_t{64} << 56);
    NS_TEST_ASSERT_MSG_EQ((t.Path(0, 1, key, false) == std::vector<int64_t>{0, 3}), true, "QP 64: the NVSwitch");
    NS_TEST_ASSERT_MSG_EQ((t.Path(0, 1, key, true) == std::vector<int64_t>{4, 7}), true, "viaNic: the leaf");
    NS_TEST_ASSERT_MSG_EQ((t.Path(0, 1, 7, true) == std::vector<int64_t>{4, 7}), true, "viaNic, any key: the leaf");
    std::vector<uint32_t> into;
    NS_TEST_ASSERT_MSG_EQ((t.PathInto(0, 1, key, false, into) && into == std::vector<uint32_t>{0, 3}), true,
                          "PathInto as Path");
    NS_TEST_ASSERT_MSG_EQ((t.PathInto(0, 1, key, true, into) && into == std::vector<uint32_t>{4, 7}), true,
                          "PathInto as Path, viaNic");
    RouteTable alone;  // no leaf: over the NVSwitch only
    for (NodeKind k : {NodeKind::Gpu, NodeKind::Gpu, NodeKind::NvSwitch}) {
      alone.AddNode(k);
    }
    alone.AddLink(0, 2, 0);
    alone.AddLink(1, 2, 1);
    NS_TEST_ASSERT_MSG_EQ(alone.Reachable(0, 1, false), true, "the NVSwitch reaches");
    NS_TEST_ASSERT_MSG_EQ(alone.Reachable(0, 1, true), false, "no NIC route");
    for (PktType type : {PktType::Data, PktType::Ack, PktType::Credit}) {
      for (bool viaNic : {false, true}) {
        PhantoraHeader h;
        h.type = type;
        h.ecmpKey = key;
        h.viaNic = viaNic;
        Packet pkt;
        pkt.AddHeader(h);
        NS_TEST_ASSERT_MSG_EQ(pkt.GetSize(), PhantoraHeader{}.GetSerializedSize() + (h.HasCredit() ? 8u : 0u),
                              "the flag takes no byte");
        PhantoraHeader back;
        pkt.RemoveHeader(back);
        NS_TEST_ASSERT_MSG_EQ((back.type == type && back.viaNic == viaNic && back.ecmpKey == key), true,
                              "type, route and key survive serialisation");
      }
    }
  }
};

/// Flowlet switching never reorders within a flowlet: 4 hosts of leaf 0 send to one host of leaf 1 over 2
/// spines (a 4:1 incast with a small buffer, so PFC pauses open gaps and flows move between spines). Leaf 0's
/// LbPick trace gives each packet's flowlet in send order (the host's link is FIFO); leaf 1's gives the order
/// they reach the receiver's link. Within every flowlet the two orders must agree.
class FlowletOrderTest : public TestCase {
 public:
  FlowletOrderTest() : TestCase("flowlets never reorder within a flowlet") {}

 private:
  using Key = std::pair<uint64_t, uint64_t>;  // (flow, send time ns): one transmission of one packet

  void DoRun() override {
    Ptr<PhantoraFabric> fabric = CreateObject<PhantoraFabric>();
    std::vector<uint32_t> hosts;
    for (int i = 0; i < 5; ++i) {
      hosts.push_back(fabric->AddNode("host"));
    }
    const uint32_t leaf0 = fabric->AddNode("switch");
    const uint32_t leaf1 = fabric->AddNode("switch");
    const uint32_t spine0 = fabric->AddNode("switch");
    const uint32_t spine1 = fabric->AddNode("switch");
    const uint64_t bps = 100'000'000'000ULL;
    for (int i = 0; i < 4; ++i) {
      fabric->AddLink(hosts[i], leaf0, bps, 1000);
    }
    fabric->AddLink(hosts[4], leaf1, bps, 1000);
    for (uint32_t s : {spine0, spine1}) {
      fabric->AddLink(leaf0, s, bps, 1000);
      fabric->AddLink(leaf1, s, bps, 1000);
    }
    FabricInstaller installer;
    installer.SetSwitchAttribute("LoadBalancing", "flowlet");
    installer.SetSwitchAttribute("FlowletGap", "500ns");
    installer.SetSwitchAttribute("BufferSize", "300000");
    installer.SetNicAttribute("Receiver", "sack");
    uint32_t done = 0;
    installer.Install(fabric, Callback<void, uint64_t>([&done](uint64_t) { ++done; }),
                      Callback<void, uint64_t>([](uint64_t) {}));
    std::map<Key, uint64_t> flowletOf;
    std::map<std::pair<uint64_t, uint64_t>, std::vector<Key>> sent;  // (flow, flowlet) -> packets in send order
    std::vector<Key> arrived;
    fabric->GetNode(leaf0).sw->TraceConnectWithoutContext(
        "LbPick", Callback<void, uint64_t, uint64_t, uint64_t, uint32_t, uint64_t>(
                      [&](uint64_t flow, uint64_t, uint64_t ts, uint32_t, uint64_t flowlet) {
                        flowletOf[{flow, ts}] = flowlet;
                        sent[{flow, flowlet}].push_back({flow, ts});
                      }));
    fabric->GetNode(leaf1).sw->TraceConnectWithoutContext(
        "LbPick", Callback<void, uint64_t, uint64_t, uint64_t, uint32_t, uint64_t>(
                      [&](uint64_t flow, uint64_t, uint64_t ts, uint32_t, uint64_t) { arrived.push_back({flow, ts}); }));
    for (uint32_t i = 0; i < 4; ++i) {
      fabric->GetNode(hosts[4]).nic->ExpectFlow(i, 1'000'000);
      fabric->GetNode(hosts[i]).nic->StartFlow(QpSpec{i, hosts[4], 1'000'000, 3, i});
    }
    Simulator::Stop(MilliSeconds(10));
    Simulator::Run();
    NS_TEST_ASSERT_MSG_EQ(done, 4u, "every flow completes");
    std::map<std::pair<uint64_t, uint64_t>, std::vector<Key>> got;
    for (const Key& k : arrived) {
      got[{k.first, flowletOf.at(k)}].push_back(k);
    }
    NS_TEST_ASSERT_MSG_GT(sent.size(), 8u, "flows were split into several flowlets");
    uint32_t moved = 0;
    for (const auto& [flowlet, order] : sent) {
      NS_TEST_ASSERT_MSG_EQ((got[flowlet] == order), true, "arrival order = send order within a flowlet");
      moved += flowlet.second > 0 ? 1 : 0;
    }
    NS_TEST_ASSERT_MSG_GT(moved, 0u, "later flowlets exist");
    fabric->Dispose();
    Simulator::Destroy();
  }
};

/// The wheel scheduler hands out events in (time, uid) order, whatever mix of near, far, earlier-than-window and
/// put-back events it holds: checked against the sorted keys.
class WheelOrderTest : public TestCase {
 public:
  WheelOrderTest() : TestCase("wheel scheduler: events leave in (time, uid) order, with or without hints") {}

 private:
  static Scheduler::Event Ev(uint64_t ts, uint32_t uid) {
    Scheduler::Event e;
    e.impl = nullptr;
    e.key.m_ts = ts;
    e.key.m_uid = uid;
    e.key.m_context = 0;
    return e;
  }

  void DoRun() override {
    PhantoraWheelScheduler w;
    std::vector<std::pair<uint64_t, uint32_t>> want;
    std::vector<std::pair<uint64_t, uint32_t>> got;
    uint32_t uid = 0;
    uint64_t now = 0;
    uint64_t lcg = 12345;
    auto next = [&lcg] { return (lcg = lcg * 6364136223846793005ULL + 1442695040888963407ULL) >> 33; };
    for (int round = 0; round < 20000; ++round) {
      // Schedule 0-3 events at now + a delay: mostly within a few us, some past the 8,192 ns window.
      const uint64_t k = next() % 4;
      for (uint64_t i = 0; i < k; ++i) {
        const uint64_t r = next() % 100;
        const uint64_t delay = r < 80 ? next() % 2000 : r < 95 ? next() % 9000 : 8000 + next() % 1'000'000;
        if (uid % 2) {
          w.InsertHinted(Ev(now + delay, uid), &lcg);  // a prefetch hint changes nothing but the cache
        } else {
          w.Insert(Ev(now + delay, uid));
        }
        want.emplace_back(now + delay, uid++);
      }
      if (!w.IsEmpty() && next() % 3 != 0) {
        const Scheduler::Event e = w.RemoveNext();
        NS_TEST_ASSERT_MSG_EQ((e.key.m_ts >= now), true, "time never goes back");
        now = e.key.m_ts;
        got.emplace_back(e.key.m_ts, e.key.m_uid);
      }
      if (round % 1000 == 999 && !w.IsEmpty()) {
        // Peek past a few events and put them back (as PeekNextLiveTs does): the order must not change.
        std::vector<Scheduler::Event> lifted;
        for (int j = 0; j < 3 && !w.IsEmpty(); ++j) {
          lifted.push_back(w.RemoveNext());
        }
        for (const auto& e : lifted) {
          w.Insert(e);
        }
      }
    }
    while (!w.IsEmpty()) {
      const Scheduler::Event e = w.RemoveNext();
      got.emplace_back(e.key.m_ts, e.key.m_uid);
    }
    std::sort(want.begin(), want.end());
    NS_TEST_ASSERT_MSG_EQ(got.size(), want.size(), "every event leaves once");
    NS_TEST_ASSERT_MSG_EQ((got == want), true, "events leave in (time, uid) order");
  }
};

/// FlatIdMap against std::map under random puts, gets and erases (ids in a small range, so runs of probes wrap
/// round the table and erasing shifts them back): the same ids found with the same values, objects never moved.
class FlatIdMapTest : public TestCase {
 public:
  FlatIdMapTest() : TestCase("FlatIdMap: the same contents as std::map, objects stay put") {}

 private:
  void DoRun() override {
    FlatIdMap<uint64_t> m;
    std::map<uint64_t, uint64_t> want;
    std::map<uint64_t, const uint64_t*> where;
    uint64_t lcg = 777;
    auto next = [&lcg] { return (lcg = lcg * 6364136223846793005ULL + 1442695040888963407ULL) >> 33; };
    for (int i = 0; i < 200000; ++i) {
      const uint64_t id = next() % 3000 * 1024;  // multiples of 1024: a weak hash would pile them up
      const uint64_t op = next() % 3;
      if (op == 0) {
        uint64_t& v = m.Get(id);
        if (want.count(id) == 0) {
          NS_TEST_ASSERT_MSG_EQ(v, 0u, "a new object is value-initialised");
          where[id] = &v;
        }
        NS_TEST_ASSERT_MSG_EQ((where[id] == &v), true, "an object never moves");
        v = id + 1 + static_cast<uint64_t>(i);
        want[id] = v;
      } else if (op == 1) {
        const bool had = want.erase(id) == 1;
        NS_TEST_ASSERT_MSG_EQ(m.Erase(id), had, "erased iff present");
        where.erase(id);
      } else {
        const uint64_t* v = m.Find(id);
        auto it = want.find(id);
        NS_TEST_ASSERT_MSG_EQ((v != nullptr), (it != want.end()), "found iff present");
        if (v != nullptr) {
          NS_TEST_ASSERT_MSG_EQ(*v, it->second, "the value put");
        }
      }
      NS_TEST_ASSERT_MSG_EQ(m.size(), want.size(), "size");
    }
    std::map<uint64_t, uint64_t> seen;
    m.ForEach([&seen](uint64_t id, uint64_t& v) { seen[id] = v; });
    NS_TEST_ASSERT_MSG_EQ((seen == want), true, "ForEach visits every entry once");
    m.Clear();
    NS_TEST_ASSERT_MSG_EQ((m.Find(want.empty() ? 0 : want.begin()->first) == nullptr), true, "empty after Clear");
  }
};

/// The Tx trace's ns-3 Packet: the serialised header in front of the payload (none for ACKs and trimmed data).
class PacketViewTest : public TestCase {
 public:
  PacketViewTest() : TestCase("PhantoraPacket::ToPacket: serialised header + payload") {}

 private:
  void DoRun() override {
    Ptr<PhantoraPacket> p = Create<PhantoraPacket>();
    p->hdr.type = PktType::Data;
    p->hdr.payload = 1000;
    p->hdr.flowId = 7;
    p->hdr.seq = 3000;
    const uint32_t hdrBytes = p->hdr.GetSerializedSize();
    NS_TEST_ASSERT_MSG_EQ(p->ToPacket()->GetSize(), hdrBytes + 1000, "data: header + payload");
    PhantoraHeader back;
    p->ToPacket()->PeekHeader(back);
    NS_TEST_ASSERT_MSG_EQ(back.flowId, 7u, "flow id survives");
    NS_TEST_ASSERT_MSG_EQ(back.seq, 3000u, "seq survives");
    p->hdr.flags |= kFlagTrimmed;
    NS_TEST_ASSERT_MSG_EQ(p->ToPacket()->GetSize(), hdrBytes, "trimmed: header only");
    p->hdr.type = PktType::Ack;
    p->hdr.flags = 0;
    NS_TEST_ASSERT_MSG_EQ(p->ToPacket()->GetSize(), hdrBytes, "ACK: header only");
  }
};

/// The bytes of `h` serialised (every field, and the INT records up to nHops).
static std::vector<uint8_t> HeaderBytes(const PhantoraHeader& h) {
  Ptr<Packet> pkt = Create<Packet>();
  pkt->AddHeader(h);
  std::vector<uint8_t> out(pkt->GetSize());
  pkt->CopyData(out.data(), out.size());
  return out;
}

/// A recycled packet (PhantoraPacket::Make from the free list) resets only the header's fields, not its INT records
/// past nHops = 0: it must serialise as a new header does, whatever the packet carried before; its link credit is
/// cleared; it is cache-line aligned. AssignUsed copies what a header carries (its fields, its INT records up to
/// nHops).
class RecycledPacketTest : public TestCase {
 public:
  RecycledPacketTest() : TestCase("PhantoraPacket::Make: a recycled packet is a new one; AssignUsed") {}

 private:
  void DoRun() override {
    Ptr<PhantoraPacket> p = PhantoraPacket::Make();
    PhantoraPacket* used = PeekPointer(p);
    PhantoraHeader& h = p->hdr;
    h.type = PktType::Ack;
    h.prio = 5;
    h.flags = kFlagSack | kFlagEcnEcho | kFlagCredit;
    h.src = 11;
    h.dst = 12;
    h.payload = 700;
    h.flowId = 99;
    h.seq = 123456;
    h.ecmpKey = 0xdeadbeef;
    h.viaNic = true;
    h.entropy = 77;
    h.tsNs = 4242;
    h.sackLo = 1000;
    h.sackHi = 2000;
    h.sackBitmap = 0xff;
    h.credit = 31337;
    for (uint64_t i = 0; i < 3; ++i) {
      h.PushHop(IntHop{100 + i, 200 + i, static_cast<uint32_t>(300 + i), 400'000'000'000ULL});
    }
    p->linkCredit = 1048;
    p->linkSent = 5000;
    p->linkClass = 3;
    PhantoraHeader copy;
    copy.AssignUsed(h);
    NS_TEST_ASSERT_MSG_EQ((HeaderBytes(copy) == HeaderBytes(h)), true, "AssignUsed: the same serialised header");
    NS_TEST_ASSERT_MSG_EQ(copy.hops[2].qlenBytes, 302u, "AssignUsed: the INT records up to nHops");
    p = nullptr;  // the last reference: back on the free list
    Ptr<PhantoraPacket> q = PhantoraPacket::Make();
    NS_TEST_ASSERT_MSG_EQ(PeekPointer(q), used, "the packet just freed is taken again");
    const PhantoraHeader blank;
    NS_TEST_ASSERT_MSG_EQ((HeaderBytes(q->hdr) == HeaderBytes(blank)), true, "serialises as a new header");
    NS_TEST_ASSERT_MSG_EQ(q->hdr.nHops, 0, "no INT record");
    NS_TEST_ASSERT_MSG_EQ(q->linkCredit, 0u, "no link credit");
    NS_TEST_ASSERT_MSG_EQ(q->linkSent, 0u, "no link count");
    NS_TEST_ASSERT_MSG_EQ(q->linkClass, 0, "no link class");
    NS_TEST_ASSERT_MSG_EQ(reinterpret_cast<uintptr_t>(PeekPointer(q)) % 64, 0u, "cache-line aligned");
    NS_TEST_ASSERT_MSG_EQ(reinterpret_cast<uintptr_t>(PeekPointer(Create<PhantoraPacket>())) % 64, 0u,
                          "cache-line aligned when new");
  }
};

/// RingQueue against std::deque: the same fronts and sizes through a random run of pushes and pops that wraps and
/// grows the ring; an element popped is released (a packet's reference goes as it leaves the queue).
class RingQueueTest : public TestCase {
 public:
  RingQueueTest() : TestCase("RingQueue: a std::deque's FIFO, elements released as they leave") {}

 private:
  void DoRun() override {
    RingQueue<std::shared_ptr<int>> ring;
    std::deque<std::shared_ptr<int>> ref;
    uint64_t state = 12345;
    int next = 0;
    for (int step = 0; step < 20000; ++step) {
      state = state * 6364136223846793005ULL + 1442695040888963407ULL;
      const bool push = ref.empty() || (state >> 33) % 100 < (step < 10000 ? 60 : 40);  // grow, then drain
      if (push) {
        auto v = std::make_shared<int>(next++);
        ring.push_back(v);
        ref.push_back(v);
      } else {
        std::shared_ptr<int> out = ring.front();
        NS_TEST_ASSERT_MSG_EQ(*out, *ref.front(), "the same front");
        ring.pop_front();
        ref.pop_front();
        NS_TEST_ASSERT_MSG_EQ(out.use_count(), 1, "released by the ring as it left");
      }
      NS_TEST_ASSERT_MSG_EQ(ring.size(), ref.size(), "the same size");
      NS_TEST_ASSERT_MSG_EQ(ring.empty(), ref.empty(), "the same emptiness");
    }
  }
};

/// Two 1 MB flows on one connection (SetConnection) are messages on one queue pair: the second is sent after the
/// first, so the first ends as a lone flow does and the second after both flows' bytes at line rate; one queue
/// pair is opened. Without a connection each flow has its own, they share the link and both end after both flows'
/// bytes.
class ConnectionOrderTest : public TestCase {
 public:
  ConnectionOrderTest() : TestCase("the flows of one connection are sent in order on one queue pair") {}

 private:
  void DoRun() override {
    for (const bool shared : {true, false}) {
      const uint64_t bps = 100'000'000'000ULL;
      const uint64_t delayNs = 1000;
      const uint64_t size = 1'000'000;
      PhantoraNetwork net;
      net.SetParam("nic.PayloadSize", "1000");
      const auto [a, b] = TwoHostsOneSwitch(net, bps, delayNs);
      net.AddFlow(7, a, b, size, 0, 3, 7, {}, 0);
      net.AddFlow(8, a, b, size, 0, 3, 7, {}, 0);
      if (shared) {
        net.SetConnection(7, 42);
        net.SetConnection(8, 42);
      }
      NS_TEST_ASSERT_MSG_EQ(net.RunUntilQuiet(int64_t{1} << 40), true, "both flows complete");
      auto done = net.DrainCompletions();
      NS_TEST_ASSERT_MSG_EQ(done.size(), 2u, "two completions");
      std::sort(done.begin(), done.end(), [](const auto& x, const auto& y) { return x.id < y.id; });
      const double one = (size + size / 1000 * 48) * 8.0 / 100.0;  // one flow's bytes at line rate, ns
      const double tail = 1048 * 8.0 / 100.0 + 2.0 * delayNs;       // last packet's second hop, both delays
      NS_TEST_ASSERT_MSG_EQ_TOL(static_cast<double>(done[1].endNs), 2 * one + tail, 4.0, "the later one: both");
      const double firstEnd = shared ? one + tail : 2 * one + tail;
      const double firstTol = shared ? 4.0 : 2 * 1048 * 8.0 / 100.0;  // interleaved: within a packet each way
      NS_TEST_ASSERT_MSG_EQ_TOL(static_cast<double>(done[0].endNs), firstEnd, firstTol,
                                "the first: alone on its queue pair, or shared");
      double qps = 0;
      for (const auto& [name, value] : net.Stats()) {
        qps = name == "queue_pairs" ? value : qps;
      }
      const double wantQps = shared ? 1.0 : 2.0;
      NS_TEST_ASSERT_MSG_EQ(qps, wantQps, "queue pairs opened");
    }
  }
};

/// DCQCN on a queue pair that goes idle: its timers stop, and OnResume brings rate, target rate, alpha and the cut
/// count to what a twin whose timers kept running has, bit for bit, both at the resume and a while after it
/// (resumed before the pending cut, after a cut and a partial recovery, and after a long idle).
class DcqcnResumeTest : public TestCase {
 public:
  explicit DcqcnResumeTest(int64_t resumeNs)
      : TestCase("DCQCN resumed at " + std::to_string(resumeNs) + " ns equals one whose timers ran"),
        m_resumeNs(resumeNs) {}

 private:
  void DoRun() override {
    Ptr<CcDcqcn> live = CreateObject<CcDcqcn>();
    Ptr<CcDcqcn> idle = CreateObject<CcDcqcn>();
    CcFeedback cnp{};
    cnp.ecnEcho = true;
    for (const Ptr<CcDcqcn>& cc : {live, idle}) {
      cc->Start(100'000'000'000ULL, 8000, 1000, 100'000);
      Simulator::Schedule(NanoSeconds(10), [cc, cnp] { cc->OnAck(cnp); });
      Simulator::Schedule(NanoSeconds(2500), [cc, cnp] { cc->OnAck(cnp); });
      Simulator::Schedule(NanoSeconds(9000), [cc, cnp] { cc->OnAck(cnp); });
    }
    Simulator::Schedule(NanoSeconds(9500), [idle] { idle->OnIdle(9500); });
    auto same = [this, live, idle](const char* when) {
      NS_TEST_EXPECT_MSG_EQ(idle->GetRateBps(), live->GetRateBps(), "rate " << when);
      NS_TEST_EXPECT_MSG_EQ(idle->GetTargetRateBps(), live->GetTargetRateBps(), "target rate " << when);
      NS_TEST_EXPECT_MSG_EQ(idle->GetAlpha(), live->GetAlpha(), "alpha " << when);
      NS_TEST_EXPECT_MSG_EQ(idle->GetDecreaseCount(), live->GetDecreaseCount(), "cuts " << when);
    };
    Simulator::Schedule(NanoSeconds(m_resumeNs), [idle, this] { idle->OnResume(m_resumeNs); });
    Simulator::Schedule(NanoSeconds(m_resumeNs), [same] { same("at the resume"); });
    Simulator::Schedule(NanoSeconds(m_resumeNs + 777'777), [same] { same("after it"); });
    Simulator::Stop(NanoSeconds(m_resumeNs + 777'778));
    Simulator::Run();
    NS_TEST_ASSERT_MSG_GT(live->GetDecreaseCount(), 0u, "the CNPs cut the rate");
    live->Stop();
    idle->Stop();
    Simulator::Destroy();
  }

  int64_t m_resumeNs;
};

class PhantoraModelTestSuite : public TestSuite {
 public:
  PhantoraModelTestSuite() : TestSuite("phantora-model", Type::UNIT) {
    AddTestCase(new MmuThresholdTest, TestCase::Duration::QUICK);
    AddTestCase(new WireFormatTest, TestCase::Duration::QUICK);
    AddTestCase(new CreditTest, TestCase::Duration::QUICK);
    AddTestCase(new WheelOrderTest, TestCase::Duration::QUICK);
    AddTestCase(new FlatIdMapTest, TestCase::Duration::QUICK);
    AddTestCase(new PacketViewTest, TestCase::Duration::QUICK);
    AddTestCase(new AttributeCheckTest, TestCase::Duration::QUICK);
    AddTestCase(new CcRegistryTest, TestCase::Duration::QUICK);
    AddTestCase(new HpccEcmpTest, TestCase::Duration::QUICK);
    AddTestCase(new ViaNicRouteTest, TestCase::Duration::QUICK);
    AddTestCase(new CompletionBoundTest, TestCase::Duration::QUICK);
    AddTestCase(new SingleFlowTest(1000), TestCase::Duration::QUICK);
    AddTestCase(new SingleFlowTest(4000), TestCase::Duration::QUICK);
    AddTestCase(new RateCapTest, TestCase::Duration::QUICK);
    AddTestCase(new FlowletOrderTest, TestCase::Duration::QUICK);
    AddTestCase(new ConnectionOrderTest, TestCase::Duration::QUICK);
    AddTestCase(new RecycledPacketTest, TestCase::Duration::QUICK);
    AddTestCase(new RingQueueTest, TestCase::Duration::QUICK);
    for (const int64_t resumeNs : {11'000, 12'345, 450'321, 5'000'017}) {
      AddTestCase(new DcqcnResumeTest(resumeNs), TestCase::Duration::QUICK);
    }
  }
};

PhantoraModelTestSuite g_phantoraModelTestSuite;

}  // namespace
