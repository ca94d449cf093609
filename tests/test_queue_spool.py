"""Queue sampling that any run can afford (issue 38): a keyed engine's run call that ends at a sampling instant
returns (it used to queue stop events for ever, growing until the OOM killer took the process), and the samples
stream to a spool file and into queues.csv without being held in memory."""

from __future__ import annotations

import shutil
import tracemalloc
from pathlib import Path
from types import SimpleNamespace

import pytest

from phantora.netsim.base import Flow
from phantora.netsim.engine_spec import EngineSpec
from phantora.netsim.factory import make_engine
from phantora.netsim.observe import QueueSample
from phantora.netsim.packet_config import KEYED_SCHEDULER, PacketConfig, apply_overrides
from phantora.netsim.queue_spool import QueueSpool, QueueSpoolFullError
from phantora.results.write import write_csv
from phantora.topology import load_topology

EVERY = 1000  # ns between samples


def rows(n: int, start: int = 0) -> list[tuple[int, int, int, int, int]]:
    return [(t * EVERY, t % 7, t % 3, 3, t * 17) for t in range(start, start + n)]


def test_spool_gives_back_every_sample_in_order(tmp_path: Path) -> None:
    given = rows(40_000)  # more than two read blocks
    spool = QueueSpool(str(tmp_path))
    spool.extend(iter(given[:30_000]))
    spool.extend(iter(given[30_000:]))
    want = [QueueSample(*r) for r in given]
    assert len(spool) == 40_000 and spool.disk_bytes() == 40_000 * 28  # 8 + 4 + 4 + 4 + 8 bytes a sample
    assert list(spool) == want and spool == want and spool != want[:-1]
    assert spool[0] == want[0] and spool[-1] == want[-1] and spool[29_999] == want[29_999]
    assert spool[30_000:30_003] == want[30_000:30_003] and spool[-2:] == want[-2:]
    with pytest.raises(IndexError):
        spool[40_000]


def test_spool_memory_does_not_grow_with_the_samples(tmp_path: Path) -> None:
    """100,000 samples (2.8 MB packed; a list of QueueSample objects would take over 7 MB: 72 bytes each and an
    8-byte pointer) go through the spool and back with a traced peak under 1.5 MB: one block read back (16,384 x
    28 bytes) and one chunk of 5,000 written at a time."""
    spool = QueueSpool(str(tmp_path))
    tracemalloc.start()
    try:
        for k in range(20):
            spool.extend(iter(rows(5_000, k * 5_000)))
        total = sum(q.bytes for q in spool)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert total == 17 * sum(range(100_000))
    assert len(spool) == 100_000 and peak < 1.5e6, peak


def test_a_spool_that_would_fill_its_disk_stops_in_one_line_naming_the_option(tmp_path: Path) -> None:
    spool = QueueSpool(str(tmp_path), reserve_bytes=shutil.disk_usage(tmp_path).free + 1)
    with pytest.raises(QueueSpoolFullError, match=r"--queue-sample-ns") as err:
        spool.extend(iter(rows(10)))
    assert "\n" not in str(err.value) and len(spool) == 0


@pytest.mark.parametrize(
    ("total", "free", "fits"),
    [
        (2_000_000_000, 200_000_281, True),  # a 2 GB disk keeps a tenth, 200 MB: 280 bytes fit above it
        (2_000_000_000, 200_000_279, False),
        (100_000_000_000, (1 << 30) + 281, True),  # a large disk keeps 1 GiB
        (100_000_000_000, (1 << 30) + 279, False),
    ],
)
def test_the_default_reserve_is_a_gib_or_a_tenth_of_a_smaller_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, total: int, free: int, fits: bool
) -> None:
    """Ten samples (280 bytes) are written only if they leave min(1 GiB, a tenth of the disk) free."""
    disk = SimpleNamespace(total=total, used=total - free, free=free)
    monkeypatch.setattr(shutil, "disk_usage", lambda _: disk)
    spool = QueueSpool(str(tmp_path))
    if fits:
        spool.extend(iter(rows(10)))
        assert len(spool) == 10
    else:
        with pytest.raises(QueueSpoolFullError):
            spool.extend(iter(rows(10)))


def test_csv_rows_stream_to_the_file(tmp_path: Path) -> None:
    """write_csv writes a generator's rows as it goes (CRLF rows, as the csv module's dialect), with a traced peak
    far under the 50,000-row file's 550 kB."""
    small = write_csv(tmp_path / "a.csv", ["a", "b"], iter([[1, 2], [3, "x"]]))
    assert small.read_bytes() == b"a,b\r\n1,2\r\n3,x\r\n"
    tracemalloc.start()
    try:
        path = write_csv(tmp_path / "big.csv", ["t", "b"], ([t, t % 10] for t in range(1_000_000, 1_050_000)))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert path.stat().st_size == len(b"t,b\r\n") + 50_000 * len(b"1000000,0\r\n")
    assert peak < 200e3, peak


def test_keyed_run_calls_that_end_at_sampling_instants_finish() -> None:
    """4-to-1 incast of 200 kB each on star8 (100G), keyed, sampled every 1 us. Stepping 1 us at a time ends every
    run call at a sampling instant (sampling starts with the flows at 0): each call returns, and the samples and
    completions are those of one run to the end. The bottleneck queue (the switch's port to the receiver) is
    sampled at consecutive instants from its first arrival until it empties (its last row 0 bytes), over the port's
    wire time of all 800 packets of 1,048 bytes at 100G (67.07 us) within 1 us."""
    topo = load_topology("star8")
    cfg = apply_overrides(PacketConfig(), [f"scheduler={KEYED_SCHEDULER}", f"queue_sample_ns={EVERY}", "cc=dcqcn"])
    flows = [Flow(i, i + 1, 0, 200_000) for i in range(4)]

    def run(step: int) -> tuple[list[QueueSample], list[tuple[int, int]]]:
        sim = make_engine(EngineSpec("ns3", cfg), topo)
        try:
            sim.submit(flows, 0)
            done = []
            if step:
                t = 0
                while len(done) < len(flows) and t < 10**6:
                    t += step
                    done += sim.advance(t)
            else:
                done = sim.drain()
            return list(sim.queue_samples()), sorted((c.flow_id, c.end_ns) for c in done)
        finally:
            sim.close()

    stepped, once = run(EVERY), run(0)
    assert len(stepped[1]) == len(flows) and stepped == once
    port = [q for q in stepped[0] if (q.node, q.port) == (8, 0)]  # star8: the switch is node 8, port 0 to node 0
    times = [q.time_ns for q in port]
    assert times == list(range(times[0], times[-1] + EVERY, EVERY))
    assert port[-1].bytes == 0 and all(q.bytes > 0 for q in port[:-1])
    wire_ns = len(flows) * 200 * (cfg.payload_bytes + cfg.header_bytes) * 8 / 100
    assert len(port) > 60 and abs((times[-1] - times[0]) - wire_ns) <= EVERY
    assert all(q.time_ns % EVERY == 0 for q in stepped[0])
