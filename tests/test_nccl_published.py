"""The NCCL model against published nccl-tests tables (tests/data/nccl_tests/, SOURCES.md): the claims of
docs/validation.md that hold, checked size by size, so a change that breaks them fails here."""

from __future__ import annotations

import pytest

from phantora.collectives import AlgoOptions, Collective, decompose
from phantora.collectives.nccl.published import Table, machine, tables
from phantora.collectives.nccl.settings import nccl_env
from phantora.netsim.flow import FlowSimulator

MiB = 1 << 20
BY_NAME = {t.name: t for t in tables()}


def busbw(table: Table, size: int) -> float:
    topo = machine(table)
    env = table.env
    coll = Collective(table.kind, tuple(range(table.gpus)), size, "fp32")
    dag = decompose(coll, topo, AlgoOptions(nccl_env=nccl_env(env)))
    sim = FlowSimulator(topo)
    sim.submit(dag.flows, at=0)
    return size / max(c.end_ns for c in sim.drain()) * coll.busbw_factor()


def test_the_data_and_its_sources_are_there():
    assert len(tables(include_degraded=True)) >= 14
    sources = (tables()[0].path.parent / "SOURCES.md").read_text()
    for t in tables(include_degraded=True):
        assert t.path.name in sources, t.path.name
        assert t.rows and all(size > 0 and bw >= 0 for size, bw in t.rows)


TWO_HOSTS = (
    "h100_16gpu_2node_ndr400_all_reduce_nccltests309_baremetal",
    "h100_16gpu_2node_ib400_all_reduce_nccltests309_gjaion_default",
)


@pytest.mark.parametrize("name", TWO_HOSTS)
def test_two_h100_hosts_within_10_percent_from_64_mib(name):
    """Two independent two-host H100 clusters (8 x 400G): NVLS-Tree with its pipeline fill, every size from 64 MiB
    within 10% of the published bus bandwidth."""
    table = BY_NAME[name]
    for size, published in table.rows:
        if size >= 64 * MiB:
            assert busbw(table, size) == pytest.approx(published, rel=0.10), size


@pytest.mark.parametrize(
    "name", ["h100_8gpu_1node_all_reduce_azure_ndh100v5_nvls", "h200_8gpu_1node_all_reduce_azure_ndh200v5_nvls"]
)
def test_one_h100_or_h200_host_with_nvls_within_10_percent_from_64_mib(name):
    table = BY_NAME[name]
    for size, published in table.rows:
        if size >= 64 * MiB:
            assert busbw(table, size) == pytest.approx(published, rel=0.10), size


def test_a100_ring_from_256_mib():
    """One A100 host (ring): within 10% from 256 MiB; below it the model is known fast (docs/validation.md)."""
    table = BY_NAME["a100_8gpu_1node_all_reduce_azure_nda100v4"]
    for size, published in table.rows:
        if size >= 256 * MiB:
            assert busbw(table, size) == pytest.approx(published, rel=0.10), size
