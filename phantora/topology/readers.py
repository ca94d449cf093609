"""Readers and writers of the HPCC and SimAI ns-3 topology files (REFERENCE.md section 4).

HPCC:  ``<nodes> <switches> <links>``, the switch ids, then ``<src> <dst> <rate> <delay> <error_rate>``
per link. Non-switch nodes are endpoints (kind ``host``); switches are kind ``switch``.

SimAI: ``<nodes> <gpus_per_server> <nvswitches> <switches> <links> <gpu_type>``, the NVSwitch ids
then the switch ids (on one line or several), then the links. Non-listed nodes are GPUs; GPU
number i (in id order) belongs to server i // gpus_per_server.

Switch tiers are derived: a switch next to an endpoint is a leaf (1), the others are numbered by
their hop distance from the leaves (spine 2, core 3). Errors name the file and line.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from phantora.errors import InputError
from phantora.files import read_text
from phantora.topology._util import format_rate, format_time, rate_bps, time_ns
from phantora.topology.model import ENDPOINT_KINDS, Topology


@dataclass
class _Tokens:
    """Whitespace tokens of a file with their line numbers ('#' starts a comment)."""

    file: str
    items: list[tuple[int, list[str]]]  # (line number, tokens) of non-empty lines

    @classmethod
    def read(cls, source: str | Path | TextIO) -> _Tokens:
        if isinstance(source, (str, Path)):
            name = str(source)
            text = read_text(source, "topology file")
        else:
            name, text = getattr(source, "name", "<stream>"), source.read()
        items = []
        for no, line in enumerate(text.splitlines(), 1):
            words = line.split("#", 1)[0].split()
            if words:
                items.append((no, words))
        if not items:
            raise InputError("the topology file is empty", file=name)
        return cls(name, items)


def _int(word: str, what: str, file: str, line: int, minimum: int = 0) -> int:
    try:
        value = int(word)
    except ValueError:
        raise InputError(f"{what}: expected an integer, got {word!r}", file=file, line=line) from None
    if value < minimum:
        raise InputError(f"{what}: must be >= {minimum}, got {value}", file=file, line=line)
    return value


def _ids(tok: _Tokens, pos: int, want: int, nodes: int, what: str) -> tuple[list[int], int]:
    """Read `want` node ids that may span several lines starting at item `pos`; return (ids, next pos)."""
    ids: list[int] = []
    while len(ids) < want:
        if pos >= len(tok.items):
            raise InputError(f"expected {want} {what} ids, found {len(ids)} before the end of the file", file=tok.file)
        line, words = tok.items[pos]
        if len(ids) + len(words) > want:
            raise InputError(
                f"expected {want} {what} ids, this line brings the count to {len(ids) + len(words)}",
                file=tok.file,
                line=line,
            )
        for w in words:
            nid = _int(w, f"{what} id", tok.file, line)
            if nid >= nodes:
                raise InputError(f"{what} id {nid} is not a node (ids are 0..{nodes - 1})", file=tok.file, line=line)
            if nid in ids:
                raise InputError(f"{what} id {nid} is listed twice", file=tok.file, line=line)
            ids.append(nid)
        pos += 1
    return ids, pos


def _links(
    tok: _Tokens, pos: int, want: int, nodes: int, header_line: int
) -> list[tuple[int, int, int, int, float, int]]:
    """Parse the link lines: (a, b, bits/s, ns, error rate, line)."""
    rows: list[tuple[int, int, int, int, float, int]] = []
    for line, words in tok.items[pos:]:
        if len(rows) == want:
            raise InputError(f"more link lines than the {want} the header announces", file=tok.file, line=line)
        if len(words) not in (4, 5):
            raise InputError(
                f"a link line is '<src> <dst> <rate> <delay> <error_rate>', got {len(words)} fields",
                file=tok.file,
                line=line,
            )
        a = _int(words[0], "link source", tok.file, line)
        b = _int(words[1], "link destination", tok.file, line)
        for end in (a, b):
            if end >= nodes:
                raise InputError(f"unknown node id {end} (ids are 0..{nodes - 1})", file=tok.file, line=line)
        if a == b:
            raise InputError(f"link joins node {a} to itself", file=tok.file, line=line)
        bps = rate_bps(words[2], "rate", file=tok.file, line=line)
        ns = time_ns(words[3], "delay", file=tok.file, line=line)
        err = 0.0
        if len(words) == 5:
            try:
                err = float(words[4])
            except ValueError:
                err = -1.0
            if not 0.0 <= err <= 1.0:
                raise InputError(f"error rate must be in [0, 1], got {words[4]!r}", file=tok.file, line=line)
        rows.append((a, b, bps, ns, err, line))
    if len(rows) != want:
        raise InputError(
            f"the header announces {want} links, the file has {len(rows)}", file=tok.file, line=header_line
        )
    return rows


def _tiers(nodes: int, kinds: list[str], rows: list[tuple[int, int, int, int, float, int]]) -> list[int]:
    """Tier of each switch: 1 next to an endpoint, then +1 per hop away from the leaves; 0 otherwise."""
    adj: list[list[int]] = [[] for _ in range(nodes)]
    for a, b, *_ in rows:
        adj[a].append(b)
        adj[b].append(a)
    tier = [0] * nodes
    queue: deque[int] = deque()
    for n in range(nodes):
        if kinds[n] == "switch" and any(kinds[v] in ENDPOINT_KINDS for v in adj[n]):
            tier[n] = 1
            queue.append(n)
    while queue:
        u = queue.popleft()
        for v in adj[u]:
            if kinds[v] == "switch" and tier[v] == 0:
                tier[v] = tier[u] + 1
                queue.append(v)
    return tier


def _build(
    name: str,
    tok: _Tokens,
    kinds: list[str],
    names: list[str],
    hosts: list[int | None],
    rows: list[tuple[int, int, int, int, float, int]],
) -> Topology:
    tiers = _tiers(len(kinds), kinds, rows)
    topo = Topology(name=name)
    for n, kind in enumerate(kinds):
        topo.add_node(
            kind,
            names[n] if kind != "switch" else f"{('sw', 'leaf', 'spine', 'core')[min(tiers[n], 3)]}{n}",
            host=hosts[n],
            tier=tiers[n],
        )
    errors: dict[int, float] = {}
    for a, b, bps, ns, err, _line in rows:
        lid = topo.add_link(a, b, bps, ns)
        if err:
            errors[lid] = err
    if errors:
        topo.meta["link_error_rate"] = errors
    topo.meta["source"] = tok.file
    return topo.validate(source=tok.file)


def _stem(path: str) -> str:
    return Path(path).name.split(".")[0] or "topology"


def read_hpcc(source: str | Path | TextIO) -> Topology:
    """Read an HPCC / ASTRA-sim ns-3 topology file."""
    tok = _Tokens.read(source)
    line, head = tok.items[0]
    if len(head) != 3:
        raise InputError(
            f"the HPCC header is '<nodes> <switches> <links>', got {len(head)} fields", file=tok.file, line=line
        )
    nodes = _int(head[0], "node count", tok.file, line, 1)
    nsw = _int(head[1], "switch count", tok.file, line)
    nlinks = _int(head[2], "link count", tok.file, line, 1)
    if nsw >= nodes:
        raise InputError(f"{nsw} switches leave no endpoint among {nodes} nodes", file=tok.file, line=line)
    switches, pos = _ids(tok, 1, nsw, nodes, "switch")
    rows = _links(tok, pos, nlinks, nodes, line)
    kinds = ["host"] * nodes
    for s in switches:
        kinds[s] = "switch"
    hosts: list[int | None] = [None] * nodes
    names = [""] * nodes
    for rank, n in enumerate(i for i in range(nodes) if kinds[i] == "host"):
        hosts[n], names[n] = rank, f"host{n}"
    topo = _build(_stem(tok.file), tok, kinds, names, hosts, rows)
    topo.meta["format"] = "hpcc"
    return topo.use_ecmp("hpcc")  # HPCC's own inputs are routed as the HPCC models route them


def read_simai(source: str | Path | TextIO) -> Topology:
    """Read a SimAI (astra-sim-alibabacloud) topology file."""
    tok = _Tokens.read(source)
    line, head = tok.items[0]
    if len(head) not in (6, 7):
        raise InputError(
            "the SimAI header is '<nodes> <gpus_per_server> <nvswitches> <switches> <links> <gpu_type>', "
            f"got {len(head)} fields",
            file=tok.file,
            line=line,
        )
    nodes = _int(head[0], "node count", tok.file, line, 1)
    per_server = _int(head[1], "gpus_per_server", tok.file, line, 1)
    nnv = _int(head[2], "NVSwitch count", tok.file, line)
    nsw = _int(head[3], "switch count", tok.file, line)
    nlinks = _int(head[4], "link count", tok.file, line, 1)
    gpu_type = head[5]
    if nnv + nsw >= nodes:
        raise InputError(
            f"{nnv} NVSwitches + {nsw} switches leave no GPU among {nodes} nodes", file=tok.file, line=line
        )
    ids, pos = _ids(tok, 1, nnv + nsw, nodes, "NVSwitch/switch")
    rows = _links(tok, pos, nlinks, nodes, line)
    kinds = ["gpu"] * nodes
    for i, n in enumerate(ids):
        kinds[n] = "nvswitch" if i < nnv else "switch"
    hosts: list[int | None] = [None] * nodes
    names = [""] * nodes
    for rank, n in enumerate(i for i in range(nodes) if kinds[i] == "gpu"):
        hosts[n], names[n] = rank // per_server, f"gpu{n}"
    for a, b, *_rest, ln in rows:
        for nv, other in ((a, b), (b, a)):
            if kinds[nv] == "nvswitch" and kinds[other] == "switch":
                raise InputError(
                    f"NVSwitch {nv} is linked to switch {other}; NVSwitches join GPUs only", file=tok.file, line=ln
                )
            if kinds[nv] == "nvswitch" and kinds[other] == "gpu" and hosts[nv] is None:
                hosts[nv] = hosts[other]
    for n in range(nodes):
        if kinds[n] == "nvswitch":
            names[n] = f"nvsw{n}"
    topo = _build(_stem(tok.file), tok, kinds, names, hosts, rows)
    topo.gpu_model = None if gpu_type.lower() in ("unknown", "none") else gpu_type.lower()
    topo.meta["format"] = "simai"
    topo.meta["gpus_per_server"] = per_server
    return topo


def _link_lines(topo: Topology, order: dict[int, int]) -> list[str]:
    errors = topo.meta.get("link_error_rate", {})
    lines = []
    for link in topo.links:
        err = errors.get(link.id, 0) if isinstance(errors, dict) else 0
        rate, delay = format_rate(link.bandwidth_bps), format_time(link.latency_ns)
        lines.append(f"{order[link.a]} {order[link.b]} {rate} {delay} {err:g}")
    return lines


def _emit(text: str, dest: str | Path | TextIO | None) -> str:
    if isinstance(dest, (str, Path)):
        Path(dest).write_text(text)
    elif dest is not None:
        dest.write(text)
    return text


def write_hpcc(topo: Topology, dest: str | Path | TextIO | None = None) -> str:
    """Write topo in the HPCC format (node ids kept); return the text.

    The format has no NVSwitch: NVSwitches become plain switches, which the HPCC simulator would
    then also use as a path between the GPUs of one host.
    """
    switches = [n.id for n in topo.nodes if n.kind not in ENDPOINT_KINDS]
    head = f"{len(topo.nodes)} {len(switches)} {len(topo.links)}\n{' '.join(map(str, switches))}\n"
    ident = {n.id: n.id for n in topo.nodes}
    return _emit(head + "\n".join(_link_lines(topo, ident)) + "\n", dest)


def simai_order(topo: Topology) -> list[int]:
    """Node ids in SimAI numbering order: GPUs (rank order), NVSwitches, then switches by tier."""
    eps = list(topo.endpoints)
    nvs = [n.id for n in topo.nodes if n.kind == "nvswitch"]
    sws = sorted((n.tier, n.id) for n in topo.nodes if n.kind == "switch")
    return eps + nvs + [i for _, i in sws]


def write_simai(topo: Topology, dest: str | Path | TextIO | None = None, gpu_type: str | None = None) -> str:
    """Write topo in the SimAI format, renumbered GPUs first (see `simai_order`); return the text."""
    order = simai_order(topo)
    new_id = {old: new for new, old in enumerate(order)}
    per_host: dict[object, int] = {}
    for e in topo.endpoints:
        key = topo.nodes[e].host if topo.nodes[e].host is not None else ("solo", e)
        per_host[key] = per_host.get(key, 0) + 1
    sizes = set(per_host.values())
    if len(sizes) != 1:
        raise InputError(f"SimAI needs the same number of GPUs in every server, found {sorted(sizes)}", field="host")
    hosts_in_order = [topo.nodes[e].host for e in topo.endpoints]
    if any(
        h is not None and h != hosts_in_order[i - 1] and h in hosts_in_order[:i] for i, h in enumerate(hosts_in_order)
    ):
        raise InputError("SimAI needs each server's GPUs to be consecutive ranks", field="host")
    nnv = sum(1 for n in topo.nodes if n.kind == "nvswitch")
    nsw = len(topo.nodes) - len(topo.endpoints) - nnv
    gtype = gpu_type or (topo.gpu_model.upper() if topo.gpu_model else "UNKNOWN")
    head = f"{len(order)} {sizes.pop()} {nnv} {nsw} {len(topo.links)} {gtype}\n"
    ids = " ".join(str(new_id[i]) for i in order[len(topo.endpoints) :])
    return _emit(head + ids + "\n" + "\n".join(_link_lines(topo, new_id)) + "\n", dest)


# the formats as sniff_format tells them apart (phantora.topology.loader.FORMATS, for a user)
FORMATS_TOLD = (
    "toml (a .toml file, or a first line `key = value` or `[table]`), hpcc (a first line of 3 fields: nodes, "
    "switches, links) and simai (6 or 7 fields)"
)


def sniff_format(path: str | Path) -> str:
    """'toml', 'hpcc' or 'simai' from the file suffix or its first line."""
    if str(path).endswith(".toml"):
        return "toml"
    words: list[str] = []
    try:
        with open(path) as fh:
            for raw in fh:
                words = raw.split("#", 1)[0].split()
                if words:
                    break
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read topology file: {exc}", file=str(path)) from None
    if str(path).endswith(".json") or (words and words[0].startswith("{")):
        raise InputError(
            f"JSON is not a topology format; the formats are {FORMATS_TOLD} (`phantora topo --json` prints a "
            "summary, not a topology)",
            file=str(path),
        )
    if len(words) == 3:
        return "hpcc"
    if len(words) in (6, 7):
        return "simai"
    if words and ("=" in " ".join(words) or words[0].startswith("[")):
        return "toml"
    raise InputError(
        f"cannot tell the topology format from the first line ({len(words)} fields): the formats are {FORMATS_TOLD}; "
        "`phantora topo FILE --format NAME` reads a file as one",
        file=str(path),
        line=1,
    )
