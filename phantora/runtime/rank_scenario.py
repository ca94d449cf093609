"""What a scenario (docs/scenarios.md) asks of one live rank: its slow-GPU windows, and step boundaries.

- `gpu_slow` at a simulated time, or at a step (`at_step = k`: from the moment this rank starts step k, its own
  clock), stretches every compute op of the rank inside the window (`Throttles.stretch`: an op that straddles
  an edge is stretched only for its part inside).
- Network events at a step are the coordinator's engine's: the rank reports each step's start
  (`wants_steps`), and the first rank to start a step triggers them.
"""

from __future__ import annotations

from phantora.netsim.scenario import Scenario, read_scenario
from phantora.perfmodel.throttle import Throttle, Throttles


class RankScenario:
    """One rank's part of a scenario."""

    def __init__(self, scenario: Scenario, rank: int, start_ns: int = 0) -> None:
        self.scenario = scenario
        self.rank = rank
        self.step_starts: dict[int, int] = {0: start_ns}
        self._mine = [e for e in scenario.gpu_slow() if e.rank == rank]
        self.wants_steps = any(e.at_step is not None for e in scenario.network())
        self.throttles = self._throttles()
        self.slowed_ns = 0  # simulated ns the throttles added to this rank's compute

    @classmethod
    def from_file(cls, path: str, rank: int, start_ns: int = 0) -> RankScenario:
        return cls(read_scenario(path), rank, start_ns)

    def _throttles(self) -> Throttles:
        out = []
        for ev in self._mine:
            start = ev.at_ns if ev.at_step is None else self.step_starts.get(ev.at_step)
            if start is not None:
                end = None if ev.duration_ns is None else start + ev.duration_ns
                out.append(Throttle(self.rank, start, end, ev.factor))
        return Throttles(out)

    def step_started(self, step: int, t_ns: int) -> None:
        """This rank starts step `step` at t_ns: slow-GPU windows given at that step begin now."""
        self.step_starts[step] = t_ns
        if any(e.at_step == step for e in self._mine):
            self.throttles = self._throttles()

    def stretch(self, start_ns: int, work_ns: int) -> int:
        """How long `work_ns` of full-speed compute takes on this rank from `start_ns`."""
        if not self.throttles:
            return work_ns
        ns = self.throttles.stretch(self.rank, start_ns, work_ns)
        self.slowed_ns += ns - work_ns
        return ns

    def windows(self) -> list[dict[str, object]]:
        """This rank's slow-GPU windows as started so far (results.json): event, factor, start and end ns."""
        out: list[dict[str, object]] = []
        for ev in self._mine:
            start = ev.at_ns if ev.at_step is None else self.step_starts.get(ev.at_step)
            if start is not None:
                end = None if ev.duration_ns is None else start + ev.duration_ns
                out.append({"event": ev.label, "factor": ev.factor, "start_ns": start, "end_ns": end})
        return out
