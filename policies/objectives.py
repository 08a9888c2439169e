"""What a placement is judged by: the objectives, their weights, and per-class SLA targets.

One definition serves the learning environment's reward, `kdrl evaluate`'s composite and the
ConfigMap. The four weights follow the project's seeds: utilization α = 0.5, quality of service
β = 0.3 (cold-start seconds weighted by priority, SLA violations), cost γ = 0.1 (dollars) and
other δ = 0.1 (energy, joules).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from policies.types import Priority

# Start-delay targets per priority class, seconds: the one table of SLAs. critical and high
# must not see a cold start beyond a cached pod start (2-4 s); batch tolerates image pulls.
SLA_TARGET_S: Mapping[Priority, float] = {
    Priority.CRITICAL: 1.0,
    Priority.HIGH: 2.0,
    Priority.NORMAL: 5.0,
    Priority.LOW: 15.0,
    Priority.BATCH: 60.0,
}
# How much a second of cold start weighs, by class (normal = 1).
PRIORITY_WEIGHT: Mapping[Priority, float] = {
    Priority.CRITICAL: 4.0,
    Priority.HIGH: 2.0,
    Priority.NORMAL: 1.0,
    Priority.LOW: 0.5,
    Priority.BATCH: 0.25,
}
SLA_VIOLATION_S = 10.0  # an SLA violation costs as much as this many weighted cold-start seconds


@dataclass(frozen=True, slots=True)
class ObjectiveWeights:
    utilization: float = 0.5  # α: allocation utilization of the nodes that exist
    qos: float = 0.3  # β: priority-weighted cold-start seconds and SLA violations
    cost: float = 0.1  # γ: dollars
    other: float = 0.1  # δ: energy
    priority: Mapping[Priority, float] = field(default_factory=lambda: dict(PRIORITY_WEIGHT))

    def __post_init__(self) -> None:
        for name in ("utilization", "qos", "cost", "other"):
            value = getattr(self, name)
            if not 0.0 <= value <= 100.0:
                raise ValueError(f"objective weight {name}={value}: expected 0..100")


@dataclass(frozen=True, slots=True)
class Objectives:
    """What one run measured, in the units the composite compares."""

    utilization: float  # mean CPU allocation share of existing nodes, 0..1
    qos_s: float  # priority-weighted cold-start seconds plus weighted SLA violations x SLA_VIOLATION_S
    cost_usd: float
    energy_j: float


def composite(run: Objectives, reference: Objectives, weights: ObjectiveWeights) -> float:
    """Weighted loss relative to a reference run (the reference scores 1; lower is better):
    α (1 − u)/(1 − u_ref) + β qos/qos_ref + γ cost/cost_ref + δ energy/energy_ref."""
    parts = (
        (weights.utilization, 1.0 - run.utilization, 1.0 - reference.utilization),
        (weights.qos, run.qos_s, reference.qos_s),
        (weights.cost, run.cost_usd, reference.cost_usd),
        (weights.other, run.energy_j, reference.energy_j),
    )
    total = sum(w for w, _, _ in parts)
    return sum(w * (value / ref if ref > 0 else 1.0 + value) for w, value, ref in parts) / total
