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
