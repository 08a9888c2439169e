"""The `kdrl` command: `score` explains a placement; `serve` starts offline as a real process."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from plugin import cli
from tests.conftest import EXAMPLES

SCORE_ARGS = [
    "score",
    "--nodes",
    str(EXAMPLES / "nodes.json"),
    "--pods",
    str(EXAMPLES / "pods.json"),
    "--pod",
    str(EXAMPLES / "pending-pod.json"),
]


def test_score_json_lists_every_node_best_first(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main([*SCORE_ARGS, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    nodes = report["nodes"]
    assert report["policy"] == "kube-default" and report["function"] == "default/hello"
    assert len(nodes) == len(json.loads((EXAMPLES / "nodes.json").read_text())["items"])
    feasible = [n for n in nodes if n["feasible"]]
    assert [n["score"] for n in feasible] == sorted((n["score"] for n in feasible), reverse=True)
    assert nodes.index(feasible[-1]) == len(feasible) - 1  # infeasible ones come last, with reasons
    assert all(n["reason"] for n in nodes if not n["feasible"])
    first = feasible[0]
    assert set(first["terms"]) == {"NodeResourcesFit", "NodeResourcesBalancedAllocation", "ImageLocality"}
    assert sum(first["terms"].values()) == pytest.approx(first["score"])


def test_score_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main([*SCORE_ARGS, "--policy", "most-allocated"]) == 0
    out = capsys.readouterr().out
    assert "policy most-allocated" in out and "untolerated taint" in out


def test_score_with_a_bad_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "nodes.json"
    bad.write_text("{")
    assert cli.main(["score", "--nodes", str(bad), "--pod", str(EXAMPLES / "pending-pod.json")]) == 2
    assert "not valid JSON" in capsys.readouterr().err


def test_serve_rejects_bad_settings(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["serve", "--port", "-1"]) == 2
    assert "KDRL_PORT='-1'" in capsys.readouterr().err


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_serve_offline_as_a_process() -> None:
    port = free_port()
    env = {**os.environ, "KDRL_LOG_FORMAT": "json"}
    args = [
        sys.executable,
        "-m",
        "plugin",
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--nodes",
        str(EXAMPLES / "nodes.json"),
        "--pods",
        str(EXAMPLES / "pods.json"),
    ]
    process = subprocess.Popen(args, env=env, stderr=subprocess.PIPE, text=True)
    try:
        detail = None
        for _ in range(200):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as response:
                    detail = json.loads(response.read())
                    break
            except OSError:
                time.sleep(0.05)
        assert detail is not None and detail["ready"] and detail["nodes"] == 12
    finally:
        process.terminate()
        _, err = process.communicate(timeout=10)
    assert process.returncode == 0
    assert all(json.loads(line)["level"] for line in err.splitlines() if line.strip())
