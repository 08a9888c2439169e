"""`kdrl cleanup` and the Serving version gate: undo every change, from the objects themselves.

Cleanup deletes the plugin's pre-pull pods (by their label), lists every Revision, restores
those that carry the plugin's records (`prewarm.actuation`), and needs nothing the plugin kept
in memory or on disk, so it works after the plugin is gone. Revisions a human edited meanwhile
are reported and left alone.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field

from kubernetes.aio.client import ApiClient

from plugin import kube
from plugin.errors import KubeApiError
from plugin.prewarming import RevisionActuator
from prewarm import actuation, prepull

logger = logging.getLogger(__name__)
MIN_SERVING = (1, 21)  # min-scale on a Revision syncs to its PodAutoscaler in place from here


@dataclass
class CleanupReport:
    restored: list[str] = field(default_factory=list)
    left: list[str] = field(default_factory=list)  # with why
    deleted_pods: list[str] = field(default_factory=list)  # pre-pull pods


async def cleanup(
    api: ApiClient, *, timeout_s: float, namespace: str = kube.PLUGIN_NAMESPACE
) -> CleanupReport:
    """Restore every revision the plugin changed and delete its pre-pull pods in `namespace`."""
    report = CleanupReport()
    selector = f"{prepull.PREPULL_LABEL}=true"
    pods, _ = await kube.list_objects(kube.labelled_pods(api, namespace, selector), timeout_s=timeout_s)
    for pod in pods:
        name = pod["metadata"]["name"]
        await kube.delete_pod(api, namespace=namespace, name=name, timeout_s=timeout_s)
        report.deleted_pods.append(f"{namespace}/{name}")
    items, _ = await kube.list_objects(kube.revisions(api), timeout_s=timeout_s)
    actuator = RevisionActuator(api, timeout_s=timeout_s, shadow=False)
    for revision in items:
        meta = revision.get("metadata") or {}
        if actuation.APPLIED not in (meta.get("annotations") or {}):
            continue
        result = await actuator.restore_revision(meta.get("namespace", ""), meta.get("name", ""))
        (report.restored if result.patched else report.left).append(
            result.revision if result.patched else f"{result.revision}: {result.reason}"
        )
    return report


def parse_version(text: str) -> tuple[int, int] | None:
    found = re.match(r"v?(\d+)\.(\d+)", text.strip())
    return (int(found.group(1)), int(found.group(2))) if found else None


async def serving_supports_revision_min_scale(api: ApiClient, *, timeout_s: float) -> tuple[bool, str]:
    """Whether actuation may run (Serving >= 1.21), and what was found, for the log."""
    try:
        text = await kube.serving_version(api, timeout_s=timeout_s)
    except KubeApiError as error:
        return False, f"Knative Serving's version is unknown ({error}): shadow mode"
    version = parse_version(text)
    if version is None:
        return False, f"Knative Serving's version label {text!r} is unreadable: shadow mode"
    if version < MIN_SERVING:
        return (
            False,
            f"Knative Serving {text} is older than 1.21 (min-scale would roll out revisions): shadow mode",
        )
    return True, f"Knative Serving {text}"
