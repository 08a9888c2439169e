"""The learned placement policy, served with ONNX Runtime (CUDA when it really works, else CPU).

`load` returns a `LoadedPolicy`: the policy, the execution provider in use, and, when the model
is missing, corrupt, built for another feature schema or fails a probe inference (inputs or
outputs that do not match), `kube-default` in its place with the reason (`degraded`), so the
extender keeps serving and says why in `/readyz` and its spans. A request the model fails on
later is scored by kube-default, that request only. A residual model (`policies/residual.py`)
names its heuristic base in its metadata; its logits are the graph's plus the base's.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort

from policies import features, heuristics, residual
from policies.placement import PlacementPolicy
from policies.residual import META_BASE, ResidualBase
from policies.types import FloatArray, Node, NodeTable, PodRequest

log = logging.getLogger(__name__)

MODELS = Path(__file__).resolve().parent / "models"
DEFAULT_MODEL = MODELS / "placement.onnx"
INPUTS = ("nodes", "pod", "cluster")
OUTPUT = "logits"
FORMAT_VERSION = 1
META_VERSION = "kdrl.format"
META_SCHEMA = "kdrl.feature_schema"
CUDA, CPU = "CUDAExecutionProvider", "CPUExecutionProvider"


class ModelError(ValueError):
    """A model file that cannot serve: missing, unreadable, or for another feature schema."""


class OnnxPolicy:
    """Scores nodes with the exported actor: one logit per candidate node."""

    name = "onnx"

    def __init__(
        self, session: ort.InferenceSession, metadata: dict[str, str], base: ResidualBase | None = None
    ) -> None:
        self.session, self.metadata = session, metadata
        self.base = base  # a residual model's heuristic: its logits are added to the graph's
        self.provider: str = session.get_providers()[0]
        self._stand_in = heuristics.kube_default()  # for a request the model fails on
        self.failures = 0  # requests scored by the stand-in
        self.model_hash = ""  # of the file it was opened from

    @classmethod
    def open(cls, path: Path, *, device: str = "auto", threads: int = 1) -> OnnxPolicy:
        """`device`: auto (CUDA if it works), cuda (the same, but say so when it does not), cpu."""
        if not path.is_file():
            raise ModelError(f"{path}: no such model file")
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.log_severity_level = 3  # CUDA probing failures are reported by us, once
        wanted = (
            [CUDA, CPU] if device in ("auto", "cuda") and CUDA in ort.get_available_providers() else [CPU]
        )
        ort.set_default_logger_severity(4)  # a CUDA probe that fails is reported below, once
        try:
            data = path.read_bytes()  # once: the hash names exactly the bytes that serve
            session = ort.InferenceSession(data, sess_options=options, providers=wanted)
        except Exception as error:  # onnxruntime raises its own exception types for bad files
            raise ModelError(f"{path}: not a loadable ONNX model ({error})") from error
        finally:
            ort.set_default_logger_severity(2)
        metadata = dict(session.get_modelmeta().custom_metadata_map)
        if metadata.get(META_VERSION) != str(FORMAT_VERSION):
            raise ModelError(
                f"{path}: model format {metadata.get(META_VERSION)!r}, expected {FORMAT_VERSION}"
            )
        if metadata.get(META_SCHEMA) != features.SCHEMA_HASH:
            raise ModelError(
                f"{path}: feature schema {metadata.get(META_SCHEMA)!r} does not match this build's "
                f"{features.SCHEMA_HASH} (retrain or use the model shipped with this version)"
            )
        names = tuple(i.name for i in session.get_inputs())
        if names != INPUTS:
            raise ModelError(f"{path}: inputs {names}, expected {INPUTS}")
        outputs = tuple(o.name for o in session.get_outputs())
        if OUTPUT not in outputs:
            raise ModelError(f"{path}: outputs {outputs}, expected {OUTPUT!r}")
        base = None
        if META_BASE in metadata:
            try:
                base = ResidualBase.from_json(metadata[META_BASE])
            except ValueError as error:
                raise ModelError(f"{path}: {error}") from error
        policy = cls(session, metadata, base)
        policy.model_hash = content_hash(data)
        policy.probe(path)
        if CUDA in wanted and policy.provider != CUDA:
            log.log(
                logging.WARNING if device == "cuda" else logging.INFO,
                "the CUDA execution provider did not start (no GPU or CUDA libraries); running on %s",
                policy.provider,
            )
        return policy

    def probe(self, path: Path) -> None:
        """One inference on a made-up pod and three nodes: a model whose shapes or types do
        not match the schema fails here, at load, not on the first pod."""
        nodes = NodeTable.from_nodes(
            [Node(name=f"probe-{i}", cpu_allocatable=4000, memory_allocatable=16 << 30) for i in range(3)]
        )
        pod = PodRequest(namespace="kdrl-probe", name="probe", cpu_milli=250, memory_bytes=256 << 20)
        try:
            self._logits(pod, nodes)  # raises on a wrong shape too
        except Exception as error:  # onnxruntime's own exception types
            raise ModelError(f"{path}: inference fails on a probe pod ({error})") from error

    def score(self, pod: PodRequest, nodes: NodeTable) -> FloatArray:
        if len(nodes) == 0:
            return np.zeros(0)
        try:
            logits = self._logits(pod, nodes)
        except Exception as error:  # this request is scored by kube-default; the next tries again
            self.failures += 1
            log.warning("ONNX inference failed for %s (%s); kube-default scores it", pod.key, error)
            return self._stand_in.score(pod, nodes)
        if np.isfinite(logits).all():  # the usual case: no copy
            return logits
        return np.nan_to_num(logits, nan=-1e9, posinf=1e9, neginf=-1e9)

    def _logits(self, pod: PodRequest, nodes: NodeTable) -> FloatArray:
        base = rows = None
        if self.base is not None:  # a residual model: its base, and the rows it scores
            base = self.base.logits(pod, nodes)
            rows = self.base.shortlist(base)
        observation = features.encode(pod, nodes, rows=rows)
        (logits,) = self.session.run(
            [OUTPUT], {"nodes": observation.nodes, "pod": observation.pod, "cluster": observation.cluster}
        )
        scored = len(nodes) if rows is None else len(rows)
        if np.shape(logits) != (scored,):  # before the base, whose shape would hide it
            raise ValueError(
                f"{OUTPUT} has shape {np.shape(logits)} for {scored} nodes, expected ({scored},)"
            )
        if base is None:
            return np.asarray(logits, dtype=np.float64)
        if rows is not None:
            return residual.with_residual(base, rows, np.asarray(logits))
        # float32 as in training, where the base travels in float32 tensors
        summed = np.asarray(logits, dtype=np.float32) + base.astype(np.float32)
        return summed.astype(np.float64)


@dataclass(frozen=True, slots=True)
class LoadedPolicy:
    policy: PlacementPolicy
    provider: str  # the execution provider, or "none" when the heuristic stands in
    degraded: str = ""  # why the chosen policy is not serving; empty when it is
    model: str = ""  # the hash of the file it serves (`file_hash`); empty for a policy of none

    def describe(self) -> dict[str, str]:
        return {
            "policy": self.policy.name,
            "provider": self.provider,
            "degraded": self.degraded,
            "model": self.model,
        }

    @classmethod
    def kube_default_instead(cls, wanted: str, reason: str) -> LoadedPolicy:
        """kube-default standing in for a policy whose file cannot serve, loudly."""
        log.error("placement policy %s unavailable, falling back to kube-default: %s", wanted, reason)
        return cls(policy=heuristics.kube_default(), provider="none", degraded=reason)


def load(path: Path = DEFAULT_MODEL, *, device: str = "auto", threads: int = 1) -> LoadedPolicy:
    """The learned policy, or `kube-default` with the reason when the model cannot serve."""
    try:
        policy = OnnxPolicy.open(path, device=device, threads=threads)
    except ModelError as error:
        return LoadedPolicy.kube_default_instead("onnx", str(error))
    log.info("learned placement policy %s (%s) on %s", path.name, policy.model_hash, policy.provider)
    return LoadedPolicy(policy=policy, provider=policy.provider, model=policy.model_hash)


def content_hash(data: bytes) -> str:
    """The first 12 hex digits of the SHA-256 of a model's bytes: which model served a decision."""
    return hashlib.sha256(data).hexdigest()[:12]
