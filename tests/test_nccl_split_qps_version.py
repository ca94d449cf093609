"""NCCL_IB_SPLIT_DATA_ON_QPS as the NCCL that runs reads it (net_ib.cc `ncclIbMultiSend`): before v2.18.1-1 there is
no such variable and every message is split over all of its connection's queue pairs; v2.18.1-1 to 2.19 read it
with a default of 1; from v2.20.3-1 the default is 0 (each message whole on the next queue pair in turn)."""

from __future__ import annotations

import dataclasses
import math

import pytest

from phantora.collectives.decompose import decompose
from phantora.collectives.nccl.settings import settings_of
from phantora.collectives.spec import AlgoOptions, Collective
from phantora.netsim.base import Flow
from phantora.topology import rail_optimized

MB = 1_000_000
QPS = 4


@pytest.mark.parametrize(
    ("version", "variable", "split"),
    [
        ("2.17", None, True),  # no variable: always split
        ("2.17.1", "0", True),  # set, but that NCCL does not read it
        ("2.18.1", "0", False),  # v2.18.1-1's net_ib.cc reads it (NCCL_PARAM IbSplitDataOnQps, default 1)
        ("2.18.1", None, True),
        ("2.18.3", None, True),  # the variable, default 1
        ("2.18", "0", False),  # 2.18 named alone: its newest patch (2.18.6), which reads it
        ("2.19.4", None, True),
        ("2.20.3", None, False),  # default 0 from here
        ("2.26.2", "1", True),
        (None, None, False),  # the model's NCCL (2.30)
    ],
)
def test_the_split_follows_the_nccl_that_runs(version: str | None, variable: str | None, split: bool) -> None:
    env = {"NCCL_IB_QPS_PER_CONNECTION": str(QPS)}
    if version is not None:
        env["PHANTORA_NCCL_VERSION"] = version
    if variable is not None:
        env["NCCL_IB_SPLIT_DATA_ON_QPS"] = variable
    assert settings_of(tuple(env.items())).split_data_on_qps is split


def _net_flows(version: str, nbytes: int, *extra: tuple[str, str]) -> tuple[list[Flow], dict[int, int | None]]:
    """A chunked Ring/Simple all-reduce over two 8-H100 hosts with 4 queue pairs a connection under NCCL
    `version` (and `extra` variables), and each endpoint's host."""
    topo = rail_optimized(hosts=2, gpu="h100")
    env = (("NCCL_IB_QPS_PER_CONNECTION", str(QPS)), ("PHANTORA_NCCL_VERSION", version), *extra)
    opts = AlgoOptions(algorithm="ring", protocol="Simple", nccl_env=env)
    opts = dataclasses.replace(opts, granularity="chunked", chunk_bytes=MB)
    flows = decompose(Collective("all_reduce", tuple(range(16)), nbytes, "bf16"), topo, opts).flows
    return flows, {n: topo.nodes[n].host for n in topo.endpoints}


def test_nccl_2_19_splits_every_message_over_the_queue_pairs_in_128_byte_parts() -> None:
    """2.19 (default 1): each network message of s bytes goes as parts of ceil(ceil(s / 4) / 128) x 128 bytes, one
    a queue pair; the same NCCL with the variable at 0 posts the same messages whole, one queue pair each, as 2.20
    does by default."""
    nbytes = 48 * MB + 7
    old, host = _net_flows("2.19.4", nbytes)
    off, _ = _net_flows("2.19.4", nbytes, ("NCCL_IB_SPLIT_DATA_ON_QPS", "0"))
    new, _ = _net_flows("2.20.3", nbytes)
    assert not any("/qp" in f.tag for f in new) and any("/qp" in f.tag for f in old)
    whole = [f for f in off if host[f.src] != host[f.dst] and f.size > 0]
    assert whole and not any("/qp" in f.tag for f in off)
    parts = [f for f in old if "/qp" in f.tag]
    checked = 0
    for f in whole:
        mine = [p for p in parts if (p.tag.rsplit("/qp", 1)[0], p.src, p.dst) == (f.tag, f.src, f.dst)]
        if f.size <= 128:
            continue
        want = math.ceil(math.ceil(f.size / QPS) / 128) * 128
        assert sum(p.size for p in mine) == f.size
        assert all(p.size == want for p in mine[:-1]) and 0 < mine[-1].size <= want
        assert len(mine) == math.ceil(f.size / want)
        checked += 1
    assert checked > 0
