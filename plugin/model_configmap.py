"""The serving model in a ConfigMap that every replica mounts (knative/closed-loop): what
`kdrl loop` publishes when the gate passes and `kdrl rollback --configmap` restores.

Two keys of `binaryData`: the model that serves and the one it replaced. Each change is one
replace guarded by the ConfigMap's resourceVersion, so two writers never interleave; the
kubelet then swaps the mounted file and each replica's reloader serves it
(`KDRL_MODEL_RELOAD_S`).
"""

from __future__ import annotations

import base64
from collections.abc import Callable

from kubernetes.aio import client

from plugin import kube
from plugin.errors import KubeApiError

MODEL_KEY = "placement.onnx"
PREVIOUS_KEY = "placement.onnx.previous"
TIMEOUT_S = 10.0


def where(text: str) -> tuple[str, str]:
    """NAMESPACE/NAME, or NAME in the plugin's namespace."""
    namespace, _, name = text.rpartition("/")
    return namespace or kube.PLUGIN_NAMESPACE, name


async def current(api: client.ApiClient, namespace: str, name: str) -> bytes | None:
    """The model that serves now, None when the ConfigMap holds none yet."""
    obj = await kube.get_configmap(api, namespace=namespace, name=name, timeout_s=TIMEOUT_S)
    encoded = (obj.get("binaryData") or {}).get(MODEL_KEY)
    return None if encoded is None else base64.b64decode(encoded)


async def publish(api: client.ApiClient, namespace: str, name: str, model: bytes) -> None:
    """`model` serves; the one it replaces is kept as the previous."""
    await _change(api, namespace, name, lambda data: {PREVIOUS_KEY: data.get(MODEL_KEY), MODEL_KEY: model})


async def roll_back(api: client.ApiClient, namespace: str, name: str) -> None:
    """The previous model serves again; the one it replaces becomes the previous (a second
    rollback undoes the first)."""

    def swapped(data: Keys) -> Keys:
        if data.get(PREVIOUS_KEY) is None:
            raise KubeApiError(f"configmap {namespace}/{name} holds no previous model to restore")
        return {MODEL_KEY: data[PREVIOUS_KEY], PREVIOUS_KEY: data.get(MODEL_KEY)}

    await _change(api, namespace, name, swapped)


Keys = dict[str, bytes | None]


async def _change(api: client.ApiClient, namespace: str, name: str, change: Callable[[Keys], Keys]) -> None:
    obj = await kube.get_configmap(api, namespace=namespace, name=name, timeout_s=TIMEOUT_S)
    encoded = obj.get("binaryData") or {}
    data: Keys = {key: base64.b64decode(value) for key, value in encoded.items()}
    updated = change(data)
    binary = {key: base64.b64encode(value).decode() for key, value in updated.items() if value is not None}
    body = {**obj, "binaryData": {**{k: v for k, v in encoded.items() if k not in updated}, **binary}}
    await kube.replace_configmap(api, body=body, timeout_s=TIMEOUT_S)
