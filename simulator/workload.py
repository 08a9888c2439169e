"""From trace rows to Knative Services: the one table of how each function is made up.

| attribute | rule (seeded by the run seed and the function id) | why |
| --- | --- | --- |
| service | `default/<func_id lower-cased>`, one routed revision `-00001` | trace rows are functions |
| memory request | the row's median allocated memory (`AverageAllocatedMb_pct50`), rounded up to 64 MiB | Azure reports allocated memory per app |
| CPU request | 1 vCPU per 1,769 MB of memory, clamped to 100m..4000m, in 50m steps | AWS Lambda's documented memory/CPU ratio |
| duration | per request, inverse-CDF draw over duration percentiles (0,1,25,50,75,99,100); the duration rows of a population are re-paired with its functions by rank, the busiest function getting the row whose `Count` (its source's invocations) is highest | durations are marginals not matched to rows (trace caveat 2); rank pairing restores the trace's rate-duration relation instead of pairing a busy function with a batch job's minutes |
| image | 30 % of functions share one of 12 runtime base images, the rest have their own; size lognormal, median 250 MiB, sigma 0.9, clamped 20 MiB..3 GiB | registry images of function runtimes; a 321 MB image is the nerdctl stargz example |
| concurrency target | 1 for GPU functions (one request per GPU), Knative's default 100 otherwise; target utilization 70 % | `container-concurrency-target-default` and `-percentage` (protocols.md §3.4) |
| priority | critical 5 %, high 15 %, normal 50 %, low 20 %, batch 10 % | a seeded draw: the trace carries no priorities |
| GPU | 2 % of functions request one `nvidia.com/gpu` (and tolerate the GPU taint) | a small GPU share, to exercise GPU placement and the tainted GPU pool |
| min-scale / initial-scale | 0 / 1 (initial-scale applies when a run starts with freshly created revisions) | Knative defaults (protocols.md §3.4) |
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from policies.types import Priority
from simulator.traces import DURATION_LEVELS, Trace

MiB = 1024 * 1024
LAMBDA_MB_PER_VCPU = 1769
SHARED_BASE_IMAGES = 12
SHARED_IMAGE_SHARE = 0.30
IMAGE_MEDIAN_MIB, IMAGE_SIGMA = 250.0, 0.9
IMAGE_MIN_MIB, IMAGE_MAX_MIB = 20.0, 3072.0
GPU_SHARE = 0.02
KNATIVE_DEFAULT_TARGET = 100.0  # container-concurrency-target-default
PRIORITY_SHARES = (
    (Priority.CRITICAL, 0.05),
    (Priority.HIGH, 0.15),
    (Priority.NORMAL, 0.50),
    (Priority.LOW, 0.20),
    (Priority.BATCH, 0.10),
)
TARGET_UTILIZATION = 0.70  # container-concurrency-target-percentage default


@dataclass(frozen=True, slots=True)
class FunctionSpec:
    service: str  # namespace/name
    revision: str
    image: str
    image_bytes: int
    cpu_milli: int
    memory_bytes: int
    gpu: int
    concurrency_target: float
    priority: Priority
    initial_scale: int = 1  # pods a new revision starts with (Knative's initial-scale default)


@dataclass(frozen=True)
class Workload:
    """The functions of a run and how to draw their request durations."""

    functions: tuple[FunctionSpec, ...]
    duration_ms: npt.NDArray[np.float64]  # (functions, 7) percentiles at DURATION_LEVELS

    def draw_durations_s(
        self, rng: np.random.Generator, function: npt.NDArray[np.int64]
    ) -> npt.NDArray[np.float64]:
        """One duration (seconds) per entry of `function`, by inverse CDF over its percentiles."""
        u = rng.random(function.size)
        rows = self.duration_ms[function]
        levels = np.asarray(DURATION_LEVELS)
        upper = np.clip(np.searchsorted(levels, u, side="right"), 1, len(levels) - 1)
        lo_level, hi_level = levels[upper - 1], levels[upper]
        take = np.arange(function.size)
        lo, hi = rows[take, upper - 1], rows[take, upper]
        fraction = (u - lo_level) / (hi_level - lo_level)
        durations: npt.NDArray[np.float64] = np.maximum((lo + fraction * (hi - lo)) / 1000.0, 0.001)
        return durations


def build(trace: Trace, *, seed: int) -> Workload:
    """A Knative Service per trace row, following the table in the module docstring."""
    rng = np.random.default_rng(seed)
    shared = [_image_size(rng) for _ in range(SHARED_BASE_IMAGES)]
    functions = []
    for row, func_id in enumerate(trace.func_ids):
        own = np.random.default_rng([seed, zlib.crc32(func_id.encode())])
        memory_mb = float(trace.memory_mb[row, 3])
        memory = int(np.ceil(max(memory_mb, 64.0) / 64.0)) * 64 * MiB
        cpu = int(np.clip(round(memory_mb / LAMBDA_MB_PER_VCPU * 1000 / 50) * 50, 100, 4000))
        gpu = int(own.random() < GPU_SHARE)
        if own.random() < SHARED_IMAGE_SHARE:
            base = int(own.integers(SHARED_BASE_IMAGES))
            image, size = f"registry.example.com/runtimes/base-{base:02d}:1.0", shared[base]
        else:
            image, size = f"registry.example.com/functions/{func_id.lower()}:1.0", _image_size(own)
        name = func_id.lower()
        functions.append(
            FunctionSpec(
                service=f"default/{name}",
                revision=f"{name}-00001",
                image=image,
                image_bytes=size,
                cpu_milli=cpu,
                memory_bytes=memory,
                gpu=gpu,
                concurrency_target=1.0 if gpu else KNATIVE_DEFAULT_TARGET,
                priority=_priority(own.random()),
            )
        )
    return Workload(functions=tuple(functions), duration_ms=_paired_durations(trace))


def _paired_durations(trace: Trace) -> npt.NDArray[np.float64]:
    """Duration rows re-paired with functions by rank within each population (see the table)."""
    paired = np.empty_like(trace.duration_ms)
    volume = trace.counts.sum(axis=1)
    populations = np.asarray(trace.populations)
    for population in np.unique(populations):
        members = np.flatnonzero(populations == population)
        by_volume = members[np.argsort(volume[members], kind="stable")]
        by_count = members[np.argsort(trace.duration_count[members], kind="stable")]
        paired[by_volume] = trace.duration_ms[by_count]
    return paired


def _image_size(rng: np.random.Generator) -> int:
    mib = float(np.clip(rng.lognormal(np.log(IMAGE_MEDIAN_MIB), IMAGE_SIGMA), IMAGE_MIN_MIB, IMAGE_MAX_MIB))
    return int(mib * MiB)


def _priority(u: float) -> Priority:
    cumulative = 0.0
    for priority, share in PRIORITY_SHARES:
        cumulative += share
        if u < cumulative:
            return priority
    return Priority.BATCH
