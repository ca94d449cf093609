"""The NCCL environment variables users set to force a choice, parsed as NCCL parses them.

`NCCL_ALGO` and `NCCL_PROTO` take NCCL's list syntax: ``"Ring,Tree"``, ``"^NVLS"`` (everything but), and per function
``"ring;allreduce:tree,nvls"`` (the first list may lack a prefix and applies to every function). Names are
case-insensitive. The other variables are integers; sizes take NCCL's plain byte counts.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache

from phantora.collectives.nccl import tables as T
from phantora.collectives.nccl.pci_paths import UNSET, p2p_level_of
from phantora.collectives.nccl.register_env import cta_policy_of, register_of, sym_kernel_of
from phantora.errors import InputError

ENV_VARS = (
    "NCCL_ALGO",
    "NCCL_PROTO",
    "NCCL_MIN_NCHANNELS",
    "NCCL_MAX_NCHANNELS",
    "NCCL_MIN_CTAS",
    "NCCL_MAX_CTAS",
    "NCCL_MIN_NRINGS",
    "NCCL_MAX_NRINGS",
    "NCCL_BUFFSIZE",
    "NCCL_LL_BUFFSIZE",
    "NCCL_LL128_BUFFSIZE",
    "NCCL_NVLS_ENABLE",
    "NCCL_P2P_NET_CHUNKSIZE",
    "NCCL_P2P_NVL_CHUNKSIZE",
    "NCCL_MIN_P2P_NCHANNELS",
    "NCCL_MAX_P2P_NCHANNELS",
    "NCCL_NVLS_NCHANNELS",
    "NCCL_PAT_ENABLE",
    "NCCL_PXN_DISABLE",
    "NCCL_NET_SHARED_COMMS",
    "NCCL_NET_OVERHEAD",
    "NCCL_NVLS_CHUNKSIZE",
    "NCCL_NVLSTREE_MAX_CHUNKSIZE",
    "NCCL_IB_QPS_PER_CONNECTION",
    "NCCL_IB_SPLIT_DATA_ON_QPS",
    "NCCL_NCHANNELS_PER_NET_PEER",
    "NCCL_P2P_DISABLE",
    "NCCL_P2P_LEVEL",
    "NCCL_SHM_DISABLE",
    "NCCL_NET_DISABLE_INTRA",
    "PHANTORA_NCCL_VERSION",
    "PHANTORA_NCCL_REGISTER",
    "NCCL_LOCAL_REGISTER",
    "NCCL_WIN_ENABLE",
    "NCCL_SYM_KERNEL",
    "NCCL_SYM_CTAS",
    "NCCL_CTA_POLICY",
    "NCCL_GIN_ENABLE",
    "NCCL_GIN_TYPE",
    "NCCL_SYM_GIN_KERNELS_ENABLE",
    "NCCL_SYM_RS_GIN_CHUNK_SIZE",
    "NCCL_SYM_CE_THRESHOLD",
    "NCCL_NUM_RMA_CTX",
    "NCCL_CROSS_NIC",
    "NCCL_P2P_EPOCH_ENABLE",
    "NCCL_P2P_SCHEDULE_GROUP_SIZE",
)
CE_THRESHOLD = 8 * 1024 * 1024  # enqueue.cc NCCL_PARAM(SymCeThreshold), in elements
IB_MAX_QPS = 128  # net_ib: NCCL_IB_MAX_QPS
SCHED_GROUP = 8  # init.cc NCCL_PARAM(GroupSize, "P2P_SCHEDULE_GROUP_SIZE", NCCL_MAX_DEV_WORK_P2P_PER_BATCH)
Enabled = tuple[tuple[str, frozenset[str]], ...]  # (function, enabled names), every function


@dataclass(frozen=True)
class NcclSettings:
    """What the user forced through NCCL's environment variables (defaults: nothing forced)."""

    algos: Enabled = ()  # empty: every algorithm enabled
    protos: Enabled = ()  # empty: every protocol enabled (LL128 where NCCL enables it)
    protos_forced: bool = False  # NCCL_PROTO was set (then LL128 is not limited to where NCCL enables it)
    min_channels: int = 0
    min_ctas: int = 0  # NCCL_MIN_CTAS alone: it also raises the NVLS CTAs (nvls.cc clamps them to [min, max] CTAs)
    max_channels: int = T.MAX_CHANNELS
    max_ctas: int = T.MAX_CHANNELS  # NCCL_MAX_CTAS alone: the NVLS CTAs' maximum (NCCL_MAX_NCHANNELS is not)
    buffsize: int = 0  # NCCL_BUFFSIZE, the Simple buffer; 0: NCCL's 4 MiB
    ll_buffsize: int = 0  # NCCL_LL_BUFFSIZE; 0: NCCL's (tables.DEFAULT_BUFFSIZE)
    ll128_buffsize: int = 0  # NCCL_LL128_BUFFSIZE; 0: NCCL's
    nvls: bool = True  # NCCL_NVLS_ENABLE=0 turns NVLink SHARP off
    nvls_channels: int = 0  # 0: NCCL's default for the architecture
    pat: bool = True
    pxn: bool = True  # NCCL_PXN_DISABLE=1 turns the relay of cross-rail sends off
    shared_comms: bool = True  # NCCL_NET_SHARED_COMMS (net.cc, default 1): a proxy's receives from one peer on a
    # channel share a receive comm and are posted as one irecv, one clear-to-send (`DagBuilder.grouped_cts`)
    p2p_net_chunk: int = T.P2P_CHUNK["net"]
    p2p_nvl_chunk: int = T.P2P_CHUNK["nvlink"]
    net_overhead_ns: int = -1  # NCCL_NET_OVERHEAD (ns); -1: NCCL's default for the hosts' CPU
    nvls_chunk: int = 0  # NCCL_NVLS_CHUNKSIZE: NVLS's largest chunk; 0: NCCL's (chunking.nvls_chunk_of)
    nvls_tree_max_chunk: int = 0  # NCCL_NVLSTREE_MAX_CHUNKSIZE; 0: NCCL's (64 KiB from 4 nodes, else the NVLS chunk)
    qps_per_conn: int = 1  # NCCL_IB_QPS_PER_CONNECTION: queue pairs of each network connection
    split_data_on_qps: bool = False  # NCCL_IB_SPLIT_DATA_ON_QPS: each message over every QP (else one, in turn;
    # the default follows the NCCL that runs: _split_data_on_qps)
    net_peer_channels: int = 0  # NCCL_NCHANNELS_PER_NET_PEER: p2p channels per remote peer; 0: NCCL's own sizing
    min_p2p_channels: int = 1  # NCCL_MIN_P2P_NCHANNELS: the least p2p channels (paths.cc), before pow2Up
    max_p2p_channels: int = T.MAX_CHANNELS  # NCCL_MAX_P2P_NCHANNELS: the most, before the least and pow2Up
    nccl_version: tuple[int, int] = T.MODEL_NCCL_VERSION  # PHANTORA_NCCL_VERSION: the NCCL whose tuner picks
    nccl_release: tuple[int, int, int] = (*T.MODEL_NCCL_VERSION, 0)  # with its patch (0: none named); counts only
    # while its (major, minor) is nccl_version's (tuning.running_release, old_tuners.py)
    p2p_level: int = UNSET  # NCCL_P2P_DISABLE=1 (PATH_LOC) or NCCL_P2P_LEVEL: the farthest path P2P may take
    shm: bool = True  # NCCL_SHM_DISABLE=1 turns the SHM transport (GPU pairs without P2P) off
    net_intra: bool = True  # NCCL_NET_DISABLE_INTRA=1: no NET between GPUs of one host (net_split.py)
    register: int = 0  # PHANTORA_NCCL_REGISTER: the buffers' registration, as nccl-tests -R sets it (register.py)
    local_register: bool = True  # NCCL_LOCAL_REGISTER=0: NCCL ignores ncclCommRegister'd buffers
    win_enable: bool = True  # NCCL_WIN_ENABLE=0: no symmetric windows (no symmetric kernels)
    sym_kernel: str = ""  # NCCL_SYM_KERNEL: the one symmetric kernel allowed ("" or "^": all)
    sym_ctas: int = 0  # NCCL_SYM_CTAS: a symmetric kernel's CTAs (0: its cost model's)
    cta_policy: int = 0  # NCCL_CTA_POLICY as NCCL parses it (register.cta_policy_of): bits EFFICIENCY 1, ZERO 2
    gin_enable: bool = True  # NCCL_GIN_ENABLE=0: NCCL fails to connect GIN (register.gin_available)
    gin_type: int = -1  # NCCL_GIN_TYPE: the GIN plugin type NCCL may take (-1 any, 2 proxy, 3 GDAKI)
    sym_gin_kernels: bool = True  # NCCL_SYM_GIN_KERNELS_ENABLE=0: no symmetric kernel across hosts (2.29.7+)
    sym_rs_gin_chunk: int = -1  # NCCL_SYM_RS_GIN_CHUNK_SIZE: the GIN reduce-scatter's chunk (2.30.7+; sym_gin.py)
    sym_ce_threshold: int = CE_THRESHOLD  # NCCL_SYM_CE_THRESHOLD: elements a rank above which a Blackwell
    # all-gather on symmetric windows runs on the copy engines (2.29.2+, enqueue.cc; ce_coll.py)
    num_rma_ctx: int = 1  # NCCL_NUM_RMA_CTX: RMA contexts (0: no RMA proxy, no hierarchical CE; ce_coll.py)
    p2p_epoch: bool = True  # NCCL_P2P_EPOCH_ENABLE=0: a p2p batch may hold two passes (2.29.2+; p2p_plans.py)
    p2p_sched_group: int = SCHED_GROUP  # NCCL_P2P_SCHEDULE_GROUP_SIZE: the p2p schedule's rank groups across nodes
    # (2.28.7+ only; 2.28.9+ not on one node: p2p_schedule.group_size)
    cross_nic: int = 2  # NCCL_CROSS_NIC: 0 leaves no RMA proxy (init.cc globalRmaProxySupport) and no full GIN
    raw: tuple[tuple[str, str], ...] = ()  # the variables as set, for the record

    def algo_enabled(self, kind: str, algo: str) -> bool:
        return _enabled(self.algos, kind, algo)

    def proto_enabled(self, kind: str, proto: str) -> bool:
        return _enabled(self.protos, kind, proto)


