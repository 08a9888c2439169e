"""The base of a residual policy: a heuristic's scores as logits the learned part adds to.

A residual policy's logit for a node is `scale x` the heuristic's score standardised over the
candidates (mean 0, standard deviation 1), plus what the network outputs for that node. The
network's last layer starts at zero, so an untrained residual policy *is* the heuristic: the
same argmax, the same ties (Silver et al. 2018, "Residual Policy Learning"; Johannink et al.
2019). One function computes the base for training, evaluation and serving, from the very
heuristic object `tuned` serves with; the model file carries the heuristic's weights and the
scale, so it needs nothing else.

With `top_k`, the learned part scores only the base's `top_k` best candidates (its inference
runs on that many rows; its features' context is still taken over every candidate), and the
others rank below them in the base's order: the policy chooses among the heuristic's
shortlist, in training as in serving.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from policies import heuristics
from policies.types import BoolArray, FloatArray, IntArray, NodeTable, PodRequest

# JSON {"weights": {...}, "scale": s[, "top_k": k]} in the model's metadata
META_BASE = "kdrl.residual_base"


@dataclass(frozen=True)
class ResidualBase:
    """A weighted heuristic and the scale of its standardised scores in logit units."""

    weights: Mapping[str, float]
    scale: float
    top_k: int = 0  # the learned part scores the base's best `top_k` candidates; 0: all of them

    def __post_init__(self) -> None:
        if not (np.isfinite(self.scale) and self.scale > 0):
            raise ValueError(f"residual scale must be a positive number, not {self.scale!r}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(
                f"residual top_k must be a whole number >= 0 (0: every candidate), not {self.top_k!r}"
            )
        _ = self.policy  # unknown terms fail here, at construction (and it is built once)

    @classmethod
    def of(cls, heuristic: str, scale: float, top_k: int = 0) -> ResidualBase:
        """The base over a named weighted heuristic (kube-default, most-allocated, tuned)."""
        policy = heuristics.by_name(heuristic)
        if not isinstance(policy, heuristics.WeightedSumPolicy):
            raise ValueError(f"{heuristic!r} is not a weighted sum of score terms; it cannot be a base")
        # Under `heuristics.TERMS` names (kube-default's profile names its plugins as upstream).
        by_function = {fn: name for name, fn in heuristics.TERMS.items()}
        weights = {by_function[fn]: weight for _, weight, fn in policy.parts}
        return cls(weights=weights, scale=scale, top_k=top_k)

    @cached_property
    def policy(self) -> heuristics.WeightedSumPolicy:  # built once: it scores every placement
        return heuristics.weighted("base", self.weights)

    def to_json(self) -> str:
        shortlist = {"top_k": self.top_k} if self.top_k else {}  # older readers never see the key
        return json.dumps({"weights": dict(self.weights), "scale": self.scale, **shortlist}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ResidualBase:
        try:
            document = json.loads(text)
            weights = {str(k): float(v) for k, v in document["weights"].items()}
            top_k = document.get("top_k", 0)
            return cls(weights=weights, scale=float(document["scale"]), top_k=top_k)
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            raise ValueError(f"unreadable residual base {text[:80]!r} ({error})") from error

    def logits(self, pod: PodRequest, nodes: NodeTable, candidates: BoolArray | None = None) -> FloatArray:
        """`scale` x the heuristic's scores standardised over `candidates` (all rows when None);
        0 elsewhere, and everywhere when the candidates all score the same."""
        return standardised(self.policy.score(pod, nodes), candidates) * self.scale

    def shortlist(self, logits: FloatArray, candidates: BoolArray | None = None) -> IntArray | None:
        """The rows the learned part scores: the `top_k` candidates by the base's `logits`, best
        first (ties in row order), or every candidate, best first, when there are no more; None
        without a shortlist (`top_k` 0)."""
        if not self.top_k:
            return None
        rows = np.arange(logits.size) if candidates is None else np.flatnonzero(candidates)
        cost = -logits if candidates is None else -logits[rows]
        if rows.size <= self.top_k:
            return rows[np.argsort(cost, kind="stable")]
        # The first top_k of a stable sort, without sorting every candidate: the k-th best value,
        # all rows above it, then the tied ones in row order; only those few are sorted.
        kth = np.partition(cost, self.top_k - 1)[self.top_k - 1]
        better = np.flatnonzero(cost < kth)
        chosen = np.concatenate([better, np.flatnonzero(cost == kth)[: self.top_k - better.size]])
        best: IntArray = rows[chosen[np.argsort(cost[chosen], kind="stable")]]
        return best


def with_residual(base: FloatArray, rows: IntArray, residual: FloatArray) -> FloatArray:
    """A shortlisting policy's logits for every row: base + residual on the shortlisted `rows`
    (in float32, as in training); the other rows keep the base's order, all below the lowest
    shortlisted logit (the learned policy never chooses them)."""
    scored = (base[rows].astype(np.float32) + residual.astype(np.float32)).astype(np.float64)
    # Shifted by what puts the base's best below the lowest scored row: the rest keep its order.
    out = base - (float(base.max()) - float(scored.min()) + 1.0)
    out[rows] = scored
    return out


def standardised(scores: FloatArray, candidates: BoolArray | None = None) -> FloatArray:
    """(score − mean) / std over the candidates; 0 outside them or when std is 0. Monotone within
    the candidates, so argmax and ties are the scores' own."""
    if candidates is None or candidates.all():
        spread = float(scores.std())
        return (scores - scores.mean()) / spread if spread > 0.0 else np.zeros(scores.size)
    out = np.zeros(scores.size, dtype=np.float64)
    if not candidates.any():
        return out
    chosen = scores[candidates]
    spread = float(chosen.std())
    if spread > 0.0:
        out[candidates] = (chosen - chosen.mean()) / spread
    return out
