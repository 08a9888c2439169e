"""`kdrl train`, `kdrl tune` and `kdrl evaluate`: the learned policy's commands.

Training needs the `train` extra (torch, gymnasium, onnx); the other two run on the serving
dependencies alone.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from plugin.errors import SettingsError
from policies import heuristics, onnx_policy
from simulator import clusterspec, compare, evaluation, plots, traces
from simulator.learning import config

DRAIN_UNDERUSED_HELP = (
    "the cluster autoscaler also drains nodes under half allocated, as the real one does (default; "
    "--no-drain-underused: only empty nodes go, the ground of the tables published before "
    "2026-12-07; docs/placement-policy.md)"
)


def add_commands(commands: Any) -> None:
    train = commands.add_parser(
        "train", help="train the PPO placement policy in the simulator", description=_train.__doc__
    )
    from_args = {f.name: f for f in dataclasses.fields(config.Args)}
    for name, spec in from_args.items():
        flag = "--" + name.replace("_", "-")
        default = spec.default
        if isinstance(default, bool):
            train.add_argument(flag, action=argparse.BooleanOptionalAction, default=default)
        elif name in ("trace", "out"):
            train.add_argument(flag, type=Path, default=default, help=f"default: {_short(default)}")
        elif name == "target_kl":
            train.add_argument(flag, type=float, default=default, help=f"default: {default}")
        else:
            train.add_argument(flag, type=type(default), default=default, help=f"default: {default}")
    train.add_argument(
        "--ray-address",
        help="run the environments in Ray actors on this cluster (HOST:PORT or ray://HOST:PORT); "
        "the learner stays here",
    )
    train.add_argument("--workers", type=int, help="with --ray-address: Ray actors (default 2)")
    train.add_argument(
        "--from-decisions",
        type=Path,
        metavar="DB",
        help="fine-tune from the placements kdrl serve recorded in this history database, offline",
    )
    train.add_argument(
        "--from-model",
        type=Path,
        metavar="M",
        help="with --from-decisions: the model to start from (ONNX or model.pt; default the shipped one)",
    )
    train.set_defaults(run=_train)

    tune = commands.add_parser(
        "tune", help="grid-search the weighted heuristic on the training split", description=_tune.__doc__
    )
    tune.add_argument("--trace", type=Path, default=compare.BUNDLED_TRACE)
    tune.add_argument("--out", type=Path, default=heuristics.TUNED_WEIGHTS, help="weights file to write")
    tune.add_argument("--workers", type=int, default=0, help="worker processes (0: one per CPU)")
    add_drain_underused(tune)
    tune.set_defaults(run=_tune)

    evaluate = commands.add_parser(
        "evaluate", help="judge placement policies on the evaluation split", description=_evaluate.__doc__
    )
    evaluate.add_argument("--trace", type=Path, default=compare.BUNDLED_TRACE)
    evaluate.add_argument("--population", choices=traces.POPULATIONS, help="only this population")
    evaluate.add_argument("--functions", type=int, help="functions per case (default: per cluster)")
    evaluate.add_argument(
        "--cluster", default=",".join(evaluation.CLUSTERS), help="clusters, comma-separated"
    )
    evaluate.add_argument(
        "--placement", default=",".join(evaluation.POLICIES), help="policies, comma-separated"
    )
    evaluate.add_argument("--seed", type=int, default=1, help="first seed")
    evaluate.add_argument(
        "--seeds", type=int, default=len(evaluation.SEEDS), help="number of seeds (>= 2 for intervals)"
    )
    evaluate.add_argument(
        "--shifted",
        default=",".join(f"{c}:{scale:g}" for c, scale in evaluation.SHIFTED),
        help="shifted grounds CLUSTER:ARRIVAL_SCALE, comma-separated ('' for none)",
    )
    evaluate.add_argument("--model", type=Path, default=onnx_policy.DEFAULT_MODEL, help="ONNX model")
    evaluate.add_argument("--workers", type=int, default=0, help="worker processes (0: one per CPU)")
    evaluate.add_argument("--out", type=Path, default=Path("out/evaluate"), help="folder for JSON and plot")
    evaluate.add_argument("--json", action="store_true", help="print the result as one JSON object")
    add_drain_underused(evaluate)
    evaluate.add_argument(
        "--against",
        type=Path,
        metavar="CURRENT",
        help="gate: --model against this serving model, paired on the same cases (exit 1 if worse)",
    )
    evaluate.add_argument(
        "--ship",
        type=Path,
        metavar="PATH",
        help="with --against: copy --model to PATH when it is no worse, keeping PATH's file as PATH.previous",
    )
    evaluate.set_defaults(run=_evaluate)


def add_drain_underused(parser: argparse.ArgumentParser) -> None:
    """`--drain-underused` / `--no-drain-underused`, on by default: the placement protocol's ground."""
    parser.add_argument(
        "--drain-underused",
        action=argparse.BooleanOptionalAction,
        default=evaluation.DRAIN_UNDERUSED,
        help=DRAIN_UNDERUSED_HELP,
    )


