"""A gymnasium environment over the cluster simulator: one step places one pod.

The simulation runs as a coroutine (`Simulation.steps`) and stops at every placement it has
to make (scale-ups, pods of keep-alive windows, retries of pending pods). The observation is
`features.encode` of the ready nodes, padded to a fixed number of rows, with a mask of the
nodes the shared filter allows; the action is a row. The reward is what the simulator measured
between this decision and the next (`Meters`, dollars, joules), weighted by `ObjectiveWeights`
and scaled by per-second reference rates so that the four terms are comparable.

Episodes come from `Scenarios`: a window of the training split of a trace, a subset of its
functions, and a cluster drawn from a curriculum of sizes and node mixes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from policies import features
from policies.objectives import ObjectiveWeights
from policies.residual import ResidualBase
from simulator import engine, keepalive, traces, workload
from simulator.clusterspec import ClusterSpec, Pool
from simulator.engine import Decision, RunResult, Simulation
from simulator.learning.config import CapacityQos
from simulator.lookahead import Lookahead
from simulator.nodes import SCALE_DOWN_UNNEEDED_S

# The reward's four terms on one scale: cost and energy in seconds of the episode's initial
# cluster, utilization as a share per second, and image waits so that a normal pod's typical
# pull (~10 s) weighs like a minute of the whole cluster's cost.
QOS_SCALE = 6.0
# With `request_weighted_qos`: seconds requests waited on a pull, about four per pod pulled on
# the bundled clusters, so the term keeps its weight against the others.
REQUEST_QOS_SCALE = QOS_SCALE / 4.0
REWARD_SCALE_S = 60.0  # rewards in units of one minute of the reference
# What the critic may know of the episode's future (training only; the actor never sees it):
# the arrivals ahead drive the return far more than any placement does.
FUTURE_FEATURES = ("left_share", "next_1_min_log", "next_5_min_log", "next_15_min_log", "active_5_min_share")


@dataclass(frozen=True, slots=True)
class Scenario:
    """One episode's world: functions with their counts, a cluster, a seed."""

    trace: traces.Trace
    cluster: ClusterSpec
    seed: int
    drain_underused: bool = False  # the cluster autoscaler also drains underused nodes

    def simulation(self, placement_seed: int = 0) -> Simulation:
        from policies import heuristics

        return Simulation(
            workload=workload.build(self.trace, seed=self.seed),
            counts=self.trace.counts,
            cluster=self.cluster,
            placement=heuristics.RandomPolicy(seed=placement_seed),  # unused when driven
            keepalive=keepalive.by_name("knative"),
            seed=self.seed,
            drain_underused=self.drain_underused,
        )


