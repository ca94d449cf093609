"""Sockets, endpoints, the run directory and the per-run token.

- ``ipc``: Unix sockets in a private run directory (mode 0700), the default.
- ``tcp``: loopback (``127.0.0.1``), on a port the kernel picks; another interface (decomposition workers on
  other machines, placed by Ray) only with ``PHANTORA_BRIDGE_NETWORK=1`` set on the side that binds or
  connects, and only with CurveZMQ (`bridge.curve`): the traffic is encrypted, the server lets in only the
  run's own client keys, and every peer still shows the run's token in its hello.

Every socket has LINGER 0 and a hard size cap (ZeroMQ drops a peer that sends more); smaller
oversized messages are rejected by `bridge.protocol.decode` with an error reply.
"""

from __future__ import annotations

import hmac
import os
import secrets
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import zmq

from bridge.curve import ClientCurve, ServerCurve, make_client, make_server, parse_key
from bridge.errors import BridgeError, WaitTimedOut
from bridge.liveness import Silence
from bridge.protocol import E_TIMEOUT, HARD_MAX_MESSAGE_BYTES, MAX_MESSAGE_BYTES

TRANSPORTS = ("ipc", "tcp")
HEARTBEAT_S = 1.0  # a waiting peer hears from the other side at least this often
PEER_TIMEOUT_S = 30.0  # silence after which a peer is presumed dead (process death is caught sooner)
STARTUP_ENV = "PHANTORA_STARTUP_TIMEOUT_S"


def startup_timeout_s(env: dict[str, str] | None = None) -> float:
    """How long a process may take to start (hello -> welcome, which includes an ns-3 import): 180 s, or
    PHANTORA_STARTUP_TIMEOUT_S (a loaded machine importing ns-3 in several workers at once can need more)."""
    raw = (os.environ if env is None else env).get(STARTUP_ENV, "")
    if not raw:
        return 180.0
    try:
        value = float(raw)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise BridgeError(f"{STARTUP_ENV}={raw!r}: give a number of seconds above 0")
    return value


STARTUP_TIMEOUT_S = startup_timeout_s()  # read once, at import, by every process of the run


def process_log(role: str) -> Callable[[str], None]:
    """A logger that writes '[phantora ROLE PID] text' lines to stderr (the supervisor keeps them in the run's logs)."""

    def log(text: str) -> None:
        print(f"[phantora {role} {os.getpid()}] {text}", file=sys.stderr, flush=True)

    return log


RUN_DIR_PREFIX = "phantora-run-"
OWNER_FILE = "owner"  # "<pid> <start time>" of the process that made the directory


class RejectionLog:
    """Counts rejected messages and logs the first `first` of them, then one line per `every` more: a
    peer (or an attacker) sending garbage cannot fill the disk with the log."""

    def __init__(self, log: Callable[[str], None], first: int = 20, every: int = 1000) -> None:
        self.log, self.first, self.every = log, first, every
        self.count = 0

    def __call__(self, text: str) -> None:
        self.count += 1
        if self.count <= self.first:
            self.log(f"rejected a message: {text}")
            if self.count == self.first:
                self.log(f"(further rejections are counted, and logged once per {self.every})")
        elif self.count % self.every == 0:
            self.log(f"rejected {self.count} messages so far; the latest: {text}")


def make_run_dir(parent: str | Path | None = None) -> Path:
    """A fresh private directory (0700) for the run's sockets and set-up file, marked with its owner.

    Directories that dead owners left behind (a launcher killed with SIGKILL) are removed first.
    """
    remove_stale_run_dirs(parent)
    path = Path(tempfile.mkdtemp(prefix=RUN_DIR_PREFIX, dir=parent))
    os.chmod(path, 0o700)
    (path / OWNER_FILE).write_text(f"{os.getpid()} {_start_time(os.getpid())}\n")
    return path


