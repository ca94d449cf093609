"""The scenario file (issue 36): every event kind parses into frozen dataclasses; errors name file, line, field."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from phantora.errors import InputError
from phantora.netsim.fault_plan import timed_actions
from phantora.netsim.scenario import Background, GpuSlow, LinkEvent, NodeEvent, parse_scenario, read_scenario
from phantora.topology.generators import leaf_spine

FULL = """\
name = "all-kinds"
seed = 7
reconvergence = "50us"

[[events]]
kind = "link_down"
at = "2ms"
link = ["leaf0", "spine0"]

[[events]]
kind = "link_up"
at_step = 3
link = ["leaf0", "spine0"]

[[events]]
kind = "link_flap"
at = "1ms"
link = ["leaf1", "spine1"]
period = "1ms"
duty = 0.25
count = 3

[[events]]
kind = "link_degrade"
at = "3ms"
duration = "1ms"
link = ["leaf1", "spine0"]
rate = "50Gbps"
extra_latency = "5us"
loss = 0.01

[[events]]
kind = "switch_down"
at = "4ms"
switch = "spine1"
duration = "200us"

[[events]]
kind = "nic_down"
at = "5ms"
rank = 1

[[events]]
kind = "gpu_slow"
rank = 2
factor = 1.5
from = "1ms"
duration = "10ms"

[[events]]
kind = "background"
at = "0ms"
duration = "20ms"
cdf = "websearch"
load = 0.3
hosts = [0, 1, 2, 3]
"""


def test_every_kind_parses_frozen() -> None:
    sc = parse_scenario(FULL, "s.toml")
    assert sc.name == "all-kinds" and sc.seed == 7 and sc.reconvergence_ns == 50_000
    assert [e.kind for e in sc.events] == [
        "link_down",
        "link_up",
        "link_flap",
        "link_degrade",
        "switch_down",
        "nic_down",
        "gpu_slow",
        "background",
    ]
    down, up, flap, deg, sw, nic, slow, bg = sc.events
    assert isinstance(down, LinkEvent) and down.at_ns == 2_000_000 and down.link == ("leaf0", "spine0")
    assert up.at_step == 3 and up.at_ns is None
    assert isinstance(flap, LinkEvent) and (flap.period_ns, flap.duty, flap.count) == (1_000_000, 0.25, 3)
    assert isinstance(deg, LinkEvent) and (deg.rate_bps, deg.extra_latency_ns, deg.loss) == (50 * 10**9, 5000, 0.01)
    assert isinstance(sw, NodeEvent) and sw.node == "spine1" and sw.duration_ns == 200_000
    assert isinstance(nic, NodeEvent) and nic.rank == 1
    assert isinstance(slow, GpuSlow) and (slow.rank, slow.factor, slow.at_ns) == (2, 1.5, 1_000_000)
    assert isinstance(bg, Background) and bg.hosts == (0, 1, 2, 3) and bg.load == 0.3
    assert down.line == 5 and bg.line == FULL.splitlines().index('kind = "background"')
    with pytest.raises(dataclasses.FrozenInstanceError):
        down.at_ns = 0  # type: ignore[misc]


def test_actions_expand_flaps_and_durations() -> None:
    topo = leaf_spine(2, 2, 2, nic_rate="100Gbps", nvswitch=False)
    sc = parse_scenario(FULL, "s.toml")
    acts = [(a.t_ns, a.op, a.label) for a in timed_actions(sc, topo)]
    flaps = [a for a in acts if a[2] == "link_flap#2"]
    assert flaps == [
        (1_000_000, "down", "link_flap#2"),
        (1_250_000, "up", "link_flap#2"),
        (2_000_000, "down", "link_flap#2"),
        (2_250_000, "up", "link_flap#2"),
        (3_000_000, "down", "link_flap#2"),
        (3_250_000, "up", "link_flap#2"),
    ]
    assert (3_000_000, "degrade", "link_degrade#3") in acts and (4_000_000, "restore", "link_degrade#3") in acts
    assert not any(a[2] == "link_up#1" for a in acts)  # at a step boundary: expanded when the step starts
    assert [a[0] for a in acts] == sorted(a[0] for a in acts)


@pytest.mark.parametrize(
    ("body", "line", "field", "words"),
    [
        ('[[events]]\nkind = "link_dwn"\nat = "1ms"\n', 1, "events[0].kind", "expected one of"),
        ('[[events]]\nkind = "link_down"\nlink = ["a", "b"]\n', 1, "events[0].at", "exactly one of"),
        ('\n[[events]]\nkind = "link_down"\nat = "1ms"\nlink = ["a"]\n', 2, "events[0].link", "two node"),
        ('[[events]]\nkind = "link_down"\nat = "soon"\nlink = ["a", "b"]\n', 1, "events[0].at", ""),
        (
            '[[events]]\nkind = "link_down"\nat = "1ms"\nlink = ["a", "b"]\nrate = "1Gbps"\n',
            1,
            "events[0].rate",
            "unknown",
        ),
        (
            '[[events]]\nkind="link_flap"\nat="0ns"\nlink=["a","b"]\nperiod="1ms"\nduty=1.5\n',
            1,
            "events[0].duty",
            "(0.0",
        ),
        ('[[events]]\nkind = "link_degrade"\nat = "0ns"\nlink = ["a", "b"]\n', 1, "events[0].rate", "needs rate"),
        ('[[events]]\nkind = "gpu_slow"\nat = "0ns"\nrank = 1\nfactor = 0\n', 1, "events[0].factor", "(0.0"),
        ('[[events]]\nkind = "background"\nat = "0ns"\ncdf = "websearch"\nload = 0.3\n', 1, "events[0].duration", ""),
        ('[[events]]\nkind = "nic_down"\nat = "0ns"\n', 1, "events[0].node", "by node"),
    ],
)
def test_errors_name_file_line_and_field(body: str, line: int, field: str, words: str) -> None:
    with pytest.raises(InputError) as err:
        parse_scenario("# a scenario\n" + body, "bad.toml")
    assert (err.value.file, err.value.line, err.value.field) == ("bad.toml", line + 1, field)
    assert words in err.value.message
    assert str(err.value).startswith(f"bad.toml:{line + 1}: field '{field}': ")


def test_top_level_and_toml_errors(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="field 'seeds'"):
        parse_scenario("seeds = 1\n", "x.toml")
    with pytest.raises(InputError) as err:
        parse_scenario("a = = 1\n", "x.toml")
    assert err.value.line == 1
    with pytest.raises(InputError, match="cannot read scenario file"):
        read_scenario(tmp_path / "missing.toml")
    p = tmp_path / "ok.toml"
    p.write_text('[[events]]\nkind = "link_down"\nat = "1ms"\nlink = ["leaf0", "spine0"]\n')
    assert read_scenario(p).name == "ok"
