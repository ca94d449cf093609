"""`phantora run --max-steps N` ends a script after N training steps, as if it had exited there.

build-nanogpt's `train_gpt2.py` loops 19,073 steps with no flag to stop it (the fifth user trial, docs/runtime.md);
before, a single run could only be cut by `--timeout` (an error) or by a one-job `--jobs` file's `steps`.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = """
import torch
model = torch.nn.Linear(64, 64).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for i in range(10):
    model(torch.randn(8, 64, device="cuda")).sum().backward()
    opt.step()
    opt.zero_grad()
print("LOOP DONE", flush=True)
"""


def _phantora(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "phantora.cli", "run", "--topology", "testbed16", "--no-progress", *args]
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=300)


def test_a_ten_step_loop_ends_after_three(tmp_path: Path) -> None:
    """10 optimizer steps in the script, --max-steps 3: results.json has 3 steps, the loop never finishes, exit 0."""
    (tmp_path / "loop.py").write_text(SCRIPT)
    res = _phantora("--nproc", "2", "--max-steps", "3", "--out", "out", "loop.py", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    summary = json.loads((tmp_path / "out" / "results.json").read_text())
    assert len(summary["steps"]) == 3
    assert "LOOP DONE" not in res.stdout


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--max-steps", "0", "loop.py"], "--max-steps"),
        (["--max-steps", "2", "--jobs", "jobs.toml"], "each job's `steps`"),
    ],
)
def test_bad_max_steps_is_one_line(tmp_path: Path, extra: list[str], message: str) -> None:
    """A count under 1, or --max-steps with --jobs: refused in one line before anything starts."""
    (tmp_path / "loop.py").write_text(SCRIPT)
    (tmp_path / "jobs.toml").write_text('[[job]]\nscript = "loop.py"\nranks = 2\n')
    res = _phantora(*extra, cwd=tmp_path)
    assert res.returncode != 0
    assert message in res.stderr
    assert "Traceback" not in res.stderr
