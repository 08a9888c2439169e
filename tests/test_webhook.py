"""The admission webhook: Knative pods to the kdrl scheduler, over HTTPS from `kdrl serve`."""

from __future__ import annotations

import base64
import http.client
import json
import shutil
import signal
import ssl
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from plugin import webhook
from plugin.errors import BadRequest
from tests.test_image import free_port

ROOT = Path(__file__).resolve().parent.parent


def admission(pod: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {"uid": "705ab4f5-6393-11e8-b7cc-42010a800002", "operation": "CREATE", "object": pod},
    }


def pod(labels: dict[str, str], **spec: Any) -> dict[str, Any]:
    return {"kind": "Pod", "metadata": {"labels": labels}, "spec": {"containers": [{"image": "x"}], **spec}}


def patch_of(answer: dict[str, Any]) -> list[dict[str, Any]] | None:
    response = answer["response"]
    assert response["allowed"] and response["uid"] == "705ab4f5-6393-11e8-b7cc-42010a800002"
    return json.loads(base64.b64decode(response["patch"])) if "patch" in response else None


KNATIVE = {"serving.knative.dev/service": "hello"}


def test_knative_pods_without_a_scheduler_go_to_kdrl() -> None:
    expected = [{"op": "add", "path": "/spec/schedulerName", "value": "kdrl-scheduler"}]
    assert patch_of(webhook.review(admission(pod(KNATIVE)))) == expected
    assert patch_of(webhook.review(admission(pod(KNATIVE, schedulerName="default-scheduler")))) == expected


def test_other_pods_and_chosen_schedulers_are_left_alone() -> None:
    assert patch_of(webhook.review(admission(pod({"app": "db"})))) is None
    assert patch_of(webhook.review(admission(pod(KNATIVE, schedulerName="volcano")))) is None
    assert patch_of(webhook.review(admission({"kind": "Secret"}))) is None


def test_a_body_that_is_no_admission_review_is_a_bad_request() -> None:
    with pytest.raises(BadRequest):
        webhook.review({"kind": "Pod"})


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command to make a certificate")
def test_kdrl_serve_answers_the_webhook_over_https_and_stops_cleanly(tmp_path: Path) -> None:
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1",
         "-keyout", str(tmp_path / "tls.key"), "-out", str(tmp_path / "tls.crt")],
        check=True,
        capture_output=True,
    )  # fmt: skip
    port, tls_port = free_port(), free_port()
    examples = ROOT / "examples" / "cluster"
    server = subprocess.Popen(
        [sys.executable, "-m", "plugin", "serve", "--host", "127.0.0.1", "--port", str(port),
         "--nodes", str(examples / "nodes.json"), "--history-path", str(tmp_path / "history.db"),
         "--tls-dir", str(tmp_path), "--tls-port", str(tls_port)],
        cwd=tmp_path,
    )  # fmt: skip
    try:
        trusted = ssl.create_default_context(cafile=str(tmp_path / "tls.crt"))
        deadline = time.monotonic() + 60
        while True:
            assert server.poll() is None, f"kdrl serve exited with {server.returncode}"
            try:
                connection = http.client.HTTPSConnection("127.0.0.1", tls_port, timeout=2, context=trusted)
                connection.request("POST", "/mutate-pods", body=json.dumps(admission(pod(KNATIVE))))
                response = connection.getresponse()
                break
            except OSError:
                assert time.monotonic() < deadline, "the HTTPS site never answered"
                time.sleep(0.2)
        assert response.status == 200
        assert patch_of(json.loads(response.read()))[0]["value"] == "kdrl-scheduler"  # type: ignore[index]
    finally:
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=20) == 0  # SIGTERM runs the cleanups and exits 0
