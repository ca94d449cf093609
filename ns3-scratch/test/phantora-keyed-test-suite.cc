// The keyed scheduler mode (issue 38): events of one time step run by (scheduling time, scheduling node, that
// node's count), whatever order they were queued in.
#include "phantora-keyed-scheduler.h"
#include "phantora-simulator-impl.h"

#include "ns3/event-impl.h"
#include "ns3/global-value.h"
#include "ns3/object-factory.h"
#include "ns3/simulator.h"
#include "ns3/string.h"
#include "ns3/test.h"

#include <algorithm>
#include <functional>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

using namespace ns3;

namespace {

/// (time, schedTs, node, count): the order the keyed mode promises.
using FullKey = std::tuple<uint64_t, uint64_t, uint32_t, uint32_t>;

/// An event that calls a std::function (tests only).
class FnEvent : public EventImpl {
 public:
  explicit FnEvent(std::function<void()> f) : m_f(std::move(f)) {}

 protected:
  void Notify() override { m_f(); }

 private:
  std::function<void()> m_f;
};

/// Switch ns-3 to PhantoraSimulatorImpl in the keyed mode (PhantoraScheduler over PhantoraKeyedScheduler) and
/// return it; `was` keeps the implementation that LeaveKeyedSimulator restores.
PhantoraSimulatorImpl* EnterKeyedSimulator(StringValue& was) {
  GlobalValue::GetValueByName("SimulatorImplementationType", was);
  Simulator::Destroy();
  GlobalValue::Bind("SimulatorImplementationType", StringValue("ns3::PhantoraSimulatorImpl"));
  ObjectFactory f;
  f.SetTypeId("ns3::PhantoraScheduler");
  f.Set("Inner", StringValue("ns3::PhantoraKeyedScheduler"));
  Simulator::SetScheduler(f);
  return PhantoraSimulatorImpl::Current();
}

/// Destroy the keyed simulator and bind the implementation EnterKeyedSimulator found.
void LeaveKeyedSimulator(const StringValue& was) {
  Simulator::Destroy();
  GlobalValue::Bind("SimulatorImplementationType", was);
}

/// The heap alone: the same events queued in two orders (so with different uids) leave in one order, the
/// sorted order of their full keys.
class KeyedHeapOrderTest : public TestCase {
 public:
  KeyedHeapOrderTest() : TestCase("keyed scheduler: equal times leave in key order, whatever the insertion order") {}

 private:
  struct Spec {
    uint64_t ts;
    PhantoraOrderKey key;
  };

  static std::vector<FullKey> Drain(const std::vector<Spec>& specs, const std::vector<std::size_t>& order) {
    PhantoraKeyedScheduler s;
    uint32_t uid = 0;
    for (std::size_t i : order) {
      Scheduler::Event ev;
      ev.impl = nullptr;
      ev.key.m_ts = specs[i].ts;
      ev.key.m_uid = uid++;
      ev.key.m_context = 0;
      s.InsertKeyed(ev, specs[i].key);
    }
    std::vector<FullKey> out;
    while (!s.IsEmpty()) {
      const PhantoraOrderKey k = s.PeekNextKey();
      const Scheduler::Event ev = s.RemoveNext();
      out.emplace_back(ev.key.m_ts, k.schedTs, k.node, k.count);
    }
    return out;
  }

  void DoRun() override {
    std::mt19937_64 rng(38);
    std::vector<Spec> specs;
    std::map<uint32_t, uint32_t> counts;
    for (int i = 0; i < 3000; ++i) {
      const uint64_t ts = 100 + rng() % 20;  // few distinct times: many ties
      const uint32_t node = rng() % 8 == 0 ? PhantoraOrderKey::kCaller : static_cast<uint32_t>(rng() % 6);
      specs.push_back(Spec{ts, PhantoraOrderKey{ts - rng() % 4, node, counts[node]++}});
    }
    std::vector<FullKey> want;
    for (const Spec& s : specs) {
      want.emplace_back(s.ts, s.key.schedTs, s.key.node, s.key.count);
    }
    std::sort(want.begin(), want.end());
    std::vector<std::size_t> order(specs.size());
    std::iota(order.begin(), order.end(), 0);
    NS_TEST_ASSERT_MSG_EQ((Drain(specs, order) == want), true, "in order of creation: sorted by full key");
    std::shuffle(order.begin(), order.end(), rng);
    NS_TEST_ASSERT_MSG_EQ((Drain(specs, order) == want), true, "shuffled: the same order");
    std::reverse(order.begin(), order.end());
    NS_TEST_ASSERT_MSG_EQ((Drain(specs, order) == want), true, "reversed: the same order");
  }
};

/// Inserts and removals interleaved as a run does them (now + a delay: mostly within the wheel's 8,192 ns, some
/// far past it), a few events lifted and put back, some removed by uid: every event leaves as the least of those
/// still queued by (time, full key), checked against an ordered set of the queued ones.
class KeyedWheelOrderTest : public TestCase {
 public:
  /// `staged`: about a third of the events are queued through InsertStaged and flushed in batches (a partition
  /// worker's cut-cable arrivals), the rest as before.
  explicit KeyedWheelOrderTest(bool staged = false)
      : TestCase(staged ? "keyed scheduler: staged batches among near, far and put-back events keep (time, key) order"
                        : "keyed scheduler: near, far and put-back events leave in (time, key) order"),
        m_staged(staged) {}

