"""A rank's exit (phantora/runtime/rank_exit.py): what Python's own exit does that anyone can see, without the
teardown of the modules. Checked in a bare interpreter, then in a live run's forked ranks."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from test_runtime_e2e import star

from phantora.launcher import RunConfig, launch

ROOT = Path(__file__).resolve().parents[1]

# Everything a normal exit would let a script's work finish: a non-daemon thread still writing, an atexit function,
# a file left open in the script's globals (which a module holds, through the class of an object it keeps, so only
# a module teardown would have freed it), output without a newline; and that object's __del__, which only a module
# teardown would run.
SCRIPT = """
    import atexit, os, sys, threading, time
    out = sys.argv[1]
    def late():
        time.sleep(0.3)
        with open(os.path.join(out, f"thread{RANK}"), "w") as f:
            f.write("joined")
    RANK = os.environ.get("RANK", "0")
    threading.Thread(target=late).start()
    atexit.register(lambda: open(os.path.join(out, f"atexit{RANK}"), "w").write("ran"))
    left_open = open(os.path.join(out, f"open{RANK}"), "w")
    left_open.write("flushed by its finaliser")
    class TornDown:
        def __del__(self):
            print("torn down", flush=True)
    sys.modules["torn_down_holder"] = type(sys)("torn_down_holder")
    sys.modules["torn_down_holder"].kept = TornDown()
    print("last words", end="")
"""


def check_exit(out: Path, ranks: list[str], log: dict[str, str]) -> None:
    for r in ranks:
        assert (out / f"thread{r}").read_text() == "joined"  # the non-daemon thread was waited for
        assert (out / f"atexit{r}").read_text() == "ran"
        assert (out / f"open{r}").read_text() == "flushed by its finaliser"
        assert log[r].endswith("last words")  # stdout flushed, and nothing printed after it: no module teardown
        assert "torn down" not in log[r]


def test_leave_keeps_a_normal_exits_effects_and_its_code(tmp_path: Path) -> None:
    """The script run as the bootstrap runs it (runpy.run_path), then `leave(3)`."""
    (tmp_path / "ends.py").write_text(textwrap.dedent(SCRIPT))
    body = "import runpy, sys\nfrom phantora.runtime.rank_exit import leave\n"
    body += "runpy.run_path(sys.argv[2], run_name='__main__')\nleave(3)\n"
    cmd = [sys.executable, "-c", body, str(tmp_path), str(tmp_path / "ends.py")]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3, proc.stderr
    check_exit(tmp_path, ["0"], {"0": proc.stdout})


def test_a_forked_ranks_exit_keeps_them(tmp_path: Path) -> None:
    script = tmp_path / "ends.py"
    script.write_text(textwrap.dedent(SCRIPT) + "import torch.distributed as dist\ndist.init_process_group()\n")
    report = launch(RunConfig(str(script), [str(tmp_path)], star(2), nproc=2, timeout_s=120, trace="none"))
    assert "forkserver" in report.logs
    check_exit(tmp_path, ["0", "1"], {r: report.logs[f"rank {r}"] for r in ("0", "1")})
