"""The Dockerfile, short of a Docker engine: what it copies exists, what it runs starts.

The service is built into a wheel, installed into a fresh virtual environment (its
dependencies borrowed from the test environment, the project itself only from the wheel),
and `kdrl serve` from that environment must start offline with the shipped model.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import shlex
import subprocess
import sys
import sysconfig
import time
import tomllib
from pathlib import Path

import pytest

from bench.extender import free_port

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = (ROOT / "Dockerfile").read_text()


def instructions(name: str) -> list[str]:
    return [m.group(1) for m in re.finditer(rf"^{name}\s+(.+)$", DOCKERFILE, flags=re.M)]


def test_every_copied_path_exists() -> None:
    copies = [line for line in instructions("COPY") if not line.startswith("--from")]
    assert copies
    for line in copies:
        *sources, _ = shlex.split(line)
        for source in sources:
            assert (ROOT / source).exists(), source


def test_runs_kdrl_serve_as_a_numeric_non_root_user_without_torch() -> None:
    assert instructions("ENTRYPOINT") == ['["kdrl", "serve"]']
    (user,) = instructions("USER")
    uid = user.split(":")[0]
    assert uid.isdigit() and int(uid) != 0
    assert "torch" not in DOCKERFILE.replace("no torch", "")
    stages = set(re.findall(r"^FROM\s+\S+\s+AS\s+(\S+)$", DOCKERFILE, flags=re.M))
    assert {"runtime-cpu", "runtime-cuda"} <= stages  # both values of ARG RUNTIME exist


def test_the_wheel_serves_from_a_fresh_environment(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "--wheel-dir", str(wheels), str(ROOT)],
        check=True,
        timeout=600,
    )
    (wheel,) = wheels.glob("*.whl")
    fresh = tmp_path / "fresh"
    subprocess.run([sys.base_prefix + "/bin/python3", "-m", "venv", "--without-pip", str(fresh)], check=True)
    site = Path(sysconfig.get_path("purelib", vars={"base": str(fresh), "platbase": str(fresh)}))
    # dependencies from this environment; its .pth files (our editable install) are not read
    (site / "borrowed.pth").write_text(sysconfig.get_path("purelib") + "\n")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(fresh / "bin" / "python"),
            "install",
            "--no-deps",
            "--quiet",
            str(wheel),
        ],
        check=True,
        timeout=300,
    )
    port = free_port()
    examples = ROOT / "examples" / "cluster"
    server = subprocess.Popen(
        [
            str(fresh / "bin" / "kdrl"),
            "serve",
            "--policy",
            "onnx",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--nodes",
            str(examples / "nodes.json"),
            "--pods",
            str(examples / "pods.json"),
            "--history-path",
            str(tmp_path / "history.db"),
        ],
        cwd=tmp_path,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    )
    try:
        detail = _ready(port, server)
        assert detail["policy"] == "onnx" and not detail["degraded"]  # the model came in the wheel
        assert (site / "policies" / "models" / "tuned.json").is_file()  # and the default's weights
        located = subprocess.run(
            [str(fresh / "bin" / "python"), "-c", "import plugin; print(plugin.__file__)"],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            check=True,
        )
        assert str(fresh) in located.stdout  # the wheel's copy, not the source tree
    finally:
        server.terminate()
        server.wait(timeout=10)


def _ready(port: int, server: subprocess.Popen[bytes]) -> dict[str, object]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if server.poll() is not None:
            pytest.fail(f"kdrl serve exited with {server.returncode}")
        try:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
            connection.request("GET", "/readyz")
            response = connection.getresponse()
            if response.status == 200:
                result: dict[str, object] = json.loads(response.read())
                return result
        except OSError:
            time.sleep(0.1)
    pytest.fail("kdrl serve did not become ready")


@pytest.mark.parametrize(("extras", "argument"), [("", "{wheel}"), ("ray", "{wheel}[ray]")])
def test_the_extras_build_argument_installs_the_wheel_with_them(
    tmp_path: Path, extras: str, argument: str
) -> None:
    """The RUN line's pip argument, evaluated by a shell as the build would (EXTRAS=ray: the
    image knative/ray runs), names an extra the project has."""
    (line,) = [x for x in DOCKERFILE.splitlines() if "${EXTRAS:+" in x]
    expression = re.search(r'"(\$\(echo /wheels/\*\.whl\)[^"]*)"', line)
    assert expression is not None
    wheel = tmp_path / "wheels" / "knative_drl_scheduler-0.1.0-py3-none-any.whl"
    wheel.parent.mkdir()
    wheel.touch()
    shell = expression.group(1).replace("/wheels/", f"{wheel.parent}/")
    done = subprocess.run(
        ["bash", "-c", f'echo "{shell}"'], env={"EXTRAS": extras}, capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == argument.format(wheel=wheel)
    optional = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert all(extra in optional for extra in filter(None, extras.split(",")))