 private:
  bool m_staged;
  using Entry = std::tuple<uint64_t, uint64_t, uint32_t, uint32_t, uint32_t>;  // ts, schedTs, node, count, uid

  void DoRun() override {
    PhantoraKeyedScheduler s;
    std::set<Entry> queued;
    std::map<uint32_t, uint32_t> counts;
    std::mt19937_64 rng(7);
    uint64_t now = 0;
    uint32_t uid = 0;
    bool ok = true;
    auto add = [&](uint64_t ts, const PhantoraOrderKey& k, uint32_t u) {
      Scheduler::Event ev;
      ev.impl = nullptr;
      ev.key.m_ts = ts;
      ev.key.m_uid = u;
      ev.key.m_context = 0;
      if (m_staged && rng() % 3 == 0) {
        s.InsertStaged(ev, k);
      } else {
        s.InsertKeyed(ev, k);
      }
      queued.emplace(ts, k.schedTs, k.node, k.count, u);
    };
    auto take = [&]() {
      const PhantoraOrderKey k = s.PeekNextKey();
      const Scheduler::Event ev = s.RemoveNext();
      const Entry got{ev.key.m_ts, k.schedTs, k.node, k.count, ev.key.m_uid};
      ok = ok && !queued.empty() && got == *queued.begin();
      queued.erase(got);
      return got;
    };
    for (int round = 0; round < 30000; ++round) {
      for (uint64_t i = rng() % 4; i > 0; --i) {
        const uint64_t r = rng() % 100;
        const uint64_t delay = r < 80 ? rng() % 50 : r < 95 ? rng() % 9000 : 8000 + rng() % 1'000'000;
        const uint32_t node = static_cast<uint32_t>(rng() % 5);
        add(now + delay, PhantoraOrderKey{now, node, counts[node]++}, uid++);
      }
      s.FlushStaged();
      if (!s.IsEmpty() && rng() % 3 != 0) {
        now = std::get<0>(take());
      }
      if (round % 997 == 0 && !s.IsEmpty()) {
        std::vector<std::pair<Entry, PhantoraOrderKey>> lifted;
        for (int j = 0; j < 3 && !s.IsEmpty(); ++j) {
          const Entry e = take();
          lifted.emplace_back(e, PhantoraOrderKey{std::get<1>(e), std::get<2>(e), std::get<3>(e)});
        }
        for (const auto& [e, k] : lifted) {
          add(std::get<0>(e), k, std::get<4>(e));
        }
        s.FlushStaged();
      }
      if (round % 1009 == 0 && queued.size() > 2) {
        const Entry victim = *std::next(queued.begin(), static_cast<std::ptrdiff_t>(rng() % queued.size()));
        Scheduler::Event ev;
        ev.impl = nullptr;
        ev.key.m_ts = std::get<0>(victim);
        ev.key.m_uid = std::get<4>(victim);
        s.Remove(ev);
        queued.erase(victim);
      }
    }
    while (!s.IsEmpty()) {
      take();
    }
    NS_TEST_ASSERT_MSG_EQ(ok, true, "each event left as the least queued by (time, key)");
    NS_TEST_ASSERT_MSG_EQ(queued.empty(), true, "every event left");
  }
};

/// LeastReach (a partition worker's earliest output): over random near, far and cancelled events of random nodes
/// (and no node), queued and taken so that the wheel wraps, the scan gives the brute-force least of ts + dist[node]
/// over the events not cancelled, at every check.
class KeyedLeastReachTest : public TestCase {
 public:
  /// `staged`: about a third of the events are queued through InsertStaged, flushed after each round's.
  explicit KeyedLeastReachTest(bool staged = false)
      : TestCase(staged ? "keyed scheduler: LeastReach covers staged batches too"
                        : "keyed scheduler: LeastReach is the least ts + dist over live events"),
        m_staged(staged) {}

