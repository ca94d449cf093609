"""`phantora nccl-tests` on pcie_host variants, as the 2026-11-30 audit ran it (every program, 1 MiB to 1 GiB): it
ends without a traceback, no bus bandwidth exceeds what NCCL's view of the links allows, busbw never falls as the size
grows under one protocol, and NCCL_SHM_DISABLE=1 where a pair needs SHM is one line naming the variable.

The links' bounds (NVIDIA/nccl v2.30.7-1 figures): every program's busbw is what a GPU sends per second, so at most
its x16 (width x speed / 80: 24 GB/s at Gen4); across two sockets a ring, chain or send/recv ring crosses the CPU
link once each way (at most its figure, topo.h: SKL_QPI_BW 10, ERP_QPI_BW 40, AMD_BW 16), an all-to-all of 8 puts
4 x 4 blocks of 1/8 on each direction (busbw at most 4 x CPU x 7 / 64); with P2P off each SHM hop climbs its
switch's uplink (shm.cc, addInterStep's path): 8 hops up one uplink on one socket (a chain 7), 4 on each of two.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from phantora.cli import main
from phantora.results import schema as S

N = 8
X16 = 16 * 120 / 80.0
QPI = {"icx": 10.0, "emr": 40.0, "zen": 16.0}
PROGRAMS = ("all_reduce", "all_gather", "reduce_scatter", "alltoall", "broadcast", "reduce", "sendrecv")
VARIANTS = [(1, True, "icx"), (1, False, "zen"), (2, True, "icx"), (2, False, "emr")]


def _bound(sockets: int, switch: bool, model: str, p2p_off: bool, prog: str) -> float:
    bound = X16
    if switch and p2p_off:
        hops = N if sockets == 1 else N // 2
        bound = X16 / (hops - 1 if sockets == 1 and prog in ("broadcast", "reduce") else hops)
    if sockets == 2:
        bound = min(bound, 4 * QPI[model] * (N - 1) / N**2 if prog == "alltoall" else QPI[model])
    return bound


def _toml(path: Path, sockets: int, switch: bool, model: str) -> Path:
    cpu = "amd" if model == "zen" else "intel"
    path.write_text(
        f'name = "audit"\ngpu = "a100-pcie"\ncpu = "{cpu}"\n[generator]\nkind = "pcie_host"\ngpus_per_host = {N}\n'
        f'sockets = {sockets}\npcie_switch = {"true" if switch else "false"}\ncpu_model = "{model}"\n'
    )
    return path


def _rows(tmp_path: Path, topo: Path, prog: str) -> list[dict]:
    out = tmp_path / prog
    argv = ["nccl-tests", f"{prog}_perf", "-b", "1M", "-e", "1G", "-f", "32", "-n", "1", "-w", "0"]
    assert main([*argv, "--topology", str(topo), "--out", str(out)]) == 0
    return json.loads((out / S.RESULTS_JSON).read_text())["sizes"]


@pytest.mark.parametrize("p2p_off", [False, True])
@pytest.mark.parametrize(("sockets", "switch", "model"), VARIANTS)
def test_every_program_stays_within_the_links_and_grows_with_the_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sockets: int, switch: bool, model: str, p2p_off: bool
) -> None:
    monkeypatch.setenv("NCCL_P2P_DISABLE", "1" if p2p_off else "0")
    topo = _toml(tmp_path / "host.toml", sockets, switch, model)
    for prog in PROGRAMS:
        rows = _rows(tmp_path, topo, prog)
        bound = _bound(sockets, switch, model, p2p_off, prog)
        over = [r["busbw"] for r in rows if r["busbw"] > bound * (1 + 1e-6)]
        assert not over, (prog, bound, over)
        for a, b in zip(rows, rows[1:], strict=False):
            if a["choice"]["protocol"] == b["choice"]["protocol"]:
                assert b["busbw"] >= a["busbw"], (prog, a["bytes"], b["bytes"])


@pytest.mark.parametrize(("sockets", "switch", "model"), [(1, False, "zen"), (2, True, "icx")])
def test_shm_off_where_a_pair_needs_it_is_one_line_naming_the_variable(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    sockets: int,
    switch: bool,
    model: str,
) -> None:
    """Root ports (PHB) or two sockets (SYS): some pairs have no P2P at NCCL's default level, so they need SHM."""
    monkeypatch.setenv("NCCL_SHM_DISABLE", "1")
    topo = _toml(tmp_path / "host.toml", sockets, switch, model)
    assert main(["nccl-tests", "all_reduce_perf", "-b", "1M", "-e", "1M", "--topology", str(topo)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "NCCL_SHM_DISABLE" in err[0] and "Traceback" not in err[0]
