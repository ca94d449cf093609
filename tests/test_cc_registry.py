"""Congestion controls by name: the library's registry, a user's own CC built from $PHANTORA_CC_DIR, and Swift.

Closed forms: a CC pacing at a fixed share s of the line rate B sends a flow's n packets of w wire bytes
(n - 1) * w * 8 * (1/(s B) - 1/B) later than line rate does; Swift (SIGCOMM'20, section 3.5) holds the
RTT at its target, so on a 2-to-1 incast the bottleneck's queueing delay is BaseTarget plus the flow-based
scaling at the flows' window, and the two equal flows share the port evenly.
"""

from __future__ import annotations

import math
import subprocess
from pathlib import Path
from statistics import mean

import pytest
from test_packet_engine import star  # n hosts on one switch, 100 Gb/s, 1 us

from phantora.errors import InputError
from phantora.netsim.base import Flow
from phantora.netsim.cc_registry import registry
from phantora.netsim.cli_config import packet_config_from_flags
from phantora.netsim.packet import Ns3Simulator, runner_path
from phantora.netsim.packet_config import PacketConfig

pytestmark = pytest.mark.ns3

G = 10**9
B = 100 * G
PAYLOAD, HEADER = 1000, 48

FIXED_SHARE_CC = """\
// A test CC: paces every queue pair at a fixed share of its line rate, with no window.
#include "congestion-control.h"
#include "phantora-type-id.h"

#include "ns3/double.h"

namespace ns3 {

class CcTestFixedShare : public CongestionControl {
 public:
  static TypeId GetTypeId() {
    static TypeId tid = PhantoraTypeId<CcTestFixedShare, CongestionControl>("ns3::CcTestFixedShare")
                            .AddAttribute("Share", "Fraction of the line rate", DoubleValue(0.5),
                                          MakeDoubleAccessor(&CcTestFixedShare::m_share),
                                          MakeDoubleChecker<double>(0.001, 1.0));
    return tid;
  }
  void Start(uint64_t lineRateBps, uint64_t baseRttNs, uint32_t mtuBytes, uint64_t bdpBytes) override {
    CongestionControl::Start(lineRateBps, baseRttNs, mtuBytes, bdpBytes);
    m_rateBps = static_cast<uint64_t>(m_share * static_cast<double>(lineRateBps));
  }
  void OnAck(const CcFeedback&) override {}

 private:
  double m_share = 0.5;
};

PHANTORA_REGISTER_CC(CcTestFixedShare, "testshare");

}  // namespace ns3
"""


# ----- the registry ------------------------------------------------------------------------------------------
def test_the_registry_lists_the_built_in_ccs_with_their_attributes() -> None:
    known = registry()
    assert {"none", "dcqcn", "hpcc", "timely", "dctcp", "swift"} <= set(known)
    assert known["swift"].typeid == "ns3::CcSwift"
    assert {"BaseTarget", "Ai", "Beta", "MaxMdf", "FsRange", "FsMinCwnd", "FsMaxCwnd"} <= set(known["swift"].attributes)
    assert known["swift"].attributes["Beta"].default == "0.8" and known["swift"].attributes["Beta"].kind == (
        "ns3::DoubleValue"
    )


def test_an_unknown_cc_or_attribute_is_one_line_naming_the_field_and_the_known_ones() -> None:
    with pytest.raises(InputError) as e:
        packet_config_from_flags(cc="cubic")
    assert e.value.field == "--cc" and "registered: " in str(e.value) and "swift" in str(e.value)
    assert "\n" not in str(e.value)
    with pytest.raises(InputError) as e:
        packet_config_from_flags(cc="swift", sets=["cc.Target=5us"])
    assert e.value.field == "cc.Target" and "(its attributes: Ai, BaseTarget, Beta" in str(e.value)
    with pytest.raises(InputError) as e:
        packet_config_from_flags(cc="swift", sets=["cc.BaseTarget=soon"])
    assert e.value.field == "cc.BaseTarget" and "takes a time such as 4us" in str(e.value)


def test_the_engine_refuses_an_unknown_cc_in_one_line(ns3_lib) -> None:
    with pytest.raises(InputError) as e:
        Ns3Simulator(star(2), PacketConfig(cc="cubic"))
    assert e.value.field == "cc" and "registered: dcqcn, dctcp, hpcc, none" in str(e.value)
    with Ns3Simulator(star(2), PacketConfig(cc="swift")) as sim:  # and released the network on the way out
        sim.submit([Flow(1, 0, 1, 1000)], at=0)
        assert len(sim.drain()) == 1


# ----- a user's own CC, built from $PHANTORA_CC_DIR ----------------------------------------------------------
def one_flow_ns(cc: str, attrs: dict[str, str] | None = None, calls: Path | None = None) -> int:
    """Completion time (data at the receiver) of one 1 MB flow over star(2) under `cc`."""
    with Ns3Simulator(star(2), PacketConfig(cc=cc, cc_attrs=attrs or {}), calls=calls) as sim:
        sim.submit([Flow(1, 1, 0, 1_000_000)], at=0)
        (done,) = sim.drain()
        sim.finish()
        return done.end_ns - done.start_ns


