"""The install manifests: they parse and validate against the Kubernetes OpenAPI schema,
kustomize lists them all, RBAC grants exactly the calls the code registers (`plugin/kube.py`
`API_CALLS`), the scheduler reaches the plugin where it listens, and images are pinned."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import celpy
import kubernetes_validate
import pytest
import yaml

from plugin import app, kube, prewarming, settings
from prewarm import actuation, prepull

KNATIVE = Path(__file__).resolve().parent.parent / "knative"
BASE = KNATIVE / "base"
OVERLAYS = KNATIVE / "overlays"
PLUGIN_ACCOUNT = ("kdrl-plugin", kube.PLUGIN_NAMESPACE)
KUBERNETES = "1.36"  # the oldest minor the manifests target (the scheduler image's)
# Custom resources have no schema in kubernetes-validate: their required fields are checked here.
CUSTOM = {
    ("eventing.knative.dev/v1", "Trigger"): ("broker", "subscriber"),
    ("sources.knative.dev/v1", "ApiServerSource"): ("mode", "resources", "sink", "serviceAccountName"),
    ("serving.knative.dev/v1", "Service"): ("template",),
    ("cert-manager.io/v1", "Issuer"): (),  # selfSigned or ca (the mtls test checks which)
    ("cert-manager.io/v1", "Certificate"): ("secretName", "dnsNames", "issuerRef"),
    ("monitoring.coreos.com/v1", "PrometheusRule"): ("groups",),
    ("monitoring.coreos.com/v1", "ServiceMonitor"): ("selector", "endpoints"),
    ("ray.io/v1", "RayCluster"): ("rayVersion", "headGroupSpec", "workerGroupSpecs"),
}

Grant = tuple[str, str, str, str]  # (namespace or "", group, resource, verb)


def documents(folder: Path = BASE) -> Iterator[dict[str, Any]]:
    for path in sorted(folder.glob("*.yaml")):
        if path.name != "kustomization.yaml":
            yield from (d for d in yaml.safe_load_all(path.read_text()) if d)


def every_document() -> list[dict[str, Any]]:
    folders = (BASE, KNATIVE / "eventing", OVERLAYS / "webhook", KNATIVE / "examples")
    return [d for folder in folders for d in documents(folder)]


def find(kind: str, name: str) -> dict[str, Any]:
    return next(d for d in documents() if d["kind"] == kind and d["metadata"]["name"] == name)


@pytest.mark.parametrize("folder", [BASE, KNATIVE / "eventing", OVERLAYS / "webhook"])
def test_every_manifest_parses_and_is_listed(folder: Path) -> None:
    kustomization = yaml.safe_load((folder / "kustomization.yaml").read_text())
    files = {p.name for p in folder.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kustomization["resources"]) - {"../../base"} == files
    for document in documents(folder):
        assert {"apiVersion", "kind", "metadata"} <= set(document), document


@pytest.mark.parametrize("document", every_document(), ids=lambda d: f"{d['kind']}/{d['metadata']['name']}")
def test_every_object_validates_against_the_kubernetes_schema(document: dict[str, Any]) -> None:
    custom = CUSTOM.get((document["apiVersion"], document["kind"]))
    if custom is not None:
        assert set(custom) <= set(document["spec"]), custom
        return
    kubernetes_validate.validate(document, KUBERNETES, strict=True)  # raises on any error


def patched(overlay: str) -> dict[tuple[str, str], dict[str, Any]]:
    """The base objects an overlay patches, with its JSON patches applied (add and remove)."""
    kustomization = yaml.safe_load((OVERLAYS / overlay / "kustomization.yaml").read_text())
    assert "../../base" in kustomization["resources"]
    out = {}
    for entry in kustomization["patches"]:
        target = entry["target"]
        document = find(target["kind"], target["name"])
        for op in yaml.safe_load(entry["patch"]):
            *parents, last = op["path"].strip("/").split("/")
            node = document
            for key in parents:
                node = node[int(key)] if isinstance(node, list) else node[key]
            if op["op"] == "remove":
                del node[last]
            elif last == "-":
                node.append(op["value"])
            else:
                node[last] = op["value"]
        out[(target["kind"], target["name"])] = document
    return out


def test_the_emptydir_overlay_still_validates() -> None:
    statefulset = patched("ephemeral-history")[("StatefulSet", "kdrl")]
    assert "volumeClaimTemplates" not in statefulset["spec"]
    kubernetes_validate.validate(statefulset, KUBERNETES, strict=True)
    mounts = statefulset["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]
    volumes = {v["name"] for v in statefulset["spec"]["template"]["spec"]["volumes"]}
    assert {m["name"] for m in mounts} <= volumes


def test_the_scheduler_calls_the_plugin_where_it_listens() -> None:
    config = yaml.safe_load(find("ConfigMap", "kdrl-scheduler-config")["data"]["config.yaml"])
    (extender,) = config["extenders"]
    service, plugin = find("Service", "kdrl"), find("StatefulSet", "kdrl")
    port = service["spec"]["ports"][0]
    container = plugin["spec"]["template"]["spec"]["containers"][0]
    assert container["ports"][0]["containerPort"] == int(
        find("ConfigMap", "kdrl-config")["data"]["KDRL_PORT"]
    )
    assert port["targetPort"] == container["ports"][0]["name"]
    host = f"{service['metadata']['name']}.{service['metadata']['namespace']}.svc.cluster.local"
    assert extender["urlPrefix"] == f"http://{host}:{port['port']}{app.EXTENDER_PREFIX}"
    assert (extender["filterVerb"], extender["prioritizeVerb"]) == ("filter", "prioritize")
    assert "bindVerb" not in extender  # kube-scheduler binds: docs/extender-throughput.md
    assert extender["nodeCacheCapable"] and extender["ignorable"] and extender["weight"] > 0
    assert extender["httpTimeout"].endswith("s") and float(extender["httpTimeout"][:-1]) <= 5
    assert config["leaderElection"]["resourceNamespace"] == kube.PLUGIN_NAMESPACE
    assert config["leaderElection"]["resourceName"] != "kube-scheduler"  # never the cluster's lock
    (profile,) = config["profiles"]
    example = next(d for d in documents(KNATIVE / "examples") if d["kind"] == "Service")
    assert profile["schedulerName"] == example["spec"]["template"]["spec"]["schedulerName"]
    probes = {container[p]["httpGet"]["path"] for p in ("readinessProbe", "livenessProbe")}
    assert probes == {"/readyz", "/healthz"}


def test_every_setting_is_in_the_configmap() -> None:
    env = {f.metadata["env"] for _, group in settings.GROUPS for f in group.__dataclass_fields__.values()}
    given = {k for k in find("ConfigMap", "kdrl-config")["data"] if not k.startswith("OTEL_")}
    container = find("StatefulSet", "kdrl")["spec"]["template"]["spec"]["containers"][0]
    from_pod = {e["name"] for e in container["env"]}  # the pod's own name, numba's cache
    assert given | (from_pod & env) | {"K_SINK"} == env  # K_SINK: a SinkBinding injects it
    assert not given & from_pod


def test_images_are_pinned_and_the_containers_locked_down() -> None:
    kustomization = yaml.safe_load((BASE / "kustomization.yaml").read_text())
    pinned = {i["name"]: i["newTag"] for i in kustomization["images"]}
    for document in documents():
        if document["kind"] not in ("Deployment", "StatefulSet"):
            continue
        pod = document["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] and pod["securityContext"]["seccompProfile"]
        for container in pod["containers"]:
            name, _, tag = container["image"].rpartition(":")
            assert tag not in ("", "latest") and pinned[name] == tag
            context = container["securityContext"]
            assert context["readOnlyRootFilesystem"] and context["capabilities"]["drop"] == ["ALL"]
            assert not context["allowPrivilegeEscalation"]
            assert container["resources"]["requests"] and container["resources"]["limits"]


def restricted_violations(pod: dict[str, Any]) -> list[str]:
    """What Pod Security "restricted" would refuse in a pod spec (the checks our pods touch)."""
    found = []
    context = pod.get("securityContext") or {}
    if (context.get("seccompProfile") or {}).get("type") not in ("RuntimeDefault", "Localhost"):
        found.append("seccompProfile")
    for container in [*pod.get("initContainers", []), *pod["containers"]]:
        own = container.get("securityContext") or {}
        if not (own.get("runAsNonRoot") or context.get("runAsNonRoot")):
            found.append(f"{container['name']}: runAsNonRoot")
        if own.get("allowPrivilegeEscalation") is not False:
            found.append(f"{container['name']}: allowPrivilegeEscalation")
        if (own.get("capabilities") or {}).get("drop") != ["ALL"]:
            found.append(f"{container['name']}: capabilities")
    return found


def test_the_namespace_enforces_pod_security_restricted_and_every_pod_meets_it() -> None:
    labels = find("Namespace", "kdrl-system")["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
    pods = [d["spec"]["template"]["spec"] for d in documents() if d["kind"] in ("Deployment", "StatefulSet")]
    pods.append(
        prepull.pod(prepull.Target("node-a", "registry.example.com/app:1"), namespace="kdrl-system")["spec"]
    )
    assert len(pods) == 3
    for pod in pods:
        assert restricted_violations(pod) == []


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


def test_the_webhook_overlay_serves_tls_where_the_webhook_calls() -> None:
    objects = patched("webhook")
    for document in objects.values():
        kubernetes_validate.validate(document, KUBERNETES, strict=True)
    container = objects[("StatefulSet", "kdrl")]["spec"]["template"]["spec"]["containers"][0]
    tls_dir = next(e["value"] for e in container["env"] if e["name"] == "KDRL_TLS_DIR")
    assert any(m["mountPath"] == tls_dir for m in container["volumeMounts"])
    https = next(p for p in container["ports"] if p["name"] == "https")
    assert https["containerPort"] == settings.ServerSettings().tls_port
    (configuration,) = [
        d for d in documents(OVERLAYS / "webhook") if d["kind"] == "MutatingWebhookConfiguration"
    ]
    (hook,) = configuration["webhooks"]
    assert hook["failurePolicy"] == "Ignore" and hook["sideEffects"] == "None"
    service = hook["clientConfig"]["service"]
    assert service["path"] == "/mutate-pods"
    ports = objects[("Service", "kdrl")]["spec"]["ports"]
    assert any(p["port"] == service["port"] and p["targetPort"] == "https" for p in ports)
    never = next(e for e in hook["namespaceSelector"]["matchExpressions"] if e["operator"] == "NotIn")
    assert never["key"] == "kubernetes.io/metadata.name" and {"kube-system", "kdrl-system"} <= set(
        never["values"]
    )
    certificate = next(d for d in documents(OVERLAYS / "webhook") if d["kind"] == "Certificate")
    assert f"{service['name']}.{service['namespace']}.svc" in certificate["spec"]["dnsNames"]
    assert configuration["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == (
        f"{certificate['metadata']['namespace']}/{certificate['metadata']['name']}"
    )


def test_the_mtls_overlay_changes_only_the_extenders_transport() -> None:
    """The overlay repeats the scheduler configuration (kustomize cannot patch inside it): the
    two stay equal apart from the scheme and the TLS settings, which point where the secrets are."""
    kustomization = yaml.safe_load((OVERLAYS / "mtls" / "kustomization.yaml").read_text())
    (replaced,) = [p for p in kustomization["patches"] if p["target"]["kind"] == "ConfigMap"]
    overlay = yaml.safe_load(yaml.safe_load(replaced["patch"])[0]["value"])
    base = yaml.safe_load(find("ConfigMap", "kdrl-scheduler-config")["data"]["config.yaml"])
    (secure,), (plain,) = overlay.pop("extenders"), base.pop("extenders")
    assert overlay == base
    tls = secure.pop("tlsConfig")
    assert secure.pop("enableHTTPS") is True and secure.pop("urlPrefix") == plain.pop("urlPrefix").replace(
        "http://", "https://"
    )
    assert secure == plain
    assert {Path(tls[k]).name for k in ("caFile", "certFile", "keyFile")} == {"ca.crt", "tls.crt", "tls.key"}
    certificates = list(yaml.safe_load_all((OVERLAYS / "mtls" / "certificates.yaml").read_text()))
    server = next(c for c in certificates if c["metadata"]["name"] == "kdrl-extender-server")
    assert tls["serverName"] in server["spec"]["dnsNames"] and "server auth" in server["spec"]["usages"]
    client = next(c for c in certificates if c["metadata"]["name"] == "kdrl-scheduler-client")
    assert "client auth" in client["spec"]["usages"]
    issuers = {c["metadata"]["name"]: set(c["spec"]) for c in certificates if c["kind"] == "Issuer"}
    assert issuers == {"kdrl-selfsigned": {"selfSigned"}, "kdrl-extender-ca": {"ca"}}
    assert server["spec"]["issuerRef"]["name"] == client["spec"]["issuerRef"]["name"] == "kdrl-extender-ca"


def _merged(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch, as the API server applies the plugin's patches."""
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = _merged(out.get(key), value)
    return out


