"""The coordinator and the network server forked from a zygote that has imported them, when the run has a home.

`python -m bridge.coordinator` spends about 1 CPU s importing its modules (numpy, zmq, phantora's models) before it
reads its setup, and so does `python -m bridge.netserver`: a second of every live run. Under a zygote home
(`PHANTORA_ZYGOTE`, bridge/zygote.py), `start` asks the zygote whose only preload is that server's module (keyed,
as every zygote, by the interpreter, the preload, the start-up environment and, where it matters, the directory)
for a fork server of the run's, which forks the server. Without a home it starts the fresh interpreter, as before.

The forked server is the fresh one but for its imports: the same argv (`sys.argv[0]` the module's file), the whole
environment the interpreter would have had (the run token included: it is left out of the zygote's start-up,
nothing reads it at import), working directory, log (stdout and stderr, truncated), session and process group,
and the launcher whose silence it judges (bridge/launcher_pid.py). Its exit code comes from its fork server. It
dies with its fork server, which leaves when the launcher closes its connection or dies (so nothing outlives a
run); `stop_all` stops it like a spawned one.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from bridge import zygote
from bridge.forkclient import ForkServer
from bridge.supervisor import Child, spawn

RUN_ONLY = frozenset({"PHANTORA_TOKEN"})  # a run's own, read after start-up: not part of the zygote's key


def start(
    role: str,
    module: str,
    args: Sequence[str],
    python: str,
    env: dict[str, str],
    log: Path,
    cwd: str | None,
    scratch: Path,
) -> tuple[Child, ForkServer | None]:
    """Start `python -m module args...` as the run's `role` ("coordinator", "server"): forked from a zygote under a
    home (with its fork server, which logs to `scratch` and is closed after the run), else a fresh interpreter."""
    if zygote.usable_home(env) is None:
        return spawn(role, None, [python, "-m", module, *args], env, log, cwd), None
    startup = {k: v for k, v in env.items() if k not in RUN_ONLY}
    forker = ForkServer.start(python, (module,), startup, scratch / f"{role}.forkserver.log", cwd)
    forker.child.role = f"{role} forkserver"
    try:
        child = forker.fork(-1, module, args, env, log, cwd)
    except BaseException:
        forker.close()
        raise
    child.role, child.rank = role, None
    return child, forker