def _enabled(table: Enabled, kind: str, name: str) -> bool:
    for func, names in table:
        if func == kind:
            return name in names
    return True


def parse_list(value: str, names: tuple[str, ...], var: str) -> Enabled:
    """NCCL's `parseList`: function -> the enabled subset of `names` (canonical spellings)."""
    lookup = {n.lower(): n for n in names}
    funcs = {v.lower(): k for k, v in T.NCCL_FUNC_NAMES.items()}
    table = {k: frozenset(names) for k in T.NCCL_FUNC_NAMES}
    for i, entry in enumerate(value.split(";")):
        prefix, sep, items = entry.partition(":")
        if not sep:
            if i:
                raise InputError(f"{var}={value!r}: every entry but the first needs a 'function:' prefix", field=var)
            prefix, items = "", entry
        if prefix and prefix.strip().lower() not in funcs:
            known = ", ".join(T.NCCL_FUNC_NAMES.values())
            raise InputError(f"{var}={value!r}: unknown function {prefix!r} (known: {known})", field=var)
        negate = items.startswith("^")
        chosen = set()
        for item in (items[1:] if negate else items).split(","):
            if item.strip().lower() not in lookup:
                raise InputError(f"{var}={value!r}: unknown name {item!r} (known: {', '.join(names)})", field=var)
            chosen.add(lookup[item.strip().lower()])
        enabled = frozenset(names) - chosen if negate else frozenset(chosen)
        for func in [funcs[prefix.strip().lower()]] if prefix else list(table):
            table[func] = enabled
    return tuple(sorted(table.items()))


