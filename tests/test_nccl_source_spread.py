"""Published tables of one set-up against each other (phantora/collectives/nccl/source_spread.py): which tables
are partners, their per-size gaps and floors, and a miss's verdict, on hand-written CSVs whose figures make every
answer a closed form; then the grouping of the real one-host A100 all-reduce tables."""

from __future__ import annotations

from pathlib import Path

import pytest

from phantora.collectives.nccl.published import read_table, tables
from phantora.collectives.nccl.source_spread import (
    differences,
    gaps,
    judge,
    near_versions,
    partners,
    run_facts,
    version,
)

MiB = 1 << 20
HEAD = "# system=Lab {host} (8x A100-SXM4-{mem}GB, NVSwitch); gpus=8; nodes=1; nic=n/a; {rest}"


def _table(tmp: Path, name: str, rest: str, rows: dict[int, float], host: str = "X", mem: int = 80):
    lines = [HEAD.format(host=host, mem=mem, rest=rest), "size_bytes,time_us,algbw_gbs,busbw_gbs"]
    lines += [f"{size},,,{bw}" for size, bw in rows.items()]
    path = tmp / f"a100_8gpu_1node_all_reduce_{name}.csv"
    path.write_text("\n".join(lines) + "\n")
    return read_table(path)


@pytest.fixture
def lab(tmp_path: Path):
    """A: NCCL 2.18.5, -g 8 -w 5 -n 40. B: NCCL unstated, another host. C: NCCL 2.26.5 (8 minors from A, none from
    B's unstated). D: as A with NCCL_ALGO=Ring forced. Figures at 1 MiB and 64 MiB."""
    return {
        "A": _table(tmp_path, "a", "nccl=2.18.5; all_reduce_perf -g 8 -w 5 -n 40", {MiB: 100.0, 64 * MiB: 200.0}),
        "B": _table(tmp_path, "b", "nccl=not stated; -g 8", {MiB: 130.0, 64 * MiB: 250.0}, host="Y", mem=40),
        "C": _table(tmp_path, "c", "nccl=2.26.5; -g 8", {MiB: 300.0}),
        "D": _table(tmp_path, "d", "nccl=2.18.5; NCCL_ALGO=Ring; -g 8", {MiB: 100.0}),
    }


def test_partners_share_the_setup_and_a_near_version(lab):
    """A's partner is B (unstated version); C is 8 minors from A, D forces an algorithm; C and B are partners."""
    pool = list(lab.values())
    assert [p.name for p in partners(lab["A"], pool)] == [lab["B"].name]
    assert [p.name for p in partners(lab["C"], pool)] == [lab["B"].name]
    assert partners(lab["D"], pool) == []
    assert str(version(lab["A"])) == "2.18.5" and str(version(lab["B"])) == "unstated"
    assert near_versions(version(lab["A"]), version(lab["A"]))
    assert not near_versions(version(lab["A"]), version(lab["C"]))


def test_what_a_pair_does_not_hold_equal_is_listed(lab):
    facts = run_facts(lab["A"])
    got = (facts["-g"], facts["-w"], facts["-n"], facts["host"], facts["gpu memory"])
    assert got == ("8", "5", "40", "Lab X", "80")
    diff = differences(lab["A"], lab["B"])
    assert "nccl 2.18.5 / unstated" in diff and "host Lab X / Lab Y" in diff and "gpu memory 80 / 40" in diff
    assert "-g 8 / 8" not in " ".join(diff) and diff[-1].startswith("unstated in both: ")


def test_gaps_floors_and_the_goals_band_are_their_closed_forms(lab):
    """1 MiB: 100 vs 130, ratio 1.3 <= 1.15 / 0.85: one prediction meets both; floor 30 / 230. 64 MiB: 200 vs 250,
    ratio 1.25 > 1.10 / 0.90 = 1.222: none does; floor 50 / 450, at v = 2 x 200 x 250 / 450 = 222.2."""
    one, big = gaps(lab["A"], lab["B"])
    assert (one.size, one.a, one.b) == (MiB, 100.0, 130.0) and big.size == 64 * MiB
    assert one.ratio == pytest.approx(1.3) and one.apart == pytest.approx(0.3) and one.reachable
    assert one.floor == pytest.approx(30 / 230)
    assert big.ratio == pytest.approx(1.25) and not big.reachable
    v = 2 * 200 * 250 / 450
    assert big.floor == pytest.approx(abs(v - 200) / 200) == pytest.approx(abs(v - 250) / 250)
    assert gaps(lab["A"], lab["B"], min_size=2 * MiB) == [big]


def test_a_miss_is_inside_the_spread_only_where_no_prediction_meets_both(lab):
    """A model at 240 on A's 64 MiB (+20%) misses: with B's 250 the band [225, 220] is empty: inside; it meets B
    (-4%). At 1 MiB a model at 84 (-16%) misses A, but [110.5, 115] meets both: outside (the model, -35% on B,
    meets neither). D has no partner."""
    pool = list(lab.values())
    big = judge(lab["A"], 64 * MiB, 240.0, pool)
    assert big.verdict == "inside" and big.model_meets_a_partner and big.partner_figures == ((lab["B"].name, 250.0),)
    one = judge(lab["A"], MiB, 84.0, pool)
    assert one.verdict == "outside" and not one.model_meets_a_partner and one.one_meets_all
    assert big.floor == pytest.approx(50 / 450) and big.model_worst == pytest.approx(0.2)
    assert big.model_side == "between"
    assert one.model_side == "below all" and judge(lab["A"], MiB, 131.0, pool).model_side == "above all"
    assert judge(lab["D"], MiB, 130.0, pool).verdict == "no partner figure"
    # C (300) and B (130) at 1 MiB: 300 x 0.85 > 130 x 1.15, so no one prediction meets both.
    assert judge(lab["C"], MiB, 200.0, pool).verdict == "inside"


def test_the_one_host_a100_all_reduce_curves_are_one_setup():
    """Azure (NCCL 2.18.5), Galvatron's DGX A100 fixture and Oracle's BM.GPU4.8 (NCCL unstated) publish 1 MiB at
    36.22, 23.29 and 23.92 GB/s (their CSVs): Azure's and Galvatron's ratio 1.555 > 1.353, no prediction meets
    both; Galvatron's and Oracle's meet."""
    pool = tables(include_held_out=True)
    by_name = {t.name: t for t in pool}
    azure = by_name["a100_8gpu_1node_all_reduce_azure_nda100v4"]
    names = {p.name for p in partners(azure, pool)}
    assert names == {
        "a100_8gpu_1node_all_reduce_galvatronfixture",
        "a100_8gpu_1node_all_reduce_mscclppndmv4",
        "a100_8gpu_1node_all_reduce_ocibmgpu48",
    }  # Oracle's NCCL 2.26.5 point is 8 minors from Azure's 2.18.5
    first = gaps(azure, by_name["a100_8gpu_1node_all_reduce_galvatronfixture"])[0]
    assert (first.size, first.a, first.b) == (MiB, 36.22, 23.29) and not first.reachable
    galvatron = by_name["a100_8gpu_1node_all_reduce_galvatronfixture"]
    oracle = gaps(galvatron, by_name["a100_8gpu_1node_all_reduce_ocibmgpu48"])
    assert oracle[0].b == 23.92 and oracle[0].reachable
