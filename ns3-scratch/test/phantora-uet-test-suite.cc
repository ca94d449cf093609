// Unit tests of the Ultra Ethernet transport's entropy choice (issue 37): REPS recycling and its freezing mode
// (RepsFreeze: after a retransmission timeout a connection cycles only its last good entropies until the freeze
// time has passed, then explores before recycling again), and the NIC attributes that configure them.
#include "rdma-nic.h"
#include "uet-transport.h"

#include "ns3/test.h"

#include "ns3/log.h"
#include "ns3/nstime.h"
#include "ns3/random-variable-stream.h"
#include "ns3/uinteger.h"

#include <map>
#include <set>

using namespace ns3;

NS_LOG_COMPONENT_DEFINE("PhantoraUetTest");

namespace {

constexpr uint32_t kEntropies = 256;
constexpr uint32_t kBuffer = 8;
constexpr uint64_t kFreezeNs = 1000;
constexpr uint32_t kThawExplore = 16;

/// A REPS picker over kEntropies values with a kBuffer ring, seeded, frozen through `freeze`.
EntropyPicker RepsPicker(RepsFreeze* freeze) {
  Ptr<UniformRandomVariable> rng = CreateObject<UniformRandomVariable>();
  rng->SetStream(7);
  EntropyPicker picker;
  picker.Configure(EntropyMode::Reps, kEntropies, kBuffer, rng, freeze);
  return picker;
}

/// The NIC's REPS attributes and their defaults (htsim's: 8 recycled entropies, a 10 ms freeze, 16 explored).
class RepsAttributeTest : public TestCase {
 public:
  RepsAttributeTest() : TestCase("REPS: the NIC's attributes RepsBufferSize, RepsFreezeTime, RepsThawExplore") {}

 private:
  void DoRun() override {
    const TypeId tid = RdmaNic::GetTypeId();
    TypeId::AttributeInformation info;
    NS_TEST_ASSERT_MSG_EQ(tid.LookupAttributeByName("RepsFreezeTime", &info), true, "RepsFreezeTime exists");
    const auto freeze = DynamicCast<const TimeValue>(info.initialValue);
    NS_TEST_ASSERT_MSG_EQ(freeze->Get(), MilliSeconds(10), "htsim's 10 ms freeze");
    NS_TEST_ASSERT_MSG_EQ(info.checker->Check(TimeValue(NanoSeconds(-1))), false, "a negative freeze is refused");
    NS_TEST_ASSERT_MSG_EQ(tid.LookupAttributeByName("RepsThawExplore", &info), true, "RepsThawExplore exists");
    NS_TEST_ASSERT_MSG_EQ(DynamicCast<const UintegerValue>(info.initialValue)->Get(), 16u, "16 explored");
    NS_TEST_ASSERT_MSG_EQ(tid.LookupAttributeByName("RepsBufferSize", &info), true, "RepsBufferSize exists");
    NS_TEST_ASSERT_MSG_EQ(DynamicCast<const UintegerValue>(info.initialValue)->Get(), 8u, "8 recycled");
    NS_TEST_ASSERT_MSG_EQ(info.checker->Check(UintegerValue(0)), false, "an empty ring is refused");
  }
};

/// Freezing, step by step, against what the mechanism prescribes: which entropies a packet may take, how many
/// are explored, when a freeze may start and when it ends.
class RepsFreezeTest : public TestCase {
 public:
  RepsFreezeTest() : TestCase("REPS freezing: cycle the last good entropies, thaw after the freeze, explore") {}

