"""Stepped partition workers on Ray (issue 38): ``partition=N`` with ``nvlink=fluid`` and ``ray=local|auto|ADDRESS``.

As for the whole-DAG workers (`bridge.cut_ray`), Ray starts and watches the processes: one actor (one CPU) per
switch group starts ``python -m bridge.cut_stepper`` on its node, on tcp (loopback for ``local``, the node's
address otherwise, which needs ``PHANTORA_BRIDGE_NETWORK=1``), and the workers run their cut-cable windows peer
to peer, CurveZMQ beyond loopback (`bridge.cut_peers`). The rounds: each actor holds its worker's stdin and stdout
and carries the driver's requests and the worker's replies (msgpack bytes) through its Ray calls (`send`, `recv`),
so the driver talks to the workers over Ray's own channel. A worker that exits, or an actor Ray lost, ends the run,
named with the worker's last words.
"""

from __future__ import annotations

import os
import subprocess
import time
from typing import Any

import msgpack

from bridge.cut_ray import CutWorkerHost, start_hosts
from bridge.cut_stepped_pool import POLL_S, SteppedPool, worker_setups
from bridge.transport import new_token
from phantora.errors import PhantoraError
from phantora.netsim.decompose import WorkerDiedError
from phantora.netsim.packet_config import PacketConfig
from phantora.topology.model import Topology

EXIT_WAIT_S = 2.0  # how long an actor waits for its worker to exit once told to, before it ends it


class SteppedWorkerHost(CutWorkerHost):
    """The body of the Ray actor: one stepped partition worker on this node, its stdin and stdout held here."""

    prog = "bridge.cut_stepper"

    def _spawn(self, argv: list[str], env: dict[str, str], cwd: str) -> subprocess.Popen[bytes]:
        self.unpacker = msgpack.Unpacker(raw=False, strict_map_key=False, max_buffer_size=1 << 31)
        with self.log.open("wb") as err:
            return subprocess.Popen(argv, env=env, cwd=cwd if os.path.isdir(cwd) else None, stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=err)  # fmt: skip

    def send(self, raw: bytes) -> None:
        """Hand the worker one request (msgpack)."""
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(raw)
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise PhantoraError(f"exited with code {self.proc.wait()}: {self.tail()}") from None

    def recv(self) -> bytes:
        """The worker's next reply (msgpack); PhantoraError with its last words if it exits first."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        for msg in self.unpacker:
            return msgpack.packb(msg)
        while chunk := os.read(fd, 1 << 22):
            self.unpacker.feed(chunk)
            for msg in self.unpacker:
                return msgpack.packb(msg)
        raise PhantoraError(f"exited with code {self.proc.wait()}: {self.tail()}")

    def stop(self) -> int | None:
        """Tell the worker to exit (it may still run: the run failed elsewhere), end it if it does not; clean up."""
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write(msgpack.packb({"k": "exit"}))
            self.proc.stdin.close()
            self.proc.wait(timeout=EXIT_WAIT_S)
        except (BrokenPipeError, OSError, ValueError, subprocess.TimeoutExpired):
            pass
        return super().stop()


class RaySteppedPool(SteppedPool):
    """`SteppedPool` with its workers started by Ray actors; the rounds go through the actors."""

    def _start(self, topology: Topology, config: PacketConfig) -> None:
        from bridge.ray_workers import RayPlacement

        self._timeout_s = float(config.partition_timeout_s)
        self._placement = RayPlacement(config.ray, config.partition, host=SteppedWorkerHost)
        self._actors: list[Any] = []
        started = start_hosts(self._placement, worker_setups(topology, config), new_token(), self._actors)
        self._pids = [int(pid) for pid, _, _ in started]
        self._endpoints = [str(endpoint) for _, endpoint, _ in started]

    @property
    def curve(self) -> bool:
        return bool(self._placement.curve)

    def _first_pid(self) -> int:
        return self._pids[0]

    def _send(self, msg: dict[str, Any]) -> None:
        raw = msgpack.packb(msg)
        self._sent = [a.send.remote(raw) for a in self._actors]

    def _gather(self) -> list[dict[str, Any]]:
        """One reply from every worker, in group order; a worker that exits (or an actor that is gone) ends the
        run, named; so does a round longer than `partition_timeout_s`."""
        from bridge.ray_workers import _ray

        ray = _ray()
        refs = [a.recv.remote() for a in self._actors]
        deadline = time.monotonic() + self._timeout_s
        pending = list(range(len(refs)))
        got: dict[int, dict[str, Any]] = {}
        while pending:
            ready, _ = ray.wait([refs[g] for g in pending], num_returns=1, timeout=POLL_S)
            for ref in ready:
                g = refs.index(ref)
                try:
                    ray.get(self._sent[g])
                    got[g] = msgpack.unpackb(ray.get(ref), raw=False, strict_map_key=False)
                except Exception as exc:  # noqa: BLE001 - the actor's PhantoraError (wrapped by Ray), or it is gone
                    raise self._died(g, exc) from None
                pending.remove(g)
            if pending and time.monotonic() > deadline:
                raise WorkerDiedError(
                    f"partition workers {pending} on Ray gave no reply in {self._timeout_s:.0f} s "
                    "(PacketConfig.partition_timeout_s)"
                )
        return [got[g] for g in range(len(refs))]

    def _died(self, g: int, exc: BaseException) -> WorkerDiedError:
        why = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
        why = why.split("PhantoraError: ", 1)[-1]  # (the actor's own error, as Ray wraps it)
        return WorkerDiedError(f"partition worker {g} (pid {self._pids[g]}, Ray actor, at {self._endpoints[g]}) "
                               f"mid-run: {why}")  # fmt: skip

    def close(self) -> None:
        """Stop every actor (each tells its worker to exit first); shut Ray down if this run started it."""
        if self._closed:
            return
        self._closed = True
        placement = getattr(self, "_placement", None)
        if placement is not None:
            placement.stop(getattr(self, "_actors", []))
        from bridge.transport import remove_run_dir

        remove_run_dir(self._root)
