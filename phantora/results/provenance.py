"""config.json: what produced a run, complete enough to run it again (`phantora rerun DIR`).

It holds the run's options as given, the packet settings with every default filled in (and the ns-3
parameters they become; what the fabric-scaled ones resolve to is the engine's report, engine.json), the
topology's name and a digest of its nodes and links, the input files by content (`inputs`, see
`phantora.results.inputs`), the command line, the model switches the ranks read from the environment (`model_env`,
see `phantora.results.model_env`), and the versions of phantora, torch, ns-3 and Python. A
run made by `phantora rerun` also names the run it repeats (`rerun_of`: its directory, command, versions
and the sha256 of its config.json).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import json
import os
import platform
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from phantora.netsim.packet_config import PacketConfig
from phantora.results import inputs as I
from phantora.results import model_env
from phantora.results import schema as S
from phantora.results.write import write_json
from phantora.topology.model import Topology

CONFIG_JSON = S.CONFIG_JSON
CONFIG = "phantora.config/1"


def topology_digest(topo: Topology) -> str:
    """sha256 of the topology's nodes, links and GPU model: equal digests, equal fabrics."""
    doc = {
        "nodes": [dataclasses.astuple(n) for n in topo.nodes],
        "links": [dataclasses.astuple(link) for link in topo.links],
        "gpu_model": topo.gpu_model,
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def versions(env: Mapping[str, str] | None = None) -> dict[str, str | None]:
    """Versions of what computed the results; `env`: the ranks' environment (default this process's), which
    names the modelled torch."""
    env = os.environ if env is None else env

    def version(dist: str) -> str | None:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            return None

    return {
        "phantora": version("phantora"),
        "torch": version("torch"),
        # the torch release the simulated GPU's kernels stand for (PHANTORA_TORCH_VERSION; simcuda/torch_release.py)
        "torch_modelled": env.get("PHANTORA_TORCH_VERSION", "").strip() or version("torch"),
        "ns3": version("ns3"),
        "python": platform.python_version(),
    }


def packet_settings(config: PacketConfig, topo: Topology) -> dict[str, Any]:
    """Every PacketConfig field (defaults included) and the parameters the ns-3 model is given on `topo`. What the
    fabric-scaled defaults (a parameter's 0) resolve to is ns-3's to say: the engine reports it, read back from its
    objects, in engine.json (`phantora.netsim.effective`); Python does not compute it again here."""
    rates = sorted({link.bandwidth_bps for link in topo.links})
    return {
        "fields": dataclasses.asdict(config),
        "ns3_params": dict(config.to_params(rates)),  # exactly what the ns-3 model is given
    }


def plain(value: Any) -> Any:
    """`value` as JSON: paths as strings, a Topology by its name, tuples as lists."""
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, Topology):
        return value.name
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def write_config(
    out: Path,
    *,
    options: dict[str, Any],
    topo: Topology,
    packet: PacketConfig | None,
    command: list[str] | None,
    kind: str = "run",
    inputs: Mapping[str, str | Path | None] | None = None,
    rerun_of: dict[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
) -> Path:
    """Write out/config.json; `kind` is the command that wrote the run: run, replay or netsim; `inputs` the files
    it reads, by name (recorded by content); `rerun_of` what `rerun_origin` says of the run it repeats; `env` the
    ranks' environment (`versions`, `model_env`), default this process's."""
    doc: dict[str, Any] = {
        "schema": CONFIG,
        "kind": kind,
        "command": command,
        "cwd": os.getcwd(),  # the ranks start here, and relative paths in the options are from here
        "options": plain(options),
        "topology": {
            "name": topo.name,
            "sha256": topology_digest(topo),
            "ranks": topo.num_ranks,
            "nodes": len(topo.nodes),
            "links": len(topo.links),
        },
        "inputs": I.records(inputs or {}),
        "packet": packet_settings(packet, topo) if packet is not None else None,
        "model_env": model_env.recorded(os.environ if env is None else env),  # restored by `phantora rerun`
        "versions": versions(env),
    }
    if rerun_of is not None:
        doc["rerun_of"] = rerun_of
    return write_json(out / CONFIG_JSON, doc, sort_keys=False)


def read_config(run: Path) -> dict[str, Any]:
    """A run directory's config.json (InputError if it has none or it is not one)."""
    from phantora.errors import InputError

    path = Path(run) / CONFIG_JSON
    try:
        doc = json.loads(path.read_text())
    except OSError:
        raise InputError("no config.json: not a run directory, or a run from before configs were recorded",
                         file=str(run)) from None  # fmt: skip
    except ValueError as exc:
        raise InputError(f"not JSON: {exc}", file=str(path)) from None
    if not isinstance(doc, dict) or doc.get("schema") != CONFIG:
        raise InputError(f"not a {CONFIG} document", file=str(path))
    return doc


def rerun_origin(run: Path, doc: dict[str, Any]) -> dict[str, Any]:
    """What a rerun records of the run it repeats (`doc`: that run's config.json)."""
    return {
        "dir": str(Path(run).absolute()),
        "config_sha256": I.file_sha256(Path(run) / CONFIG_JSON),
        "kind": doc.get("kind", "run"),
        "command": doc.get("command"),
        "cwd": doc.get("cwd"),
        "versions": doc.get("versions"),
    }
