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

    def best_first(self) -> IntArray:
        """Row order: feasible nodes by descending score (ties by name), then the rest."""
        key = np.where(self.verdicts.feasible, -np.nan_to_num(self.scores, nan=0.0), np.inf)
        return np.lexsort((np.asarray(self.nodes.names), key))


def rank(pod: PodRequest, nodes: NodeTable, policy: PlacementPolicy, *, explain: bool = False) -> Ranking:
    verdicts = filtering.filter_nodes(pod, nodes)
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