def _rma_ctx(env: Mapping[str, str]) -> int:
    """NCCL_NUM_RMA_CTX as init.cc takes it: a value below 0 leaves the config's (1)."""
    n = _int(env, "NCCL_NUM_RMA_CTX", 1, low=-(2**31))
    return n if n >= 0 else 1


def _int(env: Mapping[str, str], var: str, default: int, low: int = 0) -> int:
    text = env.get(var)
    if text is None or text == "":
        return default
    try:
        value = int(text, 0)
    except ValueError:
        raise InputError(f"{var}={text!r} is not an integer", field=var) from None
    if value < low:
        raise InputError(f"{var}={text!r} must be at least {low}", field=var)
    return value


INT_MAX = 2**31 - 1  # comm->buffSizes[] are C ints (comm.h)


def _buffsize(env: Mapping[str, str], var: str) -> int:
    """A protocol's buffer in bytes as init.cc `computeBuffSizes` takes it: any value but -2 (ncclParam's unset,
    so NCCL's default: 0 here) is the size, unchecked. A size below one byte or beyond an int cannot be a buffer
    (NCCL would divide by its zero step or wrap it negative): refused. A small one is NCCL's (`chunking`)."""
    text = env.get(var, "").strip()
    if not text:
        return 0
    try:
        value = int(text, 0)
    except ValueError:
        raise InputError(f"{var}={text!r} is not an integer", field=var) from None
    if value == -2:
        return 0
    if value < 1 or value > INT_MAX:
        raise InputError(
            f"{var}={text!r}: a buffer size in bytes from 1 to {INT_MAX} (or -2, NCCL's default)", field=var
        )
    return value


