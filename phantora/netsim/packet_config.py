"""`PacketConfig`: every knob of the packet-level (ns-3) network, and a reader for HPCC `config.txt`.

Defaults follow the HPCC RDMA reference models (REFERENCE.md section 5), scaled by link speed where
the reference scales: switch buffer 16*bw/50 MiB (32 MiB at 100G), ECN kmin/kmax 4000/16000 bytes
per Gb/s (400 KB / 1600 KB at 100G), pmax 0.2, headroom 3 x rate x link delay, 4 KB reserve, a
dynamic PFC threshold of free >> 3, 1000-byte payloads with 48 bytes of header.

Every field is an ns-3 attribute of one or more objects of the fabric (`NS3_ATTRIBUTES`, the one
table): `nic.X` of `ns3::RdmaNic`, `switch.X` of `ns3::PfcSwitch`, `fabric.X` of `ns3::PhantoraFabric`,
`recorder.X` of `ns3::FabricRecorder`, and `cc.X` of the CC's own TypeId. `to_params()` lists them as
(attribute path, text) pairs for `PhantoraNetwork::SetParam` (C++); values that are None ("scale
with the fabric") are given as the attribute's 0, which the C++ scales the same way.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from phantora.errors import InputError
from phantora.files import read_text
from phantora.topology.ecmp import ECMP_HASHES
from phantora.units import parse_rate_bps, parse_size_bytes, parse_time_ns

NVLINK_MODES = ("packet", "fluid")
REUSE_MODES = ("off", "on")
QP_MODES = ("connection", "flow")  # a queue pair per connection (Flow.conn; NCCL's persistent ones) or per flow
# Load balancing of data packets at switches and the receiving NIC's transport (docs/packet-model.md, "Load
# balancing and receivers"): per-flow ECMP, per-packet spraying (random, or round robin), flowlets, adaptive.
LB_MODES = ("ecmp", "spray", "spray_rr", "flowlet", "adaptive", "reps", "oblivious")
RX_MODES = ("gbn", "sack", "rud", "rod")


def _wire_preset(payload: int, header: int, ack_interval: int) -> dict[str, int]:
    """Packet sizes and the PFC thresholds that count packets, scaled as HPCC's 1000-byte setting has them:
    a 4 KB reserve (about 4 packets) and a 3 KB resume offset (about 3 packets) per ingress queue."""
    wire = payload + header
    return {
        "payload_bytes": payload,
        "header_bytes": header,
        "ack_interval": ack_interval,
        "reserve_bytes": 4096 if payload == 1000 else 4 * wire,
        "resume_offset_bytes": 3072 if payload == 1000 else 3 * wire,
    }


# `--set wire=NAME`: packet size, headers, ACK coalescing and the PFC thresholds that scale with them, at once
# (later --set fields still override). hpcc: the HPCC models' setting, kept for reference runs (the default).
# roce4k: RoCEv2 as deployed NICs run it: a 4096-byte IB MTU; 62 header bytes (Ethernet 14 + IPv4 20 + UDP 8 +
# BTH 12 + ICRC 4 + FCS 4); the responder coalesces ACKs, one per 4 packets (and on the last one and on every
# CE mark, as always). ECN thresholds are in bytes per Gb/s already and stay.
WIRE_PRESETS: dict[str, dict[str, int]] = {
    "hpcc": _wire_preset(1000, 48, 1),
    "roce4k": _wire_preset(4096, 62, 4),
}
# PacketConfig fields that choose how the engine is put together, or how a live run's ranks mark their
# collectives (traffic class, loss tolerance: phantora.collectives.traffic), rather than set an ns-3 attribute.
ENGINE_FIELDS = (
    "nvlink", "reuse", "priority", "dlcp", "dlcp_bound", "nic_latency", "workers", "ray", "transport", "qp",
    "partition_loopback", "partition", "partition_worker", "partition_timeout_s", "fluid_shards",
    "fluid_chains", "fluid_procs",
)  # fmt: skip
CLASS_SCHEDULERS = ("rr", "strict", "wrr")
KEYED_SCHEDULER = "ns3::PhantoraKeyedScheduler"  # the keyed mode (issue 38): same-ns events by a per-node key
PRIORITY_POLICIES = ("none", "layer", "tensor-size")
DLCP_POLICIES = ("off", "grads")
DLCP_DEFAULT_TRIM_BYTES = 64 * 1024  # trim_bytes when dlcp is on and trim_bytes is not set
HPCC_CC_MODES = {0: "none", 1: "dcqcn", 3: "hpcc", 7: "timely", 8: "dctcp"}

# `--set transport=NAME` (issue 37): the transport as a whole, one flag apart on the same job and fabric (later
# --set fields still override; `transport` records the preset). uet: Ultra Ethernet reliable unordered delivery
# (rx=rud: SACK bitmaps, NACKs of trimmed packets), NSCC, REPS entropies, trimming with the trimmed header in the
# priority class, lossy (no PFC). roce: today's default, go-back-N, PFC, ECMP, no trimming (the CC is left as it
# is: `--cc dcqcn` and `--cc hpcc` are RoCE's; the NSCC a uet preset set goes back to none, an NSCC the user
# chose with --cc stays).
TRANSPORT_PRESETS: dict[str, dict[str, object]] = {
    "uet": {"cc": "nscc", "rx": "rud", "lb": "reps", "pfc": False, "trim_priority": True},
    "roce": {"rx": "gbn", "lb": "ecmp", "pfc": True, "trim_priority": False, "trim_bytes": None},
}
# With transport=uet and no trim_bytes / ECN maps of the user's: the switch queue of htsim's UET runs, one BDP
# (trimmed past it), ECN marking from 0.2 to 0.8 of it, with probability 1 at the top. The BDP is taken at a
# nominal 8 us RTT (a 2-tier fabric of 1 us links): 1000 bytes per Gb/s of the port.
UET_BDP_BYTES_PER_GBPS = 1000


@dataclass
class PacketConfig:
    """Settings of one packet-level run. Sizes in bytes, times in ns, rates in bit/s."""

    cc: str = "none"  # a registered CC name (none, dcqcn, hpcc, ...: phantora cc lists them; cc_registry checks it)
    # Packets.
    payload_bytes: int = 1000
    header_bytes: int = 48  # per-packet overhead on the wire (HPCC's standalone-FCT header size)
    int_header_bytes: int = 42  # INT space in data packets and ACKs when INT is on (5 hops x 8 + 2)
    pfc_bytes: int = 64
    # Switch buffer and PFC.
    pfc: bool = True
    buffer_bytes: int | None = None  # per switch; None = 16 * bw / 50 MiB with bw the fastest port in Gb/s
    reserve_bytes: int = 4096  # per ingress (port, class)
    resume_offset_bytes: int = 3072
    dt_shift: int = 3  # dynamic threshold = free >> dt_shift
    headroom_factor: float = 3.0  # headroom per port = factor * rate * link delay
    headroom_bytes: int | None = None  # fixed headroom per port, overriding the factor
    # ECN marking at dequeue (RED). Maps are {rate_bps: value}; rates not listed scale from 100G.
    ecn: bool = True
    kmin_map: dict[int, int] | None = None  # bytes
    kmax_map: dict[int, int] | None = None  # bytes
    pmax_map: dict[int, float] | None = None
    # NIC.
    ack_interval: int = 1  # an ACK per n in-order packets (always on the last one and on a CE mark)
    ack_delay_ns: int = 1000  # with ack_interval > 1: the longest a packet waits for its coalesced ACK
    ack_high_prio: bool = True  # ACK/NACK in the strict-priority class 0
    nack_interval_ns: int = 500_000  # at most one NACK per hole per interval (HPCC default 500 us)
    rto_ns: int | None = None  # go-back-N timeout; None = off with PFC (lossless), 1 ms without; 0 = off
    global_t: bool = True  # CC gets the fabric-wide max base RTT and BDP (HPCC GLOBAL_T)
    cc_base_rtt_ns: int | None = None  # override the base RTT handed to the CC
    cc_bdp_bytes: int | None = None  # override the BDP handed to the CC
    int_mode: str = "auto"  # INT stamping: auto (when the CC wants it, i.e. HPCC) | on | off
    # Observation and engine.
    queue_sample_ns: int = 0  # sample switch queues every n ns while flows run (0 = off)
    trace_drops: bool = True
    trace_cnp: bool = True  # record every CNP (time, sender, flow); off = count only
    trace_ecn: bool = True  # record every CE mark (time, switch, port, class, flow); off = count only
    seed: int = 1
    scheduler: str = "ns3::PhantoraWheelScheduler"
    # ECMP policy (phantora.topology.ecmp): phantora | hpcc; None = the topology's (hpcc for HPCC-format files)
    ecmp_hash: str | None = None
    # Load balancing of data packets among equal-cost ports (LB_MODES); ACKs, NACKs and PFC frames keep ECMP.
    lb: str = "ecmp"
    flowlet_gap_ns: int = 10_000  # lb=flowlet: a gap longer than this starts a new flowlet (which may move)
    # The receiving NIC (RX_MODES): gbn = in order, NACK, go-back-N; sack = out of order, SACK blocks, selective
    # retransmission of packets deemed lost (RACK: once a packet sent reorder_window_ns later is acknowledged);
    # rud / rod = UET reliable unordered / ordered delivery (trimmed packets NACKed; rod: one path, go-back-N)
    rx: str = "gbn"
    reorder_window_ns: int = 0  # rx=sack: 0 = the flow's base RTT as given to its CC
    # Receiver credits (UET RCCC: `--cc rccc`, or `--set cc.ReceiverCredit=true` with nscc): a receiving port grants
    # credit at credit_rate x its line rate (wire bytes), credit_quantum packets per grant (htsim: 0.99, 4)
    credit_rate: float = 0.99
    credit_quantum: int = 4
    # rx=rud: SLEEK loss recovery (htsim's -sleek): resend, without a NACK, the packets not acknowledged once
    # max(min(1.5 x window, 1.5 BDP), 5 packets) later ones are (for drops and failed links; trims are NACKed)
    sleek: bool = False
    # lb=reps: after a retransmission timeout a connection freezes (htsim's freezing mode: with trimming a timeout is
    # a failed path) and recycles only its last good entropies for this long, then explores again; 0 = never
    reps_freeze_ns: int = 10_000_000
    # Engine (not ns-3 attributes, ENGINE_FIELDS): NVLink traffic packet by packet (exact) or as fluid max-min flows
    # beside the packet fabric (phantora.netsim.hybrid; an approximation, opt-in)
    nvlink: str = "packet"
    # Engine (issue 38, with nvlink=fluid): the fluid NVLink side on this many flow engines, one a run of hosts
    # (phantora.netsim.fluid_shards; the same completions as one: exact). 0 = one engine.
    fluid_shards: int = 0
    # Engine (issue 38, with nvlink=fluid): "on" hands a fluid flow whose deps are fluid flows of its own shard to its
    # flow engine when placed, which releases it at their ends (phantora.netsim.hybrid `_chain_deps`: exact)
    fluid_chains: str = "off"
    # Engine (issue 38, with fluid_shards): "on" runs each fluid shard in a process of its own, off the driver's CPU
    # (phantora.netsim.fluid_procs: the same completions)
    fluid_procs: str = "off"
    # Engine: serve a packet-side episode that repeats one recorded from a quiet fabric from its completion profile
    # (phantora.netsim.reuse; opt-in, exact only where ns-3 draws no random numbers, docs/packet-model.md)
    reuse: str = "off"
    # Engine: queue pairs per connection (the flows of a collective's channel and peer share one, with one CC state
    # that outlives each message, as NCCL's) or per flow (each message a fresh QP starting at line rate: an ablation)
    qp: str = "connection"
    # Engine: NIC work-request latency (doorbell + WQE fetch): a fabric flow posted at t (its deps done) sends its
    # first packet at t + nic_latency; its start_ns stays t (phantora.netsim.nic_latency). 0 = none (ns-3 as is).
    nic_latency: int = 0
    # Engine: decomposition of link-disjoint fabric pieces into this many parallel ns-3 workers (0 = one engine;
    # needs nvlink=fluid and nic_latency > 0; netsim.decompose), placed as local processes or, with `ray`, as Ray
    # actors: "" = local, "local" = a Ray cluster started here, "auto" = the running one, or a Ray address.
    workers: int = 0
    ray: str = ""
    # Engine (issue 38, parallel packet simulation, first pieces): cut the fabric into this many switch groups
    # (phantora.netsim.partition) and send every packet over a cut cable as a message, delivered at window
    # barriers (lookahead: the least cut-cable delay), every group in this one engine. Needs the keyed mode
    # (scheduler=ns3::PhantoraKeyedScheduler); its results are that mode's, byte for byte. 0 = off.
    partition_loopback: int = 0
    # Engine (issue 38): parallel packet simulation across cut cables in this many worker processes, one switch
    # group each, exchanging the cut-link messages peer to peer in barrier windows (bridge.cut_pool; batch runs
    # of flows, with dependencies: phantora netsim and replay), local processes or, with `ray`, Ray actors (beyond
    # loopback over CurveZMQ, bridge.cut_ray). Keyed mode; its results are that mode's one engine's. 0 = off.
    partition: int = 0
    # Set by the pool in each worker's config: the group this engine runs (-1: not a partition worker).
    partition_worker: int = -1
    # The longest a partitioned run may take, start-up included (s): past it the pool ends the run, naming the
    # workers still running. A stuck worker is caught sooner, by its peers' 60 s barrier timeout.
    partition_timeout_s: int = 3600
    # Traffic classes: how switches (and, with strict, NICs) share a port among data classes 1..7 (class 1 first)
    sched: str = "rr"  # rr (the HPCC models') | strict | wrr
    sched_weights: str = ""  # wrr weights of classes 1..7, "w1,...,w7" (integers >= 1); "" = all 1
    priority: str = "none"  # live runs: class of each collective: none (3) | layer | tensor-size (ENGINE_FIELDS)
    # DLCP bounded loss: loss-tolerant packets are trimmed to their header past trim_bytes of egress class queue
    trim_bytes: int | None = None  # None = 64 KiB with dlcp on, a nominal BDP with transport=uet, else never
    # Ultra Ethernet trimming: a trimmable packet the buffer cannot take is trimmed, not dropped, and trimmed
    # headers go in the strict-priority class 0 (transport=uet sets it)
    trim_priority: bool = False
    # A port whose rate a scenario changes (link_degrade) scales its trim and ECN kmin / kmax thresholds by its new
    # rate over its installed one, as htsim's -failed sizes a slowed link's queue; off: they stay as installed
    thresholds_follow_rate: bool = False
    # Credit-based flow control (hop by hop, lossless, instead of PFC): a port sends a data class only against link
    # credit for the next switch's buffer, given back (credit frames of pfc_bytes) as packets leave it
    cbfc: bool = False
    cbfc_credit_bytes: int | None = None  # per ingress (port, class); None = the credit loop's BDP (C++ CreditSize)
    cbfc_update_bytes: int | None = None  # a credit frame per this many bytes freed; None = one largest packet
    transport: str = ""  # the --set transport=PRESET applied last (TRANSPORT_PRESETS); "" = none (ENGINE_FIELDS)
    dlcp: str = "off"  # live runs: off | grads (all-reduces of floating-point tensors >= 64 KiB are loss-tolerant)
    dlcp_bound: float = 0.01  # at most this share of a loss-tolerant flow's bytes may be lost (then lossless)
    # ----- congestion control section (attributes of the ns3::Cc* object; D2 owns the CC fields) -----
    cc_attrs: dict[str, str] = field(default_factory=dict)  # raw ns-3 attribute overrides, e.g. {"G": "0.0625"}

    def __post_init__(self) -> None:
        self.validate()

    # ----- checks and conversions -----------------------------------------------------------
    def validate(self, source: str | None = None) -> PacketConfig:
        """Raise InputError naming the field of the first bad value."""

        def bad(name: str, msg: str) -> InputError:
            return InputError(msg, file=source, field=name)

        if not isinstance(self.cc, str) or not re.fullmatch(r"[A-Za-z][A-Za-z0-9_:.-]*", self.cc):
            raise bad("cc", f"expected a congestion control's name, got {self.cc!r}")
        positive = (
            "payload_bytes", "pfc_bytes", "ack_interval", "ack_delay_ns", "seed", "flowlet_gap_ns", "credit_quantum",
            "partition_timeout_s",
        )  # fmt: skip
        non_negative = (
            "header_bytes",
            "int_header_bytes",
            "reserve_bytes",
            "resume_offset_bytes",
            "dt_shift",
            "nack_interval_ns",
            "queue_sample_ns",
            "reorder_window_ns",
            "nic_latency",
            "workers",
            "partition_loopback",
            "partition",
            "reps_freeze_ns",
            "fluid_shards",
        )
        for name in positive + non_negative:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise bad(name, f"expected an integer, got {value!r}")
            if value < (1 if name in positive else 0):
                raise bad(name, f"must be {'> 0' if name in positive else '>= 0'}, got {value}")
        for name in (
            "buffer_bytes", "headroom_bytes", "rto_ns", "cc_base_rtt_ns", "cc_bdp_bytes", "cbfc_credit_bytes",
            "cbfc_update_bytes",
        ):  # fmt: skip
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise bad(name, f"expected an integer >= 0 or None, got {value!r}")
        if self.dt_shift > 30:
            raise bad("dt_shift", f"must be <= 30, got {self.dt_shift}")
        if not isinstance(self.headroom_factor, (int, float)) or self.headroom_factor < 0:
            raise bad("headroom_factor", f"must be a number >= 0, got {self.headroom_factor!r}")
        if isinstance(self.credit_rate, bool) or not isinstance(self.credit_rate, (int, float)):
            raise bad("credit_rate", f"expected a number, got {self.credit_rate!r}")
        if not 0.01 <= self.credit_rate <= 1.0:
            raise bad("credit_rate", f"must be in [0.01, 1], got {self.credit_rate}")
        if self.int_mode not in ("auto", "on", "off"):
            raise bad("int_mode", f"expected auto, on or off, got {self.int_mode!r}")
        if self.lb not in LB_MODES:
            raise bad("lb", f"unknown load balancing {self.lb!r} (known: {', '.join(LB_MODES)})")
        if self.rx not in RX_MODES:
            raise bad("rx", f"unknown receiver {self.rx!r} (known: {', '.join(RX_MODES)})")
        if self.nvlink not in NVLINK_MODES:
            raise bad("nvlink", f"expected {' or '.join(NVLINK_MODES)}, got {self.nvlink!r}")
        if self.fluid_shards and self.nvlink != "fluid":
            raise bad("fluid_shards", f"splits the fluid NVLink side: set nvlink=fluid too (got nvlink={self.nvlink})")
        if self.fluid_chains not in ("off", "on"):
            raise bad("fluid_chains", f"expected off or on, got {self.fluid_chains!r}")
        if self.fluid_chains == "on" and self.nvlink != "fluid":
            raise bad("fluid_chains", f"chains the fluid NVLink side: set nvlink=fluid too (got nvlink={self.nvlink})")
        if self.fluid_procs not in ("off", "on"):
            raise bad("fluid_procs", f"expected off or on, got {self.fluid_procs!r}")
        if self.fluid_procs == "on" and not self.fluid_shards:
            raise bad("fluid_procs", "runs the fluid shards in processes: set fluid_shards=N too")
        if self.reuse not in REUSE_MODES:
            raise bad("reuse", f"expected {' or '.join(REUSE_MODES)}, got {self.reuse!r}")
        if self.qp not in QP_MODES:
            raise bad("qp", f"expected {' or '.join(QP_MODES)}, got {self.qp!r}")
        if not isinstance(self.ray, str):
            raise bad("ray", f"expected local, auto or a Ray address, got {self.ray!r}")
        if self.workers or (self.ray and not self.partition):
            self._check_decompose(bad)
        if self.partition_loopback:
            if self.scheduler != KEYED_SCHEDULER:
                raise bad("partition_loopback", f"needs the keyed mode: set scheduler={KEYED_SCHEDULER} too")
            if self.workers:
                raise bad("partition_loopback", "does not combine with workers (decomposition) yet")
        if self.partition or self.partition_worker != -1:
            self._check_partition(bad)
        if self.reuse == "on" and self.dlcp != "off":
            raise bad("reuse", "reuse=on cannot serve loss-tolerant (dlcp) episodes: turn one of them off")
        if self.transport and self.transport not in TRANSPORT_PRESETS:
            raise bad("transport", f"expected {' | '.join(TRANSPORT_PRESETS)}, got {self.transport!r}")
        for name, allowed in (("sched", CLASS_SCHEDULERS), ("priority", PRIORITY_POLICIES), ("dlcp", DLCP_POLICIES)):
            if getattr(self, name) not in allowed:
                raise bad(name, f"expected {' | '.join(allowed)}, got {getattr(self, name)!r}")
        weights = str(self.sched_weights).replace(",", " ").split()
        if weights and (len(weights) != 7 or not all(w.isdigit() and int(w) >= 1 for w in weights)):
            raise bad("sched_weights", f"expected 7 integers >= 1 (classes 1..7), got {self.sched_weights!r}")
        if self.trim_bytes is not None and (
            isinstance(self.trim_bytes, bool) or not isinstance(self.trim_bytes, int) or self.trim_bytes < 0
        ):
            raise bad("trim_bytes", f"expected an integer >= 0 or None, got {self.trim_bytes!r}")
        if (
            isinstance(self.dlcp_bound, bool)
            or not isinstance(self.dlcp_bound, (int, float))
            or not (0.0 <= self.dlcp_bound <= 1.0)
        ):
            raise bad("dlcp_bound", f"expected a share in [0, 1], got {self.dlcp_bound!r}")
        if self.ecmp_hash is not None and self.ecmp_hash not in ECMP_HASHES:
            raise bad("ecmp_hash", f"expected {' or '.join(ECMP_HASHES)}, got {self.ecmp_hash!r}")
        for name in ("kmin_map", "kmax_map", "pmax_map"):
            table = getattr(self, name)
            if table is None:
                continue
            for rate, value in table.items():
                if not isinstance(rate, int) or rate <= 0:
                    raise bad(name, f"rates must be positive integers (bit/s), got {rate!r}")
                if name == "pmax_map" and not 0.0 <= float(value) <= 1.0:
                    raise bad(name, f"pmax must be in [0, 1], got {value!r} at {rate} bit/s")
                if name != "pmax_map" and (not isinstance(value, int) or value < 0):
                    raise bad(name, f"thresholds must be integer bytes >= 0, got {value!r} at {rate} bit/s")
        if self.kmin_map and self.kmax_map:
            for rate, kmin in self.kmin_map.items():
                if rate in self.kmax_map and self.kmax_map[rate] < kmin:
                    raise bad("kmax_map", f"kmax {self.kmax_map[rate]} < kmin {kmin} at {rate} bit/s")
        for key, value in self.cc_attrs.items():
            if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", str(key)):
                raise bad("cc_attrs", f"bad attribute name {key!r}")
            if not isinstance(value, (str, int, float, bool)):
                raise bad("cc_attrs", f"attribute {key}: expected a scalar, got {value!r}")
        return self

    def _check_partition(self, bad: Any) -> None:
        """partition=N (worker processes across cut cables) and the worker's own group."""
        if self.scheduler != KEYED_SCHEDULER:
            raise bad("partition", f"needs the keyed mode: set scheduler={KEYED_SCHEDULER} too")
        if self.workers or self.partition_loopback:
            raise bad("partition", "does not combine with workers (decomposition) or partition_loopback")
        w = self.partition_worker
        if isinstance(w, bool) or not isinstance(w, int) or not -1 <= w < max(self.partition, 0):
            raise bad("partition_worker", f"expected -1 or a group below partition={self.partition}, got {w!r}")

    def _check_decompose(self, bad: Any) -> None:
        """What decomposition into parallel workers needs (docs/packet-model.md, "Decomposition")."""
        if self.ray and not self.workers:
            raise bad("ray", "ray places decomposition or partition workers: set workers=N or partition=N (N >= 1) too")
        if self.nvlink != "fluid":
            raise bad(
                "workers", "decomposition needs nvlink=fluid (packet NVLink joins every rail through the NVSwitch)"
            )
        if self.nic_latency <= 0:
            raise bad("workers", "decomposition needs nic_latency > 0 (its lookahead), e.g. --set nic_latency=1us")
        if self.queue_sample_ns:
            raise bad("workers", "decomposition does not sample queues (queue_sample_ns): set it to 0")

    def decompose_settings(self) -> dict[str, object]:
        """What results.json records about decomposition (also when it is off)."""
        return {
            "workers": self.workers,
            "placement": f"ray:{self.ray}" if self.ray else "local",
            "nic_latency_ns": self.nic_latency,
        }

    def effective_trim_bytes(self) -> int:
        """The switches' trim threshold in bytes: trim_bytes, else 64 KiB with dlcp on and 0 (never) without."""
        if self.trim_bytes is not None:
            return self.trim_bytes
        return DLCP_DEFAULT_TRIM_BYTES if self.dlcp != "off" else 0

    def approximations(self) -> list[str]:
        """The opt-in approximations of the exact packet model this config turns on (results.json lists them)."""
        out = ["nvlink=fluid"] if self.nvlink == "fluid" else []
        return [*out, "reuse=on"] if self.reuse == "on" else out

    def with_updates(self, **changes: Any) -> PacketConfig:
        """A copy with some fields changed (validated)."""
        return replace(self, **changes)

    def effective_rto_ns(self) -> int:
        """The go-back-N timeout in ns: rto_ns, else none on a lossless (PFC) fabric and 1 ms without."""
        if self.rto_ns is not None:
            return self.rto_ns
        return 0 if self.pfc else 1_000_000

    def to_params(self, link_rates: Iterable[int] = ()) -> list[tuple[str, str]]:
        """(attribute path, text) pairs for PhantoraNetwork::SetParam, in NS3_ATTRIBUTES order, then the CC's.

        `link_rates` (bit/s) lets a CC with its own marking profile (DCTCP) fill the ECN maps the user left unset.
        """
        rates = sorted(set(link_rates))
        cc_maps = uet_switch_maps(rates) if self.transport == "uet" else cc_ecn_maps(self.cc, rates)
        out: list[tuple[str, str]] = []
        for name, (paths, kind) in NS3_ATTRIBUTES.items():
            value = self.effective_rto_ns() if name == "rto_ns" else getattr(self, name)
            if name == "trim_bytes":
                uet = self.transport == "uet" and self.trim_bytes is None and rates
                value = min(rates) * UET_BDP_BYTES_PER_GBPS // 10**9 if uet else self.effective_trim_bytes()
            if value is None:
                value = cc_maps.get(name)
            text = _attribute_text(kind, value)
            out.extend((path, text) for path in paths)
        out.extend((f"cc.{key}", _attribute_text("text", value)) for key, value in sorted(self.cc_attrs.items()))
        return out


