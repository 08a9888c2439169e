"""Cluster specs: node pools in YAML (`simulator/clusters/{small,medium,large}.yaml` or a file).

Each pool has `count` nodes at start and autoscaler bounds `min`/`max`; `cpu` cores,
`memory_gib` and `gpus` per node; hourly prices `on_demand_per_hour` and `spot_per_hour` (a
`spot: true` pool pays the latter); `zone` (one or a list, dealt round-robin); `taints` and
`labels`; a `power` curve, `{model: linear, idle_watts, max_watts}` or `{model: specpower,
watts: [11 values at 0, 10, ..., 100 % load]}`; `image_disk_gib` (the kubelet's image
filesystem) and `pull_mib_per_s` (registry pull bandwidth). A malformed file is a
`ClusterSpecError` naming the file, the line and the field.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

BUNDLED = Path(__file__).resolve().parent / "clusters"
GiB, MiB = 1 << 30, 1 << 20


_POWER_POINTS = {11: np.linspace(0.0, 1.0, 11)}  # every curve is given at 0, 10, ..., 100 %


CLUSTER_KEYS = frozenset({"name", "pools"})
POOL_KEYS = frozenset(
    {
        "name", "count", "min", "max", "cpu", "memory_gib", "gpus", "on_demand_per_hour", "spot_per_hour",
        "spot", "zone", "taints", "labels", "power", "image_disk_gib", "pull_mib_per_s",
    }
)  # fmt: skip


class ClusterSpecError(ValueError):
    """A cluster file that is missing or malformed."""


@dataclass(frozen=True, slots=True)
class PowerCurve:
    """Watts at 0, 10, ..., 100 % CPU utilization, interpolated linearly in between."""

    watts: tuple[float, ...]

    def at(self, utilization: np.ndarray) -> np.ndarray:
        watts: np.ndarray = np.interp(
            np.clip(utilization, 0.0, 1.0), _POWER_POINTS[len(self.watts)], self.watts
        )
        return watts


@dataclass(frozen=True, slots=True)
class Pool:
    name: str
    count: int
    min: int
    max: int
    cpu_milli: int
    memory_bytes: int
    gpus: int
    on_demand_per_hour: float
    spot_per_hour: float
    spot: bool
    zones: tuple[str, ...]
    taints: tuple[tuple[str, str, str], ...]  # (key, value, effect)
    labels: tuple[tuple[str, str], ...]
    power: PowerCurve
    image_disk_bytes: int
    pull_bytes_per_s: float

    @property
    def price_per_hour(self) -> float:
        return self.spot_per_hour if self.spot else self.on_demand_per_hour


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    name: str
    pools: tuple[Pool, ...]

    @property
    def initial_nodes(self) -> int:
        return sum(p.count for p in self.pools)


def load(name_or_path: str) -> ClusterSpec:
    """A bundled spec by name (`small`, `medium`, `large`) or a YAML file."""
    path = (
        BUNDLED / f"{name_or_path}.yaml"
        if "/" not in name_or_path and not name_or_path.endswith((".yaml", ".yml"))
        else Path(name_or_path)
    )
    try:
        text = path.read_text()
    except OSError as error:
        known = ", ".join(sorted(p.stem for p in BUNDLED.glob("*.yaml")))
        raise ClusterSpecError(f"{path}: cannot read ({error.strerror}); bundled specs: {known}") from error
    try:
        root = yaml.compose(text)
    except yaml.YAMLError as error:
        raise ClusterSpecError(f"{path}: not valid YAML: {error}") from error
    return _spec(path, root)


def _spec(path: Path, root: Any) -> ClusterSpec:
    top = _mapping(path, root, "cluster")
    _known(path, top, CLUSTER_KEYS, "")
    pools_node = _field(path, root, top, "pools")
    if not isinstance(pools_node, yaml.SequenceNode) or not pools_node.value:
        raise ClusterSpecError(f"{path}:{_line(pools_node)}: field pools: expected a list of pools")
    name = _scalar(path, _field(path, root, top, "name"), "name", str)
    pools = tuple(_pool(path, node, i) for i, node in enumerate(pools_node.value))
    return ClusterSpec(name=name, pools=pools)


def _pool(path: Path, node: Any, index: int) -> Pool:
    where = f"pools[{index}]"
    fields = _mapping(path, node, where)
    _known(path, fields, POOL_KEYS, f"{where}.")

    def get(key: str, kind: type, default: Any = None) -> Any:
        if key not in fields:
            if default is None:
                raise ClusterSpecError(f"{path}:{_line(node)}: field {where}.{key}: required")
            return default
        return _scalar(path, fields[key], f"{where}.{key}", kind)

    count, low, high = get("count", int), get("min", int, 0), get("max", int, -1)
    high = count if high < 0 else high
    if not 0 <= low <= count <= high:
        raise ClusterSpecError(f"{path}:{_line(node)}: field {where}: need 0 <= min <= count <= max")
    numbers = {key: get(key, float) for key in ("cpu", "memory_gib", "on_demand_per_hour", "spot_per_hour")}
    numbers["image_disk_gib"] = get("image_disk_gib", float, 100.0)
    numbers["pull_mib_per_s"] = get("pull_mib_per_s", float, 40.0)
    for key, value in numbers.items():
        if not value > 0 or not np.isfinite(value):
            raise ClusterSpecError(
                f"{path}:{_line(fields.get(key, node))}: field {where}.{key}: must be positive"
            )
    gpus = get("gpus", int, 0)
    if gpus < 0:
        raise ClusterSpecError(f"{path}:{_line(fields['gpus'])}: field {where}.gpus: must not be negative")
    zones = yaml.safe_load(yaml.serialize(fields["zone"])) if "zone" in fields else ["zone-a"]
    zones = [zones] if isinstance(zones, str) else zones
    taints = yaml.safe_load(yaml.serialize(fields["taints"])) if "taints" in fields else []
    labels = yaml.safe_load(yaml.serialize(fields["labels"])) if "labels" in fields else {}
    return Pool(
        name=get("name", str),
        count=count,
        min=low,
        max=high,
        cpu_milli=int(numbers["cpu"] * 1000),
        memory_bytes=int(numbers["memory_gib"] * GiB),
        gpus=gpus,
        on_demand_per_hour=numbers["on_demand_per_hour"],
        spot_per_hour=numbers["spot_per_hour"],
        spot=get("spot", bool, False),
        zones=tuple(str(z) for z in zones),
        taints=tuple(
            (str(t["key"]), str(t.get("value", "")), str(t.get("effect", "NoSchedule"))) for t in taints
        ),
        labels=tuple((str(k), str(v)) for k, v in labels.items()),
        power=_power(path, fields.get("power"), where),
        image_disk_bytes=int(numbers["image_disk_gib"] * GiB),
        pull_bytes_per_s=numbers["pull_mib_per_s"] * MiB,
    )


def _power(path: Path, node: Any, where: str) -> PowerCurve:
    if node is None:
        raise ClusterSpecError(f"{path}: field {where}.power: required")
    spec = yaml.safe_load(yaml.serialize(node))
    line = _line(node)
    if not isinstance(spec, dict):
        raise ClusterSpecError(f"{path}:{line}: field {where}.power: expected a mapping")
    if spec.get("model") == "linear":
        idle, peak = spec.get("idle_watts"), spec.get("max_watts")
        if not isinstance(idle, (int, float)) or not isinstance(peak, (int, float)) or not 0 <= idle <= peak:
            raise ClusterSpecError(f"{path}:{line}: field {where}.power: need 0 <= idle_watts <= max_watts")
        return PowerCurve(watts=tuple(float(w) for w in np.linspace(idle, peak, 11)))
    if spec.get("model") == "specpower":
        watts = spec.get("watts")
        if (
            not isinstance(watts, list)
            or len(watts) != 11
            or not all(isinstance(w, (int, float)) for w in watts)
        ):
            raise ClusterSpecError(
                f"{path}:{line}: field {where}.power.watts: expected 11 numbers (0..100 %)"
            )
        return PowerCurve(watts=tuple(float(w) for w in watts))
    raise ClusterSpecError(f"{path}:{line}: field {where}.power.model: expected linear or specpower")


def _mapping(path: Path, node: Any, where: str) -> dict[str, Any]:
    if not isinstance(node, yaml.MappingNode):
        raise ClusterSpecError(f"{path}:{_line(node)}: field {where}: expected a mapping")
    return {key.value: value for key, value in node.value}


def _known(path: Path, fields: dict[str, Any], allowed: frozenset[str], where: str) -> None:
    """A misspelt key would silently fall back to a default: refuse it."""
    for key, value in fields.items():
        if key not in allowed:
            raise ClusterSpecError(
                f"{path}:{_line(value)}: field {where}{key}: unknown key "
                f"(known: {', '.join(sorted(allowed))})"
            )


def _field(path: Path, parent: Any, fields: dict[str, Any], key: str) -> Any:
    if key not in fields:
        raise ClusterSpecError(f"{path}:{_line(parent)}: field {key}: required")
    return fields[key]


def _scalar(path: Path, node: Any, where: str, kind: type) -> Any:
    value = yaml.safe_load(yaml.serialize(node)) if node is not None else None
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ClusterSpecError(
            f"{path}:{_line(node)}: field {where}: expected {kind.__name__}, got {value!r}"
        )
    return value


def _line(node: Any) -> int:
    return int(node.start_mark.line) + 1 if node is not None and hasattr(node, "start_mark") else 1