def _flag(env: Mapping[str, str], var: str) -> int:
    """A 0/1 variable (0 when unset)."""
    text = env.get(var, "").strip()
    if text not in ("", "0", "1"):
        raise InputError(f"{var}={text!r}: expected 0 or 1", field=var)
    return int(text or 0)


def _sched_group(env: Mapping[str, str]) -> int:
    """NCCL_P2P_SCHEDULE_GROUP_SIZE as init.cc's ncclP2pSchedule takes it (an int, 8 by default). Below 1 NCCL
    divides by it (0) or indexes ranks by a negative remainder: refused, as is a value beyond an int."""
    var = "NCCL_P2P_SCHEDULE_GROUP_SIZE"
    group = _int(env, var, SCHED_GROUP, 1)
    if group > INT_MAX:
        raise InputError(f"{var}={env[var]!r}: a rank count from 1 to {INT_MAX}", field=var)
    return group


def _qps(env: Mapping[str, str]) -> int:
    qps = _int(env, "NCCL_IB_QPS_PER_CONNECTION", 1, 1)
    if qps > IB_MAX_QPS:
        var = "NCCL_IB_QPS_PER_CONNECTION"
        raise InputError(f"{var}={qps} is more than NCCL's {IB_MAX_QPS}", field=var)
    return qps


NEWEST_PATCH = 99  # a minor named alone: its newest release (as old_tuners.NEWEST_PATCH)
SPLIT_QPS_VARIABLE_FROM = (2, 18, 0)  # net_ib.cc reads NCCL_IB_SPLIT_DATA_ON_QPS from v2.18.1-1 (default 1)
SPLIT_QPS_OFF_FROM = (2, 20, 0)  # ... and defaults it to 0 from v2.20.3-1


def _split_data_on_qps(env: Mapping[str, str]) -> bool:
    """Whether net_ib posts each message over every queue pair of its connection (`ncclIbMultiSend`) for the NCCL
    that runs (PHANTORA_NCCL_VERSION; a minor named alone is its newest patch): always before v2.18.1-1, which has
    no NCCL_IB_SPLIT_DATA_ON_QPS; then the variable, 1 by default up to 2.19 and 0 from v2.20.3-1 (each message
    whole on the next queue pair in turn)."""
    major, minor, patch = nccl_release_of(env)
    release = (major, minor, patch or NEWEST_PATCH)
    if release < SPLIT_QPS_VARIABLE_FROM:
        return True
    return _int(env, "NCCL_IB_SPLIT_DATA_ON_QPS", 1 if release < SPLIT_QPS_OFF_FROM else 0) != 0


OLDEST_NCCL_VERSION = (2, 17)  # old_tuners.py diffs every tag from v2.17.1-1


def nccl_release_of(env: Mapping[str, str]) -> tuple[int, int, int]:
    """PHANTORA_NCCL_VERSION (`2.26`, `2.26.2` or `2.26.2-1`): the (major, minor, patch) of the NCCL that ran, patch
    0 where it names none; unset: the NCCL whose model phantora restates (tables.MODEL_NCCL_VERSION, patch 0)."""
    var = "PHANTORA_NCCL_VERSION"
    text = env.get(var, "").strip().lstrip("v")
    if not text:
        return (*T.MODEL_NCCL_VERSION, 0)
    m = re.fullmatch(r"(\d+)\.(\d+)(?:\.(\d+))?(?:-\d+)?", text)
    if m is None:
        raise InputError(f"{var}={text!r} is not an NCCL version such as 2.26.2", field=var)
    major, minor = int(m.group(1)), int(m.group(2))
    if not OLDEST_NCCL_VERSION <= (major, minor) <= T.MODEL_NCCL_VERSION:
        raise InputError(
            f"{var}={text!r}: the model restates the tuners of NCCL 2.17 to 2.30 (old_tuners.py), not this one",
            field=var,
        )
    return major, minor, int(m.group(3) or 0)