def test_a_cc_in_the_users_folder_is_built_registered_and_paces_as_written(
    ns3_lib, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "my-ccs"
    folder.mkdir()
    (folder / "cc-test-share.cc").write_text(FIXED_SHARE_CC)
    monkeypatch.setenv("PHANTORA_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PHANTORA_CC_DIR", str(folder))
    assert registry()["testshare"].attributes["Share"].default == "0.5"  # the library, built and asked
    line = one_flow_ns("none")
    half = one_flow_ns("testshare", calls=tmp_path / "calls.txt")
    config = packet_config_from_flags(cc="testshare", sets=["cc.Share=0.25"])  # the --set path reaches it
    quarter = one_flow_ns("testshare", config.cc_attrs)
    n = 1_000_000 // PAYLOAD
    gap = (n - 1) * (PAYLOAD + HEADER) * 8 * G  # bit-ns of the packets after the first
    assert half - line == pytest.approx(gap / B, abs=2)  # 1/(B/2) - 1/B
    assert quarter - line == pytest.approx(3 * gap / B, abs=2)  # 1/(B/4) - 1/B
    # The run's call script loads the user's library first, so the runner replays it alone.
    script = (tmp_path / "calls.txt").read_text().splitlines()
    assert script[1].startswith("LoadLibrary ") and script[1].endswith("libphantora-cc.so")
    out = subprocess.run([str(runner_path()), str(tmp_path / "calls.txt"), str(tmp_path / "rr")], capture_output=True)
    assert out.returncode == 0, out.stderr
    fct = (tmp_path / "rr" / "fct.txt").read_text().split()
    assert int(fct[6]) > half  # the HPCC-style FCT runs to the last ACK, after the data arrived
    # A changed source is a new library (the build key holds the user's files).
    from phantora.netsim.ns3_build import cc_library_path

    first = cc_library_path()
    (folder / "cc-test-share.cc").write_text(FIXED_SHARE_CC + "// edited\n")
    assert cc_library_path() != first


# ----- Swift on a 2-to-1 incast ------------------------------------------------------------------------------
def incast(config: PacketConfig, size: int = 4_000_000) -> dict[str, object]:
    """Two equal flows into host 0 of star(3), queues sampled every 1 us at the bottleneck port."""
    with Ns3Simulator(star(3), config.with_updates(queue_sample_ns=1000)) as sim:
        sim.submit([Flow(1, 1, 0, size), Flow(2, 2, 0, size)], at=0)
        done = sim.drain()
        end = max(c.end_ns for c in done)
        queue = [
            s.bytes for s in sim.queue_samples() if s.node == 3 and s.port == 0 and 0.3 * end < s.time_ns < 0.9 * end
        ]
        return {
            "fct": sorted(c.end_ns - c.start_ns for c in done),
            "delay_ns": mean(queue) * 8 * G / B,  # steady-state queueing delay at the bottleneck
            "base_rtt": sim.base_rtt_ns(1, 0),
            "size": size,
        }


def swift_queue_delay_ns(base_target: float, base_rtt: float, delay: float) -> float:
    """Swift's target minus the base RTT: BaseTarget + flow-based scaling (section 3.5) at the window each of
    two flows holds when the RTT is base_rtt + delay (the pipe's wire bytes, halved, in packets)."""
    cwnd = B * (base_rtt + delay) / 8 / G / 2 / (PAYLOAD + HEADER)
    fs_range, lo, hi = 5 * base_target, 0.1, 100.0
    alpha = fs_range / (1 / math.sqrt(lo) - 1 / math.sqrt(hi))
    return base_target + min(max(alpha / math.sqrt(cwnd) - alpha / math.sqrt(hi), 0.0), fs_range)


@pytest.fixture(scope="module")
def swift_runs(ns3_lib) -> dict[str, dict[str, object]]:
    return {
        "default": incast(packet_config_from_flags(cc="swift")),
        "BaseTarget=10us": incast(packet_config_from_flags(cc="swift", sets=["cc.BaseTarget=10us"])),
    }


def test_swift_holds_the_queueing_delay_at_its_target(swift_runs) -> None:
    for base_target, run in ((5000, swift_runs["default"]), (10_000, swift_runs["BaseTarget=10us"])):
        delay = float(run["delay_ns"])  # type: ignore[arg-type]
        want = swift_queue_delay_ns(base_target, float(run["base_rtt"]), delay)  # type: ignore[arg-type]
        assert delay == pytest.approx(want, rel=0.05), base_target


def test_swift_shares_the_bottleneck_evenly(swift_runs) -> None:
    run = swift_runs["default"]
    first, last = run["fct"]  # type: ignore[misc]
    both = -(-2 * run["size"] // PAYLOAD) * (PAYLOAD + HEADER) * 8 * G / B  # type: ignore[operator]
    assert last / first < 1.01  # the two finish together: each had half the port throughout
    assert last == pytest.approx(both, rel=0.01)  # and the port stayed busy


def test_set_cc_base_target_moves_the_queue_the_way_swift_says(swift_runs) -> None:
    """Doubling BaseTarget (--set cc.BaseTarget=10us) about doubles the standing queue, at no cost in FCT."""
    small, large = swift_runs["default"], swift_runs["BaseTarget=10us"]
    assert 1.8 < large["delay_ns"] / small["delay_ns"] < 2.2  # type: ignore[operator]
    assert large["fct"][-1] == pytest.approx(small["fct"][-1], rel=0.01)  # type: ignore[index]
