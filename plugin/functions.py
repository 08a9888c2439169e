"""What the planner knows of each function, from the Knative Services the plugin watches.

A Service's revision template says what its next pod requests (the same conversion as for
pods), its priority (`kdrl.dev/priority`), whether its author opted out of prewarming
(`kdrl.dev/prewarm: "false"`; a value other than true or false is logged once per function
and read as the default, true), its own `min-scale` and its `max-scale`. The observed
cold starts (pod creation to Ready, from the ApiServerSource events) replace the default
estimate once there are some.

Images come from Knative's own image cache objects (`images.caching.internal.knative.dev`,
one per container of each revision, named `<revision>-cache-<container>`): they carry the
image as Knative resolved it, by digest, which is what a node reports once it holds it. Upstream
nothing acts on them; here they name what the planner's pre-pulls fetch for the routed revision.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from plugin import convert
from plugin.errors import ObjectError
from policies.types import PodRequest
from prewarm.actuation import author_min_scale
from prewarm.planning import FunctionState, cold_start_estimate

logger = logging.getLogger(__name__)
Obj = Mapping[str, Any]

PREWARM_ANNOTATION = "kdrl.dev/prewarm"
MAX_SCALE_ANNOTATION = "autoscaling.knative.dev/max-scale"


def function_state(
    service: Obj,
    observed_cold_starts_s: Sequence[float] = (),
    cached_images: Mapping[str, str] | None = None,
) -> FunctionState | None:
    """The planner's view of one Knative Service, or None when its template is unusable.

    `cached_images`: Knative image cache objects by name (`<revision>-cache-<container>`) to
    image; the routed revision's replace the template's images where present."""
    meta = service.get("metadata") or {}
    namespace, name = meta.get("namespace") or "default", meta.get("name")
    template = (service.get("spec") or {}).get("template") or {}
    template_meta = template.get("metadata") or {}
    annotations = {**(meta.get("annotations") or {}), **(template_meta.get("annotations") or {})}
    if not isinstance(name, str):
        return None
    function = f"{namespace}/{name}"
    pod_object = {
        "metadata": {
            "namespace": namespace,
            "name": f"{name}-next",
            "labels": {convert.SERVICE_LABEL: name},
            "annotations": annotations,
        },
        "spec": template.get("spec") or {},
    }
    try:
        pod = convert.pod_request(pod_object)
    except ObjectError as error:
        logger.warning("service %s: unusable template (%s); not prewarmed", function, error)
        return None
    spec = template.get("spec") or {}
    pod = _resolved(pod, service, spec, cached_images or {})
    return FunctionState(
        function=function,
        priority=pod.priority,
        memory_bytes=pod.memory_bytes_nonzero,
        cold_start_s=cold_start_estimate(observed_cold_starts_s),
        pod=pod,
        prewarm_allowed=prewarm_allowed(function, annotations),
        author_min_scale=author_min_scale(annotations),
        max_scale=_max_scale(annotations),
    )


_warned_prewarm: set[tuple[str, str]] = set()  # (function, value): each unknown value logged once


def prewarm_allowed(function: str, annotations: Mapping[str, str]) -> bool:
    """`kdrl.dev/prewarm`: "false" opts out, "true" or absent opts in; anything else is the
    default (in), with one warning per function and value, since the author meant something."""
    value = str(annotations.get(PREWARM_ANNOTATION, "true")).strip().lower()
    if value not in ("true", "false") and (function, value) not in _warned_prewarm:
        _warned_prewarm.add((function, value))
        logger.warning(
            "service %s: %s=%r is neither true nor false; prewarming stays allowed",
            function,
            PREWARM_ANNOTATION,
            value,
        )
    return value != "false"


def routed_revisions(service: Obj) -> list[str]:
    """Revisions that take traffic: `status.traffic` entries with a share above 0."""
    traffic = (service.get("status") or {}).get("traffic") or []
    names = [t.get("revisionName") for t in traffic if (t.get("percent") or 0) > 0 and t.get("revisionName")]
    return list(dict.fromkeys(str(n) for n in names))


def _resolved(pod: PodRequest, service: Obj, spec: Obj, cached: Mapping[str, str]) -> PodRequest:
    """The pod with its images as Knative resolved them for the first routed revision."""
    routed = routed_revisions(service)
    containers = spec.get("containers") or []
    if not routed or not isinstance(containers, list):
        return pod
    names = [(c.get("name") or "user-container") if isinstance(c, Mapping) else "" for c in containers]
    digests = [cached.get(f"{routed[0]}-cache-{name}") for name in names]
    if not all(digests) or len(digests) != len(pod.images):
        return pod  # not cached (yet), or init containers in the way: keep the template's
    return dataclasses.replace(pod, images=tuple(convert.normalize_image(str(d)) for d in digests))


LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"


def service_essentials(service: Obj) -> Obj:
    """What the planner reads of a Service. Like client-go's informer transforms, the rest is
    dropped on arrival: managedFields and kubectl's last-applied copy are most of an object, and
    at `KDRL_MAX_FUNCTIONS` Services they would be most of the plugin's memory."""
    meta = service.get("metadata") or {}
    annotations = {k: v for k, v in (meta.get("annotations") or {}).items() if k != LAST_APPLIED}
    name, namespace = meta.get("name"), meta.get("namespace")
    return {
        "metadata": {"namespace": namespace, "name": name, "annotations": annotations},
        "spec": {"template": (service.get("spec") or {}).get("template")},
        "status": {"traffic": (service.get("status") or {}).get("traffic")},
    }


