"""A rank's exit without the interpreter's teardown of its heap.

A rank forked by the fork server shares the preloads' pages (torch and the rest, some 170 MB) with its server. At
the end of a normal exit CPython clears every module and frees their objects one by one: each write of a reference
count copies the page it sits on, about 44,000 pages, 0.5 CPU s a rank for nothing, since the process is about to
go. `leave` does what Python's own exit does that anyone could see, in its order, then ends the process:

1. waits for the non-daemon threads (`threading._shutdown`, as `Py_Finalize` does first);
2. runs the `atexit` functions (torch's, logging's flush and close, multiprocessing's, `weakref.finalize`'s);
3. collects the cyclic garbage, so that the script's own objects (its globals, freed when its module's dict is)
   run their `__del__` and weakref callbacks: a file it left open is flushed and closed, as at a normal exit;
4. flushes every file still open (one a module holds: the teardown would have flushed it when it freed it), then
   stdout and stderr (exit code 120 if that fails, as Python's);

and `os._exit`. What it leaves out is the teardown of the modules themselves: other objects a module still holds
at the end are not finalised (no `__del__` runs for them), which Python does not promise either (its
documentation of `object.__del__`).
"""

from __future__ import annotations

import _io
import atexit
import contextlib
import gc
import os
import sys
import threading
import traceback
from typing import NoReturn

FLUSH_FAILED = 120  # Python's exit code when it cannot flush stdout or stderr at exit


def leave(code: int) -> NoReturn:
    """End the process with `code` after the steps of a normal exit that have visible effects (module docstring)."""
    try:
        threading._shutdown()  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001 - Python reports it and exits all the same
        traceback.print_exc()
    atexit._run_exitfuncs()  # reports each function's exception itself, as at a normal exit
    gc.collect()
    for obj in gc.get_objects():  # what the process made; the frozen preloads' objects are not listed
        # by its type only: isinstance would read `__class__` of objects that warn on any attribute read
        # (torch.distributed.reduce_op), and == would call their __eq__
        if issubclass(type(obj), _io._IOBase) and obj is not sys.stdout and obj is not sys.stderr:
            with contextlib.suppress(Exception):
                if not obj.closed:
                    obj.flush()
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):
            code = code or FLUSH_FAILED
    os._exit(code)
