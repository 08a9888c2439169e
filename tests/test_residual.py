"""The residual policy: a heuristic's standardised scores plus a learned residual that starts at 0."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from policies import features, heuristics, onnx_policy, residual
from policies.decision_records import Record
from policies.objectives import ObjectiveWeights
from policies.placement import PlacementPolicy
from simulator import clusterspec, compare, engine, evaluation, keepalive, traces, workload
from simulator.learning import environment, export, network, offline, ppo
from simulator.learning.config import Args
from tests.test_learning import scenarios, tiny_run  # noqa: F401  (a fixture)


def untrained_residual(path: Path, scale: float = 2.0) -> Path:
    model = network.ActorCritic(hidden=16, residual=True)
    export.export(model, path, {"hidden": 16}, residual.ResidualBase.of("tuned", scale))
    return path


def small_simulation(case: evaluation.Case, policy: PlacementPolicy) -> engine.Simulation:
    window = evaluation.case_trace(traces.load(compare.BUNDLED_TRACE), case)
    return engine.Simulation(
        workload=workload.build(window, seed=case.seed),
        counts=window.counts,
        cluster=clusterspec.load(case.cluster),
        placement=policy,
        keepalive=keepalive.by_name("knative"),
        seed=case.seed,
    )


def test_standardised_keeps_order_and_ties_within_the_candidates() -> None:
    scores = np.array([300.0, 120.0, 300.0, 500.0, 7.0])
    candidates = np.array([True, True, True, False, True])
    out = residual.standardised(scores, candidates)
    assert out[3] == 0.0  # not a candidate
    picked = out[candidates]
    assert picked.mean() == pytest.approx(0.0) and picked.std() == pytest.approx(1.0)
    assert out[0] == out[2] and out[0] > out[1] > out[4]
    assert not residual.standardised(np.full(4, 42.0)).any()  # all equal: no preference


def test_base_refuses_what_it_cannot_be() -> None:
    with pytest.raises(KeyError, match="unknown placement policy"):
        residual.ResidualBase.of("no-such-heuristic", 2.0)
    with pytest.raises(ValueError, match="not a weighted sum"):
        residual.ResidualBase.of("random", 2.0)
    with pytest.raises(ValueError, match="positive"):
        residual.ResidualBase.of("tuned", 0.0)
    with pytest.raises(ValueError, match="unknown score terms"):
        residual.ResidualBase(weights={"Nonsense": 1.0}, scale=1.0)
    with pytest.raises(ValueError, match="unreadable residual base"):
        residual.ResidualBase.from_json('{"weights": 3}')
    kube = residual.ResidualBase.of("kube-default", 1.0)  # upstream plugin names map to terms
    assert set(kube.weights) == {"LeastAllocated", "BalancedAllocation", "ImageLocality"}
    assert residual.ResidualBase.from_json(kube.to_json()) == kube


def test_untrained_residual_model_places_exactly_as_tuned(tmp_path: Path) -> None:
    """The file carries the base; served through ONNX Runtime, its zero residual leaves tuned's
    choices, ties and all: a whole simulated run is the same, decision for decision."""
    policy = onnx_policy.OnnxPolicy.open(untrained_residual(tmp_path / "r.onnx"), device="cpu")
    assert policy.base is not None
    assert dict(policy.base.weights) == {term: weight for term, weight, _ in heuristics.tuned().parts}
    trace = traces.load(compare.BUNDLED_TRACE)
    case = evaluation.Case("small", 3, 40, (720, 800))
    learned, tuned = (evaluation.run(trace, case, p) for p in (policy, heuristics.tuned()))
    assert learned["objectives"] == tuned["objectives"]
    assert learned["image_pulls"] == tuned["image_pulls"] > 0


def test_residual_adds_to_the_base_where_served(tmp_path: Path) -> None:
    """A non-zero residual moves the logits by exactly what the graph outputs."""
    model = network.ActorCritic(hidden=16, residual=True)
    with torch.no_grad():
        model.actor_out[1].bias.fill_(0.5)  # type: ignore[union-attr]
    path = tmp_path / "shifted.onnx"
    export.export(model, path, {}, residual.ResidualBase.of("tuned", 3.0))
    policy = onnx_policy.OnnxPolicy.open(path, device="cpu")
    plain = onnx_policy.OnnxPolicy.open(untrained_residual(tmp_path / "zero.onnx", scale=3.0), device="cpu")
    decision = next(small_simulation(evaluation.Case("small", 1, 10, (0, 30)), heuristics.tuned()).steps())
    nodes = decision.nodes.take(np.flatnonzero(decision.feasible))
    np.testing.assert_allclose(
        policy.score(decision.pod, nodes), plain.score(decision.pod, nodes) + 0.5, atol=1e-5
    )


def test_a_corrupt_base_in_the_model_file_degrades_to_kube_default(tmp_path: Path) -> None:
    path = untrained_residual(tmp_path / "r.onnx")
    graph = onnx.load(str(path))
    props = {p.key: p.value for p in graph.metadata_props}
    props[residual.META_BASE] = json.dumps({"weights": {"Nonsense": 1}, "scale": 2})
    onnx.helper.set_model_props(graph, props)
    onnx.save(graph, str(path))
    loaded = onnx_policy.load(path, device="cpu")
    assert loaded.policy.name == "kube-default" and "unknown score terms" in loaded.degraded


def test_environment_carries_the_base_logits(scenarios: environment.Scenarios) -> None:  # noqa: F811
    base = residual.ResidualBase.of("tuned", 2.0)
    env = environment.PlacementEnv(scenarios.draw, scenarios.max_rows, base=base)
    observation, _ = env.reset(seed=3)
    for _ in range(20):
        decision = env.decision
        assert decision is not None and env.observation_space.contains(observation)
        rows = len(decision.nodes)
        expected = base.logits(decision.pod, decision.nodes, decision.feasible).astype(np.float32)
        np.testing.assert_array_equal(observation["base"][:rows], expected)
        assert not observation["base"][rows:].any()
        best = engine.best_row(heuristics.tuned(), decision)  # the base's argmax is tuned's choice
        masked = np.where(decision.feasible, observation["base"][:rows], -np.inf)
        assert masked[best] == masked.max()
        observation, _, terminated, _, _ = env.step(best)
        if terminated:
            observation, _ = env.reset()


def test_residual_training_starts_at_the_base_and_exports_it(tmp_path: Path) -> None:
    args = tiny_run(tmp_path, total_timesteps=128, update_epochs=1, episode_minutes=5, residual="tuned")
    model = ppo.train(args)
    policy = onnx_policy.OnnxPolicy.open(tmp_path / "placement.onnx", device="cpu")
    assert policy.base == residual.ResidualBase.of("tuned", Args.residual_scale)
    out = model.actor_out[1]
    assert isinstance(out, torch.nn.Linear) and out.weight.abs().sum() > 0  # PPO moved the residual
    assert network.ActorCritic(16, residual=True).actor_out[1].weight.abs().sum() == 0  # from zero


def test_shortlist_is_the_base_top_k_among_the_candidates() -> None:
    base = residual.ResidualBase.of("tuned", 2.0, top_k=3)
    logits = np.array([0.5, 2.0, 0.5, 9.0, 0.5, -1.0])
    candidates = np.array([True, True, True, False, True, True])
    np.testing.assert_array_equal(base.shortlist(logits, candidates), [1, 0, 2])  # ties in row order
    np.testing.assert_array_equal(base.shortlist(logits), [3, 1, 0])
    np.testing.assert_array_equal(base.shortlist(logits[:2]), [1, 0])  # fewer than top_k: all, best first
    assert residual.ResidualBase.of("tuned", 2.0).shortlist(logits) is None  # no shortlist
    assert residual.ResidualBase.from_json(base.to_json()) == base
    assert "top_k" not in residual.ResidualBase.of("tuned", 2.0).to_json()  # older readers' format
    with pytest.raises(ValueError, match="top_k must be a whole number"):
        residual.ResidualBase.of("tuned", 2.0, top_k=-1)
    with pytest.raises(ValueError, match="unreadable residual base"):
        residual.ResidualBase.from_json('{"weights": {"MostAllocated": 1}, "scale": 1, "top_k": 2.5}')


def test_rows_left_off_the_shortlist_rank_below_it_in_the_base_order() -> None:
    base = np.array([3.0, 1.0, 2.0, -4.0, 0.0])
    rows = np.array([0, 2])
    out = residual.with_residual(base, rows, np.array([-10.0, 0.25], dtype=np.float32))
    assert out[0] == -7.0 and out[2] == 2.25  # base + residual where scored
    rest = np.array([1, 3, 4])
    assert out[rest].max() < out[rows].min()  # a residual can sink a shortlisted row, not lift another
    assert list(np.argsort(-out[rest])) == list(np.argsort(-base[rest]))  # the base's order kept


def test_untrained_shortlisting_model_chooses_among_tuned_best(tmp_path: Path) -> None:
    """With a zero residual a shortlisting model's best rows are tuned's best ones, all of them
    whenever they fit the shortlist; so it places as tuned, only ties beyond it fall inside it."""
    model = network.ActorCritic(hidden=16, residual=True)
    path = tmp_path / "short.onnx"
    export.export(model, path, {}, residual.ResidualBase.of("tuned", 2.0, top_k=4))
    policy = onnx_policy.OnnxPolicy.open(path, device="cpu")
    steps = small_simulation(evaluation.Case("small", 2, 30, (720, 760)), heuristics.tuned()).steps()
    decision, checked, fitted = next(steps), 0, 0
    while checked < 60:
        nodes = decision.nodes.take(np.flatnonzero(decision.feasible))
        learned, tuned = policy.score(decision.pod, nodes), heuristics.tuned().score(decision.pod, nodes)
        ours, theirs = (
            set(np.flatnonzero(learned == learned.max())),
            set(np.flatnonzero(tuned == tuned.max())),
        )
        assert ours <= theirs
        if len(theirs) <= 4:
            assert ours == theirs
            fitted += 1
        checked += 1
        try:
            decision = steps.send(int(np.flatnonzero(decision.feasible)[min(theirs)]))
        except StopIteration:
            break
    assert checked >= 30 and fitted >= 10 and len(nodes) > 4  # the shortlist really cut rows


def test_shortlisting_environment_serves_what_the_model_is_trained_on(
    tmp_path: Path,
    scenarios: environment.Scenarios,  # noqa: F811
) -> None:
    """The environment observes the shortlist, its actions place on the shortlisted rows, and
    the exported model scores those rows as the torch model does on that observation."""
    base = residual.ResidualBase.of("tuned", 2.0, top_k=3)
    env = environment.PlacementEnv(scenarios.draw, 3, base=base)
    model = network.ActorCritic(hidden=16, residual=True)
    torch.manual_seed(5)
    with torch.no_grad():
        model.actor_out[1].weight.normal_(0.0, 0.5)  # type: ignore[union-attr]
    export.export(model, tmp_path / "m.onnx", {}, base)
    served = onnx_policy.OnnxPolicy.open(tmp_path / "m.onnx", device="cpu")
    observation, _ = env.reset(seed=4)
    landed = 0
    for _ in range(15):
        decision = env.decision
        assert decision is not None and env.observation_space.contains(observation)
        feasible = np.flatnonzero(decision.feasible)
        logits = base.logits(decision.pod, decision.nodes, decision.feasible)
        shortlist = feasible[np.argsort(-logits[feasible], kind="stable")[:3]]
        assert observation["mask"].sum() == len(shortlist)
        np.testing.assert_array_equal(
            observation["base"][: len(shortlist)], logits[shortlist].astype(np.float32)
        )
        tensors = [torch.as_tensor(observation[k])[None] for k in ("nodes", "mask", "pod", "cluster", "base")]
        with torch.no_grad():
            trained, _ = model(tensors[0], tensors[1].bool(), tensors[2], tensors[3], tensors[4])
        scores = served.score(decision.pod, decision.nodes.take(feasible))
        on_rows = scores[np.searchsorted(feasible, shortlist)]
        np.testing.assert_allclose(on_rows, trained[0, : len(shortlist)].numpy(), atol=1e-5)
        assert env.action_for(int(shortlist[-1])) == len(shortlist) - 1
        action = len(shortlist) - 1  # the last shortlisted row: the pod lands there
        name, pods = (
            decision.nodes.names[shortlist[action]],
            decision.nodes.function_pod_counts(decision.pod.function),
        )
        before = int(pods[shortlist[action]])
        observation, _, terminated, _, _ = env.step(action)
        if terminated:
            observation, _ = env.reset()
            continue
        assert env.decision is not None
        row = env.decision.nodes.row(name)
        landed += (
            row is not None and env.decision.nodes.function_pod_counts(decision.pod.function)[row] > before
        )
    assert landed >= 10


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--residual", "nothing"], "--residual: unknown placement policy 'nothing'"),
        (["--residual", "random"], "--residual: 'random' is not a weighted sum"),
        (["--residual", "tuned", "--residual-scale", "-1"], "--residual: residual scale must be a positive"),
        (["--fewest-functions-per-node", "0"], "--fewest-functions-per-node must be in (0, 4.5]"),
        (["--max-arrival-scale", "0.5"], "--max-arrival-scale must be in [1, 10], not 0.5"),
        (["--residual-top-k", "-2"], "--residual-top-k must be >= 0 and needs --residual, not -2"),
        (["--residual", "", "--residual-top-k", "8"], "--residual-top-k must be >= 0 and needs --residual"),
    ],
)
def test_train_command_refuses_a_bad_residual(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], message: str
) -> None:
    from plugin import cli

    assert cli.main(["train", "--out", str(tmp_path), *flags]) == 2
    assert message in capsys.readouterr().err


def test_sparse_curriculum_draws_large_like_densities(scenarios: environment.Scenarios) -> None:  # noqa: F811
    """Functions per node are drawn log-uniformly down to the floor, so sparse clusters (like
    `large`, 0.34 a node) are a large share of the episodes, not a sliver."""
    curriculum = environment.Curriculum.up_to(48, 6, fewest_per_node=0.3)
    sparse = dataclasses.replace(scenarios, curriculum=curriculum, progress=1.0)  # 20-48 nodes
    rng = np.random.default_rng(0)
    ratios = []
    for _ in range(60):
        scenario = sparse.draw(rng)
        ratios.append(len(scenario.trace) / scenario.cluster.initial_nodes)
    assert min(ratios) < 1.0 and np.mean(np.array(ratios) < 1.0) > 0.25


def served_records(policy: onnx_policy.OnnxPolicy, count: int) -> list[Record]:
    """Placements of a short simulated run as `kdrl serve` records them, served by `policy`."""
    steps, records = small_simulation(evaluation.Case("small", 2, 20, (0, 60)), policy).steps(), []
    decision = next(steps)
    while len(records) < count:
        rows = np.flatnonzero(decision.feasible)
        candidates = decision.nodes.take(rows)
        logits = policy.score(decision.pod, candidates)
        probabilities = np.exp(logits - logits.max())
        chosen = int(np.argmax(logits))
        records.append(
            Record(
                uid=f"u{len(records)}",
                at=decision.now,
                function=decision.pod.function or "",
                priority=decision.pod.priority,
                policy="onnx",
                model=policy.model_hash,
                feature_schema=features.SCHEMA_HASH,
                node=str(candidates.names[chosen]),
                chosen=chosen,
                names=[str(n) for n in candidates.names],
                observation=features.encode(decision.pod, candidates),
                mask=np.ones(len(rows), dtype=bool),
                probabilities=(probabilities / probabilities.sum()).astype(np.float32),
                start_s=float(len(records) % 7),
                sla_met=True,
            )
        )
        decision = steps.send(int(rows[chosen]))
    return records


def test_fine_tuning_a_residual_model_recovers_its_base_from_the_served_probabilities(tmp_path: Path) -> None:
    """The record has the served logits (as log-probabilities), not the base: less the served
    residual they are the base, up to a constant per decision, so the starting policy is exactly
    the one that served (KL 0) and fine-tuning moves the residual only."""
    model = network.ActorCritic(hidden=16, residual=True)
    torch.manual_seed(3)
    with torch.no_grad():
        model.actor_out[1].weight.normal_(0.0, 0.5)  # type: ignore[union-attr]
    path = tmp_path / "served.onnx"
    export.export(model, path, {}, residual.ResidualBase.of("tuned", 2.0))
    policy = onnx_policy.OnnxPolicy.open(path, device="cpu")
    records = served_records(policy, 40)
    start = export.load(path)
    inputs, _, _ = offline._batch(records, start)
    for i, record in enumerate(records):
        size = len(record.names)
        with torch.no_grad():
            served = offline._log_policy(start, inputs)[i, :size].numpy()
        np.testing.assert_allclose(served, np.log(record.probabilities), atol=2e-4)
    data = offline.usable(records, residual=True)
    report = offline.fine_tune(start, data, offline.OfflineArgs(epochs=3), residual=True)
    assert report.used == 40 and report.kl_to_start > 0.0  # it moved from where it served
    plain = dataclasses.replace(records[0], probabilities=None)
    assert offline.usable([plain], residual=True).skipped  # nothing to recover a base from


def test_future_features_read_the_arrivals_ahead() -> None:
    """The critic's view of what is coming: 2 functions, 10 minutes; at 3 min 30 s, minute 3."""
    counts = np.zeros((2, 10), dtype=np.int64)
    counts[0, 3] = 4  # this minute
    counts[1, 6] = 6  # within 5 minutes
    left, next_1, next_5, next_15, active = environment.future_features(counts, now=210.0)
    assert left == pytest.approx(1 - 210 / 600)
    assert next_1 == pytest.approx(np.log1p(4 / 2)) and next_5 == pytest.approx(np.log1p(10 / 2))
    assert next_15 == pytest.approx(next_5) and active == 1.0
    assert environment.future_features(counts, now=600.0)[0] == 0.0  # the window's end: nothing left


