"""`kdrl simulate`: the report's fields, byte-identical reruns, plots, and clear bad-input errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from plugin import cli
from policies.types import Priority
from simulator import clusterspec, compare, htmlreport, prewarming, traces
from simulator.nodes import SCALE_DOWN_UTILIZATION

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
    "capacity_wait_p50_s",
    "capacity_wait_p99_s",
    "start_delay_p99_s",
    "timed_out_requests",
    "cold_start_pct",
    "sla_violation_pct",
    "cpu_alloc_utilization",
    "cost_usd",
    "energy_kwh",
    "by_pool",
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
    assert set(per_function["priorities"]) <= {p.value for p in Priority}
    assert len(per_function["priorities"]) == 24 and len(set(per_function["priorities"])) > 1
    for entry in results:  # every pool of the spec, adding up to the totals
        pools = entry["by_pool"].values()
        assert sum(p["cost_usd"] for p in pools) == pytest.approx(entry["cost_usd"], abs=0.01)
        assert sum(p["energy_kwh"] for p in pools) == pytest.approx(entry["energy_kwh"], abs=0.01)
        assert all(0 < p["energy_kwh_nodes_up"] <= p["energy_kwh"] for p in pools)
    for entry in results:
        cold = per_function["cold_starts"][f"{entry['placement']} x {entry['keepalive']}"]
        assert sum(cold) == entry["cold_starts"] and len(cold) == 24
    for entry in results:
        views = entry["cold_start_pct"]
        assert set(views) == {"unweighted", "weighted"}
        for view in views.values():
            assert set(view) == {"mean", "p50", "p75", "p90"}
            assert view["p50"] <= view["p75"] <= view["p90"]
        assert views["unweighted"]["p75"] == entry["cold_start_pct_p75"]
        # A cold request's start delay is its start-up plus its wait for capacity.
        assert entry["cold_start_latency_p99_s"] <= entry["start_delay_p99_s"] + 0.05
    for name in ("report.json", "pareto.png", "cold_start_cdf.png", "timeline.png"):
        assert (tmp_path / "a" / name).stat().st_size > 0

    assert cli.main([*args, "--html", "--out", str(tmp_path / "b")]) == 0
    capsys.readouterr()
    assert (tmp_path / "a" / "report.json").read_bytes() == (tmp_path / "b" / "report.json").read_bytes()
    page = (tmp_path / "b" / "report.html").read_text()
    table = page.split("<h2>Results</h2>")[1].split("</table>")[0]
    assert table.count("<tr>") == len(results) + 1 and "most-allocated" in table
    assert page.count('src="data:image/png;base64,') == 3  # every plot inside, nothing linked
    assert 'src="http' not in page and "<link" not in page


def test_the_html_page_escapes_what_the_report_says() -> None:
    entry = {"placement": "<script>x()</script>", "keepalive": "hybrid", "invocations": 3, "cold_starts": 1}
    result = {"functions": 1, "results": [entry], "config": {"mode": "cluster", "trace": "<b>"}}
    page = htmlreport.render(result, {}, [])
    assert "<script>" not in page and "&lt;script&gt;x()&lt;/script&gt;" in page
    assert "<b>" not in page


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
    printed = json.loads(capsys.readouterr().out)
    by_name = {e["keepalive"]: e for e in printed["results"]}
    assert set(by_name) == {"knative", "prewarm", "prewarm:nopull", "fixed:10"}
    assert by_name["prewarm:nopull"]["prepulls"] == 0
    assert by_name["prewarm"]["cold_starts"] < by_name["knative"]["cold_starts"]
    # A function first called after the warm-up has no history anywhere: that call is cold under
    # every policy, the planner's included (what bench.prewarm's "first calls out" leaves out).
    per_function = printed["per_function"]
    first_counted = [i for i, flag in enumerate(per_function["first_call_counted"]) if flag]
    assert first_counted and len(first_counted) < sum(n > 0 for n in per_function["invocations"])
    for cold in per_function["cold_starts"].values():
        assert all(cold[i] >= 1 for i in first_counted)


def _study(tmp_path: Path, *flags: str) -> dict[str, Any]:
    assert cli.main(["simulate", "--mode", "keepalive", *flags, "--out", str(tmp_path)]) == 0
    report: dict[str, Any] = json.loads((tmp_path / "report.json").read_text())
    return report


def test_keepalive_mode_reports_per_population(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = _study(tmp_path, "--keepalive", "fixed:5,fixed:60,hybrid")
    by_name = {e["keepalive"]: e for e in report["results"]}
    assert set(by_name) == {"fixed:5", "fixed:60", "hybrid", "fixed:10"}
    assert set(by_name["hybrid"]["populations"]) == {"heavy", "light"}
    assert by_name["fixed:60"]["cold_starts"] < by_name["fixed:5"]["cold_starts"]
    assert "fixed:60" in capsys.readouterr().out


def test_the_warmup_applies_to_cluster_mode_only(tmp_path: Path) -> None:
    # Six minutes of SitW's study: shorter than the default warm-up, which has no meaning there.
    report = _study(tmp_path, "--hours", "0.1", "--keepalive", "fixed:5")
    counted = sum(report["per_function"]["invocations"])
    assert counted > 0 and {e["invocations"] for e in report["results"]} == {counted}


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
        (["--warmup-minutes", "60"], "--warmup-minutes 60"),  # QUICK runs one hour
        (["--warmup-minutes", "-1"], "--warmup-minutes -1"),
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


POOL = """name: x
pools:
  - name: a
    count: 2
    min: 1
    max: 4
    cpu: 8
    memory_gib: 32
    on_demand_per_hour: 0.38
    spot_per_hour: 0.11
    power: {model: linear, idle_watts: 100, max_watts: 250}