# ----- the one table: PacketConfig field -> ns-3 attributes (ns3-scratch/model, helper) ------------------------

# field -> (attribute paths it sets, how its value is written). tests/test_packet_cc_laws.py checks every path
# against the TypeIds themselves, and that every field but cc_attrs is here.
NS3_ATTRIBUTES: dict[str, tuple[tuple[str, ...], str]] = {
    "cc": (("fabric.CongestionControl",), "cc"),
    "payload_bytes": (("nic.PayloadSize", "switch.PayloadSize"), "int"),
    "header_bytes": (("nic.HeaderSize", "switch.HeaderSize"), "int"),
    "int_header_bytes": (("nic.IntHeaderSize", "switch.IntHeaderSize"), "int"),
    "pfc_bytes": (("switch.PfcFrameSize",), "int"),
    "pfc": (("switch.PfcEnabled",), "bool"),
    "buffer_bytes": (("switch.BufferSize",), "int"),
    "reserve_bytes": (("switch.ReserveSize",), "int"),
    "resume_offset_bytes": (("switch.ResumeOffset",), "int"),
    "dt_shift": (("switch.DtShift",), "int"),
    "headroom_factor": (("switch.HeadroomFactor",), "float"),
    "headroom_bytes": (("switch.HeadroomSize",), "int"),
    "ecn": (("switch.EcnEnabled",), "bool"),
    "kmin_map": (("switch.KminMap",), "map"),
    "kmax_map": (("switch.KmaxMap",), "map"),
    "pmax_map": (("switch.PmaxMap",), "map"),
    "ack_interval": (("nic.AckInterval",), "int"),
    "ack_delay_ns": (("nic.AckDelay",), "ns"),
    "ack_high_prio": (("nic.AckHighPriority",), "bool"),
    "nack_interval_ns": (("nic.NackInterval",), "ns"),
    "rto_ns": (("nic.RetransmitTimeout",), "ns"),
    "global_t": (("fabric.GlobalT",), "bool"),
    "cc_base_rtt_ns": (("fabric.CcBaseRtt",), "ns"),
    "cc_bdp_bytes": (("fabric.CcBdp",), "int"),
    "int_mode": (("fabric.IntMode",), "int_mode"),
    "queue_sample_ns": (("recorder.QueueSampleInterval",), "ns"),
    "trace_drops": (("recorder.TraceDrops",), "bool"),
    "trace_cnp": (("recorder.TraceCnp",), "bool"),
    "trace_ecn": (("recorder.TraceEcn",), "bool"),
    "ecmp_hash": (("fabric.EcmpHash",), "ecmp_hash"),
    "lb": (("switch.LoadBalancing", "nic.LoadBalancing"), "text"),
    "flowlet_gap_ns": (("switch.FlowletGap",), "ns"),
    "rx": (("nic.Receiver",), "text"),
    "reorder_window_ns": (("nic.ReorderWindow",), "ns"),
    "credit_rate": (("nic.CreditRate",), "float"),
    "credit_quantum": (("nic.CreditQuantum",), "int"),
    "sleek": (("nic.Sleek",), "bool"),
    "reps_freeze_ns": (("nic.RepsFreezeTime",), "ns"),
    "seed": (("fabric.Seed",), "int"),
    "scheduler": (("fabric.Scheduler",), "text"),
    "sched": (("switch.ClassScheduling", "nic.ClassScheduling"), "text"),
    "sched_weights": (("switch.ClassWeights",), "text"),
    "trim_bytes": (("switch.TrimThreshold",), "int"),
    "trim_priority": (("switch.TrimHeaderPriority",), "bool"),
    "thresholds_follow_rate": (("switch.ThresholdsFollowRate",), "bool"),
    "cbfc": (("switch.CreditFlowControl",), "bool"),
    "cbfc_credit_bytes": (("switch.CreditSize",), "int"),
    "cbfc_update_bytes": (("switch.CreditUpdate",), "int"),
}


