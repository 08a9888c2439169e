"""`kdrl loop`: record, learn, gate, publish, in one command (the closed loop's CronJob).

1. the decisions: fetched from a replica's admin port (`GET /debug/decisions/export`) or read
   from a database file;
2. optionally, nothing more unless the recorded pods missed their SLA more often than a
   threshold (the trigger beside the daily run);
3. the serving model, read from the ConfigMap every replica mounts (the shipped model before
   the first publish); `kdrl train --from-decisions` fine-tunes it;
4. `kdrl evaluate --against` gates the result; when it is no worse, it is published to the
   ConfigMap, the model it replaces kept beside it for `kdrl rollback --configmap`.

Every outcome (skipped, refused, published) is a success (exit 0), written to `loop.json`; a
database that cannot teach, a model that cannot load or an API server that cannot be reached
stop with exit 2.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

from plugin import kube, learning_cli, model_configmap, settings
from plugin.errors import KubeApiError, SettingsError
from policies import onnx_policy
from policies.decision_records import DecisionStore, RecordsError
from simulator import compare, evaluation

DEFAULT_CONFIGMAP = f"{kube.PLUGIN_NAMESPACE}/kdrl-model"


def add_commands(commands: Any) -> None:
    loop = commands.add_parser(
        "loop", help="record, learn, gate and publish the placement model", description=__doc__
    )
    loop.add_argument(
        "--decisions",
        required=True,
        help="the replicas' admin URLs, comma-separated (http://kdrl-0.kdrl-replicas.kdrl-system:9090,...), "
        "or a decisions database",
    )
    loop.add_argument("--hours", type=float, default=24.0, help="the recorded hours to learn from")
    loop.add_argument(
        "--if-sla-violations-above",
        type=float,
        metavar="PCT",
        help="do nothing unless more than PCT %% of those hours' pods missed their SLA",
    )
    loop.add_argument("--configmap", default=DEFAULT_CONFIGMAP, help="NAMESPACE/NAME of the serving model")
    loop.add_argument(
        "--work", type=Path, default=Path("/tmp/kdrl-loop"), help="folder for what the loop writes"
    )
    loop.add_argument("--kube-api-url", help="API server URL [default: in-cluster, else kubeconfig]")
    loop.add_argument("--kubeconfig", help="kubeconfig file")
    loop.add_argument("--trace", type=Path, default=compare.BUNDLED_TRACE, help="the gate's trace")
    loop.add_argument("--cluster", default="small,medium", help="the gate's clusters, comma-separated")
    loop.add_argument("--seeds", type=int, default=5, help="the gate's seeds")
    loop.add_argument("--functions", type=int, help="the gate's functions per case (default: per cluster)")
    loop.add_argument("--workers", type=int, default=0, help="the gate's worker processes (0: one per CPU)")
    loop.add_argument("--seed", type=int, default=1, help="the fine-tuning's seed")
    loop.set_defaults(run=_loop)

    rollback = commands.add_parser(
        "rollback", help="restore the model a gate replaced", description=_rollback.__doc__
    )
    rollback.add_argument(
        "path", type=Path, nargs="?", help="a shipping path (its .previous file is restored)"
    )
    rollback.add_argument("--configmap", help="or NAMESPACE/NAME of the ConfigMap `kdrl loop` publishes to")
    rollback.add_argument("--kube-api-url", help="API server URL [default: in-cluster, else kubeconfig]")
    rollback.add_argument("--kubeconfig", help="kubeconfig file")
    rollback.set_defaults(run=_rollback)


def _rollback(args: argparse.Namespace) -> int:
    """Put back the model the last gate replaced: PATH.previous (the one removed kept as
    PATH.rolled-back), or the ConfigMap's previous model (the two swap: a second rollback undoes
    the first). Replicas reloading it serve it within KDRL_MODEL_RELOAD_S of the kubelet's update."""
    if (args.path is None) == (args.configmap is None):
        raise SettingsError("give a shipping PATH or --configmap NAMESPACE/NAME, one of them")
    if args.configmap is not None:
        namespace, name = model_configmap.where(args.configmap)
        _kube(args, lambda api: model_configmap.roll_back(api, namespace, name))
        print(json.dumps({"result": f"{namespace}/{name}: the previous model serves again"}))
        return 0
    previous = args.path.with_name(args.path.name + ".previous")
    if not previous.is_file():
        raise SettingsError(f"{previous}: no previous model to restore")
    learning_cli.swap_in(args.path, previous, keep=".rolled-back")
    digest = onnx_policy.content_hash(args.path.read_bytes())
    print(json.dumps({"result": f"{args.path} is the previous model again ({digest})"}))
    return 0