 private:
  bool m_staged;
  void DoRun() override {
    PhantoraKeyedScheduler s;
    std::map<uint32_t, std::pair<uint64_t, Ptr<EventImpl>>> live;  // uid -> (ts, event)
    std::vector<uint32_t> ctx;                                      // by uid
    const std::vector<uint64_t> dist = {1000, 1000, 1500, 2000, 2000, 3000, 1000, 1200};
    const uint64_t other = 1000;
    std::mt19937_64 rng(11);
    uint64_t now = 0;
    uint32_t uid = 0;
    uint32_t count = 0;
    int bad = 0;
    int checks = 0;
    for (int round = 0; round < 20000; ++round) {
      for (uint64_t i = rng() % 3; i > 0; --i) {
        const uint64_t r = rng() % 100;
        const uint64_t delay = r < 70 ? rng() % 3000 : r < 95 ? rng() % 9000 : 8000 + rng() % 100'000;
        const uint32_t node = rng() % 10 == 0 ? Simulator::NO_CONTEXT : static_cast<uint32_t>(rng() % dist.size());
        Ptr<EventImpl> impl = Create<FnEvent>([] {});
        Scheduler::Event ev;
        ev.impl = PeekPointer(impl);
        ev.key.m_ts = now + delay;
        ev.key.m_uid = uid;
        ev.key.m_context = node;
        if (m_staged && rng() % 3 == 0) {
          s.InsertStaged(ev, PhantoraOrderKey{now, 0, count++});
        } else {
          s.InsertKeyed(ev, PhantoraOrderKey{now, 0, count++});
        }
        live[uid] = {now + delay, impl};
        ctx.push_back(node);
        if (rng() % 8 == 0) {
          impl->Cancel();  // stays queued, counts for nothing
        }
        ++uid;
      }
      s.FlushStaged();
      if (!s.IsEmpty() && rng() % 3 != 0) {
        const Scheduler::Event ev = s.RemoveNext();
        now = ev.key.m_ts;
        live.erase(ev.key.m_uid);
      }
      if (round % 7 == 0) {
        uint64_t want = UINT64_MAX;
        for (const auto& [u, e] : live) {
          if (!e.second->IsCancelled()) {
            want = std::min(want, e.first + (ctx[u] < dist.size() ? dist[ctx[u]] : other));
          }
        }
        bad += s.LeastReach(dist, other, 1000) != want;
        ++checks;
      }
    }
    NS_TEST_ASSERT_MSG_EQ(bad, 0, "LeastReach differs from the brute force in " << bad << " of " << checks);
  }
};

/// The simulator in the keyed mode. Twelve events for time 100, queued by the caller with explicit keys (as a
/// worker queues packets from another worker) in two different orders, run in key order; each runs on its own
/// node (context) and schedules two events of that node, 0 and 5 ns later, which run by (node, count): the
/// same trace both times, checked against that rule, and not the run order (ns-3's uid order). IsPending
/// answers by what has run, not by uid.
class KeyedSimulatorTest : public TestCase {
 public:
  KeyedSimulatorTest() : TestCase("keyed mode: a run's trace does not depend on the order events were queued in") {}

 private:
  struct Parent {
    PhantoraOrderKey key;
    uint32_t context;
  };

