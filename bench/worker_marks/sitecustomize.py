"""Round marks in a decomposition worker for `bench/driver_marks.py` (issue 38, item 2): put this directory on the
PYTHONPATH of a run traced with ``valgrind --tool=callgrind --trace-children=yes --dump-before=getsid``. In a worker
process (``python -m bridge.netserver``) each round it serves is then one dump part: a mark (``os.getsid``) as the
round's post reaches its engine and one as its completions go into columns for the reply (the reply's encoding is
left out). Any other process is left as it is. Python runs this module at start-up, before `bridge.netserver` binds
`completions_to_columns`, so the worker's server calls the marked one."""

import os
import sys
from typing import Any

if "bridge.netserver" in getattr(sys, "orig_argv", ()):
    import bridge.columns as _columns
    from phantora.netsim import nic_latency as _nic

    _post, _cols = _nic.NicLatencySimulator.post, _columns.completions_to_columns

    def _marked_post(self: Any, *a: Any, **k: Any) -> Any:
        os.getsid(0)
        return _post(self, *a, **k)

    def _marked_cols(*a: Any, **k: Any) -> Any:
        os.getsid(0)
        return _cols(*a, **k)

    _nic.NicLatencySimulator.post = _marked_post  # type: ignore[method-assign]
    _columns.completions_to_columns = _marked_cols
