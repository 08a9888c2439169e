"""Forecast accuracy on the shared Azure rows: train on the first 12 hours, test on the last 12.

    python -m bench.forecast_accuracy              # table; docs/forecaster-accuracy.md has a run
    python -m bench.forecast_accuracy --json

Per population, unweighted and weighted by `occ_ref_samples`:
- expected counts: MAE, MASE and RMSSE at horizons 1, 5 and 30 minutes of the chosen-per-function
  ensemble (models chosen by a backtest inside the first 12 hours only; `--rechoose 60`
  re-chooses every hour from the history up to then, as `kdrl serve` does) against Naive
  (persistence) and SeasonalNaive(60). Forecasts start every 30 minutes of the last 12 hours
  (rolling origin, refitted on everything before). MASE scales each function's MAE by its
  in-sample one-step persistence MAE (functions with none are left out), RMSSE its RMSE by
  that of persistence.
- the decision that matters, "invoked within the next 1 / 5 / 10 minutes": Brier score of the
  ensemble's `p_within` (calibrated on the backtest against the expected total), and
  precision/recall of both the ensemble (probability >= 0.5) and the hybrid histogram's own
  windows (positive when its instance would be loaded at some point of the next k minutes).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from bench.simulator import SHARED_TRACE, trace_or_skip
from forecaster import forecasting, histogram
from forecaster.history import MinuteCounts, idle_minutes
from simulator import traces

TRAIN, DAY, STEP, HORIZON = 720, 1440, 30, 30
HORIZONS = (1, 5, 30)
# Minutes between model choices: by default once, on the first 12 hours only; `--rechoose 60`
# re-chooses every hour from the history up to then, as `kdrl serve` does (`plugin/forecasts.py`).
RECHOOSE = DAY - TRAIN
WITHIN = (1, 5, 10)


def evaluate(trace: traces.Trace, population: str, rechoose: int = RECHOOSE) -> list[dict[str, Any]]:
    members = np.flatnonzero(np.asarray(trace.populations) == population)
    counts = trace.counts[members]
    weights = trace.weights[members]
    names = [f"p/{i}" for i in range(len(members))]
    # As served (`plugin/forecasts.py`): models re-chosen every `rechoose` minutes from the
    # history up to then; each choice forecasts the origins until the next one.
    choices: dict[int, forecasting.Choice] = {}
    parts = []
    for start in range(TRAIN, DAY, rechoose):
        end = min(start + rechoose, DAY)
        choices[start] = chosen = _choose(counts, names, start)
        parts.extend(_rolling(counts[:, :end], names, chosen, windows=(end - start) // STEP))
    cv = pd.concat(parts, ignore_index=True)
    cv["step"] = cv["ds"] - cv["cutoff"]
    cv["chosen_at"] = TRAIN + (cv["cutoff"] + 1 - TRAIN) // rechoose * rechoose
    scales = _naive_scales(counts)
    rows = []
    for view in ("unweighted", "weighted"):
        w = weights if view == "weighted" else np.ones(len(members))
        if not (w > 0).any():
            continue
        for horizon in HORIZONS:
            at = cv[cv["step"] == horizon]
            row: dict[str, Any] = {"population": population, "view": view, "metric": f"h={horizon}"}
            for name in ("ensemble", "Naive", "SeasonalNaive60"):
                mae, mase, rmsse = _errors(at, name, names, w, scales)
                row[f"{name}_mae"], row[f"{name}_mase"] = round(mae, 4), round(mase, 4)
                row[f"{name}_rmsse"] = round(rmsse, 4)
            rows.append(row)
        rows.extend(_decisions(cv, counts, names, w, choices, population, view))
    return rows


def _rolling(
    counts: np.ndarray, names: list[str], chosen: forecasting.Choice, windows: int
) -> list[pd.DataFrame]:
    """Forecasts from the last `windows` origins of `counts`, each function by its own models."""
    plan_of = {n: chosen.models(n, "sparse") for n in names}  # a function silent so far: sparse
    length = counts.shape[1]
    parts = []
    for short, later in sorted(set(plan_of.values())):  # each function runs only its own models
        group = [i for i, n in enumerate(names) if plan_of[n] == (short, later)]
        frame = pd.DataFrame(
            {
                "unique_id": np.repeat([names[i] for i in group], length),
                "ds": np.tile(np.arange(length), len(group)),
                "y": counts[group].ravel().astype(float),
            }
        )
        engine = forecasting._engine(sorted({short, later, "Naive", "SeasonalNaive60"}))
        part = engine.cross_validation(df=frame, h=HORIZON, step_size=STEP, n_windows=windows)
        first = (part["ds"] - part["cutoff"]).to_numpy() <= forecasting.SHORT_STEPS
        part = part.assign(ensemble=np.where(first, part[short], part[later]))
        parts.append(part[["unique_id", "ds", "cutoff", "y", "ensemble", "Naive", "SeasonalNaive60"]])
    return parts


def _choose(counts: np.ndarray, names: list[str], end: int) -> forecasting.Choice:
    history = MinuteCounts()
    for name, row in zip(names, counts):
        for minute in np.flatnonzero(row[:end]):
            history.add(name, int(minute), int(row[minute]))
    return forecasting.Forecaster(history).choose(end, horizon=HORIZON)


def _naive_scales(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each function's in-sample one-step persistence MAE and RMSE: MASE's and RMSSE's scales."""
    steps = np.diff(counts[:, :TRAIN].astype(float), axis=1)
    return np.abs(steps).mean(axis=1), np.sqrt((steps**2).mean(axis=1))


