"""While a thread the program started lives, the rank's GPU ops run one at a time (dispatch.py `_turns`), and the
program's own ops keep the compiled entry (simcuda/_fastop.c), which holds the lock from the op's start to its end.

In one process, as a rank sets it up: the mode entered on the program's thread, `gpu_threads.install`'s
`Thread.start`. Under the roofline model an add of two 2^20-element fp32 tensors moves 3 x 4 MiB through HBM: it
takes A = ceil(12 MiB / bandwidth) ns plus the launch overhead. Beside a live thread that ran only host work (a
DataLoader's pin-memory thread) the program's add is charged A on the compute lane without the Python route
(`_off_thread`), holding the lock while it is charged (after its kernel ran); with the thread ended, it runs
without the lock. An add of the program's that starts while a thread's add holds the lock waits for it to end,
through either entry (the Python one runs without `_fastop`).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from phantora.perfmodel.gpus import get_gpu
from phantora.rank_options import DEFAULT_LAUNCH_NS
from phantora.runtime import gpu_threads
from phantora.runtime.compute import Roofline
from phantora.runtime.dispatch import ChargeMode
from phantora.runtime.nonet import NoNetworkClient
from phantora.runtime.session import RankSession
from phantora.runtime.simcuda import compiled, device
from phantora.runtime.simcuda.tensor import SimCudaTensor

N = 1 << 20
ADD_NS = math.ceil(3 * 4 * N / get_gpu("h100").mem_bw * 1e9) + DEFAULT_LAUNCH_NS


@pytest.fixture
def mode(monkeypatch: pytest.MonkeyPatch) -> Iterator[ChargeMode]:
    if compiled.load() is None:
        pytest.skip("the compiled fast path is not built (scripts/setup.sh)")
    monkeypatch.setattr(device, "_installed", True)  # what simcuda.install sets in a rank (no device guard here)
    monkeypatch.setattr(threading.Thread, "start", threading.Thread.start)  # put back after the test
    session = RankSession(0, 1, NoNetworkClient(), Roofline(get_gpu("h100")), trace_level="none")
    m = ChargeMode(session)
    gpu_threads.install(m, lambda: session.clock.compute_ns)
    off: list[int] = []  # the threads whose ops took the Python route's `_off_thread`
    python_route = ChargeMode._off_thread

    def counted(self: ChargeMode, *args: Any) -> Any:
        off.append(threading.get_ident())
        return python_route(self, *args)

    monkeypatch.setattr(ChargeMode, "_off_thread", counted)
    m.off = off  # type: ignore[attr-defined]
    yield m


def _watch_charges(mode: ChargeMode) -> list[tuple[bool, bool]]:
    """Each charge of the program's ops as it happens: (the lock held, held by the charging thread)."""
    s, seen = mode.session, []

    def charge(name: str, cost: Any) -> None:
        seen.append((mode._lock.locked(), mode._holder == threading.get_ident()))
        type(s).charge(s, name, cost)

    s.charge = charge  # type: ignore[method-assign]  # the compiled path calls a session's own charge
    return seen


def test_beside_a_host_only_thread_the_program_keeps_the_compiled_entry_under_the_lock(mode: ChargeMode) -> None:
    assert type(mode.__dict__["__torch_dispatch__"]).__name__ == "builtin_function_or_method"
    s = mode.session
    a, b = SimCudaTensor(torch.ones(N), 0), SimCudaTensor(torch.full((N,), 2.0), 0)
    ha, hb = torch.ones(4), torch.ones(4)
    ran, done = threading.Event(), threading.Event()

    def pin_memory_like() -> None:
        torch.add(ha, hb)  # host work only
        ran.set()
        done.wait(30)

    seen = _watch_charges(mode)
    with mode:
        t = threading.Thread(target=pin_memory_like)
        t.start()
        assert ran.wait(30)
        start = s.clock.compute_ns
        c = torch.add(a, b)
        assert s.clock.compute_ns - start == ADD_NS
        assert seen == [(True, True)]  # the lock held across the op, by the program's thread
        done.set()
        t.join()
        torch.add(a, b)  # the thread ended: no lock
        assert seen == [(True, True), (False, False)] and s.clock.compute_ns - start == 2 * ADD_NS
    assert mode.off == [t.ident]  # only the thread's host op took the Python route
    assert c.elem[0].item() == 3.0


