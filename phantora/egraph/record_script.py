"""Rank-side wrapper `phantora.egraph.live.record_run` starts instead of the user's script.

    (bootstrap) record_script.py USER_SCRIPT [ARGS...]

It attaches a `GraphRecorder` to this rank's session (directory from $PHANTORA_RECORD_DIR), then runs the
user's script as ``__main__`` with its own argv, exactly as the bootstrap would have.
"""

from __future__ import annotations

import os
import runpy
import sys


def main() -> None:
    from phantora.egraph.live import ENV_DIR, attach
    from phantora.runtime.session import require

    attach(require(), os.environ[ENV_DIR])
    script = sys.argv[1]
    sys.argv = sys.argv[1:]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
