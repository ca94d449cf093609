"""The shipped one-host topologies `dgx8`, `dgx8_a100` and `dgx8_b200`: one DGX-like server of 8 GPUs on an NVSwitch,
at the GPU's published NVLink rate, and `dgx8` is the host `phantora nccl-tests` runs on without --topology."""

from __future__ import annotations

import pytest

from phantora.cli import main
from phantora.topology import load_topology

# NVLink per GPU, one direction, as NVIDIA's datasheets give it (total bidirectional / 2): A100 600 GB/s,
# H100 900 GB/s, B200 1.8 TB/s.
DATASHEET_GBYTES_A_DIRECTION = {"a100": 300, "h100": 450, "b200": 900}


@pytest.mark.parametrize(("name", "gpu"), [("dgx8", "h100"), ("dgx8_a100", "a100"), ("dgx8_b200", "b200")])
def test_one_host_of_eight_gpus_at_the_datasheet_nvlink_rate(name: str, gpu: str) -> None:
    topo = load_topology(name)
    assert topo.gpu_model == gpu and topo.num_ranks == 8
    switches = [n for n in topo.nodes if n.kind == "nvswitch"]
    assert len(switches) == 1 and not [n for n in topo.nodes if n.kind == "switch"]  # no fabric, no NICs
    gpus = {topo.node_of_rank(r) for r in range(8)}
    rates = {link.bandwidth_bps for link in topo.links if {link.a, link.b} & gpus}
    assert rates == {DATASHEET_GBYTES_A_DIRECTION[gpu] * 8 * 10**9}


def test_dgx8_is_the_host_nccl_tests_runs_on_by_default(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["nccl-tests", "all_reduce_perf", "-b", "1M", "-e", "1M", "-n", "1", "-w", "0"]
    assert main(args) == 0
    default = [line for line in capsys.readouterr().out.splitlines() if line.strip().startswith("1048576")]
    assert main([*args, "--topology", "dgx8"]) == 0
    shipped = [line for line in capsys.readouterr().out.splitlines() if line.strip().startswith("1048576")]
    assert len(default) == 1 and shipped == default