def field_of_param(path: str) -> str:
    """The PacketConfig field an attribute path comes from (cc_attrs for cc.X), for error messages."""
    if path.startswith("cc."):
        return "cc_attrs"
    return next((name for name, (paths, _) in NS3_ATTRIBUTES.items() if path in paths), path)


def _attribute_text(kind: str, value: object) -> str:
    """A field's value as its attribute's text (None: the attribute's 0, "scale with the fabric")."""
    if kind == "cc":
        return str(value)  # the registered name; the C++ side looks it up (CcRegistry)
    if kind == "int_mode":
        return {"auto": "Auto", "on": "On", "off": "Off"}[str(value)]
    if kind == "ecmp_hash":  # None: the fabric's default, phantora (Ns3Simulator resolves it from the topology)
        return {"phantora": "Phantora", "hpcc": "Hpcc"}[str(value or "phantora")]
    if kind == "map":
        table: dict[int, object] = value or {}  # type: ignore[assignment]
        return " ".join(f"{rate} {v!r}" if isinstance(v, float) else f"{rate} {v}" for rate, v in sorted(table.items()))
    if isinstance(value, bool):
        return "true" if value else "false"
    if kind == "float":
        return repr(float(value))  # type: ignore[arg-type]
    if kind in ("int", "ns"):
        number = 0 if value is None else int(value)  # type: ignore[call-overload]
        return f"{number}ns" if kind == "ns" else str(number)
    return str(value)


