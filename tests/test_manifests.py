"""The install manifests: they parse, kustomize lists them all, and RBAC grants exactly the
calls the code registers (`plugin/kube.py` `API_CALLS`), no more and no less."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from plugin import kube

KNATIVE = Path(__file__).resolve().parent.parent / "knative"
PLUGIN_ACCOUNT = ("kdrl-plugin", kube.PLUGIN_NAMESPACE)

Grant = tuple[str, str, str, str]  # (namespace or "", group, resource, verb)


def documents() -> Iterator[dict[str, Any]]:
    for path in sorted(KNATIVE.glob("*.yaml")):
        if path.name != "kustomization.yaml":
            yield from (d for d in yaml.safe_load_all(path.read_text()) if d)


def test_every_manifest_parses_and_is_listed() -> None:
    kustomization = yaml.safe_load((KNATIVE / "kustomization.yaml").read_text())
    files = {p.name for p in KNATIVE.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kustomization["resources"]) == files
    for document in documents():
        assert {"apiVersion", "kind", "metadata"} <= set(document), document


def granted() -> set[Grant]:
    objects = list(documents())
    bound_roles = {
        (d["metadata"].get("namespace", ""), d["roleRef"]["kind"], d["roleRef"]["name"])
        for d in objects
        if d["kind"] in ("ClusterRoleBinding", "RoleBinding")
        and any((s["name"], s.get("namespace")) == PLUGIN_ACCOUNT for s in d["subjects"])
    }
    grants: set[Grant] = set()
    for d in objects:
        if d["kind"] not in ("ClusterRole", "Role"):
            continue
        namespace = d["metadata"].get("namespace", "")
        if (namespace, d["kind"], d["metadata"]["name"]) not in bound_roles:
            continue
        for rule in d["rules"]:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    grants.update((namespace, group, resource, verb) for verb in rule["verbs"])
    return grants


def test_rbac_grants_exactly_what_the_code_calls() -> None:
    needed = {
        (call.namespace, call.group, call.resource, verb) for call in kube.API_CALLS for verb in call.verbs
    }
    assert granted() == needed
