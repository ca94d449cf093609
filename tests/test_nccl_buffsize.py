"""NCCL_BUFFSIZE, NCCL_LL_BUFFSIZE and NCCL_LL128_BUFFSIZE as NCCL takes them (init.cc `computeBuffSizes`, v2.26.5-1
to v2.30.7-1): any value but -2 (ncclParam's "unset") is the protocol's buffer, unchecked; a step is the buffer over
NCCL_STEPS = 8 (enqueue.cc `calcCollChunking`: a ring's Simple chunk is 4 steps for all-reduce / all-gather /
reduce-scatter, 1 for broadcast and reduce; LL's data is half a step, LL128's 15/16; then whole grains of 512,
16 and 1,920 bytes). A buffer that leaves the chosen collective's chunk at 0 bytes makes NCCL divide by it
(`DIVUP(nBytes, loopSize)`), so phantora refuses it in one line naming the variable and its value; a small one
that leaves a chunk costs the proxy a turn a slice (proxy.py). NVLS-Tree's chunk is not the buffer's, but its
tree's network connections send it as one Simple step: a step smaller than it is refused too."""

from __future__ import annotations

import pytest

from phantora.collectives import AlgoOptions, Collective, decompose
from phantora.collectives.nccl import platform_of, proxy, tuning
from phantora.collectives.nccl.chunking import step_bytes
from phantora.collectives.nccl.settings import nccl_env, settings_from_env
from phantora.errors import InputError
from phantora.topology import load_topology

MiB = 1 << 20
TOPO = load_topology("testbed16")  # 2 hosts of 8 H100, a NIC a GPU: 16 channels, 4 network connections a proxy
P = platform_of(TOPO, tuple(range(16)))


def _select(kind: str, env: dict[str, str], nbytes: int) -> tuning.Choice | None:
    tuning.select.cache_clear()
    return tuning.select(kind, P, settings_from_env(env), nbytes)


def test_a_buffer_of_one_byte_is_refused_naming_it() -> None:
    """NCCL_BUFFSIZE=1: a 0-byte step, so the Simple ring's chunk is 0 bytes: refused, the one line naming
    NCCL_BUFFSIZE=1. A size that NCCL's tuner runs under LL (8 B) does not touch the Simple buffer and runs."""
    env = {"NCCL_BUFFSIZE": "1"}
    with pytest.raises(InputError) as e:
        _select("broadcast", env, 16 * MiB)
    assert e.value.field == "NCCL_BUFFSIZE" and "NCCL_BUFFSIZE=1:" in str(e.value) and "\n" not in str(e.value)
    small = _select("broadcast", env, 8)
    assert small is not None and small.protocol == "LL"


def test_the_chunk_not_the_step_decides() -> None:
    """NCCL_BUFFSIZE=2048: a 256-byte step. A Simple ring all-reduce's chunk is 4 steps, 1,024 bytes (two grains):
    NCCL runs it; a broadcast's is one step, 256 bytes, no whole 512-byte grain: refused."""
    env = {"NCCL_BUFFSIZE": "2048", "NCCL_ALGO": "Ring", "NCCL_PROTO": "Simple"}
    assert step_bytes("Simple", settings_from_env(env)) == 256
    assert _select("all_reduce", env, 16 * MiB) is not None
    with pytest.raises(InputError, match="NCCL_BUFFSIZE=2048"):
        _select("broadcast", env, 16 * MiB)


def test_ll_and_ll128_buffers_are_read() -> None:
    """NCCL_LL_BUFFSIZE=100: a 12-byte step, 6 data bytes, no 16-byte line: refused. NCCL_LL128_BUFFSIZE=8192: a
    1,024-byte step, 960 data bytes, under LL128's 1,920-byte grain: refused. Half NCCL's LL buffer (256 KiB) halves
    a ring LL all-reduce's chunk, so 16 MiB on 16 channels (1 MiB each, 16 KiB chunks a rank) takes twice the
    steps: 2 x 15 x 4 = 120 a connection, against 60."""
    with pytest.raises(InputError, match="NCCL_LL_BUFFSIZE=100"):
        _select("all_reduce", {"NCCL_LL_BUFFSIZE": "100", "NCCL_PROTO": "LL"}, 1 * MiB)
    with pytest.raises(InputError, match="NCCL_LL128_BUFFSIZE=8192"):
        _select("all_reduce", {"NCCL_LL128_BUFFSIZE": "8192", "NCCL_PROTO": "LL128"}, 1 * MiB)
    half = settings_from_env({"NCCL_LL_BUFFSIZE": str(256 * 1024)})
    assert step_bytes("LL", half) == 32 * 1024 and step_bytes("LL", settings_from_env({})) == 64 * 1024
    assert proxy.steps_per_connection("all_reduce", "ring", "LL", P, settings_from_env({}), 16 * MiB, 16) == 60
    assert proxy.steps_per_connection("all_reduce", "ring", "LL", P, half, 16 * MiB, 16) == 120


def test_minus_two_is_nccls_default_and_other_bad_values_are_refused() -> None:
    unset = settings_from_env({"NCCL_BUFFSIZE": "-2", "NCCL_LL_BUFFSIZE": "-2", "NCCL_LL128_BUFFSIZE": "-2"})
    assert (unset.buffsize, unset.ll_buffsize, unset.ll128_buffsize) == (0, 0, 0)
    assert all(step_bytes(p, unset) == step_bytes(p, settings_from_env({})) for p in ("LL", "LL128", "Simple"))
    for bad in ("-5", "0", "3000000000", "4M"):
        with pytest.raises(InputError) as e:
            settings_from_env({"NCCL_BUFFSIZE": bad})
        assert e.value.field == "NCCL_BUFFSIZE" and bad in str(e.value)


