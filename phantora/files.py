"""Reading a user's input files (text, TOML), with errors that name the file and the line."""

from __future__ import annotations

import csv
import re
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from phantora.errors import InputError


def read_text(path: str | Path, what: str = "file") -> str:
    """The text of the file `path`; an InputError naming it ("cannot read <what>: <reason>") if it cannot be read."""
    try:
        return Path(path).read_text()
    except OSError as exc:
        raise InputError(f"cannot read {what}: {exc.strerror or exc}", file=str(path)) from None
    except UnicodeDecodeError as exc:
        raise InputError(f"cannot read {what}: not text ({exc.reason})", file=str(path)) from None


def parse_toml(text: str, file: str) -> dict[str, Any]:
    """The TOML document `text` of `file`; an InputError naming the file and the line of a syntax error."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        m = re.search(r"line (\d+)", str(exc))
        raise InputError(f"invalid TOML: {exc}", file=file, line=int(m.group(1)) if m else None) from None


def read_toml(path: str | Path, what: str = "file") -> dict[str, Any]:
    """The TOML document in the file `path` (errors as `read_text` and `parse_toml` give them)."""
    return parse_toml(read_text(path, what), str(path))


def csv_records(text: str) -> Iterator[tuple[int, list[str]]]:
    """(line number, fields) of each CSV record of `text`, skipping blank lines and `#` comments."""
    reader = csv.reader(text.splitlines())
    for record in reader:
        if record and not record[0].lstrip().startswith("#"):
            yield reader.line_num, record
