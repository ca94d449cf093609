"""Installing phantora as a package (issue 20): where the shipped data is found, the ns-3 build cache,
`phantora topo --list`, `phantora doctor`; and (slow) a wheel installed into a fresh venv outside the checkout."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import time
import zipfile
from pathlib import Path

import pytest

from phantora import resources
from phantora.cli import main
from phantora.netsim import ns3_abi, ns3_build, packet

ROOT = Path(__file__).resolve().parents[1]


def test_a_checkout_uses_its_own_folders(monkeypatch) -> None:
    monkeypatch.delenv("PHANTORA_TOPOLOGIES", raising=False)
    assert resources.checkout_root() == ROOT
    assert resources.data_root() == ROOT
    assert resources.topologies_dir() == ROOT / "topologies"
    assert resources.workloads_dir() == ROOT / "workloads"
    assert resources.ns3_source_dir() == ROOT / "ns3-scratch"
    assert packet.build_dir() == ROOT / "ns3-scratch" / "build"
    assert (resources.workloads_dir() / "incast4.flows.txt").is_file()
    monkeypatch.setenv("PHANTORA_TOPOLOGIES", "/elsewhere")
    assert resources.topologies_dir() == Path("/elsewhere")


def test_an_installed_package_uses_its_data_folder(monkeypatch) -> None:
    monkeypatch.delenv("PHANTORA_TOPOLOGIES", raising=False)
    monkeypatch.setattr(resources, "checkout_root", lambda: None)
    assert resources.data_root() == ROOT / "phantora" / "_data"
    assert resources.topologies_dir() == ROOT / "phantora" / "_data" / "topologies"


def test_cache_dir_honours_the_environment(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.delenv("PHANTORA_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert resources.cache_dir() == tmp_path / "xdg" / "phantora"
    monkeypatch.setenv("PHANTORA_CACHE", str(tmp_path / "mine"))
    assert resources.cache_dir() == tmp_path / "mine"


def test_the_cache_build_directory_is_keyed_by_the_sources(monkeypatch, tmp_path: Path) -> None:
    src = tmp_path / "ns3-scratch"
    shutil.copytree(ROOT / "ns3-scratch", src, ignore=shutil.ignore_patterns("build"))
    monkeypatch.setattr(ns3_build, "CHECKOUT", None)
    monkeypatch.setattr(ns3_build, "SCRATCH", src)
    monkeypatch.setenv("PHANTORA_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("PHANTORA_NS3_LIB", raising=False)
    ns3_build._build_key.cache_clear()
    try:
        first = ns3_build.build_dir()
        assert first.parent == tmp_path / "cache" and first.name.startswith("ns3-")
        assert ns3_build.library_path() == first / "libphantora-ns3.so"
        assert ns3_build.needs_build()  # nothing built there
        (src / "model" / "cc-dcqcn.cc").write_text((src / "model" / "cc-dcqcn.cc").read_text() + "\n// edited\n")
        ns3_build._build_key.cache_clear()
        assert ns3_build.build_dir() != first
        monkeypatch.setenv("PHANTORA_NS3_LIB", "/some/lib.so")
        assert ns3_build.library_path() == Path("/some/lib.so") and ns3_build.build() == Path("/some/lib.so")
    finally:
        ns3_build._build_key.cache_clear()


def test_shipped_workloads_and_examples_are_found_by_name(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)  # no workloads/ or examples/ here
    assert resources.shipped_file("incast4", resources.workloads_dir(), (".flows.txt",)) == (
        ROOT / "workloads" / "incast4.flows.txt"
    )
    assert resources.shipped_file("examples/gpt_ddp.py", resources.examples_dir()) == ROOT / "examples" / "gpt_ddp.py"
    assert resources.shipped_file("nothing.py", resources.examples_dir()) == Path("nothing.py")
    args = ["netsim", "--network", "flow", "--topology", "hpcc/star8", "--flows", "incast4", "--out", "o"]
    assert main(args) == 0
    assert (tmp_path / "o" / "flows.csv").read_text().count("\n") == 5  # header + 4 flows
    assert main(["netsim", "--topology", "hpcc/star8", "--flows", "no_such_flows"]) == 2
    assert "not a shipped workload" in capsys.readouterr().err


def test_topo_list_and_the_unknown_name_error(capsys) -> None:
    assert main(["topo", "--list"]) == 0
    out = capsys.readouterr().out
    assert str(resources.topologies_dir()) in out
    assert "  testbed16\n" in out and "  hpcc/star8\n" in out
    assert main(["topo", "nosuch"]) == 2
    assert "not a shipped topology (shipped: a100x64, " in capsys.readouterr().err
    assert main(["topo"]) == 2
    assert "--list" in capsys.readouterr().err


def test_doctor_quick(capsys) -> None:
    pytest.importorskip("ns3", reason="the ns3 wheel is not installed")
    assert main(["doctor", "--quick"]) == 0
    out = capsys.readouterr().out
    for check in ("torch", "ns3 wheel", "shipped data", "cache", "compiler"):
        assert f"ok       {check}: " in out
    assert "ns-3 models" not in out
    assert "deepspeed" in out and "mmh3" in out
    assert "all required checks passed" in out


def test_doctor_fails_on_an_unwritable_cache(monkeypatch, tmp_path: Path, capsys) -> None:
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("PHANTORA_CACHE", str(tmp_path / "file"))
    assert main(["doctor", "--quick"]) == 1
    out = capsys.readouterr().out
    assert "FAIL     cache: " in out and "PHANTORA_CACHE" in out
    assert "1 required check(s) failed" in out


@pytest.mark.ns3
def test_doctor_runs_a_flow_through_the_models(ns3_lib, capsys) -> None:
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    version = f"interface version {ns3_abi.INTERFACE_VERSION}, runner too"
    assert f"ok       ns-3 models: {packet.library_path()} loaded ({version}); a 100 kB flow took " in out


# ----- slow: a wheel in a fresh venv, outside the checkout ------------------------------------------------------


def _copy_sources(dst: Path) -> Path:
    """The checkout's sources without build products, so the build neither sees nor leaves any."""
    junk = (".git", ".venv", "build", "*.egg-info", "__pycache__", "runs", "out", ".*_cache")
    shutil.copytree(ROOT, dst, ignore=shutil.ignore_patterns(*junk))
    return dst


