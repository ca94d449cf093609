"""Ray placement of partition workers (issue 38): ``--set partition=N --set ray=local|auto|ADDRESS``.

As for decomposition workers (`bridge.ray_workers`, whose `RayPlacement` connects to Ray and stops the actors), Ray
only starts and watches the processes: one actor (one CPU) per switch group starts ``python -m bridge.cut_worker``
on its node, in a private directory there, on tcp (loopback for ``local``, the node's address otherwise, which needs
``PHANTORA_BRIDGE_NETWORK=1``). The workers talk to each other, not through Ray:

1. each worker binds, and publishes its endpoint (and, with CurveZMQ, its public key) in its own directory; its
   actor returns them (`CutWorkerHost.endpoint`);
2. the driver hands every actor the other workers' endpoints and keys, which the actor writes as endpoint files in
   its worker's directory (`CutWorkerHost.peers`), where the worker waits for them (`bridge.cut_peers`);
3. the driver polls the actors: a worker that exits non-zero, or an actor that is gone, ends the run within a poll
   (`POLL_S`), named; at the end each actor returns its worker's records.

Beyond loopback, and with ``PHANTORA_BRIDGE_CURVE=1`` on loopback, the workers run CurveZMQ: each makes its own key
pair and lets in only the other workers' public keys.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import msgpack

from bridge.cut_peers import peer_name
from bridge.cut_watch import wait_workers
from bridge.ray_workers import LoggedWorker
from bridge.transport import (
    LOOPBACK,
    NETWORK_OPT_IN,
    endpoint_file,
    read_server_key,
    startup_timeout_s,
    write_endpoint_file,
)
from phantora.errors import PhantoraError

POLL_S = 0.25  # how often the driver asks every actor whether its worker is still running


class CutWorkerHost(LoggedWorker):
    """The body of the Ray actor: one partition worker process on this node."""

    prog = "bridge.cut_worker"  # the worker's module (`bridge.cut_stepped_ray`'s actor: the stepped worker)

    def __init__(self, group: int, setup: dict[str, Any], token: str, loopback: bool, curve: bool, cwd: str) -> None:
        from bridge.ray_workers import _ray

        self.group = group
        self.dir = Path(tempfile.mkdtemp(prefix="phantora-cut-"))
        os.chmod(self.dir, 0o700)
        self.host = LOOPBACK if loopback else str(_ray().util.get_node_ip_address())
        setup = {**setup, "run_dir": str(self.dir), "out": str(self.dir / "out.msgpack"), "transport": "tcp",
                 "host": self.host, "curve": curve}  # fmt: skip
        path = self.dir / "setup.msgpack"
        path.write_bytes(msgpack.packb(setup))
        path.chmod(0o600)
        self.log = self.dir / "worker.log"
        env = {**os.environ, "PHANTORA_TOKEN": token}
        if not loopback:
            env[NETWORK_OPT_IN] = "1"  # the driver opted in (RayPlacement checks it); the workers run CurveZMQ
        self.proc = self._spawn([sys.executable, "-m", self.prog, "--setup", str(path)], env, cwd)

    def _spawn(self, argv: list[str], env: dict[str, str], cwd: str) -> subprocess.Popen[bytes]:
        from bridge.ray_workers import spawn_logged

        return spawn_logged(argv, env, cwd, self.log)

    def endpoint(self) -> tuple[int, str, bytes | None]:
        """(pid, endpoint, CURVE public key or None) once the worker has bound; PhantoraError with its log if it
        exits first."""
        path = endpoint_file(self.dir, peer_name(self.group))
        # PHANTORA_STARTUP_TIMEOUT_S, as every bridge process
        endpoint = self.wait_endpoint(path, startup_timeout_s(), f"partition worker {self.group}")
        return self.proc.pid, endpoint, read_server_key(self.dir, peer_name(self.group))

    def peers(self, found: dict[int, tuple[str, bytes | None]]) -> str:
        """Publish the other workers' endpoints (and keys) where this one waits for them; returns this node's
        address (for errors)."""
        for g, (endpoint, key) in sorted(found.items()):
            if g != self.group:
                write_endpoint_file(self.dir, peer_name(g), endpoint, key)
        return self.host

    def result(self) -> bytes:
        """The worker's records (msgpack), once it has exited 0."""
        return (self.dir / "out.msgpack").read_bytes()

    def stop(self) -> int | None:
        """End the worker if it still runs (the run failed elsewhere); clean up."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)
        return self.proc.returncode


class _RayWorker:
    """A started partition worker as `bridge.cut_watch.wait_workers` watches it: through its actor."""

    def __init__(self, placement: Any, actor: Any, pid: int, endpoint: str) -> None:
        self.placement, self.actor, self.pid, self.endpoint = placement, actor, pid, endpoint

    def poll(self) -> int | None:
        return self.placement.poll(self.actor)  # type: ignore[no-any-return]  # -1 when the actor is gone

    def describe(self) -> str:
        return f"pid {self.pid}, Ray actor, at {self.endpoint}"

    def last_words(self) -> str:
        return str(self.placement.tail(self.actor))


def start_hosts(placement: Any, setups: list[dict[str, Any]], token: str, actors: list[Any]) -> list[Any]:
    """Start one actor of `placement`'s host class per setup (appended to `actors`, for the caller to stop), wait
    for each worker's endpoint and hand every actor the others'; (pid, endpoint, key) per worker, in group order."""
    from bridge.ray_workers import _ray

    for g, setup in enumerate(setups):
        actors.append(placement.start_host(g, setup, token, placement.local, placement.curve, os.getcwd()))
    wait_s = startup_timeout_s()
    started = [placement.endpoint(a, wait_s) for a in actors]  # checks: no loopback for a remote driver, keys
    found = {g: (endpoint, key) for g, (_, endpoint, key) in enumerate(started)}
    _ray().get([a.peers.remote(found) for a in actors], timeout=wait_s)
    return started


def run_on_ray(address: str, setups: list[dict[str, Any]], token: str, timeout_s: float) -> list[dict[str, Any]]:
    """Run one partition worker per setup on Ray actors (`CutWorkerHost`); their outputs, in group order."""
    from bridge.ray_workers import RayPlacement, _ray

    ray = _ray()
    placement = RayPlacement(address, len(setups), host=CutWorkerHost)
    actors: list[Any] = []
    try:
        started = start_hosts(placement, setups, token, actors)
        wait_s = startup_timeout_s()
        watched = [_RayWorker(placement, a, pid, ep) for a, (pid, ep, _) in zip(actors, started, strict=True)]
        wait_workers(watched, timeout_s, POLL_S)
        raw = ray.get([a.result.remote() for a in actors], timeout=wait_s)
        return [msgpack.unpackb(r, raw=False) for r in raw]
    except PhantoraError:
        raise
    except Exception as exc:  # noqa: BLE001 - Ray's own errors (an actor lost, a timeout) end the run, named
        raise PhantoraError(f"partition workers on Ray: {type(exc).__name__}: {exc}") from None
    finally:
        placement.stop(actors)
