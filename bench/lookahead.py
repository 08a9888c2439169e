"""What the lookahead teacher is worth, on windows of the training split.

    python -m bench.lookahead --windows 6 --minutes 90 --seed 1

For each window (a curriculum cluster and functions drawn as training draws them, at a random
stage), tuned runs it alone; then the lookahead, used as a policy, labels every placement and
its label is taken. Printed per window: the composite of the lookahead's run against tuned's
(lower is better), the objectives beside each other, and the share of placements where the
label was not tuned's choice. The teacher reads the future, so its composite is a ceiling for
what copying it can give, not a policy anyone could serve. A label costs 0.2-0.3 s on two
cores, so a 90-minute window with a few hundred placements takes a minute or two.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from policies import heuristics
from policies.objectives import ObjectiveWeights, composite
from simulator import engine, traces
from simulator.evaluation import objectives_of
from simulator.learning import environment, vectorized
from simulator.learning.config import Args
from simulator.lookahead import Lookahead

HEADER = (
    "| nodes | functions | composite vs tuned | CPU alloc (la / tuned) | QoS s | cost $ | relabelled | s |"
)


def taught_run(scenario: environment.Scenario, teacher: Lookahead) -> tuple[engine.RunResult, float]:
    """The window with every pod placed where the teacher labels, and the share of labels that
    were not the rollout policy's own choice."""
    simulation = scenario.simulation()
    steps = simulation.steps()
    relabelled: list[bool] = []

    def label(decision: engine.Decision) -> int:
        row = teacher.label(simulation, steps, decision)
        relabelled.append(row != engine.best_row(teacher.rollout, decision))
        return row

    return engine.drive(steps, label), float(np.mean(relabelled)) if relabelled else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--windows", type=int, default=6)
    parser.add_argument("--minutes", type=int, default=90, help="window length")
    parser.add_argument("--seed", type=int, default=1, help="draws the windows")
    parser.add_argument("--candidates", type=int, default=Args.lookahead_candidates)
    parser.add_argument("--horizon", type=int, default=Args.lookahead_minutes, help="minutes played forward")
    parser.add_argument("--margin", type=float, default=Args.lookahead_margin)
    options = parser.parse_args()

    args = Args()
    scenarios = vectorized.scenarios(args, traces.load(args.trace))
    scenarios.curriculum = environment.Curriculum.up_to(
        args.largest_cluster, options.minutes, args.fewest_functions_per_node
    )
    tuned = heuristics.by_name("tuned")
    teacher = Lookahead(tuned, options.candidates, options.horizon, margin=options.margin)
    rng = np.random.default_rng(options.seed)
    print(HEADER)
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for _ in range(options.windows):
        scenarios.progress = float(rng.uniform(0.0, 1.0))
        scenario = scenarios.draw(rng)
        seconds = scenario.trace.minutes * 60.0
        plain = objectives_of(
            engine.drive(scenario.simulation().steps(), lambda d: engine.best_row(tuned, d)), seconds
        )
        started = time.time()
        run, relabelled = taught_run(scenario, teacher)
        looked = objectives_of(run, seconds)
        print(
            f"| {scenario.cluster.initial_nodes} | {len(scenario.trace)} "
            f"| {composite(looked, plain, ObjectiveWeights()):.3f} "
            f"| {looked.utilization:.3f} / {plain.utilization:.3f} | {looked.qos_s:.0f} / {plain.qos_s:.0f} "
            f"| {looked.cost_usd:.2f} / {plain.cost_usd:.2f} | {relabelled:.2f} "
            f"| {time.time() - started:.0f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
