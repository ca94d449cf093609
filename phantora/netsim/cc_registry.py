"""The congestion controls the ns-3 library registers, and checks of `--cc` and `--set cc.ATTR=VALUE` against them.

Each CC registers itself by name in its own C++ file (`PHANTORA_REGISTER_CC`, ns3-scratch/model/
congestion-control.h); no Python file lists them. `registry()` asks the built library
(`phantora-ns3-runner --list-cc`, with the user's CC library of `$PHANTORA_CC_DIR` loaded) and caches the
answer beside the library it describes, so it is asked once per build.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from phantora.errors import InputError, PhantoraError
from phantora.netsim import ns3_abi, ns3_build
from phantora.units import parse_time_ns


@dataclass(frozen=True)
class CcAttribute:
    """One attribute of a CC's ns-3 TypeId: its value type (e.g. ns3::DoubleValue), default text and help."""

    kind: str
    default: str
    help: str


@dataclass(frozen=True)
class CcInfo:
    """A registered congestion control: its `--cc` name, ns-3 TypeId, whether it wants INT, its attributes."""

    name: str
    typeid: str
    wants_int: bool
    attributes: dict[str, CcAttribute]


_CACHE = "cc-registry.json"
_MEMO: dict[tuple[Path, Path | None], dict[str, CcInfo]] = {}


def registry() -> dict[str, CcInfo]:
    """Every registered CC by name (the library and the runner are built first if needed)."""
    ns3_build.ensure_built()
    lib = ns3_build.library_path()
    extra = ns3_build.cc_library()
    key = (lib, extra)
    if key not in _MEMO:
        _MEMO[key] = _parse(_registry_json(lib, extra))
    return _MEMO[key]


def _registry_json(lib: Path, extra: Path | None) -> str:
    """The runner's --list-cc answer, from the cache beside the newest library if it is younger than both."""
    newest = extra or lib
    cache = newest.parent / _CACHE
    runner = ns3_build.runner_path()
    if not runner.exists():  # (a PHANTORA_NS3_LIB without its runner beside it)
        ns3_abi.check_runner(runner)  # the one-line error naming it and the fix
    built = max(p.stat().st_mtime for p in (lib, runner, *([extra] if extra else [])))
    if cache.exists() and cache.stat().st_mtime >= built:
        return cache.read_text()
    ns3_abi.check_runner(runner)  # about to run it: one of another interface would list another registry
    cmd = [str(ns3_build.runner_path()), *(["--load", str(extra)] if extra else []), "--list-cc"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=ns3_abi.QUERY_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise PhantoraError(
            f"listing the congestion controls ({' '.join(cmd)}) took more than {ns3_abi.QUERY_TIMEOUT_S:.0f} s"
        ) from None
    if proc.returncode != 0:
        raise PhantoraError(f"listing the congestion controls failed ({' '.join(cmd)}): {proc.stderr.strip()}")
    try:
        tmp = cache.with_name(f".{_CACHE}.{os.getpid()}")
        tmp.write_text(proc.stdout)
        tmp.replace(cache)
    except OSError:
        pass  # a read-only library folder ($PHANTORA_NS3_LIB): ask the runner every time
    return proc.stdout


def _parse(text: str) -> dict[str, CcInfo]:
    out = {}
    for name, entry in json.loads(text).items():
        attrs = {a: CcAttribute(v["type"], v["default"], v["help"]) for a, v in entry["attributes"].items()}
        out[name] = CcInfo(name, entry["typeid"], bool(entry["wants_int"]), attrs)
    return out


def cc_names() -> list[str]:
    """The registered names, sorted."""
    return sorted(registry())


def lookup(cc: str, field: str = "cc") -> CcInfo:
    """The registered CC `cc`, or an InputError naming `field` and listing the registered ones."""
    known = registry()
    if cc not in known:
        raise InputError(f"unknown congestion control {cc!r} (registered: {', '.join(sorted(known))})", field=field)
    return known[cc]


def attribute_problem(info: CcInfo, name: str, value: object) -> str | None:
    """Why `value` cannot be attribute `name` of this CC (None if it can), checked as its ns-3 type parses it."""
    if name not in info.attributes:
        listed = ", ".join(sorted(info.attributes)) or "none"
        return f"congestion control {info.name!r} has no attribute {name!r} (its attributes: {listed})"
    text = str(value).strip()
    kind = info.attributes[name].kind
    wants = {
        "ns3::DoubleValue": "a number",
        "ns3::UintegerValue": "an integer >= 0",
        "ns3::IntegerValue": "an integer",
        "ns3::BooleanValue": "true or false",
        "ns3::TimeValue": "a time such as 4us",
    }
    try:
        if kind == "ns3::DoubleValue":
            float(text)
        elif kind == "ns3::UintegerValue" and int(text) < 0:
            raise ValueError
        elif kind == "ns3::IntegerValue":
            int(text)
        elif kind == "ns3::BooleanValue" and text.lower() not in ("true", "false", "1", "0"):
            raise ValueError
        elif kind == "ns3::TimeValue":
            parse_time_ns(text)
    except (ValueError, InputError):
        return f"attribute {name} of {info.name} takes {wants[kind]}, got {text!r}"
    return None


def check(cc: str, attrs: Mapping[str, object], source: str | None = None) -> CcInfo:
    """`cc` is registered and every `attrs` item is one of its attributes with a value of its type; else an
    InputError naming the field (`cc`, or `cc.ATTR`) and what is known."""
    try:
        info = lookup(cc)
    except InputError as exc:
        raise InputError(exc.message, file=source, field="cc") from None
    for name, value in attrs.items():
        why = attribute_problem(info, name, value)
        if why is not None:
            raise InputError(why, file=source, field=f"cc.{name}")
    return info


def wants_int(cc: str) -> bool:
    """Whether the CC asks the switches to stamp INT (HPCC does)."""
    return lookup(cc).wants_int
