"""The `kdrl` command line: `serve` runs the service, `score` explains one placement,
`simulate` compares policies on a trace; `train`, `tune` and `evaluate` make and judge policies.

This is the entrypoint: the only place that reads the process environment, sets up logging
and the OpenTelemetry SDK, and turns errors into exit codes (2 for bad settings or input).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import os
import signal
import ssl
import sys
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
from aiohttp import web
from rich.console import Console
from rich.progress import Progress, TimeElapsedColumn
from rich.table import Table

from plugin import (
    app,
    audiences,
    cleanup,
    convert,
    kube,
    learning_cli,
    logs,
    loop_cli,
    objectfiles,
    settings,
    telemetry,
)
from plugin.cluster import ClusterCache
from plugin.errors import KdrlError, SettingsError
from plugin.keys import AUDIENCES
from policies import ranking, registry
from simulator import clusterspec, compare, htmlreport, plots, report, traces

logger = logging.getLogger(__name__)
LINGER_S = 2.0  # after an early answer (413, 408), seconds spent reading and dropping the rest of a body


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        return int(args.run(args))
    except KdrlError as error:
        print(f"kdrl: {error}", file=sys.stderr)
        return 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kdrl", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(required=True, metavar="COMMAND")

    serve = commands.add_parser("serve", help="run the extender service", description=_serve.__doc__)
    settings.add_arguments(serve)
    serve.set_defaults(run=_serve)

    score = commands.add_parser(
        "score", help="every node's verdict and score for one pod", description=_score.__doc__
    )
    score.add_argument(
        "--nodes", type=Path, required=True, help="nodes, as `kubectl get nodes -o json` prints them"
    )
    score.add_argument("--pods", type=Path, help="pods placed on those nodes (`kubectl get pods -A -o json`)")
    score.add_argument(
        "--pod", type=Path, required=True, help="the pending pod (`kubectl get pod NAME -o json`)"
    )
    score.add_argument("--policy", default="kube-default", choices=registry.PLACEMENT_NAMES)
    score.add_argument("--seed", type=int, default=0, help="seed of the random policy")
    score.add_argument("--json", action="store_true", help="print JSON instead of a table")
    score.set_defaults(run=_score)

    simulate = commands.add_parser(
        "simulate", help="compare policies on a trace in the simulator", description=_simulate.__doc__
    )
    simulate.add_argument(
        "--trace", type=Path, default=compare.BUNDLED_TRACE, help="trace folder (default: bundled slice)"
    )
    simulate.add_argument(
        "--population", choices=traces.POPULATIONS, help="only this population (default: both)"
    )
    simulate.add_argument("--functions", type=int, help="a seeded selection of N functions")
    simulate.add_argument("--weighted", action="store_true", help="draw the selection by occ_ref_samples")
    simulate.add_argument("--hours", type=float, default=24.0, help="simulated hours from the trace start")
    simulate.add_argument("--cluster", default="medium", help="small, medium, large or a YAML file")
    simulate.add_argument("--mode", choices=compare.MODES, default="cluster")
    simulate.add_argument(
        "--placement", default=",".join(compare.PLACEMENTS), help="placement policies, comma-separated"
    )
    simulate.add_argument(
        "--keepalive", default=",".join(compare.KEEPALIVES), help="knative, fixed:MINUTES, hybrid"
    )
    simulate.add_argument("--seed", type=int, default=1)
    simulate.add_argument(
        "--warmup-minutes",
        type=int,
        default=compare.Options.warmup_minutes,
        help="cluster mode: minutes run but not counted, past the start from zero (default: %(default)s)",
    )
    simulate.add_argument("--drain-underused", action="store_true", help=compare.DRAIN_UNDERUSED_HELP)
    simulate.add_argument(
        "--out", type=Path, default=Path("out/simulate"), help="folder for report.json and plots"
    )
    simulate.add_argument("--json", action="store_true", help="print the report as one JSON object")
    simulate.add_argument(
        "--html", action="store_true", help="also write report.html: the table and plots in one page"
    )
    simulate.set_defaults(run=_simulate)
    learning_cli.add_commands(commands)
    loop_cli.add_commands(commands)

    undo = commands.add_parser(
        "cleanup", help="restore every revision the plugin changed", description=_cleanup.__doc__
    )
    undo.add_argument(
        "--kube-api-url", help="API server URL [env KDRL_KUBE_API_URL; default: in-cluster, else kubeconfig]"
    )
    undo.add_argument("--kubeconfig", help="kubeconfig file [env KDRL_KUBECONFIG; default ~/.kube/config]")
    undo.add_argument("--timeout-s", type=float, default=10.0, help="per request")
    undo.add_argument(
        "--namespace", default=kube.PLUGIN_NAMESPACE, help="the plugin's namespace (pre-pull pods)"
    )
    undo.set_defaults(run=_cleanup)
    return parser


def _cleanup(args: argparse.Namespace) -> int:
    """Restore every Revision's own min-scale from the records the plugin left on it and delete
    its pre-pull pods (works after the plugin is gone); revisions a human has edited since are
    listed and left alone."""

    flags = {"KDRL_KUBE_API_URL": args.kube_api_url, "KDRL_KUBECONFIG": args.kubeconfig}
    connection = settings.load(flags, os.environ).kube  # the same settings `kdrl serve` connects with

    report = asyncio.run(
        kube.using(
            partial(cleanup.cleanup, timeout_s=args.timeout_s, namespace=args.namespace),
            api_url=connection.api_url,
            kubeconfig=connection.kubeconfig,
        )
    )
    print(json.dumps(dataclasses.asdict(report), indent=2))
    return 0


def _serve(args: argparse.Namespace) -> int:
    """Serve the kube-scheduler extender (and health endpoints) until interrupted."""
    config = settings.load(vars(args), os.environ)
    logs.setup(level=config.log.level, fmt=config.log.format)
    provider = telemetry.setup(os.environ, with_metrics=config.server.metrics)
    loop = _event_loop()
    try:
        loop.run_until_complete(_serve_until_stopped(config))
    finally:
        loop.close()
        provider.shutdown()
    return 0


async def _serve_until_stopped(config: settings.Settings) -> None:
    """HTTP on KDRL_PORT, and HTTPS on KDRL_TLS_PORT with a certificate; until SIGTERM/SIGINT,
    then the app's cleanups (restoring what prewarming changed) run before exit."""
    service = await app.create_app(config)
    server = config.server
    service[AUDIENCES] = audiences.by_port(server)
    # keepalive_timeout also bounds the wait for a request's headers (aiohttp closes a
    # connection still without a complete request then); lingering bounds draining an unread body.
    runner = web.AppRunner(
        service, access_log=None, keepalive_timeout=server.idle_timeout_s, lingering_time=LINGER_S
    )
    await runner.setup()
    sites = [
        web.TCPSite(runner, server.host, server.port, ssl_context=_extender_tls(server.extender_tls_dir))
    ]
    sites += [
        web.TCPSite(runner, server.host, port)
        for port in service[AUDIENCES]
        if port not in (server.port, server.tls_port)
    ]
    if server.tls_dir is not None:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(server.tls_dir / "tls.crt", server.tls_dir / "tls.key")
        sites.append(web.TCPSite(runner, server.host, server.tls_port, ssl_context=context))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signal_number in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signal_number, stop.set)
    try:
        for site in sites:
            await site.start()
            logger.info("serving on %s", site.name)
        await stop.wait()
    finally:
        await runner.cleanup()


