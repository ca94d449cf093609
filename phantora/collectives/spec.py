"""What a collective is, and the knobs of its decomposition into flows."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Protocol

from phantora.collectives.launch_group import At, LaunchGroup, Pair
from phantora.errors import InputError
from phantora.perfmodel.dtypes import COLLECTIVE_DTYPES, dtype_bytes, normalize_dtype

KINDS = (
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "broadcast",
    "reduce",
    "all_to_all",
    "send_recv",
    "barrier",
)
ALGORITHMS = (
    "auto",
    "ring",
    "tree",
    "hierarchical",
    "chain",
    "pairwise",
    "direct",
    "nvls",
    "nvls_tree",
    "pat",
    "sym",
    "ce",
)
PROTOCOLS = ("auto", "LL", "LL128", "Simple")
# reductions: nccl-tests' -o names (mulsum: ncclRedOpCreatePreMulSum, torch's PREMUL_SUM), then torch's bitwise ops,
# which NCCL lacks but phantora's process group runs (collectives/nccl/redop.py)
REDOPS = ("sum", "prod", "max", "min", "avg", "mulsum", "band", "bor", "bxor")
REDUCING = ("all_reduce", "reduce_scatter", "reduce")  # the kinds that take a reduction
GROUPED_KINDS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce")  # NCCL's collective tasks
MODELS = ("nccl", "ideal")
GRANULARITIES = ("coarse", "chunked")  # one flow per connection and algorithm step, or NCCL's steps and chunks
DTYPE_BYTES = {short: dtype_bytes(normalize_dtype(short)) for short in COLLECTIVE_DTYPES}

# busbw factor of nccl-tests, as a function of the group size n.
BUSBW_FACTOR = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
    "send_recv": lambda n: 1.0,
    "barrier": lambda n: 1.0,
}


@dataclass(frozen=True)
class Collective:
    """One collective call. `ranks` are global ranks (topology endpoint indices), in group order.

    `nbytes` follows nccl-tests: the size of the full buffer (all-reduce/broadcast/reduce: the
    tensor; all-gather: the gathered output; reduce-scatter: the input; all-to-all: the whole
    send buffer of one rank; send_recv: the message, ranks = (src, dst)).
    """

    kind: str
    ranks: tuple[int, ...]
    nbytes: int
    dtype: str = "bf16"
    root: int | None = None  # group-local index for broadcast/reduce
    # send_recv inside a group (batch_isend_irecv): the communicator it runs on, its ranks in group order; ()
    # for a lone send/recv on its own 2-rank communicator
    comm: tuple[int, ...] = ()
    # a grouped send/recv: the (src, dst) of every transfer of its NCCL group, its own among them, all in flight at
    # once (nccl-tests' sendrecv_perf); () when the group is not known
    inflight: tuple[tuple[int, int], ...] = ()
    # (src, dst, start offset ns, bytes) of the pairs in `inflight` that start at another time than this one (a
    # rank whose group launch ran later: NCCL runs a pair once both peers' kernels run) or move other bytes; the
    # pairs not named start with it and move its nbytes
    inflight_at: tuple[tuple[int, int, int, int], ...] = ()
    # the reduction (REDOPS) of an all-reduce, reduce-scatter or reduce: NCCL's symmetric kernels reduce only a float
    # sum, NVLS / NVLS-Tree and PAT only some ops and datatypes (collectives/nccl/redop.py); its cost is a sum's
    redop: str = "sum"
    # a grouped send/recv: its NCCL group as one object shared by the launch's pairs (bridge/p2p_batch.py), its own
    # pair among them with its start and these nbytes; instead of `inflight` / `inflight_at`, which copy the group
    # for each pair (n(n-1) entries each in a world-size group)
    launch: LaunchGroup | None = None
    # which of its pair's operations in `launch` this send/recv is (0: the first; NCCL runs a pair's in turn)
    launch_op: int = 0
    # an all-to-all called as NCCL's ncclAlltoAll (2.28+, as nccl-tests' alltoall_perf calls it), which NCCL may run
    # on the copy engines (nccl/ce_coll.py); False: a group of sends and receives, as torch's all_to_all_single runs
    # it with NCCL (ProcessGroupNCCL calls ncclAllToAll only with NCCLX's NCCL_ALLTOALL_SUPPORTED)
    alltoall_api: bool = False
    # nccl-tests' -m: the equal calls of this collective's NCCL group, itself among them (nbytes: one call's), run as
    # one launch: one symmetric kernel (2.28+, nccl/register.py; 2.27 runs none symmetric), else NCCL's legacy
    # kernels on the calls' aggregate, its tuner's choice for their total (nccl/coll_group.py). The choice's `works`
    # says so and its flows carry them all (decompose.py); an all-to-all's or send/recv's calls are each peer's
    # operations one after another on one call's channels, in one launch (nccl/p2p_calls.py)
    group_calls: int = 1
    # the bytes of each call of its NCCL group, given one by one (a torch coalesced call: its tensors'; decompose
    # sets it for group_calls too), all of this kind and reduction; nbytes is their sum. () for a lone call
    group_sizes: tuple[int, ...] = ()
    # each of those calls' dtype where they differ (a coalesced call's tensors of mixed dtypes: NCCL aggregates per
    # type, decompose.group_aggregates); () where all are `dtype`
    group_dtypes: tuple[str, ...] = ()
    # a device block's calls of several kinds, reductions or roots in one NCCL group (runtime/coalesce_block.py):
    # each call's kind, reduction and root (group-local; None for a kind without one), beside group_sizes, the first
    # this collective's own; () where all are `kind`, `redop`, `root`. Decomposed as one plan (group_plans.py)
    group_kinds: tuple[str, ...] = ()
    group_redops: tuple[str, ...] = ()
    group_roots: tuple[int | None, ...] = ()
    # one of the aggregates NCCL keeps apart in a group of calls (decompose.group_aggregates): the bytes of every
    # call of that group, its own among them (NCCL rates every aggregate with numPipeOps from the group's calls);
    # () otherwise
    plan_sizes: tuple[int, ...] = ()
    # such an aggregate's bytes of count on each channel NCCL's plan deals it, lowest first: its calls dealt on
    # from where the plan's aggregates before it stopped (nccl/coll_group.deal_plan); () to deal it alone
    dealt_parts: tuple[int, ...] = ()
    # the NCCL channel the first of `dealt_parts` is on: its channel k runs channel dealt_from + k's ring or tree
    dealt_from: int = 0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise InputError(f"unknown collective kind {self.kind!r} (known: {', '.join(KINDS)})", field="kind")
        if self.nbytes < 0:
            raise InputError(f"collective size must be >= 0, got {self.nbytes}", field="bytes")
        if not self.ranks:
            raise InputError("a collective needs at least one rank", field="ranks")
        if len(set(self.ranks)) != len(self.ranks):
            raise InputError(f"repeated rank in {list(self.ranks)}", field="ranks")
        if self.dtype not in DTYPE_BYTES:
            raise InputError(f"unknown dtype {self.dtype!r} (known: {', '.join(DTYPE_BYTES)})", field="dtype")
        if self.redop not in REDOPS:
            raise InputError(f"unknown reduction {self.redop!r} (known: {', '.join(REDOPS)})", field="redop")
        if self.kind == "send_recv" and len(self.ranks) != 2:
            raise InputError("send_recv takes exactly two ranks (src, dst)", field="ranks")
        if self.comm and (self.kind != "send_recv" or not set(self.ranks) <= set(self.comm)):
            raise InputError(
                f"comm {list(self.comm)} is for a send_recv whose two ranks it holds ({self.kind} {list(self.ranks)})",
                field="comm",
            )
        if len(set(self.comm)) != len(self.comm):
            raise InputError(f"repeated rank in comm {list(self.comm)}", field="comm")
        if self.inflight and (
            not self.comm
            or tuple(self.ranks) not in self.inflight
            or len(set(self.inflight)) != len(self.inflight)
            or not {r for pair in self.inflight for r in pair} <= set(self.comm)
        ):
            raise InputError(
                f"inflight {[list(p) for p in self.inflight]} must be distinct (src, dst) pairs of comm, this "
                f"send_recv's {list(self.ranks)} among them",
                field="inflight",
            )
        if self.launch is not None:
            self._check_launch(self.launch)
        elif self.launch_op:
            raise InputError(f"launch_op {self.launch_op} needs a launch group", field="launch_op")
        known = set(self.inflight)
        if self.inflight_at and (
            any((a, b) not in known or n < 0 for a, b, _, n in self.inflight_at)
            or len({(a, b) for a, b, _, _ in self.inflight_at}) != len(self.inflight_at)
        ):
            raise InputError(
                f"inflight_at {[list(p) for p in self.inflight_at]} must name distinct pairs of inflight, with bytes "
                ">= 0",
                field="inflight_at",
            )
        if self.group_sizes and (
            self.group_calls != 1
            or sum(self.group_sizes) != self.nbytes
            or min(self.group_sizes) < 0
            or self.kind in ("all_to_all", "send_recv", "barrier")
        ):
            raise InputError(
                f"group_sizes {list(self.group_sizes)} must be the >= 0 bytes of a {self.kind}'s calls, summing to "
                f"its {self.nbytes} bytes, without group_calls (all-to-all, send/recv and barrier take none)",
                field="group_sizes",
            )
        if self.group_dtypes and (
            len(self.group_dtypes) != len(self.group_sizes)
            or not set(self.group_dtypes) <= set(DTYPE_BYTES)
            or self.group_dtypes[0] != self.dtype
        ):
            raise InputError(
                f"group_dtypes {list(self.group_dtypes)} must name a known dtype for each of group_sizes' "
                f"{len(self.group_sizes)} calls, the first `dtype` ({self.dtype})",
                field="group_dtypes",
            )
        if self.plan_sizes and (
            len(self.plan_sizes) < 2 or min(self.plan_sizes) < 0 or sum(self.plan_sizes) < self.nbytes
        ):
            raise InputError(
                f"plan_sizes {list(self.plan_sizes)} must be the >= 0 bytes of the 2 or more calls of a group this "
                f"{self.nbytes}-byte aggregate is part of",
                field="plan_sizes",
            )
        if self.dealt_from < 0 or (self.dealt_from and not self.dealt_parts):
            raise InputError(
                f"dealt_from {self.dealt_from} must be the >= 0 channel its dealt_parts start at", field="dealt_from"
            )
        if self.root is not None and not 0 <= self.root < len(self.ranks):
            raise InputError(f"root {self.root} is not a group-local index of {len(self.ranks)} ranks", field="root")
        self._check_mixed()

    def _check_mixed(self) -> None:
        """`group_kinds`, `group_redops`, `group_roots`: one a call of `group_sizes`, the first this call's."""
        n = len(self.group_sizes)
        for name, got, own in (
            ("group_kinds", self.group_kinds, self.kind),
            ("group_redops", self.group_redops, self.redop),
            ("group_roots", self.group_roots, self.root),
        ):
            if got and (len(got) != n or got[0] != own):
                raise InputError(
                    f"{name} {list(got)} must give each of group_sizes' {n} calls its value, the first {own!r}",
                    field=name,
                )
        if set(self.group_kinds) - set(GROUPED_KINDS):
            raise InputError(
                f"group_kinds {list(self.group_kinds)}: a group's calls are of {', '.join(GROUPED_KINDS)}",
                field="group_kinds",
            )
        if set(self.group_redops) - set(REDOPS):
            raise InputError(f"group_redops {list(self.group_redops)}: unknown reduction", field="group_redops")
        if any(r is not None and not 0 <= r < len(self.ranks) for r in self.group_roots):
            raise InputError(
                f"group_roots {list(self.group_roots)}: not group-local indices of {len(self.ranks)} ranks",
                field="group_roots",
            )

    def mixed(self) -> bool:
        """Whether the group's calls differ in kind, reduction or root (one plan of several collectives)."""
        return bool(self.group_kinds or self.group_redops or self.group_roots)

    def _check_launch(self, g: LaunchGroup) -> None:
        """`launch`'s checks: of the group on the communicator once for the launch, then of this pair's entry."""
        if self.inflight or self.inflight_at:
            raise InputError(
                "a send_recv takes its group as launch or as inflight / inflight_at, not both", field="launch"
            )
        if not self.comm or not g.cached(("on comm", self.comm), lambda: g.ranks <= set(self.comm)):
            raise InputError(f"launch's pairs must be pairs of comm {list(self.comm)}", field="launch")
        ops = g.ops((self.ranks[0], self.ranks[1]))
        if not 0 <= self.launch_op < len(ops) or ops[self.launch_op][1] != self.nbytes:
            raise InputError(
                f"launch must hold this send_recv's {list(self.ranks)} with its {self.nbytes} bytes as its operation "
                f"{self.launch_op}",
                field="launch",
            )

    @cached_property
    def in_flight(self) -> LaunchGroup | None:
        """A grouped send/recv's NCCL group (`launch`, or the one `inflight` / `inflight_at` name, its own pair
        starting at 0 with its nbytes); None when it is not known."""
        if self.launch is not None:
            return self.launch
        if not self.inflight:
            return None
        return LaunchGroup.relative((self.ranks[0], self.ranks[1]), self.nbytes, self.inflight, self.inflight_at)

    def relative(self) -> tuple[tuple[Pair, ...], tuple[At, ...]]:
        """Its group relative to its own start and bytes, as `inflight` and `inflight_at` name it."""
        if self.launch is None:
            return self.inflight, self.inflight_at
        return self.launch.answer((self.ranks[0], self.ranks[1]))

    @property
    def size(self) -> int:
        return len(self.ranks)

    def busbw_factor(self) -> float:
        return BUSBW_FACTOR[self.kind](self.size) if self.size > 1 else 1.0


