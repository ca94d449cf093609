"""Ray placement of decomposition workers (``--set ray=local|auto|ADDRESS`` with ``workers=N``).

Ray only starts and watches the processes: one actor (one CPU) per worker, on whichever node Ray picks,
launches ``python -m bridge.netserver`` there (tcp, the run's token) and reports its endpoint. The data path
stays our ZeroMQ bridge (msgpack, token in the hello). ``local`` starts a private Ray instance on this machine
(workers bind loopback); ``auto`` joins this machine's cluster, ADDRESS another (``ray://host:10001`` or
``host:6379``): there workers bind their node's address, which needs ``PHANTORA_BRIDGE_NETWORK=1``, and talk
CurveZMQ (`bridge.curve`): the driver's public key goes to the actor, which starts its server with it as the
only client let in; the server makes its own key pair and the actor returns its public key with the endpoint.
``PHANTORA_BRIDGE_CURVE=1`` makes ``local`` use CurveZMQ too.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bridge.curve import CLIENTS_ENV
from bridge.transport import NETWORK_OPT_IN, curve_always, network_allowed, read_server_key
from phantora.errors import PhantoraError

START_TIMEOUT_S = 180.0


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise PhantoraError("ray placement needs the optional Ray extra: pip install 'ray[default]'") from None
    return ray


def spawn_logged(argv: list[str], env: dict[str, str], cwd: str, log: Path) -> subprocess.Popen[bytes]:
    """Start a Ray actor's worker process: no stdin or stdout, its stderr to `log`, in `cwd` if this node has it."""
    with log.open("wb") as err:
        return subprocess.Popen(
            argv,
            env=env,
            cwd=cwd if os.path.isdir(cwd) else None,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )


def last_words(log: Path, lines: int = 3) -> str:
    """A worker's last `lines` lines of `log`, joined by " | " for a one-line error ("" if none or no log)."""
    text = log.read_text(errors="replace") if log.exists() else ""
    return " | ".join(text.strip().splitlines()[-lines:])


class LoggedWorker:
    """What both Ray actors' bodies share (`WorkerHost`, `bridge.cut_ray.CutWorkerHost`): their worker process
    `proc`, its stderr in `log`, and the endpoint file it publishes once started."""

    proc: subprocess.Popen[bytes]
    log: Path

    def wait_endpoint(self, path: Path, timeout_s: float, what: str) -> str:
        """The endpoint in `path` once the worker has written it; PhantoraError naming `what`, with its log's last
        lines, if it exits or `timeout_s` passes first."""
        deadline = time.monotonic() + timeout_s
        while not path.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise PhantoraError(f"{what} did not start (exit {self.proc.poll()}): {self.tail()}")
            time.sleep(0.02)
        return path.read_text().strip()

    def poll(self) -> int | None:
        return self.proc.poll()

    def tail(self) -> str:
        return last_words(self.log)


class WorkerHost(LoggedWorker):
    """The body of the Ray actor: one network server process on this node, its endpoint and CURVE key."""

    def __init__(self, spec: bytes, token: str, loopback: bool, cwd: str, client_key: bytes | None = None) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="phantora-worker-"))
        os.chmod(self.dir, 0o700)
        setup = self.dir / "setup.msgpack"
        setup.write_bytes(spec)
        setup.chmod(0o600)
        self.log = self.dir / "worker.log"
        host = "127.0.0.1" if loopback else _ray().util.get_node_ip_address()
        env = {**os.environ, "PHANTORA_TOKEN": token}
        env.pop(CLIENTS_ENV, None)
        if client_key is not None:
            env[CLIENTS_ENV] = client_key.decode()
        if not loopback:
            env[NETWORK_OPT_IN] = "1"  # the driver opted in; its client key makes the server a CURVE server
        argv = [sys.executable, "-m", "bridge.netserver", "--setup", str(setup), "--transport", "tcp", "--bind", host]
        self.proc = spawn_logged(argv, env, cwd, self.log)

    def endpoint(self) -> tuple[int, str, bytes | None]:
        """(pid, endpoint, CURVE public key or None) once the server has published them; PhantoraError with its
        log if it exits first."""
        endpoint = self.wait_endpoint(self.dir / "net.endpoint", START_TIMEOUT_S, "the worker")
        return self.proc.pid, endpoint, read_server_key(self.dir, "net")

    def stop(self) -> int | None:
        """Wait a little for the server (told to exit over the bridge), end it if still there; clean up."""
        try:
            self.proc.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)
        return self.proc.returncode


