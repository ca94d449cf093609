"""The NCCL whose tuner picks (PHANTORA_NCCL_VERSION, tuning.rated): NCCL 2.22-2.27 rate NVLS-Tree by their own
constants (first_use.py), so on 4 and 8 H100 hosts they run the ring from sizes where NCCL 2.30 still runs
NVLS-Tree. The time of what is picked stays the model's.

Closed forms (tuning.cc, v2.26.5-1 and v2.30.7-1; 8 GPUs and a 400G NIC each per host, NCCL_NET_OVERHEAD's
default of 1 µs): the ring's graph is 8 channels x 48 GB/s, so its algbw is 384 x n / (2 (n - 1)), and its latency
8.4 + (2 (n - 1) - 2 (h - 1)) x 3.4 + 2 (h - 1) x 14 µs on n ranks and h hosts, x 1.4 (its plateau); NVLS-Tree in
2.22-2.27 is 160 GB/s with 25 + 2 log2(h) x 14 µs."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from phantora.collectives.nccl import tuning
from phantora.collectives.nccl.settings import nccl_release_of, settings_from_env
from phantora.errors import InputError
from tests.nccl_tables import BY_NAME, table_platform

MiB = 1 << 20
GJ4 = "h100_32gpu_4node_ib400_all_reduce_nccltests309_gjaion_default"
VM4 = "h100_32gpu_4node_ndr400_all_reduce_nccltests309_vm"
GJ8 = "h100_64gpu_8node_ib400_all_reduce_nccltests309_gjaion_default"
GJ8_CTAS = "h100_64gpu_8node_ib400_all_reduce_nccltests309_gjaion_minctas24"


def _ring_us(hosts: int, nbytes: int) -> float:
    n = 8 * hosts
    lat = 1.4 * (8.4 + (2 * (n - 1) - 2 * (hosts - 1)) * 3.4 + 2 * (hosts - 1) * 14.0)
    return lat + nbytes / (1000.0 * 384.0 * n / (2 * (n - 1)))


def _nvls_tree_2_2x_us(hosts: int, nbytes: int) -> float:
    return 25.0 + 2 * math.log2(hosts) * 14.0 + nbytes / (1000.0 * 160.0)


def test_the_version_is_parsed_as_nccl_prints_it():
    assert settings_from_env({}).nccl_version == (2, 30)
    assert settings_from_env({"PHANTORA_NCCL_VERSION": "2.26.2"}).nccl_version == (2, 26)
    assert settings_from_env({"PHANTORA_NCCL_VERSION": "v2.22.3-1"}).nccl_version == (2, 22)
    with pytest.raises(InputError, match="PHANTORA_NCCL_VERSION"):
        settings_from_env({"PHANTORA_NCCL_VERSION": "latest"})
    # the whole release, as torch.cuda.nccl.version() gives it: (major, minor, patch), patch 0 where none is named
    assert nccl_release_of({"PHANTORA_NCCL_VERSION": "v2.22.3-1"}) == (2, 22, 3)
    assert nccl_release_of({"PHANTORA_NCCL_VERSION": "2.26"}) == (2, 26, 0)
    assert nccl_release_of({}) == (2, 30, 0)


def test_tables_carry_their_nccl():
    """Stated (the VMs: 2.26.2, patch and all) or, where not, taken from the first-use points only 2.22-2.27 make
    (gj-aion: the minor only)."""
    assert BY_NAME[VM4].env["PHANTORA_NCCL_VERSION"] == "2.26.2"
    assert BY_NAME[GJ8_CTAS].env["PHANTORA_NCCL_VERSION"] == "2.26"


@pytest.mark.parametrize(
    ("name", "hosts", "below", "at"), [(VM4, 4, 128 * MiB, 256 * MiB), (GJ8, 8, 512 * MiB, 1024 * MiB)]
)
def test_nccl_2_26_turns_from_nvls_tree_to_the_ring_where_the_closed_forms_cross(name, hosts, below, at):
    """4 hosts: ring 395.9 + S / 198.19 µs against 81 + S / 160 (they meet near 250 MB); 8 hosts: 819.3 + S /
    195.05 against 109 + S / 160 (near 632 MB). NCCL 2.30 (the model's default) keeps NVLS-Tree at both sizes."""
    assert _nvls_tree_2_2x_us(hosts, below) < _ring_us(hosts, below)
    assert _nvls_tree_2_2x_us(hosts, at) > _ring_us(hosts, at)
    p, st = table_platform(name), settings_from_env(BY_NAME[name].env)
    assert st.nccl_version == (2, 26)
    new = replace(st, nccl_version=(2, 30))
    for size, algo in ((below, "nvls_tree"), (at, "ring")):
        choice, model = tuning.select("all_reduce", p, st, size), tuning.select("all_reduce", p, new, size)
        assert choice is not None and model is not None
        assert (choice.algorithm, choice.protocol) == (algo, "Simple")
        assert model.algorithm == "nvls_tree"
        if algo == "nvls_tree":  # the same algorithm: the same time, whichever tuner picked it
            assert choice == model


@pytest.mark.parametrize(("name", "nvls_tree", "ring"), [(GJ4, 128 * MiB, 256 * MiB), (GJ8, 512 * MiB, 1024 * MiB)])
def test_published_busbw_falls_where_nccl_2_26_turns_to_the_ring(name, nvls_tree, ring):
    """gj-aion's default runs are slower at the ring's first size than at NVLS-Tree's last (246.41 -> 234.35 GB/s
    on 4 hosts, 300.51 -> 286.81 on 8): the seam the older tuner puts there."""
    rows = dict(BY_NAME[name].rows)
    assert rows[ring] < rows[nvls_tree]
