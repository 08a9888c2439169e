"""The install as kubectl builds and applies it: every kustomization through `kubectl kustomize`
(real kustomize, which rejects layouts Python patching accepts), and the feature-flag patches
through `kubectl patch --local` (the documented commands, minus the server)."""

from __future__ import annotations

import base64
import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import numpy as np
import pytest
import yaml

from plugin import kube, settings
from plugin.extender import extender_scores
from policies import onnx_policy
from tests.test_manifests import CUSTOM, KNATIVE, KUBERNETES, find, restricted_violations

KUBECTL = shutil.which("kubectl")
needs_kubectl = pytest.mark.skipif(
    KUBECTL is None, reason="kubectl is not installed (the install tests need it)"
)
KUSTOMIZATIONS = sorted(p.parent for p in KNATIVE.rglob("kustomization.yaml"))
FLAG = "kubernetes.podspec-schedulername"


def kubectl(*args: str) -> list[dict[str, Any]]:
    assert KUBECTL is not None
    done = subprocess.run([KUBECTL, *args], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


@needs_kubectl
@pytest.mark.parametrize("folder", KUSTOMIZATIONS, ids=lambda p: str(p.relative_to(KNATIVE.parent)))
def test_every_kustomization_builds_and_validates(folder: Path) -> None:
    objects = kubectl("kustomize", str(folder))
    assert objects
    for document in objects:
        custom = CUSTOM.get((document["apiVersion"], document["kind"]))
        if custom is not None:
            assert set(custom) <= set(document["spec"]), custom
        else:
            kubernetes_validate.validate(document, KUBERNETES, strict=True)
        # The install never owns Knative's ConfigMaps: applying one would erase the operator's keys.
        knative_config = (
            document["kind"] == "ConfigMap" and document["metadata"].get("namespace") == "knative-serving"
        )
        assert not knative_config, document["metadata"]


def test_the_overlays_live_beside_the_base() -> None:
    for folder in KUSTOMIZATIONS:
        resources = yaml.safe_load((folder / "kustomization.yaml").read_text()).get("resources", [])
        for entry in resources:
            included = (folder / entry).resolve()
            assert not folder.resolve().is_relative_to(included), f"{folder} includes its own parent {entry}"


@needs_kubectl
def test_the_feature_flag_patch_keeps_every_other_key(tmp_path: Path) -> None:
    installed = tmp_path / "config-features.yaml"
    others = {
        "_example": "a long explanation",
        "kubernetes.podspec-affinity": "enabled",
        "multi-container": "enabled",
    }
    installed.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": "config-features", "namespace": "knative-serving"},
                "data": others,
            }
        )
    )
    patch = KNATIVE / "feature-flag" / "config-features.patch.yaml"
    (patched,) = kubectl(
        "patch", "--local", "-f", str(installed), "--type", "merge", "--patch-file", str(patch), "-o", "yaml"
    )
    assert patched["data"] == {**others, FLAG: "enabled"}


@needs_kubectl
def test_the_operator_patch_keeps_every_other_setting(tmp_path: Path) -> None:
    installed = tmp_path / "knativeserving.yaml"
    config = {"features": {"multi-container": "enabled"}, "autoscaler": {"stable-window": "60s"}}
    installed.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "operator.knative.dev/v1beta1",
                "kind": "KnativeServing",
                "metadata": {"name": "knative-serving", "namespace": "knative-serving"},
                "spec": {"config": config},
            }
        )
    )
    patch = KNATIVE / "feature-flag" / "knativeserving.patch.yaml"
    (patched,) = kubectl(
        "patch", "--local", "-f", str(installed), "--type", "merge", "--patch-file", str(patch), "-o", "yaml"
    )
    assert patched["spec"]["config"] == {
        "features": {"multi-container": "enabled", FLAG: "enabled"},
        "autoscaler": {"stable-window": "60s"},
    }


# kube-scheduler's default score plugins and weights (pkg/scheduler/apis/config/v1/default_plugins.go).
DEFAULT_SCORE_WEIGHTS = {
    "TaintToleration": 3,
    "NodeAffinity": 2,
    "NodeResourcesFit": 1,
    "VolumeBinding": 1,
    "PodTopologySpread": 2,
    "InterPodAffinity": 2,
    "NodeResourcesBalancedAllocation": 1,
    "ImageLocality": 1,
}
MAX_NODE_SCORE, MAX_EXTENDER_PRIORITY = 100, 10


def scheduler_config() -> dict[str, Any]:
    config: dict[str, Any] = yaml.safe_load(find("ConfigMap", "kdrl-scheduler-config")["data"]["config.yaml"])
    return config


