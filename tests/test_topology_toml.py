"""The TOML topology format, shipped files and `load_topology` name resolution."""

from __future__ import annotations

from pathlib import Path

import pytest

from phantora.errors import InputError
from phantora.topology import load_topology, shipped_names
from phantora.topology.describe import leaf_oversubscription, rank_bisection_bps

G = 10**9


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "t.toml"
    path.write_text(text)
    return path


def test_shipped_files_load() -> None:
    names = shipped_names()
    for name in ("testbed16", "rail128", "leafspine1024", "star8", "twoleaf8", "hpcc/star8", "simai/rail16_h100"):
        assert name in names
    for name in names:
        t = load_topology(name)
        assert t.num_ranks >= 8


def test_testbed16() -> None:
    t = load_topology("testbed16")
    assert t.num_ranks == 16 and t.gpu_model == "h100"
    assert sorted({t.nodes[e].host for e in t.endpoints}) == [0, 1]
    nic = {lk.bandwidth_bps for lk in t.links if t.nodes[lk.a].kind == "gpu" and t.nodes[lk.b].kind == "switch"}
    assert nic == {400 * G}
    assert rank_bisection_bps(t) == 8 * 400 * G  # non-blocking between the two hosts


def test_rail128() -> None:
    t = load_topology("rail128")
    assert t.num_ranks == 128 and len({t.nodes[e].host for e in t.endpoints}) == 16
    assert sum(1 for n in t.nodes if n.kind == "switch" and n.tier == 1) == 8  # one leaf per rail


def test_leafspine1024() -> None:
    t = load_topology("leafspine1024")
    assert t.num_ranks == 1024
    assert leaf_oversubscription(t) == [4.0] * 32
    assert rank_bisection_bps(t) == 512 * 400 * G // 4


