"""A mutating admission webhook: Knative pods go to the kdrl scheduler without authors asking.

The MutatingWebhookConfiguration (knative/overlays/webhook) sends pod creations from namespaces labelled
`kdrl.dev/enabled: "true"` here; a pod of a Knative Service that names no scheduler (or the
default one) gets `spec.schedulerName: kdrl-scheduler` through a JSON patch. Everything else is
allowed unchanged: the webhook never refuses a pod (and its `failurePolicy` is Ignore).
AdmissionReview `admission.k8s.io/v1`: the response echoes the request's `uid`.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from typing import Any

from plugin.convert import SCHEDULER_NAME, SERVICE_LABEL
from plugin.errors import BadRequest

DEFAULT_SCHEDULER = "default-scheduler"


def review(body: Any) -> dict[str, Any]:
    """The AdmissionReview answering `body`; BadRequest when it is not one."""
    request = body.get("request") if isinstance(body, Mapping) else None
    if (
        not isinstance(body, Mapping)
        or body.get("kind") != "AdmissionReview"
        or not isinstance(request, Mapping)
        or not isinstance(request.get("uid"), str)
        or not request["uid"]
    ):
        raise BadRequest("expected an admission.k8s.io/v1 AdmissionReview with request.uid")
    response: dict[str, Any] = {"uid": request["uid"], "allowed": True}
    patch = _patch(request.get("object"))
    if patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(json.dumps(patch).encode()).decode()
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}


def _patch(pod: Any) -> list[dict[str, str]]:
    if not isinstance(pod, Mapping) or pod.get("kind") != "Pod":
        return []
    metadata = pod.get("metadata") or {}
    labels = (metadata.get("labels") or {}) if isinstance(metadata, Mapping) else {}
    spec = pod.get("spec") or {}
    if not isinstance(labels, Mapping) or SERVICE_LABEL not in labels or not isinstance(spec, Mapping):
        return []  # not a Knative Service's pod
    current = spec.get("schedulerName")
    if current not in (None, "", DEFAULT_SCHEDULER):
        return []  # the author chose a scheduler: theirs wins
    return [{"op": "add", "path": "/spec/schedulerName", "value": SCHEDULER_NAME}]
