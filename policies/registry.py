"""Placement policies by name, for the service, `kdrl score|simulate|evaluate` alike."""

from __future__ import annotations

from pathlib import Path

from policies import heuristics, onnx_policy
from policies.onnx_policy import LoadedPolicy

PLACEMENT_NAMES = (*heuristics.HEURISTIC_NAMES, "onnx")


def check(name: str) -> None:
    """A KeyError naming the known policies when `name` is not one (loads nothing)."""
    if name not in PLACEMENT_NAMES:
        raise KeyError(f"unknown placement policy {name!r}; known: {', '.join(PLACEMENT_NAMES)}")


def load(
    name: str,
    *,
    seed: int = 0,
    model: Path | None = None,
    device: str = "auto",
    threads: int = 1,
    tuned_weights: Path = heuristics.TUNED_WEIGHTS,
) -> LoadedPolicy:
    """The policy called `name`. `onnx` (with `model`, default the shipped one) and `tuned`
    (with its weights file) fall back to kube-default (degraded, with the reason) when their
    file cannot serve."""
    check(name)
    if name == "onnx":
        return onnx_policy.load(model or onnx_policy.DEFAULT_MODEL, device=device, threads=threads)
    if name == "tuned":
        try:
            policy = heuristics.tuned(tuned_weights)
            digest = onnx_policy.content_hash(tuned_weights.read_bytes())
            return LoadedPolicy(policy=policy, provider="numpy", model=digest)
        except (ValueError, OSError) as error:
            return LoadedPolicy.kube_default_instead("tuned", str(error))
    return LoadedPolicy(policy=heuristics.by_name(name, seed=seed), provider="numpy")
