"""The job spec file and placement: one-line errors naming the file, the job's line and the field; the policies."""

from __future__ import annotations

from pathlib import Path

import pytest

from bridge.runspec import topology_from_dict, topology_to_dict
from phantora.errors import InputError
from phantora.jobs.spec import load_jobs, parse_jobs, place_jobs
from phantora.topology import load_topology
from phantora.topology.placement import choose

GOOD = """
all_or_nothing = true
[[job]]
name = "a"
script = "gpt_ddp.py"
args = "--steps 3 --d-model 64"
ranks = 4
placement = "spread"
start = "2ms"
traffic_class = 5

[[job]]
name = "bg"
workload = "ddp_buckets.toml"
nproc = 8
placement = "random"
seed = 7
steps = 2
"""


def test_a_good_spec_parses() -> None:
    spec = parse_jobs(GOOD, "jobs.toml", Path("."))
    assert spec.all_or_nothing
    a, bg = spec.jobs
    assert (a.kind, a.args, a.ranks, a.placement, a.start_ns, a.traffic_class) == (
        "script",
        ["--steps", "3", "--d-model", "64"],
        4,
        "spread",
        2_000_000,
        5,
    )
    assert (bg.kind, bg.ranks, bg.seed, bg.steps, bg.line) == ("workload", 8, 7, 2, 12)


@pytest.mark.parametrize(
    ("text", "field", "line", "words"),
    [
        ('[[job]]\nscript = "x.py"\n', "ranks", 1, "needs its number of ranks"),
        ('[[job]]\nscript = "x.py"\nworkload = "w.toml"\nranks = 2\n', "workload", 1, "exactly one of"),
        ('[[job]]\nscript = "x.py"\nranks = 2\ncolour = "red"\n', "colour", 1, "unknown key"),
        ('\n[[job]]\nscript = "x.py"\nranks = 2\ntraffic_class = 9\n', "traffic_class", 2, "1..7"),
        ('[[job]]\nscript = "x.py"\nranks = 0\n', "ranks", 1, ">= 1"),
        ('[[job]]\nscript = "x.py"\nranks = 2\nstart = "3 parsecs"\n', "start", 1, "time"),
        (
            '[[job]]\nname="a"\nscript = "x.py"\nranks = 2\n[[job]]\nname="a"\nscript = "y.py"\nranks = 2\n',
            "name",
            5,
            "twice",
        ),
        ('[[job]]\nworkload = "w.toml"\nranks = 2\nargs = ["-x"]\n', "args", 1, "only a script"),
    ],
)
def test_bad_specs_name_file_line_and_field(text: str, field: str, line: int, words: str) -> None:
    with pytest.raises(InputError) as err:
        parse_jobs(text, "jobs.toml", Path("."))
    assert (err.value.file, err.value.line, err.value.field) == ("jobs.toml", line, field)
    assert words in str(err.value) and str(err.value).startswith(f"jobs.toml:{line}: field '{field}'")
    assert "\n" not in str(err.value)


def test_not_toml_and_no_jobs(tmp_path: Path) -> None:
    p = tmp_path / "j.toml"
    p.write_text("[[job]\n")
    with pytest.raises(InputError, match="not valid TOML") as err:
        load_jobs(p)
    assert err.value.line == 1
    p.write_text("all_or_nothing = false\n")
    with pytest.raises(InputError, match="no jobs"):
        load_jobs(p)


def _spec(*jobs: str) -> str:
    return "".join(f'[[job]]\nscript = "x.py"\n{j}\n' for j in jobs)


def test_placement_policies_on_testbed16() -> None:
    topo = load_topology("testbed16")  # 2 hosts x 8 GPUs
    spec = parse_jobs(
        _spec("ranks = 4", 'ranks = 4\nplacement = "spread"', "ranks = 2\nplacement = [8, 'gpu15']"),
        "j.toml",
        Path("."),
    )
    packed, spread, explicit = place_jobs(spec, topo)
    assert explicit == [8, 15]  # explicit lists are placed first
    assert packed == [0, 1, 2, 3]  # the lowest free GPUs
    assert spread == [4, 5, 9, 10]  # alternating hosts, from the GPUs left
    free = list(range(16))
    r1, r2 = choose(topo, 6, "random", free, seed=1), choose(topo, 6, "random", free, seed=1)
    assert r1 == r2 == sorted(r1) and len(set(r1)) == 6
    assert choose(topo, 6, "random", free, seed=2) != r1


def test_spread_uses_leaves_when_gpus_have_no_host() -> None:
    topo = load_topology("twoleaf8")  # GPUs 0-3 on one leaf, 4-7 on the other, no hosts
    assert choose(topo, 4, "spread", range(8)) == [0, 1, 4, 5]


def test_bad_placements_are_refused_before_anything_starts() -> None:
    topo = load_topology("testbed16")
    overlap = parse_jobs(_spec("ranks = 2\nplacement = [0, 1]", "ranks = 2\nplacement = '1-2'"), "j.toml", Path("."))
    with pytest.raises(InputError, match=r"GPU 1 \(gpu1\) is already job 'job0's") as err:
        place_jobs(overlap, topo)
    assert (err.value.line, err.value.field) == (5, "placement")
    too_many = parse_jobs(_spec("ranks = 12", "ranks = 6"), "j.toml", Path("."))
    with pytest.raises(InputError, match=r"the jobs need 18 GPUs \(job0 12, job1 6\) but 'testbed16' has 16"):
        place_jobs(too_many, topo)
    for bad, words in (
        ("[0, 99]", "GPU 99 is outside"),
        ("['gpu0', 'nic3']", "no GPU named 'nic3'"),
        ("[0, 0]", "listed twice"),
        ("[0]", "1 GPUs listed for 2 ranks"),
    ):
        with pytest.raises(InputError, match=words):
            place_jobs(parse_jobs(_spec(f"ranks = 2\nplacement = {bad}"), "j.toml", Path(".")), topo)


def test_a_placed_topology_keeps_routes_and_travels_to_the_coordinator() -> None:
    topo = load_topology("testbed16")
    placed = topo.with_rank_order([9, 3])
    assert placed.endpoints[:2] == [topo.endpoints[9], topo.endpoints[3]]
    assert sorted(placed.endpoints) == sorted(topo.endpoints)
    a, b = placed.node_of_rank(0), placed.node_of_rank(1)
    assert placed.route(a, b, 5) == topo.route(a, b, 5)
    back = topology_from_dict(topology_to_dict(placed))
    assert back.endpoints == placed.endpoints and back.rank_order == placed.rank_order
