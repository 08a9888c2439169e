"""The lookahead teacher: labels on cases whose best node is known, and a parent run it leaves alone."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import numpy as np
import pytest

from plugin import cli
from policies import heuristics
from simulator import clusterspec, engine, keepalive, traces
from simulator.clusterspec import ClusterSpec
from simulator.learning import ppo, vectorized
from simulator.lookahead import Lookahead
from tests.test_engine import one_function
from tests.test_learning import tiny_run

MiB = 1 << 20


def two_nodes(first_pull_mib_s: float, second_pull_mib_s: float) -> ClusterSpec:
    """Two fixed nodes (no scaling, same price and power) that differ only in pull bandwidth."""
    base = clusterspec.load("small").pools[0]
    pools = tuple(
        dataclasses.replace(base, name=name, count=1, min=1, max=1, pull_bytes_per_s=mib_s * MiB)
        for name, mib_s in (("first", first_pull_mib_s), ("second", second_pull_mib_s))
    )
    return ClusterSpec(name="two", pools=pools)


def invoked_from_zero(cluster: ClusterSpec, minutes: int = 20) -> engine.Simulation:
    """One high-priority function (400 MiB image), invoked every minute: its first request
    scales it from zero, so that request waits for the pull on whichever node the pod lands."""
    counts = np.ones((1, minutes), dtype=np.int64)
    return engine.Simulation(
        workload=one_function(),
        counts=counts,
        cluster=cluster,
        placement=heuristics.kube_default(),
        keepalive=keepalive.by_name("knative"),
        seed=1,
    )


def test_the_label_is_the_node_the_future_favours_not_the_rollouts_first_choice() -> None:
    # kube-default ties the two empty nodes and takes the first: the slow one (10 MiB/s, a
    # 40-s pull); the request waits 4 s on the fast one. Nothing else differs.
    simulation = invoked_from_zero(two_nodes(10.0, 100.0))
    steps = simulation.steps()
    decision = next(steps)
    teacher = Lookahead(heuristics.kube_default(), candidates=2, horizon_minutes=5)
    slow, fast = teacher.ranked(decision).tolist()
    assert [str(decision.nodes.names[row]).split("-")[0] for row in (slow, fast)] == ["first", "second"]
    outcomes = dict(teacher.outcomes(simulation, steps, decision))
    assert outcomes[fast] < 1.0 < outcomes[slow]
    assert teacher.label(simulation, steps, decision) == fast


def test_a_gain_within_the_margin_leaves_the_rollouts_choice() -> None:
    simulation = invoked_from_zero(two_nodes(10.0, 100.0))
    steps = simulation.steps()
    decision = next(steps)
    teacher = Lookahead(heuristics.kube_default(), candidates=2, horizon_minutes=5, margin=0.0)
    (slow, slow_score), (fast, fast_score) = teacher.outcomes(simulation, steps, decision)
    gain = slow_score - fast_score
    assert teacher.label(simulation, steps, decision) == fast
    assert dataclasses.replace(teacher, margin=gain * 0.99).label(simulation, steps, decision) == fast
    assert dataclasses.replace(teacher, margin=gain * 1.01).label(simulation, steps, decision) == slow


def test_where_the_future_cannot_tell_nodes_apart_the_rollouts_choice_stands() -> None:
    simulation = invoked_from_zero(two_nodes(40.0, 40.0))
    steps = simulation.steps()
    decision = next(steps)
    teacher = Lookahead(heuristics.kube_default(), candidates=2, horizon_minutes=5)
    outcomes = teacher.outcomes(simulation, steps, decision)
    assert [c for _, c in outcomes] == pytest.approx([1.0, 1.0])
    assert teacher.label(simulation, steps, decision) == outcomes[0][0] == teacher.ranked(decision)[0]


def test_without_copies_the_rollouts_choice_stands(monkeypatch: pytest.MonkeyPatch) -> None:
    # The system refuses a process (e.g. a container's pid limit): no copy measures anything.
    simulation = invoked_from_zero(two_nodes(10.0, 100.0))
    steps = simulation.steps()
    decision = next(steps)
    teacher = Lookahead(heuristics.kube_default(), candidates=2, horizon_minutes=5)

    def refuse() -> int:
        raise OSError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(os, "fork", refuse)
    slow, fast = teacher.ranked(decision).tolist()
    assert teacher.outcomes(simulation, steps, decision) == [(slow, 0.0), (fast, 0.0)]
    assert teacher.label(simulation, steps, decision) == slow
    monkeypatch.undo()  # the run it was asked about is intact: once copies work, the label is found
    assert teacher.label(simulation, steps, decision) == fast


def test_looking_ahead_leaves_the_run_it_copies_as_it_was() -> None:
    def run(look: bool) -> engine.RunResult:
        simulation = engine.Simulation(
            workload=one_function(),
            counts=np.tile([3, 0, 0, 5, 1, 0, 0, 0, 0, 0, 2, 0], (1, 2)),
            cluster=clusterspec.load("small"),
            placement=heuristics.kube_default(),
            keepalive=keepalive.by_name("knative"),
            seed=4,
        )
        steps = simulation.steps()
        teacher = Lookahead(heuristics.kube_default(), candidates=3, horizon_minutes=3)

        def choose(decision: engine.Decision) -> int:
            if look:
                teacher.label(simulation, steps, decision)
            return engine.best_row(heuristics.kube_default(), decision)

        return engine.drive(steps, choose)

    plain, looked = run(False), run(True)
    assert looked.pods_started == plain.pods_started > 1
    assert looked.meters == plain.meters and looked.series == plain.series
    assert (looked.cost_usd, looked.energy_j) == (plain.cost_usd, plain.energy_j)


def test_a_shortened_run_ends_after_its_end_minute() -> None:
    simulation = invoked_from_zero(two_nodes(40.0, 40.0), minutes=20)
    simulation.end_minute = 7
    result = engine.drive(simulation.steps(), lambda d: int(np.flatnonzero(d.feasible)[0]))
    assert result.series["minute"] == [float(m) for m in range(7)]


def test_the_environments_label_the_share_of_placements_asked_for(tmp_path: Path) -> None:
    args = tiny_run(tmp_path, imitate="lookahead", lookahead_minutes=2, episode_minutes=10)
    envs = vectorized.LocalEnvironments(args, traces.load(args.trace))
    observation = envs.reset(3)
    assert (envs.teach(0.0) == -1).all()
    labels = envs.teach(1.0)
    assert labels.shape == (args.num_envs,)
    assert all(observation["mask"][i][label] for i, label in enumerate(labels.tolist()))
    # With the residual's base as the rollout, the label is one of its best few candidates.
    for env, label in zip(envs.envs.envs, labels.tolist()):
        decision = env.unwrapped.decision
        assert label in Lookahead(heuristics.by_name("tuned")).ranked(decision)[: args.lookahead_candidates]
    envs.close()


def test_ppo_trains_beside_a_lookahead_that_labels_some_placements(tmp_path: Path) -> None:
    args = tiny_run(
        tmp_path,
        total_timesteps=256,
        update_epochs=1,
        episode_minutes=5,
        imitate="lookahead",
        imitate_timesteps=0,
        imitate_coef=1.0,
        teach_share=0.05,
        lookahead_minutes=2,
        export_onnx=False,
    )
    ppo.train(args)
    assert len((tmp_path / "progress.csv").read_text().splitlines()) == 3  # header + 2 updates


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--teach-share", "1.5", "--teach-share must be in [0, 1]"),
        ("--lookahead-candidates", "0", "--lookahead-candidates and --lookahead-minutes must be >= 1"),
        ("--lookahead-minutes", "-3", "--lookahead-candidates and --lookahead-minutes must be >= 1"),
        ("--lookahead-margin", "-0.1", "--lookahead-margin must be in [0, 1]"),
    ],
)
def test_train_refuses_lookahead_settings_out_of_range(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str, value: str, message: str
) -> None:
    argv = ["train", "--out", str(tmp_path), "--imitate", "lookahead", flag, value]
    assert cli.main(argv) == 2
    assert message in capsys.readouterr().err