def _extender_tls(folder: Path | None) -> ssl.SSLContext | None:
    """Mutual TLS for the extender port: our certificate, and a client certificate signed by
    the folder's CA required of every caller (kube-scheduler's extender `tlsConfig`)."""
    if folder is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(folder / "ca.crt"))
    context.load_cert_chain(folder / "tls.crt", folder / "tls.key")
    context.verify_mode = ssl.CERT_REQUIRED
    return context


def _event_loop() -> asyncio.AbstractEventLoop:
    """uvloop where installed (it roughly halves aiohttp's per-request overhead), else asyncio's."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def _simulate(args: argparse.Namespace) -> int:
    """Run placement x keep-alive policies over a trace; write report.json and plots (and, with
    --html, report.html: the same in one self-contained page)."""
    options = compare.Options(
        trace=args.trace,
        population=args.population,
        functions=args.functions,
        weighted=args.weighted,
        hours=args.hours,
        cluster=args.cluster,
        mode=args.mode,
        placements=tuple(filter(None, args.placement.split(","))),
        keepalives=tuple(filter(None, args.keepalive.split(","))),
        seed=args.seed,
        warmup_minutes=args.warmup_minutes,
        drain_underused=args.drain_underused,
    )
    try:
        options.validate()
        clusterspec.load(options.cluster)
    except (ValueError, KeyError) as error:
        raise SettingsError(str(error).strip("'\"")) from error
    console = Console(stderr=True)
    runs = len(compare.jobs(options))
    with Progress(
        *Progress.get_default_columns(), TimeElapsedColumn(), console=console, disable=args.json
    ) as bar:
        task = bar.add_task(f"simulating {runs} runs", total=runs)
        try:
            result = compare.compare(options, progress=lambda label: bar.advance(task))
        except (traces.TraceError, clusterspec.ClusterSpecError) as error:
            raise SettingsError(str(error)) from error
    args.out.mkdir(parents=True, exist_ok=True)
    timings = result.pop("timings")  # wall-clock: kept out of the deterministic report
    (args.out / "report.json").write_text(json.dumps(result, sort_keys=True, indent=1) + "\n")
    (args.out / "timings.json").write_text(json.dumps(timings, sort_keys=True, indent=1) + "\n")
    plotted = plots.write_all(result, args.out)
    if args.html:
        (args.out / "report.html").write_text(htmlreport.render(result, timings, plotted))
    if args.json:
        print(json.dumps(result, sort_keys=True))
    else:
        _print_simulation(result, args.out, Console(width=200))
        _print_timings(timings, Console(width=170))
    return 0


def _print_simulation(result: dict[str, Any], out: Path, console: Console) -> None:
    invocations = max((r["invocations"] for r in result["results"]), default=0)
    table = Table(
        title=f"kdrl simulate: {result['functions']} functions, {invocations:,} invocations, "
        f"{result['config']['mode']} mode"
    )
    columns = report.TABLE_COLUMNS
    shown = [c for c in columns if any(c[1] in r for r in result["results"])]
    for title, _ in shown:
        table.add_column(title, justify="right" if title not in ("placement", "keep-alive") else "left")
    for entry in result["results"]:
        table.add_row(*(report.cell(entry.get(key)) for _, key in shown))
    console.print(table)
    plotted = "pareto.png, cold_start_cdf.png" + (", timeline.png" if any(result["series"].values()) else "")
    console.print(f"report and plots in {out}/ (report.json, timings.json, {plotted})")


def _print_timings(timings: dict[str, Any], console: Console) -> None:
    rows = [(label, t) for label, t in timings.items() if t and t.get("decisions")]
    if rows:
        parts = [f"{label} {t['p50']:.0f}/{t['p99']:.0f}" for label, t in rows]
        console.print("policy decision time p50/p99 (us): " + "; ".join(parts))


def _score(args: argparse.Namespace) -> int:
    """Why would a pod go there? Filter verdict and raw policy score of every node, best first."""
    pods = objectfiles.load(args.pods) if args.pods else []
    table = ClusterCache.from_objects(objectfiles.load(args.nodes), pods).snapshot.nodes
    pod = convert.pod_request(objectfiles.load_one(args.pod))
    policy = registry.load(args.policy, seed=args.seed, device="cpu").policy
    result = ranking.rank(pod, table, policy, explain=True)
    rows = [_score_row(result, int(r)) for r in result.best_first()]
    if args.json:
        print(
            json.dumps(
                {"pod": pod.key, "function": pod.function, "policy": policy.name, "nodes": rows}, indent=2
            )
        )
    else:
        _print_table(pod.key, policy.name, rows, [t.name for t in result.terms])
    return 0


def _score_row(result: ranking.Ranking, row: int) -> dict[str, Any]:
    feasible = bool(result.verdicts.feasible[row])
    score = float(result.scores[row])
    return {
        "node": str(result.nodes.names[row]),
        "feasible": feasible,
        "reason": result.verdicts.reason(row) or None,
        "score": score if feasible else None,
        "terms": {
            t.name: float(t.values[row]) for t in result.terms if feasible and np.isfinite(t.values[row])
        },
    }


def _print_table(pod: str, policy: str, rows: list[dict[str, Any]], terms: list[str]) -> None:
    print(f"pod {pod}, policy {policy}")
    width = max([len("node"), *(len(r["node"]) for r in rows)])
    header = f"{'node':<{width}}  {'score':>8}  " + "  ".join(f"{t:>{max(len(t), 8)}}" for t in terms)
    print(header + "  verdict")
    for r in rows:
        score = f"{r['score']:8.2f}" if r["feasible"] else f"{'-':>8}"
        parts = "  ".join(
            f"{r['terms'][t]:>{max(len(t), 8)}.0f}" if t in r["terms"] else f"{'-':>{max(len(t), 8)}}"
            for t in terms
        )
        print(f"{r['node']:<{width}}  {score}  {parts}  {'ok' if r['feasible'] else r['reason']}")
