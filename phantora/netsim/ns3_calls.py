"""A call script: the PhantoraNetwork calls of one packet-level run, replayable by `phantora-ns3-runner`.

One call per line (`LoadLibrary PATH` of a user's CC library first, if any; `SetParam PATH TEXT`,
`AddNode KIND`, `AddLink A B BPS DELAY_NS`, `Finalize`,
`AddFlow ID SRC DST SIZE START PRIO KEY DELAY_NS DPORT VIA_NIC [DEP ...]` (VIA_NIC 1: a flow through the
NICs, `Flow.via_nic`; else 0), `SetLossBudget ID BYTES`,
`SetMaxRate ID BPS`, `SetConnection ID CONN`, `SetQueue ID QUEUE`, `ScheduleLinkState NS LINK UP`,
`ScheduleLinkDegrade NS LINK BPS EXTRA_NS LOSS SEED`, `ScheduleReconverge NS`,
`SetThrottle NODE START_NS END_NS FACTOR`, `ThrottleFromFlow ID NODE DURATION_NS FACTOR`, `ExemptFromThrottle ID`,
`RunUntil NS`). The runner makes the
same calls in the same order, then runs until every flow is acknowledged, so a run that submits its
flows up front (`phantora netsim`) gives byte-identical fct.txt and pfc.txt without Python.

The first line names the script's version. Version 1 scripts (before VIA_NIC) still replay as they ran: the
runner reads a flow through the NICs from bit 62 of their KEY word, where ns-3 took it then.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Any

HEADER = "# phantora ns-3 call script 2: replay with ns3-scratch/build/phantora-ns3-runner SCRIPT OUTDIR\n"


class RecordedNetwork:
    """A PhantoraNetwork whose state-changing calls are also written to a call script."""

    _RECORDED = frozenset(
        {
            "SetParam",
            "AddNode",
            "AddLink",
            "Finalize",
            "AddFlow",
            "SetLossBudget",
            "SetMaxRate",
            "SetConnection",
            "SetQueue",
            "ScheduleLinkState",
            "ScheduleLinkDegrade",
            "ScheduleReconverge",
            "SetThrottle",
            "ThrottleFromFlow",
            "ExemptFromThrottle",
            "RunUntil",
        }
    )

    def __init__(self, net: Any, path: Path, libraries: Sequence[Path] = ()) -> None:
        """`libraries`: the user's CC libraries the network was loaded with; the script loads them first."""
        self._net = net
        self._out: IO[str] = path.open("w", encoding="utf-8")
        self._out.write(HEADER)
        for lib in libraries:
            self._out.write(f"LoadLibrary {lib}\n")

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._net, name)
        if name not in self._RECORDED:
            return attr

        def call(*args: Any) -> Any:
            result = attr(*args)
            self._out.write(" ".join([name, *_words(name, args)]) + "\n")
            return result

        return call

    def Close(self) -> None:  # noqa: N802 - the C++ method's name
        self._out.close()
        self._net.Close()

    def __enter__(self) -> RecordedNetwork:
        return self

    def __exit__(self, exc_type: type | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.Close()


def _words(name: str, args: tuple[Any, ...]) -> list[str]:
    """A call's arguments as script words; AddFlow's dependency vector goes last."""
    if name != "AddFlow":
        return [str(int(a)) if isinstance(a, bool) else repr(a) if isinstance(a, float) else str(a) for a in args]
    fid, src, dst, size, start, prio, key, deps, delay, dport, via_nic = args
    return [str(v) for v in (fid, src, dst, size, start, prio, key, delay, dport, int(via_nic), *list(deps))]