def refused(policy: str, user: str, new: dict[str, Any], old: dict[str, Any] | None = None) -> list[str]:
    """What the ValidatingAdmissionPolicy `policy` says of a request (CEL, by cel-python):
    the messages of the validations that fail; none when it does not apply or all pass."""
    document = find("ValidatingAdmissionPolicy", policy)["spec"]
    environment = celpy.Environment()

    def evaluate(expression: str, bindings: dict[str, Any]) -> Any:
        return environment.program(environment.compile(expression)).evaluate(bindings)

    bindings: dict[str, Any] = {
        "request": celpy.json_to_cel({"userInfo": {"username": user}}),
        "object": celpy.json_to_cel(new),
        "oldObject": celpy.json_to_cel(old),
    }
    if not all(evaluate(c["expression"], bindings) for c in document.get("matchConditions", [])):
        return []
    variables: dict[str, Any] = {}
    for variable in document.get("variables", []):
        variables[variable["name"]] = evaluate(variable["expression"], {**bindings, "variables": variables})
    bindings["variables"] = celpy.celtypes.MapType(variables)
    return [v["message"] for v in document["validations"] if not evaluate(v["expression"], bindings)]


PLUGIN_USER = "system:serviceaccount:kdrl-system:kdrl-plugin"
REVISION = {
    "apiVersion": "serving.knative.dev/v1",
    "kind": "Revision",
    "metadata": {
        "name": "shop-00001",
        "namespace": "shop",
        "uid": "u1",
        "labels": {"serving.knative.dev/service": "shop"},
        "annotations": {"autoscaling.knative.dev/target": "10", "autoscaling.knative.dev/min-scale": "1"},
    },
    "spec": {"containers": [{"image": "registry.example/shop@sha256:" + "a" * 64}]},
}


