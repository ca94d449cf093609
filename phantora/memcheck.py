"""Will a real-mode run fit in this machine's memory? A one-step phantom probe says so before the ranks start.

In real mode every rank holds, in host memory, three parts:
- its tensors' data: what the simulated GPU holds (parameters, gradients, optimizer state, activations: the
  device-memory tracker's peak, runtime/memory.py);
- what the real CPU kernels hold beyond their outputs where a GPU's fused kernel holds nothing: FlexAttention's
  reference, sliced by queries (runtime/flex_chunks.py), holds about 6.5 score matrices of a slice at its peak;
- the process itself (interpreter, torch, phantora, the program's own objects).
Freed tensor data is not a fourth part: a real-mode rank has glibc map each block of 128 KiB or more on its own and
return it when freed (procmem.return_freed_memory). Before, glibc kept freed blocks of up to 32 MiB in its heap,
which this estimate did not count: it was 7-11 % low (docs/runtime.md, "Host memory").
A phantom run holds no tensor data, so one step of it, run first with the same ranks, measures all three: each
rank's device-memory peak, the largest attention slice its shapes ask for, and its own proportional set size.
Their sum over the ranks estimates the real run's host memory; `phantora run --memory-check` compares it with the
memory available now (/proc/meminfo MemAvailable), says so in one line and, with `--tensors auto`, runs in phantom
mode when the ranks would not fit.

Not counted: host memory a program keeps outside its GPU tensors (CPU copies, a data loader's buffers) beyond the
first step, and the workspace of CPU kernels other than FlexAttention's (SDPA runs the CPU flash kernel, which
holds blocks, not the score matrix).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from phantora.errors import InputError

MEMINFO = Path("/proc/meminfo")
GIB = 2**30


@dataclass(frozen=True)
class Estimate:
    """Host memory a real-mode run needs, per rank, and what the machine has free (None: unknown)."""

    device_peak: tuple[int, ...]  # bytes: the simulated GPU's peak of each rank (its tensors' data in real mode)
    process: tuple[int, ...]  # bytes: each phantom rank process's proportional set size (no tensor data)
    available: int | None
    workspace: tuple[int, ...] = ()  # bytes: each rank's real CPU kernels' own peak (FlexAttention's slices)

    @property
    def total(self) -> int:
        return sum(self.device_peak) + sum(self.workspace) + sum(self.process)

    def fits(self) -> bool:
        return self.available is None or self.total <= self.available

    def line(self, switched: bool = False) -> str:
        """The one line `phantora run --memory-check` prints."""
        n = len(self.device_peak)
        parts = [f"{max(self.device_peak, default=0) / GIB:.2f} GiB of tensors"]
        if any(self.workspace):
            parts.append(f"{max(self.workspace) / GIB:.2f} GiB of CPU attention workspace")
        parts.append(f"{max(self.process, default=0) / GIB:.2f} GiB of process")
        need = (
            f"real mode needs about {self.total / GIB:.1f} GiB of host memory for {n} rank{'s' if n != 1 else ''} "
            f"({', '.join(parts[:-1])} and {parts[-1]} at most per rank, from a one-step phantom probe)"
        )
        if self.available is None:
            return f"memory check: {need}; this machine does not say how much is free"
        have = f"{self.available / GIB:.1f} GiB available"
        if self.fits():
            return f"memory check: {need}; {have}: it fits"
        if switched:
            return f"memory check: {need}, more than the {have}: running in phantom mode (--tensors auto)"
        return (
            f"memory check: {need}, more than the {have}: run with --phantom (shapes only, no tensor data), fewer "
            "ranks (--nproc) or a smaller configuration"
        )


def available_bytes(meminfo: Path = MEMINFO) -> int | None:
    """MemAvailable of /proc/meminfo in bytes; None where the kernel does not tell it."""
    try:
        for line in meminfo.read_text().splitlines():
            name, _, rest = line.partition(":")
            if name == "MemAvailable":
                value, *unit = rest.split()
                return int(value) * (1024 if unit == ["kB"] else 1)
    except (OSError, ValueError):
        return None
    return None


def estimate(ranks: dict[int, Any], available: int | None) -> Estimate:
    """The estimate from a phantom probe's rank results (`peak_bytes` of `memory`, `pss_mb`)."""
    peaks, procs, work = [], [], []
    for r in sorted(ranks):
        res = ranks[r]
        if not isinstance(res, dict) or "pss_mb" not in res or "memory" not in res:
            raise InputError(f"the memory probe's rank {r} gave no memory results", field="memory_check")
        peaks.append(int(res["memory"].get("peak_bytes", 0)))
        procs.append(int(float(res["pss_mb"]) * 2**20))
        work.append(int(res.get("host_workspace_bytes", 0)))
    return Estimate(tuple(peaks), tuple(procs), available, tuple(work))


def probe(cfg: Any) -> Estimate:
    """Run one step of `cfg` (a launcher RunConfig) in phantom mode, every rank live, saving nothing."""
    from phantora.launcher import launch

    one_step = dataclasses.replace(
        cfg,
        tensors="phantom",
        dedup="off",
        out_dir=None,
        trace="none",
        on_step=None,
        env={**cfg.env, "PHANTORA_MAX_STEPS": "1"},
    )
    return estimate(launch(one_step).cosim.ranks, available_bytes())


def checked(cfg: Any, world: int) -> tuple[Any, str | None]:
    """`cfg` after the memory check of a run of `world` ranks, and the line to print (None: nothing checked,
    as phantom mode holds no tensor data). With `--tensors auto`, a run that would not fit runs phantom."""
    from phantora.launcher import PHANTOM_ABOVE

    if cfg.tensors == "phantom" or (cfg.tensors == "auto" and world > PHANTOM_ABOVE):
        return cfg, None
    est = probe(cfg)
    switch = not est.fits() and cfg.tensors == "auto"
    return (dataclasses.replace(cfg, tensors="phantom") if switch else cfg), est.line(switched=switch)