@dataclass(frozen=True)
class Curriculum:
    """Cluster sizes grow by stage; node mixes are drawn from the bundled pool shapes."""

    stages: tuple[tuple[int, int], ...] = ((6, 16), (12, 32), (20, 48))  # (min, max) initial nodes
    # Drawn log-uniformly: 0.34 a node is `large` (338 functions on 1,000 nodes), 4 `small`.
    functions_per_node: tuple[float, float] = (2.0, 4.5)
    minutes: int = 45

    @classmethod
    def up_to(cls, largest: int, minutes: int = 45, fewest_per_node: float = 2.0) -> Curriculum:
        """Three stages ending at `largest` initial nodes (48 gives the default's)."""
        n = largest
        stages = ((n // 8, n // 3), (n // 4, 2 * n // 3), (5 * n // 12, n))
        return cls(stages=stages, functions_per_node=(fewest_per_node, 4.5), minutes=minutes)

    def stage(self, progress: float) -> tuple[int, int]:
        index = min(int(progress * len(self.stages)), len(self.stages) - 1)
        return self.stages[index]


@dataclass
class Scenarios:
    """Draws episodes from the training split of a trace, following the curriculum."""

    trace: traces.Trace
    shapes: Sequence[Pool]  # pool templates; counts and bounds are drawn
    curriculum: Curriculum = field(default_factory=Curriculum)
    minutes: tuple[int, int] = traces.TRAIN_MINUTES  # the only part training sees
    progress: float = 0.0  # 0..1, set by the trainer
    # > 1: each episode's invocations times a factor drawn log-uniformly from [1, this], so
    # training meets the bursts a quiet training split lacks (1: the trace as it is)
    max_arrival_scale: float = 1.0
    drain_underused: bool = False  # episodes on the ground where underused nodes are drained

    def draw(self, rng: np.random.Generator) -> Scenario:
        low, high = self.curriculum.stage(self.progress)
        nodes = int(rng.integers(low, high + 1))
        cluster = random_cluster(self.shapes, nodes, rng)
        per_node = float(np.exp(rng.uniform(*np.log(self.curriculum.functions_per_node))))
        count = int(min(len(self.trace), max(4, round(nodes * per_node))))
        rows = np.sort(rng.choice(len(self.trace), size=count, replace=False))
        start = int(rng.integers(self.minutes[0], self.minutes[1] - self.curriculum.minutes + 1))
        window = self.trace.subset(rows).window(start, start + self.curriculum.minutes)
        seed = int(rng.integers(2**31))
        if self.max_arrival_scale > 1.0:  # drawn last: unscaled training keeps its random stream
            window = window.scaled(float(np.exp(rng.uniform(0.0, np.log(self.max_arrival_scale)))))
        return Scenario(trace=window, cluster=cluster, seed=seed, drain_underused=self.drain_underused)

    @property
    def max_rows(self) -> int:
        return max_rows(self.curriculum.stages[-1][1], self.shapes)


def random_cluster(shapes: Sequence[Pool], nodes: int, rng: np.random.Generator) -> ClusterSpec:
    """`nodes` nodes over a random mix of the pool shapes (GPU pools get at most a few)."""
    weights = rng.dirichlet(np.ones(len(shapes)))
    counts = np.maximum(np.floor(weights * nodes).astype(int), 0)
    counts[int(np.argmax(weights))] += nodes - counts.sum()
    pools = []
    for shape, count in zip(shapes, counts.tolist()):
        if shape.gpus:
            count = min(count, max(1, nodes // 8))
        if count == 0:
            continue
        pools.append(replace(shape, count=count, min=count // 3, max=2 * count))
    return ClusterSpec(name=f"curriculum-{nodes}", pools=tuple(pools))


def max_rows(nodes: int, shapes: Sequence[Pool]) -> int:
    """Rows an observation needs: every node a cluster of `nodes` may grow to."""
    return 2 * nodes + len(shapes)


class PlacementEnv(gym.Env[dict[str, np.ndarray], int]):
    """One pod per step; see the module docstring."""

    def __init__(
        self,
        draw: Callable[[np.random.Generator], Scenario],
        max_rows: int,
        weights: ObjectiveWeights | None = None,
        shaping_gamma: float | None = None,
        base: ResidualBase | None = None,
        future: bool = False,
        clock: bool = False,
        request_weighted_qos: bool = False,
        capacity_qos: CapacityQos = "",
    ) -> None:
        """`base`: a residual policy's heuristic, whose logits the observation carries.
        `future`: the observation carries `future_features` of the episode's arrivals, for the
        critic (an input-dependent baseline, Mao et al. 2019). `clock`: it carries the
        decision's simulated time, for a discount per second rather than per decision.
        `request_weighted_qos`: the QoS term is the seconds requests waited on pulls (what the
        composite counts), not the seconds pods did. `capacity_qos`: the QoS term also counts
        the seconds pods wait for a node with room ("all"), or their part a placement can
        cause ("scale-up": `Meters.weighted_scale_up_wait_s`)."""
        self.request_weighted_qos, self.capacity_qos = request_weighted_qos, capacity_qos
        self.draw, self.rows, self.weights = draw, max_rows, weights or ObjectiveWeights()
        self.shaping_gamma = shaping_gamma  # the learner's discount when the reward is shaped
        self.base, self.future, self.clock = base, future, clock
        self._counts: np.ndarray = np.zeros((0, 0), dtype=np.int64)
        box = spaces.Box(-np.inf, np.inf, dtype=np.float32, shape=(max_rows, len(features.NODE_FEATURES)))
        extra = {"base": spaces.Box(-np.inf, np.inf, dtype=np.float32, shape=(max_rows,))} if base else {}
        if future:
            extra["future"] = spaces.Box(-np.inf, np.inf, dtype=np.float32, shape=(len(FUTURE_FEATURES),))
        if clock:
            extra["clock"] = spaces.Box(0.0, np.inf, dtype=np.float32, shape=(1,))
        self.observation_space = spaces.Dict(  # type: ignore[assignment]
            {
                **extra,
                "nodes": box,
                "mask": spaces.MultiBinary(max_rows),
                "pod": spaces.Box(-np.inf, np.inf, dtype=np.float32, shape=(len(features.POD_FEATURES),)),
                "cluster": spaces.Box(
                    -np.inf, np.inf, dtype=np.float32, shape=(len(features.CLUSTER_FEATURES),)
                ),
            }
        )
        self.action_space = spaces.Discrete(max_rows)  # type: ignore[assignment]
        self._simulation: Simulation | None = None
        self._steps: engine.Steps | None = None
        self._decision: Decision | None = None
        self._reward: RewardMeter | None = None
        self._shortlist: np.ndarray | None = None  # node row of each observed row, when shortlisting

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        super().reset(seed=seed)
        while True:  # a scenario whose window needs no placement at all is skipped
            scenario = self.draw(self.np_random)
            simulation = self._simulation = scenario.simulation()
            self._counts = scenario.trace.counts
            self._steps = simulation.steps()
            self._reward = RewardMeter(
                simulation,
                self.weights,
                self.shaping_gamma,
                per_second=self.clock,
                request_weighted_qos=self.request_weighted_qos,
                capacity_qos=self.capacity_qos,
            )
            try:
                self._decision = next(self._steps)
            except StopIteration:
                continue
            if (self.base is not None and self.base.top_k) or len(self._decision.nodes) <= self.rows:
                break
        return self._observe(self._decision), {"nodes": scenario.cluster.initial_nodes}

    def step(self, action: int) -> tuple[dict[str, np.ndarray], float, bool, bool, dict[str, Any]]:
        assert self._steps is not None and self._decision is not None and self._reward is not None
        row = int(action)
        if self._shortlist is not None:  # an action picks among the observation's rows
            row = int(self._shortlist[row]) if row < len(self._shortlist) else -1
        if not (0 <= row < len(self._decision.nodes) and self._decision.feasible[row]):
            row = int(np.flatnonzero(self._decision.feasible)[0])  # masked sampling never gets here
        try:
            self._decision = self._steps.send(row)
        except StopIteration as finished:
            result: RunResult = finished.value
            reward = self._reward.take()
            return self._blank(), reward, True, False, {"result": result}
        return self._observe(self._decision), self._reward.take(now=self._decision.now), False, False, {}

    @property
    def decision(self) -> Decision | None:
        """The placement the current observation asks for (None before reset)."""
        return self._decision

    def look_ahead(self, teacher: Lookahead) -> int:
        """The node row `teacher` labels for the pending placement (the simulation forked)."""
        assert self._simulation is not None and self._steps is not None and self._decision is not None
        return teacher.label(self._simulation, self._steps, self._decision)

    def action_for(self, row: int) -> int:
        """The action that places the pending pod on node `row` (with a shortlist, its position
        there; the base's best when the shortlist leaves it out)."""
        if self._shortlist is None:
            return row
        found = np.flatnonzero(self._shortlist == row)
        return int(found[0]) if found.size else 0

    def _observe(self, decision: Decision) -> dict[str, np.ndarray]:
        pod, nodes, feasible = decision.pod, decision.nodes, decision.feasible
        logits = shortlist = None
        if self.base is not None:
            logits = self.base.logits(pod, nodes, feasible)
            shortlist = self.base.shortlist(logits, feasible)
        self._shortlist = shortlist
        if shortlist is None:
            observation = pad(features.encode(pod, nodes, feasible), feasible, self.rows)
        else:  # the shortlisted rows only, in its order; every one of them feasible
            observed = features.encode(pod, nodes, feasible, rows=shortlist)
            observation = pad(observed, np.ones(len(shortlist), dtype=bool), self.rows)
            logits = logits[shortlist] if logits is not None else None
        if logits is not None:
            size = min(logits.size, self.rows)
            observation["base"] = np.zeros(self.rows, dtype=np.float32)
            observation["base"][:size] = logits[:size]
        if self.future:
            observation["future"] = future_features(self._counts, decision.now)
        if self.clock:
            observation["clock"] = np.array([decision.now], dtype=np.float32)
        return observation

    def _blank(self) -> dict[str, np.ndarray]:
        sample: dict[str, np.ndarray] = self.observation_space.sample()
        return {key: np.zeros_like(value) for key, value in sample.items()}


def future_features(counts: np.ndarray, now: float) -> np.ndarray:
    """FUTURE_FEATURES of a window's per-minute counts [functions, minutes] at `now` seconds."""
    functions, minutes = counts.shape
    minute = min(int(now // 60.0), minutes)
    ahead = [float(counts[:, minute : minute + n].sum()) / max(functions, 1) for n in (1, 5, 15)]
    active = float((counts[:, minute : minute + 5].sum(axis=1) > 0).mean()) if functions else 0.0
    left = max(minutes * 60.0 - now, 0.0) / max(minutes * 60.0, 1.0)
    return np.array([left, *np.log1p(ahead), active], dtype=np.float32)


def pad(observation: features.Observation, feasible: np.ndarray, rows: int) -> dict[str, np.ndarray]:
    """The observation as fixed-size arrays: node rows beyond the table are zeros, masked off."""
    size = min(len(feasible), rows)
    nodes = np.zeros((rows, observation.nodes.shape[1]), dtype=np.float32)
    nodes[:size] = observation.nodes[:size]
    mask = np.zeros(rows, dtype=np.int8)
    mask[:size] = feasible[:size]
    return {"nodes": nodes, "mask": mask, "pod": observation.pod, "cluster": observation.cluster}


class RewardMeter:
    """The weighted change in measured objectives since the last decision.

    Cost, energy and utilization accrue over the interval (every earlier decision shaped
    them). For quality of service the reward takes the part a placement decides and the
    simulator measures at once: the seconds the new pod waits for its image (a pull, or one
    in progress), weighted by priority; cold starts from scaling from zero happen wherever the
    pod goes and would only add noise to the signal.

    Cost, energy and utilization move only when a node is released, ten idle minutes after its
    last pod left: further than a per-decision discount sees. So the reward can add
    potential-based shaping (Ng, Harada and Russell, 1999), which leaves the optimal policy
    unchanged: the potential is minus what the occupied nodes commit the cluster to until they
    could be released (their price, idle power and unallocated CPU over the scale-down delay),
    each node weighted by how likely it is to keep a pod that long.
    """

    def __init__(
        self,
        simulation: Simulation,
        weights: ObjectiveWeights,
        gamma: float | None = None,
        *,
        per_second: bool = False,
        request_weighted_qos: bool = False,
        capacity_qos: CapacityQos = "",
    ) -> None:
        """`gamma`: the learner's discount, to add the shaping term; None: no shaping.
        `per_second`: `gamma` discounts a second of simulated time, not a decision.
        `capacity_qos`: pods' seconds waiting for room count as QoS, as image waits do: all of
        them ("all") or those a placement can cause ("scale-up")."""
        self.per_second, self.request_weighted_qos = per_second, request_weighted_qos
        self.capacity_qos = capacity_qos
        spec = simulation.nodes.spec
        self.nodes, self.gamma = simulation.nodes, gamma
        self.result, self.weights = simulation.result, weights
        self.cost_rate = sum(p.count * p.price_per_hour for p in spec.pools) / 3600.0
        self.watts = sum(p.count * p.power.watts[0] for p in spec.pools)
        self.idle_watts = np.array([spec.pools[p].power.watts[0] for p in simulation.nodes.pool])
        self.last = self._totals()
        self.potential = self._potential()
        self.now = 0.0

    def _potential(self) -> float:
        if self.gamma is None:
            return 0.0
        nodes = self.nodes
        # A node is committed until its last pod leaves. Taking each pod to leave within the
        # scale-down delay with probability 1/2 (an assumption, not a measurement), a node with
        # n pods stays committed with probability 1 - 2^-n: a pod beside many others commits
        # almost nothing more, one on an empty node half the node.
        stays = np.where(nodes.alive, 1.0 - 0.5 ** nodes.pod_count.astype(np.float64), 0.0)
        price_per_s = float(stays @ nodes.price) / 3600.0
        watts = float(stays @ self.idle_watts)
        capacity = float(stays @ nodes.cpu_allocatable)
        idle = float(stays @ (nodes.cpu_allocatable - nodes.cpu_requested))
        committed = self.weights.cost * price_per_s / max(self.cost_rate, 1e-9)
        committed += self.weights.other * watts / max(self.watts, 1e-9)
        committed += self.weights.utilization * (idle / capacity if capacity else 0.0)
        return -committed * SCALE_DOWN_UNNEEDED_S / REWARD_SCALE_S

    def _totals(self) -> tuple[float, float, float, float]:
        meters = self.result.meters
        pull = meters.weighted_request_pull_s if self.request_weighted_qos else meters.weighted_pull_s
        if self.capacity_qos == "all":
            pull += meters.weighted_capacity_s
        elif self.capacity_qos == "scale-up":
            pull += meters.weighted_scale_up_wait_s
        return meters.utilization_s, pull, self.result.cost_usd, self.result.energy_j

    def take(self, *, now: float | None = None) -> float:
        totals = self._totals()
        now = self.now if now is None else now
        elapsed, self.now = now - self.now, now
        utilization, pull, cost, energy = (after - before for after, before in zip(totals, self.last))
        self.last = totals
        w = self.weights
        loss = (
            w.utilization * (elapsed - utilization)
            + w.qos * pull * (REQUEST_QOS_SCALE if self.request_weighted_qos else QOS_SCALE)
            + w.cost * cost / max(self.cost_rate, 1e-9)
            + w.other * energy / max(self.watts, 1e-9)
        )
        before, self.potential = self.potential, self._potential()
        discount = float((self.gamma or 0.0) ** (elapsed if self.per_second else 1.0))
        return -loss / REWARD_SCALE_S + discount * self.potential - before
