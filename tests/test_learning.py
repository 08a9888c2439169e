"""The learning environment, its reward, PPO training, ONNX export and the served model."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from policies import features, filtering, heuristics, onnx_policy
from policies.objectives import ObjectiveWeights
from simulator import clusterspec, compare, engine, evaluation, keepalive, traces
from simulator.clusterspec import ClusterSpec
from simulator.learning import environment, export, network, ppo, vectorized
from simulator.learning.config import Args
from simulator.nodes import PROVISIONING_S
from tests.test_engine import one_function

MiB = 1 << 20


@pytest.fixture(scope="module")
def scenarios() -> environment.Scenarios:
    trace = traces.load(compare.BUNDLED_TRACE)
    return environment.Scenarios(
        trace=trace,
        shapes=clusterspec.load("medium").pools,
        curriculum=environment.Curriculum(stages=((6, 10),), minutes=6),
    )


def run_episode(env: environment.PlacementEnv, seed: int) -> tuple[list[float], int]:
    observation, _ = env.reset(seed=seed)
    rng = np.random.default_rng(seed)
    rewards = []
    while True:
        assert env.observation_space.contains(observation)
        action = int(rng.choice(np.flatnonzero(observation["mask"])))
        observation, reward, terminated, truncated, _ = env.step(action)
        rewards.append(reward)
        if terminated or truncated:
            return rewards, len(rewards)


def test_environment_contract(scenarios: environment.Scenarios) -> None:
    env = environment.PlacementEnv(scenarios.draw, scenarios.max_rows)
    rewards, steps = run_episode(env, seed=5)
    assert steps > 0 and np.isfinite(rewards).all()
    assert run_episode(env, seed=5)[0] == rewards  # seeded: the same episode again


def test_mask_is_the_extenders_filter(scenarios: environment.Scenarios) -> None:
    env = environment.PlacementEnv(scenarios.draw, scenarios.max_rows)
    observation, _ = env.reset(seed=11)
    checked = 0
    for _ in range(300):
        decision = env.decision
        assert decision is not None
        verdicts = filtering.filter_nodes(decision.pod, decision.nodes, explain=False)
        rows = len(decision.nodes)
        np.testing.assert_array_equal(observation["mask"][:rows].astype(bool), verdicts.feasible)
        assert not observation["mask"][rows:].any()  # padding is never a choice
        tainted = np.array([bool(t) for t in decision.nodes.taints])
        if decision.pod.gpu == 0 and tainted.any():
            assert not observation["mask"][:rows][tainted].any()  # GPU nodes refuse other pods
            checked += 1
        observation, _, terminated, _, _ = env.step(int(np.flatnonzero(observation["mask"])[0]))
        if terminated:
            observation, _ = env.reset()
        if checked > 5:
            break
    assert checked > 0


def two_pool_cluster() -> ClusterSpec:
    base = clusterspec.load("small").pools[0]
    fast = dataclasses.replace(base, name="fast", count=1, min=1, max=1, pull_bytes_per_s=100.0 * MiB)
    slow = dataclasses.replace(base, name="slow", count=1, min=1, max=1, pull_bytes_per_s=10.0 * MiB)
    return ClusterSpec(name="two", pools=(fast, slow))


def new_revision_on_two_nodes(pods: int) -> engine.Simulation:
    """One high-priority function whose new revision starts `pods` pods at t = 0."""
    return engine.Simulation(
        workload=one_function(initial_scale=pods),
        counts=np.zeros((1, 2), dtype=np.int64),
        cluster=two_pool_cluster(),
        placement=heuristics.kube_default(),
        keepalive=keepalive.by_name("knative"),
        seed=1,
        new_revisions=True,
    )


@pytest.mark.parametrize(("pool", "pull_s"), [("fast", 4.0), ("slow", 40.0)])
def test_reward_charges_the_measured_image_wait(pool: str, pull_s: float) -> None:
    """A high-priority pod (weight 2) of a 400 MiB image: the placement's reward is the image
    wait the simulator measures on the chosen node, weighted, and nothing else (QoS only)."""
    simulation = new_revision_on_two_nodes(pods=2)
    meter = environment.RewardMeter(simulation, ObjectiveWeights(utilization=0, qos=1, cost=0, other=0))
    steps = simulation.steps()
    first = next(steps)
    row = [str(n).startswith(pool) for n in first.nodes.names].index(True)
    second = steps.send(row)
    reward = meter.take(now=second.now)
    assert simulation.result.meters.weighted_pull_s == pytest.approx(2.0 * pull_s)
    assert reward == pytest.approx(-2.0 * pull_s * environment.QOS_SCALE / environment.REWARD_SCALE_S)
    with pytest.raises(StopIteration):  # the second pod, on the same node, waits for the same pull
        steps.send(row)
    assert simulation.result.meters.weighted_pull_s == pytest.approx(2.0 * pull_s * 2)


def test_shaping_charges_opening_a_node_more_than_joining_one() -> None:
    """Cost only: a node with n pods is committed (its price over the scale-down delay) with
    probability 1 - 2^-n. The second pod on a fresh node is charged half the node, beside the
    first a quarter (the node's commitment going from 1/2 to 3/4)."""

    def second_reward(same_node: bool) -> float:
        simulation = new_revision_on_two_nodes(pods=3)  # three placements at t = 0
        cost_only = ObjectiveWeights(utilization=0, qos=0, cost=1, other=0)
        meter = environment.RewardMeter(simulation, cost_only, 1.0)
        steps = simulation.steps()
        next(steps)
        second = steps.send(0)  # the first pod opens node 0
        assert meter.take(now=second.now) < 0
        third = steps.send(0 if same_node else 1)
        return meter.take(now=third.now)

    price_per_s = two_pool_cluster().pools[0].price_per_hour / 3600.0
    cost_rate = 2 * price_per_s
    opening = price_per_s / cost_rate * 600.0 / environment.REWARD_SCALE_S
    assert second_reward(same_node=True) == pytest.approx(-opening / 4)
    assert second_reward(same_node=False) == pytest.approx(-opening / 2)


def test_network_is_permutation_equivariant_and_any_size() -> None:
    model = network.ActorCritic(hidden=16).eval()
    scorer = network.Scorer(model)
    for size in (1, 7, 10_000):
        nodes, pod, cluster = (torch.from_numpy(a) for a in export.parity_batch(size))
        logits = scorer(nodes, pod, cluster)
        assert logits.shape == (size,) and torch.isfinite(logits).all()
        order = torch.randperm(size)
        torch.testing.assert_close(scorer(nodes[order], pod, cluster), logits[order], rtol=1e-5, atol=1e-5)


def tiny_run(out: Path, **changes: object) -> Args:
    """A training run of a few small batches (64 placements each), no time budget."""
    tiny = Args(out=out, num_envs=2, num_steps=64, num_minibatches=2, hidden=16, time_budget_s=0)
    return dataclasses.replace(tiny, **changes)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("train")
    ppo.train(tiny_run(out, total_timesteps=256, update_epochs=1, episode_minutes=5))
    return out


def test_smoke_training_writes_everything(trained: Path) -> None:
    for name in ("model.pt", "progress.csv", "learning_curve.png", "placement.onnx"):
        assert (trained / name).is_file(), name
    assert any((trained / "tensorboard").iterdir())
    rows = (trained / "progress.csv").read_text().splitlines()
    assert rows[0].startswith("global_step") and len(rows) == 3  # header + 2 updates


def test_exported_model_serves_with_metadata(trained: Path) -> None:
    policy = onnx_policy.OnnxPolicy.open(trained / "placement.onnx", device="cpu")
    assert policy.provider == "CPUExecutionProvider"
    assert policy.metadata[onnx_policy.META_SCHEMA] == features.SCHEMA_HASH
    config = json.loads(policy.metadata["kdrl.config"])
    assert config["total_timesteps"] == 256 and config["trace"] == "azure2019_slice"  # no machine paths
    assert policy.metadata["kdrl.commit"]


def test_export_parity_catches_a_different_graph(trained: Path, tmp_path: Path) -> None:
    model = export.load(trained / "model.pt")
    assert export.parity(
        network.Scorer(model).eval(), trained / "placement.onnx", *export.parity_batch(50)
    ) <= (export.PARITY_TOLERANCE)
    other = network.ActorCritic(hidden=16)  # fresh weights: not what the file computes
    assert export.parity(
        network.Scorer(other).eval(), trained / "placement.onnx", *export.parity_batch(50)
    ) > (export.PARITY_TOLERANCE)


def test_schema_mismatch_falls_back_to_kube_default(trained: Path, tmp_path: Path) -> None:
    import onnx

    graph = onnx.load(str(trained / "placement.onnx"))
    onnx.helper.set_model_props(
        graph, {onnx_policy.META_VERSION: str(onnx_policy.FORMAT_VERSION), onnx_policy.META_SCHEMA: "0" * 16}
    )
    changed = tmp_path / "other-schema.onnx"
    onnx.save(graph, str(changed))
    loaded = onnx_policy.load(changed, device="cpu")
    assert loaded.policy.name == "kube-default" and "feature schema" in loaded.degraded


@pytest.mark.parametrize("content", [None, b"", b"not an onnx model at all"])
def test_missing_or_corrupt_model_falls_back(tmp_path: Path, content: bytes | None) -> None:
    path = tmp_path / "model.onnx"
    if content is not None:
        path.write_bytes(content)
    loaded = onnx_policy.load(path, device="cpu")
    assert loaded.policy.name == "kube-default"
    assert loaded.provider == "none" and str(path) in loaded.degraded


def test_exported_scorer_computes_what_the_actor_computes() -> None:
    model = network.ActorCritic(hidden=16).eval()
    nodes, pod, cluster = (torch.from_numpy(a) for a in export.parity_batch(33))
    model.update_norms(
        nodes.unsqueeze(0), torch.ones(1, 33, dtype=torch.bool), pod.unsqueeze(0), cluster.unsqueeze(0)
    )
    with torch.no_grad():
        actor, _ = model(nodes.unsqueeze(0), None, pod.unsqueeze(0), cluster.unsqueeze(0))
        torch.testing.assert_close(network.Scorer(model)(nodes, pod, cluster), actor[0], rtol=1e-5, atol=1e-6)


def test_train_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from plugin import cli

    argv = ["train", "--out", str(tmp_path), "--num-envs", "2", "--num-steps", "32", "--num-minibatches", "2"]
    argv += ["--update-epochs", "1", "--episode-minutes", "5", "--hidden", "8", "--no-export-onnx"]
    assert cli.main([*argv, "--total-timesteps", "10"]) == 2
    assert "at least one batch (64)" in capsys.readouterr().err
    assert cli.main([*argv, "--total-timesteps", "64"]) == 0
    assert (tmp_path / "model.pt").is_file() and (tmp_path / "learning_curve.png").is_file()
    assert not (tmp_path / "placement.onnx").exists()


def test_train_command_reports_a_refused_export(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from plugin import cli

    monkeypatch.setattr(export, "PARITY_TOLERANCE", -1.0)  # no graph can agree that well
    argv = ["train", "--out", str(tmp_path), "--num-envs", "2", "--num-steps", "32", "--num-minibatches", "2"]
    argv += ["--update-epochs", "1", "--episode-minutes", "5", "--hidden", "8", "--total-timesteps", "64"]
    assert cli.main(argv) == 2
    assert f"the checkpoint is {tmp_path}/model.pt" in capsys.readouterr().err
    assert (tmp_path / "model.pt").is_file() and not (tmp_path / "placement.onnx").exists()


def test_shaping_credits_packing_by_the_idle_cpu_it_saves() -> None:
    """Utilization only: a second pod beside the first lowers the occupied nodes' idle CPU
    share by its request over the node's, and is credited that over the scale-down delay; one
    on a fresh node leaves the share as it was and gets nothing."""

    def second_reward(same_node: bool) -> float:
        simulation = new_revision_on_two_nodes(pods=3)
        utilization_only = ObjectiveWeights(utilization=1, qos=0, cost=0, other=0)
        meter = environment.RewardMeter(simulation, utilization_only, 1.0)
        steps = simulation.steps()
        next(steps)
        second = steps.send(0)
        meter.take(now=second.now)
        third = steps.send(0 if same_node else 1)
        return meter.take(now=third.now)

    simulation = new_revision_on_two_nodes(pods=3)
    share = simulation.requests[0].cpu_milli / two_pool_cluster().pools[0].cpu_milli
    assert second_reward(same_node=True) == pytest.approx(share * 600.0 / environment.REWARD_SCALE_S)
    assert second_reward(same_node=False) == pytest.approx(0.0)


def test_arrival_scaling_multiplies_the_same_window(scenarios: environment.Scenarios) -> None:
    """Scaled episodes are the unscaled ones with every minute's invocations times one factor in
    [1, max]: the functions, cluster and seed are drawn exactly as without scaling."""
    busy = dataclasses.replace(scenarios, max_arrival_scale=3.0)
    factors = []
    for seed in range(12):
        plain, scaled = scenarios.draw(np.random.default_rng(seed)), busy.draw(np.random.default_rng(seed))
        assert (plain.trace.func_ids, plain.cluster, plain.seed) == (
            scaled.trace.func_ids,
            scaled.cluster,
            scaled.seed,
        )
        assert (scaled.trace.counts >= plain.trace.counts).all()
        assert (scaled.trace.counts <= np.round(plain.trace.counts * 3.0)).all()
        if (total := plain.trace.counts.sum()) >= 100:  # enough invocations to read the factor
            factors.append(scaled.trace.counts.sum() / total)
    assert len(factors) >= 6
    assert max(factors) > 1.5 and min(factors) < 1.5  # drawn over the range, not one value


def test_episodes_on_the_draining_ground_are_the_same_draws_with_the_drain_on(
    scenarios: environment.Scenarios,
) -> None:
    """`kdrl train --drain-underused` (the default, the evaluation's ground): the same episodes,
    simulated with the cluster autoscaler draining underused nodes; off, only empty nodes go."""
    draining = dataclasses.replace(scenarios, drain_underused=True)
    plain, drained = scenarios.draw(np.random.default_rng(4)), draining.draw(np.random.default_rng(4))
    assert (plain.trace.func_ids, plain.cluster, plain.seed) == (
        drained.trace.func_ids,
        drained.cluster,
        drained.seed,
    )
    assert (plain.simulation().drain_underused, drained.simulation().drain_underused) == (False, True)
    assert Args().drain_underused is evaluation.DRAIN_UNDERUSED is True


def test_curriculum_up_to_48_nodes_is_the_default() -> None:
    assert environment.Curriculum.up_to(48) == environment.Curriculum()
    assert environment.Curriculum.up_to(96).stages[-1] == (40, 96)


@pytest.mark.parametrize(("cloned", "coef"), [(1024, 0.0), (0, 10.0)])
def test_the_actor_learns_the_teachers_choices(tmp_path: Path, cloned: int, coef: float) -> None:
    """Behaviour cloning only (most-allocated places every pod), or PPO with the teacher's
    log-likelihood in its loss: on decisions not trained on, the actor's first choice is one of
    most-allocated's best nodes far more often than chance."""
    args = tiny_run(
        tmp_path,
        total_timesteps=1024,
        episode_minutes=10,
        imitate="most-allocated",
        residual="",  # the actor alone (a residual would start at tuned's choices)
        imitate_timesteps=cloned,
        imitate_coef=coef,
        export_onnx=False,
    )
    model = ppo.train(args)
    rows = (tmp_path / "progress.csv").read_text().splitlines()
    assert all(row.endswith(",1.0" if cloned else ",0.0") for row in rows[1:])  # imitated, or PPO
    teacher = heuristics.by_name("most-allocated")
    envs = vectorized.LocalEnvironments(dataclasses.replace(args, seed=7), traces.load(args.trace))
    observation = envs.reset(7)
    agreed, by_chance = [], []
    for _ in range(100):
        with torch.no_grad():
            logits, _ = model(*ppo._tensors(observation, torch.device("cpu")))
        for env, chosen in zip(envs.envs.envs, logits.argmax(-1).tolist()):
            decision = env.unwrapped.decision
            feasible = np.flatnonzero(decision.feasible)
            scores = teacher.score(decision.pod, decision.nodes.take(feasible))
            best = feasible[scores >= scores.max() - 1e-9]
            agreed.append(chosen in best)
            by_chance.append(best.size / feasible.size)
        observation, *_ = envs.step(envs.teach())
    assert np.mean(agreed) > max(0.6, 2 * np.mean(by_chance))


def test_train_command_refuses_a_teacher_it_cannot_load(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from plugin import cli

    argv = ["train", "--out", str(tmp_path), "--imitate"]
    assert cli.main([*argv, "onnx"]) == 2  # a heuristic only
    assert "unknown placement policy 'onnx'" in capsys.readouterr().err
    # `tuned()` reads its default path, bound when the function was defined.
    monkeypatch.setattr(heuristics.tuned, "__defaults__", (tmp_path / "absent.json",))
    assert cli.main([*argv, "tuned"]) == 2  # not kube-default in its place
    assert "absent.json" in capsys.readouterr().err


@pytest.mark.parametrize(("pool", "pull_s"), [("fast", 4.0), ("slow", 40.0)])
def test_request_weighted_qos_charges_the_requests_that_waited_on_the_pull(pool: str, pull_s: float) -> None:
    """One request (high priority, weight 2) scales the function from zero: it waits for the pod
    and so for the whole pull on the chosen node; the request-weighted meter is 2 x the pull,
    and so is the reward's QoS term (at its own scale), once the pod is ready."""
    simulation = engine.Simulation(
        workload=one_function(initial_scale=0),
        counts=np.array([[1, 0, 0]], dtype=np.int64),
        cluster=two_pool_cluster(),
        placement=heuristics.kube_default(),
        keepalive=keepalive.by_name("knative"),
        seed=1,
    )
    qos_only = ObjectiveWeights(utilization=0, qos=1, cost=0, other=0)
    meter = environment.RewardMeter(simulation, qos_only, request_weighted_qos=True)
    steps = simulation.steps()
    first = next(steps)
    with pytest.raises(StopIteration):
        steps.send([str(n).startswith(pool) for n in first.nodes.names].index(True))
    assert simulation.result.meters.weighted_request_pull_s == pytest.approx(2.0 * pull_s)
    reward = meter.take(now=180.0)
    assert reward == pytest.approx(-2.0 * pull_s * environment.REQUEST_QOS_SCALE / environment.REWARD_SCALE_S)


def three_big_pods(cluster: ClusterSpec, minutes: int) -> engine.Simulation:
    """Three pods of 6 cores (high priority), held at three by traffic for `minutes`."""
    return engine.Simulation(
        workload=one_function(initial_scale=3, cpu_milli=6000, concurrency_target=1.0, max_scale=3),
        counts=np.full((1, minutes), 3000, dtype=np.int64),
        cluster=cluster,
        placement=heuristics.kube_default(),
        keepalive=keepalive.by_name("knative"),
        seed=1,
        new_revisions=True,
    )


@pytest.mark.parametrize("minutes", [1, 2])
def test_capacity_waits_are_metered_while_a_pod_waits_for_room(minutes: int) -> None:
    """Three pods of 6 cores (high priority, weight 2) on two 8-core nodes that cannot grow,
    held at three by traffic: the third waits for room the whole run, metered every 10 s from
    t = 0, so 2 x 60 s per minute; with `capacity_qos` the reward's QoS term adds it to the
    image waits, at the same scale."""
    simulation = three_big_pods(two_pool_cluster(), minutes)
    qos_only = ObjectiveWeights(utilization=0, qos=1, cost=0, other=0)
    with_waits = environment.RewardMeter(simulation, qos_only, capacity_qos="all")
    pulls_only = environment.RewardMeter(simulation, qos_only)
    result = engine.drive(simulation.steps(), lambda decision: int(np.flatnonzero(decision.feasible)[0]))
    assert result.pods_started == 2
    meters = result.meters
    assert meters.weighted_capacity_s == pytest.approx(2.0 * 60.0 * minutes)
    scale = environment.QOS_SCALE / environment.REWARD_SCALE_S
    end = 60.0 * minutes
    assert pulls_only.take(now=end) == pytest.approx(-meters.weighted_pull_s * scale)
    assert with_waits.take(now=end) == pytest.approx(
        -(meters.weighted_pull_s + meters.weighted_capacity_s) * scale
    )


@pytest.mark.parametrize("grows", [False, True])
def test_scale_up_waits_count_only_what_a_placement_can_cause(grows: bool) -> None:
    """The same three 6-core pods (weight 2) on two 8-core nodes. When no pool may grow, the
    third pod's wait is no placement's doing: the scale-up meter, and a reward counting it,
    leave it out. When one may, the pod waits for the new node (90 s, placed at the first
    metering after it joins), all of which the scale-up meter counts."""
    cluster = two_pool_cluster()
    if grows:
        slow = dataclasses.replace(cluster.pools[1], max=2)
        cluster = dataclasses.replace(cluster, pools=(cluster.pools[0], slow))
    simulation = three_big_pods(cluster, minutes=2)
    qos_only = ObjectiveWeights(utilization=0, qos=1, cost=0, other=0)
    scale_up = environment.RewardMeter(simulation, qos_only, capacity_qos="scale-up")
    result = engine.drive(simulation.steps(), lambda decision: int(np.flatnonzero(decision.feasible)[0]))
    meters = result.meters
    assert result.pods_started == (3 if grows else 2)
    expected = 2.0 * PROVISIONING_S if grows else 0.0
    assert meters.weighted_scale_up_wait_s == pytest.approx(expected)
    assert meters.weighted_capacity_s == pytest.approx(expected if grows else 2.0 * 120.0)
    scale = environment.QOS_SCALE / environment.REWARD_SCALE_S
    assert scale_up.take(now=120.0) == pytest.approx(-(meters.weighted_pull_s + expected) * scale)
