"""Reuse of repeated completion profiles in packet mode (`--set reuse=on`, phantora.netsim.reuse; issue 13)."""

from __future__ import annotations

from collections import Counter

import pytest

from phantora.errors import InputError
from phantora.netsim.base import INF_NS, Completion, Flow
from phantora.netsim.engine_spec import EngineSpec
from phantora.netsim.factory import make_engine
from phantora.netsim.packet_config import PacketConfig, apply_overrides
from phantora.topology.loader import load_topology

G100 = 100_000_000_000
GAP_NS = 50_000  # between episodes: long enough for the fabric to fall quiet


def exact_config(reuse: bool, **changes: object) -> PacketConfig:
    """DCQCN with a step marking (kmin = kmax): ns-3 draws no random number, so reuse must be exact."""
    step = {G100: 40_000}
    return PacketConfig(
        cc="dcqcn", kmin_map=step, kmax_map=step, queue_sample_ns=1000, reuse="on" if reuse else "off", **changes
    )  # type: ignore[arg-type]


def incast(first_id: int, size: int, senders: tuple[int, ...] = (0, 1, 2, 4, 5)) -> list[Flow]:
    """Senders on both leaves into endpoint 3, plus a flow 6 -> 7 that waits for the last of them."""
    flows = [Flow(first_id + i, s, 3, size, key=s) for i, s in enumerate(senders)]
    last = first_id + len(senders) - 1
    return [*flows, Flow(last + 1, 6, 7, size // 2, deps=(last,), key=9)]


def run_episodes(config: PacketConfig, episodes: list[list[tuple[int, int]]]) -> tuple[list[Completion], dict, tuple]:
    """Each episode is a list of (time after its start, incast flow size) batches; the next episode starts
    GAP_NS after the previous one drained. Returns completions, stats and (PFC events, CE marks, channel bytes,
    transport counters by flow)."""
    sim = make_engine(EngineSpec("ns3", config), load_topology("twoleaf8"))
    done: list[Completion] = []
    fid, t0 = 0, 0
    for batches in episodes:
        for rel, size in batches:
            if t0 + rel > sim.now():
                done.extend(sim.advance(t0 + rel))
            flows = incast(fid, size)
            fid += len(flows)
            sim.submit(flows, t0 + rel)
        done.extend(sim.drain())
        t0 = sim.now() + GAP_NS
        done.extend(sim.advance(t0))
    fabric = sim.fabric()
    assert fabric is not None
    seen = (
        Counter((e.node, e.port, e.pause) for e in fabric.pfc_events()),
        len(fabric.ecn_mark_events()),
        sum(u.bytes for u in fabric.channel_usage()),
        fabric.flow_transport(),
    )
    stats = sim.stats()
    sim.close()
    return sorted(done, key=lambda c: (c.flow_id, c.end_ns)), stats, seen


def test_a_repeated_incast_is_served_and_equals_ns3_with_its_pfc_pauses(ns3_lib) -> None:
    """Three identical incasts (PFC pauses from a small buffer, DCQCN cuts): the second and third come from the
    first's profile, and every completion, PFC frame, CE mark and channel byte equals running ns-3 each time."""
    eps = [[(0, 300_000)]] * 3
    want, off, want_seen = run_episodes(exact_config(False, buffer_bytes=400_000), eps)
    got, on, got_seen = run_episodes(exact_config(True, buffer_bytes=400_000), eps)
    assert got == want
    assert got_seen == want_seen
    assert sum(want_seen[0].values()) > 0 and want_seen[1] > 0  # the case has pauses and marks to re-emit
    assert sorted(got_seen[3]) == list(range(3 * 6))  # every flow's transport counters, the served ones too
    assert on["pfc_pause"] == off["pfc_pause"] > 0 and on["ecn_marks"] == off["ecn_marks"]
    assert on["reuse_served"] == 2 and on["reuse_recorded"] == 1 and on["reuse_mismatches"] == 0
    assert on["reuse_events_avoided"] > off["events"] / 2  # two of three episodes never ran in ns-3


def test_a_diverging_later_batch_materialises_and_equals_reuse_off(ns3_lib) -> None:
    """Episode: an incast, and 5 us later a second one while the first is in flight. The repeat's second batch
    comes with another size: ns-3 runs the episode from its start, and the results equal running it all."""
    eps = [[(0, 200_000), (5_000, 100_000)], [(0, 200_000), (5_000, 120_000)], [(0, 200_000), (5_000, 100_000)]]
    want, _, want_seen = run_episodes(exact_config(False), eps)
    got, on, got_seen = run_episodes(exact_config(True), eps)
    assert got == want
    assert got_seen == want_seen
    assert on["reuse_materialised"] == 1 and on["reuse_served"] == 1 and on["reuse_mismatches"] == 0


def test_a_later_batch_at_another_time_materialises_too(ns3_lib) -> None:
    eps = [[(0, 200_000), (5_000, 100_000)], [(0, 200_000), (7_000, 100_000)]]
    want, _, _ = run_episodes(exact_config(False), eps)
    got, on, _ = run_episodes(exact_config(True), eps)
    assert got == want
    assert on["reuse_materialised"] == 1 and on["reuse_served"] == 0


def run_queued(reuse: bool, field: str, layouts: list[tuple[int, int]]) -> tuple[list[Completion], dict]:
    """One episode per layout: two flows from endpoint 0 whose `field` (queue or conn) ids are the layout's (to 3
    and 5 with queues; to 3 with connections, a queue pair has one destination); the next episode starts GAP_NS
    after the previous one drained."""
    sim = make_engine(EngineSpec("ns3", exact_config(reuse)), load_topology("twoleaf8"))
    done: list[Completion] = []
    fid = 0
    second = 5 if field == "queue" else 3
    for a, b in layouts:
        flows = [Flow(fid, 0, 3, 200_000, key=1, **{field: a}), Flow(fid + 1, 0, second, 200_000, key=2, **{field: b})]
        fid += 2
        sim.submit(flows, sim.now())
        done.extend(sim.drain())
        done.extend(sim.advance(sim.now() + GAP_NS))
    stats = sim.stats()
    sim.close()
    return sorted(done, key=lambda c: (c.flow_id, c.end_ns)), stats


@pytest.mark.parametrize("field", ["queue", "conn"])
def test_queue_structure_is_part_of_the_episode_and_absolute_ids_are_not(ns3_lib, field: str) -> None:
    """Two flows on one queue (queue pair) go one after the other, on two they share the NIC: episodes equal but
    for that structure are each run in ns-3; a repeat of the first with other ids (9, 9) is served from it."""
    layouts = [(7, 7), (7, 8), (9, 9)]
    want, _ = run_queued(False, field, layouts)
    got, on = run_queued(True, field, layouts)
    assert got == want
    t0s = (want[0].start_ns, want[2].start_ns, want[4].start_ns)
    shapes = [[(c.start_ns - t0, c.end_ns - t0) for c in want[i : i + 2]] for i, t0 in zip((0, 2, 4), t0s, strict=True)]
    assert shapes[0] != shapes[1]  # the structure changes the timing: serving one from the other would be wrong
    assert shapes[0] == shapes[2]
    assert on["reuse_recorded"] == 2 and on["reuse_served"] == 1 and on["reuse_mismatches"] == 0


def run_gapped(reuse: bool, gaps: list[int], step_ns: int = 1_000) -> tuple[list[Completion], dict]:
    """Identical incasts, the next one `gaps[i]` ns after the previous one drained, the clock moved in `step_ns`
    steps in between (as the fluid NVLink side moves the packet side between collectives)."""
    sim = make_engine(EngineSpec("ns3", exact_config(reuse)), load_topology("twoleaf8"))
    done: list[Completion] = []
    fid = 0
    for gap in [*gaps, None]:
        flows = incast(fid, 200_000)
        fid += len(flows)
        sim.submit(flows, sim.now())
        done.extend(sim.drain())
        if gap is not None:
            end = sim.now() + gap
            while sim.now() < end:
                done.extend(sim.advance(min(end, sim.now() + step_ns)))
    stats = sim.stats()
    sim.close()
    return sorted(done, key=lambda c: (c.flow_id, c.end_ns)), stats


def test_a_repeat_followed_sooner_than_the_recorded_episode_is_still_served(ns3_lib) -> None:
    """The recorded incast is followed 200 us after it drained, its repeat 40 us after: the fabric was quiet a
    few us after the drain, so the third incast is served as well (it materialised when the record learnt the
    quiet only at the next submission, 200 us on; the 256-GPU MoE step's all-to-alls, issue 38)."""
    want, _ = run_gapped(False, [200_000, 40_000])
    got, on = run_gapped(True, [200_000, 40_000])
    assert got == want
    assert on["reuse_served"] == 2 and on["reuse_materialised"] == 0 and on["reuse_mismatches"] == 0


def test_advance_watching_stops_at_the_first_watched_completion_when_serving(ns3_lib) -> None:
    ends: dict[bool, tuple[list[Completion], int, int]] = {}
    for reuse in (False, True):
        sim = make_engine(EngineSpec("ns3", exact_config(reuse)), load_topology("twoleaf8"))
        sim.submit(incast(0, 200_000), 0)
        sim.drain()
        t0 = sim.now() + GAP_NS
        sim.advance(t0)
        sim.submit(incast(100, 200_000), t0)
        got = sim.advance_watching(INF_NS, {102})
        ends[reuse] = (got, sim.now(), sim.in_flight())
        stats = sim.stats()
        sim.close()
    assert ends[True] == ends[False]
    got, now, left = ends[True]
    assert got[-1].flow_id == 102 or any(c.flow_id == 102 for c in got if c.end_ns == now)
    assert max(c.end_ns for c in got) == now and left > 0
    assert stats["reuse_episodes"] == 2 and stats["reuse_materialised"] == 0  # still serving


def test_reuse_is_an_approximation_results_list() -> None:
    assert apply_overrides(PacketConfig(), ["reuse=on"]).approximations() == ["reuse=on"]
    both = apply_overrides(PacketConfig(), ["nvlink=fluid", "reuse=on"])
    assert both.approximations() == ["nvlink=fluid", "reuse=on"]
    with pytest.raises(InputError) as exc:
        apply_overrides(PacketConfig(), ["reuse=maybe"])
    assert exc.value.field == "reuse"


def test_engine_stats_name_reuse_under_fluid_nvlink(ns3_lib) -> None:
    """reuse wraps the packet side of the hybrid; results.json's approximations come from these stats."""
    sim = make_engine(
        EngineSpec("ns3", PacketConfig(cc="dcqcn", nvlink="fluid", reuse="on")), load_topology("testbed16")
    )
    sim.submit([Flow(1, 0, 8, 100_000), Flow(2, 0, 1, 100_000)], 0)
    sim.drain()
    stats = sim.stats()
    sim.close()
    assert stats["approximations"] == ["nvlink=fluid", "reuse=on"]
    assert stats["reuse_episodes"] == 1


def test_flow_mode_and_netsim_refuse_reuse_naming_the_field(capsys) -> None:
    from phantora.cli import main

    assert main(["replay", "fsdp_layers", "-t", "testbed16", "--network", "flow", "--set", "reuse=on"]) == 2
    err = capsys.readouterr().err
    assert "reuse" in err and "ns3 only" in err and "Traceback" not in err
    assert main(["netsim", "--network", "ns3", "-t", "hpcc/star8", "-f", "incast4", "--set", "reuse=on"]) == 2
    err = capsys.readouterr().err
    assert "reuse" in err and "run and replay" in err and "Traceback" not in err


def test_graph_replay_results_keep_the_approximations_list() -> None:
    """results.json of `phantora replay GRAPH` says which approximations the engine used."""
    from phantora.egraph.replay import GraphReplayResult

    stats = {
        "events": 7,
        "approximations": ["nvlink=fluid", "reuse=on"],
        "decompose": {"workers": 2, "rounds": 3},  # nested plain maps stay (decomposition settings, per worker)
        "engine": object(),  # anything not plain is left out
        "mixed": {"x": object()},
    }
    res = GraphReplayResult([1], [1], [[1]], [1], 1, {}, stats, 1, 0, 0.0, 0.0)
    kept = res.to_dict()["engine_stats"]
    assert kept == {
        "events": 7,
        "approximations": ["nvlink=fluid", "reuse=on"],
        "decompose": {"workers": 2, "rounds": 3},
    }
