"""What a node costs to run, from its labels: hourly price, power, spot, zone, pull bandwidth.

Kubernetes has no standard field for these, so the plugin reads well-known labels. Spot comes
from the labels each provisioner already sets; price, power and pull bandwidth from
`kdrl.dev/` labels an operator (or a node-pool template) puts on nodes. A node without them
gets documented defaults, which make nodes equal in that respect rather than wrong.
Read once per cluster snapshot (`ClusterObjects.economics`), not per request.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from policies.types import BoolArray, FloatArray, IntArray

PRICE_LABEL = "kdrl.dev/hourly-price"  # USD per hour, e.g. "0.38"
IDLE_WATTS_LABEL = "kdrl.dev/idle-watts"
MAX_WATTS_LABEL = "kdrl.dev/max-watts"
PULL_LABEL = "kdrl.dev/pull-mib-per-s"  # registry pull bandwidth
ZONE_LABEL = "topology.kubernetes.io/zone"
SPOT_LABELS: Mapping[str, str] = {
    "karpenter.sh/capacity-type": "spot",
    "cloud.google.com/gke-spot": "true",
    "eks.amazonaws.com/capacityType": "SPOT",
    "kubernetes.azure.com/scalesetpriority": "spot",
}
DEFAULT_PRICE = 0.0  # unknown: every node costs the same, so price cannot decide
DEFAULT_IDLE_WATTS, DEFAULT_MAX_WATTS = 100.0, 250.0  # a typical two-socket server
DEFAULT_PULL_MIB_PER_S = 40.0


@dataclass(frozen=True, eq=False)
class NodeEconomics:
    """One entry per node of a cluster, aligned with `ClusterObjects`."""

    price_per_hour: FloatArray
    idle_watts: FloatArray
    max_watts: FloatArray
    pull_bytes_per_s: FloatArray
    spot: BoolArray
    zone: IntArray  # index into `zones`
    zones: tuple[str, ...]

    @classmethod
    def from_labels(cls, labels: Iterable[Mapping[str, str]]) -> NodeEconomics:
        rows = [_row(node_labels) for node_labels in labels]
        zones = tuple(dict.fromkeys(row[5] for row in rows))
        zone_index = {zone: i for i, zone in enumerate(zones)}
        columns = list(zip(*rows)) if rows else [()] * 6
        return cls(
            price_per_hour=np.asarray(columns[0], dtype=np.float64),
            idle_watts=np.asarray(columns[1], dtype=np.float64),
            max_watts=np.asarray(columns[2], dtype=np.float64),
            pull_bytes_per_s=np.asarray(columns[3], dtype=np.float64) * 1024 * 1024,
            spot=np.asarray(columns[4], dtype=np.bool_),
            zone=np.asarray([zone_index[z] for z in columns[5]], dtype=np.int64),
            zones=zones,
        )

    def take(self, rows: IntArray) -> NodeEconomics:
        return NodeEconomics(
            price_per_hour=self.price_per_hour[rows],
            idle_watts=self.idle_watts[rows],
            max_watts=self.max_watts[rows],
            pull_bytes_per_s=self.pull_bytes_per_s[rows],
            spot=self.spot[rows],
            zone=self.zone[rows],
            zones=self.zones,
        )


def node_labels(
    price_per_hour: float, idle_watts: float, max_watts: float, pull_mib_per_s: float, *, spot: bool
) -> dict[str, str]:
    """The labels that describe a node of this kind (the simulator's pools wear them too)."""
    return {
        PRICE_LABEL: f"{price_per_hour:g}",
        IDLE_WATTS_LABEL: f"{idle_watts:g}",
        MAX_WATTS_LABEL: f"{max_watts:g}",
        PULL_LABEL: f"{pull_mib_per_s:g}",
        "karpenter.sh/capacity-type": "spot" if spot else "on-demand",
    }


def _row(labels: Mapping[str, str]) -> tuple[float, float, float, float, bool, str]:
    idle = _number(labels, IDLE_WATTS_LABEL, DEFAULT_IDLE_WATTS)
    return (
        _number(labels, PRICE_LABEL, DEFAULT_PRICE),
        idle,
        max(idle, _number(labels, MAX_WATTS_LABEL, max(DEFAULT_MAX_WATTS, idle))),
        _number(labels, PULL_LABEL, DEFAULT_PULL_MIB_PER_S, low=0.1),
        any(labels.get(key) == value for key, value in SPOT_LABELS.items()),
        labels.get(ZONE_LABEL, ""),
    )


def _number(labels: Mapping[str, str], key: str, default: float, *, low: float = 0.0) -> float:
    """A label as a finite number in [low, 1e6]; absent, malformed or absurd: the default."""
    text = labels.get(key)
    if text is None:
        return default
    try:
        value = float(text)
    except ValueError:
        return default
    return value if np.isfinite(value) and low <= value <= 1e6 else default