def _short(value: Any) -> str:
    path = Path(str(value))
    return path.name if path.is_absolute() else str(path)


def _train(args: argparse.Namespace) -> int:
    """PPO in the simulator on the training split (first 12 hours of the trace); writes the
    checkpoint, progress.csv, TensorBoard scalars, learning_curve.png and placement.onnx."""
    try:
        from simulator.learning import export, ppo
    except ImportError as error:  # torch, gymnasium or onnx missing
        raise SettingsError(f"training needs the train extra: pip install '.[train]' ({error})") from error

    fields = {f.name for f in dataclasses.fields(config.Args)}
    options = config.Args(**{k: v for k, v in vars(args).items() if k in fields})
    if args.from_decisions is not None:
        return train_from_decisions(args.from_decisions, args.from_model, options.out, options.seed)
    if args.from_model is not None:
        raise SettingsError("--from-model needs --from-decisions (PPO in the simulator starts afresh)")
    if options.total_timesteps < options.batch_size:
        raise SettingsError(f"--total-timesteps must be at least one batch ({options.batch_size})")
    if options.imitate and options.imitate != "lookahead":
        try:
            heuristics.by_name(options.imitate)  # unknown, or tuned weights unreadable
        except (KeyError, ValueError) as error:
            raise SettingsError("--imitate: " + str(error).strip("'\"")) from error
    if not 0.0 <= options.teach_share <= 1.0:
        raise SettingsError(f"--teach-share must be in [0, 1], not {options.teach_share}")
    if options.lookahead_candidates < 1 or options.lookahead_minutes < 1:
        raise SettingsError(
            "--lookahead-candidates and --lookahead-minutes must be >= 1, not "
            f"{options.lookahead_candidates} and {options.lookahead_minutes}"
        )
    if not 0.0 <= options.lookahead_margin <= 1.0:
        raise SettingsError(f"--lookahead-margin must be in [0, 1], not {options.lookahead_margin}")
    if options.residual_top_k < 0 or (options.residual_top_k and not options.residual):
        raise SettingsError(
            f"--residual-top-k must be >= 0 and needs --residual, not {options.residual_top_k}"
        )
    if options.residual:
        try:
            options.residual_base()
        except (KeyError, ValueError) as error:
            reason = error.args[0] if isinstance(error, KeyError) else str(error)  # KeyError quotes its str
            raise SettingsError(f"--residual: {reason}") from error
    if not 0.0 < options.fewest_functions_per_node <= 4.5:
        raise SettingsError(
            f"--fewest-functions-per-node must be in (0, 4.5], not {options.fewest_functions_per_node}"
        )
    if not 1.0 <= options.max_arrival_scale <= 10.0:
        raise SettingsError(f"--max-arrival-scale must be in [1, 10], not {options.max_arrival_scale}")
    environments = _environments(options, args.ray_address, args.workers)
    console = Console(stderr=True)
    updates = max(options.total_timesteps // options.batch_size, 1)
    with Progress(
        TextColumn("[bold]PPO"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total} updates"),
        TextColumn("{task.fields[status]}"),
        TimeElapsedColumn(),
        console=console,
    ) as bar:
        task = bar.add_task("train", total=updates, status="")

        def on_update(update: int, progress: ppo.Progress) -> None:
            v = progress.values
            status = (
                f"return {v['episodic_return']:.2f}  kl {v['approx_kl']:.4f}  {v['steps_per_s']:.0f} steps/s"
                + ("  (imitating)" if v["imitating"] else "")
            )
            bar.update(task, completed=update, status=status)

        try:
            ppo.train(options, on_update=on_update, environments=environments)
        except export.ExportError as error:  # the checkpoint was written before the export
            message = f"export refused: {error}; the checkpoint is {options.out}/model.pt"
            raise SettingsError(message) from error
    console.print(f"model and curves in {options.out}/")
    return 0


def train_from_decisions(database: Path, start: Path | None, out: Path, seed: int) -> int:
    """Fine-tune from recorded decisions (simulator/learning/offline.py); writes placement.onnx,
    model.pt and report.json to `out`. A database that is missing, corrupt, empty or of another
    feature schema stops here with exit 2."""
    from collections import Counter

    import torch

    from policies.decision_records import DecisionStore, RecordsError
    from simulator.learning import export, offline

    skipped: Counter[str] = Counter()
    try:
        store = DecisionStore(database, create=False)
        try:
            records = list(store.read(skipped))
        finally:
            store.close()
    except RecordsError as error:
        raise SettingsError(str(error)) from error
    if not records:
        why = "of another feature schema" if skipped["another feature schema"] else "none recorded"
        raise SettingsError(f"{database}: no decisions to learn from ({why}; skipped: {dict(skipped)})")
    source = start or onnx_policy.DEFAULT_MODEL
    try:
        model, base = export.load(source), export.load_base(source)
    except (OSError, ValueError, KeyError, RuntimeError) as error:
        raise SettingsError(f"--from-model {source}: cannot load it ({error})") from error
    if base is not None and base.top_k:  # its records hold every candidate, its actor saw top_k
        raise SettingsError(
            f"--from-model {source}: a model that shortlists its base's top {base.top_k} candidates "
            "cannot be fine-tuned from recorded decisions yet; retrain it in the simulator"
        )
    data = offline.usable(records, skipped, residual=base is not None)
    if not data.records:
        raise SettingsError(f"{database}: no usable decisions (skipped: {dict(data.skipped)})")
    arguments = offline.OfflineArgs(seed=seed)
    report = offline.fine_tune(model, data, arguments, residual=base is not None)
    out.mkdir(parents=True, exist_ok=True)
    config_record = {
        "from_decisions": database.name,
        "from_model": source.name,
        **dataclasses.asdict(arguments),
    }
    config_record["hidden"] = model.hidden
    checkpoint = {"model": model.state_dict(), "args": config_record, "base": base.to_json() if base else ""}
    torch.save(checkpoint, out / "model.pt")
    export.export(model, out / "placement.onnx", config_record, base)
    (out / "report.json").write_text(json.dumps(dataclasses.asdict(report), indent=1) + "\n")
    Console(stderr=True).print(
        f"fine-tuned on {report.used} decisions ({report.with_probabilities} with the serving policy's "
        f"probabilities), skipped {dict(report.skipped)}, KL to the start {report.kl_to_start:.4f}: "
        f"{out}/placement.onnx"
    )
    return 0


def _environments(options: config.Args, address: str | None, workers: int | None) -> Any:
    """None (the learner's own process), or the environments in Ray actors at `address`."""
    if address is None:
        if workers is not None:
            raise SettingsError("--workers needs --ray-address (without it the environments run here)")
        return None
    try:
        from plugin.ray_rollouts import RayEnvironments
    except ImportError as error:
        raise SettingsError(f"--ray-address needs the ray extra: pip install '.[ray]' ({error})") from error
    try:
        trace = traces.load(options.trace)
        return RayEnvironments(options, trace, address=address, workers=2 if workers is None else workers)
    except (ValueError, ConnectionError, traces.TraceError) as error:
        raise SettingsError(str(error)) from error


def _tune(args: argparse.Namespace) -> int:
    """Grid-search the weights of the weighted heuristic (allocation, balance, image locality,
    price, power) on the training split, against kube-default; writes the `tuned` weights."""
    console = Console(stderr=True)
    with Progress(*Progress.get_default_columns(), TimeElapsedColumn(), console=console) as bar:
        task = bar.add_task("tuning", total=None)
        cases = [
            dataclasses.replace(case, drain_underused=args.drain_underused) for case in evaluation.TUNE_CASES
        ]
        result = evaluation.tune(
            args.trace, cases=cases, workers=args.workers, progress=lambda _: bar.advance(task)
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    console.print(
        f"best weights {result['weights']} (composite {result['composite_vs_kube_default']}) -> {args.out}"
    )
    return 0


def _evaluate(args: argparse.Namespace) -> int:
    """Every placement policy on the evaluation split (last 12 hours), per cluster and seed:
    each objective and the composite against kube-default, with 95 % confidence intervals."""
    clusters = [c for c in args.cluster.split(",") if c]
    policies = [p for p in args.placement.split(",") if p]
    if args.seeds < 1 or (args.functions is not None and args.functions <= 0):
        raise SettingsError("--seeds and --functions must be positive")
    shifted = _shifted(args.shifted)
    try:
        for cluster in [*clusters, *(c for c, _ in shifted)]:
            clusterspec.load(cluster)
        compare.Options(placements=tuple(policies)).validate()
    except (ValueError, KeyError) as error:
        raise SettingsError(str(error).strip("'\"")) from error
    if args.against is not None:
        return _gate(args, clusters, shifted)
    if "onnx" in policies:  # never kube-default evaluated under the learned policy's name
        degraded = onnx_policy.load(args.model, device="cpu").degraded
        if degraded:
            raise SettingsError(f"--model: {degraded}")
    if args.ship is not None:
        raise SettingsError("--ship needs --against (a model ships only through the gate)")
    console = Console(stderr=True)
    with Progress(
        *Progress.get_default_columns(), TimeElapsedColumn(), console=console, disable=args.json
    ) as bar:
        grounds = len(clusters) + len(shifted)
        total = grounds * args.seeds * len(set(policies) | set(evaluation.BASELINES))
        task = bar.add_task(f"evaluating {total} runs", total=total)
        try:
            result = evaluation.evaluate(
                args.trace,
                policies=policies,
                clusters=clusters,
                shifted=shifted,
                seeds=range(args.seed, args.seed + args.seeds),
                functions=args.functions,
                population=args.population,
                model=args.model,
                workers=args.workers,
                progress=lambda _: bar.advance(task),
                drain_underused=args.drain_underused,
            )
        except (traces.TraceError, clusterspec.ClusterSpecError) as error:
            raise SettingsError(str(error)) from error
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "evaluation.json").write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    plots.evaluation(result, args.out / "evaluation.png")
    (args.out / "evaluation.md").write_text(markdown_evaluation(result))
    if args.json:
        print(json.dumps(result, sort_keys=True))
    else:
        print_evaluation(result, Console(width=200))
        Console(stderr=True).print(f"evaluation.json, .md and .png in {args.out}/")
    return 0


def _gate(args: argparse.Namespace, clusters: list[str], shifted: list[tuple[str, float]]) -> int:
    """`--model` against `--against` on the evaluation protocol's cases; ships with `--ship`."""
    for path in (args.model, args.against):
        if not onnx_policy.load(path, device="cpu").model:
            raise SettingsError(f"{path}: not a model that serves (missing, corrupt or another schema)")
    console = Console(stderr=True)
    grounds = len(clusters) + len(shifted)
    with Progress(
        *Progress.get_default_columns(), TimeElapsedColumn(), console=console, disable=args.json
    ) as bar:
        task = bar.add_task(f"gating on {grounds * args.seeds * 3} runs", total=grounds * args.seeds * 3)
        verdict = evaluation.gate(
            args.trace,
            args.model,
            args.against,
            clusters=clusters,
            shifted=shifted,
            seeds=range(args.seed, args.seed + args.seeds),
            functions=args.functions,
            workers=args.workers,
            progress=lambda _: bar.advance(task),
            drain_underused=args.drain_underused,
        )
    if verdict["ship"] and args.ship is not None:
        ship(args.model, args.ship)
        verdict["shipped_to"] = str(args.ship)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gate.json").write_text(json.dumps(verdict, indent=1, sort_keys=True) + "\n")
    if args.json:
        print(json.dumps(verdict, sort_keys=True))
    else:
        table = Table(
            title=f"gate: {verdict['new']} against {verdict['current']}, {verdict['cases']} paired cases"
        )
        for title in ("check", "new vs current (mean ± 95 % CI)", "passes"):
            table.add_column(title)
        for name, check in verdict["checks"].items():
            table.add_row(
                name, f"{check['mean']:.4f} ± {check['ci95']:.4f}", "yes" if check["passes"] else "NO"
            )
        Console(width=160).print(table)
        console.print(
            f"verdict: {'ship' if verdict['ship'] else 'keep the serving model'}"
            + (
                f" (shipped to {args.ship}; `kdrl rollback {args.ship}` restores the previous)"
                if "shipped_to" in verdict
                else ""
            )
        )
    return 0 if verdict["ship"] else 1


def ship(model: Path, path: Path) -> None:
    """`model` to `path`, the file it replaces kept as `path.previous`."""
    swap_in(path, model, keep=".previous")


def swap_in(path: Path, source: Path, *, keep: str) -> None:
    """`source` to `path` atomically (a reloading service never reads half a file), `path`'s
    file first copied to `path` + `keep`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_file():
        shutil.copy2(path, path.with_name(path.name + keep))
    staged = path.with_name(path.name + ".incoming")
    shutil.copy2(source, staged)
    os.replace(staged, path)


def _shifted(text: str) -> list[tuple[str, float]]:
    grounds = []
    for item in filter(None, text.split(",")):
        cluster, _, scale = item.rpartition(":")
        try:
            value = float(scale)
        except ValueError:
            value = -1.0
        if not cluster or not 0 < value <= 100:
            raise SettingsError(f"--shifted {item!r}: expected CLUSTER:ARRIVAL_SCALE, e.g. medium:2")
        grounds.append((cluster, value))
    return grounds


COLUMNS = (
    ("composite", "composite", 3),
    ("CPU alloc", "utilization", 3),
    ("QoS s", "qos_weighted_cold_s", 0),
    ("cost $", "cost_usd", 1),
    ("energy kWh", "energy_kwh", 1),
    ("cold p50 s", "cold_start_latency_p50_s", 2),
    ("cold p99 s", "cold_start_latency_p99_s", 1),
    ("capacity wait p99 s", "capacity_wait_p99_s", 1),
    ("SLA crit %", "sla_violation_pct_critical", 2),
    ("SLA high %", "sla_violation_pct_high", 2),
    ("pulls", "image_pulls", 0),
    ("timeouts", "timed_out_requests", 0),
)


def print_evaluation(result: dict[str, Any], console: Console) -> None:
    table = Table(
        title="kdrl evaluate: mean ± 95 % CI over seeds; composite vs kube-default (lower is better)"
    )
    table.add_column("cluster")
    table.add_column("policy")
    for title, _, _ in COLUMNS:
        table.add_column(title, justify="right")
    for entry in result["results"]:
        table.add_row(entry["cluster"], entry["policy"], *_cells(entry))
    console.print(table)
    ratios = Table(
        title="paired by seed: ratio to each baseline, mean ± 95 % CI, and the verdict on the composite"
    )
    for title in ("cluster", "policy", "baseline", *RATIO_TITLES, "verdict"):
        ratios.add_column(
            title, justify="left" if title in ("cluster", "policy", "baseline", "verdict") else "right"
        )
    for row in _ratio_rows(result):
        ratios.add_row(*row)
    console.print(ratios)


RATIO_TITLES = ("composite", "CPU alloc", "QoS s", "cost", "energy")


def _cells(entry: dict[str, Any]) -> list[str]:
    return [
        f"{entry[key]['mean']:.{digits}f} ± {entry[key]['ci95']:.{digits}f}" for _, key, digits in COLUMNS
    ]


def _ratio_rows(result: dict[str, Any]) -> list[list[str]]:
    """One row per (ground, policy, baseline), the policy not being that baseline."""
    rows = []
    for entry in result["results"]:
        for baseline, ratios in entry.get("relative_to", {}).items():
            if baseline == entry["policy"]:
                continue
            cells = [
                f"{ratios[key]['mean']:.3f} ± {ratios[key]['ci95']:.3f}" for key in evaluation.RATIO_KEYS
            ]
            rows.append([entry["cluster"], entry["policy"], baseline, *cells, ratios["composite"]["verdict"]])
    return rows


def markdown_evaluation(result: dict[str, Any]) -> str:
    """The same tables as Markdown, for docs/."""
    header = ["cluster", "policy", *(title for title, _, _ in COLUMNS)]
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for entry in result["results"]:
        lines.append("| " + " | ".join([entry["cluster"], entry["policy"], *_cells(entry)]) + " |")
    header = ["cluster", "policy", "baseline", *RATIO_TITLES, "verdict (composite)"]
    lines += ["", "| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in _ratio_rows(result)]
    return "\n".join(lines) + "\n"
