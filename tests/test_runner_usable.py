"""Which engine netsim runs a packet config on: the runner, unless the runner would not run the library named.

The runner (ns3-scratch/Makefile) is linked with rpath $ORIGIN against libphantora-ns3.so, so it runs the library of
that name in its own folder, whatever $PHANTORA_NS3_LIB says. A library of one's own therefore runs in the runner
only when it is named libphantora-ns3.so and its build's runner is beside it; the runner's interface version is
checked before the run (ns3_abi.check_runner), as the library's is in-process.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from phantora.netsim.packet_config import PacketConfig
from phantora.netsim.runner_engine import ENGINE_ENV, own_library_runs, runner_usable


def _build(folder: Path, lib: str, runner: bool) -> Path:
    """A folder holding a library file `lib`, and the runner beside it if `runner`."""
    folder.mkdir()
    (folder / lib).write_bytes(b"")
    if runner:
        (folder / "phantora-ns3-runner").write_bytes(b"")
    return folder / lib


@pytest.mark.parametrize(
    ("lib", "runner", "usable"),
    [
        ("libphantora-ns3.so", True, True),  # a build of one's own: its runner loads it
        ("libphantora-ns3.so", False, False),  # no runner beside it: in-process
        ("mylib.so", True, False),  # the runner would load libphantora-ns3.so, not this
    ],
)
def test_an_own_library_runs_in_its_runner_only_if_the_runner_loads_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, lib: str, runner: bool, usable: bool
) -> None:
    monkeypatch.delenv(ENGINE_ENV, raising=False)
    monkeypatch.setenv("PHANTORA_NS3_LIB", str(_build(tmp_path / "b", lib, runner)))
    assert own_library_runs() is usable
    assert runner_usable(PacketConfig()) is usable


def test_inprocess_and_python_wrapped_configs_never_use_the_runner(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PHANTORA_NS3_LIB", raising=False)
    monkeypatch.delenv(ENGINE_ENV, raising=False)
    assert runner_usable(PacketConfig())
    assert not runner_usable(PacketConfig(nic_latency=1))
    monkeypatch.setenv(ENGINE_ENV, "inprocess")
    assert not runner_usable(PacketConfig())
