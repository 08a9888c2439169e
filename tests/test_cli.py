"""The `kdrl` command: `score` explains a placement; `serve` starts offline as a real process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import extender as extender_bench
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


def test_serve_offline_as_a_process() -> None:
    server, _, detail = extender_bench.serve_offline(
        EXAMPLES / "nodes.json", EXAMPLES / "pods.json", env={"KDRL_LOG_FORMAT": "json"}, capture_logs=True
    )
    server.terminate()
    _, err = server.communicate(timeout=10)
    assert detail["ready"] and detail["nodes"] == 12
    assert server.returncode == 0
    assert all(json.loads(line)["level"] for line in err.decode().splitlines() if line.strip())