# ----- congestion control section (D2): switch marking that a CC needs ------------------------------

DCTCP_K_BYTES_PER_GBPS = 3000  # DCTCP marks with a step: kmin = kmax = 30 * bw / 10 KB (300 KB at 100G), pmax 1


def cc_ecn_maps(cc: str, link_rates: Iterable[int]) -> dict[str, dict[int, int] | dict[int, float]]:
    """ECN maps ({rate_bps: value}) a CC needs at these link rates when the user sets none (DCTCP only)."""
    if cc != "dctcp":
        return {}
    rates = sorted(set(link_rates))
    k = {r: r * DCTCP_K_BYTES_PER_GBPS // 10**9 for r in rates}
    return {"kmin_map": k, "kmax_map": dict(k), "pmax_map": {r: 1.0 for r in rates}}


def uet_switch_maps(rates: Iterable[int]) -> dict[str, dict[int, int] | dict[int, float]]:
    """ECN maps of transport=uet at these link rates (where the user sets none): htsim's marking from 0.2 to 0.8
    of a one-BDP queue (UET_BDP_BYTES_PER_GBPS), probability 1 at the top."""
    bdp = {r: r * UET_BDP_BYTES_PER_GBPS // 10**9 for r in rates}
    return {
        "kmin_map": {r: b // 5 for r, b in bdp.items()},
        "kmax_map": {r: b * 4 // 5 for r, b in bdp.items()},
        "pmax_map": {r: 1.0 for r in bdp},
    }


# ----- HPCC config.txt ---------------------------------------------------------------------------

# Keys of HPCC configs that name files or tracing, or behaviours that this model always has.
_IGNORED = {
    "TOPOLOGY_FILE",
    "FLOW_FILE",
    "TRACE_FILE",
    "TRACE_OUTPUT_FILE",
    "FCT_OUTPUT_FILE",
    "PFC_OUTPUT_FILE",
    "QLEN_MON_FILE",
    "QLEN_MON_START",
    "QLEN_MON_END",
    "SIMULATOR_STOP_TIME",
    "ENABLE_TRACE",
    "ERROR_RATE_PER_LINK",
    "L2_CHUNK_SIZE",
    "RATE_BOUND",
    "MULTI_RATE",
    "INT_MULTI",
    "PINT_LOG_BASE",
    "PINT_PROB",
    "NIC_TOTAL_PAUSE_TIME",
    "USE_DYNAMIC_PFC_THRESHOLD",
}


def _flag(value: str) -> bool:
    word = value.lower()
    if word not in ("0", "1", "false", "true", "off", "on"):
        raise ValueError("expected 0 or 1 (or false / true, off / on)")
    return word in ("1", "true", "on")


def _rate(value: str) -> int:
    return parse_rate_bps(value.replace("b/s", "bps").replace("B/s", "bps"))


def _us_text(value: str) -> str:
    return f"{float(value) * 1000:g}ns"  # HPCC timer keys are in microseconds


# HPCC key -> (CC attribute, converter to the attribute's text, CCs that take it): the HPCC config.txt format's
# own mapping (its CC_MODE numbering is HPCC_CC_MODES), in a config file and in `--set RATE_AI=...`.
_CC_KEYS: dict[str, tuple[str, object, tuple[str, ...]]] = {
    "RATE_AI": ("RateAi", lambda v: str(_rate(v)), ("dcqcn", "hpcc", "timely")),
    "RATE_HAI": ("RateHai", lambda v: str(_rate(v)), ("dcqcn", "timely")),
    "MIN_RATE": ("MinRate", lambda v: str(_rate(v)), ("dcqcn", "hpcc", "timely", "dctcp")),
    "DCTCP_RATE_AI": ("RateAi", lambda v: str(_rate(v)), ("dctcp",)),
    "EWMA_GAIN": ("G", lambda v: repr(float(v)), ("dcqcn", "dctcp")),
    "RP_TIMER": ("RpTimer", _us_text, ("dcqcn",)),
    "ALPHA_RESUME_INTERVAL": ("AlphaResumeInterval", _us_text, ("dcqcn",)),
    "RATE_DECREASE_INTERVAL": ("RateDecreaseInterval", _us_text, ("dcqcn",)),
    "FAST_RECOVERY_TIMES": ("FastRecoveryTimes", lambda v: str(int(v)), ("dcqcn",)),
    "CLAMP_TARGET_RATE": ("ClampTargetRate", lambda v: str(_flag(v)).lower(), ("dcqcn",)),
    "U_TARGET": ("TargetUtil", lambda v: repr(float(v)), ("hpcc",)),
    "MI_THRESH": ("MiThresh", lambda v: str(int(v)), ("hpcc",)),
    "FAST_REACT": ("FastReact", lambda v: str(_flag(v)).lower(), ("hpcc",)),
    "VAR_WIN": ("VarWin", lambda v: str(_flag(v)).lower(), ("hpcc",)),
    "SAMPLE_FEEDBACK": ("SampleFeedback", lambda v: str(_flag(v)).lower(), ("hpcc",)),
    "HAS_WIN": ("HasWindow", lambda v: str(_flag(v)).lower(), ("dctcp",)),  # CcNone has no window
}


def _rate_map(words: list[str], scale: float, as_float: bool) -> dict[int, int] | dict[int, float]:
    """HPCC 'n rate value rate value ...' into {rate_bps: value * scale}."""
    n = int(words[0])
    if n < 0 or len(words) != 1 + 2 * n:
        raise ValueError(f"expected a count then {n} 'rate value' pairs")
    out: dict[int, object] = {}
    for i in range(n):
        rate = _rate(words[1 + 2 * i])
        value = float(words[2 + 2 * i])
        out[rate] = value * scale if as_float else round(value * scale)
    return out  # type: ignore[return-value]


def read_hpcc_config(path: str | Path, base: PacketConfig | None = None) -> PacketConfig:
    """Read an HPCC `config.txt` (KEY value lines) into a PacketConfig.

    Lowercase keys are phantora's own PacketConfig field names (e.g. ``pfc 0``, ``header_bytes 36``).
    Errors name the file, line and key.
    """
    p = Path(path)
    text = read_text(p, "config file")
    values: dict[str, object] = {}
    where: dict[str, tuple[int, str]] = {}  # field -> (line, key) that set it
    cc_lines: list[tuple[int, str, list[str]]] = []
    names = {f.name: f for f in fields(PacketConfig)}
    for lineno, raw in enumerate(text.splitlines(), 1):
        words = raw.split("#", 1)[0].split()
        if not words:
            continue
        key, args = words[0], words[1:]

        def fail(msg: str, key: str = key, lineno: int = lineno) -> InputError:
            return InputError(msg, file=str(p), line=lineno, field=key)

        if not args:
            raise fail("missing value")
        value = args[0]
        before = set(values)
        try:
            if key in _IGNORED:
                continue
            if key == "CC_MODE":
                mode = int(value)
                if mode not in HPCC_CC_MODES:
                    known = ", ".join(f"{k} ({v})" for k, v in HPCC_CC_MODES.items())
                    raise fail(f"unsupported CC_MODE {mode} (supported: {known})")
                values["cc"] = HPCC_CC_MODES[mode]
            elif key == "PACKET_PAYLOAD_SIZE":
                values["payload_bytes"] = int(value)
            elif key == "BUFFER_SIZE":
                values["buffer_bytes"] = round(float(value) * 2**20)  # MB, as HPCC: value * 1024 * 1024
            elif key == "ENABLE_QCN":
                values["ecn"] = _flag(value)
            elif key == "ENABLE_PFC":
                values["pfc"] = _flag(value)
            elif key == "KMIN_MAP":
                values["kmin_map"] = _rate_map(args, 1000, False)  # KB (1000 B) -> bytes
            elif key == "KMAX_MAP":
                values["kmax_map"] = _rate_map(args, 1000, False)
            elif key == "PMAX_MAP":
                values["pmax_map"] = _rate_map(args, 1.0, True)
            elif key == "L2_ACK_INTERVAL":
                values["ack_interval"] = int(value)
            elif key == "ACK_HIGH_PRIO":
                values["ack_high_prio"] = _flag(value)
            elif key == "GLOBAL_T":
                values["global_t"] = _flag(value)
            elif key == "L2_BACK_TO_ZERO":
                if _flag(value):
                    raise fail("L2_BACK_TO_ZERO 1 (restart from byte 0) is not modelled; go-back-N is")
            elif key == "LINK_DOWN":
                if any(w != "0" for w in args):
                    raise fail("LINK_DOWN events are not modelled (use 'LINK_DOWN 0 0 0')")
            elif key in _CC_KEYS:
                cc_lines.append((lineno, key, args))
            elif key in names and key not in ("cc_attrs",):
                values[key] = _field_value(names[key].type, value, args)
            elif key.startswith("cc.") and len(key) > 3:
                values.setdefault("cc_attrs", {})[key[3:]] = value  # type: ignore[index]
            else:
                raise fail("unknown key (HPCC keys in upper case, phantora PacketConfig fields in lower case)")
        except (ValueError, IndexError) as exc:
            raise fail(f"bad value {' '.join(args)!r}: {exc}") from None
        except InputError as exc:
            if exc.file is None:
                raise fail(str(exc)) from None
            raise
        for name in set(values) - before:
            where[name] = (lineno, key)
    cc = str(values.get("cc", base.cc if base else "none"))
    attrs: dict[str, str] = dict(base.cc_attrs) if base else {}
    attrs.update(values.pop("cc_attrs", {}))  # type: ignore[call-overload]
    for lineno, key, args in cc_lines:
        attr, convert, ccs = _CC_KEYS[key]
        if cc not in ccs:
            continue  # e.g. DCQCN timers in an HPCC run: HPCC's own configs list every key
        try:
            attrs[attr] = convert(args[0])  # type: ignore[operator]
        except (ValueError, InputError) as exc:
            raise InputError(f"bad value {args[0]!r}: {exc}", file=str(p), line=lineno, field=key) from None
    values["cc_attrs"] = attrs
    try:
        return replace(base or PacketConfig(), **values)  # type: ignore[arg-type]
    except InputError as exc:
        at: tuple[int | None, str | None] = where.get(exc.field or "", (None, exc.field))
        message = str(exc).split(": ", 1)[-1] if exc.field else str(exc)
        raise InputError(message, file=str(p), line=at[0], field=at[1]) from None


def _field_value(kind: object, value: str, args: list[str]) -> object:
    """Parse a lowercase (PacketConfig field) value by the field's declared type."""
    kind = str(kind)
    if value.lower() in ("none", "default") and "None" in kind:  # "default": as `phantora compare` shows None
        return None
    if kind.startswith("dict"):
        words = args
        if len(words) % 2:
            raise ValueError("expected 'rate value' pairs")
        as_float = "float" in kind
        return {
            _rate(words[i]): (float(words[i + 1]) if as_float else int(words[i + 1])) for i in range(0, len(words), 2)
        }
    if kind == "bool":
        return _flag(value)
    if kind == "float":
        return float(value)
    if kind == "str":
        return value
    if "int" in kind:
        try:
            return int(value)
        except ValueError:
            pass
        if value[-1] == "s" and any(c.isdigit() for c in value):
            try:
                return parse_time_ns(value)
            except InputError as exc:  # a ValueError, so that the caller names the file, line and field
                raise ValueError(exc.message) from None
        try:
            number = parse_size_bytes(value) if value[-1:].lower() == "b" else float(value)
        except (ValueError, InputError):
            raise ValueError(f"expected an integer (or a size like 4MB, a time like 10us), got {value!r}") from None
        if not math.isfinite(number) or number != int(number):
            raise ValueError(f"expected a whole number, got {value!r}")
        return int(number)
    return value


def override_fields() -> list[str]:
    """The PacketConfig fields `--set FIELD=VALUE` takes, sorted (the CC's own attributes go as cc.ATTRIBUTE)."""
    return sorted(f.name for f in fields(PacketConfig) if f.name != "cc_attrs")


def apply_overrides(config: PacketConfig, items: Sequence[str], source: str = "--set") -> PacketConfig:
    """Apply ``field=value`` strings (PacketConfig field names, values as in a config file; `cc.ATTR` for the
    CC's own attributes; the CC keys of an HPCC config.txt, such as RATE_AI, as a config file has them)."""
    names = {f.name: f for f in fields(PacketConfig)}
    changes: dict[str, object] = {}
    attrs = dict(config.cc_attrs)
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not value.strip():
            raise InputError(f"expected FIELD=VALUE, got {item!r}", file=source, field=key or None)
        args = value.split()
        if key.startswith("cc.") and len(key) > 3:
            attrs[key[3:]] = value.strip()
            continue
        if key in _CC_KEYS:  # an HPCC config.txt key of the CC (RATE_AI=50Mb/s), as a config file has it
            attr, convert, ccs = _CC_KEYS[key]
            cc = str(changes.get("cc", config.cc))
            if cc not in ccs:
                raise InputError(
                    f"{key} is an HPCC key of {', '.join(ccs)}, not of {cc!r} (cc.ATTRIBUTE sets any CC's own)",
                    file=source,
                    field=key,
                )
            try:
                attrs[attr] = convert(value.strip())  # type: ignore[operator]
            except (ValueError, InputError) as exc:
                raise InputError(f"bad value {value.strip()!r}: {exc}", file=source, field=key) from None
            continue
        if key == "transport":
            name = value.strip()
            if name not in TRANSPORT_PRESETS:
                known = ", ".join(TRANSPORT_PRESETS)
                raise InputError(f"unknown transport {name!r} (known: {known})", file=source, field=key)
            came_from_uet = str(changes.get("transport", config.transport)) == "uet"
            changes.update(TRANSPORT_PRESETS[name])
            if name == "roce" and came_from_uet and str(changes.get("cc", config.cc)) == "nscc":
                changes["cc"] = "none"  # the uet preset's NSCC, not the user's: RoCE's CC is the user's choice
            changes["transport"] = name
            continue
        if key == "wire":
            preset = WIRE_PRESETS.get(value.strip())
            if preset is None:
                known = ", ".join(WIRE_PRESETS)
                raise InputError(f"unknown wire preset {value.strip()!r} (known: {known})", file=source, field=key)
            changes.update(preset)
            continue
        if key not in names or key == "cc_attrs":
            listed = ", ".join(override_fields())
            raise InputError(
                f"unknown PacketConfig field {key!r}; the fields: {listed}; cc.ATTRIBUTE for the CC's own; "
                f"wire=PRESET ({', '.join(WIRE_PRESETS)}) and transport=PRESET ({', '.join(TRANSPORT_PRESETS)})",
                file=source,
                field=key,
            )
        try:
            changes[key] = _field_value(names[key].type, args[0], args)
        except (ValueError, IndexError) as exc:
            raise InputError(f"bad value {value!r}: {exc}", file=source, field=key) from None
    changes["cc_attrs"] = attrs
    try:
        return replace(config, **changes)  # type: ignore[arg-type]
    except InputError as exc:
        raise InputError(exc.message, file=source, field=exc.field) from None
