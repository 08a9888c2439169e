"""Image pre-pull pods (pure): one short-lived pod per (node, image), pinned to the node.

The kubelet pulls a pod's images before it starts any container, so a pod that starts the
image and exits at once leaves the image in the node's cache. Distroless images have no shell
and often no binary we could name, so a first init container copies busybox's static binary
into a shared `emptyDir`; the target image then runs it as `true` (busybox dispatches on its
program name) and exits 0. The pod bypasses the scheduler (`nodeName`), tolerates every taint
(the node is chosen, not found), carries a deadline, and says in its labels and annotations
what it is for, so `kdrl cleanup` and the reconciler find it from the cluster alone.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from prewarm import rfc3339

NOOP_IMAGE = "busybox:1.37.0"  # statically linked: its binary runs in any image
PAUSE_RESOURCES = {"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": {"cpu": "100m", "memory": "64Mi"}}
MANAGED_BY = "app.kubernetes.io/managed-by"
PREPULL_LABEL = "kdrl.dev/prepull"
IMAGE_ANNOTATION = "kdrl.dev/image"
DEADLINE_S = 600  # a pull stuck longer (ImagePullBackOff, a huge image) is given up


@dataclass(frozen=True, slots=True)
class Target:
    node: str
    image: str


def pod_name(target: Target) -> str:
    """Stable per (node, image): creating it twice is a 409, not a second pull."""
    digest = hashlib.sha256(f"{target.node}\0{target.image}".encode()).hexdigest()[:12]
    return f"kdrl-prepull-{digest}"


def pod(target: Target, *, namespace: str, pull_secrets: tuple[str, ...] = ()) -> dict[str, Any]:
    mount = [{"name": "noop", "mountPath": "/kdrl"}]
    restricted = {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "readOnlyRootFilesystem": True,
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod_name(target),
            "namespace": namespace,
            "labels": {MANAGED_BY: "kdrl", PREPULL_LABEL: "true"},
            "annotations": {IMAGE_ANNOTATION: target.image, "kdrl.dev/node": target.node},
        },
        "spec": {
            "nodeName": target.node,
            "restartPolicy": "Never",
            "activeDeadlineSeconds": DEADLINE_S,
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "tolerations": [{"operator": "Exists"}],
            "imagePullSecrets": [{"name": name} for name in pull_secrets],
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": 65532,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "volumes": [{"name": "noop", "emptyDir": {"sizeLimit": "8Mi"}}],
            "initContainers": [
                {
                    "name": "noop",
                    "image": NOOP_IMAGE,
                    "command": ["cp", "/bin/busybox", "/kdrl/true"],
                    "volumeMounts": mount,
                    "resources": PAUSE_RESOURCES,
                    "securityContext": restricted,
                }
            ],
            "containers": [
                {
                    "name": "pull",
                    "image": target.image,
                    "imagePullPolicy": "IfNotPresent",
                    "command": ["/kdrl/true"],
                    "volumeMounts": mount,
                    "resources": PAUSE_RESOURCES,
                    "securityContext": restricted,
                }
            ],
        },
    }


def finished(obj: dict[str, Any], now: datetime) -> bool:
    """Done with: succeeded, failed (the kubelet's deadline included), a name that can never
    pull, or still failing to pull after the deadline (a registry hiccup gets its retries)."""
    return outcome(obj, now) is not None


def outcome(obj: dict[str, Any], now: datetime) -> str | None:
    """How a pre-pull pod ended: `succeeded`, `failed` (including a name that can never pull),
    `timed_out` (the kubelet's deadline, or still failing to pull after ours); None while it runs."""
    status = obj.get("status") or {}
    if status.get("phase") == "Succeeded":
        return "succeeded"
    if status.get("phase") == "Failed":
        return "timed_out" if status.get("reason") == "DeadlineExceeded" else "failed"
    waiting = {
        (c.get("state") or {}).get("waiting", {}).get("reason") for c in status.get("containerStatuses") or []
    }
    if "InvalidImageName" in waiting:
        return "failed"
    started = rfc3339.parse(status.get("startTime") or (obj.get("metadata") or {}).get("creationTimestamp"))
    overdue = started is not None and (now - started).total_seconds() > DEADLINE_S
    return "timed_out" if overdue and waiting & {"ErrImagePull", "ImagePullBackOff"} else None


def image_on_node(node: dict[str, Any], image: str) -> bool:
    """Node `status.images` confirms a pull (names include tags and digests)."""
    return any(
        image in (entry.get("names") or []) for entry in (node.get("status") or {}).get("images") or []
    )
