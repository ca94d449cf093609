"""`phantora nccl-tests --out DIR` writes the run's flows.csv and links.csv, by the writer `replay` and `run` use
(`results.write.write_network_files`), checked against a ring all-reduce's closed forms on 2 hosts of 4 GPUs
(n = 8 ranks, m = 2 hosts, S bytes): each GPU sends and receives 2(n-1)/n x S on its own links (NVLink or its
NIC), the hops between hosts carry m x 2(n-1)/n x S in all (a channel's ring enters and leaves each host once),
and every flow carries what the protocol puts on the wire: Simple the data, LL 8-byte lines of 4 data bytes and a
4-byte flag (twice the data)."""

from __future__ import annotations

import csv
import json
from collections import Counter
from pathlib import Path

import pytest

from phantora.cli import main
from phantora.netsim.packet_config import PacketConfig
from phantora.results import schema as S

HOSTS, PER_HOST = 2, 4
N = HOSTS * PER_HOST
MiB = 1 << 20
LL_WIRE = 2  # LL: a 16-byte line (two 8-byte halves) carries 8 bytes of data


def _topology(tmp_path: Path) -> str:
    path = tmp_path / "r2.toml"
    path.write_text(
        '[generator]\nkind = "rail_optimized"\nhosts = 2\ngpus_per_host = 4\nspines = 4\n'
        'nic_rate = "400Gbps"\nuplink_rate = "400Gbps"\n'
    )
    return str(path)


def _run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, proto: str, size: int, *extra: str) -> Path:
    """One measured ring all-reduce call (-n 1 -w 0) of `size` bytes under NCCL_PROTO=`proto`; its --out DIR."""
    monkeypatch.setenv("NCCL_ALGO", "Ring")
    monkeypatch.setenv("NCCL_PROTO", proto)
    out = tmp_path / f"out-{proto}-{'-'.join(extra) or 'flow'}"
    argv = ["nccl-tests", "all_reduce_perf", "-b", str(size), "-e", str(size), "-n", "1", "-w", "0"]
    assert main([*argv, "--topology", _topology(tmp_path), *extra, "--out", str(out)]) == 0
    return out


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open() as f:
        return list(csv.DictReader(f))


def _choice(out: Path) -> dict[str, object]:
    (size,) = json.loads((out / S.RESULTS_JSON).read_text())["sizes"]
    return size["choice"]


def _per_gpu(links: list[dict[str, str]], end: str) -> Counter[str]:
    """Bytes each GPU sends (`end` "from") or receives ("to") over all its links."""
    out: Counter[str] = Counter()
    for r in links:
        if r[end].startswith("gpu"):
            out[r[end]] += int(r["bytes"])
    return out


def _between_hosts(links: list[dict[str, str]]) -> int:
    """Bytes into the fabric from the GPUs' NICs (a GPU's link to a switch that is not its NVSwitch)."""
    return sum(int(r["bytes"]) for r in links if r["from"].startswith("gpu") and not r["to"].startswith("nvsw"))


