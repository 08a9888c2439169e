"""The prewarm goals bench's verdicts (`bench/prewarm_goals.py`) on hand-built rows."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bench import prewarm_goals
from bench.prewarm import weighted_p75_setter
from bench.prewarm_goals import GOALS, ratio, selections, setters_text, table, verdicts, weighted_setters
from simulator import report


def rows(**overrides: dict[str, float]) -> list[dict[str, Any]]:
    """`bench.prewarm.measure` rows for the three policies: the planner halves the hybrid's
    p75 and stays under Knative's cost, unless `overrides` (by keep-alive) say otherwise."""
    base = {
        "knative": {
            "p75": 10.0,
            "weighted": 100.0,
            "wasted": 80.0,
            "p99": 20.0,
            "cost": 100.0,
            "energy": 50.0,
        },
        "hybrid": {"p75": 2.0, "weighted": 60.0, "wasted": 110.0, "p99": 40.0, "cost": 106.0, "energy": 53.0},
        "prewarm": {"p75": 1.0, "weighted": 30.0, "wasted": 105.0, "p99": 8.0, "cost": 102.0, "energy": 51.0},
    }
    out = []
    for keepalive, values in base.items():
        v = {**values, **overrides.get(keepalive, {})}
        for population in ("heavy", "light"):
            out.append(
                {
                    "keepalive": keepalive,
                    "population": population,
                    "p75_cold_pct": v["p75"] * (2 if population == "light" else 1),
                    "p75_cold_pct_weighted": v["weighted"],
                    "p75_cold_pct_first_calls_out": v.get("first_out", v["p75"] / 2),
                    "p75_cold_pct_first_calls_out_weighted": v.get("first_out", v["weighted"] / 2),
                    "wasted_memory_norm": v["wasted"],
                    "cold_latency_p99_s": v["p99"],
                    "cold_latency_p99_first_starts_out_s": v.get("p99_first_out", v["p99"] / 2),
                    "cost_usd": v["cost"],
                    "energy_kwh": v["energy"],
                    "cold_requests": 1000,
                    "p75_weighted_set_by": setter(f"{keepalive}-{population}"),
                }
            )
    return out


def setter(function: str) -> dict[str, Any]:
    return {
        "function": function,
        "calls": 3,
        "cold": 2,
        "weight_share": 0.25,
        "memory_mb": 2048,
        "gpus": 0,
        "priority": "low",
    }


def test_a_selection_that_meets_every_goal() -> None:
    got = verdicts(rows())
    assert got["heavy"] == got["light"] == got["heavy (weighted)"] == pytest.approx(0.5)
    assert got["cold p99"] == pytest.approx(0.4)
    assert got["cold p99, first starts out"] == pytest.approx(0.4)
    assert all(GOALS[goal](got[goal]) for goal in GOALS)


@pytest.mark.parametrize(
    ("overrides", "missed"),
    [
        ({"prewarm": {"p75": 1.2}}, {"heavy", "light"}),
        ({"prewarm": {"weighted": 40.0}}, {"heavy (weighted)", "light (weighted)"}),
        ({"prewarm": {"wasted": 111.0}}, {"wasted memory"}),
        ({"prewarm": {"p99": 8.5}}, {"cold p99"}),
        ({"prewarm": {"p99_first_out": 9.0}}, set()),  # a diagnostic, never a goal
        ({"prewarm": {"cost": 103.5, "energy": 52.0}}, {"cost", "energy"}),
    ],
)
def test_each_goal_missed_alone(overrides: dict[str, dict[str, float]], missed: set[str]) -> None:
    got = verdicts(rows(**overrides))
    assert {goal for goal in GOALS if not GOALS[goal](got[goal])} == missed


def test_nothing_to_halve_is_met_and_a_zero_reference_otherwise_is_not() -> None:
    assert ratio(0.0, 0.0) == 0.0
    assert ratio(1.0, 0.0) == float("inf")
    assert not GOALS["heavy"](ratio(1.0, 0.0))


