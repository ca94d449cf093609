"""Queue sampling by owner across partition workers (issue 38): the merge of the workers' samples into one engine's
list, and the one-ns windows until a sampling start is known (the slow run against one engine is in
tests/test_netsim_partition.py)."""

from __future__ import annotations

import pytest

from phantora.errors import PhantoraError
from phantora.netsim.cut_windows import BEFORE, NEVER, window_end
from phantora.netsim.observe import QueueSample
from phantora.netsim.record_order import merge_queue_samples


def q(t: int, node: int, port: int, prio: int = 3, b: int = 1000) -> QueueSample:
    return QueueSample(t, node, port, prio, b)


def test_merge_is_one_engines_order_through_its_last_instant() -> None:
    """Worker 0 runs switches 4 and 6, worker 1 switch 5; sampling from 100 ns every 1,000 ns, the last flow ends
    at 2,500 ns: one engine samples at 100, 1,100, 2,100 and 3,100 (the first instant at or after 2,500) and lists
    each instant's rows by (node, port, class); the workers' rows at 4,100 (before a barrier told them) go."""
    w0 = [q(100, 4, 0), q(100, 6, 1), q(1100, 4, 0, 1), q(1100, 4, 0, 3), q(3100, 6, 2), q(4100, 6, 2)]
    w1 = [q(100, 5, 3), q(2100, 5, 0), q(3100, 5, 0, b=0), q(4100, 5, 1)]
    got = merge_queue_samples([w0, w1], 100, 1000, 2500)
    assert [(s.time_ns, s.node, s.port, s.prio) for s in got] == [
        (100, 4, 0, 3), (100, 5, 3, 3), (100, 6, 1, 3), (1100, 4, 0, 1), (1100, 4, 0, 3), (2100, 5, 0, 3),
        (3100, 5, 0, 3), (3100, 6, 2, 3),
    ]  # fmt: skip


@pytest.mark.parametrize(("end", "last"), [(2100, 2100), (2101, 3100), (100, 100), (50, 100)])
def test_last_instant_is_the_first_at_or_after_the_end(end: int, last: int) -> None:
    rows = [q(t, 4, 0) for t in range(100, 6000, 1000)]
    assert merge_queue_samples([rows], 100, 1000, end)[-1].time_ns == last


def test_no_samples_and_bad_input() -> None:
    assert merge_queue_samples([[], []], -1, 0, 0) == []
    with pytest.raises(PhantoraError, match="worker 1: queue sample 1"):
        merge_queue_samples([[q(100, 4, 0)], [q(1100, 5, 0), q(100, 5, 0)]], 100, 1000, 5000)
    with pytest.raises(PhantoraError, match=r"two partition workers sampled queue \(4, 0, 3\) at 100 ns"):
        merge_queue_samples([[q(100, 4, 0)], [q(100, 4, 0)]], 100, 1000, 5000)
    with pytest.raises(PhantoraError, match="not a sampling grid"):
        merge_queue_samples([[q(100, 4, 0)]], -1, 1000, 5000)


def test_window_runs_one_ns_until_a_sampling_start_is_known() -> None:
    """The cap ends the window before glob + 1 (all of ns glob), under the lookahead; a release bound below it
    still wins."""
    assert window_end(500, 1000, NEVER, NEVER, -1) == (1500, BEFORE)
    assert window_end(500, 1000, NEVER, NEVER, -1, cap=501) == (501, BEFORE)
    assert window_end(500, 1000, NEVER, 500, -1, cap=501) == (500, "through")