 private:
  void DoRun() override {
    RepsFreeze freeze;
    freeze.Configure(kBuffer, kFreezeNs, kThawExplore);
    EntropyPicker picker = RepsPicker(&freeze);

    for (int i = 0; i < 10; ++i) {
      picker.Next();
    }
    NS_TEST_ASSERT_MSG_EQ(picker.Explored(), 10u, "nothing recycled yet: every packet explores");
    for (uint16_t ev = 1; ev <= 10; ++ev) {
      picker.Feedback(ev, true, 10);
    }
    picker.Feedback(200, false, 10);  // CE-marked or NACKed: neither recycled nor remembered
    NS_TEST_ASSERT_MSG_EQ(freeze.Frozen(), false, "feedback alone does not freeze");
    for (uint16_t ev = 3; ev <= 10; ++ev) {
      NS_TEST_ASSERT_MSG_EQ(picker.Next(), ev, "unfrozen: the ring's last 8 good entropies, oldest first");
    }
    picker.Next();
    NS_TEST_ASSERT_MSG_EQ(picker.Explored(), 11u, "the ring spent: explore");

    NS_TEST_ASSERT_MSG_EQ(freeze.OnTimeout(100), true, "a retransmission timeout freezes");
    NS_TEST_ASSERT_MSG_EQ(freeze.OnTimeout(150), false, "frozen already");
    NS_TEST_ASSERT_MSG_EQ(freeze.Freezes(), 1u, "one freeze");
    std::map<uint16_t, int> seen;
    for (int i = 0; i < 16; ++i) {
      ++seen[picker.Next()];
    }
    NS_TEST_ASSERT_MSG_EQ(picker.Explored(), 11u, "frozen: no exploration");
    NS_TEST_ASSERT_MSG_EQ(seen.size(), 8u, "frozen: the 8 remembered entropies");
    for (const auto& [ev, n] : seen) {
      NS_TEST_ASSERT_MSG_EQ((ev >= 3 && ev <= 10), true, "only remembered good entropies");
      NS_TEST_ASSERT_MSG_EQ(n, 2, "each in turn: twice in 16 packets");
    }
    picker.Feedback(77, true, 500);  // a good entropy while frozen replaces the oldest remembered (3)
    NS_TEST_ASSERT_MSG_EQ(freeze.Frozen(), true, "feedback within the freeze time keeps it");
    std::set<uint16_t> now;
    for (int i = 0; i < 8; ++i) {
      now.insert(picker.Next());
    }
    NS_TEST_ASSERT_MSG_EQ((now == std::set<uint16_t>{4, 5, 6, 7, 8, 9, 10, 77}), true, "77 in, 3 out");
    NS_LOG_INFO("frozen picks at 500 ns: " << now.size() << " entropies, " << picker.Explored() << " explored");

    picker.Feedback(5, true, 100 + kFreezeNs + 1);  // the first feedback after the freeze time thaws
    NS_TEST_ASSERT_MSG_EQ(freeze.Frozen(), false, "thawed");
    for (uint32_t i = 0; i < kThawExplore / 2; ++i) {
      picker.Next();
    }
    NS_TEST_ASSERT_MSG_EQ(freeze.OnTimeout(1200), false, "no freeze while the thaw's explorations are owed");
    for (uint32_t i = 0; i < kThawExplore / 2; ++i) {
      picker.Next();
    }
    NS_TEST_ASSERT_MSG_EQ(picker.Explored(), 11u + kThawExplore, "the thaw explores 16, though 5 came back good");
    NS_TEST_ASSERT_MSG_EQ(picker.Next(), 5u, "then recycles: the thaw forgot all but the good entropy after it");
    NS_TEST_ASSERT_MSG_EQ(freeze.OnTimeout(1300), true, "a second freeze");
    NS_TEST_ASSERT_MSG_EQ(freeze.Freezes(), 2u, "two freezes");
    NS_TEST_ASSERT_MSG_EQ(picker.Next(), 5u, "frozen on the one entropy remembered since the thaw");
    NS_TEST_ASSERT_MSG_EQ(picker.Next(), 5u, "again");
    NS_TEST_ASSERT_MSG_EQ(picker.Explored(), 11u + kThawExplore, "no exploration while frozen");

    RepsFreeze off;
    off.Configure(kBuffer, 0, kThawExplore);
    NS_TEST_ASSERT_MSG_EQ(off.OnTimeout(1), false, "RepsFreezeTime 0: never freezes");

    RepsFreeze empty;
    empty.Configure(kBuffer, kFreezeNs, kThawExplore);
    EntropyPicker blind = RepsPicker(&empty);
    NS_TEST_ASSERT_MSG_EQ(empty.OnTimeout(0), true, "a timeout before any good feedback freezes too");
    blind.Next();
    NS_TEST_ASSERT_MSG_EQ(blind.Explored(), 1u, "frozen with nothing remembered: explore");
  }
};

class PhantoraUetTestSuite : public TestSuite {
 public:
  PhantoraUetTestSuite() : TestSuite("phantora-uet", Type::UNIT) {
    AddTestCase(new RepsAttributeTest, TestCase::Duration::QUICK);
    AddTestCase(new RepsFreezeTest, TestCase::Duration::QUICK);
  }
};

PhantoraUetTestSuite g_phantoraUetTestSuite;

}  // namespace
