"""The bytes Python's own csv writer gives a header and rows: the reference the results writers are held to."""

from __future__ import annotations

import csv
import io


def csv_bytes(header: list[str], rows: list[list[object]]) -> bytes:
    """`header` then `rows` as `csv.writer` writes them, encoded."""
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(header)
    w.writerows(rows)
    return buf.getvalue().encode()
