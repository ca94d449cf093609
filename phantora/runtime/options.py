"""Options of a rank process, passed by the launcher in environment variables (torch-free)."""

from __future__ import annotations

import os
from dataclasses import dataclass

DEFAULT_LAUNCH_NS = 1000  # per-kernel launch overhead charged on top of the roofline time


@dataclass
class Options:
    """GPU model, launch overhead, trace level, output directory, time patch, network ('none': no bridge)."""

    gpu: str = "h100"
    launch_ns: int = DEFAULT_LAUNCH_NS
    trace: str = "ops"
    out_dir: str | None = None
    time_patch: bool = True
    network: str = "flow"
    report_us: float = 200.0  # compute ops report the clock to the bridge at most this often (real us)

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> Options:
        env = dict(os.environ if env is None else env)
        return cls(
            gpu=env.get("PHANTORA_GPU", "h100"),
            launch_ns=int(env.get("PHANTORA_LAUNCH_NS", DEFAULT_LAUNCH_NS)),
            trace=env.get("PHANTORA_TRACE", "ops"),
            out_dir=env.get("PHANTORA_OUT") or None,
            time_patch=env.get("PHANTORA_TIME_PATCH", "1") not in ("0", "false", "no"),
            network=env.get("PHANTORA_NETWORK", "flow"),
            report_us=float(env.get("PHANTORA_REPORT_US", "200")),
        )

    def to_env(self) -> dict[str, str]:
        env = {
            "PHANTORA_GPU": self.gpu,
            "PHANTORA_LAUNCH_NS": str(self.launch_ns),
            "PHANTORA_TRACE": self.trace,
            "PHANTORA_TIME_PATCH": "1" if self.time_patch else "0",
            "PHANTORA_REPORT_US": str(self.report_us),
        }
        if self.out_dir:
            env["PHANTORA_OUT"] = str(self.out_dir)
        return env
