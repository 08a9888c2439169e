"""The base of a residual policy: a heuristic's scores as logits the learned part adds to.

A residual policy's logit for a node is `scale x` the heuristic's score standardised over the
candidates (mean 0, standard deviation 1), plus what the network outputs for that node. The
network's last layer starts at zero, so an untrained residual policy *is* the heuristic: the
same argmax, the same ties (Silver et al. 2018, "Residual Policy Learning"; Johannink et al.
2019). One function computes the base for training, evaluation and serving, from the very
heuristic object `tuned` serves with; the model file carries the heuristic's weights and the
scale, so it needs nothing else.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from policies import heuristics
from policies.types import BoolArray, FloatArray, NodeTable, PodRequest

META_BASE = "kdrl.residual_base"  # JSON {"weights": {...}, "scale": s} in the model's metadata


@dataclass(frozen=True)
class ResidualBase:
    """A weighted heuristic and the scale of its standardised scores in logit units."""

    weights: Mapping[str, float]
    scale: float

    def __post_init__(self) -> None:
        if not (np.isfinite(self.scale) and self.scale > 0):
            raise ValueError(f"residual scale must be a positive number, not {self.scale!r}")
        _ = self.policy  # unknown terms fail here, at construction (and it is built once)

    @classmethod
    def of(cls, heuristic: str, scale: float) -> ResidualBase:
        """The base over a named weighted heuristic (kube-default, most-allocated, tuned)."""
        policy = heuristics.by_name(heuristic)
        if not isinstance(policy, heuristics.WeightedSumPolicy):
            raise ValueError(f"{heuristic!r} is not a weighted sum of score terms; it cannot be a base")
        # Under `heuristics.TERMS` names (kube-default's profile names its plugins as upstream).
        by_function = {fn: name for name, fn in heuristics.TERMS.items()}
        return cls(weights={by_function[fn]: weight for _, weight, fn in policy.parts}, scale=scale)

    @cached_property
    def policy(self) -> heuristics.WeightedSumPolicy:  # built once: it scores every placement
        return heuristics.weighted("base", self.weights)

    def to_json(self) -> str:
        return json.dumps({"weights": dict(self.weights), "scale": self.scale}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ResidualBase:
        try:
            document = json.loads(text)
            weights = {str(k): float(v) for k, v in document["weights"].items()}
            return cls(weights=weights, scale=float(document["scale"]))
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            raise ValueError(f"unreadable residual base {text[:80]!r} ({error})") from error

    def logits(self, pod: PodRequest, nodes: NodeTable, candidates: BoolArray | None = None) -> FloatArray:
        """`scale` x the heuristic's scores standardised over `candidates` (all rows when None);
        0 elsewhere, and everywhere when the candidates all score the same."""
        return standardised(self.policy.score(pod, nodes), candidates) * self.scale


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
