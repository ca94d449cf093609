"""lane_marks.py: a synchronise at host time h waits for the end of the work launched at h or before on each lane.

On a VirtualClock: the program's kernels between two moves of its host time are launched at that time (its tail,
marked when the time moves or another thread launches on the compute lane); a thread's kernel at its own host time.
"""

from __future__ import annotations

from phantora.runtime.clock import VirtualClock
from phantora.runtime.lane_marks import PRUNE_AT, LaneMarks


class Program:
    """The program's host time, as the session keeps it."""

    def __init__(self) -> None:
        self.h = 0


def marks_on(clock: VirtualClock, program: Program, floor: list[int | None]) -> LaneMarks:
    return LaneMarks(clock, lambda: program.h, lambda: floor[0])


def test_the_programs_kernels_launched_after_a_threads_time_are_not_waited_for() -> None:
    clock, program = VirtualClock(), Program()
    marks = marks_on(clock, program, [None])
    clock.charge(300)  # the program's kernel at host 0: 0-300
    marks.main_moves()
    program.h = 300  # its synchronise
    clock.charge(5_000)  # its next kernel, launched at 300: 300-5,300
    assert marks.upto(100) == 300
    assert marks.upto(299) == 300
    assert marks.upto(300) == 5_300  # launched at the thread's time: before it (the program's thread first)


def test_a_threads_kernel_on_the_compute_lane_after_the_programs_tail() -> None:
    clock, program = VirtualClock(), Program()
    marks = marks_on(clock, program, [None])
    program.h = 50
    clock.charge(100)  # the program's, at 50: 0-100
    marks.before(0)  # a thread at 80 launches 40 ns on the compute lane: 100-140
    clock.occupy(0, max(clock.compute_ns, 80), 40)
    marks.after(0, 80)
    clock.charge(1_000)  # the program's again, still at 50: 140-1,140
    assert marks.upto(49) == 0
    assert marks.upto(79) == 1_140  # the program's tail at 50 ends last
    program.h = 2_000
    assert marks.upto(60) == 1_140


def test_a_side_lane_keeps_its_launches_apart() -> None:
    clock, program = VirtualClock(), Program()
    marks = marks_on(clock, program, [None])
    for h, ns in ((10, 100), (20, 100), (30, 100)):
        clock.occupy(7, max(clock.lanes.get(7, 0), h), ns)
        marks.after(7, h)
    assert [marks.upto(h) for h in (5, 10, 25, 30)] == [0, 110, 210, 310]
    clock.lane_wait(7, 1_000)  # moved where no launch was marked: taken in whole
    assert marks.upto(5) == 1_000


def test_marks_no_live_thread_can_ask_about_are_dropped_and_their_end_kept() -> None:
    clock, program = VirtualClock(), Program()
    floor: list[int | None] = [None]
    marks = marks_on(clock, program, floor)
    for h in range(1, PRUNE_AT + 1):
        clock.occupy(3, clock.lanes.get(3, 0), 10)
        marks.after(3, 100 * h)
    floor[0] = 100 * (PRUNE_AT - 1)
    clock.occupy(3, clock.lanes.get(3, 0), 10)
    marks.after(3, 100 * (PRUNE_AT + 1))
    assert len(marks._hs[3]) == 3  # the last at or before the floor, and the two after it
    assert marks.upto(100 * PRUNE_AT) == 10 * PRUNE_AT
    assert marks.upto(150) == 10 * (PRUNE_AT - 2)  # before every kept mark: the latest dropped one's end


def test_a_streams_synchronise_waits_for_its_lane_alone() -> None:
    """A thread's stream synchronise or timed wait at h: that stream's lane's work launched at h or before; a stream
    with no side lane of its own runs on the compute lane."""
    clock, program = VirtualClock(), Program()
    marks = marks_on(clock, program, [None])
    clock.charge(9_000)  # the program's long kernel at host 0: 0-9,000
    marks.main_moves()
    program.h = 100
    clock.occupy(7, 20, 300)  # a thread's kernel on its side stream, launched at 20: 20-320
    marks.after(7, 20)
    clock.charge(4_000)  # the program's next, launched at 100: 9,000-13,000
    assert marks.upto(50) == 9_000  # a device synchronise: every lane's work launched by then
    assert marks.upto(50, (7,)) == 320  # its stream's alone
    assert marks.upto(50, (0,)) == 9_000 and marks.upto(150, (0,)) == 13_000
    assert marks.upto(50, (8,)) == 9_000  # a stream with no lane: the compute lane's