def image_essentials(image: Obj) -> Obj:
    """What the planner reads of a Knative image cache object: its name and image."""
    meta = image.get("metadata") or {}
    return {
        "metadata": {"namespace": meta.get("namespace"), "name": meta.get("name")},
        "spec": {"image": (image.get("spec") or {}).get("image")},
    }


class Objects:
    """Objects of one kind by `namespace/name`, kept by an informer (`informer.Handler`), each
    reduced by `essentials` as it arrives."""

    def __init__(self, essentials: Callable[[Obj], Obj] = lambda obj: obj) -> None:
        self.items: dict[str, Obj] = {}
        self.essentials = essentials

    def replace(self, items: list[dict[str, Any]]) -> None:
        self.items = {convert.object_key(o): self.essentials(o) for o in items}

    def apply(self, type_: str, obj: dict[str, Any]) -> None:
        if type_ == "DELETED":
            self.items.pop(convert.object_key(obj), None)
        else:
            self.items[convert.object_key(obj)] = self.essentials(obj)

    def live(self, live: bool) -> None:
        """The last view holds while the API server is away."""


class FunctionCatalog:
    """Knative Services and Knative's image cache objects, as the planner's function states."""

    def __init__(self, observed: Callable[[str], Sequence[float]] = lambda _: ()) -> None:
        self.services, self.images = Objects(service_essentials), Objects(image_essentials)
        self.observed = observed  # observed cold starts per function, seconds

    def snapshot(self) -> Callable[[], dict[str, FunctionState]]:
        """What `states` needs, copied now (on the event loop, where the informers write), as a
        computation that may then run on any thread."""
        services, images = dict(self.services.items), dict(self.images.items)
        observed = {function: list(self.observed(function)) for function in services}
        return lambda: function_states(services, images, observed)

    def states(self) -> dict[str, FunctionState]:
        return self.snapshot()()


def function_states(
    services: Mapping[str, Obj], images: Mapping[str, Obj], observed: Mapping[str, Sequence[float]]
) -> dict[str, FunctionState]:
    """Every Service's state, with its namespace's image cache objects."""
    cached: dict[str, dict[str, str]] = {}  # namespace -> image object name -> image
    for key, image in images.items():
        namespace, _, name = key.partition("/")
        cached.setdefault(namespace, {})[name] = str((image.get("spec") or {}).get("image") or "")
    out = {}
    for function, service in services.items():
        namespace = function.partition("/")[0]
        state = function_state(service, observed.get(function, ()), cached.get(namespace, {}))
        if state is not None:
            out[function] = state
    return out


def _max_scale(annotations: Mapping[str, Any]) -> int:
    """The template's max-scale (0, Knative's default "no limit", when absent or unreadable)."""
    try:
        return max(int(str(annotations.get(MAX_SCALE_ANNOTATION, "0")).strip() or "0"), 0)
    except ValueError:
        return 0