def test_discount_per_second_depends_on_time_not_on_decisions() -> None:
    per_decision = Args(gamma=0.99, gamma_per_second=0.0)
    assert ppo._discount(per_decision, torch.tensor([0.5, 600.0])) == 0.99
    per_second = Args(gamma_per_second=0.5 ** (1 / 60))  # a minute halves
    np.testing.assert_allclose(
        ppo._discount(per_second, torch.tensor([0.0, 60.0, 120.0, -1.0])), [1, 0.5, 0.25, 1], rtol=1e-5
    )


def test_shaping_per_second_discounts_the_next_potential_by_the_time_between() -> None:
    """F = γ^Δt Φ(s') − Φ(s): with nothing placed the potential stays, so a per-second
    discount charges it for the seconds that passed and a per-decision one once."""
    from tests.test_learning import new_revision_on_two_nodes

    rewards = []
    for per_second in (False, True):
        simulation = new_revision_on_two_nodes(pods=3)
        meter = environment.RewardMeter(simulation, ObjectiveWeights(), 0.5, per_second=per_second)
        meter.potential = -1.0
        meter._potential = lambda: -1.0  # type: ignore[method-assign]
        meter.last = meter._totals()
        rewards.append(meter.take(now=2.0))
    elapsed_loss = ObjectiveWeights().utilization * 2.0 / environment.REWARD_SCALE_S  # 2 s of idle share
    assert rewards[0] == pytest.approx(-elapsed_loss + 0.5 * -1.0 + 1.0)
    assert rewards[1] == pytest.approx(-elapsed_loss + 0.25 * -1.0 + 1.0)


def test_a_shortlisting_model_is_not_fine_tuned_from_decisions(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Its records hold every candidate while its actor saw a shortlist: refused, exit 2."""
    from plugin import cli
    from policies.decision_records import DecisionStore
    from tests.test_decision_records import a_record

    model = network.ActorCritic(hidden=16, residual=True)
    with torch.no_grad():
        model.actor_out[1].weight.normal_(0.0, 0.5)  # type: ignore[union-attr]
    path = tmp_path / "short.onnx"
    export.export(model, path, {"hidden": 16}, residual.ResidualBase.of("tuned", 2.0, 8))
    database = tmp_path / "history.db"
    store = DecisionStore(database)
    store.write([a_record("fn", 1.0)])
    store.close()
    argv = [
        "train",
        "--from-decisions",
        str(database),
        "--from-model",
        str(path),
        "--out",
        str(tmp_path / "o"),
    ]
    assert cli.main(argv) == 2
    assert "shortlists its base's top 8 candidates" in capsys.readouterr().err
