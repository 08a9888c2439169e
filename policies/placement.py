"""The placement policy contract that the extender, `kdrl score` and the simulator call."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from policies.types import FloatArray, NodeTable, PodRequest


@runtime_checkable
class PlacementPolicy(Protocol):
    """Scores feasible nodes for one pod: one finite float per node, higher is better.

    Implementations are pure: no I/O, no clock reads, inputs left untouched, the same
    answer for the same inputs. Infeasible nodes have been filtered out before the call.
    """

    @property
    def name(self) -> str: ...

    def score(self, pod: PodRequest, nodes: NodeTable) -> FloatArray: ...


def scores_rows_alone(policy: PlacementPolicy) -> bool:
    """Whether `policy` scores each node from that node and cluster-wide facts alone, never from
    the other candidates (no normalising over them, no pooled context). Such a policy may score
    a superset of the candidates and keep their rows: the same numbers, without building the
    candidates' table (what the simulator does per placement). Policies say so with a true
    `scores_rows_alone` attribute; absent, the answer is no."""
    return bool(getattr(policy, "scores_rows_alone", False))


@dataclass(frozen=True, slots=True)
class ScoreTerm:
    """One weighted part of a composite score, for explanations ("why would it go there?")."""

    name: str
    weight: float
    values: FloatArray  # unweighted, one per node


@runtime_checkable
class ExplainablePolicy(PlacementPolicy, Protocol):
    """A policy whose score is a weighted sum of named terms."""

    def terms(self, pod: PodRequest, nodes: NodeTable) -> tuple[ScoreTerm, ...]: ...
