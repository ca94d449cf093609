"""The ns-3 models' interface version: the built library and runner report the one Python expects, and a library
or runner of another interface (or one without the version) is refused in one line naming it and the fix."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from phantora.errors import PhantoraError
from phantora.netsim import ns3_abi, ns3_build

pytestmark = pytest.mark.ns3

ROOT = Path(__file__).resolve().parent.parent
HEADER = ROOT / "ns3-scratch" / "model" / "phantora-interface-version.h"
PYTHON = [sys.executable, "-c"]


def env(**extra: str) -> dict[str, str]:
    """This process's environment with the checkout first on the path."""
    return {**os.environ, "PYTHONPATH": str(ROOT), **extra}


@pytest.fixture(scope="module")
def built() -> None:
    """The models and the runner, built if a source changed."""
    pytest.importorskip("ns3", reason="the ns3 wheel is not installed")
    if ns3_build.needs_build():
        ns3_build.build()


def test_header_constant_is_pythons() -> None:
    """The C++ constant and Python's are bumped together."""
    found = re.findall(r"constexpr uint32_t kPhantoraInterfaceVersion = (\d+);", HEADER.read_text())
    assert found == [str(ns3_abi.INTERFACE_VERSION)]


def test_built_library_and_runner_report_pythons_version(built: None) -> None:
    """The real library, loaded in a process of its own (two fabric libraries cannot share one), and the runner."""
    code = "from phantora.netsim import ns3_abi, ns3_build; print(ns3_abi.library_version(ns3_build.library_path()))"
    out = subprocess.run([*PYTHON, code], capture_output=True, text=True, check=True, env=env())
    assert out.stdout.strip() == str(ns3_abi.INTERFACE_VERSION)
    assert ns3_abi.check_runner(ns3_build.runner_path()) == ns3_abi.INTERFACE_VERSION


def test_library_without_the_function_is_refused_in_one_line(built: None) -> None:
    """PHANTORA_NS3_LIB at one of ns-3's own libraries (no PhantoraInterfaceVersion): netsim stops in one line
    naming the library, both versions and the fix, before any flow runs."""
    ns3_dir, ver = ns3_build.ns3_wheel()
    other = ns3_dir / "lib64" / f"libns3.{ver}-core.so"
    cmd = [sys.executable, "-m", "phantora.cli", "netsim", "--network", "ns3", "-t", "star8", "-f", "incast4"]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env(PHANTORA_NS3_LIB=str(other)))
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert f"PHANTORA_NS3_LIB={other}" in lines[0]
    assert "no PhantoraInterfaceVersion()" in lines[0]
    assert f"needs version {ns3_abi.INTERFACE_VERSION}" in lines[0]
    assert "rebuild your PHANTORA_NS3_LIB" in lines[0]
    assert "Traceback" not in proc.stderr


def test_unloadable_library_is_refused(tmp_path: Path) -> None:
    """A file that is no library: the loader's reason, in one line."""
    bogus = tmp_path / "libphantora-ns3.so"
    bogus.write_text("not a library\n")
    with pytest.raises(PhantoraError, match=r"cannot load the ns-3 fabric library .*libphantora-ns3.so: .*run "):
        ns3_abi.check_library(bogus)


def fake_runner(tmp_path: Path, body: str) -> Path:
    """An executable standing in for a runner of another build."""
    path = tmp_path / "phantora-ns3-runner"
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return path


def test_runner_of_another_version_is_refused(tmp_path: Path) -> None:
    other = ns3_abi.INTERFACE_VERSION + 1
    runner = fake_runner(tmp_path, f"echo {other}")
    with pytest.raises(PhantoraError, match=f"has interface version {other}, this phantora needs version"):
        ns3_abi.check_runner(runner)


def test_runner_before_the_version_is_refused(tmp_path: Path) -> None:
    """A runner older than --interface-version prints its usage and exits 2."""
    runner = fake_runner(tmp_path, 'echo "usage: phantora-ns3-runner [--load LIB]... SCRIPT OUTDIR" >&2; exit 2')
    with pytest.raises(PhantoraError, match=r"no interface version \(it predates --interface-version\)"):
        ns3_abi.check_runner(runner)


def test_runner_refuses_a_library_of_another_version(built: None, tmp_path: Path) -> None:
    """The real runner beside a library reporting another version (a one-function stand-in preloaded ahead of
    libphantora-ns3.so) refuses to run, naming that library and both versions; Python passes its line on."""
    cxx = shutil.which(os.environ.get("CXX") or "g++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    other = ns3_abi.INTERFACE_VERSION + 1
    src = tmp_path / "other.cc"
    src.write_text(f'#include <cstdint>\nextern "C" uint32_t PhantoraInterfaceVersion() {{ return {other}; }}\n')
    lib = tmp_path / "libother.so"
    subprocess.run([cxx, "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    runner = ns3_build.runner_path()
    proc = subprocess.run(
        [str(runner), "--interface-version"], capture_output=True, text=True, env={**os.environ, "LD_PRELOAD": str(lib)}
    )
    assert proc.returncode == 2
    assert proc.stdout == ""
    want = f"{lib} has interface version {other}, this runner was built for {ns3_abi.INTERFACE_VERSION}"
    assert proc.stderr.strip() == f"phantora-ns3-runner: error: {want}: rebuild both with scripts/build_ns3.sh"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LD_PRELOAD", str(lib))
        mp.setattr(ns3_abi, "_RUNNERS", {})
        with pytest.raises(PhantoraError, match=re.escape(want)):
            ns3_abi.check_runner(runner)


def test_library_without_its_runner_is_refused_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """PHANTORA_NS3_LIB in a folder with no runner: the CC registry (which asks the runner) names the runner and
    the fix, not a bare file-not-found."""
    from phantora.netsim import cc_registry

    monkeypatch.setenv("PHANTORA_NS3_LIB", str(tmp_path / "libphantora-ns3.so"))
    monkeypatch.delenv("PHANTORA_CC_DIR", raising=False)
    monkeypatch.setattr(cc_registry, "_MEMO", {})
    runner = tmp_path / "phantora-ns3-runner"
    with pytest.raises(PhantoraError, match=f"the ns-3 runner {re.escape(str(runner))} is missing: rebuild your"):
        cc_registry.registry()
