"""`jobs.recorded.merge` keeps each job's sender queues (`Flow.queue`) whole and apart: a queue is one sender's
(PAT's rank sends its steps to several peers in turn, `DagBuilder.sender_queue`), so the merged flows of one job's
queue share one id whatever their destinations, and two jobs' queues never share one."""

from __future__ import annotations

from phantora.jobs.recorded import RecordedJob, merge
from phantora.jobs.spec import JobSpec
from phantora.netsim.base import Flow


def _job(index: int) -> RecordedJob:
    flows = [Flow(0, 0, 1, 10, queue=5), Flow(1, 0, 2, 10, queue=5), Flow(2, 3, 1, 10, queue=6)]
    return RecordedJob(index, JobSpec(f"j{index}", "workload", "w.toml"), flows)


def test_a_senders_queue_stays_one_queue_across_its_destinations() -> None:
    a, b = merge([_job(0), _job(1)])[:3], merge([_job(0), _job(1)])[3:]
    assert a[0].queue == a[1].queue != 0  # node 0's steps to nodes 1 and 2: one queue, as in the job
    assert a[2].queue not in (0, a[0].queue)  # another queue stays another
    assert {f.queue for f in a}.isdisjoint(f.queue for f in b)  # jobs never share one
