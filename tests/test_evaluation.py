"""`kdrl evaluate` and the tuned heuristic's grid search: splits, composites, intervals."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from bench import screen
from plugin import cli
from policies import heuristics, onnx_policy
from policies.objectives import Objectives, ObjectiveWeights, composite
from simulator import compare, evaluation, traces


def test_composite_is_one_for_the_reference_and_lower_when_better() -> None:
    reference = Objectives(utilization=0.3, qos_s=100.0, cost_usd=10.0, energy_j=1e6)
    weights = ObjectiveWeights()
    assert composite(reference, reference, weights) == pytest.approx(1.0)
    better = Objectives(utilization=0.6, qos_s=100.0, cost_usd=8.0, energy_j=0.9e6)
    expected = (0.5 * 0.4 / 0.7 + 0.3 * 1.0 + 0.1 * 0.8 + 0.1 * 0.9) / 1.0
    assert composite(better, reference, weights) == pytest.approx(expected)


def test_interval_uses_students_t() -> None:
    result = evaluation.interval([1.0, 2.0, 3.0])
    assert result["mean"] == 2.0
    assert result["ci95"] == pytest.approx(4.303 * 1.0 / 3**0.5, rel=1e-4)
    assert evaluation.interval([5.0]) == {"mean": 5.0, "ci95": 0.0}


def test_evaluate_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "eval"
    argv = ["evaluate", "--cluster", "small", "--functions", "12", "--seeds", "2", "--workers", "1"]
    argv += ["--placement", "tuned,kube-default", "--out", str(out), "--json"]
    assert cli.main(argv) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["config"]["minutes"] == [720, 1440]  # the evaluation split only
    by_policy = {e["policy"]: e for e in result["results"]}
    assert by_policy["kube-default"]["composite"] == {"mean": 1.0, "ci95": 0.0}
    tuned = by_policy["tuned"]
    assert tuned["seeds"] == 2 and tuned["composite"]["ci95"] >= 0.0
    assert set(tuned) >= {"utilization", "qos_weighted_cold_s", "cost_usd", "energy_kwh"}
    for name in ("evaluation.json", "evaluation.png", "evaluation.md"):
        assert (out / name).is_file()


def test_evaluate_on_a_ground_where_the_autoscaler_drains_underused_nodes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["evaluate", "--cluster", "small", "--functions", "12", "--seeds", "2", "--workers", "1"]
    argv += ["--placement", "kube-default", "--shifted", "", "--json"]
    nodes, evictions = {}, {}
    for drain, flag in ((False, ["--no-drain-underused"]), (True, [])):  # the drain is the default
        assert cli.main([*argv, *flag, "--out", str(tmp_path / str(drain))]) == 0
        result = json.loads(capsys.readouterr().out)
        assert result["config"]["drain_underused"] is drain
        entry = next(e for e in result["results"] if e["policy"] == "kube-default")
        nodes[drain], evictions[drain] = entry["nodes_mean"]["mean"], entry["evictions"]["mean"]
    # kube-default spreads 12 functions' pods over 20 nodes: the real autoscaler moves them.
    assert evictions[False] == 0 < evictions[True]
    assert nodes[True] < nodes[False]


@pytest.mark.parametrize(("flag", "drain"), [([], True), (["--no-drain-underused"], False)])
def test_the_gate_judges_on_the_ground_it_is_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, flag: list[str], drain: bool
) -> None:
    """The gate's cases are the evaluation's, on its ground: by default the draining one."""
    asked: dict[str, object] = {}

    def gate(*args: object, **kwargs: object) -> dict[str, object]:
        asked.update(kwargs)
        return {"new": "n", "current": "c", "cases": 0, "checks": {}, "ship": False}

    monkeypatch.setattr(evaluation, "gate", gate)
    model = str(onnx_policy.DEFAULT_MODEL)
    argv = ["evaluate", "--model", model, "--against", model, "--out", str(tmp_path), "--json", *flag]
    assert cli.main(argv) == 1  # "keep the serving model": nothing was judged better
    assert asked["drain_underused"] is drain


def test_tuning_refuses_the_evaluation_split() -> None:
    case = evaluation.Case("small", 1, 8, (600, 780))
    with pytest.raises(ValueError, match="beyond the training split"):
        evaluation.tune(compare.BUNDLED_TRACE, cases=(case,))


@pytest.mark.parametrize("drain", [False, True])
def test_tuning_picks_the_best_combination_of_its_grid(drain: bool) -> None:
    case = evaluation.Case("small", 3, 20, (0, 60), drain_underused=drain)
    result = evaluation.tune(
        compare.BUNDLED_TRACE, cases=(case,), grid=dict.fromkeys(evaluation.TUNE_TERMS, (0.0, 1.0)), workers=1
    )
    scores = [entry["composite"] for entry in result["ranking"]]
    assert scores == sorted(scores) and result["composite_vs_kube_default"] == scores[0]
    assert set(result["weights"]) == {"BalancedAllocation", *evaluation.TUNE_TERMS}
    heuristics.weighted("check", result["weights"])  # the written weights load as a policy
    assert [c["drain_underused"] for c in result["cases"]] == [drain]  # on the ground it was asked


def test_tuning_refuses_a_grid_without_every_term() -> None:
    case = evaluation.Case("small", 3, 20, (0, 60))
    with pytest.raises(ValueError, match="must give values for exactly"):
        evaluation.tune(compare.BUNDLED_TRACE, cases=(case,), grid={"ImageLocality": (1.0,)})
    empty_term = {**dict.fromkeys(evaluation.TUNE_TERMS, (1.0,)), "Cheapness": ()}
    with pytest.raises(ValueError, match="must give values for exactly"):
        evaluation.tune(compare.BUNDLED_TRACE, cases=(case,), grid=empty_term)


def test_shipped_tuned_weights_load() -> None:
    policy = heuristics.tuned()
    assert policy.name == "tuned" and policy.parts


@pytest.mark.parametrize("content", [None, b"not a model"])
def test_evaluate_refuses_a_model_that_cannot_serve(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes | None
) -> None:
    """Evaluating `onnx` on a missing or corrupt file would score kube-default under its name."""
    model = tmp_path / "model.onnx"
    if content is not None:
        model.write_bytes(content)
    argv = ["evaluate", "--cluster", "small", "--seeds", "1", "--placement", "onnx", "--model", str(model)]
    assert cli.main([*argv, "--out", str(tmp_path / "eval")]) == 2
    assert f"--model: {model}" in capsys.readouterr().err
    assert not (tmp_path / "eval").exists()


def test_the_screen_never_touches_the_evaluation_split() -> None:
    """`bench.screen` chooses among models: its windows lie in the training split and its seeds
    are none of the evaluation's, so the evaluation split still decides only once."""
    cases = screen.cases()
    assert {c.ground for c in cases} == {*evaluation.CLUSTERS, "medium x2 arrivals"}
    for case in cases:
        assert traces.TRAIN_MINUTES[0] <= case.minutes[0] < case.minutes[1] <= traces.TRAIN_MINUTES[1]
        assert case.seed not in evaluation.SEEDS
        assert case.drain_underused  # the evaluation's ground
    # The same cases where only empty nodes go (`--no-drain-underused`).
    assert [dataclasses.replace(c, drain_underused=True) for c in screen.cases(False)] == cases
    assert not any(c.drain_underused for c in screen.cases(False))


def test_the_screen_refuses_a_model_that_cannot_serve(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bad = tmp_path / "placement.onnx"
    bad.write_bytes(b"not onnx")
    monkeypatch.setattr("sys.argv", ["screen", str(bad)])
    with pytest.raises(SystemExit) as exit_:
        screen.main()
    assert exit_.value.code == 2
