"""`kdrl simulate`: the report's fields, byte-identical reruns, plots, and clear bad-input errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from plugin import cli

QUICK = ["simulate", "--functions", "24", "--hours", "1", "--cluster", "small", "--seed", "3"]
REQUIRED = {
    "placement",
    "keepalive",
    "population",
    "invocations",
    "cold_starts",
    "cold_start_pct_p75",
    "cold_start_pct_p75_weighted",
    "wasted_memory_gb_s",
    "wasted_memory_norm",
    "cold_start_latency_p50_s",
    "cold_start_latency_p99_s",
    "sla_violation_pct",
    "cpu_alloc_utilization",
    "cost_usd",
    "energy_kwh",
}


def test_cluster_mode_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = [*QUICK, "--placement", "kube-default,most-allocated", "--keepalive", "knative,hybrid", "--json"]
    assert cli.main([*args, "--out", str(tmp_path / "a")]) == 0
    printed = json.loads(capsys.readouterr().out)
    results = printed["results"]
    assert len(results) == 2 * 3  # fixed:10 joins as the wasted-memory reference
    for entry in results:
        assert set(entry) >= REQUIRED, REQUIRED - set(entry)
        assert set(entry["sla_violation_pct"]) == {"critical", "high", "normal", "low", "batch"}
    assert {e["wasted_memory_norm"] for e in results if e["keepalive"] == "fixed:10"} == {100.0}
    per_function = printed["per_function"]
    assert len(per_function["func_ids"]) == len(per_function["invocations"]) == 24
    for entry in results:
        cold = per_function["cold_starts"][f"{entry['placement']} x {entry['keepalive']}"]
        assert sum(cold) == entry["cold_starts"] and len(cold) == 24
    for name in ("report.json", "pareto.png", "timeline.png"):
        assert (tmp_path / "a" / name).stat().st_size > 0

    assert cli.main([*args, "--out", str(tmp_path / "b")]) == 0
    capsys.readouterr()
    assert (tmp_path / "a" / "report.json").read_bytes() == (tmp_path / "b" / "report.json").read_bytes()


def test_the_prewarm_planner_runs_with_and_without_pre_pulls(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = [
        *QUICK,
        "--hours",
        "2",
        "--placement",
        "kube-default",
        "--keepalive",
        "knative,prewarm,prewarm:nopull",
    ]
    assert cli.main([*args, "--json", "--out", str(tmp_path)]) == 0
    by_name = {e["keepalive"]: e for e in json.loads(capsys.readouterr().out)["results"]}
    assert set(by_name) == {"knative", "prewarm", "prewarm:nopull", "fixed:10"}
    assert by_name["prewarm:nopull"]["prepulls"] == 0
    assert by_name["prewarm"]["cold_starts"] < by_name["knative"]["cold_starts"]


def test_keepalive_mode_reports_per_population(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = [
        "simulate",
        "--mode",
        "keepalive",
        "--keepalive",
        "fixed:5,fixed:60,hybrid",
        "--out",
        str(tmp_path),
    ]
    assert cli.main(args) == 0
    report = json.loads((tmp_path / "report.json").read_text())
    by_name = {e["keepalive"]: e for e in report["results"]}
    assert set(by_name) == {"fixed:5", "fixed:60", "hybrid", "fixed:10"}
    assert set(by_name["hybrid"]["populations"]) == {"heavy", "light"}
    assert by_name["fixed:60"]["cold_starts"] < by_name["fixed:5"]["cold_starts"]
    assert "fixed:60" in capsys.readouterr().out


def test_bad_cluster_file_names_file_line_and_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "cluster.yaml"
    bad.write_text("name: x\npools:\n  - name: a\n    count: many\n")
    assert cli.main([*QUICK, "--cluster", str(bad), "--out", str(tmp_path)]) == 2
    assert f"{bad}:4: field pools[0].count" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flags", "complaint"),
    [
        (["--keepalive", "forever"], "unknown keep-alive"),
        (["--placement", "magic"], "unknown placement"),
        (["--hours", "30"], "--hours 30.0"),
    ],
)
def test_bad_flags_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], complaint: str
) -> None:
    assert cli.main([*QUICK, *flags, "--out", str(tmp_path)]) == 2
    assert complaint in capsys.readouterr().err


def test_malformed_trace_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main([*QUICK, "--trace", str(tmp_path), "--out", str(tmp_path)]) == 2
    assert "invocations_per_minute.csv.gz: no such file" in capsys.readouterr().err