"""


@pytest.mark.parametrize(
    ("change", "complaint"),
    [
        (("max: 4", "max: 0"), ":3: field pools[0]: need 0 <= min <= count <= max"),
        (("cpu: 8", "cpu: 8\n    gpus: -1"), ":8: field pools[0].gpus: must not be negative"),
        (("cpu: 8", "cpu: 0"), ":7: field pools[0].cpu: must be positive"),
        (("    cpu: 8\n", ""), ":3: field pools[0].cpu: required"),
        (("memory_gib: 32", "memory_gb: 32"), ":8: field pools[0].memory_gb: unknown key"),
        (("name: x", "name: x\nnodes: 3"), ":2: field nodes: unknown key"),
        (("cpu: 8", "cpu: 8\n    image_disk_gib: -5"), ":8: field pools[0].image_disk_gib: must be positive"),
    ],
)
def test_bad_cluster_files_exit_2_naming_line_and_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], change: tuple[str, str], complaint: str
) -> None:
    good = tmp_path / "good.yaml"
    good.write_text(POOL)
    clusterspec.load(str(good))  # the unchanged file is valid
    bad = tmp_path / "cluster.yaml"
    bad.write_text(POOL.replace(*change, 1))
    assert cli.main([*QUICK, "--cluster", str(bad), "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"{bad}{complaint}" in err and "Traceback" not in err


def test_evaluate_on_a_trace_folder_missing_a_file_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "trace"
    folder.mkdir()
    for name in (traces.INVOCATIONS, traces.DURATIONS):
        shutil.copy(compare.BUNDLED_TRACE / name, folder / name)
    argv = ["evaluate", "--trace", str(folder), "--cluster", "small", "--seeds", "2", "--shifted", ""]
    assert cli.main([*argv, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert f"{folder / traces.MEMORY}: no such file" in err and "Traceback" not in err


def test_the_drain_of_underused_nodes_on_request(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`--drain-underused`: kube-default's spread pods are consolidated, as the real autoscaler
    does (the placement evaluation's ground); off by default, as docs/prewarm.md was measured."""
    args = [*QUICK, "--placement", "kube-default", "--keepalive", "knative", "--json"]
    nodes = {}
    for drain, flag in ((False, []), (True, ["--drain-underused"])):
        assert cli.main([*args, *flag, "--out", str(tmp_path / str(drain))]) == 0
        printed = json.loads(capsys.readouterr().out)
        assert printed["config"]["drain_underused"] is drain
        (entry,) = [e for e in printed["results"] if e["keepalive"] == "knative"]
        nodes[drain] = entry["nodes_mean"]
    assert nodes[True] < nodes[False]
    # The simulated planner then knows nodes under half allocated go, as the service assumes.
    assert prewarming.planner_settings(drain_underused=True).scale_down_utilization == SCALE_DOWN_UTILIZATION
    assert prewarming.planner_settings(drain_underused=False).scale_down_utilization == 0.0
