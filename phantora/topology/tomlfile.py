"""The phantora TOML topology format: a generator call, or explicit node and link lists.

```toml
name = "testbed16"          # optional (default: file stem)
description = "..."         # optional
gpu = "h100"                # optional GPU model
cpu = "amd"                 # optional hosts' CPU vendor: intel (default) | amd | arm (NCCL's net overhead follows it)
cpu_model = "zen"           # nodes/links files only (a generator takes it in [generator]): NCCL's CPU class
host = "dgx-a100"           # optional hosts' CPUs and memory (phantora.perfmodel.hosts; default: the GPU's DGX)

[generator]                 # either this table ...
kind = "leaf_spine"         # fat_tree | leaf_spine | rail_optimized | dgx_host
leaves = 2                  # ... the generator's keyword arguments (see generators.py)

[link_defaults]             # ... or explicit lists; defaults for links that omit rate/latency
rate = "100Gbps"
latency = "1us"
[[nodes]]
name = "gpu0"
kind = "gpu"                # gpu | host | nvswitch | switch
host = 0                    # optional server index
tier = 0                    # optional (switches: 1 leaf, 2 spine, 3 core)
[[links]]
a = "gpu0"                  # node name or id
b = "leaf0"
rate = "400Gbps"
latency = "1us"
```
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path
from typing import Any

from phantora.collectives.nccl.pci_paths import CPU_MODELS, cpu_model_name
from phantora.errors import InputError
from phantora.files import parse_toml, read_text
from phantora.perfmodel.hosts import get_host
from phantora.topology._util import count, cpu_name, gpu_name, rate_bps, relocate, time_ns
from phantora.topology.generators import GENERATORS
from phantora.topology.model import NODE_KINDS, Topology

TOP_KEYS = ("name", "description", "gpu", "cpu", "cpu_model", "host", "generator", "nodes", "links", "link_defaults")
NODE_KEYS = ("name", "kind", "host", "tier")
LINK_KEYS = ("a", "b", "rate", "latency")
_RESERVED = ("name", "gpu", "cpu")  # generator arguments that come from the top level


def _unknown(table: dict[str, Any], allowed: tuple[str, ...], where: str, file: str, line: int | None = None) -> None:
    for key in table:
        if key not in allowed:
            raise InputError(f"unknown field (known: {', '.join(allowed)})", file=file, line=line, field=where + key)


def _header_lines(text: str, name: str) -> list[int]:
    """Line numbers of each ``[[name]]`` header, to point errors at the right array entry."""
    pat = re.compile(r"^\s*\[\[\s*" + re.escape(name) + r"\s*\]\]")
    return [no for no, line in enumerate(text.splitlines(), 1) if pat.match(line)]


def _key_line(text: str, key: str | None) -> int | None:
    """The line of a top-level ``key = ...`` (before the first table header), if there is one."""
    for no, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("["):
            return None
        if key and re.match(r"\s*" + re.escape(key) + r"\s*=", line):
            return no
    return None


def _line_of(lines: list[int], index: int, total: int) -> int | None:
    return lines[index] if len(lines) == total else None


def _generator(table: dict[str, Any], top: dict[str, Any], file: str) -> Topology:
    table = dict(table)
    kind = table.pop("kind", None)
    if kind not in GENERATORS:
        raise InputError(f"expected one of {', '.join(GENERATORS)}, got {kind!r}", file=file, field="generator.kind")
    func = GENERATORS[kind]
    params = [p for p in inspect.signature(func).parameters if p not in _RESERVED]
    _unknown(table, tuple(params), "generator.", file)
    try:
        return func(**table, name=top.get("name"), gpu=top.get("gpu"), cpu=top.get("cpu"))
    except InputError as exc:
        raise relocate(exc, file=file, prefix="generator.") from None
    except TypeError as exc:  # a required argument is missing
        raise InputError(f"{kind}: {exc}", file=file, field="generator") from None


def _explicit(data: dict[str, Any], text: str, file: str) -> Topology:
    nodes, links = data.get("nodes", []), data.get("links", [])
    if not isinstance(nodes, list) or not isinstance(links, list):
        raise InputError("nodes and links must be arrays of tables ([[nodes]], [[links]])", file=file)
    defaults = data.get("link_defaults", {})
    if not isinstance(defaults, dict):
        raise InputError("expected a table", file=file, field="link_defaults")
    _unknown(defaults, ("rate", "latency"), "link_defaults.", file)
    topo = Topology(name=data.get("name") or Path(file).stem, gpu_model=gpu_name(data.get("gpu")))
    node_lines, link_lines = _header_lines(text, "nodes"), _header_lines(text, "links")
    by_name: dict[str, int] = {}
    for i, entry in enumerate(nodes):
        where, line = f"nodes[{i}].", _line_of(node_lines, i, len(nodes))
        if not isinstance(entry, dict):
            raise InputError("expected a table", file=file, line=line, field=where[:-1])
        _unknown(entry, NODE_KEYS, where, file, line)
        name, kind = entry.get("name"), entry.get("kind")
        if not isinstance(name, str) or not name:
            raise InputError("every node needs a name", file=file, line=line, field=where + "name")
        if name in by_name:
            raise InputError(f"node name {name!r} is used twice", file=file, line=line, field=where + "name")
        if kind not in NODE_KINDS:
            raise InputError(
                f"expected one of {', '.join(NODE_KINDS)}, got {kind!r}", file=file, line=line, field=where + "kind"
            )
        try:
            host = count(entry["host"], "host", 0) if "host" in entry else None
            tier = count(entry.get("tier", 0), "tier", 0)
        except InputError as exc:
            raise relocate(exc, file=file, line=line, prefix=where) from None
        by_name[name] = topo.add_node(kind, name, host=host, tier=tier)
    for i, entry in enumerate(links):
        where, line = f"links[{i}].", _line_of(link_lines, i, len(links))
        if not isinstance(entry, dict):
            raise InputError("expected a table", file=file, line=line, field=where[:-1])
        _unknown(entry, LINK_KEYS, where, file, line)
        ends = []
        for key in ("a", "b"):
            ref = entry.get(key)
            if isinstance(ref, str) and ref in by_name:
                ends.append(by_name[ref])
            elif isinstance(ref, int) and not isinstance(ref, bool) and 0 <= ref < len(topo.nodes):
                ends.append(ref)
            else:
                raise InputError(f"unknown node {ref!r}", file=file, line=line, field=where + key)
        if ends[0] == ends[1]:
            raise InputError("a link must join two different nodes", file=file, line=line, field=where + "b")
        for key in ("rate", "latency"):
            if key not in entry and key not in defaults:
                raise InputError(f"missing (and no link_defaults.{key})", file=file, line=line, field=where + key)
        bps = rate_bps(entry.get("rate", defaults.get("rate")), where + "rate", file=file, line=line)
        ns = time_ns(entry.get("latency", defaults.get("latency")), where + "latency", file=file, line=line)
        topo.add_link(ends[0], ends[1], bps, ns)
    return topo


def _cpu_model(data: dict[str, Any], cpu: str | None) -> str | None:
    """A nodes/links file's top-level `cpu_model` (NCCL's CPU class of its hosts), checked; a generator takes its
    own (`[generator] cpu_model`)."""
    if "cpu_model" not in data:
        return None
    if "generator" in data:
        raise InputError("give cpu_model in the [generator] table", field="cpu_model")
    return cpu_model_name(data["cpu_model"], cpu)


def read_toml(path: str | Path) -> Topology:
    """Read a phantora TOML topology file."""
    file = str(path)
    text = read_text(path, "topology file")
    data = parse_toml(text, file)
    _unknown(data, TOP_KEYS, "", file)
    for key in ("name", "description"):
        if key in data and not isinstance(data[key], str):
            raise InputError("expected a string", file=file, field=key)
    try:
        gpu_name(data.get("gpu"))
        cpu = cpu_name(data.get("cpu"))
        model = _cpu_model(data, cpu)
        host = get_host(data["host"]).name if "host" in data else None  # the host compute model's (runtime.md)
    except InputError as exc:
        raise relocate(exc, file=file, line=_key_line(text, exc.field)) from None
    if "generator" in data:
        if any(k in data for k in ("nodes", "links", "link_defaults")):
            raise InputError("give either [generator] or nodes/links, not both", file=file, field="generator")
        if not isinstance(data["generator"], dict):
            raise InputError("expected a table", file=file, field="generator")
        topo = _generator(data["generator"], data, file)
    elif "nodes" in data:
        topo = _explicit(data, text, file)
    else:
        raise InputError("the file needs a [generator] table or [[nodes]] and [[links]]", file=file)
    if "name" not in data:
        topo.name = Path(file).stem
    if "description" in data:
        topo.meta["description"] = data["description"]
    if model is not None:
        topo.meta["cpu_model"] = model
        cpu = cpu or CPU_MODELS[model][0]
    if cpu is not None:
        topo.meta["cpu"] = cpu
    if host is not None:
        topo.meta["host"] = host
    topo.meta["source"] = file
    topo.meta["format"] = "toml"
    return topo.validate(source=file)