class RayPlacement:
    """Connects to (or starts) Ray once per decomposed engine (or partitioned run), starts worker actors (of
    `host`: `WorkerHost`, or `bridge.cut_ray.CutWorkerHost` for partition workers), stops them."""

    def __init__(self, address: str, workers: int, host: type = WorkerHost) -> None:
        ray = _ray()
        self.local = address == "local"
        self.started_here = not ray.is_initialized()
        self.curve = not self.local or curve_always()  # beyond loopback: always CurveZMQ
        if address not in ("local", "auto") and not network_allowed():
            raise PhantoraError(
                f"ray={address}: workers on other machines bind a network port (tcp with CurveZMQ); "
                f"set {NETWORK_OPT_IN}=1 to allow it, or use ray=local"
            )
        if self.started_here:
            try:
                ray.init(
                    address=None if self.local else address,
                    num_cpus=max(workers, os.cpu_count() or 1) if self.local else None,
                    include_dashboard=False,
                    log_to_driver=False,
                    configure_logging=False,
                )
            except Exception as exc:  # noqa: BLE001 - ray raises ConnectionError, RuntimeError, ...
                raise PhantoraError(f"cannot connect to Ray at {address!r}: {exc}") from None
        self.actor_class = ray.remote(num_cpus=1, max_restarts=0)(host)

    def start(self, spec: bytes, token: str, client_key: bytes | None) -> Any:
        """A worker actor (its server process starting, a CURVE server letting in `client_key` only if given);
        `endpoint` waits for it."""
        return self.actor_class.remote(spec, token, self.local, os.getcwd(), client_key)

    def start_host(self, *args: Any) -> Any:
        """An actor of this placement's host class, made with `args`."""
        return self.actor_class.remote(*args)

    def endpoint(self, actor: Any, timeout_s: float = START_TIMEOUT_S) -> tuple[int, str, bytes | None]:
        """(pid, endpoint, the server's CURVE public key) of a started worker (whose actor waits `timeout_s`)."""
        ray = _ray()
        try:
            pid, endpoint, key = ray.get(actor.endpoint.remote(), timeout=timeout_s + 30)
        except Exception as exc:  # noqa: BLE001 - RayTaskError wraps the actor's PhantoraError
            raise PhantoraError(f"a Ray worker did not start: {exc}") from None
        if not self.local and endpoint.startswith("tcp://127."):
            raise PhantoraError(f"a Ray worker published a loopback endpoint ({endpoint}) for a remote driver")
        if self.curve and key is None:
            raise PhantoraError(f"the Ray worker at {endpoint} published no CurveZMQ key")
        return int(pid), str(endpoint), key

    def poll(self, actor: Any) -> int | None:
        ray = _ray()
        try:
            return ray.get(actor.poll.remote(), timeout=5.0)  # type: ignore[no-any-return]
        except Exception:  # noqa: BLE001 - a dead actor raises RayActorError, a slow one GetTimeoutError
            return -1

    def tail(self, actor: Any) -> str:
        try:
            return str(_ray().get(actor.tail.remote(), timeout=5.0))
        except Exception:  # noqa: BLE001 - the actor is gone
            return ""

    def stop(self, actors: list[Any]) -> None:
        """Stop every worker's actor (after its server was told to exit); shut Ray down if we started it."""
        ray = _ray()
        for a in actors:
            try:
                ray.get(a.stop.remote(), timeout=15.0)
            except Exception:  # noqa: BLE001 - already gone
                pass
            ray.kill(a)
        if self.started_here:
            ray.shutdown()
