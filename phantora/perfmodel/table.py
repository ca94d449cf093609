"""Measured-timing tables: reader, writer and lookup (a measured entry takes priority over the model).

phantora's own format is a CSV with header `op,shapes,dtypes,extra,nanos`:
- `op`: aten op name, e.g. `aten::mm`;
- `shapes`: JSON list of input shapes, e.g. `[[1024,4096],[4096,4096]]`;
- `dtypes`: JSON list of dtypes, e.g. `["bfloat16","bfloat16"]`;
- `extra`: JSON object of scalar arguments that change the op (e.g. `{"causal":true}`), or empty;
- `nanos`: kernel-only GPU time per call, integer ns.
Lines starting with `#` are comments. The perfdb formats (`op,key,nanos` and `kind,size_bytes,nanos`)
are read too; their rows are marked `aliased` (operands of equal size and dtype shared one buffer).
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from phantora.errors import InputError
from phantora.files import csv_records, read_text
from phantora.perfmodel.features import OpCall, compute_features, make_call
from phantora.perfmodel.perfdb import memcpy_call, perfdb_call

HEADER = ["op", "shapes", "dtypes", "extra", "nanos"]
PERFDB_COMPUTE = ["op", "key", "nanos"]
PERFDB_MEMCPY = ["kind", "size_bytes", "nanos"]


@dataclass(frozen=True)
class MeasuredRow:
    """One measured op: the call, its time, whether operands shared buffers, and where it came from."""

    call: OpCall
    nanos: int
    aliased: bool = False
    source: str = ""
    label: str = ""


def read_table(path: str | Path) -> list[MeasuredRow]:
    """Read a table in phantora's format or a perfdb format (chosen by the header)."""
    path = Path(path)
    text = read_text(path, "table")
    header: list[str] | None = None
    rows: list[MeasuredRow] = []
    for line, record in csv_records(text):
        if header is None:
            header = [h.strip() for h in record]
            if header not in (HEADER, PERFDB_COMPUTE, PERFDB_MEMCPY):
                raise InputError(
                    f"unknown table header {','.join(header)!r} (expected {','.join(HEADER)!r}, "
                    f"or perfdb's {','.join(PERFDB_COMPUTE)!r} / {','.join(PERFDB_MEMCPY)!r})",
                    file=str(path),
                    line=line,
                )
            continue
        if len(record) != len(header):
            raise InputError(f"expected {len(header)} columns, found {len(record)}", file=str(path), line=line)
        try:
            row = _parse_row(header, record, f"{path}:{line}")
            compute_features(row.call, aliased=row.aliased)  # shapes must fit the op
            rows.append(row)
        except InputError as exc:
            raise InputError(_strip_where(exc), file=str(path), line=line, field=exc.field) from None
    if header is None:
        raise InputError("empty table (no header)", file=str(path))
    return rows


def _strip_where(exc: InputError) -> str:
    """The message of an InputError without its 'field ...: ' prefix (re-raised with file and line)."""
    msg = str(exc)
    prefix = f"field '{exc.field}': " if exc.field else ""
    return msg[len(prefix) :] if prefix and msg.startswith(prefix) else msg


def _nanos(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise InputError(f"nanos {text!r} is not an integer", field="nanos") from None
    if value < 0:
        raise InputError(f"nanos {value} is negative", field="nanos")
    return value


def _json(text: str, field: str, kind: type) -> Any:
    try:
        value = json.loads(text) if text.strip() else kind()
    except json.JSONDecodeError as exc:
        raise InputError(f"bad JSON ({exc.msg} at column {exc.colno})", field=field) from None
    if not isinstance(value, kind):
        raise InputError(f"expected a JSON {kind.__name__}, found {type(value).__name__}", field=field)
    return value


def _parse_row(header: list[str], record: list[str], source: str) -> MeasuredRow:
    if header == PERFDB_COMPUTE:
        op, key, nanos = record
        obj = _json(key, "key", dict)
        if list(obj) != [op]:
            raise InputError(f"key must be an object with the single entry {op!r}", field="key")
        return MeasuredRow(perfdb_call(op, obj[op]), _nanos(nanos), True, source, op)
    if header == PERFDB_MEMCPY:
        kind, size, nanos = record
        try:
            nbytes = int(size)
        except ValueError:
            raise InputError(f"size_bytes {size!r} is not an integer", field="size_bytes") from None
        return MeasuredRow(memcpy_call(kind, nbytes), _nanos(nanos), False, source, kind)
    op, shapes, dtypes, extra, nanos = record
    if not op.strip():
        raise InputError("empty op name", field="op")
    call = make_call(
        op.strip(), _json(shapes, "shapes", list), _json(dtypes, "dtypes", list), _json(extra, "extra", dict)
    )
    return MeasuredRow(call, _nanos(nanos), False, source, call.op)


def write_table(path: str | Path, rows: list[MeasuredRow], *, comment: str | None = None) -> None:
    """Write rows in phantora's format (readable back by read_table), after an optional `# comment` line."""
    with Path(path).open("w", newline="") as fh:
        if comment:
            fh.write(f"# {comment}\n")
        w = csv.writer(fh)
        w.writerow(HEADER)
        for r in rows:
            c = r.call
            extra = json.dumps(c.extra, sort_keys=True, separators=(",", ":")) if c.extra else ""
            w.writerow(
                [c.op, json.dumps([list(s) for s in c.shapes], separators=(",", ":")), json.dumps(list(c.dtypes)),
                 extra, r.nanos]
            )  # fmt: skip


class TimingTable:
    """Measured times by call key. The first row of a key wins. `gpu` names the GPU it was measured on."""

    def __init__(self, rows: list[MeasuredRow] | None = None, *, gpu: str | None = None) -> None:
        self.gpu = gpu
        self._by_key: dict[tuple, int] = {}
        for r in rows or []:
            self.add(r)

    def add(self, row: MeasuredRow) -> None:
        self._by_key.setdefault(row.call.key(), row.nanos)

    def lookup(self, call: OpCall) -> int | None:
        """The measured ns of exactly this call (op, shapes, dtypes, extra), or None."""
        return self._by_key.get(call.key())

    def __len__(self) -> int:
        return len(self._by_key)

    @classmethod
    def from_files(cls, paths: list[str | Path], *, gpu: str | None = None) -> TimingTable:
        rows: list[MeasuredRow] = []
        for p in paths:
            rows.extend(read_table(p))
        return cls(rows, gpu=gpu)