def test_the_table_marks_misses_and_counts_selections() -> None:
    text = table([("a", verdicts(rows())), ("b", verdicts(rows(prewarm={"p75": 1.2})))])
    assert "**0.60x**" in text  # b's heavy: 1.2 / 2
    assert "| goal met on | 1 of 2 | 1 of 2 | 2 of 2 |" in text
    assert "| cold p99, first starts out / Knative |" in text


def test_first_calls_out_is_a_diagnostic_never_a_goal() -> None:
    # The first-call floor left out moves the ratio, but a selection is judged on the goals alone.
    got = verdicts(rows(prewarm={"first_out": 3.0}, hybrid={"first_out": 2.0}))
    assert got["heavy, first calls out"] == got["light, first calls out (weighted)"] == pytest.approx(1.5)
    assert all(GOALS[goal](got[goal]) for goal in GOALS)
    text = table([("a", got)])
    assert "1.50x" in text and "**1.50x**" not in text


def test_shared_selections_are_skipped_with_a_message_without_the_trace(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    chosen = selections([1], [9], tmp_path / "absent")
    assert [name for name, _ in chosen] == ["slice, seed 1"]
    assert "shared trace not found" in capsys.readouterr().err
    present = selections([], [9], tmp_path)
    assert present == [
        ("shared, seed 9", {"seed": 9, "trace": tmp_path, "functions": prewarm_goals.SELECTED_FUNCTIONS})
    ]


def test_the_weighted_percentile_names_the_entry_that_sets_it() -> None:
    values = np.array([80.0, 5.0, 100.0, 20.0])
    # 100 carries most of the weight, so it is the p75; the zero-weight 80 never counts.
    weights = np.array([0.0, 1.0, 10.0, 1.0])
    assert report.weighted_percentile_index(values, weights, 75) == 2
    assert report.weighted_percentile(values, weights, 75) == 100.0
    even = np.array([1.0, 1.0, 1.0, 1.0])
    assert report.weighted_percentile_index(values, even, 50) == 3  # 5, 20 | 80, 100
    assert report.weighted_percentile(values, even, 50) == 20.0
    assert report.weighted_percentile_index(values, np.zeros(4), 75) is None


def test_the_setter_is_the_function_at_the_populations_weighted_p75() -> None:
    per_function = {
        "func_ids": ["busy", "rare", "other-population", "never-called"],
        "invocations": [100, 3, 10, 0],
        "weights": [1.0, 9.0, 50.0, 40.0],
        "memory_mb": [128, 2048, 256, 512],
        "gpus": [0, 1, 0, 0],
        "priorities": ["normal", "critical", "low", "low"],
    }
    cold = np.array([1, 3, 10, 0])
    pct = 100.0 * cold / np.maximum(per_function["invocations"], 1)
    weights = np.asarray(per_function["weights"])
    members = np.array([True, True, False, False])  # one population, with calls
    assert weighted_p75_setter(per_function, members, pct, weights, cold) == {
        "function": "rare",
        "calls": 3,
        "cold": 3,
        "weight_share": 0.9,
        "memory_mb": 2048,
        "gpus": 1,
        "priority": "critical",
    }
    assert weighted_p75_setter(per_function, np.zeros(4, dtype=bool), pct, weights, cold) is None


def test_what_sets_a_missed_weighted_goal_is_named() -> None:
    missed = rows(prewarm={"weighted": 40.0})  # both weighted goals: 40 / 60
    results = [(name, verdicts(r), weighted_setters(r)) for name, r in (("a", rows()), ("b", missed))]
    text = setters_text(results)
    assert "- a," not in text  # met: nothing to explain
    assert text.count("- b, ") == 2
    named = "- b, heavy (weighted): the planner's set by prewarm-heavy (2 of 3 calls cold, 25 % of the weight"
    assert named in text
    assert "the hybrid's by hybrid-light" in text
