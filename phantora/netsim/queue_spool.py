"""Queue samples kept on disk as they are drained (issue 38): a run's samples are a sequence whose memory does not
grow with the run.

A packet run samples every switch egress queue every `queue_sample_ns` (1 us by default on the commands) and keeps
a row for each non-empty (or just emptied) queue: a congested run makes millions of rows. `QueueSpool` appends them,
packed in 28 bytes each, to an unnamed temporary file and reads them back in blocks; `len`, iteration, indexing and
slices work as on a list. Before each write it checks the free space of the file's disk, so a run that would fill
it stops at once in one line naming `--queue-sample-ns` (and how much space it needed), not when the disk is full.
"""

from __future__ import annotations

import os
import shutil
import struct
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from typing import IO, overload

from phantora.errors import PhantoraError
from phantora.netsim.observe import QueueSample

RECORD = struct.Struct("<qIIIQ")  # time_ns, node, port, prio, bytes
READ_RECORDS = 16_384  # records read back at a time (459 kB)
WRITE_BYTES = 16_384 * RECORD.size  # packed records written at a time (459 kB)
# Keep this much of the spool's disk free, or a tenth of the disk if that is less (a small tmpfs): a spool write that
# would leave less stops the run (QueueSpoolFullError).
DISK_RESERVE_BYTES = 1 << 30


class QueueSpoolFullError(PhantoraError):
    """Writing more queue samples would leave the spool's disk with less than its reserve."""


class QueueSpool(Sequence[QueueSample]):
    """Queue samples in drain order, packed on an unnamed temporary file (in `directory`, default the temp dir)."""

    def __init__(self, directory: str | None = None, reserve_bytes: int | None = None) -> None:
        self._dir = directory or tempfile.gettempdir()
        if reserve_bytes is None:
            reserve_bytes = min(DISK_RESERVE_BYTES, shutil.disk_usage(self._dir).total // 10)
        self._reserve = reserve_bytes
        self._file: IO[bytes] | None = None
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def extend(self, samples: Iterable[tuple[int, int, int, int, int]]) -> None:
        """Append (time_ns, node, port, prio, bytes) rows, WRITE_BYTES at a time (an iterator is not held)."""
        buf = bytearray()
        for s in samples:
            buf += RECORD.pack(*s)
            if len(buf) >= WRITE_BYTES:
                self._write(buf)
                buf.clear()
        if buf:
            self._write(buf)

    def _write(self, data: bytearray) -> None:
        free = shutil.disk_usage(self._dir).free
        if free - len(data) < self._reserve:
            raise QueueSpoolFullError(
                f"queue samples: {self._count:,} rows so far ({self._count * RECORD.size / 1e9:.2f} GB in "
                f"{self._dir}), {len(data):,} bytes more would leave less than {self._reserve / 1e9:.2f} GB free "
                "there; sample less often (--queue-sample-ns N, or --set queue_sample_ns=N, N above the run's; "
                "0 turns sampling off)"
            )
        f = self._open()
        f.seek(0, 2)
        f.write(data)
        self._count += len(data) // RECORD.size

    def __eq__(self, other: object) -> bool:
        """Equal to any sequence of the same samples in the same order (a list, another spool)."""
        if not isinstance(other, Sequence) or isinstance(other, (str, bytes)):
            return NotImplemented
        return len(other) == self._count and all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"QueueSpool({self._count:,} samples)"

    def __iter__(self) -> Iterator[QueueSample]:
        return self._read(0, self._count)

    @overload
    def __getitem__(self, i: int) -> QueueSample: ...

    @overload
    def __getitem__(self, i: slice) -> list[QueueSample]: ...

    def __getitem__(self, i: int | slice) -> QueueSample | list[QueueSample]:
        if isinstance(i, slice):
            start, stop, step = i.indices(self._count)
            rows = list(self._read(start, max(start, stop)))
            return rows if step == 1 else rows[::step]
        j = i + self._count if i < 0 else i
        if not 0 <= j < self._count:
            raise IndexError("queue sample index out of range")
        return next(self._read(j, j + 1))

    def disk_bytes(self) -> int:
        """The size of the spool's file."""
        return 0 if self._file is None else os.fstat(self._file.fileno()).st_size

    def close(self) -> None:
        """Delete the spool's file (the system deletes it anyway when the process ends)."""
        if self._file is not None:
            self._file.close()
            self._file = None
        self._count = 0

    def _open(self) -> IO[bytes]:
        if self._file is None:
            self._file = tempfile.TemporaryFile(dir=self._dir, prefix="phantora-queues-")
        return self._file

    def _read(self, start: int, stop: int) -> Iterator[QueueSample]:
        at = start
        while at < stop:
            n = min(READ_RECORDS, stop - at)
            f = self._open()
            f.seek(at * RECORD.size)
            block = f.read(n * RECORD.size)
            at += n
            for t, node, port, prio, nbytes in RECORD.iter_unpack(block):
                yield QueueSample(t, node, port, prio, nbytes)