def test_a_p2p_chunk_of_zero_is_refused() -> None:
    """p2pChunkSize = min(NCCL_P2P_NET_CHUNKSIZE, buffSize / NCCL_STEPS) (init.cc): 0 with a 7-byte buffer."""
    opts = AlgoOptions(nccl_env=nccl_env({"NCCL_BUFFSIZE": "7"}))
    with pytest.raises(InputError, match="NCCL_BUFFSIZE=7"):
        decompose(Collective("send_recv", (0, 8), MiB, "fp32"), TOPO, opts)


def test_a_small_buffer_costs_the_proxy_its_extra_slices() -> None:
    """NCCL_BUFFSIZE=64 KiB: 8 KiB steps, 32 KiB chunks. A forced Simple ring all-reduce of 64 MiB on 16 channels
    (4 MiB each) runs 4 MiB / (16 x 32 KiB) = 8 loops of 2 x 15 steps, 4 steps a chunk and 2 a slice: 480 slices a
    connection, against 60 with NCCL's 4 MiB buffer (2 MiB chunks, one loop), whose turns NCCL's fitted Simple
    latency holds; the 420 more are 4 connections x 420 x 0.6 µs = 1,008 µs of turns, which the transfer
    (64 MiB at about 100 GB/s) does not hide. NCCL's default buffer: no turns under Simple."""
    env = {"NCCL_ALGO": "Ring", "NCCL_PROTO": "Simple"}
    small = _select("all_reduce", {**env, "NCCL_BUFFSIZE": str(64 * 1024)}, 64 * MiB)
    default = _select("all_reduce", env, 64 * MiB)
    assert small is not None and default is not None and small.channels == default.channels == 16
    assert small.proxy_floor_us == pytest.approx(4 * 420 * proxy.PROXY_STEP_US)
    assert small.proxy_us == pytest.approx(small.proxy_floor_us - 64 * MiB / (1000 * small.algbw))
    assert default.proxy_floor_us == 0.0 and default.proxy_us == 0.0


def test_nvls_tree_refuses_a_step_smaller_than_its_chunk() -> None:
    """NVLS-Tree's chunk is the NVLS chunk down calcCollChunking's ladder, not the buffer; but its tree's network
    connections send each chunk as one step of the Simple buffer, into one slot, and the receiving proxy posts one
    step (net.cc, all_reduce.h): NCCL's IB transport cuts a larger chunk to the step, its socket transport fails.
    On 2 hosts (testbed16: 16 channels x 8 heads a channel, the chunk from NCCL_NVLS_CHUNKSIZE's 128 KiB) the ladder
    sees each channel's part over its 8 heads: 16 MiB is 1 MiB a channel, under 4 x 8 x 128 KiB, so 64 KiB; 1 GiB is
    64 MiB a channel, over 32 x 8 x 128 KiB, so 128 KiB. NCCL_BUFFSIZE=512 KiB (64 KiB steps) runs the 16 MiB call
    in the default's time (NVLS-Tree's steps are its chunks) and refuses the 1 GiB one; 1 MiB (128 KiB steps) runs
    both; NCCL_BUFFSIZE=1 refuses both, in one line naming it. On 4 hosts the chunk is at most 64 KiB
    (NCCL_NVLSTREE_MAX_CHUNKSIZE's default from 4 nodes), so 512 KiB runs 1 GiB there."""
    nvls = {"NCCL_ALGO": "NVLSTree"}
    for size in (16 * MiB, 1 << 30):
        default = _select("all_reduce", nvls, size)
        assert default is not None and default.algorithm == "nvls_tree"
        big = _select("all_reduce", {**nvls, "NCCL_BUFFSIZE": str(MiB)}, size)
        assert big is not None and big.time_us == default.time_us
        with pytest.raises(InputError) as e:
            _select("all_reduce", {**nvls, "NCCL_BUFFSIZE": "1"}, size)
        assert e.value.field == "NCCL_BUFFSIZE" and "NCCL_BUFFSIZE=1:" in str(e.value) and "\n" not in str(e.value)
    half = {**nvls, "NCCL_BUFFSIZE": str(MiB // 2)}
    fits = _select("all_reduce", half, 16 * MiB)
    default = _select("all_reduce", nvls, 16 * MiB)
    assert fits is not None and default is not None and fits.time_us == default.time_us
    with pytest.raises(InputError, match=r"step of 65536 bytes .* chunk of 131072 bytes.* at least 8 x 131072"):
        _select("all_reduce", half, 1 << 30)
    from phantora.topology import leaf_spine

    four = platform_of(leaf_spine(4, 8, 4, gpus_per_host=8, uplink_rate="800Gbps", gpu="h100"), tuple(range(32)))
    tuning.select.cache_clear()
    wide = tuning.select("all_reduce", four, settings_from_env(half), 1 << 30)
    assert wide is not None and wide.algorithm == "nvls_tree"


def test_the_cli_refuses_nvls_tree_with_a_one_byte_buffer() -> None:
    """`NCCL_BUFFSIZE=1 phantora nccl-tests all_reduce_perf -b 16M -e 16M --topology testbed16` (NVLS-Tree, NCCL's
    choice at 16 MiB there): rc 2 and one line naming the variable, not a table."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    exe = Path(sys.executable).parent / "phantora"
    cmd = [str(exe), "nccl-tests", "all_reduce_perf", "-b", "16M", "-e", "16M", "--topology", "testbed16"]
    out = subprocess.run(cmd, env={**os.environ, "NCCL_BUFFSIZE": "1"}, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stdout + out.stderr
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "NCCL_BUFFSIZE=1" in lines[0] and "NVLS-Tree" in lines[0], out.stderr