def _start_time(pid: int) -> str:
    """The process's start time in clock ticks since boot (/proc/PID/stat field 22): with the pid, it
    names one process, even after the pid is reused. Empty if the process does not exist."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat.rsplit(")", 1)[1].split()[19]


def _owner_alive(path: Path) -> bool:
    """False only when the directory names its owner and that process is gone; True when unsure."""
    try:
        pid_text, start = (path / OWNER_FILE).read_text().split()
        pid = int(pid_text)
    except (OSError, ValueError):
        return True  # no owner recorded (or being written): never remove what might be live
    return _start_time(pid) == start


def remove_stale_run_dirs(parent: str | Path | None = None) -> list[Path]:
    """Remove this user's run directories in `parent` (default: the temp directory) whose owner is dead."""
    root = Path(parent or tempfile.gettempdir())
    removed = []
    for path in root.glob(RUN_DIR_PREFIX + "*"):
        try:
            mine = path.is_dir() and not path.is_symlink() and path.stat().st_uid == os.getuid()
        except OSError:
            continue
        if mine and not _owner_alive(path):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def remove_run_dir(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def new_token() -> str:
    """A per-run random token (128 bits, hex)."""
    return secrets.token_hex(16)


def token_ok(given: str, expected: str) -> bool:
    """Constant-time token comparison."""
    return hmac.compare_digest(given.encode(), expected.encode())


NETWORK_OPT_IN = "PHANTORA_BRIDGE_NETWORK"  # =1: tcp may bind and connect beyond loopback (with CurveZMQ)
CURVE_ALWAYS = "PHANTORA_BRIDGE_CURVE"  # =1: Ray-placed workers use CurveZMQ on loopback too
LOOPBACK = "127.0.0.1"


def network_allowed() -> bool:
    return os.environ.get(NETWORK_OPT_IN) == "1"


def curve_always() -> bool:
    return os.environ.get(CURVE_ALWAYS) == "1"


def beyond_loopback(address: str) -> bool:
    """True for a tcp address or endpoint on any interface but 127.0.0.1."""
    return address.startswith("tcp://") and not address.startswith(f"tcp://{LOOPBACK}:")


def bind_address(transport: str, run_dir: Path, name: str, host: str = LOOPBACK) -> str:
    """Where a server socket binds: ``ipc://<run_dir>/<name>.sock`` or ``tcp://HOST:*`` (HOST: loopback unless
    the network opt-in is set)."""
    if transport == "ipc":
        return f"ipc://{run_dir / (name + '.sock')}"
    if transport == "tcp":
        if host != LOOPBACK and not network_allowed():
            raise BridgeError(
                f"refusing to bind {host}: the bridge binds 127.0.0.1 unless {NETWORK_OPT_IN}=1 (then with CurveZMQ)"
            )
        return f"tcp://{host}:*"
    raise BridgeError(f"unknown transport {transport!r} (known: {', '.join(TRANSPORTS)})")


def _common(sock: zmq.Socket, hard_max: int = HARD_MAX_MESSAGE_BYTES) -> zmq.Socket:
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.MAXMSGSIZE, hard_max)
    return sock


def bind_router(
    ctx: zmq.Context, address: str, max_bytes: int = MAX_MESSAGE_BYTES, curve: ServerCurve | None = None
) -> tuple[zmq.Socket, str]:
    """A ROUTER bound at `address`; returns it and the concrete endpoint peers connect to.

    Messages up to 4 x `max_bytes` reach the application (which rejects those over `max_bytes`
    with an error reply); ZeroMQ drops a peer that sends more. With `curve` it is a CURVE server (its
    context needs the allow-list's ZAP handler, `bridge.curve.start_authenticator`); beyond loopback it must be.
    """
    if curve is None and beyond_loopback(address):
        raise BridgeError(f"refusing to bind {address} without CurveZMQ (beyond loopback the bridge encrypts)")
    sock = _common(ctx.socket(zmq.ROUTER), 4 * max_bytes)
    sock.setsockopt(zmq.ROUTER_MANDATORY, 0)
    if curve is not None:
        make_server(sock, curve)
    sock.bind(address)
    endpoint = sock.getsockopt_string(zmq.LAST_ENDPOINT)
    if endpoint.startswith("ipc://"):
        os.chmod(endpoint[len("ipc://") :], 0o600)
    return sock, endpoint


