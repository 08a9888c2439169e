"""From trace rows to Knative Services: the one table of how each function is made up.

Each rule is what an operator or a function author would configure; docs/simulator-fidelity.md
holds the simulator's parts against their published ranges.

| attribute | rule (seeded by the run seed and the function id) | why |
| --- | --- | --- |
| service | `default/<func_id lower-cased>`, one routed revision `-00001` | trace rows are functions |
| memory request | the row's median allocated memory (`AverageAllocatedMb_pct50`), rounded up to 64 MiB | Azure reports allocated memory per app |
| CPU request | 1 vCPU per 1,769 MB of memory, clamped to 100m..4000m, in 50m steps | AWS Lambda's documented memory/CPU ratio |
| duration | per request, inverse-CDF draw over duration percentiles (0,1,25,50,75,99,100); the duration rows of a population are re-paired with its functions by rank, the busiest function getting the row whose `Count` (its source's invocations) is highest | durations are marginals not matched to rows (trace caveat 2); rank pairing restores the trace's rate-duration relation instead of pairing a busy function with a batch job's minutes |
| image | 30 % of functions share one of 12 runtime base images, the rest have their own; size lognormal, median 400 MiB, sigma 0.8, clamped 50 MiB..4 GiB (GPU functions: their own image, median 4 GiB, sigma 0.4, clamped 1.5..10 GiB) | most images are built on a few popular bases (AWS Lambda's container loading, USENIX ATC'23: ~75 % of images hold < 5 % unique bytes); function images with a language runtime and dependencies are hundreds of MiB (Lambda's zip limit is 250 MB unpacked, its image limit 10 GiB); CUDA and framework layers make inference images several GiB |
| GPU | 2 % of functions, drawn among those whose busiest minute one GPU pool can serve: peak concurrency (peak per-second rate x median duration) at most `max-scale` x target x 70 % | an operator gives a GPU to an inference service sized for it, not to a function that takes thousands of requests a minute one at a time |
| concurrency target / max-scale | GPU functions: target 8 (`autoscaling.knative.dev/target`, a batched inference server) and `max-scale` 4; others: Knative's default target 100 and no max-scale; target utilization 70 % | inference servers batch requests per GPU and are capped so they cannot take the whole GPU pool (protocols.md §3.4 for the defaults) |
| priority | critical 5 %, high 15 %, normal 50 %, low 20 %, batch 10 % | a seeded draw: the trace carries no priorities |
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
IMAGE_MEDIAN_MIB, IMAGE_SIGMA = 400.0, 0.8
IMAGE_MIN_MIB, IMAGE_MAX_MIB = 50.0, 4096.0
GPU_IMAGE_MEDIAN_MIB, GPU_IMAGE_SIGMA = 4096.0, 0.4
GPU_IMAGE_MIN_MIB, GPU_IMAGE_MAX_MIB = 1536.0, 10240.0
GPU_SHARE = 0.02
GPU_TARGET = 8.0  # concurrent requests one batched inference pod takes
GPU_MAX_SCALE = 4
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
    max_scale: int = 0  # autoscaling.knative.dev/max-scale; 0: unbounded (Knative's default)


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
    duration_ms = _paired_durations(trace)
    gpu_fits = peak_concurrency(trace.counts, duration_ms) <= GPU_MAX_SCALE * GPU_TARGET * TARGET_UTILIZATION
    functions = []
    for row, func_id in enumerate(trace.func_ids):
        own = np.random.default_rng([seed, zlib.crc32(func_id.encode())])
        memory_mb = float(trace.memory_mb[row, 3])
        memory = int(np.ceil(max(memory_mb, 64.0) / 64.0)) * 64 * MiB
        cpu = int(np.clip(round(memory_mb / LAMBDA_MB_PER_VCPU * 1000 / 50) * 50, 100, 4000))
        gpu = int(own.random() < GPU_SHARE and bool(gpu_fits[row]))
        shares_base = own.random() < SHARED_IMAGE_SHARE
        name = func_id.lower()
        if gpu:
            image, size = f"registry.example.com/inference/{name}:1.0", _gpu_image_size(own)
        elif shares_base:
            base = int(own.integers(SHARED_BASE_IMAGES))
            image, size = f"registry.example.com/runtimes/base-{base:02d}:1.0", shared[base]
        else:
            image, size = f"registry.example.com/functions/{name}:1.0", _image_size(own)
        functions.append(
            FunctionSpec(
                service=f"default/{name}",
                revision=f"{name}-00001",
                image=image,
                image_bytes=size,
                cpu_milli=cpu,
                memory_bytes=memory,
                gpu=gpu,
                concurrency_target=GPU_TARGET if gpu else KNATIVE_DEFAULT_TARGET,
                priority=_priority(own.random()),
                max_scale=GPU_MAX_SCALE if gpu else 0,
            )
        )
    return Workload(functions=tuple(functions), duration_ms=duration_ms)


def peak_concurrency(
    counts: npt.NDArray[np.int64], duration_ms: npt.NDArray[np.float64]
) -> npt.NDArray[np.float64]:
    """Per function, requests in flight in its busiest minute (Little's law at the median duration)."""
    if counts.shape[1] == 0:
        return np.zeros(counts.shape[0])
    median_s = duration_ms[:, DURATION_LEVELS.index(0.50)] / 1000.0
    peak: npt.NDArray[np.float64] = counts.max(axis=1) / 60.0 * median_s
    return peak


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


def _gpu_image_size(rng: np.random.Generator) -> int:
    mib = float(
        np.clip(
            rng.lognormal(np.log(GPU_IMAGE_MEDIAN_MIB), GPU_IMAGE_SIGMA), GPU_IMAGE_MIN_MIB, GPU_IMAGE_MAX_MIB
        )
    )
    return int(mib * MiB)


def _priority(u: float) -> Priority:
    cumulative = 0.0
    for priority, share in PRIORITY_SHARES:
        cumulative += share
        if u < cumulative:
            return priority
    return Priority.BATCH