def _errors(
    at: pd.DataFrame, name: str, names: list[str], w: np.ndarray, scales: tuple[np.ndarray, np.ndarray]
) -> tuple[float, float, float]:
    """MAE, MASE and RMSSE (M5's scaled RMSE: a mean forecast is the best one under it, where
    MAE's best is the median, zero for an intermittent series)."""
    errors = at[name] - at["y"]
    per = errors.abs().groupby(at["unique_id"]).mean().reindex(names).to_numpy()
    rmse = np.sqrt((errors**2).groupby(at["unique_id"]).mean().reindex(names).to_numpy())
    keep = w > 0
    mae = float(np.average(per[keep], weights=w[keep]))
    mae_scale, rmse_scale = scales
    ok = keep & (mae_scale > 0)
    if not ok.any():
        return mae, float("nan"), float("nan")
    mase = float(np.average(per[ok] / mae_scale[ok], weights=w[ok]))
    rmsse = float(np.average(rmse[ok] / rmse_scale[ok], weights=w[ok]))
    return mae, mase, rmsse


def _decisions(
    cv: pd.DataFrame,
    counts: np.ndarray,
    names: list[str],
    w: np.ndarray,
    choices: dict[int, forecasting.Choice],
    population: str,
    view: str,
) -> list[dict[str, Any]]:
    ensemble = cv.pivot_table(
        index=["unique_id", "cutoff", "chosen_at"], columns="step", values="ensemble", sort=False
    )
    order = np.array([int(str(n).split("/")[1]) for n in ensemble.index.get_level_values(0)])
    cutoffs = ensemble.index.get_level_values(1).to_numpy()
    chosen_at = ensemble.index.get_level_values(2).to_numpy()
    expected = np.clip(ensemble.to_numpy(), 0, None)  # (function x cutoff, horizon)
    # Each function's class at each origin, from the minutes a fit sees (as `Forecaster.classes`).
    invoked = np.concatenate([np.zeros((len(counts), 1)), np.cumsum(counts > 0, axis=1)], axis=1)
    fit = forecasting.TRAINING_MINUTES
    busy = (invoked[order, cutoffs + 1] - invoked[order, cutoffs + 1 - fit]) / fit >= forecasting.BUSY_SHARE
    p = np.empty_like(expected)  # P(any invocation within the first k minutes), per row and k
    for start, chosen in choices.items():
        for kind, members in (("busy", busy), ("sparse", ~busy)):
            rows = members & (chosen_at == start)
            table = chosen.within.get(kind)
            p[rows] = np.array([forecasting.within_probability(row, table) for row in expected[rows]])
    loaded_from, loaded_to, since = _hybrid_windows(counts, order, cutoffs)
    # As served (`Forecast.best_p_within`): the idle-time answer once a function has been invoked,
    # the model's before.
    idle = _idle_answers(counts, order, cutoffs, max(WITHIN))
    served = np.where(np.isnan(idle), p[:, : max(WITHIN)], idle)
    rows = []
    for k in WITHIN:
        future = np.stack([counts[i, c + 1 : c + 1 + k] for i, c in zip(order, cutoffs)])
        truth: np.ndarray = np.asarray(future.any(axis=1), dtype=bool)
        prob, best = p[:, k - 1], served[:, k - 1]
        hybrid = (since + k >= loaded_from) & (since <= loaded_to)
        wt = w[order]
        keep = wt > 0
        rows.append(
            {
                "population": population,
                "view": view,
                "metric": f"invoked within {k} min",
                "brier": round(float(np.average((prob[keep] - truth[keep]) ** 2, weights=wt[keep])), 4),
                "served_brier": round(
                    float(np.average((best[keep] - truth[keep]) ** 2, weights=wt[keep])), 4
                ),
                **_precision_recall("ensemble", prob[keep] >= 0.5, truth[keep], wt[keep]),
                **_precision_recall("served", best[keep] >= 0.5, truth[keep], wt[keep]),
                **_precision_recall("hybrid", hybrid[keep], truth[keep], wt[keep]),
            }
        )
    return rows


