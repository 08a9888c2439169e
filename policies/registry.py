"""Placement policies by name, for the service, `kdrl score|simulate|evaluate` alike."""

from __future__ import annotations

from pathlib import Path

from policies import heuristics, onnx_policy
from policies.onnx_policy import LoadedPolicy

PLACEMENT_NAMES = (*heuristics.HEURISTIC_NAMES, "onnx")


def load(
    name: str,
    *,
    seed: int = 0,
    model: Path = onnx_policy.DEFAULT_MODEL,
    device: str = "auto",
    threads: int = 1,
) -> LoadedPolicy:
    """The policy called `name`. `onnx` falls back to kube-default (degraded, with the reason)
    when its model cannot serve; an unknown name is a KeyError naming the known ones."""
    if name == "onnx":
        return onnx_policy.load(model, device=device, threads=threads)
    if name not in PLACEMENT_NAMES:
        raise KeyError(f"unknown placement policy {name!r}; known: {', '.join(PLACEMENT_NAMES)}")
    return LoadedPolicy(policy=heuristics.by_name(name, seed=seed), provider="numpy")
