"""The last placement decisions, for `/debug/decisions` and the decision explorer (`/ui`).

The extender keeps a bounded ring of what it decided per pod: the filter's rejections, the
policy's ranking, the bind outcome and the trace id. Recording keeps references only (the
snapshot's tables are immutable); the per-term breakdown of the top candidates is computed
when someone asks, so the scheduler's hot path pays for none of it.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from policies import ranking
from policies.placement import PlacementPolicy
from policies.types import FloatArray, NodeTable, PodRequest

RECENT = 200  # decisions kept; `/debug/decisions?limit=` is capped at this
TOP = 5  # candidates shown per decision
REASON_EXAMPLES = 5  # filter reasons shown per decision (with their node names)


@dataclass
class Decision:
    """What happened to one pod, filled in verb by verb."""

    pod: PodRequest
    at: float  # seconds since the epoch of the latest verb
    policy: str
    trace_id: str = ""
    rejections: dict[str, int] = field(default_factory=dict)  # reason code -> nodes
    reasons: dict[str, str] = field(default_factory=dict)  # a few node name -> why not
    candidates: NodeTable | None = None  # what prioritize ranked
    scores: FloatArray | None = None  # raw policy scores, NaN where infeasible
    outcome: str = "filtered"  # filtered, scored, all_filtered, bound, bind_conflict, bind_error
    bound_node: str | None = None
    error: str = ""

    def as_json(self, policy: PlacementPolicy) -> dict[str, Any]:
        pod = self.pod
        top, weights = self._top(policy)
        return {
            "pod": f"{pod.namespace}/{pod.name}",
            "uid": pod.uid,
            "function": pod.function,
            "priority": pod.priority.value,
            "policy": self.policy,
            "at": round(self.at, 3),
            "outcome": self.outcome,
            "best_node": top[0]["node"] if top else None,
            "bound_node": self.bound_node,
            "error": self.error,
            "trace_id": self.trace_id,
            "rejections": dict(sorted(self.rejections.items())),
            "reasons": self.reasons,
            "candidates": 0 if self.candidates is None else len(self.candidates),
            "top": top,
            "weights": weights,
        }

    def _top(self, policy: PlacementPolicy) -> tuple[list[dict[str, Any]], dict[str, float]]:
        """The best candidates with their scores and, for a policy that explains itself, each
        term's value (as `kdrl score` shows them) and the terms' weights. Terms are computed
        over every feasible candidate, as they were at decision time."""
        if self.candidates is None or self.scores is None:
            return [], {}
        rows = np.flatnonzero(np.isfinite(self.scores))
        if not rows.size:
            return [], {}
        feasible, scores = self.candidates.take(rows), self.scores[rows]
        terms = ranking.rank(self.pod, feasible, policy, explain=True, prefiltered=True).terms
        order = np.argsort(-scores, kind="stable")[:TOP].tolist()
        top = [
            {
                "node": str(feasible.names[i]),
                "score": round(float(scores[i]), 6),
                "terms": {t.name: round(float(t.values[i]), 6) for t in terms},
            }
            for i in order
        ]
        return top, {t.name: t.weight for t in terms}


class DecisionLog:
    """A bounded ring of decisions keyed by pod uid, newest last."""

    def __init__(self, size: int = RECENT, clock: Any = time.time) -> None:
        self.size = size
        self.clock = clock
        self._by_uid: OrderedDict[str, Decision] = OrderedDict()

    def __len__(self) -> int:
        return len(self._by_uid)

    def entry(self, pod: PodRequest, policy: str, trace_id: str) -> Decision:
        """The pod's decision (a new one if unseen), moved to the newest end."""
        key = pod.uid or f"{pod.namespace}/{pod.name}"
        decision = self._by_uid.get(key)
        if decision is None:
            decision = self._by_uid[key] = Decision(pod=pod, at=self.clock(), policy=policy)
            while len(self._by_uid) > self.size:
                self._by_uid.popitem(last=False)
        self._by_uid.move_to_end(key)
        decision.at = self.clock()
        decision.trace_id = trace_id or decision.trace_id
        return decision

    def get(self, uid: str) -> Decision | None:
        return self._by_uid.get(uid)

    def recent(self, limit: int) -> list[Decision]:
        """The newest `limit` decisions, newest first."""
        return list(reversed(self._by_uid.values()))[: max(limit, 0)]