def _cta_policy_names(release: tuple[int, int, int]) -> bool:
    """NCCL_CTA_POLICY takes names from 2.29.2 (init.cc getEnvCtaPolicyOnce; a bare 2.29 is its newest patch)."""
    return release[:2] > (2, 29) or (release[:2] == (2, 29) and (release[2] == 0 or release[2] >= 2))


def nccl_version_of(env: Mapping[str, str]) -> tuple[int, int]:
    """The (major, minor) of `nccl_release_of`: what the model's choices depend on."""
    major, minor, _ = nccl_release_of(env)
    return major, minor


def _net_peer_channels(env: Mapping[str, str]) -> int:
    """NCCL_NCHANNELS_PER_NET_PEER; NCCL ignores a value of 0 or less (init.cc: "too low"), so 0 means unset."""
    text = env.get("NCCL_NCHANNELS_PER_NET_PEER", "")
    try:
        return max(0, int(text, 0)) if text else 0
    except ValueError:
        raise InputError(
            f"NCCL_NCHANNELS_PER_NET_PEER={text!r} is not an integer", field="NCCL_NCHANNELS_PER_NET_PEER"
        ) from None


def nccl_env(env: Mapping[str, str] | None = None) -> tuple[tuple[str, str], ...]:
    """The NCCL_* variables phantora honours, as set in `env` (default: this process's environment)."""
    env = os.environ if env is None else env
    return tuple((k, env[k]) for k in ENV_VARS if k in env)


RUN_ENV = "PHANTORA_NCCL_ENV"  # the run's NCCL_* as the coordinator's model holds them: JSON [[name, value], ...]


def run_env_value(env: tuple[tuple[str, str], ...]) -> str:
    """`RUN_ENV`'s value for a run whose model holds `env` (the launcher sets it for every rank;
    runtime/program_env.py reads it)."""
    return json.dumps([list(kv) for kv in env])


def settings_from_env(env: Mapping[str, str] | None = None) -> NcclSettings:
    """NcclSettings from the NCCL_* variables of `env` (default: this process's environment)."""
    return settings_of(nccl_env(env))