class NicCharging(Protocol):
    """What an engine (`EngineSpec`) tells the planner of the NIC latency it charges: L ns to each flow it carries
    between two endpoints, and whether a flow inside one NVSwitch is one of them."""

    @property
    def nic_latency_ns(self) -> int: ...

    @property
    def nic_on_nvlink(self) -> bool: ...


# A plain gloo group's call (runtime backend.py `gloo_sync`), live and replayed: not an NCCL call, so its overrides
# leave the NCCL model (no NCCL kernel: no launch of an empty send, nor of an empty collective before NCCL 2.20); its
# zero bytes then make no flows.
HOST_MODEL = "ideal"
HOST_ALGO: dict[str, Any] = {"model": HOST_MODEL}


@dataclass(frozen=True)
class AlgoOptions:
    """How to decompose.

    `model="nccl"` (default) runs each collective as NCCL would (`collectives/nccl/`): NCCL's algorithm, protocol
    and channel choice, the protocol's bytes on the wire, its latency as flow delay and its throughput as a
    per-flow rate cap. `algorithm`/`protocol` other than auto restrict that choice, as NCCL_ALGO/NCCL_PROTO do;
    `nccl_env` holds the NCCL_* variables honoured (None: this process's environment). `model="ideal"` is the
    plain decomposition: line rate, no protocol, `step_latency_ns` only.
    """

    algorithm: str = "auto"  # auto: NCCL's choice (ideal model: ring for RS/AG/AR, chain, pairwise)
    granularity: str = "coarse"  # coarse: one flow per ring edge; chunked: NCCL steps
    channels: int = 0  # 0 = NCCL's channel count (ideal model: by group size and topology)
    chunk_bytes: int = 4 * 512 * 1024  # ALLREDUCE_CHUNKSTEPS x step (512 KiB)
    step_latency_ns: int = 0  # extra per-step software latency charged as flow delay
    model: str = "nccl"  # nccl | ideal
    protocol: str = "auto"  # auto | LL | LL128 | Simple (nccl model)
    nccl_env: tuple[tuple[str, str], ...] | None = None  # NCCL_* variables; None: read from os.environ
    # The engine's NIC latency (ns3 with --set nic_latency; `on_engine`): NCCL's measured latency holds it, so the
    # delays net it out on an idle chain, as the propagation; `nic_on_nvlink`: flows inside an NVSwitch pay it too
    nic_latency_ns: int = 0
    nic_on_nvlink: bool = True

    def __post_init__(self) -> None:
        if self.model not in MODELS:
            raise InputError(f"unknown model {self.model!r} (known: {', '.join(MODELS)})", field="model")
        if self.protocol not in PROTOCOLS:
            raise InputError(f"unknown protocol {self.protocol!r} (known: {', '.join(PROTOCOLS)})", field="protocol")
        if self.nccl_env is not None and not isinstance(self.nccl_env, tuple):  # from JSON: a list of pairs
            object.__setattr__(self, "nccl_env", tuple((str(k), str(v)) for k, v in self.nccl_env))
        if self.algorithm not in ALGORITHMS:
            raise InputError(
                f"unknown algorithm {self.algorithm!r} (known: {', '.join(ALGORITHMS)})", field="algorithm"
            )
        if self.granularity not in GRANULARITIES:
            raise InputError(
                f"granularity must be one of {', '.join(GRANULARITIES)}, got {self.granularity!r}", field="granularity"
            )
        if self.channels < 0:
            raise InputError(f"channels must be >= 0, got {self.channels}", field="channels")
        if self.chunk_bytes <= 0:
            raise InputError(f"chunk_bytes must be > 0, got {self.chunk_bytes}", field="chunk_bytes")
        if self.step_latency_ns < 0:
            raise InputError(f"step_latency_ns must be >= 0, got {self.step_latency_ns}", field="step_latency_ns")
        if isinstance(self.nic_latency_ns, bool) or not isinstance(self.nic_latency_ns, int) or self.nic_latency_ns < 0:
            raise InputError(
                f"nic_latency_ns must be an integer >= 0, got {self.nic_latency_ns!r}", field="nic_latency_ns"
            )

    def on_engine(self, engine: NicCharging) -> AlgoOptions:
        """These options for a run on `engine` (an `EngineSpec`): its NIC latency, and whether NVLink flows pay it."""
        return dataclasses.replace(self, nic_latency_ns=engine.nic_latency_ns, nic_on_nvlink=engine.nic_on_nvlink)
