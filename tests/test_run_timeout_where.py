"""A run past its bound says where its ranks stood, in one line: the ranks still running, each one's last simulated
time and last call as the coordinator saw them, and the logs where each wrote its threads' stacks as it was stopped
(phantora/runtime/stop_stacks.py)."""

from __future__ import annotations

import re
import sys
import threading
import time
from pathlib import Path

from bridge.errors import BridgeError
from bridge.run import CosimRun
from phantora.topology.generators import leaf_spine

RANK = r"""
import sys, time
from pathlib import Path
from bridge.client import RankClient
from phantora.runtime.stop_stacks import dump_stacks_when_stopped

dump_stacks_when_stopped()
c = RankClient.from_env()
h = c.collective(group=[0, 1], seq=1 - c.rank, kind="all_reduce", nbytes=1 << 23, dtype="bf16", root=None,
                 t_issue_ns=5000 * (c.rank + 1), name="grads")  # seq: rank 1's is not rank 0's, so they never meet
Path(sys.argv[1], f"issued{c.rank}").touch()
if c.rank == 1:
    time.sleep(600)  # the culprit: it never waits, nor issues rank 0's seq
c.wait(h)
"""


def test_a_run_past_its_bound_names_where_each_rank_stood_and_its_stacks(tmp_path: Path) -> None:
    script = tmp_path / "sleeper.py"
    script.write_text(RANK)
    star2 = leaf_spine(1, 2, 0, nic_rate="100Gbps", latency="1us")
    run = CosimRun(
        star2, rank_cmd=[sys.executable, str(script), str(tmp_path)], timeout_s=600, out_dir=tmp_path / "run"
    )
    got: list[BaseException] = []
    thread = threading.Thread(target=lambda: got.append(_raised(run)))
    t0 = time.monotonic()
    thread.start()
    # start-up takes seconds to a minute on a loaded machine: bound the run 1 s after both ranks issued
    while not all((tmp_path / f"issued{r}").exists() for r in (0, 1)) and time.monotonic() - t0 < 300:
        time.sleep(0.1)
    run.timeout_s = time.monotonic() - t0 + 1.0
    thread.join(120)
    text = str(got[0])
    assert isinstance(got[0], BridgeError) and "\n" not in text, text
    assert re.match(r"the run did not finish within \d+ s; still running: ", text), text
    want0 = r"rank 0 \(pid \d+\): waiting at 5000 ns, last call all_reduce 'grads' \(8388608 B\) at 5000 ns"
    want1 = r"rank 1 \(pid \d+\): running, last reported at 10000 ns, last call all_reduce 'grads' \(8388608 B\) at 10"
    assert re.search(want0, text) and re.search(want1, text), text
    logs = text.split("their stacks as they were stopped in ")[1].split(", ")
    assert [Path(p).name for p in logs] == ["rank0.log", "rank1.log"]
    # each log holds its rank's stack: rank 1 in its sleep, rank 0 in the client's wait
    assert re.search(r'sleeper\.py", line 13 in <module>', Path(logs[1]).read_text())
    assert re.search(r'client\.py", line \d+ in wait', Path(logs[0]).read_text())


def _raised(run: CosimRun) -> BaseException:
    try:
        run.run()
    except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
        return exc
    return AssertionError("the run finished")
