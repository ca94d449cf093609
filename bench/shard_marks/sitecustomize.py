"""A start mark in a fluid shard process for `bench/driver_marks.py` (issue 38, item 2): put this directory on the
PYTHONPATH of a run traced with ``valgrind --tool=callgrind --trace-children=yes
--trace-children-skip-by-arg='*netserver*' --dump-before=getsid`` (the decomposition's workers left untraced). In a
shard process (``python -m phantora.netsim.fluid_proc_server``, `fluid_procs=on`) one mark (``os.getsid``) falls
once its flow engine is built, so that its first dump part is its start (imports, topology, engine) and its last the
requests it serves. Any other process is left as it is. Python runs this module at start-up, before the server
imports the factory's `fluid_shard_engine`, so the server calls the marked one."""

import os
import sys
from typing import Any

if "phantora.netsim.fluid_proc_server" in getattr(sys, "orig_argv", ()):
    from phantora.netsim import factory as _factory

    _made = _factory.fluid_shard_engine

    def _marked(*a: Any, **k: Any) -> Any:
        engine = _made(*a, **k)
        os.getsid(0)
        return engine

    _factory.fluid_shard_engine = _marked