def profile_weights(profile: dict[str, Any]) -> dict[str, int]:
    """The score plugins a profile runs, with their weights, after its overrides."""
    weights = dict(DEFAULT_SCORE_WEIGHTS)
    for section in ("score", "multiPoint"):
        plugins = (profile.get("plugins") or {}).get(section) or {}
        for plugin in plugins.get("disabled") or []:
            weights = (
                {} if plugin["name"] == "*" else {k: v for k, v in weights.items() if k != plugin["name"]}
            )
        for plugin in plugins.get("enabled") or []:
            weights[plugin["name"]] = plugin.get("weight", 1)
    return weights


def chosen(plugin_scores: np.ndarray, weights: np.ndarray, extender: np.ndarray | None, weight: int) -> int:
    """kube-scheduler's prioritizeNodes: Σ plugin score x weight, plus each extender's 0-10
    score x its weight x (MaxNodeScore / MaxExtenderPriority); the highest total wins."""
    total = plugin_scores @ weights
    if extender is not None:
        total = total + extender * weight * (MAX_NODE_SCORE // MAX_EXTENDER_PRIORITY)
    return int(np.argmax(total))


def test_the_extender_decides_when_it_answers_and_the_default_profile_when_it_does_not() -> None:
    config = scheduler_config()
    (profile,) = config["profiles"]
    (extender,) = config["extenders"]
    weights = profile_weights(profile)
    assert weights == DEFAULT_SCORE_WEIGHTS  # down or slow (ignorable), placement is kube-default's
    vector = np.array(list(weights.values()))
    # The worst case: every plugin prefers the node the extender ranks one point lower.
    assert extender["weight"] * (MAX_NODE_SCORE // MAX_EXTENDER_PRIORITY) > MAX_NODE_SCORE * vector.sum()
    rng = np.random.default_rng(7)
    for _ in range(2000):
        nodes = int(rng.integers(2, 40))
        plugin_scores = rng.integers(0, MAX_NODE_SCORE + 1, size=(nodes, vector.size))
        raw = rng.normal(size=nodes)
        raw = np.where(rng.random(nodes) < 0.2, raw.max(), raw)  # ties for the best
        raw = np.where(rng.random(nodes) < 0.2, raw.max() - 0.01 * rng.random(nodes), raw)  # near it
        answer = extender_scores(raw)
        best = set(np.flatnonzero(raw == raw.max()).tolist())  # the policy's own choice and ties
        assert chosen(plugin_scores, vector, answer, extender["weight"]) in best
        # Down: the node kube-scheduler's default profile (no overrides) would pick.
        default = np.array(list(profile_weights({}).values()))
        assert chosen(plugin_scores, vector, None, 0) == chosen(plugin_scores, default, None, 0)
    adversarial = np.array([[0] * vector.size, [MAX_NODE_SCORE] * vector.size])
    assert chosen(adversarial, vector, np.array([10, 9]), extender["weight"]) == 0


def test_only_the_policys_best_get_the_top_extender_score() -> None:
    # 0.99 would round to 10 on a plain 0..10 scale, and the default plugins would then choose
    # between it and the best; the best and its exact tie alone get 10.
    raw = np.array([1.0, 0.99, 0.5, np.nan, 1.0])
    assert extender_scores(raw).tolist() == [10, 9, 0, 0, 10]
    assert extender_scores(np.array([3.0, 3.0, np.inf])).tolist() == [5, 5, 0]  # alike: neutral


@needs_kubectl
def test_the_ray_overlay_points_the_plugin_at_its_ray_cluster_on_one_image() -> None:
    objects = {(d["kind"], d["metadata"]["name"]): d for d in kubectl("kustomize", str(KNATIVE / "ray"))}
    config = objects["ConfigMap", "kdrl-config"]["data"]
    loaded = settings.load({}, config)  # the settings `kdrl serve` starts with are valid
    assert loaded.history.forecast_engine == "ray"
    ray_cluster = objects["RayCluster", "kdrl-ray"]
    head = ray_cluster["spec"]["headGroupSpec"]["template"]["spec"]
    host, port = str(loaded.history.ray_address).removeprefix("ray://").split(":")
    # KubeRay names the head's Service <cluster>-head-svc, in the cluster's namespace.
    assert host == f"kdrl-ray-head-svc.{ray_cluster['metadata']['namespace']}.svc"
    assert {"name": "client", "containerPort": int(port), "protocol": "TCP"} in head["containers"][0]["ports"]
    plugin = objects["StatefulSet", "kdrl"]["spec"]["template"]
    pods = [plugin["spec"], head] + [g["template"]["spec"] for g in ray_cluster["spec"]["workerGroupSpecs"]]
    containers = [pod["containers"][0] for pod in pods]
    # One image: the same Ray and Python versions, and the workers import the plugin's forecast code.
    assert len({c["image"] for c in containers}) == 1 and containers[0]["image"].endswith("-ray")
    for pod, container in zip(pods, containers):
        assert restricted_violations(pod) == []
        assert container["securityContext"]["readOnlyRootFilesystem"]
        env = {e["name"]: e for e in container["env"]}
        assert env["RAY_AUTH_MODE"]["value"] == "token"
        assert env["RAY_AUTH_TOKEN"]["valueFrom"] == {
            "secretKeyRef": {"name": "kdrl-ray-auth", "key": "auth_token"}
        }
    for container in containers[1:]:  # Ray writes its session under /tmp
        assert "/tmp" in {m["mountPath"] for m in container["volumeMounts"]}
    policy = objects["NetworkPolicy", "kdrl-ray"]["spec"]
    from_plugin = [rule for rule in policy["ingress"] if "ports" in rule]
    (rule,) = from_plugin
    assert rule["from"][0]["podSelector"]["matchLabels"].items() <= plugin["metadata"]["labels"].items()
    assert rule["ports"] == [{"port": int(port), "protocol": "TCP"}]


@needs_kubectl
def test_the_closed_loop_overlay_serves_the_model_its_cronjobs_publish() -> None:
    objects = {
        (d["kind"], d["metadata"]["name"]): d for d in kubectl("kustomize", str(KNATIVE / "closed-loop"))
    }
    config = settings.load({}, objects["ConfigMap", "kdrl-config"]["data"])
    assert config.policy.name == "onnx" and config.policy.reload_s > 0
    model = objects["ConfigMap", "kdrl-model"]
    # Its first content is the shipped model, byte for byte (the copy cannot drift).
    assert base64.b64decode(model["binaryData"]["placement.onnx"]) == onnx_policy.DEFAULT_MODEL.read_bytes()
    plugin = objects["StatefulSet", "kdrl"]["spec"]["template"]
    (volume,) = [v for v in plugin["spec"]["volumes"] if v.get("configMap", {}).get("name") == "kdrl-model"]
    (mount,) = [m for m in plugin["spec"]["containers"][0]["volumeMounts"] if m["name"] == volume["name"]]
    assert config.policy.model == Path(mount["mountPath"]) / "placement.onnx"
    replicas = objects["StatefulSet", "kdrl"]["spec"]["replicas"]
    service = objects["StatefulSet", "kdrl"]["spec"]["serviceName"]
    admin = next(p["containerPort"] for p in plugin["spec"]["containers"][0]["ports"] if p["name"] == "admin")
    role = objects["Role", "kdrl-loop"]
    granted = {(r["resources"][0], v) for r in role["rules"] for v in r["verbs"]}
    assert granted == {(c.resource, v) for c in kube.LOOP_CALLS for v in c.verbs}
    assert all(r["resourceNames"] == ["kdrl-model"] for r in role["rules"])
    for name in ("kdrl-loop-daily", "kdrl-loop-sla"):
        template = objects["CronJob", name]["spec"]["jobTemplate"]["spec"]["template"]
        pod = template["spec"]
        assert restricted_violations(pod) == [] and pod["serviceAccountName"] == "kdrl-loop"
        args = dict(a.removeprefix("--").split("=", 1) for a in pod["containers"][0]["args"])
        # Every replica's decisions: each records what it served.
        expected = {f"http://kdrl-{i}.{service}.kdrl-system.svc:{admin}" for i in range(replicas)}
        assert set(args["decisions"].split(",")) == expected
        assert args["configmap"] == f"{model['metadata']['namespace']}/{model['metadata']['name']}"
        # The loop's pods reach the admin port (NetworkPolicies add up).
        policy = objects["NetworkPolicy", "kdrl-loop"]["spec"]
        assert (
            policy["ingress"][0]["from"][0]["podSelector"]["matchLabels"].items()
            <= template["metadata"]["labels"].items()
        )
        assert policy["ingress"][0]["ports"] == [{"port": "admin", "protocol": "TCP"}]
    assert "if-sla-violations-above" in dict(
        a.removeprefix("--").split("=", 1)
        for a in objects["CronJob", "kdrl-loop-sla"]["spec"]["jobTemplate"]["spec"]["template"]["spec"][
            "containers"
        ][0]["args"]
    )