OUTCOME_MAX_BYTES = 1 << 32  # the run's outcome (every flow of a large run) from the authenticated coordinator


def connect_dealer(
    ctx: zmq.Context,
    endpoint: str,
    hard_max: int = HARD_MAX_MESSAGE_BYTES,
    curve: ClientCurve | None = None,
    connect: bool = True,
) -> zmq.Socket:
    """A DEALER connected to `endpoint` (ipc, loopback tcp, or any tcp with the network opt-in and `curve`, the
    server's public key and ours). `connect=False`: checked and set up, the caller connects (after attaching a
    monitor, say)."""
    if beyond_loopback(endpoint):
        if not network_allowed():
            raise BridgeError(f"refusing to connect to {endpoint}: the bridge uses 127.0.0.1 unless {NETWORK_OPT_IN}=1")
        if curve is None:
            raise BridgeError(f"refusing to connect to {endpoint} without its CurveZMQ server key")
    sock = _common(ctx.socket(zmq.DEALER), hard_max)
    if curve is not None:
        make_client(sock, curve)
    if connect:
        sock.connect(endpoint)
    return sock


def send_heartbeat(sock: zmq.Socket, raw: bytes) -> bool:
    """Send a heartbeat without ever blocking; False if it was dropped. A DEALER blocks once its peer has left
    the high-water mark of messages unread (a network server inside one long ns-3 call reads nothing): a
    heartbeat queued behind a thousand others tells that peer nothing, and a sender blocked on it could not
    hear from its other peers nor keep its own silence limits."""
    try:
        sock.send(raw, zmq.NOBLOCK)
    except zmq.Again:
        return False
    return True


def write_endpoint_file(run_dir: Path, name: str, endpoint: str, key: bytes | None = None) -> None:
    """Publish an endpoint atomically (write + rename) so a waiting launcher never reads half of it; a CURVE
    server's public key goes first, beside it in NAME.key (0600)."""
    if key is not None:
        ktmp = run_dir / f".{name}.key.tmp"
        ktmp.touch(mode=0o600)
        ktmp.write_bytes(key)
        ktmp.rename(key_file(run_dir, name))
    tmp = run_dir / f".{name}.tmp"
    tmp.write_text(endpoint)
    tmp.rename(run_dir / f"{name}.endpoint")


def endpoint_file(run_dir: Path, name: str) -> Path:
    return run_dir / f"{name}.endpoint"


def key_file(run_dir: Path, name: str) -> Path:
    """Where a CURVE server publishes its public key, beside its endpoint."""
    return run_dir / f"{name}.key"


def read_server_key(run_dir: Path, name: str) -> bytes | None:
    """The public key published beside endpoint `name`, or None when the server is not a CURVE server."""
    path = key_file(run_dir, name)
    if not path.exists():
        return None
    try:
        return parse_key(path.read_bytes(), str(path))
    except ValueError as exc:
        raise BridgeError(str(exc)) from None


def recv_within(
    sock: zmq.Socket, timeout_s: float, what: str, silence: Silence | None = None, deadline: float | None = None
) -> list[bytes]:
    """One multipart message, or BridgeError(timeout) naming `what` after `timeout_s` of silence. With `silence`
    (the peer's `bridge.liveness.Silence`), only the seconds the peer spends silent and idle count. With `deadline`
    (a `time.monotonic()` instant), WaitTimedOut once it passes with no message."""
    t0 = time.monotonic()
    if silence is not None:
        silence.heard()  # the wait starts now: a peer owes no word to a rank that was busy itself
    while True:
        left = timeout_s - (silence.silent_s() if silence is not None else time.monotonic() - t0)
        if left <= 0:
            idle = " (nor any sign of work)" if silence is not None else ""
            raise BridgeError(f"no word from {what} for {timeout_s:.0f} s{idle}", code=E_TIMEOUT)
        if deadline is not None:
            if time.monotonic() >= deadline:
                raise WaitTimedOut(f"no answer from {what} by the wait's deadline")
            left = min(left, deadline - time.monotonic())
        if sock.poll(int(min(left, HEARTBEAT_S) * 1000) + 1, zmq.POLLIN):
            return sock.recv_multipart()