def test_explicit_format(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
name = "tiny"
gpu = "H100"
[link_defaults]
latency = "500ns"
[[nodes]]
name = "a"
kind = "gpu"
[[nodes]]
name = "b"
kind = "gpu"
[[nodes]]
name = "sw"
kind = "switch"
tier = 1
[[links]]
a = "a"
b = "sw"
rate = "25Gbps"
[[links]]
a = 1
b = "sw"
rate = "25Gbps"
latency = "2us"
""",
    )
    t = load_topology(path)
    assert t.name == "tiny" and t.gpu_model == "h100" and t.num_ranks == 2
    assert [(lk.a, lk.b, lk.bandwidth_bps, lk.latency_ns) for lk in t.links] == [
        (0, 2, 25 * G, 500),
        (1, 2, 25 * G, 2000),
    ]


NODES = '[[nodes]]\nname = "a"\nkind = "host"\n[[nodes]]\nname = "s"\nkind = "switch"\n'


@pytest.mark.parametrize(
    ("text", "field", "line"),
    [
        ('nmae = "x"\n' + NODES, "nmae", None),
        ('[generator]\nkind = "leaf_spine"\nleafs = 2\n', "generator.leafs", None),
        ('[generator]\nkind = "torus"\n', "generator.kind", None),
        (
            '[generator]\nkind = "leaf_spine"\nleaves = 2\nendpoints_per_leaf = 4\nspines = 1\nnic_rate = "fast"\n',
            "generator.nic_rate",
            None,
        ),
        ('[generator]\nkind = "fat_tree"\nk = 3\n', "generator.k", None),
        ('[generator]\nkind = "fat_tree"\n', "generator", None),
        (NODES + '[[links]]\na = "a"\nb = "t"\nrate = "1Gbps"\nlatency = "1us"\n', "links[0].b", 7),
        (NODES + '[[links]]\na = "a"\nb = "s"\nrate = "0Gbps"\nlatency = "1us"\n', "links[0].rate", 7),
        (NODES + '[[links]]\na = "a"\nb = "s"\nrate = "1Gbps"\n', "links[0].latency", 7),
        (NODES + '[[links]]\na = "a"\nb = "s"\nspeed = "1Gbps"\n', "links[0].speed", 7),
        (NODES + '[[nodes]]\nname = "a"\nkind = "host"\n', "nodes[2].name", 7),
        (NODES + '[[nodes]]\nname = "c"\nkind = "router"\n', "nodes[2].kind", 7),
        (NODES + '[[nodes]]\nname = "c"\nkind = "host"\nhost = -1\n', "nodes[2].host", 7),
        ('gpu = "h100"\n[generator]\nkind = "dgx_host"\n' + NODES, "generator", None),
        ('gpu = "h100"\ncpu = "epyc"\n[generator]\nkind = "dgx_host"\n', "cpu", 2),
        ('[generator]\nkind = "dgx_host"\ncpu = "amd"\n', "generator.cpu", None),
        ('[generator]\nkind = "dgx_host"\ncpu_model = "epyc"\n', "generator.cpu_model", None),
        (
            'cpu = "amd"\n[generator]\nkind = "rail_optimized"\nhosts = 2\ncpu_model = "spr"\n',
            "generator.cpu_model",
            None,
        ),
        ('cpu_model = "zen"\n[generator]\nkind = "dgx_host"\n', "cpu_model", 1),
        ('cpu_model = "rome"\n' + NODES, "cpu_model", 1),
    ],
)
def test_toml_errors_name_the_field(tmp_path: Path, text: str, field: str, line: int | None) -> None:
    path = write(tmp_path, text)
    with pytest.raises(InputError) as err:
        load_topology(path)
    assert err.value.field == field
    assert err.value.file == str(path)
    assert err.value.line == line


def test_toml_cpu_reaches_the_topology_in_both_forms(tmp_path: Path) -> None:
    """A top-level `cpu` (like `gpu`) sets the hosts' CPU vendor of a generator call and of explicit lists."""
    gen = load_topology(write(tmp_path, 'cpu = "AMD"\n[generator]\nkind = "dgx_host"\n'))
    assert gen.meta["cpu"] == "amd"
    explicit = NODES + '[[links]]\na = "a"\nb = "s"\nrate = 1\nlatency = 0\n'
    assert load_topology(write(tmp_path, 'cpu = "intel"\n' + explicit)).meta["cpu"] == "intel"
    assert "cpu" not in load_topology(write(tmp_path, explicit)).meta


def test_toml_cpu_model_in_both_forms(tmp_path: Path) -> None:
    """`cpu_model` (NCCL's CPU class: its inter-CPU link with P2P off) is a generator key of the DGX generators and a
    top-level key of explicit lists; it names the vendor when `cpu` does not."""
    gen = load_topology(write(tmp_path, '[generator]\nkind = "dgx_host"\ncpu_model = "EMR"\n'))
    assert (gen.meta["cpu_model"], gen.meta["cpu"]) == ("emr", "intel")
    explicit = NODES + '[[links]]\na = "a"\nb = "s"\nrate = 1\nlatency = 0\n'
    listed = load_topology(write(tmp_path, 'cpu_model = "zen"\n' + explicit))
    assert (listed.meta["cpu_model"], listed.meta["cpu"]) == ("zen", "amd")
    assert "cpu_model" not in load_topology(write(tmp_path, '[generator]\nkind = "dgx_host"\n')).meta


def test_toml_syntax_error_names_line(tmp_path: Path) -> None:
    path = write(tmp_path, 'name = "x"\n[generator\nkind = 1\n')
    with pytest.raises(InputError, match="invalid TOML") as err:
        load_topology(path)
    assert err.value.line == 2


def test_toml_disconnected_names_file(tmp_path: Path) -> None:
    path = write(
        tmp_path, NODES + '[[nodes]]\nname = "c"\nkind = "host"\n[[links]]\na = "a"\nb = "s"\nrate = 1\nlatency = 0\n'
    )
    with pytest.raises(InputError, match="has no link") as err:
        load_topology(path)
    assert err.value.file == str(path)


def test_unknown_shipped_name_lists_names() -> None:
    with pytest.raises(InputError, match="testbed16"):
        load_topology("no-such-topology")