def _venv(path: Path) -> Path:
    """A fresh venv whose dependencies (torch, ns3, pip, setuptools ...) come from this interpreter's site-packages by
    a .pth file (a plain path line: the .pth files there, such as an editable install of the checkout, are not run).
    Without its own pip: the bundled one brings an old setuptools that would shadow the one there."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    purelib = subprocess.run(
        [path / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    deps = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (Path(purelib) / "_phantora_test_deps.pth").write_text("".join(f"{d}\n" for d in sorted(deps)))
    return path / "bin"


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "PHANTORA_", "VIRTUAL_ENV"))}
    return {**env, "PHANTORA_CACHE": str(tmp_path / "cache")}


def _run(cmd: list, cwd: Path, env: dict[str, str], timeout: int = 600) -> str:
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{cmd} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def _no_isolation() -> list[str]:
    """Build with this environment's setuptools if it has one (no download), else in pip's isolated environment."""
    return ["--no-build-isolation"] if importlib.util.find_spec("setuptools") else []


def _pip_wheel(src: Path, out: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", *_no_isolation(), "-w", str(out), str(src)]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    (wheel,) = out.glob("phantora-*.whl")
    return wheel


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_a_wheel_works_outside_the_checkout(tmp_path: Path) -> None:
    t0 = time.monotonic()
    wheel = _pip_wheel(_copy_sources(tmp_path / "src"), tmp_path / "dist")
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped_files = ("topologies/testbed16.toml", "topologies/hpcc/star8.topo.txt", "workloads/incast4.flows.txt")
    for shipped in (*shipped_files, "examples/gpt_ddp.py"):
        assert f"phantora/_data/{shipped}" in names
    for part in ("Makefile", "model/phantora-network.cc", "model/fabric-installer.h", "runner", "test"):
        assert any(n.startswith(f"phantora/_data/ns3-scratch/{part}") for n in names), part
    assert not any("/build/" in n for n in names)
    for data in ("default_curves.json", "public_curves.json", "data/public_kernels.csv"):  # the compute model's
        assert f"phantora/perfmodel/{data}" in names

    bin_dir = _venv(tmp_path / "venv")
    env, elsewhere = _env(tmp_path), tmp_path / "elsewhere"
    elsewhere.mkdir()
    _run([bin_dir / "python", "-m", "pip", "install", "-q", "--no-deps", "--no-index", wheel], elsewhere, env)
    where = _run([bin_dir / "python", "-c", "import phantora.resources as r; print(r.data_root())"], elsewhere, env)
    data = Path(where.strip())
    assert data.is_relative_to(tmp_path / "venv") and data.name == "_data"

    out = _run([bin_dir / "phantora", "topo", "testbed16"], elsewhere, env)
    assert "16 gpu, 2 nvswitch, 6 switch" in out and str(data / "topologies" / "testbed16.toml") in out
    # a shipped workload by its name, as a shipped topology
    cmd = [
        "netsim",
        "--network",
        "ns3",
        "--cc",
        "dcqcn",
        "--topology",
        "hpcc/star8",
        "--flows",
        "incast4",
        "--out",
        "run",
    ]
    out = _run([bin_dir / "phantora", *cmd], elsewhere, env, timeout=900)
    assert "4 flows on star8 (ns3, cc dcqcn)" in out and (elsewhere / "run" / "flows.csv").is_file()
    (built,) = (tmp_path / "cache").glob("ns3-*/libphantora-ns3.so")  # built on first use, into the cache
    out = _run([bin_dir / "phantora", "doctor"], elsewhere, env)
    assert f"ok       ns-3 models: {built} loaded" in out and "(package: " in out
    print(f"wheel test: {time.monotonic() - t0:.0f} s wall")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_an_editable_install_uses_the_checkout(tmp_path: Path) -> None:
    src = _copy_sources(tmp_path / "src")
    bin_dir = _venv(tmp_path / "venv")
    env, elsewhere = _env(tmp_path), tmp_path / "elsewhere"
    elsewhere.mkdir()
    _run([bin_dir / "python", "-m", "pip", "install", "-q", "--no-deps", *_no_isolation(), "-e", src], elsewhere, env)
    out = _run([bin_dir / "phantora", "topo", "--list"], elsewhere, env)
    assert f"shipped topologies in {src / 'topologies'}:" in out
    assert not (src / "phantora" / "_data").exists()