def _loop(args: argparse.Namespace) -> int:
    args.work.mkdir(parents=True, exist_ok=True)
    database = _decisions(args.decisions, args.hours, args.work / "decisions.db")
    outcome: dict[str, Any] = {"at": time.time(), "decisions": str(args.decisions)}
    if args.if_sla_violations_above is not None:
        missed = sla_violation_pct(database, since=time.time() - args.hours * 3600.0)
        outcome["sla_violation_pct"] = missed
        if missed is None or missed <= args.if_sla_violations_above:
            return _done(args.work, outcome | {"result": "skipped: SLA violations within the threshold"})
    namespace, name = model_configmap.where(args.configmap)
    current = args.work / "current.onnx"
    serving = _kube(args, lambda api: model_configmap.current(api, namespace, name))
    if serving is None:
        shutil.copy(onnx_policy.DEFAULT_MODEL, current)
    else:
        current.write_bytes(serving)
    new = args.work / "new"
    learning_cli.train_from_decisions(database, current, new, args.seed)
    verdict = evaluation.gate(
        args.trace,
        new / "placement.onnx",
        current,
        clusters=[c for c in args.cluster.split(",") if c],
        shifted=(),
        seeds=range(1, args.seeds + 1),
        functions=args.functions,
        workers=args.workers,
    )
    outcome["gate"] = verdict
    if not verdict["ship"]:
        return _done(args.work, outcome | {"result": "refused by the gate: the serving model stays"})
    model = (new / "placement.onnx").read_bytes()
    _kube(args, lambda api: model_configmap.publish(api, namespace, name, model))
    digest = onnx_policy.content_hash(model)
    return _done(args.work, outcome | {"result": f"published {digest} to {namespace}/{name}"})


def _done(work: Path, outcome: dict[str, Any]) -> int:
    (work / "loop.json").write_text(json.dumps(outcome, indent=1, sort_keys=True, default=str) + "\n")
    print(json.dumps({"result": outcome["result"]}))
    return 0


def _decisions(sources: str, hours: float, target: Path) -> Path:
    """The decisions database: each replica's (comma-separated admin URLs: each records what it
    served) fetched and merged, or the one file given."""
    if not sources.startswith(("http://", "https://")):
        return Path(sources)
    target.unlink(missing_ok=True)
    for i, source in enumerate(s for s in sources.split(",") if s):
        url = f"{source.rstrip('/')}/debug/decisions/export?hours={hours:g}"
        fetched = target.with_name(f"replica-{i}.db")
        try:
            with urllib.request.urlopen(url, timeout=120) as response:
                fetched.write_bytes(response.read())
            store = DecisionStore(fetched, create=False)
            try:
                store.export(target, since=0.0)
            finally:
                store.close()
        except (urllib.error.URLError, OSError, RecordsError) as error:
            raise SettingsError(f"cannot fetch the decisions from {url}: {error}") from error
    return target


def sla_violation_pct(database: Path, *, since: float) -> float | None:
    """The share of recorded pods since `since`, seen Ready, that missed their SLA (None: none seen)."""
    try:
        store = DecisionStore(database, create=False)
        try:
            seen = [r.sla_met for r in store.read(Counter()) if r.at >= since and r.sla_met is not None]
        finally:
            store.close()
    except RecordsError as error:
        raise SettingsError(str(error)) from error
    return round(100.0 * seen.count(False) / len(seen), 3) if seen else None


def _kube(args: argparse.Namespace, call: Any) -> Any:
    flags = {"KDRL_KUBE_API_URL": args.kube_api_url, "KDRL_KUBECONFIG": args.kubeconfig}
    connection = settings.load(flags, os.environ).kube

    try:
        return asyncio.run(kube.using(call, api_url=connection.api_url, kubeconfig=connection.kubeconfig))
    except KubeApiError as error:
        raise SettingsError(f"the model's ConfigMap {args.configmap}: {error}") from error
