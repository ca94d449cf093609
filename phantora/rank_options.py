"""Options of a rank process, passed by the launcher in environment variables (torch-free).

The contract between the launcher (which writes them) and the rank runtime (`phantora.runtime`, which reads
them); it lives below both, so the launcher imports nothing of the runtime.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from phantora.errors import InputError

DEFAULT_LAUNCH_NS = 1000  # per-kernel launch overhead charged on top of the roofline time
COMPUTE_MODELS = ("calibrated", "roofline")  # phantora.runtime.compute; the first is the default
# A long run's compute ops in trace.json: the first N steps' (`phantora run --trace-steps`); a step of a small model
# records thousands, about 1 MB of trace a second of wall, so a run of hours wrote gigabytes that the launcher copied
# when it ended and that Perfetto cannot open
DEFAULT_TRACE_STEPS = 200
TRACE_LEVELS = ("ops", "coarse", "none")  # phantora.runtime.trace: every op, merged blocks, steps and comms only
# The options a rank reads at import, before its script (simcuda.preload: the simulated device's C++ part loads before
# torch); the others are read when the rank starts its script, so a fork server's start-up does not include them
IMPORT_TIME_ENV = ("PHANTORA_SIM_CUDA", "PYTHONHASHSEED")
PROGRAM_SEED_ENV = "PHANTORA_PROGRAM_SEED"  # the run's program seed (`--program-seed`; runtime/program_seed.py)
DEFAULT_PROGRAM_SEED = 0
RANDOM_SEED = "random"  # no seeding: each interpreter's own random seeds
MAX_PROGRAM_SEED = 2**32 - 1  # PYTHONHASHSEED's and numpy's legacy seed's range


def import_time_env(env: dict[str, str]) -> dict[str, str]:
    """The variables of `env` a rank reads at import (`IMPORT_TIME_ENV`): a fork server starts with them."""
    return {k: env[k] for k in IMPORT_TIME_ENV if k in env}


def check_trace_level(level: str) -> None:
    """InputError unless `level` is one of TRACE_LEVELS."""
    if level not in TRACE_LEVELS:
        raise InputError(f"trace level must be one of {', '.join(TRACE_LEVELS)}, got {level!r}", field="trace")


def check_trace_steps(steps: int) -> None:
    """InputError unless `steps` (`--trace-steps`: the steps whose compute ops are traced) is >= 0 (0: every step)."""
    if steps < 0:
        raise InputError(f"expected a step count >= 0 (0: every step), got {steps}", field="--trace-steps")


def parse_program_seed(value: str | int) -> int | str:
    """`--program-seed`: an integer 0..2**32-1, or "random"; InputError naming the option otherwise."""
    if isinstance(value, str) and value.strip().lower() == RANDOM_SEED:
        return RANDOM_SEED
    try:
        number = value if isinstance(value, int) and not isinstance(value, bool) else int(str(value).strip(), 10)
    except ValueError:
        number = -1
    if not 0 <= number <= MAX_PROGRAM_SEED:
        raise InputError(
            f"expected an integer 0..{MAX_PROGRAM_SEED} or {RANDOM_SEED!r}, got {value!r}", field="--program-seed"
        )
    return number


@dataclass
class Options:
    """GPU model, launch overhead, trace level, output directory, time patch, network ('none': no bridge)."""

    gpu: str = "h100"
    launch_ns: int = DEFAULT_LAUNCH_NS
    trace: str = "ops"
    trace_steps: int = 0  # compute ops traced for the first N steps only, later steps' steps and comms (0: all)
    out_dir: str | None = None
    time_patch: bool = True
    network: str = "flow"
    report_us: float = 200.0  # compute ops report the clock to the bridge at most this often (real us)
    compute_model: str = COMPUTE_MODELS[0]  # "calibrated" or "roofline" (phantora.runtime.compute)
    perf_tables: tuple[str, ...] = ()  # measured tables (CSV) that take priority over the calibrated model
    curves: str | None = None  # curves JSON from `phantora calibrate --out`; None: the shipped curves
    public_fit: bool = True  # the public per-GPU fit (phantora.perfmodel.pubfit) times the classes it has data for
    phantom: bool = False  # meta tensors: no data, no host memory (phantora.runtime.phantom)
    sim_cuda: bool = False  # the simulated CUDA device (phantora.runtime.simcuda); `phantora run` turns it on
    start_ns: int = 0  # the rank's clock starts here (a job that starts later in a run of several jobs)
    max_steps: int | None = None  # end the script after this many steps (a job's step count)
    priority: str = "none"  # traffic class policy of collectives: none | layer | tensor-size (runtime/traffic.py)
    dlcp: str = "off"  # loss-tolerant collectives: off | grads
    dlcp_bound: float = 0.01  # share of a loss-tolerant collective's bytes the network may drop
    scenario: str | None = None  # a scenario TOML: the rank's slow-GPU windows, step reports (runtime/rank_scenario)
    program_seed: int | str = DEFAULT_PROGRAM_SEED  # seeds the program's generators, or "random" (program_seed.py)
    hash_seed: str | None = None  # PYTHONHASHSEED of the rank interpreters (None: the environment's, or random)

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> Options:
        env = dict(os.environ if env is None else env)
        return cls(
            gpu=env.get("PHANTORA_GPU", "h100"),
            launch_ns=int(env.get("PHANTORA_LAUNCH_NS", DEFAULT_LAUNCH_NS)),
            trace=env.get("PHANTORA_TRACE", "ops"),
            trace_steps=int(env.get("PHANTORA_TRACE_STEPS", "0")),
            out_dir=env.get("PHANTORA_OUT") or None,
            time_patch=env.get("PHANTORA_TIME_PATCH", "1") not in ("0", "false", "no"),
            network=env.get("PHANTORA_NETWORK", "flow"),
            report_us=float(env.get("PHANTORA_REPORT_US", "200")),
            compute_model=env.get("PHANTORA_COMPUTE_MODEL", COMPUTE_MODELS[0]),
            perf_tables=tuple(p for p in env.get("PHANTORA_PERF_TABLES", "").split(os.pathsep) if p),
            curves=env.get("PHANTORA_CURVES") or None,
            public_fit=env.get("PHANTORA_PUBLIC_FIT", "1") not in ("0", "false", "no"),
            phantom=env.get("PHANTORA_PHANTOM", "0") in ("1", "true", "yes"),
            sim_cuda=env.get("PHANTORA_SIM_CUDA", "0") in ("1", "true", "yes"),
            start_ns=int(env.get("PHANTORA_START_NS", "0")),
            max_steps=int(env["PHANTORA_MAX_STEPS"]) if env.get("PHANTORA_MAX_STEPS") else None,
            priority=env.get("PHANTORA_PRIORITY", "none"),
            dlcp=env.get("PHANTORA_DLCP", "off"),
            dlcp_bound=float(env.get("PHANTORA_DLCP_BOUND", "0.01")),
            scenario=env.get("PHANTORA_SCENARIO") or None,
            program_seed=parse_program_seed(env.get(PROGRAM_SEED_ENV, str(DEFAULT_PROGRAM_SEED))),
            hash_seed=env.get("PYTHONHASHSEED"),
        )

    def to_env(self) -> dict[str, str]:
        env = {
            "PHANTORA_GPU": self.gpu,
            "PHANTORA_LAUNCH_NS": str(self.launch_ns),
            "PHANTORA_TRACE": self.trace,
            "PHANTORA_TIME_PATCH": "1" if self.time_patch else "0",
            "PHANTORA_REPORT_US": str(self.report_us),
        }
        if self.trace_steps:
            env["PHANTORA_TRACE_STEPS"] = str(self.trace_steps)
        if self.out_dir:
            env["PHANTORA_OUT"] = str(self.out_dir)
        env["PHANTORA_COMPUTE_MODEL"] = self.compute_model
        env["PHANTORA_PUBLIC_FIT"] = "1" if self.public_fit else "0"
        env["PHANTORA_PHANTOM"] = "1" if self.phantom else "0"
        env["PHANTORA_SIM_CUDA"] = "1" if self.sim_cuda else "0"
        if self.perf_tables:
            env["PHANTORA_PERF_TABLES"] = os.pathsep.join(str(p) for p in self.perf_tables)
        if self.curves:
            env["PHANTORA_CURVES"] = str(self.curves)
        if self.start_ns:
            env["PHANTORA_START_NS"] = str(self.start_ns)
        if self.max_steps is not None:
            env["PHANTORA_MAX_STEPS"] = str(self.max_steps)
        if self.priority != "none":
            env["PHANTORA_PRIORITY"] = self.priority
        if self.dlcp != "off":
            env["PHANTORA_DLCP"] = self.dlcp
            env["PHANTORA_DLCP_BOUND"] = repr(float(self.dlcp_bound))
        if self.scenario:
            env["PHANTORA_SCENARIO"] = str(self.scenario)
        env[PROGRAM_SEED_ENV] = str(self.program_seed)
        if self.hash_seed is not None:
            env["PYTHONHASHSEED"] = self.hash_seed
        return env
