"""A rank whose program exits while handling an error names that error in its last line (runtime/bootstrap.py).

Frameworks catch a program's error, print it and exit: hydra's `run_and_report` (pytorch/examples' minGPT-ddp runs
under `@hydra.main`) ends with `sys.exit(1)` inside its `except`, so the rank's line named only hydra's frame. The
exit's `__context__` is the error being handled; the line now says it, with the user's frame it was raised in.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _last_line(tmp_path: Path, body: str) -> tuple[int, str]:
    script = tmp_path / "prog.py"
    script.write_text(textwrap.dedent(body))
    run = f"from phantora.runtime.bootstrap import run_script; run_script('rank 0', {str(script)!r}, [{str(script)!r}])"
    proc = subprocess.run([sys.executable, "-c", run], cwd=ROOT, capture_output=True, text=True, timeout=120)
    return proc.returncode, proc.stderr.strip().splitlines()[-1]


def test_exit_while_handling_an_error_names_the_error_and_where(tmp_path: Path) -> None:
    code, line = _last_line(
        tmp_path,
        """
        import sys
        def step():
            raise RuntimeError("softmax with half to float conversion is not supported on CPU\\nsecond line")
        def run_and_report():
            try:
                step()
            except Exception:
                sys.exit(1)
        run_and_report()
        """,
    )
    script = tmp_path / "prog.py"
    assert code == 1
    assert line == (
        f"phantora: rank 0 exited with code 1 (at {script}:9 in run_and_report), while handling RuntimeError: "
        f"softmax with half to float conversion is not supported on CPU (at {script}:4 in step)"
    )


def test_a_plain_exit_says_only_where(tmp_path: Path) -> None:
    """No error handled (argparse's exit, a plain `sys.exit(3)`), or the context suppressed (`raise ... from None`):
    the line as before."""
    code, line = _last_line(tmp_path, "import sys\nsys.exit(3)\n")
    assert (code, line) == (3, f"phantora: rank 0 exited with code 3 (at {tmp_path / 'prog.py'}:2 in <module>)")
    code, line = _last_line(
        tmp_path, "import sys\ntry:\n    1 / 0\nexcept ZeroDivisionError:\n    raise SystemExit(2) from None\n"
    )
    assert (code, line) == (2, f"phantora: rank 0 exited with code 2 (at {tmp_path / 'prog.py'}:5 in <module>)")