  /// The trace of one run: "P<i>" when parent i runs, "C<i>.<j>" when its child j runs.
  std::vector<std::string> Run(const std::vector<Parent>& parents, const std::vector<std::size_t>& order) {
    StringValue was;
    PhantoraSimulatorImpl* sim = EnterKeyedSimulator(was);
    NS_TEST_EXPECT_MSG_NE(sim, nullptr, "PhantoraSimulatorImpl runs");
    NS_TEST_EXPECT_MSG_EQ(sim->Keyed(), true, "the keyed mode is on");

    std::vector<std::string> trace;
    std::vector<EventId> ids(parents.size());
    std::vector<bool> ran(parents.size(), false);
    bool pendingRight = true;
    for (std::size_t i : order) {
      auto body = [&, i] {
        trace.push_back("P" + std::to_string(i));
        ran[i] = true;
        for (std::size_t k = 0; k < parents.size(); ++k) {
          pendingRight = pendingRight && (ids[k].IsPending() == !ran[k]);
        }
        for (int j = 0; j < 2; ++j) {
          Simulator::Schedule(NanoSeconds(5 * j), [&trace, i, j] {
            trace.push_back("C" + std::to_string(i) + "." + std::to_string(j));
          });
        }
      };
      ids[i] = sim->ScheduleKeyedAt(100, parents[i].context, parents[i].key, new FnEvent(body));
    }
    Simulator::Run();
    NS_TEST_EXPECT_MSG_EQ(pendingRight, true, "IsPending is true exactly for the parents not yet run");
    LeaveKeyedSimulator(was);
    return trace;
  }

  void DoRun() override {
    std::vector<Parent> parents;
    const uint32_t contexts[] = {7, 3, 5, 3, 1, 7, 5, 1, 3, 7, 1, 5};
    std::map<uint32_t, uint32_t> counts;
    for (uint32_t i = 0; i < 12; ++i) {
      const uint32_t node = i % 3 == 0 ? PhantoraOrderKey::kCaller : i % 4;
      parents.push_back(Parent{PhantoraOrderKey{10 * (i % 3), node, counts[node]++}, contexts[i]});
    }
    // The rule: parents by key; then the children of time 100 (scheduled at 100 by node c, counted in the
    // parents' run order), then those of time 105, both by (node, count).
    std::vector<std::size_t> byKey(parents.size());
    std::iota(byKey.begin(), byKey.end(), 0);
    std::sort(byKey.begin(), byKey.end(), [&](std::size_t a, std::size_t b) {
      const PhantoraOrderKey& x = parents[a].key;
      const PhantoraOrderKey& y = parents[b].key;
      return std::tie(x.schedTs, x.node, x.count) < std::tie(y.schedTs, y.node, y.count);
    });
    std::vector<std::string> want;
    std::vector<std::tuple<uint32_t, uint32_t, std::string>> now;
    std::vector<std::tuple<uint32_t, uint32_t, std::string>> later;
    std::map<uint32_t, uint32_t> childCount;
    for (std::size_t i : byKey) {
      want.push_back("P" + std::to_string(i));
      const uint32_t c = parents[i].context;
      now.emplace_back(c, childCount[c]++, "C" + std::to_string(i) + ".0");
      later.emplace_back(c, childCount[c]++, "C" + std::to_string(i) + ".1");
    }
    std::sort(now.begin(), now.end());
    std::sort(later.begin(), later.end());
    std::vector<std::string> runOrder;  // ns-3's order of the children: their parents' run order
    for (const auto& group : {now, later}) {
      for (const auto& c : group) {
        want.push_back(std::get<2>(c));
      }
    }
    for (std::size_t i : byKey) {
      runOrder.push_back("C" + std::to_string(i) + ".0");
    }
    std::vector<std::string> keyedNow;
    for (const auto& c : now) {
      keyedNow.push_back(std::get<2>(c));
    }
    NS_TEST_ASSERT_MSG_EQ((keyedNow != runOrder), true, "the case tells the keyed order from ns-3's");

    std::vector<std::size_t> forward(parents.size());
    std::iota(forward.begin(), forward.end(), 0);
    std::vector<std::size_t> backward(forward.rbegin(), forward.rend());
    std::vector<std::size_t> shuffled = forward;
    std::shuffle(shuffled.begin(), shuffled.end(), std::mt19937(5));
    NS_TEST_ASSERT_MSG_EQ((Run(parents, forward) == want), true, "queued forward: the rule's trace");
    NS_TEST_ASSERT_MSG_EQ((Run(parents, backward) == want), true, "queued backward: the same trace");
    NS_TEST_ASSERT_MSG_EQ((Run(parents, shuffled) == want), true, "queued shuffled: the same trace");
  }
};

/// A queue sample's key (SampleKey) against every other key of its ns: after the caller's last allowed count
/// and after any node's largest count, the samplers in slot order, the last slot's count below UINT32_MAX (no
/// wrap). In a run, a sample queued first for ns 100 runs after the caller's events of ns 100 queued after it,
/// and the caller's count ranges never meet the samples' (the caller's events run in the order scheduled).
class KeyedSampleKeyTest : public TestCase {
 public:
  KeyedSampleKeyTest() : TestCase("keyed mode: a queue sample's key orders after every other key of its ns") {}

