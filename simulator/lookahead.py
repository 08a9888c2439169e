"""A lookahead teacher: of a heuristic's best candidates, the one the known future favours.

For a pending placement the simulation is copied once per candidate with `os.fork` (a running
coroutine cannot be copied any other way). Each copy holds every random generator too, so all
candidates meet the same arrivals and durations (common random numbers) and differ only by the
placement. Each copy places the pod on its candidate, lets `rollout` place every later pod for
`horizon_minutes`, and reports the objectives it measured. The label is the candidate whose
objectives score lowest by the composite against the candidates' mean, when it beats the
heuristic's own first choice by at least `margin`; otherwise that choice stands. Smaller
differences are mostly what that particular future did, which the policy cannot see, and labels
made of them teach noise. It reads the future, so it serves training only, as the expert of
DAgger (Ross et al., 2011) and expert iteration (Anthony et al., 2017).
"""

from __future__ import annotations

import os
from dataclasses import astuple, dataclass, field, fields

import numpy as np

from policies import ranking
from policies.objectives import Objectives, ObjectiveWeights, composite
from policies.placement import PlacementPolicy
from simulator import engine
from simulator.engine import Decision, Simulation, Steps
from simulator.evaluation import objectives_of

_MEASURES = len(fields(Objectives))  # sent back by each copy as float64


@dataclass(frozen=True)
class Lookahead:
    rollout: PlacementPolicy  # ranks the candidates and places every later pod in the copies
    candidates: int = 4  # the rollout policy's best this many feasible nodes are tried
    horizon_minutes: int = 15  # past the 10-minute scale-down delay, so node release is seen
    margin: float = 0.01  # composite a candidate must gain over the rollout's choice to be the label
    weights: ObjectiveWeights = field(default_factory=ObjectiveWeights)

    def __post_init__(self) -> None:
        if self.candidates < 1 or self.horizon_minutes < 1 or self.margin < 0:
            raise ValueError(
                f"lookahead: candidates {self.candidates}, horizon {self.horizon_minutes} min, "
                f"margin {self.margin}"
            )

    def ranked(self, decision: Decision) -> np.ndarray:
        """The feasible rows, the rollout policy's best first (ties in row order)."""
        feasible = np.flatnonzero(decision.feasible)
        candidates = decision.nodes.take(feasible)
        return feasible[ranking.rank(decision.pod, candidates, self.rollout, prefiltered=True).best_first()]

    def outcomes(self, simulation: Simulation, steps: Steps, decision: Decision) -> list[tuple[int, float]]:
        """(row, composite against the candidates' mean) per candidate, the rollout's best first.
        `steps` must be paused at `decision`; it is left there."""
        rows = self.ranked(decision)[: self.candidates].tolist()
        end = min(int(decision.now // 60.0) + 1 + self.horizon_minutes, simulation.end_minute)
        before = objectives_of(simulation.result, 1.0)
        children = [self._fork(simulation, steps, row, end) for row in rows]
        seconds = max(end * 60.0 - decision.now, 1.0)
        measured = [_difference(_collect(child), before, seconds) for child in children]
        known = [m for m in measured if m is not None]
        if not known:
            return [(row, 0.0) for row in rows]
        mean = Objectives(*np.mean([astuple(m) for m in known], axis=0).tolist())
        return [
            (row, composite(m, mean, self.weights) if m is not None else float("inf"))
            for row, m in zip(rows, measured)
        ]

    def label(self, simulation: Simulation, steps: Steps, decision: Decision) -> int:
        """The row the future favours among the candidates: the first of the lowest composite,
        where it beats the rollout's choice by `margin`; the rollout's choice otherwise, and
        whenever the rollout's own copy could not be measured."""
        (first, first_score), *others = self.outcomes(simulation, steps, decision)
        if first_score == float("inf"):  # nothing to compare the others with
            return first
        best, best_score = min(others, key=lambda outcome: outcome[1], default=(first, first_score))
        return best if best_score < first_score - self.margin else first

    def _fork(
        self, simulation: Simulation, steps: Steps, row: int, end_minute: int
    ) -> tuple[int, int] | None:
        """A copy of this process that plays the run on from placing the pod on `row` (its pid
        and the pipe it answers on); None when the system refuses a process or a pipe."""
        try:
            read, write = os.pipe()
        except OSError:
            return None
        try:
            pid = os.fork()
        except OSError:
            os.close(read)
            os.close(write)
            return None
        if pid:
            os.close(write)
            return pid, read
        code = 1
        try:  # the copy: never returns, never runs the parent's exit handlers
            os.close(read)
            simulation.end_minute = end_minute
            result = engine.drive(steps, lambda decision: engine.best_row(self.rollout, decision), first=row)
            os.write(write, np.array(astuple(objectives_of(result, 1.0)), dtype=np.float64).tobytes())
            code = 0
        finally:
            os._exit(code)


def _collect(child: tuple[int, int] | None) -> np.ndarray | None:
    """What one copy measured; None when it died without saying or never started."""
    if child is None:
        return None
    pid, read = child
    size = _MEASURES * 8
    data = b""
    try:
        while len(data) < size:
            chunk = os.read(read, size - len(data))
            if not chunk:
                break
            data += chunk
    finally:
        os.close(read)
        os.waitpid(pid, 0)
    return np.frombuffer(data, dtype=np.float64) if len(data) == size else None


def _difference(after: np.ndarray | None, before: Objectives, seconds: float) -> Objectives | None:
    """The objectives of the horizon alone (utilization: the mean allocation share over it)."""
    if after is None:
        return None
    change = after - np.array(astuple(before))
    return Objectives(float(change[0]) / seconds, float(change[1]), float(change[2]), float(change[3]))
