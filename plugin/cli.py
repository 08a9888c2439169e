"""The `kdrl` command line: `serve` runs the service, `score` explains one placement.

This is the entrypoint: the only place that reads the process environment, sets up logging
and the OpenTelemetry SDK, and turns errors into exit codes (2 for bad settings or input).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from aiohttp import web

from plugin import app, convert, logs, objectfiles, settings, telemetry
from plugin.cluster import ClusterCache
from plugin.errors import KdrlError
from policies import heuristics, ranking

logger = logging.getLogger(__name__)


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
    score.add_argument("--policy", default="kube-default", choices=heuristics.HEURISTIC_NAMES)
    score.add_argument("--seed", type=int, default=0, help="seed of the random policy")
    score.add_argument("--json", action="store_true", help="print JSON instead of a table")
    score.set_defaults(run=_score)
    return parser


def _serve(args: argparse.Namespace) -> int:
    """Serve the kube-scheduler extender (and health endpoints) until interrupted."""
    config = settings.load(vars(args), os.environ)
    logs.setup(level=config.log.level, fmt=config.log.format)
    provider = telemetry.setup(os.environ)
    try:
        web.run_app(
            app.create_app(config),
            loop=_event_loop(),
            host=config.server.host,
            port=config.server.port,
            access_log=None,
            print=lambda message: logger.info("%s", message.strip()),
        )
    finally:
        provider.shutdown()
    return 0


def _event_loop() -> asyncio.AbstractEventLoop:
    """uvloop where installed (it roughly halves aiohttp's per-request overhead), else asyncio's."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def _score(args: argparse.Namespace) -> int:
    """Why would a pod go there? Filter verdict and raw policy score of every node, best first."""
    pods = objectfiles.load(args.pods) if args.pods else []
    table = ClusterCache.from_objects(objectfiles.load(args.nodes), pods).snapshot.nodes
    pod = convert.pod_request(objectfiles.load_one(args.pod))
    policy = heuristics.by_name(args.policy, seed=args.seed)
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