 private:
  void DoRun() override {
    using K = PhantoraOrderKey;
    const uint64_t ts = 100;
    const K first = SampleKey(ts, 0);
    const K last = SampleKey(ts, K::kSampleSlots - 1);
    NS_TEST_ASSERT_MSG_EQ(last.count, UINT32_MAX - 1, "the last slot's count is the largest below UINT32_MAX");
    const std::vector<K> others = {
        K{ts, K::kCaller, 0}, K{ts, K::kCaller, K::kSampleCount - 1}, K{ts, 0, UINT32_MAX - 1},
        K{ts, 7, UINT32_MAX - 1}, K{ts, K::kNoContext, UINT32_MAX - 1}, K{ts, K::kLockstep, UINT32_MAX - 1},
        K{ts - 1, K::kCaller, UINT32_MAX - 1}};
    for (const K& k : others) {
      NS_TEST_ASSERT_MSG_EQ(KeyBefore(k, first), true, "another key of the ns orders before the first sample");
      NS_TEST_ASSERT_MSG_EQ(KeyBefore(first, k), false, "and never after it");
    }
    for (uint32_t slot : {0u, 1u, 2u, 1000u, K::kSampleSlots - 2}) {
      NS_TEST_ASSERT_MSG_EQ(KeyBefore(SampleKey(ts, slot), SampleKey(ts, slot + 1)), true, "samplers in slot order");
    }
    // StepEndKey, a run call's last stop of the ns (PhantoraNetwork::RunTo), after every key of the ns, the last
    // sampler's included, and before every key scheduled later.
    for (const K& k : others) {
      NS_TEST_ASSERT_MSG_EQ(KeyBefore(k, StepEndKey(ts)), true, "another key of the ns orders before its end");
    }
    NS_TEST_ASSERT_MSG_EQ(KeyBefore(last, StepEndKey(ts)), true, "the last sampler before the step's end");
    NS_TEST_ASSERT_MSG_EQ(KeyBefore(StepEndKey(ts), K{ts + 1, 0, 0}), true, "the step's end before a later key");

    // The caller's events below are scheduled at ns ts itself (AdvanceTo), so their keys share the samples' schedTs
    // and node (kCaller) and only the counts order them.
    StringValue was;
    PhantoraSimulatorImpl* sim = EnterKeyedSimulator(was);
    std::vector<std::string> trace;
    sim->ScheduleKeyedAt(ts, Simulator::NO_CONTEXT, SampleKey(ts, 1), new FnEvent([&] { trace.push_back("S1"); }));
    sim->ScheduleKeyedAt(ts, Simulator::NO_CONTEXT, SampleKey(ts, 0), new FnEvent([&] { trace.push_back("S0"); }));
    sim->AdvanceTo(ts);
    for (int i = 0; i < 3; ++i) {
      Simulator::Schedule(NanoSeconds(0), [&trace, i] { trace.push_back("C" + std::to_string(i)); });
    }
    Simulator::Run();
    LeaveKeyedSimulator(was);
    const std::vector<std::string> want = {"C0", "C1", "C2", "S0", "S1"};
    NS_TEST_ASSERT_MSG_EQ((trace == want), true, "the caller's events of the ns, then the samples by slot");
  }
};

class PhantoraKeyedTestSuite : public TestSuite {
 public:
  PhantoraKeyedTestSuite() : TestSuite("phantora-keyed", Type::UNIT) {
    AddTestCase(new KeyedHeapOrderTest, TestCase::Duration::QUICK);
    AddTestCase(new KeyedWheelOrderTest, TestCase::Duration::QUICK);
    AddTestCase(new KeyedLeastReachTest, TestCase::Duration::QUICK);
    AddTestCase(new KeyedWheelOrderTest(true), TestCase::Duration::QUICK);
    AddTestCase(new KeyedLeastReachTest(true), TestCase::Duration::QUICK);
    AddTestCase(new KeyedSimulatorTest, TestCase::Duration::QUICK);
    AddTestCase(new KeyedSampleKeyTest, TestCase::Duration::QUICK);
  }
};

PhantoraKeyedTestSuite g_phantoraKeyedTestSuite;

}  // namespace
