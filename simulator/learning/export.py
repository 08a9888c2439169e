"""Export the actor to ONNX with a dynamic node axis, and refuse a file ONNX Runtime disagrees with.

The graph takes one pod: `nodes` [N, F], `pod` [P], `cluster` [C] -> `logits` [N]; the
normalisation statistics are constants inside it. Metadata (read back by `OnnxPolicy`) names
the format version, the feature-schema hash, the training configuration and the commit.
"""

from __future__ import annotations

import json
import subprocess
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx.numpy_helper
import onnxruntime as ort
import torch

from policies import features, onnx_policy
from policies.residual import META_BASE, ResidualBase
from simulator.learning.environment import FUTURE_FEATURES
from simulator.learning.network import CLUSTER_INPUTS, NODE_INPUTS, POD_INPUTS, ActorCritic, Scorer

PARITY_TOLERANCE = 1e-5


class ExportError(RuntimeError):
    """The exported graph does not compute what the torch model computes."""


def export(
    model: ActorCritic, path: Path, config: Mapping[str, Any], base: ResidualBase | None = None
) -> float:
    """Write `path`; returns the max abs difference between torch and ONNX Runtime (CPU).
    `base`: a residual model's heuristic, recorded in the metadata for whoever serves it."""
    scorer = Scorer(model.cpu()).eval()
    nodes, pod, cluster = parity_batch(17)
    path.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        # The TorchScript exporter is deprecated in favour of torch.export, which needs
        # onnxscript; this small static graph exports the same either way.
        warnings.simplefilter("ignore", DeprecationWarning)
        _export(scorer, nodes, pod, cluster, path)
    graph = onnx.load(str(path))
    metadata = {
        onnx_policy.META_VERSION: str(onnx_policy.FORMAT_VERSION),
        onnx_policy.META_SCHEMA: features.SCHEMA_HASH,
        "kdrl.config": json.dumps(dict(config), sort_keys=True, default=str),
        "kdrl.commit": _commit(),
        "kdrl.hidden": str(model.hidden),
    }
    if base is not None:
        metadata[META_BASE] = base.to_json()
    onnx.helper.set_model_props(graph, metadata)
    onnx.save(graph, str(path))
    worst = 0.0
    for size in (1, 17, 1000):
        worst = max(worst, parity(scorer, path, *parity_batch(size)))
    if worst > PARITY_TOLERANCE:
        path.unlink(missing_ok=True)
        raise ExportError(f"ONNX Runtime differs from torch by {worst:.2e} > {PARITY_TOLERANCE:.0e}")
    return worst


def _export(scorer: Scorer, nodes: np.ndarray, pod: np.ndarray, cluster: np.ndarray, path: Path) -> None:
    torch.onnx.export(
        scorer,
        (torch.from_numpy(nodes), torch.from_numpy(pod), torch.from_numpy(cluster)),
        str(path),
        input_names=list(onnx_policy.INPUTS),
        output_names=[onnx_policy.OUTPUT],
        dynamic_axes={"nodes": {0: "node"}, "logits": {0: "node"}},
        opset_version=17,
        dynamo=False,
    )


def parity_batch(size: int, seed: int = 7) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A fixed batch of plausible inputs."""
    rng = np.random.default_rng([seed, size])
    return (
        rng.normal(0.5, 0.5, (size, len(features.NODE_FEATURES))).astype(np.float32),
        rng.normal(0.5, 0.5, len(features.POD_FEATURES)).astype(np.float32),
        rng.normal(0.5, 0.5, len(features.CLUSTER_FEATURES)).astype(np.float32),
    )


def parity(scorer: Scorer, path: Path, nodes: np.ndarray, pod: np.ndarray, cluster: np.ndarray) -> float:
    with torch.no_grad():
        expected = scorer(torch.from_numpy(nodes), torch.from_numpy(pod), torch.from_numpy(cluster)).numpy()
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (got,) = session.run(None, {"nodes": nodes, "pod": pod, "cluster": cluster})
    return float(np.max(np.abs(np.asarray(got) - expected)))


def _commit() -> str:
    try:
        found = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return found.stdout.strip() or "unknown"


def load_base(path: Path) -> ResidualBase | None:
    """The residual base a model file (ONNX or checkpoint) carries; None for a plain model."""
    if path.suffix == ".pt":
        text = torch.load(path, map_location="cpu", weights_only=False).get("base")
    else:
        text = {p.key: p.value for p in onnx.load(str(path)).metadata_props}.get(META_BASE)
    return ResidualBase.from_json(text) if text else None


def load(path: Path) -> ActorCritic:
    """The actor of a model file: a checkpoint (`model.pt`, as `kdrl train` writes it) or an
    exported ONNX file (the serving model), rebuilt from the graph's constants and refused
    unless it scores the parity batches as ONNX Runtime does. The critic of an ONNX file is
    not in it: it comes back freshly initialised."""
    if path.suffix == ".pt":
        checkpoint = torch.load(path, map_location="cpu", weights_only=False)
        settings = checkpoint["args"]
        future = len(FUTURE_FEATURES) if settings.get("critic_sees_future") else 0
        model = ActorCritic(int(settings["hidden"]), future=future)
        model.load_state_dict(checkpoint["model"])
        return model
    graph = onnx.load(str(path))
    metadata = {p.key: p.value for p in graph.metadata_props}
    model = ActorCritic(int(metadata.get("kdrl.hidden", "32")))
    constants = {i.name: onnx.numpy_helper.to_array(i) for i in graph.graph.initializer}
    _import(model, constants)
    scorer = Scorer(model).eval()
    worst = max(parity(scorer, path, *parity_batch(size)) for size in (1, 17, 1000))
    if worst > PARITY_TOLERANCE:
        raise ExportError(f"{path}: its graph does not import (ONNX Runtime differs by {worst:.2e})")
    return model


def _import(model: ActorCritic, constants: Mapping[str, np.ndarray]) -> None:
    """Named constants by name; those the exporter folded (normalisers' std, transposed
    weights, unsqueezed biases) by their shape, each shape being unique in this graph."""
    named = {k.removeprefix("model."): v for k, v in constants.items() if k.startswith("model.")}
    folded = {tuple(v.shape): v for k, v in constants.items() if not k.startswith("model.")}
    hidden, context = model.hidden, POD_INPUTS + CLUSTER_INPUTS
    state = model.state_dict()
    with torch.no_grad():
        for name, value in named.items():
            state[name].copy_(torch.from_numpy(np.array(value)).reshape(state[name].shape))
        for norm, size in (
            ("node_norm", NODE_INPUTS),
            ("pod_norm", POD_INPUTS),
            ("cluster_norm", CLUSTER_INPUTS),
        ):
            std = torch.from_numpy(np.array(folded[(size,)], dtype=np.float64))
            state[f"{norm}.var"].copy_((std**2 - 1e-8).float())
        state["context_in.weight"].copy_(torch.from_numpy(np.array(folded[(context, hidden)])).t())
        state["actor_pooled.weight"].copy_(torch.from_numpy(np.array(folded[(hidden, hidden)])).t())
        state["encoder.1.bias"].copy_(torch.from_numpy(np.array(folded[(1, hidden)])).reshape(hidden))
        state["actor_out.1.bias"].copy_(torch.from_numpy(np.array(folded[(1, 1)])).reshape(1))
    model.load_state_dict(state)