@pytest.mark.parametrize(("proto", "size", "wire"), [("Simple", 8 * MiB, 1), ("LL", MiB, LL_WIRE)])
def test_the_links_and_flows_of_a_ring_all_reduce_are_its_closed_form(
    proto: str, size: int, wire: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = _run(tmp_path, monkeypatch, proto, size)
    choice = _choice(out)
    assert (choice["algorithm"], choice["protocol"]) == ("Ring", proto)
    per_gpu = wire * 2 * (N - 1) * size // N
    links = _rows(out / S.LINKS_CSV)
    assert _per_gpu(links, "from") == {f"gpu{g}": per_gpu for g in range(N)}
    assert _per_gpu(links, "to") == {f"gpu{g}": per_gpu for g in range(N)}
    assert _between_hosts(links) == HOSTS * per_gpu
    flows = _rows(out / S.FLOWS_CSV)
    assert sum(int(f["size_bytes"]) for f in flows) == N * per_gpu
    channels = int(str(choice["channels"]))
    assert len(flows) == channels * N  # coarse: one flow a ring hop a channel
    assert {int(f["size_bytes"]) for f in flows} == {per_gpu // channels}
    assert len({f["flow_id"] for f in flows}) == len(flows)


def test_every_call_of_the_run_is_in_the_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """-w 1 -n 2 over two sizes: 3 calls of each (a warm-up and two measured), so 3 x each call's bytes."""
    monkeypatch.setenv("NCCL_ALGO", "Ring")
    monkeypatch.setenv("NCCL_PROTO", "Simple")
    out = tmp_path / "out"
    argv = ["nccl-tests", "all_reduce_perf", "-b", "4M", "-e", "8M", "-f", "2", "-n", "2", "-w", "1"]
    assert main([*argv, "--topology", _topology(tmp_path), "--out", str(out)]) == 0
    flows = _rows(out / S.FLOWS_CSV)
    total = 3 * 2 * (N - 1) * (4 * MiB + 8 * MiB)
    assert sum(int(f["size_bytes"]) for f in flows) == total
    assert sum(int(r["bytes"]) for r in _rows(out / S.LINKS_CSV) if r["from"].startswith("gpu")) == total
    assert {f["tag"].split("/")[2] for f in flows} == {"w0", "i0", "i1"}


def test_without_out_nothing_is_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    argv = ["nccl-tests", "all_reduce_perf", "-b", "1M", "-e", "1M", "-n", "1", "-w", "0"]
    monkeypatch.chdir(tmp_path)
    assert main([*argv, "--topology", _topology(tmp_path)]) == 0
    assert "nothing saved" in capsys.readouterr().err
    assert not list(tmp_path.glob("**/*.csv"))


@pytest.mark.ns3
def test_packet_mode_writes_the_same_flows_and_the_closed_form_payload(
    ns3_lib, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through ns-3: flows.csv holds the same flows as the flow network's run (ids, ends, sizes), each GPU's
    payload is 2(n-1)/n x S, and its links carry that payload in packets of at most `payload_bytes`, each with a
    `header_bytes` header, plus an ACK of `header_bytes` for each packet it receives (the engine's defaults; its
    ring sends as many as it receives); the packet engine's traces are written beside them."""
    size = 8 * MiB
    flow = _rows(_run(tmp_path, monkeypatch, "Simple", size) / S.FLOWS_CSV)
    out = _run(tmp_path, monkeypatch, "Simple", size, "--network", "ns3")
    packet = _rows(out / S.FLOWS_CSV)
    keys = ("flow_id", "src", "dst", "size_bytes")
    assert sorted(tuple(r[k] for k in keys) for r in packet) == sorted(tuple(r[k] for k in keys) for r in flow)
    per_gpu = 2 * (N - 1) * size // N
    sent: Counter[str] = Counter()
    packets: Counter[str] = Counter()
    for r in packet:
        sent[r["src"]] += int(r["size_bytes"])
        packets[r["src"]] += -(-int(r["size_bytes"]) // PacketConfig.payload_bytes)
    assert sent == {f"gpu{g}": per_gpu for g in range(N)}
    header = PacketConfig.header_bytes
    wire = {gpu: per_gpu + 2 * header * n for gpu, n in packets.items()}  # data headers, and as many ACKs back
    assert _per_gpu(_rows(out / S.LINKS_CSV), "from") == wire
    assert (out / S.PFC_CSV).exists() and (out / S.ENGINE_JSON).exists()


def test_compare_reads_the_network_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """`phantora compare` of two nccl-tests directories gives the flows' rows as for a replay; the class bytes are
    the ring's 2 (n-1) x S (Simple: the data), in KB."""
    a = _run(tmp_path, monkeypatch, "Simple", 8 * MiB)
    b = _run(tmp_path, monkeypatch, "Simple", 8 * MiB, "--set", "lb=ecmp")
    capsys.readouterr()
    assert main(["compare", str(a), str(b)]) == 0
    rows = {line.split("  ")[0]: line.split() for line in capsys.readouterr().out.splitlines()}
    assert "FCT p50" in rows and "link utilisation max" in rows
    kb = f"{2 * (N - 1) * 8 * MiB / 1000:.1f}"
    (classes,) = [row for name, row in rows.items() if name.startswith("flow bytes, class")]  # one: NCCL's
    assert classes[-3:-1] == [kb, kb]
