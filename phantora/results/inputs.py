"""The input files of a run, by content: recorded in config.json (`inputs`), checked by `phantora rerun`.

An input is a file (its sha256 and size) or a directory (an execution graph, a folder of Kineto traces:
the sha256 of every file under it, by relative path). `check` compares what is on disk now with what a
run recorded and raises one InputError naming the file and what changed: moved or deleted, its content
changed, a file added to or removed from a directory.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from phantora.errors import InputError

CHUNK = 1 << 20


def file_sha256(path: Path) -> str:
    """The sha256 of a file's bytes, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def record(path: str | Path) -> dict[str, Any]:
    """What identifies an input: its absolute path and the digest of its file or of every file under it."""
    p = Path(path).absolute()
    if p.is_dir():
        files = sorted(q for q in p.rglob("*") if q.is_file())
        return {"path": str(p), "files": {q.relative_to(p).as_posix(): file_sha256(q) for q in files}}
    return {"path": str(p), "sha256": file_sha256(p), "bytes": p.stat().st_size}


def records(inputs: Mapping[str, str | Path | None]) -> dict[str, dict[str, Any]]:
    """`record` of each named input that was given (None: not given) and exists (a missing one was refused)."""
    return {name: record(p) for name, p in inputs.items() if p is not None and Path(p).exists()}


def _short(digest: str) -> str:
    return digest[:12]


def _more(items: list[str]) -> str:
    return f" (and {len(items) - 1} more)" if len(items) > 1 else ""


def check(name: str, rec: Mapping[str, Any], where: str) -> Path:
    """The recorded input `name` as it is now; InputError if it moved or changed (`where`: the config.json)."""
    p = Path(rec["path"])
    what = f"{name} {p}"
    if "files" in rec:
        if not p.is_dir():
            raise InputError(f"{what}: the run's input directory is gone (moved or deleted since the run)", file=where)
        now: dict[str, str] = record(p)["files"]
        then: dict[str, str] = rec["files"]
        gone = sorted(then.keys() - now.keys())
        added = sorted(now.keys() - then.keys())
        changed = [rel for rel in sorted(then.keys() & now.keys()) if now[rel] != then[rel]]
        if gone:
            raise InputError(f"{what}: {gone[0]} is gone since the run (moved or deleted){_more(gone)}", file=where)
        if added:
            raise InputError(f"{what}: {added[0]} was added since the run{_more(added)}", file=where)
        if changed:
            rel = changed[0]
            raise InputError(
                f"{what}: {rel} changed since the run (sha256 {_short(now[rel])}..., the run read "
                f"{_short(then[rel])}...){_more(changed)}",
                file=where,
            )
        return p
    if not p.is_file():
        raise InputError(f"{what}: the run's input file is gone (moved or deleted since the run)", file=where)
    digest = file_sha256(p)
    if digest != rec["sha256"]:
        size = p.stat().st_size
        sizes = f"{size} bytes, the run read {rec['bytes']}" if size != rec.get("bytes") else f"same size, {size} bytes"
        raise InputError(
            f"{what} changed since the run ({sizes}; sha256 {_short(digest)}..., "
            f"the run read {_short(rec['sha256'])}...)",
            file=where,
        )
    return p


def check_all(recorded: Mapping[str, Mapping[str, Any]], where: str) -> dict[str, Path]:
    """`check` every recorded input; their paths by name."""
    return {name: check(name, rec, where) for name, rec in recorded.items()}