def _hybrid_windows(
    counts: np.ndarray, order: np.ndarray, cutoffs: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per (function, cutoff): when the hybrid policy's instance is loaded, in minutes since the
    last invocation before the cutoff (from, to), and the minutes since that invocation. Never
    invoked yet: never loaded."""
    invoked = [np.flatnonzero(row) for row in counts]
    gaps = [np.append(np.diff(m), 0.0) for m in invoked]  # a last, unobserved period per function
    offsets = np.concatenate(([0], np.cumsum([len(g) for g in gaps]))).astype(np.int64)
    flat = np.concatenate(gaps).astype(np.float64) if gaps else np.zeros(0)
    prewarm, keepalive = histogram.batch_windows(flat, offsets)
    loaded_from = np.full(len(order), np.inf)
    loaded_to = np.full(len(order), -np.inf)
    since = np.zeros(len(order))
    for row, (i, cutoff) in enumerate(zip(order, cutoffs)):
        seen = int(np.searchsorted(invoked[i], cutoff, side="right"))  # invocation minutes <= cutoff
        if seen == 0:
            continue
        j = offsets[i] + seen - 1  # windows after the (seen - 1) idle periods observed so far
        since[row] = cutoff - invoked[i][seen - 1]
        loaded_from[row] = prewarm[j]
        loaded_to[row] = prewarm[j] + keepalive[j]
    return loaded_from, loaded_to, since


def _idle_answers(counts: np.ndarray, order: np.ndarray, cutoffs: np.ndarray, horizon: int) -> np.ndarray:
    """Per (function, cutoff): the idle-time answer exactly as the forecaster serves it
    (`forecasting.idle_answers` over every function's last fit window up to the cutoff, pooled
    across them); NaN where the function has not been invoked in that window."""
    out = np.full((len(order), horizon), np.nan)
    fit = forecasting.TRAINING_MINUTES
    for cutoff in np.unique(cutoffs):
        histories = {str(i): counts[i, max(0, cutoff + 1 - fit) : cutoff + 1] for i in range(len(counts))}
        gaps = {i: idle_minutes(series) for i, series in histories.items()}
        answers = forecasting.idle_answers(histories, gaps, horizon)
        for row in np.flatnonzero(cutoffs == cutoff):
            within = answers[str(order[row])][0]
            if within is not None:
                out[row] = within
    return out


def _precision_recall(name: str, predicted: np.ndarray, truth: np.ndarray, w: np.ndarray) -> dict[str, float]:
    tp = float((w * (predicted & truth)).sum())
    precision = tp / float((w * predicted).sum()) if predicted.any() else float("nan")
    recall = tp / float((w * truth).sum()) if truth.any() else float("nan")
    return {f"{name}_precision": round(precision, 4), f"{name}_recall": round(recall, 4)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", type=Path, default=SHARED_TRACE)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--rechoose", type=int, default=RECHOOSE, help="minutes between model choices")
    args = parser.parse_args()
    if not trace_or_skip(args.trace):
        return
    trace = traces.load(args.trace)
    rows = [row for population in traces.POPULATIONS for row in evaluate(trace, population, args.rechoose)]
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    for row in rows:
        print("  ".join(f"{k}={v}" for k, v in row.items()))


if __name__ == "__main__":
    main()
