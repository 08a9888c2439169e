"""One port per audience, and mutual TLS on the extender's: against a real `kdrl serve`."""

from __future__ import annotations

import http.client
import json
import shutil
import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.extender import free_port, serve_offline
from plugin import audiences
from plugin.settings import ServerSettings
from tests.conftest import EXAMPLES

OPENSSL = shutil.which("openssl")


def test_ports_left_at_zero_share_the_extender_port() -> None:
    assert audiences.by_port(ServerSettings()) == {
        8080: frozenset({"extender", "events", "admin", "webhook"})
    }
    split = audiences.by_port(ServerSettings(events_port=8081, admin_port=9090, tls_dir=EXAMPLES))
    assert split == {
        8080: frozenset({"extender"}),
        8081: frozenset({"events"}),
        9090: frozenset({"admin"}),
        8443: frozenset({"webhook"}),
    }
    assert audiences.allowed(split, 8080, "/scheduler/filter") and not audiences.allowed(
        split, 8080, "/events"
    )
    assert not audiences.allowed(split, 8443, "/scheduler/bind") and audiences.allowed(
        split, 8443, "/mutate-pods"
    )
    assert audiences.allowed(None, 1234, "/anything")  # no map (tests, embedding): everything


def serve(*flags: str) -> tuple[subprocess.Popen[bytes], int]:
    """`kdrl serve` offline with `flags`, ready (its /readyz answered on the admin port)."""
    server, port, _ = serve_offline(
        EXAMPLES / "nodes.json", EXAMPLES / "pods.json", "--log-level", "WARNING", *flags
    )
    return server, port


def status(
    port: int, method: str, path: str, body: bytes = b"", context: ssl.SSLContext | None = None
) -> int:
    if context is None:
        connection: http.client.HTTPConnection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    else:
        connection = http.client.HTTPSConnection("127.0.0.1", port, timeout=5, context=context)
    connection.request(method, path, body=body or None, headers={"Content-Type": "application/json"})
    return connection.getresponse().status


@pytest.fixture
def stopping() -> Iterator[list[subprocess.Popen[bytes]]]:
    servers: list[subprocess.Popen[bytes]] = []
    yield servers
    for server in servers:
        server.terminate()
        server.wait(timeout=10)


def test_each_port_serves_its_audience_only(stopping: list[subprocess.Popen[bytes]]) -> None:
    events, admin = free_port(), free_port()
    server, extender = serve("--events-port", str(events), "--admin-port", str(admin))
    stopping.append(server)
    assert status(admin, "GET", "/readyz") == 200
    filter_body = json.dumps(
        {"Pod": json.loads((EXAMPLES / "pending-pod.json").read_text()), "NodeNames": []}
    )
    assert status(extender, "POST", "/scheduler/filter", filter_body.encode()) == 200
    for port, path, method in (
        (extender, "/metrics", "GET"),
        (extender, "/events", "POST"),
        (extender, "/debug/decisions", "GET"),
        (events, "/scheduler/bind", "POST"),
        (events, "/readyz", "GET"),
        (admin, "/scheduler/filter", "POST"),
        (admin, "/events", "POST"),
    ):
        assert status(port, method, path, b"{}") == 404, (port, path)
    assert status(admin, "GET", "/metrics") == 200
    assert status(events, "POST", "/events", b"{") == 400  # reached the sink, which says why


def openssl(*args: str, cwd: Path) -> None:
    assert OPENSSL is not None
    subprocess.run([OPENSSL, *args], cwd=cwd, check=True, capture_output=True)


def certificates(folder: Path) -> None:
    """A CA, the plugin's serving certificate and the scheduler's client certificate."""
    openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-days",
        "1",
        "-subj",
        "/CN=kdrl-test-ca",
        cwd=folder,
    )
    for name, subject in (("tls", "/CN=127.0.0.1"), ("client", "/CN=kdrl-scheduler")):
        openssl(
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            f"{name}.key",
            "-out",
            f"{name}.csr",
            "-subj",
            subject,
            cwd=folder,
        )
        (folder / f"{name}.ext").write_text("subjectAltName=IP:127.0.0.1\n")
        openssl(
            "x509",
            "-req",
            "-in",
            f"{name}.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            f"{name}.crt",
            "-days",
            "1",
            "-extfile",
            f"{name}.ext",
            cwd=folder,
        )


@pytest.mark.skipif(OPENSSL is None, reason="the openssl command makes the test certificates")
def test_the_extender_port_admits_only_clients_with_a_certificate(
    tmp_path: Path, stopping: list[subprocess.Popen[bytes]]
) -> None:
    certificates(tmp_path)
    admin = free_port()
    server, extender = serve("--admin-port", str(admin), "--extender-tls-dir", str(tmp_path))
    stopping.append(server)
    assert status(admin, "GET", "/readyz") == 200  # the admin port stays plain HTTP (kubelet probes)
    body = json.dumps(
        {"Pod": json.loads((EXAMPLES / "pending-pod.json").read_text()), "NodeNames": []}
    ).encode()
    anonymous = ssl.create_default_context(cafile=str(tmp_path / "ca.crt"))
    with pytest.raises((ssl.SSLError, ConnectionResetError, BrokenPipeError)):
        status(extender, "POST", "/scheduler/filter", body, anonymous)  # no client certificate
    with pytest.raises(ssl.SSLError):
        status(extender, "POST", "/scheduler/filter", body, ssl.create_default_context())  # not our CA
    scheduler = ssl.create_default_context(cafile=str(tmp_path / "ca.crt"))
    scheduler.load_cert_chain(tmp_path / "client.crt", tmp_path / "client.key")
    assert status(extender, "POST", "/scheduler/filter", body, scheduler) == 200
    with pytest.raises((ConnectionResetError, http.client.RemoteDisconnected, ssl.SSLError)):
        status(extender, "POST", "/scheduler/filter", body)  # plain HTTP to the TLS port