@lru_cache(maxsize=64)
def settings_of(pairs: tuple[tuple[str, str], ...]) -> NcclSettings:
    """NcclSettings from (variable, value) pairs (cached: one parse per distinct environment)."""
    raw = pairs
    env = dict(pairs)
    nccl_algos = tuple(T.NCCL_ALGO_NAMES.values())
    algos: Enabled = ()
    if env.get("NCCL_ALGO"):
        named = parse_list(env["NCCL_ALGO"], (*nccl_algos, "CollNetDirect", "CollNetChain"), "NCCL_ALGO")
        back = {v: k for k, v in T.NCCL_ALGO_NAMES.items()}
        algos = tuple((f, frozenset(back[n] for n in s if n in back)) for f, s in named)
    protos = parse_list(env["NCCL_PROTO"], T.PROTOCOLS, "NCCL_PROTO") if env.get("NCCL_PROTO") else ()
    # connect.cc: MIN/MAX_NCHANNELS (legacy MIN/MAX_NRINGS) and the communicator's minCTAs/maxCTAs (NCCL_MIN_CTAS /
    # NCCL_MAX_CTAS, init.cc, which lowers minCTAs to maxCTAs) both bound comm->nChannels: the larger minimum and
    # the smaller maximum win, and the minimum is applied last (copyChannels), so it wins over the maximum
    max_ctas = min(_int(env, "NCCL_MAX_CTAS", T.MAX_CHANNELS, 1), T.MAX_CHANNELS)
    min_ctas = min(_int(env, "NCCL_MIN_CTAS", 0), max_ctas)
    legacy_max = _int(env, "NCCL_MAX_NRINGS", T.MAX_CHANNELS, 1)
    max_ch = min(_int(env, "NCCL_MAX_NCHANNELS", legacy_max, 1), max_ctas)
    legacy_min = _int(env, "NCCL_MIN_NRINGS", 0)
    min_ch = max(_int(env, "NCCL_MIN_NCHANNELS", legacy_min), min_ctas)
    return NcclSettings(
        algos=algos,
        protos=protos,
        protos_forced=bool(protos),
        min_channels=min(min_ch, T.MAX_CHANNELS),
        min_ctas=min_ctas,
        max_channels=max_ch,
        max_ctas=max_ctas,
        buffsize=_buffsize(env, "NCCL_BUFFSIZE"),
        ll_buffsize=_buffsize(env, "NCCL_LL_BUFFSIZE"),
        ll128_buffsize=_buffsize(env, "NCCL_LL128_BUFFSIZE"),
        nvls=_int(env, "NCCL_NVLS_ENABLE", 2) != 0,
        nvls_channels=_int(env, "NCCL_NVLS_NCHANNELS", 0),
        pat=_int(env, "NCCL_PAT_ENABLE", 2) != 0,
        pxn=_int(env, "NCCL_PXN_DISABLE", 0) == 0,
        shared_comms=_int(env, "NCCL_NET_SHARED_COMMS", 1) != 0,
        p2p_net_chunk=_int(env, "NCCL_P2P_NET_CHUNKSIZE", T.P2P_CHUNK["net"], 1),
        p2p_nvl_chunk=_int(env, "NCCL_P2P_NVL_CHUNKSIZE", T.P2P_CHUNK["nvlink"], 1),
        net_overhead_ns=_int(env, "NCCL_NET_OVERHEAD", -1),
        nvls_chunk=_int(env, "NCCL_NVLS_CHUNKSIZE", 0, 1),
        nvls_tree_max_chunk=_int(env, "NCCL_NVLSTREE_MAX_CHUNKSIZE", 0, 1),
        qps_per_conn=_qps(env),
        split_data_on_qps=_split_data_on_qps(env),
        net_peer_channels=_net_peer_channels(env),
        min_p2p_channels=_int(env, "NCCL_MIN_P2P_NCHANNELS", 1),
        max_p2p_channels=_int(env, "NCCL_MAX_P2P_NCHANNELS", T.MAX_CHANNELS),
        nccl_version=nccl_version_of(env),
        nccl_release=nccl_release_of(env),
        p2p_level=p2p_level_of(env.get("NCCL_P2P_DISABLE"), env.get("NCCL_P2P_LEVEL")),
        shm=_flag(env, "NCCL_SHM_DISABLE") == 0,
        net_intra=_int(env, "NCCL_NET_DISABLE_INTRA", 0, low=-(2**31)) != 1,  # paths.cc: exactly 1 turns it off
        register=register_of(env),
        local_register=_int(env, "NCCL_LOCAL_REGISTER", 1) != 0,
        win_enable=_int(env, "NCCL_WIN_ENABLE", 1) != 0,
        sym_kernel=sym_kernel_of(env),
        sym_ctas=_int(env, "NCCL_SYM_CTAS", 0),
        cta_policy=cta_policy_of(env, names=_cta_policy_names(nccl_release_of(env))),
        gin_enable=_int(env, "NCCL_GIN_ENABLE", 1) != 0,
        gin_type=_int(env, "NCCL_GIN_TYPE", -1, low=-1),
        sym_gin_kernels=_int(env, "NCCL_SYM_GIN_KERNELS_ENABLE", 1) != 0,
        p2p_epoch=_int(env, "NCCL_P2P_EPOCH_ENABLE", 1, -(2**63)) != 0,
        p2p_sched_group=_sched_group(env),
        sym_rs_gin_chunk=_int(env, "NCCL_SYM_RS_GIN_CHUNK_SIZE", -1, low=-1),
        sym_ce_threshold=_int(env, "NCCL_SYM_CE_THRESHOLD", CE_THRESHOLD),
        num_rma_ctx=_rma_ctx(env),
        cross_nic=_int(env, "NCCL_CROSS_NIC", 2, low=-(2**31)),
        raw=raw,
    )