@pytest.mark.parametrize("entry", ["compiled", "python"])
def test_the_programs_op_waits_for_a_threads_op_holding_the_lock(mode: ChargeMode, entry: str) -> None:
    if entry == "python":  # as without `_fastop`: ChargeMode.__torch_dispatch__ takes the lock itself
        del mode.__dict__["__torch_dispatch__"]
    s = mode.session
    a, b = SimCudaTensor(torch.ones(N), 0), SimCudaTensor(torch.full((N,), 2.0), 0)
    order: list[str] = []
    inside, go = threading.Event(), threading.Event()
    on_lane = type(s).charge_on

    def slow_charge_on(*args: Any) -> None:  # the thread's charge, inside its op: it waits to be let go
        order.append("thread in")
        inside.set()
        go.wait(30)
        order.append("thread out")
        on_lane(s, *args)

    s.charge_on = slow_charge_on  # type: ignore[method-assign]
    seen = _watch_charges(mode)

    def let_go() -> None:  # lets the thread's op end after the program's has started
        if inside.wait(30):
            time.sleep(0.2)
        go.set()

    with mode:
        threading.Thread(target=let_go).start()  # (started first: Thread.start waits for the lock too)
        t = threading.Thread(target=lambda: torch.add(a, b))
        t.start()
        assert inside.wait(30)
        torch.add(a, b)
        order.append("program")
        t.join()
    assert order == ["thread in", "thread out", "program"]  # its op waited for the thread's to end
    assert seen == [(True, True)]
    assert mode.off.count(threading.get_ident()) == (entry == "python")  # the compiled entry's op: not there


def test_phantoras_own_threads_are_not_adopted(mode: ChargeMode) -> None:
    """A send-copies or gloo-lane thread (named `phantora-...`) started from the program's thread does host work for
    the rank: the rank's ops do not go in turn while it lives, and its own ops never reach the mode."""
    s = mode.session
    a, b = SimCudaTensor(torch.ones(N), 0), SimCudaTensor(torch.full((N,), 2.0), 0)
    ha, hb = torch.ones(4), torch.ones(4)
    ran, done = threading.Event(), threading.Event()

    def copies() -> None:
        torch.add(ha, hb)
        ran.set()
        done.wait(30)

    seen = _watch_charges(mode)
    with mode:
        t = threading.Thread(target=copies, name=f"{gpu_threads.OWN}send-copies")
        t.start()
        assert ran.wait(30)
        start = s.clock.compute_ns
        torch.add(a, b)
        done.set()
        t.join()
    assert seen == [(False, False)] and s.clock.compute_ns - start == ADD_NS  # no lock: nothing adopted
    assert mode.off == []  # its host op never saw the mode: plain torch


@pytest.mark.timeout(60)
def test_a_thread_started_inside_an_op_run_in_turn_does_not_deadlock(mode: ChargeMode) -> None:
    """With a thread alive the program's op holds the lock to its end; a thread started inside it (here from its
    charge) is adopted without taking the lock again, and its add, on the default stream, runs in turn after it."""
    s = mode.session
    a, b = SimCudaTensor(torch.ones(N), 0), SimCudaTensor(torch.full((N,), 2.0), 0)
    done = threading.Event()
    inner: list[threading.Thread] = []

    def charge(name: str, cost: Any) -> None:
        if not inner:
            t = threading.Thread(target=lambda: torch.add(a, b))
            inner.append(t)
            t.start()  # inside the program's op, the lock held
        type(s).charge(s, name, cost)

    with mode:
        alive = threading.Thread(target=lambda: done.wait(30))
        alive.start()
        s.charge = charge  # type: ignore[method-assign]
        start = s.clock.compute_ns
        torch.add(a, b)
        del s.charge
        inner[0].join(30)
        done.set()
        alive.join()
    assert not inner[0].is_alive() and s.clock.compute_ns - start == 2 * ADD_NS
