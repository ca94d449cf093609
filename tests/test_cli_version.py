"""`phantora --version` names what computes the results: phantora, torch, ns-3 and Python versions."""

from __future__ import annotations

import importlib.metadata
import platform
import subprocess
import sys


def test_version_names_phantora_torch_ns3_and_python() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "phantora.cli", "--version"], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0
    line = out.stdout.strip()
    assert line.startswith(f"phantora {importlib.metadata.version('phantora')} ")
    assert f"torch {importlib.metadata.version('torch')}" in line and f"Python {platform.python_version()}" in line
    assert "ns-3 " in line
