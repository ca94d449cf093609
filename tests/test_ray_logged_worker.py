"""bridge.ray_workers.LoggedWorker, the part both Ray actors' bodies share (decomposition and partition workers):
the endpoint once the worker has written it, else an error naming the worker with its log's last three lines."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from bridge.ray_workers import LoggedWorker, last_words, spawn_logged
from phantora.errors import PhantoraError


def _worker(tmp_path: Path, code: str) -> LoggedWorker:
    w = LoggedWorker()
    w.log = tmp_path / "worker.log"
    w.proc = spawn_logged([sys.executable, "-c", code], {}, str(tmp_path), w.log)
    return w


def test_the_endpoint_the_worker_wrote(tmp_path: Path) -> None:
    path, tmp = tmp_path / "net.endpoint", tmp_path / ".net.tmp"
    # published as the workers publish it (bridge.transport.write_endpoint_file: written, then renamed into place);
    # a file opened in place can be seen empty before its line is written
    code = (
        f"import os; open({str(tmp)!r}, 'w').write('tcp://127.0.0.1:5555\\n'); os.replace({str(tmp)!r}, {str(path)!r})"
    )
    w = _worker(tmp_path, code)
    assert w.wait_endpoint(path, 60.0, "the worker") == "tcp://127.0.0.1:5555"
    w.proc.wait()
    assert w.poll() == 0


def test_a_worker_that_exits_first_is_named_with_its_last_lines(tmp_path: Path) -> None:
    code = "import sys; [print(f'line {i}', file=sys.stderr) for i in range(5)]; sys.exit(7)"
    w = _worker(tmp_path, code)
    with pytest.raises(PhantoraError) as err:
        w.wait_endpoint(tmp_path / "never", 60.0, "partition worker 3")
    assert str(err.value) == "partition worker 3 did not start (exit 7): line 2 | line 3 | line 4"
    assert w.tail() == "line 2 | line 3 | line 4"


def test_a_worker_past_the_timeout_is_named(tmp_path: Path) -> None:
    w = _worker(tmp_path, "import time; time.sleep(30)")
    try:
        with pytest.raises(PhantoraError, match=r"^the worker did not start \(exit None\): $"):
            w.wait_endpoint(tmp_path / "never", 0.1, "the worker")
    finally:
        w.proc.kill()
        w.proc.wait()


def test_the_last_words_of_no_log_or_a_blank_one_are_empty(tmp_path: Path) -> None:
    assert last_words(tmp_path / "none.log") == ""
    (tmp_path / "blank.log").write_text("\n  \n")
    assert last_words(tmp_path / "blank.log") == ""
    (tmp_path / "two.log").write_text("a\nb\n")
    assert last_words(tmp_path / "two.log") == "a | b"