def test_the_plugin_may_change_only_min_scale_and_its_annotations_of_a_revision() -> None:
    change = actuation.warm(REVISION["metadata"]["annotations"], 3, datetime(2026, 12, 4, 12, tzinfo=UTC))
    warmed = _merged(REVISION, change.patch)
    assert warmed["metadata"]["annotations"]["autoscaling.knative.dev/min-scale"] == "3"
    assert refused("kdrl-plugin-revisions", PLUGIN_USER, warmed, REVISION) == []
    restored = _merged(warmed, actuation.restore(warmed["metadata"]["annotations"]).patch)
    assert restored == REVISION and refused("kdrl-plugin-revisions", PLUGIN_USER, restored, warmed) == []
    other_changes = [
        {"metadata": {"annotations": {"autoscaling.knative.dev/max-scale": "1000"}}},
        {"metadata": {"annotations": {"autoscaling.knative.dev/target": None}}},
        {"metadata": {"labels": {"serving.knative.dev/service": "bank"}}},
        {"metadata": {"finalizers": ["hold"]}},
        {"spec": {"containers": [{"image": "attacker.example/miner"}]}},
    ]
    for patch in other_changes:
        assert refused("kdrl-plugin-revisions", PLUGIN_USER, _merged(REVISION, patch), REVISION), patch
        assert refused("kdrl-plugin-revisions", "alice", _merged(REVISION, patch), REVISION) == []


def test_the_plugin_records_only_prewarm_events_about_revisions() -> None:
    event = prewarming.prewarm_event(REVISION, "warm", "min-scale 3", datetime(2026, 12, 4, tzinfo=UTC))
    assert refused("kdrl-plugin-events", PLUGIN_USER, event) == []
    about_a_pod = {**event, "involvedObject": {**event["involvedObject"], "kind": "Pod", "apiVersion": "v1"}}
    elsewhere = {**event, "metadata": {**event["metadata"], "namespace": "kube-system"}}
    for forged in (about_a_pod, elsewhere, {**event, "reason": "NodeNotReady"}, {**event, "type": "Warning"}):
        assert refused("kdrl-plugin-events", PLUGIN_USER, forged)
