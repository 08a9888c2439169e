"""Filter, then score: one pod against a table of nodes, as the extender and `kdrl score` need it."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from policies import filtering
from policies.placement import ExplainablePolicy, PlacementPolicy, ScoreTerm
from policies.types import FloatArray, IntArray, NodeTable, PodRequest


@dataclass(frozen=True, slots=True)
class Ranking:
    """Verdicts and raw policy scores for every node; scores are NaN where infeasible."""

    nodes: NodeTable
    verdicts: filtering.Verdicts
    scores: FloatArray
    terms: tuple[ScoreTerm, ...]  # per-term breakdown (NaN where infeasible); empty if not asked

    def best_first(self, limit: int | None = None) -> IntArray:
        """Rows, feasible ones by descending score (ties in row order), then the infeasible."""
        key = np.where(self.verdicts.feasible, -np.nan_to_num(self.scores, nan=0.0), np.inf)
        if limit is not None and limit < len(key):
            top = np.argpartition(key, limit)[:limit]
            return top[np.argsort(key[top], kind="stable")]
        return np.argsort(key, kind="stable")


def rank(
    pod: PodRequest,
    nodes: NodeTable,
    policy: PlacementPolicy,
    *,
    explain: bool = False,
    prefiltered: bool = False,
) -> Ranking:
    """Filter and score; with `explain`, also failure reasons and the per-term breakdown.
    `prefiltered`: every node has just passed the filter for this pod (skips filtering again)."""
    verdicts = (
        filtering.all_feasible(len(nodes))
        if prefiltered
        else filtering.filter_nodes(pod, nodes, explain=explain)
    )
    feasible_rows = np.flatnonzero(verdicts.feasible)
    scores = np.full(len(nodes), np.nan)
    terms: tuple[ScoreTerm, ...] = ()
    if feasible_rows.size:
        feasible = nodes if feasible_rows.size == len(nodes) else nodes.take(feasible_rows)
        scores[feasible_rows] = policy.score(pod, feasible)
        if explain and isinstance(policy, ExplainablePolicy):
            terms = tuple(_spread(t, feasible_rows, len(nodes)) for t in policy.terms(pod, feasible))
    return Ranking(nodes=nodes, verdicts=verdicts, scores=scores, terms=terms)


def _spread(term: ScoreTerm, rows: IntArray, size: int) -> ScoreTerm:
    values = np.full(size, np.nan)
    values[rows] = term.values
    return ScoreTerm(name=term.name, weight=term.weight, values=values)
